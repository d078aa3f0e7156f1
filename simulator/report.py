"""The readable reports of `llmsim evaluate` and `llmsim compare`.

`render_result` prints one result: the scenario, a per-stage memory table, host RAM and
NVMe per node when the plan offloads, and then either the step time, throughput and cost
of a plan that fits, or, for one that does not, why and which small changes would make it
fit (`nearest_fits`, evaluated with the analytic engine). Step time and cost of a plan
that does not fit are never shown as if they were results.
"""

from __future__ import annotations

import itertools
import json
import math
from dataclasses import fields, is_dataclass, replace

from .domain import describe
from .errors import InputError
from .result import MEMORY_KEYS
from .stagesplit import plan_stage_layers, uneven

GIB = 2**30


def fmt_table(rows: list[tuple], header: tuple) -> str:
    cols = [header] + [tuple(str(c) for c in r) for r in rows]
    widths = [max(len(r[i]) for r in cols) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in cols]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def human_time(seconds) -> str:
    if seconds is None or not math.isfinite(seconds):
        return "-"
    if seconds < 1:
        return f"{seconds * 1e3:.1f} ms"
    if seconds < 120:
        return f"{seconds:.2f} s"
    return f"{seconds / 60:.1f} min"


# ------------------------------------------------------------------ memory

def stage_memory_rows(stages: list[dict], capacity_gib: float, max_rows: int = 8) -> list[tuple]:
    """Per pipeline stage (GiB): one row each for up to `max_rows` stages; beyond that the
    first and last stage alone and the others in contiguous bands, each band shown by its
    hungriest stage and named by its range with `max` ("1-10 max")."""
    n = len(stages)
    totals = [sum(s[k] for k in MEMORY_KEYS) for s in stages]
    if n <= max_rows:
        bands = [(i, i) for i in range(n)]
    else:
        inner = max_rows - 2
        edges = [1 + round(j * (n - 2) / inner) for j in range(inner + 1)]
        bands = [(0, 0)] + [(a, b - 1) for a, b in zip(edges, edges[1:]) if b > a] + [(n - 1, n - 1)]
    rows = []
    for a, b in bands:
        i = max(range(a, b + 1), key=lambda k: totals[k])
        name = str(a) if a == b else f"{a}-{b} max"
        rows.append((name, *(f"{stages[i][k]:.1f}" for k in MEMORY_KEYS), f"{totals[i]:.1f}",
                     f"{100 * totals[i] / capacity_gib:.0f}%"))
    return rows


def _offloads(plan) -> bool:
    from .plan import Offload

    return plan.offload != Offload()


def offload_bytes_per_node(scenario) -> dict:
    """Host RAM and NVMe that the offloaded state of one node's devices takes (bytes), sized for
    the hungriest pipeline stage (analytic.host_bytes_per_device). NVMe bytes are what the
    `nvme` targets would keep in host RAM were they `cpu`."""
    from .analytic import host_bytes_per_device
    from .layout import compile_layout
    from .plan import Offload

    plan, per_node = scenario.plan, scenario.cluster.devices_per_node

    def placed(target: str) -> float:
        off = Offload(*("cpu" if t == target else "none" for t in (plan.offload.optimizer, plan.offload.params,
                                                                   plan.offload.activations)))
        layout = compile_layout(scenario.model, scenario.cluster, replace(plan, offload=off))
        return float(host_bytes_per_device(layout)) * per_node

    return {"host_bytes": placed("cpu"), "host_capacity_bytes": scenario.cluster.node.host_memory_bytes,
            "nvme_bytes": placed("nvme")}


# ------------------------------------------------------------------ what would fit

