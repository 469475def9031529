"""`shuffled serve` and `shuffled migrate`: settings in, daemon (or conversion) run."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
from pathlib import Path
from typing import Any

from shuffled.config import FIELDS, load_settings
from shuffled.errors import ConfigError

EXIT_OK = 0


def cmd_serve(args: argparse.Namespace) -> int:
    """Run the daemon until SIGTERM/SIGINT; a bad setting raises ConfigError (exit 2)."""
    from shuffled.server.runner import serve, tune_malloc

    tune_malloc()

    overrides: dict[str, Any] = {spec.name: getattr(args, spec.name) for spec in FIELDS}
    settings = load_settings(args.config, os.environ, overrides)
    logging.basicConfig(level=settings.log_level,
                        format="%(asctime)s %(levelname)s %(name)s %(message)s")
    # The scheduler's "Adding job"/"Scheduler started" lines say nothing an operator needs;
    # its warnings (a sweep missed or overlapping) still show, and --log-level DEBUG all.
    if settings.log_level != "DEBUG":
        logging.getLogger("apscheduler").setLevel(logging.WARNING)

    def ready(url: str) -> None:
        print(f"shuffled listening on {url}", flush=True)

    asyncio.run(serve(settings, ready=ready))
    return EXIT_OK


def cmd_migrate(args: argparse.Namespace) -> int:
    """Convert format-1 locations to packs in place (the daemon stopped)."""
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
