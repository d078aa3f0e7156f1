"""The A100 matmul efficiency fitted to a named subset of the published runs."""

from __future__ import annotations

import math
from pathlib import Path

from ..errors import InputError
from .report import Outcome, predict
from .runs import PREDICTED, PUBLISHED_DIR, load_runs


def fit_matmul_max(prefix: str, engine: str = "analytic", folder: Path = PUBLISHED_DIR) -> tuple[float, list[Outcome]]:
    """Least-squares fit of the accelerator's matmul efficiency `max` to the expressible runs
    whose id starts with `prefix` (squared log error of each run's primary measurement).
    Returns (max, outcomes at it).

    This is the provenance of the A100 profile's matmul efficiency: one number for all runs
    of the named data set, never a per-row constant.
    """
    from scipy.optimize import minimize_scalar

    chosen = [r for r in load_runs(folder) if r.id.startswith(prefix) and r.status == PREDICTED]
    if not chosen:
        raise InputError("--fit-matmul", prefix, "no expressible published run id starts with it")

    def loss(x: float) -> float:
        return sum(math.log(predict(r, engine, x).primary.predicted / r.primary.value) ** 2 for r in chosen)

    best = minimize_scalar(loss, bounds=(0.3, 1.0), method="bounded", options={"xatol": 1e-4})
    value = round(float(best.x), 3)
    return value, [predict(r, engine, value) for r in chosen]
