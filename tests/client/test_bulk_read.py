"""``POST /tasks/{sup}/partitions`` and ShuffleClient.get_partitions: many partitions read
with one request, each frame byte for byte what the aggregate GET of that partition sends.

Real daemons on loopback; an older daemon is a real one whose POST routes answer 404 as a
daemon before this route did (a middleware), and a cut answer goes through a real proxy.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client import CollectorRegistry

from shuffled import framing
from shuffled.client import ShuffleClient
from shuffled.crc import crc32c
from shuffled.errors import DigestMismatch, NotFound
from shuffled.protocol import Interval, PartialKey, PartitionKey
from shuffled.server import make_app
from shuffled.server.embedded import EmbeddedDaemon
from shuffled.server.routes.partitions import MAX_PARTITIONS
from tests.conftest import PREFIX, arrow_bytes, pack_files, pack_records, sample_table
from tests.helpers.clients import FAST, in_thread
from tests.helpers.cutting_proxy import CuttingProxy
from tests.helpers.procs import host_port

DAY = 86_400_000


def _key(day: int, pid: int = 0, sup: str = "r") -> PartitionKey:
    return PartitionKey(sup, Interval(day * DAY, (day + 1) * DAY), pid)


def _store(client: ShuffleClient, sup: str, days: int, subs: int = 2) -> None:
    items = [(PartialKey(sup, f"s{s}", _key(d, sup=sup).interval, 0),
              arrow_bytes(sample_table(20 + d, seed=d * 7 + s))) for d in range(days)
             for s in range(subs)]
    client.put_partials(sup, items)


def _frames(raw: bytes, sup: str) -> tuple[list[tuple[dict[str, Any], bytes]], int]:
    """The data frames (header, body) of an answer and its END count."""
    out, at = [], 0
    while True:
        frame = framing.parse_fixed(raw[at: at + framing.FIXED_LEN])
        at += framing.FIXED_LEN
        header = framing.parse_header(frame, raw[at: at + frame.header_len])
        at += frame.header_len
        if frame.end:
            assert at == len(raw), "bytes after the END frame"
            return out, framing.end_count(header)
        out.append((header, raw[at: at + frame.body_len]))
        at += frame.body_len


def _body(items: list[tuple[PartitionKey, list[str] | None]]) -> dict[str, Any]:
    return {"partitions": [
        {"start": k.interval.start_iso, "end": k.interval.end_iso, "partitionId": k.partition_id,
         **({"subTaskIds": subs} if subs is not None else {})} for k, subs in items]}


def test_each_frame_is_what_the_aggregate_get_sends(tmp_path: Path) -> None:
    with EmbeddedDaemon([tmp_path / "a", tmp_path / "b"], free_space_reserve=0) as url, \
            ShuffleClient(url) as client:
        _store(client, "r", 40)
        asked = [(_key(d), ["s1", "s0"] if d % 3 else None) for d in (5, 0, 39, 5, 17)]
        request = urllib.request.Request(
            f"{url}{PREFIX}/tasks/r/partitions", data=json.dumps(_body(asked)).encode(),
            headers={"Content-Type": "application/json"}, method="POST")
        with urllib.request.urlopen(request, timeout=30) as resp:
            assert resp.headers["Content-Type"] == framing.PARTITIONS_MEDIA_TYPE
            frames, count = _frames(resp.read(), "r")
        assert count == len(asked) == len(frames)
        for (k, subs), (header, body) in zip(asked, frames, strict=True):
            assert framing.partition_of("r", header) == (k, crc32c(body))
            single = client.get_partition(k, subs)
            assert body == single  # byte for byte, in the order asked
            assert header["partials"] == 2
            assert header["rows"] == pa.ipc.open_stream(body).read_all().num_rows
        # The client: the same bytes, in order, whatever the batch size.
        assert client.get_partitions("r", asked) == [client.get_partition(k, s) for k, s in asked]
        many = [(_key(d), None) for d in range(40)] * 8  # 320: two requests
        assert client.get_partitions("r", many) == [client.get_partition(k) for k, _ in many]


def test_large_partials_go_out_whole(tmp_path: Path) -> None:
    """Pieces over 256 KiB are sent by sendfile: the answer carries a Content-Length."""
    with EmbeddedDaemon([tmp_path / "a"], free_space_reserve=0) as url, \
            ShuffleClient(url) as client:
        big = [arrow_bytes(sample_table(60_000, seed=s)) for s in range(2)]
        assert min(map(len, big)) > 1 << 20
        for d in range(3):
            for s, body in enumerate(big):
                client.put_partial(PartialKey("r", f"s{s}", _key(d).interval, 0), body)
        asked = [(_key(d), None) for d in (2, 0, 1)]
        request = urllib.request.Request(
            f"{url}{PREFIX}/tasks/r/partitions", data=json.dumps(_body(asked)).encode(),
            headers={"Content-Type": "application/json"}, method="POST")
        with urllib.request.urlopen(request, timeout=30) as resp:
            raw = resp.read()
            assert int(resp.headers["Content-Length"]) == len(raw)
        frames, count = _frames(raw, "r")
        assert count == 3 and [b for _, b in frames] == [client.get_partition(k) for k, _ in asked]
        assert client.get_partitions("r", asked) == [b for _, b in frames]


def test_refusals_name_the_fault_and_stream_nothing(tmp_path: Path) -> None:
    with EmbeddedDaemon([tmp_path / "a"], free_space_reserve=0) as url, \
            ShuffleClient(url) as client:
        _store(client, "r", 3)

        def post(body: Any) -> tuple[int, dict[str, Any]]:
            data = body if isinstance(body, bytes) else json.dumps(body).encode()
            request = urllib.request.Request(f"{url}{PREFIX}/tasks/r/partitions", data=data,
                                             headers={"Content-Type": "application/json"},
                                             method="POST")
            try:
                with urllib.request.urlopen(request, timeout=30) as resp:
                    return resp.status, {}
            except urllib.error.HTTPError as exc:
                assert exc.headers["Content-Type"].startswith("application/json")
                return exc.code, json.loads(exc.read())

        good = _body([(_key(0), None)])["partitions"][0]
        for body, field in [
            (b"not json", "partitions"), ({"partitions": []}, "partitions"),
            ({"partitions": [good] * (MAX_PARTITIONS + 1)}, "partitions"),
            ({"partitions": [{**good, "partitionId": "x"}]}, "partitionId"),
            ({"partitions": [{**good, "subTaskIds": []}]}, "subTaskIds"),
            ({"partitions": [{**good, "start": "yesterday"}]}, None),
        ]:
            status, answer = post(body)
            assert status == 400, (body if isinstance(body, bytes) else str(body)[:80], answer)
            if field:
                assert answer.get("field") == field, answer
        status, answer = post(_body([(_key(0), None), (_key(9), None)]))
        assert status == 404 and "partition" in answer, answer  # nothing sent for day 0
        status, answer = post(_body([(_key(1), ["s0", "s9"])]))
        assert status == 404 and answer["missing"] == ["s9"], answer
        with pytest.raises(NotFound):
            client.get_partitions("r", [(_key(0), None), (_key(9), None)])
        with pytest.raises(ValueError):
            client.get_partitions("r", [(_key(0, sup="other"), None)])


def test_partitions_the_zero_copy_path_cannot_serve_are_read_alone(tmp_path: Path) -> None:
    with EmbeddedDaemon([tmp_path / "a"], free_space_reserve=0) as url, \
            ShuffleClient(url) as client:
        k = _key(0)
        wide = sample_table(10, seed=1).append_column("extra", pa.array(range(10)))
        client.put_partial(PartialKey("r", "s0", k.interval, 0), arrow_bytes(sample_table(10)))
        client.put_partial(PartialKey("r", "s1", k.interval, 0), arrow_bytes(wide))
        _store(client, "r", 1, subs=1)  # day 0 again for s0: replaced, still two schemas
        got = client.get_partitions("r", [(k, None), (_key(0), ["s0"])])
        assert got == [client.get_partition(k), client.get_partition(k, ["s0"])]
        assert pa.ipc.open_stream(got[0]).read_all().num_rows == 10 + 20


def test_a_corrupt_partial_is_named(tmp_path: Path) -> None:
    with EmbeddedDaemon([tmp_path / "a"], free_space_reserve=0) as url, \
            ShuffleClient(url, retry=FAST) as client:
        _store(client, "r", 2)
        (pack,) = pack_files(tmp_path / "a", "r")
        data = bytearray(pack.read_bytes())
        last = max(pack_records(pack)[-1].rows, key=lambda r: r.offset)  # written last
        assert last.sub == "s1" and last.start == _key(1).interval.start  # day 1, s1
        data[last.offset + 20] ^= 0xFF  # inside its body
        pack.write_bytes(bytes(data))
        assert client.get_partitions("r", [(_key(0), None)])  # day 0 is intact
        with pytest.raises(DigestMismatch) as caught:
            client.get_partitions("r", [(_key(0), None), (_key(1), None)])
        assert "s1" in str(caught.value.details.get("key")), caught.value.details


def test_an_answer_cut_midway_is_asked_for_again(tmp_path: Path) -> None:
    with EmbeddedDaemon([tmp_path / "a"], free_space_reserve=0) as url, \
            ShuffleClient(url) as direct:
        _store(direct, "r", 30)
        asked = [(_key(d), None) for d in range(30)]
        expected = [direct.get_partition(k) for k, _ in asked]
        proxy = CuttingProxy(host_port(url), cut=sum(map(len, expected)) // 2)
        try:
            with ShuffleClient(f"http://127.0.0.1:{proxy.port}", retry=FAST) as client:
                assert client.get_partitions("r", asked) == expected
            assert proxy.status_lines[0].startswith(b"HTTP/1.1 200")  # answered, then cut
            assert len(proxy.status_lines) >= 2
        finally:
            proxy.close()


async def test_an_older_daemon_is_read_partition_by_partition(settings: Any) -> None:
    @web.middleware
    async def no_bulk_read(request: web.Request, handler: Any) -> web.StreamResponse:
        if request.method == "POST" and request.path.endswith("/partitions"):
            raise web.HTTPNotFound()  # what a daemon before this route answers
        return await handler(request)

    app = make_app(settings, registry=CollectorRegistry())
    app.middlewares.insert(0, no_bulk_read)
    daemon = TestClient(TestServer(app, host="127.0.0.1"))
    await daemon.start_server()
    try:
        await in_thread(daemon, lambda c: _store(c, "r", 3))
        asked = [(_key(d), None) for d in (2, 0, 1)]
        got = await in_thread(daemon, lambda c: c.get_partitions("r", asked))
        singles = await in_thread(daemon, lambda c: [c.get_partition(k) for k, _ in asked])
        assert got == singles
    finally:
        await daemon.close()
