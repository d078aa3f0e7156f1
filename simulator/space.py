"""Sweep spaces: a base scenario plus lists or ranges for dotted fields, and constraints.

A space file (YAML):

    base_file: ../gpt3-175b-1024xa100.yaml   # or `base:` with an inline scenario
    sweep:
      plan.tp: [1, 2, 4, 8]                    # a list of values
      plan.pp: {values: [1, 2, 4, 8, 16]}      # the same, spelled out
      plan.micro_batch: {range: [1, 5, 1]}     # start, stop (excluded), step, like Python's range
      plan.global_batch: {pow2: [256, 2048]}   # powers of two from .. to (both included)
      plan.dp: auto                            # fills the device count: devices / (tp*pp*cp)
    constraints:
      - plan.tp * plan.pp <= 64
      - plan.recompute != "none" or plan.micro_batch <= 2

Points are the Cartesian product of the `sweep` axes in file order (the last axis varies
fastest). A constraint is a small expression over dotted fields (numbers, strings,
true/false, + - * / // % **, comparisons, and/or/not, `in [..]`); it is interpreted by
a whitelist walker over Python's AST, never by eval, and bounded: at most MAX_CONSTRAINT_CHARS
characters, numbers within +-MAX_MAGNITUDE (a `**` that would leave them is refused before it
is computed), text of at most MAX_TEXT characters (no `%` formatting), and all constraints of
a space evaluated within CONSTRAINT_BUDGET_S seconds. A field a constraint names is read
from the point, then the base scenario, then the plan's defaults; `plan.dp: auto` reads
as devices / (tp*pp*cp) when the cluster's size is known from the base.
"""

from __future__ import annotations

import ast
import itertools
import math
import operator
import time
from dataclasses import dataclass, field, fields as dc_fields
from pathlib import Path
from typing import Any, Mapping

from . import fields as F
from .errors import InputError
from .plan import Plan
from .scenario import apply_overrides, read_scenario
from .validation.runs import is_published_name
from .yamlio import load_yaml

SPACE_KEYS = ("name", "description", "base", "base_file", "sweep", "constraints")
MAX_POINTS = 10_000_000
MAX_CONSTRAINT_CHARS = 500
MAX_MAGNITUDE = 1e30  # as fields.ABSURD: no count or size of a training plan is larger
MAX_TEXT = 1000
CONSTRAINT_BUDGET_S = 30.0


@dataclass(frozen=True)
class Space:
    """A base scenario mapping, ordered axes (dotted field -> values) and constraints."""

    base: dict
    axes: tuple  # ((field, (values...)), ...)
    constraints: tuple = ()
    name: str = ""
    _compiled: tuple = field(default=(), compare=False, repr=False)

    @property
    def fields(self) -> list[str]:
        return [f for f, _ in self.axes]

    @property
    def size(self) -> int:
        """Points before constraints."""
        return math.prod(len(v) for _, v in self.axes)

    def points(self) -> list[dict]:
        """The points (dotted field -> value) that satisfy every constraint, in product order."""
        names = self.fields
        out = []
        start = time.monotonic()
        for n, combo in enumerate(itertools.product(*(v for _, v in self.axes))):
            point = dict(zip(names, combo))
            if all(_truth(c, point, self.base) for c in self._compiled):
                out.append(point)
            if self._compiled and n % 1024 == 1023 and time.monotonic() - start > CONSTRAINT_BUDGET_S:
                raise InputError("constraints", list(self.constraints), f"evaluating them over the space takes "
                                 f"more than {CONSTRAINT_BUDGET_S:g} s; simplify them or shrink the sweep")
        return out


# ------------------------------------------------------------------ axis values

