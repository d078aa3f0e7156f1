"""`llmsim` command line: evaluate, validate (--published, --torch), calibrate, hardware list, models list.

Bad input exits with code 2 and one line on stderr naming the field, the value and what
is allowed; never a traceback.
"""

from __future__ import annotations

import argparse
import json
import math
import sys

from .errors import InputError

# Every scenario field settable from the command line: flag -> dotted field.
FIELD_FLAGS = {
    "model": ["preset", "hf-config", "layers", "hidden", "heads", "kv-heads", "ffn-hidden", "vocab", "seq-len",
              "activation", "norm", "position-embedding", "bias", "tied-embeddings", "dropout"],
    "cluster": ["accelerator", "nodes", "devices-per-node", "node", "network"],
    "plan": ["tp", "pp", "dp", "cp", "vpp", "micro-batch", "global-batch", "schedule", "sequence-parallel",
             "recompute", "zero-stage", "precision", "flash-attention", "dp-overlap", "tp-comm-overlap",
             "grad-precision", "rank-order"],
    "plan.offload": ["optimizer", "params", "activations"],
    "training": ["tokens", "price-usd-per-device-hour"],
}
FLAG_PREFIX = {"plan.offload": "offload-"}


def parse_value(text: str):
    """A command-line value as YAML would type it, except that 1e9 is a number."""
    low = text.strip().lower()
    if low in ("true", "yes", "on"):
        return True
    if low in ("false", "no", "off"):
        return False
    for kind in (int, float):
        try:
            value = kind(text)
        except ValueError:
            continue
        return value
    return text


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
    reshaping = {"plan.tp", "plan.pp", "plan.cp", "cluster.nodes", "cluster.devices_per_node"}
    if reshaping & set(out) and "plan.dp" not in out:
        out["plan.dp"] = "auto"
    return out


