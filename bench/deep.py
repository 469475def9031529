"""Comparison 10: deep storage's offload throughput against a plain pyarrow.fs copy.

One sealed task of ``large`` bytes (4 MiB partials in 64 MiB packs) held by an in-process
store configured with deep storage on a moto S3 server on loopback (the test suite's
server). Ours: the store's offloader copying the task (read, CRC32C, AES-256-GCM per
1 MiB chunk, upload; default ``deep_storage_concurrency`` 2); baseline: ``pyarrow.fs
.copy_files`` of the same pack files, plaintext, to the same server (its own threads).
Samples alternate, medians; each sample's objects are removed after it. Target: >= 0.8x.
Both sides and the server share this process and machine: the figure is the offloader's
cost relative to a copy, not S3's throughput.
"""

from __future__ import annotations

import asyncio
import io
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs

from bench.context import Ctx, MiB
from bench.s3server import moto_tier
from shuffled.protocol import Interval, PartialKey
from bench.stats import Result, alternate, compare, median

PARTIAL = 4 * MiB
DAY = ("2018-01-01T00:00:00.000Z", "2018-01-02T00:00:00.000Z")


def _body(seed: int) -> bytes:
    rows = 16
    table = pa.table({"__time": pa.array([1514764800000 + r for r in range(rows)], pa.int64()),
                      "blob": pa.array([os.urandom(PARTIAL // rows) for _ in range(rows)],
                                       pa.binary()),
                      "seed": pa.array([seed] * rows, pa.int64())})
    sink = io.BytesIO()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue()


async def _one(body: bytes) -> Any:
    yield body


class _Bench:
    """An in-process store with deep storage, on its own event loop."""

    def __init__(self, base: Path, uri: str, key_file: Path) -> None:
        from shuffled.config import load_settings
        from shuffled.storage import Store

        self.settings = load_settings(environ={}, overrides={
            "locations": [str(base / "loc")], "free_space_reserve": 0, "fsync": False,
            "pack_max_bytes": 64 * MiB, "deep_storage": uri,
            "deep_storage_key_file": str(key_file)})
        self.loop = asyncio.new_event_loop()
        self.store = Store(self.settings)
        self.run(self.store.open())
        self.count = 0  # partials filled

    def run(self, work: Any) -> Any:
        return self.loop.run_until_complete(work)

    def fill(self, sup: str, total: int) -> list[Path]:
        interval = Interval.parse(*DAY)
        bodies = [_body(i) for i in range(4)]

        async def go() -> None:
            # Four sessions at once, as concurrent uploads would: four packs in turn.
            async def put(i: int) -> None:
                body = bodies[i % 4]
                await self.store.put(PartialKey(sup, f"s{i}", interval, i % 8), _one(body),
                                     len(body), None)
            count = self.count = max(4, total // PARTIAL)
            for start in range(0, count, 4):
                await asyncio.gather(*(put(i) for i in range(start, min(count, start + 4))))
            await self.store.seal(sup, [f"s{i}" for i in range(count)])
            assert self.store.deep is not None
            await self.store.deep.idle()
        self.run(go())
        return sorted((Path(self.settings.locations[0].path) / sup).glob("*.pack"))

    def offload(self, sup: str) -> float:
        deep = self.store.deep
        assert deep is not None

        async def go() -> float:
            await deep.forget(sup)  # the copy made by the last sample (or the seal) goes
            began = time.perf_counter()
            deep.offload(sup)
            await deep.idle()
            took = time.perf_counter() - began
            assert deep.offloaded(sup), "the offload failed"
            return took
        return float(self.run(go()))

    def reads(self, sup: str, during_offload: bool,
              during: Callable[[], Any] | None = None) -> float:
        """Seconds to read every partial of ``sup`` through the store (open and pread, as
        a GET's slow path does): idle, while the task is being offloaded, or while
        ``during`` runs on a thread of its own (the control: the same bytes sent to the
        same server by pyarrow.fs, which costs the object store the same CPU)."""
        deep = self.store.deep
        assert deep is not None
        keys = [PartialKey(sup, f"s{i}", Interval.parse(*DAY), i % 8)
                for i in range(self.count)]

        async def read_all() -> float:
            began = time.perf_counter()
            for key in keys:
                meta, fh = await self.store.open_partial(key)
                try:
                    await self.store.run(os.pread, fh.fileno(), meta.body_len, meta.offset)
                finally:
                    fh.close()
            return time.perf_counter() - began

        async def go() -> float:
            if during is not None:
                other = asyncio.get_running_loop().run_in_executor(None, during)
                took = await read_all()
                await other
                return took
            if not during_offload:
                return await read_all()
            await deep.forget(sup)
            deep.offload(sup)
            took = await read_all()
            await deep.idle()
            return took
        return float(self.run(go()))

    def close(self) -> None:
        self.run(self.store.close())
        self.loop.close()


def run(ctx: Ctx) -> list[Result]:
    s = ctx.sizes
    base = ctx.scratch("deep")
    bench: _Bench | None = None
    with moto_tier(base) as tier:
        fs = tier.fs
        bench = _Bench(base, tier.uri, tier.key_file)
        packs = bench.fill("deep-1", s.large)
        nbytes = sum(p.stat().st_size for p in packs)
        local = pafs.LocalFileSystem()
        counter = iter(range(1 << 30))

        def ours() -> dict[str, float]:
            seconds = bench.offload("deep-1")  # type: ignore[union-attr]
            return {"seconds": seconds, "mbps": nbytes / seconds / 1e6}

        def plain() -> dict[str, float]:
            dest = f"bench-deep/plain/{next(counter)}"
            began = time.perf_counter()
            for path in packs:
                pafs.copy_files(str(path), f"{dest}/{path.name}", source_filesystem=local,
                                destination_filesystem=fs, use_threads=True)
            seconds = time.perf_counter() - began
            fs.delete_dir(dest)
            return {"seconds": seconds, "mbps": nbytes / seconds / 1e6}

        def idle() -> dict[str, float]:
            return {"seconds": bench.reads("deep-1", False)}  # type: ignore[union-attr]

        def offloading() -> dict[str, float]:
            return {"seconds": bench.reads("deep-1", True)}  # type: ignore[union-attr]

        def copying() -> dict[str, float]:
            return {"seconds": bench.reads("deep-1", False, plain)}  # type: ignore[union-attr]

        try:
            got = alternate({"offloader": ours, "copy_files": plain}, s.repeats)
            plane = alternate({"reads_idle": idle, "reads_offloading": offloading,
                               "reads_copying": copying}, s.repeats)
        finally:
            bench.close()
    what = f"{nbytes / MiB:.0f} MiB sealed task ({len(packs)} packs)"
    common = {"bytes": nbytes, "packs": len(packs), "repeats": s.repeats,
              "seconds_median": {k: median(v["seconds"]) for k, v in got.items()},
              "samples": got}
    return [compare("deep_offload", f"10. deep storage: offload of a {what} to S3 (moto, "
                    "loopback), encrypted, vs plain pyarrow.fs.copy_files of its packs",
                    median(got["offloader"]["mbps"]), median(got["copy_files"]["mbps"]),
                    "MB/s", ">=", 0.8, **common),
            compare("deep_data_plane", f"10b. deep storage: reading every partial of the "
                    f"same task through the store while it is offloaded vs idle (the data "
                    f"plane's cost of an offload; lower is better)",
                    median(plane["reads_offloading"]["seconds"]),
                    median(plane["reads_idle"]["seconds"]), "s", "<=", 1.1,
                    repeats=s.repeats, samples=plane,
                    # the control: reads while pyarrow.fs copies the same bytes to the same
                    # server (moto shares this machine's cores: its CPU is in both)
                    reads_copying_median=median(plane["reads_copying"]["seconds"]),
                    offloading_vs_copying=median(plane["reads_offloading"]["seconds"])
                    / median(plane["reads_copying"]["seconds"]))]

