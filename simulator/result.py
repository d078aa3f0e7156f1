"""Result of evaluating one scenario: memory, time, throughput, cost, and why."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

GIB = 2**30
BREAKDOWN_KEYS = ("compute", "recompute", "tp_comm", "cp_comm", "pp_comm", "dp_comm", "pipeline_bubble",
                  "optimizer", "offload", "other")
MEMORY_KEYS = ("weights", "gradients", "optimizer", "activations", "other")


@dataclass(frozen=True)
class Result:
    """One evaluation. Times in seconds, memory in bytes; `to_dict` converts at the edge.

    FLOP conventions: model FLOPs exclude recomputation (MFU, PaLM convention); hardware
    FLOPs include it (HFU; Megatron-LM's "achieved TFLOP/s").
    """

    scenario: str
    feasible: bool
    reason: str
    step_time_s: float
    global_batch: int
    seq_len: int
    devices: int
    model_flops_per_step: float
    hardware_flops_per_step: float
    peak_flops_per_device: float
    peak_memory_bytes: float
    peak_memory_stage: int
    memory_bytes: dict  # of the peak stage, MEMORY_KEYS
    memory_by_stage: list  # list of dicts, one per pipeline stage
    capacity_bytes: float
    breakdown_s: dict  # BREAKDOWN_KEYS, exposed seconds summing to step_time_s
    price_usd_per_device_hour: float
    training_tokens: float | None = None
    engine: str = "analytic"
    extra: dict = field(default_factory=dict)

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

    @property
    def cost_usd_per_step(self) -> float:
        return self.step_time_s * self.devices * self.price_usd_per_device_hour / 3600.0

    def to_dict(self) -> dict:
        """The JSON contract of `llmsim evaluate --json` (units in the key names)."""
        tps = self.tokens_per_s
        usd_per_token = self.cost_usd_per_step / self.tokens_per_step
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
            "memory_capacity_gib": self.capacity_bytes / GIB,
            "memory_gib": {k: self.memory_bytes[k] / GIB for k in MEMORY_KEYS},
            "memory_gib_by_stage": [{k: st[k] / GIB for k in MEMORY_KEYS} for st in self.memory_by_stage],
            "breakdown_s": dict(self.breakdown_s),
            "devices": self.devices,
            "global_batch": self.global_batch,
            "seq_len": self.seq_len,
            "model_flops_per_step": self.model_flops_per_step,
            "hardware_flops_per_step": self.hardware_flops_per_step,
            "price_usd_per_device_hour": self.price_usd_per_device_hour,
            "cost_usd_per_step": self.cost_usd_per_step,
            "usd_per_million_tokens": usd_per_token * 1e6,
            "training_tokens": self.training_tokens,
            "time_to_train_days": None,
            "cost_to_train_usd": None,
            "flop_convention": "model FLOPs exclude recomputation (MFU); hardware FLOPs include it (HFU)",
        }
        if self.training_tokens:
            out["time_to_train_days"] = self.training_tokens / tps / 86400.0
            out["cost_to_train_usd"] = self.training_tokens * usd_per_token
        out.update(self.extra)
        return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in out.items()}
