"""Mixture-of-Experts layers on one device: routing, token dispatch and combine, expert GEMMs,
shared experts, and where the expert parameters live.

Megatron-Core's MoE layer (NVIDIA/Megatron-LM core_v0.9.0 @1afee592 and d98e8a64dd,
megatron/core/transformer/moe/: router.py, token_dispatcher.py MoEAlltoAllTokenDispatcher,
experts.py, moe_layer.py), per micro-batch on a device that holds T tokens (b·s/cp, and /tp:
MoE layers with tp > 1 need sequence parallelism, moe_layer.py MoELayer.forward):

1. router: a hidden x experts GEMM, softmax and top-k over its scores;
2. permute: each token copied once per chosen expert, rows grouped by destination;
3. dispatch: all-to-all over the EP group (each rank sends its k·T rows, keeps 1/ep), then
   with ETP > 1 an all-gather over the ETP group (each ETP rank computes a 1/etp slice of
   every expert's columns for all the rows the group received);
4. experts: fc1 (gate and up), the activation, fc2 on the rows of each of the E/ep local
   experts (grouped GEMM or one GEMM per expert);
5. combine: reduce-scatter over ETP, all-to-all back over EP, un-permute (weighted by the
   router's probabilities before Megatron-Core 0.13: below).

Where the probabilities weight the rows (`plan.moe.probs_in_experts`): Megatron-Core before 0.13
weights the expert outputs in the un-permutation (moe_utils.unpermute with probs), which keeps
the routed copies for the probabilities' gradient. From 0.13 (NVIDIA/Megatron-LM@2659630721,
"Memory efficient token permutation", first in core_v0.13.0) the probabilities are permuted
and dispatched with the tokens (one more all-to-all over EP and all-gather over ETP each
way: token_dispatcher.py @d98e8a64dd token_dispatch, dispatch_postprocess) and scale the
experts' activation, and the un-permutation only sums (it keeps the indices). SwiGLU's fused
kernel weights its output in place (fused_bias_swiglu.py weighted_bias_swiglu_impl: it keeps
its input and the probabilities, and recomputes the SwiGLU for their gradient); other
activations multiply after it (experts.py bias_act_func, mlp.py per_token_scale), keeping the
activation's output for the probabilities' gradient. The probabilities (one value a row, in the
router's input dtype: moe_utils.topk_routing_with_score_function type_as(logits)) are not
counted in bytes moved; their collectives' calls are.

The all-gather dispatcher (MoEAllGatherTokenDispatcher) instead all-gathers every token of
the EP x ETP group and reduce-scatters the output. The `deepep` and `hybridep` dispatchers
(Megatron-Core's flex dispatcher with DeepEP's normal kernels or Hybrid-EP:
--moe-token-dispatcher-type flex --moe-flex-dispatcher-backend deepep | hybridep) send each token
once to every rank that holds one of its experts and sum the ranks' outputs on the way back
(deepep.py). Shared experts (DeepSeekMoE) are a dense MLP split over TP like any other.

Routed rows. Balanced routing sends k·T rows per rank and each rank receives k·T. With a
capacity factor c (--moe-expert-capacity-factor) an expert takes at most c·k·T/E rows from
each rank (moe_utils.get_capacity, without its ceil: a row or two per expert); padded to
capacity (--moe-pad-expert-input-to-capacity) every expert computes exactly that many.
Dropless routing leaves the load as the router makes it: `load_imbalance` is the busiest
EP rank's rows over the mean (1: balanced), which the collectives and the expert GEMMs wait
for. Three factors on k·T follow (MoEOptions): the busiest rank's rows (time, memory), the
mean rows the kernels execute (hardware FLOPs) and the rows whose work counts as useful
(model FLOPs: top-k routed, less what a capacity below 1 drops for sure).

Grouped GEMM efficiency: the E/ep local experts' GEMMs each run at the profile's matmul
efficiency for their own size (compute.py: every kernel pays the curve's start-up), so few
tokens per expert run at a low rate, from the same curve a dense GEMM of that size uses.
Grouped (`plan.moe.grouped_gemm`, --moe-grouped-gemm: TEGroupedMLP) they are one launch a
pass; without it (Megatron-Core's default) SequentialMLP (megatron/core/transformer/moe/
experts.py @d98e8a64dd) splits the rows by expert and runs each local expert's MLP in turn:
its fc1, activation and fc2 launch once per local expert (on a CPU each pays the host's cost
per operator, compute.py; on a GPU the host's launches, hostbound.py), and torch.cat joins
their outputs. Every dispatcher makes the host wait for the device once in a forward pass
(dispatch_host_calls): the host-bound floor (hostbound.py) counts that wait and the dispatch's
collective calls.

Overlap of the EP collectives with compute (off by default; Megatron-Core 0.9, which the
published MoE runs used, has neither): `shared_expert_overlap` (--moe-shared-expert-overlap)
runs the shared experts during the dispatch and combine; `ep_comm_overlap`
(--overlap-moe-expert-parallel-comm, "merging FWD-BWD passes of adjacent microbatches",
megatron/core/transformer/moe/README.md @d98e8a64dd) hides a forward pass's collectives
behind another micro-batch's backward pass of the same layer and vice versa. The latter is
applied to every pass; the warm-up and cool-down passes of a pipeline, which have no partner,
are not told apart (an optimistic bound).

Quantized experts (FP8, MXFP8, NVFP4 linears): each local expert's rows are padded to the
recipe's multiple of rows and unpadded after (quantization_padding).

Memory: each operator keeps what its backward pass reads (the router's input and fp32
scores, the gathered rows entering fc1, the activation's input, fc2's input, the routed copies
the un-permutation weights before 0.13), and one layer's send, receive and ETP-gathered
buffers are alive at once (moe_buffer_bytes). Full recomputation re-runs the layer, dispatch
included; Megatron's selective recompute modules (moe, moe_act, shared_experts, layernorm) are recompute.py's.

Parameters: the routed experts are split over ep (whole experts) and etp (each expert's
columns), replicated over the expert data-parallel group (devices / (pp·ep·etp)), which
reduces their gradients and over which ZeRO shards their states (dims.expert_grad_group_size);
everything else (attention, norms, router, shared experts) follows TP and the dp x cp group.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from . import deepep
from .comm import all_to_all_time, collective_time
from .errors import InputError
from .states import attention_params_local, layer_params_local, mlp_params_local

DISPATCHERS = ("alltoall", "allgather", *deepep.BACKENDS)
SHARED_EXPERTS = "shared_experts"  # Op.group of the shared experts' operators
EXPERT_GEMMS = ("expert_fc1", "expert_fc2")  # the routed experts' GEMM operators (moe_mlp_ops)


@dataclass(frozen=True)
class MoEOptions:
    """How the MoE layers run (Megatron-Core's --moe-* flags); dense models ignore them."""

    dispatcher: str = "alltoall"  # --moe-token-dispatcher-type alltoall | allgather | flex (deepep, hybridep)
    capacity_factor: float | None = None  # --moe-expert-capacity-factor; None: dropless
    pad_to_capacity: bool = False  # --moe-pad-expert-input-to-capacity
    load_imbalance: float = 1.0  # routed rows of the busiest EP rank / the mean (dropless routing)
    shared_expert_overlap: bool = False  # --moe-shared-expert-overlap
    ep_comm_overlap: bool = False  # --overlap-moe-expert-parallel-comm
    # --moe-grouped-gemm: one grouped GEMM launch for all local experts (TEGroupedMLP); off
    # (Megatron-Core's default): SequentialMLP, one launch per local expert (moe_mlp_ops)
    grouped_gemm: bool = True
    # Megatron-Core >= 0.10 folds EP x ETP into tp x cp x dp; before it, EP was carved out of
    # DP with ETP = TP (dims.expert_order)
    folding: bool = True
    # --moe-router-padding-for-quantization: the router pads each expert's rows from every
    # rank to the quantization multiple before the dispatch (quantization_padding)
    router_padding: bool = False
    # --moe-flex-dispatcher-num-sms: SMs the deepep / hybridep kernels take (None: the
    # backend's default, deepep.dispatcher_sms)
    dispatcher_sms: int | None = None
    # whose MoE layer runs: Megatron-Core's (this module) or torchtitan's (titanmoe.py)
    framework: str = "megatron-core"
    # torchtitan's MoEArgs.score_before_experts (Llama 4): the rows scaled by their scores
    # before the experts, not weighted after them (titanmoe.py)
    probs_on_input: bool = False
    # torchtitan's op-level AC saves the all-to-all outputs (its DeepSeek-V3 and Llama 4 save
    # lists name all_to_all_single, Qwen3's does not: titanmoe.py)
    op_sac_saves_all_to_all: bool = True
    # Megatron-Core 0.13 on: the probabilities scale the experts' activation, not their outputs
    # in the un-permutation (module docstring)
    probs_in_experts: bool = True

    @property
    def busiest_rows(self) -> float:
        """Rows the busiest rank sends, receives and computes, over the balanced k·T."""
        c = self.capacity_factor
        if c is None:
            return self.load_imbalance
        return c if self.pad_to_capacity else min(self.load_imbalance, c)

    @property
    def executed_rows(self) -> float:
        """Rows the experts compute on average over the balanced k·T: c when padded; else at
        most min(1, c), the drops of an imbalanced router being unknown (counted as none)."""
        c = self.capacity_factor
        if c is None:
            return 1.0
        return c if self.pad_to_capacity else min(1.0, c)

    @property
    def useful_rows(self) -> float:
        """Routed rows counted as model FLOPs: top-k per token, less what c < 1 drops."""
        return 1.0 if self.capacity_factor is None else min(1.0, self.capacity_factor)

    def balanced(self) -> "MoEOptions":
        """The same options with balanced routing: the busiest rank is the mean one."""
        return replace(self, load_imbalance=1.0)


@dataclass(frozen=True)
class ExpertShard:
    """How one device holds and runs the routed experts of an MoE layer (sizes may be arrays).
    `align`: the multiple of rows each local expert's input is padded to for its quantized
    GEMMs (fp8.moe_row_align; 0: none); `compiled`: torch.compile fuses what torchtitan's layer
    compiles (titanmoe.py)."""

    ep: object = 1
    etp: object = 1
    options: MoEOptions = MoEOptions()
    align: int = 0
    compiled: bool = True


def plan_experts(plan) -> ExpertShard:
    """The plan's ExpertShard: its ep, etp and MoE options, and the row multiple its quantized
    recipe pads each local expert to (fp8.moe_row_align)."""
    from .fp8 import moe_row_align
    return ExpertShard(plan.ep, plan.etp, plan.moe, moe_row_align(plan), plan.compile)


# ---------------------------------------------------------------- validation

def check_moe_plan(plan, model) -> None:
    """Raise InputError for ep/etp and MoE options a model and plan cannot run with."""
    from .fp8 import moe_row_align
    if plan.moe.router_padding and not moe_row_align(plan):
        raise InputError("plan.moe.router_padding", True, "pads to a quantized recipe's multiple: needs precision "
                         "fp8 (TransformerEngine's delayed or current scaling), mxfp8 or nvfp4 (Megatron-Core "
                         "refuses it without FP8 or FP4)")
    stage_devices = plan.tp * plan.cp * plan.dp
    if not model.experts:
        if plan.ep != 1:
            raise InputError("plan.ep", plan.ep, "expert parallelism needs a Mixture-of-Experts model (experts >= 1)")
    elif model.experts % plan.ep:
        raise InputError("plan.ep", plan.ep, f"must divide experts={model.experts}")
    if stage_devices % (plan.ep * plan.etp):
        raise InputError("plan.ep", plan.ep, f"ep*etp = {plan.ep}*{plan.etp} must divide tp*cp*dp = {stage_devices} "
                         "(Megatron-Core folds the expert layout into a pipeline stage's devices)")
    if not model.experts:
        return
    if model.expert_ffn_hidden % plan.etp:
        raise InputError("plan.etp", plan.etp, f"must divide expert_ffn_hidden={model.expert_ffn_hidden}")
    shared = model.shared_experts * model.shared_expert_ffn_hidden
    if shared % plan.tp:
        raise InputError("plan.tp", plan.tp, f"must divide the shared experts' width {shared} "
                         "(shared_experts x shared_expert_ffn_hidden)")
    if plan.tp > 1 and not plan.sequence_parallel:
        raise InputError("plan.sequence_parallel", False, "MoE layers with tp > 1 need sequence parallelism "
                         "(Megatron-Core moe_layer.py refuses MoE with TP but without it)")
    if not plan.moe.folding and (plan.etp != plan.tp or plan.dp % plan.ep):
        raise InputError("plan.moe.folding", False, f"without folding EP is carved out of DP (ep={plan.ep} must "
                         f"divide dp={plan.dp}) and etp equals tp={plan.tp} (Megatron-Core 0.9)")
    edp = stage_devices // (plan.ep * plan.etp)
    if plan.pp > 1 and not plan.rank_order.endswith("pp") and edp != plan.dp:
        raise InputError("plan.rank_order", plan.rank_order, "with experts and pp > 1, pp must be outermost "
                         "unless the expert data-parallel degree equals dp (Megatron-Core parallel_state.py)")
    o = plan.moe
    if o.dispatcher_sms is not None and o.dispatcher not in deepep.BACKENDS:
        raise InputError("plan.moe.dispatcher_sms", o.dispatcher_sms, "only with the deepep or hybridep dispatcher "
                         "(NCCL's all-to-all takes the SMs NCCL chooses)")
    if o.ep_comm_overlap and plan.ep == 1:
        raise InputError("plan.moe.ep_comm_overlap", True, "needs ep > 1 (Megatron-Core "
                         "--overlap-moe-expert-parallel-comm)")
    if o.shared_expert_overlap and not model.shared_experts:
        raise InputError("plan.moe.shared_expert_overlap", True, "the model has no shared experts")


def check_layer_mix_options(plan, model) -> None:
    """Refuse, for a model with experts, MLA or MTP (layermix.py), the framework options only the
    dense path models: torchao's FP8 recipes for experts and MLA (TransformerEngine's grouped
    GEMMs and Megatron-Core's MLA linears are what is modelled), eager kernels and op-level
    selective recomputation (but for torchtitan's MoE layer), block recomputation."""
    if not (model.experts or model.attention == "mla" or model.mtp_layers):
        return
    kind = "MoE" if model.experts else "MLA" if model.attention == "mla" else "multi-token-prediction"
    # torchtitan's MoE layer (titanmoe.py) models its eager kernels and op-level AC, and those of
    # its attention beside it (DeepSeek-V3's latent attention: mla.qk_concat_op); torchtitan
    # v0.2.2 trains no multi-token-prediction module
    titan = plan.moe.framework == "torchtitan" and model.experts
    if titan and model.mtp_layers:
        kind = "multi-token-prediction"
    titan = titan and not model.mtp_layers
    fp8 = plan.precision in ("fp8", "mxfp8")
    torchao = fp8 and plan.fp8_recipe in ("tensorwise", "rowwise")
    unsupported = (("plan.fp8_recipe", plan.fp8_recipe, torchao and (model.experts or model.attention == "mla")),
                   ("plan.fp8_fsdp_all_gather", plan.fp8_fsdp_all_gather, plan.fp8_fsdp_all_gather),
                   ("plan.compile", plan.compile, not plan.compile and not titan),
                   ("plan.recompute", plan.recompute, plan.recompute == "op-selective" and not titan),
                   ("plan.recompute_method", plan.recompute_method, plan.recompute_method != "uniform"),
                   ("plan.recompute_num_layers", plan.recompute_num_layers, plan.recompute_num_layers != 1),
                   ("plan.bf16_layers_at_start", plan.bf16_layers_at_start, plan.bf16_layers_at_start > 0),
                   ("plan.bf16_layers_at_end", plan.bf16_layers_at_end, plan.bf16_layers_at_end > 0))
    for field, value, refused in unsupported:
        if refused:
            raise InputError(field, value, f"not yet modelled for {kind} models (the dense layers' option)")


# ---------------------------------------------------------------- layers per stage

def stage_layer_mix(model, p, v, holds_first_layers):
    """(dense-MLP layers, MoE layers) on a device of a stage, `holds_first_layers` where the
    first virtual stage sits. Layer i is MoE when i >= dense_layers and i % freq == offset
    (model.is_moe_layer): a virtual stage of n layers (a multiple of freq) holds n/freq MoE
    layers, the first one fewer by the MoE positions the leading dense layers take, where they
    fit in it (stagesplit.uniform_layer_kinds; other splits count layer by layer). Broadcast-safe."""
    per_device = model.layers / np.asarray(p)
    if not model.experts:
        return per_device, 0.0 * per_device
    moe = per_device / model.moe_layer_freq - np.asarray(holds_first_layers) * model.leading_dense_moe_positions
    return per_device - moe, moe


# ---------------------------------------------------------------- routed rows

def routed_rows(model, tokens, experts: ExpertShard):
    """(token, expert) rows the router chose on the busiest rank for `tokens` tokens."""
    return experts.options.busiest_rows * model.top_k * tokens


def dispatched_rows(model, tokens, experts: ExpertShard):
    """(token, expert) rows of the busiest rank for `tokens` tokens, which the all-to-all
    dispatcher sends (and receives): with router padding (quantization_padding) each expert's
    rows from this rank padded too; DeepEP and Hybrid-EP pad on the receiving rank instead."""
    o = experts.options
    sends_padding = o.router_padding and experts.align and o.dispatcher not in deepep.BACKENDS
    padding = model.experts * (experts.align - 1) / 2 if sends_padding else 0.0
    return routed_rows(model, tokens, experts) + padding


def local_experts(model, ep):
    return model.experts / np.asarray(ep)


# ---------------------------------------------------------------- operators

def moe_mlp_ops(model, shard, experts: ExpertShard) -> list:
    """The MLP operators of an MoE layer for one micro-batch on one device (between the
    pre-MLP norm and the residual): router, permutation, the local experts' GEMMs and
    activation, un-permutation, shared experts. Executed FLOPs are the busiest rank's rows;
    useful FLOPs the balanced top-k rows (MoEOptions.useful_rows)."""
    from .workload import MEMORY, Op, _elementwise, _linear, input_kept_elsewhere, mlp_ops

    a, h = shard.act_bytes, model.hidden
    o = experts.options
    tokens = shard.replicated_tokens  # sequence-parallel shard of the tokens (MoE needs SP with TP)
    e = model.experts
    sent = dispatched_rows(model, tokens, experts)
    rows = experts.etp * sent  # rows computed here after the ETP all-gather
    routed = experts.etp * routed_rows(model, tokens, experts)  # of which the router chose (not its padding)
    n_local = local_experts(model, experts.ep)
    f = model.expert_ffn_hidden / experts.etp
    useful = o.useful_rows / o.busiest_rows
    gated = model.activation != "gelu"

    # SequentialMLP launches each local expert's kernels apart; a grouped GEMM launches once
    per_expert = 1 if o.grouped_gemm else n_local
    pad, run = quantization_padding(rows, n_local, h, a, experts)  # quantized GEMMs run padded rows

    def grouped(name, d_in, d_out, saved, widths=None):
        op = _linear(name, run, d_in, d_out, a, saved, widths, matrices=n_local)
        return replace(op, model_flops=op.flops * useful * routed / run, launches=per_expert)

    # the all-to-all's rows arrive by source rank and are re-sorted by local expert when a rank
    # holds several; DeepEP's and Hybrid-EP's received tokens are permuted by local expert once
    deepep_rows = o.dispatcher in deepep.BACKENDS
    sort = np.where(n_local > 1, 0.0 if deepep_rows else 1.0, 0.0)
    permuted = rows if deepep_rows else sent
    # SequentialMLP concatenates its experts' outputs (torch.cat: read and written once; its
    # backward only slices); with one local expert it returns that expert's output
    cat = [] if o.grouped_gemm else [Op("moe_expert_cat", MEMORY, fwd_bytes=sort * 2 * a * rows * h)]
    # From Megatron-Core 0.13 the probabilities scale the activation: in SwiGLU's fused kernel, or
    # by a multiply after any other activation, which keeps the activation's output
    weighted = o.probs_in_experts
    scale = [] if not weighted or model.activation == "swiglu" else \
        [replace(_elementwise("expert_probs_scale", run * f, 2 * a, a * run * f), launches=per_expert)]
    ops = [
        _linear("router", tokens, h, e, a, a * tokens * h),
        # fp32 scores: softmax and top-k; the scores are kept for the backward pass
        _elementwise("router_topk", tokens * e, 2 * 4, 4 * tokens * e),
        _elementwise("moe_permute", permuted * h, 2 * a, 0.0),
        _elementwise("moe_sort_chunks", sort * rows * h, 2 * a, 0.0),
        *pad,
        grouped("expert_fc1", h, (2 if gated else 1) * f, a * run * h, (f, f) if gated else None),
        replace(_elementwise("expert_" + model.activation, run * f, (3 if gated else 2) * a,
                             (2 if gated else 1) * a * run * f), launches=per_expert),
        *scale,
        grouped("expert_fc2", f, h, a * run * f),
        *cat,
        _elementwise("moe_unsort_chunks", sort * rows * h, 2 * a, 0.0),
        # sum over the top-k copies; before Megatron-Core 0.13 weighted by the probabilities,
        # keeping the copies for their gradient, whose backward reads them again
        Op("moe_unpermute", MEMORY, fwd_bytes=a * (sent + tokens) * h,
           bwd_input_bytes=(1 if weighted else 2) * a * (sent + tokens) * h,
           saved_bytes=0.0 if weighted else a * sent * h),
    ]
    if model.shared_experts:
        shared = mlp_ops(model, shard, model.shared_experts * model.shared_expert_ffn_hidden, "shared_")
        # the shared experts read the router's input, the pre-MLP norm output (Megatron-Core
        # moe_layer.py: both take hidden_states), kept once
        shared[0] = input_kept_elsewhere(shared[0], shard)
        ops += [Op(**{**op.__dict__, "group": SHARED_EXPERTS}) for op in shared]
    return ops


def quantization_padding(rows, n_local, h, act_bytes, experts: ExpertShard) -> tuple:
    """(operators, rows the experts run) of the padding quantized expert GEMMs need: each
    local expert's rows padded with zeros to a multiple of `experts.align` (TransformerEngine's
    get_align_size_for_quantization: 16 per-tensor FP8, 32 MXFP8, 128 NVFP4; TE@d0067d0da
    transformer_engine/pytorch/quantization.py), on average (align - 1) / 2 rows each, the
    remainders taken uniform. Megatron-Core pads and unpads around the experts
    (NVIDIA/Megatron-LM@d98e8a64dd megatron/core/transformer/moe/experts.py): TEGroupedMLP with
    TE's Fp8Padding and Fp8Unpadding, a fused copy of the rows each way in the forward pass and
    again in the backward pass; SequentialMLP with torch.cat of each expert's rows and zeros
    (the output is sliced, its gradient padded again). Without quantized linears, nothing.
    With router padding (MoEOptions.router_padding, --moe-router-padding-for-quantization;
    moe_utils.pad_routing_map, token_dispatcher.py) the router instead routes to each expert,
    on every rank, tokens it did not choose (weight 0) up to the multiple: the padding travels
    through the dispatch (dispatched_rows: E (align - 1) / 2 rows a rank) and nothing is copied
    around the experts (skip_routed_expert_padding); under DeepEP the receiving rank pads each
    local expert's rows with tokens it received (token_dispatcher.py _DeepepManager
    _pad_routing_map): the experts' padded rows, neither sent nor copied; Hybrid-EP's dispatch
    writes them padded with or without router padding (moe_utils.py skip_routed_expert_padding)."""
    if not experts.align:
        return [], rows
    run = rows + n_local * (experts.align - 1) / 2
    o = experts.options
    if o.dispatcher == "hybridep" or (o.router_padding and o.dispatcher == "deepep"):
        return [], run
    if o.router_padding:
        return [], rows
    copies = 2 if o.grouped_gemm else 1
    nbytes = copies * act_bytes * (rows + run) * h
    from .workload import MEMORY, Op
    return [Op("moe_quant_pad", MEMORY, fwd_bytes=nbytes, bwd_input_bytes=nbytes)], run


def padding_share(model, shard, experts: ExpertShard):
    """The share of the rows the experts' GEMMs run that are padding: quantization padding
    around the experts, router padding sent through the all-to-all, or a flex backend's."""
    tokens = shard.replicated_tokens
    rows = experts.etp * dispatched_rows(model, tokens, experts)
    _, run = quantization_padding(rows, local_experts(model, experts.ep), model.hidden, shard.act_bytes, experts)
    return 1.0 - experts.etp * routed_rows(model, tokens, experts) / run


def moe_buffer_bytes(model, shard, experts: ExpertShard, groups=None):
    """Dispatch buffers alive at once in one MoE layer: the permuted rows to send, the rows
    received, and with ETP the gathered rows (Megatron-Core allocates each per layer pass);
    under DeepEP and Hybrid-EP the rows permuted by expert beside what the backend holds
    (deepep.dispatch_bytes: `groups` places its nodes)."""
    sent = dispatched_rows(model, shard.replicated_tokens, experts)
    row = shard.act_bytes * model.hidden
    if experts.options.dispatcher in deepep.BACKENDS:
        return row * experts.etp * sent + deepep.dispatch_bytes(model, shard, experts, groups)
    if experts.options.framework == "torchtitan":  # sent, received, _permute's stacked copy
        from .titanmoe import reordered_tokens
        return row * dispatched_rows(model, reordered_tokens(shard, experts), experts) * 3
    return row * sent * (2 + experts.etp)


# ---------------------------------------------------------------- communication

def dispatch_comm_s(model, shard, experts: ExpertShard, groups, cluster):
    """Seconds of one MoE layer's dispatch and combine collectives per pass (forward or
    backward: the backward of an all-to-all is an all-to-all, of an all-gather a
    reduce-scatter). All-to-all dispatcher: two all-to-alls over EP of the k·T rows each
    rank sends (2·k·T·h·bytes·(ep-1)/ep leave it per pass, balanced), an all-gather and a
    reduce-scatter over ETP of the received rows; from Megatron-Core 0.13 (probs_in_experts) the
    rows' probabilities too, an all-to-all over EP and an all-gather (backward: a reduce-scatter)
    over ETP, one value a row. All-gather dispatcher: an all-gather and a
    reduce-scatter over EP x ETP of every token's hidden state. DeepEP, Hybrid-EP: deepep.comm_s."""
    a, h = shard.act_bytes, model.hidden
    tokens = shard.replicated_tokens
    o = experts.options
    if o.dispatcher in deepep.BACKENDS:
        return deepep.comm_s(model, shard, experts, groups, cluster)
    if o.dispatcher == "allgather":
        full = a * h * tokens * experts.ep * experts.etp
        return collective_time("all_gather", full, groups.ep_etp, cluster) + \
            collective_time("reduce_scatter", full, groups.ep_etp, cluster)
    if o.framework == "torchtitan":  # its all-to-alls only, of the rows this rank reorders (titanmoe.py)
        from .titanmoe import reordered_tokens
        rows = dispatched_rows(model, reordered_tokens(shard, experts), experts)
        return 2 * all_to_all_time(a * h * rows, groups.ep, cluster)
    rows = dispatched_rows(model, tokens, experts)
    sent = a * h * rows
    gathered = experts.etp * sent
    etp = collective_time("all_gather", gathered, groups.etp, cluster) + \
        collective_time("reduce_scatter", gathered, groups.etp, cluster)
    comm = 2 * all_to_all_time(sent, groups.ep, cluster) + etp
    if o.probs_in_experts:  # the probabilities' all-to-all and ETP all-gather (reduce-scatter backward)
        comm = comm + all_to_all_time(a * rows, groups.ep, cluster) + \
            collective_time("all_gather", experts.etp * a * rows, groups.etp, cluster)
    return comm


def exposed_dispatch_s(comm_s, moe_layer, shared, options: MoEOptions, sm_share=0.0):
    """(forward, backward) seconds of one MoE layer's dispatch collectives left exposed.

    `moe_layer` and `shared` are the OpsTime of the whole MoE layer and of its shared
    experts. Shared-expert overlap hides the collectives behind the shared experts' kernels
    of the same pass; EP overlap behind the other direction's pass of another micro-batch.
    Kernels that take a share f of the SMs (`sm_share`: DeepEP's and Hybrid-EP's,
    deepep.dispatcher_sms; NCCL's all-to-all is not counted) slow the compute they run beside:
    c seconds of communication beside g of compute take max(c, g + c·f), so max(c - g, c·f)
    stays exposed."""
    def hidden(c, g):
        return np.maximum(c - g, c * sm_share)

    fwd = bwd = comm_s
    if options.shared_expert_overlap:
        fwd = hidden(fwd, shared.fwd_s)
        bwd = hidden(bwd, shared.bwd_input_s + shared.bwd_weight_s)
    if options.ep_comm_overlap:
        fwd, bwd = (hidden(fwd, moe_layer.bwd_input_s + moe_layer.bwd_weight_s), hidden(bwd, moe_layer.fwd_s))
    return fwd, bwd


def dispatch_host_calls(experts: ExpertShard) -> tuple:
    """(forward calls, backward calls, host waits in the forward pass) of one MoE layer's
    dispatch and combine on a device, what its host-bound floor counts (hostbound.py).

    A call is one collective or fused communication kernel the host launches; a wait is a
    device-to-host copy the host blocks on, after which the device idles until the host has
    launched its next kernel. All-to-all dispatcher (NVIDIA/Megatron-LM core_v0.9.0 @1afee592
    megatron/core/transformer/moe/token_dispatcher.py MoEAlltoAllTokenDispatcher): forward, the
    per-expert counts all-gathered over expert TP x EP (_gather_along_first_dim_moe; its TP
    was the expert TP then), the all-to-alls out and back over EP (tensor_parallel.all_to_all
    returns its input in a group of one), the all-gather and reduce-scatter over expert TP;
    backward, the last four; from Megatron-Core 0.13 (probs_in_experts) the probabilities' all-to-all
    and expert-TP all-gather beside the tokens' (@d98e8a64dd token_dispatch, dispatch_postprocess),
    their backward's all-to-all and reduce-scatter. It waits once (cuda_sync_point
    before_permutation_1, before_ep_alltoall or before_finish: the split sizes as host lists),
    except when it pads every expert to capacity
    (drop_and_pad: no_sync). All-gather dispatcher (MoEAllGatherTokenDispatcher, same file):
    the routing indices, their probabilities and the tokens all-gathered over EP x ETP and the
    output reduce-scattered; backward, a reduce-scatter for each of the two with gradients and
    the output's all-gather; it waits on tokens_per_expert.cpu(). DeepEP and Hybrid-EP (deepep.py):
    a fused dispatch and a fused combine each way; the host waits for the received counts (DeepEP's
    normal kernels: deepseek-ai/DeepEP@dd758ca docs/legacy.md, "an implicit CPU wait for GPU
    received count signal"; Hybrid-EP's tokens_per_expert.sum(), NVIDIA/Megatron-LM@d98e8a64dd
    token_dispatcher.py _HybridEPManager.dispatch). torchtitan (pytorch/torchtitan@73a0e6979
    torchtitan/distributed/expert_parallel.py ExpertParallel._token_dispatch): the counts'
    all-to-all, the rows' all-to-alls out and back (backward: those two); it waits on the
    output splits (.to("cpu", non_blocking=False), .tolist()) with EP, and its for-loop experts
    on their rows' counts (models/moe/moe.py _run_experts_for_loop: .tolist()), where its grouped
    GEMM takes them on the device (_run_experts_grouped_mm: torch.cumsum)."""
    o = experts.options
    # 0 or 1 as integers: numpy adds two boolean arrays as a logical or
    ep_on, etp_on = np.asarray(experts.ep > 1, dtype=int), np.asarray(experts.etp > 1, dtype=int)
    group_on = np.asarray(experts.ep * experts.etp > 1, dtype=int)
    if o.dispatcher in deepep.BACKENDS:
        return 2, 2, 1
    if o.dispatcher == "allgather":
        return 4 * group_on, 3 * group_on, 1
    if o.framework == "torchtitan":
        return 3 * ep_on, 2 * ep_on, ep_on + (not o.grouped_gemm)
    pair = (3 if o.probs_in_experts else 2) * (ep_on + etp_on)
    return group_on + pair, pair, 0 if o.capacity_factor is not None and o.pad_to_capacity else 1


# ---------------------------------------------------------------- parameters

def layer_params_split(model, tp, ep, etp):
    """Per device: (a dense-MLP layer, an MoE layer's non-expert part, its routed experts).
    The router and the norms (model.layer_norm_params, query and key norms with them) are
    replicated over TP (Megatron marks them sequence-parallel); the shared experts are TP-split
    like a dense MLP."""
    dense = layer_params_local(model, tp)
    if not model.experts:
        return dense, 0.0, 0.0
    shared = model.shared_experts * mlp_params_local(model, model.shared_expert_ffn_hidden, tp)
    moe_rest = attention_params_local(model, tp) + model.layer_norm_params() + model.router_params() + shared
    routed = local_experts(model, ep) * mlp_params_local(model, model.expert_ffn_hidden, etp)
    return dense, moe_rest, routed
