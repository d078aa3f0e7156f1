"""Transformer model spec: presets (models/*.yaml), explicit fields, or a Hugging Face config.json."""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Mapping

from . import fields as F
from .errors import InputError
from .resources import data_dir
from .yamlio import load_yaml

ACTIVATIONS = ("gelu", "swiglu")
NORMS = ("layernorm", "rmsnorm")
POSITIONS = ("learned", "rope")


def presets_dir() -> Path:
    return data_dir() / "models"


@dataclass(frozen=True)
class ModelSpec:
    """A decoder-only transformer (GPT / Llama family)."""

    name: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    ffn_hidden: int
    vocab: int
    seq_len: int
    activation: str = "gelu"
    norm: str = "layernorm"
    position_embedding: str = "learned"
    bias: bool = True
    tied_embeddings: bool = True
    dropout: bool = False
    description: str = ""

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def kv_hidden(self) -> int:
        """Width of K (and of V): kv_heads x head_dim."""
        return self.kv_heads * self.head_dim

    @property
    def mlp_matrices(self) -> int:
        """Weight matrices of size hidden x ffn_hidden in the MLP: 2 for GELU, 3 for SwiGLU."""
        return 3 if self.activation == "swiglu" else 2

    def layer_params(self) -> int:
        """Parameters of one transformer layer (attention, MLP, two norms)."""
        h, kv, f = self.hidden, self.kv_hidden, self.ffn_hidden
        attn = h * (h + 2 * kv) + h * h
        mlp = self.mlp_matrices * h * f
        norm = 2 * (2 * h if self.norm == "layernorm" and self.bias else h)
        bias = (h + 2 * kv + h + (f * (self.mlp_matrices - 1)) + h) if self.bias else 0
        return attn + mlp + norm + bias

    def embedding_params(self) -> int:
        pos = self.seq_len * self.hidden if self.position_embedding == "learned" else 0
        return self.vocab * self.hidden + pos

    def final_norm_params(self) -> int:
        return 2 * self.hidden if self.norm == "layernorm" and self.bias else self.hidden

    def lm_head_params(self) -> int:
        return 0 if self.tied_embeddings else self.vocab * self.hidden

    def params(self) -> int:
        """Total trainable parameters (a tied lm_head is counted once)."""
        return (self.layers * self.layer_params() + self.embedding_params()
                + self.final_norm_params() + self.lm_head_params())


MODEL_KEYS = ("preset", "hf_config", "name", "description", "layers", "hidden", "heads", "kv_heads", "ffn_hidden",
              "vocab", "seq_len", "activation", "norm", "position_embedding", "bias", "tied_embeddings", "dropout",
              "source")
_SHAPE_KEYS = ("layers", "hidden", "heads", "kv_heads", "ffn_hidden", "vocab", "seq_len")


def _spec_from_fields(data: Mapping, field: str, base: ModelSpec | None = None) -> ModelSpec:
    """Build a spec from explicit fields; missing ones fall back to `base` (a preset or HF config)."""
    def default(key, fallback=F._MISSING):
        return getattr(base, key) if base is not None else fallback

    hidden = F.integer(data, "hidden", field, default("hidden"), maximum=10**7)
    heads = F.integer(data, "heads", field, default("heads"), maximum=10**5)
    activation = F.choice(data, "activation", field, ACTIVATIONS, default("activation", "gelu"))
    # A changed width or head count invalidates the base's derived sizes.
    kv_default = base.kv_heads if base is not None and "heads" not in data else heads
    ffn_default = base.ffn_hidden if base is not None and "hidden" not in data else (
        4 * hidden if activation == "gelu" else F._MISSING)
    spec = ModelSpec(
        name=F.text(data, "name", field, default("name", "custom")),
        description=F.text(data, "description", field, default("description", "")),
        layers=F.integer(data, "layers", field, default("layers"), maximum=100_000),
        hidden=hidden, heads=heads,
        kv_heads=F.integer(data, "kv_heads", field, kv_default, maximum=10**5),
        ffn_hidden=F.integer(data, "ffn_hidden", field, ffn_default, maximum=10**8),
        vocab=F.integer(data, "vocab", field, default("vocab"), maximum=10**8),
        seq_len=F.integer(data, "seq_len", field, default("seq_len"), maximum=10**8),
        activation=activation,
        norm=F.choice(data, "norm", field, NORMS, default("norm", "layernorm")),
        position_embedding=F.choice(data, "position_embedding", field, POSITIONS,
                                    default("position_embedding", "learned")),
        bias=F.boolean(data, "bias", field, default("bias", True)),
        tied_embeddings=F.boolean(data, "tied_embeddings", field, default("tied_embeddings", True)),
        dropout=F.boolean(data, "dropout", field, default("dropout", False)),
    )
    return check_shapes(spec, field)


