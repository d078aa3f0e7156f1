"""`llmsim` command line: evaluate, compare, import, sweep, search, plot, validate (--published,
--torch), calibrate, hardware list | show NAME, models list | show NAME, scenarios list.

Bad input exits with code 2 and one line on stderr naming the field, the value and what
is allowed; never a traceback (an unexpected error, a bug, is one line with exit code 1).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from . import fields as F
from .errors import InputError, MeasurementError
from .report import fmt_table as _fmt_table

# Every scenario field settable from the command line: flag -> dotted field.
FIELD_FLAGS = {
    "model": ["preset", "hf-config", "layers", "hidden", "heads", "kv-heads", "ffn-hidden", "vocab", "seq-len",
              "activation", "norm", "position-embedding", "bias", "tied-embeddings", "dropout"],
    "cluster": ["accelerator", "nodes", "devices-per-node", "node", "network"],
    "plan": ["tp", "pp", "dp", "cp", "ep", "etp", "vpp", "micro-batch", "global-batch", "schedule", "sequence-parallel",
             "recompute", "zero-stage", "precision", "flash-attention", "dp-overlap", "tp-comm-overlap",
             "grad-precision", "rank-order"],
    "plan.offload": ["optimizer", "params", "activations"],
    "training": ["tokens", "price-usd-per-device-hour"],
}
FLAG_PREFIX = {"plan.offload": "offload-"}


def parse_value(text: str):
    """A command-line value typed as a YAML 1.2 scalar in a scenario file would be."""
    from .yamlio import parse_scalar

    return parse_scalar(text)


def version() -> str:
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as dist_version

    try:
        return dist_version("llmsim")
    except PackageNotFoundError:
        return "unknown (not installed)"


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, exit code 2
        print(f"llmsim: error: {message}", file=sys.stderr)
        raise SystemExit(2)


def _add_field_flags(p: argparse.ArgumentParser) -> None:
    group = p.add_argument_group("scenario fields (override the file)")
    for section, names in FIELD_FLAGS.items():
        for name in names:
            flag = FLAG_PREFIX.get(section, "") + name
            group.add_argument(f"--{flag}", dest=f"field:{section}.{name.replace('-', '_')}", metavar="V",
                               default=None)
    group.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                       help="any dotted field, e.g. --set plan.offload.optimizer=cpu")


def _overrides(args) -> dict:
    out = {}
    for key, value in vars(args).items():
        if key.startswith("field:") and value is not None:
            out[key[len("field:"):]] = parse_value(value)
    for item in args.set:
        if "=" not in item:
            raise InputError("--set", item, "expected FIELD=VALUE, e.g. plan.tp=8")
        k, v = item.split("=", 1)
        out[k.strip()] = parse_value(v)
    # Changing the layout or the cluster on the command line re-derives dp unless it is given too.
    reshaping = {"plan.tp", "plan.pp", "plan.cp", "cluster.nodes", "cluster.devices_per_node", "cluster.node",
                 "cluster.accelerator"}
    if reshaping & set(out) and "plan.dp" not in out:
        out["plan.dp"] = "auto"
    # --vpp picks the schedule unless --schedule is given: one chunk is 1F1B, more are interleaved.
    if "plan.vpp" in out and "plan.schedule" not in out and isinstance(out["plan.vpp"], int):
        out["plan.schedule"] = "interleaved" if out["plan.vpp"] > 1 else "1f1b"
    return out


def _renamed(data: dict, overrides: dict) -> dict:
    """The scenario named for its overrides too (`quickstart + tp=4, preset=llama-3.1-70b`),
    unless --set name=... names it."""
    if not overrides or "name" in overrides:
        return data
    shown = ", ".join(f"{k.split('.', 1)[-1]}={v}" for k, v in overrides.items()
                      if not (k == "plan.dp" and v == "auto") and not k == "plan.schedule")
    return {**data, "name": f"{data.get('name') or 'scenario'} + {shown}"} if shown else data


ENGINES = ("analytic", "graph")
IMPORT_KINDS = ("torchtitan", "megatron", "deepspeed")
OBJECTIVE_NAMES = ("throughput", "cost", "time-to-train", "time-to-train-all-in", "cost-all-in")
PLOT_KINDS = ("breakdown", "memory", "pareto", "heatmap", "timeline", "scatter", "accelerators")


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="llmsim", description="Analytical performance simulator for LLM training plans.")
    p.add_argument("--version", action="version", version=f"llmsim {version()}")
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)

    ev = sub.add_parser("evaluate", help="predict memory, step time, throughput and cost of one scenario")
    ev.add_argument("scenario", nargs="?", default=None,
                    help="scenario YAML file, or the name of a shipped one (llmsim scenarios list)")
    ev.add_argument("--from", dest="source", nargs=2, metavar=("KIND", "FILE"), default=None,
                    help="instead of a scenario: a torchtitan TOML, Megatron-LM arguments, a NeMo or Megatron-Bridge "
                         "YAML, or a DeepSpeed JSON config (KIND: " + ", ".join(IMPORT_KINDS) + ")")
    ev.add_argument("--json", action="store_true", help="print one JSON object")
    ev.add_argument("--engine", choices=("graph", "analytic"), default="graph",
                    help="graph: execute the step's task graph (default); analytic: closed form, fast")
    ev.add_argument("--trace", metavar="FILE", help="write a Chrome trace JSON of the step (open in ui.perfetto.dev)")
    ev.add_argument("--sensitivity", action="store_true",
                    help="also the step time with each hardware rate (GEMM, attention, HBM, links, host) 10%% lower "
                         "and higher: which of the profile's numbers the prediction leans on")
    _add_field_flags(ev)

    co = sub.add_parser("compare", help="evaluate scenarios and show them side by side, differences marked")
    co.add_argument("scenarios", nargs="+", help="two or more scenario files (or shipped names)")
    co.add_argument("--json", action="store_true")
    co.add_argument("--engine", choices=("graph", "analytic"), default="graph")
    _add_field_flags(co)

    im = sub.add_parser("import", help="turn a torchtitan, Megatron-LM/NeMo or DeepSpeed config into a scenario",
                        description="Every key of the source is reported: mapped to a scenario field, ignored "
                                    "(no effect on step time or memory), or unmapped (llmsim cannot express it).")
    im.add_argument("kind", choices=IMPORT_KINDS)
    im.add_argument("source", nargs="?", default=None,
                    help="the config file (megatron: an arguments file, a launch script, a NeMo YAML or a "
                         "Megatron-Bridge run config)")
    im.add_argument("-o", "--out", default=None, help="scenario YAML to write (default: print it)")
    im.add_argument("--json", action="store_true", help="print the mapping report as JSON")
    _add_field_flags(im)
    im.epilog = "megatron: Megatron-LM arguments may follow `--` instead of a file"

    va = sub.add_parser("validate", help="compare predictions with measured runs")
    va.add_argument("--published", action="store_true", help="reproduce the published runs (scenarios/published)")
    va.add_argument("--only", metavar="RUNS", help="--published: only these runs: SOURCE or "
                                                   "ID-PREFIX[,...][:PRECISION], e.g. vtrain, tt_t1_,tt_t3_:bf16 or "
                                                   ":fp8-rowwise (llmsim scenarios list --published)")
    va.add_argument("--torch", action="store_true",
                    help="run real torch training steps on this machine and compare (needs the calibrate extra)")
    va.add_argument("--profile", default=None, metavar="P",
                    help="--torch: calibrated accelerator profile (path or name in hardware_profiles/calibrated; "
                         "default: the newest there calibrated on this machine's CPU model or GPU, never one that "
                         "records another CPU generation)")
    va.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="--torch: where to train")
    va.add_argument("--quick", action="store_true", help="--torch: a tiny grid (CI)")
    va.add_argument("--json", action="store_true")
    va.add_argument("--engine", choices=("graph", "analytic"), default=None,
                    help="graph (default) or analytic; --fit-matmul defaults to analytic, the engine the "
                         "shipped A100 value was fitted with")
    va.add_argument("--approximate", action="store_true",
                    help="--published: also predict the runs llmsim cannot express, with the nearest scenario it "
                         "can (each approximation named; reported apart from the expressible runs)")
    va.add_argument("--fit-matmul", metavar="RUN_PREFIX", default=None,
                    help="fit the accelerator's matmul efficiency to the published runs whose id starts with "
                         "RUN_PREFIX (e.g. korthikanti22) and print it; the profile's provenance")
    va.add_argument("--kernels", action="store_true",
                    help="the quantized linears' GEMMs and casts against published GEMM benchmarks "
                         "(TransformerEngine on a B300 and an H200 NVL, torchao's NVFP4 on a B200), and the "
                         "MoE dispatch kernels against Hybrid-EP's (B200, GB200)")
    va.add_argument("--transferred", action="store_true",
                    help="--published: predict each run with its profile's efficiencies transferred from another "
                         "fitted profile (how far a transfer misses: the basis of a transferred profile's interval)")
    va.add_argument("--write-residuals", action="store_true",
                    help="--published: store the runs' residuals (both engines) as the package data "
                         "that evaluate's prediction intervals read")

    sw = sub.add_parser("sweep", help="evaluate every point of a sweep space into a CSV or Parquet table")
    sw.add_argument("space", help="space YAML file (base or base_file, sweep, constraints)")
    sw.add_argument("-o", "--out", required=True, help="results.csv or results.parquet (written incrementally)")
    sw.add_argument("--workers", default=None, help="local processes or Dask workers (default: all cores)")
    sw.add_argument("--dask", default=None, metavar="ADDRESS|local",
                    help="run on Dask distributed: a scheduler address, or `local` for a LocalCluster")
    sw.add_argument("--resume", action="store_true", help="keep finished rows of OUT and evaluate only the rest")
    sw.add_argument("--engine", choices=ENGINES, default="analytic")
    sw.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")

    se = sub.add_parser("search", help="enumerate and rank every valid plan for a model, cluster and batch")
    se.add_argument("--model", required=True, help="model preset, HF config.json, or a YAML file with a model mapping")
    se.add_argument("--cluster", required=True,
                    help="node profile (with --nodes), or a YAML file with a cluster mapping")
    se.add_argument("--nodes", default=None, help="nodes of the --cluster node profile (default 1)")
    se.add_argument("--global-batch", required=True, help="sequences per step")
    se.add_argument("--objective", choices=tuple(OBJECTIVE_NAMES), default="throughput")
    se.add_argument("--top", default="10", help="plans to show (default 10)")
    se.add_argument("--engine", choices=("auto", "graph", "analytic"), default="auto",
                    help="engine for the top candidates (auto: graph when installed)")
    se.add_argument("--precision", default="bf16",
                    help="one precision, or several comma-separated (bf16,mxfp8,nvfp4) ranked side by side")
    se.add_argument("--tokens", default=None, help="training tokens, for time and cost to train")
    se.add_argument("--no-offload", action="store_true", help="no optimizer, parameter or activation offload")
    se.add_argument("--schedule", action="append", default=None, metavar="S",
                    help="only these pipeline schedules (repeat or comma-separate): gpipe, 1f1b, interleaved, zb-h1")
    se.add_argument("--recompute", action="append", default=None, metavar="R",
                    help="only these recomputation modes (repeat or comma-separate): none, selective, full")
    se.add_argument("--zero-stage", action="append", default=None, metavar="Z", help="only these ZeRO stages")
    se.add_argument("--dp-replicate", action="append", default=None, metavar="R",
                    help="also try hybrid sharding with these replica counts (repeat or comma-separate; "
                         "1 is always tried)")
    se.add_argument("--cp-attention", action="append", default=None, metavar="M",
                    help="CP implementations to try where cp > 1 (repeat or comma-separate; default ring, or "
                         "kv-allgather and ulysses for a model with sliding windows): "
                         "ring, kv-allgather, ulysses, ulysses-ring (at every all-to-all group size), "
                         "torch-allgather, torch-alltoall")
    se.add_argument("--pipeline-split", action="append", default=None, metavar="S",
                    help="how the layers split over pipeline stages (repeat or comma-separate; default both): even, "
                         "balanced (the embedding and the output weigh a layer each, as torchtitan splits)")
    se.add_argument("--max-tp", default=None, metavar="N", help="largest tensor-parallel size")
    se.add_argument("--max-pp", default=None, metavar="N", help="largest pipeline-parallel size")
    se.add_argument("--memory-headroom", default=None, metavar="FRACTION",
                    help="keep this fraction of device memory free, e.g. 0.1 (default 0)")
    se.add_argument("--set", action="append", default=[], metavar="plan.FIELD=VALUE",
                    help="hold a plan field the search does not vary at one value on every plan, as a scenario "
                         "gives it (repeat): the framework's options, e.g. --set plan.fp8_recipe=current "
                         "--set plan.tp_comm_overlap=true --set plan.projections=separate")
    se.add_argument("--json", action="store_true", help="print the ranked plans as JSON")
    se.add_argument("-o", "--out", default=None, help="also write the ranked plans to a .csv or .parquet file")

    pl = sub.add_parser("plot", help="draw a results table (sweep, search, evaluate --json, validate --json)")
    pl.add_argument("results", help="results .csv, .parquet or .json (a timeline table for --kind timeline)")
    pl.add_argument("--kind", required=True, choices=PLOT_KINDS)
    pl.add_argument("-o", "--out", required=True, help="output image, e.g. plot.png")
    pl.add_argument("--row", default=None, help="--kind memory: the table row to draw (default: best)")

    ca = sub.add_parser("calibrate", help="measure this machine with torch and write a hardware profile")
    ca.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    ca.add_argument("--quick", action="store_true", help="a few shapes only (CI)")
    ca.add_argument("--threads", default=None,
                    help="CPU threads per device (default: half the cores, so DP=2 fills the machine)")
    ca.add_argument("-o", "--output", required=True, metavar="NAME|FILE",
                    help="a NAME (written to the user's calibrated profiles, found by name from anywhere) or an "
                         "accelerator profile path NAME.yaml (NAME-node.yaml and NAME-net.yaml are written beside it)")
    ca.add_argument("--clock", choices=("auto", "wall", "cpu"), default="auto",
                    help="wall: elapsed time; cpu: process CPU time, robust to other work on a shared machine "
                         "(one-thread CPU devices only); auto (default): cpu for one-thread CPU devices, else wall. "
                         "validate --torch compares on the profile's clock")
    ca.add_argument("--json", action="store_true")

    hw = sub.add_parser("hardware", help="hardware profiles: list them, or show one's numbers beside their sources")
    hw.add_argument("what", choices=("list", "show"))
    hw.add_argument("name", nargs="?", help="show: an accelerator, node or network profile; list: only the "
                                            "profiles whose name contains it")
    hw.add_argument("--json", action="store_true", help="show: {kind, name, path, fields: [{field, value, source}]}")
    mo = sub.add_parser("models", help="model presets: list them, or show one with its source")
    mo.add_argument("what", choices=("list", "show"))
    mo.add_argument("name", nargs="?", help="show: a preset; list: only the presets whose name contains it")
    mo.add_argument("--json", action="store_true", help="show: the preset's fields, parameters and source")
    sc = sub.add_parser("scenarios", help="shipped scenarios, sweep spaces and published runs (usable by name)")
    sc.add_argument("what", choices=("list", "show"))
    sc.add_argument("name", nargs="?", help="show: a shipped scenario or sweep space, or a published run "
                                            "(published/<row id>)")
    sc.add_argument("--published", action="store_true",
                    help="list: the published runs `llmsim validate --published` predicts, by name")
    return p


def _int_flag(value, flag: str, default=None, minimum: int = 1, maximum: int = 10**9):
    """An integer flag validated like a scenario field (one line naming the flag otherwise)."""
    if value is None:
        return default
    return F.integer({flag: parse_value(value) if isinstance(value, str) else value}, flag, "",
                     minimum=minimum, maximum=maximum)


def _number_flag(value, flag: str, minimum: float = 0.0, strict_min: bool = True, maximum: float = F.ABSURD):
    if value is None:
        return None
    return F.number({flag: parse_value(value) if isinstance(value, str) else value}, flag, "", minimum=minimum,
                    strict_min=strict_min, maximum=maximum)


def _read(ref):
    """The raw scenario mapping `ref` names and, where it names a published run
    (published/<row id>), that run (validation/runs.py), looked up once."""
    from .scenario import read_scenario
    from .validation.runs import is_published_name, published_run, run_scenario

    if not is_published_name(ref):
        return read_scenario(ref), None
    run = published_run(ref)
    return run_scenario(run), run


def _scenario_data(args) -> tuple[dict, list[str], object]:
    """The scenario mapping of `evaluate` (the file or the imported config, with the flags
    applied), the notes on what an imported config says that llmsim does not model, and the
    published run it names, if it names one."""
    from .scenario import apply_overrides

    overrides = _overrides(args)
    if args.source is not None:
        if args.scenario is not None:
            raise InputError("--from", " ".join(args.source), "give a scenario file or --from, not both")
        from .importers import import_config

        kind, path = args.source
        imported = import_config(kind, path, overrides)
        return imported.scenario, [f"llmsim: note: {kind} {_unmapped_text(n)}" for n in imported.unmapped], None
    if args.scenario is None:
        raise InputError("scenario", None, "give a scenario file (or a shipped name) or --from KIND FILE")
    data, run = _read(args.scenario)
    return _renamed(apply_overrides(data, overrides), overrides), [], run


def _unmapped_text(note, verb: str = " is not modelled") -> str:
    """An importer's note on a key it could not map, or on what the config does not say."""
    from .importers.common import ABSENT

    if note["value"] == ABSENT:
        return f"{note['key']} (not in the config): {note['why']}"
    return f"{note['key']} = {note['value']!r}{verb}: {note['why']}"


