"""Expiry and the sweeper against real daemons, a real overlord stand-in and a closed port.

Time is a clock the test drives (``make_app(clock=...)``) and sweeps are ``run_once()``
calls, so nothing sleeps; one test lets apscheduler run the sweeper on its own.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from shuffled.cleanup import policy
from shuffled.cleanup.overlord import OverlordClient
from shuffled.cleanup.policy import Action, Cause, TaskState
from shuffled.cleanup.sweeper import Sweeper
from shuffled.server.state import STATE, DaemonState
from shuffled.storage.tasks.inflight import TaskLock
from tests.conftest import DAY, PREFIX, arrow_bytes, files_under, metric, sample_table
from tests.helpers.clock import Clock

TIMEOUT = 100.0
PERIOD = 10.0
MAX_AGE = 1000.0
BODY = arrow_bytes(sample_table(30))


class Overlord:
    """A stand-in for Druid's overlord: POST /druid/indexer/v1/taskStatus on 127.0.0.1."""

    def __init__(self) -> None:
        self.tasks: dict[str, Any] = {}  # id -> the status object to answer (absent: unknown)
        self.mode = "ok"  # ok | error500 | garbage | list | slow | gate
        self.calls: list[list[str]] = []
        self.called = asyncio.Event()
        self.release = asyncio.Event()
        self.server: TestServer | None = None

    def running(self, *ids: str, shape: str = "flat") -> None:
        for i in ids:
            self.tasks[i] = status_object(i, "RUNNING", shape)

    async def handle(self, request: web.Request) -> web.StreamResponse:
        ids = await request.json()
        assert isinstance(ids, list) and all(isinstance(i, str) for i in ids)
        self.calls.append(ids)
        self.called.set()
        if self.mode == "error500":
            return web.json_response({"error": "overlord is leaderless"}, status=503)
        if self.mode == "garbage":
            return web.Response(text="<html>not json{", content_type="application/json")
        if self.mode == "list":
            return web.json_response([self.tasks.get(i) for i in ids])
        if self.mode == "slow":
            await asyncio.sleep(30)
        if self.mode == "gate":
            await self.release.wait()
        return web.json_response({i: self.tasks[i] for i in ids if i in self.tasks})

    async def start(self) -> str:
        app = web.Application()
        app.router.add_post("/druid/indexer/v1/taskStatus", self.handle)
        self.server = TestServer(app, host="127.0.0.1")
        await self.server.start_server()
        return str(self.server.make_url("")).rstrip("/")

    async def close(self) -> None:
        self.release.set()
        if self.server is not None:
            await self.server.close()


def status_object(task_id: str, code: str, shape: str = "flat") -> dict[str, Any]:
    """Druid's task-status shapes across versions."""
    if shape == "flat":  # TaskStatus: {"id", "status": "RUNNING", "duration", ...}
        return {"id": task_id, "status": code, "duration": -1, "errorMsg": None,
                "location": {"host": None, "port": -1, "tlsPort": -1}}
    if shape == "statusCode":  # TaskStatusPlus
        return {"id": task_id, "statusCode": code, "runnerStatusCode": "RUNNING"}
    if shape == "nested":  # GET /task/{id}/status: {"task": id, "status": {...}}
        return {"task": task_id, "status": {"id": task_id, "status": code}}
    if shape == "nestedCode":
        return {"task": task_id, "status": {"id": task_id, "statusCode": code}}
    raise AssertionError(shape)


@pytest.fixture
async def overlord() -> Any:
    stand_in = Overlord()
    yield stand_in
    await stand_in.close()


