"""Comparison plots (matplotlib): each function draws on an Axes and returns its Figure.

Inputs are the tables of simulator.sweep / simulator.search (one row per plan, columns
of simulator.table), a `Result.to_dict()` for memory, a timeline table (stage, stream,
name, start_s, end_s) for the Gantt chart, and a table with `measured` and `predicted`
columns (and `metric`) for the validation scatter. Every plot names the model, the
cluster and the batch in its title (as far as its input says them), puts units on its
axes and keeps its legend outside the data. `KINDS` maps the `llmsim plot --kind` names
to functions; `plot_file` reads a results file and writes a PNG.

The backend is left to matplotlib (inline in notebooks, Agg without a display).
"""

from __future__ import annotations

import json
import math
import warnings
from pathlib import Path
from typing import Mapping

import matplotlib
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib import ticker  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from . import fields as F  # noqa: E402
from .errors import InputError  # noqa: E402
from .result import BREAKDOWN_KEYS, MEMORY_KEYS  # noqa: E402

INFEASIBLE_MARK = "×"


# Axis labels with units for the table's columns.
LABELS = {
    "step_time_s": "step time (s)", "tokens_per_s": "throughput (tokens/s)",
    "tokens_per_s_per_device": "throughput per device (tokens/s)", "mfu": "MFU (fraction of peak)",
    "hfu": "HFU (fraction of peak)", "peak_memory_gib": "peak memory per device (GiB)",
    "peak_reserved_gib": "peak reserved per device (GiB)",
    "usd_per_million_tokens": "cost ($ per million tokens)", "cost_usd_per_step": "cost ($ per step)",
    "time_to_train_days": "time to train (days)", "cost_to_train_usd": "cost to train ($)",
    "s_per_million_tokens": "time per million tokens (s)",
    "model_tflops_per_device": "model TFLOP/s per device", "hardware_tflops_per_device": "hardware TFLOP/s per device",
}


def label(column: str) -> str:
    return LABELS.get(column, column.replace("_", " "))


def _axes(ax, size=(8, 4.5)):
    if ax is None:
        fig, ax = plt.subplots(figsize=size)
    return ax.figure, ax


def _outside_legend(ax, **kw) -> None:
    """The legend right of the axes, never over the data."""
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0, fontsize=8, **kw)


def _one(df: pd.DataFrame, column: str):
    """The one value of `column` (missing ones aside), "N columns" when there are several."""
    if column not in df.columns:
        return None
    values = [v for v in pd.unique(df[column].dropna()) if v != ""]
    if len(values) == 1:
        v = values[0]
        return int(v) if isinstance(v, (int, np.integer)) or (isinstance(v, float) and v.is_integer()) else v
    return f"{len(values)} values of {column}" if values else None


def context(df) -> str:
    """"model, cluster, batch" of a results table or row (as far as it holds one value of each)."""
    if isinstance(df, Mapping):
        df = pd.DataFrame([df])
    model, nodes, node = _one(df, "model"), _one(df, "nodes"), _one(df, "node")
    devices, accelerator = _one(df, "devices"), _one(df, "accelerator")
    single = all(isinstance(v, (int, np.integer)) for v in (nodes,)) and node is not None and "values" not in str(node)
    if single:
        cluster = f"{nodes} x {node}"
        if devices is not None and accelerator is not None and "values" not in str(accelerator):
            cluster += f" ({devices} x {accelerator})"
    elif "nodes" in df.columns and df["nodes"].notna().any():
        kinds = df["node"].dropna().nunique() if "node" in df.columns else 1
        sizes = df["nodes"].dropna()
        cluster = (f"{kinds} node types, " if kinds > 1 else f"{node}, ") + (
            f"{int(sizes.min())}-{int(sizes.max())} nodes" if sizes.nunique() > 1 else f"{int(sizes.iloc[0])} nodes")
    else:
        cluster = None
    batch = _one(df, "global_batch")
    if isinstance(batch, str) and "values" in batch:  # a sweep over batch sizes: their range
        sizes = pd.to_numeric(df["global_batch"], errors="coerce").dropna()
        batch = f"{int(sizes.min())}-{int(sizes.max())}" if len(sizes) else batch
    parts = [model, cluster, f"global batch {batch}" if batch is not None else None]
    return ", ".join(str(p) for p in parts if p is not None)


def _title(ax, what: str, df, extra: str = "") -> None:
    where = context(df) if df is not None else ""
    ax.set_title(f"{what}\n{where}{extra}" if where or extra else what, fontsize=10)


def _require(df: pd.DataFrame, columns, kind: str) -> None:
    missing = [c for c in columns if c not in df.columns]
    if missing:
        raise InputError(f"plot --kind {kind}", ", ".join(missing), "the table lacks these columns")


