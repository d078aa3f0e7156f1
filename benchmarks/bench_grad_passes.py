"""The passes over the gradients before the optimizer step, measured with torch against llmsim.

    python benchmarks/bench_grad_passes.py [--profile cpu-epyc-zen4-2c]

For a model-like set of fp32 gradients (TENSORS tensors, from 1 to 64 M parameters in all) on
one thread, the process set up as `llmsim calibrate` sets it (calibrate/device.configure): clipping's norm (torch.nn.utils.get_total_norm, foreach), its scale
(clip_grads_with_norm_, foreach: _foreach_mul_ by the clamped coefficient) and an fp32 optimizer's
copies of bf16 gradients (`.float()`, as Megatron-LM's _copy_model_grads_to_main_grads), each
timed on its own against what llmsim charges for it (framework_ops.step_framework_ops: 4, 8 and
2 + 4 bytes per parameter, at the profile's plain memory curve, compute.memory_bound_time). The
CPU profile's op_overhead_us is added once per pass: each is one foreach call (the copies one per
tensor, as Megatron's loop makes them).
"""

from __future__ import annotations

import argparse

import torch

import wallclock  # benchmarks/wallclock.py, beside this script
from simulator.calibrate.device import configure
from simulator.compute import memory_bound_time
from simulator.hardware import load_accelerator

TENSORS, ROUNDS, WARMUP = 64, 9, 2
SIZES = (1 << 20, 1 << 22, 1 << 24, 1 << 26)


def median_s(step) -> float:
    return wallclock.median_s(step, ROUNDS, WARMUP)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--profile", default="cpu-epyc-zen4-2c")
    args = parser.parse_args()
    configure(threads=1)  # as `llmsim calibrate` measured the profile: one thread, freed memory kept
    acc = load_accelerator(args.profile)
    overhead = acc.op_overhead_s
    print(f"profile {acc.name}; one thread; {TENSORS} tensors; measured / predicted ms (ratio)")
    for n in SIZES:
        params = [torch.nn.Parameter(torch.empty(n // TENSORS)) for _ in range(TENSORS)]
        for p in params:
            p.grad = torch.randn(n // TENSORS)
        grads = [p.grad for p in params]
        low = [g.to(torch.bfloat16) for g in grads]
        norm = torch.nn.utils.get_total_norm(grads, foreach=True)  # >> 1: every pass scales
        cases = {
            "norm": (lambda: torch.nn.utils.get_total_norm(grads, foreach=True), 4 * n, 1),
            "scale": (lambda: torch.nn.utils.clip_grads_with_norm_(params, 1.0, norm, foreach=True), 8 * n, 1),
            "upcast": (lambda: [g.float() for g in low], 6 * n, TENSORS),
        }
        row = []
        for name, (step, nbytes, calls) in cases.items():
            measured = median_s(step)
            predicted = float(memory_bound_time(nbytes, acc, f"grad_{name}")) + calls * overhead
            row.append(f"{name} {measured * 1e3:8.2f} / {predicted * 1e3:8.2f} ({measured / predicted:4.2f})")
        print(f"{n / 2**20:5.0f} M params: " + "   ".join(row))


if __name__ == "__main__":
    main()