def _write_target(path: str, flag: str) -> Path:
    """An output file path whose folder is created; a directory is refused."""
    out = Path(path)
    if out.is_dir():
        raise InputError(flag, path, "expected a file name, got a directory")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InputError(flag, path, f"cannot create its folder ({exc.strerror or exc.__class__.__name__})") from None
    return out


def cmd_evaluate(args) -> int:
    from .evaluate import evaluate
    from .report import render_result
    from .scenario import scenario_from_dict

    data, notes, run = _scenario_data(args)
    scenario = scenario_from_dict(data)
    result = evaluate(scenario, engine=args.engine)
    d = result.to_dict()
    published = _published_comparison(run, scenario, d, bool(_overrides(args)))
    if args.sensitivity:
        d["sensitivity"] = _sensitivity(scenario, result, args.engine)
    if args.trace:
        from .trace import write_trace

        write_trace(scenario, str(_write_target(args.trace, "--trace")))
    for note in notes:  # after the input is known to be good: an error stays one line
        print(note, file=sys.stderr)
    if args.json:
        print(json.dumps({**d, "published": published} if published else d, indent=2, sort_keys=False))
    else:
        print(render_result(d, scenario, data))
        if d.get("sensitivity"):
            from .report import render_sensitivity

            print("\n" + render_sensitivity(d["sensitivity"]))
        if published:
            print(_published_text(published))
    if args.trace:
        print(f"wrote the Chrome trace of the step to {Path(args.trace).resolve()} (open it in ui.perfetto.dev)",
              file=sys.stderr if args.json else sys.stdout)
    return 0


