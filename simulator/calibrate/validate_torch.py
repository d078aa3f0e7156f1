"""`llmsim validate --torch`: real training steps of torch_model.GPT vs the simulator's predictions.

For each configuration of a grid (layers, hidden, seq, micro-batch, gradient accumulation,
recompute none/full, DP = 1 or 2 over torch.distributed, fp32 and, where the CPU computes it
natively, bf16) it

1. measures (trainer.py's step): step times on the clock the profile was calibrated with
   (wall, or process CPU time: timing.py; both are recorded) and the peak of live tensor
   bytes of one more step (memtrack.py);
2. predicts: the same model and plan through the normal path, scenario_from_dict ->
   evaluate, on the calibrated profile's node (flash attention as SDPA runs it, no dropout,
   ZeRO 0, gradient reduction after the backward pass, fp32 gradient buffers, gradient
   accumulation by a separate add as torch does it) and compares step_time_s and
   weights + gradients + optimizer + activations (the framework's own memory excluded).

All configurations are measured by one set of worker processes (as many as the largest DP),
each configured as the calibrated device (device.py). The timed steps are interleaved:
every round runs a warm-up step and `steps` timed steps of each configuration in turn, so
that other work on a shared machine spreads over all of them; a row's step time is the
lower quartile of its timed steps, as the microbenchmarks' (timing.py says why), and its
noise their spread (IQR / median).
"""

from __future__ import annotations

import os
import statistics
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from ..errors import InputError
from . import require_torch
from .probe import GEMM
from .profile_writer import describe_cpu
from .torch_model import GPTConfig


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
    precision: str = "fp32"
    document_tokens: int = 0
    sliding_window: int = 0
    sliding_window_skip_freq: int = 0
    window_kind: str = "sliding"
    qk_norm: bool = False
    qk_norm_scope: str = "head"
    pre_norms: bool = True
    post_norms: bool = False
    parallel_block: bool = False
    experts: int = 0
    top_k: int = 2
    moe_layer: str = "megatron-core"
    probs_in_experts: bool = False  # Megatron-Core 0.13's placement of the probabilities (plan.moe)
    optimizer: str = "adam"  # or muon: Megatron-Core's (trainer.MegatronMuon; plan.optimizer)

    @property
    def gpt(self) -> GPTConfig:
        """The torch model: every GPTConfig field this run states."""
        return GPTConfig(**{f.name: getattr(self, f.name) for f in fields(GPTConfig) if hasattr(self, f.name)})


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
        # a long sequence, whole and as 8 packed documents (attention a third of the FLOPs, then 6 %)
        C("l2-h256-s2048-b1", 2, 256, 4, 2048, 1),
        C("l2-h256-s2048-b1-docs256", 2, 256, 4, 2048, 1, document_tokens=256),
        # Llama 4's chunked attention on three layers of four, the fourth over the whole sequence
        C("l4-h256-s2048-b1-chunk256", 4, 256, 4, 2048, 1, sliding_window=256, sliding_window_skip_freq=4,
          window_kind="chunked"),
        # the norms beyond the two pre-norms: query and key heads (Qwen3), and the outputs too (Gemma 3)
        C("l4-h256-s256-b2-qknorm", 4, 256, 8, 256, 2, qk_norm=True),
        C("l4-h256-s256-b2-qknorm-post", 4, 256, 8, 256, 2, qk_norm=True, post_norms=True),
        # OLMo 2's layer: output norms only, query and key norms over the whole projections
        C("l4-h256-s256-b2-postonly-qkfull", 4, 256, 8, 256, 2, qk_norm=True, qk_norm_scope="full", pre_norms=False,
          post_norms=True),
        # GPT-NeoX's layer: attention and MLP side by side from their own norms of the layer input
        C("l4-h256-s256-b2-parallel", 4, 256, 8, 256, 2, parallel_block=True),
        # Megatron-Core's MoE layer, 8 experts of 4h, top-2: twice the dense MLP's FLOPs in 8 pieces
        C("l4-h256-s256-b2-moe8k2", 4, 256, 8, 256, 2, experts=8),
        C("l4-h256-s256-b2-moe8k2-full", 4, 256, 8, 256, 2, experts=8, recompute="full"),
        # the same with Megatron-Core 0.13's placement: the probabilities scale the GELU's output
        C("l4-h256-s256-b2-moe8k2-probs", 4, 256, 8, 256, 2, experts=8, probs_in_experts=True),
        # torchtitan's MoE layer (its for-loop experts, eager): the glue around the experts
        C("l4-h256-s256-b2-titanmoe8k2", 4, 256, 8, 256, 2, experts=8, moe_layer="torchtitan"),
        C("l4-h256-s256-b2-titanmoe8k2-full", 4, 256, 8, 256, 2, experts=8, moe_layer="torchtitan", recompute="full"),
        # Megatron-Core's Muon on the blocks' matrices and the position table, AdamW on the rest
        C("l4-h256-s256-b2-muon", 4, 256, 8, 256, 2, optimizer="muon"),
        C("bf16-l4-h512-s256-b2-muon", 4, 512, 8, 256, 2, precision="bf16", optimizer="muon"),
        C("bf16-l2-h256-s256-b4", 2, 256, 4, 256, 4, precision="bf16"),
        C("bf16-l4-h512-s256-b2", 4, 512, 8, 256, 2, precision="bf16"),
        C("bf16-l4-h512-s512-b2-ga2-full", 4, 512, 8, 512, 2, grad_accum=2, recompute="full", precision="bf16"),
        C("bf16-l2-h1024-s256-b4", 2, 1024, 16, 256, 4, precision="bf16"),
        C("bf16-l4-h512-s256-b2-dp2", 4, 512, 8, 256, 2, dp=2, precision="bf16"),
    ]


