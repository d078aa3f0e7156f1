"""Megatron-DeepSpeed: the fork of Megatron-LM that trains under DeepSpeed's engine.

A launch script is Megatron-DeepSpeed's where it gives `--deepspeed` (DeepSpeed's
add_config_arguments, as microsoft/Megatron-DeepSpeed@f4157bea megatron/arguments.py adds
them). Its model arguments are Megatron-LM's of 2021-22 with its own names for what came later:
`--num-key-value-heads` (grouped-query attention), `--use-rotary-position-embeddings`,
`--normalization layernorm|rmsnorm`, and FlashAttention by version: `--use-flash-attn` is
FlashAttention 1 (`--use-flash-attn-v1`), `--use-flash-attn-v2` the flash_attn package's second
(plan.attention_kernel flash2), Triton's and the op builder's are others (same file).

Under `--deepspeed` the data-parallel side is DeepSpeed's: deepspeed.initialize wraps the model
with the engine the JSON config of `--deepspeed_config` describes (megatron/training.py
setup_model_and_optimizer), so Megatron's own DDP, distributed optimizer and gradient flags
do nothing; the ZeRO stage, offload and the gradients' precision and overlap are read from that
config as the DeepSpeed importer reads one (deepspeed.read_engine). Unless
`--no-pipeline-parallel`, the model is a PipelineModule run by DeepSpeed's PipelineEngine
(args.ds_pipeline_enabled), even on one stage: its TrainSchedule is the 1F1B schedule without
interleaving, it takes ZeRO-0 or 1 only, reduces the gradients after the last micro-batch and
recomputes uniform intervals of layers only (pipeline_recompute).
The config is the file the script names, as the script writes it in a here-document
(launch_script.py) or as it lies beside the script.
"""

from __future__ import annotations

from pathlib import Path

from ..yamlio import read_text
from . import deepspeed
from .common import Account, merge_into

# Megatron-DeepSpeed's store-true arguments beyond Megatron-LM's (launch_script.STORE_TRUE)
STORE_TRUE = {"deepspeed", "no-pipeline-parallel", "use-rotary-position-embeddings", "use-flash-attn-v1",
              "use-flash-attn-v2", "use-flash-attn-triton", "use-flash-attn-builder",
              "deepspeed-activation-checkpointing", "force-ds-sequence-parallel", "ds-sequence-parallel-fpdt",
              "enable-zbh1-pipeline", "enable-zbh1-exact-semantics"}
# Megatron's data-parallel arguments, which do nothing under DeepSpeed's engine
MEGATRON_DDP = ("use-distributed-optimizer", "overlap-grad-reduce", "overlap-param-gather", "DDP-impl",
                "accumulate-allreduce-grads-in-fp32", "grad-reduce-in-bf16", "fp32-allreduce",
                "num-distributed-optimizer-instances", "use-contiguous-buffers-in-local-ddp")


# DeepSpeed's activation checkpointing as Megatron-DeepSpeed runs it (deepspeed.checkpointing.configure)
CHECKPOINT_REASONS = {
    "activation_checkpointing.partition_activations": "checkpoints split over the TP ranks are not modelled",
    "activation_checkpointing.cpu_checkpointing": "checkpoints moved to host memory are not modelled",
    "activation_checkpointing.*": "not modelled"}


def is_fork(a: Account) -> bool:
    return bool(a.get("deepspeed"))


def dense_key(a: Account):
    """Megatron-Core's MoE keys as the Megatron importer reads them (megatron.megatron_key), for a
    Megatron-DeepSpeed model: dense, its --num-experts (one count per expert layer, default 1)
    all 1. DeepSpeed-MoE (its experts, --moe-expert-parallel-size, PR-MoE's residual experts) is
    another MoE layer than Megatron-Core's, and refused."""
    from .megatron import megatron_key
    experts = a.get("num-experts")
    if experts is not None:
        if any(str(n) != "1" for n in (experts if isinstance(experts, list) else [experts])):
            a.refuse("num-experts", "DeepSpeed-MoE (Megatron-DeepSpeed's experts) is not modelled; Megatron-Core's "
                                    "MoE is (Megatron-LM scripts)")
        a.used("num-experts")
    return lambda field: "(dense under DeepSpeed)" if field == "num_moe_experts" else megatron_key(field)


def attention(a: Account) -> str | None:
    """The attention kernel its FlashAttention flags name: None for the unfused attention,
    "flash2" for the second version; the others are refused (no profile has their rates)."""
    for key, what in (("use-flash-attn", "FlashAttention 1"), ("use-flash-attn-v1", "FlashAttention 1"),
                      ("use-flash-attn-triton", "Triton's FlashAttention"),
                      ("use-flash-attn-builder", "DeepSpeed's FlashAttention op builder")):
        if a.get(key):
            a.refuse(key, f"{what}'s rate is in no accelerator profile; --use-flash-attn-v2 is modelled")
    a.used("use-flash-attn-v2")
    return "flash2" if a.get("use-flash-attn-v2") else None


