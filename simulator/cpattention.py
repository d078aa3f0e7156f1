"""How context parallelism runs a layer's attention over a sequence split across `cp` ranks.

Every implementation computes, on each rank, its local queries against the keys and values
of all cp chunks, one chunk per step (load-balanced causal chunks: every step the same
work), passing K and V (and in the backward pass their gradients) between the ranks. They
differ in what moves, what hides behind what, and the kernels around the attention kernel.

- `ring` (TransformerEngine's AttnFuncWithCPAndKVP2P under Megatron-Core and NeMo; Liu et
  al. 2023, Ring Attention): cp-1 point-to-point exchanges of the local K and V forward, K,
  V and their gradients backward, each hidden under the attention kernel; exposed is what
  the layer's attention kernel does not cover.
- `kv-allgather` (TransformerEngine's AttnFuncWithCPAndKVAllGather, Megatron-LM's
  --cp-comm-type all_gather; the Llama 3 paper's Sec. 3.3.2): every rank all-gathers K and V
  (its own KV heads, no repeat) before the attention, "exposed" as TE's docstring says, and
  reorders them into sequence order; the backward gathers them again, accumulates dK and dV
  over the whole sequence in the activation dtype and reduce-scatters them (TE@d0067d0da
  transformer_engine/pytorch/attention/dot_product_attention/context_parallel.py).
- `ulysses` (TransformerEngine's AttnFuncWithCPAndQKVOA2A, Megatron-LM's --cp-comm-type a2a;
  Jacobs et al. 2023, DeepSpeed Ulysses): an all-to-all turns each of Q, K and V from a
  sequence chunk of every head into the whole sequence of heads/cp heads, the attention runs
  on that, and an all-to-all turns the output back; the backward does the same for dO and
  for dQ, dK, dV (flash_attn_a2a_communicate, same file). Nothing hides them: the attention
  waits for its inputs. Each tensor is copied twice around its all-to-all (a contiguous
  head-split before, a chunk reorder after). Heads per rank, query and key/value alike, must
  divide over the CP ranks (TE asserts num_heads % cp_size == 0).
- `ulysses-ring` (TE's hierarchical CP in AttnFuncWithCPAndKVP2P, Megatron-LM's --cp-comm-type
  a2a+p2p with --hierarchical-context-parallel-sizes; Fang and Zhao 2024, USP): Ulysses'
  all-to-alls inside groups of plan.cp_ulysses consecutive CP ranks, then the P2P ring over
  the cp/cp_ulysses groups (each rank's ring partner sits cp_ulysses ranks on), hidden under
  the attention as the plain ring is.
- `torch-allgather`, `torch-alltoall`: PyTorch's experimental context parallelism
  (torch.distributed.tensor.experimental context_parallel), as torchtitan runs it
  (torchtitan@9dec370, 2024-12-26: utils.py create_context_parallel_ctx,
  config_manager.py --experimental.context_parallel_rotate_method, default "allgather").
  The ring loop (pytorch/pytorch@0123248a48 torch/distributed/tensor/experimental/
  _attention.py, _templated_ring_attention and _templated_ring_attention_backward):
  - K and V move as the attention kernel receives them: torchtitan's Llama repeats the KV
    heads to the query heads before SDPA (torchtitan@9dec370 models/llama/model.py
    repeat_kv), so a GQA model moves q_heads/kv_heads times the ring's bytes.
  - forward, allgather: one all-gather of every rank's K and V, started with the first
    (local) step and waited for at the second, so it hides behind one step's kernel only;
    the gathered K and V stay allocated until the attention returns. alltoall: cp-1
    permutes, each hiding behind one step.
  - each step's partial output is merged into fp32 (out, log-sum-exp; _SDPAMerger with
    convert_to_f32), and cast back once.
  - backward: K and V move again as in the forward; each step's dQ, dK, dV are accumulated
    in fp32 and the dK, dV accumulators passed on after every step (an all-to-all permute of
    fp32 tensors, dkv_rotater), waited for one step later, the last one after the loop.
  - the merges and accumulations are elementwise kernels which Inductor fuses: torchtitan
    compiles each TransformerBlock with fullgraph=True (torchtitan@9dec370
    parallelisms/parallelize_llama.py apply_compile), so the ring loop is traced into the
    block's graph; per step one fused kernel reads the fp32 accumulator and the step's
    16-bit result and writes the accumulator (a partial step's concatenation rewrites the
    whole of it, counted as a full step).

Packed documents (model.document_tokens, TE's `thd` layout): TE's three methods run over every
document's own 2·cp load-balanced chunks (same file: the P2P ring reads each document's halves,
thd_read_half_tensor; the all-gather with FusedAttention or FlashAttention 3; the all-to-alls),
so K and V move as for the whole sequence while the attention under them is the documents'
(workload.window_pair_fraction). Each document must split into 2·cp chunks without padding
(plan.py); the thd layout's per-step half-tensor copies and its out/LSE corrections are not
counted. PyTorch's ring over packed documents is refused: its load balancer splits the
sequence, not the documents.

Sliding windows: TE runs them under CP by all_gather and a2a only (same file,
attn_forward_func_with_cp asserts it); plan.py refuses the rings. Ulysses gives each rank whole
sequences of heads/cp heads, so its windowed work is the model's band over cp. The all-gather's
load-balanced chunks hold unequal windowed work (the first chunk's queries see fewer keys): the
busiest rank's, which sets the layer's time, is allgather_window_imbalance times the mean.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from .comm import all_to_all_time, collective_time, send_recv_time
from .states import FP32_BYTES
from .workload import ATTENTION_CORE, MEMORY, Op, causal_pairs, documents, local_heads, window_pair_fraction

CP_ATTENTION = ("ring", "kv-allgather", "ulysses", "ulysses-ring", "torch-allgather", "torch-alltoall")
TE_EXPOSED = ("kv-allgather", "ulysses")  # TransformerEngine's collectives the attention waits for
ULYSSES = ("ulysses", "ulysses-ring")  # all-to-alls of Q, K, V and O
# the methods TE runs sliding windows with (attn_forward_func_with_cp asserts all_gather or a2a)
WINDOW_METHODS = ("kv-allgather", "ulysses")


def _torch(method: str) -> bool:
    return method.startswith("torch-")


def _elements(model, shard):
    """Elements of one rank's Q, K, V and output chunks, as the attention kernel gets them."""
    q_heads, _ = local_heads(model, shard.tp)
    rows = shard.tokens * q_heads
    return rows * model.head_dim, rows * model.head_dim, rows * model.v_head_dim, rows * model.v_head_dim


