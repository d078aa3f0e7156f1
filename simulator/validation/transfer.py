"""How far a prediction on a profile whose efficiencies are transferred can miss.

Three profiles are fitted to measured runs: the A100 80 GB (Megatron-LM, `--fit-matmul
korthikanti22`), the H100 80 GB (NeMo BF16, `dgxc-:bf16`) and the 500 W H100 (torchtitan
BF16). The others take their compute efficiencies from those fits by two rules, which
tests/test_profile_transfers.py holds them to:

- a real-shape ratio: the profile's own best-shape GEMM rate (`efficiency.mamf`) times a
  fitted profile's achieved-over-best-shape ratio, with GEMM shapes folded in where the
  profile has no reduction-dimension measurement (B200, MI300X, MI250X, Gaudi 3, TPU v5p,
  V100);
- the same die: a fitted profile's efficiencies as they are (the H200 from the H100).

Applied between the fitted profiles, the same rules predict runs that were measured: the
A100's with the H100's ratio, the H100's with the A100's, the 500 W part's with the 700 W
part's efficiencies. Their residuals (intervals.published_residual_data) are how far a
transfer misses, the basis of the interval of a prediction on a transferred profile. The
A100's and H100's attention rates are each part's own microbenchmark and stay as they are,
so a profile whose attention rate is itself scaled from another's (B200, MI300X) carries an
error this check does not sample.
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
BASIS = ("the A100's runs with the H100's fitted real-shape ratio, the H100's with the A100's, "
         "the 500 W H100's with the 700 W part's efficiencies")


@lru_cache(maxsize=None)
def folded_ratio(source: str, fit: str) -> float:
    """The fitted profile's achieved-over-best-shape BF16 GEMM ratio, refitted to its runs
    without the reduction-dimension factor (the shapes folded into the one number)."""
    from .fit import fit_matmul_max

    return fit_matmul_max(fit, reduction_factor=False)[0] / load_accelerator(source).mamf["bf16"]


def _take(curve, other):
    """`curve` at `other`'s max (unchanged where either is absent)."""
    return curve if curve is None or other is None else replace(curve, max=other.max)


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
    return replace(acc, matmul=replace(acc.matmul, max=acc.mamf["bf16"] * ratio),
                   matmul_fp8=replace(acc.matmul_fp8, max=fp8 * ratio) if fp8 and acc.matmul_fp8 else acc.matmul_fp8,
                   matmul_k_half=0.0, matmul_fp8_k_half=0.0)


def with_transferred(scenario):
    """The scenario on its accelerator's transferred profile (for published_residual_data)."""
    from .report import with_accelerator

    acc = transferred(scenario.cluster.accelerator)
    return scenario if acc is None else with_accelerator(scenario, acc)
