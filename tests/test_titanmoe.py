"""torchtitan's MoE layer (plan.moe.framework: torchtitan): what it keeps, measured with torch
running torchtitan v0.2.2's own layer; what its op-level AC keeps and re-runs, worked by hand;
what it refuses."""

import pytest

from simulator import evaluate, scenario_from_dict
from simulator.errors import InputError
from simulator.fusion import eager_ops
from simulator.layermix import layer_operators
from simulator.plan import Plan
from simulator.model import model_from_dict
from simulator.moe import ExpertShard, MoEOptions
from simulator.recompute import layer_checkpoint
from simulator.titanmoe import mlp_ops
from simulator.workload import Shard, layer_ops

TITAN = MoEOptions(framework="torchtitan")


def _toy(shared: int, top_k: int):
    """The layer benchmarks/titan_moe_saved_bytes.py runs: h 64, 8 experts of width 32, T 32."""
    fields = dict(layers=2, hidden=64, heads=4, ffn_hidden=128, vocab=256, seq_len=16, activation="swiglu",
                  norm="rmsnorm", experts=8, top_k=top_k, expert_ffn_hidden=32)
    if shared:
        fields.update(shared_experts=shared, shared_expert_ffn_hidden=32)
    return model_from_dict(fields)


# Bytes autograd keeps (storages that are not parameters) running torchtitan v0.2.2's
# models/moe/moe.py MoE in BF16 on one process: benchmarks/titan_moe_saved_bytes.py with torch
# 2.13.0+cpu on an AMD EPYC (Zen 4). The differences left are per-token scalars (route_norm's
# denominator, which llmsim's model spec does not carry): below 0.3 %.
@pytest.mark.parametrize("shared, top_k, probs_on_input, measured", [
    (1, 2, False, 81568),  # DeepSeek-V3-like: sigmoid, route_norm, shared expert, scores after the experts
    (0, 2, False, 73376),  # Qwen3-like: softmax, route_norm, no shared expert
    (1, 1, True, 59680),   # Llama 4-like: top-1, scores before the experts
])
def test_eager_layer_keeps_what_torch_measures_running_torchtitans_moe(shared, top_k, probs_on_input, measured):
    model = _toy(shared, top_k)
    experts = ExpertShard(options=MoEOptions(framework="torchtitan", probs_on_input=probs_on_input))
    ops = eager_ops(mlp_ops(model, Shard(micro_batch=2, seq_len=16), experts, compiled=False), model,
                    Plan(compile=False))
    assert sum(op.saved_bytes for op in ops) == pytest.approx(measured, rel=3e-3)


def test_scores_after_the_experts_keep_an_fp32_copy_of_the_routed_rows():
    # DeepSeek-V3 671B at 4096 tokens: the bmm keeps k·T·h fp32, scaling before keeps it too
    # (the product's fp32 rows) and the sum after it nothing
    model = model_from_dict({"preset": "deepseek-v3", "mtp_layers": 0})
    shard = Shard(micro_batch=1, seq_len=4096)
    after = {op.name: op for op in mlp_ops(model, shard, ExpertShard(options=TITAN), compiled=True)}
    assert after["moe_weighted_sum"].saved_bytes == pytest.approx(4 * 8 * 4096 * (7168 + 1))
    before = {op.name: op for op in mlp_ops(model, shard, ExpertShard(options=MoEOptions(
        framework="torchtitan", probs_on_input=True)), compiled=True)}
    assert before["moe_scale_input"].saved_bytes == pytest.approx(4 * 8 * 4096 * (7168 + 1))
    assert before["moe_sum"].saved_bytes == 0


def test_compiling_fuses_only_the_router_and_the_shared_experts():
    # apply_compile compiles the router, reorderer and shared experts; MoE.forward's glue and
    # the experts stay eager
    model, shard = _toy(1, 2), Shard(micro_batch=2, seq_len=16)
    eager, fused = (layer_operators(model, shard, Plan(compile=c, eager_norm="fused", moe=TITAN),
                                    ExpertShard(options=TITAN, compiled=c)) for c in (False, True))
    changed = {a.name for a, b in zip(eager, fused) if a != b}
    assert changed == {"router_topk", "shared_swiglu"}  # the norms: torch's fused RMSNorm kernel either way


