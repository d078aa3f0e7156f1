"""Multi-token prediction (DeepSeek-V3, arXiv 2412.19437 Sec. 2.2) as Megatron-Core trains it.

Each of the model's `mtp_layers` depths runs, after the main decoder, on the pipeline stage
that holds the output head (Megatron-Core's default placement: docs/user-guide/features/
multi_token_prediction.md, "all MTP layers sit on the last pipeline stage"): the embedding
of the tokens shifted by one more position (that stage builds its own copy of the embedding:
megatron/core/models/gpt/gpt_model.py, `if self.pre_process or self.mtp_process`), RMSNorms
of that embedding and of the previous depth's hidden state, their concatenation projected by
`eh_proj` (2h -> h, column-parallel, its output gathered over TP and scattered back to the
sequence shards: megatron/core/transformer/multi_token_prediction.py, `_concat_embeddings`),
one transformer layer of the kind of the decoder's last layer, and the shared output head and
its cross-entropy (Megatron-LM@d98e8a6). Megatron-Core counts the same FLOPs: one layer
per depth of the last layer's kind, 3h norm and 2h·h projection terms, and (depths + 1)
logits (megatron/training/training.py, num_floating_point_operations).

This module gives the operators of a depth outside its transformer layer, its TP collectives
and its parameters; layermix.py adds the layers to the head stage, layout.py the head's
operators, workload.py the FLOPs.

Not modelled: eh_proj as an FP8 GEMM under an FP8 recipe (it runs at the BF16 rate here; it is
2h x h per token against a layer's tens of h x h), the all-reduce of the embedding copy's
gradients with the first stage (as for tied embeddings, which llmsim does not time either),
and where the layers of an interleaved schedule's chunks differ, the depth's layer is
spread over the head stage's chunks (as uneven chunks are: layermix.py).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from .comm import collective_time
from .errors import InputError
from .workload import Op, Shard, _linear, embedding_ops, head_ops, norm_op


def depth_ops(model, shard: Shard) -> list[Op]:
    """One depth's operators but its transformer layer: embedding, the two norms, eh_proj,
    the final norm, the shared lm_head and the loss (names prefixed `mtp.`)."""
    a, rep, h = shard.act_bytes, shard.replicated_tokens, model.hidden
    ops = [*embedding_ops(model, shard), norm_op("enorm", model, shard), norm_op("hnorm", model, shard),
           _linear("eh_proj", shard.tokens, 2 * h, h / shard.tp, a, a * rep * 2 * h),
           *head_ops(model, shard)]
    return [_prefixed(op) for op in ops]


def _prefixed(op: Op) -> Op:
    return replace(op, name="mtp." + op.name)


def eh_proj_tp_comm_s(model, shard: Shard, groups, cluster) -> tuple:
    """(forward, backward) TP seconds of one depth's projection. With sequence parallelism:
    forward, the column-parallel all-gather of the 2h-wide input and the all-gather of the
    h-wide output over TP; backward, the input gradient's reduce-scatter, the input's
    all-gather again for the weight gradient, and the all-gather that undoes the scatter to
    the sequence shards. Without: forward the output's all-gather, backward the input
    gradient's all-reduce."""
    token_bytes = shard.act_bytes * shard.tokens * model.hidden
    tp = groups.tp
    if shard.sp:
        wide = collective_time("all_gather", 2 * token_bytes, tp, cluster)
        out = collective_time("all_gather", token_bytes, tp, cluster)
        return wide + out, collective_time("reduce_scatter", 2 * token_bytes, tp, cluster) + wide + out
    return (collective_time("all_gather", token_bytes, tp, cluster),
            collective_time("all_reduce", 2 * token_bytes, tp, cluster))


def depth_params(model, tp) -> object:
    """Parameters of one depth on a TP rank, its transformer layer excepted: eh_proj and the
    three norms (enorm, hnorm, the final norm)."""
    return 2 * model.hidden * model.hidden / np.asarray(tp) + 3 * model._norm(model.hidden)


def embedding_copy_params(model, tp, has_embedding, has_head) -> object:
    """The embedding table the head stage builds for its depths when it does not hold the
    embedding already; a tied head is that table (states.stage_params counts it)."""
    if model.tied_embeddings:
        return 0.0 * np.asarray(has_head)
    return np.asarray(has_head) * (1 - np.asarray(has_embedding)) * model.embedding_params() / np.asarray(tp)


def layer_is_moe(model) -> bool:
    """Whether a depth's transformer layer is an MoE layer: the decoder's last layer's kind
    (Megatron-LM training.py: `last_layer_is_moe`)."""
    return model.is_moe_layer(model.layers - 1)


def with_depths(model, dense_layers, moe_layers, depths):
    """(dense-MLP, MoE) layers counting `depths` multi-token-prediction depths, each a layer of
    the decoder's last layer's kind (layer_is_moe). Broadcast-safe."""
    if layer_is_moe(model):
        return dense_layers, moe_layers + depths
    return dense_layers + depths, moe_layers


def check_mtp_plan(plan, model) -> None:
    """What Megatron-Core does not run with MTP (multi_token_prediction.md, "Unsupported
    Combinations"): context parallelism, learned absolute position embeddings."""
    if not model.mtp_layers:
        return
    if plan.cp > 1:
        raise InputError("plan.cp", plan.cp, "1 with multi-token prediction (Megatron-Core does not support MTP "
                         "with context parallelism)")
    if model.position_embedding == "learned":
        raise InputError("model.position_embedding", model.position_embedding, "rope or none with multi-token "
                         "prediction (Megatron-Core does not support MTP with learned absolute positions)")
