"""Sweeps: rows equal single evaluations, bad points are rows, resume, processes, Dask."""

import json
import math
import os
import subprocess
import sys

import importlib

import pandas as pd
import pytest

from simulator import apply_overrides, evaluate, scenario_from_dict
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
    resumed = sweep(_space(), workers=1, progress=False, out=out, resume=True)
    pd.testing.assert_frame_equal(resumed, full)


def test_resume_ignores_rows_of_another_base(tmp_path):
    out = tmp_path / "o.csv"
    other = space_from_dict({**SPACE, "base": {**BASE, "plan": {"global_batch": 128, "dp": "auto"}}})
    sweep(other, workers=1, progress=False, out=out)
    resumed = sweep(_space(), workers=1, progress=False, out=out, resume=True)
    pd.testing.assert_frame_equal(resumed, sweep(_space(), workers=1, progress=False))


def test_local_processes_give_the_in_process_table():
    pd.testing.assert_frame_equal(sweep(_space(), workers=2, progress=False),
                                  sweep(_space(), workers=1, progress=False))


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
