"""The pipeline's read side over TLS with a CA bundle and a bearer token (no Spark needed:
phase 2's fetch builds its own clients from Phase2Config, as on an executor)."""

from __future__ import annotations

import secrets
from pathlib import Path

import pytest

from shuffled.client import ShuffleClient
from shuffled.errors import Unauthorized
from shuffled.protocol import Interval, PartialKey
from shuffled.server.embedded import EmbeddedDaemon
from shuffled.spark.phase2.fetch import fetch_batch
from shuffled.spark.phase2.merge import Assignment, Phase2Config
from tests.conftest import DAY, arrow_bytes, sample_table
from tests.helpers.tls import tls_files  # noqa: F401  (a per-run certificate fixture)


def test_phase2_reads_over_tls_with_ca_bundle_and_token(tmp_path: Path,
                                                        tls_files: tuple[Path, Path]) -> None:
    cert, key_file = tls_files
    token = secrets.token_urlsafe(24)
    interval = Interval.parse(DAY["start"], DAY["end"])
    with EmbeddedDaemon([tmp_path / "loc"], free_space_reserve=0, tls_cert=str(cert),
                        tls_key=str(key_file), auth_token=token) as url:
        assert url.startswith("https://")
        with ShuffleClient(url, token=token, ca_file=str(cert)) as client:
            for sub in ("s1", "s2"):
                client.put_partial(PartialKey("sup", sub, interval, 0),
                                   arrow_bytes(sample_table(40)))
        assignment = Assignment(interval.start, interval.end, 0, (((url,), ("s1", "s2"), 80),))
        cfg = Phase2Config("sup", layout=None, segment_dir=str(tmp_path),  # type: ignore[arg-type]
                           token=token, ca_file=str(cert))
        clients: dict[str, ShuffleClient] = {}
        try:
            (tables,) = fetch_batch(clients, cfg, [assignment])  # a batch of one partition
        finally:
            for c in clients.values():
                c.close()
        assert sum(t.num_rows for t in tables) == 80
        wrong = Phase2Config("sup", layout=None, segment_dir=str(tmp_path),  # type: ignore[arg-type]
                             token="wrong", ca_file=str(cert))
        clients = {}
        with pytest.raises(Unauthorized):
            fetch_batch(clients, wrong, [assignment])
        for c in clients.values():
            c.close()
