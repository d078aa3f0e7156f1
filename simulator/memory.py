"""Per-device memory: weights, gradients, optimizer states, activations, other.

- Model states (Rajbhandari et al. 2020, ZeRO): mixed-precision Adam keeps 16-bit
  weights (2 B), gradients (2 B in DeepSpeed; 4 B fp32 "main grads" in Megatron-LM, the
  default here, `plan.grad_precision`), and fp32 master weights, momentum and variance
  (12 B): 16 B/param with 16-bit gradients, 18 B with fp32 ones. Pure fp32 training keeps
  4 + 4 + 8. ZeRO stage 1 shards the optimizer states over the data-parallel group,
  stage 2 also the gradients, stage 3 also the weights. Megatron-LM replicates weights
  over context-parallel ranks too, so the sharding group is dp·cp.
- Activations: the saved tensors of the workload's operators (workload.py; Korthikanti
  et al. 2022) times the micro-batches each pipeline stage holds in flight: all m for
  GPipe, p - i for stage i in 1F1B and ZB-H1, and for interleaved 1F1B the warm-up
  count of Megatron-LM's schedule, 2(p - i - 1) + (v - 1)p + 1 model chunks of L/(pv)
  layers, which for stage 0 is Korthikanti's factor (1 + (p-1)/(pv)) on p micro-batches.
  Full recomputation keeps only each layer's input and rebuilds one layer at a time.
- Other: the framework's reserve (a profile parameter) and communication buffers.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .hardware import Cluster
from .model import ModelSpec
from .plan import Plan
from .workload import ATTENTION_CORE, Shard, embedding_ops, head_ops, layer_ops


@dataclass(frozen=True)
class StageMemory:
    stage: int
    weights: float
    gradients: float
    optimizer: float
    activations: float
    other: float

    @property
    def total(self) -> float:
        return self.weights + self.gradients + self.optimizer + self.activations + self.other

    def as_dict(self) -> dict:
        return {"weights": self.weights, "gradients": self.gradients, "optimizer": self.optimizer,
                "activations": self.activations, "other": self.other}


def weight_bytes_per_param(precision: str) -> float:
    """16-bit weights for mixed precision; fp8 training (Transformer Engine) adds an fp8 copy."""
    return {"fp32": 4.0, "tf32": 4.0, "bf16": 2.0, "fp16": 2.0, "fp8": 3.0}[precision]


def grad_bytes_per_param(plan: Plan) -> float:
    if plan.precision in ("fp32", "tf32"):
        return 4.0
    return 4.0 if plan.grad_precision == "fp32" else 2.0


def optimizer_bytes_per_param(precision: str) -> float:
    """Adam: fp32 momentum and variance, plus an fp32 master copy under mixed precision."""
    return 8.0 if precision in ("fp32", "tf32") else 12.0


def layer_params_local(model: ModelSpec, tp) -> float:
    """Parameters of one layer held by one TP rank (Megatron column/row-parallel split).

    Matrices and column-parallel biases are split t ways; norms and the row-parallel
    biases are replicated; KV projections are replicated when tp > kv_heads.
    """
    h, f, d = model.hidden, model.ffn_hidden, model.head_dim
    kv_local = np.maximum(model.kv_heads / tp, 1.0) * d
    attn = h * (h / tp + 2 * kv_local) + h * h / tp
    mlp = model.mlp_matrices * h * f / tp
    norm = 2 * (2 * h if model.norm == "layernorm" and model.bias else h)
    bias = (h / tp + 2 * kv_local + (model.mlp_matrices - 1) * f / tp + 2 * h) if model.bias else 0.0
    return attn + mlp + norm + bias


def stage_params(model: ModelSpec, plan: Plan, stage) -> float:
    """Parameters held by one device of pipeline stage `stage` (before ZeRO sharding).
    Broadcast-safe: plan sizes and `stage` may be numpy arrays."""
    p, t = plan.pp, plan.tp
    params = model.layers / p * layer_params_local(model, t)
    first = np.asarray(stage == 0)
    last = np.asarray(stage == p - 1)
    pos = model.seq_len * model.hidden if model.position_embedding == "learned" else 0
    params = params + first * (model.vocab * model.hidden / t + pos)
    params = params + last * model.final_norm_params()
    # Megatron keeps a copy of tied word embeddings on the last stage when pp > 1.
    head_copy = last & (np.asarray(not model.tied_embeddings) | (np.asarray(p) > 1))
    params = params + head_copy * (model.vocab * model.hidden / t)
    return params


def _sharded_states(params, plan: Plan) -> tuple:
    """(weights, gradients, optimizer) bytes of `params` after ZeRO sharding over dp·cp."""
    shard = plan.dp * plan.cp
    z = plan.zero_stage
    w = params * weight_bytes_per_param(plan.precision)
    g = params * grad_bytes_per_param(plan)
    o = params * optimizer_bytes_per_param(plan.precision)
    if z >= 1:
        o = o / shard
    if z >= 2:
        g = g / shard
    if z >= 3:
        w = w / shard
    return w, g, o


def model_state_bytes(params, plan: Plan) -> tuple:
    """(weights, gradients, optimizer) bytes on a device holding `params` before sharding."""
    w, g, o = _sharded_states(params, plan)
    if plan.offload.optimizer != "none":
        o = 0.0 * o
        if plan.zero_stage >= 2:  # ZeRO-Offload moves the partitioned gradients to the host as well
            g = 0.0 * g
    if plan.offload.params != "none":
        w = 0.0 * w
    return w, g, o


def host_bytes(model: ModelSpec, plan: Plan, stage):
    """Host (CPU) memory taken by one device of `stage` for what it offloads to `cpu`.

    ZeRO-Offload (Ren et al. 2021) keeps the optimizer states, and with ZeRO-2/3 the
    partitioned gradients, in host memory; ZeRO-Infinity (Rajbhandari et al. 2021) the
    weights; activation offload the activations beyond the two micro-batches kept on the
    device. NVMe targets use host memory only for staging buffers, not counted.
    """
    w, g, o = _sharded_states(stage_params(model, plan, stage), plan)
    off = plan.offload
    host = 0.0
    if off.optimizer == "cpu":
        host = host + o + (g if plan.zero_stage >= 2 else 0.0)
    if off.params == "cpu":
        host = host + w
    if off.activations == "cpu":
        extra = np.maximum(0.0, in_flight(plan, stage) - 2)
        host = host + extra * microbatch_activation_bytes(model, plan)
    return host


def host_bytes_per_device(model: ModelSpec, plan: Plan):
    """Host memory per device, sized for the hungriest stage (first or last): a node's
    devices may hold any stage. Broadcast-safe."""
    return np.maximum(host_bytes(model, plan, 0), host_bytes(model, plan, plan.pp - 1))


def in_flight(plan: Plan, stage):
    """Micro-batches (in units of L/p layers) whose activations stage `stage` holds at its peak.
    Broadcast-safe. With p = 1, 1F1B and ZB-H1 hold min(1, m) = 1 micro-batch."""
    p, m = plan.pp, plan.microbatches
    if plan.schedule == "gpipe":
        return m
    if plan.schedule == "interleaved":
        v = plan.vpp
        chunks = np.minimum(2 * (p - stage - 1) + (v - 1) * p + 1, m * v)
        return chunks / v
    return np.minimum(p - stage, m)


def shard_of(plan: Plan, model: ModelSpec) -> Shard:
    return Shard(micro_batch=plan.micro_batch, tp=plan.tp, cp=plan.cp, sp=plan.sp,
                 flash_attention=plan.flash_attention, act_bytes=4 if plan.precision in ("fp32", "tf32") else 2)


def layer_activation_bytes(model: ModelSpec, plan: Plan, recompute: str | None = None):
    """Bytes one layer keeps for the backward pass of one micro-batch, under a recompute mode."""
    recompute = plan.recompute if recompute is None else recompute
    shard = shard_of(plan, model)
    ops = layer_ops(model, shard)
    if recompute == "full":
        tokens = plan.micro_batch * model.seq_len / plan.cp
        rep = tokens / plan.tp if plan.sp else tokens
        return shard.act_bytes * rep * model.hidden
    if recompute == "selective" and not plan.flash_attention:
        return sum(op.saved_bytes for op in ops if op.group != ATTENTION_CORE)
    return sum(op.saved_bytes for op in ops)


def microbatch_activation_bytes(model: ModelSpec, plan: Plan):
    """Bytes the L/p layers of a pipeline stage keep for the backward pass of one micro-batch."""
    return model.layers / plan.pp * layer_activation_bytes(model, plan)


def loss_backward_transient_bytes(model: ModelSpec, plan: Plan):
    """Bytes the loss's backward pass holds on top of the saved tensors, at its start.

    Cross-entropy's backward materialises the fp32 gradient of the log-probabilities and
    then of the logits (4 B each per logit, vocab split over TP) while the saved softmax is
    still live (PyTorch: nll_loss_backward, then _log_softmax_backward_data); both are
    freed once the lm_head's backward has consumed them. Found comparing torch runs on CPU
    with predictions (docs/calibration.md): two logits-sized fp32 buffers, as derived.
    """
    tokens = plan.micro_batch * model.seq_len / plan.cp
    return 2 * 4 * tokens * model.vocab / plan.tp


def activation_bytes(model: ModelSpec, plan: Plan, stage: int):
    """Peak bytes of saved activations (and transients) on a device of pipeline stage `stage`.

    The backward pass frees each operator's saved tensors as it passes it. So on the last
    stage the peak is at the start of the backward pass (everything saved, plus the loss's
    transient gradients), except under full recomputation, where the rebuilt layer comes
    after the head's tensors are gone and the peak is the larger of the two moments.
    """
    shard = shard_of(plan, model)
    flight = in_flight(plan, stage)
    if plan.offload.activations != "none":
        flight = np.minimum(flight, 2)  # current micro-batch plus one being copied
    acts = microbatch_activation_bytes(model, plan) * flight
    first = np.asarray(stage == 0)
    acts = acts + first * (sum(op.saved_bytes for op in embedding_ops(model, shard)) * np.ceil(flight))
    return acts + backward_extra_bytes(model, plan, np.asarray(stage == plan.pp - 1))


def backward_extra_bytes(model: ModelSpec, plan: Plan, last):
    """Bytes on top of the in-flight micro-batches' saved layer activations at a stage's
    peak: the layer rebuilt by full recomputation, and on the last stage (`last`) the head's
    saved tensors plus the loss's backward transient, whichever moment is larger."""
    shard = shard_of(plan, model)
    rebuilt = layer_activation_bytes(model, plan, "none") if plan.recompute == "full" else 0.0  # one layer
    head = sum(op.saved_bytes for op in head_ops(model, shard)) + loss_backward_transient_bytes(model, plan)
    return np.where(last, np.maximum(rebuilt, head), rebuilt)