def plan_label(row) -> str:
    """A short label of a plan row: tp/pp/dp (cp, vpp, mb when not 1) and recompute/ZeRO."""
    get = row.get if isinstance(row, Mapping) else (lambda k, d=None: getattr(row, k, d))
    def num(key):
        v = get(key)
        return "?" if v is None or pd.isna(v) else str(int(v))
    parts = [f"tp{num('tp')} pp{num('pp')} dp{num('dp')}"]
    for key, short in (("cp", "cp"), ("vpp", "v"), ("micro_batch", "mb")):
        v = get(key)
        if v is not None and not pd.isna(v) and int(v) != 1:
            parts.append(f"{short}{int(v)}")
    if get("recompute") not in (None, "", "none"):
        parts.append(f"rc-{get('recompute')}")
    if get("zero_stage") not in (None, 0) and not pd.isna(get("zero_stage")):
        parts.append(f"z{int(get('zero_stage'))}")
    return " ".join(parts)


def _feasible(df: pd.DataFrame) -> pd.DataFrame:
    return df[df["feasible"].fillna(False).astype(bool)] if "feasible" in df.columns else df


# ------------------------------------------------------------------ step-time breakdown

def best_rows(df: pd.DataFrame, n: int) -> pd.DataFrame:
    """The n feasible plans with the shortest step time (then the out-of-memory ones)."""
    rows = df[df["step_time_s"].notna()]
    ok = rows["feasible"].fillna(False).astype(bool) if "feasible" in rows.columns else pd.Series(True, rows.index)
    return rows.assign(_bad=~ok).sort_values(["_bad", "step_time_s"], kind="stable").drop(columns="_bad").head(n)


def breakdown(df: pd.DataFrame, ax=None, labels=None, max_plans: int = 20):
    """Stacked bars of the exposed step-time parts of the `max_plans` best plans (shortest
    step time among those that fit; table order when given fewer). One bar container per
    part that is non-zero somewhere."""
    cols = [f"breakdown_s.{k}" for k in BREAKDOWN_KEYS]
    _require(df, cols + ["step_time_s"], "breakdown")
    rows = best_rows(df, max_plans)
    fig, ax = _axes(ax, (max(6, 0.6 * len(rows) + 5), 4.8))
    x = np.arange(len(rows))
    bottom = np.zeros(len(rows))
    for key in BREAKDOWN_KEYS:
        values = rows[f"breakdown_s.{key}"].fillna(0.0).to_numpy(dtype=float)
        if not values.any():
            continue
        ax.bar(x, values, bottom=bottom, label=key.replace("_", " "))
        bottom += values
    labels = labels if labels is not None else [plan_label(r) for r in rows.to_dict("records")]
    ax.set_xticks(x, labels, rotation=60, ha="right", fontsize=8)
    valid = int(df["step_time_s"].notna().sum())
    fit = int(_feasible(df)["step_time_s"].notna().sum())
    shown_fit = min(len(rows), fit)
    what = f"Step-time breakdown of the {shown_fit} fastest of {fit} plans that fit" + (
        f", then {len(rows) - shown_fit} out of memory" if len(rows) > shown_fit else "")
    ax.set_xlabel("plan (fastest first)" if valid > 1 else "plan")
    ax.set_ylabel("step time (s), exposed parts")
    _title(ax, what if valid > 1 else "Step-time breakdown", df)
    _outside_legend(ax)
    fig.tight_layout()
    return fig


# ------------------------------------------------------------------ memory per stage

def stages_of(result) -> tuple[list[dict], float]:
    """(per-stage memory GiB dicts, capacity GiB) from a Result.to_dict() or a table row.
    A row without the per-stage list (vectorised sweeps) gives its peak stage only."""
    get = result.get
    stages = get("memory_gib_by_stage")
    if isinstance(stages, str):
        try:
            stages = json.loads(stages) if stages.strip() else []
        except ValueError:
            raise InputError("memory_gib_by_stage", stages[:60], "expected a JSON list of per-stage memory "
                             "mappings (GiB by part)") from None
    where = "memory_gib_by_stage"
    if not isinstance(stages, list) or not stages:
        where, peak = "memory_gib", get("memory_gib")
        if peak is None:
            peak = {k: get(f"memory_gib.{k}") for k in MEMORY_KEYS}
        stages = [peak]
    if not all(isinstance(st, Mapping) for st in stages):
        raise InputError(where, json.dumps(stages)[:60], "expected mappings of " + ", ".join(MEMORY_KEYS) + " to GiB")
    stages = [{k: _gib(st, k, where, 0.0) for k in MEMORY_KEYS} for st in stages]
    if not any(v for st in stages for v in st.values()):
        raise InputError("RESULTS", "no memory", "the row has no memory_gib_by_stage, memory_gib or memory_gib.* values")
    return stages, _gib(result, "memory_capacity_gib", "")


