"""Uneven pipeline stages: Megatron-Core's first/last-stage counts and per-virtual-stage layouts
hold the layers the frameworks put on each rank; what a split cannot do is refused."""

import pytest

from simulator import InputError, evaluate, scenario_from_dict
from simulator.evaluate import compile_scenario
from simulator.schedules import SCHEDULES
from simulator.stagesplit import balanced_layout, rank_layer_kinds

MODEL_126 = {"layers": 126, "hidden": 1024, "heads": 8, "kv_heads": 8, "ffn_hidden": 4096, "vocab": 32000,
             "seq_len": 1024, "activation": "swiglu", "norm": "rmsnorm", "position_embedding": "rope",
             "bias": False, "tied_embeddings": False}


def scenario(**plan):
    base = {"tp": 1, "pp": 8, "dp": 1, "micro_batch": 1, "global_batch": 16}
    return scenario_from_dict({"model": MODEL_126, "cluster": {"node": "dgx-h100", "nodes": 1},
                               "plan": {**base, **plan}})


def test_first_and_last_counts_leave_the_rest_evenly_to_the_middle_ranks():
    layout = compile_scenario(scenario(first_stage_layers=15, last_stage_layers=15))
    assert [float(r.layers) for r in layout.stages] == [15, 16, 15]
    assert [int(r.count) for r in layout.stages] == [1, 6, 1]


def test_one_given_count_splits_the_rest_over_the_other_ranks():
    # Megatron-Core: 126 - 14 = 112 layers over the 7 other ranks
    layout = compile_scenario(scenario(first_stage_layers=14))
    assert [float(r.layers) for r in layout.stages] == [14, 16, 16]


def test_the_first_stage_holds_its_layers_and_the_embedding():
    s = scenario(first_stage_layers=15, last_stage_layers=15)
    layout = compile_scenario(s)
    first, middle, _ = layout.stages
    m = s.model
    per_layer = m.dense_layer_params()
    assert float(first.params) == pytest.approx(15 * per_layer + m.vocab * m.hidden)
    assert float(middle.params) == pytest.approx(16 * per_layer)


def test_a_layout_gives_each_rank_the_virtual_stages_the_schedule_places_on_it():
    layout = [7] + [8] * 14 + [7]  # torchtitan's split of 126 layers into 16 stages
    s = scenario(schedule="interleaved", vpp=2, pipeline_layout=layout)
    assert [k[0] for k in rank_layer_kinds(s.model, layout, 8, SCHEDULES["interleaved"])] == [15] + [16] * 6 + [15]
    assert [float(r.layers) for r in compile_scenario(s).stages] == [15, 16, 15]


def test_the_slower_middle_ranks_set_the_pipeline_step():
    even = evaluate(scenario(pp=2, dp=4, global_batch=64, first_stage_layers=63, last_stage_layers=63), "analytic")
    uneven = evaluate(scenario(pp=2, dp=4, global_batch=64, first_stage_layers=62, last_stage_layers=64), "analytic")
    assert uneven.step_time_s > even.step_time_s


def test_both_engines_agree_on_an_uneven_pipeline():
    s = scenario(first_stage_layers=15, last_stage_layers=15)
    a, g = evaluate(s, "analytic"), evaluate(s, "graph")
    assert g.step_time_s == pytest.approx(a.step_time_s, rel=0.05)
    assert g.peak_memory_bytes == pytest.approx(a.peak_memory_bytes, rel=0.05)


UNEQUAL_MIDDLES = [15, 17, 15, 16, 16, 16, 16, 15]


def test_middle_ranks_of_different_layers_each_get_a_representative():
    layout = compile_scenario(scenario(pipeline_layout=UNEQUAL_MIDDLES))
    # first 15; the middle ranks hold 17, 15 and 16 x 4 (each timed at its earliest stage); last 15
    assert [float(r.layers) for r in layout.stages] == [15, 17, 15, 16, 15]
    assert [int(r.count) for r in layout.stages] == [1, 1, 1, 4, 1]
    assert [int(r.stage) for r in layout.stages] == [0, 1, 2, 3, 7]
    assert [layout.representative(i).layers for i in range(8)] == UNEQUAL_MIDDLES


