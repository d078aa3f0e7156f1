"""Chrome trace (Perfetto), timeline DataFrame, networkx view and the CLI around them."""

import json

import networkx as nx
import pytest

from simulator.cli import main
from simulator.engine import execute as execute_layout
from simulator.evaluate import compile_scenario
from simulator.graph import STREAMS
from simulator.trace import chrome_trace, timeline


def execute(scenario):
    return execute_layout(compile_scenario(scenario))


def one_f_one_b(scenario):
    return scenario(cluster={"node": "dgx-a100", "nodes": 2}, tp=2, pp=4, micro_batch=1, global_batch=16,
                    zero_stage=1)


def test_trace_is_a_valid_chrome_trace(scenario):
    trace = json.loads(json.dumps(chrome_trace(execute(one_f_one_b(scenario)))))
    events = trace["traceEvents"]
    spans = [e for e in events if e["ph"] == "X"]
    assert spans
    for e in spans:
        assert {"name", "ph", "ts", "dur", "pid", "tid"} <= set(e)
        assert e["dur"] >= 0 and e["ts"] >= 0
        assert isinstance(e["pid"], int) and isinstance(e["tid"], int)


def test_trace_has_one_process_per_stage_and_one_thread_per_stream(scenario):
    events = chrome_trace(execute(one_f_one_b(scenario)))["traceEvents"]
    procs = {e["pid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    assert procs == {i: f"pipeline stage {i}" for i in range(4)}
    threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    assert sorted(set(threads.values())) == sorted(STREAMS + ("tp", "cp", "ep"))


def test_1f1b_trace_orders_passes_like_1f1b(scenario):
    """Stage 0 of a 4-stage 1F1B pipeline runs 3 warm-up forwards, then one forward and
    one backward in turn (Narayanan et al. 2021)."""
    events = chrome_trace(execute(one_f_one_b(scenario)))["traceEvents"]
    stage0 = sorted((e["ts"], e["name"]) for e in events if e["ph"] == "X" and e["pid"] == 0 and e["tid"] == 0)
    passes = []
    for _, name in stage0:
        base = name.split("/")[0]  # bucketed pieces of a pass share its name
        if base[0] in "FB" and (not passes or passes[-1] != base):
            passes.append(base)
    assert passes[:8] == ["F0.0", "F0.1", "F0.2", "F0.3", "B0.0", "F0.4", "B0.1", "F0.5"]


def test_pipeline_sends_appear_on_the_p2p_thread(scenario):
    df = timeline(execute(one_f_one_b(scenario)))
    sends = df[df.stream == "p2p"]
    m, p = 8, 4
    assert len(sends) == 2 * m * (p - 1)  # each boundary: one activation and one gradient per micro-batch
    assert (sends.category == "pp_comm").all()


def test_timeline_dataframe_has_a_row_per_task(scenario):
    ex = execute(one_f_one_b(scenario))
    df = timeline(ex)
    assert list(df.columns) == ["task", "name", "stage", "stream", "start_s", "end_s", "duration_s", "category"]
    assert df.task.nunique() == len(ex.graph)
    assert df.end_s.max() == pytest.approx(ex.step_time_s)


def test_networkx_graph_is_a_dag_over_all_tasks(scenario):
    ex = execute(one_f_one_b(scenario))
    g = ex.graph.to_networkx()
    sends = sum(1 for x in ex.graph.post if x > 0)
    assert sends == 2 * 8 * 3
    assert g.number_of_nodes() == len(ex.graph) + sends
    assert nx.is_directed_acyclic_graph(g)
    rel = ex.release_s
    for u, v in g.edges:  # every edge points forward in time
        if isinstance(v, tuple):
            continue
        done = rel[u[1]] if isinstance(u, tuple) else ex.end_s[u]
        assert ex.start_s[v] >= done - 1e-12


def test_cli_writes_the_trace_file(tmp_path, capsys):
    out = tmp_path / "step.json"
    rc = main(["evaluate", "scenarios/gpt3-175b-1024xa100.yaml", "--schedule", "1f1b", "--vpp", "1",
               "--global-batch", "128", "--json", "--trace", str(out)])
    assert rc == 0
    d = json.loads(capsys.readouterr().out)
    trace = json.loads(out.read_text())
    assert trace["otherData"]["step_time_s"] == pytest.approx(d["step_time_s"], rel=1e-9)
    assert len({e["pid"] for e in trace["traceEvents"]}) == 16


def test_cli_analytic_engine_has_no_simulation_fields(capsys):
    assert main(["evaluate", "scenarios/quickstart.yaml", "--json", "--engine", "analytic"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["engine"] == "analytic" and "simulated_tasks" not in d


def test_cli_unknown_engine_exits_2_with_one_line(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["evaluate", "scenarios/quickstart.yaml", "--engine", "magic"])
    assert exc.value.code == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1


def test_cli_unwritable_trace_path_exits_2(tmp_path, capsys):
    (tmp_path / "file").write_text("")
    rc = main(["evaluate", "scenarios/quickstart.yaml", "--trace", str(tmp_path / "file" / "dir.json")])
    assert rc == 2
    assert "--trace" in capsys.readouterr().err


def test_trace_reads_back_as_the_engines_timeline(scenario):
    from simulator.trace import trace_timeline

    ex = execute(one_f_one_b(scenario))
    back = trace_timeline(json.loads(json.dumps(chrome_trace(ex))))
    tl = timeline(ex)
    assert list(back["name"]) == list(tl["name"]) and list(back["stream"]) == list(tl["stream"])
    assert back["end_s"].to_numpy() == pytest.approx(tl["end_s"].to_numpy(), rel=1e-9, abs=1e-12)


def test_cli_plots_a_trace_as_a_gantt_chart(tmp_path):
    trace, png = tmp_path / "t.json", tmp_path / "t.png"
    assert main(["evaluate", "scenarios/quickstart.yaml", "--pp", "2", "--trace", str(trace)]) == 0
    assert main(["plot", str(trace), "--kind", "timeline", "-o", str(png)]) == 0
    assert png.stat().st_size > 0


def test_exposed_tp_collectives_have_rows_of_their_own(scenario):
    ex = execute(one_f_one_b(scenario))  # tp = 2 without overlap: every pass waits for its all-reduces
    df = timeline(ex)
    tp = df[df.stream == "tp"]
    assert len(tp) > 0 and (tp.category == "tp_comm").all()
    passes = df[(df.stream == "compute") & df.name.str.match(r"^[FB]\d")]
    first = passes.iloc[0]
    row = tp[tp.task == first.task].iloc[0]
    # it ends with its pass, and takes the pass's TP share of the executed time
    g = ex.graph
    share = dict(g.parts[first.task])["tp_comm"] / sum(x for c, x in g.parts[first.task] if c != "pp_comm")
    assert row.end_s == pytest.approx(first.end_s) and row.duration_s == pytest.approx(share * first.duration_s)


def test_recomputation_is_drawn_right_before_the_backward_it_serves(scenario):
    """With full recomputation each backward task starts with its rerun forward (graph.py
    folds them into one task); the timeline draws R{c}.{j} ending where B{c}.{j} starts,
    each as long as the Layout's recompute and backward seconds (with their exposed
    collectives) per pass; no durations are stretched in this plan (one node: no NIC)."""
    s = scenario(cluster={"node": "dgx-a100", "nodes": 1}, tp=2, pp=4, micro_batch=1, global_batch=8,
                 recompute="full")
    layout = compile_scenario(s)
    df = timeline(execute(s))
    rows = df[df.stream == "compute"].set_index(["stage", "name"])
    for i in range(4):
        x = layout.representative(i).passes
        rerun = float(x.recompute_s + x.tp_recompute_s + x.cp_recompute_s + x.ep_recompute_s)
        back = float(x.bwd_input_s + x.bwd_weight_s + x.tp_bwd_s + x.cp_bwd_s + x.ep_bwd_s)
        for j in range(8):
            r, b = rows.loc[(i, f"R0.{j}")], rows.loc[(i, f"B0.{j}")]
            assert r.end_s == pytest.approx(b.start_s, rel=1e-12)
            assert (r.duration_s, b.duration_s) == pytest.approx((rerun, back), rel=1e-9)