def _qwen3_like(shared=0):
    fields = {"name": "moe", "layers": 4, "hidden": 2048, "heads": 32, "kv_heads": 4, "head_dim": 128,
              "ffn_hidden": 6144, "vocab": 151936, "seq_len": 4096, "activation": "swiglu", "norm": "rmsnorm",
              "experts": 128, "top_k": 8, "expert_ffn_hidden": 768, "position_embedding": "rope", "bias": False,
              "tied_embeddings": False}
    if shared:
        fields.update(shared_experts=shared, shared_expert_ffn_hidden=768)
    return model_from_dict(fields)


def _op_sac(model, options, ep=8):
    shard = Shard(micro_batch=1, seq_len=4096)
    experts = ExpertShard(ep=ep, options=options)
    return layer_checkpoint(model, shard, "op-selective", layer_ops(model, shard, experts), experts=experts)


def test_op_sac_keeps_the_all_to_all_outputs_where_the_save_list_names_them():
    # T = 4096 tokens, k = 8: the dispatch's 8·T received rows and the combine's 8·T rows, h 2048
    keep = _op_sac(_qwen3_like(), TITAN)
    rerun = _op_sac(_qwen3_like(), MoEOptions(framework="torchtitan", op_sac_saves_all_to_all=False))
    assert keep.saved_bytes - rerun.saved_bytes == pytest.approx(2 * 2048 * (8 * 4096 + 8 * 4096))
    assert (keep.ep_rerun, rerun.ep_rerun) == (0.0, 1.0)  # Qwen3's save list: the all-to-alls run again


def test_op_sac_reruns_the_grouped_gemms_and_the_routers_gate():
    names = {op.name for op in _op_sac(_qwen3_like(), TITAN).rerun}
    assert {"router", "expert_fc1", "expert_fc2", "moe_weighted_sum"} <= names


def test_op_sac_counts_the_shared_experts_mms_after_the_attentions_four():
    # wq wk wv wo are mms 1-4; the gate's mm is not counted; shared w1 (5th) and w2 (7th) kept,
    # w3 (6th) re-run: a·T·768 + a·T·2048 more kept than without shared experts, and w3's GEMM
    without, with_ = _op_sac(_qwen3_like(0), TITAN), _op_sac(_qwen3_like(1), TITAN)
    assert with_.saved_bytes - without.saved_bytes == pytest.approx(2 * 4096 * (768 + 2048))
    w3 = [op for op in with_.rerun if op.name.startswith("shared_w3")]
    assert sum(op.fwd_flops for op in w3) == pytest.approx(2 * 4096 * 2048 * 768)
    assert not [op for op in with_.rerun if op.name.startswith(("shared_w1", "shared_w2"))]


def _scenario(**plan):
    base = {"tp": 1, "pp": 1, "ep": 8, "dp": 16, "micro_batch": 1, "global_batch": 16, "zero_stage": 3,
            "projections": "separate", "moe": {"framework": "torchtitan"}}
    return {"model": {"preset": "qwen3-30b-a3b", "seq_len": 4096}, "cluster": {"node": "dgx-h100", "nodes": 2},
            "plan": {**base, **plan}}


def test_an_eager_qwen3_with_op_level_ac_evaluates_on_both_engines():
    scenario = scenario_from_dict(_scenario(compile=False, recompute="op-selective"))
    analytic, graph = evaluate(scenario, engine="analytic"), evaluate(scenario, engine="graph")
    assert analytic.feasible and graph.feasible
    assert graph.step_time_s == pytest.approx(analytic.step_time_s, rel=0.05)


def test_op_level_ac_keeps_less_than_none_and_more_than_full():
    peak = {mode: evaluate(scenario_from_dict(_scenario(compile=False, recompute=mode)),
                           engine="analytic").memory_bytes["activations"] for mode in ("none", "op-selective", "full")}
    assert peak["full"] < peak["op-selective"] < peak["none"]


