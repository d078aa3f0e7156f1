"""Reproduce published training runs (scenarios/published/) and report the prediction error.

Each row of published-runs.csv (a copy of shared/validation/published-runs.csv) becomes a
scenario; supplement.yaml fills fields the table leaves blank, with their sources. The
compared quantity respects the source's FLOP convention: Narayanan et al. 2021 report
achieved TFLOP/s per GPU counting recomputation (compared with our hardware TFLOP/s);
Korthikanti et al. 2022 report iteration time (compared with our step time).
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass, replace
from pathlib import Path

from .errors import InputError
from .resources import data_dir
from .evaluate import evaluate
from .scenario import scenario_from_dict
from .yamlio import load_yaml

PUBLISHED_DIR = data_dir() / "scenarios" / "published"


@dataclass(frozen=True)
class Comparison:
    id: str
    metric: str
    measured: float
    predicted: float
    feasible: bool
    peak_memory_gib: float

    @property
    def error(self) -> float:
        return (self.predicted - self.measured) / self.measured


def _num(row: dict, key: str):
    v = (row.get(key) or "").strip()
    return float(v) if v else None


def row_scenario(row: dict, supplement: dict) -> dict:
    """A scenario mapping for one published-runs row."""
    extra = dict(supplement.get("defaults", {}))
    extra.update(supplement.get("rows", {}).get(row["id"], {}))
    n = int(row["num_gpus"])
    per_node = int(row["gpus_per_node"])
    heads = extra.pop("heads", None) or int(row["heads"])
    model = {
        "name": row["id"], "layers": int(row["layers"]), "hidden": int(row["hidden"]), "heads": heads,
        "kv_heads": int(row["kv_heads"]) if row.get("kv_heads") else heads,
        "ffn_hidden": int(row["ffn_hidden"]), "vocab": int(row["vocab"]), "seq_len": int(row["seq_len"]),
        "activation": row["activation"], "norm": "layernorm", "position_embedding": "learned",
        "bias": True, "tied_embeddings": True, "dropout": extra.pop("dropout", True),
    }
    plan = {
        "tp": int(row["tp"]), "pp": int(row["pp"]), "dp": int(row["dp"]), "cp": int(row["cp"] or 1),
        "vpp": int(extra.pop("vpp", None) or row.get("vpp") or 1),
        "micro_batch": int(extra.pop("micro_batch", None) or row["micro_batch"]),
        "global_batch": int(row["global_batch"]),
        "sequence_parallel": row["seq_parallel"].strip().lower() == "yes",
        "recompute": row["recompute"], "zero_stage": int(row["zero_stage"] or 0),
    }
    node = extra.pop("node")
    plan.update(extra)
    if plan["vpp"] > 1:
        plan.setdefault("schedule", "interleaved")
    return {"name": row["id"], "model": model, "plan": plan,
            "cluster": {"node": node, "nodes": n // per_node, "devices_per_node": per_node}}


def load_rows(folder: Path = PUBLISHED_DIR) -> tuple[list[dict], dict]:
    path = folder / "published-runs.csv"
    if not path.is_file():
        raise InputError("published", str(path), "published-runs.csv not found")
    with path.open(newline="", encoding="utf-8") as fh:
        rows = list(csv.DictReader(fh))
    supplement = load_yaml(folder / "supplement.yaml", "published supplement") or {}
    return rows, supplement


def compare(row: dict, supplement: dict, engine: str = "graph", matmul_max: float | None = None) -> Comparison:
    scenario = scenario_from_dict(row_scenario(row, supplement))
    if matmul_max is not None:
        acc = scenario.cluster.accelerator
        acc = replace(acc, matmul=replace(acc.matmul, max=matmul_max))
        scenario = replace(scenario, cluster=replace(scenario.cluster, accelerator=acc))
    result = evaluate(scenario, engine=engine)
    d = result.to_dict()
    tflops = _num(row, "measured_tflops_per_gpu")
    if tflops is not None:
        metric, measured, predicted = "hardware_tflops_per_device", tflops, d["hardware_tflops_per_device"]
    else:
        metric, measured, predicted = "step_time_s", _num(row, "measured_iter_time_s"), d["step_time_s"]
    return Comparison(row["id"], metric, measured, predicted, d["feasible"], d["peak_memory_gib"])


def validate_published(engine: str = "graph", folder: Path = PUBLISHED_DIR) -> tuple[list[Comparison], float]:
    """(per-row comparisons, MAPE in %) over every row with a measured value."""
    rows, supplement = load_rows(folder)
    out = [compare(r, supplement, engine) for r in rows]
    mape = 100.0 * sum(abs(c.error) for c in out) / len(out) if out else math.nan
    return out, mape


def fit_matmul_max(prefix: str, engine: str = "analytic", folder: Path = PUBLISHED_DIR) -> tuple[float, list[Comparison]]:
    """Least-squares fit of the accelerator's matmul efficiency `max` to the runs whose id starts
    with `prefix` (squared log error of the compared metric). Returns (max, comparisons at it).

    This is the provenance of the A100 profile's matmul efficiency: one number for all runs
    of the named data set, never a per-row constant.
    """
    from scipy.optimize import minimize_scalar

    rows, supplement = load_rows(folder)
    chosen = [r for r in rows if r["id"].startswith(prefix)]
    if not chosen:
        raise InputError("--fit-matmul", prefix, "no published run id starts with it")

    def loss(x: float) -> float:
        return sum(math.log(compare(r, supplement, engine, x).predicted / _measured(r)) ** 2 for r in chosen)

    best = minimize_scalar(loss, bounds=(0.3, 1.0), method="bounded", options={"xatol": 1e-4})
    value = round(float(best.x), 3)
    return value, [compare(r, supplement, engine, value) for r in chosen]


def _measured(row: dict) -> float:
    tflops = _num(row, "measured_tflops_per_gpu")
    return tflops if tflops is not None else _num(row, "measured_iter_time_s")
