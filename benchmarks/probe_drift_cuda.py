"""Why the speed probe (simulator/calibrate/probe.py) reads a GPU slower during validation.

    python benchmarks/probe_drift_cuda.py

Times each probe (bf16, bf16-gemm, fp32, fp32-gemm) on one CUDA GPU three ways: as
`llmsim calibrate` does (timing.interleaved: batches of >= 4 ms between microbenchmarks, wall
clock), as `llmsim validate --torch` does (right after a training step of the validation grid,
three calls between two synchronisations, wall clock), and the latter on the device's clock
(CUDA events around the same calls). Prints the medians and the SM clock read before each.
"""

from __future__ import annotations

import statistics

import torch

from simulator.calibrate.probe import make_probe
from simulator.calibrate.timing import interleaved
from simulator.calibrate.trainer import make_trainer
from simulator.calibrate.validate_torch import CUDA_GRID


def clock_mhz() -> float:
    try:
        return float(torch.cuda.clock_rate())
    except Exception:  # no NVML
        return float("nan")


def main() -> None:
    dev = torch.device("cuda")
    names = ["bf16", "bf16-gemm", "fp32", "fp32-gemm"]
    probes = {n: make_probe("cuda", n) for n in names}
    sync = torch.cuda.synchronize
    cal = interleaved([probes[n] for n in names], rounds=7, sync=sync)
    print("calibrate-style (interleaved batches, wall):", {n: round(t.seconds * 1e3, 4) for n, t in zip(names, cal)})
    rc = CUDA_GRID[1]
    tr = make_trainer(rc.gpt, rc.recompute, rc.precision, rc.grad_accum, rc.micro_batch, dev, 0, 1)
    for _ in range(3):
        tr.step()
    import time

    wall = {n: [] for n in names}
    gpu = {n: [] for n in names}
    clocks = []
    for _ in range(7):
        for n in names:
            tr.step()
            sync()
            clocks.append(clock_mhz())
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            t0 = time.perf_counter()
            a.record()
            for _ in range(3):
                probes[n]()
            b.record()
            sync()
            wall[n].append((time.perf_counter() - t0) / 3)
            gpu[n].append(a.elapsed_time(b) * 1e-3 / 3)
    print(f"validate-style after a {rc.name} step (wall):", {n: round(statistics.median(wall[n]) * 1e3, 4) for n in names})
    print(f"validate-style after a {rc.name} step (CUDA events):",
          {n: round(statistics.median(gpu[n]) * 1e3, 4) for n in names})
    print("SM clock (MHz) read before the probes: median", statistics.median(clocks), "min", min(clocks), "max", max(clocks))
    # the steps themselves, wall and events, to see whether they are launch-bound
    ws, gs = [], []
    for _ in range(5):
        sync()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        t0 = time.perf_counter()
        a.record()
        tr.step()
        b.record()
        sync()
        ws.append(time.perf_counter() - t0)
        gs.append(a.elapsed_time(b) * 1e-3)
    print(f"{rc.name} step: wall {statistics.median(ws) * 1e3:.2f} ms, events {statistics.median(gs) * 1e3:.2f} ms")


if __name__ == "__main__":
    main()
