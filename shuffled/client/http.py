"""One keep-alive HTTP/1.1 connection plus the retry loop every client call goes through.

What is worth a retry is :mod:`.retry`, reading answers and errors :mod:`.answers`, sending
a streamed body :mod:`.chunked`.

Only stdlib (``http.client``, ``ssl``): an executor importing the client pulls in no server code.
A :class:`Transport` owns exactly one connection and is not thread-safe.
"""

from __future__ import annotations

import http.client
import logging
import ssl
import time
import urllib.parse
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from dataclasses import KW_ONLY, dataclass
from typing import Any, Generic, TypeVar

from shuffled import __version__
from shuffled.client.answers import BadResponse, domain_error, read_error, read_json
from shuffled.client.chunked import FLUSH, send_chunked
from shuffled.client.retry import (NO_RETRY, RetryPolicy, ShuffleUnavailable, daemon_failed,
                                   is_retryable, parse_retry_after)
from shuffled.errors import Overloaded, ShuffleError

log = logging.getLogger("shuffled.client")

T = TypeVar("T")

_SMALL_BODY = 1 << 16
_STALE_ERRORS = (
    http.client.RemoteDisconnected,
    BrokenPipeError,
    ConnectionResetError,
    ConnectionAbortedError,
)

Query = Sequence[tuple[str, str]] | Mapping[str, str] | None
Headers = Mapping[str, str] | Callable[[], Mapping[str, str]] | None
#: A streamed body: called once per try, it yields the body's pieces (sent chunked; a
#: :data:`~.chunked.FLUSH` piece sends what is gathered at once).
Stream = Callable[[], Iterator[bytes | memoryview]]
#: A body sent with Content-Length: one buffer, or several sent one after the other.
Body = bytes | bytearray | memoryview | list[Any] | tuple[Any, ...]


@dataclass(frozen=True, slots=True)
class Request(Generic[T]):
    """One client call, as :meth:`Transport.request` sends it (and again on each retry).

    ``handle`` reads every 2xx answer and any status in ``accept`` into the call's result;
    other statuses become the domain error rebuilt from the JSON body (retried first if
    retryable). ``what`` names the call in logs and errors (a key, a task id). The body is
    ``body`` (sent with Content-Length; a list or tuple of buffers is sent piece by piece,
    never joined: a slab is its sections side by side, tens of MB) or ``stream`` (sent
    chunked; called once per try).
    ``headers`` may be a callable so each try can set its own (``Range`` when resuming);
    ``progress`` (bytes received so far) lets a try that made progress reset the count of
    failures; ``policy`` overrides the transport's retry policy.
    """

    method: str
    path: str
    _: KW_ONLY
    handle: Callable[[http.client.HTTPResponse], T]
    what: str
    query: Query = None
    headers: Headers = None
    body: Body | None = None
    stream: Stream | None = None
    accept: Collection[int] = ()
    progress: Callable[[], int] | None = None
    policy: RetryPolicy | None = None


def _views(body: Body | None) -> list[memoryview] | None:
    """The body's bytes as byte views, each piece as it is (no copy)."""
    if body is None:
        return None
    pieces = body if isinstance(body, (list, tuple)) else [body]
    return [memoryview(p).cast("B") for p in pieces]


class _RetryableStatus(Exception):
    """An HTTP answer worth another try; carries the domain error to raise if none is left."""

    def __init__(self, error: ShuffleError, retry_after: float | None) -> None:
        super().__init__(str(error))
        self.error = error
        self.retry_after = retry_after


class _StaleConnection(Exception):
    """A reused keep-alive connection turned out closed before any answer: reconnect at once."""

    def __init__(self, cause: BaseException) -> None:
        super().__init__(repr(cause))
        self.cause = cause


