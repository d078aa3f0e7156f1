"""DeepEP's dispatch under Megatron-Core's flex dispatcher (plan.moe.dispatcher: deepep), against
counts enumerated by brute force and times and bytes worked by hand from DeepEP's kernels."""

import itertools
from math import comb

import pytest

from simulator import deepep, scenario_from_dict
from simulator.errors import InputError
from simulator.evaluate import compile_scenario
from simulator.model import model_from_dict
from simulator.moe import ExpertShard, MoEOptions, dispatch_comm_s, dispatched_rows, moe_buffer_bytes, plan_experts
from simulator.workload import layer_ops

QWEN3 = {"preset": "qwen3-30b-a3b"}  # 128 experts, top-8, hidden 2048
DEEPEP = {"dispatcher": "deepep", "grouped_gemm": True}


def _scenario(model, nodes=1, node="dgx-h100", **plan):
    plan = {"tp": 1, "pp": 1, "micro_batch": 1, "global_batch": 8 * nodes * 8, "moe": DEEPEP, **plan}
    return scenario_from_dict({"model": model, "cluster": {"node": node, "nodes": nodes}, "plan": plan})


def _enumerated_hit(experts, top_k, groups, chosen, held):
    """P(a token's experts include one of experts 0..held-1): every choice of `chosen` groups,
    then every top_k subset of their experts, equally likely."""
    per_group = experts // groups
    hits = total = 0.0
    for picked in itertools.combinations(range(groups), chosen):
        pool = [e for g in picked for e in range(g * per_group, (g + 1) * per_group)]
        subsets = list(itertools.combinations(pool, top_k))
        hits += sum(any(e < held for e in s) for s in subsets) / len(subsets)
        total += 1
    return hits / total


def _toy_model(groups, chosen):
    return model_from_dict({"layers": 2, "hidden": 256, "heads": 4, "vocab": 1000, "seq_len": 128,
                            "activation": "swiglu", "experts": 16, "top_k": 3, "expert_ffn_hidden": 64,
                            "router_groups": groups, "router_group_topk": chosen})


@pytest.mark.parametrize("held", [1, 2, 4, 8])
@pytest.mark.parametrize("groups,chosen", [(0, 0), (4, 2), (8, 3)])
def test_a_units_share_of_the_tokens_is_what_enumerating_the_routings_gives(groups, chosen, held):
    """16 experts, top-3: without groups, from 2 of 4 groups of 4, and from 3 of 8 groups of 2;
    a unit of `held` consecutive experts inside a group or made of whole groups."""
    model = _toy_model(groups, chosen)
    expected = _enumerated_hit(16, 3, groups or 1, chosen or 1, held)
    assert float(deepep.hit_fraction(model, held)) == pytest.approx(expected, rel=1e-12)


def _miss(pool, held, k):
    """C(pool - held, k) / C(pool, k)."""
    return comb(pool - held, k) / comb(pool, k)


def test_in_one_node_each_token_goes_once_to_each_rank_holding_one_of_its_experts():
    """Qwen3-30B-A3B at EP 8 in a DGX H100: 16 experts a rank, so a token reaches
    8 x (1 - C(112, 8) / C(128, 8)) ranks, 7/8 of them other GPUs, each its 2 x 2048 bytes, once
    for the dispatch and once for the combine, at NVLink's bus rate."""
    s = _scenario(QWEN3, ep=8)
    layout = compile_scenario(s)
    up = s.cluster.node.scaleup
    ranks = 8 * (1 - _miss(128, 16, 8))
    assert ranks == pytest.approx(5.3394, abs=1e-4)  # where the all-to-all sends 8 rows
    one_way = 4096 * ranks * 7 / 8 * 2 * 2048 / (up.bytes_per_s * up.efficiency) + up.latency_s
    experts = ExpertShard(8, 1, MoEOptions(dispatcher="deepep"))
    got = dispatch_comm_s(s.model, layout.shard, experts, layout.groups, s.cluster)
    assert float(got) == pytest.approx(2 * one_way, rel=1e-12)


