"""A Megatron-Bridge run configuration (the ConfigContainer YAML it saves, NeMo's training stack
since 2025) -> scenario.

Megatron-Bridge (NVIDIA-NeMo/Megatron-Bridge@a9497c6b src/megatron/bridge/training/config.py)
holds a run in sections: `model` (the model provider: Megatron-Core's TransformerConfig fields,
read with the Megatron-LM importer's helpers: experts, latent attention and MTP in
megatron_moe.py, the stage split in megatron_pipeline.py), `train` (micro_batch_size,
global_batch_size, train_iters), `mixed_precision` (bf16/fp16 and fp8 with its recipe, applied
over the model's own precision fields), `ddp` (distributed optimizer, Megatron-FSDP, gradient
reduction precision, overlap), `comm_overlap` (TP overlap, when set) and `optimizer` (Adam,
its state dtypes). Paths, logging, data, checkpointing, the scheduler and the tokenizer change
neither step time nor memory; neither does a model field left off (null, false, 0). Packed
SFT samples do (they attend inside themselves, model.document_tokens), but the config does not
hold their length: the import says so.
"""

from __future__ import annotations

from . import megatron_moe as moe
from .common import Account, Imported, padded_vocab
from .megatron import (CLIP_RELEASE, adam_states, fsdp_grad_precision, megatron_fsdp, nemo_key, number_of,
                       read_bf16_layers, read_cp_comm_type, read_dropout, read_fp4, read_fp8_recipe, read_grad_clip,
                       read_head_dim, read_muon, read_param_gather_overlap, read_qk_norm, read_qkv_bias,
                       read_recompute, read_rotary_fraction, read_window)
from .megatron_pipeline import read_stage_split

SECTIONS_IGNORED = ("checkpoint.*", "dataset.*", "dist.*", "logger.*", "profiling.*", "rerun_state_machine.*",
                    "rng.*", "scheduler.*", "tokenizer.*", "validation.*", "straggler*", "nvrx_straggler*", "ft*",
                    "inprocess_restart*", "tensor_inspect*", "optimizer_config_override_provider*", "_target_",
                    "*._target_", "*._call_", "*._partial_", "*._args_")
# model fields with no effect on a step's time or memory: initialisation, numerics, kernel
# choices the profiles' efficiencies stand for, inference-only and other architectures' knobs
MODEL_IGNORED = tuple(f"model.{k}" for k in (
    "init_method_std", "layernorm_epsilon", "rotary_*", "rope_*", "yarn_*", "mscale*", "beta_*", "mup_*",
    "qk_clip_*", "*fusion*", "persist_layer_norm", "barrier_with_L1_time", "batch_p2p_*", "hf_model_id",
    "clone_scatter_output_in_embedding", "scatter_embedding_sequence_parallel", "parallel_output",
    "perform_initialization", "inference_*", "kitchen_*", "mamba_*", "linear_conv_kernel_dim", "linear_key_head_dim",
    "linear_num_*", "linear_value_head_dim", "min_offloaded_tensor_size", "mlp_chunks_for_prefill",
    "mtp_loss_scaling_factor",
    "tp_comm_bootstrap_backend", "tp_comm_bulk_*", "tp_comm_overlap_ag", "tp_comm_overlap_rs", "tp_comm_split_*",
    "cuda_graph_warmup_steps", "cuda_graph_scope", "transformer_impl", "transformer_layer_spec", "bf16", "fp16",
    "fp8*", "fp4*", "params_dtype", "pipeline_dtype", "deallocate_pipeline_outputs",
    "disable_parameter_transpose_cache", "cpu_offloading_activations", "make_vocab_size_divisible_by",
    "cross_entropy_fusion_impl", "should_pad_vocab", "max_position_embeddings", "original_max_position_embeddings",
    "num_layers_at_end_in_bf16", "num_layers_at_start_in_bf16", "first_last_layers_bf16",
    "apply_query_key_layer_scaling",
    "config_logger_dir",
    "use_te_rng_tracker", "use_mamba_mem_eff_path")) + tuple(
    f"mixed_precision.{k}" for k in ("fp8_amax_*", "fp8_margin", "fp8_wgrad", "fp8_interval", "hysteresis",
                                     "initial_loss_scale", "loss_scale*", "min_loss_scale", "params_dtype",
                                     "pipeline_dtype", "fp4_recipe", "num_layers_at_*", "grad_reduce_in_fp32",
                                     "autocast_*", "first_last_layers_bf16")) + tuple(
    f"optimizer.{k}" for k in ("lr", "min_lr", "adam_*", "weight_decay", "decoupled_*", "lion_*",
                               "sgd_*", "config_logger_dir", "log_num_zeros_in_grad", "barrier_with_L1_time",
                               "hysteresis", "initial_loss_scale", "loss_scale*", "min_loss_scale", "bf16", "fp16",
                               "fp8_recipe", "timers", "params_dtype", "pin_cpu_*",
                               "overlap_param_gather*", "use_distributed_optimizer")) + tuple(
    f"train.{k}" for k in ("check_*", "decrease_batch_size_if_needed", "empty_unused_memory_level", "eval_*",
                           "exit_*", "iterations_to_skip", "manual_gc*", "skip_*", "train_sync_interval")) + tuple(
    f"ddp.{k}" for k in ("bucket_size", "check_for_large_grads", "gradient_reduce_div_fusion",
                         "pad_buckets_for_high_nccl_busbw", "align_param_gather", "suggested_communication_unit_size",
                         "fsdp_*", "nccl_ub", "disable_symmetric_registration", "megatron_fsdp_main_params_dtype",
                         "keep_fp8_transpose_cache", "param_name_patterns_for_fp32_local_accumulation",
                         "fp8_param_gather"))
