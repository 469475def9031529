"""/metrics scraped and parsed like Prometheus does: counters move by exactly what was served.

Every test scrapes before and after, and compares the difference with the bytes and
requests it just made, so the numbers are checked rather than merely present.
"""

from __future__ import annotations

import re
import socket
from pathlib import Path
from typing import Any

from aiohttp.test_utils import TestClient
from prometheus_client.parser import text_string_to_metric_families

from shuffled.crc import crc32c
from shuffled.protocol import format_crc32c
from shuffled.server.state import STATE, DaemonState
from tests.conftest import DAY, PREFIX, arrow_bytes, data_size, sample_table
from tests.helpers.clock import Clock

ARROW = {"Content-Type": "application/vnd.apache.arrow.stream"}
PARTIAL_ROUTE = f"{PREFIX}/tasks/{{sup}}/{{sub}}/partition"
PARTITION_ROUTE = f"{PREFIX}/tasks/{{sup}}/partition"

Labels = tuple[tuple[str, str], ...]


class Scrape:
    """One parsed scrape: sample values by (sample name, labels), and family types."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.samples: dict[tuple[str, Labels], float] = {}
        self.types: dict[str, str] = {}
        self.label_values: set[str] = set()
        for family in text_string_to_metric_families(text):
            self.types[family.name] = family.type
            for s in family.samples:
                self.samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
                self.label_values.update(s.labels.values())

    def __call__(self, name: str, **labels: str) -> float:
        return self.samples.get((name, tuple(sorted(labels.items()))), 0.0)

    def series(self, name: str) -> dict[Labels, float]:
        return {lab: v for (n, lab), v in self.samples.items() if n == name}


async def scrape(client: TestClient) -> Scrape:
    resp = await client.get("/metrics")
    assert resp.status == 200
    assert resp.headers["Content-Type"].startswith("text/plain")
    return Scrape(await resp.text())


def state(client: TestClient) -> DaemonState:
    return client.server.app[STATE]


def url(sup: str, sub: str | None = "s1") -> str:
    return f"{PREFIX}/tasks/{sup}/{sub}/partition" if sub else f"{PREFIX}/tasks/{sup}/partition"


def q(pid: int = 0) -> dict[str, str]:
    return {**DAY, "partitionId": str(pid)}


async def put(client: TestClient, body: bytes, sup: str = "sup", sub: str = "s1",
              pid: int = 0) -> dict[str, Any]:
    resp = await client.put(url(sup, sub), params=q(pid), data=body, headers={
        **ARROW, "Content-Digest": format_crc32c(crc32c(body))})
    answer = await resp.json()
    assert resp.status == (200 if answer["replaced"] else 201), answer
    return answer


async def test_served_and_received_counters_move_by_exactly_what_was_served(
        daemon: TestClient) -> None:
    small, large = arrow_bytes(sample_table(20)), arrow_bytes(sample_table(5000, seed=1))
    before = await scrape(daemon)
    await put(daemon, small, sub="a")
    await put(daemon, large, sub="b")
    await put(daemon, small, sub="a")  # a retry replacing the same key counts again
    mid = await scrape(daemon)
    assert mid("shuffled_received_bytes_total") - before("shuffled_received_bytes_total") \
        == 2 * len(small) + len(large)
    assert mid("shuffled_received_partials_total") \
        - before("shuffled_received_partials_total") == 3
    assert mid("shuffled_served_bytes_total", route="partial") == 0

    resp = await daemon.get(url("sup", "b"), params=q())
    assert await resp.read() == large
    etag = resp.headers["ETag"]
    resp = await daemon.get(url("sup", "b"), params=q(), headers={"Range": "bytes=100-1099"})
    assert resp.status == 206 and len(await resp.read()) == 1000
    # Not served: 304, HEAD, 404, 400.
    assert (await daemon.get(url("sup", "b"), params=q(),
                             headers={"If-None-Match": etag})).status == 304
    assert (await daemon.head(url("sup", "b"), params=q())).status == 200
    assert (await daemon.get(url("sup", "zz"), params=q())).status == 404
    assert (await daemon.get(url("sup", "b"), params=q(-1))).status == 400
    resp = await daemon.get(url("sup", None), params=q())
    partition = await resp.read()
    assert resp.status == 200 and int(resp.headers["X-Shuffled-Partials"]) == 2

    after = await scrape(daemon)
    assert after("shuffled_served_bytes_total", route="partial") \
        - mid("shuffled_served_bytes_total", route="partial") == len(large) + 1000
    assert after("shuffled_served_requests_total", route="partial") \
        - mid("shuffled_served_requests_total", route="partial") == 2
    assert after("shuffled_served_bytes_total", route="partition") \
        - mid("shuffled_served_bytes_total", route="partition") == len(partition)
    assert after("shuffled_served_requests_total", route="partition") \
        - mid("shuffled_served_requests_total", route="partition") == 1
    # Reads receive nothing.
    assert after("shuffled_received_bytes_total") == mid("shuffled_received_bytes_total")
    # The per-task JSON carries the same figures (per-task numbers live there, not in labels).
    detail = await (await daemon.get(f"{PREFIX}/tasks/sup")).json()
    assert detail["servedBytes"] == len(large) + 1000 + len(partition)
    assert detail["servedRequests"] == 3
    assert detail["receivedBytes"] == 2 * len(small) + len(large)


async def test_rejected_requests_by_reason(daemon: TestClient) -> None:
    body = arrow_bytes(sample_table(10))
    before = await scrape(daemon)
    bad = [
        daemon.get(url("sup"), params=q(-1)),                                   # partition id
        daemon.get(url(".hidden"), params=q()),                                 # id
        daemon.get(url("sup"), params={**DAY, "partitionId": "0", "end": "x"}),  # interval
        daemon.get(url("nobody"), params=q()),                                  # not found
        daemon.put(url("sup"), params=q(), data=body, headers={
            **ARROW, "Content-Digest": format_crc32c(crc32c(body) ^ 1)}),        # digest
        daemon.put(url("sup"), params=q(), data=b"not arrow at all", headers=ARROW),
        daemon.post(url("sup"), params=q()),                                    # method
    ]
    statuses = [(await r).status for r in bad]
    assert statuses == [400, 400, 400, 404, 400, 400, 405]
    after = await scrape(daemon)
    moved = {dict(lab)["reason"]: v - before.samples.get(("shuffled_rejected_requests_total",
                                                          lab), 0.0)
             for lab, v in after.series("shuffled_rejected_requests_total").items()}
    moved = {k: v for k, v in moved.items() if v}
    assert moved == {"invalid_partition_id": 1, "invalid_id": 1, "invalid_interval": 1,
                     "not_found": 1, "digest_mismatch": 1, "invalid_body": 1,
                     "method_not_allowed": 1}
    assert after("shuffled_received_partials_total") == 0
    assert after("shuffled_http_requests_total", route=PARTIAL_ROUTE, method="GET",
                 status="400") == 3


async def test_location_gauges_used_capacity_health(start_daemon, make_settings,
                                                    tmp_path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    settings = make_settings([f"{a}:{10 << 20}", f"{b}:{20 << 20}"])
    client = await start_daemon(settings)
    used = {str(a): 0, str(b): 0}
    parts = {str(a): 0, str(b): 0}
    for i in range(5):
        body = arrow_bytes(sample_table(10 + i))
        info = await put(client, body, sub=f"s{i}")
        used[info["location"]] += len(body)
        parts[info["location"]] += 1
    m = await scrape(client)
    for path in (str(a), str(b)):
        # What its packs hold: each stream but its end marker, its schema message once, and
        # the commit records naming them.
        packs = list(Path(path).glob("*/*.pack"))
        on_disk = sum(f.stat().st_size for f in packs)
        assert m("shuffled_location_used_bytes", location=path) == on_disk
        assert sum(data_size(f) for f in packs) < used[path]
        assert m("shuffled_location_partials", location=path) == parts[path]
        assert m("shuffled_location_healthy", location=path) == 1
        assert m("shuffled_location_free_bytes", location=path) > 0
    assert m("shuffled_location_capacity_bytes", location=str(a)) == 10 << 20
    assert m("shuffled_location_capacity_bytes", location=str(b)) == 20 << 20
    assert m.types["shuffled_location_used_bytes"] == "gauge"

    state(client).store.locations[1].mark_unhealthy("simulated EIO")
    m = await scrape(client)
    assert m("shuffled_location_healthy", location=str(b)) == 0
    assert m("shuffled_location_healthy", location=str(a)) == 1
    await state(client).sweeper.run_once()  # the sweep's probe brings it back
    assert (await scrape(client))("shuffled_location_healthy", location=str(b)) == 1


async def test_held_gauges_and_deletions_by_cause(start_daemon, make_settings) -> None:
    clock = Clock()
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    dead = f"http://127.0.0.1:{sock.getsockname()[1]}"
    sock.close()
    settings = make_settings(expiry_timeout=100, max_age=1000, overlord_url=dead)
    client = await start_daemon(settings, clock=clock)
    b1, b2 = arrow_bytes(sample_table(10)), arrow_bytes(sample_table(30))
    await put(client, b1, sup="x", sub="a")
    await put(client, b2, sup="x", sub="b", pid=1)
    await put(client, b1, sup="y")
    m = await scrape(client)
    assert m("shuffled_tasks") == 2 and m("shuffled_partials") == 3
    assert m("shuffled_held_bytes") == 2 * len(b1) + len(b2)

    assert (await client.delete(f"{PREFIX}/tasks/x")).status == 200
    assert (await client.delete(f"{PREFIX}/tasks/x")).status == 200  # idempotent: counted once
    m = await scrape(client)
    assert m("shuffled_deleted_tasks_total", cause="request") == 1
    assert m("shuffled_deleted_bytes_total", cause="request") == len(b1) + len(b2)
    assert m("shuffled_tasks") == 1 and m("shuffled_partials") == 1
    assert m("shuffled_held_bytes") == len(b1)

    clock.now += 100  # expired, overlord unreachable: kept ...
    await state(client).sweeper.run_once()
    m = await scrape(client)
    assert m("shuffled_expired_tasks_total") == 1 and m("shuffled_tasks") == 1
    assert m("shuffled_overlord_requests_total", outcome="unreachable") == 1
    assert m("shuffled_deleted_tasks_total", cause="max_age") == 0
    clock.now += 900  # ... until max age
    await state(client).sweeper.run_once()
    m = await scrape(client)
    assert m("shuffled_deleted_tasks_total", cause="max_age") == 1
    assert m("shuffled_deleted_bytes_total", cause="max_age") == len(b1)
    assert m("shuffled_deleted_tasks_total", cause="expired") == 0
    assert m("shuffled_tasks") == 0 and m("shuffled_partials") == 0
    assert m("shuffled_held_bytes") == 0


async def test_sweeper_runs_failures_and_expiries(start_daemon, make_settings,
                                                  monkeypatch) -> None:
    clock = Clock()
    client = await start_daemon(make_settings(expiry_timeout=100, max_age=1000), clock=clock)
    body = arrow_bytes(sample_table(10))
    await put(client, body, sup="t")
    sweeper = state(client).sweeper
    before = await scrape(client)
    assert before("shuffled_sweeps_total") == 0
    await sweeper.run_once()
    clock.now += 100
    await sweeper.run_once()
    m = await scrape(client)
    assert m("shuffled_sweeps_total") == 2 and m("shuffled_sweep_failures_total") == 0
    assert m("shuffled_last_sweep_timestamp_seconds") == clock.now
    assert m("shuffled_expired_tasks_total") == 1
    assert m("shuffled_deleted_tasks_total", cause="expired") == 1
    assert m("shuffled_deleted_bytes_total", cause="expired") == len(body)

    def broken() -> list:
        raise OSError("index unreadable")

    monkeypatch.setattr(state(client).store, "tasks", broken)
    try:
        await sweeper.run_once()
    except OSError:
        pass
    monkeypatch.undo()
    m = await scrape(client)
    assert m("shuffled_sweeps_total") == 3 and m("shuffled_sweep_failures_total") == 1


async def test_latency_histogram_by_route_template_never_raw_path(daemon: TestClient) -> None:
    body = arrow_bytes(sample_table(10))
    sup, sub = "supXYZ123", "subABC987"
    await put(daemon, body, sup=sup, sub=sub)
    for _ in range(3):
        await (await daemon.get(url(sup, sub), params=q())).read()
    await (await daemon.get(url(sup, None), params=q())).read()
    await daemon.get(f"{PREFIX}/tasks/{sup}")
    await daemon.get(f"/no/such/{sup}/path")
    await daemon.delete(f"{PREFIX}/tasks/{sup}")
    m = await scrape(daemon)
    assert m.types["shuffled_request_duration_seconds"] == "histogram"
    assert m("shuffled_request_duration_seconds_count", route=PARTIAL_ROUTE, method="GET") == 3
    assert m("shuffled_request_duration_seconds_count", route=PARTIAL_ROUTE, method="PUT") == 1
    assert m("shuffled_request_duration_seconds_count", route=PARTITION_ROUTE,
             method="GET") == 1
    assert m("shuffled_request_duration_seconds_count", route=f"{PREFIX}/tasks/{{sup}}",
             method="DELETE") == 1
    assert m("shuffled_request_duration_seconds_count", route="unmatched", method="GET") == 1
    assert m("shuffled_request_duration_seconds_bucket", route=PARTIAL_ROUTE, method="GET",
             le="+Inf") == 3
    assert m("shuffled_request_duration_seconds_sum", route=PARTIAL_ROUTE, method="GET") > 0
    # No id anywhere: neither in a label value nor in the text at all.
    assert not any(sup in v or sub in v for v in m.label_values)
    assert sup not in m.text and sub not in m.text
    assert m("shuffled_http_requests_total", route=PARTIAL_ROUTE, method="GET",
             status="200") == 3


async def test_names_follow_prometheus_conventions(daemon: TestClient) -> None:
    await put(daemon, arrow_bytes(sample_table(5)))
    m = await scrape(daemon)
    assert m.types, "nothing scraped"
    for name, kind in m.types.items():
        assert name.startswith("shuffled_"), name
        if kind == "counter":  # samples of a counter are NAME_total (and NAME_created)
            names = {n for n, _ in m.samples if n.startswith(name + "_")}
            assert names <= {f"{name}_total", f"{name}_created"}, (name, names)
    for (name, labels) in m.samples:
        keys = {k for k, _ in labels}
        assert not keys & {"task", "supervisorTaskId", "sup", "subTaskId", "path"}, name
        assert not name.endswith(("_milliseconds", "_kilobytes", "_megabytes")), name
    documented = _documented_metrics()
    # prometheus_client's text format adds a NAME_created gauge beside each counter/histogram.
    missing = {n for n in m.types if n not in documented
               and not (n.endswith("_created") and n.removesuffix("_created") in m.types)}
    assert not missing, f"metrics missing from docs/metrics.md: {sorted(missing)}"


def _documented_metrics(doc: str = "docs/metrics.md") -> set[str]:
    text = (Path(__file__).resolve().parents[2] / doc).read_text()
    names = set()
    for found in re.findall(r"`(shuffled_[a-z_]+)`", text):
        names.add(found.removesuffix("_total"))
    return names


async def test_overdue_tasks_and_expiry_overdue_seconds(start_daemon, make_settings) -> None:
    """The signal of the "expired data not removed" alert: it grows while the overlord
    cannot be asked (or the sweeper is stuck) and drops to 0 once the task is deleted."""
    clock = Clock()
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    dead = f"http://127.0.0.1:{sock.getsockname()[1]}"  # nothing listens: unreachable
    sock.close()
    client = await start_daemon(
        make_settings(expiry_timeout=100, max_age=1000, overlord_url=dead), clock=clock)
    await put(client, arrow_bytes(sample_table(10)), sup="old")
    clock.now += 50
    await put(client, arrow_bytes(sample_table(10)), sup="young")
    m = await scrape(client)
    assert m("shuffled_overdue_tasks") == 0 and m("shuffled_expiry_overdue_seconds") == 0
    clock.now += 80  # "old" is 30 s past its expiry, "young" has 20 s left
    m = await scrape(client)
    assert m("shuffled_overdue_tasks") == 1
    assert m("shuffled_expiry_overdue_seconds") == 30
    await state(client).sweeper.run_once()  # overlord unreachable: kept, still overdue
    clock.now += 100
    m = await scrape(client)
    assert m("shuffled_overdue_tasks") == 2
    assert m("shuffled_expiry_overdue_seconds") == 130
    clock.now += 1000  # past max_age: the sweeper deletes both
    await state(client).sweeper.run_once()
    m = await scrape(client)
    assert m("shuffled_tasks") == 0
    assert m("shuffled_overdue_tasks") == 0 and m("shuffled_expiry_overdue_seconds") == 0


async def test_sweep_period_gauge_follows_the_scheduler(start_daemon, make_settings) -> None:
    client = await start_daemon(make_settings(sweep_period=42))
    assert (await scrape(client))("shuffled_sweep_period_seconds") == 42


_DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
_SELECTOR = re.compile(r"\b(shuffled_[a-z_]+)(?:\{([^}]*)\})?")
# A label matcher: =, !=, =~ or !~ (quotes escaped inside the dashboard's JSON).
_MATCHER = re.compile(r'(\w+)\s*(=~|!~|!=|=)\s*\\?"(.*?)\\?"')
Matcher = tuple[str, str, str]


def _shipped_selectors() -> list[tuple[str, tuple[Matcher, ...]]]:
    """Every shuffled_* selector in the shipped alert rules and dashboard, with its label
    matchers (all four kinds) other than job/instance and Grafana's ``$variables``."""
    text = (_DEPLOY / "prometheus" / "shuffled-rules.yml").read_text()
    text += (_DEPLOY / "grafana" / "dashboard.json").read_text()
    out = []
    for name, matchers in _SELECTOR.findall(text):
        kept = tuple(m for m in _MATCHER.findall(matchers or "")
                     if m[0] not in ("job", "instance") and "$" not in m[2])
        out.append((name, kept))
    return out


