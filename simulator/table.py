"""Result tables: one flat row per evaluated plan, with a fixed schema.

A row holds the plan as resolved (model, accelerator, tp, pp, dp, ...) and the
`Result.to_dict()` contract flattened: nested mappings become dotted columns
(`memory_gib.weights`, `breakdown_s.compute`), the per-stage memory list becomes a
JSON text column. `normalize` casts a frame to the schema so that tables built in
memory, read back from CSV or from Parquet compare equal.
"""

from __future__ import annotations

import json
from operator import attrgetter
from typing import Any, Mapping

import numpy as np
import pandas as pd

from .result import BREAKDOWN_KEYS, MEMORY_KEYS

# Resolved plan description: column -> kind.
PLAN_COLUMNS = {
    "model": "str", "accelerator": "str", "node": "str", "nodes": "int", "devices": "int",
    "tp": "int", "pp": "int", "dp": "int", "cp": "int", "ep": "int", "etp": "int", "vpp": "int", "micro_batch": "int",
    "global_batch": "int", "microbatches": "int", "schedule": "str", "sequence_parallel": "bool",
    "recompute": "str", "zero_stage": "int", "dp_replicate": "int", "precision": "str", "optimizer": "str",
    "offload_optimizer": "str", "offload_params": "str", "offload_activations": "str", "flash_attention": "bool",
    "cp_attention": "str", "cp_ulysses": "int", "pipeline_split": "str", "first_stage_layers": "int",
    "last_stage_layers": "int", "pipeline_layout": "str",
}
RESULT_SCALARS = {
    "feasible": "bool", "reason": "str", "engine": "str", "step_time_s": "float", "tokens_per_s": "float",
    "tokens_per_s_per_device": "float", "model_tflops_per_device": "float",
    "hardware_tflops_per_device": "float", "mfu": "float", "hfu": "float", "peak_memory_gib": "float",
    "peak_memory_stage": "int", "peak_reserved_gib": "float", "memory_capacity_gib": "float",
}
RESULT_TAIL = {
    "model_flops_per_step": "float", "hardware_flops_per_step": "float", "price_usd_per_device_hour": "float",
    "cost_usd_per_step": "float", "usd_per_million_tokens": "float", "training_tokens": "float",
    "time_to_train_days": "float", "cost_to_train_usd": "float", "memory_gib_by_stage": "str",
    "parameters": "float", "active_parameters": "float",
    # the whole run (docs/whole-run.md)
    "goodput": "float", "interruptions": "float", "checkpoint_interval_s": "float", "energy_kwh_per_step": "float",
    "energy_kwh_to_train": "float", "data_bound": "bool", "time_to_train_days_no_failures": "float",
    "cost_to_train_usd_no_failures": "float",
}
# prediction intervals (intervals.py): the JSON's [low, high] pairs as two columns; the
# properties in which the plan lies beyond the runs behind them (domain.py) as their names
INTERVALS = ("step_time_s_interval", "tokens_per_s_interval")
INTERVAL_COLUMNS = {**{f"{k}.{b}": "float" for k in INTERVALS for b in ("low", "high")}, "interval_coverage": "float",
                    "outside_validation": "str"}
RESULT_COLUMNS = {**RESULT_SCALARS, **{f"memory_gib.{k}": "float" for k in MEMORY_KEYS},
                  **{f"breakdown_s.{k}": "float" for k in BREAKDOWN_KEYS}, **RESULT_TAIL, **INTERVAL_COLUMNS}
INT64 = (-2**63, 2**63 - 1)
DROPPED = ("scenario", "flop_convention", "devices", "global_batch", "seq_len", "diagnostics", "interval_basis",
           "interval_rows", "profile_validated", "profile_validation")  # per accelerator: `llmsim hardware list`


_SCENARIO_COLUMNS = ("model", "accelerator", "node", "nodes", "devices")
_PLAN_FIELDS = tuple(c for c in PLAN_COLUMNS if c not in _SCENARIO_COLUMNS)
_plan_fields = attrgetter(*(f"offload.{c[len('offload_'):]}" if c.startswith("offload_") else c
                            for c in _PLAN_FIELDS))


