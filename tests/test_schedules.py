"""Pipeline schedules on a communication-free pipeline of equal stages, where the step time has
closed forms worked by hand: (m + p - 1)(F + B) for GPipe and 1F1B (Huang et al. 2019;
Narayanan et al. 2021), a bubble of (p-1)/(v m) for interleaved 1F1B (Narayanan et al. 2021),
(p-1)(F+I-W) for ZB-H1 once m >= p (Qi et al. 2024), and for the V-shaped schedules the
forward fill of p-1 chunks. Each schedule's in-flight counts, its closed form and the graph
engine's execution of its order must agree."""

import numpy as np
import pytest

from simulator import evaluate
from simulator.engine import run, simulate
from simulator.errors import InputError
from simulator.graph import uniform_graph
from simulator.schedules import SCHEDULES, StageTimes, drain_tail_in_order, grad_tail_in_order, offloaded_in_order, \
    parse_explicit, peak_in_flight, pipeline_makespan, stage_times


def step(schedule, p, m, v=1, f=1.0, b=2.0, w=0.0):
    return run(uniform_graph(schedule, p, m, v, f, b, w)).step_time_s


def bubble_fraction(schedule, p, m, v=1, f=1.0, b=2.0, w=0.0):
    ideal = m * (f + b + w)
    return (step(schedule, p, m, v, f, b, w) - ideal) / ideal


@pytest.mark.parametrize("p,m", [(2, 4), (4, 8), (4, 16), (8, 32), (4, 1), (4, 2), (1, 5)])
def test_1f1b_step_is_m_plus_p_minus_1_passes(p, m):
    assert step("1f1b", p, m) == pytest.approx((m + p - 1) * 3.0, rel=1e-12)


@pytest.mark.parametrize("p,m", [(4, 8), (8, 16), (4, 2), (1, 4)])
def test_gpipe_step_is_m_plus_p_minus_1_passes(p, m):
    assert step("gpipe", p, m) == pytest.approx((m + p - 1) * 3.0, rel=1e-12)


@pytest.mark.parametrize("p,m,v", [(4, 8, 2), (4, 16, 4), (8, 32, 2), (2, 6, 3)])
def test_interleaved_bubble_is_p_minus_1_over_v_m(p, m, v):
    assert bubble_fraction("interleaved", p, m, v) == pytest.approx((p - 1) / (v * m), rel=1e-12)


@pytest.mark.parametrize("p,m", [(2, 4), (4, 8), (4, 16), (8, 32)])
def test_zb_h1_bubble_is_a_third_of_1f1b_when_f_b_w_are_equal(p, m):
    one = bubble_fraction("1f1b", p, m, f=1.0, b=1.0, w=1.0)
    zb = bubble_fraction("zb-h1", p, m, f=1.0, b=1.0, w=1.0)
    assert one == pytest.approx(3 * (p - 1) / (3 * m))
    assert zb == pytest.approx(one / 3, rel=1e-12)


@pytest.mark.parametrize("p,m", [(4, 1), (4, 2), (4, 3), (8, 5), (6, 12)])
def test_zb_h1_drain_is_filled_by_one_w_per_earlier_micro_batch(p, m):
    # The last micro-batch drains through p-1 stages (F + I each); each waiting stage fills the
    # drain with its postponed W passes, one per earlier micro-batch, at most p-1:
    # bubble (p-1)(F+I) - min(m-1, p-1) W. With F = 1, I = 2, W = 1:
    f, b, w = 1.0, 2.0, 1.0
    expected = m * (f + b + w) + (p - 1) * (f + b) - min(m - 1, p - 1) * w
    assert step("zb-h1", p, m, f=f, b=b, w=w) == pytest.approx(expected, rel=1e-12)


def test_zb_h1_w_longer_than_the_slot_it_fills_delays_the_next_input_gradient():
    # p = 2, m = 2, F = I = 1, W = 3. Stage 1: F0 1-2, I0 2-3, F1 3-4, I1 4-5, W0 5-8, W1 8-11.
    # Stage 0: F0 0-1, F1 1-2, I0 3-4 (after stage 1's), W0 4-7, I1 7-8 (its gradient came at
    # 5: the W it ran in the wait outlasted the wait by 2), W1 8-11. Step 11, where Qi et al.'s
    # m(F+I+W) + (p-1)(F+I-W) gives 9; with min(W, F, I) in W's place, 11.
    assert step("zb-h1", 2, 2, f=1.0, b=1.0, w=3.0) == pytest.approx(11.0, rel=1e-12)
    times = stage_times([1.0, 0.0, 1.0], [1.0, 0.0, 1.0], [3.0, 0.0, 3.0], [1, 0, 1])
    assert SCHEDULES["zb-h1"].step_s(times, 2, 2, 1) == pytest.approx(11.0, rel=1e-12)


