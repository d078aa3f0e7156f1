"""NVFP4 linears as TransformerEngine's NVFP4BlockScaling runs them on Blackwell: the layer's
linears run all three GEMMs in NVFP4 at the measured FP4 rate, with TE's amax pass and fused
Hadamard-cast kernel per input and output gradient, and keep FP4 copies in memory. Expected
values are worked by hand from the TE kernels' reads and writes (fp8.py's docstring) and the
B200 profile's sourced numbers (9000 TF dense FP4; 0.579 of it with 5.6e10 FLOPs of start-up)."""

from pathlib import Path

import pytest
import yaml

from simulator import InputError, scenario_from_dict
from simulator.compute import NVFP4_MATMUL, op_times
from simulator.fp8 import fp8_layer_ops, weight_bytes_per_param, weight_cast_bytes_per_step
from simulator.importers import import_config
from simulator.workload import ATTENTION, MATMUL, Shard, head_ops, layer_ops

B, S, H, KV, F = 1, 4096, 4096, 1024, 14336
FP4 = 0.5 + 1 / 16  # an E2M1 value and its share of one E4M3 scale per 16


def scenario(node="dgx-b200", preset="llama-3.1-8b", **plan):
    base = {"tp": 1, "pp": 1, "dp": 8, "micro_batch": 1, "global_batch": 64, "precision": "nvfp4"}
    return scenario_from_dict({"model": {"preset": preset, "seq_len": S},
                               "cluster": {"node": node, "nodes": 1}, "plan": {**base, **plan}})


def ops_of(**kw):
    s = scenario(**kw)
    shard = Shard(micro_batch=B, seq_len=S)
    return {op.name: op for op in fp8_layer_ops(layer_ops(s.model, shard), shard, s.plan, s.model)}


def test_the_layer_linears_become_nvfp4_gemms_and_attention_and_lm_head_stay_bf16():
    ops = ops_of()
    assert {n for n, op in ops.items() if op.kind == NVFP4_MATMUL} == {"qkv", "attn_out", "mlp_gate_up", "mlp_down"}
    assert ops["flash_attention"].kind == ATTENTION
    assert {op.kind for op in head_ops(scenario().model, Shard(B, S)) if op.name == "lm_head"} == {MATMUL}


def test_an_nvfp4_gemm_runs_at_the_b200s_fp4_peak_times_its_measured_efficiency():
    qkv = ops_of()["qkv"]
    flops = 2 * B * S * H * (H + 2 * KV)
    expected_s = (flops + 5.6e10) / (9000e12 * 0.579)
    assert float(op_times(qkv, scenario().cluster.accelerator, "bf16").fwd_s) == pytest.approx(expected_s)


def test_an_nvfp4_gemm_reads_half_a_byte_and_a_sixteenth_per_operand_element():
    qkv = ops_of()["qkv"]
    x, w, y = B * S * H, H * (H + 2 * KV), B * S * (H + 2 * KV)
    assert qkv.fwd_bytes == pytest.approx(FP4 * (x + w) + 2 * y)  # the output written in BF16
    assert qkv.bwd_weight_bytes == pytest.approx(FP4 * (y + x) + 2 * w)


def test_casts_are_an_amax_pass_and_one_kernel_writing_both_fp4_copies():
    # input: read 2 B for the amax, read 2 B again and write the row-wise and the Hadamard
    # column-wise FP4 copies; the output gradient the same; the weight is cast once a step
    cast = ops_of()["mlp_gate_up.nvfp4_cast"]
    per_element = 2 + 2 + 2 * FP4
    assert cast.fwd_bytes == pytest.approx(per_element * B * S * H)
    assert cast.bwd_input_bytes == pytest.approx(per_element * B * S * 2 * F)


def test_a_biased_linear_reads_its_output_gradient_once_more_for_the_bias_gradient():
    # GPT-3-like model with biases: TE's bgrad has no fused NVFP4 path (sum, then quantise)
    s = scenario(preset="megatron-gpt-1.7b")
    shard = Shard(micro_batch=B, seq_len=S)
    ops = {op.name: op for op in fp8_layer_ops(layer_ops(s.model, shard), shard, s.plan, s.model)}
    d_out = 4 * s.model.hidden  # the GeLU MLP's up projection
    assert ops["mlp_up.nvfp4_cast"].bwd_input_bytes == pytest.approx((2 + 2 + 2 * FP4 + 2) * B * S * d_out)


