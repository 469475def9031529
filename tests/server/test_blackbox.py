"""Black-box checks of the shuffled HTTP API (docs/design.md section 3/4 and README).

The daemon runs as a subprocess exactly as a user would start it; the client side uses only
the standard library (http.client), pyarrow (to build and read Arrow IPC streams) and crc32c.
Nothing under shuffled/ is imported.
"""

from __future__ import annotations

import base64
import http.client
import json
import os
import re
import subprocess
import sys
import threading
import time
import urllib.parse
import uuid
from pathlib import Path

import crc32c
import pyarrow as pa
import pytest

from tests.conftest import data_size, packed_size
from tests.helpers.procs import first_line

PREFIX = "/druid/worker/v1/shuffle"
ARROW = "application/vnd.apache.arrow.stream"
DAY = ("2018-01-01T00:00:00.000Z", "2018-01-02T00:00:00.000Z")
START_TIMEOUT = 30.0
HTTP_TIMEOUT = 15.0
MAIN_DIR = Path(__file__).resolve().parents[2]


# --------------------------------------------------------------------------- daemon handling


class Daemon:
    def __init__(self, proc: subprocess.Popen, url: str, locations: list[Path]):
        self.proc = proc
        self.url = url
        parsed = urllib.parse.urlsplit(url)
        self.host = parsed.hostname
        self.port = parsed.port
        self.locations = locations


def _start_daemon(tmp: Path, locations: list[str], *extra: str) -> Daemon:
    args = [sys.executable, "-m", "shuffled", "serve", "--host", "127.0.0.1", "--port", "0"]
    paths = []
    for loc in locations:
        args += ["--location", loc]
        paths.append(Path(loc.rsplit(":", 1)[0] if re.search(r":\d+$", loc) else loc))
    args += ["--free-space-reserve", "0", *extra]
    log = open(tmp / "daemon.log", "wb")
    proc = subprocess.Popen(
        args,
        cwd=MAIN_DIR,
        stdout=subprocess.PIPE,
        stderr=log,
        stdin=subprocess.DEVNULL,
    )
    first = first_line(proc, START_TIMEOUT)
    if first is None:
        _stop(proc)
        pytest.fail(f"daemon exited or printed nothing within {START_TIMEOUT}s: "
                    f"{(tmp / 'daemon.log').read_text()[-2000:]}")
    m = re.match(r"shuffled listening on (http://\S+)", first.strip())
    if not m:
        _stop(proc)
        pytest.fail(f"first stdout line is not 'shuffled listening on URL': {first!r}")
    return Daemon(proc, m.group(1), paths)


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.kill(proc.pid, 15)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, 9)
            proc.wait(timeout=10)


@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("bb-main")
    d = _start_daemon(tmp, [str(tmp / "a"), str(tmp / "b")])
    yield d
    _stop(d.proc)


@pytest.fixture(scope="module")
def small_daemon(tmp_path_factory):
    """Second daemon: --max-partial-bytes 1000."""
    tmp = tmp_path_factory.mktemp("bb-413")
    d = _start_daemon(tmp, [str(tmp / "a"), str(tmp / "b")], "--max-partial-bytes", "1000",
                      "--max-concurrent-uploads", "1")
    yield d
    _stop(d.proc)


@pytest.fixture(scope="module")
def tiny_daemon(tmp_path_factory):
    """Third daemon: one location with max size 2000 bytes."""
    tmp = tmp_path_factory.mktemp("bb-507")
    d = _start_daemon(tmp, [f"{tmp / 'a'}:2000"])
    yield d
    _stop(d.proc)


@pytest.fixture(scope="module")
def auth_daemon(tmp_path_factory):
    """Fourth daemon: auth on."""
    tmp = tmp_path_factory.mktemp("bb-401")
    d = _start_daemon(tmp, [str(tmp / "a")], "--auth-token", "s3cret-token")
    yield d
    _stop(d.proc)


# --------------------------------------------------------------------------- HTTP helpers


class Resp:
    def __init__(self, status: int, headers: http.client.HTTPMessage, body: bytes):
        self.status = status
        self.headers = headers
        self.body = body

    def header(self, name: str) -> str | None:
        return self.headers.get(name)

    def json(self):
        ctype = self.header("Content-Type") or ""
        assert ctype.split(";")[0].strip() == "application/json", (self.status, ctype, self.body[:300])
        return json.loads(self.body)

    def __repr__(self) -> str:
        return f"<Resp {self.status} {dict(self.headers)} {self.body[:300]!r}>"


def request(d: Daemon, method: str, path: str, body=None, headers=None, chunked=False) -> Resp:
    conn = http.client.HTTPConnection(d.host, d.port, timeout=HTTP_TIMEOUT)
    try:
        hdrs = dict(headers or {})
        if chunked:
            data = body if body is not None else b""
            step = 1 << 12
            conn.request(method, path, body=iter([data[i : i + step] for i in range(0, len(data), step)] or [b""]),
                         headers=hdrs, encode_chunked=True)
        else:
            conn.request(method, path, body=body, headers=hdrs)
        r = conn.getresponse()
        data = r.read()
        return Resp(r.status, r.headers, data)
    finally:
        conn.close()


def q(s: str) -> str:
    return urllib.parse.quote(s, safe="")


def part_query(start=DAY[0], end=DAY[1], pid=0) -> str:
    items = []
    if start is not None:
        items.append(("start", start))
    if end is not None:
        items.append(("end", end))
    if pid is not None:
        items.append(("partitionId", str(pid)))
    return urllib.parse.urlencode(items)