@pytest.mark.parametrize("p,m", [(2, 2), (4, 4), (4, 9), (8, 19)])
@pytest.mark.parametrize("f,b,w", [(1.0, 1.0, 1.0), (1.0, 2.0, 0.5), (1.0, 1.0, 3.0), (1.0, 2.0, 1.5),
                                   (1.7, 0.6, 1.2), (1.0, 0.5, 0.3)])
def test_zb_h1_stage_ends_in_closed_form_are_the_executed_orders_on_equal_stages(p, m, f, b, w):
    from simulator.schedules import _compiled_order, _stage_ends
    s = SCHEDULES["zb-h1"]
    ends = _stage_ends(_compiled_order("zb-h1", p, m, 1), [f] * p, [b] * p, [w] * p)
    times = stage_times([f] * 3, [b] * 3, [w] * 3, [1, max(p - 2, 0), 1])
    step, slacks = s.pipeline_run(times, p, m, 1, list(range(p)))
    assert step == pytest.approx(ends.max(), rel=1e-12)
    assert [float(x) for x in slacks] == pytest.approx(list(ends.max() - ends), abs=1e-9)


def test_zb_h1_hides_a_lighter_first_stage_s_drain_behind_the_last_stage_s_postponed_w_passes():
    # p = 2, m = 2; stage 0: F = 1, I = 2, W = 1; stage 1 (the loss, MTP) twice as long.
    # Stage 1: F0 1-3, I0 3-7, F1 7-9, I1 9-13, W0 13-15, W1 15-17. Stage 0: F0 0-1, F1 1-2,
    # I0 7-9, W0 9-10, I1 13-15, W1 15-16. Step 17: the fill and stage 1's 2 x 8, where the form
    # before (the slowest stage's m periods and every other stage's F + I - W) gave 18.
    s = SCHEDULES["zb-h1"]
    times = stage_times([1.0, 0.0, 2.0], [2.0, 0.0, 4.0], [1.0, 0.0, 2.0], [1, 0, 1])
    step, slacks = s.pipeline_run(times, 2, 2, 1, [0, 1])
    assert step == pytest.approx(17.0, rel=1e-12)
    assert [float(x) for x in slacks] == pytest.approx([1.0, 0.0], abs=1e-12)


@pytest.mark.parametrize("p,m", [(3, 3), (4, 9), (8, 8), (8, 21), (16, 40)])
def test_zb_h1_closed_form_is_a_close_lower_bound_of_the_executed_order_on_unequal_stages(p, m):
    """The bounds every stage's end obeys hold for any pass times, so the form is never above
    the executed order; on stages 15 % apart it stays within 3 % of it."""
    s = SCHEDULES["zb-h1"]
    rng = np.random.default_rng(p * 100 + m)
    for _ in range(20):
        f = rng.uniform(0.85, 1.15, 3)
        b, w = f * rng.uniform(1.2, 2.2) * rng.uniform(0.85, 1.15, 3), f * rng.uniform(0.2, 1.6) * rng.uniform(0.85, 1.15, 3)
        per_stage = [[x[0]] + [x[1]] * (p - 2) + [x[2]] for x in (f, b, w)]
        executed = pipeline_makespan(s, s.orders(p, m, 1), p, 1, *per_stage)
        got = float(s.pipeline_s(stage_times(list(f), list(b), list(w), [1, p - 2, 1]), p, m, 1))
        assert executed * (1 - 0.03) <= got <= executed * (1 + 1e-12)


@pytest.mark.parametrize("p,m", [(2, 4), (4, 8), (4, 13), (8, 16)])
def test_zb_v_leaves_only_the_forward_fill_when_passes_are_equal(p, m):
    # Two chunks per device, F = I = W = 1 per chunk (3 per stage): every stage runs 6m units;
    # stage p-1 cannot start before the first micro-batch's chunk-0 forward has crossed the p-1
    # stages before it, and the order never idles after that: 6m + (p - 1).
    assert step("zb-v", p, m, f=2.0, b=2.0, w=2.0) == pytest.approx(6 * m + p - 1, rel=1e-12)


