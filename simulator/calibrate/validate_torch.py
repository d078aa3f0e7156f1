"""`llmsim validate --torch`: real training steps of torch_model.GPT vs the simulator's predictions.

For each configuration of a grid (layers, hidden, seq, micro-batch, gradient accumulation,
recompute none/full, DP = 1 or 2 over torch.distributed) it

1. measures: the median time of a training step after warm-up, on the clock the profile
   was calibrated with (wall, or process CPU time: timing.py; both are recorded) (forward and backward
   of every micro-batch, gradient all-reduce when DP = 2, fused AdamW step) and the peak
   of live tensor bytes of one more step (memtrack.py);
2. predicts: the same model and plan through the normal path, scenario_from_dict ->
   evaluate, on the calibrated profile's node (precision fp32, flash attention as SDPA
   runs it, no dropout, ZeRO 0, gradient reduction after the backward pass, fp32
   gradient buffers) and compares step_time_s and weights + gradients + optimizer +
   activations (the framework's own memory excluded: it is not a tensor).

The training loop keeps gradients as views of one flat fp32 buffer (as DDP's
gradient_as_bucket_view and Megatron-LM's main_grad buffer do): gradients live for the
whole step, which is what the simulator's memory model says, and DP = 2 reduces that one
buffer with a single all_reduce after the last micro-batch's backward pass.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from ..errors import InputError
from . import require_torch
from .torch_model import GPTConfig, build_model


@dataclass(frozen=True)
class RunConfig:
    name: str
    layers: int
    hidden: int
    heads: int
    seq_len: int
    micro_batch: int
    grad_accum: int = 1
    recompute: str = "none"
    dp: int = 1
    vocab: int = 2048

    @property
    def gpt(self) -> GPTConfig:
        return GPTConfig(layers=self.layers, hidden=self.hidden, heads=self.heads, vocab=self.vocab,
                         seq_len=self.seq_len)


def _grid() -> list[RunConfig]:
    C = RunConfig
    return [
        C("l2-h128-s128-b4", 2, 128, 4, 128, 4),
        C("l4-h128-s256-b2", 4, 128, 4, 256, 2),
        C("l2-h256-s128-b4", 2, 256, 4, 128, 4),
        C("l4-h256-s256-b2", 4, 256, 8, 256, 2),
        C("l4-h256-s512-b1", 4, 256, 4, 512, 1),
        C("l2-h512-s256-b2", 2, 512, 8, 256, 2),
        C("l6-h384-s256-b2", 6, 384, 6, 256, 2),
        C("l4-h256-s256-b2-ga2", 4, 256, 8, 256, 2, grad_accum=2),
        C("l2-h512-s128-b4-ga4", 2, 512, 8, 128, 4, grad_accum=4),
        C("l4-h256-s256-b2-full", 4, 256, 8, 256, 2, recompute="full"),
        C("l6-h384-s256-b2-full", 6, 384, 6, 256, 2, recompute="full"),
        C("l2-h512-s256-b2-ga2-full", 2, 512, 8, 256, 2, grad_accum=2, recompute="full"),
        C("l4-h256-s256-b2-dp2", 4, 256, 8, 256, 2, dp=2),
        C("l2-h512-s256-b2-dp2", 2, 512, 8, 256, 2, dp=2),
        C("l4-h256-s256-b2-ga2-dp2-full", 4, 256, 8, 256, 2, grad_accum=2, recompute="full", dp=2),
        C("l4-h256-s256-b2-v8k", 4, 256, 8, 256, 2, vocab=8192),
    ]


def _quick_grid() -> list[RunConfig]:
    C = RunConfig
    return [
        # Small, but not so small that the framework's per-step overheads dominate (CI sanity)
        C("q-l2-h128-s128-b2", 2, 128, 4, 128, 2, vocab=512),
        C("q-l2-h128-s128-b2-ga2-full", 2, 128, 4, 128, 2, grad_accum=2, recompute="full", vocab=512),
        C("q-l2-h128-s128-b2-dp2", 2, 128, 4, 128, 2, dp=2, vocab=512),
    ]


GRID, QUICK_GRID = _grid(), _quick_grid()


# ------------------------------------------------------------------ measurement

def train_worker(rank: int, world: int, cfg: dict, threads: int, warmup: int, steps: int, device: str) -> dict:
    """Build the model, time `steps` training steps after `warmup`, then measure one step's peak memory."""
    import torch

    from .memtrack import peak_live_bytes, tensor_bytes

    rc = RunConfig(**cfg)
    torch.set_num_threads(threads)
    dev = torch.device("cuda", rank) if device == "cuda" else torch.device("cpu")
    model = build_model(rc.gpt, rc.recompute, dev)
    params = list(model.parameters())
    flat = torch.zeros(sum(p.numel() for p in params), device=dev)
    off = 0
    for p in params:
        p.grad = flat[off:off + p.numel()].view_as(p)
        off += p.numel()
    opt = torch.optim.AdamW(params, lr=1e-4, fused=True)
    gen = torch.Generator().manual_seed(1234 + rank)
    shape = (rc.grad_accum, rc.micro_batch, rc.seq_len)
    x = torch.randint(0, rc.vocab, shape, generator=gen).to(dev)
    y = torch.randint(0, rc.vocab, shape, generator=gen).to(dev)
    scale = 1.0 / (rc.grad_accum * world)
    if world > 1:
        import torch.distributed as dist

    def step():
        flat.zero_()
        for i in range(rc.grad_accum):
            loss = model(x[i], y[i]) * scale
            loss.backward()
        if world > 1:
            dist.all_reduce(flat)
        opt.step()

    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    for _ in range(warmup):
        step()
    times, cpu = [], []
    for _ in range(steps):
        if world > 1:
            dist.barrier()
        sync()
        t0, c0 = time.perf_counter(), time.process_time()
        step()
        sync()
        times.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    states = [t for st in opt.state.values() for t in st.values() if torch.is_tensor(t)]
    baseline = tensor_bytes(params + [flat, x, y] + states + list(model.buffers()))
    peak = peak_live_bytes(step, baseline, dev.type)
    return {"step_times_s": times, "step_time_s": statistics.median(times), "cpu_time_s": statistics.median(cpu),
            "peak_bytes": peak,
            "baseline_bytes": baseline, "params": sum(p.numel() for p in params)}


