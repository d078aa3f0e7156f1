"""Muon (plan.optimizer: muon), as Megatron-Core runs it: one fp32 momentum on each of the
layers' weight matrices (Adam for the word embedding, output layer, norms and biases), each
matrix orthogonalised by Newton-Schulz steps of three GEMMs (a TP-split one gathered whole,
per shard or distributed over the ranks), the elementwise kernels and workspace around them,
the matrices shared out over the DP ranks by the layer-wise distributed optimizer
(zero_stage 1); its import from Megatron-LM arguments and Megatron-Bridge configs."""

from pathlib import Path

import pytest
import yaml

from simulator import InputError, evaluate, scenario_from_dict
from simulator.comm import collective_time
from simulator.dims import groups
from simulator.goodput import checkpoint_bytes
from simulator.importers import import_config
from simulator.layout import compile_layout
from simulator.model import model_from_dict
from simulator.muon import model_matrix_params, ns_flops, rank_sides, stage_costs, stage_matrices
from simulator.vector import evaluate_many

LLAMA_8B = {"preset": "llama-3.1-8b", "seq_len": 4096}
H, KV, F, LAYERS = 4096, 1024, 14336, 32
# Llama 3.1 8B's matrices of a layer: Q, O 4096 x 4096; K, V 1024 x 4096; gate and up 28672 x
# 4096 (one fused matrix); down 4096 x 14336
LAYER_MATRIX_PARAMS = H * H + 2 * KV * H + H * H + 2 * F * H + H * F


def _scenario(tp=1, dp=8, nodes=1, **plan):
    return scenario_from_dict({"model": LLAMA_8B, "cluster": {"node": "dgx-h100", "nodes": nodes},
                               "plan": {"tp": tp, "dp": dp, "micro_batch": 1, "global_batch": 8 * dp,
                                        "sequence_parallel": tp > 1, "zero_stage": 1, **plan}})


def test_newton_schulz_runs_three_gemms_a_step_on_the_smaller_side():
    # X 1024 x 4096: X X^T 2·1024²·4096, A·A 2·1024³, B·X 2·1024²·4096, five steps
    assert ns_flops(1024, 4096, 5) == ns_flops(4096, 1024, 5) == 5 * (4 * 1024 ** 2 * 4096 + 2 * 1024 ** 3) \
        == 96_636_764_160


def test_newton_schulz_flops_are_torchs_count_of_the_iteration():
    torch = pytest.importorskip("torch")
    from torch.utils.flop_counter import FlopCounterMode
    g = torch.randn(96, 320)
    with FlopCounterMode(display=False) as counter:
        x = g / g.norm()
        for _ in range(5):  # Jordan et al. 2024's quintic iteration
            a = x @ x.T
            b = -4.775 * a + 2.0315 * (a @ a)
            x = 3.4445 * x + b @ x
    assert ns_flops(96, 320, 5) == counter.get_total_flops()


def test_muon_orthogonalises_q_k_v_apart_and_the_fused_gate_and_up():
    s = _scenario()
    matrices = stage_matrices(s.model, 1, LAYERS, 0)
    per_layer = (2 * ns_flops(H, H, 1) + 2 * ns_flops(KV, H, 1) + ns_flops(2 * F, H, 1) + ns_flops(H, F, 1))
    assert sum(m.count * ns_flops(m.rows, m.cols, 1) for m in matrices) == LAYERS * per_layer
    assert model_matrix_params(s.model) == LAYERS * LAYER_MATRIX_PARAMS


def test_the_matrices_of_a_latent_attention_moe_model_are_all_its_parameters_but_tables_and_norms():
    # DeepSeek-V3 with its MTP depth: a layer's two norms and two latent norms (the depth's
    # layer too), the depth's three (enorm, hnorm, its final norm) and the model's final norm
    m = model_from_dict({"preset": "deepseek-v3"})
    assert m.mtp_layers == 1
    norms = (m.layers + 1) * (2 * m.hidden + m.q_lora_rank + m.kv_lora_rank) + 3 * m.hidden + m.hidden
    assert model_matrix_params(m) == m.params() - 2 * m.vocab * m.hidden - norms


