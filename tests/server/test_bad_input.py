"""Bad input gets a clear 4xx JSON error and leaves nothing behind on disk."""

from __future__ import annotations

import pytest
from aiohttp.test_utils import TestClient
from yarl import URL

from shuffled.crc import crc32c
from shuffled.protocol import format_crc32c
from tests.conftest import DAY, PREFIX, arrow_bytes, files_under, sample_table

GOOD = arrow_bytes(sample_table(20))
QUERY = "start=2018-01-01&end=2018-01-02&partitionId=0"


def nothing_stored(settings) -> None:
    for loc in settings.locations:
        assert files_under(loc.path) == [], files_under(loc.path)


async def raw(client: TestClient, method: str, raw_path: str, **kwargs) -> tuple[int, object]:
    """Send ``raw_path`` exactly as written (no client-side normalisation)."""
    url = URL(str(client.make_url("/")).rstrip("/") + raw_path, encoded=True)
    async with client.session.request(method, url, **kwargs) as resp:
        body = await resp.json(content_type=None) if resp.status != 204 else None
        return resp.status, body


BAD_IDS = [
    "%2Fetc",  # slash
    "a%2Fb",
    "..",
    "%2e%2e",
    "%2e%2e%2fescape",
    ".hidden",
    "nul%00byte",
    "x" * 256,
    "%C3%A9t%C3%A9",  # unicode
    "sp%20ace",
    "pct%25",
]


@pytest.mark.parametrize("bad", BAD_IDS)
@pytest.mark.parametrize("where", ["sup", "sub"])
async def test_bad_ids_rejected(daemon: TestClient, settings, bad: str, where: str) -> None:
    sup, sub = (bad, "s1") if where == "sup" else ("sup", bad)
    status, body = await raw(daemon, "PUT", f"{PREFIX}/tasks/{sup}/{sub}/partition?{QUERY}",
                             data=GOOD)
    assert status in (400, 404), (status, body)  # 404: the path no longer matches a route
    assert isinstance(body, dict) and body["error"]
    status, body = await raw(daemon, "GET", f"{PREFIX}/tasks/{sup}/{sub}/partition?{QUERY}")
    assert status in (400, 404) and body["error"]
    nothing_stored(settings)


async def test_absolute_path_and_dot_segments_never_escape(daemon: TestClient, settings,
                                                           tmp_path) -> None:
    for path in (f"{PREFIX}/tasks/../../etc/s1/partition?{QUERY}",
                 f"{PREFIX}/tasks//etc/s1/partition?{QUERY}",
                 f"{PREFIX}/tasks/%2Ftmp%2Fx/s1/partition?{QUERY}"):
        status, body = await raw(daemon, "PUT", path, data=GOOD)
        assert 400 <= status < 500 and body["error"]
    nothing_stored(settings)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["loc0", "loc1"]


@pytest.mark.parametrize("query,field", [
    ("start=yesterday&end=2018-01-02&partitionId=0", "start"),
    ("start=&end=2018-01-02&partitionId=0", "start"),
    ("end=2018-01-02&partitionId=0", "start"),
    ("start=2018-01-01&partitionId=0", "end"),
    ("start=2018-01-02&end=2018-01-01&partitionId=0", "start"),
    ("start=2018-01-01&end=2018-01-01&partitionId=0", "start"),
    ("start=2018-01-01&end=2018-13-01&partitionId=0", "end"),
    ("start=2018-01-01&end=2018-01-02&partitionId=-1", "partitionId"),
    ("start=2018-01-01&end=2018-01-02&partitionId=1.5", "partitionId"),
    ("start=2018-01-01&end=2018-01-02&partitionId=abc", "partitionId"),
    ("start=2018-01-01&end=2018-01-02&partitionId=", "partitionId"),
    ("start=2018-01-01&end=2018-01-02", "partitionId"),
    ("start=2018-01-01&end=2018-01-02&partitionId=%2B1", "partitionId"),
    ("start=2018-01-01&end=2018-01-02&partitionId=99999999999", "partitionId"),
])
async def test_bad_interval_or_partition(daemon: TestClient, settings, query: str,
                                         field: str) -> None:
    for method, path in (("PUT", f"{PREFIX}/tasks/sup/s1/partition"),
                         ("GET", f"{PREFIX}/tasks/sup/s1/partition"),
                         ("GET", f"{PREFIX}/tasks/sup/partition")):
        status, body = await raw(daemon, method, f"{path}?{query}",
                                 data=GOOD if method == "PUT" else None)
        assert status == 400, (method, query, status, body)
        assert body["field"] == field, body
    nothing_stored(settings)


