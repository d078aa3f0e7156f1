"""Memory-bound kernels fused (the default) or launched op by op as eager PyTorch runs them.

The workload's memory-bound operators (workload.py) move the bytes of one fused kernel each:
what torch.compile, TransformerEngine or Megatron-LM's fused kernels run. Eager PyTorch
(`plan.compile: false`) runs torchtitan's Llama as written, one kernel per tensor op, each
reading and writing HBM (torchtitan@9dec370 torchtitan/models/norms.py RMSNorm._norm and
forward; torchtitan/models/llama/model.py apply_rotary_emb and FeedForward.forward), bytes
per element of the output, forward (the backward moves twice that, as for every
elementwise operator here):

- RMSNorm `(x.float() * rsqrt(x.float().pow(2).mean(-1) + eps)).type_as(x) * weight`:
  float 2 + 4, pow 4 + 4, mean 4, mul 4 + 4, type_as 4 + 2, mul by the weight 2 + 2 = 36
  (fused: 6);
- RoPE on q and k: float 2 + 4, complex multiply 4 + 4, type_as 4 + 2 = 20 (fused: 4);
- SwiGLU `silu(w1(x)) * w3(x)`: silu 2 + 2, mul 2 + 2 + 2 = 10 per element of the FFN width
  (fused: 6).

LayerNorm and GELU are one kernel each in eager PyTorch too (F.layer_norm, F.gelu), and the
residual adds are one kernel either way. torchtitan compiles each transformer block, not
the loss, so the cross-entropy is the same eager kernel sequence either way (workload.py).
"""

from __future__ import annotations

from dataclasses import replace

# Bytes per element of the eager kernel sequence over the fused kernel's, 16-bit activations.
EAGER_BYTES = {"rmsnorm": (36.0, 6.0), "rope": (20.0, 4.0), "swiglu": (10.0, 6.0)}
NORMS = ("attn_norm", "mlp_norm", "final_norm")


def _kernel(op_name: str, model) -> str | None:
    if op_name in NORMS:
        return "rmsnorm" if model.norm == "rmsnorm" else None
    return op_name if op_name in EAGER_BYTES else None


def eager_ops(ops: list, model, plan) -> list:
    """The operators as the plan launches them: unchanged when compiled, the eager kernel
    sequence's traffic otherwise."""
    if plan.compile:
        return ops
    out = []
    for op in ops:
        kernel = _kernel(op.name, model)
        if kernel is None:
            out.append(op)
            continue
        eager, fused = EAGER_BYTES[kernel]
        k = eager / fused
        out.append(replace(op, fwd_bytes=op.fwd_bytes * k, bwd_input_bytes=op.bwd_input_bytes * k,
                           bwd_weight_bytes=op.bwd_weight_bytes * k))
    return out