def closed_port_url() -> str:
    """A URL on 127.0.0.1 where nothing listens (bound, then closed: connection refused)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    return f"http://127.0.0.1:{port}"


def state(client: TestClient) -> DaemonState:
    return client.server.app[STATE]


def sweeper(client: TestClient) -> Sweeper:
    sw = state(client).sweeper
    assert sw is not None
    return sw


def part_url(sup: str, sub: str | None = "s1") -> str:
    return f"{PREFIX}/tasks/{sup}/{sub}/partition" if sub else f"{PREFIX}/tasks/{sup}/partition"


def q(pid: int = 0) -> dict[str, str]:
    return {**DAY, "partitionId": str(pid)}


async def put(client: TestClient, sup: str, sub: str = "s1", pid: int = 0,
              body: bytes = BODY) -> None:
    resp = await client.put(part_url(sup, sub), params=q(pid), data=body,
                            headers={"Content-Type": "application/vnd.apache.arrow.stream"})
    answer = await resp.json()
    assert resp.status == (200 if answer["replaced"] else 201), answer


async def held(client: TestClient) -> set[str]:
    listing = await (await client.get(f"{PREFIX}/tasks")).json()
    return {t["supervisorTaskId"] for t in listing["tasks"]}


def on_disk(tmp_path: Path, sup: str) -> list[Path]:
    return [p for p in files_under(tmp_path) if sup in p.parts]


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def start(start_daemon: Callable[..., Any], make_settings: Callable[..., Any], clock: Clock,
          ) -> Callable[..., Any]:
    async def factory(overlord_url: str | None = None, **overrides: Any) -> TestClient:
        values = {"expiry_timeout": TIMEOUT, "sweep_period": PERIOD, "max_age": MAX_AGE,
                  "overlord_url": overlord_url, **overrides}
        return await start_daemon(make_settings(**values), clock=clock)
    return factory


# -- the pure policy ----------------------------------------------------------------------


def test_policy_both_directions_of_druid_12692() -> None:
    decide = policy.decide
    kw = {"expiry_timeout": 100.0, "max_age": 1000.0}
    # Not expired: kept whatever the overlord would say.
    for st in [None, *TaskState]:
        assert decide(0.0, 99.9, state=st, **kw).action is Action.KEEP
    # Expired: running -> extend (never delete), finished/unknown -> delete (never keep).
    assert decide(0.0, 100.0, state=TaskState.RUNNING, **kw).action is Action.EXTEND
    assert decide(0.0, 5000.0, state=TaskState.RUNNING, **kw).action is Action.EXTEND
    assert decide(0.0, 100.0, state=TaskState.FINISHED, **kw) == policy.DELETE_EXPIRED
    assert decide(0.0, 100.0, state=TaskState.UNKNOWN, **kw) == policy.DELETE_EXPIRED
    assert decide(0.0, 100.0, state=None, **kw) == policy.DELETE_EXPIRED
    # Unreachable: retry until max age, then delete with cause max_age.
    assert decide(0.0, 999.9, state=TaskState.UNREACHABLE, **kw).action is Action.RETRY
    assert decide(0.0, 1000.0, state=TaskState.UNREACHABLE, **kw) == policy.DELETE_MAX_AGE
    assert policy.DELETE_MAX_AGE.cause is Cause.MAX_AGE


@pytest.mark.parametrize("shape", ["flat", "statusCode", "nested", "nestedCode"])
@pytest.mark.parametrize("code,expected", [
    ("RUNNING", TaskState.RUNNING), ("PENDING", TaskState.RUNNING),
    ("WAITING", TaskState.RUNNING), ("SUCCESS", TaskState.FINISHED),
    ("FAILED", TaskState.FINISHED), ("running", TaskState.RUNNING),
    ("BOGUS", TaskState.UNREACHABLE),
])
def test_parse_every_druid_status_shape(shape: str, code: str, expected: TaskState) -> None:
    assert policy.parse_task_state(status_object("t", code, shape)) is expected


def test_parse_answer_absent_null_and_garbage() -> None:
    answer = {"a": {"id": "a", "status": "RUNNING"}, "b": None, "c": "RUNNING", "d": {}}
    assert policy.parse_status_answer(["a", "b", "c", "d", "e"], answer) == {
        "a": TaskState.RUNNING, "b": TaskState.UNKNOWN, "c": TaskState.UNREACHABLE,
        "d": TaskState.UNREACHABLE, "e": TaskState.UNKNOWN}
    for garbage in ([], "x", 3, None):
        with pytest.raises(ValueError):
            policy.parse_status_answer(["a"], garbage)


# -- access refreshes expiry; listings do not -----------------------------------------------


async def test_put_and_get_refresh_expiry_listings_do_not(start, clock: Clock, tmp_path) -> None:
    client = await start()
    await put(client, "job")
    t0 = clock.now
    assert state(client).store.task("job").last_access == t0

    # Listings, task detail, status, metrics and health never refresh.
    clock.advance(TIMEOUT - 1)
    for path in (f"{PREFIX}/tasks", f"{PREFIX}/tasks/job", "/status", "/metrics",
                 "/status/health"):
        assert (await client.get(path)).status == 200
    assert state(client).store.task("job").last_access == t0
    listing = await (await client.get(f"{PREFIX}/tasks")).json()
    assert listing["tasks"][0]["expiresAt"] == t0 + TIMEOUT

    # A GET of a partial segment refreshes it ...
    assert (await client.get(part_url("job"), params=q())).status == 200
    assert state(client).store.task("job").last_access == clock.now
    clock.advance(TIMEOUT - 1)
    await sweeper(client).run_once()
    assert await held(client) == {"job"}
    # ... and so does a GET of a whole partition, and a PUT.
    assert (await client.get(part_url("job", None), params=q())).status == 200
    clock.advance(TIMEOUT - 1)
    await sweeper(client).run_once()
    await put(client, "job", sub="s2")
    clock.advance(TIMEOUT - 1)
    result = await sweeper(client).run_once()
    assert result.expired == [] and await held(client) == {"job"}

    # Listings alone: expires one timeout after the last data access.
    for _ in range(3):
        await client.get(f"{PREFIX}/tasks/job")
    clock.advance(1)
    result = await sweeper(client).run_once()
    assert result.deleted == {"job": Cause.EXPIRED}
    assert await held(client) == set() and on_disk(tmp_path, "job") == []


async def test_restart_readopts_data_with_fresh_expiry(start_daemon, make_settings,
                                                        clock: Clock, tmp_path) -> None:
    settings = make_settings(expiry_timeout=TIMEOUT, max_age=MAX_AGE)
    first = await start_daemon(settings, clock=clock)
    await put(first, "old")
    await first.close()
    clock.advance(10 * TIMEOUT)  # long down: past expiry and past max age
    second = await start_daemon(settings, clock=clock)
    assert state(second).store.task("old").last_access == clock.now
    assert (await sweeper(second).run_once()).expired == []
    clock.advance(TIMEOUT)
    assert (await sweeper(second).run_once()).deleted == {"old": Cause.EXPIRED}
    assert on_disk(tmp_path, "old") == []


# -- no overlord: expiry alone decides -------------------------------------------------------


async def test_no_overlord_expiry_alone_decides(start, clock: Clock, tmp_path) -> None:
    client = await start()
    await put(client, "a")
    await put(client, "a", sub="s2", pid=3)
    clock.advance(TIMEOUT / 2)
    await put(client, "b")
    clock.advance(TIMEOUT / 2 - 0.001)
    assert (await sweeper(client).run_once()).expired == []
    clock.advance(0.001)
    result = await sweeper(client).run_once()
    assert result.deleted == {"a": Cause.EXPIRED}
    assert await held(client) == {"b"} and on_disk(tmp_path, "a") == []
    assert on_disk(tmp_path, "b")
    m = state(client).metrics
    assert metric(m.registry, "shuffled_deleted_tasks_total", cause="expired") == 1
    assert metric(m.registry, "shuffled_deleted_bytes_total", cause="expired") == 2 * len(BODY)
    # Idempotent: sweeping again changes nothing.
    again = await sweeper(client).run_once()
    assert again.deleted == {} and await held(client) == {"b"}


# -- with an overlord ---------------------------------------------------------------------


async def test_running_survives_finished_and_unknown_deleted(start, overlord: Overlord,
                                                             clock: Clock, tmp_path) -> None:
    """Druid #12692 in both directions, through the HTTP API of a real stand-in."""
    client = await start(await overlord.start())
    for sup in ("run", "pend", "wait", "ok", "fail", "gone"):
        await put(client, sup)
    overlord.running("run")
    overlord.tasks["pend"] = status_object("pend", "PENDING", "statusCode")
    overlord.tasks["wait"] = status_object("wait", "WAITING", "nested")
    overlord.tasks["ok"] = status_object("ok", "SUCCESS")
    overlord.tasks["fail"] = status_object("fail", "FAILED", "nestedCode")
    t0 = clock.now
    deleted_at: dict[str, float] = {}
    # Sweep every period for far longer than max age.
    for _ in range(int(3 * MAX_AGE / PERIOD)):
        clock.advance(PERIOD)
        result = await sweeper(client).run_once()
        for sup in result.deleted:
            deleted_at[sup] = clock.now
        assert set(result.deleted.values()) <= {Cause.EXPIRED}
    assert set(deleted_at) == {"ok", "fail", "gone"}
    assert all(t0 + TIMEOUT <= t <= t0 + TIMEOUT + PERIOD for t in deleted_at.values())
    assert await held(client) == {"run", "pend", "wait"}
    for sup in ("ok", "fail", "gone"):
        assert on_disk(tmp_path, sup) == []
        assert (await client.get(part_url(sup), params=q())).status == 404
    for sup in ("run", "pend", "wait"):
        resp = await client.get(part_url(sup), params=q())
        assert resp.status == 200 and await resp.read() == BODY
    assert metric(state(client).metrics.registry, "shuffled_extended_tasks_total") > 0
    # Only expired ids were asked about, once each per sweep.
    assert all(len(call) == len(set(call)) for call in overlord.calls)
    assert {i for call in overlord.calls for i in call} == {
        "run", "pend", "wait", "ok", "fail", "gone"}

    # The running task finishes: gone within one timeout + one period of its last extension.
    overlord.tasks["run"] = status_object("run", "SUCCESS")
    for _ in range(int((TIMEOUT + PERIOD) / PERIOD)):
        clock.advance(PERIOD)
        await sweeper(client).run_once()
    assert "run" not in await held(client) and on_disk(tmp_path, "run") == []


