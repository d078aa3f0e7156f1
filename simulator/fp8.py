"""FP8 linears as TransformerEngine and torchao run them, and NVFP4 ones as TransformerEngine
does: which GEMMs run quantized, the cast kernels each scaling recipe adds, and what it
changes in memory.

`plan.precision: fp8` (Hopper and later) or `mxfp8` (Blackwell block scaling) with
`plan.fp8_recipe`:

- Which GEMMs: the linear layers of the transformer layers (QKV, attention projection, MLP
  up/gate and down; MLA's down-, up- and output projections, which Megatron-Core builds as
  TransformerEngine linears: NVIDIA/Megatron-LM@d98e8a64dd
  megatron/core/models/gpt/gpt_layer_specs.py MLASelfAttentionSubmodules, TELinear for the
  duplicated down-projections, each casting the normed hidden state itself), in forward,
  input-gradient and weight-gradient GEMMs. The attention core
  and the lm_head stay in BF16: TransformerEngine's modules are the layer's linears
  (TELayerNormColumnParallelLinear, TERowParallelLinear), core attention is FP8 only with
  fp8_dot_product_attention and the output layer is Megatron's own ColumnParallelLinear
  (NVIDIA/Megatron-LM@dddecd198f megatron/core/models/gpt/gpt_model.py, transformer_config.py
  fp8_wgrad default True); torchtitan converts every nn.Linear but `output`
  (torchtitan@9dec370 torchtitan/float8.py module_filter_fn; the Jun 2025 runs do not say
  whether they filtered it: the lm_head is taken as BF16). The FP8 GEMMs run at the
  profile's `peak_tflops.fp8` (`mxfp8`) and `efficiency.matmul_fp8`, measured on FP8 GEMMs,
  not twice the BF16 rate; they read their two operands in FP8 (1 B, MXFP8 1 + 1/32 with its
  block scales) and write their result in BF16 (compute.as_gemm_kind).
- Cast kernels, per linear and micro-batch, as torchao's own roofline counts their HBM
  traffic (pytorch/ao@624304080 torchao/testing/float8/roofline_utils.py
  get_tensor_memory_traffic_ovhd_s; bytes per element of the tensor):
  tensorwise (dynamic, torchao): input 2 (amax, fused into the producer under torch.compile)
  + 2 + 2·1 (cast to row- and column-major FP8) = 6, or 4 fused; weight 2 + 3 + 3 = 8;
  gradient of the output as the input. rowwise (torchao): input 2 + 1 + 2, then 2 + 1 = 8
  (6 fused); weight 3 + 4 + 3 = 10; gradient as the input. Its two gradient GEMMs
  accumulate slowly (Float8LinearConfig's grad_input and grad_weight GEMM configs), and
  with row-wise scales and slow accumulation torchao runs cuBLAS's tensor-wise kernel with
  unit scales and rescales the output in place (pytorch/ao@03c850afa
  torchao/float8/float8_ops.py addmm_float8_unwrapped, "the rowwise CUTLASS-based kernel is
  so slow without fast-accum"; from pytorch/ao PR #1377, Dec 2024, until PR #2595, Jul 2025;
  under torch.compile one more kernel per GEMM, pytorch/ao issue #2184): 2 + 2 B per
  element of every grad_input (each separate linear's) and grad_weight. mxfp8: two quantisations from
  BF16, 2 + 1 + 1/32 each (4 + 1/16 with the first read fused). delayed (TransformerEngine):
  the scale comes from the amax history, so a cast has no amax pass and writes the FP8
  tensor and its transpose in one kernel (fp8_cast_transpose_fused): 2 + 2 = 4 for the input
  and the output gradient (TE@fb749619e transformer_engine/pytorch/module/linear.py); the
  weights are cast once per step (is_first_microbatch), not per micro-batch: see
  `weight_cast_bytes_per_step`. current (TransformerEngine's Float8CurrentScaling, Megatron-LM's
  --fp8-recipe tensorwise): the scale comes from the tensor itself, one more pass reading it
  for its amax before the same fused cast and transpose (TE@d0067d0da
  transformer_engine/pytorch/csrc/quantizer.cpp Float8CurrentScalingQuantizer::quantize_impl:
  nvte_compute_amax, nvte_compute_scale_from_amax, nvte_quantize_v2): 2 + 4 = 6 for the input
  and the output gradient, and the weights' once-per-step casts read them once more for their
  amax; the amax all-reduce it adds over the TP group for sequence-parallel inputs (one float,
  latency-bound) is not modelled. The casts move these bytes at the profile's memory curve,
  torchao's rowwise ones at their own, efficiency.memory_kernels.fp8_cast_rowwise, measured
  against torchao's published H100 rowwise speedups (validation/fp8_microbench.py: the
  roofline bytes alone predicted those speedups 1.45x too high).
  torchao casts each linear's input itself: with separate projections (`plan.projections:
  separate`, projections.py: torchtitan's wq/wk/wv and w1/w3) the same input is cast three
  and two times in eager mode, once under torch.compile (AOTAutograd's common-subexpression
  elimination merges the identical casts); with tensorwise and tensor parallelism the input is
  cast once, before the FP8 all-gather (torchtitan@820504e
  torchtitan/models/llama3/parallelize_llama.py enable_float8_tensorwise_tp:
  Float8ColwiseParallel, PrepareFloat8ModuleInput), which also halves the bytes of the
  forward all-gathers. TransformerEngine's fused QKV and FC1 GEMMs cast once.
- Memory: TransformerEngine keeps an FP8 copy of every linear weight and its transpose for
  the micro-batches of a step (2 B per parameter on top of the BF16 weight), or with FP8
  primary weights (`plan.fp8_params`, NeMo's fp8_params) the weight itself in FP8 with its
  transpose (1 + 1 B) and its all-gather in 1 B (NeMo@v2.0.0 nemo/core/optim/
  distributed_adam.py); a linear saves its input for the weight gradient in FP8, 1 B instead
  of 2 (the projection's FP8 copy of the attention output comes on top of the BF16 output
  the attention kernel keeps); under sequence parallelism TransformerEngine keeps the FP8
  shard of an all-gathered input, as BF16 linears keep theirs, and torchao's tensorwise TP
  the gathered FP8 input (saved_input_change). MXFP8 keeps both quantisations of a weight
  (2·(1 + 1/32) B).
  torchao (Dec 2024, torchao@eab345c22 float8_linear.py
  manual_float8_matmul_with_args_in_float8) saves each linear's FP8 input: one tensor that
  wq, wk and wv all hold where it was cast once (compiled, or cast before a tensorwise FP8
  all-gather), three copies where each linear cast its own (eager); the Jun 2025
  version and rowwise save the BF16 input (no change). torchao keeps no FP8 weight copy
  between steps.
- BF16 layers at the ends (`plan.bf16_layers_at_start`, `plan.bf16_layers_at_end`):
  Megatron-Core runs and builds the layers of global index below num_layers_at_start_in_bf16
  or among the last num_layers_at_end_in_bf16 outside fp8_autocast and fp8_model_init when
  first_last_layers_bf16 is set (NVIDIA/Megatron-LM@d98e8a64dd megatron/core/fp8_utils.py
  is_first_last_bf16_layer, get_fp8_context; refused under delayed scaling), so their linears
  are BF16 GEMMs without casts, keep their BF16 inputs and hold BF16 weights, gathered as such
  (`bf16_layer_plan`). Megatron-Bridge's FP8 current-scaling recipe sets one at each end
  (bf16_with_fp8_current_scaling_mixed), its NVFP4 recipes the last four. The layers sit on
  the ranks of the first and the last virtual stage (`bf16_layers_on`), whose mean layer the
  layout times (layout._mean_layer).
- NVFP4 (`plan.precision: nvfp4`, Blackwell): TransformerEngine's NVFP4BlockScaling with its
  defaults, which Megatron-Core builds for --fp4-format e2m1 (NVIDIA/Megatron-LM@d98e8a64dd
  megatron/core/fp4_utils.py get_fp4_recipe; Megatron-Bridge's bf16_with_nvfp4_mixed). Read
  at TE@d0067d0da: the same linears as FP8 (the lm_head, core attention and the MoE router in
  BF16; BF16 layers at the ends as above, get_fp4_context), their forward, input-gradient and
  weight-gradient GEMMs all in NVFP4 (E2M1 values, an E4M3 scale per 16, a per-tensor FP32
  scale applied to the GEMM's output: common/gemm/cublaslt_gemm.cu), at the profile's
  `peak_tflops.nvfp4` and `efficiency.matmul_fp4`, reading 0.5 + 1/16 B per operand element
  (compute.FP4_BYTES). Casts (csrc/quantizer.cpp NVFP4Quantizer::quantize_impl): the input
  and the output gradient take an amax pass (hadamard_transform_amax: the row-wise amax and
  that of the Hadamard-transformed transpose in one read) and one fused kernel
  (hadamard_transform_cast_fusion) that reads the tensor again and writes the row-wise FP4
  copy and the column-wise FP4 copy of its random Hadamard transform (for the weight
  gradient, with stochastic rounding on the gradient): 4 + 2·(0.5 + 1/16) B per element; with
  a bias the output gradient is read once more for it. The weight (16 x 16 blocks, one copy
  the transpose of the other) the same per step, cast once with TE's per-step weight cache.
  Memory: a linear keeps only the column-wise FP4 copy of its input (linear.py
  update_usage), both FP4 copies of its weight beside the BF16 one, or with FP4 primary
  weights (`plan.fp8_params`: Megatron's --fp4-param-gather) the two FP4 copies alone and an
  all-gather of 0.5 + 1/16 B per element (the scales taken to travel with the packed values).
  The casts run at their own rate, efficiency.memory_kernels.nvfp4_cast (CAST_KERNELS), fitted
  to TransformerEngine's B300 GEMM profile (validation/te_gemm_bench.py): 0.6 of the HBM
  bandwidth, two thirds of the generic memory curve. Sequence parallelism's all-gathers move
  the quantized tensors, as under every TransformerEngine recipe (tp_gather_bytes_factor).
  Not modelled: the fallback kernels for tensors whose rows are not a multiple of 64 or
  columns of 128.
- Blackwell (`fp8_any_layout` in its profiles): FP8 GEMMs take any operand layout, so
  TransformerEngine's per-tensor quantizers (delayed, current) write no transposed copy and keep
  one FP8 weight (writes_transpose): 1 B less per cast element and per weight kept.
- FSDP float8 all-gather (`plan.fp8_fsdp_all_gather`, tensorwise; torchtitan's
  float8.enable_fsdp_float8_all_gather with precompute_float8_dynamic_scale_for_fsdp;
  torchao@eab345c22 torchao/float8/fsdp_utils.py): after the optimizer step one foreach
  max-norm over the weight shards and one all-reduce give every weight's scale; before each
  FSDP all-gather the shard is cast to FP8 with it (WeightWithDynamicFloat8CastTensor
  .fsdp_pre_all_gather), the all-gather moves 1 B per linear weight element and the gathered
  FP8 weight goes straight into the GEMM: no weight cast per linear and micro-batch, the
  gathered buffers in 1 B. The shard casts (stored + 1 B per shard element and gather; the
  max-norm reads the shard once) are booked with the optimizer step
  (`weight_cast_bytes_per_step`), where TransformerEngine's once-per-step casts are.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from . import fsdp, projections
from .compute import FP4_BYTES, FP8_MATMUL, MX_SCALE, MXFP8_MATMUL, NVFP4_MATMUL, as_gemm_kind
from .dims import zero_group_size
from .errors import InputError
from .workload import MEMORY, Op, Shard, local_heads

# precisions whose layer linears run as quantized GEMMs (the others run every GEMM alike)
LOW_PRECISIONS = ("fp8", "mxfp8", "nvfp4")

# Bytes per element of (input, weight, output gradient) the casts of one linear move per
# micro-batch (forward and backward): (unfused, amax fused into the producer).
CAST_BYTES = {
    "tensorwise": ((6.0, 8.0, 6.0), (4.0, 8.0, 4.0)),
    "rowwise": ((8.0, 10.0, 8.0), (6.0, 10.0, 6.0)),
    "mxfp8": ((6 + 2 * MX_SCALE, 0.0, 6 + 2 * MX_SCALE), (4 + 2 * MX_SCALE, 0.0, 4 + 2 * MX_SCALE)),
    # an amax pass, then one kernel writing both quantisations (the column-wise one of the
    # Hadamard-transformed tensor)
    "nvfp4": ((4 + 2 * FP4_BYTES, 0.0, 4 + 2 * FP4_BYTES), (4 + 2 * FP4_BYTES, 0.0, 4 + 2 * FP4_BYTES)),
    "delayed": ((4.0, 0.0, 4.0), (4.0, 0.0, 4.0)),
    "current": ((6.0, 0.0, 6.0), (6.0, 0.0, 6.0)),
}
# TransformerEngine: fused QKV/FC1 GEMMs, weights cast once per step; its per-tensor scaled
# recipes keep one FP8 weight and its transpose (or FP8 primary weights)
TE_PER_TENSOR = ("delayed", "current")
TE_RECIPES = (*TE_PER_TENSOR, "mxfp8", "nvfp4")
# Bytes per element of the quantised copy a recipe keeps (value and block scale)
QUANTIZED_BYTES = {"mxfp8": 1 + MX_SCALE, "nvfp4": FP4_BYTES}
GEMM_KINDS = {"mxfp8": MXFP8_MATMUL, "nvfp4": NVFP4_MATMUL}
# Layer linears that stay in 16 bits: the MoE router's gating GEMM runs in the input's dtype
# (or fp32), not in a TransformerEngine module (NVIDIA/Megatron-LM@d98e8a64dd
# megatron/core/transformer/moe/router.py Router.gating, router_gating_linear)
HIGH_PRECISION_LINEARS = ("router",)


def recipe(plan) -> str | None:
    """The scaling recipe of an FP8 or NVFP4 plan, None for a plan without quantized linears."""
    if plan.precision in ("mxfp8", "nvfp4"):
        return plan.precision
    return plan.fp8_recipe if plan.precision == "fp8" else None


# Rows a quantized grouped GEMM's operand is padded to a multiple of, per local expert
# (TE@d0067d0da transformer_engine/pytorch/quantization.py get_align_size_for_quantization)
MOE_ROW_ALIGN = {"delayed": 16, "current": 16, "mxfp8": 32, "nvfp4": 128}


def moe_row_align(plan) -> int:
    """The multiple of rows Megatron-Core pads each local expert's input to under the plan's
    TransformerEngine recipe (moe.quantization_padding); 0 without one (BF16, or torchao's
    recipes, which llmsim does not run MoE layers with)."""
    return MOE_ROW_ALIGN.get(recipe(plan), 0)


def compute_precision(plan) -> str:
    """The precision of every GEMM that is not an FP8 linear (attention, lm_head)."""
    return "bf16" if plan.precision in LOW_PRECISIONS else plan.precision


def input_casts(rec: str, shard: Shard, compiled: bool, readers) -> int:
    """How many times the `readers` linears reading one input cast it to FP8 (and keep that
    FP8 input): once with TransformerEngine's fused GEMMs, once with tensorwise TP (cast
    before the FP8 all-gather), once compiled (AOTAutograd merges the identical casts:
    common-subexpression elimination before partitioning, pytorch/pytorch@c28ba8e5
    torch/_functorch/partitioners.py min_cut_rematerialization_partition; config.cse = True,
    @d4e83dce torch/_functorch/config.py), else once per linear (eager torchao)."""
    if rec in TE_RECIPES or compiled or (rec == "tensorwise" and shard.sp):
        return 1
    return readers


def writes_transpose(rec: str | None, acc=None) -> bool:
    """Whether TransformerEngine writes a transposed FP8 copy beside a per-tensor scaled FP8
    tensor (`delayed`, `current`): Hopper's FP8 GEMMs take the TN layout only, so a tensor's
    column-wise use needs its transpose; Blackwell's take any layout (`acc.fp8_any_layout`;
    TE@d0067d0da transformer_engine/common/transformer_engine.cpp
    nvte_is_non_tn_fp8_gemm_supported: SM 10.x-11.x and 13+), and there TE's per-tensor
    quantizers write the data alone (csrc/quantizer.cpp: with_transpose = columnwise_usage &&
    !is_non_tn_fp8_gemm_supported). No accelerator given: Hopper's."""
    return rec in TE_PER_TENSOR and not (acc is not None and acc.fp8_any_layout)


