"""Hugging Face config.json import: MoE and latent-attention families, what is refused, where
the file is found, the model's name and its training sequence length."""

import json
import shutil
from pathlib import Path

import pytest

from simulator.errors import InputError
from simulator.model import load_hf_config, model_from_dict
from simulator.scenario import load_scenario, read_scenario

HF = Path(__file__).parent / "data" / "hf"


def _config(name: str) -> dict:
    return json.loads((HF / f"{name}.json").read_text())


def _write(tmp_path, cfg: dict, name="config.json") -> str:
    path = tmp_path / name
    path.write_text(json.dumps(cfg))
    return str(path)


def test_mixtral_config_imports_as_eight_experts_top_two():
    m = load_hf_config(str(HF / "mixtral-8x7b-instruct-v0.1.json"), seq_len=4096)
    assert (m.experts, m.top_k, m.expert_ffn_hidden, m.moe_layers, m.seq_len) == (8, 2, 14336, 32, 4096)


def test_deepseek_v3_config_imports_mla_shared_expert_dense_layers_and_mtp():
    m = load_hf_config(str(HF / "deepseek-v3.json"), seq_len=4096)
    assert (m.attention, m.q_lora_rank, m.kv_lora_rank, m.qk_nope_head_dim, m.qk_rope_head_dim, m.v_head_dim) == \
        ("mla", 1536, 512, 128, 64, 128)
    assert (m.experts, m.top_k, m.shared_experts, m.shared_expert_ffn_hidden, m.dense_layers, m.ffn_hidden,
            m.mtp_layers) == (256, 8, 1, 2048, 3, 18432, 1)


def test_kimi_k2_config_imports_as_deepseek_v3s_architecture(tmp_path):
    # moonshotai/Kimi-K2-Instruct's config.json differs from DeepSeek-V3's in the shape keys
    # below (the model card's architecture table; its architectures: DeepseekV3ForCausalLM)
    cfg = dict(_config("deepseek-v3"), model_type="kimi_k2", num_attention_heads=64, num_key_value_heads=64,
               n_routed_experts=384, first_k_dense_replace=1, num_nextn_predict_layers=0, vocab_size=163840,
               n_group=1, topk_group=1)
    m = load_hf_config(_write(tmp_path, cfg), seq_len=4096)
    assert (m.attention, m.heads, m.experts, m.top_k, m.shared_experts, m.dense_layers, m.mtp_layers) == \
        ("mla", 64, 384, 8, 1, 1, 0)
    # by hand: MLA's q_a 7168 x 1536 + its norm, q_b 1536 x 64 x 192, kv_a 7168 x 576 + the 512
    # latent's norm, kv_b 512 x 64 x 256, o 64 x 128 x 7168; one dense SwiGLU of 18432, 60 MoE
    # layers of a 7168 x 384 router and 385 experts of 3 x 7168 x 2048; two norms a layer,
    # untied 163840 x 7168 tables and the final norm: the model card's "1T total"
    attention = 7168 * 1536 + 1536 + 1536 * 64 * 192 + 7168 * 576 + 512 + 512 * 64 * 256 + 64 * 128 * 7168
    layers = 61 * (attention + 2 * 7168) + 3 * 7168 * 18432 + 60 * (7168 * 384 + 385 * 3 * 7168 * 2048)
    assert m.params() == layers + 2 * 163840 * 7168 + 7168 == 1_026_408_209_408
    assert round(m.active_params() / 1e9) == 33  # the card's "32B activated", both tables counted
    preset = model_from_dict({"preset": "kimi-k2", "seq_len": 4096})
    assert preset.params() == m.params() and preset.active_params() == m.active_params()


def test_qwen2_moe_config_imports_its_shared_expert():
    # Qwen1.5-MoE-A2.7B: 24 layers of 60 experts (1408, top-4) + one shared expert of 5632,
    # hidden 2048, 16 heads with biases on Q, K and V, vocab 151936 untied; Qwen's blog: "14.3B
    # parameters in total".
    m = load_hf_config(str(HF / "qwen1.5-moe-a2.7b.json"), seq_len=4096)
    h = 2048
    layer = 4 * h * h + 3 * h + 60 * 3 * h * 1408 + 3 * h * 5632 + 60 * h + 2 * h
    assert (m.shared_experts, m.shared_expert_ffn_hidden) == (1, 5632)
    assert m.params() == 24 * layer + 2 * 151936 * h + h and round(m.params() / 1e9, 1) == 14.3


