"""Analytic step time: closed-form composition of the per-stage costs (the fast engine).

Pipeline (Narayanan et al. 2021): with per-micro-batch stage times tau_i, a 1F1B or
GPipe step takes m·max(tau) plus a fill-and-drain bubble of sum(tau) - max(tau), which is
(p-1)·tau for equal stages, i.e. a bubble fraction (p-1)/m. Interleaving v model chunks
divides the bubble by v. ZB-H1 (Qi et al. 2024, zero bubble) moves weight-gradient work
W into the bubble: per stage it shrinks from F+B+W to F+B-W.

Data parallelism: gradients of the last micro-batch are reduced while its backward pass
runs when `plan.dp_overlap` (exposed: what the backward pass cannot hide), otherwise after
it. Stage i finishes its last backward i micro-batch-backwards before stage 0, which is
the slack its reduction has.
"""

from __future__ import annotations

import numpy as np

from .compute import memory_bound_time
from .hardware import Cluster
from .memory import grad_bytes_per_param, microbatch_activation_bytes, weight_bytes_per_param
from .model import ModelSpec
from .plan import Plan
from .step import StageCost, dp_costs, groups, representative_stage_costs


def _select(index, values: list):
    """values[index] elementwise (index and values broadcast)."""
    out = values[-1]
    for i in range(len(values) - 2, -1, -1):
        out = np.where(index == i, values[i], out)
    return out


def critical_stage(costs: list[StageCost]) -> StageCost:
    """The slowest stage per micro-batch (the first one on ties), elementwise over plans."""
    totals = np.stack(np.broadcast_arrays(*[np.asarray(c.total, dtype=float) for c in costs]))
    index = np.argmax(totals, axis=0)
    names = ("stage", "fwd", "bwd_input", "bwd_weight", "recompute", "tp_comm", "cp_comm", "pp_comm", "params")
    return StageCost(**{n: _select(index, [getattr(c, n) for c in costs]) for n in names})


def _pipeline(plan: Plan, costs: list[StageCost], mult: list):
    """(critical stage, bubble seconds) for the schedule; `costs` are the representative
    stages and `mult` how many stages each stands for (step.representative_stage_costs)."""
    crit = critical_stage(costs)
    if plan.schedule == "zb-h1":
        fill = sum(k * np.maximum(0.0, c.total - 2 * c.bwd_weight) for k, c in zip(mult, costs))
        bubble = np.maximum(0.0, fill - np.maximum(0.0, crit.total - 2 * crit.bwd_weight))
    else:
        fill = sum(k * c.total for k, c in zip(mult, costs)) - crit.total
        bubble = fill / plan.virtual_stages
    return crit, np.where(np.asarray(plan.pp) == 1, 0.0, bubble)


def optimizer_step_time(plan: Plan, cluster: Cluster, params) -> object:
    """Adam update of the local shard: memory-bound, it reads the gradient and the fp32
    master weight, momentum and variance, writes the three states and the 16-bit weight."""
    shard = plan.dp * plan.cp if plan.zero_stage >= 1 else 1
    local = params / shard
    if plan.offload.optimizer != "none":
        return 0.0
    state = 8.0 if plan.precision in ("fp32", "tf32") else 12.0
    nbytes = local * (grad_bytes_per_param(plan) + 2 * state + weight_bytes_per_param(plan.precision))
    return memory_bound_time(nbytes, cluster.accelerator, "optimizer", plan.precision)  # [issue 10] precision


