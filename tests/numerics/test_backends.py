"""torch == numpy == MLX: exact for codecs and the error-feedback mirror, fp32-close for math."""

from __future__ import annotations

import math
from typing import Any

import mlx.core as mx
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from numeric_strategies import contributions, fragment, layouts, merge_bound, seeds

from gm_core.numerics import Contributions, Layout, minifloat, wire_layout
from gm_core.records import FOLDS, Alignment, MergeRule, WireFormat
from gm_shell.backends import Backend, NumpyBackend, backend, bits
from gm_shell.backends.mlx_backend import MlxBackend, MlxBits
from gm_shell.backends.torch_backend import TorchBackend, TorchBits
from gm_shell.fragments import compute_backend

PATTERN = "embed"
REFERENCE = NumpyBackend()
# A tiny torch block exercises the multi-block paths on small hypothesis inputs.
BACKENDS: dict[str, Backend[Any]] = {
    "torch": TorchBackend(block=64, codec_block=64, threads=3),
    "mlx": MlxBackend(),
}
if torch.cuda.is_available():  # the GPU path, where there is one (bench/device_check.sh)
    BACKENDS["torch-cuda"] = TorchBackend(device="cuda", block=64, codec_block=64)
if torch.backends.mps.is_available():  # Apple's GPU, where there is one
    BACKENDS["torch-mps"] = TorchBackend(device="mps", block=64, codec_block=64)
names = pytest.mark.parametrize("name", sorted(BACKENDS))
cases = settings(max_examples=25, deadline=None)


def on(b: Backend[Any], x: np.ndarray) -> Any:
    return b.asarray(x.copy())


def test_factory_and_protocol() -> None:
    assert isinstance(backend("numpy"), NumpyBackend)
    assert isinstance(backend("torch"), TorchBackend)
    assert isinstance(backend("mlx"), MlxBackend)
    with pytest.raises(ValueError, match="unknown backend"):
        backend("jax")


def test_auto_is_torch_on_the_accelerator_there_is_and_numpy_for_other_frameworks() -> None:
    chosen = compute_backend("auto")
    assert isinstance(chosen, TorchBackend)
    accelerator = "cuda" if torch.cuda.is_available() else "mps"
    has_one = torch.cuda.is_available() or torch.backends.mps.is_available()
    assert chosen.device.type == (accelerator if has_one else "cpu")
    assert isinstance(compute_backend("auto", torch_model=False), NumpyBackend)
    assert isinstance(compute_backend("torch", torch_model=False), TorchBackend)  # as asked


@names
@cases
@given(layouts(), seeds(), st.sampled_from(list(WireFormat)))
def test_codecs_are_bit_exact(name: str, layout: Layout, seed: int, fmt: WireFormat) -> None:
    b = BACKENDS[name]
    x = fragment(np.random.default_rng(seed), layout.total, spread=20.0)
    if fmt is WireFormat.F16:
        x = np.clip(x, -60000, 60000)
    wire = wire_layout(layout, fmt)
    regions = [np.full(n, 0xAA, np.uint8) for n in (wire.code_bytes, wire.scale_bytes) * 2]
    REFERENCE.encode(x, wire, regions[0], regions[1])
    b.encode(on(b, x), wire, regions[2], regions[3])
    np.testing.assert_array_equal(regions[2], regions[0])
    np.testing.assert_array_equal(regions[3], regions[1])
    expected, got = np.empty_like(x), b.empty(layout.total)
    REFERENCE.decode(regions[0], regions[1], wire, expected)
    b.decode(regions[0], regions[1], wire, got)
    np.testing.assert_array_equal(b.to_numpy(got), expected)


