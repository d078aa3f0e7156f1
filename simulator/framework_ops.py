"""Framework operators of a training step: the work around the layers' math.

workload.py lists what a layer computes; a training framework also runs these, on every
device, on GPUs as on CPUs. Each is an `Op` of the workload's kind (bytes moved by a
memory-bound kernel, booked to the backward pass), costed by the profile's curve of the same
kernel class (`efficiency.memory_kernels.<name>`, measured by `llmsim calibrate`; the plain
bandwidth curve where a profile has none). Pure functions; plan sizes and `stage` may be
numpy arrays.

Per micro-batch, with the weight gradients:
- bias_grad: a linear layer with a bias reduces its output gradient over the tokens
  (NVIDIA/Megatron-LM@000c4ac megatron/core/tensor_parallel/layers.py,
  LinearWithGradAccumulationAndAsyncCommunication.backward: grad_output.sum(dim=0); torch
  AddmmBackward0): reads a·T·d_out bytes.
- grad_accumulate: a parameter's new gradient is added into the gradient buffer (torch
  AccumulateGrad `grad += new`; Megatron-LM distributed/distributed_data_parallel.py's hook
  `param.main_grad.add_(param.grad)`): reads the new gradient (a_w bytes) and reads and
  writes the buffer (2·g bytes) per parameter. With `plan.grad_accumulation_fusion`
  (Megatron-LM's default --gradient-accumulation-fusion), each linear layer's weight-gradient
  GEMM accumulates into the fp32 main_grad itself (same file and function:
  fused_weight_gradient_mlp_cuda.wgrad_gemm_accum_fp32), so only biases, norms and
  embeddings pay the add.
- embedding_grad (first stage): a dense embedding backward allocates a zero-filled gradient
  of the whole table (V/t x h, and the learned position table) before adding the tokens'
  rows (torch embedding_dense_backward; the tokens' rows are workload.py's embedding op);
  with tied embeddings on one stage and no fusion, autograd adds the lm_head's gradient of
  the same table to it (3·a_w bytes per element).
Per step:
- zero_grad: the gradient buffer is zero-filled (Megatron-LM zero_grad_buffer; `flat.zero_()`).
- grad_average (data parallelism over more than one rank, `plan.dp_average_in_collective`
  false): each bucket is divided by the DP x CP size before a summing reduction, a read and a
  write of the device's whole gradient buffer (Megatron-Core param_and_grad_buffer.py
  start_grad_sync `grad_data *= gradient_scaling_factor`, @d98e8a64dd and core_v0.9.0;
  Megatron-LM's 2021 DDP `buffer_.data /= world_size`, @de7dc40f88 megatron/model/
  distributed.py; DeepSpeed's engine divides after its all-reduce). FSDP2 reduces fp32 and bf16
  gradients with NCCL's AVG (pytorch/pytorch#120919, #123362, 2024): no pass; fp16 ones it
  divides before the reduce-scatter and after (_fsdp_collectives.py _get_gradient_divide_factors),
  the unsharded gradients and their shard.
- grad_nan_check (`plan.grad_nan_check`): Megatron-Core's norm of each bucket before its
  reduction (param_and_grad_buffer.py check_grads), a read of the gradient buffer; the host's
  wait for each bucket's result (rerun_state_machine.validate_result) is not timed.
- param_cast (mixed precision): the optimizer's fp32 master weights are copied into the
  16-bit model weights (Megatron-LM optimizer.py Float16OptimizerWithFloat16Params
  ._copy_main_params_to_model_params): 4 + a_w bytes per parameter of the local shard.
- grad_unscale (fp16, loss scaling): the optimizer's gradients are divided by the loss scale
  and checked for inf and NaN before the step, one read and one write of each
  (torch._amp_foreach_non_finite_check_and_unscale_: Megatron-LM optimizer.py
  MixedPrecisionOptimizer._unscale_main_grads_and_check_for_nan, torch.amp.GradScaler.unscale_).
- grad_norm and grad_scale (`plan.grad_clip`): clipping by the global norm reads every gradient
  the optimizer updates for the norm (Megatron-Core optimizer/clip_grads.py get_grad_norm_fp32,
  multi_tensor_l2norm; torch.nn.utils.get_total_norm, _foreach_norm) and, under norm-scale,
  reads and writes each to scale it (clip_grad_by_total_norm_fp32's multi_tensor_scale_tensor,
  unconditional since NVIDIA/Megatron-LM@3d87bfc1b7, core_v0.18.0; torch's
  _clip_grads_with_norm_ _foreach_mul_ by the clamped coefficient). Under `norm` the scale runs
  only on the steps whose norm exceeds the limit (clip_coeff < 1.0 before that commit), which
  llmsim cannot know and does not count. The norm's all-reduce (one number) and Megatron's
  `.item()` of it are not timed.
- grad_upcast (16-bit gradients, an fp32 optimizer): the optimizer's fp32 copies of the reduced
  gradients, read in 16 bits and written in 32 (states.upcasts_gradients).
The optimizer's gradients are those of its local shard (ZeRO-1 and up), in the bytes the
optimizer step reads (states.optimizer_grad_bytes). With the optimizer on the
host (ZeRO-Offload) the device computes the norm of the gradients it holds (DeepSpeed
runtime/zero/stage_1_and_2.py, complete_grad_norm_calculation_for_cpu_offload) and the host
unscales and clips its copy with the step (unscale_and_clip_grads), which offload.py's host
Adam rate does not count.
Host overhead (profile `host_overhead_us`; 0 where the host runs ahead of asynchronous
kernels, as on GPUs): a fixed cost per micro-batch (loss, backward engine start) and per step
(optimizer call, gradient zeroing), and a cost per parameter tensor per step (the optimizer's
loop over tensors). The per-operator part is compute.py's `op_overhead_s`.

An MoE layer (moe_layer_framework_ops) adds the gradients of its router's, its local
experts' and its shared experts' parameters, and sums each bias gradient over the rows its
linear computed (an expert's: the tokens routed to it); the host's per-tensor cost counts each
local expert's two linears. An MLA layer's fused weights are its own projections (mla.py),
its latent norms added apart; moe.py refuses MLA and multi-token-prediction models without
gradient-accumulation fusion.

Layout copies (a layer's transposes, splits and concatenations around attention) are not
listed here: `llmsim calibrate` measures the attention kernel in the layout a layer hands
it, its backward concatenation included, and the GEMMs with their bias broadcast.
"""

