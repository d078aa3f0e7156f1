"""Activation checkpointing as the frameworks run it: what each mode keeps for the backward
pass, what it runs again, and what the re-run holds while it lasts.

Modes (`plan.recompute`), per transformer layer of one micro-batch on one device:

- `none`: every operator keeps its saved tensors (workload.py; Korthikanti et al. 2022).
- `selective`: Megatron-LM's core-attention checkpoint. The attention core (QK^T, softmax,
  dropout, AV; or the fused/flash kernel) is wrapped in a checkpoint whatever the kernel,
  so its saved tensors are dropped and its forward re-runs before the backward, the
  context-parallel exchange inside it too. With TransformerEngine's flash/fused attention
  the kernel is re-run although it saves no s x s matrix (NVIDIA/Megatron-LM@dddecd198f
  megatron/core/transformer/attention.py: checkpoint_core_attention =
  recompute_granularity == 'selective', _checkpointed_attention_forward).
- `full`: Megatron-LM's full recomputation (megatron/core/recompute.py and
  transformer_block.py _checkpointed_forward, NVIDIA/Megatron-LM@d98e8a64dd), with
  `plan.recompute_method` and `plan.recompute_num_layers` (N):
  uniform: the layers of a model chunk are checkpointed in groups of N, each group keeps
  its input and is re-run as a whole, so its N layers are rebuilt at once; block: only the
  first N layers of each chunk are checkpointed (one at a time), the others keep
  everything. uniform with N = 1 is torchtitan's full AC as well (ptd_checkpoint_wrapper
  around every block, torchtitan@9dec370 torchtitan/parallelisms/parallelize_llama.py).
- `op-selective`: torchtitan's op-level selective AC (selective_ac_option = 'op', the
  default of its 8B configs): per block a checkpoint policy saves the outputs of the ops in
  its save list, aten.mm except every second one, the SDPA flash/efficient kernels,
  reduce-scatter and the amax ops, and recomputes everything else (torchtitan@9dec370
  torchtitan/parallelisms/parallelize_llama.py _save_list, _custom_policy: the mm counter
  restarts in each block). The block's matmuls in forward order are wq, wk, wv, wo, w1, w3,
  w2 (torchtitan@9dec370 torchtitan/models/llama/model.py: Attention.forward,
  FeedForward.forward = w2(silu(w1(x)) * w3(x)); a GELU MLP has no w3), so the odd ones
  (wq, wv, w1, w2) are saved and the even ones (wk, wo, w3) re-run, with the norms, RoPE,
  the activation and the attention residual they need; with sequence parallelism the
  all-gathers in front of wk and w3 run again (they are not in the save list) while the
  reduce-scatter outputs are kept.

Everything here is derived from the layer's operator list; nothing is a constant per mode.
Sizes may be numpy arrays.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np

from .projections import SEPARATE
from .workload import ATTENTION_CORE, Op, Shard

MODES = ("none", "selective", "full", "op-selective")


def scaled(op: Op, k, name: str | None = None) -> Op:
    """An operator doing the fraction `k` of `op`'s work (one of the projections a fused
    QKV or gate/up GEMM computes at once)."""
    values = {f.name: getattr(op, f.name) for f in fields(Op)}
    for key in ("fwd_flops", "bwd_input_flops", "bwd_weight_flops", "fwd_bytes", "bwd_input_bytes",
                "bwd_weight_bytes", "saved_bytes"):
        values[key] = values[key] * k
    if values["model_flops"] is not None:
        values["model_flops"] = values["model_flops"] * k
    values["pieces"] = tuple(scaled(p, k) for p in op.pieces)
    return Op(**{**values, "name": name or op.name})


def _by_name(ops) -> dict:
    return {op.name: op for op in ops}


def _with_casts(ops, names) -> list:
    """The ops named, with their FP8 cast kernels (fp8.py: NAME.fp8_cast, NAME.fp8_cast_rowwise)."""
    return [op for op in ops if op.name in names or op.name.split(".")[0] in names and ".fp8_cast" in op.name]


# torchtitan's names of the matmuls of each fused workload operator, in forward order
# (torchtitan@820504e torchtitan/models/llama3/model.py: wq, wk, wv, wo; w1, w3, w2)
TITAN_MATMULS = {"qkv": SEPARATE["qkv"], "attn_out": ("wo",), "mlp_gate_up": SEPARATE["mlp_gate_up"],
                 "mlp_up": ("w1",), "mlp_down": ("w2",)}


def block_matmuls(ops) -> list[tuple[str, object, Op]]:
    """torchtitan's Llama block matmuls in forward order: (name, output elements per token
    on this TP rank, the fused workload operator it is part of)."""
    return [(name, width, op) for op in ops if op.name in TITAN_MATMULS
            for name, width in zip(TITAN_MATMULS[op.name], op.linear.widths)]


def _matmul_part(op: Op, name: str, fused: str, share) -> Op:
    """Matmul `name`'s part of fused operator `op`: its own GEMM where the projections run
    separately (projections.py), else the share of the fused one's work (and of its casts)."""
    own = [p for p in op.pieces if p.name == name]
    return own[0] if own else scaled(op, share, name + op.name[len(fused):])


