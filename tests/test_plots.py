"""Each plot kind draws the expected bars or points, and writes a PNG."""

import json

import numpy as np
import pandas as pd
import pytest

from simulator import InputError, evaluate, load_scenario
from simulator import plots
from simulator.result import BREAKDOWN_KEYS
from simulator.space import space_from_dict
from simulator.sweep import sweep

BASE = {"model": {"preset": "megatron-gpt-39b"}, "cluster": {"node": "dgx-a100", "nodes": 2},
        "plan": {"global_batch": 64, "dp": "auto", "zero_stage": 1}, "training": {"tokens": 1.0e+11}}


@pytest.fixture(scope="module")
def table():
    space = space_from_dict({"base": BASE, "sweep": {"plan.tp": [1, 2, 4, 8], "plan.pp": [1, 2, 4],
                                                     "plan.micro_batch": [1, 2]}})
    return sweep(space, workers=1, progress=False)


@pytest.fixture(scope="module")
def accel_table():
    space = space_from_dict({"base": {**BASE, "model": {"preset": "megatron-gpt-7.5b"}},
                             "sweep": {"cluster.node": ["dgx-a100", "dgx-h100", "mi300x-node"], "plan.tp": [1, 2, 4]}})
    return sweep(space, workers=1, progress=False)


def _timeline():
    rows = [(0, "compute", "F0", 0.0, 1.0), (0, "compute", "F1", 1.0, 2.0), (1, "compute", "F0", 1.1, 2.1),
            (1, "compute", "B0", 2.1, 4.1), (0, "compute", "B0", 4.2, 6.2), (0, "dp", "allreduce", 6.2, 7.0),
            (1, "pp", "send:F0", 2.0, 2.1)]
    return pd.DataFrame(rows, columns=list(plots.TIMELINE_COLUMNS))


def _bar_count(ax):
    return sum(len(c) for c in ax.containers)


def _legend_is_outside(ax):
    fig = ax.figure
    fig.canvas.draw()
    legend = ax.get_legend().get_window_extent()
    return legend.x0 >= ax.get_window_extent().x1 - 1


def _names_the_setting(text, model="megatron-gpt-39b", cluster="2 x dgx-a100", batch="global batch 64"):
    return all(part in text for part in (model, cluster, batch))


def test_breakdown_draws_the_fastest_plans_with_one_container_per_part(table):
    fig = plots.breakdown(table, max_plans=5)
    ax = fig.axes[0]
    ok = table[table["feasible"].fillna(False).astype(bool)]
    fastest = ok.sort_values("step_time_s").head(5)
    parts = [k for k in BREAKDOWN_KEYS if fastest[f"breakdown_s.{k}"].fillna(0).to_numpy().any()]
    assert len(ax.containers) == len(parts)
    assert all(len(c) == 5 for c in ax.containers)
    tops = np.sum([[b.get_height() for b in c] for c in ax.containers], axis=0)
    assert np.allclose(tops, fastest["step_time_s"], rtol=1e-9)
    assert ax.get_ylabel() == "step time (s), exposed parts"
    assert _names_the_setting(ax.get_title()) and f"5 fastest of {len(ok)} plans that fit" in ax.get_title()
    assert _legend_is_outside(ax)


def test_breakdown_of_one_evaluate_json_is_one_bar_of_its_exposed_parts(tmp_path):
    d = evaluate(load_scenario("quickstart"), engine="analytic").to_dict()
    path = tmp_path / "one.json"
    path.write_text(json.dumps(d))
    ax = plots.plot_file(path, "breakdown", tmp_path / "one.png").axes[0]
    assert (tmp_path / "one.png").is_file()
    assert all(len(c) == 1 for c in ax.containers)
    assert sum(c[0].get_height() for c in ax.containers) == pytest.approx(d["step_time_s"], rel=1e-9)
    assert ax.get_xticklabels()[0].get_text() == d["scenario"]


def test_memory_has_one_stacked_bar_per_stage_and_the_capacity_line():
    result = evaluate(load_scenario("scenarios/gpt3-175b-1024xa100.yaml", {"plan.pp": 4, "plan.dp": 32,
                                                                            "plan.vpp": 1, "plan.schedule": "1f1b"}))
    d = result.to_dict()
    fig = plots.memory(d)
    ax = fig.axes[0]
    assert len(ax.containers) == 5 and all(len(c) == 4 for c in ax.containers)
    tops = np.sum([[b.get_height() for b in c] for c in ax.containers], axis=0)
    assert np.allclose(tops, [sum(s.values()) for s in d["memory_gib_by_stage"]])
    assert ax.lines[0].get_ydata()[0] == pytest.approx(d["memory_capacity_gib"])
    assert ax.get_ylabel() == "memory per device (GiB)" and _legend_is_outside(ax)
    fig = plots.memory(d, scenario=load_scenario("scenarios/gpt3-175b-1024xa100.yaml"))
    assert "gpt3-175b, 128 x dgx-a100 (1024 x a100-sxm-80gb), global batch 1536" in fig.axes[0].get_title()
    assert "Memory per pipeline stage of tp8 pp16 dp8 v2 rc-selective z1" in fig.axes[0].get_title()