def _sensitivity(scenario, result, engine: str) -> dict | None:
    """The JSON of sensitivity.sensitivities (None for a plan that does not fit)."""
    from .sensitivity import STEP, sensitivities

    found = sensitivities(scenario, engine, result)
    return None if found is None else {"step": STEP, "factors": [f.to_dict(result.step_time_s) for f in found]}


def _published_comparison(run, scenario, d: dict, changed: bool) -> dict | None:
    """What the published `run` (None: the scenario names none) measured beside this
    prediction `d`, unless a flag `changed` its scenario."""
    if run is None or changed:
        return None
    from .validation.report import compare

    return {"id": run.id, "source": run.source, "title": run.title, "framework": run.framework, "file": run.file,
            "assumptions": list(run.assumptions),
            "comparisons": [{"metric": c.metric, "measured": c.measured, "predicted": c.predicted,
                             "error_pct": 100 * c.error, "primary": c.primary} for c in compare(run, scenario, d)]}


def _published_text(p: dict) -> str:
    lines = ["", f"published  {p['title']} ({p['framework']}; {p['file']}, row {p['id']})"]
    rows = [(c["metric"], f"{c['measured']:.4g}", f"{c['predicted']:.4g}", f"{c['error_pct']:+.1f}%")
            for c in p["comparisons"]]
    lines.append(_fmt_table(rows, ("measured metric", "measured", "predicted", "error")))
    lines += [f"assumed    {a}" for a in p["assumptions"]]
    return "\n".join(lines)


