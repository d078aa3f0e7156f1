"""Quantised linears against a published microbenchmark: TransformerEngine's B300 GEMM profile.

TransformerEngine's GEMM profiling tutorial times, on a B300, the twelve GEMM shapes of one
transformer layer's linears (data/microbenchmarks/te-gemm-profiling-b300.yaml, from
NVIDIA/TransformerEngine@d0067d0da docs/examples/gemm_profiling/gemm_profiling.rst) in BF16
and under four TransformerEngine recipes, each as one forward call of a te.Linear that
quantises its input and its weight and runs the GEMM (autocast), and as the GEMM alone on
operands quantised beforehand (pre-quantized). llmsim predicts each call with its own
operators: the linear's GEMM at the precision's rate (compute.py) and, in autocast, the cast
kernels of the input (fp8.py's per-micro-batch casts) and of the weight (its per-step cast,
which a call without TransformerEngine's weight cache repeats).

Two numbers of the B300 profile come from the table, and nothing else is fitted to it:
- `efficiency.matmul_fp4`: the rate at which llmsim prices the table's pre-quantized NVFP4
  GEMMs against its BF16 ones as measured (fp4_max); the B200's comes the same way from
  torchao's square NVFP4 GEMMs on a B200 (data/microbenchmarks/torchao-nvfp4-gemm-b200.yaml,
  pytorch/ao PR #2427).
- `efficiency.memory_kernels.nvfp4_cast`: the rate of TransformerEngine's NVFP4 casts (the
  Hadamard transform, stochastic rounding, 16 x 16 weight blocks) as a fraction of the HBM
  bandwidth, so that the predicted cast time of each pass equals autocast minus
  pre-quantized (fit_nvfp4_cast; leave-one-pass-out errors reported).
The FP8 recipes' casts and every GEMM rate are predicted, not fitted: `report` gives their
errors (the B300's GEMM efficiencies are transferred from the H100's fit). The tutorial's H200
NVL table of the same layer (te-gemm-profiling-h200nvl.yaml: BF16 and the per-tensor FP8
recipes) checks Hopper's FP8 casts the same way, with the H200 SXM profile: the card's HBM is
the SXM part's, its clocks and power are not.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ..compute import op_times
from ..fp8 import cast_kernel, fp8_layer_ops, recipe, weight_cast_bytes_per_step
from ..hardware import Accelerator, Efficiency
from ..plan import Plan
from ..resources import data_dir
from ..workload import MEMORY, Op, Shard, _linear
from ..yamlio import load_yaml

TABLE = "te-gemm-profiling-b300.yaml"
PASSES = ("fprop", "dgrad", "wgrad")
PLANS = {"bf16": Plan(precision="bf16"), "current": Plan(precision="fp8", fp8_recipe="current"),
         "delayed": Plan(precision="fp8", fp8_recipe="delayed"), "mxfp8": Plan(precision="mxfp8"),
         "nvfp4": Plan(precision="nvfp4")}
NVFP4_CAST = cast_kernel("nvfp4")


def load_table(name: str = TABLE) -> dict:
    return load_yaml(data_dir() / "microbenchmarks" / name)


def pass_shapes(table: dict) -> dict:
    """(M, K, N) of each pass's four GEMMs: the backward ones as the benchmark derives them
    from each forward (M, K, N): input gradient (M, N, K), weight gradient (K, M, N)."""
    fprop = [tuple(s) for s in table["fprop"].values()]
    return {"fprop": fprop, "dgrad": [(m, n, k) for m, k, n in fprop], "wgrad": [(k, m, n) for m, k, n in fprop]}


def call_seconds(acc: Accelerator, precision: str, m: int, k: int, n: int, casts: bool = True) -> tuple:
    """(GEMM seconds, cast seconds) of one benchmark call: a bias-free linear's forward on an
    M x K input, its input and weight quantised in the call (`casts`) or beforehand."""
    plan = PLANS[precision]
    ops = fp8_layer_ops([_linear("linear", m, k, n, 2, 2 * m * k)], Shard(micro_batch=1, seq_len=m), plan, acc=acc)
    gemm = sum(float(op_times(op, acc, "bf16").fwd_s) for op in ops if op.kind != MEMORY)
    if not casts or recipe(plan) is None:
        return gemm, 0.0
    weight_bytes = weight_cast_bytes_per_step(plan, k * n, acc)
    weight = Op(f"weight.{cast_kernel(recipe(plan))}", MEMORY, fwd_bytes=weight_bytes)
    cast = sum(float(op_times(op, acc, "bf16").fwd_s) for op in ops if op.kind == MEMORY)
    return gemm, cast + float(op_times(weight, acc, "bf16").fwd_s)


def predicted_ms(acc: Accelerator, table: dict, precision: str, casts: bool = True) -> list:
    """Milliseconds of each pass's four calls, in autocast (`casts`) or pre-quantized."""
    return [1e3 * sum(sum(call_seconds(acc, precision, *s, casts=casts)) for s in shapes)
            for shapes in pass_shapes(table).values()]


