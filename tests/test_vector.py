"""The vectorised analytic path gives the same results as evaluate(), plan by plan."""

import json
import math
import random

import pytest

from simulator import InputError, evaluate, scenario_from_dict
from simulator.model import load_preset
from simulator.vector import evaluate_many, plan_batch

BASE = {"model": {"preset": "gpt3-175b"}, "cluster": {"node": "dgx-a100", "nodes": 16},
        "plan": {"global_batch": 256}, "training": {"tokens": 3.0e+11}}


def _sample_scenarios(count=160, seed=5):
    """Valid scenarios drawn from a grid that crosses every categorical plan field."""
    grid = dict(tp=[1, 2, 4, 8], pp=[1, 2, 4, 8], cp=[1, 2], micro_batch=[1, 2, 4], vpp=[1, 2, 3],
                schedule=["gpipe", "1f1b", "interleaved", "zb-h1"], recompute=["none", "selective", "full"],
                sequence_parallel=[False, True], zero_stage=[0, 1, 2, 3], flash_attention=[True, False],
                precision=["bf16", "fp32"], dp_overlap=[True, False], tp_comm_overlap=[False, True],
                rank_order=["tp-cp-dp-pp", "dp-tp-cp-pp"], pp_impl=["megatron", "torch"],
                offload=[{}, {"optimizer": "cpu"}, {"optimizer": "nvme", "params": "cpu"}, {"activations": "cpu"}])
    rng = random.Random(seed)
    out = []
    while len(out) < count:
        plan = {k: rng.choice(v) for k, v in grid.items()}
        plan.update(global_batch=256, dp="auto")
        data = {**BASE, "plan": plan}
        try:
            out.append(scenario_from_dict(data))
        except InputError:
            continue
    return out


def _close(a, b):
    if isinstance(a, dict):
        return all(_close(a[k], b[k]) for k in a)
    if isinstance(a, float) and isinstance(b, (int, float)):
        return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-300)
    return a == b


@pytest.fixture(scope="module")
def sample():
    scenarios = _sample_scenarios()
    return scenarios, evaluate_many(scenarios)


def test_vectorised_results_equal_scalar_evaluate(sample):
    scenarios, batched = sample
    for s, got in zip(scenarios, batched):
        want = evaluate(s, engine="analytic").to_dict()
        for key, value in want.items():
            if key == "memory_gib_by_stage":
                assert len(value) == len(got[key]) == s.plan.pp
                assert all(_close(a, b) for a, b in zip(value, got[key])), (key, s.plan)
                continue
            assert _close(value, got[key]), (key, s.plan, value, got[key])


def test_sample_covers_out_of_memory_and_feasible_plans(sample):
    feasible = {d["feasible"] for d in sample[1]}
    assert feasible == {True, False}


def test_vectorised_results_equal_scalar_evaluate_on_the_published_runs():
    from simulator.published import load_rows, row_scenario

    rows, supplement = load_rows()
    scenarios = []
    for row in rows:
        try:
            scenarios.append(scenario_from_dict(row_scenario(row, supplement)))
        except InputError:
            continue
    assert len(scenarios) >= 10
    for s, got in zip(scenarios, evaluate_many(scenarios)):
        want = evaluate(s, engine="analytic").to_dict()
        assert all(_close(v, got[k]) for k, v in want.items()), s.name


