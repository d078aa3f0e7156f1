"""The graph engine on real scenarios: memory timeline, steady-state extrapolation,
critical-path breakdown, agreement with the analytic engine, overlap and symmetry."""

import dataclasses

import pytest
from hypothesis import HealthCheck, given, settings

from plans import FIXED_DRAWS, plan_dicts, scenario_of

from simulator.engine import critical_path, execute, run, run_with_slowdown, simulate as simulate_layout
from simulator.evaluate import compile_scenario, evaluate
from simulator.graph import COMPUTE, DP, RECOMPUTE, _Builder, build, stage_tasks, uniform_graph
from simulator.schedules import BWD, FWD
from simulator.published import load_rows, row_scenario
from simulator.result import BREAKDOWN_KEYS
from simulator.scenario import scenario_from_dict


def simulate(scenario, periodic=True):
    return simulate_layout(compile_scenario(scenario), periodic)


def activation_bytes(scenario, stage):
    """The analytic engine's peak activation bytes of a stage (Layout.stage_memory)."""
    layout = compile_scenario(scenario)
    return float(layout.stage_memory(layout.representative(stage), stage).activations)


def plan(scenario, nodes=2, **kw):
    base = dict(tp=2, pp=4, micro_batch=1, global_batch=48, zero_stage=1)
    base.update(kw)
    return scenario(cluster={"node": "dgx-a100", "nodes": nodes}, **base)


@pytest.mark.parametrize("periodic", [False, True])
def test_1f1b_memory_timeline_peak_equals_analytic_activation_memory(scenario, periodic):
    s = plan(scenario, global_batch=64, recompute="selective")  # m = 32 per replica, pp = 4
    sim = simulate(s, periodic=periodic)
    for i, peak in enumerate(sim.activation_peak_bytes):
        assert peak == pytest.approx(activation_bytes(s, i), rel=1e-12)


def test_graph_engine_reports_the_timeline_peak_as_peak_memory(scenario):
    s = plan(scenario, global_batch=64)
    g, a = evaluate(s, "graph"), evaluate(s, "analytic")
    assert g.peak_memory_bytes == pytest.approx(a.peak_memory_bytes, rel=1e-12)  # equal for 1F1B
    gp = plan(scenario, global_batch=64, schedule="gpipe")
    sim = simulate(gp)
    assert evaluate(gp, "graph").memory_by_stage[0]["activations"] == pytest.approx(sim.activation_peak_bytes[0])


CASES = [dict(schedule="1f1b"), dict(schedule="interleaved", vpp=2), dict(schedule="zb-h1"),
         dict(schedule="gpipe"), dict(schedule="1f1b", zero_stage=0, dp_overlap=False),
         dict(schedule="interleaved", vpp=2, zero_stage=0), dict(schedule="1f1b", zero_stage=0, recompute="full"),
         dict(schedule="zb-h1", zero_stage=1, dp_overlap=False), dict(schedule="interleaved", vpp=3, zero_stage=1,
                                                                    dp_overlap=False)]


@pytest.mark.parametrize("kw", CASES)
def test_steady_state_extrapolation_equals_full_simulation(scenario, kw):
    s = plan(scenario, global_batch=96, **kw)  # m = 48 = 12p: the fast path extrapolates
    fast, full = simulate(s, periodic=True), simulate(s, periodic=False)
    assert fast.extrapolated and not full.extrapolated
    assert fast.simulated_tasks < full.simulated_tasks == fast.graph_tasks
    assert fast.step_time_s == pytest.approx(full.step_time_s, rel=1e-9)
    for key in BREAKDOWN_KEYS:
        assert fast.breakdown_s[key] == pytest.approx(full.breakdown_s[key], rel=1e-9, abs=1e-12)
    assert fast.activation_peak_bytes == pytest.approx(full.activation_peak_bytes, rel=1e-9)


