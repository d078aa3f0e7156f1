"""Plan search: enumerate every valid plan for a model, a cluster and a global batch, rank them.

Enumeration. A plan is a *shape* (tp, pp, cp, dp, vpp, micro_batch, schedule, sequence
parallelism; for an MoE model ep and etp) times a *setting* (recompute, ZeRO stage, offload). `plan.validate`'s rules
about shapes (device count, head and layer divisibility, batch multiples, interleaving)
do not read the settings and its rules about settings (offload needs ZeRO) do not read
the shape, so each shape and each setting is checked once with `validate` and the valid
plans are the product of the valid shapes and the valid settings. Left out as duplicates:
sequence parallelism at tp = 1 (it needs tp > 1), the interleaved schedule with one
chunk (vpp = 1 is 1F1B) and, with flash attention (held off by plan_options'
flash_attention: false), selective recomputation (it re-runs nothing). Sizes range over
divisors; micro_batch, vpp and cp have caps (SearchOptions).
Hybrid sharding (plan.dp_replicate) is tried at the replica counts SearchOptions names, each
shape with replicas only under ZeRO stages >= 1 (its settings are checked per shape group),
and shapes with CP at each CP implementation it names (plan.cp_attention; ulysses-ring at
each all-to-all group size, plan.cp_ulysses; unless named, TE's ring, or for a model with
sliding windows TE's all-gather and Ulysses, the methods TE runs windows with). Each pipeline
is split evenly where its virtual stages divide the layers and, where it differs from that,
balanced (plan.pipeline_split: torchtitan's split, which also reaches pipeline sizes that do
not divide the layers; see _splits for where it is left out). The plan fields the search does
not vary (a framework's options: the FP8 recipe, TP overlap, projections, the pipeline runtime)
hold one value on every plan (SearchOptions.plan_options, `llmsim search --set
plan.FIELD=VALUE`); those that need a setting (recompute_num_layers with full recomputation,
FSDP2's options with ZeRO-3) are checked with each setting, the rest with each shape.

Ranking. Every valid plan is evaluated with the vectorised analytic engine
(simulator.vector), out-of-memory plans are dropped, the rest are ranked by the
objective; the top candidates are then re-evaluated with the graph engine when it is
installed (else they keep their analytic numbers) and re-ranked. The result says which
engine ranked them. With a fixed cluster and price, throughput, cost per token and time
to train give the same order; they differ once the search spans prices (`price_usd_per_device_hour`).
"""

from __future__ import annotations

import itertools
import json
import time
from dataclasses import dataclass, field, replace

import numpy as np
import pandas as pd

from . import schedules
from .cpattention import WINDOW_METHODS
from .errors import InputError
from .evaluate import evaluate
from .hardware import Cluster, cluster_from_dict
from .model import ModelSpec, model_from_dict
from .plan import PRECISIONS, Offload, Plan, check_precision, new_plan, plan_from_dict, validate
from .scenario import Scenario, Training
from .stagesplit import PIPELINE_SPLITS, balanced_layout, plan_stage_layers, rank_layer_kinds
from .table import NESTED, plan_columns
from .vector import evaluate_batch, PlanBatch, SIZES

OBJECTIVES = {  # column, ascending
    "throughput": ("tokens_per_s", False),
    "cost": ("usd_per_million_tokens", True),
    "time-to-train": ("step_time_s", True),
    # with failures, checkpoints and restarts (goodput.py); cost adds energy (energy.py): need tokens
    "time-to-train-all-in": ("time_to_train_days", True),
    "cost-all-in": ("cost_to_train_usd", True),
}
OFFLOADS = {
    "none": Offload(),
    "optimizer-cpu": Offload(optimizer="cpu"),
    "optimizer-params-cpu": Offload(optimizer="cpu", params="cpu"),
    "activations-cpu": Offload(activations="cpu"),
}


