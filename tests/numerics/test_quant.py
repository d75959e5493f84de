"""Wire formats: error bounds, exactness of representable values, scale choice, layout."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from numeric_strategies import fragment, layouts, seeds

from gm_core.numerics import Layout, decode, encode, minifloat, wire_layout
from gm_core.numerics.quant import F4_BLOCK, WireLayout
from gm_core.records import WireFormat

QUANTIZED = {WireFormat.F8_E4M3: minifloat.E4M3, WireFormat.F4_E2M1: minifloat.E2M1}


def round_trip(x: np.ndarray, wire: WireLayout) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    codes = np.empty(wire.code_bytes, np.uint8)
    scales = np.empty(wire.scale_bytes, np.uint8)
    encode(x, wire, codes, scales)
    out = np.empty_like(x)
    decode(codes, scales, wire, out)
    return out, codes, scales


def element_scales(wire: WireLayout, scales: np.ndarray) -> np.ndarray:
    """The scale ``2^k`` that applied to each element."""
    per_element = np.empty(wire.layout.total, np.float64)
    for tensor in wire.tensors:
        k = minifloat.byte_exponents(scales[tensor.scales[0] : tensor.scales[1]])
        block = tensor.span.size if wire.format is WireFormat.F8_E4M3 else F4_BLOCK
        per_element[tensor.span.start : tensor.span.stop] = np.repeat(np.exp2(k), block)[
            : tensor.span.size
        ]
    return per_element


@settings(max_examples=60, deadline=None)
@given(layouts(), seeds(), st.sampled_from(list(QUANTIZED)))
def test_quantized_error_is_half_a_step(layout: Layout, seed: int, fmt: WireFormat) -> None:
    """|x − q| ≤ half the code spacing at x: relative 2^−(m+1) above the subnormal range."""
    mf = QUANTIZED[fmt]
    x = fragment(np.random.default_rng(seed), layout.total)
    wire = wire_layout(layout, fmt)
    out, _, scales = round_trip(x, wire)
    s = element_scales(wire, scales)
    half_step = np.maximum(
        np.abs(x) * 2.0 ** -(mf.mantissa_bits + 1),
        s * mf.min_normal * 2.0 ** -(mf.mantissa_bits + 1),
    )
    assert np.all(np.abs(out.astype(np.float64) - x) <= half_step)


@settings(max_examples=60, deadline=None)
@given(layouts(), seeds(), st.sampled_from(list(QUANTIZED)))
def test_scale_is_the_smallest_power_of_two_that_fits(
    layout: Layout, seed: int, fmt: WireFormat
) -> None:
    """No value is clipped, and half the scale would clip the largest one."""
    mf = QUANTIZED[fmt]
    x = fragment(np.random.default_rng(seed), layout.total)
    wire = wire_layout(layout, fmt)
    _, _, scales = round_trip(x, wire)
    s = element_scales(wire, scales)
    assert np.all(np.abs(x) <= mf.max_value * s)
    for tensor in wire.tensors:
        values = np.abs(x[tensor.span.start : tensor.span.stop]).astype(np.float64)
        spans = s[tensor.span.start : tensor.span.stop]
        block = tensor.span.size if fmt is WireFormat.F8_E4M3 else F4_BLOCK
        for lo in range(0, tensor.span.size, block):
            amax, scale = values[lo : lo + block].max(), spans[lo]
            if amax > 0 and scale > 2.0**-127:
                assert amax > mf.max_value * scale / 2


@settings(max_examples=60, deadline=None)
@given(layouts(), seeds(), st.sampled_from(list(QUANTIZED)), st.integers(-100, 100))
def test_representable_values_round_trip_exactly(
    layout: Layout, seed: int, fmt: WireFormat, exponent: int
) -> None:
    """Values that are codes times one power of two survive encode→decode bit for bit."""
    mf = QUANTIZED[fmt]
    rng = np.random.default_rng(seed)
    table = mf.table()
    finite = table[np.isfinite(table)]
    x = (rng.choice(finite, layout.total) * np.float32(2.0**exponent)).astype(np.float32)
    out, _, _ = round_trip(x, wire_layout(layout, fmt))
    assert np.array_equal(out, x)


@settings(max_examples=60, deadline=None)
@given(layouts(), seeds())
def test_float_formats_round_to_nearest_even(layout: Layout, seed: int) -> None:
    """F32 is exact; F16 and BF16 match float64-reference rounding (ties to even)."""
    x = fragment(np.random.default_rng(seed), layout.total, spread=12.0)
    f32_out, _, _ = round_trip(x, wire_layout(layout, WireFormat.F32))
    assert np.array_equal(f32_out, x)
    f16_out, _, _ = round_trip(x, wire_layout(layout, WireFormat.F16))
    assert np.array_equal(f16_out, x.astype(np.float16).astype(np.float32))
    bf16_out, _, _ = round_trip(x, wire_layout(layout, WireFormat.BF16))
    expected = torch.from_numpy(x).to(torch.bfloat16).float().numpy()
    assert np.array_equal(bf16_out, expected)
    assert np.all(np.abs(bf16_out - x) <= np.abs(x) * 2.0**-8)


def test_bf16_ties_go_to_even() -> None:
    """1 + 2^−8 is halfway between two bf16 values: it rounds to the even one, 1."""
    layout = Layout.of([("w", (3,))])
    x = np.array([1 + 2.0**-8, 1 + 3 * 2.0**-8, -(1 + 2.0**-8)], dtype=np.float32)
    out, _, _ = round_trip(x, wire_layout(layout, WireFormat.BF16))
    assert out.tolist() == [1.0, 1 + 2 * 2.0**-7, -1.0]


@settings(max_examples=200, deadline=None)
@given(st.floats(-448.0, 448.0, width=32))
def test_e4m3_codes_agree_with_torch(value: float) -> None:
    """The bit-level rounding gives the same code as torch's float8_e4m3fn conversion."""
    y = np.array([value], dtype=np.float32)
    expected = torch.from_numpy(y).to(torch.float8_e4m3fn).view(torch.uint8).numpy()
    assert minifloat.encode(y, minifloat.E4M3)[0] == expected[0]


