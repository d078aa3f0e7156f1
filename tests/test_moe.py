"""Mixture-of-Experts and multi-head latent attention in the cost model, against numbers
worked by hand: all-to-all time and bytes, the dispatch per layer, expert memory per device,
FLOPs per token of an MoE layer, Megatron-Core's expert rank layout, and the plan's rules."""

import numpy as np
import pytest

from simulator import evaluate, scenario_from_dict
from simulator.comm import Placement, all_to_all_time
from simulator.errors import InputError
from simulator.evaluate import compile_scenario
from simulator.moe import ExpertShard, MoEOptions, dispatch_comm_s
from simulator.workload import MATMUL, Shard, executed_flops_per_sequence, layer_ops

DGX_H100 = {"node": "dgx-h100", "nodes": 1}
MIXTRAL = {"preset": "mixtral-8x7b", "seq_len": 4096}


def _scenario(model, cluster=DGX_H100, **plan):
    plan = {"tp": 1, "pp": 1, "micro_batch": 1, "global_batch": 64, **plan}
    return scenario_from_dict({"model": model, "cluster": cluster, "plan": plan})


# ------------------------------------------------------------------ all-to-all

def test_all_to_all_in_a_node_is_n_minus_1_pairwise_steps(dgx_a100):
    cluster = dgx_a100(1)
    up = cluster.node.scaleup
    size, n = 64.0e6, 8
    # Thakur et al. 2005: (n-1) alpha + (n-1)/n S / B
    expected = 7 * up.latency_s + 7 / 8 * size / (up.bytes_per_s * up.efficiency)
    assert float(all_to_all_time(size, Placement(n, n, 1), cluster)) == pytest.approx(expected, rel=1e-12)


def test_all_to_all_across_nodes_is_bound_by_the_share_leaving_the_node(dgx_a100):
    cluster = dgx_a100(2)
    out = cluster.scaleout
    size = 64.0e6
    # 16 ranks, 8 per node: 8 of the 16 shares cross the NIC (25 GB/s per A100 of a DGX A100)
    expected = 8 * (out.latency_s + size / 16 / (25e9 * out.efficiency))
    assert float(all_to_all_time(size, Placement(16, 8, 2), cluster)) == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("probs_in_experts", [False, True])
def test_dispatch_moves_2_top_k_tokens_hidden_bytes_per_layer_and_pass(probs_in_experts):
    """From Megatron-Core 0.13 the probabilities follow the tokens in an all-to-all of their own."""
    s = _scenario(MIXTRAL, ep=8)
    layout = compile_scenario(s)
    up = s.cluster.node.scaleup
    # Mixtral, 4096 tokens per device, top-2, hidden 4096, bf16, ep 8 in one node:
    # 2 * 2 * 4096 * 4096 * 2 * 7/8 bytes leave each rank per layer and pass, in 2 x 7 steps
    leaving = 2 * 2 * 4096 * 4096 * 2 * 7 / 8
    assert leaving == 117_440_512
    expected = leaving / (up.bytes_per_s * up.efficiency) + 2 * 7 * up.latency_s
    if probs_in_experts:  # one bf16 probability per row: 2 * 4096 rows * 2 bytes * 7/8, in 7 steps
        expected += 2 * 4096 * 2 * 7 / 8 / (up.bytes_per_s * up.efficiency) + 7 * up.latency_s
    experts = ExpertShard(8, 1, MoEOptions(probs_in_experts=probs_in_experts))
    got = dispatch_comm_s(s.model, layout.shard, experts, layout.groups, s.cluster)
    assert float(got) == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("probs_in_experts", [False, True])
