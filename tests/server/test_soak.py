"""A bounded soak: 32 writers and 32 readers against one daemon subprocess with two locations.

Writers replace partial segments of their own keys with bodies from a fixed pool; readers
fetch random keys (verifying the body is one that was written to that key) and a static
partition through the aggregate GET. Reported: requests, bytes, errors, digest mismatches,
p50/p99 latency, the daemon's peak RSS (VmHWM) and its RSS after warm-up and at the end.
Required: zero errors, zero mismatches, flat memory.

``make test`` runs it shortened (SHUFFLED_SOAK_SECONDS, default 10 s); ``make soak`` runs
the full one (``-m slow``; SHUFFLED_SOAK_FULL_SECONDS, default 120 s).
"""

from __future__ import annotations

import os
import random
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pytest

from shuffled.client import RetryPolicy, ShuffleClient
from shuffled.crc import crc32c
from shuffled.errors import DigestMismatch
from shuffled.protocol import Interval, PartialKey, PartitionKey
from tests.conftest import DAY, arrow_bytes, files_under, sample_table
from tests.helpers.procs import DaemonProcess

INTERVAL = Interval.parse(DAY["start"], DAY["end"])
WRITERS = READERS = 32
SLOTS = 8  # keys per writer, replaced over and over
MIB = 1 << 20
RSS_GROWTH_LIMIT = 1.25  # end-of-run RSS vs post-warm-up RSS (plus a small slack)
RSS_SLACK = 16 * MIB


@dataclass
class Tally:
    """One thread's figures (merged at the end; no shared counters, no locks)."""

    requests: int = 0
    bytes: int = 0
    errors: list[str] = field(default_factory=list)
    mismatches: list[str] = field(default_factory=list)
    latencies: list[float] = field(default_factory=list)


def _pool() -> list[bytes]:
    rows = [200, 1000, 3000, 8000, 20_000, 40_000, 60_000]
    return [arrow_bytes(sample_table(n, seed=i)) for i, n in enumerate(rows)]


def _rss(pid: int, field_name: str) -> int:
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith(field_name + ":"):
                return int(line.split()[1]) * 1024
    raise AssertionError(f"{field_name} not in /proc/{pid}/status")


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else 0.0


