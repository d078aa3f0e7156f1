"""Scenario: model + cluster + plan (+ training), read from YAML or a dict and validated."""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from . import fields as F
from .errors import InputError
from .hardware import Cluster, cluster_from_dict
from .model import ModelSpec, model_from_dict, resolve_hf_config
from .plan import Plan, plan_from_dict, validate
from .training import Training, training_from_dict
from .yamlio import load_yaml

SECTIONS = ("name", "description", "model", "cluster", "plan", "training")


@dataclass(frozen=True)
class Scenario:
    model: ModelSpec
    cluster: Cluster
    plan: Plan
    training: Training = Training()
    name: str = ""

    @property
    def price_usd_per_device_hour(self) -> float:
        if self.training.price_usd_per_device_hour is not None:
            return self.training.price_usd_per_device_hour
        return self.cluster.accelerator.price_usd_per_hour


def scenario_from_dict(data: Any, cache: dict | None = None) -> Scenario:
    """Validate a scenario mapping; raises InputError naming the first bad field.

    `cache` (a dict the caller keeps) makes the model, cluster and training sections and the
    plan's settings parse once per distinct content, e.g. across the points of a sweep;
    results are the same objects."""
    if data is None:
        raise InputError("scenario", None, "the scenario is empty; expected model, cluster and plan sections")
    data = F.require_mapping(data, "scenario")
    F.reject_unknown(data, SECTIONS, "")
    for section in ("model", "cluster", "plan"):
        if data.get(section) is None:
            raise InputError(section, None, f"the {section} section is required")
    model = F.parsed(cache, "model", data["model"], model_from_dict)
    cluster = F.parsed(cache, "cluster", data["cluster"], cluster_from_dict)
    plan = plan_from_dict(data["plan"], devices=cluster.devices, cache=cache)
    validate(plan, model, cluster)
    name = data.get("name") or ""
    training = F.parsed(cache, "training", data.get("training"), training_from_dict)
    return Scenario(model=model, cluster=cluster, plan=plan, training=training, name=str(name))


def read_scenario(path: str | Path) -> dict:
    """The raw mapping of a scenario file (before overrides and validation): a path, or the
    name of a shipped scenario (resources.resolve_data_file), or a published run's,
    `published/<row id>` (validation/runs.py: the scenario `llmsim validate --published`
    predicts for it)."""
    from .resources import resolve_data_file
    from .validation.runs import is_published_name, published_scenario

    if is_published_name(path):
        return published_scenario(path)
    path = resolve_data_file(path, "scenario")
    raw = load_yaml(path, "scenario")
    if raw is None:
        raise InputError("scenario", str(path), "the file is empty; expected model, cluster and plan sections")
    return resolve_hf_config(dict(F.require_mapping(raw, "scenario")), Path(path).parent)


def apply_overrides(data: Mapping, overrides: Mapping[str, Any]) -> dict:
    """Set dotted fields (`plan.tp`, `cluster.nodes`) on a copy of a scenario mapping."""
    data = F.require_mapping(data, "scenario")
    overrides = F.require_mapping(overrides, "overrides")
    out = copy.deepcopy(dict(data))
    for dotted, value in overrides.items():
        if not isinstance(dotted, str) or not all(dotted.split(".")):
            raise InputError("overrides", dotted, "expected dotted field names such as plan.tp")
        parts = dotted.split(".")
        node = out
        for i, part in enumerate(parts[:-1]):
            child = node.get(part)
            if child is None:
                child = node[part] = {}
            if not isinstance(child, dict):
                raise InputError(".".join(parts[: i + 1]), child, "expected a mapping to set " + dotted)
            node = child
        node[parts[-1]] = value
    return out


def load_scenario(path: str | Path, overrides: Mapping[str, Any] | None = None) -> Scenario:
    """A validated scenario from a file (or a shipped name) with dotted-field overrides; bad
    input raises InputError."""
    return scenario_from_dict(apply_overrides(read_scenario(path), overrides if overrides is not None else {}))
