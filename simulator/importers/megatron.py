"""Megatron-LM arguments (a launch script, an arguments file or an argument list) or a NeMo
(Megatron) YAML config -> scenario.

Argument names and defaults are Megatron-LM's (megatron/training/arguments.py): tied
embeddings, learned positions, GeLU, LayerNorm, biases and no overlap of the gradient
reduction unless flags say otherwise; --ffn-hidden-size defaults to 4h, or with --swiglu to
int(8h/3 / 64) * 64; the vocabulary is padded to a multiple of make-vocab-size-divisible-by
(128) x TP. --use-distributed-optimizer shards the optimizer states over data-parallel ranks
(ZeRO-1), over each of --num-distributed-optimizer-instances groups of them (plan.dp_replicate).
--fp8-format runs the linears in FP8 under --fp8-recipe delayed (the default),
tensorwise (TransformerEngine's per-tensor current scaling: fp8_recipe current) or mxfp8
(its block-wise recipe is refused);
--fp8-param-gather, like NeMo's fp8_params, keeps FP8 primary weights (plan.fp8_params);
--fp4-format e2m1 (--fp4-recipe nvfp4) runs them in NVFP4 (plan.precision nvfp4), with
--fp4-param-gather FP4 primary weights;
--first-last-layers-bf16 keeps --num-layers-at-start/end-in-bf16 layers in BF16
(plan.bf16_layers_at_start/end).
--use-megatron-fsdp shards by --data-parallel-sharding-strategy (ZeRO-0 to 3) and
--use-torch-fsdp2 is ZeRO-3, both in FSDP units. Full recomputation keeps its method and layer
count; selective recomputation keeps its --recompute-modules (recompute.py MODULES); the
arguments of before 2022 (--checkpoint-activations, --activations-checkpoint-method:
OLD_RECOMPUTE_ARGS) are full recomputation and mark a Megatron whose attention is unfused
without --use-flash-attn. Dropout is on (model.dropout) unless --attention-dropout and
--hidden-dropout (NeMo: attention_dropout, hidden_dropout) are 0: both default to 0.1.
Mixture-of-Experts, latent attention and MTP keys: megatron_moe.py. --kv-channels is the head
width. torchrun's --nproc_per_node and --nnodes give the cluster's shape.

A launch script is read as its shell words (launch_script.py); a value left as a shell
expression (`$1`) is refused when a mapped key needs it, as is a flag given twice with
different values (both branches of an `if` are read).

NeMo YAML keys are the launcher's (`trainer`, `model`, `model.optim`), as in NVIDIA's
dgxc-benchmarking configs; optim distributed_fused_adam accumulates into a full bf16 gradient
buffer and reduce-scatters once per step (ZeRO-1 timing; see shared/validation/nemo-dgxc-h100.md).
megatron_amp_O2 false (O1, NeMo's default) keeps the module's fp32 parameters as the master
copy (plan.fp32_params).
"""

from __future__ import annotations

import re
from pathlib import Path

from ..errors import InputError
from ..fp8 import LOW_PRECISIONS
from ..model import every_nth_layer, window_pattern
from ..plan import MUON_TP_MODES
from ..recompute import MODULES
from ..yamlio import parse_yaml, read_text
from . import megatron_deepspeed as mds
from . import megatron_moe as moe
from .common import TOKENIZER_VOCAB, Account, Imported, has_flash2, padded_vocab
from .launch_script import parse_args, script_words
from .megatron_pipeline import read_stage_split

IGNORED_ARGS = ("lr*", "min-lr", "decoupled-*", "weight-decay", "adam-*", "init-method-std", "seed",
                "log-*", "save*", "load", "eval-*", "data-*", "split", "vocab-file", "merge-file", "tokenizer-model",
                "tensorboard-*", "wandb-*", "exit-*", "ckpt-*", "distributed-timeout-minutes", "num-workers",
                "mock-data", "profile*", "master_addr", "master_port", "node_rank", "use-mcore-models",
                "max-position-embeddings", "tiktoken-pattern", "no-create-attention-mask-in-dataloader",
                "no-mmap-bin-files", "manual-gc*", "calculate-per-token-loss", "empty-unused-memory-level",
                "lr-*", "train-samples", "rotary-*", "apply-layernorm-1p", "tokenizer-type", "fp8-amax-*",
                "make-vocab-size-divisible-by", "no-query-key-layer-scaling", "apply-query-key-layer-scaling",
                "no-load-*", "logging-level", "norm-epsilon", "init-model-with-meta-device", "auto-detect-ckpt-format",
                "dist-ckpt-*", "mscale*", "mtp-loss-scaling-factor",
                "container-*", "output", "mpi")  # the last three: srun's, beside Megatron-LM's own in a launch script
ARG_REASONS = {"rampup-batch-size": "the batch-size ramp-up of the first steps is not modelled",
               "overlap-param-gather": "read with the distributed optimizer (ZeRO-1); Megatron-FSDP's layer gathers "
                                       "overlap by --overlap-grad-reduce here (plan.dp_overlap)"}


# ------------------------------------------------------------------ arguments

def number_of(a: Account, key: str, default=None, integer=True):
    value = a.get(key, default)
    if isinstance(value, str) and value.startswith("$"):
        a.refuse(key, f"the value is the shell expression {value}; give the arguments with their values")
    return a.number(key, default, integer)


# TransformerConfig fields whose Megatron-LM argument is named otherwise (arguments.py)
ARGUMENT_NAMES = {"num_moe_experts": "num-experts",
                  "num_layers_in_first_pipeline_stage": "decoder-first-pipeline-num-layers",
                  "num_layers_in_last_pipeline_stage": "decoder-last-pipeline-num-layers"}


def megatron_key(field: str) -> str:
    """A TransformerConfig field as Megatron-LM's argument (without its dashes)."""
    return ARGUMENT_NAMES.get(field, field.replace("_", "-"))


def nemo_key(field: str) -> str:
    """A TransformerConfig field as a NeMo YAML key."""
    return f"model.{field}"


# Megatron-Core's CP implementations (--cp-comm-type, TransformerEngine's attn_forward_func_with_cp)
CP_COMM_TYPES = {"p2p": "ring", "all_gather": "kv-allgather", "a2a": "ulysses"}


def read_cp_comm_type(a: Account, key: str, sizes_key: str) -> None:
    """--cp-comm-type (one value, or one per layer that all agree) -> plan.cp_attention; a2a+p2p
    with --hierarchical-context-parallel-sizes A2A P2P -> ulysses-ring over groups of A2A."""
    if not a.has(key):
        return
    value = a.get(key)
    values = {str(v) for v in value} if isinstance(value, (list, tuple)) else {str(value)}
    comm = next(iter(values), None)
    if len(values) != 1 or comm not in (*CP_COMM_TYPES, "a2a+p2p"):
        a.refuse(key, "modelled: one of " + ", ".join((*CP_COMM_TYPES, "a2a+p2p")) + ", the same for every layer")
    if comm != "a2a+p2p":
        a.map(key, "plan.cp_attention", CP_COMM_TYPES[comm])
        return
    sizes = a.get(sizes_key)
    if not isinstance(sizes, (list, tuple)) or len(sizes) != 2 or not str(sizes[0]).isdigit():
        a.refuse(sizes_key, "a2a+p2p needs the two hierarchical CP sizes (all-to-all group, ring)")
    a.map(key, "plan.cp_attention", "ulysses-ring")
    a.map(sizes_key, "plan.cp_ulysses", int(sizes[0]))


# Megatron-LM's recomputation arguments before --recompute-granularity (2022): --checkpoint-activations
# re-ran every layer in chunks of --checkpoint-num-layers (@152aab304d megatron/arguments.py, 2021),
# from Aug 2021 (@c1e0689d92) as --activations-checkpoint-method uniform|block with
# --activations-checkpoint-num-layers; Megatron-DeepSpeed kept them. Read under their names.
OLD_RECOMPUTE_ARGS = (("recompute-method", "activations-checkpoint-method"),
                      ("recompute-num-layers", "activations-checkpoint-num-layers"),
                      ("recompute-num-layers", "checkpoint-num-layers"))


