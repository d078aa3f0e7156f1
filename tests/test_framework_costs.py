"""What the frameworks of the published runs do beyond the layer's math: host-bound launches,
eager kernels, FSDP2 without resharding, FlashAttention-2, bf16 Adam states."""

from dataclasses import replace

import pytest

from simulator import InputError, evaluate, scenario_from_dict
from simulator.evaluate import compile_scenario
from simulator.fusion import EAGER_BYTES, eager_ops
from simulator.hostbound import host_bound, launches, rerun_bound
from simulator.layermix import layer_operators
from simulator.moe import ExpertShard
from simulator.passes import OpsTime
from simulator.plan import Plan
from simulator.states import bytes_per_param, layer_params_local
from simulator.workload import Shard, layer_ops


def llama(node="dgx-h100", **plan):
    base = {"tp": 1, "pp": 1, "dp": 8, "micro_batch": 1, "global_batch": 8}
    return scenario_from_dict({"model": {"preset": "llama-3.1-8b", "seq_len": 4096},
                               "cluster": {"node": node, "nodes": 1}, "plan": {**base, **plan}})


# ---------------------------------------------------------------- host-bound launches

def test_launches_are_one_per_operator_forward_and_two_per_gemm_backward():
    ops = layer_ops(llama().model, Shard(1, 4096))
    gemms = sum(op.kind == "matmul" for op in ops)
    assert launches(ops) == (len(ops), len(ops) + gemms)


def test_a_pass_of_short_kernels_takes_what_the_host_needs_to_launch_them():
    ops = layer_ops(llama().model, Shard(1, 4096))
    fast = OpsTime(1e-6, 1e-6, 1e-6, 0.0, 0.0)
    bound = host_bound(fast, ops, 50e-6)
    n_f, n_b = launches(ops)
    assert bound.fwd_s == pytest.approx(n_f * 50e-6)
    assert bound.bwd_input_s + bound.bwd_weight_s == pytest.approx(n_b * 50e-6)


def test_a_split_backward_floors_its_input_and_weight_gradient_passes_apart():
    ops = layer_ops(llama().model, Shard(1, 4096))
    gemms = sum(op.kind == "matmul" for op in ops)  # one weight-gradient launch each
    fast = OpsTime(1e-6, 1e-6, 1e-6, 0.0, 0.0)
    bound = host_bound(fast, ops, 50e-6, split=True)
    assert bound.bwd_weight_s == pytest.approx(gemms * 50e-6)
    assert bound.bwd_input_s == pytest.approx(len(ops) * 50e-6)  # every operator's input-gradient launch


def test_a_recomputation_is_as_long_as_its_launches_or_its_kernels_and_exposed_collectives():
    ops = layer_ops(llama().model, Shard(1, 4096))
    n_f = launches(ops)[0]
    # host-bound: the exposed collectives run while the host launches, their launches add to its time
    assert rerun_bound(1e-6, ops, 50e-6, exposed=3e-4, collectives=4) == pytest.approx((n_f + 4) * 50e-6 - 3e-4)
    assert rerun_bound(1.0, ops, 50e-6, exposed=3e-4, collectives=4) == 1.0  # long kernels hide them


def test_long_kernels_hide_the_launches():
    ops = layer_ops(llama().model, Shard(1, 4096))
    slow = OpsTime(1.0, 1.0, 1.0, 0.0, 0.0)
    assert host_bound(slow, ops, 50e-6) == slow


def test_a_tiny_model_is_host_bound_on_a_node_with_a_launch_overhead():
    tiny = {"layers": 4, "hidden": 256, "heads": 4, "ffn_hidden": 1024, "vocab": 1024, "seq_len": 128}
    s = scenario_from_dict({"model": tiny, "cluster": {"node": "dgx-a100", "nodes": 1},
                            "plan": {"dp": 8, "micro_batch": 1, "global_batch": 8}})
    free = replace(s, cluster=replace(s.cluster, node=replace(s.cluster.node, launch_overhead_s=0.0)))
    assert evaluate(s, "analytic").step_time_s > 2 * evaluate(free, "analytic").step_time_s


# ---------------------------------------------------------------- eager kernels

