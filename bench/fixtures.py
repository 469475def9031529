"""Putting the same bytes in front of both servers (untimed set-up)."""

from __future__ import annotations

import shutil
from pathlib import Path

from bench import client, pyclient
from bench.daemon import Daemon
from bench.data import END, START, PartialFile, total
from shuffled.protocol import Interval


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