def test_a_learned_position_table_is_a_muon_matrix_and_the_tied_word_table_is_not():
    # Megatron tags the word embedding and the output layer only (language_module.py): GPT's
    # 2048 x 2304 position table is orthogonalised; LayerNorms (2 x 2h a layer and the final
    # one) and biases (qkv 3h, proj h, up 4h, down h a layer) stay with Adam
    m = model_from_dict({"preset": "megatron-gpt-1.7b"})
    h = m.hidden
    assert (m.position_embedding, m.tied_embeddings, m.bias) == ("learned", True, True)
    assert model_matrix_params(m) == m.params() - m.vocab * h - m.layers * (4 * h + 9 * h) - 2 * h
    layer = 3 * h * h + h * h + 2 * 4 * h * h
    assert model_matrix_params(m) == m.layers * layer + m.seq_len * h


def test_each_momentum_takes_4_bytes_where_adams_two_moments_take_8():
    adam, muon = _scenario(tp=2, dp=4), _scenario(tp=2, dp=4, optimizer="muon")
    a, b = (compile_layout(s.model, s.cluster, s.plan).stages[0].states for s in (adam, muon))
    assert float(a.optimizer_bytes - b.optimizer_bytes) == pytest.approx(4 * LAYERS * LAYER_MATRIX_PARAMS / 2 / 4)
    assert float(a.weights_bytes) == float(b.weights_bytes) and float(a.gradients_bytes) == float(b.gradients_bytes)


def test_a_checkpoint_is_4_bytes_a_matrix_parameter_smaller():
    adam, muon = _scenario(), _scenario(optimizer="muon")
    a, b = (checkpoint_bytes(compile_layout(s.model, s.cluster, s.plan)) for s in (adam, muon))
    assert a - b == 4 * LAYERS * LAYER_MATRIX_PARAMS


def _costs(s):
    g = groups(s.plan, s.cluster)
    return stage_costs(stage_matrices(s.model, s.plan.tp, LAYERS, 0), s.plan, g, s.cluster, s.plan.dp, 1), g


def test_the_layer_wise_distributed_optimizer_shares_the_newton_schulz_work_over_dp():
    every = _costs(_scenario(dp=8, optimizer="muon", zero_stage=0))[0]
    shared = _costs(_scenario(dp=8, optimizer="muon"))[0]
    assert float(shared.ns_s) == pytest.approx(float(every.ns_s) / 8)


def test_no_rank_orthogonalises_less_than_its_largest_whole_matrix():
    # 32 x 7 matrices over 512 DP ranks: the busiest rank updates a 28672 x 4096 gate-and-up
    # matrix, more than the mean share (a sixteenth of a layer's Newton-Schulz FLOPs, by hand)
    s = _scenario(dp=512, nodes=64, optimizer="muon")
    g = groups(s.plan, s.cluster)
    fc1 = [m for m in stage_matrices(s.model, 1, 1, 0) if m.rows == 2 * F]
    alone = stage_costs(fc1, s.plan, g, s.cluster, 1, 1)
    assert float(_costs(s)[0].ns_s) == pytest.approx(float(alone.ns_s))


def test_each_matrix_momentum_is_all_gathered_in_fp32_over_tp():
    s = _scenario(tp=2, dp=4, optimizer="muon")
    costs, g = _costs(s)
    shapes = [(H, H), (KV, H), (KV, H), (H, H), (2 * F, H), (H, F)]
    want = sum(LAYERS / 4 * collective_time("all_gather", r * c * 4, g.tp, s.cluster) for r, c in shapes)
    assert float(costs.tp_comm_s) == pytest.approx(float(want))
    assert float(_costs(_scenario(tp=1, optimizer="muon"))[0].tp_comm_s) == 0.0


