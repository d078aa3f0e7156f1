"""Where the data shipped with the package lives: hardware profiles, model presets, scenarios.

They are package data (simulator/data/), so a wheel installed anywhere finds them through
importlib.resources; the checkout's top-level hardware_profiles/, models/ and scenarios/
are links to the same folders.
"""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path


def data_dir() -> Path:
    """simulator/data of the installed package (a real folder: the package is never zipped)."""
    return Path(str(files("simulator") / "data"))