def _candidates(data: dict, scenario) -> list[tuple[str, dict]]:
    """Single changes of the plan, smallest first: (flag text, dotted overrides)."""
    p = scenario.plan
    out = []
    # how much each mode recomputes: Megatron's selective and torchtitan's op-level AC alike
    depth = {"none": 0, "selective": 1, "op-selective": 1, "full": 2}
    for mode in ("selective", "full"):
        if depth[mode] > depth[p.recompute]:
            out.append((f"--recompute {mode}", {"plan.recompute": mode}))
    mb = p.micro_batch // 2
    while mb >= 1:
        out.append((f"--micro-batch {mb}", {"plan.micro_batch": mb}))
        mb //= 2
    for z in range(p.zero_stage + 1, 4):
        out.append((f"--zero-stage {z}", {"plan.zero_stage": z}))
    if p.tp > 1 and not p.sequence_parallel:
        out.append(("--sequence-parallel true", {"plan.sequence_parallel": True}))
    if p.offload.optimizer == "none":
        out.append(("--offload-optimizer cpu" + (" --zero-stage 1" if p.zero_stage < 1 else ""),
                    {"plan.offload.optimizer": "cpu", "plan.zero_stage": max(1, p.zero_stage)}))
    for dim in ("tp", "pp"):
        for factor in (2, 4):
            size = getattr(p, dim) * factor
            change = {f"plan.{dim}": size, "plan.dp": "auto"}
            text = f"--{dim} {size}"
            if dim == "pp" and p.schedule == "interleaved":
                change.update({"plan.vpp": 1, "plan.schedule": "1f1b"})
                text += " --vpp 1"
            out.append((text, change))
    return out


def nearest_fits(data: dict, scenario, limit: int = 3) -> list[dict]:
    """The changes of one setting (recompute, micro-batch, ZeRO stage, sequence parallelism,
    optimizer offload, tp or pp) that make an infeasible plan fit, fastest first; when none
    does, pairs of them. Each: {change, step_time_s, peak_memory_gib} (analytic engine)."""
    from .evaluate import evaluate
    from .scenario import apply_overrides, scenario_from_dict

    singles = _candidates(data, scenario)

    def attempt(changes) -> dict | None:
        merged = {}
        for _, c in changes:
            merged.update(c)
        try:
            s = scenario_from_dict(apply_overrides(data, merged))
        except InputError:
            return None
        d = evaluate(s, engine="analytic").to_dict()
        if not d["feasible"]:
            return None
        return {"change": " ".join(t for t, _ in changes), "step_time_s": d["step_time_s"],
                "peak_memory_gib": d["peak_memory_gib"]}

    found = [r for r in (attempt([c]) for c in singles) if r]
    if not found:
        pairs = [(a, b) for a, b in itertools.combinations(singles, 2)
                 if (a[1].keys() - {"plan.dp"}).isdisjoint(b[1].keys() - {"plan.dp"})]
        found = [r for r in (attempt(list(pair)) for pair in pairs) if r]
    return sorted(found, key=lambda r: (r["step_time_s"], r["change"]))[:limit]


# ------------------------------------------------------------------ evaluate

def _whole_run_lines(d: dict) -> list[str]:
    """Goodput, data pipeline and energy lines of the report (docs/whole-run.md)."""
    runs = "" if d["interruptions"] is None else f", {d['interruptions']:,.0f} interruptions over the run"
    energy = "" if d["energy_kwh_to_train"] is None else (f", {d['energy_kwh_to_train'] / 1e3:,.0f} MWh to train "
                                                          f"(${d['energy_cost_to_train_usd']:,.0f})")
    return [
        f"goodput    {100 * d['goodput']:.1f}%: job MTBF {d['failure_mtbf_hours']:.1f} h{runs}; checkpoint "
        f"{d['checkpoint_gib']:,.0f} GiB every {human_time(d['checkpoint_interval_s'])} (stall "
        f"{human_time(d['checkpoint_stall_s'])}), restart {human_time(d['restart_s'])}",
        f"data       {human_time(d['data_time_s'])} per step to load: "
        + (f"DATA-BOUND, accelerators idle {100 * d['data_idle_fraction']:.0f}%" if d["data_bound"]
           else "hidden behind the step"),
        f"energy     {d['power_kw']:,.0f} kW, {d['energy_kwh_per_step']:.3g} kWh per step{energy}",
    ]


