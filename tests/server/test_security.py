"""Access control: bearer token (generated per run) and TLS with a per-run certificate."""

from __future__ import annotations

import secrets
from pathlib import Path

import pytest

from shuffled.client import ShuffleClient
from shuffled.client.http import NO_RETRY
from shuffled.errors import Unauthorized
from shuffled.protocol import Interval, PartialKey
from shuffled.server.embedded import EmbeddedDaemon
from tests.conftest import DAY, PREFIX, arrow_bytes, sample_table
from tests.helpers.tls import tls_files  # noqa: F401  (a per-run certificate fixture)


async def test_bearer_token_required_except_health(start_daemon, make_settings) -> None:
    token = secrets.token_urlsafe(24)
    client = await start_daemon(make_settings(auth_token=token))
    assert (await client.get("/status/health")).status == 200
    assert (await client.get("/metrics")).status == 200  # open unless metrics_require_auth
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": f"Basic {token}"}):
        resp = await client.get(f"{PREFIX}/tasks", headers=headers)
        assert resp.status == 401
        assert (await resp.json())["code"] == "unauthorized"
        assert resp.headers["WWW-Authenticate"].startswith("Bearer")
        put = await client.put(f"{PREFIX}/tasks/s/x/partition", params={**DAY, "partitionId": 0},
                               data=arrow_bytes(sample_table(3)), headers=headers)
        assert put.status == 401
    ok = await client.get(f"{PREFIX}/tasks", headers={"Authorization": f"Bearer {token}"})
    assert ok.status == 200 and (await ok.json())["files"] == 0


async def test_metrics_can_require_auth(start_daemon, make_settings) -> None:
    token = secrets.token_urlsafe(24)
    client = await start_daemon(make_settings(auth_token=token, metrics_require_auth=True))
    assert (await client.get("/metrics")).status == 401
    assert (await client.get("/metrics", headers={"Authorization": f"Bearer {token}"})).status == 200


def test_tls_with_ca_bundle_and_token(tmp_path: Path, tls_files: tuple[Path, Path]) -> None:
    cert, key = tls_files
    token = secrets.token_urlsafe(24)
    with EmbeddedDaemon([tmp_path / "loc"], free_space_reserve=0, tls_cert=str(cert),
                        tls_key=str(key), auth_token=token) as url:
        assert url.startswith("https://127.0.0.1:")
        key_ = PartialKey("sup", "s1", Interval.parse(DAY["start"], DAY["end"]), 0)
        body = arrow_bytes(sample_table(100))
        with ShuffleClient(url, token=token, ca_file=str(cert)) as client:
            client.put_partial(key_, body)
            assert client.get_partial(key_) == body
        with ShuffleClient(url, token="wrong", ca_file=str(cert)) as bad:
            with pytest.raises(Unauthorized):
                bad.list_tasks()
        with ShuffleClient(url, token=token, retry=NO_RETRY) as untrusted:  # no CA: fails
            with pytest.raises(Exception):
                untrusted.list_tasks()