async def test_overlord_asked_in_batches(start, overlord: Overlord, clock: Clock) -> None:
    client = await start(await overlord.start())
    for i in range(7):
        await put(client, f"t{i}")
    overlord.running("t0", "t6")
    sweeper(client).overlord.batch_size = 3
    clock.advance(TIMEOUT)
    result = await sweeper(client).run_once()
    assert [len(c) for c in overlord.calls] == [3, 3, 1]
    assert sorted(result.extended) == ["t0", "t6"]
    assert await held(client) == {"t0", "t6"}
    assert overlord.calls[0] and overlord.calls[0][0] == "t0"


@pytest.mark.parametrize("failure", ["refused", "error500", "garbage", "list", "timeout"])
async def test_unreachable_overlord_deletes_nothing_until_max_age(
        start, overlord: Overlord, clock: Clock, tmp_path, failure: str) -> None:
    if failure == "refused":
        url = closed_port_url()
    else:
        url = await overlord.start()
        overlord.mode = "slow" if failure == "timeout" else failure
    client = await start(url)
    overlord.tasks["fin"] = status_object("fin", "SUCCESS")
    await put(client, "fin")
    await put(client, "other")
    if failure == "timeout":
        sweeper(client).overlord.timeout = 0.2
    t0 = clock.now
    m = state(client).metrics
    clock.advance(TIMEOUT - PERIOD)
    sweeps = 0
    while clock.now + PERIOD < t0 + MAX_AGE:
        clock.advance(PERIOD)
        result = await sweeper(client).run_once()
        sweeps += 1
        assert result.deleted == {} and sorted(result.retried) == ["fin", "other"]
        if failure == "timeout" and sweeps >= 3:
            break  # each timed-out sweep costs 0.2 s of real time; 3 show the point
    assert await held(client) == {"fin", "other"}
    outcome = {"refused": "unreachable", "error500": "http_error", "garbage": "bad_answer",
               "list": "bad_answer", "timeout": "timeout"}[failure]
    assert metric(m.registry, "shuffled_overlord_requests_total", outcome=outcome) >= 1
    assert metric(m.registry, "shuffled_overlord_requests_total", outcome="ok") == 0
    clock.now = t0 + MAX_AGE
    result = await sweeper(client).run_once()
    assert result.deleted == {"fin": Cause.MAX_AGE, "other": Cause.MAX_AGE}
    assert metric(m.registry, "shuffled_deleted_tasks_total", cause="max_age") == 2
    assert metric(m.registry, "shuffled_deleted_bytes_total", cause="max_age") == 2 * len(BODY)
    assert metric(m.registry, "shuffled_deleted_tasks_total", cause="expired") == 0
    assert await held(client) == set() and on_disk(tmp_path, "fin") == []
    # An unreachable overlord is not a failure.
    assert metric(m.registry, "shuffled_sweep_failures_total") == 0


