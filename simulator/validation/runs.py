"""Published runs (scenarios/published/*.csv) as scenarios, with what each measured.

Each CSV is an unchanged copy of a file of shared/validation and has a supplement
(supplement*.yaml naming it) that fills what the table leaves blank, each with its source.
Three column layouts exist: `table` (published-runs.csv, more-runs.csv: one column per
quantity, some in free text), `scenario` (nemo-dgxc-h100.csv: the scenario's own field
names plus `metric` and `measured`) and `moe` (moe-runs.csv: columns named for what they
mean, the MoE shape, ep and etp, the token dispatcher; `metric` and `measured`).

A supplement groups rows into sources by id prefix:

    file: more-runs.csv
    format: table
    sources:
      - key: vtrain                # the source's name in reports
        match: vtrain_             # rows whose id starts with it
        title: ..., framework: ...
        scenario: {model: {...}, cluster: {...}, plan: {...}}   # for every row of the source
        features: {name: value}    # features.py: what the scenario may not say
        metrics: {measured_iter_time_s: step_time_s}   # compared; the first is the row's primary
        not_compared: {column: why}                    # measured but deliberately not compared
        provenance: {field: where it comes from}
    rows:
      <id>: {scenario: {...}, features: {...}, assumptions: [...], provenance: {...}}

Nothing is dropped or approximated silently: a row no source matches, a measured column
neither compared nor excused, or a free-text cell nothing resolves is an error; a row
needing a feature llmsim cannot express is kept with its reasons (features.py).
"""

from __future__ import annotations

import copy
import csv
import difflib
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

from .. import fields as F
from ..errors import InputError
from ..hardware import available, load_node
from ..model import ACTIVATIONS
from ..plan import PRECISIONS, RECOMPUTE
from ..resources import data_dir
from ..scenario import Scenario, scenario_from_dict
from ..yamlio import load_yaml
from .features import feature

PUBLISHED_DIR = data_dir() / "scenarios" / "published"
PUBLISHED_NAME = "published/"  # how a run is named where a scenario is expected: published/<row id>
FORMATS = ("table", "scenario", "moe")

# llmsim metric (a key of `evaluate --json`) of each measured column of the table layout,
# and the factor from the column's unit to the metric's.
METRIC_KEYS = ("step_time_s", "tokens_per_s_per_device", "hardware_tflops_per_device",
               "model_tflops_per_device", "mfu", "hfu", "peak_memory_gib", "peak_reserved_gib")
PERCENT_COLUMNS = ("measured_mfu_pct", "measured_hfu_pct")
# Speed metrics: higher is faster except for the step time.
SLOWER_WHEN_HIGHER = ("step_time_s",)
SPEED_METRICS = ("step_time_s", "tokens_per_s_per_device", "hardware_tflops_per_device",
                 "model_tflops_per_device", "mfu", "hfu")

PREDICTED, APPROXIMATED, NOT_EXPRESSIBLE = "predicted", "approximated", "not_expressible"


@dataclass(frozen=True)
class Measurement:
    metric: str  # a key of `llmsim evaluate --json`
    value: float  # in the metric's unit (fractions for mfu/hfu)
    column: str  # where the table holds it
    primary: bool  # the row's headline measurement (first of the source's metrics)


@dataclass(frozen=True)
class Run:
    """One published row: its scenario (if expressible) and what it measured."""

    id: str
    file: str
    source: str
    title: str  # the source's
    framework: str
    accelerator: str
    precision: str  # bf16, fp16, fp8-delayed, fp8-tensorwise, fp8-rowwise, ...
    measurements: tuple[Measurement, ...]
    status: str  # predicted | approximated | not_expressible
    reasons: tuple[tuple[str, str], ...] = ()  # (feature, why) llmsim cannot express
    assumptions: tuple[str, ...] = ()  # equivalent mappings used, stated
    approximations: tuple[str, ...] = ()  # non-equivalent fallbacks (--approximate only)
    scenario: Mapping | None = None  # the scenario mapping; None when not expressible
    provenance: tuple[tuple[str, str], ...] = ()  # (field, where its value comes from): the supplement's

    @property
    def primary(self) -> Measurement:
        return next(m for m in self.measurements if m.primary)

    def build(self) -> Scenario:
        return scenario_from_dict(copy.deepcopy(dict(self.scenario)))


@dataclass(frozen=True)
class Source:
    key: str
    match: str
    title: str
    framework: str
    scenario: Mapping
    features: Mapping
    metrics: Mapping  # column -> metric, in order; the first is primary
    not_compared: Mapping
    provenance: Mapping  # scenario field -> where its value comes from


