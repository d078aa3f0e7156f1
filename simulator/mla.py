"""Multi-head latent attention (DeepSeek-V2, arXiv 2405.04434 Sec. 2.1; DeepSeek-V3) on one
device: its low-rank projections, the attention core with 192-wide queries and keys and
128-wide values (DeepSeek-V3), its parameters and its tensor-parallel collectives.

As Megatron-Core runs it (NVIDIA/Megatron-LM@d98e8a64dd
megatron/core/transformer/multi_latent_attention.py MLASelfAttention, TE layers):

- down-projections W_DQ (hidden -> q_lora_rank) and W_DKV+W_KR (hidden -> kv_lora_rank +
  qk_rope_head_dim) are duplicated on every TP rank (parallel_mode "duplicated") and run on
  the rank's sequence-parallel tokens, followed by RMSNorms of the latents;
- up-projections W_UQ (q_lora_rank -> heads x (nope + rope)) and W_UK+W_UV (kv_lora_rank ->
  heads x (nope + v)) are column-parallel: with sequence parallelism they all-gather the
  latents of the whole sequence first (and again in the backward pass for their weight
  gradients), not the hidden state; without q_lora_rank the query projection is a
  column-parallel hidden -> heads x (nope + rope) GEMM, gathering the hidden state;
- RoPE on the rope part of the queries and of the one shared rope key;
- the attention core over heads/tp heads, the row-parallel output projection (heads x v ->
  hidden) and its reduce-scatter.

Model FLOPs count these projections as they are (MLA counted as MLA, not as the MHA whose
weights it factorises). Not modelled: the TP all-reduce of the duplicated down-projections'
weight gradients (Megatron reduces the gradients of sequence-parallel parameters once per
step), as for the norms.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from .comm import collective_time


def _q_in(model):
    """Width of what the query up- (or full) projection reads: the query latent or the hidden state."""
    return model.q_lora_rank or model.hidden


def mla_attention_ops(model, shard) -> list:
    """MLA's operators between the pre-attention norm and the residual, for one micro-batch
    on one device."""
    from .workload import Op, _elementwise, _linear, attention_core_ops

    a, t = shard.act_bytes, shard.tp
    h, heads = model.hidden, model.heads / t
    tokens, rep = shard.tokens, shard.replicated_tokens
    qk, v, rope = model.head_dim, model.v_head_dim, model.qk_rope_head_dim
    norm_bytes = 3 * a  # RMSNorm: read, write, and the input kept
    ops = []
    # the column-parallel projections read latents (or the hidden state) all-gathered under
    # sequence parallelism and keep their shard (sp_input)
    if model.q_lora_rank:
        ops += [_linear("mla_q_down", rep, h, model.q_lora_rank, a, a * rep * h),
                _elementwise("mla_q_norm", rep * model.q_lora_rank, norm_bytes, a * rep * model.q_lora_rank),
                _linear("mla_q_up", tokens, model.q_lora_rank, heads * qk, a, a * rep * model.q_lora_rank,
                        sp_input=True)]
    else:
        ops.append(_linear("mla_q", tokens, h, heads * qk, a, a * rep * h, sp_input=True))
    # its input, the normed hidden state, is kept once, by the query projection above
    kv_down = _linear("mla_kv_down", rep, h, model.kv_lora_rank + rope, a, 0.0)
    ops += [replace(kv_down, linear=replace(kv_down.linear, input_kept_elsewhere=True)),
            _elementwise("mla_kv_norm", rep * model.kv_lora_rank, norm_bytes, a * rep * model.kv_lora_rank)]
    kv_up = _linear("mla_kv_up", tokens, model.kv_lora_rank, heads * (model.qk_nope_head_dim + v), a,
                    a * rep * model.kv_lora_rank, sp_input=True)
    # Q, K and V are the attention core's inputs: kept for its backward pass
    ops.append(Op(**{**kv_up.__dict__, "saved_bytes": kv_up.saved_bytes + a * tokens * heads * (2 * qk + v)}))
    ops.append(_elementwise("rope", tokens * (heads + 1) * rope, 2 * a, 0.0))
    ops += attention_core_ops(model, shard, heads, heads, qk, v)
    ops.append(_linear("attn_out", tokens, heads * v, h, a, a * tokens * heads * v))
    return ops


def qk_concat_op(model, shard):
    """The copies eager PyTorch makes to assemble the queries and keys (torchtitan v0.2.2,
    @73a0e6979 models/deepseek_v3/model/model.py Attention.forward: torch.cat of q_nope and the
    rotated q_pe; of k_nope and k_pe expanded over the heads), each reading and writing a
    heads x qk_head_dim tensor; their backward is slicing, the split's backward one copy back.
    Compiled, they fuse into the RoPE kernel; the attention core keeps Q and K either way."""
    from .workload import MEMORY, Op

    nbytes = 2 * 2 * shard.act_bytes * shard.tokens * model.heads / shard.tp * model.head_dim
    return Op("mla_qk_cat", MEMORY, fwd_bytes=nbytes, bwd_input_bytes=nbytes / 2)


def linear_params_local(model, tp):
    """Weights of MLA's linears on a TP rank: the duplicated down-projections whole, the up-
    and output projections split over tp (MLA has no biases: model.check_shapes)."""
    h, heads = model.hidden, model.heads / np.asarray(tp)
    if model.q_lora_rank:
        q = h * model.q_lora_rank + model.q_lora_rank * heads * model.head_dim
    else:
        q = h * heads * model.head_dim
    kv = h * (model.kv_lora_rank + model.qk_rope_head_dim) + model.kv_lora_rank * heads * (model.qk_nope_head_dim
                                                                                            + model.v_head_dim)
    return q + kv + heads * model.v_head_dim * h


def params_local(model, tp):
    """MLA parameters on a TP rank: its linears' and the latent norms' (whole on every rank)."""
    return linear_params_local(model, tp) + model.q_lora_rank + model.kv_lora_rank


def tp_attention_comm_s(model, shard, groups, cluster):
    """(forward, backward) seconds of MLA's TP collectives per layer and micro-batch. With
    sequence parallelism: all-gathers of the query input (latent, or hidden without
    q_lora_rank) and of the KV latent before the column-parallel up-projections, the output
    projection's reduce-scatter; backward, their transposes and the latents gathered again
    for the weight gradients. Without it: the output projection's all-reduce forward, the
    all-reduce of the latents' gradients (the column-parallel up-projections' input) backward."""
    a, tokens = shard.act_bytes, shard.tokens
    latent = a * tokens * (_q_in(model) + model.kv_lora_rank + model.qk_rope_head_dim)
    out = a * tokens * model.hidden
    if shard.sp:
        gather = collective_time("all_gather", latent, groups.tp, cluster)
        fwd = gather + collective_time("reduce_scatter", out, groups.tp, cluster)
        bwd = collective_time("reduce_scatter", latent, groups.tp, cluster) + \
            collective_time("all_gather", out, groups.tp, cluster) + gather
        return fwd, bwd
    return collective_time("all_reduce", out, groups.tp, cluster), collective_time("all_reduce", latent, groups.tp,
                                                                                   cluster)


def tp_up_proj_gather_s(model, shard, groups, cluster):
    """Forward seconds of the all-gathers in front of the up-projections (the query latent, or
    the hidden state without q_lora_rank, and the KV latent) under sequence parallelism: what
    Megatron-Core's mla_up_proj recomputation runs again (the rope key's gather is outside
    it, multi_latent_attention.py); none without sequence parallelism."""
    if not shard.sp:
        return 0.0
    latents = shard.act_bytes * shard.tokens * (_q_in(model) + model.kv_lora_rank)
    return collective_time("all_gather", latents, groups.tp, cluster)
