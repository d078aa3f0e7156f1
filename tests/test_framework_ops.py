"""framework_ops.py: the framework operators a training step runs besides the layers' math.

Byte counts are worked by hand from the kernels' traffic (read the summed gradient once for
a bias gradient; read new, read and write the buffer for an accumulation)."""

from __future__ import annotations

import pytest

from simulator import framework_ops as fo
from simulator.hardware import cluster_from_dict
from simulator.layout import compile_layout
from simulator.model import ModelSpec
from simulator.plan import Offload, Plan
from simulator.states import bytes_per_param, stage_params
from simulator.workload import Shard

GPT = ModelSpec(name="gpt", layers=4, hidden=256, heads=8, kv_heads=8, ffn_hidden=1024, vocab=2048, seq_len=256,
                activation="gelu", norm="layernorm", position_embedding="learned", bias=True, tied_embeddings=True,
                dropout=False)
LLAMA = ModelSpec(name="llama", layers=4, hidden=256, heads=8, kv_heads=8, ffn_hidden=768, vocab=2048, seq_len=256,
                  activation="swiglu", norm="rmsnorm", position_embedding="rope", bias=False, tied_embeddings=False,
                  dropout=False)


def _by_name(ops):
    out = {}
    for op in ops:
        out[op.name] = out.get(op.name, 0.0) + float(op.bwd_input_bytes)
    return out


def _layer(model, plan, micro_batch=1, act_bytes=2):
    shard = Shard(micro_batch=micro_batch, seq_len=model.seq_len, tp=plan.tp, act_bytes=act_bytes)
    return _by_name(fo.layer_framework_ops(model, plan, shard, _per(plan)))


def _per(plan):
    return bytes_per_param(plan.precision, plan.grad_precision, plan.optimizer_precision)


def _all_params(model):
    return float(stage_params(model, 1, model.layers, True, True, not model.tied_embeddings))


def test_bias_gradients_read_each_linear_output_gradient_once():
    plan = Plan(micro_batch=2, precision="fp32")
    tokens = 2 * 256
    # qkv 3h + output h + mlp in 4h + mlp out h, 4 bytes each
    assert _layer(GPT, plan, micro_batch=2, act_bytes=4)["bias_grad"] == 4 * tokens * (3 + 1 + 4 + 1) * 256


def test_no_bias_no_bias_gradient():
    assert "bias_grad" not in _layer(LLAMA, Plan(precision="bf16"))


def test_unfused_accumulation_adds_every_parameter_and_fused_only_biases_and_norms():
    h = 256
    layer = 12 * h * h + 13 * h  # four GEMM weights (3h² + h² + 4h² + 4h²), 9h biases, 2 x 2h norm
    unfused = _layer(GPT, Plan(precision="bf16", grad_accumulation_fusion=False))
    fused = _layer(GPT, Plan(precision="bf16"))
    # bf16 gradient read (2 B) + fp32 main grad read and written (8 B)
    assert unfused["grad_accumulate"] == pytest.approx(10 * layer)
    assert fused["grad_accumulate"] == pytest.approx(10 * 13 * h)


def test_embedding_table_gradient_is_zero_filled_and_the_tied_head_gradient_added():
    table = (2048 + 256) * 256  # token + position tables
    plan = Plan(precision="fp32", grad_accumulation_fusion=False)
    ops = fo.embedding_framework_ops(GPT, plan, 1, _per(plan), True)
    assert float(ops[0].bwd_input_bytes) == 4 * table  # zero-filled fp32 table gradient
    assert float(ops[1].bwd_input_bytes) == 12 * table  # added into the gradient buffer
    assert float(ops[2].bwd_input_bytes) == 12 * 2048 * 256  # autograd sums the lm_head's gradient of the same table


def test_step_zeroes_the_gradient_buffer_and_copies_master_weights_only_in_mixed_precision():
    fp32, bf16 = Plan(precision="fp32"), Plan(precision="bf16")
    h = 256
    params = 4 * (12 * h * h + 13 * h) + (2048 + 256) * h + 2 * h  # layers, token + position tables, final norm
    assert _all_params(GPT) == params
    fp32_ops = _by_name(fo.step_framework_ops(fp32, _per(fp32), params, 1))
    bf16_ops = _by_name(fo.step_framework_ops(bf16, _per(bf16), params, 1))
    assert "param_cast" not in fp32_ops
    assert fp32_ops["zero_grad"] == pytest.approx(4 * params)
    assert bf16_ops["param_cast"] == pytest.approx(6 * params)  # read fp32 master, write bf16 weight


