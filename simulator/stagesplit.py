"""Layers per pipeline stage: even, Megatron-Core's first/last-stage counts, or a layout.

- Even: every stage holds layers / pp (each of its v chunks layers / (pp·v)).
- First/last counts (`plan.first_stage_layers`, `plan.last_stage_layers`): Megatron-Core's
  --decoder-first-pipeline-num-layers / --decoder-last-pipeline-num-layers
  (num_layers_in_first/last_pipeline_stage): the first and the last pipeline rank hold the
  given layers, the ranks between split the rest evenly and must divide it; with
  interleaving each rank splits its layers evenly over its chunks, so each count divides by
  the chunks per device (NVIDIA/Megatron-LM@d98e8a64dd
  megatron/core/transformer/transformer_block.py get_num_layers_to_build; the checks in
  megatron/core/transformer/transformer_config.py __post_init__, "Uneven PP").
- A layout (`plan.pipeline_layout`): the layers of every virtual stage, first to last
  (Megatron-Core's --pipeline-model-parallel-layout without its E/L markers; torchtitan's
  default split of 126 layers into 16 stages, 7, 8 x 14, 7: torchtitan@9dec370
  torchtitan/parallelisms/pipelining_utils.py generate_split_points). A rank holds the
  virtual stages the schedule places on it (loop or V placement).

The embedding sits with the first virtual stage and the lm_head and loss with the last
(Megatron-LM gpt_model.py pre_process/post_process; torchtitan pipeline_llama.py keeps
tok_embeddings on the first stage and norm/output on the last), whatever the split: the
Layout adds them to the stage the schedule places them on.

The Layout times representative stages: the first, one per distinct holding among the ranks
between (the earliest rank holding it: the one with the most in flight), and the last
(`representatives`). A rank's holding is its layer count, and for a model with experts how
many of its layers are MoE, for one with windows on some layers how many of them slide: the
layers are numbered through the virtual stages in order, so DeepSeek-V3's three leading
dense layers under Megatron-Bridge's layout Et|(tt|)*30mL fall on ranks 0 and 1
(rank_layer_kinds), where an even split keeps them in the first stage, and of GPT-OSS's 36
alternating layers in 4 stages of 9 the first and third ranks hold 5 windows, the others 4
(the Layout then times each rank's layers at its own mean band, workload.window_pair_fraction).
A rank's chunks are timed as equal shares of its layers and kinds: under a layout whose
virtual stages on one rank differ (7 + 8 layers on the 405B's first rank; DeepSeek-V3's
first rank: one dense layer, then three chunks of two MoE layers) the steady state is the
rank's total either way, and only the pipeline's fill and drain, which pass through one
chunk of each stage, would differ.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from .errors import InputError
from .moe import stage_layer_mix
from .schedules import plan_schedule


def check_split(plan, model, schedule) -> None:
    """Raise InputError for a split of the layers that the pipeline cannot hold."""
    p, chunks = plan.pp, schedule.chunks(plan.vpp)
    stages = p * chunks
    first, last, layout = plan.first_stage_layers, plan.last_stage_layers, plan.pipeline_layout
    if layout is not None:
        if first is not None or last is not None:
            raise InputError("plan.pipeline_layout", list(layout), "give a layout or first/last stage layers, not both")
        if len(layout) != stages:
            raise InputError("plan.pipeline_layout", list(layout), f"needs one entry per virtual stage: pp x model "
                             f"chunks per device = {stages}")
        if sum(layout) != model.layers:
            raise InputError("plan.pipeline_layout", list(layout), f"must add up to layers={model.layers}")
        if min(k[0] for k in rank_layer_kinds(model, layout, p, schedule)) < 1:
            raise InputError("plan.pipeline_layout", list(layout), "every pipeline rank needs a layer")
        return
    if first is None and last is None:
        if model.layers % stages:
            raise InputError("plan.pp", plan.pp, f"pp x model chunks per device = {stages} must divide "
                             f"layers={model.layers} (or give plan.first_stage_layers / last_stage_layers or "
                             "plan.pipeline_layout)")
        return
    if p < 2:
        raise InputError("plan.first_stage_layers" if first is not None else "plan.last_stage_layers",
                         first if first is not None else last, "needs pp >= 2")
    even = None
    if first is None or last is None:
        # Megatron: the ranks without a given count split what is left evenly
        given = first if first is not None else last
        rest = model.layers - given
        if rest % (p - 1):
            raise InputError("plan.first_stage_layers" if first is not None else "plan.last_stage_layers", given,
                             f"the other {p - 1} ranks must split the remaining {rest} layers evenly")
        even = rest // (p - 1)
    f = first if first is not None else even
    lst = last if last is not None else even
    middle_total = model.layers - f - lst
    if p == 2 and middle_total != 0:
        raise InputError("plan.first_stage_layers", f, f"with pp=2 first + last stage layers must equal "
                         f"layers={model.layers}")
    if p > 2 and (middle_total < p - 2 or middle_total % (p - 2)):
        raise InputError("plan.first_stage_layers", f, f"the {p - 2} middle ranks must split the remaining "
                         f"{middle_total} layers evenly, at least one each")
    middle = middle_total // (p - 2) if p > 2 else chunks
    for field, n in (("plan.first_stage_layers", f), ("plan.last_stage_layers", lst), ("plan.pp", middle)):
        if n < chunks or n % chunks:
            raise InputError(field, n, f"a rank's layers must split evenly over its {chunks} model chunks")


def _rank_layers(model, plan, p):
    """(first, middle, last) pipeline rank's layers (broadcast-safe in p; even, or
    first/last counts; the middle count stands in for the first at p = 2)."""
    first, last = plan.first_stage_layers, plan.last_stage_layers
    if first is None and last is None:
        even = model.layers / p
        return even, even, even
    if first is None:
        first = (model.layers - last) / (p - 1)
    if last is None:
        last = (model.layers - first) / (p - 1)
    middle = (model.layers - first - last) / np.maximum(p - 2, 1)
    return first, np.where(p > 2, middle, first), last


def virtual_stage_layers(model, plan, schedule, p: int) -> tuple:
    """Decoder layers of each virtual stage, first to last, of a plan of `p` stages that
    check_split accepts: its layout, or each rank's layers split evenly over its chunks."""
    if plan.pipeline_layout is not None:
        return tuple(plan.pipeline_layout)
    chunks = int(np.max(schedule.chunks(plan.vpp)))  # a batch shares its vpp here (batch_key)
    first, middle, last = _rank_layers(model, plan, p)
    ranks = [first, *[middle] * (p - 2), last] if p > 1 else [model.layers]
    return tuple(int(ranks[schedule.stage_chunk(k, p)[0]]) // chunks for k in range(p * chunks))


def rank_layer_kinds(model, stage_layers: tuple, p: int, schedule) -> list:
    """(decoder layers, MoE layers, sliding-window layers) of each pipeline rank: virtual stage
    k holds the next stage_layers[k] layers of the model in order (Megatron-Core's
    transformer_block.py get_transformer_layer_offset; torchtitan's split points) and sits on
    the rank the schedule places it on, so a rank's kinds follow from the layer indices."""
    out = [[0, 0, 0] for _ in range(p)]
    start = 0
    for k, n in enumerate(stage_layers):
        rank = out[schedule.stage_chunk(k, p)[0]]
        layers = range(start, start + n)
        rank[0] += n
        rank[1] += sum(model.is_moe_layer(i) for i in layers) if model.experts else 0
        rank[2] += sum(model.is_sliding_window_layer(i) for i in layers) if varying_windows(model) else 0
        start += n
    return [tuple(r) for r in out]


class Representatives(NamedTuple):
    """The pipeline stages a Layout times (see the module docstring)."""

    indices: list  # each representative's stage index
    counts: list  # how many stages each stands for
    layers: list  # decoder layers on a device of each
    rep_of_stage: tuple | None  # each scalar stage's representative where the middle ranks differ
    moe_layers: list | None  # MoE layers among them (None for a model without experts)
    sliding_layers: list | None = None  # sliding-window layers among them (None: the model's share)


def representatives(model, plan, schedule, p) -> Representatives:
    """The representative stages: the first, the middle ranks (one, standing for every middle
    rank where they hold equal layers of equal kinds, else one per distinct holding: the
    earliest rank holding it, the one with the most in flight) and the last. Without a
    layout, where the closed forms hold (uniform_layer_kinds), `p` may be an array of pipeline
    sizes for a batch of plans (first/last counts are shared); otherwise the ranks are counted
    one by one (rank_layer_kinds) for one pipeline size per batch (batch_key). With p = 1 or 2
    the repeated representatives count zero times."""
    p = np.asarray(p)
    indices = [np.zeros_like(p), np.minimum(1, p - 1), p - 1]
    counts = [np.ones_like(p), np.maximum(p - 2, 0), (p > 1).astype(p.dtype)]
    if not counted_by_rank(model, plan, schedule, p):
        layers = list(_rank_layers(model, plan, p))
        moe = None
        if model.experts:
            moe = [stage_layer_mix(model, p, schedule.chunks(plan.vpp), i == schedule.embedding_stage(p))[1]
                   for i in indices]
        return Representatives(indices, counts, layers, None, moe)
    p0 = int(np.ravel(p)[0])
    if np.any(p != p0):
        raise ValueError("a batch of plans whose ranks are counted one by one needs one pipeline size (batch_key)")
    kinds = rank_layer_kinds(model, virtual_stage_layers(model, plan, schedule, p0), p0, schedule)
    middles = list(dict.fromkeys(kinds[1:-1]))
    if len(middles) > 1:
        n = len(kinds)
        first_at = [kinds.index(x, 1) for x in middles]
        rep_of_stage = (0, *(1 + middles.index(x) for x in kinds[1:-1]), len(middles) + 1)
        reps = [kinds[0], *middles, kinds[-1]]
        indices = [x + 0 * p for x in (0, *first_at, n - 1)]  # shaped as a batch's p
        counts = [x + 0 * p for x in (1, *(kinds[1:-1].count(x) for x in middles), 1)]
    else:
        rep_of_stage, reps = None, [kinds[0], kinds[min(1, len(kinds) - 1)], kinds[-1]]
    return Representatives(indices, counts, [k[0] for k in reps], rep_of_stage,
                           [k[1] for k in reps] if model.experts else None,
                           [k[2] for k in reps] if varying_windows(model) else None)


def varying_windows(model) -> bool:
    """Whether the model's layers differ in their attention band (a window on every
    sliding_window_freq-th layer only)."""
    return 0 < model.sliding_window < model.seq_len and model.sliding_window_freq > 1


def uniform_layer_kinds(model, plan, schedule, p) -> bool:
    """Whether every rank but the first holds layers of the same kinds for every plan of `p`
    (broadcast), so that the closed forms hold (moe.stage_layer_mix; the model's mean
    attention band, workload.window_pair_fraction): a model of one kind, or even stages
    with the leading dense layers inside the first virtual stage and every virtual stage
    holding whole periods of moe_layer_freq and of sliding_window_freq."""
    if not (model.experts or varying_windows(model)):
        return True
    if plan.first_stage_layers is not None or plan.last_stage_layers is not None or plan.pipeline_layout is not None:
        return False
    per_stage = model.layers // (np.asarray(p) * schedule.chunks(plan.vpp))
    uniform = (model.dense_layers <= per_stage) & (per_stage % model.moe_layer_freq == 0)
    if varying_windows(model):
        uniform = uniform & ((per_stage % model.sliding_window_freq == 0) | (per_stage == model.layers))
    return bool(np.all(uniform))


def counted_by_rank(model, plan, schedule, p) -> bool:
    """Whether representatives counts the ranks' layers one by one: under a layout, or where
    the ranks hold different mixes of layer kinds."""
    return plan.pipeline_layout is not None or not uniform_layer_kinds(model, plan, schedule, p)


def batch_key(model, plan) -> tuple:
    """What plans must share to be laid out as one batch beyond their categorical fields:
    the pipeline's size where its ranks are counted one by one (counted_by_rank)."""
    return (plan.pp, plan.vpp) if counted_by_rank(model, plan, plan_schedule(plan), plan.pp) else ()
