"""No module of the package over 400 lines: a module owns one idea (README, Layout)."""

from __future__ import annotations

from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "shuffled"
LIMIT = 400


def test_no_module_over_the_limit() -> None:
    sizes = {p.relative_to(PACKAGE).as_posix(): len(p.read_text(encoding="utf-8").splitlines())
             for p in PACKAGE.rglob("*.py")}
    assert sizes, PACKAGE
    over = {name: n for name, n in sizes.items() if n > LIMIT}
    assert not over, f"modules over {LIMIT} lines: split them by idea: {over}"
