"""Scoped access tokens: one supervisor task, one right, an expiry, signed by the driver.

The daemons share a signing secret (``signing_secret_file``: one secret per line, the
first signs, every line verifies, so a secret is rotated by adding the new one first,
then dropping the old once no token signed by it can still be alive). The driver, which
holds the secret, mints per ingestion:

- ``write`` for phase-1 executors (upload partials of its task),
- ``read`` for phase-2 executors (read its partitions, pages and state),
- ``admin`` kept on the driver (seal, fail, DELETE, heartbeat; reads and writes too).

Executors never see the secret, only their token, and a token opens one task on every
daemon sharing the secret, until it expires. ``operator`` is every right on every task and
the ops routes (task list, status page, metrics); the daemon's own ``auth_token`` is an
operator token too.

Wire form (version 1), ASCII, fit for an ``Authorization: Bearer`` header (RFC 6750
section 2.1 b64token)::

    shf1.<base64url(JSON claims)>.<base64url(HMAC-SHA256(secret, "shf1." + claims part))>

claims: ``{"sup": <supervisorTaskId or "*">, "scope": <right>, "exp": <unix seconds>}``.
HMAC-SHA256 (RFC 2104) from the standard library: nothing beyond it is needed for one
fixed algorithm, and a fixed algorithm leaves no "alg" header to confuse (the classic JWT
pitfall). Signatures are compared in constant time.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

from shuffled.errors import Unauthorized

PREFIX = "shf1."
ANY_TASK = "*"
MAX_TOKEN_CHARS = 2048


class Scope(StrEnum):
    """What a token may do. ``admin`` includes ``read`` and ``write``; ``operator`` all."""

    READ = "read"
    WRITE = "write"
    ADMIN = "admin"
    OPERATOR = "operator"

    def allows(self, right: Scope) -> bool:
        if self is Scope.OPERATOR or self is right:
            return True
        return self is Scope.ADMIN and right in (Scope.READ, Scope.WRITE)


@dataclass(frozen=True)
class Grant:
    """A verified token's claims."""

    sup: str
    scope: Scope
    expires: float

    def opens(self, sup: str | None, right: Scope) -> bool:
        """Whether this grant allows ``right`` on task ``sup`` (None: a route of no task,
        which only an operator opens)."""
        if self.scope is Scope.OPERATOR:
            return True
        return sup is not None and sup == self.sup and self.scope.allows(right)


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _sign(secret: bytes, signed: str) -> bytes:
    return hmac.new(secret, signed.encode("ascii"), hashlib.sha256).digest()


def mint(secret: bytes, sup: str, scope: Scope, ttl: float, *, now: float | None = None) -> str:
    """A token for ``scope`` on task ``sup`` (``*`` only for operator), valid ``ttl`` s."""
    if not secret:
        raise ValueError("the signing secret is empty")
    if (sup == ANY_TASK) != (scope is Scope.OPERATOR):
        raise ValueError("only an operator token is for every task ('*')")
    expires = int((time.time() if now is None else now) + ttl)
    claims = json.dumps({"sup": sup, "scope": scope.value, "exp": expires},
                        separators=(",", ":"), sort_keys=True).encode()
    signed = PREFIX + _b64(claims)
    return f"{signed}.{_b64(_sign(secret, signed))}"


def is_scoped(token: str) -> bool:
    return token.startswith(PREFIX)


def verify(secrets: Sequence[bytes], token: str, *, now: float | None = None) -> Grant:
    """The grant of ``token`` if some secret signed it and it has not expired; raises
    Unauthorized saying which (never which secret, nor the expected signature)."""
    if len(token) > MAX_TOKEN_CHARS or not is_scoped(token):
        raise Unauthorized("not a shuffled task token")
    signed, dot, sig_text = token.rpartition(".")
    if not dot or not signed.startswith(PREFIX):
        raise Unauthorized("malformed task token")
    try:
        signature = _unb64(sig_text)
        claims = json.loads(_unb64(signed[len(PREFIX):]))
    except (binascii.Error, ValueError, UnicodeDecodeError):
        raise Unauthorized("malformed task token") from None
    # Every secret is tried (no early exit telling which one matched).
    good = False
    for secret in secrets:
        good |= hmac.compare_digest(_sign(secret, signed), signature)
    if not good:
        raise Unauthorized("task token signature does not verify (tampered, or signed with "
                           "a secret this daemon does not have)")
    try:
        sup, scope, expires = str(claims["sup"]), Scope(claims["scope"]), claims["exp"]
    except (KeyError, TypeError, ValueError):
        raise Unauthorized("malformed task token claims") from None
    if type(expires) is not int:  # "inf", NaN or 1e400 would never expire
        raise Unauthorized("malformed task token claims: exp must be an integer (unix "
                           "seconds)")
    if expires <= (time.time() if now is None else now):
        raise Unauthorized(f"task token for {sup} expired; the driver mints a new one per "
                           "ingestion (tuningConfig shuffleTokenSeconds)")
    return Grant(sup, scope, expires)


def read_secrets(text: str) -> tuple[bytes, ...]:
    """Secrets from a secret file's text: one per non-empty line, the first signs."""
    return tuple(line.strip().encode() for line in text.splitlines() if line.strip())