@settings(max_examples=200, deadline=None)
@given(st.floats(-6.0, 6.0, width=32))
def test_e2m1_code_is_the_nearest_even_value(value: float) -> None:
    """Brute force: the code decodes to a nearest E2M1 value; ties pick the even code."""
    table = minifloat.E2M1.table()[:8].astype(np.float64)
    code = int(minifloat.encode(np.array([value], np.float32), minifloat.E2M1)[0])
    distances = np.abs(table - abs(value))
    nearest = np.flatnonzero(distances == distances.min())
    assert (code & 7) in nearest
    if len(nearest) == 2:
        assert (code & 7) % 2 == 0
    assert (code >> 3) == (np.signbit(np.float32(value)))


def test_f4_packs_two_codes_per_byte_low_nibble_first() -> None:
    layout = Layout.of([("w", (3,))])
    wire = wire_layout(layout, WireFormat.F4_E2M1)
    _, codes, scales = round_trip(np.array([1.0, -6.0, 0.5], np.float32), wire)
    # amax 6 fits 6·2^0: scale byte 127; codes 1.0→2, −6→8|7, 0.5→1 (padded with 0).
    assert scales.tolist() == [127]
    assert codes.tolist() == [2 | (15 << 4), 1]


def test_wire_layout_regions() -> None:
    layout = Layout.of([("a", (2, 3)), ("b", (33,)), ("c", (1,))])
    wire = wire_layout(layout, WireFormat.F4_E2M1)
    assert [t.codes for t in wire.tensors] == [(0, 3), (3, 20), (20, 21)]
    assert [t.scales for t in wire.tensors] == [(0, 1), (1, 3), (3, 4)]
    assert [t.shape for t in wire.tensors] == [(6,), (34,), (2,)]
    f8 = wire_layout(layout, WireFormat.F8_E4M3)
    assert (f8.code_bytes, f8.scale_bytes) == (40, 3)
    assert wire_layout(layout, WireFormat.BF16).tensors[0].shape == (2, 3)


def test_all_zero_and_tiny_tensors_use_the_smallest_scale() -> None:
    layout = Layout.of([("z", (40,)), ("t", (5,))])
    x = np.zeros(45, np.float32)
    x[40:] = np.float32(1e-42)  # fp32 subnormals
    for fmt in QUANTIZED:
        out, _, scales = round_trip(x, wire_layout(layout, fmt))
        assert np.all(scales == 0)
        assert np.all(np.abs(out - x) <= 1e-42)


@pytest.mark.parametrize("fmt", list(WireFormat))
def test_encode_rejects_wrong_region_sizes(fmt: WireFormat) -> None:
    layout = Layout.of([("w", (10,))])
    wire = wire_layout(layout, fmt)
    with pytest.raises(AssertionError, match="codes region"):
        encode(
            np.zeros(10, np.float32),
            wire,
            np.empty(wire.code_bytes + 1, np.uint8),
            np.empty(wire.scale_bytes, np.uint8),
        )