REASONS = {"model.softmax_type": "a learnable softmax offset per head (attention sinks) is not counted",
           "ddp.overlap_param_gather": "read with the distributed optimizer (ZeRO-1); Megatron-FSDP's layer gathers "
                                       "overlap by overlap_grad_reduce here (plan.dp_overlap)",
           "*.reuse_grad_buf_for_mxfp8_param_ag": "the gradient buffer reused for the MXFP8 parameter all-gather is "
                                                 "not modelled: llmsim counts both",
           "model.cuda_graph_impl": "CUDA graphs are not modelled: llmsim's launch overheads are those of eager "
                                    "kernel launches"}
# model fields that change what is computed or kept: refused when on
REFUSED_ON = {"is_hybrid_model": "hybrid (Mamba) models are not modelled",
              "experimental_attention_variant": "experimental attention variants are not modelled",
              "linear_attention_freq": "linear-attention layers are not modelled",
              "attention_output_gate": "the attention output gate projection is not modelled",
              "heterogeneous_block_specs": "heterogeneous layers are not modelled",
              "cpu_offloading": "Megatron-Core's CPU offloading is not modelled (use plan.offload in a scenario)",
              "fine_grained_activation_offloading": "fine-grained activation offloading is not modelled",
              "use_kitchen": "quantisation kitchen recipes are not modelled"}
# Where the layer specs llmsim's workload models come from: Megatron-Core's GPT layer (and its
# decoder block for MoE and MLA models) and Megatron-Bridge's generic GPT specs. A model's own
# spec is refused: Gemma 2/3/4 add norms after attention and MLP (NVIDIA-NeMo/Megatron-Bridge
# @067f987df src/megatron/bridge/models/gemma/gemma3_provider.py gemma3_layer_spec:
# TERowParallelLinearLayerNorm), Llama 4 chunks its attention, a heterogeneous stack varies.
GPT_LAYER_SPECS = ("megatron.core.models.gpt.gpt_layer_specs.", "megatron.bridge.models.gpt_provider.",
                   "megatron.bridge.models.gpt.gpt_builder.")
# OLMoE's spec is the GPT layer whose query and key norms span the whole projections (Bridge
# @067f987df src/megatron/bridge/models/olmoe/olmoe_provider.py OLMoESelfAttention: q_layernorm
# and k_layernorm of hidden_size_per_attention_head x num_attention_heads)
OLMOE_SPEC = "megatron.bridge.models.olmoe.olmoe_provider.olmoe_layer_spec"
ACTIVATIONS = {"torch.nn.functional.silu": "swiglu", "torch.nn.functional.gelu": "gelu",
               "megatron.core.fusions.fused_bias_geglu.quick_gelu": "geglu"}