def cmd_scenarios_show(args) -> int:
    """A shipped scenario's file as written, or a published run's scenario as YAML headed by
    its source, its measurements, what the supplement assumed and where its fields come from."""
    import textwrap

    import yaml

    from .validation.runs import PUBLISHED_DIR, is_published_name, published_run, run_scenario

    if args.name is None:
        raise InputError("scenarios show", None, "give a scenario name (llmsim scenarios list)")
    if args.published:
        raise InputError("scenarios show", "--published", "only with list")
    name = args.name
    if not is_published_name(name):
        from .resources import resolve_data_file

        print(resolve_data_file(name, "scenario").read_text(encoding="utf-8"), end="")
        return 0
    run = published_run(name)
    data = run_scenario(run)
    head = [f"published run {run.id}: {run.title} ({run.framework})",
            f"from {PUBLISHED_DIR / run.file}, what its table leaves blank from the supplement*.yaml beside it",
            *[f"measured {m.metric} = {m.value:.6g} ({m.column})" for m in run.measurements],
            *[f"assumed: {a}" for a in run.assumptions],
            *[f"{field}: {text}" for field, text in run.provenance]]
    print("\n".join(wrapped for line in head
                    for wrapped in textwrap.wrap(line, 100, initial_indent="# ", subsequent_indent="#   ")))
    print(yaml.safe_dump(data, sort_keys=False), end="")
    return 0


def cmd_compare(args) -> int:
    from .evaluate import evaluate
    from .report import compare_row, differing_fields, render_compare
    from .scenario import apply_overrides, scenario_from_dict

    if len(args.scenarios) < 2:
        raise InputError("compare", args.scenarios, "expected two or more scenario files")
    overrides = _overrides(args)
    names, rows, results, scenarios = [], [], [], []
    for ref in args.scenarios:
        data, run = _read(ref)
        scenario = scenario_from_dict(_renamed(apply_overrides(data, overrides), overrides))
        d = evaluate(scenario, engine=args.engine).to_dict()
        names.append(scenario.name or Path(ref).stem)
        rows.append(compare_row(d, scenario))
        published = _published_comparison(run, scenario, d, bool(overrides))
        if published:
            rows[-1]["measured"] = ", ".join(f"{c['metric']} {c['measured']:.4g} ({c['error_pct']:+.1f}%)"
                                             for c in published["comparisons"] if c["primary"])
        results.append({**d, "published": published} if published else d)
        scenarios.append(scenario)
    if args.json:
        keys = [k for k in results[0] if len({json.dumps(r.get(k), sort_keys=True) for r in results}) > 1]
        print(json.dumps({"scenarios": names, "results": results, "differing_keys": keys,
                          "differing_fields": dict(differing_fields(scenarios))}, indent=2))
        return 0
    print(render_compare(names, rows, highlight=sys.stdout.isatty() and not os.environ.get("NO_COLOR"),
                         extra=differing_fields(scenarios)))
    return 0


def cmd_import(args) -> int:
    import yaml

    from .importers import import_config

    source = args.source
    extra = [a for a in (args.megatron_args or []) if a != "--"]
    if extra and args.kind != "megatron":
        raise InputError("import", " ".join(extra), "arguments after the file are read for megatron only")
    if source is None and not extra:
        raise InputError("import", None, f"give the {args.kind} config file")
    imported = import_config(args.kind, source, _overrides(args), argv=extra or None)
    order = ("name", "model", "cluster", "plan", "training")
    scenario = {k: imported.scenario[k] for k in order if k in imported.scenario}
    text = yaml.safe_dump(scenario, sort_keys=False)
    if args.json:
        print(json.dumps({"scenario": imported.scenario, "mapped": imported.mapped, "ignored": imported.ignored,
                          "unmapped": imported.unmapped}, indent=2, default=str))
    else:
        keys = len({m["key"] for m in imported.mapped})
        print(f"# {keys} keys mapped, {len(imported.ignored)} ignored (no effect on step time or memory), "
              f"{len(imported.unmapped)} unmapped (not modelled)")
        for m in imported.mapped:
            print(f"#   mapped    {m['key']} = {m['value']!r} -> {m['field']}")
        for m in imported.unmapped:
            print(f"#   UNMAPPED  {_unmapped_text(m, '')}")
        for m in imported.ignored:
            print(f"#   ignored   {m['key']}")
        if args.out is None:
            print(text, end="")
    if args.out is not None:
        out = _write_target(args.out, "-o")
        out.write_text(f"# imported by llmsim {version()} from {args.kind} {source or ' '.join(extra)}\n" + text,
                       encoding="utf-8")
        print(f"wrote {out}", file=sys.stderr if args.json else sys.stdout)
    return 0


