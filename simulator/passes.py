"""Per-micro-batch pass times of one device of a pipeline stage.

Per micro-batch a stage's device runs the forward, input-gradient and weight-gradient
kernels of its layers (plus the embedding where the first virtual stage sits and the
lm_head and loss where the last one sits), the TP collectives inside each layer, the CP
ring exchange of keys and values, and activation recomputation. All numbers are seconds
per micro-batch, summed over the device's model chunks; they may be numpy arrays.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np

from .comm import collective_time, send_recv_time
from .compute import op_times
from .dims import Groups
from .hardware import Cluster
from .model import ModelSpec
from .workload import ATTENTION_CORE, Op, Shard


@dataclass(frozen=True)
class OpsTime:
    """Summed kernel seconds of a list of operators."""

    fwd_s: object
    bwd_input_s: object
    bwd_weight_s: object
    attention_fwd_s: object  # forward of the attention core (hides the CP exchange: cpattention.py)
    attention_bwd_s: object


def ops_time(ops: list[Op], cluster: Cluster, precision: str) -> OpsTime:
    acc = cluster.accelerator
    fwd = bwd_in = bwd_w = att_f = att_b = 0.0
    for op in ops:
        t = op_times(op, acc, precision)
        fwd, bwd_in, bwd_w = fwd + t.fwd_s, bwd_in + t.bwd_input_s, bwd_w + t.bwd_weight_s
        if op.group == ATTENTION_CORE:
            att_f, att_b = att_f + t.fwd_s, att_b + t.bwd_input_s + t.bwd_weight_s
    return OpsTime(fwd, bwd_in, bwd_w, att_f, att_b)


@dataclass(frozen=True)
class PassTimes:
    """Seconds per micro-batch on one device of a pipeline stage (all its chunks)."""

    fwd_s: object  # compute kernels
    bwd_input_s: object
    bwd_weight_s: object
    recompute_s: object
    tp_fwd_s: object  # exposed TP collectives of the forward pass
    tp_bwd_s: object
    tp_recompute_s: object
    cp_fwd_s: object  # exposed CP exchange
    cp_bwd_s: object
    cp_recompute_s: object
    ep_fwd_s: object = 0.0  # exposed MoE dispatch and combine (moe.py)
    ep_bwd_s: object = 0.0
    ep_recompute_s: object = 0.0

    @property
    def forward_s(self):
        """The forward passes as run: kernels and exposed collectives."""
        return self.fwd_s + self.tp_fwd_s + self.cp_fwd_s + self.ep_fwd_s

    @property
    def backward_input_s(self):
        """The input-gradient passes as run, with their recomputation."""
        return self.bwd_input_s + self.recompute_s + self.tp_bwd_s + self.cp_bwd_s + self.tp_recompute_s + \
            self.cp_recompute_s + self.ep_bwd_s + self.ep_recompute_s

    def __add__(self, other: "PassTimes") -> "PassTimes":
        """Two sets of layers on one device (dense-MLP and MoE layers) run one after the other."""
        return PassTimes(*(getattr(self, f.name) + getattr(other, f.name) for f in fields(PassTimes)))

    @property
    def compute_s(self):
        return self.fwd_s + self.bwd_input_s + self.bwd_weight_s

    @property
    def total_s(self):
        return self.forward_s + self.backward_input_s + self.bwd_weight_s


def tp_layer_comm_s(model: ModelSpec, shard: Shard, groups: Groups, cluster: Cluster, gather_factor=(1.0, 1.0)):
    """TP communication of one layer per micro-batch: (forward, backward) seconds.

    Two all-reduces of the b·s·h activation per layer in the forward pass and two in the
    backward pass (Shoeybi et al. 2019, Megatron-LM). With sequence parallelism each
    becomes an all-gather plus a reduce-scatter of the same volume (Korthikanti 2022), and
    the backward pass all-gathers the sequence-sharded input of the two column-parallel
    GEMMs again for their weight gradients (Megatron-LM
    LinearWithGradAccumulationAndAsyncCommunication.backward), where DTensor's linears kept
    the gathered input (Shard.tp_keeps_gathered). `gather_factor` scales the bytes of the
    (forward, backward) all-gathers (quantized all-gathers: fp8.tp_gather_bytes_factor).

    A parallel block (model.parallel_block) reduces the sum of its two branches once in the
    forward pass (EleutherAI/gpt-neox@ea7aefd8 megatron/model/transformer.py: "we can do a
    single allreduce after we add mlp / attn outputs", a reduce-scatter under sequence
    parallelism); both branches' column-parallel inputs still gather (forward) and reduce
    their gradients (backward), and the one reduce's backward is one gather or nothing.
    """
    nbytes = shard.act_bytes * shard.tokens * model.hidden
    reduces = 1 if model.parallel_block else 2  # forward reduces of the branches' outputs
    if shard.sp:
        forward_factor, backward_factor = gather_factor
        gather = collective_time("all_gather", backward_factor * nbytes, groups.tp, cluster)
        scatter = collective_time("reduce_scatter", nbytes, groups.tp, cluster)
        fwd = 2 * collective_time("all_gather", forward_factor * nbytes, groups.tp, cluster) + reduces * scatter
        regather = 0.0 if shard.tp_keeps_gathered else 2 * gather
        return fwd, reduces * gather + 2 * scatter + regather
    reduce = collective_time("all_reduce", nbytes, groups.tp, cluster)
    return reduces * reduce, 2 * reduce


def pp_hop_s(model: ModelSpec, shard: Shard, groups: Groups, cluster: Cluster, scatter_gather: bool = True):
    """One pipeline send of a micro-batch's activation or gradient, per TP rank: 1/t of it
    with Megatron-LM's scatter/gather optimisation or sequence parallelism, the whole of it
    otherwise (plan.pp_scatter_gather). The receivers' all-gather over NVLink is not timed."""
    split = np.where(np.logical_or(scatter_gather, shard.sp), shard.tp, 1)
    nbytes = shard.act_bytes * shard.tokens * model.hidden / split
    return np.where(np.asarray(groups.pp.size) > 1, send_recv_time(nbytes, groups.pp_crosses_domain, cluster), 0.0)


