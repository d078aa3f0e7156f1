"""validation/transfer.py: the fitted profiles predicted with what the transfer rules would
give them from one another, the basis of a transferred profile's interval."""

import pytest

from simulator.hardware import load_accelerator
from simulator.validation.fit import fit_matmul_max
from simulator.validation.transfer import transferred

# best shape over the dense peak (stas00/ml-engineering@744d01e MAMF table)
A100_MAMF, H100_MAMF, H100_FP8_MAMF = 271.2 / 312, 794.5 / 989, 1402.6 / 1979


def test_the_h100_takes_the_a100_real_shape_ratio_with_shapes_folded_in():
    a100_ratio = fit_matmul_max("korthikanti22", reduction_factor=False)[0] / A100_MAMF
    acc = transferred(load_accelerator("h100-sxm-80gb"))
    assert acc.matmul.max == pytest.approx(H100_MAMF * a100_ratio, abs=0.001)
    assert acc.matmul_fp8.max == pytest.approx(H100_FP8_MAMF * a100_ratio, abs=0.001)
    assert acc.matmul_k_half == 0 and acc.matmul_fp8_k_half == 0
    # its FlashAttention-3 rate from the A100's FlashAttention-2 by the best-shape ratio, the
    # SDPA kernel in the proportion the H100 profile puts it
    h100 = load_accelerator("h100-sxm-80gb")
    assert acc.attention.max == pytest.approx(load_accelerator("a100-sxm-80gb").attention.max * H100_MAMF / A100_MAMF,
                                              abs=5e-4)
    assert acc.attention_flash2.max / acc.attention.max == pytest.approx(h100.attention_flash2.max / h100.attention.max)


def test_the_a100_takes_the_h100_ratio_fitted_without_the_reduction_factor():
    h100_ratio = fit_matmul_max("dgxc-:bf16", reduction_factor=False)[0] / H100_MAMF
    acc = transferred(load_accelerator("a100-sxm-80gb"))
    assert acc.matmul.max == pytest.approx(A100_MAMF * h100_ratio, abs=0.001)
    # the H100's FlashAttention-3 rate by the best-shape ratio, as the B200's and MI300X's are
    assert acc.attention.max == pytest.approx(load_accelerator("h100-sxm-80gb").attention.max * A100_MAMF / H100_MAMF,
                                              abs=5e-4)


def test_the_500w_part_takes_the_700w_parts_efficiencies_as_the_h200_does():
    capped, full = transferred(load_accelerator("h100-sxm-96gb-500w")), load_accelerator("h100-sxm-80gb")
    for curve in ("matmul", "matmul_fp8", "attention", "attention_flash2"):
        assert getattr(capped, curve).max == getattr(full, curve).max
    assert capped.hbm_bytes_per_s == load_accelerator("h100-sxm-96gb-500w").hbm_bytes_per_s


def test_a_profile_without_a_rule_is_not_transferred():
    assert transferred(load_accelerator("b200")) is None


def test_validate_transferred_reports_the_residuals_the_intervals_use():
    import json
    import math
    import subprocess
    import sys

    from simulator import intervals
    from simulator.resources import data_dir

    proc = subprocess.run([sys.executable, "-m", "simulator.cli", "validate", "--published", "--transferred",
                           "--json", "--engine", "analytic"], capture_output=True, text=True, check=True)
    report = json.loads(proc.stdout)
    stored = json.loads(data_dir().joinpath(*intervals.PUBLISHED_RESIDUALS).read_text())["transferred"]["analytic"]
    # a speed error is e^r - 1 for r = ln(measured / predicted step time)
    assert report["transferred"] is True
    assert report["mape_pct"] == pytest.approx(100 * sum(abs(math.expm1(r)) for r in stored) / len(stored), abs=1e-6)
