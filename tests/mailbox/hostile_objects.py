"""Bytes meant to cost a reader memory: zstd bombs, safetensors headers that lie or nest.

Shared by the bounded-read tests (one reader, every object) and the hostile-bucket suite
(a live run). Each function builds its object in bounded memory itself.
"""

from __future__ import annotations

import json

import zstandard

MiB = 1 << 20


def zeros_frame(size: int, *, declare: bool, prefix: bytes = b"") -> bytes:
    """A zstd frame of ``prefix`` then ``size`` zero bytes, the zeros made in 1 MiB pieces
    (~32 KB per GiB)."""
    cobj = zstandard.ZstdCompressor(level=1, write_content_size=declare).compressobj(
        size=len(prefix) + size if declare else -1
    )
    piece = bytes(MiB)
    head = cobj.compress(prefix)
    return b"".join([head] + [cobj.compress(piece) for _ in range(size // MiB)] + [cobj.flush()])


def declaring_frame(size: int) -> bytes:
    """A frame of a few dozen bytes whose header declares ``size`` bytes of content.

    A one-segment frame of 128 KiB of zeros, its 4-byte content size field rewritten: a
    decoder that trusts the header allocates ``size`` bytes (and its window) up front.
    """
    frame = bytearray(zstandard.ZstdCompressor(level=1).compress(bytes(128 << 10)))
    descriptor = frame[4]
    assert descriptor >> 6 == 2, "expected a 4-byte content size field"
    assert descriptor & 0x20, "expected a one-segment frame"
    frame[5:9] = size.to_bytes(4, "little")
    return bytes(frame)


def safetensors(header: bytes, data: bytes = b"") -> bytes:
    """A safetensors file: the 8-byte header length, the header padded to 8 bytes, the data."""
    header += b" " * (-(8 + len(header)) % 8)
    return len(header).to_bytes(8, "little") + header + data


def sealed(data: bytes) -> bytes:
    """``data`` as one zstd frame (what a compressed run's reader unseals first)."""
    return zstandard.ZstdCompressor().compress(data)


def nested_header(depth: int = 30_000) -> bytes:
    """A safetensors file whose header is an array nested ``depth`` deep."""
    return safetensors(b"[" * depth + b"]" * depth)


def declared_tensor(name: str, nbytes: int) -> bytes:
    """A safetensors file of a few hundred bytes whose header declares an F32 tensor of
    ``nbytes`` (its data offsets end there): a reader that trusts it allocates that much."""
    fields = {"dtype": "F32", "shape": [nbytes // 4], "data_offsets": [0, nbytes]}
    return safetensors(json.dumps({name: fields}).encode(), bytes(8))
