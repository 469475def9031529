"""Who may do what: bearer tokens (RFC 6750) checked against the route's right.

Two kinds of token are accepted, alone or together:

- the daemon's ``auth_token`` (the shared-token mode of earlier versions): the operator's,
  every right on every task and the ops routes. Weaker: any executor holding it can read,
  overwrite, seal or delete every task's data on every daemon.
- task tokens (:mod:`shuffled.tokens`) signed with a secret of ``signing_secret_file``:
  one right on one supervisor task until they expire. A task route needs the right
  :data:`TASK_RIGHTS` names for it on the task in its path; every other route (task list,
  status page, metrics) needs an operator token.

401 for a missing, malformed, tampered or expired token (RFC 6750 section 3.1
``invalid_token``); 403 for a valid token that does not open this task or right
(``insufficient_scope``). Health stays open, and /metrics unless ``metrics_require_auth``.
GETs of :data:`BROWSER_PATHS` also take HTTP basic auth (RFC 7617) with an operator token
as the password, which a browser asks for itself; ``/ui`` without it answers a login page.
"""

from __future__ import annotations

import base64
import binascii
import hmac
import math

from aiohttp import web
from aiohttp.typedefs import Middleware

from shuffled.errors import Forbidden, ShuffleError, Unauthorized
from shuffled.protocol import API_PREFIX
from shuffled.server.errors import REJECT_REASON, Handler, error_response
from shuffled.server.access.login import login_page
from shuffled.server.middleware import HEALTH_PATH, METRICS_PATH
from shuffled.server.routes.peers import PEER_PREFIX
from shuffled.tokens import ANY_TASK, Grant, Scope, is_scoped, verify

TASK_PATH = f"{API_PREFIX}/tasks/{{sup}}"
# (method, route under the task path) -> the right it needs. A task route not named here
# needs admin: a new route is closed until someone decides who may call it.
TASK_RIGHTS: dict[tuple[str, str], Scope] = {
    ("PUT", "/{sub}/partition"): Scope.WRITE,
    ("POST", "/partials"): Scope.WRITE,
    ("POST", "/slabs"): Scope.WRITE,
    ("GET", "/shard"): Scope.READ,
    ("POST", "/shards"): Scope.READ,  # a batched read: the body names the shards
    ("GET", "/{sub}/partition"): Scope.READ,
    ("GET", "/partition"): Scope.READ,
    ("POST", "/partitions"): Scope.READ,  # a bulk read: the body names the partitions
    ("GET", "/partition/pages"): Scope.READ,
    ("DELETE", "/partition/pages"): Scope.READ,  # a reader's acknowledge
    ("GET", ""): Scope.READ,
    ("GET", "/state"): Scope.READ,
    ("GET", "/lost"): Scope.READ,
    ("PUT", "/seal"): Scope.ADMIN,
    ("POST", "/fail"): Scope.ADMIN,
    ("DELETE", ""): Scope.ADMIN,
    ("POST", "/heartbeat"): Scope.ADMIN,
    ("PUT", "/lost"): Scope.ADMIN,
    ("POST", "/warm"): Scope.READ,  # under /peers/{instance} only: a read done early
}
BROWSER_PATHS = frozenset({"/", "/ui", "/status", METRICS_PATH})
UI_PATHS = frozenset({"/", "/ui"})
_OPERATOR = Grant(ANY_TASK, Scope.OPERATOR, math.inf)


def required(request: web.Request) -> tuple[str | None, Scope] | None:
    """The task (None for a route of no task) and the right ``request`` needs; None for a
    path that is no route (any valid token gets its 404 or 405: a client probing the
    prefixed health path with its task token falls back to the root one)."""
    resource = request.match_info.route.resource
    if resource is None or request.match_info.http_exception is not None:
        return None
    canonical = resource.canonical
    if canonical.startswith(PEER_PREFIX):  # a lost peer's share: the right of the route
        canonical = canonical[len(PEER_PREFIX):]
    if not canonical.startswith(TASK_PATH) or "sup" not in request.match_info:
        return None, Scope.OPERATOR
    method = "GET" if request.method == "HEAD" else request.method
    right = TASK_RIGHTS.get((method, canonical[len(TASK_PATH):]), Scope.ADMIN)
    return request.match_info["sup"], right


def _basic_password(credentials: str) -> str | None:
    try:
        decoded = base64.b64decode(credentials.strip(), validate=True).decode()
    except (binascii.Error, ValueError):
        return None
    _, sep, password = decoded.partition(":")
    return password if sep else None


class Access:
    """Turns a request's credentials into a :class:`Grant` (or raises Unauthorized)."""

    def __init__(self, operator_token: str | None, secrets: tuple[bytes, ...]) -> None:
        self.operator = operator_token.encode() if operator_token else None
        self.secrets = secrets

    def grant(self, given: str) -> Grant:
        # Constant-time comparisons (hmac.compare_digest): no timing oracle on a token.
        if self.operator is not None and hmac.compare_digest(given.encode(), self.operator):
            return _OPERATOR
        if self.secrets and is_scoped(given):
            return verify(self.secrets, given)
        raise Unauthorized("missing or wrong bearer token")

    def of(self, request: web.Request) -> Grant:
        scheme, _, given = request.headers.get("Authorization", "").partition(" ")
        scheme = scheme.lower()
        if scheme == "bearer":
            return self.grant(given.strip())
        if scheme == "basic" and request.method in ("GET", "HEAD") and \
                request.path in BROWSER_PATHS:
            password = _basic_password(given)
            if password is not None:
                return self.grant(password)
        raise Unauthorized("missing or wrong bearer token")


def access_middleware(access: Access, metrics_require_auth: bool) -> Middleware:
    """Refuse a request its token does not open (see the module docstring)."""
    open_paths = {HEALTH_PATH} | (set() if metrics_require_auth else {METRICS_PATH})

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.path in open_paths:
            return await handler(request)
        try:
            grant = access.of(request)
        except Unauthorized as exc:
            request[REJECT_REASON] = "unauthorized"
            if request.path in UI_PATHS:
                return login_page()
            response = error_response(exc)
            response.headers["WWW-Authenticate"] = 'Bearer realm="shuffled", error="invalid_token"'
            return response
        needed = required(request)
        if needed is None:
            return await handler(request)
        sup, right = needed
        if not grant.opens(sup, right):
            request[REJECT_REASON] = "forbidden"
            where = f"task {sup}" if sup is not None else f"{request.path} (operator only)"
            err: ShuffleError = Forbidden(
                f"a {grant.scope} token for task {grant.sup} does not open {right} on {where}",
                needed=right.value)
            response = error_response(err)
            response.headers["WWW-Authenticate"] = (
                f'Bearer realm="shuffled", error="insufficient_scope", scope="{right}"')
            return response
        return await handler(request)

    return middleware
