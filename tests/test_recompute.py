"""Activation checkpointing as the frameworks run it: saved bytes and re-run FLOPs of Megatron's
selective, full (uniform, block) and torchtitan's op-level selective modes, worked by hand."""

import pytest

from simulator import evaluate, scenario_from_dict
from simulator.evaluate import compile_scenario
from simulator.model import ModelSpec
from simulator.plan import Plan
from simulator.recompute import chunk_checkpoint, layer_checkpoint, rerun_flops
from simulator.workload import Shard, layer_ops

T, H, Q, KV, F = 2 * 8192, 4096, 4096, 1024, 14336  # Llama 3.1 8B, micro-batch 2


def llama(activation="swiglu"):
    return ModelSpec(name="llama", layers=32, hidden=H, heads=32, kv_heads=8, ffn_hidden=F, vocab=128256,
                     seq_len=8192, activation=activation, norm="rmsnorm", position_embedding="rope", bias=False,
                     tied_embeddings=False)


def shard(**kw):
    return Shard(micro_batch=2, seq_len=8192, **kw)


def checkpoint(mode, model=None, **kw):
    model = model or llama()
    s = shard(**kw)
    return layer_checkpoint(model, s, mode, layer_ops(model, s))


def _early(model=None, **kw):
    model = model or llama()
    s = shard(**kw)
    return layer_checkpoint(model, s, "full", layer_ops(model, s), early_stop=True), layer_ops(model, s)


def test_a_non_reentrant_checkpoint_does_not_rerun_the_mlp_down_projection_or_what_follows():
    """torch.utils.checkpoint(use_reentrant=False) stops once the last saved tensor, the down
    projection's input, is packed (before its GEMM runs): the forward re-runs all but
    2·T·F·H FLOPs of w2, and the residual add after it; the layer keeps its input alone."""
    ck, ops = _early()
    full = layer_checkpoint(llama(), shard(), "full", ops)
    assert [op.name for op in ops if op not in ck.rerun] == ["mlp_down", "mlp_residual"]
    assert rerun_flops(full) - rerun_flops(ck) == pytest.approx(2 * T * F * H)
    assert (ck.saved_bytes, ck.rebuilt_bytes) == (full.saved_bytes, full.rebuilt_bytes)


@pytest.mark.parametrize("sp,rerun", [(True, 0.75), (False, 0.5)])
def test_a_non_reentrant_checkpoint_skips_the_mlps_output_collective(sp, rerun):
    """Of the layer's forward TP collectives, half the MLP's: the reduce-scatter after w2 with
    sequence parallelism (all-gather, reduce-scatter a block), its all-reduce without."""
    ck, _ = _early(tp=8, sp=sp)
    assert ck.tp_rerun == rerun


def test_a_non_reentrant_checkpoint_reruns_the_down_projection_a_post_norm_reads():
    """With an output norm after the MLP (OLMo 2), that norm keeps the down projection's output
    and is the last to keep anything: everything but the residual add re-runs."""
    from dataclasses import replace
    ck, ops = _early(replace(llama(), post_norms=True))
    assert [op.name for op in ops if op not in ck.rerun] == ["mlp_residual"] and ck.tp_rerun == 1.0


def test_a_non_reentrant_checkpoint_casts_the_down_projections_input_for_fp8():
    """Its FP8 input is what the down projection keeps: the cast runs, the GEMM does not."""
    from simulator.layermix import layer_operators
    s = shard()
    ops = layer_operators(llama(), s, Plan(precision="fp8", fp8_recipe="tensorwise", recompute="full"))
    ck = layer_checkpoint(llama(), s, "full", ops, early_stop=True)
    assert {"mlp_down.fp8_cast"} <= {op.name for op in ck.rerun} and "mlp_down" not in {op.name for op in ck.rerun}


@pytest.mark.parametrize("plan,why", [
    ({"recompute": "selective"}, "Megatron-Core's modules"),
    ({"recompute": "full", "recompute_num_layers": 2}, "recompute_num_layers 1"),
    ({"recompute": "full", "precision": "fp8", "compile": False}, "autograd Function"),
])
def test_early_stop_is_refused_where_the_checkpoint_is_not_torchs_per_layer_one(plan, why):
    from simulator.errors import InputError
    with pytest.raises(InputError, match=why):
        scenario_from_dict({"model": {"preset": "llama-3.1-8b"}, "cluster": {"node": "dgx-h100", "nodes": 1},
                            "plan": {"tp": 1, "global_batch": 8, "recompute_early_stop": True, **plan}})