def exchanged_bytes(model, shard, method: str):
    """Bytes of one rank's K and V chunk as the exchange moves them."""
    q_heads, kv_heads = local_heads(model, shard.tp)
    heads = q_heads if _torch(method) else kv_heads
    return shard.act_bytes * shard.tokens * heads * (model.head_dim + model.v_head_dim)


def _te_exposed_s(model, shard, groups, cluster, method: str):
    """Forward and backward seconds of TE's all-gather or all-to-all CP collectives, all exposed."""
    c = np.asarray(shard.cp)
    on = c > 1
    if method == "kv-allgather":
        kv = exchanged_bytes(model, shard, method)
        gather = collective_time("all_gather", c * kv, groups.cp, cluster)
        scatter = collective_time("reduce_scatter", c * kv, groups.cp, cluster)
        return np.where(on, gather, 0.0), np.where(on, gather + scatter, 0.0)
    a2a = _all_to_alls_s(model, shard, groups.cp, cluster)
    return np.where(on, a2a, 0.0), np.where(on, a2a, 0.0)


def _all_to_alls_s(model, shard, group, cluster):
    """Seconds of Ulysses' four all-to-alls over `group` (Q, K, V, O; dO, dQ, dK, dV alike)."""
    return sum(all_to_all_time(shard.act_bytes * x, group, cluster) for x in _ulysses_elements(model, shard))


def _ulysses_elements(model, shard):
    """Elements of one rank's Q, K, V and output as Ulysses moves them (K and V with their own
    KV heads)."""
    q_heads, kv_heads = local_heads(model, shard.tp)
    t = shard.tokens
    return (t * q_heads * model.head_dim, t * kv_heads * model.head_dim, t * kv_heads * model.v_head_dim,
            t * q_heads * model.v_head_dim)


def exposed_s(model, shard, groups, cluster, method: str, attention_fwd_s, attention_bwd_s):
    """Seconds of a layer's CP exchange the attention does not hide, forward and backward,
    one micro-batch; `attention_*_s`: the layer's attention-core kernels."""
    if method in TE_EXPOSED:
        return _te_exposed_s(model, shard, groups, cluster, method)
    c = np.asarray(shard.cp)
    kv = exchanged_bytes(model, shard, method)
    if method == "ulysses-ring" and groups.cp_a2a is not None:
        # the ring over cp/cp_ulysses groups moves the K and V of cp_ulysses chunks of
        # kv_heads/cp_ulysses heads: the bytes of the plain ring's chunk
        a2a = np.where(c > 1, _all_to_alls_s(model, shard, groups.cp_a2a, cluster), 0.0)
        fwd, bwd = _ring_exposed_s(kv, groups.cp_ring, cluster, attention_fwd_s, attention_bwd_s)
        return a2a + fwd, a2a + bwd
    if not _torch(method):
        return _ring_exposed_s(kv, groups.cp, cluster, attention_fwd_s, attention_bwd_s)
    across = groups.cp.domains > 1
    hop = send_recv_time(kv, across, cluster)
    steps = c - 1
    step_f, step_b = attention_fwd_s / c, attention_bwd_s / c
    if method == "torch-allgather":
        gather = collective_time("all_gather", c * kv, groups.cp, cluster)
        kv_f, kv_b = np.maximum(0.0, gather - step_f), np.maximum(0.0, gather - step_b)
    else:
        kv_f, kv_b = steps * np.maximum(0.0, hop - step_f), steps * np.maximum(0.0, hop - step_b)
    grad_hop = send_recv_time(kv * FP32_BYTES / shard.act_bytes, across, cluster)
    grads = steps * np.maximum(0.0, grad_hop - step_b) + grad_hop
    on = c > 1
    return np.where(on, kv_f, 0.0), np.where(on, kv_b + grads, 0.0)


