"""Parallelism plan and its validation against a model and a cluster.

Rank layout: TP innermost, then CP, DP, PP outermost (Megatron-LM's default order
tp-cp-dp-pp), so a TP group shares a node whenever tp <= devices_per_node. `rank_order`
changes it.
"""

from __future__ import annotations

from dataclasses import MISSING, dataclass, fields

from . import deepep, fields as F, titanmoe
from .errors import InputError
from .compute import ATTENTION_KERNELS
from .cpattention import CP_ATTENTION, WINDOW_METHODS
from .fusion import EAGER_NORMS
from .fp8 import LOW_PRECISIONS, TE_PER_TENSOR, check_bf16_layers
from .hardware import Cluster
from .loss import LOSSES
from .model import ModelSpec
from .mtp import check_mtp_plan
from .moe import DISPATCHERS, MoEOptions, check_layer_mix_options, check_moe_plan
from .dims import expert_grad_group_size
from .workload import local_heads
from .pipebuffers import PP_IMPLS, PP_OUTPUTS
from .projections import PROJECTIONS
from .schedules import SCHEDULES, plan_schedule
from .stagesplit import PIPELINE_SPLITS, check_split
from .recompute import MODULES
from .titanmoe import FRAMEWORKS

RECOMPUTE = ("none", "selective", "full", "op-selective")
RECOMPUTE_METHODS = ("uniform", "block")
PRECISIONS = ("fp32", "tf32", "bf16", "fp16", "fp8", "mxfp8", "nvfp4")
FP8_RECIPES = ("delayed", "current", "tensorwise", "rowwise")
TP_OVERLAPS = ("userbuffers", "async-tp")
TP_IMPLS = ("megatron", "dtensor")
OFFLOAD_TARGETS = ("none", "cpu", "nvme")
GRAD_PRECISIONS = ("fp32", "bf16", "fp16")
GRAD_CLIPS = ("none", "norm", "norm-scale")
OPTIMIZER_PRECISIONS = ("fp32", "bf16", "bf16-moments")
MASTER_WEIGHTS = ("remainders", "none")
OPTIMIZERS = ("adam", "muon")
MUON_TP_MODES = ("duplicated", "blockwise", "distributed")
DIMENSIONS = ("tp", "cp", "dp", "pp")


@dataclass(frozen=True)
class Offload:
    optimizer: str = "none"
    params: str = "none"
    activations: str = "none"


