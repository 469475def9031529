"""Druid's expression language (``docs/querying/math-expr.md``): a tokenizer and a Pratt parser.

Parses the grammar of Druid's ``Expr.g4`` into a small AST; the functions this pipeline
translates are in :data:`FUNCTIONS` with their arities and which arguments must be literals.
Anything else (an unknown or unsupported function, array literals, lambdas) is a
:class:`~shuffled.spark.spec.base.SpecError` naming the function and the expression's JSON
path, before Spark starts. Pure Python: the Spark translation is in
:mod:`shuffled.spark.phase1.jvm.sqlexpr`.

Precedence follows ``Expr.g4`` (tightest first): unary ``-``/``!``; ``^`` (right
associative); ``* / %``; ``+ -``; comparisons ``< <= > >= == !=``; then ``&&`` and ``||``
at ONE level, left associative (as Druid: ``a || b && c`` is ``(a || b) && c``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Union

from shuffled.spark.spec.base import SpecError
from shuffled.spark.spec.patterns import (
    PatternError,
    check_regex,
    check_timezone,
    joda_to_spark,
    like_to_regex,
    parse_period,
)


#: The value types of a translated expression (Druid's, plus BOOL for comparisons and NULL
#: for the null literal), shared by the Spark and the Arrow translations.
LONG, DOUBLE, STRING, BOOL, NULL = "LONG", "DOUBLE", "STRING", "BOOL", "NULL"
NUMERIC = (LONG, DOUBLE, BOOL)


def branch_type(types: set[str]) -> str:
    """One type for the branches of if/case/nvl: equal types stay, numbers widen to DOUBLE,
    anything mixed with a STRING (or only nulls) is a STRING."""
    kinds = types - {NULL}
    if not kinds:
        return STRING
    if kinds <= {BOOL}:
        return BOOL
    if kinds <= set(NUMERIC):
        return DOUBLE if DOUBLE in kinds else LONG
    return STRING


@dataclass(frozen=True)
class Lit:
    """A literal: int (LONG), float (DOUBLE), str (STRING) or None (null)."""

    value: int | float | str | None


@dataclass(frozen=True)
class Ident:
    """A column (input field, or ``__time``)."""

    name: str


@dataclass(frozen=True)
class Unary:
    op: str  # '-' or '!'
    arg: Node


@dataclass(frozen=True)
class Binary:
    op: str
    left: Node
    right: Node


@dataclass(frozen=True)
class Call:
    fn: str
    args: tuple[Node, ...]


Node = Union[Lit, Ident, Unary, Binary, Call]


@dataclass(frozen=True)
class Fn:
    """A supported function: ``min``..``max`` arguments; ``literal`` argument positions must
    be literals (Druid requires it too: patterns, periods, formats, cast types)."""

    min: int
    max: int | None
    literal: tuple[int, ...] = ()
    doc: str = ""


#: Every function the translation supports (see docs/spec-coverage.md for the semantics).
FUNCTIONS: dict[str, Fn] = {
    "concat": Fn(1, None, doc="strings joined; null if any argument is null"),
    "substring": Fn(3, 3, doc="substring(s, index, length): 0-based; length -1 = to the end; "
                            "null when index >= strlen(s)"),
    "lower": Fn(1, 1), "upper": Fn(1, 1),
    "strlen": Fn(1, 1, doc="length in characters (Unicode code points)"),
    "trim": Fn(1, 1, doc="trims spaces at both ends"),
    "replace": Fn(3, 3, doc="replace(s, pattern, replacement): every literal occurrence"),
    "nvl": Fn(2, 2, doc="first argument unless null"),
    "isnull": Fn(1, 1), "notnull": Fn(1, 1),
    "abs": Fn(1, 1),
    "if": Fn(3, 3, doc="if(predicate, then, else)"),
    "case_searched": Fn(2, None, doc="case_searched(p1, v1, p2, v2, ..., [else])"),
    "case_simple": Fn(3, None, doc="case_simple(x, w1, v1, w2, v2, ..., [else])"),
    "like": Fn(2, 3, literal=(1, 2), doc="like(s, pattern, [escape]): SQL LIKE, whole value"),
    "regexp_like": Fn(2, 2, literal=(1,), doc="Java regex found anywhere in the value"),
    "regexp_extract": Fn(2, 3, literal=(1, 2),
                         doc="regexp_extract(s, pattern, [group]): null when nothing matches"),
    "timestamp_floor": Fn(2, 4, literal=(1, 2, 3),
                          doc="timestamp_floor(millis, period, [origin], [timezone]): UTC only"),
    "timestamp_parse": Fn(1, 3, literal=(1, 2),
                          doc="timestamp_parse(s, [pattern], [timezone]): millis, null if unparseable"),
    "timestamp_format": Fn(1, 3, literal=(1, 2),
                           doc="timestamp_format(millis, [pattern], [timezone])"),
    "cast": Fn(2, 2, literal=(1,), doc="cast(x, 'LONG' | 'DOUBLE' | 'FLOAT' | 'STRING')"),
}

CAST_TYPES = ("LONG", "DOUBLE", "FLOAT", "STRING")

_TOKEN = re.compile(r"""
    (?P<ws>\s+)
  | (?P<num>(?:[0-9]+\.[0-9]*|\.[0-9]+|[0-9]+)(?:[eE][+-]?[0-9]+)?)
  | (?P<str>'(?:[^'\\]|\\.)*')
  | (?P<qid>"(?:[^"\\]|\\.)*")
  | (?P<id>[_$a-zA-Z][_$a-zA-Z0-9]*)
  | (?P<op><=|>=|==|!=|&&|\|\||[-+*/%^<>!(),\[\]])
