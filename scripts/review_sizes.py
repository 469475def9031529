"""Prompts for review, never a failure: modules over ~600 lines and folders over ~15
modules in ``shuffled/``.

A size cap enforced as a failing test made modules split to pass the count rather than
by idea (issue 38). This prints what has grown past the sizes at which a reader usually
finds two ideas in one place, so that a reviewer looks; whether to split is theirs.
``make review`` runs it, and ``make test`` prints it before the suite.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

MODULE_LINES = 600
FOLDER_MODULES = 15


@dataclass(frozen=True)
class Prompt:
    path: str
    size: int
    what: str  # "lines" or "modules"

    def __str__(self) -> str:
        limit = MODULE_LINES if self.what == "lines" else FOLDER_MODULES
        return f"{self.path}: {self.size} {self.what} (over ~{limit}: one idea, or two?)"


def prompts(package: Path) -> list[Prompt]:
    out: list[Prompt] = []
    for module in sorted(package.rglob("*.py")):
        lines = len(module.read_text(encoding="utf-8").splitlines())
        if lines > MODULE_LINES:
            out.append(Prompt(module.relative_to(package.parent).as_posix(), lines, "lines"))
    for folder in sorted(p for p in package.rglob("*") if p.is_dir()):
        modules = [m for m in folder.glob("*.py") if m.name != "__init__.py"]
        if len(modules) > FOLDER_MODULES:
            out.append(Prompt(folder.relative_to(package.parent).as_posix() + "/",
                              len(modules), "modules"))
    return out


def main(argv: list[str]) -> int:
    package = Path(argv[1]) if len(argv) > 1 else Path(__file__).resolve().parents[1] / "shuffled"
    found = prompts(package)
    print(f"review: {len(found)} place(s) past the usual sizes" + (":" if found else ""))
    for prompt in found:
        print(f"  {prompt}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