def test_op_selective_keeps_the_block_input_odd_matmul_outputs_and_the_attention_output():
    # block input, wq, wv, w1, w2 outputs and SDPA's O (bf16), SDPA's fp32 log-sum-exp
    lse = 4 * 2 * 32 * 8192
    expected = 2 * T * (H + Q + KV + F + H + Q) + lse
    assert checkpoint("op-selective").saved_bytes == pytest.approx(expected)


def test_op_selective_reruns_the_even_matmuls_wk_wo_w3():
    forward = sum(op.fwd_flops for op in checkpoint("op-selective").rerun)
    assert forward == pytest.approx(2 * T * (H * KV + Q * H + H * F))


def test_op_selective_on_a_gelu_mlp_reruns_wk_wo_and_w2():
    m = llama("gelu")
    ck = checkpoint("op-selective", m)
    assert sum(op.fwd_flops for op in ck.rerun) == pytest.approx(2 * T * (H * KV + Q * H + F * H))
    assert ck.saved_bytes == pytest.approx(2 * T * (H + Q + KV + F + Q) + 4 * 2 * 32 * 8192)


def test_op_selective_with_sequence_parallelism_keeps_the_reduce_scatter_outputs_and_regathers():
    t = 8
    ck = checkpoint("op-selective", tp=t, sp=True)
    lse = 4 * 2 * (32 / t) * 8192
    expected = 2 * (T / t * H + T * (Q / t + KV / t + F / t + H + Q / t) + 2 * T / t * H) + lse
    assert ck.saved_bytes == pytest.approx(expected)
    assert ck.tp_rerun == 0.5  # the two all-gathers of the forward's two all-gathers and two reduce-scatters


def test_selective_with_flash_attention_reruns_the_flash_forward_and_drops_its_log_sum_exp():
    none, sel = checkpoint("none", flash_attention=True), checkpoint("selective", flash_attention=True)
    # causal flash forward: QK^T and AV over the unmasked half
    assert rerun_flops(sel) == pytest.approx(2 * 2 * T * 8192 * Q / 2)
    assert none.saved_bytes - sel.saved_bytes == pytest.approx(4 * 2 * 32 * 8192)
    assert sel.cp_rerun


def test_full_uniform_keeps_one_input_per_group_and_rebuilds_a_group():
    plan = Plan(recompute="full", recompute_num_layers=2)
    one = checkpoint("full")
    plain = checkpoint("none").saved_bytes
    chunk = chunk_checkpoint(plan, one, plain, 8)
    assert chunk.saved_bytes == pytest.approx(4 * 2 * T * H)
    assert chunk.rerun_layers == 8
    assert chunk.rebuilt_bytes == pytest.approx(2 * plain)


def test_full_block_checkpoints_only_the_first_layers_of_a_chunk():
    plan = Plan(recompute="full", recompute_method="block", recompute_num_layers=2)
    one, plain = checkpoint("full"), checkpoint("none").saved_bytes
    chunk = chunk_checkpoint(plan, one, plain, 8)
    assert chunk.saved_bytes == pytest.approx(2 * 2 * T * H + 6 * plain)
    assert chunk.rerun_layers == 2


def _scenario(**plan):
    base = {"tp": 1, "pp": 4, "dp": 2, "micro_batch": 1, "global_batch": 16, "recompute": "full"}
    return scenario_from_dict({"model": {"preset": "llama-3.1-8b", "seq_len": 4096},
                               "cluster": {"node": "dgx-h100", "nodes": 1}, "plan": {**base, **plan}})


def test_block_recompute_reruns_fewer_layers_than_uniform():
    uniform = evaluate(_scenario(), "analytic")
    block = evaluate(_scenario(recompute_method="block", recompute_num_layers=2), "analytic")
    assert block.breakdown_s["recompute"] == pytest.approx(uniform.breakdown_s["recompute"] * 2 / 8, rel=1e-6)
    assert block.hardware_flops_per_step < uniform.hardware_flops_per_step


def test_hardware_flops_count_each_rerun_layer_once():
    m = compile_scenario(_scenario(recompute_method="block", recompute_num_layers=3))
    base = compile_scenario(_scenario(recompute="none"))
    one = Shard(micro_batch=1, seq_len=4096)
    model = _scenario().model
    per_layer = sum(op.fwd_flops for op in layer_ops(model, one))
    # 4 stages of 8 layers, 3 re-run in each
    assert m.hardware_flops_per_step - base.hardware_flops_per_step == pytest.approx(16 * 4 * 3 * per_layer)


# ------------------------------------------------------------------ Megatron-Core's recompute modules

