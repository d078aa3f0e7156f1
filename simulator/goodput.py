"""Goodput of a long run: failures, checkpoints and restarts of a synchronous training job.

A failure of any component stops the whole job, which restarts from its last complete
checkpoint (Llama 3 paper, Dubey et al. 2024, Sec. 3.3.4: "a single GPU failure may require
a restart of the entire job"). First-order model of Young (1974, "A first order
approximation to the optimum checkpoint interval", CACM 17(9)) and Daly (2006, "A higher
order estimate of the optimum checkpoint interval for restart dumps", FGCS 22(3)):
Poisson failures at rate λ (mean time between failures M = 1/λ), a checkpoint every τ
seconds of training that stalls it C seconds, a restart of R seconds, and a failure
uniform over the period τ + C, so it loses (τ + C)/2 of work on average, plus `lag` when
the newest checkpoint was still being written (asynchronous and in-memory checkpoints).
Planned interruptions (maintenance, at rate λp) checkpoint first and lose no work.
Wall time W for useful time U:

    W = U (1 + C/τ) + W λ (R + (τ + C)/2 + lag) + W λp (Rp + C)
    goodput = U / W = (1 - λ (R + (τ + C)/2 + lag) - λp (Rp + C)) / (1 + C/τ)

and the interval that minimises the waste to first order is Young's τ = √(2·C·M). A job
whose failures come faster than it can restart and redo its work has goodput 0.

Sizes and times may be numpy arrays (one entry per plan).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from . import muon
from .bcast import maximum, minimum, where
from .training import Checkpointing, Failures, Restart, Storage

HOUR = 3600.0


def failure_rate_per_s(failures: Failures, devices, nodes, nics):
    """Job interruptions per second: each component's count over its mean time between
    interruptions (GPUs per device, hosts and software per node, NICs and their switch and
    cable share per NIC port), or devices/1000 over one job-level MTBF per 1,000 devices."""
    f = failures
    if f.mtbf_hours_per_1000_devices is not None:
        return devices / 1000.0 / (f.mtbf_hours_per_1000_devices * HOUR)
    per_hour = (devices / f.gpu_mtbf_hours + nodes / f.host_mtbf_hours + nodes / f.software_mtbf_hours
                + nics / f.nic_mtbf_hours + nics / f.network_mtbf_hours)
    return per_hour / HOUR


def checkpoint_bytes(layout):
    """Bytes of one checkpoint: every parameter once with its weight (compute precision) and
    optimizer states (fp32 master copy and Adam moments under mixed precision; states.py; one
    momentum in place of the two moments on Muon's matrices, muon.py); gradients are not saved.
    However the plan shards them, a distributed checkpoint stores each tensor once (replicated
    norms and shards deduplicated), so the size is the model's."""
    per = layout.per_param
    nbytes = _params(layout.model) * (per.kept_weight + per.optimizer)
    if layout.plan.optimizer == "muon":
        nbytes -= muon.model_matrix_params(layout.model) * muon.MOMENTUM_BYTES
    return nbytes + 0.0 * layout.p


@lru_cache(maxsize=64)
def _params(model) -> float:
    return float(model.params())


def young_daly_interval_s(stall_s, mtbf_s):
    """Young's optimum checkpoint interval √(2·C·M)."""
    return np.sqrt(2.0 * stall_s * mtbf_s)


def storage_rate(per_node, total, nodes):
    """Bytes/s of `nodes` nodes each limited to `per_node`, together to `total`."""
    return minimum(per_node * nodes, total)


@dataclass(frozen=True)
class CheckpointCost:
    stall_s: object  # training stops this long per checkpoint
    background_s: object  # then this long in the background before the checkpoint is complete
    load_s: object  # reading it back at a restart


def checkpoint_cost(nbytes, ckpt: Checkpointing, storage: Storage, cluster) -> CheckpointCost:
    """Stall, background write and load time of a checkpoint of `nbytes`.

    Every node writes and reads its share (Megatron-Core's fully parallel save spreads the
    replicated shards over the data-parallel ranks; PyTorch DCP saves each tensor once).
    - blocking: training waits for the write (torchtitan's default `async_mode: disabled`,
      pytorch/torchtitan config CheckpointConfig; Megatron-LM without --async-save).
    - async: training waits only for the copy to pinned host memory over the host link, the
      write goes on in the background (PyTorch DCP async_save; Megatron --async-save).
    - in_memory: the host copy is replicated to `replicas - 1` peer hosts over the scale-out
      NICs in the background (Gemini, Wang et al. SOSP 2023; FFTrainer, arXiv 2512.03644),
      and a restart reads a lost node's shard from a peer's memory. Traffic is assumed to fit
      the network's idle time (Gemini interleaves it with training traffic); a loss of every
      copy at once (falling back to storage) is not modelled.
    """
    nodes, devices = cluster.nodes, cluster.devices
    snapshot = nbytes / devices / cluster.host_link_bytes_per_s
    write = nbytes / storage_rate(storage.write_bytes_per_s_per_node, storage.write_bytes_per_s_total, nodes)
    read = nbytes / storage_rate(storage.read_bytes_per_s_per_node, storage.read_bytes_per_s_total, nodes)
    if ckpt.mode == "blocking":
        return CheckpointCost(write, 0.0 * write, read)
    if ckpt.mode == "async":
        return CheckpointCost(snapshot, write, read)
    nic = cluster.node.nics * cluster.node.nic_bytes_per_s
    per_node = nbytes / nodes
    return CheckpointCost(snapshot, (ckpt.replicas - 1) * per_node / nic, per_node / nic)


@dataclass(frozen=True)
class Goodput:
    """The whole run's failure and checkpoint costs (seconds; rates per wall-clock second)."""

    failure_rate_per_s: object
    planned_rate_per_s: object
    checkpoint_bytes: object
    checkpoint: CheckpointCost
    interval_s: object  # training time between checkpoints
    restart_s: object  # after a failure: detection, rescheduling, initialisation, loading
    planned_restart_s: object  # after a planned stop: no detection
    lost_per_failure_s: object  # work redone after a failure: (τ + C)/2 + lag
    goodput: object

    @property
    def mtbf_s(self):
        return 1.0 / self.failure_rate_per_s

    def wall_s(self, useful_s):
        """Wall-clock time of `useful_s` seconds of training (inf when the job cannot progress)."""
        g = self.goodput
        return where(g > 0, useful_s / maximum(g, 1e-300), np.inf)

    def parts(self, useful_s):
        """(wall, rework, idle, interruptions) of a run of `useful_s`: rework re-runs training
        steps; idle is checkpoint stalls and restarts; they add up to the wall time."""
        wall = self.wall_s(useful_s)
        failures, planned = wall * self.failure_rate_per_s, wall * self.planned_rate_per_s
        rework = failures * self.lost_per_failure_s
        idle = useful_s * self.checkpoint.stall_s / self.interval_s + failures * self.restart_s + \
            planned * (self.planned_restart_s + self.checkpoint.stall_s)
        return wall, rework, idle, failures + planned


def goodput_fraction(interval_s, stall_s, restart_s, lag_s, failure_rate, planned_rate, planned_restart_s):
    """Useful fraction of wall-clock time (module docstring), 0 when the job cannot progress."""
    waste = failure_rate * (restart_s + (interval_s + stall_s) / 2 + lag_s) + planned_rate * (planned_restart_s +
                                                                                           stall_s)
    return maximum(0.0, 1.0 - waste) / (1.0 + stall_s / interval_s)


def goodput(layout, training, storage: Storage, step_s) -> Goodput:
    """The failure and checkpoint costs of a run of this Layout's plan at `step_s` per step."""
    cluster = layout.cluster
    rate = failure_rate_per_s(training.failures, cluster.devices, cluster.nodes, cluster.nodes * cluster.node.nics)
    planned = training.failures.planned_per_day / 86400.0
    nbytes = checkpoint_bytes(layout)
    ckpt = training.checkpoint
    cost = checkpoint_cost(nbytes, ckpt, storage, cluster)
    r: Restart = training.restart
    planned_restart = r.reschedule_s + r.init_s + cost.load_s
    restart = r.detection_s + planned_restart
    interval = young_daly_interval_s(cost.stall_s, 1.0 / rate) if ckpt.interval_s is None else ckpt.interval_s
    # a checkpoint is taken between steps, and the next cannot start before the last is written
    interval = maximum(maximum(interval, step_s), cost.background_s)
    lag = cost.background_s
    lost = (interval + cost.stall_s) / 2 + lag
    g = goodput_fraction(interval, cost.stall_s, restart, lag, rate, planned, planned_restart)
    return Goodput(rate, planned, nbytes, cost, interval, restart, planned_restart, lost, g)
