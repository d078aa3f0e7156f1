"""Operator time: a roofline over the profile's achievable compute and memory rates.

time = max(FLOPs / achievable FLOP/s, bytes / achievable bytes/s). The profile's
efficiency is a saturating curve eff(x) = max·x/(x + half) of the kernel's size x, so
x / (peak·eff(x)) = (x + half) / (peak·max): a kernel runs at `max` of peak after a fixed
start-up cost worth `half` units of work. That form has no 0/0 and vectorises.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from .attentiontiles import executed_fraction
from .bcast import as_float, maximum, where
from .hardware import Accelerator, Efficiency
from .workload import ATTENTION, MATMUL, Op, gemm_traffic

# Operator kinds of GEMMs in a low precision, with the peak_tflops key each runs at.
FP8_MATMUL, MXFP8_MATMUL, NVFP4_MATMUL = "matmul_fp8", "matmul_mxfp8", "matmul_nvfp4"
LOW_PRECISION_GEMMS = {FP8_MATMUL: "fp8", MXFP8_MATMUL: "mxfp8", NVFP4_MATMUL: "nvfp4"}
MX_SCALE = 1 / 32  # one E8M0 scale per 32 values (TE@d0067d0da recipe MXFP8BlockScaling)
# NVFP4: 4-bit E2M1 values, one E4M3 scale per 16 (TE@d0067d0da recipe NVFP4BlockScaling;
# the per-tensor FP32 scale is one number)
NV_SCALE = 1 / 16
FP4_BYTES = 0.5 + NV_SCALE
# Bytes per element of their operands (an FP8 or FP4 value and its block scale); the result is
# written in the activation precision.
OPERAND_BYTES = {FP8_MATMUL: 1.0, MXFP8_MATMUL: 1.0 + MX_SCALE, NVFP4_MATMUL: FP4_BYTES}


def as_gemm_kind(op: Op, kind: str, act_bytes) -> Op:
    """Linear `op` (its `op.linear` shape) run as GEMMs of operator kind `kind`: their
    forward, input-gradient and weight-gradient HBM bytes with FP8 operands where the kind is
    an FP8 GEMM, activation-precision ones otherwise."""
    s = op.linear
    fwd, bwd_input, bwd_weight = gemm_traffic(s.tokens, s.d_in, s.d_out, OPERAND_BYTES.get(kind, act_bytes),
                                              act_bytes, s.matrices)
    return replace(op, kind=kind, fwd_bytes=fwd, bwd_input_bytes=bwd_input, bwd_weight_bytes=bwd_weight)
# The attention kernel of `plan.attention_kernel: flash2` (FlashAttention-2, PyTorch's SDPA
# flash backend) where the profile's `efficiency.attention` is a faster kernel's (FA3, cuDNN).
FLASH2_ATTENTION = "attention_flash2"
ATTENTION_KERNELS = ("fused", "flash2")


def with_attention_kernel(ops: list[Op], kernel: str) -> list[Op]:
    """The operators with the attention kernel the plan names."""
    if kernel != "flash2":
        return ops
    return [replace(op, kind=FLASH2_ATTENTION) if op.kind == ATTENTION else op for op in ops]


def _work_time(work, rate: float, eff: Efficiency, kernels=1):
    """Seconds to do `work` (FLOPs or bytes) at `rate`·eff(work); zero work takes no time.
    Split into `kernels` equal kernels (an MoE layer's local experts), each runs at the
    efficiency of its own size: sum of (work/k + half) = work + k·half. A curve with a spill
    point runs the work beyond it at `spill_max` of the rate (a CPU core's data outgrowing
    its private cache, measured by `llmsim calibrate`)."""
    if eff.spill is None and isinstance(work, float) and isinstance(kernels, (int, float)):
        return (work + kernels * eff.half) / (rate * eff.max) if work > 0 else 0.0  # one plan: numpy's overhead dominates
    t = (work + kernels * eff.half) / (rate * eff.max)
    if eff.spill is not None:
        t = t + np.maximum(np.asarray(work) - eff.spill, 0.0) * (1.0 / eff.spill_max - 1.0 / eff.max) / rate
    return where(work > 0, t, 0.0)


# Kernel class of each memory-bound workload operator, for a profile's optional
# efficiency.memory_kernels curves (hardware.Accelerator.memory_efficiency).
MEMORY_KERNELS = {
    "attn_norm": "norm", "mlp_norm": "norm", "final_norm": "norm", "qk_norm": "norm",
    "attn_post_norm": "norm", "mlp_post_norm": "norm",
    "attn_residual": "residual", "mlp_residual": "residual", "branch_sum": "residual",
    "gelu": "gelu", "swiglu": "swiglu", "rope": "rope", "softmax": "softmax", "attn_dropout": "dropout",
    "embedding": "embedding", "cross_entropy": "cross_entropy", "fp8_cast": "fp8_cast",
    "fp8_cast_rowwise": "fp8_cast_rowwise", "nvfp4_cast": "nvfp4_cast",
    # GeGLU and the MoE layer's activations move the bytes of the dense kernel of their kind
    "geglu": "swiglu", "shared_swiglu": "swiglu", "shared_geglu": "swiglu", "shared_gelu": "gelu",
    "expert_swiglu": "swiglu", "expert_geglu": "swiglu", "expert_gelu": "gelu",
    "mla_q_norm": "norm", "mla_kv_norm": "norm",
}


@dataclass(frozen=True)
class OpTimes:
    """Seconds of an operator's forward, input-gradient and weight-gradient kernels."""

    fwd_s: object
    bwd_input_s: object
    bwd_weight_s: object


def op_times(op: Op, acc: Accelerator, precision: str) -> OpTimes:
    """Forward, backward-input and backward-weight seconds of one operator: each kernel the
    slower of its executed FLOPs and its HBM traffic at the profile's achievable rates (an
    operator run as separate GEMMs, `op.pieces`, the sum of theirs)."""
    if op.pieces:
        times = [op_times(p, acc, precision) for p in op.pieces]
        return OpTimes(sum(t.fwd_s for t in times), sum(t.bwd_input_s for t in times),
                       sum(t.bwd_weight_s for t in times))
    if op.kind in LOW_PRECISION_GEMMS:  # FP8 and NVFP4 linears (fp8.py): their peak at their measured efficiency
        peak = acc.peak(LOW_PRECISION_GEMMS[op.kind])
        # no reduction-dimension factor is measured for FP4 GEMMs
        eff, k_half = (acc.matmul_fp4, 0.0) if op.kind == NVFP4_MATMUL else (acc.matmul_fp8, acc.matmul_fp8_k_half)
        flops_s = _reduced(op, [_work_time(x, peak, eff) for x in (op.fwd_flops, op.bwd_input_flops,
                                                                   op.bwd_weight_flops)], k_half)
        mem = acc.memory
    elif op.kind == MATMUL:
        # the curve of this pass and precision where the profile has one (calibrated CPUs)
        peak = acc.peak(precision)
        flops_s = _reduced(op, [_work_time(x, peak, acc.compute_efficiency("matmul", pass_, precision), op.kernels)
                                for x, pass_ in zip((op.fwd_flops, op.bwd_input_flops, op.bwd_weight_flops),
                                                    ("fwd", "bwd_input", "bwd_weight"))], acc.matmul_k_half)
        mem = acc.memory_efficiency(None, precision)
    elif op.kind in (ATTENTION, FLASH2_ATTENTION):
        # FlashAttention-2's own curve where the profile's `attention` is a faster kernel's,
        # else the attention curve of this pass and precision
        flash2 = acc.attention_flash2 if op.kind == FLASH2_ATTENTION else None
        peak = acc.peak(precision)
        executed, slowdown = _attention_calls(op, acc)
        flops_s = [slowdown * _work_time(x * executed, peak,
                                         flash2 or acc.compute_efficiency("attention", pass_, precision), op.kernels)
                   for x, pass_ in zip((op.fwd_flops, op.bwd_input_flops, op.bwd_weight_flops), ("fwd", "bwd", "bwd"))]
        mem = acc.memory_efficiency(None, precision)
    else:
        flops_s = [0.0, 0.0, 0.0]
        mem = acc.memory_efficiency(MEMORY_KERNELS.get(op.name.rsplit(".", 1)[-1]), precision)
    bytes_s = [_work_time(x, acc.hbm_bytes_per_s, mem, op.launches)
               for x in (op.fwd_bytes, op.bwd_input_bytes, op.bwd_weight_bytes)]
    # A framework's host cost per operator and pass (profile op_overhead_us; 0 on GPUs) adds
    # to the forward and to the backward pass, where it is booked with the input gradient.
    # An operator with no work on a plan (a CP exchange's copies at cp = 1, in a batch with
    # larger cp) launches nothing.
    o = acc.op_overhead_s * op.launches
    if acc.op_overhead_s:
        work = op.flops + op.fwd_bytes + op.bwd_input_bytes + op.bwd_weight_bytes
        o = np.where(work > 0, o, 0.0) if np.ndim(work) else (o if work > 0 else 0.0)
    return OpTimes(maximum(flops_s[0], bytes_s[0]) + o, maximum(flops_s[1], bytes_s[1]) + o,
                   maximum(flops_s[2], bytes_s[2]))


def _reduced(op: Op, flops_s: list, k_half: float) -> list:
    """A linear's GEMM seconds of its three passes at the rate their reduction dimension K
    leaves: K / (K + k_half) of a wide GEMM's (forward: K = its input features; input
    gradient: its output features; weight gradient: its tokens, an expert's share in a grouped
    GEMM). Measured on an H200 (benchmarks/bench_narrow_gemm_cuda.py): at equal FLOPs, a GEMM
    over K = 512 ran at 0.80 of a wide one in bf16 and 0.65-0.68 in FP8, a fixed cost per output
    tile worth about two of its K tiles; a narrow output dimension cost nothing from 256 up."""
    s = op.linear
    if s is None or k_half <= 0:
        return flops_s
    dims = (s.d_in, s.d_out, s.tokens / s.matrices if s.grouped else s.tokens)
    return [t * (k + k_half) / k for t, k in zip(flops_s, map(as_float, dims))]


def _attention_calls(op: Op, acc: Accelerator):
    """A flash-attention kernel's executed FLOPs over its counted ones, and its time over that
    of its executed FLOPs on the profile's curve, as its calls run on this profile's kernel.

    Executed: its causal blocks (attentiontiles.py: PyTorch's CPU flash kernel computes whole
    key blocks up to each query block's last row) where the calls attend whole causal
    documents and the profile states the kernel's tiles; the causal half otherwise.

    Time: the keys each query of a call runs over (a CP ring's step holds one chunk of them)
    at K / (K + attention_keys_half) of the rate over long sequences: each query row costs a
    fixed amount besides its work over the keys (writing its output and log-sum-exp, the
    backward's row sum of dO·O), which `llmsim calibrate` measures (calibration.fit_keys_half)."""
    tiles, k_half = acc.attention_tiles, acc.attention_keys_half
    executed = 1.0
    if op.keys_per_query is None or (tiles is None and k_half <= 0):
        return executed, 1.0
    if tiles is not None and op.causal_lengths and np.any(op.whole_calls):
        executed = executed_fraction(op.causal_lengths, tiles)
        if np.ndim(op.whole_calls):
            executed = np.where(op.whole_calls, executed, 1.0)
    if k_half <= 0:
        return executed, 1.0
    k = executed * np.asarray(op.keys_per_query, dtype=float) / op.ring_steps
    return executed, (k + k_half) / k


def memory_bound_time(nbytes, acc: Accelerator, kernel: str | None = None, precision: str | None = None):
    """Seconds for a bandwidth-bound kernel (of class `kernel`, e.g. "optimizer") moving `nbytes`."""
    return _work_time(nbytes, acc.hbm_bytes_per_s, acc.memory_efficiency(kernel, precision))