def test_eager_rmsnorm_rope_and_swiglu_move_the_bytes_of_their_kernel_sequences():
    s = llama()
    ops = layer_ops(s.model, Shard(1, 4096))
    eager = {op.name: op for op in eager_ops(ops, s.model, Plan(compile=False))}
    fused = {op.name: op for op in ops}
    for name, kernel in (("attn_norm", "rmsnorm"), ("rope", "rope"), ("swiglu", "swiglu")):
        factor = EAGER_BYTES[kernel][0] / EAGER_BYTES[kernel][1]
        assert eager[name].fwd_bytes == pytest.approx(factor * fused[name].fwd_bytes)
        assert eager[name].bwd_input_bytes == pytest.approx(factor * fused[name].bwd_input_bytes)
    assert eager["qkv"] == fused["qkv"] and eager["attn_residual"] == fused["attn_residual"]


def test_eager_rmsnorm_is_36_bytes_per_element_as_torchtitans_code_reads_and_writes():
    # x.float() 2+4, pow 4+4, mean 4, mul 4+4, type_as 4+2, * weight 2+2
    assert EAGER_BYTES["rmsnorm"][0] == 6 + 8 + 4 + 8 + 6 + 4


def test_torchs_fused_rmsnorm_kernel_runs_eager_as_one_kernel_while_rope_and_swiglu_stay_op_by_op():
    # nn.RMSNorm on CUDA since torch 2.8: _fused_rms_norm_cuda, one kernel keeping its input
    s = llama()
    ops = layer_ops(s.model, Shard(1, 4096))
    fused = {op.name: op for op in ops}
    eager = {op.name: op for op in eager_ops(ops, s.model, Plan(compile=False, eager_norm="fused"))}
    assert eager["attn_norm"] == fused["attn_norm"] and eager["mlp_norm"] == fused["mlp_norm"]
    assert eager["rope"].fwd_bytes == pytest.approx(5 * fused["rope"].fwd_bytes)  # 20 B for 4 B


def test_compiled_kernels_are_untouched_and_layernorm_is_one_kernel_either_way():
    s = llama()
    ops = layer_ops(s.model, Shard(1, 4096))
    assert eager_ops(ops, s.model, Plan(compile=True)) is ops
    gpt = scenario_from_dict({"model": {"preset": "megatron-gpt-1.7b"}, "cluster": {"node": "dgx-a100", "nodes": 1},
                              "plan": {"dp": 8, "micro_batch": 1, "global_batch": 8}}).model
    gops = layer_ops(gpt, Shard(1, 2048))
    assert eager_ops(gops, gpt, Plan(compile=False)) == gops


def test_eager_rmsnorm_and_swiglu_keep_the_tensors_their_autograd_formulas_save():
    # RMSNorm: the fp32 copy of x (4 B) and the normalised bf16 output (2 B) for the
    # weight's mul, where the fused kernel keeps x (2 B): 3x. SwiGLU: silu's input, silu's
    # output and w3's output (3 x 2 B) where the fused kernel keeps w1's and w3's (2 x 2 B)
    s = llama()
    ops = layer_ops(s.model, Shard(1, 4096))
    fused = {op.name: op.saved_bytes for op in ops}
    eager = {op.name: op.saved_bytes for op in eager_ops(ops, s.model, Plan(compile=False))}
    assert eager["attn_norm"] == pytest.approx(3 * fused["attn_norm"])
    assert eager["swiglu"] == pytest.approx(1.5 * fused["swiglu"])
    assert eager["rope"] == fused["rope"] and eager["qkv"] == fused["qkv"]
    fp32 = {op.name: op.saved_bytes for op in eager_ops(layer_ops(s.model, Shard(1, 4096, act_bytes=4)), s.model,
                                                       Plan(compile=False, precision="fp32"))}
    assert fp32["attn_norm"] == pytest.approx(2 * 4 * 4096 * s.model.hidden)  # x itself and the output, 4 B each


