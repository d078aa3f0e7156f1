"""Hypothesis over damaged outputs: whatever lines of a CSV a crash, a disk or a hand left torn,
malformed, repeated, reordered, missing or blank, and whatever rows of a Parquet output were
lost, repeated, reordered or foreign (with an interrupted run's part beside it, or the file
cut short), `--resume` gives the uninterrupted sweep's table and writes its file byte for
byte. Kept small for CI; HYPOTHESIS_PROFILE=long runs more."""

import csv
import io
import os
import tempfile
from pathlib import Path

import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from plans import FIXED_DRAWS

from simulator import table
from simulator.space import space_from_dict
from simulator.sweep import sweep

BASE = {"model": {"preset": "megatron-gpt-1.7b"}, "cluster": {"node": "dgx-a100", "nodes": 2},
        "plan": {"global_batch": 64, "dp": "auto"}, "training": {"tokens": 1.0e+10}}
SPACE = {"base": BASE, "sweep": {"plan.tp": [1, 2, 4, 8], "plan.pp": [1, 2, 3, 4], "plan.recompute": ["none", "full"]}}
KINDS = table.schema({n: table.axis_kind(v) for n, v in space_from_dict(SPACE).axes})
TYPED = [i for i, kind in enumerate(KINDS.values()) if kind != "str"]
# cells of no column's kind, or of a typed column's kind written otherwise
BAD = ["x", "1.5.2", "0x1f", " 7", "+3", "true", "TRUE", "1e", "--1", "nan()"]
DAMAGE = st.tuples(st.sampled_from(["torn", "cell", "drop", "repeat", "swap", "blank", "foreign"]),
                   st.integers(0, 10**6), st.integers(0, 10**6), st.sampled_from(BAD))
RUNS = settings(max_examples=300 if os.environ.get("HYPOTHESIS_PROFILE") == "long" else 20, deadline=None,
                derandomize=FIXED_DRAWS, database=None, suppress_health_check=list(HealthCheck))


def _finished(tmp_path_factory, suffix: str):
    """(table, file bytes, space record bytes) of the uninterrupted sweep into a `suffix` file."""
    out = tmp_path_factory.mktemp("finished") / f"full{suffix}"
    full = sweep(SPACE, workers=1, progress=False, out=out)
    return full, out.read_bytes(), out.with_name(out.name + ".llmsim.json").read_bytes()


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    return _finished(tmp_path_factory, ".csv")


@pytest.fixture(scope="module")
def finished_parquet(tmp_path_factory):
    return _finished(tmp_path_factory, ".parquet")


def is_float(cell: str) -> bool:
    try:
        float(cell)
    except ValueError:
        return False
    return True


def damaged(text: str, damages) -> str:
    header, *rows = text.splitlines(keepends=True)
    for kind, a, b, bad in damages:
        if not rows:
            break
        i, j = a % len(rows), b % len(rows)
        if kind == "torn":
            cut = rows[i][: b % len(rows[i])] + "\n"
            if len(next(csv.reader([cut]))) == len(KINDS):
                continue  # cut inside the last cell, a text one: a changed value, not a damaged line
            rows[i] = cut
        elif kind in ("cell", "foreign"):
            cells = next(csv.reader([rows[i]]))
            if len(cells) != len(KINDS):
                continue
            column = 1 if kind == "foreign" else TYPED[b % len(TYPED)]
            if kind == "cell" and list(KINDS.values())[column] == "float" and is_float(bad):
                continue  # " 7" is a float: a changed value, not a damaged one
            cells[column] = "0" * 64 if kind == "foreign" else bad
            line = io.StringIO()
            csv.writer(line, lineterminator="\n").writerow(cells)
            rows[i] = line.getvalue()
        elif kind == "drop":
            del rows[i]
        elif kind == "repeat":
            rows.insert(j, rows[i])
        elif kind == "swap":
            rows[i], rows[j] = rows[j], rows[i]
        else:
            rows.insert(i, "\n")
    return header + "".join(rows)


def check_resume(finished, suffix: str, damage) -> None:
    """`damage(out)` writes a damaged output with the finished sweep's space record beside it:
    resumed, it must give the finished table and file byte for byte, and no parts."""
    full, data, record = finished
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder) / f"o{suffix}"
        damage(out)
        out.with_name(out.name + ".llmsim.json").write_bytes(record)
        resumed = sweep(SPACE, workers=1, progress=False, out=out, resume=True, log=lambda message: None)
        pd.testing.assert_frame_equal(resumed, full, check_exact=True)
        assert out.read_bytes() == data
        assert not out.with_name(out.name + ".parts").exists()


@RUNS
@given(st.lists(DAMAGE, min_size=1, max_size=4))
def test_a_resume_of_a_damaged_csv_gives_the_uninterrupted_table_and_file(finished, damages):
    check_resume(finished, ".csv", lambda out: out.write_text(damaged(finished[1].decode(), damages)))


PARQUET_DAMAGE = st.tuples(st.sampled_from(["drop", "repeat", "swap", "foreign", "part", "torn"]),
                           st.integers(0, 10**6), st.integers(0, 10**6))


@RUNS
@given(st.lists(PARQUET_DAMAGE, min_size=1, max_size=4))
def test_a_resume_of_a_damaged_parquet_gives_the_uninterrupted_table_and_file(finished_parquet, damages):
    # rows dropped, repeated, out of order or of another point; a stray part beside OUT (an
    # interrupted run's); OUT cut short (unreadable: every row recomputed)
    full = finished_parquet[0]

    def damage(out):
        rows, parts, torn = full.copy(), [], None
        for kind, a, b in damages:
            i, j = a % len(rows), b % len(rows)
            if kind == "drop":
                rows = rows.drop(rows.index[i])
            elif kind == "repeat":
                rows = pd.concat([rows, rows.iloc[[i]]])
            elif kind == "swap":
                order = list(range(len(rows)))
                order[i], order[j] = order[j], order[i]
                rows = rows.iloc[order]
            elif kind == "foreign":
                rows.loc[rows.index[i], "point_index"] = len(full) + 1
            elif kind == "part":
                parts.append(full.iloc[[a % len(full), b % len(full)]])
            else:
                torn = b
            if not len(rows):
                break
        rows.to_parquet(out, index=False)
        if torn is not None:
            out.write_bytes(out.read_bytes()[: torn % out.stat().st_size])
        for k, part in enumerate(parts):
            folder = out.with_name(out.name + ".parts")
            folder.mkdir(exist_ok=True)
            part.to_parquet(folder / f"part-old-{k:08d}.parquet", index=False)

    check_resume(finished_parquet, ".parquet", damage)