@names
@cases
@given(layouts(), seeds(), st.integers(1, 3), st.sampled_from(list(MergeRule)))
def test_merge_agrees_within_fp32_rounding(
    name: str, layout: Layout, seed: int, k: int, rule: MergeRule
) -> None:
    b = BACKENDS[name]
    rng = np.random.default_rng(seed)
    deltas, c = [fragment(rng, layout.total) for _ in range(k)], contributions(rng, k)
    expected, got = np.empty(layout.total, np.float32), b.empty(layout.total)
    REFERENCE.merge(deltas, c, layout, rule, PATTERN, expected)
    b.merge([on(b, d) for d in deltas], c, layout, rule, PATTERN, got)
    rel = 2e-5 if rule is MergeRule.MEAN else 6e-5
    assert np.all(np.abs(b.to_numpy(got) - expected) <= merge_bound(deltas, c, rel))
    cos_expected, cos_got = REFERENCE.cosine(deltas), b.cosine([on(b, d) for d in deltas])
    assert (cos_expected is None) == (cos_got is None)
    if cos_expected is not None and cos_got is not None:
        assert math.isclose(cos_got, cos_expected, abs_tol=1e-5)


@names
@cases
@given(layouts(), seeds(), st.integers(1, 3), st.sampled_from(list(MergeRule)), st.booleans())
def test_merge_step_agrees_within_fp32_rounding(
    name: str, layout: Layout, seed: int, k: int, rule: MergeRule, final: bool
) -> None:
    b = BACKENDS[name]
    rng = np.random.default_rng(seed)
    deltas, c = [fragment(rng, layout.total) for _ in range(k)], contributions(rng, k)
    c = Contributions(learners=c.learners, weights=c.weights, final=(final,) * k)
    theta, momentum = fragment(rng, layout.total), fragment(rng, layout.total)
    theta_b, momentum_b = on(b, theta), on(b, momentum)
    b.merge_step(
        [on(b, d) for d in deltas], c, layout, rule, PATTERN, theta_b, momentum_b, 0.7, 0.9
    )
    scale = np.abs(theta) + np.abs(momentum) + merge_bound(deltas, c, rel=1.0)
    REFERENCE.merge_step(deltas, c, layout, rule, PATTERN, theta, momentum, 0.7, 0.9)
    rel = 1e-5 if rule is MergeRule.MEAN else 6e-5
    assert np.all(np.abs(b.to_numpy(theta_b) - theta) <= rel * scale)
    assert np.all(np.abs(b.to_numpy(momentum_b) - momentum) <= rel * scale)


@pytest.mark.parametrize("name", ["numpy", *sorted(BACKENDS)])
@cases
@given(
    layouts(), seeds(), st.integers(1, 3), st.sampled_from(list(MergeRule)), st.booleans(),
    st.data(),
)  # fmt: skip
def test_merge_step_into_a_delta_is_the_step_in_place(
    name: str, layout: Layout, seed: int, k: int, rule: MergeRule, final: bool, data: st.DataObject
) -> None:
    """The new theta written into one of the deltas (``out``: a closer's merge that makes
    no buffer for it) is bit for bit the step made in place into theta, on each backend,
    trimmed means and RDA included; theta itself is only read."""
    b = REFERENCE if name == "numpy" else BACKENDS[name]
    rng = np.random.default_rng(seed)
    deltas, c = [fragment(rng, layout.total) for _ in range(k)], contributions(rng, k)
    robust = rule in (MergeRule.TRIMMED_MEAN, MergeRule.MEDIAN)
    trim = int(k == 3 and robust and data.draw(st.booleans()))
    c = Contributions(learners=c.learners, weights=c.weights, final=(final,) * k, trim=trim)
    theta, momentum = fragment(rng, layout.total), fragment(rng, layout.total)
    in_place, moved = on(b, theta), on(b, momentum)
    b.merge_step([on(b, d) for d in deltas], c, layout, rule, PATTERN, in_place, moved, 0.7, 0.9)
    into = data.draw(st.integers(0, k - 1))
    buffers, source, momentum_b = [on(b, d) for d in deltas], on(b, theta), on(b, momentum)
    out = buffers[into]
    b.merge_step(buffers, c, layout, rule, PATTERN, source, momentum_b, 0.7, 0.9, out=out)
    assert b.to_numpy(out).tobytes() == b.to_numpy(in_place).tobytes()
    assert b.to_numpy(momentum_b).tobytes() == b.to_numpy(moved).tobytes()
    assert b.to_numpy(source).tobytes() == theta.tobytes()


