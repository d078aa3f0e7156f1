"""Where a `validate --torch` configuration's step goes on this CPU: self CPU time of its aten
operators by kind, against the step's wall time.

    python benchmarks/bench_step_ops_cpu.py [CONFIG ...]     (default: the dense and MoE rows)

Runs the configuration's trainer as `validate --torch` does (simulator/calibrate: one thread,
subnormals flushed, the allocator keeping its blocks), warms it up, then profiles 5 steps and
prints per step: GEMMs (aten::mm, addmm, bmm), attention (SDPA's flash kernels), the optimizer
(fused AdamW and its Python step), every other aten operator, and what the step spends outside
operators (wall time of the unprofiled steps less the operators' self time: Python, autograd's
engine, the profiler's own share excluded), with the number of aten calls. Compare with
`llmsim evaluate` of validate_torch.scenario_dict(config) on the machine's profile: the MoE
rows, predicted fast on every CPU, differ from the dense ones in the calls outside their GEMMs.
"""

from __future__ import annotations

import os
import sys
from collections import Counter

import torch
import torch.distributed as dist
from torch.profiler import ProfilerActivity, profile

from simulator.calibrate.device import configure
from simulator.calibrate.trainer import make_trainer
from simulator.calibrate.validate_torch import GRID

import wallclock  # benchmarks/wallclock.py, beside this script

KINDS = {"GEMM": ("aten::mm", "aten::addmm", "aten::bmm"),
         "attention": ("aten::_scaled_dot_product_flash_attention_for_cpu",
                       "aten::_scaled_dot_product_flash_attention_for_cpu_backward"),
         "optimizer": ("aten::_fused_adamw_", "Optimizer.step#AdamW.step")}
STEPS = 5


def kind_of(key: str) -> str:
    return next((k for k, names in KINDS.items() if key in names), "other aten")


def breakdown(rc) -> dict:
    """Milliseconds per step by kind, the step's wall time, and the aten calls per step."""
    tr = make_trainer(rc.gpt, rc.recompute, rc.precision, rc.grad_accum, rc.micro_batch, torch.device("cpu"), 0,
                      rc.dp, rc.optimizer)
    wall = wallclock.median_s(tr.step, STEPS + 3, 3) * 1e3
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(STEPS):
            tr.step()
    ms, calls = Counter(), 0
    for e in prof.key_averages():
        ms[kind_of(e.key)] += e.self_cpu_time_total / 1e3 / STEPS
        calls += e.count / STEPS if e.key.startswith("aten::") else 0
    return {**ms, "outside operators": wall - sum(ms.values()), "step": wall, "aten calls": calls}


def main() -> None:
    names = sys.argv[1:] or ["l4-h256-s256-b2", "l4-h256-s256-b2-moe8k2"]
    configure(1, "cpu")
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29541")
    dist.init_process_group("gloo", rank=0, world_size=1)  # the trainer's DP hooks need a group
    configs = [rc for rc in GRID if rc.name in names and rc.dp == 1]
    rows = {rc.name: breakdown(rc) for rc in configs}
    cols = ["GEMM", "attention", "optimizer", "other aten", "outside operators", "step", "aten calls"]
    print(f"# {torch.__version__}, one thread; ms per step (aten calls: count)")
    print(f"{'config':34s}" + "".join(f"{c:>19s}" for c in cols))
    for name, r in rows.items():
        print(f"{name:34s}" + "".join(f"{r.get(c, 0.0):19.1f}" for c in cols))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
