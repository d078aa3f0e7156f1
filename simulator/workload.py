"""Per-layer operators of one micro-batch on one device: FLOPs, bytes moved, activations saved.

Pure functions. Sizes are per device after tensor (tp), context (cp) and sequence
parallel sharding. Conventions:

- FLOPs are 2 per multiply-add. `fwd_flops`, `bwd_input_flops` and `bwd_weight_flops` are
  what the kernels *execute*: they are what the roofline times (compute.py) and what
  hardware FLOPs (HFU) count. `model_flops` is the useful work of the operator's forward and
  backward passes (MFU). They differ only for attention. Decoder attention is causal: half
  the s x s score matrix is masked. A flash kernel skips the masked blocks (its forward
  executes half the full count) and recomputes QK^T in its backward (5 GEMM-sized products
  where the math needs 4: Dao 2023, FlashAttention-2); the materialised path (cuBLAS
  batched GEMMs around a fused softmax, Megatron-LM) executes the full matrix. Model FLOPs
  count the unmasked half either way, so executed >= model FLOPs for every operator and
  MFU <= HFU <= 1 by construction. Megatron-LM's formula (Narayanan et al. 2021) counts
  the full s x s: it is the published-run comparison's business (published.py), not this
  model's convention.
- Bytes are the kernels' HBM traffic per pass (read inputs, write outputs). A linear's
  input-gradient kernel reads dY and W and writes dX, its weight-gradient kernel reads X and
  dY and writes dW: each moves what the forward moves. An elementwise op's backward reads
  the saved input and the incoming gradient and writes the gradient: twice its forward.
- `saved_bytes` are the activations kept for the backward pass. For a GPT layer with
  dropout and without flash attention they add up to Korthikanti et al. 2022, Sec. 4:
  sbh(34 + 5as/h) without parallelism, sbh(10 + 24/t + 5as/ht) with TP, and
  sbh(34 + 5as/h)/t with TP + sequence parallelism. Ops in the group
  "attention_core" (QK^T, softmax, dropout, AV; or the flash kernel) are what selective
  recomputation re-runs and whose saved tensors it drops (the 5as/h term); their
  inputs Q, K, V are saved by the QKV projection.

Numeric arguments may be numpy arrays (one entry per plan) for vectorised sweeps.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import lru_cache

import numpy as np

from .model import ModelSpec

MATMUL, ATTENTION, MEMORY = "matmul", "attention", "memory"
ATTENTION_CORE = "attention_core"


@dataclass(frozen=True)
class LinearShape:
    """A linear's GEMM: `tokens` rows of width d_in times `matrices` weights of d_in x d_out
    (`grouped`: one per local expert, each over its share of the rows, in one grouped GEMM);
    `widths`: the output widths of the projections a fused linear computes at once (Q, K and
    V; a gated MLP's gate and up), d_out in all; (d_out,) for a single projection. Widths per
    TP rank. `sp_input`: the input is the layer's norm output, all-gathered from its sequence
    shards under sequence parallelism; the linear then keeps only its shard for the weight
    gradient and gathers it again (Korthikanti et al. 2022, Sec. 4.2.2). `input_kept_elsewhere`:
    the input it keeps is the very tensor another operator of the layer keeps (autograd saves
    a tensor once, however many ops save it), so it is counted there, not here."""

    tokens: object
    d_in: object
    d_out: object
    matrices: object = 1
    widths: tuple = ()
    grouped: bool = False
    sp_input: bool = False
    input_kept_elsewhere: bool = False


@dataclass(frozen=True)
class Op:
    name: str
    kind: str  # matmul | attention | memory
    fwd_flops: object = 0.0  # executed
    bwd_input_flops: object = 0.0
    bwd_weight_flops: object = 0.0
    fwd_bytes: object = 0.0
    bwd_input_bytes: object = 0.0
    bwd_weight_bytes: object = 0.0
    saved_bytes: object = 0.0
    group: str | None = None
    model_flops: object = None  # useful forward + backward FLOPs; None: the executed ones
    # Equal kernels the FLOPs are split into, each paying the efficiency curve's start-up
    # (compute.py): the local experts of a grouped GEMM (moe.py); 1 for every other operator.
    kernels: object = 1
    # Host launches of each pass (a CPU's per-operator cost, compute.py; a GPU host's,
    # hostbound.py): an operator run once per local expert (Megatron-Core's SequentialMLP,
    # moe.py) launches that many times; 1 for every other operator.
    launches: object = 1
    # The separate GEMMs a fused projection runs as (projections.py), timed one by one; its
    # FLOPs and bytes are their sums. Empty: the operator is one kernel per pass.
    pieces: tuple = ()
    linear: LinearShape | None = None  # the GEMM's shape, for the linears only
    # A flash-attention kernel's calls (compute._attention_calls; None for every other
    # operator): the mean keys each query runs over (its pairs per query), the causal documents
    # ((tokens, count), ...) of a sequence (empty under sliding windows), whether each call
    # attends them whole (not a context-parallel rank's chunks; per plan of a batch), and the
    # calls a query's keys are spread over (a context-parallel ring's steps).
    keys_per_query: object = None
    causal_lengths: tuple = ()
    whole_calls: object = True
    ring_steps: object = 1

    @property
    def flops(self):
        """Executed FLOPs of the forward and backward passes."""
        return self.fwd_flops + self.bwd_input_flops + self.bwd_weight_flops

    @property
    def useful_flops(self):
        return self.flops if self.model_flops is None else self.model_flops


@dataclass(frozen=True)
class Shard:
    """How one micro-batch is split on a device."""

    micro_batch: object  # b
    seq_len: object  # s, the model's sequence length
    tp: object = 1  # t
    cp: object = 1
    sp: bool = False  # sequence parallelism (only meaningful with tp > 1)
    flash_attention: bool = True
    act_bytes: int = 2  # bytes per activation element (16-bit training)
    loss: str = "unfused"  # lm_head + cross-entropy: plan.loss (loss.py)
    loss_chunk_tokens: object = None  # chunked loss: tokens per chunk (None: Liger's rule)
    # DTensor TP (plan.tp_impl): a column-parallel linear keeps the all-gathered input it was
    # given (F.linear's autograd saves its input; pytorch/pytorch torch/distributed/tensor/
    # parallel/style.py ColwiseParallel, torchtitan's PrepareModuleInput to Replicate) instead
    # of its sequence shard, and needs no all-gather of it in the backward pass
    tp_keeps_gathered: bool = False
    # the mean attention band of the layers of the stage being laid out where it is not the
    # model's (window_pair_fraction of a rank holding more or fewer sliding layers)
    window_fraction: object = None

    @property
    def tokens(self):
        """Tokens of one micro-batch on one device: b·s/cp (CP splits the sequence)."""
        return self.micro_batch * self.seq_len / self.cp

    @property
    def replicated_tokens(self):
        """Tokens an op outside the TP-split matrices (norms, dropouts, residuals) runs on:
        all of them on every TP rank, or 1/t with sequence parallelism (Korthikanti et al.
        2022, Sec. 4.2.2)."""
        return self.tokens / self.tp if self.sp else self.tokens

    @property
    def kept_input_tokens(self):
        """Tokens of the input a column-parallel linear reading the sequence-parallel
        all-gather keeps for its weight gradient: its shard (Megatron-LM), or all of them
        (DTensor: tp_keeps_gathered)."""
        return self.tokens if self.tp_keeps_gathered else self.replicated_tokens


def gemm_traffic(tokens, d_in, d_out, operand_bytes, out_bytes, matrices=1) -> tuple:
    """HBM bytes of a linear's forward, input-gradient and weight-gradient GEMMs: each reads
    its two operands (x and W; dY and W; dY and x) at `operand_bytes` per element and writes
    its result (y; dX; dW) at `out_bytes`; `matrices` weights (a grouped GEMM's experts)."""
    x, w, y = tokens * d_in, matrices * d_in * d_out, tokens * d_out
    return operand_bytes * (x + w) + out_bytes * y, operand_bytes * (y + w) + out_bytes * x, \
        operand_bytes * (y + x) + out_bytes * w


def _linear(name, tokens, d_in, d_out, act_bytes, saved_in, widths=None, matrices=None, sp_input=False):
    """A dense layer y = x W on `tokens` rows: forward 2·T·d_in·d_out FLOPs, and as much again
    for each of the input- and weight-gradient GEMMs; weights are read in the compute
    precision (16-bit under mixed precision, 4 B in fp32). `widths`: the projections it
    fuses; `matrices`: a grouped GEMM's weights, one kernel each (LinearShape)."""
    grouped, matrices = matrices is not None, 1 if matrices is None else matrices
    flops = 2 * tokens * d_in * d_out
    fwd, bwd_input, bwd_weight = gemm_traffic(tokens, d_in, d_out, act_bytes, act_bytes, matrices)
    return Op(name, MATMUL, fwd_flops=flops, bwd_input_flops=flops, bwd_weight_flops=flops,
              fwd_bytes=fwd, bwd_input_bytes=bwd_input, bwd_weight_bytes=bwd_weight, saved_bytes=saved_in,
              kernels=matrices, linear=LinearShape(tokens, d_in, d_out, matrices, widths or (d_out,), grouped, sp_input))


def _elementwise(name, elements, bytes_per_element, saved, group=None):
    traffic = elements * bytes_per_element
    return Op(name, MEMORY, fwd_bytes=traffic, bwd_input_bytes=2 * traffic, saved_bytes=saved, group=group)


def norm_op(name, model: ModelSpec, shard: Shard, elements=None) -> Op:
    """A LayerNorm or RMSNorm over the hidden states of the tokens a TP rank holds (all of
    them, or 1/t with sequence parallelism), or over `elements`: 4 (LayerNorm) or 3 (RMSNorm)
    activation-sized bytes moved per element, its input kept for the backward pass."""
    a = shard.act_bytes
    elements = shard.replicated_tokens * model.hidden if elements is None else elements
    per_element = 4 * a if model.norm == "layernorm" else 3 * a
    return _elementwise(name, elements, per_element, a * elements)


def local_heads(model: ModelSpec, tp) -> tuple:
    """Query heads and KV heads per TP rank; KV heads are replicated when tp > kv_heads."""
    return model.heads / tp, np.maximum(model.kv_heads / tp, 1.0)


def layer_ops(model: ModelSpec, shard: Shard, experts=None) -> list[Op]:
    """The operators of one transformer layer for one micro-batch on one device: its
    attention block (multi-head latent attention in mla.py), and a dense MLP of width
    ffn_hidden, or with `experts` (a moe.ExpertShard) the routed experts of an MoE layer
    (moe.py)."""
    if model.parallel_block:
        return _parallel_layer_ops(model, shard)
    a, h = shard.act_bytes, model.hidden
    rep = shard.replicated_tokens
    drop = 1 if model.dropout else 0

    ops = [norm_op("attn_norm", model, shard)] if model.pre_norms else []
    if model.attention == "mla":
        from .mla import mla_attention_ops
        ops += mla_attention_ops(model, shard)
    else:
        ops += _attention_ops(model, shard)
    if model.post_norms:  # Gemma, OLMo 2: the attention's output normed before the residual add
        ops.append(norm_op("attn_post_norm", model, shard))
    ops.append(_elementwise("attn_residual", rep * h, 3 * a + drop, drop * rep * h))
    if model.pre_norms:
        ops.append(norm_op("mlp_norm", model, shard))
    if experts is None:
        ops += mlp_ops(model, shard, model.ffn_hidden)
    elif experts.options.framework == "torchtitan":
        from .titanmoe import mlp_ops as titan_mlp_ops
        ops += titan_mlp_ops(model, shard, experts, experts.compiled)
    else:
        from .moe import moe_mlp_ops
        ops += moe_mlp_ops(model, shard, experts)
    if model.post_norms:
        ops.append(norm_op("mlp_post_norm", model, shard))
    ops.append(_elementwise("mlp_residual", rep * h, 3 * a + drop, drop * rep * h))
    return ops


def input_kept_elsewhere(op: Op, shard: Shard) -> Op:
    """A linear whose input is the very tensor another operator of the layer keeps: autograd
    keeps it once, so it keeps nothing of its own (LinearShape.input_kept_elsewhere), but where
    a DTensor linear keeps its own gathered copy of a sequence-parallel input."""
    if shard.tp_keeps_gathered and shard.sp:
        return op
    return replace(op, saved_bytes=0.0 * op.saved_bytes, linear=replace(op.linear, input_kept_elsewhere=True))


def _parallel_layer_ops(model: ModelSpec, shard: Shard) -> list[Op]:
    """A parallel block: the attention and the MLP read the layer input, each through its own
    norm or one shared norm, and their outputs are summed, then added to the input
    (EleutherAI/gpt-neox@ea7aefd8 megatron/model/transformer.py ParallelTransformerLayer,
    gpt_j_residual: the MLP's bias-dropout-add takes the attention output as its residual,
    then `residual + self.reduce(output)`; transformers GPTNeoXLayer: mlp_output +
    attn_output + residual, two adds). The second norm reads the very input the first keeps,
    and with a shared norm the MLP reads the very output the QKV projection keeps: autograd
    keeps each tensor once (a DTensor linear keeping its gathered input keeps its own)."""
    a, h = shard.act_bytes, model.hidden
    rep = shard.replicated_tokens
    drop = 1 if model.dropout else 0
    ops = [norm_op("attn_norm", model, shard), *_attention_ops(model, shard)]
    if not model.shared_norm:
        second = norm_op("mlp_norm", model, shard)
        ops.append(replace(second, saved_bytes=0.0 * second.saved_bytes))
    mlp = mlp_ops(model, shard, model.ffn_hidden)
    if model.shared_norm:
        mlp[0] = input_kept_elsewhere(mlp[0], shard)
    # dropout on both branch outputs, then the sum the TP reduce takes, then the residual add
    return ops + mlp + [_elementwise("branch_sum", rep * h, 3 * a + 2 * drop, 2 * drop * rep * h),
                        _elementwise("mlp_residual", rep * h, 3 * a, 0.0)]


def _attention_ops(model: ModelSpec, shard: Shard) -> list[Op]:
    """Multi-head / grouped-query attention: QKV projection, RoPE, the attention core, the
    output projection."""
    a, t = shard.act_bytes, shard.tp
    h, d = model.hidden, model.head_dim
    q_heads, kv_heads = local_heads(model, t)
    tokens = shard.tokens
    q_w, kv_w = q_heads * d, kv_heads * d
    ops = []
    qkv = _linear("qkv", tokens, h, q_w + 2 * kv_w, a, a * shard.kept_input_tokens * h, widths=(q_w, kv_w, kv_w),
                  sp_input=True)
    # Q, K and V are the attention core's inputs: saved under every recompute mode but full.
    ops.append(Op(**{**qkv.__dict__, "saved_bytes": qkv.saved_bytes + a * tokens * (q_w + 2 * kv_w)}))
    # NoPE layers (model.nope_layer_interval) neither rotate nor, under an L2 qk norm, norm: a
    # layer is charged the model's share of each kernel, exact over stages of whole periods
    if model.qk_norm:  # over each head or the whole projection: the same elements; it keeps its input too
        ops.append(norm_op("qk_norm", model, shard, tokens * (q_w + kv_w) * model.qk_norm_layer_share))
    if model.position_embedding == "rope":
        # a partial RoPE (model.rotary_fraction) moves the same bytes: the fused kernel copies the
        # unrotated rest of each head with the rotated part (TransformerEngine@d0067d0da
        # transformer_engine/common/fused_rope/fused_rope.cu, fused_rope_block_forward "copy the
        # rest"); torch.compile fuses the slices and the concatenation alike
        ops.append(_elementwise("rope", tokens * (q_w + kv_w) * model.rope_layer_share, 2 * a, 0.0))
    ops += attention_core_ops(model, shard, q_heads, kv_heads, d, d)
    # The projection's input is the attention output (flash attention's O).
    ops.append(_linear("attn_out", tokens, q_w, h, a, a * tokens * q_w))
    return ops


def causal_pairs(n, window: int) -> float:
    """(query, key) pairs of causal attention over `n` tokens, counted as the half n²/2; with a
    window W < n (0: none), the band's n·W - W²/2."""
    if not window or window >= n:
        return 0.5 * n * n
    return n * window - 0.5 * window * window


def chunked_pairs(n, chunk: int) -> float:
    """(query, key) pairs of attention over `n` tokens cut into chunks of `chunk`, each causal
    inside itself (counted as causal_pairs counts: c²/2 a whole chunk)."""
    whole, rest = divmod(n, chunk)
    return whole * 0.5 * chunk * chunk + 0.5 * rest * rest


def window_pair_fraction(model: ModelSpec, layers=None, sliding=None) -> float:
    """The (query, key) pairs a layer attends to, as a fraction of the causal half s²/2, mean
    over `layers` layers of which `sliding` have a window (default: the model's layers): 1 for
    full causal attention; for a layer with a sliding window W < s (Mistral 7B, arXiv
    2310.06825 Sec. 2: query i attends to keys i-W+1..i), the band's s·W - W²/2; the sliding
    layers are model.is_sliding_window_layer's. A chunked window C (Llama 4's chunked
    attention: transformers' chunked_attention mask keeps the keys of the query's own chunk of C
    positions; Megatron-Bridge cuts the sequence into chunks of C and attends each causally):
    the s // C whole chunks' C²/2 and the rest's.

    Packed documents (model.document_tokens = d < s): attention stays inside each document, the
    sequence's s // d documents and the remainder each causal (with the window inside each) as
    Megatron-Core's packed `thd` format runs it (megatron/core/packed_seq_params.py
    @d98e8a64dd: cu_seqlens to TransformerEngine's attention), torchtitan's block_causal mask,
    and Llama 3's pre-training ("an attention mask that prevents self-attention between
    different documents within the same sequence", arXiv 2407.21783 Sec. 3.2). Documents of
    mixed lengths attend the pairs of equal ones of E[d²]/E[d] tokens (sum d²/2 = s·E[d²]/E[d]/2).

    A stage's layers are timed as its count of this mean layer: the model's mean where every
    stage holds whole periods of the sliding pattern, else its own (stagesplit.py counts each
    rank's sliding layers)."""
    s, w = model.seq_len, model.sliding_window

    def pairs(window):
        return sum(count * causal_pairs(tokens, window) for tokens, count in documents(model))

    full = pairs(0) / (0.5 * s * s)
    if not model.has_sliding_window:
        return full
    band = (chunked_pairs(s, w) if model.window_kind == "chunked" else pairs(w)) / (0.5 * s * s)
    if layers is None:
        layers, sliding = model.layers, model.sliding_layers
    return (sliding * band + (layers - sliding) * full) / layers


def documents(model: ModelSpec) -> tuple:
    """((tokens, count), ...) of the causal documents of one sequence: the whole sequence, or
    its s // d packed documents and the remainder (window_pair_fraction)."""
    s, d = model.seq_len, model.document_tokens
    if not model.packs_documents:
        return ((s, 1),)
    return ((d, s // d),) + (((s % d, 1),) if s % d else ())


def attention_mask(model: ModelSpec) -> str:
    """Which pairs the model's attention leaves out, in a word: causal, sliding-window,
    documents (packed, attention inside each) or both."""
    window = "chunked" if model.window_kind == "chunked" else "sliding-window"
    kinds = [name for name, on in ((window, model.has_sliding_window),
                                   ("documents", model.packs_documents)) if on]
    return "+".join(kinds) or "causal"


def attention_core_ops(model: ModelSpec, shard: Shard, q_heads, kv_heads, qk_dim, v_dim) -> list[Op]:
    """softmax(Q K^T) V of `q_heads` query heads over `kv_heads` key/value heads per device,
    queries and keys `qk_dim` wide, values `v_dim` (both head_dim for MHA/GQA; MLA's
    nope + rope and v_head_dim). Sliding windows (window_pair_fraction) shrink the useful
    pairs and a flash kernel's work (FlashAttention-2's `window_size` skips the blocks
    outside the band); the materialised path still computes and masks the full matrix."""
    b, a = shard.micro_batch, shard.act_bytes
    s = model.seq_len / shard.cp  # local queries (and local keys/values) per CP rank
    s_kv = model.seq_len  # keys each query attends to, gathered around the CP ring
    tokens = shard.tokens
    q_w, k_w, v_w, o_w = q_heads * qk_dim, kv_heads * qk_dim, kv_heads * v_dim, q_heads * v_dim
    drop = 1 if model.dropout else 0
    scores = b * q_heads * s * s_kv  # attention score elements per device (full s x s)
    qk = 2 * tokens * s_kv * q_w  # QK^T over the full s x s
    av = 2 * tokens * s_kv * o_w  # AV
    # useful work: QK^T and AV forward, their gradients (two products each), over the causal half
    # (or the sliding windows' bands)
    band = window_pair_fraction(model) if shard.window_fraction is None else shard.window_fraction
    useful = band * 0.5 * 3 * (qk + av)
    if shard.flash_attention:
        io = a * tokens * (q_w + k_w + v_w + o_w)
        # causal: masked blocks skipped; the backward recomputes QK^T (5 products where 4 are needed)
        half = 0.5 * band
        return [Op("flash_attention", ATTENTION, fwd_flops=half * (qk + av), bwd_input_flops=half * (3 * qk + 2 * av),
                   fwd_bytes=io, bwd_input_bytes=2 * io, saved_bytes=4 * b * q_heads * s,  # fp32 log-sum-exp
                   group=ATTENTION_CORE, model_flops=useful, keys_per_query=band * 0.5 * s_kv,
                   causal_lengths=_causal_calls(model, band))]
    # cuBLAS batched GEMMs around a fused scale-mask-softmax and dropout (Megatron-LM): the
    # full score matrix is computed and masked.
    qk_io = a * (tokens * (q_w + k_w) + scores)
    ops = [Op("qk_scores", MATMUL, fwd_flops=qk, bwd_input_flops=2 * qk, fwd_bytes=qk_io,
              bwd_input_bytes=2 * qk_io, group=ATTENTION_CORE, model_flops=band * 0.5 * 3 * qk),
           _elementwise("softmax", scores, 2 * a, a * scores, ATTENTION_CORE)]
    if drop:
        ops.append(_elementwise("attn_dropout", scores, 2 * a + 1, (a + 1) * scores, ATTENTION_CORE))
    av_io = a * (scores + tokens * (v_w + o_w))
    ops.append(Op("attn_values", MATMUL, fwd_flops=av, bwd_input_flops=2 * av, fwd_bytes=av_io,
                  bwd_input_bytes=2 * av_io, group=ATTENTION_CORE, model_flops=band * 0.5 * 3 * av))
    return ops


def _causal_calls(model: ModelSpec, band) -> tuple:
    """((tokens, count), ...) of the causal attention calls of a layer of mean `band`
    (Op.causal_lengths): the sequence's documents; under chunked windows each chunked layer's
    chunks (Megatron-Bridge attends them as a batch of causal sequences) weighted by the
    chunked layers' share of the band, the rest whole sequences; none under sliding windows."""
    if not model.has_sliding_window:
        return documents(model)
    if model.window_kind != "chunked":
        return ()
    s, c = model.seq_len, model.sliding_window
    chunked = np.clip((1.0 - band) / (1.0 - window_pair_fraction(model, 1, 1)), 0.0, 1.0)
    rest = ((s % c, chunked),) if s % c else ()
    return ((c, chunked * (s // c)),) + rest + ((s, 1.0 - chunked),)


def mlp_ops(model: ModelSpec, shard: Shard, width, prefix: str = "") -> list[Op]:
    """A TP-split MLP of intermediate size `width`: up (gate and up for the gated SwiGLU and
    GeGLU), the activation, down. `prefix` names another MLP of the layer (shared experts)."""
    a, t = shard.act_bytes, shard.tp
    h = model.hidden
    tokens = shard.tokens
    f = width
    if model.activation in ("swiglu", "geglu"):
        return [_linear(prefix + "mlp_gate_up", tokens, h, 2 * f / t, a, a * shard.kept_input_tokens * h,
                        widths=(f / t, f / t), sp_input=True),
                _elementwise(prefix + model.activation, tokens * f / t, 3 * a, 2 * a * tokens * f / t),
                _linear(prefix + "mlp_down", tokens, f / t, h, a, a * tokens * f / t)]
    return [_linear(prefix + "mlp_up", tokens, h, f / t, a, a * shard.kept_input_tokens * h, sp_input=True),
            _elementwise(prefix + "gelu", tokens * f / t, 2 * a, a * tokens * f / t),
            _linear(prefix + "mlp_down", tokens, f / t, h, a, a * tokens * f / t)]


def embedding_ops(model: ModelSpec, shard: Shard) -> list[Op]:
    """Input side of the first virtual stage: token (and learned position) embedding, dropout."""
    a, rep = shard.act_bytes, shard.replicated_tokens
    drop = 1 if model.dropout else 0
    pos = 1 if model.position_embedding == "learned" else 0
    return [_elementwise("embedding", rep * model.hidden, (2 + pos) * a + drop, drop * rep * model.hidden)]


def head_ops(model: ModelSpec, shard: Shard) -> list[Op]:
    """Output side of the last virtual stage: final norm, lm_head (vocab-parallel), cross-entropy.

    The cross-entropy keeps fp32 logits for the backward pass: 4·s·b·V/t bytes
    (Korthikanti et al. 2022, Sec. 4.3).
    """
    a, tokens = shard.act_bytes, shard.tokens
    h, v = model.hidden, model.vocab / shard.tp
    logits = tokens * v
    norm = norm_op("final_norm", model, shard)
    if shard.loss in ("fused", "chunked"):  # the lm_head is part of the loss kernel
        from .loss import loss_ops  # loss.py builds on this module's Op

        return [norm, *loss_ops(model, shard)]
    if shard.loss in ("loss-parallel", "vocab-parallel"):
        from .loss import cross_entropy_op

        cross_entropy = cross_entropy_op(shard.loss, logits, a)
    else:
        # fp32 upcast, max, exp-sum and loss: read 16-bit logits, write and re-read fp32 softmax
        cross_entropy = _elementwise("cross_entropy", logits, a + 4 + 4, 4 * logits)
    return [norm, _linear("lm_head", tokens, h, v, a, a * shard.kept_input_tokens * h, sp_input=True), cross_entropy]


def loss_backward_transient_bytes(model: ModelSpec, shard: Shard):
    """Bytes the loss's backward pass holds on top of the saved tensors, at its start.

    Cross-entropy's backward materialises the fp32 gradient of the log-probabilities and
    then of the logits (4 B each per logit, vocab split over TP) while the saved softmax is
    still live (PyTorch: nll_loss_backward, then _log_softmax_backward_data); both are
    freed once the lm_head's backward has consumed them. Found comparing torch runs on CPU
    with predictions (docs/calibration.md): two logits-sized fp32 buffers, as derived.
    The fused and chunked losses hold what loss.loss_transient_bytes says instead.
    """
    if shard.loss != "unfused":
        from .loss import loss_transient_bytes

        return loss_transient_bytes(model, shard)
    return 2 * 4 * shard.tokens * model.vocab / shard.tp


def _all_experts(moe_options):
    """An MoE layer's experts on one device holding every expert (moe.ExpertShard)."""
    from .moe import ExpertShard, MoEOptions
    return ExpertShard(options=moe_options or MoEOptions())


@lru_cache(maxsize=256)
def model_flops_per_sequence(model: ModelSpec, moe_options=None) -> float:
    """Useful training FLOPs (forward + backward, no recomputation, causal attention; an MoE
    layer's top-k routed experts, shared experts and router) of one sequence: what MFU
    counts. `moe_options` (plan.moe): a capacity factor below 1 drops routed tokens."""
    shard = Shard(micro_batch=1, seq_len=model.seq_len)
    layer = sum(op.useful_flops for op in layer_ops(model, shard))
    head = sum(op.useful_flops for op in head_ops(model, shard))
    moe = sum(op.useful_flops for op in layer_ops(model, shard, _all_experts(moe_options))) if model.moe_layers else 0.0
    total = (model.layers - model.moe_layers) * layer + head + model.moe_layers * moe
    return float(total + _mtp_flops(model, shard, layer, moe, lambda op: op.useful_flops))


def _mtp_flops(model: ModelSpec, shard: Shard, dense_layer_flops, moe_layer_flops, flops_of) -> float:
    """The multi-token-prediction depths (mtp.py): a layer of the last layer's kind and the
    operators around it each."""
    if not model.mtp_layers:
        return 0.0
    from .mtp import depth_ops, layer_is_moe

    layer = moe_layer_flops if layer_is_moe(model) else dense_layer_flops
    return model.mtp_layers * (layer + sum(flops_of(op) for op in depth_ops(model, shard)))


@lru_cache(maxsize=256)
def executed_flops_per_sequence(model: ModelSpec, flash_attention: bool, recompute: str, moe_options=None,
                                loss: str = "unfused", recompute_modules: tuple = ("core_attn",),
                                early_stop: bool = False) -> float:
    """FLOPs the kernels execute for one sequence's forward and backward passes, with the
    forward passes that full or selective recomputation repeats (recompute.py): what HFU
    counts; selective recomputation of core attention re-runs a flash kernel too (Megatron-LM
    checkpoints the core attention whatever its kernel); the fused loss recomputes the logits
    (loss.py). MoE layers execute the mean routed rows (balanced
    routing; padded to capacity if so); the quantized experts' row padding depends on the
    plan's expert layout and is added per step (layermix.padding_flops_per_micro_batch)."""
    from .recompute import layer_checkpoint, rerun_flops
    shard = Shard(micro_batch=1, seq_len=model.seq_len, flash_attention=flash_attention, loss=loss)

    def executed(ops, experts=None):
        layer = sum(op.flops for op in ops)
        if recompute != "none":
            layer += rerun_flops(layer_checkpoint(model, shard, recompute, ops, recompute_modules, experts,
                                                  early_stop))
        return layer

    dense = executed(layer_ops(model, shard))
    total = (model.layers - model.moe_layers) * dense + sum(op.flops for op in head_ops(model, shard))
    moe = 0.0
    if model.moe_layers:
        experts = _all_experts(moe_options.balanced() if moe_options is not None else None)
        moe = executed(layer_ops(model, shard, experts), experts)
        total += model.moe_layers * moe
    return float(total + _mtp_flops(model, shard, dense, moe, lambda op: op.flops))
