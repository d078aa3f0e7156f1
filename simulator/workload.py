"""Per-layer operators of one micro-batch on one device: FLOPs, bytes moved, activations saved.

Pure functions. Sizes are per device after tensor (tp), context (cp) and sequence
parallel sharding. Conventions:

- `fwd_flops`, `bwd_input_flops`, `bwd_weight_flops` are *counted* FLOPs (2 per
  multiply-add, full s x s attention), so that three times the forward FLOPs of a GPT
  model equals Megatron-LM's 72·B·s·l·h²·(1 + s/6h + V/12lh) (Narayanan et al. 2021).
- `exec_scale` converts counted to executed FLOPs for kernels that do less or more
  work: a causal flash-attention kernel skips the masked half of the scores in the
  forward pass and recomputes them in the backward pass (Dao 2023, FlashAttention-2).
- `saved_bytes` are the activations kept for the backward pass. For a GPT layer with
  dropout and without flash attention they add up to Korthikanti et al. 2022, Sec. 4:
  sbh(34 + 5as/h) without parallelism, sbh(10 + 24/t + 5as/ht) with TP, and
  sbh(34 + 5as/h)/t with TP + sequence parallelism. Ops in the group
  "attention_core" (QK^T, softmax, dropout, AV; or the flash kernel) are what selective
  recomputation re-runs and whose saved tensors it drops (the 5as/h term); their
  inputs Q, K, V are saved by the QKV projection.
- Bytes moved by memory-bound ops are estimates of the fused kernels' traffic (read
  inputs, write outputs); the backward pass of an elementwise op moves about twice its
  forward traffic (reads the saved input and the incoming gradient, writes the gradient).

Numeric arguments may be numpy arrays (one entry per plan) for vectorised sweeps.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .model import ModelSpec

MATMUL, ATTENTION, MEMORY = "matmul", "attention", "memory"
ATTENTION_CORE = "attention_core"


@dataclass(frozen=True)
class Op:
    name: str
    kind: str  # matmul | attention | memory
    fwd_flops: object = 0.0
    bwd_input_flops: object = 0.0
    bwd_weight_flops: object = 0.0
    fwd_bytes: object = 0.0
    bwd_bytes: object = 0.0
    saved_bytes: object = 0.0
    group: str | None = None
    fwd_exec_scale: float = 1.0
    bwd_exec_scale: float = 1.0

    @property
    def flops(self):
        return self.fwd_flops + self.bwd_input_flops + self.bwd_weight_flops


@dataclass(frozen=True)
class Shard:
    """How one micro-batch is split on a device."""

    micro_batch: object  # b
    tp: object = 1  # t
    cp: object = 1
    sp: bool = False  # sequence parallelism (only meaningful with tp > 1)
    flash_attention: bool = True
    act_bytes: int = 2  # bytes per activation element (16-bit training)


def _linear(name, tokens, d_in, d_out, act_bytes, saved_in):
    """A dense layer y = x W on `tokens` rows: forward 2·T·d_in·d_out FLOPs, backward twice that.

    Weights are read in the compute precision: 16-bit under mixed precision, 4 B in fp32.
    """
    flops = 2 * tokens * d_in * d_out
    traffic = act_bytes * (tokens * (d_in + d_out) + d_in * d_out)
    return Op(name, MATMUL, fwd_flops=flops, bwd_input_flops=flops, bwd_weight_flops=flops,
              fwd_bytes=traffic, bwd_bytes=2 * traffic, saved_bytes=saved_in)


def _elementwise(name, elements, bytes_per_element, saved, group=None):
    traffic = elements * bytes_per_element
    return Op(name, MEMORY, fwd_bytes=traffic, bwd_bytes=2 * traffic, saved_bytes=saved, group=group)


def local_heads(model: ModelSpec, tp) -> tuple:
    """Query heads and KV heads per TP rank; KV heads are replicated when tp > kv_heads."""
    return model.heads / tp, np.maximum(model.kv_heads / tp, 1.0)


def layer_ops(model: ModelSpec, shard: Shard) -> list[Op]:
    """The operators of one transformer layer for one micro-batch on one device."""
    b, t, a = shard.micro_batch, shard.tp, shard.act_bytes
    s = model.seq_len / shard.cp  # local queries (and local keys/values) per CP rank
    s_kv = model.seq_len  # keys each query attends to, gathered around the CP ring
    h, f, d = model.hidden, model.ffn_hidden, model.head_dim
    q_heads, kv_heads = local_heads(model, t)
    tokens = b * s
    # Norms, dropouts and residuals run on the full sequence on every TP rank, or on 1/t of
    # it with sequence parallelism (Korthikanti et al. 2022, Sec. 4.2.2).
    rep = tokens / t if shard.sp else tokens
    q_w, kv_w = q_heads * d, kv_heads * d
    drop = 1 if model.dropout else 0
    norm_bytes = 4 * a if model.norm == "layernorm" else 3 * a

    ops = [_elementwise("attn_norm", rep * h, norm_bytes, a * rep * h)]
    qkv = _linear("qkv", tokens, h, q_w + 2 * kv_w, a, a * rep * h)
    # Q, K and V are the attention core's inputs: saved under every recompute mode but full.
    ops.append(Op(**{**qkv.__dict__, "saved_bytes": qkv.saved_bytes + a * tokens * (q_w + 2 * kv_w)}))
    if model.position_embedding == "rope":
        ops.append(_elementwise("rope", tokens * (q_w + kv_w), 2 * a, 0.0))
    scores = b * q_heads * s * s_kv  # attention score elements per device
    core_flops = 2 * tokens * s_kv * q_w  # one of QK^T or AV, counted over the full s x s
    if shard.flash_attention:
        io = a * tokens * (2 * q_w + 2 * kv_w)
        ops.append(Op("flash_attention", ATTENTION, fwd_flops=2 * core_flops, bwd_input_flops=4 * core_flops,
                      fwd_bytes=io, bwd_bytes=2 * io, saved_bytes=4 * b * q_heads * s,  # fp32 log-sum-exp
                      group=ATTENTION_CORE,
                      # causal: half the blocks are skipped; backward recomputes QK^T (5 GEMMs vs 2)
                      fwd_exec_scale=0.5, bwd_exec_scale=0.5 * 5 / 4))
    else:
        # cuBLAS batched GEMMs around a fused scale-mask-softmax and dropout (Megatron-LM).
        qk_io = a * (tokens * (q_w + kv_w) + scores)
        ops.append(Op("qk_scores", MATMUL, fwd_flops=core_flops, bwd_input_flops=2 * core_flops,
                      fwd_bytes=qk_io, bwd_bytes=2 * qk_io, group=ATTENTION_CORE))
        ops.append(_elementwise("softmax", scores, 2 * a, a * scores, ATTENTION_CORE))
        if drop:
            ops.append(_elementwise("attn_dropout", scores, 2 * a + 1, (a + 1) * scores, ATTENTION_CORE))
        av_io = a * (scores + tokens * (kv_w + q_w))
        ops.append(Op("attn_values", MATMUL, fwd_flops=core_flops, bwd_input_flops=2 * core_flops,
                      fwd_bytes=av_io, bwd_bytes=2 * av_io, group=ATTENTION_CORE))
    # The projection's input is the attention output (flash attention's O).
    ops.append(_linear("attn_out", tokens, q_w, h, a, a * tokens * q_w))
    ops.append(_elementwise("attn_residual", rep * h, 3 * a + drop, drop * rep * h))
    ops.append(_elementwise("mlp_norm", rep * h, norm_bytes, a * rep * h))
    if model.activation == "swiglu":
        ops.append(_linear("mlp_gate_up", tokens, h, 2 * f / t, a, a * rep * h))
        ops.append(_elementwise("swiglu", tokens * f / t, 3 * a, 2 * a * tokens * f / t))
    else:
        ops.append(_linear("mlp_up", tokens, h, f / t, a, a * rep * h))
        ops.append(_elementwise("gelu", tokens * f / t, 2 * a, a * tokens * f / t))
    ops.append(_linear("mlp_down", tokens, f / t, h, a, a * tokens * f / t))
    ops.append(_elementwise("mlp_residual", rep * h, 3 * a + drop, drop * rep * h))
    return ops


def embedding_ops(model: ModelSpec, shard: Shard) -> list[Op]:
    """Input side of the first pipeline stage: token (and learned position) embedding, dropout."""
    b, t, a = shard.micro_batch, shard.tp, shard.act_bytes
    tokens = b * model.seq_len / shard.cp
    rep = tokens / t if shard.sp else tokens
    drop = 1 if model.dropout else 0
    pos = 1 if model.position_embedding == "learned" else 0
    return [_elementwise("embedding", rep * model.hidden, (2 + pos) * a + drop, drop * rep * model.hidden)]


def head_ops(model: ModelSpec, shard: Shard) -> list[Op]:
    """Output side of the last pipeline stage: final norm, lm_head (vocab-parallel), cross-entropy.

    The cross-entropy keeps fp32 logits for the backward pass: 4·s·b·V/t bytes
    (Korthikanti et al. 2022, Sec. 4.3).
    """
    b, t, a = shard.micro_batch, shard.tp, shard.act_bytes
    tokens = b * model.seq_len / shard.cp
    rep = tokens / t if shard.sp else tokens
    h, v = model.hidden, model.vocab / t
    norm_bytes = 4 * a if model.norm == "layernorm" else 3 * a
    logits = tokens * v
    return [
        _elementwise("final_norm", rep * h, norm_bytes, a * rep * h),
        _linear("lm_head", tokens, h, v, a, a * rep * h),
        # fp32 upcast, max, exp-sum and loss: read 16-bit logits, write and re-read fp32 softmax
        _elementwise("cross_entropy", logits, a + 4 + 4, 4 * logits),
    ]


def model_flops_per_sequence(model: ModelSpec) -> float:
    """Counted training FLOPs (forward + backward, no recomputation) for one sequence."""
    shard = Shard(micro_batch=1, flash_attention=True)
    layer = sum(op.flops for op in layer_ops(model, shard))
    head = sum(op.flops for op in head_ops(model, shard))
    return float(model.layers * layer + head)


def recompute_flops_per_sequence(model: ModelSpec, recompute: str, flash_attention: bool) -> float:
    """Counted forward FLOPs re-executed by activation recomputation, per sequence."""
    if recompute == "none" or (recompute == "selective" and flash_attention):
        return 0.0  # a flash kernel saves no score matrix: selective recompute has nothing to drop
    ops = layer_ops(model, Shard(micro_batch=1, flash_attention=flash_attention))
    if recompute == "full":
        return float(model.layers * sum(op.fwd_flops for op in ops))
    return float(model.layers * sum(op.fwd_flops for op in ops if op.group == ATTENTION_CORE))
