"""`llmsim calibrate`: run the microbenchmarks, fit the curves, write the profiles.

The fit uses only microbenchmarks (microbench.py, dist.py), never end-to-end training
steps: those are what `llmsim validate --torch` judges the profile on.
"""

from __future__ import annotations

import os
import statistics
from pathlib import Path

from ..attentiontiles import PYTORCH_CPU_FLASH, Tiles, executed_fraction
from ..errors import InputError
from . import require_torch
from .fit import best_rate, fit_allreduce, fit_efficiency, fit_spill
from .profile_writer import (_meminfo, build_profiles, cpu_fields, cpu_identity, cpu_model, describe_cpu, rss_bytes,
                             today, write_profiles)

def default_threads(device: str) -> int:
    """Threads per CPU "device": half the cores, so that a DP=2 pair of processes fills the machine."""
    if device != "cpu":
        return 1
    return max(1, (os.cpu_count() or 2) // 2)


def resolve_clock(clock: str, device: str, threads: int) -> str:
    """`auto`: the CPU clock for one-thread CPU devices (robust on a shared machine), else wall."""
    if clock == "auto":
        return "cpu" if device == "cpu" and threads == 1 else "wall"
    if clock == "cpu" and (device != "cpu" or threads != 1):
        raise InputError("--clock", clock, "the CPU clock measures one-thread CPU devices only; use --clock wall")
    return clock


def cpu_has_bf16() -> bool:
    """Native bf16 arithmetic on this CPU (AVX512-BF16 or AMX-BF16): worth calibrating and validating."""
    flags = cpu_fields().get("flags", "").split()
    return "avx512_bf16" in flags or "amx_bf16" in flags


def low_precisions(torch, device: str) -> list[str]:
    """The 16- and 8-bit precisions this device computes natively (calibrated besides fp32)."""
    if device == "cpu":
        return ["bf16"] if cpu_has_bf16() else []
    out = ["bf16", "fp16"] if torch.cuda.is_bf16_supported() else ["fp16"]
    if torch.cuda.get_device_capability(0) >= (8, 9) and hasattr(torch, "_scaled_mm"):
        out.append("fp8")
    return out


def _machine_info(torch, device: str, threads: int, quick: bool) -> dict:
    mem = _meminfo()
    info = {"device": device, "threads": threads, "quick": quick, "torch": str(torch.__version__), "date": today(),
            "cpu_model": cpu_model(), "host_memory_bytes": mem.get("MemTotal", 0.0)}
    if device == "cpu":
        devices = max(1, (os.cpu_count() or 1) // threads)
        info.update(devices_per_node=devices, vendor=cpu_model().split()[0] if cpu_model() else "", cpu=cpu_identity(),
                    memory_bytes=mem.get("MemAvailable", mem.get("MemTotal", 0.0)) / devices,
                    framework_overhead_bytes=rss_bytes(), tdp_w=10.0 * threads)
    else:
        props = torch.cuda.get_device_properties(0)
        torch.cuda.init()
        torch.empty(1, device="cuda")
        free, total = torch.cuda.mem_get_info()
        info.update(devices_per_node=torch.cuda.device_count(), vendor="NVIDIA", gpu_name=props.name,
                    memory_bytes=float(props.total_memory),
                    framework_overhead_bytes=float(total - free - torch.cuda.memory_reserved()), tdp_w=300.0)
    return info


# GEMM and attention passes with a curve of their own (hardware.PASS_CURVES): the forward
# one is `matmul` / `attention`
PASSES = {"matmul": ("fwd", "bwd_input", "bwd_weight"), "attention": ("fwd", "bwd")}


def _fit(rows: list[dict], peak: float, spill: bool = False, tiles: Tiles | None = None,
         keys_half: float = 0.0) -> dict | None:
    """The curve of `rows` against `peak`; attention samples as compute._attention_calls
    times them: their work the pairs the kernel's `tiles` compute, their time what the
    calls would take over long sequences at `keys_half`."""
    if len(rows) < 2:
        return None
    fit = fit_spill if spill else fit_efficiency
    scaled = [_attention_work(s, tiles, keys_half) for s in rows]
    return fit([s["work"] * e for s, (e, _) in zip(rows, scaled)],
               [s["seconds"] / slow for s, (_, slow) in zip(rows, scaled)], peak)


def _attention_work(sample: dict, tiles: Tiles | None, keys_half: float) -> tuple:
    """(executed over counted work, time over that at long sequences) of a causal attention
    sample over s tokens (its shape (b, heads, s, d)); (1, 1) for any other."""
    if not sample["kind"].startswith("attention") or len(sample["shape"]) != 4:
        return 1.0, 1.0
    s = sample["shape"][2]
    executed = executed_fraction(((s, 1),), tiles) if tiles else 1.0
    k = executed * s / 2
    return executed, (k + keys_half) / k


# Candidates for attention_keys_half: none, and 1 to 10^4 keys in steps of 10^0.1
KEYS_HALF_GRID = (0.0,) + tuple(10.0 ** (e / 10) for e in range(41))


def fit_keys_half(samples: list[dict], peak: float, tiles: Tiles | None = None) -> dict | None:
    """attention_keys_half (hardware.Accelerator) from attention samples: the grid value whose
    per-pass curves, fitted to the samples as it rescales them, leave the least relative RMS
    error over all of them, with the error it leaves and the error without it. None where the
    samples span fewer than three sequence lengths (they cannot tell keys from FLOPs per call)."""
    rows = [s for s in samples if s["kind"] == "attention"]
    if len({tuple(s["shape"][2:3]) for s in rows}) < 3:
        return None

    def error(keys_half):
        fits = [_fit([s for s in rows if s["pass"] == p], peak, tiles=tiles, keys_half=keys_half)
                for p in PASSES["attention"]]
        fits = [f for f in fits if f]
        return (sum(f["rel_rms"] ** 2 * f["samples"] for f in fits) / sum(f["samples"] for f in fits)) ** 0.5

    errors = {k: error(k) for k in KEYS_HALF_GRID}
    best = min(errors, key=errors.get)
    return {"keys_half": best, "rel_rms": errors[best], "rel_rms_without": errors[0.0], "samples": len(rows)}


def _curves(samples: list[dict], peak: float, mem_bw: float, tiles: Tiles | None = None,
            keys_half: float = 0.0) -> dict:
    """Efficiency curves of one precision's samples: each GEMM and attention pass against
    `peak` (the kernels of a pass differ: a backward GEMM reads a transposed operand; attention
    at the kernel's `tiles` and `keys_half`), memory kernels against `mem_bw` with a spill point
    where their data outgrows the cache (the plain copy/add curve is `memory`)."""
    out = {}
    for kind, passes in PASSES.items():
        for pass_ in passes:
            fit = _fit([s for s in samples if s["kind"] == kind and s["pass"] == pass_], peak, tiles=tiles,
                       keys_half=keys_half)
            if fit:
                out[kind if pass_ == "fwd" else f"{kind}_{pass_}"] = fit
    mem = [s for s in samples if s["kind"] == "memory"]
    plain = _fit([s for s in mem if s["kernel"] in ("copy", "residual")], mem_bw, spill=True)
    if plain:
        out["memory"] = plain
    kernels = {}
    for k in sorted({s["kernel"] for s in mem} - {"copy"}):
        fit = _fit([s for s in mem if s["kernel"] == k], mem_bw, spill=True)
        if fit:
            kernels[k] = fit
    out["memory_kernels"] = kernels
    return out


def fit_all(samples: list[dict], collectives: list[dict], host: dict | None = None,
            tiles: Tiles | None = None) -> dict:
    """Peaks and efficiency curves from the samples: fp32 is the reference precision (its
    curves are the profile's `efficiency`), others get `efficiency.precisions.<p>`; `tiles`:
    the block sizes of the attention kernel the samples ran, where its causal blocks compute
    more than the causal half (attentiontiles.py)."""
    dtypes = sorted({s["dtype"] for s in samples if s["kind"] == "matmul"})
    peaks = {dt: best_rate([s for s in samples if s["kind"] == "matmul" and s["dtype"] == dt]) for dt in dtypes}
    if "fp32" not in peaks:
        raise InputError("calibrate", "samples", "no fp32 GEMM samples to fit")
    plain = [s for s in samples if s["kind"] == "memory" and s["dtype"] == "fp32" and s["kernel"] in ("copy", "residual")]
    mem_bw = best_rate(plain)
    keys = fit_keys_half([s for s in samples if s["dtype"] == "fp32"], peaks["fp32"], tiles)
    keys_half = keys["keys_half"] if keys else 0.0
    reference = _curves([s for s in samples if s["dtype"] == "fp32"], peaks["fp32"], mem_bw, tiles, keys_half)
    precisions = {}
    for dt in sorted({s["dtype"] for s in samples if s["kind"] != "probe"} - {"fp32", "u8"}):
        curves = _curves([s for s in samples if s["dtype"] == dt], peaks.get(dt, peaks["fp32"]), mem_bw, tiles,
                         keys_half)
        if curves.get("matmul") or curves.get("memory_kernels"):
            precisions[dt] = curves
    # SDPA's flash backend (microbench.Bench.attention, bf16 on CUDA): one curve over both
    # passes against its precision's peak, as a shipped profile's efficiency.attention_flash2
    flash = [s for s in samples if s["kind"] == "attention_flash2"]
    if flash:
        reference["attention_flash2"] = _fit(flash, peaks.get(flash[0]["dtype"], peaks["fp32"]), tiles=tiles,
                                             keys_half=keys_half)
    adam = [s for s in samples if s["op"] == "adamw_fused" and s["dtype"] == "fp32"]
    link = [s for s in samples if s["kind"] == "host_link"]
    ranks = collectives[0]["ranks"]
    return {
        "host_overhead": host or {},
        "peak_flops": peaks,
        **reference,
        "precisions": precisions,
        "attention_keys": keys,
        "attention_tiles": tiles,
        "memory_bandwidth": mem_bw,
        "host_link": best_rate(link) if link else mem_bw,
        "adam_params_per_s": best_rate(adam) / 24.0 if adam else mem_bw / 24.0,
        "allreduce": {"ranks": ranks, **fit_allreduce([c["bytes"] for c in collectives],
                                                      [c["seconds"] for c in collectives], ranks)},
    }


def noise(samples: list[dict]) -> dict:
    """Median and 90th percentile of the microbenchmarks' spread (IQR / median over the rounds)."""
    spreads = sorted(s.get("spread", 0.0) for s in samples)
    if not spreads:
        return {"median_spread": 0.0, "p90_spread": 0.0}
    return {"median_spread": statistics.median(spreads), "p90_spread": spreads[int(0.9 * (len(spreads) - 1))]}


def run_calibration(out: str | Path, device: str = "cpu", quick: bool = False, threads: int | None = None,
                    log=print, clock: str = "auto") -> dict:
    """Measure this machine and write NAME.yaml, NAME-node.yaml, NAME-net.yaml; returns a summary."""
    torch = require_torch()
    from .device import configure
    from .dist import co_run_slowdown, collective_samples
    from .microbench import Bench
    from .probe import PRECISIONS as PROBE_PRECISIONS, make_probe, names

    out = Path(out)
    if out.suffix not in (".yaml", ".yml"):
        raise InputError("-o", str(out), "expected a path ending in .yaml, e.g. hardware_profiles/calibrated/cpu.yaml")
    if device == "cuda" and not torch.cuda.is_available():
        raise InputError("--device", device, "torch sees no CUDA device here; use --device cpu")
    threads = threads or default_threads(device)
    clock = resolve_clock(clock, device, threads)
    settings = configure(threads, device)
    info = _machine_info(torch, device, threads, quick)
    info.update(clock=clock, settings=settings)
    load_before = os.getloadavg()[0]
    bench = Bench(device, quick=quick, clock=clock)
    precs = low_precisions(torch, device)
    bench.probes = {n: make_probe(device, n) for p in ["fp32"] + precs if p in PROBE_PRECISIONS for n in names(p)}
    cpu = f" ({info['cpu_model']}: {describe_cpu(info['cpu'])})" if info.get("cpu") else ""
    log(f"calibrate: {device}{cpu}, {threads} thread(s), {clock} clock, torch {torch.__version__}"
        f"{' (quick)' if quick else ''}; precisions fp32{''.join(', ' + p for p in precs)}")
    for dt in ["fp32"] + [p for p in precs if p != "fp8"]:
        log(f"  {dt}: GEMMs, attention, memory-bound and framework kernels, optimizer ...")
        bench.gemms(dt)
        bench.attention(dt)
        bench.memory(dt)
        bench.embedding(dt)
        bench.framework(dt)
        bench.adamw(dt)
    if "fp8" in precs:
        log("  fp8 GEMMs (torch._scaled_mm) ...")
        bench.fp8_gemms()
    host = None
    if device == "cpu":
        log("  framework host overhead (training steps of tiny models) ...")
        host = bench.host_overhead()
    bench.copies()
    coll_device = device if device == "cpu" or torch.cuda.device_count() >= 2 else "cpu"
    world = 2 if coll_device == "cpu" else min(torch.cuda.device_count(), 8)
    if coll_device != device:
        log("  one GPU: collectives measured with gloo between 2 CPU processes (the node's link is not NVLink)")
    log(f"  all-reduce between {world} local processes ...")
    colls = collective_samples(coll_device, quick=quick, threads=threads, world_size=world,
                               clock=clock if coll_device == "cpu" else "wall")
    co_run = None
    if device == "cpu" and world > 1:
        log(f"  kernels of {world} devices running at once vs alone ...")
        co_run = co_run_slowdown(threads, world, clock, quick)
    probes = {p: [x["seconds"] for x in bench.samples if x["kind"] == "probe" and x["dtype"] == p] for p in bench.probes}
    info["probe_s"] = bench.at_reference_speed()
    if host and host.get("group_probe_s"):  # the host overhead at the same reference speed
        k = info["probe_s"]["fp32"] / host["group_probe_s"]
        host = {**{n: v * k for n, v in host.items() if n in ("op_s", "microbatch_s", "step_s", "param_tensor_s")},
                "train_steps_s": {n: v * k for n, v in host["train_steps_s"].items()}}
    # SDPA's CPU flash kernel, whose causal blocks the fits count (attentiontiles.py)
    tiles = PYTORCH_CPU_FLASH if device == "cpu" and bench.attention_is_flash2 else None
    fits = fit_all(bench.samples, colls, host, tiles)
    fits["attention_is_flash2"] = bench.attention_is_flash2
    fits["co_run"] = co_run
    info["noise"] = noise([x for x in bench.samples if x["kind"] != "probe"])
    # how much the machine's speed moved during the calibration (the probes' range over the groups)
    info["noise"]["probe_range"] = max((max(v) - min(v)) / statistics.median(v) for v in probes.values())
    # how busy the machine was (1-minute load average at the start and the end)
    info["noise"]["load_average"] = [load_before, os.getloadavg()[0]]
    acc, node, net = build_profiles(out.stem, info, fits, bench.samples, colls)
    paths = write_profiles(out, acc, node, net)
    return {"paths": [str(p) for p in paths], "peak_tflops": acc["peak_tflops"],
            "memory_bandwidth_gb_per_s": acc["memory_bandwidth_gb_per_s"], "efficiency": acc["efficiency"],
            "op_overhead_us": acc.get("op_overhead_us", 0.0), "host_overhead_us": acc.get("host_overhead_us", {}),
            "fits": acc["calibration"]["fits"], "allreduce": acc["calibration"]["allreduce"],
            "noise": info["noise"], "clock": clock, "settings": settings,
            "co_run_slowdown": acc["efficiency"].get("co_run_slowdown"), "attention_keys": fits["attention_keys"]}