def read_bridge(data: dict) -> Imported:
    a = Account(data, "megatron-bridge")
    m = nemo_key
    for field, why in REFUSED_ON.items():
        if a.get(m(field)):
            a.refuse(m(field), why)
    spec = a.get(m("transformer_layer_spec._target_"))
    if spec is not None and spec != OLMOE_SPEC and not str(spec).startswith(GPT_LAYER_SPECS):
        a.refuse(m("transformer_layer_spec._target_"), "a model's own layer spec is not modelled: llmsim models "
                                                       "Megatron-Core's GPT layer")
    peft = [k for k in a.flat if k.startswith("peft.") or k == "peft" and a.flat[k]]
    if peft:
        a.refuse(peft[0], "parameter-efficient fine-tuning (LoRA) is not modelled: llmsim trains every weight")
    layers, hidden, heads = (number_of(a, m(k)) for k in ("num_layers", "hidden_size", "num_attention_heads"))
    if None in (layers, hidden, heads):
        a.refuse(m("num_layers"), "the model needs num_layers, hidden_size and num_attention_heads")
    a.scenario["name"] = "megatron-bridge-" + str(a.get(m("hf_model_id"), f"{layers}l-{hidden}h")).split("/")[-1]
    for key, field, value in (("num_layers", "layers", layers), ("hidden_size", "hidden", hidden),
                              ("num_attention_heads", "heads", heads)):
        a.map(m(key), f"model.{field}", value)
    a.scenario["model"]["name"] = a.scenario["name"]
    a.map(m("num_query_groups"), "model.kv_heads", number_of(a, m("num_query_groups"), heads))
    ffn = number_of(a, m("ffn_hidden_size"), 4 * hidden)
    a.map(m("ffn_hidden_size"), "model.ffn_hidden", ffn)
    _activation(a)
    read_head_dim(a, m("kv_channels"), bool(a.get(m("multi_latent_attention"))), number_of)
    moe.read_moe(a, nemo_key, number_of, layers, ffn)
    read_window(a, m("window_size"), m("window_attn_skip_freq"), layers)
    a.map(m("seq_length"), "model.seq_len", number_of(a, m("seq_length"), 2048))
    norm = str(a.get(m("normalization"), "LayerNorm"))
    if norm not in ("LayerNorm", "RMSNorm"):
        a.refuse(m("normalization"), "expected LayerNorm or RMSNorm")
    a.map(m("normalization"), "model.norm", norm.lower())
    read_qk_norm(a, m("qk_layernorm"), bool(a.get(m("multi_latent_attention"))))
    read_rotary_fraction(a, m("rotary_percent"), number_of)
    if spec == OLMOE_SPEC and a.get(m("qk_layernorm")):
        a.map(m("transformer_layer_spec._target_"), "model.qk_norm_scope", "full")
    position = str(a.get(m("position_embedding_type"), "learned_absolute"))
    if position not in ("learned_absolute", "rope", "yarn"):  # YaRN rescales RoPE's frequencies: RoPE's cost
        a.refuse(m("position_embedding_type"), "expected learned_absolute, rope or yarn")
    a.map(m("position_embedding_type"), "model.position_embedding", "learned" if position == "learned_absolute" else
          "rope")
    bias = bool(a.get(m("add_bias_linear"), True))
    a.map(m("add_bias_linear"), "model.bias", bias)
    read_qkv_bias(a, m("add_qkv_bias"), not bias)
    a.map(m("share_embeddings_and_output_weights"), "model.tied_embeddings",
          bool(a.get(m("share_embeddings_and_output_weights"), True)))
    read_dropout(a, m("attention_dropout"), m("hidden_dropout"))
    tp = number_of(a, m("tensor_model_parallel_size"), 1)
    pp = number_of(a, m("pipeline_model_parallel_size"), 1)
    vocab = number_of(a, m("vocab_size"))
    if vocab is None:
        a.refuse(m("vocab_size"), "the model provider names no vocabulary size")
    if a.get(m("should_pad_vocab")):  # Megatron-Core pads to a multiple of make_vocab_size_divisible_by x TP
        vocab = padded_vocab(vocab, number_of(a, m("make_vocab_size_divisible_by"), 128), tp)
    a.map(m("vocab_size"), "model.vocab", vocab)

    a.map(m("tensor_model_parallel_size"), "plan.tp", tp)
    a.map(m("pipeline_model_parallel_size"), "plan.pp", pp)
    a.map(m("context_parallel_size"), "plan.cp", number_of(a, m("context_parallel_size"), 1))
    read_cp_comm_type(a, m("cp_comm_type"), m("hierarchical_context_parallel_sizes"))
    vpp = number_of(a, m("virtual_pipeline_model_parallel_size"), 1)
    vpp = read_stage_split(a, nemo_key, layers, pp, vpp, number_of)
    a.map(m("virtual_pipeline_model_parallel_size"), "plan.vpp", vpp)
    a.scenario["plan"]["schedule"] = "interleaved" if vpp > 1 else "1f1b"
    a.map(m("sequence_parallel"), "plan.sequence_parallel", bool(a.get(m("sequence_parallel"), False)))
    a.map("train.micro_batch_size", "plan.micro_batch", number_of(a, "train.micro_batch_size", 1))
    global_batch = number_of(a, "train.global_batch_size")
    if global_batch is None:
        a.refuse("train.global_batch_size", "required: llmsim needs the global batch")
    a.map("train.global_batch_size", "plan.global_batch", global_batch)
    if a.get("train.rampup_batch_size"):
        a.unmapped("train.rampup_batch_size", "the batch-size ramp-up of the first steps is not modelled")
    precision = _precision(a)
    _sharding(a, precision)
    overlap = a.get("comm_overlap.tp_comm_overlap") if a.get("comm_overlap") is not None else None
    a.map("comm_overlap.tp_comm_overlap" if overlap is not None else m("tp_comm_overlap"), "plan.tp_comm_overlap",
          bool(overlap if overlap is not None else a.get(m("tp_comm_overlap"), False)))
    a.map(m("attention_backend"), "plan.flash_attention",
          str(a.get(m("attention_backend"), "auto")) in ("auto", "flash", "fused", "AttnBackend.auto",
                                                         "AttnBackend.flash", "AttnBackend.fused"))
    a.map(m("cross_entropy_loss_fusion"), "plan.loss", "vocab-parallel")
    # Bridge's providers default it to whether the fused kernel is importable
    # (fusions.can_enable_gradient_accumulation_fusion): on the GPU hosts these configs are for
    a.map(m("gradient_accumulation_fusion"), "plan.grad_accumulation_fusion",
          bool(a.get(m("gradient_accumulation_fusion"), True)))
    read_recompute(a, nemo_key, a.get(m("recompute_granularity")), m("recompute_granularity"))
    _optimizer(a)
    seq = number_of(a, m("seq_length"), 2048)
    if a.get("train.train_iters"):
        a.map("train.train_iters", "training.tokens", float(number_of(a, "train.train_iters") * global_batch * seq))
    elif a.get("train.train_samples"):
        a.map("train.train_samples", "training.tokens", float(number_of(a, "train.train_samples") * seq))
    if a.get(m("softmax_type")) == "vanilla":
        a.used(m("softmax_type"))
    _packing(a)
    # a field left off (null, false, 0, empty) asks for nothing llmsim would model
    a.ignore(*(k for k, v in a.flat.items() if v is None or v is False or v == 0 or v in ("", "none", [], {})))
    return a.finish(SECTIONS_IGNORED + MODEL_IGNORED + moe.ignored(nemo_key),
                    {**REASONS, **moe.reasons(nemo_key)})


