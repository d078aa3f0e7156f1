"""PyTorch's pipeline runtime (plan.pp_impl: torch): the receive buffers, outputs and input
gradients torch.distributed.pipelining holds beside the saved activations (pipebuffers.py).

The hand-worked counts: 1F1B over p = 4 stages with m = 8 micro-batches; X is one
micro-batch's activation between stages (its 16-bit hidden states, split over the TP ranks
by sequence parallelism), L the last stage's 16-bit logits (split over TP). Stage i holds
p - i micro-batches in flight; its peak is after its last forward, when 8 - (p - i)
backwards are done (each backward frees a micro-batch's activations, which outweigh what
it adds)."""

import pytest

from simulator import InputError, pipebuffers
from simulator.engine import simulate
from simulator.evaluate import compile_scenario
from simulator.scenario import scenario_from_dict

TOKENS, HIDDEN, VOCAB, TP = 1 * 2048, 4096, 128256, 2
X = 2 * TOKENS * HIDDEN / TP
L = 2 * TOKENS * VOCAB / TP


def scenario(**plan):
    base = dict(tp=TP, pp=4, micro_batch=1, global_batch=8 * 2, schedule="1f1b", zero_stage=1, recompute="full",
                sequence_parallel=True)
    return scenario_from_dict({"model": {"preset": "llama-3.1-8b", "seq_len": 2048},
                               "cluster": {"node": "dgx-h100", "nodes": 2}, "plan": {**base, **plan}})


def activation_peaks(s, engine):
    layout = compile_scenario(s)
    if engine == "graph":
        return list(simulate(layout, periodic=False).activation_peak_bytes)
    return [float(layout.stage_memory(layout.representative(i), i).activations) for i in range(4)]


def added_bytes(engine, **plan):
    torch, megatron = scenario(pp_impl="torch", **plan), scenario(pp_impl="megatron")
    return [t - m for t, m in zip(activation_peaks(torch, engine), activation_peaks(megatron, engine))]


@pytest.mark.parametrize("engine", ["graph", "analytic"])
def test_every_stage_keeping_its_outputs_adds_the_hand_counted_buffers(engine):
    # torch <= 2.7: stage 0 holds 8 gradient receive buffers and its 8 outputs; a middle
    # stage (3 in flight) 8 + 8 receive buffers, 5 idle of the first, 5 input gradients, 8
    # outputs; the last stage 8 activation buffers (7 idle), 7 input gradients, 8 logits
    added = added_bytes(engine, pp_outputs="every-stage")
    assert added[0] == pytest.approx(16 * X, rel=1e-12)
    assert added[1] == pytest.approx((16 - 3 + 5 + 8) * X, rel=1e-12)
    assert added[3] == pytest.approx((8 - 1 + 7) * X + 8 * L, rel=1e-12)


@pytest.mark.parametrize("engine", ["graph", "analytic"])
def test_outputs_kept_only_in_flight_leave_the_receive_buffers_and_input_gradients(engine):
    # torchtitan's step(return_outputs=False): outputs live from their forward to their backward
    added = added_bytes(engine, pp_outputs="in-flight")
    assert added[0] == pytest.approx((8 + 4) * X, rel=1e-12)
    assert added[1] == pytest.approx((16 - 3 + 5 + 3) * X, rel=1e-12)
    assert added[3] == pytest.approx((8 - 1 + 7) * X + L, rel=1e-12)


def test_the_last_stage_alone_keeping_its_logits_is_the_default():
    assert added_bytes("analytic") == added_bytes("analytic", pp_outputs="last-stage")
    added = added_bytes("analytic", pp_outputs="last-stage")
    assert added[3] == pytest.approx((8 - 1 + 7) * X + 8 * L, rel=1e-12)
    assert added[1] == pytest.approx((16 - 3 + 5 + 3) * X, rel=1e-12)


@pytest.mark.parametrize("schedule, extra", [("interleaved", {"vpp": 2}), ("gpipe", {}), ("zb-h1", {}),
                                             ("zb-v", {}), ("dualpipe-v", {})])
@pytest.mark.parametrize("outputs", ["in-flight", "last-stage", "every-stage"])
def test_the_engines_agree_on_the_torch_pipelines_peak(schedule, extra, outputs):
    # the analytic engine's largest sum over the stage's forwards is the executed timeline's
    # peak, also where kept logits outgrow what later backwards free (V shapes)
    s = scenario(pp_impl="torch", pp_outputs=outputs, schedule=schedule, global_batch=2 * 16, **extra)
    assert activation_peaks(s, "analytic") == pytest.approx(activation_peaks(s, "graph"), rel=1e-12)


@pytest.mark.parametrize("schedule, extra", [("1f1b", {}), ("interleaved", {"vpp": 2})])
def test_buffers_growing_with_the_micro_batches_extrapolate_to_the_full_execution(schedule, extra):
    layout = compile_scenario(scenario(pp_impl="torch", pp_outputs="every-stage", schedule=schedule,
                                       global_batch=2 * 48, **extra))
    fast, full = simulate(layout, periodic=True), simulate(layout, periodic=False)
    assert fast.extrapolated
    assert fast.activation_peak_bytes == pytest.approx(full.activation_peak_bytes, rel=1e-9)


def test_without_a_pipeline_the_runtime_holds_nothing():
    torch, megatron = (compile_scenario(scenario(pp=1, global_batch=16, pp_impl=impl)) for impl in ("torch", "megatron"))
    assert torch.pipe is None
    assert torch.stage_memory(torch.stages[0]) == megatron.stage_memory(megatron.stages[0])


def test_kept_outputs_are_refused_for_megatrons_pipeline():
    with pytest.raises(InputError, match="plan.pp_outputs"):
        scenario(pp_outputs="every-stage")


def test_activation_offload_is_refused_with_the_torch_pipeline():
    with pytest.raises(InputError, match="plan.offload.activations"):
        scenario(pp_impl="torch", offload={"activations": "cpu"})


def test_the_turn_of_a_v_hands_its_output_over_as_the_receive_buffer():
    # set_local_fwd_input / set_local_bwd_input: the sender's output and the receiver's input
    # gradient are the buffers themselves; both keep their m receive buffers
    b = pipebuffers.PipeBuffers(boundary_bytes=X, logits_bytes=L, outputs="in-flight")
    assert pipebuffers.chunk_events(b, 8, False, False) == (16 * X, 0.0, X)
    assert pipebuffers.chunk_events(b, 8, False, False, local_out=True) == (16 * X, -X, X)
    assert pipebuffers.chunk_events(b, 8, False, False, local_in=True) == (16 * X, 0.0, 0.0)