def test_the_rank_with_the_most_layers_sets_the_pipeline_step():
    s = scenario(pipeline_layout=UNEQUAL_MIDDLES)
    even = scenario(pipeline_layout=[15] + [16] * 6 + [15])
    slow = compile_scenario(s).stages[1]
    # a device runs its passes one after another: m micro-batches of its 17 layers at least
    busy = s.plan.microbatches * (slow.passes.forward_s + slow.passes.backward_input_s + slow.passes.bwd_weight_s)
    for engine in ("analytic", "graph"):
        step = evaluate(s, engine).step_time_s
        assert step > evaluate(even, engine).step_time_s
        assert step >= busy
    # the analytic engine executes the 1F1B order with each stage's own passes, as the graph does
    a, g = evaluate(s, "analytic"), evaluate(s, "graph")
    assert g.step_time_s == pytest.approx(a.step_time_s, rel=0.01)
    assert g.peak_memory_bytes == pytest.approx(a.peak_memory_bytes, rel=1e-9)


def test_each_middle_rank_holds_the_weights_of_its_own_layers():
    s = scenario(pipeline_layout=UNEQUAL_MIDDLES)
    by_stage = evaluate(s, "analytic").memory_by_stage
    per_layer = by_stage[3]["weights"] / 16
    assert [by_stage[i]["weights"] for i in range(1, 7)] == pytest.approx([n * per_layer for n in UNEQUAL_MIDDLES[1:7]])


@pytest.mark.parametrize("plan,field", [
    ({"first_stage_layers": 15, "last_stage_layers": 16}, "plan.first_stage_layers"),  # 95 over 6 middle ranks
    ({"pp": 1, "dp": 8, "first_stage_layers": 15}, "plan.first_stage_layers"),
    ({"schedule": "interleaved", "vpp": 2, "first_stage_layers": 15, "last_stage_layers": 15},
     "plan.first_stage_layers"),  # 15 layers do not split over 2 chunks
    ({"pipeline_layout": [16] * 7}, "plan.pipeline_layout"),  # 7 entries for 8 stages
    ({"pipeline_layout": [16] * 8}, "plan.pipeline_layout"),  # 128 layers
    ({"pipeline_layout": [15] * 8, "first_stage_layers": 15}, "plan.pipeline_layout"),
    ({"pipeline_layout": "16,16"}, "plan.pipeline_layout"),
    ({}, "plan.pp"),  # 126 layers do not divide over 8 stages without a split
])
def test_a_split_the_pipeline_cannot_hold_is_refused_naming_the_field(plan, field):
    with pytest.raises(InputError) as err:
        scenario(**plan)
    assert err.value.field == field


# ------------------------------------------------------------------ the balanced split

@pytest.mark.parametrize("layers, stages, want", [
    (126, 16, (7,) + (8,) * 14 + (7,)),  # 128 weighed layers, 8 a stage; the ends give one up
    (32, 4, (8, 9, 8, 7)),  # 34 weighed: 8 a stage and 2 over, to stages 0 and 1
    (24, 6, (4, 5, 4, 4, 4, 3)),  # 26 weighed: 4 a stage and 2 over
    (10, 1, (10,)),
])
def test_the_balanced_split_weighs_the_embedding_and_the_output_as_a_layer_each(layers, stages, want):
    assert balanced_layout(layers, stages) == want


@pytest.mark.parametrize("layers, stages", [(1, 4), (3, 6)])
def test_the_balanced_split_leaves_no_stage_lighter_than_the_embedding(layers, stages):
    # 3 weighed layers over 4 stages leave one empty; 5 over 6 too (torchtitan refuses both)
    assert balanced_layout(layers, stages) is None


