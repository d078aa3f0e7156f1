"""Prediction intervals for step time and throughput, from the residuals of validation runs.

A residual is r = ln(measured step time / predicted step time) of one validation row:
- for a calibrated profile, the rows `llmsim validate --torch` recorded in it (its
  `calibration.validation` block, read by hardware.py into Accelerator.validation_residuals);
- for the other profiles, the published Megatron-LM runs of `llmsim validate --published`
  (A100 GPUs), stored per engine in data/scenarios/published/residuals.json
  (`llmsim validate --published --write-residuals` writes it; a test checks it is current).

The interval is split-conformal (Vovk et al. 2005; Lei et al. 2018, "Distribution-free
predictive inference for regression", JASA 113:1094): with the n residuals sorted
r_(1) <= ... <= r_(n) and nominal coverage 1 - alpha, a new measurement lies in
[predicted·e^r_(lo), predicted·e^r_(hi)], lo = floor((n + 1)·alpha/2),
hi = ceil((n + 1)·(1 - alpha/2)), with probability at least 1 - alpha when the new run's
residual is exchangeable with the validation rows' (a run like those validated). With too few
rows for the coverage (lo < 1 or hi > n) there is no interval. Throughput is tokens per
step over step time, so its interval is the step time's inverted.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from .resources import data_dir

COVERAGE = 0.8  # nominal coverage of the reported intervals
PUBLISHED_RESIDUALS = ("scenarios", "published", "residuals.json")


@dataclass(frozen=True)
class Residuals:
    values: tuple  # ln(measured / predicted step time), one per validation row
    basis: str  # which validation rows, in words


def conformal_bounds(residuals, coverage: float = COVERAGE) -> tuple[float, float] | None:
    """(low, high) residual bounds of a split-conformal interval, or None with too few residuals."""
    return _bounds(tuple(residuals), coverage)


@lru_cache(maxsize=256)
def _bounds(residuals: tuple, coverage: float) -> tuple[float, float] | None:
    r = sorted(residuals)
    n, alpha = len(r), 1.0 - coverage
    # rounded first: (n + 1)·alpha/2 = 2 must not become 1.9999999999999996 and floor to 1
    lo = math.floor(round((n + 1) * alpha / 2, 9))
    hi = math.ceil(round((n + 1) * (1 - alpha / 2), 9))
    if lo < 1 or hi > n:
        return None
    return r[lo - 1], r[hi - 1]


def leave_one_out_coverage(residuals, coverage: float = COVERAGE) -> float:
    """Share of residuals inside the interval computed from all the others (NaN when none has one)."""
    r = list(residuals)
    hits = tries = 0
    for i, x in enumerate(r):
        b = conformal_bounds(r[:i] + r[i + 1:], coverage)
        if b is not None:
            tries += 1
            hits += b[0] <= x <= b[1]
    return hits / tries if tries else math.nan


@lru_cache(maxsize=None)
def published_residuals(engine: str) -> Residuals | None:
    path = data_dir().joinpath(*PUBLISHED_RESIDUALS)
    if not path.is_file():
        return None
    data = json.loads(path.read_text())
    values = data.get("residuals", {}).get(engine)
    return Residuals(tuple(values), data.get("basis", "published runs")) if values else None


def residuals_for(accelerator, engine: str = "graph") -> Residuals | None:
    """The validation residuals that apply to predictions on `accelerator`."""
    own = getattr(accelerator, "validation_residuals", ())
    if own:
        return Residuals(tuple(own), accelerator.validation_basis)
    return published_residuals(engine)


def interval_fields(step_time_s, tokens_per_step, accelerator, engine: str = "graph",
                    coverage: float = COVERAGE) -> dict:
    """The result fields of the prediction interval (None where no interval is available).
    `step_time_s` and `tokens_per_step` may be numpy arrays (vector.py): the intervals are
    then (n, 2) arrays of [low, high]."""
    res = residuals_for(accelerator, engine)
    bounds = conformal_bounds(res.values, coverage) if res else None
    out = {"step_time_s_interval": None, "tokens_per_s_interval": None, "interval_coverage": coverage,
           "interval_basis": res.basis if res else "no validation rows for this profile",
           "interval_rows": len(res.values) if res else 0}
    if bounds is not None:
        step = np.asarray(step_time_s, dtype=float)
        low, high = step * math.exp(bounds[0]), step * math.exp(bounds[1])
        pair = (lambda a, b: np.stack([a, b], axis=-1)) if step.ndim else (lambda a, b: [float(a), float(b)])
        out["step_time_s_interval"] = pair(low, high)
        out["tokens_per_s_interval"] = pair(tokens_per_step / high, tokens_per_step / low)
    return out


def published_residual_data() -> dict:
    """The residuals of `llmsim validate --published` for both engines (what residuals.json holds)."""
    from .published import validate_published

    out = {"basis": "", "coverage_note": "", "residuals": {}, "runs": []}
    for engine in ("graph", "analytic"):
        comparisons, _ = validate_published(engine=engine)
        # a throughput metric (TFLOP/s) is inversely proportional to the step time
        out["residuals"][engine] = [math.log(c.predicted / c.measured) if c.metric != "step_time_s"
                                    else math.log(c.measured / c.predicted) for c in comparisons]
        out["runs"] = [c.id for c in comparisons]
    n = len(out["runs"])
    out["basis"] = (f"{n} published Megatron-LM runs on A100 GPUs (llmsim validate --published); for other "
                    "accelerators an extrapolation")
    out["coverage_note"] = (f"leave-one-out coverage of the {COVERAGE:.0%} interval: "
                            f"{leave_one_out_coverage(out['residuals']['graph']):.0%} (graph engine)")
    return out


def write_published_residuals() -> str:
    path = data_dir().joinpath(*PUBLISHED_RESIDUALS)
    path.write_text(json.dumps(published_residual_data(), indent=1) + "\n")
    published_residuals.cache_clear()
    return str(path)