def layers_cell(stage_layers) -> str:
    """Layers per virtual stage, run-length coded: '7,8x14,7' is 7 layers, then 14 stages of
    8, then 7."""
    runs = [(n, len(list(group))) for n, group in itertools.groupby(stage_layers)]
    return ",".join(f"{n}x{k}" if k > 1 else str(n) for n, k in runs)


def sequence_cell(model) -> str:
    """The sequence length, with the packed documents' length where attention stays inside them
    and the sliding window where layers have one."""
    notes = [f"documents of {model.document_tokens}"] if model.packs_documents else []
    if model.has_sliding_window:
        kind = "chunks of" if model.window_kind == "chunked" else "window"
        notes.append(f"{kind} {model.sliding_window} on {model.sliding_layers} of {model.layers} layers")
    return f"{model.seq_len}" + (f" ({'; '.join(notes)})" if notes else "")


def render_result(d: dict, scenario, data: dict | None = None) -> str:
    """The readable report of `llmsim evaluate`. `data`, the scenario mapping, lets an
    infeasible plan list what would fit."""
    m, c, p = scenario.model, scenario.cluster, scenario.plan
    lines = [
        f"scenario   {d['scenario'] or '-'}",
        f"model      {m.name}: {m.params() / 1e9:.2f} B params, {m.layers} layers, hidden {m.hidden}, "
        f"seq {sequence_cell(m)}",
        f"cluster    {c.nodes} x {c.node.name} = {c.devices} x {c.accelerator.name}",
        f"plan       tp={p.tp} pp={p.pp} dp={p.dp} cp={p.cp} vpp={p.vpp} micro_batch={p.micro_batch} "
        f"global_batch={p.global_batch} ({p.microbatches} micro-batches) schedule={p.schedule} "
        f"sp={p.sp}" + (f" layers={layers_cell(plan_stage_layers(m, p))}" if uneven(p) else "")
        + f" recompute={p.recompute}"
        + (f" ({'+'.join(p.recompute_modules) or 'no module'})" if p.recompute == "selective"
           and p.recompute_modules != ("core_attn",) else "")
        + f" zero={p.zero_stage}"
        + (f" (hybrid: {p.dp_replicate} replicas x {p.dp // p.dp_replicate})" if p.dp_replicate > 1 else "")
        + f" {p.precision}"
        + (f" (bf16 layers: first {p.bf16_layers_at_start}, last {p.bf16_layers_at_end})"
           if p.bf16_layers_at_start or p.bf16_layers_at_end else "")
        + (f" offload optimizer/params/activations={p.offload.optimizer}/{p.offload.params}/"
           f"{p.offload.activations}" if _offloads(p) else "")
        + (f" optimizer=muon ({p.muon_ns_steps} Newton-Schulz steps, {p.muon_tp_mode} over TP)"
           if p.optimizer == "muon" else ""),
        *([f"experts    {m.shape_summary()}, ep={p.ep} etp={p.etp} {p.moe.dispatcher} dispatch"
           + (" (torchtitan's MoE layer" + (", scores before the experts" if p.moe.probs_on_input else "")
              + ("" if p.moe.grouped_gemm else ", for-loop experts") + ")"
              if p.moe.framework == "torchtitan" else "") + "; "
           f"{d['active_parameters'] / 1e9:.2f} B of "
           f"{d['parameters'] / 1e9:.2f} B params active per token"] if m.experts else []),
        "",
        f"feasible   {'yes' if d['feasible'] else 'NO: ' + d['reason']}",
        "",
        f"memory per device by pipeline stage (GiB; capacity {d['memory_capacity_gib']:.1f} GiB on "
        f"{c.accelerator.name}, peak at stage {d['peak_memory_stage']})",
    ]
    stages = d.get("memory_gib_by_stage") or [d["memory_gib"]]
    lines.append(fmt_table(stage_memory_rows(stages, d["memory_capacity_gib"]),
                           ("stage", *MEMORY_KEYS, "total", "of HBM")))
    free_gib = d["peak_reserved_gib"] - d["peak_memory_gib"]
    if free_gib > 0.05:
        lines.append(f"reserved   {d['peak_reserved_gib']:.1f} GiB at peak (torch's max reserved): the caching "
                     f"allocator holds {free_gib:.1f} GiB free at the loss")
    if _offloads(p):
        off = offload_bytes_per_node(scenario)
        lines.append(f"offload    per node ({c.devices_per_node} devices): host RAM {off['host_bytes'] / GIB:.1f} of "
                     f"{off['host_capacity_bytes'] / GIB:.0f} GiB on {c.node.name}, NVMe "
                     f"{off['nvme_bytes'] / GIB:.1f} GiB")
    lines.append("")
    if not d["feasible"]:
        lines += _what_would_fit(data, scenario)
        return "\n".join(lines)
    trust = []
    if d.get("step_time_s_interval"):
        lo, hi = d["step_time_s_interval"]
        trust.append(f"interval   {100 * d['interval_coverage']:.0f}% prediction interval of the step time "
                     f"{human_time(lo)} - {human_time(hi)} (from {d['interval_basis']})")
    if d.get("profile_validated") is False:
        trust.append(f"profile    {c.accelerator.name} is not validated against measured runs: {d['profile_validation']}")
    if d.get("outside_validation"):
        trust.append("beyond     the runs behind the interval: "
                     + "; ".join(describe(f) for f in d["outside_validation"]))
    lines += [
        f"step time  {human_time(d['step_time_s'])}  ({d['engine']} engine)",
        *trust,
        f"throughput {d['tokens_per_s']:,.0f} tokens/s ({d['tokens_per_s_per_device']:,.1f} per device)",
        f"per device {d['model_tflops_per_device']:.1f} model TFLOP/s (MFU {100 * d['mfu']:.1f}%), "
        f"{d['hardware_tflops_per_device']:.1f} hardware TFLOP/s (HFU {100 * d['hfu']:.1f}%)",
        f"cost       ${d['cost_usd_per_step']:.4g} per step, ${d['usd_per_million_tokens']:.4g} per million tokens "
        f"at ${d['price_usd_per_device_hour']:.2f}/device-hour",
    ]
    if d.get("time_to_train_days") is not None:
        lines.append(f"to train   {d['training_tokens']:.3g} tokens: {d['time_to_train_days']:.1f} days, "
                     f"${d['cost_to_train_usd']:,.0f} with failures and energy ({d['time_to_train_days_no_failures']:.1f}"
                     f" days, ${d['cost_to_train_usd_no_failures']:,.0f} without)")
    if d.get("goodput") is not None:
        lines += _whole_run_lines(d)
    if d.get("graph_tasks") is not None:
        lines.append(f"engine     graph: {d['graph_tasks']:,} tasks in the step, {d['simulated_tasks']:,} executed"
                     + (" (steady state extrapolated)" if d.get("steady_state_extrapolated") else ""))
    lines += ["", "step time breakdown (exposed seconds)"]
    step = d["step_time_s"]
    rows = [(k, f"{v:.4g}", f"{100 * v / step:.1f}%") for k, v in d["breakdown_s"].items() if v > 0]
    lines.append(fmt_table(rows, ("part", "seconds", "share")))
    lines.append("")
    lines.append("MFU counts model FLOPs (no recomputation); HFU counts hardware FLOPs (with it).")
    return "\n".join(lines)