def test_interleaved_extrapolates_from_one_period_and_two(scenario):
    # its warm-up holds up to (v+1)p - 1 chunks, more than m = p has: the time is affine from
    # p on, the peaks are taken from the 2p run, and the result is the full execution's
    s = plan(scenario, global_batch=96, schedule="interleaved", vpp=2)  # p = 4, m = 48
    layout = compile_scenario(s)
    fast, full = simulate_layout(layout, True), simulate_layout(layout, False)
    assert fast.simulated_tasks == len(build(layout, 4)) + len(build(layout, 8))
    assert fast.step_time_s == pytest.approx(full.step_time_s, rel=1e-9)
    assert fast.activation_peak_bytes == pytest.approx(full.activation_peak_bytes, rel=1e-9)


def test_a_stage_keeping_pace_only_on_its_first_periods_slack_is_executed_in_full():
    # ZB-H1 with per-pass FSDP gathers, 9 layers on stage 1: stage 0 (8 layers, the
    # embedding, its gathers) needs longer per period than the step grows by but keeps pace
    # for six periods on the slack its waits gave it; extrapolated from 2p and 3p the step
    # came out 1.5 % short of the full execution
    s = scenario_from_dict({
        "model": {"preset": "llama-3.1-8b", "seq_len": 512}, "cluster": {"node": "dgx-a100", "nodes": 4},
        "plan": dict(tp=2, pp=4, dp=2, cp=2, micro_batch=4, global_batch=512, schedule="zb-h1", zero_stage=3,
                     sequence_parallel=True, pipeline_layout=[8, 9, 7, 8], loss="chunked", compile=True,
                     projections="separate", cp_attention="torch-alltoall")})
    fast, full = simulate(s, periodic=True), simulate(s, periodic=False)
    assert fast.step_time_s == pytest.approx(full.step_time_s, rel=1e-9)


def test_plans_with_activation_offload_are_executed_in_full(scenario):
    assert not simulate(plan(scenario, global_batch=96, offload={"activations": "cpu"})).extrapolated


@pytest.mark.parametrize("kw", [dict(zero_stage=2), dict(zero_stage=3), dict(zero_stage=3, schedule="interleaved", vpp=2),
                                dict(zero_stage=2, dp_overlap=False), dict(zero_stage=3, offload={"optimizer": "cpu"})])
def test_per_micro_batch_traffic_extrapolates_to_the_full_simulation(scenario, kw):
    s = plan(scenario, global_batch=96, **kw)
    fast, full = simulate(s, periodic=True), simulate(s, periodic=False)
    assert fast.extrapolated
    assert fast.step_time_s == pytest.approx(full.step_time_s, rel=1e-9)
    assert fast.activation_peak_bytes == pytest.approx(full.activation_peak_bytes, rel=1e-9)


@given(plan_dicts())
@settings(max_examples=150, deadline=None, derandomize=FIXED_DRAWS, database=None, suppress_health_check=list(HealthCheck))
def test_steady_state_extrapolation_equals_full_simulation_on_random_plans(data):
    data["plan"]["global_batch"] *= 4  # enough micro-batches for the fast path
    layout = compile_scenario(scenario_of(data))
    fast = simulate_layout(layout, True)
    if fast.extrapolated:
        full = simulate_layout(layout, False)
        assert fast.step_time_s == pytest.approx(full.step_time_s, rel=1e-9)
        assert fast.activation_peak_bytes == pytest.approx(full.activation_peak_bytes, rel=1e-9)


@pytest.mark.parametrize("kw", CASES[:4] + [dict(zero_stage=3), dict(zero_stage=2, dp_overlap=False),
                                             dict(offload={"activations": "cpu"})])
