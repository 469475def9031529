"""`shuffled ingest`: check the arguments, run the ingestion quietly, say where it went.

Every failure is one paragraph on stderr, "shuffled ingest failed: <what>. Try: <remedy>.",
and exit code 1; an argument that is wrong (spec file, --output, --auth-token-file) is
found before Spark or any daemon starts, and nothing is left on disk for it.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import json
import logging
import os
import re
import shlex
import sys
import tempfile
import traceback
from pathlib import Path
from typing import Any

from shuffled.cli.terminal import QUIET_LOG4J, Progress, QuietStderr
from shuffled.tokens import read_secrets

EXIT_OK, EXIT_FAILED, EXIT_INTERRUPTED = 0, 1, 130


class Refused(Exception):
    """An argument of `shuffled ingest` that cannot work: ``what`` failed, ``hint`` to fix."""

    def __init__(self, what: str, hint: str) -> None:
        super().__init__(what)
        self.what, self.hint = what, hint


def spark_conf(value: str) -> tuple[str, str]:
    """argparse type of ``--conf KEY=VALUE``: a Spark setting, as spark-submit takes it."""
    key, sep, setting = value.partition("=")
    key = key.strip()
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"{value!r} is not KEY=VALUE (e.g. "
                                         f"spark.executor.memory=4g)")
    if not key.startswith("spark."):
        raise argparse.ArgumentTypeError(f"{key!r} is not a Spark setting (their names start "
                                         f"with 'spark.'; Hadoop's go as spark.hadoop.*)")
    return key, setting


def stall_timeout(value: str) -> float:
    """argparse type of ``--stall-timeout``: a duration above 0 (seconds, ``5m``,
    ``PT5M``, as every duration setting takes)."""
    from shuffled.config import parse_duration
    from shuffled.errors import ConfigError

    try:
        seconds = parse_duration(value, "--stall-timeout")
    except ConfigError:
        seconds = 0.0
    if not seconds > 0:
        raise argparse.ArgumentTypeError(
            f"{value!r} is not a duration above 0 seconds: give seconds (300), 5m or PT5M")
    return seconds


def submit_args(confs: list[tuple[str, str]], quiet: bool) -> str:
    """PYSPARK_SUBMIT_ARGS for the JVM pyspark starts: the user's own if set (then as
    given, with the ``--conf`` settings added), else the ``--conf`` settings and one
    ``--driver-java-options``: the user's ``spark.driver.extraJavaOptions``, Spark's
    logging kept to errors (unless --verbose) and the driver's exit on an
    OutOfMemoryError (:data:`~shuffled.spark.driver.sparksession.DRIVER_JAVA_OPTIONS`).
    spark-submit takes that option and ``--conf spark.driver.extraJavaOptions`` as one
    setting, the last given winning, hence one option holding all three."""
    from shuffled.spark.driver.sparksession import DRIVER_JAVA_OPTIONS

    given = os.environ.get("PYSPARK_SUBMIT_ARGS")
    args = shlex.split(given) if given is not None else []
    if args and args[-1] == "pyspark-shell":
        args.pop()
    java: list[str] = []
    for key, value in confs:
        if key == "spark.driver.extraJavaOptions" and given is None:
            java.append(value)
        else:
            args += ["--conf", f"{key}={value}"]
    if given is None:  # a user's own PYSPARK_SUBMIT_ARGS decides Spark's logging
        if quiet:
            java.append(f"-Dlog4j2.configurationFile=file:{QUIET_LOG4J}")
        java.append(DRIVER_JAVA_OPTIONS)
        args += ["--driver-java-options", " ".join(java)]
    return shlex.join([*args, "pyspark-shell"])


def _read_spec(path: str) -> Any:
    try:
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
    except FileNotFoundError:
        raise Refused(f"the spec file {path} does not exist (looked in {os.getcwd()})",
                      "give the path of a Druid index_parallel spec (JSON), e.g. "
                      "examples/rollup-tutorial/rollup-index.json") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise Refused(f"the spec file {path} cannot be read: {_reason(exc)}",
                      "give a readable JSON file (a Druid index_parallel spec)") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise Refused(f"the spec file {path} is not JSON: {exc.msg} at line {exc.lineno} "
                      f"column {exc.colno}",
                      f"fix the JSON in {path} (a Druid index_parallel spec)") from None


def _read_secret(path: str | None) -> bytes | None:
    """The first secret of the daemons' signing secret file (the one that signs)."""
    if path is None:
        return None
    try:
        with open(path, encoding="utf-8") as fh:
            secrets = read_secrets(fh.read())
    except (OSError, UnicodeDecodeError) as exc:
        raise Refused(f"--signing-secret-file {path} cannot be read: {_reason(exc)}",
                      "give the daemons' signing_secret_file") from None
    if not secrets:
        raise Refused(f"--signing-secret-file {path} has no secret",
                      "write the daemons' signing secret in it, one per line") from None
    return secrets[0]


