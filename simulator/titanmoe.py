"""torchtitan's MoE layer (`plan.moe.framework: torchtitan`): its kernels, what autograd keeps of
them, and what its op-level selective AC saves.

torchtitan v0.2.2 (pytorch/torchtitan@73a0e6979) runs an MoE layer as plain PyTorch ops
(models/moe/moe.py MoE.forward, TokenChoiceTopKRouter, TokenReorderer, GroupedExperts;
distributed/expert_parallel.py ExpertParallel; models/moe/utils.py _permute, _unpermute),
per micro-batch on a device holding T tokens, k experts per token, R the rows the busiest rank
receives (k·T balanced), bytes per element a (BF16). Under TP (llama4/infra/parallelize.py
apply_moe_ep_tp, used by DeepSeek-V3 and Qwen3 too) the layer's input is all-gathered over the
TP ranks and its output reduce-scattered (PrepareModuleInputOutput: Shard(1) -> Replicate,
Partial -> Shard(1); the volumes of a dense MLP's sequence-parallel pair), so every TP rank
routes all T tokens of the sequence (the gate NoParallel) and runs the glue below on them;
without EP the experts are split over the TP ranks (TensorParallel: w1, w3 by column, w2 by row,
ETP = TP) and compute all k·T rows on 1/tp of their width, the shared experts are a TP-split
MLP. With EP too: at ETP = TP each TP rank dispatches all k·T rows over its EP group
(ExpertTensorParallel, the experts split by width and by group); at ETP 1 the EP group takes in
the TP ranks and each reorders, dispatches and combines the rows of 1/tp of the tokens
(ReordererSequenceParallel), then writes them into the zeroed buffer of all k·T rows that the
weighting reads whole, the TP ranks' outputs summed by the reduce-scatter.

1. router: the gate GEMM (T x h x E), the scores cast to fp32 and passed through sigmoid or
   softmax, the auxiliary-loss-free expert bias added (MoEArgs.load_balance_coeff, on by
   default), top-k, the chosen scores gathered, normalised and scaled; histc counts
   (twice: router and reorderer), an argsort of the k·T choices;
2. gather: x[token_indices // k], the k·T routed rows copied in expert order;
3. with `probs_on_input` (MoEArgs.score_before_experts: Llama 4) the rows are cast to fp32,
   multiplied by their scores and cast back;
4. dispatch: all_to_all_single of the rows (moe.dispatch_comm_s), then _permute: the received
   rows stacked with a zero row (torch.vstack) and gathered again in local-expert order into a
   buffer of R + 8 rows per local expert (padded_max_len: each expert's group padded to a
   multiple of 8, TOKEN_GROUP_ALIGN_SIZE_M), which sizes every tensor up to the un-permutation;
   the GEMMs' FLOPs count the R rows (the padding's <= 7 rows an expert are not counted);
5. experts: torch._grouped_mm for w1 and w3 (two launches: plan.projections separate), SiLU
   and the product as two eager kernels, the w2 grouped GEMM (or the for-loop, below);
6. combine: _unpermute (index_put into an empty buffer), the all-to-all back, then the k·T
   rows written into a zeroed buffer in token order (index_put);
7. without probs_on_input (DeepSeek-V3, Qwen3) the rows are cast to fp32 and summed with the
   scores in an fp32 bmm, cast back to BF16; with it, a sum over the k copies;
8. shared experts (FeedForward: w1, w3, SiLU·w3, w2) after the routed ones, and their output
   added.

Compilation (llama4/infra/parallelize.py apply_compile, used by DeepSeek-V3 and Qwen3 too):
each MoE submodule but the experts is compiled (router, reorderer, shared experts); MoE.forward
(steps 2-3, 6-8's glue) and the experts with their dispatch and combine stay eager whatever
`plan.compile` says, so only the router's element-wise kernels and the shared experts' SwiGLU
fuse. Bytes per element (forward; the backward moves twice that, as for every element-wise
operator here):

- router, per T·E score: eager cast a + 4, score function 4 + 4, bias 4 + 4, top-k read 4;
  compiled one kernel reading the logits and writing the scores and the biased scores
  (a + 4 + 4), top-k reading 4. The fp32 scores are kept (sigmoid's and softmax's backward read
  their output);
- gather, per k·T·h: a + a (the int64 indices' floor-division, 16 B a row, beside it); its
  backward scatters with accumulation into a zeroed T x h gradient; the indices are kept;
- probs_on_input, per k·T·h: cast a + 4, product 4 + 4, cast back 4 + a; the product keeps its
  fp32 rows (for the scores' gradient);
- permute: vstack a + a per R·h, gather a + a per padded row; unpermute: index_put a + a per
  padded row; unsort, per k·T·h: zeros a, index_put a + a;
- SwiGLU of the experts, per R·f: SiLU a + a, product a + a + a; SiLU keeps its input, the
  product both operands (3 tensors), w2 its input;
- weighted sum, per k·T·h: cast a + 4, bmm read 4; per T·h: bmm write 4, cast 4 + a. The bmm
  keeps its fp32 rows (and the k scores); probs_on_input: a sum, a per k·T·h and a per T·h;
- shared output added: 3a per T·h.

Op-level selective AC (`plan.recompute: op-selective`; distributed/activation_checkpoint.py
_apply_op_sac with the model's _op_sac_save_list): the gate's mm is recomputed and not counted
(per_op_sac_force_recompute_mm_shapes_by_fqns, default ["moe.router.gate"]), the grouped GEMMs
are not in the save list (re-run), the shared experts' mms continue the block's count (every
other one saved), and the all-to-all outputs are saved where the list names
all_to_all_single (DeepSeek-V3, Llama 4: `op_sac_saves_all_to_all`) and re-run with the
dispatch otherwise (Qwen3). Every other op of the layer runs again before its backward
(recompute.py).

The attention beside the layer runs eager too where the model is (DeepSeek-V3's latent
attention: its norms, RoPE and the concatenations of Q and K, mla.qk_concat_op; its mms wq_a,
wq_b, wkv_a, wkv_b, wo lead the block's count under op-level AC, recompute.py).

The device-to-host copies of the all-to-all's split sizes (ExpertParallel._token_dispatch) and
of the for-loop experts' counts make the host wait for the device (moe.dispatch_host_calls,
hostbound.py). Not modelled: torchtitan's DeepEP layer (moe_deepep.py).

The for-loop experts (`plan.moe.grouped_gemm: false`; MoEArgs.use_grouped_mm false, which
torchtitan sets itself below SM90: llama4/model/args.py, so on A100s) run each local expert's
matmuls, SiLU and product in turn on its rows, in the activations' precision (fp32 training
too), join the outputs (torch.cat) and stack them on the padding's zeros (torch.vstack); without
EP there is no _permute. With fp32 activations the casts to fp32 and back are no-ops.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from .errors import InputError
from .moe import SHARED_EXPERTS, ExpertShard, dispatched_rows, local_experts, routed_rows

FRAMEWORKS = ("megatron-core", "torchtitan")
FP32 = 4
INDEX = 8  # int64 indices
ALIGN = 8  # TOKEN_GROUP_ALIGN_SIZE_M in BF16 (models/moe/utils.py)

# kernels launched per pass (eager; compiled): router and reorderer as counted in the module
# docstring's step 1 (cast, score function, bias, top-k, gather, norm's sum, add and divide,
# scale, histc, the counts' add_, histc, argsort, index), compiled: the fused element-wise
# kernels, top-k, the gather and scale, the two histc, argsort and index, the counts' add_
ROUTER_LAUNCHES = (14, 8)


def mlp_ops(model, shard, experts: ExpertShard, compiled: bool) -> list:
    """The MLP operators of torchtitan's MoE layer for one micro-batch on one device (module
    docstring): between the pre-MLP norm and the residual add."""
    from .workload import MEMORY, Op, _elementwise, _linear, input_kept_elsewhere, mlp_ops as dense_mlp_ops

    a, h, e, k = shard.act_bytes, model.hidden, model.experts, model.top_k
    o = experts.options
    tokens = shard.tokens  # every token of the micro-batch (gathered over TP)
    local = reordered_tokens(shard, experts)
    sent = k * local  # the routed rows this rank reorders and sends, in its own token order
    rows = dispatched_rows(model, local, experts)  # received by the busiest rank
    routed = routed_rows(model, local, experts)
    n_local = local_experts(model, experts.ep)
    # _permute runs for the grouped GEMMs, and after an all-to-all: a buffer of the received rows
    # and ALIGN more for each local expert
    permutes = 1.0 if o.grouped_gemm else np.where(np.asarray(experts.ep) > 1, 1.0, 0.0)
    padded = rows + ALIGN * n_local * permutes
    f = model.expert_ffn_hidden / experts.etp
    useful = o.useful_rows / o.busiest_rows
    # the for-loop experts launch each local expert's kernels apart
    per_expert = 1 if o.grouped_gemm else n_local
    cast = 0 if a == FP32 else a + FP32  # a cast to fp32 and back; none of fp32 activations

    def grouped(name, d_in, d_out, saved, widths=None):
        op = _linear(name, rows, d_in, d_out, a, saved, widths, matrices=n_local)
        return replace(op, model_flops=op.flops * useful * routed / rows, launches=per_expert)

    def glue(name, fwd_bytes, saved=0.0, launches=1):
        return Op(name, MEMORY, fwd_bytes=fwd_bytes, bwd_input_bytes=2 * fwd_bytes, saved_bytes=saved,
                  launches=launches)

    router_bytes = (a + 4 + 4 + 4) if compiled else cast + (4 + 4) + (4 + 4) + 4
    ops = [
        _linear("router", tokens, h, e, a, a * tokens * h),
        # kept: the fp32 scores, the chosen experts' indices and their fp32 scores
        replace(_elementwise("router_topk", tokens * e, router_bytes, FP32 * tokens * e + (INDEX + FP32) * k * tokens),
                launches=ROUTER_LAUNCHES[compiled]),
        # kept: the sorted token indices and their quotients by k (int64)
        glue("moe_gather", 2 * a * sent * h + 2 * INDEX * sent, 2 * INDEX * sent, launches=2),
    ]
    if o.probs_on_input:
        ops.append(glue("moe_scale_input", (2 * cast + 8) * sent * h, FP32 * sent * h + FP32 * sent, launches=3))
    ops += [
        # kept: the int32 permuted indices and the experts' int32 offsets
        glue("moe_permute", permutes * (2 * a * rows * h + 2 * a * padded * h), permutes * (4 * padded + 4 * n_local),
             launches=4),
        grouped("expert_fc1", h, 2 * f, a * padded * h, (f, f)),
        replace(_elementwise("expert_swiglu", padded * f, 5 * a, 3 * a * padded * f), launches=2 * per_expert),
        grouped("expert_fc2", f, h, a * padded * f),
    ]
    if not o.grouped_gemm:  # the experts' outputs joined (torch.cat), then stacked on their padding's zeros
        ops.append(glue("moe_expert_cat", 2 * a * rows * h + a * (rows + padded) * h, launches=2))
    ops.append(glue("moe_unpermute", permutes * 2 * a * padded * h, launches=2))
    if model.shared_experts:
        shared = dense_mlp_ops(model, shard, model.shared_experts * model.shared_expert_ffn_hidden, "shared_")
        # the shared experts read the router's input, kept once by the router; compiled with the
        # model, else their SwiGLU runs eager (fusion.eager_ops)
        shared[0] = input_kept_elsewhere(shared[0], shard)
        ops += [replace(op, group=SHARED_EXPERTS) for op in shared]
    # the zeroed buffer holds every token's k rows; this rank writes the rows it reordered
    ops.append(glue("moe_unsort", a * k * tokens * h + 2 * a * sent * h, launches=2))
    if o.probs_on_input:
        ops.append(glue("moe_sum", a * (k * tokens + tokens) * h))
    else:
        ops.append(glue("moe_weighted_sum", (cast + 4) * k * tokens * h + (4 + cast) * tokens * h,
                        FP32 * k * tokens * (h + 1), launches=3))
    if model.shared_experts:
        ops.append(glue("moe_add", 3 * a * tokens * h))
    return ops


def reordered_tokens(shard, experts: ExpertShard):
    """Tokens whose routed rows one rank reorders, dispatches and combines: every token of the
    micro-batch (gathered over TP), or 1/tp of them where EP borrows the TP ranks with ETP 1
    (ReordererSequenceParallel splits the routed tokens over the TP ranks)."""
    split = (np.asarray(shard.tp) > 1) & (np.asarray(experts.etp) == 1)
    return np.where(split, shard.tokens / shard.tp, shard.tokens)


def all_to_all_output_bytes(model, shard, experts: ExpertShard):
    """Bytes of the two all-to-alls' outputs of one MoE layer: the rows the busiest rank receives
    (dispatch) and the k·T rows it gets back (combine); what op-level AC keeps where its save
    list names all_to_all_single. Without expert parallelism there is no all-to-all."""
    local = reordered_tokens(shard, experts)
    rows = dispatched_rows(model, local, experts) + model.top_k * local
    return np.where(np.asarray(experts.ep) > 1, shard.act_bytes * model.hidden * rows, 0.0)


def check_plan(plan, model) -> None:
    """Refuse, for torchtitan's MoE layer, what it cannot run or llmsim does not model of it."""
    o = plan.moe
    if not model.experts:
        return
    if o.framework != "torchtitan":
        if o.probs_on_input:
            raise InputError("plan.moe.probs_on_input", True, "with plan.moe.framework: torchtitan only "
                             "(Megatron-Core's --moe-apply-probs-on-input is not modelled)")
        if not o.op_sac_saves_all_to_all:
            raise InputError("plan.moe.op_sac_saves_all_to_all", False, "torchtitan's op-level AC save list: "
                             "with plan.moe.framework: torchtitan only")
        return
    why = "for torchtitan's MoE layer (plan.moe.framework: torchtitan)"
    refused = (
        ("model.activation", model.activation, model.activation != "swiglu",
         "swiglu: torchtitan's GroupedExperts compute silu(x w1) * (x w3) w2"),
        ("plan.etp", plan.etp, plan.etp != plan.tp and (plan.ep == 1 or plan.etp != 1),
         f"{plan.tp} (= tp: without EP torchtitan splits the experts over the TP ranks)" if plan.ep == 1 else
         f"1 or tp = {plan.tp} (torchtitan's expert TP is 1 or the TP degree)"),
        ("plan.tp_comm_overlap", plan.tp_comm_overlap, plan.tp > 1 and plan.tp_comm_overlap,
         "false: async TP around torchtitan's MoE layer is not modelled"),
        ("plan.moe.dispatcher", o.dispatcher, o.dispatcher != "alltoall",
         "alltoall (torchtitan's standard backend); its DeepEP layer (models/moe/moe_deepep.py) is not modelled"),
        ("plan.moe.capacity_factor", o.capacity_factor, o.capacity_factor is not None,
         "none: torchtitan's token-choice routing drops no token"),

        ("plan.moe.router_padding", o.router_padding, o.router_padding, "false (a Megatron-Core option)"),
        ("plan.moe.shared_expert_overlap", o.shared_expert_overlap, o.shared_expert_overlap,
         "false (a Megatron-Core option)"),
        ("plan.moe.ep_comm_overlap", o.ep_comm_overlap, o.ep_comm_overlap, "false (a Megatron-Core option)"),
        ("plan.moe.folding", o.folding, not o.folding, "true: torchtitan folds EP into the FSDP, CP and TP ranks"),
        ("plan.moe.probs_in_experts", o.probs_in_experts, o.probs_in_experts,
         "false: torchtitan weights the experts' outputs (or, with probs_on_input, their input rows)"),
        ("plan.projections", plan.projections, plan.projections != "separate",
         "separate: torchtitan's w1 and w3 (and wq, wk, wv) are GEMMs of their own"),
        ("plan.precision", plan.precision, plan.precision != "bf16" and (o.grouped_gemm or plan.precision != "fp32"),
         "bf16 (fp32 too with the for-loop experts, grouped_gemm false: _run_experts_grouped_mm casts to BF16); "
         "the FP8 grouped GEMMs (quantize.grouped_mm) are not modelled"),
        ("plan.recompute", plan.recompute, plan.recompute == "selective",
         "none, full or op-selective (Megatron-Core's selective modules are not torchtitan's)"),
    )
    for field, value, bad, allowed in refused:
        if bad:
            raise InputError(field, value, f"{allowed} {why}")
