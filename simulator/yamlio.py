"""Safe YAML and JSON reading: no object construction, clear one-line errors.

YAML is read with YAML 1.2 core-schema scalars, not PyYAML's YAML 1.1 defaults: numbers are
decimal (`010` is 10, never octal 8; `1:04` is text, never base-60 64; `1e9` is a float;
`1_000` is text), booleans are true/false only (`no` and `on` are text), dates are text.
A mapping may not repeat a key, and aliases may not expand a document beyond
MAX_EXPANDED_NODES nodes ("billion laughs"). Only regular files up to MAX_FILE_BYTES are
read (never /dev/zero or a pipe).
"""

from __future__ import annotations

import json
import os
import re
import stat
from pathlib import Path
from typing import Any

import yaml

from .errors import InputError

MAX_FILE_BYTES = 16 * 2**20
# Scenarios, spaces and profiles have hundreds of nodes; the published supplement a few thousand.
MAX_EXPANDED_NODES = 100_000

_INT = re.compile(r"^[-+]?[0-9]+$")
_FLOAT = re.compile(r"^(?:[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?"
                    r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$")
_BOOL = re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$")
_NULL = re.compile(r"^(?:~|null|Null|NULL|)$")
_REPLACED = {"tag:yaml.org,2002:merge", "tag:yaml.org,2002:bool", "tag:yaml.org,2002:int", "tag:yaml.org,2002:float",
             "tag:yaml.org,2002:null", "tag:yaml.org,2002:timestamp"}


class _Refused(Exception):
    """A document the loader refuses: (problem, line)."""


class _Loader(yaml.SafeLoader):
    """SafeLoader with YAML 1.2 core scalars, no duplicate keys and no YAML 1.1 merge keys (`<<`)."""


_Loader.yaml_implicit_resolvers = {
    first: [(tag, rx) for tag, rx in resolvers if tag not in _REPLACED]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()}
_Loader.add_implicit_resolver("tag:yaml.org,2002:bool", _BOOL, list("tTfF"))
_Loader.add_implicit_resolver("tag:yaml.org,2002:int", _INT, list("-+0123456789"))
_Loader.add_implicit_resolver("tag:yaml.org,2002:float", _FLOAT, list("-+0123456789."))
_Loader.add_implicit_resolver("tag:yaml.org,2002:null", _NULL, ["~", "n", "N", ""])


def _construct_int(loader, node):
    text = loader.construct_scalar(node)
    if not _INT.match(text):
        raise _Refused(f"{text!r} is not a decimal integer", node.start_mark.line + 1)
    return int(text)


def _construct_float(loader, node):
    text = loader.construct_scalar(node)
    if not (_FLOAT.match(text) or _INT.match(text)):
        raise _Refused(f"{text!r} is not a decimal number", node.start_mark.line + 1)
    low = text.lower()
    if low.endswith(".inf"):
        return float("-inf") if low.startswith("-") else float("inf")
    return float("nan") if low == ".nan" else float(text)


def _construct_bool(loader, node):
    text = loader.construct_scalar(node)
    if not _BOOL.match(text):
        raise _Refused(f"{text!r} is not true or false", node.start_mark.line + 1)
    return text.lower() == "true"


def _construct_mapping(loader, node, deep=False):
    loader.flatten_mapping(node)
    seen = {}
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        try:
            hash(key)
        except TypeError:
            raise _Refused("a mapping key must be a scalar", key_node.start_mark.line + 1) from None
        if key in seen:
            raise _Refused(f"duplicate key {key!r} (first at line {seen[key]})", key_node.start_mark.line + 1)
        seen[key] = key_node.start_mark.line + 1
    return yaml.SafeLoader.construct_mapping(loader, node, deep=deep)


def _construct_yaml_map(loader, node):
    data = {}
    yield data
    data.update(_construct_mapping(loader, node))


_Loader.add_constructor("tag:yaml.org,2002:int", _construct_int)
_Loader.add_constructor("tag:yaml.org,2002:float", _construct_float)
_Loader.add_constructor("tag:yaml.org,2002:bool", _construct_bool)
_Loader.add_constructor("tag:yaml.org,2002:map", _construct_yaml_map)


def _expanded_size(root) -> int:
    """Nodes of the document with every alias expanded; raises _Refused past the budget or on a
    recursive alias. Memoised on the node graph, so it costs one pass over the composed nodes."""
    sizes: dict[int, int] = {}
    active: set[int] = set()

    def size(node) -> int:
        key = id(node)
        if key in sizes:
            return sizes[key]
        if key in active:
            raise _Refused("a recursive alias", node.start_mark.line + 1)
        active.add(key)
        total = 1
        if isinstance(node, yaml.SequenceNode):
            total += sum(size(child) for child in node.value)
        elif isinstance(node, yaml.MappingNode):
            total += sum(size(k) + size(v) for k, v in node.value)
        active.discard(key)
        if total > MAX_EXPANDED_NODES:
            raise _Refused(f"aliases expand to more than {MAX_EXPANDED_NODES:,} nodes", node.start_mark.line + 1)
        sizes[key] = total
        return total

    return size(root)


def parse_yaml(raw: str, where: str) -> Any:
    """One YAML document as plain Python data; InputError (one line, naming `where`) otherwise."""
    loader = None
    try:
        loader = _Loader(raw)
        node = loader.get_single_node()
        if node is None:
            return None
        _expanded_size(node)
        return loader.construct_document(node)
    except _Refused as exc:
        problem, line = exc.args
        raise InputError(where, f"line {line}", f"refused: {problem}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or exc.__class__.__name__
        raise InputError(where, f"invalid YAML{at}", f"expected valid YAML ({problem})") from None
    except RecursionError:
        raise InputError(where, "nesting", "the document is nested too deeply") from None
    finally:
        if loader is not None:
            loader.dispose()


def read_text(path: str | Path, field: str = "file", max_bytes: int = MAX_FILE_BYTES) -> str:
    """The UTF-8 text of a regular file of at most `max_bytes`; InputError for anything else
    (missing, a directory, a device or pipe, too large, not UTF-8)."""
    path = Path(path)
    try:
        info = os.stat(path)
    except FileNotFoundError:
        raise InputError(field, str(path), "file not found") from None
    except (OSError, ValueError) as exc:
        raise InputError(field, str(path), f"cannot read it ({exc.__class__.__name__})") from None
    if stat.S_ISDIR(info.st_mode):
        raise InputError(field, str(path), "expected a file, got a directory")
    if not stat.S_ISREG(info.st_mode):
        raise InputError(field, str(path), "expected a regular file (not a device, pipe or socket)")
    if info.st_size > max_bytes:
        raise InputError(field, str(path), f"the file has {info.st_size:,} bytes; at most {max_bytes:,} are read")
    try:
        with open(path, "rb") as fh:
            data = fh.read(max_bytes + 1)
    except OSError as exc:
        raise InputError(field, str(path), f"cannot read it ({exc.__class__.__name__})") from None
    if len(data) > max_bytes:
        raise InputError(field, str(path), f"the file has more than {max_bytes:,} bytes")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise InputError(field, str(path), "expected a UTF-8 text file") from None


def load_yaml(path: str | Path, field: str = "file") -> Any:
    """Parse a YAML file (see the module docstring for what is refused)."""
    return parse_yaml(read_text(path, field), f"{field} {path}")


def _no_duplicates(pairs):
    out = {}
    for key, value in pairs:
        if key in out:
            raise _Refused(f"duplicate key {key!r}", 0)
        out[key] = value
    return out


def _no_constant(name):
    raise _Refused(f"{name} is not a JSON number", 0)


def parse_json(raw: str, where: str) -> Any:
    """One JSON document; duplicate keys and NaN/Infinity are refused."""
    try:
        return json.loads(raw, object_pairs_hook=_no_duplicates, parse_constant=_no_constant)
    except _Refused as exc:
        raise InputError(where, "JSON", f"refused: {exc.args[0]}") from None
    except json.JSONDecodeError as exc:
        raise InputError(where, f"invalid JSON at line {exc.lineno}, column {exc.colno}",
                         f"expected valid JSON ({exc.msg})") from None
    except RecursionError:
        raise InputError(where, "nesting", "the document is nested too deeply") from None


def load_json(path: str | Path, field: str = "file") -> Any:
    """Parse a JSON file (a regular file; duplicate keys refused)."""
    return parse_json(read_text(path, field), f"{field} {path}")


def parse_scalar(text: str):
    """A command-line value typed as a YAML 1.2 core scalar: true/false, a decimal integer, a
    float (1e9 too), null (empty text or `null`), else the text itself."""
    stripped = text.strip()
    if _BOOL.match(stripped):
        return stripped.lower() == "true"
    if _INT.match(stripped):
        return int(stripped)
    if _FLOAT.match(stripped) and stripped:
        low = stripped.lower()
        if low.endswith(".inf"):
            return float("-inf") if low.startswith("-") else float("inf")
        return float("nan") if low == ".nan" else float(stripped)
    if stripped in ("~", "null", "Null", "NULL"):
        return None
    return text
