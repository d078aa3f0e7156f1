"""The median wall time of a callable, for the benchmarks that time torch calls one by one."""

from __future__ import annotations

import statistics
import time


def median_s(step, rounds: int, warmup: int) -> float:
    """Median seconds of `step` over `rounds` calls, the first `warmup` left out."""
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    return statistics.median(times[warmup:])
