"""torchtitan job config (TOML, torchtitan v0.2.2 and earlier) -> scenario.

Keys as torchtitan's JobConfig names them (torchtitan/config/job_config.py; the train_configs
under torchtitan/models/llama3/ at commit 01424cb are the test fixtures):

- [model] name + flavor -> a preset: llama3 8B/70B/405B are Llama 3.1's shapes
  (torchtitan/models/llama3/__init__.py @00f555e: dim, n_layers, n_heads, n_kv_heads, FFN
  multiplier); deepseek_v3 671B, qwen3 30B-A3B / 235B-A22B and llama4 17bx16e / 17bx128e are
  the MoE presets (v0.2.2 @73a0e6979 models/*/__init__.py; DeepSeek-V3 without MTP, its
  FlexAttention block_causal mask said; Llama 4 causal with RoPE on every layer,
  LLAMA4_CAUSAL), their expert parallelism in `_experts`;
  converters = float8 (quantize.linear.float8 since torchtitan@8a2686c4a) ->
  precision fp8 (Float8 linears), with [float8] ([quantize.linear.float8]) recipe_name
  (torchao's dynamic scaling: tensorwise unless named; rowwise) -> fp8_recipe and
  enable_fsdp_float8_all_gather (with precompute_float8_dynamic_scale_for_fsdp) ->
  fp8_fsdp_all_gather; other converters (MX, grouped GEMMs) are refused.
- [training] local_batch_size (or batch_size, older) is per data-parallel rank; global batch =
  global_batch_size when set, else local x dp; seq_len; steps -> training tokens;
  mixed_precision_param -> precision (16 bits: fp32 parameters cast for compute, states.py),
  mixed_precision_reduce -> gradient precision.
- [parallelism] data_parallel_shard_degree (FSDP2: ZeRO-3 over the shard group; -1 fills the
  devices) and data_parallel_replicate_degree (DDP); both > 1 is HSDP: ZeRO-3 over
  replicate x shard ranks with plan.dp_replicate replicas (dataparallel.py). tensor_parallel_degree
  (torchtitan's TP plan shards the norms' sequence too: sequence parallelism; DTensor's
  linears: tp_impl dtensor), enable_async_tensor_parallel -> TP overlap by async TP,
  pipeline_parallel_degree (torch.distributed.pipelining: pp_impl torch, its outputs kept
  in flight only, as torchtitan's trainer.py step(return_outputs=False) @e5ef99aab on) /
  _schedule (1F1B, GPipe, Interleaved1F1B, ZBVZeroBubble, DualPipeV) / _microbatch_size, and the split of the
  layers into stages (_split_points, module_fqns_per_model_part, or _layers_per_stage and
  torchtitan's default split, `split_layers`: the embedding and the output weigh one layer
  each, _first/_last_stage_less_layers, so the first and last stages hold a layer less)
  -> plan.pipeline_layout and plan.vpp, context_parallel_degree and _rotate_method (PyTorch's
  ring, cpattention.py), fsdp_reshard_after_forward (default: keep the parameters gathered
  between forward and backward under pipeline parallelism only, torchtitan/distributed/fsdp.py
  get_fsdp_reshard_after_forward_policy @b5bcd76).
- [compile] enable (training.compile, older) and components -> plan.compile: memory-bound
  kernels fused by torch.compile where the model is a compiled component, else launched op by
  op (torchtitan's default is eager).
- [model] attn_mask_type causal is what llmsim computes; block_causal (attention inside each
  packed document) and use_flex_attn (FlexAttention's kernel) are reported unmapped with what
  to give (model.document_tokens) and what the attention is priced at.
- Configs of Dec 2024 to Mar 2025 (torchtitan@9dec370, the code of its Dec 2024 benchmarks):
  the parallelism keys in [training] and [experimental] (LEGACY_KEYS, read under those names),
  Float8 by float8.enable_float8_linear with per-tensor scaling_type_* (dynamic only), the
  norm's default rmsnorm. Their pipeline counts micro-batches (pipeline_parallel_microbatches,
  also in [parallelism] until @5e2033c75), splits the layers as split_layers_2024 and, on the
  torch of that time, keeps every stage's outputs; their SDPA runs FlashAttention-2. What a
  later config cannot say is reported as assumed: torch 2.9 or later (SDPA's cuDNN attention)
  and, under PP, torchtitan v0.2.1 or later (no stage's output kept past its backward).
- [activation_checkpoint] mode none|selective|full; selective with selective_ac_option "op"
  is torchtitan's op-level policy (plan.recompute op-selective); an integer (every N-th
  layer) is refused; its checkpoints are torch.utils.checkpoint without reentrance, which
  stops re-running a fully checkpointed block early (plan.recompute_early_stop).
"""

from __future__ import annotations

from pathlib import Path

from ..errors import InputError
from ..stagesplit import balanced_layout
from ..yamlio import read_text
from .common import Account, Imported, has_flash2

PRESETS = {("llama3", "8B"): "llama-3.1-8b", ("llama3", "70B"): "llama-3.1-70b",
           ("llama3", "405B"): "llama-3.1-405b"}