@pytest.mark.parametrize("field, value, plan", [
    ("plan.etp", 1, {"tp": 2, "ep": 1, "etp": 1, "sequence_parallel": True, "dp": 8}),  # no EP: split over TP
    ("plan.moe.dispatcher", "deepep", {"moe": {"framework": "torchtitan", "dispatcher": "deepep"}}),
    ("plan.moe.capacity_factor", 1.0, {"moe": {"framework": "torchtitan", "capacity_factor": 1.0}}),
    ("plan.precision", "fp8", {"precision": "fp8"}),
    ("plan.recompute", "selective", {"recompute": "selective"}),
    ("plan.moe.probs_in_experts", True, {"moe": {"framework": "torchtitan", "probs_in_experts": True}}),
])
def test_what_torchtitans_layer_does_not_run_is_refused_by_field(field, value, plan):
    with pytest.raises(InputError, match=field.replace(".", r"\.")):
        scenario_from_dict(_scenario(**plan))


def test_the_probabilities_scale_the_experts_activation_by_default_in_megatron_core_only():
    """Megatron-Core 0.13 on is the default; torchtitan weights the experts' outputs."""
    titan, mcore = (scenario_from_dict(_scenario(moe={"framework": f})).plan.moe.probs_in_experts
                    for f in ("torchtitan", "megatron-core"))
    assert (titan, mcore) == (False, True)


def test_scaling_before_the_experts_is_refused_for_megatron_cores_layer():
    with pytest.raises(InputError, match=r"plan\.moe\.probs_on_input"):
        scenario_from_dict(_scenario(moe={"probs_on_input": True}))


def test_megatron_cores_layer_still_refuses_eager_kernels():
    with pytest.raises(InputError, match=r"plan\.compile"):
        scenario_from_dict(_scenario(compile=False, moe={}))


# ---------------------------------------------------------------- DeepSeek-V3's latent attention beside it

def _deepseek_layer(compile_: bool, ep=8):
    model = model_from_dict({"preset": "deepseek-v3", "mtp_layers": 0, "seq_len": 4096})
    shard = Shard(micro_batch=1, seq_len=4096)
    experts = ExpertShard(ep=ep, options=TITAN, compiled=compile_)
    plan = Plan(compile=compile_, eager_norm="fused", projections="separate", moe=TITAN)
    return model, shard, experts, layer_operators(model, shard, plan, experts)


def test_op_sac_of_a_deepseek_v3_moe_layer_keeps_wq_a_wkv_a_wo_the_attention_shared_w3_and_all_to_alls():
    # mms in forward order: wq_a 1, wq_b 2, wkv_a 3, wkv_b 4, wo 5 (the gate's not counted),
    # shared w1 6, w3 7, w2 8: the odd ones kept; FlexAttention/SDPA's O (128 heads x 128) and
    # fp32 log-sum-exp; the all-to-all outputs: 8·T rows received, 8·T back (h 7168)
    model, shard, experts, ops = _deepseek_layer(compile_=False)
    T, a = 4096, 2
    expected = (a * T * (7168 + 1536 + 576 + 7168 + 128 * 128 + 2048) + 4 * 128 * T
                + a * 7168 * (8 * T + 8 * T))
    ck = layer_checkpoint(model, shard, "op-selective", ops, experts=experts)
    assert ck.saved_bytes == pytest.approx(expected)
    rerun = {op.name.split(".")[0] for op in ck.rerun}
    assert {"wq_b", "wkv_b", "shared_w1", "shared_w2", "expert_fc1", "expert_fc2", "mla_qk_cat"} <= rerun
    assert not rerun & {"wq_a", "wkv_a", "wo", "shared_w3", "mla_q_down", "mla_kv_down", "attn_out"}


def test_eager_latent_attention_copies_q_and_k_into_their_concatenations():
    # torch.cat of (q_nope, q_pe) and (k_nope, k_pe expanded): 128 heads x 192, read and written
    _, _, _, ops = _deepseek_layer(compile_=False)
    cat = {op.name: op for op in ops}["mla_qk_cat"]
    assert cat.fwd_bytes == pytest.approx(2 * 2 * 2 * 4096 * 128 * 192)
    _, _, _, compiled = _deepseek_layer(compile_=True)
    assert "mla_qk_cat" not in {op.name for op in compiled}


