"""docs/first-spec.md is run as written (issue 39): its files are written, its three specs
ingested, and its two DuckDB queries (the segments read through the manifest, and DuckDB's
own rollup of the CSV) must give the same rows for each. A guide that drifts from the code
fails here."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import duckdb
import pytest

from tests.helpers.ingestion import spark  # noqa: F401  (the shared session)

ROOT = Path(__file__).resolve().parents[2]
GUIDE = ROOT / "docs" / "first-spec.md"
pytestmark = pytest.mark.spark


def _blocks(kind: str) -> dict[str, str]:
    """The fenced blocks of the guide marked ``<!-- guide-KIND: NAME -->``, by name."""
    text = GUIDE.read_text()
    found = re.findall(rf"<!-- guide-{kind}: (\S+) -->\n```\w*\n(.*?)```", text, re.S)
    return {name: body for name, body in found}


def test_the_first_spec_guide_runs_as_written(spark: Any, tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    from shuffled.api import ingest

    monkeypatch.chdir(tmp_path)
    files = _blocks("file")
    for name, body in files.items():
        Path(name).parent.mkdir(parents=True, exist_ok=True)
        Path(name).write_text(body)
    base = json.loads(files["flights-dynamic.json"])
    specs = {"flights-dynamic.json": base}
    for name, tuning in _blocks("tuning").items():
        spec = json.loads(json.dumps(base))
        spec["spec"]["tuningConfig"] = json.loads(tuning)
        specs[name] = spec
    assert set(specs) == {"flights-dynamic.json", "flights-hashed.json", "flights-range.json"}
    checks = _blocks("check")
    want = duckdb.sql(checks["duckdb"]).fetchall()
    assert len(want) == 7 and any(r[5] is None for r in want)  # the NA row: null, kept
    for name, spec in specs.items():
        out = tmp_path / f"out-{name.removesuffix('.json')}"
        result = ingest(spec, output=str(out))
        manifest = json.loads((out / "flights" / "manifest.json").read_text())
        paths = [str(out / "flights" / s["path"]) for s in manifest["segments"]]
        got = duckdb.sql(checks["ours"].replace("$files", repr(paths))).fetchall()
        assert got == want, (name, got, want)
        stats = result.report["ingestionStatsAndErrors"]["rowStats"]["buildSegments"]
        # Druid's rowStats: processed counts rows without errors, processedWithError the
        # others (https://druid.apache.org/docs/latest/ingestion/tasks#task-reports)
        assert (stats["processed"], stats["processedWithError"]) == (6, 1), (name, stats)
