"""Timing on a shared machine: interleaved repetitions, their lower quartile, and the spread they showed.

Two clocks. "wall": time.perf_counter, what a user waits. "cpu": time.process_time, the
CPU seconds of this process (all threads, user + system): on a machine shared with other
work it leaves out the time the scheduler gave to other processes, so it measures what a
dedicated single-threaded device would take. It is meaningful only for CPU devices.

Other work on the machine comes and goes. Timing case A ten times and then case B ten
times lets a burst of it land on one case only; `interleaved` times one batch of every case
per round, for several rounds, so that each case sees the same mix of quiet and busy
moments. Other work only ever adds time (even on the CPU clock: it evicts caches and, on
an SMT sibling or a shared core, takes execution units), and on the shared development
machine it slowed a third to a half of the rounds by up to 2x; the median of the rounds
then measures the load of the hour, different for `llmsim calibrate` and a later
`llmsim validate --torch`. Both therefore keep the lower quartile of the rounds
(`estimate`): the undisturbed speed as long as a quarter of the rounds ran undisturbed.
The spread (interquartile range over the median) says how noisy the measurement was.
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass

CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}


@dataclass(frozen=True)
class Timed:
    seconds: float  # seconds per call: the estimate over the rounds (lower quartile)
    median: float
    spread: float  # interquartile range / median of the per-round samples
    rounds: int


def estimate(samples) -> float:
    """The lower quartile of `samples` (their value for fewer than 2)."""
    xs = sorted(samples)
    return statistics.quantiles(xs, n=4, method="inclusive")[0] if len(xs) > 1 else xs[0]


def spread(samples) -> float:
    """Interquartile range over median of `samples` (0 for fewer than 2)."""
    xs = sorted(samples)
    if len(xs) < 2:
        return 0.0
    q1, _, q3 = statistics.quantiles(xs, n=4, method="inclusive")
    med = statistics.median(xs)
    return (q3 - q1) / med if med > 0 else 0.0


def interleaved(fns: list, rounds: int = 7, min_batch_s: float = 0.004, sync=None, clock: str = "wall") -> list[Timed]:
    """Seconds per call of each `fns[i]()` over `rounds` interleaved rounds (`estimate`).

    Each function is called once to warm up (allocator, thread pool, lazily built kernels)
    and once more to size its batch: enough calls (>= `min_batch_s`) for the clock to
    resolve. A round then times one batch of every function in turn. `sync` (e.g.
    torch.cuda.synchronize) runs before each clock read.
    """
    sync = sync or (lambda: None)
    now = CLOCKS[clock]
    batches = []
    for fn in fns:
        fn()
        sync()
        t0 = now()
        fn()
        sync()
        one = max(now() - t0, 1e-7)
        batches.append(max(1, math.ceil(min_batch_s / one)))
    samples = [[] for _ in fns]
    for _ in range(rounds):
        for i, (fn, n) in enumerate(zip(fns, batches)):
            t0 = now()
            for _ in range(n):
                fn()
            sync()
            samples[i].append((now() - t0) / n)
    return [Timed(estimate(s), statistics.median(s), spread(s), len(s)) for s in samples]

