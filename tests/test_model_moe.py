"""Mixture-of-Experts and latent-attention model specs: parameter counts worked by hand from
each model's published shape and compared with the numbers its authors publish."""

import pytest

from simulator.errors import InputError
from simulator.model import available_presets, load_hf_config, load_preset, model_from_dict

GB = 1e9


def test_mixtral_8x7b_has_46_7b_parameters_12_9b_active():
    h, layers, vocab, expert_width = 4096, 32, 32000, 14336
    attention = h * h + 2 * h * (8 * 128) + h * h  # W_Q, W_K + W_V (8 KV heads of 128), W_O
    assert attention == 41_943_040
    expert = 3 * h * expert_width  # SwiGLU: gate, up, down
    assert expert == 176_160_768
    router, norms = h * 8, 2 * h
    outside = 2 * vocab * h + h  # untied embedding and lm_head, final RMSNorm
    total = layers * (attention + 8 * expert + router + norms) + outside
    active = layers * (attention + 2 * expert + router + norms) + outside
    assert (total, active) == (46_702_792_704, 12_879_925_248)
    m = load_preset("mixtral-8x7b")
    assert (m.params(), m.active_params()) == (total, active)
    assert round(total / GB, 1) == 46.7 and round(active / GB, 1) == 12.9  # Mistral AI's announcement


def test_mixtral_8x22b_has_141b_parameters_39b_active():
    h, layers, vocab = 6144, 56, 32000
    attention = 2 * h * h + 2 * h * (8 * 128)
    expert = 3 * h * 16384
    outside = 2 * vocab * h + h
    total = layers * (attention + 8 * expert + 8 * h + 2 * h) + outside
    active = layers * (attention + 2 * expert + 8 * h + 2 * h) + outside
    m = load_preset("mixtral-8x22b")
    assert (m.params(), m.active_params()) == (total, active) == (140_620_634_112, 39_152_031_744)
    assert round(total / GB) == 141 and round(active / GB) == 39  # Mistral AI: 141B / 39B active


def _deepseek_v3_by_hand():
    """DeepSeek-V3 (arXiv 2412.19437 Sec. 2, Table/config: h 7168, 128 heads, MLA ranks
    1536/512, head dims nope 128 + rope 64, v 128; 3 dense layers of 18432, then 58 MoE layers
    of 256 routed experts (8 used) + 1 shared expert of 2048; vocab 129280, untied)."""
    h, heads = 7168, 128
    q = h * 1536 + 1536 + 1536 * heads * (128 + 64)  # W_DQ, RMSNorm(q_lora), W_UQ (+ W_QR)
    kv = h * (512 + 64) + 512 + 512 * heads * (128 + 128)  # W_DKV + W_KR, RMSNorm(kv_lora), W_UK + W_UV
    o = heads * 128 * h
    attention = q + kv + o
    assert attention == 187_107_328
    norms = 2 * h
    dense = attention + 3 * h * 18432 + norms
    expert = 3 * h * 2048
    assert expert == 44_040_192
    router = h * 256
    moe = attention + 256 * expert + expert + router + norms  # routed + shared
    moe_active = attention + 8 * expert + expert + router + norms
    outside = 2 * 129280 * h + h
    main = 3 * dense + 58 * moe + outside
    main_active = 3 * dense + 58 * moe_active + outside
    # MTP module (Sec. 2.2): a MoE block, M (2h x h), RMSNorms of h_i, of the embedding and
    # before the shared output head; the embedding and output head are the main model's.
    mtp = moe + 2 * h * h + 3 * h
    mtp_active = moe_active + 2 * h * h + 3 * h
    return main, main_active, mtp, mtp_active, outside


def test_deepseek_v3_main_model_has_671b_parameters_37b_active_counting_mla_as_mla():
    main, main_active, _, _, _ = _deepseek_v3_by_hand()
    assert (main, main_active) == (671_026_404_352, 37_552_282_624)
    m = load_preset("deepseek-v3")
    assert (m.params(mtp=False), m.active_params(mtp=False)) == (main, main_active)
    assert round(main / GB) == 671  # DeepSeek-V3 README: 671B total, 37B activated
    assert abs(main_active / 37e9 - 1) < 0.02
    # README_WEIGHTS.md says 36.7B active "including 0.9B for Embedding and 0.9B for the output
    # Head"; with the 671B total and 8 of 256 experts that count cannot go below 37.55B.
    assert abs(main_active / 36.7e9 - 1) < 0.025