def test_an_eager_layer_without_recomputation_holds_more_than_a_compiled_one():
    eager, compiled = (evaluate(llama(compile=c, recompute="none"), "analytic") for c in (False, True))
    # per layer and token: 2 norms x 4 B x hidden more, 2 B x ffn more (the test above);
    # the final norm's fp32 copy on top
    m = llama().model
    extra = m.layers * 4096 * (2 * 4 * m.hidden + 2 * m.ffn_hidden) + 4096 * 4 * m.hidden
    assert eager.peak_memory_bytes - compiled.peak_memory_bytes == pytest.approx(extra, rel=1e-9)


def test_an_eager_step_is_slower_than_a_compiled_one():
    assert evaluate(llama(compile=False), "analytic").step_time_s > evaluate(llama(), "analytic").step_time_s


# ---------------------------------------------------------------- FSDP2 without resharding

def fsdp(**plan):
    base = {"tp": 1, "pp": 2, "dp": 4, "micro_batch": 1, "global_batch": 16, "zero_stage": 3}
    return compile_scenario(llama(**{**base, **plan}))


def test_fsdp_without_resharding_gathers_and_reduces_once_per_step():
    keep = fsdp(fsdp_reshard_after_forward=False).stages[0].dp
    assert keep.mb_gather_s == 0 and keep.mb_reduce_s == 0
    assert keep.step_gather_s > 0 and keep.step_reduce_s > 0


def test_fsdp_without_resharding_holds_the_stages_unsharded_weights_and_fp32_gradients():
    default, keep = fsdp().stages[0], fsdp(fsdp_reshard_after_forward=False).stages[0]
    per = bytes_per_param("bf16", "fp32")
    one = layer_params_local(llama().model, 1)
    # the whole stage's bf16 weights and fp32 gradients instead of two gathered layers and one
    # layer's gradients and the root's gathered embedding (this first stage holds no lm_head)
    model = llama().model
    expected = float(keep.params) * (per.weight + per.grad) - one * (2 * per.weight + per.grad) \
        - model.vocab * model.hidden * per.weight
    assert float(keep.buffer_bytes - default.buffer_bytes) == pytest.approx(expected)


def test_fsdp_without_resharding_holds_an_moe_stages_unsharded_experts_too():
    # Mixtral 8x7B, pp 2, ep 4: a layer on a device holds its attention (4096 x 6144 + 4096 x
    # 4096), two norms, the router (4096 x 8) and 2 of the 8 experts (3 x 4096 x 14336 each)
    layer = 4096 * 6144 + 4096 * 4096 + 2 * 4096 + 4096 * 8 + 2 * 3 * 4096 * 14336
    embedding = 32000 * 4096
    stage = 16 * layer + embedding  # the first stage: 16 layers and the embedding
    base = {"model": {"preset": "mixtral-8x7b", "seq_len": 4096}, "cluster": {"node": "dgx-h100", "nodes": 1},
            "plan": {"tp": 1, "pp": 2, "dp": 4, "ep": 4, "micro_batch": 1, "global_batch": 16, "zero_stage": 3}}
    default = compile_scenario(scenario_from_dict(base)).stages[0]
    base["plan"]["fsdp_reshard_after_forward"] = False
    keep = compile_scenario(scenario_from_dict(base)).stages[0]
    assert float(keep.params) == pytest.approx(stage)
    # bf16 weights and fp32 gradients of the stage instead of two gathered layers, one layer's
    # gradients and the root's gathered embedding; gathered and reduced once a step
    expected = stage * (2 + 4) - layer * (2 * 2 + 4) - embedding * 2
    assert float(keep.buffer_bytes - default.buffer_bytes) == pytest.approx(expected)
    assert keep.dp.mb_gather_s == 0 and keep.dp.step_gather_s > 0


def test_the_fsdp_root_holds_its_gathered_embedding_and_head_and_the_heads_gradient():
    # FSDP2 does not reshard the root (embedding, final norm, lm_head) after forward; the
    # lm_head's gradient waits for the root's reduce-scatter at the end of the backward
    zero3, zero2 = compile_scenario(llama(zero_stage=3)).stages[0], compile_scenario(llama(zero_stage=2)).stages[0]
    model = llama().model
    one = layer_params_local(model, 1)
    table = model.vocab * model.hidden
    root = 2 * table + model.hidden  # untied embedding and lm_head, the final RMSNorm
    # ZeRO-2 holds a layer's unsharded gradients; ZeRO-3 also two gathered layers and the root
    assert float(zero3.buffer_bytes - zero2.buffer_bytes) == pytest.approx(2 * one * 2 + (root + table) * 2)
    deepspeed = compile_scenario(llama(zero_stage=3, zero3_impl="deepspeed")).stages[0]
    assert float(deepspeed.buffer_bytes - zero2.buffer_bytes) == pytest.approx(2 * one * 2)


