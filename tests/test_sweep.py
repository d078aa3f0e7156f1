"""Sweeps: rows equal single evaluations, bad points are rows, resume, processes, Dask."""

import copy
import json
import math
import os
import shutil
import subprocess
import sys

import importlib

import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from plans import FIXED_DRAWS

from simulator import InputError, apply_overrides, evaluate, scenario_from_dict
from simulator.space import space_from_dict
from simulator.sweep import sweep

sweep_module = importlib.import_module("simulator.sweep")  # `simulator.sweep` is the function

BASE = {"model": {"preset": "megatron-gpt-1.7b"}, "cluster": {"node": "dgx-a100", "nodes": 2},
        "plan": {"global_batch": 64, "dp": "auto"}, "training": {"tokens": 1.0e+10}}
SPACE = {"base": BASE, "sweep": {"plan.tp": [1, 2, 4, 8], "plan.pp": [1, 2, 3, 4], "plan.micro_batch": [1, 2],
                                 "plan.recompute": ["none", "full"]}}
NUMERIC = ("step_time_s", "tokens_per_s", "mfu", "peak_memory_gib", "cost_usd_per_step", "usd_per_million_tokens",
           "time_to_train_days", "cost_to_train_usd")


def _space():
    return space_from_dict(SPACE)


def _expected(point):
    """One evaluate() call for a point, or None when its scenario is invalid."""
    try:
        scenario = scenario_from_dict(apply_overrides(BASE, point))
    except Exception:
        return None
    return evaluate(scenario, engine="analytic").to_dict()


@pytest.mark.parametrize("vectorize", [True, False])
def test_sweep_rows_equal_single_evaluations(vectorize):
    df = sweep(_space(), workers=1, progress=False, vectorize=vectorize)
    points = _space().points()
    assert len(df) == len(points)
    for row, point in zip(df.itertuples(index=False), points):
        row = row._asdict() if hasattr(row, "_asdict") else dict(zip(df.columns, row))
        want = _expected(point)
        if want is None:
            continue
        assert bool(df.loc[row["point_index"], "feasible"]) == want["feasible"]
        for key in NUMERIC:
            assert math.isclose(df.loc[row["point_index"], key], want[key], rel_tol=1e-12), key
        for key, value in want["breakdown_s"].items():
            assert math.isclose(df.loc[row["point_index"], f"breakdown_s.{key}"], value, rel_tol=1e-12, abs_tol=1e-300)
        stages = json.loads(df.loc[row["point_index"], "memory_gib_by_stage"])
        assert len(stages) == len(want["memory_gib_by_stage"])
        for got_stage, want_stage in zip(stages, want["memory_gib_by_stage"]):
            assert all(math.isclose(got_stage[k], v, rel_tol=1e-12) for k, v in want_stage.items())


def test_a_list_field_is_an_axis_whose_cells_are_its_json_and_rows_equal_evaluations():
    space = space_from_dict({"base": {**BASE, "plan": {**BASE["plan"], "tp": 2, "sequence_parallel": True,
                                                        "recompute": "selective"}},
                             "sweep": {"plan.recompute_modules": [["core_attn"], ["core_attn", "mlp"], ["mlp"]]}})
    df = sweep(space, workers=1, progress=False)
    assert list(df["plan.recompute_modules"]) == ['["core_attn"]', '["core_attn", "mlp"]', '["mlp"]']
    for row, point in zip(df.itertuples(index=False), space.points()):
        want = evaluate(scenario_from_dict(apply_overrides(space.base, point)), "analytic")
        assert math.isclose(row.step_time_s, want.step_time_s, rel_tol=1e-12)
        assert math.isclose(row.peak_memory_gib, want.peak_memory_bytes / 2**30, rel_tol=1e-12)


def test_a_graph_engine_sweep_gives_each_point_the_graph_engines_evaluation():
    space = space_from_dict({"base": BASE, "sweep": {"plan.tp": [1, 2], "plan.pp": [1, 2]}})
    df = sweep(space, workers=1, progress=False, engine="graph")
    assert len(df) == 4 and set(df["engine"]) == {"graph"}
    for row, point in zip(df.itertuples(index=False), space.points()):
        want = evaluate(scenario_from_dict(apply_overrides(BASE, point)), engine="graph").to_dict()
        assert math.isclose(row.step_time_s, want["step_time_s"], rel_tol=1e-12)


