"""Comparison 3: ingest, streamed PUT of one large and of many small partial segments, and
the many small ones in ONE bulk upload.

Durable: the daemon with fsync on (fsync before rename, the default) vs ``dd
conv=fdatasync`` of the same bytes to the same disk (large), and vs a Python loop that
writes and fdatasyncs each small file in turn (small: 1,000 dd processes would measure
process start-up, not the disk). Not durable: the daemon with ``--fsync false`` vs nginx
WebDAV PUT (nginx never fsyncs). Uploads go through the same curl, ``put_parallel`` in
flight for the small files. Each sample starts with ``sync`` (untimed) so dirty pages left
by the previous sample are not charged to the next, and its output is deleted afterwards.
There is no warm-up sample: every sample writes new files, and the alternation spreads
whatever the first ones pay over all sides. The bulk row sends the small partials as one
``POST .../partials`` batch (prebuilt frames, streamed by curl) against ``dd
conv=fdatasync`` of the same bytes as one file.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

from bench import client
from bench.context import Ctx
from bench.daemon import Daemon
from bench.data import END, START, PartialFile, total, write_partials
from bench.stats import Result, alternate, compare, median
from shuffled import framing
from shuffled.crc import crc32c
from shuffled.protocol import Interval, PartialKey

Sample = Callable[[], dict[str, float]]


def _timed(run: Callable[[], None], nbytes: int, after: Callable[[], None]) -> Sample:
    def sample() -> dict[str, float]:
        os.sync()
        began = time.perf_counter()
        run()
        seconds = time.perf_counter() - began
        after()
        return {"mbps": nbytes / seconds / 1e6, "seconds": seconds}
    return sample


def _dd(files: list[PartialFile], out: Path) -> None:
    for i, f in enumerate(files):
        subprocess.run(["dd", f"if={f.path}", f"of={out / f'x{i}'}", "bs=1M",
                        "conv=fdatasync", "status=none"], check=True, timeout=300)


def _fdatasync_loop(files: list[PartialFile], out: Path) -> None:
    for i, f in enumerate(files):
        data = f.path.read_bytes()
        fd = os.open(out / f"x{i}", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.write(fd, data)
            os.fdatasync(fd)
        finally:
            os.close(fd)


def _dd_one(files: list[PartialFile], out: Path, joined: Path) -> None:
    subprocess.run(["dd", f"if={joined}", f"of={out / 'all'}", "bs=1M", "conv=fdatasync",
                    "status=none"], check=True, timeout=300)


def _batch_file(files: list[PartialFile], path: Path, joined: Path) -> None:
    """The bulk body for ``files`` (frames + END) and their bytes back to back."""
    with open(path, "wb") as out, open(joined, "wb") as raw:
        for f in files:
            body = f.path.read_bytes()
            key = PartialKey("x", f.sub, Interval.parse(START, END), 0)
            out.write(framing.encode(key, len(body), crc32c(body)))
            out.write(body)
            raw.write(body)
        out.write(framing.encode_end(len(files)))


def _clear(path: Path) -> Callable[[], None]:
    def clear() -> None:
        shutil.rmtree(path, ignore_errors=True)
        path.mkdir(parents=True, exist_ok=True)
    return clear


class _Shuffled:
    """Uploads to a daemon under a fresh supervisor task per sample, deleted afterwards."""

    def __init__(self, daemon: Daemon, files: list[PartialFile], parallel: int) -> None:
        self.daemon, self.files, self.parallel = daemon, files, parallel
        self.n = 0

    def run(self) -> None:
        self.n += 1
        sup = f"bench-ingest-{self.n}"
        pairs = [(self.daemon.partial_url(sup, f.sub, START, END, 0), f.path) for f in self.files]
        client.put(pairs, parallel=self.parallel, expect_bytes=total(self.files))

    def bulk(self, body: Path) -> None:
        self.n += 1
        url = self.daemon.task_url(f"bench-ingest-{self.n}") + "/partials"
        client.post_batch(url, body, len(self.files))

    def after(self) -> None:
        req = urllib.request.Request(self.daemon.task_url(f"bench-ingest-{self.n}"),
                                     method="DELETE")
        with urllib.request.urlopen(req, timeout=60) as resp:
            resp.read()


def _nginx_put(url: str, files: list[PartialFile], parallel: int) -> Callable[[], None]:
    def run() -> None:
        client.put([(f"{url}/put/{f.name}", f.path) for f in files], parallel=parallel,
                   expect_bytes=total(files))
    return run


def run(ctx: Ctx) -> list[Result]:
    """Four rows: {large, small} x {durable vs dd, fsync off vs nginx WebDAV}."""
    s = ctx.sizes
    base = ctx.scratch("ingest")
    sets = {"large": write_partials(base / "data-large", 1, s.large, seed=3),
            "small": write_partials(base / "data-small", s.small_count, s.small_size, seed=4)}
    out: list[Result] = []
    with ctx.daemon("ingest_fsync", base / "loc-fsync", fsync=True) as durable, \
            ctx.daemon("ingest_nofsync", base / "loc-nofsync", fsync=False) as fast, \
            ctx.nginx(base / "nginx") as n:
        for kind, files in sets.items():
            nbytes = total(files)
            par = 1 if kind == "large" else s.put_parallel
            dd_dir = base / "dd"
            ours_d, ours_f = _Shuffled(durable, files, par), _Shuffled(fast, files, par)
            local = _dd if kind == "large" else _fdatasync_loop
            sides = {
                "durable": _timed(ours_d.run, nbytes, ours_d.after),
                "dd": _timed(lambda: local(files, dd_dir), nbytes, _clear(dd_dir)),
                "nofsync": _timed(ours_f.run, nbytes, ours_f.after),
                "webdav": _timed(_nginx_put(n.url, files, par), nbytes, _clear(n.root / "put")),
            }
            _clear(dd_dir)()
            if kind == "small":
                batch, joined = base / "batch.bin", base / "joined.bin"
                _batch_file(files, batch, joined)
                sides["bulk"] = _timed(lambda: ours_d.bulk(batch), nbytes, ours_d.after)
                sides["dd_one"] = _timed(lambda: _dd_one(files, dd_dir, joined), nbytes,
                                         _clear(dd_dir))
            got = alternate(sides, s.repeats)
            what = (f"{nbytes >> 20} MiB" if kind == "large"
                    else f"{len(files)} x {s.small_size >> 10} KiB, {par} in flight")
            baseline = "dd conv=fdatasync" if kind == "large" else "write+fdatasync loop"
            common = {"bytes": nbytes, "files": len(files), "parallel": par,
                      "repeats": s.repeats, "samples": got}
            out.append(compare(
                f"ingest_{kind}_durable", f"3. PUT {what}, fsync on vs {baseline}",
                median(got["durable"]["mbps"]), median(got["dd"]["mbps"]), "MB/s", ">=",
                0.8 if kind == "large" else 1.0, **common))
            out.append(compare(
                f"ingest_{kind}_nofsync", f"3. PUT {what}, fsync off vs nginx WebDAV PUT",
                median(got["nofsync"]["mbps"]), median(got["webdav"]["mbps"]), "MB/s", ">=",
                0.8, **common))
            if kind == "small":
                out.append(compare(
                    "ingest_small_bulk", f"3. {len(files)} x {s.small_size >> 10} KiB in one "
                    f"bulk upload, fsync on vs dd conv=fdatasync of the same bytes",
                    median(got["bulk"]["mbps"]), median(got["dd_one"]["mbps"]), "MB/s", ">=",
                    0.8, **common))
    return out
