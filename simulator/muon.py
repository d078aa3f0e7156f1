"""Muon: orthogonalised momentum for the layers' weight matrices, Adam for the rest, as
Megatron-Core runs it (`plan.optimizer: muon`; Jordan et al. 2024, "Muon: an optimizer for
hidden layers in neural networks"; Liu et al. 2025, arXiv 2502.16982, Moonlight and Kimi K2's
optimizer).

Which parameters: every 2-D weight of a layer (attention projections, MLP matrices, the
router, each routed expert's; a multi-token-prediction depth's layer and projection; a
learned position table); the word embedding, the output layer, norms and biases stay with Adam
(NVIDIA/Megatron-LM@d98e8a64dd megatron/core/optimizer/emerging_optimizers.py
_is_muon_excluded: not 2-D, or is_embedding_or_output_parameter, go to `adam`). Each keeps an
fp32 momentum where Adam keeps two moments: 4 B a parameter less (the fp32 master copy stays:
Float16OptimizerWithFloat16Params).

The update (TensorParallelMuon): the QKV weight is split into its query, key and value
matrices (`--muon-split-qkv`, default on), and each matrix is orthogonalised by `ns_steps`
Newton-Schulz steps (NVIDIA-NeMo/Emerging-Optimizers@fd77292
emerging_optimizers/orthogonalized_optimizers/muon_utils.py newton_schulz_tp, newton_schulz,
newton_schulz_step): on X (m x n, transposed so that m <= n), A = X X^T, B = b A + c A A,
X = a X + B X: 2m²n + 2m³ + 2m²n FLOPs in three GEMMs, in bf16 under
`--muon-fp32-matmul-prec medium` (the default: the momentum cast to bf16 and back). A matrix
the TP ranks split (`plan.muon_tp_mode`, Megatron's --muon-tp-mode): `duplicated` (the
default) all-gathers its fp32 momentum and orthogonalises it whole on every rank;
`blockwise` orthogonalises each rank's shard alone (emerging_optimizers.py
scaled_orthogonalize_fn_with_gtp_remat, partition_dim None); `distributed` keeps the shards,
each rank running the steps on its columns of X with the side it does not split as m (the
split side is n, whichever is smaller) and all-reducing each step's m x m Gram matrix.

Data parallelism: with `--use-distributed-optimizer` (zero_stage 1) Megatron's
LayerWiseDistributedOptimizer gives each DP rank whole matrices to update, bin-packed by their
Newton-Schulz cost, and all-gathers the updated parameters (layer_wise_optimizer.py: the same
reduce-scatter and all-gather as the distributed optimizer's); without it (zero_stage 0) every
rank updates, and orthogonalises, every matrix it holds. A rank's share is the mean of its
group's matrices, or the largest one where that is more (a matrix is never split); the
bucket-level imbalance of the bin-packing beyond that is not modelled. The Newton-Schulz
workspace (_matrix_workspace: the largest matrix's fp32 gather, copies and bf16 iterates) is
allocated during the optimizer step, after the activations are freed: it raises a stage's
peak where it is larger than them (layout.stage_memory).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import lru_cache

import numpy as np

from . import mtp
from .comm import collective_time
from .compute import memory_bound_time, op_times
from .states import FULL_PRECISION, activation_bytes
from .workload import MATMUL, Op

MOMENTUM_BYTES = 4.0  # one fp32 momentum where Adam keeps two fp32 moments: 4 B a parameter less
NS_PRECISION = "bf16"  # --muon-fp32-matmul-prec medium: the Newton-Schulz GEMMs in bf16
GATHER_BYTES = 4.0  # the fp32 momentum all-gathered over TP
# Elementwise kernels around the Newton-Schulz GEMMs, bytes per element of the X a rank
# iterates on (muon_utils.py newton_schulz): F.normalize's norm (read 4) and division (4 + 4),
# the casts to bf16 (4 + 2) and back (2 + 4); TensorParallelMuon's `orth_grad * scale_factor *
# extra_scale_factor`, two multiplies (4 + 4 each): 40 B in 6 kernels.
WRAPPER_BYTES, WRAPPER_KERNELS = 40.0, 6
# The update of each local parameter (orthogonalized_optimizer.py step): the momentum's lerp_
# towards the gradient (4 + 4 + 4), decoupled weight decay p.mul_ (4 + 4), p.add_ of the
# update (4 + 4 + 4), one kernel each: 32 B in 3 kernels, fp32; then the main parameter copied
# into the 16-bit one (4 + its bytes) under mixed precision.
UPDATE_BYTES, UPDATE_KERNELS = 32.0, 3
# split_qkv: each piece reshaped out of the grouped QKV gradient (a copy, 4 + 4) and the three
# concatenated back (4 + 4, one kernel): emerging_optimizers.py TensorParallelMuon.orthogonalize
QKV_BYTES, QKV_KERNELS = 16.0, 1 + 1 / 3


@dataclass(frozen=True)
class Matrices:
    """One kind of weight matrix Muon orthogonalises: its whole (TP-gathered) size, how many a
    device of the stage holds (before the DP ranks split the updates), the ranks that split it
    (1: held whole), whether it is a routed expert's (expert-DP group) and whether those ranks
    split its columns (a row-parallel linear's input features) rather than its rows."""

    rows: object
    cols: object
    count: object
    gather: object = 1
    expert: bool = False
    split_cols: bool = False
    qkv: bool = False  # a piece of the fused QKV weight (split_qkv: copied out and back)

    @property
    def local_params(self):
        return self.count * self.rows * self.cols / self.gather


def attention_matrices(model, tp) -> list[Matrices]:
    """A layer's attention weights as Muon sees them: Q, K and V apart (split_qkv) and the
    output projection, all TP-split; MLA's down-projections whole on every TP rank (mla.py),
    its up- and output projections split."""
    h = model.hidden
    if model.attention == "mla":
        heads = model.heads
        q = [Matrices(model.q_lora_rank, h, 1), Matrices(heads * model.head_dim, model.q_lora_rank, 1, tp)] \
            if model.q_lora_rank else [Matrices(heads * model.head_dim, h, 1, tp)]
        return q + [Matrices(model.kv_lora_rank + model.qk_rope_head_dim, h, 1),
                    Matrices(heads * (model.qk_nope_head_dim + model.v_head_dim), model.kv_lora_rank, 1, tp),
                    Matrices(h, heads * model.v_head_dim, 1, tp, split_cols=True)]
    kv_local = np.maximum(model.kv_heads / np.asarray(tp), 1.0)  # KV heads replicated beyond kv_heads
    k_rows, v_rows = kv_local * model.head_dim * tp, kv_local * model.v_width / model.kv_heads * tp
    return [Matrices(model.q_width, h, 1, tp, qkv=True), Matrices(k_rows, h, 1, tp, qkv=True),
            Matrices(v_rows, h, 1, tp, qkv=True), Matrices(h, model.attn_out_width, 1, tp, split_cols=True)]


def mlp_matrices(model, width, count, gather, expert=False) -> list[Matrices]:
    """`count` MLPs of intermediate size `width`: the up projection (gate and up fused, 2 x width
    rows, for a gated MLP) and the down projection."""
    up = (model.mlp_matrices - 1) * width
    return [Matrices(up, model.hidden, count, gather, expert),
            Matrices(model.hidden, width, count, gather, expert, split_cols=True)]


def layer_matrices(model, tp, ep=1, etp=1) -> tuple[list, list]:
    """(a dense-MLP layer's, an MoE layer's) matrices on one device: attention and a dense MLP;
    attention, the router (whole on every rank), the shared experts (one MLP of their summed
    width, TP-split) and the local routed experts (over ETP)."""
    attention = attention_matrices(model, tp)
    dense = attention + mlp_matrices(model, model.ffn_hidden, 1, tp)
    if not model.experts:
        return dense, []
    moe = attention + [Matrices(model.experts, model.hidden, 1)]
    if model.shared_experts:
        moe += mlp_matrices(model, model.shared_experts * model.shared_expert_ffn_hidden, 1, tp)
    moe += mlp_matrices(model, model.expert_ffn_hidden, model.experts / np.asarray(ep), etp, expert=True)
    return dense, moe


def stage_matrices(model, tp, dense_layers, moe_layers, ep=1, etp=1, mtp_depths=0, has_embedding=False) -> list:
    """The matrices of a stage's device: its dense-MLP and MoE layers' and, on the head stage,
    each multi-token-prediction depth's layer (the last layer's kind) and eh_proj (h x 2h,
    column-parallel: mtp.py). The word embedding and the output layer are Adam's (Megatron
    tags them is_embedding_or_output_parameter: language_module.py); a learned position
    table (seq x h, whole on every TP rank) is not tagged, so Muon's, on the first stage."""
    dense, moe = layer_matrices(model, tp, ep, etp)
    tables = np.asarray(has_embedding) * (model.position_embedding == "learned")
    dense_layers, moe_layers = mtp.with_depths(model, dense_layers, moe_layers, mtp_depths)
    return [replace(m, count=m.count * dense_layers) for m in dense] + \
        [replace(m, count=m.count * moe_layers) for m in moe] + \
        ([Matrices(model.hidden, 2 * model.hidden, mtp_depths, tp)] if model.mtp_layers else []) + \
        ([Matrices(model.seq_len, model.hidden, tables)] if model.position_embedding == "learned" else [])


@lru_cache(maxsize=64)
def model_matrix_params(model) -> float:
    """Parameters of the whole model that Muon updates (a checkpoint's momentum)."""
    moe = model.moe_layers
    matrices = stage_matrices(model, 1, model.layers - moe, moe, mtp_depths=model.mtp_layers, has_embedding=True)
    return float(sum(np.sum(m.local_params) for m in matrices))


def ns_flops(rows, cols, steps):
    """FLOPs of `steps` Newton-Schulz steps on a rows x cols matrix (m the smaller side, n the
    larger): A = X X^T (2m²n), B = bA + cA·A (2m³), X = aX + B·X (2m²n)."""
    m, n = np.minimum(rows, cols), np.maximum(rows, cols)
    return steps * (4 * m * m * n + 2 * m ** 3)


def ns_seconds(m, n, steps, acc):
    """Seconds of `steps` Newton-Schulz steps on X (m x n, whitened along m: A is m x m), each
    step three GEMMs (and torch ops) of bf16 operands. X X^T multiplies a row-major matrix by
    a transposed one, as a linear's forward GEMM does (x W^T); A·A and B·X multiply two
    row-major ones, as its input-gradient GEMM does (dY W): each is timed on that pass's curve
    where the profile has one per pass (calibrated CPUs). Bytes: gram X read, A written;
    square A read twice and as addmm's input, B written; update B and X read, X read as
    addmm's input and written."""
    b = 2.0  # bf16
    gram = Op("muon.gram", MATMUL, fwd_flops=2 * m * m * n, fwd_bytes=b * (m * n + m * m))
    square = Op("muon.square", MATMUL, bwd_input_flops=2 * m ** 3, bwd_input_bytes=b * 4 * m * m)
    update = Op("muon.update", MATMUL, bwd_input_flops=2 * m * m * n, bwd_input_bytes=b * (m * m + 3 * m * n))
    one_step = op_times(gram, acc, NS_PRECISION).fwd_s + sum(op_times(op, acc, NS_PRECISION).bwd_input_s
                                                             for op in (square, update))
    return steps * one_step


def rank_sides(m: Matrices, tp_mode: str) -> tuple:
    """(whitened side, other side) of the X one rank iterates on for matrix kind `m`: the whole
    matrix's smaller and larger sides (`duplicated`, and every matrix no rank splits); its own
    shard's (`blockwise`: each shard orthogonalised alone); or, `distributed`, the side the
    ranks do not split and their share of the other, the Gram matrix summed over the ranks
    each step (Emerging-Optimizers newton_schulz_tp: transposed so that the split side is n,
    whichever is smaller)."""
    r, c, g = np.asarray(m.rows, dtype=float), np.asarray(m.cols, dtype=float), np.asarray(m.gather)
    if tp_mode == "blockwise":
        r, c = (r, c / g) if m.split_cols else (r / g, c)
    elif tp_mode == "distributed":
        whole, split = (r, c) if m.split_cols else (c, r)
        return np.where(g > 1, whole, np.minimum(r, c)), np.where(g > 1, split / g, np.maximum(r, c))
    return np.minimum(r, c), np.maximum(r, c)


def _tp_comm_s(m: Matrices, whitened, steps, tp_mode, group, cluster):
    """One matrix's TP collectives: its fp32 momentum all-gathered (`duplicated`), or every
    step's bf16 Gram matrix and the norm's sum all-reduced (`distributed`); none `blockwise`
    or where no rank splits it."""
    if tp_mode == "duplicated":
        moved = collective_time("all_gather", m.rows * m.cols * GATHER_BYTES, group, cluster)
    elif tp_mode == "distributed":
        moved = steps * collective_time("all_reduce", 2.0 * whitened * whitened, group, cluster) + \
            collective_time("all_reduce", GATHER_BYTES, group, cluster)
    else:
        return 0.0
    return np.where(np.asarray(m.gather) > 1, moved, 0.0)


@dataclass(frozen=True)
class MuonCosts:
    """One device's Muon work per step: the parameters whose momentum it keeps (ZeRO-1: its
    share), the seconds of the kernels of the matrices it updates (Newton-Schulz GEMMs and the
    elementwise ones around them) and of their TP collectives (_tp_comm_s), and the most one
    of them allocates while it is orthogonalised (_matrix_workspace)."""

    kept_params: object
    ns_s: object
    tp_comm_s: object
    workspace_bytes: object


def stage_costs(matrices: list[Matrices], plan, groups, cluster, zero_group, expert_zero_group) -> MuonCosts:
    """Muon's costs on a stage's device (module docstring): each DP rank of a group updates its
    share of the group's matrices under zero_stage 1, all of them under zero_stage 0."""
    acc, steps, mode = cluster.accelerator, plan.muon_ns_steps, plan.muon_tp_mode
    shared = plan.zero_stage >= 1
    mixed = plan.precision not in FULL_PRECISION  # a 16-bit copy of the fp32 main parameters
    total, largest, comm, workspace = 0.0, 0.0, 0.0, 0.0
    dense_params, expert_params = 0.0, 0.0
    for m in matrices:
        share = (expert_zero_group if m.expert else zero_group) if shared else 1
        owned = m.count / share
        whitened, other = rank_sides(m, mode)
        one = ns_seconds(whitened, other, steps, acc) + _elementwise_s(*_matrix_elementwise(
            m, whitened * other, mode, mixed, activation_bytes(plan.precision)), acc)
        total = total + owned * one
        largest = np.maximum(largest, np.where(m.count > 0, one, 0.0))
        comm = comm + owned * _tp_comm_s(m, whitened, steps, mode, groups.etp if m.expert else groups.tp, cluster)
        workspace = np.maximum(workspace, np.where(np.asarray(m.count) > 0,
                                                   _matrix_workspace(m, whitened, other, mode), 0.0))
        if m.expert:
            expert_params = expert_params + m.local_params
        else:
            dense_params = dense_params + m.local_params
    kept = dense_params / zero_group + expert_params / expert_zero_group if shared else dense_params + expert_params
    return MuonCosts(kept, np.maximum(total, largest), comm, workspace)


def _matrix_workspace(m: Matrices, whitened, other, tp_mode):
    """What orthogonalising one matrix of kind `m` allocates on the rank updating it, from
    Emerging-Optimizers' code: F.normalize's fp32 copy of X beside its bf16 cast (6 B an
    element), or during a step X, the next X and the m x m A and B in bf16 (4 B an element +
    4m²); a QKV piece's copy (4 B) alive throughout; under `duplicated` a split matrix's
    gathered shards and their concatenation, both fp32 and whole (newton_schulz_tp: 8 B an
    element of the whole matrix)."""
    x = whitened * other
    inner = np.maximum(6.0 * x, 4.0 * x + 4.0 * whitened * whitened) + (4.0 * x if m.qkv else 0.0)
    if tp_mode == "duplicated":
        inner = inner + np.where(np.asarray(m.gather) > 1, 2 * GATHER_BYTES * m.rows * m.cols, 0.0)
    return inner


def _matrix_elementwise(m: Matrices, rank_elements, tp_mode, mixed, weight_bytes) -> tuple:
    """(bytes, kernels) of one matrix's memory-bound kernels on the rank updating it: the
    update of its local elements, the Newton-Schulz wrapper's over the X the rank iterates
    on, the QKV pieces' copies, and under `duplicated` the concatenation of the gathered
    shards (newton_schulz_tp's torch.cat, 4 + 4)."""
    local = m.rows * m.cols / m.gather
    nbytes = local * (UPDATE_BYTES + (4.0 + weight_bytes if mixed else 0.0)) + rank_elements * WRAPPER_BYTES
    kernels = UPDATE_KERNELS + (1 if mixed else 0) + WRAPPER_KERNELS
    if m.qkv:
        nbytes, kernels = nbytes + local * QKV_BYTES, kernels + QKV_KERNELS
    if tp_mode == "duplicated":
        split = np.asarray(m.gather) > 1
        nbytes = nbytes + np.where(split, 2 * GATHER_BYTES * m.rows * m.cols, 0.0)
        kernels = kernels + np.where(split, 1, 0)
    return nbytes, kernels


def _elementwise_s(nbytes, kernels, acc):
    """Seconds of `kernels` memory-bound kernels moving `nbytes`, each paying the profile's
    per-operator host cost (op_overhead_us; 0 on GPUs)."""
    return memory_bound_time(nbytes, acc, "optimizer") + kernels * acc.op_overhead_s


def with_muon(states, model, plan, groups, cluster, dense_layers, moe_layers, has_embedding, has_head, zero_group,
              expert_zero_group):
    """A stage's model states with Muon in place of Adam on its layers' matrices (one fp32
    momentum where Adam keeps two moments: 4 B a parameter less), the parameters whose update
    Muon runs (which Adam's pass, states.optimizer_step_s, leaves out), Muon's seconds (its
    update and Newton-Schulz kernels and its TP collectives) and the bytes its Newton-Schulz
    allocates: stage_costs."""
    matrices = stage_matrices(model, plan.tp, dense_layers, moe_layers, plan.ep, plan.etp,
                              np.asarray(has_head) * model.mtp_layers, has_embedding)
    costs = stage_costs(matrices, plan, groups, cluster, zero_group, expert_zero_group)
    return replace(states, optimizer_bytes=states.optimizer_bytes - costs.kept_params * MOMENTUM_BYTES), \
        costs.kept_params, costs.ns_s + costs.tp_comm_s, costs.workspace_bytes