async def test_overlord_recovers_before_max_age(start, overlord: Overlord, clock: Clock) -> None:
    client = await start(await overlord.start())
    await put(client, "job")
    overlord.mode = "error500"
    clock.advance(TIMEOUT + PERIOD)
    assert (await sweeper(client).run_once()).retried == ["job"]
    overlord.mode = "ok"
    overlord.running("job")
    result = await sweeper(client).run_once()
    assert result.extended == ["job"]
    assert state(client).store.task("job").last_access == clock.now


async def test_get_during_overlord_call_saves_the_task(start, overlord: Overlord,
                                                       clock: Clock, tmp_path) -> None:
    client = await start(await overlord.start())
    await put(client, "job")
    overlord.tasks["job"] = status_object("job", "SUCCESS")
    overlord.mode = "gate"
    clock.advance(TIMEOUT + 1)
    sweep = asyncio.create_task(sweeper(client).run_once())
    await asyncio.wait_for(overlord.called.wait(), 10)
    clock.advance(1)
    resp = await client.get(part_url("job"), params=q())  # a reader arrives meanwhile
    assert resp.status == 200 and await resp.read() == BODY
    overlord.release.set()
    result = await asyncio.wait_for(sweep, 10)
    assert result.saved == ["job"] and result.deleted == {}
    assert await held(client) == {"job"} and on_disk(tmp_path, "job")
    # Not saved forever: once idle for a timeout, the finished task goes.
    clock.advance(TIMEOUT)
    overlord.mode = "ok"
    assert (await sweeper(client).run_once()).deleted == {"job": Cause.EXPIRED}


