"""Tiny floating-point formats (E4M3, E2M1) and their power-of-two (E8M0) scales.

Theory of operation
-------------------
An OCP-style minifloat has a sign bit, ``e`` exponent bits with bias ``b`` and
``m`` mantissa bits, no infinities, and subnormals below ``2^(1−b)``. E4M3 (fp8,
"fn" flavour: only ``S.1111.111`` is NaN) tops out at 448; E2M1 (fp4) at 6.

Encoding rounds an fp32 value ``y`` (``|y| ≤ max``) to nearest, ties to even,
straight on the fp32 bit pattern: in the normal range, adding
``2^(22−m) − 1 + lsb`` to the bits and shifting right by ``23 − m`` rounds the
mantissa and carries into the exponent when needed; re-biasing the exponent
then yields the code. Subnormals are multiples of ``2^(1−b−m)``, so
``rint(y·2^(b−1+m))`` (``rint`` is ties-to-even) is their code, and the value
``2^(1−b)`` lands naturally on the first normal code. Decoding is a table.

A scale is a power of two ``2^k`` stored as an E8M0 byte ``k + 127``. We pick the
*smallest* ``k`` with ``amax ≤ max·2^k``, read exactly off the fp32 bits of
``amax`` (``amax = 1.f·2^E`` needs ``k = E − E_max + [1.f > 1.f_max]``). So
values are never clipped (unlike the OCP MX rule ``floor(log2 amax) − E_max``,
which trades clipping for resolution), multiplying by ``2^−k`` is exact, and
every backend picks the same ``k``.
"""

from __future__ import annotations

import attrs
import numpy as np
from numpy.typing import NDArray

from gm_core.numerics.arrays import F32, U8

SCALE_MIN_EXPONENT = -127
"""E8M0 byte 0 is ``2^−127``; 255 is NaN, and no finite fp32 needs more than ``2^126``."""
SCALE_MAX_EXPONENT = 127
SCALE_NAN_EXPONENT = 128
"""E8M0 byte 255, NaN: the scale of a block (fp4) or tensor (fp8) holding a NaN or ±Inf.
Every value it scales decodes as NaN, so a non-finite input stays non-finite on the wire
(rounding it to a code instead would make it a large finite number: nothing else in E2M1
can say NaN, and E4M3 has no Inf). No finite input ever gets it."""
SCALE_NAN_BYTE = SCALE_NAN_EXPONENT + 127


@attrs.frozen
class Minifloat:
    """A sign-magnitude float format with ``exponent_bits``, ``mantissa_bits`` and ``bias``."""

    name: str
    exponent_bits: int
    mantissa_bits: int
    bias: int
    max_value: float

    @property
    def code_bits(self) -> int:
        return 1 + self.exponent_bits + self.mantissa_bits

    @property
    def min_normal(self) -> float:
        return 2.0 ** (1 - self.bias)

    def table(self) -> F32:
        """Value of every code, sign bit included; codes never produced decode as NaN."""
        values = np.empty(1 << self.code_bits, dtype=np.float32)
        half = 1 << (self.exponent_bits + self.mantissa_bits)
        for code in range(half):
            exponent, mantissa = code >> self.mantissa_bits, code & ((1 << self.mantissa_bits) - 1)
            fraction = mantissa / (1 << self.mantissa_bits)
            if exponent == 0:
                value = fraction * 2.0 ** (1 - self.bias)
            else:
                value = (1.0 + fraction) * 2.0 ** (exponent - self.bias)
            values[code] = value if value <= self.max_value else np.nan
            values[code + half] = -values[code]
        return values


E4M3 = Minifloat(name="E4M3", exponent_bits=4, mantissa_bits=3, bias=7, max_value=448.0)
E2M1 = Minifloat(name="E2M1", exponent_bits=2, mantissa_bits=1, bias=1, max_value=6.0)


def encode(y: F32, fmt: Minifloat) -> U8:
    """Round each ``y`` (finite, ``|y| ≤ fmt.max_value``) to its code, ties to even."""
    bits = y.view(np.uint32)
    magnitude = bits & np.uint32(0x7FFF_FFFF)
    shift = 23 - fmt.mantissa_bits
    lsb = (magnitude >> np.uint32(shift)) & np.uint32(1)
    rounded = (magnitude + np.uint32((1 << (shift - 1)) - 1) + lsb) >> np.uint32(shift)
    normal = rounded.astype(np.int64) - ((127 - fmt.bias) << fmt.mantissa_bits)
    absolute = magnitude.view(np.float32)
    subnormal = np.rint(absolute * np.float32(2.0 ** (fmt.bias - 1 + fmt.mantissa_bits)))
    codes = np.where(absolute < np.float32(fmt.min_normal), subnormal.astype(np.int64), normal)
    sign = (bits >> np.uint32(31)).astype(np.int64) << (fmt.code_bits - 1)
    result: U8 = (codes | sign).astype(np.uint8)
    return result


def fp32_exponent_fraction(x: F32) -> tuple[NDArray[np.int64], NDArray[np.uint32]]:
    """Biased exponent field and 23-bit fraction field of non-negative fp32 values."""
    bits = x.view(np.uint32)
    return (bits >> np.uint32(23)).astype(np.int64), bits & np.uint32(0x7F_FFFF)


def scale_exponents(amax: F32, fmt: Minifloat) -> NDArray[np.int64]:
    """Smallest ``k`` (clamped to E8M0's range) with ``amax ≤ fmt.max_value · 2^k``."""
    top_exponent, top_fraction = fp32_exponent_fraction(np.array([fmt.max_value], np.float32))
    exponent, fraction = fp32_exponent_fraction(np.ascontiguousarray(amax, dtype=np.float32))
    k = exponent - top_exponent + (fraction > top_fraction[0])
    k = np.where(exponent == 0, SCALE_MIN_EXPONENT, k)  # zero or subnormal amax: smallest scale
    return np.clip(k, SCALE_MIN_EXPONENT, SCALE_MAX_EXPONENT)


def power_of_two(k: NDArray[np.int64]) -> F32:
    """``2^k`` as exact fp32, ``k`` in ``[−127, 127]`` (``2^−127`` is subnormal); NaN for
    :data:`SCALE_NAN_EXPONENT` (E8M0 byte 255)."""
    assert np.all((k >= SCALE_MIN_EXPONENT) & (k <= SCALE_NAN_EXPONENT))
    normal = (np.minimum(np.maximum(k, -126), 127) + 127).astype(np.uint32) << np.uint32(23)
    bits = np.where(k == -127, np.uint32(0x40_0000), normal).astype(np.uint32)
    bits = np.where(k == SCALE_NAN_EXPONENT, np.uint32(QUIET_NAN), bits).astype(np.uint32)
    return bits.view(np.float32)


QUIET_NAN = 0x7FC0_0000
"""The fp32 bits of the NaN a NaN scale decodes to."""


def scale_bytes(k: NDArray[np.int64]) -> U8:
    """E8M0 byte of each scale exponent."""
    return (k + 127).astype(np.uint8)


def byte_exponents(scales: U8) -> NDArray[np.int64]:
    """Inverse of :func:`scale_bytes`."""
    return scales.astype(np.int64) - 127
