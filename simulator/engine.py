"""Discrete-event execution of a task graph, its critical path and memory timeline.

Execution: every stream is an in-order queue (a CUDA stream, a NIC queue): a task starts
when the task before it on its stream has ended and all its dependencies have ended. The
stages are walked in the order the builder added their tasks, counting down only the
dependencies between stages, so one pass over the tasks and edges gives every start time
(O(tasks + edges)); a cycle (an impossible explicit schedule) is an InputError. Different
streams of a device overlap; that overlap comes only from the graph. Contention is then
refined once: transfers that overlap on a device's NIC share its bandwidth (processor
sharing: two at once each move at half their rate), and compute
kernels slow down by the accelerator profile's `efficiency.overlap_slowdown` (default 0)
times their overlap with communication; the graph is executed again with the stretched
durations (one fixed-point step).

Breakdown from the critical path: walking back from the last task through the
dependency or stream predecessor that bound each start gives a chain of tasks whose
durations add up to the step time. The chain's tasks on the stage where it spends most
time are attributed to their own categories (compute, recompute, tp_comm, ...); compute
tasks of other stages on the chain are the pipeline bubble (fill and drain).

Steady-state periodicity: a pipeline schedule repeats with period p micro-batches once
past its warm-up, so the step time, breakdown, tasks and activation peaks are affine in m
there. Where it saves work (not with activation offload nor the V shapes), `simulate`
executes the graph for p and 2p micro-batches (2p and 3p with ZeRO-2/3) and extrapolates,
unless a stream's backlog or a stage's own period outgrows the step; tests check the
equality with a full execution.
"""

from __future__ import annotations

import gc
import time
from contextlib import contextmanager
from dataclasses import dataclass
from itertools import chain

import numpy as np

from .errors import InputError
from .graph import COMPUTE, STREAMS, TaskGraph, build
from .layout import Layout
from .result import BREAKDOWN_KEYS

NS = len(STREAMS)


@dataclass(frozen=True)
class Execution:
    graph: TaskGraph
    start_s: list
    end_s: list
    post_s: list  # the send hold after each task, as executed (shared links may lengthen it)
    release_s: list  # when each task lets its stream go: its end plus its send hold
    step_time_s: float


def run(g: TaskGraph, durations=None, posts=None) -> Execution:
    """Start and end seconds of every task: in-order streams, dependencies respected.

    A task starts at the latest end (or send release) of what it waits for: its
    dependencies and the task before it on its stream. The builder adds each stage's tasks
    in an order that respects the stage's own dependencies (graph.py), so the stages are
    walked in that order and only dependencies between stages (the pipeline's sends and
    receives) are counted down; a stage whose next task still waits for another stage
    yields to the others. A graph executed before is walked in the order found then.
    """
    dur = g.dur if durations is None else durations
    post = g.post if posts is None else posts
    n = len(dur)
    waits, prev, cross, ncross, stages = _structure(g)
    times = [0.0] * (2 * n)  # task t's end at 2t, its release (end + send hold) at 2t + 1
    at = times.__getitem__
    start = [0.0] * n
    order = g.cache.get("order")
    if order is None:
        order = []
        pending = list(ncross)
        stage = g.stage
        pos = dict.fromkeys(stages, 0)
        todo = list(stages)
        while todo:
            i = todo.pop()
            q = stages[i]
            k, nq = pos[i], len(q)
            while k < nq:
                t = q[k]
                if pending[t]:
                    break
                w = waits[t]
                st = start[t] = max(map(at, w)) if w else 0.0
                e = times[t + t] = st + dur[t]
                times[t + t + 1] = e + post[t]
                order.append(t)
                k += 1
                for u in cross[t]:
                    pending[u] -= 1
                    if not pending[u]:
                        todo.append(stage[u])
            pos[i] = k
        if len(order) < n:
            raise InputError("plan.schedule_ops", "cyclic", "the schedule waits on itself: a pass is ordered "
                             "before the pass it depends on")
        g.cache["order"] = order
    else:
        for t in order:
            w = waits[t]
            st = start[t] = max(map(at, w)) if w else 0.0
            e = times[t + t] = st + dur[t]
            times[t + t + 1] = e + post[t]
    rel = times[1::2]
    return Execution(g, start, times[0::2], post, rel, max(rel) if rel else 0.0)


