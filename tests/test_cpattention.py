"""Context parallelism's attention (cpattention.py): PyTorch's ring as torchtitan runs it,
against the bytes and exposures counted by hand from its loop (pytorch/pytorch
torch/distributed/tensor/experimental/_attention.py)."""

import math

import pytest

from simulator.comm import Placement
from simulator.cpattention import exchanged_bytes, exposed_s, merge_ops, transient_bytes
from simulator.dims import Groups
from simulator.model import ModelSpec
from simulator.workload import Shard

# GQA: 8 query heads over 2 KV heads of 32; 256 local tokens on each of 4 CP ranks
GQA = ModelSpec(name="gqa", layers=2, hidden=256, heads=8, kv_heads=2, ffn_hidden=512, vocab=1000, seq_len=1024,
                activation="swiglu")
SHARD = Shard(micro_batch=1, seq_len=1024, cp=4)
X = 256 * 8 * 32  # elements of one rank's Q (and K, V, output) chunk as SDPA gets them


def _groups(cp, local=8):
    g = Placement(cp, min(cp, local), math.ceil(cp / min(cp, local)))
    return Groups(tp=Placement(1, 1, 1), cp=g, grad=g, pp=Placement(1, 1, 1))


def test_torch_moves_keys_and_values_repeated_to_the_query_heads():
    # torchtitan's repeat_kv: 8 heads of K and V in 2 bytes, where the ring moves the 2 KV heads
    assert exchanged_bytes(GQA, SHARD, "torch-allgather") == 2 * 2 * X
    assert exchanged_bytes(GQA, SHARD, "ring") == 2 * 2 * 256 * 2 * 32


def test_allgather_hides_behind_the_first_step_only(dgx_a100):
    cluster = dgx_a100(1)
    link = cluster.node.scaleup
    kv = 2 * 2 * X
    gather = 3 * link.latency_s + 3 / 4 * 4 * kv / link.bus_bytes_per_s  # ring all-gather of 4 chunks
    grad_hop = link.latency_s + 2 * kv / link.bus_bytes_per_s  # dK, dV in fp32
    attention_s = 4 * gather / 2  # each of the 4 steps takes half the all-gather
    fwd, bwd = exposed_s(GQA, SHARD, _groups(4), cluster, "torch-allgather", attention_s, attention_s)
    assert float(fwd) == pytest.approx(gather / 2)
    # K and V gathered again behind the first step; 3 gradient permutes hidden behind the next
    # steps (each shorter than a step here), the last one waited for after the loop
    assert grad_hop < gather / 2
    assert float(bwd) == pytest.approx(gather / 2 + grad_hop)


def test_alltoall_pays_each_permute_beyond_its_step(dgx_a100):
    cluster = dgx_a100(1)
    link = cluster.node.scaleup
    hop = link.latency_s + 2 * 2 * X / link.bus_bytes_per_s
    step_s = hop / 4
    fwd, _ = exposed_s(GQA, SHARD, _groups(4), cluster, "torch-alltoall", 4 * step_s, 0.0)
    assert float(fwd) == pytest.approx(3 * (hop - step_s))


def test_merges_accumulate_each_step_in_fp32():
    (op,) = merge_ops(GQA, SHARD, "torch-allgather")
    cast = (2 + 4) * X  # 16-bit output read, fp32 written (and the final cast back)
    merge = (4 + 2 + 4) * X  # fp32 accumulator read, the step's output read, accumulator written
    kv_cat = 2 * (2 + 2) * X  # K and V read and written into the all-gather's send buffer
    assert op.fwd_bytes == pytest.approx(2 * cast + 3 * merge + kv_cat)
    # backward: 4 steps add dQ, dK, dV into fp32 accumulators; three casts back; one send buffer
    assert op.bwd_input_bytes == pytest.approx(4 * 3 * merge + 3 * cast + kv_cat)


