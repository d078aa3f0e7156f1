"""Invariants every prediction obeys, checked over 2,000 random valid plans per engine
(tests/plans.py draws them: every schedule, recompute mode, ZeRO stage, offload target,
TP/CP/PP shape, sequence length up to 32k), and over 500 plans of MoE models (ep, etp, the
MoE options, MLA) per test.

- MFU <= HFU <= 1: useful FLOPs never exceed executed ones, and no device runs faster than
  its peak.
- The step takes at least the hardware FLOPs spread evenly over every device at peak.
- A plan that fits reports a peak within the device's memory and host memory within the host.
- Every number is finite.
- The engines agree within 10 % on ZeRO-0/1 plans without offload, for every schedule and
  every number of micro-batches.
- The batched analytic path (sweeps, search) gives every plan of a batch evaluate()'s numbers.
- Selective recomputation (any of Megatron-Core's modules) never shortens the step nor
  keeps more activations than the same plan without recomputation.
- A lower hardware rate (sensitivity.FACTORS: GEMM, attention, HBM, links, host) never
  shortens the graph engine's step, nor lengthens it beyond in proportion (its kernels,
  transfers and launches are that rate's work over the rate, their exposure one side of a
  max). The analytic engine's closed forms may miss by a little (up to 0.65 % on 38 of
  1,000 random plans, docs/validation.md): with offloaded activations or parameters their
  exposure shrinks as a pass lengthens where a split-backward schedule's bubble absorbs the
  lengthening, and a split-backward schedule's ZeRO-2/3 reduce-scatter overlaps the
  weight-gradient passes alone.
- Doubling TP (halving DP, same micro-batches per replica) never raises a device's memory,
  except where physics says it may: TP-replicated weights (KV heads past kv_heads, MLA's
  down-projections) whose ZeRO-sharded states grow as DP shrinks, and an activation-offload
  backlog that grows as TP shortens the forward pass more than the host copy.
"""

import math

import pytest
from hypothesis import HealthCheck, assume, given, settings, strategies as st

from plans import FIXED_DRAWS, plan_dicts, scenario_of
from simulator import InputError, evaluate, scenario_from_dict
from simulator.sensitivity import STEP, sensitivities

RUNS = settings(max_examples=2000, deadline=None, derandomize=FIXED_DRAWS, database=None,
                suppress_health_check=list(HealthCheck))
MOE_RUNS = settings(RUNS, max_examples=500)  # MoE models (Mixtral, Qwen3-MoE, a DeepSeek-V3 with MLA)
AGREE = 0.10


def check_invariants(r):
    d = r.to_dict()
    numbers = [d["step_time_s"], d["mfu"], d["hfu"], d["peak_memory_gib"], *d["breakdown_s"].values(),
               *d["memory_gib"].values()] + ([d["cost_usd_per_step"]] if r.feasible else [])
    assert all(x is not None and math.isfinite(x) for x in numbers), d
    assert r.mfu <= r.hfu * (1 + 1e-12) and r.hfu <= 1 + 1e-9, (r.mfu, r.hfu)
    floor = r.hardware_flops_per_step / (r.devices * r.peak_flops_per_device)
    assert r.step_time_s >= floor * (1 - 1e-9)
    if r.feasible:
        assert r.peak_memory_bytes <= r.capacity_bytes


@given(plan_dicts())
@RUNS
def test_analytic_predictions_obey_the_invariants(data):
    check_invariants(evaluate(scenario_of(data), "analytic"))


@given(plan_dicts(moe=True))
@MOE_RUNS
def test_analytic_predictions_of_moe_plans_obey_the_invariants(data):
    check_invariants(evaluate(scenario_of(data), "analytic"))


@given(plan_dicts())
@RUNS
def test_graph_predictions_obey_the_invariants_and_agree_on_zero_0_1(data):
    check_graph(data)


@given(plan_dicts(moe=True))
@MOE_RUNS
def test_graph_predictions_of_moe_plans_obey_the_invariants_and_agree_on_zero_0_1(data):
    check_graph(data)


