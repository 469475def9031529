"""Comparison 3b: what per-task token checks cost on the small-partial rows.

The same 1,000 x 64 KiB partials (fsync off: the daemon's own CPU is what is left to see)
as single PUTs by ``put_parallel`` threads of ShuffleClient and as ONE bulk upload, to a
daemon with no auth vs a daemon with ``--signing-secret-file`` whose clients carry a
per-task write token (HMAC-SHA256 verified on every request; docs/security.md). Both
daemons run side by side, samples alternate, medians; target: the scoped side at >= 0.95x
the open one (token checks cost < 5%).
"""

from __future__ import annotations

import secrets
from pathlib import Path

from bench import pyclient
from bench.context import Ctx
from bench.data import END, START, total, write_partials
from bench.stats import Result, alternate, compare, median
from shuffled.protocol import Interval
from shuffled.tokens import Scope, mint

INTERVAL = Interval.parse(START, END)


def run(ctx: Ctx) -> list[Result]:
    s = ctx.sizes
    base = ctx.scratch("tokens")
    files = write_partials(base / "data", s.small_count, s.small_size, seed=5)
    bodies = [f.path.read_bytes() for f in files]
    subs = [f.sub for f in files]
    nbytes = total(files)
    secret = secrets.token_urlsafe(32)
    (base / "secret").write_text(secret)
    counter = iter(range(1 << 30))

    with ctx.daemon("tokens_open", base / "loc-open", fsync=False) as open_, \
            ctx.daemon("tokens_scoped", base / "loc-scoped", fsync=False,
                       extra=("--signing-secret-file", str(base / "secret"))) as scoped:

        def side(url: str, bulk: bool, scope: bool) -> dict[str, float]:
            sup = f"bench-tokens-{next(counter)}"
            token = mint(secret.encode(), sup, Scope.ADMIN, 3600) if scope else None
            items = list(zip(pyclient.keys(sup, subs, INTERVAL), bodies))
            seconds = (pyclient.put_bulk(url, sup, items, token=token) if bulk
                       else pyclient.put_threads(url, items, s.put_parallel, token=token))
            pyclient.delete(url, sup, token=token)
            return {"seconds": seconds, "mbps": nbytes / seconds / 1e6}

        got = alternate({
            "open_puts": lambda: side(open_.url, False, False),
            "scoped_puts": lambda: side(scoped.url, False, True),
            "open_bulk": lambda: side(open_.url, True, False),
            "scoped_bulk": lambda: side(scoped.url, True, True),
        }, s.repeats)
    what = f"{len(files):,} x {s.small_size >> 10} KiB"
    common = {"bytes": nbytes, "files": len(files), "repeats": s.repeats,
              "seconds_median": {k: median(v["seconds"]) for k, v in got.items()},
              "samples": got}
    return [
        compare("tokens_puts", f"3b. PUT {what}, {s.put_parallel} threads, fsync off: per-task "
                "token checked vs no auth", median(got["scoped_puts"]["mbps"]),
                median(got["open_puts"]["mbps"]), "MB/s", ">=", 0.95, **common),
        compare("tokens_bulk", f"3b. {what} in ONE bulk upload, fsync off: per-task token "
                "vs no auth", median(got["scoped_bulk"]["mbps"]),
                median(got["open_bulk"]["mbps"]), "MB/s", ">=", 0.95, **common),
    ]
