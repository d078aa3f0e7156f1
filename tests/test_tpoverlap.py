"""TP communication overlapped as TransformerEngine userbuffers and PyTorch async TP do it: what
stays exposed beside each GEMM, what the split GEMMs and the communication SMs cost."""

import numpy as np
import pytest

from simulator import InputError, evaluate, scenario_from_dict
from simulator.evaluate import compile_scenario
from simulator.tpoverlap import BULK, PIPELINE, RING, exposed_s


def test_a_ring_all_gather_hides_behind_all_but_the_local_chunk_of_its_gemm():
    # 8 chunks: the first GEMM chunk uses the local shard, the 7 others hide the transfer
    assert exposed_s(RING, 1.0, 0.8, 8) == pytest.approx(1.0 - 0.8 * 7 / 8)
    assert exposed_s(RING, 0.5, 1.0, 8) == 0.0


def test_a_pipelined_reduce_scatter_always_exposes_its_last_chunk():
    assert exposed_s(PIPELINE, 1.0, 10.0, 4) == pytest.approx(0.25)
    assert exposed_s(PIPELINE, 1.0, 0.8, 4) == pytest.approx(1.0 - 0.8 + 0.2)


def test_a_bulk_overlap_hides_up_to_its_partner_gemm():
    assert exposed_s(BULK, 1.0, 0.6, 1) == pytest.approx(0.4)
    assert exposed_s(BULK, 0.6, 1.0, 1) == 0.0


def scenario(**plan):
    base = {"tp": 8, "pp": 1, "dp": 1, "micro_batch": 1, "global_batch": 4, "sequence_parallel": True}
    return scenario_from_dict({"model": {"preset": "llama-3.1-70b", "layers": 8, "seq_len": 8192},
                               "cluster": {"node": "dgx-h100", "nodes": 1}, "plan": {**base, **plan}})


def tp_seconds(s):
    r = compile_scenario(s).stages[0].passes
    return float(r.tp_fwd_s), float(r.tp_bwd_s)


def test_userbuffers_hide_part_of_the_tp_traffic_not_all_of_it():
    plain = tp_seconds(scenario())
    ub = tp_seconds(scenario(tp_comm_overlap=True))
    assert 0 < ub[0] < plain[0] and 0 < ub[1] < plain[1]


def test_async_tp_hides_only_forward_collectives():
    plain = tp_seconds(scenario())
    fwd, bwd = tp_seconds(scenario(tp_comm_overlap=True, tp_overlap="async-tp"))
    assert fwd < plain[0] and bwd == pytest.approx(plain[1])


def test_the_overlap_costs_the_split_gemms_their_start_up_and_userbuffers_its_sms():
    plain = compile_scenario(scenario()).stages[0].passes.fwd_s
    ub = compile_scenario(scenario(tp_comm_overlap=True)).stages[0].passes.fwd_s
    asy = compile_scenario(scenario(tp_comm_overlap=True, tp_overlap="async-tp")).stages[0].passes.fwd_s
    assert plain < asy < ub  # async TP takes no SMs, TE's pipeline GEMMs lose 16 of 132


def test_overlap_never_makes_a_step_slower_than_not_overlapping_with_fast_links():
    base = evaluate(scenario(), "analytic").step_time_s
    assert evaluate(scenario(tp_comm_overlap=True), "analytic").step_time_s < base


def test_an_unknown_overlap_implementation_is_refused():
    with pytest.raises(InputError, match="plan.tp_overlap"):
        scenario(tp_overlap="flux")


def test_without_tensor_parallelism_nothing_changes():
    s = scenario_from_dict({"model": {"preset": "llama-3.1-8b", "seq_len": 4096},
                            "cluster": {"node": "dgx-h100", "nodes": 1},
                            "plan": {"tp": 1, "dp": 8, "micro_batch": 1, "global_batch": 8, "tp_comm_overlap": True}})
    assert np.all(compile_scenario(s).stages[0].passes.tp_fwd_s == 0.0)


def test_an_moe_layer_overlaps_its_attention_collectives_as_a_dense_layer_does():
    """Mixtral 8x7B (every layer MoE, no shared experts) at TP 4 with userbuffers: a layer's TP
    collectives are its attention block's, each beside its own GEMM as in a dense layer: QKV's
    all-gather in a ring of 4 beside the QKV GEMM, the projection's reduce-scatter pipelined in 4
    beside its GEMM; backward the projection's gather in a ring beside its input-gradient GEMM,
    QKV's reduce-scatter and re-gather in bulk beside its weight- and input-gradient GEMMs. None
    hides behind the experts' GEMMs."""
    from simulator.comm import collective_time
    from simulator.compute import op_times
    from simulator.layermix import layer_operators
    from simulator.moe import plan_experts
    s = scenario_from_dict({"model": {"preset": "mixtral-8x7b", "layers": 4, "seq_len": 4096},
                            "cluster": {"node": "dgx-h100", "nodes": 1},
                            "plan": {"tp": 4, "pp": 1, "dp": 2, "ep": 2, "micro_batch": 1, "global_batch": 2,
                                     "sequence_parallel": True, "tp_comm_overlap": True}})
    layout = compile_scenario(s)
    acc, tp = s.cluster.accelerator, layout.groups.tp
    ops = {op.name: op for op in layer_operators(s.model, layout.shard, s.plan, plan_experts(s.plan), acc)}
    qkv, proj = op_times(ops["qkv"], acc, "bf16"), op_times(ops["attn_out"], acc, "bf16")
    nbytes = 2 * 4096 * 4096  # the gathered layer input (the collective's whole size), BF16
    ag, rs = (collective_time(k, nbytes, tp, s.cluster) for k in ("all_gather", "reduce_scatter"))
    fwd = exposed_s(RING, ag, qkv.fwd_s, 4) + exposed_s(PIPELINE, rs, proj.fwd_s, 4)
    bwd = (exposed_s(RING, ag, proj.bwd_input_s, 4) + exposed_s(BULK, rs, qkv.bwd_weight_s, 1)
           + exposed_s(BULK, ag, qkv.bwd_input_s, 1))
    passes = layout.stages[0].passes
    assert (float(passes.tp_fwd_s), float(passes.tp_bwd_s)) == pytest.approx((4 * fwd, 4 * bwd), rel=1e-9)