def _unsigned_zero(x: float, digits: int) -> float:
    return round(x, digits) or 0.0  # -0.0 prints as "-0.0"


def render_sensitivity(sensitivity: dict) -> str:
    """`evaluate --sensitivity`: the step time with each hardware rate lower and higher, the
    rates the step leans on most first."""
    pct = round(100 * sensitivity["step"])

    def change(f, side):
        fits = "" if f.get(f"fits_{side}", True) else " (out of memory)"
        return f"{_unsigned_zero(f[f'{side}_change_pct'], 1):+.1f}%{fits}"

    rows = [(f["factor"], f["scales"], change(f, "lower"), change(f, "higher"), f"{_unsigned_zero(f['elasticity'], 2):+.2f}")
            for f in sorted(sensitivity["factors"], key=lambda f: f["elasticity"])]
    return "\n".join([f"sensitivity: the step time with one rate of the profile {pct}% lower or higher, the rest held "
                      "(llmsim hardware show: each number's source)",
                      fmt_table(rows, ("rate", "profile fields", f"-{pct}%", f"+{pct}%", "elasticity"))])


def _what_would_fit(data, scenario) -> list[str]:
    out = ["The plan does not fit, so it has no step time, throughput or cost."]
    if data is None:
        return out
    fits = nearest_fits(data, scenario)
    if not fits:
        return out + ["No change of one or two of recompute, micro-batch, ZeRO stage, sequence parallelism, "
                      "optimizer offload, tp or pp fits: it needs more or larger devices."]
    out.append("What would fit (analytic engine; fastest first):")
    out.append(fmt_table([(f["change"], human_time(f["step_time_s"]), f"{f['peak_memory_gib']:.1f}") for f in fits],
                         ("change", "step time", "peak GiB")))
    return out