def test_gpt_oss_config_imports_biases_head_dim_and_alternating_windows():
    m = load_hf_config(str(HF / "gpt-oss-120b.json"), seq_len=4096)
    assert (m.bias, m.head_dim, m.q_width, m.sliding_window, m.sliding_window_freq) == (True, 64, 4096, 128, 2)
    assert [m.is_sliding_window_layer(i) for i in range(4)] == [True, False, True, False]


def test_the_name_comes_from_name_or_path_else_model_type():
    assert load_hf_config(str(HF / "qwen1.5-moe-a2.7b.json"), seq_len=4096).name == "Qwen1.5-MoE-A2.7B"
    assert load_hf_config(str(HF / "mixtral-8x22b-v0.1.json"), seq_len=4096).name == "mixtral"


def test_seq_len_is_required_and_never_max_position_embeddings():
    with pytest.raises(InputError, match=r"^model\.seq_len: got None; required with hf_config"):
        model_from_dict({"hf_config": str(HF / "qwen2-7b.json")})
    m = model_from_dict({"hf_config": str(HF / "qwen2-7b.json"), "seq_len": 4096})
    assert m.seq_len == 4096 and _config("qwen2-7b")["max_position_embeddings"] == 131072


def test_gpt2_seq_len_cannot_exceed_its_learned_position_table():
    with pytest.raises(InputError, match=r"model\.seq_len.*n_positions=1024"):
        load_hf_config(str(HF / "gpt2.json"), seq_len=2048)


def test_mistral_sliding_window_is_kept_on_every_layer():
    from simulator import scenario_from_dict
    plan = {"tp": 8, "micro_batch": 1, "global_batch": 8}
    cluster = {"node": "dgx-h100", "nodes": 1}
    path = str(HF / "mistral-7b-v0.1.json")
    s = scenario_from_dict({"model": {"hf_config": path, "seq_len": 8192}, "cluster": cluster, "plan": plan})
    assert (s.model.sliding_window, s.model.sliding_window_freq) == (4096, 1)


def test_an_unknown_model_type_with_expert_keys_is_refused_naming_the_key(tmp_path):
    cfg = {**_config("mixtral-8x7b-instruct-v0.1"), "model_type": "brand_new_moe"}
    with pytest.raises(InputError, match=r"\.num_local_experts: got 8; model_type 'brand_new_moe'"):
        load_hf_config(_write(tmp_path, cfg), seq_len=4096)


def test_an_unknown_model_type_with_latent_attention_keys_is_refused(tmp_path):
    cfg = {**_config("llama-3.1-8b"), "model_type": "latent_llama", "kv_lora_rank": 512}
    with pytest.raises(InputError, match=r"\.kv_lora_rank: got 512"):
        load_hf_config(_write(tmp_path, cfg), seq_len=4096)


@pytest.mark.parametrize("cfg", [
    # Falcon: attention and MLP in parallel, its own key names (n_head, multi_query, alibi)
    {"model_type": "falcon", "hidden_size": 4544, "num_hidden_layers": 32, "num_attention_heads": 71,
     "multi_query": True, "parallel_attn": True, "bias": False, "alibi": False, "vocab_size": 65024},
    # Gemma 2: four norms a layer, attention and final logits soft-capped
    {"model_type": "gemma2", "hidden_size": 2304, "intermediate_size": 9216, "num_hidden_layers": 26,
     "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256, "vocab_size": 256000,
     "sliding_window": 4096, "final_logit_softcapping": 30.0, "attn_logit_softcapping": 50.0},
    # GPT-J: GPT-2's key names, parallel attention and MLP, rotary positions
    {"model_type": "gptj", "n_embd": 4096, "n_layer": 28, "n_head": 16, "n_positions": 2048, "rotary_dim": 64,
     "vocab_size": 50400},
], ids=["falcon", "gemma2", "gpt-j"])
def test_a_family_llmsim_does_not_read_is_refused_naming_its_model_type(tmp_path, cfg):
    with pytest.raises(InputError, match=rf"\.model_type: got '{cfg['model_type']}'; not a family llmsim reads"):
        load_hf_config(_write(tmp_path, cfg), seq_len=2048)