async def test_delete_request_during_overlord_call(start, overlord: Overlord,
                                                   clock: Clock, tmp_path) -> None:
    client = await start(await overlord.start())
    await put(client, "job")
    overlord.mode = "gate"
    clock.advance(TIMEOUT)
    sweep = asyncio.create_task(sweeper(client).run_once())
    await asyncio.wait_for(overlord.called.wait(), 10)
    resp = await client.delete(f"{PREFIX}/tasks/job")
    assert (await resp.json())["deleted"] is True
    overlord.release.set()
    result = await asyncio.wait_for(sweep, 10)
    assert result.deleted == {} and result.saved == ["job"]
    m = state(client).metrics
    assert metric(m.registry, "shuffled_deleted_tasks_total", cause="request") == 1
    assert metric(m.registry, "shuffled_deleted_tasks_total", cause="expired") == 0
    assert on_disk(tmp_path, "job") == []


async def test_sweep_and_delete_race_cleanly(start, clock: Clock, tmp_path) -> None:
    client = await start()
    for i in range(20):
        await put(client, f"t{i}", sub="a")
        await put(client, f"t{i}", sub="b", pid=1)
    clock.advance(TIMEOUT)
    deletes = [client.delete(f"{PREFIX}/tasks/t{i}") for i in range(0, 20, 2)]
    outcome = await asyncio.gather(sweeper(client).run_once(), sweeper(client).run_once(),
                                   *deletes)
    for resp in outcome[2:]:
        assert resp.status == 200
    m = state(client).metrics
    total = metric(m.registry, "shuffled_deleted_tasks_total", cause="request") + \
        metric(m.registry, "shuffled_deleted_tasks_total", cause="expired")
    assert total == 20  # each task deleted exactly once, whoever got there first
    assert metric(m.registry, "shuffled_deleted_bytes_total", cause="request") + \
        metric(m.registry, "shuffled_deleted_bytes_total", cause="expired") == 40 * len(BODY)
    assert await held(client) == set()
    assert files_under(tmp_path) == []