def test_keeping_weights_gathered_needs_fsdp():
    with pytest.raises(InputError, match="plan.fsdp_reshard_after_forward"):
        llama(fsdp_reshard_after_forward=False)


# ---------------------------------------------------------------- attention kernel, Adam states

def test_flashattention2_runs_at_the_profiles_fa2_efficiency():
    fa3 = compile_scenario(llama())
    fa2 = compile_scenario(llama(attention_kernel="flash2"))
    acc = fa3.cluster.accelerator
    assert acc.attention_flash2.max < acc.attention.max
    assert fa2.stages[0].passes.fwd_s > fa3.stages[0].passes.fwd_s


def test_flashattention2_is_the_fused_kernel_where_the_profile_measured_flashattention2():
    """The A100's efficiency.attention is FlashAttention-2's own rate (Dao 2023, arXiv 2307.08691)."""
    fused = evaluate(llama("dgx-a100"))
    fa2 = evaluate(llama("dgx-a100", attention_kernel="flash2"))
    assert fa2.step_time_s == fused.step_time_s


def test_flashattention2_is_refused_where_the_profile_knows_no_rate_for_it():
    """The MI300X's attention rate is AITER/CK's; PyTorch SDPA's flash backend there is
    another kernel (AOTriton), unmeasured: the plan is refused, not priced at the fused rate."""
    with pytest.raises(InputError, match="plan.attention_kernel.*mi300x profile has no efficiency.attention_flash2"):
        llama("mi300x-node", attention_kernel="flash2")


def test_a_profiles_flashattention2_rate_is_a_curve_or_the_fused_kernel():
    from simulator.hardware import accelerator_from_dict, profiles_dir
    from simulator.yamlio import load_yaml

    data = load_yaml(profiles_dir() / "accelerators" / "a100-sxm-80gb.yaml")
    data["efficiency"]["attention_flash2"] = "same"
    with pytest.raises(InputError, match="efficiency.attention_flash2: got 'same'; a curve .* or fused"):
        accelerator_from_dict(data, "a100")


def test_flashattention2_needs_a_flash_kernel():
    with pytest.raises(InputError, match="plan.attention_kernel"):
        llama(attention_kernel="flash2", flash_attention=False)


def test_bf16_adam_states_are_a_bf16_copy_and_two_bf16_moments():
    assert bytes_per_param("bf16", "bf16", "bf16").optimizer == 6.0
    assert bytes_per_param("bf16", "bf16").optimizer == 12.0


def test_an_eager_moe_layer_runs_the_eager_kernels_of_its_attention_block_too():
    s = scenario_from_dict({"model": {"preset": "mixtral-8x7b", "seq_len": 4096},
                            "cluster": {"node": "dgx-h100", "nodes": 1},
                            "plan": {"dp": 8, "ep": 8, "micro_batch": 1, "global_batch": 8}})
    shard, experts = Shard(1, 4096), ExpertShard(8, 1)
    eager = {op.name: op for op in layer_operators(s.model, shard, Plan(compile=False), experts)}
    fused = {op.name: op for op in layer_operators(s.model, shard, Plan(compile=True), experts)}
    factor = EAGER_BYTES["rmsnorm"][0] / EAGER_BYTES["rmsnorm"][1]
    assert eager["attn_norm"].fwd_bytes == pytest.approx(factor * fused["attn_norm"].fwd_bytes)


def test_fp32_parameters_need_fp32_adam_states_and_no_offload():
    with pytest.raises(InputError, match="plan.fp32_params"):
        llama(fp32_params=True, optimizer_precision="bf16")
    with pytest.raises(InputError, match="plan.fp32_params"):
        llama(fp32_params=True, zero_stage=1, offload={"optimizer": "cpu"})
