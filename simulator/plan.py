"""Parallelism plan and its validation against a model and a cluster.

Rank layout: TP innermost, then CP, DP, PP outermost (Megatron-LM's default order
tp-cp-dp-pp), so a TP group shares a node whenever tp <= devices_per_node. `rank_order`
changes it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from . import fields as F
from .errors import InputError
from .hardware import Cluster
from .model import ModelSpec

SCHEDULES = ("gpipe", "1f1b", "interleaved", "zb-h1")
RECOMPUTE = ("none", "selective", "full")
PRECISIONS = ("fp32", "tf32", "bf16", "fp16", "fp8")
OFFLOAD_TARGETS = ("none", "cpu", "nvme")
GRAD_PRECISIONS = ("fp32", "bf16", "fp16")
DIMENSIONS = ("tp", "cp", "dp", "pp")


@dataclass(frozen=True)
class Offload:
    optimizer: str = "none"
    params: str = "none"
    activations: str = "none"


@dataclass(frozen=True)
class Plan:
    tp: int = 1
    pp: int = 1
    dp: int = 1
    cp: int = 1
    vpp: int = 1
    micro_batch: int = 1
    global_batch: int = 1
    schedule: str = "1f1b"
    sequence_parallel: bool = False
    recompute: str = "none"
    zero_stage: int = 0
    precision: str = "bf16"
    offload: Offload = Offload()
    flash_attention: bool = True
    # Gradient reduction overlapped with the backward pass (PyTorch DDP, Megatron
    # --overlap-grad-reduce). Megatron-LM before 2023 reduced after the backward pass.
    dp_overlap: bool = True
    # TP collectives overlapped with GEMMs (Transformer Engine userbuffers); off by default.
    tp_comm_overlap: bool = False
    # Precision of the gradients kept for accumulation and reduction. Megatron-LM keeps
    # fp32 "main grads" (--accumulate-allreduce-grads-in-fp32); DeepSpeed keeps 16-bit.
    grad_precision: str = "fp32"
    # [issue 10] Weight-gradient GEMMs accumulate into the fp32 main grads themselves
    # (Megatron-LM --gradient-accumulation-fusion, its default); false: a separate add per
    # parameter and micro-batch, as torch's AccumulateGrad (framework_ops.py).
    grad_accumulation_fusion: bool = True
    rank_order: str = "tp-cp-dp-pp"
    # An explicit per-stage op order ("F0", "B0", "W0", "F1.0" = chunk 1 of micro-batch 0)
    # run by the graph engine in place of the named schedule's (schedules.py).
    schedule_ops: tuple | None = None

    @property
    def model_parallel(self) -> int:
        return self.tp * self.pp * self.cp

    @property
    def devices(self) -> int:
        return self.tp * self.pp * self.dp * self.cp

    @property
    def microbatches(self) -> int:
        """Micro-batches per step per data-parallel replica (gradient accumulation steps)."""
        return self.global_batch // (self.micro_batch * self.dp)

    @property
    def sp(self) -> bool:
        """Sequence parallelism takes effect only with tensor parallelism."""
        return self.sequence_parallel and self.tp > 1

    @property
    def virtual_stages(self) -> int:
        return self.vpp if self.schedule == "interleaved" else 1


PLAN_KEYS = ("tp", "pp", "dp", "cp", "vpp", "micro_batch", "global_batch", "schedule", "sequence_parallel",
             "recompute", "zero_stage", "precision", "offload", "flash_attention", "dp_overlap",
             "tp_comm_overlap", "grad_precision", "rank_order", "schedule_ops", "grad_accumulation_fusion")


def plan_from_dict(data, devices: int | None = None) -> Plan:
    """Read the scenario's `plan` section. `dp` may be omitted or `auto`: it fills the device count."""
    data = F.require_mapping(data, "plan")
    F.reject_unknown(data, PLAN_KEYS, "plan")
    tp = F.integer(data, "tp", "plan", 1, maximum=10**6)
    pp = F.integer(data, "pp", "plan", 1, maximum=10**6)
    cp = F.integer(data, "cp", "plan", 1, maximum=10**6)
    if data.get("dp") in (None, "auto"):
        if devices is None:
            raise InputError("plan.dp", data.get("dp"), "expected an integer")
        if devices % (tp * pp * cp):
            raise InputError("plan.tp", tp, f"tp*pp*cp = {tp * pp * cp} must divide the {devices} devices")
        dp = devices // (tp * pp * cp)
    else:
        dp = F.integer(data, "dp", "plan", maximum=10**8)
    off = F.require_mapping(data.get("offload") or {}, "plan.offload")
    F.reject_unknown(off, ("optimizer", "params", "activations"), "plan.offload")
    offload = Offload(*(F.choice(off, k, "plan.offload", OFFLOAD_TARGETS, "none")
                        for k in ("optimizer", "params", "activations")))
    precision = F.choice(data, "precision", "plan", PRECISIONS, "bf16")
    order = F.text(data, "rank_order", "plan", "tp-cp-dp-pp")
    if sorted(order.split("-")) != sorted(DIMENSIONS):
        raise InputError("plan.rank_order", order, "a permutation of tp, cp, dp, pp joined by '-', innermost first")
    return Plan(
        tp=tp, pp=pp, dp=dp, cp=cp,
        vpp=F.integer(data, "vpp", "plan", 1, maximum=10**4),
        micro_batch=F.integer(data, "micro_batch", "plan", 1, maximum=10**7),
        global_batch=F.integer(data, "global_batch", "plan", maximum=10**9),
        schedule=F.choice(data, "schedule", "plan", SCHEDULES, "1f1b"),
        sequence_parallel=F.boolean(data, "sequence_parallel", "plan", False),
        recompute=F.choice(data, "recompute", "plan", RECOMPUTE, "none"),
        zero_stage=F.integer(data, "zero_stage", "plan", 0, minimum=0, maximum=3),
        precision=precision,
        offload=offload,
        flash_attention=F.boolean(data, "flash_attention", "plan", True),
        dp_overlap=F.boolean(data, "dp_overlap", "plan", True),
        tp_comm_overlap=F.boolean(data, "tp_comm_overlap", "plan", False),
        grad_precision=F.choice(data, "grad_precision", "plan", GRAD_PRECISIONS, "fp32"),
        grad_accumulation_fusion=F.boolean(data, "grad_accumulation_fusion", "plan", True),
        rank_order=order,
        schedule_ops=_schedule_ops(data.get("schedule_ops")),
    )