def read_args(args: dict, files: dict | None = None, base: Path | None = None, given=frozenset()) -> Imported:
    """`files`: what the script's here-documents write; `base`: the script's folder (a
    Megatron-DeepSpeed script's DeepSpeed config: megatron_deepspeed.py); `given`: the scenario
    fields the caller sets itself (a vocabulary the tokenizer's name does not tell)."""
    a = Account(args, "megatron", {new: old for new, old in OLD_RECOMPUTE_ARGS if old in args})
    fork = mds.is_fork(a)
    layers = number_of(a, "num-layers")
    hidden = number_of(a, "hidden-size")
    heads = number_of(a, "num-attention-heads")
    if None in (layers, hidden, heads):
        raise InputError("megatron", "model", "needs --num-layers, --hidden-size and --num-attention-heads")
    swiglu = bool(a.get("swiglu", False))
    model = {"name": f"megatron-{layers}l-{hidden}h", "layers": layers, "hidden": hidden, "heads": heads}
    a.scenario["name"] = f"megatron-{layers}l-{hidden}h"
    for key, field in (("num-layers", "layers"), ("hidden-size", "hidden"), ("num-attention-heads", "heads")):
        a.map(key, f"model.{field}", model[field])
    a.scenario["model"]["name"] = model["name"]
    if fork and a.has("num-key-value-heads"):
        a.map("num-key-value-heads", "model.kv_heads", number_of(a, "num-key-value-heads"))
    else:
        kv = number_of(a, "num-query-groups", heads) if a.get("group-query-attention") else heads
        a.map("num-query-groups" if a.has("num-query-groups") else "num-attention-heads", "model.kv_heads", kv)
    a.used("group-query-attention")
    ffn = number_of(a, "ffn-hidden-size", int(8 * hidden / 3 / 64) * 64 if swiglu else 4 * hidden)
    a.map("ffn-hidden-size" if a.has("ffn-hidden-size") else "hidden-size", "model.ffn_hidden", ffn)
    read_head_dim(a, "kv-channels", bool(a.get("multi-latent-attention")), number_of)
    moe.read_moe(a, mds.dense_key(a) if fork else megatron_key, number_of, layers, ffn)
    if a.get("squared-relu"):
        a.refuse("squared-relu", "modelled activations: gelu, swiglu, quick-geglu")
    activation = "swiglu" if swiglu else "geglu" if a.get("quick-geglu") else "gelu"
    a.map("quick-geglu" if activation == "geglu" else "swiglu", "model.activation", activation)
    a.used("swiglu", "quick-geglu")
    read_window(a, "window-size", "window-attn-skip-freq", layers)
    a.map("seq-length", "model.seq_len", number_of(a, "seq-length", 2048))
    norm = str(a.get("normalization", "layernorm" if fork else "LayerNorm"))
    if norm not in (("layernorm", "rmsnorm") if fork else ("LayerNorm", "RMSNorm")):
        a.refuse("normalization", "expected layernorm or rmsnorm" if fork else "expected LayerNorm or RMSNorm")
    a.map("normalization", "model.norm", norm.lower())
    read_qk_norm(a, "qk-layernorm", bool(a.get("multi-latent-attention")))
    read_nope_layers(a, "no-rope-freq", "qk-l2-norm", layers)
    read_rotary_fraction(a, "rotary-percent", number_of)
    if fork and a.get("use-rotary-position-embeddings"):
        a.map("use-rotary-position-embeddings", "model.position_embedding", "rope")
    else:
        position = str(a.get("position-embedding-type", "learned_absolute"))
        if position not in ("learned_absolute", "rope"):
            a.refuse("position-embedding-type", "expected learned_absolute or rope")
        a.map("position-embedding-type", "model.position_embedding", "rope" if position == "rope" else "learned")
    # the learned table's switch: redundant with rotary embeddings, which drop it (Megatron-LM refuses
    # it otherwise, @d98e8a64dd arguments.py; Megatron-DeepSpeed@f4157bea arguments.py drops the table
    # for --use-rotary-position-embeddings); without either a model has no position embedding at all
    if a.get("no-position-embedding"):
        if a.scenario["model"].get("position_embedding") != "rope":
            a.refuse("no-position-embedding", "a model without any position embedding is not modelled (with "
                                              "rotary embeddings the flag is redundant)")
        a.used("no-position-embedding")
    a.map("disable-bias-linear", "model.bias", not a.get("disable-bias-linear", False))
    read_qkv_bias(a, "add-qkv-bias", bool(a.get("disable-bias-linear", False)))
    a.map("untie-embeddings-and-output-weights", "model.tied_embeddings",
          not a.get("untie-embeddings-and-output-weights", False))
    read_dropout(a, "attention-dropout", "hidden-dropout")
    read_fp32_residual(a, "fp32-residual-connection")

    tp = number_of(a, "tensor-model-parallel-size", 1)
    pp = number_of(a, "pipeline-model-parallel-size", 1)
    a.map("tensor-model-parallel-size", "plan.tp", tp)
    a.map("pipeline-model-parallel-size", "plan.pp", pp)
    a.map("context-parallel-size", "plan.cp", number_of(a, "context-parallel-size", 1))
    read_cp_comm_type(a, "cp-comm-type", "hierarchical-context-parallel-sizes")
    # a Hugging Face tokenizer is named by --tokenizer-model (a hub name or a path)
    hf = not a.has("vocab-size") and a.get("tokenizer-type") == "HuggingFaceTokenizer"
    vocab_key = "vocab-size" if a.has("vocab-size") else "tokenizer-model" if hf else "tokenizer-type"
    vocab = number_of(a, "vocab-size") if a.has("vocab-size") else TOKENIZER_VOCAB.get(
        str(a.get(vocab_key, "GPT2BPETokenizer")))
    if vocab is None and "model.vocab" not in given:
        a.refuse(vocab_key, "the tokenizer's vocabulary size is unknown; give --vocab-size (or the import --vocab)")
    if vocab is not None:
        a.map(vocab_key, "model.vocab", padded_vocab(vocab, number_of(a, "make-vocab-size-divisible-by", 128), tp))
    else:
        a.used(vocab_key, "make-vocab-size-divisible-by")
    if hf:
        a.used("tokenizer-type")
    vpp = None
    if a.has("num-layers-per-virtual-pipeline-stage"):
        per = number_of(a, "num-layers-per-virtual-pipeline-stage")
        if per < 1 or pp < 1:
            a.refuse("num-layers-per-virtual-pipeline-stage", "expected a positive integer (with a positive "
                                                              "--pipeline-model-parallel-size)")
        vpp = layers // (pp * per)
        a.map("num-layers-per-virtual-pipeline-stage", "plan.vpp", vpp)
    elif a.has("virtual-pipeline-model-parallel-size"):
        vpp = number_of(a, "virtual-pipeline-model-parallel-size")
        a.map("virtual-pipeline-model-parallel-size", "plan.vpp", vpp)
    split_vpp = read_stage_split(a, megatron_key, layers, pp, vpp or 1, number_of)
    if split_vpp != (vpp or 1):
        if vpp is not None:
            a.refuse("pipeline-model-parallel-layout", f"{split_vpp} virtual stages per rank where the arguments "
                                                       f"give {vpp}")
        vpp = split_vpp
        a.map("pipeline-model-parallel-layout", "plan.vpp", vpp)
    a.scenario["plan"]["schedule"] = "interleaved" if vpp and vpp > 1 else "1f1b"
    micro = number_of(a, "micro-batch-size", 1)
    a.map("micro-batch-size", "plan.micro_batch", micro)
    if not a.has("global-batch-size"):
        a.refuse("global-batch-size", "required: llmsim needs the global batch")
    global_batch = number_of(a, "global-batch-size")
    a.map("global-batch-size", "plan.global_batch", global_batch)
    a.map("sequence-parallel", "plan.sequence_parallel", bool(a.get("sequence-parallel", False)))
    if a.get("no-scatter-gather-tensors-in-pipeline"):  # legacy Megatron-LM: whole activations per TP rank
        a.map("no-scatter-gather-tensors-in-pipeline", "plan.pp_scatter_gather", False)
    precision = "bf16" if a.get("bf16") else "fp16" if a.get("fp16") else "fp32"
    if a.has("fp8-format"):
        precision = read_fp8_recipe(a, "fp8-recipe")
    fp4 = read_fp4(a, "fp4-format", "fp4-recipe", "fp8-format")
    precision = fp4 or precision
    a.map("fp4-format" if fp4 else "fp8-format" if a.has("fp8-format") else "bf16" if a.get("bf16") else "fp16",
          "plan.precision", precision)
    a.used("fp16", "bf16", "fp8-recipe")
    if a.get("fp8-param-gather"):
        if not a.has("fp8-format"):
            a.refuse("fp8-param-gather", "FP8 parameters need --fp8-format")
        a.map("fp8-param-gather", "plan.fp8_params", True)
    if a.get("fp4-param-gather"):
        if not fp4:
            a.refuse("fp4-param-gather", "FP4 parameters need --fp4-format")
        a.map("fp4-param-gather", "plan.fp8_params", True)
    read_bf16_layers(a, "first-last-layers-bf16", "num-layers-at-start-in-bf16", "num-layers-at-end-in-bf16", precision)
    if fork:
        mds.read_engine(a, files or {}, base, precision, pp, vpp, micro, global_batch)
    else:
        _grad_precision(a, precision)
        adam_states(a, "use-precision-aware-optimizer", megatron_key)
        a.used("accumulate-allreduce-grads-in-fp32")
        _data_parallel_sharding(a)
        instances = number_of(a, "num-distributed-optimizer-instances", 1)
        if instances > 1:  # partial distributed optimizer: hybrid sharding
            a.map("num-distributed-optimizer-instances", "plan.dp_replicate", instances)
        else:
            a.used("num-distributed-optimizer-instances")
        _dp_overlap(a, precision, pp)
    _optimizer(a)
    # llmsim's collectives are NCCL's (comm.py); Megatron of 2021-23 and Megatron-DeepSpeed also took gloo
    if str(a.get("distributed-backend", "nccl")) != "nccl":
        a.refuse("distributed-backend", "nccl: llmsim times NCCL's collectives")
    a.used("distributed-backend")
    a.map("tp-comm-overlap", "plan.tp_comm_overlap", bool(a.get("tp-comm-overlap", False)))
    # the recomputation arguments of before 2022 (OLD_RECOMPUTE_ARGS; Megatron-LM refuses
    # --checkpoint-activations since, Megatron-DeepSpeed kept them) mark a Megatron without
    # --attention-backend, whose attention is unfused (baddbmm and the fused softmax) unless
    # --use-flash-attn (Megatron-LM@152aab304d megatron/model/transformer.py ParallelSelfAttention)
    legacy = _old_recompute_key(a) is not None
    if fork:  # Megatron-DeepSpeed: unfused attention unless a FlashAttention flag
        kernel = mds.attention(a)
        a.map("use-flash-attn-v2", "plan.flash_attention", kernel is not None)
        if kernel:
            a.derive("use-flash-attn-v2", "plan.attention_kernel", "FlashAttention-2 where the profile has its rate",
                     lambda c: "flash2" if has_flash2(c["accelerator"]) else "fused")
    else:
        backend = str(a.get("attention-backend", "unfused" if legacy else "auto"))
        a.map("attention-backend", "plan.flash_attention", backend in ("auto", "flash", "fused") or
              bool(a.get("use-flash-attn")))
        a.used("use-flash-attn")
    # not Megatron-DeepSpeed's: it forked after the scatter/gather, and DeepSpeed's pipeline engine
    # partitions the sends over the TP ranks by default (its config's pipeline.pipe_partitioned)
    if legacy and not fork and not a.has("no-scatter-gather-tensors-in-pipeline"):
        a.absent("no-scatter-gather-tensors-in-pipeline", "pipeline sends split over the TP ranks, as Megatron-LM "
                 "from @27fc468964 (Feb 2021); before, each TP rank sent the whole activation: "
                 "--set plan.pp_scatter_gather=false")
    _grad_accumulation_fusion(a, fork, legacy)
    if fork:  # DeepSpeed's engine clips (deepspeed.read_engine); its config's gradient_clipping, not this
        a.used("clip-grad")
    elif legacy:
        read_grad_clip(a, "clip-grad", False, "Megatron-LM of before 2022 (megatron/optimizer/clip_grads.py)")
    else:
        read_grad_clip(a, "clip-grad", True, CLIP_RELEASE)
        _gradient_buffer_passes(a)
    # Megatron's vocab-parallel cross-entropy, fused or not: the same in-place steps (loss.py)
    a.map("cross-entropy-loss-fusion", "plan.loss", "vocab-parallel")
    _recompute_args(a)
    if fork:
        mds.pipeline_recompute(a)

    if a.has("nproc_per_node"):
        a.map("nproc_per_node", "cluster.devices_per_node", number_of(a, "nproc_per_node"))
    if a.has("nnodes"):
        a.map("nnodes", "cluster.nodes", number_of(a, "nnodes"))
    seq = number_of(a, "seq-length", 2048)
    if a.has("train-iters"):
        a.map("train-iters", "training.tokens", float(number_of(a, "train-iters") * global_batch * seq))
    elif a.has("train-samples"):
        a.map("train-samples", "training.tokens", float(number_of(a, "train-samples") * seq))
    return a.finish(IGNORED_ARGS + moe.ignored(megatron_key), {**ARG_REASONS, **moe.reasons(megatron_key)})