# Packed SFT samples: `packed_sequence_specs` at a9497c6b, `offline_packing_specs` at 067f987df
# (src/megatron/bridge/data/builders/gpt_sft.py)
PACKING_KEYS = ("dataset.packed_sequence_specs.packed_sequence_size",
                "dataset.offline_packing_specs.packed_sequence_size")


def _packing(a: Account) -> None:
    """Packed samples attend inside each one (Megatron-Core's thd layout): model.document_tokens,
    whose length (the samples') the config does not hold, so the user is told to give it."""
    for key in PACKING_KEYS:
        if a.number(key, -1) > 0:
            a.unmapped(key, "samples packed into each sequence attend only inside themselves, and the config "
                            "does not hold their length: give model.document_tokens (--set, the samples' "
                            "E[d²]/E[d] tokens), else the attention is counted over the whole sequence")


def _activation(a: Account) -> None:
    """activation_func (its import path) with gated_linear_unit: SiLU-gated SwiGLU, GELU alone
    or gated (GeGLU), GPT-OSS's quick-GELU-gated GLU."""
    target = str(a.get("model.activation_func._target_", "torch.nn.functional.gelu"))
    gated = bool(a.get("model.gated_linear_unit", False))
    name = ACTIVATIONS.get(target)
    if name is None or (name != "gelu" and not gated):
        a.refuse("model.activation_func._target_", "modelled: silu with gated_linear_unit (SwiGLU), gelu, "
                                                   "quick_gelu with gated_linear_unit")
    a.map("model.activation_func._target_", "model.activation", "geglu" if name == "gelu" and gated else name)
    a.used("model.gated_linear_unit")