def _calibration_output(ref: str) -> Path:
    """-o of calibrate: a bare NAME goes to the user's calibrated profiles (found by name from
    anywhere, never inside the installed package); a path is taken as it is."""
    from .resources import user_calibrated_dir

    if "/" not in ref and os.sep not in ref and not ref.endswith((".yaml", ".yml")):
        F.text({"-o": ref}, "-o", "")
        return user_calibrated_dir() / f"{ref}.yaml"
    return Path(ref)


def _calibrated_profile(ref, device: str):
    """--profile of validate --torch: a path, a name among the user's or the shipped calibrated
    profiles, or (None) the newest of them calibrated on this machine's kind of `device` (a
    CUDA profile predicts nothing of a CPU run)."""
    from .calibrate.validate_torch import default_profile
    from .hardware import CALIBRATED, profiles_dir
    from .resources import user_calibrated_dir

    folders = [user_calibrated_dir(), profiles_dir() / CALIBRATED]
    if ref is not None:
        if ref.endswith((".yaml", ".yml")) or "/" in ref or os.sep in ref:
            return ref
        found = [f / f"{ref}.yaml" for f in folders if (f / f"{ref}.yaml").is_file()]
        return str(found[0]) if found else ref
    return str(default_profile(device, folders))


def cmd_calibrate(args) -> int:
    from .calibrate import require_torch

    threads = _int_flag(args.threads, "--threads", maximum=4096)
    out = _calibration_output(args.output)
    require_torch()
    from .calibrate.calibration import run_calibration

    log = (lambda m: print(m, file=sys.stderr)) if args.json else print
    summary = run_calibration(out, device=args.device, quick=args.quick, threads=threads, log=log,
                              clock=args.clock)
    if args.json:
        print(json.dumps(summary, indent=2))
        return 0
    print(f"peak {summary['peak_tflops']} TFLOP/s (best measured GEMM), memory {summary['memory_bandwidth_gb_per_s']} GB/s")
    for k, fit in summary["fits"].items():
        print(f"  {k:28s} max {fit['max']:.3f}  half {fit['half']:.3g}  (fit rel. RMS {100 * fit['rel_rms']:.0f}%, "
              f"{fit['samples']} samples)")
    keys = summary.get("attention_keys")
    if keys and keys["keys_half"] > 0:
        print(f"  attention_keys_half {keys['keys_half']:.3g} keys per query (attention fit rel. RMS "
              f"{100 * keys['rel_rms']:.0f}%, {100 * keys['rel_rms_without']:.0f}% without)")
    ar = summary["allreduce"]
    print(f"  all-reduce {ar['ranks']} ranks: {ar['latency_us']:.0f} us per step, {ar['bus_bandwidth_gb_per_s']:.2f} GB/s bus")
    host = summary.get("host_overhead_us") or {}
    if summary.get("op_overhead_us") or host:
        print(f"  host overhead: {summary['op_overhead_us']:.1f} us per operator and pass, "
              + ", ".join(f"{v:.0f} us per {k.replace('_', ' ')}" for k, v in host.items()))
    if summary.get("co_run_slowdown") is not None:
        print(f"  devices sharing the node: kernels {100 * summary['co_run_slowdown']:.1f}% slower while all run")
    nz = summary.get("noise") or {}
    print(f"  noise: microbenchmark spread (IQR/median over rounds) median {100 * nz.get('median_spread', 0):.1f}%, "
          f"90th percentile {100 * nz.get('p90_spread', 0):.1f}%")
    print("wrote " + ", ".join(summary["paths"]))
    return 0


def cmd_validate_torch(args) -> int:
    from .calibrate import require_torch

    require_torch()
    from .calibrate.validate_torch import run_validation

    log = None if args.json else print
    out = run_validation(_calibrated_profile(args.profile, args.device), quick=args.quick, device=args.device,
                         log=log)
    if args.json:
        print(json.dumps(out, indent=2))
        return 0
    rows = [(r["config"], f"{1e3 * r['measured_step_s']:.1f}", f"{r['noise_pct']:.1f}%",
             f"{1e3 * r['predicted_step_s']:.1f}", f"{r['step_error_pct']:+.1f}%", f"{r['measured_memory_mib']:.1f}",
             f"{r['predicted_memory_mib']:.1f}", f"{r['memory_error_pct']:+.1f}%") for r in out["rows"]]
    print()
    print(_fmt_table(rows, ("config", "measured ms", "noise", "predicted ms", "error", "measured MiB",
                            "predicted MiB", "error")))
    extra = f"; wall clock, uncorrected: {out['wall_mape_pct']:.1f}%" if out["clock"] != "wall" else ""
    print(f"\nstep-time MAPE {out['mape_pct']:.1f}% on the {out['clock']} clock, worst row "
          f"{out['max_abs_error_pct']:.1f}%; memory MAPE {out['memory_mape_pct']:.1f}% over {len(out['rows'])} "
          f"configurations ({out['device']}, {out['threads']} thread(s) per device, profile {out['profile']})")
    change = 100 * (out["machine_slowdown"] - 1)
    compared = ("steps are compared at the calibration's speed (uncorrected MAPE "
                f"{out['raw_mape_pct']:.1f}%{extra})") if out["device"] != "cuda" else \
        "on a GPU steps are compared as measured (the probe reads the clock its own power draw sets)"
    print(f"noise: a row's steps spread by {out['median_noise_pct']:.1f}% (median IQR/median); the speed probe ran "
          f"{abs(change):.1f}% {'slower' if change >= 0 else 'faster'} than at calibration; {compared}")
    return 0