def check_shapes(spec: ModelSpec, field: str = "model") -> ModelSpec:
    if spec.hidden % spec.heads:
        raise InputError(f"{field}.heads", spec.heads, f"must divide hidden={spec.hidden}")
    if spec.kv_heads > spec.heads or spec.heads % spec.kv_heads:
        raise InputError(f"{field}.kv_heads", spec.kv_heads, f"must divide heads={spec.heads}")
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


def model_from_dict(data) -> ModelSpec:
    """The scenario's `model` section: {preset: NAME} (fields may override), {hf_config: PATH} or fields."""
    data = F.require_mapping(data, "model")
    F.reject_unknown(data, MODEL_KEYS, "model")
    if data.get("preset") is not None and data.get("hf_config") is not None:
        raise InputError("model.hf_config", data["hf_config"], "give preset or hf_config, not both")
    base = None
    if data.get("preset") is not None:
        base = load_preset(F.text(data, "preset", "model"))
    elif data.get("hf_config") is not None:
        base = load_hf_config(F.text(data, "hf_config", "model"))
    overrides = {k: v for k, v in data.items() if k not in ("preset", "hf_config", "source")}
    if base is not None and not overrides:
        return base
    return _spec_from_fields(overrides, "model", base)


# ------------------------------------------------------------------ Hugging Face import

_HF_ACT = {"silu": "swiglu", "swish": "swiglu", "gelu": "gelu", "gelu_new": "gelu", "gelu_fast": "gelu",
           "gelu_pytorch_tanh": "gelu"}


def load_hf_config(path: str) -> ModelSpec:
    """Import a Hugging Face config.json (Llama, Mistral, Qwen2, GPT-2 keys); no network."""
    field = "model.hf_config"
    p = Path(path)
    try:
        cfg = json.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise InputError(field, path, "file not found") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InputError(field, path, f"expected a JSON config.json ({exc.__class__.__name__})") from None
    cfg = F.require_mapping(cfg, field)
    where = f"{field} {p.name}"
    if "n_embd" in cfg:  # GPT-2 naming
        hidden = F.integer(cfg, "n_embd", where)
        act = cfg.get("activation_function", "gelu_new")
        data = dict(name=p.stem, layers=cfg.get("n_layer"), hidden=hidden, heads=cfg.get("n_head"),
                    ffn_hidden=cfg.get("n_inner") or 4 * hidden, vocab=cfg.get("vocab_size"),
                    seq_len=cfg.get("n_positions") or cfg.get("n_ctx"),
                    activation=_HF_ACT.get(act, act), norm="layernorm", position_embedding="learned", bias=True,
                    tied_embeddings=cfg.get("tie_word_embeddings", True), dropout=bool(cfg.get("resid_pdrop", 0)))
    elif "hidden_size" in cfg:  # Llama, Mistral, Qwen2
        act = cfg.get("hidden_act", "silu")
        heads = cfg.get("num_attention_heads")
        seq = cfg.get("max_position_embeddings")
        data = dict(name=p.stem, layers=cfg.get("num_hidden_layers"), hidden=cfg.get("hidden_size"), heads=heads,
                    kv_heads=cfg.get("num_key_value_heads") or heads, ffn_hidden=cfg.get("intermediate_size"),
                    vocab=cfg.get("vocab_size"), seq_len=seq, activation=_HF_ACT.get(act, act),
                    norm="rmsnorm", position_embedding="rope",
                    # Qwen2's q/k/v biases (h + 2*kv_hidden per layer, < 0.01% of the parameters) are ignored:
                    # `bias` means biases on every linear layer and norm, as in GPT.
                    bias=False,
                    tied_embeddings=bool(cfg.get("tie_word_embeddings", False)),
                    dropout=bool(cfg.get("attention_dropout", 0.0)))
    else:
        raise InputError(field, path, "expected Llama/Mistral/Qwen2 (hidden_size, ...) or GPT-2 (n_embd, ...) keys")
    return _spec_from_fields(data, where)