def run_soak(tmp_path: Path, seconds: float) -> dict[str, float]:
    pool = _pool()
    crcs = [crc32c(b) for b in pool]
    written: dict[PartialKey, set[int]] = {}  # key -> pool indexes ever sent to it
    ready: list[PartialKey] = []  # keys with an acknowledged upload
    static = PartitionKey("static", INTERVAL, 0)
    policy = RetryPolicy(attempts=8, backoff=0.05, max_backoff=1.0, deadline=30)
    daemon = DaemonProcess([tmp_path / "a", tmp_path / "b"], log_path=tmp_path / "daemon.log")
    with daemon:
        with ShuffleClient(daemon.url) as client:
            for i, body in enumerate(pool[:4]):
                client.put_partial(PartialKey("static", f"s{i}", INTERVAL, 0), body)
            aggregate = client.get_partition(static)
            expected = pa.concat_tables([pa.ipc.open_stream(b).read_all() for b in pool[:4]])
            assert pa.ipc.open_stream(aggregate).read_all().equals(expected)
            aggregate_crc = crc32c(aggregate)
        started = time.monotonic()
        deadline = started + seconds
        tallies: list[Tally] = []
        samples: list[tuple[float, int]] = []
        split: list[tuple[int, int]] = []  # (anonymous, file-backed) resident bytes

        def writer(w: int) -> None:
            tally = Tally()
            tallies.append(tally)
            rng = random.Random(w)
            with ShuffleClient(daemon.url, retry=policy) as c:
                for n in range(10**7):  # bounded by count and by the deadline
                    if time.monotonic() >= deadline:
                        return
                    key = PartialKey(f"w{w}", f"s{n % SLOTS}", INTERVAL, n % 2)
                    index = rng.randrange(len(pool))
                    written.setdefault(key, set()).add(index)  # before the PUT can commit
                    t0 = time.monotonic()
                    try:
                        c.put_partial(key, pool[index])
                    except Exception as exc:  # counted, never expected
                        tally.errors.append(f"PUT {key}: {exc!r}")
                        continue
                    tally.latencies.append(time.monotonic() - t0)
                    tally.requests += 1
                    tally.bytes += len(pool[index])
                    if n < SLOTS:
                        ready.append(key)

        def reader(r: int) -> None:
            tally = Tally()
            tallies.append(tally)
            rng = random.Random(1000 + r)
            with ShuffleClient(daemon.url, retry=policy) as c:
                for _ in range(10**7):
                    if time.monotonic() >= deadline:
                        return
                    t0 = time.monotonic()
                    try:
                        if rng.random() < 0.25 or not ready:
                            data = c.get_partition(static)
                            ok = crc32c(data) == aggregate_crc
                            what = str(static)
                        else:
                            key = ready[rng.randrange(len(ready))]
                            data = c.get_partial(key)
                            ok = crc32c(data) in {crcs[i] for i in frozenset(written[key])}
                            what = str(key)
                    except DigestMismatch as exc:
                        tally.mismatches.append(repr(exc))
                        continue
                    except Exception as exc:
                        tally.errors.append(f"GET: {exc!r}")
                        continue
                    tally.latencies.append(time.monotonic() - t0)
                    tally.requests += 1
                    tally.bytes += len(data)
                    if not ok:
                        tally.mismatches.append(f"{what}: bytes are none that were written")

        def monitor() -> None:
            while time.monotonic() < deadline:
                samples.append((time.monotonic() - started, _rss(daemon.pid, "VmRSS")))
                split.append((_rss(daemon.pid, "RssAnon"), _rss(daemon.pid, "RssFile")))
                time.sleep(0.25)  # sampling period, not synchronisation

        threads = ([threading.Thread(target=writer, args=(w,)) for w in range(WRITERS)]
                   + [threading.Thread(target=reader, args=(r,)) for r in range(READERS)]
                   + [threading.Thread(target=monitor)])
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=seconds + 120)
        assert not any(t.is_alive() for t in threads), "a soak thread did not finish"
        elapsed = time.monotonic() - started
        peak = _rss(daemon.pid, "VmHWM")
        assert daemon.stop() == 0
    for loc in daemon.locations:
        assert list((loc / ".tmp").iterdir()) == []
        assert all(p.suffix == ".pack" for p in files_under(loc))

    latencies = [x for t in tallies for x in t.latencies]
    errors = [e for t in tallies for e in t.errors]
    mismatches = [m for t in tallies for m in t.mismatches]
    warm = [rss for at, rss in samples if 0.2 * seconds <= at <= 0.4 * seconds]
    late = [rss for at, rss in samples if at >= 0.8 * seconds]
    figures = {
        "seconds": round(elapsed, 1),
        "requests": sum(t.requests for t in tallies),
        "req_per_s": round(sum(t.requests for t in tallies) / elapsed),
        "bytes": sum(t.bytes for t in tallies),
        "MiB_per_s": round(sum(t.bytes for t in tallies) / elapsed / MIB, 1),
        "errors": len(errors),
        "digest_mismatches": len(mismatches),
        "p50_ms": round(_percentile(latencies, 0.50) * 1000, 2),
        "p99_ms": round(_percentile(latencies, 0.99) * 1000, 2),
        "peak_rss_MiB": round(peak / MIB, 1),
        "rss_after_warmup_MiB": round(max(warm) / MIB, 1) if warm else 0.0,
        "rss_at_end_MiB": round(max(late) / MIB, 1) if late else 0.0,
        # What the peak is made of: the heap, or pages of the libraries mapped (pyarrow's,
        # numpy's), whose residency a neighbour using them too changes.
        "peak_anon_MiB": round(max(a for a, _ in split) / MIB, 1) if split else 0.0,
        "peak_file_MiB": round(max(f for _, f in split) / MIB, 1) if split else 0.0,
    }
    print("\nsoak:", " ".join(f"{k}={v}" for k, v in figures.items()))
    assert not errors, errors[:5]
    assert not mismatches, mismatches[:5]
    assert figures["requests"] > 0 and warm and late
    assert max(late) <= max(warm) * RSS_GROWTH_LIMIT + RSS_SLACK, figures  # flat memory
    # On a breach, the RSS series says when it rose (start-up, warm-up, a late spike).
    every = max(1, len(samples) // 40)
    series = " ".join(f"{at:.1f}s:{rss / MIB:.0f}" for at, rss in samples[::every])
    assert peak < 150 * MIB, f"{figures}; VmRSS MiB over the run: {series}"  # design.md section 8
    return figures


def test_soak_short(tmp_path: Path) -> None:
    run_soak(tmp_path, float(os.environ.get("SHUFFLED_SOAK_SECONDS", "10")))


@pytest.mark.slow
def test_soak_full(tmp_path: Path) -> None:
    run_soak(tmp_path, float(os.environ.get("SHUFFLED_SOAK_FULL_SECONDS", "120")))