@pytest.mark.parametrize("p,m", [(2, 4), (4, 8), (3, 9), (8, 16)])
def test_dualpipe_v_leaves_only_the_forward_fill_when_passes_are_equal(p, m):
    assert step("dualpipe-v", p, m, f=2.0, b=2.0, w=2.0) == pytest.approx(6 * m + p - 1, rel=1e-12)


@pytest.mark.parametrize("p,m", [(2, 4), (4, 8), (8, 24)])
def test_zb_v_holds_at_most_2p_chunks_like_1f1b_stage_0(p, m):
    # 1F1B's stage 0 holds p micro-batches of a whole stage = 2p chunks of half a stage; ZB-V's
    # memory limit keeps every stage there once m >= 2p (Qi et al. 2024, Sec. 6)
    orders = SCHEDULES["zb-v"].orders(p, m, 2)
    assert [peak_in_flight(o)[0] for o in orders] == [2 * p] * p


@pytest.mark.parametrize("p,m", [(2, 4), (4, 8), (8, 24)])
def test_dualpipe_v_holds_2p_plus_1_chunks(p, m):
    # DualPipe README table: activation per device PP + 1 for PP = 2p virtual stages. Counting
    # the order: 2(p-r-1) + 2(r+1) = 2p forwards before the first backward, and the first
    # pair of the steady phase adds one more forward before its backward.
    orders = SCHEDULES["dualpipe-v"].orders(p, m, 2)
    assert [peak_in_flight(o)[0] for o in orders] == [2 * p + 1] * p


# the last seven run past 4p micro-batches, where counts are read off orders of 2p-5p
# micro-batches and extrapolated over their period p (schedules._periods)
SHAPES = [(1, 1), (1, 3), (2, 1), (2, 2), (2, 5), (4, 4), (4, 8), (4, 3), (3, 12), (8, 16), (8, 5),
          (1, 7), (2, 11), (2, 14), (3, 17), (3, 18), (4, 24), (5, 31)]


def schedule_and_orders(name, p, m):
    """(schedule, chunks per device, its orders), skipping shapes the schedule refuses."""
    s = SCHEDULES[name]
    if name in ("zb-v", "dualpipe-v") and m < 2 * p or name == "interleaved" and m % p:
        pytest.skip("shape the schedule refuses")
    v = s.chunks(2 if p > 1 else 1)
    return s, v, s.orders(p, m, v)


@pytest.mark.parametrize("name", sorted(SCHEDULES))
@pytest.mark.parametrize("p,m", SHAPES)
def test_in_flight_closed_forms_equal_the_orders(name, p, m):
    s, v, orders = schedule_and_orders(name, p, m)
    for stage in range(p):
        chunks, first = s.in_flight(p, m, v, stage)
        want = peak_in_flight(orders[stage], 0 if stage == s.embedding_stage(p) else None)
        assert int(chunks) == want[0]
        if stage == s.embedding_stage(p):
            assert int(first) == want[1]


@pytest.mark.parametrize("name", sorted(SCHEDULES))
@pytest.mark.parametrize("p,m", SHAPES)
def test_offloaded_chunk_counts_equal_the_orders(name, p, m):
    s, v, orders = schedule_and_orders(name, p, m)
    for stage in range(p):
        assert tuple(int(x) for x in s.offloaded_chunks(p, m, v, stage)) == offloaded_in_order(orders[stage])


@pytest.mark.parametrize("name", sorted(SCHEDULES))
@pytest.mark.parametrize("p,m", SHAPES)
def test_drain_tails_equal_the_orders(name, p, m):
    s, v, orders = schedule_and_orders(name, p, m)
    for stage in range(p):
        assert tuple(float(x) for x in s.drain_tail(p, m, v, stage)) == drain_tail_in_order(orders[stage])


@pytest.mark.parametrize("name", sorted(SCHEDULES))
@pytest.mark.parametrize("p,m", SHAPES)
def test_gradient_tails_equal_the_orders(name, p, m):
    s, v, orders = schedule_and_orders(name, p, m)
    for stage in range(p):
        got = [tuple(int(x) for x in chunk) for chunk in s.grad_tail(p, m, v, stage)]
        assert got == grad_tail_in_order(orders[stage], v)


