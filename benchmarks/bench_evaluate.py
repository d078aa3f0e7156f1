"""How long one evaluation takes (issue 2: under 10 ms). Run: make bench (or python benchmarks/bench_evaluate.py)."""

from __future__ import annotations

import statistics
import time
from pathlib import Path

from simulator import evaluate, load_scenario, read_scenario, scenario_from_dict
from simulator.sensitivity import sensitivities

ROOT = Path(__file__).resolve().parent.parent
SCENARIOS = ["quickstart.yaml", "gpt3-175b-1024xa100.yaml"]


def best_of(fn, repeat: int = 200) -> tuple[float, float]:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times), statistics.median(times)


def main() -> None:
    print(f"{'scenario':32s} {'evaluate (min/median ms)':>26s} {'validate+evaluate (ms)':>24s}")
    for name in SCENARIOS:
        raw = read_scenario(ROOT / "scenarios" / name)
        scenario = load_scenario(ROOT / "scenarios" / name)
        ev = best_of(lambda: evaluate(scenario, engine="analytic"))
        full = best_of(lambda: evaluate(scenario_from_dict(raw), engine="analytic"))
        print(f"{name:32s} {ev[0] * 1e3:12.2f} / {ev[1] * 1e3:8.2f} {full[0] * 1e3:12.2f} / {full[1] * 1e3:8.2f}")
    print(f"\n{'scenario':32s} {'evaluate --sensitivity, graph / analytic (median ms)':>52s}")
    for name in SCENARIOS:
        scenario = load_scenario(ROOT / "scenarios" / name)
        graph = best_of(lambda: sensitivities(scenario, "graph"), repeat=5)
        closed = best_of(lambda: sensitivities(scenario, "analytic"), repeat=20)
        print(f"{name:32s} {graph[1] * 1e3:34.0f} / {closed[1] * 1e3:8.0f}")


if __name__ == "__main__":
    main()
