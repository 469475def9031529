"""A real Prometheus (Debian's package) scrapes a running daemon on loopback.

The daemon runs as a subprocess exactly as operators start it; Prometheus runs as a child on
a free loopback port with a temp storage directory, a 1 s scrape interval and the shipped
alert rules. After uploads and fetches, the served-bytes counter read back through
Prometheus' HTTP query API must equal the bytes actually served; the shipped rules must load
and evaluate without error, and every dashboard query must run.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
import yaml

from tests.helpers.deploy import (
    DEPLOY, RunningDaemon, dashboard_exprs, free_port, http, poll, rule_exprs, start_daemon,
    stop,
)

PROMETHEUS = shutil.which("prometheus")
pytestmark = pytest.mark.skipif(
    PROMETHEUS is None,
    reason="Debian's prometheus binary is not installed (scripts/sysdeps.sh installs it with "
           "root and apt-get)")

PREFIX = "/druid/worker/v1/shuffle"
ARROW = "application/vnd.apache.arrow.stream"
DEADLINE = 30.0


def _arrow(rows: int, seed: int) -> bytes:
    table = pa.table({"__time": pa.array([1514764800000 + i for i in range(rows)], pa.int64()),
                      "dim": pa.array([f"d{(i + seed) % 7}" for i in range(rows)]),
                      "count": pa.array([seed + i for i in range(rows)], pa.int64())})
    sink = io.BytesIO()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue()


class Prometheus:
    """Prometheus' HTTP API on loopback."""

    def __init__(self, proc: subprocess.Popen[bytes], url: str, log: Path) -> None:
        self.proc = proc
        self.url = url
        self.log = log

    def api(self, path: str, **params: str) -> Any:
        status, body = http("GET", f"{self.url}{path}?{urllib.parse.urlencode(params)}")
        answer = json.loads(body)
        assert status == 200 and answer["status"] == "success", (path, params, answer)
        return answer["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        data = self.api("/api/v1/query", query=expr)
        assert data["resultType"] == "vector", data
        return data["result"]

    def value(self, expr: str) -> float | None:
        result = self.query(expr)
        return float(result[0]["value"][1]) if result else None


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningDaemon]:
    tmp = tmp_path_factory.mktemp("prom-daemon")
    locations = [tmp / "a", tmp / "b"]
    argv = [sys.executable, "-m", "shuffled", "serve", "--host", "127.0.0.1", "--port", "0",
            "--free-space-reserve", "0", "--access-log", "false"]
    for loc in locations:
        argv += ["--location", str(loc)]
    env = {k: v for k, v in os.environ.items() if not k.startswith("SHUFFLED_")}
    d = start_daemon(argv, env, tmp / "daemon.log", locations)
    yield d
    stop(d.proc)


@pytest.fixture(scope="module")
def prometheus(daemon: RunningDaemon,
               tmp_path_factory: pytest.TempPathFactory) -> Iterator[Prometheus]:
    assert PROMETHEUS is not None
    tmp = tmp_path_factory.mktemp("prometheus")
    target = daemon.url.removeprefix("http://")
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(DEPLOY / "prometheus" / "shuffled-rules.yml")],
        # The shipped job, pointed at this daemon.
        "scrape_configs": [{**_shipped_job(), "static_configs": [{"targets": [target]}]}],
    }
    (tmp / "prometheus.yml").write_text(yaml.safe_dump(config))
    port = free_port()
    log = tmp / "prometheus.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [PROMETHEUS, f"--config.file={tmp / 'prometheus.yml'}",
             f"--storage.tsdb.path={tmp / 'data'}", f"--web.listen-address=127.0.0.1:{port}",
             "--storage.tsdb.retention.time=1h", "--log.level=warn"],
            stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT)
    prom = Prometheus(proc, f"http://127.0.0.1:{port}", log)

    def ready() -> bool:
        if proc.poll() is not None:
            raise AssertionError(f"prometheus exited {proc.returncode}: {log.read_text()[-3000:]}")
        return http("GET", f"{prom.url}/-/ready", timeout=2)[0] == 200

    try:
        poll(ready, DEADLINE, "prometheus /-/ready")
        yield prom
    finally:
        stop(proc)