def _op_selective_parts(model, shard: Shard, ops):
    """(saved bytes, re-run ops) of one block under torchtitan's op-level policy."""
    a, tokens = shard.act_bytes, shard.tokens
    byname = _by_name(ops)
    saved = a * shard.replicated_tokens * model.hidden  # the checkpointed block's input
    rerun = []
    for i, (name, width, fused) in enumerate(block_matmuls(ops), start=1):
        if i % 2:  # odd matmuls: output kept
            saved = saved + a * tokens * width
            continue
        share = width / fused.linear.d_out
        rerun += [_matmul_part(op, name, fused.name, share) for op in _with_casts(ops, (fused.name,))]
    attention = [op for op in ops if op.group == ATTENTION_CORE]
    saved = saved + sum(op.saved_bytes for op in attention)  # SDPA's log-sum-exp (and O, below)
    saved = saved + a * tokens * model.q_width / shard.tp  # SDPA's output O
    if shard.sp:  # reduce-scatter outputs of the wo and w2 paths
        saved = saved + 2 * a * shard.replicated_tokens * model.hidden
    elementwise = ("attn_norm", "rope", "attn_residual", "mlp_norm", "swiglu", "gelu")
    rerun += [byname[n] for n in elementwise if n in byname]
    return saved, rerun


@dataclass(frozen=True)
class LayerCheckpoint:
    """One recomputed layer of one micro-batch on one device under a mode."""

    saved_bytes: object  # kept for the backward pass
    rerun: tuple  # operators whose forward runs again before the layer's backward
    tp_rerun: float  # fraction of the layer's forward TP collectives run again
    cp_rerun: bool  # the context-parallel exchange runs again
    rebuilt_bytes: object  # held while the re-run layer's backward runs


def layer_checkpoint(model, shard: Shard, mode: str, ops) -> LayerCheckpoint:
    """What a checkpointed layer keeps and re-runs (for `full`: one layer of a group)."""
    everything = sum(op.saved_bytes for op in ops)
    if mode == "none":
        return LayerCheckpoint(everything, (), 0.0, False, 0.0)
    if mode == "full":
        return LayerCheckpoint(shard.act_bytes * shard.replicated_tokens * model.hidden, tuple(ops), 1.0, True,
                               everything)
    if mode == "selective":
        core = [op for op in ops if op.group == ATTENTION_CORE]
        kept = sum(op.saved_bytes for op in core)
        return LayerCheckpoint(everything - kept, tuple(core), 0.0, True, kept)
    if mode == "op-selective":
        saved, rerun = _op_selective_parts(model, shard, ops)
        return LayerCheckpoint(saved, tuple(rerun), 0.5 if shard.sp else 1.0, False, everything)
    raise ValueError(mode)


@dataclass(frozen=True)
class ChunkCheckpoint:
    """A model chunk of `layers` layers of one device under the plan's recomputation."""

    saved_bytes: object  # kept per micro-batch
    rerun_layers: object  # layers whose re-run ops run again per micro-batch
    rebuilt_bytes: object  # the largest set of re-run activations alive at once


def chunk_checkpoint(plan, layer: LayerCheckpoint, plain_bytes, layers) -> ChunkCheckpoint:
    """Megatron's uniform/block methods over a chunk; layer-wise modes apply to every layer.
    `plain_bytes`: what one layer keeps without recomputation."""
    if plan.recompute != "full":
        rerun = layers if layer.rerun else 0
        return ChunkCheckpoint(layers * layer.saved_bytes, rerun + 0.0 * layer.saved_bytes,
                               layer.rebuilt_bytes * (np.asarray(layers) > 0))
    n = np.minimum(plan.recompute_num_layers, layers)
    if plan.recompute_method == "block":
        saved = n * layer.saved_bytes + (layers - n) * plain_bytes
        return ChunkCheckpoint(saved, n, np.where(n > 0, plain_bytes, 0.0))
    groups = np.ceil(np.asarray(layers) / np.maximum(n, 1))
    return ChunkCheckpoint(groups * layer.saved_bytes, layers + 0.0 * n, n * plain_bytes)


def rerun_flops(layer: LayerCheckpoint):
    """Executed FLOPs of one layer's re-run (hardware FLOPs)."""
    return sum(op.fwd_flops for op in layer.rerun)
