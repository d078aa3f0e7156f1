"""Turn microbenchmark samples and fits into hardware profiles (accelerator, node, network YAML).

`llmsim calibrate -o DIR/NAME.yaml` writes three files that follow the ordinary schemas
(hardware_profiles/README.md) and load with the ordinary loader:

    DIR/NAME.yaml           accelerator: one "device" = one torch process with `threads`
                            intra-op threads (CPU) or one GPU, with a `calibration:` block
                            (date, torch version, device, threads, fits, raw samples)
    DIR/NAME-node.yaml      node: devices_per_node such devices; scale-up link = the
                            measured all-reduce between local processes (gloo or NCCL)
    DIR/NAME-net.yaml       network: the same loopback numbers (a calibrated machine is one
                            node; a scale-out network is never used, but a node names one)

A node loaded by path finds its accelerator and network beside it (hardware.py), and
profiles in hardware_profiles/calibrated/ are also found by name.
"""

from __future__ import annotations

import datetime as _dt
import os
import platform
from pathlib import Path

import yaml

from ..hardware import FUSED

GIB = 2**30


def _meminfo() -> dict:
    out = {}
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            key, rest = line.split(":", 1)
            out[key] = float(rest.split()[0]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return out


def cpu_fields(cpuinfo: str | None = None) -> dict:
    """The first processor's fields in /proc/cpuinfo (`cpuinfo`: that file's text; default: read
    it), {} where there is none."""
    try:
        text = Path("/proc/cpuinfo").read_text() if cpuinfo is None else cpuinfo
    except OSError:
        return {}
    fields = {}
    for line in text.splitlines():
        if not line.strip():
            break  # the first processor's block ends
        key, _, value = line.partition(":")
        fields[key.strip()] = value.strip()
    return fields


def cpu_model() -> str:
    return cpu_fields().get("model name") or platform.processor() or platform.machine()


# The instruction sets that choose torch's CPU kernels: ATen's vectorised kernels are compiled for
# AVX2 and AVX-512 and picked at start-up (torch.backends.cpu.get_cpu_capability()), oneDNN's bf16
# GEMMs need AVX512-BF16 or AMX.
ISA_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16")


def cpu_identity(cpuinfo: str | None = None) -> dict:
    """This CPU as /proc/cpuinfo names it: vendor, family, model and which of ISA_FLAGS it has
    ({} where unknown). The model name does not tell generations apart: an AMD EPYC under KVM
    reports "AMD EPYC" as Zen 3 (family 25, model 1: AVX2) and as Zen 4 (family 25, model 17:
    AVX-512 with BF16), whose kernel rates differ, so a calibration records this too. `cpuinfo`:
    that file's text (default: read it)."""
    fields = cpu_fields(cpuinfo)
    try:
        family, model = int(fields["cpu family"]), int(fields["model"])
    except (KeyError, ValueError):
        return {}
    flags = set(fields.get("flags", "").split())
    return {"vendor": fields.get("vendor_id", ""), "family": family, "model": model,
            "isa": [f for f in ISA_FLAGS if f in flags]}


def describe_cpu(cpu: dict) -> str:
    """A cpu_identity as one phrase: "AuthenticAMD family 25 model 1 (avx2)"."""
    isa = ", ".join(cpu.get("isa") or ["no AVX2"])
    return f"{cpu.get('vendor')} family {cpu.get('family')} model {cpu.get('model')} ({isa})"


def rss_bytes() -> float:
    """Resident set size of this process (Linux), 0 when unknown."""
    try:
        pages = int(Path("/proc/self/statm").read_text().split()[1])
        return pages * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0.0


def _r(x, digits=4):
    """Round to `digits` significant figures (keeps YAML readable; floats stay floats)."""
    return float(f"{float(x):.{digits}g}")


def build_profiles(name: str, info: dict, fits: dict, samples: list, collectives: list) -> tuple[dict, dict, dict]:
    """(accelerator, node, network) mappings. `info` describes the machine and the run."""
    dev = info["device"]
    host = fits.get("host_overhead") or {}
    peak = fits["peak_flops"]
    mem_bw = fits["memory_bandwidth"]
    coll = fits["allreduce"]
    devices = info["devices_per_node"]
    today = info["date"]
    what = (f"{info['cpu_model']}, {info['threads']} thread(s) per device" if dev == "cpu"
            else info.get("gpu_name", "CUDA device"))
    how = (f"llmsim calibrate --device {dev}{' --quick' if info['quick'] else ''} --clock {info.get('clock', 'wall')}"
           f" on {today}, torch {info['torch']}")
    acc = {
        "name": name,
        "description": f"Calibrated {dev}: {what}",
        "vendor": info.get("vendor", ""),
        "peak_tflops": {k: _r(v / 1e12) for k, v in peak.items()},
        "memory_gib": _r(info["memory_bytes"] / GIB),
        "memory_bandwidth_gb_per_s": _r(mem_bw / 1e9),
        "host_link": "host memory (the CPU is the device)" if dev == "cpu" else "PCIe / host link",
        "host_link_gb_per_s": _r(fits["host_link"] / 1e9),
        "tdp_w": _r(info["tdp_w"]),
        "price_usd_per_hour": 0.0,
        "framework_overhead_gib": _r(info["framework_overhead_bytes"] / GIB),
        "op_overhead_us": _r(host.get("op_s", 0.0) * 1e6),
        "efficiency": {**_curves_yaml(fits),
                       **({"precisions": {p: _curves_yaml(c) for p, c in fits["precisions"].items()}}
                          if fits.get("precisions") else {})},
        "sources": {
            "peak_tflops": (f"[measured] best achieved GEMM rate over the microbenchmark shapes ({how}); "
                            "not a theoretical peak, so efficiency.matmul is relative to it"),
            "memory_gib": ("[measured] MemAvailable / devices_per_node at calibration time" if dev == "cpu"
                           else "[measured] torch.cuda.get_device_properties().total_memory"),
            "memory_bandwidth_gb_per_s": ("[measured] best achieved rate of the memory-bound microbenchmarks "
                                     "(bytes counted as workload.py counts them); for small working sets "
                                     "this is cache bandwidth"),
            "host_link_gb_per_s": ("[inferred] the CPU is its own host: the measured memory bandwidth" if dev == "cpu"
                              else "[measured] best pinned host-to-device copy rate"),
            "tdp_w": "[estimate] not measurable from torch; a placeholder for energy estimates, set it by hand",
            "price_usd_per_hour": "[estimate] own machine, not metered: 0; set training.price_usd_per_device_hour",
            "framework_overhead_gib": ("[measured] resident memory of a process after importing torch"
                                       if dev == "cpu" else "[measured] CUDA context: used minus reserved"),
            "op_overhead_us": ("[measured] training steps (calibrate/trainer.py) of torch_model.GPT at hidden 8, "
                               "sequence 4, 1 and 3 layers x 1 and 2 micro-batches: the per-layer cost per "
                               "micro-batch / (2 passes x operators per layer in workload.py)"
                               if dev == "cpu" else "[inferred] 0: CUDA kernels launch asynchronously"),
            "host_overhead_us": ("[measured] the same tiny training steps: fixed cost per micro-batch and per step "
                                 "beyond the operators' share, and the optimizer's cost per parameter tensor "
                                 "(microbench.Bench.host_overhead; calibration.host_steps_s holds the four steps)"
                                 if dev == "cpu" else "[inferred] none: the host runs ahead of the kernels"),
            "efficiency": "[measured] scipy.optimize.curve_fit of eff(x) = max*x/(x+half) to the samples "
                          "below (relative time error); fit quality in calibration.fits. memory: plain copy and "
                          "residual-add kernels; memory_kernels: each memory-bound kernel class on its own "
                          "(framework_ops.py's zero_fill, grad_accumulate, bias_grad, param_cast among them); "
                          "precisions.<p>: the same measured in that precision (fp32 is the reference)",
        },
        "calibration": {
            "date": today,
            "tool": how,
            "torch": info["torch"],
            "device": dev,
            "device_name": what,
            **({"cpu": info["cpu"]} if dev == "cpu" and info.get("cpu") else {}),
            "threads": info["threads"],
            "clock": info.get("clock", "wall"),
            **info.get("settings", {}),
            "devices_per_node": devices,
            **({"probe_s": {k: _r(v, 5) for k, v in info["probe_s"].items()}} if info.get("probe_s") else {}),
            "noise": {k: ([_r(x, 3) for x in v] if isinstance(v, list) else _r(v)) for k, v in info.get("noise", {}).items()},
            "python": platform.python_version(),
            "platform": platform.platform(),
            "fits": {k: {kk: (_r(vv) if isinstance(vv, float) else vv) for kk, vv in f.items()}
                     for k, f in _flat_fits(fits) + [x for p, c in fits.get("precisions", {}).items()
                                                      for x in _flat_fits(c, f"precisions.{p}.")]},
            **({"host_steps_s": {k: _r(v) for k, v in host["train_steps_s"].items()}} if host else {}),
            "allreduce": {"ranks": coll["ranks"], "latency_us": _r(coll["latency_s"] * 1e6),
                          "bus_bandwidth_gb_per_s": _r(coll["bus_bytes_per_s"] / 1e9), "rel_rms": _r(coll["rel_rms"])},
            "samples": [{**s, "work": _r(s["work"], 6), "seconds": _r(s["seconds"], 5)} for s in samples],
            "collective_samples": [{**c, "seconds": _r(c["seconds"], 5)} for c in collectives],
        },
    }
    if fits.get("co_run"):
        acc["efficiency"]["co_run_slowdown"] = _r(fits["co_run"]["slowdown"], 3)
        acc["sources"]["efficiency.co_run_slowdown"] = (
            f"[measured] a layer-like probe (GEMMs, GELU, LayerNorm, an 8 MiB copy) on one device while the other "
            f"{devices - 1} run it too vs alone: {fits['co_run']['together_s'] * 1e3:.2f} ms / "
            f"{fits['co_run']['alone_s'] * 1e3:.2f} ms - 1 (calibrate/dist.py co_run_slowdown)")
    tiles = fits.get("attention_tiles")
    if tiles is not None:
        acc["efficiency"]["attention_tiles"] = {"kv": tiles.kv, "q": [list(x) for x in tiles.q]}
        acc["sources"]["efficiency.attention_tiles"] = (
            "the attention samples ran PyTorch's CPU flash kernel, whose causal query blocks compute "
            "whole key blocks (pytorch/pytorch@430c4e3b39 aten/src/ATen/native/cpu/FlashAttentionKernel.cpp: "
            "512 keys a block; 32, 64 or 256 query rows from 0, 192 or 768 queries; attentiontiles.py); "
            "the attention curves are fitted on the pairs it computes")
    keys = fits.get("attention_keys")
    if keys and keys["keys_half"] > 0:
        acc["efficiency"]["attention_keys_half"] = _r(keys["keys_half"], 3)
        acc["sources"]["efficiency.attention_keys_half"] = (
            f"[measured] the fp32 attention samples ({keys['samples']} of causal SDPA over several sequence "
            f"lengths, batches and heads): the keys per query at which a call runs at half the rate of a long one, "
            f"chosen on a grid with each pass's curve refitted to the times it rescales; relative RMS error "
            f"{100 * keys['rel_rms']:.0f}% with it, {100 * keys['rel_rms_without']:.0f}% without "
            f"(calibration.fit_keys_half); the attention curves are fitted with it")
    if fits.get("attention_flash2"):
        acc["sources"]["efficiency.attention_flash2"] = (
            "[measured] PyTorch SDPA restricted to its flash backend (FlashAttention-2), causal, bf16, forward and "
            "backward samples (op sdpa_flash_causal) fitted as one curve against the bf16 peak")
    elif fits.get("attention_is_flash2"):
        acc["efficiency"]["attention_flash2"] = FUSED
        acc["sources"]["efficiency.attention_flash2"] = (
            "fused: [measured] the attention samples ran PyTorch SDPA restricted to its flash backend "
            "(microbench.Bench.attention), so efficiency.attention is that kernel's own rate")
    if host:
        acc["host_overhead_us"] = {"microbatch": _r(host["microbatch_s"] * 1e6), "step": _r(host["step_s"] * 1e6),
                                   "param_tensor": _r(host["param_tensor_s"] * 1e6)}
    else:
        del acc["sources"]["host_overhead_us"]
    backend = "gloo over loopback TCP" if dev == "cpu" else "NCCL"
    node = {
        "name": f"{name}-node",
        "description": f"The calibrated machine: {devices} x {name} joined by {backend}",
        "accelerator": name,
        "devices_per_node": devices,
        "scaleup": {"name": f"{backend} between local processes", "bandwidth_gb_per_s": _r(coll["bus_bytes_per_s"] / 1e9),
                    "domain_devices": devices, "latency_us": _r(coll["latency_s"] * 1e6), "efficiency": 1.0},
        "network": f"{name}-net",
        "nics": 1,
        "nic_gbit_per_s": _r(coll["bus_bytes_per_s"] * 8 / 1e9),
        "host_memory_gib": _r(info["host_memory_bytes"] / GIB),
        "nvme_read_gb_per_s": 1.0,
        "nvme_write_gb_per_s": 1.0,
        "host_adam_params_per_s": _r(fits["adam_params_per_s"] * devices),
        "sources": {
            "devices_per_node": ("[measured] CPU cores / threads per device" if dev == "cpu"
                                 else "[measured] torch.cuda.device_count()"),
            "scaleup": (f"[measured] {coll['ranks']}-process all-reduce with torch.distributed ({backend}): "
                        "bandwidth_gb_per_s is the fitted bus bandwidth, so efficiency is 1.0; latency_us per ring step"),
            "nics": "[inferred] one machine: the scale-out network is never used; loopback numbers stand in",
            "nic_gbit_per_s": "[inferred] the measured loopback bus bandwidth",
            "host_memory_gib": "[measured] MemTotal",
            "nvme_read_gb_per_s": "[estimate] not measured; placeholder for offload plans",
            "nvme_write_gb_per_s": "[estimate] not measured; placeholder for offload plans",
            "host_adam_params_per_s": "[measured] best fused AdamW rate of one device x devices_per_node",
        },
    }
    net = {
        "name": f"{name}-net",
        "description": "Loopback between local processes (stands in for a scale-out network on one machine)",
        "latency_us": _r(coll["latency_s"] * 1e6),
        "efficiency": 1.0,
        "oversubscription": 1.0,
        "sources": {"latency_us": f"[measured] {backend} all-reduce fit, per ring step",
                    "efficiency": "[inferred] bandwidths are measured bus bandwidths",
                    "oversubscription": "1.0: the processes of one machine share no switched fabric"},
    }
    return acc, node, net


CURVES = ("matmul", "matmul_bwd_input", "matmul_bwd_weight", "attention", "attention_bwd", "attention_flash2",
          "memory")


def _curve_yaml(fit: dict, unit: str) -> dict:
    out = {"max": _r(fit["max"]), f"half_{unit}": _r(fit["half"])}
    if fit.get("spill") is not None:
        out.update({f"spill_{unit}": _r(fit["spill"]), "spill_max": _r(fit["spill_max"])})
    return out


def _curves_yaml(fits: dict) -> dict:
    """The GEMM, attention and memory curves present in `fits` as profile YAML."""
    out = {k: _curve_yaml(fits[k], "bytes" if k == "memory" else "flops") for k in CURVES if fits.get(k)}
    if fits.get("memory_kernels"):
        out["memory_kernels"] = {k: _curve_yaml(f, "bytes") for k, f in fits["memory_kernels"].items()}
    return out


def _flat_fits(fits: dict, prefix: str = "") -> list:
    return ([(prefix + k, fits[k]) for k in CURVES if fits.get(k)]
            + [(f"{prefix}memory_kernels.{k}", f) for k, f in fits.get("memory_kernels", {}).items()])


def _dump(data: dict, path: Path, header: str) -> None:
    """Block-style YAML; the raw sample lists (the calibration block's tail) one flow mapping a line."""
    data = dict(data)
    cal = dict(data.pop("calibration", None) or {})
    tails = {k: cal.pop(k) for k in ("samples", "collective_samples") if k in cal}
    if cal:
        data["calibration"] = cal
    text = yaml.safe_dump(data, sort_keys=False, default_flow_style=False, width=120)
    for key, rows in tails.items():
        text += f"  {key}:\n"
        text += "".join("  - " + yaml.safe_dump(r, sort_keys=False, default_flow_style=True, width=10**6).strip() + "\n"
                        for r in rows)
    path.write_text(header + text, encoding="utf-8")


def write_profiles(out: str | Path, acc: dict, node: dict, net: dict) -> list[Path]:
    """Write the three files; `out` is the accelerator's path (its stem must be the profile name)."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    header = "# Written by `llmsim calibrate`; schema in hardware_profiles/README.md.\n"
    paths = [out, out.with_name(f"{node['name']}.yaml"), out.with_name(f"{net['name']}.yaml")]
    for data, path in zip((acc, node, net), paths):
        _dump(data, path, header)
    return paths


def today() -> str:
    return _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
