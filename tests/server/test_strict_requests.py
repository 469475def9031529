"""Smaller findings of the adversarial probe (issue 34), each against a real daemon:

- a corrupt ``Content-Encoding: gzip`` body is a 400 naming it, not a 500 with a traceback;
- a query parameter given twice (``partitionId=0&partitionId=1``) is refused, not "first
  one wins";
- a signed token whose ``exp`` is not an integer (``"inf"``, ``"nan"``, ``1e400``) is
  refused: it would never expire.
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import hmac
import json
import secrets
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from shuffled import tokens
from shuffled.server.embedded import EmbeddedDaemon
from tests.conftest import PREFIX, arrow_bytes, sample_table
from tests.helpers.procs import http_get

QUERY = "start=2018-01-01&end=2018-01-02&partitionId=0"


def _request(url: str, method: str, body: bytes | None = None,
             headers: dict[str, str] | None = None) -> tuple[int, dict]:
    request = urllib.request.Request(url, data=body, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=30) as resp:
            return resp.status, json.loads(resp.read() or b"null")
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read() or b"null")


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    base = tmp_path_factory.mktemp("strict")
    with EmbeddedDaemon([base / "a"], free_space_reserve=0) as url:
        yield url


def test_a_corrupt_gzip_body_is_a_400(daemon: str) -> None:
    """A JSON body whose gzip stream is corrupt: 400 naming Content-Encoding (it was a
    500 with a traceback)."""
    good = gzip.compress(b'{"subTaskIds": ["s0"]}')
    corrupt = good[:12] + bytes(b ^ 0x5A for b in good[12:20]) + good[20:]
    status, answer = _request(f"{daemon}{PREFIX}/tasks/gz/seal", "PUT", corrupt,
                              {"Content-Type": "application/json", "Content-Encoding": "gzip"})
    assert status == 400 and answer["field"] == "Content-Encoding", answer
    status, answer = _request(f"{daemon}{PREFIX}/tasks/gz/seal", "PUT", good,
                              {"Content-Type": "application/json", "Content-Encoding": "gzip"})
    assert status == 200, answer


def test_an_encoded_upload_is_refused_before_its_body_is_read(daemon: str) -> None:
    """An upload's Content-Length and Content-Digest describe the bytes sent; decoded,
    they would describe other bytes than those stored: 415 (RFC 9110 section 15.5.16),
    corrupt or not."""
    good = gzip.compress(arrow_bytes(sample_table(50)))
    corrupt = good[:20] + bytes(b ^ 0x5A for b in good[20:60]) + good[60:]
    for body in (good, corrupt):
        status, answer = _request(f"{daemon}{PREFIX}/tasks/gz/s0/partition?{QUERY}", "PUT",
                                  body, {"Content-Type": "application/vnd.apache.arrow.stream",
                                         "Content-Encoding": "gzip"})
        assert status == 415 and answer["field"] == "Content-Encoding", answer
    status, answer = _request(f"{daemon}{PREFIX}/tasks/gz/partials", "POST", good,
                              {"Content-Type": "application/vnd.shuffled.partials",
                               "Content-Encoding": "gzip"})
    assert status == 415, answer


def test_a_query_parameter_given_twice_is_refused(daemon: str) -> None:
    body = arrow_bytes(sample_table(5))
    status, answer = _request(
        f"{daemon}{PREFIX}/tasks/dup/s0/partition?{QUERY}&partitionId=1", "PUT", body,
        {"Content-Type": "application/vnd.apache.arrow.stream"})
    assert status == 400 and answer["field"] == "partitionId", answer
    status, _, raw = http_get(f"{daemon}{PREFIX}/tasks/dup/partition?{QUERY}&start=2019-01-01")
    assert status == 400 and json.loads(raw)["field"] == "start"
    # subTaskId names several subtasks on purpose
    status, _, _ = http_get(
        f"{daemon}{PREFIX}/tasks/dup/partition?{QUERY}&subTaskId=a&subTaskId=b")
    assert status == 404  # looked up (none held), not refused for the repetition


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _forged(secret: bytes, exp: object) -> str:
    """A token signed with the real secret whose ``exp`` claim is ``exp`` as given, built
    from the wire form documented in shuffled/tokens.py (``shf1.`` claims, HMAC-SHA256)."""
    signed = "shf1." + _b64(json.dumps({"sup": "t", "scope": "read", "exp": exp}).encode())
    return f"{signed}.{_b64(hmac.new(secret, signed.encode(), hashlib.sha256).digest())}"


@pytest.mark.parametrize("exp", ["inf", "nan", "1e400", 1e300, True, "2000000000"])
def test_a_token_whose_expiry_is_not_an_integer_is_refused(exp: object) -> None:
    secret = secrets.token_bytes(32)
    good = _forged(secret, 4_000_000_000)
    assert tokens.verify([secret], good, now=1.0).sup == "t"  # the forging is right
    with pytest.raises(tokens.Unauthorized) as refused:
        tokens.verify([secret], _forged(secret, exp), now=1.0)
    assert "exp" in str(refused.value)


def test_tokens_minted_by_the_driver_still_verify(tmp_path: Path) -> None:
    secret = secrets.token_bytes(32)
    token = tokens.mint(secret, "t", tokens.Scope.READ, ttl=60)
    assert tokens.verify([secret], token).scope == tokens.Scope.READ
