"""Daemon CPU per small partial, received and served (``python -m bench.partials_cpu``).

One ``shuffled serve`` on loopback (fsync on, a temp dir). Each repeat uploads
``--uploads`` bulk uploads of ``--per-upload`` 4-12 KB partials sharing one schema, sent as
phase 1 sends a flush (``put_flush`` of a list: schema message + batch bodies in ~1 MiB
HTTP chunks; ``--lazy``: a generator, one HTTP chunk per partial), then reads them back
as phase 2 does (``get_partitions``, 128 partitions of 3 partials per request). The
daemon's CPU (utime + stime from /proc/<pid>/stat, so exited threads count too) is read
around each half; the median over the repeats is printed in us per partial.

``--profile DIR`` runs py-spy (raw format; ``SPY_RATE``, ``SPY_ARGS=--gil``) over the
daemon during each half of the first repeat; ``--threads`` prints the received CPU per
daemon thread and the group commits.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import pyarrow as pa

from bench.daemon import Daemon
from bench.procs import CLK_TCK
from shuffled.client import ShuffleClient
from shuffled.protocol import Interval, PartialKey, PartitionKey

HOUR = 3_600_000
PER_READ = 128  # partitions per bulk read, as phase 2 asks
FANIN = 3  # partials per partition (uploads sharing partitions)
CHUNKS = 10  # intervals per upload


def cpu(pid: int) -> float:
    """utime + stime of ``pid`` (every thread, exited ones too), seconds."""
    with open(f"/proc/{pid}/stat", encoding="ascii") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def threads(pid: int) -> dict[str, float]:
    """CPU seconds per live thread of ``pid`` (name/tid), for ``--threads``."""
    out: dict[str, float] = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{tid}/stat", encoding="ascii") as fh:
            name, _, rest = fh.read().partition("(")[2].rpartition(")")
        fields = rest.split()
        out[f"{name}/{tid}"] = (int(fields[11]) + int(fields[12])) / CLK_TCK
    return out


def flush(rows: int, count: int, seed: int) -> tuple[bytes, pa.Buffer, list[tuple[int, int]]]:
    """One IPC stream of ``count`` batches of about ``rows`` rows (8 bytes a row): its schema
    message, the stream, and each batch's (offset, length), as phase 1's encode_flush."""
    schema = pa.schema([("v", pa.int64())])
    head = schema.serialize().to_pybytes()
    sink = pa.BufferOutputStream()
    ends: list[int] = []
    with pa.ipc.new_stream(sink, schema) as writer:
        for n in range(count):
            # Sizes vary (rows/2 to 3*rows/2) as real partials' do: no cache keyed by a
            # length is flattered by partials all of one size.
            size = rows // 2 + (n * 7919 + seed) % (rows + 1)
            start = (seed * count + n) * 2 * rows
            writer.write_batch(pa.record_batch([pa.array(range(start, start + size),
                                                         pa.int64())], schema=schema))
            ends.append(sink.tell())
    starts = [len(head), *ends[:-1]]
    return head, sink.getvalue(), [(a, b - a) for a, b in zip(starts, ends, strict=True)]


def key_of(sup: str, upload: int, i: int, per_upload: int) -> PartialKey:
    """Partial ``i`` of upload ``upload``: FANIN consecutive uploads share partitions."""
    per_chunk = per_upload // CHUNKS
    chunk = i // per_chunk
    bucket = (upload // FANIN) * per_chunk + i % per_chunk
    return PartialKey(sup, f"s{upload}", Interval(chunk * HOUR, (chunk + 1) * HOUR), bucket)


class Spy:
    """py-spy recording the daemon until :meth:`stop` (nothing without an output)."""

    def __init__(self, pid: int, out: Path | None) -> None:
        self.proc: subprocess.Popen[bytes] | None = None
        if out is not None:
            spy = Path(sys.executable).with_name("py-spy")
            self.proc = subprocess.Popen([str(spy), "record", "--pid", str(pid), "--rate",
                                          os.environ.get("SPY_RATE", "200"), "--format", "raw", "-o", str(out), *os.environ.get("SPY_ARGS", "").split()],
                                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            time.sleep(1.0)  # py-spy attaches before the load starts

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.send_signal(signal.SIGINT)
            self.proc.wait(timeout=60)


def repeat(d: Daemon, pid: int, n: int, args: argparse.Namespace,
           profile: Path | None) -> tuple[float, float]:
    """One upload + read round; us of daemon CPU per partial received, per one served."""
    sup = f"bench{n}"
    client = ShuffleClient(d.url)
    flushes = [flush(args.rows, args.per_upload, u) for u in range(args.uploads)]
    spy = Spy(pid, profile / "recv.raw" if profile else None)
    before, per_thread = cpu(pid), threads(pid)
    for u, (head, data, parts) in enumerate(flushes):
        view = memoryview(data)
        # A list, as phase 1 passes (tasks.py): the client gathers ~1 MiB HTTP chunks;
        # --lazy passes a generator (one HTTP chunk per partial, as phase 1 did before).
        made = ((key_of(sup, u, i, args.per_upload), view[at: at + length])
                for i, (at, length) in enumerate(parts))
        bodies = made if args.lazy else list(made)
        answers = client.put_flush(sup, head, bodies)
        assert len(answers) == len(parts), answers[:3]
    received = cpu(pid) - before
    spy.stop()
    total = args.uploads * args.per_upload
    if args.threads:
        with open(f"/proc/{pid}/stat", encoding="ascii") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
        print(f"  daemon so far: utime {int(fields[11]) / CLK_TCK:.2f} s, stime "
              f"{int(fields[12]) / CLK_TCK:.2f} s, minor faults {fields[7]}")
        for name, seconds in sorted(threads(pid).items()):
            spent = seconds - per_thread.get(name, 0.0)
            if spent:
                print(f"  {name}: {spent / total * 1e6:.0f} us/partial received")
    per_chunk = args.per_upload // CHUNKS
    wanted: list[tuple[PartitionKey, list[str]]] = []
    for group in range(0, args.uploads, FANIN):
        subs = [f"s{u}" for u in range(group, min(group + FANIN, args.uploads))]
        for chunk in range(CHUNKS):
            for b in range(per_chunk):
                key = PartitionKey(sup, Interval(chunk * HOUR, (chunk + 1) * HOUR),
                                   (group // FANIN) * per_chunk + b)
                wanted.append((key, subs))
    spy = Spy(pid, profile / "serve.raw" if profile else None)
    before = cpu(pid)
    got = 0
    for at in range(0, len(wanted), PER_READ):
        read = client.get_partitions(sup, wanted[at: at + PER_READ])
        got += sum(len(b) for b in read)
    served = cpu(pid) - before
    spy.stop()
    if args.threads:  # how many partials each group commit made durable
        with urllib.request.urlopen(f"{d.url}/metrics") as fh:
            print("  " + " ".join(line for line in fh.read().decode().splitlines()
                                  if line.startswith("shuffled_commit_")))
    client.close()
    assert got > 0
    return received / total * 1e6, served / total * 1e6


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--uploads", type=int, default=20)
    p.add_argument("--per-upload", type=int, default=1000)
    p.add_argument("--rows", type=int, default=1000, help="int64 rows per partial (~8 KB)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", action="store_true", help="received CPU per daemon thread")
    p.add_argument("--lazy", action="store_true",
                   help="send each upload's partials from a generator (a chunk each)")
    p.add_argument("--profile", type=Path, default=None, help="py-spy raw output directory")
    args = p.parse_args()
    root = Path(tempfile.mkdtemp(prefix="partials_cpu."))
    try:
        with Daemon(root / "store", fsync=True) as d:
            assert d.proc is not None
            pid = d.proc.pid
            recv: list[float] = []
            serve: list[float] = []
            for n in range(args.repeats):
                prof = args.profile if n == 0 else None
                if prof is not None:
                    prof.mkdir(parents=True, exist_ok=True)
                r, s = repeat(d, pid, n, args, prof)
                recv.append(r)
                serve.append(s)
                print(f"repeat {n}: {r:.0f} us/partial received, {s:.0f} us/partial served",
                      flush=True)
            print(f"median: {statistics.median(recv):.0f} us/partial received, "
                  f"{statistics.median(serve):.0f} us/partial served; min {min(recv):.0f} "
                  f"and {min(serve):.0f} ({args.uploads} x {args.per_upload} partials, "
                  f"{os.cpu_count()} cpus)")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