# per device and micro-batch, over its chunks: equal passes, a weight gradient longer than the
# forward (unfused accumulation into fp32 main_grad), longer than both, and a short I
PASSES = [(1.0, 1.0, 1.0), (1.0, 2.0, 1.5), (1.0, 1.0, 3.0), (1.7, 0.6, 1.2)]


@pytest.mark.parametrize("name", ["gpipe", "1f1b", "interleaved", "zb-h1", "zb-v", "dualpipe-v"])
@pytest.mark.parametrize("p,m", [(2, 4), (4, 8), (4, 12), (8, 16), (4, 2)])
@pytest.mark.parametrize("f,b,w", PASSES)
def test_pipeline_step_equals_the_order_executed_for_equal_stages(name, p, m, f, b, w):
    """The closed form where it holds (closed_form_holds), else the order executed."""
    s = SCHEDULES[name]
    if name in ("zb-v", "dualpipe-v") and m < 2 * p or name == "interleaved" and m % p:
        pytest.skip("shape the schedule refuses")
    v = s.chunks(2)
    times = stage_times([f] * 3, [b] * 3, [w] * 3, [1, max(p - 2, 0), 1 if p > 1 else 0])
    executed = pipeline_makespan(s, s.orders(p, m, v), p, v, [f / v] * p, [b / v] * p, [w / v] * p)
    assert float(s.pipeline_s(times, p, m, v)) == pytest.approx(executed, rel=1e-12)


@pytest.mark.parametrize("name", ["zb-v", "dualpipe-v"])
@pytest.mark.parametrize("p,m", [(2, 9), (2, 11), (3, 13), (3, 14), (4, 17), (4, 19)])
def test_steps_past_4p_micro_batches_equal_the_order_executed_when_m_is_no_multiple_of_p(name, p, m):
    # extrapolated from orders of 2p-5p micro-batches that end as the step's does (m modulo p);
    # extrapolated from multiples of p, these ZB-V steps came out 0.4-1.5 % short
    s = SCHEDULES[name]
    f = np.ones(p)
    f[0] = 1.5  # the stage holding the embedding and the loss runs longer
    times = stage_times(list(f), list(2 * f), list(f), [1] * p, tuple(range(p)))
    v = s.chunks(2)
    executed = pipeline_makespan(s, s.orders(p, m, v), p, v, *(list(x / v) for x in (f, 2 * f, f)))
    assert float(s.pipeline_s(times, p, m, v)) == pytest.approx(executed, rel=1e-12)


def test_a_step_extrapolated_past_4p_takes_the_stage_whose_end_grows_fastest():
    # ZB-V on 3 unequal stages: in the orders of 7, 10 and 13 micro-batches another stage ends
    # last than in the step's 16; extrapolating the makespan alone came out 0.23 % short
    s = SCHEDULES["zb-v"]
    f, b, w = [1.2, 0.7, 1.7], [1.1, 0.6, 1.3], [1.1, 0.8, 1.0]  # per chunk
    times = stage_times([2 * x for x in f], [2 * x for x in b], [2 * x for x in w], [1] * 3, (0, 1, 2))
    executed = pipeline_makespan(s, s.orders(3, 16, 2), 3, 2, f, b, w)
    assert float(s.pipeline_s(times, 3, 16, 2)) == pytest.approx(executed, rel=1e-12)


def test_a_stage_eating_up_its_slack_is_not_extrapolated():
    # 1F1B on 4 unequal stages: from 8 to 16 micro-batches every stage's end grows by 11.2 per
    # 4, less than stage 0's 4 x (1.7 + 1.2) = 11.6 of passes: it runs on slack its waits gave
    # it, then paces the step; extrapolated, 44 micro-batches came out 1.0 % short
    s = SCHEDULES["1f1b"]
    f, b = [1.7, 0.6, 0.5, 1.1], [1.2, 0.7, 1.1, 1.7]
    times = stage_times(f, b, [0.0] * 4, [1] * 4, (0, 1, 2, 3))
    executed = pipeline_makespan(s, s.orders(4, 44, 1), 4, 1, f, b, [0.0] * 4)
    assert float(s.pipeline_s(times, 4, 44, 1)) == pytest.approx(executed, rel=1e-12)