def test_without_expert_parallelism_there_is_no_all_to_all_to_keep():
    model, shard, experts, ops = _deepseek_layer(compile_=False, ep=1)
    _, _, experts8, ops8 = _deepseek_layer(compile_=False, ep=8)
    alone = layer_checkpoint(model, shard, "op-selective", ops, experts=experts).saved_bytes
    spread = layer_checkpoint(model, shard, "op-selective", ops8, experts=experts8).saved_bytes
    assert spread - alone == pytest.approx(2 * 7168 * 16 * 4096)


# ---------------------------------------------------------------- under TP (experts split over it, no EP)

def test_every_tp_rank_routes_and_weights_every_token_while_the_experts_split_their_width():
    # Llama 4 Scout (16 experts of width 8192, top-1, scores before the experts), 8192 tokens
    model = model_from_dict({"preset": "llama-4-scout", "seq_len": 8192})
    shard = Shard(micro_batch=1, seq_len=8192, tp=8, sp=True)
    options = MoEOptions(framework="torchtitan", probs_on_input=True)
    ops = {op.name: op for op in mlp_ops(model, shard, ExpertShard(ep=1, etp=8, options=options), compiled=False)}
    T, padded = 8192, 8192 + 8 * 16  # k·T rows and 8 more per local expert
    assert ops["router"].fwd_flops == pytest.approx(2 * T * 5120 * 16)  # the gate on all T tokens
    assert ops["moe_scale_input"].saved_bytes == pytest.approx(4 * T * 5120 + 4 * T)  # fp32 rows of all T
    assert ops["expert_swiglu"].saved_bytes == pytest.approx(3 * 2 * padded * 8192 / 8)  # 1/8 of the width


def test_the_moe_layers_tp_collectives_are_a_dense_mlps_gather_and_reduce_scatter():
    # Qwen3 has no shared experts: the pair is the layer's input gathered and output scattered
    from simulator.evaluate import compile_scenario
    from simulator.fp8 import compute_precision
    from simulator.layermix import compile_mix
    from simulator.passes import tp_layer_comm_s

    layout = compile_scenario(scenario_from_dict(_scenario(tp=8, ep=1, etp=8, sequence_parallel=True, dp=2)))
    mix = compile_mix(layout.model, layout.cluster, layout.plan, layout.shard, layout.groups, layout.per_param,
                      compute_precision(layout.plan))
    fwd, bwd = tp_layer_comm_s(layout.model, layout.shard, layout.groups, layout.cluster)
    assert mix.moe_tp_s[0] == pytest.approx(fwd) and mix.moe_tp_s[1] == pytest.approx(bwd)


@pytest.mark.parametrize("etp, rows, width", [(1, 8 * 4096 // 8, 768), (8, 8 * 4096, 768 // 8)])
def test_beside_ep_the_tp_ranks_split_either_the_routed_tokens_or_the_experts_width(etp, rows, width):
    # Qwen3-like (k 8, experts of width 768), 4096 tokens, TP 8, EP 8. ETP 1: each TP rank
    # reorders and dispatches the rows of 1/8 of the tokens (ReordererSequenceParallel); ETP 8:
    # every TP rank dispatches all k·T rows to experts split 8 ways by width. The experts' work
    # per rank is the same; the weighting reads every token's k rows either way.
    shard = Shard(micro_batch=1, seq_len=4096, tp=8, sp=True)
    experts = ExpertShard(ep=8, etp=etp, options=TITAN)
    ops = {op.name: op for op in mlp_ops(_qwen3_like(), shard, experts, compiled=True)}
    assert ops["expert_fc1"].fwd_flops == pytest.approx(2 * rows * 2048 * 2 * width)
    assert ops["moe_gather"].fwd_bytes == pytest.approx(2 * 2 * rows * 2048 + 16 * rows)
    assert ops["moe_weighted_sum"].saved_bytes == pytest.approx(4 * 8 * 4096 * (2048 + 1))
