"""Commit subjects under 72 characters (issue 38): ``git log --oneline`` must read as a
list. The why, the command and the figures belong in the body.

- ``--message FILE``: the commit-msg hook (.githooks/commit-msg) checks a commit being
  made.
- no argument: CI checks every commit after the one named in ``.ci/subjects-since`` (the
  commits before it were written under the older habit and are left as they are).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

LIMIT = 72
ROOT = Path(__file__).resolve().parents[1]


def subject(message: str) -> str:
    for line in message.splitlines():
        if line.strip() and not line.startswith("#"):
            return line.rstrip()
    return ""


def problem(text: str) -> str | None:
    if not text:
        return "the subject is empty"
    if len(text) >= LIMIT:
        return (f"the subject has {len(text)} characters (under {LIMIT}): say what changed "
                "in it, and put the why, the command and the figures in the body")
    return None


def check_range() -> int:
    since = (ROOT / ".ci" / "subjects-since").read_text().split()[0]
    known = subprocess.run(["git", "cat-file", "-e", f"{since}^{{commit}}"], cwd=ROOT,
                           capture_output=True)
    if known.returncode != 0:
        print(f"subjects: {since} is not in this clone's history (shallow?): not checked")
        return 0
    log = subprocess.run(["git", "log", "--format=%h%x00%s", f"{since}..HEAD"], cwd=ROOT,
                         capture_output=True, text=True, check=True).stdout
    bad = []
    for line in log.splitlines():
        sha, _, text = line.partition("\0")
        why = problem(text)
        if why:
            bad.append(f"  {sha} {text[:80]}...: {why}")
    print(f"subjects: {len(log.splitlines())} commit(s) since {since}, {len(bad)} too long")
    for line in bad:
        print(line)
    return 1 if bad else 0


def main(argv: list[str]) -> int:
    if len(argv) == 3 and argv[1] == "--message":
        why = problem(subject(Path(argv[2]).read_text(encoding="utf-8", errors="replace")))
        if why:
            print(f"commit-msg: {why}", file=sys.stderr)
            return 1
        return 0
    return check_range()


if __name__ == "__main__":
    sys.exit(main(sys.argv))