from __future__ import annotations

import numpy as np

from .compute import memory_bound_time
from .hardware import Cluster
from .model import ModelSpec
from .moe import dispatched_rows, layer_params_split, local_experts, plan_experts
from .mtp import layer_is_moe
from .states import BytesPerParam, layer_params_local, optimizer_grad_bytes, upcasts_gradients
from .workload import MEMORY, Op, Shard, local_heads

# The kernel classes of this module (keys of a profile's efficiency.memory_kernels).
KERNELS = ("bias_grad", "grad_accumulate", "zero_fill", "param_cast")


def _op(name: str, nbytes) -> Op:
    return Op(name, MEMORY, bwd_input_bytes=nbytes)


def _attention_matrix_params(model: ModelSpec, tp) -> object:
    """The attention's projection weights on a TP rank (MLA's: mla.py, its latent norms apart)."""
    if model.attention == "mla":
        from .mla import linear_params_local
        return linear_params_local(model, tp)
    q_heads, kv_heads = local_heads(model, tp)
    return model.hidden * (2 * q_heads + 2 * kv_heads) * model.head_dim


def _layer_ops(model: ModelSpec, plan, shard: Shard, per: BytesPerParam, mlp_bias_elements, params,
               mlp_matrix_params) -> list[Op]:
    """A layer's bias gradients and gradient addition for one micro-batch on one device: the
    attention's biases (Q, K and V summed over the tokens, the output's over the sequence
    shard: row-parallel outputs are reduce-scattered with SP) beside the MLP part's
    `mlp_bias_elements`; every one of the layer's `params` added into the gradient buffer,
    less, with fusion, the weight matrices a fused weight-gradient GEMM accumulates (the
    attention's and `mlp_matrix_params`)."""
    a, tokens = shard.act_bytes, shard.tokens
    q_heads, kv_heads = local_heads(model, shard.tp)
    qkv_out = (q_heads + 2 * kv_heads) * model.head_dim
    ops = []
    if model.bias:
        ops.append(_op("bias_grad", a * (tokens * qkv_out + shard.replicated_tokens * model.hidden
                                         + mlp_bias_elements)))
    elif model.qkv_bias:
        ops.append(_op("bias_grad", a * tokens * qkv_out))
    if plan.grad_accumulation_fusion:
        params = params - (_attention_matrix_params(model, shard.tp) + mlp_matrix_params)
    ops.append(_op("grad_accumulate", (per.weight + 2 * per.grad) * params))
    return ops