# ---------------------------------------------------------------- the two column layouts

def _cell(row: Mapping, key: str) -> str:
    return (row.get(key) or "").strip()


def _int(row: Mapping, key: str, rid: str):
    v = _cell(row, key)
    if not v:
        return None
    try:
        return int(v)
    except ValueError:
        raise InputError(f"{rid}.{key}", v, "expected an integer") from None


def _bool(row: Mapping, key: str, rid: str, true=("true", "yes"), false=("false", "no")):
    v = _cell(row, key).lower()
    if not v:
        return None
    if v in true or v in false:
        return v in true
    raise InputError(f"{rid}.{key}", v, "expected " + "/".join(true + false))


def _table_scenario(row: Mapping, rid: str) -> tuple[dict, dict]:
    """(scenario, unresolved): the fields of a published-runs/more-runs row; free-text cells
    that are not llmsim values are returned as unresolved, for the supplement to settle."""
    model = {"name": rid}
    for key in ("layers", "hidden", "heads", "kv_heads", "ffn_hidden", "vocab", "seq_len"):
        if (v := _int(row, key, rid)) is not None:
            model[key] = v
    plan = {}
    for key in ("tp", "pp", "dp", "cp", "vpp", "micro_batch", "global_batch", "zero_stage"):
        if (v := _int(row, key, rid)) is not None:
            plan[key] = v
    if (sp := _bool(row, "seq_parallel", rid)) is not None:
        plan["sequence_parallel"] = sp
    unresolved = {}
    for column, section, key, allowed in (("activation", model, "activation", ACTIVATIONS),
                                          ("recompute", plan, "recompute", RECOMPUTE),
                                          ("precision", plan, "precision", PRECISIONS)):
        v = _cell(row, column)
        if v in allowed:
            section[key] = v
        else:
            unresolved[f"{'model' if section is model else 'plan'}.{key}"] = v
    offload = _cell(row, "offload")
    if offload not in ("", "none"):
        unresolved["plan.offload"] = offload
    gpus, per_node = _int(row, "num_gpus", rid), _int(row, "gpus_per_node", rid)
    if gpus < per_node:  # a run on part of one node
        cluster = {"nodes": 1, "devices_per_node": gpus}
    elif gpus % per_node:
        raise InputError(f"{rid}.num_gpus", gpus, f"expected a multiple of gpus_per_node={per_node}")
    else:
        cluster = {"nodes": gpus // per_node, "devices_per_node": per_node}
    if plan.get("vpp", 1) > 1:
        plan["schedule"] = "interleaved"
    return {"name": rid, "model": model, "plan": plan, "cluster": cluster}, unresolved


_SCENARIO_COLUMNS = {
    "cluster": (("accelerator", str), ("node", str), ("nodes", int), ("devices_per_node", int)),
    "model": (("layers", int), ("hidden", int), ("heads", int), ("kv_heads", int), ("ffn_hidden", int),
              ("vocab", int), ("seq_len", int), ("activation", str), ("tied_embeddings", bool)),
    "plan": (("tp", int), ("pp", int), ("dp", int), ("cp", int), ("vpp", int), ("schedule", str),
             ("micro_batch", int), ("global_batch", int), ("sequence_parallel", bool), ("recompute", str),
             ("zero_stage", int), ("precision", str), ("tp_comm_overlap", bool), ("dp_overlap", bool),
             ("grad_precision", str)),
}


def _scenario_layout(row: Mapping, rid: str) -> tuple[dict, dict]:
    """(scenario, {}): a nemo-dgxc-h100.csv row, whose columns are the scenario's fields."""
    out = {"name": rid, "model": {"name": rid}, "plan": {}, "cluster": {}}
    for section, columns in _SCENARIO_COLUMNS.items():
        for key, kind in columns:
            if kind is int:
                v = _int(row, key, rid)
            elif kind is bool:
                v = _bool(row, key, rid)
            else:
                v = _cell(row, key) or None
            if v is not None:
                out[section][key] = v
    return out, {}


_MOE_COLUMNS = {
    "model": ("layers", "hidden", "heads", "kv_heads", "head_dim", "vocab", "seq_len", "experts", "top_k",
              "expert_ffn_hidden", "shared_experts", "shared_expert_ffn_hidden", "dense_layers", "dense_ffn_hidden",
              "moe_layer_freq"),
    "plan": ("tp", "pp", "vpp", "dp", "cp", "ep", "etp", "micro_batch", "global_batch"),
}


def _dispatcher(text: str) -> dict | None:
    """plan.moe of a `dispatcher` cell: alltoall | allgather, optionally -capacity<factor>
    and -padded (moe-runs.md); None for anything else."""
    parts = text.split("-")
    out = {"dispatcher": parts[0]}
    for part in parts[1:]:
        if part.startswith("capacity"):
            try:
                out["capacity_factor"] = float(part[len("capacity"):])
            except ValueError:
                return None
        elif part == "padded":
            out["pad_to_capacity"] = True
        else:
            return None
    return out if parts[0] in ("alltoall", "allgather") else None


def _moe_layout(row: Mapping, rid: str) -> tuple[dict, dict]:
    """(scenario, unresolved): a moe-runs.csv row. Zero widths of absent parts (shared
    experts, dense layers) are left out; free-text cells (recompute, dispatcher) that are
    not llmsim values are returned as unresolved."""
    model = {"name": rid}
    for key in _MOE_COLUMNS["model"]:
        v = _int(row, key, rid)
        if v is not None and not (v == 0 and key.endswith("ffn_hidden")):
            model[key] = v
    for key in ("activation", "attention"):
        if _cell(row, key):
            model[key] = _cell(row, key)
    plan = {k: v for k in _MOE_COLUMNS["plan"] if (v := _int(row, k, rid)) is not None}
    plan["precision"] = _cell(row, "precision")
    if plan.get("vpp", 1) > 1:
        plan["schedule"] = "interleaved"
    unresolved = {}
    if _cell(row, "recompute") in RECOMPUTE:
        plan["recompute"] = _cell(row, "recompute")
    else:
        unresolved["plan.recompute"] = _cell(row, "recompute")
    moe = _dispatcher(_cell(row, "dispatcher"))
    if moe is None:
        unresolved["plan.moe"] = _cell(row, "dispatcher")
    else:
        plan["moe"] = moe
    gpus, per_node = _int(row, "gpus", rid), _int(row, "gpus_per_node", rid)
    cluster = {"accelerator": _cell(row, "accelerator"), "nodes": max(1, gpus // per_node),
               "devices_per_node": min(gpus, per_node)}
    return {"name": rid, "model": model, "plan": plan, "cluster": cluster}, unresolved


# ---------------------------------------------------------------- supplements

def _merge(base: dict, extra: Mapping, where: str) -> None:
    """Merge `extra` ({model: {...}, plan: {...}, cluster: {...}}) into `base`."""
    F.reject_unknown(extra, ("model", "plan", "cluster"), where)
    for section, values in extra.items():
        target = base.setdefault(section, {})
        for key, value in F.require_mapping(values, f"{where}.{section}").items():
            if isinstance(value, Mapping) and isinstance(target.get(key), Mapping):  # plan.moe, plan.offload
                target[key] = {**target[key], **value}
            else:
                target[key] = value


def _source(data: Mapping, where: str) -> Source:
    F.reject_unknown(data, ("key", "match", "title", "framework", "scenario", "features", "metrics",
                            "not_compared", "provenance"), where)
    metrics = dict(F.require_mapping(data.get("metrics") or {}, f"{where}.metrics"))
    for column, metric in metrics.items():
        if metric not in METRIC_KEYS:
            raise InputError(f"{where}.metrics.{column}", metric, "known: " + ", ".join(METRIC_KEYS))
    return Source(key=F.text(data, "key", where), match=F.text(data, "match", where),
                  title=F.text(data, "title", where, ""), framework=F.text(data, "framework", where),
                  scenario=F.require_mapping(data.get("scenario") or {}, f"{where}.scenario"),
                  features=F.require_mapping(data.get("features") or {}, f"{where}.features"),
                  metrics=metrics,
                  not_compared=F.require_mapping(data.get("not_compared") or {}, f"{where}.not_compared"),
                  provenance=F.require_mapping(data.get("provenance") or {}, f"{where}.provenance"))


def _measurements(row: Mapping, fmt: str, src: Source, rid: str) -> tuple[Measurement, ...]:
    if fmt != "table":
        metric = _cell(row, "metric")
        if metric not in METRIC_KEYS:
            raise InputError(f"{rid}.metric", metric, "known: " + ", ".join(METRIC_KEYS))
        return (Measurement(metric, float(_cell(row, "measured")), "measured", True),)
    out = []
    for column in (k for k in row if k.startswith("measured_") and _cell(row, k)):
        if column in src.not_compared:
            continue
        if column not in src.metrics:
            raise InputError(f"{rid}.{column}", _cell(row, column),
                             f"source {src.key} neither compares it (metrics) nor says why not (not_compared)")
    for column, metric in src.metrics.items():
        v = _cell(row, column)
        if v:
            scale = 0.01 if column in PERCENT_COLUMNS else 1.0
            out.append(Measurement(metric, float(v) * scale, column, primary=not out))
    if not out:
        raise InputError(rid, "", f"no measured value among {', '.join(src.metrics)}")
    return tuple(out)


def _accelerator(scenario: Mapping) -> str:
    cluster = scenario.get("cluster", {})
    if cluster.get("accelerator"):
        return cluster["accelerator"]
    return load_node(cluster["node"]).accelerator


def _precision_label(scenario: Mapping, features: Mapping) -> str:
    fp8 = features.get("fp8-linears") or features.get("fp8-moe-linears")
    if fp8:
        return "fp8-" + (fp8.get("recipe") if isinstance(fp8, Mapping) else str(fp8))
    return scenario.get("plan", {}).get("precision", "bf16")


def map_row(row: Mapping, fmt: str, src: Source, extra: Mapping, file: str, approximate: bool = False) -> Run:
    """One CSV row -> Run: the scenario, the features it needs and what it measured."""
    rid = row["id"]
    where = f"{file} supplement rows.{rid}"
    F.reject_unknown(extra, ("scenario", "features", "assumptions", "provenance"), where)
    scenario, unresolved = {"table": _table_scenario, "scenario": _scenario_layout, "moe": _moe_layout}[fmt](row, rid)
    _merge(scenario, src.scenario, f"{file} supplement {src.key}.scenario")
    _merge(scenario, F.require_mapping(extra.get("scenario") or {}, where), f"{where}.scenario")
    features = {**src.features, **F.require_mapping(extra.get("features") or {}, f"{where}.features")}
    reasons, approximations = [], []
    assumptions = [str(a) for a in extra.get("assumptions") or ()]
    for name, value in features.items():
        if value is False or value is None:
            continue
        f = feature(name)
        if f.supported():
            f.apply(scenario, value)
        elif f.equivalent:
            assumptions.append(f.fallback(scenario, value))
        else:
            reasons.append((name, f.reason))
            if approximate and f.fallback is not None:
                approximations.append(f.fallback(scenario, value))
    accelerator = _accelerator(scenario)
    if accelerator not in available("accelerators"):
        reasons.append(("hardware-profile", f"no accelerator profile {accelerator!r} in hardware_profiles/"))
    approximable = approximate and reasons and len(approximations) == len(reasons)
    status = PREDICTED if not reasons else APPROXIMATED if approximable else NOT_EXPRESSIBLE
    # A free-text cell is settled when the supplement or a feature gave its field a value.
    unresolved = {k: v for k, v in unresolved.items() if k.split(".")[1] not in scenario.get(k.split(".")[0], {})}
    if status != NOT_EXPRESSIBLE:
        if unresolved:
            dotted, value = next(iter(unresolved.items()))
            raise InputError(f"{rid}.{dotted}", value, "free text the supplement does not resolve: give "
                             f"scenario.{dotted} or a feature for it")
        if scenario["plan"].get("precision") == "fp8" and not {"fp8-linears", "fp8-moe-linears"} & set(features):
            raise InputError(f"{rid}.plan.precision", "fp8", "an FP8 run names its recipe: features: "
                             "{fp8-linears: {recipe: delayed|tensorwise|rowwise}}")
        try:
            scenario_from_dict(copy.deepcopy(scenario))
        except InputError as exc:
            reasons.append(("scenario-rejected", str(exc)))
            status = NOT_EXPRESSIBLE
    return Run(id=rid, file=file, source=src.key, title=src.title, framework=src.framework,
               accelerator=accelerator, precision=_precision_label(scenario, features),
               measurements=_measurements(row, fmt, src, rid),
               status=status, reasons=tuple(reasons), assumptions=tuple(assumptions),
               approximations=tuple(approximations) if status == APPROXIMATED else (),
               scenario=scenario if status != NOT_EXPRESSIBLE else None,
               provenance=tuple((str(k), " ".join(str(v).split())) for k, v in {
                   **src.provenance,
                   **F.require_mapping(extra.get("provenance") or {}, f"{where}.provenance")}.items()))


def read_csv(path: Path) -> list[dict]:
    with path.open(newline="", encoding="utf-8") as fh:
        return list(csv.DictReader(fh))


def load_supplement(path: Path) -> tuple[str, str, list[Source], Mapping]:
    """(csv file name, format, sources, rows) of one supplement."""
    where = path.name
    data = F.require_mapping(load_yaml(path, where), where)
    F.reject_unknown(data, ("file", "format", "sources", "rows"), where)
    fmt = F.choice(data, "format", where, FORMATS)
    sources = [_source(F.require_mapping(s, f"{where}.sources"), f"{where}.sources[{i}]")
               for i, s in enumerate(data.get("sources") or [])]
    if not sources:
        raise InputError(f"{where}.sources", None, "at least one source")
    return F.text(data, "file", where), fmt, sources, F.require_mapping(data.get("rows") or {}, f"{where}.rows")


def source_of(rid: str, sources: list[Source], file: str) -> Source:
    found = [s for s in sources if rid.startswith(s.match)]
    if len(found) != 1:
        raise InputError(f"{file} row", rid, f"must match exactly one source prefix of its supplement "
                         f"({', '.join(s.match for s in sources)})")
    return found[0]


def load_runs(folder: Path = PUBLISHED_DIR, approximate: bool = False) -> list[Run]:
    """Every row of every CSV in `folder`, in file and row order. Each CSV needs a supplement."""
    folder = Path(folder)
    supplements = {}
    for path in sorted(folder.glob("supplement*.yaml")):
        file, fmt, sources, rows = load_supplement(path)
        supplements[file] = (fmt, sources, rows)
    runs = []
    for path in sorted(folder.glob("*.csv")):
        if path.name not in supplements:
            raise InputError("published", path.name, "every CSV needs a supplement*.yaml naming it (file:)")
        fmt, sources, extras = supplements.pop(path.name)
        rows = read_csv(path)
        ids = [r["id"] for r in rows]
        for rid in extras:
            if rid not in ids:
                raise InputError(f"{path.name} supplement rows", rid, "no such row in the CSV")
        for row in rows:
            src = source_of(row["id"], sources, path.name)
            extra = F.require_mapping(extras.get(row["id"]) or {}, f"{path.name} supplement rows")
            runs.append(map_row(row, fmt, src, extra, path.name, approximate))
    if supplements:
        raise InputError("published", ", ".join(supplements), "a supplement names a CSV that is not there")
    if not runs:
        raise InputError("published", str(folder), "no published runs (CSV files with supplements) found")
    return runs


def matching(runs: list[Run], spec: str) -> list[Run]:
    """The runs `spec` names: `NAME[,NAME...][:PRECISION]`, each NAME a source or the start of
    run ids, PRECISION a precision label (`vtrain`, `dgxc-:bf16`, `tt_t1_,tt_t3_:bf16`,
    `:fp8-rowwise`: no NAME is every source)."""
    names, _, precision = spec.partition(":")
    names = tuple(n for n in names.split(",") if n)
    return [r for r in runs if (not names or r.source in names or r.id.startswith(names))
            and (not precision or r.precision == precision)]


def is_published_name(ref) -> bool:
    """`ref` names a published run (published/<row id>) rather than a file: no file of that
    name is there."""
    return isinstance(ref, str) and ref.startswith(PUBLISHED_NAME) and not Path(ref).exists()


def published_run(name: str, folder: Path = PUBLISHED_DIR) -> Run:
    """The published run `name` (`published/<row id>`, or the row id alone), for evaluating it
    by name (scenario.read_scenario) or showing its scenario (`llmsim scenarios show`)."""
    rid = name[len(PUBLISHED_NAME):] if name.startswith(PUBLISHED_NAME) else name
    runs = {r.id: r for r in load_runs(folder)}
    if rid not in runs:
        near = difflib.get_close_matches(rid, list(runs), n=3)
        hint = f"did you mean {', '.join(PUBLISHED_NAME + n for n in near)}?" if near else \
            "`llmsim scenarios list --published` lists them"
        raise InputError("scenario", name, f"no published run {rid!r}: {hint}")
    return runs[rid]


def published_scenario(name: str, folder: Path = PUBLISHED_DIR) -> dict:
    """The scenario mapping of a published run, named by its row id (run_scenario)."""
    return run_scenario(published_run(name, folder))


def run_scenario(run: Run) -> dict:
    """A copy of the run's scenario mapping; InputError naming what llmsim cannot express where
    the run is not expressible."""
    if run.scenario is None:
        raise InputError("scenario", PUBLISHED_NAME + run.id, "llmsim cannot express this run: "
                         + "; ".join(f"{f}: {why}" for f, why in run.reasons))
    return copy.deepcopy(dict(run.scenario))


def source_titles(folder: Path = PUBLISHED_DIR) -> dict[str, tuple[str, str]]:
    """source key -> (title, framework), in supplement order."""
    out = {}
    for path in sorted(Path(folder).glob("supplement*.yaml")):
        for s in load_supplement(path)[2]:
            out[s.key] = (s.title, s.framework)
    return out
