"""Sliding-window attention (workload.window_pair_fraction): the band a windowed layer attends."""

import pytest

from attention_bands import DENSE, attention_fwd_flops, scenario as _scenario
from simulator import InputError, evaluate, scenario_from_dict
from simulator.workload import model_flops_per_sequence, window_pair_fraction


def test_a_window_of_a_quarter_of_the_sequence_attends_seven_sixteenths_of_the_causal_half():
    # s = 4096, W = 1024: s·W - W²/2 = 4,194,304 - 524,288 = 3,670,016 pairs of s²/2 = 8,388,608
    every = _scenario({**DENSE, "sliding_window": 1024}).model
    assert window_pair_fraction(every) == pytest.approx(0.4375, rel=1e-15)
    # every other layer (0 and 2 of 4): (2 x 0.4375 + 2) / 4
    alternate = _scenario({**DENSE, "sliding_window": 1024, "sliding_window_freq": 2}).model
    assert window_pair_fraction(alternate) == pytest.approx(0.71875, rel=1e-15)


def test_windowed_layers_drop_the_pairs_outside_the_band_from_the_model_flops():
    # per layer and sequence the useful attention is 12·h FLOPs per pair (QK^T and AV, forward
    # and two backward products each, 2 FLOPs per multiply-add): causal s²/2 pairs, band s·W - W²/2
    s, w, h = DENSE["seq_len"], 1024, DENSE["hidden"]
    full = _scenario(DENSE).model
    windowed = _scenario({**DENSE, "sliding_window": w, "sliding_window_freq": 2}).model
    dropped = 2 * 12 * h * (s * s / 2 - (s * w - w * w / 2))
    assert model_flops_per_sequence(full) - model_flops_per_sequence(windowed) == pytest.approx(dropped, rel=1e-12)


@pytest.mark.parametrize("band", [{"sliding_window": 512}, {"document_tokens": 4096}], ids=["window", "documents"])
def test_a_narrower_band_shortens_the_step_with_flash_attention_and_saves_no_activations(band):
    long = {**DENSE, "seq_len": 32768}  # attention outweighs the host's kernel launches
    full, narrow = _scenario(long), _scenario({**long, **band})
    for engine in ("analytic", "graph"):
        a, b = evaluate(full, engine), evaluate(narrow, engine)
        assert b.step_time_s < a.step_time_s
        assert b.peak_memory_bytes == a.peak_memory_bytes


def test_gpt_oss_120b_evaluates_on_even_periods_of_its_alternating_windows():
    s = scenario_from_dict({"model": {"preset": "gpt-oss-120b"}, "cluster": {"node": "dgx-h100", "nodes": 4},
                            "plan": {"tp": 1, "pp": 2, "dp": 16, "ep": 8, "micro_batch": 1, "global_batch": 64}})
    assert evaluate(s, "analytic").step_time_s > 0


ALTERNATE_6 = {**DENSE, "layers": 6, "sliding_window": 1024, "sliding_window_freq": 2}


def test_ranks_holding_parts_of_a_window_period_attend_their_own_share():
    # layers 0-2 on rank 0 (windows on 0 and 2), 3-5 on rank 1 (a window on 4): bands
    # (2 x 0.4375 + 1) / 3 = 0.625 and (0.4375 + 2) / 3 = 0.8125; together the model's 6 x 0.71875
    from simulator.schedules import SCHEDULES
    from simulator.stagesplit import representatives
    s = _scenario(ALTERNATE_6, pp=2, dp=4)
    reps = representatives(s.model, s.plan, SCHEDULES["1f1b"], s.plan.pp)
    bands = [window_pair_fraction(s.model, n, w) for n, w in zip(reps.layers, reps.sliding_layers)]
    assert bands[0] == pytest.approx(0.625) and bands[2] == pytest.approx(0.8125)
    assert 3 * bands[0] + 3 * bands[2] == pytest.approx(6 * window_pair_fraction(s.model))


def test_of_two_middle_ranks_with_three_layers_the_one_with_more_windows_is_faster():
    # layout 1, 3, 3, 1 of 8 layers: rank 1 holds layers 1-3 (one window, on 2), rank 2 layers
    # 4-6 (two, on 4 and 6)
    from simulator.evaluate import compile_scenario
    model = {**DENSE, "layers": 8, "seq_len": 32768, "sliding_window": 1024, "sliding_window_freq": 2}
    s = _scenario(model, pp=4, dp=2, pipeline_layout=[1, 3, 3, 1])
    layout = compile_scenario(s)
    one, two = layout.representative(1), layout.representative(2)
    assert one.layers == two.layers == 3
    assert two.passes.fwd_s < one.passes.fwd_s
    a, g = evaluate(s, "analytic"), evaluate(s, "graph")
    assert g.step_time_s == pytest.approx(a.step_time_s, rel=0.05)


def test_gpt_oss_120b_evaluates_on_four_stages_of_nine_layers():
    """Megatron-Bridge's GPT-OSS 120B H100 recipe splits its 36 alternating layers over 4 stages."""
    s = scenario_from_dict({"model": {"preset": "gpt-oss-120b"}, "cluster": {"node": "dgx-h100", "nodes": 4},
                            "plan": {"tp": 1, "pp": 4, "dp": 8, "ep": 8, "micro_batch": 1, "global_batch": 64}})
    assert evaluate(s, "analytic").step_time_s > 0


@pytest.mark.parametrize("model,plan,field", [
    ({**DENSE, "sliding_window": 1024}, {"cp": 2, "dp": 4}, "plan.cp_attention"),
    ({**DENSE, "sliding_window": 1024}, {"cp": 2, "dp": 4, "cp_attention": "torch-allgather"}, "plan.cp_attention"),
    ({**DENSE, "sliding_window": 1024, "mtp_layers": 1}, {}, "model.mtp_layers"),
])
def test_what_the_window_model_cannot_represent_is_refused(model, plan, field):
    with pytest.raises(InputError, match=field.replace(".", r"\.")):
        _scenario(model, **plan)