def _gib(data: Mapping, key: str, field: str, *default) -> float:
    """A memory cell in GiB, >= 0 (fields.number); an empty one (None, or NaN as a table holds
    it) is the `default` given, else refused."""
    value = data.get(key)
    return F.number({key: None if isinstance(value, float) and np.isnan(value) else value}, key, field, *default,
                    minimum=0.0, strict_min=False, maximum=math.inf)


def memory(result, ax=None, scenario=None):
    """Stacked bars of weights, gradients, optimizer, activations and other per pipeline
    stage, with the device capacity as a dashed line; one bar container per part. The
    title names the plan, the model, cluster and batch from `scenario` (a Scenario) or the row."""
    stages, capacity = stages_of(result)
    fig, ax = _axes(ax, (max(5, 0.35 * len(stages) + 3), 4.5))
    x = np.arange(len(stages))
    bottom = np.zeros(len(stages))
    for key in MEMORY_KEYS:
        values = np.array([s[key] for s in stages])
        ax.bar(x, values, bottom=bottom, label=key)
        bottom += values
    ax.axhline(capacity, color="black", linestyle="--", linewidth=1, label=f"capacity {capacity:.0f} GiB")
    ax.set_xticks(x, [str(i) for i in x] if len(stages) > 1 else ["peak stage"])
    ax.set_xlabel("pipeline stage")
    ax.set_ylabel("memory per device (GiB)")
    what = "Memory per pipeline stage"
    if scenario is not None or "tp" in result:  # name the plan: a sweep's rows differ in it
        what += f" of {plan_label(scenario.plan if scenario is not None else result)}"
    if scenario is not None:
        c = scenario.cluster
        where = (f"{scenario.model.name}, {c.nodes} x {c.node.name} ({c.devices} x {c.accelerator.name}), "
                 f"global batch {scenario.plan.global_batch}")
        ax.set_title(f"{what}\n{where}", fontsize=10)
    else:
        _title(ax, what, dict(result) if "model" in result else None,
               "" if "model" in result else f"{result.get('scenario') or 'scenario'}: {result.get('devices')} devices, "
               f"global batch {result.get('global_batch')}")
    _outside_legend(ax)
    fig.tight_layout()
    return fig


# ------------------------------------------------------------------ Pareto frontier

def pareto_front(x, y, min_gain: float = 0.0) -> np.ndarray:
    """Indices of the points no other point beats on both x and y (both minimised), by x.

    min_gain > 0 keeps a slower point only when its y is lower than every faster point's by
    more than that fraction (so that 1e-7 differences do not crowd the frontier)."""
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    order = np.lexsort((y, x))
    front, best = [], np.inf
    for i in order:
        if y[i] < best * (1.0 - min_gain):
            front.append(i)
            best = y[i]
    return np.array(front, dtype=int)


def _filled(df: pd.DataFrame, preferred: str, fallback: str) -> str:
    return preferred if preferred in df.columns and df[preferred].notna().any() else fallback


LOG_SPAN = 30.0  # an axis whose positive values span more than this factor is logarithmic
MAX_LABELS = 10  # points a plot labels at most: the Pareto frontier's, the scatter's worst runs


def _log_axis(set_scale, axis, lo: float, hi: float) -> None:
    """The axis of values from lo to hi logarithmic where they are positive and span more than
    LOG_SPAN, with plain tick labels at 1, 2 and 5 of each decade."""
    if not (lo > 0 and hi > LOG_SPAN * lo):
        return
    set_scale("log")
    axis.set_major_locator(ticker.LogLocator(subs=(1.0, 2.0, 5.0)))
    axis.set_major_formatter(ticker.FuncFormatter(lambda v, _: f"{v:g}"))
    axis.set_minor_formatter(ticker.NullFormatter())


def _spread(n: int, k: int) -> list[int]:
    """k of the indices 0..n-1 evenly spread, the first and the last among them (all when n <= k)."""
    if n <= k:
        return list(range(n))
    return sorted({round(i * (n - 1) / (k - 1)) for i in range(k)})


