"""Each physics function against a value worked by hand from its paper or first principles:
the roofline, TP/SP, CP and PP traffic, ZeRO collectives, ring/tree/hierarchical
collectives, the optimizer step, offload transfers and their exposure, buffers."""

import math

import pytest

from simulator.comm import Placement, collective_time
from simulator.compute import op_times
from simulator.cpattention import exposed_s
from simulator.dataparallel import bucketed_overlap_s, buckets, dp_costs
from simulator.dims import Groups
from simulator.hardware import Accelerator, Efficiency, load_accelerator
from simulator.memory import buffer_bytes
from simulator.model import ModelSpec
from simulator.offload import OffloadCosts, exposed_offload_s, offload_costs
from simulator.passes import pp_hop_s, tp_layer_comm_s
from simulator.plan import Offload, Plan
from simulator.states import bytes_per_param, model_states, optimizer_step_s
from simulator.workload import MATMUL, MEMORY, Op, Shard, layer_ops

GPT = ModelSpec(name="gpt", layers=24, hidden=2048, heads=16, kv_heads=16, ffn_hidden=8192, vocab=51200,
                seq_len=2048, activation="gelu", dropout=False)


def accelerator(**kw):
    base = dict(name="toy", description="", peak_flops={"bf16": 100e12}, hbm_bytes=80 * 2**30,
                hbm_bytes_per_s=2e12, host_link_bytes_per_s=25e9, tdp_w=400, price_usd_per_hour=1.0,
                framework_overhead_bytes=2 * 2**30, matmul=Efficiency(0.5, 0.0), attention=Efficiency(0.5, 0.0),
                memory=Efficiency(0.8, 0.0))
    base.update(kw)
    return Accelerator(**base)


# ---------------------------------------------------------------- roofline

def test_a_compute_bound_gemm_runs_at_the_efficient_fraction_of_peak():
    op = Op("gemm", MATMUL, fwd_flops=1e12, bwd_input_flops=1e12, bwd_weight_flops=1e12, fwd_bytes=1e6)
    t = op_times(op, accelerator(), "bf16")
    assert t.fwd_s == pytest.approx(1e12 / (100e12 * 0.5))  # 20 ms; the bytes take 0.6 us


def test_a_memory_bound_kernel_runs_at_the_efficient_fraction_of_bandwidth():
    op = Op("gelu", MEMORY, fwd_bytes=4e9, bwd_input_bytes=8e9)
    t = op_times(op, accelerator(), "bf16")
    assert (t.fwd_s, t.bwd_input_s, t.bwd_weight_s) == pytest.approx((4e9 / 1.6e12, 8e9 / 1.6e12, 0.0))


def test_a_small_kernel_pays_the_half_efficiency_size():
    # eff(x) = max x / (x + half): x / (peak eff(x)) = (x + half) / (peak max)
    op = Op("gemm", MATMUL, fwd_flops=2e9)
    t = op_times(op, accelerator(matmul=Efficiency(0.5, 2e9)), "bf16")
    assert t.fwd_s == pytest.approx((2e9 + 2e9) / (100e12 * 0.5))


# ---------------------------------------------------------------- TP, CP, PP traffic

def _groups(tp=1, cp=1, dp=1, pp=1, local=8):
    def g(n):
        return Placement(n, min(n, local), math.ceil(n / min(n, local)))
    return Groups(tp=g(tp), cp=g(cp), grad=g(cp * dp), pp=g(pp))


def _ring(kind, nbytes, n, link):
    factor = 2 if kind == "all_reduce" else 1
    return factor * (n - 1) * link.latency_s + factor * (n - 1) / n * nbytes / link.bus_bytes_per_s


def test_tensor_parallel_layer_all_reduces_its_activation_twice_each_way(dgx_a100):
    # Shoeybi et al. 2019: two all-reduces of b s h forward, two backward
    cluster = dgx_a100(1)
    shard = Shard(micro_batch=2, seq_len=2048, tp=4)
    nbytes = 2 * 2 * 2048 * 2048
    fwd, bwd = tp_layer_comm_s(GPT, shard, _groups(tp=4), cluster)
    expected = 2 * min(_ring("all_reduce", nbytes, 4, cluster.node.scaleup),
                       2 * 2 * cluster.node.scaleup.latency_s + 2 * nbytes / cluster.node.scaleup.bus_bytes_per_s)
    assert float(fwd) == pytest.approx(expected) and float(bwd) == pytest.approx(expected)


