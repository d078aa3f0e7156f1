"""Separate projection linears (torchtitan's wq/wk/wv and w1/w3) against one fused GEMM each:
each GEMM timed on its own shape, the input gradients summed as Inductor or autograd sums them."""

from dataclasses import replace

import pytest

from simulator.compute import FP8_MATMUL, op_times
from simulator.fp8 import fp8_layer_ops
from simulator.hardware import Accelerator, Efficiency
from simulator.hostbound import launches
from simulator.model import ModelSpec, load_preset
from simulator.moe import ExpertShard
from simulator.plan import Plan
from simulator.projections import separate_ops
from simulator.recompute import layer_checkpoint
from simulator.workload import MEMORY, Shard, layer_ops

# grouped-query attention: K and V are a quarter of Q's width
LLAMA = ModelSpec(name="llama", layers=32, hidden=4096, heads=32, kv_heads=8, ffn_hidden=14336, vocab=128256,
                  seq_len=8192, activation="swiglu", norm="rmsnorm", position_embedding="rope", bias=False,
                  tied_embeddings=False, dropout=False)
T, H, Q, KV, F = 8192, 4096, 4096, 1024, 14336
SHARD = Shard(micro_batch=1, seq_len=T)
# a tensor core fast enough that a narrow GEMM waits on HBM: 400 TFLOP/s and 1.6 TB/s achieved
ACC = Accelerator(name="toy", description="", peak_flops={"bf16": 800e12, "fp8": 1600e12}, hbm_bytes=80 * 2**30,
                  hbm_bytes_per_s=2e12, host_link_bytes_per_s=25e9, tdp_w=700, price_usd_per_hour=1.0,
                  framework_overhead_bytes=0, matmul=Efficiency(0.5, 0.0), matmul_fp8=Efficiency(0.5, 0.0),
                  attention=Efficiency(0.5, 0.0), memory=Efficiency(0.8, 0.0))


def ops(**plan):
    p = Plan(**plan)
    return separate_ops(fp8_layer_ops(layer_ops(LLAMA, SHARD), SHARD, p), SHARD, p)


def named(op_list, name):
    return next(op for op in op_list if op.name == name)


def gemm_s(width, extra_bytes=0.0, rate=400e12):
    """One bf16 GEMM of T x H -> T x width: the slower of its FLOPs and its bytes (inputs,
    weight, output; plus `extra_bytes`), worked out by hand."""
    flops = 2 * T * H * width
    nbytes = 2 * (T * H + H * width + T * width) + extra_bytes
    return max(flops / rate, nbytes / 1.6e12)


def test_fused_projections_are_one_gemm_each():
    fused = ops()
    assert not named(fused, "qkv").pieces and not any(op.name.endswith("_grad_sum") for op in fused)
    assert op_times(named(fused, "qkv"), ACC, "bf16").fwd_s == pytest.approx(gemm_s(Q + 2 * KV))


def test_separate_projections_time_each_gemm_on_its_own_shape():
    # wq: 275 GFLOP in 0.69 ms; wk and wv: 69 GFLOP each (0.17 ms) and 92 MB of traffic (0.058 ms)
    qkv = named(ops(projections="separate"), "qkv")
    assert [p.name for p in qkv.pieces] == ["wq", "wk", "wv"]
    assert op_times(qkv, ACC, "bf16").fwd_s == pytest.approx(gemm_s(Q) + 2 * gemm_s(KV))


def test_a_narrow_projection_waits_on_memory_where_the_fused_gemm_does_not():
    fast = Accelerator(**{**ACC.__dict__, "peak_flops": {"bf16": 8000e12}})  # 4 PFLOP/s achieved
    separate, fused = named(ops(projections="separate"), "qkv"), named(ops(), "qkv")
    wk = 2 * (T * H + H * KV + T * KV) / 1.6e12  # memory-bound: reading the input dominates
    assert op_times(separate.pieces[1], fast, "bf16").fwd_s == pytest.approx(wk)
    assert op_times(separate, fast, "bf16").fwd_s > op_times(fused, fast, "bf16").fwd_s


def test_compiled_input_gradients_accumulate_in_the_next_gemms_epilogue():
    # Inductor: mm, then addmm(running sum) for wk and wv: each reads the T x H sum once more
    qkv = named(ops(projections="separate"), "qkv")
    grad = 2 * T * H
    assert op_times(qkv, ACC, "bf16").bwd_input_s == pytest.approx(
        gemm_s(Q) + 2 * gemm_s(KV, extra_bytes=grad))
    assert not any(op.name.endswith("_grad_sum") for op in ops(projections="separate"))


