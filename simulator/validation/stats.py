"""Error statistics of predictions against measurements (pure functions).

The relative error of one comparison is (predicted - measured) / measured. A group of
comparisons is summarised by its mean absolute percentage error (MAPE), its signed mean
error (the bias: which way the predictions lean) and its worst row (largest |error|, the
first such row on ties).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable


def relative_error(measured: float, predicted: float) -> float:
    """(predicted - measured) / measured."""
    if not measured:
        raise ValueError("a measured value of zero has no relative error")
    return (predicted - measured) / measured


@dataclass(frozen=True)
class Summary:
    n: int
    mape_pct: float
    signed_mean_pct: float
    worst_id: str
    worst_error_pct: float

    def to_dict(self) -> dict:
        return {"n": self.n, "mape_pct": self.mape_pct, "signed_mean_pct": self.signed_mean_pct,
                "worst_id": self.worst_id, "worst_error_pct": self.worst_error_pct}


def summarise(errors: Iterable[tuple[str, float]]) -> Summary:
    """Summary of (row id, relative error) pairs; an empty group has n = 0 and NaN statistics."""
    items = list(errors)
    if not items:
        return Summary(0, math.nan, math.nan, "", math.nan)
    worst_id, worst = items[0]
    for rid, e in items[1:]:
        if abs(e) > abs(worst):
            worst_id, worst = rid, e
    n = len(items)
    return Summary(n=n, mape_pct=100.0 * sum(abs(e) for _, e in items) / n,
                   signed_mean_pct=100.0 * sum(e for _, e in items) / n,
                   worst_id=worst_id, worst_error_pct=100.0 * worst)