def test_sequence_parallel_turns_each_all_reduce_into_gather_and_scatter_plus_a_backward_regather(dgx_a100):
    # Korthikanti et al. 2022: all-gather + reduce-scatter of the same volume; Megatron-LM
    # re-gathers the input of the two column-parallel GEMMs for their weight gradients
    cluster = dgx_a100(1)
    shard = Shard(micro_batch=2, seq_len=2048, tp=4, sp=True)
    nbytes = 2 * 2 * 2048 * 2048
    link = cluster.node.scaleup
    gather = _ring("all_gather", nbytes, 4, link)
    fwd, bwd = tp_layer_comm_s(GPT, shard, _groups(tp=4), cluster)
    assert float(fwd) == pytest.approx(2 * (gather + _ring("reduce_scatter", nbytes, 4, link)))
    assert float(bwd) == pytest.approx(float(fwd) + 2 * gather)


def test_dtensor_linears_keep_the_gathered_input_and_need_no_backward_regather(dgx_a100):
    # torchtitan's PrepareModuleInput redistributes the norm output to Replicate and F.linear
    # keeps that gathered input: the backward has only the mirror images of the forward's
    cluster = dgx_a100(1)
    shard = Shard(micro_batch=2, seq_len=2048, tp=4, sp=True, tp_keeps_gathered=True)
    nbytes = 2 * 2 * 2048 * 2048
    link = cluster.node.scaleup
    fwd, bwd = tp_layer_comm_s(GPT, shard, _groups(tp=4), cluster)
    assert float(fwd) == pytest.approx(2 * (_ring("all_gather", nbytes, 4, link) + _ring("reduce_scatter", nbytes, 4, link)))
    assert float(bwd) == pytest.approx(float(fwd))


def test_a_column_parallel_linear_keeps_its_input_shard_under_megatron_and_all_of_it_under_dtensor():
    # qkv's saved bytes beyond Q, K and V: 2 B x b s h / t (Megatron-LM sequence parallelism), 2 B x b s h (DTensor)
    def saved(**kw):
        ops = {op.name: op for op in layer_ops(GPT, Shard(micro_batch=2, seq_len=2048, tp=4, sp=True, **kw))}
        return ops["qkv"].saved_bytes - 2 * 2 * 2048 * 3 * 2048 / 4, ops["mlp_up"].saved_bytes
    assert saved() == pytest.approx((2 * 2 * 2048 * 2048 / 4, 2 * 2 * 2048 * 2048 / 4))
    assert saved(tp_keeps_gathered=True) == pytest.approx((2 * 2 * 2048 * 2048, 2 * 2 * 2048 * 2048))


def test_userbuffers_overlap_of_dtensor_linears_is_refused():
    from simulator import InputError, scenario_from_dict
    plan = {"tp": 8, "dp": 1, "micro_batch": 1, "global_batch": 8, "sequence_parallel": True, "tp_impl": "dtensor",
            "tp_comm_overlap": True}
    with pytest.raises(InputError, match="plan.tp_overlap"):
        scenario_from_dict({"model": {"preset": "llama-3.1-8b"}, "cluster": {"node": "dgx-h100", "nodes": 1},
                            "plan": plan})
    scenario_from_dict({"model": {"preset": "llama-3.1-8b"}, "cluster": {"node": "dgx-h100", "nodes": 1},
                        "plan": {**plan, "tp_overlap": "async-tp"}})


def test_context_parallel_ring_passes_keys_and_values_cp_minus_one_times(dgx_a100):
    cluster = dgx_a100(1)
    shard = Shard(micro_batch=1, seq_len=2048, tp=2, cp=4)
    kv_bytes = 2 * 2 * (2048 / 4) * (16 / 2) * 128  # K and V of the local chunk, local heads x head_dim
    hop = cluster.node.scaleup.latency_s + kv_bytes / cluster.node.scaleup.bus_bytes_per_s
    fwd, bwd = exposed_s(GPT, shard, _groups(tp=2, cp=4), cluster, "ring", 0.0, 0.0)  # nothing to hide behind
    assert float(fwd) == pytest.approx(3 * hop) and float(bwd) == pytest.approx(6 * hop)


def test_a_pipeline_send_carries_1_over_t_of_the_activation_across_nodes(dgx_a100):
    cluster = dgx_a100(2)
    shard = Shard(micro_batch=4, seq_len=2048, tp=8)
    nbytes = 2 * 4 * 2048 * 2048 / 8
    out = cluster.scaleout
    assert float(pp_hop_s(GPT, shard, _groups(tp=8, pp=2, local=1), cluster)) == pytest.approx(
        out.latency_s + nbytes / out.bus_bytes_per_s)