def test_a_linear_keeps_its_input_as_the_column_wise_fp4_copy():
    bf16 = {op.name: op for op in layer_ops(scenario().model, Shard(B, S))}
    ops = ops_of()
    # attention's output keeps its BF16 copy for the attention kernel; the projection adds FP4
    assert ops["attn_out"].saved_bytes - bf16["attn_out"].saved_bytes == pytest.approx(FP4 * B * S * H)
    assert ops["mlp_down"].saved_bytes - bf16["mlp_down"].saved_bytes == pytest.approx((FP4 - 2) * B * S * F)


def test_weights_keep_both_fp4_copies_beside_bf16_or_alone_as_fp4_primary_weights():
    assert weight_bytes_per_param(scenario().plan) == pytest.approx((2 + 2 * FP4, 2.0))
    assert weight_bytes_per_param(scenario(fp8_params=True).plan) == pytest.approx((2 * FP4, FP4))


def test_weights_are_cast_once_a_step_or_only_transposed_as_fp4_primary_weights():
    assert weight_cast_bytes_per_step(scenario().plan, 1000.0) == pytest.approx(1000 * (2 + 2 + 2 * FP4))
    assert weight_cast_bytes_per_step(scenario(fp8_params=True).plan, 1000.0) == pytest.approx(1000 * 2 * FP4)


def test_nvfp4_is_refused_where_no_fp4_gemm_rate_is_measured():
    with pytest.raises(InputError, match="plan.precision"):
        scenario(node="dgx-h100")  # Hopper has no FP4 tensor cores
    with pytest.raises(InputError, match="plan.precision"):
        scenario(node="mi355x-node")  # MXFP4 hardware: no NVFP4 peak or rate


def test_bf16_layers_at_the_ends_are_allowed_beside_nvfp4_linears():
    assert scenario(bf16_layers_at_end=4).plan.bf16_layers_at_end == 4


MEGATRON_ARGV = ["--num-layers", "24", "--hidden-size", "2048", "--num-attention-heads", "16", "--seq-length", "2048",
                 "--max-position-embeddings", "2048", "--micro-batch-size", "1", "--global-batch-size", "64", "--bf16",
                 "--use-distributed-optimizer"]


def megatron(*argv):
    return import_config("megatron", None, {"cluster.node": "dgx-b200"}, argv=[*MEGATRON_ARGV, *argv]).scenario["plan"]


def test_megatron_fp4_format_is_nvfp4_and_fp4_param_gather_its_primary_weights():
    """--fp4-format e2m1 (--fp4-recipe nvfp4 by default) and --fp4-param-gather
    (NVIDIA/Megatron-LM@d98e8a64dd megatron/core/fp4_utils.py, megatron/training/arguments.py)."""
    assert megatron("--fp4-format", "e2m1")["precision"] == "nvfp4"
    plan = megatron("--fp4-format", "e2m1", "--fp4-param-gather", "--first-last-layers-bf16")
    assert (plan["fp8_params"], plan["bf16_layers_at_start"], plan["bf16_layers_at_end"]) == (True, 1, 1)


def test_megatron_fp4_beside_fp8_or_with_a_custom_quantizer_is_refused():
    with pytest.raises(InputError, match="fp4-format"):
        megatron("--fp4-format", "e2m1", "--fp8-format", "hybrid")
    with pytest.raises(InputError, match="fp4-recipe"):
        megatron("--fp4-format", "e2m1", "--fp4-recipe", "custom")


def test_megatron_bridge_nvfp4_mixed_precision_is_nvfp4_with_fp4_primary_weights(tmp_path):
    """Megatron-Bridge's bf16_with_nvfp4_mixed (NVIDIA-NeMo/Megatron-Bridge@067f987df
    src/megatron/bridge/training/mixed_precision.py): fp4 e2m1, recipe nvfp4, fp4_param_gather,
    written over a saved run config's FP8 fields."""
    config = yaml.safe_load((Path(__file__).parent / "data" / "imports" /
                             "bridge-llama3_8b_sft_gb200_fp8_mx_v1.yaml").read_text())
    config["mixed_precision"].update(fp8=None, fp8_param=False, fp8_param_gather=False, fp4="e2m1",
                                     fp4_param=True, fp4_param_gather=True)
    path = tmp_path / "bridge-nvfp4.yaml"
    path.write_text(yaml.safe_dump(config))
    plan = import_config("megatron", path, {"cluster.node": "dgx-b200"}).scenario["plan"]
    assert (plan["precision"], plan["fp8_params"]) == ("nvfp4", True)
