"""Reproduce published training runs (scenarios/published/); the work is in simulator/validation/.

This module keeps the entry points that iterate over the Megatron-LM runs of
published-runs.csv (tests comparing the engines, the vectorised path) and re-exports the
report and the fit.
"""

from __future__ import annotations

import copy
from pathlib import Path

from .errors import InputError
from .validation import fit_matmul_max, validate_published
from .validation.runs import PUBLISHED_DIR, load_supplement, map_row, read_csv, source_of

__all__ = ["PUBLISHED_DIR", "fit_matmul_max", "load_rows", "row_scenario", "validate_published"]


def load_rows(folder: Path = PUBLISHED_DIR) -> tuple[list[dict], tuple]:
    """(rows, supplement) of published-runs.csv (the Megatron-LM runs) and its supplement.yaml."""
    supplement = load_supplement(Path(folder) / "supplement.yaml")
    return read_csv(Path(folder) / supplement[0]), supplement


def row_scenario(row: dict, supplement: tuple) -> dict:
    """The scenario mapping of one row of load_rows(); InputError if llmsim cannot express it."""
    file, fmt, sources, extras = supplement
    run = map_row(row, fmt, source_of(row["id"], sources, file), extras.get(row["id"]) or {}, file)
    if run.scenario is None:
        raise InputError(row["id"], run.status, "; ".join(f"{f}: {why}" for f, why in run.reasons))
    return copy.deepcopy(dict(run.scenario))