def offload_parts(plan: Plan, cluster: Cluster, params, act_bytes_mb) -> dict:
    """Seconds of the offload transfers and host work of a device holding `params`
    (ZeRO-Offload, ZeRO-Infinity): per step `optimizer_copy` (gradients to the host,
    weights back, over the host link), `host_adam` (the host CPU's Adam, whose throughput
    is a node-profile parameter shared by the node's devices), `nvme` (reading and writing
    the optimizer states); per micro-batch `params_mb` (weights streamed in for the forward
    and the backward pass) and `activations_mb` (saved activations out and back)."""
    off = plan.offload
    node, acc = cluster.node, cluster.accelerator
    host = acc.host_link_bandwidth
    per_dev_nvme_r = node.nvme_read_bandwidth / cluster.devices_per_node
    per_dev_nvme_w = node.nvme_write_bandwidth / cluster.devices_per_node
    shard = plan.dp * plan.cp if plan.zero_stage >= 1 else 1
    local = params / shard
    out = dict(optimizer_copy=0.0, host_adam=0.0, nvme=0.0, params_mb=0.0, activations_mb=0.0)
    if off.optimizer != "none":
        out["optimizer_copy"] = local * (grad_bytes_per_param(plan) + weight_bytes_per_param(plan.precision)) / host
        out["host_adam"] = local * cluster.devices_per_node / node.host_adam_params_per_s
        if off.optimizer == "nvme":
            state = local * 12.0
            out["nvme"] = state / per_dev_nvme_r + state / per_dev_nvme_w
    if off.params != "none":
        w = params / shard * weight_bytes_per_param(plan.precision)
        rate = host if off.params == "cpu" else np.minimum(host, per_dev_nvme_r)
        out["params_mb"] = 2 * w / rate
    if off.activations != "none":
        rate = host if off.activations == "cpu" else np.minimum(host, np.minimum(per_dev_nvme_r, per_dev_nvme_w))
        out["activations_mb"] = 2 * act_bytes_mb / rate
    return out


def offload_time(model: ModelSpec, plan: Plan, cluster: Cluster, crit: StageCost, params, act_bytes_mb) -> object:
    """Exposed seconds per step of CPU/NVMe offload (ZeRO-Offload, ZeRO-Infinity): the
    per-step parts in full; parameter and activation streams only in their excess over
    the micro-batch's compute, which they overlap."""
    d = offload_parts(plan, cluster, params, act_bytes_mb)
    m = plan.microbatches
    return (d["optimizer_copy"] + d["host_adam"] + d["nvme"]
            + m * np.maximum(0.0, d["params_mb"] - crit.compute)
            + m * np.maximum(0.0, d["activations_mb"] - crit.compute))


def step_breakdown_arrays(model: ModelSpec, plan: Plan, cluster: Cluster) -> dict:
    """Exposed seconds per step by cause (they add up to the step time), elementwise over
    plans whose sizes are numpy arrays (simulator.vector) or plain numbers."""
    g = groups(plan, cluster)
    costs, mult = representative_stage_costs(model, plan, cluster, g)
    crit, bubble = _pipeline(plan, costs, mult)
    m = plan.microbatches

    # Data-parallel traffic: per micro-batch collectives hide behind that micro-batch's
    # compute when overlapped; the per-step reduction behind the last backward pass.
    dp_exposed = 0.0
    for c in costs:
        d = dp_costs(plan, cluster, c.params, g)
        if plan.dp_overlap:
            per_mb = np.maximum(0.0, d["mb_gather"] - c.fwd) + np.maximum(0.0, d["mb_reduce"] - c.bwd)
            tail = np.maximum(0.0, d["step_reduce"] - c.bwd) + np.maximum(0.0, d["step_gather"] - c.fwd)
        else:
            per_mb = d["mb_gather"] + d["mb_reduce"]
            tail = d["step_reduce"] + d["step_gather"]
        dp_exposed = np.maximum(dp_exposed, m * per_mb + np.maximum(0.0, tail - c.stage * c.bwd))

    params_crit = np.maximum.reduce(np.broadcast_arrays(*[np.asarray(c.params, dtype=float) for c in costs]))
    return {
        "compute": m * crit.compute,
        "recompute": m * crit.recompute,
        "tp_comm": m * crit.tp_comm,
        "cp_comm": m * crit.cp_comm,
        "pp_comm": m * crit.pp_comm,
        "dp_comm": dp_exposed,
        "pipeline_bubble": bubble,
        "optimizer": optimizer_step_time(plan, cluster, params_crit),
        "offload": offload_time(model, plan, cluster, crit, params_crit, microbatch_activation_bytes(model, plan)),
        # [issue 10] per-step framework operators (gradient zeroing, master-weight copy, host)
        "other": np.maximum.reduce(np.broadcast_arrays(*[np.asarray(c.framework_step, dtype=float) for c in costs])),
    }


def step_breakdown(model: ModelSpec, plan: Plan, cluster: Cluster) -> dict:
    """Exposed seconds per step by cause; they add up to the step time."""
    return {k: float(v) for k, v in step_breakdown_arrays(model, plan, cluster).items()}
