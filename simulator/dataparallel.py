"""Data-parallel and ZeRO collectives of one device: volumes, times and buckets.

ZeRO-0 all-reduces the gradients once per step. ZeRO-1 (Megatron-LM's distributed
optimizer) reduce-scatters the gradients and all-gathers the updated weights. ZeRO-2
(DeepSpeed) reduce-scatters at every micro-batch. ZeRO-3/FSDP gathers the weights for the
forward and again for the backward pass of each micro-batch and reduce-scatters the
gradients after each backward pass (Rajbhandari et al. 2020). The group is every rank
holding the same weights (dp x cp: dims.Groups.grad).

Hybrid sharding (HSDP, plan.dp_replicate): ZeRO's group is one replica's ranks; the weights
are gathered inside the replica only, and each gradient reduce-scatter inside it is followed
by an all-reduce of the reduced shard over the replicas (dims.Groups.replicate; MoE layers'
expert-DP group splits into the same number of replicas, dims.Groups.expert_replicate):
- Megatron-LM (ZeRO-1, --num-distributed-optimizer-instances) runs the two one after the
  other on one communication stream (NVIDIA/Megatron-LM@d98e8a64dd megatron/core/distributed/
  param_and_grad_buffer.py start_grad_sync, "NCCL Stream: RS ... AR").
- PyTorch's FSDP (ZeRO-2/3) reduces unit by unit after every backward and runs the all-reduces
  on their own stream, "concurrently with all-gather/reduce-scatter since collectives use
  different network resources ... in the typical intra-node sharding / inter-node replication
  case" (torch 2.13.0 torch/distributed/fsdp/_fully_shard/_fsdp_param_group.py
  FSDPCommContext.lazy_init; _fsdp_collectives.py foreach_reduce): one unit's all-reduce runs
  beside the next unit's reduce-scatter where the replica sits inside a scale-up domain and
  the replicas across them; where both cross the NICs they share them, one after the other.

Buckets (Megatron-LM, megatron/core/distributed/distributed_data_parallel.py@d98e8a6,
DistributedDataParallel.__init__): gradients are grouped into buckets of
max(40M, 1M x group size) parameters; with --overlap-grad-reduce a bucket's reduction is
issued as soon as the last micro-batch's backward pass has produced all of its gradients
(param_and_grad_buffer.py, register_grad_ready: only when is_last_microbatch), and with
--overlap-param-gather a bucket's weight all-gather is dispatched ahead of the forward
pass that needs it (start_param_sync / finish_param_sync).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .comm import Placement, collective_time
from .hardware import Cluster

MIN_BUCKET_PARAMS = 40_000_000  # Megatron-LM DistributedDataParallel default
BUCKET_PARAMS_PER_RANK = 1_000_000


@dataclass(frozen=True)
class DPCosts:
    """Seconds of one device's data-parallel collectives."""

    step_reduce_s: object  # gradient reduction once per step (ZeRO-0/1)
    step_gather_s: object  # weight all-gather once per step (ZeRO-1/2)
    mb_gather_s: object  # weight all-gathers per micro-batch, forward and backward (ZeRO-3)
    mb_reduce_s: object  # gradient reduce-scatter per micro-batch (ZeRO-2/3)


def bucket_params(group_size) -> object:
    """Parameters per gradient bucket (Megatron-LM's default rule)."""
    return np.maximum(MIN_BUCKET_PARAMS, BUCKET_PARAMS_PER_RANK * np.asarray(group_size))


def buckets(params, group_size) -> object:
    """Buckets that hold `params` (at least one)."""
    return np.maximum(1, np.ceil(np.asarray(params) / bucket_params(group_size)))


def gradient_reduction_s(grads, group: Placement, replicate: Placement | None, cluster: Cluster, units=None):
    """Seconds to reduce-scatter `grads` bytes over ZeRO's group, and under hybrid sharding
    to all-reduce the 1/|group| shard over the replicas after it: on one stream (`units`
    None), or in `units` equal pieces whose all-reduces run beside the next piece's
    reduce-scatter where the two use different links (PyTorch's FSDP, the module docstring)."""
    rs = collective_time("reduce_scatter", grads, group, cluster)
    if replicate is None:
        return rs
    ar = collective_time("all_reduce", grads / group.size, replicate, cluster)
    if units is None:
        return rs + ar
    apart = (np.asarray(group.domains) == 1) & (np.asarray(replicate.domains) > 1)
    return np.where(apart, np.maximum(rs, ar) + np.minimum(rs, ar) / units, rs + ar)


def dp_costs(zero_stage: int, params, weight_bytes_per_param, grad_bytes_per_param, group: Placement,
             cluster: Cluster, replicate: Placement | None = None, units=1) -> DPCosts:
    """Collective seconds for the gradients and weights of a device holding `params` (before
    sharding), over ZeRO's `group` and, under hybrid sharding, the `replicate` group (ZeRO-2/3
    reducing in `units` pieces: the stage's layers). With one rank in a group its collectives
    take zero time."""
    grads = params * grad_bytes_per_param
    weights = params * weight_bytes_per_param
    zero = 0.0 * params
    if zero_stage == 0:
        return DPCosts(collective_time("all_reduce", grads, group, cluster), zero, zero, zero)
    if zero_stage == 1:
        return DPCosts(gradient_reduction_s(grads, group, replicate, cluster),
                       collective_time("all_gather", weights, group, cluster), zero, zero)
    reduce = gradient_reduction_s(grads, group, replicate, cluster, units)
    if zero_stage == 2:
        return DPCosts(zero, collective_time("all_gather", weights, group, cluster), zero, reduce)
    return DPCosts(zero, zero, 2 * collective_time("all_gather", weights, group, cluster), reduce)


def bucketed_overlap_s(comm_s, compute_s, k) -> object:
    """Seconds a bucketed transfer adds to the pass it overlaps.

    Gradient reduction: k equal buckets of comm_s/k seconds, bucket q issued when q+1 k-ths of
    the backward pass are done, run back to back on one stream: the last finishes comm_s/k
    after the pass when the stream keeps up (comm_s <= compute_s), else compute_s/k + comm_s
    after its start. Weight gather (its time reversal): bucket q must have arrived before the
    q-th k-th of the forward pass runs, the gathers issued ahead and back to back. Either way
    max(c/k, c - f + f/k).
    """
    return np.maximum(comm_s / k, comm_s - compute_s + compute_s / k)