def test_zero2_zeroes_only_its_gradient_shard():
    z1, z2 = Plan(precision="bf16", dp=4, zero_stage=1), Plan(precision="bf16", dp=4, zero_stage=2)
    full = _by_name(fo.step_framework_ops(z1, _per(z1), 1e6, 4))["zero_grad"]
    shard = _by_name(fo.step_framework_ops(z2, _per(z2), 1e6, 4))["zero_grad"]
    assert shard == pytest.approx(full / 4)


def test_clipping_reads_the_optimizers_gradient_shard_for_the_norm_and_scales_it_under_norm_scale():
    # ZeRO-1 over 4 ranks: the optimizer updates 1e6 / 4 parameters here, fp32 main grads (4 B)
    def ops(clip):
        plan = Plan(precision="bf16", dp=4, zero_stage=1, grad_clip=clip)
        return _by_name(fo.step_framework_ops(plan, _per(plan), 1e6, 4))
    assert ops("norm-scale")["grad_norm"] == pytest.approx(4 * 2.5e5)  # read once for the norm
    assert ops("norm-scale")["grad_scale"] == pytest.approx(8 * 2.5e5)  # read and written to scale
    assert ops("norm")["grad_norm"] == pytest.approx(4 * 2.5e5)
    assert "grad_scale" not in ops("norm")  # scaled only on the steps it clips: not counted
    assert "grad_norm" not in ops("none") and "grad_scale" not in ops("none")


def test_fp16_gradients_are_unscaled_and_checked_before_the_step():
    fp16, bf16 = Plan(precision="fp16", grad_precision="fp32"), Plan(precision="bf16")
    assert _by_name(fo.step_framework_ops(fp16, _per(fp16), 1e6, 1))["grad_unscale"] == pytest.approx(8e6)
    assert "grad_unscale" not in _by_name(fo.step_framework_ops(bf16, _per(bf16), 1e6, 1))


def test_an_optimizer_on_the_host_leaves_only_the_gradient_norm_on_the_device():
    plan = Plan(precision="fp16", grad_precision="fp32", dp=4, zero_stage=2, offload=Offload(optimizer="cpu"))
    ops = _by_name(fo.step_framework_ops(plan, _per(plan), 1e6, 4))
    assert ops["grad_norm"] == pytest.approx(4 * 2.5e5)  # DeepSpeed's per-parameter norms on the GPU
    assert not {"grad_unscale", "grad_scale", "param_cast"} & set(ops)


def test_clipping_lengthens_the_step_by_its_passes_over_the_gradients():
    cluster = cluster_from_dict({"node": "dgx-h100", "nodes": 1})
    steps = [float(compile_layout(LLAMA, cluster, Plan(precision="bf16", dp=8, global_batch=8, grad_clip=clip))
                   .stages[0].framework_step_s) for clip in ("none", "norm", "norm-scale")]
    assert steps[0] < steps[1] < steps[2]


def test_an_fp32_optimizer_copies_16_bit_gradients_to_fp32_and_reads_the_copies():
    # Megatron's fp16 main grads: .float() copies (read 2 B, write 4 B), then unscaled and clipped in fp32
    plan = Plan(precision="fp16", grad_precision="fp16", grad_clip="norm")
    ops = _by_name(fo.step_framework_ops(plan, _per(plan), 1e6, 1))
    assert ops["grad_upcast"] == pytest.approx(6e6)
    assert ops["grad_unscale"] == pytest.approx(8e6)
    assert ops["grad_norm"] == pytest.approx(4e6)
    assert ops["zero_grad"] == pytest.approx(2e6)  # the 16-bit buffer the backward accumulates into


def test_an_optimizer_reading_16_bit_gradients_itself_makes_no_copy():
    # Apex's DistributedFusedAdam (the bf16 remainders beside the weights) reads bf16 gradients
    plan = Plan(precision="bf16", grad_precision="bf16", dp=4, zero_stage=1, master_weights="remainders",
                grad_clip="norm")
    ops = _by_name(fo.step_framework_ops(plan, _per(plan), 1e6, 4))
    assert "grad_upcast" not in ops
    assert ops["grad_norm"] == pytest.approx(2 * 2.5e5)


def test_a_summing_reduction_divides_the_whole_gradient_buffer_by_the_dp_size_first():
    # Megatron-Core's distributed optimizer (ZeRO-1) keeps the whole fp32 buffer: read and write 4 B each
    def ops(**kw):
        plan = Plan(precision="bf16", zero_stage=1, **{"dp": 4, **kw})
        return _by_name(fo.step_framework_ops(plan, _per(plan), 1e6, plan.dp))
    assert ops()["grad_average"] == pytest.approx(8e6)
    assert ops(dp_average_in_collective=True).get("grad_average", 0.0) == 0.0  # NCCL's AVG
    assert ops(dp=1).get("grad_average", 0.0) == 0.0  # nothing to average