# torchtitan's mixture-of-experts flavors whose shapes are llmsim presets (torchtitan v0.2.2,
# @73a0e6979: models/deepseek_v3/__init__.py, models/qwen3/__init__.py, models/llama4/__init__.py)
MOE_PRESETS = {("deepseek_v3", "671B"): "deepseek-v3", ("qwen3", "30B-A3B"): "qwen3-30b-a3b",
               ("qwen3", "235B-A22B"): "qwen3-235b-a22b", ("llama4", "17bx16e"): "llama-4-scout",
               ("llama4", "17bx128e"): "llama-4-maverick"}
PRESETS.update(MOE_PRESETS)
# torchtitan's plain Llama 4 flavors attend causally on every layer with RoPE and no qk norm
# (models/llama4/model/args.py: every_n_layers_nope None; model.py Attention has no qk norm),
# where the presets follow Meta's release (NoPE every 4th layer, chunked attention and, on
# Scout, L2 qk norms on the others); experts, shared expert and layer pattern are the presets'
# (MoEArgs top-1 with one shared expert, FFN 16384 split by top_k + shared = 8192,
# interleave_moe_layer_step 1 and 2). Its _irope flavors put NoPE on layers 0, 4, 8, ... where
# the presets put it on 3, 7, 11, ...: refused.
LLAMA4_CAUSAL = {"qk_norm": False, "qk_norm_kind": "norm", "nope_layer_interval": 0, "sliding_window": 0,
                 "sliding_window_skip_freq": 0, "window_kind": "sliding"}
# Model fields where torchtitan's model differs from its preset; DeepSeek-V3 trains no
# multi-token-prediction module in torchtitan v0.2.2
FLAVOR_FIELDS = {"deepseek_v3": {"mtp_layers": 0}, "llama4": LLAMA4_CAUSAL}
BELOW_SM90 = ("a100", "v100")  # accelerators whose CUDA capability is below 9.0 (8.0, 7.0)
NORM_TYPES = {"rmsnorm": "composite", "fused_rmsnorm": "fused", "nn.RMSNorm": "fused"}
SCHEDULES = {"1F1B": "1f1b", "GPipe": "gpipe", "Interleaved1F1B": "interleaved", "ZBVZeroBubble": "zb-v",
             "DualPipeV": "dualpipe-v"}
SINGLE_STAGE = ("1F1B", "GPipe")  # torch.distributed.pipelining's PipelineScheduleSingle: one stage per rank
V_SHAPED = ("ZBVZeroBubble", "DualPipeV")  # two stages per rank, the second coming back (stage_ids_this_rank "v")
PRECISIONS = {"bfloat16": "bf16", "float32": "fp32", "float16": "fp16"}
IGNORED = ("job.*", "profiling.*", "metrics.*", "checkpoint.*", "optimizer.lr", "optimizer.eps",
           "optimizer.weight_decay", "optimizer.beta*", "optimizer.implementation", "lr_scheduler.*",
           "training.dataset", "training.dataset_path", "training.seed", "training.deterministic",
           "training.gc_freq", "training.warmup_steps", "validation.*", "model.tokenizer_path", "model.hf_assets_path",
           "comm.*", "experimental.*", "fault_tolerance.*", "memory_estimation.*")
REASONS = {
    "compile.*": "llmsim runs the loss as the same kernels whether compiled or not",
    "float8.*": "not modelled (scales computed at every all-gather, without precomputation)",
    "quantize.linear.float8.*": "not modelled (scales computed at every all-gather, without precomputation)",
}


# torchtitan replaced its TOML job configs with Python ones (config_registry.py) after v0.2.2
# (pytorch/torchtitan@9810191bb, Feb 2026). Their JSON dump (--debug.save_config_file,
# Trainer.Config.to_dict) names no component's class, so it does not say which activation
# checkpointing, converters or token dispatcher a job runs: it cannot be read without guessing.
REFACTORED = ("expected the TOML job config of torchtitan v0.2.2 or earlier (its Python configs since "
              "pytorch/torchtitan@9810191bb, and the JSON they save, which does not name the activation "
              "checkpointing, converters or token dispatcher, are not read); give the plan as a scenario")


# Before pytorch/torchtitan@785c34c99 (2025-03-18) the parallelism keys sat in [training] and
# [experimental] (torchtitan@9dec370 torchtitan/config_manager.py, the code of torchtitan's Dec
# 2024 benchmarks); that commit moved them into [parallelism] under the same names. A config in
# that layout is read under its own names, with the defaults of its time (_legacy_layout).
LEGACY_KEYS = {f"parallelism.{k}": f"training.{k}" for k in (
    "data_parallel_replicate_degree", "data_parallel_shard_degree", "tensor_parallel_degree",
    "disable_loss_parallel", "fsdp_reshard_after_forward")}
LEGACY_KEYS.update({f"parallelism.{k}": f"experimental.{k}" for k in (
    "enable_async_tensor_parallel", "enable_compiled_autograd", "pipeline_parallel_degree",
    "pipeline_parallel_split_points", "pipeline_parallel_schedule", "pipeline_parallel_schedule_csv",
    "pipeline_parallel_microbatches", "context_parallel_degree", "context_parallel_rotate_method")})
# torchao's Float8 linears were switched on by this key before model.converters
# (pytorch/torchtitan@57387af0e, 2025-02-15)
LEGACY_FLOAT8 = "float8.enable_float8_linear"


