"""Prediction intervals for step time and throughput, from the residuals of validation runs.

A residual is r = ln(measured step time / predicted step time) of one validation row:
- for a calibrated profile, the rows `llmsim validate --torch` recorded in it (its
  `calibration.validation` block, read by hardware.py into Accelerator.validation_residuals);
- for a profile validated against published runs, the runs of `llmsim validate --published`
  on the same accelerator where there are enough of them for the interval's coverage,
  otherwise all published runs (an extrapolation, which the result's basis says);
- for a profile that is not (its efficiencies transferred from a fitted one, or a profile
  that does not say), the published runs predicted with efficiencies transferred between the
  fitted profiles by the same rules (validation/transfer.py): how far a transfer misses,
  wider than how far a fit misses;
  both stored per engine in data/scenarios/published/residuals.json (`llmsim validate
  --published --write-residuals` writes it; a test checks it is current).

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
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from .domain import domain_of, outside
from .resources import data_dir

COVERAGE = 0.8  # nominal coverage of the reported intervals
PUBLISHED_RESIDUALS = ("scenarios", "published", "residuals.json")


@dataclass(frozen=True)
class Residuals:
    values: tuple  # ln(measured / predicted step time), one per validation row
    basis: str  # which validation rows, in words
    runs_domain: Mapping | None = None  # what those rows' plans span (domain.domain_of), where stored


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
def _published() -> dict:
    path = data_dir().joinpath(*PUBLISHED_RESIDUALS)
    return json.loads(path.read_text()) if path.is_file() else {}


def published_residuals(engine: str, accelerator: str | None = None) -> Residuals | None:
    """The published runs' residuals of `engine`: those on `accelerator` where they are
    enough for an interval, otherwise all of them (for an accelerator without its own rows,
    an extrapolation, which the basis says)."""
    data = _published()
    everything = data.get("residuals", {}).get(engine)
    own = data.get("by_accelerator", {}).get(engine, {}).get(accelerator or "")
    domains = data.get("domain", {})
    if own and conformal_bounds(own) is not None:
        return Residuals(tuple(own), f"{len(own)} published runs on {accelerator} (llmsim validate --published)",
                         domains.get("by_accelerator", {}).get(accelerator))
    if not everything:
        return None
    where = f"; none enough on {accelerator}" if accelerator else ""
    return Residuals(tuple(everything), f"{len(everything)} published runs (llmsim validate --published){where}",
                     domains.get("all"))


def transferred_residuals(engine: str) -> Residuals | None:
    """The published runs' residuals when each is predicted on a transferred profile."""
    data = _published()
    values = data.get("transferred", {}).get(engine)
    if not values:
        return None
    return Residuals(tuple(values), f"{len(values)} published runs predicted with efficiencies transferred between "
                                    "the fitted profiles: how far a transfer misses",
                     data.get("domain", {}).get("all"))


def residuals_for(accelerator, engine: str = "graph") -> Residuals | None:
    """The validation residuals that apply to predictions on `accelerator`."""
    own = getattr(accelerator, "validation_residuals", ())
    if own:
        return Residuals(tuple(own), accelerator.validation_basis)
    checked = getattr(accelerator, "validation", None)
    transfer = transferred_residuals(engine) if checked is None or not checked.validated else None
    return transfer or published_residuals(engine, getattr(accelerator, "name", None))


def outside_runs(scenario, residuals: Residuals | None) -> list[dict]:
    """Where `scenario` lies beyond the runs behind `residuals` (domain.outside); [] where
    their domain is not stored."""
    return outside(scenario, residuals.runs_domain) if residuals and residuals.runs_domain else []


def interval_fields(step_time_s, tokens_per_step, accelerator, engine: str = "graph",
                    coverage: float = COVERAGE, scenario=None) -> dict:
    """The result fields of how far to trust a prediction: its interval (None where none is
    available) and whether the accelerator profile was checked against measured runs
    (`profile_validated`: None where the profile says nothing; `profile_validation`: why).
    `step_time_s` and `tokens_per_step` may be numpy arrays (vector.py): the intervals are
    then (n, 2) arrays of [low, high]. Given the `scenario`, also where its plan lies
    outside the published runs behind the interval (`outside_validation`, domain.py; empty
    where none are stored, as for a profile calibrated by `llmsim validate --torch`)."""
    res = residuals_for(accelerator, engine)
    bounds = conformal_bounds(res.values, coverage) if res else None
    checked = accelerator.validation
    out = {"step_time_s_interval": None, "tokens_per_s_interval": None, "interval_coverage": coverage,
           "interval_basis": res.basis if res else "no validation rows for this profile",
           "interval_rows": len(res.values) if res else 0,
           "profile_validated": None if checked is None else checked.validated,
           "profile_validation": "" if checked is None else checked.reason}
    if scenario is not None:
        out["outside_validation"] = outside_runs(scenario, res)
    if bounds is not None:
        step = np.asarray(step_time_s, dtype=float)
        low, high = step * math.exp(bounds[0]), step * math.exp(bounds[1])
        pair = (lambda a, b: np.stack([a, b], axis=-1)) if step.ndim else (lambda a, b: [float(a), float(b)])
        out["step_time_s_interval"] = pair(low, high)
        out["tokens_per_s_interval"] = pair(tokens_per_step / high, tokens_per_step / low)
    return out


def published_residual_data() -> dict:
    """The residuals of `llmsim validate --published` for both engines (what residuals.json
    holds): ln(measured / predicted step time) of each predicted run's primary speed metric,
    all together and per accelerator profile."""
    from .validation.report import predict
    from .validation.runs import PREDICTED, SPEED_METRICS, load_runs
    from .validation.transfer import BASIS, with_transferred

    runs = [r for r in load_runs() if r.status == PREDICTED]
    out = {"basis": "", "coverage_note": "", "residuals": {}, "by_accelerator": {}, "runs": [],
           "transferred": {"basis": BASIS}}

    def residuals(engine, adjust=None):
        rows = [(o.run, o.primary) for o in (predict(r, engine, adjust=adjust) for r in runs)
                if o.primary is not None and o.primary.metric in SPEED_METRICS]
        # speed_error = predicted speed / measured speed - 1 = measured step time / predicted - 1
        return [(run, math.log1p(c.speed_error)) for run, c in rows]

    for engine in ("graph", "analytic"):
        rows = residuals(engine)
        out["residuals"][engine] = [x for _, x in rows]
        by = out["by_accelerator"][engine] = {}
        for run, x in rows:
            by.setdefault(run.accelerator, []).append(x)
        out["runs"] = [run.id for run, _ in rows]
        out["transferred"][engine] = [x for _, x in residuals(engine, with_transferred)]
    out["basis"] = f"{len(out['runs'])} published runs (llmsim validate --published)"
    ids = set(out["runs"])
    built = [(r.accelerator, r.build()) for r in runs if r.id in ids]
    out["domain"] = {"all": domain_of(s for _, s in built), "by_accelerator": {
        acc: domain_of(s for a, s in built if a == acc) for acc in sorted({a for a, _ in built})}}
    out["coverage_note"] = (f"leave-one-out coverage of the {COVERAGE:.0%} interval: "
                            f"{leave_one_out_coverage(out['residuals']['graph']):.0%} (graph engine), "
                            f"{leave_one_out_coverage(out['transferred']['graph']):.0%} on transferred "
                            "profiles")
    return out


def write_published_residuals() -> str:
    path = data_dir().joinpath(*PUBLISHED_RESIDUALS)
    path.write_text(json.dumps(published_residual_data(), indent=1) + "\n")
    _published.cache_clear()
    return str(path)
