"""schemathesis against openapi.yaml on a running daemon: no 5xx, every answer matches the spec.

Each operation gets a bounded number of generated requests (valid and invalid ones); every
response must be a documented status with the documented headers, media type and JSON
schema. The daemon is real (loopback, real directories); a few partial segments are stored
first so GETs and the aggregate also hit existing data.
"""

from __future__ import annotations

import itertools
import secrets

from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.specs.openapi.checks import positive_data_acceptance
from schemathesis.transport.serialization import serialize_binary

from shuffled import framing
from shuffled.client import ShuffleClient
from shuffled.crc import crc32c
from shuffled.protocol import Interval, PartialKey, format_crc32c
from shuffled.server.embedded import EmbeddedDaemon
from shuffled.tokens import Scope, mint
from tests.conftest import DAY, arrow_bytes, files_under, sample_table

SPEC_PATH = Path(__file__).resolve().parents[2] / "openapi.yaml"

# An item per operation, all under one node id: pytest-xdist's scheduler keys items by it
# and ran ONE operation of the 31 (`-n 2 --dist loadfile`). `make test` runs these alone.
pytestmark = pytest.mark.serial
ARROW = "application/vnd.apache.arrow.stream"
EXAMPLES = 50  # per operation: the whole module stays well under a minute
_PUTS = itertools.count()  # generated PUT cases so far: every other one is a real upload
SEEN: Counter[tuple[str, int]] = Counter()  # (method, status) of every generated request

# A lost peer's routes (/peers/{instance}/...) need a daemon with deep storage, which this
# one has not (they would answer 404 only): tests/storage/test_deep_peers.py covers them.
schema = schemathesis.openapi.from_path(SPEC_PATH).exclude(path_regex="^/peers/")


@schemathesis.serializer(ARROW, framing.MEDIA_TYPE, "application/vnd.shuffled.slab")
def arrow_body(ctx: schemathesis.SerializationContext, value: object) -> dict[str, bytes]:
    """Arrow and bulk bodies go out as the bytes they are."""
    return {"data": serialize_binary(value)}


_POSTS = itertools.count()


def bulk_body(n: int) -> bytes:
    """A valid bulk batch of ``n`` small partials (docs/bulk-upload.md)."""
    out = []
    for i in range(n):
        body = arrow_bytes(sample_table(1 + i, seed=i))
        key = PartialKey("gen", f"b{i}", Interval.parse(DAY["start"], DAY["end"]), i % 3)
        out += [framing.encode(key, len(body), crc32c(body)), body]
    return b"".join(out) + framing.encode_end(n)


# Scoped tokens (docs/security.md), made per run: the daemon has an operator token and a
# signing secret; each generated task request carries a task token, mostly the admin one
# of its own task, sometimes a read, a write or another task's (403s are checked too).
SECRET = secrets.token_bytes(32)
OPERATOR = secrets.token_urlsafe(24)
_AUTH = itertools.count()
_SCOPES = (Scope.ADMIN, Scope.ADMIN, Scope.ADMIN, Scope.READ, Scope.WRITE)


@schema.hook
def map_case(context: schemathesis.HookContext, case: schemathesis.Case) -> schemathesis.Case:
    case = _shape(case)
    sup = (case.path_parameters or {}).get("supervisorTaskId")
    n = next(_AUTH)
    if sup is None:
        token = OPERATOR
    else:
        token = mint(SECRET, str(sup) if n % 7 else "another-task", _SCOPES[n % len(_SCOPES)],
                     600)
    case.headers = {**(case.headers or {}), "Authorization": f"Bearer {token}"}
    return case


def _shape(case: schemathesis.Case) -> schemathesis.Case:
    """Half of the generated uploads carry a real Arrow stream with its true digest (or none)
    and a valid interval, so the store's accepting path is exercised, not only refusals."""
    if case.method.upper() == "POST" and case.path.endswith("/partials"):
        if next(_POSTS) % 2:  # every other one a real batch: the accepting path too
            case.path_parameters = {"supervisorTaskId": "gen"}
            case.body = bulk_body(len(serialize_binary(case.body)) % 4)
        return case
    if case.method.upper() != "PUT":
        return case
    raw = serialize_binary(case.body)
    # Alternate by count, not by the generated body: hypothesis may generate the same few
    # bodies for a whole run, and then a body-derived choice never picks the real upload.
    if next(_PUTS) % 2:
        case.body = arrow_bytes(sample_table(len(raw) % 40, seed=len(raw)))
        case.path_parameters = {"supervisorTaskId": "gen", "subTaskId": f"s{len(raw) % 7}"}
        case.query = {**DAY, "partitionId": str(len(raw) % 3)}
        case.headers = {k: v for k, v in (case.headers or {}).items()
                        if k.lower() not in ("content-digest", "repr-digest", "content-type")}
        if crc32c(raw) % 4 == 1:
            case.headers["Content-Digest"] = format_crc32c(crc32c(case.body))
    return case


@pytest.fixture(scope="module")
def base_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    tmp = tmp_path_factory.mktemp("schemathesis")
    locations = [tmp / "a", tmp / "b"]
    # Long polls and failed reads bounded short: generated maxWait values are waited for.
    with EmbeddedDaemon(locations, free_space_reserve=0, long_poll_max=0.05,
                        failed_read_delay=0.01, auth_token=OPERATOR,
                        signing_secrets=(SECRET,)) as url:
        interval = Interval.parse(DAY["start"], DAY["end"])
        with ShuffleClient(url, token=mint(SECRET, "sup", Scope.WRITE, 600)) as client:
            for sub in ("s1", "s2"):
                client.put_partial(PartialKey("sup", sub, interval, 0),
                                   arrow_bytes(sample_table(20)))
        yield url
    puts = {status for (method, status), _ in SEEN.items() if method == "PUT"}
    if puts:  # the PUT operation ran: generated uploads were refused and accepted
        assert puts & {200, 201} and puts & {400} and puts & {403}, puts
    # Whatever was generated, nothing is left half-written.
    for loc in locations:
        assert list((loc / ".tmp").iterdir()) == []
        assert all(p.suffix == ".pack" for p in files_under(loc))


@schema.parametrize()
@settings(max_examples=EXAMPLES, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                 HealthCheck.filter_too_much])
def test_api_conforms_to_openapi(case: schemathesis.Case, base_url: str) -> None:
    # Every check but "schema-valid data is accepted": a schema cannot say start < end, that
    # a body is a complete Arrow IPC stream, or that Content-Digest matches the body, so
    # schema-valid requests are rightly refused with 400 (a documented status, still checked).
    response = case.call_and_validate(base_url=base_url, timeout=30,
                                      excluded_checks=[positive_data_acceptance])
    SEEN[(case.method.upper(), response.status_code)] += 1
    assert response.status_code < 500, response.text[:500]
