"""The slab calls (docs/slab.md): a phase-1 flush stored as one slab, a shard read back.

``put_slab`` sends the slab with its Content-Length (its prefix names every section's
length, and the daemon holds it to that); it is idempotent by (subTaskId, slabId, attempt),
so a retry after a cut connection is safe. ``read_shard`` reads one shard of a chunk of a
sealed task from this daemon's slabs and checks the rows against the daemon's count.
"""

from __future__ import annotations

import http.client
import json
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from shuffled.client.answers import json_dict
from shuffled.client.http import Request, Transport
from shuffled.errors import CorruptData
from shuffled.protocol import ROWS_HEADER, Interval, format_instant, task_path, validate_id
from shuffled.slab import frames

if TYPE_CHECKING:  # pyarrow is imported by the calls that need it: the client alone does not
    import pyarrow as pa

    from shuffled.slab.build import Slab

SLABS_HEADER = "X-Shuffled-Slabs"
CONTENT_TYPE = "application/vnd.shuffled.slab"  # shuffled.slab.wire.CONTENT_TYPE
KEY_COLUMN = "__key"  # shuffled.slab.keys.KEY_COLUMN


@dataclass(frozen=True)
class SlabRead:
    """A shard's rows from one daemon (``__key`` dropped), and the daemon's counts."""

    table: pa.Table | None  # None: no rows, and no slab to take a schema from
    rows: int
    slabs: int


def put_slab(http_: Transport, supervisor_task_id: str, slab: Slab) -> dict[str, Any]:
    """``POST /tasks/{id}/slabs``: 201 stored, 200 held already with the same bytes."""
    sup = validate_id(supervisor_task_id, "supervisorTaskId")
    # The sections go out as they are: joining them copied the whole slab (tens of MB a
    # flush) for nothing.
    return http_.request(Request("POST", f"{task_path(sup)}/slabs", body=slab.parts(),
                                 headers={"Content-Type": CONTENT_TYPE}, handle=json_dict,
                                 what=f"slab of {sup}"))