def _gemms_ms(acc: Accelerator, precision: str, shapes) -> float:
    return 1e3 * sum(call_seconds(acc, precision, *s, casts=False)[0] for s in shapes)


def fp4_max(acc: Accelerator, groups) -> float:
    """efficiency.matmul_fp4.max at which llmsim prices NVFP4 GEMMs against BF16 ones as a
    benchmark measured them: `groups` of (GEMM shapes, measured BF16 ms, measured NVFP4 ms),
    each group's GEMMs timed together. Both precisions are priced on their own curves (the
    profile's BF16 efficiency.matmul and its NVFP4 start-up, half_flops), so what carries over
    is NVFP4's speed relative to BF16 on the same GEMMs, not either's absolute rate. GEMM
    seconds scale as 1 / max: one evaluation at the profile's max solves it."""
    bf16 = sum(_gemms_ms(acc, "bf16", s) for s, _, _ in groups) / sum(b for _, b, _ in groups)
    fp4 = sum(_gemms_ms(acc, "nvfp4", s) for s, _, _ in groups) / sum(f for _, _, f in groups)
    return acc.matmul_fp4.max * fp4 / bf16


def te_groups(table: dict) -> list:
    """The B300 table's pre-quantized passes as fp4_max groups."""
    ms = table["prequantized_ms"]
    return [(shapes, ms["bf16"][i], ms["nvfp4"][i]) for i, shapes in enumerate(pass_shapes(table).values())]


# the sizes the B200's rate is derived from: the two largest, where both precisions run near
# their plateau and the start-up (half_flops, inferred) weighs least
TORCHAO_DERIVED = (6144, 8192)


def torchao_groups(sizes=TORCHAO_DERIVED) -> list:
    """torchao's B200 square GEMMs (data/microbenchmarks/torchao-nvfp4-gemm-b200.yaml) of
    `sizes` (None: every size) as fp4_max groups."""
    table = load_yaml(data_dir() / "microbenchmarks" / "torchao-nvfp4-gemm-b200.yaml")["time_s"]
    return [([(s, s, s)], 1e3 * table[s][0], 1e3 * table[s][1]) for s in (table if sizes is None else sizes)]


def fp4_over_bf16(acc: Accelerator, shapes) -> float:
    """llmsim's NVFP4 time over its BF16 time on `shapes`."""
    return _gemms_ms(acc, "nvfp4", shapes) / _gemms_ms(acc, "bf16", shapes)


def fp4_over_bf16_error(acc: Accelerator, group) -> float:
    """(predicted - measured) / measured of NVFP4's time over BF16's on one group."""
    shapes, bf16, fp4 = group
    return fp4_over_bf16(acc, shapes) / (fp4 / bf16) - 1


def _cast_ms(acc: Accelerator, table: dict, precision: str) -> list:
    """Predicted milliseconds of each pass's casts (the calls' cast kernels)."""
    return [1e3 * sum(call_seconds(acc, precision, *s)[1] for s in shapes) for shapes in pass_shapes(table).values()]


def measured_cast_ms(table: dict, precision: str) -> list:
    """Autocast minus pre-quantized: the time the call's quantisation took, per pass."""
    return [a - g for a, g in zip(table["autocast_ms"][precision], table["prequantized_ms"][precision])]


def with_nvfp4_cast(acc: Accelerator, fraction: float) -> Accelerator:
    """`acc` with its NVFP4 casts at `fraction` of the HBM bandwidth (the memory curve's start-up)."""
    curve = Efficiency(max=fraction, half=acc.memory.half)
    return replace(acc, memory_kernels={**acc.memory_kernels, NVFP4_CAST: curve})