def partial_path(sup: str, sub: str, **kw) -> str:
    return f"{PREFIX}/tasks/{q(sup)}/{q(sub)}/partition?{part_query(**kw)}"


def partition_path(sup: str, **kw) -> str:
    return f"{PREFIX}/tasks/{q(sup)}/partition?{part_query(**kw)}"


def put(d, sup, sub, body, ctype=ARROW, extra_headers=None, chunked=False, **kw) -> Resp:
    headers = {"Content-Type": ctype} if ctype is not None else {}
    headers.update(extra_headers or {})
    return request(d, "PUT", partial_path(sup, sub, **kw), body=body, headers=headers, chunked=chunked)


def arrow_stream(values, batches=1, name="x") -> bytes:
    schema = pa.schema([(name, pa.int64()), ("s", pa.string())])
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, schema) as w:
        vals = list(values)
        n = max(1, (len(vals) + batches - 1) // batches) if vals else 1
        chunks = [vals[i : i + n] for i in range(0, len(vals), n)] or [[]]
        for chunk in chunks:
            w.write_batch(pa.record_batch([pa.array(chunk, pa.int64()), pa.array([f"v{v}" for v in chunk])],
                                          schema=schema))
    return sink.getvalue().to_pybytes()


def crc(data: bytes) -> int:
    return crc32c.crc32c(data)


def digest_header(data: bytes) -> str:
    return "crc32c=:" + base64.b64encode(crc(data).to_bytes(4, "big")).decode() + ":"


def parse_digest(value: str | None) -> int | None:
    if value is None:
        return None
    m = re.search(r"crc32c=:([A-Za-z0-9+/=]+):", value)
    assert m, f"Content-Digest not in RFC 9530 crc32c=:<base64>: form: {value!r}"
    raw = base64.b64decode(m.group(1))
    assert len(raw) == 4, f"crc32c digest must be 4 bytes, got {len(raw)}: {value!r}"
    return int.from_bytes(raw, "big")


def uid(prefix="t") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def snapshot(d: Daemon) -> set[str]:
    """Every path in the locations but the catalog's own files (its WAL comes and goes)."""
    out = set()
    for loc in d.locations:
        if loc.exists():
            for p in loc.rglob("*"):
                if ".shuffled" not in p.relative_to(loc).parts:
                    out.add(str(p))
    return out


def sized(d: Daemon) -> dict[str, int | None]:
    """snapshot() with each file's size: a refused upload appended to an existing pack and
    cut back leaves the same paths, so only sizes show whether its bytes are gone."""
    return {p: (Path(p).stat().st_size if Path(p).is_file() else None) for p in snapshot(d)}


def assert_error(r: Resp, status: int | tuple, *mentions: str) -> dict:
    statuses = status if isinstance(status, tuple) else (status,)
    assert r.status in statuses, r
    j = r.json()
    assert isinstance(j, dict) and isinstance(j.get("error"), str) and j["error"], r
    if mentions:
        text = json.dumps(j).lower()
        assert any(m.lower() in text for m in mentions), f"error does not name any of {mentions}: {j}"
    return j


def assert_pristine(d: Daemon) -> None:
    """Only a lock file, an empty temp directory and the catalog may exist in each location."""
    for loc in d.locations:
        entries = [e for e in loc.iterdir() if e.name != ".shuffled"] if loc.exists() else []
        files = [e for e in entries if e.is_file()]
        dirs = [e for e in entries if e.is_dir()]
        assert len(files) <= 1 and all("lock" in f.name.lower() for f in files), entries
        assert len(dirs) <= 1, entries
        for dd in dirs:
            assert list(dd.rglob("*")) == [], f"temp dir not empty: {list(dd.rglob('*'))}"
        assert len(files) + len(dirs) == len(entries), entries


def listing(d: Daemon, sup: str | None = None) -> Resp:
    return request(d, "GET", f"{PREFIX}/tasks" + (f"/{q(sup)}" if sup else ""))


def task_entry(d: Daemon, sup: str) -> dict | None:
    r = listing(d)
    assert r.status == 200, r
    tasks = r.json()["tasks"]
    found = [t for t in tasks if t.get("supervisorTaskId") == sup]
    assert len(found) <= 1
    return found[0] if found else None


def expiry_of(entry: dict):
    keys = [k for k in entry if "expir" in k.lower()]
    assert keys, f"no expiry in {entry}"
    return entry[keys[0]]


def checksum_matches(value, data: bytes) -> bool:
    c = crc(data)
    if isinstance(value, int):
        return value == c
    if isinstance(value, str):
        v = value.strip()
        if v.startswith("crc32c="):
            return parse_digest(v) == c
        try:
            if int(v, 16) == c:
                return True
        except ValueError:
            pass
        try:
            return base64.b64decode(v) == c.to_bytes(4, "big")
        except Exception:
            return False
    return False


# --------------------------------------------------------------------------- endpoints


def test_startup_prints_url_and_status_endpoints(daemon):
    assert daemon.url.startswith("http://127.0.0.1:")
    r = request(daemon, "GET", "/status/health")
    assert r.status == 200
    assert json.loads(r.body) is True

    r1 = request(daemon, "GET", "/status")
    assert r1.status == 200
    s1 = r1.json()
    assert isinstance(s1.get("version"), str) and s1["version"]
    up_keys = [k for k in s1 if "uptime" in k.lower()]
    assert up_keys, s1
    up1 = s1[up_keys[0]]
    assert isinstance(up1, (int, float)) and up1 >= 0
    locs = s1.get("locations")
    assert isinstance(locs, list) and len(locs) == 2
    text = json.dumps(locs)
    for loc in daemon.locations:
        assert str(loc) in text
    # uptime grows (a bounded poll: the daemon's clock is its own, this test's is not)
    deadline = time.monotonic() + 5
    while (up2 := request(daemon, "GET", "/status").json()[up_keys[0]]) <= up1:
        assert time.monotonic() < deadline, "uptime did not grow"
    assert up2 > up1


PROM_LINE = re.compile(
    r'^[a-zA-Z_:][a-zA-Z0-9_:]*(\{([a-zA-Z_][a-zA-Z0-9_]*="([^"\\]|\\.)*",?)*\})?'
    r" [-+]?([0-9.eE+-]+|NaN|[+-]?Inf)( -?[0-9]+)?$"
)


def metric_value(text: str, name: str) -> float | None:
    m = re.search(rf"^{re.escape(name)}(?:\{{\}})? (\S+)$", text, re.M)
    return float(m.group(1)) if m else None


def test_metrics_is_prometheus_text(daemon):
    before = request(daemon, "GET", "/metrics")
    assert before.status == 200
    assert (before.header("Content-Type") or "").startswith("text/plain")
    text = before.body.decode()
    types = {}
    for line in text.splitlines():
        if not line:
            continue
        if line.startswith("#"):
            m = re.match(r"^# (HELP|TYPE) ([a-zA-Z_:][a-zA-Z0-9_:]*) ?(.*)$", line)
            assert m, line
            if m.group(1) == "TYPE":
                assert m.group(3) in {"counter", "gauge", "histogram", "summary", "untyped", "info", "stateset",
                                      "gaugehistogram", "unknown"}, line
                types[m.group(2)] = m.group(3)
            continue
        assert PROM_LINE.match(line), f"not Prometheus text: {line!r}"
    assert re.search(r'^shuffled_build_info\{[^}]*version="[^"]+"[^}]*\} 1(\.0)?$', text, re.M), "no build info"
    for name in ("shuffled_received_partials_total", "shuffled_received_bytes_total", "shuffled_partials",
                 "shuffled_held_bytes", "shuffled_tasks"):
        assert re.search(rf"^{name}(\{{[^}}]*\}})? ", text, re.M), f"{name} missing"

    rec0 = metric_value(text, "shuffled_received_partials_total")
    body = arrow_stream(range(4))
    assert put(daemon, uid("m"), "s", body).status == 201
    after = request(daemon, "GET", "/metrics").body.decode()
    assert metric_value(after, "shuffled_received_partials_total") == rec0 + 1
    assert metric_value(after, "shuffled_received_bytes_total") >= metric_value(text, "shuffled_received_bytes_total") + len(body)


def test_put_then_get_partial_byte_exact_with_headers(daemon):
    sup, sub = uid("sup"), "sub1"
    body = arrow_stream(range(100), batches=3)
    r = put(daemon, sup, sub, body)
    assert r.status == 201, r  # README: 201 new

    g = request(daemon, "GET", partial_path(sup, sub))
    assert g.status == 200, g
    assert g.body == body
    assert (g.header("Content-Type") or "").split(";")[0].strip() == ARROW
    assert int(g.header("Content-Length")) == len(body)
    assert parse_digest(g.header("Content-Digest")) == crc(body)
    etag = g.header("ETag")
    assert etag and re.match(r'^(W/)?"[^"]+"$', etag), etag
    # the client can read it back as Arrow
    assert pa.ipc.open_stream(g.body).read_all().column("x").to_pylist() == list(range(100))
    # same ETag on a repeat read
    assert request(daemon, "GET", partial_path(sup, sub)).header("ETag") == etag


def test_put_with_correct_content_digest_and_chunked_body(daemon):
    sup = uid("dig")
    body = arrow_stream(range(5000), batches=4)
    r = put(daemon, sup, "s", body, extra_headers={"Content-Digest": digest_header(body)}, chunked=True)
    assert r.status == 201, r
    g = request(daemon, "GET", partial_path(sup, "s"))
    assert g.status == 200 and g.body == body
    assert parse_digest(g.header("Content-Digest")) == crc(body)


def test_range_requests(daemon):
    sup, sub = uid("rng"), "s"
    body = arrow_stream(range(50))
    assert put(daemon, sup, sub, body).status == 201
    full = request(daemon, "GET", partial_path(sup, sub))
    etag = full.header("ETag")
    n = len(body)

    for spec, lo, hi in (("bytes=0-9", 0, 9), (f"bytes=10-", 10, n - 1), ("bytes=-7", n - 7, n - 1),
                         (f"bytes=5-{n + 100}", 5, n - 1)):
        r = request(daemon, "GET", partial_path(sup, sub), headers={"Range": spec})
        assert r.status == 206, (spec, r)
        assert r.body == body[lo : hi + 1], spec
        assert int(r.header("Content-Length")) == hi - lo + 1
        assert r.header("Content-Range") == f"bytes {lo}-{hi}/{n}", (spec, r.header("Content-Range"))
        assert r.header("ETag") == etag
        # Content-Digest, if sent, describes the bytes actually sent (RFC 9530); the stored CRC
        # of the whole partial must still be returned on this per-partial GET.
        if r.header("Content-Digest") is not None:
            assert parse_digest(r.header("Content-Digest")) == crc(r.body), spec
        stored = [parse_digest(r.header(h)) for h in ("Repr-Digest", "Content-Digest") if r.header(h)]
        assert crc(body) in stored, (spec, r)

    r = request(daemon, "GET", partial_path(sup, sub), headers={"Range": f"bytes={n + 10}-"})
    assert_error(r, 416)


def test_etag_if_none_match(daemon):
    sup = uid("etag")
    body = arrow_stream(range(3))
    assert put(daemon, sup, "s", body).status == 201
    etag = request(daemon, "GET", partial_path(sup, "s")).header("ETag")
    r = request(daemon, "GET", partial_path(sup, "s"), headers={"If-None-Match": etag})
    assert r.status == 304 and r.body == b""


def test_put_replaces_same_key(daemon):
    sup, sub = uid("rep"), "s"
    b1 = arrow_stream(range(3))
    b2 = arrow_stream(range(100, 107))
    r1 = put(daemon, sup, sub, b1)
    assert r1.status == 201
    e1 = request(daemon, "GET", partial_path(sup, sub)).header("ETag")
    before_files = {f for f in snapshot(daemon) if Path(f).is_file()}
    r2 = put(daemon, sup, sub, b2)
    assert r2.status == 200, r2  # README: 200 replaced
    g = request(daemon, "GET", partial_path(sup, sub))
    assert g.body == b2
    assert parse_digest(g.header("Content-Digest")) == crc(b2)
    assert g.header("ETag") != e1
    t = listing(daemon, sup).json()
    assert t["files"] == 1 and t["bytes"] == len(b2)
    [p] = t["partitions"]
    subs = p.get("subTasks") or p.get("subtasks")
    assert len(subs) == 1 and subs[0]["rows"] == 7
    after_files = {f for f in snapshot(daemon) if Path(f).is_file()} - before_files
    # Packs: the old bytes stay until the task is deleted, nothing else is left behind.
    ours = [Path(f) for f in snapshot(daemon) if Path(f).is_file() and sup in Path(f).parts]
    assert all(p.suffix == ".pack" for p in ours) and all(Path(f) in ours for f in after_files)
    # (storage format 3: each stream but its end marker, the schema message once per pack)
    assert sum(data_size(p) for p in ours) == packed_size([b1, b2], len(ours)), \
        "replacing left extra bytes"


def test_ids_valid(daemon):
    body = arrow_stream(range(2))
    for ident in ("a", "Z", "0", "A-b_c.d:e", "a.", "task_2024-01-01T00:00:00.000Z", "_x", "-x", ":x", "x" * 200):
        r = put(daemon, ident, ident, body)
        assert r.status == 201, (ident, r)
        g = request(daemon, "GET", partial_path(ident, ident))
        assert g.status == 200 and g.body == body, ident
        lst = listing(daemon, ident)
        assert lst.status == 200 and lst.json()["supervisorTaskId"] == ident
        assert request(daemon, "DELETE", f"{PREFIX}/tasks/{q(ident)}").status == 200


@pytest.fixture
def fresh_daemon(tmp_path):
    d = _start_daemon(tmp_path, [str(tmp_path / "a"), str(tmp_path / "b")])
    yield d
    _stop(d.proc)


def test_ids_of_255_characters(fresh_daemon):
    d = fresh_daemon
    body = arrow_stream(range(2))
    for sup, sub in (("x" * 255, "s"), ("s", "y" * 255), ("z" * 255, "w" * 255)):
        r = put(d, sup, sub, body)
        assert r.status == 201, (len(sup), len(sub), r)
        g = request(d, "GET", partial_path(sup, sub))
        assert g.status == 200 and g.body == body
    locs = request(d, "GET", "/status").json()["locations"]
    assert all(loc.get("healthy", True) for loc in locs), locs


BAD_IDS = [".a", ".", "x" * 256, "a b", "a*b", "a@b", "é", "a~b", "a,b", "a+b", "a#b", "a%b", "a\\b"]


def test_ids_invalid_rejected(daemon):
    body = arrow_stream(range(2))
    before = sized(daemon)
    for bad in BAD_IDS:
        r = put(daemon, bad, "ok", body)
        assert_error(r, 400, "supervisorTaskId", "supervisor")
        r = put(daemon, "ok-" + uid(), bad, body)
        assert_error(r, 400, "subTaskId", "subtask")
        assert_error(request(daemon, "GET", partial_path(bad, "ok")), 400, "supervisorTaskId")
        assert_error(request(daemon, "GET", partial_path("ok", bad)), 400, "subTaskId")
        assert_error(request(daemon, "GET", partition_path(bad)), 400, "supervisorTaskId")
        assert_error(listing(daemon, bad), 400, "supervisorTaskId")
        assert_error(request(daemon, "DELETE", f"{PREFIX}/tasks/{q(bad)}"), 400, "supervisorTaskId")
    assert sized(daemon) == before


def test_interval_canonicalised_to_utc_millis(daemon):
    sup = uid("iv")
    body = arrow_stream(range(3))
    r = put(daemon, sup, "s", body, start="2018-01-01T01:00:00+01:00", end="2018-01-01T19:00:00-05:00")
    assert r.status == 201, r
    t = listing(daemon, sup).json()
    [p] = t["partitions"]
    assert p["start"] == "2018-01-01T00:00:00.000Z"
    assert p["end"] == "2018-01-02T00:00:00.000Z"
    # the canonical and other spellings address the same key
    for start, end in ((DAY[0], DAY[1]), ("2018-01-01T00:00:00Z", "2018-01-02T00:00:00Z"),
                       ("2018-01-01T00:00:00.000+00:00", "2018-01-02T02:00:00+02:00")):
        g = request(daemon, "GET", partial_path(sup, "s", start=start, end=end))
        assert g.status == 200 and g.body == body, (start, end)
    b2 = arrow_stream(range(9))
    assert put(daemon, sup, "s", b2, start="2018-01-01T00:00:00Z", end="2018-01-02T00:00:00.000Z").status == 200
    t = listing(daemon, sup).json()
    assert len(t["partitions"]) == 1 and t["files"] == 1
    # millisecond precision is kept
    assert put(daemon, sup, "s", body, start="2018-01-01T00:00:00.123Z", end="2018-01-01T00:00:00.124Z").status == 201
    starts = sorted(p["start"] for p in listing(daemon, sup).json()["partitions"])
    assert starts == ["2018-01-01T00:00:00.000Z", "2018-01-01T00:00:00.123Z"]


def test_interval_invalid_rejected(daemon):
    body = arrow_stream(range(2))
    before = sized(daemon)
    cases = [
        dict(start="2018-01-02T00:00:00Z", end="2018-01-01T00:00:00Z"),
        dict(start="2018-01-01T00:00:00Z", end="2018-01-01T00:00:00Z"),
        dict(start="2018-01-01T01:00:00+01:00", end="2018-01-01T00:00:00Z"),  # equal instants
        dict(start="not-a-date", end=DAY[1]),
        dict(start=DAY[0], end="2018-13-01T00:00:00Z"),
        dict(start=DAY[0], end=""),
        dict(start=None, end=DAY[1]),
        dict(start=DAY[0], end=None),
    ]
    for kw in cases:
        sup = uid("biv")
        r = put(daemon, sup, "s", body, **kw)
        assert_error(r, 400, "start", "end", "interval")
        assert_error(request(daemon, "GET", partial_path(sup, "s", **kw)), 400, "start", "end", "interval")
        assert_error(request(daemon, "GET", partition_path(sup, **kw)), 400, "start", "end", "interval")
    assert sized(daemon) == before


def test_partition_id_rules(daemon):
    body = arrow_stream(range(2))
    sup = uid("pid")
    for pid in (0, 1, 17, 65536):
        assert put(daemon, sup, "s", body, pid=pid).status == 201, pid
        assert request(daemon, "GET", partial_path(sup, "s", pid=pid)).body == body
    ids = sorted(p["partitionId"] for p in listing(daemon, sup).json()["partitions"])
    assert ids == [0, 1, 17, 65536]
    before = sized(daemon)
    for bad in (-1, "abc", "1.5", "", None, "0x1"):
        r = put(daemon, sup, "s", body, pid=bad)
        assert_error(r, 400, "partitionId")
        assert_error(request(daemon, "GET", partial_path(sup, "s", pid=bad)), 400, "partitionId")
        assert_error(request(daemon, "GET", partition_path(sup, pid=bad)), 400, "partitionId")
    assert sized(daemon) == before


def test_partition_id_large_values(daemon):
    body = arrow_stream(range(2))
    sup = uid("bigpid")
    for pid in (10**9, 2**31 - 1):
        r = put(daemon, sup, "s", body, pid=pid)
        assert r.status == 201, (pid, r)
        assert request(daemon, "GET", partial_path(sup, "s", pid=pid)).body == body
        assert request(daemon, "GET", partition_path(sup, pid=pid)).status == 200


def test_bad_bodies_rejected_and_nothing_left(daemon):
    good = arrow_stream(range(20), batches=2)
    sup = uid("bb")
    before = sized(daemon)
    no_eos = good[:-8]
    assert good[-8:] == b"\xff\xff\xff\xff\x00\x00\x00\x00"
    for body in (b"", b"garbage", good[: len(good) // 2], no_eos, b"PAR1" + good):
        r = put(daemon, sup, "s", body)
        assert_error(r, 400, "body", "arrow")
        assert request(daemon, "GET", partial_path(sup, "s")).status == 404
    # wrong media type
    r = put(daemon, sup, "s", good, ctype="text/plain")
    assert_error(r, (400, 415), "content-type", "media", "arrow")
    assert listing(daemon, sup).status == 404
    assert sized(daemon) == before


def test_digest_mismatch(daemon):
    sup = uid("dm")
    good = arrow_stream(range(10))
    before = sized(daemon)
    wrong = "crc32c=:" + base64.b64encode(((crc(good) + 1) & 0xFFFFFFFF).to_bytes(4, "big")).decode() + ":"
    r = put(daemon, sup, "s", good, extra_headers={"Content-Digest": wrong})
    assert_error(r, 400, "digest", "crc")
    assert request(daemon, "GET", partial_path(sup, "s")).status == 404
    assert listing(daemon, sup).status == 404
    assert sized(daemon) == before
    # an existing partial is untouched by a rejected replacement
    assert put(daemon, sup, "s", good).status == 201
    other = arrow_stream(range(99))
    before = sized(daemon)
    r = put(daemon, sup, "s", other, extra_headers={"Content-Digest": digest_header(good)}, chunked=True)
    assert_error(r, 400, "digest", "crc")
    assert request(daemon, "GET", partial_path(sup, "s")).body == good
    assert sized(daemon) == before


def test_aggregate_partition_is_one_arrow_stream(daemon):
    sup = uid("agg")
    b1 = arrow_stream(range(0, 3))
    b2 = arrow_stream(range(100, 150), batches=3)
    b3 = arrow_stream(range(1000, 1001))
    assert put(daemon, sup, "s1", b1).status == 201
    assert put(daemon, sup, "s2", b2).status == 201
    assert put(daemon, sup, "s3", b3).status == 201
    # noise: another partition and another interval, not to be included
    assert put(daemon, sup, "s1", arrow_stream([7777]), pid=1).status == 201
    assert put(daemon, sup, "s1", arrow_stream([8888]), start="2018-01-02T00:00:00Z", end="2018-01-03T00:00:00Z").status == 201

    r = request(daemon, "GET", partition_path(sup))
    assert r.status == 200, r
    assert (r.header("Content-Type") or "").split(";")[0].strip() == ARROW
    if r.header("Content-Length") is not None:
        assert int(r.header("Content-Length")) == len(r.body)
    if r.header("Content-Digest") is not None:
        assert parse_digest(r.header("Content-Digest")) == crc(r.body)
    src = pa.BufferReader(r.body)
    reader = pa.ipc.open_stream(src)
    table = reader.read_all()
    assert src.tell() == len(r.body), "body holds more than one Arrow IPC stream"
    assert sorted(table.column("x").to_pylist()) == [0, 1, 2, *range(100, 150), 1000]
    assert sorted(table.column("s").to_pylist()) == sorted(f"v{v}" for v in [0, 1, 2, *range(100, 150), 1000])
    # equivalent spelling of the interval addresses the same partition
    r2 = request(daemon, "GET", partition_path(sup, start="2018-01-01T01:00:00+01:00"))
    assert r2.status == 200
    assert sorted(pa.ipc.open_stream(r2.body).read_all().column("x").to_pylist()) == sorted(table.column("x").to_pylist())
    # nothing there
    assert_error(request(daemon, "GET", partition_path(sup, pid=5)), 404)
    assert_error(request(daemon, "GET", partition_path(uid("none"))), 404)


def test_listings(daemon):
    sup = uid("lst")
    b1 = arrow_stream(range(3))
    b2 = arrow_stream(range(11), batches=2)
    b3 = arrow_stream(range(4))
    assert put(daemon, sup, "s1", b1).status == 201
    assert put(daemon, sup, "s2", b2).status == 201
    assert put(daemon, sup, "s1", b3, pid=3).status == 201

    r = listing(daemon)
    assert r.status == 200
    top = r.json()
    assert isinstance(top["tasks"], list)
    e = task_entry(daemon, sup)
    assert e is not None
    assert e["bytes"] == len(b1) + len(b2) + len(b3)
    assert e["files"] == 3
    expiry_of(e)

    t = listing(daemon, sup).json()
    assert t["supervisorTaskId"] == sup
    assert t["bytes"] == len(b1) + len(b2) + len(b3) and t["files"] == 3
    expiry_of(t)
    parts = {(p["start"], p["end"], p["partitionId"]): p for p in t["partitions"]}
    assert set(parts) == {(DAY[0], DAY[1], 0), (DAY[0], DAY[1], 3)}
    p0 = parts[(DAY[0], DAY[1], 0)]
    assert p0["rows"] == 14 and p0["bytes"] == len(b1) + len(b2)
    subs = {s["subTaskId"]: s for s in (p0.get("subTasks") or p0.get("subtasks"))}
    assert set(subs) == {"s1", "s2"}
    for name, body, rows in (("s1", b1, 3), ("s2", b2, 11)):
        s = subs[name]
        assert s["rows"] == rows and s["bytes"] == len(body)
        ck = [v for k, v in s.items() if "crc" in k.lower() or "checksum" in k.lower() or "digest" in k.lower()]
        assert ck and any(checksum_matches(v, body) for v in ck), s
    p3 = parts[(DAY[0], DAY[1], 3)]
    assert p3["rows"] == 4 and p3["bytes"] == len(b3)

    assert_error(listing(daemon, uid("unknown")), 404)


def test_delete_is_idempotent_and_removes_everything(daemon):
    sup = uid("del")
    before = snapshot(daemon)
    b = arrow_stream(range(5))
    assert put(daemon, sup, "s1", b).status == 201
    assert put(daemon, sup, "s2", b, pid=2).status == 201
    assert len(snapshot(daemon)) > len(before)
    r = request(daemon, "DELETE", f"{PREFIX}/tasks/{q(sup)}")
    assert r.status == 200, r
    assert_error(listing(daemon, sup), 404)
    assert task_entry(daemon, sup) is None
    assert_error(request(daemon, "GET", partial_path(sup, "s1")), 404)
    assert_error(request(daemon, "GET", partition_path(sup)), 404)
    assert not any(sup in p for p in snapshot(daemon))
    assert snapshot(daemon) == before
    # again, and an id never seen: not an error
    assert request(daemon, "DELETE", f"{PREFIX}/tasks/{q(sup)}").status == 200
    assert request(daemon, "DELETE", f"{PREFIX}/tasks/{q(uid('never'))}").status == 200
    # the task can be written again afterwards
    assert put(daemon, sup, "s1", b).status == 201
    assert request(daemon, "GET", partial_path(sup, "s1")).body == b


def test_not_found_cases(daemon):
    sup = uid("nf")
    assert put(daemon, sup, "s", arrow_stream(range(2))).status == 201
    assert_error(request(daemon, "GET", partial_path(sup, "other")), 404)
    assert_error(request(daemon, "GET", partial_path(sup, "s", pid=9)), 404)
    assert_error(request(daemon, "GET", partial_path(sup, "s", start="2019-01-01T00:00:00Z",
                                                     end="2019-01-02T00:00:00Z")), 404)
    assert_error(request(daemon, "GET", partial_path(uid("nobody"), "s")), 404)
    assert_error(request(daemon, "GET", f"{PREFIX}/no/such/route"), 404)


def test_writes_spread_over_locations(daemon):
    sup = uid("rr")
    for i in range(6):
        assert put(daemon, sup, f"s{i}", arrow_stream(range(i + 1))).status == 201
    counts = []
    for loc in daemon.locations:
        counts.append(sum(1 for p in loc.rglob("*") if p.is_file() and sup in str(p)))
    assert all(c > 0 for c in counts), counts
    # and every one is found (lookup searches every location)
    for i in range(6):
        assert request(daemon, "GET", partial_path(sup, f"s{i}")).status == 200


# --------------------------------------------------------------------------- limits


def test_413_over_max_partial_bytes(small_daemon):
    d = small_daemon
    small = arrow_stream(range(3))
    assert len(small) < 1000
    big = arrow_stream(range(400))
    assert len(big) > 1000
    sup = uid("big")
    assert_pristine(d)
    r = put(d, sup, "s", big)  # Content-Length declared
    assert_error(r, 413, "size", "large", "bytes", "limit")
    assert_pristine(d)
    r = put(d, sup, "s", big, chunked=True)  # no Content-Length: found while streaming
    assert_error(r, 413, "size", "large", "bytes", "limit")
    assert_pristine(d)
    assert listing(d, sup).status == 404
    # every other kind of rejection leaves the locations pristine too
    assert_error(put(d, ".bad", "s", small), 400)
    assert_error(put(d, sup, "s", small, start="x"), 400)
    assert_error(put(d, sup, "s", small, pid=-3), 400)
    assert_error(put(d, sup, "s", b"not arrow at all"), 400)
    assert_error(put(d, sup, "s", small[:-8]), 400)
    assert_error(put(d, sup, "s", small, extra_headers={"Content-Digest": digest_header(big)}), 400)
    assert_error(put(d, sup, "s", small[:-8], chunked=True), 400)
    assert_pristine(d)
    # under the limit is fine
    assert put(d, sup, "s", small).status == 201
    assert request(d, "GET", partial_path(sup, "s")).body == small
    assert request(d, "DELETE", f"{PREFIX}/tasks/{q(sup)}").status == 200
    assert_pristine(d)


def test_507_when_no_location_has_room(tiny_daemon):
    d = tiny_daemon
    big = arrow_stream(range(300))
    assert 2000 < len(big) < 1_000_000
    sup = uid("full")
    assert_pristine(d)
    r = put(d, sup, "s", big)
    assert_error(r, 507, "space", "room", "location", "storage")
    assert_pristine(d)
    r = put(d, sup, "s", big, chunked=True)
    assert_error(r, 507, "space", "room", "location", "storage")
    assert_pristine(d)
    assert listing(d, sup).status == 404
    small = arrow_stream(range(3))
    assert put(d, sup, "s", small).status == 201
    assert request(d, "GET", partial_path(sup, "s")).body == small
    assert request(d, "DELETE", f"{PREFIX}/tasks/{q(sup)}").status == 200
    assert_pristine(d)


def test_aggregate_unifies_schemas_dictionaries_and_filters_subtasks(daemon):
    sup = uid("agg2")

    def stream(table: pa.Table) -> bytes:
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, table.schema) as w:
            for b in table.to_batches():
                w.write_batch(b)
        return sink.getvalue().to_pybytes()

    t1 = pa.table({"k": pa.array(["a", "b", "a"]).dictionary_encode(), "v": pa.array([1, 2, 3], pa.int64())})
    t2 = pa.table({"k": pa.array(["c", "d"]).dictionary_encode(), "v": pa.array([4, 5], pa.int64())})
    empty_sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(empty_sink, t1.schema):
        pass
    assert put(daemon, sup, "s1", stream(t1)).status == 201
    assert put(daemon, sup, "s2", stream(t2)).status == 201
    assert put(daemon, sup, "s3", empty_sink.getvalue().to_pybytes()).status == 201
    r = request(daemon, "GET", partition_path(sup))
    assert r.status == 200, r
    src = pa.BufferReader(r.body)
    tb = pa.ipc.open_stream(src).read_all()
    assert src.tell() == len(r.body)
    got = sorted(zip([str(k) for k in tb.column("k").to_pylist()], tb.column("v").to_pylist()))
    assert got == [("a", 1), ("a", 3), ("b", 2), ("c", 4), ("d", 5)]

    # README: &subTaskId= restricts the stream to the named subtasks
    r = request(daemon, "GET", partition_path(sup) + "&subTaskId=s2")
    assert r.status == 200
    assert sorted(pa.ipc.open_stream(r.body).read_all().column("v").to_pylist()) == [4, 5]

    # a missing column is filled (schemas unified), an incompatible type is 409 (README)
    sup2 = uid("agg3")
    assert put(daemon, sup2, "s1", arrow_stream(range(3))).status == 201
    assert put(daemon, sup2, "s2", arrow_stream(range(10, 12), name="y")).status == 201
    r = request(daemon, "GET", partition_path(sup2))
    assert r.status == 200
    tb = pa.ipc.open_stream(r.body).read_all()
    assert tb.num_rows == 5
    sch = pa.schema([("x", pa.string()), ("s", pa.string())])
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, sch) as w:
        w.write_table(pa.table({"x": ["q"], "s": ["r"]}, schema=sch))
    assert put(daemon, sup2, "s3", sink.getvalue().to_pybytes()).status == 201
    assert_error(request(daemon, "GET", partition_path(sup2)), 409, "schema")


def test_if_range_and_method_not_allowed(daemon):
    sup = uid("ifr")
    body = arrow_stream(range(30))
    assert put(daemon, sup, "s", body).status == 201
    etag = request(daemon, "GET", partial_path(sup, "s")).header("ETag")
    r = request(daemon, "GET", partial_path(sup, "s"), headers={"Range": "bytes=4-", "If-Range": etag})
    assert r.status == 206 and r.body == body[4:]
    r = request(daemon, "GET", partial_path(sup, "s"), headers={"Range": "bytes=4-", "If-Range": '"stale"'})
    assert r.status == 200 and r.body == body
    assert_error(request(daemon, "POST", f"{PREFIX}/tasks"), 405)
    assert_error(request(daemon, "PATCH", partial_path(sup, "s"), body=b"x"), 405)


def test_concurrent_replace_is_atomic_for_readers(daemon):
    sup = uid("atom")
    a = arrow_stream(range(3))
    b = arrow_stream(range(5000, 5400), batches=4)
    assert put(daemon, sup, "s", a).status == 201
    stop = time.monotonic() + 3.0
    problems: list = []

    def writer():
        i = 0
        while time.monotonic() < stop:
            r = put(daemon, sup, "s", b if i % 2 == 0 else a)
            if r.status != 200:
                problems.append(("put", r.status))
            i += 1

    def reader():
        while time.monotonic() < stop:
            r = request(daemon, "GET", partial_path(sup, "s"))
            if r.status != 200 or r.body not in (a, b) or parse_digest(r.header("Content-Digest")) != crc(r.body):
                problems.append(("get", r.status, len(r.body)))

    threads = [threading.Thread(target=writer)] + [threading.Thread(target=reader) for _ in range(3)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=20)
    assert not any(th.is_alive() for th in threads)
    assert problems == []
    t = listing(daemon, sup).json()
    assert t["files"] == 1


def _rss_anon_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("RssAnon:"):
            return int(line.split()[1])
    return 0


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="needs /proc")
def test_large_upload_is_streamed_not_held_in_memory(daemon):
    n = 1 << 20
    col = pa.Array.from_buffers(pa.int64(), n, [None, pa.py_buffer(bytes(8 * n))])
    schema = pa.schema([("x", pa.int64())])
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, schema) as w:
        for _ in range(20):
            w.write_batch(pa.record_batch([col], schema=schema))
    body = sink.getvalue().to_pybytes()
    assert len(body) > 160_000_000
    pid = daemon.proc.pid
    base = _rss_anon_kib(pid)
    peak = [base]
    done = threading.Event()

    def sample():
        while not done.is_set():
            peak[0] = max(peak[0], _rss_anon_kib(pid))
            time.sleep(0.005)

    th = threading.Thread(target=sample)
    th.start()
    try:
        sup = uid("large")
        r = put(daemon, sup, "s", body, extra_headers={"Content-Digest": digest_header(body)}, chunked=True)
        assert r.status == 201, r
    finally:
        done.set()
        th.join(timeout=5)
    grew_mib = (peak[0] - base) / 1024
    assert grew_mib < 80, f"daemon anonymous memory grew {grew_mib:.0f} MiB during a {len(body) >> 20} MiB upload"
    g = request(daemon, "GET", partial_path(sup, "s"))
    assert g.status == 200 and len(g.body) == len(body) and crc(g.body) == crc(body)
    assert parse_digest(g.header("Content-Digest")) == crc(body)
    assert request(daemon, "DELETE", f"{PREFIX}/tasks/{q(sup)}").status == 200


