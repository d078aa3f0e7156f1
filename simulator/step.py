"""Per-micro-batch costs of each pipeline stage, shared by the analytic and graph engines.

A stage's device runs, per micro-batch, the forward, backward-input and backward-weight
kernels of its layers (plus the embedding on the first stage and the lm_head and loss on
the last), the TP collectives inside each layer, the CP ring exchange of keys and
values, activation recomputation, and the pipeline send/recv at its boundaries.
All times are seconds per micro-batch on one device; numbers may be numpy arrays.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from . import framework_ops
from .comm import Placement, collective_time, placement, send_recv_time
from .compute import op_times
from .hardware import Cluster
from .memory import shard_of, stage_params, weight_bytes_per_param, grad_bytes_per_param
from .model import ModelSpec
from .plan import Plan
from .workload import ATTENTION_CORE, MATMUL, Op, embedding_ops, head_ops, layer_ops


@dataclass(frozen=True)
class OpsCost:
    """Summed kernel times of a list of operators."""

    fwd: object
    bwd_input: object
    bwd_weight: object
    attention_fwd: object  # forward time of attention kernels (hides the CP exchange)
    attention_bwd: object
    matmul_fwd: object  # forward time of GEMMs (hides TP collectives when overlapped)
    selective_recomputes: bool = True

    @property
    def recompute_selective(self):
        """Selective recomputation re-runs the attention core, except a flash kernel (which
        saves no score matrix and so has nothing to drop)."""
        return self.attention_fwd if self.selective_recomputes else 0.0

    @property
    def bwd(self):
        return self.bwd_input + self.bwd_weight


def ops_cost(ops: list[Op], cluster: Cluster, precision: str, flash: bool) -> OpsCost:
    acc = cluster.accelerator
    fwd = bin_ = bw = att_f = att_b = mm_f = 0.0
    for op in ops:
        t = op_times(op, acc, precision)
        fwd, bin_, bw = fwd + t.fwd, bin_ + t.bwd_input, bw + t.bwd_weight
        if op.group == ATTENTION_CORE:
            att_f, att_b = att_f + t.fwd, att_b + t.bwd
        elif op.kind == MATMUL:
            mm_f = mm_f + t.fwd
    return OpsCost(fwd, bin_, bw, att_f, att_b, mm_f, selective_recomputes=not flash)


@dataclass(frozen=True)
class Groups:
    tp: Placement
    cp: Placement
    dp: Placement  # gradient reduction group: dp x cp ranks (Megatron-LM)
    pp_crosses_domain: object


def groups(plan: Plan, cluster: Cluster) -> Groups:
    sizes = {"tp": plan.tp, "cp": plan.cp, "dp": plan.dp, "pp": plan.pp}
    order, domain = plan.rank_order, cluster.scaleup_domain
    tp = placement(sizes, "tp", order, domain)
    cp = placement(sizes, "cp", order, domain)
    # DP and CP ranks hold the same weights and reduce gradients together (Megatron-LM).
    dp = placement(sizes, ("cp", "dp"), order, domain)
    pp = placement(sizes, "pp", order, domain)
    return Groups(tp=tp, cp=cp, dp=dp, pp_crosses_domain=pp.domains > 1)


@dataclass(frozen=True)
class StageCost:
    """Seconds per micro-batch on one device of a pipeline stage."""

    stage: int
    fwd: object  # compute kernels
    bwd_input: object
    bwd_weight: object
    recompute: object
    tp_comm: object  # exposed
    cp_comm: object  # exposed
    pp_comm: object  # send/recv on the critical path
    params: object  # parameters on the device before ZeRO sharding
    tp_comm_fwd: object = 0.0  # the forward pass's share of tp_comm (the rest is backward + recompute)
    cp_comm_fwd: object = 0.0  # the forward pass's share of cp_comm
    tp_comm_recompute: object = 0.0  # the recomputation's share of tp_comm
    cp_comm_recompute: object = 0.0  # the recomputation's share of cp_comm
    framework_step: object = 0.0  # [issue 10] per-step framework operators (framework_ops.step_seconds)

    @property
    def bwd(self):
        return self.bwd_input + self.bwd_weight

    @property
    def compute(self):
        return self.fwd + self.bwd

    @property
    def total(self):
        return self.compute + self.recompute + self.tp_comm + self.cp_comm + self.pp_comm


def _tp_layer_comm(model: ModelSpec, plan: Plan, cluster: Cluster, g: Groups, act_bytes: int):
    """TP communication of one layer per micro-batch: (forward, backward) seconds.

    Two all-reduces of the b·s·h activation per layer in the forward pass and two in the
    backward pass (Shoeybi et al. 2019, Megatron-LM). With sequence parallelism each
    becomes an all-gather plus a reduce-scatter of the same volume (Korthikanti 2022), and
    the backward pass all-gathers the sequence-sharded input of the two column-parallel
    GEMMs again for their weight gradients (Megatron-LM
    LinearWithGradAccumulationAndAsyncCommunication.backward).
    """
    nbytes = act_bytes * plan.micro_batch * model.seq_len / plan.cp * model.hidden
    if plan.sp:
        gather = collective_time("all_gather", nbytes, g.tp, cluster)
        fwd = 2 * (gather + collective_time("reduce_scatter", nbytes, g.tp, cluster))
        return fwd, fwd + 2 * gather
    fwd = 2 * collective_time("all_reduce", nbytes, g.tp, cluster)
    return fwd, fwd


def _cp_layer_comm(model: ModelSpec, plan: Plan, cluster: Cluster, g: Groups, act_bytes: int):
    """CP ring attention: cp-1 exchanges of the local K and V chunk forward, K, V and their
    gradients backward (Liu et al. 2023, Ring Attention; Megatron-LM context parallelism)."""
    from .workload import local_heads
    _, kv_heads = local_heads(model, plan.tp)
    kv_bytes = 2 * act_bytes * plan.micro_batch * model.seq_len / plan.cp * kv_heads * model.head_dim
    hop = send_recv_time(kv_bytes, g.cp.domains > 1, cluster)
    steps = plan.cp - 1
    return steps * hop, 2 * steps * hop


def stage_cost(model: ModelSpec, plan: Plan, cluster: Cluster, stage, g: Groups | None = None) -> StageCost:
    """Seconds per micro-batch of one device of pipeline stage `stage`.

    Broadcast-safe: plan sizes and `stage` may be numpy arrays (vectorised sweeps); the
    first and last stage's extra operators are added with 0/1 indicators, not branches.
    """
    g = groups(plan, cluster) if g is None else g
    shard = shard_of(plan, model)
    layers = model.layers / plan.pp
    layer = ops_cost(layer_ops(model, shard), cluster, plan.precision, plan.flash_attention)
    fwd, bin_, bw = layers * layer.fwd, layers * layer.bwd_input, layers * layer.bwd_weight
    first = np.asarray(stage == 0)
    last = np.asarray(stage == plan.pp - 1)
    emb = ops_cost(embedding_ops(model, shard), cluster, plan.precision, plan.flash_attention)
    head = ops_cost(head_ops(model, shard), cluster, plan.precision, plan.flash_attention)
    fwd = fwd + first * emb.fwd + last * head.fwd
    bin_ = bin_ + first * emb.bwd_input + last * head.bwd_input
    bw = bw + first * emb.bwd_weight + last * head.bwd_weight
    # [issue 10] framework operators (bias gradients, gradient accumulation, ...) with the weight
    # gradients; kernels slow down while the node's other devices share its caches (CPUs)
    bw = bw + framework_ops.microbatch_seconds(model, plan, cluster, stage)
    co_run = framework_ops.co_run_factor(cluster)
    fwd, bin_, bw = co_run * fwd, co_run * bin_, co_run * bw

    has_tp = np.asarray(plan.tp) > 1
    tp_one, tp_back = _tp_layer_comm(model, plan, cluster, g, shard.act_bytes)
    tp_fwd, tp_bwd = np.where(has_tp, tp_one, 0.0), np.where(has_tp, tp_back, 0.0)
    if plan.tp_comm_overlap:
        tp_fwd = np.maximum(0.0, tp_fwd - layer.matmul_fwd)
        tp_bwd = np.maximum(0.0, tp_bwd - layer.bwd)
    cp_fwd, cp_bwd = _cp_layer_comm(model, plan, cluster, g, shard.act_bytes)
    has_cp = np.asarray(plan.cp) > 1
    cp_fwd = np.maximum(0.0, np.where(has_cp, cp_fwd, 0.0) - layer.attention_fwd)
    cp_bwd = np.maximum(0.0, np.where(has_cp, cp_bwd, 0.0) - layer.attention_bwd)

    recompute = 0.0
    tp_recompute = 0.0
    if plan.recompute == "full":
        recompute = co_run * layers * layer.fwd  # [issue 10] co_run
        tp_recompute, cp_recompute = tp_fwd, cp_fwd
    elif plan.recompute == "selective":
        recompute = co_run * layers * layer.recompute_selective  # [issue 10] co_run
        cp_recompute = 0.0
    else:
        cp_recompute = 0.0

    # Megatron-LM's scatter/gather optimisation sends 1/t of the activation per TP rank.
    nbytes = shard.act_bytes * plan.micro_batch * model.seq_len / plan.cp * model.hidden / plan.tp
    hop = send_recv_time(nbytes, g.pp_crosses_domain, cluster)
    # receive from the left, send to the right (as integers: numpy booleans would add as `or`)
    sends = np.asarray(stage > 0, dtype=int) + np.asarray(stage < plan.pp - 1, dtype=int)
    pp_comm = np.where(np.asarray(plan.pp) > 1, plan.virtual_stages * sends * hop, 0.0)  # activation, gradient
    return StageCost(stage=stage, fwd=fwd, bwd_input=bin_, bwd_weight=bw, recompute=recompute,
                     tp_comm=layers * (tp_fwd + tp_bwd + tp_recompute),
                     cp_comm=layers * (cp_fwd + cp_bwd + cp_recompute),
                     pp_comm=pp_comm, params=stage_params(model, plan, stage),
                     tp_comm_fwd=layers * tp_fwd, cp_comm_fwd=layers * cp_fwd,
                     tp_comm_recompute=layers * tp_recompute, cp_comm_recompute=layers * cp_recompute,
                     framework_step=framework_ops.step_seconds(model, plan, cluster, stage))  # [issue 10]


def representative_stages(plan: Plan) -> tuple[list, list]:
    """Stages (first, a middle one, last) standing for the whole pipeline, and how many
    stages each stands for; broadcast-safe. With pp = 1 or 2 the repeated
    representatives count zero times, so sums over them equal sums over all stages."""
    pp = np.asarray(plan.pp)
    stages = [np.zeros_like(pp), np.minimum(1, pp - 1), pp - 1]
    mult = [np.ones_like(pp), np.maximum(pp - 2, 0), (pp > 1).astype(pp.dtype)]
    return stages, mult


def representative_stage_costs(model: ModelSpec, plan: Plan, cluster: Cluster,
                               g: Groups | None = None) -> tuple[list[StageCost], list]:
    """StageCost of each representative stage and its multiplicity (see representative_stages)."""
    g = groups(plan, cluster) if g is None else g
    stages, mult = representative_stages(plan)
    return [stage_cost(model, plan, cluster, s, g) for s in stages], mult


# ------------------------------------------------------------------ data parallelism

def dp_costs(plan: Plan, cluster: Cluster, params, g: Groups | None = None) -> dict:
    """Collective seconds for gradient reduction and ZeRO gathers of a device holding `params`.

    Returns per-step (`step_reduce`, `step_gather`) and per-micro-batch (`mb_gather`,
    `mb_reduce`) times. ZeRO-0: all-reduce of the gradients once per step. ZeRO-1
    (Megatron distributed optimizer): reduce-scatter of gradients, all-gather of updated
    weights. ZeRO-2 (DeepSpeed) reduce-scatters at every micro-batch. ZeRO-3/FSDP
    gathers weights for the forward and again for the backward pass of each micro-batch.
    """
    g = groups(plan, cluster) if g is None else g
    grads = params * grad_bytes_per_param(plan)
    weights = params * weight_bytes_per_param(plan.precision)
    out = dict(step_reduce=0.0, step_gather=0.0, mb_gather=0.0, mb_reduce=0.0)
    # With one rank (dp*cp = 1) every collective below takes zero time (comm.collective_time).
    z = plan.zero_stage
    if z == 0:
        out["step_reduce"] = collective_time("all_reduce", grads, g.dp, cluster)
    elif z == 1:
        out["step_reduce"] = collective_time("reduce_scatter", grads, g.dp, cluster)
        out["step_gather"] = collective_time("all_gather", weights, g.dp, cluster)
    elif z == 2:
        out["mb_reduce"] = collective_time("reduce_scatter", grads, g.dp, cluster)
        out["step_gather"] = collective_time("all_gather", weights, g.dp, cluster)
    else:
        out["mb_gather"] = 2 * collective_time("all_gather", weights, g.dp, cluster)
        out["mb_reduce"] = collective_time("reduce_scatter", grads, g.dp, cluster)
    return out
