"""The reference's bit-level minifloat arithmetic, for any array library.

Theory of operation
-------------------
E2M1 rounding, power-of-two scales and their exponents are computed on fp32 bit
patterns (see :mod:`gm_core.numerics.minifloat` for why and how). Torch and MLX
both have the integer operators needed, in int32 (every finite fp32 magnitude plus
the rounding constant stays below ``2^31``), but spell bit casts, ``where`` and
ties-to-even rounding differently. :class:`BitOps` names those four spellings, so
the formulas exist once here and each backend only supplies its dialect.
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np

from gm_core.numerics import minifloat

Array = Any
"""An array of the backend's library: torch.Tensor or mlx.core.array."""


class BitOps(Protocol):
    def as_int32(self, x: Array) -> Array:
        """Reinterpret fp32 bits as int32 (no conversion)."""
        ...

    def as_float32(self, x: Array) -> Array:
        """Reinterpret int32 bits as fp32 (no conversion)."""
        ...

    def where(self, condition: Array, a: Array, b: Array) -> Array: ...

    def round_even_int32(self, x: Array) -> Array:
        """Round fp32 in ``[0, 2^22)`` to the nearest integer, ties to even, as int32."""
        ...

    def int_to_float32(self, x: Array) -> Array:
        """Convert int32 values to fp32 values."""
        ...


def power_of_two(k: Array, ops: BitOps) -> Array:
    """Exact fp32 ``2^k`` for int32 ``k`` in ``[−127, 127]`` (``2^−127`` is subnormal); NaN
    for ``minifloat.SCALE_NAN_EXPONENT`` (E8M0 byte 255, see there)."""
    normal = (ops.where(k < -126, -126, k) + 127) << 23
    special = ops.where(k == minifloat.SCALE_NAN_EXPONENT, minifloat.QUIET_NAN, normal)
    return ops.as_float32(ops.where(k == -127, 0x40_0000, special))


def scale_bytes(k: Array, amax: Array, ops: BitOps) -> Array:
    """E8M0 bytes (int32) of scale exponents ``k`` chosen for ``amax``: NaN (255) where
    ``amax`` is NaN or Inf (``minifloat.SCALE_NAN_EXPONENT``)."""
    exponent = (ops.as_int32(amax) >> 23) & 0xFF
    return ops.where(exponent == 0xFF, minifloat.SCALE_NAN_BYTE, k + 127)


def scale_exponents(amax: Array, fmt: minifloat.Minifloat, ops: BitOps) -> Array:
    """Smallest ``k`` in E8M0's range with ``amax ≤ fmt.max_value · 2^k`` (int32)."""
    top = int(np.array([fmt.max_value], np.float32).view(np.uint32)[0])
    bits = ops.as_int32(amax)
    exponent, fraction = bits >> 23, bits & 0x7F_FFFF
    k = exponent - (top >> 23) + ops.where(fraction > (top & 0x7F_FFFF), 1, 0)
    k = ops.where(exponent == 0, minifloat.SCALE_MIN_EXPONENT, k)
    k = ops.where(k < minifloat.SCALE_MIN_EXPONENT, minifloat.SCALE_MIN_EXPONENT, k)
    return ops.where(k > minifloat.SCALE_MAX_EXPONENT, minifloat.SCALE_MAX_EXPONENT, k)


def encode_minifloat(y: Array, fmt: minifloat.Minifloat, ops: BitOps) -> Array:
    """Codes (int32) of fp32 ``y`` in ``fmt``, round to nearest even; ``|y| ≤ max``."""
    bits = ops.as_int32(y)
    magnitude = bits & 0x7FFF_FFFF
    shift = 23 - fmt.mantissa_bits
    lsb = (magnitude >> shift) & 1
    rebias = (127 - fmt.bias) << fmt.mantissa_bits
    normal = ((magnitude + ((1 << (shift - 1)) - 1) + lsb) >> shift) - rebias
    absolute = ops.as_float32(magnitude)
    subnormal = ops.round_even_int32(absolute * 2.0 ** (fmt.bias - 1 + fmt.mantissa_bits))
    codes = ops.where(absolute < fmt.min_normal, subnormal, normal)
    return codes | (((bits >> 31) & 1) << (fmt.code_bits - 1))


def decode_minifloat(codes: Array, fmt: minifloat.Minifloat, ops: BitOps) -> Array:
    """fp32 values of int32 ``codes`` in ``fmt``, built from bits (no table lookup)."""
    mantissa_mask = (1 << fmt.mantissa_bits) - 1
    exponent = (codes >> fmt.mantissa_bits) & ((1 << fmt.exponent_bits) - 1)
    mantissa = codes & mantissa_mask
    normal = ((exponent + (127 - fmt.bias)) << 23) | (mantissa << (23 - fmt.mantissa_bits))
    # Subnormal: mantissa · 2^(1 − bias − m), exact in fp32 (a few bits times a power of two).
    scaled = ops.int_to_float32(mantissa) * 2.0 ** (1 - fmt.bias - fmt.mantissa_bits)
    subnormal = ops.as_int32(scaled)
    magnitude = ops.where(exponent == 0, subnormal, normal)
    return ops.as_float32(magnitude | ((codes >> (fmt.code_bits - 1)) << 31))