def _structure(g: TaskGraph):
    """What executing the graph needs, derived once per graph (a refinement executes it
    twice): per task what it waits for as indices into `run`'s times (its dependencies'
    ends 2d or sends 2d + 1, its stream predecessor's release), its stream predecessor (-1
    for none), its dependants on other stages (or later in its own: only a deadlocked
    explicit order has those) and how many such dependencies it has; each stage's tasks in
    order. Derived with array operations: a per-dependency Python loop cost as much as the
    execution itself."""
    if "structure" not in g.cache:
        n = len(g.dur)
        counts = np.fromiter(map(len, g.deps), dtype=np.int64, count=n)
        dep = np.fromiter(chain.from_iterable(g.deps), dtype=np.int64, count=int(counts.sum()))
        task = np.repeat(np.arange(n), counts)
        on = np.where(dep >= 0, dep, ~dep)  # the task depended on
        stage, stream = np.asarray(g.stage, dtype=np.int64), np.asarray(g.stream, dtype=np.int64)
        by_stream = np.argsort(stream, kind="stable")
        same = stream[by_stream[1:]] == stream[by_stream[:-1]]
        prev = np.full(n, -1, dtype=np.int64)
        prev[by_stream[1:][same]] = by_stream[:-1][same]
        has_prev = prev >= 0
        wait_task = np.concatenate([task, np.flatnonzero(has_prev)])
        by_task = np.argsort(wait_task, kind="stable")
        wait_at = np.concatenate([2 * on + (dep < 0), 2 * prev[has_prev] + 1])[by_task]
        waiter = wait_task[by_task]
        waits = _split(wait_at, waiter, n)
        g.cache["waits"] = (wait_at, waiter, stage)  # for _alone_ends
        xmask = (on > task) | (stage[on] != stage[task])
        ncross = np.bincount(task[xmask], minlength=n).tolist()
        cross = [[] for _ in range(n)]
        for u, t in zip(on[xmask].tolist(), task[xmask].tolist()):
            cross[u].append(t)
        by_stage = np.argsort(stage, kind="stable")
        cuts = np.flatnonzero(np.diff(stage[by_stage])) + 1
        stages = {int(stage[q[0]]): q.tolist() for q in np.split(by_stage, cuts) if len(q)}
        g.cache["structure"] = (waits, prev.tolist(), cross, ncross, stages)
    return g.cache["structure"]


def _split(flat: np.ndarray, owner: np.ndarray, n: int) -> list:
    """Per task 0..n-1, the entries of `flat` whose `owner` (sorted) is that task."""
    bounds = np.concatenate([[0], np.cumsum(np.bincount(owner, minlength=n))]).tolist()
    flat = flat.tolist()
    return [flat[a:b] for a, b in zip(bounds, bounds[1:])]


def run_with_slowdown(g: TaskGraph, slowdown: float) -> Execution:
    """Execute, then refine once for contention: NIC transfers of a device that overlap
    share its bandwidth (k at a time: each runs at 1/k of its rate), and compute kernels
    slow down by `slowdown` x their overlap with communication; re-execute with the
    stretched durations (one fixed-point step)."""
    ex = run(g)
    if slowdown <= 0 and not g.nic:
        return ex
    start, end = ex.start_s, ex.end_s
    dur, post = list(g.dur), list(g.post)
    changed = False
    for transfers, sends in _link_queues(g):
        # one stream's transfers, in its order: already disjoint and sorted, as _meeting wants
        dp = [(start[t], end[t], t) for t in transfers if g.dur[t] > 0]
        # sends follow one another on the compute stream: only those meeting a NIC transfer share
        sends = _meeting([(end[t], end[t] + post[t], t) for t in sends], dp)
        for is_send, t, extra in _shared(dp, sends):
            changed = True
            if is_send:
                post[t] += extra
            else:
                dur[t] += extra
    if slowdown > 0:
        comm = {}
        for t in range(len(g.dur)):
            if g.post[t] > 0:
                comm.setdefault(g.stage[t], []).append((end[t], end[t] + g.post[t]))
            elif g.stream[t] % NS != COMPUTE and g.dur[t] > 0:
                comm.setdefault(g.stage[t], []).append((start[t], end[t]))
        merged = {i: _merge(v) for i, v in comm.items()}
        for t in range(len(g.dur)):
            if g.stream[t] % NS == COMPUTE and g.stage[t] in merged:
                extra = slowdown * _overlap(merged[g.stage[t]], start[t], end[t])
                if extra > 0:
                    changed = True
                    dur[t] += extra
    return run(g, dur, post) if changed else ex