def modules(*names, model=None, experts=None, s=None):
    """(the layer's checkpoint under selective recomputation of `names`, its operators)."""
    from simulator.layermix import layer_operators
    model = model or llama()
    s = s or shard()
    plan = Plan(tp=s.tp, sequence_parallel=s.sp, recompute="selective", recompute_modules=names)
    ops = layer_operators(model, s, plan, experts)
    return layer_checkpoint(model, s, "selective", ops, names), ops


def test_the_mlp_module_keeps_its_input_and_reruns_the_mlp_forward():
    # dropped: the gate/up input (T x H), SwiGLU's input (2 x T x F), the down input (T x F);
    # re-run: the norm TransformerEngine fuses into fc1, and 2·T·H·(2F) + 2·T·F·H FLOPs
    plain = sum(op.saved_bytes for op in modules()[1])
    mlp, _ = modules("mlp")
    assert mlp.saved_bytes == pytest.approx(plain - 2 * T * (H + 2 * F + F))
    assert rerun_flops(mlp) == pytest.approx(2 * T * H * 2 * F + 2 * T * F * H)
    assert [op.name for op in mlp.rerun] == ["mlp_norm", "mlp_gate_up", "swiglu", "mlp_down"]
    assert (mlp.tp_rerun_blocks, mlp.ep_rerun, mlp.cp_rerun) == (("mlp",), 0.0, False)


def test_core_attention_is_recomputed_only_when_named():
    mlp, _ = modules("mlp")
    assert not any(op.group == "attention_core" for op in mlp.rerun)
    both, _ = modules("core_attn", "mlp")
    core = checkpoint("selective")
    assert rerun_flops(both) == pytest.approx(rerun_flops(core) + rerun_flops(mlp))


def test_the_layernorm_module_leaves_a_layer_whose_norms_transformer_engine_fuses_unchanged():
    ln, ops = modules("layernorm")
    assert (ln.saved_bytes, ln.rerun) == (sum(op.saved_bytes for op in ops), ())


DEEPSEEK = {"preset": "deepseek-v3", "mtp_layers": 0, "seq_len": 4096}


def deepseek_modules(*names):
    """An MoE layer of DeepSeek-V3 on TP 2 with sequence parallelism, 8 expert ranks."""
    from simulator.model import model_from_dict
    from simulator.moe import ExpertShard, MoEOptions
    return modules(*names, model=model_from_dict(DEEPSEEK), experts=ExpertShard(8, 1, MoEOptions()),
                   s=Shard(micro_batch=1, seq_len=4096, tp=2, sp=True))


def test_mla_up_proj_drops_q_k_v_and_the_normed_latents():
    # 4096 tokens, TP 2 with SP (2048 a rank): Q, K (192 wide) and V (128) of 64 heads
    # 2 x 4096 x 64 x 512 = 256 MiB; the normed latents the up-projections keep:
    # 2 x 2048 x 1536 (query) and 2 x 2048 x 512 (KV)
    plain = sum(op.saved_bytes for op in deepseek_modules()[1])
    up, _ = deepseek_modules("mla_up_proj")
    dropped = 2 * 4096 * 64 * 512 + 2 * 2048 * 1536 + 2 * 2048 * 512
    assert up.saved_bytes == pytest.approx(plain - dropped)
    assert up.rebuilt_bytes == pytest.approx(dropped)
    assert [op.name for op in up.rerun] == ["mla_q_norm", "mla_q_up", "mla_kv_norm", "mla_kv_up", "rope"]
    assert up.tp_rerun_blocks == ("mla_up",)


def test_layernorm_on_an_mla_moe_layer_drops_what_the_norm_outputs_feed():
    # MLA's input norm feeds both down-projections (the query one keeps it: 2 x 2048 x 7168);
    # the pre-MLP norm the router (2 x 2048 x 7168) and the shared experts (kept once, by the router)
    plain = sum(op.saved_bytes for op in deepseek_modules()[1])
    ln, _ = deepseek_modules("layernorm")
    assert plain - ln.saved_bytes == pytest.approx(2 * (2 * 2048 * 7168))
    assert [op.name for op in ln.rerun] == ["attn_norm", "mlp_norm"]


def test_moe_act_drops_the_second_expert_gemms_input():
    ops = deepseek_modules()[1]
    fc2 = next(op for op in ops if op.name == "expert_fc2")
    act, _ = deepseek_modules("moe_act")
    assert sum(op.saved_bytes for op in ops) - act.saved_bytes == pytest.approx(fc2.saved_bytes)
    assert fc2.saved_bytes == pytest.approx(2 * fc2.linear.tokens * 2048)  # the activation's output, bf16
    assert [op.name for op in act.rerun] == ["expert_swiglu"]