def test_expert_tensor_parallel_gathers_the_received_rows_over_etp(probs_in_experts):
    s = _scenario(MIXTRAL, tp=2, sequence_parallel=True, ep=4, etp=2)
    layout = compile_scenario(s)
    up = s.cluster.node.scaleup
    bus = up.bytes_per_s * up.efficiency
    rows = 2 * 4096 / 2  # top-2 copies of the 2048 tokens of the rank's sequence-parallel shard
    sent = rows * 4096 * 2
    a2a = 3 * up.latency_s + 3 / 4 * sent / bus
    gather = up.latency_s + 1 / 2 * (2 * sent) / bus  # ring all-gather of 2 x the rows over 2 ranks
    expected = 2 * a2a + 2 * gather
    if probs_in_experts:  # the rows' bf16 probabilities: an all-to-all over EP, an all-gather over ETP
        expected += 3 * up.latency_s + 3 / 4 * rows * 2 / bus + up.latency_s + 1 / 2 * (2 * rows * 2) / bus
    experts = ExpertShard(4, 2, MoEOptions(probs_in_experts=probs_in_experts))
    got = dispatch_comm_s(s.model, layout.shard, experts, layout.groups, s.cluster)
    assert float(got) == pytest.approx(expected, rel=1e-12)


def test_dispatched_rows_follow_capacity_padding_and_imbalance():
    assert MoEOptions().busiest_rows == 1.0
    assert MoEOptions(load_imbalance=1.3).busiest_rows == 1.3
    assert MoEOptions(capacity_factor=1.0, load_imbalance=1.3).busiest_rows == 1.0  # dropped beyond capacity
    padded = MoEOptions(capacity_factor=1.25, pad_to_capacity=True)
    assert (padded.busiest_rows, padded.executed_rows, padded.useful_rows) == (1.25, 1.25, 1.0)
    assert MoEOptions(capacity_factor=0.5).useful_rows == 0.5


# ------------------------------------------------------------------ FLOPs

def test_the_pre_mlp_norm_output_the_router_and_the_shared_experts_read_is_kept_once():
    """Qwen1.5-MoE-A2.7B (a shared expert beside 60 routed ones, hidden 2048), one 4096-token
    sequence on one device: Megatron-Core's router and shared experts both take the pre-MLP
    norm output; autograd keeps that tensor once, 2 B x 4096 x 2048; under TransformerEngine's
    FP8 the shared expert's first linear adds its FP8 copy, 1 B x 4096 x 2048, and nothing of
    the BF16 input it does not own."""
    from pathlib import Path

    from simulator.layermix import layer_operators
    from simulator.model import model_from_dict
    from simulator.plan import Plan

    model = model_from_dict({"hf_config": str(Path(__file__).parent / "data" / "hf" / "qwen1.5-moe-a2.7b.json"),
                             "seq_len": 4096})
    shard = Shard(micro_batch=1, seq_len=4096)
    experts = ExpertShard(options=MoEOptions())
    ops = {op.name: op for op in layer_ops(model, shard, experts)}
    assert (ops["router"].saved_bytes, ops["shared_mlp_gate_up"].saved_bytes) == (2 * 4096 * 2048, 0.0)
    fp8 = {op.name: op for op in layer_operators(model, shard, Plan(precision="fp8"), experts)}
    assert fp8["shared_mlp_gate_up"].saved_bytes == 1 * 4096 * 2048


@pytest.mark.parametrize("activation,kept_by_the_scale", [("swiglu", 0), ("gelu", 14336)])
def test_from_megatron_core_0_13_the_un_permutation_keeps_no_copies_of_the_expert_outputs(activation,
                                                                                           kept_by_the_scale):
    """Mixtral's MoE layer, one 4096-token sequence on one device (all 8 experts, top-2: 8192
    routed rows of hidden 4096, experts 14336 wide), bf16. Before Megatron-Core 0.13 the
    un-permutation weights the expert outputs and keeps them for the probabilities' gradient,
    2 B x 8192 x 4096; from 0.13 the probabilities scale the activation: SwiGLU's fused kernel
    keeps nothing more, a multiply after GELU keeps its output, 2 B x 8192 x 14336."""
    from dataclasses import replace

    from simulator.model import model_from_dict

    model = replace(model_from_dict(MIXTRAL), activation=activation)
    shard = Shard(micro_batch=1, seq_len=4096)

    def kept(probs_in_experts):
        ops = layer_ops(model, shard, ExpertShard(options=MoEOptions(probs_in_experts=probs_in_experts)))
        return sum(op.saved_bytes for op in ops)

    assert kept(False) - kept(True) == 2 * 8192 * 4096 - 2 * 8192 * kept_by_the_scale


