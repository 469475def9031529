"""ShuffleClient.put_partials: streaming while the caller produces, resending a cut batch,
retrying passing rejections, raising the others, falling back to PUTs on an older daemon.

Real daemons on loopback, except where a scripted bulk route (a small aiohttp app decoding
frames with shuffled.framing) is the only way to make the daemon answer a given rejection.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client import CollectorRegistry

from shuffled.client import ShuffleClient
from shuffled.client.http import NO_RETRY
from shuffled.crc import crc32c
from shuffled.errors import (
    DigestMismatch, InvalidBody, LocationFailed, Overloaded, Unauthorized,
)
from shuffled.protocol import PartialKey
from shuffled.server import make_app
from shuffled.server.embedded import EmbeddedDaemon
from tests.conftest import (
    PREFIX, arrow_bytes, data_size, pack_files, packed_size, sample_table,
)
from tests.helpers.bulk import frames_of, get, key, partials
from tests.helpers.clients import FAST, in_thread
from tests.helpers.procs import host_port


def held(client: ShuffleClient, sup: str) -> int:
    """How many partials of ``sup`` the daemon serves."""
    task = client.task(sup)
    return sum(len(p["subTasks"]) for p in task["partitions"]) if task else 0


def test_each_frame_travels_while_the_caller_produces_the_next(tmp_path: Path) -> None:
    # Small partials: neither the client's ~1 MiB chunks nor the daemon's 1 MiB gathering
    # may hold a partial back until more arrive.
    bodies = [arrow_bytes(sample_table(20 + i, seed=i)) for i in range(5)]
    seen: list[int] = []
    with EmbeddedDaemon([tmp_path / "a"], free_space_reserve=0) as url:
        with ShuffleClient(url) as client, ShuffleClient(url) as watcher:
            def produce() -> Iterator[tuple[PartialKey, bytes]]:
                for i, body in enumerate(bodies):
                    deadline = time.monotonic() + 20
                    while held(watcher, "lazy") < i and time.monotonic() < deadline:
                        time.sleep(0.01)  # poll interval of a bounded wait
                    seen.append(held(watcher, "lazy"))  # stored before this one is made
                    yield key(f"s{i}", "lazy"), body

            answers = client.put_partials("lazy", produce())
            assert seen == [0, 1, 2, 3, 4]
            assert [a["status"] for a in answers] == ["created"] * 5
            for i, body in enumerate(bodies):
                assert client.get_partial(key(f"s{i}", "lazy")) == body


def test_round_trip_of_large_partials_and_refusals(tmp_path: Path) -> None:
    bodies = [arrow_bytes(sample_table(30_000, seed=i)) for i in range(6)]  # ~0.5 MiB each
    with EmbeddedDaemon([tmp_path / "a", tmp_path / "b"], free_space_reserve=0) as url:
        with ShuffleClient(url) as client:
            answers = client.put_partials("big", ((key(f"s{i}", "big"), b)
                                                  for i, b in enumerate(bodies)))
            assert [(a["bytes"], a["crc32c"]) for a in answers] == [
                (len(b), f"{crc32c(b):08x}") for b in bodies]
            for i, body in enumerate(bodies):
                assert client.get_partial(key(f"s{i}", "big")) == body
            again = client.put_partials("big", [(key("s0", "big"), bodies[1])])
            assert again[0]["status"] == "replaced"
            assert client.get_partial(key("s0", "big")) == bodies[1]
            bad = bytearray(bodies[0])
            bad[-1] ^= 1  # breaks the end-of-stream marker: not an Arrow stream
            with pytest.raises(InvalidBody):
                client.put_partials("big", [(key("bad", "big"), bytes(bad))])


def test_nothing_is_sent_for_nothing_and_foreign_keys_are_refused_first() -> None:
    with socket.create_server(("127.0.0.1", 0)) as closed:
        port = closed.getsockname()[1]
    with ShuffleClient(f"http://127.0.0.1:{port}", retry=NO_RETRY) as client:
        assert client.put_partials("sup", []) == []
        assert client.put_partials("sup", iter(())) == []
        with pytest.raises(ValueError, match="does not belong"):
            client.put_partials("sup", [(key("s", "other"), b"x")])


def test_auth_token_is_sent(tmp_path: Path) -> None:
    items = partials("auth", 2)
    with EmbeddedDaemon([tmp_path / "a"], free_space_reserve=0, auth_token="s3cret") as url:
        with ShuffleClient(url, token="s3cret") as client:
            assert len(client.put_partials("auth", items)) == 2
        with ShuffleClient(url) as anonymous, pytest.raises(Unauthorized):
            anonymous.put_partials("auth", items)


class RequestCutProxy:
    """A loopback TCP proxy whose FIRST connection is cut (both ways) after ``cut`` bytes of
    the request; later connections pass everything."""

    def __init__(self, upstream: tuple[str, int], cut: int) -> None:
        self.upstream, self.cut = upstream, cut
        self.server = socket.create_server(("127.0.0.1", 0))
        self.server.settimeout(0.2)
        self.port = self.server.getsockname()[1]
        self.connections = 0
        self._sockets: list[socket.socket] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.server.accept()
            except TimeoutError:
                continue
            up = socket.create_connection(self.upstream, timeout=30)
            self._sockets += [conn, up]
            limit = self.cut if self.connections == 0 else None
            self.connections += 1
            for args in ((conn, up, limit), (up, conn, None)):
                threading.Thread(target=self._pipe, args=args, daemon=True).start()

    @staticmethod
    def _pipe(src: socket.socket, dst: socket.socket, limit: int | None) -> None:
        sent = 0
        try:
            while data := src.recv(65536):
                if limit is not None and sent + len(data) >= limit:
                    dst.sendall(data[: limit - sent])
                    for s in (src, dst):  # the cut: both ends see the connection drop
                        s.shutdown(socket.SHUT_RDWR)
                    return
                dst.sendall(data)
                sent += len(data)
            dst.shutdown(socket.SHUT_WR)
        except OSError:
            pass

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self.server.close()
        for s in self._sockets:
            s.close()


def test_a_batch_cut_while_sending_is_sent_again_whole(tmp_path: Path) -> None:
    items = [(key(f"s{i}", "recut", pid=i), arrow_bytes(sample_table(300, seed=i)))
             for i in range(5)]
    with EmbeddedDaemon([tmp_path / "a"], free_space_reserve=0) as url:
        proxy = RequestCutProxy(host_port(url), cut=len(items[0][1]) * 2 + 500)
        try:
            with ShuffleClient(f"http://127.0.0.1:{proxy.port}", retry=FAST) as client:
                answers = client.put_partials("recut", iter(items))
                assert proxy.connections == 2
                assert {a["status"] for a in answers} <= {"created", "replaced"}
                for k, body in items:
                    assert client.get_partial(k) == body
        finally:
            proxy.close()


def test_a_batch_whose_answer_was_cut_is_sent_again(tmp_path: Path) -> None:
    from tests.helpers.cutting_proxy import CuttingProxy

    items = partials("resend", 5)
    with EmbeddedDaemon([tmp_path / "a"], free_space_reserve=0) as url:
        host, port = url.removeprefix("http://").rsplit(":", 1)
        proxy = CuttingProxy((host, int(port)), cut=400)  # inside the JSON answer
        try:
            with ShuffleClient(f"http://127.0.0.1:{proxy.port}") as client:
                answers = client.put_partials("resend", items)
                assert [a["status"] for a in answers] == ["replaced"] * 5  # the second try
                assert proxy.status_lines[0].startswith(b"HTTP/1.1 200")  # answered, then cut
                for k, body in items:
                    assert client.get_partial(k) == body
        finally:
            proxy.close()
        packs = pack_files(tmp_path / "a", "resend")  # the first try's bytes stay until the
        assert sum(data_size(p) for p in packs) == packed_size(  # task goes
            [b for _, b in items] * 2, len(packs))


# --- against a scripted bulk route ------------------------------------------------------------

Script = Callable[[int, int, PartialKey], dict[str, Any] | None]


async def scripted(script: Script) -> tuple[TestClient, list[list[PartialKey]]]:
    """A bulk route storing nothing that answers each frame per ``script(call, index, key)``
    (an item to answer, or None: "created" with the right CRC and size)."""
    calls: list[list[PartialKey]] = []

    async def post(request: web.Request) -> web.Response:
        sup = request.match_info["sup"]
        frames = [f for f in frames_of(await request.read(), sup) if f[0] is not None]
        calls.append([k for k, _, _ in frames])
        items = []
        for i, (k, crc, body) in enumerate(frames):
            assert k is not None
            base = {"subTaskId": k.sub_task_id, "start": k.interval.start_iso,
                    "end": k.interval.end_iso, "partitionId": k.partition_id}
            items.append({**base, **(script(len(calls) - 1, i, k) or {
                "status": "created", "bytes": len(body), "rows": 1,
                "crc32c": f"{crc:08x}", "generation": 1})})
        return web.json_response({"supervisorTaskId": sup, "complete": True,
                                  "count": len(items), "stored": 0, "rejected": 0,
                                  "partials": items})

    app = web.Application()
    app.router.add_post(f"{PREFIX}/tasks/{{sup}}/partials", post)
    server = TestClient(TestServer(app, host="127.0.0.1"))
    await server.start_server()
    return server, calls


def rejected(code: str, status: int) -> dict[str, Any]:
    return {"status": "rejected", "error": {"error": f"scripted {code}", "code": code,
                                            "status": status}}


async def test_passing_rejections_are_sent_again_alone() -> None:
    server, calls = await scripted(
        lambda call, i, k: rejected("location_failed", 507) if call == 0 and i == 1 else None)
    items = partials("p", 3)
    answers = await in_thread(server, lambda c: c.put_partials("p", items))
    assert [a["status"] for a in answers] == ["created"] * 3
    assert calls == [[k for k, _ in items], [items[1][0]]]
    await server.close()


async def test_rejections_that_keep_failing_or_cannot_pass_raise() -> None:
    server, calls = await scripted(lambda call, i, k: rejected("overloaded", 503))
    with pytest.raises(Overloaded):
        await in_thread(server, lambda c: c.put_partials("p", partials("p", 2)))
    assert len(calls) == FAST.attempts
    await server.close()
    server, calls = await scripted(
        lambda call, i, k: rejected("digest_mismatch", 400) if i == 1 else None)
    with pytest.raises(DigestMismatch):
        await in_thread(server, lambda c: c.put_partials("p", partials("p", 3)))
    assert len(calls) == 1
    await server.close()
    server, _ = await scripted(lambda call, i, k: rejected("location_failed", 507))
    with pytest.raises(LocationFailed):
        await in_thread(server, lambda c: c.put_partials("p", partials("p", 1)))
    await server.close()


async def test_a_stored_digest_that_differs_from_the_sent_one_raises() -> None:
    server, _ = await scripted(lambda call, i, k: {"status": "created", "bytes": 1, "rows": 1,
                                                   "crc32c": "00000000", "generation": 1})
    with pytest.raises(DigestMismatch):
        await in_thread(server, lambda c: c.put_partials("p", partials("p", 1)))
    await server.close()


async def test_falls_back_to_puts_on_an_older_daemon(settings) -> None:
    @web.middleware
    async def no_bulk_route(request: web.Request, handler: Any) -> web.StreamResponse:
        if request.method == "POST":  # what a daemon before bulk upload answers
            raise web.HTTPNotFound(text=json.dumps({"error": "no route", "code": "not_found"}),
                                   content_type="application/json")
        return await handler(request)

    app = make_app(settings, registry=CollectorRegistry())
    app.middlewares.insert(0, no_bulk_route)
    daemon = TestClient(TestServer(app, host="127.0.0.1"))
    await daemon.start_server()
    items = partials("old", 3)
    answers = await in_thread(daemon, lambda c: c.put_partials("old", iter(items)))
    assert [a["bytes"] for a in answers] == [len(b) for _, b in items]
    for k, body in items:
        assert await get(daemon, k) == (200, body)
    await daemon.close()


@pytest.mark.parametrize("lazy", [False, True])
def test_more_partials_than_an_upload_may_carry_go_as_several(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, lazy: bool) -> None:
    """A daemon takes at most ``max_bulk_partials`` partials an upload (413 past it): the
    client sends at most :data:`BULK_PARTIALS` an upload, so 250 partials against a bound
    of 100 go as three uploads, answered in order, from a list or a generator alike."""
    monkeypatch.setattr("shuffled.client.bulk.BULK_PARTIALS", 100)
    body = arrow_bytes(sample_table(3, seed=1))
    items = [(key(f"s{i:03d}", "many"), body) for i in range(250)]
    with EmbeddedDaemon([tmp_path / "a"], free_space_reserve=0, max_bulk_partials=100) as url:
        with ShuffleClient(url) as client:
            answers = client.put_partials("many", iter(items) if lazy else items)
            assert [a["subTaskId"] for a in answers] == [k.sub_task_id for k, _ in items]
            assert {a["status"] for a in answers} == {"created"}
            assert held(client, "many") == 250
