"""Command line: the only place touching argv, environ and exit codes (its commands'
bodies are in :mod:`.serve` and :mod:`.ingest`)."""

from __future__ import annotations

import argparse
import json
import re
import sys
import urllib.parse
from collections.abc import Sequence

from shuffled import __version__
from shuffled.cli.ingest import cmd_ingest, spark_conf, stall_timeout
from shuffled.cli import tasks as cli_tasks
from shuffled.cli.serve import cmd_migrate, cmd_serve
from shuffled.config import FIELDS, Settings
from shuffled.errors import ConfigError, ShuffleError
from shuffled.tokens import Scope, mint, read_secrets

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2

# What `shuffled --help` says the program is (the module docstring is for contributors).
DESCRIPTION = """\
shuffled: a shuffle data server for Druid-style two-phase batch ingestion on Spark.

  shuffled serve --location DIR ...    run the shuffle daemon
  shuffled ingest SPEC.json            run a Druid index_parallel spec on Spark
                                       (an embedded daemon unless --shuffle-server)
  shuffled tasks ls --shuffle-server URL   what a daemon holds (show ID, rm ID...)

Exit codes: 0 done; 1 the command failed (one paragraph on stderr says what and what
to try); 2 a setting or argument is wrong (the message names it).
Docs: README.md and docs/ (docs/design.md, docs/ops.md, docs/configuration.md)."""


def daemon_url(text: str) -> str:
    """A ``--shuffle-server`` value: an http(s) base URL, else a usage error (exit 2)."""
    parsed = urllib.parse.urlsplit(text.strip())
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a daemon URL: give http://HOST:PORT (or https://)")
    try:
        parsed.port  # noqa: B018 - raises for a port that is not a number
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} has a port that is not a number") from None
    return text.strip()


_MASTER = re.compile(r"local(\[(\*|\d+)(,\d+)?\])?|local-cluster\[[\d, ]+\]|yarn|"
                     r"(spark|k8s|mesos)://\S+")