def _schedule_ops(value):
    if value is None:
        return None
    if not isinstance(value, (list, tuple)) or not all(isinstance(s, (list, tuple)) for s in value):
        raise InputError("plan.schedule_ops", value, "a list with one list of ops (F0, B0, W0, F1.0) per pipeline stage")
    return tuple(tuple(str(op) for op in stage) for stage in value)


def validate(plan: Plan, model: ModelSpec, cluster: Cluster) -> None:
    """Raise InputError for a plan that cannot be laid out on this model and cluster."""
    if plan.devices != cluster.devices:
        raise InputError("plan.dp", plan.dp, f"tp*pp*dp*cp = {plan.tp}*{plan.pp}*{plan.dp}*{plan.cp} = "
                         f"{plan.devices} must equal the cluster's {cluster.devices} devices")
    _divides("plan.tp", plan.tp, "model.heads", model.heads)
    if model.kv_heads % plan.tp and plan.tp % model.kv_heads:
        raise InputError("plan.tp", plan.tp, f"must divide kv_heads={model.kv_heads}, or be a multiple of it "
                         "(each KV head is then replicated tp/kv_heads times)")
    _divides("plan.tp", plan.tp, "model.ffn_hidden", model.ffn_hidden)
    if plan.schedule != "interleaved" and plan.vpp != 1:
        raise InputError("plan.vpp", plan.vpp, "vpp > 1 needs schedule: interleaved")
    if plan.schedule == "interleaved" and plan.pp == 1:
        raise InputError("plan.schedule", plan.schedule, "interleaved needs pp > 1")
    stages = plan.pp * plan.virtual_stages
    if model.layers % stages:
        raise InputError("plan.pp", plan.pp, f"pp*vpp = {stages} must divide layers={model.layers}")
    if plan.cp > 1 and model.seq_len % (2 * plan.cp):
        raise InputError("plan.cp", plan.cp, f"2*cp must divide seq_len={model.seq_len} (load-balanced causal chunks)")
    if plan.sp and (model.seq_len // plan.cp) % plan.tp:
        raise InputError("plan.sequence_parallel", True, f"tp={plan.tp} must divide the sequence per CP rank "
                         f"({model.seq_len // plan.cp})")
    if plan.global_batch % (plan.micro_batch * plan.dp):
        raise InputError("plan.global_batch", plan.global_batch,
                         f"must be a multiple of micro_batch*dp = {plan.micro_batch * plan.dp}")
    m = plan.microbatches
    if plan.schedule == "interleaved" and m % plan.pp:
        raise InputError("plan.global_batch", plan.global_batch, f"interleaved needs micro-batches per replica "
                         f"({m}) to be a multiple of pp={plan.pp}")
    if plan.schedule_ops is not None:
        from .schedules import explicit
        explicit(plan.schedule_ops, plan.pp, m, plan.virtual_stages, split_w=plan.schedule == "zb-h1")
    off = plan.offload
    if off.optimizer != "none" and plan.zero_stage < 1:
        raise InputError("plan.offload.optimizer", off.optimizer, "optimizer offload (ZeRO-Offload) needs zero_stage >= 1")
    if off.params != "none" and plan.zero_stage < 3:
        raise InputError("plan.offload.params", off.params, "parameter offload (ZeRO-Infinity) needs zero_stage 3")
    cluster.accelerator.peak(plan.precision)
    if plan.precision == "fp16" and plan.grad_precision == "bf16":
        raise InputError("plan.grad_precision", "bf16", "fp16 training keeps fp16 or fp32 gradients")


def _divides(field: str, value: int, target_field: str, target: int) -> None:
    if target % value:
        raise InputError(field, value, f"must divide {target_field}={target}")
