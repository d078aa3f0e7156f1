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
  `plan.recompute_modules` names what Megatron-Core checkpoints selectively
  (transformer_config.py recompute_modules, NVIDIA/Megatron-LM@d98e8a64dd; default
  core_attn). Normal checkpoints keep the module's input and drop what its operators saved,
  re-running their forward before the backward: `core_attn` as above; `mlp`, a dense layer's
  MLP with the norm TransformerEngine fuses into its first linear and its TP collectives
  (transformer_layer.py recompute_mlp; not MoE layers); `moe`, an MoE layer's router,
  dispatch, experts, combine and shared experts, its all-to-alls too (moe_layer.py
  moe_layer_recompute); `shared_experts`, their MLP and TP collectives. Output-discarding
  checkpoints (tensor_parallel.CheckpointWithoutOutput) run a module without keeping its
  output and re-run it before its readers' backward, so what the readers saved of that output
  goes: `moe_act`, the experts' activation (experts.py; the second expert GEMM's input);
  `layernorm`, the norms that are modules of their own (transformer_layer.py: an MoE layer's
  pre-MLP norm, read by the router and the shared experts; MLA's input norm, read by both
  down-projections; TransformerEngine fuses the other norms into the linears after them,
  IdentityOp in gpt_layer_specs.py, so they are unaffected); `mla_up_proj`, MLA's latent
  norms, up-projections and RoPE with the latent all-gathers before them
  (multi_latent_attention.py qkv_up_checkpoint: Q, K and V are dropped after the attention
  core's forward).
- `full`: Megatron-LM's full recomputation (megatron/core/recompute.py and
  transformer_block.py _checkpointed_forward, NVIDIA/Megatron-LM@d98e8a64dd), with
  `plan.recompute_method` and `plan.recompute_num_layers` (N):
  uniform: the layers of a model chunk are checkpointed in groups of N, each group keeps
  its input and is re-run as a whole, so its N layers are rebuilt at once; block: only the
  first N layers of each chunk are checkpointed (one at a time), the others keep
  everything. uniform with N = 1 is torchtitan's full AC as well (ptd_checkpoint_wrapper
  around every block, torchtitan@9dec370 torchtitan/parallelisms/parallelize_llama.py).
  Megatron's CheckpointFunction (tensor_parallel/random.py), TransformerEngine's and
  DeepSpeed's checkpoints are reentrant and re-run the layer's forward whole. torchtitan's
  wrapper is torch.utils.checkpoint without reentrance, which stops re-running as soon as
  every tensor the backward reads is rebuilt (early_stop, its default: torch 2.13
  torch/utils/checkpoint.py _StopRecomputationError), and compiled, the partitioner re-runs
  only what the backward reads: `plan.recompute_early_stop` (early_stop_rerun).
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
  reduce-scatter outputs are kept. In torchtitan's MoE layer (titanmoe.py) the router's gate and
  the grouped GEMMs run again with every op around them, the shared experts' mms continue the
  count, and the all-to-all outputs are kept where the model's save list names them.

Everything here is derived from the layer's operator list; nothing is a constant per mode.
Sizes may be numpy arrays.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np

from .fp8 import is_cast
from .projections import SEPARATE
from .moe import SHARED_EXPERTS
from .workload import ATTENTION_CORE, Op, Shard

MODES = ("none", "selective", "full", "op-selective")
# Megatron-Core's selective recompute modules llmsim models (transformer_config.py)
MODULES = ("core_attn", "mlp", "moe", "moe_act", "shared_experts", "layernorm", "mla_up_proj")


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
    """The ops named, with their cast kernels (fp8.py: NAME.fp8_cast, NAME.nvfp4_cast, ...)."""
    return [op for op in ops if op.name in names or op.name.split(".")[0] in names and is_cast(op)]