def _cast_op(name, shard: Shard, rec: str, compiled: bool, tokens, d_in, d_out, readers, casts, matrices=1,
             sp_input=False, weight_in_fp8=False, bias=False, transpose=True):
    """The cast kernels of one linear: `casts` casts of its input (input_casts), its weight
    (none where FSDP all-gathered it in FP8), its output gradient; rowwise also rescales each
    of the `readers` linears' own gradients. NVFP4 with a `bias`: the bias gradient is summed
    over the output gradient apart (TE@d0067d0da csrc/extensions/bias.cpp bgrad_quantize has no
    fused NVFP4 path: at::sum_out, then the quantisation), one more read of it."""
    inputs, weights, grads = CAST_BYTES[rec][1 if compiled else 0]
    weights = 0.0 if weight_in_fp8 else weights
    if rec in TE_PER_TENSOR and not transpose:  # the FP8 data alone (writes_transpose)
        inputs, grads = inputs - 1, grads - 1
    x = tokens * d_in
    if rec == "tensorwise" and shard.sp and sp_input:
        x = x / shard.tp  # the sequence-sharded input is cast, then all-gathered in FP8
    fwd = casts * inputs * x + weights * matrices * d_in * d_out
    bwd = (grads + (shard.act_bytes if bias and rec == "nvfp4" else 0.0)) * tokens * d_out
    if rec == "rowwise":  # both gradient GEMMs rescaled after cuBLAS: read and write their outputs
        bwd = bwd + 2 * shard.act_bytes * (readers * tokens * d_in + d_in * d_out)
    return Op(f"{name}.{cast_kernel(rec)}", MEMORY, fwd_bytes=fwd, bwd_input_bytes=bwd)


