"""The lm_head and cross-entropy of the last virtual stage, computed five ways (`plan.loss`).

Per device, T tokens of a micro-batch, hidden h, local vocabulary v = V/t (vocab-parallel
lm_head), a bytes per 16-bit element; N = T·v logits.

- unfused (workload.head_ops): the lm_head GEMM writes N logits, the cross-entropy upcasts
  them and keeps the fp32 softmax (4·N bytes) for the backward (Korthikanti et al. 2022,
  Sec. 4.3), whose start materialises two more fp32 logits-sized gradients
  (workload.loss_backward_transient_bytes): 12·N bytes at the head's peak.
- vocab-parallel: Megatron-LM's _VocabParallelCrossEntropy, under Megatron-LM, Megatron-Core,
  NeMo and Megatron-DeepSpeed (NVIDIA/Megatron-LM@00611e6eeb
  megatron/core/tensor_parallel/cross_entropy.py; the fused variant,
  cross_entropy_loss_fusion, runs the same steps). It upcasts the 16-bit logits to fp32 once
  and then works in place: subtracts the all-reduced max, exponentiates, divides by the
  all-reduced sum, and saves that buffer as the softmax (4·N); the backward subtracts one at
  the targets and scales by the incoming gradient in the same buffer, which autograd casts to
  the logits' 16-bit dtype: 4·N + a·N bytes at the head's peak. Bytes moved per logit:
  forward a + 36 (upcast a + 4, max 4, subtract 8, exp 8, sum 4, divide 8), backward 12 + a
  (scale 8, downcast 4 + a); fp32 logits skip both casts.
- loss-parallel: PyTorch's DTensor loss parallelism over the TP group, as torchtitan runs it
  (pytorch/torchtitan@9dec370 train.py: `loss_fn` = cross_entropy(pred.float(), labels)
  under `loss_parallel()`, `del pred` before the backward; pytorch/pytorch
  torch/distributed/tensor/parallel/loss.py `_log_softmax` and
  `_nll_loss_and_log_softmax_backward`). The log-softmax is written out in fp32 eager ops
  (upcast, max, shifted = x - max, exp, sum, result = shifted - log-sum-exp) and keeps its
  fp32 result (4·N) for the backward. The backward of nll_loss and log-softmax is one
  function that builds zeros_like(x), exp(x), their sum and the product with the incoming
  gradient: three fp32 logits-sized buffers beside the saved result when the add runs, 16·N
  bytes at the head's peak where the unfused loss holds 12·N. Bytes moved per logit: forward
  a + 36 (upcast a + 4, max 4, shift 8, exp 8, sum 4, result 8), backward 36 + a (zeros 4,
  exp 8, add 12, multiply 8, downcast 4 + a). Needs tp > 1: without a TP group torchtitan
  calls the plain cross-entropy, which is `unfused`.
- chunked: Liger kernel's FusedLinearCrossEntropy (linkedin/Liger-Kernel@e11c2d6
  src/liger_kernel/ops/fused_linear_cross_entropy.py). The forward walks the tokens in
  chunks of c: per chunk it computes the logits (16-bit), upcasts them to fp32, runs the
  cross-entropy kernel that overwrites them with their gradient, casts back and scales,
  then runs the input- and weight-gradient GEMMs at once. It saves only grad_input (T·h)
  and grad_weight (v·h, zeros_like the weight) for the backward, which merely returns
  them; the lm_head input is not kept. Held at once: one chunk's logits in fp32 and two
  16-bit copies, (4 + 2a)·c·v bytes. Default c: Liger's rule, the next power of two of
  T / ceil(v/h) (chunk logits about the size of the input).
- fused: Cut Cross-Entropy (Wijmans et al. 2024, "Cut Your Losses in Large-Vocabulary
  Language Models", arXiv 2411.09009; apple/ml-cross-entropy) and the projection-to-loss
  kernel of Chang & Dong 2025 ("From Projection to Prediction", arXiv 2511.17599): the
  logits live only in on-chip memory. The forward keeps the input and one fp32 log-sum-exp
  per token; the backward recomputes the logits blockwise (one more lm_head GEMM: executed
  FLOPs 8·T·h·v where the math needs 6) and accumulates both gradients. No logits-sized
  tensor ever reaches HBM.
"""

from __future__ import annotations

import numpy as np

from .states import FP32_BYTES
from .workload import MATMUL, MEMORY, Op, Shard

