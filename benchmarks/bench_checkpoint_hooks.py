"""The host's cost of torch's non-reentrant checkpoint per saved tensor, beyond the operators.

    python benchmarks/bench_checkpoint_hooks.py

A chain of N tiny torch.sin calls (each keeps its input for the backward) on 16 elements, one
thread: its forward and backward plain, and checkpointed with torch.utils.checkpoint(use_reentrant=
False), whose pack and unpack hooks run in Python for every saved tensor (the first forward packs,
the re-run packs again, the backward unpacks). The checkpointed step less the plain one less one
more forward without autograd (the re-run's operators) is the checkpoint's own cost; per saved
tensor it is what llmsim does not count (docs/calibration.md, "Noticed and left" of the notes):
its operators carry the bytes they keep, not the number of tensors.
"""

from __future__ import annotations

import torch
from torch.utils.checkpoint import checkpoint

import wallclock  # benchmarks/wallclock.py, beside this script

OPS, ROUNDS, WARMUP = 200, 30, 5


def chain(x):
    for _ in range(OPS):
        x = torch.sin(x)
    return x


def median_s(step) -> float:
    return wallclock.median_s(step, ROUNDS, WARMUP)


def main() -> None:
    torch.set_num_threads(1)
    x = torch.randn(16, requires_grad=True)
    plain = median_s(lambda: chain(x).sum().backward())
    checkpointed = median_s(lambda: checkpoint(chain, x, use_reentrant=False).sum().backward())
    with torch.no_grad():
        rerun = median_s(lambda: chain(x))
    per_tensor = (checkpointed - plain - rerun) / OPS
    print(f"{OPS} saved tensors: plain {plain * 1e3:.2f} ms, checkpointed {checkpointed * 1e3:.2f} ms, "
          f"re-run operators {rerun * 1e3:.2f} ms: the checkpoint's own {per_tensor * 1e6:.1f} us per saved tensor")


if __name__ == "__main__":
    main()