@dataclass(frozen=True)
class CastFit:
    fraction: float  # of the HBM bandwidth, fitted on every pass
    memory_curve_error: tuple  # per pass, (predicted - measured) / measured at the generic memory curve
    held_out_error: tuple  # per pass, predicted by the fit to the other two


def _fraction(acc: Accelerator, table: dict, passes) -> float:
    """The fraction whose predicted cast time of `passes` equals the measured: cast seconds
    scale as 1 / fraction (the start-up is the memory curve's), so one evaluation at 1 solves it."""
    at_one = _cast_ms(with_nvfp4_cast(acc, 1.0), table, "nvfp4")
    measured = measured_cast_ms(table, "nvfp4")
    return sum(at_one[i] for i in passes) / sum(measured[i] for i in passes)


def fit_nvfp4_cast(acc: Accelerator, table: dict | None = None) -> CastFit:
    table = load_table() if table is None else table
    measured = measured_cast_ms(table, "nvfp4")
    base = replace(acc, memory_kernels={k: v for k, v in acc.memory_kernels.items() if k != NVFP4_CAST})
    roofline = _cast_ms(base, table, "nvfp4")
    held_out = []
    for i in range(len(PASSES)):
        fitted = with_nvfp4_cast(base, _fraction(base, table, [j for j in range(len(PASSES)) if j != i]))
        held_out.append(_cast_ms(fitted, table, "nvfp4")[i] / measured[i] - 1)
    return CastFit(_fraction(base, table, range(len(PASSES))),
                   tuple(r / m - 1 for r, m in zip(roofline, measured)), tuple(held_out))


def report(acc: Accelerator, table: dict | None = None) -> list[dict]:
    """Per precision: measured and predicted milliseconds per layer, autocast and
    pre-quantized, and for the recipes the cast time (autocast minus pre-quantized) where both
    are measured (BF16's two columns differ by 2.6 %, run to run: the table's noise)."""
    table = load_table() if table is None else table
    rows = []
    for precision in table["autocast_ms"]:
        if precision == "nvfp4" and acc.matmul_fp4 is None:
            continue
        row = {"precision": precision, "autocast_ms": sum(table["autocast_ms"][precision]),
               "autocast_predicted_ms": sum(predicted_ms(acc, table, precision))}
        if precision in table["prequantized_ms"]:
            row.update(prequantized_ms=sum(table["prequantized_ms"][precision]),
                       prequantized_predicted_ms=sum(predicted_ms(acc, table, precision, False)))
        if precision in table["prequantized_ms"] and recipe(PLANS[precision]) is not None:
            row.update(cast_ms=sum(measured_cast_ms(table, precision)),
                       cast_predicted_ms=sum(_cast_ms(acc, table, precision)))
        rows.append(row)
    return rows


# Each published table with the profile that predicts it (the H200 NVL card by the SXM part's)
TABLES = {"te-gemm-profiling-b300.yaml": "b300", "te-gemm-profiling-h200nvl.yaml": "h200-sxm-141gb"}


def kernel_report() -> dict:
    """Every GEMM benchmark here against llmsim's prediction (`llmsim validate --kernels`):
    TransformerEngine's layer profiles per precision (report), and torchao's B200 square GEMMs
    as NVFP4's time over BF16's per size (6144 and 8192 are what the B200's rate is derived
    from, the rest held out)."""
    from ..hardware import load_accelerator

    profiles = []
    for name, profile in TABLES.items():
        table = load_table(name)
        profiles += [{"table": name, "device": table["accelerator"], "profile": profile, **row}
                     for row in report(load_accelerator(profile), table)]
    b200 = load_accelerator("b200")
    squares = []
    for shapes, bf16, fp4 in torchao_groups(None):
        (size, _, _), = shapes
        predicted = fp4_over_bf16(b200, shapes)
        squares.append({"size": int(size), "derived_from": size in TORCHAO_DERIVED, "measured": fp4 / bf16,
                        "predicted": predicted, "error_pct": 100 * (predicted * bf16 / fp4 - 1)})
    return {"te_gemm_profiles": profiles, "torchao_nvfp4_b200": squares}