LOSSES = ("unfused", "vocab-parallel", "fused", "chunked", "loss-parallel")


def liger_chunk_tokens(tokens, vocab_local, hidden):
    """Liger's chunk: next_power_of_2(cdiv(T, cdiv(v, h))) (fused_linear_cross_entropy.py,
    `inc_factor`, `chunk_size`); never more than the tokens rounded up to a power of two."""
    inc = np.ceil(np.asarray(vocab_local, dtype=float) / hidden)
    return 2.0 ** np.ceil(np.log2(np.ceil(np.asarray(tokens, dtype=float) / inc)))


def chunk_tokens(model, shard: Shard):
    """Tokens per chunk of the chunked loss: the plan's `loss_chunk_tokens` or Liger's rule,
    at most the micro-batch's tokens."""
    v = model.vocab / shard.tp
    chunk = liger_chunk_tokens(shard.tokens, v, model.hidden) if shard.loss_chunk_tokens is None \
        else shard.loss_chunk_tokens
    return np.minimum(chunk, shard.tokens)


def cross_entropy_op(loss: str, logits, act_bytes) -> Op:
    """The cross-entropy of the `loss-parallel` or `vocab-parallel` loss over `logits` local
    logits, after the unfused path's lm_head (module docstring), the fp32 (log-)softmax kept:
    DTensor's a + 36 bytes per logit each way; Megatron-LM's in-place one a + 36 forward and
    12 + a backward (fp32 logits need no upcast or downcast: 32 and 8)."""
    if loss == "loss-parallel":
        fwd = bwd = act_bytes + 36
    else:
        cast = act_bytes + 4 if act_bytes < FP32_BYTES else 0
        fwd, bwd = cast + 32, cast + 8
    return Op("cross_entropy", MEMORY, fwd_bytes=fwd * logits, bwd_input_bytes=bwd * logits, saved_bytes=4 * logits)


def loss_ops(model, shard: Shard) -> list[Op]:
    """lm_head + cross-entropy operators of the `chunked` or `fused` loss (module docstring)."""
    a, tokens = shard.act_bytes, shard.tokens
    h, v = model.hidden, model.vocab / shard.tp
    gemm = 2 * tokens * h * v
    if shard.loss == "chunked":
        io = a * (tokens * (h + v) + h * v)  # one GEMM's traffic, the chunk logits included
        return [
            # logits, grad_input and grad_weight GEMMs all run in the forward
            Op("lm_head", MATMUL, fwd_flops=3 * gemm, fwd_bytes=3 * io,
               saved_bytes=a * tokens * h + a * h * v),  # grad_input, grad_weight
            # upcast (a+4), in-place kernel (4+4), downcast (4+a), scale (2a) per logit
            Op("cross_entropy", MEMORY, fwd_bytes=(12 + 4 * a) * tokens * v),
        ]
    if shard.loss == "fused":
        io = a * (tokens * h + h * v)  # reads the input and the weight; logits stay on chip
        return [Op("lm_head", MATMUL, fwd_flops=gemm, bwd_input_flops=2 * gemm, bwd_weight_flops=gemm,
                   fwd_bytes=io + 4 * tokens, bwd_input_bytes=2 * io + a * tokens * h,
                   bwd_weight_bytes=io + a * h * v,
                   saved_bytes=a * shard.replicated_tokens * h + 4 * tokens,  # input, fp32 log-sum-exp
                   model_flops=3 * gemm)]
    raise ValueError(shard.loss)


def loss_transient_bytes(model, shard: Shard):
    """Bytes the loss holds on top of its saved tensors at the head's peak: one chunk's
    logits in fp32 plus two 16-bit copies (chunked), nothing logits-sized (fused), three fp32
    logits-sized buffers in the fused nll/log-softmax backward (loss-parallel), the gradient's
    16-bit copy beside the fp32 one it was computed in (vocab-parallel)."""
    if shard.loss == "loss-parallel":
        return 3 * 4 * shard.tokens * model.vocab / shard.tp
    if shard.loss == "vocab-parallel":  # no copy where the logits are fp32 already
        return (shard.act_bytes < FP32_BYTES) * shard.act_bytes * shard.tokens * model.vocab / shard.tp
    if shard.loss == "chunked":
        return (4 + 2 * shard.act_bytes) * chunk_tokens(model, shard) * model.vocab / shard.tp
    return 0.0 * shard.tokens