def cmd_validate_kernels(args) -> int:
    from .validation import ep_dispatch_bench
    from .validation.te_gemm_bench import kernel_report

    out = {**kernel_report(), "ep_dispatch": ep_dispatch_bench.report()}
    if args.json:
        print(json.dumps(out, indent=2))
        return 0

    def ms(row, key):
        return f"{row[key]:.3f}" if key in row else "-"

    def err(row, measured, predicted):
        return f"{100 * (row[predicted] / row[measured] - 1):+.1f}%" if measured in row else "-"

    rows = [(r["device"], r["profile"], r["precision"], ms(r, "autocast_ms"), ms(r, "autocast_predicted_ms"),
             err(r, "autocast_ms", "autocast_predicted_ms"), ms(r, "prequantized_ms"),
             ms(r, "prequantized_predicted_ms"), err(r, "prequantized_ms", "prequantized_predicted_ms"),
             ms(r, "cast_ms"), ms(r, "cast_predicted_ms"), err(r, "cast_ms", "cast_predicted_ms"))
            for r in out["te_gemm_profiles"]]
    print("TransformerEngine's GEMM profile of one layer's linears (ms a layer; cast = autocast - pre-quantized):")
    print(_fmt_table(rows, ("device", "profile", "precision", "autocast", "predicted", "error", "pre-quantized",
                            "predicted", "error", "cast", "predicted", "error")))
    rows = [(r["size"], "derived from" if r["derived_from"] else "held out", f"{r['measured']:.3f}",
             f"{r['predicted']:.3f}", f"{r['error_pct']:+.1f}%") for r in out["torchao_nvfp4_b200"]]
    print("\ntorchao's square GEMMs on a B200, NVFP4's time over BF16's (b200 profile):")
    print(_fmt_table(rows, ("M = K = N", "for the rate", "measured", "predicted", "error")))
    rows = [(r["node"], r["backend"], r["ranks"], r["sms"], r["call"], r["api"], f"{r['measured_gb_per_s']:.0f}",
             f"{r['predicted_gb_per_s']:.0f}", f"{r['error_pct']:+.1f}%") for r in out["ep_dispatch"]]
    print("\nMoE dispatch and combine on Blackwell (Hybrid-EP's README: GB/s of tokens received a rank; "
          "error of the time, - = predicted faster):")
    print(_fmt_table(rows, ("node", "backend", "ranks", "SMs", "call", "timed", "measured", "predicted", "error")))
    return 0


def cmd_validate(args) -> int:
    if args.torch and args.published:
        raise InputError("validate", "--published --torch", "choose one of --published or --torch")
    if args.transferred and not args.published:
        raise InputError("validate --transferred", "", "only with --published")
    if args.transferred and args.fit_matmul:
        raise InputError("validate --transferred", args.fit_matmul, "not with --fit-matmul: a fit is made on the "
                         "profile's own efficiencies")
    if args.only is not None and (not args.published or args.fit_matmul or args.write_residuals):
        raise InputError("validate --only", args.only, "only with --published, and not with --fit-matmul (which "
                         "names its own runs) or --write-residuals (which stores every run's)")
    if args.kernels and (args.torch or args.published):
        raise InputError("validate", "--kernels", "alone: not with --published or --torch")
    if args.kernels:
        return cmd_validate_kernels(args)
    if args.torch:
        return cmd_validate_torch(args)
    if not args.published:
        raise InputError("validate", "", "choose what to validate against: --published, --torch or --kernels")
    from .validation import fit_matmul_max, format_report, validate_published

    args.engine = args.engine or ("analytic" if args.fit_matmul else "graph")
    if args.fit_matmul:
        value, outcomes = fit_matmul_max(args.fit_matmul, engine=args.engine)
        mape = 100.0 * sum(abs(o.primary.error) for o in outcomes) / len(outcomes)
        print(f"fitted matmul efficiency max = {value} over {len(outcomes)} runs '{args.fit_matmul}*' "
              f"(MAPE {mape:.1f}% on them)")
        return 0
    if args.write_residuals:
        from .intervals import write_published_residuals

        print(f"wrote {write_published_residuals()}", file=sys.stderr)
    report = validate_published(engine=args.engine, approximate=args.approximate, transferred=args.transferred,
                                only=args.only)
    print(json.dumps(report, indent=2) if args.json else format_report(report))
    return 0


def cmd_sweep(args) -> int:
    from .sweep import sweep

    workers = _int_flag(args.workers, "--workers", maximum=4096)
    df = sweep(args.space, workers=workers, dask=args.dask, out=args.out, resume=args.resume,
               engine=args.engine, progress=not args.no_progress,
               log=lambda m: print(f"llmsim: warning: {m}", file=sys.stderr))
    feasible = int(df["feasible"].fillna(False).sum())
    invalid = int(df["step_time_s"].isna().sum())
    if len(df) and invalid == len(df):
        reasons = list(dict.fromkeys(df["reason"]))[:3]
        raise InputError("sweep", args.space, f"none of its {len(df)} points is a valid scenario (rows in "
                         f"{args.out}); first reasons: " + " | ".join(reasons))
    print(f"{len(df)} points: {feasible} feasible, {len(df) - feasible - invalid} out of memory, "
          f"{invalid} invalid -> {args.out}")
    return 0


def _search_model(ref: str) -> dict:
    from .model import resolve_hf_config
    from .yamlio import load_yaml

    if ref.endswith(".json"):
        return {"hf_config": ref}
    if ref.endswith((".yaml", ".yml")):
        data = load_yaml(ref, "--model")
        data = data.get("model", data) if isinstance(data, dict) else data
        # a relative hf_config is the file's own, as in a scenario file
        return resolve_hf_config({"model": dict(F.require_mapping(data, "--model"))}, Path(ref).parent)["model"]
    return {"preset": ref}


def _search_cluster(ref: str, nodes) -> dict:
    from .yamlio import load_yaml

    if ref.endswith((".yaml", ".yml")):
        data = load_yaml(ref, "--cluster")
        data = data.get("cluster", data) if isinstance(data, dict) else data
        data = dict(F.require_mapping(data, "--cluster"))
    else:
        data = {"node": ref}
    if nodes is not None:
        data["nodes"] = _int_flag(nodes, "--nodes", maximum=10**7)
    data.setdefault("nodes", 1)
    return data


def _choices(values, flag: str, allowed) -> tuple | None:
    """Repeated or comma-separated choices of a flag, each checked."""
    if values is None:
        return None
    out = []
    for item in values:
        for v in str(item).split(","):
            v = parse_value(v.strip())
            if v not in allowed or isinstance(v, bool):
                raise InputError(flag, v, "expected one of " + ", ".join(map(str, allowed)))
            if v not in out:
                out.append(v)
    return tuple(out)


