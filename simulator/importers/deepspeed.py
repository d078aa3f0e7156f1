"""DeepSpeed config (JSON) -> scenario plan.

Keys as DeepSpeed's config documentation names them (deepspeed/runtime/config.py,
zero/config.py): train_batch_size = train_micro_batch_size_per_gpu x
gradient_accumulation_steps x data-parallel size (any two give the third with the cluster);
zero_optimization.stage; offload_optimizer.device / offload_param.device none|cpu|nvme
(and the older zero_optimization.cpu_offload = optimizer offload to cpu); fp16 / bf16
enabled; the gradients' precision and overlap as DeepSpeed's engine picks its optimizer wrapper
(_gradients).
A DeepSpeed config has no model: give --preset (or --hf-config, model fields) with the
cluster, and --global-batch (--micro-batch) when the config leaves the batch sizes to the HF
Trainer. Values "auto" (filled by the HF Trainer) are refused: the number is not in the file.
"""

from __future__ import annotations

from pathlib import Path

from ..errors import InputError
from ..yamlio import parse_json, read_text
from .common import Account, Imported

IGNORED = ("steps_per_print", "wall_clock_breakdown", "optimizer.params.*", "scheduler.*",
           "fp16.loss_scale*", "fp16.initial_scale_power", "fp16.hysteresis", "fp16.min_loss_scale",
           "zero_allow_untested_optimizer", "zero_optimization.offload_*.nvme_path",
           "zero_optimization.offload_*.pin_memory",
           "zero_optimization.stage3_gather_*", "tensorboard.*", "wandb.*", "csv_monitor.*", "flops_profiler.*",
           "prescale_gradients", "zero_optimization.offload_param.max_in_cpu", "comms_logger.*")
REASONS = {"zero_optimization.*bucket*": "collective bucketing is not modelled, nor the buckets' memory",
           "zero_optimization.contiguous_gradients": "buffer layout is not modelled",
           "zero_optimization.stage3_*": "ZeRO-3 prefetch and persistence thresholds are not modelled",
           "zero_optimization.sub_group_size": "not modelled",
           "zero_optimization.offload_*.buffer_*": "NVMe staging buffers are not modelled",
           "zero_optimization.offload_*.pipeline_*": "NVMe read/write pipelining is not modelled",
           "aio.*": "NVMe asynchronous I/O settings are not modelled (the node profile's NVMe bandwidth is used)",
           "activation_checkpointing.*": "DeepSpeed activation checkpointing is set by the model code; "
                                         "give --recompute"}


