"""A real PostgreSQL server for tests: Debian's package (scripts/sysdeps.sh installs it for
`make test`), a fresh cluster in a temporary directory, listening on a free loopback port
only, trust authentication, run as the ``postgres`` user when the tests run as root
(PostgreSQL refuses root). Every wait is bounded; the server is stopped and its directory
removed afterwards."""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from tests.helpers.ingestion import free_port


def _bin_dir() -> str | None:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"),
                   key=lambda p: int(p.split("/")[4]) if p.split("/")[4].isdigit() else 0)
    if found:
        return os.path.dirname(found[-1])
    initdb = shutil.which("initdb")
    return os.path.dirname(initdb) if initdb else None


@contextmanager
def postgres_server() -> Iterator[str]:
    """Start the server; yield its SQLAlchemy URL (``postgresql+psycopg2://...``)."""
    bindir = _bin_dir()
    if bindir is None:
        pytest.skip("PostgreSQL is not installed (`make sysdeps-test` installs Debian's)")
    root = tempfile.mkdtemp(prefix="shuffled-pg-", dir="/tmp")
    run_as: dict[str, Any] = {}
    if os.getuid() == 0:
        user = pwd.getpwnam("postgres") if _has_user("postgres") else pwd.getpwnam("nobody")
        os.chown(root, user.pw_uid, user.pw_gid)
        run_as = {"user": user.pw_uid, "group": user.pw_gid, "extra_groups": []}
    data, port = os.path.join(root, "data"), free_port()
    proc = None
    try:
        subprocess.run([f"{bindir}/initdb", "-D", data, "-U", "postgres", "--auth=trust",
                        "-E", "UTF8", "--no-sync"], check=True, capture_output=True,
                       timeout=120, cwd=root, **run_as)
        proc = subprocess.Popen(
            [f"{bindir}/postgres", "-D", data, "-h", "127.0.0.1", "-p", str(port), "-k", root,
             "-c", "fsync=off", "-c", "full_page_writes=off"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=root, **run_as)
        deadline = time.monotonic() + 60
        while subprocess.run([f"{bindir}/pg_isready", "-h", "127.0.0.1", "-p", str(port)],
                             capture_output=True, timeout=10).returncode != 0:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"PostgreSQL did not start on 127.0.0.1:{port}")
            time.sleep(0.2)
        yield f"postgresql+psycopg2://postgres@127.0.0.1:{port}/postgres"
    finally:
        if proc is not None:
            proc.send_signal(signal.SIGINT)  # fast shutdown
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
        shutil.rmtree(root, ignore_errors=True)


def _has_user(name: str) -> bool:
    try:
        pwd.getpwnam(name)
        return True
    except KeyError:
        return False
