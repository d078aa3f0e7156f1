"""Result of evaluating one scenario: memory, time, throughput, and why. Numbers only: the
engines fill it, economics.py prices it, `to_dict` converts units at the edge."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from .economics import Economics
from .memory import MEMORY_KEYS

GIB = 2**30
SECONDS_PER_DAY = 86400.0
# What a plan that does not fit has none of: money and the run to train (its step-level
# prediction stays, with the reason it does not fit)
NOT_FOR_INFEASIBLE = ("cost_usd_per_step", "usd_per_million_tokens", "time_to_train_days", "cost_to_train_usd",
                      "interruptions", "energy_kwh_to_train", "time_to_train_days_no_failures",
                      "cost_to_train_usd_no_failures", "energy_cost_to_train_usd", "lost_time_days")
BREAKDOWN_KEYS = ("compute", "recompute", "tp_comm", "cp_comm", "ep_comm", "pp_comm", "dp_comm", "pipeline_bubble",
                  "optimizer", "offload", "data", "other")
FLOP_CONVENTION = ("model FLOPs: useful forward and backward FLOPs, causal attention counted over its unmasked "
                   "half (less what sliding windows and packed documents mask), no recomputation (MFU); "
                   "hardware FLOPs: executed FLOPs with recomputation and the "
                   "kernels' extra work, e.g. flash attention's backward recomputing QK^T and a materialised "
                   "attention's masked half (HFU). MFU <= HFU <= 1. Mixture-of-Experts layers: model FLOPs count "
                   "the router, the shared experts and the top-k routed experts of every token (less the tokens a "
                   "capacity factor below 1 drops); hardware FLOPs the routed rows the experts execute (padded to "
                   "capacity when padding). Multi-head latent attention is counted as its own low-rank "
                   "projections.")


@dataclass(frozen=True)
class Result:
    """One evaluation. Times in seconds, memory in bytes, FLOPs per step."""

    scenario: str
    engine: str
    feasible: bool
    reason: str
    step_time_s: float
    breakdown_s: dict  # BREAKDOWN_KEYS, exposed seconds summing to step_time_s
    global_batch: int
    seq_len: int
    devices: int
    model_flops_per_step: float
    hardware_flops_per_step: float
    peak_flops_per_device: float
    peak_memory_bytes: float  # live tensors (torch's max_memory_allocated): what must fit
    peak_memory_stage: int
    peak_reserved_bytes: float  # with the caching allocator's free blocks (max_memory_reserved), allocator.py
    memory_bytes: dict  # of the peak stage, MEMORY_KEYS
    memory_by_stage: list  # one MEMORY_KEYS dict per pipeline stage
    capacity_bytes: float
    host_bytes_per_device: float  # host memory taken by what a device offloads to the CPU
    economics: Economics
    extra: dict = field(default_factory=dict)  # engine details (graph: tasks simulated)
    parameters: float = 0.0  # trainable parameters of the model
    active_parameters: float = 0.0  # parameters one token uses (top-k routed experts; all of a dense model)
    whole_run: object = None  # wholerun.WholeRun: data pipeline, goodput, energy

    def __repr__(self) -> str:
        """A few lines for a notebook or a shell: whether the plan fits, its speed and memory, and
        the run's time and cost where the scenario gives a token budget; every field is in to_dict()."""
        fits = "fits" if self.feasible else f"does not fit: {self.reason}"
        lines = [f"Result of {self.scenario!r} ({self.engine} engine): {fits}",
                 f"  step {self.step_time_s:.4g} s, {self.tokens_per_s:,.0f} tokens/s, MFU {100 * self.mfu:.1f} %",
                 f"  peak memory {self.peak_memory_bytes / GIB:.1f} GiB of {self.capacity_bytes / GIB:.1f} "
                 f"(pipeline stage {self.peak_memory_stage})"]
        e = self.economics
        if self.feasible and e.time_to_train_s is not None:
            cost = "" if e.cost_to_train_usd is None else f", {e.cost_to_train_usd:,.0f} USD"
            tokens = e.training_tokens
            tokens = f"{tokens / 1e12:.3g}T" if tokens >= 1e12 else f"{tokens / 1e9:.3g}B"
            lines.append(f"  {tokens} tokens in {e.time_to_train_s / SECONDS_PER_DAY:.3g} days{cost}")
        return "\n".join(lines + ["  (every field: .to_dict())"])

    @property
    def tokens_per_step(self) -> int:
        return self.global_batch * self.seq_len

    @property
    def tokens_per_s(self) -> float:
        return self.tokens_per_step / self.step_time_s

    @property
    def mfu(self) -> float:
        return self.model_flops_per_step / self.step_time_s / self.devices / self.peak_flops_per_device

    @property
    def hfu(self) -> float:
        return self.hardware_flops_per_step / self.step_time_s / self.devices / self.peak_flops_per_device

    def to_dict(self) -> dict:
        """The JSON contract of `llmsim evaluate --json` (units in the key names)."""
        e = self.economics
        tps = self.tokens_per_s
        out = {
            "scenario": self.scenario,
            "engine": self.engine,
            "feasible": self.feasible,
            "reason": self.reason,
            "step_time_s": self.step_time_s,
            "tokens_per_s": tps,
            "tokens_per_s_per_device": tps / self.devices,
            "model_tflops_per_device": self.model_flops_per_step / self.step_time_s / self.devices / 1e12,
            "hardware_tflops_per_device": self.hardware_flops_per_step / self.step_time_s / self.devices / 1e12,
            "mfu": self.mfu,
            "hfu": self.hfu,
            "peak_memory_gib": self.peak_memory_bytes / GIB,
            "peak_memory_stage": self.peak_memory_stage,
            "peak_reserved_gib": self.peak_reserved_bytes / GIB,
            "memory_capacity_gib": self.capacity_bytes / GIB,
            "memory_gib": {k: self.memory_bytes[k] / GIB for k in MEMORY_KEYS},
            "memory_gib_by_stage": [{k: st[k] / GIB for k in MEMORY_KEYS} for st in self.memory_by_stage],
            "host_memory_gib_per_device": self.host_bytes_per_device / GIB,
            "breakdown_s": dict(self.breakdown_s),
            "devices": self.devices,
            "global_batch": self.global_batch,
            "seq_len": self.seq_len,
            "model_flops_per_step": self.model_flops_per_step,
            "hardware_flops_per_step": self.hardware_flops_per_step,
            "price_usd_per_device_hour": e.price_usd_per_device_hour,
            "cost_usd_per_step": e.cost_usd_per_step,
            "usd_per_million_tokens": e.usd_per_million_tokens,
            "training_tokens": e.training_tokens,
            "time_to_train_days": None if e.time_to_train_s is None else e.time_to_train_s / SECONDS_PER_DAY,
            "cost_to_train_usd": e.cost_to_train_usd,
            "flop_convention": FLOP_CONVENTION,
            "parameters": self.parameters,
            "active_parameters": self.active_parameters,
        }
        if self.whole_run is not None:
            out.update(whole_run_dict(self.whole_run, e, self.step_time_s))
        out.update(self.extra)
        infeasible = ~np.asarray(self.feasible, dtype=bool)  # one plan, or a batch of them (vector.py)
        if infeasible.any():
            for k in NOT_FOR_INFEASIBLE:
                if out.get(k) is not None:
                    out[k] = None if infeasible.ndim == 0 else np.where(infeasible, np.nan, out[k])
        return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in out.items()}