def test_moe_act_reruns_the_probabilities_multiply_after_a_gelu_and_drops_its_output():
    """Megatron-Core 0.13's bias_act_func multiplies a GELU's output by the probabilities inside
    the checkpointed function: both the second GEMM's input and the GELU output the multiply
    keeps (each 2 B x rows x 2048) go, and the multiply runs again."""
    from dataclasses import replace

    from simulator.model import model_from_dict
    from simulator.moe import ExpertShard, MoEOptions
    model = replace(model_from_dict(DEEPSEEK), activation="gelu")
    experts, shard = ExpertShard(8, 1, MoEOptions()), Shard(micro_batch=1, seq_len=4096, tp=2, sp=True)
    ops = modules(model=model, experts=experts, s=shard)[1]
    act, _ = modules("moe_act", model=model, experts=experts, s=shard)
    fc2 = next(op for op in ops if op.name == "expert_fc2")
    assert sum(op.saved_bytes for op in ops) - act.saved_bytes == pytest.approx(2 * 2 * fc2.linear.tokens * 2048)
    assert [op.name for op in act.rerun] == ["expert_gelu", "expert_probs_scale"]


def test_the_moe_module_keeps_the_router_input_and_reruns_the_dispatch():
    ops = deepseek_modules()[1]
    moe, _ = deepseek_modules("moe")
    body = ops[[o.name for o in ops].index("mlp_norm") + 1:[o.name for o in ops].index("mlp_residual")]
    router = next(op for op in ops if op.name == "router")
    assert sum(op.saved_bytes for op in ops) - moe.saved_bytes == pytest.approx(
        sum(op.saved_bytes for op in body) - router.saved_bytes)
    assert (moe.ep_rerun, moe.tp_rerun_blocks) == (1.0, ("shared",))


def test_an_moe_stage_recomputing_the_moe_module_reruns_every_layers_dispatch():
    # Mixtral: every layer MoE, so the stage's re-run dispatch is all of its forward dispatch
    s = scenario_from_dict({"model": {"preset": "mixtral-8x7b", "seq_len": 4096},
                            "cluster": {"node": "dgx-h100", "nodes": 1},
                            "plan": {"tp": 1, "ep": 8, "dp": 8, "micro_batch": 1, "global_batch": 8,
                                     "recompute": "selective", "recompute_modules": ["moe"]}})
    passes = compile_scenario(s).stages[0].passes
    assert float(passes.ep_recompute_s) == pytest.approx(float(passes.ep_fwd_s)) and float(passes.ep_fwd_s) > 0


def test_hardware_flops_count_the_rerun_mlp_forward():
    from simulator.workload import executed_flops_per_sequence
    m = llama()
    extra = executed_flops_per_sequence(m, True, "selective", recompute_modules=("mlp",)) \
        - executed_flops_per_sequence(m, True, "none")
    assert extra == pytest.approx(32 * (2 * 8192 * H * 2 * F + 2 * 8192 * F * H))


@pytest.mark.parametrize("model,plan,message", [
    ({"preset": "llama-3.1-8b"}, {"recompute_modules": ["mla_up_proj"]}, "mla_up_proj needs"),
    ({"preset": "llama-3.1-8b"}, {"recompute_modules": ["moe_act"]}, "moe_act needs"),
    ({"preset": "mixtral-8x7b"}, {"recompute_modules": ["moe", "moe_act"]}, "nested"),
    ({"preset": "mixtral-8x7b"}, {"recompute_modules": ["shared_experts"]}, "shared_experts needs"),
    ({"preset": "mixtral-8x7b"}, {"recompute_modules": ["moe_act"], "precision": "fp8"}, "delayed"),
    ({"preset": "llama-3.1-8b"}, {"recompute_modules": ["mlp"], "recompute": "full"}, "only with recompute: selective"),
    ({"preset": "llama-3.1-8b"}, {"recompute_modules": ["ffn"]}, "a list of core_attn"),
])
def test_recompute_modules_the_model_or_plan_cannot_run_are_refused(model, plan, message):
    from simulator import InputError
    with pytest.raises(InputError, match=r"plan\.recompute_modules.*" + message):
        scenario_from_dict({"model": {**model, "seq_len": 4096}, "cluster": {"node": "dgx-h100", "nodes": 1},
                            "plan": {"tp": 1, "ep": 8 if "mixtral" in model["preset"] else 1, "dp": 8,
                                     "micro_batch": 1, "global_batch": 8, "recompute": "selective", **plan}})
