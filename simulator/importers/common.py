"""What every importer shares: the key-by-key account of a source config."""

from __future__ import annotations

import fnmatch
import math
from dataclasses import dataclass, field
from typing import Iterable, Mapping

from .. import fields as F
from ..errors import InputError


@dataclass
class Imported:
    """A scenario mapping and the account of every source key."""

    scenario: dict
    mapped: list = field(default_factory=list)  # {key, value, field}
    ignored: list = field(default_factory=list)  # {key, value}
    unmapped: list = field(default_factory=list)  # {key, value, why}
    # Fields that need the cluster or the model (dp, layers): dotted field -> fn(context), where
    # context has devices, dp, layers, global_batch, seq_len; applied in order by resolve().
    deferred: dict = field(default_factory=dict)

    def resolve(self, scenario: dict, given) -> dict:
        """Fill the deferred fields that `given` (overridden field names) does not set."""
        from ..hardware import cluster_from_dict
        from ..model import model_from_dict

        context = {}
        for dotted, fn in self.deferred.items():
            if dotted in given:
                continue
            plan = F.require_mapping(scenario.get("plan", {}), "plan")
            if not context:
                cluster = cluster_from_dict(scenario.get("cluster"))
                devices = cluster.devices
                split = math.prod(F.integer(plan, k, "plan", 1, maximum=10**6) for k in ("tp", "pp", "cp"))
                dp = devices // split if plan.get("dp") in (None, "auto") else F.integer(plan, "dp", "plan")
                model = model_from_dict(scenario.get("model"))
                context = {"devices": devices, "dp": max(1, dp), "layers": model.layers, "seq_len": model.seq_len,
                           "accelerator": cluster.accelerator.name}
            context["global_batch"] = F.integer(plan, "global_batch", "plan", 1, maximum=10**9)
            set_field(scenario, dotted, fn(context))
        return scenario


class Conflicting(tuple):
    """The values of a key a source gives more than once with different values (a launch
    script's shell conditional: both branches' words are read): refused where read."""


def flatten(data: Mapping, prefix: str = "") -> dict:
    """Nested mappings as dotted keys (lists stay values)."""
    out = {}
    for key, value in data.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            out.update(flatten(value, name + "."))
        else:
            out[name] = value
    return out


def set_field(scenario: dict, dotted: str, value) -> None:
    node = scenario
    parts = dotted.split(".")
    for part in parts[:-1]:
        node = node.setdefault(part, {})
    node[parts[-1]] = value


# the value recorded for a key the source does not give (Account.absent, refuse)
ABSENT = "(absent)"