# torchtitan's names of the matmuls of each fused workload operator, in forward order
# (torchtitan@820504e torchtitan/models/llama3/model.py: wq, wk, wv, wo; w1, w3, w2)
TITAN_MATMULS = {"qkv": SEPARATE["qkv"], "attn_out": ("wo",), "mlp_gate_up": SEPARATE["mlp_gate_up"],
                 "mlp_up": ("w1",), "mlp_down": ("w2",), "shared_mlp_gate_up": SEPARATE["shared_mlp_gate_up"],
                 "shared_mlp_down": ("shared_w2",),
                 # DeepSeek-V3's latent attention (models/deepseek_v3/model/model.py Attention)
                 "mla_q_down": ("wq_a",), "mla_q_up": ("wq_b",), "mla_q": ("wq",), "mla_kv_down": ("wkv_a",),
                 "mla_kv_up": ("wkv_b",)}


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


def _op_selective_parts(model, shard: Shard, ops, experts=None):
    """(saved bytes, re-run ops, whether the MoE dispatch runs again) of one block under
    torchtitan's op-level policy; an MoE layer's (titanmoe.py) with `experts`."""
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
    saved = saved + a * tokens * model.attn_out_width / shard.tp  # SDPA's output O
    if shard.sp:  # reduce-scatter outputs of the wo and w2 paths
        saved = saved + 2 * a * shard.replicated_tokens * model.hidden
    elementwise = ("attn_norm", "qk_norm", "mla_q_norm", "mla_kv_norm", "rope", "mla_qk_cat", "attn_post_norm",
                   "attn_residual", "mlp_norm", "swiglu", "gelu", "mlp_post_norm")
    rerun += [byname[n] for n in elementwise if n in byname]
    if "router" not in byname:
        return saved, rerun, False
    # torchtitan's MoE layer: the routed experts' grouped GEMMs and every op around them run
    # again, the shared experts' mms counted with the block's above; the all-to-all outputs
    # are kept where the model's save list names all_to_all_single
    from .titanmoe import all_to_all_output_bytes
    rerun += [op for op in _between(ops, "mlp_norm", "mlp_residual") if op.name not in TITAN_MATMULS]
    if experts.options.op_sac_saves_all_to_all:
        return saved + all_to_all_output_bytes(model, shard, experts), rerun, False
    return saved, rerun, True


def _between(ops, first: str, last: str) -> list:
    """The operators after the one named `first` and before the one named `last` (a block of
    the layer: its casts, separate projections and ring merges included)."""
    names = [op.name for op in ops]
    if first not in names:  # no such block (a model whose layers are all MoE has no dense-MLP layer)
        return []
    return ops[names.index(first) + 1:names.index(last)]


@dataclass(frozen=True)
class _Module:
    rerun: list  # operators whose forward runs again
    dropped: list  # operators whose saved tensors are not kept
    tp_blocks: tuple = ()  # whose forward TP collectives run again (tp_rerun_fraction)
    ep: bool = False  # the MoE dispatch and combine run again
    cp: bool = False  # the context-parallel exchange runs again