def measure(rc: RunConfig, threads: int, device: str = "cpu", warmup: int = 2, steps: int = 5) -> dict:
    args = (asdict(rc), threads, warmup, steps, device)
    if rc.dp == 1:
        import torch

        before = torch.get_num_threads()
        try:
            return train_worker(0, 1, *args)
        finally:
            torch.set_num_threads(before)
    from .dist import launch

    return launch(train_worker, rc.dp, args, threads=threads, device=device)


# ------------------------------------------------------------------ prediction

def scenario_dict(rc: RunConfig, node: str) -> dict:
    return {
        "name": rc.name,
        "model": rc.gpt.model_fields(),
        "cluster": {"node": node, "nodes": 1, "devices_per_node": rc.dp},
        "plan": {"dp": rc.dp, "micro_batch": rc.micro_batch, "global_batch": rc.micro_batch * rc.grad_accum * rc.dp,
                 "recompute": rc.recompute, "precision": "fp32", "flash_attention": True, "zero_stage": 0,
                 "dp_overlap": False, "grad_precision": "fp32"},
    }


def predict(rc: RunConfig, node: str) -> dict:
    from ..evaluate import evaluate
    from ..scenario import scenario_from_dict

    res = evaluate(scenario_from_dict(scenario_dict(rc, node))).to_dict()
    gib = res["memory_gib"]
    tensor_gib = gib["weights"] + gib["gradients"] + gib["optimizer"] + gib["activations"]
    return {"step_time_s": res["step_time_s"], "memory_bytes": tensor_gib * 2**30, "breakdown_s": res["breakdown_s"],
            "memory_gib": gib}


# ------------------------------------------------------------------ the report

def node_for_profile(profile: str | Path) -> str:
    """The node file `llmsim calibrate` wrote beside accelerator profile `profile` (NAME-node.yaml)."""
    p = Path(profile)
    if p.suffix not in (".yaml", ".yml"):
        from ..hardware import CALIBRATED, profiles_dir
        p = profiles_dir() / CALIBRATED / f"{profile}.yaml"
    node = p.with_name(f"{p.stem}-node.yaml")
    if not p.is_file():
        raise InputError("--profile", str(profile), "no such calibrated profile; run `llmsim calibrate -o ...` first")
    if not node.is_file():
        raise InputError("--profile", str(profile), f"the node profile {node.name} written beside it is missing")
    return str(node)


