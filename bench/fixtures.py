"""Putting the same bytes in front of both servers (untimed set-up)."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa

from bench import client, pyclient
from bench.daemon import Daemon
from bench.data import END, START, PartialFile, total
from shuffled.client import ShuffleClient
from shuffled.protocol import Interval
from shuffled.slab import build
from shuffled.slab.build import Slab
from shuffled.slab.wire import KeyKind


def upload(daemon: Daemon, sup: str, files: list[PartialFile], partition: int = 0,
           parallel: int = 4) -> client.Transfer:
    """PUT ``files`` into ``daemon`` as partial segments of one partition of task ``sup``."""
    pairs = [(daemon.partial_url(sup, f.sub, START, END, partition), f.path) for f in files]
    return client.put(pairs, parallel=parallel, expect_bytes=total(files))


def upload_bulk(daemon: Daemon, sup: str, files: list[PartialFile], partition: int = 0,
                ) -> float:
    """Store ``files`` as partials of one partition of task ``sup`` with ONE bulk upload
    (``ShuffleClient.put_partials``: they land in the task's pack); wall seconds."""
    subs = [f.sub for f in files]
    items = list(zip(pyclient.keys(sup, subs, Interval.parse(START, END), partition),
                     (f.path.read_bytes() for f in files)))
    return pyclient.put_bulk(daemon.url, sup, items)


def slab_of(files: list[PartialFile], interval: Interval) -> Slab:
    """The rows of ``files`` as ONE slab of chunk ``interval``, one batch per file (the
    shape a phase-1 flush of that many partials takes as a slab: docs/slab.md)."""
    tables = [pa.ipc.open_stream(f.path.read_bytes()).read_all() for f in files]
    rows = [t.num_rows for t in tables]
    table = pa.concat_tables(tables).combine_chunks()
    chunk = np.full(table.num_rows, interval.start, np.int64)
    partition = np.repeat(np.arange(len(rows), dtype=np.int32), rows)
    return build.build(table, chunk, chunk - interval.start + interval.end, kind=KeyKind.NONE,
                       sub_task_id="s0", slab_id=0, attempt=0, batch_rows=max(rows),
                       partition=partition)


def upload_slab(daemon: Daemon, sup: str, files: list[PartialFile]) -> str:
    """Store ``files`` as ONE slab of task ``sup``, seal it; the URL of its whole chunk."""
    interval = Interval.parse(START, END)
    pyclient.put_slab(daemon.url, sup, slab_of(files, interval))
    with ShuffleClient(daemon.url) as c:
        c.seal(sup, ["s0"])
    return f"{daemon.task_url(sup)}/shard?start={START}&end={END}"


def partial_urls(daemon: Daemon, sup: str, files: list[PartialFile], partition: int = 0,
                 ) -> list[str]:
    """Per-partial GET URLs of ``files`` as stored by :func:`upload`."""
    return [daemon.partial_url(sup, f.sub, START, END, partition) for f in files]


def mirror(root: Path, rel: str, files: list[PartialFile]) -> list[str]:
    """Copy ``files`` under ``root/rel`` (nginx's document root); their URL paths."""
    target = root / rel
    target.mkdir(parents=True, exist_ok=True)
    for f in files:
        shutil.copyfile(f.path, target / f.name)
    return [f"/{rel}/{f.name}" for f in files]