# The memory-kernel classes of the casts (compute.MEMORY_KERNELS): torchao's rowwise casts
# (Inductor kernels with column-wise scales and transposes) and TransformerEngine's NVFP4 casts
# (the Hadamard transform, stochastic rounding, 16 x 16 weight blocks) each run at their own
# measured rate where the profile has one (efficiency.memory_kernels.fp8_cast_rowwise,
# nvfp4_cast); the other recipes' at fp8_cast's.
CAST_KERNELS = {"rowwise": "fp8_cast_rowwise", "nvfp4": "nvfp4_cast"}


def cast_kernel(rec: str | None) -> str:
    """The memory-kernel class of recipe `rec`'s casts, also its cast operators' name suffix."""
    return CAST_KERNELS.get(rec, "fp8_cast")


def is_cast(op: Op) -> bool:
    """Whether `op` is a linear's cast kernels (named LINEAR.<cast kernel>)."""
    return op.name.rsplit(".", 1)[-1] in ("fp8_cast", *CAST_KERNELS.values())


def fp8_layer_ops(ops: list[Op], shard: Shard, plan, model=None, acc=None) -> list[Op]:
    """The layer's operators with its linears as FP8 (or NVFP4) GEMMs, each followed by its
    casts; the list unchanged for a plan without quantized linears. `model`: whose biases;
    `acc`: the accelerator, whose FP8 GEMM layouts decide the per-tensor casts' transposes."""
    rec = recipe(plan)
    if rec is None:
        return ops
    kind = GEMM_KINDS.get(rec, FP8_MATMUL)
    out = []
    for op in ops:
        if op.linear is None or op.name in HIGH_PRECISION_LINEARS:
            out.append(op)
            continue
        tokens, d_in, d_out, matrices = op.linear.tokens, op.linear.d_in, op.linear.d_out, op.linear.matrices
        readers = projections.readers(op, plan)  # torchao: each linear casts its own input
        casts = input_casts(rec, shard, plan.compile, readers)
        sp_input = op.linear.sp_input
        out.append(replace(as_gemm_kind(op, kind, shard.act_bytes),
                           saved_bytes=op.saved_bytes + saved_input_change(op.name, rec, tokens, d_in, casts, shard,
                                                                           sp_input, op.linear.input_kept_elsewhere)))
        biased = model is not None and (model.bias or model.qkv_bias and op.name == "qkv")
        out.append(_cast_op(op.name, shard, rec, plan.compile, tokens, d_in, d_out, readers, casts, matrices, sp_input,
                            plan.fp8_fsdp_all_gather, biased, writes_transpose(rec, acc)))
    return out