def test_deepseek_v3_params_include_the_trained_mtp_module():
    main, main_active, mtp, mtp_active, outside = _deepseek_v3_by_hand()
    m = load_preset("deepseek-v3")
    assert m.params() == main + mtp and m.active_params() == main_active + mtp_active
    assert mtp == 11_610_067_968
    assert abs(mtp / 11.5e9 - 1) < 0.01  # README_WEIGHTS.md: "11.5B unique parameters"
    # The Hugging Face checkpoint stores the MTP module with its own copy of the embedding
    # and output head: DeepSeek's "685B = 671B main + 14B MTP".
    assert abs((main + mtp + outside - 7168) / 685e9 - 1) < 0.001


def test_qwen3_235b_a22b_has_235b_parameters_22b_active():
    h, layers, vocab = 4096, 94, 151936
    attention = h * (64 * 128) + 2 * h * (4 * 128) + (64 * 128) * h  # queries 8192 wide (head_dim 128)
    expert = 3 * h * 1536
    router, norms = h * 128, 2 * h + 2 * 128  # two pre-norms, and q_norm and k_norm over head_dim 128
    outside = 2 * vocab * h + h
    total = layers * (attention + 128 * expert + router + norms) + outside
    active = layers * (attention + 8 * expert + router + norms) + outside
    assert (total, active) == (235_093_634_560, 22_190_763_520)
    m = load_preset("qwen3-235b-a22b")
    assert (m.params(), m.active_params()) == (total, active)
    assert round(total / GB) == 235 and round(active / GB) == 22  # Qwen3: 235B / 22B activated


def test_qwen3_30b_a3b_has_30_5b_parameters_3_3b_active():
    h, layers = 2048, 48
    attention = 2 * h * (32 * 128) + 2 * h * (4 * 128)
    expert = 3 * h * 768
    outside = 2 * 151936 * h + h
    norms = 2 * h + 2 * 128  # two pre-norms, and q_norm and k_norm over head_dim 128
    total = layers * (attention + 128 * expert + 128 * h + norms) + outside
    active = layers * (attention + 8 * expert + 128 * h + norms) + outside
    m = load_preset("qwen3-30b-a3b")
    assert (m.params(), m.active_params()) == (total, active)
    assert round(total / GB, 1) == 30.5 and round(active / GB, 1) == 3.4  # Qwen3: 30.5B / 3.3B activated
    assert abs(active / 3.3e9 - 1) < 0.02


def test_gpt_oss_120b_matches_the_model_card():
    h, layers, vocab, width = 2880, 36, 201088, 2880
    q, kv = 64 * 64, 8 * 64
    attention = h * (q + 2 * kv) + q * h + (q + 2 * kv + h)  # weights and biases of Q, K, V, O
    expert = 3 * h * width + (2 * width + h)  # gate_up (with biases) and down (with bias)
    router = h * 128 + 128
    norms = 2 * h
    embedding = vocab * h
    total = layers * (attention + 128 * expert + router + norms) + 2 * embedding + h
    active = layers * (attention + 4 * expert + router + norms) + 2 * embedding + h
    m = load_preset("gpt-oss-120b")
    assert (m.params(), m.active_params()) == (total, active) == (116_829_154_368, 5_711_980_608)
    # Model card (arXiv 2508.10925, Table 1): 116.83B total, 5.13B active (the embedding
    # table not counted as active, the unembedding counted).
    assert round(total / GB, 2) == 116.83
    assert round((active - m.embedding_params()) / GB, 2) == 5.13


def test_grok_1_has_314b_parameters():
    h, layers = 6144, 64
    attention = 2 * h * h + 2 * h * (8 * 128)
    expert = 3 * h * 32768  # GeGLU: linear, linear_v, linear_1
    total = layers * (attention + 8 * expert + 8 * h + 2 * h) + 131072 * h + h  # tied InOutEmbed
    m = load_preset("grok-1")
    assert m.params() == total == 315_684_034_560
    assert abs(total / 314e9 - 1) < 0.006  # xAI: "314B parameter Mixture-of-Experts"