def _dp_overlap(a: Account, precision: str, pp: int) -> None:
    """Whether the gradient reduction overlaps the backward pass. Megatron-LM before
    @3fb3e95ec6 (Aug 2023) chose its data-parallel wrapper with --DDP-impl: `local` (the
    default) all-reduces after the backward pass; `torch` wraps the model in torch's DDP, whose
    reducer all-reduces each bucket as its gradients are ready, every micro-batch but the last
    run under no_sync (Megatron-LM@de7dc40f88 megatron/training.py get_model, megatron/
    schedules.py forward_backward_no_pipelining): plan.dp_overlap, with Megatron-Core's buckets
    standing for torch's 25 MB ones. Refused where Megatron-LM asserts the local DDP (fp32
    gradient accumulation, which bf16 forces, and the distributed optimizer: arguments.py
    validate_args @3fb3e95ec6^) and under pipelining, whose schedules entered no no_sync before
    @d2de701ea9 (May 2023), so torch's DDP reduced every micro-batch's gradients (@de7dc40f88
    schedules.py; the no-pipelining schedule has used no_sync since @65eeb427db, Feb 2021).
    Without pipelining the release is assumed and said."""
    impl = str(a.get("DDP-impl", "local"))
    if impl not in ("local", "torch"):
        a.refuse("DDP-impl", "local or torch")
    if impl == "local":
        a.map("overlap-grad-reduce", "plan.dp_overlap", bool(a.get("overlap-grad-reduce", False)))
        read_param_gather_overlap(a, "overlap-param-gather")
        a.used("DDP-impl")
        return
    if precision == "bf16" or a.get("accumulate-allreduce-grads-in-fp32") or a.get("use-distributed-optimizer"):
        a.refuse("DDP-impl", "Megatron-LM asserts --DDP-impl local with bf16, fp32 gradient accumulation or "
                 "the distributed optimizer")
    if pp > 1:
        a.refuse("DDP-impl", "under pipelining torch's DDP all-reduced every micro-batch's gradients in "
                 "Megatron-LM before @d2de701ea9 (May 2023), which llmsim does not model, and the config does not "
                 "say its release; --DDP-impl local reduces once after the backward pass")
    a.map("DDP-impl", "plan.dp_overlap", True)
    a.used("overlap-grad-reduce")
    a.absent("Megatron-LM release", "taken as @65eeb427db (Feb 2021) or later, whose schedule runs all micro-batches "
             "but the last under torch DDP's no_sync; before it, every micro-batch's gradients were all-reduced")


def _torch_ddp(a: Account) -> bool:
    """Whether --DDP-impl names torch's DDP (the local DDP is the default; other names are
    refused by _dp_overlap)."""
    return str(a.get("DDP-impl", "local")) == "torch"


def _grad_accumulation_fusion(a: Account, fork: bool, legacy: bool) -> None:
    """Whether the weight-gradient GEMMs add into the main gradients themselves
    (plan.grad_accumulation_fusion; framework_ops.py). Megatron-LM does so by default from
    @83b1e42f30 (Feb 2022) unless --no-gradient-accumulation-fusion, until @07916bf245 (Sep
    2022) only with fp32 main gradients (arguments.py switched it off otherwise); before, every
    parameter's gradient was added apart each micro-batch (@de7dc40f88 megatron/model/
    distributed.py: the local DDP's hook `main_grad.add_(grad)`, or autograd's accumulation).
    Megatron-DeepSpeed never fuses: its linears' backward returns the weight gradient for
    autograd or DeepSpeed's hooks to add (Megatron-DeepSpeed@f4157bea megatron/core/
    tensor_parallel/layers.py, the fused call commented out since its 2023 rebase, 9e72d571f;
    megatron/mpu/layers.py before it). Nor does torch's DDP (--DDP-impl torch), which keeps no
    main_grad for the fused GEMM to add into (@3fb3e95ec6^ core/tensor_parallel/layers.py reads
    weight.main_grad, which only the local DDP creates). A script with the recomputation
    arguments of before 2022 does not say its release: the newer is assumed and said."""
    if fork:  # unfused, as DeepSpeed's engine runs every model (deepspeed.read_engine)
        a.used("no-gradient-accumulation-fusion")
        return
    if _torch_ddp(a):
        a.map("no-gradient-accumulation-fusion", "plan.grad_accumulation_fusion", False,
              "torch's DDP: autograd adds every weight gradient")
        return
    a.map("no-gradient-accumulation-fusion", "plan.grad_accumulation_fusion",
          not a.get("no-gradient-accumulation-fusion", False))
    if legacy and not a.has("no-gradient-accumulation-fusion"):
        a.absent("no-gradient-accumulation-fusion", "weight-gradient GEMMs adding into the main gradients, as "
                 "Megatron-LM from @83b1e42f30 (Feb 2022; in fp16 without fp32 accumulation from @07916bf245, "
                 "Sep 2022); before, every gradient was added apart each micro-batch: "
                 "--set plan.grad_accumulation_fusion=false")


def read_param_gather_overlap(a: Account, key: str) -> None:
    """Under the distributed optimizer (ZeRO-1) the updated weights are all-gathered right after
    the optimizer step unless `key` (--overlap-param-gather) dispatches them bucket by bucket
    ahead of the next forward pass (NVIDIA/Megatron-LM@d98e8a64dd megatron/core/optimizer/
    distrib_optimizer.py step_with_ready_grads, distributed/distributed_data_parallel.py
    start_param_sync): plan.param_gather_overlap. Under Megatron-FSDP it is the layers' gather
    prefetch, which plan.dp_overlap stands for (left to the caller's reasons)."""
    if a.scenario["plan"].get("zero_stage") == 1:
        a.map(key, "plan.param_gather_overlap", bool(a.get(key, False)))


# Megatron-FSDP's --data-parallel-sharding-strategy (arguments.py, default optim_grads_params)
FSDP_STRATEGIES = {"no_shard": 0, "optim": 1, "optim_grads": 2, "optim_grads_params": 3}