# Gemma 3 1B's text config (google/gemma-3-1b-pt config.json, transformers 4.50: no layer_types)
GEMMA3_1B = {"model_type": "gemma3_text", "hidden_size": 1152, "intermediate_size": 6912, "num_hidden_layers": 26,
             "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 256, "vocab_size": 262144,
             "hidden_activation": "gelu_pytorch_tanh", "sliding_window": 512, "sliding_window_pattern": 6,
             "query_pre_attn_scalar": 256, "final_logit_softcapping": None, "attn_logit_softcapping": None}


def test_gemma3_imports_four_norms_query_and_key_norms_geglu_tied_and_five_windows_to_one(tmp_path):
    m = load_hf_config(_write(tmp_path, GEMMA3_1B), seq_len=4096)
    assert (m.activation, m.qk_norm, m.post_norms, m.tied_embeddings, m.head_dim) == ("geglu", True, True, True, 256)
    assert (m.sliding_window, m.sliding_window_skip_freq) == (512, 6)
    assert [m.is_sliding_window_layer(i) for i in range(12)] == [True] * 5 + [False] + [True] * 5 + [False]
    # by hand: attention 1152 x (1024 + 256 + 256) + 1024 x 1152; GeGLU 3 x 1152 x 6912; four norms of
    # 1152 and the query and key norms of 256; the tied embedding and the final norm once
    layer = 1152 * (1024 + 2 * 256) + 1024 * 1152 + 3 * 1152 * 6912 + 4 * 1152 + 2 * 256
    assert m.params() == 26 * layer + 262144 * 1152 + 1152 == 999_885_952


# OLMo 2 1B's config (allenai/OLMo-2-0425-1B config.json)
OLMO2_1B = {"model_type": "olmo2", "hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 16,
            "num_attention_heads": 16, "num_key_value_heads": 16, "vocab_size": 100352, "hidden_act": "silu",
            "attention_bias": False, "rms_norm_eps": 1e-06, "rope_theta": 500000, "tie_word_embeddings": False,
            "max_position_embeddings": 4096}


def test_olmo2_imports_output_norms_only_and_query_and_key_norms_over_the_projections(tmp_path):
    m = load_hf_config(_write(tmp_path, OLMO2_1B), seq_len=4096)
    assert (m.pre_norms, m.post_norms, m.qk_norm, m.qk_norm_scope) == (False, True, True, "full")
    assert (m.activation, m.norm, m.tied_embeddings, m.sliding_window) == ("swiglu", "rmsnorm", False, 0)
    # by hand: attention 4 x 2048^2, SwiGLU 3 x 2048 x 8192, two output norms of 2048 and the
    # query and key norms of 16 x 128 each; two untied 100352 x 2048 tables and the final norm
    layer = 4 * 2048 ** 2 + 3 * 2048 * 8192 + 2 * 2048 + 2 * 2048
    assert m.params() == 16 * layer + 2 * 100352 * 2048 + 2048 == 1_484_916_736


def test_olmo3_slides_on_three_layers_in_four_by_its_config_class_default(tmp_path):
    m = load_hf_config(_write(tmp_path, {**OLMO2_1B, "model_type": "olmo3"}), seq_len=8192)
    assert (m.sliding_window, m.sliding_window_skip_freq, m.pre_norms, m.qk_norm_scope) == (4096, 4, False, "full")
    assert [m.is_sliding_window_layer(i) for i in range(8)] == [True] * 3 + [False] + [True] * 3 + [False]


# allenai/OLMoE-1B-7B-0924's config.json (the keys the import reads)
OLMOE_1B_7B = {"model_type": "olmoe", "hidden_size": 2048, "intermediate_size": 1024, "num_hidden_layers": 16,
               "num_attention_heads": 16, "num_key_value_heads": 16, "num_experts": 64, "num_experts_per_tok": 8,
               "vocab_size": 50304, "hidden_act": "silu", "clip_qkv": None, "tie_word_embeddings": False}


def test_olmoe_imports_64_experts_top_8_with_pre_norms_and_projection_norms(tmp_path):
    m = load_hf_config(_write(tmp_path, OLMOE_1B_7B), seq_len=4096)
    assert (m.experts, m.top_k, m.expert_ffn_hidden, m.shared_experts) == (64, 8, 1024, 0)
    assert (m.pre_norms, m.post_norms, m.qk_norm, m.qk_norm_scope) == (True, False, True, "full")
    # by hand: attention 4 x 2048^2, router 2048 x 64, experts of 3 x 2048 x 1024, two pre-norms
    # and the query and key norms of 2048 each; untied 50304 x 2048 tables and the final norm:
    # the OLMoE paper's 6.9B total and 1.3B active
    attention, expert, norms = 4 * 2048 ** 2, 3 * 2048 * 1024, 4 * 2048
    tables = 2 * 50304 * 2048 + 2048
    assert m.params() == 16 * (attention + 2048 * 64 + 64 * expert + norms) + tables == 6_919_161_856
    assert m.active_params() == 16 * (attention + 2048 * 64 + 8 * expert + norms) + tables == 1_282_017_280


