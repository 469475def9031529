"""Round trips of every ShuffleClient method against a real shuffled daemon.

Needs the ``daemon_url`` fixture (tests/conftest.py): the base URL of a running daemon with
two temporary disk locations. Bodies are small Arrow IPC streams built with pyarrow.
"""

from __future__ import annotations

import http.client
import json
import urllib.parse
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest

from shuffled.client import RetryPolicy, ShuffleClient, crc32c_of
from shuffled.errors import BadRequest, DigestMismatch, NotFound
from shuffled.protocol import (
    CONTENT_DIGEST,
    REPR_DIGEST,
    Interval,
    PartialKey,
    PartitionKey,
    format_crc32c,
    parse_crc32c,
)

pytestmark = pytest.mark.daemon

INTERVAL = Interval.parse("2018-01-01T00:00:00Z", "2018-01-01T01:00:00Z")
OTHER_INTERVAL = Interval.parse("2018-01-01T01:00:00Z", "2018-01-01T02:00:00Z")
SCHEMA = pa.schema([("__time", pa.timestamp("ms", tz="UTC")), ("dim", pa.string()), ("count", pa.int64())])


def arrow_stream(rows: int, tag: str) -> bytes:
    """A small Arrow IPC stream of ``rows`` rows, in two record batches when rows > 1."""
    table = pa.table(
        {
            "__time": pa.array([1514764800000 + i for i in range(rows)], pa.timestamp("ms", tz="UTC")),
            "dim": [f"{tag}-{i % 3}" for i in range(rows)],
            "count": list(range(rows)),
        },
        schema=SCHEMA,
    )
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, SCHEMA) as writer:
        for batch in table.to_batches(max_chunksize=max(1, rows // 2)):
            writer.write_batch(batch)
    return sink.getvalue().to_pybytes()


def read_stream(data: bytes) -> pa.Table:
    return pa.ipc.open_stream(data).read_all()


@pytest.fixture
def client(daemon_url: str) -> Iterator[ShuffleClient]:
    policy = RetryPolicy(attempts=3, backoff=0.05, max_backoff=0.5, deadline=30.0)
    with ShuffleClient(daemon_url, retry=policy, timeout=30.0) as c:
        yield c


def _raw(daemon_url: str, method: str, key: PartialKey, headers: dict[str, str],
         body: bytes | None = None) -> tuple[int, dict[str, str], bytes]:
    """One request outside the client, to check the server side of the contract it relies on."""
    url = urllib.parse.urlsplit(daemon_url)
    conn = http.client.HTTPConnection(url.hostname or "127.0.0.1", url.port, timeout=30)
    try:
        target = url.path.rstrip("/") + key.path() + "?" + urllib.parse.urlencode(key.query())
        conn.request(method, target, body=body, headers=headers)
        resp = conn.getresponse()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
    finally:
        conn.close()


def test_health_and_status(client: ShuffleClient) -> None:
    assert client.health() is True
    status = client.status()
    assert isinstance(status, dict) and status


def test_put_get_round_trip(client: ShuffleClient, tmp_path: Path) -> None:
    key = PartialKey("it-roundtrip", "sub_0", INTERVAL, 0)
    body = arrow_stream(10, "a")
    result = client.put_partial(key, body)
    assert result["bytes"] == len(body)
    assert result["rows"] == 10

    assert client.get_partial(key) == body
    target = tmp_path / "p.arrow"
    with open(target, "wb") as out:
        assert client.get_partial_to(key, out) == len(body)
    assert target.read_bytes() == body
    assert read_stream(client.get_partial(key)).num_rows == 10


def test_put_replaces_the_same_key(client: ShuffleClient) -> None:
    key = PartialKey("it-replace", "sub_0", INTERVAL, 1)
    first = client.put_partial(key, arrow_stream(4, "old"))
    new = arrow_stream(6, "new")
    second = client.put_partial(key, memoryview(new))
    assert client.get_partial(key) == new
    if "generation" in first and "generation" in second:
        assert first["generation"] != second["generation"]


def test_get_partition_aggregates_and_filters_subtasks(client: ShuffleClient) -> None:
    sup = "it-aggregate"
    for i, rows in enumerate([3, 5, 7]):
        client.put_partial(PartialKey(sup, f"sub_{i}", INTERVAL, 2), arrow_stream(rows, f"s{i}"))
    client.put_partial(PartialKey(sup, "sub_0", INTERVAL, 9), arrow_stream(11, "other-partition"))
    client.put_partial(PartialKey(sup, "sub_0", OTHER_INTERVAL, 2), arrow_stream(13, "other-interval"))

    partition = PartitionKey(sup, INTERVAL, 2)
    whole = read_stream(client.get_partition(partition))
    assert whole.num_rows == 15
    assert whole.schema.equals(SCHEMA, check_metadata=False)
    assert sorted(whole.column("count").to_pylist()) == sorted([*range(3), *range(5), *range(7)])

    some = read_stream(client.get_partition(partition, ["sub_0", "sub_2"]))
    assert some.num_rows == 10
    assert {d.split("-")[0] for d in some.column("dim").to_pylist()} == {"s0", "s2"}


def test_task_admin_round_trip(client: ShuffleClient) -> None:
    sup = "it-admin"
    assert client.task(sup) is None
    client.put_partial(PartialKey(sup, "sub_0", INTERVAL, 0), arrow_stream(2, "x"))
    client.put_partial(PartialKey(sup, "sub_1", INTERVAL, 1), arrow_stream(3, "y"))

    task = client.task(sup)
    assert isinstance(task, dict)
    text = json.dumps(task)
    assert "sub_0" in text and "sub_1" in text

    listed = client.list_tasks()
    assert isinstance(listed, dict) and sup in json.dumps(listed)

    client.delete_task(sup)
    assert client.task(sup) is None
    with pytest.raises(NotFound):
        client.get_partial(PartialKey(sup, "sub_0", INTERVAL, 0))
    client.delete_task(sup)  # idempotent
    client.delete_task("it-never-held")
    assert sup not in json.dumps(client.list_tasks())


def test_missing_partial_is_not_found(client: ShuffleClient) -> None:
    with pytest.raises(NotFound):
        client.get_partial(PartialKey("it-missing", "sub_0", INTERVAL, 0))


def test_non_arrow_body_is_rejected_and_leaves_nothing(client: ShuffleClient) -> None:
    key = PartialKey("it-bad-body", "sub_0", INTERVAL, 0)
    with pytest.raises(BadRequest):
        client.put_partial(key, b"this is not an arrow stream")
    assert client.task("it-bad-body") is None


def test_server_rejects_a_wrong_content_digest(daemon_url: str, client: ShuffleClient) -> None:
    key = PartialKey("it-bad-digest", "sub_0", INTERVAL, 0)
    body = arrow_stream(3, "d")
    status, _, raw = _raw(daemon_url, "PUT", key, {
        "Content-Type": "application/vnd.apache.arrow.stream",
        CONTENT_DIGEST: format_crc32c(crc32c_of(body) ^ 1),
    }, body)
    assert status == 400
    assert json.loads(raw)["code"] == DigestMismatch.code
    with pytest.raises(NotFound):
        client.get_partial(key)


def test_server_range_contract_the_client_resumes_with(daemon_url: str, client: ShuffleClient) -> None:
    """The resume path needs: ETag + digest on 200; 206 + Content-Range + Repr-Digest on Range."""
    key = PartialKey("it-range", "sub_0", INTERVAL, 0)
    body = arrow_stream(50, "r")
    client.put_partial(key, body)
    crc = crc32c_of(body)

    status, headers, raw = _raw(daemon_url, "GET", key, {})
    assert status == 200 and raw == body
    assert parse_crc32c(headers.get("content-digest")) == crc
    etag = headers["etag"]

    start = len(body) // 3
    status, headers, raw = _raw(daemon_url, "GET", key, {"Range": f"bytes={start}-", "If-Range": etag})
    assert status == 206 and raw == body[start:]
    assert headers["content-range"] == f"bytes {start}-{len(body) - 1}/{len(body)}"
    assert parse_crc32c(headers.get(REPR_DIGEST.lower())) == crc

    status, _, raw = _raw(daemon_url, "GET", key, {"Range": f"bytes={start}-", "If-Range": '"stale"'})
    assert status == 200 and raw == body  # a stale validator gets the whole current file
