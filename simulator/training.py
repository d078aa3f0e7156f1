"""The scenario's `training:` section: the token budget and price, and the inputs of the whole
run (failures, checkpoints, restarts, the data pipeline, power), each with a default and its
source. Parsing only; the physics is in goodput.py, datapipe.py and energy.py.

Storage tiers and datasets are presets (simulator/data/storage/, simulator/data/datasets/,
each number with its source) or mappings of the same fields. docs/whole-run.md explains
every field.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Mapping

from . import fields as F
from .errors import InputError
from .resources import data_dir
from .yamlio import load_yaml

GB = 1e9
HOUR = 3600.0

# Per-component mean time between interruptions, from the Llama 3 run (Dubey et al. 2024,
# arXiv 2407.21783, Sec. 3.3.4, Table 5): 419 unexpected interruptions in 54 days on 16,384
# H100 in 2,048 hosts with one 400G NIC per GPU (16,384 NICs). By component:
# GPU (faulty GPU 148, HBM3 72, SRAM 19, system processor 17, silent data corruption 6,
# thermal interface/sensor 6) = 268 over 16,384 x 1,296 GPU-hours -> 79,200 h (FFTrainer,
# arXiv 2512.03644, quotes "an MTBF of around 80,000 hours" for GPUs);
# host (unplanned host maintenance 32, SSD 3, power supply 3, chassis 2, IO board 2, CPU 2,
# system memory 2) = 46 over 2,048 x 1,296 node-hours -> 57,700 h;
# NIC 7 over 16,384 x 1,296 NIC-hours -> 3.03e6 h;
# network switch/cable 35, charged per NIC port -> 607,000 h;
# software (software bug 54, dependency 2, NCCL watchdog timeout 7) = 63 per host -> 42,100 h.
DEFAULT_MTBF_HOURS = {"gpu": 79_200.0, "host": 57_700.0, "nic": 3.03e6, "network": 607_000.0,
                      "software": 42_100.0}
CHECKPOINT_MODES = ("blocking", "async", "in_memory")


@dataclass(frozen=True)
class Failures:
    """Mean hours between interruptions per component (scaled by the cluster's counts), or one
    job-level MTBF per 1,000 devices that replaces them; planned interruptions per day."""

    gpu_mtbf_hours: float = DEFAULT_MTBF_HOURS["gpu"]  # per device
    host_mtbf_hours: float = DEFAULT_MTBF_HOURS["host"]  # per node
    nic_mtbf_hours: float = DEFAULT_MTBF_HOURS["nic"]  # per scale-out NIC
    network_mtbf_hours: float = DEFAULT_MTBF_HOURS["network"]  # switches and cables, per NIC port
    software_mtbf_hours: float = DEFAULT_MTBF_HOURS["software"]  # per node
    mtbf_hours_per_1000_devices: float | None = None  # a job-level figure instead of the components
    planned_per_day: float = 0.0  # maintenance restarts (checkpoint first, no lost work)


@dataclass(frozen=True)
class Storage:
    """A storage tier. Rates in B/s (None: the node's NVMe for per-node rates, unlimited for
    totals); latency per request in seconds; `request_bytes_per_s`: one request stream."""

    name: str
    read_bytes_per_s_per_node: float | None
    write_bytes_per_s_per_node: float | None
    read_bytes_per_s_total: float = math.inf
    write_bytes_per_s_total: float = math.inf
    request_latency_s: float = 0.0
    request_bytes_per_s: float = math.inf

    @property
    def node_nvme(self) -> bool:
        return self.read_bytes_per_s_per_node is None


@dataclass(frozen=True)
class Checkpointing:
    interval_s: float | None = None  # None: the Young/Daly optimum
    mode: str = "blocking"  # blocking | async | in_memory
    storage: Storage | None = None  # None: network-fs
    replicas: int = 2  # in_memory: copies of each shard (own host + peers)


@dataclass(frozen=True)
class Restart:
    detection_s: float = 100.0
    reschedule_s: float = 300.0
    init_s: float = 60.0  # process start, communicator initialisation, first step


@dataclass(frozen=True)
class Dataset:
    name: str
    storage_bytes_per_token: float
    tokens_per_request: float | None  # None: one request per sequence
    cpu_tokens_per_s_per_core: float
    host_to_device_bytes_per_token: float


@dataclass(frozen=True)
class DataPipeline:
    dataset: Dataset | None = None  # None: text-pretokenized
    storage: Storage | None = None  # None: network-fs
    workers_per_device: int = 2
    prefetch: int = 2


@dataclass(frozen=True)
class Power:
    pue: float = 1.1
    energy_usd_per_kwh: float = 0.08
    cap_w: float | None = None  # per device; lowers the clock (energy.clock_ratio)
    idle_w: float | None = None  # overrides the accelerator profile
    node_overhead_w: float | None = None  # overrides the node profile


@dataclass(frozen=True)
class Training:
    tokens: float | None = None  # tokens to train on, for time- and cost-to-train
    price_usd_per_device_hour: float | None = None  # overrides the accelerator profile's price
    failures: Failures = Failures()
    checkpoint: Checkpointing = Checkpointing()
    restart: Restart = Restart()
    data: DataPipeline = DataPipeline()
    power: Power = Power()


TRAINING_KEYS = ("tokens", "price_usd_per_device_hour", "failures", "checkpoint", "restart", "data", "power")
HOURS = dict(minimum=1e-3, maximum=1e12)


def training_from_dict(data) -> Training:
    data = F.require_mapping(data or {}, "training")
    F.reject_unknown(data, TRAINING_KEYS, "training")
    tokens = F.number(data, "tokens", "training", None)
    price = F.number(data, "price_usd_per_device_hour", "training", None, minimum=0.0, strict_min=False)
    return Training(tokens=tokens, price_usd_per_device_hour=price, failures=_failures(data.get("failures")),
                    checkpoint=_checkpoint(data.get("checkpoint")), restart=_restart(data.get("restart")),
                    data=_data(data.get("data")), power=_power(data.get("power")))


def _section(data, where: str, keys) -> Mapping:
    data = F.require_mapping(data or {}, where)
    F.reject_unknown(data, keys, where)
    return data


def _failures(data) -> Failures:
    where = "training.failures"
    keys = [f"{k}_mtbf_hours" for k in DEFAULT_MTBF_HOURS] + ["mtbf_hours_per_1000_devices", "planned_per_day"]
    d = _section(data, where, keys)
    parts = {f"{k}_mtbf_hours": F.number(d, f"{k}_mtbf_hours", where, v, **HOURS) for k, v in DEFAULT_MTBF_HOURS.items()}
    return Failures(**parts, mtbf_hours_per_1000_devices=F.number(d, "mtbf_hours_per_1000_devices", where, None,
                                                                  **HOURS),
                    planned_per_day=F.number(d, "planned_per_day", where, 0.0, minimum=0.0, strict_min=False,
                                             maximum=1e4))


def _checkpoint(data) -> Checkpointing:
    where = "training.checkpoint"
    d = _section(data, where, ("interval_s", "mode", "storage", "replicas"))
    mode = F.choice(d, "mode", where, CHECKPOINT_MODES, "blocking")
    storage = storage_from(d.get("storage"), f"{where}.storage")
    if storage is not None and storage.node_nvme:
        raise InputError(f"{where}.storage", storage.name, "a checkpoint on the failed node's own drives cannot "
                         "restore it; use shared storage, or mode: in_memory (copies on peer hosts)")
    return Checkpointing(interval_s=F.number(d, "interval_s", where, None, maximum=1e9), mode=mode, storage=storage,
                         replicas=F.integer(d, "replicas", where, 2, minimum=2, maximum=16))


def _restart(data) -> Restart:
    where = "training.restart"
    d = _section(data, where, ("detection_s", "reschedule_s", "init_s"))
    kw = dict(minimum=0.0, strict_min=False, maximum=1e7)
    return Restart(*(F.number(d, k, where, getattr(Restart, k), **kw) for k in ("detection_s", "reschedule_s",
                                                                                  "init_s")))


def _data(data) -> DataPipeline:
    where = "training.data"
    d = _section(data, where, ("dataset", "storage", "workers_per_device", "prefetch"))
    return DataPipeline(dataset=dataset_from(d.get("dataset"), f"{where}.dataset"),
                        storage=storage_from(d.get("storage"), f"{where}.storage"),
                        workers_per_device=F.integer(d, "workers_per_device", where, 2, minimum=0, maximum=1024),
                        prefetch=F.integer(d, "prefetch", where, 2, minimum=0, maximum=1024))


def _power(data) -> Power:
    where = "training.power"
    d = _section(data, where, ("pue", "energy_usd_per_kwh", "cap_w", "idle_w", "node_overhead_w"))
    return Power(pue=F.number(d, "pue", where, 1.1, minimum=1.0, strict_min=False, maximum=10.0),
                 energy_usd_per_kwh=F.number(d, "energy_usd_per_kwh", where, 0.08, minimum=0.0, strict_min=False,
                                             maximum=1e3),
                 cap_w=F.number(d, "cap_w", where, None, maximum=1e5),
                 idle_w=F.number(d, "idle_w", where, None, minimum=0.0, strict_min=False, maximum=1e5),
                 node_overhead_w=F.number(d, "node_overhead_w", where, None, minimum=0.0, strict_min=False,
                                          maximum=1e7))


# --------------------------------------------------------------------------- presets

STORAGE_KEYS = ("name", "description", "node_nvme", "read_gb_per_s_per_node", "write_gb_per_s_per_node",
                "read_gb_per_s_total", "write_gb_per_s_total", "request_latency_ms", "request_gb_per_s", "sources")
DATASET_KEYS = ("name", "description", "storage_bytes_per_token", "tokens_per_request", "cpu_tokens_per_s_per_core",
                "host_to_device_bytes_per_token", "sources")
RATE = dict(minimum=1e-6, maximum=1e9)  # GB/s


def _preset_names(kind: str) -> list[str]:
    return sorted(p.stem for p in (data_dir() / kind).glob("*.yaml"))


@lru_cache(maxsize=None)
def _preset(kind: str, name: str, where: str):
    if name not in _preset_names(kind):
        raise InputError(where, name, "known: " + ", ".join(_preset_names(kind)) + ", or a mapping of fields")
    return load_yaml(data_dir() / kind / f"{name}.yaml", f"{kind}/{name}.yaml")


def _preset_or_mapping(kind: str, value, where: str, keys) -> tuple[Mapping, str]:
    """The fields of a preset named `value` (simulator/data/KIND/) or of the mapping `value`."""
    if isinstance(value, str):
        value, where = _preset(kind, value, where), f"{kind}/{value}.yaml"
    return _section(value, where, keys), where


def storage_from(value, where: str) -> Storage | None:
    """A storage tier: a preset name (simulator/data/storage/) or a mapping of its fields."""
    if value is None:
        return None
    d, where = _preset_or_mapping("storage", value, where, STORAGE_KEYS)
    nvme = F.boolean(d, "node_nvme", where, False)

    def rate(key, default):
        v = F.number(d, key, where, None, **RATE)
        return default if v is None else v * GB

    if not nvme and (d.get("read_gb_per_s_per_node") is None or d.get("write_gb_per_s_per_node") is None):
        raise InputError(f"{where}.read_gb_per_s_per_node", None, "per-node read and write rates are required "
                         "(or node_nvme: true for the node's drives)")
    return Storage(name=str(d.get("name") or "custom"),
                   read_bytes_per_s_per_node=None if nvme else rate("read_gb_per_s_per_node", None),
                   write_bytes_per_s_per_node=None if nvme else rate("write_gb_per_s_per_node", None),
                   read_bytes_per_s_total=rate("read_gb_per_s_total", math.inf),
                   write_bytes_per_s_total=rate("write_gb_per_s_total", math.inf),
                   request_latency_s=F.number(d, "request_latency_ms", where, 0.0, minimum=0.0, strict_min=False,
                                              maximum=1e6) * 1e-3,
                   request_bytes_per_s=rate("request_gb_per_s", math.inf))


def dataset_from(value, where: str) -> Dataset | None:
    """A dataset: a preset name (simulator/data/datasets/) or a mapping of its fields."""
    if value is None:
        return None
    d, where = _preset_or_mapping("datasets", value, where, DATASET_KEYS)
    return Dataset(name=str(d.get("name") or "custom"),
                   storage_bytes_per_token=F.number(d, "storage_bytes_per_token", where, maximum=1e9),
                   tokens_per_request=F.number(d, "tokens_per_request", where, None, maximum=1e15),
                   cpu_tokens_per_s_per_core=F.number(d, "cpu_tokens_per_s_per_core", where, maximum=1e15),
                   host_to_device_bytes_per_token=F.number(d, "host_to_device_bytes_per_token", where, minimum=0.0,
                                                           strict_min=False, maximum=1e9))


@lru_cache(maxsize=None)
def default_storage() -> Storage:
    return storage_from("network-fs", "storage")


@lru_cache(maxsize=None)
def default_dataset() -> Dataset:
    return dataset_from("text-pretokenized", "dataset")
