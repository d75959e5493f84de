"""Wire formats: how a flat fp32 fragment becomes payload tensors, and back.

Theory of operation
-------------------
A fragment on the wire is one *codes* region (every tensor's codes, back to back
in layout order) followed by one *scales* region (every tensor's E8M0 scale
bytes, same order). Each region is a run of safetensors tensors: the codes of
tensor ``w`` are the payload tensor ``w``; its scales are ``w:scale`` (a colon
never occurs in a framework's parameter names). Because each region is
contiguous, encoding and decoding work on two flat byte buffers that can be the
payload file's own memory: no per-tensor copies.

Formats (:class:`gm_core.records.WireFormat`):

* ``F32``: the bytes themselves. ``F16``: IEEE half, round to nearest even;
  magnitudes beyond 65504 become ±Inf, which the receiver's finiteness check
  rejects. ``BF16``: the top half of the fp32 bits, round to nearest even.
* ``F8_E4M3``: one power-of-two scale per tensor, codes in E4M3.
* ``F4_E2M1``: one power-of-two scale per block of 32 elements of a tensor (the
  last block may be short), codes in E2M1, two per byte, element ``2i`` in the
  low nibble. A tensor of odd size is padded with a zero code, so its payload
  tensor is flat with an even length (safetensors requires whole bytes).

Scales are chosen so nothing is clipped (:mod:`gm_core.numerics.minifloat`).

Non-finite input stays non-finite in every format, so that a receiver's finiteness
check (:func:`gm_core.numerics.merge.all_finite`) sees it: F32 and F16 carry NaN and
±Inf as they are, BF16 too (a NaN of any payload becomes a quiet bf16 NaN, never the
zero plain rounding of its bits would wrap to). E4M3 has no Inf and E2M1 neither
NaN nor Inf, so a tensor (F8) or block (F4) holding a NaN or ±Inf gets the NaN
scale (E8M0 byte 255) and zero codes: all its values decode as NaN. No finite input
gets that scale, so finite input encodes exactly as it always did.
"""

from __future__ import annotations

import attrs
import numpy as np

from gm_core.numerics import minifloat
from gm_core.numerics.arrays import F32, U8, check_flat
from gm_core.numerics.blocks import blocks
from gm_core.numerics.layout import Layout, Span
from gm_core.records import WireFormat

SCALE_SUFFIX = ":scale"
SCALE_DTYPE = "F8_E8M0"
F4_BLOCK = 32
"""Elements sharing one scale in F4_E2M1 (as in the OCP MX formats)."""

CODE_DTYPE = {
    WireFormat.F32: "F32",
    WireFormat.F16: "F16",
    WireFormat.BF16: "BF16",
    WireFormat.F8_E4M3: "F8_E4M3",
    WireFormat.F4_E2M1: "F4",
}
"""The safetensors dtype of each format's codes."""


@attrs.frozen
class WireTensor:
    """Where one model tensor's codes and scales sit in the two regions (byte offsets)."""

    span: Span
    shape: tuple[int, ...]
    codes: tuple[int, int]
    scales: tuple[int, int]


@attrs.frozen
class WireLayout:
    """A fragment layout as laid out on the wire in one format."""

    format: WireFormat
    layout: Layout
    tensors: tuple[WireTensor, ...]
    code_bytes: int
    scale_bytes: int

    @property
    def code_dtype(self) -> str:
        return CODE_DTYPE[self.format]


def code_bytes_of(span: Span, fmt: WireFormat) -> int:
    if fmt is WireFormat.F32:
        return 4 * span.size
    if fmt in (WireFormat.F16, WireFormat.BF16):
        return 2 * span.size
    if fmt is WireFormat.F8_E4M3:
        return span.size
    return (span.size + 1) // 2