@dataclass(frozen=True)
class Plan:
    tp: int = 1
    pp: int = 1
    dp: int = 1
    cp: int = 1
    # Expert parallel and expert tensor parallel degrees of the MoE layers (Megatron-Core
    # folding: the ep x etp group is carved out of a pipeline stage's tp x cp x dp devices;
    # moe.py). plan_from_dict defaults etp to tp, as Megatron-Core does.
    ep: int = 1
    etp: int = 1
    vpp: int = 1
    micro_batch: int = 1
    global_batch: int = 1
    schedule: str = "1f1b"
    sequence_parallel: bool = False
    recompute: str = "none"
    zero_stage: int = 0
    # Hybrid sharding (HSDP: FSDP2 on a (replicate, shard) mesh, torchtitan's
    # data_parallel_replicate_degree; Megatron-LM --num-distributed-optimizer-instances): the
    # dp ranks form dp_replicate replicas of dp/dp_replicate consecutive ranks each; ZeRO shards
    # over one replica's ranks (x cp) and the replicas all-reduce their gradient shards
    # (dataparallel.py).
    dp_replicate: int = 1
    precision: str = "bf16"
    offload: Offload = Offload()
    flash_attention: bool = True
    # Gradient reduction overlapped with the backward pass (PyTorch DDP, Megatron
    # --overlap-grad-reduce). Megatron-LM before 2023 reduced after the backward pass.
    dp_overlap: bool = True
    # ZeRO-1/2's weight all-gather after the optimizer step dispatched bucket by bucket ahead of
    # the next forward pass (Megatron-LM --overlap-param-gather, NeMo's overlap_param_sync) or
    # run after the step (false: Megatron-LM without the flag, DeepSpeed's ZeRO-1/2); None: as
    # dp_overlap (gathers_overlap).
    param_gather_overlap: bool | None = None
    # TP collectives overlapped with GEMMs (Transformer Engine userbuffers); off by default.
    tp_comm_overlap: bool = False
    # Precision of the gradients kept for accumulation and reduction. Megatron-LM keeps
    # fp32 "main grads" (--accumulate-allreduce-grads-in-fp32); DeepSpeed keeps 16-bit.
    grad_precision: str = "fp32"
    # Weight-gradient GEMMs accumulate into the fp32 main grads themselves
    # (Megatron-LM --gradient-accumulation-fusion, its default); false: a separate add per
    # parameter and micro-batch, as torch's AccumulateGrad (framework_ops.py).
    grad_accumulation_fusion: bool = True
    # Gradient clipping by the global norm before the optimizer step (framework_ops.py): none,
    # norm (the norm each step, the gradients scaled only on the steps it clips: Megatron-LM
    # before Megatron-Core 0.18 and without TransformerEngine, Apex's kernels) or norm-scale
    # (scaled every step by min(1, limit / norm): torch.nn.utils.clip_grad_norm_, torchtitan;
    # Megatron-Core 0.18 on with TransformerEngine). Every framework clips at 1.0 by default.
    grad_clip: str = "norm-scale"
    # The data-parallel reduction averages in its collective (NCCL's AVG: Megatron-LM
    # --ddp-average-in-collective, NeMo's Megatron-Core optimizer by default, Apex's
    # DistributedFusedAdam); false: each bucket is divided by the DP x CP size in a pass of its
    # own before a summing reduction (Megatron-Core's default; Megatron-LM's DDP of 2021;
    # DeepSpeed's engine, after it). FSDP2 averages in its reduce-scatter for fp32 and bf16
    # gradients either way (framework_ops.py).
    dp_average_in_collective: bool = False
    # Megatron-Core's check of each gradient bucket's norm for NaN before its reduction
    # (DistributedDataParallelConfig.check_for_nan_in_grad; Megatron-LM's
    # --check-for-nan-in-loss-and-grad, on by default there, off in NeMo's and Megatron-Bridge's
    # performance configs): a read of the gradient buffer each step.
    grad_nan_check: bool = False
    rank_order: str = "tp-cp-dp-pp"
    # Pipeline sends split over the TP ranks, each sending 1/t and the receivers all-gathering
    # (Megatron-LM --scatter-gather-tensors-in-pipeline: from Feb 2021, NVIDIA/Megatron-LM@27fc468964,
    # on by default from @72e4230bb5, until Megatron-Core). False: every TP rank sends the whole
    # activation (Megatron-LM before; Megatron-Core without sequence parallelism). With sequence
    # parallelism the activation is split over the TP ranks either way (passes.pp_hop_s).
    pp_scatter_gather: bool = True
    # An explicit per-stage op order ("F0", "B0", "W0", "F1.0" = chunk 1 of micro-batch 0)
    # run by the graph engine in place of the named schedule's (schedules.py).
    schedule_ops: tuple | None = None
    moe: MoEOptions = MoEOptions()
    # lm_head + cross-entropy: unfused | vocab-parallel (Megatron) | fused (Cut Cross-Entropy) | chunked (Liger) |
    # loss-parallel (DTensor), loss.py
    loss: str = "unfused"
    loss_chunk_tokens: int | None = None  # chunked: tokens per chunk (None: Liger's rule)
    # Uneven pipeline stages (stagesplit.py): Megatron-Core's --decoder-first/last-pipeline-
    # num-layers, or the layers of every virtual stage, first to last.
    first_stage_layers: int | None = None
    last_stage_layers: int | None = None
    pipeline_layout: tuple | None = None
    # "balanced": the embedding and the output weigh a layer each where the layers are dealt
    # to the stages (torchtitan's default split, stagesplit.balanced_layout), at any pp.
    pipeline_split: str = "even"
    # Megatron-LM full recomputation (recompute.py): checkpoint every `recompute_num_layers`
    # layers (uniform) or only the first `recompute_num_layers` layers of each chunk (block).
    recompute_method: str = "uniform"
    recompute_num_layers: int = 1
    # The framework's checkpoints are torch.utils.checkpoint without reentrance (torchtitan's
    # checkpoint_wrapper; torch.compile's partitioner alike): under full recomputation a layer's
    # forward re-runs only until everything its backward reads is rebuilt
    # (recompute.early_stop_rerun). False: Megatron-LM's, TransformerEngine's and DeepSpeed's
    # reentrant checkpoints re-run it whole.
    recompute_early_stop: bool = False
    # Megatron-Core's selective recompute modules (--recompute-modules; recompute.py MODULES),
    # with recompute: selective; core attention alone by default, as Megatron-Core's.
    recompute_modules: tuple = ("core_attn",)
    # FP8 linears (fp8.py): the scaling recipe of `precision: fp8` (TransformerEngine delayed or
    # current, torchao tensorwise or rowwise) and FP8 primary weights (TE fp8_params).
    fp8_recipe: str = "delayed"
    fp8_params: bool = False
    # FP8 plans: the first and the last decoder layers that run their linears in BF16
    # (Megatron-Core's first_last_layers_bf16 with num_layers_at_start_in_bf16 and
    # num_layers_at_end_in_bf16): fp8.py.
    bf16_layers_at_start: int = 0
    bf16_layers_at_end: int = 0
    # torchao's float8 all-gather of FSDP2's weight shards (torchtitan's
    # float8.enable_fsdp_float8_all_gather, with its precomputed scales): fp8.py.
    fp8_fsdp_all_gather: bool = False
    # Memory-bound kernels fused (torch.compile, the frameworks' fused kernels) or launched op
    # by op as eager PyTorch runs them (fusion.py).
    compile: bool = True
    # Eager RMSNorm (compile false): the op-by-op sequence, or torch's fused kernel (fusion.py)
    eager_norm: str = "composite"
    # FSDP2 frees the gathered weights after each forward (True) or keeps them for the
    # backward and across micro-batches (False, torchtitan under PP): fsdp.py.
    fsdp_reshard_after_forward: bool = True
    # Who runs ZeRO-3: PyTorch's FSDP2 (per-block units, the root kept gathered through the
    # backward: fsdp.py) or DeepSpeed's stage 3 (every parameter released after use).
    zero3_impl: str = "fsdp2"
    # How overlapped TP collectives are implemented (tpoverlap.py): TransformerEngine userbuffers
    # or PyTorch async TP.
    tp_overlap: str = "userbuffers"
    # Who splits the layers over TP ranks: Megatron-LM's parallel linears (TransformerEngine
    # alike), which under sequence parallelism keep the sequence shard of a column-parallel
    # linear's input and all-gather it again for the weight gradient, or PyTorch DTensor's
    # parallelize_module (torchtitan), whose linears keep the all-gathered input they were
    # given (workload.Shard.tp_keeps_gathered).
    tp_impl: str = "megatron"
    # Who runs the pipeline: Megatron-LM (a received activation becomes the first layer's saved
    # input; a sent output is freed) or torch.distributed.pipelining (torchtitan), whose
    # receive buffers, outputs and input gradients stay allocated longer (pipebuffers.py), with
    # `pp_outputs`: whose every micro-batch's output waits for the step's end (torch only;
    # default last-stage, step()'s return_outputs).
    pp_impl: str = "megatron"
    pp_outputs: str | None = None
    # The attention kernel: the profile's fused kernel (FA3, cuDNN on Hopper) or FlashAttention-2
    # (PyTorch's SDPA flash backend): compute.FLASH2_ATTENTION.
    attention_kernel: str = "fused"
    # The layer's projections as one fused GEMM each (QKV, gate and up: Megatron-LM, NeMo,
    # TransformerEngine) or as separate linears (torchtitan's wq/wk/wv and w1/w3, Hugging Face
    # models): projections.py.
    projections: str = "fused"
    # How context parallelism runs attention (cpattention.py): TransformerEngine's P2P ring
    # (Megatron-Core, NeMo), its K/V all-gather, its Ulysses all-to-alls or both (--cp-comm-type
    # all_gather, a2a, a2a+p2p), or PyTorch's experimental context_parallel with its all-gather or
    # all-to-all rotation of K and V (torchtitan).
    cp_attention: str = "ring"
    # ulysses-ring (TE's hierarchical CP, Megatron --cp-comm-type a2a+p2p): the all-to-all group
    # of that many consecutive CP ranks, the ring over cp/cp_ulysses of them
    # (--hierarchical-context-parallel-sizes)
    cp_ulysses: int = 1
    # Precision of the Adam states (the master copy and both moments): fp32, bf16 as NeMo's
    # distributed_fused_adam with optim.dtype bf16 keeps them, or bf16-moments: an fp32 master
    # copy with bf16 moments, Megatron-Core's precision-aware optimizer (states.bytes_per_param).
    optimizer_precision: str = "fp32"
    # How the optimizer keeps its master copy of the 16-bit weights (states.bytes_per_param):
    # null, whole, in the precision above; remainders, the fp32 copy as the 16 bits the bf16
    # weight lacks (Apex DistributedFusedAdam and TransformerEngine FusedAdam
    # store_param_remainders); none, the weights themselves (Apex's store_params false, its
    # states in the weights' bf16).
    master_weights: str | None = None
    # The parameters kept in fp32 and cast to 16 bits for the GEMMs, the optimizer's master copy
    # themselves (FSDP2 with a 16-bit param_dtype, torchtitan; torch.autocast): states.py.
    fp32_params: bool = False
    # Adam for every parameter, or Megatron-Core's Muon for the layers' weight matrices (Adam
    # for the rest) with `muon_ns_steps` Newton-Schulz steps per update (muon.py)
    optimizer: str = "adam"
    muon_ns_steps: int = 5
    # how Muon orthogonalises a TP-split matrix (Megatron --muon-tp-mode): gathered whole on
    # every TP rank, each rank's shard alone, or Newton-Schulz distributed over the TP ranks
    muon_tp_mode: str = "duplicated"

    @property
    def devices(self) -> int:
        return self.tp * self.pp * self.dp * self.cp

    @property
    def microbatches(self) -> int:
        """Micro-batches per step per data-parallel replica (gradient accumulation steps)."""
        return self.global_batch // (self.micro_batch * self.dp)

    @property
    def gathers_overlap(self) -> bool:
        """Whether ZeRO-1/2's weight all-gather runs ahead of the next forward pass."""
        return self.dp_overlap if self.param_gather_overlap is None else self.param_gather_overlap

    @property
    def sp(self) -> bool:
        """Sequence parallelism takes effect only with tensor parallelism."""
        return self.sequence_parallel and self.tp > 1