def spark_master(text: str) -> str:
    """A ``--master`` value Spark can parse, else a usage error (exit 2) naming the forms,
    before a JVM starts (Spark's own refusal is a JVM stack trace)."""
    if not _MASTER.fullmatch(text.strip()):
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a Spark master URL: give local[*], local[N], spark://HOST:PORT, "
            "yarn or k8s://https://HOST:PORT")
    return text.strip()


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
    parser = sub.add_parser(
        "ingest", help="run a Druid index_parallel spec on Spark",
        description="Two-phase perfect-rollup ingestion through shuffled. Prints where the "
                    "segments, manifest and task report went; a failure is one paragraph "
                    "on stderr and exit code 1.")
    parser.add_argument("spec", help="Druid native batch spec (JSON, type index_parallel)")
    parser.add_argument("--master", type=spark_master,
                        help="Spark master URL: local[*] (the default), spark://HOST:PORT, "
                             "yarn or k8s://... (docs/cluster.md)")
    parser.add_argument("--validate", action="store_true",
                        help="check the spec, the input files, the output and the shuffle "
                             "servers, print the plan, and run nothing")
    parser.add_argument("--shuffle-server", action="append", dest="shuffle_servers",
                        metavar="URL", type=daemon_url,
                        help="shuffled daemon URL; repeat for several (default: an embedded one)")
    parser.add_argument("--output", default="segments",
                        help="output directory, s3://bucket/prefix, or an Apache Iceberg table "
                        "iceberg://CATALOG/NAMESPACE.TABLE (docs/iceberg.md; default ./segments)")
    parser.add_argument("--auth-token-file", help="bearer token for the shuffle servers")
    parser.add_argument("--signing-secret-file", metavar="PATH",
                        help="the shuffle servers' signing_secret_file: this driver mints "
                             "per-task tokens with it and executors get only those "
                             "(docs/security.md)")
    parser.add_argument("--ca-file", help="CA bundle to verify https shuffle servers")
    parser.add_argument("--show-rows", type=int, default=0, metavar="N",
                        help="print up to N rows of the resulting segments")
    parser.add_argument("--verbose", action="store_true",
                        help="on failure print the traceback, and let Spark log at WARN")
    parser.add_argument("--phase1-reader", choices=("auto", "native", "jvm"), default="auto",
                        help="how phase 1 reads input: native (pyarrow: Parquet, JSON and "
                             "CSV), jvm (Spark's readers), or auto: native where it applies "
                             "(default)")
    parser.add_argument("--stall-timeout", type=stall_timeout, default=None, metavar="DURATION",
                        help="fail the ingestion when a Spark job makes no progress (no task "
                             "done, nothing read or written) for this long: seconds, 5m, "
                             "PT5M (default 300 s)")
    parser.add_argument("--conf", action="append", type=spark_conf, metavar="KEY=VALUE",
                        help="a Spark setting, as spark-submit takes it (e.g. "
                             "spark.executorEnv.AWS_REGION=eu-west-1); repeat for several")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="shuffled", description=DESCRIPTION,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"shuffled {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    _serve_parser(sub)
    _ingest_parser(sub)
    migrate = sub.add_parser(
        "migrate", help="convert locations of an older storage format to the current one "
                        "(daemon stopped)",
        description="Convert storage locations of format 1 (a file per partial segment) or "
                    "2 (packs of whole streams) to format 3 (packs with the schema once) in "
                    "place. Run with the daemon stopped; safe to run again after an "
                    "interruption.")
    migrate.add_argument("--config", metavar="FILE", help="TOML settings file (its locations)")
    migrate.add_argument("--location", action="append", dest="locations", metavar="PATH",
                         help="location to convert; repeat for several (default: the "
                              "configured locations)")
    cli_tasks.add_parser(sub, daemon_url)
    sub.add_parser("config-reference", help="print the configuration reference (Markdown)")
    token = sub.add_parser(
        "token", help="mint a per-task token with the signing secret (docs/security.md)",
        description="Print a token for one supervisor task and one right (read, write, "
                    "admin), or an operator token for every task (--task '*'), signed "
                    "with the first secret of the daemons' signing_secret_file.")
    token.add_argument("--signing-secret-file", required=True, metavar="PATH")
    token.add_argument("--task", required=True, metavar="SUPERVISOR_TASK_ID",
                       help="the task the token opens ('*' with --scope operator)")
    token.add_argument("--scope", required=True, choices=[s.value for s in Scope])
    token.add_argument("--ttl", type=float, default=3600.0, metavar="SECONDS",
                       help="lifetime (default 3600)")
    return parser


def cmd_token(args: argparse.Namespace) -> int:
    """Print a minted token (``shuffled token``)."""
    try:
        with open(args.signing_secret_file, encoding="utf-8") as fh:
            secrets = read_secrets(fh.read())
    except (OSError, UnicodeDecodeError) as exc:
        print(f"shuffled: --signing-secret-file {args.signing_secret_file} cannot be read: "
              f"{getattr(exc, 'strerror', None) or exc}", file=sys.stderr)
        return EXIT_USAGE
    if not secrets:
        print(f"shuffled: --signing-secret-file {args.signing_secret_file} has no secret",
              file=sys.stderr)
        return EXIT_USAGE
    try:
        print(mint(secrets[0], args.task, Scope(args.scope), args.ttl))
    except ValueError as exc:
        print(f"shuffled: {exc}", file=sys.stderr)
        return EXIT_USAGE
    return EXIT_OK


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``shuffled`` command line on ``argv``; returns the exit code (see DESCRIPTION)."""
    args = build_parser().parse_args(argv)
    try:
        if args.command == "serve":
            return cmd_serve(args)
        if args.command == "ingest":
            return cmd_ingest(args)
        if args.command == "migrate":
            return cmd_migrate(args)
        if args.command == "token":
            return cmd_token(args)
        if args.command == "tasks":
            try:
                cli_tasks.run(args, sys.stdout)
            except ValueError as exc:
                print(f"shuffled: {exc}", file=sys.stderr)
                return EXIT_USAGE
            return EXIT_OK
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