def _data_parallel_sharding(a: Account) -> None:
    """What the data-parallel ranks shard: the distributed optimizer (ZeRO-1), Megatron-FSDP
    (--use-megatron-fsdp: ZeRO-0 to 3 by --data-parallel-sharding-strategy) or torch FSDP2
    (--use-torch-fsdp2: ZeRO-3). Both FSDPs gather a layer's weights one layer ahead and
    reduce-scatter its gradients behind, resharding after the forward pass
    (megatron/core/distributed/fsdp/src/docs/runtime_schedule.md @d98e8a64dd;
    torch_fully_sharded_data_parallel.py wraps each TransformerLayer in fully_shard): the
    structure of plan.zero3_impl fsdp2."""
    if a.get("use-megatron-fsdp"):
        megatron_fsdp(a, "use-megatron-fsdp", "data-parallel-sharding-strategy", "outer-dp-sharding-strategy")
        a.used("use-distributed-optimizer")
    elif a.get("use-torch-fsdp2"):
        a.map("use-torch-fsdp2", "plan.zero_stage", 3)
        a.map("use-torch-fsdp2", "plan.zero3_impl", "fsdp2")
    else:
        a.map("use-distributed-optimizer", "plan.zero_stage", 1 if a.get("use-distributed-optimizer") else 0)
        a.unmapped("data-parallel-sharding-strategy", "Megatron-FSDP's; without --use-megatron-fsdp it does nothing")


# Newton-Schulz coefficient sets of three GEMMs a step (a quintic with c != 0: Emerging-Optimizers
# muon_utils.py newton_schulz_step; "simple", "cubic5", "aol" and others are refused)
MUON_COEFFICIENTS = ("quintic", "polar_express")
# Megatron-Core's OptimizerConfig muon_* fields that change nothing llmsim times or stores
MUON_IGNORED = ("muon_momentum", "muon_nesterov", "muon_use_nesterov", "muon_scale_mode", "muon_extra_scale_factor")


# what read_grad_clip says where it assumes a release of Megatron-Core
CLIP_RELEASE = ("Megatron-Core 0.18 or later with TransformerEngine, which scales the gradients every step; "
                "before, or with Apex, only on the steps it clips: --set plan.grad_clip=norm")


def read_grad_clip(a: Account, key: str, every_step: bool, why: str | None, default: float = 1.0) -> None:
    """Gradient clipping (plan.grad_clip, framework_ops.py) from Megatron's limit `key`
    (--clip-grad, `default` 1.0; the optimizer clips where it is above 0: megatron/core/optimizer/
    optimizer.py step, @d98e8a64dd; megatron/optimizer/optimizer.py @de7dc40f88): the norm every
    step, and the gradients scaled every step where `every_step` (Megatron-Core 0.18 on with
    TransformerEngine: NVIDIA/Megatron-LM@3d87bfc1b7 clip_grads.py multi_tensor_scale_tensor),
    else only on the steps it clips, which llmsim does not count (`norm`)."""
    off = a.get(key, default) is None or number_of(a, key, default, integer=False) <= 0  # null: Lightning's off
    if off:
        a.map(key, "plan.grad_clip", "none")
    else:
        a.map(key, "plan.grad_clip", "norm-scale" if every_step else "norm", why)


def _gradient_buffer_passes(a: Account) -> None:
    """Megatron-Core's passes over its gradient buffer before each bucket's reduction
    (framework_ops.py): the division by the DP size unless --ddp-average-in-collective, and the
    NaN check of each bucket's norm, on unless --no-check-for-nan-in-loss-and-grad
    (megatron/training/arguments.py and training.py get_model, core_v0.9.0 and @d98e8a64dd)."""
    a.map("ddp-average-in-collective", "plan.dp_average_in_collective", bool(a.get("ddp-average-in-collective", False)))
    a.map("no-check-for-nan-in-loss-and-grad", "plan.grad_nan_check",
          not a.get("no-check-for-nan-in-loss-and-grad", False))


def _optimizer(a: Account) -> None:
    """--optimizer adam, or muon (read_muon), which --use-distributed-optimizer turns into the
    layer-wise distributed optimizer (zero_stage 1, read by _data_parallel_sharding); the
    deprecated dist_muon is the same (megatron/training/arguments.py @d98e8a64dd: "Use
    --optimizer muon --use-distributed-optimizer instead")."""
    name = str(a.get("optimizer", "adam"))
    if name not in ("adam", "muon", "dist_muon"):
        a.refuse("optimizer", "modelled: adam, muon (dist_muon)")
    if a.has("optimizer"):
        a.map("optimizer", "plan.optimizer", "adam" if name == "adam" else "muon")
    if name == "dist_muon":
        a.map("optimizer", "plan.zero_stage", 1)
    fsdp = a.get("use-torch-fsdp2") or a.get("use-megatron-fsdp")
    read_muon(a, "optimizer", name != "adam", fsdp, megatron_key, "muon-no-split-qkv",
              bool(a.get("muon-no-split-qkv", False)))


def read_muon(a: Account, on_key: str, muon: bool, fsdp: bool, key, split_key: str, no_split_qkv: bool) -> None:
    """Megatron-Core's Muon settings (OptimizerConfig muon_* fields, spelled by `key`; the
    QKV split by `split_key`) into plan.muon_ns_steps and plan.muon_tp_mode (muon.py); those
    llmsim does not model refused."""
    if muon and fsdp:
        a.refuse(on_key, "Megatron-LM runs Muon without FSDP (\"Emerging optimizer does not support ... FSDP\")")
    if muon and a.has(key("muon_tp_mode")):
        mode = str(a.get(key("muon_tp_mode")))
        if mode not in MUON_TP_MODES:
            a.refuse(key("muon_tp_mode"), "expected one of " + ", ".join(MUON_TP_MODES))
        a.map(key("muon_tp_mode"), "plan.muon_tp_mode", mode)
    if muon and a.has(key("muon_num_ns_steps")):
        a.map(key("muon_num_ns_steps"), "plan.muon_ns_steps", number_of(a, key("muon_num_ns_steps")))
    settings = ((key("muon_fp32_matmul_prec"), ("medium",), "medium only (the Newton-Schulz GEMMs in bf16)"),
                (key("muon_scalar_optimizer"), ("adam",), "adam only"),
                (key("muon_coefficient_type"), MUON_COEFFICIENTS, "one of " + ", ".join(MUON_COEFFICIENTS)))
    for field, allowed, why in settings:
        if muon and str(a.get(field, allowed[0])) not in allowed:
            a.refuse(field, why)
    if muon and a.get(key("muon_use_syrk")):
        a.refuse(key("muon_use_syrk"), "the symmetric Gram kernel is not modelled")
    if muon and no_split_qkv:
        a.refuse(split_key, "Muon on the fused QKV matrix is not modelled (split_qkv is)")
    a.used(split_key, *(key(f) for f in ("muon_tp_mode", "muon_num_ns_steps", "muon_fp32_matmul_prec",
                                         "muon_scalar_optimizer", "muon_coefficient_type", "muon_use_syrk")))
    a.ignore(*(key(f) for f in MUON_IGNORED))


def megatron_fsdp(a: Account, on_key: str, strategy_key: str, outer_key: str) -> None:
    """Megatron-FSDP's ZeRO stage by its sharding strategy; ZeRO-3 in FSDP units."""
    strategy = str(a.get(strategy_key, "optim_grads_params"))
    if strategy not in FSDP_STRATEGIES:
        a.refuse(strategy_key, "expected one of " + ", ".join(FSDP_STRATEGIES))
    if str(a.get(outer_key, "no_shard")) != "no_shard":
        a.refuse(outer_key, "sharding the optimizer over the replicas of hybrid FSDP is not modelled (no_shard is)")
    a.map(strategy_key, "plan.zero_stage", FSDP_STRATEGIES[strategy])
    a.used(on_key, outer_key)
    if FSDP_STRATEGIES[strategy] == 3:
        a.map(on_key, "plan.zero3_impl", "fsdp2")


DTYPES = {"fp32": "fp32", "torch.float32": "fp32", "bf16": "bf16", "torch.bfloat16": "bf16", "fp16": "fp16",
          "torch.float16": "fp16", "fp8": "fp8", "torch.uint8": "fp8"}


def adam_states(a: Account, on_key: str, dtype_key, remainders_key: str | None = None) -> None:
    """Megatron-Core's precision-aware optimizer (its main_params, exp_avg, exp_avg_sq and
    main_grads dtypes, spelled by `dtype_key`): fp32 states, or bf16 moments beside fp32 main
    parameters (plan.optimizer_precision bf16-moments), bf16 main gradients (grad_precision).
    Where TransformerEngine's FusedAdam keeps the fp32 main parameters (no FP8 recipe or the
    delayed one) of bf16 weights, it keeps them as 16-bit remainders (plan.master_weights):
    Megatron-Core asks for them unless store_param_remainders (`remainders_key`; no argument of
    Megatron-LM's sets it) is false (NVIDIA/Megatron-LM@d98e8a64dd megatron/core/optimizer/
    __init__.py, optimizer_config.py use_precision_aware_optimizer_no_fp8_or_ds_fp8; with
    TransformerEngine 2.1 or later)."""
    fields = ("main_params_dtype", "exp_avg_dtype", "exp_avg_sq_dtype", "main_grads_dtype")
    if not a.get(on_key):
        a.used(on_key)
        if remainders_key:  # only TransformerEngine's FusedAdam reads it
            a.ignore(remainders_key)
        return
    dtypes = {f: DTYPES.get(str(a.get(dtype_key(f), "fp32")), "?") for f in fields}
    moments = {dtypes["exp_avg_dtype"], dtypes["exp_avg_sq_dtype"]}
    if dtypes["main_params_dtype"] != "fp32" or moments not in ({"fp32"}, {"bf16"}) or \
            dtypes["main_grads_dtype"] not in ("fp32", "bf16"):
        a.refuse(on_key, "Adam states " + ", ".join(f"{k} {v}" for k, v in dtypes.items()) + ": llmsim keeps fp32 "
                 "main parameters with fp32 or bf16 moments (or NeMo's all-bf16 states), fp32 or bf16 gradients")
    a.map(on_key, "plan.optimizer_precision", "bf16-moments" if moments == {"bf16"} else "fp32")
    if dtypes["main_grads_dtype"] == "bf16":
        a.map(dtype_key("main_grads_dtype"), "plan.grad_precision", "bf16")
    a.used(*(dtype_key(f) for f in fields))
    plan = a.scenario["plan"]
    te_master = plan.get("precision") == "bf16" or (plan.get("precision") == "fp8"
                                                     and plan.get("fp8_recipe", "delayed") == "delayed")
    if te_master and not plan.get("fp8_params") and (remainders_key is None or a.get(remainders_key, True)):
        a.map(remainders_key or on_key, "plan.master_weights", "remainders",
              "TransformerEngine's FusedAdam keeps the fp32 main parameters as remainders of the bf16 weights")
    elif remainders_key:
        a.used(remainders_key)