def _quick_grid() -> list[RunConfig]:
    C = RunConfig
    return [
        # Small, but not so small that the framework's per-step overheads dominate (CI sanity)
        C("q-l2-h128-s128-b2", 2, 128, 4, 128, 2, vocab=512),
        C("q-l2-h128-s128-b2-ga2-full", 2, 128, 4, 128, 2, grad_accum=2, recompute="full", vocab=512),
        C("q-l2-h128-s128-b2-dp2", 2, 128, 4, 128, 2, dp=2, vocab=512),
        C("q-l2-h128-s128-b2-moe4k2", 2, 128, 4, 128, 2, vocab=512, experts=4),
        C("q-bf16-l2-h256-s128-b2", 2, 256, 4, 128, 2, vocab=512, precision="bf16"),
    ]


def _cuda_grid() -> list[RunConfig]:
    """GPU-sized models: large enough that kernels, not the host's launches, set the step time."""
    C = RunConfig
    v = 32768
    return [
        C("cuda-l4-h1024-s1024-b8", 4, 1024, 16, 1024, 8, vocab=v, precision="bf16"),
        C("cuda-l8-h2048-s2048-b4", 8, 2048, 16, 2048, 4, vocab=v, precision="bf16"),
        C("cuda-l4-h2048-s2048-b2-ga4", 4, 2048, 16, 2048, 2, grad_accum=4, vocab=v, precision="bf16"),
        C("cuda-l8-h2048-s2048-b4-full", 8, 2048, 16, 2048, 4, recompute="full", vocab=v, precision="bf16"),
        C("cuda-l4-h4096-s1024-b4", 4, 4096, 32, 1024, 4, vocab=v, precision="bf16"),
        C("cuda-l4-h1024-s1024-b8-fp32", 4, 1024, 16, 1024, 8, vocab=v),
        C("cuda-l8-h2048-s2048-b4-dp2", 8, 2048, 16, 2048, 4, dp=2, vocab=v, precision="bf16"),
    ]


GRID, QUICK_GRID, CUDA_GRID = _grid(), _quick_grid(), _cuda_grid()


# ------------------------------------------------------------------ measurement

