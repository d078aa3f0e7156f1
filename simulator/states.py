"""Model states: parameters per device, bytes per parameter, ZeRO sharding, offload, Adam.

- Bytes per parameter (Rajbhandari et al. 2020, ZeRO): mixed-precision Adam keeps 16-bit
  weights (2 B), gradients (2 B in DeepSpeed; 4 B fp32 "main grads" in Megatron-LM, the
  default here, `plan.grad_precision`), and fp32 master weights, momentum and variance
  (12 B): 16 B/param with 16-bit gradients, 18 B with fp32 ones. Pure fp32 training keeps
  4 + 4 + 8. FP8 training keeps 16-bit weights too; the FP8 copies of the linear weights
  that TransformerEngine keeps on top (or its FP8 primary weights) are fp8.py's.
- fp32 parameters (`plan.fp32_params`): the model is kept in fp32 and cast to 16 bits where
  the GEMMs read it, so the parameter is the optimizer's master copy: 4 B weights, no 4 B
  master in the optimizer's 12, 16 B/param with fp32 gradients. FSDP2 with a 16-bit
  param_dtype works so (torchtitan builds the model in fp32, torchtitan@9dec370 train.py
  model.to_empty, and shards it with MixedPrecisionPolicy(param_dtype=bf16,
  reduce_dtype=fp32), parallelisms/parallelize_llama.py apply_fsdp: the fp32 shard is what
  the optimizer updates and what is cast to bf16 for the all-gather), as does torch.autocast
  over fp32 parameters. The all-gathers still move the 16-bit weights.
- ZeRO stage 1 shards the optimizer states over the ranks that hold the same weights
  (dp x cp in Megatron-LM; one replica's of them under hybrid sharding: dims.zero_group_size),
  stage 2 also the gradients, stage 3 also the weights.
- Offload (ZeRO-Offload, Ren et al. 2021; ZeRO-Infinity, Rajbhandari et al. 2021): the
  optimizer states, and with ZeRO-2/3 the partitioned gradients, live on the host; ZeRO-
  Infinity also the weights. Offloaded to NVMe they take no host memory but staging buffers.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .compute import memory_bound_time
from .hardware import Accelerator
from .model import ModelSpec

FULL_PRECISION = ("fp32", "tf32")
FP32_BYTES = 4


def activation_bytes(precision: str) -> int:
    """Bytes per activation element: 4 in full precision, else 2 (16-bit activations, also
    between FP8 linears)."""
    return FP32_BYTES if precision in FULL_PRECISION else 2


@dataclass(frozen=True)
class BytesPerParam:
    weight: float
    grad: float
    optimizer: float  # Adam: momentum and variance, plus the fp32 master copy under mixed precision
    stored_weight: float | None = None  # weights kept between steps when not `weight` (fp32 parameters)
    weight_is_master: bool = False  # the optimizer reads and writes the kept weight as (part of) its master copy

    @property
    def kept_weight(self) -> float:
        """Bytes of a weight held between steps (`weight`: as the GEMMs read and the all-gathers move it)."""
        return self.weight if self.stored_weight is None else self.stored_weight


def bytes_per_param(precision: str, grad_precision: str, optimizer_precision: str = "fp32",
                    fp32_params: bool = False, master_weights: str | None = None) -> BytesPerParam:
    """`optimizer_precision: bf16` is Apex DistributedFusedAdam with dtype=bf16 (NeMo's
    optim.dtype): its parameter copy, exp_avg and exp_avg_sq shards are all bf16, 3 x 2 B
    (NVIDIA/apex@d571f3ee apex/contrib/optimizers/distributed_fused_adam.py StateBucket).
    `bf16-moments` is Megatron-Core's precision-aware optimizer with exp_avg and exp_avg_sq in
    bf16 and fp32 main parameters, 4 + 2 + 2 B (NVIDIA/Megatron-LM@d98e8a64dd
    megatron/core/optimizer/optimizer_config.py use_precision_aware_optimizer, exp_avg_dtype,
    exp_avg_sq_dtype, main_params_dtype; TransformerEngine's FusedAdam keeps the states).
    `fp32_params`: the fp32 parameters are the master copy (the module's docstring).

    `master_weights` (plan.master_weights): `remainders` keeps the fp32 master copy as the 16
    bits the bf16 weight lacks, 2 B where the copy took 4 (an int16 shard beside the moments:
    NVIDIA/apex@6424da3b apex/contrib/optimizers/distributed_fused_adam.py StateBucket
    param_remainders_shard, which NeMo's distributed_fused_adam keeps for bf16 weights and fp32
    states, NVIDIA/NeMo@8cfedd7203 megatron_base_model.py setup_optimization; TransformerEngine's
    FusedAdam store_param_remainders, which Megatron-Core's precision-aware optimizer asks for,
    NVIDIA/Megatron-LM@d98e8a64dd megatron/core/optimizer/optimizer_config.py). `none`: no copy,
    the optimizer updates the bf16 weights with bf16 moments (Apex's store_params false, which
    NeMo sets where the optimizer's dtype is the weights'): 4 B. Either way the optimizer step
    reads the weight it writes."""
    full = precision in FULL_PRECISION
    weight = {"fp32": 4.0, "tf32": 4.0, "bf16": 2.0, "fp16": 2.0, "fp8": 2.0, "mxfp8": 2.0, "nvfp4": 2.0}[precision]
    grad = 4.0 if full or grad_precision == "fp32" else 2.0
    if fp32_params and not full:
        return BytesPerParam(weight=weight, grad=grad, optimizer=8.0, stored_weight=4.0, weight_is_master=True)
    optimizer = 8.0 if full else {"fp32": 12.0, "bf16": 6.0, "bf16-moments": 8.0}[optimizer_precision]
    if master_weights is not None:
        return BytesPerParam(weight=weight, grad=grad, optimizer=optimizer - 2.0, weight_is_master=True)
    return BytesPerParam(weight=weight, grad=grad, optimizer=optimizer)


def layer_params_local(model: ModelSpec, tp) -> object:
    """Parameters of one dense-MLP layer held by one TP rank (Megatron column/row-parallel
    split): its attention, its MLP of ffn_hidden and its norms (replicated)."""
    return attention_params_local(model, tp) + mlp_params_local(model, model.ffn_hidden, tp) + \
        model.layer_norm_params()


def attention_params_local(model: ModelSpec, tp) -> object:
    """One attention block on a TP rank: the Q, K, V and output matrices and the
    column-parallel biases split t ways, the output's row-parallel bias replicated, K and V
    replicated where tp > kv_heads (MLA: mla.params_local)."""
    if model.attention == "mla":
        from .mla import params_local
        return params_local(model, tp)
    h, d = model.hidden, model.head_dim
    kv_local = np.maximum(model.kv_heads / tp, 1.0) * d
    q_local = model.heads / tp * d
    bias = (q_local + 2 * kv_local + h) if model.bias else q_local + 2 * kv_local if model.qkv_bias else 0.0
    return h * (q_local + 2 * kv_local) + q_local * h + bias


def mlp_params_local(model: ModelSpec, width, tp) -> object:
    """One MLP of intermediate size `width` split over `tp`: column- and row-parallel
    matrices, column biases split, the row-parallel bias replicated."""
    m, h = model.mlp_matrices, model.hidden
    return m * h * width / tp + (((m - 1) * width / tp + h) if model.bias else 0.0)


def stage_params(model: ModelSpec, tp, layers, has_embedding, has_head, head_copy) -> object:
    """Parameters one device of a pipeline stage holds before ZeRO sharding: its `layers`,
    the word (and learned position) embedding where the first virtual stage sits, the final
    norm and lm_head where the last one sits. `head_copy`: the stage keeps its own lm_head
    matrix (untied embeddings, or tied ones on another stage: Megatron-LM keeps a copy and
    all-reduces its gradient with the embedding's). Broadcast-safe."""
    params = layers * layer_params_local(model, tp)
    pos = model.seq_len * model.hidden if model.position_embedding == "learned" else 0
    params = params + np.asarray(has_embedding) * (model.vocab * model.hidden / tp + pos)
    params = params + np.asarray(has_head) * model.final_norm_params()
    return params + np.asarray(head_copy) * (model.vocab * model.hidden / tp)


@dataclass(frozen=True)
class ModelStates:
    """Bytes of one device's model states, after ZeRO sharding and offload."""

    weights_bytes: object
    gradients_bytes: object
    optimizer_bytes: object
    host_bytes: object  # offloaded to host memory
    local_params: object  # parameters whose optimizer states this device updates


def model_states(params, plan, per: BytesPerParam, shard_group) -> ModelStates:
    """Where the weights, gradients and optimizer states of `params` live."""
    z = plan.zero_stage
    local = params / shard_group if z >= 1 else params + 0.0 * shard_group
    w = params * per.kept_weight / (shard_group if z >= 3 else 1)
    g = params * per.grad / (shard_group if z >= 2 else 1)
    o = local * per.optimizer
    off = plan.offload
    host = 0.0
    if off.optimizer != "none":
        moved_grads = g if z >= 2 else 0.0  # ZeRO-Offload moves the partitioned gradients too
        if off.optimizer == "cpu":
            host = host + o + moved_grads
        o, g = 0.0 * o, g - moved_grads
    if off.params != "none":
        if off.params == "cpu":
            host = host + w
        w = 0.0 * w
    return ModelStates(w, g, o, host, local)


def upcasts_gradients(per: BytesPerParam, plan) -> bool:
    """Whether the optimizer updates fp32 weights from fp32 copies of 16-bit gradients, made at
    each step: Megatron-LM's mixed-precision optimizers give their fp32 master weights
    `.float()` copies of the reduced gradients (Float16OptimizerWithFloat16Params.
    _copy_model_grads_to_main_grads, NVIDIA/Megatron-LM@de7dc40f88 megatron/optimizer/
    optimizer.py; the distributed optimizer's of its shard, core_v0.9.0 megatron/core/optimizer/
    distrib_optimizer.py), DeepSpeed's ZeRO converts its gradient partition to its fp32 one
    (microsoft/DeepSpeed@38327e07f runtime/zero/stage_1_and_2.py), FSDP2 casts a reduced shard to
    an fp32 parameter's dtype. Not where Apex's DistributedFusedAdam or TransformerEngine's FusedAdam
    read the 16-bit gradients in their step (`plan.master_weights`, 16-bit optimizer states),
    nor with the optimizer on the host (offload.py)."""
    return (per.grad < FP32_BYTES and plan.optimizer_precision == "fp32" and plan.master_weights is None
            and plan.offload.optimizer == "none")


def optimizer_grad_bytes(per: BytesPerParam, plan) -> float:
    """Bytes per parameter of the gradient the optimizer step and the passes before it read."""
    return float(FP32_BYTES) if upcasts_gradients(per, plan) else per.grad


def optimizer_step_s(states: ModelStates, per: BytesPerParam, plan, acc: Accelerator, other_params=0.0) -> object:
    """Adam update of the local shard on the device: memory-bound, it reads the gradient
    (optimizer_grad_bytes) and the optimizer states (with the master weights), writes the
    states and the compute-precision weight (fp32 parameters: reads and writes them);
    `other_params` of the shard another optimizer updates (Muon's matrices, muon.py) are left
    out. Zero when the optimizer runs on the host (offload.py times that)."""
    if plan.offload.optimizer != "none":
        return 0.0 * states.local_params
    weight = 2 * per.kept_weight if per.weight_is_master else per.weight
    nbytes = (states.local_params - other_params) * (optimizer_grad_bytes(per, plan) + 2 * per.optimizer + weight)
    return memory_bound_time(nbytes, acc, "optimizer", plan.precision)
