"""A layer's norms beyond its two pre-norms. Query and key norms (Qwen3, Gemma 3, Megatron-Core
qk_layernorm): one norm over each query and key head after the QKV projection, its input kept
for the backward pass, head_dim weights each; or over the whole projections (OLMo 2). Post-norms
(Gemma 2 and 3, OLMo 2): the attention's and the MLP's outputs normed before their residual
adds. And OLMo 2's layer without the pre-norms."""

from pathlib import Path

import pytest

from simulator import InputError, evaluate, scenario_from_dict
from simulator.framework_ops import param_tensors
from simulator.fusion import eager_ops
from simulator.importers import import_config
from simulator.memory import layer_saved_bytes
from simulator.model import load_hf_config, model_from_dict
from simulator.plan import Plan
from simulator.recompute import layer_checkpoint
from simulator.states import layer_params_local
from simulator.vector import evaluate_many
from simulator.workload import Shard, layer_ops

HF = Path(__file__).parent / "data" / "hf"
# Llama 3.1 8B's attention: 32 query heads and 8 KV heads of 128
MODEL = {"preset": "llama-3.1-8b", "seq_len": 4096}
TOKENS, TP = 4096, 2
Q_W, KV_W = 32 * 128 // TP, 8 * 128 // TP  # a TP rank's query and key widths


def _model(**fields):
    return model_from_dict({**MODEL, **fields})


def test_the_norms_add_head_dim_weights_for_the_query_and_the_key_of_every_layer():
    assert _model(qk_norm=True).params() - _model().params() == 32 * 2 * 128


def test_the_norm_moves_rmsnorm_bytes_over_every_query_and_key_element_and_keeps_its_input():
    shard = Shard(micro_batch=1, seq_len=TOKENS, tp=TP)
    ops = {op.name: op for op in layer_ops(_model(qk_norm=True), shard)}
    elements = TOKENS * (Q_W + KV_W)
    assert ops["qk_norm"].fwd_bytes == 3 * 2 * elements  # RMSNorm: read, write and the input again, bf16
    assert ops["qk_norm"].saved_bytes == 2 * elements
    assert "qk_norm" not in {op.name for op in layer_ops(_model(), shard)}


def test_a_layer_without_recomputation_keeps_the_normed_heads_input_on_top():
    shard = Shard(micro_batch=1, seq_len=TOKENS, tp=TP)
    extra = layer_saved_bytes(_model(qk_norm=True), shard, "none") - layer_saved_bytes(_model(), shard, "none")
    assert extra == 2 * TOKENS * (Q_W + KV_W)
    # full recomputation keeps the layer's input only, whatever its norms
    assert layer_saved_bytes(_model(qk_norm=True), shard, "full") == layer_saved_bytes(_model(), shard, "full")


def test_eager_pytorch_runs_the_norm_as_its_rmsnorm_kernel_sequence():
    shard = Shard(micro_batch=1, seq_len=TOKENS, tp=TP)
    model = _model(qk_norm=True)
    fused = {op.name: op for op in layer_ops(model, shard)}["qk_norm"]
    eager = {op.name: op for op in eager_ops(layer_ops(model, shard), model, Plan(compile=False))}["qk_norm"]
    assert eager.fwd_bytes == 6 * fused.fwd_bytes  # 36 B per element where the fused kernel moves 6 (fusion.py)


def test_the_norms_make_the_step_slower_and_the_plan_hold_more():
    def run(**model):
        return evaluate(scenario_from_dict({"model": {**MODEL, **model}, "cluster": {"node": "dgx-h100", "nodes": 1},
                                            "plan": {"tp": TP, "dp": 4, "micro_batch": 1, "global_batch": 32}}))
    plain, normed = run(), run(qk_norm=True)
    assert normed.step_time_s > plain.step_time_s
    assert normed.peak_memory_bytes > plain.peak_memory_bytes


def test_latent_attention_refuses_query_and_key_head_norms():
    with pytest.raises(InputError) as e:
        model_from_dict({"preset": "deepseek-v3", "qk_norm": True})
    assert e.value.field == "model.qk_norm"


def test_qwen3_configs_import_with_the_norms_and_qwen2_without():
    assert load_hf_config(str(HF / "qwen3-30b-a3b.json"), seq_len=4096).qk_norm
    assert not load_hf_config(str(HF / "qwen2-7b.json"), seq_len=4096).qk_norm


@pytest.mark.parametrize("extra, want", [("--qk-layernorm", True), ("", False),
                                         ("--qk-layernorm --multi-latent-attention --kv-lora-rank 512 "
                                          "--qk-head-dim 128 --qk-pos-emb-head-dim 64 --v-head-dim 128", False)])
