"""YAML loading that remembers line numbers, and typed field access that names them.

Every mapping loaded here is a :class:`Node` (a dict) that knows its file and the line
of each key, so validation can say ``model.yaml:12: layers[3].kernel: expected ...``.
"""
from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any, Iterable

import yaml

from .errors import SpecError


class Node(dict):
    """A YAML mapping with its source file, its own line and the line of every key."""

    file: str = "<input>"
    line: int | None = None
    path: str = ""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.lines: dict[str, int] = {}

    def line_of(self, key: str) -> int | None:
        """Line of ``key`` if present, else the mapping's own line."""
        return self.lines.get(key, self.line)

    def where(self, key: str | None = None) -> str:
        """Dotted field path of ``key`` inside the document."""
        if key is None:
            return self.path or "(document)"
        return f"{self.path}.{key}" if self.path else str(key)

    def error(self, key: str | None, expected: str) -> SpecError:
        """A SpecError pointing at ``key`` of this mapping."""
        return SpecError(self.file, self.line_of(key) if key else self.line, self.where(key), expected)


class NodeList(list):
    """A YAML sequence with its file, line, dotted path and the line of each item."""

    file: str = "<input>"
    line: int | None = None
    path: str = ""

    def __init__(self, *a):
        super().__init__(*a)
        self.lines: list[int] = []


class _Loader(yaml.SafeLoader):
    pass


# YAML 1.1 (PyYAML) wants a dot in a float, so `12e9` would load as a string; people write
# bandwidths and clocks that way (and YAML 1.2 reads them as floats), so this loader does too.
_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
    list("-+0123456789"))


def _construct_mapping(loader: _Loader, node: yaml.MappingNode) -> Node:
    out = Node()
    out.line = node.start_mark.line + 1
    loader.flatten_mapping(node)
    for key_node, value_node in node.value:
        key = loader.construct_object(key_node, deep=True)
        if not isinstance(key, (str, int, float, bool)):
            raise SpecError(loader.name, key_node.start_mark.line + 1, None, "mapping keys must be plain scalars")
        key = str(key)
        if key in out:
            raise SpecError(loader.name, key_node.start_mark.line + 1, key, "duplicate key")
        out[key] = loader.construct_object(value_node, deep=True)
        out.lines[key] = key_node.start_mark.line + 1
    return out


def _construct_sequence(loader: _Loader, node: yaml.SequenceNode) -> NodeList:
    out = NodeList(loader.construct_object(v, deep=True) for v in node.value)
    out.line = node.start_mark.line + 1
    out.lines = [v.start_mark.line + 1 for v in node.value]
    return out


_Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)
_Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_SEQUENCE_TAG, _construct_sequence)


def _annotate(obj: Any, file: str, path: str) -> None:
    """Give every nested Node/NodeList its file and dotted path."""
    if isinstance(obj, Node):
        obj.file, obj.path = file, path
        for k, v in obj.items():
            _annotate(v, file, f"{path}.{k}" if path else k)
    elif isinstance(obj, NodeList):
        obj.file, obj.path = file, path
        for i, v in enumerate(obj):
            _annotate(v, file, f"{path}[{i}]")


#: most values a document may hold once its aliases are expanded: a few hundred bytes of
#: nested aliases (a "billion laughs" bomb) would otherwise expand to 10**9 values and hang
#: every walk over the tree; real models, clusters and plans hold far fewer
MAX_EXPANDED_NODES = 1_000_000


def expanded_size(node: yaml.Node, memo: dict[int, int] | None = None) -> int:
    """Values in the composed ``node`` once every alias is expanded (linear time: memoised)."""
    memo = {} if memo is None else memo
    key = id(node)
    if key in memo:
        return memo[key]
    memo[key] = 1  # a recursive alias counts once here; the constructor rejects cycles later
    if isinstance(node, yaml.MappingNode):
        n = 1 + sum(expanded_size(k, memo) + expanded_size(v, memo) for k, v in node.value)
    elif isinstance(node, yaml.SequenceNode):
        n = 1 + sum(expanded_size(v, memo) for v in node.value)
    else:
        n = 1
    memo[key] = min(n, MAX_EXPANDED_NODES + 1)  # capped so the sums stay small integers
    return memo[key]


def loads(text: str, file: str = "<input>") -> Any:
    """Parse YAML text into Node/NodeList trees; syntax errors become SpecError.

    Aliases are allowed, but a document that expands to more than MAX_EXPANDED_NODES values
    is refused before it is built (an alias bomb).
    """
    try:
        loader = _Loader(text)
        loader.name = file
        try:
            root = loader.get_single_node()
            if root is not None and expanded_size(root) > MAX_EXPANDED_NODES:
                raise SpecError(file, root.start_mark.line + 1, None,
                                f"expected at most {MAX_EXPANDED_NODES:,} values once aliases are expanded "
                                "(the document's anchors and aliases nest too deeply)")
            data = loader.construct_document(root) if root is not None else None
        finally:
            loader.dispose()
    except SpecError:
        raise
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        line = mark.line + 1 if mark else None
        raise SpecError(file, line, None, f"malformed YAML: {e.problem or e.context}") from None
    except (yaml.YAMLError, ValueError, TypeError, RecursionError) as e:
        raise SpecError(file, None, None, f"malformed YAML: {type(e).__name__}") from None
    _annotate(data, file, "")
    return data