def test_olmoe_with_clamped_queries_keys_and_values_is_refused(tmp_path):
    with pytest.raises(InputError, match=r"\.clip_qkv: got 8.0"):
        load_hf_config(_write(tmp_path, {**OLMOE_1B_7B, "clip_qkv": 8.0}), seq_len=4096)


# microsoft/phi-4's config.json (transformers 4.47.0)
PHI4 = {"model_type": "phi3", "hidden_size": 5120, "intermediate_size": 17920, "num_hidden_layers": 40,
        "num_attention_heads": 40, "num_key_value_heads": 10, "vocab_size": 100352, "hidden_act": "silu",
        "attention_bias": False, "attention_dropout": 0.0, "embd_pdrop": 0.0, "resid_pdrop": 0.0,
        "max_position_embeddings": 16384, "rope_scaling": None, "rope_theta": 250000, "sliding_window": None,
        "tie_word_embeddings": False}


def test_phi4_imports_as_llamas_layer_with_fused_projections(tmp_path):
    m = load_hf_config(_write(tmp_path, PHI4), seq_len=4096)
    assert (m.activation, m.norm, m.kv_heads, m.sliding_window, m.dropout, m.qk_norm) == \
        ("swiglu", "rmsnorm", 10, 0, False, False)
    # by hand: attention 5120 x (5120 + 2 x 1280) + 5120 x 5120, SwiGLU 3 x 5120 x 17920, two norms;
    # two untied 100352 x 5120 tables and the final norm: Phi-4's 14.7B
    layer = 5120 * (5120 + 2 * 1280) + 5120 * 5120 + 3 * 5120 * 17920 + 2 * 5120
    assert m.params() == 40 * layer + 2 * 100352 * 5120 + 5120 == 14_659_507_200


@pytest.mark.parametrize("change, key", [
    ({"attention_dropout": 0.1}, "resid_pdrop"),  # the residual dropout would be 0
    ({"attention_dropout": 0.1, "resid_pdrop": 0.1}, "embd_pdrop"),
])
def test_phi3_configs_llmsim_cannot_express_are_refused_naming_the_key(tmp_path, change, key):
    with pytest.raises(InputError) as e:
        load_hf_config(_write(tmp_path, {**PHI4, **change}), seq_len=4096)
    assert e.value.field.endswith("." + key)


def test_phi3_with_every_dropout_on_has_llmsims_dropout(tmp_path):
    rates = {"attention_dropout": 0.1, "resid_pdrop": 0.1, "embd_pdrop": 0.1}
    assert load_hf_config(_write(tmp_path, {**PHI4, **rates}), seq_len=4096).dropout


def test_attention_dropout_alone_is_refused(tmp_path):
    with pytest.raises(InputError) as e:
        load_hf_config(_write(tmp_path, {**OLMO2_1B, "attention_dropout": 0.1}), seq_len=4096)
    assert e.value.field.endswith(".attention_dropout")


def test_a_multimodal_config_is_refused_pointing_at_its_text_decoder(tmp_path):
    wrapper = {"model_type": "gemma3", "text_config": {**GEMMA3_1B}, "vision_config": {"model_type": "siglip"}}
    with pytest.raises(InputError, match=r"\.text_config: .*save its text_config"):
        load_hf_config(_write(tmp_path, wrapper), seq_len=4096)
    # the decoder saved on its own imports
    assert load_hf_config(_write(tmp_path, wrapper["text_config"]), seq_len=4096).params() == 999_885_952


# zai-org/GLM-4.5-Air's config.json (transformers 4.54.1)
GLM45_AIR = {"model_type": "glm4_moe", "attention_bias": True, "attention_dropout": 0.0, "first_k_dense_replace": 1,
             "head_dim": 128, "hidden_act": "silu", "hidden_size": 4096, "intermediate_size": 10944,
             "moe_intermediate_size": 1408, "n_group": 1, "n_routed_experts": 128, "n_shared_experts": 1,
             "norm_topk_prob": True, "num_attention_heads": 96, "num_experts_per_tok": 8, "num_hidden_layers": 46,
             "num_key_value_heads": 8, "num_nextn_predict_layers": 1, "partial_rotary_factor": 0.5,
             "routed_scaling_factor": 1.0, "tie_word_embeddings": False, "topk_group": 1, "use_qk_norm": False,
             "vocab_size": 151552}