def test_vectorised_moe_plans_of_uneven_layer_kinds_equal_scalar_evaluate():
    """16 DeepSeek-V3 layers, 3 of them dense: at pp 2 and 4 the first stage holds the dense
    layers (the closed form, batched over pp); at pp 8 and under first/last counts the ranks
    hold different mixes (counted per rank, batched per pipeline size)."""
    base = {"model": {"preset": "deepseek-v3", "layers": 16, "mtp_layers": 0, "seq_len": 1024},
            "cluster": {"node": "dgx-h100", "nodes": 4}}
    plans = [{"pp": pp, "tp": tp, "ep": 2, "sequence_parallel": True, "micro_batch": 1, "global_batch": 64,
              "dp": "auto", **split}
             for pp in (2, 4, 8) for tp in (1, 2) for split in ({}, {"first_stage_layers": 1, "last_stage_layers": 3})
             if not (split and pp != 8)]
    scenarios = [scenario_from_dict({**base, "plan": p}) for p in plans]
    for s, got in zip(scenarios, evaluate_many(scenarios)):
        want = evaluate(s, engine="analytic").to_dict()
        assert all(_close(a, b) for a, b in zip(want["memory_gib_by_stage"], got["memory_gib_by_stage"]))
        assert _close(want["step_time_s"], got["step_time_s"]), s.plan


def test_vectorised_plans_whose_middle_ranks_differ_equal_scalar_evaluate():
    """A layout whose middle ranks hold 17, 15 and 16 layers: the executed pipeline order is
    timed plan by plan within the batch (it once failed to broadcast, crashing sweeps); ranks
    whose sliding windows differ."""
    model = {"layers": 126, "hidden": 1024, "heads": 8, "kv_heads": 8, "ffn_hidden": 4096, "vocab": 32000,
             "seq_len": 1024, "activation": "swiglu", "norm": "rmsnorm", "position_embedding": "rope", "bias": False}
    scenarios = [scenario_from_dict({"model": model, "cluster": {"node": "dgx-h100", "nodes": 1},
                                     "plan": {"tp": 1, "pp": 8, "dp": 1, "micro_batch": mb, "global_batch": gb,
                                              "pipeline_layout": [15, 17, 15, 16, 16, 16, 16, 15]}})
                 for gb in (16, 32, 40) for mb in (1, 2)]
    # windows on every other of 6 layers over 2 stages of 3: the ranks' bands differ
    scenarios += [scenario_from_dict({"model": {**model, "layers": 6, "sliding_window": 256, "sliding_window_freq": 2},
                                      "cluster": {"node": "dgx-h100", "nodes": 1},
                                      "plan": {"tp": 1, "pp": 2, "dp": 4, "micro_batch": 1, "global_batch": gb}})
                  for gb in (16, 32)]
    for s, got in zip(scenarios, evaluate_many(scenarios)):
        want = evaluate(s, engine="analytic").to_dict()
        assert all(_close(a, b) for a, b in zip(want["memory_gib_by_stage"], got["memory_gib_by_stage"]))
        assert _close(want["step_time_s"], got["step_time_s"]), s.plan


