"""Slabs through a real daemon on loopback (docs/slab.md): what goes in comes out, by
shard, exactly once; what a client declares is checked; nothing is left on disk."""

from __future__ import annotations

from pathlib import Path

import sqlite3

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from shuffled.client import ShuffleClient
from shuffled.client.answers import json_dict
from shuffled.client.http import Request
from shuffled.errors import Conflict, InvalidBody
from shuffled.protocol import Interval
from shuffled.slab import build, frames, keys
from shuffled.slab.wire import CONTENT_TYPE, KeyKind
from tests.helpers.slabs import HOUR, make_slab, rows_table


def _sorted(t: pa.Table) -> list[tuple]:
    cols = ["__time", "dim", "user", "count"]
    return sorted(zip(*(t[c].to_pylist() for c in cols)))


def _chunk(t: pa.Table, c: int) -> pa.Table:
    return t.filter(pc.equal(pc.divide(t["__time"], HOUR), c))


@pytest.mark.parametrize("kind", [KeyKind.HASH, KeyKind.TUPLE])
def test_shards_partition_every_row_exactly_once(daemon_url: str, kind: KeyKind) -> None:
    sup = f"slab-{kind.name.lower()}"
    parts = [rows_table(3000, seed=s) for s in range(3)]
    with ShuffleClient(daemon_url) as client:
        for i, part in enumerate(parts):
            ack = client.put_slab(sup, make_slab(part, sub=f"s{i}", kind=kind))
            assert ack["new"] is True and ack["rows"] == 3000
        client.seal(sup, ["s0", "s1", "s2"])
        everything = pa.concat_tables(parts)
        if kind == KeyKind.HASH:
            bounds = [None, (1 << 30).to_bytes(4, "big"), (3 << 30).to_bytes(4, "big"), None]
        else:
            bounds = [None, keys.encode_tuple(["d15", None]), keys.encode_tuple(["d3", "u5"]),
                      None]
        for c in range(3):
            got = []
            for lo, hi in zip(bounds[:-1], bounds[1:]):
                read = client.read_shard(sup, Interval(c * HOUR, (c + 1) * HOUR), lo, hi)
                assert read.slabs == 3
                assert read.table is not None and read.rows == read.table.num_rows
                got.append(read.table)
            assert _sorted(pa.concat_tables(got)) == _sorted(_chunk(everything, c))
            assert all(t.num_rows for t in got)  # each range holds some rows: a real split


def test_a_slab_sent_again_is_stored_once(daemon_url: str) -> None:
    slab = make_slab(rows_table(500))
    with ShuffleClient(daemon_url) as client:
        assert client.put_slab("again", slab)["new"] is True
        assert client.put_slab("again", slab)["new"] is False
        other = make_slab(rows_table(500, seed=9))
        with pytest.raises(Conflict):
            client.put_slab("again", other)  # same (sub, slab, attempt), other bytes
        client.seal("again", ["sub0"])
        read = client.read_shard("again", Interval(0, HOUR), None, None)
        assert read.rows == _chunk(rows_table(500), 0).num_rows


def test_reads_take_the_sealed_subtasks_and_the_newest_attempt(daemon_url: str) -> None:
    first, retry, stray = rows_table(400, seed=1), rows_table(300, seed=2), rows_table(200, seed=3)
    with ShuffleClient(daemon_url) as client:
        client.put_slab("att", make_slab(first, sub="a", attempt=0))
        client.put_slab("att", make_slab(retry, sub="a", attempt=1))
        client.put_slab("att", make_slab(stray, sub="b"))
        with pytest.raises(Conflict):  # not sealed: no shard is served
            client.read_shard("att", Interval(0, HOUR), None, None)
        client.seal("att", ["a"])
        read = client.read_shard("att", Interval(0, HOUR), None, None)
        assert read.slabs == 1
        assert _sorted(read.table) == _sorted(_chunk(retry, 0))


