"""plan.loss: the logits memory of unfused, vocab-parallel, chunked, fused and loss-parallel lm_head +
cross-entropy for a 128k vocabulary, worked from the formulas in simulator/loss.py."""

import pytest

from simulator import InputError, evaluate

T, H, V, A = 8192, 4096, 128256, 2  # tokens per micro-batch, hidden, vocab, bf16 bytes
N = T * V  # logits of one micro-batch


def llama8b(scenario, loss, **plan):
    # one device, no recomputation: the head's bytes sit on top of the in-flight layers
    plan = {"tp": 1, "dp": 8, **plan}
    return scenario(model={"preset": "llama-3.1-8b"}, cluster={"node": "dgx-h100", "nodes": 1},
                    pp=1, micro_batch=1, global_batch=8, loss=loss, **plan)


def head_extra(s):
    from simulator.evaluate import compile_scenario

    return float(compile_scenario(s).stages[0].activations.extra_bytes)


def test_unfused_head_holds_the_fp32_softmax_and_two_gradients(scenario):
    # final norm input + lm_head input (bf16) + fp32 softmax + two fp32 logits gradients
    assert head_extra(llama8b(scenario, "unfused")) == 2 * A * T * H + 4 * N + 8 * N


def test_fused_loss_removes_the_logits_from_peak_memory(scenario):
    # Cut Cross-Entropy: norm and lm_head inputs, one fp32 log-sum-exp per token
    fused = head_extra(llama8b(scenario, "fused"))
    assert fused == 2 * A * T * H + 4 * T
    assert head_extra(llama8b(scenario, "unfused")) - fused == 12 * N - 4 * T  # 12.6 GB at 128k vocab
    d_unfused = evaluate(llama8b(scenario, "unfused"), "analytic").to_dict()
    d_fused = evaluate(llama8b(scenario, "fused"), "analytic").to_dict()
    saved = (d_unfused["memory_gib"]["activations"] - d_fused["memory_gib"]["activations"]) * 2**30
    assert saved == pytest.approx(12 * N - 4 * T, rel=1e-12)


def test_loss_parallel_head_holds_the_fp32_log_softmax_and_three_backward_buffers(scenario):
    # DTensor's loss_parallel over TP 2 (no SP: norm and lm_head inputs whole): the saved fp32
    # log-softmax and, in the fused nll/log-softmax backward, zeros_like, exp and their sum
    n = T * V / 2
    s = llama8b(scenario, "loss-parallel", tp=2, dp=4)
    assert head_extra(s) == 2 * A * T * H + 4 * n + 12 * n
    assert head_extra(llama8b(scenario, "unfused", tp=2, dp=4)) == 2 * A * T * H + 12 * n


def test_loss_parallel_moves_38_bytes_per_logit_each_way():
    from simulator.model import load_preset
    from simulator.workload import Shard, head_ops

    shard = Shard(micro_batch=1, seq_len=T, tp=2, loss="loss-parallel")
    ce = next(op for op in head_ops(load_preset("llama-3.1-8b"), shard) if op.name == "cross_entropy")
    # forward: upcast 2 + 4, max 4, shift 4 + 4, exp 4 + 4, sum 4, result 4 + 4;
    # backward: zeros 4, exp 4 + 4, add 8 + 4, multiply 4 + 4, downcast 4 + 2
    assert (ce.fwd_bytes, ce.bwd_input_bytes, ce.saved_bytes) == (38 * T * V / 2, 38 * T * V / 2, 4 * T * V / 2)


def test_megatron_vocab_parallel_head_holds_its_one_fp32_buffer_and_the_gradients_16_bit_copy(scenario):
    # _VocabParallelCrossEntropy: the upcast logits turned into the softmax in place and saved,
    # the gradient computed in that buffer, and autograd's bf16 copy of it for the logits
    n = T * V / 2
    assert head_extra(llama8b(scenario, "vocab-parallel", tp=2, dp=4)) == 2 * A * T * H + 4 * n + A * n
    assert head_extra(llama8b(scenario, "vocab-parallel")) == 2 * A * T * H + 4 * N + A * N  # without TP too


def test_megatron_vocab_parallel_on_fp32_logits_needs_no_16_bit_copy(scenario):
    assert head_extra(llama8b(scenario, "vocab-parallel", precision="fp32")) == 2 * 4 * T * H + 4 * N


def test_megatron_vocab_parallel_moves_38_bytes_per_logit_forward_and_14_backward():
    from simulator.model import load_preset
    from simulator.workload import Shard, head_ops

    shard = Shard(micro_batch=1, seq_len=T, tp=2, loss="vocab-parallel")
    ce = next(op for op in head_ops(load_preset("llama-3.1-8b"), shard) if op.name == "cross_entropy")
    # forward: upcast 2 + 4, max 4, subtract 4 + 4, exp 4 + 4, sum 4, divide 4 + 4 (in place);
    # backward: scale 4 + 4 (in place), downcast 4 + 2
    assert (ce.fwd_bytes, ce.bwd_input_bytes, ce.saved_bytes) == (38 * T * V / 2, 14 * T * V / 2, 4 * T * V / 2)


def test_loss_parallel_needs_a_tp_group(scenario):
    with pytest.raises(InputError, match="plan.loss.*tp > 1"):
        llama8b(scenario, "loss-parallel")


def test_chunked_loss_holds_one_chunk_and_the_saved_gradients(scenario):
    # Liger: chunk = next_pow2(8192 / ceil(128256 / 4096) = 32) = 256 tokens; the norm input,
    # grad_input (T x H) and grad_weight (V x H) in bf16, one chunk in fp32 + two bf16 copies
    c = 256
    assert head_extra(llama8b(scenario, "chunked")) == A * T * H + A * T * H + A * V * H + (4 + 2 * A) * c * V
    c = 1024
    assert head_extra(llama8b(scenario, "chunked", loss_chunk_tokens=c)) == \
        2 * A * T * H + A * V * H + (4 + 2 * A) * c * V


def test_fused_loss_recomputes_the_logits_gemm(scenario):
    unfused = evaluate(llama8b(scenario, "unfused"), "analytic")
    fused = evaluate(llama8b(scenario, "fused"), "analytic")
    chunked = evaluate(llama8b(scenario, "chunked"), "analytic")
    # one more T x H x V GEMM per sequence, 8 sequences; model FLOPs unchanged
    assert fused.hardware_flops_per_step - unfused.hardware_flops_per_step == pytest.approx(8 * 2 * T * H * V)
    assert fused.model_flops_per_step == unfused.model_flops_per_step == chunked.model_flops_per_step
    assert chunked.hardware_flops_per_step == pytest.approx(unfused.hardware_flops_per_step)


def test_a_chunk_size_needs_the_chunked_loss(scenario):
    with pytest.raises(InputError, match="plan.loss_chunk_tokens"):
        llama8b(scenario, "fused", loss_chunk_tokens=512)
    with pytest.raises(InputError, match="plan.loss"):
        llama8b(scenario, "cut")