def test_pareto_has_every_feasible_point_and_the_non_dominated_ones(table):
    fig = plots.pareto(table, x="step_time_s", y="peak_memory_gib", min_gain=0.0)
    ax = fig.axes[0]
    ok = table[table["feasible"].fillna(False).astype(bool)]
    xs, ys = ok["step_time_s"].to_numpy(), ok["peak_memory_gib"].to_numpy()
    dominated = [any(xs[j] <= xs[i] and ys[j] <= ys[i] and (xs[j] < xs[i] or ys[j] < ys[i]) for j in range(len(xs)))
                 for i in range(len(xs))]
    assert len(ax.collections[0].get_offsets()) == len(ok)
    assert len(ax.collections[1].get_offsets()) == dominated.count(False)
    assert len(ax.texts) == dominated.count(False)
    assert (ax.get_xlabel(), ax.get_ylabel()) == ("step time (s)", "peak memory per device (GiB)")
    assert _names_the_setting(ax.get_title()) and _legend_is_outside(ax)


def test_a_large_sweeps_pareto_is_logarithmic_and_labels_ten_frontier_points_ends_included():
    # a frontier of 14 plans from 1 s to 1000 s (cost falling from 200 to 1), each with a
    # dominated twin at twice the cost; nodes and batch differ along it
    xs = np.logspace(0, 3, 14)
    ys = 200 / xs ** (np.log(200) / np.log(1000))
    rows = [{"feasible": True, "step_time_s": x, "usd_per_million_tokens": y * f, "tp": 8, "pp": 2, "dp": 4,
             "model": "llama-3.1-70b", "node": "dgx-h100",
             "nodes": 8 * (i % 2 + 1), "global_batch": 256 * (i % 3 + 1)}
            for i, (x, y) in enumerate(zip(xs, ys)) for f in (1, 2)]
    ax = plots.pareto(pd.DataFrame(rows)).axes[0]
    assert (ax.get_xscale(), ax.get_yscale()) == ("log", "log")
    assert len(ax.collections[1].get_offsets()) == 14 and len(ax.texts) == 10
    labelled = sorted(t.xy[0] for t in ax.texts)
    assert labelled[0] == pytest.approx(1.0) and labelled[-1] == pytest.approx(1000.0)
    assert ax.texts[0].get_text() == "8 nodes, batch 256: tp8 pp2 dp4"
    assert "global batch 256-768" in ax.get_title()


def test_a_pareto_over_batch_sizes_compares_time_per_million_tokens_not_step_time():
    # plan b takes twice a's step for four times a's batch: half the time per token, at a's cost
    rows = [{"feasible": True, "global_batch": 256, "step_time_s": 10.0, "tokens_per_s": 1e5,
             "usd_per_million_tokens": 2.0, "tp": 8, "pp": 1, "dp": 8, "model": "m", "node": "dgx-h100", "nodes": 8},
            {"feasible": True, "global_batch": 1024, "step_time_s": 20.0, "tokens_per_s": 2e5,
             "usd_per_million_tokens": 2.0, "tp": 8, "pp": 1, "dp": 8, "model": "m", "node": "dgx-h100", "nodes": 8}]
    ax = plots.pareto(pd.DataFrame(rows)).axes[0]
    assert ax.get_xlabel() == "time per million tokens (s)"
    assert [tuple(p) for p in ax.collections[1].get_offsets()] == [(5.0, 2.0)]  # b alone: 1e6 / 2e5 s


def test_heatmap_has_a_cell_per_tp_pp_and_crosses_where_no_plan_fits(table):
    fig = plots.heatmap(table)
    ax = fig.axes[0]
    assert ax.images[0].get_array().shape == (3, 4)  # pp x tp
    fits = table.groupby(["tp", "pp"])["feasible"].apply(lambda s: bool(s.fillna(False).any()))
    assert sum(t.get_text() == plots.INFEASIBLE_MARK for t in ax.texts) == int((~fits).sum())
    assert (~fits).sum() > 0 and fits.sum() > 0
    assert ax.get_xlabel() == "tensor-parallel size TP (devices)" and _names_the_setting(ax.get_title())
    assert fig.axes[1].get_ylabel() == "throughput (tokens/s)"  # the colour bar