def plan_columns(model, cluster, plan) -> dict:
    """The resolved description of a valid plan (a Plan, or a batch of plans with array sizes)."""
    out = {"model": model.name, "accelerator": cluster.accelerator.name, "node": cluster.node.name,
           "nodes": cluster.nodes, "devices": cluster.devices}
    out.update(zip(_PLAN_FIELDS, _plan_fields(plan)))
    if plan.pipeline_layout is not None:
        out["pipeline_layout"] = json.dumps(list(plan.pipeline_layout))
    return out


def plan_row(scenario) -> dict:
    """The resolved description of a valid scenario."""
    return plan_columns(scenario.model, scenario.cluster, scenario.plan)


def raw_plan_row(data: Mapping) -> dict:
    """Best-effort description of a scenario mapping that failed validation (wrong types become None)."""
    plan = data.get("plan") if isinstance(data.get("plan"), Mapping) else {}
    cluster = data.get("cluster") if isinstance(data.get("cluster"), Mapping) else {}
    model = data.get("model") if isinstance(data.get("model"), Mapping) else {}
    off = plan.get("offload") if isinstance(plan.get("offload"), Mapping) else {}
    raw = {"model": model.get("preset"), "accelerator": cluster.get("accelerator"), "node": cluster.get("node"),
           "nodes": cluster.get("nodes"), **{k: plan.get(k) for k in PLAN_COLUMNS if k in plan},
           **{f"offload_{k}": off.get(k) for k in ("optimizer", "params", "activations")}}
    if isinstance(raw.get("pipeline_layout"), list):
        raw["pipeline_layout"] = json.dumps(raw["pipeline_layout"])
    out = {}
    for key, kind in PLAN_COLUMNS.items():
        v = raw.get(key)
        out[key] = v if _CELL_OK[kind](v) else None
    return out


_CELL_OK = {"int": lambda v: isinstance(v, int) and not isinstance(v, bool) and INT64[0] <= v <= INT64[1],
            "bool": lambda v: isinstance(v, bool), "str": lambda v: isinstance(v, str)}


NESTED = ("memory_gib", "breakdown_s")  # Result.to_dict()'s mappings, flattened to dotted columns


def result_columns(columns: Mapping) -> dict:
    """Flatten `Result.to_dict()` values held column by column (vector.evaluate_columns: each
    key's values as a list, a nested mapping as a mapping of lists) into table columns; the
    per-stage memory becomes JSON text (where it is not already)."""
    out = {}
    for key, values in columns.items():
        if key in DROPPED:
            continue
        if key in NESTED:
            for k, v in values.items():
                out[f"{key}.{k}"] = v
        elif key == "memory_gib_by_stage":
            out[key] = [v if v is None or type(v) is str else json.dumps(v) for v in values]
        elif key in INTERVALS:
            pairs = [v if v is not None else (None, None) for v in values]
            out[f"{key}.low"], out[f"{key}.high"] = [p[0] for p in pairs], [p[1] for p in pairs]
        elif key == "outside_validation":
            out[key] = [", ".join(flag["field"] for flag in v) for v in values]
        else:
            out[key] = values
    return out


def result_row(d: Mapping) -> dict:
    """Flatten a `Result.to_dict()`."""
    one = {k: ({kk: [vv] for kk, vv in v.items()} if k in NESTED else [v])
           for k, v in d.items()}
    return {k: v[0] for k, v in result_columns(one).items()}


def axis_kind(values) -> str:
    """The column kind of an axis: int, float, bool or str (mixed types become text, and so do
    integers outside int64, written exactly)."""
    if all(isinstance(v, bool) for v in values):
        return "bool"
    if all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        return "int" if all(INT64[0] <= v <= INT64[1] for v in values) else "str"
    if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
        return "float"
    return "str"