def grid_worker(rank: int, world: int, cfgs: list[dict], rounds: int, steps: int, device: str,
                probe_precisions=(), clock: str = "wall") -> list[dict]:
    """Time every configuration this rank takes part in (rank < its DP), interleaved over
    `rounds`, rank 0 timing the speed probe (probe.py) on `clock` right before each
    configuration's steps; then one more step each for the peak memory. All ranks run the
    same sequence of barriers, so a rank that sits a DP = 1 configuration out waits (without
    using the CPU)."""
    import time

    import torch
    import torch.distributed as dist

    from .memtrack import peak_live_bytes, tensor_bytes
    from .probe import make_probe
    from .timing import CLOCKS
    from .trainer import make_trainer

    now = CLOCKS[clock]
    probes_fn = {p: make_probe(device, p) for p in probe_precisions} if rank == 0 else {}
    of_precision = {}  # a precision's probes: the whole one and its GEMMs' (probe.py)
    for name in probes_fn:
        of_precision.setdefault(name.removesuffix(GEMM), []).append(name)

    rcs = [RunConfig(**c) for c in cfgs]
    dev = torch.device("cuda", rank) if device == "cuda" else torch.device("cpu")
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    trainers = {i: make_trainer(rc.gpt, rc.recompute, rc.precision, rc.grad_accum, rc.micro_batch, dev, rank, rc.dp,
                                rc.optimizer)
                for i, rc in enumerate(rcs) if rank < rc.dp}
    wall = {i: [] for i in trainers}
    cpu = {i: [] for i in trainers}
    probes = {i: {} for i in trainers}
    for tr in trainers.values():  # first steps: lazily built kernels, allocator growth
        for _ in range(2):
            tr.step()
    for fn in probes_fn.values():
        fn()
    for r in range(rounds):
        order = range(len(rcs)) if r % 2 == 0 else reversed(range(len(rcs)))
        for i in order:
            for name in of_precision.get(rcs[i].precision, ()):
                # the machine's speed now, in this configuration's precision, the other ranks idle
                probe = probes_fn[name]
                sync()
                t0 = now()
                for _ in range(3):
                    probe()
                sync()
                if i in probes:
                    probes[i].setdefault(name, []).append((now() - t0) / 3)
            dist.barrier()
            if i not in trainers:
                continue
            tr = trainers[i]
            tr.step()  # back on this configuration: warm its data and code paths
            for _ in range(steps):
                sync()
                t0, c0 = time.perf_counter(), time.process_time()
                tr.step()
                sync()
                wall[i].append(time.perf_counter() - t0)
                cpu[i].append(time.process_time() - c0)
    out = []
    for i, rc in enumerate(rcs):
        dist.barrier()
        if i not in trainers:
            out.append(None)
            continue
        tr = trainers[i]
        baseline = tensor_bytes(tr.live_tensors())
        peak = peak_live_bytes(tr.step, baseline, dev.type) if rank == 0 else tr.step()
        out.append({"step_times_s": wall[i], "cpu_times_s": cpu[i], "probe_s": probes[i], "peak_bytes": peak,
                    "baseline_bytes": baseline, "params": sum(p.numel() for p in tr.params)})
    return out


def measure_grid(configs: list[RunConfig], threads: int, device: str = "cpu", rounds: int = 5,
                 steps: int = 2, probe_precisions=(), clock: str = "wall", predicted_s: float = 0.0) -> list[dict]:
    """Measurements of every configuration (rank 0's), in order. `predicted_s`: the predicted
    seconds of one step of each configuration, summed: a grid that runs ten times longer than
    predicted, beyond 15 minutes, is taken to hang."""
    from .dist import launch

    world = max(rc.dp for rc in configs)
    return launch(grid_worker, world, ([asdict(rc) for rc in configs], rounds, steps, device, probe_precisions, clock),
                  threads=threads, device=device, timeout_s=900 + 10 * rounds * steps * predicted_s)


def not_native(rc: RunConfig, native: set) -> str | None:
    """Why a configuration is not run on this CPU, or None: it computes in a precision the CPU has no
    instructions for (bf16 without AVX512-BF16 or AMX, Muon's bf16 Newton-Schulz GEMMs too), which
    torch runs by converting in software at a speed no profile measured (the profile's rate is
    another machine's; calibrate measures only the CPU's native precisions, calibration.low_precisions)."""
    needs = {rc.precision} | ({"bf16"} if rc.optimizer == "muon" else set())
    missing = sorted(needs - native)
    return f"this CPU has no native {', '.join(missing)} (AVX512-BF16 or AMX)" if missing else None