def test_megatron_qk_layernorm_is_the_norm_of_the_query_and_key_heads(tmp_path, extra, want):
    path = tmp_path / "run.sh"
    path.write_text("torchrun pretrain_gpt.py --num-layers 32 --hidden-size 4096 --num-attention-heads 32 "
                    f"--seq-length 4096 --micro-batch-size 1 --global-batch-size 64 --bf16 {extra}\n")
    imported = import_config("megatron", path, {"cluster.node": "dgx-h100"})
    assert bool(imported.scenario["model"].get("qk_norm")) == want
    assert "qk-layernorm" not in {u["key"] for u in imported.unmapped}


def test_megatron_bridge_qk_layernorm_is_the_norm_of_the_query_and_key_heads(tmp_path):
    import yaml
    data = yaml.safe_load((Path(__file__).parent / "data" / "imports" /
                           "bridge-llama3_8b_sft_gb200_fp8_mx_v1.yaml").read_text())
    data["model"]["qk_layernorm"] = True
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(data))
    imported = import_config("megatron", path, {"cluster.node": "dgx-b200"})
    assert imported.scenario["model"]["qk_norm"] is True


@pytest.mark.parametrize("qk_layernorm, scope", [(True, "full"), (False, None)])
def test_megatron_bridges_olmoe_spec_norms_the_whole_query_and_key_projections(tmp_path, qk_layernorm, scope):
    import yaml
    data = yaml.safe_load((Path(__file__).parent / "data" / "imports" /
                           "bridge-llama3_8b_sft_gb200_fp8_mx_v1.yaml").read_text())
    data["model"]["transformer_layer_spec"] = {"_target_": "megatron.bridge.models.olmoe.olmoe_provider."
                                                           "olmoe_layer_spec", "_call_": False}
    data["model"]["qk_layernorm"] = qk_layernorm
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(data))
    model = import_config("megatron", path, {"cluster.node": "dgx-b200"}).scenario["model"]
    assert (bool(model.get("qk_norm")), model.get("qk_norm_scope")) == (qk_layernorm, scope)


def test_post_norms_add_two_hidden_wide_norms_a_layer_held_by_every_tp_rank():
    assert _model(post_norms=True).params() - _model().params() == 32 * 2 * 4096
    assert layer_params_local(_model(post_norms=True), TP) - layer_params_local(_model(), TP) == 2 * 4096


def test_post_norms_norm_the_attention_and_mlp_outputs_before_the_residual_adds():
    # sequence parallel: the outputs were reduce-scattered, each rank norms its 1/tp of the tokens
    shard = Shard(micro_batch=1, seq_len=TOKENS, tp=TP, sp=True)
    names = [op.name for op in layer_ops(_model(post_norms=True), shard)]
    assert names[names.index("attn_out") + 1] == "attn_post_norm"
    assert names[names.index("mlp_down") + 1:names.index("mlp_down") + 3] == ["mlp_post_norm", "mlp_residual"]
    ops = {op.name: op for op in layer_ops(_model(post_norms=True), shard)}
    elements = TOKENS // TP * 4096
    for name in ("attn_post_norm", "mlp_post_norm"):
        assert (ops[name].fwd_bytes, ops[name].saved_bytes) == (3 * 2 * elements, 2 * elements)


def test_op_level_recomputation_reruns_the_extra_norms():
    shard = Shard(micro_batch=1, seq_len=TOKENS, tp=TP)
    model = _model(post_norms=True, qk_norm=True)
    rerun = {op.name for op in layer_checkpoint(model, shard, "op-selective", layer_ops(model, shard)).rerun}
    assert {"qk_norm", "attn_post_norm", "mlp_post_norm"} <= rerun


OLMO = {"qk_norm": True, "qk_norm_scope": "full", "pre_norms": False, "post_norms": True}


def test_query_and_key_norms_over_the_whole_projections_weigh_their_widths():
    # Llama 3.1 8B's 32 query heads and 8 KV heads of 128: q_norm 4096 weights, k_norm 1024
    assert _model(qk_norm=True, qk_norm_scope="full").params() - _model().params() == 32 * (4096 + 1024)


def test_a_full_projection_norm_moves_the_bytes_of_the_head_norm():
    shard = Shard(micro_batch=1, seq_len=TOKENS, tp=1)
    head = {op.name: op for op in layer_ops(_model(qk_norm=True), shard)}["qk_norm"]
    full = {op.name: op for op in layer_ops(_model(qk_norm=True, qk_norm_scope="full"), shard)}["qk_norm"]
    assert (full.fwd_bytes, full.saved_bytes) == (head.fwd_bytes, head.saved_bytes)