def test_mixtral_executes_megatron_cores_flops_per_token_plus_the_router():
    s, L, h, n, g, d, f, k, V, E = 4096, 32, 4096, 32, 8, 128, 14336, 2, 32000, 8
    # Megatron-LM core_r0.9.0 training.py num_floating_point_operations (moe-runs.md: 82.93 GFLOP/token)
    megatron = 12 * L * h * h * ((1 + g / n + s / h) * (n * d / h) + (f / h) * k * 1.5 + V / (2 * L * h))
    assert megatron / 1e9 == pytest.approx(82.93, abs=0.005)
    router = 6 * h * E * L
    from simulator.model import load_preset
    from dataclasses import replace
    model = replace(load_preset("mixtral-8x7b"), seq_len=s)
    assert executed_flops_per_sequence(model, False, "none") / s == pytest.approx(megatron + router, rel=1e-12)


def test_an_moe_layer_with_mla_counts_the_weights_one_token_uses():
    from dataclasses import replace
    from simulator.model import load_preset
    m = replace(load_preset("deepseek-v3"), mtp_layers=0)
    s, h = m.seq_len, 7168
    gemm_weights = (h * 256  # router
                    + 9 * 3 * h * 2048  # one shared and eight routed SwiGLU experts of width 2048
                    + h * 1536 + 1536 * 128 * 192  # MLA query down- and up-projection
                    + h * (512 + 64) + 512 * 128 * (128 + 128)  # KV latent and its up-projection
                    + 128 * 128 * h)  # output projection
    core = 0.5 * 2 * s * 128 * (192 + 128)  # QK^T and AV per token over the causal half
    ops = layer_ops(m, Shard(micro_batch=1, seq_len=s), ExpertShard())
    useful = sum(op.useful_flops for op in ops) / s
    assert useful == pytest.approx(3 * (2 * gemm_weights + core), rel=1e-12)
    assert sum(op.fwd_flops for op in ops if op.kind == MATMUL) / s == pytest.approx(2 * gemm_weights, rel=1e-12)


def test_mfu_counts_active_parameters_and_padding_shows_in_hfu_only():
    base = evaluate(_scenario(MIXTRAL, ep=8), "analytic")
    padded = evaluate(_scenario(MIXTRAL, ep=8, moe={"capacity_factor": 1.5, "pad_to_capacity": True}), "analytic")
    assert padded.model_flops_per_step == base.model_flops_per_step
    assert padded.hardware_flops_per_step > base.hardware_flops_per_step
    assert padded.step_time_s > base.step_time_s


def test_few_tokens_per_expert_pay_the_matmul_curve_once_per_local_expert():
    from simulator.compute import op_times
    s = _scenario({"preset": "qwen3-30b-a3b"}, ep=8)
    layout = compile_scenario(s)
    op = next(o for o in layer_ops(s.model, layout.shard, ExpertShard(8, 1)) if o.name == "expert_fc1")
    acc = s.cluster.accelerator
    assert op.kernels == 16  # 128 experts over ep 8
    k = s.model.hidden  # the forward's reduction dimension, at K / (K + k_half) of the rate
    expected = (op.fwd_flops + 16 * acc.matmul.half) / (acc.peak("bf16") * acc.matmul.max) \
        * (k + acc.matmul_k_half) / k
    assert float(op_times(op, acc, "bf16").fwd_s) == pytest.approx(expected, rel=1e-12)