# ------------------------------------------------------------------ prediction

def scenario_dict(rc: RunConfig, node: str) -> dict:
    return {
        "name": rc.name,
        "model": rc.gpt.model_fields(),
        "cluster": {"node": node, "nodes": 1, "devices_per_node": rc.dp},
        "plan": {"dp": rc.dp, "micro_batch": rc.micro_batch, "global_batch": rc.micro_batch * rc.grad_accum * rc.dp,
                 "recompute": rc.recompute, "precision": rc.precision, "flash_attention": True, "zero_stage": 0,
                 # torch_model checkpoints each block with torch.utils.checkpoint(use_reentrant=False)
                 **({"recompute_early_stop": True} if rc.recompute == "full" else {}),
                 "dp_overlap": False, "grad_precision": "fp32", "grad_accumulation_fusion": False,
                 "grad_clip": "none",  # trainer.Trainer.step does not clip
                 "optimizer": rc.optimizer,
                 # one GEMM per expert in turn (Megatron-Core's SequentialMLP, torchtitan's for-loop
                 # experts): no grouped GEMM on CPUs
                 **({"moe": {"grouped_gemm": False, "framework": rc.moe_layer,
                             "probs_in_experts": rc.probs_in_experts}} if rc.experts else {}),
                 # torchtitan's layer as the torch model runs it: eager, separate projections
                 **({"compile": False, "projections": "separate"} if rc.moe_layer == "torchtitan" else {})},
    }


def predict(rc: RunConfig, node: str) -> dict:
    from ..evaluate import evaluate
    from ..scenario import scenario_from_dict

    res = evaluate(scenario_from_dict(scenario_dict(rc, node))).to_dict()
    gib = res["memory_gib"]
    tensor_gib = gib["weights"] + gib["gradients"] + gib["optimizer"] + gib["activations"]
    return {"step_time_s": res["step_time_s"], "memory_bytes": tensor_gib * 2**30, "breakdown_s": res["breakdown_s"],
            "memory_gib": gib}


def predict_all(configs: list[RunConfig], node: str) -> tuple[dict, list[dict]]:
    """({name: prediction}, [{config, reason}]): every configuration predicted before any is
    measured, so one the profile cannot express (Muon's bf16 GEMMs on a CPU without bf16) is
    listed with its reason instead of stopping the validation after the runs."""
    predictions, not_run = {}, []
    for rc in configs:
        try:
            predictions[rc.name] = predict(rc, node)
        except InputError as exc:
            not_run.append({"config": rc.name, "reason": str(exc)})
    return predictions, not_run


def gemm_share(rc: RunConfig, node: str, step_s: float) -> float:
    """Share of a configuration's predicted step spent in GEMM kernels: the linears' forward
    and backward (and their forward again under full recomputation) of every layer and the
    lm_head, each micro-batch, at the profile's GEMM curves (compute.op_times)."""
    from ..compute import op_times
    from ..evaluate import compile_scenario
    from ..scenario import scenario_from_dict
    from ..workload import MATMUL, head_ops, layer_ops

    layout = compile_scenario(scenario_from_dict(scenario_dict(rc, node)))
    acc, model, shard = layout.cluster.accelerator, layout.model, layout.shard
    rerun = 1.0 if rc.recompute == "full" else 0.0

    def gemm_s(ops):
        times = [op_times(op, acc, rc.precision) for op in ops if op.kind == MATMUL]
        return sum(t.fwd_s * (1.0 + rerun) + t.bwd_input_s + t.bwd_weight_s for t in times)

    per_microbatch = model.layers * gemm_s(layer_ops(model, shard)) + gemm_s(head_ops(model, shard))
    return float(min(1.0, rc.grad_accum * per_microbatch / step_s))


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


def same_cpu(cal: dict, device: str = "cpu") -> bool | None:
    """Whether a profile's calibration (its `calibration` block) ran on a CPU like this one
    (profile_writer.cpu_identity): None where it does not record the CPU (profiles written
    before calibrations did, and CUDA ones)."""
    from .profile_writer import cpu_identity

    recorded = cal.get("cpu")
    if device != "cpu" or not isinstance(recorded, dict):
        return None
    here = cpu_identity()
    return {k: recorded.get(k) for k in here} == here if here else None