def test_declared_sizes_are_checked_before_they_are_believed(daemon_url: str) -> None:
    slab = make_slab(rows_table(500))
    body = bytearray(b"".join(slab.parts()))
    with ShuffleClient(daemon_url) as client:
        # A data section longer than the bytes sent: refused, not waited for.
        bad = bytearray(body)
        bad[28:36] = (len(slab.data) + 10).to_bytes(8, "little")
        huge_index = bytearray(body)
        huge_index[12:20] = (1 << 40).to_bytes(8, "little")
        huge_header = bytearray(body)
        huge_header[8:12] = (1 << 31).to_bytes(4, "little")
        nulls = pa.table({"n": pa.nulls(1 << 22)})
        lying = build.build(nulls, np.zeros(1 << 22, np.int64), np.ones(1 << 22, np.int64),
                            kind=KeyKind.NONE, sub_task_id="s", slab_id=0, attempt=0,
                            batch_rows=1 << 22)
        assert len(lying.data) < 1000  # 4M rows declared in a few hundred bytes of data
        for raw, why in ((bytes(bad), "Content-Length"), (bytes(body[:-1]), "Content-Length"),
                         (b"SHS2" + bytes(body[4:]), "version"),
                         (bytes(huge_index), "index section of 1099511627776 bytes"),
                         (bytes(huge_header), "header section"),
                         (b"".join(lying.parts()), "declares 4194304 rows")):
            with pytest.raises(InvalidBody, match=why):
                client._http.request(Request("POST", "/druid/worker/v1/shuffle/tasks/hostile/slabs",
                                             body=raw, headers={"Content-Type": CONTENT_TYPE},
                                             handle=json_dict, what="hostile"))


def test_delete_leaves_nothing(daemon_url: str, tmp_path: Path) -> None:
    with ShuffleClient(daemon_url) as client:
        client.put_slab("gone", make_slab(rows_table(500)))
        client.seal("gone", ["sub0"])
        client.delete_task("gone")
    assert not (tmp_path / "emb0" / "gone").exists()
    assert not (tmp_path / "emb1" / "gone").exists()
    for root in (tmp_path / "emb0", tmp_path / "emb1"):
        conn = sqlite3.connect(root / ".shuffled" / "catalog.sqlite")
        try:
            assert conn.execute("SELECT COUNT(*) FROM slabs").fetchone()[0] == 0
        finally:
            conn.close()


def test_the_clients_constants_are_the_formats() -> None:
    """The client keeps pyarrow out of its import; its copies of the format's names agree."""
    from shuffled.client import slabs as client_slabs
    from shuffled.slab import wire

    assert client_slabs.CONTENT_TYPE == wire.CONTENT_TYPE
    assert client_slabs.KEY_COLUMN == keys.KEY_COLUMN


def test_a_batched_read_answers_as_the_single_reads_do(daemon_url: str) -> None:
    parts = [rows_table(2000, seed=s, chunks=5) for s in range(2)]
    with ShuffleClient(daemon_url) as client:
        for i, part in enumerate(parts):
            client.put_slab("many", make_slab(part, sub=f"s{i}"))
        client.seal("many", ["s0", "s1"])
        edges = [None, *((k << 26).to_bytes(4, "big") for k in range(1, 64)), None]
        # 5 chunks x 64 hash ranges, and a chunk with nothing: over the daemon's groups of
        # 64 and over one request's worth of frames per group.
        wanted = [(Interval(c * HOUR, (c + 1) * HOUR), lo, hi)
                  for c in range(6) for lo, hi in zip(edges[:-1], edges[1:])]
        many = client.read_shards("many", wanted)
        assert len(many) == len(wanted)
        for (interval, lo, hi), got in zip(wanted, many):
            one = client.read_shard("many", interval, lo, hi)
            assert (got.rows, got.slabs) == (one.rows, one.slabs)
            if one.table is None:
                assert got.table is None
            else:
                assert got.table.equals(one.table)
        total = sum(r.rows for r in many)
        assert total == sum(p.num_rows for p in parts)  # chunk 5 is empty: every row once