def read_engine(a: Account, files: dict, base: Path | None, precision: str, pp: int, vpp, micro: int,
                global_batch: int) -> None:
    """The DeepSpeed config's engine (deepspeed.read_engine) into `a`'s scenario and account."""
    if (number := a.number("ds-sequence-parallel-size", 1)) > 1:
        a.refuse("ds-sequence-parallel-size", f"DeepSpeed-Ulysses over {number} ranks is not modelled "
                                              "(TransformerEngine's all-to-all context parallelism is: "
                                              "plan.cp_attention ulysses)")
    # DeepSpeed's implementation of the recomputation the recompute arguments ask for; what its
    # config's activation_checkpointing section changes (partitioned or CPU checkpoints) is reported
    a.used("ds-sequence-parallel-size", "deepspeed", "deepspeed-activation-checkpointing")
    a.ignore(*MEGATRON_DDP)
    pipeline = not a.get("no-pipeline-parallel")
    if a.get("enable-zbh1-pipeline"):  # megatron/core/pipeline_parallel/deepspeed_zbh1_schedule.py
        a.refuse("enable-zbh1-pipeline", "Megatron-DeepSpeed's ZB-H1 splits the backward pass only outside its "
                 "steady state (and the first stage never): not the paper's schedule llmsim runs as zb-h1")
    if pipeline and vpp and vpp > 1:
        a.refuse("num-layers-per-virtual-pipeline-stage" if a.has("num-layers-per-virtual-pipeline-stage") else
                 "virtual-pipeline-model-parallel-size", "DeepSpeed's pipeline engine does not interleave stages")
    if not pipeline and pp > 1:
        a.refuse("no-pipeline-parallel", "Megatron-DeepSpeed asserts a pipeline size of 1 with it")
    a.used("no-pipeline-parallel")
    path = a.get("deepspeed_config")
    if path is None:
        a.refuse("deepspeed_config", "--deepspeed needs the DeepSpeed config: give --deepspeed_config")
    text = files.get(str(path))
    if text is None:
        beside = (base or Path(".")) / str(path)
        if not beside.is_file():
            a.refuse("deepspeed_config", f"not found beside the script ({beside}) nor written by it")
        text = read_text(beside, "deepspeed")
    d = deepspeed.config_account(text, f"deepspeed_config {path}", a.scenario)
    a.used("deepspeed_config")
    ds_precision = deepspeed.config_precision(d)
    if ds_precision != (precision if precision in ("bf16", "fp16") else "fp32"):
        d.refuse("bf16.enabled" if d.has("bf16.enabled") else "fp16.enabled",
                 f"DeepSpeed's {ds_precision} where the script trains in {precision}")
    d.used("bf16.enabled", "fp16.enabled")
    for key, value in (("train_micro_batch_size_per_gpu", micro), ("train_batch_size", global_batch)):
        if d.has(key) and d.number(key) != value:
            d.refuse(key, f"the script's batch is {value} (DeepSpeed takes its accumulation from the config)")
        d.used(key)
    d.used("gradient_accumulation_steps")
    zero, stage = a.number("zero-stage"), d.number("zero_optimization.stage", 0)
    if zero is not None and zero != stage:
        a.refuse("zero-stage", f"the DeepSpeed config runs ZeRO-{stage}")
    a.used("zero-stage")
    deepspeed.read_engine(d, precision, pipeline)
    # the checkpointing Megatron-DeepSpeed's recompute arguments ask for, stored as this section says
    d.ignore(*(k for k, v in d.flat.items() if k.startswith("activation_checkpointing.") and not v))
    merge_into(a.result, d.finish(deepspeed.IGNORED, {**CHECKPOINT_REASONS, **deepspeed.REASONS}), f"{path}:")


def pipeline_recompute(a: Account) -> None:
    """Full recomputation under DeepSpeed's pipeline engine: the PipelineModule checkpoints every
    N layers, N from --checkpoint-num-layers or, with the uniform method, --recompute-num-layers,
    and with the block method nothing ("deepspeed's pipeline doesn't support the block recompute
    method": Megatron-DeepSpeed@f4157bea megatron/model/gpt_model.py GPTModelPipe)."""
    plan = a.scenario["plan"]
    if a.get("no-pipeline-parallel") or plan.get("recompute") != "full" or plan.get("recompute_method") != "block":
        return
    for field in ("recompute_method", "recompute_num_layers"):
        plan.pop(field, None)
    a.map("recompute-method", "plan.recompute", "none", "DeepSpeed's pipeline engine runs no block recomputation")