@pytest.mark.parametrize("p,m", [(4, 2), (4, 3), (8, 5)])
def test_zb_h1_with_fewer_micro_batches_than_stages_is_its_order_executed_on_unequal_stages(p, m):
    """A first stage with the embedding and a last one with the loss: which W passes fill the
    drain then depends on the stages' times, so the step is the order executed with them."""
    s = SCHEDULES["zb-h1"]
    f, b, w = [1.2, 1.0, 2.0], [2.1, 2.0, 3.5], [1.0, 1.0, 1.5]  # first, middle, last stage
    times = stage_times(f, b, w, [1, p - 2, 1])
    per_stage = [[x[0]] + [x[1]] * (p - 2) + [x[2]] for x in (f, b, w)]
    executed = pipeline_makespan(s, s.orders(p, m, 1), p, 1, *per_stage)
    assert float(s.pipeline_s(times, p, m, 1)) == pytest.approx(executed, rel=1e-12)


@pytest.mark.parametrize("schedule,v", [("gpipe", 1), ("1f1b", 1), ("interleaved", 2), ("zb-h1", 1), ("zb-v", 2),
                                        ("dualpipe-v", 2)])
def test_every_pass_appears_once_per_stage(schedule, v):
    p, m = 4, 8
    for ops in SCHEDULES[schedule].orders(p, m, v):
        forwards = sorted((c, j) for k, c, j in ops if k == "F")
        backwards = sorted((c, j) for k, c, j in ops if k in ("B", "I"))
        weights = sorted((c, j) for k, c, j in ops if k == "W")
        split = sorted((c, j) for k, c, j in ops if k == "I")
        everything = sorted((c, j) for c in range(v) for j in range(m))
        assert forwards == backwards == everything and weights == split


def test_explicit_schedule_equal_to_1f1b_gives_1f1b_step():
    p, m = 2, 3
    ops = [["F0", "F1", "B0", "F2", "B1", "B2"], ["F0", "B0", "F1", "B1", "F2", "B2"]]
    explicit = run(uniform_graph("1f1b", p, m, schedule_ops=ops)).step_time_s
    assert explicit == pytest.approx(step("1f1b", p, m))
    assert explicit == pytest.approx((m + p - 1) * 3.0)


def test_explicit_schedule_with_w_splits_the_backward():
    orders = parse_explicit([["F0", "B0", "W0"]], 1, 1, 1)
    assert orders == [[("F", 0, 0), ("I", 0, 0), ("W", 0, 0)]]


def test_explicit_schedule_missing_a_pass_is_an_input_error():
    with pytest.raises(InputError, match="exactly once"):
        parse_explicit([["F0", "F1", "B0", "B1"], ["F0", "B0", "F1"]], 2, 2, 1)


def test_explicit_schedule_with_backward_before_forward_is_an_input_error():
    with pytest.raises(InputError, match="must come after F0.0"):
        parse_explicit([["F0", "F1", "B0", "B1"], ["B0", "F0", "F1", "B1"]], 2, 2, 1)


def test_explicit_schedule_that_waits_on_itself_is_an_input_error():
    # stage 1 wants F1 first, which stage 0 sends only after B0, which needs stage 1's B0
    ops = [["F0", "B0", "F1", "B1"], ["F1", "F0", "B0", "B1"]]
    with pytest.raises(InputError, match="waits on itself"):
        uniform_graph("1f1b", 2, 2, schedule_ops=ops)


def test_a_deadlocking_schedule_is_refused_before_either_engine_runs(scenario):
    ops = [["F0", "B0", "F1", "B1"], ["F1", "F0", "B0", "B1"]]
    with pytest.raises(InputError, match="waits on itself"):
        scenario(cluster={"node": "dgx-a100", "nodes": 1}, tp=4, pp=2, global_batch=2, schedule_ops=ops)


