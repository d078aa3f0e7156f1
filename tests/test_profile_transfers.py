"""A number a profile transfers from another profile's fit follows that fit: when the A100
or H100 matmul fit or the DGX A100 launch overhead moves, every profile that states "MAMF x the
fitted real-shape ratio" or "the DGX A100 figure" must move with it, or the stated rule and the
number part.

The best-shape fractions of peak are the MAMF table's (stas00/ml-engineering@744d01e
compute/accelerator/README.md, "Maximum Achievable Matmul FLOPS comparison table", mean of
100 iterations, TFLOP/s over the dense peak); TPU v5p and V100 have no MAMF row and their
profiles take 0.80 by inference. The fits are the profiles' own stored values, which
tests/test_published.py holds to `llmsim validate --published --fit-matmul`, and for the B200,
which has no reduction-dimension measurement, the H100 fit made without that factor."""

import functools

import pytest

from simulator.hardware import load_accelerator, load_node
from simulator.validation.fit import fit_matmul_max

MAMF = {
    "a100": 271.2 / 312,
    "h100_bf16": 794.5 / 989,
    "h100_fp8": 1402.6 / 1979,
    "h200_fp8": 1453.4 / 1979,
    "b200_bf16": 1745 / 2250,
    "b200_fp8": 3432.5 / 4500,
    "b300_bf16": 1769.0 / 2250,
    "b300_fp8": 3353.3 / 4500,
    "gb200_bf16": 1822 / 2500,
    "gb200_fp8": 3615.6 / 5000,
    "mi300x": 668.4 / 1307.4,
    # no MI300X FP8 row: the BF16 figure x AMD's FP8 / BF16 Max-Achievable FLOPs ratio
    # (ROCm/rocm-blogs@8e01195 measuring-max-achievable-flops-part2, footnote 4), of the FP8 peak
    "mi300x_fp8": 668.4 * (1223.6 / 708) / 2614.9,
    "mi325x": 784.9 / 1307.4,
    "mi325x_fp8": 784.9 * (1527.7 / 840.8) / 2614.9,  # the same blog's MI325X footnote
    "mi355x": 1565.0 / 2516.6,
    # no MI355X FP8 row: the BF16 figure x hipBLASLt's FP8 / BF16 ratio on the MI355X at 16384^3
    # (HazyResearch/HipKittens@f09e9685 analysis/{fp8,bf16}_gemm/mi350x/mi355x_*_gemm.json)
    "mi355x_fp8": 1565.0 * (3293 / 1579) / 5033.2,
    "mi250x": 147.0 / 191.5,
    "gaudi3": 1243 / 1835,
    "gaudi3_fp8": 1289.5 / 1835,
    "inferred": 0.80,
}


def _max(profile: str, curve: str) -> float:
    return getattr(load_accelerator(profile), curve).max


def a100_ratio() -> float:
    """Real Megatron-LM shapes over the best shape on the A100 (the Korthikanti fit)."""
    return _max("a100-sxm-80gb", "matmul") / MAMF["a100"]


def h100_ratio() -> float:
    """Real NeMo shapes over the best shape on the H100 (the NeMo BF16 fit)."""
    return _max("h100-sxm-80gb", "matmul") / MAMF["h100_bf16"]


@functools.cache
def h100_ratio_without_reduction_factor() -> float:
    """The same with the Hopper reduction-dimension factor off, for a profile that has none."""
    return fit_matmul_max("dgxc-:bf16", reduction_factor=False)[0] / MAMF["h100_bf16"]


def power_cap() -> float:
    """The 500 W part's fitted matmul rate over the 700 W part's."""
    return _max("h100-sxm-96gb-500w", "matmul") / _max("h100-sxm-80gb", "matmul")


def gb300_best_shape(precision: str) -> float:
    """The GB300's best-shape fraction of peak, inferred: the B300's x the GB200's over the B200's."""
    return MAMF[f"b300_{precision}"] * MAMF[f"gb200_{precision}"] / MAMF[f"b200_{precision}"]


def _by_mamf(profile: str, bf16: str, fp8: str | None, ratio, attention=("h100-sxm-80gb", "h100_bf16")) -> dict:
    """The rules a profile built from its own best-shape rates states: each GEMM rate its MAMF
    row x a fitted real-shape ratio, its attention another part's FlashAttention rate x the
    two parts' best-shape ratio."""
    source, source_mamf = attention
    rules = {(profile, "matmul"): lambda: MAMF[bf16] * ratio(),
             (profile, "attention"): lambda: _max(source, "attention") * MAMF[bf16] / MAMF[source_mamf]}
    if fp8:
        rules[profile, "matmul_fp8"] = lambda: MAMF[fp8] * ratio()
    return rules