ENGINES = ("analytic", "graph")
OBJECTIVE_NAMES = ("throughput", "cost", "time-to-train")
PLOT_KINDS = ("breakdown", "memory", "pareto", "heatmap", "timeline", "scatter", "accelerators")


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="llmsim", description="Analytical performance simulator for LLM training plans.")
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)

    ev = sub.add_parser("evaluate", help="predict memory, step time, throughput and cost of one scenario")
    ev.add_argument("scenario", help="scenario YAML file")
    ev.add_argument("--json", action="store_true", help="print one JSON object")
    ev.add_argument("--engine", choices=("graph", "analytic"), default="graph",
                    help="graph: execute the step's task graph (default); analytic: closed form, fast")
    ev.add_argument("--trace", metavar="FILE", help="write a Chrome trace JSON of the step (open in ui.perfetto.dev)")
    _add_field_flags(ev)

    va = sub.add_parser("validate", help="compare predictions with measured runs")
    va.add_argument("--published", action="store_true", help="reproduce the published runs (scenarios/published)")
    va.add_argument("--torch", action="store_true",
                    help="run real torch training steps on this machine and compare (needs the calibrate extra)")
    va.add_argument("--profile", default=None, metavar="P",
                    help="--torch: calibrated accelerator profile (path or name in hardware_profiles/calibrated; "
                         "default: the newest there)")
    va.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="--torch: where to train")
    va.add_argument("--quick", action="store_true", help="--torch: a tiny grid (CI)")
    va.add_argument("--json", action="store_true")
    va.add_argument("--engine", choices=("graph", "analytic"), default=None,
                    help="graph (default) or analytic; --fit-matmul defaults to analytic, the engine the "
                         "shipped A100 value was fitted with")
    va.add_argument("--fit-matmul", metavar="RUN_PREFIX", default=None,
                    help="fit the accelerator's matmul efficiency to the published runs whose id starts with "
                         "RUN_PREFIX (e.g. korthikanti22) and print it; the profile's provenance")
    va.add_argument("--write-residuals", action="store_true",
                    help="--published: store the runs' residuals (both engines) as the package data "
                         "that evaluate's prediction intervals read")

    sw = sub.add_parser("sweep", help="evaluate every point of a sweep space into a CSV or Parquet table")
    sw.add_argument("space", help="space YAML file (base or base_file, sweep, constraints)")
    sw.add_argument("-o", "--out", required=True, help="results.csv or results.parquet (written incrementally)")
    sw.add_argument("--workers", type=int, default=None, help="local processes or Dask workers (default: all cores)")
    sw.add_argument("--dask", default=None, metavar="ADDRESS|local",
                    help="run on Dask distributed: a scheduler address, or `local` for a LocalCluster")
    sw.add_argument("--resume", action="store_true", help="keep finished rows of OUT and evaluate only the rest")
    sw.add_argument("--engine", choices=ENGINES, default="analytic")
    sw.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")

    se = sub.add_parser("search", help="enumerate and rank every valid plan for a model, cluster and batch")
    se.add_argument("--model", required=True, help="model preset, HF config.json, or a YAML file with a model mapping")
    se.add_argument("--cluster", required=True,
                    help="node profile (with --nodes), or a YAML file with a cluster mapping")
    se.add_argument("--nodes", type=int, default=None, help="nodes of the --cluster node profile (default 1)")
    se.add_argument("--global-batch", type=int, required=True, help="sequences per step")
    se.add_argument("--objective", choices=tuple(OBJECTIVE_NAMES), default="throughput")
    se.add_argument("--top", type=int, default=10, help="plans to show (default 10)")
    se.add_argument("--engine", choices=("auto", "graph", "analytic"), default="auto",
                    help="engine for the top candidates (auto: graph when installed)")
    se.add_argument("--precision", default="bf16")
    se.add_argument("--tokens", type=float, default=None, help="training tokens, for time and cost to train")
    se.add_argument("--json", action="store_true", help="print the ranked plans as JSON")
    se.add_argument("-o", "--out", default=None, help="also write the ranked plans to a .csv or .parquet file")

    pl = sub.add_parser("plot", help="draw a results table (sweep, search, evaluate --json, validate --json)")
    pl.add_argument("results", help="results .csv, .parquet or .json (a timeline table for --kind timeline)")
    pl.add_argument("--kind", required=True, choices=PLOT_KINDS)
    pl.add_argument("-o", "--out", required=True, help="output image, e.g. plot.png")
    pl.add_argument("--row", type=int, default=None, help="--kind memory: the table row to draw (default: best)")

    ca = sub.add_parser("calibrate", help="measure this machine with torch and write a hardware profile")
    ca.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    ca.add_argument("--quick", action="store_true", help="a few shapes only (CI)")
    ca.add_argument("--threads", type=int, default=None,
                    help="CPU threads per device (default: half the cores, so DP=2 fills the machine)")
    ca.add_argument("-o", "--output", required=True, metavar="FILE",
                    help="accelerator profile to write, e.g. hardware_profiles/calibrated/NAME.yaml "
                         "(NAME-node.yaml and NAME-net.yaml are written beside it)")
    ca.add_argument("--clock", choices=("auto", "wall", "cpu"), default="auto",
                    help="wall: elapsed time; cpu: process CPU time, robust to other work on a shared machine "
                         "(one-thread CPU devices only); auto (default): cpu for one-thread CPU devices, else wall. "
                         "validate --torch compares on the profile's clock")
    ca.add_argument("--json", action="store_true")

    hw = sub.add_parser("hardware", help="hardware profiles")
    hw.add_argument("what", choices=("list",))
    mo = sub.add_parser("models", help="model presets")
    mo.add_argument("what", choices=("list",))
    return p


def _fmt_table(rows: list[tuple], header: tuple) -> str:
    cols = [header] + [tuple(str(c) for c in r) for r in rows]
    widths = [max(len(r[i]) for r in cols) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in cols]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _human_time(seconds: float) -> str:
    if seconds is None or not math.isfinite(seconds):
        return "-"
    if seconds < 1:
        return f"{seconds * 1e3:.1f} ms"
    if seconds < 120:
        return f"{seconds:.2f} s"
    return f"{seconds / 60:.1f} min"


