"""Comparison 2: a partition of many small partial segments (1,000 x 64 KiB).

The partials are stored the way phase 1 stores them: ONE bulk upload
(``ShuffleClient.put_partials``), so they sit back to back in the task's pack file.
nginx serves the files one request each over ``small_parallel`` keep-alive connections;
shuffled serves the same partition as ONE aggregate GET (the seed's API), and also one
request per partial over the same connections. Time to all bytes is curl's wall time for
the whole partition; the table shows it as partition MB/s so higher is better everywhere.
"""

from __future__ import annotations

from collections.abc import Callable

from bench import client
from bench.context import Ctx
from bench.data import END, START, total, write_partials
from bench.fixtures import mirror, partial_urls, upload_bulk, upload_slab
from bench.procs import Tree
from bench.stats import Result, alternate, compare, median


def _sampler(urls: list[str], parallel: int, expect: int | None, payload: int,
             tree: Callable[[], Tree]) -> Callable[[], dict[str, float]]:
    def sample() -> dict[str, float]:
        t = tree()
        cpu0 = t.cpu()
        done = client.get(urls, parallel=parallel, expect_bytes=expect)
        cpu = t.cpu() - cpu0
        return {"seconds": done.seconds, "mbps": payload / done.seconds / 1e6,
                "rps": done.requests / done.seconds, "cpu_per_gb": cpu / (payload / 1e9)}
    return sample


def run(ctx: Ctx) -> list[Result]:
    """Aggregate and per-partial GETs from shuffled vs nginx one file per request."""
    s = ctx.sizes
    base = ctx.scratch("serve_small")
    files = write_partials(base / "data", s.small_count, s.small_size, seed=2)
    payload = total(files)
    with ctx.daemon("serve_small", base / "loc") as d, ctx.nginx(base / "nginx") as n:
        upload_bulk(d, "bench-small", files)
        d.mark("bulk upload")
        nginx_urls = [n.url + p for p in mirror(n.root, "small", files)]
        per_partial = partial_urls(d, "bench-small", files)
        aggregate = [d.partition_url("bench-small", START, END, 0)]
        shard = [upload_slab(d, "bench-slab", files)]
        par = s.small_parallel
        sides = {
            "nginx": _sampler(nginx_urls, par, payload, payload, lambda: n.tree),
            "aggregate": _sampler(aggregate, 1, None, payload, lambda: d.tree),
            "shard": _sampler(shard, 1, None, payload, lambda: d.tree),
            "per_partial": _sampler(per_partial, par, payload, payload, lambda: d.tree),
        }
        for warm in sides.values():
            warm()
        d.mark("warm-up GETs")
        got = alternate(sides, s.repeats)
        d.mark("GETs")
    o, p, b = got["aggregate"], got["per_partial"], got["nginx"]
    common = {"files": len(files), "bytes": payload, "connections": par, "repeats": s.repeats,
              "seconds_median": {k: median(v["seconds"]) for k, v in got.items()},
              "requests_per_second_median": {k: median(v["rps"]) for k, v in got.items()},
              "samples": got}
    what = f"{len(files)} x {s.small_size >> 10} KiB"
    return [
        compare("serve_small_aggregate",
                f"2. GET partition of {what}: shuffled aggregate GET vs nginx {par} conns",
                median(o["mbps"]), median(b["mbps"]), "MB/s", ">=", 1.5, **common),
        compare("serve_small_cpu", f"2. GET partition of {what}: server CPU per GB, "
                f"aggregate GET vs nginx", median(o["cpu_per_gb"]), median(b["cpu_per_gb"]),
                "CPU s/GB", "<=", 2.0, **common),
        compare("serve_small_shard",
                f"2. GET the same rows as ONE slab's shard (GET .../shard) vs nginx {par} conns",
                median(got["shard"]["mbps"]), median(b["mbps"]), "MB/s", ">=", 2.0, **common),
        compare("serve_small_shard_cpu", f"2. GET the same rows as ONE slab's shard: server "
                f"CPU per GB vs nginx", median(got["shard"]["cpu_per_gb"]),
                median(b["cpu_per_gb"]), "CPU s/GB", "<=", 2.0, **common),
        compare("serve_small_per_partial",
                f"2. GET partition of {what}: shuffled per-partial GETs vs nginx, {par} conns",
                median(p["mbps"]), median(b["mbps"]), "MB/s", None, None, **common),
    ]