def _module(model, ops, module: str) -> _Module:
    """What selective recomputation of `module` re-runs and drops in this layer (nothing
    where the layer has no such module); see the module docstring."""
    if not ops:  # the dense-MLP layer of a model whose layers are all MoE
        return _Module([], [])
    byname = _by_name(ops)
    moe_layer = "router" in byname
    # the MLP module: after its input norm (the attention's residual add where the layer has no
    # pre-norms) up to its output norm or residual add
    mlp = _between(ops, "mlp_norm" if "mlp_norm" in byname else "attn_residual",
                   "mlp_post_norm" if "mlp_post_norm" in byname else "mlp_residual")
    if module == "core_attn":
        core = [op for op in ops if op.group == ATTENTION_CORE]
        return _Module(core, core, cp=True)
    if module == "mlp" and not moe_layer:
        return _Module([byname[n] for n in ("mlp_norm",) if n in byname] + mlp, mlp, ("mlp",))
    if module == "moe" and moe_layer:
        return _Module(mlp, [op for op in mlp if op.name != "router"], ("shared",) if model.shared_experts else (),
                       ep=True)
    if module == "moe_act" and moe_layer:
        # from Megatron-Core 0.13 the probabilities' multiply after a non-SwiGLU activation is in
        # the checkpointed function (experts.py bias_act_func): re-run, and its saved output dropped
        scale = [byname[n] for n in ("expert_probs_scale",) if n in byname]
        return _Module(_with_casts(ops, ("expert_" + model.activation,)) + scale, [byname["expert_fc2"], *scale])
    if module == "shared_experts" and moe_layer and model.shared_experts:
        shared = [op for op in ops if op.group == SHARED_EXPERTS]
        return _Module(shared, shared, ("shared",))
    if module == "layernorm":
        readers = []
        if moe_layer:  # the router and the shared experts' first linear read the pre-MLP norm
            readers += [byname["router"]] + [op for op in mlp if op.group == SHARED_EXPERTS][:1]
        rerun = [byname["mlp_norm"]] if moe_layer else []
        if model.attention == "mla":  # MLA's input norm: read by both down-projections
            readers += [byname[n] for n in ("mla_q_down", "mla_q", "mla_kv_down") if n in byname]
            rerun.append(byname["attn_norm"])
        return _Module(rerun, readers)
    if module == "mla_up_proj" and model.attention == "mla":
        up = ("mla_q_norm", "mla_q_up", "mla_q", "mla_kv_norm", "mla_kv_up", "rope")
        # the latents are the checkpoint's inputs (kept); without q_lora_rank the query
        # projection reads the kept hidden state and drops only its output
        return _Module(_with_casts(ops, up), [byname[n] for n in ("mla_q_up", "mla_kv_up") if n in byname],
                       ("mla_up",))
    return _Module([], [])


@dataclass(frozen=True)
class LayerCheckpoint:
    """One recomputed layer of one micro-batch on one device under a mode."""

    saved_bytes: object  # kept for the backward pass
    rerun: tuple  # operators whose forward runs again before the layer's backward
    tp_rerun: float  # fraction of the layer's forward TP collectives run again
    cp_rerun: bool  # the context-parallel exchange runs again
    rebuilt_bytes: object  # held while the re-run layer's backward runs
    tp_rerun_blocks: tuple = ()  # and the forward TP collectives of these blocks (tp_rerun_fraction)
    ep_rerun: float = 0.0  # fraction of the MoE dispatch and combine run again


def early_stop_rerun(model, shard: Shard, ops) -> tuple:
    """(operators re-run, fraction of the layer's forward TP seconds re-run) of a layer whose
    checkpoint stops once everything its backward reads is rebuilt (plan.recompute_early_stop).

    The re-run ends with the last operator that keeps a tensor. An aten operator packs its
    inputs for the backward before its kernel runs (autograd's generated VariableType code
    saves them first), and the recomputation stops at the last pack, so a linear that keeps
    only its input and is the last to keep anything (the MLP's down projection) does not run
    again, nor what follows it: the residual add and, under TP, the MLP's output all-reduce or
    reduce-scatter (half of the MLP's collectives with sequence parallelism, all of them
    without; the MLP holds half the layer's, tp_layer_comm_s). The low-precision casts of that
    linear's input run: they make the tensor it keeps. Measured with torch on a CPU
    (benchmarks/bench_recompute_early_stop.py, docs/calibration/recompute-early-stop-cpu-epyc-
    zen4.txt): under full recomputation the down projections' re-run calls add 1.3 ms of GEMM
    time to their forward's 12.9, the other linears' their forward's time again; without early
    stop the down projections' too (26.1 ms). Where the last keeper is not that linear
    (post-norms after it, an MoE layer's weighting) the whole forward up to it re-runs,
    collectives counted whole; a parallel block's shared output collective is counted as
    re-run."""
    keeps = [i for i, op in enumerate(ops) if np.any(np.asarray(op.saved_bytes) > 0)]
    if not keeps:
        return (), 0.0
    last = ops[keeps[-1]]
    if last.linear is None or is_cast(last):
        return tuple(ops[:keeps[-1] + 1]), 1.0
    rerun = tuple(ops[:keeps[-1]]) + tuple(
        op for op in ops[keeps[-1] + 1:] if is_cast(op) and op.name.split(".")[0] == last.name)
    if last.name != "mlp_down" or model.parallel_block:
        return rerun, 1.0
    skipped = 0.5 * np.where(shard.sp, 0.5, 1.0)
    return rerun, 1.0 - (skipped if np.ndim(skipped) else float(skipped))