# TransformerEngine's FP8 recipes llmsim models, as Megatron names them -> plan.fp8_recipe
# (TE's Float8CurrentScaling is Megatron-LM's tensorwise; MXFP8 is plan.precision mxfp8)
FP8_RECIPES = {"delayed": "delayed", "tensorwise": "current", "mxfp8": None}


def read_fp8_recipe(a: Account, key: str) -> str:
    """The FP8 run's recipe (`key`, Megatron's fp8_recipe, delayed by default) into
    plan.fp8_recipe; returns plan.precision: fp8, or mxfp8 for the block-scaled recipe."""
    recipe = str(a.get(key, "delayed"))
    if recipe not in FP8_RECIPES:
        a.refuse(key, "TransformerEngine's delayed, per-tensor current (tensorwise) and MXFP8 scaling are "
                      "modelled, not its block-wise scaling")
    if FP8_RECIPES[recipe]:
        a.map(key, "plan.fp8_recipe", FP8_RECIPES[recipe])
    return "mxfp8" if recipe == "mxfp8" else "fp8"


def read_fp4(a: Account, format_key: str, recipe_key: str, fp8_key: str) -> str | None:
    """Megatron-Core's FP4 linears (--fp4-format e2m1, --fp4-recipe nvfp4: TransformerEngine's
    NVFP4BlockScaling with its defaults, NVIDIA/Megatron-LM@d98e8a64dd megatron/core/fp4_utils.py
    get_fp4_recipe) -> "nvfp4", the plan's precision; None without them. Megatron refuses FP4
    beside FP8 (megatron/training/arguments.py validate_args), and so does this; a custom
    quantizer factory is refused."""
    if not a.get(format_key):
        a.used(format_key, recipe_key)
        return None
    if str(a.get(format_key)) != "e2m1":
        a.refuse(format_key, "e2m1 (NVFP4), the one FP4 format Megatron-Core has")
    if a.get(fp8_key):
        a.refuse(format_key, f"not with {fp8_key} (Megatron-LM refuses FP4 and FP8 together)")
    if str(a.get(recipe_key, "nvfp4")) != "nvfp4":
        a.refuse(recipe_key, "nvfp4 (TransformerEngine's NVFP4BlockScaling; a custom quantizer is not modelled)")
    a.used(recipe_key)
    return "nvfp4"


def read_qk_norm(a: Account, key: str, mla: bool) -> None:
    """Megatron-Core's qk_layernorm (--qk-layernorm): a norm over each query and key head
    (TransformerConfig qk_layernorm; NVIDIA/Megatron-LM@d98e8a64dd megatron/core/transformer/
    attention.py SelfAttention q_layernorm, k_layernorm) -> model.qk_norm. Under MLA it
    normalises the latents, which mla.py counts always."""
    if a.get(key) and not mla:
        a.map(key, "model.qk_norm", True)
    a.used(key)


def read_nope_layers(a: Account, nope_key: str, l2_key: str, layers: int) -> None:
    """Megatron-Core's no_rope_freq (--no-rope-freq N: each N-th layer without RoPE, or a list
    with 1 on those layers; TransformerConfig __post_init__ expands N to [0] * (N - 1) + [1])
    -> model.nope_layer_interval, and qk_l2_norm (--qk-l2-norm: Llama 4's weightless L2Norm on
    the query and key heads, gpt_layer_specs.py) -> model.qk_norm, qk_norm_kind l2. llmsim's L2
    norm is Llama 4's, on the rotating layers only (Megatron-Bridge's get_llama4_layer_spec);
    Megatron-Core's own layer spec norms every layer, so the two together are refused."""
    value = a.get(nope_key)
    if value not in (None, 0, "0", "None"):
        text = str(value).strip()
        every = int(text) if text.isdigit() else 0
        flags = [int((i + 1) % every == 0) for i in range(layers)] if every else moe.pattern_list(text)
        n = every_nth_layer(flags) if flags is not None and len(flags) == layers else None
        if n is None:
            a.refuse(nope_key, f"each n-th layer without RoPE, n from 2 to {layers} (an integer or its list of "
                               f"{layers} zeros and ones)")
        if a.get(l2_key):
            a.refuse(l2_key, f"not with {nope_key}: Megatron-Core's layer spec puts the L2 norm on the NoPE layers "
                             "too, where llmsim's (Llama 4's) norms the rotating layers only")
        a.map(nope_key, "model.nope_layer_interval", n)
    a.used(nope_key)
    if a.get(l2_key):
        a.map(l2_key, "model.qk_norm", True)
        a.map(l2_key, "model.qk_norm_kind", "l2")
    a.used(l2_key)


def read_qkv_bias(a: Account, key: str, no_linear_bias: bool) -> None:
    """Megatron-Core's add_qkv_bias (--add-qkv-bias): biases on the QKV projection; without the
    other linears' biases (add_bias_linear false) -> model.qkv_bias, with them already counted."""
    if a.get(key) and no_linear_bias:
        a.map(key, "model.qkv_bias", True)
    a.used(key)


def read_rotary_fraction(a: Account, key: str, number_of) -> None:
    """Megatron-Core's rotary_percent (--rotary-percent; NeMo's rotary_percentage): the share of
    each head RoPE rotates (NVIDIA/Megatron-LM@d98e8a64dd megatron/core/models/common/embeddings/
    rotary_pos_embedding.py RotaryEmbedding: dim = kv_channels x rotary_percent) ->
    model.rotary_fraction."""
    fraction = number_of(a, key, 1.0, integer=False)
    if fraction != 1.0:
        a.map(key, "model.rotary_fraction", fraction)
    a.used(key)


def read_bf16_layers(a: Account, flag: str, start: str, end: str, precision: str, default: int = 1) -> None:
    """Megatron-Core's first_last_layers_bf16 with num_layers_at_start_in_bf16 and
    num_layers_at_end_in_bf16 -> plan.bf16_layers_at_start and _end; an absent count is
    `default` (Megatron-Core's TransformerConfig: 1, NVIDIA/Megatron-LM@d98e8a64dd
    megatron/core/transformer/transformer_config.py). Without FP8 linears every layer is BF16
    already, and without the flag the counts are unused (fp8_utils.is_first_last_bf16_layer)."""
    if not a.get(flag) or precision not in LOW_PRECISIONS:
        a.used(flag, start, end)
        return
    a.map(start if a.has(start) else flag, "plan.bf16_layers_at_start", a.number(start, default))
    a.map(end if a.has(end) else flag, "plan.bf16_layers_at_end", a.number(end, default))
    a.used(flag)


def _grad_precision(a: Account, precision: str) -> None:
    """The precision gradients are kept and reduced in: under --fp16 the parameters' own fp16
    unless --accumulate-allreduce-grads-in-fp32 (or, in 2021, --fp32-allreduce): Megatron-LM
    forces fp32 accumulation for bf16 only (megatron/training/arguments.py validate_args
    @d98e8a64dd; @152aab304d megatron/model/distributed.py allreduce_params); otherwise fp32
    unless --grad-reduce-in-bf16; under Megatron-FSDP, fsdp_grad_precision."""
    if not a.get("use-megatron-fsdp"):
        if precision == "fp16":
            # 2021's --fp32-allreduce acted in the local DDP only (@152aab304d training.py train_step)
            fp32 = a.get("accumulate-allreduce-grads-in-fp32") or (a.get("fp32-allreduce") and not _torch_ddp(a))
            a.map("fp32-allreduce" if a.get("fp32-allreduce") else "accumulate-allreduce-grads-in-fp32",
                  "plan.grad_precision", "fp32" if fp32 else "fp16")
            a.used("grad-reduce-in-bf16")
            return
        a.map("grad-reduce-in-bf16", "plan.grad_precision", "bf16" if a.get("grad-reduce-in-bf16") else "fp32")
        return
    fsdp_grad_precision(a, precision, "megatron-fsdp-main-grads-dtype", "megatron-fsdp-grad-comm-dtype")
    a.used("grad-reduce-in-bf16")