def _matches(labels: dict[str, str], matchers: tuple[Matcher, ...]) -> bool:
    """PromQL's semantics: regexes are anchored, a missing label is the empty string."""
    for label, op, value in matchers:
        have = labels.get(label, "")
        if not {"=": have == value, "!=": have != value,
                "=~": re.fullmatch(value, have) is not None,
                "!~": re.fullmatch(value, have) is None}[op]:
            return False
    return True


async def test_first_scrape_has_every_family_the_rules_and_dashboard_use(
        daemon: TestClient) -> None:
    """A fresh daemon's very first scrape already has, for every selector in the shipped
    rules and dashboard, a series matching all its label matchers (``reason="overloaded"``,
    ``status=~"5..", status!="503"``, ``outcome!="ok"``...), so rate() and the alerts work
    before the first event (a rule naming something not exported at zero fails here)."""
    first = await scrape(daemon)  # nothing happened before it, not even another scrape
    selectors = _shipped_selectors()
    assert len(selectors) > 20, "the rules and dashboard were not read"
    assert ("shuffled_http_requests_total", (("status", "=~", "5.."), ("status", "!=", "503"))
            ) in selectors, "the matcher parser missed the error-rate alert's selector"
    names = {s[0] for s in first.samples}
    for name, matchers in selectors:
        candidates = [n for n in (name, f"{name}_total", f"{name}_bucket") if n in names]
        assert candidates, f"{name} (used by deploy/) is not in the first scrape"
        assert any(_matches(dict(labels), matchers)
                   for n in candidates for labels in first.series(n)), (name, matchers)
    # The families whose label values are known in advance are all there at zero.
    for reason in ("overloaded", "draining", "not_found", "digest_mismatch", "task_failed"):
        assert first("shuffled_rejected_requests_total", reason=reason) == 0.0
    for outcome in ("ok", "unreachable", "timeout", "http_error", "bad_answer"):
        assert ("shuffled_overlord_requests_total",
                (("outcome", outcome),)) in first.samples
    assert first("shuffled_request_duration_seconds_count", route=PARTITION_ROUTE,
                 method="GET") == 0.0
    assert ("shuffled_request_duration_seconds_count",
            (("method", "GET"), ("route", PARTITION_ROUTE))) in first.samples