def saved_input_change(name: str, rec: str, tokens, d_in, casts, shard: Shard, sp_input: bool = False,
                       kept_elsewhere: bool = False):
    """Bytes an FP8 linear saves for its weight gradient beyond the BF16 input it would keep.

    The BF16 input kept is the linear's whole input, or under Megatron-LM's sequence
    parallelism, for a linear reading the all-gathered norm output (`sp_input`), its
    sequence shard (workload.Shard.kept_input_tokens). TransformerEngine keeps that same
    tensor in FP8 and all-gathers it again for the weight gradient (TE@fb749619e
    transformer_engine/pytorch/module/layernorm_linear.py, backward:
    gather_along_first_dim(ln_out)); torchao's tensorwise TP casts the shard, all-gathers it
    in FP8 and keeps the gathered FP8 input the linear received (input_casts); otherwise one
    FP8 input per cast. `kept_elsewhere`: the BF16 input is another operator's to keep
    (workload.LinearShape), so there is none of this linear's own to replace."""
    a = shard.act_bytes
    x = tokens * d_in
    if rec in TE_RECIPES or rec == "tensorwise":
        # the BF16 input kept without FP8
        local = x * shard.kept_input_tokens / shard.tokens if sp_input else x
        fp8 = QUANTIZED_BYTES.get(rec, 1.0)
        if name == "attn_out":  # the attention kernel keeps its BF16 output anyway
            return casts * fp8 * x
        kept = local if rec in TE_RECIPES else x
        return casts * fp8 * kept - (0.0 if kept_elsewhere else a) * local
    return 0.0 * x


