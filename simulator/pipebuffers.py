"""What PyTorch's pipeline runtime holds on a device besides the saved activations.

`plan.pp_impl: torch` is torch.distributed.pipelining, the pipeline of torchtitan
(torch/distributed/pipelining/stage.py and _backward.py; read at pytorch/pytorch@060ca5d783
and @0138610331). Megatron-LM (`pp_impl: megatron`) receives each activation into a fresh
tensor that becomes the first layer's saved input, and frees a stage's output once it is
sent (deallocate_output_tensor); llmsim counts nothing more for it. PyTorch's stage instead:

- allocates, once, a receive buffer per micro-batch for the activation each non-first
  virtual stage receives and one for the gradient each non-last virtual stage receives
  (_prepare_forward_infra, _prepare_backward_infra: one _RecvInfo with its torch.empty
  buffer per micro-batch), so they stay allocated through every step;
- keeps each micro-batch's output in fwd_cache until its backward (autograd.backward from
  that output), where Megatron frees it once sent;
- keeps the input gradient of each backward in the receive buffer's .grad (stage_backward
  reads val.grad after torch.autograd.backward) until the next step's clear_runtime_states;
- keeps every micro-batch's output in output_chunks until the next step
  (`plan.pp_outputs`): on every stage up to pytorch/pytorch#153383 (merged 2025-05-13, so
  in torch 2.7 and before: get_fwd_send_ops read the output from it), on the last stage
  only after it (`last-stage`, what step() merges and returns), and nowhere where the
  schedule's step(return_outputs=False) is called (`in-flight`: torchtitan since
  pytorch/torchtitan@e5ef99aab, 2025-10-22, trainer.py).

The activation sent between stages is a micro-batch's hidden states, split over the TP ranks
under sequence parallelism (DTensor's Shard(1) output of the block); the last virtual stage's
output is its logits, 16-bit and split over the TP ranks as the lm_head computes them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

PP_IMPLS = ("megatron", "torch")
PP_OUTPUTS = ("in-flight", "last-stage", "every-stage")


@dataclass(frozen=True)
class PipeBuffers:
    """Bytes per micro-batch of what the torch pipeline passes between virtual stages."""

    boundary_bytes: object  # a micro-batch's activation (and its gradient) between two virtual stages
    logits_bytes: object  # the last virtual stage's output
    outputs: str  # plan.pp_outputs: whose outputs wait for the step's end


def pipe_buffers(model, shard, plan) -> PipeBuffers | None:
    """The torch pipeline's buffer sizes, or None where no runtime buffers are counted
    (`pp_impl: megatron`, or no pipeline)."""
    if plan.pp_impl != "torch" or np.all(np.asarray(plan.pp) == 1):
        return None
    boundary = shard.act_bytes * shard.replicated_tokens * model.hidden  # the first layer's checkpointed input
    logits = shard.act_bytes * shard.tokens * model.vocab / shard.tp
    on = np.asarray(plan.pp) > 1
    return PipeBuffers(np.where(on, boundary, 0.0), np.where(on, logits, 0.0), plan.pp_outputs or "last-stage")


def _chunk_io(b: PipeBuffers, first_virtual: bool, last_virtual: bool):
    """(input, output, whether the output waits for the step's end) of one chunk: the first
    virtual stage receives token ids, the last one outputs logits."""
    x_in = 0.0 if first_virtual else b.boundary_bytes
    x_out = b.logits_bytes if last_virtual else b.boundary_bytes
    kept = b.outputs == "every-stage" or (b.outputs == "last-stage" and last_virtual)
    return x_in, x_out, kept


def chunk_events(b: PipeBuffers, m, first_virtual: bool, last_virtual: bool, local_in: bool = False,
                 local_out: bool = False):
    """(bytes held all step, bytes a forward takes beyond the chunk's saved activations, bytes
    of those a backward leaves taken) of one chunk for `m` micro-batches. Held: the receive
    buffers. A forward takes its output (its input is in a receive buffer, not new); its
    backward returns the saved activations and, unless it waits for the step's end, the
    output, and leaves the input gradient. Between two virtual stages on one device (the
    turn of a V, `local_in` / `local_out`) the stage hands its output and gradient over as
    the receive buffers themselves (PipelineStage.set_local_fwd_input, set_local_bwd_input),
    so neither takes more than the buffers."""
    x_in, x_out, kept = _chunk_io(b, first_virtual, last_virtual)
    held = m * (x_in + (0.0 if last_virtual else x_out))
    output = 0.0 if local_out else x_out
    return held, output - x_in, (0.0 if local_in else x_in) + (output if kept else 0.0)


def peak_activation_bytes(b: PipeBuffers, sizes, schedule, p, m, v, stage, has_embedding, has_head):
    """A stage's peak of saved activations (memory.ActivationSizes) and runtime buffers: their
    sum after each of its forwards, as chunk_events counts them over the stage's chunks, at
    the largest. With the counts after a forward (Schedule.forward_moments: in flight, of
    chunk 0, of the last chunk, backwards done, of chunk 0, forwards of the last chunk) the
    sum is linear, so the peak is the largest of the coefficients' products with those rows.
    Broadcast-safe (plans grouped by pipeline shape)."""
    x, logits = b.boundary_bytes, b.logits_bytes
    e, h = np.asarray(has_embedding, dtype=float), np.asarray(has_head, dtype=float)
    every = b.outputs == "every-stage"
    zero = 0.0 * x
    if b.outputs == "in-flight":
        per_live_head, per_fwd_head = h * (logits - x), zero
    elif b.outputs == "last-stage":
        per_live_head, per_fwd_head = -h * x, h * logits
    else:
        per_live_head, per_fwd_head = zero, h * (logits - x)
    # the turn of a V hands chunk 0's output to chunk 1 on the same device (chunk_events)
    t = np.where((schedule.placement == "v") & (np.asarray(stage) == np.asarray(p) - 1), x, zero)
    coefficients = (sizes.chunk_bytes + zero, sizes.embedding_bytes + e * x - t, per_live_head,
                    (2.0 if every else 1.0) * x - t, -e * x + (0.0 if every else 1.0) * t, per_fwd_head)
    held = m * x * ((v - e) + (v - h))
    return held + sizes.extra_bytes + _largest(schedule, p, m, v, stage, coefficients)


def _largest(schedule, p, m, v, stage, coefficients):
    """max over the rows of schedule.forward_moments of their products with `coefficients`,
    per plan."""
    arrays = np.broadcast_arrays(np.asarray(p), np.asarray(m), np.asarray(v), np.asarray(stage),
                                 *(np.asarray(c, dtype=float) for c in coefficients))
    shape = arrays[0].shape
    keys = np.stack([a.ravel().astype(np.int64) for a in arrays[:4]], axis=1)
    weights = np.stack([a.ravel() for a in arrays[4:]], axis=1)
    unique, inverse = np.unique(keys, axis=0, return_inverse=True)
    inverse = inverse.ravel()
    order = np.argsort(inverse, kind="stable")
    bounds = np.searchsorted(inverse[order], np.arange(len(unique) + 1))
    out = np.empty(len(keys))
    for k, (pp, mm, vv, ss) in enumerate(unique):
        rows = order[bounds[k]:bounds[k + 1]]
        moments = schedule.forward_moments(pp, mm, vv, min(ss, pp - 1))
        out[rows] = (weights[rows] @ moments.T).max(axis=1)
    return out.reshape(shape) if shape else float(out[0])