def test_across_nodes_a_token_crosses_the_network_once_per_destination_node():
    """EP 32 over 4 DGX H100s: a node holds 32 of the 128 experts. RDMA: 4 x (1 - C(96, 8) /
    C(128, 8)) destination nodes, 3/4 of them remote, on the GPU's own 400 Gb/s NIC; NVLink: the
    32 x (1 - C(124, 8) / C(128, 8)) destination ranks, 7/8 of them forwarded; the slower leg."""
    s = _scenario(QWEN3, nodes=4, ep=32)
    layout = compile_scenario(s)
    up, out = s.cluster.node.scaleup, s.cluster.scaleout
    row = 4096 * 2 * 2048
    rdma = row * 4 * (1 - _miss(128, 32, 8)) * 3 / 4 / (50e9 * out.efficiency) + out.latency_s
    nvl = row * 32 * (1 - _miss(128, 4, 8)) * 7 / 8 / (up.bytes_per_s * up.efficiency) + up.latency_s
    experts = ExpertShard(32, 1, MoEOptions(dispatcher="deepep"))
    got = dispatch_comm_s(s.model, layout.shard, experts, layout.groups, s.cluster)
    assert float(got) == pytest.approx(2 * max(rdma, nvl), rel=1e-12)
    alltoall = dispatch_comm_s(s.model, layout.shard, ExpertShard(32, 1), layout.groups, s.cluster)
    assert float(got) < float(alltoall)  # 8 x 24/32 rows a token leave the node in the all-to-all


def test_node_limited_routing_sends_a_token_to_at_most_its_group_topk_nodes():
    """DeepSeek-V3 (8 groups of 32 experts, top-4 groups) at EP 64 on 8 nodes: a node holds one
    group, reached when the group is chosen (1/2) and one of its 32 experts is among the token's
    8 drawn from the 4 groups' 128: 8 x 1/2 x (1 - C(96, 8) / C(128, 8)) nodes, under 4."""
    s = _scenario({"preset": "deepseek-v3", "seq_len": 4096, "layers": 8, "dense_layers": 1, "mtp_layers": 0},
                  nodes=8, ep=64, pipeline_split="balanced")
    experts = ExpertShard(64, 1, MoEOptions(dispatcher="deepep"))
    n, p, nodes, ranks, nodes_hit = deepep.layout(s.model, experts, compile_scenario(s).groups)
    assert (n, p, nodes) == (64, 8, 8)
    assert float(nodes_hit) == pytest.approx(8 * 0.5 * (1 - _miss(128, 32, 8)), rel=1e-12)
    assert float(nodes_hit) == pytest.approx(3.630, abs=1e-3)
    assert float(ranks) == pytest.approx(64 * 0.5 * (1 - _miss(128, 4, 8)), rel=1e-12)


def test_the_buffer_is_deepeps_size_hint_for_the_group():
    """DeepEP's NVL and RDMA buffers at 64 ranks, hidden 7168 in BF16, 20 SMs (10 channels):
    NVL 10 x 8 peers x (19 ints + 288 chunk rows x (14,336 + 8 + 128 x 12 + 128 x 4) B); RDMA
    10 x 8 nodes x (18 ints x 2 + 128 rows x 2 x (14,336 + 8 + 2,048 + 16) B)."""
    model = model_from_dict({"preset": "deepseek-v3"})
    experts = ExpertShard(64, 1, MoEOptions(dispatcher="deepep"))
    nvl = 10 * 8 * (19 * 4 + 288 * (14336 + 8 + 128 * 12 + 128 * 4))
    rdma = 10 * 8 * (18 * 2 * 4 + 128 * 2 * (14336 + 8 + 128 * 12 + 128 * 4 + 16))
    assert deepep.buffer_bytes(model, experts, 2) == nvl + rdma
    assert (nvl + rdma) / 2**20 == pytest.approx(680.66, abs=0.01)


