"""The Blackwell NVFP4 rates against published GEMM benchmarks: torchao's square GEMMs on a
B200 (data/microbenchmarks/torchao-nvfp4-gemm-b200.yaml) and TransformerEngine's layer profile
on a B300 (te-gemm-profiling-b300.yaml). The NVFP4 GEMM and cast rates are derived from them,
checked on what the derivation held out, and the FP8 recipes' cast kernels, fitted to nothing
there, are predicted close to what the B300 table measures."""

from dataclasses import replace

import pytest

from simulator.hardware import load_accelerator
from simulator.validation.te_gemm_bench import (call_seconds, fit_nvfp4_cast, fp4_max, fp4_over_bf16_error,
                                                load_table, predicted_ms, report, te_groups, torchao_groups)

B300 = load_accelerator("b300")


def _gemm_ms(acc, precision, m, k, n):
    return 1e3 * call_seconds(acc, precision, m, k, n, casts=False)[0]


def test_the_b200_prices_nvfp4_against_bf16_as_torchao_measured_them():
    # pytorch/ao PR #2427 on a B200: M = K = N = 6144 and 8192, BF16 319 and 774 us, NVFP4 84.4 and 205
    b200 = load_accelerator("b200")
    bf16 = _gemm_ms(b200, "bf16", 6144, 6144, 6144) + _gemm_ms(b200, "bf16", 8192, 8192, 8192)
    fp4 = _gemm_ms(b200, "nvfp4", 6144, 6144, 6144) + _gemm_ms(b200, "nvfp4", 8192, 8192, 8192)
    assert fp4 / bf16 == pytest.approx((0.0844 + 0.205) / (0.319 + 0.774), rel=2e-3)
    # held out: the sizes below, where the inferred start-up (half_flops) decides
    for size, measured in ((3072, 0.0165 / 0.0384), (4096, 0.0308 / 0.0974)):
        ratio = _gemm_ms(b200, "nvfp4", size, size, size) / _gemm_ms(b200, "bf16", size, size, size)
        assert ratio == pytest.approx(measured, rel=0.1)


def test_the_b300_prices_nvfp4_against_bf16_as_transformer_engine_measured_them():
    table = load_table()
    assert B300.matmul_fp4.max == pytest.approx(fp4_max(B300, te_groups(table)), abs=5e-4)
    assert load_accelerator("b200").matmul_fp4.max == pytest.approx(fp4_max(load_accelerator("b200"),
                                                                             torchao_groups()), abs=5e-4)
    # pre-quantized per layer: BF16 13.102 ms, NVFP4 3.764 ms
    assert sum(predicted_ms(B300, table, "nvfp4", False)) / sum(predicted_ms(B300, table, "bf16", False)) == \
        pytest.approx(3.764 / 13.102, rel=2e-3)


def test_the_b300_nvfp4_rate_holds_on_each_pass_it_was_not_derived_from():
    groups = te_groups(load_table())
    for i, held_out in enumerate(groups):
        fitted = fp4_max(B300, [g for j, g in enumerate(groups) if j != i])
        acc = replace(B300, matmul_fp4=replace(B300.matmul_fp4, max=fitted))
        assert abs(fp4_over_bf16_error(acc, held_out)) < 0.1


def test_the_b300_nvfp4_cast_rate_is_the_fit_and_holds_on_each_held_out_pass():
    fit = fit_nvfp4_cast(B300)
    assert B300.memory_kernels["nvfp4_cast"].max == pytest.approx(fit.fraction, abs=5e-4)
    assert all(abs(e) < 0.1 for e in fit.held_out_error)
    # at the generic memory curve the casts were predicted a third too fast
    assert all(-0.4 < e < -0.25 for e in fit.memory_curve_error)


def test_mxfp8_cast_kernels_fitted_to_nothing_here_predict_the_measured_cast_time():
    row = next(r for r in report(B300, load_table()) if r["precision"] == "mxfp8")
    # measured: autocast 8.984 minus pre-quantized 7.162 ms a layer
    assert row["cast_ms"] == pytest.approx(8.984 - 7.162, abs=2e-3)
    assert row["cast_predicted_ms"] == pytest.approx(8.984 - 7.162, rel=0.15)


def test_blackwell_per_tensor_fp8_casts_write_no_transpose():
    """On a B300 TE's current-scaling cast of an input reads it for its amax, reads it again and
    writes the FP8 data alone (2 + 2 + 1 B per element), where Hopper's also writes the
    transpose (6 B); the weight the same, every call of the benchmark."""
    m, k, n = 15872, 4096, 4096
    blackwell = call_seconds(B300, "current", m, k, n)[1]
    hopper = call_seconds(replace(B300, fp8_any_layout=False), "current", m, k, n)[1]
    rate = B300.hbm_bytes_per_s * B300.memory.max
    start = B300.memory.half / rate
    assert blackwell == pytest.approx(5 * (m * k + k * n) / rate + 2 * start, rel=1e-9)
    assert hopper == pytest.approx(6 * (m * k + k * n) / rate + 2 * start, rel=1e-9)
    assert load_accelerator("h100-sxm-80gb").fp8_any_layout is False


def test_hopper_fp8_current_scaling_casts_predict_the_h200_nvl_measurement():
    """TransformerEngine's H200 NVL profile of the same layer: autocast minus pre-quantized
    FP8 current scaling, 20.285 - 16.785 = 3.500 ms a layer. The casts are memory-bound and the
    NVL card has the SXM part's HBM3e (4.8 TB/s), whose profile predicts them; its GEMMs run at
    the card's own clocks, which no profile here describes."""
    table = load_table("te-gemm-profiling-h200nvl.yaml")
    row = next(r for r in report(load_accelerator("h200-sxm-141gb"), table) if r["precision"] == "current")
    assert row["cast_ms"] == pytest.approx(3.500, abs=2e-3)
    assert row["cast_predicted_ms"] == pytest.approx(3.500, rel=0.1)


def test_cli_validate_kernels_reports_every_benchmark_row():
    import json
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-m", "simulator.cli", "validate", "--kernels", "--json"],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert {(r["device"], r["precision"]) for r in out["te_gemm_profiles"]} == {
        ("b300", p) for p in ("bf16", "current", "delayed", "mxfp8", "nvfp4")} | {
        ("h200-nvl", p) for p in ("bf16", "current", "delayed")}
    b300_nvfp4 = next(r for r in out["te_gemm_profiles"] if r["precision"] == "nvfp4")
    assert b300_nvfp4["autocast_ms"] == pytest.approx(1.932 + 2.189 + 2.331)
    assert [r["size"] for r in out["torchao_nvfp4_b200"]] == [1024, 1536, 2048, 3072, 4096, 6144, 8192]
    assert {(r["node"], r["backend"]) for r in out["ep_dispatch"]} == {
        ("dgx-b200", "hybridep"), ("dgx-b200", "deepep"), ("gb200-nvl72", "hybridep")}
    bad = subprocess.run([sys.executable, "-m", "simulator.cli", "validate", "--kernels", "--published"],
                         capture_output=True, text=True)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1