def _expert_ops(grouped_gemm: bool, model=None, align: int = 0):
    s = _scenario(model or {"preset": "qwen3-30b-a3b"}, ep=8)
    shard = compile_scenario(s).shard
    return s, shard, layer_ops(s.model, shard, ExpertShard(8, 1, MoEOptions(grouped_gemm=grouped_gemm), align))


def test_sequential_experts_launch_each_local_experts_kernels_and_join_their_outputs():
    """Megatron-Core's SequentialMLP (no --moe-grouped-gemm) on 16 local experts (128 over ep
    8): fc1, the activation and fc2 launch 16 times where the grouped GEMMs launch once (15
    more each: forward 3 x 15, backward 2 + 1 + 2 per expert), and torch.cat of the outputs
    reads and writes the received rows once, forward only (its backward slices)."""
    from simulator.hostbound import launches
    s, shard, sequential = _expert_ops(False)
    _, _, grouped = _expert_ops(True)
    (f_seq, b_seq), (f_grp, b_grp) = launches(sequential), launches(grouped)
    assert (f_seq - f_grp, b_seq - b_grp) == (3 * 15 + 1, 5 * 15 + 1)
    cat = next(o for o in sequential if o.name == "moe_expert_cat")
    rows = s.model.top_k * shard.tokens  # balanced dispatch: k rows per token received
    assert (float(cat.fwd_bytes), float(cat.bwd_input_bytes)) == (2 * 2 * rows * s.model.hidden, 0.0)
    assert [o.name for o in sequential if o.name != "moe_expert_cat"] == [o.name for o in grouped]


def test_sequential_experts_on_a_gpu_take_at_least_the_hosts_time_to_launch_them():
    """The 16 local experts' fc1, activation and fc2 launch apart, 3 launches each forward and 5
    backward (two GEMMs' input and weight gradients, the activation's): on a GPU node whose
    host pays a fixed time per launch, one micro-batch's step over Qwen3-30B-A3B's 48 MoE
    layers takes at least 48 x 16 x (3 + 5) launches of it, whatever the kernels' length."""
    s = _scenario({"preset": "qwen3-30b-a3b", "seq_len": 1024}, ep=8, dp=8, global_batch=8,
                  moe={"grouped_gemm": False})
    assert s.plan.microbatches == 1
    floor = 48 * 16 * (3 + 5) * s.cluster.node.launch_overhead_s
    for engine in ("analytic", "graph"):
        assert evaluate(s, engine).step_time_s >= floor


SMALL_MOE = {"name": "small-moe", "layers": 2, "hidden": 4096, "heads": 32, "kv_heads": 8, "vocab": 32000,
             "seq_len": 4096, "experts": 8, "top_k": 2, "expert_ffn_hidden": 8192, "ffn_hidden": 8192}


def _one_gpu(launch_overhead_s, recompute="none", **moe):
    from dataclasses import replace
    s = _scenario(SMALL_MOE, {"node": "dgx-h100", "nodes": 1, "devices_per_node": 1}, dp=1, global_batch=4,
                  recompute=recompute, moe=moe)
    return replace(s, cluster=replace(s.cluster, node=replace(s.cluster.node, launch_overhead_s=launch_overhead_s)))


@pytest.mark.parametrize("recompute,runs", [("none", 1), ("full", 2)])
def test_the_dispatchers_wait_for_its_split_sizes_idles_the_gpu_one_launch_per_moe_forward(recompute, runs):
    """Megatron-Core's dropless all-to-all dispatcher copies its split sizes to the host and
    waits for them once per MoE layer forward (token_dispatcher.py cuda_sync_point), after which
    the GPU idles until the host launches the next kernel. Two MoE layers, 4 micro-batches on one
    H100 whose kernels outlast the host's launches: 2 us more per launch is 2 x 4 x 2 us more a
    step, twice that where full recomputation runs each forward again."""
    for engine in ("analytic", "graph"):
        slow, fast = (evaluate(_one_gpu(h, recompute), engine).step_time_s for h in (3e-6, 1e-6))
        assert slow - fast == pytest.approx(2 * 4 * runs * 2e-6, rel=1e-6)


