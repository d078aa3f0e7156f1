"""Per-layer activation bytes equal Korthikanti et al. 2022 (Sec. 4, Table 2), worked by hand."""

import pytest

from simulator.memory import layer_saved_bytes
from simulator.model import ModelSpec
from simulator.schedules import SCHEDULES
from simulator.workload import Shard

S, B, H, A = 2048, 4, 6144, 48  # the paper's 22B-like shape


def gpt():
    return ModelSpec(name="gpt", layers=48, hidden=H, heads=A, kv_heads=A, ffn_hidden=4 * H, vocab=51200,
                     seq_len=S, activation="gelu", dropout=True)


def layer_activation_bytes(model, shard, recompute="none"):
    return layer_saved_bytes(model, shard, recompute)


def plan(tp=1, sequence_parallel=False, flash_attention=False, recompute="none"):
    """The per-device geometry of one micro-batch, and the recompute mode."""
    return Shard(micro_batch=B, seq_len=S, tp=tp, sp=sequence_parallel and tp > 1,
                 flash_attention=flash_attention), recompute


def sbh():
    return S * B * H


def test_no_parallelism_is_sbh_34_plus_5as_over_h():
    assert layer_activation_bytes(gpt(), *plan()) == pytest.approx(sbh() * (34 + 5 * A * S / H))


@pytest.mark.parametrize("t", [2, 4, 8])
def test_tensor_parallel_is_sbh_10_plus_24_over_t_plus_5as_over_ht(t):
    expected = sbh() * (10 + 24 / t + 5 * A * S / (H * t))
    assert layer_activation_bytes(gpt(), *plan(tp=t)) == pytest.approx(expected)


@pytest.mark.parametrize("t", [2, 8])
def test_tensor_plus_sequence_parallel_divides_everything_by_t(t):
    expected = sbh() * (34 + 5 * A * S / H) / t
    assert layer_activation_bytes(gpt(), *plan(tp=t, sequence_parallel=True)) == pytest.approx(expected)


def test_selective_recompute_drops_the_5as_over_h_term():
    expected = sbh() * 34 / 8
    got = layer_activation_bytes(gpt(), *plan(tp=8, sequence_parallel=True, recompute="selective"))
    assert got == pytest.approx(expected)


def test_full_recompute_keeps_2sbh_per_layer():
    assert layer_activation_bytes(gpt(), *plan(tp=8, recompute="full")) == pytest.approx(2 * sbh())


def test_flash_attention_keeps_no_score_matrix():
    # Korthikanti's 34·sbh without the two 1-byte residual dropout masks and without the 5as/h
    # score tensors, plus the kernel's fp32 log-sum-exp (4·b·a·s bytes).
    m = ModelSpec(**{**gpt().__dict__, "dropout": False})
    expected = sbh() * (34 - 2) + 4 * B * A * S
    assert layer_activation_bytes(m, *plan(flash_attention=True)) == pytest.approx(expected)


@pytest.mark.parametrize("p,stage", [(4, 0), (4, 3), (8, 2)])
def test_1f1b_stage_holds_p_minus_stage_microbatches(p, stage):
    assert SCHEDULES["1f1b"].in_flight(p, 64, 1, stage)[0] == p - stage


def test_gpipe_holds_every_microbatch():
    assert SCHEDULES["gpipe"].in_flight(4, 64, 1, 0)[0] == 64


@pytest.mark.parametrize("p,v", [(4, 2), (8, 3), (16, 2)])
def test_interleaved_first_stage_matches_korthikanti_factor(p, v):
    chunks, _ = SCHEDULES["interleaved"].in_flight(p, 4 * p, v, 0)
    # Korthikanti et al. 2022, Sec. 4.2.3: p micro-batches times (1 + (p-1)/(p v)), in chunks of L/(p v) layers
    assert chunks / v == pytest.approx(p * (1 + (p - 1) / (p * v)))


def test_a_fully_recomputed_layers_backward_holds_its_mlp_gradients_beside_its_activations():
    """Beyond the re-run layer's activations: the layer output's gradient on the sequence shard
    (s·b/t x h) and, at the MLP activation, the gradient of its input (4h/t wide for GELU);
    bf16, t = 2 with sequence parallelism, no head on the stage."""
    from simulator.memory import layer_activations, stage_activations
    from simulator.plan import Plan
    from simulator.workload import layer_ops

    model, t = gpt(), 2
    shard = Shard(micro_batch=B, seq_len=S, tp=t, sp=True, flash_attention=True)
    full = Plan(tp=t, sequence_parallel=True, recompute="full")
    rebuilt = sum(op.saved_bytes for op in layer_ops(model, shard))
    extra = stage_activations(layer_activations(model, shard, full), full, 4, False, False).extra_bytes
    assert float(extra) - rebuilt == pytest.approx(2 * (S * B / t * H + S * B * 4 * H / t))
    none = Plan(tp=t, sequence_parallel=True)
    assert float(stage_activations(layer_activations(model, shard, none), none, 4, False, False).extra_bytes) == 0.0


def test_sequential_experts_hold_one_experts_activation_gradient_at_a_time():
    """Megatron-Core's SequentialMLP runs each local expert's backward alone: 8 experts over
    2·s·b routed rows hold 2·s·b/8 rows of gradient (4h wide for GELU), fp32 here."""
    from simulator.memory import rerun_gradient_bytes
    from simulator.moe import ExpertShard, MoEOptions
    from simulator.workload import layer_ops

    moe = ModelSpec(name="moe", layers=4, hidden=256, heads=8, kv_heads=8, ffn_hidden=1024, vocab=2048, seq_len=256,
                    activation="gelu", experts=8, top_k=2, expert_ffn_hidden=1024)
    shard = Shard(micro_batch=2, seq_len=256, act_bytes=4)
    tokens = 2 * 256
    for grouped, rows in ((True, 2 * tokens), (False, 2 * tokens / 8)):
        ops = layer_ops(moe, shard, ExpertShard(1, 1, MoEOptions(grouped_gemm=grouped)))
        assert float(rerun_gradient_bytes(moe, shard, ops)) == 4 * (tokens * 256 + rows * 1024)
