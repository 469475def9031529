"""Losing the only daemon in phase 2 is told as what it is (issue 39): the message said
"phase-1 uploads failed over from daemon to daemon" for a daemon SIGKILLed after the seal.
A real daemon process, killed by the test's hook between the seal and phase 2."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from shuffled.spark.driver.job import IngestionFailed
from tests.helpers.hooks import StopDaemons
from tests.helpers.ingestion import spark  # noqa: F401  (the shared session)
from tests.helpers.procs import DaemonProcess

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.spark


def test_the_only_daemon_lost_after_the_seal_is_named_for_phase_2(spark: Any,
                                                                 tmp_path: Path) -> None:
    from shuffled.spark import run_ingestion

    spec = json.loads((ROOT / "examples/rollup-tutorial/rollup-index.json").read_text())
    spec["spec"]["ioConfig"]["inputSource"]["baseDir"] = str(ROOT / "examples/rollup-tutorial")
    spec["spec"]["tuningConfig"]["shuffleRetrySeconds"] = 2
    daemon = DaemonProcess([tmp_path / "loc"], log_path=tmp_path / "daemon.log")
    daemon.start()
    try:
        with pytest.raises(IngestionFailed) as failed:
            run_ingestion(spec, shuffle_servers=[daemon.url], output_dir=str(tmp_path / "out"),
                          hooks=StopDaemons(sealed=[daemon.pid]), keepalive_seconds=0.5)
    finally:
        daemon.kill()
    message = failed.value.message
    assert "no shuffle daemon is left" in message and "during phase 2" in message, message
    assert "phase-1 uploads failed over" not in message, message
