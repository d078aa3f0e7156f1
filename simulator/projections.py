"""The layer's projections as separate linears instead of one fused GEMM each.

Megatron-LM and TransformerEngine compute Q, K and V with one GEMM (linear_qkv) and the
gated MLP's gate and up with one (linear_fc1); torchtitan's Llama and Hugging Face models
use separate nn.Linear modules: wq, wk, wv and w1, w3 (torchtitan@820504e
torchtitan/models/llama3/model.py Attention.forward and FeedForward.forward;
`plan.projections: separate`). Same FLOPs; what differs:

- Each projection is its own GEMM over the same input, timed on its own shape: the input
  is read once per GEMM in the forward and weight-gradient passes, and a narrow projection
  (K and V of grouped-query attention split over TP ranks) can be memory-bound where the
  fused GEMM is not. The fused operator keeps its name and carries the projections as
  `Op.pieces` (compute.op_times sums their times).
- The input gradient is the sum of the projections' input gradients. With torch.compile
  and GEMMs that are aten.mm (16- and 32-bit), Inductor rewrites `mm + mm` as `addmm`
  (torch/_inductor/fx_passes/post_grad.py, the `addmm` graph pattern, is_valid_addmm_fusion):
  each GEMM after the first reads the running sum in its epilogue, one more read of the
  input-gradient tensor in that GEMM's bytes. Seen on this project's CPU (torch 2.13): the
  compiled backward of a block with separate wq/wk/wv and w1/w3 runs mm, then addmm with
  beta 1, chained. FP8 GEMMs (torch._scaled_mm) do not match the pattern: one pointwise
  kernel reads the r gradients and writes their sum (r + 1 tensors). Eager autograd adds
  them one at a time (torch/csrc/autograd/input_buffer.cpp InputBuffer::add: read both,
  write one): 3 tensors per added gradient.

The routed experts' gate and up are separate grouped GEMMs in torchtitan too
(torchtitan@b5bcd76c6 torchtitan/models/common/moe.py GroupedExperts: w1 and w3, each its own
torch._grouped_mm), whose input-gradient sum no addmm pattern matches. Activation memory does
not change: the projections save the same input tensor once.
"""

from __future__ import annotations

from dataclasses import replace

from .compute import as_gemm_kind
from .workload import MATMUL, MEMORY, LinearShape, Op, Shard, _linear

PROJECTIONS = ("fused", "separate")
# fused workload operator -> its separate linears (torchtitan's names)
SEPARATE = {"qkv": ("wq", "wk", "wv"), "mlp_gate_up": ("w1", "w3"), "shared_mlp_gate_up": ("shared_w1", "shared_w3"),
            "expert_fc1": ("expert_w1", "expert_w3")}


def _runs_separate(op: Op, plan) -> bool:
    """Whether linear `op` runs as separate projections: a fused one under `projections: separate`."""
    return plan.projections == "separate" and op.name in SEPARATE and len(op.linear.widths) > 1


def readers(op: Op, plan) -> int:
    """Linears reading the input of linear `op`: its projections when they run separately."""
    return len(op.linear.widths) if _runs_separate(op, plan) else 1


def _projection(name, kind, shape: LinearShape, d_out, act_bytes) -> Op:
    """One projection's GEMM, in the fused operator's kind (FP8 operands in 1 B)."""
    matrices = shape.matrices if shape.grouped else None
    return as_gemm_kind(_linear(name, shape.tokens, shape.d_in, d_out, act_bytes, 0.0, matrices=matrices), kind,
                        act_bytes)


def separate_ops(ops: list[Op], shard: Shard, plan) -> list[Op]:
    """The layer's operators with its fused projections run as separate GEMMs and their
    input gradients summed (module docstring); unchanged for `projections: fused`."""
    if plan.projections != "separate":
        return ops
    a = shard.act_bytes
    out = []
    for op in ops:
        if not _runs_separate(op, plan):  # also an ungated MLP's experts: one GEMM
            out.append(op)
            continue
        shape = op.linear
        pieces = [_projection(name, op.kind, shape, w, a) for name, w in zip(SEPARATE[op.name], shape.widths)]
        grad = a * shape.tokens * shape.d_in  # one input-gradient tensor
        # Inductor's addmm pattern matches aten.mm, not FP8's _scaled_mm nor _grouped_mm
        r, addmm = len(pieces), op.kind == MATMUL and plan.compile and not shape.grouped
        if addmm:  # each GEMM after the first reads the running sum in its epilogue
            pieces = pieces[:1] + [replace(p, bwd_input_bytes=p.bwd_input_bytes + grad) for p in pieces[1:]]
        out.append(replace(op, pieces=tuple(pieces), fwd_bytes=sum(p.fwd_bytes for p in pieces),
                           bwd_input_bytes=sum(p.bwd_input_bytes for p in pieces),
                           bwd_weight_bytes=sum(p.bwd_weight_bytes for p in pieces)))
        if not addmm:
            summed = (r + 1) * grad if plan.compile else 3 * (r - 1) * grad
            out.append(Op(f"{op.name}_grad_sum", MEMORY, bwd_input_bytes=summed, group=op.group))
    return out
