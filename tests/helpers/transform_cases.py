"""Every Druid expression function and filter type of transformSpec, each with the DuckDB SQL
computing what Druid documents for it (the Spark and the Arrow translations are both checked
against them)."""

from __future__ import annotations

from typing import Any

# Druid's asLong of a string: a long if it is one, else the double truncated toward zero.
TRY_LONG = ("CASE WHEN regexp_full_match({x}, '-?[0-9]+') THEN TRY_CAST({x} AS BIGINT) "
            "ELSE CAST(trunc(TRY_CAST({x} AS DOUBLE)) AS BIGINT) END")
D_BY_ZERO = "CASE WHEN d > 0 THEN 'inf'::DOUBLE WHEN d < 0 THEN '-inf'::DOUBLE WHEN d = 0 THEN 'nan'::DOUBLE END"


#: (Druid expression, DuckDB SQL computing what Druid documents for it). Every function of
#: spec.expr.FUNCTIONS appears at least once (test_every_function_is_tested checks).
EXPRESSIONS: list[tuple[str, str]] = [
    ("n + 2", "n + 2"), ("n - d", "n - d"), ("n * 3", "n * 3"), ("d * 2", "d * 2"),
    ("n / 2", "n // 2"), ("n / 0", "CAST(NULL AS BIGINT)"), ("d / 0", D_BY_ZERO),
    ("n % 4", "n % 4"), ("d % 2", "d % 2.0"), ("n ^ 2", "TRY_CAST(pow(n, 2) AS BIGINT)"),
    ("d ^ 2", "pow(d, 2)"), ("-n", "-n"), ("-d", "-d"), ("2 + 3 * 4 ^ 2", "50"),
    ("-2 ^ 2", "4"), ("t * 2", "TRY_CAST(t AS DOUBLE) * 2"), ("t + 1", "TRY_CAST(t AS DOUBLE) + 1"),
    ("s + s", "s || s"), ("n > 0 && d > 0", "CAST((n > 0) AND (d > 0) AS BIGINT)"),
    ("n > 0 || s == 'abc'", "CAST((n > 0) OR (s = 'abc') AS BIGINT)"),
    ("n > 0 || d > 0 && s == 'abc'", "CAST(((n > 0) OR (d > 0)) AND (s = 'abc') AS BIGINT)"),
    ("!(n > 0)", "CAST(NOT (n > 0) AS BIGINT)"), ("!s", "CAST(NOT (lower(s) = 'true') AS BIGINT)"),
    ("n == 7", "CAST(n = 7 AS BIGINT)"), ("n != d", "CAST(n != d AS BIGINT)"),
    ("s < 'b'", "CAST(s < 'b' AS BIGINT)"), ("s >= ''", "CAST(s >= '' AS BIGINT)"),
    ("t <= 5", "CAST(TRY_CAST(t AS DOUBLE) <= 5 AS BIGINT)"),
    ("concat('x-', s, n)", "'x-' || s || CAST(n AS VARCHAR)"),
    ("concat(s, d)", "s || CAST(d AS VARCHAR)"),
    ("substring(s, 1, 3)", "CASE WHEN 1 < length(s) THEN substr(s, 2, 3) END"),
    ("substring(s, 2, -1)", "CASE WHEN 2 < length(s) THEN substr(s, 3) END"),
    ("lower(s)", "lower(s)"), ("upper(s)", "upper(s)"), ("strlen(s)", "CAST(length(s) AS BIGINT)"),
    ("trim(s)", "trim(s, ' ')"), ("replace(s, 'l', 'L')", "replace(s, 'l', 'L')"),
    ("nvl(s, 'none')", "coalesce(s, 'none')"), ("nvl(n, d)", "coalesce(CAST(n AS DOUBLE), d)"),
    ("isnull(s)", "CAST(s IS NULL AS BIGINT)"), ("notnull(n)", "CAST(n IS NOT NULL AS BIGINT)"),
    ("abs(n)", "abs(n)"), ("abs(d)", "abs(d)"),
    ("if(n > 0, 'pos', 'nonpos')", "CASE WHEN n > 0 THEN 'pos' ELSE 'nonpos' END"),
    ("if(s, 1, d)", "CASE WHEN lower(s) = 'true' THEN 1.0 ELSE d END"),
    ("case_searched(n > 5, 'big', n > 0, 'small', 'other')",
     "CASE WHEN n > 5 THEN 'big' WHEN n > 0 THEN 'small' ELSE 'other' END"),
    ("case_searched(n > 5, n)", "CASE WHEN n > 5 THEN n END"),
    ("case_simple(s, 'abc', 1, 'Hello World', 2, 0)",
     "CASE WHEN s = 'abc' THEN 1 WHEN s = 'Hello World' THEN 2 ELSE 0 END"),
    ("like(s, '%o%')", "CAST(s LIKE '%o%' AS BIGINT)"),
    ("like(s, 'x\\\\%y%', '\\\\')", "CAST(s LIKE 'x\\%y%' ESCAPE '\\' AS BIGINT)"),
    ("like(s, '_bc')", "CAST(s LIKE '_bc' AS BIGINT)"),
    ("regexp_like(s, 'o W')", "CAST(regexp_matches(s, 'o W') AS BIGINT)"),
    ("regexp_extract(s, '([a-z]+)', 1)",
     "CASE WHEN regexp_matches(s, '([a-z]+)') THEN regexp_extract(s, '([a-z]+)', 1) END"),
    ("regexp_extract(s, 'l+')", "CASE WHEN regexp_matches(s, 'l+') THEN regexp_extract(s, 'l+') END"),
    ("timestamp_floor(ms, 'PT1H')", "epoch_ms(date_trunc('hour', epoch_ms(ms)))"),
    ("timestamp_floor(ms, 'PT15M')", "epoch_ms(time_bucket(INTERVAL 15 MINUTE, epoch_ms(ms)))"),
    ("timestamp_floor(ms, 'P1D')", "epoch_ms(date_trunc('day', epoch_ms(ms)))"),
    ("timestamp_floor(ms, 'P2D')",
     "epoch_ms(time_bucket(INTERVAL 2 DAY, epoch_ms(ms), TIMESTAMP '1970-01-01'))"),
    ("timestamp_floor(ms, 'P1W')", "epoch_ms(date_trunc('week', epoch_ms(ms)))"),
    ("timestamp_floor(ms, 'P1M')", "epoch_ms(date_trunc('month', epoch_ms(ms)))"),
    ("timestamp_floor(ms, 'P3M')", "epoch_ms(date_trunc('quarter', epoch_ms(ms)))"),
    ("timestamp_floor(ms, 'P1Y')", "epoch_ms(date_trunc('year', epoch_ms(ms)))"),
    ("timestamp_floor(ms, 'PT1H', 1800000, 'UTC')",
     "epoch_ms(time_bucket(INTERVAL 1 HOUR, epoch_ms(ms), TIMESTAMP '1970-01-01 00:30:00'))"),
    ("timestamp_floor(__time, 'PT1M')", "epoch_ms(date_trunc('minute', epoch_ms(ms)))"),
    ("timestamp_parse(ts)", "epoch_ms(try_strptime(ts, '%Y-%m-%dT%H:%M:%SZ'))"),
    ("timestamp_parse(dmy, 'dd/MM/yyyy HH:mm')", "epoch_ms(try_strptime(dmy, '%d/%m/%Y %H:%M'))"),
    ("timestamp_format(ms)", "strftime(epoch_ms(ms), '%Y-%m-%dT%H:%M:%S.%gZ')"),
    ("timestamp_format(ms, 'yyyy-MM-dd HH')", "strftime(epoch_ms(ms), '%Y-%m-%d %H')"),
    ("cast(t, 'LONG')", TRY_LONG.format(x="t")), ("cast(d, 'LONG')", "CAST(trunc(d) AS BIGINT)"),
    ("cast(n, 'STRING')", "CAST(n AS VARCHAR)"), ("cast(t, 'DOUBLE')", "TRY_CAST(t AS DOUBLE)"),
    ("cast(n, 'FLOAT')", "CAST(n AS DOUBLE)"),
]


