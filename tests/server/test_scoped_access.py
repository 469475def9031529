"""Per-task scoped tokens (shuffled.tokens, server.access): every abuse refused exactly,
nothing stored or deleted by it, the daemon's other clients unaffected in the same test.
Secrets and tokens are made per run."""

from __future__ import annotations

import asyncio
import secrets
import time
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient

from shuffled.tokens import Scope, mint, verify
from shuffled.errors import Forbidden, Unauthorized
from tests.conftest import DAY, PREFIX, arrow_bytes, files_under, sample_table

TTL = 600.0


@pytest.fixture
def secret_file(tmp_path: Path) -> tuple[Path, bytes]:
    secret = secrets.token_urlsafe(32).encode()
    path = tmp_path / "signing-secret"
    path.write_bytes(secret + b"\n")
    return path, secret


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def put_url(sup: str, sub: str = "s1") -> str:
    return f"{PREFIX}/tasks/{sup}/{sub}/partition"


PARAMS = {**DAY, "partitionId": "0"}


async def _put(client: TestClient, token: str, sup: str, sub: str = "s1",
               rows: int = 5) -> Any:
    return await client.put(put_url(sup, sub), params=PARAMS, headers=bearer(token),
                            data=arrow_bytes(sample_table(rows)))


async def _listing(client: TestClient, operator: str) -> dict[str, Any]:
    resp = await client.get(f"{PREFIX}/tasks", headers=bearer(operator))
    assert resp.status == 200
    return await resp.json()


async def _refused(resp: Any, status: int, code: str) -> dict[str, Any]:
    body = await resp.json()
    assert (resp.status, body["code"]) == (status, code), body
    return body


@pytest.fixture
async def scoped(start_daemon: Any, make_settings: Any, secret_file: tuple[Path, bytes],
                 ) -> tuple[TestClient, bytes, str]:
    """A daemon with a signing secret and an operator token."""
    path, secret = secret_file
    operator = secrets.token_urlsafe(24)
    client = await start_daemon(make_settings(signing_secret_file=str(path),
                                              auth_token=operator))
    return client, secret, operator


async def test_each_right_opens_its_routes_and_no_other(scoped: Any) -> None:
    client, secret, operator = scoped
    write = mint(secret, "taskA", Scope.WRITE, TTL)
    read = mint(secret, "taskA", Scope.READ, TTL)
    admin = mint(secret, "taskA", Scope.ADMIN, TTL)
    assert (await _put(client, write, "taskA")).status == 201
    # A read token writing: 403 naming the right, nothing stored.
    body = await _refused(await _put(client, read, "taskA", "s2"), 403, "forbidden")
    assert "write" in body["error"] and body["needed"] == "write"
    # A write token reading, even its own task.
    got = await client.get(f"{PREFIX}/tasks/taskA/partition", params=PARAMS,
                           headers=bearer(write))
    await _refused(got, 403, "forbidden")
    ok = await client.get(f"{PREFIX}/tasks/taskA/partition", params=PARAMS, headers=bearer(read))
    assert ok.status == 200 and ok.headers["X-Shuffled-Partials"] == "1"
    # Seal, fail and DELETE are the driver's (admin) only.
    for token in (write, read):
        seal = await client.put(f"{PREFIX}/tasks/taskA/seal", json={"subTaskIds": ["s1"]},
                                headers=bearer(token))
        await _refused(seal, 403, "forbidden")
        await _refused(await client.post(f"{PREFIX}/tasks/taskA/fail", headers=bearer(token)),
                       403, "forbidden")
        await _refused(await client.delete(f"{PREFIX}/tasks/taskA", headers=bearer(token)),
                       403, "forbidden")
        await _refused(await client.post(f"{PREFIX}/tasks/taskA/heartbeat",
                                         headers=bearer(token)), 403, "forbidden")
    # Task tokens never open the ops routes; the operator's does.
    for token in (write, read, admin):
        await _refused(await client.get(f"{PREFIX}/tasks", headers=bearer(token)), 403,
                       "forbidden")
        assert (await client.get("/status", headers=bearer(token))).status == 403
    listing = await _listing(client, operator)
    assert listing["files"] == 1  # only the write token's upload landed
    seal = await client.put(f"{PREFIX}/tasks/taskA/seal", json={"subTaskIds": ["s1"]},
                            headers=bearer(admin))
    assert seal.status == 200
    assert (await client.delete(f"{PREFIX}/tasks/taskA", headers=bearer(admin))).status == 200
    assert (await _listing(client, operator))["files"] == 0


