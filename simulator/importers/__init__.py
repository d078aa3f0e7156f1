"""Training configs of other frameworks -> llmsim scenario mappings.

    import_config("torchtitan", "llama3_8b.toml", {"cluster.node": "dgx-h100", "cluster.nodes": 8})

Each importer reads every key of its source and reports it as `mapped` (to a scenario field),
`ignored` (no effect on step time or memory: paths, learning rates, logging) or `unmapped`
(it may matter, and llmsim cannot express it; `evaluate --from` prints these). A setting
that would make the prediction about a different model or plan (MoE experts, layer-wise
partial recomputation, another optimizer) is refused with an InputError naming the key.
The configs do not say which hardware ran them: the cluster comes from the overrides
(`--node`, `--nodes`), unless the source states node and device counts (Megatron's torchrun
arguments, NeMo's trainer section), in which case only `--node` is needed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

from ..errors import InputError
from .common import Imported

KINDS = ("torchtitan", "megatron", "deepspeed")


def import_config(kind: str, path: str | Path | None, overrides: Mapping[str, Any] | None = None,
                  argv: list[str] | None = None) -> Imported:
    """Read `path` (or, for megatron, the argument list `argv`) as a `kind` config and return the
    scenario mapping with `overrides` (dotted fields, e.g. from command-line flags) applied."""
    from ..scenario import apply_overrides

    overrides = dict(overrides or {})
    if kind == "torchtitan":
        from .torchtitan import read
    elif kind == "megatron":
        from .megatron import read
    elif kind == "deepspeed":
        from .deepspeed import read
    else:
        raise InputError("import", kind, "expected one of " + ", ".join(KINDS))
    imported = read(path, argv, frozenset(overrides)) if kind == "megatron" else read(path)
    scenario = apply_overrides(imported.scenario, overrides)
    cluster = scenario.get("cluster") or {}
    if cluster.get("node") is None and cluster.get("accelerator") is None:
        raise InputError("cluster.node", None, f"a {kind} config does not say which hardware ran it; give --node "
                         "(e.g. dgx-h100) and --nodes")
    scenario.setdefault("plan", {}).setdefault("dp", "auto")
    scenario["cluster"].setdefault("nodes", 1)
    imported.scenario = imported.resolve(scenario, set(overrides))
    return imported


__all__ = ["Imported", "KINDS", "import_config"]