def _bodies() -> dict[str, bytes]:
    good = GOOD
    return {
        "empty": b"",
        "not arrow": b"{\"json\": true}" * 10,
        "truncated at end": good[:-8],
        "truncated mid-batch": good[: len(good) // 2],
        "trailing garbage": good + b"garbage!",
        "schema only, no eos": good[:16],
        "corrupt metadata": good[:8] + b"\x00" * 64 + good[72:],
    }


@pytest.mark.parametrize("name", list(_bodies()))
async def test_bad_bodies_rejected(daemon: TestClient, settings, name: str) -> None:
    body = _bodies()[name]
    resp = await daemon.put(f"{PREFIX}/tasks/sup/s1/partition", params={**DAY, "partitionId": 0},
                            data=body)
    assert resp.status == 400, (name, resp.status)
    info = await resp.json()
    assert info["code"] == "invalid_body" and info["error"]
    nothing_stored(settings)
    assert (await daemon.get(f"{PREFIX}/tasks/sup")).status == 404


async def test_digest_mismatch_and_malformed_digest(daemon: TestClient, settings) -> None:
    url = f"{PREFIX}/tasks/sup/s1/partition"
    params = {**DAY, "partitionId": 0}
    wrong = await daemon.put(url, params=params, data=GOOD,
                             headers={"Content-Digest": format_crc32c(crc32c(GOOD) ^ 1)})
    assert wrong.status == 400 and (await wrong.json())["code"] == "digest_mismatch"
    for header in ("crc32c=:notbase64!:", "crc32c=abc", "crc32c=:AAAA:"):
        bad = await daemon.put(url, params=params, data=GOOD, headers={"Content-Digest": header})
        assert bad.status == 400, header
    other_alg = await daemon.put(url, params=params, data=GOOD,
                                 headers={"Content-Digest": "sha-256=:AAAA:"})
    assert other_alg.status == 201  # only crc32c is checked; others are ignored
    await daemon.delete(f"{PREFIX}/tasks/sup")
    nothing_stored(settings)


async def test_wrong_content_type(daemon: TestClient, settings) -> None:
    resp = await daemon.put(f"{PREFIX}/tasks/sup/s1/partition", params={**DAY, "partitionId": 0},
                            data=GOOD, headers={"Content-Type": "application/json"})
    assert resp.status == 400 and (await resp.json())["field"] == "Content-Type"
    nothing_stored(settings)


async def test_body_over_limit_413(start_daemon, make_settings) -> None:
    settings = make_settings(max_partial_bytes=len(GOOD) - 1)
    client = await start_daemon(settings)
    params = {**DAY, "partitionId": 0}
    resp = await client.put(f"{PREFIX}/tasks/sup/s1/partition", params=params, data=GOOD)
    assert resp.status == 413 and (await resp.json())["limit"] == len(GOOD) - 1

    async def chunked():  # no Content-Length: the limit trips while streaming
        for i in range(0, len(GOOD), 100):
            yield GOOD[i:i + 100]

    resp = await client.put(f"{PREFIX}/tasks/sup/s1/partition", params=params, data=chunked())
    assert resp.status == 413
    nothing_stored(settings)