def weight_bytes_per_param(plan, acc=None) -> tuple[float, float]:
    """(bytes per linear weight parameter on the device between steps, bytes its data-parallel
    all-gather moves) under the plan's FP8 recipe; (2, 2) without FP8 or with torchao."""
    rec = recipe(plan)
    if rec in TE_PER_TENSOR:  # the FP8 weight, with its transpose where the GEMMs need it
        fp8 = 2.0 if writes_transpose(rec, acc) else 1.0
        return (fp8, 1.0) if plan.fp8_params else (2.0 + fp8, 2.0)
    if rec in QUANTIZED_BYTES:  # block-scaled: both quantisations of each weight (NVFP4's 2D blocks: one the
        one = QUANTIZED_BYTES[rec]  # other's transpose)
        return (2 * one, one) if plan.fp8_params else (2.0 + 2 * one, 2.0)
    if plan.fp8_fsdp_all_gather:
        return 2.0, 1.0
    return 2.0, 2.0


def with_weight_copies(states, linear_params, plan, per, acc=None):
    """`states` (states.ModelStates) with the FP8 weight copies TransformerEngine keeps of
    `linear_params` linear weights between steps, or their FP8 primary weights in place of the
    16-bit ones; under ZeRO-3 the copies are gathered per use (the states as they are)."""
    if plan.zero_stage >= 3 or recipe(plan) is None:
        return states
    weight, _ = weight_bytes_per_param(plan, acc)
    return replace(states, weights_bytes=states.weights_bytes + linear_params * (weight - per.weight))


