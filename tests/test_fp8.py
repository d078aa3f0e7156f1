"""FP8 linears as TransformerEngine and torchao run them: only the linears run at the FP8 rate
the profile measured, each recipe adds its casts, and FP8 changes the bytes kept."""

from importlib import resources

import pytest

from simulator import InputError, evaluate, scenario_from_dict
from simulator.compute import FP8_MATMUL, MXFP8_MATMUL, op_times
from simulator.evaluate import compile_scenario
from simulator.fp8 import fp8_layer_ops, layer_linear_params
from simulator.plan import Plan
from simulator.workload import ATTENTION, MATMUL, Shard, head_ops, layer_ops

B, S, H, KV, F = 1, 4096, 4096, 1024, 14336


def scenario(node="dgx-h100", **plan):
    base = {"tp": 1, "pp": 1, "dp": 8, "micro_batch": 1, "global_batch": 64, "precision": "fp8"}
    return scenario_from_dict({"model": {"preset": "llama-3.1-8b", "seq_len": S},
                               "cluster": {"node": node, "nodes": 1}, "plan": {**base, **plan}})


def ops_of(**plan):
    s = scenario(**plan)
    shard = Shard(micro_batch=B, seq_len=S)
    return s, fp8_layer_ops(layer_ops(s.model, shard), shard, s.plan)


def test_only_the_linears_become_fp8_gemms():
    _, ops = ops_of()
    kinds = {op.name: op.kind for op in ops}
    assert {n for n, k in kinds.items() if k == FP8_MATMUL} == {"qkv", "attn_out", "mlp_gate_up", "mlp_down"}
    assert kinds["flash_attention"] == ATTENTION
    assert {op.kind for op in head_ops(scenario().model, Shard(B, S)) if op.name == "lm_head"} == {MATMUL}


def test_an_fp8_gemm_runs_at_the_fp8_peak_times_the_measured_fp8_efficiency():
    s, ops = ops_of()
    acc = s.cluster.accelerator
    qkv = next(op for op in ops if op.name == "qkv")
    eff = acc.matmul_fp8
    k = qkv.linear.d_in  # the forward's reduction dimension, at K / (K + k_half) of the rate
    expected = (qkv.fwd_flops + eff.half) / (acc.peak("fp8") * eff.max) * (k + acc.matmul_fp8_k_half) / k
    assert float(op_times(qkv, acc, "bf16").fwd_s) == pytest.approx(expected)


def test_torchao_tensorwise_casts_each_linear_input_its_weight_and_its_output_gradient():
    # eager: amax 2 B, then a read and two FP8 layouts (2 + 2 x 1 B) per input element, 8 B per
    # weight element, 6 B per output-gradient element; torchtitan's separate wq, wk and wv each
    # cast the same input (torchao/testing/float8/roofline_utils.py)
    _, ops = ops_of(fp8_recipe="tensorwise", projections="separate", compile=False)
    cast = next(op for op in ops if op.name == "qkv.fp8_cast")
    tokens, width = B * S, H + 2 * KV
    assert cast.fwd_bytes == pytest.approx(3 * 6 * tokens * H + 8 * H * width)
    assert cast.bwd_input_bytes == pytest.approx(6 * tokens * width)


def test_compiled_linears_cast_their_shared_input_once():
    # AOTAutograd's CSE merges wq's, wk's and wv's identical casts of one input; compiled, the
    # amax is fused into the producer: 4 B per input element
    _, ops = ops_of(fp8_recipe="tensorwise", projections="separate")
    cast = next(op for op in ops if op.name == "qkv.fp8_cast")
    assert cast.fwd_bytes == pytest.approx(4 * B * S * H + 8 * H * (H + 2 * KV))


def test_linears_reading_one_fp8_input_save_it_once_unless_eager_casts_it_apiece():
    # torchao tensorwise keeps each linear's FP8 input for its weight gradient (1 B per element
    # in place of the 2 B input): eager, wq, wk and wv cast and keep three copies; compiled
    # (CSE), one tensor that all three hold
    base = {op.name: op.saved_bytes for op in layer_ops(scenario().model, Shard(B, S))}
    _, eager = ops_of(fp8_recipe="tensorwise", projections="separate", compile=False)
    _, compiled = ops_of(fp8_recipe="tensorwise", projections="separate")
    x = B * S * H
    qkv = {name: next(op for op in ops if op.name == "qkv").saved_bytes for name, ops in
           (("eager", eager), ("compiled", compiled))}
    assert qkv["eager"] == pytest.approx(base["qkv"] + 3 * x - 2 * x)
    assert qkv["compiled"] == pytest.approx(base["qkv"] + x - 2 * x)


