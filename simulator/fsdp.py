"""FSDP2: the root's parameters, and the stages that keep their weights gathered.

llmsim's ZeRO-3 moves weights and gradients per transformer block (`units`), as FSDP2 does
where torchtitan wraps every block and then the root module, which holds the embedding, the
final norm and the lm_head (torchtitan@9dec370 torchtitan/parallelisms/parallelize_llama.py
apply_fsdp). FSDP2 never reshards the root after its forward ("the parameters would be freed
and all-gathered immediately": pytorch/pytorch torch/distributed/_composable/fsdp/
_fsdp_state.py FSDPState._lazy_init sets the root group's post_forward_mesh_info to None), so
those weights stay gathered from the forward to the end of the backward, and the lm_head's
gradient, computed first in the backward, waits unsharded for the root's reduce-scatter
after the last block's backward (`root_held_bytes`; not with `plan.zero3_impl: deepspeed`,
whose stage 3 releases every gathered parameter after use).

Without resharding after forward (`plan.fsdp_reshard_after_forward: false`):

torchtitan shards each transformer block and the root with FSDP2 (fully_shard) and, when
pipeline parallelism is on, sets reshard_after_forward=False for every block
(torchtitan@9dec370 torchtitan/parallelisms/parallelize_llama.py apply_fsdp). Its pipeline
schedule then runs every micro-batch but the last without gradient sync and without
resharding after backward (set_requires_gradient_sync(False), set_reshard_after_backward(False)
in torch.distributed.pipelining's stage backward_maybe_with_nosync): the stage's weights are
all-gathered once, before the first forward, stay unsharded for the step, and the gradients
accumulate unsharded, in the reduce dtype (FSDPParam.unsharded_accumulated_grad, fp32 with
torchtitan's mixed_precision_reduce = float32), until one reduce-scatter after the last
backward (pytorch/pytorch torch/distributed/fsdp/_fully_shard/_fsdp_param.py
to_accumulated_grad_if_needed).

So per step one all-gather of the stage's weights and one reduce-scatter of its gradients
(the ZeRO-1/2 collectives of dataparallel.py, overlapped the same way), and on the device
the unsharded weights and gradients of the whole stage instead of ZeRO-3's per-layer gather
buffers (memory.buffer_bytes). With reshard_after_forward (FSDP2's default, torchtitan
without PP) FSDP2 is llmsim's ZeRO-3.
"""

from __future__ import annotations

import numpy as np

from .comm import collective_time
from .dataparallel import DPCosts, gradient_reduction_s
from .states import stage_params


def units(layers, v) -> object:
    """FSDP units of a model chunk, the pieces ZeRO-3's weights are gathered and its gradients
    reduce-scattered in: one per transformer layer, as torchtitan wraps every TransformerBlock
    with fully_shard (torchtitan@9dec370 torchtitan/parallelisms/parallelize_llama.py
    apply_fsdp). A unit's all-gather runs while the unit before it computes and its
    reduce-scatter while the unit after it runs its backward (FSDP2 issues them on their own
    streams ahead of the compute), so a step exposes the first unit's gather and the last
    unit's reduce-scatter, not the chunk's (dataparallel.bucketed_overlap_s with k units)."""
    return np.maximum(1, np.floor(np.asarray(layers) / v))


def keeps_gathered(plan) -> bool:
    return plan.zero_stage >= 3 and not plan.fsdp_reshard_after_forward


def step_costs(params, weight_bytes_per_param, grad_bytes_per_param, group, cluster, replicate=None,
               units=1) -> DPCosts:
    """One all-gather of the weights and one reduce-scatter of the gradients per step, unit by
    unit (under hybrid sharding with the replicas' all-reduces beside them)."""
    zero = 0.0 * params
    return DPCosts(gradient_reduction_s(params * grad_bytes_per_param, group, replicate, cluster, units),
                   collective_time("all_gather", params * weight_bytes_per_param, group, cluster), zero, zero)


def root_held_bytes(model, tp, has_embedding, has_head, head_copy, weight_bytes_per_param):
    """Bytes the FSDP2 root holds unsharded on a stage through its backward: the gathered
    embedding, final norm and lm_head, and the lm_head's gradient (in the weights' precision,
    as autograd produces it). Where the weights stay gathered anyway (`keeps_gathered`) they
    are in `gathered_extra_bytes`."""
    root = stage_params(model, tp, 0.0, has_embedding, has_head, head_copy)
    head_grad = np.asarray(has_head) * model.vocab * model.hidden / tp
    return (root + head_grad) * weight_bytes_per_param


def gathered_extra_bytes(params, layer_params, weight_bytes_per_param, layer_weight_bytes_per_param,
                         grad_bytes_per_param):
    """Bytes the stage's unsharded weights and gradients take beyond ZeRO-3's buffers of two
    gathered layers and one layer's unsharded gradients (memory.buffer_bytes); the weights in
    the bytes they are gathered in (the stage's and one layer's: FP8 linears, fp8.py)."""
    whole = params * (weight_bytes_per_param + grad_bytes_per_param)
    return whole - layer_params * (2 * layer_weight_bytes_per_param + grad_bytes_per_param)