def test_a_dispatcher_padding_every_expert_to_capacity_never_waits():
    """With its rows padded to capacity the all-to-all dispatcher knows its split sizes on the host
    (drop_and_pad: cuda_sync_point no_sync), so a step whose kernels outlast the launches does
    not depend on the host's time per launch."""
    padded = {"capacity_factor": 1.0, "pad_to_capacity": True}
    for engine in ("analytic", "graph"):
        assert evaluate(_one_gpu(3e-6, **padded), engine).step_time_s == \
            evaluate(_one_gpu(1e-6, **padded), engine).step_time_s


MCORE_0_9 = MoEOptions(probs_in_experts=False)


@pytest.mark.parametrize("ep,etp,options,calls", [
    (8, 1, MCORE_0_9, (1 + 2, 2, 1)),
    (4, 2, MCORE_0_9, (1 + 2 + 2, 2 + 2, 1)),
    (1, 1, MCORE_0_9, (0, 0, 1)),
    (8, 1, MoEOptions(probs_in_experts=False, capacity_factor=1.0, pad_to_capacity=True), (3, 2, 0)),
    (8, 1, MoEOptions(), (1 + 3, 3, 1)),
    (4, 2, MoEOptions(), (1 + 3 + 3, 3 + 3, 1)),
    (1, 1, MoEOptions(), (0, 0, 1)),
    (8, 1, MoEOptions(capacity_factor=1.0, pad_to_capacity=True), (4, 3, 0)),
    (8, 1, MoEOptions(dispatcher="allgather"), (3 + 1, 2 + 1, 1)),
    (8, 1, MoEOptions(dispatcher="deepep"), (2, 2, 1)),
    (8, 1, MoEOptions(framework="torchtitan"), (3, 2, 1)),
    (1, 1, MoEOptions(framework="torchtitan", grouped_gemm=False), (0, 0, 1)),
])
def test_the_host_launches_the_dispatchs_collectives_and_waits_as_the_framework_does(ep, etp, options, calls):
    """(forward calls, backward calls, forward waits), read from the frameworks' dispatchers:
    Megatron-Core's all-to-all one counts' all-gather, the all-to-alls out and back over EP and
    the all-gather and reduce-scatter over expert TP, waiting once unless padded to capacity,
    and from 0.13 one more of each for the probabilities, each way;
    its all-gather dispatcher gathers indices, probabilities and tokens and reduce-scatters the
    output (backward: the two with gradients and the output); DeepEP a fused dispatch and combine;
    torchtitan the counts' all-to-all and the rows' two, waiting on their splits with EP and on
    its for-loop experts' counts."""
    from simulator.moe import dispatch_host_calls
    assert dispatch_host_calls(ExpertShard(ep, etp, options)) == calls
    # a sweep's batch of plans (numpy sizes) counts each plan's calls as the plan alone does
    batched = dispatch_host_calls(ExpertShard(np.array([ep, 1]), np.array([etp, 1]), options))
    assert tuple(int(np.ravel(c)[0]) for c in batched) == calls


