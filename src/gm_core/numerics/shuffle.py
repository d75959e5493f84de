"""Byte shuffle: group the i-th byte of every element together before compression.

Theory of operation
-------------------
Neighbouring fp32 values share sign and exponent bytes but not low mantissa
bytes. Interleaved, that redundancy is invisible to a byte-oriented compressor;
transposed into planes (all byte 0s, then all byte 1s, ...) the exponent planes
become long, repetitive runs that zstd shrinks well. The transform is a plain
transpose of an ``(n, itemsize)`` byte matrix and its inverse.
"""

from __future__ import annotations

import numpy as np

from gm_core.numerics.arrays import U8


def _check(src: U8, itemsize: int, out: U8) -> None:
    assert itemsize >= 1, "itemsize"
    assert src.shape[0] % itemsize == 0, "whole elements only"
    assert out.shape == src.shape, "same size"
    assert out.dtype == src.dtype == np.uint8, "bytes"


def shuffle(src: U8, itemsize: int, out: U8) -> None:
    """Write the byte planes of ``src`` (elements of ``itemsize`` bytes) into ``out``."""
    _check(src, itemsize, out)
    n = src.shape[0] // itemsize
    out.reshape(itemsize, n)[...] = src.reshape(n, itemsize).T


def unshuffle(src: U8, itemsize: int, out: U8) -> None:
    """Inverse of :func:`shuffle`."""
    _check(src, itemsize, out)
    n = src.shape[0] // itemsize
    out.reshape(n, itemsize)[...] = src.reshape(itemsize, n).T