#: (filter JSON, DuckDB condition); a row is kept when the condition is true (not null).
FILTERS: list[tuple[dict[str, Any], str]] = [
    ({"type": "selector", "dimension": "s", "value": "abc"}, "s = 'abc'"),
    ({"type": "selector", "dimension": "s", "value": None}, "s IS NULL"),
    ({"type": "selector", "dimension": "s", "value": ""}, "s = ''"),
    ({"type": "selector", "dimension": "n", "value": "7"}, "n = 7"),
    ({"type": "selector", "dimension": "d", "value": "2.5"}, "d = 2.5"),
    ({"type": "selector", "dimension": "n", "value": "x"}, "false"),
    ({"type": "equality", "column": "n", "matchValueType": "LONG", "matchValue": 7}, "n = 7"),
    ({"type": "equality", "column": "s", "matchValueType": "STRING", "matchValue": "abc"}, "s = 'abc'"),
    ({"type": "equality", "column": "t", "matchValueType": "DOUBLE", "matchValue": 3.5},
     "TRY_CAST(t AS DOUBLE) = 3.5"),
    ({"type": "in", "dimension": "s", "values": ["abc", "", None]}, "s IN ('abc', '') OR s IS NULL"),
    ({"type": "in", "dimension": "n", "values": ["7", "100"]}, "n IN (7, 100)"),
    ({"type": "bound", "dimension": "s", "lower": "a", "upper": "b"}, "s >= 'a' AND s <= 'b'"),
    ({"type": "bound", "dimension": "t", "lower": "0", "upper": "12", "upperStrict": True,
      "ordering": "numeric"}, "TRY_CAST(t AS DOUBLE) >= 0 AND TRY_CAST(t AS DOUBLE) < 12"),
    ({"type": "range", "column": "n", "matchValueType": "LONG", "lower": 0, "lowerOpen": True},
     "n > 0"),
    ({"type": "range", "column": "s", "matchValueType": "STRING", "upper": "b"}, "s <= 'b'"),
    ({"type": "range", "column": "d", "matchValueType": "DOUBLE", "lower": -1, "upper": 2.5,
      "upperOpen": True}, "d >= -1 AND d < 2.5"),
    ({"type": "like", "dimension": "s", "pattern": "%o%"}, "s LIKE '%o%'"),
    ({"type": "like", "dimension": "s", "pattern": "x!%y%", "escape": "!"}, "s LIKE 'x!%y%' ESCAPE '!'"),
    ({"type": "regex", "dimension": "s", "pattern": "^[a-z]+$"}, "regexp_matches(s, '^[a-z]+$')"),
    ({"type": "null", "column": "s"}, "s IS NULL"),
    ({"type": "interval", "dimension": "__time",
      "intervals": ["2018-01-01/2019-07-01", "1969-01-01/1970-01-01"]},
     "(ms >= 1514764800000 AND ms < 1561939200000) OR (ms >= -31536000000 AND ms < 0)"),
    ({"type": "true"}, "true"), ({"type": "false"}, "false"),
    ({"type": "and", "fields": [{"type": "selector", "dimension": "s", "value": "abc"},
                                {"type": "bound", "dimension": "n", "lower": "-5", "ordering": "numeric"}]},
     "s = 'abc' AND n >= -5"),
    ({"type": "or", "fields": [{"type": "selector", "dimension": "s", "value": "abc"},
                               {"type": "null", "column": "n"}]}, "s = 'abc' OR n IS NULL"),
    ({"type": "not", "field": {"type": "selector", "dimension": "s", "value": "abc"}}, "NOT (s = 'abc')"),
    ({"type": "expression", "expression": "n > 0"}, "n > 0"),
]