def render_result(d: dict, scenario) -> str:
    """The readable report of `llmsim evaluate`."""
    m, c, p = scenario.model, scenario.cluster, scenario.plan
    lines = [
        f"scenario   {d['scenario'] or '-'}",
        f"model      {m.name}: {m.params() / 1e9:.2f} B params, {m.layers} layers, hidden {m.hidden}, seq {m.seq_len}",
        f"cluster    {c.nodes} x {c.node.name} = {c.devices} x {c.accelerator.name}",
        f"plan       tp={p.tp} pp={p.pp} dp={p.dp} cp={p.cp} vpp={p.vpp} micro_batch={p.micro_batch} "
        f"global_batch={p.global_batch} ({p.microbatches} micro-batches) schedule={p.schedule} "
        f"sp={p.sequence_parallel} recompute={p.recompute} zero={p.zero_stage} {p.precision}",
        "",
        f"feasible   {'yes' if d['feasible'] else 'NO: ' + d['reason']}",
        f"step time  {_human_time(d['step_time_s'])}",
        f"throughput {d['tokens_per_s']:,.0f} tokens/s ({d['tokens_per_s_per_device']:,.1f} per device)",
        f"per device {d['model_tflops_per_device']:.1f} model TFLOP/s (MFU {100 * d['mfu']:.1f}%), "
        f"{d['hardware_tflops_per_device']:.1f} hardware TFLOP/s (HFU {100 * d['hfu']:.1f}%)",
        f"memory     {d['peak_memory_gib']:.1f} of {d['memory_capacity_gib']:.1f} GiB (stage {d['peak_memory_stage']}): "
        + ", ".join(f"{k} {v:.1f}" for k, v in d["memory_gib"].items()),
        f"cost       ${d['cost_usd_per_step']:.4g} per step, ${d['usd_per_million_tokens']:.4g} per million tokens "
        f"at ${d['price_usd_per_device_hour']:.2f}/device-hour",
    ]
    if d.get("step_time_s_interval"):  # [issue 10] intervals.py
        lo, hi = d["step_time_s_interval"]
        lines.insert(lines.index("") + 3, f"interval   {100 * d['interval_coverage']:.0f}% prediction interval of the "
                     f"step time {_human_time(lo)} - {_human_time(hi)} (from {d['interval_basis']})")
    if d.get("time_to_train_days") is not None:
        lines.append(f"to train   {d['training_tokens']:.3g} tokens: {d['time_to_train_days']:.1f} days, "
                     f"${d['cost_to_train_usd']:,.0f}")
    if d.get("simulated_tasks") is not None:
        lines.append(f"engine     graph: {d['graph_tasks']:,} tasks in the step, {d['simulated_tasks']:,} executed "
                     f"in {1e3 * d['simulation_s']:.0f} ms" + (" (steady state extrapolated)"
                                                              if d.get("steady_state_extrapolated") else ""))
    else:
        lines.append(f"engine     {d['engine']}")
    lines += ["", "step time breakdown (exposed seconds)"]
    step = d["step_time_s"]
    rows = [(k, f"{v:.4g}", f"{100 * v / step:.1f}%") for k, v in d["breakdown_s"].items() if v > 0]
    lines.append(_fmt_table(rows, ("part", "seconds", "share")))
    lines.append("")
    lines.append("MFU counts model FLOPs (no recomputation); HFU counts hardware FLOPs (with it).")
    return "\n".join(lines)


def cmd_evaluate(args) -> int:
    from .evaluate import evaluate
    from .scenario import apply_overrides, read_scenario, scenario_from_dict

    data = apply_overrides(read_scenario(args.scenario), _overrides(args))
    scenario = scenario_from_dict(data)
    result = evaluate(scenario, engine=args.engine)
    d = result.to_dict()
    if args.trace:
        from .trace import write_trace

        write_trace(scenario, args.trace)
    if args.json:
        print(json.dumps(d, indent=2, sort_keys=False))
    else:
        print(render_result(d, scenario))
    return 0


def cmd_calibrate(args) -> int:
    from .calibrate import require_torch

    require_torch()
    from .calibrate.calibration import run_calibration

    if args.threads is not None and args.threads < 1:
        raise InputError("--threads", args.threads, "expected a positive integer")
    log = (lambda m: print(m, file=sys.stderr)) if args.json else print
    summary = run_calibration(args.output, device=args.device, quick=args.quick, threads=args.threads, log=log,
                              clock=args.clock)
    if args.json:
        print(json.dumps(summary, indent=2))
        return 0
    print(f"peak {summary['peak_tflops']} TFLOP/s (best measured GEMM), memory {summary['memory_bandwidth_gbs']} GB/s")
    for k, fit in summary["fits"].items():
        print(f"  {k:28s} max {fit['max']:.3f}  half {fit['half']:.3g}  (fit rel. RMS {100 * fit['rel_rms']:.0f}%, "
              f"{fit['samples']} samples)")
    ar = summary["allreduce"]
    print(f"  all-reduce {ar['ranks']} ranks: {ar['latency_us']:.0f} us per step, {ar['bus_bandwidth_gbs']:.2f} GB/s bus")
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
    out = run_validation(args.profile, quick=args.quick, device=args.device, log=log)
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
    print(f"noise: a row's steps spread by {out['median_noise_pct']:.1f}% (median IQR/median); the speed probe ran "
          f"{abs(change):.1f}% {'slower' if change >= 0 else 'faster'} than at calibration, and steps are compared at "
          f"the calibration's speed (uncorrected MAPE {out['raw_mape_pct']:.1f}%{extra})")
    return 0