async def test_delete_during_download_gives_complete_body_or_clean_error(
        start, clock: Clock, tmp_path) -> None:
    big = arrow_bytes(sample_table(400_000))  # several MiB: the download is in flight
    assert len(big) > 4 << 20
    client = await start()
    await put(client, "job", body=big)
    await put(client, "job", sub="s2", body=big)
    partial = await client.get(part_url("job"), params=q())
    partition = await client.get(part_url("job", None), params=q())
    head1 = await partial.content.readexactly(1024)
    head2 = await partition.content.readexactly(1024)
    clock.advance(TIMEOUT)
    swept, deleted = await asyncio.gather(sweeper(client).run_once(),
                                          client.delete(f"{PREFIX}/tasks/job"))
    assert deleted.status == 200
    assert files_under(tmp_path) == []
    # Readers that started before the deletion: the whole body, intact (or a clean error).
    for resp, head, expected_len in ((partial, head1, len(big)), (partition, head2, None)):
        try:
            rest = await resp.read()
        except Exception as exc:  # a dropped connection is the only acceptable error
            pytest.fail(f"reader broke instead of finishing: {exc!r}")
        body = head + rest
        if expected_len is not None:
            assert body == big
        else:
            assert len(body) == int(resp.headers["Content-Length"])
    # Readers after it: a clean 404 with a JSON error.
    late = await client.get(part_url("job"), params=q())
    assert late.status == 404 and "error" in await late.json()
    late = await client.get(part_url("job", None), params=q())
    assert late.status == 404


async def test_probe_returns_recovered_location_to_service(start) -> None:
    client = await start()
    loc = state(client).store.locations[1]
    loc.mark_unhealthy("simulated EIO")
    result = await sweeper(client).run_once()
    assert loc.healthy and result.recovered_locations == [str(loc.path)]


async def test_sweep_failure_is_counted_and_raised(start, monkeypatch) -> None:
    client = await start()
    m = state(client).metrics

    def broken() -> list:
        raise RuntimeError("index broken")

    monkeypatch.setattr(state(client).store, "tasks", broken)
    with pytest.raises(RuntimeError):
        await sweeper(client).run_once()
    assert metric(m.registry, "shuffled_sweeps_total") == 1
    assert metric(m.registry, "shuffled_sweep_failures_total") == 1


async def test_overlord_client_sends_druid_request(overlord: Overlord) -> None:
    overlord.tasks["a"] = status_object("a", "RUNNING")
    url = await overlord.start()
    client = OverlordClient(url + "/", timeout=5, batch_size=100)
    try:
        states = await client.statuses(["a", "b", "a"])
    finally:
        await client.close()
    assert overlord.calls == [["a", "b"]]
    assert states == {"a": TaskState.RUNNING, "b": TaskState.UNKNOWN}