@pytest.mark.parametrize("trim", [False, True])
def test_a_batched_read_of_a_large_shard_is_whole(daemon_url: str, trim: bool) -> None:
    """A shard whose run of whole batches is more than the daemon gathers into a buffer
    (256 KiB) comes back whole from the batched read, either way it is framed. Untrimmed
    (Spark's reader), the answer's length is known before it starts: it has a
    Content-Length and the run goes by sendfile. Trimmed, the edge batches are decoded a
    group at a time, so the answer is chunked, and the run must not go out by sendfile
    past the chunk framing: it did, and the client read a garbled stream."""
    import http.client
    import json
    import urllib.parse

    part = rows_table(200_000, seed=3, chunks=1)
    with ShuffleClient(daemon_url) as client:
        client.put_slab("large", make_slab(part, sub="s0"))
        client.put_slab("large", make_slab(rows_table(300, seed=4, chunks=1), sub="s1"))
        client.seal("large", ["s0", "s1"])
        whole = Interval(0, HOUR)
        [got] = client.read_shards("large", [(whole, None, None)])
        one = client.read_shard("large", whole, None, None)
    assert got.rows == one.rows == part.num_rows + 300
    assert got.table is not None and one.table is not None and got.table.equals(one.table)
    assert got.table.nbytes > 4 * (256 << 10)
    url = urllib.parse.urlsplit(daemon_url)
    conn = http.client.HTTPConnection(url.hostname, url.port, timeout=30)
    try:
        body = json.dumps({"trim": trim, "shards": [
            {"start": "1970-01-01T00:00:00.000Z", "end": "1970-01-01T01:00:00.000Z"}] * 3})
        conn.request("POST", "/druid/worker/v1/shuffle/tasks/large/shards", body=body,
                     headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        raw = resp.read()
    finally:
        conn.close()
    assert resp.status == 200
    length = resp.getheader("Content-Length")
    if trim:
        assert length is None and resp.getheader("Transfer-Encoding") == "chunked"
    else:
        assert length == str(len(raw)) and resp.getheader("Transfer-Encoding") is None
    assert raw.endswith(frames.end(3))


def test_a_read_leaves_out_the_subtasks_it_names(daemon_url: str) -> None:
    """A supervisor that re-ran a subtask after losing a daemon names the superseded one
    in ``without`` (seals only grow: it stays sealed): its slabs are neither read nor
    counted, and a read without ``without`` still takes them (docs/slab.md)."""
    old, rerun, other = rows_table(400, seed=1), rows_table(400, seed=1), rows_table(300, seed=4)
    everything = [(Interval(0, HOUR), None, None)]
    with ShuffleClient(daemon_url) as client:
        client.put_slab("sup", make_slab(old, sub="p3-a7"))
        client.put_slab("sup", make_slab(other, sub="p1-a2"))
        client.seal("sup", ["p3-a7", "p1-a2"])
        client.put_slab("sup", make_slab(rerun, sub="p3-a9"))
        client.seal("sup", ["p3-a7", "p1-a2", "p3-a9"])
        both = client.read_shards("sup", everything)[0]
        assert both.slabs == 3  # the superseded one too: twice subtask 3's rows
        left_out = client.read_shards("sup", everything, without=["p3-a7"])[0]
        assert left_out.slabs == 2
        assert _sorted(left_out.table) == sorted(_sorted(_chunk(rerun, 0))
                                                 + _sorted(_chunk(other, 0)))
        assert client.read_shards("sup", everything)[0].slabs == 3  # per read, not kept


@pytest.mark.parametrize("without,why", [
    ("p3-a7", "without is a list"),
    ([7], "without is a list"),
    (["../etc"], "without"),
    (["x"] * 100_001, "at most 100000"),
])
def test_a_hostile_without_is_refused(daemon_url: str, without: object, why: str) -> None:
    import json

    from shuffled.errors import BadRequest

    body = json.dumps({"without": without, "shards": [
        {"start": "1970-01-01T00:00:00.000Z", "end": "1970-01-01T01:00:00.000Z"}]}).encode()
    with ShuffleClient(daemon_url) as client:
        client.put_slab("hostile-w", make_slab(rows_table(50)))
        client.seal("hostile-w", ["sub0"])
        with pytest.raises(BadRequest, match=why):
            client._http.request(Request(
                "POST", "/druid/worker/v1/shuffle/tasks/hostile-w/shards", body=body,
                headers={"Content-Type": "application/json"}, handle=json_dict, what="w"))


def test_the_daemon_loads_pyarrow_compute_only_when_slabs_are_read() -> None:
    """pyarrow.compute costs a daemon ~12 MiB of RSS at start (the soak holds the daemon
    under 150 MiB): the slab modules import it when a shard is first read."""
    import subprocess
    import sys

    code = ("import sys, shuffled.server.app; "
            "print('pyarrow.compute' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, check=True)
    assert out.stdout.strip() == "False"
