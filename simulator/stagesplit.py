"""Layers per pipeline stage: even, Megatron-Core's first/last-stage counts, balanced, or a layout.

- Even: every stage holds layers / pp (each of its v chunks layers / (pp·v)).
- First/last counts (`plan.first_stage_layers`, `plan.last_stage_layers`): Megatron-Core's
  --decoder-first-pipeline-num-layers / --decoder-last-pipeline-num-layers
  (num_layers_in_first/last_pipeline_stage): the first and the last pipeline rank hold the
  given layers, the ranks between split the rest evenly and must divide it; with
  interleaving each rank splits its layers evenly over its chunks, so each count divides by
  the chunks per device (NVIDIA/Megatron-LM@d98e8a64dd
  megatron/core/transformer/transformer_block.py get_num_layers_to_build; the checks in
  megatron/core/transformer/transformer_config.py __post_init__, "Uneven PP").
- Balanced (`plan.pipeline_split: balanced`): the embedding and the output weigh a layer
  each and the layers plus these two are dealt evenly over the virtual stages, the first
  stages one more where they do not divide (balanced_layout): torchtitan's default split,
  Megatron-Core's --account-for-embedding/loss-in-pipeline-split where they divide. It takes
  any pipeline size the layers can fill.
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
(`representatives`; a batch of plans of several pipeline sizes is counted once per size). A
rank's holding is its layer count, and for a model with experts how many of its layers are
MoE, for one with windows on some layers how many of them slide: the
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


PIPELINE_SPLITS = ("even", "balanced")  # plan.pipeline_split


def check_split(plan, model, schedule) -> None:
    """Raise InputError for a split of the layers that the pipeline cannot hold."""
    p, chunks = plan.pp, schedule.chunks(plan.vpp)
    stages = p * chunks
    first, last, layout = plan.first_stage_layers, plan.last_stage_layers, plan.pipeline_layout
    if plan.pipeline_split == "balanced":
        if layout is not None or first is not None or last is not None:
            raise InputError("plan.pipeline_split", plan.pipeline_split, "give a balanced split or first/last stage "
                             "layers or a layout, not two of them")
        layout = balanced_layout(model.layers, stages)
        if layout is None:
            raise InputError("plan.pipeline_split", plan.pipeline_split, f"{stages} virtual stages (pp x model chunks "
                             f"per device) leave a stage lighter than the embedding or the output for "
                             f"layers={model.layers}")
        if min(k[0] for k in rank_layer_kinds(model, layout, p, schedule)) < 1:
            raise InputError("plan.pipeline_split", plan.pipeline_split, "leaves a pipeline rank without a layer")
        return
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
                             f"layers={model.layers} (or give plan.pipeline_split: balanced, "
                             "plan.first_stage_layers / last_stage_layers or plan.pipeline_layout)")
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


def balanced_layout(layers: int, stages: int, input_weight: int = 1, output_weight: int = 1) -> tuple | None:
    """Layers of each of `stages` virtual stages with the embedding and the output (norm,
    lm_head, loss) each weighed as `input_weight` / `output_weight` decoder layers: the
    layers plus the weights are dealt out as evenly as they go, the remainder one each to
    the earliest stages, and the first (last) stage gives up its weight in layers.

    torchtitan's default split (pytorch/torchtitan@b5bcd76
    torchtitan/distributed/pipeline_parallel.py _generate_llm_fqn_per_model_part, with
    pipeline_parallel_first/last_stage_less_layers = 1 in torchtitan/config/configs.py): 126
    layers over 16 stages are 7, 8 x 14, 7. Where the weighted count divides evenly it is
    also Megatron-Core's --account-for-embedding-in-pipeline-split
    --account-for-loss-in-pipeline-split (NVIDIA/Megatron-LM@d98e8a64dd
    megatron/core/transformer/transformer_block.py get_num_layers_to_build). None where
    torchtitan refuses it: a stage left without a layer's share, or a weight above it."""
    if stages == 1:
        return (layers,)
    share, extra = divmod(layers + input_weight + output_weight, stages)
    if share == 0 or input_weight > share or output_weight > share:
        return None
    out = [share + (k < extra) for k in range(stages)]
    out[0] -= input_weight
    out[-1] -= output_weight
    return tuple(out)


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


