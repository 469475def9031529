"""Comparison 6: one daemon holding a million partial segments: memory, restart, paged listing.

The partials are put through the daemon itself, the way phase 1 stores them: tiny Arrow
streams (two rows) sent with ``ShuffleClient.put_partials`` in calls of ``scale_batch``
(which the client sends as uploads of at most ``shuffled.client.bulk.BULK_PARTIALS``)
from ``scale_threads`` client threads, to a daemon with ``--fsync false`` (durability is
not what is measured here, and the fill is bounded by ``scale_fill_seconds``: when the
machine cannot reach ``scale_partials`` in that time the run says so and measures at the
count reached). They belong to one supervisor task, ``SUBTASKS`` subtasks per partition.

On the way, at ``scale_early`` partials (DESIGN.md section 8's 50,000), the fill stops and
the daemon is restarted ``scale_samples`` times until it lists them (the same "ready" as
below), then the fill goes on where it stopped.

Then the daemon is restarted with the default settings (fsync on) ``scale_samples`` times:
restart = spawn until ``GET /status/health`` AND the first page ``GET /tasks/{sup}?limit=100``
both answer 200 (interpreter start-up included; an empty location's time is in the
detail); first page = the median of ``GETS`` more such requests on a keep-alive
connection; RSS = the restarted daemon's peak (VmHWM) after those and a per-partial and an
aggregate GET. Targets (DESIGN.md section 8): < 300 MiB, < 5 s, < 50 ms; 50,000: <= 1 s.
"""

from __future__ import annotations

import http.client
import threading
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from bench.context import Ctx
from bench.daemon import PREFIX, Daemon
from bench.data import arrow_stream
from bench.stats import Result, absolute, info, median
from shuffled.client import ShuffleClient
from shuffled.protocol import Interval, PartialKey

SUP = "bench-scale"
SUBTASKS = 100  # partials per partition
SHARDS = 2  # partitionIds per interval
GETS = 5  # first-page latency samples per restart
DAY = 86_400_000
T0 = 1_514_764_800_000  # 2018-01-01
PAGE = f"{PREFIX}/tasks/{SUP}?limit=100"