def pareto(df: pd.DataFrame, ax=None, x: str | None = None, y: str | None = None, label_front: bool = True,
           min_gain: float = 1e-3):
    """Every feasible plan as a point (collection 0) and the time-vs-cost Pareto frontier
    (collection 1, joined by a line, its points labelled with their plan, and their
    accelerator, node count and global batch when the table has several: all of them up to
    MAX_LABELS, else MAX_LABELS spread along it). See pareto_front for min_gain.

    Defaults: time and cost to train when the table has them (training.tokens set), else
    step time and $ per million tokens, or the time per million tokens where the global batch
    varies (a step of 4096 sequences is no slower than one of 256 for taking longer). On one
    cluster at one price cost is proportional to time; the frontier is informative across
    node counts, accelerators or prices. An axis
    whose values span more than LOG_SPAN is logarithmic: a large sweep's frontier sits in
    the corner of a linear plot."""
    if x is None:
        x = _filled(df, "time_to_train_days", "step_time_s")
        if x == "step_time_s" and "tokens_per_s" in df.columns and "global_batch" in df.columns \
                and df["global_batch"].nunique() > 1:
            df = df.assign(s_per_million_tokens=1e6 / df["tokens_per_s"])
            x = "s_per_million_tokens"
    y = y or _filled(df, "cost_to_train_usd", "usd_per_million_tokens")
    _require(df, [x, y], "pareto")
    pts = _feasible(df).dropna(subset=[x, y])
    fig, ax = _axes(ax)
    ax.scatter(pts[x], pts[y], s=12, alpha=0.4, color="tab:blue", label="feasible plans")
    front = pts.iloc[pareto_front(pts[x], pts[y], min_gain)] if len(pts) else pts
    many = [c for c in ("accelerator", "nodes", "global_batch") if c in pts.columns and pts[c].nunique() > 1]
    ax.scatter(front[x], front[y], s=30, color="tab:red", label="Pareto frontier", zorder=3)
    ax.plot(front[x], front[y], color="tab:red", linewidth=1)
    if label_front:
        records = front.to_dict("records")
        for r in (records[i] for i in _spread(len(records), MAX_LABELS)):
            where = ", ".join({"nodes": f"{r[c]} nodes", "global_batch": f"batch {r[c]}"}.get(c, f"{r[c]}")
                              for c in many)
            ax.annotate((where + ": " if where else "") + plan_label(r), (r[x], r[y]), fontsize=7, xytext=(4, 4),
                        textcoords="offset points", rotation=30, rotation_mode="anchor")
    for column, set_scale, axis in ((x, ax.set_xscale, ax.xaxis), (y, ax.set_yscale, ax.yaxis)):
        values = pts[column].to_numpy(dtype=float)
        if len(values):
            _log_axis(set_scale, axis, values.min(), values.max())
    ax.set_xlabel(label(x))
    ax.set_ylabel(label(y))
    _title(ax, f"{label(x).split(' (')[0].capitalize()} vs {label(y).split(' (')[0]}", df)
    _outside_legend(ax)
    fig.tight_layout()
    return fig


# ------------------------------------------------------------------ TP x PP heatmap

def _short(v: float) -> str:
    """Three significant digits with a k, M or G suffix: 689k, 1.25M (999,999 is 1M)."""
    v = float(f"{v:.3g}")
    for scale, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(v) >= scale:
            return f"{v / scale:.3g}{suffix}"
    return f"{v:.3g}"


def heatmap_grid(df: pd.DataFrame, value: str = "tokens_per_s"):
    """(tp values, pp values, grid[pp, tp] of the best feasible `value`, NaN where no plan
    fits, and a boolean grid of the cells the table has rows for)."""
    _require(df, ["tp", "pp", value], "heatmap")
    rows = df.dropna(subset=["tp", "pp"])
    tps = sorted(int(v) for v in rows["tp"].unique())
    pps = sorted(int(v) for v in rows["pp"].unique())
    grid = np.full((len(pps), len(tps)), np.nan)
    present = np.zeros_like(grid, dtype=bool)
    for pp, tp in zip(rows["pp"], rows["tp"]):
        present[pps.index(int(pp)), tps.index(int(tp))] = True
    best = _feasible(rows).groupby(["pp", "tp"])[value].max()
    for (pp, tp), v in best.items():
        grid[pps.index(int(pp)), tps.index(int(tp))] = v
    return tps, pps, grid, present


def heatmap(df: pd.DataFrame, ax=None, value: str = "tokens_per_s"):
    """Best feasible `value` per (TP, PP) cell over the other fields; cells whose plans
    are all infeasible (out of memory or invalid) are grey and marked with a cross, cells
    the table has no row for are grey and blank."""
    tps, pps, grid, present = heatmap_grid(df, value)
    fig, ax = _axes(ax, (1.1 * len(tps) + 3, 0.8 * len(pps) + 2))
    cmap = matplotlib.colormaps["viridis"].with_extremes(bad="lightgrey")
    im = ax.imshow(np.ma.masked_invalid(grid), cmap=cmap, origin="lower", aspect="auto")
    for i in range(len(pps)):
        for j in range(len(tps)):
            v = grid[i, j]
            if not present[i, j]:
                continue
            text = INFEASIBLE_MARK if np.isnan(v) else _short(v)
            # viridis is light at its top: dark text there
            dark = np.isnan(v) or im.norm(v) > 0.6
            ax.text(j, i, text, ha="center", va="center", fontsize=8, color="black" if dark else "white")
    ax.set_xticks(range(len(tps)), [str(t) for t in tps])
    ax.set_yticks(range(len(pps)), [str(p) for p in pps])
    ax.set_xlabel("tensor-parallel size TP (devices)")
    ax.set_ylabel("pipeline-parallel size PP (stages)")
    _title(ax, f"Best {label(value)} per TP x PP ({INFEASIBLE_MARK}: no plan fits)", df)
    fig.colorbar(im, ax=ax, label=label(value))
    fig.tight_layout()
    return fig