def _rank_flops(s, mode):
    """Newton-Schulz FLOPs of one step on every matrix of a layer as one TP rank runs them."""
    def flops(m, n):
        return 4 * m * m * n + 2 * m ** 3
    return sum(flops(*map(float, rank_sides(m, mode))) for m in stage_matrices(s.model, s.plan.tp, 1, 0))


def test_blockwise_orthogonalises_each_tp_shard_alone_without_a_collective():
    # TP 2: Q 2048 x 4096, K and V 512 x 4096, O 4096 x 2048, gate-and-up 14336 x 4096, down 4096 x 7168
    s = _scenario(tp=2, dp=4, optimizer="muon", muon_tp_mode="blockwise")
    by_hand = 2 * (4 * 2048 ** 2 * 4096 + 2 * 2048 ** 3) + 2 * (4 * 512 ** 2 * 4096 + 2 * 512 ** 3) + \
        (4 * 4096 ** 2 * 14336 + 2 * 4096 ** 3) + (4 * 4096 ** 2 * 7168 + 2 * 4096 ** 3)
    assert _rank_flops(s, "blockwise") == by_hand
    assert float(_costs(s)[0].tp_comm_s) == 0.0


def test_distributed_whitens_the_unsplit_side_and_all_reduces_each_steps_gram_matrix():
    # TP 2 splits Q, K, V and gate-and-up by rows, O and down by columns: every rank whitens a
    # 4096-wide side (K and V too: their 1024 rows are the split side) over its half of the other
    s = _scenario(tp=2, dp=4, optimizer="muon", muon_tp_mode="distributed")
    halves = (2048, 512, 512, 2048, 14336, 7168)
    assert _rank_flops(s, "distributed") == sum(4 * 4096 ** 2 * n + 2 * 4096 ** 3 for n in halves)
    costs, g = _costs(s)
    per_matrix = 5 * collective_time("all_reduce", 2 * 4096 ** 2, g.tp, s.cluster) + \
        collective_time("all_reduce", 4, g.tp, s.cluster)
    assert float(costs.tp_comm_s) == pytest.approx(float(LAYERS / 4 * 6 * per_matrix))


def test_the_elementwise_kernels_around_newton_schulz_are_counted_per_element():
    # bf16 training, TP 2: the down projection (4096 x 14336, columns split) a rank updates:
    # lerp 12 B, weight decay 8, update 12, fp32 -> bf16 parameter copy 6 over its 4096 x 7168
    # local elements; normalise 12, two casts 12, two scale multiplies 16 over the gathered
    # 4096 x 14336 it iterates on, and the gather's concatenation 8 over those
    from simulator.muon import _matrix_elementwise
    s = _scenario(tp=2, dp=4)
    down, q = [m for m in stage_matrices(s.model, 2, 1, 0) if m.rows == H and m.cols == F][0], \
        stage_matrices(s.model, 2, 1, 0)[0]
    nbytes, kernels = _matrix_elementwise(down, H * F, "duplicated", True, 2)
    assert (float(nbytes), float(kernels)) == (38 * H * F / 2 + 40 * H * F + 8 * H * F, 3 + 1 + 6 + 1)
    # a query piece, each shard alone: its 2048 x 4096 shard copied out of the grouped QKV and back
    nbytes, kernels = _matrix_elementwise(q, H * H / 2, "blockwise", True, 2)
    assert (float(nbytes), float(kernels)) == ((38 + 40 + 16) * H * H / 2, 3 + 1 + 6 + 4 / 3)


def test_muon_adds_its_newton_schulz_and_gathers_to_the_optimizer_step():
    adam, muon = (evaluate(_scenario(tp=2, dp=4, **p), engine="analytic") for p in ({}, {"optimizer": "muon"}))
    assert muon.to_dict()["step_time_s"] > adam.to_dict()["step_time_s"]


