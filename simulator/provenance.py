"""Each number of a hardware profile beside the source it states, for `llmsim hardware show`.

A profile (accelerator, node or network YAML; hardware_profiles/README.md) keeps its numbers
and, under `sources`, where each comes from: a datasheet, a microbenchmark, a fit on named
runs, or a transfer from another profile, marked [inferred] or [transferred] where it is not
measured on the part itself. A source may be given for the exact field
(`efficiency.matmul_fp8`), for the mapping that holds it (`peak_tflops` for
`peak_tflops.bf16`) or for a field of the same curve (`efficiency.matmul` for
`efficiency.matmul.half_flops`); the most specific one applies.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from .errors import InputError
from .hardware import CALIBRATED, available, profiles_dir
from .importers.common import flatten
from .resources import user_calibrated_dir

KINDS = ("accelerators", "nodes", "networks")
UNSOURCED = ("name", "description", "vendor", "accelerator", "network", "host_link", "scaleup.name",
             "scaleup.topology", "validation.validated", "validation.reason")  # names and words, not numbers


def profile_file(name: str) -> tuple[str, Path]:
    """(kind, path) of the shipped or calibrated profile called `name`."""
    root = profiles_dir()
    if "/" not in name:
        for kind in KINDS:
            path = root / kind / f"{name}.yaml"
            if path.is_file():
                return kind, path
        for folder in (root / CALIBRATED, user_calibrated_dir()):
            path = folder / f"{name}.yaml"
            if path.is_file():
                kind = "nodes" if name.endswith("-node") else "networks" if name.endswith("-net") else "accelerators"
                return kind, path
    known = sorted({n for kind in KINDS for n in available(kind)})
    raise InputError("hardware show", name, "known profiles: " + ", ".join(known))


def source_of(field: str, sources: Mapping) -> str:
    """The most specific source stated for dotted `field`: its own, else its mapping's, else
    that of the curve or table it belongs to; "" where none is."""
    parts = field.split(".")
    for n in range(len(parts), 0, -1):
        text = sources.get(".".join(parts[:n]))
        if text:
            return str(text)
    return ""


def provenance_rows(data: Mapping) -> list[dict]:
    """{field, value, source} for every value of a profile's YAML mapping but its `sources`;
    the `calibration` block of a profile `llmsim calibrate` wrote is its own record."""
    sources = dict(data.get("sources") or {})
    run = (data.get("calibration") or {}).get("tool")
    if run:
        sources.setdefault("calibration", f"[measured] the record of {run}")
    return [{"field": field, "value": value, "source": source_of(field, sources)}
            for field, value in flatten({k: v for k, v in data.items() if k != "sources"}).items()]


def render(name: str, kind: str, path: Path, rows: list[dict], width: int = 100) -> str:
    """The rows as text: consecutive fields that share a source, then that source once,
    wrapped; a calibration record folded into one line."""
    import itertools
    import textwrap

    record = [r for r in rows if r["field"].startswith("calibration.")]
    rows = [r for r in rows if not r["field"].startswith("calibration.")]
    lines = [f"{name} ({kind[:-1]}, {path})", ""]
    for source, run in itertools.groupby(rows, key=lambda r: r["source"]):
        lines += [f"{r['field']} = {r['value']}" for r in run]
        if source:
            lines += textwrap.wrap(source, width, initial_indent="    ", subsequent_indent="    ")
    if record:
        lines += [f"calibration: {len(record)} values, {record[0]['source']} (--json lists them)"]
    return "\n".join(lines)


def unsourced(rows: list[dict]) -> list[str]:
    """The numbers of `provenance_rows` that state no source."""
    return [r["field"] for r in rows if not r["source"] and r["field"] not in UNSOURCED
            and not isinstance(r["value"], str)]