TRANSFERS = {
    ("a100-sxm-40gb", "matmul"): lambda: _max("a100-sxm-80gb", "matmul"),
    ("h100-sxm-80gb", "matmul_fp8"): lambda: MAMF["h100_fp8"] * h100_ratio(),
    ("h200-sxm-141gb", "matmul"): lambda: _max("h100-sxm-80gb", "matmul"),
    ("h200-sxm-141gb", "matmul_fp8"): lambda: MAMF["h200_fp8"] * h100_ratio(),
    ("h200-sxm-141gb", "attention"): lambda: _max("h100-sxm-80gb", "attention"),
    ("h100-sxm-96gb-500w", "matmul_fp8"): lambda: _max("h100-sxm-96gb-500w", "matmul") * MAMF["h100_fp8"]
    / MAMF["h100_bf16"],
    ("h100-sxm-96gb-500w", "attention"): lambda: _max("h100-sxm-80gb", "attention") * power_cap(),
    ("h100-sxm-96gb-500w", "attention_flash2"): lambda: _max("h100-sxm-80gb", "attention_flash2") * power_cap(),
    ("b200", "matmul"): lambda: MAMF["b200_bf16"] * h100_ratio_without_reduction_factor(),
    ("b200", "matmul_fp8"): lambda: MAMF["b200_fp8"] * h100_ratio_without_reduction_factor(),
    # Blackwell's attention: the B200's measured cuDNN rate, scaled by the best-shape ratio
    **_by_mamf("b300", "b300_bf16", "b300_fp8", h100_ratio_without_reduction_factor,
               attention=("b200", "b200_bf16")),
    ("b300", "memory"): lambda: _max("b200", "memory"),
    ("b300", "attention_flash2"): lambda: _max("b200", "attention_flash2"),
    **_by_mamf("gb200", "gb200_bf16", "gb200_fp8", h100_ratio_without_reduction_factor,
               attention=("b200", "b200_bf16")),
    ("gb200", "attention_flash2"): lambda: _max("b200", "attention_flash2"),
    # no GB300 MAMF row: the B300's, as much above it as the GB200's is above the B200's
    ("gb300", "matmul"): lambda: gb300_best_shape("bf16") * h100_ratio_without_reduction_factor(),
    ("gb300", "matmul_fp8"): lambda: gb300_best_shape("fp8") * h100_ratio_without_reduction_factor(),
    ("gb300", "attention"): lambda: _max("b200", "attention") * gb300_best_shape("bf16") / MAMF["b200_bf16"],
    ("gb300", "attention_flash2"): lambda: _max("b200", "attention_flash2"),
    ("gb300", "memory"): lambda: _max("b200", "memory"),
    # NVFP4: each part's BF16 rate x NVFP4's measured speed against BF16 on its sibling
    ("gb200", "matmul_fp4"): lambda: _max("gb200", "matmul") * _max("b200", "matmul_fp4") / _max("b200", "matmul"),
    ("gb300", "matmul_fp4"): lambda: _max("gb300", "matmul") * _max("b300", "matmul_fp4") / _max("b300", "matmul"),
    **_by_mamf("mi300x", "mi300x", "mi300x_fp8", a100_ratio),
    **_by_mamf("mi325x", "mi325x", "mi325x_fp8", a100_ratio),
    ("mi325x", "memory"): lambda: _max("mi300x", "memory"),
    ("mi355x", "matmul"): lambda: MAMF["mi355x"] * a100_ratio(),
    ("mi355x", "matmul_fp8"): lambda: MAMF["mi355x_fp8"] * a100_ratio(),
    ("mi355x", "memory"): lambda: _max("mi300x", "memory"),
    **_by_mamf("mi250x", "mi250x", None, a100_ratio, attention=("a100-sxm-80gb", "a100")),
    **_by_mamf("gaudi3", "gaudi3", "gaudi3_fp8", a100_ratio),
    **_by_mamf("tpu-v5p", "inferred", None, a100_ratio),
    ("v100-sxm-32gb", "matmul"): lambda: MAMF["inferred"] * a100_ratio(),
}


@pytest.mark.parametrize("profile,curve", sorted(TRANSFERS), ids=lambda v: str(v))
def test_a_transferred_efficiency_follows_the_fit_it_comes_from(profile, curve):
    # profiles store three decimals
    assert _max(profile, curve) == pytest.approx(TRANSFERS[profile, curve](), abs=0.0006)


@pytest.mark.parametrize("node", ["dgx-h100", "dgx-h200", "dgx-b200", "dgx-b300", "gb200-nvl72", "gb300-nvl72",
                                  "dgx-v100", "mi250x-node", "mi300x-node", "mi325x-node", "mi355x-node"])
def test_a_node_without_a_launch_bound_run_takes_the_dgx_a100_launch_overhead(node):
    assert load_node(node).launch_overhead_s == load_node("dgx-a100").launch_overhead_s


PROFILE_MAMF = {"a100-sxm-80gb": {"bf16": "a100"}, "h100-sxm-80gb": {"bf16": "h100_bf16", "fp8": "h100_fp8"},
                "h200-sxm-141gb": {"bf16": "h100_bf16", "fp8": "h200_fp8"},  # "H200 is the same" in BF16
                "b200": {"bf16": "b200_bf16", "fp8": "b200_fp8"}, "gb200": {"bf16": "gb200_bf16", "fp8": "gb200_fp8"},
                "b300": {"bf16": "b300_bf16", "fp8": "b300_fp8"},
                "mi300x": {"bf16": "mi300x", "fp8": "mi300x_fp8"}, "mi325x": {"bf16": "mi325x", "fp8": "mi325x_fp8"},
                "mi355x": {"bf16": "mi355x", "fp8": "mi355x_fp8"},
                "mi250x": {"bf16": "mi250x"}, "gaudi3": {"bf16": "gaudi3", "fp8": "gaudi3_fp8"}}