def test_a_sweep_row_names_the_properties_its_plan_has_beyond_the_validated_runs():
    df = sweep(_space(), workers=1, progress=False)
    named = 0
    for row, point in zip(df.itertuples(index=False), _space().points()):
        want = _expected(point)
        if want is not None:
            assert row.outside_validation == ", ".join(f["field"] for f in want["outside_validation"])
            named += bool(row.outside_validation)
    assert named  # the A100 runs recomputed: `recompute: none` is beyond them


def test_invalid_points_are_infeasible_rows_with_the_input_error():
    df = sweep(_space(), workers=1, progress=False)
    bad = df[(df["tp"] == 1) & (df["pp"] == 3)]  # 16 devices are not a multiple of pp = 3
    assert len(bad) == 4
    assert not bad["feasible"].any()
    assert bad["reason"].str.startswith("plan.tp: got 1; tp*pp*cp = 3 must divide the 16 devices").all()
    assert bad["step_time_s"].isna().all()


def test_out_of_memory_points_are_infeasible_rows_with_times():
    space = space_from_dict({"base": {**BASE, "model": {"preset": "megatron-gpt-39b"}}, "sweep": {"plan.tp": [1, 8], "plan.zero_stage": 1}})
    df = sweep(space, workers=1, progress=False)
    assert list(df["feasible"]) == [False, True]
    assert df.loc[0, "reason"].startswith("out of memory")
    assert df["step_time_s"].notna().all()


def test_rows_are_in_product_order_with_point_fields_as_written():
    df = sweep(_space(), workers=1, progress=False)
    assert list(df["point_index"]) == list(range(len(df)))
    assert list(df["plan.tp"][:8]) == [1] * 8
    assert list(df["plan.recompute"][:2]) == ["none", "full"]


class _Stop(Exception):
    pass


def _interrupt_after(n):
    def callback(done, total):
        if done == n:
            raise _Stop
    return callback


@pytest.mark.parametrize("suffix", [".csv", ".parquet"])
def test_resume_after_interrupt_gives_the_identical_table(tmp_path, suffix, monkeypatch):
    full = sweep(_space(), workers=1, progress=False, out=tmp_path / f"full{suffix}", chunk_size=8)
    out = tmp_path / f"part{suffix}"
    with pytest.raises(_Stop):
        sweep(_space(), workers=1, progress=False, out=out, chunk_size=8, on_chunk=_interrupt_after(3))
    reader = pd.read_csv if suffix == ".csv" else (lambda p: pd.concat(
        [pd.read_parquet(f) for f in sorted(p.with_name(p.name + ".parts").glob("*.parquet"))]))
    stored = set(reader(out)["point_index"])
    assert len(stored) == 24  # three chunks of eight
    evaluated = []
    real = sweep_module.evaluate_chunk

    def spy(items, **kw):
        evaluated.extend(i for i, _, _ in items)
        return real(items, **kw)
    monkeypatch.setattr(sweep_module, "evaluate_chunk", spy)
    resumed = sweep(_space(), workers=1, progress=False, out=out, chunk_size=8, resume=True)
    assert sorted(evaluated) == sorted(set(range(len(full))) - stored)  # stored points were not recomputed
    pd.testing.assert_frame_equal(resumed, full)
    reader = pd.read_csv if suffix == ".csv" else pd.read_parquet
    pd.testing.assert_frame_equal(reader(out), reader(tmp_path / f"full{suffix}"))


KILL_SCRIPT = """
import os, signal, sys
from simulator.space import space_from_dict
from simulator.sweep import sweep
SPACE = {space!r}
def die(done, total):
    if done == 2:
        os.kill(os.getpid(), signal.SIGKILL)
sweep(space_from_dict(SPACE), workers=1, progress=False, out=sys.argv[1], chunk_size=4, on_chunk=die)
"""