def test_critical_path_is_a_gapless_chain_from_zero_to_the_makespan(scenario, kw):
    """Each task on the path starts when the one before it released it (its end, or the end of
    its send for a dependant waiting on the send), through a dependency or stream order; the
    path starts at 0 and ends at the latest release of any task, computed here directly."""
    ex = execute(compile_scenario(plan(scenario, **kw)))
    g, path = ex.graph, critical_path(ex)
    assert ex.start_s[path[0]] == 0.0
    assert ex.release_s[path[-1]] == max(e + p for e, p in zip(ex.end_s, ex.post_s))
    for u, t in zip(path, path[1:]):
        linked = u in g.deps[t] or ~u in g.deps[t] or (g.stream[u] == g.stream[t] and u < t)
        assert linked
        assert ex.start_s[t] == pytest.approx(ex.release_s[u] if ~u in g.deps[t] or g.stream[u] == g.stream[t]
                                              else ex.end_s[u], abs=1e-12)


@pytest.mark.parametrize("schedule,p,m", [("1f1b", 4, 8), ("gpipe", 3, 5), ("1f1b", 8, 3)])
def test_uniform_pipeline_bubble_from_the_critical_path_is_p_minus_1_passes(schedule, p, m):
    from simulator.engine import breakdown
    ex = run(uniform_graph(schedule, p, m, 1, 1.0, 2.0))
    bd = breakdown(ex)
    assert bd["pipeline_bubble"] == pytest.approx((p - 1) * 3.0, rel=1e-12)
    assert bd["compute"] == pytest.approx(m * 3.0, rel=1e-12)


def test_compute_on_the_critical_stage_is_m_passes(scenario):
    s = plan(scenario, zero_stage=0, nodes=1, tp=2, pp=4, global_batch=24)  # dp = 1: no DP traffic
    sim = simulate(s, periodic=False)
    last = compile_scenario(s).representative(3)  # last stage: the heaviest
    assert sim.breakdown_s["compute"] == pytest.approx(24 * float(last.passes.compute_s), rel=1e-9)
    assert sim.breakdown_s["dp_comm"] == 0.0


AGREE_PCT = 3.0  # graph vs analytic step time on ZeRO-0/1 plans (docs/engine.md)


def test_graph_and_analytic_agree_within_3_percent_on_published_runs():
    rows, sup = load_rows()
    for row in rows:
        if row["id"].endswith(("530B", "1T", "530B_full", "530B_selsp", "1T_full", "1T_selsp")):
            continue  # slow to simulate in full; covered by `llmsim validate --published`
        s = scenario_from_dict(row_scenario(row, sup))
        g, a = evaluate(s, "graph").step_time_s, evaluate(s, "analytic").step_time_s
        assert abs(g - a) / a * 100 < AGREE_PCT, row["id"]


@pytest.mark.parametrize("kw", [dict(schedule="1f1b"), dict(schedule="interleaved", vpp=2), dict(schedule="zb-h1"),
                                dict(schedule="1f1b", zero_stage=0, dp_overlap=False)])
def test_graph_and_analytic_agree_within_3_percent_on_plans(scenario, kw):
    s = plan(scenario, model={"preset": "megatron-gpt-18b"}, global_batch=96, **kw)
    g, a = evaluate(s, "graph").step_time_s, evaluate(s, "analytic").step_time_s
    assert abs(g - a) / a * 100 < AGREE_PCT


@pytest.mark.parametrize("gathers_overlap", [True, False])
@pytest.mark.parametrize("dp_overlap", [True, False])
def test_the_engines_agree_where_a_heavier_last_stage_ends_the_step_after_zero_1_gathers(scenario, gathers_overlap,
                                                                                         dp_overlap):
    """ZeRO-1 over 32 GPUs with 8 and 16 layers on two stages: the weight gather outlasts stage
    0's forward, so gathered ahead it delays the pipeline's fill, and with it the last stage,
    which ends the step; gathered after the optimizer step it is exposed whole at that stage's
    end. The analytic engine credited the last stage with its fill slack in both cases (1-10 %
    short of the graph engine)."""
    s = plan(scenario, model={"preset": "megatron-gpt-1.7b", "seq_len": 256}, nodes=4, tp=1, pp=2, global_batch=32,
             first_stage_layers=8, last_stage_layers=16, param_gather_overlap=gathers_overlap, dp_overlap=dp_overlap)
    layout = compile_scenario(s)
    from simulator.analytic import pipeline_times
    assert float(layout.stages[0].dp.step_gather_s) > pipeline_times(layout).f[0]  # the case
    g, a = evaluate(s, "graph").step_time_s, evaluate(s, "analytic").step_time_s
    assert a == pytest.approx(g, rel=0.005)