def test_allgather_holds_every_ranks_keys_and_values_during_the_backward():
    kv_all = 4 * 2 * 2 * X
    accumulators = 3 * 4 * X  # fp32 dQ, dK, dV
    in_flight = 2 * 2 * 4 * X  # the fp32 dK, dV sent and received
    assert transient_bytes(GQA, SHARD, "torch-allgather") == kv_all + accumulators + in_flight
    assert transient_bytes(GQA, SHARD, "torch-alltoall") == 2 * 2 * 2 * X + accumulators + in_flight


def test_the_ring_adds_no_kernels_and_no_buffers():
    assert merge_ops(GQA, SHARD, "ring") == [] and transient_bytes(GQA, SHARD, "ring") == 0.0


def test_one_cp_rank_runs_no_ring(dgx_a100):
    shard = Shard(micro_batch=1, seq_len=1024, cp=1)
    assert merge_ops(GQA, shard, "torch-allgather") == []
    assert transient_bytes(GQA, shard, "torch-allgather") == 0.0
    fwd, bwd = exposed_s(GQA, shard, _groups(1), dgx_a100(1), "torch-allgather", 0.0, 0.0)
    assert (float(fwd), float(bwd)) == (0.0, 0.0)


def test_eager_merges_run_every_tensor_op_of_the_loop_as_a_kernel():
    (op,) = merge_ops(GQA, SHARD, "torch-allgather", compiled=False)
    cast = (2 + 4) * X
    # cast, out - block_out (2 reads, 1 write in fp32), the product, the difference
    merge = cast + 3 * (3 * 4) * X
    kv_cat = 2 * (2 + 2) * X  # concatenated at each of the first 3 steps
    assert op.fwd_bytes == pytest.approx(2 * cast + 3 * merge + 3 * kv_cat)
    accumulate = 3 * (2 + 2 * 4) * X  # dQ, dK, dV: fp32 read and written, the step's 16-bit read
    send = 2 * (4 + 4) * X  # dK, dV read and written into the send buffer
    assert op.bwd_input_bytes == pytest.approx(4 * (accumulate + send) + 3 * cast + 3 * kv_cat)


# TransformerEngine's all-gather and all-to-all implementations (TE@d0067d0da context_parallel.py)
KV_HEADS_X = 256 * 2 * 32  # elements of one rank's K (or V) chunk with its own 2 KV heads


def test_te_allgather_gathers_keys_and_values_exposed_and_reduce_scatters_their_gradients(dgx_a100):
    cluster = dgx_a100(1)
    link = cluster.node.scaleup
    whole = 4 * 2 * 2 * KV_HEADS_X  # K and V of all 4 ranks in 2 bytes, no repeat to the query heads
    gather = 3 * link.latency_s + 3 / 4 * whole / link.bus_bytes_per_s
    fwd, bwd = exposed_s(GQA, SHARD, _groups(4), cluster, "kv-allgather", 1.0, 1.0)
    assert float(fwd) == pytest.approx(gather)  # nothing hides it, however long the attention
    assert float(bwd) == pytest.approx(2 * gather)  # gathered again; dK, dV reduce-scattered alike


def test_te_allgather_holds_the_gathered_keys_values_and_their_whole_sequence_gradients():
    assert transient_bytes(GQA, SHARD, "kv-allgather") == 2 * (4 * 2 * 2 * KV_HEADS_X)


def test_te_allgather_reorders_and_accumulates_over_the_whole_sequence():
    (op,) = merge_ops(GQA, SHARD, "kv-allgather")
    whole = 4 * 2 * 2 * KV_HEADS_X
    assert op.fwd_bytes == pytest.approx(2 * whole)  # index_select: read and write
    # reorder again, dK/dV zeroed, each step's piece made contiguous, added, reordered back
    assert op.bwd_input_bytes == pytest.approx((2 + 1 + 2 + 3 + 2) * whole)


def test_ulysses_all_to_alls_queries_keys_values_and_output_each_way(dgx_a100):
    cluster = dgx_a100(1)
    link = cluster.node.scaleup
    # pairwise exchange over 4 ranks: 3 steps of a quarter of the tensor each (comm.all_to_all_time)
    a2a = lambda n: 3 * (link.latency_s + n / 4 / link.bus_bytes_per_s)  # noqa: E731
    sizes = (2 * X, 2 * KV_HEADS_X, 2 * KV_HEADS_X, 2 * X)  # Q, K, V, O in 2 bytes
    fwd, bwd = exposed_s(GQA, SHARD, _groups(4), cluster, "ulysses", 1.0, 1.0)
    assert float(fwd) == pytest.approx(sum(a2a(n) for n in sizes))
    assert float(bwd) == pytest.approx(float(fwd))  # dO; dQ, dK, dV


