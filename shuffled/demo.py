"""`make demo`: ingest the bundled sample data end to end with an embedded daemon."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

from shuffled.api import ingest

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "rollup-tutorial" / "rollup-index.json"


def main() -> int:
    spec = json.loads(EXAMPLE.read_text())
    # The example's baseDir is relative to the repository root.
    local = spec["spec"]["ioConfig"]["inputSource"]
    if local.get("type") == "local" and "baseDir" in local:
        local["baseDir"] = str((EXAMPLE.parents[2] / local["baseDir"]).resolve())
    output = Path("demo-output").resolve()
    shutil.rmtree(output, ignore_errors=True)
    print(f"ingesting {EXAMPLE} into {output}", flush=True)
    ingest(spec, output_dir=str(output), progress=lambda line: print(line, flush=True),
           show_rows=50)
    print(f"segments, manifest and task report are in {output}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