def test_a_cpu_pays_its_host_cost_once_per_local_expert_without_grouped_gemm():
    """On a device whose framework costs a fixed host time per operator and pass (a CPU
    profile's op_overhead_us), each of the 16 local experts' fc1 GEMMs pays it: 15 x 20 us more
    per pass than the one grouped launch, the GEMMs' own time unchanged."""
    from dataclasses import replace
    from simulator.compute import op_times
    s, _, sequential = _expert_ops(False)
    _, _, grouped = _expert_ops(True)
    acc = replace(s.cluster.accelerator, op_overhead_s=20e-6)
    seq, grp = (op_times(next(o for o in ops if o.name == "expert_fc1"), acc, "bf16") for ops in (sequential, grouped))
    assert float(seq.fwd_s - grp.fwd_s) == pytest.approx(15 * 20e-6, rel=1e-9)
    assert float(seq.bwd_input_s - grp.bwd_input_s) == pytest.approx(15 * 20e-6, rel=1e-9)
    assert float(seq.bwd_weight_s) == pytest.approx(float(grp.bwd_weight_s), rel=1e-12)


def test_one_local_expert_has_no_outputs_to_join():
    s = _scenario(MIXTRAL, ep=8)
    ops = layer_ops(s.model, compile_scenario(s).shard, ExpertShard(8, 1, MoEOptions(grouped_gemm=False)))
    assert float(next(o for o in ops if o.name == "moe_expert_cat").fwd_bytes) == 0.0


def _padded_ops(align: int, grouped_gemm: bool = True):
    s, shard, ops = _expert_ops(grouped_gemm, align=align)
    return s, shard, {o.name: o for o in ops}


def test_quantized_experts_run_each_local_experts_rows_padded_to_the_recipes_multiple():
    """NVFP4's grouped GEMMs take each expert's rows padded to a multiple of 128 (TE's
    get_align_size_for_quantization): 16 local experts x 127 / 2 rows of zeros on average over
    the 8 x 4096 rows a rank receives; the useful (model) FLOPs stay the routed rows'."""
    s, _, bf16 = _padded_ops(0)
    _, _, nvfp4 = _padded_ops(128)
    rows, run = 8 * 4096, 8 * 4096 + 16 * 127 / 2
    f, h = s.model.expert_ffn_hidden, s.model.hidden
    assert float(nvfp4["expert_fc1"].fwd_flops) == pytest.approx(2 * run * h * 2 * f)
    assert float(nvfp4["expert_fc1"].model_flops) == pytest.approx(float(bf16["expert_fc1"].model_flops))
    assert float(bf16["expert_fc1"].fwd_flops) == pytest.approx(2 * rows * h * 2 * f)
    assert "moe_quant_pad" not in bf16


@pytest.mark.parametrize("grouped_gemm,copies", [(True, 2), (False, 1)])
def test_padding_copies_the_rows_in_and_out_of_the_padded_layout(grouped_gemm, copies):
    """TEGroupedMLP pads the input and unpads the output with TE's fused row copies (forward,
    and the same two in the backward pass); SequentialMLP concatenates each expert's rows with
    zeros and slices the output (one copy forward, the output gradient padded in backward)."""
    s, _, ops = _padded_ops(16, grouped_gemm)
    rows, run = 8 * 4096, 8 * 4096 + 16 * 15 / 2
    pad = ops["moe_quant_pad"]
    assert float(pad.fwd_bytes) == float(pad.bwd_input_bytes) == pytest.approx(copies * 2 * (rows + run) * 2048)


def test_router_padding_sends_each_experts_padding_through_the_dispatch_and_copies_nothing():
    """--moe-router-padding-for-quantization: every rank routes each of the 128 experts up to a
    multiple of 128 rows with tokens of weight 0 (moe_utils.pad_routing_map), 128 x 127 / 2 rows
    on average: they are sent, received and computed, useful to nobody, and the experts need no
    padding copies."""
    from simulator.moe import dispatched_rows, moe_buffer_bytes
    s = _scenario({"preset": "qwen3-30b-a3b"}, ep=8)
    shard = compile_scenario(s).shard
    padded = ExpertShard(8, 1, MoEOptions(router_padding=True), 128)
    sent = 8 * 4096 + 128 * 127 / 2
    assert float(dispatched_rows(s.model, shard.replicated_tokens, padded)) == pytest.approx(sent)
    assert float(moe_buffer_bytes(s.model, shard, padded)) == pytest.approx(2 * 2048 * sent * 3)
    ops = {o.name: o for o in layer_ops(s.model, shard, padded)}
    _, _, bf16 = _padded_ops(0)
    assert "moe_quant_pad" not in ops
    assert float(ops["expert_fc1"].fwd_flops) == pytest.approx(2 * sent * 2048 * 2 * s.model.expert_ffn_hidden)
    assert float(ops["expert_fc1"].model_flops) == pytest.approx(float(bf16["expert_fc1"].model_flops))


