"""How tests/data/format4-location.tar.gz was made: a storage format-4 location written by
shuffled with slabs (commit 90351a8, the last release with format 4), with what its partials
hold in format4-expected.json. Kept to show what the fixture contains; it only runs
against that commit (``git worktree add /tmp/v4 90351a8``, then run it from there)."""
import json, sys, shutil, io, tarfile
from pathlib import Path
import pyarrow as pa
from shuffled.server.embedded import EmbeddedDaemon
from shuffled.client import ShuffleClient
from shuffled.protocol import PartialKey, Interval
from tests.helpers.slabs import make_slab, rows_table
out = Path(sys.argv[1] if len(sys.argv) > 1 else "/tmp/format4")
loc = out / "loc"; shutil.rmtree(loc, ignore_errors=True)
def stream(t, opts=None):
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, t.schema, options=opts) as w:
        for b in t.to_batches(max_chunksize=3): w.write_batch(b)
    return sink.getvalue().to_pybytes()
iv = Interval.parse("2018-01-01T00:00:00Z", "2018-01-02T00:00:00Z")
iv2 = Interval.parse("2018-01-02T00:00:00Z", "2018-01-03T00:00:00Z")
bodies = {}
d = EmbeddedDaemon([str(loc)], port=0, free_space_reserve=0); d.start()
try:
    with ShuffleClient(d.url) as c:
        for p in range(3):
            for s in ("a", "b"):
                t = pa.table({"__time": pa.array([1, 2, 3, 4, 5, 6, 7], pa.int64()),
                              "dim": [f"{s}{p}{i}" for i in range(7)], "n": list(range(p, p + 7))})
                k = PartialKey("task1", s, iv, p); bodies[str(k)] = stream(t)
        c.put_partials("task1", [(k2, bodies[str(k2)]) for k2 in
                                 [PartialKey("task1", s, iv, p) for p in range(3) for s in ("a", "b")]])
        # a replaced partial (the old bytes stay in the pack), lz4-compressed batches, dictionaries
        t = pa.table({"__time": pa.array(range(100), pa.int64()), "dim": ["x"] * 100, "n": list(range(100))})
        k = PartialKey("task1", "a", iv, 0); bodies[str(k)] = stream(t, pa.ipc.IpcWriteOptions(compression="lz4"))
        c.put_partial(k, bodies[str(k)])
        t = pa.table({"__time": pa.array([9, 9], pa.int64()), "dim": pa.array(["u", "v"]).dictionary_encode(), "n": [1, 2]})
        k = PartialKey("task2", "c", iv2, 1); bodies[str(k)] = stream(t)
        c.put_partial(k, bodies[str(k)])
        big = pa.table({"__time": pa.array(range(40_000), pa.int64()),
                        "dim": pa.array(["yy"] * 40_000).dictionary_encode(),
                        "n": list(range(40_000))})
        k = PartialKey("task2", "d", iv2, 1); bodies[str(k)] = stream(big)
        c.put_partial(k, bodies[str(k)])  # streamed (over 256 KiB)
        c.seal("task1", ["a", "b"])
        c.put_slab("task3", make_slab(rows_table(300)))  # a slab, sealed
        c.seal("task3", ["sub0"])
finally:
    d.stop()
import zlib
expected = {k: {"bytes": len(b), "crc32": zlib.crc32(b)} for k, b in bodies.items()}
(out / "format4-expected.json").write_text(json.dumps(expected, indent=1, sort_keys=True))
buf = io.BytesIO()
with tarfile.open(fileobj=buf, mode="w:gz") as tar:
    tar.add(loc, arcname="loc", filter=lambda ti: None if ti.name.endswith(".lock") else ti)
(out / "format4-location.tar.gz").write_bytes(buf.getvalue())
print(len(buf.getvalue()), sorted(expected))