def test_ulysses_copies_every_tensor_twice_around_its_all_to_all():
    (op,) = merge_ops(GQA, SHARD, "ulysses")
    moved = 2 * (X + KV_HEADS_X + KV_HEADS_X + X)
    assert op.fwd_bytes == pytest.approx(2 * 2 * moved) and op.bwd_input_bytes == pytest.approx(2 * 2 * moved)


def test_hierarchical_cp_all_to_alls_in_its_group_then_rings_over_the_groups(dgx_a100):
    # cp 4 as 2 all-to-all groups of 2 consecutive ranks and a ring of 2 over them
    cluster = dgx_a100(1)
    link = cluster.node.scaleup
    pair = Placement(2, 2, 1)
    groups = Groups(tp=Placement(1, 1, 1), cp=Placement(4, 4, 1), grad=Placement(4, 4, 1), pp=Placement(1, 1, 1),
                    cp_a2a=pair, cp_ring=pair)
    a2a = lambda n: link.latency_s + n / 2 / link.bus_bytes_per_s  # noqa: E731  one step, half the tensor
    sizes = (2 * X, 2 * KV_HEADS_X, 2 * KV_HEADS_X, 2 * X)
    # each ring hop moves K and V of 2 chunks of 1 of the 2 KV heads: the plain ring's chunk
    hop = link.latency_s + 2 * 2 * KV_HEADS_X / link.bus_bytes_per_s
    fwd, bwd = exposed_s(GQA, SHARD, groups, cluster, "ulysses-ring", 0.0, 0.0)
    assert float(fwd) == pytest.approx(sum(a2a(n) for n in sizes) + hop)
    assert float(bwd) == pytest.approx(sum(a2a(n) for n in sizes) + 2 * hop)
    # an attention longer than the ring's hops hides them, never the all-to-alls
    fwd, _ = exposed_s(GQA, SHARD, groups, cluster, "ulysses-ring", 10 * hop, 10 * hop)
    assert float(fwd) == pytest.approx(sum(a2a(n) for n in sizes))


def test_hierarchical_cp_groups_are_consecutive_cp_ranks_and_the_ring_strides_over_them(scenario):
    from simulator.dims import groups

    s = scenario(model={"preset": "llama-3.1-8b", "seq_len": 32768}, cluster={"node": "dgx-h100", "nodes": 2},
                 tp=2, cp=8, dp=1, global_batch=8, sequence_parallel=True, cp_attention="ulysses-ring", cp_ulysses=2)
    g = groups(s.plan, s.cluster)
    assert (g.cp_a2a.size, g.cp_a2a.local, g.cp_a2a.domains) == (2, 2, 1)  # ranks 2 apart, one node
    assert (g.cp_ring.size, g.cp_ring.local, g.cp_ring.domains) == (4, 2, 2)  # ranks 4 apart, 2 per node


def test_te_allgather_with_a_window_wider_than_every_document_runs_as_without_one():
    """Documents of 256 tokens under a 512-token window: the window never binds, so the
    all-gather's windowed ranks are balanced as full ones (no division by the zero pairs the
    window removes), and the step is the step without a window."""
    from simulator import evaluate, scenario_from_dict

    def step(window):
        model = {"preset": "llama-2-13b", "seq_len": 1024, "document_tokens": 256}
        if window:
            model.update(sliding_window=window, sliding_window_freq=1)
        return evaluate(scenario_from_dict({"model": model, "cluster": {"node": "dgx-a100", "nodes": 1},
                                            "plan": {"cp": 2, "dp": 4, "global_batch": 4,
                                                     "cp_attention": "kv-allgather"}}), "analytic").step_time_s
    assert step(512) == step(0)