def read(path: str | Path) -> Imported:
    a = config_account(read_text(path, "deepspeed"), "deepspeed")
    a.scenario["name"] = f"deepspeed-{Path(str(path)).stem}"
    micro = a.number("train_micro_batch_size_per_gpu")
    accumulation = a.number("gradient_accumulation_steps")
    total = a.number("train_batch_size")
    if micro is not None:
        a.map("train_micro_batch_size_per_gpu", "plan.micro_batch", micro)
    if total is not None:
        a.map("train_batch_size", "plan.global_batch", total)
    if micro is not None and accumulation is not None and total is None:
        a.derive("gradient_accumulation_steps", "plan.global_batch", f"{micro} x {accumulation} x dp",
                 lambda c: micro * accumulation * c["dp"])
    elif micro is None and total is not None:
        steps = accumulation or 1
        a.derive("gradient_accumulation_steps", "plan.micro_batch", f"{total} / ({steps} x dp)",
                 lambda c: total // (steps * c["dp"]))
    a.used("gradient_accumulation_steps")  # neither batch size given (the HF Trainer fills them): --global-batch

    precision = config_precision(a)
    a.map("bf16.enabled" if precision == "bf16" else "fp16.enabled", "plan.precision", precision)
    a.used("bf16.enabled", "fp16.enabled")
    read_engine(a, precision)
    opt = str(a.get("optimizer.type", "Adam"))
    if opt.lower() not in ("adam", "adamw", "fusedadam", "cpuadam"):
        a.refuse("optimizer.type", "Adam, AdamW, FusedAdam or CPUAdam (Muon is modelled as Megatron-Core runs it, "
                 "from Megatron-LM and Megatron-Bridge configs)")
    a.used("optimizer.type")
    return a.finish(IGNORED, REASONS)


def config_account(text: str, where: str, scenario: dict | None = None) -> Account:
    """The account of a DeepSpeed JSON config's text (into `scenario`, where given); "auto"
    values are refused: the HF Trainer fills them in at run time."""
    data = parse_json(text, where)
    if not isinstance(data, dict):
        raise InputError(where, type(data).__name__, "expected a JSON object (a DeepSpeed config)")
    a = Account(data, where, scenario=scenario)
    for key, value in a.flat.items():
        if value == "auto":
            a.refuse(key, "'auto' is filled in by the HF Trainer at run time; write the number")
    return a


def config_precision(a: Account) -> str:
    """The training precision a DeepSpeed config enables: bf16, fp16 (not both: DeepSpeed asserts
    it, runtime/config.py) or fp32."""
    bf16, fp16 = bool(a.get("bf16.enabled", False)), bool(a.get("fp16.enabled", False))
    if bf16 and fp16:
        a.refuse("fp16.enabled", "bf16 and fp16 cannot both be enabled")
    return "bf16" if bf16 else "fp16" if fp16 else "fp32"


def read_engine(a: Account, precision: str, pipeline: bool = False) -> None:
    """What DeepSpeed's engine does with the data-parallel ranks: the ZeRO stage, offload, the
    gradients (_gradients, their accumulation unfused) and the updated weights' all-gather after
    the step. `pipeline`: the model is a PipelineModule run by DeepSpeed's PipelineEngine
    (Megatron-DeepSpeed), which refuses ZeRO-2 and 3 and overlapped reductions
    (microsoft/DeepSpeed@38327e07f deepspeed/runtime/pipe/engine.py: "ZeRO-2 and ZeRO-3 are
    incompatible with pipeline parallelism"; runtime/engine.py _configure_zero_optimizer:
    "Pipeline parallelism does not support overlapped communication, will be disabled")."""
    stage = a.number("zero_optimization.stage", 0)
    if pipeline and stage >= 2:
        a.refuse("zero_optimization.stage", "DeepSpeed's pipeline engine runs ZeRO-0 or 1 only (ZeRO-2 and ZeRO-3 "
                                            "are incompatible with pipeline parallelism)")
    if stage == 3:  # DeepSpeed releases every gathered parameter after use, the embeddings too
        a.map("zero_optimization.stage", "plan.zero3_impl", "deepspeed")
    if a.number("zero_optimization.mics_shard_size", -1) > 0:
        # MiCS (Zhang et al. 2022, "MiCS: Near-linear Scaling for Training Gigantic Model on
        # Public Cloud", Sec. 3.3) all-reduces across its replicas once per step, where
        # plan.dp_replicate (FSDP2's HSDP) does after every micro-batch's reduce-scatter
        a.refuse("zero_optimization.mics_shard_size", "MiCS's once-per-step gradient sync across replicas is not "
                 "modelled (plan.dp_replicate is FSDP2's HSDP, which all-reduces every micro-batch)")
    a.used("zero_optimization.mics_shard_size")
    for key, field in (("zero_optimization.offload_optimizer.device", "optimizer"),
                       ("zero_optimization.offload_param.device", "params")):
        device = str(a.get(key, "none"))
        if device not in ("none", "cpu", "nvme"):
            a.refuse(key, "expected none, cpu or nvme")
        if a.has(key):
            a.map(key, f"plan.offload.{field}", device)
    if a.get("zero_optimization.cpu_offload"):
        a.map("zero_optimization.cpu_offload", "plan.offload.optimizer", "cpu")
    _grad_clip(a, stage, precision, _gradients(a, stage, precision, pipeline))
    # the model's linears return their weight gradients; autograd or the engine's hooks add them into
    # its buffers (runtime/zero/stage_1_and_2.py reduce_independent_p_g_buckets_and_remove_grads,
    # bf16_optimizer.py accumulate_hp_grads_and_remove_lp @38327e07f): no fused accumulation
    a.map("zero_optimization.stage", "plan.grad_accumulation_fusion", False,
          "the engine adds every parameter's gradient apart")
    if a.scenario["plan"].get("zero_stage") in (1, 2):  # its step() ends in all_gather_dp_groups, waited for
        a.map("zero_optimization.stage", "plan.param_gather_overlap", False,
              "ZeRO-1/2 all-gathers the updated weights at the end of the optimizer step (zero/stage_1_and_2.py, "
              "bf16_optimizer.py step)")


def _grad_clip(a: Account, stage: int, precision: str, bf16_optimizer: bool) -> None:
    """What DeepSpeed's optimizer does to the gradients before its step (plan.grad_clip;
    framework_ops.py). Its ZeRO optimizers and its FP16 and BF16 optimizers take their norm every
    step, whatever gradient_clipping says (for the clip, the loss scale's overflow check and the
    log); under ZeRO they multiply them every step by 1 / (loss scale x clip factor)
    (microsoft/DeepSpeed@38327e07f runtime/zero/stage_1_and_2.py and stage3.py
    unscale_and_clip_grads): norm-scale, or in fp16 norm, that multiply being the unscaling
    llmsim counts with the precision. The FP16_Optimizer folds the factor into its fused Adam
    step (runtime/fp16/fused_optimizer.py step, apply_scale=False; its unscaling, counted with
    the precision all the same, is a pass llmsim adds that it does not run) and the
    BF16_Optimizer scales only where the norm exceeds the limit (runtime/utils.py
    clip_tensors_by_global_norm): norm. An fp32 model without ZeRO is clipped by the engine
    with torch's clip_grad_norm_ where gradient_clipping is above 0 (runtime/engine.py
    clip_fp32_gradients)."""
    if stage == 0 and precision == "fp32":
        a.map("gradient_clipping", "plan.grad_clip", "norm-scale" if a.number("gradient_clipping", 0.0, False) > 0
              else "none")
        return
    scaled = stage >= 1 and not bf16_optimizer and precision != "fp16"
    a.map("gradient_clipping", "plan.grad_clip", "norm-scale" if scaled else "norm")


# DeepSpeed's spellings of a data type (deepspeed/runtime/config.py DtypeEnum)
DTYPES = {"fp16": "fp16", "float16": "fp16", "half": "fp16", "torch.float16": "fp16", "bf16": "bf16",
          "bfloat16": "bf16", "torch.bfloat16": "bf16", "fp32": "fp32", "float32": "fp32", "float": "fp32",
          "torch.float32": "fp32"}


def _dtype(a: Account, key: str, default: str) -> str:
    value = a.get(key)
    if value is None:
        return default
    if str(value).lower() not in DTYPES:
        a.refuse(key, "fp16, bf16 or fp32")
    return DTYPES[str(value).lower()]


def _gradients(a: Account, stage: int, precision: str, pipeline: bool = False) -> bool:
    """The precision gradients are kept and reduced in, and whether the reduction overlaps the
    backward pass, as DeepSpeed's engine runs them (microsoft/DeepSpeed@38327e07f
    deepspeed/runtime/engine.py get_data_types, _do_optimizer_sanity_check,
    communication_data_type; zero/config.py overlap_comm_valid):
    - gradients accumulate in data_types.grad_accum_dtype, by default the model's dtype, fp32 for
      bf16 without ZeRO; they are reduced in communication_data_type, by default the model's;
    - bf16 accumulating in fp32 without ZeRO (or with ZeRO-1 without CPU offload) runs the
      BF16_Optimizer (runtime/bf16_optimizer.py): a full fp32 gradient buffer, all-reduced in
      bf16 after the backward pass, the fp32 master and Adam states partitioned over the
      data-parallel ranks, the updated bf16 weights all-gathered. That is plan.zero_stage 1 with
      fp32 gradients: the same memory, and its 4-byte reduce-scatter moves the bytes of the
      2-byte all-reduce (the weights' all-gather alike);
    - without ZeRO the engine all-reduces after the backward pass (allreduce_gradients at the
      accumulation boundary); ZeRO overlaps its reductions with the backward pass by
      zero_optimization.overlap_comm, by default on for stage 3 only.
    llmsim keeps and reduces gradients in one precision: configs that keep them in one and
    reduce them in another are refused. Returns whether the engine runs the BF16_Optimizer."""
    accum = _dtype(a, "data_types.grad_accum_dtype", "fp32" if precision == "bf16" and stage == 0 else precision)
    sent = _dtype(a, "communication_data_type", precision)
    offload = str(a.get("zero_optimization.offload_optimizer.device", "none")) != "none" or \
        bool(a.get("zero_optimization.cpu_offload"))
    if precision == "bf16" and accum == "fp32" and (stage == 0 or (stage == 1 and not offload)):
        if sent != "bf16":
            a.refuse("communication_data_type", f"DeepSpeed's BF16_Optimizer (bf16 accumulating in fp32) all-reduces "
                                                f"its fp32 gradients in {sent}, which llmsim does not model (bf16 is)")
        a.map("zero_optimization.stage", "plan.zero_stage", 1, "DeepSpeed's BF16_Optimizer: Adam's states "
              "partitioned, fp32 gradients all-reduced in bf16 after the backward pass, the weights all-gathered")
        a.map("data_types.grad_accum_dtype", "plan.grad_precision", "fp32")
        a.map("zero_optimization.stage", "plan.dp_overlap", False)
        a.used("communication_data_type")
        a.ignore("zero_optimization.overlap_comm")
        return True
    a.map("zero_optimization.stage", "plan.zero_stage", stage)
    if stage == 0 and precision == "bf16":
        a.refuse("data_types.grad_accum_dtype", "DeepSpeed refuses bf16 gradient accumulation without ZeRO (outside "
                                                "its pipeline engine)")
    if accum != precision:
        a.refuse("data_types.grad_accum_dtype", f"gradients accumulated in {accum} and reduced in {precision}: "
                                                "llmsim keeps and reduces them in one precision")
    if sent != accum:
        a.refuse("communication_data_type", f"gradients kept in {accum} and reduced in {sent}: llmsim keeps and "
                                            "reduces them in one precision")
    a.map("data_types.grad_accum_dtype", "plan.grad_precision", accum)
    a.used("communication_data_type")
    if stage == 0:
        a.map("zero_optimization.stage", "plan.dp_overlap", False)
        a.unmapped("zero_optimization.overlap_comm", "applies to ZeRO stages 1-3; without ZeRO the engine all-reduces "
                                                     "after the backward pass")
    elif pipeline:
        a.map("zero_optimization.stage", "plan.dp_overlap", False)
        a.ignore("zero_optimization.overlap_comm")
    else:
        a.map("zero_optimization.overlap_comm", "plan.dp_overlap", bool(a.get("zero_optimization.overlap_comm",
                                                                              stage == 3)))
    _bucket_note(a, stage, precision, pipeline)
    return False


def _bucket_note(a: Account, stage: int, precision: str, pipeline: bool) -> None:
    """Where the config leaves reduce_bucket_size at its default, say what llmsim leaves out of
    memory: DeepSpeed's ZeRO optimizer copies the gradients as they come into contiguous buckets
    of reduce_bucket_size elements (5e8 by default) in the model's dtype, two of them with
    overlap_comm under stages 1 and 2, one with it off, under its pipeline engine or at stage 3
    (microsoft/DeepSpeed@38327e07f deepspeed/runtime/zero/config.py contiguous_gradients True;
    stage_1_and_2.py backward and reduce_gradients: ipg_buffer; stage3.py
    __ipg_bucket_flat_buffer). A given size is listed unmapped (REASONS)."""
    if stage == 0 or not a.get("zero_optimization.contiguous_gradients", True) \
            or a.has("zero_optimization.reduce_bucket_size"):
        return
    buckets = 2 if stage < 3 and not pipeline and a.get("zero_optimization.overlap_comm", False) else 1
    gb = buckets * 5e8 * (4 if precision == "fp32" else 2) / 1e9
    what = "two contiguous gradient buckets" if buckets == 2 else "a contiguous gradient bucket"
    a.absent("zero_optimization.reduce_bucket_size",
             f"DeepSpeed's default 5e8 elements: {what}, {gb:g} GB, which llmsim does not count in memory")