def _link_queues(g: TaskGraph) -> list:
    """Per stage with NIC transfers (its dp stream, graph.build), those tasks in stream
    order and the stage's blocking sends in order when they cross the NIC too; cached."""
    if "link" not in g.cache:
        nic, sends = {}, {}
        for t in sorted(g.nic):
            nic.setdefault(g.stage[t], []).append(t)
        if g.send_nic:
            for t, x in enumerate(g.post):
                if x > 0:
                    sends.setdefault(g.stage[t], []).append(t)
        g.cache["link"] = [(q, sends.get(i, [])) for i, q in nic.items()]
    return g.cache["link"]


def _meeting(intervals, spans):
    """The intervals (in order of start) that overlap any of the disjoint, sorted spans."""
    out, k = [], 0
    for iv in intervals:
        while k < len(spans) and spans[k][1] <= iv[0]:
            k += 1
        if k < len(spans) and spans[k][0] < iv[1]:
            out.append(iv)
    return out


def _shared(a: list, b: list) -> list:
    """(whether in b, task, extra seconds) for the transfers of two queues sharing one link
    (a stage's dp stream and its sends), by processor sharing.

    Each queue holds (start, end, task) transfers served in order; while both queues have a
    transfer in service each moves at half its full rate. A transfer enters service at its
    start in the first execution (or when its predecessor leaves, if later); extra = its
    service time under sharing - its time alone. Written out for the two queues (remaining
    full-rate seconds ra and rb, -1 for none in service): this loop runs once per transfer
    start and end, tens of thousands of times a step with ZeRO-3.
    """
    out = []
    if not a or not b:
        return out
    inf = float("inf")
    na, nb = len(a), len(b)
    ia = ib = 0
    ra = rb = -1.0
    sa = sb = now = 0.0
    while True:
        ta = inf if ra >= 0 or ia == na else a[ia][0]  # next arrival of an idle queue
        tb = inf if rb >= 0 or ib == nb else b[ib][0]
        if ra < 0 and rb < 0:
            if ta == inf and tb == inf:
                return out
            now = max(now, min(ta, tb))
        elif ra >= 0 and rb >= 0:
            step = ra if ra < rb else rb
            now += 2 * step
            ra -= step
            rb -= step
        elif ra >= 0:
            if tb < now + ra:
                ra -= tb - now
                now = tb
            else:
                now += ra
                ra = 0.0
        else:
            if ta < now + rb:
                rb -= ta - now
                now = ta
            else:
                now += rb
                rb = 0.0
        eps = 1e-15 * max(1.0, now)
        if 0 <= ra <= eps:
            iv = a[ia]
            extra = now - sa - (iv[1] - iv[0])
            if extra > eps:
                out.append((False, iv[2], extra))
            ia += 1
            ra = -1.0
        if 0 <= rb <= eps:
            iv = b[ib]
            extra = now - sb - (iv[1] - iv[0])
            if extra > eps:
                out.append((True, iv[2], extra))
            ib += 1
            rb = -1.0
        if ra < 0 and ia < na and a[ia][0] <= now:
            ra, sa = a[ia][1] - a[ia][0], now
        if rb < 0 and ib < nb and b[ib][0] <= now:
            rb, sb = b[ib][1] - b[ib][0], now


def _merge(intervals):
    out = []
    for a, b in sorted(intervals):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return out


def _overlap(merged, a, b) -> float:
    import bisect
    i = max(0, bisect.bisect_right([x[0] for x in merged], a) - 1)  # small lists per stage
    tot = 0.0
    while i < len(merged) and merged[i][0] < b:
        tot += max(0.0, min(b, merged[i][1]) - max(a, merged[i][0]))
        i += 1
    return tot


