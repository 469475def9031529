"""`shuffled serve` and `shuffled migrate`: settings in, daemon (or conversion) run."""

from __future__ import annotations

import argparse
import asyncio
import ipaddress
import logging
import os
import sys
from pathlib import Path
from typing import Any

from shuffled.config import FIELDS, Settings, load_settings
from shuffled.errors import ConfigError

EXIT_OK = 0


def cmd_serve(args: argparse.Namespace) -> int:
    """Run the daemon until SIGTERM/SIGINT; a bad setting raises ConfigError (exit 2)."""
    # Arrow's allocations go to glibc's heap (tune_malloc below sets it), not to its own
    # mimalloc pool, unless the operator's environment names a pool. The daemon's Arrow
    # work is small (a partial's messages validated, a slab's index and edge batches) and
    # runs on any of 16 I/O threads; mimalloc keeps pages per thread, which in the soak (32
    # writers, 32 readers) was ~5 MiB more peak anonymous memory than the shared heap, for
    # the same throughput. Set before shuffled.server is imported: it loads pyarrow, which
    # picks its pool then, once (pa.set_memory_pool later would miss Arrow's C++ reads).
    os.environ.setdefault("ARROW_DEFAULT_MEMORY_POOL", "system")
    from shuffled.server.heap import tune_malloc
    from shuffled.server.runner import serve

    tune_malloc()

    overrides: dict[str, Any] = {spec.name: getattr(args, spec.name) for spec in FIELDS}
    settings = load_settings(args.config, os.environ, overrides)
    logging.basicConfig(level=settings.log_level,
                        format="%(asctime)s %(levelname)s %(name)s %(message)s")
    # The scheduler's "Adding job"/"Scheduler started" lines say nothing an operator needs;
    # its warnings (a sweep missed or overlapping) still show, and --log-level DEBUG all.
    if settings.log_level != "DEBUG":
        logging.getLogger("apscheduler").setLevel(logging.WARNING)

    if open_without_token(settings):
        print(f"shuffled: warning: listening on {settings.host} with no token: anyone who "
              "reaches this port can read, overwrite and delete every task's data; set "
              "--auth-token-file or --signing-secret-file (docs/security.md)",
              file=sys.stderr, flush=True)

    def ready(url: str) -> None:
        print(f"shuffled listening on {url}", flush=True)

    asyncio.run(serve(settings, ready=ready))
    return EXIT_OK


def open_without_token(settings: Settings) -> bool:
    """Whether the daemon would listen beyond this machine with no token at all."""
    if settings.auth_token or settings.signing_secrets:
        return False
    try:
        return not ipaddress.ip_address(settings.host).is_loopback
    except ValueError:  # a name: loopback only if it is localhost
        return settings.host.lower() not in ("localhost", "localhost.localdomain")


def cmd_migrate(args: argparse.Namespace) -> int:
    """Convert format-1 locations to packs in place (the daemon stopped)."""
    from shuffled.storage.lifecycle.migrate import migrate_location

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
