"""Sweeps: evaluate every point of a space, in parallel, writing rows as they finish.

`sweep(space)` returns a pandas DataFrame with one row per point (in the space's product
order, `point_index`), the point's fields as written (dotted columns), the plan as
resolved and the flattened result (simulator.table). A point whose scenario is invalid
is a row with feasible=False and the InputError's message as its reason.

Output (`out=`): `.csv` rows are appended (one write and fsync per flush; a torn last line
is cut off on resume); `.parquet` rows go to part files in `OUT.parts/` (written to a
temporary name, then renamed), merged into OUT at the end. Rows are flushed at least every
FLUSH_S seconds while results arrive (graph-engine chunks are a few points). One sweep at a
time writes an output: `OUT.lock` is held (flock) and a second sweep is refused. The
space's digest (base, axes, constraints, engine) is stored beside it in `OUT.llmsim.json`;
`resume=True` refuses a changed space, keeps the finished rows, drops (and names) damaged
ones, and evaluates the rest. Each row carries `point_id`, a hash of the base scenario, the
point's values and the engine. The final table is the kept rows as read back and this
run's rows as stored, sorted by point_index: an interrupted and resumed sweep writes the
same table as an uninterrupted one.

Execution: in-process (workers=1), local processes (a fork pool on Linux, spawn
elsewhere; default: all cores), or Dask distributed (`dask="local"` starts a LocalCluster, any other value is a
scheduler address).
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import os
import re
import shutil
import sys
import time
import uuid
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterable, Mapping

from . import fields as F
from .errors import InputError
from .plan import SIZES
from .space import Space, load_space, space_from_dict

if TYPE_CHECKING:  # pandas is imported when a sweep runs, not with the package
    import pandas as pd

FORMATS = (".csv", ".parquet")
FLUSH_S = 1.0  # rows reach the output at least this often (plus one chunk's evaluation)


def space_digest(space: Space, engine: str) -> str:
    """SHA-256 of what decides a sweep's rows: base scenario, axes in order, constraints, engine."""
    text = json.dumps({"base": space.base, "axes": [[f, list(v)] for f, v in space.axes],
                       "constraints": list(space.constraints), "engine": engine}, sort_keys=True, default=repr)
    return hashlib.sha256(text.encode()).hexdigest()


_json_text = json.JSONEncoder(sort_keys=True, default=str).encode  # json.dumps(x, sort_keys=True, default=str)


def _base_text(base: dict) -> str:
    return _json_text(base)


def point_id(base: dict | str, point: dict, engine: str) -> str:
    """A stable key of one point: hash of the base scenario (or its _base_text), the point's
    values and the engine."""
    base_text = base if isinstance(base, str) else _base_text(base)
    text = "\n".join((base_text, _json_text(point), engine))
    return hashlib.sha1(text.encode()).hexdigest()[:16]


def _merger(base: dict, names) -> Callable[[dict], dict]:
    """apply_overrides(base, ·) for points of the fields `names`, without a deep copy: only the
    mappings on the fields' paths are copied (the parsers never modify their input), the paths
    split and those mappings found once (a sweep merges every point's fields into the base).
    Where a field lies inside another, or runs through something in the base that is not a
    mapping, it is apply_overrides itself (and its error)."""
    from .scenario import apply_overrides

    split = [name.split(".") for name in names]
    parents = sorted({tuple(parts[:i]) for parts in split for i in range(1, len(parts))}, key=len)

    def at(path):
        node = base
        for part in path:
            node = node.get(part) if isinstance(node, dict) else node
        return node

    if any(name.startswith(other + ".") for name in names for other in names) or \
            not all(isinstance(at(path), (dict, type(None))) for path in parents):
        return partial(apply_overrides, base)
    copies = [(path[:-1], path[-1], path) for path in parents]
    leaves = [(tuple(parts[:-1]), parts[-1], name) for parts, name in zip(split, names)]

    def merge(point: dict) -> dict:
        nodes = {(): dict(base)}
        for up, key, path in copies:
            child = nodes[up].get(key)
            nodes[path] = nodes[up][key] = {} if child is None else dict(child)
        for parent, key, name in leaves:
            nodes[parent][key] = point[name]
        return nodes[()]
    return merge


