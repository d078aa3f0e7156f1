"""Pipeline stages that hold two kinds of layer: dense-MLP layers and MoE layers (moe.py),
with multi-head latent attention (mla.py) where the model has it.

The compile step (layout.py) calls this for a model with experts or MLA; a dense MHA/GQA
model keeps layout.py's own single-kind path. A device of a stage runs its dense-MLP and its
MoE layers one after the other (stagesplit.representatives gives how many of each), so its pass times,
saved activations and parameters are the sums of the two kinds'. The parameters split in
two groups with their own data-parallel collectives and ZeRO sharding: the routed experts
over the expert data-parallel group, the rest over dp x cp (dims.py). Broadcast-safe.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import partial

import numpy as np

from .dataparallel import DPCosts, buckets, dp_costs
from .dims import expert_grad_group_size, grad_group_size
from .memory import ActivationSizes, buffer_bytes, layer_activations, stage_activations
from .moe import (EXPERT_GEMMS, SHARED_EXPERTS, dispatch_comm_s, dispatch_host_calls, exposed_dispatch_s,
                  layer_params_split, moe_buffer_bytes, padding_share, plan_experts)
from . import cpattention, deepep, fp8, fsdp, mtp, projections
from .compute import LOW_PRECISION_GEMMS, op_times, with_attention_kernel
from .fp8 import compute_precision
from .fusion import eager_ops
from .hostbound import layer_floors
from .passes import OpsTime, ops_time, pass_times, tp_layer_comm_s
from .tpoverlap import overlapped_tp_s
from .recompute import chunk_checkpoint, plan_checkpoint, tp_rerun_fraction
from .states import ModelStates, model_states, stage_params
from .workload import ATTENTION_CORE, MATMUL, layer_ops


def needs_layer_mix(model) -> bool:
    return bool(model.experts) or model.attention == "mla" or bool(model.mtp_layers)


@dataclass(frozen=True)
class LayerMix:
    """A dense-MLP layer and an MoE layer of one device: operators, kernel times, exposed
    collectives per micro-batch and parameters (the MoE fields are None for a dense MLA model)."""

    dense_ops: list
    moe_ops: list | None
    dense_t: OpsTime
    moe_t: OpsTime | None
    dense_tp_s: tuple
    moe_tp_s: tuple
    dense_cp_s: tuple  # exposed CP exchange of each kind (cpattention.py)
    moe_cp_s: tuple
    ep_s: tuple  # exposed dispatch and combine of an MoE layer, forward and backward
    dense_params: object
    moe_rest_params: object  # an MoE layer's attention, norms, router and shared experts
    routed_params: object  # an MoE layer's local experts
    buffer_bytes: object
    buffer_layer_params: object  # the largest layer's parameters, what ZeRO-3's buffers hold (memory.buffer_bytes)
    dense_rerun: tuple  # (recompute.LayerCheckpoint, seconds its re-run takes, TP fraction re-run) of each kind
    moe_rerun: tuple | None
    dense_linear_params: object  # weights of a dense-MLP layer's linears (FP8 copies, fp8.py)
    moe_rest_linear_params: object  # an MoE layer's attention and shared-expert linears
    mtp_tp_s: tuple  # TP seconds of one multi-token-prediction depth's projection (mtp.py)


def _tp_comm_s(model, shard, groups, cluster, gather_factor, titan=False):
    """(dense-MLP layer, MoE layer) TP collectives, forward and backward, and the forward
    seconds of the blocks a selective recomputation may re-run (recompute.tp_rerun_fraction)
    of each. A layer's TP collectives are its attention block's and its MLP's, half of
    tp_layer_comm_s each (one gather and one reduce-scatter, or one all-reduce, per block and
    direction); MLA's attention gathers its latents instead (mla.py); an MoE layer's routed
    experts have none (their tokens move in the dispatch), its shared experts those of a
    dense MLP; torchtitan's MoE layer (`titan`) gathers its input and reduce-scatters its
    output as a dense MLP does, shared experts or not (titanmoe.py)."""
    f, b = tp_layer_comm_s(model, shard, groups, cluster, gather_factor)
    half = (f / 2, b / 2)
    up = 0.0
    if model.attention == "mla":
        from .mla import tp_attention_comm_s, tp_up_proj_gather_s
        attn = tp_attention_comm_s(model, shard, groups, cluster)
        up = tp_up_proj_gather_s(model, shard, groups, cluster)
    else:
        attn = half
    shared = half if model.shared_experts or titan else (0.0, 0.0)
    return ((attn[0] + half[0], attn[1] + half[1]), (attn[0] + shared[0], attn[1] + shared[1]),
            {"mlp": half[0], "mla_up": up}, {"shared": shared[0], "mla_up": up})


def _overlapped(model, shard, groups, cluster, plan, ops, t: OpsTime, tp_s: tuple, mlp, precision) -> tuple:
    """(exposed TP seconds, the layer's OpsTime) with plan.tp_comm_overlap, for the layer kinds
    of MoE and MLA models. Multi-head and grouped-query attention layers overlap collective by
    collective as a dense model's do (tpoverlap.overlapped_tp_s: each beside its own GEMM, the
    split GEMMs' start-ups and userbuffers' SMs charged), an MoE layer's attention and shared
    experts (`mlp`: the operators' prefix, None without shared experts); MLA's latent gathers
    hide behind the layer's GEMMs of the same direction."""
    if model.attention != "mla":
        return overlapped_tp_s(model, shard, groups, cluster, plan, ops, t, tp_s, mlp=mlp)
    gemm_fwd = sum(op_times(op, cluster.accelerator, precision).fwd_s for op in ops
                   if (op.kind == MATMUL or op.kind in LOW_PRECISION_GEMMS) and op.group != ATTENTION_CORE)
    return (np.maximum(0.0, tp_s[0] - gemm_fwd), np.maximum(0.0, tp_s[1] - t.bwd_input_s - t.bwd_weight_s)), t


def layer_operators(model, shard, plan, experts=None, acc=None) -> list:
    """The operators of one layer as the plan runs them: eager kernels where nothing is
    compiled (fusion.py), the attention kernel it names, its FP8 linears (fp8.py), its
    separate projections (projections.py) and the context-parallel ring's merges after the
    attention core (cpattention.py); `experts`: an MoE layer's."""
    ops = with_attention_kernel(eager_ops(layer_ops(model, shard, experts), model, plan), plan.attention_kernel)
    if model.attention == "mla" and not plan.compile:
        from .mla import qk_concat_op
        rope = [op.name for op in ops].index("rope")
        ops = ops[:rope + 1] + [qk_concat_op(model, shard)] + ops[rope + 1:]
    ops = projections.separate_ops(fp8.fp8_layer_ops(ops, shard, plan, model, acc), shard, plan)
    ops = cpattention.rank_calls(ops, model, shard, plan.cp_attention, plan.cp_ulysses)
    merges = cpattention.merge_ops(model, shard, plan.cp_attention, plan.compile)
    if not merges:
        return ops
    core = max(i for i, op in enumerate(ops) if op.group == ATTENTION_CORE)
    return ops[:core + 1] + merges + ops[core + 1:]


def padding_flops_per_micro_batch(mix: LayerMix, model, shard, plan):
    """FLOPs one device's MoE layer executes per micro-batch on the rows its quantized experts
    are padded with (moe.padding_share: quantization padding, router padding) in its expert
    GEMMs and their re-run under recomputation. Hardware FLOPs count them
    (workload.executed_flops_per_sequence counts the routed rows)."""
    experts = plan_experts(plan)
    if not (model.experts and experts.align):
        return 0.0
    gemms = sum(op.flops for op in mix.moe_ops if op.name in EXPERT_GEMMS)
    rerun = sum(op.fwd_flops for op in mix.moe_rerun[0].rerun if op.name in EXPERT_GEMMS)
    return padding_share(model, shard, experts) * (gemms + rerun)


def compile_mix(model, cluster, plan, shard, groups, per, precision, split=False) -> LayerMix:
    """Everything per layer kind, once per compile (`split`: the schedule runs the weight
    gradients as passes of their own, hostbound.py)."""
    acc = cluster.accelerator
    host_s = cluster.node.launch_overhead_s
    # every layer MoE: no dense layer
    dense_ops = layer_operators(model, shard, plan, acc=acc) if model.moe_layers < model.layers else []
    dense_t = ops_time(dense_ops, cluster, precision)
    dense_tp, moe_tp, dense_blocks, moe_blocks = _tp_comm_s(model, shard, groups, cluster,
                                                            fp8.tp_gather_bytes_factor(plan),
                                                            plan.moe.framework == "torchtitan")
    dense_rerun = _rerun(model, shard, plan, cluster, dense_ops, dense_blocks, dense_tp[0])
    if plan.tp_comm_overlap and dense_ops:
        dense_tp, dense_t = _overlapped(model, shard, groups, cluster, plan, dense_ops, dense_t, dense_tp, "mlp_",
                                        precision)
    cp = partial(cpattention.exposed_s, model, shard, groups, cluster, plan.cp_attention)
    dense_cp = cp(dense_t.attention_fwd_s, dense_t.attention_bwd_s)
    if dense_ops:
        dense_t, dense_rerun = _at_host_floor(dense_t, dense_ops, dense_rerun, dense_tp, dense_cp, (0.0, 0.0), host_s,
                                              plan, shard, split)
    moe_cp = dense_cp
    dense_p, rest_p, routed_p = layer_params_split(model, plan.tp, plan.ep, plan.etp)
    moe_ops = moe_t = moe_rerun = None
    ep = (0.0, 0.0)
    buffers_layer = dense_p
    extra = 0.0
    if model.experts:
        experts = plan_experts(plan)
        moe_ops = layer_operators(model, shard, plan, experts, acc)
        moe_t = ops_time(moe_ops, cluster, precision)
        moe_rerun = _rerun(model, shard, plan, cluster, moe_ops, moe_blocks, moe_tp[0], experts)
        if plan.tp_comm_overlap:
            moe_tp, moe_t = _overlapped(model, shard, groups, cluster, plan, moe_ops, moe_t, moe_tp,
                                        "shared_mlp_" if model.shared_experts else None, precision)
        shared_t = ops_time([op for op in moe_ops if op.group == SHARED_EXPERTS], cluster, precision) \
            if plan.moe.shared_expert_overlap else None
        moe_cp = cp(moe_t.attention_fwd_s, moe_t.attention_bwd_s)
        ep = exposed_dispatch_s(dispatch_comm_s(model, shard, experts, groups, cluster), moe_t, shared_t, plan.moe,
                                deepep.sm_share(experts, groups, acc))
        moe_t, moe_rerun = _at_host_floor(moe_t, moe_ops, moe_rerun, moe_tp, moe_cp, ep, host_s, plan, shard, split,
                                          dispatch_host_calls(experts))
        buffers_layer = np.maximum(dense_p, rest_p + routed_p)
        extra = moe_buffer_bytes(model, shard, experts, groups)
    buffers = buffer_bytes(cluster.accelerator.framework_overhead_bytes, buffers_layer, plan, per.weight,
                           per.grad) + extra
    shared_linears = model.shared_experts * fp8.mlp_linear_params(model, model.shared_expert_ffn_hidden, plan.tp)
    return LayerMix(dense_ops, moe_ops, dense_t, moe_t, dense_tp, moe_tp, dense_cp, moe_cp, ep, dense_p, rest_p,
                    routed_p, buffers, buffers_layer, dense_rerun, moe_rerun,
                    fp8.layer_linear_params(model, plan.tp), fp8.attention_linear_params(model, plan.tp) + shared_linears,
                    mtp.eh_proj_tp_comm_s(model, shard, groups, cluster) if model.mtp_layers else (0.0, 0.0))


def _sum_states(a: ModelStates, b: ModelStates) -> ModelStates:
    return ModelStates(a.weights_bytes + b.weights_bytes, a.gradients_bytes + b.gradients_bytes,
                       a.optimizer_bytes + b.optimizer_bytes, a.host_bytes + b.host_bytes,
                       a.local_params + b.local_params)


def _sum_dp(a: DPCosts, b: DPCosts) -> DPCosts:
    """The two parameter groups' collectives queue on one data-parallel stream."""
    return DPCosts(a.step_reduce_s + b.step_reduce_s, a.step_gather_s + b.step_gather_s,
                   a.mb_gather_s + b.mb_gather_s, a.mb_reduce_s + b.mb_reduce_s)


@dataclass(frozen=True)
class MixedStage:
    """What layout.StageLayout needs of a stage holding both layer kinds."""

    params: object  # before ZeRO sharding, both groups
    states: ModelStates
    activations: ActivationSizes
    passes: object
    dp: DPCosts
    buckets: object
    shard_group: object  # ZeRO sharding degree averaged over the stage's parameters (offload)
    linears: object  # linear weights of the stage's device (FP8 weight casts, fp8.py)
    gathered_bytes: object = 0.0  # unsharded weights and gradients beyond ZeRO-3's buffers (fsdp.py)


def _rerun(model, shard, plan, cluster, ops, tp_blocks: dict, tp_fwd_s, experts=None) -> tuple:
    """(checkpoint, forward seconds of what recomputation re-runs, fraction of the forward TP
    seconds `tp_fwd_s` it runs again) of one layer kind (recompute.py; `experts`: an MoE layer's)."""
    checkpoint = plan_checkpoint(model, shard, plan, ops, experts)
    return (checkpoint, ops_time(list(checkpoint.rerun), cluster, compute_precision(plan)).fwd_s,
            tp_rerun_fraction(checkpoint, tp_blocks, tp_fwd_s))


def _at_host_floor(t: OpsTime, ops, rerun: tuple, tp_s, cp_s, ep_s, host_s, plan, shard, split,
                   dispatch=(0, 0, 0)) -> tuple:
    """(pass times, _rerun's tuple) of one layer kind at their host floors (hostbound.layer_floors),
    its exposed TP, CP and dispatch seconds keeping the GPU busy; `dispatch`: an MoE layer's
    moe.dispatch_host_calls."""
    checkpoint, rerun_s, tp_rerun = rerun
    t, rerun_s = layer_floors(t, ops, rerun_s, checkpoint, host_s, tp_s, cp_s, ep_s, tp_rerun, plan, shard, split,
                              dispatch)
    return t, (checkpoint, rerun_s, tp_rerun)


def _kind_passes(t: OpsTime, rerun: tuple, n, emb_t, head_t, has_emb, has_head, tp_s, cp_s, ep_s, plan, v):
    """Pass times of the stage's `n` layers of one kind, with what recomputation re-runs of them."""
    checkpoint, rerun_s, tp_rerun = rerun
    rerun_layers = v * chunk_checkpoint(plan, checkpoint, 0.0, n / v).rerun_layers
    return pass_times(t, n, emb_t, head_t, has_emb, has_head, tp_s, cp_s, rerun_s, rerun_layers,
                      tp_rerun, checkpoint.cp_rerun, ep_s, checkpoint.ep_rerun)


def mix_activations(mix: LayerMix, model, shard, plan, head) -> tuple:
    """(dense layer's, MoE layer's or None) memory.LayerActivations, once per compile: what
    mixed_stage composes each stage's activation bytes from."""
    dense = layer_activations(model, shard, plan, mix.dense_ops, head)
    if mix.moe_ops is None:
        return dense, None
    return dense, layer_activations(model, shard, plan, mix.moe_ops, head, plan_experts(plan))


def mixed_stage(mix: LayerMix, model, cluster, plan, shard, groups, per, zero_group, expert_zero_group,
                layers, n_moe, v, has_emb, has_head, head_copy, emb_t, head_t, layer_acts) -> MixedStage:
    """A representative stage of a model with experts, MLA or multi-token prediction (whose
    depths run on the head stage, each a layer of the last layer's kind: mtp.py): `layers`
    decoder layers on a device, `n_moe` of them MoE (stagesplit.representatives);
    `layer_acts`: mix_activations."""
    depths = np.asarray(has_head) * model.mtp_layers
    n_dense, n_moe = mtp.with_depths(model, layers - n_moe, n_moe, depths)
    dense = stage_params(model, plan.tp, 0.0, has_emb, has_head, head_copy) + n_dense * mix.dense_params \
        + n_moe * mix.moe_rest_params
    if model.mtp_layers:
        dense = dense + depths * mtp.depth_params(model, plan.tp) + mtp.embedding_copy_params(model, plan.tp, has_emb,
                                                                                              has_head)
    routed = n_moe * mix.routed_params
    states = _sum_states(model_states(dense, plan, per, zero_group), model_states(routed, plan, per, expert_zero_group))
    # FP8 linears (fp8.py): the weight copies TransformerEngine keeps, and FP8 all-gathers of
    # FP8 primary weights; the routed experts are all linear weights
    dense_linears = n_dense * mix.dense_linear_params + n_moe * mix.moe_rest_linear_params
    states = fp8.with_weight_copies(states, dense_linears + routed, plan, per, cluster.accelerator)
    dense_gather = fp8.gather_bytes_per_param(per, dense_linears, dense, plan)
    routed_gather = fp8.weight_bytes_per_param(plan)[1]
    # FSDP's units (fsdp.units) over the stage's chunks: every layer, and the MoE layers' experts
    units, expert_units = fsdp.units(n_dense + n_moe, 1), fsdp.units(n_moe, 1)
    gathered = 0.0
    if fsdp.keeps_gathered(plan):  # FSDP2 without resharding: once a step, the stage held unsharded
        dp = _sum_dp(fsdp.step_costs(dense, dense_gather, per.grad, groups.grad, cluster, groups.replicate, units),
                     fsdp.step_costs(routed, routed_gather, per.grad, groups.expert_grad, cluster,
                                     groups.expert_replicate, expert_units))
        gathered = fsdp.gathered_extra_bytes(dense, mix.buffer_layer_params, dense_gather, per.weight, per.grad) \
            + fsdp.gathered_extra_bytes(routed, 0.0, routed_gather, 0.0, per.grad)
    else:
        dp = _sum_dp(dp_costs(plan.zero_stage, dense, dense_gather, per.grad, groups.grad, cluster, groups.replicate,
                              units),
                     dp_costs(plan.zero_stage, routed, routed_gather, per.grad, groups.expert_grad, cluster,
                              groups.expert_replicate, expert_units))
    count = buckets(dense / v, grad_group_size(plan)) + np.where(routed > 0, buckets(routed / v,
                                                                                      expert_grad_group_size(plan)), 0)
    shard_group = (dense + routed) / (dense / zero_group + routed / expert_zero_group)
    d_acts = stage_activations(layer_acts[0], plan, n_dense / v, has_emb, has_head)
    passes = _kind_passes(mix.dense_t, mix.dense_rerun, n_dense, emb_t, head_t, has_emb, has_head, mix.dense_tp_s,
                          mix.dense_cp_s, (0.0, 0.0), plan, v)
    acts = d_acts
    if mix.moe_ops is not None:
        m_acts = stage_activations(layer_acts[1], plan, n_moe / v, has_emb, has_head)
        # the layer rebuilt by full recomputation is one of the kinds the stage holds
        def either(d, m):
            return np.where(n_moe > 0, np.where(n_dense > 0, np.maximum(d, m), m), d)

        extra = either(d_acts.extra_bytes, m_acts.extra_bytes)
        reserved = either(d_acts.extra_bytes + d_acts.cached_free_bytes, m_acts.extra_bytes + m_acts.cached_free_bytes)
        acts = ActivationSizes(d_acts.chunk_bytes + m_acts.chunk_bytes, d_acts.embedding_bytes, extra,
                               reserved - extra)
        zero = np.asarray(0.0)
        passes = passes + _kind_passes(mix.moe_t, mix.moe_rerun, n_moe, emb_t, head_t, zero, zero, mix.moe_tp_s,
                                       mix.moe_cp_s, mix.ep_s, plan, v)
    if model.mtp_layers:
        passes = replace(passes, tp_fwd_s=passes.tp_fwd_s + depths * mix.mtp_tp_s[0],
                         tp_bwd_s=passes.tp_bwd_s + depths * mix.mtp_tp_s[1])
    return MixedStage(dense + routed, states, acts, passes, dp, count, shard_group, dense_linears + routed, gathered)

