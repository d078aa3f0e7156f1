"""Speed of the vectorised analytic path, of sweeps and of plan search.

    LLMSIM_PROFILES=... python benchmarks/bench_sweep.py [--workers W]

Prints:
- plans/s of the vectorised analytic evaluation (simulator.vector, one process), over
  every valid plan of GPT-3 175B on 1024 A100s with a 1536 batch;
- points/s of `simulator.sweep` end to end (scenario validation, evaluation, rows) on
  `workers` processes, for 6,480 points (median of three) and 110,592 points;
- the wall time of the full plan search for GPT-3 175B on 1024 GPUs (target <= 10 s);
- the same for Llama 4 Scout at 32K tokens on 64 H100s, whose pipeline ranks hold different
  mixes of chunked and full layers: each such plan's pipeline order is executed
  (schedules._makespans, one vector per pipeline shape) and each rank's attention band is an
  array over the batch's plans (layout.py).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

from simulator.hardware import cluster_from_dict
from simulator.model import model_from_dict
from simulator.search import SearchOptions, _evaluate_groups, search
from simulator.space import space_from_dict
from simulator.scenario import Training
from simulator.sweep import sweep


def bench_vector(repeat: int = 3) -> tuple[float, int]:
    model = model_from_dict({"preset": "gpt3-175b"})
    cluster = cluster_from_dict({"node": "dgx-a100", "nodes": 128})
    best = float("inf")
    for _ in range(repeat):
        t = time.perf_counter()
        groups, _, _ = _evaluate_groups(model, cluster, 1536, SearchOptions(), Training(), reasons=False)
        best = min(best, time.perf_counter() - t)
    plans = sum(len(b) for b, _ in groups)
    return plans / best, plans


SWEEP_BASE = {"model": {"preset": "gpt3-175b"}, "cluster": {"node": "dgx-a100", "nodes": 128},
              "plan": {"global_batch": 1536, "dp": "auto", "sequence_parallel": True}}
# 6,480 points over sizes and categorical fields (some points invalid)
SMALL = {"plan.global_batch": [512, 1024, 1536, 2048, 3072, 4096], "plan.tp": [1, 2, 4, 8],
         "plan.pp": [2, 4, 8, 16, 32], "plan.zero_stage": [0, 1, 2], "plan.recompute": ["none", "full"],
         "plan.micro_batch": [1, 2, 4], "plan.schedule": ["1f1b", "zb-h1", "gpipe"]}
# 110,592 points, the cluster size among them (62 % invalid: batches that dp x micro_batch does not divide)
LARGE = {"plan.global_batch": [256, 512, 768, 1024, 1536, 2048, 3072, 4096], "plan.tp": [1, 2, 4, 8],
         "plan.pp": [1, 2, 4, 8, 16, 32], "plan.zero_stage": [0, 1, 2, 3],
         "plan.recompute": ["none", "selective", "full"], "plan.micro_batch": [1, 2, 4, 8],
         "plan.schedule": ["1f1b", "zb-h1", "gpipe"], "cluster.nodes": [64, 128, 256, 512]}


def bench_sweep(workers: int, axes: dict = SMALL, repeat: int = 3) -> tuple[float, int]:
    """points/s of sweep() on a fresh pool, the median of `repeat` runs."""
    space = space_from_dict({"base": SWEEP_BASE, "sweep": axes})
    n = len(space.points())
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        sweep(space, workers=workers, progress=False)
        times.append(time.perf_counter() - t)
    return n / statistics.median(times), n


def bench_search(model="gpt3-175b", cluster=None, batch=1536) -> tuple[float, object]:
    t = time.perf_counter()
    result = search(model, cluster or {"node": "dgx-a100", "nodes": 128}, batch, top=10, engine="analytic")
    return time.perf_counter() - t, result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    args = ap.parse_args()
    rate, plans = bench_vector()
    print(f"vectorised analytic evaluation: {rate:,.0f} plans/s ({plans:,} plans, one process)")
    for axes, repeat in ((SMALL, 3), (LARGE, 1)):
        rate, n = bench_sweep(args.workers, axes, repeat)
        print(f"sweep() end to end: {rate:,.0f} points/s ({n:,} points, {args.workers} workers)")
    seconds, result = bench_search()
    print(f"search GPT-3 175B on 1024 A100s, batch 1536: {seconds:.2f} s ({result.enumerated:,} enumerated, "
          f"{result.valid:,} valid, {result.feasible:,} fit)")
    seconds, result = bench_search({"preset": "llama-4-scout", "seq_len": 32768}, {"node": "dgx-h100", "nodes": 8}, 64)
    print(f"search Llama 4 Scout at 32K on 64 H100s, batch 64: {seconds:.2f} s ({result.enumerated:,} enumerated, "
          f"{result.valid:,} valid, {result.feasible:,} fit)")


if __name__ == "__main__":
    main()