def check_graph(data):
    s = scenario_of(data)
    g = evaluate(s, "graph")
    check_invariants(g)
    p = s.plan
    if p.zero_stage <= 1 and p.offload == type(p.offload)():
        a = evaluate(s, "analytic")
        assert abs(a.step_time_s - g.step_time_s) <= AGREE * g.step_time_s, (a.step_time_s, g.step_time_s)


def check_rates_slow_the_step_in_proportion_at_most(data):
    scenario = scenario_of(data)
    base = evaluate(scenario)
    assume(base.feasible)
    t = base.step_time_s
    for s in sensitivities(scenario):  # each rate (1 - STEP) and (1 + STEP) times the profile's
        assert t * (1 - 1e-9) <= s.step_time_s_lower <= t / (1 - STEP) * (1 + 1e-9), (s.factor, s.step_time_s_lower)
        assert t / (1 + STEP) * (1 - 1e-9) <= s.step_time_s_higher <= t * (1 + 1e-9), (s.factor, s.step_time_s_higher)


@given(plan_dicts())
@settings(RUNS, max_examples=200)
def test_a_lower_hardware_rate_never_shortens_the_step_nor_lengthens_it_beyond_in_proportion(data):
    check_rates_slow_the_step_in_proportion_at_most(data)


@given(plan_dicts(moe=True))
@settings(MOE_RUNS, max_examples=100)
def test_a_lower_hardware_rate_never_shortens_a_moe_step_nor_lengthens_it_beyond_in_proportion(data):
    check_rates_slow_the_step_in_proportion_at_most(data)


# Unfused loss only: its logits shrink with TP and outweigh the ZeRO-sharded states of the
# TP-replicated parameters (learned position embeddings, norms), which grow as DP halves; a
# fused loss keeps no logits, and then memory may rise with TP by that share (a real effect).
@given(plan_dicts(zero_stages=(0, 1, 2, 3), losses=("unfused",)))
@RUNS
def test_memory_does_not_rise_with_tensor_parallelism(data):
    check_memory_with_tp(data)


@given(plan_dicts(zero_stages=(0, 1, 2, 3), moe=True))
@MOE_RUNS
def test_memory_of_moe_plans_does_not_rise_with_tensor_parallelism(data):
    check_memory_with_tp(data)