def fsdp_grad_precision(a: Account, precision: str, kept_key: str, sent_key: str) -> None:
    """Megatron-FSDP's main-gradient dtype (`kept_key`), by default the parameters' (bf16 or fp16
    with bf16/fp16 training), and its communication dtype (`sent_key`), by default the main
    gradients' (megatron/core/distributed/distributed_data_parallel_config.py
    megatron_fsdp_main_grads_dtype, megatron_fsdp_grad_comm_dtype): one plan.grad_precision."""
    def dtype(key, default):
        value = a.get(key)
        return default if value in (None, "auto") else DTYPES.get(str(value), str(value))

    kept = dtype(kept_key, "bf16" if precision in LOW_PRECISIONS else precision)  # FP8 / NVFP4 keep bf16 params
    sent = dtype(sent_key, kept)
    if kept != sent:
        a.refuse(sent_key, f"llmsim keeps and reduces gradients in one precision (plan.grad_precision); here "
                           f"they are kept in {kept}")
    a.map(kept_key, "plan.grad_precision", kept)
    a.used(sent_key)


def read_window(a: Account, size_key: str, skip_key: str, layers: int) -> None:
    """Megatron-Core's sliding windows: window_size (left, right) lets a token see `left`
    earlier tokens and itself, on every layer unless window_attn_skip_freq N makes every N-th
    layer (1-indexed) full attention, or a 0/1 pattern names the windowed layers
    (megatron/core/transformer/utils.py is_layer_window_attention @d98e8a64dd); llmsim windows
    layers i (0-indexed) with i % sliding_window_freq == 0, or all but each
    sliding_window_skip_freq-th (model.py)."""
    if not a.has(size_key):
        a.used(skip_key)
        return
    size = a.get(size_key)
    size = [s for s in re.split(r"[\s,()\[\]]+", str(size)) if s] if not isinstance(size, (list, tuple)) else size
    if len(size) != 2 or not all(str(x).lstrip("-").isdigit() for x in size) or int(size[1]) != 0 \
            or int(size[0]) < 1:
        a.refuse(size_key, "expected a causal window (left, 0) with left >= 1")
    skip = a.get(skip_key)
    text = None if skip is None else str(skip).strip()
    if text is None:
        windowed = [1] * layers
    elif text.isdigit() and int(text) >= 1:
        windowed = [int((i + 1) % int(text) != 0) for i in range(layers)]
    else:
        windowed = moe.pattern_list(text)
        if windowed is None or len(windowed) != layers:
            a.refuse(skip_key, f"expected a positive integer or a list expression of {layers} zeros and ones")
    if 1 not in windowed:  # every layer full attention (a skip frequency of 1)
        a.map(size_key, "model.sliding_window", 0)
        a.used(skip_key)
        return
    pattern = window_pattern(windowed)
    if pattern is None:
        a.refuse(skip_key, "llmsim windows every n-th layer from the first, or all but every n-th, not this pattern")
    a.map(size_key, "model.sliding_window", int(size[0]) + 1)
    for field, value in pattern.items():
        a.map(skip_key, f"model.{field}", value)


def read_head_dim(a: Account, key: str, mla: bool, number) -> None:
    """--kv-channels (NeMo kv_channels): the width of a head where it is not hidden / heads;
    multi-latent attention takes its head widths from its own keys."""
    if not a.has(key):
        a.used(key)
    elif mla:
        a.unmapped(key, "multi-latent attention's head widths are qk_head_dim + qk_pos_emb_head_dim")
    else:
        a.map(key, "model.head_dim", number(a, key))


def read_dropout(a: Account, attention_key: str, hidden_key: str) -> None:
    """model.dropout from Megatron's two rates: attention_dropout on the attention probabilities
    and hidden_dropout on the residual branches and the embedding output, 0.1 each unless set
    (Megatron-LM@152aab304d megatron/arguments.py --attention-dropout, --hidden-dropout;
    Megatron-Core@d98e8a64dd transformer_config.py). llmsim's dropout is all of them or none
    (workload.py), so one rate zero and the other not is refused."""
    attention = a.number(attention_key, 0.1, integer=False)
    hidden = a.number(hidden_key, 0.1, integer=False)
    if bool(attention) != bool(hidden):
        a.refuse(hidden_key, f"{'non-zero' if attention else '0'} as {attention_key} (llmsim's dropout is on the "
                             "attention probabilities, the residual branches and the embedding together)")
    a.map(attention_key, "model.dropout", bool(attention))
    a.used(hidden_key)


def read_fp32_residual(a: Account, key: str) -> None:
    """fp32_residual_connection keeps the residual stream in fp32 (Megatron-Core
    transformer_config.py): noted where on, as llmsim counts it in the activations' 16 bits."""
    if a.get(key):
        a.unmapped(key, "the residual stream in fp32 is not modelled (counted in 16 bits: activations and memory "
                        "predicted low)")
    a.used(key)


def _old_recompute_key(a: Account) -> str | None:
    """The argument that switches full recomputation on in a Megatron of before 2022
    (OLD_RECOMPUTE_ARGS: --checkpoint-activations or --activations-checkpoint-method, read by
    its own name, not its alias), or None."""
    if a.get("checkpoint-activations"):
        return "checkpoint-activations"
    return "activations-checkpoint-method" if "activations-checkpoint-method" in a.flat else None


def _recompute_args(a: Account) -> None:
    """--recompute-activations is selective recomputation (the older flag); the older still,
    --checkpoint-activations or an --activations-checkpoint-method (OLD_RECOMPUTE_ARGS), full."""
    granularity, key = a.get("recompute-granularity"), "recompute-granularity"
    if a.get("recompute-activations"):
        granularity, key = granularity or "selective", "recompute-activations"
    elif (old := _old_recompute_key(a)) is not None:
        granularity, key = granularity or "full", old
    read_recompute(a, megatron_key, granularity, "recompute-granularity" if a.has("recompute-granularity") else key)
    a.used("recompute-activations", "checkpoint-activations")


def read_recompute(a: Account, key, granularity, granularity_key: str) -> None:
    """recompute_granularity full with its method and layer count (plan.recompute_method,
    recompute_num_layers), or selective over recompute_modules (plan.recompute_modules;
    default core_attn: transformer_config.py recompute_modules); the deprecated
    moe_layer_recompute is selective with the moe module (transformer_config.py
    __post_init__). A full granularity without a method is uniform of 1 (transformer_block.py
    refuses no method)."""
    moe_layer = bool(a.get(key("moe_layer_recompute")))
    a.used(key("moe_layer_recompute"))
    if moe_layer and granularity == "full":
        a.refuse(key("moe_layer_recompute"), "not with full recomputation (Megatron-Core refuses it)")
    if moe_layer:
        granularity = "selective"
    if granularity in (None, False):
        a.map(granularity_key, "plan.recompute", "none")
        return
    if granularity not in ("full", "selective"):
        a.refuse(granularity_key, "expected full or selective")
    if granularity == "full":
        method = str(a.get(key("recompute_method"), "uniform"))
        if method not in ("uniform", "block"):
            a.refuse(key("recompute_method"), "expected uniform or block")
        a.map(key("recompute_method"), "plan.recompute_method", method)
        a.map(key("recompute_num_layers"), "plan.recompute_num_layers", number_of(a, key("recompute_num_layers"), 1))
    else:
        modules = a.get(key("recompute_modules"))
        modules = ["core_attn"] if modules is None else [modules] if isinstance(modules, str) else list(modules)
        unknown = [m for m in modules if m not in MODULES]
        if unknown:
            a.refuse(key("recompute_modules"), f"{', '.join(map(str, unknown))} not modelled (llmsim recomputes "
                                               f"{', '.join(MODULES)})")
        if moe_layer and "moe" not in modules:
            modules.append("moe")
        if tuple(modules) != ("core_attn",):
            a.map(key("recompute_modules") if a.has(key("recompute_modules")) else key("moe_layer_recompute"),
                  "plan.recompute_modules", [m for m in MODULES if m in modules])
        a.used(key("recompute_modules"))
    a.map(granularity_key, "plan.recompute", granularity)


# ------------------------------------------------------------------ NeMo YAML

NEMO_IGNORED = ("run.*", "exp_manager.*", "hydra.*", "trainer.accelerator", "trainer.logger", "trainer.enable_*",
                "trainer.use_distributed_sampler", "trainer.max_epochs", "trainer.max_time", "trainer.log_*",
                "trainer.val_check_interval", "trainer.limit_*", "trainer.num_sanity_val_steps",
                "model.init_method_std", "model.use_scaled_init_method",
                "model.apply_query_key_layer_scaling", "model.layernorm_epsilon",
                "model.do_layer_norm_weight_decay", "model.pre_process", "model.post_process", "model.headscale",
                "model.transformer_block_type", "model.openai_gelu", "model.normalize_attention_scores",
                "model.rotary_base", "model.attention_type", "model.tokenizer.*",
                "model.native_amp_*", "model.hysteresis", "model.seed", "model.resume_from_checkpoint",
                "model.use_cpu_initialization", "model.onnx_safe", "model.apex_transformer_log_level",
                "model.gc_interval", "model.nsys_profile.*", "model.data.*", "model.optim.lr",
                "model.optim.weight_decay",
                "model.optim.betas", "model.optim.sched.*", "model.max_position_embeddings", "model.deterministic_mode",
                "model.sync_batch_comm", "model.mcore_gpt", "model.transformer_engine", "model.fp8_*",
                "model.make_vocab_size_divisible_by", "model.rampup_batch_size", "model.resume_from_checkpoint",
                "model.persist_layer_norm", "model.fp16_lm_cross_entropy", "model.fsdp_*",
                "model.ub_tp_comm_overlap_cfg.*", "model.tp_comm_atomic_*", "model.nemo_path")