def default_profile(device: str = "cpu", folders=None) -> Path:
    """The profile in `folders` (default: the shipped hardware_profiles/calibrated/; accelerator
    files, not -node/-net) calibrated on this kind of machine (its CPU model or GPU name). On a
    CPU whose identity /proc/cpuinfo gives (profile_writer.cpu_identity), only a profile that
    records this CPU: three EPYC generations share the name "AMD EPYC", and a profile recording
    none (written before calibrations did) is no evidence of this CPU (the one such EPYC profile
    missed a Zen 5's steps by 27 %, docs/calibration.md): it is named in the refusal, for
    --profile. Of several, one whose precisions this CPU computes natively (a bf16 rate only
    where it has AVX512-BF16 or AMX), then the latest calibration date (a fresh clone gives
    every file the same modification time)."""
    import yaml

    from ..hardware import CALIBRATED, profiles_dir
    from .calibration import cpu_has_bf16
    from .profile_writer import cpu_identity

    folders = [profiles_dir() / CALIBRATED] if folders is None else [Path(f) for f in folders]
    accs = [p for f in folders if f.is_dir() for p in sorted(f.glob("*.yaml"))
            if (f / f"{p.stem}-node.yaml").is_file()]
    here = _this_device(device)
    data = {p: yaml.safe_load(p.read_text()) or {} for p in accs}
    named = [p for p in accs if here in str((data[p].get("calibration") or {}).get("device_name", ""))]
    matches = {p: same_cpu(data[p].get("calibration") or {}, device) for p in named}
    identified = device == "cpu" and bool(cpu_identity())
    mine = [p for p in named if matches[p] is True or (matches[p] is None and not identified)]
    if not mine:
        other = [p for p in named if matches[p] is False]
        unrecorded = [p.stem for p in named if matches[p] is None]
        why = (f"; those of that name were calibrated on another CPU generation "
               f"({describe_cpu(data[other[0]]['calibration']['cpu'])})" if other else "")
        why += (f"; {', '.join(unrecorded)} records no CPU (give it as --profile to use it anyway)"
                if unrecorded else "")
        this = f"{here}: {describe_cpu(cpu_identity())}" if identified else here
        raise InputError("--profile", None, f"no profile in {', '.join(map(str, folders))} was calibrated on this "
                         f"{device} ({this}){why}; run `llmsim calibrate` or give --profile")
    bf16_here = device != "cpu" or cpu_has_bf16()

    def rank(p):
        cal = data[p].get("calibration") or {}
        same_precisions = device != "cpu" or ("bf16" in (data[p].get("peak_tflops") or {})) == bf16_here
        return same_precisions, str(cal.get("date", "")), p.stat().st_mtime

    return max(mine, key=rank)


def _pct(pred: float, meas: float) -> float:
    return 100.0 * (pred - meas) / meas


def _mape(rows: list[dict], key: str) -> float:
    return statistics.mean(abs(r[key]) for r in rows) if rows else float("nan")


