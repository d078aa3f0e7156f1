"""Hybrid sharding (HSDP, plan.dp_replicate): ZeRO over one replica's ranks, replicas
all-reducing their gradient shards (simulator/dataparallel.py, dims.py)."""

import pytest

from simulator import evaluate
from simulator.comm import collective_time
from simulator.dims import groups
from simulator.layout import compile_layout

# Llama 3.1 8B on 8 DGX H100 (64 GPUs): tp 2 x dp 32, one pipeline stage
PLAN = dict(tp=2, pp=1, dp=32, micro_batch=1, global_batch=256, sequence_parallel=True, recompute="selective")


def _layout(scenario, **plan):
    s = scenario(model={"preset": "llama-3.1-8b"}, cluster={"node": "dgx-h100", "nodes": 8}, **{**PLAN, **plan})
    return s, compile_layout(s.model, s.cluster, s.plan)


@pytest.mark.parametrize("zero", [1, 2, 3])
def test_a_replica_of_a_quarter_of_the_ranks_holds_four_times_the_sharded_states(scenario, zero):
    _, whole = _layout(scenario, zero_stage=zero)
    _, hybrid = _layout(scenario, zero_stage=zero, dp_replicate=4)
    a, b = whole.stages[0].states, hybrid.stages[0].states
    assert float(b.optimizer_bytes) == pytest.approx(4 * float(a.optimizer_bytes))
    assert float(b.gradients_bytes) == pytest.approx((4 if zero >= 2 else 1) * float(a.gradients_bytes))
    assert float(b.weights_bytes) == pytest.approx((4 if zero >= 3 else 1) * float(a.weights_bytes))


def test_the_shard_group_is_a_replicas_consecutive_ranks_and_the_replicas_span_the_nodes(scenario):
    # tp 2 inside dp: a replica's 8 dp ranks are 16 consecutive GPUs, 4 per node over 2 nodes;
    # the 4 replicas sit 16 GPUs apart, one rank per node
    s, _ = _layout(scenario, zero_stage=3, dp_replicate=4)
    g = groups(s.plan, s.cluster)
    assert (g.grad.size, g.grad.local, g.grad.domains) == (8, 4, 2)
    assert (g.replicate.size, g.replicate.local, g.replicate.domains) == (4, 1, 4)


def test_zero_1_reduce_scatters_in_the_replica_then_all_reduces_the_shard_over_the_replicas(scenario):
    s, layout = _layout(scenario, zero_stage=1, dp_replicate=4)
    g, rep = groups(s.plan, s.cluster), layout.stages[0]
    grads = rep.params * layout.per_param.grad
    expected = (collective_time("reduce_scatter", grads, g.grad, s.cluster)
                + collective_time("all_reduce", grads / 8, g.replicate, s.cluster))
    assert float(rep.dp.step_reduce_s) == pytest.approx(float(expected))
    weights = rep.params * layout.per_param.weight
    assert float(rep.dp.step_gather_s) == pytest.approx(float(collective_time("all_gather", weights, g.grad, s.cluster)))


def test_fsdp_reduces_every_micro_batch_across_the_replicas_too(scenario):
    # a replica over 2 nodes: its reduce-scatters and the all-reduces share the NICs, in turn
    s, layout = _layout(scenario, zero_stage=3, dp_replicate=4)
    _, whole = _layout(scenario, zero_stage=3)
    g, rep = groups(s.plan, s.cluster), layout.stages[0]
    shard = rep.params * layout.per_param.grad / 8
    assert float(rep.dp.mb_reduce_s) > float(whole.stages[0].dp.mb_reduce_s)
    assert float(rep.dp.mb_reduce_s) == pytest.approx(float(
        collective_time("reduce_scatter", rep.params * layout.per_param.grad, g.grad, s.cluster)
        + collective_time("all_reduce", shard, g.replicate, s.cluster)))


def test_fsdp_all_reduces_across_nodes_beside_the_next_layers_reduce_scatter_inside_one(scenario):
    # tp 1, dp 64 as 8 replicas of a node's 8 GPUs: each of the 32 layers' reduce-scatter runs
    # on NVLink while the layer before all-reduces over the NICs; the longer of the two
    # collectives sets the pace, the shorter shows once, for one layer
    s, layout = _layout(scenario, tp=1, dp=64, sequence_parallel=False, zero_stage=3, dp_replicate=8)
    g, rep = groups(s.plan, s.cluster), layout.stages[0]
    assert (g.grad.domains, g.replicate.domains) == (1, 8)
    grads = rep.params * layout.per_param.grad
    rs = float(collective_time("reduce_scatter", grads, g.grad, s.cluster))
    ar = float(collective_time("all_reduce", grads / 8, g.replicate, s.cluster))
    assert float(rep.dp.mb_reduce_s) == pytest.approx(max(rs, ar) + min(rs, ar) / 32)


def test_one_replica_is_plain_zero(scenario):
    s1 = scenario(model={"preset": "llama-3.1-8b"}, cluster={"node": "dgx-h100", "nodes": 8}, zero_stage=3,
                  dp_replicate=1, **PLAN)
    s0 = scenario(model={"preset": "llama-3.1-8b"}, cluster={"node": "dgx-h100", "nodes": 8}, zero_stage=3, **PLAN)
    assert evaluate(s1, "graph").to_dict()["step_time_s"] == evaluate(s0, "graph").to_dict()["step_time_s"]


def test_the_engines_agree_on_a_hybrid_sharded_plan(scenario):
    s, _ = _layout(scenario, zero_stage=1, dp_replicate=4)
    a, g = evaluate(s, "analytic"), evaluate(s, "graph")
    assert a.step_time_s == pytest.approx(g.step_time_s, rel=0.03)
    assert a.peak_memory_bytes == pytest.approx(g.peak_memory_bytes, rel=1e-6)


def test_moe_replicas_split_the_expert_data_parallel_group_too(scenario):
    # Mixtral on 32 GPUs, tp 2 x dp 16, ep 4 (etp = tp): the expert-DP group of 2*16/(4*2) = 4
    # ranks splits like the dense one into 2 replicas of 2 (Megatron-Core's expert grid
    # tp, ep, inner_dp, outer_dp, pp); every ZeRO-1 shard, dense and routed, doubles
    plan = dict(tp=2, dp=16, ep=4, micro_batch=1, global_batch=64, sequence_parallel=True, zero_stage=1)
    kw = dict(model={"preset": "mixtral-8x7b"}, cluster={"node": "dgx-h100", "nodes": 4})
    whole, hybrid = scenario(**kw, **plan), scenario(**kw, **plan, dp_replicate=2)
    a = compile_layout(whole.model, whole.cluster, whole.plan).stages[0].states
    b = compile_layout(hybrid.model, hybrid.cluster, hybrid.plan).stages[0].states
    assert float(b.optimizer_bytes) == pytest.approx(2 * float(a.optimizer_bytes))
    g = groups(hybrid.plan, hybrid.cluster)
    assert (g.expert_grad.size, g.expert_replicate.size) == (2, 2)
    assert (g.expert_replicate.local, g.expert_replicate.domains) == (1, 2)  # 16 ranks apart: across nodes