# ------------------------------------------------------------------ timeline

TIMELINE_COLUMNS = ("stage", "stream", "name", "start_s", "end_s")


def _kind(name) -> str:
    return str(name).split(":")[0].rstrip("0123456789 _.") or str(name)


def _palette(kinds: list[str]) -> dict:
    """A colour per task kind: a pipeline send of a kind ("send F") in the light shade of that
    kind's colour (tab20 pairs), every other kind its own dark shade."""
    cmap = matplotlib.colormaps["tab20"]

    def base(k):
        return k.removeprefix("send ").removeprefix("recv ")
    bases = list(dict.fromkeys(base(k) for k in kinds))
    return {k: cmap((2 * bases.index(base(k)) + k.startswith(("send ", "recv "))) % 20) for k in kinds}


def _busy_at(starts, ends, edges) -> np.ndarray:
    """Busy seconds of the intervals [starts, ends) before each of `edges` (the integral of
    the number of running intervals), by interpolating it between the intervals' ends."""
    times = np.concatenate([starts, ends])
    steps = np.concatenate([np.ones(len(starts)), -np.ones(len(ends))])
    order = np.argsort(times, kind="stable")
    times, running = times[order], np.cumsum(steps[order])
    area = np.concatenate([[0.0], np.cumsum(running[:-1] * np.diff(times))])
    return np.interp(edges, times, area, left=0.0, right=area[-1])


def aggregate_timeline(tl: pd.DataFrame, max_bars: int = 5000, bins: int = 800) -> tuple[pd.DataFrame, float]:
    """Bars to draw: every task, or, with more than `max_bars` tasks, per lane (stage, stream)
    the step cut into `bins` equal time bins, each drawn in the colour of the task kind busiest
    in it (runs of bins of one kind as one bar). Returns (stage, stream, kind, start_s, end_s)
    rows and the bin width (0: not aggregated)."""
    df = pd.DataFrame({"stage": tl["stage"].astype(int).to_numpy(), "stream": tl["stream"].astype(str).to_numpy(),
                       "kind": [_kind(n) for n in tl["name"]], "start_s": tl["start_s"].astype(float).to_numpy(),
                       "end_s": tl["end_s"].astype(float).to_numpy()})
    if len(df) <= max_bars:
        return df, 0.0
    t0, t1 = float(df["start_s"].min()), float(df["end_s"].max())
    edges = np.linspace(t0, t1, bins + 1)
    width = (t1 - t0) / bins
    rows = []
    for (stage, stream), lane in df.groupby(["stage", "stream"], sort=True):
        kinds = list(dict.fromkeys(lane["kind"]))
        busy = np.array([np.diff(_busy_at(g["start_s"].to_numpy(), g["end_s"].to_numpy(), edges))
                         for _, g in ((k, lane[lane["kind"] == k]) for k in kinds)])
        top = np.where(busy.max(axis=0) > 0, busy.argmax(axis=0), -1)
        change = np.flatnonzero(np.diff(top)) + 1
        for a, b in zip(np.concatenate([[0], change]), np.concatenate([change, [bins]])):
            if top[a] >= 0:
                rows.append((stage, stream, kinds[top[a]], edges[a], edges[b]))
    return pd.DataFrame(rows, columns=["stage", "stream", "kind", "start_s", "end_s"]), width