def _ring_exposed_s(kv, group, cluster, attention_fwd_s, attention_bwd_s):
    """TE's P2P ring over `group`: size-1 exchanges of `kv` bytes forward, twice that backward
    (K, V and their gradients), hidden under the attention kernels."""
    steps = np.asarray(group.size) - 1
    hop = send_recv_time(kv, group.domains > 1, cluster)
    return np.maximum(0.0, steps * hop - attention_fwd_s), np.maximum(0.0, 2 * steps * hop - attention_bwd_s)


def rank_calls(ops: list[Op], model, shard, method: str, cp_ulysses: int = 1) -> list[Op]:
    """The operators with the attention kernel as it runs on the busiest CP rank.

    A ring (TE's, PyTorch's, ulysses-ring's over cp/cp_ulysses groups) calls the kernel once a
    step over one chunk of K and V, so a query's keys spread over its steps (ring_steps);
    Ulysses runs whole sequences of heads/cp heads in one call. TE's all-gather runs each of
    the rank's two chunks' queries over all the keys before them in one call; under sliding
    windows its ranks hold unequal work (allgather_window_imbalance), and the busiest sets the
    layer's time: the windowed layers' executed FLOPs are that rank's, the useful ones stay the
    mean. Under a ring or the all-gather no call attends a whole causal document
    (whole_calls: where cp > 1; compute._attention_calls)."""
    if method == "ulysses" or (np.ndim(shard.cp) == 0 and shard.cp == 1):
        return ops
    c = np.asarray(shard.cp)
    whole = c == 1 if np.ndim(c) else False
    if method == "kv-allgather":
        factor = _allgather_band_factor(model, shard)
        return [op if op.keys_per_query is None else
                replace(op, whole_calls=whole, fwd_flops=op.fwd_flops * factor,
                        bwd_input_flops=op.bwd_input_flops * factor) for op in ops]
    steps = c / cp_ulysses if method == "ulysses-ring" else c
    return [op if op.keys_per_query is None else replace(op, whole_calls=whole, ring_steps=steps) for op in ops]


def allgather_window_imbalance(model, cp: int) -> float:
    """The busiest CP rank's windowed (query, key) pairs over the ranks' mean, in one sliding-
    window layer under TE's all-gather: rank r holds chunks r and 2cp-1-r of each document's
    2cp (TE@d0067d0da context_parallel.py AttnFuncWithCPAndKVAllGather: local_seq_chunk_ids =
    [rank, 2 * cp_size - rank - 1]; get_kv_seq_info_after_all_gather trims each chunk's keys to
    its window). A query in the first window of a document sees fewer keys, so rank 0's early
    chunk holds less; causal attention without a window balances exactly. Worked example:
    8,192 tokens, a window of 4,096, cp 4: the ranks hold 4.5, 5.5, 6.5 and 7.5 units, 1.25
    times the mean."""
    if cp == 1:
        return 1.0
    w, r = model.sliding_window, np.arange(cp)
    per_rank = np.zeros(cp)
    for tokens, count in documents(model):
        edges = np.arange(2 * cp + 1) * tokens / (2 * cp)
        chunk = np.diff([causal_pairs(x, w) for x in edges])  # the pairs of each chunk's queries
        per_rank += count * (chunk[r] + chunk[2 * cp - 1 - r])
    return float(per_rank.max() / per_rank.mean())


def _allgather_band_factor(model, shard):
    """The busiest rank's executed attention over the mean's for a layer of the stage's band
    (Shard.window_fraction: its share of windowed layers): windowed layers at
    allgather_window_imbalance, full ones balanced."""
    if not model.has_sliding_window or (np.ndim(shard.cp) == 0 and shard.cp == 1):
        return 1.0
    full, windowed = window_pair_fraction(model, 1, 0), window_pair_fraction(model, 1, 1)
    if windowed == full:  # the window spans every document: windowed layers attend as full ones
        return 1.0
    band = window_pair_fraction(model) if shard.window_fraction is None else shard.window_fraction
    share = (full - band) / (full - windowed)  # of the stage's layers, windowed
    if np.ndim(shard.cp) == 0:
        imbalance = allgather_window_imbalance(model, int(shard.cp))
    else:
        imbalance = np.vectorize(lambda c: allgather_window_imbalance(model, int(c)), otypes=[float])(shard.cp)
    return (share * windowed * imbalance + (1 - share) * full) / band