def gather_bytes_per_param(per, linear_params, params, plan) -> object:
    """Bytes per parameter the data-parallel all-gather of `params` moves when `linear_params`
    of them are linear weights gathered in FP8 (FP8 primary weights)."""
    if recipe(plan) is None:
        return per.weight + 0.0 * params
    _, gather = weight_bytes_per_param(plan)
    return per.weight - linear_params * (per.weight - gather) / params


def attention_linear_params(model, tp) -> object:
    """Weight parameters of one layer's QKV and output projections per TP rank (no biases);
    MLA's down-, up- and output projections (mla.py)."""
    if model.attention == "mla":
        from .mla import linear_params_local
        return linear_params_local(model, tp)
    _, kv_heads = local_heads(model, tp)
    q_w, kv_w = model.q_width / tp, kv_heads * model.head_dim
    return model.hidden * (q_w + 2 * kv_w) + q_w * model.hidden


def mlp_linear_params(model, width, tp) -> object:
    """Weight parameters of an MLP of `width` per TP rank (no biases)."""
    return model.mlp_matrices * model.hidden * width / tp


def layer_linear_params(model, tp) -> object:
    """Weight parameters of one dense layer's linears per TP rank (no norms, no biases)."""
    return attention_linear_params(model, tp) + mlp_linear_params(model, model.ffn_hidden, tp)