def test_heatmap_cells_read_as_short_numbers_dark_on_the_light_end_of_the_scale(table):
    assert [plots._short(v) for v in (689_012.0, 1.254e6, 999_999.0, 2.5e9, 512.0, 0.5)] == \
        ["689k", "1.25M", "1M", "2.5G", "512", "0.5"]
    ax = plots.heatmap(table).axes[0]
    _, _, grid, _ = plots.heatmap_grid(table)
    texts = {(round(t.get_position()[1]), round(t.get_position()[0])): t for t in ax.texts}
    brightest = np.unravel_index(np.nanargmax(grid), grid.shape)
    darkest = np.unravel_index(np.nanargmin(grid), grid.shape)
    assert texts[brightest].get_color() == "black" and texts[darkest].get_color() == "white"


def _bars(ax):
    return sum(len(c.get_paths()) for c in ax.collections)


def test_timeline_has_one_bar_per_task_and_one_lane_per_stage_stream():
    fig = plots.timeline(_timeline())
    ax = fig.axes[0]
    assert _bars(ax) == 7
    assert len(ax.get_yticks()) == 4  # (0, compute), (0, dp), (1, compute), (1, pp)
    assert ax.get_xlabel() == "time in the step (s)" and "aggregated" not in ax.get_title()
    assert _legend_is_outside(ax)


def test_a_dense_timeline_keeps_every_stage_and_says_what_it_aggregated():
    """16 stages x 1,000 back-to-back tasks: more than the 5,000 bars drawn at most."""
    rows = [(stage, "compute", f"F{i}", stage + 0.01 * i, stage + 0.01 * i + 0.009)
            for stage in range(16) for i in range(1000)]
    tl = pd.DataFrame(rows, columns=list(plots.TIMELINE_COLUMNS))
    fig = plots.timeline(tl)
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_yticklabels()] == [f"stage {s} compute" for s in range(16)]
    assert _bars(ax) <= 5000
    assert "16,000 tasks on 16 pipeline stages; aggregated into" in ax.get_title()
    starts = [p.vertices[:, 0].min() for c in ax.collections for p in c.get_paths()]
    ends = [p.vertices[:, 0].max() for c in ax.collections for p in c.get_paths()]
    assert min(starts) == pytest.approx(tl["start_s"].min()) and max(ends) == pytest.approx(tl["end_s"].max())


def test_scatter_has_one_point_per_measurement():
    df = pd.DataFrame({"id": list("abcde"), "measured": [1.0, 2.0, 3.0, 4.0, None],
                       "predicted": [1.1, 1.9, 3.3, 3.8, 2.0]})
    ax = plots.scatter(df).axes[0]
    assert len(ax.collections[0].get_offsets()) == 4


def test_scatter_draws_one_panel_per_metric_with_its_unit():
    df = pd.DataFrame({"id": list("abcd"), "metric": ["step_time_s", "step_time_s", "hardware_tflops_per_device",
                                                       "hardware_tflops_per_device"],
                       "measured": [1.0, 2.0, 150.0, 160.0], "predicted": [1.1, 1.9, 148.0, 170.0]})
    fig = plots.scatter(df)
    assert len(fig.axes) == 2
    assert [a.get_xlabel() for a in fig.axes] == ["measured step time (s)", "measured hardware TFLOP/s per device"]
    assert [len(a.collections[0].get_offsets()) for a in fig.axes] == [2, 2]


def test_scatter_labels_the_ten_runs_farthest_from_y_equals_x_on_log_axes_when_wide():
    # 14 runs from 0.1 to 100 s; run i is off by i % (its ratio 1 + i/100), so the ten
    # farthest are runs 4..13
    measured = np.logspace(-1, 2, 14)
    df = pd.DataFrame({"id": [f"r{i}" for i in range(14)], "measured": measured,
                       "predicted": measured * (1 + np.arange(14) / 100)})
    ax = plots.scatter(df).axes[0]
    assert sorted(t.get_text() for t in ax.texts) == sorted(f"r{i}" for i in range(4, 14))
    assert (ax.get_xscale(), ax.get_yscale()) == ("log", "log")


def test_a_scatter_of_one_run_draws_its_band_around_it():
    ax = plots.scatter(pd.DataFrame({"id": ["a"], "measured": [468.0], "predicted": [470.0]})).axes[0]
    assert list(ax.lines[0].get_xdata()) == pytest.approx([468.0 / 1.3, 470.0 * 1.3])


