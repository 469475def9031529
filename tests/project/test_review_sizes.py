"""The size check prompts a review and never fails the build (issue 38): it reports
modules over ~600 lines and folders over ~15 modules, and only those."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))

from review_sizes import FOLDER_MODULES, MODULE_LINES, prompts  # noqa: E402


def test_it_names_long_modules_and_crowded_folders_only(tmp_path: Path) -> None:
    pkg = tmp_path / "pkg"
    (pkg / "crowded").mkdir(parents=True)
    (pkg / "long.py").write_text("x = 1\n" * (MODULE_LINES + 1))
    (pkg / "short.py").write_text("x = 1\n" * MODULE_LINES)
    for i in range(FOLDER_MODULES + 1):
        (pkg / "crowded" / f"m{i}.py").write_text("")
    (pkg / "crowded" / "__init__.py").write_text("")
    found = {(p.path, p.what) for p in prompts(pkg)}
    assert found == {("pkg/long.py", "lines"), ("pkg/crowded/", "modules")}


def test_the_report_runs_on_the_package_and_exits_0() -> None:
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "review_sizes.py")],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("review: ")