def _read_token(path: str | None) -> str | None:
    if path is None:
        return os.environ.get("SHUFFLED_AUTH_TOKEN") or None
    try:
        with open(path, encoding="utf-8") as fh:
            token = fh.read().strip()
    except OSError as exc:
        raise Refused(f"--auth-token-file {path} cannot be read: {_reason(exc)}",
                      "give the file holding the shuffle servers' token") from None
    if not token:
        raise Refused(f"--auth-token-file {path} is empty",
                      "write the shuffle servers' token in it") from None
    return token


def probe_output(output: str) -> None:
    """Refuse a local ``--output`` this process cannot create or write, by trying: the
    directories it creates to try and a probe file are removed again."""
    if output.lower().startswith("iceberg://"):
        if not re.match(r"^iceberg://[^/?#]+/[^/?#]+\.[^/?#.]+$", output, re.IGNORECASE):
            raise Refused(f"--output {output} is not an Iceberg table",
                          "give iceberg://CATALOG/NAMESPACE.TABLE (a catalog configured in "
                          ".pyiceberg.yaml or PYICEBERG_CATALOG__<NAME>__* variables, or any "
                          "other name for the embedded default), see docs/iceberg.md")
        return  # the catalog is loaded where the ingestion publishes
    if re.match(r"^[a-z][a-z0-9+.-]*://", output):
        return  # s3://...: checked where it is written
    path = Path(output).absolute()
    missing: list[Path] = []
    probe = path
    while not probe.exists() and probe != probe.parent:
        missing.append(probe)
        probe = probe.parent
    created: list[Path] = []
    doing = "cannot be written"
    try:
        for directory in reversed(missing):
            doing = f"cannot be created: creating {directory} failed"
            directory.mkdir()
            created.append(directory)
        doing = f"cannot be written: a file in {path} cannot be created"
        fd, name = tempfile.mkstemp(dir=path, prefix=".shuffled-probe-")
        os.close(fd)
        os.unlink(name)
    except OSError as exc:
        raise Refused(f"--output {output} {doing}: {_reason(exc)}",
                      "give --output a directory this user can write (it is created if "
                      "missing), or s3://bucket/prefix") from None
    finally:
        for directory in reversed(created):
            with contextlib.suppress(OSError):
                directory.rmdir()


