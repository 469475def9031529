"""Java regular expressions (Spark's ``rlike``, ``regexp_extract``) for RE2 (Arrow).

Java's and RE2's syntax agree on most patterns; where they read the same pattern
differently :func:`java_regex` rewrites it (``.`` skips every line terminator in Java,
``$`` also matches before a final one, ``\\s`` includes VT) or refuses it (lookaround,
backreferences, possessive quantifiers, atomic groups, ``\\Z``...): the spec then goes
through the JVM reader.
"""

from __future__ import annotations

import re

_JAVA_ONLY = re.compile(r"\(\?<?[=!]|\\[1-9]|[*+?}]\+|\(\?>|\\[zZGpPQE]|\\[hHvVRX]")
_TERMINATORS = "\\n\\r\\x{85}\\x{2028}\\x{2029}"
_SPACE = "\\t\\n\\x0B\\f\\r "


def java_regex(pattern: str, find_only: bool = True) -> str | None:
    """An RE2 pattern finding what the Java ``pattern`` finds, or None where RE2 cannot
    say the same: Java's ``.`` skips every line terminator, ``$`` also matches before a
    final one (only for a yes/no search: ``find_only``), ``\\s`` includes VT."""
    if _JAVA_ONLY.search(pattern):
        return None
    dotall = pattern.startswith("(?s)")
    out, i, in_class = [], 0, False
    while i < len(pattern):
        ch = pattern[i]
        if ch == "\\":
            esc = pattern[i:i + 2]
            out.append({"\\s": _SPACE if in_class else f"[{_SPACE}]",
                        "\\S": f"[^{_SPACE}]"}.get(esc, esc))
            if esc == "\\S" and in_class:
                return None
            i += 2
            continue
        if in_class:
            in_class = ch != "]" or pattern[i - 1] == "["
        elif ch == "[":
            in_class = True
        elif ch == "." and not dotall:
            ch = f"[^{_TERMINATORS}]"
        elif ch == "$":
            if not find_only:
                return None
            ch = f"(?:(?:\\r\\n|[{_TERMINATORS}])?\\z)"
        out.append(ch)
        i += 1
    return "".join(out)


def named_groups(pattern: str) -> str:
    """``pattern`` with its capturing groups named ``g1``, ``g2``... and the whole match
    ``g0`` (Arrow's extract_regex returns named groups only)."""
    out, i, group, in_class = ["(?P<g0>"], 0, 0, False
    while i < len(pattern):
        ch = pattern[i]
        if ch == "\\":
            out.append(pattern[i:i + 2])
            i += 2
            continue
        if in_class:
            in_class = ch != "]"
        elif ch == "[":
            in_class = True
        elif ch == "(" and not pattern.startswith("(?", i):
            group += 1
            out.append(f"(?P<g{group}>")
            i += 1
            continue
        out.append(ch)
        i += 1
    return "".join(out) + ")"
