"""Compressed text input by file extension, as Druid reads it (``CompressionUtils.decompress``):
``.gz``, ``.bz2`` and ``.zst`` through pyarrow's streaming codecs, ``.xz`` through the
standard library's ``lzma`` (pyarrow has no xz codec). A compressed file cannot be read from
the middle, so it is one split: one task reads it whole, as Druid reads one file per split.

Extensions Druid decompresses and this reader does not (``.zip``, ``.sz``) are refused by
name before anything runs, rather than read as text.
"""

from __future__ import annotations

import lzma
from typing import BinaryIO, cast

import pyarrow as pa

#: Extension -> codec name (pyarrow's, or "xz").
CODECS = {".gz": "gzip", ".bz2": "bz2", ".zst": "zstd", ".xz": "xz"}
#: Extensions Druid decompresses that are not read here.
REFUSED = (".zip", ".sz")


def codec(path: str) -> str | None:
    """The codec ``path``'s extension names (None: plain)."""
    name = path.lower()
    for ext, kind in CODECS.items():
        if name.endswith(ext):
            return kind
    return None


def refused(path: str) -> str | None:
    """The extension of ``path`` when it is one Druid decompresses and this reader does not."""
    name = path.lower()
    return next((ext for ext in REFUSED if name.endswith(ext)), None)


def decompressing(raw: BinaryIO | pa.NativeFile, kind: str) -> BinaryIO:
    """A stream of the decompressed bytes of ``raw`` (closing it closes ``raw``)."""
    if kind == "xz":
        return cast(BinaryIO, lzma.open(raw, "rb"))
    return cast(BinaryIO, pa.CompressedInputStream(raw, kind))