def evaluate_chunk(items: list, base: dict, axes: dict, engine: str = "analytic",
                   vectorize: bool = True) -> pd.DataFrame:
    """The table's rows (table.columns_frame) for [(point_index, point_id, point), ...] (a
    point_id None is worked out here); runs in a worker, so that building the table's columns
    runs in parallel too. The table is built column by column: a vectorised batch's results
    are columns already."""
    from . import table
    from .evaluate import evaluate
    from .scenario import scenario_from_dict

    n = len(items)
    base_text = _base_text(base)
    columns = {"point_index": [index for index, _, _ in items],
               "point_id": [pid or point_id(base_text, point, engine) for _, pid, point in items]}
    for k, kind in axes.items():
        columns[k] = [table.axis_cell(point[k], kind) for _, _, point in items]
    plans, valid, errors, cache = [], [], [], {}
    merge = _merger(base, list(axes))
    for position, (_, _, point) in enumerate(items):
        data = merge(point)
        try:
            scenario = scenario_from_dict(data, cache)
        except InputError as exc:
            plans.append(table.raw_plan_row(data))
            errors.append((position, str(exc)))
        else:
            plans.append(table.plan_row(scenario))
            valid.append((position, scenario))
    for column in table.PLAN_COLUMNS:
        columns[column] = [row[column] for row in plans]

    def place(positions: list, results: dict) -> None:
        for key, values in results.items():
            column = columns.setdefault(key, [None] * n)
            for position, value in zip(positions, values):
                column[position] = value

    if valid and vectorize and engine == "analytic":
        from .vector import evaluate_columns

        for members, results in evaluate_columns([s for _, s in valid], by_stage="json"):
            place([valid[i][0] for i in members], table.result_columns(results))
    else:
        for position, scenario in valid:
            result = table.result_row(evaluate(scenario, engine=engine).to_dict())
            place([position], {k: [v] for k, v in result.items()})
    if errors:
        positions, messages = zip(*errors)
        place(list(positions), {"feasible": [False] * len(errors), "reason": list(messages)})
    return table.columns_frame(columns, n, table.schema(axes))


def _csv_text(rows: pd.DataFrame, header: bool = False) -> str:
    """A table's rows as a CSV output holds them."""
    return rows.to_csv(index=False, header=header, lineterminator="\n")


def evaluate_chunk_csv(items: list, **options) -> tuple:
    """evaluate_chunk's table and its rows as CSV lines: formatted in the worker, in parallel,
    not by the one process that writes the file (a cell's text does not depend on the other
    rows, so a flush's chunks joined are the lines of those chunks concatenated)."""
    rows = evaluate_chunk(items, **options)
    return rows, _csv_text(rows)


# ------------------------------------------------------------------ stores

class _Store:
    """Incremental row storage for one output path, its lock and its space record."""

    # whether append() takes the rows' text as the workers format it (evaluate_chunk_csv)
    worker_text = False

    def __init__(self, out: Path, kinds: dict, log: Callable[[str], None]):
        self.out, self.kinds, self.log = out, kinds, log
        self._lock = None

    @property
    def meta(self) -> Path:
        return self.out.with_name(self.out.name + ".llmsim.json")

    def lock(self) -> None:
        """Hold OUT.lock exclusively until release(); refused when another sweep holds it."""
        self.out.parent.mkdir(parents=True, exist_ok=True)
        fh = open(self.out.with_name(self.out.name + ".lock"), "a+")
        try:
            import fcntl

            fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except ImportError:  # no flock (Windows): no lock
            pass
        except OSError:
            fh.close()
            raise InputError("-o", str(self.out), "another sweep is writing this output (its lock "
                             f"{self.out.name}.lock is held); wait for it or choose another file") from None
        self._lock = fh

    def release(self) -> None:
        if self._lock is not None:
            self._lock.close()
            self._lock = None

    def has_rows(self) -> bool:
        return self.out.exists()

    def check_space(self, digest: str) -> None:
        """Resume: the stored rows must come from this space."""
        if not self.has_rows():
            return
        try:
            stored = json.loads(self.meta.read_text(encoding="utf-8")).get("space_sha256")
        except (OSError, ValueError, AttributeError):
            stored = None
        if not isinstance(stored, str):  # absent, or not as write_meta writes it
            raise InputError("--resume", str(self.out), f"no space record ({self.meta.name}) beside it, so its rows "
                             "cannot be verified; rerun without --resume")
        if stored != digest:
            raise InputError("--resume", str(self.out), "the space changed since these rows were written (digest "
                             f"{stored[:12]} != {digest[:12]}); rerun without --resume or write to another file")

    def write_meta(self, digest: str, points: int, engine: str) -> None:
        tmp = self.meta.with_name(self.meta.name + ".tmp")
        tmp.write_text(json.dumps({"space_sha256": digest, "points": points, "engine": engine}) + "\n",
                       encoding="utf-8")
        os.replace(tmp, self.meta)

    def empty(self) -> pd.DataFrame:
        from . import table
        return table.frame([], self.kinds)

    def keep_valid(self, df, index_of: dict, where: str):
        """The rows of `df` that belong to this space and are complete (a point's last row where it
        repeats); the others are named."""
        expected = df["point_id"].map(index_of)  # NaN: not a point of this space
        bad = df["feasible"].isna() | expected.isna() | \
            (df["point_index"].astype("Float64") != expected.astype("Float64")).fillna(True)
        if bad.any():
            self.log(f"{where}: {int(bad.sum())} row(s) do not match this space or lack fields; they are "
                     "dropped and recomputed")
        return df[~bad].drop_duplicates("point_id", keep="last")


