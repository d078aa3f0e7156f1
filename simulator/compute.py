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
    """Seconds to do `work` (FLOPs or bytes) at `rate`·eff(work); zero work takes no time."""
    return np.where(np.asarray(work) > 0, (work + eff.half) / (rate * eff.max), 0.0)


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
    eff = acc.attention if op.kind == ATTENTION else acc.matmul
    if op.kind in (MATMUL, ATTENTION):
        fwd_c = _work_time(op.fwd_flops * op.fwd_exec_scale, peak, eff)
        bin_c = _work_time(op.bwd_input_flops * op.bwd_exec_scale, peak, eff)
        bw_c = _work_time(op.bwd_weight_flops, peak, eff)
    else:
        fwd_c = bin_c = bw_c = 0.0
    mem = acc.memory_efficiency(MEMORY_KERNELS.get(op.name)) if op.kind not in (MATMUL, ATTENTION) else acc.memory
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


def memory_bound_time(nbytes, acc: Accelerator, kernel: str | None = None):
    """Seconds for a bandwidth-bound kernel (of class `kernel`, e.g. "optimizer") moving `nbytes`."""
    return _work_time(nbytes, acc.hbm_bandwidth, acc.memory_efficiency(kernel))
