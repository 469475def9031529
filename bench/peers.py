"""nginx from Debian's packages as the peer: static GET (sendfile) and WebDAV PUT.

One worker process (``worker_processes 1``) to match the daemon's single process; it runs
as a child of the bench on a free loopback port with everything (pid, logs, body temp
files, document root) under one temp prefix on the same file system as the daemon's data.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from types import TracebackType

from bench.procs import LOOPBACK, Tree, free_port, poll_until, port_open, stop

CONF = """\
user root;
worker_processes 1;
pid {prefix}/nginx.pid;
error_log {prefix}/error.log warn;
events {{ worker_connections 4096; }}
http {{
    access_log off;
    sendfile on;
    tcp_nopush on;
    tcp_nodelay on;
    keepalive_requests 1000000;
    keepalive_timeout 120s;
    default_type application/octet-stream;
    client_max_body_size 0;
    client_body_temp_path {prefix}/body;
    proxy_temp_path {prefix}/tmp-proxy;
    fastcgi_temp_path {prefix}/tmp-fastcgi;
    uwsgi_temp_path {prefix}/tmp-uwsgi;
    scgi_temp_path {prefix}/tmp-scgi;
    server {{
        listen {host}:{port};
        root {prefix}/root;
        location / {{
            dav_methods PUT;
            create_full_put_path on;
            dav_access user:rw group:r all:r;
        }}
    }}
}}
"""


def nginx_binary() -> str | None:
    """Path of nginx, or None when it is not installed."""
    return shutil.which("nginx") or (
        "/usr/sbin/nginx" if os.access("/usr/sbin/nginx", os.X_OK) else None)


class Nginx:
    """``with Nginx(prefix) as n:`` serves ``n.root`` on ``n.url`` until the block ends."""

    def __init__(self, prefix: Path) -> None:
        binary = nginx_binary()
        if binary is None:
            raise RuntimeError("nginx is not installed (make sysdeps-bench installs it)")
        self.binary = binary
        self.prefix = prefix
        self.root = prefix / "root"
        self.port = 0
        self.proc: subprocess.Popen[bytes] | None = None
        self._workers: list[int] = []

    @property
    def url(self) -> str:
        return f"http://{LOOPBACK}:{self.port}"

    @property
    def tree(self) -> Tree:
        assert self.proc is not None
        return Tree(self.proc.pid)

    def start(self, timeout: float = 20.0) -> None:
        """Write the config, start nginx in the foreground as our child, wait for its port."""
        self.root.mkdir(parents=True, exist_ok=True)
        (self.prefix / "body").mkdir(exist_ok=True)
        self.port = free_port()
        conf = self.prefix / "nginx.conf"
        conf.write_text(CONF.format(prefix=self.prefix, host=LOOPBACK, port=self.port))
        self.proc = subprocess.Popen(
            [self.binary, "-p", str(self.prefix), "-c", str(conf), "-g", "daemon off;"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            stderr=open(self.prefix / "stderr.log", "wb"))
        proc = self.proc

        def up() -> bool:
            if proc.poll() is not None:
                raise RuntimeError(f"nginx exited {proc.returncode}: "
                                   + (self.prefix / "stderr.log").read_text()[-2000:])
            return port_open(self.port) and bool(self.tree.pids()[1:])

        poll_until(up, timeout, "nginx listening")
        self._workers = self.tree.pids()[1:]

    def stop(self) -> None:
        """Stop the master by pid; then make sure the workers it had are gone too."""
        if self.proc is None:
            return
        stop(self.proc)
        for pid in self._workers:  # only if the master died without stopping them
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as fh:
                    ours = fh.read().startswith(b"nginx: worker")
                if ours:
                    os.kill(pid, 9)
            except (OSError, ProcessLookupError):
                pass
        self.proc = None

    def __enter__(self) -> Nginx:
        self.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()
