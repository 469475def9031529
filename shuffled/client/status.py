"""The daemon's status routes, under the API prefix or at the root (Druid's ``/status/health``)."""

from __future__ import annotations

import http.client
from collections.abc import Callable
from typing import Any

from shuffled.client.answers import json_dict, read_json
from shuffled.client.http import Request, Transport
from shuffled.client.retry import NO_RETRY, RetryPolicy
from shuffled.errors import NotFound, ShuffleError, Unauthorized
from shuffled.protocol import API_PREFIX


class StatusRoutes:
    """``GET /status/health`` and ``GET /status`` of one daemon, on its client's transport."""

    def __init__(self, http_: Transport, base_url: str, *, token_sent: bool) -> None:
        self._http = http_
        self.base_url = base_url
        self._token_sent = token_sent  # for health()'s 401 message
        self._prefix: str | None = None  # the prefix that answered, once one did

    def health(self) -> bool:
        """True if the daemon answers ``GET /status/health`` with ``true``; one try, False for
        an unreachable or unhealthy server. Raises :class:`Unauthorized` (naming the server
        and whether a token was sent) when it refuses the token: a live daemon, not a dead
        one, and the remedy is the token, not the URL."""
        try:
            value = self._get("/status/health", read_json, NO_RETRY)
        except Unauthorized as exc:
            sent = self._token_sent
            raise Unauthorized(
                f"shuffle server {self.base_url} answered 401: "
                + ("it refused the bearer token given (wrong token)" if sent else
                   "it requires a bearer token and none was given (missing token)"),
                server=self.base_url, token_sent=sent) from exc
        except (ShuffleError, OSError, http.client.HTTPException):
            return False
        return value is True

    def status(self) -> dict[str, Any]:
        """``GET /status``: version, uptime, locations."""
        value: dict[str, Any] = self._get("/status", json_dict, None)
        return value

    def _get(
        self, suffix: str, handle: Callable[[http.client.HTTPResponse], Any],
        policy: RetryPolicy | None,
    ) -> Any:
        """GET a status route under the API prefix, falling back to the root (Druid's
        ``/status/health``) if the prefixed one is 404; the route that worked is remembered."""
        prefixes = [self._prefix] if self._prefix is not None else [API_PREFIX, ""]
        for i, prefix in enumerate(prefixes):
            try:
                value = self._http.request(Request(
                    "GET", prefix + suffix, handle=handle, what=suffix.lstrip("/"), policy=policy
                ))
            except NotFound:
                if i + 1 < len(prefixes):
                    continue
                raise
            self._prefix = prefix
            return value
        raise AssertionError("unreachable")
