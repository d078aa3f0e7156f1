"""Hugging Face config.json import: the keys of a released checkpoint, as llmsim model fields.

Families read: GPT-2 (n_embd ...), Llama / Mistral / Qwen2 / Qwen3 (dense; Qwen3's query and
key head norms), Gemma 3's text model (four norms a layer, query and key norms, GeGLU, tied
embeddings, five windowed layers to one global; its embedding's scaling by sqrt(hidden), one
multiply, is not counted; logit soft-capping is refused), OLMo 2 and 3 (norms on each block's
output only, query and key norms over the whole projections; OLMo 3's windows on three layers
in four), Phi-3 / Phi-4 (fused projections, Llama's layer, partial RoPE), Mixtral,
Qwen2-MoE / Qwen3-MoE, OLMoE (query and key norms over the projections), DeepSeek-V2 / V3
(MLA, shared experts, leading dense layers, MTP; Kimi K2 the same), GLM-4.5 (DeepSeek-V3's experts with GQA,
partial RoPE and MTP), GPT-OSS (biases, alternating sliding-window layers), Llama 4's text
decoder (llama4_text: experts on every or every other layer beside a shared expert, NoPE
layers, chunked attention and L2 query and key norms on the others) and GPT-NeoX / Pythia
(parallel attention and MLP, partial RoPE, LayerNorms and biases). A config with expert
or latent attention keys of another family, or a layer pattern llmsim cannot express, is
refused with the key named: never imported as a dense model. So is any other family (its model_type
named): its layer may differ from these in ways the keys do not show (Falcon's multi-query
flags and LayerNorm biases beside bias-free linears, Gemma 2's logit soft-capping), so it is
never read as a Llama. No network: the file is read from disk.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Mapping

from . import fields as F
from .errors import InputError

MAX_BYTES = 1 << 20  # a config.json is a few kB; anything larger is not one
DENSE_TYPES = ("llama", "mistral", "qwen2", "qwen3", "gemma3_text", "olmo2", "olmo3", "phi3")
MOE_TYPES = ("mixtral", "qwen2_moe", "qwen3_moe", "olmoe", "deepseek_v2", "deepseek_v3", "kimi_k2", "glm4_moe",
             "gpt_oss", "llama4_text")
# Moonshot's Kimi K2 is DeepSeek-V3's architecture under its own model_type (its config.json's
# architectures: DeepseekV3ForCausalLM; the model card says to set model_type deepseek_v3 where a
# framework does not know kimi_k2): read as DeepSeek-V3's.
DEEPSEEK_V3_TYPES = ("deepseek_v3", "kimi_k2")
# Keys that only MoE / latent-attention / multi-token-prediction configs carry.
EXPERT_KEYS = ("num_local_experts", "n_routed_experts", "num_experts", "num_experts_per_tok", "experts_per_token",
               "moe_intermediate_size", "n_shared_experts", "shared_expert_intermediate_size",
               "first_k_dense_replace", "decoder_sparse_step", "moe_layer_freq")
MLA_KEYS = ("q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")
OTHER_VARIANT_KEYS = ("num_nextn_predict_layers",)
# Plain GELU MLP (2 matrices) for GPT-style families; the gated families below are GLUs.
_HF_ACT = {"silu": "swiglu", "swish": "swiglu", "gelu": "gelu", "gelu_new": "gelu", "gelu_fast": "gelu",
           "gelu_pytorch_tanh": "gelu"}
_GATED_ACT = {"silu": "swiglu", "swish": "swiglu", "gelu": "geglu", "gelu_new": "geglu", "gelu_fast": "geglu",
              "gelu_pytorch_tanh": "geglu"}


def read_config(path: str, field: str = "model.hf_config") -> dict:
    """The JSON object of a config.json: a regular file of at most MAX_BYTES, UTF-8."""
    p = Path(path)
    try:
        if not p.exists():
            raise InputError(field, path, "file not found")
        if not p.is_file():
            raise InputError(field, path, "expected a regular file (a config.json)")
        if p.stat().st_size > MAX_BYTES:
            raise InputError(field, path, f"larger than {MAX_BYTES} bytes: not a config.json")
        cfg = json.loads(p.read_text(encoding="utf-8"), object_pairs_hook=lambda pairs: _unique(pairs, field))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise InputError(field, path, f"expected a JSON config.json ({exc.__class__.__name__})") from None
    return dict(F.require_mapping(cfg, field))


def _unique(pairs: list, field: str) -> dict:
    """A JSON object whose keys are all different (json.loads would keep the last silently)."""
    out = {}
    for key, value in pairs:
        if key in out:
            raise InputError(f"{field}.{key}", value, "duplicate key in config.json")
        out[key] = value
    return out


def _name(cfg: Mapping, path: str) -> str:
    """The checkpoint's name (`_name_or_path`, last path part), else its model_type."""
    for key in ("_name_or_path", "model_type"):
        value = cfg.get(key)
        if isinstance(value, str) and value.strip():
            return value.rstrip("/").split("/")[-1] or value
    stem = Path(path).stem
    return stem if stem != "config" else "hf-model"


