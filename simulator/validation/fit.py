"""Profile numbers fitted to a named subset of the published runs: a matmul efficiency, a
node's launch overhead."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

from ..errors import InputError
from .report import Outcome, predict, with_accelerator, with_launch_overhead, with_matmul_max
from .runs import PREDICTED, PUBLISHED_DIR, load_runs, matching


def select(spec: str, folder: Path = PUBLISHED_DIR):
    """The expressible runs a fit names (runs.matching: `PREFIX[,PREFIX...][:PRECISION]`, e.g.
    `dgxc-:bf16`)."""
    return [r for r in matching(load_runs(folder), spec) if r.status == PREDICTED]


def fit_matmul_max(prefix: str, engine: str = "analytic", folder: Path = PUBLISHED_DIR,
                   reduction_factor: bool = True) -> tuple[float, list[Outcome]]:
    """Least-squares fit of the accelerator's matmul efficiency `max` to the expressible runs
    `prefix` names (`select`: id prefixes, optionally a precision), on the squared log error of
    each run's primary measurement. Returns (max, outcomes at it).

    This is the provenance of the profiles' fitted matmul efficiencies (A100 on the
    Korthikanti et al. runs, H100 on NeMo's BF16 runs, the 500 W H100 on torchtitan's
    Dec 2024 BF16 runs): one number for all runs of the named data set, never a per-row
    constant. `reduction_factor=False` fits with the profile's matmul_k_half off, the
    real-shape ratio a profile without a reduction-dimension measurement of its own takes
    over (the B200's).
    """
    def adjust(x):
        def at(s):
            s = with_matmul_max(s, x)
            if reduction_factor:
                return s
            return with_accelerator(s, replace(s.cluster.accelerator, matmul_k_half=0.0))
        return at

    return _fit(prefix, engine, folder, adjust, (0.3, 1.0), 3, "--fit-matmul")


def fit_launch_overhead_us(prefix: str, engine: str = "analytic",
                           folder: Path = PUBLISHED_DIR) -> tuple[float, list[Outcome]]:
    """Least-squares fit of the node's host launch overhead per operator (hostbound.py), in
    microseconds, to the runs `prefix` names, as fit_matmul_max: the provenance of the DGX A100
    profile's `launch_overhead_us` (vTrain's single-node runs, the only published runs whose
    passes are host-bound)."""
    return _fit(prefix, engine, folder, lambda x: (lambda s: with_launch_overhead(s, x * 1e-6)), (0.0, 200.0), 1,
                "--fit-launch")


def _fit(spec, engine, folder, adjust, bounds, digits, option):
    from scipy.optimize import minimize_scalar

    chosen = select(spec, folder)
    if not chosen:
        raise InputError(option, spec, "no expressible published run id starts with it")

    def loss(x: float) -> float:
        return sum(math.log(predict(r, engine, adjust=adjust(x)).primary.predicted / r.primary.value) ** 2
                   for r in chosen)

    best = minimize_scalar(loss, bounds=bounds, method="bounded", options={"xatol": 10.0 ** -(digits + 1)})
    value = round(float(best.x), digits)
    return value, [predict(r, engine, adjust=adjust(value)) for r in chosen]
