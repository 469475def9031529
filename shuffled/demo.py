"""`make demo`: ingest the bundled sample data end to end with an embedded daemon, through
`shuffled ingest` itself, so the demo shows what a user's run shows (Spark kept quiet)."""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

from shuffled.cli import main as cli_main

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "rollup-tutorial" / "rollup-index.json"


def main(extra: list[str] | None = None) -> int:
    """Run the tutorial spec into ./demo-output; ``extra`` arguments (``--conf ...``) go to
    `shuffled ingest` as they are, but ``--iceberg``: publish to an Iceberg table (the
    embedded default catalog under ./demo-output/iceberg) and read it back with pyiceberg.
    Returns its exit code."""
    spec = json.loads(EXAMPLE.read_text())
    # The example's baseDir is relative to the repository root: made absolute, so the demo
    # runs from any directory.
    local = spec["spec"]["ioConfig"]["inputSource"]
    if local.get("type") == "local" and "baseDir" in local:
        local["baseDir"] = str((EXAMPLE.parents[2] / local["baseDir"]).resolve())
    extra = list(extra or [])
    output = Path("demo-output").resolve()
    shutil.rmtree(output, ignore_errors=True)
    target = str(output)
    if "--iceberg" in extra:  # `make demo ICEBERG=1`: publish an Iceberg table instead
        extra.remove("--iceberg")
        os.environ["SHUFFLED_ICEBERG_HOME"] = str(output / "iceberg")
        target = "iceberg://demo/druid.rollup_tutorial"
        print(f"Iceberg catalog (SQLite) and warehouse under {output / 'iceberg'}", flush=True)
    print(f"ingesting {EXAMPLE} into {target}", flush=True)
    with tempfile.TemporaryDirectory(prefix="shuffled-demo-") as tmp:
        spec_path = Path(tmp) / EXAMPLE.name
        spec_path.write_text(json.dumps(spec))
        return cli_main(["ingest", str(spec_path), "--output", target, "--show-rows", "50",
                         *extra])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