@pytest.mark.parametrize("kw", [dict(zero_stage=2, dp_overlap=False), dict(zero_stage=3, dp_overlap=False),
                                dict(zero_stage=3), dict(zero_stage=1, offload={"activations": "cpu"}),
                                dict(zero_stage=2, offload={"optimizer": "cpu"}),
                                dict(zero_stage=3, offload={"optimizer": "cpu", "params": "cpu"})])
def test_graph_and_analytic_agree_within_15_percent_on_zero_2_3_and_offload_plans(scenario, kw):
    s = plan(scenario, model={"preset": "megatron-gpt-18b"}, global_batch=96, **kw)
    g, a = evaluate(s, "graph"), evaluate(s, "analytic")
    assert abs(g.step_time_s - a.step_time_s) / a.step_time_s < 0.15
    assert abs(g.peak_memory_bytes - a.peak_memory_bytes) / a.peak_memory_bytes < 0.05


def test_overlapped_gradient_reduction_hides_behind_backward(scenario):
    on = simulate(plan(scenario, zero_stage=0, dp_overlap=True), periodic=False)
    off = simulate(plan(scenario, zero_stage=0, dp_overlap=False), periodic=False)
    layout = compile_scenario(plan(scenario, zero_stage=0))
    full = max(float(r.dp.step_reduce_s) for r in layout.stages)
    assert off.breakdown_s["dp_comm"] == pytest.approx(full, rel=1e-6)  # not overlapped: all exposed
    assert on.breakdown_s["dp_comm"] < 0.5 * full


@pytest.mark.parametrize("engine", ["graph", "analytic"])
def test_weights_gathered_after_the_optimizer_step_are_exposed_whole(scenario, engine):
    """ZeRO-1 without Megatron-LM's --overlap-param-gather: the all-gather follows the optimizer
    step; with it (or with dp_overlap, its default) it streams in ahead of the first forward."""
    s = plan(scenario, pp=1, zero_stage=1)
    gather = float(compile_scenario(s).stages[0].dp.step_gather_s)
    on = evaluate(s, engine).breakdown_s["dp_comm"]
    off = evaluate(plan(scenario, pp=1, zero_stage=1, param_gather_overlap=False), engine).breakdown_s["dp_comm"]
    assert off >= gather and off - on > 0.5 * gather
    reduce_after = evaluate(plan(scenario, pp=1, zero_stage=1, dp_overlap=False), engine).breakdown_s["dp_comm"]
    gather_ahead = evaluate(plan(scenario, pp=1, zero_stage=1, dp_overlap=False, param_gather_overlap=True),
                            engine).breakdown_s["dp_comm"]
    assert reduce_after - gather_ahead > 0.5 * gather


@pytest.mark.parametrize("engine", ["graph", "analytic"])
def test_weight_gathers_outlasting_the_forwards_before_a_chunk_delay_every_chunk(scenario, engine):
    """ZeRO-1 gathering ahead of the forward under ZB-V on one stage: its two chunks' forwards
    run first (F0, F1), and the dp stream gathers chunk 0's weights, then chunk 1's, g each
    in k buckets. Chunk 1's first forward ends no sooner than one bucket's share of it after
    the stream is done, at 2g + f/k, where without the gathers both forwards end at 2f: the
    gathers add 2g - 2f + f/k, so gathering after the optimizer step instead (2g, whole) costs
    2f - f/k more (counting chunk 0's gather alone, as the analytic engine did: g + f - f/k)."""
    from simulator.analytic import pipeline_times

    short = {"preset": "megatron-gpt-1.7b", "seq_len": 128, "layers": 4, "hidden": 4096, "heads": 32}
    s = plan(scenario, model=short, tp=1, pp=1, schedule="zb-v", global_batch=32, zero_stage=1)  # dp 16: m = 2
    layout = compile_scenario(s)
    f, k = pipeline_times(layout).f[0] / 2, float(layout.stages[0].buckets)
    g = float(layout.stages[0].dp.step_gather_s) / 2
    assert g > 2 * f  # the case: the gathers outlast the forwards before chunk 1
    ahead = evaluate(s, engine).step_time_s
    after = evaluate(plan(scenario, model=short, tp=1, pp=1, schedule="zb-v", global_batch=32, zero_stage=1,
                          param_gather_overlap=False), engine).step_time_s
    assert after - ahead == pytest.approx(2 * f - f / k, rel=1e-6)