def _search_options(args):
    from dataclasses import replace

    from .cpattention import CP_ATTENTION
    from .plan import PRECISIONS, RECOMPUTE, SCHEDULES
    from .scenario import apply_overrides
    from .search import SearchOptions
    from .stagesplit import PIPELINE_SPLITS

    chosen = _choices([args.precision], "--precision", PRECISIONS)
    opts = SearchOptions(precision=chosen[0] if len(chosen) == 1 else chosen)
    changes = {}
    if args.no_offload:
        changes["offloads"] = ("none",)
    for name, flag, allowed in (("schedules", "--schedule", SCHEDULES), ("recompute", "--recompute", RECOMPUTE),
                                ("zero_stages", "--zero-stage", (0, 1, 2, 3))):
        chosen = _choices(getattr(args, name if name != "schedules" else "schedule")
                          if name != "zero_stages" else args.zero_stage, flag, allowed)
        if chosen is not None:
            changes[name] = chosen
    if args.cp_attention is not None:
        changes["cp_attentions"] = _choices(args.cp_attention, "--cp-attention", CP_ATTENTION)
    if args.pipeline_split is not None:
        changes["pipeline_splits"] = _choices(args.pipeline_split, "--pipeline-split", PIPELINE_SPLITS)
    if args.dp_replicate is not None:
        replicas = [_int_flag(v.strip(), "--dp-replicate", maximum=10**6) for item in args.dp_replicate
                    for v in str(item).split(",")]
        changes["dp_replicates"] = tuple(sorted({1, *replicas}))
    if args.max_tp is not None:
        changes["max_tp"] = _int_flag(args.max_tp, "--max-tp", maximum=10**6)
    if args.max_pp is not None:
        changes["max_pp"] = _int_flag(args.max_pp, "--max-pp", maximum=10**6)
    if args.memory_headroom is not None:
        changes["memory_headroom"] = _number_flag(args.memory_headroom, "--memory-headroom", strict_min=False,
                                                  maximum=0.99)
    fixed: dict = {}
    for item in args.set:
        key, sep, value = item.partition("=")
        if not sep or not key.strip().startswith("plan.") or key.strip() == "plan.":
            raise InputError("--set", item, "expected plan.FIELD=VALUE, e.g. plan.fp8_recipe=current")
        fixed[key.strip()] = parse_value(value)
    if fixed:  # nested as a scenario's plan section (plan.moe.dispatcher -> {moe: {dispatcher: ...}})
        changes["plan_options"] = tuple(apply_overrides({}, fixed)["plan"].items())
    return replace(opts, **changes)


def cmd_search(args) -> int:
    from .scenario import Training
    from .report import render_search
    from .search import precisions, search

    global_batch = _int_flag(args.global_batch, "--global-batch")
    top = _int_flag(args.top, "--top", maximum=10**5)
    tokens = _number_flag(args.tokens, "--tokens")
    out = _write_target(args.out, "-o") if args.out else None
    if out is not None and out.suffix not in (".csv", ".parquet"):
        raise InputError("-o", args.out, "expected a .csv or .parquet file name")
    options = _search_options(args)
    result = search(_search_model(args.model), _search_cluster(args.cluster, args.nodes), global_batch,
                    objective=args.objective, top=top, engine=args.engine, options=options,
                    training=Training(tokens=tokens))
    df = result.table
    if out is not None:
        if out.suffix == ".csv":
            df.to_csv(out, index=False)
        else:
            df.to_parquet(out, index=False)
    if args.json:
        print(json.dumps({"enumerated": result.enumerated, "valid": result.valid, "feasible": result.feasible,
                          "ranked_by": result.ranked_by, "notes": result.notes,
                          "plans": json.loads(df.to_json(orient="records")),
                          "diagnostics": {"seconds": result.seconds}}, indent=2))
        return 0
    print(render_search(result, precision_column=len(precisions(options)) > 1))
    return 0


def cmd_plot(args) -> int:
    from .plots import plot_file

    row = _int_flag(args.row, "--row", minimum=0, maximum=10**9)
    out = _write_target(args.out, "-o")
    plot_file(args.results, args.kind, out, row=row)
    print(f"wrote {out}")
    return 0


def _validated(acc) -> str:
    """yes / no (efficiencies checked against measured runs or not) / - (the profile does not say)."""
    return "-" if acc.validation is None else "yes" if acc.validation.validated else "no"


def _interval(acc) -> str:
    """The 80 % interval a step-time prediction on `acc` carries, as low/high % (intervals.py)."""
    from .intervals import interval_fields

    ratio = interval_fields(1.0, 1.0, acc)["step_time_s_interval"]  # of a 1 s prediction
    return "-" if ratio is None else f"{ratio[0] - 1:+.0%} / {ratio[1] - 1:+.0%}"


def cmd_hardware_show(args) -> int:
    """One profile's numbers, each beside the source it states (provenance.py)."""
    from .provenance import profile_file, provenance_rows, render
    from .yamlio import load_yaml

    if not args.name:
        raise InputError("hardware show", None, "give a profile name (see `llmsim hardware list`)")
    kind, path = profile_file(args.name)
    rows = provenance_rows(load_yaml(path, "hardware show"))
    if args.json:
        print(json.dumps({"kind": kind, "name": args.name, "path": str(path), "fields": rows}, indent=1,
                         default=str))
    else:
        print(render(args.name, kind, path, rows))
    return 0


def cmd_models_show(args) -> int:
    """One preset's fields, its total and active parameters, and the config it was read from."""
    import textwrap

    from .model import load_preset, presets_dir
    from .yamlio import load_yaml

    if not args.name:
        raise InputError("models show", None, "give a preset name (see `llmsim models list`)")
    spec = load_preset(args.name)  # refuses an unknown name, listing the known ones
    data = load_yaml(presets_dir() / f"{args.name}.yaml", "models show")
    source = str(data.pop("source", ""))
    counts = {"parameters": spec.params(), "active_parameters": spec.active_params()}
    if args.json:
        print(json.dumps({"name": args.name, "fields": data, **counts, "source": source}, indent=1, default=str))
        return 0
    lines = [f"{k} = {v}" for k, v in data.items()]
    lines += [f"parameters = {counts['parameters'] / 1e9:.2f} B (active {counts['active_parameters'] / 1e9:.2f} B)",
              "source:"]
    lines += textwrap.wrap(" ".join(source.split()), 100, initial_indent="    ", subsequent_indent="    ")
    print("\n".join(lines))
    return 0