def _legacy_layout(flat: dict) -> bool:
    """Whether the (flattened) config is in torchtitan's layout before @785c34c99 (LEGACY_KEYS);
    one that mixes both layouts is refused, as no release read both."""
    old = [k for k in (*LEGACY_KEYS.values(), LEGACY_FLOAT8) if k in flat]
    new = [k for k in flat if k.startswith("parallelism.")]
    if old and new:
        raise InputError(f"torchtitan {old[0]}", flat[old[0]], f"the layout before [parallelism] "
                         f"(pytorch/torchtitan@785c34c99), where this config also has {new[0]}: use one layout")
    return bool(old)


def _toml(path) -> dict:
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib
    text = read_text(path, "torchtitan")
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        if '"model_spec"' in text or "Trainer.Config" in text:
            raise InputError(f"torchtitan {path}", "a Python config or its JSON dump", REFACTORED) from None
        raise InputError(f"torchtitan {path}", "invalid TOML", f"expected a TOML job config ({exc})") from None


def read(path: str | Path) -> Imported:
    a = Account(_toml(path), "torchtitan")
    legacy = _legacy_layout(a.flat)
    if legacy:
        a.aliases = dict(LEGACY_KEYS)
    name, flavor = a.text("model.name"), a.text("model.flavor")
    if (name, flavor) not in PRESETS:
        a.refuse("model.flavor", f"no llmsim preset for torchtitan model {name!r} flavor {flavor!r}; known: "
                 + ", ".join(f"{n} {f}" for n, f in PRESETS) + " (give model fields in a scenario instead)")
    a.map("model.flavor", "model.preset", PRESETS[(name, flavor)])
    moe = (name, flavor) in MOE_PRESETS
    for field, value in FLAVOR_FIELDS.get(name, {}).items():
        a.map("model.flavor", f"model.{field}", value)
    if name == "deepseek_v3":
        # its flavors attend with FlexAttention inside each packed document (attn_type "flex",
        # attn_mask_type "block_causal" in the flavor, not in the TOML)
        a.absent("model.attn_mask_type", "the DeepSeek-V3 flavor attends inside each document of the packed "
                 "batch (FlexAttention, block_causal): give model.document_tokens (--set, the documents' "
                 "E[d²]/E[d] tokens), else the attention is counted over the whole sequence, at the profile's "
                 "fused attention kernel's rate")
    # torchtitan's model code: separate wq, wk, wv and w1, w3 linears (projections.py)
    a.map("model.name", "plan.projections", "separate")
    a.scenario["name"] = f"torchtitan-{name}-{flavor}"

    converters = a.texts("model.converters")
    precision = PRECISIONS.get(a.text("training.mixed_precision_param", "bfloat16"))
    if precision is None:
        a.refuse("training.mixed_precision_param", "expected bfloat16, float16 or float32")
    a.map("training.mixed_precision_param", "plan.precision", precision)
    if precision != "fp32":  # the model is built in fp32 and cast for compute: no separate master copy
        a.map("training.mixed_precision_param", "plan.fp32_params", True)
    _float8(a, converters)
    _attention(a)
    # a number of micro-batches, not their size: torchtitan before @5e2033c75 (2025-04-07)
    count_era = legacy or a.has("parallelism.pipeline_parallel_microbatches")
    # SDPA's kernel is the torch release's choice: FlashAttention-2 before torch 2.9, cuDNN's
    # attention on H100 since (pytorch/pytorch PR #162073, Sep 2025)
    if count_era:  # configs of early 2025 ran the torch of then
        a.derive("model.name", "plan.attention_kernel", "SDPA's FlashAttention-2 where the profile has its rate",
                 lambda c: "flash2" if has_flash2(c["accelerator"]) else "fused")
    else:
        a.absent("torch release", "taken as 2.9 or later, whose SDPA runs cuDNN's attention on H100 (the profile's "
                 "fused attention); earlier torch ran FlashAttention-2: --set plan.attention_kernel=flash2")
    reduce = PRECISIONS.get(a.text("training.mixed_precision_reduce", "float32"))
    if reduce is None:
        a.refuse("training.mixed_precision_reduce", "expected bfloat16, float16 or float32")
    a.map("training.mixed_precision_reduce", "plan.grad_precision", reduce)
    # every step: torch.nn.utils.clip_grad_norm_ (the PP one in torchtitan's dist_utils), whose
    # _foreach_mul_ by min(1, max_norm / norm) scales the gradients whether or not they clip
    a.map("training.max_norm", "plan.grad_clip", "norm-scale")

    if a.text("training.dtype", "float32") != "float32":  # torchtitan v0.2: full bf16 training
        a.refuse("training.dtype", "float32: parameters, gradients and Adam states all in bfloat16 with no fp32 "
                 "copy are not modelled (llmsim's bf16 optimizer states keep a bf16 master copy: NeMo's)")
    a.used("training.dtype")
    if a.get("training.enable_cpu_offload", False):
        a.refuse("training.enable_cpu_offload", "false: FSDP2's CPU offload (the shards and gradients in host memory, "
                 "torch's optimizer stepping on the CPU) is not modelled; llmsim's plan.offload is DeepSpeed's")
    a.used("training.enable_cpu_offload")
    if a.get("fault_tolerance.enable", False):
        a.refuse("fault_tolerance.enable", "false: torchft's replica groups (their gradient all-reduce over its own "
                 "process group, gloo by default, and semi-sync training) are not modelled")
    opt = a.text("optimizer.name", "AdamW")
    if opt not in ("AdamW", "Adam"):
        a.refuse("optimizer.name", "Adam or AdamW (torchtitan's DistMuon is not modelled; Muon is as Megatron-Core "
                 "runs it, from Megatron-LM and Megatron-Bridge configs)")
    a.used("optimizer.name")

    tp = a.number("parallelism.tensor_parallel_degree", 1)
    pp = a.number("parallelism.pipeline_parallel_degree", 1)
    cp = a.number("parallelism.context_parallel_degree", 1)
    a.map("parallelism.tensor_parallel_degree", "plan.tp", tp)
    a.map("parallelism.tensor_parallel_degree", "plan.sequence_parallel", tp > 1)
    # DTensor's parallelize_module: the linears keep the all-gathered input (workload.Shard)
    a.map("parallelism.tensor_parallel_degree", "plan.tp_impl", "dtensor")
    a.map("parallelism.pipeline_parallel_degree", "plan.pp", pp)
    a.map("parallelism.context_parallel_degree", "plan.cp", cp)
    rotate = "parallelism.context_parallel_rotate_method"
    if cp > 1:  # PyTorch's context_parallel rotates K and V by all-gather unless told (cpattention.py)
        method = a.text(rotate, "allgather")
        if method not in ("allgather", "alltoall"):
            a.refuse(rotate, "expected allgather or alltoall")
        a.map(rotate, "plan.cp_attention", f"torch-{method}")
    else:
        a.used(rotate)
    if tp > 1:  # torchtitan runs the loss under DTensor's loss_parallel unless disabled
        a.map("parallelism.disable_loss_parallel", "plan.loss",
              "unfused" if a.get("parallelism.disable_loss_parallel", False) else "loss-parallel")
    else:
        a.used("parallelism.disable_loss_parallel")
    _experts(a, name, moe, tp)
    if name == "qwen3" and pp > 1:  # its TrainSpec has no pipelining_fn (models/qwen3/__init__.py)
        a.refuse("parallelism.pipeline_parallel_degree", "1: torchtitan pipelines no qwen3 model")
    if a.has("parallelism.enable_async_tensor_parallel"):
        a.map("parallelism.enable_async_tensor_parallel", "plan.tp_comm_overlap",
              bool(a.get("parallelism.enable_async_tensor_parallel")))
        a.map("parallelism.enable_async_tensor_parallel", "plan.tp_overlap", "async-tp")

    policy = "parallelism.fsdp_reshard_after_forward"
    reshard = {"default": pp == 1, "always": True, "never": False}.get(a.text(policy, "default"))
    if reshard is None:
        a.refuse(policy, "expected default, always or never")
    compile_key = "compile.enable" if a.has("compile.enable") else "training.compile"
    # [compile] components (default model and loss, torchtitan/config/job_config.py Compile):
    # the layers' kernels are fused only where the model is among them
    components = a.texts("compile.components", ["model", "loss"])
    compiled = bool(a.get(compile_key, False)) and "model" in components
    a.map(compile_key, "plan.compile", compiled)
    if tp > 1 and a.get("parallelism.enable_async_tensor_parallel", False) and not compiled:
        # async TP is a torch.compile pass (torchtitan@9dec370 parallelize_llama.py, v0.2.2
        # distributed/tensor_parallel.py maybe_enable_async_tp: "Async TP requires ...")
        a.refuse("parallelism.enable_async_tensor_parallel", "false without the model compiled: torchtitan refuses "
                 "async TP without torch.compile")
    a.used("compile.components")
    # its RMSNorm run eager: its own op by op (model.norm_type, until pytorch/torchtitan#1115) or
    # its Triton kernel, or torch's nn.RMSNorm since, one kernel on CUDA from torch 2.8 (fusion.py)
    norm = a.text("model.norm_type", "rmsnorm" if legacy else "nn.RMSNorm")  # torchtitan@9dec370's default
    if norm not in NORM_TYPES:
        a.refuse("model.norm_type", "rmsnorm or fused_rmsnorm (llmsim's presets of torchtitan's models use RMSNorm)")
    a.map("model.norm_type" if a.has("model.norm_type") else "model.name", "plan.eager_norm", NORM_TYPES[norm])

    replicate = a.number("parallelism.data_parallel_replicate_degree", 1)
    shard = a.number("parallelism.data_parallel_shard_degree", -1)
    if shard == 1:
        a.map("parallelism.data_parallel_replicate_degree", "plan.zero_stage", 0)  # DDP
        a.used("parallelism.data_parallel_shard_degree", policy)
        dp = replicate
    else:
        a.map("parallelism.data_parallel_shard_degree", "plan.zero_stage", 3)  # FSDP2: parameters sharded too
        if replicate > 1:  # HSDP
            a.map("parallelism.data_parallel_replicate_degree", "plan.dp_replicate", replicate)
        else:
            a.used("parallelism.data_parallel_replicate_degree")
        dp = replicate * shard if shard > 0 else None
        a.map(policy, "plan.fsdp_reshard_after_forward", reshard)
    if dp is not None:
        a.map("parallelism.data_parallel_shard_degree" if shard != 1 else "parallelism.data_parallel_replicate_degree",
              "plan.dp", dp)

    local = a.number("training.local_batch_size", None)
    local_key = "training.local_batch_size"
    if local is None:
        local, local_key = a.number("training.batch_size", 8), "training.batch_size"
    if pp > 1:
        schedule = a.text("parallelism.pipeline_parallel_schedule", "1F1B")
        if schedule not in SCHEDULES:
            a.refuse("parallelism.pipeline_parallel_schedule", "modelled: " + ", ".join(SCHEDULES))
        if a.has("parallelism.pipeline_parallel_schedule_csv"):
            a.refuse("parallelism.pipeline_parallel_schedule_csv", "a schedule read from a CSV file is not modelled: "
                     "give one of " + ", ".join(SCHEDULES))
        a.map("parallelism.pipeline_parallel_schedule", "plan.schedule", SCHEDULES[schedule])
        a.map("parallelism.pipeline_parallel_degree", "plan.pp_impl", "torch")
        # torch.distributed.pipelining's buffers (pipebuffers.py): torchtitan's
        # step(return_outputs=False) keeps no output past its backward; before, on the torch of
        # the count era (2.7 and before: pytorch/pytorch#153383) every stage kept its outputs
        a.map("parallelism.pipeline_parallel_degree", "plan.pp_outputs", "every-stage" if count_era else "in-flight")
        # every micro-batch's backward runs without gradient sync and the data-parallel wrapper keeps
        # the unsharded gradients, adding each micro-batch's into them (FSDP2 in reduce_dtype) before
        # one reduction at the step's end (torch 2.13.0 distributed/pipelining/stage.py
        # backward_maybe_with_nosync; fsdp/_fully_shard/_fsdp_param.py accumulate_unsharded_grad_if_needed)
        a.map("parallelism.pipeline_parallel_degree", "plan.grad_accumulation_fusion", False,
              "under pipelining each micro-batch's gradients are added into the unsharded ones")
        if not count_era:  # the config does not say which release ran it
            a.absent("torchtitan release", "taken as v0.2.1 or later, whose pipeline keeps no stage's output past its "
                     "backward (@e5ef99aab: step(return_outputs=False)); under v0.1.0-v0.2.0 the "
                     "last stage kept every micro-batch's logits to the step's end: --set plan.pp_outputs=last-stage")
        if count_era:
            _microbatch_count(a, schedule, pp, local)
        else:
            micro = a.number("parallelism.pipeline_parallel_microbatch_size", 1)
            a.map("parallelism.pipeline_parallel_microbatch_size", "plan.micro_batch", micro)
        _pipeline_split(a, schedule, pp, count_era)
    else:
        a.used("parallelism.pipeline_parallel_layers_per_stage", "parallelism.pipeline_parallel_split_points",
               "parallelism.module_fqns_per_model_part", "parallelism.pipeline_parallel_first_stage_less_layers",
               "parallelism.pipeline_parallel_last_stage_less_layers", "parallelism.pipeline_parallel_microbatches")
        a.ignore("parallelism.pipeline_parallel_schedule")  # no pipeline: no schedule
    if pp == 1:
        a.map(local_key, "plan.micro_batch", local)
    global_batch = a.number("training.global_batch_size", -1)
    if global_batch > 0:
        a.map("training.global_batch_size", "plan.global_batch", global_batch)
        a.used(local_key)
    else:
        a.derive(local_key, "plan.global_batch", f"{local} x dp", lambda c: local * c["dp"])
        a.used("training.global_batch_size")
    seq_len = a.number("training.seq_len", 2048)
    a.map("training.seq_len", "model.seq_len", seq_len)
    if a.has("training.steps"):
        steps = a.number("training.steps")
        a.derive("training.steps", "training.tokens", f"{steps} x global_batch x seq_len",
                 lambda c: float(steps * c["global_batch"] * c["seq_len"]))

    mode = a.text("activation_checkpoint.mode", "selective")
    if mode not in ("none", "selective", "full"):
        a.refuse("activation_checkpoint.mode", "expected none, selective or full")
    if mode == "selective":
        option = a.text("activation_checkpoint.selective_ac_option", "2")
        if option != "op":
            a.refuse("activation_checkpoint.selective_ac_option", "layer-wise recomputation (every N-th layer) "
                     "is not modelled; use 'op' or mode 'full'")
        a.used("activation_checkpoint.selective_ac_option")
        # the op-level policy recomputes the mms of these linears' shapes (recompute.py, titanmoe.py)
        force = "activation_checkpoint.per_op_sac_force_recompute_mm_shapes_by_fqns"
        if a.get(force, ["moe.router.gate"]) != ["moe.router.gate"]:
            a.refuse(force, '["moe.router.gate"], the default (the router\'s gate recomputed), is modelled')
        a.used(force)
    else:
        a.ignore("activation_checkpoint.selective_ac_option",  # read by selective AC only
                 "activation_checkpoint.per_op_sac_force_recompute_mm_shapes_by_fqns")
    # torchtitan's selective AC with the 'op' option is its op-level policy (recompute.py)
    a.map("activation_checkpoint.mode", "plan.recompute", "op-selective" if mode == "selective" else mode)
    # its checkpoint_wrapper is torch.utils.checkpoint without reentrance (recompute.py)
    a.map("activation_checkpoint.mode", "plan.recompute_early_stop", True)
    return a.finish(IGNORED, REASONS)