def critical_path(ex: Execution) -> list[int]:
    """Task ids from the first to the last task of the chain that sets the step time."""
    g = ex.graph
    n = len(g.dur)
    if not n:
        return []
    rel = ex.release_s
    prev_on_stream = _structure(g)[1]
    t = rel.index(max(rel))  # the first task to release last
    path = [t]
    while True:
        cands = [(ex.end_s[d], d) if d >= 0 else (rel[~d], ~d) for d in g.deps[t]]
        if prev_on_stream[t] >= 0:
            cands.append((rel[prev_on_stream[t]], prev_on_stream[t]))
        if not cands:
            break
        when, u = max(cands)
        if when < ex.start_s[t] - 1e-9 * max(1.0, ex.start_s[t]) or when <= 0.0:
            break
        path.append(u)
        t = u
    path.reverse()
    return path


def breakdown(ex: Execution, ref: int | None = None, path=None) -> dict:
    """Seconds per BREAKDOWN_KEYS category along the critical path; they sum to the step time.

    The chain's tasks on the stage where it spends most time count in their own
    categories; compute passes of other stages on it are the pipeline bubble.
    """
    g = ex.graph
    path = critical_path(ex) if path is None else path
    out = dict.fromkeys(BREAKDOWN_KEYS, 0.0)
    if not path:
        return out
    if ref is None:
        ref = reference_stage(ex, path)
    nxt = [ex.start_s[u] for u in path[1:]] + [ex.step_time_s]
    for t, until in zip(path, nxt):
        # the path holds task t from its start until the next task on it starts: its pass,
        # then (if the next task waited for it) its send
        own = g.stage[t] == ref
        ran = ex.end_s[t] - ex.start_s[t]
        covered = until - ex.start_s[t]
        parts = g.parts[t]
        if g.post[t] > 0:  # the send's part comes last (graph._send)
            parts, send = parts[:-1], parts[-1]
            out[send[0]] += max(0.0, covered - ran)
        nominal = sum(sec for _, sec in parts)
        scale = min(covered, ran) / nominal if nominal > 0 else 0.0
        for cat, sec in parts:
            out[cat if own or cat not in _PASS else "pipeline_bubble"] += sec * scale
    rest = ex.step_time_s - sum(out.values())
    out["other"] += rest if rest > 1e-9 * ex.step_time_s else 0.0
    return out


_PASS = ("compute", "recompute", "tp_comm", "cp_comm", "ep_comm")


def reference_stage(ex: Execution, path=None) -> int:
    """The stage whose compute stream the critical path follows longest."""
    g = ex.graph
    on = {}
    for t in critical_path(ex) if path is None else path:
        if g.stream[t] % NS == COMPUTE:
            on[g.stage[t]] = on.get(g.stage[t], 0.0) + g.dur[t]
    return max(on, key=lambda s: (on[s], -s)) if on else 0


def memory_peaks(ex: Execution) -> list[float]:
    """Peak activation bytes per stage over the step: taken at a pass's start, returned
    at the end of the pass that consumes them (B, or W when split), frees first on ties."""
    g = ex.graph
    tasks, stage, nbytes, at_end = _memory_events(g)
    times = np.where(at_end, np.asarray(ex.end_s)[tasks], np.asarray(ex.start_s)[tasks])
    # by stage, then time, returns (at_end) before takes at the same time
    order = np.lexsort((~at_end, times, stage))
    nbytes = nbytes[order]
    bounds = np.searchsorted(stage[order], np.arange(g.p + 1))
    return [base + (max(0.0, float(np.cumsum(nbytes[a:b]).max())) if b > a else 0.0)
            for base, a, b in zip(g.base_bytes, bounds[:-1], bounds[1:])]


def _memory_events(g: TaskGraph):
    """(task, stage, signed bytes, whether at the task's end) of every activation take and
    return, as arrays; cached on the graph."""
    if "memory" not in g.cache:
        tasks = list(g.alloc) + list(g.free)
        g.cache["memory"] = (np.asarray(tasks, dtype=np.int64), np.asarray([g.stage[t] for t in tasks], dtype=np.int64),
                             np.asarray(list(g.alloc.values()) + [-b for b in g.free.values()], dtype=float),
                             np.asarray([False] * len(g.alloc) + [True] * len(g.free)))
    return g.cache["memory"]