def run_validation(profile: str | Path | None = None, quick: bool = False, device: str = "cpu",
                   configs: list[RunConfig] | None = None, log=None, rounds: int | None = None) -> dict:
    """Measure and predict every configuration; rows plus MAPE of step time and memory, and the noise."""
    torch = require_torch()
    import yaml

    from .timing import estimate, spread

    if device == "cuda" and not torch.cuda.is_available():
        raise InputError("--device", device, "torch sees no CUDA device here; use --device cpu")
    profile = Path(profile) if profile is not None else default_profile(device)
    node = node_for_profile(profile)
    acc_path = Path(node).with_name(Path(node).stem[: -len("-node")] + ".yaml")
    data = yaml.safe_load(acc_path.read_text()) or {}
    cal = data.get("calibration") or {}
    threads = int(cal.get("threads") or 1)
    clock = cal.get("clock", "wall")  # compare on the clock the profile was calibrated with
    devices = int(cal.get("devices_per_node") or 1)
    precisions = set((data.get("peak_tflops") or {}).keys())
    if configs is None:
        configs = (CUDA_GRID[:2] if quick else CUDA_GRID) if device == "cuda" else (QUICK_GRID if quick else GRID)
    configs = [rc for rc in configs if rc.dp <= devices and rc.precision in precisions]
    predictions, not_run = predict_all(configs, node)
    if device == "cpu":
        from .calibration import low_precisions
        native = {"fp32", *low_precisions(torch, "cpu")}
        emulated = {rc.name: why for rc in configs if (why := not_native(rc, native))}
        not_run += [{"config": name, "reason": why} for name, why in emulated.items() if name in predictions]
        configs = [rc for rc in configs if rc.name not in emulated]
    configs = [rc for rc in configs if rc.name in predictions]
    rounds = rounds or (3 if quick else 5)
    matches = same_cpu(cal, device)
    if log:
        log(f"validate --torch: {len(configs)} configurations x {rounds} interleaved rounds, {device}, "
            f"{threads} thread(s) per device, {clock} clock")
        if matches is False:
            log(f"  the profile was calibrated on {describe_cpu(cal['cpu'])}, not on this CPU: its rates are "
                "that machine's (run `llmsim calibrate` here)")
        for skipped in not_run:
            log(f"  {skipped['config']:32s} not run: {skipped['reason']}")
    probe_s = cal.get("probe_s") or {}
    measured = measure_grid(configs, threads, device, rounds, probe_precisions=sorted(probe_s), clock=clock,
                            predicted_s=sum(predictions[rc.name]["step_time_s"] for rc in configs))
    # the machine's speed during this run relative to calibration, per probe (probe.py): the
    # median over every round's probe; 1 = unchanged
    probe_now = {name: statistics.median(x for m in measured for x in m["probe_s"].get(name, ()))
                 for name in probe_s if any(m["probe_s"].get(name) for m in measured)}
    slowdown = {name: t / probe_s[name] for name, t in probe_now.items()}
    # A GPU's probe reads the clock its own power draw sets: right after a training step its
    # GEMMs ran 1.36x slower than between microbenchmarks (SM 1500-1815 MHz, not the 1980 of
    # a short burst), more than the steps themselves slowed; a dedicated GPU has no
    # co-tenants for the probe to track, so CUDA steps are compared as measured
    # (docs/calibration.md, "CUDA"). The probe's reading is reported all the same.
    corrected = device != "cuda"
    rows = []
    for rc, meas in zip(configs, measured):
        pred = predictions[rc.name]
        raw = meas["cpu_times_s"] if clock == "cpu" else meas["step_times_s"]
        k, share = slowdown.get(rc.precision, 1.0), None
        gemm = rc.precision + GEMM
        if gemm in slowdown and rc.precision in slowdown:  # GEMMs and the rest drift apart (probe.py)
            share = gemm_share(rc, node, pred["step_time_s"])
            rest = (probe_now[rc.precision] - probe_now[gemm]) / (probe_s[rc.precision] - probe_s[gemm])
            k = share * slowdown[gemm] + (1.0 - share) * rest
        applied = k if corrected else 1.0
        value, wall = estimate(raw) / applied, estimate(meas["step_times_s"])
        row = {"config": rc.name, **asdict(rc), "measured_step_s": value,
               "measured_median_s": statistics.median(raw) / applied, "measured_raw_s": estimate(raw),
               "raw_error_pct": None, "machine_slowdown": k, "slowdown_applied": corrected, "gemm_share": share,
               "predicted_step_s": pred["step_time_s"],
               "step_error_pct": _pct(pred["step_time_s"], value),
               "noise_pct": 100.0 * spread(raw),
               "measured_wall_s": wall, "wall_error_pct": _pct(pred["step_time_s"], wall),
               "measured_memory_mib": meas["peak_bytes"] / 2**20, "predicted_memory_mib": pred["memory_bytes"] / 2**20,
               "memory_error_pct": _pct(pred["memory_bytes"], meas["peak_bytes"]),
               "step_times_s": meas["step_times_s"], "cpu_times_s": meas["cpu_times_s"], "params": meas["params"],
               "measured_cpu_s": estimate(meas["cpu_times_s"]),
               "predicted_breakdown_s": pred["breakdown_s"]}
        row["raw_error_pct"] = _pct(pred["step_time_s"], row["measured_raw_s"])
        rows.append(row)
        if log:
            log(f"  {rc.name:32s} step {value * 1e3:8.1f} ms measured (noise {row['noise_pct']:4.1f}%), "
                f"{row['predicted_step_s'] * 1e3:8.1f} predicted ({row['step_error_pct']:+.1f}%); memory "
                f"{row['measured_memory_mib']:7.1f} MiB measured, {row['predicted_memory_mib']:7.1f} predicted "
                f"({row['memory_error_pct']:+.1f}%)")
    out = {"profile": str(acc_path), "same_cpu": matches, "device": device, "threads": threads,
           "clock": clock, "quick": quick,
           "rounds": rounds, "rows": rows, "not_run": not_run, "mape_pct": _mape(rows, "step_error_pct"),
           "max_abs_error_pct": max((abs(r["step_error_pct"]) for r in rows), default=float("nan")),
           "wall_mape_pct": _mape(rows, "wall_error_pct"), "memory_mape_pct": _mape(rows, "memory_error_pct"),
           "median_noise_pct": statistics.median(r["noise_pct"] for r in rows) if rows else float("nan"),
           "raw_mape_pct": _mape(rows, "raw_error_pct"),
           "machine_slowdown": statistics.median(r["machine_slowdown"] for r in rows) if rows else float("nan"),
           "machine_slowdown_by_precision": slowdown,
           "load_average": list(os.getloadavg())}
    out["recorded"] = record(acc_path, data, out, device)
    if log:
        log(f"  residuals {'recorded in ' + out['recorded'] if out['recorded'].endswith('.yaml') else out['recorded']}")
    return out


