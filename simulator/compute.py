"""Operator time: a roofline over the profile's achievable compute and memory rates.

time = max(FLOPs / achievable FLOP/s, bytes / achievable bytes/s). The profile's
efficiency is a saturating curve eff(x) = max·x/(x + half) of the kernel's size x, so
x / (peak·eff(x)) = (x + half) / (peak·max): a kernel runs at `max` of peak after a fixed
start-up cost worth `half` units of work. That form has no 0/0 and vectorises.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .hardware import Accelerator, Efficiency
from .workload import ATTENTION, MATMUL, Op


def _work_time(work, rate: float, eff: Efficiency):
    """Seconds to do `work` (FLOPs or bytes) at `rate`·eff(work); zero work takes no time.

    [issue 10] A curve with a spill point runs the work beyond it at `spill_max` of the rate
    (a CPU core's data outgrowing its private cache)."""
    t = (work + eff.half) / (rate * eff.max)
    if eff.spill is not None:
        t = t + np.maximum(np.asarray(work) - eff.spill, 0.0) * (1.0 / eff.spill_max - 1.0 / eff.max) / rate
    return np.where(np.asarray(work) > 0, t, 0.0)


# Kernel class of each memory-bound workload operator, for a profile's optional
# efficiency.memory_kernels curves (hardware.Accelerator.memory_efficiency).
MEMORY_KERNELS = {
    "attn_norm": "norm", "mlp_norm": "norm", "final_norm": "norm",
    "attn_residual": "residual", "mlp_residual": "residual",
    "gelu": "gelu", "swiglu": "swiglu", "rope": "rope", "softmax": "softmax", "attn_dropout": "dropout",
    "embedding": "embedding", "cross_entropy": "cross_entropy",
}


@dataclass(frozen=True)
class OpTimes:
    fwd: object
    bwd_input: object
    bwd_weight: object

    @property
    def bwd(self):
        return self.bwd_input + self.bwd_weight


def op_times(op: Op, acc: Accelerator, precision: str) -> OpTimes:
    """Forward, backward-input and backward-weight seconds of one operator."""
    peak = acc.peak(precision)
    if op.kind in (MATMUL, ATTENTION):
        # [issue 10] curves of this precision and pass where the profile has them (hardware.Accelerator)
        kind = "attention" if op.kind == ATTENTION else "matmul"
        fwd_c = _work_time(op.fwd_flops * op.fwd_exec_scale, peak, acc.compute_efficiency(kind, "fwd", precision))
        bin_c = _work_time(op.bwd_input_flops * op.bwd_exec_scale, peak,
                           acc.compute_efficiency(kind, "bwd" if op.kind == ATTENTION else "bwd_input", precision))
        bw_c = _work_time(op.bwd_weight_flops, peak, acc.compute_efficiency(kind, "bwd_weight", precision))
    else:
        fwd_c = bin_c = bw_c = 0.0
    mem = acc.memory_efficiency(MEMORY_KERNELS.get(op.name) if op.kind not in (MATMUL, ATTENTION) else None,
                                precision)
    fwd_m = _work_time(op.fwd_bytes, acc.hbm_bandwidth, mem)
    bwd_m = _work_time(op.bwd_bytes, acc.hbm_bandwidth, mem)
    has_w = np.asarray(op.bwd_weight_flops) > 0
    # The backward traffic is split between the input- and weight-gradient kernels.
    bin_m = np.where(has_w, bwd_m / 2, bwd_m)
    bw_m = np.where(has_w, bwd_m / 2, 0.0)
    # A framework's host cost per operator and pass (profile op_overhead_us; 0 on GPUs) adds
    # to the forward and to the backward pass, where it is booked with the input gradient.
    o = acc.op_overhead_s
    return OpTimes(np.maximum(fwd_c, fwd_m) + o, np.maximum(bin_c, bin_m) + o, np.maximum(bw_c, bw_m))


def memory_bound_time(nbytes, acc: Accelerator, kernel: str | None = None, precision: str | None = None):
    """Seconds for a bandwidth-bound kernel (of class `kernel`, e.g. "optimizer") moving `nbytes`."""
    return _work_time(nbytes, acc.hbm_bandwidth, acc.memory_efficiency(kernel, precision))
