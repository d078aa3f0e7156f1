"""FP8 linears against a published microbenchmark: torchao's rowwise speedup table.

torchao publishes, for an NVIDIA H100, the speedup of a LayerNorm -> Linear -> Sigmoid
forward and backward when the Linear runs in float8 with dynamic rowwise scaling (compiled)
over the same in bfloat16, for 216 GEMM shapes M x K x N
(data/microbenchmarks/torchao-fp8-rowwise-h100.yaml, from pytorch/ao@fdddb2cfa
docs/static/fp8-rowwise-perf.png). llmsim predicts the same three operators in both
precisions with the workload's own operators (fp8.py's FP8 GEMMs and cast kernels).

With the cast kernels at torchao's own roofline (the generic memory curve) llmsim predicts
these speedups 1.45x too high on average (log RMS 0.43), 2x where K or N is 1-2k: the rowwise
cast path (Inductor's row- and column-wise scale kernels, the transposes, the rescaling of
the gradient GEMMs) runs well below the bandwidth its bytes need. `fit_rowwise_cast` fits the
one curve that path runs at, efficiency.memory_kernels.fp8_cast_rowwise (max and half_bytes,
least squares on the log speedups), and reports it leave-one-M-out: the rows of each M
predicted from a fit to the other five.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from ..compute import op_times
from ..hardware import Accelerator, Efficiency
from ..plan import Plan
from ..resources import data_dir
from ..workload import Shard, _elementwise, _linear
from ..yamlio import load_yaml

TABLE = "torchao-fp8-rowwise-h100.yaml"
CAST_KERNEL = "fp8_cast_rowwise"
ACT_BYTES = 2  # bf16 activations


def load_table(name: str = TABLE) -> list[tuple[int, int, int, float]]:
    """(M, K, N, measured speedup) of every cell of a microbenchmark table."""
    data = load_yaml(data_dir() / "microbenchmarks" / name)
    ns = data["n"]
    return [(int(m), int(k), int(n), float(x)) for m, by_k in data["speedup"].items()
            for k, row in by_k.items() for n, x in zip(ns, row)]


def _pass_seconds(ops, acc: Accelerator) -> float:
    total = 0.0
    for op in ops:
        t = op_times(op, acc, "bf16")
        total += float(t.fwd_s + t.bwd_input_s + t.bwd_weight_s)
    return total


def linear_speedup(acc: Accelerator, m: int, k: int, n: int, recipe: str = "rowwise") -> float:
    """llmsim's speedup of the benchmark's LayerNorm -> Linear -> Sigmoid (forward and
    backward, compiled) with the Linear in FP8 over all of it in BF16."""
    from ..fp8 import fp8_layer_ops

    ops = [_elementwise("layernorm", m * k, 4 * ACT_BYTES, ACT_BYTES * m * k),
           _linear("linear", m, k, n, ACT_BYTES, ACT_BYTES * m * k),
           _elementwise("sigmoid", m * n, 2 * ACT_BYTES, ACT_BYTES * m * n)]
    fp8 = fp8_layer_ops(ops, Shard(micro_batch=1, seq_len=m), Plan(precision="fp8", fp8_recipe=recipe, compile=True))
    return _pass_seconds(ops, acc) / _pass_seconds(fp8, acc)


def log_errors(acc: Accelerator, cells) -> np.ndarray:
    """log(predicted / measured speedup) of each cell."""
    return np.array([math.log(linear_speedup(acc, m, k, n) / x) for m, k, n, x in cells])


def with_cast_curve(acc: Accelerator, curve: Efficiency) -> Accelerator:
    return replace(acc, memory_kernels={**acc.memory_kernels, CAST_KERNEL: curve})


@dataclass(frozen=True)
class CastFit:
    curve: Efficiency
    rms_log_error: float  # over every cell, fitted on all of them
    held_out: dict  # M -> rms log error of its cells, fitted on the other Ms
    roofline_rms_log_error: float  # the generic memory curve's


def _fit_curve(acc: Accelerator, cells) -> Efficiency:
    from scipy.optimize import least_squares

    def residuals(x):
        return log_errors(with_cast_curve(acc, Efficiency(max=x[0], half=10 ** x[1])), cells)

    res = least_squares(residuals, x0=[0.5, 6.0], bounds=([0.01, 3.0], [1.0, 9.0]))
    return Efficiency(max=float(res.x[0]), half=float(10 ** res.x[1]))


def fit_rowwise_cast(acc: Accelerator, cells=None) -> CastFit:
    """The rowwise cast curve that reproduces the table, with leave-one-M-out errors."""
    cells = load_table() if cells is None else cells
    base = replace(acc, memory_kernels={k: v for k, v in acc.memory_kernels.items() if k != CAST_KERNEL})
    curve = _fit_curve(base, cells)
    rms = float(np.sqrt(np.mean(log_errors(with_cast_curve(base, curve), cells) ** 2)))
    held_out = {}
    for m in sorted({c[0] for c in cells}):
        train = [c for c in cells if c[0] != m]
        test = [c for c in cells if c[0] == m]
        fitted = _fit_curve(base, train)
        held_out[m] = float(np.sqrt(np.mean(log_errors(with_cast_curve(base, fitted), test) ** 2)))
    roofline = float(np.sqrt(np.mean(log_errors(base, cells) ** 2)))
    return CastFit(curve, rms, held_out, roofline)