@pytest.mark.parametrize("engine", ["graph", "analytic"])
def test_a_reduction_issued_in_a_whole_backward_starts_with_that_backward(scenario, engine):
    """DualPipe-V on one stage, two micro-batches: its order ends B(chunk 1), I(chunk 0),
    W(chunk 0), so chunk 1's gradients are complete with a whole backward (b + w per chunk),
    not a W. Its all-reduce, r per chunk in k buckets, starts one bucket's share into that B
    and chunk 0's queues behind it: the reduction outlasts the passes by 2r - 2(b + w) +
    (b + w)/k, and the step is m(F + B + W) for the stage plus that, the optimizer step and the
    per-step framework work (the analytic engine took chunk 1's pass for a W: 1.5 % longer)."""
    from simulator.analytic import pipeline_times

    short = {"preset": "megatron-gpt-1.7b", "seq_len": 128, "layers": 4, "hidden": 4096, "heads": 32}
    s = plan(scenario, model=short, tp=1, pp=1, schedule="dualpipe-v", global_batch=32, zero_stage=0)  # dp 16
    layout = compile_scenario(s)
    t, stage = pipeline_times(layout), layout.stages[0]
    b, w = t.b[0] / 2, t.w[0] / 2
    r, k = float(stage.dp.step_reduce_s) / 2, float(stage.buckets)
    assert layout.m == 2 and r > 2 * (b + w)  # the case: the reductions outlast the passes after the B
    want = 2 * (t.f[0] + t.b[0] + t.w[0]) + 2 * r - 2 * (b + w) + (b + w) / k + float(stage.optimizer_s) \
        + float(stage.framework_step_s)
    assert evaluate(s, engine).step_time_s == pytest.approx(want, rel=1e-9)


@pytest.mark.parametrize("zero_stage", [0, 3])
def test_param_gather_overlap_is_refused_without_a_once_per_step_gather(scenario, zero_stage):
    from simulator.errors import InputError
    with pytest.raises(InputError, match="param_gather_overlap"):
        plan(scenario, pp=1, zero_stage=zero_stage, param_gather_overlap=False)


def test_fsdp_exposes_only_the_first_units_gather_and_the_last_units_reduce_scatter(scenario):
    # one micro-batch, no pipeline, one FSDP unit per layer: the forward waits for the first
    # layer's gather (G/L) while the rest streams in behind it, the backward's gather runs
    # during the forward, and the last reduce-scatter outlasts the backward by one layer's (R/L)
    s = scenario(model={"preset": "llama-3.1-8b"}, cluster={"node": "dgx-h100", "nodes": 1},
                 tp=1, pp=1, dp=8, micro_batch=1, global_batch=8, zero_stage=3)
    layout = compile_scenario(s)
    st = stage_tasks(layout, layout.stages[0])
    units, g, r = st.buckets, st.mb_gather_s, st.mb_reduce_s
    f, b = st.dur[FWD], st.dur[BWD]
    assert units == 32 and 2 * g < f and r < b  # Llama 3.1 8B's layers; gathers and reductions keep up
    expected = g / units + f + b + r / units + st.optimizer_s + st.framework_s
    assert simulate(s, periodic=False).step_time_s == pytest.approx(expected, rel=1e-12)
    assert evaluate(s, "analytic").step_time_s == pytest.approx(expected, rel=1e-12)