def _precision(a: Account) -> str:
    """mixed_precision, which Megatron-Bridge applies over the model provider's fields (without
    it, the model's own bf16/fp16/fp8 fields hold)."""
    mp = "mixed_precision" if any(k.startswith("mixed_precision.") for k in a.flat) else "model"
    if isinstance(a.get("mixed_precision"), str):
        a.refuse("mixed_precision", "a named precision recipe: give its fields (the saved run config has them)")
    base = "bf16" if a.get(f"{mp}.bf16") else "fp16" if a.get(f"{mp}.fp16") else "fp32"
    a.used(f"{mp}.bf16", f"{mp}.fp16", f"{mp}.fp32")
    fp4 = read_fp4(a, f"{mp}.fp4", f"{mp}.fp4_recipe", f"{mp}.fp8")
    if not a.get(f"{mp}.fp8") and not fp4:
        a.map(f"{mp}.bf16" if base == "bf16" else f"{mp}.fp16", "plan.precision", base)
        a.used(f"{mp}.fp8_recipe", f"{mp}.fp8_param", f"{mp}.fp8_param_gather", f"{mp}.fp4_param",
               f"{mp}.fp4_param_gather")
        return base
    if fp4:
        precision = fp4
        a.map(f"{mp}.fp4", "plan.precision", precision)
        a.used(f"{mp}.fp8_recipe", f"{mp}.fp8_param", f"{mp}.fp8_param_gather")
    else:
        precision = read_fp8_recipe(a, f"{mp}.fp8_recipe")
        a.map(f"{mp}.fp8", "plan.precision", precision)
        a.used(f"{mp}.fp8_recipe", f"{mp}.fp4_param", f"{mp}.fp4_param_gather")
    # Megatron-Bridge's MixedPrecisionConfig overrides the model's counts with its own, 0 unless
    # set (NVIDIA-NeMo/Megatron-Bridge@067f987df src/megatron/bridge/training/mixed_precision.py
    # update_config_with_precision_overrides; bf16_with_fp8_current_scaling_mixed sets 1 and 1)
    read_bf16_layers(a, f"{mp}.first_last_layers_bf16", f"{mp}.num_layers_at_start_in_bf16",
                     f"{mp}.num_layers_at_end_in_bf16", precision, 0 if mp == "mixed_precision" else 1)
    # Megatron-Bridge keeps fp4_param and fp4_param_gather equal (MixedPrecisionConfig.__setattr__)
    params = ("fp4_param_gather", "fp4_param") if fp4 else ("fp8_param_gather", "fp8_param")
    if any(a.get(f"{mp}.{k}") for k in params):
        a.map(f"{mp}.{params[0]}", "plan.fp8_params", True)
        a.used(f"{mp}.{params[1]}")
    for key in ("fp8_dot_product_attention", "fp8_multi_head_attention"):
        if a.get(f"{mp}.{key}"):
            a.refuse(f"{mp}.{key}", "FP8 attention is not modelled")
    return precision


