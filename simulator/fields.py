"""Typed field readers for dicts loaded from YAML or JSON.

Every reader names the dotted field in its error. Booleans are never numbers, strings
are never numbers, and NaN, inf and absurdly large values are refused. NumPy scalars are
accepted as the Python values they hold (numpy.int64(8) is 8).
"""

from __future__ import annotations

import math
import numbers
from typing import Any, Iterable, Mapping

from .errors import InputError

# Larger than any count or size a training plan can have (10^18 devices, tokens or bytes
# would already be absurd); it keeps overflow and typos out of the physics.
ABSURD = 1e30

_MISSING = object()


def _is_bool(value) -> bool:
    return isinstance(value, bool) or (type(value).__module__ == "numpy" and type(value).__name__ in ("bool_", "bool"))


def require_mapping(value: Any, field: str) -> Mapping:
    if type(value) is not dict and not isinstance(value, Mapping):  # dict first: the ABC check is slow
        raise InputError(field, value, "expected a mapping of keys to values")
    return value


def reject_unknown(data: Mapping, allowed: Iterable[str], field: str) -> None:
    if not isinstance(allowed, (tuple, list, dict)):
        allowed = list(allowed)
    for key in data:
        if key not in allowed:
            where = f"{field}.{key}" if field else str(key)
            raise InputError(where, key, "unknown key; allowed: " + ", ".join(allowed))


def parsed(cache: dict | None, section: str, data: Any, parse):
    """parse(data), remembered in `cache` by the section's content (errors are not remembered)."""
    if cache is None:
        return parse(data)
    key = (section, repr(data))  # equal reprs: equal content (a miss only re-parses)
    if key not in cache:
        cache[key] = parse(data)
    return cache[key]


def _path(field: str, key: str) -> str:
    return f"{field}.{key}" if field else key


def number(data: Mapping, key: str, field: str, default=_MISSING, *, minimum: float = 0.0,
           strict_min: bool = True, maximum: float = ABSURD) -> float:
    """A finite real number in (minimum, maximum] (or [minimum, ...] when not strict)."""
    if data.get(key) is None:
        if default is _MISSING:
            raise InputError(_path(field, key), None, "required number is missing")
        return default
    path = _path(field, key)
    value = data[key]
    if _is_bool(value) or not isinstance(value, numbers.Real):
        raise InputError(path, value, "expected a number")
    try:
        value = float(value)
    except OverflowError:
        raise InputError(path, data[key], f"expected a number <= {maximum:g}") from None
    if not math.isfinite(value):
        raise InputError(path, value, "expected a finite number")
    low_ok = value > minimum if strict_min else value >= minimum
    if not low_ok or value > maximum:
        bound = ">" if strict_min else ">="
        raise InputError(path, data[key], f"expected a number {bound} {minimum:g} and <= {maximum:g}")
    return value


def integer(data: Mapping, key: str, field: str, default=_MISSING, *, minimum: int = 1,
            maximum: int = 10**12) -> int:
    """An integer in [minimum, maximum]; 8.0 is accepted as 8, 8.5 is not."""
    if data.get(key) is None:
        if default is _MISSING:
            raise InputError(_path(field, key), None, "required integer is missing")
        return default
    value = data[key]
    if type(value) is int and minimum <= value <= maximum:  # the common case, without the ABC checks
        return value
    path = _path(field, key)
    if _is_bool(value):
        raise InputError(path, value, "expected an integer")
    if isinstance(value, numbers.Real) and not isinstance(value, numbers.Integral):
        value = float(value)
        if math.isfinite(value) and value.is_integer():
            value = int(value)
    if not isinstance(value, numbers.Integral):
        raise InputError(path, value, "expected an integer")
    value = int(value)
    if value < minimum or value > maximum:
        raise InputError(path, value, f"expected an integer from {minimum} to {maximum}")
    return value


def boolean(data: Mapping, key: str, field: str, default=_MISSING) -> bool:
    if data.get(key) is None:
        if default is _MISSING:
            raise InputError(_path(field, key), None, "required true/false is missing")
        return default
    path = _path(field, key)
    value = data[key]
    if not _is_bool(value):
        raise InputError(path, value, "expected true or false")
    return bool(value)


def choice(data: Mapping, key: str, field: str, options: Iterable[str], default=_MISSING) -> str:
    if not isinstance(options, (tuple, list, dict, frozenset, set)):
        options = list(options)
    if data.get(key) is None:
        if default is _MISSING:
            raise InputError(_path(field, key), None, "required; one of " + ", ".join(options))
        return default
    value = data[key]
    if not isinstance(value, str) or value not in options:
        raise InputError(_path(field, key), value, "expected one of " + ", ".join(options))
    return str(value)


def text(data: Mapping, key: str, field: str, default=_MISSING) -> str:
    if data.get(key) is None:
        if default is _MISSING:
            raise InputError(_path(field, key), None, "required text is missing")
        return default
    path = _path(field, key)
    value = data[key]
    if not isinstance(value, str) or not value.strip():
        raise InputError(path, value, "expected non-empty text")
    return str(value)
