"""Command line: the only place touching argv, environ and exit codes."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import re
import sys
import tempfile
import threading
import traceback
from collections.abc import Sequence
from typing import Any

from shuffled import __version__
from shuffled.config import FIELDS, Settings, load_settings
from shuffled.errors import ConfigError, ShuffleError

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2


def _serve_parser(sub: argparse._SubParsersAction) -> None:
    defaults = Settings()
    parser = sub.add_parser(
        "serve", help="run the shuffle data daemon",
        description="Run the shuffle daemon. Every setting can also come from a TOML file "
                    "(--config) or a SHUFFLED_<NAME> environment variable; flags win.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--config", metavar="FILE", help="TOML settings file")
    for spec in FIELDS:
        default = getattr(defaults, spec.name)
        shown = "" if spec.name == "auth_token" else f" (default: {default if default not in (None, ()) else 'none'})"
        parser.add_argument(
            spec.flag, dest=spec.name, metavar=spec.metavar,
            action="append" if spec.repeatable else "store",
            help=f"{spec.help}{shown}; env SHUFFLED_{spec.name.upper()}",
        )


def _ingest_parser(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("ingest", help="run a Druid index_parallel spec on Spark",
                            description="Two-phase perfect-rollup ingestion through shuffled.")
    parser.add_argument("spec", help="Druid native batch spec (JSON, type index_parallel)")
    parser.add_argument("--master", help="Spark master URL (default local[*])")
    parser.add_argument("--shuffle-server", action="append", dest="shuffle_servers",
                        metavar="URL",
                        help="shuffled daemon URL; repeat for several (default: an embedded one)")
    parser.add_argument("--output", default="segments",
                        help="output directory, or s3://bucket/prefix (default ./segments)")
    parser.add_argument("--auth-token-file", help="bearer token for the shuffle servers")
    parser.add_argument("--ca-file", help="CA bundle to verify https shuffle servers")
    parser.add_argument("--show-rows", type=int, default=0, metavar="N",
                        help="print up to N rows of the resulting segments")
    parser.add_argument("--verbose", action="store_true",
                        help="on failure print the traceback, and let Spark log at WARN")
    parser.add_argument("--phase1-reader", choices=("auto", "native", "jvm"), default="auto",
                        help="how phase 1 reads input: native (pyarrow, Parquet only), jvm "
                             "(Spark), or auto: native where it applies (default)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="shuffled", description=__doc__)
    parser.add_argument("--version", action="version", version=f"shuffled {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    _serve_parser(sub)
    _ingest_parser(sub)
    migrate = sub.add_parser(
        "migrate", help="convert locations written by shuffled 0.1 to packs (daemon stopped)",
        description="Convert storage locations from format 1 (a file per partial segment) "
                    "to format 2 (packs + catalog) in place. Run with the daemon stopped; "
                    "safe to run again after an interruption.")
    migrate.add_argument("--config", metavar="FILE", help="TOML settings file (its locations)")
    migrate.add_argument("--location", action="append", dest="locations", metavar="PATH",
                         help="location to convert; repeat for several (default: the "
                              "configured locations)")
    sub.add_parser("config-reference", help="print the configuration reference (Markdown)")
    return parser


def _cmd_serve(args: argparse.Namespace) -> int:
    from shuffled.server.runner import serve

    overrides: dict[str, Any] = {spec.name: getattr(args, spec.name) for spec in FIELDS}
    settings = load_settings(args.config, os.environ, overrides)
    logging.basicConfig(level=settings.log_level,
                        format="%(asctime)s %(levelname)s %(name)s %(message)s")

    def ready(url: str) -> None:
        print(f"shuffled listening on {url}", flush=True)

    asyncio.run(serve(settings, ready=ready))
    return EXIT_OK


def _cmd_migrate(args: argparse.Namespace) -> int:
    from pathlib import Path

    from shuffled.storage.migrate import migrate_location

    if args.locations:
        paths, fsync = [Path(p) for p in args.locations], True
    else:
        settings = load_settings(args.config, os.environ, {})
        paths, fsync = [loc.path for loc in settings.locations], settings.fsync
    for path in paths:
        if not path.is_dir():
            raise ConfigError(f"location {path} does not exist", setting="locations")
        done = migrate_location(path, fsync, progress=lambda line: print(line, flush=True))
        if done.already:
            print(f"{path}: already in the current format; nothing to do", flush=True)
    return EXIT_OK


# Spark's own logging for `shuffled ingest` without --verbose: errors only, no banner.
_QUIET_LOG4J = """rootLogger.level = fatal
rootLogger.appenderRef.stderr.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{HH:mm:ss} %p %c{1}: %m%n%ex{3}
"""


# What the JVM prints on stderr whatever its log configuration says: Spark's shell banner
# and the JDK's notice. Dropped from a quiet `shuffled ingest`'s terminal (kept with -v).
_BANNER = re.compile(rb"^(Setting default log level to |To adjust logging level use "
                     rb"sc\.setLogLevel|WARNING: Using incubator modules)")


class _QuietStderr:
    """While active, file descriptor 2 (ours and the Spark JVM's, which inherits it) goes
    through a thread that drops :data:`_BANNER` lines and passes everything else on."""

    def __enter__(self) -> _QuietStderr:
        sys.stderr.flush()
        self.saved = os.dup(2)
        read, write = os.pipe()
        os.dup2(write, 2)
        os.close(write)
        self.thread = threading.Thread(target=self._pump, args=(read,), daemon=True)
        self.thread.start()
        return self

    def _pump(self, read: int) -> None:
        with os.fdopen(read, "rb") as pipe:
            for line in pipe:  # ends when every writer (the JVM too) has closed it
                if not _BANNER.match(line):
                    os.write(self.saved, line)

    def __exit__(self, *exc: object) -> None:
        sys.stderr.flush()
        os.dup2(self.saved, 2)  # the JVM keeps the pipe: the pump lives while it does


class _Progress:
    """Progress lines: on a terminal, the running phase's "N/M tasks done, ..." (tasks,
    rows and bytes so far) is one live line (a text bar rewritten in place); elsewhere,
    and for every other message, plain lines."""

    def __init__(self, stream: Any) -> None:
        self.stream = stream
        self.live = bool(getattr(stream, "isatty", lambda: False)())
        self.pending = False

    def __call__(self, line: str) -> None:
        match = re.search(r"(\d+)/(\d+) tasks done(.*)$", line)
        if self.live and match:
            done, total = int(match.group(1)), int(match.group(2))
            filled = int(20 * done / total) if total else 0
            self.stream.write(f"\r\x1b[K{line[:match.start()]}[{'#' * filled}"
                              f"{'.' * (20 - filled)}] {done}/{total} tasks{match.group(3)}")
            self.pending = True
        else:
            if self.pending:
                self.stream.write("\n")
                self.pending = False
            self.stream.write(line + "\n")
        self.stream.flush()

    def close(self) -> None:
        if self.pending:
            self.stream.write("\n")
            self.pending = False


def _explain(exc: BaseException) -> str:
    """One paragraph for a failed ingestion: what failed, where, the report, what to try."""
    from shuffled.client import ShuffleUnavailable

    notes = [n for n in getattr(exc, "__notes__", []) if n.startswith("task report: ")]
    message = getattr(exc, "message", None) or _first_line(exc)
    if isinstance(exc, ShuffleUnavailable):
        hint = "check that the shuffle servers are up and reachable from every executor"
    elif getattr(exc, "code", "") == "invalid_spec":
        hint = "fix the spec field named above (docs: README, Druid specs)"
    elif isinstance(exc, FileNotFoundError):
        hint = "check ioConfig.inputSource (baseDir, filter) and that the files exist"
    elif "Py4J" in type(exc).__name__ or "Spark" in type(exc).__name__ or \
            type(exc).__module__.startswith("pyspark"):
        hint = "a Spark job failed; re-run with --verbose for Spark's logs and the traceback"
    else:
        hint = "re-run with --verbose for the traceback"
    text = f"shuffled ingest failed: {message}"
    if notes:
        text += f" The task report is at {notes[0][len('task report: '):]}."
    return f"{text} Try: {hint}."


def _first_line(exc: BaseException) -> str:
    """The gist of an exception whose text may hold a whole (Java or worker) traceback:
    its last 'Error:'/'Exception:' line, else its first line."""
    text = str(exc).strip() or type(exc).__name__
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    for ln in reversed(lines):
        if re.match(r"^[\w.$]+(Error|Exception|Failed)\b.*:", ln):
            return ln[:400]
    return f"{type(exc).__name__}: {lines[0][:400]}"


def _cmd_ingest(args: argparse.Namespace) -> int:
    from shuffled.api import ingest

    level = "INFO" if args.verbose else os.environ.get("SHUFFLED_LOG_LEVEL", "ERROR")
    logging.basicConfig(level=level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s %(message)s")
    if not args.verbose and "PYSPARK_SUBMIT_ARGS" not in os.environ:
        conf = os.path.join(tempfile.mkdtemp(prefix="shuffled-log4j-"), "log4j2.properties")
        with open(conf, "w", encoding="utf-8") as fh:
            fh.write(_QUIET_LOG4J)
        os.environ["PYSPARK_SUBMIT_ARGS"] = (
            f"--driver-java-options -Dlog4j2.configurationFile=file:{conf} pyspark-shell")
    token = None
    progress = _Progress(sys.stdout)
    try:
        if args.auth_token_file:
            with open(args.auth_token_file, encoding="utf-8") as fh:
                token = fh.read().strip()
        token = token or os.environ.get("SHUFFLED_AUTH_TOKEN") or None
        with open(args.spec, encoding="utf-8") as fh:
            spec = json.load(fh)
        with contextlib.nullcontext() if args.verbose else _QuietStderr():
            ingest(spec, master=args.master, shuffle_servers=args.shuffle_servers,
                   output_dir=args.output, token=token, ca_file=args.ca_file,
                   progress=progress, show_rows=args.show_rows, reader=args.phase1_reader)
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # every failure: one paragraph, exit 1
        progress.close()
        if args.verbose:
            traceback.print_exc()
        print(_explain(exc), file=sys.stderr)
        return EXIT_FAILED
    progress.close()
    return EXIT_OK


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.command == "serve":
            return _cmd_serve(args)
        if args.command == "ingest":
            return _cmd_ingest(args)
        if args.command == "migrate":
            return _cmd_migrate(args)
        if args.command == "config-reference":
            from shuffled.config import reference_markdown

            sys.stdout.write(reference_markdown())
            return EXIT_OK
    except ConfigError as err:
        print(f"shuffled: configuration error: {err.message}", file=sys.stderr)
        return EXIT_USAGE
    except ShuffleError as err:
        print(f"shuffled: {err.message}", file=sys.stderr)
        return EXIT_FAILED
    except (OSError, json.JSONDecodeError) as err:
        print(f"shuffled: {err}", file=sys.stderr)
        return EXIT_FAILED
    except KeyboardInterrupt:
        return 130
    return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())