def default_profile() -> Path:
    """The newest profile in hardware_profiles/calibrated/ (accelerator files, not -node/-net)."""
    from ..hardware import CALIBRATED, profiles_dir

    folder = profiles_dir() / CALIBRATED
    accs = [p for p in folder.glob("*.yaml") if (folder / f"{p.stem}-node.yaml").is_file()]
    if not accs:
        raise InputError("--profile", None, f"no calibrated profile in {folder}; run `llmsim calibrate` or give --profile")
    return max(accs, key=lambda p: p.stat().st_mtime)


def _pct(pred: float, meas: float) -> float:
    return 100.0 * (pred - meas) / meas


def run_validation(profile: str | Path | None = None, quick: bool = False, device: str = "cpu",
                   configs: list[RunConfig] | None = None, log=None) -> dict:
    """Measure and predict every configuration; rows plus MAPE of step time and memory."""
    torch = require_torch()
    import yaml

    if device == "cuda" and not torch.cuda.is_available():
        raise InputError("--device", device, "torch sees no CUDA device here; use --device cpu")
    profile = Path(profile) if profile is not None else default_profile()
    node = node_for_profile(profile)
    acc_path = Path(node).with_name(Path(node).stem[: -len("-node")] + ".yaml")
    cal = (yaml.safe_load(acc_path.read_text()) or {}).get("calibration") or {}
    threads = int(cal.get("threads") or 1)
    clock = cal.get("clock", "wall")  # compare on the clock the profile was calibrated with
    devices = int(cal.get("devices_per_node") or 1)
    configs = configs if configs is not None else (QUICK_GRID if quick else GRID)
    warmup, steps = (1, 3) if quick else (2, 7)
    rows = []
    for rc in configs:
        if rc.dp > devices:
            continue
        pred = predict(rc, node)
        meas = measure(rc, threads, device, warmup, steps)
        measured = meas["cpu_time_s"] if clock == "cpu" else meas["step_time_s"]
        row = {"config": rc.name, **asdict(rc), "measured_step_s": measured,
               "predicted_step_s": pred["step_time_s"],
               "step_error_pct": _pct(pred["step_time_s"], measured),
               "measured_wall_s": meas["step_time_s"],
               "wall_error_pct": _pct(pred["step_time_s"], meas["step_time_s"]),
               "measured_memory_mib": meas["peak_bytes"] / 2**20, "predicted_memory_mib": pred["memory_bytes"] / 2**20,
               "memory_error_pct": _pct(pred["memory_bytes"], meas["peak_bytes"]),
               "step_times_s": meas["step_times_s"], "params": meas["params"],
               # CPU seconds of the (rank 0) process per step, all its threads: on a shared
               # machine wall time also holds other processes' turns, CPU time does not
               "measured_cpu_s": meas["cpu_time_s"],
               "predicted_breakdown_s": pred["breakdown_s"]}
        rows.append(row)
        if log:
            log(f"  {rc.name:32s} step {row['measured_step_s'] * 1e3:8.1f} ms measured, "
                f"{row['predicted_step_s'] * 1e3:8.1f} predicted ({row['step_error_pct']:+.1f}%); memory "
                f"{row['measured_memory_mib']:7.1f} MiB measured, {row['predicted_memory_mib']:7.1f} predicted "
                f"({row['memory_error_pct']:+.1f}%)")
    mape = statistics.mean(abs(r["step_error_pct"]) for r in rows) if rows else float("nan")
    mem_mape = statistics.mean(abs(r["memory_error_pct"]) for r in rows) if rows else float("nan")
    wall_mape = statistics.mean(abs(r["wall_error_pct"]) for r in rows) if rows else float("nan")
    return {"profile": str(acc_path), "device": device, "threads": threads, "clock": clock, "quick": quick,
            "rows": rows, "mape_pct": mape, "wall_mape_pct": wall_mape, "memory_mape_pct": mem_mape}
