"""transformSpec parsing (no Spark): the expression grammar, and refusals by JSON path."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from shuffled.spark import SpecError, parse_spec
from shuffled.spark.spec.expr import Binary, Call, Ident, Lit, Unary, parse_expr

ROOT = Path(__file__).resolve().parents[3]
TUTORIAL = json.loads((ROOT / "tests/data/druid/transform/transform-index.json").read_text())
TS = "$.spec.dataSchema.transformSpec"


def with_transform(transforms: list[dict[str, Any]] | None = None, flt: Any = None) -> dict[str, Any]:
    spec = copy.deepcopy(TUTORIAL)
    ts = spec["spec"]["dataSchema"]["transformSpec"]
    if transforms is not None:
        ts["transforms"] = transforms
    if flt is not None:
        ts["filter"] = flt
    return spec


def test_tutorial_reads_the_fields_the_transforms_and_filter_need() -> None:
    s = parse_spec(TUTORIAL)
    assert [t.name for t in s.transform.transforms] == ["animal", "triple-number"]
    # triple-number is produced by a transform; animal is produced but also read by one.
    assert s.input_fields == ("timestamp", "animal", "location", "number")


@pytest.mark.parametrize("text,tree", [
    ("1 + 2 * 3", Binary("+", Lit(1), Binary("*", Lit(2), Lit(3)))),
    ("2 ^ 3 ^ 2", Binary("^", Lit(2), Binary("^", Lit(3), Lit(2)))),
    ("-2 ^ 2", Binary("^", Lit(-2), Lit(2))),
    ("-x ^ 2", Binary("^", Unary("-", Ident("x")), Lit(2))),
    ("a || b && c", Binary("&&", Binary("||", Ident("a"), Ident("b")), Ident("c"))),
    ("!a == b", Binary("==", Unary("!", Ident("a")), Ident("b"))),
    ("a < b == c", Binary("==", Binary("<", Ident("a"), Ident("b")), Ident("c"))),
    ('"triple-number" * 1.5e1', Binary("*", Ident("triple-number"), Lit(15.0))),
    ("concat('it\\'s', \"a\\\"b\", null)", Call("concat", (Lit("it's"), Ident('a"b'), Lit(None)))),
    ("if(x, 'y', 'z')", Call("if", (Ident("x"), Lit("y"), Lit("z")))),
    ("(1 - 2) - 3", Binary("-", Binary("-", Lit(1), Lit(2)), Lit(3))),
])
def test_grammar(text: str, tree: Any) -> None:
    assert parse_expr(text, "$") == tree


@pytest.mark.parametrize("expression,message", [
    ("array_length(x)", "function 'array_length' is not supported"),
    ("json_value(x, '$.a')", "function 'json_value' is not supported"),
    ("concat()", "takes 1 to any arguments"),
    ("substring(x, 1)", "takes 3 arguments"),
    ("like(x, y)", "argument 2 of 'like' must be a literal"),
    ("cast(x, 'ARRAY<LONG>')", "cast to 'ARRAY<LONG>' is not supported"),
    ("timestamp_floor(__time, 'PT1H30M')", "compound"),
    ("timestamp_floor(__time, 'P1D', null, 'America/New_York')", "only UTC"),
    ("timestamp_floor(__time, 'P1M', 1000)", "origin"),
    ("timestamp_parse(x, 'xxxx-ww')", "pattern letter 'x'"),
    ("timestamp_format(__time, 'YYYY')", "pattern letter 'Y'"),
    ("regexp_extract(x, '(a', 0)", "bad regular expression"),
    ("regexp_extract(x, '(a)', 2)", "group 2"),
    ("[1, 2]", "array literals are not supported"),
    ("1 +", "unexpected the end"),
    ("a b", "unexpected 'b'"),
    ("x # y", "cannot parse expression"),
])
def test_unsupported_expressions_are_refused_by_path(expression: str, message: str) -> None:
    spec = with_transform([{"type": "expression", "name": "out", "expression": expression}])
    with pytest.raises(SpecError) as info:
        parse_spec(spec)
    assert info.value.path == f"{TS}.transforms[0].expression"
    assert message in str(info.value)


@pytest.mark.parametrize("flt,where,message", [
    ({"type": "spatial", "dimension": "x"}, f"{TS}.filter.type", "'spatial' is not supported"),
    ({"type": "search", "dimension": "x", "query": {}}, f"{TS}.filter.type", "'search'"),
    ({"type": "javascript", "dimension": "x", "function": ""}, f"{TS}.filter.type", "'javascript'"),
    ({"type": "not", "field": {"type": "columnComparison", "dimensions": []}},
     f"{TS}.filter.field.type", "'columnComparison'"),
    ({"type": "and", "fields": [{"type": "true"}, {"type": "selector", "dimension": "a", "value": "b",
                                                    "extractionFn": {"type": "upper"}}]},
     f"{TS}.filter.fields[1].extractionFn", "is not supported"),
    ({"type": "bound", "dimension": "a", "ordering": "alphanumeric"}, f"{TS}.filter.ordering", "alphanumeric"),
    ({"type": "bound", "dimension": "a", "lower": "x", "ordering": "numeric"}, f"{TS}.filter.lower", "not a number"),
    ({"type": "range", "column": "a", "matchValueType": "ARRAY<LONG>"}, f"{TS}.filter.matchValueType", "ARRAY"),
    ({"type": "equality", "column": "a", "matchValueType": "STRING"}, f"{TS}.filter.matchValue", "required"),
    ({"type": "regex", "dimension": "a", "pattern": "("}, f"{TS}.filter.pattern", "bad regular expression"),
    ({"type": "interval", "dimension": "__time", "intervals": ["2018/2017"]}, f"{TS}.filter.intervals[0]", ""),
    ({"type": "selector", "dimension": "a", "value": "b", "surprise": 1}, f"{TS}.filter.surprise", "not a supported"),
    ({"type": "expression", "expression": "lookup(a, 'x')"}, f"{TS}.filter.expression", "'lookup'"),
])
def test_unsupported_filters_are_refused_by_path(flt: dict[str, Any], where: str, message: str) -> None:
    with pytest.raises(SpecError) as info:
        parse_spec(with_transform(flt=flt))
    assert info.value.path == where
    assert message in str(info.value)


def test_transform_names() -> None:
    bad = with_transform([{"type": "expression", "name": "__hidden", "expression": "1"}])
    with pytest.raises(SpecError, match="only __time"):
        parse_spec(bad)
    twice = with_transform([{"type": "expression", "name": "a", "expression": "1"}] * 2)
    with pytest.raises(SpecError, match="twice"):
        parse_spec(twice)
    ok = parse_spec(with_transform([{"type": "expression", "name": "__time",
                                     "expression": "timestamp_floor(__time, 'P1D')"}]))
    assert ok.transform.transforms[0].name == "__time"
    assert "__time" not in ok.input_fields


FLAT = "$.spec.ioConfig.inputFormat.flattenSpec"


def with_flatten(flatten: dict[str, Any], kind: str = "json") -> dict[str, Any]:
    spec = copy.deepcopy(TUTORIAL)
    spec["spec"]["ioConfig"]["inputFormat"] = {"type": kind, "flattenSpec": flatten}
    return spec


@pytest.mark.parametrize("field,where,message", [
    ({"type": "path", "name": "a", "expr": "$..a"}, "fields[0].expr", "deep scan"),
    ({"type": "path", "name": "a", "expr": "$.a[*]"}, "fields[0].expr", "wildcards"),
    ({"type": "path", "name": "a", "expr": "$.a[?(@.b > 1)]"}, "fields[0].expr", "filters"),
    ({"type": "path", "name": "a", "expr": "$.hello.length()"}, "fields[0].expr", "functions"),
    ({"type": "path", "name": "a", "expr": "$.a[0:2]"}, "fields[0].expr", "slices"),
    ({"type": "path", "name": "a", "expr": "$.a[-1]"}, "fields[0].expr", "not supported"),
    ({"type": "path", "name": "a", "expr": "a.b"}, "fields[0].expr", "not a supported JSONPath"),
    ({"type": "jq", "name": "a", "expr": ".hello | sum"}, "fields[0].expr", "not supported"),
    ({"type": "jq", "name": "a", "expr": ".a[]"}, "fields[0].expr", "not supported"),
    ({"type": "jq", "name": "a", "expr": "."}, "fields[0].expr", "not supported"),
    ({"type": "tree", "name": "a", "nodes": ["a", 1]}, "fields[0].nodes", "field names"),
    ({"type": "nested", "name": "a", "expr": "$.a"}, "fields[0].type", "'nested' is not supported"),
])
def test_unsupported_flatten_fields_are_refused_by_path(field: dict[str, Any], where: str, message: str) -> None:
    with pytest.raises(SpecError) as info:
        parse_spec(with_flatten({"fields": [field]}))
    assert info.value.path == f"{FLAT}.{where}"
    assert message in str(info.value)


def test_flatten_paths_and_formats() -> None:
    s = parse_spec(with_flatten({"useFieldDiscovery": False, "fields": [
        "animal", {"type": "path", "name": "n", "expr": "$['a b'][2].c"},
        {"type": "jq", "name": "j", "expr": '.x."y z"[0]'}, {"type": "tree", "name": "t", "nodes": ["p", "q"]}]}))
    flat = s.input_format.flatten
    assert not flat.discover
    assert [(f.name, f.steps, f.json_path) for f in flat.fields] == [
        ("animal", ("animal",), "$.animal"), ("n", ("a b", 2, "c"), "$['a b'][2].c"),
        ("j", ("x", "y z", 0), "$.x['y z'][0]"), ("t", ("p", "q"), "$.p.q")]
    with pytest.raises(SpecError, match="json input only") as info:
        parse_spec(with_flatten({"fields": ["a"]}, kind="parquet"))
    assert info.value.path == FLAT
    parse_spec(with_flatten({"useFieldDiscovery": True}, kind="parquet"))