class Account:
    """Reads a flattened source and records what became of each key."""

    def __init__(self, source: Mapping, where: str, aliases: Mapping[str, str] | None = None,
                 scenario: dict | None = None):
        """`aliases`: key -> the name this source's layout gives it (an older release's), read
        and reported under that name. `scenario`: the one this account's mappings go into
        (another account's, for a source read inside another: merge_into)."""
        self.flat = flatten(source)
        self.where = where
        self.aliases = dict(aliases or {})
        self.scenario: dict = {} if scenario is None else scenario
        self.result = Imported(self.scenario)
        self._seen: set = set()

    def name(self, key: str) -> str:
        """The key as this source names it."""
        return self.aliases.get(key, key)

    def has(self, key: str) -> bool:
        key = self.name(key)
        return key in self.flat and self._read(key) is not None

    def get(self, key: str, default=None):
        value = self._read(key)
        return default if value is None else value

    def _read(self, key: str):
        key = self.name(key)
        value = self.flat.get(key)
        if isinstance(value, Conflicting):
            self.refuse(key, "given more than once with different values (both branches of a shell "
                             "conditional?); keep the one the run used")
        return value

    def number(self, key: str, default=None, integer: bool = True):
        """A numeric value (an integer unless integer=False); text numbers like "8" are read too."""
        if not self.has(key):
            return default
        value = self._read(key)
        if isinstance(value, str):
            try:
                value = float(value) if not integer else int(value)
            except ValueError:
                self.refuse(key, f"expected a number, got {value!r}")
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            self.refuse(key, f"expected a number, got {value!r}")
        # abs() first: an int too large for a float has no isfinite; no config means more
        if not abs(value) <= F.ABSURD:
            self.refuse(key, f"expected a finite number of magnitude at most {F.ABSURD:g}")
        if integer:
            if float(value) != int(value):
                self.refuse(key, f"expected an integer, got {value!r}")
            return int(value)
        return float(value)

    def text(self, key: str, default: str | None = None) -> str | None:
        """A text value (numbers and booleans as written); a list is refused."""
        value = self.get(key, default)
        if isinstance(value, (list, dict)):
            self.refuse(key, "expected one value, not a list or table")
        return value if value is None or isinstance(value, str) else str(value)

    def texts(self, key: str, default: list | None = None) -> list[str]:
        """A list of text values (one text value is a list of one)."""
        value = self.get(key, default if default is not None else [])
        values = value if isinstance(value, list) else [value]
        if not all(isinstance(v, str) for v in values):
            self.refuse(key, "expected a list of names")
        return values

    def map(self, key: str, dotted: str, value, why: str | None = None) -> None:
        """Source `key` sets scenario field `dotted` to `value` (`why`, where it is not plain, for the report)."""
        key = self.name(key)
        set_field(self.scenario, dotted, value)
        self.result.mapped.append({"key": key, "value": self.flat.get(key, "(absent: default)"),
                                   "field": f"{dotted}={value}" + (f" ({why})" if why else "")})
        self._seen.add(key)

    def derive(self, key: str, dotted: str, how: str, fn) -> None:
        """Source `key` sets `dotted` to fn(context) once the cluster and model are known
        (Imported.resolve); `how` says how, for the report."""
        key = self.name(key)
        self.result.deferred[dotted] = fn
        self.result.mapped.append({"key": key, "value": self.flat.get(key, "(absent: default)"),
                                   "field": f"{dotted}={how}"})
        self._seen.add(key)

    def used(self, *keys: str) -> None:
        """Keys read to derive a mapped field (recorded with the field they went into, or here as such)."""
        for key in map(self.name, keys):
            if key in self.flat and key not in self._seen:
                self.result.mapped.append({"key": key, "value": self.flat[key], "field": "(read with the above)"})
                self._seen.add(key)

    def unmapped(self, key: str, why: str) -> None:
        key = self.name(key)
        if key in self.flat and key not in self._seen:
            self.result.unmapped.append({"key": key, "value": self.flat[key], "why": why})
            self._seen.add(key)

    def ignore(self, *keys: str) -> None:
        """Keys that have no effect on this config (listed as ignored)."""
        for key in map(self.name, keys):
            if key in self.flat and key not in self._seen:
                self.result.ignored.append({"key": key, "value": self.flat[key]})
                self._seen.add(key)

    def absent(self, key: str, why: str) -> None:
        """A key the source does not give whose default llmsim had to assume (said in the report)."""
        self.result.unmapped.append({"key": self.name(key), "value": ABSENT, "why": why})

    def refuse(self, key: str, why: str):
        key = self.name(key)
        raise InputError(f"{self.where} {key}", self.flat.get(key, ABSENT), why)

    def finish(self, ignored: Iterable[str], reasons: Mapping[str, str] | None = None) -> Imported:
        """Every key not yet accounted for: `ignored` (fnmatch patterns) or unmapped (with the
        reason of its pattern in `reasons`, else "not modelled by llmsim")."""
        ignored = list(ignored)
        reasons = reasons or {}
        for key, value in self.flat.items():
            if key in self._seen:
                continue
            why = next((r for pattern, r in reasons.items() if fnmatch.fnmatchcase(key, pattern)), None)
            if why is None and any(fnmatch.fnmatchcase(key, p) for p in ignored):
                self.result.ignored.append({"key": key, "value": value})
            else:
                self.result.unmapped.append({"key": key, "value": value, "why": why or "not modelled by llmsim"})
            self._seen.add(key)
        return self.result


def has_flash2(accelerator: str) -> bool:
    """Whether the accelerator's profile has FlashAttention-2's rate (plan.attention_kernel flash2)."""
    from ..hardware import load_accelerator
    acc = load_accelerator(accelerator)
    return acc.attention_flash2 is not None or acc.attention_is_flash2


def merge_into(outer: Imported, inner: Imported, prefix: str) -> None:
    """The account of a source read inside another (a launch script's DeepSpeed config), its
    keys named `prefix` + key, added to the outer one's; both wrote the same scenario."""
    for kind in ("mapped", "ignored", "unmapped"):
        getattr(outer, kind).extend({**entry, "key": prefix + entry["key"]} for entry in getattr(inner, kind))
    outer.deferred.update(inner.deferred)


def padded_vocab(vocab: int, multiple: int, tp: int) -> int:
    """Megatron-LM pads the vocabulary to a multiple of make_vocab_size_divisible_by x TP
    (megatron/training/tokenizer/tokenizer.py, _vocab_size_with_padding)."""
    step = multiple * tp
    if step < 1:  # a TP size or multiple below 1: the plan's own check names it
        return vocab
    return -(-vocab // step) * step


# Vocabulary sizes of tokenizers that configs name instead of giving a size.
TOKENIZER_VOCAB = {
    "GPT2BPETokenizer": 50257,  # GPT-2 BPE (Radford et al. 2019)
    "Llama2Tokenizer": 32000,  # Llama 2's SentencePiece model, "32k tokens" (Touvron et al. 2023, Sec. 2.1)
    "deepseek-ai/DeepSeek-V3": 129280,  # its config.json vocab_size (tests/data/hf/deepseek-v3.json)
    "meta-llama/Meta-Llama-3-8B": 128256, "meta-llama/Meta-Llama-3-70B": 128256,
    "meta-llama/Meta-Llama-3.1-8B": 128256, "meta-llama/Meta-Llama-3.1-70B": 128256,
    "meta-llama/Llama-3.1-8B": 128256, "meta-llama/Llama-3.1-70B": 128256, "meta-llama/Llama-3.1-405B": 128256,
}
