"""Sweeps: evaluate every point of a space, in parallel, writing rows as they finish.

`sweep(space)` returns a pandas DataFrame with one row per point (in the space's product
order, `point_index`), the point's fields as written (dotted columns), the plan as
resolved and the flattened result (simulator.table). A point whose scenario is invalid
is a row with feasible=False and the InputError's message as its reason.

Output (`out=`): `.csv` rows are appended chunk by chunk (one write and fsync per chunk;
a torn last line is cut off on resume); `.parquet` chunks go to part files in
`OUT.parts/` (written to a temporary name, then renamed), merged into OUT at the end.
Each row carries `point_id`, a hash of the base scenario, the point's values and the
engine, so `resume=True` skips finished points and ignores rows of another space. The
final table is always rebuilt from the stored rows, sorted by point_index: an
interrupted and resumed sweep writes the same table as an uninterrupted one.

Execution: in-process (workers=1), local processes (a fork pool on Linux, spawn
elsewhere; default: all cores), or Dask distributed (`dask="local"` starts a LocalCluster, any other value is a
scheduler address).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
import sys
import uuid
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterable

from .errors import InputError
from .space import Space, load_space

if TYPE_CHECKING:  # pandas is imported when a sweep runs, not with the package
    import pandas as pd

FORMATS = (".csv", ".parquet")


def _base_text(base: dict) -> str:
    return json.dumps(base, sort_keys=True, default=str)


def point_id(base: dict | str, point: dict, engine: str) -> str:
    """A stable key of one point: hash of the base scenario (or its _base_text), the point's
    values and the engine."""
    base_text = base if isinstance(base, str) else _base_text(base)
    text = "\n".join((base_text, json.dumps(point, sort_keys=True, default=str), engine))
    return hashlib.sha1(text.encode()).hexdigest()[:16]


def _merge(base: dict, point: dict) -> dict:
    """apply_overrides(base, point) without a deep copy: only the mappings on the overridden
    paths are copied (the parsers never modify their input). Falls back to apply_overrides,
    and its error, when a path runs through something that is not a mapping."""
    from .scenario import apply_overrides

    out = dict(base)
    copied: set = set()
    for dotted, value in point.items():
        parts = dotted.split(".")
        node = out
        for i, part in enumerate(parts[:-1]):
            path = tuple(parts[: i + 1])
            child = node.get(part)
            if child is None:
                child = {}
            elif not isinstance(child, dict):
                return apply_overrides(base, point)
            elif path not in copied:
                child = dict(child)
            copied.add(path)
            node[part] = child
            node = child
        node[parts[-1]] = value
    return out


def evaluate_chunk(items: list, base: dict, axes: dict, engine: str = "analytic",
                   vectorize: bool = True) -> list[dict]:
    """Rows for [(point_index, point_id, point), ...]; runs in a worker."""
    from . import table
    from .evaluate import evaluate
    from .scenario import scenario_from_dict

    rows, valid, cache = [], [], {}
    for index, pid, point in items:
        row = {"point_index": index, "point_id": pid}
        row.update({k: table.axis_cell(point[k], kind) for k, kind in axes.items()})
        data = _merge(base, point)
        try:
            scenario = scenario_from_dict(data, cache)
        except InputError as exc:
            row.update(table.raw_plan_row(data))
            row.update(table.error_row(str(exc)))
        else:
            row.update(table.plan_row(scenario))
            valid.append((row, scenario))
        rows.append(row)
    if valid and vectorize and engine == "analytic":
        from .vector import evaluate_many

        for (row, _), d in zip(valid, evaluate_many([s for _, s in valid])):
            row.update(table.result_row(d))
    else:
        for row, scenario in valid:
            row.update(table.result_row(evaluate(scenario, engine=engine).to_dict()))
    return rows


# ------------------------------------------------------------------ stores

class _Store:
    """Incremental row storage for one output path."""

    def __init__(self, out: Path, kinds: dict):
        self.out, self.kinds = out, kinds

    def frame(self, rows: list[dict]) -> pd.DataFrame:
        import pandas as pd

        from . import table
        return table.normalize(pd.DataFrame(rows), self.kinds)


class _CsvStore(_Store):
    def load(self) -> pd.DataFrame | None:
        import pandas as pd

        from . import table
        if not self.out.exists():
            return None
        raw = self.out.read_bytes()
        if raw and not raw.endswith(b"\n"):  # a write cut short by a kill: drop the torn line
            raw = raw[: raw.rfind(b"\n") + 1]
            with open(self.out, "wb") as fh:
                fh.write(raw)
        if not raw.strip():
            return None
        df = pd.read_csv(self.out, dtype=str, keep_default_na=False)
        df = df.replace("", None)
        return table.normalize(df, self.kinds)

    def start(self, resume: bool, kept: pd.DataFrame | None) -> None:
        """Fresh: truncate to a header. Resume: append to the file as it is, unless its
        columns are not this space's, in which case it is rewritten (atomically) with the kept rows."""
        self.out.parent.mkdir(parents=True, exist_ok=True)
        header = ",".join(self.kinds) + "\n"
        if resume and self.out.exists():
            with open(self.out, encoding="utf-8") as fh:
                if fh.readline() == header:
                    return
        self.finish(kept if kept is not None else self.frame([]))

    def append(self, rows: list[dict], index: int) -> None:
        self._write(self.frame(rows), mode="a", header=False)

    def _write(self, df: pd.DataFrame, mode: str, header: bool = True) -> None:
        text = df.to_csv(index=False, header=header, lineterminator="\n")
        with open(self.out, mode, encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())

    def finish(self, df: pd.DataFrame) -> None:
        tmp = self.out.with_name(self.out.name + ".tmp")
        tmp.write_text(df.to_csv(index=False, lineterminator="\n"), encoding="utf-8")
        os.replace(tmp, self.out)


