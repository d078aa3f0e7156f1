"""Accelerator, node, network and cluster profiles: load and validate YAML.

Profiles live in hardware_profiles/{accelerators,nodes,networks}/NAME.yaml (schema in
hardware_profiles/README.md). Everything is converted to SI units here: FLOP/s, bytes,
bytes/s, seconds. Efficiency factors come from the profile, never from code.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field, replace
from functools import lru_cache
from pathlib import Path
from typing import Mapping

from . import fields as F
from .attentiontiles import Tiles
from .errors import InputError
from .resources import data_dir, user_calibrated_dir
from .yamlio import load_yaml

PRECISIONS = ("fp32", "tf32", "bf16", "fp16", "fp8", "mxfp8", "nvfp4")
GIB = 2**30
GB = 1e9
TERA = 1e12
# Physical ranges of profile numbers: a rate below 1 MB/s or a latency above a second is a
# typo, and would make a prediction overflow or divide by almost nothing.
RATE = dict(minimum=1e-3, maximum=1e7)  # GB/s or Gb/s
GIBS = dict(minimum=1e-3, maximum=1e9)
TFLOPS = dict(minimum=1e-6, maximum=1e7)
LATENCY = dict(minimum=0.0, strict_min=False, maximum=1e6)  # microseconds


def profiles_dir() -> Path:
    """The hardware_profiles folder: $LLMSIM_PROFILES or the one shipped in the package."""
    env = os.environ.get("LLMSIM_PROFILES")
    return Path(env) if env else data_dir() / "hardware_profiles"


@dataclass(frozen=True)
class Efficiency:
    """Achievable fraction of a peak as a saturating curve of the operation size.

    eff(x) = max * x / (x + half): small kernels cannot fill the device (launch and
    tail effects), large ones approach `max`. half = 0 gives a constant.
    """

    max: float
    half: float
    # Beyond `spill` units of work the kernel runs at `spill_max` of the peak: a CPU
    # core's data outgrowing its private cache (compute._work_time). None: no such regime.
    spill: float | None = None
    spill_max: float | None = None


@dataclass(frozen=True)
class Validation:
    """Whether a profile's efficiencies were checked against measured runs, and if not, why
    (e.g. transferred from another accelerator). Optional in a profile (`validation:`)."""

    validated: bool
    reason: str


@dataclass(frozen=True)
class Accelerator:
    name: str
    description: str
    peak_flops: Mapping[str, float]  # precision -> dense FLOP/s
    hbm_bytes: float
    hbm_bytes_per_s: float  # B/s
    host_link_bytes_per_s: float  # B/s, one direction
    tdp_w: float
    price_usd_per_hour: float
    framework_overhead_bytes: float
    matmul: Efficiency
    attention: Efficiency
    memory: Efficiency
    sources: Mapping[str, str] = field(default_factory=dict, compare=False)
    # Optional per-kernel curves for memory-bound operators whose achieved rate differs from
    # a plain bandwidth-bound kernel (e.g. GELU's erf is compute-bound on a CPU). Keys are
    # kernel classes (compute.MEMORY_KERNELS); absent classes use `memory`.
    memory_kernels: Mapping[str, Efficiency] = field(default_factory=dict)
    # Host-side framework cost per operator and pass (Python, dispatcher, autograd) that runs
    # serially with the kernels: a CPU device. 0 where kernels launch asynchronously (GPUs).
    op_overhead_s: float = 0.0
    # Fractional slowdown of compute kernels while communication kernels run on the same
    # device (SM and memory-bandwidth contention); 0 = none. Used by the graph engine.
    overlap_slowdown: float = 0.0
    validation: Validation | None = field(default=None, compare=False)
    # Power drawn with a context loaded and no kernel running (optional; energy.py documents
    # the default when absent).
    idle_w: float | None = None
    # Achieved fraction of the FP8 (and MXFP8) peak for the GEMMs of FP8 linears, from an FP8
    # microbenchmark; None: the profile has no FP8 GEMM figure and FP8 plans are refused.
    matmul_fp8: Efficiency | None = None
    # Achieved fraction of the NVFP4 peak (`peak_tflops.nvfp4`) for the GEMMs of NVFP4
    # linears, from an NVFP4 GEMM microbenchmark; None: NVFP4 plans are refused.
    matmul_fp4: Efficiency | None = None
    # FP8 GEMMs in any operand layout (Blackwell), not only TN (Hopper): TransformerEngine then
    # writes no transposed copy of a per-tensor scaled FP8 tensor (fp8.writes_transpose)
    fp8_any_layout: bool = False
    # Streaming multiprocessors (compute units): the share of them a kernel running beside a
    # GEMM takes (tpoverlap.py); None where the profile does not say.
    sm_count: int | None = None
    # FlashAttention-2 (PyTorch SDPA's flash backend) where `attention` is a faster kernel's
    # (FA3/cuDNN on Hopper): compute.FLASH2_ATTENTION. `attention_is_flash2` (YAML
    # `attention_flash2: fused`): the `attention` curves are FlashAttention-2's own. Neither:
    # no FlashAttention-2 rate is known for the part, and plans that name it are refused.
    attention_flash2: Efficiency | None = None
    attention_is_flash2: bool = False
    # Fractional slowdown of a device's kernels while the node's other devices run
    # too (CPU cores sharing caches and memory bandwidth); 0 where devices have their own memory.
    co_run_slowdown: float = 0.0
    # A GEMM's rate falls with its reduction dimension K as K / (K + k_half): a fixed cost per
    # output tile worth that many elements of K (16-bit GEMMs: matmul_k_half; FP8 ones:
    # matmul_fp8_k_half); 0: not measured.
    matmul_k_half: float = 0.0
    matmul_fp8_k_half: float = 0.0
    # A flash-attention kernel's rate falls with the keys each query of a call runs over as
    # K / (K + attention_keys_half): a fixed cost per query row (its output and log-sum-exp)
    # worth that many keys (compute._attention_calls); 0: not measured.
    attention_keys_half: float = 0.0
    # The attention kernel's block sizes where its causal blocks compute more than the causal
    # half (attentiontiles.py: PyTorch's CPU flash kernel); None: the causal half exactly.
    attention_tiles: Tiles | None = None
    # Best-shape GEMM rate over the dense peak, per precision (efficiency.mamf: a Maximum
    # Achievable Matmul FLOPS measurement): what a transfer scales by (validation/transfer.py);
    # empty where none is measured.
    mamf: Mapping[str, float] = field(default_factory=dict)
    # Curves of the backward passes where their kernels differ from the forward
    # one (efficiency.matmul_bwd_input, matmul_bwd_weight, attention_bwd; e.g. a CPU's bf16 GEMM
    # with a transposed operand); absent: the forward curve.
    pass_efficiency: Mapping[str, Efficiency] = field(default_factory=dict)
    # Curves measured in another precision than the reference one (efficiency.
    # precisions.<precision>.{matmul, matmul_bwd_*, attention, attention_bwd, memory,
    # memory_kernels}), e.g. a CPU's bf16 GEMMs (AMX). Absent: the reference curves.
    precision_efficiency: Mapping[str, Mapping[str, Efficiency]] = field(default_factory=dict)
    # Host-side framework cost (seconds) per "microbatch", per "step" and per
    # "param_tensor" per step (framework_ops.py); empty where the host runs ahead (GPUs).
    host_overhead_s: Mapping[str, float] = field(default_factory=dict)
    # ln(measured / predicted step time) of the rows `llmsim validate --torch`
    # recorded in a calibrated profile (calibration.validation), for intervals.py
    validation_residuals: tuple = field(default=(), compare=False)
    validation_basis: str = field(default="", compare=False)

    def _for(self, precision: str | None, key: str, default: Efficiency) -> Efficiency:
        return self.precision_efficiency.get(precision, {}).get(key, default) if precision else default

    def compute_efficiency(self, kind: str, pass_: str = "fwd", precision: str | None = None) -> Efficiency:
        """The curve of a `kind` ("matmul" | "attention") kernel of pass `pass_` ("fwd",
        "bwd_input", "bwd_weight"; attention's backward is "bwd") in `precision`: the
        precision's curve of that pass, else its forward one, else the reference ones."""
        keys = ([f"{kind}_{pass_}"] if pass_ != "fwd" else []) + [kind]
        block = self.precision_efficiency.get(precision, {}) if precision else {}
        for table in (block, self.pass_efficiency):
            for k in keys:
                if k in table:
                    return table[k]
        return self.attention if kind == "attention" else self.matmul

    def memory_efficiency(self, kernel: str | None = None, precision: str | None = None) -> Efficiency:
        """The curve of memory-bound kernel class `kernel` in `precision`: the precision's own,
        else the reference one of that class, else the precision's plain curve, else the reference one."""
        if kernel in self.memory_kernels:
            return self._for(precision, kernel, self.memory_kernels[kernel])
        return self._for(precision, kernel, self._for(precision, "memory", self.memory)) if kernel \
            else self._for(precision, "memory", self.memory)

    def peak(self, precision: str) -> float:
        if precision not in self.peak_flops:
            supported = ", ".join(p for p in PRECISIONS if p in self.peak_flops)
            raise InputError("plan.precision", precision, f"{self.name} supports {supported}")
        return self.peak_flops[precision]


@dataclass(frozen=True)
class Nvls:
    """NVLink SHARP all-reduce (NCCL's NVLS algorithm): the NVSwitch reduces and multicasts, so
    each device sends its S bytes once and receives the S reduced bytes once, at an algorithm
    bandwidth that hardly depends on the group size, where a ring moves 2(n-1)/n·S per device.
    NCCL selects it for all-reduces of groups of `min_devices` or more inside one NVSwitch
    domain (measured: 5 on 8 H200, 6 on 8 B200)."""

    min_devices: int
    efficiency: float  # achieved algorithm bandwidth (S / time) / the link's line rate
    latency_s: float  # per collective


@dataclass(frozen=True)
class Link:
    """A link class for collectives: per-device one-direction bandwidth, latency, efficiency."""

    name: str
    bytes_per_s: float  # per device, one direction, line rate
    latency_s: float  # per collective step
    efficiency: float  # achieved bus bandwidth / line rate
    # Scale-up links only: every pair of the domain's devices has its own link, 1/(domain - 1)
    # of `bytes_per_s` (AMD xGMI, Gaudi's on-die RoCE), where a switch gives any pair all of it.
    full_mesh: bool = False
    # Scale-up links only: the switch's in-network all-reduce, where it has one
    nvls: Nvls | None = None

    @property
    def bus_bytes_per_s(self) -> float:
        return self.bytes_per_s * self.efficiency


@dataclass(frozen=True)
class Network:
    name: str
    description: str
    latency_s: float
    efficiency: float
    oversubscription: float
    sources: Mapping[str, str] = field(default_factory=dict, compare=False)


@dataclass(frozen=True)
class Node:
    name: str
    description: str
    accelerator: str
    devices_per_node: int
    scaleup: Link
    scaleup_domain: int
    network: str
    nics: int
    nic_bytes_per_s: float  # B/s per NIC, one direction
    host_memory_bytes: float
    nvme_read_bytes_per_s: float
    nvme_write_bytes_per_s: float
    host_adam_params_per_s: float
    sources: Mapping[str, str] = field(default_factory=dict, compare=False)
    # Power of everything in the node but its accelerators (CPUs, memory, NICs, fans, power
    # conversion) while training (optional; energy.py documents the default when absent).
    power_overhead_w: float | None = None
    # Host seconds an eager framework spends launching one operator (hostbound.py); 0: never
    # host-bound.
    launch_overhead_s: float = 0.0
    # Devices whose host copies share one PCIe uplink to the CPUs' memory (a PCIe switch
    # holding two GPUs on DGX-class nodes); 1: a link of its own each
    devices_per_host_link: int = 1


@dataclass(frozen=True)
class Cluster:
    """`nodes` x `devices_per_node` accelerators joined by scale-up links and a network."""

    accelerator: Accelerator
    node: Node
    network: Network
    nodes: int
    devices_per_node: int

    @property
    def devices(self) -> int:
        return self.nodes * self.devices_per_node

    @property
    def host_link_bytes_per_s(self) -> float:
        """Each device's share of its host link (one direction) while every device of the node
        copies at once, as the symmetric ranks of a training step do: the accelerator's
        link over the devices behind one uplink to host memory."""
        return self.accelerator.host_link_bytes_per_s / self.node.devices_per_host_link

    @property
    def scaleup_domain(self) -> int:
        """Devices that reach each other over scale-up links (NVLink, ICI, xGMI)."""
        return max(self.devices_per_node, min(self.node.scaleup_domain, self.devices))

    @property
    def scaleout(self) -> Link:
        """Each device's share of its node's NICs across the network."""
        per_device = self.node.nics * self.node.nic_bytes_per_s / self.devices_per_node
        return Link(self.network.name, per_device / self.network.oversubscription,
                    self.network.latency_s, self.network.efficiency)


# --------------------------------------------------------------------------- loading

def _sources(data: Mapping, where: str) -> dict:
    src = data.get("sources")
    if not isinstance(src, Mapping) or not src:
        raise InputError(f"{where}.sources", src, "every profile needs a sources map")
    return {str(k): str(v) for k, v in src.items()}


def _efficiency(data: Mapping, key: str, where: str, size_key: str) -> Efficiency:
    d = F.require_mapping(data.get(key), f"{where}.{key}")
    spill_key = "spill_" + size_key.split("_")[1]  # spill_flops | spill_bytes
    F.reject_unknown(d, ("max", size_key, spill_key, "spill_max"), f"{where}.{key}")
    spill = d.get(spill_key) is not None
    if spill != (d.get("spill_max") is not None):
        raise InputError(f"{where}.{key}", dict(d), f"give both {spill_key} and spill_max, or neither")
    return Efficiency(max=F.number(d, "max", f"{where}.{key}", minimum=1e-3, maximum=1.0),
                      half=F.number(d, size_key, f"{where}.{key}", minimum=0.0, strict_min=False),
                      spill=F.number(d, spill_key, f"{where}.{key}") if spill else None,
                      spill_max=F.number(d, "spill_max", f"{where}.{key}", maximum=1.0) if spill else None)


PASS_CURVES = ("matmul_bwd_input", "matmul_bwd_weight", "attention_bwd")
# `efficiency.attention_flash2: fused`: the profile's attention kernel is FlashAttention-2
FUSED = "fused"


ACCELERATOR_KEYS = ("name", "description", "vendor", "peak_tflops", "memory_gib", "memory_bandwidth_gb_per_s",
                    "host_link", "host_link_gb_per_s", "tdp_w", "price_usd_per_hour", "framework_overhead_gib",
                    "efficiency", "sources", "calibration", "op_overhead_us", "host_overhead_us", "validation",
                    "idle_power_w", "sm_count", "fp8_any_layout")
HOST_OVERHEADS = ("microbatch", "step", "param_tensor")


def _precision_efficiency(eff: Mapping, where: str) -> dict:
    """efficiency.precisions.<p>: matmul, attention, memory and memory_kernels as in
    the reference block, flattened to {"matmul", "attention", "memory", <kernel class>: Efficiency}."""
    out = {}
    precs = F.require_mapping(eff.get("precisions") or {}, f"{where}.precisions")
    F.reject_unknown(precs, PRECISIONS, f"{where}.precisions")
    for prec, curves in precs.items():
        at = f"{where}.precisions.{prec}"
        curves = F.require_mapping(curves, at)
        F.reject_unknown(curves, ("matmul", "attention", "memory", "memory_kernels") + PASS_CURVES, at)
        got = {k: _efficiency(curves, k, at, "half_bytes" if k == "memory" else "half_flops")
               for k in ("matmul", "attention", "memory") + PASS_CURVES if k in curves}
        kernels = F.require_mapping(curves.get("memory_kernels") or {}, f"{at}.memory_kernels")
        got.update({str(k): _efficiency(kernels, k, f"{at}.memory_kernels", "half_bytes") for k in kernels})
        out[prec] = got
    return out


def _validation_residuals(data: Mapping, where: str) -> tuple[tuple, str]:
    """(residuals, basis) of a calibrated profile's recorded validation rows."""
    cal = data.get("calibration") if isinstance(data.get("calibration"), Mapping) else {}
    val = cal.get("validation") if isinstance(cal.get("validation"), Mapping) else {}
    rows = val.get("rows") or []
    at = f"{where}.calibration.validation.rows"
    if not isinstance(rows, list) or not all(isinstance(r, Mapping) for r in rows):
        raise InputError(at, rows, "a list of {config, measured_step_s, predicted_step_s}")
    residuals = tuple(math.log(F.number(r, "measured_step_s", at) / F.number(r, "predicted_step_s", at))
                      for r in rows)
    return residuals, str(val.get("basis", ""))


def _mamf(eff: Mapping, where: str) -> dict:
    d = F.require_mapping(eff.get("mamf") or {}, where)
    F.reject_unknown(d, PRECISIONS, where)
    return {str(k): F.number(d, k, where, minimum=1e-3, maximum=1.0) for k in d}


def _tiles(eff: Mapping, where: str) -> Tiles | None:
    """efficiency.attention_tiles: {kv: keys per block, q: [[from_tokens, rows], ...]}, the
    first from 0 and rising."""
    if eff.get("attention_tiles") is None:
        return None
    d = F.require_mapping(eff["attention_tiles"], where)
    F.reject_unknown(d, ("kv", "q"), where)
    q = d.get("q")
    ok = isinstance(q, list) and q and all(isinstance(x, list) and len(x) == 2 and all(
        isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in x) and x[1] > 0 for x in q)
    if not ok or q[0][0] != 0 or any(a[0] >= b[0] for a, b in zip(q, q[1:])):
        raise InputError(f"{where}.q", q, "a list of [from_tokens, rows] pairs, the first [0, rows], "
                         "from_tokens rising, rows > 0")
    return Tiles(kv=F.integer(d, "kv", where, maximum=10**7), q=tuple(tuple(x) for x in q))


def _host_overhead(data: Mapping, where: str) -> dict:
    host = F.require_mapping(data.get("host_overhead_us") or {}, f"{where}.host_overhead_us")
    F.reject_unknown(host, HOST_OVERHEADS, f"{where}.host_overhead_us")
    return {k: F.number(host, k, f"{where}.host_overhead_us", minimum=0.0, strict_min=False) * 1e-6 for k in host}


def accelerator_from_dict(data, where: str) -> Accelerator:
    data = F.require_mapping(data, where)
    F.reject_unknown(data, ACCELERATOR_KEYS, where)
    peaks = F.require_mapping(data.get("peak_tflops"), f"{where}.peak_tflops")
    F.reject_unknown(peaks, PRECISIONS, f"{where}.peak_tflops")
    peak_flops = {p: F.number(peaks, p, f"{where}.peak_tflops", **TFLOPS) * TERA for p in PRECISIONS
                  if peaks.get(p) is not None}
    if not peak_flops:
        raise InputError(f"{where}.peak_tflops", dict(peaks), "at least one precision is needed")
    eff = F.require_mapping(data.get("efficiency"), f"{where}.efficiency")
    F.reject_unknown(eff, ("matmul", "matmul_fp8", "matmul_fp4", "attention", "attention_flash2", "memory",
                           "memory_kernels", "overlap_slowdown", "precisions", "co_run_slowdown", "matmul_k_half",
                           "matmul_fp8_k_half", "attention_keys_half", "attention_tiles", "mamf") + PASS_CURVES,
                     f"{where}.efficiency")
    flash2 = eff.get("attention_flash2")
    if isinstance(flash2, str) and flash2 != FUSED:
        raise InputError(f"{where}.efficiency.attention_flash2", flash2,
                         f"a curve {{max, half_flops}} or {FUSED} (efficiency.attention is FlashAttention-2's own)")
    kernels = F.require_mapping(eff.get("memory_kernels") or {}, f"{where}.efficiency.memory_kernels")
    memory_kernels = {str(k): _efficiency(kernels, k, f"{where}.efficiency.memory_kernels", "half_bytes")
                      for k in kernels}
    return Accelerator(
        name=F.text(data, "name", where),
        description=F.text(data, "description", where, ""),
        peak_flops=peak_flops,
        hbm_bytes=F.number(data, "memory_gib", where, **GIBS) * GIB,
        hbm_bytes_per_s=F.number(data, "memory_bandwidth_gb_per_s", where, **RATE) * GB,
        host_link_bytes_per_s=F.number(data, "host_link_gb_per_s", where, **RATE) * GB,
        tdp_w=F.number(data, "tdp_w", where, maximum=1e6),
        price_usd_per_hour=F.number(data, "price_usd_per_hour", where, minimum=0.0, strict_min=False),
        framework_overhead_bytes=F.number(data, "framework_overhead_gib", where, minimum=0.0, strict_min=False) * GIB,
        matmul=_efficiency(eff, "matmul", f"{where}.efficiency", "half_flops"),
        attention=_efficiency(eff, "attention", f"{where}.efficiency", "half_flops"),
        memory=_efficiency(eff, "memory", f"{where}.efficiency", "half_bytes"),
        sources=_sources(data, where),
        memory_kernels=memory_kernels,
        op_overhead_s=F.number(data, "op_overhead_us", where, 0.0, minimum=0.0, strict_min=False) * 1e-6,
        overlap_slowdown=F.number(eff, "overlap_slowdown", f"{where}.efficiency", 0.0, minimum=0.0,
                                  strict_min=False, maximum=10.0),
        validation=_validation(data.get("validation"), f"{where}.validation"),
        idle_w=F.number(data, "idle_power_w", where, None, minimum=0.0, strict_min=False, maximum=1e6),
        sm_count=F.integer(data, "sm_count", where, None, maximum=100_000),
        matmul_fp8=(_efficiency(eff, "matmul_fp8", f"{where}.efficiency", "half_flops")
                    if eff.get("matmul_fp8") is not None else None),
        matmul_fp4=(_efficiency(eff, "matmul_fp4", f"{where}.efficiency", "half_flops")
                    if eff.get("matmul_fp4") is not None else None),
        fp8_any_layout=F.boolean(data, "fp8_any_layout", where, False),
        attention_flash2=(_efficiency(eff, "attention_flash2", f"{where}.efficiency", "half_flops")
                          if flash2 not in (None, FUSED) else None),
        attention_is_flash2=flash2 == FUSED,
        co_run_slowdown=F.number(eff, "co_run_slowdown", f"{where}.efficiency", 0.0, minimum=0.0, strict_min=False,
                                 maximum=10.0),
        matmul_k_half=F.number(eff, "matmul_k_half", f"{where}.efficiency", 0.0, minimum=0.0, strict_min=False,
                               maximum=1e6),
        matmul_fp8_k_half=F.number(eff, "matmul_fp8_k_half", f"{where}.efficiency", 0.0, minimum=0.0,
                                   strict_min=False, maximum=1e6),
        attention_keys_half=F.number(eff, "attention_keys_half", f"{where}.efficiency", 0.0, minimum=0.0,
                                     strict_min=False, maximum=1e7),
        attention_tiles=_tiles(eff, f"{where}.efficiency.attention_tiles"),
        mamf=_mamf(eff, f"{where}.efficiency.mamf"),
        pass_efficiency={k: _efficiency(eff, k, f"{where}.efficiency", "half_flops") for k in PASS_CURVES if k in eff},
        precision_efficiency=_precision_efficiency(eff, f"{where}.efficiency"),
        host_overhead_s=_host_overhead(data, where),
        **dict(zip(("validation_residuals", "validation_basis"), _validation_residuals(data, where))),
    )


def _validation(data, where: str) -> Validation | None:
    if data is None:
        return None
    data = F.require_mapping(data, where)
    F.reject_unknown(data, ("validated", "reason"), where)
    return Validation(validated=F.boolean(data, "validated", where), reason=F.text(data, "reason", where))


def _link(data: Mapping, where: str) -> tuple[Link, int]:
    d = F.require_mapping(data, where)
    F.reject_unknown(d, ("name", "bandwidth_gb_per_s", "domain_devices", "latency_us", "efficiency", "topology",
                         "nvls"), where)
    link = Link(name=F.text(d, "name", where, "scale-up"),
                bytes_per_s=F.number(d, "bandwidth_gb_per_s", where, **RATE) * GB,
                latency_s=F.number(d, "latency_us", where, **LATENCY) * 1e-6,
                efficiency=F.number(d, "efficiency", where, minimum=1e-3, maximum=1.0),
                full_mesh=F.choice(d, "topology", where, ("switch", "full-mesh"), "switch") == "full-mesh",
                nvls=_nvls(d["nvls"], f"{where}.nvls") if d.get("nvls") is not None else None)
    if link.nvls and link.full_mesh:
        raise InputError(f"{where}.nvls", "given", "only behind a switch (topology: switch)")
    return link, F.integer(d, "domain_devices", where, 1)


def _nvls(data: Mapping, where: str) -> Nvls:
    d = F.require_mapping(data, where)
    F.reject_unknown(d, ("min_devices", "efficiency", "latency_us"), where)
    return Nvls(min_devices=F.integer(d, "min_devices", where, minimum=2, maximum=4096),
                efficiency=F.number(d, "efficiency", where, minimum=1e-3, maximum=1.0),
                latency_s=F.number(d, "latency_us", where, **LATENCY) * 1e-6)


NODE_KEYS = ("name", "description", "accelerator", "devices_per_node", "scaleup", "network", "nics", "nic_gbit_per_s",
             "host_memory_gib", "nvme_read_gb_per_s", "nvme_write_gb_per_s", "host_adam_params_per_s", "sources",
             "power_overhead_w", "launch_overhead_us", "devices_per_host_link")


def node_from_dict(data, where: str) -> Node:
    data = F.require_mapping(data, where)
    F.reject_unknown(data, NODE_KEYS, where)
    scaleup, domain = _link(data.get("scaleup"), f"{where}.scaleup")
    devices = F.integer(data, "devices_per_node", where, maximum=4096)
    return Node(
        name=F.text(data, "name", where),
        description=F.text(data, "description", where, ""),
        accelerator=F.text(data, "accelerator", where),
        devices_per_node=devices,
        scaleup=scaleup,
        scaleup_domain=max(domain, devices),
        network=F.text(data, "network", where),
        nics=F.integer(data, "nics", where, maximum=4096),
        nic_bytes_per_s=F.number(data, "nic_gbit_per_s", where, **RATE) * GB / 8,
        host_memory_bytes=F.number(data, "host_memory_gib", where, **GIBS) * GIB,
        nvme_read_bytes_per_s=F.number(data, "nvme_read_gb_per_s", where, **RATE) * GB,
        nvme_write_bytes_per_s=F.number(data, "nvme_write_gb_per_s", where, **RATE) * GB,
        host_adam_params_per_s=F.number(data, "host_adam_params_per_s", where, minimum=1e3, maximum=1e15),
        sources=_sources(data, where),
        power_overhead_w=F.number(data, "power_overhead_w", where, None, minimum=0.0, strict_min=False, maximum=1e7),
        launch_overhead_s=F.number(data, "launch_overhead_us", where, 0.0, **LATENCY) * 1e-6,
        devices_per_host_link=F.integer(data, "devices_per_host_link", where, 1, maximum=devices),
    )


NETWORK_KEYS = ("name", "description", "latency_us", "efficiency", "oversubscription", "sources")


def network_from_dict(data, where: str, need_sources: bool = True) -> Network:
    data = F.require_mapping(data, where)
    F.reject_unknown(data, NETWORK_KEYS, where)
    return Network(
        name=F.text(data, "name", where, "custom"),
        description=F.text(data, "description", where, ""),
        latency_s=F.number(data, "latency_us", where, **LATENCY) * 1e-6,
        efficiency=F.number(data, "efficiency", where, minimum=1e-3, maximum=1.0),
        oversubscription=F.number(data, "oversubscription", where, 1.0, minimum=1.0, strict_min=False, maximum=1e3),
        sources=_sources(data, where) if need_sources else dict(data.get("sources") or {}),
    )


_KINDS = {"accelerators": accelerator_from_dict, "nodes": node_from_dict, "networks": network_from_dict}


CALIBRATED = "calibrated"  # profiles written by `llmsim calibrate`, found by name as a fallback


def available(kind: str) -> list[str]:
    folder = profiles_dir() / kind
    return sorted(p.stem for p in folder.glob("*.yaml")) if folder.is_dir() else []


def _load_file(kind: str, path: Path, where: str):
    profile = _KINDS[kind](load_yaml(path, where), where)
    if profile.name != path.stem:
        raise InputError(f"{where}.name", profile.name, f"must equal the file name {path.stem!r}")
    return profile


@lru_cache(maxsize=None)
def _load(kind: str, name: str, root: str):
    """hardware_profiles/KIND/NAME.yaml, else hardware_profiles/calibrated/NAME.yaml, else the
    user's calibrated profiles (resources.user_calibrated_dir)."""
    path = Path(root) / kind / f"{name}.yaml"
    where = f"{kind}/{name}.yaml"
    for folder in (Path(root) / CALIBRATED, user_calibrated_dir()):
        if not path.is_file():
            path = folder / f"{name}.yaml"
            where = f"{CALIBRATED}/{name}.yaml"
    if not path.is_file() or os.sep in name or "/" in name:
        raise InputError(f"cluster.{kind[:-1]}", name, "known: " + ", ".join(available(kind)))
    return _load_file(kind, path, where)


def _by_name_or_path(kind: str, ref: str):
    """A profile by name (hardware_profiles/KIND/NAME.yaml) or by a path to a YAML file."""
    if ref.endswith((".yaml", ".yml")) or os.sep in ref:
        where = ref
        profile = _KINDS[kind](load_yaml(ref, where), where)
        if kind == "nodes":
            profile = _with_siblings(profile, Path(ref).parent)
        return profile
    return _load(kind, ref, str(profiles_dir()))


def _with_siblings(node: "Node", folder: Path) -> "Node":
    """A node loaded by path names its accelerator and network; files with those names beside it
    win over hardware_profiles/ (how `llmsim calibrate` writes NAME.yaml, NAME-node.yaml, NAME-net.yaml)."""
    changes = {}
    for attr in ("accelerator", "network"):
        sibling = folder / f"{getattr(node, attr)}.yaml"
        if sibling.is_file():
            changes[attr] = str(sibling)
    return replace(node, **changes) if changes else node


def load_accelerator(ref: str) -> Accelerator:
    return _by_name_or_path("accelerators", ref)


def load_node(ref: str) -> Node:
    return _by_name_or_path("nodes", ref)


def load_network(ref: str) -> Network:
    return _by_name_or_path("networks", ref)


CLUSTER_KEYS = ("accelerator", "nodes", "devices_per_node", "node", "network", "nics", "nic_gbit_per_s",
                "price_usd_per_device_hour")


def cluster_from_dict(data) -> Cluster:
    """The scenario's `cluster` section: node profile, optional accelerator, network, devices
    per node and NIC (count, Gb/s each) overrides."""
    data = F.require_mapping(data, "cluster")
    F.reject_unknown(data, CLUSTER_KEYS, "cluster")
    if data.get("node") is None and data.get("accelerator") is None:
        raise InputError("cluster.node", None, "give a node profile (e.g. dgx-a100) or an accelerator")
    if data.get("node") is None:
        node = _default_node_for(load_accelerator(F.text(data, "accelerator", "cluster")).name)
    else:
        node = load_node(F.text(data, "node", "cluster"))
    acc_name = F.text(data, "accelerator", "cluster", node.accelerator)
    accelerator = load_accelerator(acc_name)
    net = data.get("network")
    if isinstance(net, Mapping):
        network = network_from_dict(net, "cluster.network", need_sources=False)
    else:
        network = load_network(F.text(data, "network", "cluster", node.network))
    per_node = F.integer(data, "devices_per_node", "cluster", node.devices_per_node, maximum=4096)
    nodes = F.integer(data, "nodes", "cluster", 1, maximum=10**7)
    price = data.get("price_usd_per_device_hour")
    if price is not None:
        accelerator = replace(accelerator, price_usd_per_hour=F.number(
            data, "price_usd_per_device_hour", "cluster", minimum=0.0, strict_min=False))
    if per_node != node.devices_per_node:
        node = replace(node, devices_per_node=per_node, scaleup_domain=max(per_node, node.scaleup_domain))
    # a node of the profile's make with other NICs (how many, how fast): its scale-out share per device
    if data.get("nics") is not None:
        node = replace(node, nics=F.integer(data, "nics", "cluster", maximum=4096))
    if data.get("nic_gbit_per_s") is not None:
        node = replace(node, nic_bytes_per_s=F.number(data, "nic_gbit_per_s", "cluster", **RATE) * GB / 8)
    return Cluster(accelerator=accelerator, node=node, network=network, nodes=nodes, devices_per_node=per_node)


def _default_node_for(accelerator: str) -> Node:
    """The first node profile whose default accelerator is `accelerator`."""
    for name in available("nodes"):
        node = load_node(name)
        if node.accelerator == accelerator:
            return node
    raise InputError("cluster.node", None, f"no node profile uses {accelerator!r}; name one of "
                     + ", ".join(available("nodes")))
