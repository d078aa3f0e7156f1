"""Pipeline schedules: one class each, registered by name.

A schedule says, for every pipeline stage, in which order its device runs the passes of the
micro-batches, where the model chunks sit, and what that costs in closed form:

- `orders(p, m, v)`: per stage, a list of passes (kind, chunk, micro-batch). Kinds: F
  forward; B backward with the weight gradient; I backward for the input gradient only,
  whose weight gradient W runs later (zero-bubble schedules split the backward pass).
- `placement`: which device and chunk hold virtual stage k of the p·v model chunks: "loop"
  (stage k mod p, chunk k div p: Megatron-LM's interleaving) or "v" (chunk 0 runs down the
  devices, chunk 1 back up: stage 0 holds the first and the last virtual stage).
- `in_flight(p, m, v, stage)`: model chunks of micro-batches whose activations a stage
  holds at its peak (forward done, backward not), and how many of them belong to the chunk
  holding the embedding; broadcast-safe closed forms, equal to what `orders` gives
  (`peak_in_flight`, checked in tests/test_schedules.py).
- `step_s(times, p, m, v)`: the closed-form step time of the pipeline for per-stage pass
  times (the analytic engine's bubble); `pipeline_makespan` executes an order instead, the
  reference the closed forms are tested against.

Dependencies between stages are not part of a schedule: the forward pass of virtual stage
k waits for that of k-1, the backward pass of k for that of k+1 (graph.py adds them from
`placement`). `check_order` finds, once at compile time, an order that waits on itself.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from .bcast import amax, maximum, minimum, where
from .errors import InputError

FWD, BWD, BWD_INPUT, WGT = "F", "B", "I", "W"
BACKWARDS = (BWD, BWD_INPUT)


# ------------------------------------------------------------------ placement of chunks

def loop_stage(k, p):
    """(stage, chunk) of virtual stage k under loop placement."""
    return k % p, k // p


def v_stage(k, p):
    """(stage, chunk) of virtual stage k under V placement (v = 2)."""
    return (k, 0) if k < p else (2 * p - 1 - k, 1)


# ------------------------------------------------------------------ stage times

@dataclass(frozen=True)
class StageTimes:
    """Seconds per micro-batch of one device's passes, summed over its chunks: forward `f`,
    backward for the input gradient `b` (with recomputation), weight gradient `w`, for each
    representative pipeline stage (arrays of stages, `count` = how many stages each stands
    for; numbers may also carry a plan axis)."""

    f: tuple
    b: tuple
    w: tuple
    count: tuple
    critical: int | object  # index into the tuples of the slowest stage (f+b+w), per plan
    stage_rep: tuple | None = None  # each stage's representative where the middle ranks differ (Layout.rep_of_stage)

    def pick(self, values: tuple):
        out = values[-1]
        for i in range(len(values) - 2, -1, -1):
            out = where(self.critical == i, values[i], out)
        return out

    def total(self, i):
        return self.f[i] + self.b[i] + self.w[i]

    def others(self, per_stage) -> object:
        """sum over every stage but the critical one of per_stage(i) (a function of the
        representative index)."""
        values = [per_stage(i) for i in range(len(self.f))]
        return sum(k * x for k, x in zip(self.count, values)) - self.pick(tuple(values))


def stage_times(f: list, b: list, w: list, count: list, stage_rep: tuple | None = None) -> StageTimes:
    totals = np.stack(np.broadcast_arrays(*[np.asarray(x + y + z, dtype=float) for x, y, z in zip(f, b, w)]))
    # a representative standing for no stage (count 0) is never critical
    counts = np.stack(np.broadcast_arrays(*[np.asarray(c) for c in count]))
    totals = np.where(counts > 0, totals, -np.inf)
    critical = np.argmax(totals, axis=0)
    return StageTimes(tuple(f), tuple(b), tuple(w), tuple(count), critical if np.ndim(critical) else int(critical),
                      stage_rep)


# ------------------------------------------------------------------ schedules

class Schedule:
    """Base class: a 1F1B-like schedule with loop placement and one chunk per device."""

    name = ""
    placement = "loop"
    description = ""
    split_backward = False  # the last pass producing a chunk's gradients is a W

    def chunks(self, vpp: int) -> int:
        """Model chunks per device for the plan's `vpp`."""
        return 1

    def check(self, p: int, m: int, vpp: int) -> None:
        """Raise InputError for a pipeline this schedule cannot run."""
        if vpp != 1:
            raise InputError("plan.vpp", vpp, f"vpp > 1 needs schedule: interleaved ({self.name} runs one chunk)")

    def orders(self, p: int, m: int, v: int) -> list[list[tuple]]:
        raise NotImplementedError

    def stage_chunk(self, k: int, p: int) -> tuple[int, int]:
        return v_stage(k, p) if self.placement == "v" else loop_stage(k, p)

    def embedding_stage(self, p: int) -> int:
        return 0

    def head_stage(self, p):
        """The stage holding the last virtual stage (lm_head and loss)."""
        return 0 * p if self.placement == "v" else p - 1

    def in_flight(self, p, m, v, stage):
        """(chunks, embedding chunks) in flight at the stage's peak; broadcast-safe."""
        return _generic_in_flight(self, p, m, v, stage)

    def forward_moments(self, p: int, m: int, v: int, stage: int) -> np.ndarray:
        """The stage's pipeline counts after each of its forwards (forward_moments_in_order;
        cached per shape; scalar shapes only)."""
        return _forward_moments_cached(self.name, int(p), int(m), int(v), int(stage))

    def offloaded_chunks(self, p, m, v, stage) -> tuple:
        """Chunk passes of a stage whose activations activation offload copies out and reads
        back, as (reads overlapping a forward pass, reads overlapping a backward pass): all
        but those whose backward is the stage's very next pass (offloaded_in_order; cached
        per shape; broadcast-safe)."""
        fn = _offloaded_cached
        return tuple(_per_shape(lambda pp, mm, vv, ss, k=k: fn(self.name, pp, mm, vv, ss)[k], p, m, v, stage)
                     for k in (0, 1))

    def grad_tail(self, p, m, v, stage) -> list:
        """Per chunk, the passes (F, B, I, W) a stage runs after the last pass producing that
        chunk's gradients, where its reduction starts, and whether that pass is a whole
        backward B (1) or a W (0). Loop placement: in the cooldown of Megatron-LM's
        interleaved order chunk c's last backward is followed by c·p others."""
        return [(0, c * p * (v > c), 0, 0, int(not self.split_backward)) for c in range(int(amax(v)))]

    def gather_lead(self, p, v, stage) -> list:
        """Per chunk, how many chunk forwards after the stage's first pass its first forward
        can start at the earliest: the pipeline's fill, its virtual stage's distance from the
        stage's first (ZeRO-1/2's weight gathers run ahead of these, analytic.py). Loop
        placement: chunk c's first forward is virtual stage c·p + stage, the c·p forwards of
        Megatron-LM's interleaved warm-up before it; V placement: chunk 1 is virtual stage
        2p-1-stage, and follows chunk 0's first forward on the stage at least. Broadcast-safe."""
        p, stage = np.asarray(p), np.asarray(stage)
        if self.placement == "v":
            return [np.zeros_like(p), np.maximum(1, 2 * p - 1 - 2 * stage)]
        return [c * p for c in range(int(amax(v)))]

    def drain_tail(self, p, m, v, stage) -> tuple:
        """(F, B, I, W) passes a stage runs after its last backward pass (B, or I where the
        backward is split): the step's last backward passes run from stage p-1 down to stage 0,
        and what follows them on each stage sets when it ends (analytic.py's end of step).
        An unsplit schedule ends on that B; a split one reads it from its orders (cached per
        shape; broadcast-safe)."""
        if not self.split_backward:
            return (0, 0, 0, 0)
        return tuple(_per_shape(lambda pp, mm, vv, ss, k=k: _drain_tail_cached(self.name, pp, mm, vv, ss)[k],
                                p, m, v, stage) for k in range(4))

    def closed_run(self, t: StageTimes, p, m, v, stages) -> tuple:
        """(step_s, and for each of `stages` how long before the step it ends where the form
        says so, else NaN: analytic.ends_before_last_s works it out)."""
        return self.step_s(t, p, m, v), [np.nan] * len(stages)

    def sends(self, p, v, stage) -> tuple:
        """(forward, backward) pipeline sends per micro-batch of a stage's device: a forward
        pass sends to the next virtual stage, a backward pass to the previous one, when that
        sits on another device. Loop placement: v each, less one where the pipeline ends;
        V placement: 2 each, less one on stage 0 (it holds both ends) and on stage p-1 (the
        turn of the V stays on it). Broadcast-safe."""
        p, stage = np.asarray(p), np.asarray(stage)
        first, last = (stage == 0).astype(int), (stage == p - 1).astype(int)
        if self.placement == "v":
            fwd, bwd = 2 - first - last, 2 - first - last
        else:
            fwd, bwd = v - last, v - first
        return np.where(p > 1, fwd, 0), np.where(p > 1, bwd, 0)

    def step_s(self, t: StageTimes, p, m, v):
        """Closed-form step time of the pipeline (no DP, optimizer or offload)."""
        raise NotImplementedError

    def closed_form_holds(self, p, m):
        """Where step_s is exact for plans whose middle ranks are alike (broadcast over plans)."""
        return True

    def pipeline_s(self, t: StageTimes, p, m, v):
        """The pipeline's step: the closed form where the ranks between the first and the last
        are alike and the schedule's form holds (closed_form_holds), else the schedule's order
        executed with each stage's own pass times (pipeline_makespan, as the V shapes always
        are): the closed forms charge the slowest stage every period and every other stage
        once, but a stage after the slowest one hides part of the last micro-batch's passes
        behind the slowest stage's cool-down (random unequal-middle plans put the 1F1B form up
        to 11 % above the executed order)."""
        return self.pipeline_run(t, p, m, v)[0]

    def pipeline_run(self, t: StageTimes, p, m, v, stages=()) -> tuple:
        """(pipeline_s, and for each of `stages` (stage indices, numbers or arrays over plans)
        how long before the stage that ends last it finishes its passes: read off the order
        where it is executed, from the closed form where that says (closed_run), else NaN, and
        the analytic engine works the ends out from the drain: analytic.ends_before_last_s)."""
        holds = np.asarray(self.closed_form_holds(p, m))
        if self.placement != "v" and t.stage_rep is None and holds.all():
            return self.closed_run(t, p, m, v, stages)
        shape = np.broadcast(np.asarray(p), np.asarray(m), np.asarray(v)).shape
        if self.placement == "v":
            return _makespans(self, t, p, m, v, stages=stages)
        holds = np.broadcast_to(holds, shape)
        alike = np.ones(1, bool) if t.stage_rep is None else alike_middles(stage_rep_grid(t.stage_rep), p)
        closed, closed_slacks = self.closed_run(t, p, m, v, stages) if alike.any() and holds.any() else (None, None)
        closed = None if closed is None else np.broadcast_to(closed, shape)

        step, slacks = _makespans(self, t, p, m, v, lambda i: closed[i] if holds[i] and alike[i[0] if alike.shape[0] > 1
                                                                                            else 0] else None, stages)
        if closed is not None:
            slacks = [np.where(np.isnan(x), c, x) for x, c in zip(slacks, closed_slacks)]
        return step, slacks