NEMO_REASONS = {"model.*fusion": "kernel fusion is not modelled (efficiencies are the profile's)",
                "model.grad_*": "gradient-reduction bucketing details are not modelled",
                "model.gradient_as_bucket_view": "gradient-reduction bucketing details are not modelled",
                "model.optim.*bucket*": "gradient-reduction bucketing details are not modelled",
                "model.optim.contiguous_*": "buffer layout is not modelled",
                "model.overlap_p2p_comm": "pipeline send/receive overlap is not modelled separately",
                "model.batch_p2p_comm": "pipeline send/receive batching is not modelled",
                "model.defer_embedding_wgrad_compute": "not modelled", "model.wgrad_deferral_limit": "not modelled"}
NEMO_ACTIVATIONS = {"gelu": "gelu", "swiglu": "swiglu", "fast-swiglu": "swiglu", "geglu": "geglu",
                    "fast-geglu": "geglu"}


def _nemo_gradient_buffer_passes(a: Account, m, optimizer: str) -> None:
    """What NeMo 24.09 runs over the gradients before their reduction (framework_ops.py): Apex's
    DistributedFusedAdam reduce-scatters with ReduceOp.AVG (apex/contrib/optimizers/
    distributed_fused_adam.py _start_bucket_grad_sync, average_grad_sync), and its Megatron-Core
    optimizer's DDP averages in the collective and checks no NaN unless the yaml says otherwise
    (NVIDIA/NeMo@24.09-alpha.rc0 megatron_gpt_model.py setup_mcore_distributed_parallel:
    optim.average_in_collective default true, optim.check_for_nan_in_grad default false). The
    other optimizers' reduction is NeMo's own and is taken as dividing first (the plan's default)."""
    if optimizer == "distributed_fused_adam":
        a.map(m("optim.name"), "plan.dp_average_in_collective", True, "Apex reduce-scatters with ReduceOp.AVG")
    elif optimizer == "mcore_distributed_optim":
        a.map(m("optim.average_in_collective"), "plan.dp_average_in_collective",
              bool(a.get(m("optim.average_in_collective"), True)))
        a.map(m("optim.check_for_nan_in_grad"), "plan.grad_nan_check", bool(a.get(m("optim.check_for_nan_in_grad"),
                                                                                      False)))


def _nemo_adam_states(a: Account, m, precision: str) -> None:
    """Apex DistributedFusedAdam's states under NeMo: their dtype (optim.dtype, fp32 unless
    given) and the master copy beside them, as optim.store_params and store_param_remainders
    say or, where they do not, as NeMo picks: whole with FP8 primary weights, none where the
    states are the weights' dtype, the 16-bit remainders for fp32 states beside bf16 weights,
    whole otherwise (NVIDIA/NeMo@8cfedd7203 megatron_base_model.py setup_optimization, as in
    its 24.09 release; the weights' dtype is the training precision under megatron_amp_O2, else
    fp32)."""
    dtype_key, keep_key, rem_key = m("optim.dtype"), m("optim.store_params"), m("optim.store_param_remainders")
    dtype = DTYPES.get(str(a.get(dtype_key, "fp32")).lower())
    if dtype not in ("fp32", "bf16"):
        a.refuse(dtype_key, "fp32 or bf16 optimizer states")
    weights = precision if a.get(m("megatron_amp_O2"), False) else "fp32"
    if dtype == "bf16":
        if weights != "bf16":
            a.refuse(dtype_key, "bf16 states only over bf16 weights (megatron_amp_O2 with bf16 precision)")
        a.map(dtype_key, "plan.optimizer_precision", "bf16")
    else:
        a.used(dtype_key)
    if weights == "fp32":  # the fp32 parameters are the master copy (plan.fp32_params)
        a.used(keep_key, rem_key)
        return
    fp8_params = bool(a.get(m("fp8")) and a.get(m("fp8_params")))
    if a.has(keep_key):
        keep, remainders, how = bool(a.get(keep_key)), bool(a.get(rem_key, False)), None
    else:
        keep = fp8_params or (dtype != weights and not (dtype == "fp32" and weights == "bf16"))
        remainders, how = not keep and dtype != weights, "as NeMo picks where optim.store_params is not given"
    if keep:  # the default: a whole copy in the states' precision
        a.used(keep_key, rem_key)
    elif fp8_params:
        a.refuse(keep_key, "true with FP8 primary weights (model.fp8_params): they need a master copy")
    elif remainders:
        if (dtype, weights) != ("fp32", "bf16"):
            a.refuse(rem_key, "the remainders complete an fp32 copy of bf16 weights (optim.dtype fp32, bf16 "
                              "precision under megatron_amp_O2)")
        a.map(keep_key, "plan.master_weights", "remainders", how)
        a.used(rem_key)
    elif dtype != weights:
        a.refuse(keep_key, f"true with {dtype} states beside {weights} weights (or store_param_remainders true)")
    else:
        a.map(keep_key, "plan.master_weights", "none", how)
        a.used(rem_key)


def _nemo_grad_accumulation_fusion(a: Account, m, optimizer: str, pp: int) -> None:
    """NeMo's model.gradient_accumulation_fusion (off unless given), which NeMo switches off
    without megatron_amp_O2 and, without pipelining, on more than one data-parallel rank unless
    the optimizer is distributed (NVIDIA/NeMo@8cfedd7203 nemo/collections/nlp/models/
    language_modeling/megatron_base_model.py _validate_and_override_config)."""
    key, field = m("gradient_accumulation_fusion"), "plan.grad_accumulation_fusion"
    if not a.get(key, False):
        a.map(key, field, False)
    elif not a.get(m("megatron_amp_O2"), False):
        a.map(key, field, False, "NeMo fuses only under megatron_amp_O2")
    elif pp == 1 and optimizer not in ("distributed_fused_adam", "mcore_distributed_optim"):
        a.derive(key, field, "on one data-parallel rank only (NeMo without pipelining fuses on more only with a "
                             "distributed optimizer)", lambda c: c["dp"] == 1)
    else:
        a.map(key, field, True)