# -- apscheduler runs the sweeper on its own -------------------------------------------------


async def wait_until(predicate: Callable[[], bool], timeout: float = 10.0) -> None:
    async def poll() -> None:
        while not predicate():
            await asyncio.sleep(0.01)
    await asyncio.wait_for(poll(), timeout)


async def test_scheduler_runs_sweeper_on_its_own(start_daemon, make_settings, tmp_path) -> None:
    settings = make_settings(expiry_timeout=0.2, sweep_period=0.05, max_age=0.2)
    client = await start_daemon(settings)  # real clock
    m = state(client).metrics
    await wait_until(lambda: metric(m.registry, "shuffled_sweeps_total") >= 3)
    await put(client, "job")
    await wait_until(
        lambda: metric(m.registry, "shuffled_deleted_tasks_total", cause="expired") == 1)
    assert state(client).store.task("job") is None
    assert on_disk(tmp_path, "job") == []
    assert metric(m.registry, "shuffled_sweep_failures_total") == 0
    assert metric(m.registry, "shuffled_last_sweep_timestamp_seconds") > 0
    await client.close()  # the scheduler stops with the app; no sweep after shutdown
    count = metric(m.registry, "shuffled_sweeps_total")
    await asyncio.sleep(0.2)
    assert metric(m.registry, "shuffled_sweeps_total") == count


def test_scheduler_is_the_only_apscheduler_user() -> None:
    root = Path(__file__).resolve().parents[2] / "shuffled"
    users = sorted(str(p.relative_to(root)) for p in root.rglob("*.py")
                   if "apscheduler" in p.read_text() and "import" in p.read_text()
                   and any(line.lstrip().startswith(("import apscheduler", "from apscheduler"))
                           for line in p.read_text().splitlines()))
    assert users == ["cleanup/scheduler.py"]


async def test_shutdown_during_a_sweep_stops_it_promptly(start, overlord: Overlord,
                                                         clock: Clock, tmp_path) -> None:
    client = await start(await overlord.start())
    for i in range(5):
        await put(client, f"t{i}")
    overlord.mode = "gate"  # the overlord never answers
    sw = sweeper(client)
    sw.overlord.batch_size = 1
    sw.overlord.timeout = 0.3
    clock.advance(TIMEOUT)
    sweep = asyncio.create_task(sw.run_once())
    await asyncio.wait_for(overlord.called.wait(), 10)
    loop = asyncio.get_running_loop()
    started = loop.time()
    await asyncio.wait_for(client.close(), 10)  # cleanup_ctx: scheduler off, sweep stopped
    assert loop.time() - started < 2  # one batch's timeout, not five
    result = await asyncio.wait_for(sweep, 10)
    assert result.deleted == {} and len(overlord.calls) == 1
    assert sw.closed and (await sw.run_once()).expired == []
    assert all(on_disk(tmp_path, f"t{i}") for i in range(5))


async def test_put_committing_while_sweeper_waits_for_the_lock_saves_the_task(
        start, clock: Clock, tmp_path) -> None:
    client = await start()
    await put(client, "a")
    clock.advance(TIMEOUT + PERIOD)
    store = state(client).store
    lock = store.uploads.lock("a")
    await lock.acquire()  # a commit of task "a" is in progress
    sweep = asyncio.create_task(sweeper(client).run_once())
    await asyncio.wait_for(_until_waiting(lock), timeout=10)
    store.touch("a")  # ...and it lands: the task was just accessed
    lock.release()
    result = await asyncio.wait_for(sweep, timeout=10)
    assert result.deleted == {} and "a" in result.saved
    assert await held(client) == {"a"} and on_disk(tmp_path, "a")


async def _until_waiting(lock: TaskLock) -> None:
    while not lock.waiting:  # the sweeper is queued on the task's lock
        await asyncio.sleep(0)