async def test_a_token_of_one_task_opens_no_other(scoped: Any) -> None:
    client, secret, operator = scoped
    a_admin = mint(secret, "taskA", Scope.ADMIN, TTL)
    b_write = mint(secret, "taskB", Scope.WRITE, TTL)
    b_read = mint(secret, "taskB", Scope.READ, TTL)
    assert (await _put(client, b_write, "taskB")).status == 201
    # Task A's admin token on task B: read, write, delete all refused, B untouched.
    await _refused(await _put(client, a_admin, "taskB", "s9"), 403, "forbidden")
    got = await client.get(f"{PREFIX}/tasks/taskB/s1/partition", params=PARAMS,
                           headers=bearer(a_admin))
    await _refused(got, 403, "forbidden")
    await _refused(await client.delete(f"{PREFIX}/tasks/taskB", headers=bearer(a_admin)), 403,
                   "forbidden")
    # A write token of B reading A's (absent) data is refused before any lookup.
    got = await client.get(f"{PREFIX}/tasks/taskA/partition", params=PARAMS,
                           headers=bearer(b_write))
    await _refused(got, 403, "forbidden")
    ok = await client.get(f"{PREFIX}/tasks/taskB/s1/partition", params=PARAMS,
                          headers=bearer(b_read))
    assert ok.status == 200 and len(await ok.read()) > 0
    assert (await _listing(client, operator))["files"] == 1


async def test_expired_tampered_and_foreign_tokens_are_401(
        scoped: Any, start_daemon: Any, make_settings: Any, tmp_path: Path) -> None:
    client, secret, operator = scoped
    good = mint(secret, "taskA", Scope.WRITE, TTL)
    expired = mint(secret, "taskA", Scope.WRITE, 60, now=time.time() - 120)
    payload, sig = good.rsplit(".", 1)
    tampered_sig = f"{payload}.{sig[:-2]}{'AA' if sig[-2:] != 'AA' else 'BB'}"
    # Claims changed to another task, the signature kept: the signature no longer matches.
    other = mint(secret, "taskB", Scope.WRITE, TTL)
    tampered_claims = f"{other.rsplit('.', 1)[0]}.{sig}"
    foreign = mint(secrets.token_urlsafe(32).encode(), "taskA", Scope.WRITE, TTL)
    cases = {"expired": expired, "tampered signature": tampered_sig,
             "tampered claims": tampered_claims, "another daemon's secret": foreign,
             "not a token": "shf1.garbage", "empty": ""}
    for why, token in cases.items():
        resp = await _put(client, token, "taskA")
        body = await _refused(resp, 401, "unauthorized")
        assert resp.headers["WWW-Authenticate"].startswith("Bearer"), why
        if why == "expired":
            assert "expired" in body["error"]
        if why in ("tampered signature", "tampered claims", "another daemon's secret"):
            assert "signature" in body["error"]
    assert (await _listing(client, operator))["files"] == 0
    assert (await _put(client, good, "taskA")).status == 201  # others unaffected
    # The token replayed against a daemon that has another secret: refused there.
    path = tmp_path / "other-secret"
    path.write_text(secrets.token_urlsafe(32))
    other_daemon = await start_daemon(make_settings(locations=[str(tmp_path / "other")],
                                                    signing_secret_file=str(path)))
    await _refused(await _put(other_daemon, good, "taskA"), 401, "unauthorized")
    assert not [p for p in files_under(tmp_path / "other") if p.suffix == ".pack"]


async def test_rotation_accepts_both_secrets(start_daemon: Any, make_settings: Any,
                                             tmp_path: Path) -> None:
    old, new = secrets.token_urlsafe(32).encode(), secrets.token_urlsafe(32).encode()
    path = tmp_path / "secrets"
    path.write_bytes(new + b"\n" + old + b"\n")
    client = await start_daemon(make_settings(signing_secret_file=str(path)))
    assert (await _put(client, mint(old, "t", Scope.WRITE, TTL), "t", "s1")).status == 201
    assert (await _put(client, mint(new, "t", Scope.WRITE, TTL), "t", "s2")).status == 201
    # Without an operator token, an operator token minted with the secret opens ops routes.
    op = mint(new, "*", Scope.OPERATOR, TTL)
    assert (await _listing(client, op))["files"] == 2


async def test_path_traversal_in_every_path_parameter(scoped: Any, tmp_path: Path) -> None:
    client, secret, operator = scoped
    before = set(files_under(tmp_path))
    evil = ["..", "%2E%2E", "..%2F..%2Fetc", "a%2Fb", "%00", "a%5Cb", ".hidden", "x" * 300]
    for value in evil:
        for sup, sub in ((value, "s1"), ("taskA", value)):
            url = f"{PREFIX}/tasks/{sup}/{sub}/partition"
            for token in (operator, mint(secret, "taskA", Scope.ADMIN, TTL)):
                resp = await client.put(url, params=PARAMS, headers=bearer(token),
                                        data=arrow_bytes(sample_table(2)))
                assert resp.status in (400, 403, 404, 405), (url, resp.status)
        for path in (f"{PREFIX}/tasks/{value}", f"{PREFIX}/tasks/{value}/partition",
                     f"{PREFIX}/tasks/{value}/seal", f"{PREFIX}/tasks/{value}/state"):
            resp = await client.get(path, params=PARAMS, headers=bearer(operator))
            assert resp.status in (400, 404, 405), (path, resp.status)
        resp = await client.delete(f"{PREFIX}/tasks/{value}", headers=bearer(operator))
        assert resp.status in (400, 404, 405), (value, resp.status)
    # Nothing was written anywhere under the test's directory (locations included).
    assert set(files_under(tmp_path)) - before <= {p for p in files_under(tmp_path)
                                                    if ".shuffled" in p.parts}
    assert (await _listing(client, operator))["files"] == 0