def test_recomputation_spreads_over_the_backward_the_bucketed_reduction_hides_behind(scenario):
    # one micro-batch, full recomputation, Megatron buckets: each layer re-runs right before its
    # backward, so the first k-1 buckets leave after 1/k of (R + B) and the last after all of it
    s = scenario(model={"preset": "llama-2-13b", "seq_len": 512}, cluster={"node": "dgx-a100", "nodes": 2},
                 tp=1, pp=1, dp=16, micro_batch=2, global_batch=32, zero_stage=0, recompute="full")
    layout = compile_scenario(s)
    st = stage_tasks(layout, layout.stages[0])
    k, red, f, rb = st.buckets, st.step_reduce_s, st.dur[FWD], st.dur[RECOMPUTE] + st.dur[BWD]
    assert k > 1 and red > rb / k  # the buckets outlast the backward
    reduced = max(rb, rb / k + red * (k - 1) / k) + red / k
    expected = f + reduced + st.optimizer_s + st.framework_s
    assert simulate(s, periodic=False).step_time_s == pytest.approx(expected, rel=1e-12)
    assert evaluate(s, "analytic").step_time_s == pytest.approx(expected, rel=1e-12)


def test_compute_slows_by_the_profile_factor_while_communication_runs():
    b = _Builder(1, 1)
    b.g.base_bytes.append(0.0)
    comm = b.add("all-reduce", 0, DP, 4.0, [], (("dp_comm", 4.0),))
    b.add("gemm", 0, COMPUTE, 10.0, [], (("compute", 10.0),))
    g = b.finish()
    assert run_with_slowdown(g, 0.0).step_time_s == pytest.approx(10.0)
    # 4 s of the 10 s kernel overlap the collective: it takes 0.5 x 4 s longer
    assert run_with_slowdown(g, 0.5).step_time_s == pytest.approx(12.0)
    assert comm == 0


def test_overlap_slowdown_from_the_profile_lengthens_an_overlapped_step(scenario):
    s = plan(scenario, zero_stage=0)
    acc = dataclasses.replace(s.cluster.accelerator, overlap_slowdown=0.3)
    slow = dataclasses.replace(s, cluster=dataclasses.replace(s.cluster, accelerator=acc))
    assert simulate(slow).step_time_s > simulate(s).step_time_s


def test_simulated_tasks_do_not_grow_with_data_parallel_devices(scenario):
    small = plan(scenario, nodes=2, global_batch=48)  # dp = 2
    big = plan(scenario, nodes=128, global_batch=48 * 64)  # dp = 128, same micro-batches per replica
    assert small.cluster.devices * 64 == big.cluster.devices
    # (Megatron-LM's gradient buckets grow with the group: never more tasks for more devices)
    assert simulate(big).simulated_tasks <= simulate(small).simulated_tasks


def test_result_json_carries_simulation_fields(scenario):
    d = evaluate(plan(scenario)).to_dict()
    assert d["engine"] == "graph"
    assert d["simulated_tasks"] > 0 and d["diagnostics"]["simulation_s"] > 0
    assert set(d["breakdown_s"]) == set(BREAKDOWN_KEYS)


def test_transfers_sharing_the_nic_split_its_bandwidth():
    """Two 4 s transfers on one link that start together each get half the bandwidth for
    as long as both run: both end at 8 s (fair sharing), not at 4 s and 8 s."""
    b = _Builder(1, 1)
    b.g.base_bytes.append(0.0)
    x = b.add("reduce", 0, DP, 4.0, [], (("dp_comm", 4.0),))
    y = b.add("gemm", 0, COMPUTE, 0.0, [], (("compute", 0.0),))
    b.g.post[y] = 4.0  # a 4 s blocking send after a zero-length pass
    b.g.parts[y] = (("pp_comm", 4.0),)
    g = b.finish()
    g.nic, g.send_nic = {x}, True
    ex = run_with_slowdown(g, 0.0)
    assert ex.end_s[x] == pytest.approx(8.0)
    assert ex.release_s[y] == pytest.approx(8.0)


