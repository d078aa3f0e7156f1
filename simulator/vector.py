"""Vectorised analytic evaluation: many plans at once, one numpy array entry per plan.

Plans that share the model, the cluster and every categorical field (schedule,
recompute, sequence parallelism, ZeRO stage, precision, offload, flash attention, ...)
form a group; their sizes (tp, pp, dp, cp, vpp, micro_batch, global_batch) become
arrays in a `PlanBatch`, which is compiled into one Layout of arrays and run through the
analytic engine: the same code as a single evaluation (layout.py, analytic.py), with no
second copy of a formula here.

Memory: the peak stage and bytes, as evaluate() takes them (analytic.peak_memory: from the
representatives, or every stage where PyTorch's pipeline buffers make a middle stage hold
more than its representative). The per-stage list (`memory_gib_by_stage`) is computed on
request (`by_stage=True`; sweeps take its JSON text, `by_stage="json"`), with the stage index
as a second array axis.
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass, fields
from operator import attrgetter

import numpy as np

from . import analytic
from .energy import capped_cluster
from .evaluate import host_reason, oom_reason
from .hardware import Cluster
from .intervals import interval_fields, outside_runs, residuals_for
from .layout import Layout, compile_layout
from .memory import MEMORY_KEYS
from .model import ModelSpec
from .plan import SIZES, Plan
from .result import GIB, Result, stage_memory_json
from .scenario import Scenario, Training
from .wholerun import run_economics, with_data_stall

CATEGORICAL = tuple(f.name for f in fields(Plan) if f.name not in SIZES)
_categorical = attrgetter(*CATEGORICAL)


@dataclass(frozen=True)
class PlanBatch(Plan):
    """A Plan whose sizes are int64 arrays (one entry per plan).

    `sp` is Plan.sp (sequence_parallel with tp > 1) of every plan of the batch: plans whose
    sp differs are batched apart (_scenario_key), as some formulas do not reduce to the plain
    ones at tp = 1 (torchao's FP8 casts before the all-gather, op-level recompute's kept
    reduce-scatter outputs).
    """

    @property
    def sp(self) -> bool:
        return self.sequence_parallel and bool(np.all(np.asarray(self.tp) > 1))

    def __len__(self) -> int:
        return int(np.size(self.tp))


def plan_batch(plans: list[Plan]) -> PlanBatch:
    """Stack plans that share every categorical field."""
    first = plans[0]
    cats = {name: getattr(first, name) for name in CATEGORICAL}
    sizes = {name: np.array([getattr(p, name) for p in plans], dtype=np.int64) for name in SIZES}
    return PlanBatch(**sizes, **cats)


def memory_by_stage_batch(layout: Layout, n: int, unit: float = 1.0, text: bool = False) -> list:
    """Per plan, the memory (bytes / unit, by part) of each of its pipeline stages, computed
    for all stages of all plans at once (stage index along a second array axis): a list of
    mappings, or with text=True its JSON text."""
    pp = np.asarray(layout.p).tolist()
    parts, valid = analytic.stage_memory_grid(layout, n)
    grid = np.stack([parts[k] / unit for k in MEMORY_KEYS], axis=-1).transpose(1, 0, 2)  # (plans, stages, parts)
    if not text:
        per_plan = grid.tolist()
        return [[dict(zip(MEMORY_KEYS, values)) for values in per_plan[j][:pp[j]]] for j in range(n)]
    stages = np.ascontiguousarray(grid[np.asarray(valid).T])  # every plan's stages, plan after plan
    # a sweep's plans share most numbers (1 in ~60 distinct) and stages (1 in ~7): each is
    # written once, bit for bit (-0.0 is not 0.0 to json)
    values, number = np.unique(stages.view(np.int64), return_inverse=True)
    # one json.dumps for them all (no number's text holds ", ")
    numbers = np.array(json.dumps(values.view(np.float64).tolist())[1:-1].split(", "), dtype=object)
    _, first, stage = np.unique(stages.view(np.dtype((np.void, stages.itemsize * len(MEMORY_KEYS)))),
                                return_index=True, return_inverse=True)
    texts = [stage_memory_json(row) for row in numbers[number.reshape(stages.shape)[first.ravel()]].tolist()]
    texts = np.array(texts, dtype=object)[stage.ravel()].tolist()
    ends = np.cumsum(pp).tolist()
    return ["[" + ", ".join(texts[end - p:end]) + "]" for p, end in zip(pp, ends)]


def evaluate_batch(model: ModelSpec, cluster: Cluster, plan: PlanBatch, training: Training = Training(),
                   price_usd_per_device_hour: float | None = None, name: str = "", reasons: bool = True,
                   by_stage: bool | str = False) -> dict:
    """The Result.to_dict() contract with an array per key.

    Plans must be valid (plan.validate); out-of-memory ones are feasible=False with a reason
    (reasons=False leaves the text out, for searches that drop those plans).
    `memory_gib_by_stage` is a list per plan with by_stage=True, its JSON text with
    by_stage="json", else None.
    """
    n = len(plan)
    layout = compile_layout(model, capped_cluster(cluster, training.power), plan)
    peak = analytic.peak_memory(layout, n)
    capacity = cluster.accelerator.hbm_bytes
    fits = np.broadcast_to(peak.total <= capacity, (n,))
    host = np.broadcast_to(np.asarray(analytic.host_bytes_per_device(layout), dtype=float), (n,))
    host_fits = host * cluster.devices_per_node <= cluster.node.host_memory_bytes
    feasible = fits & host_fits
    breakdown, data = with_data_stall(layout, training, analytic.step_breakdown(layout))
    breakdown = {k: np.broadcast_to(np.asarray(v, dtype=float), (n,)) for k, v in breakdown.items()}
    step = sum(breakdown.values())
    price = price_usd_per_device_hour
    if price is None:
        price = training.price_usd_per_device_hour
    if price is None:
        price = cluster.accelerator.price_usd_per_hour
    econ, run = run_economics(layout, training, breakdown, data, step, cluster.devices, price)
    parts = {k: np.broadcast_to(v, (n,)) for k, v in peak.parts.items()}
    stage = np.broadcast_to(peak.stage, (n,))
    total = np.broadcast_to(peak.total, (n,))
    result = Result(
        scenario=name, engine="analytic", feasible=feasible, reason="", step_time_s=step, breakdown_s=breakdown,
        global_batch=plan.global_batch, seq_len=model.seq_len, devices=cluster.devices,
        model_flops_per_step=layout.model_flops_per_step, hardware_flops_per_step=layout.hardware_flops_per_step,
        peak_flops_per_device=cluster.accelerator.peak(plan.precision), peak_memory_bytes=total,
        peak_memory_stage=stage, peak_reserved_bytes=np.broadcast_to(peak.reserved_bytes, (n,)), memory_bytes=parts,
        memory_by_stage=[], capacity_bytes=capacity,
        host_bytes_per_device=host,
        economics=econ, whole_run=run,
        parameters=float(model.params()), active_parameters=float(model.active_params()))
    d = result.to_dict()

    def why(i: int) -> str:
        if feasible[i] or not reasons:
            return ""
        if not fits[i]:
            return oom_reason(int(stage[i]), {k: float(parts[k][i]) for k in MEMORY_KEYS}, float(total[i]), capacity,
                              cluster.accelerator.name)
        return host_reason(float(host[i]), cluster.devices_per_node, cluster.node.host_memory_bytes, cluster.node.name)

    d["reason"] = np.array([why(i) for i in range(n)], dtype=object)
    d["memory_gib_by_stage"] = None
    if by_stage:
        d["memory_gib_by_stage"] = np.empty(n, dtype=object)
        for j, stages in enumerate(memory_by_stage_batch(layout, n, unit=GIB, text=by_stage == "json")):
            d["memory_gib_by_stage"][j] = stages
    return d


def _scenario_key(s: Scenario, cluster_key) -> tuple:
    """Scenarios with equal keys share a batch."""
    return (s.model, cluster_key, _categorical(s.plan), s.training, s.name, s.plan.sp)


def evaluate_columns(scenarios: list[Scenario], by_stage: bool | str = True) -> list[tuple[list[int], dict]]:
    """The analytic engine's Result.to_dict() of the scenarios, computed group by group with
    numpy: per group, the indices of its scenarios and each key's values as a list in that
    order (a nested mapping such as `memory_gib` as a mapping of lists; `memory_gib_by_stage` as
    evaluate_batch gives it for `by_stage`). Clusters
    (unhashable) are compared by content, once per distinct object: scenarios parsed one by
    one batch together as those parsed with a shared cache do."""
    groups = defaultdict(list)
    clusters: dict = {}
    for i, s in enumerate(scenarios):
        if id(s.cluster) not in clusters:
            clusters[id(s.cluster)] = repr(s.cluster)
        groups[_scenario_key(s, clusters[id(s.cluster)])].append(i)
    out = []
    for members in groups.values():
        s0 = scenarios[members[0]]
        batch = plan_batch([scenarios[i].plan for i in members])
        d = evaluate_batch(s0.model, s0.cluster, batch, s0.training, s0.price_usd_per_device_hour, s0.name,
                           by_stage=by_stage)
        d.update(interval_fields(d["step_time_s"], batch.global_batch * s0.model.seq_len, s0.cluster.accelerator,
                                 "analytic"))
        runs = residuals_for(s0.cluster.accelerator, "analytic")
        columns = {k: _column(v, len(members)) for k, v in d.items()}
        columns["outside_validation"] = [outside_runs(scenarios[i], runs) for i in members]
        out.append((members, columns))
    return out


def evaluate_many(scenarios: list[Scenario]) -> list[dict]:
    """Result.to_dict() of each scenario (analytic engine), from evaluate_columns."""
    out: list[dict | None] = [None] * len(scenarios)
    for members, columns in evaluate_columns(scenarios):
        for j, i in enumerate(members):
            out[i] = {k: ({kk: vv[j] for kk, vv in v.items()} if isinstance(v, dict) else v[j])
                      for k, v in columns.items()}
    return out


def _column(value, n: int):
    """A batched to_dict value as a list of n Python values, as the scalar path gives them
    (non-finite floats become None, like Result.to_dict)."""
    if isinstance(value, dict):
        return {k: _column(v, n) for k, v in value.items()}
    if isinstance(value, np.ndarray) and value.ndim:
        if value.dtype.kind == "f" and not np.isfinite(value).all():
            return [v if np.isfinite(v) else None for v in value.tolist()]
        return value.tolist()
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and not np.isfinite(value):
        value = None
    return [value] * n
