"""Model specs: parameter counts, presets and Hugging Face config import."""

import json
from pathlib import Path

import pytest

from simulator.errors import InputError
from simulator.model import available_presets, load_hf_config, load_preset, model_from_dict

HF = Path(__file__).parent / "data" / "hf"


def test_gpt_parameter_count_matches_megatron_formula():
    m = load_preset("gpt3-175b")
    l, h, V, s = m.layers, m.hidden, m.vocab, m.seq_len
    # Narayanan et al. 2021 Eq. 2: 12lh²(1 + 13/12h + (V+s)/12lh), plus the final layernorm (2h)
    assert m.params() == pytest.approx(12 * l * h**2 * (1 + 13 / (12 * h) + (V + s) / (12 * l * h)) + 2 * h, rel=1e-12)


@pytest.mark.parametrize("preset,published", [
    ("llama-2-7b", 6_738_415_616),  # Hugging Face model card parameter count
    ("llama-3.1-8b", 8_030_261_248),
    ("mistral-7b", 7_241_732_096),
])
def test_llama_family_parameter_counts_match_the_releases(preset, published):
    assert load_preset(preset).params() == published


def test_every_preset_loads():
    assert len(available_presets()) >= 18
    for name in available_presets():
        assert load_preset(name).params() > 0


def test_llama_config_json_imports_gqa_and_swiglu():
    m = load_hf_config(str(HF / "llama-3.1-8b.json"), seq_len=8192)
    assert (m.layers, m.hidden, m.heads, m.kv_heads, m.ffn_hidden, m.vocab) == (32, 4096, 32, 8, 14336, 128256)
    assert (m.activation, m.norm, m.position_embedding, m.tied_embeddings) == ("swiglu", "rmsnorm", "rope", False)


def test_gpt2_config_json_defaults_ffn_to_4h_and_ties_embeddings():
    cfg = json.loads((HF / "gpt2.json").read_text())
    m = load_hf_config(str(HF / "gpt2.json"), seq_len=1024)
    assert m.ffn_hidden == 4 * cfg["n_embd"] and m.tied_embeddings and m.activation == "gelu"
    assert m.params() == pytest.approx(124_439_808, rel=1e-3)  # GPT-2 small, as counted by transformers


@pytest.mark.parametrize("name", ["mistral-7b-v0.1", "qwen2-7b"])
def test_other_hf_families_import(name):
    m = load_hf_config(str(HF / f"{name}.json"), seq_len=4096)
    assert m.kv_heads < m.heads and m.activation == "swiglu"


def test_preset_fields_can_be_overridden():
    m = model_from_dict({"preset": "llama-3.1-8b", "seq_len": 4096})
    assert m.seq_len == 4096 and m.hidden == 4096


def test_unknown_preset_names_the_known_ones():
    with pytest.raises(InputError, match="model.preset.*known presets"):
        model_from_dict({"preset": "gpt-7"})