def test_resume_after_kill_gives_the_identical_table(tmp_path):
    out = tmp_path / "killed.csv"
    proc = subprocess.run([sys.executable, "-c", KILL_SCRIPT.format(space=SPACE), str(out)], capture_output=True)
    assert proc.returncode == -9
    assert len(pd.read_csv(out)) == 8
    resumed = sweep(_space(), workers=1, progress=False, out=out, resume=True)
    full = sweep(_space(), workers=1, progress=False, out=tmp_path / "full.csv")
    pd.testing.assert_frame_equal(resumed, full)
    assert out.read_text() == (tmp_path / "full.csv").read_text()


def test_a_torn_last_csv_line_is_dropped_and_recomputed_on_resume(tmp_path):
    full = sweep(_space(), workers=1, progress=False, out=tmp_path / "full.csv")
    out = tmp_path / "torn.csv"
    text = (tmp_path / "full.csv").read_text()
    lines = text.splitlines(keepends=True)
    out.write_text("".join(lines[:10]) + lines[10][:40])  # header, 9 rows, and a row cut short
    (tmp_path / "torn.csv.llmsim.json").write_text((tmp_path / "full.csv.llmsim.json").read_text())
    resumed = sweep(_space(), workers=1, progress=False, out=out, resume=True)
    pd.testing.assert_frame_equal(resumed, full)


def test_resume_refuses_a_changed_space(tmp_path):
    out = tmp_path / "o.csv"
    other = space_from_dict({**SPACE, "base": {**BASE, "plan": {"global_batch": 128, "dp": "auto"}}})
    sweep(other, workers=1, progress=False, out=out)
    with pytest.raises(InputError, match="the space changed"):
        sweep(_space(), workers=1, progress=False, out=out, resume=True)
    reordered = space_from_dict({**SPACE, "sweep": dict(reversed(list(SPACE["sweep"].items())))})
    sweep(_space(), workers=1, progress=False, out=out)
    with pytest.raises(InputError, match="the space changed"):  # same points, other point_index values
        sweep(reordered, workers=1, progress=False, out=out, resume=True)


@pytest.mark.parametrize("record", [None, '{"space_sha256": 5}', '{"space_sha256": {"a": 1}}', "[1]", "{"])
def test_resume_without_a_readable_space_record_is_refused(tmp_path, record):
    out = tmp_path / "o.csv"
    sweep(_space(), workers=1, progress=False, out=out)
    if record is None:
        (tmp_path / "o.csv.llmsim.json").unlink()
    else:
        (tmp_path / "o.csv.llmsim.json").write_text(record)
    with pytest.raises(InputError, match="cannot be verified"):
        sweep(_space(), workers=1, progress=False, out=out, resume=True)


def test_a_second_sweep_into_the_same_output_is_refused(tmp_path):
    out = tmp_path / "o.parquet"
    store = sweep_module._store(out, {}, print)
    store.lock()
    try:
        with pytest.raises(InputError, match="another sweep is writing"):
            sweep(_space(), workers=1, progress=False, out=out)
    finally:
        store.release()
    sweep(_space(), workers=1, progress=False, out=out)  # free again


@pytest.mark.parametrize("damage", ["fields", "garbage", "type", "hex", "blank", "nan"])
def test_damaged_csv_rows_are_named_dropped_and_recomputed(tmp_path, damage):
    full = sweep(_space(), workers=1, progress=False, out=tmp_path / "full.csv")
    out = tmp_path / "d.csv"
    lines = (tmp_path / "full.csv").read_text().splitlines(keepends=True)
    cells = lines[5].split(",")
    step = lines[0].split(",").index("step_time_s")
    lines[5] = {"fields": ",".join(cells[:10]) + "\n", "garbage": "\x00\x01 not a row\n",
                "type": ",".join(["x7"] + cells[1:]), "hex": ",".join([hex(int(cells[0]))] + cells[1:]),
                "blank": "\n", "nan": ",".join(["nan(1)" if i == step else c for i, c in enumerate(cells)])}[damage]
    out.write_text("".join(lines))
    (tmp_path / "d.csv.llmsim.json").write_text((tmp_path / "full.csv.llmsim.json").read_text())
    messages = []
    resumed = sweep(_space(), workers=1, progress=False, out=out, resume=True, log=messages.append)
    pd.testing.assert_frame_equal(resumed, full)
    assert len(messages) == 1 and str(out) in messages[0] and "line 6" in messages[0], messages