# torchao's Float8 linears: converter name -> its config section (torchtitan renamed both in
# pytorch/torchtitan@8a2686c4a, 2025-09-30: quantize.linear.float8)
FLOAT8_CONVERTERS = {"float8": "float8", "quantize.linear.float8": "quantize.linear.float8"}


def _experts(a: Account, name: str, moe: bool, tp: int) -> None:
    """Expert parallelism of torchtitan's MoE layers (torchtitan v0.2.2 @73a0e6979):

    - the experts' group is carved out of the FSDP ranks: ep x etp x efsdp = dp_shard x cp x tp
      (distributed/parallel_dims.py build_mesh, the sparse mesh), Megatron-Core's MoE parallel
      folding, which llmsim's plan.ep / plan.etp are.
    - expert_parallel_comm_backend "standard" dispatches with all_to_all_single
      (distributed/expert_parallel.py ExpertParallel: the tokens' counts, then the tokens, then
      a permutation to local-expert order), the all-to-all dispatcher's traffic; "deepep" runs
      another layer (models/moe/moe_deepep.py DeepEPMoE: no gather or fp32 weighting of its own,
      the shared experts beside the combine), which is not modelled: refused.
    - the experts run as torch._grouped_mm (MoEArgs.use_grouped_mm, on by default on SM90+:
      models/moe/moe.py), one launch for the local experts. Each expert's rows are padded to a
      multiple of 8 in BF16 (TOKEN_GROUP_ALIGN_SIZE_M), at most 7 rows of its k·T/E; not counted.
    - the layer is torchtitan's own (plan.moe.framework torchtitan, titanmoe.py: its router,
      gathers, permutations, fp32 weighting and eager kernels), with the flavor's
      MoEArgs.score_before_experts (plan.moe.probs_on_input: Llama 4's MoEArgs default; False in
      the DeepSeek-V3 and Qwen3 flavors) and whether the model's op-level AC save list names
      all_to_all_single (plan.moe.op_sac_saves_all_to_all: deepseek_v3 and llama4
      infra/parallelize.py do, qwen3's does not).
    - TP: torchtitan all-gathers an MoE layer's input over the TP ranks and reduce-scatters its
      output (apply_moe_ep_tp: PrepareModuleInputOutput Shard(1) -> Replicate -> Partial), every
      TP rank routing every token; without EP the experts are split over the TP ranks
      (TensorParallel), which llmsim's etp = tp is; with EP, expert_tensor_parallel_degree is the
      TP degree (ExpertTensorParallel) or 1 (the routed tokens split over the TP ranks,
      ReordererSequenceParallel): titanmoe.py.
    For a dense model the keys have no effect (JobConfig: "No effect for non-MoE models")."""
    keys = ("parallelism.expert_parallel_degree", "parallelism.expert_tensor_parallel_degree",
            "parallelism.expert_parallel_comm_backend")
    if not moe:
        a.ignore(*keys)
        return
    ep, etp = a.number(keys[0], 1), a.number(keys[1], 1)
    if etp not in (1, tp):
        a.refuse(keys[1], f"1 or the TP degree {tp} (torchtitan allows no other)")
    if a.text(keys[2], "standard") != "standard":
        a.refuse(keys[2], "standard: torchtitan's DeepEP MoE layer (models/moe/moe_deepep.py) is not modelled")
    a.map(keys[0], "plan.ep", ep)
    # without EP the experts are split over the TP ranks whatever the key says (apply_moe_ep_tp)
    a.map(keys[1], "plan.etp", tp if ep == 1 else etp)
    a.map(keys[2], "plan.moe.dispatcher", "alltoall")
    a.map("model.name", "plan.moe.framework", "torchtitan")
    # MoEArgs.use_grouped_mm: torch._grouped_mm on SM90 and later, the for-loop experts below
    # (models/llama4/model/args.py update_from_config: has_cuda_capability(9, 0); ROCm's MI300
    # reports 9.4)
    a.derive("model.flavor", "plan.moe.grouped_gemm", "grouped GEMMs on SM90+, a for-loop on A100/V100",
             lambda c: not c["accelerator"].startswith(BELOW_SM90))
    if name == "llama4":
        a.map("model.flavor", "plan.moe.probs_on_input", True)
    if name == "qwen3":
        a.map("model.name", "plan.moe.op_sac_saves_all_to_all", False)