@pytest.mark.parametrize("profile", sorted(PROFILE_MAMF))
def test_a_profiles_best_shape_rate_is_the_mamf_tables(profile):
    got = load_accelerator(profile).mamf
    assert got.keys() == PROFILE_MAMF[profile].keys()
    for precision, row in PROFILE_MAMF[profile].items():
        assert got[precision] == pytest.approx(MAMF[row], abs=0.0006)


# AITER's flash attention (the fused kernel) and PyTorch's SDPA (AOTriton: flash2) on an MI355X,
# BF16, causal, 16 heads of 128, batch 16, 16, 15: forward and backward TFLOP/s at 4k, 8k and 16k
# tokens (HazyResearch/HipKittens@f09e9685 analysis/attn)
MI355X_ATTENTION = {"attention": ((1069, 1173, 1247), (877, 1034, 1109)),
                    "attention_flash2": ((422, 630, 762), (143, 224, 259))}


def _attention_rate(eff, peak_tflops: float, forward_flops: float) -> float:
    return peak_tflops * eff.max * forward_flops / (forward_flops + eff.half)


def _step_weighted(fwd: float, bwd: float) -> float:
    """Forward and backward TFLOP/s combined as a training step runs them (backward 2.5x the FLOPs)."""
    return 3.5 / (1 / fwd + 2.5 / bwd)


@pytest.mark.parametrize("curve", sorted(MI355X_ATTENTION))
def test_mi355x_attention_reproduces_the_measured_kernels(curve):
    profile = load_accelerator("mi355x")
    eff, peak = getattr(profile, curve), profile.peak_flops["bf16"] / 1e12
    for (tokens, batch), fwd, bwd in zip(((4096, 16), (8192, 16), (16384, 15)), *MI355X_ATTENTION[curve]):
        forward_flops = 4 * batch * tokens**2 * 16 * 128 / 2
        assert _attention_rate(eff, peak, forward_flops) == pytest.approx(_step_weighted(fwd, bwd), rel=0.02), tokens


# PyTorch's SDPA flash backend (FlashAttention-2) on an H200, bf16, batch 1, 32 heads of 128: the
# calls' forward FLOPs as llmsim counts them and their forward and backward milliseconds
# (docs/calibration/kernels-cuda-h200.txt, benchmarks/bench_kernels_cuda.py, torch 2.11.0+cu130)
H200_FLASH2 = [(4 * 8192**2 * 128 * 32 / 2, 1.80, 5.05), (4 * 32768**2 * 128 * 32 / 2, 25.69, 69.81),
               (4 * 32768 * 16384 * 128 * 32, 25.42, 71.27), (4 * 16384 * 32768 * 128 * 32, 25.30, 69.52),
               (4 * 32768**2 * 128 * 32, 50.97, 140.05)]


def test_h200_flash_attention_2_times_the_measured_calls():
    """Forward (F) and backward (2.5 F) on the profile's one curve against the measured pair."""
    profile = load_accelerator("h200-sxm-141gb")
    eff, peak = profile.attention_flash2, profile.peak_flops["bf16"]
    for flops, fwd_ms, bwd_ms in H200_FLASH2:
        predicted_ms = 1e3 * (flops + eff.half + 2.5 * flops + eff.half) / (peak * eff.max)
        assert predicted_ms == pytest.approx(fwd_ms + bwd_ms, rel=0.02), flops


# cuDNN 9.13.0 and FlashAttention-2 2.8.3 on a B200, BF16, non-causal, 16 heads of 128, batch x
# seqlen = 32k tokens: forward and backward TFLOP/s at 1k-32k (arXiv 2603.05451 Figs. 4 and 6)
B200_ATTENTION = {"attention": ((1157, 1328, 1413, 1460, 1488, 1517), (857, 1016, 1116, 1171, 1212, 1107)),
                  "attention_flash2": ((383, 406, 420, 427, 430, 432), (295, 333, 357, 374, 381, 386))}


@pytest.mark.parametrize("curve", sorted(B200_ATTENTION))
def test_b200_attention_reproduces_the_measured_kernels(curve):
    profile = load_accelerator("b200")
    eff, peak = getattr(profile, curve), profile.peak_flops["bf16"] / 1e12
    for k, (fwd, bwd) in enumerate(zip(*B200_ATTENTION[curve])):
        seqlen = 1024 * 2**k
        forward_flops = 4 * (32768 // seqlen) * seqlen**2 * 16 * 128
        assert _attention_rate(eff, peak, forward_flops) == pytest.approx(_step_weighted(fwd, bwd), rel=0.06), seqlen
