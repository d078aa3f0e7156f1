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
