"""Parallel blocks (model.parallel_block): attention and MLP both read the layer input, through
their own norms or one shared norm (model.shared_norm), and x + attn + mlp is the layer's
output (GPT-J, GPT-NeoX, Falcon). GPT-NeoX's framework reduces the sum of the two TP branches
once in the forward pass; autograd keeps a tensor two operators read once."""

import pytest

from simulator import InputError, evaluate, scenario_from_dict
from simulator.comm import collective_time
from simulator.dims import groups as process_groups
from simulator.memory import layer_saved_bytes
from simulator.model import model_from_dict
from simulator.passes import tp_layer_comm_s
from simulator.vector import evaluate_many
from simulator.workload import Shard, layer_ops

MODEL = {"preset": "llama-3.1-8b", "seq_len": 4096}
TOKENS, TP = 4096, 2


def _model(**fields):
    return model_from_dict({**MODEL, **fields})


def _scenario(model=None, **plan):
    return scenario_from_dict({"model": {**MODEL, "parallel_block": True, **(model or {})},
                               "cluster": {"node": "dgx-h100", "nodes": 1},
                               "plan": {"tp": TP, "dp": 8 // TP, "micro_batch": 1, "global_batch": 32, **plan}})


@pytest.mark.parametrize("sp", [False, True])
def test_the_branches_sum_is_reduced_once_forward_and_both_inputs_backward(sp):
    s = _scenario(sequence_parallel=sp)
    shard = Shard(micro_batch=1, seq_len=TOKENS, tp=TP, sp=sp)
    nbytes = 2 * TOKENS * 4096  # a bf16 hidden state of the micro-batch
    cluster = s.cluster
    groups = process_groups(s.plan, cluster)
    fwd, bwd = (float(t) for t in tp_layer_comm_s(s.model, shard, groups, cluster))
    ar, ag, rs = (float(collective_time(kind, nbytes, groups.tp, cluster)) for kind in ("all_reduce", "all_gather",
                                                                                   "reduce_scatter"))
    if sp:  # two input gathers and one reduce-scatter; two gradient scatters, one gather, two re-gathers
        assert (fwd, bwd) == pytest.approx((2 * ag + rs, 3 * ag + 2 * rs), rel=1e-12)
    else:
        assert (fwd, bwd) == pytest.approx((ar, 2 * ar), rel=1e-12)


def test_the_second_norm_keeps_nothing_of_its_own_and_a_shared_norm_neither_the_mlps_input():
    shard = Shard(micro_batch=1, seq_len=TOKENS, tp=TP)
    sequential = layer_saved_bytes(_model(), shard, "none")
    hidden = 2 * TOKENS * 4096  # no sequence parallelism: each TP rank keeps whole hidden states
    # the MLP's norm reads the layer input attn_norm keeps (not the attention's residual sum)
    assert sequential - layer_saved_bytes(_model(parallel_block=True), shard, "none") == hidden
    # one norm for both: its output, kept by the QKV projection, is the MLP's input too
    assert sequential - layer_saved_bytes(_model(parallel_block=True, shared_norm=True), shard, "none") == 2 * hidden


def test_a_shared_norm_weighs_one_norm_less_a_layer():
    assert _model(parallel_block=True).params() - _model(parallel_block=True, shared_norm=True).params() == 32 * 4096


def test_the_block_sums_its_branches_then_adds_the_input():
    names = [op.name for op in layer_ops(_model(parallel_block=True), Shard(micro_batch=1, seq_len=TOKENS, tp=TP))]
    assert names[-2:] == ["branch_sum", "mlp_residual"] and "attn_residual" not in names


def test_fewer_collectives_make_a_tp_step_faster():
    sequential = scenario_from_dict({"model": MODEL, "cluster": {"node": "dgx-h100", "nodes": 1},
                                     "plan": {"tp": TP, "dp": 4, "micro_batch": 1, "global_batch": 32}})
    assert evaluate(_scenario()).breakdown_s["tp_comm"] < evaluate(sequential).breakdown_s["tp_comm"]


@pytest.mark.parametrize("model, plan, field", [
    ({"post_norms": True}, {}, "model.parallel_block"),
    ({"parallel_block": False, "shared_norm": True}, {}, "model.shared_norm"),
    ({}, {"tp_comm_overlap": True, "sequence_parallel": True}, "plan.tp_comm_overlap"),
    ({}, {"precision": "fp8"}, "plan.precision"),
    ({}, {"recompute": "op-selective"}, "plan.recompute"),
    ({}, {"recompute": "selective", "recompute_modules": ["mlp"]}, "plan.recompute_modules"),
])
def test_what_parallel_blocks_are_not_modelled_with_is_refused(model, plan, field):
    with pytest.raises(InputError) as e:
        _scenario(model, **plan)
    assert e.value.field == field


def test_a_mixture_of_experts_model_keeps_sequential_blocks():
    with pytest.raises(InputError) as e:
        model_from_dict({"preset": "mixtral-8x7b", "parallel_block": True})
    assert e.value.field == "model.parallel_block"


def test_vectorised_parallel_block_plans_equal_scalar_evaluate():
    scenarios = [_scenario({"shared_norm": shared}, tp=tp, dp=8 // tp, sequence_parallel=sp and tp > 1,
                           recompute=recompute)
                 for tp in (1, 2, 4) for sp in (False, True) for shared in (False, True)
                 for recompute in ("none", "full")]
    for s, got in zip(scenarios, evaluate_many(scenarios)):
        want = evaluate(s, engine="analytic").to_dict()
        assert got["step_time_s"] == pytest.approx(want["step_time_s"], rel=1e-12)
        assert got["peak_memory_gib"] == pytest.approx(want["peak_memory_gib"], rel=1e-12)