def _attention(a: Account) -> None:
    """[model] use_flex_attn and attn_mask_type (torchtitan@7090a7b60 models/attention.py:
    FlexAttention, whose block_causal mask keeps attention inside each document of the packed
    batch, the documents cut at the data's EOS tokens). A causal mask is what llmsim computes.
    The documents' lengths are the data's, so the user is told to give them; FlexAttention's
    kernel has no measured rate in a profile, which the report says."""
    mask = a.text("model.attn_mask_type", "causal")
    if mask == "causal":
        a.used("model.attn_mask_type")
    elif mask == "block_causal":
        a.unmapped("model.attn_mask_type", "attention stays inside each document of the packed batch, and the "
                   "config does not hold their lengths (the data's EOS tokens do): give model.document_tokens "
                   "(--set, the documents' E[d²]/E[d] tokens), else the attention is counted over the whole "
                   "sequence")
    if a.get("model.use_flex_attn", False):
        a.unmapped("model.use_flex_attn", "FlexAttention's Triton kernel has no measured rate in a profile: the "
                   "attention is priced at the profile's fused (FlashAttention / cuDNN) kernel")
    else:
        a.used("model.use_flex_attn")


def _float8(a: Account, converters: list) -> None:
    """Float8 linears: precision fp8 with torchao's tensorwise (unless named) or rowwise recipe,
    and FP8 all-gathers of the FSDP shards. llmsim converts every linear of the layers and
    keeps the lm_head in BF16 (fp8.py): a filter other than the lm_head's (`output`) is said.
    Before model.converters, float8.enable_float8_linear switched them on (LEGACY_FLOAT8), its
    scaling chosen per tensor by float8.scaling_type_input/_weight/_grad_output (torchtitan@9dec370
    config_manager.py), of which torchao's dynamic scaling, the default, is modelled."""
    switch = "model.converters"
    if a.get(LEGACY_FLOAT8, False):
        converters = converters if "float8" in converters else [*converters, "float8"]
        switch = LEGACY_FLOAT8
    else:
        a.used(LEGACY_FLOAT8)
    others = [c for c in converters if c not in FLOAT8_CONVERTERS]
    if others:
        a.refuse("model.converters", "only torchao's Float8 linears are modelled (float8 or "
                                     "quantize.linear.float8), not " + ", ".join(others))
    section = FLOAT8_CONVERTERS[converters[0]] if converters else None
    # the sections of unused converters change nothing (the MoE configs carry
    # [quantize.grouped_mm.float8] and [quantize.linear.mx] beside a commented-out converter)
    a.ignore(*(k for k in a.flat if k.startswith(("float8.", "quantize.")) and not k.startswith(f"{section}.")))
    if not converters:
        a.used("model.converters")
        return
    a.map(switch, "plan.precision", "fp8")
    for tensor in ("input", "weight", "grad_output"):
        key = f"{section}.scaling_type_{tensor}"
        if a.text(key, "dynamic") != "dynamic":
            a.refuse(key, "dynamic: torchao's delayed scaling is not modelled")
        a.used(key)
    recipe = a.text(f"{section}.recipe_name", "tensorwise")
    if recipe not in ("tensorwise", "rowwise"):
        a.refuse(f"{section}.recipe_name", "llmsim models torchao's tensorwise and rowwise recipes")
    a.map(f"{section}.recipe_name", "plan.fp8_recipe", recipe)
    if a.get(f"{section}.enable_fsdp_float8_all_gather", False):
        a.map(f"{section}.enable_fsdp_float8_all_gather", "plan.fp8_fsdp_all_gather", True)
        if a.get(f"{section}.precompute_float8_dynamic_scale_for_fsdp", False):
            a.used(f"{section}.precompute_float8_dynamic_scale_for_fsdp")
    if a.has(f"{section}.filter_fqns"):
        if a.texts(f"{section}.filter_fqns") == ["output"]:
            a.used(f"{section}.filter_fqns")
        else:
            a.unmapped(f"{section}.filter_fqns", "llmsim converts every linear of the layers and keeps the lm_head "
                                                 "(output) in BF16, whatever the filter")