def test_a_damaged_parquet_output_is_named_and_recomputed(tmp_path):
    full = sweep(_space(), workers=1, progress=False, out=tmp_path / "full.parquet")
    out = tmp_path / "d.parquet"
    out.write_bytes((tmp_path / "full.parquet").read_bytes()[:300])
    (tmp_path / "d.parquet.llmsim.json").write_text((tmp_path / "full.parquet.llmsim.json").read_text())
    messages = []
    resumed = sweep(_space(), workers=1, progress=False, out=out, resume=True, log=messages.append)
    pd.testing.assert_frame_equal(resumed, full)
    assert len(messages) == 1 and "unreadable Parquet" in messages[0]


def test_rows_reach_the_output_at_least_every_flush_interval(tmp_path, monkeypatch):
    """Chunks that take 0.4 s each on a stand-in clock (the rule, not the machine's speed:
    a loaded CI host made the wall-clock version flaky): the stored rows never lag more than
    FLUSH_S plus one chunk's evaluation behind."""
    now = [0.0]

    class Clock:
        @staticmethod
        def monotonic():
            return now[0]

    real = sweep_module.evaluate_chunk
    writes = []

    def slow(items, **kw):
        now[0] += 0.4
        return real(items, **kw)
    monkeypatch.setattr(sweep_module, "evaluate_chunk", slow)
    monkeypatch.setattr(sweep_module, "time", Clock)
    append = sweep_module._CsvStore.append

    def spy(self, rows, index, text=None):
        writes.append(now[0])
        return append(self, rows, index, text)
    monkeypatch.setattr(sweep_module._CsvStore, "append", spy)
    sweep(_space(), workers=1, progress=False, out=tmp_path / "o.csv", chunk_size=8)
    gaps = [b - a for a, b in zip([0.0] + writes, writes)]
    assert len(writes) >= 2 and max(gaps) <= sweep_module.FLUSH_S + 0.4 + 1e-9, gaps


def test_sweep_accepts_a_mapping_and_numpy_integers():
    import numpy as np
    pd.testing.assert_frame_equal(sweep(SPACE, workers=np.int64(1), progress=False),
                                  sweep(_space(), workers=1, progress=False))


@pytest.mark.parametrize("kwargs", [{"workers": -1}, {"workers": "2"}, {"chunk_size": -1}, {"chunk_size": 0},
                                    {"engine": "fast"}, {"resume": True}, {"progress": "yes"}, {"dask": 3},
                                    {"out": 5}])
def test_bad_sweep_arguments_raise_input_error(kwargs):
    with pytest.raises(InputError):
        sweep(_space(), **{"progress": False, **kwargs})


def test_integers_beyond_int64_are_kept_exactly_as_text(tmp_path):
    big = [2**53 + 1, 2**63 + 5]
    space = space_from_dict({**SPACE, "sweep": {"plan.tp": [1], "training.tokens": big}})
    for suffix in (".csv", ".parquet"):
        df = sweep(space, workers=1, progress=False, out=tmp_path / f"o{suffix}")
        assert list(df["training.tokens"]) == [str(v) for v in big]
    exact = space_from_dict({**SPACE, "sweep": {"plan.tp": [1], "training.tokens": [2**53 + 1, 2**62 + 1]}})
    for suffix in (".csv", ".parquet"):
        df = sweep(exact, workers=1, progress=False, out=tmp_path / f"e{suffix}")
        assert [int(v) for v in df["training.tokens"]] == [2**53 + 1, 2**62 + 1]


def test_local_processes_give_the_in_process_table():
    pd.testing.assert_frame_equal(sweep(_space(), workers=2, progress=False),
                                  sweep(_space(), workers=1, progress=False))


def test_a_csv_written_by_worker_processes_is_the_returned_table_as_csv(tmp_path):
    """The workers format the lines of their chunks; the file is the table written whole."""
    table = sweep(_space(), workers=2, progress=False, out=tmp_path / "o.csv", chunk_size=5)
    assert (tmp_path / "o.csv").read_text() == table.to_csv(index=False, lineterminator="\n")


def test_each_row_carries_the_id_of_its_point_worked_out_where_it_was_evaluated():
    from simulator.sweep import point_id

    table = sweep(_space(), workers=2, progress=False, chunk_size=5)
    assert table["point_id"].tolist() == [point_id(BASE, p, "analytic") for p in _space().points()]


