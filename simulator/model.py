"""Transformer model spec: presets (models/*.yaml), explicit fields, or a Hugging Face config.json.

A spec describes a decoder-only transformer: dense (GPT, Llama), Mixture-of-Experts (Mixtral,
DeepSeek, Qwen-MoE, GPT-OSS, Grok) and multi-head latent attention (DeepSeek-V2/V3). The
parameter counts here are pure functions of the spec; the cost model builds on them.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property, lru_cache
from pathlib import Path
from typing import Mapping

from . import fields as F
from .errors import InputError
from .hf_config import hf_fields
from .resources import data_dir
from .yamlio import load_yaml

ACTIVATIONS = ("gelu", "swiglu", "geglu")
NORMS = ("layernorm", "rmsnorm")
QK_NORM_SCOPES = ("head", "full")
QK_NORM_KINDS = ("norm", "l2")
WINDOW_KINDS = ("sliding", "chunked")
POSITIONS = ("learned", "rope")
ATTENTIONS = ("mha", "gqa", "mla")
MLA_FIELDS = ("q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")
MOE_FIELDS = ("top_k", "expert_ffn_hidden", "shared_experts", "shared_expert_ffn_hidden", "dense_layers",
              "moe_layer_freq", "moe_layer_offset", "router_groups", "router_group_topk")


def presets_dir() -> Path:
    return data_dir() / "models"


@dataclass(frozen=True)
class ModelSpec:
    """A decoder-only transformer: dense (GPT / Llama family) or Mixture-of-Experts.

    Layer `i` (from 0) has a routed-expert MLP when `is_moe_layer(i)`, else a dense MLP of
    width `ffn_hidden`. Defaults describe a dense model exactly as before the MoE fields
    existed; `__post_init__` fills the derived defaults (head_dim, attention, widths).
    """

    name: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    ffn_hidden: int  # width of a dense MLP (every layer of a dense model)
    vocab: int
    seq_len: int
    activation: str = "gelu"
    norm: str = "layernorm"
    position_embedding: str = "learned"
    bias: bool = True  # biases on every linear layer (MoE router and experts too) and on LayerNorms
    # biases on the query, key and value projections only, the model having no others (Qwen2,
    # GLM-4.5; Megatron --add-qkv-bias with --disable-bias-linear)
    qkv_bias: bool = False
    tied_embeddings: bool = True
    dropout: bool = False
    description: str = ""
    head_dim: int | None = None  # width of one query/key head; default hidden // heads (mla: nope + rope)
    # Norms on the queries and keys after their projections (Qwen3, Gemma 3, OLMo 2;
    # Megatron-Core qk_layernorm), of the model's norm type: over each head (scope head:
    # head_dim weights each) or over the whole projection (scope full, OLMo 2's q_norm over
    # heads x head_dim and k_norm over kv_heads x head_dim)
    qk_norm: bool = False
    qk_norm_scope: str = "head"
    # norm: the model's norm, with its learned scale; l2: Llama 4's L2Norm, x·rsqrt(mean(x²) + eps)
    # over each head with no weights, on the layers that rotate only (transformers
    # Llama4TextAttention: use_qk_norm and use_rope; Megatron-Bridge llama4_utils.py
    # get_llama4_layer_spec: qk_l2_norm and not is_nope_layer)
    qk_norm_kind: str = "norm"
    # No rotary embedding on each n-th layer, (i + 1) % n == 0: Llama 4's NoPE layers
    # (transformers Llama4TextConfig no_rope_layer_interval 4; Megatron-Core no_rope_freq); 0 = none
    nope_layer_interval: int = 0
    # Norms on the inputs of attention and of the MLP (the pre-norm layer); false: OLMo 2,
    # whose layer norms only the outputs (post_norms)
    pre_norms: bool = True
    # Norms on the outputs of attention and of the MLP, before each residual add (Gemma 2 and
    # 3, OLMo 2: post_attention_layernorm, post_feedforward_layernorm)
    post_norms: bool = False
    # Attention and MLP side by side: both read the layer input and their outputs are added
    # to it at once (GPT-J, GPT-NeoX, Falcon, PaLM: x + attn(ln1(x)) + mlp(ln2(x))); with
    # shared_norm one input norm feeds both (GPT-J, Falcon 7B: x + attn(ln(x)) + mlp(ln(x)))
    parallel_block: bool = False
    shared_norm: bool = False
    # The share of each query and key head RoPE rotates (partial RoPE: GLM-4.5 0.5, Phi-4-mini
    # 0.75; Megatron --rotary-percent); the rest passes through unrotated
    rotary_fraction: float = 1.0
    attention: str | None = None  # mha | gqa | mla; mha and gqa follow from kv_heads (== heads: mha)
    # Multi-head latent attention (DeepSeek-V2, arXiv 2405.04434, Sec. 2.1); 0 unless mla.
    q_lora_rank: int = 0  # 0 with mla: full-rank query projection (DeepSeek-V2-Lite)
    kv_lora_rank: int = 0
    qk_nope_head_dim: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int | None = None  # default head_dim (mha, gqa)
    # Mixture of Experts; experts == 0 is a dense model.
    experts: int = 0  # routed experts per MoE layer
    top_k: int = 0  # routed experts per token
    expert_ffn_hidden: int | None = None  # width of one routed expert; default ffn_hidden
    shared_experts: int = 0  # experts every token goes through (DeepSeekMoE, Qwen2-MoE)
    shared_expert_ffn_hidden: int | None = None  # default expert_ffn_hidden
    dense_layers: int = 0  # leading layers with a dense MLP (DeepSeek first_k_dense_replace)
    moe_layer_freq: int = 1  # past dense_layers, layer i is MoE when i % moe_layer_freq == moe_layer_offset
    # 0: the first layer of each period (DeepSeek's rule); moe_layer_freq - 1: the last (Llama 4's
    # interleave_moe_layer_step, Qwen2-MoE's decoder_sparse_step: (i + 1) % step == 0)
    moe_layer_offset: int = 0
    mtp_layers: int = 0  # multi-token-prediction modules (DeepSeek-V3 num_nextn_predict_layers)
    # Group-limited routing (DeepSeek-V3's node-limited routing; Megatron-Core --moe-router-num-groups
    # and --moe-router-group-topk, Hugging Face n_group and topk_group): the experts form
    # router_groups groups of consecutive experts and a token's top_k come from router_group_topk
    # of them; 0: no groups. It changes what a step costs only where the dispatch sends a token
    # once per destination (deepep.py: the deepep and hybridep dispatchers).
    router_groups: int = 0
    router_group_topk: int = 0
    # Sliding-window attention: layer i attends to the last `sliding_window` tokens when
    # i % sliding_window_freq == 0 (Mistral: every layer; GPT-OSS: every other); 0 = none. Or,
    # with sliding_window_skip_freq N >= 2, on every layer but each N-th (1-indexed), which
    # attends fully (Megatron-Core's window_attn_skip_freq; Gemma 3 and 4: 5 windowed, 1 full).
    sliding_window: int = 0
    sliding_window_freq: int = 1
    sliding_window_skip_freq: int = 0
    # sliding: a windowed layer's query attends to the last sliding_window keys; chunked: to the
    # keys of its own chunk of sliding_window tokens (Llama 4's attention_chunk_size: transformers
    # layer_types "chunked_attention"; Megatron-Bridge llama4_utils.py chunkify)
    window_kind: str = "sliding"
    # Packed documents: each sequence holds documents of `document_tokens` tokens (the last cut
    # at seq_len) and attention stays inside each one (workload.window_pair_fraction); 0 = one
    # causal sequence.
    document_tokens: int = 0

    def __post_init__(self):
        fill = lambda key, value: object.__setattr__(self, key, value)  # noqa: E731 (frozen dataclass)
        if self.attention == "mla":
            fill("head_dim", self.qk_nope_head_dim + self.qk_rope_head_dim)
        else:
            if self.head_dim is None:
                fill("head_dim", self.hidden // self.heads)
            fill("attention", "mha" if self.kv_heads == self.heads else "gqa")
        if self.v_head_dim is None:
            fill("v_head_dim", self.head_dim)
        if self.expert_ffn_hidden is None:
            fill("expert_ffn_hidden", self.ffn_hidden if self.experts else 0)
        if self.shared_expert_ffn_hidden is None:
            fill("shared_expert_ffn_hidden", self.expert_ffn_hidden if self.shared_experts else 0)

    # ------------------------------------------------------------ widths

    @property
    def q_width(self) -> int:
        """Width of the queries (output of the Q projection): heads x head_dim."""
        return self.heads * self.head_dim

    @property
    def kv_hidden(self) -> int:
        """Width of K: kv_heads x head_dim (with MLA, the decompressed keys: heads x (nope + rope))."""
        return self.kv_heads * self.head_dim

    @property
    def v_width(self) -> int:
        """Width of V: kv_heads x v_head_dim."""
        return self.kv_heads * self.v_head_dim

    @property
    def attn_out_width(self) -> int:
        """Width of the attention output the O projection reads: heads x v_head_dim."""
        return self.heads * self.v_head_dim

    @property
    def mlp_matrices(self) -> int:
        """Weight matrices of size hidden x width in an MLP: 2 for GELU, 3 for the gated SwiGLU/GeGLU."""
        return 2 if self.activation == "gelu" else 3

    def is_moe_layer(self, index: int) -> bool:
        """Whether layer `index` (from 0) routes tokens to experts: DeepSeek's rule, as in
        vllm-project/vllm vllm/model_executor/models/deepseek_v2.py (commit 002d6073),
        DeepseekV2DecoderLayer: layer_idx >= first_k_dense_replace and
        layer_idx % moe_layer_freq == 0; with moe_layer_offset f - 1 the last layer of each
        period instead, as transformers' Llama4TextConfig moe_layers (range(step - 1, layers,
        step)) and Qwen2MoeDecoderLayer ((layer_idx + 1) % decoder_sparse_step == 0) place them."""
        return self.experts > 0 and index >= self.dense_layers and \
            index % self.moe_layer_freq == self.moe_layer_offset

    def _moe_positions_below(self, n: int) -> int:
        """How many i in [0, n) have i % moe_layer_freq == moe_layer_offset."""
        return max(0, -(-(n - self.moe_layer_offset) // self.moe_layer_freq))

    @property
    def moe_layers(self) -> int:
        """Number of MoE layers among the `layers` (MTP modules not included): the layers of
        [dense_layers, layers) at moe_layer_offset in their period of moe_layer_freq."""
        if not self.experts:
            return 0
        return max(0, self._moe_positions_below(self.layers) - self._moe_positions_below(self.dense_layers))

    @property
    def leading_dense_moe_positions(self) -> int:
        """The MoE positions of the period rule that the leading dense layers take (each stage of
        whole periods holds layers / freq MoE layers, the first stage this many fewer)."""
        return self._moe_positions_below(self.dense_layers) if self.experts else 0

    @property
    def packs_documents(self) -> bool:
        """Whether each sequence packs documents shorter than it that attend inside themselves
        (a document_tokens of 0 or at least seq_len is one causal sequence)."""
        return 0 < self.document_tokens < self.seq_len

    @property
    def has_sliding_window(self) -> bool:
        """Whether some layers attend to a window narrower than the sequence (a window of 0 or
        at least seq_len is full causal attention)."""
        return 0 < self.sliding_window < self.seq_len

    def is_sliding_window_layer(self, index: int) -> bool:
        """Whether layer `index` attends only to the last `sliding_window` tokens, or with
        window_kind chunked to its chunk of them (Mistral 7B,
        arXiv 2310.06825 Sec. 2; GPT-OSS layer_types alternate sliding/full from layer 0;
        Megatron-Core's window_attn_skip_freq N leaves each N-th layer full,
        megatron/core/transformer/utils.py is_layer_window_attention @d98e8a64dd)."""
        if self.sliding_window_skip_freq:
            return self.sliding_window > 0 and (index + 1) % self.sliding_window_skip_freq != 0
        return self.sliding_window > 0 and index % self.sliding_window_freq == 0

    @property
    def sliding_window_period(self) -> int:
        """Layers after which the pattern of windowed and full layers repeats."""
        return self.sliding_window_skip_freq or self.sliding_window_freq

    @property
    def sliding_layers(self) -> int:
        """How many of the model's layers have a window (is_sliding_window_layer)."""
        if not self.sliding_window:
            return 0
        if self.sliding_window_skip_freq:
            return self.layers - self.layers // self.sliding_window_skip_freq
        return -(-self.layers // self.sliding_window_freq)  # layers 0, f, 2f, ...

    # ------------------------------------------------------------ parameter counts per part

    def _norm(self, width: int) -> int:
        """One normalisation layer: LayerNorm has a gain and (with biases) a shift, RMSNorm a gain."""
        return 2 * width if self.norm == "layernorm" and self.bias else width

    def attention_params(self) -> int:
        """Parameters of one attention block (projections and their biases; no pre-norm).

        MHA/GQA: W_Q (h x q), W_K, W_V (h x kv each), W_O (v x h); with biases q + 2 kv + h
        (Megatron-LM ColumnParallel QKV + RowParallel O; GQA per Ainslie et al. 2023).
        MLA (DeepSeek-V2 arXiv 2405.04434 Sec. 2.1.2-2.1.3; vllm deepseek_v2.py, commit
        002d6073, DeepseekV2MLAAttention): W_DQ (h x q_lora) + RMSNorm(q_lora) + W_UQ
        (q_lora x heads*(nope+rope)), or one W_Q (h x heads*(nope+rope)) when q_lora_rank is 0; W_DKV+W_KR fused
        (h x (kv_lora + rope)) + RMSNorm(kv_lora); W_UK+W_UV fused (kv_lora x heads*(nope+v));
        W_O (heads*v x h). MLA models carry no biases (refused at validation).
        """
        h = self.hidden
        if self.attention == "mla":
            qk = self.heads * self.head_dim
            q = h * qk if not self.q_lora_rank else h * self.q_lora_rank + self.q_lora_rank + self.q_lora_rank * qk
            kv = (h * (self.kv_lora_rank + self.qk_rope_head_dim) + self.kv_lora_rank
                  + self.kv_lora_rank * self.heads * (self.qk_nope_head_dim + self.v_head_dim))
            return q + kv + self.attn_out_width * h
        q, k, v = self.q_width, self.kv_hidden, self.v_width
        weights = h * (q + k + v) + self.attn_out_width * h
        return weights + (q + k + v + h if self.bias else q + k + v if self.qkv_bias else 0)

    def mlp_params(self, width: int) -> int:
        """One MLP of intermediate size `width`: up (and gate) h x width, down width x h, and
        biases (width per up/gate matrix, h for down) when the model has biases. A routed
        expert, a shared expert and a dense MLP are each one of these (Mixtral, arXiv 2401.04088
        Sec. 2.1; DeepSeekMoE arXiv 2401.06066 Sec. 3)."""
        m, h = self.mlp_matrices, self.hidden
        return m * h * width + ((m - 1) * width + h if self.bias else 0)

    def router_params(self) -> int:
        """The gate: h x experts (+ experts biases when the model has biases, GPT-OSS).
        DeepSeek-V3's auxiliary-loss-free balancing bias (e_score_correction_bias) is updated
        by a rule, not by gradients (arXiv 2412.19437 Sec. 2.1.2): not a trained parameter."""
        return self.hidden * self.experts + (self.experts if self.bias else 0)

    def moe_params(self) -> int:
        """MLP part of one MoE layer: router + every routed expert + shared experts."""
        return (self.router_params() + self.experts * self.mlp_params(self.expert_ffn_hidden)
                + self.shared_experts * self.mlp_params(self.shared_expert_ffn_hidden))

    def moe_active_params(self) -> int:
        """MLP parameters one token uses in an MoE layer: router, top_k routed experts, shared experts."""
        return (self.router_params() + self.top_k * self.mlp_params(self.expert_ffn_hidden)
                + self.shared_experts * self.mlp_params(self.shared_expert_ffn_hidden))

    @property
    def layer_norms(self) -> int:
        """Norm modules with weights in one layer: pre-norms, post-norms and the query and key
        norms (an L2 norm has none)."""
        return self.input_norms + 2 * (int(self.post_norms) + int(self.qk_norm and self.qk_norm_kind == "norm"))

    @property
    def rope_layer_share(self) -> float:
        """The share of the layers that rotate their queries and keys: 1 but for NoPE layers."""
        if self.position_embedding != "rope":
            return 0.0
        n = self.nope_layer_interval
        return 1.0 - (self.layers // n) / self.layers if n else 1.0

    @property
    def qk_norm_layer_share(self) -> float:
        """The share of the layers that norm their queries and keys (an L2 norm: the rotating ones)."""
        if not self.qk_norm:
            return 0.0
        return self.rope_layer_share if self.qk_norm_kind == "l2" else 1.0

    @property
    def input_norms(self) -> int:
        """Norms on a layer's input side: the attention's and the MLP's pre-norms, one where a
        parallel block's branches share it, none without pre-norms."""
        return 0 if not self.pre_norms else 1 if self.shared_norm else 2

    def layer_norm_params(self) -> int:
        """A layer's pre-norms (attention, MLP) and post-norms where the model has them, and
        its query and key norms: one head_dim-wide norm each, shared by the heads
        (transformers Qwen3Attention q_norm, k_norm; Megatron-Core's q_layernorm, k_layernorm
        over hidden_size_per_attention_head), or over the whole projections (transformers
        Olmo2Attention: RMSNorm(heads x head_dim), RMSNorm(kv_heads x head_dim))."""
        norms = (self.input_norms + 2 * int(self.post_norms)) * self._norm(self.hidden)
        if not self.qk_norm or self.qk_norm_kind == "l2":
            return norms
        if self.qk_norm_scope == "full":
            return norms + self._norm(self.q_width) + self._norm(self.kv_hidden)
        return norms + 2 * self._norm(self.head_dim)

    def dense_layer_params(self) -> int:
        """A layer with a dense MLP of width ffn_hidden: attention + MLP + its norms."""
        return self.attention_params() + self.mlp_params(self.ffn_hidden) + self.layer_norm_params()

    def moe_layer_params(self) -> int:
        """A layer with routed experts: attention + router + experts + shared experts + its norms."""
        return self.attention_params() + self.moe_params() + self.layer_norm_params()

    def layer_params(self, index: int = 0) -> int:
        """Parameters of layer `index` (from 0); every layer of a dense model is the same:
        12h^2 + 13h for GPT (Narayanan et al. 2021, Eq. 2)."""
        return self.moe_layer_params() if self.is_moe_layer(index) else self.dense_layer_params()

    def moe_layer_active_params(self) -> int:
        """Parameters of an MoE layer that one token uses (top_k of the routed experts)."""
        return self.attention_params() + self.moe_active_params() + self.layer_norm_params()

    def layer_active_params(self, index: int = 0) -> int:
        """Parameters of layer `index` that one token uses."""
        return self.moe_layer_active_params() if self.is_moe_layer(index) else self.dense_layer_params()

    def embedding_params(self) -> int:
        pos = self.seq_len * self.hidden if self.position_embedding == "learned" else 0
        return self.vocab * self.hidden + pos

    def final_norm_params(self) -> int:
        return self._norm(self.hidden)

    def lm_head_params(self) -> int:
        return 0 if self.tied_embeddings else self.vocab * self.hidden

    def mtp_module_params(self, active: bool = False) -> int:
        """One multi-token-prediction module (DeepSeek-V3 arXiv 2412.19437 Sec. 2.2;
        deepseek-ai/DeepSeek-V3 README_WEIGHTS.md, commit 9b4e9788): RMSNorms of the hidden
        state and of the next token's embedding, the projection M (2h x h), one transformer
        block (an MoE layer when the model has experts) and the norm before the shared output
        head. The embedding and the output head are the main model's (not counted again).
        With `active`, the block counts only the experts one token uses."""
        if not self.experts:
            block = self.dense_layer_params()
        else:
            block = self.moe_layer_active_params() if active else self.moe_layer_params()
        return block + 2 * self.hidden * self.hidden + 3 * self._norm(self.hidden)

    def _outside_layers(self) -> int:
        return self.embedding_params() + self.final_norm_params() + self.lm_head_params()

    def params(self, mtp: bool = True) -> int:
        """Total trainable parameters (a tied lm_head counted once); `mtp` adds the
        multi-token-prediction modules, which are trained with the model."""
        without_mtp, mtp_modules = self._param_totals
        return without_mtp + (mtp_modules if mtp else 0)

    @cached_property
    def _param_totals(self) -> tuple[int, int]:
        """(parameters without the MTP modules, the MTP modules'), counted once per spec: the
        spec is frozen, and sweeps ask for every plan (domain.py)."""
        moe = self.moe_layers
        total = (self.layers - moe) * self.dense_layer_params() + moe * self.moe_layer_params()
        return total + self._outside_layers(), self.mtp_layers * self.mtp_module_params()

    def active_params(self, mtp: bool = True) -> int:
        """Parameters one token uses: every parameter but the routed experts it is not sent to.

        Convention of Mistral AI's Mixtral announcement (46.7B / 12.9B) and DeepSeek-V3
        (README_WEIGHTS.md: 36.7B "including 0.9B for Embedding and 0.9B for the output
        Head"): the whole embedding table counts. OpenAI's gpt-oss model card counts the
        unembedding but not the embedding: subtract embedding_params() to compare. Equal to
        params() for a dense model."""
        moe = self.moe_layers
        total = (self.layers - moe) * self.dense_layer_params() + moe * self.moe_layer_active_params()
        extra = self.mtp_layers * self.mtp_module_params(active=True) if mtp else 0
        return total + self._outside_layers() + extra

    def shape_summary(self) -> str:
        """The MoE shape in one short text: '8x14336 top-2', '256x2048 top-8 +1 shared, 3 dense',
        '-' for a dense model."""
        if not self.experts:
            return "-"
        out = f"{self.experts}x{self.expert_ffn_hidden} top-{self.top_k}"
        if self.shared_experts:
            out += f" +{self.shared_experts} shared"
        if self.dense_layers:
            out += f", {self.dense_layers} dense"
        if self.moe_layer_freq > 1:
            out += f", every {self.moe_layer_freq}" + (f" from {self.moe_layer_offset}" if self.moe_layer_offset else "")
        return out


def window_pattern(windowed: list) -> dict | None:
    """The model fields that window exactly the layers i with windowed[i] (0/1, at least one
    1): {"sliding_window_freq": f} for the layers i % f == 0, else {"sliding_window_skip_freq":
    n} for all but each n-th, the smallest such f or n; None where neither fits."""
    n = len(windowed)
    pattern = [int(bool(w)) for w in windowed]
    freq = next((f for f in range(1, n + 1) if pattern == [int(i % f == 0) for i in range(n)]), None)
    if freq is not None:
        return {"sliding_window_freq": freq}
    skip = every_nth_layer([1 - w for w in pattern])
    return None if skip is None else {"sliding_window_skip_freq": skip}


def every_nth_layer(flags) -> int | None:
    """n >= 2 where the 0/1 `flags` of the layers are 1 exactly on each n-th layer, (i + 1) % n
    == 0 (Megatron-Core's window_attn_skip_freq and no_rope_freq, Llama 4's NoPE layers); None
    where no n fits."""
    n = len(flags)
    return next((k for k in range(2, n + 1) if list(flags) == [int((i + 1) % k == 0) for i in range(n)]), None)


MODEL_KEYS = ("preset", "hf_config", "name", "description", "layers", "hidden", "heads", "kv_heads", "head_dim",
              "qk_norm", "qk_norm_scope", "qk_norm_kind", "nope_layer_interval", "pre_norms", "post_norms",
              "parallel_block", "shared_norm", "rotary_fraction", "attention", *MLA_FIELDS, "ffn_hidden",
              "dense_ffn_hidden", "experts", *MOE_FIELDS, "mtp_layers", "sliding_window", "sliding_window_freq",
              "sliding_window_skip_freq", "window_kind", "document_tokens", "vocab", "seq_len", "activation", "norm",
              "position_embedding", "bias", "qkv_bias", "tied_embeddings", "dropout", "source")


def _dense_width(data: Mapping, field: str) -> int | None:
    """ffn_hidden, also spelled dense_ffn_hidden (the width of a dense-MLP layer of an MoE model)."""
    ffn = F.integer(data, "ffn_hidden", field, None, maximum=10**8)
    dense = F.integer(data, "dense_ffn_hidden", field, None, maximum=10**8)
    if ffn is not None and dense is not None and ffn != dense:
        raise InputError(f"{field}.dense_ffn_hidden", dense, f"is another name for ffn_hidden={ffn}: give one")
    return ffn if ffn is not None else dense


def _spec_from_fields(data: Mapping, field: str, base: ModelSpec | None = None) -> ModelSpec:
    """Build a spec from explicit fields; missing ones fall back to `base` (a preset or HF config)."""
    def default(key, fallback=F._MISSING, keep=True):
        return getattr(base, key) if base is not None and keep else fallback

    def count(key, fallback=0, keep=True, maximum=10**6):
        return F.integer(data, key, field, default(key, fallback, keep), minimum=0, maximum=maximum)

    hidden = F.integer(data, "hidden", field, default("hidden"), maximum=10**7)
    heads = F.integer(data, "heads", field, default("heads"), maximum=10**5)
    activation = F.choice(data, "activation", field, ACTIVATIONS, default("activation", "gelu"))
    # A changed width, head count, attention or expert count invalidates the base's derived sizes.
    same_width = "hidden" not in data
    same_heads = same_width and "heads" not in data
    mla_kept = base is not None and base.attention == "mla" and "attention" not in data
    attention = F.choice(data, "attention", field, ATTENTIONS, "mla" if mla_kept else None)
    mla = attention == "mla"
    kv_heads = F.integer(data, "kv_heads", field, default("kv_heads", heads, keep=same_heads), maximum=10**5)
    head_dim = F.integer(data, "head_dim", field,
                         default("head_dim", None, keep=same_heads and "attention" not in data and not mla),
                         maximum=10**5)
    if head_dim is None and not mla and hidden % heads:
        raise InputError(f"{field}.heads", heads, f"must divide hidden={hidden} (or give head_dim)")
    if attention == "mha" and kv_heads != heads:
        raise InputError(f"{field}.attention", "mha", f"needs kv_heads = heads = {heads}; got kv_heads={kv_heads}")
    mla_values = {k: count(k, 0, keep=mla_kept, maximum=10**5) for k in MLA_FIELDS}
    if mla and head_dim is not None and head_dim != mla_values["qk_nope_head_dim"] + mla_values["qk_rope_head_dim"]:
        raise InputError(f"{field}.head_dim", head_dim, "with attention: mla the query/key head is "
                         "qk_nope_head_dim + qk_rope_head_dim: leave head_dim out")
    if not mla:  # the value head of MHA/GQA is head_dim wide
        mla_values["v_head_dim"] = F.integer(data, "v_head_dim", field, None, maximum=10**5)

    experts = count("experts", 0, maximum=100_000)
    moe_kept = base is not None and "experts" not in data
    widths_kept = moe_kept and same_width and base.experts > 0
    dense_layers = count("dense_layers", 0, keep=moe_kept, maximum=100_000)
    moe_layer_freq = F.integer(data, "moe_layer_freq", field, default("moe_layer_freq", 1, keep=moe_kept),
                               maximum=100_000)
    dense = _dense_width(data, field)
    expert_ffn = F.integer(data, "expert_ffn_hidden", field, default("expert_ffn_hidden", None, keep=widths_kept),
                           maximum=10**8)
    if dense is None:
        if base is not None and same_width:
            dense = base.ffn_hidden
        elif experts and expert_ffn is not None and not dense_layers and moe_layer_freq == 1:
            dense = expert_ffn  # no dense layer to size: one width, as in Mixtral's config.json
        elif activation == "gelu":
            dense = 4 * hidden
        else:
            missing = "expert_ffn_hidden" if experts and expert_ffn is None else "ffn_hidden"
            raise InputError(f"{field}.{missing}", None, "required integer is missing")
    spec = ModelSpec(
        name=F.text(data, "name", field, default("name", "custom")),
        description=F.text(data, "description", field, default("description", "")),
        layers=F.integer(data, "layers", field, default("layers"), maximum=100_000),
        hidden=hidden, heads=heads, kv_heads=kv_heads, head_dim=head_dim, attention=attention,
        ffn_hidden=dense,
        vocab=F.integer(data, "vocab", field, default("vocab"), maximum=10**8),
        seq_len=F.integer(data, "seq_len", field, default("seq_len"), maximum=10**8),
        activation=activation,
        norm=F.choice(data, "norm", field, NORMS, default("norm", "layernorm")),
        position_embedding=F.choice(data, "position_embedding", field, POSITIONS,
                                    default("position_embedding", "learned")),
        parallel_block=F.boolean(data, "parallel_block", field, default("parallel_block", False)),
        shared_norm=F.boolean(data, "shared_norm", field, default("shared_norm", False)),
        rotary_fraction=F.number(data, "rotary_fraction", field, default("rotary_fraction", 1.0), maximum=1.0),
        bias=F.boolean(data, "bias", field, default("bias", True)),
        qkv_bias=F.boolean(data, "qkv_bias", field, default("qkv_bias", False)),
        tied_embeddings=F.boolean(data, "tied_embeddings", field, default("tied_embeddings", True)),
        dropout=F.boolean(data, "dropout", field, default("dropout", False)),
        qk_norm=F.boolean(data, "qk_norm", field, default("qk_norm", False)),
        qk_norm_scope=F.choice(data, "qk_norm_scope", field, QK_NORM_SCOPES, default("qk_norm_scope", "head")),
        qk_norm_kind=F.choice(data, "qk_norm_kind", field, QK_NORM_KINDS, default("qk_norm_kind", "norm")),
        nope_layer_interval=count("nope_layer_interval", 0, maximum=100_000),
        pre_norms=F.boolean(data, "pre_norms", field, default("pre_norms", True)),
        post_norms=F.boolean(data, "post_norms", field, default("post_norms", False)),
        **mla_values,
        experts=experts,
        top_k=count("top_k", 0, keep=moe_kept, maximum=100_000),
        expert_ffn_hidden=expert_ffn,
        shared_experts=count("shared_experts", 0, keep=moe_kept, maximum=100_000),
        shared_expert_ffn_hidden=F.integer(
            data, "shared_expert_ffn_hidden", field,
            default("shared_expert_ffn_hidden", None, keep=widths_kept and "shared_experts" not in data),
            maximum=10**8),
        dense_layers=dense_layers, moe_layer_freq=moe_layer_freq,
        moe_layer_offset=count("moe_layer_offset", 0, keep=moe_kept, maximum=100_000),
        mtp_layers=count("mtp_layers", 0, maximum=1000),
        router_groups=count("router_groups", 0, keep=moe_kept, maximum=100_000),
        router_group_topk=count("router_group_topk", 0, keep=moe_kept, maximum=100_000),
        sliding_window=count("sliding_window", 0, maximum=10**8),
        sliding_window_freq=F.integer(data, "sliding_window_freq", field, default("sliding_window_freq", 1),
                                      maximum=100_000),
        sliding_window_skip_freq=count("sliding_window_skip_freq", 0, maximum=100_000),
        window_kind=F.choice(data, "window_kind", field, WINDOW_KINDS, default("window_kind", "sliding")),
        document_tokens=count("document_tokens", 0, maximum=10**8),
    )
    return check_shapes(spec, field)


def check_shapes(spec: ModelSpec, field: str = "model") -> ModelSpec:
    """Raise InputError, naming the field, for a spec no real model has."""
    def bad(key, allowed):
        raise InputError(f"{field}.{key}", getattr(spec, key), allowed)

    if spec.kv_heads > spec.heads or spec.heads % spec.kv_heads:
        bad("kv_heads", f"must divide heads={spec.heads}")
    if spec.attention == "mla":
        if spec.kv_heads != spec.heads:
            bad("kv_heads", f"MLA decompresses keys and values for every head: kv_heads must equal heads={spec.heads}")
        for key in ("kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"):
            if getattr(spec, key) < 1:
                bad(key, "attention: mla needs an integer >= 1")
        if spec.bias:
            bad("bias", "MLA models (DeepSeek-V2/V3) have no biases: set bias: false")
        if spec.qk_norm:
            bad("qk_norm", "MLA normalises its latents (mla.py), not query and key heads: only with mha or gqa")
    else:
        for key in ("q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim"):
            if getattr(spec, key):
                bad(key, "only with attention: mla")
        if spec.v_head_dim != spec.head_dim:
            bad("v_head_dim", f"only with attention: mla (MHA/GQA values have head_dim={spec.head_dim})")
    if not spec.experts:
        for key in MOE_FIELDS:
            if getattr(spec, key) != (1 if key == "moe_layer_freq" else 0):
                bad(key, "only with experts >= 1 (a Mixture-of-Experts model)")
    else:
        if not 1 <= spec.top_k <= spec.experts:
            bad("top_k", f"expected an integer from 1 to experts={spec.experts}")
        if spec.expert_ffn_hidden < 1:
            bad("expert_ffn_hidden", "expected an integer >= 1")
        if bool(spec.shared_experts) != bool(spec.shared_expert_ffn_hidden):
            bad("shared_expert_ffn_hidden", "expected an integer >= 1 with shared_experts >= 1, else 0")
        if spec.moe_layer_offset >= spec.moe_layer_freq:
            bad("moe_layer_offset", f"an integer from 0 to moe_layer_freq - 1 = {spec.moe_layer_freq - 1}")
        if spec.dense_layers >= spec.layers:
            bad("dense_layers", f"must be < layers={spec.layers} (an MoE model has at least one MoE layer)")
        if not spec.moe_layers:
            bad("moe_layer_freq", f"leaves no MoE layer among layers {spec.dense_layers}..{spec.layers - 1}")
        if spec.router_groups and spec.experts % spec.router_groups:
            bad("router_groups", f"must divide experts={spec.experts} (groups of consecutive experts), or 0")
        if bool(spec.router_groups) != bool(spec.router_group_topk) or spec.router_group_topk > spec.router_groups:
            bad("router_group_topk", f"an integer from 1 to router_groups={spec.router_groups} with router_groups, "
                "else 0")
        if spec.router_groups and spec.top_k > spec.router_group_topk * spec.experts // spec.router_groups:
            bad("top_k", f"at most the {spec.router_group_topk * spec.experts // spec.router_groups} experts of "
                f"router_group_topk={spec.router_group_topk} groups")
    if spec.rotary_fraction != 1.0:
        rotated = spec.head_dim * spec.rotary_fraction
        if spec.position_embedding != "rope" or spec.attention == "mla":
            bad("rotary_fraction", "1 unless position_embedding is rope (MLA's rotated part is qk_rope_head_dim)")
        if rotated != int(rotated) or int(rotated) % 2:
            bad("rotary_fraction", f"a share of head_dim={spec.head_dim} that is an even number of dimensions")
    if spec.qkv_bias and (spec.bias or spec.attention == "mla"):
        bad("qkv_bias", "only with bias: false and MHA/GQA attention (with bias: true every linear has its bias)")
    if spec.shared_norm and not spec.parallel_block:
        bad("shared_norm", "only with parallel_block: true (one input norm feeding attention and MLP side by side)")
    if spec.parallel_block and (spec.experts or spec.attention == "mla" or spec.mtp_layers or spec.post_norms
                                or not spec.pre_norms):
        bad("parallel_block", "false with experts, MLA, MTP, post_norms or without pre_norms (parallel blocks are "
            "modelled for dense pre-norm MHA/GQA layers: GPT-J, GPT-NeoX, Falcon)")
    if spec.qk_norm_scope != "head" and not spec.qk_norm:
        bad("qk_norm_scope", "only with qk_norm: true")
    if spec.qk_norm_kind != "norm" and (not spec.qk_norm or spec.qk_norm_scope != "head" or spec.norm != "rmsnorm"):
        bad("qk_norm_kind", "l2 only with qk_norm: true over each head (qk_norm_scope: head) in an RMSNorm model "
            "(an L2 norm is an RMS norm without weights: Llama 4)")
    if spec.nope_layer_interval and (spec.position_embedding != "rope" or spec.attention == "mla"
                                     or not 2 <= spec.nope_layer_interval <= spec.layers):
        bad("nope_layer_interval", f"an integer from 2 to layers={spec.layers}, with position_embedding: rope and "
            "MHA/GQA attention (each n-th layer without rotary embedding)")
    if not spec.pre_norms and (spec.experts or spec.attention == "mla" or spec.mtp_layers):
        bad("pre_norms", "true with experts, MLA or MTP (layers without input norms are modelled for dense "
            "MHA/GQA models: OLMo 2)")
    if spec.sliding_window_freq != 1 and not spec.sliding_window:
        bad("sliding_window_freq", "only with sliding_window >= 1")
    if spec.sliding_window_skip_freq and (not spec.sliding_window or spec.sliding_window_freq != 1
                                          or spec.sliding_window_skip_freq < 2):
        bad("sliding_window_skip_freq", "an integer >= 2, only with sliding_window >= 1 and without "
            "sliding_window_freq (each N-th layer attends fully, the others in the window)")
    if spec.window_kind != "sliding" and (not spec.sliding_window or spec.document_tokens):
        bad("window_kind", "chunked only with sliding_window >= 1 (the chunk's tokens) and without document_tokens "
            "(chunks inside packed documents are not modelled)")
    return spec


def available_presets() -> list[str]:
    return sorted(p.stem for p in presets_dir().glob("*.yaml"))


@lru_cache(maxsize=None)
def load_preset(name: str) -> ModelSpec:
    path = presets_dir() / f"{name}.yaml"
    if not path.is_file():
        raise InputError("model.preset", name, "known presets: " + ", ".join(available_presets()))
    where = f"models/{name}.yaml"
    data = F.require_mapping(load_yaml(path, where), where)
    F.reject_unknown(data, MODEL_KEYS, where)
    return _spec_from_fields(data, where)


def load_hf_config(path: str, seq_len=None) -> ModelSpec:
    """A spec from a Hugging Face config.json (simulator.hf_config); `seq_len` is required:
    a config.json states the longest context, not the length a training run uses."""
    return _spec_from_fields(hf_fields(path, seq_len), f"model.hf_config[{Path(path).name}]")


def model_from_dict(data) -> ModelSpec:
    """The scenario's `model` section: {preset: NAME} (fields may override), {hf_config: PATH,
    seq_len: N} or fields. A null preset or hf_config counts as absent, so an override that
    switches the model source sets the other one to null."""
    data = F.require_mapping(data, "model")
    F.reject_unknown(data, MODEL_KEYS, "model")
    if data.get("preset") is not None and data.get("hf_config") is not None:
        raise InputError("model.hf_config", data["hf_config"], "give preset or hf_config, not both (to replace "
                         "one by the other, set the first to null)")
    base = None
    if data.get("preset") is not None:
        base = load_preset(F.text(data, "preset", "model"))
    elif data.get("hf_config") is not None:
        base = load_hf_config(F.text(data, "hf_config", "model"), data.get("seq_len"))
    overrides = {k: v for k, v in data.items() if k not in ("preset", "hf_config", "source")}
    if base is not None and not overrides:
        return base
    return _spec_from_fields(overrides, "model", base)


def resolve_hf_config(scenario: dict, folder: Path) -> dict:
    """A scenario file's mapping with a relative model.hf_config made relative to `folder`,
    the file's own folder (a path given on the command line stays relative to the current
    directory). Anything malformed is left for model_from_dict to report."""
    model = scenario.get("model")
    path = model.get("hf_config") if isinstance(model, Mapping) else None
    if not isinstance(path, str) or not path.strip() or Path(path).is_absolute():
        return scenario
    return {**scenario, "model": {**model, "hf_config": str(Path(folder) / path)}}


def preset_table() -> tuple[tuple, list[tuple]]:
    """(headers, rows) of every preset for `llmsim models list`: total and active parameters
    in billions (main model + MTP modules when it has some), shape and MoE shape."""
    def billions(main, mtp):
        return f"{main / 1e9:.2f}" + (f"+{mtp / 1e9:.2f}" if mtp else "")

    headers = ("preset", "params B", "active B", "layers", "hidden", "heads/kv", "ffn", "experts", "vocab", "seq",
               "act")
    rows = []
    for name in available_presets():
        m = load_preset(name)
        heads = f"{m.heads} mla" if m.attention == "mla" else f"{m.heads}/{m.kv_heads}"
        ffn = m.ffn_hidden if m.moe_layers < m.layers else "-"  # the width of the dense-MLP layers
        mtp = m.mtp_layers * m.mtp_module_params(), m.mtp_layers * m.mtp_module_params(active=True)
        rows.append((name, billions(m.params(mtp=False), mtp[0]), billions(m.active_params(mtp=False), mtp[1]),
                     m.layers, m.hidden, heads,
                     ffn, m.shape_summary(), m.vocab, m.seq_len, m.activation))
    return headers, rows