def merge_ops(model, shard, method: str, compiled: bool = True) -> list[Op]:
    """The memory-bound kernels around the attention kernel, per micro-batch (see the module's
    docstring): the torch ring's fp32 merges and gradient accumulations, TE's reorders and
    dK, dV accumulation (kv-allgather) or copies around the all-to-alls (ulysses); none for
    the ring. `compiled`: Inductor fuses each step's torch merge into one kernel; eager
    PyTorch runs every tensor op of the loop as its own kernel, and the K, V send buffer is
    concatenated at every step even where the all-gather no longer reads it."""
    if np.ndim(shard.cp) == 0 and shard.cp == 1:
        return []
    if method in TE_EXPOSED + ULYSSES:
        return [_te_copies(model, shard, method)]
    if not _torch(method):
        return []
    c = np.asarray(shard.cp)
    a, f = shard.act_bytes, FP32_BYTES
    x_q, x_k, x_v, x_o = _elements(model, shard)
    on = np.where(c > 1, 1.0, 0.0)
    grads = x_q + x_k + x_v
    if compiled:
        # a step's merge reads the fp32 accumulator and the step's output and writes the accumulator
        merge, accumulate, send = (2 * f + a) * x_o, (2 * f + a) * grads, 0.0
        sends = on if method == "torch-allgather" else c - 1
    else:
        # cast to fp32, out - block_out, times sigmoid(lse difference), out minus that
        merge = (a + f + 3 * f + 3 * f + 3 * f) * x_o
        # grad += step's grad for dQ, dK, dV; dK and dV concatenated into the send buffer
        accumulate, send = (a + 2 * f) * grads, 2 * f * (x_k + x_v)
        sends = c - 1
    kv_cat = sends * 2 * a * (x_k + x_v)  # K and V read and written into one send buffer
    # forward: the first step's output cast to fp32, cp-1 merges, the result cast back
    fwd = on * 2 * (a + f) * x_o + (c - 1) * merge + kv_cat
    # backward: every step accumulates (and passes on dK, dV); dQ, dK, dV cast back
    bwd = c * on * (accumulate + send) + on * (a + f) * grads + kv_cat
    return [Op("cp_merge", MEMORY, fwd_bytes=fwd, bwd_input_bytes=bwd, group=ATTENTION_CORE)]


def _te_copies(model, shard, method: str) -> Op:
    """kv-allgather: the gathered K and V reordered (read and written) in each pass; in the
    backward dK, dV zeroed over the whole sequence, each step's piece made contiguous and
    added into them (the two steps' key ranges add up to about the whole sequence), and
    reordered for the reduce-scatter. ulysses: every tensor moved copied twice (read and
    written), Q, K, V and O forward, dO, dQ, dK, dV backward."""
    c = np.asarray(shard.cp)
    on = np.where(c > 1, 1.0, 0.0)
    if method == "kv-allgather":
        whole = c * exchanged_bytes(model, shard, method)
        fwd, bwd = 2 * whole, (2 + 1 + 2 + 3 + 2) * whole
    else:
        moved = shard.act_bytes * sum(_ulysses_elements(model, shard))
        fwd = bwd = 2 * 2 * moved
    return Op("cp_copies", MEMORY, fwd_bytes=on * fwd, bwd_input_bytes=on * bwd, group=ATTENTION_CORE)


def transient_bytes(model, shard, method: str):
    """Bytes the torch ring holds beyond the saved activations while a layer's attention
    backward runs: K and V of every rank (allgather) or the current and next chunk
    (alltoall), the fp32 dQ, dK, dV accumulators and the dK, dV in flight; 0 for the ring,
    whose buffers are two chunks of K and V. kv-allgather: every rank's K and V, gathered
    again for the backward, and dK, dV over the whole sequence; ulysses: 0 beyond the ring's
    (the whole-sequence Q, K, V of heads/cp heads are the chunks' elements)."""
    c = np.asarray(shard.cp)
    kv = exchanged_bytes(model, shard, method)
    if method == "kv-allgather":
        return np.where(c > 1, 2 * c * kv, 0.0)
    if not _torch(method):
        return 0.0
    x_q, x_k, x_v, _ = _elements(model, shard)
    held = (c if method == "torch-allgather" else 2) * kv
    accumulators = FP32_BYTES * (x_q + x_k + x_v) + 2 * FP32_BYTES * (x_k + x_v)
    return np.where(c > 1, held + accumulators, 0.0)
