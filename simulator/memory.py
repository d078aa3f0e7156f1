"""Activation and buffer memory of one device, and the one rule that composes a stage's peak.

- Saved activations: the saved tensors of the workload's operators (workload.py;
  Korthikanti et al. 2022) per micro-batch and model chunk, times the chunks in flight at
  the stage's peak, which the schedule gives (schedules.py; the graph engine's memory
  timeline takes and frees the same bytes at each pass). What a recompute mode keeps and
  rebuilds is recompute.py's.
- On top of the saved tensors, at the moment a stage peaks: what recomputation rebuilds
  (a layer, a group of layers, an attention core), under full recomputation with the
  gradients in flight at that layer's MLP (rerun_gradient_bytes), with the buffers of PyTorch's
  context-parallel ring (cpattention.py), and where the last virtual stage sits the head's
  saved tensors plus the loss's backward transient, whichever moment is larger.
- Activation offload keeps few chunks on the device (offload.resident_chunks_with_offload);
  the rest waits in host memory.
- Other: the framework's reserve (a profile parameter) and communication buffers.
- Beside the live bytes, what PyTorch's caching allocator keeps reserved and free at the
  loss (allocator.py): the reserved peak, which torch's max_memory_reserved reports.
- PyTorch's pipeline runtime (plan.pp_impl: torch) holds receive buffers, outputs and input
  gradients beside the saved activations; pipebuffers.py composes that peak.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from . import allocator, cpattention
from .recompute import chunk_checkpoint, layer_checkpoint, plan_checkpoint
from .workload import Shard, embedding_ops, head_ops, layer_ops, loss_backward_transient_bytes

# The projection after a layer's MLP activation (a dense MLP's, the routed experts', the shared experts')
DOWN_PROJECTIONS = ("mlp_down", "expert_fc2", "shared_mlp_down")


def rerun_gradient_bytes(model, shard: Shard, ops):
    """Gradients alive beside a fully re-run layer's activations during its backward pass,
    taken where the MLP's activation runs backward: the layer output's gradient (the residual
    stream's, on the sequence shard) and the activation's input gradient ((m - 1) times the down
    projection's input: gate and up for a gated MLP; per expert where SequentialMLP runs them
    one at a time); its output gradient has taken the place of the down projection's input,
    which autograd frees once that projection's backward has run."""
    inputs = [op.linear.tokens * op.linear.d_in / op.launches for op in ops
              if op.linear is not None and op.name.rsplit(".", 1)[-1] in DOWN_PROJECTIONS]
    widest = np.maximum.reduce(np.broadcast_arrays(*inputs)) if inputs else 0.0
    return shard.act_bytes * (shard.replicated_tokens * model.hidden + (model.mlp_matrices - 1) * widest)


def layer_saved_bytes(model, shard: Shard, recompute: str, ops=None):
    """Bytes one layer keeps for the backward pass of one micro-batch under a recompute mode
    (recompute.py; `full` is one layer checkpointed on its own)."""
    ops = layer_ops(model, shard) if ops is None else ops
    return layer_checkpoint(model, shard, recompute, ops).saved_bytes


@dataclass(frozen=True)
class ActivationSizes:
    """Per micro-batch bytes of one representative stage's device."""

    chunk_bytes: object  # saved by the layers of one model chunk
    embedding_bytes: object  # saved by the embedding (where the first virtual stage sits)
    extra_bytes: object  # held at the stage's peak on top of the in-flight chunks
    cached_free_bytes: object = 0.0  # reserved by the caching allocator beyond the peak's live bytes


@dataclass(frozen=True)
class LayerActivations:
    """Per micro-batch bytes of one layer kind, the embedding and the head, whatever a stage
    holds of them (layer_activations; stage_activations composes a stage's)."""

    checkpoint: object  # recompute.LayerCheckpoint of the layer
    plain_bytes: object  # what the layer keeps without recomputation
    embedding_bytes: object
    head_held_bytes: object  # the head's saved tensors and the loss's backward transient
    transient_bytes: object  # the CP ring's buffers during a layer's backward
    rerun_gradient_bytes: object  # under full recomputation (rerun_gradient_bytes), else 0
    loss_free_bytes: object  # the loss's free block (allocator.py)


def layer_activations(model, shard: Shard, plan, ops=None, head=None, experts=None) -> LayerActivations:
    """`head`: the head's operators (default workload.head_ops); `experts`: an MoE layer's
    moe.ExpertShard, with its `ops`."""
    ops = layer_ops(model, shard) if ops is None else ops
    head = head_ops(model, shard) if head is None else head
    return LayerActivations(
        plan_checkpoint(model, shard, plan, ops, experts),
        sum(op.saved_bytes for op in ops), sum(op.saved_bytes for op in embedding_ops(model, shard)),
        sum(op.saved_bytes for op in head) + loss_backward_transient_bytes(model, shard),
        cpattention.transient_bytes(model, shard, plan.cp_attention),
        rerun_gradient_bytes(model, shard, ops) if plan.recompute == "full" else 0.0,
        allocator.loss_free_bytes(model, shard, plan))


def stage_activations(layer: LayerActivations, plan, layers_per_chunk, has_embedding, has_head) -> ActivationSizes:
    """The activation bytes of a stage's device holding `layers_per_chunk` layers of the kind
    per model chunk, the embedding and the head where flagged."""
    chunk = chunk_checkpoint(plan, layer.checkpoint, layer.plain_bytes, layers_per_chunk)
    emb = np.asarray(has_embedding) * layer.embedding_bytes
    held = layer.head_held_bytes
    # a layer's backward holds what recomputation rebuilt and the CP ring's buffers
    rebuilt = chunk.rebuilt_bytes + layer.transient_bytes
    if plan.recompute == "full":
        rebuilt = rebuilt + np.where(np.asarray(chunk.rebuilt_bytes) > 0, layer.rerun_gradient_bytes, 0.0)
    extra = np.where(has_head, np.maximum(rebuilt, held), rebuilt)
    # reserved only grows: the loss's free block stays reserved through the layers' backward
    reserved = np.where(has_head, np.maximum(rebuilt, held + layer.loss_free_bytes), rebuilt)
    return ActivationSizes(chunk.saved_bytes, emb, extra, reserved - extra)


def peak_activation_bytes(sizes: ActivationSizes, resident_chunks, in_flight_embedding):
    """A stage's peak activation bytes for the chunks resident at its peak."""
    emb = np.minimum(in_flight_embedding, resident_chunks)
    return resident_chunks * sizes.chunk_bytes + emb * sizes.embedding_bytes + sizes.extra_bytes


def buffer_bytes(framework_overhead_bytes, layer_params, plan, weight_bytes_per_param, grad_bytes_per_param):
    """Framework reserve plus communication and gather buffers."""
    other = framework_overhead_bytes + 0.0 * layer_params
    if plan.zero_stage >= 3 or plan.offload.params != "none":
        # FSDP/ZeRO-3 gather one layer's weights and prefetch the next.
        other = other + 2 * layer_params * weight_bytes_per_param
    if plan.zero_stage >= 2 or plan.offload.optimizer != "none":
        # a layer's unsharded gradients wait for their reduce-scatter
        other = other + layer_params * grad_bytes_per_param
    return other


MEMORY_KEYS = ("weights", "gradients", "optimizer", "activations", "other")


@dataclass(frozen=True)
class StageMemory:
    """Bytes on one device of a pipeline stage, by part."""

    stage: object
    weights: object
    gradients: object
    optimizer: object
    activations: object
    other: object
    cached_free_bytes: object = 0.0  # not a part of the total: reserved, free (allocator.py)

    @property
    def total(self):
        return self.weights + self.gradients + self.optimizer + self.activations + self.other

    @property
    def reserved_bytes(self):
        """What the caching allocator holds at the stage's peak: the live bytes and its free blocks."""
        return self.total + self.cached_free_bytes

    def as_dict(self) -> dict:
        return {k: getattr(self, k) for k in MEMORY_KEYS}
