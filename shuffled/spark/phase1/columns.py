"""What both of phase 1's readers agree on before reading a row: the names of the
phase-1 row's metric columns, and which JSON fields may hold multi-value arrays. Pure
functions of the spec (no Spark, no Arrow): the JVM side (:mod:`.jvm`) and the native side
(:mod:`.native`) both import them from here."""

from __future__ import annotations

from shuffled.spark.spec.model import IngestSpec


def metric_column(i: int) -> str:
    """Name of the phase-1 input column of metric ``i``."""
    return f"__m{i}"


def metric_time_column(i: int) -> str:
    """Name of the phase-1 time input column of first/last metric ``i``."""
    return f"__mt{i}"


def json_fields(spec: IngestSpec) -> set[str]:
    """JSON input fields that may be multi-value: string dimensions read straight from the
    input (no transform produces them, and nothing else reads the field as text)."""
    if spec.input_format.type != "json":
        return set()
    produced = {t.name for t in spec.transform.transforms}
    others = set(spec.transform.reads) | {m.field for m in spec.metrics if m.field}
    flat = spec.input_format.flatten
    out = set()
    for d in spec.dimensions:
        found = flat.get(d.name)
        root = found is None or (len(found.steps) == 1 and found.steps[0] == d.name)
        if d.type == "string" and root and d.name not in produced and d.name not in others:
            out.add(d.name)
    return out


def native_multi_value(spec: IngestSpec) -> tuple[str, ...]:
    """The string dimensions that may carry multi-values on the native reader's way, in
    the spec's order: what :func:`.jvm.prepare.multi_value_dimensions` finds in the JVM
    reader's rows, without building them. That is the JSON fields above (their arrays
    beside them); Parquet list columns never go natively (the reader declines them) and
    CSV has no arrays."""
    fields = json_fields(spec)
    return tuple(d.name for d in spec.dimensions if d.name in fields)