def virtual_stage_layers(model, plan, schedule, p: int, chunks: int) -> tuple:
    """Decoder layers of each of the p x chunks virtual stages, first to last, of a plan that
    check_split accepts: its layout, the balanced split, or each rank's layers split evenly
    over its chunks."""
    if plan.pipeline_layout is not None:
        return tuple(plan.pipeline_layout)
    if plan.pipeline_split == "balanced":
        return balanced_layout(model.layers, p * chunks)
    first, middle, last = _rank_layers(model, plan, p)
    ranks = [first, *[middle] * (p - 2), last] if p > 1 else [model.layers]
    return tuple(int(ranks[schedule.stage_chunk(k, p)[0]]) // chunks for k in range(p * chunks))


def plan_stage_layers(model, plan) -> tuple:
    """Decoder layers of each virtual stage of one validated plan, first to last."""
    schedule = plan_schedule(plan)
    return virtual_stage_layers(model, plan, schedule, plan.pp, schedule.chunks(plan.vpp))


def uneven(plan) -> bool:
    """Whether the plan names a split other than the even one."""
    return plan.pipeline_split != "even" or plan.pipeline_layout is not None or \
        plan.first_stage_layers is not None or plan.last_stage_layers is not None


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


class _Counted(NamedTuple):
    """The representatives of one pipeline size, its ranks counted one by one."""

    kinds: list  # (layers, MoE layers, sliding layers) of each representative
    indices: list
    counts: list
    rep_of_stage: tuple  # each stage's representative


def _counted(model, plan, schedule, p: int, chunks: int) -> _Counted:
    kinds = rank_layer_kinds(model, virtual_stage_layers(model, plan, schedule, p, chunks), p, schedule)
    middles = list(dict.fromkeys(kinds[1:-1])) or [kinds[min(1, p - 1)]]
    at = [kinds.index(x, 1) if p > 2 else min(1, p - 1) for x in middles]
    rep_of_stage = (0, *(1 + middles.index(x) for x in kinds[1:-1]), len(middles) + 1)[:p]
    return _Counted([kinds[0], *middles, kinds[-1]], [0, *at, p - 1],
                    [1, *(kinds[1:-1].count(x) for x in middles), int(p > 1)], rep_of_stage)


def _padded(c: _Counted, slots: int) -> _Counted:
    """`c` with copies of its first middle representative, counting zero times, up to `slots`
    representatives (so that a batch's plans have as many)."""
    extra = slots - len(c.indices)
    return _Counted([*c.kinds[:-1], *[c.kinds[1]] * extra, c.kinds[-1]],
                    [*c.indices[:-1], *[c.indices[1]] * extra, c.indices[-1]],
                    [*c.counts[:-1], *[0] * extra, c.counts[-1]],
                    tuple(k if k < len(c.indices) - 1 else slots - 1 for k in c.rep_of_stage))


def representatives(model, plan, schedule, p) -> Representatives:
    """The representative stages: the first, the middle ranks (one, standing for every middle
    rank where they hold equal layers of equal kinds, else one per distinct holding: the
    earliest rank holding it, the one with the most in flight) and the last. Where the closed
    forms hold (uniform_layer_kinds) they follow from the sizes; otherwise the ranks are
    counted one by one (rank_layer_kinds), once per pipeline size and chunk count of a batch,
    and plans with fewer distinct middle holdings than others repeat one that counts zero
    times. `p` may be an array of pipeline sizes for a batch of plans; `rep_of_stage` is then
    an array of (stages, plans). With p = 1 or 2 the repeated representatives count zero times."""
    p = np.asarray(p)
    if not counted_by_rank(model, plan, schedule, p):
        indices = [np.zeros_like(p), np.minimum(1, p - 1), p - 1]
        counts = [np.ones_like(p), np.maximum(p - 2, 0), (p > 1).astype(p.dtype)]
        layers = list(_rank_layers(model, plan, p))
        moe = None
        if model.experts:
            moe = [stage_layer_mix(model, p, schedule.chunks(plan.vpp), i == schedule.embedding_stage(p))[1]
                   for i in indices]
        return Representatives(indices, counts, layers, None, moe)
    chunks = np.broadcast_to(np.asarray(schedule.chunks(plan.vpp)), p.shape)
    pipelines, of_plan = np.unique(np.stack([p.ravel(), chunks.ravel()], axis=1), axis=0, return_inverse=True)
    counted = [_counted(model, plan, schedule, int(a), int(c)) for a, c in pipelines]
    if len(counted) == 1:  # one pipeline: its representatives' holdings are numbers
        c = counted[0]
        return Representatives([x + 0 * p for x in c.indices], [x + 0 * p for x in c.counts],
                               [k[0] for k in c.kinds], c.rep_of_stage if len(c.indices) > 3 else None,
                               [k[1] for k in c.kinds] if model.experts else None,
                               [k[2] for k in c.kinds] if varying_windows(model) else None)
    slots = max(len(c.indices) for c in counted)
    counted = [_padded(c, slots) for c in counted]
    of_plan = of_plan.ravel()

    def column(per_pipeline):  # (pipelines, slots) -> per slot, the plans' values shaped as p
        table = np.array(per_pipeline)[of_plan]
        return [table[:, i].reshape(p.shape) for i in range(slots)]

    rep_of_stage = None
    if slots > 3:
        grid = np.full((int(p.max()), len(counted)), slots - 1)
        for j, c in enumerate(counted):
            grid[:len(c.rep_of_stage), j] = c.rep_of_stage
        rep_of_stage = grid[:, of_plan]
    return Representatives(column([c.indices for c in counted]), column([c.counts for c in counted]),
                           column([[k[0] for k in c.kinds] for c in counted]), rep_of_stage,
                           column([[k[1] for k in c.kinds] for c in counted]) if model.experts else None,
                           column([[k[2] for k in c.kinds] for c in counted]) if varying_windows(model) else None)


def varying_windows(model) -> bool:
    """Whether the model's layers differ in their attention band (a window on some layers
    only: every sliding_window_freq-th, or all but every sliding_window_skip_freq-th)."""
    return model.has_sliding_window and model.sliding_window_period > 1


def uniform_layer_kinds(model, plan, schedule, p) -> bool:
    """Whether every rank but the first holds layers of the same kinds for every plan of `p`
    (broadcast), so that the closed forms hold (moe.stage_layer_mix; the model's mean
    attention band, workload.window_pair_fraction): a model of one kind, or even stages
    with the leading dense layers inside the first virtual stage and every virtual stage
    holding whole periods of moe_layer_freq and of the sliding-window pattern."""
    if not (model.experts or varying_windows(model)):
        return True
    if uneven(plan):
        return False
    per_stage = model.layers // (np.asarray(p) * schedule.chunks(plan.vpp))
    uniform = (model.dense_layers <= per_stage) & (per_stage % model.moe_layer_freq == 0)
    if varying_windows(model):
        uniform = uniform & ((per_stage % model.sliding_window_period == 0) | (per_stage == model.layers))
    return bool(np.all(uniform))


def counted_by_rank(model, plan, schedule, p) -> bool:
    """Whether representatives counts the ranks' layers one by one: under a layout or the
    balanced split, or where the ranks hold different mixes of layer kinds."""
    return plan.pipeline_layout is not None or plan.pipeline_split == "balanced" or \
        not uniform_layer_kinds(model, plan, schedule, p)