def key(i: int) -> PartialKey:
    """Partial ``i``: subtask i % SUBTASKS of partition i // SUBTASKS (SHARDS a day)."""
    p = i // SUBTASKS
    day = T0 + (p // SHARDS) * DAY
    return PartialKey(SUP, f"sub{i % SUBTASKS:04d}", Interval(day, day + DAY), p % SHARDS)


def fill(url: str, count: int, batch: int, threads: int, seconds: float,
         first: int = 0) -> dict[str, Any]:
    """Upload partials first..count-1 in batches (each thread claims the next batch) until
    done or ``seconds`` have passed; what was stored (whole batches only)."""
    body = arrow_stream(1100, seed=1)  # two rows
    batches = iter(range(first, count, batch))
    lock, errors, stored = threading.Lock(), [], [0]
    began = time.monotonic()
    deadline = began + seconds

    def work() -> None:
        """One thread: its own client, batches until none is left, time is up or one failed."""
        with ShuffleClient(url, timeout=300) as c:
            while not errors and time.monotonic() < deadline:
                with lock:
                    first = next(batches, None)
                if first is None:
                    return
                n = min(batch, count - first)
                try:
                    items = ((key(i), body) for i in range(first, first + n))
                    answers = c.put_partials(SUP, items)
                    if len(answers) != n or any(a.get("status") != "created" for a in answers):
                        raise RuntimeError(f"batch at {first}: {str(answers[:2])[:300]}")
                except BaseException as exc:  # surfaced below
                    errors.append(exc)
                    return
                with lock:
                    stored[0] += n

    pool = [threading.Thread(target=work, daemon=True) for _ in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join(max(1.0, deadline + 600 - time.monotonic()))  # a batch in flight finishes
    if errors:
        raise errors[0]
    elapsed = time.monotonic() - began
    return {"stored": first + stored[0], "seconds": elapsed, "rate": stored[0] / elapsed,
            "body_bytes": len(body), "complete": first + stored[0] == count}


def _get(conn: http.client.HTTPConnection, path: str) -> tuple[int, float]:
    """Status and seconds of one GET on ``conn`` (body read whole)."""
    began = time.perf_counter()
    conn.request("GET", path)
    resp = conn.getresponse()
    resp.read()
    return resp.status, time.perf_counter() - began


def _connect(url: str) -> http.client.HTTPConnection:
    """A keep-alive connection to the daemon at ``url``."""
    parts = urlsplit(url)
    return http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port, timeout=60)


def ready(d: Daemon, timeout: float = 120.0, page: bool = True) -> tuple[float, float]:
    """Seconds from spawn until ``/status/health`` and (``page``) the first page both answer
    200, and the first page's latency then (cold)."""
    conn = _connect(d.url)
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            try:
                if _get(conn, "/status/health")[0] == 200:
                    status, cold = _get(conn, PAGE) if page else (200, 0.0)
                    if status == 200:
                        return time.monotonic() - d.spawned, cold
            except (OSError, http.client.HTTPException):
                conn.close()
            time.sleep(0.01)
    finally:
        conn.close()
    raise TimeoutError(f"daemon not ready within {timeout:.0f} s")


def restart(ctx: Ctx, loc: Path, label: str) -> dict[str, float]:
    """One default-settings start on ``loc``: ready time, page latencies, peak RSS."""
    with ctx.daemon(label, loc) as d:
        ready_s, cold = ready(d)
        conn = _connect(d.url)
        try:
            page = [_get(conn, PAGE)[1] for _ in range(GETS)]
            k = key(0)
            q = f"start={k.interval.start_iso}&end={k.interval.end_iso}&partitionId=0"
            status, one = _get(conn, f"{PREFIX}/tasks/{SUP}/{k.sub_task_id}/partition?{q}")
            status2, whole = _get(conn, f"{PREFIX}/tasks/{SUP}/partition?{q}")
        finally:
            conn.close()
        if (status, status2) != (200, 200):
            raise RuntimeError(f"GETs after the restart answered {status}, {status2}")
    return {"ready_s": ready_s, "line_s": d.started_seconds, "first_page_cold_s": cold,
            "first_page_s": median(page), "partial_get_s": one, "partition_get_s": whole,
            "peak_rss_mib": ctx.peaks[label]}


def run(ctx: Ctx) -> list[Result]:
    """Fill one daemon (fsync off), then restart it with the defaults and measure."""
    s = ctx.sizes
    base = ctx.scratch("scale")
    with ctx.daemon("scale_empty", base / "empty") as d:
        empty = ready(d, page=False)[0]
    loc = base / "loc"
    few = min(s.scale_early, s.scale_partials)
    began = time.monotonic()
    with ctx.daemon("scale_fill", loc, fsync=False) as d:
        early = fill(d.url, few, s.scale_batch, s.scale_threads, s.scale_fill_seconds)
    early_ready = []
    for i in range(s.scale_samples):
        with ctx.daemon(f"scale_early_{i}", loc) as d:
            early_ready.append(ready(d)[0])
    filled, fill_seconds = early, early["seconds"]
    if early["complete"]:  # else the time ran out: measured at the count reached
        left = max(1.0, s.scale_fill_seconds - (time.monotonic() - began))
        with ctx.daemon("scale_fill_rest", loc, fsync=False) as d:
            filled = fill(d.url, s.scale_partials, s.scale_batch, s.scale_threads, left,
                          first=early["stored"])
        fill_seconds += filled["seconds"]
    n = filled["stored"]
    samples = [restart(ctx, loc, f"scale_restart_{i}") for i in range(s.scale_samples)]
    got = {k: [x[k] for x in samples] for k in samples[0]}
    fill_peak = max(ctx.peaks["scale_fill"], ctx.peaks.get("scale_fill_rest", 0.0))
    held = f"{n:,} partials held" + ("" if filled["complete"] else
                                     f" (fill stopped at {n:,} of {s.scale_partials:,})")
    if not filled["complete"]:
        ctx.notes.append(f"6. the fill reached {n:,} of {s.scale_partials:,} partials in "
                         f"{fill_seconds:.0f} s ({n / fill_seconds:,.0f}/s); measured there.")
    common = {"partials": n, "target_partials": s.scale_partials, "fill": filled,
              "samples": got, "empty_start_s": empty, "subtasks_per_partition": SUBTASKS,
              "fill_peak_rss_mib": fill_peak, "early": early, "early_ready_s": early_ready}
    ms = 1000.0
    few_held = f"{early['stored']:,} partials held"
    return [
        absolute("scale_restart_early", f"6. restart until health + first page answer, "
                 f"{few_held}", median(early_ready), "s", "<=", 1),
        absolute("scale_rss", f"6. daemon peak RSS after a restart, {held}",
                 max(got["peak_rss_mib"]), "MiB", "<", 300, **common),
        absolute("scale_fill_rss", f"6. daemon peak RSS taking the {n:,} partials (bulk, "
                 f"fsync off)", fill_peak, "MiB", "<", 300),
        absolute("scale_restart", f"6. restart until health + first page answer, {held}",
                 median(got["ready_s"]), "s", "<", 5),
        absolute("scale_first_page", f"6. first page GET /tasks/{{id}}?limit=100, {held}",
                 median(got["first_page_s"]) * ms, "ms", "<", 50),
        info("scale_fill_rate", f"6. fill: partials stored per second (put_partials, "
             f"{s.scale_threads} threads, batches of {s.scale_batch:,}, fsync off)",
             n / fill_seconds, "partials/s"),
        info("scale_partial_get", f"6. per-partial GET latency, {held}",
             median(got["partial_get_s"]) * ms, "ms"),
    ]