def test_fsdp2_averages_fp32_gradients_in_its_reduce_scatter_and_divides_fp16_ones_around_it():
    fp32 = Plan(precision="bf16", dp=4, zero_stage=3)
    assert "grad_average" not in _by_name(fo.step_framework_ops(fp32, _per(fp32), 1e6, 4))
    fp16 = Plan(precision="fp16", grad_precision="fp16", dp=4, zero_stage=3)
    # before the reduce-scatter on the 1e6 unsharded fp16 gradients, after it on their 1e6 / 4 shard
    assert _by_name(fo.step_framework_ops(fp16, _per(fp16), 1e6, 4))["grad_average"] == pytest.approx(
        2 * 2 * (1e6 + 1e6 / 4))


def test_megatrons_nan_check_reads_the_gradient_buffer():
    plan = Plan(precision="bf16", dp=4, zero_stage=1, grad_nan_check=True)
    assert _by_name(fo.step_framework_ops(plan, _per(plan), 1e6, 4))["grad_nan_check"] == pytest.approx(4e6)


def test_parameter_tensors_of_a_gpt_with_biases_and_layernorms():
    # per layer: 4 weights + 4 biases + 2 norms x (scale, shift); token and position tables, final norm
    assert float(fo.param_tensors(GPT, GPT.layers, True, True, False)) == 4 * 12 + 2 + 2


MOE = ModelSpec(name="moe", layers=4, hidden=256, heads=8, kv_heads=8, ffn_hidden=1024, vocab=2048, seq_len=256,
                activation="gelu", norm="layernorm", position_embedding="learned", bias=True, tied_embeddings=True,
                dropout=False, experts=8, top_k=2, expert_ffn_hidden=512)


def _moe_layer(plan, ep=1):
    from simulator.moe import ExpertShard
    shard = Shard(micro_batch=plan.micro_batch, seq_len=MOE.seq_len, tp=plan.tp, act_bytes=4)
    return _by_name(fo.moe_layer_framework_ops(MOE, plan, shard, _per(plan), ExpertShard(ep, 1, plan.moe)))


def test_an_moe_layer_sums_each_experts_bias_gradient_over_the_rows_routed_to_it():
    tokens, h = 2 * 256, 256
    rows = 2 * tokens  # top-2: every token's row reaches two experts
    # qkv 3h + output h over the tokens, the router's 8 over the tokens, fc1 512 + fc2 h over the rows; fp32
    expected = 4 * (tokens * (3 * h + h + 8) + rows * (512 + h))
    assert _moe_layer(Plan(micro_batch=2, precision="fp32"))["bias_grad"] == expected


def test_unfused_accumulation_adds_the_router_and_every_local_experts_parameters():
    h, f = 256, 512
    attention, norms, router = 4 * h * h + 4 * h, 2 * 2 * h, 8 * h + 8
    expert = 2 * h * f + f + h  # fc1 and fc2 with their biases
    plan = Plan(precision="fp32", grad_accumulation_fusion=False)
    # fp32: the new gradient read (4 B), the buffer read and written (8 B)
    assert _moe_layer(plan)["grad_accumulate"] == pytest.approx(12 * (attention + norms + router + 8 * expert))
    assert _moe_layer(plan, ep=4)["grad_accumulate"] == pytest.approx(12 * (attention + norms + router + 2 * expert))
    fused = Plan(precision="fp32")  # the GEMM weights accumulate in their weight-gradient GEMMs; the router's does not
    assert _moe_layer(fused)["grad_accumulate"] == pytest.approx(12 * (4 * h + norms + router + 8 * (f + h)))


MLA = ModelSpec(name="mla", layers=4, hidden=256, heads=8, kv_heads=8, ffn_hidden=1024, vocab=2048, seq_len=256,
                activation="swiglu", norm="rmsnorm", position_embedding="rope", bias=False, tied_embeddings=False,
                dropout=False, attention="mla", q_lora_rank=64, kv_lora_rank=32, qk_nope_head_dim=16,
                qk_rope_head_dim=8, v_head_dim=16, mtp_layers=1)


def test_unfused_accumulation_adds_every_mla_weight_and_fused_only_the_norms():
    h, heads = 256, 8
    # W_DQ h x 64, W_UQ 64 x 8(16+8), W_DKV+W_KR h x (32+8), W_UKV 32 x 8(16+16), W_O 8*16 x h
    linears = h * 64 + 64 * heads * 24 + h * 40 + 32 * heads * 32 + heads * 16 * h
    norms = 64 + 32 + 2 * h  # the latent norms, the two pre-norms
    mlp = 3 * h * 1024
    plan = Plan(precision="bf16", grad_accumulation_fusion=False)
    assert _layer(MLA, plan)["grad_accumulate"] == pytest.approx(10 * (linears + norms + mlp))
    assert _layer(MLA, Plan(precision="bf16"))["grad_accumulate"] == pytest.approx(10 * norms)