def _axis_values(name: str, spec: Any) -> tuple:
    where = f"sweep.{name}"
    if isinstance(spec, str) and spec == "auto":
        if name != "plan.dp":
            raise InputError(where, spec, "`auto` is allowed for plan.dp only")
        return ("auto",)
    if isinstance(spec, list):
        values = spec
    elif isinstance(spec, Mapping):
        if len(spec) != 1:
            raise InputError(where, dict(spec), "expected one of {values: [...]}, {range: [start, stop, step]}, "
                             "{pow2: [low, high]}")
        (kind, arg), = spec.items()
        if kind == "values":
            if not isinstance(arg, list):
                raise InputError(where + ".values", arg, "expected a list")
            values = arg
        elif kind == "range":
            values = _range(where + ".range", arg)
        elif kind == "pow2":
            values = _pow2(where + ".pow2", arg)
        else:
            raise InputError(where, kind, "expected values, range or pow2")
    else:
        values = [spec]  # a single value: a fixed override
    if not values:
        raise InputError(where, spec, "expected at least one value")
    values = [v.item() if type(v).__module__ == "numpy" and hasattr(v, "item") else v for v in values]
    for v in values:
        # a list of scalars is one value of a list field (plan.recompute_modules, plan.pipeline_layout)
        items = v if isinstance(v, list) else [v]
        if isinstance(v, dict) or any(isinstance(x, (dict, list)) or (isinstance(x, float) and not math.isfinite(x))
                                      for x in items):
            raise InputError(where, v, "expected numbers, text, true/false or a list of them")
        # an int too large for a float64 cannot even be tabled; the fields' own ceilings are lower
        if isinstance(v, (int, float)) and not isinstance(v, bool) and not abs(v) <= F.ABSURD:
            raise InputError(where, v, f"expected a finite number of magnitude at most {F.ABSURD:g}")
    if len({repr(v) for v in values}) != len(values):
        raise InputError(where, values, "values must be distinct")
    return tuple(values)


def _numbers(where: str, arg, count: tuple) -> list:
    if not isinstance(arg, list) or len(arg) not in count:
        raise InputError(where, arg, f"expected a list of {' or '.join(map(str, count))} numbers")
    for v in arg:
        # abs() first: an int too large for a float has no isfinite
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not abs(v) <= F.ABSURD:
            raise InputError(where, v, f"expected a finite number of magnitude at most {F.ABSURD:g}")
    return arg


def _range(where: str, arg) -> list:
    arg = _numbers(where, arg, (2, 3))
    start, stop = arg[0], arg[1]
    step = arg[2] if len(arg) == 3 else 1
    if step <= 0 or stop <= start:
        raise InputError(where, arg, "expected start < stop and step > 0")
    n = math.ceil((stop - start) / step - 1e-12)
    if n > MAX_POINTS:
        raise InputError(where, arg, f"more than {MAX_POINTS} values")
    if all(isinstance(v, int) for v in (start, stop, step)):
        return list(range(start, stop, step))
    return [start + i * step for i in range(n)]


def _pow2(where: str, arg) -> list:
    low, high = _numbers(where, arg, (2,))
    if low < 1 or high < low or any(int(v) != v or int(v) & (int(v) - 1) for v in (low, high)):
        raise InputError(where, arg, "expected two powers of two, low <= high")
    out, v = [], int(low)
    while v <= high:
        out.append(v)
        v *= 2
    return out


# ------------------------------------------------------------------ constraints

_BINOPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
           ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow}
_CMPOPS = {ast.Eq: operator.eq, ast.NotEq: operator.ne, ast.Lt: operator.lt, ast.LtE: operator.le,
           ast.Gt: operator.gt, ast.GtE: operator.ge, ast.In: lambda a, b: a in b,
           ast.NotIn: lambda a, b: a not in b}
_PLAN_DEFAULTS = {f.name: f.default for f in dc_fields(Plan) if f.name != "offload"}
_PLAN_DEFAULTS.update({"offload.optimizer": "none", "offload.params": "none", "offload.activations": "none"})


def _dotted(node) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        head = _dotted(node.value)
        return None if head is None else f"{head}.{node.attr}"
    return None


def _check(node, text: str) -> None:
    """Refuse anything but the whitelisted expression forms."""
    ok = (ast.Expression, ast.BoolOp, ast.And, ast.Or, ast.UnaryOp, ast.Not, ast.USub, ast.UAdd, ast.BinOp,
          ast.Compare, ast.Constant, ast.Name, ast.Attribute, ast.Load, ast.List, ast.Tuple,
          *_BINOPS, *_CMPOPS)
    for sub in ast.walk(node):
        if not isinstance(sub, ok):
            raise InputError("constraints", text, f"{type(sub).__name__} is not allowed; use fields, numbers, "
                             "text, arithmetic, comparisons, and/or/not, in [...]")
        if isinstance(sub, ast.Attribute) and _dotted(sub) is None:
            raise InputError("constraints", text, "only dotted field names like plan.tp may have attributes")
        if isinstance(sub, ast.Constant) and not isinstance(sub.value, (int, float, str, bool)):
            raise InputError("constraints", text, f"constant {sub.value!r} is not allowed")


