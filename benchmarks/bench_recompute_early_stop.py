"""Which GEMMs a non-reentrant checkpoint runs again: the linears' forward time in one
training step, without recomputation and under full recomputation with early stop on and off.

    python benchmarks/bench_recompute_early_stop.py

The validation's torch model (simulator/calibrate/torch_model.py, l4-h256-s256-b2: 4 layers,
hidden 256, 2 x 256 tokens) checkpoints each block with torch.utils.checkpoint(use_reentrant=
False), as torchtitan's full AC does. Per linear of the block (qkv, proj, up, down) this
prints its aten::addmm calls (forward only: the backward runs aten::mm) and their self CPU
time, the median of 7 profiled steps on one thread. A linear re-run costs its forward time
again; one whose kernel the early stop skips costs about nothing (the call is entered, its
input packed, the recomputation stopped): plan.recompute_early_stop, recompute.early_stop_rerun.
"""

from __future__ import annotations

import statistics

import torch
from torch.profiler import ProfilerActivity, profile

from simulator.calibrate.torch_model import GPTConfig, build_model

LAYERS, HIDDEN, TOKENS = 4, 256, 2 * 256
# each linear's (input, weight) shapes as aten::addmm sees them
LINEARS = {str([[TOKENS, HIDDEN], [HIDDEN, 3 * HIDDEN]]): "qkv", str([[TOKENS, HIDDEN], [HIDDEN, HIDDEN]]): "proj",
           str([[TOKENS, HIDDEN], [HIDDEN, 4 * HIDDEN]]): "up", str([[TOKENS, 4 * HIDDEN], [4 * HIDDEN, HIDDEN]]): "down"}


def linears_ms(recompute: str, early_stop: bool, steps: int = 7, warmup: int = 2) -> dict:
    """{linear: (addmm calls, median self CPU ms)} over `steps` profiled training steps."""
    model = build_model(GPTConfig(layers=LAYERS, hidden=HIDDEN, heads=8, vocab=2048, seq_len=256), recompute)
    idx, targets = torch.randint(0, 2048, (2, 256)), torch.randint(0, 2048, (2, 256))
    runs = []
    for i in range(warmup + steps):
        with torch.utils.checkpoint.set_checkpoint_early_stop(early_stop), \
                profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
            model(idx, targets).backward()
        if i < warmup:
            continue
        per = {name: [0, 0.0] for name in LINEARS.values()}
        for e in prof.events():
            name = LINEARS.get(str(e.input_shapes[1:3])) if e.name == "aten::addmm" else None
            if name:
                per[name][0] += 1
                per[name][1] += e.self_cpu_time_total / 1e3
        runs.append(per)
    return {name: (runs[0][name][0], statistics.median(r[name][1] for r in runs)) for name in LINEARS.values()}


def main() -> None:
    torch.set_num_threads(1)
    print(f"{'recompute':10s} {'early stop':10s} " + " ".join(f"{n:>18s}" for n in LINEARS.values()))
    for recompute, early_stop in (("none", True), ("full", True), ("full", False)):
        per = linears_ms(recompute, early_stop)
        print(f"{recompute:10s} {str(early_stop):10s} " +
              " ".join(f"{calls:2d} calls {ms:6.2f} ms" for calls, ms in per.values()))


if __name__ == "__main__":
    main()
