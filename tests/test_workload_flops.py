"""Training FLOPs of GPT models against Megatron-LM's published formula (Narayanan et al. 2021),
worked by hand for the two conventions: model FLOPs count causal attention over its unmasked
half (what the math needs: MFU); executed FLOPs are what the kernels run (HFU)."""

import pytest
from hypothesis import given, settings, strategies as st

from simulator.model import ModelSpec
from simulator.workload import executed_flops_per_sequence, model_flops_per_sequence


def gpt(layers, hidden, heads, seq, vocab):
    return ModelSpec(name="gpt", layers=layers, hidden=hidden, heads=heads, kv_heads=heads, ffn_hidden=4 * hidden,
                     vocab=vocab, seq_len=seq, activation="gelu", dropout=True)


def megatron_flops(l, h, s, V, recompute: bool) -> float:
    """Eq. 3 of Narayanan et al. 2021 for one sequence (B = 1): the full s x s attention."""
    if recompute:
        return 96 * s * l * h**2 * (1 + s / (6 * h) + V / (16 * l * h))
    return 72 * s * l * h**2 * (1 + s / (6 * h) + V / (12 * l * h))


gpt_shapes = st.tuples(st.integers(1, 128), st.sampled_from([64, 128, 1024, 2304, 12288]),
                       st.sampled_from([512, 1024, 2048, 8192]), st.sampled_from([32000, 50257, 51200]))


@given(gpt_shapes)
@settings(max_examples=40, deadline=None)
def test_model_flops_are_megatron_formula_with_causal_attention_halved(shape):
    # Megatron's s/6h term is QK^T and AV over the full s x s; causal masking leaves half: s/12h
    l, h, s, V = shape
    m = gpt(l, h, 8 if h % 8 == 0 else 1, s, V)
    expected = 72 * s * l * h**2 * (1 + s / (12 * h) + V / (12 * l * h))
    assert model_flops_per_sequence(m) == pytest.approx(expected, rel=1e-12)


@given(gpt_shapes)
@settings(max_examples=40, deadline=None)
def test_materialised_attention_with_full_recompute_executes_megatron_formula(shape):
    # the unfused path computes the whole score matrix and recomputes every forward: Eq. 3 as printed
    l, h, s, V = shape
    m = gpt(l, h, 8 if h % 8 == 0 else 1, s, V)
    assert executed_flops_per_sequence(m, False, "full") == pytest.approx(megatron_flops(l, h, s, V, True), rel=1e-12)
    assert executed_flops_per_sequence(m, False, "none") == pytest.approx(megatron_flops(l, h, s, V, False),
                                                                         rel=1e-12)


def test_flash_attention_executes_half_the_forward_and_five_halves_in_the_backward():
    # per layer: forward QK^T + AV over the causal half = 2 s^2 h; backward dQ, dK, dV, dP and the
    # recomputed QK^T = 5 s^2 h (FlashAttention-2); everything else as Megatron's formula
    l, h, s, V = 24, 2048, 2048, 51200
    m = gpt(l, h, 16, s, V)
    expected = 72 * s * l * h**2 * (1 + V / (12 * l * h)) + l * 7 * s**2 * h
    assert executed_flops_per_sequence(m, True, "none") == pytest.approx(expected, rel=1e-12)


def test_selective_recompute_adds_the_attention_core_forward():
    m = gpt(24, 2048, 16, 2048, 51200)
    # QK^T and AV each 2·s²·h per layer over the full matrix (Korthikanti et al. 2022, Sec. 5)
    extra = executed_flops_per_sequence(m, False, "selective") - executed_flops_per_sequence(m, False, "none")
    assert extra == 24 * 4 * 2048**2 * 2048


def test_selective_recompute_with_flash_attention_reruns_the_causal_flash_forward():
    m = gpt(24, 2048, 16, 2048, 51200)
    # Megatron-LM checkpoints the core attention whatever its kernel: the flash forward runs
    # again, QK^T and AV over the causal half, 2·s²·h per layer
    extra = executed_flops_per_sequence(m, True, "selective") - executed_flops_per_sequence(m, True, "none")
    assert extra == 24 * 2 * 2048**2 * 2048


def test_executed_flops_never_fall_below_model_flops():
    m = gpt(24, 2048, 16, 8192, 51200)
    for flash in (True, False):
        for recompute in ("none", "selective", "full"):
            assert executed_flops_per_sequence(m, flash, recompute) >= model_flops_per_sequence(m)


def test_swiglu_gqa_flops_count_three_mlp_matrices_and_narrow_kv():
    m = ModelSpec(name="llama", layers=1, hidden=4096, heads=32, kv_heads=8, ffn_hidden=14336, vocab=128256,
                  seq_len=8192, activation="swiglu", norm="rmsnorm", position_embedding="rope", bias=False,
                  tied_embeddings=False)
    s, h, f, kv, V = 8192, 4096, 14336, 1024, 128256
    # forward: QKV, output projection, three MLP matrices, causal QK^T + AV (half of 4 s^2 h), lm_head
    fwd = 2 * s * h * (h + 2 * kv) + 2 * s * h * h + 2 * s * h * 3 * f + 2 * s * s * h + 2 * s * h * V
    assert model_flops_per_sequence(m) == pytest.approx(3 * fwd, rel=1e-12)


def test_a_head_dim_independent_of_hidden_sets_the_attention_widths():
    # Qwen3-style: 32 query heads of 128 on a 2048-wide residual stream (q width 4096 != hidden)
    m = ModelSpec(name="wide-heads", layers=2, hidden=2048, heads=32, kv_heads=8, head_dim=128, ffn_hidden=6144,
                  vocab=32000, seq_len=4096, activation="swiglu", norm="rmsnorm", position_embedding="rope",
                  bias=False, tied_embeddings=False)
    from simulator.workload import Shard, layer_ops
    ops = {op.name: op for op in layer_ops(m, Shard(1, 4096))}
    t, h, q, kv = 4096, 2048, 32 * 128, 8 * 128
    assert ops["qkv"].fwd_flops == 2 * t * h * (q + 2 * kv)
    assert ops["attn_out"].fwd_flops == 2 * t * q * h
    assert ops["flash_attention"].fwd_flops == 2 * t * 4096 * q  # causal half of QK^T and AV


def test_a_head_dim_independent_of_hidden_is_evaluated():
    from simulator import evaluate, scenario_from_dict
    s = scenario_from_dict({"model": {"preset": "llama-3.1-8b", "head_dim": 64, "seq_len": 4096},
                            "cluster": {"node": "dgx-h100", "nodes": 1},
                            "plan": {"tp": 8, "micro_batch": 1, "global_batch": 8}})
    assert evaluate(s, "analytic").step_time_s > 0