@names
@cases
@given(seeds(), st.integers(1, 300), st.sampled_from(FOLDS), st.floats(0.0, 1.0))
def test_align_and_outer_step_agree(
    name: str, seed: int, n: int, alignment: Alignment, mixing: float
) -> None:
    b = BACKENDS[name]
    rng = np.random.default_rng(seed)
    theta, committed, snapshot = (fragment(rng, n) for _ in range(3))
    theta_b = on(b, theta)
    b.align(theta_b, on(b, committed), alignment, mixing, on(b, snapshot))
    REFERENCE.align(theta, committed, alignment, mixing, snapshot)
    scale = np.abs(theta) + np.abs(committed) + np.abs(snapshot)
    assert np.all(np.abs(b.to_numpy(theta_b) - theta) <= 1e-6 * scale)
    momentum, delta = fragment(rng, n), fragment(rng, n)
    theta_b, momentum_b = on(b, theta), on(b, momentum)
    b.outer_step(theta_b, momentum_b, on(b, delta), 0.7, 0.9, final_only=False)
    scale = np.abs(theta) + np.abs(momentum) + np.abs(delta)
    REFERENCE.outer_step(theta, momentum, delta, 0.7, 0.9, final_only=False)
    assert np.all(np.abs(b.to_numpy(theta_b) - theta) <= 1e-5 * scale)
    assert np.all(np.abs(b.to_numpy(momentum_b) - momentum) <= 1e-5 * scale)


@names
@cases
@given(
    layouts(), seeds(), st.sampled_from([WireFormat.F8_E4M3, WireFormat.F4_E2M1, WireFormat.BF16])
)
def test_error_feedback_mirror_is_bit_exact(
    name: str, layout: Layout, seed: int, fmt: WireFormat
) -> None:
    b = BACKENDS[name]
    rng = np.random.default_rng(seed)
    wire = wire_layout(layout, fmt)
    master, mirror = fragment(rng, layout.total), fragment(rng, layout.total)
    master_b, mirror_b = on(b, master), on(b, mirror)
    regions = [np.empty(n, np.uint8) for n in (wire.code_bytes, wire.scale_bytes) * 2]
    REFERENCE.publish_update(master, mirror, wire, regions[0], regions[1])
    b.publish_update(master_b, mirror_b, wire, regions[2], regions[3])
    np.testing.assert_array_equal(regions[2], regions[0])
    np.testing.assert_array_equal(regions[3], regions[1])
    np.testing.assert_array_equal(b.to_numpy(mirror_b), mirror)


NAN_BITS = (0x7FC0_0000, 0xFFC0_0000, 0x7FFF_FFFF, 0xFFFF_FFFF, 0x7F80_0001)
"""NaNs: numpy's, negative, CUDA's (all payload bits: plain bf16 rounding wraps it to
0), signalling."""


@names
@cases
@given(
    layouts(),
    seeds(),
    st.sampled_from(list(WireFormat)),
    st.lists(st.sampled_from((*NAN_BITS, 0x7F80_0000, 0xFF80_0000)), min_size=1, max_size=4),
)
def test_non_finite_input_stays_non_finite_on_the_wire(
    name: str, layout: Layout, seed: int, fmt: WireFormat, bad: list[int]
) -> None:
    """A NaN or ±Inf anywhere decodes as NaN or ±Inf where it was, in every format, on
    every backend (a receiver's finiteness check must see it); fp8's and fp4's bytes
    (NaN scale, zero codes) are the reference's, bit for bit."""
    b = BACKENDS[name]
    rng = np.random.default_rng(seed)
    x = fragment(rng, layout.total, spread=20.0)
    if fmt is WireFormat.F16:
        x = np.clip(x, -60000, 60000)
    where = rng.integers(layout.total, size=len(bad))
    x.view(np.uint32)[where] = np.array(bad, np.uint32)
    wire = wire_layout(layout, fmt)
    regions = [np.full(n, 0xAA, np.uint8) for n in (wire.code_bytes, wire.scale_bytes) * 2]
    REFERENCE.encode(x, wire, regions[0], regions[1])
    b.encode(on(b, x), wire, regions[2], regions[3])
    if fmt in (WireFormat.F8_E4M3, WireFormat.F4_E2M1):
        np.testing.assert_array_equal(regions[2], regions[0])
        np.testing.assert_array_equal(regions[3], regions[1])
    for encoder in (0, 2):  # each side's bytes, decoded by the reference and by b
        expected, got = np.empty_like(x), b.empty(layout.total)
        REFERENCE.decode(regions[encoder], regions[encoder + 1], wire, expected)
        b.decode(regions[encoder], regions[encoder + 1], wire, got)
        assert not np.isfinite(expected[where]).any()
        np.testing.assert_array_equal(np.isfinite(b.to_numpy(got)), np.isfinite(expected))