PLAN_KEYS = tuple(f.name for f in fields(Plan))
_FIELDS = frozenset(PLAN_KEYS)
# The plan's sizes: what differs between plans of one vectorised batch (vector.py) and
# between the points of a sweep's run (sweep.py); every other field is a setting.
SIZES = ("tp", "pp", "dp", "cp", "ep", "etp", "vpp", "micro_batch", "global_batch")


def plan_from_dict(data, devices: int | None = None, cache: dict | None = None) -> Plan:
    """Read the scenario's `plan` section. `dp` may be omitted or `auto`: it fills the device count.
    `cache` (a dict the caller keeps) makes the settings (every field but the sizes) parse
    once per distinct content, e.g. across the points of a sweep."""
    data = F.require_mapping(data, "plan")
    F.reject_unknown(data, PLAN_KEYS, "plan")
    sizes = _sizes(data, devices)
    settings = F.parsed(cache, "plan", {k: v for k, v in data.items() if k not in SIZES}, _settings)
    return new_plan(**sizes, **settings)


_DEFAULTS = {f.name: f.default for f in fields(Plan) if f.default is not MISSING}
_REQUIRED = _FIELDS - _DEFAULTS.keys()


def new_plan(**values) -> Plan:
    """Plan(**values), its fields set at once: the generated __init__ of a frozen dataclass
    sets each of its 56 fields through object.__setattr__ (17 us a plan, most of reading a
    sweep point's plan or enumerating a search's shapes). Plan has no __post_init__ and no
    default factory; values naming a field it does not have, or leaving out one without a
    default, go to Plan() for its TypeError."""
    if not _REQUIRED <= values.keys() <= _FIELDS:
        return Plan(**values)
    plan = object.__new__(Plan)
    vars(plan).update(_DEFAULTS, **values)
    return plan


def _sizes(data, devices: int | None) -> dict:
    tp = F.integer(data, "tp", "plan", 1, maximum=10**6)
    pp = F.integer(data, "pp", "plan", 1, maximum=10**6)
    cp = F.integer(data, "cp", "plan", 1, maximum=10**6)
    if data.get("dp") in (None, "auto"):
        if devices is None:
            raise InputError("plan.dp", data.get("dp"), "expected an integer")
        if devices % (tp * pp * cp):
            raise InputError("plan.tp", tp, f"tp*pp*cp = {tp * pp * cp} must divide the {devices} devices")
        dp = devices // (tp * pp * cp)
    else:
        dp = F.integer(data, "dp", "plan", maximum=10**8)
    return dict(
        tp=tp, pp=pp, dp=dp, cp=cp,
        ep=F.integer(data, "ep", "plan", 1, maximum=10**6),
        etp=F.integer(data, "etp", "plan", tp, maximum=10**6),
        vpp=F.integer(data, "vpp", "plan", 1, maximum=10**4),
        micro_batch=F.integer(data, "micro_batch", "plan", 1, maximum=10**7),
        global_batch=F.integer(data, "global_batch", "plan", maximum=10**9))