def read_nemo(data: dict) -> Imported:
    a = Account(data, "nemo")
    m = lambda key: f"model.{key}"  # noqa: E731
    layers, hidden, heads = (a.number(m(k)) for k in ("num_layers", "hidden_size", "num_attention_heads"))
    if None in (layers, hidden, heads):
        raise InputError("nemo", "model", "needs model.num_layers, hidden_size and num_attention_heads")
    a.scenario["name"] = f"nemo-{a.get('run.name', 'megatron')}"
    a.map(m("num_layers"), "model.layers", layers)
    a.map(m("hidden_size"), "model.hidden", hidden)
    a.map(m("num_attention_heads"), "model.heads", heads)
    a.scenario["model"]["name"] = str(a.get("run.name", "nemo-model"))
    a.map(m("num_query_groups"), "model.kv_heads", a.number(m("num_query_groups"), heads))
    activation = NEMO_ACTIVATIONS.get(str(a.get(m("activation"), "gelu")))
    if activation is None:
        a.refuse(m("activation"), "modelled: " + ", ".join(NEMO_ACTIVATIONS))
    a.map(m("activation"), "model.activation", activation)
    ffn = a.number(m("ffn_hidden_size"), 4 * hidden)
    a.map(m("ffn_hidden_size"), "model.ffn_hidden", ffn)
    read_head_dim(a, m("kv_channels"), bool(a.get(m("multi_latent_attention"))), number_of)
    moe.read_moe(a, nemo_key, number_of, layers, ffn)
    seq = a.number(m("encoder_seq_length"), 2048)
    a.map(m("encoder_seq_length"), "model.seq_len", seq)
    norm = str(a.get(m("normalization"), "layernorm")).lower()
    if norm not in ("layernorm", "rmsnorm"):
        a.refuse(m("normalization"), "expected layernorm or rmsnorm")
    a.map(m("normalization"), "model.norm", norm)
    read_qk_norm(a, m("qk_layernorm"), bool(a.get(m("multi_latent_attention"))))
    read_nope_layers(a, m("no_rope_freq"), m("qk_l2_norm"), layers)
    read_rotary_fraction(a, m("rotary_percentage"), number_of)
    position = str(a.get(m("position_embedding_type"), "learned_absolute"))
    if position not in ("learned_absolute", "rope"):
        a.refuse(m("position_embedding_type"), "expected learned_absolute or rope")
    a.map(m("position_embedding_type"), "model.position_embedding", "rope" if position == "rope" else "learned")
    a.map(m("bias"), "model.bias", bool(a.get(m("bias"), True)))
    a.map(m("share_embeddings_and_output_weights"), "model.tied_embeddings",
          bool(a.get(m("share_embeddings_and_output_weights"), True)))
    read_dropout(a, m("attention_dropout"), m("hidden_dropout"))
    read_fp32_residual(a, m("fp32_residual_connection"))
    if a.number(m("ffn_dropout"), 0.0, integer=False):
        a.unmapped(m("ffn_dropout"), "dropout inside the MLP is not modelled (model.dropout is Megatron's on the "
                                     "attention probabilities, the residual branches and the embedding)")
    a.used(m("ffn_dropout"))
    tp = a.number(m("tensor_model_parallel_size"), 1)
    tokenizer = a.get(m("tokenizer.type"))
    if tokenizer not in TOKENIZER_VOCAB:
        a.refuse(m("tokenizer.type"), "the tokenizer's vocabulary size is unknown; give --vocab")
    a.map(m("tokenizer.type"), "model.vocab",
          padded_vocab(TOKENIZER_VOCAB[tokenizer], a.number(m("make_vocab_size_divisible_by"), 128), tp))

    a.map(m("tensor_model_parallel_size"), "plan.tp", tp)
    a.map(m("pipeline_model_parallel_size"), "plan.pp", a.number(m("pipeline_model_parallel_size"), 1))
    a.map(m("context_parallel_size"), "plan.cp", a.number(m("context_parallel_size"), 1))
    read_cp_comm_type(a, m("cp_comm_type"), m("hierarchical_context_parallel_sizes"))
    vpp = a.number(m("virtual_pipeline_model_parallel_size"), 1)
    a.map(m("virtual_pipeline_model_parallel_size"), "plan.vpp", vpp)
    split_vpp = read_stage_split(a, nemo_key, layers, a.number(m("pipeline_model_parallel_size"), 1), vpp,
                                 number_of)
    if split_vpp != vpp:
        if a.has(m("virtual_pipeline_model_parallel_size")):
            a.refuse(m("pipeline_model_parallel_layout"), f"{split_vpp} virtual stages per rank where "
                                                          f"virtual_pipeline_model_parallel_size is {vpp}")
        vpp = split_vpp
        a.map(m("pipeline_model_parallel_layout"), "plan.vpp", vpp)
    a.scenario["plan"]["schedule"] = "interleaved" if vpp > 1 else "1f1b"
    a.map(m("micro_batch_size"), "plan.micro_batch", a.number(m("micro_batch_size"), 1))
    global_batch = a.number(m("global_batch_size"))
    if global_batch is None:
        a.refuse(m("global_batch_size"), "required: llmsim needs the global batch")
    a.map(m("global_batch_size"), "plan.global_batch", global_batch)
    a.map(m("sequence_parallel"), "plan.sequence_parallel", bool(a.get(m("sequence_parallel"), False)))
    # NeMo runs Megatron-Core, whose pipeline sends are split over the TP ranks only with
    # sequence parallelism (megatron/core/pipeline_parallel/schedules.py get_tensor_shapes)
    a.map(m("sequence_parallel"), "plan.pp_scatter_gather", False)
    precision = {"bf16": "bf16", "bf16-mixed": "bf16", "16": "fp16", "16-mixed": "fp16", "32": "fp32"}.get(
        str(a.get("trainer.precision", "32")))
    if precision is None:
        a.refuse("trainer.precision", "expected bf16, bf16-mixed, 16, 16-mixed or 32")
    a.map("trainer.precision", "plan.precision", "fp8" if a.get(m("fp8")) else precision)
    a.used(m("fp8"))
    if a.get(m("fp8")) and a.get(m("fp8_params")):
        a.map(m("fp8_params"), "plan.fp8_params", True)
    granularity = a.get(m("activations_checkpoint_granularity"))
    nemo1 = {"recompute_method": m("activations_checkpoint_method"),
             "recompute_num_layers": m("activations_checkpoint_num_layers")}
    read_recompute(a, lambda field: nemo1.get(field, nemo_key(field)), granularity,
                   m("activations_checkpoint_granularity"))
    a.used(m("activations_checkpoint_method"), m("activations_checkpoint_num_layers"))
    for partial in ("num_micro_batches_with_partial_activation_checkpoints",
                    "activations_checkpoint_layers_per_pipeline"):  # NeMo 1's partial checkpointing
        if a.get(m(partial)) is not None:
            a.refuse(m(partial), "null: checkpointing only some micro-batches' layers is not modelled")
        a.used(m(partial))
    if a.get(m("sharp")):
        a.unmapped(m("sharp"), "SHARP's in-network reductions are not modelled (the data-parallel all-reduce is "
                               "timed over NCCL rings and trees)")
    a.used(m("sharp"))
    optimizer = str(a.get(m("optim.name"), "fused_adam"))
    if optimizer not in ("fused_adam", "distributed_fused_adam", "adam", "adamw", "mcore_distributed_optim"):
        a.refuse(m("optim.name"), "llmsim models Adam's optimizer states only")
    a.map(m("optim.name"), "plan.zero_stage", 0 if optimizer in ("fused_adam", "adam", "adamw") else 1)
    # NeMo 24.09's clipping (megatron_base_model.py configure_gradient_clipping, none without
    # Lightning's trainer.gradient_clip_val): Apex's DistributedFusedAdam folds the clip factor
    # into its step (clip_grad_norm: _grad_scale), the others take Megatron-Core 0.9's
    # clip_grads.py, which scales only on the steps it clips
    read_grad_clip(a, "trainer.gradient_clip_val", False, "NeMo 24.09: the clip scales no gradients of its own "
                                                          "each step", default=0.0)
    _nemo_gradient_buffer_passes(a, m, optimizer)
    a.map(m("optim.overlap_grad_sync"), "plan.dp_overlap", bool(a.get(m("optim.overlap_grad_sync"), False)))
    # both distributed optimizers take overlap_param_sync, off unless given (NVIDIA/NeMo@8cfedd7203
    # megatron_gpt_model.py: DistributedDataParallelConfig(overlap_param_gather=...), distributed_adam.py)
    read_param_gather_overlap(a, m("optim.overlap_param_sync"))
    # megatron_amp_O2 false (NeMo's O1, its default): the module stays fp32 under autocast and its
    # parameters are the optimizer's master copy (NeMo megatron_base_model.py setup_optimization:
    # model_dtype fp32, store_params false), llmsim's fp32_params
    if not a.get(m("megatron_amp_O2"), False) and precision in ("bf16", "fp16") and not a.get(m("fp8")):
        a.map(m("megatron_amp_O2"), "plan.fp32_params", True)
    _nemo_grad_accumulation_fusion(a, m, optimizer, a.number(m("pipeline_model_parallel_size"), 1))
    if optimizer == "distributed_fused_adam":
        _nemo_adam_states(a, m, precision)
    a.used(m("megatron_amp_O2"))
    grads = {"fp32": "fp32", "float32": "fp32", "32": "fp32", "bf16": "bf16", "bfloat16": "bf16", "fp16": "fp16",
             "float16": "fp16", "16": "fp16"}.get(str(a.get(m("optim.grad_sync_dtype"), "fp32")))
    if grads is None:
        a.refuse(m("optim.grad_sync_dtype"), "expected fp32, bf16 or fp16")
    a.map(m("optim.grad_sync_dtype"), "plan.grad_precision", grads)
    a.map(m("ub_tp_comm_overlap"), "plan.tp_comm_overlap", bool(a.get(m("ub_tp_comm_overlap"), False)))
    a.map(m("use_flash_attention"), "plan.flash_attention", bool(a.get(m("use_flash_attention"), True)))
    a.map(m("cross_entropy_loss_fusion"), "plan.loss", "vocab-parallel")  # Megatron-Core's loss, fused or not
    if a.get(m("fsdp")):
        a.refuse(m("fsdp"), "NeMo FSDP is not modelled; use zero_stage 3 in a scenario")
    a.used(m("fsdp"))
    a.map("trainer.num_nodes", "cluster.nodes", a.number("trainer.num_nodes", 1))
    a.map("trainer.devices", "cluster.devices_per_node", a.number("trainer.devices", 8))
    if a.number("trainer.accumulate_grad_batches", 1) != 1:
        a.refuse("trainer.accumulate_grad_batches", "NeMo derives accumulation from the batch sizes; expected 1")
    a.used("trainer.accumulate_grad_batches")
    if a.has("trainer.max_steps"):
        a.map("trainer.max_steps", "training.tokens", float(a.number("trainer.max_steps") * global_batch * seq))
    return a.finish(NEMO_IGNORED + moe.ignored(nemo_key), {**NEMO_REASONS, **moe.reasons(nemo_key)})


def read(path: str | Path | None, argv: list[str] | None = None, given=frozenset()) -> Imported:
    """A NeMo or Megatron-Bridge YAML (by its suffix), an arguments file or launch script, or
    `argv`; `given`: the scenario fields the caller sets (read_args)."""
    if argv:
        if path is not None:
            argv = [str(path), *argv]
        return read_args(parse_args([w for a in argv for w in (a.split() if a.startswith("--") else [a])]),
                         given=given)
    text = read_text(path, "megatron")
    if str(path).endswith((".yaml", ".yml")):
        data = parse_yaml(text, f"megatron {path}")
        if not isinstance(data, dict) or not isinstance(data.get("model"), dict):
            raise InputError(f"megatron {path}", type(data).__name__, "expected a NeMo or Megatron-Bridge config "
                                                                      "with a model section")
        if "ConfigContainer" in str(data.get("_target_", "")) or {"train", "ddp"} <= set(data):
            from .megatron_bridge import read_bridge
            return read_bridge(data)
        return read_nemo(data)
    files: dict = {}
    return read_args(parse_args(script_words(text, files)), files, Path(str(path)).parent, given)