@names
@cases
@given(seeds(), st.integers(1, 300), st.sampled_from([np.nan, np.inf, -np.inf]))
def test_all_finite_detects_bad_elements(name: str, seed: int, n: int, bad: float) -> None:
    b = BACKENDS[name]
    rng = np.random.default_rng(seed)
    x = fragment(rng, n, spread=100.0)
    assert b.all_finite(on(b, x))
    x[rng.integers(n)] = bad
    assert not b.all_finite(on(b, x))


def test_default_torch_configuration_on_a_multi_range_fragment() -> None:
    """Default blocks and threads: several ranges per merge, several chunks per codec."""
    b = TorchBackend()
    n = 10 * b.block + 77
    layout = Layout.of([("embed", (n // 3,)), ("w", (n - n // 3,))])
    rng = np.random.default_rng(7)
    deltas, c = [fragment(rng, n) for _ in range(3)], contributions(rng, 3)
    for rule in MergeRule:
        theta, momentum = fragment(rng, n), fragment(rng, n)
        theta_b, momentum_b = on(b, theta), on(b, momentum)
        b.merge_step(
            [on(b, d) for d in deltas], c, layout, rule, PATTERN, theta_b, momentum_b, 0.7, 0.9
        )
        scale = np.abs(theta) + np.abs(momentum) + merge_bound(deltas, c, rel=1.0)
        REFERENCE.merge_step(deltas, c, layout, rule, PATTERN, theta, momentum, 0.7, 0.9)
        assert np.all(np.abs(b.to_numpy(theta_b) - theta) <= 6e-5 * scale)
    for fmt in (WireFormat.F4_E2M1, WireFormat.F8_E4M3):
        wire = wire_layout(layout, fmt)
        regions = [np.empty(k, np.uint8) for k in (wire.code_bytes, wire.scale_bytes) * 2]
        REFERENCE.encode(deltas[0], wire, regions[0], regions[1])
        b.encode(on(b, deltas[0]), wire, regions[2], regions[3])
        np.testing.assert_array_equal(regions[2], regions[0])
        np.testing.assert_array_equal(regions[3], regions[1])


@pytest.mark.parametrize("fmt", [minifloat.E4M3, minifloat.E2M1])
def test_bit_built_decoding_matches_the_table(fmt: minifloat.Minifloat) -> None:
    """Every code's value from bits equals the reference table (NaN codes excepted)."""
    table = fmt.table()
    codes = np.flatnonzero(np.isfinite(table)).astype(np.int32)
    from_torch = bits.decode_minifloat(torch.from_numpy(codes), fmt, TorchBits())
    np.testing.assert_array_equal(from_torch.numpy(), table[codes])
    from_mlx = bits.decode_minifloat(mx.array(codes), fmt, MlxBits())
    np.testing.assert_array_equal(np.array(from_mlx), table[codes])
    values = np.abs(table[codes]) * 2.0 ** (fmt.bias - 1 + fmt.mantissa_bits)
    rounded = TorchBits().round_even_int32(torch.from_numpy((values + 0.5).astype(np.float32)))
    np.testing.assert_array_equal(rounded.numpy(), np.rint(values + 0.5).astype(np.int32))