def memory_timeline(ex: Execution):
    """pandas DataFrame (stage, time_s, activation_bytes) of the activation bytes over time."""
    import pandas as pd

    g = ex.graph
    rows = []
    for i in range(g.p):
        ev = sorted([(ex.start_s[t], 1, b) for t, b in g.alloc.items() if g.stage[t] == i]
                    + [(ex.end_s[t], 0, -b) for t, b in g.free.items() if g.stage[t] == i])
        cur = g.base_bytes[i]
        rows.append((i, 0.0, cur))
        for ts, _, b in ev:
            cur += b
            rows.append((i, ts, cur))
    return pd.DataFrame(rows, columns=["stage", "time_s", "activation_bytes"])


@dataclass(frozen=True)
class Simulation:
    step_time_s: float
    breakdown_s: dict
    activation_peak_bytes: list  # per stage
    simulated_tasks: int  # tasks actually executed
    graph_tasks: int  # tasks in the full step's graph
    simulation_s: float  # wall-clock seconds the simulation took
    extrapolated: bool


def _busy(ex: Execution) -> dict:
    """Seconds each stream is held over the step (its tasks as executed, sends included)."""
    g = ex.graph
    held = np.bincount(g.stream, weights=np.subtract(ex.end_s, ex.start_s) + np.asarray(ex.post_s))
    return {s: float(held[s]) for s in set(g.stream)}


def _falls_behind(ex0: Execution, ex1: Execution) -> bool:
    """Whether some stream's work grows faster with m than the step time does: that stream
    (a dp stream the compute never waits for, say) falls ever further behind, so the step
    is not yet affine at these m (the larger slope takes over later)."""
    slope = ex1.step_time_s - ex0.step_time_s
    b0, b1 = _busy(ex0), _busy(ex1)
    return any(b1[s] - b0.get(s, 0.0) > slope * (1 + 1e-9) + 1e-12 for s in b1)


def _alone_ends(ex: Execution) -> np.ndarray:
    """Each stage's makespan were it on its own: its tasks with their executed durations and
    send holds, each waiting only for its own stage's tasks (other stages' passes arrive at
    once)."""
    g = ex.graph
    n = len(g.dur)
    if "alone" not in g.cache:
        _structure(g)
        wait_at, waiter, stage = g.cache["waits"]
        own = stage[wait_at >> 1] == stage[waiter]
        g.cache["alone"] = _split(wait_at[own], waiter[own], n)
    alone = g.cache["alone"]
    dur = np.subtract(ex.end_s, ex.start_s).tolist()
    post = ex.post_s
    times = [0.0] * (2 * n)
    at = times.__getitem__
    for t in g.cache["order"]:
        w = alone[t]
        e = times[t + t] = (max(map(at, w)) if w else 0.0) + dur[t]
        times[t + t + 1] = e + post[t]
    ends = np.zeros(g.p)
    np.maximum.at(ends, g.stage, times[1::2])
    return ends


def _outpaced(ex0: Execution, ex1: Execution) -> bool:
    """Whether some stage, on its own, needs more time per period than the step grows by: it
    keeps pace only by using up slack its waits gave it in the first periods, and once that
    is spent its slower period takes over (a ZB-H1 stage with per-pass ZeRO-3 gathers kept
    pace for six periods). Slack is used up where neither the step nor any stream's busy time
    shows it (_falls_behind), but the stage's own makespan does."""
    slope = ex1.step_time_s - ex0.step_time_s
    grow = _alone_ends(ex1) - _alone_ends(ex0)
    return bool((grow > slope * (1 + 1e-9) + 1e-12).any())


def _one(layout: Layout, m: int, slowdown: float):
    g = build(layout, m)
    return g, run_with_slowdown(g, slowdown)