def test_the_newton_schulz_workspace_raises_the_peak_where_the_activations_are_smaller():
    # TP 2, duplicated: the rank updating a 28672 x 4096 gate-and-up matrix holds its gathered
    # shards and their concatenation (8 B an element of the whole) and F.normalize's fp32 copy
    # beside its bf16 cast (6 B): 14 B x 28672 x 4096, more than this short-sequence plan's
    # activations, which are freed by the optimizer step
    plan = dict(tp=2, dp=4, recompute="full")
    model = {"preset": "llama-3.1-8b", "seq_len": 512}
    adam, muon = (scenario_from_dict({"model": model, "cluster": {"node": "dgx-h100", "nodes": 1},
                                      "plan": {**plan, "micro_batch": 1, "global_batch": 32, "zero_stage": 1,
                                               "sequence_parallel": True, **extra}})
                  for extra in ({}, {"optimizer": "muon"}))
    a, b = (compile_layout(s.model, s.cluster, s.plan) for s in (adam, muon))
    ma, mb = a.stage_memory(a.stages[0]), b.stage_memory(b.stages[0])
    workspace = 14 * 2 * F * H
    assert float(mb.activations) < workspace
    assert float(mb.other - ma.other) == pytest.approx(workspace - float(mb.activations))


def test_a_muon_plan_is_flagged_beyond_the_published_runs_which_all_ran_adam():
    flags = evaluate(_scenario(optimizer="muon"), engine="analytic").to_dict()["outside_validation"]
    assert {"field": "plan.optimizer", "value": "muon", "checked": ["adam"]} in flags
    assert not [f for f in evaluate(_scenario(), engine="analytic").to_dict()["outside_validation"]
                if f["field"] == "plan.optimizer"]


