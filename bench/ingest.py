"""Comparison 3: ingest, streamed PUT of one large and of many small partial segments, and
the many small ones in ONE bulk upload.

Large (256 MiB, curl): the daemon with fsync on (the default: durable before the answer)
vs ``dd conv=fdatasync`` of the same bytes to the same disk; with ``--fsync false`` vs
nginx WebDAV PUT (nginx never fsyncs).

Small (1,000 x 64 KiB), durable: single PUTs by shuffled's Python client, ``put_parallel``
threads each with its own ``ShuffleClient`` (as phase-1 tasks would), vs a write+fdatasync
loop (one process: ``os.open``/``os.write``/``os.fdatasync``/``os.close`` per file, one
after the other, in a fresh directory; 1,000 dd processes would measure process start-up,
not the disk); and ALL of them in ONE bulk upload (``ShuffleClient.put_partials``, fsync
on) vs ``dd conv=fdatasync`` of the same 64 MiB as one file. Not durable: curl PUTs,
``put_parallel`` in flight, to the daemon with fsync off vs nginx WebDAV PUT.

Both Python sides start from bodies already in memory. Each sample starts with ``sync``
(untimed) so dirty pages left by the previous sample are not charged to the next, and its
output is deleted afterwards. There is no warm-up sample: every sample writes new files,
and the alternation spreads whatever the first ones pay over all sides.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow as pa

from bench import client, pyclient
from bench.context import Ctx
from bench.daemon import Daemon
from bench.data import END, START, PartialFile, total, write_partials
from bench.peers import Nginx
from bench.procs import Tree
from bench.stats import Result, absolute, alternate, compare, median
from shuffled.protocol import Interval
from shuffled.slab import build
from shuffled.slab.wire import KeyKind

INTERVAL = Interval.parse(START, END)

Sample = Callable[[], dict[str, float]]


def _timed(run: Callable[[], None], nbytes: int, after: Callable[[], None],
           tree: Callable[[], Tree] | None = None) -> Sample:
    """A sample: ``sync``, time ``run`` (MB/s of ``nbytes``; with ``tree``, the server's CPU
    seconds per GB), then ``after`` untimed."""
    def sample() -> dict[str, float]:
        os.sync()
        cpu0 = tree().cpu() if tree else 0.0
        began = time.perf_counter()
        run()
        seconds = time.perf_counter() - began
        cpu = tree().cpu() - cpu0 if tree else 0.0
        after()
        return {"mbps": nbytes / seconds / 1e6, "seconds": seconds,
                "cpu_per_gb": cpu / (nbytes / 1e9)}
    return sample


def _dd(files: list[PartialFile], out: Path) -> None:
    """The baseline for the large PUT: ``dd conv=fdatasync`` of each file."""
    for i, f in enumerate(files):
        subprocess.run(["dd", f"if={f.path}", f"of={out / f'x{i}'}", "bs=1M",
                        "conv=fdatasync", "status=none"], check=True, timeout=300)


def _fdatasync_loop(bodies: list[bytes], out: Path) -> None:
    """The baseline for durable small PUTs: one file after the other, each fdatasynced."""
    for i, data in enumerate(bodies):
        fd = os.open(out / f"x{i}", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.write(fd, data)
            os.fdatasync(fd)
        finally:
            os.close(fd)


def _dd_one(joined: Path, out: Path) -> None:
    """The baseline for the bulk upload: the same bytes as one file, ``dd conv=fdatasync``."""
    subprocess.run(["dd", f"if={joined}", f"of={out / 'all'}", "bs=1M", "conv=fdatasync",
                    "status=none"], check=True, timeout=300)


def _clear(path: Path) -> Callable[[], None]:
    """A clean-up emptying ``path`` (kept as a fresh empty directory)."""
    def clear() -> None:
        shutil.rmtree(path, ignore_errors=True)
        path.mkdir(parents=True, exist_ok=True)
    return clear


SLAB_UPLOADS = 4  # slab uploads per sample of comparison 3's slab row


class _Shuffled:
    """Uploads to a daemon under a fresh supervisor task per sample, deleted afterwards."""

    def __init__(self, daemon: Daemon, files: list[PartialFile], parallel: int) -> None:
        self.daemon, self.files, self.parallel = daemon, files, parallel
        self.bodies = [f.path.read_bytes() for f in files]
        self.slab_bytes: build.Slab | None = None
        self.n = 0

    def _sup(self) -> str:
        """A new supervisor task id for the next sample."""
        self.n += 1
        return f"bench-ingest-{self.n}"

    def _items(self, sup: str) -> list[pyclient.Item]:
        """(key, body) of every file under task ``sup``."""
        subs = [f.sub for f in self.files]
        return list(zip(pyclient.keys(sup, subs, INTERVAL), self.bodies))

    def curl(self) -> None:
        """curl PUTs, ``parallel`` in flight (streamed from the files)."""
        sup = self._sup()
        pairs = [(self.daemon.partial_url(sup, f.sub, START, END, 0), f.path) for f in self.files]
        client.put(pairs, parallel=self.parallel, expect_bytes=total(self.files))

    def threads(self) -> None:
        """Single PUTs by ``parallel`` threads, each with its own ShuffleClient."""
        pyclient.put_threads(self.daemon.url, self._items(self._sup()), self.parallel)

    def bulk(self) -> None:
        """Every partial in ONE ``put_partials`` request."""
        sup = self._sup()
        pyclient.put_bulk(self.daemon.url, sup, self._items(sup))

    def slab(self) -> None:
        """The same rows as ONE slab (docs/slab.md): one batch per partial, one request."""
        pyclient.put_slab(self.daemon.url, self._sup(), self.prepare_slab())

    def slabs(self) -> None:
        """:meth:`slab`, :data:`SLAB_UPLOADS` times (each under a task of its own): one
        64 MiB upload is ~6 clock ticks of daemon CPU, too few to measure CPU per GB by."""
        for _ in range(SLAB_UPLOADS):
            self.slab()

    def after_slabs(self) -> None:
        """Delete the last :meth:`slabs` sample's tasks (untimed)."""
        for i in range(self.n - SLAB_UPLOADS + 1, self.n + 1):
            pyclient.delete(self.daemon.url, f"bench-ingest-{i}")

    def prepare_slab(self) -> build.Slab:
        """The slab, built once (before the timed samples: the client's work, not the
        daemon's)."""
        if self.slab_bytes is None:
            tables = [pa.ipc.open_stream(b).read_all() for b in self.bodies]
            rows = [t.num_rows for t in tables]
            table = pa.concat_tables(tables).combine_chunks()
            chunk = np.zeros(table.num_rows, np.int64)
            # One batch per partial: the cuts fall where the partials end.
            partition = np.repeat(np.arange(len(rows), dtype=np.int32), rows)
            self.slab_bytes = build.build(
                table, chunk, chunk + 1, kind=KeyKind.NONE, sub_task_id="s", slab_id=0,
                attempt=0, batch_rows=max(rows), partition=partition)
        return self.slab_bytes

    def after(self) -> None:
        """Delete the last sample's task (untimed)."""
        pyclient.delete(self.daemon.url, f"bench-ingest-{self.n}")


