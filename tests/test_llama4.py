"""Llama 4's text decoder: experts on every or every other layer beside a shared expert, NoPE
layers, chunked attention and weightless L2 query and key norms on the rotating layers."""

import json
from pathlib import Path

import pytest

from attention_bands import DENSE, attention_fwd_flops, scenario as _scenario
from simulator import InputError, evaluate, scenario_from_dict
from simulator.model import load_hf_config, load_preset, model_from_dict
from simulator.workload import Shard, layer_ops, model_flops_per_sequence, window_pair_fraction

SCOUT = Path(__file__).parent / "data" / "hf" / "llama-4-scout-text.json"
# one layer's attention: q and o 5120 x 5120, k and v 5120 x 1024 (8 KV heads of 128)
ATTENTION = 2 * 5120 * 5120 + 2 * 5120 * 1024
SWIGLU = 3 * 5120  # weights per unit of an MLP's width (gate, up and down)
TABLES = 2 * 202048 * 5120  # untied embedding and output layer


def _write(tmp_path, cfg: dict) -> str:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    return str(path)


def test_scout_counts_107_8b_parameters_and_17_2b_active_by_hand():
    # each layer: attention, a 16-wide router, 16 experts and the shared expert of 8192, two
    # RMSNorms (the L2 query and key norms have no weights); the model card's 109B counts the
    # vision encoder too, its 17B active is one expert and the shared one per layer
    m = load_hf_config(str(SCOUT), seq_len=8192)
    layer = ATTENTION + 5120 * 16 + 17 * SWIGLU * 8192 + 2 * 5120
    assert m.params() == 48 * layer + TABLES + 5120 == 107_769_861_120
    active = ATTENTION + 5120 * 16 + 2 * SWIGLU * 8192 + 2 * 5120
    assert m.active_params() == 48 * active + TABLES + 5120 == 17_172_894_720


def test_the_scout_preset_is_its_config_json():
    p, m = load_preset("llama-4-scout"), load_hf_config(str(SCOUT), seq_len=8192)
    fields = ("layers", "hidden", "heads", "kv_heads", "head_dim", "ffn_hidden", "experts", "top_k",
              "expert_ffn_hidden", "shared_experts", "shared_expert_ffn_hidden", "dense_layers", "moe_layer_freq",
              "moe_layer_offset", "qk_norm", "qk_norm_kind", "nope_layer_interval", "sliding_window",
              "sliding_window_freq", "sliding_window_skip_freq", "window_kind", "vocab", "tied_embeddings")
    assert {k: getattr(p, k) for k in fields} == {k: getattr(m, k) for k in fields}
    assert (p.params(), p.active_params()) == (m.params(), m.active_params())


def test_maverick_puts_its_128_experts_on_the_odd_layers_and_counts_400_7b_by_hand():
    m = load_preset("llama-4-maverick")
    assert [i for i in range(48) if m.is_moe_layer(i)] == list(range(1, 48, 2))
    moe_layer = ATTENTION + 5120 * 128 + 129 * SWIGLU * 8192 + 2 * 5120
    dense_layer = ATTENTION + SWIGLU * 16384 + 2 * 5120
    assert m.params() == 24 * moe_layer + 24 * dense_layer + TABLES + 5120 == 400_711_848_960


def test_a_maverick_config_json_reads_as_the_preset(tmp_path):
    # its text_config leaves moe_layers, no_rope_layers and layer_types to Llama4TextConfig's
    # defaults: interleave_moe_layer_step 2, no_rope_layer_interval 4
    cfg = {**json.loads(SCOUT.read_text()), "interleave_moe_layer_step": 2, "num_local_experts": 128,
           "use_qk_norm": False}
    for key in ("moe_layers", "no_rope_layers"):
        del cfg[key]
    m, p = load_hf_config(_write(tmp_path, cfg), seq_len=8192), load_preset("llama-4-maverick")
    assert (m.params(), m.active_params(), m.moe_layer_offset, m.nope_layer_interval, m.sliding_layers, m.qk_norm) == \
        (p.params(), p.active_params(), 1, 4, 36, False)


