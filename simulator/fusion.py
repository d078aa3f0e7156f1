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

What autograd keeps for the backward pass differs too (the saved tensors of each op's
backward formula, tools/autograd/derivatives.yaml; a tensor saved by two ops counted once):

- RMSNorm eager keeps the fp32 copy of its input (pow and mul save it: 4 B, the input
  itself when activations are fp32) and the normalised output the weight multiplies
  (activation bytes); the fused kernel keeps its 16-bit input (and per-row statistics);
- SwiGLU eager keeps w1's output (silu saves it), silu's output and w3's output (the mul
  saves both operands): 3 activation-sized tensors of the FFN width where the fused kernel
  keeps its two inputs; the down projection's input is kept by that linear either way;
- RoPE keeps only freqs_cis (the complex mul saves the operand that has no gradient):
  nothing activation-sized either way.

These bytes are what a layer holds without recomputation, and what a recomputed layer
rebuilds before its backward (recompute.py): the eager layer peaks higher.

`plan.eager_norm` says which RMSNorm runs eager: `composite`, the sequence above (torchtitan's
own RMSNorm until pytorch/torchtitan#1115, Apr 2025; torch's nn.RMSNorm before torch 2.8 and
on CPUs, where rms_norm is CompositeImplicitAutograd), or `fused`, torch's nn.RMSNorm on CUDA
since the fused kernel (pytorch/pytorch#153666, torch 2.8; native_functions.yaml
_fused_rms_norm: CUDA _fused_rms_norm_cuda, its backward reading the input and the per-row
rstd): one kernel, as compiled.

LayerNorm and GELU are one kernel each in eager PyTorch too (F.layer_norm, F.gelu), and the
residual adds are one kernel either way. torchtitan compiles each transformer block, not
the loss, so the cross-entropy is the same eager kernel sequence either way (workload.py).
"""

from __future__ import annotations

from dataclasses import replace

from .states import FP32_BYTES, activation_bytes

# Bytes per element of the eager kernel sequence over the fused kernel's, 16-bit activations.
EAGER_BYTES = {"rmsnorm": (36.0, 6.0), "rope": (20.0, 4.0), "swiglu": (10.0, 6.0)}
EAGER_NORMS = ("composite", "fused")
NORMS = ("attn_norm", "mlp_norm", "final_norm", "qk_norm", "attn_post_norm", "mlp_post_norm", "mla_q_norm",
         "mla_kv_norm")


def eager_saved_factor(kernel: str, act_bytes: float) -> float:
    """Saved bytes of the eager kernel sequence over the fused kernel's (module docstring)."""
    if kernel == "rmsnorm":
        return (FP32_BYTES + act_bytes) / act_bytes
    return 1.5 if kernel == "swiglu" else 1.0


def _kernel(op_name: str, model) -> str | None:
    if op_name in NORMS:
        return "rmsnorm" if model.norm == "rmsnorm" else None
    name = op_name.removeprefix("shared_")  # an MoE layer's shared experts: a dense MLP's kernels
    return name if name in EAGER_BYTES else None


def eager_ops(ops: list, model, plan) -> list:
    """The operators as the plan launches them: unchanged when compiled, the eager kernel
    sequence's traffic and saved tensors otherwise."""
    if plan.compile:
        return ops
    act_bytes = activation_bytes(plan.precision)
    out = []
    for op in ops:
        kernel = _kernel(op.name, model)
        if kernel is None or kernel == "rmsnorm" and plan.eager_norm == "fused":
            out.append(op)
            continue
        eager, fused = EAGER_BYTES[kernel]
        k = eager / fused
        out.append(replace(op, fwd_bytes=op.fwd_bytes * k, bwd_input_bytes=op.bwd_input_bytes * k,
                           bwd_weight_bytes=op.bwd_weight_bytes * k,
                           saved_bytes=op.saved_bytes * eager_saved_factor(kernel, act_bytes)))
    return out