def cmd_validate(args) -> int:
    if args.torch and args.published:
        raise InputError("validate", "--published --torch", "choose one of --published or --torch")
    if args.torch:
        return cmd_validate_torch(args)
    if not args.published:
        raise InputError("validate", "", "choose what to validate against: --published or --torch")
    from .published import fit_matmul_max, validate_published

    args.engine = args.engine or ("analytic" if args.fit_matmul else "graph")
    if args.fit_matmul:
        value, comparisons = fit_matmul_max(args.fit_matmul, engine=args.engine)
        mape = 100.0 * sum(abs(c.error) for c in comparisons) / len(comparisons)
        print(f"fitted matmul efficiency max = {value} over {len(comparisons)} runs '{args.fit_matmul}*' "
              f"(MAPE {mape:.1f}% on them)")
        return 0
    if args.write_residuals:
        from .intervals import write_published_residuals

        print(f"wrote {write_published_residuals()}", file=sys.stderr)
    comparisons, mape = validate_published(engine=args.engine)
    if args.json:
        rows = [dict(id=c.id, metric=c.metric, measured=c.measured, predicted=c.predicted,
                     error_pct=100 * c.error, feasible=c.feasible, peak_memory_gib=c.peak_memory_gib)
                for c in comparisons]
        print(json.dumps({"engine": args.engine, "rows": rows, "mape_pct": mape}, indent=2))
        return 0
    rows = [(c.id, c.metric, f"{c.measured:.4g}", f"{c.predicted:.4g}", f"{100 * c.error:+.1f}%",
             f"{c.peak_memory_gib:.1f}") for c in comparisons]
    print(_fmt_table(rows, ("run", "metric", "measured", "predicted", "error", "peak GiB")))
    print(f"\nMAPE {mape:.1f}% over {len(comparisons)} published runs ({args.engine} engine)")
    return 0


def cmd_sweep(args) -> int:
    from .sweep import sweep

    if args.workers is not None and args.workers < 1:
        raise InputError("--workers", args.workers, "expected an integer >= 1")
    df = sweep(args.space, workers=args.workers, dask=args.dask, out=args.out, resume=args.resume,
               engine=args.engine, progress=not args.no_progress)
    feasible = int(df["feasible"].fillna(False).sum())
    invalid = int(df["step_time_s"].isna().sum())
    print(f"{len(df)} points: {feasible} feasible, {len(df) - feasible - invalid} out of memory, "
          f"{invalid} invalid -> {args.out}")
    return 0


def _search_model(ref: str) -> dict:
    from .yamlio import load_yaml

    if ref.endswith(".json"):
        return {"hf_config": ref}
    if ref.endswith((".yaml", ".yml")):
        data = load_yaml(ref, "--model")
        return data.get("model", data) if isinstance(data, dict) else data
    return {"preset": ref}


def _search_cluster(ref: str, nodes) -> dict:
    from .yamlio import load_yaml

    if ref.endswith((".yaml", ".yml")):
        data = load_yaml(ref, "--cluster")
        data = dict(data.get("cluster", data)) if isinstance(data, dict) else data
    else:
        data = {"node": ref}
    if nodes is not None:
        data["nodes"] = nodes
    data.setdefault("nodes", 1)
    return data