def test_glm45_air_imports_deepseek_v3s_experts_with_gqa_partial_rope_and_mtp(tmp_path):
    m = load_hf_config(_write(tmp_path, GLM45_AIR), seq_len=4096)
    assert (m.experts, m.top_k, m.expert_ffn_hidden, m.shared_experts, m.dense_layers, m.ffn_hidden) == \
        (128, 8, 1408, 1, 1, 10944)
    assert (m.attention, m.head_dim, m.rotary_fraction, m.mtp_layers, m.qk_norm) == ("gqa", 128, 0.5, 1, False)
    # by hand, without the MTP module: attention 4096 x (12288 + 2 x 1024) + 12288 x 4096 and the
    # q/k/v biases 12288 + 2 x 1024; the dense layer's SwiGLU 3 x 4096 x 10944; an MoE layer's
    # router 4096 x 128, 128 routed and one shared expert of 3 x 4096 x 1408; two norms a layer;
    # untied 151552 x 4096 tables and the final norm: GLM-4.5-Air's 106B
    attention, expert, norms = 4096 * (12288 + 2048) + 12288 * 4096 + 14336, 3 * 4096 * 1408, 2 * 4096
    dense = attention + 3 * 4096 * 10944 + norms
    moe = attention + 4096 * 128 + 129 * expert + norms
    assert m.params(mtp=False) == dense + 45 * moe + 2 * 151552 * 4096 + 4096 == 106_852_245_504
    assert m.qkv_bias and not m.bias


# EleutherAI/pythia-1.4b's config.json
PYTHIA_1B4 = {"model_type": "gpt_neox", "hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 24,
              "num_attention_heads": 16, "hidden_act": "gelu", "rotary_pct": 0.25, "rotary_emb_base": 10000,
              "use_parallel_residual": True, "tie_word_embeddings": False, "vocab_size": 50304,
              "max_position_embeddings": 2048, "layer_norm_eps": 1e-05, "attention_dropout": 0.0,
              "hidden_dropout": 0.0}


def test_pythia_imports_parallel_attention_and_mlp_with_partial_rope_and_biases(tmp_path):
    m = load_hf_config(_write(tmp_path, PYTHIA_1B4), seq_len=2048)
    assert (m.parallel_block, m.shared_norm, m.rotary_fraction, m.activation, m.norm, m.bias, m.dropout) == \
        (True, False, 0.25, "gelu", "layernorm", True, False)
    # by hand: query_key_value 2048 x 6144 + 6144, dense 2048 x 2048 + 2048, the MLP 2048 x 8192 +
    # 8192 and 8192 x 2048 + 2048, two LayerNorms of 2 x 2048; untied 50304 x 2048 tables and the
    # final LayerNorm: the Pythia paper's 1,414,647,808
    layer = 2048 * 6144 + 6144 + 2048 * 2048 + 2048 + 2 * 2048 * 8192 + 8192 + 2048 + 4 * 2048
    assert m.params() == 24 * layer + 2 * 50304 * 2048 + 2 * 2048 == 1_414_647_808


@pytest.mark.parametrize("change, key", [({"hidden_dropout": 0.1}, "hidden_dropout"),
                                         ({"attention_bias": False}, "attention_bias"),
                                         ({"hidden_act": "silu"}, "hidden_act")])
def test_gpt_neox_configs_llmsim_cannot_express_are_refused_naming_the_key(tmp_path, change, key):
    with pytest.raises(InputError) as e:
        load_hf_config(_write(tmp_path, {**PYTHIA_1B4, **change}), seq_len=2048)
    assert e.value.field.endswith("." + key)


def test_gemma3_with_logit_soft_capping_is_refused(tmp_path):
    with pytest.raises(InputError, match=r"\.final_logit_softcapping: got 30.0"):
        load_hf_config(_write(tmp_path, {**GEMMA3_1B, "final_logit_softcapping": 30.0}), seq_len=4096)