def test_a_rank_holds_the_tokens_it_receives_and_their_rows_by_expert_beside_the_buffer():
    s = _scenario(QWEN3, ep=8)
    shard = compile_scenario(s).shard
    experts = ExpertShard(8, 1, MoEOptions(dispatcher="deepep"))
    received = 4096 * 8 * (1 - _miss(128, 16, 8))
    expected = 2 * 2048 * (received + 8 * 4096) + deepep.buffer_bytes(s.model, experts, 2)
    assert float(moe_buffer_bytes(s.model, shard, experts)) == pytest.approx(expected, rel=1e-12)


def test_router_padding_under_deepep_pads_each_local_expert_on_the_receiving_rank():
    """Megatron-Core's _DeepepManager pads each local expert's received rows to NVFP4's 128 with
    tokens it already holds: 16 local experts x 127 / 2 rows computed, none sent, none copied."""
    s = _scenario(QWEN3, ep=8)
    shard = compile_scenario(s).shard
    padded = ExpertShard(8, 1, MoEOptions(dispatcher="deepep", router_padding=True), 128)
    assert float(dispatched_rows(s.model, shard.replicated_tokens, padded)) == pytest.approx(8 * 4096)
    ops = {o.name: o for o in layer_ops(s.model, shard, padded)}
    run = 8 * 4096 + 16 * 127 / 2
    assert "moe_quant_pad" not in ops
    assert float(ops["expert_fc1"].fwd_flops) == pytest.approx(2 * run * 2048 * 2 * s.model.expert_ffn_hidden)


@pytest.mark.parametrize("nodes,node,plan,field", [
    (32, "dgx-h100", {"ep": 128, "etp": 2, "tp": 2, "sequence_parallel": True}, "plan.moe.dispatcher"),  # 256 ranks
    (4, "gb200-nvl72", {"ep": 8}, "plan.moe.dispatcher"),  # 4 GPUs a tray: no 8 NVLink peers in a node
    (1, "dgx-h100", {"ep": 8, "moe": {**DEEPEP, "capacity_factor": 1.0, "pad_to_capacity": True}},
     "plan.moe.pad_to_capacity"),
])
def test_a_plan_deepep_cannot_run_is_refused_naming_the_field(nodes, node, plan, field):
    with pytest.raises(InputError, match=field.replace(".", r"\.")):
        _scenario(QWEN3, nodes=nodes, node=node, **plan)


def test_router_groups_must_split_the_experts_and_hold_the_top_k():
    base = {"layers": 2, "hidden": 256, "heads": 4, "vocab": 1000, "seq_len": 128, "activation": "swiglu",
            "experts": 16, "top_k": 3, "expert_ffn_hidden": 64}
    for extra, field in (({"router_groups": 3, "router_group_topk": 1}, "model.router_groups"),
                         ({"router_groups": 4}, "model.router_group_topk"),
                         ({"router_groups": 8, "router_group_topk": 1}, "model.top_k")):
        with pytest.raises(InputError, match=field.replace(".", r"\.")):
            model_from_dict({**base, **extra})


HYBRID = {"dispatcher": "hybridep", "grouped_gemm": True}


def test_hybrid_ep_in_an_nvl72_rack_sends_every_destination_over_nvlink():
    """Hybrid-EP's node is the NVLink domain: Qwen3-30B-A3B at EP 64 on 16 GB200 trays of one
    NVL72 rack has no RDMA leg; a token reaches 64 x (1 - C(126, 8) / C(128, 8)) ranks, 63/64 of
    them other GPUs, at NVLink's bus rate each way."""
    s = _scenario(QWEN3, nodes=16, node="gb200-nvl72", ep=64, moe=HYBRID)
    layout = compile_scenario(s)
    up = s.cluster.node.scaleup
    ranks = 64 * (1 - _miss(128, 2, 8))
    one_way = 4096 * ranks * 63 / 64 * 2 * 2048 / (up.bytes_per_s * up.efficiency) + up.latency_s
    experts = ExpertShard(64, 1, MoEOptions(dispatcher="hybridep"))
    assert float(dispatch_comm_s(s.model, layout.shard, experts, layout.groups, s.cluster)) == pytest.approx(
        2 * one_way, rel=1e-12)
    # DeepEP's 8 NVLink peers must share a node: not on 4-GPU trays
    with pytest.raises(InputError, match="hybridep"):
        _scenario(QWEN3, nodes=16, node="gb200-nvl72", ep=64)


