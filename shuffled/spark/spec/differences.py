"""Where the same spec gives something other than Druid gives, and why: docs/differences-from-druid.md.

One :class:`Difference` per row of the page's table; tests/spark/spec/test_differences.py
checks the page equals :func:`table` and probes the rows that name a parser decision (a
field refused, a default refused) against the parser, so the page cannot drift from the code.
``python -m shuffled.spark.spec.differences`` prints the table for the page.

Everything not listed here is meant to give Druid's answer; a case found to differ is a bug
(or a row to add, with its reason).
"""

from __future__ import annotations

from dataclasses import dataclass

#: The hash function hashed partitioning uses (the shardSpec's ``partitionFunction``):
#: Spark's ``hash()``, Murmur3 x86_32 with seed 42 (phase2.shards writes it).
HASH_FUNCTION = "spark_murmur3_32"
#: The late plan's hashed shards (docs/slab.md): ranges of that hash as a uint32.
HASH_RANGE_FUNCTION = "murmur3_32_range"


@dataclass(frozen=True)
class Difference:
    """A topic, what happens here, what Druid does, and why they differ."""

    topic: str
    here: str
    druid: str
    why: str
    refused_at: str = ""  # a spec path the parser refuses over this difference, if any


DIFFERENCES: tuple[Difference, ...] = (
    Difference(
        "A double turned into a string by a transform",
        "The native reader prints the fewest digits that read back to the same double "
        "(Python's `repr`, as Java 19 and later); the JVM reader prints what Java 17 does, "
        "for some values one digit more: 2^62 is `4.611686018427388E18` natively, "
        "`4.6116860184273879E18` on Java 17.",
        "Java's `Double.toString` on the JVM Druid runs on (Java 17: the longer form).",
        "Java 17's digits are JDK-4511638, fixed in Java 19; both strings read back to the "
        "same double. Reproducing Java 17's FloatingDecimal digit for digit was not done "
        "(tests/spark/phase1/test_differential_property.py allows exactly this case)."),
    Difference(
        "Hash partitioning function",
        f"Rows go to `pmod(hash(cols), numShards)` with Spark's `hash()` (Murmur3 x86_32, seed 42); "
        f"the shardSpec says `\"partitionFunction\": \"{HASH_FUNCTION}\"`. "
        "`partitionFunction` in a spec is refused.",
        "`murmur3_32_abs`: Guava's murmur3_32 of the JSON-serialized group key, absolute value "
        "modulo numShards.",
        "Both readers compute the partition in bulk (Spark SQL on the JVM path, the same "
        "function on Arrow natively); rows with equal keys still share a partition, but the "
        "partition numbers differ from Druid's, so these segments must not be mixed with "
        "Druid's hashed segments of the same interval.",
        "spec.tuningConfig.partitionsSpec.partitionFunction"),
    Difference(
        "Hash partitioning without numShards",
        "With `targetRowsPerSegment` or `maxRowsPerSegment` and no `numShards` (native reader, "
        "one shuffle replica), a time chunk's shards are ranges of the same hash as a uint32, "
        "equal parts of [0, 2^32), chosen after phase 1 from its rolled-up rows' HLL; the "
        f"shardSpec says `\"partitionFunction\": \"{HASH_RANGE_FUNCTION}\"` with the shard's "
        "`start` (inclusive) and `end` (exclusive; null: unbounded). `maxRowsPerSegment` is a "
        "hard cap here, met at three standard errors of the estimates.",
        "`hash % numShards` after a determine-partitions pass over the input (HLL of each "
        "interval's rows); `maxRowsPerSegment` is the deprecated name of the target.",
        "The shard count is known only after phase 1 has read the input once, when rows are "
        "already written ordered by hash: a range of it can be read from every slab, `hash % "
        "n` cannot (docs/slab.md). It saves the second pass over the input."),
    Difference(
        "HLL sketch string encoding",
        "`HLLSketchBuild` hashes each value's UTF-8 bytes and needs `\"stringEncoding\": \"UTF8\"`; "
        "leaving it out, or `UTF16LE`, is refused.",
        "Default `UTF16LE` (UTF-16 code units hashed); `UTF8` on request.",
        "The `datasketches` package hashes a string's UTF-8 bytes only (no byte-array update), "
        "so Druid's default cannot be reproduced; refusing it keeps sketches from silently "
        "failing to union with Druid's.",
        "spec.dataSchema.metricsSpec[].stringEncoding"),
    Difference(
        "Sketches of numbers",
        "HLL and theta sketches of a JSON or CSV field hash its text (fields are read as text).",
        "A numeric input value is hashed as a long or double.",
        "Text input is read as text, as Druid's CSV reader gives it; a sketch of a JSON number "
        "differs from Druid's (strings agree)."),
    Difference(
        "Output format",
        "Each segment is one Parquet file (Druid's column names and `__time`), listed with its "
        "Druid-style descriptor (interval, version, partitionNum, shardSpec) in "
        "`manifest.json`, or the data files of an Apache Iceberg table; sketch metrics are "
        "their compact serialized bytes.",
        "Segments in Druid's own column format (`index.zip`/smoosh), published to the metadata "
        "store and deep storage.",
        "The output is meant for engines that read Parquet or Iceberg; readers go through the "
        "manifest (or the table), never a directory listing."),
    Difference(
        "Null handling",
        "SQL-compatible null handling only: null is not `''` or 0; a value that is not a number "
        "in a numeric column is null (the row counts as `processedWithError`).",
        "SQL-compatible by default since Druid 28 (the only mode since 32); older Druids could "
        "replace nulls with defaults.",
        "The legacy mode is gone from Druid; only its current semantics are reproduced."),
    Difference(
        "JSON field types in expressions",
        "JSON fields are read as text, so an expression on two numeric JSON fields works on "
        "strings (`a + b` concatenates) unless cast.",
        "The JSON reader gives numbers as LONG/DOUBLE.",
        "Fields are read as Spark's `from_json` reads them to text, one path for every input; "
        "`cast(a, 'LONG')` gives Druid's result."),
    Difference(
        "Arithmetic edge cases",
        "LONG overflow, `/` or `%` by zero on LONGs and a negative LONG exponent give null.",
        "LONG arithmetic wraps around; division by zero fails the row or gives 0.",
        "Spark's `try_` arithmetic is what both readers compute."),
    Difference(
        "String lengths and order",
        "`strlen`/`substring` count Unicode code points; lexicographic order is UTF-8 byte order.",
        "Java counts UTF-16 code units and orders by them.",
        "They differ only beyond the Basic Multilingual Plane."),
    Difference(
        "First/last ties",
        "A tie on time is broken by the value (first: smallest, last: largest).",
        "The first (or last) row met wins, which depends on how the input was split.",
        "The result is the same however the input is split into tasks and flushes."),
    Difference(
        "Dynamic partitioning",
        "Always a perfect rollup (partitions hash the whole rolled-up key); the shardSpec is "
        "`numbered`.",
        "Best-effort rollup: the same key may appear in several segments of an interval.",
        "The two-phase shuffle rolls up every key once anyway; querying gives the same totals."),
    Difference(
        "CSV multi-values",
        "`listDelimiter` is ignored: a CSV value is never split into a multi-value.",
        "Values are split on `listDelimiter` (default U+0001) into multi-value dimensions.",
        "Not implemented; a CSV value holding U+0001 is one value here."),
    Difference(
        "CSV lines with another number of values",
        "A CSV line with more or fewer values than columns is `unparseable` "
        "(`malformed csv record`).",
        "The values are zipped with the columns as far as both go (Druid's DelimitedValueReader, "
        "`Utils.zipMapPartial`): extra values are dropped, missing columns are null, and the "
        "row is ingested.",
        "Both readers follow Spark's `from_csv` (PERMISSIVE), which marks such lines malformed; "
        "not changed yet (found while writing the Druid-parity tests)."),
    Difference(
        "Empty CSV values",
        "An empty CSV value is null.",
        "SQL-compatible Druid keeps it as `''` (ParserUtils returns the text as it is).",
        "Both readers follow Spark's `from_csv`, which reads an empty value as null; not "
        "changed yet (found while writing the Druid-parity tests)."),
    Difference(
        "Saved parse exceptions",
        "`unparseableEvents` is one list of `{file, line, message, raw, errorType}` "
        "(`errorType`: `unparseable` or `processedWithError`).",
        "`unparseableEvents` holds a list per phase (`buildSegments`, ...) of Druid's parse "
        "exception reports.",
        "One phase reads the input here; the file and line locate the row."),
    Difference(
        "Compressed input",
        "`.gz`, `.bz2`, `.zst` and `.xz` are decompressed (one file, one split); `.zip` and `.sz` "
        "are refused by name.",
        "Also reads `.zip` and Snappy (`.sz`).",
        "Not implemented: refused rather than read as text."),
)


def table() -> str:
    """The markdown table of docs/differences-from-druid.md."""
    lines = ["| topic | here | Druid | why |", "|---|---|---|---|"]
    for d in DIFFERENCES:
        cells = [d.topic, d.here, d.druid, d.why]
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(lines)


if __name__ == "__main__":  # pragma: no cover
    print(table())