_STAGE_JSON = "{" + ", ".join(f'"{k}": %s' for k in MEMORY_KEYS) + "}"


def stage_memory_json(numbers) -> str:
    """The JSON text of one stage's memory_gib_by_stage mapping from its numbers as JSON text
    (MEMORY_KEYS order), as json.dumps writes it."""
    return _STAGE_JSON % tuple(numbers)


def _days(seconds):
    return None if seconds is None else seconds / SECONDS_PER_DAY


def whole_run_dict(run, e: Economics, step_s) -> dict:
    """The whole-run keys of the JSON contract (docs/whole-run.md)."""
    g, data, en = run.goodput, run.data, run.energy
    out = {
        "goodput": g.goodput,
        "interruptions": e.interruptions,
        "checkpoint_interval_s": g.interval_s,
        "energy_kwh_per_step": en.kwh_per_step,
        "energy_kwh_to_train": e.energy_kwh_to_train,
        "data_bound": data.exposed_s > 0,
        "time_to_train_days_no_failures": _days(e.time_to_train_s_no_failures),
        "cost_to_train_usd_no_failures": e.cost_to_train_usd_no_failures,
        "energy_cost_to_train_usd": e.energy_cost_to_train_usd,
        "lost_time_days": _days(e.lost_time_s),
        "failure_mtbf_hours": g.mtbf_s / 3600.0,
        "checkpoint_gib": g.checkpoint_bytes / GIB,
        "checkpoint_stall_s": g.checkpoint.stall_s,
        "checkpoint_write_s": g.checkpoint.stall_s + g.checkpoint.background_s,
        "restart_s": g.restart_s,
        "data_time_s": data.data_s,
        "data_idle_fraction": data.exposed_s / step_s,
        "power_kw": en.step_power_w / 1e3,
    }
    # a single plan's 0-d arrays and numpy booleans become Python numbers (a batch's arrays stay)
    return {k: v.item() if type(v) is np.bool_ or (type(v) is np.ndarray and v.ndim == 0) else v
            for k, v in out.items()}


def require_finite(values: dict, where: str) -> None:
    """Raise if a computed number is not finite: inputs are bounded to physical ranges, so a
    NaN or an infinity is a bug to report, never a result to print."""
    from .errors import InputError

    for key, value in values.items():
        if isinstance(value, dict):
            require_finite(value, where)
        elif value is not None and not isinstance(value, (bool, str, list)) and not np.all(np.isfinite(value)):
            raise InputError(where, key, "the prediction is not a finite number; please report this scenario")