def test_hybrid_ep_buffers_hold_the_worst_case_of_every_token_routed_to_one_rank():
    """EP 32 over 4 DGX H100s, 4096 tokens a rank, 4 experts a rank, hidden 2048: intra-node
    4096 x 32 tokens x (2 x 2048 + 4 x 4 x 8 + 4 x 16) B; across the 3 remote nodes the
    dispatch's input 4096 x (4096 + 4 x 4 x 32 + 64) B, its 4096 x 3 rows with probabilities and
    scales, and the combine's two 4096 x 3 rows with probabilities."""
    s = _scenario(QWEN3, nodes=4, ep=32, moe=HYBRID)
    layout = compile_scenario(s)
    experts = ExpertShard(32, 1, MoEOptions(dispatcher="hybridep"))
    intra = 4096 * 32 * (4096 + 128 + 64)
    rdma = 4096 * (4096 + 512 + 64) + 4096 * 3 * (4096 + 128 + 64) + 2 * 4096 * 3 * (4096 + 128)
    rows = 2 * 2048 * 8 * 4096  # the permuted rows of the layer
    assert float(moe_buffer_bytes(s.model, layout.shard, experts, layout.groups)) == pytest.approx(
        rows + intra + rdma, rel=1e-12)


def test_hybrid_ep_writes_quantized_experts_rows_padded_with_no_copies():
    """Megatron-Core skips the experts' padding under Hybrid-EP (skip_routed_expert_padding): its
    dispatch pads each local expert's rows to FP8's 16, 16 x 15 / 2 rows a rank on average."""
    s = _scenario(QWEN3, ep=8, moe=HYBRID)
    shard = compile_scenario(s).shard
    ops = {o.name: o for o in layer_ops(s.model, shard, ExpertShard(8, 1, MoEOptions(dispatcher="hybridep"), 16))}
    assert "moe_quant_pad" not in ops
    run = 8 * 4096 + 16 * 15 / 2
    assert float(ops["expert_fc1"].fwd_flops) == pytest.approx(2 * run * 2048 * 2 * s.model.expert_ffn_hidden)


def test_a_batch_of_plans_gets_each_plans_own_deepep_buffer():
    """A search evaluates plans as arrays: each group size its own config row, none outside the table."""
    import numpy as np
    model = model_from_dict({"preset": "deepseek-v3"})
    sizes = np.array([8, 64, 12])
    batch = deepep.buffer_bytes(model, ExpertShard(sizes, 1, MoEOptions(dispatcher="deepep")), 2)
    single = [deepep.buffer_bytes(model, ExpertShard(int(n), 1, MoEOptions(dispatcher="deepep")), 2) for n in sizes[:2]]
    assert list(batch) == [*single, 0.0]


def test_a_search_fixing_the_deepep_dispatcher_ranks_only_plans_deepep_runs():
    """Two DGX H100s: ep 1 (TP x EP = 1) and groups DeepEP has no config for are refused per plan."""
    from simulator.search import SearchOptions, search
    result = search("qwen3-30b-a3b", {"node": "dgx-h100", "nodes": 2}, 64, engine="analytic", top=20,
                    options=SearchOptions(plan_options=(("moe", {"dispatcher": "deepep"}),)))
    table = result.table
    assert len(table) and set(table["ep"] * table["etp"]) <= set(deepep.GROUP_SIZES)