def test_scenario_schedule_ops_run_in_place_of_the_named_schedule(scenario):
    kw = dict(cluster={"node": "dgx-a100", "nodes": 1}, tp=2, pp=2, dp=2, global_batch=6)  # m = 3
    ops = [["F0", "F1", "B0", "F2", "B1", "B2"], ["F0", "B0", "F1", "B1", "F2", "B2"]]
    named = evaluate(scenario(**kw)).step_time_s
    explicit = evaluate(scenario(schedule_ops=ops, **kw)).step_time_s
    gpipe_like = evaluate(scenario(schedule_ops=[["F0", "F1", "F2", "B0", "B1", "B2"]] * 2, **kw)).step_time_s
    assert explicit == pytest.approx(named, rel=1e-12)
    assert gpipe_like >= named * (1 - 1e-12)  # stage 1 cannot start a backward pass early (equal here)


def test_analytic_engine_runs_an_explicit_order_too(scenario):
    kw = dict(cluster={"node": "dgx-a100", "nodes": 1}, tp=2, pp=2, dp=2, global_batch=6)
    gpipe_like = scenario(schedule_ops=[["F0", "F1", "F2", "B0", "B1", "B2"]] * 2, **kw)
    graph, analytic = evaluate(gpipe_like, "graph"), evaluate(gpipe_like, "analytic")
    assert analytic.step_time_s == pytest.approx(graph.step_time_s, rel=0.02)
    assert analytic.peak_memory_bytes == pytest.approx(graph.peak_memory_bytes, rel=1e-9)


def test_scenario_schedule_ops_of_the_wrong_shape_are_an_input_error(scenario):
    with pytest.raises(InputError, match="plan.schedule_ops"):
        scenario(cluster={"node": "dgx-a100", "nodes": 1}, tp=2, pp=2, dp=2, global_batch=6,
                 schedule_ops=[["F0", "B0"]])


@pytest.mark.parametrize("name", ["zb-v", "dualpipe-v"])
def test_v_schedules_need_two_micro_batches_per_stage(scenario, name):
    with pytest.raises(InputError, match="micro-batches"):
        scenario(cluster={"node": "dgx-a100", "nodes": 1}, tp=2, pp=4, global_batch=4, schedule=name)


def test_interleaving_refuses_a_global_batch_by_its_value(scenario):
    # dp = 2: 6 micro-batches per replica, not a multiple of pp = 4
    with pytest.raises(InputError, match=r"micro-batches per replica \(6\)") as e:
        scenario(cluster={"node": "dgx-a100", "nodes": 2}, tp=2, pp=4, global_batch=12, schedule="interleaved", vpp=2)
    assert (e.value.field, e.value.value) == ("plan.global_batch", 12)


@pytest.mark.parametrize("name", ["zb-v", "dualpipe-v"])
def test_v_schedules_put_the_head_and_the_embedding_on_stage_0(scenario, name):
    s = scenario(cluster={"node": "dgx-a100", "nodes": 1}, tp=2, pp=4, global_batch=8, schedule=name)
    from simulator.evaluate import compile_scenario
    layout = compile_scenario(s)
    first, middle, last = layout.stages
    assert bool(first.has_embedding) and bool(first.has_head) and not bool(last.has_head)
    sim = simulate(layout, periodic=False)
    assert sim.step_time_s > 0


def test_stage_times_pick_the_slowest_counted_stage():
    t = stage_times([1.0, 5.0, 2.0], [1.0, 5.0, 2.0], [0.0, 0.0, 0.0], [1, 0, 1])
    assert isinstance(t, StageTimes) and t.critical == 2  # the middle stands for no stage


@pytest.mark.parametrize("plans", [1, 3, 12, 13, 40])
def test_plans_of_one_pipeline_shape_end_each_stage_as_each_plan_alone(plans):
    """Few plans run one by one as floats, many as arrays: each plan's stage ends are its own."""
    from simulator.schedules import _compiled_order, _stage_ends

    rng = np.random.default_rng(plans)
    for name, p, m, v in (("zb-h1", 6, 4, 1), ("1f1b", 4, 9, 1), ("interleaved", 4, 8, 2), ("zb-v", 3, 7, 2)):
        passes = _compiled_order(name, p, m, v)
        f, b, w = (rng.uniform(0.5, 2.0, (p, plans)) for _ in range(3))
        together = _stage_ends(passes, f, b, w, 0.01)
        alone = [_stage_ends(passes, f[:, j], b[:, j], w[:, j], 0.01) for j in range(plans)]
        assert together.shape == (p, plans)
        assert all(np.array_equal(together[:, j], alone[j]) for j in range(plans)), name
