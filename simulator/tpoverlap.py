"""Tensor-parallel communication overlapped with the GEMMs, as the two implementations do it:
what each hides, what stays exposed, and what the overlap costs the GEMMs.

With `plan.tp_comm_overlap` each TP collective of a layer (passes.tp_layer_comm_s: with
sequence parallelism an all-gather in front of the QKV and FC1 GEMMs and a reduce-scatter
after the projection and FC2, their mirror images in backward, and the re-gather of the
inputs for the weight gradients) runs beside the GEMM it feeds or follows, split into
chunks so that one chunk's transfer runs under the neighbouring chunk's GEMM:

- `userbuffers` (TransformerEngine's comm-GEMM overlap: NeMo ub_tp_comm_overlap,
  Megatron --tp-comm-overlap; TE@fb749619e transformer_engine/pytorch/module/base.py
  initialize_ub, `methods` and get_default_config): ring_exchange for qkv_fprop,
  fc1_fprop, proj_dgrad and fc2_dgrad (the all-gather in tp chunks passed round a ring, the
  local chunk's GEMM first), pipeline for proj_fprop and fc2_fprop (the GEMM in 4 chunks,
  each chunk's reduce-scatter under the next chunk's GEMM, the last one exposed, on 16 SMs
  taken from the GEMM), bulk for the dgrad/wgrad pairs (the input re-gather under the dgrad
  GEMM, the input gradient's reduce-scatter under the wgrad GEMM, whole).
- `async-tp` (PyTorch symmetric-memory async TP, torchtitan enable_async_tensor_parallel:
  pytorch/pytorch@5f65158aef torch/_inductor/fx_passes/micro_pipeline_tp.py and
  @0e9ed9cf06 torch/distributed/_symmetric_memory/__init__.py
  _pipelined_multi_all_gather_and_consume, _pipelined_produce_and_all2all): the
  all-gather -> matmul and matmul -> reduce-scatter pairs of the compiled forward graph
  become fused ops of tp chunks moved by copy engines (no SMs taken). Only the forward
  collectives (and their re-run in recomputation) are taken as hidden, the backward pass's
  stay exposed: its authors measured up to 20-29 % faster forward passes but 8 % end to end
  on Llama 3 7B/70B ("[Distributed w/ TorchTitan] Introducing Async Tensor Parallelism in
  PyTorch", discuss.pytorch.org/t/209487, Aug 2024), and torchtitan's Jun 2025 benchmark
  measured 1.04-1.16x (torchtitan@2887250bb benchmarks/asyncTP_llama3_h100_2025-06_torchtitan.md),
  what hiding the forward collectives alone gives.

Exposed seconds of one collective of c seconds beside a GEMM of g seconds in n chunks:
an all-gather ahead of its GEMM, the local chunk first: max(0, c - g (n-1)/n); a
reduce-scatter behind its GEMM: max(c/n, c - g + g/n) (the last chunk's transfer has no
GEMM left; dataparallel.bucketed_overlap_s is the same form); bulk: max(0, c - g). Costs:
a GEMM split into n chunks pays the efficiency curve's start-up n times (compute.py: each
chunk takes (x/n + half)/(peak·max)); userbuffers' pipeline GEMMs run on the SMs its
communication kernels leave (16 of the profile's `sm_count`).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from .comm import collective_time
from .compute import op_times
from .fp8 import compute_precision, tp_gather_bytes_factor
from .recompute import scaled

METHODS = ("userbuffers", "async-tp")
RING, PIPELINE, BULK = "ring", "pipeline", "bulk"
PIPELINE_SPLITS = 4  # TE get_default_config num_splits for the pipeline method
PIPELINE_COMM_SMS = 16  # TE get_default_config num_sm for the pipeline method


def exposed_s(kind: str, comm_s, gemm_s, n):
    """Seconds of a collective left exposed beside its GEMM split into n chunks."""
    if kind == BULK:
        return np.maximum(0.0, comm_s - gemm_s)
    if kind == RING:
        return np.maximum(0.0, comm_s - gemm_s * (n - 1) / n)
    return np.maximum(comm_s / n, comm_s - gemm_s + gemm_s / n)


def _pairs(plan, sp: bool):
    """(pass, collective, GEMM operator, GEMM pass, method) of one layer under the implementation."""
    if not sp:  # all-reduces after the row-parallel GEMMs and of the column-parallel input gradients
        return [("fwd", "ar", "attn_out", "fwd_s", PIPELINE), ("fwd", "ar", "fc2", "fwd_s", PIPELINE),
                ("bwd", "ar", "fc1", "bwd_weight_s", BULK), ("bwd", "ar", "qkv", "bwd_weight_s", BULK)]
    if plan.tp_overlap == "async-tp":
        return [("fwd", "ag_fwd", "qkv", "fwd_s", RING), ("fwd", "rs", "attn_out", "fwd_s", RING),
                ("fwd", "ag_fwd", "fc1", "fwd_s", RING), ("fwd", "rs", "fc2", "fwd_s", RING)]
    return [("fwd", "ag_fwd", "qkv", "fwd_s", RING), ("fwd", "rs", "attn_out", "fwd_s", PIPELINE),
            ("fwd", "ag_fwd", "fc1", "fwd_s", RING), ("fwd", "rs", "fc2", "fwd_s", PIPELINE),
            ("bwd", "ag", "fc2", "bwd_input_s", RING), ("bwd", "ag", "attn_out", "bwd_input_s", RING),
            ("bwd", "rs", "fc1", "bwd_weight_s", BULK), ("bwd", "rs", "qkv", "bwd_weight_s", BULK),
            ("bwd", "ag", "fc1", "bwd_input_s", BULK), ("bwd", "ag", "qkv", "bwd_input_s", BULK)]


def overlapped_tp_s(model, shard, groups, cluster, plan, ops, t, tp_layer_s, mlp="mlp_") -> tuple:
    """((exposed forward, exposed backward) seconds per layer and micro-batch of the plan's
    overlapped TP collectives, the layer's OpsTime `t` with the split GEMMs' added compute);
    `tp_layer_s`: the layer's (forward, backward) TP seconds with nothing overlapped
    (passes.tp_layer_comm_s), what a pass without fused pairs keeps. The all-gathers move the
    plan's quantized bytes (fp8.tp_gather_bytes_factor). `mlp` names the layer's TP-split MLP by
    its operators' prefix ("shared_mlp_": an MoE layer's shared experts), or None where it has
    none (an MoE layer's routed experts move their tokens in the dispatch)."""
    acc = cluster.accelerator
    nbytes = shard.act_bytes * shard.tokens * model.hidden
    forward_factor, backward_factor = tp_gather_bytes_factor(plan)
    comm = {"ag": collective_time("all_gather", backward_factor * nbytes, groups.tp, cluster),
            "ag_fwd": collective_time("all_gather", forward_factor * nbytes, groups.tp, cluster),
            "rs": collective_time("reduce_scatter", nbytes, groups.tp, cluster),
            "ar": collective_time("all_reduce", nbytes, groups.tp, cluster)}
    byname = {op.name: op for op in ops}
    gemms = {"qkv": byname["qkv"], "attn_out": byname["attn_out"]}
    if mlp is not None:
        gemms.update(fc2=byname[mlp + "down"], fc1=byname.get(mlp + "gate_up", byname.get(mlp + "up")))
    # operators are timed at the plan's compute precision; FP8 linears carry their own kind
    precision = compute_precision(plan)
    times = {k: op_times(op, acc, precision) for k, op in gemms.items()}
    tp = np.asarray(shard.tp, dtype=float)
    pairs = [pair for pair in _pairs(plan, bool(shard.sp)) if pair[2] in gemms]
    overlapped = {p for p, *_ in pairs}
    exposed = {p: 0.0 if p in overlapped else s for p, s in zip(("fwd", "bwd"), tp_layer_s)}
    extra = {"fwd": 0.0, "bwd": 0.0}
    for pass_, coll, gemm, which, kind in pairs:
        g = getattr(times[gemm], which)
        n = tp if kind == RING else PIPELINE_SPLITS if kind == PIPELINE else 1.0
        exposed[pass_] = exposed[pass_] + exposed_s(kind, comm[coll], g, n)
        if kind == BULK:
            continue
        chunk = op_times(scaled(gemms[gemm], 1.0 / n), acc, precision)
        extra[pass_] = extra[pass_] + n * getattr(chunk, which) - g
        if kind == PIPELINE and acc.sm_count:
            extra[pass_] = extra[pass_] + g * PIPELINE_COMM_SMS / (acc.sm_count - PIPELINE_COMM_SMS)
    on = np.asarray(shard.tp) > 1
    fwd, bwd, extra_f, extra_b = (np.where(on, x, 0.0) for x in (exposed["fwd"], exposed["bwd"], extra["fwd"],
                                                                 extra["bwd"]))
    return (fwd, bwd), replace(t, fwd_s=t.fwd_s + extra_f, bwd_input_s=t.bwd_input_s + extra_b)