def compile_constraint(text: Any):
    """Parse one constraint; raises InputError for syntax or forbidden constructs."""
    if not isinstance(text, str) or not text.strip():
        raise InputError("constraints", text, "expected an expression as text, e.g. plan.tp * plan.pp <= 64")
    if len(text) > MAX_CONSTRAINT_CHARS:
        raise InputError("constraints", text, f"at most {MAX_CONSTRAINT_CHARS} characters")
    try:
        tree = ast.parse(text.strip(), mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        raise InputError("constraints", text, "not a valid expression") from None
    _check(tree, text)
    return (text, tree.body)


def _lookup(name: str, point: Mapping, base: Mapping, text: str):
    if name in ("true", "false"):
        return name == "true"
    if name in point:
        value = point[name]
    else:
        node: Any = base
        for part in name.split("."):
            node = node.get(part) if isinstance(node, Mapping) else None
        value = node
        if value is None and name.startswith("plan."):
            key = name[len("plan."):]
            if key not in _PLAN_DEFAULTS and key != "dp":
                raise InputError("constraints", text, f"unknown field {name}")
            value = _PLAN_DEFAULTS.get(key)
    if name == "plan.dp" and value in (None, "auto"):
        value = _auto_dp(point, base)
    if value is None:
        raise InputError("constraints", text, f"field {name} is not set by the point or the base scenario")
    return value


def _auto_dp(point: Mapping, base: Mapping):
    """devices / (tp*pp*cp) for the point's cluster, or None when that is not computable."""
    from .hardware import cluster_from_dict

    cluster_fields = {k: v for k, v in point.items() if k.startswith("cluster.")}
    try:
        devices = cluster_from_dict(apply_overrides(base, cluster_fields).get("cluster") or {}).devices
    except InputError:
        return None

    def get(name):
        return _lookup(name, point, base, name) if _has(name, point, base) else 1
    return devices // (get("plan.tp") * get("plan.pp") * get("plan.cp"))


def _has(name: str, point: Mapping, base: Mapping) -> bool:
    if name in point:
        return True
    node: Any = base
    for part in name.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return False
        node = node[part]
    return node is not None


def _value(node, point, base, text):
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, (ast.Name, ast.Attribute)):
        return _lookup(_dotted(node), point, base, text)
    if isinstance(node, (ast.List, ast.Tuple)):
        return [_value(e, point, base, text) for e in node.elts]
    if isinstance(node, ast.UnaryOp):
        v = _value(node.operand, point, base, text)
        if isinstance(node.op, ast.Not):
            return not v
        if not _is_number(v):
            raise InputError("constraints", text, f"cannot negate {v!r}: not a number")
        return -v if isinstance(node.op, ast.USub) else +v
    if isinstance(node, ast.BoolOp):
        vals = (_value(v, point, base, text) for v in node.values)
        return all(vals) if isinstance(node.op, ast.And) else any(vals)
    if isinstance(node, ast.BinOp):
        a, b = _value(node.left, point, base, text), _value(node.right, point, base, text)
        return _arithmetic(node.op, a, b, text)
    if isinstance(node, ast.Compare):
        left = _value(node.left, point, base, text)
        for op, comp in zip(node.ops, node.comparators):
            right = _value(comp, point, base, text)
            if isinstance(op, (ast.In, ast.NotIn)) and not isinstance(right, (list, str)):
                raise InputError("constraints", text, f"`in` needs a list or text on its right, got {right!r}")
            try:
                if not _CMPOPS[type(op)](left, right):
                    return False
            except TypeError as exc:
                raise InputError("constraints", text, f"cannot compare: {exc}") from None
            left = right
        return True
    raise InputError("constraints", text, f"unsupported expression {type(node).__name__}")


