"""What ``shuffled serve`` imports before it listens: the start of a daemon is mostly
imports (docs/benchmarks.md, issue 37's restart), so what it does not need stays out."""

from __future__ import annotations

import subprocess
import sys

# Modules of other commands (the client is `shuffled tasks`' and the driver's).
NOT_AT_START = ("shuffled.client", "shuffled.client.client", "shuffled.spark",
                "pyarrow.compute")


def test_serve_start_leaves_out_the_client_and_the_driver() -> None:
    code = ("import sys, shuffled.cli, shuffled.server.runner; "
            f"print(sorted(m for m in {NOT_AT_START!r} if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, check=True)
    assert out.stdout.strip() == "[]"
