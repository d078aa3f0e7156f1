"""Comparison plots (matplotlib): each function draws on an Axes and returns its Figure.

Inputs are the tables of simulator.sweep / simulator.search (one row per plan, columns
of simulator.table), a `Result.to_dict()` for memory, a timeline table (stage, stream,
name, start_s, end_s) for the Gantt chart, and a table with `measured` and `predicted`
columns for the validation scatter. `KINDS` maps the `llmsim plot --kind` names to
functions; `plot_file` reads a results file and writes a PNG.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Mapping

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from .errors import InputError  # noqa: E402
from .result import BREAKDOWN_KEYS, MEMORY_KEYS  # noqa: E402

INFEASIBLE_MARK = "×"


def _axes(ax, size=(8, 4.5)):
    if ax is None:
        fig, ax = plt.subplots(figsize=size)
    return ax.figure, ax


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

def breakdown(df: pd.DataFrame, ax=None, labels=None, max_plans: int = 20):
    """Stacked bars of the exposed step-time parts, one bar per plan (rows with a step
    time, out-of-memory ones included; at most `max_plans`, in table order). One bar
    container per part that is non-zero somewhere."""
    cols = [f"breakdown_s.{k}" for k in BREAKDOWN_KEYS]
    _require(df, cols, "breakdown")
    rows = df[df["step_time_s"].notna()].head(max_plans)
    fig, ax = _axes(ax, (max(6, 0.6 * len(rows) + 3), 4.5))
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
    ax.set_ylabel("step time (s)")
    ax.set_title("Step-time breakdown (exposed seconds)")
    ax.legend(fontsize=8, ncol=2)
    fig.tight_layout()
    return fig


# ------------------------------------------------------------------ memory per stage

def stages_of(result) -> tuple[list[dict], float]:
    """(per-stage memory GiB dicts, capacity GiB) from a Result.to_dict() or a table row.
    A row without the per-stage list (vectorised sweeps) gives its peak stage only."""
    get = result.get
    stages = get("memory_gib_by_stage")
    if isinstance(stages, str):
        stages = json.loads(stages) if stages.strip() else []
    if not isinstance(stages, list) or not stages:
        peak = get("memory_gib")
        if peak is None:
            peak = {k: get(f"memory_gib.{k}") for k in MEMORY_KEYS}
        stages = [peak]
    return stages, float(get("memory_capacity_gib"))


def memory(result, ax=None):
    """Stacked bars of weights, gradients, optimizer, activations and other per pipeline
    stage, with the device capacity as a dashed line; one bar container per part."""
    stages, capacity = stages_of(result)
    fig, ax = _axes(ax, (max(5, 0.35 * len(stages) + 3), 4.5))
    x = np.arange(len(stages))
    bottom = np.zeros(len(stages))
    for key in MEMORY_KEYS:
        values = np.array([float(s[key] or 0.0) for s in stages])
        ax.bar(x, values, bottom=bottom, label=key)
        bottom += values
    ax.axhline(capacity, color="black", linestyle="--", linewidth=1, label=f"capacity {capacity:.0f} GiB")
    ax.set_xticks(x, [str(i) for i in x] if len(stages) > 1 else ["peak stage"])
    ax.set_xlabel("pipeline stage")
    ax.set_ylabel("memory per device (GiB)")
    ax.set_title("Memory per pipeline stage")
    ax.legend(fontsize=8)
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


def pareto(df: pd.DataFrame, ax=None, x: str | None = None, y: str | None = None, label_front: bool = True,
           min_gain: float = 1e-3):
    """Every feasible plan as a point (collection 0) and the time-vs-cost Pareto frontier
    (collection 1, joined by a line, each frontier point labelled with its plan, and its
    accelerator and node count when the table has several). See pareto_front for min_gain.

    Defaults: time and cost to train when the table has them (training.tokens set), else
    step time and $ per million tokens. On one cluster at one price cost is proportional
    to time; the frontier is informative across node counts, accelerators or prices."""
    x = x or _filled(df, "time_to_train_days", "step_time_s")
    y = y or _filled(df, "cost_to_train_usd", "usd_per_million_tokens")
    _require(df, [x, y], "pareto")
    pts = _feasible(df).dropna(subset=[x, y])
    fig, ax = _axes(ax)
    ax.scatter(pts[x], pts[y], s=12, alpha=0.4, color="tab:blue", label="feasible plans")
    front = pts.iloc[pareto_front(pts[x], pts[y], min_gain)] if len(pts) else pts
    many = [c for c in ("accelerator", "nodes") if c in pts.columns and pts[c].nunique() > 1]
    ax.scatter(front[x], front[y], s=30, color="tab:red", label="Pareto frontier", zorder=3)
    ax.plot(front[x], front[y], color="tab:red", linewidth=1)
    if label_front:
        for r in front.to_dict("records"):
            where = " ".join(f"{r[c]}" + (" nodes" if c == "nodes" else "") for c in many)
            ax.annotate((where + ": " if where else "") + plan_label(r), (r[x], r[y]), fontsize=7, xytext=(4, 4),
                        textcoords="offset points")
    ax.set_xlabel(x.replace("_", " "))
    ax.set_ylabel(y.replace("_", " "))
    ax.set_title("Time vs cost")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


# ------------------------------------------------------------------ TP x PP heatmap

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
            text = INFEASIBLE_MARK if np.isnan(v) else f"{v:.3g}"
            ax.text(j, i, text, ha="center", va="center", fontsize=8, color="black" if np.isnan(v) else "white")
    ax.set_xticks(range(len(tps)), [str(t) for t in tps])
    ax.set_yticks(range(len(pps)), [str(p) for p in pps])
    ax.set_xlabel("tensor parallel (TP)")
    ax.set_ylabel("pipeline parallel (PP)")
    ax.set_title(f"Best {value.replace('_', ' ')} ({INFEASIBLE_MARK}: no plan fits)")
    fig.colorbar(im, ax=ax)
    fig.tight_layout()
    return fig


# ------------------------------------------------------------------ timeline

TIMELINE_COLUMNS = ("stage", "stream", "name", "start_s", "end_s")


def timeline(tl: pd.DataFrame, ax=None, max_tasks: int = 5000):
    """Gantt chart: one row per (stage, stream), one bar per task coloured by its kind
    (the task name up to the first ':' or digit)."""
    _require(tl, TIMELINE_COLUMNS, "timeline")
    tl = tl.head(max_tasks)
    lanes = sorted({(int(s), str(k)) for s, k in zip(tl["stage"], tl["stream"])})
    fig, ax = _axes(ax, (10, 0.4 * len(lanes) + 1.5))
    kinds = [str(n).split(":")[0].rstrip("0123456789 _") or str(n) for n in tl["name"]]
    palette = {k: f"C{i % 10}" for i, k in enumerate(dict.fromkeys(kinds))}
    index = {lane: i for i, lane in enumerate(lanes)}
    for (s, k, start, end), kind in zip(tl[["stage", "stream", "start_s", "end_s"]].itertuples(index=False), kinds):
        ax.barh(index[(int(s), str(k))], end - start, left=start, height=0.8, color=palette[kind])
    handles = [matplotlib.patches.Patch(color=c, label=k) for k, c in palette.items()]
    ax.legend(handles=handles, fontsize=7, loc="upper right", ncol=min(4, len(handles)))
    ax.set_yticks(range(len(lanes)), [f"stage {s} {k}" for s, k in lanes], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("time (s)")
    ax.set_title("Pipeline timeline")
    fig.tight_layout()
    return fig


# ------------------------------------------------------------------ predicted vs measured

def scatter(df: pd.DataFrame, ax=None, measured: str = "measured", predicted: str = "predicted",
            label: str | None = "id"):
    """Predicted against measured values with the y = x line and +-20 % band."""
    _require(df, [measured, predicted], "scatter")
    pts = df.dropna(subset=[measured, predicted])
    fig, ax = _axes(ax, (5.5, 5))
    ax.scatter(pts[measured], pts[predicted], s=20, color="tab:blue", zorder=3)
    lo = float(min(pts[measured].min(), pts[predicted].min())) if len(pts) else 0.0
    hi = float(max(pts[measured].max(), pts[predicted].max())) if len(pts) else 1.0
    line = np.array([lo, hi])
    ax.plot(line, line, color="black", linewidth=1, label="y = x")
    ax.fill_between(line, 0.8 * line, 1.2 * line, color="grey", alpha=0.2, label="±20 %")
    if label and label in pts.columns:
        for r in pts.to_dict("records"):
            ax.annotate(str(r[label]), (r[measured], r[predicted]), fontsize=6, xytext=(3, 3),
                        textcoords="offset points")
    ax.set_xlabel(f"measured {measured if measured != 'measured' else ''}".strip())
    ax.set_ylabel(f"predicted {predicted if predicted != 'predicted' else ''}".strip())
    ax.set_title("Predicted vs measured")
    ax.legend(fontsize=8)
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
    """Two bar panels, one bar per accelerator: $ per million tokens and tokens/s of its best plan."""
    best = accelerator_best(df, by)
    fig, (left, right) = plt.subplots(1, 2, figsize=(max(8, 1.2 * len(best) + 4), 4.5))
    names = list(best[by].astype(str))
    x = np.arange(len(best))
    left.bar(x, best["usd_per_million_tokens"], color="tab:orange")
    left.set_xticks(x, names, rotation=45, ha="right")
    left.set_ylabel("$ per million tokens")
    right.bar(x, best["tokens_per_s"], color="tab:green")
    right.set_xticks(x, names, rotation=45, ha="right")
    right.set_ylabel("tokens/s")
    fig.suptitle("Accelerators: best plan of each")
    fig.tight_layout()
    return fig


KINDS = {"breakdown": breakdown, "memory": memory, "pareto": pareto, "heatmap": heatmap, "timeline": timeline,
         "scatter": scatter, "accelerators": accelerators}


# ------------------------------------------------------------------ files

def read_results(path: str | Path):
    """A results file: .csv / .parquet table, or .json (evaluate --json object, a list of
    rows, an object with `rows`, like `llmsim validate --json`, or an `evaluate --trace`
    Chrome trace, read as its timeline table)."""
    path = Path(path)
    if not path.is_file():
        raise InputError("RESULTS", str(path), "file not found")
    if path.suffix == ".csv":
        return pd.read_csv(path)
    if path.suffix == ".parquet":
        return pd.read_parquet(path)
    if path.suffix == ".json":
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError:
            raise InputError("RESULTS", str(path), "not valid JSON") from None
        if isinstance(data, dict) and isinstance(data.get("rows"), list):
            return pd.DataFrame(data["rows"])
        if isinstance(data, dict) and isinstance(data.get("plans"), list):
            return pd.DataFrame(data["plans"])
        if isinstance(data, dict) and isinstance(data.get("traceEvents"), list):  # evaluate --trace
            from .trace import trace_timeline
            return trace_timeline(data)
        if isinstance(data, list):
            return pd.DataFrame(data)
        return data
    raise InputError("RESULTS", str(path), "expected a .csv, .parquet or .json file")


def plot_file(results: str | Path, kind: str, out: str | Path, row: int | None = None):
    """Draw `kind` from a results file and save it as PNG; returns the Figure."""
    if kind not in KINDS:
        raise InputError("--kind", kind, "expected one of " + ", ".join(KINDS))
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
                data = data.iloc[row].to_dict()
        fig = memory(data)
    else:
        if not isinstance(data, pd.DataFrame):
            raise InputError("RESULTS", str(results), f"--kind {kind} needs a table (.csv, .parquet or a JSON list)")
        fig = KINDS[kind](data)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return fig
