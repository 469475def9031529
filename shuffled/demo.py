"""`make demo`: ingest the bundled sample data end to end with an embedded daemon, through
`shuffled ingest` itself, so the demo shows what a user's run shows (Spark kept quiet)."""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
from pathlib import Path

from shuffled.cli import main as cli_main

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "rollup-tutorial" / "rollup-index.json"


def main(extra: list[str] | None = None) -> int:
    """Run the tutorial spec into ./demo-output; ``extra`` arguments (``--conf ...``) go to
    `shuffled ingest` as they are. Returns its exit code."""
    spec = json.loads(EXAMPLE.read_text())
    # The example's baseDir is relative to the repository root: made absolute, so the demo
    # runs from any directory.
    local = spec["spec"]["ioConfig"]["inputSource"]
    if local.get("type") == "local" and "baseDir" in local:
        local["baseDir"] = str((EXAMPLE.parents[2] / local["baseDir"]).resolve())
    output = Path("demo-output").resolve()
    shutil.rmtree(output, ignore_errors=True)
    print(f"ingesting {EXAMPLE} into {output}", flush=True)
    with tempfile.TemporaryDirectory(prefix="shuffled-demo-") as tmp:
        spec_path = Path(tmp) / EXAMPLE.name
        spec_path.write_text(json.dumps(spec))
        return cli_main(["ingest", str(spec_path), "--output", str(output), "--show-rows", "50",
                         *(extra or [])])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
