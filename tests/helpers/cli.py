"""``shuffled ingest`` run as a user runs it: a subprocess with Spark on loopback and no
inherited ``PYSPARK_SUBMIT_ARGS``, for the tests that check what the command prints.

:func:`ingest_cli_runs` runs several ``shuffled ingest`` commands in one such subprocess,
one after the other, for tests that need a fresh JVM (one that sees an environment set
after the suite's own session started) but not one per command: the first command starts
the JVM as a user's run does, the later ones start their sessions in the same JVM.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]


def _env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {**os.environ, **(extra or {}), "SPARK_LOCAL_IP": "127.0.0.1"}
    env.pop("PYSPARK_SUBMIT_ARGS", None)
    return env


def ingest_cli(tmp_path: Path, spec: dict[str, Any], *extra: str,
               timeout: float = 240) -> subprocess.CompletedProcess[str]:
    """``shuffled ingest SPEC --output tmp_path/out EXTRA`` (the spec written to
    ``tmp_path/spec.json``); its exit code, stdout and stderr."""
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(spec))
    return subprocess.run([sys.executable, "-m", "shuffled", "ingest", str(path),
                           "--output", str(tmp_path / "out"), *extra],
                          cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=timeout)


def ingest_cli_runs(tmp_path: Path, runs: Sequence[Sequence[str]], *,
                    env: dict[str, str] | None = None,
                    timeout: float = 300) -> list[subprocess.CompletedProcess[str]]:
    """``shuffled ingest ARGS`` for each ARGS of ``runs``, in turn, in one subprocess (with
    ``env`` added to its environment): each command's exit code and what it wrote to
    stdout and stderr while it ran. (The JVM keeps the stderr the first command gave it:
    Spark's own lines of a later command, if any, are in the first one's stderr.)"""
    args = tmp_path / "cli-runs.json"
    args.write_text(json.dumps([["ingest", *run] for run in runs]))
    done = subprocess.run([sys.executable, "-m", "tests.helpers.cli", str(args)], cwd=ROOT,
                          env=_env(env), capture_output=True, text=True, timeout=timeout)
    results = args.with_suffix(".results.json")
    assert done.returncode == 0 and results.exists(), done.stdout[-3000:] + done.stderr[-3000:]
    return [subprocess.CompletedProcess(["shuffled", *argv], code,
                                        Path(out).read_text(errors="replace"),
                                        Path(err).read_text(errors="replace"))
            for argv, code, out, err in json.loads(results.read_text())]


@contextlib.contextmanager
def fds_to(stdout: Path, stderr: Path) -> Iterator[None]:
    """File descriptors 1 and 2 (what a terminal would show) to files while the block runs."""
    saved = [os.dup(1), os.dup(2)]
    files = [open(stdout, "wb"), open(stderr, "wb")]
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        for fd, fh in zip((1, 2), files):
            os.dup2(fh.fileno(), fd)
        yield
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        for fd, old in zip((1, 2), saved):
            os.dup2(old, fd)
            os.close(old)
        for fh in files:
            fh.close()


def _run_all(args_path: Path) -> None:
    """The subprocess of :func:`ingest_cli_runs`: each command through ``shuffled``'s own
    entry point, its output in files beside ARGS, the results in ARGS.results.json."""
    from shuffled import cli

    results = []
    for i, argv in enumerate(json.loads(args_path.read_text())):
        out, err = args_path.with_suffix(f".{i}.stdout"), args_path.with_suffix(f".{i}.stderr")
        with fds_to(out, err):
            try:
                code = int(cli.main(argv) or 0)
            except SystemExit as exc:
                code = int(exc.code or 0)
        results.append([argv, code, str(out), str(err)])
    args_path.with_suffix(".results.json").write_text(json.dumps(results))


if __name__ == "__main__":
    _run_all(Path(sys.argv[1]))