def _shipped_job() -> dict[str, Any]:
    shipped = yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text())
    (job,) = [j for j in shipped["scrape_configs"] if j["job_name"] == "shuffled"]
    return {k: v for k, v in job.items() if k != "static_configs"}


def test_served_bytes_read_back_through_prometheus(daemon: RunningDaemon,
                                                   prometheus: Prometheus) -> None:
    # The daemon is up as Prometheus sees it.
    poll(lambda: prometheus.value('up{job="shuffled"}') == 1, DEADLINE, "up == 1")
    bodies = {f"s{i}": _arrow(200 * (i + 1), i) for i in range(3)}
    base = f"{daemon.url}{PREFIX}/tasks/promsup"
    query = "start=2018-01-01&end=2018-01-02&partitionId=0"
    for sub, body in bodies.items():
        status, _ = http("PUT", f"{base}/{sub}/partition?{query}", body,
                         {"Content-Type": ARROW})
        assert status == 201
    partial_bytes = 0
    for sub in ("s0", "s2", "s2"):
        status, got = http("GET", f"{base}/{sub}/partition?{query}")
        assert status == 200 and got == bodies[sub]
        partial_bytes += len(got)
    status, whole = http("GET", f"{base}/partition?{query}")
    assert status == 200
    assert pa.ipc.open_stream(whole).read_all().num_rows == 200 + 400 + 600

    # What the daemon itself says now ...
    status, text = http("GET", f"{daemon.url}/metrics")
    assert status == 200
    # ... and what Prometheus has scraped, once it has caught up.
    expected = {"partial": partial_bytes, "partition": len(whole), "pages": 0, "shard": 0}
    for route, value in expected.items():
        assert f'shuffled_served_bytes_total{{route="{route}"}} {float(value)}' \
            in text.decode(), route

    def caught_up() -> bool:
        got = {r["metric"]["route"]: float(r["value"][1]) for r in prometheus.query(
            'shuffled_served_bytes_total{job="shuffled"}')}
        return got == {k: float(v) for k, v in expected.items()}

    poll(caught_up, DEADLINE, f"served bytes {expected} in Prometheus")
    total = prometheus.value('sum(shuffled_served_bytes_total{job="shuffled"})')
    assert total == partial_bytes + len(whole)
    assert prometheus.value('sum(shuffled_served_requests_total{job="shuffled"})') == 4
    assert prometheus.value('shuffled_received_bytes_total{job="shuffled"}') == \
        sum(len(b) for b in bodies.values())
    assert prometheus.value('shuffled_tasks{job="shuffled"}') == 1


def test_shipped_rules_load_and_evaluate(prometheus: Prometheus) -> None:
    expected = set(rule_exprs())

    def evaluated() -> dict[str, dict[str, Any]]:
        rules = {r["name"]: r for g in prometheus.api("/api/v1/rules")["groups"]
                 for r in g["rules"]}
        done = set(rules) == expected and all(r["health"] != "unknown" for r in rules.values())
        return rules if done else {}

    rules = poll(evaluated, DEADLINE, "every shipped rule evaluated once")
    broken = {name: r.get("lastError") for name, r in rules.items() if r["health"] != "ok"}
    assert not broken, broken
    # A healthy daemon: nothing fires (pending is impossible to rule out for `up` at start).
    firing = [a for a in prometheus.api("/api/v1/alerts")["alerts"] if a["state"] == "firing"]
    assert not firing, firing


def test_every_dashboard_query_runs(daemon: RunningDaemon, prometheus: Prometheus) -> None:
    # Grafana fills in the variables: all daemons, a rate window of a few scrapes.
    poll(lambda: prometheus.value('count(shuffled_build_info{job="shuffled"})') == 1,
         DEADLINE, "shuffled_build_info scraped")
    empty = []
    for expr in dashboard_exprs():
        query = expr.replace("$instance", ".+").replace("$__rate_interval", "10s")
        if not prometheus.query(query):  # a syntax error fails inside query()
            empty.append(expr)
    # Families with no sample yet here (no rejection, no overlord) may be empty; the
    # panels that answer "is it working" must not be.
    for needed in ("shuffled_served_bytes_total", "shuffled_location_healthy",
                   "shuffled_location_used_bytes", "shuffled_tasks{"):
        assert not [e for e in empty if needed in e], (needed, empty)
