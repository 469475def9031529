"""openapi.yaml describes the running daemon: its routes, statuses, headers and JSON bodies.

Every request below goes to a real daemon; each answer must be a documented status of the
operation it hit, carry that response's required headers, and have a body matching the
documented media type and JSON schema (validated by ``jsonschema`` when importable, and
always by the small validator in tests/helpers/openapi_checker.py, which refuses keywords
it does not implement).
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from aiohttp.test_utils import TestClient

from shuffled.crc import crc32c
from shuffled.protocol import format_crc32c
from shuffled.server.routes import tasks
from shuffled.server.state import STATE
from tests.conftest import DAY, PREFIX, arrow_bytes, sample_table
from tests.helpers.openapi_checker import ROUTE_PARAMS, SPEC, Checker, schema_errors

METHODS = ("get", "put", "post", "delete", "head", "patch", "options", "trace")
ARROW = "application/vnd.apache.arrow.stream"

PARTIAL = f"{PREFIX}/tasks/{{supervisorTaskId}}/{{subTaskId}}/partition"
PARTITION = f"{PREFIX}/tasks/{{supervisorTaskId}}/partition"
TASKS = f"{PREFIX}/tasks"
TASK = f"{PREFIX}/tasks/{{supervisorTaskId}}"


# --- the spec as data (the validators and Checker: tests/helpers/openapi_checker.py) -------

def documented_operations() -> set[tuple[str, str]]:
    return {(method.upper(), path) for path, item in SPEC["paths"].items()
            for method in item if method in METHODS}


def q(pid: int = 0, **extra: str) -> dict[str, str]:
    return {**DAY, "partitionId": str(pid), **extra}


def arrow_headers(body: bytes) -> dict[str, str]:
    return {"Content-Type": ARROW, "Content-Digest": format_crc32c(crc32c(body))}


# --- tests ------------------------------------------------------------------------------

def test_spec_is_openapi_3_1_with_optional_bearer() -> None:
    assert SPEC["openapi"].startswith("3.1.")
    assert SPEC["components"]["securitySchemes"]["bearerAuth"]["scheme"] == "bearer"
    assert {} in SPEC["security"]
    assert SPEC["paths"]["/status/health"]["get"]["security"] == [{}]


async def test_documented_operations_are_the_registered_routes(daemon: TestClient) -> None:
    routes: set[tuple[str, str]] = set()
    for route in daemon.app.router.routes():
        path = re.sub(r"\{(\w+)\}", lambda m: "{" + ROUTE_PARAMS.get(m[1], m[1]) + "}",
                      route.resource.canonical)
        routes.add((route.method, path))
    documented = documented_operations()
    assert {r for r in routes if r[0] != "HEAD"} == {d for d in documented if d[0] != "HEAD"}
    # aiohttp answers HEAD on every GET route; the spec spells HEAD out for some of them.
    assert {("HEAD", p) for m, p in routes if m == "GET"} <= routes
    assert {d for d in documented if d[0] == "HEAD"} <= routes


async def test_round_trip_statuses_headers_and_bodies(daemon: TestClient, monkeypatch) -> None:
    check = Checker(daemon)
    first, second = arrow_bytes(sample_table(20)), arrow_bytes(sample_table(30, seed=2))
    # PUT: created, replaced, another subtask
    await check("PUT", PARTIAL, params=q(), data=first, headers=arrow_headers(first), expect=201)
    _, put = await check("PUT", PARTIAL, params=q(), data=second, headers=arrow_headers(second),
                         expect=200)
    assert put["replaced"] is True
    await check("PUT", PARTIAL, sub="s2", params=q(), data=first,
                headers={"Content-Type": "application/octet-stream"}, expect=201)
    # per-partial GET: whole, 304, ranges, 416, stale If-Range, HEAD
    resp, data = await check("GET", PARTIAL, params=q(), expect=200)
    assert data == second
    etag = resp.headers["ETag"]
    await check("GET", PARTIAL, params=q(), headers={"If-None-Match": etag}, expect=304)
    await check("GET", PARTIAL, params=q(), headers={"Range": "bytes=0-9"}, expect=206)
    await check("GET", PARTIAL, params=q(), headers={"Range": "bytes=-5", "If-Range": etag},
                expect=206)
    await check("GET", PARTIAL, params=q(), headers={"Range": f"bytes={len(second)}-"},
                expect=416)
    await check("GET", PARTIAL, params=q(), headers={"Range": "bytes=0-9", "If-Range": '"x"'},
                expect=200)
    await check("HEAD", PARTIAL, params=q(), expect=200)
    await check("HEAD", PARTIAL, params=q(), headers={"Range": "bytes=1-2"}, expect=206)
    await check("HEAD", PARTIAL, params=q(), headers={"If-None-Match": "*"}, expect=304)
    await check("HEAD", PARTIAL, params=q(), headers={"Range": "bytes=99999-"}, expect=416)
    # partition GET: spliced, chosen subtasks, unified (chunked), clash, missing
    await check("GET", PARTITION, params=q(), expect=200)
    await check("GET", PARTITION, params=[*q().items(), ("subTaskId", "s2"),
                                          ("subTaskId", "s1")], expect=200)
    await check("HEAD", PARTITION, params=q(), expect=200)
    for sub, table in (("s3", pa.table({"a": [1]})), ("s4", pa.table({"a": [2], "b": ["x"]}))):
        await check("PUT", PARTIAL, sub=sub, params=q(3), data=arrow_bytes(table), expect=201)
    unified, _ = await check("GET", PARTITION, params=q(3), expect=200)
    assert "Content-Length" not in unified.headers
    for sub, table in (("s5", pa.table({"a": pa.array([[1]])})),
                       ("s6", pa.table({"a": pa.array([{"x": 1}])}))):
        await check("PUT", PARTIAL, sub=sub, params=q(4), data=arrow_bytes(table), expect=201)
    _, clash = await check("GET", PARTITION, params=q(4), expect=409)
    assert clash["subTaskIds"] == ["s5", "s6"]
    _, missing = await check("GET", PARTITION, params=[*q().items(), ("subTaskId", "zz")],
                             expect=404)
    assert missing["missing"] == ["zz"]
    await check("GET", PARTITION, params=q(9), expect=404)
    await check("HEAD", PARTITION, params=q(9), expect=404)
    # listings; the task's paged: a page and its cursor, then the last page (cursor null)
    await check("GET", TASKS, expect=200)
    _, whole = await check("GET", TASK, expect=200)
    assert whole["nextCursor"] is None and whole["files"] == 6
    _, page = await check("GET", TASK, params={"limit": "4"}, expect=200)
    assert isinstance(page["nextCursor"], str)
    assert sum(len(p["subTasks"]) for p in page["partitions"]) == 4
    _, last = await check("GET", TASK, params={"limit": "10000", "cursor": page["nextCursor"]},
                          expect=200)
    assert last["nextCursor"] is None
    assert sum(len(p["subTasks"]) for p in last["partitions"]) == 2
    await check("GET", TASK, sup="nope", expect=404)
    # 400s, each with its code
    bad: list[tuple[str, str, dict[str, Any], str]] = [
        ("PUT", PARTIAL, {"sup": ".hidden", "params": q(), "data": first}, "invalid_id"),
        ("PUT", PARTIAL, {"params": q(pid=-1), "data": first}, "invalid_partition_id"),
        ("PUT", PARTIAL, {"params": {**q(), "end": DAY["start"]}, "data": first},
         "invalid_interval"),
        ("PUT", PARTIAL, {"params": q(), "data": first, "headers": {"Content-Type": "text/csv"}},
         "bad_request"),
        ("PUT", PARTIAL, {"params": q(), "data": first,
                          "headers": {"Content-Digest": "crc32c=:AAAAAA==:"}}, "digest_mismatch"),
        ("PUT", PARTIAL, {"params": q(), "data": b"not arrow at all"}, "invalid_body"),
        ("GET", PARTIAL, {"sub": "a%2Fb", "params": q()}, "invalid_id"),
        ("GET", PARTIAL, {"params": {"partitionId": "0"}}, "invalid_interval"),
        ("GET", PARTITION, {"params": [*q().items(), ("subTaskId", ".x")]}, "invalid_id"),
        ("GET", TASK, {"sup": ".x"}, "invalid_id"),
        ("GET", TASK, {"params": {"limit": "0"}}, "bad_request"),
        ("GET", TASK, {"params": {"limit": "10001"}}, "bad_request"),
        ("GET", TASK, {"params": {"limit": "5", "cursor": "not-a-cursor"}}, "bad_request"),
        ("GET", TASK, {"params": {"cursor": "x"}}, "bad_request"),
        ("DELETE", TASK, {"sup": "x" * 256}, "invalid_id"),
    ]
    for method, template, kwargs, code in bad:
        _, err = await check(method, template, expect=400, **kwargs)
        assert err["code"] == code, err
    # A task too large for one unpaged answer: 400 naming limit (threshold made small).
    monkeypatch.setattr(tasks, "UNPAGED_MAX", 5)
    _, err = await check("GET", TASK, expect=400)
    assert err["field"] == "limit" and "limit" in err["error"], err
    monkeypatch.undo()
    await check("GET", PARTIAL, sub="never", params=q(), expect=404)
    # delete, twice (idempotent), status endpoints
    _, deleted = await check("DELETE", TASK, expect=200)
    assert deleted["deleted"] is True and deleted["files"] == 6
    _, again = await check("DELETE", TASK, expect=200)
    assert again["deleted"] is False
    await check("GET", "/status/health", expect=200)
    await check("GET", "/status", expect=200)
    await check("GET", "/metrics", expect=200)
    # an unexpected failure: 500 with the documented body
    store = daemon.app[STATE].store

    def boom() -> None:
        raise RuntimeError("boom")

    monkeypatch.setattr(store, "tasks", boom)
    await check("GET", TASKS, expect=500)
    await check("GET", "/status", expect=500)
    check.assert_seen({
        ("PUT", PARTIAL): {200, 201, 400},
        ("GET", PARTIAL): {200, 206, 304, 400, 404, 416},
        ("HEAD", PARTIAL): {200, 206, 304, 416},
        ("GET", PARTITION): {200, 400, 404, 409},
        ("HEAD", PARTITION): {200, 404},
        ("GET", TASKS): {200, 500},
        ("GET", TASK): {200, 400, 404},
        ("DELETE", TASK): {200, 400},
    })


async def request_every_operation(check: Checker) -> None:
    """One request to every documented operation (bodies and queries filled in)."""
    body = arrow_bytes(sample_table(5))
    for method, template in sorted(documented_operations()):
        kwargs: dict[str, Any] = {}
        if "partition" in template:
            kwargs["params"] = q()
        if method == "PUT":
            kwargs.update(data=body, headers={"Content-Type": ARROW})
        await check(method, template, **kwargs)


async def test_draining_answers_503_except_health_and_heartbeat(daemon: TestClient) -> None:
    daemon.app[STATE].drain.draining = True
    check = Checker(daemon)
    await request_every_operation(check)
    for op, statuses in check.seen.items():
        # The health check and the supervisor's heartbeat (which says it is draining).
        answered = op[1] == "/status/health" or op[1].endswith("/heartbeat")
        assert statuses == ({200} if answered else {503}), op


async def test_auth_401_everywhere_but_health_and_metrics(start_daemon, make_settings,
                                                          tmp_path: Path) -> None:
    client = await start_daemon(make_settings([str(tmp_path / "auth")], auth_token="s3cret"))
    check = Checker(client)
    await request_every_operation(check)
    for op, statuses in check.seen.items():
        open_ = op[1] in ("/status/health", "/metrics")
        assert statuses == ({200} if open_ else {401}), op
    body = arrow_bytes(sample_table(5))
    await check("PUT", PARTIAL, params=q(), data=body, expect=201,
                headers={"Authorization": "Bearer s3cret", "Content-Type": ARROW})
    await check("GET", TASKS, headers={"Authorization": "Bearer wrong"}, expect=401)
    await check("GET", TASKS, headers={"Authorization": "Bearer s3cret"}, expect=200)
    strict = await start_daemon(make_settings([str(tmp_path / "strict")], auth_token="s3cret",
                                              metrics_require_auth=True))
    await Checker(strict)("GET", "/metrics", expect=401)


async def test_size_limit_413_and_full_location_507(start_daemon, make_settings,
                                                    tmp_path: Path) -> None:
    body = arrow_bytes(sample_table(50))
    limited = Checker(await start_daemon(
        make_settings([str(tmp_path / "limited")], max_partial_bytes=100)))
    _, err = await limited("PUT", PARTIAL, params=q(), data=body, expect=413)
    assert err["limit"] == 100

    async def chunks() -> AsyncIterator[bytes]:  # no Content-Length: refused while streaming
        for i in range(0, len(body), 64):
            yield body[i:i + 64]

    await limited("PUT", PARTIAL, params=q(), data=chunks(), expect=413)
    tiny = Checker(await start_daemon(make_settings([f"{tmp_path / 'tiny'}:100"])))
    _, err = await tiny("PUT", PARTIAL, params=q(), data=body, expect=507)
    assert err["code"] == "insufficient_storage"


async def test_unrouted_requests_answer_error_json(daemon: TestClient) -> None:
    error = {"$ref": "#/components/schemas/Error"}
    missing = await daemon.get(f"{PREFIX}/nowhere")
    assert missing.status == 404 and not schema_errors(error, body := await missing.json())
    assert body["code"] == "not_found"
    wrong = await daemon.post(f"{PREFIX}/tasks")
    assert wrong.status == 405 and "GET" in wrong.headers["Allow"]
    assert (await wrong.json())["code"] == "method_not_allowed"


@pytest.mark.parametrize(("schema", "value"), [
    ("PutResult", {"supervisorTaskId": "a"}),
    ("DeleteResult", {"supervisorTaskId": "a", "deleted": "yes", "bytes": 0, "files": 0}),
    ("DeleteResult", {"supervisorTaskId": ".a", "deleted": True, "bytes": 0, "files": 0}),
    ("DeleteResult", {"supervisorTaskId": "a", "deleted": True, "bytes": -1, "files": 0}),
    ("DeleteResult", {"supervisorTaskId": "a", "deleted": True, "bytes": 0, "files": 0, "x": 1}),
    ("BadRequestError", {"error": "e", "code": "not_found"}),
    ("OverloadedError", {"error": "e", "code": "overloaded"}),
    ("Health", False),
    ("TaskList", {"tasks": [{}], "bytes": 0, "files": 0}),
])
def test_validators_refuse_bad_bodies(schema: str, value: Any) -> None:
    assert schema_errors({"$ref": f"#/components/schemas/{schema}"}, value)