@dataclass(frozen=True)
class SearchOptions:
    """What to enumerate. Defaults cover every schedule, recompute mode, ZeRO stage and
    the common offload settings; sizes range over the divisors that validate allows."""

    schedules: tuple = ("1f1b", "interleaved", "zb-h1", "gpipe")
    # With flash attention (the default) selective recomputation re-runs nothing and equals
    # "none" (workload.py), so it is enumerated only when flash_attention is False.
    recompute: tuple = ("none", "selective", "full")
    zero_stages: tuple = (0, 1, 2, 3)
    sequence_parallel: tuple = (False, True)
    offloads: tuple = tuple(OFFLOADS)
    # one precision, or a tuple of them to rank side by side (e.g. ("bf16", "mxfp8", "nvfp4"))
    precision: str | tuple = "bf16"
    max_micro_batch: int = 16
    max_vpp: int = 8
    max_cp: int = 16
    max_ep: int = 256
    # Hybrid-sharding replica counts to try (plan.dp_replicate), each where it divides dp and
    # with ZeRO stages >= 1; (1,): ZeRO over every data-parallel rank only.
    dp_replicates: tuple = (1,)
    # CP implementations to try where cp > 1 (plan.cp_attention; cpattention.py);
    # ulysses-ring at every all-to-all group size (plan.cp_ulysses) from 2 to cp/2 that divides cp.
    # None: TE's ring, or for a model with sliding windows the methods TE runs them with
    # (_default_cp_methods)
    cp_attentions: tuple | None = None
    flash_attention: bool = True
    max_tp: int | None = None  # None: up to the device count
    max_pp: int | None = None
    # Fraction of device memory a plan must leave free (allocator fragmentation, a safety margin).
    memory_headroom: float = 0.0
    # How the layers split over the pipeline's virtual stages: "even" (where they divide) and
    # "balanced", the embedding and the output each weighed as a layer (torchtitan's default,
    # stagesplit.balanced_layout), which also reaches pipeline sizes that do not divide the layers
    pipeline_splits: tuple = ("even", "balanced")
    # Plan fields held at one value on every plan, as a scenario's plan section gives them
    # ((field, value) pairs, e.g. ("fp8_recipe", "current"), ("tp_comm_overlap", True)): the
    # framework and kernel options the search does not vary (any field but SEARCHED's)
    plan_options: tuple = ()


# Plan fields the search enumerates or takes from its own options
SEARCHED = (*SIZES, "schedule", "sequence_parallel", "recompute", "zero_stage", "dp_replicate", "offload",
            "precision", "flash_attention", "cp_attention", "cp_ulysses", "pipeline_split")


def fixed_plan_fields(opts: SearchOptions) -> dict:
    """SearchOptions.plan_options as typed plan fields, read and checked as a scenario's plan
    section is (plan.plan_from_dict); a field the search varies is refused."""
    raw = dict(opts.plan_options)
    for key, value in raw.items():
        if key in SEARCHED:
            raise InputError(f"search plan.{key}", value, "the search varies it: use its own option (--precision, "
                             "--schedule, --recompute, --zero-stage, --dp-replicate, --cp-attention, "
                             "--pipeline-split, --max-tp, --max-pp, --no-offload)")
    plan = plan_from_dict({"dp": 1, "global_batch": 1, **raw})
    return {key: getattr(plan, key) for key in raw}


def _held_flash_attention(opts: SearchOptions) -> SearchOptions:
    """Options whose plan_options' `flash_attention` (`--set plan.flash_attention=false`)
    became the search's own flash_attention, which it holds on every plan (and with which it
    drops selective recomputation)."""
    raw = dict(opts.plan_options)
    if "flash_attention" not in raw:
        return opts
    flash = plan_from_dict({"dp": 1, "global_batch": 1, "flash_attention": raw.pop("flash_attention")})
    return replace(opts, flash_attention=flash.flash_attention, plan_options=tuple(raw.items()))


