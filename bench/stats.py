"""Alternating measurement of two sides and the Result rows the table is made of."""

from __future__ import annotations

import math
import operator
import statistics
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

_OPS: dict[str, Callable[[float, float], bool]] = {
    ">=": operator.ge, ">": operator.gt, "<=": operator.le, "<": operator.lt}


def alternate(sides: dict[str, Callable[[], dict[str, float]]],
              repeats: int) -> dict[str, dict[str, list[float]]]:
    """Run each side ``repeats`` times, interleaved A B, B A, A B, ... (so drift in the
    machine's load hits both sides alike). Each call returns named figures; the result
    maps side -> figure -> the list of values."""
    names = list(sides)
    out: dict[str, dict[str, list[float]]] = {n: {} for n in names}
    for i in range(repeats):
        for name in (names if i % 2 == 0 else names[::-1]):
            for key, value in sides[name]().items():
                out[name].setdefault(key, []).append(value)
    return out


def median(values: list[float]) -> float:
    """Median of ``values``."""
    return float(statistics.median(values))


@dataclass
class Result:
    """One row of the table and of ``results.json``.

    ``ratio`` is ours / baseline; ``target`` is a condition on the ratio (``on="ratio"``)
    or on ``ours`` itself (``on="ours"``); ``met`` is None for rows that only inform.
    """

    name: str
    title: str
    ours: float
    baseline: float | None
    unit: str
    ratio: float | None
    target: str | None
    met: bool | None
    detail: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        """Plain JSON (non-finite numbers become null: JSON has no NaN or Infinity)."""
        return _finite(asdict(self))


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def compare(name: str, title: str, ours: float, baseline: float, unit: str,
            op: str | None, threshold: float | None, **detail: Any) -> Result:
    """A ratio row: ours / baseline checked against ``op threshold`` (None: info only)."""
    target = f"{op} {threshold:g}x" if op and threshold is not None else None
    if not baseline or not math.isfinite(baseline) or not math.isfinite(ours):
        detail["unmeasured"] = "baseline too small to measure (or missing): no ratio"
        return Result(name, title, ours, baseline, unit, None, target, None, detail)
    ratio = ours / baseline
    met = _OPS[op](ratio, threshold) if op and threshold is not None else None
    return Result(name, title, ours, baseline, unit, ratio, target, met, detail)


def absolute(name: str, title: str, ours: float, unit: str, op: str, threshold: float,
             **detail: Any) -> Result:
    """A row with no peer: ``ours`` checked against ``op threshold unit``."""
    return Result(name, title, ours, None, unit, None, f"{op} {threshold:g} {unit}",
                  _OPS[op](ours, threshold), detail)


def info(name: str, title: str, ours: float, unit: str, **detail: Any) -> Result:
    """A row with no peer and no target: shown for information."""
    return Result(name, title, ours, None, unit, None, None, None, detail)


def failed(name: str, title: str, error: str) -> Result:
    """A comparison that could not run: reported, never counted as met."""
    return Result(name, title, float("nan"), None, "", None, None, False, {"error": error})