# ------------------------------------------------------------------ compare

COMPARE_ROWS = (  # label, key of the row dict
    ("model", "model"), ("sequence", "sequence"), ("cluster", "cluster"), ("devices", "devices"),
    ("tp", "tp"), ("pp", "pp"), ("dp", "dp"), ("cp", "cp"), ("vpp", "vpp"), ("layers per stage", "layers"),
    ("micro_batch", "micro_batch"),
    ("global_batch", "global_batch"),
    ("schedule", "schedule"), ("sequence_parallel", "sequence_parallel"), ("recompute", "recompute"),
    ("zero_stage", "zero_stage"), ("precision", "precision"), ("offload opt/par/act", "offload"),
    ("feasible", "feasible"), ("peak memory GiB", "peak_memory_gib"), ("peak reserved GiB", "peak_reserved_gib"),
    ("step time", "step_time"), ("80% interval", "step_time_interval"),
    ("tokens/s", "tokens_per_s"), ("tokens/s per device", "tokens_per_s_per_device"), ("MFU", "mfu"),
    ("$ per M tokens", "usd_per_million_tokens"), ("days to train", "time_to_train_days"),
    ("beyond the runs", "outside_validation"),
    ("measured (published run)", "measured"),
)


def compare_row(d: dict, scenario) -> dict:
    """The displayed values of one compared scenario (text, as shown)."""
    m, p, c = scenario.model, scenario.plan, scenario.cluster
    ok = d["feasible"]

    def valid(fmt, key):
        """d[key] shown by fmt where the plan fits and the number exists (an infeasible plan
        has no cost), else '-'."""
        return fmt(d[key]) if ok and d.get(key) is not None else "-"
    return {
        "model": m.name, "cluster": f"{c.nodes} x {c.node.name} ({c.accelerator.name})",
        "sequence": sequence_cell(m),
        "devices": str(c.devices), "tp": str(p.tp), "pp": str(p.pp), "dp": str(p.dp), "cp": str(p.cp),
        "vpp": str(p.vpp), "layers": layers_cell(plan_stage_layers(m, p)) if uneven(p) else "even",
        "micro_batch": str(p.micro_batch), "global_batch": str(p.global_batch),
        "schedule": p.schedule, "sequence_parallel": str(p.sequence_parallel).lower(), "recompute": p.recompute,
        "zero_stage": str(p.zero_stage), "precision": p.precision,
        "offload": f"{p.offload.optimizer}/{p.offload.params}/{p.offload.activations}",
        "feasible": "yes" if ok else "NO", "peak_memory_gib": f"{d['peak_memory_gib']:.1f}",
        "peak_reserved_gib": f"{d['peak_reserved_gib']:.1f}",
        "step_time": valid(human_time, "step_time_s"), "tokens_per_s": valid("{:,.0f}".format, "tokens_per_s"),
        "tokens_per_s_per_device": valid("{:,.1f}".format, "tokens_per_s_per_device"),
        "mfu": valid(lambda x: f"{100 * x:.1f}%", "mfu"),
        "usd_per_million_tokens": valid("{:.4g}".format, "usd_per_million_tokens"),
        "time_to_train_days": valid("{:.1f}".format, "time_to_train_days") if d.get("time_to_train_days") else "-",
        "step_time_interval": valid(lambda x: " - ".join(human_time(t) for t in x), "step_time_s_interval"),
        "outside_validation": ", ".join(f["field"] for f in d.get("outside_validation") or ()) or "-",
        "measured": "-",  # what a published run measured (cli: compare by published/<row id>)
    }