def test_a_balanced_plan_predicts_what_its_split_as_a_layout_predicts():
    for plan in ({}, {"schedule": "interleaved", "vpp": 2}, {"schedule": "zb-v"}):
        stages = 8 * (2 if plan else 1)
        balanced = evaluate(scenario(pipeline_split="balanced", **plan), "analytic")
        layout = evaluate(scenario(pipeline_layout=list(balanced_layout(126, stages)), **plan), "analytic")
        assert (balanced.step_time_s, balanced.memory_by_stage) == (layout.step_time_s, layout.memory_by_stage)


def test_a_balanced_split_of_126_layers_over_8_ranks_lightens_the_first_and_last():
    # 128 weighed layers: 16 a rank, the first and last ranks 15 decoder layers beside the
    # embedding and the lm_head; even stages cannot hold 126 layers over 8 ranks at all
    layout = compile_scenario(scenario(pipeline_split="balanced"))
    assert [(int(r.stage), int(r.count), int(r.layers)) for r in layout.stages] == [(0, 1, 15), (1, 6, 16),
                                                                                     (7, 1, 15)]


@pytest.mark.parametrize("plan", [
    {"pipeline_split": "balanced", "first_stage_layers": 15},
    {"pipeline_split": "balanced", "pipeline_layout": [15] + [16] * 6 + [15]},
    {"pipeline_split": "balanced", "pp": 8, "model_layers": 6},  # 8 weighed layers: a stage of one is the embedding
    {"pipeline_split": "uneven"},
])
def test_a_balanced_split_the_pipeline_cannot_hold_is_refused(plan):
    plan = dict(plan)
    layers = plan.pop("model_layers", None)
    model = {**MODEL_126, "layers": layers} if layers else MODEL_126
    with pytest.raises(InputError) as err:
        scenario_from_dict({"model": model, "cluster": {"node": "dgx-h100", "nodes": 1},
                            "plan": {"tp": 1, "pp": 8, "dp": 1, "micro_batch": 1, "global_batch": 16, **plan}})
    assert err.value.field == "plan.pipeline_split"


# ------------------------------------------------------------------ models with experts

DEEPSEEK_LAYOUT = [1] + [2] * 30 + [0]  # Megatron-Bridge's DeepSeek-V3 layout Et|(tt|)*30mL


def moe_scenario(model=None, **plan):
    base = {"tp": 1, "pp": 8, "dp": 1, "ep": 1, "micro_batch": 1, "global_batch": 16}
    model = model or {"preset": "deepseek-v3", "layers": 16, "mtp_layers": 0, "seq_len": 1024}
    return scenario_from_dict({"model": model, "cluster": {"node": "dgx-h100", "nodes": 1}, "plan": {**base, **plan}})


def test_a_rank_holds_the_layer_kinds_of_the_layer_indices_placed_on_it():
    # virtual stage k (1..30) holds layers 2k-1 and 2k; layers 0-2 are dense; rank r holds
    # virtual stages r, r+8, r+16, r+24: rank 0 layers 0, 15-16, 31-32, 47-48; rank 1 layers
    # 1-2, 17-18, 33-34, 49-50; rank 7 layers 13-14, 29-30, 45-46 and the empty stage 31
    s = moe_scenario({"preset": "deepseek-v3", "seq_len": 1024}, schedule="interleaved", vpp=4,
                     pipeline_layout=DEEPSEEK_LAYOUT, global_batch=64)
    kinds = rank_layer_kinds(s.model, tuple(DEEPSEEK_LAYOUT), 8, SCHEDULES["interleaved"])
    assert kinds == [(7, 6, 0), (8, 6, 0)] + [(8, 8, 0)] * 5 + [(6, 6, 0)]  # (layers, MoE, sliding)
    layout = compile_scenario(s)
    assert [(int(r.stage), int(r.count), int(r.layers)) for r in layout.stages] == [(0, 1, 7), (1, 1, 8), (2, 5, 8),
                                                                                     (7, 1, 6)]


