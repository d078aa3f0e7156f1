"""Where llmsim's data lives: what ships with the package, and what a user writes.

Shipped: hardware profiles, model presets, scenarios and sweep spaces are package data
(simulator/data/), so a wheel installed anywhere finds them through importlib.resources; the
checkout's top-level hardware_profiles/, models/ and scenarios/ are links to the same folders.

Written by the user: profiles from `llmsim calibrate -o NAME` go to user_dir()/calibrated
($LLMSIM_HOME, else $XDG_DATA_HOME/llmsim, else ~/.local/share/llmsim), never into the
installed package, and are found by name like the shipped ones.
"""

from __future__ import annotations

import os
from importlib.resources import files
from pathlib import Path

from .errors import InputError


def data_dir() -> Path:
    """simulator/data of the installed package (a real folder: the package is never zipped)."""
    return Path(str(files("simulator") / "data"))


def user_dir() -> Path:
    """The folder for what the user's own runs write (calibrated profiles)."""
    if os.environ.get("LLMSIM_HOME"):
        return Path(os.environ["LLMSIM_HOME"])
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "llmsim"


def user_calibrated_dir() -> Path:
    return user_dir() / "calibrated"


def bundled_scenarios() -> list[str]:
    """Names of the shipped scenarios and sweep spaces, relative to scenarios/ without .yaml."""
    root = data_dir() / "scenarios"
    return sorted(str(p.relative_to(root).with_suffix("")) for p in root.rglob("*.yaml")
                  if "published" not in p.relative_to(root).parts)


def resolve_data_file(ref: str | Path, field: str) -> Path:
    """A scenario or sweep-space file: `ref` as a path when it exists, else a shipped one by
    name, so that `quickstart`, `quickstart.yaml`, `scenarios/quickstart.yaml` and
    `sweeps/gpt3-175b-tp-pp` work from any folder with an installed wheel."""
    if not isinstance(ref, (str, Path)) or not str(ref):
        raise InputError(field, ref, "expected a file path or the name of a shipped scenario")
    path = Path(ref)
    if path.exists() or path.is_absolute():
        return path
    text = str(ref).replace("\\", "/")
    for prefix in ("./", "scenarios/"):
        if text.startswith(prefix):
            text = text[len(prefix):]
    if ".." not in Path(text).parts and text:
        root = data_dir() / "scenarios"
        for candidate in (root / text, root / f"{text}.yaml"):
            if candidate.is_file():
                return candidate
    raise InputError(field, str(ref), "file not found (shipped scenarios: "
                     + ", ".join(bundled_scenarios()) + ")")