""", re.VERBOSE)

_ESC = {"b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t", "'": "'", '"': '"', "\\": "\\",
        "/": "/"}

# Binding powers of the infix operators (higher binds tighter).
_INFIX: dict[str, tuple[int, bool]] = {  # op -> (power, right associative)
    "&&": (10, False), "||": (10, False),
    "<": (20, False), "<=": (20, False), ">": (20, False), ">=": (20, False),
    "==": (20, False), "!=": (20, False),
    "+": (30, False), "-": (30, False),
    "*": (40, False), "/": (40, False), "%": (40, False),
    "^": (50, True),
}
_PREFIX_POWER = 60


def _unescape(body: str, path: str) -> str:
    out, i = [], 0
    while i < len(body):
        ch = body[i]
        if ch != "\\":
            out.append(ch)
            i += 1
            continue
        nxt = body[i + 1] if i + 1 < len(body) else ""
        if nxt == "u" and re.fullmatch(r"[0-9a-fA-F]{4}", body[i + 2:i + 6]):
            out.append(chr(int(body[i + 2:i + 6], 16)))
            i += 6
        elif nxt in _ESC:
            out.append(_ESC[nxt])
            i += 2
        else:
            raise SpecError(path, f"bad escape \\{nxt} in a string literal")
    return "".join(out)


def _tokens(text: str, path: str) -> list[tuple[str, str | int | float]]:
    out: list[tuple[str, str | int | float]] = []
    pos = 0
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if m is None:
            raise SpecError(path, f"cannot parse expression at character {pos}: {text[pos:pos + 20]!r}")
        pos = m.end()
        kind = m.lastgroup
        tok = m.group()
        if kind == "ws":
            continue
        if kind == "num":
            is_int = re.fullmatch(r"[0-9]+", tok) is not None
            out.append(("lit", int(tok) if is_int else float(tok)))
        elif kind == "str":
            out.append(("str", _unescape(tok[1:-1], path)))
        elif kind == "qid":
            out.append(("id", _unescape(tok[1:-1], path)))
        elif kind == "id":
            out.append(("kw", tok) if tok in ("null", "NaN", "Infinity") else ("id", tok))
        else:
            out.append(("op", tok))
    out.append(("end", ""))
    return out


class _Parser:
    def __init__(self, text: str, path: str) -> None:
        self.toks = _tokens(text, path)
        self.i = 0
        self.path = path

    def peek(self) -> tuple[str, str | int | float]:
        return self.toks[self.i]

    def take(self) -> tuple[str, str | int | float]:
        tok = self.toks[self.i]
        self.i += 1
        return tok

    def expect(self, op: str) -> None:
        kind, val = self.take()
        if (kind, val) != ("op", op):
            found = "the end" if kind == "end" else repr(val)
            raise SpecError(self.path, f"expected {op!r} in the expression, found {found}")

    def expr(self, power: int = 0) -> Node:
        left = self.prefix()
        while True:
            kind, val = self.peek()
            if kind != "op" or val not in _INFIX:
                return left
            p, right_assoc = _INFIX[str(val)]
            if p <= power:
                return left
            self.take()
            right = self.expr(p - 1 if right_assoc else p)
            left = Binary(str(val), left, right)

    def prefix(self) -> Node:
        kind, val = self.take()
        if kind == "lit":
            return Lit(val)
        if kind == "str":
            return Lit(str(val))
        if kind == "kw":
            return Lit(None) if val == "null" else Lit(float("nan") if val == "NaN" else float("inf"))
        if kind == "op" and val in ("-", "!"):
            arg = self.expr(_PREFIX_POWER)
            if val == "-" and isinstance(arg, Lit) and isinstance(arg.value, (int, float)):
                return Lit(-arg.value)  # Druid folds negative literals too
            return Unary(str(val), arg)
        if kind == "op" and val == "(":
            inner = self.expr()
            self.expect(")")
            return inner
        if kind == "op" and val == "[":
            raise SpecError(self.path, "array literals are not supported")
        if kind == "id":
            if self.peek() == ("op", "("):
                return self.call(str(val))
            return Ident(str(val))
        found = "the end" if kind == "end" else repr(val)
        raise SpecError(self.path, f"unexpected {found} in the expression")

    def call(self, name: str) -> Node:
        self.expect("(")
        args: list[Node] = []
        if self.peek() != ("op", ")"):
            while True:
                args.append(self.expr())
                if self.peek() != ("op", ","):
                    break
                self.take()
        self.expect(")")
        fn = FUNCTIONS.get(name)
        if fn is None:
            raise SpecError(self.path, f"function {name!r} is not supported "
                            "(see docs/spec-coverage.md for the supported ones)")
        if len(args) < fn.min or (fn.max is not None and len(args) > fn.max):
            want = f"{fn.min}" if fn.min == fn.max else f"{fn.min} to {fn.max if fn.max else 'any'}"
            raise SpecError(self.path, f"function {name!r} takes {want} arguments, not {len(args)}")
        for pos in fn.literal:
            if pos < len(args) and not isinstance(args[pos], Lit):
                raise SpecError(self.path, f"argument {pos + 1} of {name!r} must be a literal")
        lits = [a.value if isinstance(a, Lit) else None for a in args]
        try:
            check_literals(name, lits)
        except PatternError as exc:
            raise SpecError(self.path, f"{name}: {exc}") from None
        return Call(name, tuple(args))


def check_literals(name: str, lits: list[int | float | str | None]) -> None:
    """Refuse literal arguments the translation cannot honour (PatternError says why)."""
    if name == "cast":
        if not isinstance(lits[1], str) or lits[1].upper() not in CAST_TYPES:
            raise PatternError(f"cast to {lits[1]!r} is not supported (one of {', '.join(CAST_TYPES)})")
    elif name == "timestamp_floor":
        unit, _n = parse_period(lits[1])
        origin = lits[2] if len(lits) > 2 else None
        if origin is not None and (not isinstance(origin, int) or unit in ("month", "year")):
            raise PatternError("origin must be null, or epoch millis with a period of weeks or less")
        check_timezone(lits[3] if len(lits) > 3 else None)
    elif name in ("timestamp_parse", "timestamp_format"):
        if len(lits) > 1 and lits[1] is not None:
            joda_to_spark(lits[1])
        check_timezone(lits[2] if len(lits) > 2 else None)
    elif name == "like":
        like_to_regex(lits[1], lits[2] if len(lits) > 2 else None)
    elif name in ("regexp_like", "regexp_extract"):
        groups = re.compile(check_regex(lits[1])).groups
        group = lits[2] if len(lits) > 2 else 0
        if not isinstance(group, int) or not 0 <= group <= groups:
            raise PatternError(f"group {group!r} must be an integer from 0 to {groups}")


def parse_expr(text: str, path: str) -> Node:
    """The AST of a Druid expression, or SpecError at ``path``."""
    if not isinstance(text, str) or not text.strip():
        raise SpecError(path, "must be a non-empty expression string")
    p = _Parser(text, path)
    node = p.expr()
    kind, val = p.peek()
    if kind != "end":
        raise SpecError(path, f"unexpected {val!r} after the end of the expression")
    return node


def identifiers(node: Node) -> set[str]:
    """The column names an expression reads."""
    if isinstance(node, Ident):
        return {node.name}
    if isinstance(node, Unary):
        return identifiers(node.arg)
    if isinstance(node, Binary):
        return identifiers(node.left) | identifiers(node.right)
    if isinstance(node, Call):
        out: set[str] = set()
        for a in node.args:
            out |= identifiers(a)
        return out
    return set()
