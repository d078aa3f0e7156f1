"""Training FLOPs of GPT models equal Megatron-LM's published formula (Narayanan et al. 2021)."""

import pytest
from hypothesis import given, settings, strategies as st

from simulator.model import ModelSpec
from simulator.workload import model_flops_per_sequence, recompute_flops_per_sequence


def gpt(layers, hidden, heads, seq, vocab):
    return ModelSpec(name="gpt", layers=layers, hidden=hidden, heads=heads, kv_heads=heads, ffn_hidden=4 * hidden,
                     vocab=vocab, seq_len=seq, activation="gelu", dropout=True)


def megatron_flops(l, h, s, V, recompute: bool) -> float:
    """Eq. 3 of Narayanan et al. 2021 for one sequence (B = 1)."""
    if recompute:
        return 96 * s * l * h**2 * (1 + s / (6 * h) + V / (16 * l * h))
    return 72 * s * l * h**2 * (1 + s / (6 * h) + V / (12 * l * h))


gpt_shapes = st.tuples(st.integers(1, 128), st.sampled_from([64, 128, 1024, 2304, 12288]),
                       st.sampled_from([512, 1024, 2048, 8192]), st.sampled_from([32000, 50257, 51200]))


@given(gpt_shapes)
@settings(max_examples=40, deadline=None)
def test_model_flops_equal_megatron_formula_without_recompute(shape):
    l, h, s, V = shape
    m = gpt(l, h, 8 if h % 8 == 0 else 1, s, V)
    assert model_flops_per_sequence(m) == pytest.approx(megatron_flops(l, h, s, V, False), rel=1e-12)


@given(gpt_shapes)
@settings(max_examples=40, deadline=None)
def test_full_recompute_hardware_flops_equal_megatron_formula(shape):
    l, h, s, V = shape
    m = gpt(l, h, 8 if h % 8 == 0 else 1, s, V)
    hw = model_flops_per_sequence(m) + recompute_flops_per_sequence(m, "full", flash_attention=False)
    assert hw == pytest.approx(megatron_flops(l, h, s, V, True), rel=1e-12)


def test_selective_recompute_adds_the_attention_core_forward():
    m = gpt(24, 2048, 16, 2048, 51200)
    # QK^T and AV each 2·s²·h per layer (Korthikanti et al. 2022, Sec. 5)
    assert recompute_flops_per_sequence(m, "selective", flash_attention=False) == 24 * 4 * 2048**2 * 2048


def test_selective_recompute_with_flash_attention_recomputes_nothing():
    m = gpt(24, 2048, 16, 2048, 51200)
    assert recompute_flops_per_sequence(m, "selective", flash_attention=True) == 0.0


def test_swiglu_gqa_flops_count_three_mlp_matrices_and_narrow_kv():
    m = ModelSpec(name="llama", layers=1, hidden=4096, heads=32, kv_heads=8, ffn_hidden=14336, vocab=128256,
                  seq_len=8192, activation="swiglu", norm="rmsnorm", position_embedding="rope", bias=False,
                  tied_embeddings=False)
    s, h, f, kv, V = 8192, 4096, 14336, 1024, 128256
    fwd = 2 * s * h * (h + 2 * kv) + 2 * s * h * h + 2 * s * h * 3 * f + 4 * s * s * h + 2 * s * h * V
    assert model_flops_per_sequence(m) == pytest.approx(3 * fwd, rel=1e-12)