def scale_count_of(span: Span, fmt: WireFormat) -> int:
    if fmt is WireFormat.F8_E4M3:
        return 1
    if fmt is WireFormat.F4_E2M1:
        return -(-span.size // F4_BLOCK)
    return 0


def wire_layout(layout: Layout, fmt: WireFormat) -> WireLayout:
    """Byte offsets of every tensor's codes and scales for ``fmt``."""
    tensors: list[WireTensor] = []
    code_at = scale_at = 0
    for span in layout.spans:
        code_n, scale_n = code_bytes_of(span, fmt), scale_count_of(span, fmt)
        shape = (2 * code_n,) if fmt is WireFormat.F4_E2M1 else span.shape
        tensors.append(
            WireTensor(
                span=span,
                shape=shape,
                codes=(code_at, code_at + code_n),
                scales=(scale_at, scale_at + scale_n),
            )
        )
        code_at, scale_at = code_at + code_n, scale_at + scale_n
    return WireLayout(
        format=fmt, layout=layout, tensors=tuple(tensors), code_bytes=code_at, scale_bytes=scale_at
    )


def _check_regions(wire: WireLayout, codes: U8, scales: U8) -> None:
    assert codes.dtype == np.uint8, "codes region is bytes"
    assert codes.shape == (wire.code_bytes,), "codes region size"
    assert scales.dtype == np.uint8, "scales region is bytes"
    assert scales.shape == (wire.scale_bytes,), "scales region size"


BF16_NAN = np.uint16(0x7FC0)


def bf16_bits(x: F32) -> np.ndarray[tuple[int], np.dtype[np.uint16]]:
    """Round fp32 to bf16 (nearest, ties to even) on the bit pattern. The rounding carry
    wraps a NaN with a large payload (CUDA's 0x7FFFFFFF) to ±0, so NaNs are set apart
    (looked for only when the maximum, which propagates NaN, is one: a cheap pass)."""
    bits = x.view(np.uint32)
    lsb = (bits >> np.uint32(16)) & np.uint32(1)
    rounded = ((bits + np.uint32(0x7FFF) + lsb) >> np.uint32(16)).astype(np.uint16)
    if x.size and np.isnan(x.max()):
        rounded[np.isnan(x)] = BF16_NAN
    return rounded


def encode(x: F32, wire: WireLayout, codes: U8, scales: U8) -> None:
    """Encode the flat fragment ``x`` into the ``codes`` and ``scales`` regions."""
    check_flat(x, wire.layout.total, "x")
    _check_regions(wire, codes, scales)
    fmt = wire.format
    if fmt is WireFormat.F32:
        np.copyto(codes.view(np.float32), x)
    elif fmt is WireFormat.F16:
        np.copyto(codes.view(np.float16), x, casting="same_kind")
    elif fmt is WireFormat.BF16:
        out16 = codes.view(np.uint16)
        for lo, hi in blocks(0, x.shape[0]):
            out16[lo:hi] = bf16_bits(x[lo:hi])
    else:
        for tensor in wire.tensors:
            region = codes[tensor.codes[0] : tensor.codes[1]]
            scale = scales[tensor.scales[0] : tensor.scales[1]]
            values = x[tensor.span.start : tensor.span.stop]
            if fmt is WireFormat.F8_E4M3:
                encode_f8(values, region, scale)
            else:
                encode_f4(values, region, scale)


def encode_f8(x: F32, codes: U8, scale: U8) -> None:
    """One tensor to E4M3 codes under a single power-of-two scale."""
    amax = np.float32(max(float(x.max()), -float(x.min()))) if x.size else np.float32(0.0)
    if not np.isfinite(amax):  # NaN or ±Inf inside (max and min propagate NaN)
        codes[:] = 0
        scale[:] = minifloat.SCALE_NAN_BYTE
        return
    k = minifloat.scale_exponents(np.array([amax], np.float32), minifloat.E4M3)
    scale[:] = minifloat.scale_bytes(k)
    inverse = minifloat.power_of_two(-k)[0]
    for lo, hi in blocks(0, x.shape[0]):
        codes[lo:hi] = minifloat.encode(x[lo:hi] * inverse, minifloat.E4M3)


def padded_blocks(x: F32) -> F32:
    """``x`` zero-padded to whole F4 blocks, shaped ``(blocks, 32)``."""
    padded = np.zeros(-(-x.shape[0] // F4_BLOCK) * F4_BLOCK, dtype=np.float32)
    padded[: x.shape[0]] = x
    return padded.reshape(-1, F4_BLOCK)


def encode_f4(x: F32, codes: U8, scale: U8) -> None:
    """One tensor to packed E2M1 codes, one power-of-two scale per block of 32."""
    for lo, hi in blocks(0, x.shape[0]):
        chunk = padded_blocks(x[lo:hi])
        amax = np.abs(chunk).max(axis=1)
        k = minifloat.scale_exponents(amax, minifloat.E2M1)
        scale_bytes = minifloat.scale_bytes(k)
        bad = ~np.isfinite(amax)
        if bad.any():  # NaN scale and zero codes for a block holding NaN or ±Inf
            chunk[bad] = 0.0
            scale_bytes[bad] = minifloat.SCALE_NAN_BYTE
        scale[lo // F4_BLOCK : lo // F4_BLOCK + k.shape[0]] = scale_bytes
        y = chunk * minifloat.power_of_two(-k)[:, None]
        nibbles = minifloat.encode(y.reshape(-1), minifloat.E2M1)
        packed = nibbles[0::2] | (nibbles[1::2] << np.uint8(4))
        codes[lo // 2 : lo // 2 + -(-(hi - lo) // 2)] = packed[: -(-(hi - lo) // 2)]


def decode(codes: U8, scales: U8, wire: WireLayout, out: F32) -> None:
    """Decode the two regions into the flat fp32 fragment ``out``; exact for every format."""
    check_flat(out, wire.layout.total, "out")
    _check_regions(wire, codes, scales)
    fmt = wire.format
    if fmt is WireFormat.F32:
        np.copyto(out, codes.view(np.float32))
    elif fmt is WireFormat.F16:
        np.copyto(out, codes.view(np.float16))
    elif fmt is WireFormat.BF16:
        bits16 = codes.view(np.uint16)
        for lo, hi in blocks(0, out.shape[0]):
            out[lo:hi] = (bits16[lo:hi].astype(np.uint32) << np.uint32(16)).view(np.float32)
    else:
        for tensor in wire.tensors:
            region = codes[tensor.codes[0] : tensor.codes[1]]
            scale = scales[tensor.scales[0] : tensor.scales[1]]
            values = out[tensor.span.start : tensor.span.stop]
            if fmt is WireFormat.F8_E4M3:
                decode_f8(region, scale, values)
            else:
                decode_f4(region, scale, values)


E4M3_TABLE = minifloat.E4M3.table()
E2M1_TABLE = minifloat.E2M1.table()


def decode_f8(codes: U8, scale: U8, out: F32) -> None:
    factor = minifloat.power_of_two(minifloat.byte_exponents(scale))[0]
    for lo, hi in blocks(0, out.shape[0]):
        np.take(E4M3_TABLE, codes[lo:hi], out=out[lo:hi])
        np.multiply(out[lo:hi], factor, out=out[lo:hi])


def unpack_nibbles(packed: U8) -> U8:
    """Two codes per byte, low nibble first."""
    nibbles = np.empty(2 * packed.shape[0], dtype=np.uint8)
    nibbles[0::2] = packed & np.uint8(0x0F)
    nibbles[1::2] = packed >> np.uint8(4)
    return nibbles


def decode_f4(codes: U8, scale: U8, out: F32) -> None:
    for lo, hi in blocks(0, out.shape[0]):
        nibbles = unpack_nibbles(codes[lo // 2 : lo // 2 + -(-(hi - lo) // 2)])
        first = lo // F4_BLOCK
        count = -(-(hi - lo) // F4_BLOCK)
        factors = minifloat.power_of_two(minifloat.byte_exponents(scale[first : first + count]))
        values = np.zeros(count * F4_BLOCK, dtype=np.float32)
        values[: nibbles.shape[0]] = E2M1_TABLE[nibbles]
        values = (values.reshape(-1, F4_BLOCK) * factors[:, None]).reshape(-1)
        out[lo:hi] = values[: hi - lo]
