"""Analytic engine: the step time and memory of a Layout in closed form (the fast engine).

Pipeline: the schedule's closed form (schedules.py, `step_s`) over the stages' pass times
per micro-batch, each pass with its exposed TP/CP collectives and its blocking pipeline
sends (Megatron-LM's p2p holds the sender for the transfer).

Data parallelism: per-micro-batch collectives (ZeRO-2/3) hide behind that micro-batch's
passes when `plan.dp_overlap`, else add to them; the once-per-step gradient reduction of
the last micro-batch's backward and the weight gather before the first forward overlap
those passes in Megatron-LM's buckets (dataparallel.py), the gather only with
`plan.gathers_overlap` (else it follows the optimizer step, exposed whole, as in the graph
engine). Stage i starts its first forward i forward hops after stage 0, the slack its gather
has, and no sooner than the stages before it have been delayed by theirs (the fill); it ends
its last backward i backward passes before stage 0 (ends_before_last_s), the slack its
reduction has.

Memory: every stage's peak from the schedule's in-flight counts (Layout.stage_memory), the
same bytes the graph engine's memory timeline takes and frees.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .bcast import amin, as_float, maximum, where
from .layout import Layout, StageLayout
from .memory import MEMORY_KEYS, StageMemory
from .offload import exposed_offload_s
from .schedules import StageTimes, alike_middles, stage_rep_grid, stage_times


def pipeline_times(layout: Layout) -> StageTimes:
    """Per-micro-batch forward, input-gradient and weight-gradient seconds of each
    representative stage as its device runs them (collectives and sends included)."""
    f, b, w = [], [], []
    for r in layout.stages:
        fwd_sends, bwd_sends = r.sends
        f.append(r.passes.forward_s + fwd_sends * layout.pp_hop_s)
        b.append(r.passes.backward_input_s + bwd_sends * layout.pp_hop_s)
        w.append(r.passes.bwd_weight_s)
    return stage_times(f, b, w, [r.count for r in layout.stages], layout.rep_of_stage)


def _reduce_tail_s(layout: Layout, reduce_s, grad_pass_s, buckets, times: StageTimes, i: int, stage):
    """Seconds the step's gradient reduction outlasts the stage's last pass (dp_overlap).

    Each chunk's reduction is issued in buckets during the last pass producing its gradients
    (dataparallel.bucketed_overlap_s) and queues behind the chunks before it on the dp stream;
    the schedule says what the stage still runs after that pass, and whether it is a whole
    backward where the schedule otherwise splits it (Schedule.grad_tail: DualPipe-V's).
    """
    v = layout.v
    f, b, w = times.f[i] / v, times.b[i] / v, times.w[i] / v
    r = reduce_s / v
    k = as_float(buckets)
    tails = layout.schedule.grad_tail(layout.p, layout.m, v, stage)
    ends = [-(n_f * f + n_b * (b + w) + n_i * b + n_w * w) for n_f, n_b, n_i, n_w, _ in tails]
    passes = [where(whole, b + w, grad_pass_s) for *_, whole in tails]
    queue = -np.inf
    for c in sorted(range(len(ends)), key=lambda c: float(amin(ends[c]))):
        first = maximum(queue, ends[c] - passes[c] + passes[c] / k) + r * (k - 1) / k
        queue = where(c < v, maximum(first, ends[c]) + r / k, queue)
    return maximum(0.0, queue) * (reduce_s > 0)


def _stage_sums(per_rep, rep):
    """(stages + 1, plans): row s sums per_rep (representatives, plans or 1) over the stages
    below s, each stage counted as its representative (rep: stages, plans or 1)."""
    n = max(per_rep.shape[1], rep.shape[1])
    per_stage = np.take_along_axis(np.broadcast_to(per_rep, (len(per_rep), n)),
                                   np.broadcast_to(rep, (len(rep), n)), axis=0)
    return np.concatenate([np.zeros((1, n)), np.cumsum(per_stage, axis=0)])


def ends_before_last_s(layout: Layout, times: StageTimes, executed=None) -> list:
    """Per representative, how long before the last stage to finish its passes it finishes
    its own: as Schedule.pipeline_run says (`executed`: its slacks, read off the executed order
    or the schedule's closed form; worked out here if None), else from the drain. The step's
    last backward passes (B, or I when split) run from stage p-1 down to stage 0, each a
    pipeline hop after the one above, so stage s's last one ends before stage 0's by the
    backward passes of stages 0..s-1; after it each stage still runs its drain tail
    (Schedule.drain_tail: the W passes a split schedule postponed)."""
    if executed is None:
        executed = layout.schedule.pipeline_run(times, layout.p, layout.m, layout.v,
                                                [r.stage for r in layout.stages])[1]
    if not any(np.isnan(x).any() for x in executed):
        return list(executed)
    v, hop = layout.v, layout.pp_hop_s
    split = layout.schedule.split_backward

    def per_chunk(i, counts):
        n_f, n_b, n_i, n_w = counts
        f, b, w = times.f[i] / v, times.b[i] / v, times.w[i] / v
        return n_f * f + n_b * (b + w) + n_i * b + n_w * w

    def hop_down(i):  # one stage's last backward pass and the hop to the stage below
        return (times.b[i] if split else times.b[i] + times.w[i]) / v + hop

    if layout.rep_of_stage is not None:  # middle ranks of different layers: each stage's own pass
        rep = stage_rep_grid(layout.rep_of_stage)
        hops = np.stack(np.broadcast_arrays(*[hop_down(i) for i in range(len(layout.stages))]))
        below = _stage_sums(hops.reshape(len(layout.stages), -1), rep)
        # in a batch of several pipelines, a plan whose middle ranks are alike takes the closed form, as alone
        alike = alike_middles(rep, layout.p) if rep.shape[1] > 1 else None
    ends = []
    for i, r in enumerate(layout.stages):
        s = np.asarray(r.stage)
        chain = np.where(s >= 1, hop_down(0), 0.0) + np.maximum(s - 1, 0) * hop_down(1)
        if layout.rep_of_stage is not None:
            counted = below[s, np.arange(below.shape[1]) if below.shape[1] > 1 else 0]
            chain = counted if alike is None else np.where(alike, chain, counted)
        ends.append(per_chunk(i, layout.schedule.drain_tail(layout.p, layout.m, v, r.stage)) - chain)
    latest = np.maximum.reduce(np.broadcast_arrays(*ends))
    return [where(np.isnan(x), latest - e, x) for e, x in zip(ends, executed)]


def _dp_exposed_s(layout: Layout, r: StageLayout, times: StageTimes, i: int, slack_end):
    """(seconds of data-parallel traffic the stage's end waits for, slack left after its
    gradient reduction, seconds its gathers at the step's start delay its first forward)."""
    d, plan, v = r.dp, layout.plan, layout.v
    f, b = times.f[i], times.b[i] + times.w[i]
    # the gradients of a chunk are complete at its last backward pass, or at its last W
    grad_pass = (times.w[i] if layout.schedule.split_backward else b) / v
    if plan.dp_overlap:
        per_mb = np.maximum(0.0, d.mb_gather_s - f) + np.maximum(0.0, d.mb_reduce_s - grad_pass * v)
        tail = _reduce_tail_s(layout, d.step_reduce_s, grad_pass, r.buckets, times, i, r.stage)
        # ZeRO-3 by FSDP units: the first pass waits for its first unit's gather, each chunk's
        # last reduce-scatter outlasts its pass by its last unit's (per_mb has the rest)
        units = (r.buckets > 1) & (d.mb_gather_s > 0)
        head = np.minimum(d.mb_gather_s / (2 * v), f / v) / r.buckets * units
        tail = tail + _reduce_tail_s(layout, d.mb_reduce_s, grad_pass, r.buckets, times, i, r.stage) * units
    else:
        per_mb = d.mb_gather_s + d.mb_reduce_s
        tail, head = d.step_reduce_s, 0.0
    slack_start = r.stage * f / v
    delay = np.maximum(0.0, head - slack_start)
    if plan.gathers_overlap:
        delay = delay + _gather_head_s(layout, d.step_gather_s, f, r.buckets, r.stage, slack_start) * (d.step_gather_s > 0)
        after = 0.0
    else:  # after the optimizer step, at the step's end, as the graph engine has it
        after = d.step_gather_s
    exposed = layout.m * per_mb + np.maximum(0.0, tail - slack_end) + after
    return exposed, np.maximum(0.0, slack_end - tail), delay


def _gather_head_s(layout: Layout, gather_s, f, buckets, stage, slack_s):
    """Seconds ZeRO-1/2's weight gathers delay a stage's passes (plan.gathers_overlap), as the
    graph engine runs them: every chunk's gather issued at the step's start, chunk by chunk,
    back to back on the dp stream, in buckets; a chunk's first forward starts once its first
    bucket has arrived and ends no sooner than one bucket's share of it after the last; it
    could start Schedule.gather_lead chunk forwards after the stage's first pass, which itself
    starts `slack_s` after the step. One chunk: dataparallel.bucketed_overlap_s less the slack."""
    v = layout.v
    g, f_chunk, k = gather_s / v, f / v, as_float(buckets)
    queue, delay = -slack_s, 0.0
    for c, lead in enumerate(layout.schedule.gather_lead(layout.p, v, stage)):
        free = lead * f_chunk + delay
        start = maximum(free, queue + g / k)
        end = maximum(start + f_chunk, queue + g + f_chunk / k)
        delay = where(c < v, delay + end - (free + f_chunk), delay)
        queue = queue + g
    return delay


def _stands_for_none(counted) -> bool:
    """Whether a scalar plan's representative counts zero times (p = 1 or 2), so that what it
    adds is zero and need not be worked out."""
    return not np.ndim(counted) and not counted


def _end_of_step(layout: Layout, times: StageTimes, counted, executed) -> tuple:
    """(dp_comm, optimizer, other) seconds past the pipeline: each stage ends with its exposed
    data-parallel traffic and then its optimizer step with the per-step framework work
    (framework_ops.py), which starts early by the slack left after its gradient reduction
    (ends_before_last_s); the step ends with the
    last stage to finish, as in the graph engine, which also splits the exposed end of the
    step between the optimizer and the framework work in proportion."""
    dp, opt, other = [], [], []
    slack = ends_before_last_s(layout, times, executed)
    parts = [None if _stands_for_none(c) else _dp_exposed_s(layout, r, times, i, slack[i])
             for i, (r, c) in enumerate(zip(layout.stages, counted))]
    for r, c, part in zip(layout.stages, counted, parts):
        if part is None:
            for each in (dp, opt, other):
                each.append(0.0)
            continue
        exposed, spare, _ = part
        # a stage's first forward waits for the first forwards of the stages before it, so a
        # gather delaying one of them delays it too (the pipeline's fill)
        delay = np.maximum.reduce(np.broadcast_arrays(0.0, *[
            np.where(c_up & (np.asarray(r_up.stage) <= np.asarray(r.stage)), up[2], 0.0)
            for r_up, c_up, up in zip(layout.stages, counted, parts) if up is not None]))
        total = r.optimizer_s + r.framework_step_s
        share = np.where(total > 0, np.maximum(0.0, total - spare) / np.where(total > 0, total, 1.0), 0.0)
        dp.append(np.where(c, exposed + delay, 0.0))
        opt.append(np.where(c, share * r.optimizer_s, 0.0))
        other.append(np.where(c, share * r.framework_step_s, 0.0))
    ends = np.stack(np.broadcast_arrays(*[d + o + x for d, o, x in zip(dp, opt, other)]))
    last = np.argmax(ends, axis=0)
    pick = lambda values: np.choose(last, np.broadcast_arrays(*values))  # noqa: E731
    return pick(dp), pick(opt), pick(other)


def step_breakdown(layout: Layout) -> dict:
    """Exposed seconds per step by cause (they add up to the step time), elementwise over plans."""
    times = pipeline_times(layout)
    m, reps = layout.m, layout.stages
    pipeline, executed = layout.schedule.pipeline_run(times, layout.p, m, layout.v, [r.stage for r in reps])
    crit = times.critical

    def pick(values):
        return times.pick(tuple(values))

    sends = pick([(r.sends[0] + r.sends[1]) * layout.pp_hop_s for r in reps])
    passes = [r.passes for r in reps]
    compute = pick([x.compute_s for x in passes])
    recompute = pick([x.recompute_s for x in passes])
    tp = pick([x.tp_fwd_s + x.tp_bwd_s + x.tp_recompute_s for x in passes])
    cp = pick([x.cp_fwd_s + x.cp_bwd_s + x.cp_recompute_s for x in passes])
    ep = pick([x.ep_fwd_s + x.ep_bwd_s + x.ep_recompute_s for x in passes])
    busy = m * (compute + recompute + tp + cp + ep + sends)
    counted = [np.asarray(r.count) > 0 for r in reps]
    period = pick([times.total(i) for i in range(len(reps))])
    dp, optimizer, other = _end_of_step(layout, times, counted, executed)
    offload = np.maximum.reduce(np.broadcast_arrays(*[
        0.0 if _stands_for_none(c) else
        np.where(c, exposed_offload_s(r.offload, layout.v, m,
                                      layout.schedule.offloaded_chunks(layout.p, m, layout.v, r.stage)
                                      if layout.offloads_activations else (0.0, 0.0),
                                      times.f[i] / layout.v, (times.b[i] + times.w[i]) / layout.v, times.total(i),
                                      period), 0.0)
        for i, (r, c) in enumerate(zip(reps, counted))]))
    del crit
    return {
        "compute": m * compute,
        "recompute": m * recompute,
        "tp_comm": m * tp,
        "cp_comm": m * cp,
        "ep_comm": m * ep,
        "pp_comm": m * sends,
        "dp_comm": dp,
        "pipeline_bubble": np.maximum(0.0, pipeline - busy),
        "optimizer": optimizer,
        "offload": offload,
        "other": other,
    }


@dataclass(frozen=True)
class PeakMemory:
    """The pipeline stage with the most bytes per device, and its parts (arrays over plans)."""

    stage: object
    parts: dict  # MEMORY_KEYS -> bytes
    total: object
    reserved_bytes: object  # the most any stage's caching allocator holds (StageMemory.reserved_bytes)


def stage_memory_grid(layout: Layout, n: int) -> tuple[dict, object]:
    """Every pipeline stage's bytes per device by part (MEMORY_KEYS and cached_free_bytes), as
    arrays of (stages, plans) for a batch of `n` plans, and which entries are stages of their
    plan (stage < p). Each stage is its representative's weights with its own in-flight
    activations: a middle stage may hold more than the representative it stands for (the
    torch pipeline's buffers under a V schedule)."""
    p = np.asarray(layout.p)
    stages = np.arange(int(np.max(p)))[:, None]  # (stages, 1) against (plans,)
    reps = [layout.stage_memory(r, stages) for r in layout.stages]
    if layout.rep_of_stage is not None:
        index = stage_rep_grid(layout.rep_of_stage)
    else:
        index = np.where(stages == 0, 0, np.where(stages == p - 1, 2, 1))
    shape = (len(stages), n)
    index = np.broadcast_to(index, shape)[None]
    parts = {k: np.take_along_axis(np.stack([np.broadcast_to(np.asarray(getattr(m, k), dtype=float), shape)
                                             for m in reps]), index, axis=0)[0]
             for k in (*MEMORY_KEYS, "cached_free_bytes")}
    return parts, np.broadcast_to(stages < p, shape)


def peak_memory(layout: Layout, n: int) -> PeakMemory:
    """The stage with the most bytes per device of each of `n` plans (the first, as evaluate()
    picks). A middle stage holds its representative's weights and no more in-flight
    activations than the earliest stage it stands for, so the representatives give the peak;
    PyTorch's pipeline buffers (plan.pp_impl: torch) break that under V schedules, and then
    every stage is looked at (stage_memory_grid)."""
    if layout.pipe is not None:
        parts, valid = stage_memory_grid(layout, n)
        totals = sum(parts[k] for k in MEMORY_KEYS)
        index = np.argmax(np.where(valid, totals, -np.inf), axis=0)
        pick = lambda values: np.take_along_axis(values, index[None, :], axis=0)[0]  # noqa: E731
        peak = {k: pick(parts[k]) for k in MEMORY_KEYS}
        return PeakMemory(index, peak, sum(peak.values()),
                          np.max(np.where(valid, totals + parts["cached_free_bytes"], -np.inf), axis=0))
    mems = [layout.stage_memory(r) for r in layout.stages]

    def stacked(key):
        return np.stack(np.broadcast_arrays(*[np.asarray(getattr(mm, key), dtype=float) for mm in mems]))

    totals = stacked("total")
    counted = np.stack(np.broadcast_arrays(*[np.asarray(r.count) for r in layout.stages])) > 0
    index = np.argmax(np.where(counted, totals, -np.inf), axis=0)

    def pick_rep(values):
        out = values[-1]
        for i in range(len(values) - 2, -1, -1):
            out = np.where(index == i, values[i], out)
        return out

    parts = {k: pick_rep([np.asarray(getattr(mm, k), dtype=float) for mm in mems]) for k in MEMORY_KEYS}
    return PeakMemory(pick_rep([r.stage for r in layout.stages]), parts, sum(parts.values()),
                      np.max(np.where(counted, stacked("reserved_bytes"), -np.inf), axis=0))


def memory_by_stage(layout: Layout) -> list[StageMemory]:
    """Every pipeline stage of a scalar plan (its middle stages differ in what is in flight)."""
    return [layout.stage_memory(layout.representative(i), i) for i in range(int(layout.p))]


def host_bytes_per_device(layout: Layout):
    """Host memory per device, sized for the hungriest stage: a node's devices may hold any."""
    return np.maximum.reduce(np.broadcast_arrays(*[np.asarray(layout.host_bytes(r), dtype=float)
                                                   for r in layout.stages]))