def test_without_scatter_gather_every_tp_rank_sends_the_whole_activation_unless_sequence_parallel(dgx_a100):
    # Megatron-LM of Jan 2021 and Megatron-Core without SP; with SP the activation is split anyway
    cluster = dgx_a100(2)
    out = cluster.scaleout
    whole = 2 * 4 * 2048 * 2048
    groups = _groups(tp=8, pp=2, local=1)
    shard = Shard(micro_batch=4, seq_len=2048, tp=8)
    assert float(pp_hop_s(GPT, shard, groups, cluster, scatter_gather=False)) == pytest.approx(
        out.latency_s + whole / out.bus_bytes_per_s)
    sp = Shard(micro_batch=4, seq_len=2048, tp=8, sp=True)
    assert float(pp_hop_s(GPT, sp, groups, cluster, scatter_gather=False)) == pytest.approx(
        out.latency_s + whole / 8 / out.bus_bytes_per_s)


# ---------------------------------------------------------------- collectives

def test_small_all_reduce_takes_the_tree_when_its_latency_wins(dgx_a100):
    cluster = dgx_a100(1)
    link = cluster.node.scaleup
    tree = 2 * math.ceil(math.log2(8)) * link.latency_s + 2 * 1e3 / link.bus_bytes_per_s
    assert tree < _ring("all_reduce", 1e3, 8, link)
    assert float(collective_time("all_reduce", 1e3, Placement(8, 8, 1), cluster)) == pytest.approx(tree)


def test_all_reduce_across_nodes_is_scatter_inside_reduce_across_gather_inside(dgx_a100):
    cluster = dgx_a100(4)
    up, out, size = cluster.node.scaleup, cluster.scaleout, 8e9
    across = min(_ring("all_reduce", size / 8, 4, out),
                 2 * math.ceil(math.log2(4)) * out.latency_s + 2 * size / 8 / out.bus_bytes_per_s)
    expected = _ring("reduce_scatter", size, 8, up) + across + _ring("all_gather", size, 8, up)
    assert float(collective_time("all_reduce", size, Placement(32, 8, 4), cluster)) == pytest.approx(expected)


# ---------------------------------------------------------------- ZeRO traffic

@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_zero_stages_move_the_gradients_and_weights_as_rajbhandari_et_al(dgx_a100, stage):
    cluster, psi = dgx_a100(1), 1e9
    group, link = Placement(8, 8, 1), cluster.node.scaleup
    d = dp_costs(stage, psi, 2.0, 4.0, group, cluster)
    rs, ag = _ring("reduce_scatter", 4 * psi, 8, link), _ring("all_gather", 2 * psi, 8, link)
    ar = min(_ring("all_reduce", 4 * psi, 8, link), 6 * link.latency_s + 2 * 4 * psi / link.bus_bytes_per_s)
    want = {0: (ar, 0, 0, 0), 1: (rs, ag, 0, 0), 2: (0, ag, 0, rs), 3: (0, 0, 2 * ag, rs)}[stage]
    got = (d.step_reduce_s, d.step_gather_s, d.mb_gather_s, d.mb_reduce_s)
    assert tuple(float(x) for x in got) == pytest.approx(want)


def test_megatron_buckets_hold_40m_parameters_or_1m_per_rank():
    # megatron/core/distributed/distributed_data_parallel.py: max(40M, 1M x dp size)
    assert float(buckets(400e6, 8)) == 10 and float(buckets(400e6, 128)) == math.ceil(400 / 128)


@pytest.mark.parametrize("comm,compute,k,tail", [(4.0, 8.0, 4, 1.0), (8.0, 4.0, 4, 5.0), (3.0, 3.0, 1, 3.0)])
def test_a_bucketed_reduction_outlasts_its_pass_by_the_last_bucket_or_the_excess(comm, compute, k, tail):
    # buckets issued at each k-th of the pass, back to back: the stream keeps up (comm <= compute):
    # the last bucket, comm/k; else it starts at compute/k and runs comm: compute/k + comm - compute
    assert float(bucketed_overlap_s(comm, compute, k)) == pytest.approx(tail)


# ---------------------------------------------------------------- optimizer, offload, buffers

def test_adam_step_reads_and_writes_its_shard_at_memory_speed():
    acc = accelerator()
    plan = Plan(dp=8, zero_stage=1)
    per = bytes_per_param("bf16", "fp32")
    states = model_states(1e9, plan, per, 8)
    # the shard's fp32 gradient (4 B), master weight, momentum, variance read and written (2 x 12 B),
    # bf16 weight written (2 B)
    assert float(optimizer_step_s(states, per, plan, acc)) == pytest.approx(1e9 / 8 * (4 + 24 + 2) / 1.6e12)