def pass_times(layer: OpsTime, layers, embedding: OpsTime, head: OpsTime, has_embedding, has_head,
               tp_layer_s: tuple, cp_layer_s: tuple, rerun_s, rerun_layers, tp_rerun, cp_rerun: bool,
               ep_layer_s: tuple = (0.0, 0.0), ep_rerun=0.0) -> PassTimes:
    """Seconds per micro-batch of a device holding `layers` layers (and the embedding and
    head where flagged), of which `rerun_layers` run `rerun_s` of their forward again with
    the fraction `tp_rerun` of their TP collectives (and the CP exchange when `cp_rerun`) before
    their backward (recompute.py). `tp_layer_s`: the exposed TP seconds of a layer's forward
    and backward (all of them, or what tpoverlap.py leaves exposed); `cp_layer_s` its exposed
    CP exchange (cpattention.py). `ep_layer_s`: a layer's
    exposed MoE dispatch (moe.py), forward and backward, of which the fraction `ep_rerun`
    runs again (all under full recomputation and Megatron's moe module, none otherwise).
    Broadcast-safe: the flags are 0/1 multipliers, not branches."""
    emb, hd = np.asarray(has_embedding), np.asarray(has_head)
    fwd = layers * layer.fwd_s + emb * embedding.fwd_s + hd * head.fwd_s
    bwd_in = layers * layer.bwd_input_s + emb * embedding.bwd_input_s + hd * head.bwd_input_s
    bwd_w = layers * layer.bwd_weight_s + emb * embedding.bwd_weight_s + hd * head.bwd_weight_s
    tp_f, tp_b = tp_layer_s
    cp_f, cp_b = cp_layer_s
    ep_f, ep_b = ep_layer_s
    rec, tp_r, cp_r = rerun_layers * rerun_s, rerun_layers * tp_rerun * tp_f, rerun_layers * float(cp_rerun) * cp_f
    ep_r = rerun_layers * ep_rerun * ep_f
    return PassTimes(fwd, bwd_in, bwd_w, rec + 0.0 * fwd, layers * tp_f, layers * tp_b, tp_r + 0.0 * fwd,
                     layers * cp_f, layers * cp_b, cp_r + 0.0 * fwd, layers * ep_f, layers * ep_b, ep_r + 0.0 * fwd)
