"""How much a prediction leans on each hardware number: the step time with one of the
profile's rates 10 % lower and 10 % higher, everything else held.

A profile's numbers are not equally sure (`llmsim hardware show`: a fit to published runs, a
microbenchmark, a transfer from another accelerator), and a plan does not lean on them
equally: a large dense model on one node waits on its GEMMs, a small one across many nodes on
its network. Scaling one quantity at a time says which number to measure before trusting the
prediction, and how far a given error in it carries into the step time. Each factor scales
what the engines divide by (compute.op_times: a kernel's work over its rate; comm.py: bytes
over a link's bus bandwidth) or, for the host's cost per operator, what they add, so a plan
that does not use a quantity does not move with it: one device has no link to wait on.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Callable

from .hardware import Accelerator, Cluster, Efficiency

STEP = 0.10  # the relative change applied to each quantity, down and up


def _faster(e: Efficiency | None, k: float) -> Efficiency | None:
    """A curve `k` times as fast at every size (compute._work_time divides by max)."""
    if e is None:
        return None
    return replace(e, max=e.max * k, spill_max=None if e.spill_max is None else e.spill_max * k)


def _kernel_curves(acc: Accelerator, kind: str, k: float) -> dict:
    """The accelerator fields holding the curves of one kernel kind, `k` times as fast: the
    reference curve, its per-pass curves (calibrated profiles) and its per-precision ones."""
    passes = {name: _faster(e, k) if name.startswith(kind) else e for name, e in acc.pass_efficiency.items()}
    precisions = {p: {name: _faster(e, k) if name == kind else e for name, e in curves.items()}
                  for p, curves in acc.precision_efficiency.items()}
    return {kind: _faster(getattr(acc, kind), k), "pass_efficiency": passes, "precision_efficiency": precisions}


def _gemm(c: Cluster, k: float) -> Cluster:
    acc = c.accelerator
    fields = _kernel_curves(acc, "matmul", k)
    return replace(c, accelerator=replace(acc, **fields, matmul_fp8=_faster(acc.matmul_fp8, k),
                                          matmul_fp4=_faster(acc.matmul_fp4, k)))


def _attention(c: Cluster, k: float) -> Cluster:
    acc = c.accelerator
    fields = _kernel_curves(acc, "attention", k)
    return replace(c, accelerator=replace(acc, **fields, attention_flash2=_faster(acc.attention_flash2, k)))


def _hbm(c: Cluster, k: float) -> Cluster:
    return replace(c, accelerator=replace(c.accelerator, hbm_bytes_per_s=c.accelerator.hbm_bytes_per_s * k))


def _scaleup(c: Cluster, k: float) -> Cluster:
    link = c.node.scaleup
    return replace(c, node=replace(c.node, scaleup=replace(link, bytes_per_s=link.bytes_per_s * k)))


def _scaleout(c: Cluster, k: float) -> Cluster:
    return replace(c, node=replace(c.node, nic_bytes_per_s=c.node.nic_bytes_per_s * k))


def _host_link(c: Cluster, k: float) -> Cluster:
    acc = c.accelerator
    return replace(c, accelerator=replace(acc, host_link_bytes_per_s=acc.host_link_bytes_per_s * k))


def _host_adam(c: Cluster, k: float) -> Cluster:
    return replace(c, node=replace(c.node, host_adam_params_per_s=c.node.host_adam_params_per_s * k))


def _nvme(c: Cluster, k: float) -> Cluster:
    n = c.node
    return replace(c, node=replace(n, nvme_read_bytes_per_s=n.nvme_read_bytes_per_s * k,
                                   nvme_write_bytes_per_s=n.nvme_write_bytes_per_s * k))


def _host_rate(c: Cluster, k: float) -> Cluster:
    """The host issuing operators k times as fast: 1/k of its cost per operator."""
    acc = c.accelerator
    acc = replace(acc, op_overhead_s=acc.op_overhead_s / k,
                  host_overhead_s={name: s / k for name, s in acc.host_overhead_s.items()})
    return replace(c, accelerator=acc, node=replace(c.node, launch_overhead_s=c.node.launch_overhead_s / k))


@dataclass(frozen=True)
class Factor:
    name: str
    scales: str  # the profile fields it scales, as `llmsim hardware show` names them
    faster: Callable[[Cluster, float], Cluster]  # the cluster with this quantity k times as fast


FACTORS = (
    Factor("GEMM rate", "efficiency.matmul, matmul_fp8, matmul_fp4", _gemm),
    Factor("attention rate", "efficiency.attention, attention_flash2", _attention),
    Factor("HBM bandwidth", "memory_bandwidth_gb_per_s", _hbm),
    Factor("scale-up link", "node scaleup.bandwidth_gb_per_s", _scaleup),
    Factor("scale-out network", "node nic_gbit_per_s", _scaleout),
    Factor("host link", "host_link_gb_per_s", _host_link),
    Factor("host Adam rate", "node host_adam_params_per_s", _host_adam),
    Factor("NVMe bandwidth", "node nvme_read_gb_per_s, nvme_write_gb_per_s", _nvme),
    Factor("host operator rate", "1 / (node launch_overhead_us, op_overhead_us, host_overhead_us)", _host_rate),
)


@dataclass(frozen=True)
class Sensitivity:
    """The step time with one factor's quantity STEP lower and STEP higher."""

    factor: str
    scales: str
    step_time_s_lower: float  # the quantity at (1 - STEP) of the profile's
    step_time_s_higher: float  # at (1 + STEP)
    elasticity: float  # d ln(step time) / d ln(quantity) between those two points
    fits_lower: bool = True  # whether the plan still fits in memory at (1 - STEP)
    fits_higher: bool = True

    def to_dict(self, step_time_s: float) -> dict:
        return {"factor": self.factor, "scales": self.scales, "step_time_s_lower": self.step_time_s_lower,
                "step_time_s_higher": self.step_time_s_higher,
                "lower_change_pct": 100 * (self.step_time_s_lower / step_time_s - 1),
                "higher_change_pct": 100 * (self.step_time_s_higher / step_time_s - 1),
                "elasticity": self.elasticity, "fits_lower": self.fits_lower, "fits_higher": self.fits_higher}


def sensitivities(scenario, engine: str = "graph", base=None) -> list[Sensitivity] | None:
    """Each factor's Sensitivity for `scenario` (`base`: its result on `engine` where the
    caller has it), or None where the plan does not fit at the profile's rates. A rate moves
    memory where what is alive depends on timing: with activations offloaded the graph engine
    frees each once its copy to the host has finished, so a slower host link (or faster
    kernels) keeps more alive at once, and a plan near the device's memory may not fit at one
    side of a factor (`fits_lower`, `fits_higher`); its step time there is reported all the
    same."""
    from .evaluate import evaluate

    if not (base or evaluate(scenario, engine)).feasible:
        return None
    out = []
    for f in FACTORS:
        lower, higher = (evaluate(replace(scenario, cluster=f.faster(scenario.cluster, k)), engine)
                         for k in (1 - STEP, 1 + STEP))
        elasticity = math.log(higher.step_time_s / lower.step_time_s) / math.log((1 + STEP) / (1 - STEP))
        out.append(Sensitivity(f.name, f.scales, lower.step_time_s, higher.step_time_s, elasticity,
                               bool(lower.feasible), bool(higher.feasible)))
    return out
