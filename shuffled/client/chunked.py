"""Sending a streamed request body with HTTP/1.1 chunked coding (RFC 9112 section 7.1)."""

from __future__ import annotations

import http.client
import ssl
from collections.abc import Iterator

_CHUNK = 1 << 20  # a streamed body is sent in chunks of about this size (fewer to parse)
_IOV_MAX = 1024  # buffers one sendmsg may take (Linux UIO_MAXIOV)
#: A piece of a streamed body meaning "send what is gathered now" (pieces are otherwise
#: gathered into chunks of about 1 MiB): yielded before a wait for the next piece.
FLUSH = b""


def send_chunked(conn: http.client.HTTPConnection, pieces: Iterator[bytes | memoryview]) -> None:
    """Send ``pieces`` with HTTP/1.1 chunked coding (RFC 9112 section 7.1): pieces are
    joined into chunks of about :data:`_CHUNK` (one send each; the receiver parses chunk
    framing per chunk), larger ones go as they are; :data:`FLUSH` sends what is gathered."""
    pending: list[bytes | memoryview] = []
    size = 0

    def chunk(last: bytes = b"") -> None:
        # Scatter-gather: the pieces go as they are, not joined (a copy of every byte).
        _send_all(conn, [b"%X\r\n" % size, *pending, b"\r\n" + last])

    for piece in pieces:
        n = len(piece)
        if not n:
            if pending:  # FLUSH
                chunk()
                pending, size = [], 0
            continue
        pending.append(piece)
        size += n
        if size >= _CHUNK:
            chunk()
            pending, size = [], 0
    if pending:
        chunk(b"0\r\n\r\n")
    else:
        _send_all(conn, [b"0\r\n\r\n"])


def _send_all(conn: http.client.HTTPConnection, buffers: list[bytes | memoryview]) -> None:
    """``sendmsg`` the buffers (all of them: a short send resumes where it stopped); TLS
    sockets have no sendmsg: one send each there."""
    sock = conn.sock
    if sock is None or isinstance(sock, ssl.SSLSocket):
        for b in buffers:
            conn.send(b)
        return
    views = [memoryview(b).cast("B") for b in buffers if len(b)]
    while views:
        sent = sock.sendmsg(views[:_IOV_MAX])
        while views and sent >= len(views[0]):
            sent -= len(views[0])
            views.pop(0)
        if views and sent:
            views[0] = views[0][sent:]