def test_qwen_moe_decoder_sparse_step_puts_experts_on_the_last_layer_of_each_step(tmp_path):
    # transformers Qwen2MoeDecoderLayer: MoE where (layer_idx + 1) % decoder_sparse_step == 0
    cfg = {**_config("qwen1.5-moe-a2.7b"), "decoder_sparse_step": 3}
    m = load_hf_config(_write(tmp_path, cfg), seq_len=4096)
    assert [i for i in range(m.layers) if m.is_moe_layer(i)] == [i for i in range(m.layers) if (i + 1) % 3 == 0]
    assert m.moe_layers == m.layers // 3


@pytest.mark.parametrize("change,key", [
    ({"mlp_only_layers": [0, 5]}, "mlp_only_layers"),
    ({"use_sliding_window": True}, "use_sliding_window"),
    ({"num_experts_per_tok": None}, "num_experts_per_tok"),
])
def test_a_qwen_moe_pattern_llmsim_cannot_express_is_refused(tmp_path, change, key):
    cfg = {**_config("qwen1.5-moe-a2.7b"), **change}
    with pytest.raises(InputError, match=rf"\.{key}: "):
        load_hf_config(_write(tmp_path, cfg), seq_len=4096)


@pytest.mark.parametrize("change,key", [
    ({"hidden_act": ["silu"]}, "hidden_act"),
    ({"layer_types": [{"a": 1}] * 36}, "layer_types"),
    ({"num_local_experts": "128"}, "num_local_experts"),
])
def test_a_value_of_the_wrong_type_is_one_line_naming_the_key(tmp_path, change, key):
    cfg = {**_config("gpt-oss-120b"), **change}
    with pytest.raises(InputError, match=rf"\.{key}: "):
        load_hf_config(_write(tmp_path, cfg), seq_len=4096)


def test_each_nth_layer_full_imports_as_a_window_skip_frequency(tmp_path):
    # Gemma 3's layer_types: five sliding layers, then one full, repeated
    cfg = _config("gpt-oss-120b")
    cfg["layer_types"] = ["sliding_attention" if (i + 1) % 6 else "full_attention" for i in range(36)]
    model = load_hf_config(_write(tmp_path, cfg), seq_len=4096)
    assert (model.sliding_window, model.sliding_window_freq, model.sliding_window_skip_freq) == (128, 1, 6)


def test_an_irregular_layer_pattern_is_refused(tmp_path):
    cfg = _config("gpt-oss-120b")
    cfg["layer_types"] = ["full_attention"] * 2 + cfg["layer_types"][2:]
    with pytest.raises(InputError, match=r"\.layer_types: "):
        load_hf_config(_write(tmp_path, cfg), seq_len=4096)


def test_a_directory_or_huge_file_is_not_read_as_a_config(tmp_path):
    with pytest.raises(InputError, match="expected a regular file"):
        load_hf_config(str(tmp_path), seq_len=4096)
    big = tmp_path / "big.json"
    big.write_text(" " * (2 << 20))
    with pytest.raises(InputError, match="not a config.json"):
        load_hf_config(str(big), seq_len=4096)


def test_a_duplicate_key_is_refused(tmp_path):
    path = tmp_path / "dup.json"
    path.write_text('{"hidden_size": 4096, "num_hidden_layers": 32, "hidden_size": 8192}')
    with pytest.raises(InputError, match=r"model\.hf_config\.hidden_size: got 8192; duplicate key"):
        load_hf_config(str(path), seq_len=4096)


def test_hf_config_in_a_scenario_file_is_relative_to_the_file(tmp_path):
    folder = tmp_path / "runs"
    folder.mkdir()
    shutil.copy(HF / "llama-3.1-8b.json", folder / "llama.json")
    scenario = folder / "llama.yaml"
    scenario.write_text("model: {hf_config: llama.json, seq_len: 8192}\n"
                        "cluster: {node: dgx-h100, nodes: 1}\nplan: {tp: 8, micro_batch: 1, global_batch: 8}\n")
    assert load_scenario(scenario).model.params() == 8_030_261_248
    assert read_scenario(scenario)["model"]["hf_config"] == str(folder / "llama.json")


def test_a_null_preset_lets_an_override_switch_to_hf_config():
    both = {"preset": "llama-3.1-8b", "hf_config": str(HF / "qwen2-7b.json"), "seq_len": 4096}
    with pytest.raises(InputError, match=r"model\.hf_config.*not both"):
        model_from_dict(both)
    m = model_from_dict({**both, "preset": None})
    assert (m.layers, m.hidden, m.seq_len) == (28, 3584, 4096)