def _reason(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.errno is not None:
        return f"{exc.strerror} ({errno.errorcode.get(exc.errno, exc.errno)})"
    return str(exc)


def explain(exc: BaseException, spec_path: str, *, signed: str | None = None) -> str:
    """One paragraph for a failed ingestion: what failed, where, the report, what to try.
    ``signed``: the --signing-secret-file the driver minted its tokens with, if any."""
    from shuffled.client import ShuffleUnavailable
    from shuffled.errors import ShuffleError, Unauthorized

    if isinstance(exc, Refused):
        return f"shuffled ingest failed: {exc.what}. Try: {exc.hint}."
    notes = [n for n in getattr(exc, "__notes__", []) if n.startswith("task report: ")]
    message = getattr(exc, "message", None) or first_line(exc)
    given = getattr(exc, "details", {}).get("hint") if isinstance(exc, ShuffleError) else None
    if given:  # the failure knows its remedy (a stall, an out-of-memory JVM)
        hint = given
    elif isinstance(exc, Unauthorized) and signed:
        hint = (f"the shuffle servers refused the task token minted with --signing-secret-file "
                f"{signed}: give the file the servers were started with (their "
                "signing_secret_file, docs/security.md)")
    elif isinstance(exc, Unauthorized):
        hint = ("give the token the shuffle servers were started with: --auth-token-file "
                "FILE, or the SHUFFLED_AUTH_TOKEN environment variable")
    elif isinstance(exc, ShuffleUnavailable):
        hint = "check that the shuffle servers are up and reachable from every executor"
    elif getattr(exc, "code", "") == "invalid_spec":
        message = f"{spec_path}: {message}"
        hint = (f"fix that field in {spec_path} (docs/spec-coverage.md lists every field "
                "and what is supported)")
    elif isinstance(exc, FileNotFoundError):
        hint = "check ioConfig.inputSource (baseDir, filter) and that the files exist"
    elif "Py4J" in type(exc).__name__ or "Spark" in type(exc).__name__ or \
            type(exc).__module__.startswith("pyspark"):
        hint = "a Spark job failed; re-run with --verbose for Spark's logs and the traceback"
    elif isinstance(exc, OSError):
        hint = "check the path named above and its permissions; --verbose shows the traceback"
    else:
        hint = "re-run with --verbose for the traceback"
    text = f"shuffled ingest failed: {message.rstrip('.')}."
    if notes:
        text += f" The task report is at {notes[0][len('task report: '):]}."
    return f"{text} Try: {hint}."


def first_line(exc: BaseException) -> str:
    """The gist of an exception whose text may hold a whole (Java or worker) traceback:
    its last 'Error:'/'Exception:' line, else its first line."""
    text = str(exc).strip() or type(exc).__name__
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    for ln in reversed(lines):
        if re.match(r"^[\w.$]+(Error|Exception|Failed)\b.*:", ln):
            return ln[:400]
    return f"{type(exc).__name__}: {lines[0][:400]}"


def where_it_went(result: Any) -> str:
    """The closing lines of a successful run: where segments, manifest and report are."""
    segments = len(result.segments)
    if getattr(result, "table", None):
        return (f"table: {result.table} ({segments} data file{'' if segments == 1 else 's'} "
                f"committed)\nmetadata: {result.manifest_path}\n"
                f"task report: {result.report_path}")
    out_dir = os.path.dirname(result.manifest_path)
    return (f"segments: {segments} segment{'' if segments == 1 else 's'} under {out_dir}\n"
            f"manifest: {result.manifest_path}\ntask report: {result.report_path}")


def not_py4j(record: logging.LogRecord) -> bool:
    """Drop py4j's own log records. py4j logs its connection errors at ERROR through the
    root logger, e.g. "Exception while sending command" when Ctrl-C's handler cancels
    Spark's jobs while the main thread is inside a gateway call (CI saw it twice, each
    time after the interrupt itself had been handled). The command reports every failure
    in its one paragraph; ``--verbose`` keeps them."""
    return f"{os.sep}py4j{os.sep}" not in record.pathname


def cmd_ingest(args: argparse.Namespace) -> int:
    """Run `shuffled ingest`; returns the exit code."""
    from shuffled.api import ingest

    level = "INFO" if args.verbose else os.environ.get("SHUFFLED_LOG_LEVEL", "ERROR")
    logging.basicConfig(level=level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s %(message)s")
    if not args.verbose:
        for handler in logging.getLogger().handlers:
            handler.addFilter(not_py4j)
    progress = Progress(sys.stdout)
    try:
        spec = _read_spec(args.spec)
        token = _read_token(args.auth_token_file)
        secret = _read_secret(args.signing_secret_file)
        probe_output(args.output)
        if args.validate:
            from shuffled.spark.driver.pipeline import validate

            servers = args.shuffle_servers or []
            for line in validate(spec, shuffle_servers=servers, output_dir=args.output,
                                 token=token, ca_file=args.ca_file, signing_secret=secret):
                print(line, flush=True)
            return EXIT_OK
        os.environ["PYSPARK_SUBMIT_ARGS"] = submit_args(args.conf or [], quiet=not args.verbose)
        with contextlib.nullcontext() if args.verbose else QuietStderr():
            result = ingest(spec, master=args.master, shuffle_servers=args.shuffle_servers,
                            output_dir=args.output, token=token, ca_file=args.ca_file,
                            progress=progress, show_rows=args.show_rows,
                            reader=args.phase1_reader, signing_secret=secret,
                            stall_seconds=args.stall_timeout)
    except KeyboardInterrupt as exc:
        # py4j may still log "Exception while sending command" as Spark's gateway goes
        # down under the interrupt (seen once in CI): the one line below is the answer.
        logging.disable(logging.CRITICAL)
        progress.close()
        notes = [n for n in getattr(exc, "__notes__", []) if n.startswith("task report: ")]
        print("shuffled ingest: interrupted (Ctrl-C); nothing was published and the shuffle "
              "data was deleted" + (f"; the task report is at {notes[0][13:]}" if notes else ""),
              file=sys.stderr)
        return EXIT_INTERRUPTED
    except BaseException as exc:  # every failure: one paragraph, exit 1
        progress.close()
        if args.verbose and not isinstance(exc, Refused):
            traceback.print_exc()
        print(explain(exc, args.spec, signed=args.signing_secret_file), file=sys.stderr)
        return EXIT_FAILED
    progress.close()
    if result is not None:
        print(where_it_went(result), flush=True)
    return EXIT_OK