def test_deepseek_v2_lite_without_query_compression_has_15_7b_parameters():
    # DeepSeek-V2 paper (arXiv 2405.04434) Appendix B, DeepSeek-V2-Lite: 27 layers, hidden 2048,
    # 16 heads, no query compression, kv rank 512, first layer dense (10944), then 64 routed
    # experts (6 used) + 2 shared of 1408; vocab 102400; "15.7B total parameters".
    m = model_from_dict({"layers": 27, "hidden": 2048, "heads": 16, "attention": "mla", "kv_lora_rank": 512,
                         "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128, "ffn_hidden": 10944,
                         "experts": 64, "top_k": 6, "expert_ffn_hidden": 1408, "shared_experts": 2,
                         "dense_layers": 1, "vocab": 102400, "seq_len": 4096, "activation": "swiglu",
                         "norm": "rmsnorm", "position_embedding": "rope", "bias": False, "tied_embeddings": False})
    h = 2048
    attention = h * 16 * 192 + h * 576 + 512 + 512 * 16 * 256 + 16 * 128 * h
    assert m.attention_params() == attention == 13_763_072
    expert = 3 * h * 1408
    total = (attention + 3 * h * 10944 + 2 * h) + 26 * (attention + 66 * expert + 64 * h + 2 * h) + 2 * 102400 * h + h
    assert m.params() == total and round(total / GB, 1) == 15.7


def test_deepseek_v3_layers_0_to_2_are_dense_and_the_rest_moe():
    m = load_preset("deepseek-v3")
    assert [m.is_moe_layer(i) for i in range(61)] == [False] * 3 + [True] * 58
    assert m.moe_layers == 58


def test_moe_layer_freq_puts_experts_on_every_other_layer_after_the_dense_ones():
    m = model_from_dict({"preset": "mixtral-8x7b", "layers": 8, "dense_layers": 1, "moe_layer_freq": 2})
    assert [i for i in range(8) if m.is_moe_layer(i)] == [2, 4, 6] and m.moe_layers == 3
    assert m.params() == 5 * m.dense_layer_params() + 3 * m.moe_layer_params() + 2 * 32000 * 4096 + 4096


def test_moe_layer_offset_puts_experts_on_the_last_layer_of_each_period():
    # Llama 4 Maverick's interleave_moe_layer_step 2 (transformers Llama4TextConfig moe_layers =
    # range(1, layers, 2)); with three leading dense layers, layer 1 stays dense
    m = model_from_dict({"preset": "mixtral-8x7b", "layers": 8, "moe_layer_freq": 2, "moe_layer_offset": 1})
    assert [i for i in range(8) if m.is_moe_layer(i)] == [1, 3, 5, 7] and m.moe_layers == 4
    assert m.params() == 4 * m.dense_layer_params() + 4 * m.moe_layer_params() + 2 * 32000 * 4096 + 4096
    m = model_from_dict({"preset": "mixtral-8x7b", "layers": 8, "dense_layers": 3, "moe_layer_freq": 2,
                         "moe_layer_offset": 1})
    assert [i for i in range(8) if m.is_moe_layer(i)] == [3, 5, 7] and m.moe_layers == 3
    assert m.shape_summary() == "8x14336 top-2, 3 dense, every 2 from 1"


def test_attention_widths_follow_head_dim_and_mla_dims():
    q3 = load_preset("qwen3-30b-a3b")
    assert (q3.q_width, q3.kv_hidden, q3.v_width) == (32 * 128, 4 * 128, 4 * 128)
    ds = load_preset("deepseek-v3")
    assert (ds.head_dim, ds.q_width, ds.kv_hidden, ds.v_width) == (192, 128 * 192, 128 * 192, 128 * 128)


def test_dense_presets_count_every_parameter_as_active():
    for name in available_presets():
        m = load_preset(name)
        if not m.experts:
            assert m.active_params() == m.params() == m.params(mtp=False)
            assert m.layer_params(0) == m.layer_params(m.layers - 1) == m.dense_layer_params()