def check_memory_with_tp(data):
    s = scenario_of(data)
    plan = data["plan"]
    if plan["dp"] % 2 or 2 * s.plan.tp > s.model.kv_heads:
        # past kv_heads the KV projections are replicated over TP: their ZeRO-sharded states
        # grow as the data-parallel group that shards them shrinks
        return
    if s.model.attention == "mla" and plan["zero_stage"] >= 1:
        # MLA's latent down-projections are replicated over TP (mla.py) as well: the same
        return
    if plan["offload"]["activations"] != "none":
        # an offloading stage keeps the backlog its host link cannot drain during a forward
        # pass; TP shortens the pass more than the copy (the replicated non-SP activations
        # stay), so the resident backlog may grow
        return
    wider = {"tp": 2 * s.plan.tp, "dp": s.plan.dp // 2, "global_batch": s.plan.global_batch // 2}
    try:
        t2 = scenario_from_dict({**data, "plan": {**plan, **wider}})
    except InputError:
        return  # tp no longer divides the heads, or the sequence for sequence parallelism
    before, after = evaluate(s, "analytic"), evaluate(t2, "analytic")
    assert after.peak_memory_bytes <= before.peak_memory_bytes * (1 + 1e-9)


@given(plan_dicts(zero_stages=(0, 1), offloads=False, moe=True))
@MOE_RUNS
def test_recomputing_modules_of_moe_plans_costs_time_and_saves_activations(data):
    check_recompute_modules(data)


@given(plan_dicts(zero_stages=(0, 1), offloads=False))
@RUNS
def test_recomputing_modules_costs_time_and_saves_activations(data):
    check_recompute_modules(data)


def check_recompute_modules(data):
    """Against the same plan without recomputation, a selective one re-runs work (never a
    shorter step) and keeps less (never more activation bytes at the peak: what a module drops
    is rebuilt one layer's module at a time)."""
    if data["plan"]["recompute"] != "selective":
        return
    s = scenario_of(data)
    plain = scenario_from_dict({**data, "plan": {k: v for k, v in data["plan"].items() if k != "recompute_modules"}
                                | {"recompute": "none"}})
    for engine in ("analytic", "graph"):
        a, b = evaluate(s, engine), evaluate(plain, engine)
        assert a.step_time_s >= b.step_time_s * (1 - 1e-9), (a.step_time_s, b.step_time_s)
        for kept, everything in zip(a.memory_by_stage, b.memory_by_stage):
            assert kept["activations"] <= everything["activations"] * (1 + 1e-9), (kept, everything)


def test_a_non_physical_bandwidth_is_refused():
    with pytest.raises(InputError, match="nvme"):
        scenario_from_dict({"model": {"preset": "megatron-gpt-1.7b"},
                            "cluster": {"node": _node_with(nvme_read_gb_per_s=5e-324), "nodes": 1},
                            "plan": {"global_batch": 8}})


def _node_with(**fields) -> str:
    """A copy of the dgx-a100 node profile with `fields` changed, written to a temporary file."""
    import tempfile
    from pathlib import Path

    import yaml

    from simulator.hardware import profiles_dir

    data = yaml.safe_load((profiles_dir() / "nodes" / "dgx-a100.yaml").read_text())
    data.update(fields)
    folder = Path(tempfile.mkdtemp())
    path = folder / "dgx-a100.yaml"
    path.write_text(yaml.safe_dump(data))
    return str(path)


SIZES = ("tp", "pp", "cp", "micro_batch", "ep", "etp")


def _resized(base, other):
    """`base` with the sizes of `other` (a plan drawn for the same kind of model), its data
    parallelism filling the base's devices and its micro-batches per replica kept: a plan
    that shares every categorical field of `base`, so the two are one batch."""
    plan = {**base["plan"], **{k: other["plan"][k] for k in SIZES if k in other["plan"]}}
    if other["plan"]["schedule"] == plan["schedule"]:
        plan["vpp"] = other["plan"]["vpp"]
    devices = 8 * base["cluster"]["nodes"]
    shape = plan["tp"] * plan["pp"] * plan["cp"]
    if devices % shape:
        return None
    o = other["plan"]
    plan["dp"] = devices // shape
    plan["global_batch"] = plan["micro_batch"] * plan["dp"] * (o["global_batch"] // (o["micro_batch"] * o["dp"]))
    if plan.get("cp_attention") == "ulysses-ring":
        plan["cp_ulysses"] = plan["cp"]
    return {**base, "plan": plan}


@given(st.booleans().flatmap(lambda moe: st.tuples(plan_dicts(moe=moe), st.lists(plan_dicts(moe=moe), min_size=1,
                                                                                 max_size=6))))
@settings(RUNS, max_examples=300)
def test_vectorised_evaluation_equals_evaluate_plan_by_plan(drawn):
    """The batched analytic path (sweeps, search) gives each plan of a batch evaluate()'s
    numbers: a random plan and copies of it at other random sizes (tp, pp, cp, vpp, micro
    batch, ep, etp, data parallelism, micro-batches), evaluated as one batch of arrays."""
    from simulator.vector import evaluate_many
    base, others = drawn
    scenarios = []
    for data in [base] + [_resized(base, o) for o in others]:
        if data is None:
            continue
        try:
            scenarios.append(scenario_from_dict(data))
        except InputError:
            continue
    for s, got in zip(scenarios, evaluate_many(scenarios)):
        want = evaluate(s, "analytic").to_dict()
        for key in ("step_time_s", "peak_memory_gib", "mfu"):
            assert math.isclose(want[key], got[key], rel_tol=1e-9), (key, want[key], got[key], s.plan)
