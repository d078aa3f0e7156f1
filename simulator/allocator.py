"""What PyTorch's caching allocator keeps reserved beyond the live tensors, at the loss.

`torch.cuda.max_memory_reserved` counts the allocator's segments, their free blocks included;
it is the memory torchtitan logs (torchtitan@9dec370 torchtitan/metrics.py: `max_reserved_gib`
from `reserved_bytes.all.peak`), while llmsim's `peak_memory_gib` counts live tensors (what
`max_memory_allocated` reports). One gap between the two follows from the loss's order of
allocations alone, under the allocator's rules (pytorch/pytorch@eb42ad6eca
c10/cuda/CUDACachingAllocator.cpp; torchtitan runs with `expandable_segments:True`,
torchtitan@9dec370 run_llama_train.sh):

- a request takes the smallest free block that holds it (`get_free_block`: best fit), split
  if larger; freed neighbours merge;
- where none holds it, the segment grows at its end (`find_expandable_block`), and the free
  blocks inside stay reserved.

The unfused loss (and DTensor's loss-parallel one, loss.py) upcasts the 16-bit logits to fp32
and keeps the fp32 log-softmax; the 16-bit logits are freed before the backward (torchtitan
`del pred`; an unreferenced temporary elsewhere), and the fp32 upcast with them. The backward
then allocates fp32 logits-sized buffers one by one. The first takes the upcast's 4 bytes per
logit (or the merged 16-bit and fp32 blocks, leaving the 16-bit part); the next finds only the
16-bit logits' a bytes per logit free, too small for 4, and the segment grows. So at the
loss's peak a·N bytes (N local logits) are reserved and free: max reserved exceeds the live
bytes by them (DTensor's loss-parallel forward frees one more fp32 temporary, which its
backward's extra buffer takes, leaving the same). In later steps other free blocks may sit
beside these; a·N is what the loss's own order leaves.

Without expandable segments (PyTorch's default) every block that found no free space is a
segment of its own (cudaMalloc), and the same a·N stay free. No such gap where the logits are
fp32 (their block takes the first fp32 buffer exactly), where the logits stay allocated
through the backward (PyTorch's pipeline keeps the last stage's output in fwd_cache until its
backward, pipebuffers.py), under Megatron-LM's in-place loss (`vocab-parallel`: its one fp32
buffer is the saved softmax and the gradient, whose 16-bit copy takes the freed logits'
block exactly), or where no logits-sized tensor is built (`fused`, or the
`chunked` loss whose chunks reuse blocks of one size). Before it reports out of memory the
allocator releases its free segments (unmaps free blocks, with expandable segments) and
retries, so whether a plan fits stays a matter of the live bytes; the gap is what the logs
show.
"""

from __future__ import annotations

import numpy as np

from .states import FP32_BYTES


def loss_free_bytes(model, shard, plan):
    """Bytes reserved but free at the loss's backward peak of the last virtual stage: the
    16-bit logits' block (module docstring), 0 where none is left."""
    logits = shard.tokens * model.vocab / shard.tp
    materialised = shard.loss in ("unfused", "loss-parallel") and shard.act_bytes < FP32_BYTES
    held = (plan.pp_impl == "torch") & (np.asarray(plan.pp) > 1)
    return np.where(materialised & ~held, shard.act_bytes * logits, 0.0)