def layer_checkpoint(model, shard: Shard, mode: str, ops, modules: tuple = ("core_attn",),
                     experts=None, early_stop: bool = False) -> LayerCheckpoint:
    """What a checkpointed layer keeps and re-runs (for `full`: one layer of a group;
    `modules`: what `selective` checkpoints; `experts`: an MoE layer's moe.ExpertShard, which
    op-level AC of torchtitan's MoE layer needs; `early_stop`: full recomputation stops once
    the backward's tensors are rebuilt, early_stop_rerun)."""
    everything = sum(op.saved_bytes for op in ops)
    if mode == "none":
        return LayerCheckpoint(everything, (), 0.0, False, 0.0)
    if mode == "full":
        rerun, tp_rerun = early_stop_rerun(model, shard, ops) if early_stop else (tuple(ops), 1.0)
        return LayerCheckpoint(shard.act_bytes * shard.replicated_tokens * model.hidden, rerun, tp_rerun, True,
                               everything, ep_rerun=1.0)
    if mode == "selective":
        parts = [_module(model, ops, m) for m in modules]
        chosen = {id(op) for part in parts for op in part.rerun}
        rerun = [op for op in ops if id(op) in chosen]  # in the layer's order, each once
        dropped = [sum(op.saved_bytes for op in p.dropped) for p in parts]
        blocks = tuple(b for p in parts for b in p.tp_blocks)
        # modules are rebuilt one at a time, each just before its backward
        return LayerCheckpoint(everything - sum(dropped), tuple(rerun), 0.0, any(p.cp for p in parts),
                               np.maximum.reduce(np.broadcast_arrays(0.0, *dropped)), blocks,
                               float(any(p.ep for p in parts)))
    if mode == "op-selective":
        saved, rerun, dispatch = _op_selective_parts(model, shard, ops, experts)
        return LayerCheckpoint(saved, tuple(rerun), 0.5 if shard.sp else 1.0, False, everything,
                               ep_rerun=float(dispatch))
    raise ValueError(mode)


def plan_checkpoint(model, shard: Shard, plan, ops, experts=None) -> LayerCheckpoint:
    """layer_checkpoint under the plan's recomputation: its mode, Megatron-Core's modules and
    torch's early stop."""
    return layer_checkpoint(model, shard, plan.recompute, ops, plan.recompute_modules, experts,
                            plan.recompute_early_stop)


def tp_rerun_fraction(checkpoint: LayerCheckpoint, block_s: dict, layer_s):
    """The fraction of a layer's forward TP seconds `layer_s` its recomputation runs again:
    the checkpoint's own and that of the blocks it re-runs (`block_s`: forward seconds of the
    layer's "mlp", "shared" and "mla_up" collectives)."""
    blocks = sum(block_s.get(b, 0.0) for b in checkpoint.tp_rerun_blocks)
    layer_s = np.asarray(layer_s, dtype=float)
    return checkpoint.tp_rerun + np.where(layer_s > 0, blocks / np.where(layer_s > 0, layer_s, 1.0), 0.0)


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