@pytest.mark.parametrize("preset,fixture", [
    ("mixtral-8x7b", "mixtral-8x7b-instruct-v0.1"), ("mixtral-8x22b", "mixtral-8x22b-v0.1"),
    ("deepseek-v3", "deepseek-v3"), ("qwen3-30b-a3b", "qwen3-30b-a3b"), ("qwen3-235b-a22b", "qwen3-235b-a22b"),
    ("gpt-oss-120b", "gpt-oss-120b"),
])
def test_moe_presets_match_their_released_config_json(preset, fixture):
    from pathlib import Path
    p = load_preset(preset)
    m = load_hf_config(str(Path(__file__).parent / "data" / "hf" / f"{fixture}.json"), seq_len=p.seq_len)
    keys = ("layers", "hidden", "heads", "kv_heads", "head_dim", "attention", "q_lora_rank", "kv_lora_rank",
            "v_head_dim", "experts", "top_k", "expert_ffn_hidden", "shared_experts", "dense_layers", "mtp_layers",
            "vocab", "activation", "bias", "tied_embeddings", "sliding_window", "sliding_window_freq")
    assert {k: getattr(m, k) for k in keys} == {k: getattr(p, k) for k in keys}
    assert (m.params(), m.active_params()) == (p.params(), p.active_params())


def test_models_list_shows_total_active_and_moe_shape(capsys):
    from simulator.cli import main
    assert main(["models", "list"]) == 0
    rows = {line.split()[0]: line for line in capsys.readouterr().out.splitlines()}
    assert "671.03+11.61" in rows["deepseek-v3"] and "256x2048 top-8 +1 shared, 3 dense" in rows["deepseek-v3"]
    assert " 46.70 " in rows["mixtral-8x7b"] and " 12.88 " in rows["mixtral-8x7b"]
    assert "8x14336 top-2" in rows["mixtral-8x7b"]


# ------------------------------------------------------------------ validation

def _moe(**fields):
    return model_from_dict({"preset": "mixtral-8x7b", **fields})


@pytest.mark.parametrize("fields,field", [
    ({"top_k": 9}, "model.top_k"),
    ({"top_k": 0}, "model.top_k"),
    ({"experts": 0, "top_k": 2}, "model.top_k"),
    ({"dense_layers": 32}, "model.dense_layers"),
    ({"dense_layers": 31, "moe_layer_freq": 2}, "model.moe_layer_freq"),  # layer 31 is odd: no MoE layer left
    ({"shared_expert_ffn_hidden": 1024}, "model.shared_expert_ffn_hidden"),
    ({"attention": "mha"}, "model.attention"),  # 8 KV heads for 32 query heads
    ({"v_head_dim": 64}, "model.v_head_dim"),
    ({"kv_lora_rank": 512}, "model.kv_lora_rank"),
    ({"ffn_hidden": 14336, "dense_ffn_hidden": 10000}, "model.dense_ffn_hidden"),
    ({"sliding_window_freq": 2}, "model.sliding_window_freq"),
    ({"moe_layer_freq": 2, "moe_layer_offset": 2}, "model.moe_layer_offset"),
])
def test_an_inconsistent_moe_shape_is_refused_naming_the_field(fields, field):
    with pytest.raises(InputError, match=field.replace(".", r"\.")):
        _moe(**fields)


def test_dense_fields_refuse_moe_only_keys():
    with pytest.raises(InputError, match=r"model\.top_k.*experts >= 1"):
        model_from_dict({"preset": "llama-3.1-8b", "top_k": 2})


@pytest.mark.parametrize("fields,field", [
    ({"attention": "mla", "kv_lora_rank": 0}, "model.kv_lora_rank"),
    ({"bias": True}, "model.bias"),
    ({"kv_heads": 8}, "model.kv_heads"),
    ({"head_dim": 128}, "model.head_dim"),  # MLA's query/key head is 128 + 64
])
def test_an_inconsistent_mla_shape_is_refused_naming_the_field(fields, field):
    with pytest.raises(InputError, match=field.replace(".", r"\.")):
        model_from_dict({"preset": "deepseek-v3", **fields})


def test_experts_0_turns_an_moe_preset_into_its_dense_counterpart():
    m = model_from_dict({"preset": "mixtral-8x7b", "experts": 0})
    assert (m.experts, m.top_k, m.ffn_hidden) == (0, 0, 14336)
    assert m.params() == load_preset("mistral-7b").params()  # Mistral 7B: Mixtral's dense parent


def test_dense_ffn_hidden_is_the_width_of_the_dense_layers():
    m = model_from_dict({"preset": "deepseek-v3", "dense_ffn_hidden": 9216})
    assert m.ffn_hidden == 9216 and m.expert_ffn_hidden == 2048
    assert m.dense_layer_params() == m.attention_params() + 3 * 7168 * 9216 + 2 * 7168


