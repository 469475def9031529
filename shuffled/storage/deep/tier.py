"""The object-store side of deep storage: ``s3://bucket/prefix`` through pyarrow.fs.

Credentials, region and endpoint come from the standard AWS environment
(``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_REGION``, ``AWS_ENDPOINT_URL_S3``
or ``AWS_ENDPOINT_URL`` for any S3-compatible store), as the ingestion's input and output
do. Objects live under ``prefix/<supervisorTaskId>/<daemon instance>/``. Every method
blocks: the caller runs it on the tier's own threads, never on the event loop.
"""

from __future__ import annotations

import threading
import urllib.parse
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import pyarrow.fs as pafs

READ_CHUNK = 1 << 20


def _s3(environ: Mapping[str, str]) -> Any:
    options: dict[str, object] = {}
    endpoint = environ.get("AWS_ENDPOINT_URL_S3") or environ.get("AWS_ENDPOINT_URL")
    if endpoint:
        parts = urllib.parse.urlsplit(endpoint if "://" in endpoint else f"https://{endpoint}")
        options.update(endpoint_override=parts.netloc, scheme=parts.scheme or "https")
    region = environ.get("AWS_REGION") or environ.get("AWS_DEFAULT_REGION")
    if region:
        options["region"] = region
    return pafs.S3FileSystem(**options)


class Tier:
    """One bucket and prefix; names below it are ``<sup>/<instance>/<object>``."""

    def __init__(self, uri: str, environ: Mapping[str, str]) -> None:
        parts = urllib.parse.urlsplit(uri)
        self.uri = uri
        self.base = f"{parts.netloc}{parts.path}".rstrip("/")
        self._environ = dict(environ)
        self._fs: Any = None
        self._lock = threading.Lock()

    @property
    def fs(self) -> Any:
        with self._lock:  # made on first use (on a tier thread: it may resolve names)
            if self._fs is None:
                self._fs = _s3(self._environ)
            return self._fs

    def path(self, name: str) -> str:
        return f"{self.base}/{name}"

    def put(self, name: str, pieces: Iterable[bytes]) -> int:
        """Write the object ``name`` from ``pieces``; the bytes written. An exception from
        ``pieces`` still closes the upload: the object is left cut short, which the
        encryption refuses to read (its last chunk is missing) and a retry replaces."""
        sent = 0
        with self.fs.open_output_stream(self.path(name), metadata={}) as out:
            for piece in pieces:
                out.write(piece)
                sent += len(piece)
        return sent

    def get(self, name: str) -> Iterator[bytes]:
        """The object's bytes in pieces; FileNotFoundError if there is none."""
        with self.fs.open_input_stream(self.path(name)) as src:
            while piece := src.read(READ_CHUNK):
                yield piece

    def read(self, name: str) -> bytes:
        return b"".join(self.get(name))

    def exists(self, name: str) -> bool:
        return bool(self.fs.get_file_info(self.path(name)).type == pafs.FileType.File)

    def names(self, prefix: str) -> list[str]:
        """Every object under ``prefix`` (relative names)."""
        selector = pafs.FileSelector(self.path(prefix), allow_not_found=True, recursive=True)
        infos = self.fs.get_file_info(selector)
        return sorted(i.path[len(self.base) + 1:] for i in infos
                      if i.type == pafs.FileType.File)

    def tasks(self) -> list[str]:
        """The task prefixes in the tier (the ``<sup>`` of each ``PREFIX/<sup>/``)."""
        selector = pafs.FileSelector(self.base, allow_not_found=True, recursive=False)
        return sorted(i.base_name for i in self.fs.get_file_info(selector)
                      if i.type == pafs.FileType.Directory)

    def newest(self, prefix: str) -> float | None:
        """When the newest object under ``prefix`` was written (seconds since the epoch);
        None if there is none."""
        selector = pafs.FileSelector(self.path(prefix), allow_not_found=True, recursive=True)
        times = [i.mtime.timestamp() for i in self.fs.get_file_info(selector)
                 if i.type == pafs.FileType.File and i.mtime is not None]
        return max(times, default=None)

    def delete_prefix(self, prefix: str) -> None:
        """Remove every object under ``prefix`` (idempotent)."""
        try:
            self.fs.delete_dir(self.path(prefix))
        except FileNotFoundError:
            pass