def weight_cast_bytes_per_step(plan, linear_params, acc=None) -> object:
    """HBM bytes TransformerEngine's once-per-step weight casts move on a device holding
    `linear_params` linear weights: read BF16, write FP8 and its transpose (2 + 2 B), or with
    FP8 primary weights only the transpose (1 + 1 B), current scaling 2 B more for the amax
    pass over the BF16 weight, no transpose where the GEMMs take any layout (writes_transpose);
    MXFP8 two quantisations (2·(2 + 1 + 1/32) B); NVFP4 an amax pass and both 2D-block
    quantisations (2 + 2 + 2·(0.5 + 1/16) B), with FP4 primary weights the transpose. torchao casts
    the weights every micro-batch (in the layer's cast kernels), or with the FSDP float8
    all-gather its shard before every all-gather (the stored weight
    read, 1 B written: per micro-batch one gather for the forward and one for the backward,
    once a step where FSDP keeps the weights gathered) and reads it once for the scales."""
    rec = recipe(plan)
    if rec in TE_PER_TENSOR:
        amax = 2.0 if rec == "current" and not plan.fp8_params else 0.0
        t = writes_transpose(rec, acc)
        # FP8 primary weights: the FP8 data read and its transpose written; else BF16 read, FP8 written
        cast = (2.0 if t else 0.0) if plan.fp8_params else (4.0 if t else 3.0)
        return linear_params * (cast + amax)
    if rec == "mxfp8":
        return linear_params * (0.0 if plan.fp8_params else 2 * (3 + MX_SCALE))
    if rec == "nvfp4":
        return linear_params * (2 * FP4_BYTES if plan.fp8_params else 4 + 2 * FP4_BYTES)
    if plan.fp8_fsdp_all_gather:
        stored = 4.0 if plan.fp32_params else 2.0
        gathers = 1 if fsdp.keeps_gathered(plan) else 2 * plan.microbatches
        return linear_params / zero_group_size(plan) * (gathers * (stored + 1.0) + stored)
    return 0.0 * np.asarray(linear_params)


