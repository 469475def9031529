"""``inputFormat.flattenSpec`` for JSON input: ``root``, ``path`` (JSONPath), ``jq`` and ``tree`` fields.

Each field becomes a list of steps (object keys and array indices) from the record's root,
which the reader turns into a JSONPath for Spark's own ``get_json_object`` (evaluated in the
JVM, no JSON parsing in Python). Supported: JSONPath ``$.a.b``, ``$['a b']``, ``$.a[0]``; jq
``.a.b``, ``."a b"``, ``.["a b"]``, ``.a[0]``; tree ``nodes`` of key names. Refused (by path,
before Spark starts): wildcards, deep scan (``..``), filters, slices, unions, JSONPath
functions (``.length()``, ``.sum()`` ...), negative indices, and every jq construct beyond a
plain path (pipes, ``[]`` iteration, functions such as ``.hello | sum``).

A path that ends at an object or an array gives its JSON text (Druid would give a nested
value, or a multi-value dimension for an array; multi-value dimensions are not supported).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from shuffled.spark.spec.base import JsonObject, SpecError, choice

Step = str | int
FIELD_TYPES = ("root", "path", "jq", "tree")
_JSONPATH_STEP = re.compile(r"""\.([A-Za-z0-9_$@-]+)|\[\s*'((?:[^'\\]|\\.)*)'\s*\]|\[\s*"((?:[^"\\]|\\.)*)"\s*\]|\[\s*([0-9]+)\s*\]""")
_JQ_STEP = re.compile(r"""\.([A-Za-z_][A-Za-z0-9_]*)|\."((?:[^"\\]|\\.)*)"|\.?\[\s*"((?:[^"\\]|\\.)*)"\s*\]|\[\s*([0-9]+)\s*\]""")
_SIMPLE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


@dataclass(frozen=True)
class FlatField:
    """A flattened field: ``name`` and its ``steps`` from the record's root."""

    name: str
    steps: tuple[Step, ...]

    @property
    def json_path(self) -> str:
        """The path for Spark's ``get_json_object``."""
        out = ["$"]
        for s in self.steps:
            out.append(f"[{s}]" if isinstance(s, int) else f".{s}" if _SIMPLE.fullmatch(s) else f"['{s}']")
        return "".join(out)


@dataclass(frozen=True)
class FlattenSpec:
    discover: bool = True
    fields: tuple[FlatField, ...] = ()

    def get(self, name: str) -> FlatField | None:
        for f in self.fields:
            if f.name == name:
                return f
        return None


def _steps(text: Any, pattern: re.Pattern[str], start: str, path: str, kind: str) -> tuple[Step, ...]:
    if not isinstance(text, str) or not text.startswith(start) or text == start.rstrip():
        raise SpecError(path, f"{text!r} is not a supported {kind} path (e.g. "
                        f"{'$.a.b[0]' if kind == 'JSONPath' else '.a.b[0]'})")
    pos = len(start)
    out: list[str | int] = []
    while pos < len(text):
        m = pattern.match(text, pos)
        if m is None:
            raise SpecError(path, f"{kind} {text!r}: {text[pos:]!r} is not supported (only keys and "
                            "array indices; no wildcards, deep scan, filters, slices or functions)")
        key, quoted1, quoted2, index = m.groups()
        if index is not None:
            out.append(int(index))
        else:
            name = key if key is not None else (quoted1 if quoted1 is not None else quoted2)
            if "'" in name or "\\" in name:
                raise SpecError(path, f"{kind} {text!r}: keys with quotes or backslashes are not supported")
            out.append(name)
        pos = m.end()
    return tuple(out)


def parse_flatten(f: JsonObject) -> FlattenSpec:
    discover = f.bool_("useFieldDiscovery", True)
    raw = f.get("fields", [])
    if not isinstance(raw, list):
        raise SpecError(f.at("fields"), "must be a list of fields")
    out: list[FlatField] = []
    for i, item in enumerate(raw):
        path = f"{f.at('fields')}[{i}]"
        if isinstance(item, str):  # a bare name is a root field (legacy shorthand)
            item = {"type": "root", "name": item}
        o = JsonObject(item, path)
        kind = choice(o, "type", FIELD_TYPES, None)
        name = o.str_("name", required=True)
        assert name is not None
        if kind == "root":
            steps: tuple[Step, ...] = (o.str_("expr") or name,)
        elif kind == "tree":
            nodes = o.get("nodes")
            if not isinstance(nodes, list) or not nodes or not all(isinstance(n, str) and n for n in nodes):
                raise SpecError(o.at("nodes"), "must be a non-empty list of field names")
            steps = tuple(nodes)
        elif kind == "path":
            steps = _steps(o.get("expr"), _JSONPATH_STEP, "$", o.at("expr"), "JSONPath")
        else:
            steps = _steps(o.get("expr"), _JQ_STEP, "", o.at("expr"), "jq")
        o.done()
        out.append(FlatField(name, steps))
    names = [x.name for x in out]
    if len(set(names)) != len(names):
        raise SpecError(f.at("fields"), "names a field twice")
    f.done()
    return FlattenSpec(discover, tuple(out))