def _sharding(a: Account, precision: str) -> None:
    """ddp: the distributed optimizer (ZeRO-1), Megatron-FSDP by its strategy, torch FSDP2
    (dist.use_torch_fsdp2), partial distributed optimizer instances; gradients reduced in fp32
    unless grad_reduce_in_fp32 is off (Megatron-FSDP: its main-gradient dtype, by default the
    parameters')."""
    if a.get("dist.use_torch_fsdp2"):
        a.map("dist.use_torch_fsdp2", "plan.zero_stage", 3)
        a.map("dist.use_torch_fsdp2", "plan.zero3_impl", "fsdp2")
    elif a.get("ddp.use_megatron_fsdp"):
        megatron_fsdp(a, "ddp.use_megatron_fsdp", "ddp.data_parallel_sharding_strategy",
                      "ddp.outer_dp_sharding_strategy")
    else:  # Megatron-FSDP's strategies do nothing without it
        a.map("ddp.use_distributed_optimizer", "plan.zero_stage", 1 if a.get("ddp.use_distributed_optimizer") else 0)
        a.ignore("ddp.data_parallel_sharding_strategy", "ddp.outer_dp_sharding_strategy")
    instances = number_of(a, "ddp.num_distributed_optimizer_instances", 1)
    if instances > 1:
        a.map("ddp.num_distributed_optimizer_instances", "plan.dp_replicate", instances)
    else:
        a.used("ddp.num_distributed_optimizer_instances")
    if a.get("ddp.use_megatron_fsdp"):
        fsdp_grad_precision(a, precision, "ddp.megatron_fsdp_main_grads_dtype._target_",
                            "ddp.megatron_fsdp_grad_comm_dtype._target_")
    else:
        a.map("ddp.grad_reduce_in_fp32", "plan.grad_precision", "fp32" if a.get("ddp.grad_reduce_in_fp32") else
              "bf16" if precision != "fp16" else "fp16")
    a.map("ddp.overlap_grad_reduce", "plan.dp_overlap", bool(a.get("ddp.overlap_grad_reduce", False)))
    # Megatron-Core's passes over the gradient buffer before its reduction (framework_ops.py),
    # DistributedDataParallelConfig's defaults where the yaml leaves them out
    a.map("ddp.average_in_collective", "plan.dp_average_in_collective", bool(a.get("ddp.average_in_collective", False)))
    a.map("ddp.check_for_nan_in_grad", "plan.grad_nan_check", bool(a.get("ddp.check_for_nan_in_grad", False)))
    read_param_gather_overlap(a, "ddp.overlap_param_gather")


def _optimizer(a: Account) -> None:
    """Adam and the dtypes of its states, or Megatron-Core's Muon (megatron.read_muon):
    `dist_muon` (Bridge's distributed_muon_with_cosine_annealing) or `muon` with
    use_layer_wise_distributed_optimizer is the layer-wise distributed optimizer, zero_stage 1
    (megatron/core/optimizer/__init__.py @d98e8a64dd: "dist_*" names turn it on); plain `muon`
    beside ddp's distributed optimizer is refused (Megatron-Core then splits the parameters
    between two optimizers, not modelled)."""
    name = str(a.get("optimizer.optimizer", "adam"))
    if name not in ("adam", "muon", "dist_muon"):
        a.refuse("optimizer.optimizer", "modelled: adam, muon, dist_muon")
    muon = name != "adam"
    if muon:
        layer_wise = name == "dist_muon" or bool(a.get("optimizer.use_layer_wise_distributed_optimizer"))
        if not layer_wise and a.get("ddp.use_distributed_optimizer"):
            a.refuse("optimizer.optimizer", "muon with ddp.use_distributed_optimizer needs the layer-wise "
                     "distributed optimizer (dist_muon, or optimizer.use_layer_wise_distributed_optimizer)")
        a.map("optimizer.optimizer", "plan.optimizer", "muon")
        a.map("optimizer.optimizer", "plan.zero_stage", 1 if layer_wise else 0)
    a.used("optimizer.optimizer", "optimizer.use_layer_wise_distributed_optimizer")
    read_muon(a, "optimizer.optimizer", muon, bool(a.get("dist.use_torch_fsdp2") or a.get("ddp.use_megatron_fsdp")),
              lambda field: f"optimizer.{field}", "optimizer.muon_split_qkv",
              a.get("optimizer.muon_split_qkv", True) is False)
    if a.get("optimizer.optimizer_cpu_offload"):
        a.refuse("optimizer.optimizer_cpu_offload", "Megatron-Core's optimizer CPU offload is not modelled "
                                                    "(use plan.offload in a scenario)")
    adam_states(a, "optimizer.use_precision_aware_optimizer", lambda field: f"optimizer.{field}._target_",
                "optimizer.store_param_remainders")
    read_grad_clip(a, "optimizer.clip_grad", True, CLIP_RELEASE)