def test_under_sequence_parallelism_transformer_engine_keeps_the_fp8_shard_and_torchao_the_gathered_input():
    # t = 4 with SP: without FP8 qkv keeps its BF16 input shard (2 B x T/t x h) and gathers it
    # again for the weight gradient; TransformerEngine keeps that shard in FP8 (1 B x T/t x h),
    # torchao's tensorwise TP the all-gathered FP8 input it received (1 B x T x h); the
    # projection after the attention reads no gathered input: its FP8 copy of the whole input
    t = 4
    shard = Shard(micro_batch=B, seq_len=S, tp=t, sp=True)
    model = scenario().model
    base = {op.name: op.saved_bytes for op in layer_ops(model, shard)}
    x = B * S * H

    def saved(**plan):
        s = scenario(tp=t, dp=2, sequence_parallel=True, **plan)
        return {op.name: op.saved_bytes for op in fp8_layer_ops(layer_ops(model, shard), shard, s.plan)}

    te, torchao = saved(fp8_recipe="delayed"), saved(fp8_recipe="tensorwise", projections="separate")
    assert te["qkv"] == pytest.approx(base["qkv"] + x / t - 2 * x / t)
    assert torchao["qkv"] == pytest.approx(base["qkv"] + x - 2 * x / t)
    assert te["mlp_down"] == pytest.approx(base["mlp_down"] + (x - 2 * x) * F / (t * H))


def test_rowwise_rescales_both_gradient_gemms_outputs_after_cublas():
    # compiled rowwise: 6 B per input element (one cast: CSE), 10 per weight, 6 per
    # output-gradient element, plus a read and a write (2 + 2 B) of wq's, wk's and wv's own
    # grad_input and of the weight gradient (pytorch/ao float8_ops.py addmm_float8_unwrapped
    # without fast accumulation)
    _, ops = ops_of(fp8_recipe="rowwise", projections="separate")
    cast = next(op for op in ops if op.name == "qkv.fp8_cast_rowwise")
    tokens, width = B * S, H + 2 * KV
    assert cast.fwd_bytes == pytest.approx(6 * tokens * H + 10 * H * width)
    assert cast.bwd_input_bytes == pytest.approx(6 * tokens * width + 4 * (3 * tokens * H + H * width))


def test_an_fp8_gemm_reads_its_operands_in_one_byte_and_writes_bf16():
    _, ops = ops_of()
    qkv = next(op for op in ops if op.name == "qkv")
    x, w, y = B * S * H, H * (H + 2 * KV), B * S * (H + 2 * KV)  # input, weight, output elements
    assert (qkv.fwd_bytes, qkv.bwd_input_bytes, qkv.bwd_weight_bytes) == pytest.approx(
        (x + w + 2 * y, y + w + 2 * x, y + x + 2 * w))


def test_a_fused_qkv_linear_casts_its_input_once_under_torchao_too():
    _, ops = ops_of(fp8_recipe="tensorwise")
    cast = next(op for op in ops if op.name == "qkv.fp8_cast")
    assert cast.fwd_bytes == pytest.approx(4 * B * S * H + 8 * H * (H + 2 * KV))


def test_eager_tensorwise_reads_each_input_once_more_for_its_amax():
    _, compiled = ops_of(fp8_recipe="tensorwise")
    _, eager = ops_of(fp8_recipe="tensorwise", compile=False)
    c, e = (next(op for op in ops if op.name == "mlp_down.fp8_cast") for ops in (compiled, eager))
    assert e.fwd_bytes - c.fwd_bytes == pytest.approx(2 * B * S * F)


def test_transformer_engine_casts_the_fused_qkv_input_once_and_its_weights_once_per_step():
    _, ops = ops_of(fp8_recipe="delayed")
    cast = next(op for op in ops if op.name == "qkv.fp8_cast")
    assert cast.fwd_bytes == pytest.approx(4 * B * S * H)  # cast + transpose, no amax pass, no weight


