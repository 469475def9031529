"""Reading the daemon's answers: JSON bodies, and error bodies as the domain errors they
stand for (rebuilt from the JSON the server's one error-to-HTTP map wrote)."""

from __future__ import annotations

import http.client
import json
from typing import Any

from shuffled.errors import ShuffleError, error_from_json

_MAX_ERROR_BODY = 1 << 16


class BadResponse(ShuffleError):
    """The server answered something this client cannot use (not JSON, bad Content-Range)."""

    status = 502
    code = "bad_response"


def read_error(resp: http.client.HTTPResponse) -> tuple[dict[str, Any], bool]:
    """The JSON error body (or a stand-in naming the status) and whether it was read whole."""
    raw = resp.read(_MAX_ERROR_BODY + 1)
    complete = len(raw) <= _MAX_ERROR_BODY and resp.isclosed()
    raw = raw[:_MAX_ERROR_BODY]
    body: Any = None
    try:
        body = json.loads(raw) if raw else None
    except ValueError:
        body = None
    if not isinstance(body, dict):
        text = raw.decode("utf-8", "replace").strip()[:300]
        body = {"error": f"HTTP {resp.status} {resp.reason}" + (f": {text}" if text else "")}
    return body, complete


def domain_error(status: int, body: dict[str, Any], what: str) -> ShuffleError:
    """The domain error a JSON error body stands for (odd fields dropped, never raises)."""
    clean = {k: v for k, v in body.items() if isinstance(k, str) and k.isidentifier() and k != "message"}
    clean.setdefault("request", what)
    try:
        return error_from_json(status, clean)
    except (TypeError, ValueError):
        return error_from_json(status, {"error": str(body.get("error", f"HTTP {status}"))})


def read_json(resp: http.client.HTTPResponse) -> Any:
    """The whole response body parsed as JSON (None for an empty body)."""
    raw = resp.read()
    if not raw:
        return None
    try:
        return json.loads(raw)
    except ValueError as exc:
        raise BadResponse(f"HTTP {resp.status} answer is not JSON: {raw[:100]!r}") from exc


def json_dict(resp: http.client.HTTPResponse) -> dict[str, Any]:
    """The response body, which must be a JSON object."""
    value = read_json(resp)
    if not isinstance(value, dict):
        raise BadResponse(f"expected a JSON object, got {type(value).__name__}")
    return value
