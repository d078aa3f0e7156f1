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

The Layout times representative stages: the first, one per distinct layer count among the
ranks between (the earliest rank holding it: the one with the most in flight), and the last
(`representatives`). A rank's chunks are timed as equal shares of its layers: under a
layout whose virtual stages on one rank differ (7 + 8 layers on the 405B's first rank) the
steady state is the rank's total either way, and only the pipeline's fill and drain, which
pass through one chunk of each stage, would differ by that layer.
"""

from __future__ import annotations

import numpy as np

from .errors import InputError


def rank_layers_of_layout(layout: tuple, p: int, schedule) -> list[int]:
    """Layers of each pipeline rank under a per-virtual-stage layout (schedule placement)."""
    out = [0] * p
    for k, n in enumerate(layout):
        out[schedule.stage_chunk(k, p)[0]] += n
    return out


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
        ranks = rank_layers_of_layout(layout, p, schedule)
        if min(ranks) < 1:
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


def representatives(model, plan, schedule, p):
    """(stage indices, how many stages each stands for, layers on its device) of the
    representative stages, and each scalar stage's representative (None where the ranks
    between the first and the last hold equal layers: then first, middle, last, and `p` may
    be an array of pipeline sizes for a batch of plans; the first/last counts and a layout
    are shared). With p = 1 or 2 the repeated representatives count zero times."""
    p = np.asarray(p)
    indices = [np.zeros_like(p), np.minimum(1, p - 1), p - 1]
    counts = [np.ones_like(p), np.maximum(p - 2, 0), (p > 1).astype(p.dtype)]
    if plan.pipeline_layout is not None:
        ranks = rank_layers_of_layout(plan.pipeline_layout, int(np.max(p)), schedule)
        middles = list(dict.fromkeys(ranks[1:-1]))
        if len(middles) > 1:
            n = len(ranks)
            first_at = [ranks.index(x, 1) for x in middles]
            rep_of_stage = (0, *(1 + middles.index(x) for x in ranks[1:-1]), len(middles) + 1)
            return ([0, *first_at, n - 1], [1, *(ranks[1:-1].count(x) for x in middles), 1],
                    [ranks[0], *middles, ranks[-1]], rep_of_stage)
        return indices, counts, [ranks[0], ranks[min(1, len(ranks) - 1)], ranks[-1]], None
    first, last = plan.first_stage_layers, plan.last_stage_layers
    if first is None and last is None:
        even = model.layers / p
        return indices, counts, [even, even, even], None
    if first is None:
        first = (model.layers - last) / (p - 1)
    if last is None:
        last = (model.layers - first) / (p - 1)
    middle = (model.layers - first - last) / np.maximum(p - 2, 1)
    # with p = 2 there is no middle stage: its representative counts zero times
    return indices, counts, [first, np.where(p > 2, middle, first), last], None