def test_dask_local_cluster_gives_the_in_process_table(tmp_path):
    df = sweep(_space(), workers=1, dask="local", progress=False, out=tmp_path / "d.parquet")
    pd.testing.assert_frame_equal(df, sweep(_space(), workers=1, progress=False))


def test_package_sweep_is_the_sweep_function():
    import simulator
    assert simulator.sweep is sweep
    pd.testing.assert_frame_equal(simulator.sweep(_space(), workers=1, progress=False),
                                  sweep(_space(), workers=1, progress=False))


def test_cli_sweep_writes_the_table(tmp_path):
    import yaml
    space = tmp_path / "space.yaml"
    space.write_text(yaml.safe_dump(SPACE, sort_keys=False))
    out = tmp_path / "r.parquet"
    proc = subprocess.run([sys.executable, "-m", "simulator.cli", "sweep", str(space), "-o", str(out), "--workers", "1",
                           "--no-progress"], capture_output=True, text=True, env=os.environ)
    assert proc.returncode == 0, proc.stderr
    assert "64 points" in proc.stdout
    pd.testing.assert_frame_equal(pd.read_parquet(out), sweep(_space(), workers=1, progress=False))


def test_chunks_hold_whole_runs_of_points_that_differ_only_in_sizes():
    # runs by the non-size fields: recompute none (5 points), full (3), selective (12)
    points = [{"plan.tp": t, "plan.recompute": "none"} for t in range(5)] + \
             [{"plan.tp": t, "plan.recompute": "full"} for t in range(3)] + \
             [{"plan.tp": t, "plan.recompute": "selective"} for t in range(12)]
    items = [(i, f"p{i}", p) for i, p in enumerate(points)]
    chunks = sweep_module._group_chunks(items, 8)
    runs = [sorted({p["plan.recompute"] for _, _, p in c}) for c in chunks]
    # sorted by the run's fields: full (3) and none (5) fill one chunk of 8; selective (12) is
    # longer than 8 and is cut into two equal pieces of 6
    assert [len(c) for c in chunks] == [8, 6, 6]
    assert runs == [["full", "none"], ["selective"], ["selective"]]
    assert sorted(i for c in chunks for i, _, _ in c) == list(range(20))


def test_a_table_keeps_integers_with_empty_cells_exact():
    from simulator import table
    rows = [{"point_index": 0, "dp": 2**62 + 1}, {"point_index": 1, "feasible": False}]
    df = table.frame(rows, table.schema())
    assert str(df["dp"].dtype) == "Int64"
    assert df["dp"][0] == 2**62 + 1 and df["dp"][1] is pd.NA
    assert df["point_id"].tolist() == ["", ""] and df["feasible"].tolist() == [pd.NA, False]


@pytest.mark.parametrize("suffix", [".csv", ".parquet"])
def test_the_returned_table_is_the_one_the_output_reads_back_as(tmp_path, suffix):
    out = tmp_path / f"o{suffix}"
    written = sweep(_space(), workers=1, progress=False, out=out)
    read_back = sweep(_space(), workers=1, progress=False, out=out, resume=True)  # nothing left to evaluate
    pd.testing.assert_frame_equal(read_back, written, check_exact=True)


@pytest.mark.parametrize("suffix", [".csv", ".parquet"])
def test_resuming_a_finished_output_leaves_the_file_as_it_is(tmp_path, suffix):
    out = tmp_path / f"o{suffix}"
    written = sweep(_space(), workers=1, progress=False, out=out)
    before = out.stat().st_ino, out.read_bytes()
    read_back = sweep(_space(), workers=1, progress=False, out=out, resume=True)
    assert (out.stat().st_ino, out.read_bytes()) == before  # not rewritten (a rewrite replaces the inode)
    pd.testing.assert_frame_equal(read_back, written, check_exact=True)


