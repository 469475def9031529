"""The tier's encryption (storage/deep/crypt.py) whatever the pieces it is fed: whole chunks
(the offload's zero-copy path), split and merged chunks, an exact multiple, nothing."""

from __future__ import annotations

import os

import pytest

from shuffled.storage.deep import crypt

KEY = crypt.task_key(os.urandom(32), "sup-1")
CHUNK = 16


def _sealed(pieces: list[bytes]) -> bytes:
    enc = crypt.Encryptor(KEY, "sup-1", "obj", chunk=CHUNK)
    out = [enc.header()]
    for piece in pieces:
        out += list(enc.feed(piece))
    out.append(enc.finish())
    return b"".join(out)


@pytest.mark.parametrize("sizes", [
    [], [0], [CHUNK], [CHUNK] * 4, [CHUNK, 5, CHUNK, CHUNK, 3], [7, 9, CHUNK, 1],
    [CHUNK * 3], [CHUNK - 1, 1, CHUNK], [CHUNK, CHUNK, 2 * CHUNK + 5, 0, CHUNK],
])
def test_any_feeding_decrypts_to_the_plaintext(sizes: list[int]) -> None:
    data = os.urandom(sum(sizes))
    pieces, at = [], 0
    for n in sizes:
        pieces.append(data[at:at + n])
        at += n
    sealed = _sealed(pieces)
    assert b"".join(crypt.decrypt_stream(KEY, "sup-1", "obj", [sealed])) == data
    # The same plaintext fed whole seals to as many chunks (the last marked once).
    assert len(sealed) == len(_sealed([data]))


def test_a_sealed_object_cut_at_a_chunk_does_not_decrypt() -> None:
    sealed = _sealed([os.urandom(CHUNK)] * 3)
    header = len(crypt.MAGIC) + 8 + 4
    cut = sealed[:header + 2 * (CHUNK + 16)]  # the last chunk dropped
    with pytest.raises(crypt.Undecryptable):
        b"".join(crypt.decrypt_stream(KEY, "sup-1", "obj", [cut]))