def _present(cfg: Mapping, keys) -> list[str]:
    return [k for k in keys if cfg.get(k) not in (None, 0, False, [], "")]


def _sliding_window(cfg: Mapping, model_type, layers: int, where: str) -> dict:
    """sliding_window and sliding_window_freq or sliding_window_skip_freq: which layers attend
    to a window of recent tokens.

    `layer_types` (transformers >= 4.54: GPT-OSS, Gemma, OLMo 3) must be sliding on the layers
    i % f == 0 and full elsewhere, or full on each n-th layer and sliding elsewhere (Gemma 3:
    n = 6; OLMo 3: n = 4); Qwen's `use_sliding_window` (window on the layers past
    max_window_layers) is refused; otherwise a `sliding_window` applies to every layer (Mistral
    v0.1, transformers MistralAttention), unless `use_sliding_window` is false."""
    window = cfg.get("sliding_window")
    types = cfg.get("layer_types")
    if model_type == "llama4_text":  # chunked attention: _llama4_fields
        return {}
    if types is None and model_type == "gemma3_text":
        # transformers models/gemma3/configuration_gemma3.py Gemma3TextConfig: without
        # layer_types, layer i slides unless (i + 1) % sliding_window_pattern == 0 (6 by default)
        pattern = F.integer(cfg, "sliding_window_pattern", where, 6)
        types = ["sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(layers)]
    if model_type == "olmo3":
        # transformers models/olmo3/configuration_olmo3.py Olmo3Config: sliding_window 4096 by
        # default and, without layer_types, every fourth layer full, the others sliding
        cfg = {"sliding_window": 4096, **cfg}
        if types is None:
            types = ["sliding_attention" if (i + 1) % 4 else "full_attention" for i in range(layers)]
    if types is not None:
        if not isinstance(types, list) or len(types) != layers or \
                not all(t in ("full_attention", "sliding_attention") for t in types):
            raise InputError(f"{where}.layer_types", types, f"expected {layers} of full_attention / sliding_attention")
        sliding = [t == "sliding_attention" for t in types]
        if not any(sliding):
            return {}
        from .model import window_pattern  # model.py reads hf_config: imported on use
        pattern = window_pattern(sliding)
        if pattern is None:
            raise InputError(f"{where}.layer_types", types, "llmsim models sliding-window layers i % f == 0, or all "
                             "but every n-th, only")
        return {"sliding_window": F.integer(cfg, "sliding_window", where), **pattern}
    if str(model_type).startswith("qwen"):
        if cfg.get("use_sliding_window"):
            raise InputError(f"{where}.use_sliding_window", True, "Qwen's sliding window above max_window_layers is "
                             "not modelled")
        return {}
    if window is None or cfg.get("use_sliding_window") is False:
        return {}
    return {"sliding_window": F.integer(cfg, "sliding_window", where)}


def _periodic(flags: list, key: str, where: str, allowed: str, fit) -> dict:
    """The model fields `fit` finds for a per-layer 0/1 list, or a refusal naming `key`."""
    fields = fit(flags) if any(flags) else {}
    if fields is None:
        raise InputError(f"{where}.{key}", [int(f) for f in flags], allowed)
    return fields


def _llama4_layer_lists(cfg: Mapping, layers: int, where: str) -> tuple:
    """(MoE flags, NoPE flags) of Llama 4's layers as transformers' Llama4TextConfig derives
    them: moe_layers, else range(interleave_moe_layer_step - 1, layers, step); no_rope_layers
    (1: the layer rotates), else each no_rope_layer_interval-th layer (4 by default) without."""
    moe = cfg.get("moe_layers")
    if moe is None:
        step = F.integer(cfg, "interleave_moe_layer_step", where, 1)
        moe = list(range(step - 1, layers, step))
    if not isinstance(moe, list) or not all(isinstance(i, int) and 0 <= i < layers for i in moe):
        raise InputError(f"{where}.moe_layers", moe, f"a list of layer indices below {layers}")
    rope = cfg.get("no_rope_layers") or None
    if rope is None:
        interval = F.integer(cfg, "no_rope_layer_interval", where, 4)
        rope = [int((i + 1) % interval != 0) for i in range(layers)]
    if not isinstance(rope, list) or len(rope) != layers or set(rope) - {0, 1}:
        raise InputError(f"{where}.no_rope_layers", rope, f"a list of {layers} ones and zeros (1: the layer rotates)")
    return [int(i in moe) for i in range(layers)], [1 - r for r in rope]


def _llama4_fields(cfg: Mapping, layers: int, where: str) -> dict:
    """Llama 4's text decoder (transformers models/llama4/modeling_llama4.py): each MoE layer
    has num_local_experts experts of intermediate_size, top num_experts_per_tok, beside one
    shared expert of intermediate_size (Llama4TextMoe, Llama4TextMLP); the other layers a
    dense MLP of intermediate_size_mlp; NoPE layers without RoPE; with use_qk_norm, a weightless
    L2 norm of each query and key head on the rotating layers (Llama4TextL2Norm). The NoPE
    layers' attention temperature tuning (a multiply of their queries by a per-position scale,
    under 0.1 % of a layer's memory traffic) is not counted."""
    from .importers.megatron_moe import layer_period  # importers build on this package: imported on use
    from .model import every_nth_layer
    moe, nope = _llama4_layer_lists(cfg, layers, where)
    period = layer_period(moe) if any(moe) else None
    if period is None:
        raise InputError(f"{where}.moe_layers", [i for i, m in enumerate(moe) if m], "MoE on leading dense layers "
                         "then every n-th layer (model.dense_layers, moe_layer_freq, moe_layer_offset)")
    nope_fields = _periodic(nope, "no_rope_layers", where, "NoPE on each n-th layer only (model.nope_layer_interval)",
                            lambda f: ({"nope_layer_interval": n} if (n := every_nth_layer(f)) else None))
    width = F.integer(cfg, "intermediate_size", where)
    l2 = bool(cfg.get("use_qk_norm", True))
    return dict(ffn_hidden=F.integer(cfg, "intermediate_size_mlp", where), shared_experts=1,
                shared_expert_ffn_hidden=width, dense_layers=period[0], moe_layer_freq=period[1],
                moe_layer_offset=period[2], qk_norm=l2, qk_norm_kind="l2" if l2 else "norm", **nope_fields,
                **_llama4_chunks(cfg, nope, where))


def _llama4_chunks(cfg: Mapping, nope: list, where: str) -> dict:
    """Llama 4's chunked attention (transformers Llama4TextConfig): layer_types, else
    chunked_attention on the rotating layers (`nope` flags the others), with chunks of
    attention_chunk_size tokens (None: no chunking)."""
    from .model import window_pattern
    chunk = cfg.get("attention_chunk_size", 8192)
    layers = len(nope)
    types = cfg.get("layer_types")
    if types is None:
        types = ["full_attention" if n else "chunked_attention" for n in nope]
    if not isinstance(types, list) or len(types) != layers or \
            not all(t in ("full_attention", "chunked_attention") for t in types):
        raise InputError(f"{where}.layer_types", types, f"expected {layers} of full_attention / chunked_attention")
    chunked = [t == "chunked_attention" for t in types]
    if chunk is None or not any(chunked):
        return {}
    pattern = _periodic(chunked, "layer_types", where, "chunked layers i % f == 0, or all but every n-th, only",
                        window_pattern)
    return {"sliding_window": F.integer(cfg, "attention_chunk_size", where, chunk), "window_kind": "chunked",
            **pattern}


# A family's dropout rates (transformers config keys): Phi-3's attention, residual and embedding
# dropout; GPT-NeoX's hidden_dropout on the residual branches and the embedding
DROPOUT_KEYS = {"phi3": ("attention_dropout", "resid_pdrop", "embd_pdrop"),
                "gpt_neox": ("attention_dropout", "hidden_dropout")}


def _dropout(cfg: Mapping, model_type, where: str) -> bool:
    """model.dropout: llmsim's dropout is Megatron's set, on the attention probabilities, on both
    residual branches and on the embedding output, all or none (DROPOUT_KEYS); the other
    families read here have only attention_dropout, which alone is refused."""
    keys = DROPOUT_KEYS.get(model_type, ("attention_dropout",))
    rates = [F.number(cfg, key, where, 0.0, strict_min=False, maximum=1.0) for key in keys]
    if len(keys) == 1 and rates[0]:
        raise InputError(f"{where}.attention_dropout", cfg["attention_dropout"], "0 (dropout on the attention "
                         "probabilities alone is not modelled: model.dropout adds residual and embedding dropout)")
    for key, rate in zip(keys, rates):
        if bool(rate) != bool(rates[0]):
            raise InputError(f"{where}.{key}", cfg.get(key), f"{'non-zero' if rates[0] else '0'} as "
                             f"{keys[0]} (llmsim's dropout is on the attention, the residuals and the "
                             "embedding together)")
    return bool(rates[0])


def _qkv_bias(cfg: Mapping, model_type, where: str) -> bool:
    """Biases on the query, key and value projections alone: Qwen2's and Qwen2-MoE's always
    (transformers Qwen2Attention q_proj, k_proj, v_proj bias=True; Qwen2-MoE's qkv_bias),
    GLM-4.5's with attention_bias (Glm4MoeAttention; o_proj has none). Elsewhere attention_bias
    also biases the output projection (LlamaAttention o_proj) and mlp_bias the MLP: refused."""
    if model_type == "gpt_oss":
        return False
    if model_type in ("qwen2", "qwen2_moe"):
        return bool(cfg.get("qkv_bias", True))
    if model_type == "glm4_moe":
        return bool(cfg.get("attention_bias", False))
    for key in ("attention_bias", "mlp_bias"):
        if cfg.get(key):
            raise InputError(f"{where}.{key}", cfg[key], "false (biases on some linears but not all are modelled "
                             "for the Q, K and V projections of Qwen2 and GLM-4.5 only)")
    return False


def _gpt_neox_fields(cfg: Mapping, where: str, name: str, seq) -> dict:
    """GPT-NeoX and Pythia (transformers models/gpt_neox GPTNeoXConfig and GPTNeoXLayer):
    LayerNorms with biases, biases on every linear (attention_bias on query_key_value and
    dense; the MLP's always), a plain GELU MLP, RoPE on rotary_pct of each head (0.25 by
    default), and with use_parallel_residual (the default) attention and MLP side by side,
    each through its own norm of the layer input."""
    act = cfg.get("hidden_act", "gelu")
    if not isinstance(act, str) or act not in _HF_ACT or _HF_ACT[act] != "gelu":
        raise InputError(f"{where}.hidden_act", act, "a GELU (gelu, gelu_new, gelu_fast, gelu_pytorch_tanh)")
    if not cfg.get("attention_bias", True):
        raise InputError(f"{where}.attention_bias", False, "true (the MLP's linears have biases: llmsim's bias is "
                         "on every linear or none)")
    hidden = F.integer(cfg, "hidden_size", where)
    fraction_key = "partial_rotary_factor" if "partial_rotary_factor" in cfg else "rotary_pct"
    dropout = _dropout(cfg, "gpt_neox", where)
    return dict(name=name, layers=F.integer(cfg, "num_hidden_layers", where), hidden=hidden,
                heads=F.integer(cfg, "num_attention_heads", where),
                ffn_hidden=F.integer(cfg, "intermediate_size", where, 4 * hidden),
                vocab=F.integer(cfg, "vocab_size", where), seq_len=seq, activation="gelu", norm="layernorm",
                position_embedding="rope", bias=True, tied_embeddings=bool(cfg.get("tie_word_embeddings", False)),
                dropout=dropout, parallel_block=bool(cfg.get("use_parallel_residual", True)),
                rotary_fraction=F.number(cfg, fraction_key, where, 0.25, maximum=1.0))


def _moe_fields(cfg: Mapping, model_type: str, where: str) -> dict:
    """Expert fields of a known MoE family (the keys of each family's transformers config class)."""
    deepseek_like = model_type in ("deepseek_v2", *DEEPSEEK_V3_TYPES, "glm4_moe")
    key = {"mixtral": "num_local_experts", "gpt_oss": "num_local_experts", "llama4_text": "num_local_experts"}.get(
        model_type, "n_routed_experts" if deepseek_like else "num_experts")
    out = dict(experts=F.integer(cfg, key, where), top_k=F.integer(cfg, "num_experts_per_tok", where))
    width = "moe_intermediate_size" if deepseek_like or model_type in ("qwen2_moe", "qwen3_moe") \
        else "intermediate_size"
    out["expert_ffn_hidden"] = F.integer(cfg, width, where)
    if deepseek_like:
        # vllm deepseek_v2.py (commit 002d6073) DeepseekV2MoE: one shared MLP of
        # moe_intermediate_size * n_shared_experts, i.e. n_shared_experts experts of that width;
        # GLM-4.5's the same (transformers models/glm4_moe Glm4MoeDecoderLayer: a dense MLP of
        # intermediate_size below first_k_dense_replace, the DeepSeek-V3 router and experts above).
        shared = F.integer(cfg, "n_shared_experts", where, 0, minimum=0)
        out.update(shared_experts=shared, shared_expert_ffn_hidden=out["expert_ffn_hidden"] if shared else None,
                   dense_layers=F.integer(cfg, "first_k_dense_replace", where, 0, minimum=0),
                   moe_layer_freq=F.integer(cfg, "moe_layer_freq", where, 1))
        # group-limited routing: DeepSeek-V2's group_limited_greedy and V3's noaux_tc pick
        # topk_group of n_group expert groups first (transformers DeepseekV3TopkRouter
        # get_topk_indices; GLM-4.5's router the same); DeepSeek-V2's "greedy" ignores them
        groups = F.integer(cfg, "n_group", where, 1, minimum=1) or 1
        if groups > 1 and cfg.get("topk_method") != "greedy":
            out.update(router_groups=groups, router_group_topk=F.integer(cfg, "topk_group", where, minimum=1))
    elif model_type.startswith("qwen"):
        # transformers Qwen2MoeDecoderLayer: MoE where (i + 1) % decoder_sparse_step == 0 and i
        # not in mlp_only_layers (the last layer of each period: model.moe_layer_offset)
        step = F.integer(cfg, "decoder_sparse_step", where, 1)
        out.update(moe_layer_freq=step, moe_layer_offset=step - 1)
        if cfg.get("mlp_only_layers"):
            raise InputError(f"{where}.mlp_only_layers", cfg["mlp_only_layers"], "only [] is modelled")
        shared = F.integer(cfg, "shared_expert_intermediate_size", where, 0, minimum=0)
        if shared and model_type == "qwen3_moe":
            raise InputError(f"{where}.shared_expert_intermediate_size", shared, "Qwen3-MoE has no shared expert")
        # Qwen2-MoE's sigmoid shared_expert_gate (hidden x 1 per layer, < 0.01% of the
        # parameters, one GEMV and a multiply per token) is not modelled.
        out.update(shared_experts=1 if shared else 0, shared_expert_ffn_hidden=shared or None)
    return out


def hf_fields(path: str, seq_len) -> dict:
    """llmsim model fields (a mapping for model.py's parser) from a Hugging Face config.json.

    `seq_len` is the training sequence length: required, since max_position_embeddings is
    the longest context a model supports, not what a training run uses."""
    field = "model.hf_config"
    if seq_len is None:
        raise InputError("model.seq_len", None, "required with hf_config: set model.seq_len to the training "
                         "sequence length (config.json's max_position_embeddings is the longest context)")
    seq = F.integer({"seq_len": seq_len}, "seq_len", "model", maximum=10**8)
    cfg = read_config(path, field)
    where = f"{field}[{Path(path).name}]"
    name = _name(cfg, path)
    if "n_embd" in cfg and cfg.get("model_type", "gpt2") == "gpt2":  # GPT-2 naming
        hidden = F.integer(cfg, "n_embd", where)
        positions = F.integer(cfg, "n_positions", where, cfg.get("n_ctx"))
        if seq > positions:
            raise InputError("model.seq_len", seq, f"GPT-2's learned position table has n_positions={positions} rows")
        act = cfg.get("activation_function", "gelu_new")
        if not isinstance(act, str) or act not in _HF_ACT:
            raise InputError(f"{where}.activation_function", act, "expected one of " + ", ".join(_HF_ACT))
        # GPT2Config defaults: n_inner None = 4 * n_embd; tie_word_embeddings True.
        return dict(name=name, layers=cfg.get("n_layer"), hidden=hidden, heads=cfg.get("n_head"),
                    ffn_hidden=cfg.get("n_inner") or 4 * hidden, vocab=cfg.get("vocab_size"), seq_len=seq,
                    activation=_HF_ACT[act], norm="layernorm", position_embedding="learned", bias=True,
                    tied_embeddings=cfg.get("tie_word_embeddings", True), dropout=bool(cfg.get("resid_pdrop", 0)))
    model_type = cfg.get("model_type")
    if model_type == "gpt_neox":
        return _gpt_neox_fields(cfg, where, name, seq)
    if model_type not in DENSE_TYPES + MOE_TYPES and isinstance(cfg.get("text_config"), Mapping):
        # a multimodal checkpoint (Gemma 3 4B-27B, Llama 4, LLaVA): a vision encoder beside a decoder
        raise InputError(f"{where}.text_config", f"model_type {model_type!r}", "a multimodal config: llmsim models "
                         "the text decoder only; save its text_config as a config.json of its own (the vision "
                         "encoder is not modelled)")
    if model_type not in DENSE_TYPES + MOE_TYPES:
        found = _present(cfg, EXPERT_KEYS + MLA_KEYS + OTHER_VARIANT_KEYS)
        if found:
            raise InputError(f"{where}.{found[0]}", cfg[found[0]], f"model_type {model_type!r} is not a family llmsim "
                             "imports with experts or latent attention (" + ", ".join(MOE_TYPES) + ")")
        raise InputError(f"{where}.model_type", model_type, "not a family llmsim reads (" +
                         ", ".join(("gpt2", *DENSE_TYPES, *MOE_TYPES)) + "): its layer may differ from theirs (norms, "
                         "parallel attention and MLP, biases, activations); give the model's fields instead")
    if "hidden_size" not in cfg:
        raise InputError(f"{where}.hidden_size", None, f"required for model_type {model_type!r}")
    gemma = model_type == "gemma3_text"
    if gemma:
        for key in ("final_logit_softcapping", "attn_logit_softcapping"):
            if cfg.get(key) is not None:
                raise InputError(f"{where}.{key}", cfg[key], "logit soft-capping is not modelled: null only")
    act_key = "hidden_activation" if gemma and "hidden_activation" in cfg else "hidden_act"
    act = cfg.get(act_key, "gelu_pytorch_tanh" if gemma else "silu")
    if not isinstance(act, str) or act not in _GATED_ACT:
        raise InputError(f"{where}.{act_key}", act, "expected one of " + ", ".join(_GATED_ACT))
    layers = F.integer(cfg, "num_hidden_layers", where)
    heads = F.integer(cfg, "num_attention_heads", where)
    data = dict(name=name, layers=layers, hidden=F.integer(cfg, "hidden_size", where), heads=heads,
                kv_heads=F.integer(cfg, "num_key_value_heads", where, heads),
                ffn_hidden=F.integer(cfg, "intermediate_size", where), vocab=F.integer(cfg, "vocab_size", where),
                seq_len=seq, activation=_GATED_ACT[act], norm="rmsnorm", position_embedding="rope",
                bias=model_type == "gpt_oss" and bool(cfg.get("attention_bias", True)),
                qkv_bias=_qkv_bias(cfg, model_type, where),
                tied_embeddings=bool(cfg.get("tie_word_embeddings", gemma)),  # Gemma3TextConfig ties by default
                dropout=_dropout(cfg, model_type, where), **_sliding_window(cfg, model_type, layers, where))
    if model_type in ("deepseek_v2", *DEEPSEEK_V3_TYPES):
        # Multi-head latent attention; transformers writes head_dim = qk_rope_head_dim for
        # rotary purposes, so the query/key head is derived from the MLA dims instead.
        data.update(attention="mla", kv_heads=heads, q_lora_rank=F.integer(cfg, "q_lora_rank", where, 0, minimum=0),
                    **{k: F.integer(cfg, k, where) for k in MLA_KEYS[1:]},
                    mtp_layers=F.integer(cfg, "num_nextn_predict_layers", where, 0, minimum=0))
    elif cfg.get("head_dim") is not None:
        data["head_dim"] = F.integer(cfg, "head_dim", where)
    if model_type == "glm4_moe":
        # transformers models/glm4_moe Glm4MoeAttention: RoPE on partial_rotary_factor of each
        # head, per-head q_norm and k_norm with use_qk_norm (its q/k/v biases: _qkv_bias); MTP
        # modules as DeepSeek-V3's (num_nextn_predict_layers)
        data.update(rotary_fraction=F.number(cfg, "partial_rotary_factor", where, 0.5, maximum=1.0),
                    qk_norm=bool(cfg.get("use_qk_norm", False)),
                    mtp_layers=F.integer(cfg, "num_nextn_predict_layers", where, 0, minimum=0))
    if model_type in ("qwen3", "qwen3_moe", "gemma3_text"):
        # transformers models/qwen3/modeling_qwen3.py Qwen3Attention: q_norm and k_norm, an
        # RMSNorm over each head's head_dim, before RoPE (Qwen3-MoE's and Gemma 3's the same)
        data["qk_norm"] = True
    if gemma:  # models/gemma3/modeling_gemma3.py Gemma3DecoderLayer: post_attention_ and post_feedforward_layernorm
        data["post_norms"] = True
    if model_type == "phi3":
        # transformers models/phi3 apply_rotary_pos_emb: RoPE on the first rotary_dim of each head
        data["rotary_fraction"] = F.number(cfg, "partial_rotary_factor", where, 1.0, maximum=1.0)
    if model_type == "olmoe":
        # transformers models/olmoe/modeling_olmoe.py OlmoeAttention: q_norm over hidden, k_norm
        # over kv_heads x head_dim, after the projections; its decoder layer keeps the pre-norms
        data.update(qk_norm=True, qk_norm_scope="full")
        if cfg.get("clip_qkv") is not None:
            raise InputError(f"{where}.clip_qkv", cfg["clip_qkv"], "clamping queries, keys and values is not "
                             "modelled: null only")
    if model_type in ("olmo2", "olmo3"):
        # transformers models/olmo2/modular_olmo2.py: Olmo2DecoderLayer deletes input_layernorm
        # and norms the attention's and the MLP's outputs (post_attention_layernorm,
        # post_feedforward_layernorm) before each residual add; Olmo2Attention's q_norm and
        # k_norm are RMSNorms over the whole q_proj and k_proj outputs (OLMo 3's layer the same)
        data.update(pre_norms=False, post_norms=True, qk_norm=True, qk_norm_scope="full")
    if model_type == "llama4_text":
        data.update(_llama4_fields(cfg, layers, where))
    if model_type in MOE_TYPES:
        data.update(_moe_fields(cfg, model_type, where))
    return data