def timeline(tl: pd.DataFrame, ax=None, max_tasks: int = 5000, title: str | None = None):
    """Gantt chart: one row per (stage, stream) of every pipeline stage, bars coloured by the
    task kind (the name up to the first ':' or digit). Beyond `max_tasks` tasks, each lane is
    drawn in time bins coloured by their busiest kind (aggregate_timeline), and the title says so."""
    _require(tl, TIMELINE_COLUMNS, "timeline")
    empty = tl[list(TIMELINE_COLUMNS)].isna().any(axis=1).to_numpy()
    if empty.any():
        raise InputError("plot --kind timeline", f"row {int(np.flatnonzero(empty)[0])}",
                         "every task needs its " + ", ".join(TIMELINE_COLUMNS))
    bars, resolution = aggregate_timeline(tl, max_tasks)
    lanes = sorted({(int(s), str(k)) for s, k in zip(bars["stage"], bars["stream"])})
    fig, ax = _axes(ax, (11, min(0.3 * len(lanes) + 2, 30)))
    palette = _palette(list(dict.fromkeys(bars["kind"])))
    index = {lane: i for i, lane in enumerate(lanes)}
    for (stage, stream, kind), group in bars.groupby(["stage", "stream", "kind"], sort=False):
        ax.broken_barh(list(zip(group["start_s"], group["end_s"] - group["start_s"])),
                       (index[(int(stage), str(stream))] - 0.4, 0.8), facecolors=palette[kind])
    handles = [matplotlib.patches.Patch(color=c, label=k) for k, c in palette.items()]
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=7, title="task kind")
    ax.set_yticks(range(len(lanes)), [f"stage {s} {k}" for s, k in lanes], fontsize=7 if len(lanes) > 24 else 8)
    ax.set_ylim(len(lanes) - 0.5, -0.5)
    ax.set_xlabel("time in the step (s)")
    ax.set_ylabel("pipeline stage and stream")
    stages = len({s for s, _ in lanes})
    what = f"{len(tl):,} tasks on {stages} pipeline stage{'s' if stages != 1 else ''}"
    if resolution:
        what += (f"; aggregated into {1e3 * resolution:.3g} ms bins, each drawn as the task kind busiest in it "
                 f"({len(bars):,} bars)")
    ax.set_title(f"{title or 'Pipeline timeline'}\n{what}", fontsize=10)
    fig.tight_layout()
    return fig


# ------------------------------------------------------------------ predicted vs measured

METRIC_UNITS = {"hardware_tflops_per_device": "hardware TFLOP/s per device", "step_time_s": "step time (s)",
                "model_tflops_per_device": "model TFLOP/s per device", "tokens_per_s_per_device": "tokens/s per device",
                "peak_memory_gib": "peak memory (GiB)", "peak_reserved_gib": "peak reserved memory (GiB)",
                "memory_mib": "memory (MiB)"}


def scatter(df: pd.DataFrame, ax=None, measured: str = "measured", predicted: str = "predicted",
            label: str | None = "id", metric: str = "metric"):
    """Predicted against measured values with the y = x line and +-20 % band; one panel per
    metric (a `metric` column), each on its own axes with the metric's unit. The MAX_LABELS
    points farthest from y = x (by the ratio) carry their `label`; a panel whose values span
    more than LOG_SPAN is logarithmic on both axes (the band stays a band)."""
    _require(df, [measured, predicted], "scatter")
    pts = df.dropna(subset=[measured, predicted])
    metrics = list(dict.fromkeys(pts[metric])) if metric in pts.columns else [None]
    if ax is None:
        fig, axes = plt.subplots(1, max(1, len(metrics)), figsize=(5.5 * max(1, len(metrics)) + 1.5, 5),
                                 squeeze=False)
        axes = list(axes[0])
    else:
        fig, axes = ax.figure, [ax]
        if len(metrics) > 1:
            raise InputError("plot --kind scatter", ", ".join(map(str, metrics)), "one metric per axes; pass ax=None")
    for ax, m in zip(axes, metrics):
        sub = pts if m is None else pts[pts[metric] == m]
        ax.scatter(sub[measured], sub[predicted], s=20, color="tab:blue", zorder=3, label="runs")
        lo = float(min(sub[measured].min(), sub[predicted].min())) if len(sub) else 0.0
        hi = float(max(sub[measured].max(), sub[predicted].max())) if len(sub) else 1.0
        if 0 < lo and hi < 1.05 * lo:  # one run, or runs alike: the line and band over +-30 % of them
            lo, hi = lo / 1.3, hi * 1.3
        line = np.array([lo, hi])
        ax.plot(line, line, color="black", linewidth=1, label="y = x")
        ax.fill_between(line, 0.8 * line, 1.2 * line, color="grey", alpha=0.2, label="±20 %")
        if label and label in sub.columns:
            miss = np.abs(np.log(sub[predicted].to_numpy(dtype=float) / sub[measured].to_numpy(dtype=float)))
            for i in np.argsort(-miss, kind="stable")[:MAX_LABELS]:
                r = sub.iloc[i]
                ax.annotate(str(r[label]), (r[measured], r[predicted]), fontsize=6, xytext=(3, 3),
                            textcoords="offset points")
        for set_scale, axis in ((ax.set_xscale, ax.xaxis), (ax.set_yscale, ax.yaxis)):
            _log_axis(set_scale, axis, lo, hi)
        unit = METRIC_UNITS.get(m, str(m).replace("_", " ")) if m is not None else "value"
        ax.set_xlabel(f"measured {unit}")
        ax.set_ylabel(f"predicted {unit}")
        ax.set_title(f"Predicted vs measured: {unit}\n{len(sub)} runs", fontsize=10)
    _outside_legend(axes[-1])
    fig.tight_layout()
    return fig