def _generic_in_flight(schedule: Schedule, p, m, v, stage):
    """In-flight counts read from the schedule's own orders (cached per shape); used where no
    closed form is given, and broadcast over numpy arrays of shapes."""
    return tuple(_per_shape(lambda pp, mm, vv, ss, k=k: _peak_cached(schedule.name, pp, mm, vv, ss)[k],
                            p, m, v, stage) for k in (0, 1))


def _periods(p: int, m: int) -> tuple[int, int, int] | None:
    """Three micro-batch counts a period apart whose orders end as the order of m does, or None
    where m <= 4p (that order is read whole): past 2p micro-batches the orders repeat every p,
    their tails as m modulo p, so the counts are 2p + (m - 2p) mod p and one and two periods on."""
    if m <= 4 * p:
        return None
    m0 = 2 * p + (m - 2 * p) % p
    return m0, m0 + p, m0 + 2 * p


def _periodic_counts(count):
    """count(order, name, p, v, stage), pass counts read off one stage's order of a named
    schedule, for m micro-batches: the counts of the orders of _periods(p, m) where they change
    by the same step from one to the next, extrapolated to m (else the whole order is read).
    Cached per shape."""
    @lru_cache(maxsize=4096)
    def counts(name: str, p: int, m: int, v: int, stage: int):
        def at(k):
            return count(cached_orders(name, p, k, v)[stage], name, p, v, stage)

        periods = _periods(p, m)
        if periods is None:
            return at(m)
        first = at(periods[0])
        a, b, c = (np.array(x) for x in (first, at(periods[1]), at(periods[2])))
        if not np.array_equal(c - b, b - a):
            return at(m)
        out = (a + (m - periods[0]) // p * (b - a)).tolist()
        return [tuple(row) for row in out] if isinstance(first, list) else tuple(out)
    return counts


_peak_cached = _periodic_counts(
    lambda order, name, p, v, stage: peak_in_flight(order, 0 if stage == SCHEDULES[name].embedding_stage(p) else None))
_grad_tail_cached = _periodic_counts(lambda order, name, p, v, stage: grad_tail_in_order(order, v))
_drain_tail_cached = _periodic_counts(lambda order, name, p, v, stage: drain_tail_in_order(order))
_offloaded_cached = _periodic_counts(lambda order, name, p, v, stage: offloaded_in_order(order))


@lru_cache(maxsize=4096)
def _forward_moments_cached(name: str, p: int, m: int, v: int, stage: int) -> np.ndarray:
    return forward_moments_in_order(cached_orders(name, p, m, v)[stage], v)


def _per_shape(fn, p, m, v, stage):
    """fn(p, m, v, stage) on ints, elementwise over numpy arrays of shapes (computed once per
    distinct shape: a batch of plans shares few)."""
    arrays = np.broadcast_arrays(np.asarray(p), np.asarray(m), np.asarray(v), np.asarray(stage))
    if arrays[0].ndim == 0:
        return fn(int(p), int(m), int(v), min(int(stage), int(p) - 1))
    cols = [a.ravel().astype(np.int64) for a in arrays]
    if all(0 <= c.min() and c.max() < 2**bits for c, (_, bits) in zip(cols, _KEY_FIELDS)):
        # one int64 key per shape sorts far faster than np.unique over rows
        key = sum(c << shift for c, (shift, _) in zip(cols, _KEY_FIELDS))
        _, first, inverse = np.unique(key, return_index=True, return_inverse=True)
        unique = np.stack([c[first] for c in cols], axis=1)
    else:
        unique, inverse = np.unique(np.stack(cols, axis=1), axis=0, return_inverse=True)
    values = np.array([fn(int(pp), int(mm), int(vv), min(int(ss), int(pp) - 1)) for pp, mm, vv, ss in unique],
                      dtype=float)
    return values[inverse.ravel()].reshape(arrays[0].shape)


_KEY_FIELDS = ((44, 19), (24, 20), (20, 4), (0, 20))  # (shift, bits) of p, m, v, stage in _per_shape's key


@lru_cache(maxsize=512)
def cached_orders(name: str, p: int, m: int, v: int) -> tuple:
    """A named schedule's orders (immutable), built once per shape."""
    return tuple(tuple(o) for o in SCHEDULES[name].orders(p, m, v))


class GPipe(Schedule):
    """GPipe (Huang et al. 2019): all forward passes, then all backward passes."""

    name = "gpipe"
    description = "all forwards, then all backwards (Huang et al. 2019)"

    def orders(self, p, m, v):
        return [[(FWD, 0, j) for j in range(m)] + [(BWD, 0, j) for j in range(m)] for _ in range(p)]

    def in_flight(self, p, m, v, stage):
        every = np.broadcast_to(np.asarray(m), np.broadcast(np.asarray(p), np.asarray(stage)).shape) if np.ndim(
            stage) or np.ndim(p) else m
        return every, every

    def offloaded_chunks(self, p, m, v, stage):
        return _one_f_one_b_offloaded(m + 0 * np.asarray(stage), m)

    def step_s(self, t, p, m, v):
        # The first micro-batch's forward reaches the last stage after every other stage's
        # forward; the backward drains the same way: (m + p - 1)(f + b) for equal stages.
        return m * t.pick(tuple(t.total(i) for i in range(len(t.f)))) + t.others(t.total)


class OneFOneB(Schedule):
    """1F1B (Narayanan et al. 2021, PipeDream-Flush): stage i runs min(p-i-1, m) warm-up
    forwards, then one forward and one backward in turn, then drains the backwards."""

    name = "1f1b"
    description = "one forward, one backward (Narayanan et al. 2021)"

    def orders(self, p, m, v):
        out = []
        for i in range(p):
            warm = min(p - i - 1, m)
            ops = [(FWD, 0, j) for j in range(warm)]
            for k in range(m - warm):
                ops += [(FWD, 0, warm + k), (BWD, 0, k)]
            ops += [(BWD, 0, j) for j in range(m - warm, m)]
            out.append(ops)
        return out

    def in_flight(self, p, m, v, stage):
        n = minimum(p - stage, m)
        return n, n

    def offloaded_chunks(self, p, m, v, stage):
        return _one_f_one_b_offloaded(m, np.minimum(np.asarray(p) - stage - 1, m))

    def step_s(self, t, p, m, v):
        # Narayanan et al. 2021: bubble (p-1)(f+b) for equal stages, for every m >= 1.
        return m * t.pick(tuple(t.total(i) for i in range(len(t.f)))) + t.others(t.total)


class Interleaved(Schedule):
    """Interleaved 1F1B (Narayanan et al. 2021): v model chunks per device in loop placement;
    Megatron-LM's order (megatron/core/pipeline_parallel/schedules.py,
    forward_backward_pipelining_with_interleaving): virtual micro-batch k is chunk (k div p)
    mod v of micro-batch (k div pv)·p + k mod p, with 2(p-i-1) + (v-1)p warm-up forwards;
    backwards visit the chunks in reverse. With v = 1 Megatron-LM runs plain 1F1B."""

    name = "interleaved"
    description = "interleaved 1F1B over v model chunks per device (Narayanan et al. 2021)"

    def chunks(self, vpp):
        return vpp

    def check(self, p, m, vpp):
        if p == 1 and vpp > 1:
            raise InputError("plan.schedule", self.name, "interleaved needs pp > 1")
        if vpp > 1 and m % p:
            raise InputError("plan.global_batch", m, f"interleaved needs micro-batches per replica ({m}) to be a "
                             f"multiple of pp={p}")

    def orders(self, p, m, v):
        if v == 1:
            return ONE_F_ONE_B.orders(p, m, 1)
        total = m * v

        def fwd(k):
            return (FWD, (k // p) % v, (k // (p * v)) * p + k % p)

        def bwd(k):
            return (BWD, v - 1 - (k // p) % v, (k // (p * v)) * p + k % p)

        out = []
        for i in range(p):
            warm = min(2 * (p - i - 1) + (v - 1) * p, total)
            ops = [fwd(k) for k in range(warm)]
            for k in range(total - warm):
                ops += [fwd(warm + k), bwd(k)]
            ops += [bwd(k) for k in range(total - warm, total)]
            out.append(ops)
        return out

    def in_flight(self, p, m, v, stage):
        warm = minimum(2 * (p - stage - 1) + (v - 1) * p + 1, m * v)
        # chunk 0 (the embedding's) of the first `warm` virtual micro-batches: p of every p·v
        first = (warm // (p * v)) * p + minimum(warm % (p * v), p)
        one = minimum(p - stage, m)
        return where(v == 1, one, warm), where(v == 1, one, first)

    def offloaded_chunks(self, p, m, v, stage):
        p, v, stage = np.asarray(p), np.asarray(v), np.asarray(stage)
        warm = np.where(v == 1, np.minimum(p - stage - 1, m), np.minimum(2 * (p - stage - 1) + (v - 1) * p, m * v))
        fwd, bwd = _one_f_one_b_offloaded(m * v, warm)
        # On the last stage (warm-up (v-1)p) the steady pair (F of virtual micro-batch W+k, B of k)
        # is one chunk's own forward and backward when k falls in the first p of each group of
        # p·v: that chunk stays on the device.
        pairs = m * v - warm
        kept = (pairs // (p * v)) * p + np.minimum(pairs % (p * v), p)
        return np.where((stage == p - 1) & (v > 1), fwd - kept, fwd), bwd

    def step_s(self, t, p, m, v):
        # the fill and drain pass through 1/v of each other stage (Narayanan et al. 2021)
        return m * t.pick(tuple(t.total(i) for i in range(len(t.f)))) + t.others(t.total) / v


class ZBH1(OneFOneB):
    """ZB-H1 (Qi et al. 2024, "Zero Bubble Pipeline Parallelism", Sec. 3.1): the backward
    pass split into I (input gradient) and W (weight gradient); W passes fill the drain while
    the micro-batches in flight stay those of 1F1B, whose order its forwards and input-gradient
    passes keep (so it inherits 1F1B's in-flight and offload counts). Built as the paper's unit-time list
    schedule for F = I = W: in each slot a stage runs I if its gradient has arrived, else F
    while fewer than p - i micro-batches are in flight, else a waiting W; up to p - 1 W
    passes are postponed."""

    name = "zb-h1"
    description = "zero-bubble H1: split backward, W fills the drain (Qi et al. 2024)"
    split_backward = True

    def orders(self, p, m, v):
        done_f = [[-1] * m for _ in range(p)]  # slot at whose end F finished
        done_b = [[-1] * m for _ in range(p)]
        nf, nb, nw = [0] * p, [0] * p, [0] * p
        out = [[] for _ in range(p)]
        t = 0
        while any(nw[i] < m for i in range(p)):
            for i in range(p):
                j, f = nb[i], nf[i]
                b_ready = j < nf[i] and -1 < done_f[i][j] < t and (i == p - 1 or -1 < done_b[i + 1][j] < t)
                f_ready = f < m and (i == 0 or -1 < done_f[i - 1][f] < t) and nf[i] - nb[i] < p - i
                w_due = nw[i] < nb[i] and (nb[i] - nw[i] > p - 1 or nf[i] == m)
                if w_due and not b_ready:
                    out[i].append((WGT, 0, nw[i]))
                    nw[i] += 1
                elif b_ready:
                    out[i].append((BWD_INPUT, 0, j))
                    done_b[i][j] = t
                    nb[i] += 1
                elif f_ready:
                    out[i].append((FWD, 0, f))
                    done_f[i][f] = t
                    nf[i] += 1
                elif nw[i] < nb[i]:
                    out[i].append((WGT, 0, nw[i]))
                    nw[i] += 1
            t += 1
        return out

    def drain_tail(self, p, m, v, stage):
        """Once m >= p, stage s ends on s + 1 W passes, the ones it postponed while the last
        I passes came down to it (read off the orders for p <= 16, m < 60; tests/test_schedules.py
        checks it against them). With fewer micro-batches it is read from the orders."""
        p, m, v, stage = np.broadcast_arrays(np.asarray(p), np.asarray(m), np.asarray(v), np.asarray(stage))
        w = (stage + 1).astype(float)
        short = m < p
        if np.any(short):
            w = np.array(w, copy=True)
            w[short] = super().drain_tail(p[short], m[short], v[short], stage[short])[3]
        return (0, 0, 0, w if w.ndim else float(w))

    def step_s(self, t, p, m, v):
        """The latest of the bounds every stage's end obeys once m >= p, which the executed
        orders meet: stage s can end no sooner than its own passes allow, m(f+b+w)_s after it
        could first start, that is after the fill f_0 + ... + f_{s-1} and after the first
        micro-batch's round trip (its first I waits for every forward and the I passes of the
        stages after it, R_s, having run p - s forwards meanwhile); stage s's last I waits for
        the one above it, b_s later, and it then runs the s + 1 W passes it postponed:
        E_s = (s+1) w_s + max over j >= s of (own_j - (j+1) w_j + b_s + ... + b_{j-1}),
        own_j = m(f+b+w)_j + max(f_0 + ... + f_{j-1}, R_j - (p-j) f_j). Equal stages: Qi et
        al.'s m(f+b+w) + (p-1)(f+b-w), and for a W longer than its slot (the order is built for
        F = I = W) m(f+b+w) + (p-1)(f+b-min(w, f, b)); exact there for any f, b, w, and on
        unequal stages a lower bound within a few % (tests/test_schedules.py). The forms before
        charged the slowest stage's m periods and every other stage's f+b-w: up to 8 % over a
        lighter first stage's drain that the last stage's postponed W passes hide (DeepSeek-V3
        with MTP), 10-12 % under where unfused accumulation made W 2.4x F (Mixtral). With the
        middle ranks alike each term is linear in s and in j over them, so the maximum lies at
        stages 0, 1, p-2 and p-1."""
        return self.closed_run(t, p, m, v, ())[0]

    @staticmethod
    def _corners(p) -> tuple:
        """Stages 1, p-2 and p-1: where the bounds, linear in a stage over the middle ranks, peak."""
        return minimum(1, p - 1), maximum(p - 2, 0), p - 1

    def closed_run(self, t, p, m, v, stages):
        """step_s, and each of `stages`' E_s as how long before the step it ends."""
        candidates = (0 * p, *self._corners(p))
        ends = self._ends_s(t, p, m, [*candidates, *stages])
        step = ends[0]
        for e in ends[1:len(candidates)]:
            step = maximum(step, e)
        return step, [step - e for e in ends[len(candidates):]]

    def _ends_s(self, t, p, m, at_stages) -> list:
        """step_s's bound E_s on when each of `at_stages` ends (stage indices, numbers or
        arrays over plans; plain Python arithmetic for one plan: bcast.py)."""
        last = len(t.f) - 1
        if t.stage_rep is None:
            middle = lambda x: x[min(1, last)]  # noqa: E731
        else:  # plans of a batch whose middle ranks are alike: each its own middle representative
            rep = stage_rep_grid(t.stage_rep)[min(1, len(t.stage_rep) - 1)]
            middle = lambda x: np.choose(rep, np.broadcast_arrays(*x))  # noqa: E731

        def at(x, s):  # the pass time of stage s
            return where(s == 0, x[0], where(s >= p - 1, x[last], middle(x)))

        def upto(x, n):  # x summed over stages 0 .. n-1 (0 <= n <= p)
            return where(n == 0, 0.0, x[0] + maximum(minimum(n - 1, p - 2), 0) * middle(x)
                         + where((n == p) & (p > 1), x[last], 0.0))

        trip = upto(t.f, p) + upto(t.b, p)

        def own(j):  # own_j less the W passes stage j postponed, plus the I chain down to stage 0
            return m * (at(t.f, j) + at(t.b, j) + at(t.w, j)) - at(t.w, j) * (j + 1) + upto(t.b, j) \
                + maximum(upto(t.f, j), trip - upto(t.b, j + 1) - (p - j) * at(t.f, j))

        corners = [(j, own(j)) for j in self._corners(p)]
        out = []
        for s in at_stages:
            best = own(s)
            for j, own_j in corners:
                best = maximum(best, where(j >= s, own_j, -np.inf))
            out.append(at(t.w, s) * (s + 1) - upto(t.b, s) + best)
        return out

    def closed_form_holds(self, p, m):
        """With fewer micro-batches than stages which W passes fill the drain depends on how
        the stages' passes differ, which the form does not follow: there the order is
        executed (pipeline_s)."""
        return np.asarray(m) >= np.asarray(p)


class _VShape(Schedule):
    """Two model chunks per device in V placement (stage 0 holds the first and the last
    virtual stage), split backward passes; needs m >= 2p micro-batches."""

    placement = "v"
    split_backward = True

    def chunks(self, vpp):
        return 2

    def check(self, p, m, vpp):
        if vpp not in (1, 2):
            raise InputError("plan.vpp", vpp, f"{self.name} places 2 model chunks per device (V shape): vpp 1 or 2")
        if m < 2 * p:
            raise InputError("plan.global_batch", m, f"{self.name} needs at least 2*pp = {2 * p} micro-batches per "
                             f"replica, got {m}")

    def grad_tail(self, p, m, v, stage) -> list:
        return [tuple(_per_shape(lambda pp, mm, vv, ss, c=c, k=k: _grad_tail_cached(self.name, pp, mm, vv, ss)[c][k],
                                 p, m, v, stage) for k in range(5)) for c in range(2)]

    def step_s(self, t, p, m, v):
        """The order executed with the stages' pass times (pipeline_makespan): the V-shaped
        orders are built for equal passes, F = I = W, where they never idle once a stage has
        started and the step is 2m(F+I+W) + (p-1)F (tests/test_schedules.py); with unequal
        passes they idle in ways no simple form follows. Past the warm-up the order repeats
        every p micro-batches, so two short executions give the step for any m."""
        return _makespans(self, t, p, m, v)[0]


class ZBV(_VShape):
    """ZB-V (Qi et al. 2024, "Zero Bubble Pipeline Parallelism", Sec. 6): V placement, split
    backward, at most 2p chunk activations in flight per stage (1F1B's peak of p micro-batches
    of a whole stage). Built like ZB-H1, as a unit-time list schedule for F = I = W: in each
    slot a stage runs a backward I whose gradient has arrived (chunk 1 first: it is nearer the
    loss), else a forward whose input has arrived while fewer than 2p chunks are in flight
    (chunk 1 first, never ahead of chunk 0), else its oldest waiting W."""

    name = "zb-v"
    description = "zero-bubble V: two chunks per device in V placement, split backward (Qi et al. 2024)"

    def orders(self, p, m, v):
        def virtual(i, c):
            return i if c == 0 else 2 * p - 1 - i

        done = {}  # (kind, virtual stage, mb) -> slot at whose end it finished
        nf = [[0, 0] for _ in range(p)]
        nb = [[0, 0] for _ in range(p)]
        live = [0] * p
        waiting_w = [[] for _ in range(p)]
        out = [[] for _ in range(p)]
        t = 0
        while any(len(o) < 6 * m for o in out):
            for i in range(p):
                op = None
                for c in (1, 0):
                    j, k = nb[i][c], virtual(i, c)
                    grad = (FWD, k, j) if k == 2 * p - 1 else (BWD_INPUT, k + 1, j)
                    if j < nf[i][c] and done.get((FWD, k, j), t) < t and done.get(grad, t) < t:
                        op = (BWD_INPUT, c, j)
                        break
                if op is None and live[i] < 2 * p:
                    for c in (1, 0):
                        j, k = nf[i][c], virtual(i, c)
                        if j < m and (c == 0 or j < nf[i][0]) and (k == 0 or done.get((FWD, k - 1, j), t) < t):
                            op = (FWD, c, j)
                            break
                if op is None and waiting_w[i]:
                    op = (WGT, *waiting_w[i].pop(0))
                if op is None:
                    continue
                kind, c, j = op
                out[i].append(op)
                done[(kind, virtual(i, c), j)] = t
                if kind == FWD:
                    nf[i][c] += 1
                    live[i] += 1
                elif kind == BWD_INPUT:
                    nb[i][c] += 1
                    live[i] -= 1
                    waiting_w[i].append((c, j))
            t += 1
        return out


class DualPipeV(_VShape):
    """DualPipe-V (DeepSeek-AI, deepseek-ai/DualPipe@3da1bbe dualpipe/dualpipev.py, the
    "cut-in-half" V-shape form of DualPipe by Sea AI Lab): stage r runs 2(p-r-1) forwards of
    chunk 0; r+1 pairs of forwards (chunk 0, chunk 1); p-r-1 times (I of chunk 1, a W, F of
    chunk 1); the steady phase of m-2p+r+1 times (F0, B1, F1, B0), forward and backward of two
    micro-batches paired so that one's communication hides behind the other's compute; p-r-1
    times (B1, F1, B0); r+1 times (B1, B0), splitting off W from the middle on; p-r-1 times
    (W, I of chunk 0); r+1 W. Deferred W passes run oldest first. The paired F&B is executed
    here as F then B on one stream (the overlap it buys is of communication, not compute)."""

    name = "dualpipe-v"
    description = "DualPipe-V: V placement, paired forward/backward, split backward tails (DeepSeek-AI 2024)"

    def orders(self, p, m, v):
        out = []
        for r in range(p):
            ops, count, deferred = [], {}, []

            def run(kind, c, split=False):
                j = count.get((kind, c), 0)
                count[(kind, c)] = j + 1
                if kind == BWD and split:
                    ops.append((BWD_INPUT, c, j))
                    deferred.append((c, j))
                else:
                    ops.append((kind, c, j))

            def weight():
                ops.append((WGT, *deferred.pop(0)))

            for _ in range(2 * (p - r - 1)):
                run(FWD, 0)
            for _ in range(r + 1):
                run(FWD, 0)
                run(FWD, 1)
            for _ in range(p - r - 1):
                run(BWD, 1, split=True)
                weight()
                run(FWD, 1)
            for _ in range(m - 2 * p + r + 1):
                for kind, c in ((FWD, 0), (BWD, 1), (FWD, 1), (BWD, 0)):
                    run(kind, c)
            for _ in range(p - r - 1):
                for kind, c in ((BWD, 1), (FWD, 1), (BWD, 0)):
                    run(kind, c)
            split = False
            for i in range(r + 1):
                split = split or (i == (r + 1) // 2 and r % 2 == 1)
                run(BWD, 1, split)
                split = split or (i == (r + 1) // 2 and r % 2 == 0)
                run(BWD, 0, split)
            for _ in range(p - r - 1):
                weight()
                run(BWD, 0, split=True)
            for _ in range(r + 1):
                weight()
            out.append(ops)
        return out


class Explicit(Schedule):
    """A user's order (`plan.schedule_ops`), run with the placement and chunks of the named
    schedule; its in-flight counts are read from the order and its step time is the order
    executed with the stages' pass times (pipeline_makespan), not a closed form."""

    def __init__(self, base: Schedule, ops: tuple, p: int, m: int, v: int):
        self.base, self.name, self.placement = base, base.name, base.placement
        self.description = f"explicit order (placement of {base.name})"
        self._orders = parse_explicit(ops, p, m, v)
        self.split_backward = any(kind == WGT for order in self._orders for kind, _, _ in order)
        pipeline_makespan(self, self._orders, p, v, [0.0] * p, [0.0] * p, [0.0] * p)  # no order waiting on itself

    def chunks(self, vpp):
        return self.base.chunks(vpp)

    def check(self, p, m, vpp):
        self.base.check(p, m, vpp)

    def orders(self, p, m, v):
        return self._orders

    def in_flight(self, p, m, v, stage):
        return peak_in_flight(self._orders[int(stage)], 0 if int(stage) == self.embedding_stage(p) else None)

    def forward_moments(self, p, m, v, stage):
        return forward_moments_in_order(self._orders[int(stage)], v)

    def offloaded_chunks(self, p, m, v, stage):
        return offloaded_in_order(self._orders[int(stage)])

    def grad_tail(self, p, m, v, stage):
        return grad_tail_in_order(self._orders[int(stage)], v)

    def drain_tail(self, p, m, v, stage):
        return drain_tail_in_order(self._orders[int(stage)])

    def step_s(self, t, p, m, v):
        return pipeline_makespan(self, self._orders, p, v, *_stage_lists(t, (), p, v))

    def pipeline_run(self, t, p, m, v, stages=()):
        return _step_and_slacks(_stage_ends(compile_order(self, self._orders, p, v), *_stage_lists(t, (), p, v)),
                                stages)


ONE_F_ONE_B = OneFOneB()

SCHEDULES: dict[str, Schedule] = {s.name: s for s in (GPipe(), ONE_F_ONE_B, Interleaved(), ZBH1(), ZBV(),
                                                       DualPipeV())}


def get(name: str) -> Schedule:
    if name not in SCHEDULES:
        raise InputError("plan.schedule", name, "expected one of " + ", ".join(SCHEDULES))
    return SCHEDULES[name]


# ------------------------------------------------------------------ reading orders

def peak_in_flight(order: list[tuple], first_chunk: int | None = 0) -> tuple[int, int]:
    """(chunks, chunks of `first_chunk`) whose forward is done and backward (B or I) not, at the
    moment the first count peaks, on one stage's order."""
    live = first = peak = peak_first = 0
    for kind, chunk, _ in order:
        if kind == FWD:
            live += 1
            first += chunk == first_chunk
            if live > peak:
                peak, peak_first = live, first
        elif kind in BACKWARDS:
            live -= 1
            first -= chunk == first_chunk
    return peak, peak_first


def forward_moments_in_order(order: list[tuple], v: int) -> np.ndarray:
    """After each forward on one stage's order, as distinct rows (read-only): chunks in flight
    (forward done, backward B or I not), of chunk 0, of chunk v-1; backwards done, of chunk 0;
    forwards of chunk v-1 done. Memory that grows with these counts peaks after some forward."""
    live = live0 = live_last = back = back0 = fwd_last = 0
    rows = set()
    for kind, chunk, _ in order:
        first, last = chunk == 0, chunk == v - 1
        if kind == FWD:
            live, live0, live_last, fwd_last = live + 1, live0 + first, live_last + last, fwd_last + last
            rows.add((live, live0, live_last, back, back0, fwd_last))
        elif kind in BACKWARDS:
            live, live0, live_last, back, back0 = live - 1, live0 - first, live_last - last, back + 1, back0 + first
    out = np.array(sorted(rows), dtype=float).reshape(-1, 6)
    out.flags.writeable = False
    return out


def grad_tail_in_order(order: list[tuple], v: int) -> list:
    """Per chunk, the (F, B, I, W) passes after the chunk's last B or W on one stage's order,
    and whether that pass is a B (1) or a W (0)."""
    out = []
    for c in range(v):
        last = max(k for k, (kind, ch, _) in enumerate(order) if ch == c and kind in (BWD, WGT))
        after = [kind for kind, _, _ in order[last + 1:]]
        out.append((*(after.count(kind) for kind in (FWD, BWD, BWD_INPUT, WGT)), int(order[last][0] == BWD)))
    return out


def drain_tail_in_order(order: list[tuple]) -> tuple:
    """The (F, B, I, W) passes after the last B or I of one stage's order."""
    last = max(k for k, (kind, _, _) in enumerate(order) if kind in (BWD, BWD_INPUT))
    after = [kind for kind, _, _ in order[last + 1:]]
    return tuple(after.count(kind) for kind in (FWD, BWD, BWD_INPUT, WGT))


def offloaded_in_order(order: list[tuple]) -> tuple[int, int]:
    """Forward passes on one stage's order not followed at once by their own backward pass
    (their activations are copied out and read back), as (reads issued during a forward
    pass, reads issued during a backward pass): a read is issued one pass ahead."""
    uses = [op for op in order if op[0] != WGT]
    kept = {a[1:] for a, b in zip(uses, uses[1:]) if a[0] == FWD and b[0] in BACKWARDS and b[1:] == a[1:]}
    during_fwd = during_bwd = 0
    for before, op in zip([None] + uses, uses):  # the read runs during the pass before its backward
        if op[0] in BACKWARDS and op[1:] not in kept:
            during_fwd += before is not None and before[0] == FWD
            during_bwd += before is None or before[0] != FWD
    return during_fwd, during_bwd


def _one_f_one_b_offloaded(total, warm):
    """offloaded_in_order for a 1F1B-like order of `total` forward and backward passes with
    `warm` warm-up forwards: no warm-up, every forward is followed by its own backward; else
    every chunk is copied out, the steady pairs read during a forward and the cooldown during a
    backward (all forwards first: the first backward reads during the last forward)."""
    total, warm = np.asarray(total), np.asarray(warm)
    none = (warm == 0) | (total == 1)  # a single micro-batch's backward follows its forward
    fwd = np.where(none, 0, np.where(warm < total, total - warm, 1))
    bwd = np.where(none, 0, np.where(warm < total, warm, total - 1))
    return fwd, bwd


_OP = re.compile(r"^([FBW])(\d+)(?:\.(\d+))?$")


def parse_explicit(ops_per_stage, p: int, m: int, v: int) -> list[list[tuple]]:
    """A user's per-stage op lists ("F3" micro-batch 3, "F1.3" chunk 1 of micro-batch 3;
    B is the whole backward pass unless the same stage also lists W for it, which makes the B
    an input-gradient pass I). Every F and backward exactly once, W at most once, each after
    its predecessor on the stage; InputError otherwise."""
    if not isinstance(ops_per_stage, (list, tuple)) or len(ops_per_stage) != p:
        raise InputError("plan.schedule_ops", ops_per_stage, f"a list of {p} per-stage op lists")
    out = []
    for i, ops in enumerate(ops_per_stage):
        parsed = []
        for text in ops if isinstance(ops, (list, tuple)) else [ops]:
            match = _OP.match(str(text).strip())
            if not match:
                raise InputError(f"plan.schedule_ops[{i}]", text, "ops look like F3, B3, W3 or F1.3 (chunk.mb)")
            kind, a, b = match.group(1), int(match.group(2)), match.group(3)
            chunk, mb = (a, int(b)) if b is not None else (0, a)
            parsed.append((kind, chunk, mb))
        with_w = {(c, j) for k, c, j in parsed if k == WGT}
        parsed = [(BWD_INPUT if k == BWD and (c, j) in with_w else k, c, j) for k, c, j in parsed]
        want = sorted([(FWD, c, j) for c in range(v) for j in range(m)]
                      + [(BWD_INPUT if (c, j) in with_w else BWD, c, j) for c in range(v) for j in range(m)]
                      + [(WGT, c, j) for c, j in with_w])
        if sorted(parsed) != want:
            raise InputError(f"plan.schedule_ops[{i}]", ops, f"F and B for chunks 0..{v - 1} and micro-batches "
                             f"0..{m - 1} exactly once each (W at most once, after its B)")
        at = {op: k for k, op in enumerate(parsed)}
        for (kind, chunk, mb), k in at.items():
            before = {BWD: FWD, BWD_INPUT: FWD, WGT: BWD_INPUT}.get(kind)
            if before and at[(before, chunk, mb)] > k:
                raise InputError(f"plan.schedule_ops[{i}]", f"{kind}{chunk}.{mb}",
                                 f"must come after {before}{chunk}.{mb} on the same stage")
        out.append(parsed)
    return out


def stage_rep_grid(stage_rep) -> np.ndarray:
    """Layout.rep_of_stage as an array of (stages, plans): a tuple, shared by every plan, is
    one column."""
    rep = np.asarray(stage_rep)
    return rep[:, None] if rep.ndim == 1 else rep


def alike_middles(rep: np.ndarray, p) -> np.ndarray:
    """Per column of a stage_rep_grid, whether its plan's middle ranks share one
    representative (a plan batched with pipelines whose middles differ): such a plan is
    timed by the closed forms, as it is alone."""
    p = np.broadcast_to(np.asarray(p), (rep.shape[1],)) if rep.shape[1] > 1 else np.ravel(p)[:1]
    rows = np.arange(len(rep))[:, None]
    middle = (rows >= 1) & (rows < p - 1)
    return np.all(~middle | (rep == rep[min(1, len(rep) - 1)]), axis=0)


def _stage_lists(t: StageTimes, index: tuple, p: int, v: int) -> tuple:
    """Per-stage, per-chunk pass times (f, b, w) of one plan from the representatives."""
    if t.stage_rep is not None:
        rep = stage_rep_grid(t.stage_rep)
        kinds = rep[:p, index[0] if index and rep.shape[1] > 1 else 0].tolist()
    else:
        kinds = [0] + [1] * (p - 2) + [len(t.f) - 1] if p > 1 else [0]
    return tuple([float(np.asarray(x[k])[index]) / v for k in kinds] for x in (t.f, t.b, t.w))


def _makespans(schedule: Schedule, t: StageTimes, p, m, v, known=lambda index: None, stages=()) -> tuple:
    """The schedule's order executed with each plan's stage times (_periodic_ends), for a
    scalar plan or elementwise over arrays of plans; `known(index)` gives a plan's step where
    it is already known (None: execute it). Plans of one shape (p, m, v) run as one vector.
    Returns (steps, for each of `stages` the slack of Schedule.pipeline_run)."""
    shape = np.broadcast(np.asarray(p), np.asarray(m), np.asarray(v)).shape
    if not shape:
        done = known(())
        if done is not None:
            return done, [np.nan] * len(stages)
        return _step_and_slacks(_periodic_ends(schedule, _stage_lists(t, (), int(p), int(v)), int(p), int(m), int(v)),
                                stages)
    out = np.empty(shape)
    slacks = [np.full(shape, np.nan) for _ in stages]
    stage_of = [np.broadcast_to(np.asarray(s), shape) for s in stages]
    groups = {}
    for idx in np.ndindex(shape):
        done = known(idx)
        if done is not None:
            out[idx] = done
            continue
        pp, mm, vv = (int(np.broadcast_to(np.asarray(x), shape)[idx]) for x in (p, m, v))
        # plans of a pipeline shape extrapolated from the same three short orders run together
        periods = _periods(pp, mm)
        groups.setdefault((pp, vv, mm if periods is None else periods), []).append((idx, mm))
    for (pp, vv, _), members in groups.items():
        indices, ms = [i for i, _ in members], np.array([mm for _, mm in members])
        ends = _periodic_ends(schedule, _stage_arrays(t, indices, pp, vv), pp, ms, vv)
        steps = ends.max(axis=0)
        for j, (idx, step) in enumerate(zip(indices, steps)):
            out[idx] = step
            for slack, s in zip(slacks, stage_of):
                slack[idx] = step - ends[min(int(s[idx]), pp - 1), j]
    return out, slacks


def _step_and_slacks(ends, stages) -> tuple:
    """One plan's step, the latest of its stages' ends, and how long before it each of
    `stages` ends (a stage past the pipeline, a representative standing for none, as the last)."""
    step = float(ends.max())
    return step, [step - float(ends[min(int(s), len(ends) - 1)]) for s in stages]


def _stage_arrays(t: StageTimes, indices: list, p: int, v: int) -> tuple:
    """(f, b, w) pass times of plans `indices` of one shape: arrays (stages, plans)."""
    lists = [_stage_lists(t, i, p, v) for i in indices]
    return tuple(np.array([plan[k] for plan in lists]).T for k in range(3))


def _periodic_ends(schedule: Schedule, times: tuple, p: int, m, v: int) -> np.ndarray:
    """When each stage finishes its passes of the schedule's order for m micro-batches
    (_stage_ends; the step is the latest), for one plan (`times`: (f, b, w) per stage) or plans
    of one pipeline shape (arrays of stages x plans; `m` one count, or an array of counts all of
    one count up to 4p, else all alike modulo p); past 4p micro-batches from the executions of
    the orders of _periods(p, m), each stage's end affine in m (checked against a third per
    plan, and against the work of a period): a stage whose end grows faster overtakes the one
    that ended last in the short orders. A plan whose stages have not settled is executed
    whole."""
    def run(k, columns=slice(None)):  # each stage's end
        return _stage_ends(_compiled_order(schedule.name, p, k, v), *(np.asarray(x)[..., columns] for x in times))

    periods = _periods(p, int(np.max(m)))
    if periods is None:
        return run(int(np.max(m)))
    m0 = periods[0]
    e0, e1, e2 = (run(k) for k in periods)
    # settled: each stage's end grows alike from period to period, and by no less than the p
    # micro-batches' passes it runs in one (a stage growing by less is eating up slack its
    # waits gave it in the first periods; once that is spent, it paces the step)
    work = p * v * (np.asarray(times[0]) + np.asarray(times[1]) + np.asarray(times[2]))
    affine = np.all((np.abs((e2 - e1) - (e1 - e0)) <= 1e-9 * e2.max(axis=0)) & (e1 - e0 >= work * (1 - 1e-9)),
                    axis=0)
    ends = e0 + (m - m0) / p * (e1 - e0)
    if np.all(affine):
        return ends
    if np.ndim(ends) == 1:
        return run(int(m))
    ends = np.array(ends, dtype=float)
    for k in np.unique(np.asarray(m)[~affine]):  # plans whose order does not repeat: executed whole
        columns = ~affine & (np.asarray(m) == k)
        ends[:, columns] = run(int(k), columns)
    return ends


@lru_cache(maxsize=1024)
def _compiled_order(name: str, p: int, m: int, v: int) -> tuple:
    return compile_order(SCHEDULES[name], cached_orders(name, p, m, v), p, v)


_DURATION = {FWD: 0, BWD: 1, BWD_INPUT: 2, WGT: 3}  # rows of _run_passes' durations: f, b + w, b, w


def compile_order(schedule: Schedule, orders, p: int, v: int) -> tuple:
    """The passes of `orders` listed so that each comes after the pass it waits for: (stage,
    duration row, position of that pass or -1, whether it sits on another stage and is not a
    backward-input pass, so that a send separates them). Each pass starts when its stage's
    previous pass has ended and its input has arrived: a forward pass after the previous
    virtual stage's forward, a backward after the next one's backward (the last virtual
    stage's after its own forward), a weight-gradient pass after its own input-gradient pass.
    Raises InputError for an order that waits on itself."""
    n_virtual = p * v
    where = {schedule.stage_chunk(k, p): k for k in range(n_virtual)}
    position, passes = {}, []
    pos = [0] * p
    remaining = sum(len(o) for o in orders)
    while remaining:
        progressed = False
        for i in range(p):
            while pos[i] < len(orders[i]):
                kind, c, j = orders[i][pos[i]]
                k = where[(i, c)]
                if kind == FWD:
                    dep = None if k == 0 else (FWD, k - 1, j)
                elif kind in BACKWARDS:
                    dep = (FWD, k, j) if k == n_virtual - 1 else ("BX", k + 1, j)
                else:
                    dep = (BWD_INPUT, k, j)
                if dep is not None and dep not in position:
                    break
                cross = dep is not None and dep[0] != BWD_INPUT and schedule.stage_chunk(dep[1], p)[0] != i
                passes.append((i, _DURATION[kind], -1 if dep is None else position[dep], cross))
                position[(kind, k, j)] = len(passes) - 1
                if kind in BACKWARDS:
                    position[("BX", k, j)] = len(passes) - 1
                pos[i] += 1
                remaining -= 1
                progressed = True
        if not progressed:
            raise InputError("plan.schedule_ops", "cyclic", "the schedule waits on itself: a pass is ordered "
                             "before the pass it depends on")
    return tuple(passes)


def _run_passes(passes: tuple, f, b, w, send_s: float = 0.0):
    """The makespan of compiled `passes` (compile_order) with per-stage pass times f, b, w:
    numbers per stage, or arrays of stages x plans (every plan executed at once)."""
    return _stage_ends(passes, f, b, w, send_s).max(axis=0)


_FEW_PLANS = 12  # up to this many plans of a shape, each runs as floats (below the cost of numpy's calls)


def _stage_ends(passes: tuple, f, b, w, send_s: float = 0.0) -> np.ndarray:
    """When each stage finishes its last pass (_run_passes' makespan is the latest): an array
    of stages, or of stages x plans."""
    f, b, w = (np.asarray(x, dtype=float) for x in (f, b, w))
    if f.ndim == 2 and 0 < f.shape[1] <= _FEW_PLANS:  # plan by plan: a pass costs ~4 numpy calls on arrays
        return np.array([_stage_ends(passes, f[:, j], b[:, j], w[:, j], send_s) for j in range(f.shape[1])]).T
    if f.ndim == 1:  # one plan: Python floats outrun numpy scalars
        durations = np.stack([f, b + w, b, w]).tolist()
        free, end = [0.0] * len(f), [0.0] * len(passes)
        for n, (i, row, dep, cross) in enumerate(passes):
            start = free[i]
            if dep >= 0:
                ready = end[dep] + send_s if cross else end[dep]
                start = ready if ready > start else start
            free[i] = end[n] = start + durations[row][i]
        return np.array(free)
    durations = np.stack([f, b + w, b, w])
    free = np.zeros_like(f)
    end = np.empty((len(passes),) + f.shape[1:])
    for n, (i, row, dep, cross) in enumerate(passes):
        stage = free[i]  # a view: the stage's clock, moved in place
        if dep >= 0:
            np.maximum(stage, end[dep] + send_s if cross and send_s else end[dep], out=stage)
        stage += durations[row, i]
        end[n] = stage
    return free


def pipeline_makespan(schedule: Schedule, orders: list[list[tuple]], p: int, v: int, f, b, w,
                      send_s: float = 0.0) -> float:
    """Seconds to run `orders` with per-stage pass times (lists over stages, per chunk):
    forward f[i], backward-input b[i], weight w[i] (a B pass takes b + w); see compile_order.
    Raises InputError for an order that waits on itself."""
    return float(_run_passes(compile_order(schedule, orders, p, v), f, b, w, send_s))


@lru_cache(maxsize=256)
def schedule_for(name: str, p: int, m: int, vpp: int, ops) -> Schedule:
    """The plan's schedule, checked once: the named one, or the user's explicit order run
    with its placement (parsed and checked for waiting on itself)."""
    schedule = get(name)
    schedule.check(p, m, vpp)
    if ops is not None:
        schedule = Explicit(schedule, ops, p, m, schedule.chunks(vpp))
    return schedule


def plan_schedule(plan) -> Schedule:
    """The schedule of a scalar plan, or the named schedule of a batch of plans."""
    if np.ndim(plan.pp):
        return get(plan.schedule)
    return schedule_for(plan.schedule, int(plan.pp), int(plan.microbatches), int(plan.vpp), plan.schedule_ops)