def _this_device(device: str) -> str:
    if device == "cuda":
        import torch

        return torch.cuda.get_device_name(0)
    from .profile_writer import cpu_model

    return cpu_model()


def record(acc_path: Path, data: dict, out: dict, device: str) -> str:
    """Record the rows' measured and predicted step times in the profile (calibration.validation),
    from which intervals.py computes prediction intervals; only when this is the machine the
    profile describes, and never into a profile shipped with llmsim: package data is not written
    (resources.py), so one user's machine does not reset the intervals every other user gets.
    Returns the path written, or why not."""
    from ..hardware import load_accelerator
    from ..resources import data_dir
    from .profile_writer import _dump, today

    if Path(acc_path).resolve().is_relative_to(data_dir().resolve()):
        return (f"not recorded: {Path(acc_path).name} ships with llmsim and its data is never written; "
                f"`llmsim calibrate -o NAME` makes a profile of this machine that records its validations")
    cal = data.get("calibration") or {}
    here = _this_device(device)
    if cal.get("device") != device or here not in str(cal.get("device_name", "")):
        return f"not recorded: the profile describes {cal.get('device_name')!r}, this is {here!r}"
    if same_cpu(cal, device) is False:
        return f"not recorded: the profile was calibrated on {describe_cpu(cal['cpu'])}, this is another CPU"
    rows = [{"config": r["config"], "measured_step_s": float(f"{r['measured_step_s']:.5g}"),
             "predicted_step_s": float(f"{r['predicted_step_s']:.5g}"), "noise_pct": round(r["noise_pct"], 1)}
            for r in out["rows"]]
    cal["validation"] = {
        "date": today(), "tool": f"llmsim validate --torch{' --quick' if out['quick'] else ''} --device {device}",
        "clock": out["clock"], "basis": f"{len(rows)} llmsim validate --torch rows on this machine ({today()[:10]})",
        "mape_pct": round(out["mape_pct"], 2), "median_noise_pct": round(out["median_noise_pct"], 2), "rows": rows}
    data["calibration"] = cal
    _dump(data, acc_path, "# Written by `llmsim calibrate`; schema in hardware_profiles/README.md.\n")
    load_accelerator(str(acc_path))  # still a valid profile
    return str(acc_path)