# ------------------------------------------------------------------ accelerators

def accelerator_best(df: pd.DataFrame, by: str = "accelerator") -> pd.DataFrame:
    """Per accelerator, its feasible plan with the most tokens/s (and that plan's $/M tokens)."""
    _require(df, [by, "tokens_per_s", "usd_per_million_tokens"], "accelerators")
    ok = _feasible(df).dropna(subset=["tokens_per_s"])
    idx = ok.groupby(by)["tokens_per_s"].idxmax()
    return ok.loc[idx.values].sort_values(by).reset_index(drop=True)


def accelerators(df: pd.DataFrame, by: str = "accelerator"):
    """Two bar panels, one bar per accelerator, each its best plan: $ per million tokens and
    tokens/s per device (comparable across clusters of different sizes)."""
    best = accelerator_best(df, by)
    _require(best, ["tokens_per_s_per_device"], "accelerators")
    fig, (left, right) = plt.subplots(1, 2, figsize=(max(8, 1.2 * len(best) + 4), 4.8))
    names = [f"{n}\n({int(d)} devices)" if "devices" in best.columns else str(n)
             for n, d in zip(best[by].astype(str), best.get("devices", best[by]))]
    x = np.arange(len(best))
    left.bar(x, best["usd_per_million_tokens"], color="tab:orange")
    left.set_xticks(x, names, rotation=45, ha="right", fontsize=8)
    left.set_ylabel(label("usd_per_million_tokens"))
    right.bar(x, best["tokens_per_s_per_device"], color="tab:green")
    right.set_xticks(x, names, rotation=45, ha="right", fontsize=8)
    right.set_ylabel(label("tokens_per_s_per_device"))
    for panel in (left, right):
        panel.set_xlabel(by)
    fig.suptitle(f"Accelerators, the best plan of each (most tokens/s)\n{_one(df, 'model')}, global batch "
                 f"{_one(df, 'global_batch')}, {_one(df, 'nodes')} nodes each", fontsize=10)
    fig.tight_layout()
    return fig


KINDS = {"breakdown": breakdown, "memory": memory, "pareto": pareto, "heatmap": heatmap, "timeline": timeline,
         "scatter": scatter, "accelerators": accelerators}


# ------------------------------------------------------------------ files

def read_results(path: str | Path):
    """A results file: .csv / .parquet table, or .json (evaluate --json object, a list of
    rows, an object with `rows`, like `llmsim validate --json`, or an `evaluate --trace`
    Chrome trace, read as its timeline table)."""
    from .yamlio import parse_json, read_text

    path = Path(path)
    if path.suffix not in (".csv", ".parquet", ".json"):
        raise InputError("RESULTS", str(path), "expected a .csv, .parquet or .json file")
    if path.suffix in (".csv", ".parquet"):
        read_text  # the same checks as text files: a regular file that exists
        if not path.is_file():
            raise InputError("RESULTS", str(path), "file not found (or not a regular file)")
        try:
            df = pd.read_csv(path) if path.suffix == ".csv" else pd.read_parquet(path)
        except Exception as exc:  # pandas and pyarrow raise many kinds for damaged files
            raise InputError("RESULTS", str(path), f"cannot read the table ({type(exc).__name__})") from None
        return checked_table(df, path)
    if path.suffix == ".json":
        data = parse_json(read_text(path, "RESULTS", max_bytes=256 * 2**20), f"RESULTS {path}")
        if isinstance(data, dict) and isinstance(data.get("rows"), list):
            return checked_table(pd.DataFrame(data["rows"]), path)
        if isinstance(data, dict) and isinstance(data.get("plans"), list):
            return checked_table(pd.DataFrame(data["plans"]), path)
        if isinstance(data, dict) and isinstance(data.get("traceEvents"), list):  # evaluate --trace
            from .trace import trace_timeline
            return trace_timeline(data)
        if isinstance(data, list):
            return checked_table(pd.DataFrame(data), path)
        return data
    raise InputError("RESULTS", str(path), "expected a .csv, .parquet or .json file")


# besides a sweep's or search's columns (table.schema): a validation row's numbers
# (`validate --json` rows), a timeline's tasks and the columns plots group and label by
CHECKED_COLUMNS = {"measured": "float", "predicted": "float", "error_pct": "float", "metric": "label", "id": "label",
                   "model": "label", "node": "label", "accelerator": "label", "scenario": "label", "source": "label",
                   "stage": "int", "stream": "label", "name": "label", "category": "label", "start_s": "float",
                   "end_s": "float", "duration_s": "float"}