_CELL = {"int": re.compile(r"^-?[0-9]+$"), "bool": re.compile(r"^(True|False)$")}
# a float as pandas writes it (repr; NaN as an empty cell): a subset of what float() reads
_WRITTEN_FLOAT = r"^-?(?:[0-9]+(?:\.[0-9]*)?(?:[eE][-+]?[0-9]+)?|inf)$"


class _CsvStore(_Store):
    """Rows appended to one CSV file. `_on_disk` holds the point_index of each row in the file,
    in file order, where this store knows them (None where it does not): finish() then puts
    the file's own lines in point order instead of formatting every cell again."""

    _on_disk: list | None = None
    worker_text = True

    def load(self, index_of: dict) -> pd.DataFrame | None:
        """The stored rows that are intact; damaged lines are named and dropped."""
        from . import table
        if not self.out.exists():
            return None
        raw = self.out.read_bytes()
        if raw and not raw.endswith(b"\n"):  # a write cut short by a kill: drop the torn line
            raw = raw[: raw.rfind(b"\n") + 1]
            with open(self.out, "wb") as fh:
                fh.write(raw)
        df = self._typed(raw)
        intact = df is not None
        if df is None:
            df = self._line_by_line(raw)
        if df is None or not len(df):
            return None
        df = table.normalize(df, self.kinds)
        kept = self.keep_valid(df, index_of, str(self.out))
        if intact and len(kept) == len(df):
            self._on_disk = [kept["point_index"].to_numpy(dtype="int64")]
        return kept

    def _typed(self, raw: bytes) -> pd.DataFrame | None:
        """The rows of a file whose every line is complete and every cell of its column's kind,
        parsed by pyarrow's CSV reader; None where any is not (or the header differs), for the
        line-by-line reading to name the damaged lines."""
        import io

        import pandas as pd
        import pyarrow as pa
        import pyarrow.compute as pc
        import pyarrow.csv as pacsv

        # numbers are read as text and held to the patterns the table is written in before
        # pyarrow converts them: its own parsers also take " 7" and "0x7" as integers and
        # "nan(1)" as a float, which the line-by-line check refuses
        types = {"int": pa.string(), "float": pa.string(), "bool": pa.bool_(), "str": pa.string()}
        numbers = {"int": (_CELL["int"].pattern, pa.int64()), "float": (_WRITTEN_FLOAT, pa.float64())}
        if raw.startswith(b"\n") or b"\n\n" in raw:  # a blank line (pyarrow would skip it)
            return None
        try:
            read = pacsv.read_csv(
                io.BytesIO(raw), parse_options=pacsv.ParseOptions(newlines_in_values=True),
                convert_options=pacsv.ConvertOptions(
                    column_types={col: types[kind] for col, kind in self.kinds.items()}, null_values=[""],
                    strings_can_be_null=True, true_values=["True"], false_values=["False"]))
            if read.column_names != list(self.kinds):
                return None
            for i, (col, kind) in enumerate(self.kinds.items()):
                if kind in numbers:
                    pattern, dtype = numbers[kind]
                    cells = read.column(i)
                    if pc.all(pc.match_substring_regex(cells, pattern)).as_py() is False:
                        return None  # (None where every cell is empty)
                    read = read.set_column(i, col, pc.cast(cells, dtype))
        except (pa.ArrowException, ValueError):  # a short or long line, a cell not of its kind, not UTF-8
            return None
        return read.to_pandas(types_mapper={pa.int64(): pd.Int64Dtype(), pa.bool_(): pd.BooleanDtype()}.get)

    def _line_by_line(self, raw: bytes) -> pd.DataFrame | None:
        """The intact lines of a damaged file, each checked cell by cell; the others are named."""
        import csv
        import io

        import pandas as pd
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            self.log(f"{self.out}: not UTF-8 text; all its rows are recomputed")
            return None
        lines = list(csv.reader(io.StringIO(text)))
        if not lines:
            return None
        header = list(self.kinds)
        if lines[0] != header:
            self.log(f"{self.out}: its columns are not this space's; all its rows are recomputed")
            return None
        good, bad = [], []
        for number, cells in enumerate(lines[1:], start=2):
            if len(cells) != len(header) or not self._cells_ok(cells):
                bad.append(number)
            else:
                good.append(cells)
        if bad:
            shown = ", ".join(map(str, bad[:5])) + (", ..." if len(bad) > 5 else "")
            self.log(f"{self.out}: {len(bad)} damaged line(s) dropped (line {shown}); they are recomputed, "
                     f"{len(good)} row(s) kept")
        if not good:
            return None
        return pd.DataFrame(good, columns=header).replace("", None)

    def _cells_ok(self, cells: list[str]) -> bool:
        for cell, kind in zip(cells, self.kinds.values()):
            if cell == "" or kind == "str":
                continue
            if kind == "float":
                try:
                    float(cell)
                except ValueError:
                    return False
            elif not _CELL[kind].match(cell):
                return False
        return True

    def start(self, resume: bool, kept: pd.DataFrame | None) -> None:
        """Fresh: truncate to a header. Resume: rewrite (atomically) with the kept rows, so that
        damaged, foreign or repeated lines are gone before new rows are appended; a file whose
        every line was kept is left as it is."""
        if resume and kept is not None and self._on_disk is not None:
            return
        self._rewrite(kept if kept is not None else self.empty())

    def append(self, rows: pd.DataFrame, index: int, text: str | None = None) -> None:
        """`rows` at the end of the file, `text` their lines as the workers wrote them (_csv_text)."""
        with open(self.out, "a", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        if self._on_disk is not None:
            self._on_disk.append(rows["point_index"].to_numpy(dtype="int64"))

    def finish(self, df: pd.DataFrame) -> None:
        """The final table (sorted by point_index, no repeats) in place of the file: where the file
        holds exactly its rows, one line each, those lines in point order (left as they are when
        already in it); else every row formatted again."""
        import numpy as np

        if self._on_disk is None:
            return self._rewrite(df)
        index = np.concatenate(self._on_disk)
        order = np.argsort(index, kind="stable")
        if not np.array_equal(index[order], df["point_index"].to_numpy(dtype="int64")):
            return self._rewrite(df)
        if (order == np.arange(len(order))).all():
            return
        lines = self.out.read_bytes().split(b"\n")  # the header, the rows, and b"" after the last
        if len(lines) != len(index) + 2:  # a text cell holds a line break: the lines are not the rows
            return self._rewrite(df)
        self._replace(itertools.chain([lines[0] + b"\n"], (lines[i + 1] + b"\n" for i in order)))

    def _rewrite(self, df: pd.DataFrame) -> None:
        """`df` in place of the file."""
        self._replace([_csv_text(df, header=True).encode("utf-8")])
        self._on_disk = [df["point_index"].to_numpy(dtype="int64")]

    def _replace(self, chunks: Iterable[bytes]) -> None:
        """The file's content replaced by `chunks`, atomically."""
        tmp = self.out.with_name(self.out.name + ".tmp")
        with open(tmp, "wb") as fh:
            fh.writelines(chunks)
        os.replace(tmp, self.out)


class _ParquetStore(_Store):
    """Rows written as Parquet parts beside OUT, gathered into OUT in point order at the end.
    `_whole`: OUT was read back alone, with this space's columns, and every row was kept (a
    finished output resumed): it then stays in place, not copied into a part, and is
    rewritten at the end only where rows were added or are out of order."""

    _whole = False
    _in_order = False
    _appended = 0
    _columns_of_out = None

    @property
    def parts(self) -> Path:
        return self.out.with_name(self.out.name + ".parts")

    def has_rows(self) -> bool:
        return self.out.exists() or (self.parts.is_dir() and any(self.parts.glob("part-*.parquet")))

    def _read(self, path: Path):
        import pandas as pd

        from . import table
        try:
            df = pd.read_parquet(path)
            if path == self.out:
                self._columns_of_out = list(df.columns)
            return table.normalize(df, self.kinds)
        except Exception as exc:  # pyarrow raises many kinds for damaged files
            self.log(f"{path}: unreadable Parquet ({type(exc).__name__}); its rows are recomputed")
            return None

    def load(self, index_of: dict) -> pd.DataFrame | None:
        import pandas as pd

        from . import table
        paths = ([self.out] if self.out.exists() else []) + (
            sorted(self.parts.glob("part-*.parquet")) if self.parts.is_dir() else [])
        frames = [f for f in (self._read(p) for p in paths) if f is not None and len(f)]
        if not frames:
            return None
        df = table.normalize(pd.concat(frames, ignore_index=True), self.kinds) if len(frames) > 1 else frames[0]
        kept = self.keep_valid(df, index_of, str(self.out))
        self._whole = paths == [self.out] and len(kept) == len(df) and self._columns_of_out == list(self.kinds)
        self._in_order = bool(kept["point_index"].is_monotonic_increasing)
        return kept

    def start(self, resume: bool, kept: pd.DataFrame | None) -> None:
        """Fresh: remove old output and parts. Resume: the kept rows become one part, written
        before the old parts and OUT (damaged ones included) are removed; an OUT kept whole
        stays as it is."""
        self.parts.mkdir(exist_ok=True)
        self.run = uuid.uuid4().hex[:8]
        if kept is not None and len(kept) and not self._whole:
            self._write_part(kept, f"part-{self.run}-kept")
        for old in self.parts.iterdir():
            if not old.name.startswith(f"part-{self.run}-"):
                old.unlink()
        if self.out.exists() and not self._whole:
            self.out.unlink()

    def append(self, rows: pd.DataFrame, index: int, text: str | None = None) -> None:
        self._write_part(rows, f"part-{self.run}-{index:08d}")
        self._appended += 1

    def _write_part(self, df: pd.DataFrame, stem: str) -> None:
        tmp = self.parts / f".{stem}.tmp"
        df.to_parquet(tmp, index=False)
        os.replace(tmp, self.parts / f"{stem}.parquet")

    def finish(self, df: pd.DataFrame) -> None:
        if not (self._whole and not self._appended and self._in_order):
            tmp = self.out.with_name(self.out.name + ".tmp")
            df.to_parquet(tmp, index=False)
            os.replace(tmp, self.out)
        shutil.rmtree(self.parts, ignore_errors=True)


def _store(out, kinds, log) -> _Store:
    out = Path(out)
    if out.suffix not in FORMATS:
        raise InputError("-o", str(out), "expected a .csv or .parquet file name")
    if out.is_dir():
        raise InputError("-o", str(out), "expected a file name, got a directory")
    return (_CsvStore if out.suffix == ".csv" else _ParquetStore)(out, kinds, log)


# ------------------------------------------------------------------ execution

_SIZE_FIELDS = {f"plan.{k}" for k in SIZES}


def _group_chunks(items: list, size: int) -> list[list]:
    """Chunks of at most `size` points in which the points that differ only in plan sizes are
    adjacent, and each such run lies whole in one chunk where it fits: the vectorised engine
    then evaluates a run as one batch. A run longer than `size` is cut into equal pieces.
    (The table is sorted by point_index.)"""
    runs: dict = {}  # the runs by their other fields (each value's repr), in the order of the items
    for item in items:
        runs.setdefault(tuple(repr(v) for k, v in item[2].items() if k not in _SIZE_FIELDS), []).append(item)
    chunks, current = [], []
    for key in sorted(runs):
        run = sorted(runs[key], key=lambda item: item[0])
        if len(current) + len(run) > size and current:
            chunks.append(current)
            current = []
        if len(run) > size:
            pieces = math.ceil(len(run) / size)
            step = math.ceil(len(run) / pieces)
            chunks += [run[i:i + step] for i in range(0, len(run), step)]
        else:
            current += run
    return chunks + ([current] if current else [])


class _LocalRunner:
    """Chunks evaluated in this process (workers=1) or in a process pool, results as they finish.

    The pool forks on Linux (no re-import: it starts in milliseconds) and spawns elsewhere; it is created here, before the progress bar starts its thread."""

    def __init__(self, fn: Callable, chunks: list, workers: int):
        self.fn, self.chunks, self.pool = fn, chunks, None
        if workers > 1 and len(chunks) > 1:
            import multiprocessing as mp

            method = "fork" if sys.platform.startswith("linux") else "spawn"  # fork is unsafe on macOS
            self.pool = mp.get_context(method).Pool(min(workers, len(chunks)))

    def __iter__(self):
        if self.pool is None:
            return (self.fn(c) for c in self.chunks)
        return self.pool.imap_unordered(self.fn, self.chunks)

    def close(self) -> None:
        if self.pool is not None:
            self.pool.terminate()
            self.pool.join()
            self.pool = None


def _run_dask(fn: Callable, chunks: list, address: str, workers: int | None) -> Iterable[list]:
    from dask.distributed import Client, LocalCluster, as_completed

    cluster = None
    if address == "local":
        cluster = LocalCluster(n_workers=workers or os.cpu_count() or 1, threads_per_worker=1,
                               processes=True, dashboard_address=None)
        client = Client(cluster)
    else:
        try:
            client = Client(address, timeout="10s")
        except (OSError, TimeoutError, ValueError, TypeError) as exc:
            raise InputError("--dask", address, f"cannot reach a Dask scheduler there ({type(exc).__name__}); "
                             "give its address (tcp://host:8786) or `local`") from None
    try:
        futures = client.map(fn, chunks, pure=False)
        for fut in as_completed(futures):
            yield fut.result()
    finally:
        client.close()
        if cluster is not None:
            cluster.close()


def _chunk_size(engine: str, vectorize: bool, todo: int, workers: int) -> int:
    """Points per chunk: a chunk takes well under FLUSH_S (graph: tens of ms a point;
    analytic one by one: 1-3 ms; vectorised: ~10 us), and there are at least two per worker."""
    cap = 2 if engine == "graph" else (1024 if vectorize else 64)
    return max(1, min(cap, math.ceil(todo / (2 * workers)) if todo else 1))


def _argument(value, name: str, minimum: int = 1, maximum: int = 10**6):
    """An optional integer argument of sweep() (numpy integers accepted)."""
    if value is None:
        return None
    return F.integer({name: value}, name, "", minimum=minimum, maximum=maximum)


def sweep(space: Space | Mapping | str | Path, *, workers: int | None = None, dask: str | None = None,
          out: str | Path | None = None, resume: bool = False, engine: str = "analytic",
          vectorize: bool = True, chunk_size: int | None = None, progress: bool = True,
          on_chunk: Callable[[int, int], None] | None = None,
          log: Callable[[str], None] | None = None) -> pd.DataFrame:
    """Evaluate every point of `space`; see the module docstring.

    space: a Space, a space mapping (as in a space file; base_file relative to the current
    folder), or the path or shipped name of a space file.
    workers: local processes (default: os.cpu_count(); 1 runs in this process).
    dask: "local" or a scheduler address; runs the chunks on Dask distributed instead.
    out: a .csv or .parquet path written incrementally; resume: keep its finished rows.
    on_chunk(done, total): called after each chunk is stored (tests use it to interrupt).
    log(message): damaged rows dropped on resume (default: printed to stderr).
    Bad arguments raise InputError.
    """
    if engine not in ("analytic", "graph"):
        raise InputError("--engine", engine, "expected analytic or graph")
    workers = _argument(workers, "workers", maximum=4096)
    chunk_size = _argument(chunk_size, "chunk_size", maximum=10**7)
    for name, flag in (("resume", resume), ("vectorize", vectorize), ("progress", progress)):
        F.boolean({name: flag}, name, "")
    if dask is not None and not isinstance(dask, str):
        raise InputError("dask", dask, "expected `local` or a scheduler address")
    if out is not None and not isinstance(out, (str, Path)):
        raise InputError("out", out, "expected a .csv or .parquet path")
    if resume and out is None:
        raise InputError("resume", resume, "resume needs an output file (out=)")
    import pandas as pd

    from . import table

    log = log or (lambda message: print(f"llmsim: warning: {message}", file=sys.stderr))
    if isinstance(space, Mapping):
        space = space_from_dict(space)
    elif isinstance(space, (str, Path)):
        space = load_space(space)
    elif not isinstance(space, Space):
        raise InputError("space", type(space).__name__, "expected a Space, a space mapping or a space file")
    points = space.points()
    axes = {name: table.axis_kind(values) for name, values in space.axes}
    kinds = table.schema(axes)
    base_text = _base_text(space.base)
    # a point's id is worked out where the point is evaluated, in parallel (None here), unless
    # the stored rows must be matched to the points first
    items = [(i, point_id(base_text, p, engine) if resume else None, p) for i, p in enumerate(points)]

    store = _store(out, kinds, log) if out is not None else None
    if store is None:
        return _in_point_order(_run(space, items, axes, kinds, None, workers, dask, engine, vectorize, chunk_size,
                                    progress, on_chunk), kinds)
    store.lock()
    try:
        digest = space_digest(space, engine)
        kept = None
        if resume:
            store.check_space(digest)
            kept = store.load({pid: i for i, pid, _ in items})
        store.write_meta(digest, len(items), engine)
        store.start(resume, kept)
        done = set(kept["point_id"]) if kept is not None else set()
        todo = [it for it in items if it[1] not in done]
        new = _run(space, todo, axes, kinds, store, workers, dask, engine, vectorize, chunk_size, progress,
                   on_chunk, total=len(items))
        # the kept rows as read back (one per point: keep_valid) and this run's rows as stored,
        # of the other points: the table a reread gives
        if kept is not None and not len(new) and kept["point_index"].is_monotonic_increasing:
            frame = kept.reset_index(drop=True)  # a finished output: as read back (normalized), in order
        else:
            frame = _in_point_order(pd.concat([f for f in (kept, new) if f is not None], ignore_index=True), kinds)
        store.finish(frame)
        return frame
    finally:
        store.release()


def _run(space, todo, axes, kinds, store, workers, dask, engine, vectorize, chunk_size, progress, on_chunk,
         total=None):
    """Evaluate `todo` in chunks and return their rows as one table (in the order chunks
    finished); with a `store`, rows also go to it as they arrive (flushed at least every FLUSH_S while results
    arrive, and before each on_chunk call)."""
    import pandas as pd
    from tqdm import tqdm

    from . import table

    workers = workers or os.cpu_count() or 1
    total = len(todo) if total is None else total
    size = chunk_size or _chunk_size(engine, vectorize, len(todo), workers)
    chunks = _group_chunks(todo, size)
    as_text = store is not None and store.worker_text
    fn = partial(evaluate_chunk_csv if as_text else evaluate_chunk, base=space.base, axes=axes, engine=engine,
                 vectorize=vectorize)
    runner = _run_dask(fn, chunks, dask, workers) if dask else _LocalRunner(fn, chunks, workers)
    frames: list[pd.DataFrame] = []
    pending: list[tuple] = []  # (rows, their CSV lines or None)
    flushed_at, parts = time.monotonic(), 0

    def flush():
        nonlocal flushed_at, parts
        if pending:
            rows = pd.concat([chunk for chunk, _ in pending], ignore_index=True)
            store.append(rows, parts, "".join(text for _, text in pending) if as_text else None)
            parts += 1
            pending.clear()
        flushed_at = time.monotonic()

    bar = tqdm(total=total, initial=total - len(todo), file=sys.stderr, disable=not progress, unit="pt",
               desc=space.name or "sweep")
    try:
        for n, result in enumerate(runner):
            chunk, text = result if as_text else (result, None)
            frames.append(chunk)
            if store is not None:
                pending.append((chunk, text))
            if store is not None and (on_chunk is not None or time.monotonic() - flushed_at >= FLUSH_S
                                      or sum(len(c) for c, _ in pending) >= 8192):
                flush()
            bar.update(len(chunk))
            if on_chunk is not None:
                on_chunk(n + 1, len(chunks))
        if store is not None:
            flush()
    finally:
        bar.close()
        if hasattr(runner, "close"):
            runner.close()
    return pd.concat(frames, ignore_index=True) if frames else table.frame([], kinds)


def _in_point_order(frame: pd.DataFrame, kinds: dict) -> pd.DataFrame:
    """The table sorted by point_index, in the schema's dtypes."""
    from . import table
    return table.normalize(frame.sort_values("point_index", kind="stable").reset_index(drop=True), kinds)
