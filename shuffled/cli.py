"""Command line: the only place touching argv, environ and exit codes."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
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
    parser.add_argument("--output", default="segments", help="output directory (default ./segments)")
    parser.add_argument("--auth-token-file", help="bearer token for the shuffle servers")
    parser.add_argument("--ca-file", help="CA bundle to verify https shuffle servers")
    parser.add_argument("--show-rows", type=int, default=0, metavar="N",
                        help="print up to N rows of the resulting segments")
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


def _cmd_ingest(args: argparse.Namespace) -> int:
    from shuffled.api import ingest

    logging.basicConfig(level=os.environ.get("SHUFFLED_LOG_LEVEL", "WARNING").upper(),
                        format="%(asctime)s %(levelname)s %(name)s %(message)s")
    token = None
    if args.auth_token_file:
        with open(args.auth_token_file, encoding="utf-8") as fh:
            token = fh.read().strip()
    token = token or os.environ.get("SHUFFLED_AUTH_TOKEN") or None
    with open(args.spec, encoding="utf-8") as fh:
        spec = json.load(fh)
    ingest(spec, master=args.master, shuffle_servers=args.shuffle_servers,
           output_dir=args.output, token=token, ca_file=args.ca_file,
           progress=lambda line: print(line, flush=True), show_rows=args.show_rows,
           reader=args.phase1_reader)
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
