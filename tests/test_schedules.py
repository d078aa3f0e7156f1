"""Pipeline schedules executed on a communication-free pipeline of equal stages, where the
bubble has closed forms: (p-1)/m for GPipe and 1F1B (Huang et al. 2019; Narayanan et al.
2021), (p-1)/(v m) for interleaved 1F1B (Narayanan et al. 2021), and (p-1)(F+B-W) for
ZB-H1 (Qi et al. 2024), a third of 1F1B's (p-1)(F+B+W) when F = B = W."""

import pytest

from simulator.engine import run
from simulator.errors import InputError
from simulator.graph import uniform_graph
from simulator.schedules import stage_ops


def bubble_fraction(schedule, p, m, v=1, f=1.0, b=2.0, w=0.0):
    step = run(uniform_graph(schedule, p, m, v, f, b, w)).step_time_s
    ideal = m * (f + b + w)
    return (step - ideal) / ideal


@pytest.mark.parametrize("p,m", [(2, 4), (4, 8), (4, 16), (8, 32)])
def test_1f1b_bubble_is_p_minus_1_over_m(p, m):
    assert bubble_fraction("1f1b", p, m) == pytest.approx((p - 1) / m, rel=1e-12)


@pytest.mark.parametrize("p,m", [(4, 8), (8, 16)])
def test_gpipe_bubble_is_p_minus_1_over_m(p, m):
    assert bubble_fraction("gpipe", p, m) == pytest.approx((p - 1) / m, rel=1e-12)


@pytest.mark.parametrize("p,m,v", [(4, 8, 2), (4, 16, 4), (8, 32, 2), (2, 6, 3)])
def test_interleaved_bubble_is_p_minus_1_over_v_m(p, m, v):
    assert bubble_fraction("interleaved", p, m, v) == pytest.approx((p - 1) / (v * m), rel=1e-12)


@pytest.mark.parametrize("p,m", [(2, 4), (4, 8), (4, 16), (8, 32)])
def test_zb_h1_bubble_is_a_third_of_1f1b_when_f_b_w_are_equal(p, m):
    one = bubble_fraction("1f1b", p, m, f=1.0, b=1.0, w=1.0)
    zb = bubble_fraction("zb-h1", p, m, f=1.0, b=1.0, w=1.0)
    assert one == pytest.approx(3 * (p - 1) / (3 * m))
    assert zb == pytest.approx(one / 3, rel=1e-12)


def test_zb_h1_keeps_1f1b_micro_batches_in_flight():
    p, m = 4, 12
    for i, ops in enumerate(stage_ops("zb-h1", p, m)):
        live = peak = 0
        for kind, _, _ in ops:
            live += {"F": 1, "B": -1, "W": 0}[kind]
            peak = max(peak, live)
        assert peak == p - i


@pytest.mark.parametrize("schedule,v", [("gpipe", 1), ("1f1b", 1), ("interleaved", 2), ("zb-h1", 1)])
def test_every_pass_appears_once_per_stage(schedule, v):
    p, m = 4, 8
    passes = ("F", "B", "W") if schedule == "zb-h1" else ("F", "B")
    for ops in stage_ops(schedule, p, m, v):
        assert sorted(ops) == sorted((k, c, j) for k in passes for c in range(v) for j in range(m))


def test_explicit_schedule_equal_to_1f1b_gives_1f1b_step():
    p, m = 2, 3
    ops = [["F0", "F1", "B0", "F2", "B1", "B2"], ["F0", "B0", "F1", "B1", "F2", "B2"]]
    explicit = run(uniform_graph("1f1b", p, m, schedule_ops=ops)).step_time_s
    assert explicit == pytest.approx(run(uniform_graph("1f1b", p, m)).step_time_s)
    assert explicit == pytest.approx((m + p - 1) * 3.0)


def test_explicit_schedule_missing_a_pass_is_an_input_error():
    with pytest.raises(InputError, match="exactly once"):
        stage_ops("1f1b", 2, 2, ops=[["F0", "F1", "B0", "B1"], ["F0", "B0", "F1"]])


def test_explicit_schedule_with_backward_before_forward_is_an_input_error():
    with pytest.raises(InputError, match="must come after F0.0"):
        stage_ops("1f1b", 2, 2, ops=[["F0", "F1", "B0", "B1"], ["B0", "F0", "F1", "B1"]])


def test_explicit_schedule_that_waits_on_itself_is_an_input_error():
    # stage 1 wants F1 first, which stage 0 sends only after B0, which needs stage 1's B0
    ops = [["F0", "B0", "F1", "B1"], ["F1", "F0", "B0", "B1"]]
    with pytest.raises(InputError, match="waits on itself"):
        run(uniform_graph("1f1b", 2, 2, schedule_ops=ops))


def test_scenario_schedule_ops_run_in_place_of_the_named_schedule(scenario):
    kw = dict(cluster={"node": "dgx-a100", "nodes": 1}, tp=2, pp=2, dp=2, global_batch=6)  # m = 3
    ops = [["F0", "F1", "B0", "F2", "B1", "B2"], ["F0", "B0", "F1", "B1", "F2", "B2"]]
    from simulator.engine import simulate
    named = simulate(scenario(**kw)).step_time_s
    explicit = simulate(scenario(schedule_ops=ops, **kw)).step_time_s
    gpipe_like = simulate(scenario(schedule_ops=[["F0", "F1", "F2", "B0", "B1", "B2"]] * 2, **kw)).step_time_s
    assert explicit == pytest.approx(named, rel=1e-12)
    assert gpipe_like >= named  # stage 1 cannot start a backward pass early


def test_scenario_schedule_ops_of_the_wrong_shape_are_an_input_error(scenario):
    with pytest.raises(InputError, match="plan.schedule_ops"):
        scenario(cluster={"node": "dgx-a100", "nodes": 1}, tp=2, pp=2, dp=2, global_batch=6,
                 schedule_ops=[["F0", "B0"]])
