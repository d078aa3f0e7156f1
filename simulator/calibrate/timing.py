"""Wall-clock timing of a callable: warm-up, then the median of repeated batches of calls."""

from __future__ import annotations

import statistics
import time


def median_time(fn, min_time: float = 0.05, min_reps: int = 3, max_reps: int = 50, sync=None) -> float:
    """Median seconds per call of `fn()`.

    Calls are grouped in batches long enough (>= 2 ms) for the clock to resolve; the
    batch count grows until `min_time` seconds were spent or `max_reps` batches ran.
    `sync` (e.g. torch.cuda.synchronize) runs before each clock read.
    """
    sync = sync or (lambda: None)
    fn()  # warm-up: allocator, thread pool, lazily built kernels
    sync()
    t0 = time.perf_counter()
    fn()
    sync()
    one = max(time.perf_counter() - t0, 1e-7)
    per_batch = max(1, int(0.002 / one))
    samples = []
    spent = 0.0
    while len(samples) < min_reps or (spent < min_time and len(samples) < max_reps):
        t0 = time.perf_counter()
        for _ in range(per_batch):
            fn()
        sync()
        dt = time.perf_counter() - t0
        spent += dt
        samples.append(dt / per_batch)
    return statistics.median(samples)