def _settings(data) -> dict:
    off = F.require_mapping(data.get("offload") or {}, "plan.offload")
    F.reject_unknown(off, ("optimizer", "params", "activations"), "plan.offload")
    offload = Offload(*(F.choice(off, k, "plan.offload", OFFLOAD_TARGETS, "none")
                        for k in ("optimizer", "params", "activations")))
    precision = F.choice(data, "precision", "plan", PRECISIONS, "bf16")
    order = F.text(data, "rank_order", "plan", "tp-cp-dp-pp")
    if sorted(order.split("-")) != sorted(DIMENSIONS):
        raise InputError("plan.rank_order", order, "a permutation of tp, cp, dp, pp joined by '-', innermost first")
    return dict(
        schedule=F.choice(data, "schedule", "plan", tuple(SCHEDULES), "1f1b"),
        sequence_parallel=F.boolean(data, "sequence_parallel", "plan", False),
        recompute=F.choice(data, "recompute", "plan", RECOMPUTE, "none"),
        zero_stage=F.integer(data, "zero_stage", "plan", 0, minimum=0, maximum=3),
        dp_replicate=F.integer(data, "dp_replicate", "plan", 1, maximum=10**8),
        precision=precision,
        offload=offload,
        flash_attention=F.boolean(data, "flash_attention", "plan", True),
        dp_overlap=F.boolean(data, "dp_overlap", "plan", True),
        param_gather_overlap=F.boolean(data, "param_gather_overlap", "plan", None),
        tp_comm_overlap=F.boolean(data, "tp_comm_overlap", "plan", False),
        grad_precision=F.choice(data, "grad_precision", "plan", GRAD_PRECISIONS, "fp32"),
        grad_accumulation_fusion=F.boolean(data, "grad_accumulation_fusion", "plan", True),
        grad_clip=F.choice(data, "grad_clip", "plan", GRAD_CLIPS, "norm-scale"),
        dp_average_in_collective=F.boolean(data, "dp_average_in_collective", "plan", False),
        grad_nan_check=F.boolean(data, "grad_nan_check", "plan", False),
        rank_order=order,
        pp_scatter_gather=F.boolean(data, "pp_scatter_gather", "plan", True),
        schedule_ops=_schedule_ops(data.get("schedule_ops")),
        moe=_moe_options(data.get("moe")),
        **_loss(data),
        first_stage_layers=F.integer(data, "first_stage_layers", "plan", None, maximum=100_000),
        last_stage_layers=F.integer(data, "last_stage_layers", "plan", None, maximum=100_000),
        pipeline_layout=_pipeline_layout(data.get("pipeline_layout")),
        pipeline_split=F.choice(data, "pipeline_split", "plan", PIPELINE_SPLITS, "even"),
        recompute_method=F.choice(data, "recompute_method", "plan", RECOMPUTE_METHODS, "uniform"),
        recompute_num_layers=F.integer(data, "recompute_num_layers", "plan", 1, maximum=100_000),
        recompute_early_stop=F.boolean(data, "recompute_early_stop", "plan", False),
        recompute_modules=_recompute_modules(data.get("recompute_modules")),
        fp8_recipe=F.choice(data, "fp8_recipe", "plan", FP8_RECIPES, "delayed"),
        fp8_params=F.boolean(data, "fp8_params", "plan", False),
        bf16_layers_at_start=F.integer(data, "bf16_layers_at_start", "plan", 0, minimum=0, maximum=100_000),
        bf16_layers_at_end=F.integer(data, "bf16_layers_at_end", "plan", 0, minimum=0, maximum=100_000),
        fp8_fsdp_all_gather=F.boolean(data, "fp8_fsdp_all_gather", "plan", False),
        compile=F.boolean(data, "compile", "plan", True),
        eager_norm=F.choice(data, "eager_norm", "plan", EAGER_NORMS, "composite"),
        fsdp_reshard_after_forward=F.boolean(data, "fsdp_reshard_after_forward", "plan", True),
        zero3_impl=F.choice(data, "zero3_impl", "plan", ("fsdp2", "deepspeed"), "fsdp2"),
        tp_overlap=F.choice(data, "tp_overlap", "plan", TP_OVERLAPS, "userbuffers"),
        tp_impl=F.choice(data, "tp_impl", "plan", TP_IMPLS, "megatron"),
        pp_impl=F.choice(data, "pp_impl", "plan", PP_IMPLS, "megatron"),
        pp_outputs=F.choice(data, "pp_outputs", "plan", PP_OUTPUTS, None),
        attention_kernel=F.choice(data, "attention_kernel", "plan", ATTENTION_KERNELS, "fused"),
        projections=F.choice(data, "projections", "plan", PROJECTIONS, "fused"),
        cp_attention=F.choice(data, "cp_attention", "plan", CP_ATTENTION, "ring"),
        cp_ulysses=F.integer(data, "cp_ulysses", "plan", 1, maximum=10**6),
        optimizer_precision=F.choice(data, "optimizer_precision", "plan", OPTIMIZER_PRECISIONS, "fp32"),
        master_weights=F.choice(data, "master_weights", "plan", MASTER_WEIGHTS, None),
        fp32_params=F.boolean(data, "fp32_params", "plan", False),
        optimizer=F.choice(data, "optimizer", "plan", OPTIMIZERS, "adam"),
        muon_ns_steps=F.integer(data, "muon_ns_steps", "plan", 5, maximum=100),
        muon_tp_mode=F.choice(data, "muon_tp_mode", "plan", MUON_TP_MODES, "duplicated"),
    )


