"""Where a plan lies outside the published runs its prediction interval comes from: the
intervals' applicability domain.

An interval (intervals.py) holds for a run like those validated: it is built on the
residuals of the published runs on the plan's accelerator (or of all of them, predicted on
transferred profiles, for a profile without runs of its own), and says nothing of a plan
unlike any of them. This module names, for one plan, each property in which it lies beyond
every one of those runs: a number beyond their range (a 1 M-token sequence where the runs
reach 262k, 16,384 GPUs where they reach 3,072), a value none of them used (MXFP8, ZeRO-2, Muon).
It tests each property on its own, so a plan inside every range may still combine them as no
run did; a flag says where the interval is an extrapolation, its absence does not say the
interval holds.

The ranges are stored with the residuals (`llmsim validate --published --write-residuals`
writes both to data/scenarios/published/residuals.json; a test checks they are current).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

from .workload import attention_mask

# Properties compared as a range [min, max] over the runs: scale, model size and shape, and
# the parallel degrees whose communication grows with them.
RANGES: dict[str, Callable] = {
    "devices": lambda s: s.cluster.devices,
    "model.parameters": lambda s: s.model.params(),
    "model.seq_len": lambda s: s.model.seq_len,
    "model.experts": lambda s: s.model.experts,
    "plan.tp": lambda s: s.plan.tp,
    "plan.pp": lambda s: s.plan.pp,
    "plan.cp": lambda s: s.plan.cp,
    "plan.ep": lambda s: s.plan.ep,
    "plan.dp_replicate": lambda s: s.plan.dp_replicate,
    "plan.micro_batch": lambda s: s.plan.micro_batch,
}
# Properties compared as the set of values the runs used.
VALUES: dict[str, Callable] = {
    # bf16 and fp16 run alike (the same tensor-core rate; fp16 adds a loss scale)
    "plan.precision": lambda s: "bf16/fp16" if s.plan.precision in ("bf16", "fp16") else s.plan.precision,
    "plan.recompute": lambda s: s.plan.recompute,
    "plan.zero_stage": lambda s: s.plan.zero_stage,
    "plan.optimizer": lambda s: s.plan.optimizer,
    # how CP runs the attention, where it runs at all
    "plan.cp_attention": lambda s: s.plan.cp_attention if s.plan.cp > 1 else "none",
    # the pairs attention leaves out: causal, sliding windows, packed documents
    "model.attention_mask": lambda s: attention_mask(s.model),
}


def _plain(x):
    return int(x) if isinstance(x, (int, float)) and float(x).is_integer() else x


def domain_of(scenarios: Iterable) -> dict:
    """{property: [min, max]} for RANGES and {property: sorted values} for VALUES over
    `scenarios` (the JSON form stored beside the residuals)."""
    scenarios = list(scenarios)
    out = {}
    for name, get in RANGES.items():
        xs = [_plain(get(s)) for s in scenarios]
        out[name] = [min(xs), max(xs)]
    for name, get in VALUES.items():
        out[name] = sorted({_plain(get(s)) for s in scenarios}, key=str)
    return out


def outside(scenario, ranges: Mapping) -> list[dict]:
    """Each property of `scenario` beyond `ranges` (domain_of()'s form): {field, value, checked}
    with `checked` the runs' [min, max] or values; [] where it lies within every one."""
    flags = []
    for name, get in RANGES.items():
        if name in ranges:
            lo, hi = ranges[name]
            value = _plain(get(scenario))
            if not lo <= value <= hi:
                flags.append({"field": name, "value": value, "checked": [lo, hi]})
    for name, get in VALUES.items():
        if name in ranges:
            value = _plain(get(scenario))
            if value not in ranges[name]:
                flags.append({"field": name, "value": value, "checked": list(ranges[name])})
    return flags


def _words(field: str, x) -> str:
    return f"{x / 1e9:.3g} B" if field == "model.parameters" else str(x)


def describe(flag: Mapping) -> str:
    """One flag in words: `plan.cp 16 (runs: 1-8)`, `plan.precision mxfp8 (runs: bf16/fp16, fp8)`."""
    field, checked = flag["field"], flag["checked"]
    if field in RANGES:
        lo, hi = (_words(field, x) for x in checked)
        span = f"{lo}-{hi}" if lo != hi else lo
    else:
        span = ", ".join(str(x) for x in checked)
    return f"{field} {_words(field, flag['value'])} (runs: {span})"
