"""Predict the published runs and report the error per source, accelerator, precision and metric.

Each run is compared on what it measured (runs.py: the source's `metrics`), in the source's
own convention: Megatron-LM's achieved TFLOP/s count the recomputation (hardware TFLOP/s),
MFU does not, and both count attention over the full s x s matrix (Narayanan et al. 2021,
Eq. 3), where llmsim's own model FLOPs count the causal half: FLOP-based metrics are
therefore the source's FLOP count over our predicted step time (`published_flop_metrics`).
Iteration and step times are our step time, torchtitan's TPS/GPU are our tokens per second
per device, and its memory is the peak over ranks (our worst pipeline stage). The "speed" metric is each run's primary measurement with its sign
turned so that + means predicted faster than measured; it makes rows that measured
different quantities comparable in one MAPE.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from pathlib import Path

from ..errors import InputError
from ..evaluate import evaluate
from ..hardware import load_accelerator
from ..workload import executed_flops_per_sequence
from .runs import (APPROXIMATED, NOT_EXPRESSIBLE, PREDICTED, PUBLISHED_DIR, SLOWER_WHEN_HIGHER, SPEED_METRICS,
                   Run, load_runs, matching, source_titles)
from .stats import relative_error, summarise

SPEED = "speed"
DIMENSIONS = ("source", "accelerator", "precision")


@dataclass(frozen=True)
class Comparison:
    metric: str
    measured: float
    predicted: float
    primary: bool

    @property
    def error(self) -> float:
        return relative_error(self.measured, self.predicted)

    @property
    def speed_error(self) -> float:
        """+ = predicted faster than measured (the step time's error with its sign turned)."""
        return -self.error if self.metric in SLOWER_WHEN_HIGHER else self.error


@dataclass(frozen=True)
class Outcome:
    run: Run
    comparisons: tuple[Comparison, ...] = ()
    feasible: bool | None = None
    reason: str = ""
    peak_memory_gib: float | None = None

    @property
    def primary(self) -> Comparison | None:
        return next((c for c in self.comparisons if c.primary), None)

    @property
    def false_oom(self) -> bool:
        """The run ran, but llmsim says it does not fit."""
        return self.feasible is False


def with_accelerator(scenario, acc):
    """The scenario on another accelerator profile (a fitted or transferred number changed)."""
    return replace(scenario, cluster=replace(scenario.cluster, accelerator=acc))


def with_matmul_max(scenario, matmul_max: float):
    """The scenario on an accelerator whose matmul efficiency `max` is replaced (for fits)."""
    acc = scenario.cluster.accelerator
    return with_accelerator(scenario, replace(acc, matmul=replace(acc.matmul, max=matmul_max)))


def with_launch_overhead(scenario, seconds: float):
    """The scenario on a node whose host launch overhead is replaced (for fits)."""
    node = replace(scenario.cluster.node, launch_overhead_s=seconds)
    return replace(scenario, cluster=replace(scenario.cluster, node=node))


def predict(run: Run, engine: str = "graph", matmul_max: float | None = None, adjust=None) -> Outcome:
    """Evaluate one run's scenario and compare every measurement it has. `adjust`: a function
    changing the scenario (a fitted profile number) before it is evaluated."""
    if run.status == NOT_EXPRESSIBLE:
        return Outcome(run)
    scenario = run.build()
    if matmul_max is not None:
        scenario = with_matmul_max(scenario, matmul_max)
    if adjust is not None:
        scenario = adjust(scenario)
    d = evaluate(scenario, engine=engine).to_dict()
    return Outcome(run, compare(run, scenario, d), d["feasible"], d["reason"], d["peak_memory_gib"])


def compare(run: Run, scenario, result: dict) -> tuple[Comparison, ...]:
    """Each measurement of `run` beside the prediction `result` (evaluate's dict for
    `scenario`), in the source's convention (published_flop_metrics)."""
    d = {**result, **published_flop_metrics(scenario, result["step_time_s"])}
    return tuple(Comparison(m.metric, m.value, float(d[m.metric]), m.primary) for m in run.measurements)


def published_flop_metrics(scenario, step_time_s: float) -> dict:
    """TFLOP/s per device, MFU and HFU with Megatron-LM's FLOP count (full s x s attention; with
    the recomputed forward passes for the hardware figures): what the kernels of the unfused
    attention path execute (workload.executed_flops_per_sequence with flash_attention=False)."""
    model, plan, cluster = scenario.model, scenario.plan, scenario.cluster
    per_device = plan.global_batch / step_time_s / cluster.devices
    model_flops = executed_flops_per_sequence(model, False, "none") * per_device
    hardware_flops = executed_flops_per_sequence(model, False, plan.recompute) * per_device
    peak = cluster.accelerator.peak(plan.precision)
    return {"model_tflops_per_device": model_flops / 1e12, "hardware_tflops_per_device": hardware_flops / 1e12,
            "mfu": model_flops / peak, "hfu": hardware_flops / peak}


def _metric_errors(outcomes, metric: str) -> list[tuple[str, float]]:
    if metric == SPEED:
        return [(o.run.id, o.primary.speed_error) for o in outcomes
                if o.primary is not None and o.primary.metric in SPEED_METRICS]
    return [(o.run.id, c.error) for o in outcomes for c in o.comparisons if c.metric == metric]


def summaries(outcomes: list[Outcome]) -> list[dict]:
    """Summary rows {by, group, metric, n, mape_pct, signed_mean_pct, worst_id, worst_error_pct}
    over all compared outcomes and per source, accelerator and precision, for the speed metric
    (with `false_oom`: runs that ran but are predicted not to fit) and every measured metric."""
    done = [o for o in outcomes if o.comparisons]
    groups = [("all", "all", done)]
    for dim in DIMENSIONS:
        for value in dict.fromkeys(getattr(o.run, dim) for o in done):
            groups.append((dim, value, [o for o in done if getattr(o.run, dim) == value]))
    out = []
    for by, group, members in groups:
        metrics = [SPEED] + list(dict.fromkeys(c.metric for o in members for c in o.comparisons))
        for metric in metrics:
            s = summarise(_metric_errors(members, metric))
            if s.n:
                entry = {"by": by, "group": group, "metric": metric, **s.to_dict()}
                if metric == SPEED:
                    entry["false_oom"] = sum(o.false_oom for o in members)
                out.append(entry)
    return out


def validate_published(engine: str = "graph", folder: Path = PUBLISHED_DIR, approximate: bool = False,
                       transferred: bool = False, only: str | None = None) -> dict:
    """Predict every published run; the report `llmsim validate --published --json` prints.
    `transferred`: each run on its profile as the transfer rules would give it from another
    fitted profile (transfer.py), how far a transfer misses. `only`: the runs it names
    (runs.matching: sources or id prefixes, and a precision)."""
    from .transfer import with_transferred

    runs = load_runs(folder, approximate=approximate)
    if only is not None:
        runs = matching(runs, only)
        if not runs:
            raise InputError("--only", only, "names no published run: SOURCE or ID-PREFIX[,...][:PRECISION] "
                             "(sources: " + ", ".join(source_titles(folder)) + ")")
    outcomes = [predict(r, engine, adjust=with_transferred if transferred else None) for r in runs]
    predicted = [o for o in outcomes if o.run.status == PREDICTED]
    report = {
        "engine": engine,
        "approximate": approximate,
        "transferred": transferred,
        "only": only,
        "error": "(predicted - measured) / measured; speed: the primary measurement of each row, + = predicted "
                 "faster than measured",
        "counts": _counts(outcomes),
        "sources": _sources(outcomes, folder),
        "accelerators": _accelerators(outcomes),
        "summary": [{"set": "expressible", **s} for s in summaries(predicted)],
        "not_expressible": _not_expressible(outcomes),
        "rows": [_row(o) for o in outcomes],
    }
    if approximate:
        report["summary"] += [{"set": "with-approximations", **s}
                              for s in summaries([o for o in outcomes if o.comparisons])]
    overall = next((s for s in report["summary"] if s["by"] == "all" and s["metric"] == SPEED), None)
    report["mape_pct"] = overall["mape_pct"] if overall else None
    return report


def _counts(outcomes) -> dict:
    return {"rows": len(outcomes),
            PREDICTED: sum(o.run.status == PREDICTED for o in outcomes),
            APPROXIMATED: sum(o.run.status == APPROXIMATED for o in outcomes),
            NOT_EXPRESSIBLE: sum(o.run.status == NOT_EXPRESSIBLE for o in outcomes),
            "false_oom": sum(o.false_oom for o in outcomes)}


def _sources(outcomes, folder) -> dict:
    titles = source_titles(folder)
    out = {}
    for key in dict.fromkeys(o.run.source for o in outcomes):
        mine = [o for o in outcomes if o.run.source == key]
        title, framework = titles.get(key, ("", ""))
        out[key] = {"title": title, "framework": framework, "file": mine[0].run.file, **_counts(mine)}
    return out


def _accelerators(outcomes) -> dict:
    """Whether each accelerator profile's efficiencies were checked against runs, and why not."""
    out = {}
    for name in dict.fromkeys(o.run.accelerator for o in outcomes):
        try:
            v = load_accelerator(name).validation
        except InputError:  # a missing profile is already a row's reason
            v = None
        out[name] = {"validated": v.validated if v else None, "reason": v.reason if v else ""}
    return out


def _not_expressible(outcomes) -> dict:
    """feature -> {reason, rows}: why the rows llmsim cannot express today are not predicted."""
    out: dict = {}
    for o in outcomes:
        if o.run.status == PREDICTED:
            continue
        for name, why in o.run.reasons:
            entry = out.setdefault(name, {"reason": why, "rows": []})
            entry["rows"].append(o.run.id)
    return out


def _num(x):
    return None if x is None or (isinstance(x, float) and not math.isfinite(x)) else x


def _row(o: Outcome) -> dict:
    r = o.run
    row = {"id": r.id, "file": r.file, "source": r.source, "framework": r.framework, "accelerator": r.accelerator,
           "precision": r.precision, "status": r.status,
           "reasons": [{"feature": f, "reason": why} for f, why in r.reasons],
           "assumptions": list(r.assumptions), "approximations": list(r.approximations),
           "feasible": o.feasible, "false_oom": o.false_oom, "infeasible_reason": o.reason,
           "peak_memory_gib": _num(o.peak_memory_gib),
           "comparisons": [{"metric": c.metric, "measured": c.measured, "predicted": _num(c.predicted),
                            "error_pct": _num(100 * c.error), "primary": c.primary} for c in o.comparisons]}
    p = o.primary
    m = r.primary
    # The primary comparison at the top level, as `llmsim plot --kind scatter` reads it.
    row.update(metric=m.metric, measured=m.value, predicted=_num(p.predicted) if p else None,
               error_pct=_num(100 * p.error) if p else None, speed_error_pct=_num(100 * p.speed_error) if p else None)
    return row


# ---------------------------------------------------------------- human-readable report

def _table(rows: list[tuple], header: tuple) -> str:
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows)]
    line = lambda cells: "  ".join(str(c).ljust(w) for c, w in zip(cells, widths)).rstrip()
    return "\n".join([line(header), line(tuple("-" * w for w in widths))] + [line(r) for r in rows])


