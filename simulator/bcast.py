"""Broadcast-safe elementwise max, min, select and float conversion that stay Python numbers
for one plan.

The physics runs once per evaluation on scalars and once per sweep batch on numpy arrays
(vector.py); numpy's ufuncs cost about a microsecond on a scalar, these cost what Python's
`max` does (np.float64 is a float). IEEE arithmetic on Python floats and on float64 arrays
rounds alike, so both paths give the same bits.
"""

from __future__ import annotations

import numpy as np

_SCALARS = (float, int, np.integer)


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


def amin(x):
    """The least entry of x (x itself where it is one number)."""
    return x if isinstance(x, _SCALARS) else np.min(x)


def amax(x):
    """The greatest entry of x (x itself where it is one number)."""
    return x if isinstance(x, _SCALARS) else np.max(x)


def as_float(x):
    """x as a Python float where it is one number, else as a float array (np.asarray)."""
    if isinstance(x, _SCALARS):
        return float(x)
    return np.asarray(x, dtype=float)
