"""Validation against published training runs (`llmsim validate --published`).

    runs.py      the CSV copies of shared/validation + their supplements -> Run (scenario,
                 measurements, or the features that keep it from being expressed)
    features.py  the named features a run may need that llmsim cannot say today
    stats.py     MAPE, signed mean error, worst row
    report.py    predictions, comparisons in each source's convention, summaries, text
    fit.py       the matmul-efficiency fit (provenance of the A100 profile)
"""

from .fit import fit_matmul_max
from .report import format_report, predict, validate_published
from .runs import PUBLISHED_DIR, Run, load_runs

__all__ = ["PUBLISHED_DIR", "Run", "fit_matmul_max", "format_report", "load_runs", "predict", "validate_published"]