def test_a_transfer_arriving_late_shares_only_the_overlap():
    """A 4 s transfer from 0 and a 2 s one from 2 s: at 2 s the first has 2 s left; both
    run at half rate until the second's 2 s are done at 6 s; the first ends at 6 s too."""
    b = _Builder(1, 1)
    b.g.base_bytes.append(0.0)
    x = b.add("reduce", 0, DP, 4.0, [], (("dp_comm", 4.0),))
    y = b.add("gemm", 0, COMPUTE, 2.0, [], (("compute", 2.0),))
    b.g.post[y] = 2.0
    g = b.finish()
    g.nic, g.send_nic = {x}, True
    ex = run_with_slowdown(g, 0.0)
    assert ex.end_s[x] == pytest.approx(6.0)
    assert ex.release_s[y] == pytest.approx(6.0)


def test_activation_offload_keeps_few_micro_batches_on_the_device(scenario):
    """1F1B stage 1 holds p - 1 = 3 micro-batches without offload; with activations copied to
    the host after F and back one pass ahead of B it holds at most 3 (one being written out,
    one being read back, one in use), as the analytic engine counts when the copies keep up."""
    base = plan(scenario, global_batch=64)
    off = plan(scenario, global_batch=64, offload={"activations": "cpu"})
    chunk = float(compile_scenario(base).representative(1).activations.chunk_bytes)
    on_device = simulate(off, periodic=False).activation_peak_bytes[1]  # stage 1: no embedding input
    assert simulate(base, periodic=False).activation_peak_bytes[1] == pytest.approx(3 * chunk)  # p - i = 3
    assert on_device <= 3 * chunk * (1 + 1e-12)
    assert activation_bytes(off, 1) == pytest.approx(3 * chunk)
    assert on_device < simulate(base, periodic=False).activation_peak_bytes[0]


def test_optimizer_offload_runs_after_the_gradients_on_the_host(scenario):
    s = plan(scenario, zero_stage=1, offload={"optimizer": "cpu"}, nodes=1, tp=2, pp=4, global_batch=24)  # dp 1
    sim = simulate(s, periodic=False)
    host = float(compile_scenario(s).representative(0).offload.per_step_s)
    # the last stage to finish its backward (stage 0) then copies and runs Adam: all exposed
    assert sim.breakdown_s["offload"] == pytest.approx(host, rel=1e-9)
    assert sim.breakdown_s["optimizer"] == 0.0


def test_graph_results_are_deterministic_except_the_wall_clock(scenario):
    a = evaluate(plan(scenario, schedule="zb-h1")).to_dict()
    b = evaluate(plan(scenario, schedule="zb-h1")).to_dict()
    a.pop("diagnostics"), b.pop("diagnostics")
    assert a == b


def test_transfers_of_one_stream_queue_while_sharing_the_nic_with_others():
    """dp stream: 4 s then 2 s back to back; a 2 s send from 0 s. The send and the first
    transfer share the link until the send ends at 4 s; the first ends at 6 s, and the second,
    queued behind it on its stream, then runs alone until 8 s."""
    b = _Builder(1, 1)
    b.g.base_bytes.append(0.0)
    x1 = b.add("reduce 1", 0, DP, 4.0, [], (("dp_comm", 4.0),))
    x2 = b.add("reduce 2", 0, DP, 2.0, [], (("dp_comm", 2.0),))
    y = b.add("pass", 0, COMPUTE, 0.0, [], ())
    b.g.post[y] = 2.0
    g = b.finish()
    g.nic, g.send_nic = {x1, x2}, True
    ex = run_with_slowdown(g, 0.0)
    assert ex.release_s[y] == pytest.approx(4.0)
    assert ex.end_s[x1] == pytest.approx(6.0)
    assert (ex.start_s[x2], ex.end_s[x2]) == pytest.approx((6.0, 8.0))