def test_fp8_input_gradients_are_summed_by_one_kernel_reading_each_and_writing_one():
    layer = ops(projections="separate", precision="fp8", fp8_recipe="tensorwise")
    assert named(layer, "qkv").pieces[0].kind == FP8_MATMUL
    assert named(layer, "qkv_grad_sum").bwd_input_bytes == pytest.approx((3 + 1) * 2 * T * H)
    assert named(layer, "mlp_gate_up_grad_sum").bwd_input_bytes == pytest.approx((2 + 1) * 2 * T * H)
    assert named(layer, "qkv_grad_sum").kind == MEMORY and named(layer, "qkv_grad_sum").fwd_bytes == 0


def test_an_fp8_projection_reads_its_fp8_operands_once_each():
    wk = named(ops(projections="separate", precision="fp8", fp8_recipe="tensorwise"), "qkv").pieces[1]
    assert wk.fwd_bytes == pytest.approx(1 * (T * H + H * KV) + 2 * T * KV)  # FP8 x and W in, BF16 out


def test_eager_autograd_adds_each_further_gradient_reading_both_and_writing_one():
    layer = ops(projections="separate", compile=False)
    assert named(layer, "qkv_grad_sum").bwd_input_bytes == pytest.approx(2 * 3 * 2 * T * H)
    assert named(layer, "mlp_gate_up_grad_sum").bwd_input_bytes == pytest.approx(1 * 3 * 2 * T * H)


def test_separate_projections_keep_the_layer_flops_and_its_saved_activations():
    fused, separate = ops(), ops(projections="separate")
    assert sum(op.flops for op in separate) == pytest.approx(sum(op.flops for op in fused))
    assert sum(op.saved_bytes for op in separate) == sum(op.saved_bytes for op in fused)
    gate_up = named(separate, "mlp_gate_up")
    assert [(p.name, p.fwd_flops) for p in gate_up.pieces] == [("w1", 2 * T * H * F), ("w3", 2 * T * H * F)]


def test_op_level_recompute_reruns_the_separate_wk_gemm_itself():
    # torchtitan's op-level SAC recomputes every other matmul: wk, wo and w3 of a Llama block
    layer = ops(projections="separate")
    rerun = {op.name: op for op in layer_checkpoint(LLAMA, SHARD, "op-selective", layer).rerun}
    assert rerun["wk"] is named(layer, "qkv").pieces[1]
    assert rerun["w3"] is named(layer, "mlp_gate_up").pieces[1]


def test_separate_projections_launch_a_gemm_each_and_their_gradient_sum_only_backward():
    fused, separate = ops(compile=False), ops(projections="separate", compile=False)
    n_f, n_b = launches(fused)
    # wq/wk/wv and w1/w3 for qkv and gate/up: 3 more GEMMs, twice in the backward pass; the
    # eager sums of their input gradients: two backward kernels
    assert launches(separate) == (n_f + 3, n_b + 2 * 3 + 2)


def test_torchtitan_experts_run_gate_and_up_as_two_grouped_gemms_summed_by_one_kernel():
    # Qwen3-30B-A3B on EP 8: 16 local experts; top-8 of 4096 tokens, balanced: T·k = 32768
    # rows of width 2048 into gate and up of 768 each. _grouped_mm matches no addmm pattern:
    # one kernel reads the two input gradients and writes their sum, compiled or not.
    m, shard, rows = load_preset("qwen3-30b-a3b"), Shard(micro_batch=1, seq_len=4096), 4096 * 8
    p = Plan(projections="separate")
    layer = separate_ops(fp8_layer_ops(layer_ops(m, shard, ExpertShard(8, 1)), shard, p), shard, p)
    fc1 = named(layer, "expert_fc1")
    assert [piece.name for piece in fc1.pieces] == ["expert_w1", "expert_w3"]
    for piece in fc1.pieces:
        assert piece.kernels == 16 and piece.fwd_flops == 2 * rows * 2048 * 768
        assert piece.fwd_bytes == pytest.approx(2 * (rows * 2048 + 16 * 2048 * 768 + rows * 768))
    assert named(layer, "expert_fc1_grad_sum").bwd_input_bytes == pytest.approx(3 * 2 * rows * 2048)


def test_ungated_experts_stay_one_grouped_gemm_under_separate_projections():
    m, shard = replace(load_preset("qwen3-30b-a3b"), activation="gelu"), Shard(micro_batch=1, seq_len=4096)
    p = Plan(projections="separate")
    layer = separate_ops(layer_ops(m, shard, ExpertShard(8, 1)), shard, p)
    assert not named(layer, "expert_fc1").pieces and not any(op.name == "expert_fc1_grad_sum" for op in layer)