class Transport:
    """One HTTP(S) keep-alive connection to one daemon, with retries. Not thread-safe."""

    def __init__(
        self,
        base_url: str,
        *,
        token: str | None = None,
        ca_file: str | None = None,
        timeout: float = 60.0,
        retry: RetryPolicy = RetryPolicy(),
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        """``clock`` and ``sleep`` time the retries (their backoff and deadline): the real
        ones in production, a test's own to run them without waiting."""
        parsed = urllib.parse.urlsplit(base_url.strip())
        if parsed.scheme not in ("http", "https") or not parsed.hostname:
            raise ValueError(f"base_url {base_url!r} is not an http:// or https:// URL")
        if parsed.query or parsed.fragment:
            raise ValueError(f"base_url {base_url!r} must not have a query or fragment")
        self.scheme = parsed.scheme
        self.host = parsed.hostname
        self.port = parsed.port or (443 if parsed.scheme == "https" else 80)
        self.base_path = parsed.path.rstrip("/")
        netloc = f"[{self.host}]" if ":" in self.host else self.host
        self.base_url = f"{self.scheme}://{netloc}:{self.port}{self.base_path}"
        self.timeout = timeout
        self.retry = retry
        self._token = token
        self._ssl: ssl.SSLContext | None = None
        if self.scheme == "https":
            self._ssl = ssl.create_default_context(cafile=ca_file)
        self._conn: http.client.HTTPConnection | None = None
        self._reused = False
        self.bulk_version = 2  # bulk upload format; 1 once the daemon turned 2 down
        self._sleep = sleep
        self._clock = clock

    # -- connection ---------------------------------------------------------------------

    def _connection(self) -> http.client.HTTPConnection:
        if self._conn is None:
            if self._ssl is not None:
                self._conn = http.client.HTTPSConnection(
                    self.host, self.port, timeout=self.timeout, context=self._ssl
                )
            else:
                self._conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)
            self._reused = False
        return self._conn

    def close(self) -> None:
        """Close the connection; the next request opens a fresh one."""
        conn, self._conn = self._conn, None
        self._reused = False
        if conn is not None:
            conn.close()

    def target(self, path: str, query: Query = None) -> str:
        """The request target: base path + ``path`` + encoded query."""
        target = self.base_path + path
        if query:
            items = list(query.items()) if isinstance(query, Mapping) else list(query)
            target += "?" + urllib.parse.urlencode(items)
        return target

    # -- one exchange -------------------------------------------------------------------

    def _send(
        self, method: str, target: str, headers: Mapping[str, str],
        body: list[memoryview] | None, stream: Stream | None = None,
    ) -> http.client.HTTPResponse:
        conn = self._connection()
        reused = self._reused
        try:
            conn.putrequest(method, target, skip_accept_encoding=True)
            conn.putheader("User-Agent", f"shuffled-client/{__version__}")
            if self._token is not None:
                conn.putheader("Authorization", f"Bearer {self._token}")
            for name, value in headers.items():
                conn.putheader(name, value)
            if stream is not None:
                conn.putheader("Transfer-Encoding", "chunked")
            elif body is not None:
                conn.putheader("Content-Length", str(sum(v.nbytes for v in body)))
            elif method in ("PUT", "POST"):
                conn.putheader("Content-Length", "0")
            send_error: OSError | None = None
            if stream is not None:
                conn.endheaders()
                try:
                    send_chunked(conn, stream())
                except OSError as exc:
                    send_error = exc  # the server may have answered early: read that
            elif body is not None and 0 < sum(v.nbytes for v in body) <= _SMALL_BODY:
                # One send() for headers + a small body: no Nagle/delayed-ACK stall.
                conn.endheaders(b"".join(body))
                body = None
            else:
                conn.endheaders()
            if body is not None:
                try:
                    for view in body:
                        if view.nbytes:
                            conn.send(view)
                except OSError as exc:
                    # The server may have answered early (401/413/507) and closed: read that.
                    send_error = exc
            try:
                resp = conn.getresponse()
            except (OSError, http.client.HTTPException):
                if send_error is not None:
                    raise send_error from None
                raise
        except _STALE_ERRORS as exc:
            self.close()
            if reused:
                raise _StaleConnection(exc) from exc
            raise
        except BaseException:
            self.close()
            raise
        self._reused = True
        if resp.will_close:
            # http.client already dropped the socket from the connection; the response keeps it.
            self._conn = None
        return resp

    def _exchange(self, req: Request[T], target: str, headers: Mapping[str, str],
                  body: list[memoryview] | None, what: str) -> T:
        resp = self._send(req.method, target, headers, body, req.stream)
        try:
            status = resp.status
            if 200 <= status < 300 or status in req.accept:
                result = req.handle(resp)
                if not resp.isclosed():
                    # The handler left bytes unread: this connection cannot be reused.
                    resp.close()
                    self.close()
                return result
            err_body, complete = read_error(resp)
            if not complete:
                resp.close()
                self.close()
            error = domain_error(status, err_body, what)
            if is_retryable(status, error):
                retry_after = parse_retry_after(resp.getheader("Retry-After"))
                if retry_after is None and isinstance(error, Overloaded):
                    retry_after = float(error.retry_after)
                raise _RetryableStatus(error, retry_after)
            raise error
        except (OSError, http.client.HTTPException):
            resp.close()
            self.close()
            raise
        except BaseException:
            if not resp.isclosed():
                resp.close()
                self.close()
            raise

    # -- the retry loop -----------------------------------------------------------------

    def request(self, req: Request[T]) -> T:
        """Send ``req``, retrying per its policy (or the transport's), and return what its
        ``handle`` made of the answer (see :class:`Request`)."""
        policy = req.policy or self.retry
        progress, headers, what = req.progress, req.headers, req.what
        target = self.target(req.path, req.query)
        view = _views(req.body)
        label = f"{req.method} {target}"
        started = self._clock()
        failures = 0
        stale_retried = False
        while True:
            before = progress() if progress is not None else 0
            hdrs = headers() if callable(headers) else (headers or {})
            retry_after: float | None = None
            try:
                return self._exchange(req, target, hdrs, view, f"{what}: {label}")
            except _StaleConnection as exc:
                if not stale_retried:
                    stale_retried = True
                    log.debug("%s: kept-alive connection was closed by the server (%r); reconnecting", what, exc.cause)
                    continue
                last: BaseException = exc.cause
                reason = f"connection error {exc.cause!r}"
            except _RetryableStatus as exc:
                last = exc.error
                retry_after = exc.retry_after
                reason = f"HTTP {exc.error.status} {exc.error.code}: {exc.error.message}"
            except ssl.SSLCertVerificationError:
                raise
            except (OSError, http.client.HTTPException) as exc:
                last = exc
                reason = f"connection error {exc!r}"
            now = self._clock()
            if progress is not None and progress() > before:
                failures = 0
                started = now
            failures += 1
            remaining = policy.deadline - (now - started)
            if failures >= policy.attempts or remaining <= 0:
                self._give_up(what, label, last, failures, now - started)
            if policy.abandon is not None and (why := policy.abandon()) is not None:
                self._give_up(what, label, last, failures, now - started, why)
            if retry_after is not None:
                delay = min(retry_after, policy.max_backoff * 4)
            else:
                delay = policy.delay(failures)
            delay = max(0.0, min(delay, remaining))
            log.warning(
                "%s: retrying %s in %.2fs (try %d of %d failed): %s",
                what, label, delay, failures, policy.attempts, reason,
            )
            if delay:
                self._sleep(delay)

    def _give_up(self, what: str, label: str, last: BaseException, tries: int, elapsed: float,
                 why: str = "") -> None:
        if isinstance(last, ShuffleError) and not why:
            raise last
        raise ShuffleUnavailable(
            f"{what}: {label} to {self.base_url} failed after {tries} tries over "
            f"{elapsed:.1f}s{', given up: ' + why if why else ''}: {last!r}",
            request=label,
        ) from last


__all__ = [
    "FLUSH",
    "NO_RETRY",
    "BadResponse",
    "Request",
    "RetryPolicy",
    "ShuffleUnavailable",
    "Transport",
    "domain_error",
    "daemon_failed",
    "is_retryable",
    "parse_retry_after",
    "read_json",
]
