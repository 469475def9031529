"""openapi.yaml as data, the small JSON Schema validator (beside ``jsonschema`` when
importable), and :class:`Checker`, which holds each answer of a daemon to the operation of
openapi.yaml it hit."""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml
from aiohttp.test_utils import TestClient

SPEC: dict[str, Any] = yaml.safe_load(
    (Path(__file__).resolve().parents[2] / "openapi.yaml").read_text())
ROUTE_PARAMS = {"sup": "supervisorTaskId", "sub": "subTaskId"}


def resolve(node: Any) -> Any:
    """Follow local ``$ref``s (``#/components/...``) until a node without one."""
    while isinstance(node, dict) and "$ref" in node:
        ref = node["$ref"]
        assert ref.startswith("#/"), ref
        target: Any = SPEC
        for part in ref[2:].split("/"):
            target = target[part]
        node = target
    return node


def url(template: str, sup: str = "sup", sub: str = "s1") -> str:
    return template.replace("{supervisorTaskId}", sup).replace("{subTaskId}", sub)


ANNOTATIONS = {"description", "examples", "format", "title", "contentMediaType"}


MINI_KEYWORDS = {"$ref", "allOf", "type", "const", "enum", "pattern", "minimum", "maximum",
                 "required", "properties", "additionalProperties", "items"}


TYPES: dict[str, Callable[[Any], bool]] = {
    "object": lambda v: isinstance(v, dict),
    "array": lambda v: isinstance(v, list),
    "string": lambda v: isinstance(v, str),
    "boolean": lambda v: isinstance(v, bool),
    "null": lambda v: v is None,
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
}


def mini_errors(schema: dict[str, Any], value: Any, where: str = "$") -> list[str]:
    """The subset of JSON Schema 2020-12 openapi.yaml uses; unknown keywords are an error."""
    unknown = set(schema) - MINI_KEYWORDS - ANNOTATIONS
    if unknown:
        return [f"{where}: validator does not implement {sorted(unknown)}"]
    errors: list[str] = []
    if "$ref" in schema:
        errors += mini_errors(resolve({"$ref": schema["$ref"]}), value, where)
    for sub in schema.get("allOf", ()):
        errors += mini_errors(sub, value, where)
    if "type" in schema:
        types = schema["type"] if isinstance(schema["type"], list) else [schema["type"]]
        if not any(TYPES[t](value) for t in types):
            return errors + [f"{where}: {value!r} is not of type {types}"]
    if "const" in schema and (value != schema["const"]
                              or type(value) is not type(schema["const"])):
        errors.append(f"{where}: {value!r} is not {schema['const']!r}")
    if "enum" in schema and value not in schema["enum"]:
        errors.append(f"{where}: {value!r} is not one of {schema['enum']}")
    if isinstance(value, str) and "pattern" in schema and not re.search(schema["pattern"], value):
        errors.append(f"{where}: {value!r} does not match {schema['pattern']}")
    if TYPES["number"](value):
        if "minimum" in schema and value < schema["minimum"]:
            errors.append(f"{where}: {value} < {schema['minimum']}")
        if "maximum" in schema and value > schema["maximum"]:
            errors.append(f"{where}: {value} > {schema['maximum']}")
    if isinstance(value, dict):
        errors += [f"{where}: missing {k!r}" for k in schema.get("required", ()) if k not in value]
        props = schema.get("properties", {})
        extra = schema.get("additionalProperties", True)
        for key, item in value.items():
            if key in props:
                errors += mini_errors(props[key], item, f"{where}.{key}")
            elif extra is False:
                errors.append(f"{where}: undocumented property {key!r}")
            elif isinstance(extra, dict):
                errors += mini_errors(extra, item, f"{where}.{key}")
    if isinstance(value, list) and "items" in schema:
        for i, item in enumerate(value):
            errors += mini_errors(schema["items"], item, f"{where}[{i}]")
    return errors


def _absolute_refs(node: Any) -> Any:
    if isinstance(node, dict):
        return {k: ("urn:openapi" + v if k == "$ref" and v.startswith("#") else _absolute_refs(v))
                for k, v in node.items()}
    if isinstance(node, list):
        return [_absolute_refs(v) for v in node]
    return node


def jsonschema_errors(schema: dict[str, Any], value: Any) -> list[str] | None:
    """jsonschema's verdict (None when it is not installed); refs resolve into the spec."""
    try:
        from jsonschema import Draft202012Validator
        from referencing import Registry, Resource
        from referencing.jsonschema import DRAFT202012
    except ImportError:
        return None
    registry = Registry().with_resource("urn:openapi", Resource(SPEC, DRAFT202012))
    validator = Draft202012Validator(_absolute_refs(schema), registry=registry)
    return [f"{'/'.join(map(str, e.absolute_path)) or '$'}: {e.message}"
            for e in validator.iter_errors(value)]


def schema_errors(schema: dict[str, Any], value: Any) -> list[str]:
    errors = mini_errors(schema, value)
    full = jsonschema_errors(schema, value)
    if full is not None:
        assert bool(full) == bool(errors), f"validators disagree: {full} vs {errors}"
        errors += full
    return errors


class Checker:
    """Checks each answer against its operation in openapi.yaml; remembers the statuses."""

    def __init__(self, client: TestClient) -> None:
        self.client = client
        self.seen: dict[tuple[str, str], set[int]] = defaultdict(set)

    async def __call__(self, method: str, template: str, *, sup: str = "sup", sub: str = "s1",
                       expect: int | None = None, **kwargs: Any) -> tuple[Any, Any]:
        resp = await self.client.request(method, url(template, sup, sub), **kwargs)
        body = await resp.read()
        where = f"{method} {template} -> {resp.status}"
        if expect is not None:
            assert resp.status == expect, f"{where}: expected {expect}: {body[:300]!r}"
        op = SPEC["paths"][template][method.lower()]
        assert str(resp.status) in op["responses"], f"{where}: status not documented"
        documented = resolve(op["responses"][str(resp.status)])
        for name, header in documented.get("headers", {}).items():
            header = resolve(header)
            value = resp.headers.get(name)
            if value is None:
                assert not header.get("required"), f"{where}: required header {name} missing"
                continue
            if resolve(header["schema"]).get("type") == "integer":
                assert value.isdigit(), f"{where}: header {name}: {value!r} is not an integer"
                value = int(value)
            errors = schema_errors(header["schema"], value)
            assert not errors, f"{where}: header {name}: {errors}"
        content = documented.get("content")
        parsed: Any = body
        if method == "HEAD" or not content:
            assert body == b"", f"{where}: body where none is documented"
        else:
            assert resp.content_type in content, f"{where}: undocumented type {resp.content_type}"
            if resp.content_type == "application/json":
                parsed = await resp.json()
                errors = schema_errors(content["application/json"]["schema"], parsed)
                assert not errors, f"{where}: {errors}\n{parsed}"
        self.seen[(method, template)].add(resp.status)
        return resp, parsed

    def assert_seen(self, expected: dict[tuple[str, str], set[int]]) -> None:
        for op, statuses in expected.items():
            assert statuses <= self.seen[op], f"{op}: saw {self.seen[op]}, want {statuses}"
