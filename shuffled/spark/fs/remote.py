"""Object-store access for input and output: ``s3://bucket/key`` through pyarrow.fs's
S3FileSystem (credentials, region and endpoint from the standard AWS environment variables
and config files, so any S3-compatible store works: ``AWS_ACCESS_KEY_ID``,
``AWS_SECRET_ACCESS_KEY``, ``AWS_REGION``, ``AWS_ENDPOINT_URL_S3`` or ``AWS_ENDPOINT_URL``),
and ``http(s)://`` read with the standard library's HTTP client. Local paths pass through.
"""

from __future__ import annotations

import fnmatch
import io
import os
import urllib.parse
import urllib.request
from collections.abc import Iterator
from typing import BinaryIO
from functools import lru_cache

import pyarrow as pa
import pyarrow.fs as pafs

from shuffled.spark.fs import compressed

REMOTE_SCHEMES = ("s3", "http", "https")
HTTP_TIMEOUT = 60.0


def scheme(uri: str) -> str:
    return urllib.parse.urlsplit(uri).scheme.lower() if "://" in uri else ""


def is_remote(uri: str) -> bool:
    return scheme(uri) in REMOTE_SCHEMES


@lru_cache(maxsize=4)
def _s3(endpoint: str | None, region: str | None) -> pafs.S3FileSystem:
    options: dict[str, object] = {}
    if endpoint:
        parts = urllib.parse.urlsplit(endpoint if "://" in endpoint else f"https://{endpoint}")
        options.update(endpoint_override=parts.netloc, scheme=parts.scheme or "https")
    if region:
        options["region"] = region
    return pafs.S3FileSystem(**options)


def s3() -> pafs.S3FileSystem:
    """The S3 file system the environment describes (cached per endpoint and region)."""
    env = os.environ
    return _s3(env.get("AWS_ENDPOINT_URL_S3") or env.get("AWS_ENDPOINT_URL"),
               env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION"))


def s3_path(uri: str) -> str:
    """``s3://bucket/key`` -> ``bucket/key`` (pyarrow.fs's form)."""
    parts = urllib.parse.urlsplit(uri)
    return f"{parts.netloc}{parts.path}".rstrip("/") if parts.path != "/" else parts.netloc


def list_s3(prefix: str, pattern: str | None = None) -> list[str]:
    """Every object under the ``s3://bucket/prefix`` whose name matches ``pattern``."""
    base = s3_path(prefix)
    infos = s3().get_file_info(pafs.FileSelector(base, recursive=True, allow_not_found=True))
    out = [f"s3://{i.path}" for i in infos if i.type == pafs.FileType.File
           and fnmatch.fnmatchcase(i.base_name, pattern or "*")]
    return sorted(out)


def exists(uri: str) -> bool:
    if scheme(uri) == "s3":
        return s3().get_file_info(s3_path(uri)).type == pafs.FileType.File
    return os.path.isfile(uri)


def open_random(uri: str) -> pa.NativeFile:
    """A seekable file (Parquet needs one): S3 reads ranges; HTTP is fetched whole."""
    if scheme(uri) == "s3":
        return s3().open_input_file(s3_path(uri))
    if scheme(uri) in ("http", "https"):
        with urllib.request.urlopen(uri, timeout=HTTP_TIMEOUT) as resp:
            return pa.BufferReader(resp.read())
    return pa.OSFile(uri, "rb")


def size(uri: str) -> int:
    if scheme(uri) == "s3":
        return int(s3().get_file_info(s3_path(uri)).size or 0)
    if scheme(uri) in ("http", "https"):
        request = urllib.request.Request(uri, method="HEAD")
        with urllib.request.urlopen(request, timeout=HTTP_TIMEOUT) as resp:
            return int(resp.headers.get("Content-Length") or 0)
    return os.path.getsize(uri)


def open_stream(uri: str) -> BinaryIO:
    """The bytes of ``uri`` as a stream, decompressed when its extension names a codec
    (:mod:`.compressed`, as Druid decompresses input by extension)."""
    if scheme(uri) == "s3":
        raw: BinaryIO = s3().open_input_stream(s3_path(uri))
    elif scheme(uri) in ("http", "https"):
        raw = urllib.request.urlopen(uri, timeout=HTTP_TIMEOUT)  # noqa: S310 (http(s) only)
    else:
        raw = open(uri, "rb")  # noqa: SIM115 (the caller closes it)
    kind = compressed.codec(uri)
    return raw if kind is None else compressed.decompressing(raw, kind)


def read_lines(uri: str) -> Iterator[str]:
    """The text lines of ``uri`` (UTF-8, bad bytes replaced, decompressed), streamed."""
    with open_stream(uri) as raw, io.TextIOWrapper(raw, encoding="utf-8", errors="replace") as text:
        for line in text:
            yield line.rstrip("\r\n")


def text_bytes(uri: str) -> int:
    """Bytes of the text of ``uri``: its size, or for a compressed file the bytes it
    decompresses to (read through once), what Druid counts as processedBytes."""
    if compressed.codec(uri) is None:
        return size(uri)
    total = 0
    with open_stream(uri) as raw:
        while chunk := raw.read(8 << 20):
            total += len(chunk)
    return total


def write_bytes(uri: str, data: bytes) -> None:
    """One object (S3: a single PUT, atomic for readers) or a local file."""
    if scheme(uri) != "s3":
        raise ValueError(f"not an s3:// URI: {uri}")
    with s3().open_output_stream(s3_path(uri)) as out:
        out.write(data)


def upload(local_path: str, uri: str) -> None:
    pafs.copy_files(local_path, s3_path(uri), source_filesystem=pafs.LocalFileSystem(),
                    destination_filesystem=s3())


def read_bytes(uri: str) -> bytes | None:
    """An object's bytes, or None if there is none."""
    try:
        with s3().open_input_stream(s3_path(uri)) as src:
            return src.read()
    except FileNotFoundError:
        return None


def delete(uri: str) -> None:
    try:
        s3().delete_file(s3_path(uri))
    except FileNotFoundError:
        pass