def test_an_mtp_depth_adds_its_embedding_gradient_its_norms_and_unfused_its_projection_and_the_head():
    h, table = 256, 2048 * 256 / 2  # tp 2
    unfused = Plan(tp=2, precision="bf16", grad_accumulation_fusion=False)
    ops = _by_name(fo.mtp_depth_framework_ops(MLA, unfused, 2, _per(unfused)))
    assert ops["zero_fill"] == 2 * table  # the lookup's zero-filled bf16 table gradient
    # the table, enorm, hnorm and the final norm, eh_proj (2h x h over tp 2), the shared head's table again
    assert ops["grad_accumulate"] == pytest.approx(10 * (table + 3 * h + h * h + table))
    fused = Plan(tp=2, precision="bf16")
    assert _by_name(fo.mtp_depth_framework_ops(MLA, fused, 2, _per(fused)))["grad_accumulate"] == \
        pytest.approx(10 * (table + 3 * h))


def test_the_head_stage_runs_each_mtp_depths_layer_and_depth_operators():
    from dataclasses import replace
    cluster = cluster_from_dict({"node": "dgx-h100", "nodes": 1})
    plan = Plan(precision="bf16", grad_accumulation_fusion=False)
    shard = Shard(micro_batch=1, seq_len=MLA.seq_len, tp=1, act_bytes=2)
    per = _per(plan)

    def head_stage(model):
        return float(fo.microbatch_seconds(model, plan, cluster, shard, per, 4, False, True, True))
    ops = fo.layer_framework_ops(MLA, plan, shard, per) + fo.mtp_depth_framework_ops(MLA, plan, 1, per)
    depth = fo.ops_seconds(ops, cluster, "bf16")
    assert head_stage(MLA) - head_stage(replace(MLA, mtp_layers=0)) == pytest.approx(float(depth))
    assert float(fo.microbatch_seconds(MLA, plan, cluster, shard, per, 4, True, False, False)) == pytest.approx(
        float(fo.microbatch_seconds(replace(MLA, mtp_layers=0), plan, cluster, shard, per, 4, True, False, False)))


def test_parameter_tensors_of_an_moe_layer_count_the_router_and_each_local_expert():
    # an MoE layer: qkv, output, router and 8 experts x (fc1, fc2), each weight and bias, 2 norms x 2
    moe_layer = 2 * (2 + 1 + 16) + 4
    assert float(fo.param_tensors(MOE, 4, True, True, False, moe_layers=4)) == 4 * moe_layer + 2 + 2
    assert float(fo.param_tensors(MOE, 4, True, True, False, moe_layers=4, ep=4)) == 4 * (moe_layer - 24) + 2 + 2


def test_on_a_gpu_with_fusion_the_framework_operators_are_a_small_share_of_a_micro_batch():
    model = ModelSpec(name="gpt-13b", layers=40, hidden=5120, heads=40, kv_heads=40, ffn_hidden=20480, vocab=51200,
                      seq_len=2048, activation="gelu", norm="layernorm", position_embedding="learned", bias=True,
                      tied_embeddings=True, dropout=True)
    plan = Plan(tp=8, pp=1, dp=1, micro_batch=1, global_batch=8, precision="bf16", sequence_parallel=True)
    cluster = cluster_from_dict({"accelerator": "a100-sxm-80gb", "nodes": 1, "devices_per_node": 8})
    layout = compile_layout(model, cluster, plan)
    framework = float(fo.microbatch_seconds(model, plan, cluster, layout.shard, layout.per_param, model.layers,
                                            True, True, False))
    assert 0 < framework < 0.03 * float(layout.stages[0].passes.compute_s)
    assert cluster.accelerator.host_overhead_s == {}  # no host overhead on a GPU profile


def test_with_fusion_an_mla_layer_adds_only_its_norms_and_latent_norms():
    """DeepSeek-V3: two RMSNorms of 7168 and the query and KV latent norms (1536, 512); its MoE
    layer the router's 7168 x 256 weights as well (bf16 weights, fp32 main gradients: 10 B)."""
    from simulator.model import model_from_dict
    from simulator.moe import ExpertShard
    model = model_from_dict({"preset": "deepseek-v3", "mtp_layers": 0})
    plan = Plan(precision="bf16", ep=8, sequence_parallel=True)
    shard = Shard(micro_batch=1, seq_len=4096, tp=1, act_bytes=2)
    norms = 2 * 7168 + 1536 + 512
    assert _by_name(fo.layer_framework_ops(model, plan, shard, _per(plan)))["grad_accumulate"] == 10 * norms
    moe = _by_name(fo.moe_layer_framework_ops(model, plan, shard, _per(plan), ExpertShard(8, 1, plan.moe)))
    assert moe["grad_accumulate"] == 10 * (norms + 7168 * 256)