def checked_table(df: pd.DataFrame, path) -> pd.DataFrame:
    """The table with each column llmsim writes (table.schema) in its kind: numbers finite,
    integers whole, booleans True or False, empty cells missing. A cell that is not is refused
    with its column, row and value; a column already of its kind is kept as it is."""
    from .table import schema

    kinds = {**schema(), **CHECKED_COLUMNS}
    out = {}
    for col in df.columns:
        kind, values = kinds.get(col), df[col]
        out[col] = values
        if kind == "label":
            nested = values.map(lambda v: isinstance(v, (list, dict)))
            if nested.any():
                bad = int(np.flatnonzero(nested.to_numpy())[0])
                raise InputError(f"RESULTS {col}", values.iloc[bad], f"expected a text label (row {bad} of {path})")
            continue
        if kind in ("float", "int"):
            if values.dtype.kind in "iu":
                continue
            numbers = values if values.dtype.kind == "f" else pd.to_numeric(
                values.map(lambda v: None if isinstance(v, (bool, np.bool_)) else v), errors="coerce").astype(float)
            whole = (numbers % 1 == 0) if kind == "int" else True
            ok = values.isna() | (np.isfinite(numbers) & whole)
            allowed, converted = ("an integer" if kind == "int" else "a finite number"), numbers
        elif kind == "bool":
            if values.dtype == bool:
                continue
            converted = values.map(lambda v: {"true": True, "false": False}.get(v.lower()) if isinstance(v, str)
                                   else bool(v) if isinstance(v, (bool, np.bool_)) else None)
            ok, allowed = values.isna() | converted.notna(), "True or False"
            converted = converted.where(values.notna())
        else:
            continue
        if not ok.all():
            bad = int(np.flatnonzero(~ok.to_numpy())[0])
            raise InputError(f"RESULTS {col}", values.iloc[bad], f"expected {allowed} (row {bad} of {path})")
        out[col] = converted
    return pd.DataFrame(out, index=df.index)


def plot_file(results: str | Path, kind: str, out: str | Path, row: int | None = None):
    """Draw `kind` from a results file and save it as PNG; returns the Figure. Matplotlib's and
    numpy's warnings (a layout that cannot fit long labels, an axis over 1e308) are not
    printed: the picture is drawn as well as it can be."""
    if kind not in KINDS:
        raise InputError("--kind", kind, "expected one of " + ", ".join(KINDS))
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore", UserWarning)
        warnings.simplefilter("ignore", RuntimeWarning)
        return _plot_file(results, kind, out, row)


def _plot_file(results, kind: str, out, row):
    data = read_results(results)
    if kind == "memory":
        if isinstance(data, pd.DataFrame):
            ok = _feasible(data) if row is None else data
            if not len(ok):
                raise InputError("RESULTS", str(results), "no feasible row to draw")
            if row is None:
                pick = ok["tokens_per_s"].idxmax() if "tokens_per_s" in ok.columns else ok.index[0]
                data = ok.loc[pick].to_dict()
            else:
                if not 0 <= row < len(data):
                    raise InputError("--row", row, f"expected a row from 0 to {len(data) - 1}")
                data = data.iloc[row].to_dict()
        elif not isinstance(data, Mapping) or "memory_capacity_gib" not in data:
            raise InputError("RESULTS", str(results), "--kind memory needs a results table or an evaluate --json")
        fig = memory(data)
    elif kind == "breakdown" and isinstance(data, Mapping) and "breakdown_s" in data:  # one evaluate --json
        from .table import result_row

        if not data.get("feasible"):
            raise InputError("RESULTS", str(results), "the plan does not fit: it has no step time to break down")
        row = {}
        for key, value in data.items():
            try:
                row.update(result_row({key: value}))
            except (TypeError, KeyError, IndexError, AttributeError, ValueError):
                raise InputError(f"RESULTS {key}", value, "not as evaluate --json writes it") from None
        fig = breakdown(checked_table(pd.DataFrame([row]), results), labels=[data.get("scenario") or "plan"])
    else:
        if not isinstance(data, pd.DataFrame):
            raise InputError("RESULTS", str(results), f"--kind {kind} needs a table (.csv, .parquet or a JSON list)")
        fig = KINDS[kind](data)
    try:
        fig.savefig(out, dpi=110, bbox_inches="tight")
    except (OSError, ValueError) as exc:
        raise InputError("-o", str(out), f"cannot write the image ({exc.__class__.__name__}: {exc})") from None
    finally:
        plt.close(fig)
    return fig
