"""Literal arguments of Druid expressions and filters, checked and converted before Spark starts.

ISO-8601 periods (``timestamp_floor``), Joda-Time format patterns (``timestamp_parse`` /
``timestamp_format``, converted to Spark's datetime patterns where the two agree), SQL LIKE
patterns (converted to an anchored Java regex, so Druid's escape rules hold exactly) and Java
regular expressions (checked with Python's ``re`` as a first approximation; Spark compiles
them with ``java.util.regex`` when the plan is analysed).
"""

from __future__ import annotations

import re

_PERIOD = re.compile(r"P(?:(\d+)Y)?(?:(\d+)M)?(?:(\d+)W)?(?:(\d+)D)?(?:T(?:(\d+)H)?(?:(\d+)M)?(?:(\d+)S)?)?")
_UNITS = ("year", "month", "week", "day", "hour", "minute", "second")
_UNIT_MS = {"week": 7 * 86_400_000, "day": 86_400_000, "hour": 3_600_000, "minute": 60_000,
            "second": 1000}
UTC_NAMES = ("UTC", "Etc/UTC", "Z", "+00:00", "GMT", "Etc/GMT", "UCT")

# Joda-Time letters whose meaning Spark's (java.time-based) patterns share exactly.
_SAFE_LETTERS = set("yMdHhkmsSaE")


class PatternError(ValueError):
    """A literal argument this pipeline cannot translate (the message says why)."""


def parse_period(text: object) -> tuple[str, int]:
    """``(unit, n)`` of a single-field ISO-8601 period (``PT15M`` -> ``('minute', 15)``)."""
    m = _PERIOD.fullmatch(text) if isinstance(text, str) else None
    if m is None or not any(m.groups()):
        raise PatternError(f"{text!r} is not an ISO-8601 period such as 'PT1H' or 'P1D'")
    fields = [(u, int(v)) for u, v in zip(_UNITS, m.groups()) if v is not None and int(v) > 0]
    if len(fields) != 1:
        raise PatternError(f"period {text!r} is compound or zero (one field, e.g. 'PT90M', is supported)")
    return fields[0]


def period_millis(unit: str, n: int) -> int | None:
    """The fixed length of the period in millis, or None for months and years."""
    return _UNIT_MS[unit] * n if unit in _UNIT_MS else None


def check_timezone(tz: object) -> None:
    if tz is not None and tz not in UTC_NAMES:
        raise PatternError(f"time zone {tz!r} is not supported (only UTC)")


def joda_to_spark(pattern: object) -> str:
    """A Spark datetime pattern equal to the Joda-Time ``pattern`` (letters ``yMdHhkmsSaE``
    and quoted literals); any other letter is refused (Joda and java.time disagree on them)."""
    if not isinstance(pattern, str) or not pattern:
        raise PatternError(f"{pattern!r} is not a format pattern")
    i = 0
    while i < len(pattern):
        ch = pattern[i]
        if ch == "'":
            end = pattern.find("'", i + 1)
            if end < 0:
                raise PatternError(f"unterminated quote in pattern {pattern!r}")
            i = end + 1
            continue
        if ch.isalpha() and ch not in _SAFE_LETTERS:
            raise PatternError(f"pattern letter {ch!r} in {pattern!r} is not supported "
                               f"(supported: {''.join(sorted(_SAFE_LETTERS))})")
        i += 1
    return pattern


def like_to_regex(pattern: object, escape: object = None) -> str:
    """An anchored Java/Python regex matching exactly what SQL ``LIKE pattern`` matches."""
    if not isinstance(pattern, str):
        raise PatternError(f"{pattern!r} is not a LIKE pattern")
    if escape is not None and (not isinstance(escape, str) or len(escape) != 1):
        raise PatternError(f"escape {escape!r} must be a single character")
    out, i = ["(?s)^"], 0
    while i < len(pattern):
        ch = pattern[i]
        if escape is not None and ch == escape and i + 1 < len(pattern):
            out.append(re.escape(pattern[i + 1]))
            i += 2
            continue
        out.append(".*" if ch == "%" else "." if ch == "_" else _quote(ch))
        i += 1
    out.append("$")
    return "".join(out)


def _quote(ch: str) -> str:
    # Java's regex and Python's agree on backslash-escaping ASCII punctuation only.
    return "\\" + ch if (not ch.isalnum() and ch.isascii() and ch != " ") else ch


def check_regex(pattern: object) -> str:
    if not isinstance(pattern, str):
        raise PatternError(f"{pattern!r} is not a regular expression")
    try:
        re.compile(pattern)
    except re.error as exc:
        raise PatternError(f"bad regular expression {pattern!r}: {exc}") from None
    return pattern