def test_transformer_engine_current_scaling_reads_each_cast_tensor_once_more_for_its_amax():
    """Float8CurrentScalingQuantizer (TE@d0067d0da quantizer.cpp quantize_impl): an amax pass
    (2 B per element read) before the fused cast and transpose (4 B): 6 B for the input and
    the output gradient; the once-per-step weight cast reads each BF16 weight once more."""
    from simulator.fp8 import weight_cast_bytes_per_step

    _, ops = ops_of(fp8_recipe="current")
    cast = next(op for op in ops if op.name == "qkv.fp8_cast")
    assert cast.fwd_bytes == pytest.approx(6 * B * S * H)
    assert cast.bwd_input_bytes == pytest.approx(6 * B * S * (H + 2 * KV))  # the fused QKV output's gradient
    linear = 1.0e9
    assert float(weight_cast_bytes_per_step(scenario(fp8_recipe="current").plan, linear)) == pytest.approx(6 * linear)
    assert float(weight_cast_bytes_per_step(scenario(fp8_recipe="current", fp8_params=True).plan, linear)) == \
        pytest.approx(2 * linear)  # the FP8 primary weight's transpose, as delayed


def test_transformer_engine_keeps_an_fp8_weight_and_its_transpose_on_top_of_the_bf16_weight():
    bf16 = compile_scenario(scenario(precision="bf16"))
    te = compile_scenario(scenario(fp8_recipe="delayed"))
    primary = compile_scenario(scenario(fp8_recipe="delayed", fp8_params=True))
    linears = 32 * layer_linear_params(te.model, 1)
    assert float(te.stages[0].states.weights_bytes - bf16.stages[0].states.weights_bytes) == pytest.approx(2 * linears)
    # FP8 primary weights: 1 B + its 1 B transpose instead of 2 B
    assert float(primary.stages[0].states.weights_bytes) == pytest.approx(float(bf16.stages[0].states.weights_bytes))


def test_fp8_primary_weights_all_gather_one_byte_per_linear_weight():
    bf16 = compile_scenario(scenario(precision="bf16", zero_stage=1))
    primary = compile_scenario(scenario(fp8_recipe="delayed", fp8_params=True, zero_stage=1))
    assert primary.stages[0].dp.step_gather_s < 0.6 * bf16.stages[0].dp.step_gather_s


def test_fp8_is_faster_than_bf16_but_not_twice():
    bf16 = evaluate(scenario(precision="bf16"), "analytic").step_time_s
    fp8 = evaluate(scenario(fp8_recipe="delayed"), "analytic").step_time_s
    assert bf16 / 2 < fp8 < bf16


def test_rowwise_casts_cost_more_than_tensorwise():
    tensorwise = evaluate(scenario(fp8_recipe="tensorwise"), "analytic").step_time_s
    rowwise = evaluate(scenario(fp8_recipe="rowwise"), "analytic").step_time_s
    assert rowwise > tensorwise


def test_mxfp8_runs_on_blackwell_at_its_mxfp8_peak():
    s, ops = ops_of(node="dgx-b200", precision="mxfp8")
    assert {op.kind for op in ops if op.name == "qkv"} == {MXFP8_MATMUL}
    with pytest.raises(InputError, match="plan.precision"):
        scenario(precision="mxfp8")  # Hopper has no MXFP8 tensor cores


def test_fp8_without_an_fp8_peak_is_refused():
    with pytest.raises(InputError, match="plan.precision"):
        scenario(node="dgx-a100")


def test_fp8_without_a_measured_fp8_gemm_rate_is_refused(tmp_path):
    """A profile with an FP8 peak but no FP8 GEMM microbenchmark (here the MI300X's without
    its efficiency.matmul_fp8) is not given twice its BF16 rate."""
    profile = resources.files("simulator").joinpath("data/hardware_profiles/accelerators/mi300x.yaml").read_text()
    path = tmp_path / "mi300x-no-fp8-rate.yaml"
    path.write_text("\n".join(line for line in profile.splitlines() if not line.startswith("  matmul_fp8:")))
    with pytest.raises(InputError, match="plan.precision.*no efficiency.matmul_fp8"):
        scenario_from_dict({"model": {"preset": "llama-3.1-8b"},
                            "cluster": {"node": "mi300x-node", "accelerator": str(path)},
                            "plan": {"dp": 8, "micro_batch": 1, "global_batch": 64, "precision": "fp8"}})


