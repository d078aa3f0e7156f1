"""Muon's Newton-Schulz steps timed in torch against llmsim's prediction (muon.py).

    python benchmarks/bench_muon_ns.py [--profile NAME_OR_PATH] [--steps 5]

Runs the quintic iteration on bf16 matrices of several shapes the way Emerging-Optimizers'
newton_schulz_step does (A = X X^T; B = addmm(A, A, A); X = addmm(X, B, X)), on the device
and clock the profile was calibrated with (a CPU profile: one thread, the process clock;
simulator/calibrate/timing.py), every shape in every round (interleaved, lower quartile), and
prints the measured seconds beside the profile's prediction for the same matrices.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
import yaml

from simulator.calibrate.timing import interleaved
from simulator.calibrate.validate_torch import default_profile
from simulator.hardware import load_accelerator
from simulator.muon import ns_flops, ns_seconds

# (rows, cols) of a transformer's matrices at small widths: square projections, GQA's keys,
# gate-and-up and down projections
SHAPES = ((256, 256), (128, 512), (512, 512), (1024, 512), (512, 1536), (1024, 1024), (3072, 1024), (1024, 4096))
COEFFICIENTS = (3.4445, -4.7750, 2.0315)  # Jordan et al. 2024's quintic


def _ns(x0: torch.Tensor, steps: int):
    a, b, c = COEFFICIENTS

    def run():
        x = x0
        for _ in range(steps):
            gram = x @ x.mT
            square = torch.addmm(gram, gram, gram, beta=b, alpha=c)
            x = torch.addmm(x, square, x, beta=a, alpha=1.0)
        return x
    return run


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", default=None, help="an accelerator profile (default: the shipped one calibrated "
                    "on this CPU model)")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=9)
    args = ap.parse_args()
    path = Path(args.profile) if args.profile else default_profile("cpu")
    acc = load_accelerator(str(path))
    cal = (yaml.safe_load(path.read_text()) or {}).get("calibration") or {}
    clock, threads = cal.get("clock", "wall"), int(cal.get("threads", 1))
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    cases = []
    for rows, cols in SHAPES:
        m, n = min(rows, cols), max(rows, cols)
        x = torch.randn(m, n).div_(n ** 0.5).to(torch.bfloat16)
        cases.append(_ns(x, args.steps))
    timed = interleaved(cases, rounds=args.rounds, clock=clock)
    print(f"# {acc.name}: torch {torch.__version__}, {threads} thread(s), {clock} clock, {args.steps} steps, bf16")
    print(f"{'rows':>6} {'cols':>6} {'GFLOP':>8} {'measured ms':>12} {'predicted ms':>13} {'error':>7} {'spread':>7}")
    errors = []
    for (rows, cols), t in zip(SHAPES, timed):
        predicted = float(ns_seconds(min(rows, cols), max(rows, cols), args.steps, acc))
        err = (predicted - t.seconds) / t.seconds
        errors.append(abs(err))
        print(f"{rows:>6} {cols:>6} {ns_flops(rows, cols, args.steps) / 1e9:>8.2f} {t.seconds * 1e3:>12.2f} "
              f"{predicted * 1e3:>13.2f} {err:>+7.1%} {t.spread:>7.1%}")
    print(f"# mean absolute error {sum(errors) / len(errors):.1%}")


if __name__ == "__main__":
    main()