def test_router_padding_needs_a_quantized_recipe():
    with pytest.raises(InputError, match="plan.moe.router_padding"):
        _scenario({"preset": "qwen3-30b-a3b"}, ep=8, moe={"router_padding": True})
    plan = _scenario({"preset": "qwen3-30b-a3b"}, ep=8, precision="fp8", fp8_recipe="current",
                     moe={"router_padding": True}).plan
    assert plan.moe.router_padding


# ------------------------------------------------------------------ memory

def test_expert_states_shard_over_expert_dp_and_the_rest_over_dp():
    # Mixtral on 64 GPUs: tp 2, pp 2, dp 16, ep 4, etp 2 -> expert-DP = 64 / (2 * 4 * 2) = 4
    s = _scenario(MIXTRAL, cluster={"node": "dgx-h100", "nodes": 8}, tp=2, pp=2, sequence_parallel=True, ep=4,
                  etp=2, zero_stage=1, global_batch=256)
    first = compile_scenario(s).stages[0]
    experts = 16 * 2 * (3 * 4096 * 14336 // 2)  # 16 layers x 2 local experts x half of each expert's columns
    assert experts == 2_818_572_288
    per_layer = 4096 * (2048 + 2 * 512) + 2048 * 4096 + 2 * 4096 + 4096 * 8  # attention / tp 2, norms, router
    rest = 16 * per_layer + 32000 * 4096 // 2  # and half the embedding
    assert float(first.states.weights_bytes) == 2 * (rest + experts)
    assert float(first.states.gradients_bytes) == 4 * (rest + experts)
    assert float(first.states.optimizer_bytes) == pytest.approx(12 * (rest / 16 + experts / 4), rel=1e-12)


def test_one_device_holding_everything_holds_every_parameter():
    from dataclasses import replace
    for preset in ("mixtral-8x7b", "deepseek-v3"):
        s = _scenario({"preset": preset, "mtp_layers": 0, "seq_len": 1024})
        layout = compile_scenario(replace(s, plan=replace(s.plan, zero_stage=0)))
        assert float(layout.stages[0].params) == pytest.approx(s.model.params(), rel=1e-12)


# ------------------------------------------------------------------ Megatron-Core's expert layout

def test_folded_ep_group_sits_inside_etp_while_megatron_0_9_carves_it_out_of_dp():
    plan = {"tp": 4, "pp": 8, "cp": 2, "ep": 8, "micro_batch": 1, "global_batch": 64, "sequence_parallel": True,
            "vpp": 8, "schedule": "interleaved"}
    grok = {"preset": "grok-1"}
    cluster = {"node": "dgx-h100", "nodes": 64}
    folded = compile_scenario(scenario_from_dict({"model": grok, "cluster": cluster, "plan": plan})).groups
    old = compile_scenario(scenario_from_dict({"model": grok, "cluster": cluster,
                                               "plan": {**plan, "moe": {"folding": False}}})).groups
    # folded etp-ep-edp-pp: EP ranks 4 apart, 2 per node; 0.9's tp-cp-ep-dp-pp: 8 apart, 1 per node
    assert (folded.ep.local, folded.ep.domains) == (2, 4)
    assert (old.ep.local, old.ep.domains) == (1, 8)
    # expert gradients: 512 / (8 pipeline stages x ep 8 x etp 4) = 2 replicas either way
    assert folded.expert_grad.size == old.expert_grad.size == 2


def test_dense_results_report_parameters_and_no_all_to_all():
    d = evaluate(_scenario({"preset": "llama-3.1-8b"}), "analytic").to_dict()
    assert d["breakdown_s"]["ep_comm"] == 0.0
    assert d["parameters"] == d["active_parameters"] == pytest.approx(8.03e9, rel=1e-3)


# ------------------------------------------------------------------ the plan's rules

@pytest.mark.parametrize("model,plan,field", [
    (MIXTRAL, {"ep": 3}, "plan.ep"),  # 8 experts
    (MIXTRAL, {"ep": 8, "etp": 2}, "plan.ep"),  # ep x etp = 16 > the 8 devices of the stage
    (MIXTRAL, {"tp": 2, "ep": 4}, "plan.sequence_parallel"),
    ({"preset": "llama-3.1-8b"}, {"ep": 2}, "plan.ep"),
    (MIXTRAL, {"moe": {"pad_to_capacity": True}}, "plan.moe.pad_to_capacity"),
    (MIXTRAL, {"moe": {"ep_comm_overlap": True}}, "plan.moe.ep_comm_overlap"),
    (MIXTRAL, {"tp": 2, "sequence_parallel": True, "etp": 1, "moe": {"folding": False}}, "plan.moe.folding"),
])
def test_a_plan_the_experts_cannot_run_is_one_line_naming_the_field(model, plan, field):
    with pytest.raises(InputError, match="^" + field.replace(".", r"\.") + ": ") as err:
        _scenario(model, **plan)
    assert "\n" not in str(err.value)


def test_the_trace_shows_the_exposed_all_to_all_of_each_pass_on_an_ep_thread(tmp_path):
    from simulator.trace import trace_timeline, write_trace
    s = _scenario(MIXTRAL, ep=8, global_batch=16)
    trace = write_trace(s, str(tmp_path / "t.json"))
    df = trace_timeline(trace)
    ep = df[df.stream == "ep"]
    r = evaluate(s, "graph")
    # the forward and the backward pass of each of the 2 micro-batches per replica
    assert set(ep.name) == {"all-to-all F0.0", "all-to-all F0.1", "all-to-all B0.0", "all-to-all B0.1"}
    assert ep.duration_s.sum() == pytest.approx(r.breakdown_s["ep_comm"], rel=1e-6)


@pytest.mark.parametrize("recompute,per_row", [("none", 18), ("full", 24)])
def test_hardware_flops_count_the_quantized_experts_padded_rows(recompute, per_row):
    """Qwen3-30B-A3B under NVFP4 on a DGX B200 at EP 8: each of the 16 local experts pads
    127 / 2 rows on average, every device, MoE layer (48) and micro-batch (2); a padded row costs
    its expert's gated fc1 and fc2, 6 x 2048 x 768 FLOPs forward, 18 with the backward pass, 24
    when full recomputation re-runs the forward. Model FLOPs do not change."""
    base = {"model": {"preset": "qwen3-30b-a3b"}, "cluster": {"node": "dgx-b200", "nodes": 1},
            "plan": {"tp": 1, "pp": 1, "dp": 8, "ep": 8, "micro_batch": 1, "global_batch": 16,
                     "recompute": recompute}}
    layouts = {p: compile_scenario(scenario_from_dict({**base, "plan": {**base["plan"], "precision": p}}))
               for p in ("bf16", "nvfp4")}
    padding = 8 * 48 * 2 * 16 * 127 / 2 * per_row * 2048 * 768
    assert layouts["nvfp4"].hardware_flops_per_step - layouts["bf16"].hardware_flops_per_step == pytest.approx(
        padding, rel=1e-12)
    assert layouts["nvfp4"].model_flops_per_step == layouts["bf16"].model_flops_per_step