async def test_oversized_headers_and_slow_and_stuck_clients_leave_others_served(
        scoped: Any) -> None:
    client, secret, operator = scoped
    write = mint(secret, "taskA", Scope.WRITE, TTL)
    read = mint(secret, "taskA", Scope.READ, TTL)
    # Oversized headers: refused by the HTTP parser (431/400), never reach a handler.
    huge = await client.get(f"{PREFIX}/tasks", headers={**bearer(operator), "X-Big": "a" * 20000})
    assert huge.status in (400, 431)
    too_long_token = "shf1." + "A" * 5000
    await _refused(await _put(client, too_long_token, "taskA"), 401, "unauthorized")
    # An oversized bulk frame header: refused, nothing stored.
    frame = b"SHB1" + (1 << 31).to_bytes(4, "big") + b"{" * 64
    bulk = await client.post(f"{PREFIX}/tasks/taskA/partials", headers=bearer(write),
                             data=frame)
    assert bulk.status == 400
    host, port = client.server.host, client.server.port
    assert isinstance(port, int)
    # Slow-loris: connections that send a few header bytes and stall.
    stalled = []
    for _ in range(20):
        reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), 5)
        writer.write(b"GET /druid/worker/v1/shuffle/tasks HTTP/1.1\r\nHost: x\r\nX-A: ")
        await writer.drain()
        stalled.append((reader, writer))
    # A client that asks for a large answer and never reads it.
    assert (await _put(client, write, "taskA", rows=200_000)).status == 201
    r2, w2 = await asyncio.wait_for(asyncio.open_connection(host, port), 5)
    w2.write(f"GET {PREFIX}/tasks/taskA/s1/partition?start={DAY['start']}&end={DAY['end']}"
             f"&partitionId=0 HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {read}\r\n\r\n"
             .encode())
    await w2.drain()
    try:
        # Meanwhile every other client is served at once.
        for i in range(5):
            resp = await asyncio.wait_for(_put(client, write, "taskA", f"other{i}"), 10)
            assert resp.status == 201
            got = await asyncio.wait_for(client.get(f"{PREFIX}/tasks/taskA/other{i}/partition",
                                                    params=PARAMS, headers=bearer(read)), 10)
            assert got.status == 200 and len(await got.read()) > 0
        assert (await _listing(client, operator))["files"] == 6
    finally:
        for _, writer in stalled + [(r2, w2)]:
            writer.close()


def test_tokens_unit_contract() -> None:
    key = secrets.token_bytes(32)
    token = mint(key, "t1", Scope.READ, 100, now=1000)
    grant = verify([key], token, now=1050)
    assert (grant.sup, grant.scope) == ("t1", Scope.READ)
    assert grant.opens("t1", Scope.READ) and not grant.opens("t1", Scope.WRITE)
    assert not grant.opens("t2", Scope.READ) and not grant.opens(None, Scope.READ)
    with pytest.raises(Unauthorized, match="expired"):
        verify([key], token, now=1100)
    admin = verify([key], mint(key, "t1", Scope.ADMIN, 100, now=1000), now=1001)
    assert admin.opens("t1", Scope.WRITE) and admin.opens("t1", Scope.READ)
    assert not admin.opens("t2", Scope.ADMIN) and not admin.opens(None, Scope.OPERATOR)
    with pytest.raises(ValueError):
        mint(key, "*", Scope.READ, 100)  # only an operator token is for every task
    with pytest.raises(ValueError):
        mint(b"", "t1", Scope.READ, 100)


def test_an_embedded_daemon_given_a_secret_file_is_not_open(tmp_path: Path,
                                                            secret_file: Any) -> None:
    """Finding (issue 37's slab access tests): EmbeddedDaemon read ``signing_secret_file``
    and then replaced the secrets it read with the ``signing_secrets`` argument's (none):
    a daemon embedded with a secret file took anonymous writes."""
    from shuffled.client import ShuffleClient
    from shuffled.server.embedded import EmbeddedDaemon

    path, secret = secret_file
    with EmbeddedDaemon([tmp_path / "loc"], free_space_reserve=0,
                        signing_secret_file=str(path)) as url:
        with ShuffleClient(url) as anonymous, pytest.raises(Unauthorized):
            anonymous.list_tasks()
        with ShuffleClient(url, token=mint(secret, "t", Scope.READ, TTL)) as reader, \
                pytest.raises(Forbidden):
            reader.list_tasks()  # the operator's route