def check_bf16_layers(plan, model, schedule) -> None:
    """Refuse BF16 layers that Megatron-Core would refuse or llmsim cannot place: only beside
    FP8 linears, not under delayed scaling (its amax reduction assumes every layer in FP8:
    NVIDIA/Megatron-LM@d98e8a64dd megatron/core/fp8_utils.py get_fp8_context asserts it), and
    no more than the first or the last virtual pipeline stage holds (llmsim counts them on the
    ranks of those stages; Megatron-Core's own bound is the layers per pipeline rank)."""
    start, end = plan.bf16_layers_at_start, plan.bf16_layers_at_end
    if not start and not end:
        return
    field, value = ("plan.bf16_layers_at_start", start) if start else ("plan.bf16_layers_at_end", end)
    if recipe(plan) is None:
        raise InputError(field, value, "BF16 layers are the exception to FP8 or NVFP4 linears: needs precision fp8, "
                         "mxfp8 or nvfp4")
    if recipe(plan) == "delayed":
        raise InputError(field, value, "not with fp8_recipe delayed (Megatron-Core refuses BF16 layers under delayed "
                         "scaling): current, tensorwise, rowwise, mxfp8 or nvfp4")
    from .stagesplit import virtual_stage_layers
    stage_layers = virtual_stage_layers(model, plan, schedule, plan.pp, schedule.chunks(plan.vpp))
    if start > stage_layers[0]:
        raise InputError("plan.bf16_layers_at_start", start, f"at most the first virtual pipeline stage's "
                         f"{stage_layers[0]} layers")
    if end > stage_layers[-1]:
        raise InputError("plan.bf16_layers_at_end", end, f"at most the last virtual pipeline stage's "
                         f"{stage_layers[-1]} layers")
    if start + end > model.layers:
        raise InputError("plan.bf16_layers_at_end", end, f"start + end at most layers={model.layers}")


def bf16_layer_plan(plan):
    """The plan a BF16 layer of an FP8 plan runs under (its linears in BF16, its weights
    BF16 and gathered as such: Megatron-Core builds and runs them outside fp8_model_init and
    fp8_autocast, fp8_utils.get_fp8_context), or None where every layer runs FP8 linears."""
    if recipe(plan) is None or not (plan.bf16_layers_at_start or plan.bf16_layers_at_end):
        return None
    return replace(plan, precision="bf16", fp8_params=False, fp8_fsdp_all_gather=False, bf16_layers_at_start=0,
                   bf16_layers_at_end=0)


def bf16_layers_on(plan, holds_first, holds_last):
    """BF16 layers on a device of a pipeline rank that holds the first and/or the last virtual
    stage (0/1 flags, broadcast-safe): layers [0, start) and [layers - end, layers) by global
    index (Megatron-Core fp8_utils.is_first_last_bf16_layer), which check_bf16_layers keeps
    within those stages."""
    return plan.bf16_layers_at_start * np.asarray(holds_first) + plan.bf16_layers_at_end * np.asarray(holds_last)


def tp_gather_bytes_factor(plan) -> tuple[float, float]:
    """Bytes of the (forward, backward) TP all-gathers relative to the 16-bit activations.
    TransformerEngine's recipes all-gather the quantized tensor wherever sequence parallelism
    gathers one: the input of the column-parallel linears in the forward pass, and in the
    backward pass the output gradient of the row-parallel ones and the input re-gathered for
    the weight gradient; through NCCL (TE@d0067d0da transformer_engine/pytorch/distributed.py
    gather_along_first_dim with the linear's quantizer: _all_gather_fp8, _all_gather_mxfp8,
    _all_gather_nvfp4; module/layernorm_linear.py, linear.py and base.py
    grad_output_preprocess pass it) and through userbuffers alike (fp8_buf for every
    all-gather layer, TE@fb749619e transformer_engine/pytorch/module/base.py
    get_default_config): 1 B per element per-tensor, MXFP8 and NVFP4 with their block scales.
    torchao's tensorwise recipe all-gathers the FP8 input in the forward pass only."""
    rec = recipe(plan)
    if rec == "tensorwise":
        return 0.5, 1.0
    if rec in TE_RECIPES:
        quantized = QUANTIZED_BYTES.get(rec, 1.0) / 2
        return quantized, quantized
    return 1.0, 1.0