def cmd_list(args) -> int:
    if args.command == "scenarios" and args.what == "show":
        return cmd_scenarios_show(args)
    if args.command == "scenarios" and args.published:
        from .validation.runs import PUBLISHED_NAME, load_runs

        rows = [(PUBLISHED_NAME + r.id, r.source, r.accelerator, r.precision, r.primary.metric,
                 f"{r.primary.value:.4g}", r.status.replace("_", " ")) for r in load_runs()]
        print(_fmt_table(rows, ("name", "source", "accelerator", "precision", "measured", "value", "status")))
        print("\n(give a name to evaluate, compare or show, e.g. `llmsim evaluate " + rows[0][0] + "`)")
        return 0
    if args.command == "scenarios":
        from .resources import bundled_scenarios, data_dir

        for name in bundled_scenarios():
            print(name)
        print(f"\n(in {data_dir() / 'scenarios'}; give a name to evaluate or sweep, e.g. `llmsim evaluate quickstart`;"
              " the published runs: `llmsim scenarios list --published`)")
        return 0
    if args.command == "hardware" and args.what == "show":
        return cmd_hardware_show(args)
    if args.command == "models" and args.what == "show":
        return cmd_models_show(args)
    if args.command == "hardware":
        from .hardware import available, load_accelerator, load_node

        names, nodes = _listed(args, available("accelerators"), available("nodes"))
        accs = [load_accelerator(n) for n in names]
        rows = [(a.name, f"{a.peak_flops.get('bf16', a.peak_flops.get('fp16', 0)) / 1e12:.0f}",
                 # FP8 plans need a measured FP8 GEMM rate (plan.py), not only an FP8 peak
                 f"{a.peak_flops['fp8'] / 1e12:.0f}" if a.matmul_fp8 is not None and "fp8" in a.peak_flops else "-",
                 f"{a.peak_flops['nvfp4'] / 1e12:.0f}" if a.matmul_fp4 is not None and "nvfp4" in a.peak_flops else "-",
                 f"{a.hbm_bytes / 2**30:.0f}", f"{a.hbm_bytes_per_s / 1e9:.0f}", f"{a.price_usd_per_hour:.2f}",
                 _validated(a), _interval(a), a.description.split(" (")[0][:50]) for a in accs]
        print(_fmt_table(rows, ("accelerator", "bf16 TFLOP/s", "fp8 TFLOP/s", "nvfp4 TFLOP/s", "HBM GiB", "HBM GB/s",
                                "USD/h", "validated", "80% step time", "description")))
        unchecked = [a for a in accs if a.validation and not a.validation.validated]
        if unchecked:
            print("\nnot validated against runs (the profile's validation.reason):")
            print("\n".join(f"  {a.name}: {a.validation.reason}" for a in unchecked))
        nodes = [load_node(n) for n in nodes]
        rows = [(n.name, n.accelerator, n.devices_per_node, n.scaleup.name, f"{n.nics}x{n.nic_bytes_per_s * 8 / 1e9:.0f}G",
                 n.network) for n in nodes]
        print()
        print(_fmt_table(rows, ("node", "accelerator", "devices", "scale-up", "NICs", "network")))
        from .hardware import CALIBRATED, profiles_dir
        from .resources import user_calibrated_dir

        for folder in (profiles_dir() / CALIBRATED, user_calibrated_dir()):
            names = sorted(p.stem for p in folder.glob("*-node.yaml")) if folder.is_dir() else []
            if names:
                print(f"\ncalibrated nodes in {folder}: " + ", ".join(names))
        return 0
    from .model import preset_table

    headers, rows = preset_table()
    if args.name:
        rows = [r for r in rows if args.name.lower() in str(r[0]).lower()]
        if not rows:
            raise InputError("models list", args.name, "no preset name contains it (`llmsim models list`)")
    print(_fmt_table(rows, headers))
    return 0


def _listed(args, accelerators: list[str], nodes: list[str]) -> tuple[list[str], list[str]]:
    """`hardware list NAME`: the accelerators whose name contains NAME and the nodes whose name
    or accelerator does; every one without a NAME."""
    if not args.name:
        return accelerators, nodes
    from .hardware import load_node

    key = args.name.lower()
    accs = [a for a in accelerators if key in a.lower()]
    kept = [n for n in nodes if key in n.lower() or load_node(n).accelerator in accs]
    if not accs and not kept:
        raise InputError("hardware list", args.name, "no accelerator or node name contains it (`llmsim hardware list`)")
    return accs, kept


def main(argv=None) -> int:
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    extra = []
    if argv[:1] == ["import"] and "--" in argv:  # llmsim import megatron [options] -- MEGATRON ARGS
        extra = argv[argv.index("--") + 1:]
        argv = argv[:argv.index("--")]
    args = parser.parse_args(argv)
    args.megatron_args = extra
    try:
        if args.command in COMMANDS:
            return COMMANDS[args.command](args)
        return cmd_list(args)
    except InputError as exc:
        print(f"llmsim: error: {exc}", file=sys.stderr)
        return 2
    except RecursionError:
        print("llmsim: error: input: too deeply nested", file=sys.stderr)
        return 2
    except MeasurementError as exc:
        print(f"llmsim: measurement failed: {str(exc).splitlines()[0]}", file=sys.stderr)
        return 1
    except BrokenPipeError:  # output piped into `head`
        sys.stderr.close()
        return 0
    except KeyboardInterrupt:
        hint = "; rerun with --resume to continue" if args.command == "sweep" else ""
        print(f"llmsim: interrupted{hint}", file=sys.stderr)
        return 130
    except Exception as exc:  # a bug, not bad input: one line, and the traceback with LLMSIM_DEBUG=1
        if os.environ.get("LLMSIM_DEBUG"):
            raise
        text = str(exc).splitlines()[0][:200] if str(exc) else ""
        print(f"llmsim: internal error (please report; LLMSIM_DEBUG=1 shows where): {type(exc).__name__}: {text}",
              file=sys.stderr)
        return 1


COMMANDS = {"evaluate": cmd_evaluate, "compare": cmd_compare, "import": cmd_import, "validate": cmd_validate,
            "calibrate": cmd_calibrate, "sweep": cmd_sweep, "search": cmd_search, "plot": cmd_plot}

if __name__ == "__main__":
    sys.exit(main())