def _nginx_put(url: str, files: list[PartialFile], parallel: int) -> Callable[[], None]:
    """A side: curl PUTs of ``files`` to nginx WebDAV, ``parallel`` in flight."""
    def run() -> None:
        client.put([(f"{url}/put/{f.name}", f.path) for f in files], parallel=parallel,
                   expect_bytes=total(files))
    return run


def _large(ctx: Ctx, files: list[PartialFile], durable: Daemon, fast: Daemon, n: Nginx,
           base: Path) -> list[Result]:
    """One large partial, curl: fsync on vs dd, fsync off vs nginx WebDAV."""
    s, nbytes, dd_dir = ctx.sizes, total(files), base / "dd"
    ours_d, ours_f = _Shuffled(durable, files, 1), _Shuffled(fast, files, 1)
    _clear(dd_dir)()
    got = alternate({
        "durable": _timed(ours_d.curl, nbytes, ours_d.after, lambda: durable.tree),
        "dd": _timed(lambda: _dd(files, dd_dir), nbytes, _clear(dd_dir)),
        "nofsync": _timed(ours_f.curl, nbytes, ours_f.after),
        "webdav": _timed(_nginx_put(n.url, files, 1), nbytes, _clear(n.root / "put")),
    }, s.repeats)
    what = f"{nbytes >> 20} MiB"
    common = {"bytes": nbytes, "files": 1, "repeats": s.repeats, "samples": got}
    return [
        compare("ingest_large_durable", f"3. PUT {what}, fsync on vs dd conv=fdatasync",
                median(got["durable"]["mbps"]), median(got["dd"]["mbps"]), "MB/s", ">=", 0.8,
                **common),
        compare("ingest_large_nofsync", f"3. PUT {what}, fsync off vs nginx WebDAV PUT",
                median(got["nofsync"]["mbps"]), median(got["webdav"]["mbps"]), "MB/s", ">=",
                0.8, **common),
    ]