def test_dense_layers_past_the_first_stage_are_held_by_the_ranks_they_fall_on():
    # 16 layers over 8 ranks: rank 0 holds dense layers 0-1, rank 1 dense layer 2 and MoE
    # layer 3, ranks 2-7 two MoE layers each
    s = moe_scenario()
    m = s.model
    layout = compile_scenario(s)
    head = m.vocab * m.hidden + m.hidden  # untied lm_head and the final norm
    want = [2 * m.dense_layer_params() + m.vocab * m.hidden, m.dense_layer_params() + m.moe_layer_params(),
            2 * m.moe_layer_params(), 2 * m.moe_layer_params() + head]
    assert [float(r.params) for r in layout.stages] == pytest.approx(want, rel=1e-12)
    assert sum(float(r.params) * int(r.count) for r in layout.stages) == pytest.approx(m.params(), rel=1e-12)


def test_first_and_last_counts_and_the_same_layout_predict_the_same():
    counts = evaluate(moe_scenario(first_stage_layers=1, last_stage_layers=3), "analytic")
    layout = evaluate(moe_scenario(pipeline_layout=[1, 2, 2, 2, 2, 2, 2, 3]), "analytic")
    assert (counts.step_time_s, counts.memory_by_stage) == (layout.step_time_s, layout.memory_by_stage)


def test_both_engines_agree_on_an_uneven_moe_pipeline():
    s = scenario_from_dict({"model": {"preset": "deepseek-v3", "seq_len": 1024},
                            "cluster": {"node": "dgx-h100", "nodes": 8},
                            "plan": {"tp": 2, "pp": 8, "ep": 4, "sequence_parallel": True, "schedule": "interleaved",
                                     "vpp": 4, "pipeline_layout": DEEPSEEK_LAYOUT, "micro_batch": 1,
                                     "global_batch": 64}})
    a, g = evaluate(s, "analytic"), evaluate(s, "graph")
    assert g.step_time_s == pytest.approx(a.step_time_s, rel=0.05)
    assert g.peak_memory_bytes == pytest.approx(a.peak_memory_bytes, rel=0.05)


@pytest.mark.parametrize("pp", [2, 4])
def test_moe_layers_at_an_offset_fall_on_the_ranks_their_indices_put_them(pp):
    # 8 layers, MoE on the odd ones past 3 dense (3, 5, 7): at PP 2 rank 0 holds 0-3 (one MoE),
    # rank 1 4-7 (two); at PP 4 ranks hold (0,1), (2,3), (4,5), (6,7): 0, 1, 1, 1 MoE layers.
    # The closed form (even split) and the layer-by-layer count (the same split as a layout)
    # agree with that
    model = {"preset": "mixtral-8x7b", "layers": 8, "dense_layers": 3, "moe_layer_freq": 2, "moe_layer_offset": 1,
             "seq_len": 1024}
    plan = {"tp": 1, "pp": pp, "ep": 1, "micro_batch": 1, "global_batch": 16}
    even = scenario_from_dict({"model": model, "cluster": {"node": "dgx-h100", "nodes": 1}, "plan": plan})
    laid = scenario_from_dict({"model": model, "cluster": {"node": "dgx-h100", "nodes": 1},
                               "plan": {**plan, "pipeline_layout": [8 // pp] * pp}})
    m = even.model
    moe_per_rank = {2: [1, 2], 4: [0, 1, 1, 1]}[pp]
    assert [k[1] for k in rank_layer_kinds(m, (8 // pp,) * pp, pp, SCHEDULES["1f1b"])] == moe_per_rank
    per_rank = [(8 // pp - n) * m.dense_layer_params() + n * m.moe_layer_params() for n in moe_per_rank]
    per_rank[0] += m.vocab * m.hidden
    per_rank[-1] += m.vocab * m.hidden + m.hidden
    for s in (even, laid):
        stages = compile_scenario(s).stages
        got = {int(r.stage): float(r.params) for r in stages}
        assert got == {k: pytest.approx(per_rank[k], rel=1e-12) for k in got}
    a, b = evaluate(even, "analytic"), evaluate(laid, "analytic")
    assert (a.step_time_s, a.memory_by_stage) == (b.step_time_s, b.memory_by_stage)