def _starts_by_definition(g, dur, post, ex):
    """Every task's start as the stream model defines it, from the executed ends: the latest
    end (or send release, for an edge ~d) of its dependencies and the release of the task
    before it on its stream; 0 for none."""
    last, want = {}, []
    for t, (deps, s) in enumerate(zip(g.deps, g.stream)):
        ready = [ex.end_s[d] if d >= 0 else ex.end_s[~d] + post[~d] for d in deps]
        if s in last:
            ready.append(ex.end_s[last[s]] + post[last[s]])
        last[s] = t
        want.append(max(ready, default=0.0))
    return want


@given(plan_dicts())
@settings(max_examples=150, deadline=None, derandomize=FIXED_DRAWS, database=None, suppress_health_check=list(HealthCheck))
def test_every_task_starts_when_what_it_waits_for_is_done_on_random_plans(data):
    """The executor (which walks stages and counts down only the dependencies between them)
    against the definition, on the first execution and on the refined re-execution with
    stretched durations; each task runs for its own duration."""
    g = build(compile_scenario(scenario_of(data)))
    first = run(g)
    stretched = [x * (1 + (t % 3) / 7) for t, x in enumerate(g.dur)]  # any other durations
    again = run(g, stretched)
    for ex, dur in ((first, g.dur), (again, stretched)):
        assert ex.start_s == _starts_by_definition(g, dur, g.post, ex)
        assert [e - s for s, e in zip(ex.start_s, ex.end_s)] == pytest.approx(dur, abs=1e-12 * ex.step_time_s)


def test_a_send_queued_behind_another_shares_the_link_only_once_it_starts():
    """dp: one 6 s transfer from 0 s; sends of 2 s each after two zero-length passes (the
    second queued behind the first on the compute stream). The first send and the transfer
    share from 0: the send ends at 4 s; the second send then shares from 4 s to 8 s; the
    transfer, 2 + 2 s done by then, runs alone until 10 s."""
    b = _Builder(1, 1)
    b.g.base_bytes.append(0.0)
    x = b.add("reduce", 0, DP, 6.0, [], (("dp_comm", 6.0),))
    y1 = b.add("pass 1", 0, COMPUTE, 0.0, [], ())
    y2 = b.add("pass 2", 0, COMPUTE, 0.0, [], ())
    b.g.post[y1] = b.g.post[y2] = 2.0
    g = b.finish()
    g.nic, g.send_nic = {x}, True
    ex = run_with_slowdown(g, 0.0)
    assert ex.release_s[y1] == pytest.approx(4.0)
    assert (ex.start_s[y2], ex.release_s[y2]) == pytest.approx((4.0, 8.0))
    assert ex.end_s[x] == pytest.approx(10.0)


@pytest.mark.parametrize("kw", [dict(schedule="1f1b"), dict(schedule="interleaved", vpp=2), dict(schedule="zb-h1"),
                                dict(schedule="zb-h1", global_batch=2)])
def test_analytic_stage_ends_match_the_executed_pipeline(scenario, kw):
    """Each representative stage finishes its passes as long before the last stage as the
    executed order says (unequal stages: the first holds the embedding, the last the head)."""
    from simulator import analytic
    from simulator.graph import BWD, BWD_INPUT, FWD, WGT

    layout = compile_scenario(plan(scenario, model={"preset": "megatron-gpt-18b"}, **{"global_batch": 24, **kw}))
    ex = execute(layout)
    g = ex.graph
    passes = (FWD, BWD, BWD_INPUT, WGT)
    ends = {}
    for t, name in enumerate(g.name):
        if isinstance(name, tuple) and name[0] in passes:
            ends[g.stage[t]] = max(ends.get(g.stage[t], 0.0), ex.end_s[t])
    latest = max(ends.values())
    before = analytic.ends_before_last_s(layout, analytic.pipeline_times(layout))
    for r, want in zip(layout.stages, before):
        got = latest - ends[int(r.stage)]
        assert float(want) == pytest.approx(got, rel=0.02, abs=1e-3 * latest), (int(r.stage), kw)