class _ParquetStore(_Store):
    @property
    def parts(self) -> Path:
        return self.out.with_name(self.out.name + ".parts")

    def load(self) -> pd.DataFrame | None:
        import pandas as pd

        from . import table
        frames = []
        if self.out.exists():
            frames.append(pd.read_parquet(self.out))
        if self.parts.is_dir():
            frames += [pd.read_parquet(p) for p in sorted(self.parts.glob("part-*.parquet"))]
        frames = [table.normalize(f, self.kinds) for f in frames if len(f)]
        return table.normalize(pd.concat(frames, ignore_index=True), self.kinds) if frames else None

    def start(self, resume: bool, kept: pd.DataFrame | None) -> None:
        """Fresh: remove old output and parts. Resume: keep both (they are merged, deduplicated)."""
        self.out.parent.mkdir(parents=True, exist_ok=True)
        if not resume:
            shutil.rmtree(self.parts, ignore_errors=True)
            if self.out.exists():
                self.out.unlink()
        self.parts.mkdir(exist_ok=True)
        self.run = uuid.uuid4().hex[:8]

    def append(self, rows: list[dict], index: int) -> None:
        self._write_part(self.frame(rows), f"part-{self.run}-{index:08d}")

    def _write_part(self, df: pd.DataFrame, stem: str) -> None:
        tmp = self.parts / f".{stem}.tmp"
        df.to_parquet(tmp, index=False)
        os.replace(tmp, self.parts / f"{stem}.parquet")

    def finish(self, df: pd.DataFrame) -> None:
        tmp = self.out.with_name(self.out.name + ".tmp")
        df.to_parquet(tmp, index=False)
        os.replace(tmp, self.out)
        shutil.rmtree(self.parts, ignore_errors=True)


def _store(out, kinds) -> _Store:
    out = Path(out)
    if out.suffix not in FORMATS:
        raise InputError("-o", str(out), "expected a .csv or .parquet file name")
    return (_CsvStore if out.suffix == ".csv" else _ParquetStore)(out, kinds)


# ------------------------------------------------------------------ execution

_SIZE_FIELDS = {"plan.tp", "plan.pp", "plan.dp", "plan.cp", "plan.vpp", "plan.micro_batch", "plan.global_batch"}