# Scenario fields the rows above show already (dotted; a trailing dot: a whole section)
COMPARED_FIELDS = ("name", "model.name", "model.description", "model.seq_len", "model.sliding_window",
                   "model.sliding_window_freq", "model.sliding_window_skip_freq", "model.window_kind",
                   "model.document_tokens",
                   "cluster.nodes", "cluster.devices_per_node", "plan.tp", "plan.pp", "plan.dp", "plan.cp", "plan.vpp",
                   "plan.micro_batch", "plan.global_batch", "plan.schedule", "plan.sequence_parallel",
                   "plan.recompute", "plan.zero_stage", "plan.precision", "plan.offload.", "plan.first_stage_layers",
                   "plan.last_stage_layers", "plan.pipeline_layout", "plan.pipeline_split")


def _flat_fields(value, prefix: str) -> dict:
    """A dataclass's fields by dotted name (nested dataclasses and mappings opened)."""
    if is_dataclass(value) and not isinstance(value, type):
        value = {f.name: getattr(value, f.name) for f in fields(value)}
    if isinstance(value, dict):
        out = {}
        for key, item in value.items():
            out.update(_flat_fields(item, f"{prefix}.{key}"))
        return out
    return {prefix: value}


def differing_fields(scenarios: list) -> list[tuple[str, list[str]]]:
    """(field, each scenario's value) of the fields the compare rows do not show in which the
    scenarios differ: a framework option (plan.fp8_recipe), a model dimension, a training
    setting, and a node's or network's own numbers where the scenarios name the same one."""
    flat = []
    for s in scenarios:
        f = {**_flat_fields(s.model, "model"), **_flat_fields(s.plan, "plan"), **_flat_fields(s.training, "training")}
        for part in ("node", "network"):  # a different one is in the cluster row already
            if len({getattr(x.cluster, part).name for x in scenarios}) == 1:
                f.update(_flat_fields(getattr(s.cluster, part), f"cluster.{part}"))
        flat.append(f)
    keys = list(dict.fromkeys(k for f in flat for k in f))
    sections = tuple(k for k in COMPARED_FIELDS if k.endswith("."))
    out = []
    for key in keys:
        if key in COMPARED_FIELDS or key.startswith(sections):
            continue
        values = [_shown(f.get(key, "-")) for f in flat]
        if key == "plan.etp" and all(s.plan.etp == s.plan.tp for s in scenarios):
            continue  # the expert TP size follows tp (the tp row) unless set
        if len(set(values)) > 1:
            out.append((key, values))
    return out