def test_503_with_retry_after_when_uploads_are_at_the_limit(small_daemon):
    import socket

    d = small_daemon
    sup = uid("busy")
    small = arrow_stream(range(3))
    sock = socket.create_connection((d.host, d.port), timeout=HTTP_TIMEOUT)
    try:
        head = (f"PUT {partial_path(sup, 'held')} HTTP/1.1\r\nHost: {d.host}:{d.port}\r\n"
                f"Content-Type: {ARROW}\r\nTransfer-Encoding: chunked\r\n\r\n")
        first = small[:16]
        sock.sendall(head.encode() + f"{len(first):x}\r\n".encode() + first + b"\r\n")
        deadline = time.monotonic() + 10
        r = None
        while time.monotonic() < deadline:
            r = put(d, sup, "other", small)
            if r.status == 503:
                break
            time.sleep(0.05)
        assert r is not None and r.status == 503, r
        assert_error(r, 503)
        ra = r.header("Retry-After")
        assert ra is not None and ra.strip().isdigit(), r
    finally:
        sock.close()  # abort the held upload mid-body
    # the aborted upload leaves nothing behind (bounded wait for the server to notice)
    deadline = time.monotonic() + 10
    while True:
        try:
            assert_pristine(d)
            break
        except AssertionError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)
    # and uploads are admitted again
    deadline = time.monotonic() + 10
    while (r := put(d, sup, "other", small)).status == 503 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert r.status == 201, r
    assert request(d, "DELETE", f"{PREFIX}/tasks/{q(sup)}").status == 200
    assert_pristine(d)


def test_401_when_auth_is_on(auth_daemon):
    d = auth_daemon
    body = arrow_stream(range(3))
    sup = uid("auth")
    assert_pristine(d)
    for hdrs in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "s3cret-token"}):
        assert_error(put(d, sup, "s", body, extra_headers=hdrs), 401)
        assert_error(request(d, "GET", f"{PREFIX}/tasks", headers=hdrs), 401)
        assert_error(request(d, "GET", partial_path(sup, "s"), headers=hdrs), 401)
        assert_error(request(d, "DELETE", f"{PREFIX}/tasks/{q(sup)}", headers=hdrs), 401)
    assert_pristine(d)
    ok = {"Authorization": "Bearer s3cret-token"}
    assert put(d, sup, "s", body, extra_headers=ok).status == 201
    assert request(d, "GET", partial_path(sup, "s"), headers=ok).body == body
    # README: liveness and (by default) metrics need no token
    assert request(d, "GET", "/status/health").status == 200
    assert request(d, "GET", "/metrics").status == 200