def test_vectorised_muon_plans_equal_scalar_evaluate():
    dense = [_scenario(tp=tp, dp=8 // tp, optimizer="muon", zero_stage=z, muon_tp_mode=mode) for tp in (1, 2, 4)
             for z in (0, 1) for mode in ("duplicated", "blockwise", "distributed")]
    moe = [scenario_from_dict({"model": {"preset": "deepseek-v3", "layers": 16, "mtp_layers": mtp, "seq_len": 1024},
                               "cluster": {"node": "dgx-h100", "nodes": 4},
                               "plan": {"pp": pp, "tp": tp, "ep": 2, "sequence_parallel": True, "micro_batch": 1,
                                        "global_batch": 64, "dp": "auto", "zero_stage": 1, "optimizer": "muon"}})
           for pp in (2, 4) for tp in (1, 2) for mtp in (0, 1)]
    for s, got in zip(dense + moe, evaluate_many(dense + moe)):
        want = evaluate(s, engine="analytic").to_dict()
        assert got["step_time_s"] == pytest.approx(want["step_time_s"], rel=1e-12)
        assert got["peak_memory_gib"] == pytest.approx(want["peak_memory_gib"], rel=1e-12)


@pytest.mark.parametrize("plan,field", [
    ({"zero_stage": 2}, "plan.zero_stage"), ({"zero_stage": 3}, "plan.zero_stage"),
    ({"offload": {"optimizer": "cpu"}}, "plan.offload.optimizer"), ({"dp_replicate": 2}, "plan.dp_replicate"),
    ({"optimizer_precision": "bf16-moments"}, "plan.optimizer_precision"),
    ({"fp32_params": True}, "plan.fp32_params"), ({"fp8_params": True, "precision": "fp8"}, "plan.fp8_params"),
    ({"tp_impl": "dtensor", "tp": 2, "dp": 4}, "plan.tp_impl")])
def test_what_muon_is_not_modelled_with_is_refused(plan, field):
    with pytest.raises(InputError) as e:
        _scenario(**{"optimizer": "muon", **plan})
    assert e.value.field == field


@pytest.mark.parametrize("field,value", [("muon_ns_steps", 6), ("muon_tp_mode", "blockwise")])
def test_muon_settings_need_muon(field, value):
    with pytest.raises(InputError) as e:
        _scenario(**{field: value})
    assert e.value.field == f"plan.{field}"


MEGATRON = ["--num-layers", "24", "--hidden-size", "2048", "--num-attention-heads", "16", "--seq-length", "2048",
            "--max-position-embeddings", "2048", "--micro-batch-size", "1", "--global-batch-size", "64",
            "--tensor-model-parallel-size", "2", "--bf16"]


def _imported(*args):
    return import_config("megatron", None, {"cluster.node": "dgx-h100"}, argv=[*MEGATRON, *args]).scenario["plan"]


def test_megatron_muon_with_the_distributed_optimizer_is_the_layer_wise_one():
    plan = _imported("--optimizer", "muon", "--use-distributed-optimizer", "--muon-num-ns-steps", "6",
                     "--muon-tp-mode", "distributed")
    assert (plan["optimizer"], plan["zero_stage"], plan["muon_ns_steps"], plan["muon_tp_mode"]) == \
        ("muon", 1, 6, "distributed")
    assert (_imported("--optimizer", "dist_muon")["zero_stage"], _imported("--optimizer", "muon")["zero_stage"]) == \
        (1, 0)  # dist_muon: deprecated for --optimizer muon --use-distributed-optimizer


@pytest.mark.parametrize("args,key", [
    (["--optimizer", "sgd"], "optimizer"), (["--muon-tp-mode", "ring"], "muon-tp-mode"),
    (["--muon-fp32-matmul-prec", "high"], "muon-fp32-matmul-prec"), (["--muon-use-syrk"], "muon-use-syrk"),
    (["--muon-no-split-qkv"], "muon-no-split-qkv"), (["--muon-coefficient-type", "cubic5"], "muon-coefficient-type"),
    (["--use-torch-fsdp2"], "optimizer")])
def test_megatron_muon_settings_llmsim_does_not_model_are_refused(args, key):
    with pytest.raises(InputError, match=f"megatron {key}:"):
        _imported(*(["--optimizer", "muon"] if args[0] != "--optimizer" else []), *args)


BRIDGE = Path(__file__).parent / "data" / "imports" / "bridge-llama3_8b_sft_gb200_fp8_mx_v1.yaml"


def _bridge(tmp_path, **optimizer):
    data = yaml.safe_load(BRIDGE.read_text())
    data["optimizer"].update(optimizer)
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(data))
    return import_config("megatron", tmp_path / "c.yaml", {"cluster.node": "dgx-b200"}).scenario["plan"]


def test_a_megatron_bridge_dist_muon_config_is_muon_under_the_layer_wise_optimizer(tmp_path):
    # the recipe helper distributed_muon_with_cosine_annealing's optimizer: dist_muon, blockwise TP
    plan = _bridge(tmp_path, optimizer="dist_muon", muon_num_ns_steps=6)
    assert (plan["optimizer"], plan["zero_stage"], plan["muon_tp_mode"], plan["muon_ns_steps"]) == \
        ("muon", 1, "blockwise", 6)
    assert "optimizer" not in _bridge(tmp_path)  # its own Adam: no optimizer field, Adam by default


@pytest.mark.parametrize("optimizer,key", [
    ({"optimizer": "muon"}, "optimizer.optimizer"),  # beside ddp's distributed optimizer, not layer-wise
    ({"optimizer": "dist_muon", "muon_split_qkv": False}, "optimizer.muon_split_qkv"),
    ({"optimizer": "dist_muon", "muon_use_syrk": True}, "optimizer.muon_use_syrk"),
    ({"optimizer": "lion"}, "optimizer.optimizer")])
def test_megatron_bridge_muon_settings_llmsim_does_not_model_are_refused(tmp_path, optimizer, key):
    with pytest.raises(InputError, match=key):
        _bridge(tmp_path, **optimizer)