def _moe_options(data) -> MoEOptions:
    data = F.require_mapping(data or {}, "plan.moe")
    F.reject_unknown(data, MoEOptions.__dataclass_fields__, "plan.moe")
    capacity = F.number(data, "capacity_factor", "plan.moe", None, maximum=1000.0)
    pad = F.boolean(data, "pad_to_capacity", "plan.moe", False)
    if pad and capacity is None:
        raise InputError("plan.moe.pad_to_capacity", True, "needs a capacity_factor (Megatron-Core "
                         "--moe-pad-expert-input-to-capacity)")
    framework = F.choice(data, "framework", "plan.moe", FRAMEWORKS, "megatron-core")
    return MoEOptions(
        dispatcher=F.choice(data, "dispatcher", "plan.moe", DISPATCHERS, "alltoall"),
        capacity_factor=capacity, pad_to_capacity=pad,
        load_imbalance=F.number(data, "load_imbalance", "plan.moe", 1.0, minimum=1.0, strict_min=False,
                                maximum=1000.0),
        shared_expert_overlap=F.boolean(data, "shared_expert_overlap", "plan.moe", False),
        ep_comm_overlap=F.boolean(data, "ep_comm_overlap", "plan.moe", False),
        folding=F.boolean(data, "folding", "plan.moe", True),
        grouped_gemm=F.boolean(data, "grouped_gemm", "plan.moe", True),
        router_padding=F.boolean(data, "router_padding", "plan.moe", False),
        dispatcher_sms=F.integer(data, "dispatcher_sms", "plan.moe", None, maximum=100_000),
        framework=framework,
        probs_on_input=F.boolean(data, "probs_on_input", "plan.moe", False),
        op_sac_saves_all_to_all=F.boolean(data, "op_sac_saves_all_to_all", "plan.moe", True),
        # Megatron-Core 0.13 on (moe.py); torchtitan weights the experts' outputs or inputs
        probs_in_experts=F.boolean(data, "probs_in_experts", "plan.moe", framework == "megatron-core"))


def _loss(data) -> dict:
    """plan.loss and plan.loss_chunk_tokens (a chunk size only for the chunked loss)."""
    loss = F.choice(data, "loss", "plan", LOSSES, "unfused")
    chunk = F.integer(data, "loss_chunk_tokens", "plan", None, maximum=10**9)
    if chunk is not None and loss != "chunked":
        raise InputError("plan.loss_chunk_tokens", chunk, "a chunk size needs plan.loss: chunked")
    return {"loss": loss, "loss_chunk_tokens": chunk}


def _recompute_modules(value) -> tuple:
    """The modules in MODULES order (Megatron-Core reads them as a set)."""
    if value is None:
        return ("core_attn",)
    value = [value] if isinstance(value, str) else value
    if not isinstance(value, (list, tuple)) or not all(isinstance(m, str) and m in MODULES for m in value):
        raise InputError("plan.recompute_modules", value, f"a list of {', '.join(MODULES)}")
    return tuple(m for m in MODULES if m in value)


def _pipeline_layout(value):
    if value is None:
        return None
    if not isinstance(value, (list, tuple)) or not value or not all(
            isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in value):
        raise InputError("plan.pipeline_layout", value, "a list of layer counts (integers >= 0), one per virtual "
                         "pipeline stage, first to last")
    return tuple(value)


def _schedule_ops(value):
    if value is None:
        return None
    if not isinstance(value, (list, tuple)) or not all(isinstance(s, (list, tuple)) for s in value):
        raise InputError("plan.schedule_ops", value, "a list with one list of ops (F0, B0, W0, F1.0) per pipeline stage")
    return tuple(tuple(str(op) for op in stage) for stage in value)


def _check_attention_bands(plan: Plan, model: ModelSpec) -> None:
    """What the attention-band model (workload.window_pair_fraction) leaves out: context
    parallelism of windowed layers but by Ulysses' all-to-alls or TE's all-gather
    (cpattention.py), over packed documents PyTorch's ring and
    documents TransformerEngine would pad (cpattention.py), and MTP depths beside windows (their
    layer's window is not stated)."""
    if model.packs_documents and plan.cp > 1:
        if plan.cp_attention.startswith("torch-"):
            raise InputError("plan.cp_attention", plan.cp_attention, "ring, kv-allgather, ulysses or ulysses-ring "
                             "with packed documents (PyTorch's ring balances the sequence, not each document: "
                             "not modelled)")
        if model.document_tokens % (2 * plan.cp):
            raise InputError("model.document_tokens", model.document_tokens, f"a multiple of 2*cp = {2 * plan.cp} "
                             "(TransformerEngine splits each document into 2*cp chunks; padding is not modelled)")
    if not model.has_sliding_window:
        return
    if plan.cp > 1 and model.window_kind == "chunked":
        raise InputError("plan.cp", plan.cp, "1 with chunked attention (model.window_kind: chunked): how a "
                         "context-parallel rank's chunks of the sequence meet the attention's chunks is not modelled")
    if plan.cp > 1 and plan.cp_attention not in WINDOW_METHODS:
        raise InputError("plan.cp_attention", plan.cp_attention, "ulysses or kv-allgather with sliding-window "
                         "attention and cp > 1 (TransformerEngine runs windows under CP by a2a and all_gather only)")
    if model.mtp_layers:
        raise InputError("model.mtp_layers", model.mtp_layers, "0 with sliding-window attention (not modelled)")


def _check_recompute_modules(plan: Plan, model: ModelSpec) -> None:
    """The modules the model has, in the combinations Megatron-Core runs and llmsim models
    (transformer_config.py __post_init__ refuses the ones marked so)."""
    if plan.recompute != "selective":
        return
    modules = set(plan.recompute_modules)
    value = list(plan.recompute_modules)
    needs = {"mla_up_proj": (model.attention == "mla", "a model with multi-head latent attention (Megatron-Core)"),
             "moe": (model.experts, "a model with experts"), "moe_act": (model.experts, "a model with experts"),
             "shared_experts": (model.shared_experts, "a model with shared experts")}
    for module, (has, what) in needs.items():
        if module in modules and not has:
            raise InputError("plan.recompute_modules", value, f"{module} needs {what}")
    if "moe" in modules and modules & {"moe_act", "shared_experts"}:
        raise InputError("plan.recompute_modules", value, "moe checkpoints the whole MoE layer: moe_act and "
                         "shared_experts inside it (nested checkpoints) are not modelled")
    if "shared_experts" in modules and plan.moe.shared_expert_overlap:
        raise InputError("plan.recompute_modules", value, "shared_experts cannot be recomputed with "
                         "plan.moe.shared_expert_overlap (Megatron-Core refuses it)")
    if plan.precision == "fp8" and plan.fp8_recipe == "delayed" and modules & {"moe_act", "layernorm"}:
        raise InputError("plan.recompute_modules", value, "moe_act and layernorm need an FP8 recipe other than "
                         "delayed (Megatron-Core refuses delayed scaling with them)")


