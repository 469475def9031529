"""Encryption of what goes to the tier: AES-256-GCM, one key per supervisor task.

The task's key is derived with HKDF-SHA256 from the daemons' secret
(``deep_storage_key_file``) and the supervisorTaskId, so any daemon holding the secret can
read any task's objects and nothing else has to be stored. An object is cut into chunks of
:data:`CHUNK` bytes, each sealed on its own (a 1 GiB pack is never held whole in memory):

``MAGIC (8) | nonce prefix (8, random per object) | chunk size (4, big-endian)``, then per
chunk ``ciphertext | tag (16)``. Chunk ``i``'s nonce is the prefix and ``i`` (4 bytes); its
associated data is the supervisorTaskId, the object's name, ``i`` and whether it is the last
chunk, so a chunk moved to another object or position, an object renamed to another task or
cut short (no last chunk) fails to decrypt (the STREAM construction of Hoang, Reyhanitabar,
Rogaway and Vizar, as Tink's streaming AEAD does it).
"""

from __future__ import annotations

import os
import struct
from collections.abc import Iterable, Iterator

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

MAGIC = b"SHFDEEP1"
CHUNK = 1 << 20
TAG = 16
HEADER = len(MAGIC) + 8 + 4
_INFO = b"shuffled deep storage v1\0"


class Undecryptable(ValueError):
    """An object that is not what this key wrote under this name (tampered, truncated, or
    another key)."""


def task_key(secret: bytes, supervisor_task_id: str) -> bytes:
    """The 256-bit key of one supervisor task's objects."""
    return HKDF(algorithm=hashes.SHA256(), length=32, salt=None,
                info=_INFO + supervisor_task_id.encode()).derive(secret)


def _aad(sup: str, name: str, index: int, last: bool) -> bytes:
    return b"%s\0%s\0%d\0%d" % (sup.encode(), name.encode(), index, last)


def _nonce(prefix: bytes, index: int) -> bytes:
    if index >= 1 << 32:
        raise ValueError("object too large for one nonce prefix")
    return prefix + struct.pack(">I", index)


class Encryptor:
    """Seals the plaintext of one object, fed in pieces of any size; the output is the
    object's bytes in order (:meth:`header`, then what :meth:`feed` and :meth:`finish`
    return)."""

    def __init__(self, key: bytes, sup: str, name: str, chunk: int = CHUNK) -> None:
        self._aead = AESGCM(key)
        self._sup, self._name, self._chunk = sup, name, chunk
        self._prefix = os.urandom(8)
        self._pending = bytearray()
        self._held: bytes | None = None  # a whole chunk kept back, not copied
        self._index = 0

    def header(self) -> bytes:
        return MAGIC + self._prefix + struct.pack(">I", self._chunk)

    def _seal(self, data: bytes, last: bool) -> bytes:
        out = self._aead.encrypt(_nonce(self._prefix, self._index), data,
                                 _aad(self._sup, self._name, self._index, last))
        self._index += 1
        return out

    def feed(self, data: bytes | memoryview) -> Iterator[bytes]:
        """Sealed chunks completed by ``data`` (a full chunk is kept back until more comes
        or :meth:`finish`: the last chunk is marked as such).

        Fed whole chunks (the offload reads packs chunk by chunk), nothing is copied: a
        megabyte copied in Python holds the GIL the data plane's event loop needs, while
        the encryption and the CRC release it."""
        if not self._pending and len(data) == self._chunk:
            if self._held is not None:
                yield self._seal(self._held, False)
            self._held = data if isinstance(data, bytes) else bytes(data)
            return
        if self._held is not None:
            self._pending += self._held
            self._held = None
        self._pending += data
        while len(self._pending) > self._chunk:
            piece = bytes(self._pending[:self._chunk])
            del self._pending[:self._chunk]
            yield self._seal(piece, False)

    def finish(self) -> bytes:
        """The last chunk (possibly of no plaintext)."""
        if self._held is not None:
            piece, self._held = self._held, None
        else:
            piece = bytes(self._pending)
            self._pending.clear()
        return self._seal(piece, True)


def encrypt(key: bytes, sup: str, name: str, data: bytes) -> bytes:
    """One small object (a manifest) whole."""
    enc = Encryptor(key, sup, name)
    return enc.header() + b"".join(enc.feed(data)) + enc.finish()


def decrypt_stream(key: bytes, sup: str, name: str, read: Iterable[bytes]) -> Iterator[bytes]:
    """The plaintext of an object given as pieces of its bytes, chunk by chunk; raises
    :class:`Undecryptable` at the first chunk that does not authenticate, or at the end if
    the last chunk never came."""
    aead = AESGCM(key)
    buf = bytearray()
    pieces = iter(read)
    ended = False

    def fill(n: int) -> bool:
        nonlocal ended
        while len(buf) < n and not ended:
            try:
                buf.extend(next(pieces))
            except StopIteration:
                ended = True
        return len(buf) >= n

    if not fill(HEADER) or bytes(buf[:len(MAGIC)]) != MAGIC:
        raise Undecryptable(f"{name}: not an object of shuffled's deep storage")
    prefix = bytes(buf[len(MAGIC):len(MAGIC) + 8])
    (chunk,) = struct.unpack(">I", buf[len(MAGIC) + 8:HEADER])
    del buf[:HEADER]
    sealed = chunk + TAG
    index = 0
    while True:
        full = fill(sealed + 1)  # one byte more: whether this chunk is the last one
        piece = bytes(buf[:sealed]) if full else bytes(buf)
        del buf[:len(piece)]
        last = not full
        try:
            yield aead.decrypt(_nonce(prefix, index), piece, _aad(sup, name, index, last))
        except InvalidTag:
            raise Undecryptable(f"{name}: chunk {index} does not authenticate (tampered, "
                                f"cut short, or another key)") from None
        if last:
            return
        index += 1


def decrypt(key: bytes, sup: str, name: str, data: bytes) -> bytes:
    return b"".join(decrypt_stream(key, sup, name, [data]))
