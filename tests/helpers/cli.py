"""``shuffled ingest`` run as a user runs it: a subprocess with Spark on loopback and no
inherited ``PYSPARK_SUBMIT_ARGS``, for the tests that check what the command prints."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]


def ingest_cli(tmp_path: Path, spec: dict[str, Any], *extra: str,
               timeout: float = 240) -> subprocess.CompletedProcess[str]:
    """``shuffled ingest SPEC --output tmp_path/out EXTRA`` (the spec written to
    ``tmp_path/spec.json``); its exit code, stdout and stderr."""
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(spec))
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1"}
    env.pop("PYSPARK_SUBMIT_ARGS", None)
    return subprocess.run([sys.executable, "-m", "shuffled", "ingest", str(path),
                           "--output", str(tmp_path / "out"), *extra],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