def test_dense_layers_need_their_own_width():
    with pytest.raises(InputError, match=r"model\.ffn_hidden: got None; required"):
        model_from_dict({"layers": 4, "hidden": 64, "heads": 4, "experts": 4, "top_k": 1, "expert_ffn_hidden": 32,
                         "dense_layers": 1, "vocab": 100, "seq_len": 16, "activation": "swiglu"})


def test_dropping_the_shared_expert_of_a_preset_drops_its_width():
    m = model_from_dict({"preset": "deepseek-v3", "shared_experts": 0})
    assert (m.shared_experts, m.shared_expert_ffn_hidden) == (0, 0)
    assert m.moe_params() == m.router_params() + 256 * m.mlp_params(2048)


def test_an_moe_model_from_fields_defaults_its_expert_width_to_ffn_hidden():
    m = model_from_dict({"layers": 2, "hidden": 64, "heads": 4, "ffn_hidden": 128, "experts": 4, "top_k": 1,
                         "vocab": 100, "seq_len": 16, "activation": "swiglu"})
    assert (m.expert_ffn_hidden, m.moe_layers) == (128, 2)


# ------------------------------------------------------------------ refused by the cost model

CLUSTER = {"node": "dgx-h100", "nodes": 1}


def _evaluate_scenario(model, **plan):
    from simulator import scenario_from_dict
    return scenario_from_dict({"model": model, "cluster": CLUSTER,
                               "plan": {"tp": 8, "pp": 1, "micro_batch": 1, "global_batch": 8, **plan}})


@pytest.mark.parametrize("field,value", [("fp8_recipe", "tensorwise"), ("compile", False),
                                         ("recompute", "op-selective")])
def test_moe_models_refuse_the_options_only_the_dense_path_models(field, value):
    extra = {"precision": "fp8"} if field == "fp8_recipe" else {}
    with pytest.raises(InputError, match=rf"plan\.{field}.*not yet modelled for MoE"):
        _evaluate_scenario({"preset": "mixtral-8x7b", "seq_len": 4096}, sequence_parallel=True,
                           **{field: value, **extra})


def test_unfused_gradient_accumulation_adds_every_expert_weight():
    from simulator import evaluate
    unfused = evaluate(_evaluate_scenario({"preset": "mixtral-8x7b", "seq_len": 4096}, sequence_parallel=True,
                                          grad_accumulation_fusion=False))
    fused = evaluate(_evaluate_scenario({"preset": "mixtral-8x7b", "seq_len": 4096}, sequence_parallel=True))
    assert unfused.step_time_s > fused.step_time_s  # every expert weight's gradient is added


@pytest.mark.parametrize("model", [
    {"preset": "mixtral-8x7b", "seq_len": 4096},
    {"preset": "deepseek-v3", "mtp_layers": 0},
    {"layers": 2, "hidden": 1024, "heads": 8, "attention": "mla", "kv_lora_rank": 256, "qk_nope_head_dim": 64,
     "qk_rope_head_dim": 32, "v_head_dim": 64, "ffn_hidden": 4096, "vocab": 32000, "seq_len": 2048,
     "activation": "swiglu", "bias": False},
    {"preset": "llama-3.1-8b", "head_dim": 64},
    {"preset": "llama-3.1-8b", "activation": "geglu"},
])
def test_moe_mla_head_dim_and_geglu_models_are_evaluated(model):
    from simulator import evaluate
    s = _evaluate_scenario(model, sequence_parallel=True)
    assert evaluate(s, "analytic").step_time_s > 0


def test_a_window_as_long_as_the_sequence_is_full_attention_and_evaluates():
    s = _evaluate_scenario({"preset": "llama-3.1-8b", "sliding_window": 8192})
    assert s.model.sliding_window == s.model.seq_len


def test_evaluating_an_moe_scenario_reports_its_parameters_and_all_to_all(tmp_path, capsys):
    import json
    from simulator.cli import main
    path = tmp_path / "mixtral.yaml"
    path.write_text("model: {preset: mixtral-8x7b, seq_len: 4096}\ncluster: {node: dgx-h100, nodes: 8}\n"
                    "plan: {tp: 1, pp: 1, ep: 8, micro_batch: 1, global_batch: 64, zero_stage: 1}\n")
    assert main(["evaluate", str(path), "--json", "--engine", "analytic"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["parameters"] == load_preset("mixtral-8x7b").params()
    assert d["active_parameters"] == load_preset("mixtral-8x7b").active_params()
    assert d["breakdown_s"]["ep_comm"] > 0
