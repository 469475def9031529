"""A loopback TCP proxy that cuts the first response it relays after a given number of bytes
(a reader's connection dropping mid-download)."""

from __future__ import annotations

import socket
import threading


class CuttingProxy:
    """A loopback TCP proxy in front of the daemon. The response on the first connection is
    cut (both sockets closed) after ``cut`` bytes; later connections pass everything.
    Records the request head and the response status line of each connection."""

    def __init__(self, upstream: tuple[str, int], cut: int) -> None:
        self.upstream = upstream
        self.cut = cut
        self.server = socket.create_server(("127.0.0.1", 0))
        self.server.settimeout(0.2)
        self.port = self.server.getsockname()[1]
        self.heads: list[bytes] = []
        self.status_lines: list[bytes] = []
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._accept = threading.Thread(target=self._accept_loop, daemon=True)
        self._accept.start()

    def _accept_loop(self) -> None:
        for _ in range(100_000):  # bounded: 100k accepts or 0.2 s polls, then give up
            if self._stop.is_set():
                return
            try:
                conn, _ = self.server.accept()
            except TimeoutError:
                continue
            number = len(self.heads)
            self.heads.append(b"")
            self.status_lines.append(b"")
            up = socket.create_connection(self.upstream, timeout=30)
            conn.settimeout(30)
            for target in (self._requests, self._responses):
                t = threading.Thread(target=target, args=(conn, up, number), daemon=True)
                t.start()
                self._threads.append(t)

    def _requests(self, conn: socket.socket, up: socket.socket, number: int) -> None:
        try:
            while data := conn.recv(65536):
                if len(self.heads[number]) < 4096:
                    self.heads[number] += data[:4096]
                up.sendall(data)
            up.shutdown(socket.SHUT_WR)  # the client is done: let the daemon close its side
        except OSError:
            pass

    def _responses(self, conn: socket.socket, up: socket.socket, number: int) -> None:
        sent = 0
        limit = self.cut if number == 0 else None
        try:
            while data := up.recv(65536):
                if not self.status_lines[number]:
                    self.status_lines[number] = data.split(b"\r\n", 1)[0]
                if limit is not None and sent + len(data) >= limit:
                    conn.sendall(data[: limit - sent])
                    break
                conn.sendall(data)
                sent += len(data)
        except OSError:
            pass
        for s in (conn, up):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()

    def close(self) -> None:
        self._stop.set()
        self._accept.join(timeout=5)
        self.server.close()
        for t in self._threads:
            t.join(timeout=5)
