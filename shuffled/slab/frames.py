"""The framing of a batched shard read (``POST /tasks/{sup}/shards``), shared by the daemon
and the client. No pyarrow here: the client imports it.

The answer is, per shard asked, in order: a frame head ``<4s Q Q`` (magic ``SHSF``, the
body's length, its rows) and the body (one Arrow IPC stream, or nothing for no rows); then
``<4s I`` (magic ``SHSE``, the count of shard frames). A cut answer never ends with its
END frame, so a client never takes a partial answer for a whole one.
"""

from __future__ import annotations

import struct

SHARD = struct.Struct("<4sQQ")
END = struct.Struct("<4sI")
SHARD_MAGIC = b"SHSF"
END_MAGIC = b"SHSE"
MAX_SHARDS = 1000  # per request
MEDIA_TYPE = "application/vnd.shuffled.shards"


def shard_head(length: int, rows: int) -> bytes:
    return SHARD.pack(SHARD_MAGIC, length, rows)


def end(count: int) -> bytes:
    return END.pack(END_MAGIC, count)