def _pct(x) -> str:
    return "" if x is None else f"{x:+.1f}%"


def format_report(report: dict) -> str:
    """The text `llmsim validate --published` prints."""
    c = report["counts"]
    only = f" named by {report['only']!r}" if report.get("only") else ""
    out = [f"Published runs{only}: {c['rows']} rows; {c['predicted']} predicted, {c['approximated']} approximated "
           f"(--approximate), {c['not_expressible']} not expressible today ({report['engine']} engine).",
           "error = (predicted - measured) / measured; speed = each row's primary measurement, "
           "+ = predicted faster.", ""]
    if report.get("transferred"):
        out[-1:-1] = ["--transferred: every profile's efficiencies as transferred from another fitted profile "
                      "(simulator/validation/transfer.py): how far a transfer misses, not the fits."]
    rows = []
    for r in report["rows"]:
        if r["status"] == NOT_EXPRESSIBLE:
            continue
        flags = ("approx " if r["status"] == APPROXIMATED else "") + ("OOM" if r["false_oom"] else "")
        for cmp in r["comparisons"]:
            rows.append((r["id"] if cmp["primary"] else "", r["source"] if cmp["primary"] else "",
                         r["accelerator"] if cmp["primary"] else "", r["precision"] if cmp["primary"] else "",
                         cmp["metric"], f"{cmp['measured']:.4g}", f"{cmp['predicted']:.4g}", _pct(cmp["error_pct"]),
                         flags if cmp["primary"] else ""))
    out += [_table(rows, ("run", "source", "accelerator", "precision", "metric", "measured", "predicted", "error",
                          "")), ""]
    if report["not_expressible"]:
        out.append(f"Not expressible today ({c['not_expressible']} rows; --approximate predicts those with a "
                   "fallback, reported apart):")
        for name, entry in report["not_expressible"].items():
            out.append(f"  {name} ({len(entry['rows'])} rows): {entry['reason']}")
            out.append("    " + ", ".join(entry["rows"]))
        out.append("")
    for title, subset in (("expressible rows", "expressible"), ("rows incl. approximated", "with-approximations")):
        summary = [s for s in report["summary"] if s["set"] == subset]
        if not summary:
            continue
        for by in ("all",) + DIMENSIONS:
            rows = [(s["group"] if by != "all" else "all", s["metric"], s["n"], f"{s['mape_pct']:.1f}%",
                     _pct(s["signed_mean_pct"]), f"{s['worst_id']} {_pct(s['worst_error_pct'])}",
                     s.get("false_oom") or "")
                    for s in summary if s["by"] == by]
            out += [f"Error by {by if by != 'all' else 'metric'} ({title}):",
                    _table(rows, (by, "metric", "n", "MAPE", "signed mean", "worst row", "false OOM")), ""]
    unvalidated = {k: v for k, v in report["accelerators"].items() if v["validated"] is False}
    if unvalidated:
        out.append("Accelerator profiles not validated against runs:")
        out += [f"  {k}: {v['reason']}" for k, v in unvalidated.items()]
        out.append("")
    if report["mape_pct"] is not None:
        out.append(f"MAPE {report['mape_pct']:.1f}% (speed) over {c['predicted']} expressible published runs.")
    return "\n".join(out)
