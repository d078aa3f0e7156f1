"""Safe YAML reading: no object construction, clear one-line errors."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from .errors import InputError


def load_yaml(path: str | Path, field: str = "file") -> Any:
    """Parse a YAML file with `yaml.safe_load`; tags that would build objects are refused."""
    path = Path(path)
    try:
        raw = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InputError(field, str(path), "file not found") from None
    except IsADirectoryError:
        raise InputError(field, str(path), "expected a file, got a directory") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(field, str(path), f"cannot read a UTF-8 text file ({exc.__class__.__name__})") from None
    return parse_yaml(raw, f"{field} {path}")


def parse_yaml(raw: str, where: str) -> Any:
    try:
        return yaml.safe_load(raw)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or exc.__class__.__name__
        raise InputError(where, f"invalid YAML{at}", f"expected valid YAML ({problem})") from None
