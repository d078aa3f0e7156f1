"""Published Megatron-LM runs are reproduced within the stated error, with a profile whose
matmul efficiency is the stated fit (no per-row tuning)."""

import pytest

from simulator.hardware import load_accelerator
from simulator.published import fit_matmul_max, load_rows, validate_published


def test_every_published_row_is_reproduced_and_feasible():
    rows, _ = load_rows()
    comparisons, _ = validate_published()
    assert len(comparisons) == len(rows) == 18
    assert all(c.feasible for c in comparisons)  # these runs did fit in 80 GB


def test_published_mape_is_at_most_10_percent():
    _, mape = validate_published()
    assert mape <= 10.0


def test_holdout_rows_not_used_by_the_fit_are_within_10_percent():
    comparisons, _ = validate_published()
    holdout = [c for c in comparisons if c.id.startswith("narayanan21")]
    assert sum(abs(c.error) for c in holdout) / len(holdout) <= 0.10


def test_a100_profile_matmul_efficiency_is_the_stated_fit():
    fitted, _ = fit_matmul_max("korthikanti22")
    assert load_accelerator("a100-sxm-80gb").matmul.max == pytest.approx(fitted, abs=0.002)
