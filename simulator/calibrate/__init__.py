"""Calibration against real torch runs: microbenchmarks -> fitted profile; real training steps -> error report.

torch (and scipy) are the optional extra `calibrate`; `import simulator` never imports
them. Every entry point calls `require_torch()` first, which turns a missing torch into
one InputError line (exit code 2 from the CLI).

Modules, one concept each:
    device.py         the settings every measuring process shares (threads, subnormals, allocator)
    timing.py         interleaved rounds of timed calls on the wall or CPU clock: lower quartile, spread
    microbench.py     GEMM, attention, memory-bound, framework-operator, optimizer, host-overhead benchmarks
    dist.py           local torch.distributed launcher, all-reduce and co-running-devices benchmarks
    fit.py            efficiency curves eff(x) = max*x/(x+half) (with a cache spill point) fitted with scipy
    calibration.py    `llmsim calibrate`: the benchmarks, the fits, the profiles
    profile_writer.py accelerator + node + network YAML with provenance
    torch_model.py    the small GPT written in torch (same structure as workload.py)
    trainer.py        its training step (fp32; bf16 with fp32 master weights), as validated
    memtrack.py       peak live tensor bytes on CPU from profiler allocation events
    validate_torch.py real training steps vs predictions over a grid of configurations
"""

from __future__ import annotations

from ..errors import InputError

INSTALL_HINT = "pip install -e '.[calibrate]'"


def require_torch():
    """Import torch and scipy or raise a one-line InputError telling how to install them."""
    try:
        import torch  # noqa: F401
        import scipy  # noqa: F401
    except ImportError as exc:
        raise InputError("calibrate", getattr(exc, "name", "torch"),
                         f"torch and scipy are needed: {INSTALL_HINT}") from None
    return torch