def validate(plan: Plan, model: ModelSpec, cluster: Cluster, options: bool = True) -> None:
    """Raise InputError for a plan that cannot be laid out on this model and cluster.
    `options=False` leaves out check_options (the recompute, sharding and precision options
    that only make sense together), which a search checks per setting."""
    if plan.devices != cluster.devices:
        raise InputError("plan.dp", plan.dp, f"tp*pp*dp*cp = {plan.tp}*{plan.pp}*{plan.dp}*{plan.cp} = "
                         f"{plan.devices} must equal the cluster's {cluster.devices} devices")
    _divides("plan.tp", plan.tp, "model.heads", model.heads)
    if model.kv_heads % plan.tp and plan.tp % model.kv_heads:
        raise InputError("plan.tp", plan.tp, f"must divide kv_heads={model.kv_heads}, or be a multiple of it "
                         "(each KV head is then replicated tp/kv_heads times)")
    if model.parallel_block:
        _check_parallel_block(plan)
    if not plan.compile and model.rotary_fraction != 1.0:
        raise InputError("plan.compile", False, "true with a partial RoPE (model.rotary_fraction): eager PyTorch "
                         "slices the heads and concatenates them back, a kernel sequence not modelled")
    if plan.tp > 1 and model.qk_norm and model.qk_norm_scope == "full":
        raise InputError("plan.tp", plan.tp, "1 with model.qk_norm_scope full: a norm over the whole query and key "
                         "projections spans the TP ranks' heads (OLMo-core re-shards it by sequence, transformers "
                         "gathers the projections): not modelled")
    if model.moe_layers < model.layers:  # some layer has a dense MLP of width ffn_hidden
        _divides("plan.tp", plan.tp, "model.ffn_hidden", model.ffn_hidden)
    titanmoe.check_plan(plan, model)
    check_moe_plan(plan, model)
    if model.experts and plan.moe.dispatcher in deepep.BACKENDS:
        deepep.check_plan(plan, model, cluster)
    if plan.global_batch % (plan.micro_batch * plan.dp):
        raise InputError("plan.global_batch", plan.global_batch,
                         f"must be a multiple of micro_batch*dp = {plan.micro_batch * plan.dp}")
    try:
        schedule = plan_schedule(plan)  # the schedule's own rules; an explicit order parsed and checked
    except InputError as e:
        if e.field != "plan.global_batch":
            raise
        # a schedule counts micro-batches per replica; the user gave the global batch
        raise InputError(e.field, plan.global_batch, e.allowed) from None
    check_split(plan, model, schedule)  # layers per pipeline stage: even, first/last counts, balanced or a layout
    check_layer_mix_options(plan, model)
    check_bf16_layers(plan, model, schedule)
    _check_recompute_modules(plan, model)
    check_mtp_plan(plan, model)
    _check_attention_bands(plan, model)
    if plan.cp > 1 and model.seq_len % (2 * plan.cp):
        raise InputError("plan.cp", plan.cp, f"2*cp must divide seq_len={model.seq_len} (load-balanced causal chunks)")
    check_cp_attention(plan, model)
    if plan.sp and (model.seq_len // plan.cp) % plan.tp:
        raise InputError("plan.sequence_parallel", True, f"tp={plan.tp} must divide the sequence per CP rank "
                         f"({model.seq_len // plan.cp})")
    if plan.dp_replicate > 1:
        check_hybrid_sharding(plan, model)
    off = plan.offload
    if off.optimizer != "none" and plan.zero_stage < 1:
        raise InputError("plan.offload.optimizer", off.optimizer, "optimizer offload (ZeRO-Offload) needs zero_stage >= 1")
    if off.params != "none" and plan.zero_stage < 3:
        raise InputError("plan.offload.params", off.params, "parameter offload (ZeRO-Infinity) needs zero_stage 3")
    if plan.fp32_params and (off.optimizer != "none" or off.params != "none"):
        raise InputError("plan.fp32_params", True, "false with optimizer or parameter offload (FSDP2's CPU "
                         "offload of fp32 parameters is not modelled)")
    if plan.fp32_params and plan.optimizer_precision != "fp32":
        raise InputError("plan.fp32_params", True, f"false with optimizer_precision {plan.optimizer_precision} "
                         "(fp32 parameters are the master copy)")
    _check_master_weights(plan)
    acc = cluster.accelerator
    check_precision(plan.precision, acc)
    if plan.optimizer == "muon" and "bf16" not in acc.peak_flops:
        raise InputError("plan.optimizer", "muon", f"adam on {acc.name}: Muon's Newton-Schulz GEMMs run in bf16, "
                         "which its profile has no rate for")
    if plan.attention_kernel == "flash2" and acc.attention_flash2 is None and not acc.attention_is_flash2:
        raise InputError("plan.attention_kernel", "flash2", f"fused only: the {acc.name} profile has no "
                         "efficiency.attention_flash2 (FlashAttention-2's rate, PyTorch SDPA's flash backend, "
                         "measured on the part: `llmsim calibrate` measures it)")
    if plan.loss == "loss-parallel" and plan.tp < 2:
        raise InputError("plan.loss", plan.loss, "DTensor's loss parallelism shards the logits over the TP "
                         "group: needs tp > 1 (without TP the plain cross-entropy runs: unfused)")
    if options:
        check_options(plan)
    if plan.precision == "fp16" and plan.grad_precision == "bf16":
        raise InputError("plan.grad_precision", "bf16", "fp16 training keeps fp16 or fp32 gradients")


def _check_master_weights(plan: Plan) -> None:
    """The master copy kept apart from the 16-bit weights only as Adam's optimizers keep it:
    remainders beside bf16 weights and an fp32 copy, none with the states in bf16; neither
    beside fp32 parameters, FP8 primary weights (their own master) or offloaded states."""
    mw = plan.master_weights
    if mw is None:
        return
    wanted = ("fp32", "bf16-moments") if mw == "remainders" else ("bf16",)
    if plan.optimizer_precision not in wanted:
        raise InputError("plan.master_weights", mw, f"with optimizer_precision {' or '.join(wanted)} (got "
                         f"{plan.optimizer_precision}): " + ("the remainders complete an fp32 copy" if mw ==
                         "remainders" else "an optimizer without a copy keeps its states in the weights' bf16"))
    why = ("precision fp32, tf32 or fp16 (bf16 weights only)" if plan.precision in ("fp32", "tf32", "fp16") else
           "fp32_params (the parameters are the master copy)" if plan.fp32_params else
           "fp8_params (FP8 primary weights)" if plan.fp8_params else
           "offload.optimizer (the states live on the host)" if plan.offload.optimizer != "none" else
           "optimizer muon" if plan.optimizer != "adam" else None)
    if why:
        raise InputError("plan.master_weights", mw, f"null with {why}")


def check_precision(precision: str, acc) -> None:
    """Refuse a precision the accelerator has no peak for, or whose quantized GEMMs its profile
    has no measured rate for (FP8 and MXFP8: efficiency.matmul_fp8; NVFP4: matmul_fp4)."""
    acc.peak(precision)
    if precision in ("fp8", "mxfp8") and acc.matmul_fp8 is None:
        raise InputError("plan.precision", precision, f"the {acc.name} profile has no "
                         "efficiency.matmul_fp8 (an FP8 GEMM rate measured by a microbenchmark)")
    if precision == "nvfp4" and acc.matmul_fp4 is None:
        raise InputError("plan.precision", precision, f"the {acc.name} profile has no "
                         "efficiency.matmul_fp4 (an NVFP4 GEMM rate measured by a microbenchmark)")


def _check_parallel_block(plan: Plan) -> None:
    """What a parallel block (model.parallel_block) is modelled with: the frameworks that run
    it (GPT-NeoX, Hugging Face) overlap no TP collective with GEMMs, checkpoint whole layers
    or the attention core, and have no MLP module of Megatron's or block of torchtitan's; FP8
    linears reading one shared norm's output (casts shared or not) are not modelled."""
    if plan.precision in LOW_PRECISIONS:
        raise InputError("plan.precision", plan.precision, "bf16, fp16, tf32 or fp32 with model.parallel_block "
                         "(FP8 linears of parallel blocks are not modelled)")
    if plan.tp_comm_overlap:
        raise InputError("plan.tp_comm_overlap", True, "false with model.parallel_block (TP overlap of parallel "
                         "blocks is not modelled)")
    if plan.recompute == "op-selective" or plan.recompute == "selective" and set(plan.recompute_modules) != {
            "core_attn"}:
        value = plan.recompute if plan.recompute == "op-selective" else list(plan.recompute_modules)
        field = "plan.recompute" if plan.recompute == "op-selective" else "plan.recompute_modules"
        raise InputError(field, value, "none, full or selective of core_attn with model.parallel_block")


def check_hybrid_sharding(plan: Plan, model: ModelSpec) -> None:
    """HSDP's replicas: whole groups of dp ranks, each sharding ZeRO's states over its own."""
    _divides("plan.dp_replicate", plan.dp_replicate, "plan.dp", plan.dp)
    if plan.zero_stage < 1:
        raise InputError("plan.dp_replicate", plan.dp_replicate, "hybrid sharding needs zero_stage >= 1 (with "
                         "zero_stage 0 every data-parallel rank is a replica already)")
    if model.experts:  # Megatron-Core splits the expert-DP group into the same instances
        if not plan.moe.folding:
            raise InputError("plan.dp_replicate", plan.dp_replicate, "with MoE layers only under moe.folding: true "
                             "(Megatron-Core's expert layout, whose expert-DP group the instances split)")
        _divides("plan.dp_replicate", plan.dp_replicate, "the expert data-parallel size (tp*cp*dp/(ep*etp))",
                 expert_grad_group_size(plan))
    if plan.zero_stage == 3 and plan.zero3_impl == "deepspeed":
        raise InputError("plan.dp_replicate", plan.dp_replicate, "with zero3_impl fsdp2 (DeepSpeed's MiCS syncs "
                         "its replicas once per step, which is not modelled)")


def check_cp_attention(plan: Plan, model: ModelSpec) -> None:
    """The all-to-all of Ulysses splits every rank's query and key/value heads over its group
    (TransformerEngine asserts num_heads % cp_size == 0); the hierarchical one's group is
    cp_ulysses consecutive CP ranks."""
    if plan.cp_ulysses != 1 and plan.cp_attention != "ulysses-ring":
        raise InputError("plan.cp_ulysses", plan.cp_ulysses, "only with cp_attention: ulysses-ring")
    if plan.cp_ulysses != 1:
        _divides("plan.cp_ulysses", plan.cp_ulysses, "plan.cp", plan.cp)
    if plan.cp_attention == "ulysses-ring" and plan.cp > 1 and plan.cp_ulysses < 2:
        raise InputError("plan.cp_ulysses", plan.cp_ulysses, "the all-to-all group of ulysses-ring: 2 or more CP "
                         "ranks dividing cp (1 is the plain ring, cp_attention: ring)")
    a2a = {"ulysses": plan.cp, "ulysses-ring": plan.cp_ulysses}.get(plan.cp_attention, 1)
    if a2a > 1:
        q_heads, kv_heads = local_heads(model, plan.tp)
        field = "plan.cp" if plan.cp_attention == "ulysses" else "plan.cp_ulysses"
        if q_heads % a2a or kv_heads % a2a:
            raise InputError(field, a2a, f"must divide each rank's {q_heads:g} query and {kv_heads:g} key/value "
                             f"heads for cp_attention {plan.cp_attention} (its all-to-all splits the heads)")


def check_options(plan: Plan) -> None:
    """The recompute and precision options that only make sense together."""
    if plan.recompute_method != "uniform" and plan.recompute != "full":
        raise InputError("plan.recompute_method", plan.recompute_method, "only with recompute: full")
    if plan.recompute_num_layers != 1 and plan.recompute != "full":
        raise InputError("plan.recompute_num_layers", plan.recompute_num_layers, "only with recompute: full")
    if plan.recompute_early_stop and plan.recompute == "selective":
        raise InputError("plan.recompute_early_stop", True, "not with recompute: selective (Megatron-Core's modules "
                         "are its own checkpoints); with full, or op-selective, whose policy says what re-runs")
    if plan.recompute_early_stop and plan.recompute == "full" and plan.recompute_num_layers != 1:
        raise InputError("plan.recompute_early_stop", True, "with recompute_num_layers 1 only (a checkpoint a "
                         "layer, as torchtitan wraps each block)")
    if plan.recompute_early_stop and plan.recompute == "full" and not plan.compile and \
            plan.precision in LOW_PRECISIONS:
        raise InputError("plan.recompute_early_stop", True, f"not with {plan.precision} linears run eagerly "
                         "(compile: false): torchao's low-precision linear is an autograd Function that keeps its "
                         "tensors after its GEMM has run, which is not modelled")
    if plan.recompute_modules != ("core_attn",) and plan.recompute != "selective":
        raise InputError("plan.recompute_modules", list(plan.recompute_modules), "only with recompute: selective")
    if plan.attention_kernel != "fused" and not plan.flash_attention:
        raise InputError("plan.attention_kernel", plan.attention_kernel, "only with flash_attention: true")
    if plan.param_gather_overlap is not None and plan.zero_stage not in (1, 2):
        raise InputError("plan.param_gather_overlap", plan.param_gather_overlap, "only with zero_stage 1 or 2 (the "
                         "weights all-gathered once per step; ZeRO-3's gathers overlap by dp_overlap)")
    if not plan.fsdp_reshard_after_forward and plan.zero_stage < 3:
        raise InputError("plan.fsdp_reshard_after_forward", False, "only with zero_stage 3 (FSDP)")
    if plan.tp_impl == "dtensor" and plan.tp_comm_overlap and plan.tp_overlap == "userbuffers":
        raise InputError("plan.tp_overlap", plan.tp_overlap, "TransformerEngine's userbuffers overlap Megatron-LM's "
                         "parallel linears; with tp_impl: dtensor the overlap is async-tp")
    if plan.pp_outputs is not None and plan.pp_impl != "torch":
        raise InputError("plan.pp_outputs", plan.pp_outputs, "only with pp_impl: torch (Megatron-LM frees a "
                         "stage's output once sent)")
    if plan.pp_impl == "torch" and plan.offload.activations != "none":
        raise InputError("plan.offload.activations", plan.offload.activations, "not modelled with pp_impl: torch "
                         "(torch.distributed.pipelining has no activation offload)")
    if not plan.fsdp_reshard_after_forward and plan.zero3_impl != "fsdp2":
        raise InputError("plan.fsdp_reshard_after_forward", False, "only with zero3_impl fsdp2")
    if plan.fp8_fsdp_all_gather and not (plan.precision == "fp8" and plan.fp8_recipe == "tensorwise"
                                         and plan.zero_stage == 3 and plan.zero3_impl == "fsdp2"):
        raise InputError("plan.fp8_fsdp_all_gather", True, "torchao all-gathers FSDP2's weight shards in FP8 only "
                         "with precision: fp8, fp8_recipe: tensorwise, zero_stage: 3 and zero3_impl: fsdp2")
    if plan.optimizer == "muon":
        _check_muon(plan)
    elif plan.muon_ns_steps != 5:
        raise InputError("plan.muon_ns_steps", plan.muon_ns_steps, "only with optimizer: muon")
    elif plan.muon_tp_mode != "duplicated":
        raise InputError("plan.muon_tp_mode", plan.muon_tp_mode, "only with optimizer: muon")
    if plan.fp8_params and plan.precision not in LOW_PRECISIONS:
        raise InputError("plan.fp8_params", True, "FP8 (FP4) primary weights need precision: fp8, mxfp8 or nvfp4")
    if plan.fp8_params and plan.fp8_recipe not in TE_PER_TENSOR and plan.precision == "fp8":
        raise InputError("plan.fp8_params", True, "FP8 primary weights are TransformerEngine's (fp8_recipe: "
                         "delayed or current)")


def _check_muon(plan: Plan) -> None:
    """What Muon is modelled with (muon.py): Megatron-Core's, on Megatron's TP, its states in
    fp32 beside 16-bit or fp32 weights, on the device, updated by every rank (zero_stage 0) or
    by each rank for its whole matrices (zero_stage 1, the layer-wise distributed optimizer)."""
    if plan.zero_stage > 1:
        raise InputError("plan.zero_stage", plan.zero_stage, "0 or 1 with optimizer: muon (Megatron-Core's "
                         "layer-wise distributed optimizer; Muon under ZeRO-2/3 or FSDP is not modelled)")
    if plan.dp_replicate > 1:
        raise InputError("plan.dp_replicate", plan.dp_replicate, "1 with optimizer: muon (Megatron-Core's layer-wise "
                         "optimizer supports one distributed-optimizer instance)")
    if plan.offload.optimizer != "none":
        raise InputError("plan.offload.optimizer", plan.offload.optimizer, "none with optimizer: muon")
    if plan.optimizer_precision != "fp32":
        raise InputError("plan.optimizer_precision", plan.optimizer_precision, "fp32 with optimizer: muon")
    if plan.fp32_params:
        raise InputError("plan.fp32_params", True, "false with optimizer: muon")
    if plan.fp8_params:
        raise InputError("plan.fp8_params", True, "false with optimizer: muon (Muon's update of FP8 primary "
                         "weights is not modelled)")
    if plan.tp_impl != "megatron":
        raise InputError("plan.tp_impl", plan.tp_impl, "megatron with optimizer: muon (Megatron-Core's "
                         "TensorParallelMuon gathers each matrix over TP)")


def _divides(field: str, value: int, target_field: str, target: int) -> None:
    if target % value:
        raise InputError(field, value, f"must divide {target_field}={target}")