def _is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _arithmetic(op, a, b, text: str):
    """a op b with its operands and result kept in bounds (checked before computing)."""
    if isinstance(op, ast.Mod) and isinstance(a, str):
        raise InputError("constraints", text, "% on text (formatting) is not allowed")
    if isinstance(op, ast.Mult) and (isinstance(a, (str, list)) or isinstance(b, (str, list))):
        count, seq = (b, a) if isinstance(a, (str, list)) else (a, b)
        if not _is_number(count) or count * len(seq) > MAX_TEXT:
            raise InputError("constraints", text, f"repetition beyond {MAX_TEXT} characters or items")
    if isinstance(op, ast.Pow):
        if not (_is_number(a) and _is_number(b)):
            raise InputError("constraints", text, "** needs numbers")
        if abs(b) > 64:
            raise InputError("constraints", text, "** exponents beyond 64 are not allowed")
        if abs(a) > 1 and b > 0 and b * math.log10(abs(a)) > math.log10(MAX_MAGNITUDE):
            raise InputError("constraints", text, f"** result beyond {MAX_MAGNITUDE:g}")
        if a == 0 and b < 0:
            raise InputError("constraints", text, "cannot compute: 0 to a negative power")
    try:
        out = _BINOPS[type(op)](a, b)
    except (TypeError, ZeroDivisionError, OverflowError, ValueError) as exc:
        raise InputError("constraints", text, f"cannot compute: {exc}") from None
    if _is_number(out) and not (abs(out) <= MAX_MAGNITUDE):
        raise InputError("constraints", text, f"a value beyond {MAX_MAGNITUDE:g}")
    if isinstance(out, complex):
        raise InputError("constraints", text, "cannot compute: a complex number")
    if isinstance(out, (str, list)) and len(out) > MAX_TEXT:
        raise InputError("constraints", text, f"text or lists beyond {MAX_TEXT} characters or items")
    return out


def _truth(compiled, point: Mapping, base: Mapping) -> bool:
    text, node = compiled
    return bool(_value(node, point, base, text))


# ------------------------------------------------------------------ loading

def space_from_dict(data: Any, base_dir: str | Path = ".") -> Space:
    """Validate a space mapping; `base_file` is resolved against `base_dir`."""
    data = F.require_mapping(data, "space")
    F.reject_unknown(data, SPACE_KEYS, "")
    if not isinstance(base_dir, (str, Path)):
        raise InputError("base_dir", base_dir, "expected a folder path")
    if ("base" in data) == ("base_file" in data):
        raise InputError("base", None, "give exactly one of base (a scenario) or base_file (a path)")
    if "base_file" in data:
        ref = data["base_file"]
        if not isinstance(ref, str):
            raise InputError("base_file", ref, "expected a path to a scenario file")
        path = Path(ref) if Path(ref).is_absolute() else Path(base_dir) / ref
        base = read_scenario(ref if is_published_name(ref) and not path.exists() else path)
    else:
        base = dict(F.require_mapping(data["base"], "base"))
    sweep = F.require_mapping(data.get("sweep") or {}, "sweep")
    axes = []
    for name, spec in sweep.items():
        if not isinstance(name, str) or "." not in name:
            raise InputError("sweep", name, "expected a dotted field such as plan.tp")
        apply_overrides(base, {name: 0})  # the path must be settable
        axes.append((name, _axis_values(name, spec)))
    constraints = data.get("constraints") or []
    if isinstance(constraints, str):
        constraints = [constraints]
    if not isinstance(constraints, list):
        raise InputError("constraints", constraints, "expected a list of expressions")
    compiled = tuple(compile_constraint(c) for c in constraints)
    space = Space(base=base, axes=tuple(axes), constraints=tuple(constraints), name=str(data.get("name") or ""),
                  _compiled=compiled)
    if space.size > MAX_POINTS:
        raise InputError("sweep", space.size, f"the product has more than {MAX_POINTS} points")
    return space


def load_space(path: str | Path) -> Space:
    """Read a space YAML file: a path, or the name of a shipped space (`sweeps/gpt3-175b-tp-pp`)."""
    from .resources import resolve_data_file

    path = resolve_data_file(path, "space")
    raw = load_yaml(path, "space")
    if raw is None:
        raise InputError("space", str(path), "the file is empty; expected base or base_file, and sweep")
    return space_from_dict(raw, Path(path).parent)