def _decoded(data: bytes, rows: int, slabs: int,
             trim: tuple[bytes | None, bytes | None] | None = None,
             keys: bool = False) -> SlabRead:
    """The shard's rows; with ``trim`` (its key range) the rows of the edge batches the
    daemon sent whole that fall outside it are dropped here. ``keys``: ``__key`` is kept
    (each record batch a run of one slab, sorted by it) and nothing trimmed."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if not data:
        if rows:
            raise CorruptData(f"a shard of {rows} rows came with no body")
        return SlabRead(None, 0, slabs)
    try:
        # Not on Arrow's thread pool: a shard's stream is a few small batches, and handing
        # each to the pool cost 5x the decoding (185 -> 36 us a day chunk of 2 batches).
        table = pa.ipc.open_stream(pa.py_buffer(data), options=pa.ipc.IpcReadOptions(
            use_threads=False)).read_all()
    except (pa.ArrowInvalid, OSError) as exc:
        raise CorruptData(f"a shard's answer is not an Arrow stream: {exc}") from exc
    if table.num_rows != rows:
        raise CorruptData(f"a shard's answer holds {table.num_rows} rows; the daemon said "
                          f"{rows}")
    if not keys and trim is not None and KEY_COLUMN in table.column_names and \
            trim != (None, None):
        key = table.column(KEY_COLUMN)
        lo, hi = trim
        keep = None
        if lo is not None:
            keep = pc.greater_equal(key, pa.scalar(lo, pa.binary()))
        if hi is not None:
            below = pc.less(key, pa.scalar(hi, pa.binary()))
            keep = below if keep is None else pc.and_(keep, below)
        table = table.filter(keep)
        rows = table.num_rows
    if KEY_COLUMN in table.column_names and not keys:
        table = table.drop_columns([KEY_COLUMN])
    return SlabRead(table, rows, slabs)


def _shard(resp: http.client.HTTPResponse) -> SlabRead:
    return _decoded(resp.read(), int(resp.getheader(ROWS_HEADER) or 0),
                    int(resp.getheader(SLABS_HEADER) or 0))


def _exact(resp: http.client.HTTPResponse, n: int) -> bytes:
    data = resp.read(n)
    if len(data) != n:
        raise CorruptData(f"a batched shard read ended early ({len(data)} of {n} bytes): "
                          "the connection was cut")
    return data


def _shards(ranges: Sequence[tuple[bytes | None, bytes | None]], keys: bool = False,
            ) -> Callable[[http.client.HTTPResponse], list[SlabRead]]:
    count = len(ranges)

    def handle(resp: http.client.HTTPResponse) -> list[SlabRead]:
        slabs = int(resp.getheader(SLABS_HEADER) or 0)
        out: list[SlabRead] = []
        for _ in range(count):
            magic, length, rows = frames.SHARD.unpack(_exact(resp, frames.SHARD.size))
            if magic != frames.SHARD_MAGIC:
                raise CorruptData(f"a batched shard read has {magic!r} where a shard frame "
                                  "starts")
            out.append(_decoded(_exact(resp, length), rows, slabs, ranges[len(out)], keys))
        magic, got = frames.END.unpack(_exact(resp, frames.END.size))
        if magic != frames.END_MAGIC or got != count:
            raise CorruptData(f"a batched shard read ended with {magic!r} {got}, not the "
                              f"END of {count} shards")
        return out
    return handle


def read_shards(http_: Transport, supervisor_task_id: str,
                shards: Sequence[tuple[Interval, bytes | None, bytes | None]],
                without: Collection[str] = (), *, keys: bool = False) -> list[SlabRead]:
    """``POST /tasks/{id}/shards``: :func:`read_shard` of each shard, in order, up to
    :data:`~shuffled.slab.frames.MAX_SHARDS` per request (more are sent in several).
    ``without``: sealed subtasks left out (a supervisor recomputed them elsewhere, or
    they are read from another copy); ``keys``: each table keeps its ``__key`` column and
    the rows outside its range that the daemon sent whole with the edge batches, for the
    caller to cut it (:func:`shuffled.spark.phase2.keycut.cut`, slices; trimming here
    filtered every row, a copy of the whole read, for nothing when no row is outside)."""
    sup = validate_id(supervisor_task_id, "supervisorTaskId")
    out: list[SlabRead] = []
    left_out = sorted(without)
    for at in range(0, len(shards), frames.MAX_SHARDS):
        group = shards[at: at + frames.MAX_SHARDS]
        body = json.dumps({"trim": False, "without": left_out, "shards": [
            {"start": format_instant(iv.start), "end": format_instant(iv.end),
             "keyFrom": None if lo is None else lo.hex(),
             "keyTo": None if hi is None else hi.hex()} for iv, lo, hi in group]}).encode()
        out.extend(http_.request(Request(
            "POST", f"{task_path(sup)}/shards", body=body,
            headers={"Content-Type": "application/json"},
            handle=_shards([(lo, hi) for _, lo, hi in group], keys),
            what=f"{len(group)} shards of {sup}")))
    return out


def read_shard(http_: Transport, supervisor_task_id: str, interval: Interval,
               key_from: bytes | None, key_to: bytes | None) -> SlabRead:
    """``GET /tasks/{id}/shard``: the rows of chunk ``interval`` whose key is in
    ``[key_from, key_to)`` (None: unbounded)."""
    sup = validate_id(supervisor_task_id, "supervisorTaskId")
    query = [("start", format_instant(interval.start)), ("end", format_instant(interval.end))]
    if key_from is not None:
        query.append(("keyFrom", key_from.hex()))
    if key_to is not None:
        query.append(("keyTo", key_to.hex()))
    return http_.request(Request("GET", f"{task_path(sup)}/shard", query=query, handle=_shard,
                                 what=f"shard of {sup} {interval}"))