def load_file(path: str | Path) -> Any:
    """Read and parse a YAML file; a missing or unreadable file is a SpecError."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise SpecError(str(path), None, None, "file not found") from None
    except (OSError, UnicodeDecodeError) as e:
        raise SpecError(str(path), None, None, f"cannot read file ({type(e).__name__})") from None
    return loads(text, str(path))


def as_mapping(obj: Any, file: str, path: str, line: int | None) -> Node:
    """Require a mapping at ``path``."""
    if not isinstance(obj, Node):
        raise SpecError(file, line, path or None, f"expected a mapping, got {_kind(obj)}")
    return obj


def _kind(v: Any) -> str:
    if v is None:
        return "nothing"
    if isinstance(v, bool):
        return "a boolean"
    if isinstance(v, (int, float)):
        return f"the number {v!r}"
    if isinstance(v, str):
        return f"the string {v!r}"[:60]
    if isinstance(v, list):
        return "a list"
    if isinstance(v, dict):
        return "a mapping"
    return type(v).__name__


class Fields:
    """Typed, line-aware reads of one mapping; ``done()`` rejects unknown keys."""

    def __init__(self, node: Node, what: str = ""):
        self.node = node
        self.seen: set[str] = set()
        self.what = what

    def err(self, key: str | None, expected: str) -> SpecError:
        """An error at ``key`` of this mapping."""
        return self.node.error(key, expected)

    def has(self, key: str) -> bool:
        """Whether the key is present (and marks it seen)."""
        self.seen.add(key)
        return key in self.node

    def raw(self, key: str, default: Any = ..., required: bool = True) -> Any:
        """The raw value; missing and required is an error."""
        self.seen.add(key)
        if key not in self.node:
            if default is not ...:
                return default
            raise self.err(None, f"missing field '{key}'" + (f" ({self.what})" if self.what else ""))
        return self.node[key]

    def str(self, key: str, default: Any = ..., choices: Iterable[str] | None = None) -> str:
        """A non-empty string, optionally from a set of choices."""
        v = self.raw(key, default)
        if v is default and default is not ...:
            return v
        if not isinstance(v, str) or not v.strip():
            raise self.err(key, f"expected a non-empty string, got {_kind(v)}")
        if choices is not None:
            ch = list(choices)
            if v not in ch:
                raise self.err(key, f"expected one of {', '.join(ch)}; got {v!r}")
        return v

    def int(self, key: str, default: Any = ..., min: int | None = 1) -> int:
        """An integer (not a bool), at least ``min``."""
        v = self.raw(key, default)
        if v is default and default is not ...:
            return v
        if isinstance(v, bool) or not isinstance(v, int):
            raise self.err(key, f"expected an integer, got {_kind(v)}")
        if min is not None and v < min:
            raise self.err(key, f"expected an integer >= {min}, got {v}")
        return v

    def num(self, key: str, default: Any = ..., positive: bool = True, min: float | None = None) -> float:
        """A finite number; positive unless told otherwise."""
        v = self.raw(key, default)
        if v is default and default is not ...:
            return v
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            raise self.err(key, f"expected a finite number, got {_kind(v)}")
        if positive and v <= 0:
            raise self.err(key, f"expected a number > 0, got {v}")
        if min is not None and v < min:
            raise self.err(key, f"expected a number >= {min}, got {v}")
        return float(v)

    def bool(self, key: str, default: Any = ...) -> bool:
        """A boolean."""
        v = self.raw(key, default)
        if not isinstance(v, bool):
            raise self.err(key, f"expected true or false, got {_kind(v)}")
        return v

    def ints(self, key: str, default: Any = ..., length: int | None = None, min: int = 1) -> tuple[int, ...]:
        """A list of integers >= ``min`` (optionally of a given length)."""
        v = self.raw(key, default)
        if v is default and default is not ...:
            return v
        if isinstance(v, int) and not isinstance(v, bool) and length in (None, 1):
            v = [v]
        if not isinstance(v, list) or not v:
            raise self.err(key, f"expected a non-empty list of integers, got {_kind(v)}")
        for x in v:
            if isinstance(x, bool) or not isinstance(x, int) or x < min:
                raise self.err(key, f"expected integers >= {min}, got {_kind(x)}")
        if length is not None and len(v) != length:
            raise self.err(key, f"expected {length} integers, got {len(v)}")
        return tuple(v)

    def mapping(self, key: str, default: Any = ...) -> Node:
        """A nested mapping."""
        v = self.raw(key, default)
        if v is default and default is not ...:
            return v
        if not isinstance(v, Node):
            raise self.err(key, f"expected a mapping, got {_kind(v)}")
        return v

    def list(self, key: str, default: Any = ..., nonempty: bool = True) -> NodeList:
        """A nested list."""
        v = self.raw(key, default)
        if v is default and default is not ...:
            return v
        if not isinstance(v, list):
            raise self.err(key, f"expected a list, got {_kind(v)}")
        if nonempty and not v:
            raise self.err(key, "expected a non-empty list")
        return v

    def done(self, allowed_extra: Iterable[str] = ()) -> None:
        """Reject keys nobody read."""
        extra = [k for k in self.node if k not in self.seen and k not in set(allowed_extra)]
        if extra:
            k = extra[0]
            known = sorted(self.seen | set(allowed_extra))
            raise self.err(k, f"unknown field '{k}'; expected one of {', '.join(known)}")
