"""`llmsim calibrate`: run the microbenchmarks, fit the curves, write the profiles.

The fit uses only microbenchmarks (microbench.py, dist.py), never end-to-end training
steps: those are what `llmsim validate --torch` judges the profile on.
"""

from __future__ import annotations

import os
from pathlib import Path

from ..errors import InputError
from . import require_torch
from .fit import best_rate, fit_allreduce, fit_efficiency
from .profile_writer import _meminfo, build_profiles, cpu_model, rss_bytes, today, write_profiles


def default_threads(device: str) -> int:
    """Threads per CPU "device": half the cores, so that a DP=2 pair of processes fills the machine."""
    if device != "cpu":
        return 1
    return max(1, (os.cpu_count() or 2) // 2)


def _machine_info(torch, device: str, threads: int, quick: bool) -> dict:
    mem = _meminfo()
    info = {"device": device, "threads": threads, "quick": quick, "torch": str(torch.__version__), "date": today(),
            "cpu_model": cpu_model(), "host_memory_bytes": mem.get("MemTotal", 0.0)}
    if device == "cpu":
        devices = max(1, (os.cpu_count() or 1) // threads)
        info.update(devices_per_node=devices, vendor=cpu_model().split()[0] if cpu_model() else "",
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


def fit_all(samples: list[dict], collectives: list[dict], device: str) -> dict:
    """Peaks and efficiency curves from the samples (fp32 GEMMs define the matmul peak)."""
    by = lambda kind, dtype=None: [s for s in samples if s["kind"] == kind and (dtype is None or s["dtype"] == dtype)]
    peaks = {}
    for dt in ("fp32", "bf16", "fp16"):
        rows = by("matmul", dt)
        if rows:
            peaks[dt] = best_rate(rows)
    if "fp32" not in peaks:
        raise InputError("calibrate", "samples", "no fp32 GEMM samples to fit")
    p32 = peaks["fp32"]
    mm, att, mem = by("matmul", "fp32"), by("attention", "fp32"), by("memory")
    plain = [s for s in mem if s["kernel"] in ("copy", "residual")]
    mem_bw = best_rate(plain)
    kernels = {}
    for k in sorted({s["kernel"] for s in mem} - {"copy"}):
        rows = [s for s in mem if s["kernel"] == k]
        if len(rows) >= 2:
            kernels[k] = fit_efficiency([s["work"] for s in rows], [s["seconds"] for s in rows], mem_bw)
    adam = [s for s in mem if s["op"] == "adamw_fused"]
    host = by("host_link")
    ranks = collectives[0]["ranks"]
    over = by("overhead")
    return {
        "op_overhead_s": (over[0]["seconds"] / over[0]["work"]) if over else 0.0,
        "peak_flops": peaks,
        "matmul": fit_efficiency([s["work"] for s in mm], [s["seconds"] for s in mm], p32),
        "attention": fit_efficiency([s["work"] for s in att], [s["seconds"] for s in att], p32),
        "memory": fit_efficiency([s["work"] for s in plain], [s["seconds"] for s in plain], mem_bw),
        "memory_kernels": kernels,
        "memory_bandwidth": mem_bw,
        "host_link": best_rate(host) if host else mem_bw,
        "adam_params_per_s": best_rate(adam) / 24.0 if adam else mem_bw / 24.0,
        "allreduce": {"ranks": ranks, **fit_allreduce([c["bytes"] for c in collectives],
                                                      [c["seconds"] for c in collectives], ranks)},
    }


def run_calibration(out: str | Path, device: str = "cpu", quick: bool = False, threads: int | None = None,
                    log=print, clock: str = "wall") -> dict:
    """Measure this machine and write NAME.yaml, NAME-node.yaml, NAME-net.yaml; returns a summary."""
    torch = require_torch()
    from .dist import collective_samples
    from .microbench import Bench

    out = Path(out)
    if out.suffix not in (".yaml", ".yml"):
        raise InputError("-o", str(out), "expected a path ending in .yaml, e.g. hardware_profiles/calibrated/cpu.yaml")
    if device == "cuda" and not torch.cuda.is_available():
        raise InputError("--device", device, "torch sees no CUDA device here; use --device cpu")
    threads = threads or default_threads(device)
    if clock == "cpu" and (device != "cpu" or threads != 1):
        raise InputError("--clock", clock, "the CPU clock measures one-thread CPU devices only; use --clock wall")
    torch.set_num_threads(threads)
    info = _machine_info(torch, device, threads, quick)
    info["clock"] = clock
    bench = Bench(device, quick=quick, clock=clock)
    log(f"calibrate: {device}, {threads} thread(s), {clock} clock, torch {torch.__version__}{' (quick)' if quick else ''}")
    log("  GEMMs ...")
    bench.gemms(("fp32",) if device == "cpu" else ("fp32", "bf16"))
    log("  attention (SDPA forward and backward) ...")
    bench.attention("fp32")
    log("  memory-bound ops ...")
    bench.memory("fp32")
    bench.embedding("fp32")
    bench.adamw()
    if device == "cpu":
        log("  framework overhead per operator ...")
        bench.overhead()
    bench.copies()
    coll_device = device if device == "cpu" or torch.cuda.device_count() >= 2 else "cpu"
    world = 2 if coll_device == "cpu" else min(torch.cuda.device_count(), 8)
    if coll_device != device:
        log("  one GPU: collectives measured with gloo between 2 CPU processes (the node's link is not NVLink)")
    log(f"  all-reduce between {world} local processes ...")
    colls = collective_samples(coll_device, quick=quick, threads=threads, world_size=world)
    fits = fit_all(bench.samples, colls, device)
    acc, node, net = build_profiles(out.stem, info, fits, bench.samples, colls)
    paths = write_profiles(out, acc, node, net)
    summary = {"paths": [str(p) for p in paths], "peak_tflops": acc["peak_tflops"],
               "memory_bandwidth_gb_per_s": acc["memory_bandwidth_gb_per_s"], "efficiency": acc["efficiency"],
               "fits": acc["calibration"]["fits"], "allreduce": acc["calibration"]["allreduce"]}
    return summary