@dataclass
class SearchResult:
    """Ranked feasible plans (best first) and how they were found."""

    table: pd.DataFrame
    enumerated: int
    valid: int
    feasible: int
    ranked_by: str
    seconds: float
    notes: list = field(default_factory=list)
    objective: str = "throughput"

    def __repr__(self) -> str:
        """The ranked plans as `llmsim search` prints them (every column: `.table`)."""
        from .report import render_search
        return render_search(self)


def _divisors(n: int, limit: int | None = None) -> list[int]:
    return [d for d in range(1, (limit or n) + 1) if n % d == 0 and d <= n]


def _flat(options: dict, prefix: str = "") -> list[str]:
    """`field=value` of each fixed plan field, a section's fields dotted (moe.dispatcher=alltoall)."""
    out = []
    for key, value in sorted(options.items()):
        out += _flat(value, f"{prefix}{key}.") if isinstance(value, dict) else [f"{prefix}{key}={value}"]
    return out


def _shapes(model: ModelSpec, cluster: Cluster, global_batch: int, opts: SearchOptions,
            fixed: dict) -> tuple[list[Plan], int, str]:
    """Valid shapes (as Plans with default settings and the fixed plan fields), how many were
    tried, and the last refusal that named a fixed field."""
    n = cluster.devices
    tried, valid, splits, refusal = 0, [], {}, ""
    for tp in _divisors(n, min(n, opts.max_tp or n)):
        for pp in _divisors(n // tp, min(n // tp, opts.max_pp or n)):
            for cp in _divisors(n // (tp * pp), opts.max_cp):
                dp = n // (tp * pp * cp)
                for mb in _divisors(global_batch, opts.max_micro_batch):
                    for schedule in opts.schedules:
                        vpps = range(2, opts.max_vpp + 1) if schedule == "interleaved" else (1,)
                        for vpp in vpps:
                            if (pp, schedule, vpp) not in splits:
                                splits[pp, schedule, vpp] = _splits(model, pp, schedule, vpp, opts)
                            for sp, split in itertools.product(opts.sequence_parallel, splits[pp, schedule, vpp]):
                                if sp and tp == 1:
                                    continue  # sequence parallelism needs tp > 1: the same plan as sp off
                                for (ep, etp), r, (attention, ulysses) in itertools.product(
                                        _expert_shapes(model, tp, tp * cp * dp, opts), opts.dp_replicates,
                                        _cp_methods(cp, opts, model)):
                                    tried += 1
                                    # a shape with replicas is checked at ZeRO-1, the least stage it needs
                                    plan = new_plan(tp=tp, pp=pp, dp=dp, cp=cp, ep=ep, etp=etp, vpp=vpp, micro_batch=mb,
                                                    global_batch=global_batch, schedule=schedule, sequence_parallel=sp,
                                                    precision=opts.precision, flash_attention=opts.flash_attention,
                                                    dp_replicate=r, zero_stage=int(r > 1), cp_attention=attention,
                                                    cp_ulysses=ulysses, pipeline_split=split, **fixed)
                                    try:  # the options that need a setting are checked with it (_settings)
                                        validate(plan, model, cluster, options=False)
                                    except InputError as e:
                                        refusal = _fixed_refusal(e, fixed) or refusal
                                        continue
                                    valid.append(plan)
    return valid, tried, refusal


def _splits(model: ModelSpec, pp: int, schedule: str, vpp: int, opts: SearchOptions) -> list[str]:
    """The plan.pipeline_split values to try: even where the virtual stages divide the
    layers; balanced where its split differs from that and its middle ranks hold alike
    layers. Where they would not, the pipeline is timed by executing its order plan by plan
    (schedules.Schedule.pipeline_s), too slow for a search; such a plan is evaluated when given."""
    sched = schedules.get(schedule)
    stages = pp * sched.chunks(vpp)
    out = []
    if "even" in opts.pipeline_splits and model.layers % stages == 0:
        out.append("even")
    if "balanced" in opts.pipeline_splits and stages > 1:
        layout = balanced_layout(model.layers, stages)
        if layout is not None and layout != (model.layers // stages,) * stages and \
                len(set(rank_layer_kinds(model, layout, pp, sched)[1:-1])) <= 1:
            out.append("balanced")
    return out


def _default_cp_methods(model: ModelSpec) -> tuple:
    """The CP implementations a search tries unless told: TE's ring (Megatron-Core's and NeMo's
    default), or, where the model has sliding windows, which TE runs under CP by its all-gather
    and all-to-alls only (cpattention.py; plan.py refuses the rings), those two."""
    return WINDOW_METHODS if model.has_sliding_window else ("ring",)


def _cp_methods(cp: int, opts: SearchOptions, model: ModelSpec) -> list[tuple[str, int]]:
    """(cp_attention, cp_ulysses) pairs to try at this CP degree: without CP the implementations
    are one plan; ulysses-ring once per all-to-all group size that leaves a ring of 2 or more."""
    if cp == 1:
        return [((opts.cp_attentions or ("ring",))[0], 1)]
    methods = opts.cp_attentions or _default_cp_methods(model)
    return [(attention, u) for attention in methods
            for u in ([d for d in _divisors(cp, cp // 2) if d > 1] if attention == "ulysses-ring" else [1])]


def _expert_shapes(model: ModelSpec, tp: int, stage_devices: int, opts: SearchOptions) -> list[tuple[int, int]]:
    """(ep, etp) of an MoE model: ep over the divisors of the expert count, etp 1 or tp (the
    choices Megatron-Core's docs compare), ep x etp within a stage's devices; (1, 1) for a
    dense model."""
    if not model.experts:
        return [(1, 1)]
    return [(ep, etp) for etp in sorted({1, tp}) for ep in _divisors(model.experts, opts.max_ep)
            if stage_devices % (ep * etp) == 0]


def _recompute_modes(opts: SearchOptions) -> list[str]:
    return [r for r in opts.recompute if not (r == "selective" and opts.flash_attention)] or list(opts.recompute)


def _settings(model: ModelSpec, cluster: Cluster, shape: Plan, opts: SearchOptions,
              fixed: dict) -> tuple[list[dict], str]:
    """Valid (recompute, zero_stage, offload) settings, checked on one valid shape, and the
    last refusal that named a fixed plan field."""
    out, refusal = [], ""
    for recompute, zero, off in itertools.product(_recompute_modes(opts), opts.zero_stages, opts.offloads):
        if off not in OFFLOADS:
            raise InputError("search.offloads", off, "expected one of " + ", ".join(OFFLOADS))
        setting = dict(recompute=recompute, zero_stage=zero, offload=OFFLOADS[off])
        try:
            validate(replace(shape, **setting), model, cluster)
        except InputError as e:
            refusal = _fixed_refusal(e, fixed) or refusal
            continue
        out.append(setting)
    return out, refusal


def _fixed_refusal(error: InputError, fixed: dict) -> str:
    """The refusal's line where it names a fixed plan field (or a field of one: plan.moe.x), else empty."""
    parts = str(error.field).split(".")
    return str(error) if parts[0] == "plan" and len(parts) > 1 and parts[1] in fixed else ""


def _plan_columns(batch: PlanBatch, model: ModelSpec, cluster: Cluster) -> dict:
    """The resolved-plan columns of simulator.table for a batch."""
    n = len(batch)
    return {k: np.broadcast_to(v, (n,)) if np.ndim(v) == 0 else v
            for k, v in plan_columns(model, cluster, batch).items()}


def _result_columns(d: dict) -> dict:
    out = {}
    for key, value in d.items():
        if key in NESTED:
            out.update({f"{key}.{k}": v for k, v in value.items()})
        elif key not in ("scenario", "flop_convention", "memory_gib_by_stage", "devices", "global_batch", "seq_len",
                         "diagnostics"):
            out[key] = value
    return out


def precisions(opts: SearchOptions) -> tuple:
    """The precisions a search ranks: SearchOptions.precision as a tuple."""
    return (opts.precision,) if isinstance(opts.precision, str) else tuple(opts.precision)


def _evaluate_groups(model: ModelSpec, cluster: Cluster, global_batch: int, opts: SearchOptions,
                     training: Training, reasons: bool) -> tuple[list, int, dict]:
    """[(PlanBatch, evaluate_batch dict)] for every valid plan, grouped by categorical fields,
    how many plans were enumerated, and for each precision the options name the last refusal
    of a shape for a fixed plan field ("" where none)."""
    out, tried, refusals = [], 0, {}
    for precision in precisions(opts):
        groups, n, refusals[precision] = _precision_groups(model, cluster, global_batch,
                                                           replace(opts, precision=precision), training, reasons)
        out, tried = out + groups, tried + n
    return out, tried, refusals


def _precision_groups(model: ModelSpec, cluster: Cluster, global_batch: int, opts: SearchOptions,
                      training: Training, reasons: bool) -> tuple[list, int, str]:
    """_evaluate_groups for the one precision `opts.precision`."""
    fixed = fixed_plan_fields(opts)
    shapes, tried_shapes, refusal = _shapes(model, cluster, global_batch, opts, fixed)
    by_group: dict = {}
    for s in shapes:
        by_group.setdefault((s.schedule, s.sequence_parallel, s.dp_replicate, s.cp_attention, s.cp_ulysses,
                             s.pipeline_split), []).append(s)
    out = []
    for (schedule, sp, r, attention, ulysses, split), members in by_group.items():
        sizes = {k: np.array([getattr(p, k) for p in members], dtype=np.int64) for k in SIZES}
        settings, refused = _settings(model, cluster, members[0], opts, fixed)
        refusal = refused or refusal
        for setting in settings:
            batch = PlanBatch(**sizes, schedule=schedule, sequence_parallel=sp, precision=opts.precision,
                              flash_attention=opts.flash_attention, dp_replicate=r, cp_attention=attention,
                              cp_ulysses=ulysses, pipeline_split=split, **fixed, **setting)
            out.append((batch, evaluate_batch(model, cluster, batch, training, reasons=reasons)))
    tried = tried_shapes * len(_recompute_modes(opts)) * len(opts.zero_stages) * len(opts.offloads)
    return out, tried, refusal


def _frame(model: ModelSpec, cluster: Cluster, batch: PlanBatch, d: dict, rows=None) -> pd.DataFrame:
    cols = {**_plan_columns(batch, model, cluster), **_result_columns(d)}
    n = len(batch)
    cols = {k: np.broadcast_to(v, (n,)) if np.ndim(v) == 0 else np.asarray(v) for k, v in cols.items()}
    if rows is not None:
        cols = {k: v[rows] for k, v in cols.items()}
    return pd.DataFrame(cols)


def evaluate_all(model: ModelSpec, cluster: Cluster, global_batch: int, opts: SearchOptions = SearchOptions(),
                 training: Training = Training()) -> tuple[pd.DataFrame, int]:
    """Every valid plan with its analytic result (one DataFrame row each), and how many plans were enumerated."""
    groups, tried, _ = _evaluate_groups(model, cluster, global_batch, opts, training, reasons=True)
    if not groups:
        return pd.DataFrame(), tried
    return pd.concat([_frame(model, cluster, b, d) for b, d in groups], ignore_index=True), tried


def _offloads(batch: PlanBatch) -> int:
    """How many of the model states and activations a plan offloads."""
    return sum(getattr(batch.offload, k) != "none" for k in ("optimizer", "params", "activations"))


def _ranked_rows(model, cluster, groups: list, column: str, ascending: bool, count: int,
                 headroom: float = 0.0) -> tuple[pd.DataFrame, int]:
    """The `count` best feasible plans as a DataFrame (ties: fewer offloads, then least memory),
    and the feasible count.

    Plans whose numbers are identical (step time, peak memory and cost, bit for bit) are one
    row: the first in enumeration order, with `equivalent_plans` counting them all."""
    def col(key):
        return np.concatenate([np.broadcast_to(np.asarray(d[key], dtype=float), (len(b),)) for b, d in groups])
    feasible = np.concatenate([np.broadcast_to(d["feasible"], (len(b),)) for b, d in groups]).astype(bool)
    gid = np.concatenate([np.full(len(b), g) for g, (b, _) in enumerate(groups)])
    row = np.concatenate([np.arange(len(b)) for b, _ in groups])
    score = col(column) if ascending else -col(column)
    memory = col("peak_memory_gib")
    offloads = np.concatenate([np.full(len(b), _offloads(b)) for b, _ in groups])
    if headroom:
        feasible &= memory <= col("memory_capacity_gib") * (1.0 - headroom)
    keep = np.flatnonzero(feasible)
    if not len(keep):
        return pd.DataFrame(), 0
    numbers = np.stack([col("step_time_s")[keep], memory[keep], col("usd_per_million_tokens")[keep]], axis=1)
    _, first, counts = np.unique(numbers, axis=0, return_index=True, return_counts=True)
    unique = keep[np.sort(first)]
    same = dict(zip(keep[first], counts))
    # ties: the plan that offloads less, then the one that needs less memory
    order = unique[np.lexsort((memory[unique], offloads[unique], score[unique]))][:count]
    frames = []
    for g in np.unique(gid[order]):
        picked = order[gid[order] == g]
        b, d = groups[g]
        frames.append(_frame(model, cluster, b, d, row[picked]).assign(
            _order=[int(np.flatnonzero(order == i)[0]) for i in picked],
            equivalent_plans=[int(same[i]) for i in picked]))
    table = pd.concat(frames, ignore_index=True).sort_values("_order").drop(columns="_order")
    return table.reset_index(drop=True), int(feasible.sum())


def _scenario_of(row, model: ModelSpec, cluster: Cluster, training: Training, fixed: dict | None = None) -> Scenario:
    """The scenario of a ranked table row (its plan columns and the fixed plan fields)."""
    plan = Plan(**(fixed or {}), **{k: int(getattr(row, k)) for k in SIZES},
                **{k: getattr(row, k) for k in ("schedule", "recompute", "precision")},
                sequence_parallel=bool(row.sequence_parallel), zero_stage=int(row.zero_stage),
                dp_replicate=int(row.dp_replicate), cp_attention=row.cp_attention, cp_ulysses=int(row.cp_ulysses),
                offload=Offload(row.offload_optimizer, row.offload_params, row.offload_activations),
                flash_attention=bool(row.flash_attention), pipeline_split=row.pipeline_split)
    return Scenario(model=model, cluster=cluster, plan=plan, training=training)


def search(model: ModelSpec | dict | str, cluster: Cluster | dict, global_batch: int, *,
           objective: str = "throughput", top: int = 10, engine: str = "auto",
           options: SearchOptions = SearchOptions(), training: Training = Training()) -> SearchResult:
    """Rank every valid plan; see the module docstring.

    model: a ModelSpec, a model mapping ({preset: ...} or fields) or a preset name.
    cluster: a Cluster or a cluster mapping ({node: dgx-a100, nodes: 128}).
    engine: "auto" or "graph" (the graph engine re-ranks the top candidates), or "analytic".
    """
    start = time.perf_counter()
    if not isinstance(objective, str) or objective not in OBJECTIVES:
        raise InputError("--objective", objective, "expected one of " + ", ".join(OBJECTIVES))
    if not isinstance(engine, str) or engine not in ("auto", "graph", "analytic"):
        raise InputError("--engine", engine, "expected auto, graph or analytic")
    if isinstance(global_batch, np.integer):
        global_batch = int(global_batch)
    if isinstance(top, np.integer):
        top = int(top)
    if isinstance(global_batch, bool) or not isinstance(global_batch, int) or global_batch < 1:
        raise InputError("--global-batch", global_batch, "expected an integer >= 1")
    if isinstance(top, bool) or not isinstance(top, int) or top < 1:
        raise InputError("--top", top, "expected an integer >= 1")
    if not isinstance(options, SearchOptions):
        raise InputError("options", options, "expected a SearchOptions")
    for split in options.pipeline_splits:
        if split not in PIPELINE_SPLITS:
            raise InputError("search.pipeline_splits", split, "expected one of " + ", ".join(PIPELINE_SPLITS))
    if not 0.0 <= options.memory_headroom < 1.0:
        raise InputError("--memory-headroom", options.memory_headroom, "expected a fraction from 0 to 0.99")
    if not isinstance(training, Training):
        raise InputError("training", training, "expected a Training")
    if objective.endswith("-all-in") and not training.tokens:
        raise InputError("--tokens", training.tokens, f"objective {objective} needs a token budget")
    model = model_from_dict({"preset": model} if isinstance(model, str) else model) \
        if not isinstance(model, ModelSpec) else model
    cluster = cluster_from_dict(cluster) if not isinstance(cluster, Cluster) else cluster

    options = _held_flash_attention(options)
    fixed = fixed_plan_fields(options)
    for precision in precisions(options):
        if precision not in PRECISIONS:
            raise InputError("--precision", precision, "expected one of " + ", ".join(PRECISIONS))
        check_precision(precision, cluster.accelerator)
    groups, tried, refusals = _evaluate_groups(model, cluster, global_batch, options, training, reasons=False)
    held = {**dict(options.plan_options), **({} if options.flash_attention else {"flash_attention": False})}
    notes = [f"every plan: {', '.join(_flat(held))}"] if held else []
    valid = sum(len(b) for b, _ in groups)
    refusal = next((r for r in reversed(refusals.values()) if r), "")
    if valid == 0:
        why = f"refused: {refusal}" if refusal else "check that the global batch is a multiple of some micro_batch*dp"
        return SearchResult(pd.DataFrame(), tried, 0, 0, "analytic", time.perf_counter() - start,
                            [*notes, f"no valid plan: {why}"], objective)
    searched = {b.precision for b, _ in groups}
    notes += [f"no valid plan in {p}" + (f": {refusals[p]}" if refusals[p] else "")
              for p in precisions(options) if p not in searched]
    column, ascending = OBJECTIVES[objective]
    ranked, feasible = _ranked_rows(model, cluster, groups, column, ascending, 3 * top, options.memory_headroom)
    if feasible == 0:
        notes.append("no valid plan fits in memory: try more devices, ZeRO-3, recomputation or offload")
    ranked_by = "analytic"
    if engine in ("auto", "graph") and len(ranked):
        head = ranked.copy()
        results = [evaluate(_scenario_of(r, model, cluster, training, fixed), engine="graph").to_dict()
                   for r in head.itertuples(index=False)]
        redone = pd.DataFrame([_result_columns(r) for r in results])
        for key in redone.columns:
            if key in head.columns:
                head[key] = redone[key].to_numpy()
        head = head[head["feasible"].astype(bool)]
        if options.memory_headroom:
            head = head[head["peak_memory_gib"] <= head["memory_capacity_gib"] * (1 - options.memory_headroom)]
        head = head.assign(_offloads=sum((head[f"offload_{k}"] != "none").astype(int)
                                         for k in ("optimizer", "params", "activations")))
        ranked = head.sort_values([column, "_offloads", "peak_memory_gib"], ascending=[ascending, True, True],
                                  kind="stable").drop(columns="_offloads").reset_index(drop=True)
        ranked_by = f"analytic pre-filter, graph for the top {len(results)}"
    ranked.insert(0, "rank", np.arange(1, len(ranked) + 1))
    table = ranked.head(top).reset_index(drop=True)
    if len(table):  # for the plans shown only (the pre-filter keeps 3 x top)
        table["stage_layers"] = [json.dumps(plan_stage_layers(model, _scenario_of(r, model, cluster, training,
                                                                                  fixed).plan))
                                 for r in table.itertuples(index=False)]
    return SearchResult(table, tried, valid, feasible, ranked_by, time.perf_counter() - start, notes, objective)