def test_a_resumed_parquet_whose_rows_are_out_of_order_or_foreign_is_rewritten_in_point_order(tmp_path):
    full = sweep(_space(), workers=1, progress=False, out=tmp_path / "full.parquet")
    for name, rows in (("shuffled", full.iloc[::-1]), ("foreign", full.assign(point_index=full.point_index + 1))):
        out = tmp_path / f"{name}.parquet"
        rows.to_parquet(out, index=False)
        shutil.copy(tmp_path / "full.parquet.llmsim.json", tmp_path / f"{name}.parquet.llmsim.json")
        got = sweep(_space(), workers=1, progress=False, out=out, resume=True, log=lambda message: None)
        pd.testing.assert_frame_equal(got, full, check_exact=True)
        assert out.read_bytes() == (tmp_path / "full.parquet").read_bytes()


@pytest.mark.parametrize("disorder", ["shuffled", "repeated"])
def test_a_resumed_csv_whose_rows_are_out_of_order_or_repeated_ends_in_point_order(tmp_path, disorder):
    full = sweep(_space(), workers=1, progress=False, out=tmp_path / "full.csv")
    header, *rows = (tmp_path / "full.csv").read_text().splitlines(keepends=True)
    rows = rows[1::2] + rows[::2] if disorder == "shuffled" else rows[:5] + rows[4:]
    out = tmp_path / "o.csv"
    out.write_text(header + "".join(rows))
    (tmp_path / "o.csv.llmsim.json").write_text((tmp_path / "full.csv.llmsim.json").read_text())
    resumed = sweep(_space(), workers=1, progress=False, out=out, resume=True)
    pd.testing.assert_frame_equal(resumed, full)
    assert out.read_text() == (tmp_path / "full.csv").read_text()


def test_an_intact_csv_is_read_as_its_lines_read_one_by_one_give(tmp_path):
    """pyarrow's reader (intact files) against the line-by-line check (damaged ones), on rows
    with empty cells (invalid points), booleans and quoted JSON."""
    from simulator import table
    out = tmp_path / "o.csv"
    written = sweep(_space(), workers=1, progress=False, out=out)
    assert written["step_time_s"].isna().any() and written["memory_gib_by_stage"].str.contains(",").any()
    store = sweep_module._CsvStore(out, table.schema({n: table.axis_kind(v) for n, v in _space().axes}), print)
    raw = out.read_bytes()
    typed, lines = store._typed(raw), store._line_by_line(raw)
    pd.testing.assert_frame_equal(table.normalize(typed, store.kinds), table.normalize(lines, store.kinds),
                                  check_exact=True)


def test_a_csv_whose_cells_hold_line_breaks_ends_in_point_order(tmp_path):
    out = tmp_path / "o.csv"
    space = {**SPACE, "sweep": {"plan.tp": [1, 2], "plan.recompute": ["none", "a\nb"]}}
    written = sweep(space, workers=1, progress=False, out=out)
    assert out.read_text().count("\n") > len(written) + 1  # the invalid points' cells hold line breaks
    assert list(pd.read_csv(out)["point_index"]) == [0, 1, 2, 3]
    pd.testing.assert_frame_equal(sweep(space, workers=1, progress=False, out=out, resume=True), written)


_KEYS = st.sampled_from(["plan", "cluster", "tp", "offload"])
_LEAVES = st.one_of(st.none(), st.integers(-3, 3), st.sampled_from(["x", "auto"]))
_TREES = st.recursive(_LEAVES, lambda inner: st.dictionaries(_KEYS, inner, max_size=3), max_leaves=8)


@settings(max_examples=300, deadline=None, derandomize=FIXED_DRAWS, database=None)
@given(base=st.dictionaries(_KEYS, _TREES, max_size=4),
       fields=st.lists(st.lists(_KEYS, min_size=1, max_size=3).map(".".join), unique=True, max_size=4),
       data=st.data())
def test_a_points_fields_merge_into_the_base_as_apply_overrides_sets_them(base, fields, data):
    """Fields inside others, paths through numbers or text, missing or empty sections: the
    sweep's merge gives apply_overrides' mapping, or its error, and leaves the base as it was."""
    point = {name: data.draw(_TREES) for name in fields}
    before = copy.deepcopy(base)
    try:
        want = apply_overrides(base, point)
    except InputError as exc:
        want = str(exc)
    try:
        got = sweep_module._merger(base, fields)(point)
    except InputError as exc:
        got = str(exc)
    assert got == want
    assert base == before