def layer_framework_ops(model: ModelSpec, plan, shard: Shard, per: BytesPerParam) -> list[Op]:
    """Framework operators of one layer for one micro-batch on one device."""
    f = model.ffn_hidden / shard.tp
    mlp_bias = shard.tokens * (model.mlp_matrices - 1) * f + shard.replicated_tokens * model.hidden
    return _layer_ops(model, plan, shard, per, mlp_bias, layer_params_local(model, shard.tp),
                      model.mlp_matrices * model.hidden * f)


def moe_layer_framework_ops(model: ModelSpec, plan, shard: Shard, per: BytesPerParam, experts) -> list[Op]:
    """Framework operators of one MoE layer for one micro-batch on one device (`experts`: its
    moe.ExpertShard): the attention's as a dense layer's; the bias gradients of the router and
    the shared experts over the tokens and of each local expert's fc1 and fc2 over the rows it
    computed; the gradient addition over the layer's parameters on this device
    (moe.layer_params_split), less, with fusion, the experts' weight matrices too
    (Megatron-Core's expert linears accumulate into main_grad as the dense ones do; the
    router's F.linear does not)."""
    tokens, rep, h = shard.tokens, shard.replicated_tokens, model.hidden
    up = model.mlp_matrices - 1
    rows = experts.etp * dispatched_rows(model, rep, experts)
    f = model.expert_ffn_hidden / experts.etp
    shared = model.shared_experts * (model.shared_expert_ffn_hidden or 0) / shard.tp
    mlp_bias = rep * model.experts + rows * (up * f + h) + (tokens * up * shared + rep * h if model.shared_experts
                                                            else 0.0)
    _, rest, routed = layer_params_split(model, shard.tp, experts.ep, experts.etp)
    return _layer_ops(model, plan, shard, per, mlp_bias, rest + routed,
                      model.mlp_matrices * h * (local_experts(model, experts.ep) * f + shared))


def embedding_framework_ops(model: ModelSpec, plan, tp, per: BytesPerParam, tied_head_here) -> list[Op]:
    """The embedding tables' gradients where the first virtual stage sits, per micro-batch;
    `tied_head_here`: the tied lm_head sits on the same device (its gradient of the same table
    is added by autograd unless fused)."""
    a_w, g = per.weight, per.grad
    table = model.vocab * model.hidden / tp
    pos = model.seq_len * model.hidden if model.position_embedding == "learned" else 0.0
    ops = [_op("zero_fill", a_w * (table + pos)), _op("grad_accumulate", (a_w + 2 * g) * (table + pos))]
    if model.tied_embeddings and not plan.grad_accumulation_fusion:
        ops.append(_op("grad_accumulate", np.where(np.asarray(tied_head_here), 3 * a_w * table, 0.0)))
    return ops


