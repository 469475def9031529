"""Comparison 1: one large partial segment, shuffled per-partial GET vs nginx (sendfile).

Both are fetched by the same curl, ``large_rounds`` times per sample over one keep-alive
connection, bodies discarded; server CPU is utime+stime of the server's processes (nginx
master + worker; the daemon) from /proc, read before and after each sample.
"""

from __future__ import annotations

from collections.abc import Callable

from bench import client
from bench.context import Ctx
from bench.data import write_partials
from bench.fixtures import mirror, partial_urls, upload
from bench.procs import Tree
from bench.stats import Result, alternate, compare, median


def _sampler(urls: list[str], tree: Callable[[], Tree], size: int,
             ) -> Callable[[], dict[str, float]]:
    def sample() -> dict[str, float]:
        t = tree()
        cpu0 = t.cpu()
        done = client.get(urls, expect_bytes=size * len(urls))
        cpu = t.cpu() - cpu0
        return {"mbps": done.nbytes / done.seconds / 1e6, "cpu": cpu, "bytes": done.nbytes,
                "cpu_per_gb": cpu / (done.nbytes / 1e9), "seconds": done.seconds}
    return sample


def run(ctx: Ctx) -> list[Result]:
    """Throughput and server CPU per GB for the large file, both sides alternately."""
    s = ctx.sizes
    base = ctx.scratch("serve_large")
    files = write_partials(base / "data", 1, s.large, seed=1)
    size = files[0].size
    with ctx.daemon("serve_large", base / "loc") as d, ctx.nginx(base / "nginx") as n:
        upload(d, "bench-large", files, parallel=1)
        d.mark("upload")
        ours = partial_urls(d, "bench-large", files) * s.large_rounds
        theirs = [n.url + p for p in mirror(n.root, "large", files)] * s.large_rounds
        sides = {"shuffled": _sampler(ours, lambda: d.tree, size),
                 "nginx": _sampler(theirs, lambda: n.tree, size)}
        for warm in sides.values():  # page cache and connections warm for both
            warm()
        d.mark("warm-up GETs")
        got = alternate(sides, s.repeats)
        d.mark("GETs")
    o, b = got["shuffled"], got["nginx"]
    common = {"bytes": size, "rounds": s.large_rounds, "repeats": s.repeats,
              "samples": got}
    return [
        compare("serve_large_throughput", f"1. GET one {size >> 20} MiB partial: throughput",
                median(o["mbps"]), median(b["mbps"]), "MB/s", ">=", 0.9, **common),
        compare("serve_large_cpu", f"1. GET one {size >> 20} MiB partial: server CPU per GB",
                median(o["cpu_per_gb"]), median(b["cpu_per_gb"]), "CPU s/GB", "<=", 1.2,
                total_cpu_per_gb={k: sum(v["cpu"]) / (sum(v["bytes"]) / 1e9)
                                  for k, v in got.items()}, **common),
    ]