def test_adam_step_over_16_bit_gradients_reads_their_fp32_copies():
    acc = accelerator()
    plan = Plan(dp=8, zero_stage=1, grad_precision="bf16")
    per = bytes_per_param("bf16", "bf16")
    states = model_states(1e9, plan, per, 8)
    # Megatron's distributed optimizer: the shard's bf16 gradient copied to fp32 first, the step reads 4 B
    assert float(optimizer_step_s(states, per, plan, acc)) == pytest.approx(1e9 / 8 * (4 + 24 + 2) / 1.6e12)


def test_the_fp32_gradient_copies_are_held_through_the_optimizer_step():
    from simulator.hardware import cluster_from_dict
    from simulator.layout import compile_layout
    from simulator.model import model_from_dict

    model = model_from_dict({"preset": "llama-2-7b"})
    cluster = cluster_from_dict({"node": "dgx-a100", "nodes": 1})
    bf16, fp32 = (compile_layout(model, cluster, Plan(dp=8, global_batch=8, zero_stage=1, grad_precision=g))
                  for g in ("bf16", "fp32"))
    local = bf16.stages[0].states.local_params
    assert float(bf16.stages[0].optimizer_workspace_bytes) == pytest.approx(4 * float(local))
    assert float(fp32.stages[0].optimizer_workspace_bytes) == 0.0


def test_offloaded_activations_cross_the_host_link_each_way(dgx_a100):
    cluster = dgx_a100(1)
    plan = Plan(zero_stage=0, offload=Offload(activations="cpu"))
    per = bytes_per_param("bf16", "fp32")
    states = model_states(1e9, plan, per, 1)
    c = offload_costs(plan, cluster, 1e9, states, per, 3.2e9, 1, 1)
    # PCIe Gen4 x16, 32 GB/s each way, shared by the two GPUs behind one PCIe switch
    assert (float(c.activations_d2h_s), float(c.activations_h2d_s)) == pytest.approx((0.2, 0.2))


def test_offload_exposure_is_the_read_beyond_the_pass_it_overlaps():
    c = OffloadCosts(activations_d2h_s=0.5, activations_h2d_s=0.5, weights_h2d_s=0.0, gradients_d2h_s=0.0,
                     host_adam_s=0.0, weights_back_h2d_s=0.0)
    # 8 micro-batches, each read overlapping a 0.3 s forward pass: 0.2 s exposed each; the stage
    # has no slack (it is the period) and the link keeps up (8 x 0.5 s < 8 x 1.0 s)
    assert float(exposed_offload_s(c, 1, 8, (8, 0), 0.3, 0.7, 1.0, 1.0)) == pytest.approx(8 * 0.2)
    # with 0.1 s of slack per micro-batch only 0.1 s of each is exposed
    assert float(exposed_offload_s(c, 1, 8, (8, 0), 0.3, 0.7, 0.9, 1.0)) == pytest.approx(8 * 0.1)
    # a link slower than the pipeline: the copies out take 8 x 0.5 s against a 8 x 0.25 s period
    assert float(exposed_offload_s(c, 1, 8, (0, 8), 0.3, 0.7, 0.25, 0.25)) == pytest.approx(8 * 0.5 - 8 * 0.25)


def test_zero3_buffers_hold_two_gathered_layers_and_one_layers_gradients():
    plan = Plan(zero_stage=3)
    assert float(buffer_bytes(2e9, 100e6, plan, 2.0, 4.0)) == pytest.approx(2e9 + 2 * 100e6 * 2 + 100e6 * 4)


def test_loaded_profiles_keep_physical_units():
    acc = load_accelerator("a100-sxm-80gb")
    assert acc.hbm_bytes_per_s == pytest.approx(2039e9) and acc.hbm_bytes == 80 * 2**30


def test_a_short_reduction_dimension_slows_a_gemm_as_the_profile_measured():
    # wo of an 8B layer under TP 8: K = 512 forward, 4096 for its input gradient, the tokens
    # for its weight gradient; each pass at K / (K + 106) of the FLOP curve's rate (h100)
    from dataclasses import replace as _replace

    from simulator.compute import op_times
    from simulator.hardware import load_accelerator
    from simulator.workload import _linear

    acc = load_accelerator("h100-sxm-80gb")
    flat = _replace(acc, matmul_k_half=0.0)
    op = _linear("wo", 16384, 512, 4096, 2, 0.0)
    t, t0 = op_times(op, acc, "bf16"), op_times(op, flat, "bf16")
    assert t.fwd_s == pytest.approx(t0.fwd_s * (512 + 106) / 512, rel=1e-12)
    assert t.bwd_input_s == pytest.approx(t0.bwd_input_s * (4096 + 106) / 4096, rel=1e-12)
    assert t.bwd_weight_s == pytest.approx(t0.bwd_weight_s * (16384 + 106) / 16384, rel=1e-12)