def test_nope_layers_skip_the_rotary_kernel_and_the_l2_norms():
    # RoPE and the L2 norms on 3 of every 4 layers: a layer is charged 3/4 of the kernels' bytes
    model = _scenario({**DENSE, "nope_layer_interval": 4, "qk_norm": True, "qk_norm_kind": "l2"}).model
    plain = _scenario({**DENSE, "qk_norm": True}).model
    shard = Shard(micro_batch=1, seq_len=4096)

    def bytes_of(m, name):
        return next(op.fwd_bytes for op in layer_ops(m, shard) if op.name == name)

    for name in ("rope", "qk_norm"):
        assert bytes_of(model, name) == pytest.approx(0.75 * bytes_of(plain, name), rel=1e-15)
    # rope: read and write q and k, 2 bytes each way, over 4096 tokens x (1024 + 1024)
    assert bytes_of(model, "rope") == 0.75 * 4096 * 2048 * 4
    assert model.layer_norm_params() == 2 * 1024 == plain.layer_norm_params() - 2 * 64


def test_a_chunked_layer_attends_the_causal_half_of_each_chunk():
    # s = 32768 in chunks of 8192: 4 x 8192²/2 pairs of 32768²/2, a quarter; Scout's 36
    # chunked layers of 48 and 12 full ones: (36 / 4 + 12) / 48
    m = load_preset("llama-4-scout")
    long = model_from_dict({"preset": "llama-4-scout", "seq_len": 32768})
    assert window_pair_fraction(long, 1, 1) == 0.25
    assert window_pair_fraction(long) == pytest.approx((36 * 0.25 + 12) / 48, rel=1e-15)
    # 20000 tokens: two whole chunks and 3616 tokens
    odd = _scenario({**DENSE, "seq_len": 20000, "sliding_window": 8192, "window_kind": "chunked"}).model
    assert window_pair_fraction(odd) == pytest.approx((2 * 8192 ** 2 + 3616 ** 2) / 20000 ** 2, rel=1e-15)
    assert window_pair_fraction(m) == 1.0  # at its 8192 tokens one chunk is the whole sequence


def test_chunked_attention_runs_a_quarter_of_the_causal_flash_work_where_chunks_are_a_quarter():
    full = _scenario({**DENSE, "seq_len": 16384}).model
    chunked = _scenario({**DENSE, "seq_len": 16384, "sliding_window": 4096, "window_kind": "chunked"}).model
    assert attention_fwd_flops(chunked, 1) == pytest.approx(0.25 * attention_fwd_flops(full, 1), rel=1e-12)
    # 12·h FLOPs per pair, 4 layers: s²/2 causal pairs less 4 chunks' 4096²/2
    dropped = 4 * 12 * 1024 * (16384 ** 2 / 2 - 4 * 4096 ** 2 / 2)
    assert model_flops_per_sequence(full) - model_flops_per_sequence(chunked) == pytest.approx(dropped, rel=1e-12)


def test_chunked_and_sliding_windows_of_one_width_differ_in_what_they_attend():
    # a band of W keys per query attends more pairs than chunks of W: faster step, same memory
    base = {**DENSE, "seq_len": 32768, "sliding_window": 8192}
    band, chunks = _scenario(base), _scenario({**base, "window_kind": "chunked"})
    for engine in ("analytic", "graph"):
        a, b = evaluate(band, engine), evaluate(chunks, engine)
        assert b.step_time_s < a.step_time_s and b.peak_memory_bytes == a.peak_memory_bytes


@pytest.mark.parametrize("preset,nodes,ep", [("llama-4-scout", 8, 8), ("llama-4-maverick", 32, 64)])
def test_llama_4_trains_at_16k_tokens_under_both_engines(preset, nodes, ep):
    s = scenario_from_dict({"model": {"preset": preset, "seq_len": 16384},
                            "cluster": {"node": "dgx-h100", "nodes": nodes},
                            "plan": {"tp": 4, "pp": 4, "ep": ep, "etp": 1, "dp": nodes // 2, "micro_batch": 1,
                                     "global_batch": 64, "sequence_parallel": True, "zero_stage": 1,
                                     "recompute": "full"}})
    a, g = evaluate(s, "analytic"), evaluate(s, "graph")
    assert a.feasible and g.feasible
    assert g.step_time_s == pytest.approx(a.step_time_s, rel=0.1)


