"""domain.py: where a plan lies beyond the published runs behind its prediction interval."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from simulator import evaluate, scenario_from_dict
from simulator.domain import describe, domain_of, outside
from simulator.report import render_result

PUBLISHED = Path(__file__).resolve().parent.parent / "scenarios" / "published"
RUN = {"model": {"preset": "llama-3.1-8b"}, "cluster": {"node": "dgx-h100", "nodes": 1},
       "plan": {"tp": 1, "pp": 1, "dp": 8, "micro_batch": 1, "global_batch": 64, "precision": "bf16"}}


def _scenario(**plan):
    return scenario_from_dict({**RUN, "plan": {**RUN["plan"], **plan}})


def test_the_domain_of_runs_is_each_ranges_extremes_and_each_value_used():
    d = domain_of([_scenario(), _scenario(tp=2, dp=4, micro_batch=4, precision="fp8")])
    assert d["plan.tp"] == [1, 2] and d["plan.micro_batch"] == [1, 4] and d["devices"] == [8, 8]
    assert d["plan.precision"] == ["bf16/fp16", "fp8"]


def test_a_plan_inside_every_range_is_not_flagged():
    d = domain_of([_scenario(), _scenario(tp=4, dp=2, micro_batch=4)])
    assert outside(_scenario(tp=2, dp=4, micro_batch=2), d) == []


def test_a_plan_beyond_a_range_is_flagged_with_the_runs_range():
    d = domain_of([_scenario(), _scenario(tp=2, dp=4)])
    flags = outside(_scenario(tp=8, dp=1, zero_stage=1), d)
    assert flags == [{"field": "plan.tp", "value": 8, "checked": [1, 2]},
                     {"field": "plan.zero_stage", "value": 1, "checked": [0]}]
    assert describe(flags[0]) == "plan.tp 8 (runs: 1-2)"


def test_bf16_and_fp16_count_as_one_precision():
    assert outside(_scenario(precision="fp16"), domain_of([_scenario()])) == []


def test_a_cluster_larger_than_every_h100_run_is_flagged_against_the_h100_runs():
    """The H100 80 GB runs are NeMo's (nodes x devices_per_node) and the H100 MoE runs (gpus)
    of scenarios/published; the flag carries their largest cluster."""
    nemo = pd.read_csv(PUBLISHED / "nemo-dgxc-h100.csv")
    moe = pd.read_csv(PUBLISHED / "moe-runs.csv")
    largest = max((nemo.nodes * nemo.devices_per_node).max(), moe[moe.id.str.contains("h100")].gpus.max())
    scenario = scenario_from_dict({**RUN, "cluster": {"node": "dgx-h100", "nodes": 2048},
                                   "plan": {**RUN["plan"], "dp": 16384, "global_batch": 16384, "zero_stage": 1,
                                            "recompute": "full"}})
    result = evaluate(scenario, engine="analytic")
    devices = [f for f in result.to_dict()["outside_validation"] if f["field"] == "devices"]
    assert devices == [{"field": "devices", "value": 16384, "checked": [8, int(largest)]}]
    assert f"devices 16384 (runs: 8-{int(largest)})" in render_result(result.to_dict(), scenario)
