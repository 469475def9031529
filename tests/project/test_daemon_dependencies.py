"""What ``shuffled serve`` imports is installed without the ``spark`` extra.

docs/ops.md and deploy/ install a daemon node with the base package alone (``pip install
shuffled-server``, the Docker image, the systemd unit: "no [spark]"). The slab modules
imported numpy, which only the ``spark`` extra named (pyarrow no longer requires it), so
such a daemon failed at start with ModuleNotFoundError. This checks every third-party
distribution the daemon's modules load against the base package's requirements,
transitively."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
#: What a daemon loads: the serve command, the app and the store, and the slab reads.
DAEMON_MODULES = ("shuffled.cli.serve", "shuffled.server.app", "shuffled.storage.store",
                  "shuffled.storage.slabs.shards", "shuffled.storage.ondisk.messages")


def _top_levels(modules: tuple[str, ...]) -> set[str]:
    """Top-level modules a fresh interpreter holds after importing ``modules``."""
    code = ("import json, sys\n"
            f"for m in {modules!r}: __import__(m)\n"
            "print(json.dumps(sorted({n.split('.')[0] for n in sys.modules})))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, cwd=ROOT, check=True)
    return set(json.loads(done.stdout))


def _loaded_top_levels() -> set[str]:
    """What DAEMON_MODULES load beyond what the interpreter itself starts with (a venv's
    .pth files import setuptools' ``_distutils_hack``, say)."""
    return _top_levels(DAEMON_MODULES) - _top_levels(())


def _closure(dist: str) -> set[str]:
    """``dist`` and the distributions it requires, transitively, extras left out."""
    seen: set[str] = set()
    todo = [dist]
    while todo:
        name = re.sub(r"[-_.]+", "-", todo.pop()).lower()
        if name in seen:
            continue
        seen.add(name)
        try:
            requires = metadata.requires(name) or []
        except metadata.PackageNotFoundError:
            continue
        for req in requires:
            if "extra ==" in req:
                continue
            marker = req.split(";", 1)[1] if ";" in req else ""
            if "platform_system" in marker and "Linux" not in marker:
                continue
            todo.append(re.split(r"[\s<>=!~\[;(]", req, maxsplit=1)[0])
    return seen


def test_the_daemon_needs_no_extra() -> None:
    base = _closure("shuffled-server")
    by_module = metadata.packages_distributions()
    needed = {re.sub(r"[-_.]+", "-", d).lower()
              for m in _loaded_top_levels() for d in by_module.get(m, [])}
    needed.discard("shuffled-server")
    missing = sorted(needed - base)
    assert not missing, (f"shuffled serve imports {missing}, which the base package does "
                         f"not require: add them to [project] dependencies")