def buffer_bytes(model: ModelSpec, plan: Plan, cluster: Cluster):
    """Framework reserve plus communication and gather buffers."""
    other = cluster.accelerator.framework_overhead_bytes
    layer = layer_params_local(model, plan.tp)
    if plan.zero_stage >= 3 or plan.offload.params != "none":
        # FSDP/ZeRO-3 gather one layer's weights and prefetch the next.
        other = other + 2 * layer * weight_bytes_per_param(plan.precision)
    if plan.zero_stage >= 2 or plan.offload.optimizer != "none":
        # a layer's unsharded gradients wait for their reduce-scatter
        other = other + layer * grad_bytes_per_param(plan)
    return other


def stage_memory_parts(model: ModelSpec, plan: Plan, cluster: Cluster, stage) -> StageMemory:
    """Memory of a device of pipeline stage `stage`; fields broadcast over numpy plans and stages."""
    w, g, o = model_state_bytes(stage_params(model, plan, stage), plan)
    return StageMemory(stage=stage, weights=w, gradients=g, optimizer=o,
                       activations=activation_bytes(model, plan, stage),
                       other=buffer_bytes(model, plan, cluster))


def memory_by_stage(model: ModelSpec, plan: Plan, cluster: Cluster) -> list[StageMemory]:
    """Memory of every pipeline stage's devices (DP and TP ranks of a stage are alike),
    computed for all stages at once (the formulas broadcast over the stage index)."""
    stages = np.arange(plan.pp)
    parts = stage_memory_parts(model, plan, cluster, stages)
    cols = {k: np.broadcast_to(np.asarray(getattr(parts, k), dtype=float), stages.shape)
            for k in ("weights", "gradients", "optimizer", "activations", "other")}
    return [StageMemory(stage=i, **{k: float(v[i]) for k, v in cols.items()}) for i in range(plan.pp)]