def _small(ctx: Ctx, files: list[PartialFile], durable: Daemon, fast: Daemon, n: Nginx,
           base: Path) -> list[Result]:
    """Many small partials: Python-client PUTs and one bulk upload (fsync on) vs the
    fdatasync loop and dd; curl PUTs with fsync off vs nginx WebDAV."""
    s, nbytes, dd_dir, par = ctx.sizes, total(files), base / "dd", ctx.sizes.put_parallel
    ours_d, ours_f = _Shuffled(durable, files, par), _Shuffled(fast, files, par)
    joined = base / "joined.bin"
    joined.write_bytes(b"".join(ours_d.bodies))
    ours_d.prepare_slab()
    _clear(dd_dir)()
    got = alternate({
        "durable": _timed(ours_d.threads, nbytes, ours_d.after, lambda: durable.tree),
        "loop": _timed(lambda: _fdatasync_loop(ours_d.bodies, dd_dir), nbytes, _clear(dd_dir)),
        "bulk": _timed(ours_d.bulk, nbytes, ours_d.after, lambda: durable.tree),
        "slab": _timed(ours_d.slabs, SLAB_UPLOADS * nbytes, ours_d.after_slabs,
                       lambda: durable.tree),
        "dd_one": _timed(lambda: _dd_one(joined, dd_dir), nbytes, _clear(dd_dir)),
        "nofsync": _timed(ours_f.curl, nbytes, ours_f.after, lambda: fast.tree),
        "webdav": _timed(_nginx_put(n.url, files, par), nbytes, _clear(n.root / "put"),
                         lambda: n.tree),
    }, s.repeats)
    durable.mark("small PUTs and bulk uploads")
    fast.mark("small PUTs")
    what = f"{len(files):,} x {s.small_size >> 10} KiB"
    common = {"bytes": nbytes, "files": len(files), "parallel": par, "repeats": s.repeats,
              "seconds_median": {k: median(v["seconds"]) for k, v in got.items()},
              "samples": got}
    return [
        compare("ingest_small_durable", f"3. PUT {what}, {par} threads x ShuffleClient, "
                f"fsync on vs write+fdatasync loop", median(got["durable"]["mbps"]),
                median(got["loop"]["mbps"]), "MB/s", ">=", 1.0, **common),
        compare("ingest_small_bulk", f"3. {what} in ONE bulk upload (put_partials), fsync on "
                f"vs dd conv=fdatasync of the same bytes", median(got["bulk"]["mbps"]),
                median(got["dd_one"]["mbps"]), "MB/s", ">=", 0.8, **common),
        compare("ingest_small_slab", f"3. {what} as ONE slab (put_slab: one batch per "
                f"partial), fsync on vs dd conv=fdatasync of the same bytes",
                median(got["slab"]["mbps"]), median(got["dd_one"]["mbps"]), "MB/s", ">=",
                0.8, **common),
        absolute("ingest_small_slab_cpu", f"3. {what} as ONE slab: daemon CPU per GB",
                 median(got["slab"]["cpu_per_gb"]), "CPU s/GB", "<=", 1.0, **common),
        compare("ingest_small_nofsync", f"3. PUT {what}, curl {par} in flight, fsync off vs "
                f"nginx WebDAV PUT", median(got["nofsync"]["mbps"]),
                median(got["webdav"]["mbps"]), "MB/s", ">=", 0.8, **common),
        compare("ingest_small_cpu", f"3. PUT {what}, curl {par} in flight, fsync off: server "
                f"CPU per GB vs nginx WebDAV", median(got["nofsync"]["cpu_per_gb"]),
                median(got["webdav"]["cpu_per_gb"]), "CPU s/GB", "<=", 2.0, **common),
        compare("ingest_small_bulk_cpu", f"3. {what} in ONE bulk upload: daemon CPU per GB vs "
                f"nginx WebDAV's for the same bytes by PUTs", median(got["bulk"]["cpu_per_gb"]),
                median(got["webdav"]["cpu_per_gb"]), "CPU s/GB", "<=", 2.0, **common),
        # A node's capacity per small path (each small comparison's CPU per GB
        # beside nginx's): the durable single PUTs and the slab, for information.
        compare("ingest_small_durable_cpu", f"3. PUT {what}, {par} threads x ShuffleClient, "
                f"fsync on: daemon CPU per GB vs nginx WebDAV's for the same bytes by PUTs",
                median(got["durable"]["cpu_per_gb"]), median(got["webdav"]["cpu_per_gb"]),
                "CPU s/GB", None, None, **common),
        compare("ingest_small_slab_cpu_nginx", f"3. {what} as ONE slab: daemon CPU per GB vs "
                f"nginx WebDAV's for the same bytes by PUTs", median(got["slab"]["cpu_per_gb"]),
                median(got["webdav"]["cpu_per_gb"]), "CPU s/GB", None, None, **common),
    ]


def run(ctx: Ctx) -> list[Result]:
    """Two rows for the large partial, three for the small ones (see the module doc)."""
    s = ctx.sizes
    base = ctx.scratch("ingest")
    large = write_partials(base / "data-large", 1, s.large, seed=3)
    small = write_partials(base / "data-small", s.small_count, s.small_size, seed=4)
    with ctx.daemon("ingest_fsync", base / "loc-fsync", fsync=True) as durable, \
            ctx.daemon("ingest_nofsync", base / "loc-nofsync", fsync=False) as fast, \
            ctx.nginx(base / "nginx") as n:
        return (_large(ctx, large, durable, fast, n, base)
                + _small(ctx, small, durable, fast, n, base))
