"""Discrete-event execution of a task graph, its critical path and memory timeline.

Execution: every stream is an in-order queue (a CUDA stream, a NIC queue): a task starts
when the task before it on its stream has ended and all its dependencies have ended.
Tasks become ready through dependency counters, so one pass over the tasks and edges
gives every start time (O(tasks + edges)); a cycle (an impossible explicit schedule) is
an InputError. Different streams of a device overlap; that overlap comes only from the
graph. Contention is then refined once: transfers that overlap on a device's NIC share
its bandwidth (processor sharing: k at once each move at 1/k of their rate), and compute
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
there. For ZeRO-0/1 plans without offload, when it saves work, `simulate` executes the graph
for m0 and m0 + p micro-batches (m0 = p, or 2p for interleaved) and extrapolates; tests
check the equality with a full execution.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

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
    """Start and end seconds of every task: in-order streams, dependencies respected."""
    n = len(g.dur)
    dur = g.dur if durations is None else durations
    post = g.post if posts is None else posts
    stream = g.stream
    after_end, after_send, queues, npend = _structure(g)
    pending = list(npend)
    ready = [0.0] * n
    start = [0.0] * n
    end = [0.0] * n
    rel = [0.0] * n
    pos = dict.fromkeys(queues, 0)
    free = dict.fromkeys(queues, 0.0)
    todo = list(queues)
    while todo:
        s = todo.pop()
        q = queues[s]
        i, f = pos[s], free[s]
        nq = len(q)
        while i < nq:
            t = q[i]
            if pending[t]:
                break
            st = ready[t] if ready[t] > f else f
            start[t] = st
            e = end[t] = st + dur[t]
            f = rel[t] = e + post[t]
            i += 1
            for us, te in ((after_end[t], e), (after_send[t], f)):
                for u in us:
                    pending[u] -= 1
                    if ready[u] < te:
                        ready[u] = te
                    if not pending[u]:
                        todo.append(stream[u])
        pos[s], free[s] = i, f
    if any(pos[s] < len(q) for s, q in queues.items()):
        raise InputError("plan.schedule_ops", "cyclic", "the schedule waits on itself: a pass is ordered before "
                         "the pass it depends on")
    return Execution(g, start, end, post, rel, max(rel) if rel else 0.0)


def _structure(g: TaskGraph):
    """Dependents (after end / after send), per-stream queues and dependency counts; cached
    on the graph, which a refinement executes twice."""
    if "structure" not in g.cache:
        n = len(g.dur)
        after_end = [[] for _ in range(n)]
        after_send = [[] for _ in range(n)]
        for t, ds in enumerate(g.deps):
            for d in ds:
                if d >= 0:
                    after_end[d].append(t)
                else:
                    after_send[~d].append(t)
        queues = {}
        for t, s in enumerate(g.stream):
            queues.setdefault(s, []).append(t)
        g.cache["structure"] = (after_end, after_send, queues, [len(d) for d in g.deps])
    return g.cache["structure"]


def run_with_slowdown(g: TaskGraph, slowdown: float) -> Execution:
    """Execute, then refine once for contention: NIC transfers of a device that overlap
    share its bandwidth (k at a time: each runs at 1/k of its rate), and compute kernels
    slow down by `slowdown` x their overlap with communication; re-execute with the
    stretched durations (one fixed-point step)."""
    ex = run(g)
    nic = g.nic
    if slowdown <= 0 and not nic and not g.send_nic:
        return ex
    if "comm" not in g.cache:
        g.cache["comm"] = [t for t in range(len(g.dur)) if g.stream[t] % NS != COMPUTE or g.post[t] > 0]
    start, end, stage = ex.start_s, ex.end_s, g.stage
    nic_iv, send_iv, comm = {}, {}, {}
    for t in g.cache["comm"]:
        if g.post[t] > 0:
            iv = (end[t], end[t] + g.post[t], t, -1)  # queue -1: the stage's sends
            if g.send_nic:
                send_iv.setdefault(stage[t], []).append(iv)
        elif g.dur[t] > 0:
            iv = (start[t], end[t], t, g.stream[t])
            if t in nic:
                nic_iv.setdefault(stage[t], []).append(iv)
        else:
            continue
        if slowdown > 0:
            comm.setdefault(stage[t], []).append(iv[:2])
    dur, post = list(g.dur), list(g.post)
    changed = False
    for i, ivs in nic_iv.items():
        # sends follow one another on the compute stream: only those meeting a DP transfer share
        spans = _merge([iv[:2] for iv in ivs])
        ivs = ivs + _meeting(send_iv.get(i, ()), spans)
        for t, queue, extra in _shared(ivs):
            changed = True
            if queue == -1:
                post[t] += extra
            else:
                dur[t] += extra
    if slowdown > 0:
        merged = {s: _merge(v) for s, v in comm.items()}
        for t in range(len(g.dur)):
            if g.stream[t] % NS == COMPUTE and g.stage[t] in merged:
                extra = slowdown * _overlap(merged[g.stage[t]], ex.start_s[t], ex.end_s[t])
                if extra > 0:
                    changed = True
                    dur[t] += extra
    return run(g, dur, post) if changed else ex


def _meeting(intervals, spans):
    """The intervals (in order of start) that overlap any of the merged, sorted spans."""
    out, k = [], 0
    for iv in intervals:
        while k < len(spans) and spans[k][1] <= iv[0]:
            k += 1
        if k < len(spans) and spans[k][0] < iv[1]:
            out.append(iv)
    return out


def _shared(intervals):
    """(task, queue, extra seconds) for transfers sharing one link, by processor sharing.

    Transfers of one stream (the dp stream, a host-copy stream; the sends, which follow one
    another: queue -1) queue in order; the transfers at the heads of the streams share the
    link: while k are in
    service each moves at 1/k of its full rate. A transfer enters service at its start in
    the first execution (or when its predecessor on the stream leaves, if later); extra =
    its service time under sharing - its time alone.
    """
    queues = {}
    for iv in sorted(intervals):
        queues.setdefault(iv[3], []).append(iv)  # one queue per stream
    if len(queues) < 2:
        return []
    heads = {q: 0 for q in queues}
    out = []
    active = {}  # stream -> [remaining seconds at full rate, service start, interval]
    now = 0.0

    def admit(q, at):
        iv = queues[q][heads[q]]
        active[q] = [iv[1] - iv[0], max(at, iv[0]), iv]

    waiting = {q: queues[q][0][0] for q in queues}  # next arrival per idle stream
    while active or waiting:
        arrive_q = min(waiting, key=waiting.get) if waiting else None
        arrive = waiting[arrive_q] if waiting else float("inf")
        if not active:
            now = arrive
            admit(arrive_q, now)
            del waiting[arrive_q]
            continue
        k = len(active)
        q_min = min(active, key=lambda q: active[q][0])
        done_at = now + active[q_min][0] * k
        if arrive < done_at:
            step, now = (arrive - now) / k, arrive
            for st in active.values():
                st[0] -= step
            admit(arrive_q, now)
            del waiting[arrive_q]
            continue
        step, now = active[q_min][0], done_at
        for st in active.values():
            st[0] -= step
        for q in [q for q, st in active.items() if st[0] <= 1e-15 * max(1.0, now)]:
            _, began, iv = active.pop(q)
            extra = (now - began) - (iv[1] - iv[0])
            if extra > 1e-15 * max(1.0, now):
                out.append((iv[2], iv[3], extra))
            heads[q] += 1
            if heads[q] < len(queues[q]):
                nxt = queues[q][heads[q]]
                if nxt[0] <= now:
                    admit(q, now)
                else:
                    waiting[q] = nxt[0]
    return out


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
    prev_on_stream = [-1] * n
    last = {}
    for t in range(n):
        s = g.stream[t]
        prev_on_stream[t] = last.get(s, -1)
        last[s] = t
    t = max(range(n), key=lambda k: (rel[k], -k))
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
    events = [[] for _ in range(g.p)]
    for t, b in g.alloc.items():
        events[g.stage[t]].append((ex.start_s[t], 1, b))
    for t, b in g.free.items():
        events[g.stage[t]].append((ex.end_s[t], 0, -b))
    peaks = []
    for i in range(g.p):
        cur = peak = 0.0
        for _, _, b in sorted(events[i]):
            cur += b
            peak = max(peak, cur)
        peaks.append(g.base_bytes[i] + peak)
    return peaks


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
    g = ex.graph
    out = {}
    for t, s in enumerate(g.stream):
        out[s] = out.get(s, 0.0) + ex.end_s[t] - ex.start_s[t] + ex.post_s[t]
    return out


def _falls_behind(ex0: Execution, ex1: Execution) -> bool:
    """Whether some stream's work grows faster with m than the step time does: that stream
    (a dp stream the compute never waits for, say) falls ever further behind, so the step
    is not yet affine at these m (the larger slope takes over later)."""
    slope = ex1.step_time_s - ex0.step_time_s
    b0, b1 = _busy(ex0), _busy(ex1)
    return any(b1[s] - b0.get(s, 0.0) > slope * (1 + 1e-9) + 1e-12 for s in b1)


def _one(layout: Layout, m: int, slowdown: float):
    g = build(layout, m)
    return g, run_with_slowdown(g, slowdown)


def simulate(layout: Layout, periodic: bool = True) -> Simulation:
    """Step time, breakdown and activation peaks of a Layout by executing its task graph."""
    t0 = time.perf_counter()
    p, m = int(layout.p), int(layout.m)
    slowdown = layout.cluster.accelerator.overlap_slowdown
    # A named schedule repeats every p micro-batches past its warm-up (interleaved: up to
    # 3p-2 chunks in flight, one period more), and so does the step: affine in m from m0 on,
    # unless some stream's backlog grows (_falls_behind). Checked against full runs over
    # random plans (tests/test_engine.py); not done where a copy backlog can build up for a
    # while before it settles (activation offload) nor for the V shapes, whose greedy orders
    # need not repeat every p micro-batches (random plans disagreed).
    plan = layout.plan
    unsettled = plan.offload.activations != "none" or layout.schedule.placement == "v"
    m0 = p if layout.v == 1 else 2 * p
    points = 2 if plan.zero_stage <= 1 else 3  # per-micro-batch ZeRO-2/3 traffic: a third period checks the slope
    if periodic and plan.schedule_ops is None and not unsettled and p > 1 and m > m0 + points * p:
        runs = [_one(layout, m0 + q * p, slowdown) for q in range(points)]
        extrapolated = _extrapolate(runs, m, m0, p, t0)
        if extrapolated is not None:
            return extrapolated
    g, ex = _one(layout, m, slowdown)
    return Simulation(ex.step_time_s, breakdown(ex), memory_peaks(ex), len(g), len(g),
                      time.perf_counter() - t0, False)


def _extrapolate(runs: list, m: int, m0: int, p: int, t0: float) -> Simulation | None:
    """The step for m micro-batches from executions at m0, m0 + p (and m0 + 2p: then the slopes
    of both periods must agree), or None where the step is not yet affine in m."""
    (g0, ex0), (g1, ex1) = runs[0], runs[1]
    k = (m - m0) / p
    path1 = critical_path(ex1)
    ref = reference_stage(ex1, path1)
    b0, b1 = breakdown(ex0, ref), breakdown(ex1, ref, path1)
    bd = {key: b0[key] + k * (b1[key] - b0[key]) for key in BREAKDOWN_KEYS}
    step = ex0.step_time_s + k * (ex1.step_time_s - ex0.step_time_s)
    peaks0, peaks1 = memory_peaks(ex0), memory_peaks(ex1)
    # a stream whose backlog grows, or a critical path that changes route: no extrapolation
    if _falls_behind(ex0, ex1) or min(bd.values()) < -1e-9 * step:
        return None
    if len(runs) > 2:
        ex2 = runs[2][1]
        tol = 1e-9 * ex2.step_time_s
        if (abs((ex2.step_time_s - ex1.step_time_s) - (ex1.step_time_s - ex0.step_time_s)) > tol
                or _falls_behind(ex1, ex2)
                or any(abs((c - b) - (b - a)) > 1e-9 * max(c, 1.0)
                       for a, b, c in zip(peaks0, peaks1, memory_peaks(ex2)))):
            return None
    # peaks are constant past the warm-up for 1F1B-like schedules, affine in m for GPipe
    peaks = [a + k * (b - a) for a, b in zip(peaks0, peaks1)]
    full = int(round(len(g0) + k * (len(g1) - len(g0))))
    return Simulation(step, bd, peaks, sum(len(g) for g, _ in runs), full, time.perf_counter() - t0, True)


def execute(layout: Layout) -> Execution:
    """The full execution of one step (for traces and timelines)."""
    return _one(layout, int(layout.m), layout.cluster.accelerator.overlap_slowdown)[1]