@contextmanager
def _collector_paused():
    """Python's cyclic garbage collector paused: building and executing a graph allocates
    tens of thousands of lists and tuples, each allocation burst triggering a collection
    that re-walks the graph already built (about a tenth of the time); the graph makes no
    reference cycles for it to find."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def simulate(layout: Layout, periodic: bool = True) -> Simulation:
    """Step time, breakdown and activation peaks of a Layout by executing its task graph."""
    with _collector_paused():
        return _simulate(layout, periodic)


def _simulate(layout: Layout, periodic: bool) -> Simulation:
    t0 = time.perf_counter()
    p, m = int(layout.p), int(layout.m)
    slowdown = layout.cluster.accelerator.overlap_slowdown
    # A named schedule repeats every p micro-batches, and so does the step: its time is
    # affine in m from m = p on (interleaved's longer warm-up changes the activation peaks,
    # not the time: _settled_peaks), unless some stream's backlog grows (_falls_behind).
    # Checked against full runs over random plans (tests/test_engine.py); not done where a
    # copy backlog can build up for a while before it settles (activation offload) nor for
    # the V shapes, whose greedy orders need not repeat every p micro-batches (random plans
    # disagreed).
    plan = layout.plan
    unsettled = plan.offload.activations != "none" or layout.schedule.placement == "v"
    # from 2p on where per-micro-batch ZeRO-2/3 traffic paces the first period differently
    # (interleaved's forwards there all run before its backwards; as random plans showed), and
    # where the torch pipeline's buffers grow with m (interleaved's peaks need two runs holding
    # the full step's chunks in flight: _settled_peaks)
    m0 = 2 * p if plan.zero_stage >= 2 or layout.pipe is not None else p
    if periodic and plan.schedule_ops is None and not unsettled and p > 1 and m > m0 + 2 * p:
        runs = [(mq, *_one(layout, mq, slowdown)) for mq in (m0, m0 + p)]
        extrapolated = _extrapolate(layout, runs, m, t0)
        if extrapolated is not None:
            return extrapolated
    g, ex = _one(layout, m, slowdown)
    return Simulation(ex.step_time_s, breakdown(ex), memory_peaks(ex), len(g), len(g),
                      time.perf_counter() - t0, False)


def _extrapolate(layout: Layout, runs: list, m: int, t0: float) -> Simulation | None:
    """The step for m micro-batches from two executions (m_q, graph, execution) a period
    apart, or None where the step is not yet affine in m. The step time is affine from one
    period on even where the activation peaks are not (interleaved's warm-up fills more than
    p micro-batches' chunks): a stage's peak is taken from a run that holds as many chunks in
    flight as the full step (Schedule.in_flight), else extrapolated (GPipe's grows with m)."""
    p = int(layout.p)
    (m0, g0, ex0), (_, g1, ex1) = runs
    k = (m - m0) / p
    path1 = critical_path(ex1)
    ref = reference_stage(ex1, path1)
    b0, b1 = breakdown(ex0, ref), breakdown(ex1, ref, path1)
    bd = {key: b0[key] + k * (b1[key] - b0[key]) for key in BREAKDOWN_KEYS}
    step = ex0.step_time_s + k * (ex1.step_time_s - ex0.step_time_s)
    # a stream whose backlog grows, a stage running out of slack, or a critical path that
    # changes route: no extrapolation
    if _falls_behind(ex0, ex1) or min(bd.values()) < -1e-9 * step or _outpaced(ex0, ex1):
        return None
    peaks = [memory_peaks(ex) for _, _, ex in runs]
    settled = _settled_peaks(layout, [mq for mq, _, _ in runs], m, peaks)
    if settled is None:
        return None
    full = int(round(len(g0) + k * (len(g1) - len(g0))))
    return Simulation(step, bd, settled, sum(len(g) for _, g, _ in runs), full, time.perf_counter() - t0, True)


def _settled_peaks(layout: Layout, ms: list, m: int, peaks: list) -> list | None:
    """Each stage's activation peak at m micro-batches from its peaks at the two runs' counts
    `ms`: that of the runs holding the full step's chunks in flight (they must agree), else
    affine in m through both (also where the torch pipeline's buffers grow with m,
    pipebuffers.py, if both runs hold the full step's chunks); None where the runs holding
    as many chunks disagree."""
    p, v, schedule = int(layout.p), int(layout.v), layout.schedule
    out = []
    for i in range(p):
        target = schedule.in_flight(p, m, v, i)
        same = [run[i] for mq, run in zip(ms, peaks) if schedule.in_flight(p, mq, v, i) == target]
        if layout.pipe is not None:  # its buffers grow with m: affine through two full runs
            if len(same) < 2:
                return None
        elif same:
            if any(abs(x - same[0]) > 1e-9 * max(same[0], 1.0) for x in same):
                return None
            out.append(same[0])
            continue
        a, b = peaks[0][i], peaks[1][i]
        out.append(a + (m - ms[0]) / (ms[1] - ms[0]) * (b - a))
    return out


def execute(layout: Layout) -> Execution:
    """The full execution of one step (for traces and timelines)."""
    with _collector_paused():
        return _one(layout, int(layout.m), layout.cluster.accelerator.overlap_slowdown)[1]