def _shown(value) -> str:
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, (tuple, list)):
        return "[" + ", ".join(map(str, value)) + "]"
    return str(value).lower() if isinstance(value, bool) or value is None else str(value)


def render_compare(names: list[str], rows: list[dict], highlight: bool = False,
                   extra: list[tuple[str, list[str]]] = ()) -> str:
    """Scenarios side by side, one column each; a row whose values differ is marked `*`
    (and bold when `highlight`). `extra`: rows of differing_fields, shown after the plan's."""
    table, differing = [], []
    for label, key in COMPARE_ROWS:
        if key == "measured" and all(r[key] == "-" for r in rows):  # no published run compared
            continue
        if key == "feasible":
            for field, values in extra:
                differing.append(True)
                table.append(("*", field, *values))
        values = [r[key] for r in rows]
        differs = len(set(values)) > 1
        differing.append(differs)
        table.append(("*" if differs else "", label, *values))
    text = fmt_table(table, ("", "", *names))
    if not highlight:
        return text + "\n\n* differs"
    lines = text.split("\n")
    out = lines[:2] + [f"\033[1m{line}\033[0m" if d else line for line, d in zip(lines[2:], differing)]
    return "\n".join(out) + "\n\n* differs (bold)"


def _cp_cell(row) -> str | int:
    """The search table's cp: the degree, with the implementation where it is not the ring
    ('8 ulysses-ring/2': all-to-alls in groups of 2, the ring over 4 of them)."""
    if row.cp == 1 or row.cp_attention == "ring":
        return row.cp
    group = f"/{row.cp_ulysses}" if row.cp_attention == "ulysses-ring" else ""
    return f"{row.cp} {row.cp_attention}{group}"


def _split_cell(row) -> str:
    """The search table's layers per virtual stage: 'even', or the split run-length coded."""
    return "even" if row.pipeline_split == "even" else layers_cell(json.loads(row.stage_layers))


def render_search(result, precision_column: bool | None = None) -> str:
    """A search.SearchResult as `llmsim search` prints it: what was searched, the notes and the
    ranked plans; a precision column where precisions were ranked side by side (default: where
    the plans shown differ in it)."""
    df = result.table
    if precision_column is None:
        precision_column = len(df) > 0 and df["precision"].nunique() > 1
    lines = [f"{result.enumerated:,} plans enumerated, {result.valid:,} valid, {result.feasible:,} fit in memory; "
             f"ranked by {result.objective} ({result.ranked_by})"]
    lines += ["note: " + note for note in result.notes]
    if not len(df):
        return "\n".join(lines)
    rows = [(r.rank, *((r.precision,) if precision_column else ()), r.tp, r.pp, r.dp, _cp_cell(r),
             f"{r.ep}/{r.etp}", r.vpp, _split_cell(r), r.micro_batch, r.schedule,
             "y" if r.sequence_parallel else "n",
             r.recompute, r.zero_stage if r.dp_replicate == 1 else f"{r.zero_stage}, {r.dp_replicate} replicas",
             "/".join((r.offload_optimizer, r.offload_params, r.offload_activations)),
             human_time(r.step_time_s), f"{r.tokens_per_s:,.0f}", f"{100 * r.mfu:.1f}%",
             f"{r.peak_memory_gib:.1f}", f"{r.usd_per_million_tokens:.3g}", r.equivalent_plans)
            for r in df.itertuples(index=False)]
    if (df["equivalent_plans"] > 1).any():
        lines.append("note: 'same as' counts the enumerated plans with these identical numbers "
                     "(the first one is shown)")
    lines.append(fmt_table(rows, ("#", *(("precision",) if precision_column else ()), "tp", "pp", "dp", "cp",
                                  "ep/etp", "vpp", "layers", "mb", "schedule", "sp", "recompute", "zero",
                                  "offload opt/par/act", "step", "tokens/s", "MFU", "GiB", "$/M tok", "same as")))
    return "\n".join(lines)