def axis_cell(value: Any, kind: str):
    if kind == "str":
        return value if isinstance(value, str) else json.dumps(value)
    return value


def schema(axes: Mapping[str, str] | None = None) -> dict:
    """Column -> kind for a table with the given axis columns."""
    return {"point_index": "int", "point_id": "str", **(axes or {}), **PLAN_COLUMNS, **RESULT_COLUMNS}


def _to_bool(v):
    if v is None or v is pd.NA or (isinstance(v, float) and np.isnan(v)):
        return None
    return v.strip().lower() == "true" if isinstance(v, str) else bool(v)


def _exact_int(v):
    """An integer cell as a Python int (None when missing); never through float64."""
    if v is None or v is pd.NA or v == "" or (isinstance(v, float) and np.isnan(v)):
        return None
    if isinstance(v, str):
        return int(v)
    if isinstance(v, (float, np.floating)):
        if not float(v).is_integer():
            raise ValueError(f"{v!r} is not an integer")
        return int(v)
    return int(v)


def _missing(v) -> bool:
    return v is None or v is pd.NA or (isinstance(v, float) and v != v)


_NONE = type(None)


def _cells(values: list, kind: str):
    """One column's cells (Python values) in the table's dtype for `kind`: text as Python str
    ('' when missing), booleans and integers nullable (integers never through float64)."""
    types = set(map(type, values))
    if kind == "str":
        if types <= {str, _NONE}:
            return [v if v is not None else "" for v in values] if _NONE in types else values
        return [v if type(v) is str else "" if _missing(v) else str(v) for v in values]
    if kind == "bool":
        return pd.array(values if types <= {bool, _NONE} else [_to_bool(v) for v in values], dtype="boolean")
    if kind == "int":  # (a Python int beyond int64 raises OverflowError either way)
        return pd.array(values if types <= {int, _NONE} else [_exact_int(v) for v in values], dtype="Int64")
    if types <= {float, _NONE}:
        return np.array(values, dtype="float64")  # None becomes NaN
    return pd.to_numeric(pd.Series(values, dtype=object), errors="coerce").astype("float64").array


_TEXT = pd.Series([""]).dtype  # what a column of Python str becomes in a DataFrame


def _kept(s: pd.Series, kind: str):
    """The column as it is where its dtype is already the table's for `kind`, else None."""
    if kind == "str" and isinstance(s.dtype, pd.StringDtype) and s.dtype == _TEXT:  # (object: any cells)
        return s.fillna("").array
    if kind == "int" and (s.dtype.kind in "iu" or str(s.dtype) in ("Int64", "Int32")):
        return s.astype("Int64").array
    if kind == "bool" and (s.dtype == "boolean" or s.dtype == bool):
        return s.astype("boolean").array
    if kind == "float" and s.dtype == "float64":
        return s.array
    return None


def columns_frame(columns: Mapping[str, list], n: int, kinds: Mapping[str, str]) -> pd.DataFrame:
    """Columns of `n` cells (Python objects; a missing column is empty) as a normalized table."""
    return pd.DataFrame({col: _cells(columns[col] if col in columns else [None] * n, kind)
                         for col, kind in kinds.items()}, index=range(n))


def frame(rows: list[Mapping], kinds: Mapping[str, str]) -> pd.DataFrame:
    """Rows (mappings) as a normalized table, each column built from its cells as Python
    objects (pd.DataFrame(rows) would take an integer column with empty cells through float64)."""
    return columns_frame({col: [r.get(col) for r in rows] for col in kinds}, len(rows), kinds)


def normalize(df: pd.DataFrame, kinds: Mapping[str, str]) -> pd.DataFrame:
    """Columns in schema order and dtypes; text columns hold Python str ('' when missing)."""
    out = {}
    for col, kind in kinds.items():
        if col not in df.columns:
            out[col] = _cells([None] * len(df), kind)
            continue
        kept = _kept(df[col], kind)
        out[col] = kept if kept is not None else _cells(df[col].tolist(), kind)
    return pd.DataFrame(out, index=range(len(df)))