def test_a_layer_without_pre_norms_has_neither_input_norm_and_keeps_neither_norms_input():
    shard = Shard(micro_batch=1, seq_len=TOKENS, tp=TP)
    names = {op.name for op in layer_ops(_model(pre_norms=False, post_norms=True), shard)}
    assert not names & {"attn_norm", "mlp_norm"} and {"attn_post_norm", "mlp_post_norm"} <= names
    # a TP rank without sequence parallelism norms every token: 2 B x 4096 x 4096 kept per norm
    kept = layer_saved_bytes(_model(post_norms=True), shard, "none") - \
        layer_saved_bytes(_model(pre_norms=False, post_norms=True), shard, "none")
    assert kept == 2 * 2 * TOKENS * 4096
    assert _model(post_norms=True).params() - _model(pre_norms=False, post_norms=True).params() == 32 * 2 * 4096


def test_olmo2s_layer_holds_two_hidden_norms_and_the_projection_norms_on_each_rank():
    assert layer_params_local(_model(**OLMO), 1) - layer_params_local(_model(), 1) == 4096 + 1024


def test_megatrons_mlp_checkpoint_is_the_mlp_between_its_input_and_output_norms():
    shard = Shard(micro_batch=1, seq_len=TOKENS, tp=TP)
    for fields, first in (({"post_norms": True}, "mlp_norm"), (OLMO, "mlp_gate_up")):
        model = _model(**fields)
        rerun = [op.name for op in layer_checkpoint(model, shard, "selective", layer_ops(model, shard),
                                                    ("mlp",)).rerun]
        assert rerun[0] == first and rerun[-1] == "mlp_down", rerun


def test_every_norm_is_a_parameter_tensor_of_the_optimizers_loop():
    # RMSNorms: one weight tensor each; OLMo 2's layer has four norms where Llama's has two
    assert param_tensors(_model(**OLMO), 32, True, True, True) - param_tensors(_model(), 32, True, True, True) == 64


@pytest.mark.parametrize("fields, key", [({"qk_norm_scope": "full"}, "model.qk_norm_scope"),
                                         ({"qk_norm_scope": "all"}, "model.qk_norm_scope")])
def test_a_norm_scope_without_query_and_key_norms_or_unknown_is_refused(fields, key):
    with pytest.raises(InputError) as e:
        _model(**fields)
    assert e.value.field == key


def test_moe_models_keep_their_pre_norms():
    with pytest.raises(InputError) as e:
        model_from_dict({"preset": "mixtral-8x7b", "pre_norms": False, "post_norms": True})
    assert e.value.field == "model.pre_norms"


def test_projection_norms_under_tensor_parallelism_are_refused_and_run_without_it():
    def run(tp):
        return evaluate(scenario_from_dict({"model": {**MODEL, **OLMO}, "cluster": {"node": "dgx-h100", "nodes": 1},
                                            "plan": {"tp": tp, "dp": 8 // tp, "micro_batch": 1, "global_batch": 32}}))
    with pytest.raises(InputError) as e:
        run(2)
    assert e.value.field == "plan.tp"
    assert run(1).step_time_s > 0


def test_olmo2_32bs_preset_counts_its_gqa_projection_norms_by_hand():
    # 64 layers: attention 5120 x (5120 + 2 x 1024) + 5120 x 5120, SwiGLU 3 x 5120 x 27648, two
    # output norms of 5120, q_norm over 40 x 128 and k_norm over 8 x 128; two untied
    # 100352 x 5120 tables and the final norm
    from simulator.model import load_preset
    layer = 5120 * (5120 + 2 * 1024) + 5120 * 5120 + 3 * 5120 * 27648 + 2 * 5120 + 5120 + 1024
    assert load_preset("olmo-2-32b").params() == 64 * layer + 2 * 100352 * 5120 + 5120 == 32_234_279_936


@pytest.mark.parametrize("recompute", ["none", "selective", "full", "op-selective"])
def test_vectorised_olmo2_plans_equal_scalar_evaluate(recompute):
    scenarios = [scenario_from_dict({"model": {"preset": "olmo-2-7b"}, "cluster": {"node": "dgx-h100", "nodes": 2},
                                     "plan": {"tp": 1, "pp": pp, "dp": 16 // pp, "micro_batch": 2,
                                              "global_batch": 64, "zero_stage": 1 if pp > 1 else 3,
                                              "recompute": recompute}})
                 for pp in (1, 2, 4)]
    for s, got in zip(scenarios, evaluate_many(scenarios)):
        want = evaluate(s, engine="analytic").to_dict()
        assert got["step_time_s"] == pytest.approx(want["step_time_s"], rel=1e-12)
        assert got["peak_memory_gib"] == pytest.approx(want["peak_memory_gib"], rel=1e-12)
