"""How far a prediction on a profile whose efficiencies are transferred can miss.

Three profiles are fitted to measured runs: the A100 80 GB (Megatron-LM, `--fit-matmul
korthikanti22`), the H100 80 GB (NeMo BF16, `dgxc-:bf16`) and the 500 W H100 (torchtitan
BF16). The others take their compute efficiencies from those fits by three rules, which
tests/test_profile_transfers.py holds them to:

- a real-shape ratio: the profile's own best-shape GEMM rate (`efficiency.mamf`) times a
  fitted profile's achieved-over-best-shape ratio, with GEMM shapes folded in where the
  profile has no reduction-dimension measurement (B200, MI300X, MI250X, Gaudi 3, TPU v5p,
  V100);
- the same die: a fitted profile's efficiencies as they are (the H200 from the H100, but for
  its SDPA FlashAttention-2 rate, measured on an H200);
- the attention kernel: another part's best FlashAttention rate times the ratio of the two
  parts' best-shape GEMM rates (B200, GB200, MI300X, Gaudi 3, TPU v5p from the H100's
  FlashAttention-3; MI250X from the A100's FlashAttention-2).

Applied between the fitted profiles, the same rules predict runs that were measured: the
A100's with the H100's ratio and its FlashAttention-3 rate scaled by the MAMF ratio (0.638
where the A100's own FlashAttention-2 microbenchmark gives 0.65), the H100's with the A100's
(its FlashAttention-2 rate scaled: 0.60 for FlashAttention-3's 0.59, and the SDPA kernel
in the same proportion), the 500 W part's with the 700 W part's efficiencies. Their residuals
(intervals.published_residual_data) are how far a transfer misses, the basis of the interval
of a prediction on a transferred profile.
"""

from __future__ import annotations

from dataclasses import replace
from functools import lru_cache

from ..hardware import Accelerator, load_accelerator

# fitted profile -> (the fitted profile it takes its efficiencies from, that one's fit, or
# None for the same-die rule)
CROSS = {
    "a100-sxm-80gb": ("h100-sxm-80gb", "dgxc-:bf16"),
    "h100-sxm-80gb": ("a100-sxm-80gb", "korthikanti22"),
    "h100-sxm-96gb-500w": ("h100-sxm-80gb", None),
}
BASIS = ("the A100's runs with the H100's fitted real-shape ratio and FlashAttention rate scaled by the "
         "best-shape GEMM ratio, the H100's with the A100's, the 500 W H100's with the 700 W part's efficiencies")


@lru_cache(maxsize=None)
def folded_ratio(source: str, fit: str) -> float:
    """The fitted profile's achieved-over-best-shape BF16 GEMM ratio, refitted to its runs
    without the reduction-dimension factor (the shapes folded into the one number)."""
    from .fit import fit_matmul_max

    return fit_matmul_max(fit, reduction_factor=False)[0] / load_accelerator(source).mamf["bf16"]


def _take(curve, other):
    """`curve` at `other`'s max (unchanged where either is absent)."""
    return curve if curve is None or other is None else replace(curve, max=other.max)


def _scaled(curve, factor: float):
    """`curve` with its max times `factor` (None stays None)."""
    return curve if curve is None else replace(curve, max=curve.max * factor)


def transferred(acc: Accelerator) -> Accelerator | None:
    """`acc` with the compute efficiencies its CROSS rule transfers to it; None for a profile
    without one."""
    if acc.name not in CROSS:
        return None
    source, fit = CROSS[acc.name]
    src = load_accelerator(source)
    if fit is None:
        return replace(acc, **{k: _take(getattr(acc, k), getattr(src, k))
                               for k in ("matmul", "matmul_fp8", "attention", "attention_flash2")})
    ratio = folded_ratio(source, fit)
    fp8 = acc.mamf.get("fp8")
    attention = src.attention.max * acc.mamf["bf16"] / src.mamf["bf16"]
    return replace(acc, matmul=replace(acc.matmul, max=acc.mamf["bf16"] * ratio),
                   matmul_fp8=replace(acc.matmul_fp8, max=fp8 * ratio) if fp8 and acc.matmul_fp8 else acc.matmul_fp8,
                   matmul_k_half=0.0, matmul_fp8_k_half=0.0,
                   attention=replace(acc.attention, max=attention),
                   attention_flash2=_scaled(acc.attention_flash2, attention / acc.attention.max))


def with_transferred(scenario):
    """The scenario on its accelerator's transferred profile (for published_residual_data)."""
    from .report import with_accelerator

    acc = transferred(scenario.cluster.accelerator)
    return scenario if acc is None else with_accelerator(scenario, acc)
