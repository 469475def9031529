"""The pipeline with per-task tokens: daemons with a signing secret and no shared token; the
driver mints write (phase 1), read (phase 2) and admin (itself) tokens and executors see
only theirs. The secret and the operator token are made per run."""

from __future__ import annotations

import json
import secrets
from pathlib import Path
from typing import Any

import pytest

from shuffled.client import ShuffleClient
from shuffled.protocol import parse_instant
from shuffled.server.embedded import EmbeddedDaemon
from shuffled.spark import run_ingestion
from shuffled.tokens import Scope, mint
from tests.helpers.ingestion import read_output, spark  # noqa: F401  (fixtures)

ROOT = Path(__file__).resolve().parents[2]


def test_ingestion_with_scoped_tokens_and_spec_quotas(spark: Any, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    spec = json.loads((ROOT / "examples/rollup-tutorial/rollup-index.json").read_text())
    spec["spec"]["tuningConfig"] = {**spec["spec"].get("tuningConfig", {}),
                                    "shuffleQuotaBytes": 64 << 20,
                                    "shuffleQuotaPartials": 1000}
    monkeypatch.chdir(ROOT)
    secret = secrets.token_urlsafe(32).encode()
    with EmbeddedDaemon([tmp_path / "a"], free_space_reserve=0, signing_secrets=(secret,),
                        task_quota_bytes=1 << 30) as one, \
            EmbeddedDaemon([tmp_path / "b"], free_space_reserve=0,
                           signing_secrets=(secret,)) as two:
        # Without the secret (and without a token) the first request is refused: one clear
        # failure, nothing stored.
        with pytest.raises(Exception) as refused:
            run_ingestion(spec, shuffle_servers=[one, two], output_dir=str(tmp_path / "bad"))
        assert "token" in str(refused.value).lower() or "401" in str(refused.value)
        result = run_ingestion(spec, shuffle_servers=[one, two], output_dir=str(tmp_path / "out"),
                               signing_secret=secret)
        operator = mint(secret, "*", Scope.OPERATOR, 600)
        for url, operator_quota in ((one, 1 << 30), (two, 0)):
            with ShuffleClient(url, token=operator) as client:
                assert client.list_tasks()["files"] == 0  # the driver's DELETE (admin) ran
                # The spec's quotas were asked of every daemon by the driver's heartbeat;
                # the tighter of the two is in force.
                beat = client.heartbeat(result.task_id)
                assert beat["quota"] == {"bytes": min(64 << 20, operator_quota or 64 << 20),
                                         "partials": 1000}
    _, out = read_output(tmp_path / "out", "rollup-tutorial")
    documented = json.loads((ROOT / "examples/rollup-tutorial/expected-rows.json").read_text())
    assert out.num_rows == len(documented)
    assert sorted(out.column("__time").cast("int64").to_pylist()) == sorted(
        parse_instant(r["__time"]) for r in documented)


def test_a_task_over_its_quota_fails_the_ingestion_naming_it(spark: Any, tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch,
                                                             ) -> None:
    spec = json.loads((ROOT / "examples/rollup-tutorial/rollup-index.json").read_text())
    spec["spec"]["tuningConfig"] = {**spec["spec"].get("tuningConfig", {}),
                                    "shuffleQuotaBytes": 64}  # smaller than any partial
    monkeypatch.chdir(ROOT)
    with EmbeddedDaemon([tmp_path / "a"], free_space_reserve=0) as url:
        # Phase 1's task fails (Spark's own error, with the daemon's message in it): the
        # quota and the task are named, and the task report says FAILED.
        with pytest.raises(Exception) as failed:
            run_ingestion(spec, shuffle_servers=[url], output_dir=str(tmp_path / "out"))
        message = str(failed.value)
        assert "over its quota of 64" in message and "shuffleQuotaBytes" in message
        report = json.loads((tmp_path / "out/rollup-tutorial/task-report.json").read_text())
        assert report["status"] == "FAILED"
        with ShuffleClient(url) as client:
            assert client.list_tasks()["files"] == 0