@pytest.mark.parametrize("model,plan,field", [
    ({"preset": "llama-4-scout", "seq_len": 32768}, {"cp": 2}, "plan.cp"),
    ({**DENSE, "sliding_window": 1024, "window_kind": "chunked", "document_tokens": 2048}, {}, "model.window_kind"),
    ({**DENSE, "window_kind": "chunked"}, {}, "model.window_kind"),
    ({**DENSE, "position_embedding": "learned", "nope_layer_interval": 4}, {}, "model.nope_layer_interval"),
    ({**DENSE, "nope_layer_interval": 1}, {}, "model.nope_layer_interval"),
    ({**DENSE, "qk_norm_kind": "l2"}, {}, "model.qk_norm_kind"),
    ({**DENSE, "qk_norm": True, "qk_norm_kind": "l2", "norm": "layernorm"}, {}, "model.qk_norm_kind"),
])
def test_what_the_llama_4_fields_cannot_state_is_refused_naming_the_field(model, plan, field):
    with pytest.raises(InputError, match=field.replace(".", r"\.")):
        s = scenario_from_dict({"model": model, "cluster": {"node": "dgx-h100", "nodes": 1},
                                "plan": {"tp": 1, "pp": 1, "micro_batch": 1, "global_batch": 8, **plan}})
        evaluate(s, "analytic")


@pytest.mark.parametrize("change,key", [
    ({"no_rope_layers": [1, 0] * 4 + [1, 1, 1, 0] * 10}, "no_rope_layers"),
    ({"moe_layers": [0, 1, 5]}, "moe_layers"),
    ({"layer_types": ["sliding_attention"] * 48}, "layer_types"),
])
def test_a_llama_4_layer_pattern_llmsim_cannot_express_is_refused_naming_the_key(tmp_path, change, key):
    with pytest.raises(InputError, match=rf"\.{key}: "):
        load_hf_config(_write(tmp_path, {**json.loads(SCOUT.read_text()), **change}), seq_len=8192)


def test_the_multimodal_llama_4_config_asks_for_its_text_config(tmp_path):
    cfg = {"model_type": "llama4", "text_config": json.loads(SCOUT.read_text()), "vision_config": {}}
    with pytest.raises(InputError, match=r"text_config.*text decoder only"):
        load_hf_config(_write(tmp_path, cfg), seq_len=8192)


def test_a_chunked_layers_flash_calls_are_its_chunks_as_the_cpu_kernel_tiles_them():
    # 4 layers of 2048 tokens, chunks of 256 on layers 0-2: PyTorch's CPU flash kernel computes
    # a 256-token chunk whole (64-row query blocks over one 256-key block: 65,536 pairs for
    # 32,768 causal) and the full layer's 2048 tokens in 256-row blocks over 512-key blocks
    # (256 x (512 + 512 + 1024 + 1024 + 1536 + 1536 + 2048 + 2048) = 2,621,440 for 2,097,152)
    from simulator.attentiontiles import PYTORCH_CPU_FLASH, executed_fraction
    model = _scenario({**DENSE, "seq_len": 2048, "sliding_window": 256, "sliding_window_skip_freq": 4,
                       "window_kind": "chunked"}).model
    flash = next(op for op in layer_ops(model, Shard(micro_batch=1, seq_len=2048)) if op.name == "flash_attention")
    executed = 3 * 8 * 65536 + 2_621_440
    causal = 3 * 8 * 32768 + 2_097_152
    assert executed_fraction(flash.causal_lengths, PYTORCH_CPU_FLASH) == pytest.approx(executed / causal, rel=1e-12)
