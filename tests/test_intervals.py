"""intervals.py: split-conformal prediction intervals from validation residuals."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from simulator import intervals
from simulator.hardware import load_accelerator
from simulator.resources import data_dir

ROOT = Path(__file__).resolve().parent.parent


def test_conformal_bounds_are_the_order_statistics_worked_by_hand():
    # n = 19, 80%: lo = floor(20 * 0.1) = 2, hi = ceil(20 * 0.9) = 18
    assert intervals.conformal_bounds(range(1, 20), 0.8) == (2, 18)
    # n = 9, 80%: lo = floor(10 * 0.1) = 1, hi = ceil(10 * 0.9) = 9
    assert intervals.conformal_bounds([5, 1, 9, 3, 7, 2, 8, 4, 6], 0.8) == (1, 9)


def test_too_few_rows_give_no_interval():
    assert intervals.conformal_bounds([0.1, -0.1, 0.0], 0.8) is None  # lo = floor(0.4) = 0


def test_interval_scales_the_prediction_and_inverts_for_throughput():
    class Acc:
        validation_residuals = tuple(math.log(x) for x in (0.9, 0.95, 1.0, 1.05, 1.1, 1.2, 0.8, 1.0, 1.0))
        validation_basis = "hand-made"
        validation = None  # the profile says nothing of runs

    f = intervals.interval_fields(2.0, 1000.0, Acc())
    assert f["step_time_s_interval"] == pytest.approx([1.6, 2.4])  # 2 s x (0.8, 1.2)
    assert f["tokens_per_s_interval"] == pytest.approx([1000 / 2.4, 1000 / 1.6])
    assert f["interval_basis"] == "hand-made" and f["interval_rows"] == 9


def _covers(residuals) -> float:
    return intervals.leave_one_out_coverage(residuals, intervals.COVERAGE)


def test_published_residuals_are_current():
    stored = json.loads(data_dir().joinpath(*intervals.PUBLISHED_RESIDUALS).read_text())
    fresh = intervals.published_residual_data()
    assert stored["runs"] == fresh["runs"]
    for engine in ("graph", "analytic"):
        assert stored["residuals"][engine] == pytest.approx(fresh["residuals"][engine], abs=1e-9), \
            "run `llmsim validate --published --write-residuals`"
        assert stored["by_accelerator"][engine].keys() == fresh["by_accelerator"][engine].keys()
        assert stored["transferred"][engine] == pytest.approx(fresh["transferred"][engine], abs=1e-9)
    assert stored["domain"] == fresh["domain"]


@pytest.mark.parametrize("engine", ["graph", "analytic"])
def test_published_interval_covers_held_out_runs(engine):
    """Leave-one-out: the interval from n-1 published runs covers the n-th in >= 80% of cases,
    over all of them and over each accelerator's own."""
    assert _covers(intervals.published_residuals(engine).values) >= 0.8
    by_accelerator = json.loads(data_dir().joinpath(*intervals.PUBLISHED_RESIDUALS).read_text())["by_accelerator"]
    for accelerator, residuals in by_accelerator[engine].items():
        if intervals.conformal_bounds(residuals) is not None:
            assert _covers(residuals) >= 0.8, accelerator


def test_an_accelerator_with_enough_published_runs_gets_its_own_interval():
    own = intervals.residuals_for(load_accelerator("h100-sxm-80gb"))
    assert "on h100-sxm-80gb" in own.basis
    assert len(own.values) < len(intervals.published_residuals("graph").values)


@pytest.mark.parametrize("name", ["mi300x", "b200", "h200-sxm-141gb"])
def test_a_transferred_profile_gets_the_interval_of_a_transfer(name):
    """Its efficiencies are another profile's fit carried over, so its prediction is as
    uncertain as such a carry-over is between the fitted profiles, not as a fit on its own runs."""
    res = intervals.residuals_for(load_accelerator(name))
    stored = json.loads(data_dir().joinpath(*intervals.PUBLISHED_RESIDUALS).read_text())
    assert "transferred" in res.basis and list(res.values) == stored["transferred"]["graph"]
    lo, hi = intervals.conformal_bounds(res.values)
    fit_lo, fit_hi = intervals.conformal_bounds(intervals.published_residuals("graph").values)
    assert lo < fit_lo and hi > fit_hi


@pytest.mark.parametrize("engine", ["graph", "analytic"])
def test_the_transfer_interval_covers_held_out_runs(engine):
    stored = json.loads(data_dir().joinpath(*intervals.PUBLISHED_RESIDUALS).read_text())
    assert _covers(stored["transferred"][engine]) >= 0.8


def test_calibrated_profiles_intervals_cover_held_out_torch_rows():
    folder = ROOT / "hardware_profiles" / "calibrated"
    checked = 0
    for node in folder.glob("*-node.yaml"):
        acc = load_accelerator(str(folder / (node.stem[: -len("-node")] + ".yaml")))
        if len(acc.validation_residuals) >= 9:
            assert _covers(acc.validation_residuals) >= 0.8, acc.name
            checked += 1
    assert checked >= 1, "a calibrated profile with recorded validation rows is committed"


def test_evaluate_reports_an_interval_of_the_gpu_prediction():
    import contextlib
    import io

    from simulator.cli import main

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert main(["evaluate", str(ROOT / "scenarios" / "quickstart.yaml"), "--json", "--engine", "analytic"]) == 0
    d = json.loads(buf.getvalue())
    lo, hi = d["step_time_s_interval"]
    assert lo < hi and d["interval_coverage"] == intervals.COVERAGE
    assert d["tokens_per_s_interval"][0] == pytest.approx(d["tokens_per_s"] * d["step_time_s"] / hi)


def test_sweep_tables_carry_the_same_interval_as_evaluate():
    from simulator.evaluate import evaluate
    from simulator.scenario import scenario_from_dict
    from simulator.sweep import evaluate_chunk

    base = {"model": {"preset": "llama-3.1-8b"}, "cluster": {"node": "dgx-h100", "nodes": 1},
            "plan": {"tp": 8, "micro_batch": 1, "global_batch": 8}}
    row = evaluate_chunk([(0, "p0", {})], base, {}).iloc[0]
    want = evaluate(scenario_from_dict(base), engine="analytic").to_dict()
    assert [row["step_time_s_interval.low"], row["step_time_s_interval.high"]] == \
        pytest.approx(want["step_time_s_interval"])
    assert row["tokens_per_s_interval.high"] == pytest.approx(want["tokens_per_s_interval"][1])
    assert row["interval_coverage"] == intervals.COVERAGE


def test_hardware_list_shows_each_profiles_interval():
    import contextlib
    import io

    from simulator.cli import main

    stored = json.loads(data_dir().joinpath(*intervals.PUBLISHED_RESIDUALS).read_text())["transferred"]["graph"]
    r, n = sorted(stored), len(stored)  # at 80 %: the floor((n+1)/10)-th and ceil(9(n+1)/10)-th
    want = f"{math.expm1(r[(n + 1) // 10 - 1]):+.0%} / {math.expm1(r[math.ceil(9 * (n + 1) / 10) - 1]):+.0%}"
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert main(["hardware", "list"]) == 0
    line = next(x for x in buf.getvalue().splitlines() if x.startswith("b200 "))
    assert want in line