def test_an_fp8_linear_on_gaudi3_is_barely_faster_than_bf16():
    """Gaudi 3 runs FP8 matmuls at its BF16 rate (best shape 1289.5 against 1243 TF,
    stas00/ml-engineering@744d01e MAMF table), both scaled by the same real-shape ratio: a
    large FP8 GEMM takes 1243 / 1289.5 of its BF16 time, where twice the peak would halve it."""
    s, fp8_ops = ops_of(node="gaudi3-node")
    _, bf16_ops = ops_of(node="gaudi3-node", precision="bf16")
    acc = s.cluster.accelerator
    fp8 = op_times(next(op for op in fp8_ops if op.name == "mlp_gate_up"), acc, "fp8").fwd_s
    bf16 = op_times(next(op for op in bf16_ops if op.name == "mlp_gate_up"), acc, "bf16").fwd_s
    assert float(fp8 / bf16) == pytest.approx(1243 / 1289.5, abs=0.003)


def test_fp8_primary_weights_need_an_fp8_plan_and_transformer_engine():
    with pytest.raises(InputError, match="plan.fp8_params"):
        scenario(precision="bf16", fp8_params=True)
    with pytest.raises(InputError, match="plan.fp8_params"):
        scenario(fp8_recipe="tensorwise", fp8_params=True)


def test_the_default_recipe_is_transformer_engine_delayed_scaling():
    assert Plan().fp8_recipe == "delayed"


# ---------------------------------------------------------------- MoE layers (TransformerEngine)

MIXTRAL_H, MIXTRAL_F, TOKENS = 4096, 14336, 4096


def mixtral(**plan):
    base = {"tp": 1, "pp": 1, "dp": 8, "ep": 8, "micro_batch": 1, "global_batch": 64, "precision": "fp8"}
    return compile_scenario(scenario_from_dict({"model": {"preset": "mixtral-8x7b", "seq_len": TOKENS},
                                                "cluster": {"node": "dgx-h100", "nodes": 1},
                                                "plan": {**base, **plan}}))


def test_moe_expert_gemms_run_in_fp8_with_transformer_engine_casts_of_the_dispatched_rows():
    from simulator.layermix import compile_mix, needs_layer_mix

    layout = mixtral()
    assert needs_layer_mix(layout.model)
    mix = compile_mix(layout.model, layout.cluster, layout.plan, layout.shard, layout.groups, layout.per_param, "bf16")
    ops = {op.name: op for op in mix.moe_ops}
    assert ops["expert_fc1"].kind == ops["expert_fc2"].kind == ops["qkv"].kind == FP8_MATMUL
    assert ops["router"].kind == MATMUL  # the router stays in BF16
    # top-2 of 4096 tokens, balanced over 8 ranks with one expert each: 8192 rows per rank,
    # padded to a multiple of 16 (7.5 rows on average); delayed scaling casts input and output
    # gradient to FP8 with their transposes, 2 + 2 B each
    rows = 2 * TOKENS + 7.5
    assert ops["expert_fc1.fp8_cast"].fwd_bytes == pytest.approx(4 * rows * MIXTRAL_H)
    assert ops["expert_fc1.fp8_cast"].bwd_input_bytes == pytest.approx(4 * rows * 2 * MIXTRAL_F)


def test_moe_fp8_weight_copies_cover_attention_and_local_expert_linears():
    bf16, fp8 = mixtral(precision="bf16"), mixtral()
    attention = MIXTRAL_H * (4096 + 2 * 1024) + 4096 * MIXTRAL_H  # qkv and output projection (32 heads, 8 KV)
    experts = 1 * 3 * MIXTRAL_H * MIXTRAL_F  # one local expert: gate, up, down
    extra = fp8.stages[0].states.weights_bytes - bf16.stages[0].states.weights_bytes
    assert float(extra) == pytest.approx(2 * 32 * (attention + experts))  # an FP8 copy and its transpose


def test_fp8_primary_weights_of_moe_layers_keep_no_bf16_copy():
    bf16, primary = mixtral(precision="bf16"), mixtral(fp8_params=True)
    assert float(primary.stages[0].states.weights_bytes) == pytest.approx(float(bf16.stages[0].states.weights_bytes))


DEEPSEEK_4 = {"preset": "deepseek-v3", "mtp_layers": 0, "layers": 4, "dense_layers": 1, "seq_len": TOKENS}


def deepseek(**plan):
    base = {"tp": 1, "pp": 1, "dp": 8, "ep": 8, "micro_batch": 1, "global_batch": 64, "precision": "fp8"}
    return compile_scenario(scenario_from_dict({"model": DEEPSEEK_4, "cluster": {"node": "dgx-h100", "nodes": 1},
                                                "plan": {**base, **plan}}))