def head_framework_ops(model: ModelSpec, plan, tp, per: BytesPerParam, head_copy) -> list[Op]:
    """The final norm's and an untied (or pipeline-copied) lm_head's gradient accumulation."""
    head = np.where(np.asarray(head_copy), model.vocab * model.hidden / tp, 0.0)
    unfused = model.final_norm_params() + (0.0 if plan.grad_accumulation_fusion else head)
    return [_op("grad_accumulate", (per.weight + 2 * per.grad) * unfused)]


def mtp_depth_framework_ops(model: ModelSpec, plan, tp, per: BytesPerParam) -> list[Op]:
    """One multi-token-prediction depth's operators outside its transformer layer, per
    micro-batch on the head stage (mtp.py): the depth's embedding lookup backward zero-fills a
    gradient of the table and adds it, as the first stage's does; its three norms (enorm, hnorm,
    the final norm) are added; without fusion so are eh_proj's weight and the shared output
    layer's gradient of this depth's logits (Megatron-Core's eh_proj and output_layer are
    column-parallel linears: megatron/core/transformer/multi_token_prediction.py, @d98e8a6)."""
    table = model.vocab * model.hidden / tp
    added = 3 * model.final_norm_params()
    if not plan.grad_accumulation_fusion:
        added = added + 2 * model.hidden * model.hidden / tp + table
    return [_op("zero_fill", per.weight * table), _op("grad_accumulate", (per.weight + 2 * per.grad) * (table + added))]


def step_framework_ops(plan, per: BytesPerParam, params, grad_group) -> list[Op]:
    """Per-step operators of a device holding `params` (before ZeRO sharding)."""
    zero = np.asarray(plan.zero_stage)
    local = params / np.where(zero >= 1, grad_group, 1)  # whose states the optimizer updates here
    on_device = plan.offload.optimizer == "none"
    g = optimizer_grad_bytes(per, plan)
    buffer = params * per.grad / np.where(zero >= 2, grad_group, 1)  # the gradients kept between micro-batches
    ops = [_op("zero_grad", buffer)]
    ops += _averaging_ops(plan, per, params, grad_group)
    if plan.grad_nan_check:
        ops.append(_op("grad_nan_check", buffer))
    if upcasts_gradients(per, plan):
        ops.append(_op("grad_upcast", (per.grad + g) * local))
    if plan.grad_clip != "none":
        ops.append(_op("grad_norm", g * local))
    if on_device:
        if plan.precision == "fp16":
            ops.append(_op("grad_unscale", 2 * g * local))
        if plan.grad_clip == "norm-scale":
            ops.append(_op("grad_scale", 2 * g * local))
        if plan.precision not in ("fp32", "tf32"):
            ops.append(_op("param_cast", (4.0 + per.weight) * local))
    return ops


def _averaging_ops(plan, per: BytesPerParam, params, grad_group) -> list[Op]:
    """The data-parallel reduction's division by the DP x CP size where it is a pass of its own
    (module docstring: grad_average)."""
    ranks = np.asarray(plan.dp) * plan.cp
    if plan.zero_stage == 3 and plan.zero3_impl == "fsdp2":
        if plan.grad_precision != "fp16":
            return []
        return [_op("grad_average", np.where(ranks > 1, 2 * per.grad * params * (1 + 1 / grad_group), 0.0))]
    if plan.dp_average_in_collective:
        return []
    return [_op("grad_average", np.where(ranks > 1, 2 * per.grad * params, 0.0))]


_KERNEL_OF = {"zero_grad": "zero_fill"}
# Kernels that move the same bytes whatever the training precision (fp32 gradient buffers,
# zero-filling): they use the profile's reference curves, not the precision's.
_PRECISION_FREE = ("zero_fill", "grad_average", "grad_nan_check", "grad_upcast", "grad_unscale", "grad_norm",
                   "grad_scale")


def ops_seconds(ops: list[Op], cluster: Cluster, precision: str):
    acc = cluster.accelerator
    total = 0.0
    for op in ops:
        kernel = _KERNEL_OF.get(op.name, op.name)
        total = total + memory_bound_time(op.bwd_input_bytes, acc, kernel,
                                          None if kernel in _PRECISION_FREE else precision)
    return total