def test_ulysses_context_parallelism_splits_the_windowed_work_over_the_heads():
    # Ulysses: each of 2 ranks attends the whole sequence with 8 of 16 heads, half of one
    # rank's forward attention: per layer the band's 0.4375 of 4096²/2 pairs, 4·h FLOPs each
    model = _scenario({**DENSE, "sliding_window": 1024}, cp=2, dp=4, cp_attention="ulysses").model
    assert attention_fwd_flops(model, 1) == pytest.approx(0.4375 * 4096**2 / 2 * 4 * 1024, rel=1e-15)
    assert attention_fwd_flops(model, 2) == pytest.approx(attention_fwd_flops(model, 1) / 2, rel=1e-15)
    s = _scenario({**DENSE, "seq_len": 32768, "sliding_window": 4096}, cp=2, dp=4, cp_attention="ulysses")
    assert evaluate(s, "graph").step_time_s > 0


def _busiest_rank_fwd_flops(model: dict, cp: int) -> tuple[float, float]:
    """Executed and useful forward attention FLOPs of one layer on the busiest of `cp` ranks
    under TE's all-gather."""
    from simulator.layermix import layer_operators
    from simulator.workload import ATTENTION_CORE, Shard

    sc = _scenario(model, cp=cp, dp=8 // cp, cp_attention="kv-allgather")
    ops = layer_operators(sc.model, Shard(micro_batch=1, seq_len=sc.model.seq_len, cp=cp), sc.plan)
    core = next(op for op in ops if op.group == ATTENTION_CORE)
    return core.fwd_flops, core.model_flops


def test_the_all_gathers_busiest_rank_holds_the_most_windowed_work():
    # 8,192 tokens in 8 chunks of 1,024 = c, window 4,096: chunks 0-3 hold 0.5, 1.5, 2.5, 3.5 c²
    # pairs, chunks 4-7 4 c² each; rank r holds chunks r and 7 - r: 4.5, 5.5, 6.5, 7.5 c², the
    # mean 6 c². The busiest (rank 3) runs 7.5 c² pairs, 4·h FLOPs each forward.
    from simulator.cpattention import allgather_window_imbalance

    model = {**DENSE, "seq_len": 8192, "sliding_window": 4096}
    assert allgather_window_imbalance(_scenario(model).model, 4) == 1.25
    executed, _ = _busiest_rank_fwd_flops(model, 4)
    assert executed == pytest.approx(7.5 * 1024**2 * 4 * 1024, rel=1e-12)


def test_the_all_gather_balances_full_causal_layers_and_only_the_windowed_ones_weigh_more():
    # every other layer windowed: per layer pair 7.5 c² (busiest, windowed) + 8 c² (full causal:
    # 2 x 8² c²/2 over 4 ranks), half each; the useful work stays the mean, (6 + 8) / 2 c²
    model = {**DENSE, "seq_len": 8192, "sliding_window": 4096, "sliding_window_freq": 2}
    executed, useful = _busiest_rank_fwd_flops(model, 4)
    c2 = 1024**2
    assert executed == pytest.approx((7.5 + 8) / 2 * c2 * 4 * 1024, rel=1e-12)
    assert useful == pytest.approx((6 + 8) / 2 * c2 * 3 * 4 * 1024, rel=1e-12)  # forward and both gradients


def test_a_window_skip_frequency_leaves_each_nth_layer_full():
    # 12 layers, each 6th full (Gemma 3): layers 5 and 11 attend fully, the other 10 in a window
    # of 1024 over 4096 tokens (the band's 0.4375 of the causal half)
    model = _scenario({**DENSE, "layers": 12, "sliding_window": 1024, "sliding_window_skip_freq": 6}).model
    assert [i for i in range(12) if not model.is_sliding_window_layer(i)] == [5, 11]
    assert window_pair_fraction(model) == pytest.approx((10 * 0.4375 + 2 * 1.0) / 12, rel=1e-15)


def test_pipeline_ranks_count_their_own_windowed_layers_under_a_skip_frequency():
    # 12 layers, each 6th full, 4 stages of 3: ranks hold layers 0-2 (3 windowed), 3-5 (2),
    # 6-8 (3), 9-11 (2)
    from simulator.schedules import get
    from simulator.stagesplit import rank_layer_kinds

    model = _scenario({**DENSE, "layers": 12, "sliding_window": 1024, "sliding_window_skip_freq": 6}).model
    kinds = rank_layer_kinds(model, (3, 3, 3, 3), 4, get("1f1b"))
    assert [k[2] for k in kinds] == [3, 2, 3, 2]


@pytest.mark.parametrize("fields", [
    {"sliding_window": 1024, "sliding_window_skip_freq": 1},  # every layer full: no window
    {"sliding_window_skip_freq": 6},  # no window to skip
    {"sliding_window": 1024, "sliding_window_freq": 2, "sliding_window_skip_freq": 6},  # two patterns
])
def test_a_skip_frequency_that_states_no_pattern_is_refused(fields):
    with pytest.raises(InputError, match=r"model\.sliding_window_skip_freq"):
        _scenario({**DENSE, **fields})


def test_the_report_names_the_window_and_how_many_layers_have_it():
    from simulator.report import sequence_cell

    model = _scenario({**DENSE, "layers": 12, "sliding_window": 1024, "sliding_window_skip_freq": 6,
                       "document_tokens": 2048}).model
    assert sequence_cell(model) == "4096 (documents of 2048; window 1024 on 10 of 12 layers)"
