"""Multi-token prediction (mtp.py): where its depths run, what they add, what is refused."""

import pytest

from simulator import InputError, evaluate, scenario_from_dict
from simulator.evaluate import compile_scenario
from simulator.workload import model_flops_per_sequence

# a small DeepSeek-like MoE model: 4 layers, 8 experts of width 512, top-2, one shared expert
MOE = {"layers": 4, "hidden": 1024, "heads": 8, "ffn_hidden": 4096, "vocab": 32000, "seq_len": 2048,
       "activation": "swiglu", "bias": False, "position_embedding": "rope", "norm": "rmsnorm",
       "tied_embeddings": False, "experts": 8, "top_k": 2, "expert_ffn_hidden": 512, "shared_experts": 1}
DENSE = {k: v for k, v in MOE.items() if k not in ("experts", "top_k", "expert_ffn_hidden", "shared_experts")}


def _scenario(model, **plan):
    return scenario_from_dict({"model": model, "cluster": {"node": "dgx-h100", "nodes": 1},
                               "plan": {"tp": 1, "pp": 2, "dp": 4, "micro_batch": 1, "global_batch": 32, **plan}})


def test_a_depth_adds_a_layer_the_projection_and_the_logits_to_the_model_flops():
    # Megatron-LM training.py num_floating_point_operations: per token and depth, one layer,
    # 6 x 2h x h for eh_proj and 6 x h x V for the logits (its 6 x 3h norm term is the norms,
    # which llmsim times as memory-bound kernels without FLOPs)
    s, h, v = DENSE["seq_len"], DENSE["hidden"], DENSE["vocab"]
    plain, deeper, two = (_scenario({**DENSE, **change}, pp=1, dp=8).model
                          for change in ({}, {"layers": 5}, {"mtp_layers": 2}))
    layer = model_flops_per_sequence(deeper) - model_flops_per_sequence(plain)
    assert model_flops_per_sequence(two) - model_flops_per_sequence(plain) == pytest.approx(
        2 * (layer + 6 * s * (2 * h * h + h * v)), rel=1e-12)


@pytest.mark.parametrize("tied", [False, True])
def test_the_head_stage_holds_the_depth_an_embedding_copy_and_nothing_moves_elsewhere(tied):
    h, v = MOE["hidden"], MOE["vocab"]
    model = {**MOE, "tied_embeddings": tied}
    plain = compile_scenario(_scenario(model))
    mtp = compile_scenario(_scenario({**model, "mtp_layers": 1}))
    spec = _scenario(model).model
    # tp = ep = 1: the depth's MoE layer whole, eh_proj 2h x h, three RMSNorms, and the
    # embedding table the last stage builds for the depth's input (a tied head is that table)
    added = spec.moe_layer_params() + 2 * h * h + 3 * h + (0 if tied else v * h)
    assert float(mtp.stages[-1].params - plain.stages[-1].params) == pytest.approx(added, rel=1e-12)
    assert float(mtp.stages[0].params) == float(plain.stages[0].params)
    assert float(mtp.stages[0].passes.fwd_s) == float(plain.stages[0].passes.fwd_s)
    assert float(mtp.stages[-1].passes.fwd_s) > float(plain.stages[-1].passes.fwd_s)


def test_a_model_with_depths_is_slower_per_step_and_more_flops_per_token():
    plain, mtp = _scenario(MOE), _scenario({**MOE, "mtp_layers": 1})
    for engine in ("analytic", "graph"):
        a, b = evaluate(plain, engine), evaluate(mtp, engine)
        assert b.step_time_s > a.step_time_s
        assert b.model_flops_per_step > a.model_flops_per_step


@pytest.mark.parametrize("model,plan,field", [
    ({**MOE, "mtp_layers": 1}, {"cp": 2, "dp": 2}, "plan.cp"),
    ({**DENSE, "mtp_layers": 1, "position_embedding": "learned"}, {}, "model.position_embedding"),
])
def test_what_megatron_core_does_not_run_with_mtp_is_refused(model, plan, field):
    with pytest.raises(InputError, match=field.replace(".", r"\.")):
        _scenario(model, **plan)


def test_vectorised_plans_with_depths_equal_scalar_evaluate():
    from simulator.vector import evaluate_many

    scenarios = [_scenario({**MOE, "mtp_layers": 2}, pp=pp, dp=8 // pp, ep=ep, zero_stage=zero)
                 for pp in (1, 2, 4) for ep in (1, 2) for zero in (1, 3)]
    for s, got in zip(scenarios, evaluate_many(scenarios)):
        want = evaluate(s, "analytic").to_dict()
        assert got["step_time_s"] == pytest.approx(want["step_time_s"], rel=1e-9)
        assert got["peak_memory_gib"] == pytest.approx(want["peak_memory_gib"], rel=1e-9)