def param_tensors(model: ModelSpec, layers, has_embedding, has_head, head_copy, moe_layers=0.0, ep=1) -> object:
    """Parameter tensors on a device holding `layers` layers, `moe_layers` of them MoE over
    `ep` (weights, biases, norm scales and shifts), the embedding tables and the head where
    flagged."""
    per_linear = 2 if model.bias else 1
    per_norm = 2 if model.norm == "layernorm" and model.bias else 1
    # fused QKV, output, MLP in (fused gate+up), MLP out, and a QKV bias of its own
    layer = 4 * per_linear + model.layer_norms * per_norm + int(model.qkv_bias)
    # an MoE layer: the router and each local (and shared) expert's two linears in place of the MLP's
    moe = per_linear * (2 * (model.experts / np.asarray(ep) + bool(model.shared_experts)) - 1) if model.experts else 0.0
    pos = 1 if model.position_embedding == "learned" else 0
    return (layers * layer + np.asarray(moe_layers) * moe + np.asarray(has_embedding) * (1 + pos)
            + np.asarray(has_head) * per_norm + np.asarray(head_copy) * 1)


def microbatch_seconds(model: ModelSpec, plan, cluster: Cluster, shard: Shard, per: BytesPerParam, layers,
                       has_embedding, has_head, head_copy, moe_layers=0.0) -> object:
    """Seconds per micro-batch of the framework operators of a stage's device holding `layers`
    layers, `moe_layers` of them MoE (booked with the weight gradients), plus the host's fixed
    cost per micro-batch."""
    precision = plan.precision
    dense_s = ops_seconds(layer_framework_ops(model, plan, shard, per), cluster, precision)
    moe_s = ops_seconds(moe_layer_framework_ops(model, plan, shard, per, plan_experts(plan)), cluster,
                        precision) if model.experts else 0.0
    t = (layers - moe_layers) * dense_s + moe_layers * moe_s
    if model.mtp_layers:  # each depth, a layer of the decoder's last layer's kind, runs on the head stage
        depth_s = (moe_s if layer_is_moe(model) else dense_s) + ops_seconds(
            mtp_depth_framework_ops(model, plan, shard.tp, per), cluster, precision)
        t = t + np.asarray(has_head) * model.mtp_layers * depth_s
    tied_here = np.asarray(has_embedding) & np.asarray(has_head)
    t = t + np.asarray(has_embedding) * ops_seconds(embedding_framework_ops(model, plan, shard.tp, per, tied_here),
                                                    cluster, precision)
    t = t + np.asarray(has_head) * ops_seconds(head_framework_ops(model, plan, shard.tp, per, head_copy), cluster,
                                               precision)
    return t + cluster.accelerator.host_overhead_s.get("microbatch", 0.0)


def step_seconds(model: ModelSpec, plan, cluster: Cluster, per: BytesPerParam, params, grad_group, layers,
                 has_embedding, has_head, head_copy, moe_layers=0.0) -> object:
    """Seconds per step of the per-step framework operators of a stage's device, plus the
    host's fixed cost per step and per parameter tensor."""
    host = cluster.accelerator.host_overhead_s
    t = ops_seconds(step_framework_ops(plan, per, params, grad_group), cluster, plan.precision)
    return t + host.get("step", 0.0) + host.get("param_tensor", 0.0) * param_tensors(
        model, layers, has_embedding, has_head, head_copy, moe_layers, plan.ep)


def co_run_factor(cluster: Cluster) -> float:
    """How much longer a device's kernels take because the node's other devices run at the same
    time (profile efficiency.co_run_slowdown: CPU cores sharing caches and memory bandwidth, as
    data-parallel processes on one machine do); 1 on a one-device node and on GPUs."""
    return 1.0 + cluster.accelerator.co_run_slowdown if cluster.devices_per_node > 1 else 1.0