def _by_group(items: list) -> list:
    """Points ordered so that those differing only in plan sizes are adjacent: a chunk then
    holds large groups for the vectorised engine. (The table is sorted by point_index.)"""
    def key(item):
        _, _, point = item
        return [repr(v) for k, v in point.items() if k not in _SIZE_FIELDS]
    return sorted(items, key=lambda it: (key(it), it[0]))


def _chunks(items: list, size: int) -> list[list]:
    return [items[i:i + size] for i in range(0, len(items), size)]


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
        client = Client(address)
    try:
        futures = client.map(fn, chunks, pure=False)
        for fut in as_completed(futures):
            yield fut.result()
    finally:
        client.close()
        if cluster is not None:
            cluster.close()


def sweep(space: Space | str | Path, *, workers: int | None = None, dask: str | None = None,
          out: str | Path | None = None, resume: bool = False, engine: str = "analytic",
          vectorize: bool = True, chunk_size: int | None = None, progress: bool = True,
          on_chunk: Callable[[int, int], None] | None = None) -> pd.DataFrame:
    """Evaluate every point of `space`; see the module docstring.

    workers: local processes (default: os.cpu_count(); 1 runs in this process).
    dask: "local" or a scheduler address; runs the chunks on Dask distributed instead.
    out: a .csv or .parquet path written incrementally; resume: keep its finished rows.
    on_chunk(done, total): called after each chunk is stored (tests use it to interrupt).
    """
    if engine not in ("analytic", "graph"):
        raise InputError("--engine", engine, "expected analytic or graph")
    if engine == "graph":
        from .search import graph_engine_available

        if not graph_engine_available():
            raise InputError("--engine", engine, "the graph engine is not installed in this build; use analytic")
    import pandas as pd

    from . import table

    if not isinstance(space, Space):
        space = load_space(space)
    points = space.points()
    axes = {name: table.axis_kind(values) for name, values in space.axes}
    kinds = table.schema(axes)
    base_text = _base_text(space.base)
    items = [(i, point_id(base_text, p, engine), p) for i, p in enumerate(points)]
    wanted = {pid for _, pid, _ in items}

    store = _store(out, kinds) if out is not None else None
    kept = None
    if store is not None:
        if resume:
            kept = store.load()
            if kept is not None:
                kept = kept[kept["point_id"].isin(wanted)].drop_duplicates("point_id", keep="last")
        store.start(resume, kept)
    done = set(kept["point_id"]) if kept is not None else set()
    todo = [it for it in items if it[1] not in done]

    workers = workers or os.cpu_count() or 1
    size = chunk_size or max(1, min(1024, math.ceil(len(todo) / (2 * workers)) if todo else 1))
    chunks = _chunks(_by_group(todo), size)
    fn = partial(evaluate_chunk, base=space.base, axes=axes, engine=engine, vectorize=vectorize)
    runner = _run_dask(fn, chunks, dask, workers) if dask else _LocalRunner(fn, chunks, workers)

    from tqdm import tqdm

    rows: list[dict] = []
    bar = tqdm(total=len(items), initial=len(items) - len(todo), file=sys.stderr, disable=not progress,
               unit="pt", desc=space.name or "sweep")
    try:
        for n, chunk_rows in enumerate(runner):
            if store is not None:
                store.append(chunk_rows, n)
            else:
                rows.extend(chunk_rows)
            bar.update(len(chunk_rows))
            if on_chunk is not None:
                on_chunk(n + 1, len(chunks))
    finally:
        bar.close()
        if hasattr(runner, "close"):
            runner.close()

    if store is None:
        frame = table.normalize(pd.DataFrame(rows), kinds) if rows else table.normalize(pd.DataFrame(), kinds)
    else:
        frame = store.load()
        if frame is None:
            frame = table.normalize(pd.DataFrame(), kinds)
        frame = frame[frame["point_id"].isin(wanted)].drop_duplicates("point_id", keep="last")
    frame = frame.sort_values("point_index", kind="stable").reset_index(drop=True)
    frame = table.normalize(frame, kinds)
    if store is not None:
        store.finish(frame)
    return frame