def test_vectorised_interleaved_plans_of_uneven_layer_kinds_equal_scalar_evaluate():
    """Interleaved pipelines whose ranks hold different mixes: windows on every other of 12
    layers and, with experts, 2 leading dense layers (the virtual stages are counted per batch
    of one vpp; this once crashed sweeps)."""
    model = {"layers": 12, "hidden": 1024, "heads": 8, "kv_heads": 8, "ffn_hidden": 4096, "vocab": 32000,
             "seq_len": 2048, "activation": "swiglu", "norm": "rmsnorm", "position_embedding": "rope", "bias": False,
             "sliding_window": 256, "sliding_window_freq": 2}
    moe = {**{k: v for k, v in model.items() if "window" not in k}, "experts": 8, "top_k": 2, "dense_layers": 2}
    scenarios = [scenario_from_dict({"model": m, "cluster": {"node": "dgx-h100", "nodes": 1},
                                     "plan": {"tp": 1, "pp": pp, "dp": 8 // pp, "ep": 2 if m is moe else 1,
                                              "schedule": "interleaved", "vpp": vpp, "micro_batch": 1,
                                              "global_batch": gb * (8 // pp)}})
                 for m in (model, moe) for pp, vpp in ((2, 2), (2, 3), (4, 3)) for gb in (4, 8)]
    for s, got in zip(scenarios, evaluate_many(scenarios)):
        want = evaluate(s, engine="analytic").to_dict()
        assert all(_close(a, b) for a, b in zip(want["memory_gib_by_stage"], got["memory_gib_by_stage"]))
        assert _close(want["step_time_s"], got["step_time_s"]), s.plan


def test_vectorised_balanced_plans_of_several_pipeline_sizes_equal_scalar_evaluate():
    """The balanced split of 32 layers over 2, 3, 4, 6 and 8 ranks (of 34 weighed layers, the
    middle ranks of pp 4, 6 and 8 hold different counts: 9 and 8, 6 and 5, 5 and 4) and of a
    Mixtral-like MoE model: one batch of plans counted rank by rank for every pipeline size."""
    dense = {"preset": "llama-3.1-8b", "seq_len": 1024}
    moe = {"preset": "mixtral-8x7b", "seq_len": 1024}
    scenarios = [scenario_from_dict({"model": m, "cluster": {"node": "dgx-h100", "nodes": 6},
                                     "plan": {"tp": tp, "pp": pp, "dp": "auto", "ep": 2 if m is moe else 1, "etp": 1,
                                              "sequence_parallel": True, "micro_batch": 1, "global_batch": 96,
                                              "pipeline_split": "balanced", **sched}})
                 for m in (dense, moe) for pp in (2, 3, 4, 6, 8) for tp in (1, 2)
                 for sched in ({}, {"schedule": "interleaved", "vpp": 2})]
    for s, got in zip(scenarios, evaluate_many(scenarios)):
        want = evaluate(s, engine="analytic").to_dict()
        assert all(_close(a, b) for a, b in zip(want["memory_gib_by_stage"], got["memory_gib_by_stage"]))
        assert _close(want["step_time_s"], got["step_time_s"]), s.plan
        assert _close(want["peak_memory_gib"], got["peak_memory_gib"]), s.plan
        alone = evaluate_many([s])[0]
        assert (alone["step_time_s"], alone["peak_memory_gib"]) == (got["step_time_s"], got["peak_memory_gib"])


@pytest.mark.parametrize("model", [
    {"preset": "gpt-oss-120b", "seq_len": 4096},  # windows on every other layer
    {"preset": "llama-4-scout", "seq_len": 32768},  # chunks on three layers of four, experts on every layer
    {"preset": "llama-3.1-8b", "seq_len": 16384, "sliding_window": 4096, "sliding_window_skip_freq": 6}])
def test_vectorised_windowed_plans_of_several_pipeline_sizes_equal_scalar_evaluate(model):
    """Pipelines of 2, 3, 4 and 6 ranks whose ranks hold different window counts, laid out as one
    batch (each rank's attention band an array over the plans), equal plan by plan and alone."""
    experts = load_preset(model["preset"]).experts
    scenarios = []
    for pp in (2, 3, 4, 6):
        for gb in (48, 96):
            plan = {"tp": 2, "pp": pp, "dp": 24 // pp, "micro_batch": 1, "global_batch": gb,
                    "sequence_parallel": True, "pipeline_split": "balanced", "zero_stage": 1, "recompute": "full"}
            if experts:
                plan.update(ep=4 if 24 // pp % 2 == 0 else 2, etp=1)
            try:
                scenarios.append(scenario_from_dict({"model": model, "cluster": {"node": "dgx-h100", "nodes": 6},
                                                     "plan": plan}))
            except InputError:
                continue
    assert len({s.plan.pp for s in scenarios}) >= 3
    for s, got in zip(scenarios, evaluate_many(scenarios)):
        want = evaluate(s, engine="analytic").to_dict()
        assert _close(want["step_time_s"], got["step_time_s"]), s.plan
        assert _close(want["peak_memory_gib"], got["peak_memory_gib"]), s.plan
        alone = evaluate_many([s])[0]
        assert (alone["step_time_s"], alone["peak_memory_gib"]) == (got["step_time_s"], got["peak_memory_gib"])


def test_scenarios_parsed_one_by_one_are_evaluated_as_one_batch(monkeypatch):
    """Equal clusters parsed apart (distinct objects, equal content) share a batch: 12 plans of
    one model and cluster that differ only in their sizes are one array evaluation."""
    import simulator.vector as vector
    batches = []
    monkeypatch.setattr(vector, "plan_batch", lambda plans: batches.append(len(plans)) or plan_batch(plans))
    scenarios = [scenario_from_dict({**BASE, "plan": {"tp": tp, "pp": pp, "dp": "auto", "global_batch": 256}})
                 for tp in (1, 2, 4) for pp in (1, 2, 4, 8)]
    evaluate_many(scenarios)
    assert batches == [12]


@pytest.mark.parametrize("node,model,method", [
    # windowed layers under TE's all-gather: the busiest rank's work, by cp
    ("dgx-h100", {"sliding_window": 2048, "sliding_window_freq": 2}, "kv-allgather"),
    ("dgx-h100", {"sliding_window": 2048, "sliding_window_skip_freq": 3}, "kv-allgather"),
    # a CPU kernel's causal blocks and keys per call: whole calls at cp 1, a ring's chunks beyond
    ("cpu-xeon-2c-node", {}, "ring"),
    ("cpu-xeon-2c-node", {}, "ulysses"),
    ("cpu-xeon-2c-node", {}, "kv-allgather"),
    ("dgx-h100", {}, "ulysses"),
])
def test_vectorised_context_parallel_attention_calls_equal_scalar_evaluate(node, model, method):
    base = {"model": {"layers": 4, "hidden": 512, "heads": 8, "ffn_hidden": 2048, "vocab": 8192, "seq_len": 8192,
                      **model},
            "cluster": {"node": node, "nodes": 4}}
    scenarios = [scenario_from_dict({**base, "plan": {"cp": cp, "cp_attention": method, "micro_batch": 1,
                                                      "global_batch": 64, "dp": "auto"}})
                 for cp in (1, 2, 4)]
    for s, got in zip(scenarios, evaluate_many(scenarios)):
        assert _close(evaluate(s, engine="analytic").to_dict()["step_time_s"], got["step_time_s"]), s.plan


def test_per_stage_memory_text_is_the_json_of_the_per_stage_mappings(sample):
    from simulator.vector import evaluate_columns

    scenarios, _ = sample
    mappings = evaluate_columns(scenarios, by_stage=True)
    texts = evaluate_columns(scenarios, by_stage="json")
    for (members, as_mappings), (same, as_text) in zip(mappings, texts):
        assert members == same
        assert as_text["memory_gib_by_stage"] == [json.dumps(v) for v in as_mappings["memory_gib_by_stage"]]


def test_per_stage_memory_text_writes_signed_zeros_and_non_finite_numbers_as_json_does(monkeypatch):
    """The text is written once per distinct number: -0.0 and 0.0 (equal as numbers) stay apart."""
    from types import SimpleNamespace

    import numpy as np

    from simulator import analytic, vector
    from simulator.memory import MEMORY_KEYS

    numbers = [0.0, -0.0, float("nan"), float("inf"), -float("inf"), 1e-300, 2.5, 1 / 3]
    p = np.array([1, 3, 2])
    grid = {k: np.array([[numbers[(5 * i + 3 * stage + plan) % 8] for plan in range(3)] for stage in range(3)])
            for i, k in enumerate(MEMORY_KEYS)}
    monkeypatch.setattr(analytic, "stage_memory_grid",
                        lambda layout, n: (grid, np.arange(3)[:, None] < p))
    texts = vector.memory_by_stage_batch(SimpleNamespace(p=p), 3, text=True)
    mappings = vector.memory_by_stage_batch(SimpleNamespace(p=p), 3)
    assert texts == [json.dumps(m) for m in mappings]
    text = " ".join(texts)
    assert all(f" {x}," in text or f" {x}}}" in text for x in ("0.0", "-0.0", "NaN", "Infinity", "-Infinity"))