def cmd_search(args) -> int:
    from .scenario import Training
    from .search import SearchOptions, search

    result = search(_search_model(args.model), _search_cluster(args.cluster, args.nodes), args.global_batch,
                    objective=args.objective, top=args.top, engine=args.engine,
                    options=SearchOptions(precision=args.precision), training=Training(tokens=args.tokens))
    df = result.table
    if args.out:
        if args.out.endswith(".csv"):
            df.to_csv(args.out, index=False)
        elif args.out.endswith(".parquet"):
            df.to_parquet(args.out, index=False)
        else:
            raise InputError("-o", args.out, "expected a .csv or .parquet file name")
    if args.json:
        print(json.dumps({"enumerated": result.enumerated, "valid": result.valid, "feasible": result.feasible,
                          "ranked_by": result.ranked_by, "seconds": result.seconds, "notes": result.notes,
                          "plans": json.loads(df.to_json(orient="records"))}, indent=2))
        return 0
    print(f"{result.enumerated:,} plans enumerated, {result.valid:,} valid, {result.feasible:,} fit in memory; "
          f"ranked by {args.objective} ({result.ranked_by}) in {result.seconds:.1f} s")
    for note in result.notes:
        print("note: " + note)
    rows = [(r.rank, r.tp, r.pp, r.dp, r.cp, r.vpp, r.micro_batch, r.schedule, "y" if r.sequence_parallel else "n",
             r.recompute, r.zero_stage, "/".join(x for x in (r.offload_optimizer, r.offload_params,
                                                               r.offload_activations)),
             _human_time(r.step_time_s), f"{r.tokens_per_s:,.0f}", f"{100 * r.mfu:.1f}%",
             f"{r.peak_memory_gib:.1f}", f"{r.usd_per_million_tokens:.3g}")
            for r in df.itertuples(index=False)]
    print(_fmt_table(rows, ("#", "tp", "pp", "dp", "cp", "vpp", "mb", "schedule", "sp", "recompute", "zero",
                            "offload opt/par/act", "step", "tokens/s", "MFU", "GiB", "$/M tok")))
    return 0


def cmd_plot(args) -> int:
    from .plots import plot_file

    plot_file(args.results, args.kind, args.out, row=args.row)
    print(f"wrote {args.out}")
    return 0


def cmd_list(args) -> int:
    if args.command == "hardware":
        from .hardware import available, load_accelerator, load_node

        accs = [load_accelerator(n) for n in available("accelerators")]
        rows = [(a.name, f"{a.peak_flops.get('bf16', a.peak_flops.get('fp16', 0)) / 1e12:.0f}",
                 f"{a.hbm_bytes / 2**30:.0f}", f"{a.hbm_bandwidth / 1e9:.0f}", f"{a.price_usd_per_hour:.2f}",
                 a.description.split(" (")[0][:50]) for a in accs]
        print(_fmt_table(rows, ("accelerator", "bf16 TFLOP/s", "HBM GiB", "HBM GB/s", "USD/h", "description")))
        nodes = [load_node(n) for n in available("nodes")]
        rows = [(n.name, n.accelerator, n.devices_per_node, n.scaleup.name, f"{n.nics}x{n.nic_bandwidth * 8 / 1e9:.0f}G",
                 n.network) for n in nodes]
        print()
        print(_fmt_table(rows, ("node", "accelerator", "devices", "scale-up", "NICs", "network")))
        return 0
    from .model import available_presets, load_preset

    rows = []
    for name in available_presets():
        m = load_preset(name)
        rows.append((name, f"{m.params() / 1e9:.2f}", m.layers, m.hidden, f"{m.heads}/{m.kv_heads}", m.ffn_hidden,
                     m.vocab, m.seq_len, m.activation))
    print(_fmt_table(rows, ("preset", "params B", "layers", "hidden", "heads/kv", "ffn", "vocab", "seq", "act")))
    return 0


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        if args.command == "evaluate":
            return cmd_evaluate(args)
        if args.command == "validate":
            return cmd_validate(args)
        if args.command == "calibrate":
            return cmd_calibrate(args)
        if args.command in COMMANDS:
            return COMMANDS[args.command](args)
        return cmd_list(args)
    except InputError as exc:
        print(f"llmsim: error: {exc}", file=sys.stderr)
        return 2
    except RecursionError:
        print("llmsim: error: scenario: too deeply nested", file=sys.stderr)
        return 2
    except BrokenPipeError:  # output piped into `head`
        sys.stderr.close()
        return 0
    except KeyboardInterrupt:
        hint = "; rerun with --resume to continue" if args.command == "sweep" else ""
        print(f"llmsim: interrupted{hint}", file=sys.stderr)
        return 130


COMMANDS = {"sweep": cmd_sweep, "search": cmd_search, "plot": cmd_plot}

if __name__ == "__main__":
    sys.exit(main())
