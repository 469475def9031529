"""Commit subjects under 72 characters (issue 38): the commit-msg hook refuses a longer
one, and CI's check of the commits since .ci/subjects-since passes on this history."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CHECK = ROOT / "scripts" / "check_subjects.py"


def _hook(tmp_path: Path, message: str) -> int:
    path = tmp_path / "COMMIT_EDITMSG"
    path.write_text(message)
    return subprocess.run([sys.executable, str(CHECK), "--message", str(path)],
                          capture_output=True, timeout=30).returncode


def test_the_hook_refuses_a_long_subject_and_takes_a_short_one(tmp_path: Path) -> None:
    assert _hook(tmp_path, "x" * 72 + "\n\nbody") == 1
    assert _hook(tmp_path, "\n") == 1
    assert _hook(tmp_path, "# a template comment\nBound what an upload declares\n\n"
                 + "y" * 300) == 0


def test_the_commits_since_the_mark_have_short_subjects() -> None:
    done = subprocess.run([sys.executable, str(CHECK)], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stdout
