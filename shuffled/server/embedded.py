"""A daemon on a background thread, for `shuffled ingest` with no shuffle server and tests."""

from __future__ import annotations

import asyncio
import threading
from dataclasses import replace
from pathlib import Path
from types import TracebackType
from typing import Any

from prometheus_client import CollectorRegistry

from shuffled.config import LocationSettings, Settings, load_settings
from shuffled.server.runner import serve


class EmbeddedDaemon:
    """``with EmbeddedDaemon([dir]) as url:`` runs a daemon on 127.0.0.1 on a free port."""

    def __init__(self, locations: list[str | Path] | None = None, *,
                 settings: Settings | None = None, start_timeout: float = 30.0,
                 **overrides: Any) -> None:
        if settings is None:
            # Secrets are given as bytes here (the file form is for the CLI).
            secrets: tuple[bytes, ...] = tuple(overrides.pop("signing_secrets", ()) or ())
            base = {"host": "127.0.0.1", "port": 0, "access_log": False,
                    "locations": [str(p) for p in locations or []]}
            base.update(overrides)
            settings = load_settings(environ={}, overrides=base)
            if secrets:  # else keep what signing_secret_file gave (replacing it opened
                settings = replace(settings, signing_secrets=secrets)  # the daemon)
        elif locations:
            settings = replace(settings, locations=tuple(LocationSettings(Path(p))
                                                         for p in locations))
        self.settings = settings
        self.registry = CollectorRegistry()
        self.url = ""
        self._timeout = start_timeout
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._main, name="shuffled-embedded", daemon=True)

    def _main(self) -> None:
        async def run() -> None:
            self._loop = asyncio.get_running_loop()
            self._stop = asyncio.Event()

            def ready(url: str) -> None:
                self.url = url
                self._ready.set()

            await serve(self.settings, registry=self.registry, ready=ready, stop=self._stop)

        try:
            asyncio.run(run())
        except BaseException as exc:  # reported to the starting thread
            self._error = exc
        finally:
            self._ready.set()

    def start(self) -> str:
        self._thread.start()
        if not self._ready.wait(self._timeout):
            raise TimeoutError(f"embedded daemon did not start in {self._timeout} s")
        if self._error is not None:
            raise self._error
        return self.url

    def stop(self, timeout: float = 30.0) -> None:
        if self._loop is not None and self._stop is not None and self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(timeout)

    def __enter__(self) -> str:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()