def test_kernels_taking_sms_slow_the_compute_they_hide_behind():
    """c seconds of DeepEP beside g seconds of the other pass's compute on 20 of an H100's 132
    SMs: the pair takes max(c, g + c x 20/132), so c x 20/132 stays exposed while the compute
    covers the rest, and c - g once it does not."""
    from types import SimpleNamespace
    from simulator.moe import exposed_dispatch_s
    s = _scenario(QWEN3, ep=8)
    layout = compile_scenario(s)
    experts = ExpertShard(8, 1, MoEOptions(dispatcher="deepep"))
    share = deepep.sm_share(experts, layout.groups, s.cluster.accelerator)
    assert share == pytest.approx(20 / 132)
    layer = SimpleNamespace(fwd_s=0.030, bwd_input_s=0.020, bwd_weight_s=0.020)
    overlap = MoEOptions(dispatcher="deepep", ep_comm_overlap=True)
    fwd, bwd = exposed_dispatch_s(0.010, layer, None, overlap, share)
    assert (float(fwd), float(bwd)) == pytest.approx((0.010 * 20 / 132, 0.010 * 20 / 132))
    fwd, bwd = exposed_dispatch_s(0.060, layer, None, overlap, share)
    assert (float(fwd), float(bwd)) == pytest.approx((0.060 - 0.040, 0.060 - 0.030))
    assert exposed_dispatch_s(0.010, layer, None, overlap)[0] == 0.0  # NCCL's all-to-all: no SMs counted


def test_hybrid_ep_takes_24_sms_in_one_nvlink_domain_and_8_across_unless_told():
    one = _scenario(QWEN3, ep=8, moe=HYBRID)
    across = _scenario(QWEN3, nodes=4, ep=32, moe=HYBRID)
    told = _scenario(QWEN3, nodes=4, ep=32, moe={**HYBRID, "dispatcher_sms": 16})
    shares = [deepep.sm_share(plan_experts(s.plan), compile_scenario(s).groups, s.cluster.accelerator)
              for s in (one, across, told)]
    assert [float(x) * 132 for x in shares] == pytest.approx([24, 8, 16])


@pytest.mark.parametrize("cluster,moe,field", [
    ("dgx-h100", {"dispatcher": "alltoall", "dispatcher_sms": 20}, "plan.moe.dispatcher_sms"),
    ("dgx-h100", {**DEEPEP, "dispatcher_sms": 21}, "plan.moe.dispatcher_sms"),  # a channel is 2 SMs
    ("dgx-h100", {**DEEPEP, "dispatcher_sms": 200}, "plan.moe.dispatcher_sms"),
    ("mi300x-node", DEEPEP, "plan.moe.dispatcher"),
])
def test_dispatcher_sms_and_accelerators_the_kernels_cannot_use_are_refused(cluster, moe, field):
    with pytest.raises(InputError, match=field.replace(".", r"\.")):
        _scenario(QWEN3, node=cluster, ep=8, moe=moe)


def test_the_dispatch_benchmark_is_predicted_from_the_link_and_the_expected_destinations():
    """Hybrid-EP's B200 row (4096 tokens a rank, hidden 7168, top-8 of 64 experts): a rank
    receives 4096 x 8 x (1 - C(56, 8) / C(64, 8)) tokens, 7/8 of them over NVLink5 at 900 GB/s x
    0.76 (the dgx-b200 profile) plus its 3 us; its kernel alone is measured at 734.95 GB/s."""
    from simulator.validation.ep_dispatch_bench import report
    row = next(r for r in report() if r["node"] == "dgx-b200" and r["backend"] == "hybridep"
               and r["call"] == "dispatch" and r["api"] == "kernel")
    received = 4096 * 8 * (1 - _miss(64, 8, 8)) * 7168 * 2
    seconds = received * 7 / 8 / (900e9 * 0.76) + 3e-6
    assert row["predicted_gb_per_s"] == pytest.approx(received / seconds / 1e9, rel=1e-12)
    assert row["measured_gb_per_s"] == 734.95
    assert row["error_pct"] == pytest.approx(100 * (734.95 / (received / seconds / 1e9) - 1))
