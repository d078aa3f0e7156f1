"""Time the graph engine (no asserts; prints). Run: python benchmarks/bench_engine.py

Cases: GPT-3 175B on 1024 A100 (TP8 PP16 DP8, interleaved v=2, global batch 1536: 192
micro-batches per replica), the same on 102,400 devices, and the growth of the cost with
pp x micro-batches (it does not grow with the device count: symmetry over DP and TP).
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from simulator.engine import simulate as simulate_layout  # noqa: E402
from simulator.evaluate import compile_scenario, evaluate  # noqa: E402
from simulator.scenario import load_scenario  # noqa: E402

GPT3 = Path(__file__).resolve().parent.parent / "scenarios" / "gpt3-175b-1024xa100.yaml"


def simulate(scenario, periodic=True):
    return simulate_layout(compile_scenario(scenario), periodic)


def best_ms(fn, repeat=7):
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return 1e3 * min(times), 1e3 * statistics.median(times)


def case(label, overrides=None, periodic=True):
    s = load_scenario(GPT3, overrides or {})
    sim = simulate(s, periodic=periodic)
    best, med = best_ms(lambda: simulate(s, periodic=periodic))
    ev_best, _ = best_ms(lambda: evaluate(s, "graph"), 3)
    an_best, _ = best_ms(lambda: evaluate(s, "analytic"), 3)
    print(f"{label:58s} devices {s.cluster.devices:>7,}  pp {s.plan.pp:>2} m {s.plan.microbatches:>4} "
          f"v {compile_scenario(s).v}  tasks {sim.graph_tasks:>6,} (ran {sim.simulated_tasks:>6,})  "
          f"simulate {best:6.1f} ms (median {med:6.1f})  evaluate graph {ev_best:6.1f} ms, analytic {an_best:5.1f} ms")


def main():
    case("GPT-3 175B, 1024 A100, TP8 PP16 DP8, interleaved v=2")
    case("  same, full simulation (no steady-state extrapolation)", periodic=False)
    case("  same, 1F1B", {"plan.schedule": "1f1b", "plan.vpp": 1})
    case("  same, ZB-H1", {"plan.schedule": "zb-h1", "plan.vpp": 1})
    case("  same, ZeRO-3 (extrapolated from 2p and 3p)", {"plan.zero_stage": 3})
    case("GPT-3 175B, 102,400 A100, TP8 PP16 DP800, interleaved v=2",
         {"cluster.nodes": 12800, "plan.dp": 800, "plan.global_batch": 153600})
    case("  same, full simulation", {"cluster.nodes": 12800, "plan.dp": 800, "plan.global_batch": 153600},
         periodic=False)
    print("\ncost against pp x micro-batches (1F1B, full simulation):")
    for pp, gb in ((4, 256), (8, 256), (16, 256), (16, 512), (16, 1024)):
        case(f"  pp {pp} global batch {gb}", {"plan.schedule": "1f1b", "plan.vpp": 1, "plan.pp": pp,
                                              "plan.dp": 128 // pp, "plan.global_batch": gb}, periodic=False)


if __name__ == "__main__":
    main()