def test_mla_fp8_weight_copies_cover_its_five_projections_and_the_mlp_linears():
    # DeepSeek-V3 MLA per layer: q_down 7168x1536, q_up 1536x(128x192), kv_down 7168x(512+64),
    # kv_up 512x(128x(128+128)), output 128x128x7168 = 187,105,280 weights; the dense layer's
    # MLP 3x7168x18432; an MoE layer's shared expert 3x7168x2048 and 256/8 local experts of
    # 3x7168x2048 (the router stays in BF16)
    attention = 11_010_048 + 37_748_736 + 4_128_768 + 16_777_216 + 117_440_512
    assert attention == 187_105_280
    expert = 3 * 7168 * 2048
    linears = 4 * attention + 3 * 7168 * 18432 + 3 * (expert + 32 * expert)
    extra = deepseek().stages[0].states.weights_bytes - deepseek(precision="bf16").stages[0].states.weights_bytes
    assert float(extra) == pytest.approx(2 * linears)  # an FP8 copy and its transpose


def test_mla_fp8_linears_keep_their_inputs_in_fp8():
    """TransformerEngine keeps each linear's input in FP8 (1 B) for its weight gradient: the
    down-projections each their own copy of the normed hidden state (the BF16 one is kept by
    neither), the up-projections the sequence shard of their gathered latent."""
    from simulator.layermix import layer_operators
    saved = {}
    for precision in ("bf16", "fp8"):
        layout = deepseek(precision=precision, tp=2, dp=4, sequence_parallel=True, ep=4)
        saved[precision] = {op.name: op.saved_bytes for op in layer_operators(layout.model, layout.shard, layout.plan)}
    shard_tokens, h = TOKENS // 2, 7168
    change = {name: saved["fp8"][name] - saved["bf16"][name] for name in saved["bf16"]}
    assert change["mla_q_down"] == pytest.approx(-1 * shard_tokens * h)  # 2 B -> 1 B
    assert change["mla_kv_down"] == pytest.approx(1 * shard_tokens * h)  # its own FP8 copy
    assert change["mla_q_up"] == pytest.approx(-1 * shard_tokens * 1536)
    assert change["mla_kv_up"] == pytest.approx(-1 * shard_tokens * 512)
    assert change["attn_out"] == pytest.approx(1 * TOKENS * 128 // 2 * 128)  # FP8 copy beside the kernel's output


@pytest.mark.parametrize("model,plan,field", [
    ({"preset": "mixtral-8x7b", "seq_len": 4096}, {"fp8_recipe": "rowwise"}, "plan.fp8_recipe"),
    ({"preset": "deepseek-v3", "mtp_layers": 0, "layers": 4, "dense_layers": 1}, {"fp8_recipe": "tensorwise"},
     "plan.fp8_recipe"),
])
def test_fp8_moe_and_mla_with_torchao_recipes_are_refused(model, plan, field):
    with pytest.raises(InputError, match=field.replace(".", r"\.") + ".*not yet modelled"):
        scenario_from_dict({"model": model, "cluster": {"node": "dgx-h100", "nodes": 1},
                            "plan": {"tp": 1, "dp": 8, "ep": 8, "global_batch": 8, "precision": "fp8", **plan}})


FSDP_FP8 = dict(fp8_recipe="tensorwise", zero_stage=3, fp8_fsdp_all_gather=True, fp32_params=True)


def test_fsdp_float8_all_gather_moves_linear_weights_in_one_byte():
    # the gathered unit of one layer: its linear weights in FP8 (1 B), its norms in BF16 (2 B)
    from simulator.fp8 import gather_bytes_per_param
    from simulator.states import bytes_per_param, layer_params_local
    s = scenario(**FSDP_FP8)
    linear, params = layer_linear_params(s.model, 1), layer_params_local(s.model, 1)
    per = bytes_per_param("fp8", "fp32", "fp32", True)
    assert gather_bytes_per_param(per, linear, params, s.plan) * params == pytest.approx(linear + 2 * (params - linear))


def test_fsdp_float8_all_gather_leaves_no_weight_cast_in_the_layer():
    # compiled tensorwise: 4 B per input element; the weight arrives in FP8 (8 B per element before)
    _, ops = ops_of(**FSDP_FP8, projections="separate")
    cast = next(op for op in ops if op.name == "qkv.fp8_cast")
    assert cast.fwd_bytes == pytest.approx(4 * B * S * H)


def test_fsdp_float8_all_gather_casts_each_shard_per_gather_and_reads_it_for_the_scales():
    # 8 micro-batches, a gather for each forward and backward: 16 casts of the 1/8 shard
    # (fp32 read, FP8 written: 5 B) and one 4 B read for the max-norm, per step
    from simulator.fp8 import weight_cast_bytes_per_step
    s = scenario(**FSDP_FP8)
    linear = 1e9
    assert float(weight_cast_bytes_per_step(s.plan, linear)) == pytest.approx(linear / 8 * (16 * 5 + 4))


def test_fsdp_float8_all_gather_holds_the_gathered_layers_in_fp8():
    s = scenario(**FSDP_FP8)
    plain = scenario(fp8_recipe="tensorwise", zero_stage=3, fp32_params=True)
    linear = layer_linear_params(s.model, 1)
    # two gathered layers (the one computing, the one prefetched), each linear 1 B lighter
    assert (float(compile_scenario(plain).stages[0].buffer_bytes) - float(compile_scenario(s).stages[0].buffer_bytes)
            == pytest.approx(2 * linear))


@pytest.mark.parametrize("plan", [dict(fp8_recipe="rowwise", zero_stage=3), dict(fp8_recipe="tensorwise", zero_stage=2),
                                  dict(fp8_recipe="delayed", zero_stage=3)])
def test_fsdp_float8_all_gather_needs_tensorwise_fsdp(plan):
    with pytest.raises(InputError, match="plan.fp8_fsdp_all_gather"):
        scenario(fp8_fsdp_all_gather=True, **plan)


def test_hardware_list_shows_the_fp8_peak_only_where_fp8_plans_run(capsys):
    """A100 has no FP8 tensor cores; the MI300X has them and, since its FP8 GEMM rate is
    measured (AMD's FP8/BF16 ratio), runs FP8 plans at its 2614.9 TF dense FP8 peak."""
    from simulator.cli import main

    assert main(["hardware", "list"]) == 0
    rows = {line.split()[0]: line.split() for line in capsys.readouterr().out.splitlines() if line.strip()}
    assert rows["a100-sxm-80gb"][2] == "-"
    assert rows["mi300x"][2] == "2615"


@pytest.mark.parametrize("plan,factors", [
    ({"precision": "fp8", "fp8_recipe": "delayed"}, (0.5, 0.5)),
    ({"precision": "fp8", "fp8_recipe": "current"}, (0.5, 0.5)),
    ({"precision": "mxfp8"}, ((1 + 1 / 32) / 2, (1 + 1 / 32) / 2)),  # E4M3 and an E8M0 scale per 32
    ({"precision": "nvfp4"}, (0.5625 / 2, 0.5625 / 2)),  # E2M1 and an E4M3 scale per 16
    ({"precision": "fp8", "fp8_recipe": "tensorwise"}, (0.5, 1.0)), ({"precision": "bf16"}, (1.0, 1.0))])
def test_sequence_parallel_all_gathers_move_the_recipes_quantized_bytes(plan, factors):
    """TransformerEngine gathers the quantized tensor in both passes (gather_along_first_dim
    with the linear's quantizer); torchao's tensorwise TP the FP8 input in the forward pass."""
    from simulator.fp8 import tp_gather_bytes_factor
    assert tp_gather_bytes_factor(Plan(**plan)) == pytest.approx(factors)


def test_te_fp8_without_userbuffers_gathers_fp8_and_reduces_bf16():
    """Llama 3.1 8B at TP 8 with sequence parallelism under delayed scaling, NCCL (no
    userbuffers): forward two all-gathers of 1 B x 4096 x 4096 and two reduce-scatters of 2 B;
    backward the two output-gradient gathers and the two input re-gathers in 1 B, the two
    reduce-scatters in 2 B."""
    from simulator.comm import collective_time
    from simulator.passes import tp_layer_comm_s
    from simulator.fp8 import tp_gather_bytes_factor
    s = scenario(tp=8, dp=1, global_batch=8, sequence_parallel=True, fp8_recipe="delayed")
    layout = compile_scenario(s)
    tp, cluster = layout.groups.tp, s.cluster
    ag = collective_time("all_gather", 1 * S * H, tp, cluster)
    rs = collective_time("reduce_scatter", 2 * S * H, tp, cluster)
    fwd, bwd = tp_layer_comm_s(s.model, layout.shard, layout.groups, cluster, tp_gather_bytes_factor(s.plan))
    assert (float(fwd), float(bwd)) == pytest.approx((float(2 * ag + 2 * rs), float(4 * ag + 2 * rs)), rel=1e-12)