def test_accelerators_have_one_bar_per_accelerator_with_its_best_plan(accel_table):
    fig = plots.accelerators(accel_table)
    left, right = fig.axes
    assert len(left.patches) == len(right.patches) == 3
    ok = accel_table[accel_table["feasible"].fillna(False).astype(bool)]
    best = ok.groupby("accelerator")["tokens_per_s"].max().sort_index()
    devices = ok.groupby("accelerator")["devices"].first().sort_index()
    assert np.allclose([p.get_height() for p in right.patches], best.to_numpy() / devices.to_numpy())
    assert right.get_ylabel() == "throughput per device (tokens/s)"
    assert "megatron-gpt-7.5b, global batch 64" in fig._suptitle.get_text()


@pytest.mark.parametrize("kind", list(plots.KINDS))
def test_each_kind_writes_a_png(kind, table, accel_table, tmp_path):
    src = tmp_path / "results.csv"
    if kind == "timeline":
        _timeline().to_csv(src, index=False)
    elif kind == "scatter":
        src = tmp_path / "v.json"
        src.write_text(json.dumps({"rows": [{"id": "a", "measured": 1.0, "predicted": 1.2},
                                            {"id": "b", "measured": 2.0, "predicted": 1.8}]}))
    else:
        (accel_table if kind == "accelerators" else table).to_csv(src, index=False)
    out = tmp_path / f"{kind}.png"
    fig = plots.plot_file(src, kind, out)
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    for ax in fig.axes:
        if ax.get_label() != "<colorbar>":
            assert ax.get_xlabel() and ax.get_ylabel(), kind
    assert fig.axes[0].get_title() or fig._suptitle is not None


def test_cli_plot_writes_the_png(table, tmp_path):
    import subprocess
    import sys
    src = tmp_path / "r.parquet"
    table.to_parquet(src)
    out = tmp_path / "heatmap.png"
    proc = subprocess.run([sys.executable, "-m", "simulator.cli", "plot", str(src), "--kind", "heatmap", "-o", str(out)],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert out.read_bytes()[:4] == b"\x89PNG"


def test_cli_plot_into_a_missing_folder_creates_it(table, tmp_path):
    import subprocess
    import sys
    src = tmp_path / "r.csv"
    table.to_csv(src, index=False)
    out = tmp_path / "new" / "deeper" / "b.png"
    proc = subprocess.run([sys.executable, "-m", "simulator.cli", "plot", str(src), "--kind", "breakdown", "-o",
                           str(out)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert out.read_bytes()[:4] == b"\x89PNG"
    proc = subprocess.run([sys.executable, "-m", "simulator.cli", "plot", str(src), "--kind", "memory", "--row",
                           "99999", "-o", str(out)], capture_output=True, text=True)
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1 and "--row" in proc.stderr


def test_a_table_cell_not_of_its_columns_kind_is_refused_naming_column_row_and_value(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text("point_index,feasible,tp,step_time_s,peak_memory_gib\n0,True,2,1.5,30\n1,True,4,abc,31\n")
    with pytest.raises(InputError, match=r"RESULTS step_time_s: got 'abc'; expected a finite number \(row 1 of"):
        plots.plot_file(path, "breakdown", tmp_path / "b.png")
    path.write_text("point_index,feasible,tp,step_time_s,peak_memory_gib\n0,yes,2,1.5,30\n")
    with pytest.raises(InputError, match=r"RESULTS feasible: got 'yes'; expected True or False \(row 0"):
        plots.plot_file(path, "breakdown", tmp_path / "b.png")


def test_a_memory_plot_of_a_row_without_memory_is_refused(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text("point_index,feasible,step_time_s,memory_capacity_gib\n0,True,1.0,80\n")
    with pytest.raises(InputError, match="no memory_gib_by_stage, memory_gib or memory_gib"):
        plots.plot_file(path, "memory", tmp_path / "m.png")


def test_a_timeline_task_without_its_times_or_a_trace_event_without_its_fields_is_refused(tmp_path):
    path = tmp_path / "tl.csv"
    path.write_text("name,stage,stream,start_s,end_s\nF0,0,compute,0.0,0.1\nB0,0,compute,,0.3\n")
    with pytest.raises(InputError, match="plot --kind timeline: got 'row 1'; every task needs its stage"):
        plots.plot_file(path, "timeline", tmp_path / "t.png")
    path.write_text("name,stage,stream,start_s,end_s\nF0,x,compute,0.0,0.1\n")
    with pytest.raises(InputError, match=r"RESULTS stage: got 'x'; expected an integer \(row 0"):
        plots.plot_file(path, "timeline", tmp_path / "t.png")
    trace = tmp_path / "trace.json"
    trace.write_text(json.dumps({"traceEvents": [{"ph": "X", "name": "F0", "pid": 0, "tid": 0, "ts": 0.0}]}))
    with pytest.raises(InputError, match=r"traceEvents\[0\]: got .*; expected a complete event"):
        plots.plot_file(trace, "timeline", tmp_path / "t.png")