def _microbatch_count(a: Account, schedule: str, pp: int, local: int) -> None:
    """plan.micro_batch from pipeline_parallel_microbatches, the number of micro-batches each
    rank's local batch was split into before pytorch/torchtitan@5e2033c75 (2025-04-07). Its
    default was the PP degree (torchtitan@9dec370 pipelining_utils.py build_pipeline_schedule)
    and, from @90567fc98 (2025-01-07), the number of stages: the same for single-stage
    schedules; for the others the config does not say which, so it is asked for."""
    key = "parallelism.pipeline_parallel_microbatches"
    count = a.number(key, None)
    if count is None:
        if schedule not in SINGLE_STAGE:
            a.refuse(key, f"the number of micro-batches for {schedule}: its default was the PP degree until "
                          "pytorch/torchtitan@90567fc98 (2025-01-07) and the number of stages since, and the "
                          "config does not say which release ran it")
        count = pp
    if count < 1 or local % count:
        a.refuse(key, f"a number of micro-batches that divides the local batch of {local}")
    a.map(key, "plan.micro_batch", local // count)


def split_layers_2024(layers: int, stages: int) -> list[int]:
    """Transformer layers of each virtual stage as torchtitan split them when no split points
    were given, before pytorch/torchtitan@f64cf3c18 (2025-04-15; torchtitan@9dec370
    torchtitan/parallelisms/pipelining_utils.py generate_split_points): the first stage takes
    layers // stages, each middle stage one more while the remainder lasts, the last stage the
    rest; the embedding and the output weigh nothing."""
    base, extra = divmod(layers, stages)
    sizes = [base]
    for _ in range(stages - 2):
        sizes.append(base + (extra > 0))
        extra -= extra > 0
    return sizes + [layers - sum(sizes)]


def split_layers(layers: int, pp: int, single_stage: bool, layers_per_stage: int | None,
                 input_weight: int = 1, output_weight: int = 1) -> list[int]:
    """Transformer layers of each virtual stage as torchtitan splits them when no split is
    given (torchtitan@01424cb torchtitan/distributed/pipeline.py generate_split_points; from
    Jul 2025 @3c84ce095 torchtitan/distributed/pipeline_parallel.py
    generate_llm_fqn_per_model_part, the same split): the embedding and the output weigh
    `input_weight` and `output_weight` layers (pipeline_parallel_first/last_stage_less_layers,
    1 by default); the stages, ceil(effective layers / layers_per_stage) or one (single-stage
    schedules) or two per rank, share the effective layers evenly, the first stages taking
    one more where they do not divide (stagesplit.balanced_layout). Whether the schedule
    takes that many stages per rank is _pipeline_split's check, for every source of a split."""
    key = "torchtitan parallelism.pipeline_parallel_layers_per_stage"
    effective = layers + input_weight + output_weight
    if layers_per_stage is not None:
        stages = -(-effective // layers_per_stage)
        if stages % pp:
            raise InputError(key, layers_per_stage, f"{stages} stages for the {layers} layers plus the embedding "
                             f"and output weights do not divide over {pp} ranks (torchtitan refuses it too)")
    else:
        stages = pp * (1 if single_stage else 2)
    sizes = balanced_layout(layers, stages, input_weight, output_weight)
    if sizes is None:
        raise InputError("torchtitan parallelism.pipeline_parallel_degree", pp,
                         f"{stages} stages for {effective} effective layers leave a stage without a layer "
                         "or lighter than the embedding or output weight")
    return list(sizes)


def _stage_layers_of_parts(parts) -> list[int]:
    """Transformer layers of each model part of torchtitan's module_fqns_per_model_part."""
    return [sum(1 for name in part if str(name).startswith("layers.")) for part in parts]


def _pipeline_split(a: Account, schedule: str, pp: int, count_era: bool) -> None:
    """plan.pipeline_layout (and plan.vpp for Interleaved1F1B) from torchtitan's split of the
    layers into stages: its explicit model parts or split points, or its default split
    (split_layers; split_layers_2024 for the configs that count micro-batches, which predate
    today's split). Single-stage schedules hold one stage per rank, the V shapes two, the
    interleaved schedule two or more."""
    per_stage_key, points_key = ("parallelism.pipeline_parallel_layers_per_stage",
                                 "parallelism.pipeline_parallel_split_points")
    single = schedule in SINGLE_STAGE
    parts_key = "parallelism.module_fqns_per_model_part"
    weights = ("parallelism.pipeline_parallel_first_stage_less_layers",
               "parallelism.pipeline_parallel_last_stage_less_layers")
    points = a.get(points_key) or None
    parts = a.get(parts_key) or None
    if parts is not None:
        if not isinstance(parts, list) or not all(isinstance(p, list) for p in parts):
            a.refuse(parts_key, "expected a list of module-name lists, one per model part")
        key, how = parts_key, "the layers of each model part"
        a.used(per_stage_key, points_key, *weights)

        def sizes(c):
            return _stage_layers_of_parts(parts)
    elif points is not None:
        try:
            cuts = [int(str(x).rsplit(".", 1)[-1]) for x in points]
        except ValueError:
            a.refuse(points_key, "expected layer names such as 'layers.8'")
        if cuts != sorted(set(cuts)) or cuts[0] < 1:
            a.refuse(points_key, "expected increasing layer indices above 0")
        key, how = points_key, "the layers between the split points"
        a.used(per_stage_key, *weights)

        def sizes(c):
            return [hi - lo for lo, hi in zip([0] + cuts, cuts + [c["layers"]])]
    elif count_era:  # no layers_per_stage nor stage weights yet
        key, how = points_key, "torchtitan's default split before 2025-04-15 (the last stage takes the remainder)"

        def sizes(c):
            stages = pp * (1 if single else 2)
            if stages > c["layers"]:
                raise InputError(f"torchtitan {a.name('parallelism.pipeline_parallel_degree')}", pp,
                                 f"{stages} stages for {c['layers']} layers (torchtitan refuses it too)")
            return split_layers_2024(c["layers"], stages)
    else:
        key, how = per_stage_key, "torchtitan's default split (the embedding and the output weigh layers too)"
        layers_per_stage = a.number(per_stage_key, None)
        in_w, out_w = (a.number(k, 1) for k in weights)
        a.used(*weights)

        def sizes(c):
            return split_layers(c["layers"], pp, single, layers_per_stage, in_w, out_w)

    def layout(c):
        out = sizes(c)
        per_rank, spare = divmod(len(out), pp)
        needs = {True: "one", False: "two" if schedule in V_SHAPED else "two or more"}[single]
        if spare or (single and per_rank != 1) or (schedule in V_SHAPED and per_rank != 2) or \
                (not single and per_rank < 2):
            raise InputError(f"torchtitan {a.name(key)}", a.flat.get(a.name(key), "(default)"),
                             f"gives {len(out)} stages over {pp} ranks; {schedule} places {needs} per rank")
        return out

    a.derive(key, "plan.pipeline_layout", how, layout)
    if schedule == "Interleaved1F1B":
        a.derive(key, "plan.vpp", "stages per rank", lambda c: len(layout(c)) // pp)
