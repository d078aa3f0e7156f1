"""Timing of a callable: warm-up, then the median of repeated batches of calls.

Two clocks. "wall": time.perf_counter, what a user waits. "cpu": time.process_time, the
CPU seconds of this process (all threads, user + system): on a machine shared with other
work it leaves out the time the scheduler gave to other processes, so it measures what a
dedicated single-threaded device would take. It is meaningful only for CPU devices.
"""

from __future__ import annotations

import statistics
import time

CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}


def median_time(fn, min_time: float = 0.05, min_reps: int = 3, max_reps: int = 50, sync=None,
                clock: str = "wall") -> float:
    """Median seconds per call of `fn()`.

    Calls are grouped in batches long enough (>= 2 ms) for the clock to resolve; the
    batch count grows until `min_time` seconds were spent or `max_reps` batches ran.
    `sync` (e.g. torch.cuda.synchronize) runs before each clock read.
    """
    sync = sync or (lambda: None)
    now = CLOCKS[clock]
    fn()  # warm-up: allocator, thread pool, lazily built kernels
    sync()
    t0 = now()
    fn()
    sync()
    one = max(now() - t0, 1e-7)
    per_batch = max(1, int(0.002 / one))
    samples = []
    spent = 0.0
    while len(samples) < min_reps or (spent < min_time and len(samples) < max_reps):
        t0 = now()
        for _ in range(per_batch):
            fn()
        sync()
        dt = now() - t0
        spent += dt
        samples.append(dt / per_batch)
    return statistics.median(samples)
