"""Broadcast-safe elementwise max, min and select that stay Python numbers for one plan.

The whole-run models (goodput.py, datapipe.py, energy.py) run once per evaluation on
scalars and once per sweep batch on numpy arrays; numpy's ufuncs cost microseconds on a
scalar, these cost what Python's `max` does (np.float64 is a float).
"""

from __future__ import annotations

import numpy as np

_SCALARS = (float, int)


def maximum(a, b):
    if isinstance(a, _SCALARS) and isinstance(b, _SCALARS):
        return a if a >= b else b
    return np.maximum(a, b)


def minimum(a, b):
    if isinstance(a, _SCALARS) and isinstance(b, _SCALARS):
        return a if a <= b else b
    return np.minimum(a, b)


def where(cond, a, b):
    if isinstance(cond, (bool, np.bool_)) and isinstance(a, _SCALARS) and isinstance(b, _SCALARS):
        return a if cond else b
    return np.where(cond, a, b)
