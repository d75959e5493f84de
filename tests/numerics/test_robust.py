"""Robust merge numerics: the reference against a straightforward float64 computation."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from numeric_strategies import fragment, layouts, seeds

from gm_core.numerics import Contributions, Layout, merge, merge_step
from gm_core.numerics.robust import spread
from gm_core.records import MergeRule
from gm_shell.backends import Backend, NumpyBackend
from gm_shell.backends.mlx_backend import MlxBackend
from gm_shell.backends.torch_backend import TorchBackend

cases = settings(max_examples=40, deadline=None)
BACKENDS: dict[str, Backend[Any]] = {
    "numpy": NumpyBackend(),
    "torch": TorchBackend(block=64, threads=3),  # tiny blocks: many ranges and blocks
    "mlx": MlxBackend(),
}


def straightforward(
    deltas: list[np.ndarray], shares: np.ndarray, scales: np.ndarray, trim: int
) -> np.ndarray:
    """Per coordinate in float64: sort, drop ``trim`` at each end, weighted mean of the rest."""
    values = np.stack(deltas).astype(np.float64) * scales[:, None]
    k = values.shape[0]
    order = np.argsort(values, axis=0, kind="stable")[trim : k - trim]
    kept = np.take_along_axis(values, order, axis=0)
    weights = shares[order]
    return (kept * weights).sum(axis=0) / weights.sum(axis=0)


@st.composite
def robust_cases(draw: st.DrawFn) -> tuple[Layout, list[np.ndarray], Contributions]:
    layout = draw(layouts())
    k = draw(st.integers(1, 7))
    rng = np.random.default_rng(draw(seeds()))
    deltas = [fragment(rng, layout.total) for _ in range(k)]
    trim = draw(st.integers(0, (k - 1) // 2))
    scales = tuple(float(s) for s in rng.uniform(0.0, 1.0, k)) if draw(st.booleans()) else ()
    return (
        layout,
        deltas,
        Contributions(
            learners=tuple(f"l{i}" for i in range(k)),
            weights=tuple(float(w) for w in rng.uniform(0.1, 10.0, k)),
            scales=scales,
            trim=trim,
        ),
    )


def expected_of(deltas: list[np.ndarray], c: Contributions) -> np.ndarray:
    shares = np.array(c.shares(), dtype=np.float64)
    return straightforward(deltas, shares, np.array(c.row_scales(), np.float64), c.trim)


def tolerance(deltas: list[np.ndarray]) -> np.ndarray:
    """fp32 rounding of a weighted mean of at most the largest magnitude at a coordinate."""
    return 1e-5 * np.max(np.abs(np.stack(deltas)), axis=0) + 1e-30


@pytest.mark.parametrize("name", sorted(BACKENDS))
@cases
@given(robust_cases(), st.sampled_from([MergeRule.TRIMMED_MEAN, MergeRule.MEDIAN]))
def test_trimmed_merge_matches_float64(
    name: str, case: tuple[Layout, list[np.ndarray], Contributions], rule: MergeRule
) -> None:
    layout, deltas, c = case
    b = BACKENDS[name]
    out = b.empty(layout.total)
    b.merge([b.asarray(d.copy()) for d in deltas], c, layout, rule, "embed", out)
    got = b.to_numpy(out)
    assert np.all(np.abs(got - expected_of(deltas, c)) <= tolerance(deltas))


@pytest.mark.parametrize("name", sorted(BACKENDS))
@cases
@given(robust_cases(), seeds())
def test_merge_step_of_a_trimmed_mean_is_merge_then_step(
    name: str, case: tuple[Layout, list[np.ndarray], Contributions], seed: int
) -> None:
    layout, deltas, c = case
    b = BACKENDS[name]
    rng = np.random.default_rng(seed)
    theta, momentum = fragment(rng, layout.total), fragment(rng, layout.total)
    merged = expected_of(deltas, c)
    m = 0.9 * momentum.astype(np.float64) + merged
    expected = theta - 0.7 * (merged + 0.9 * m)
    t, mo = b.asarray(theta.copy()), b.asarray(momentum.copy())
    arrays = [b.asarray(d.copy()) for d in deltas]
    b.merge_step(arrays, c, layout, MergeRule.MEDIAN, "embed", t, mo, 0.7, 0.9)
    scale = np.abs(theta) + np.abs(momentum) + np.max(np.abs(np.stack(deltas)), axis=0)
    assert np.all(np.abs(b.to_numpy(t) - expected) <= 1e-5 * scale + 1e-30)
    assert np.all(np.abs(b.to_numpy(mo) - m) <= 1e-5 * scale + 1e-30)


@pytest.mark.parametrize("name", sorted(BACKENDS))
@cases
@given(robust_cases(), seeds(), st.booleans(), st.sampled_from(list(MergeRule)))
def test_a_fused_step_is_bit_identical_to_its_backends_merge_then_step(
    name: str,
    case: tuple[Layout, list[np.ndarray], Contributions],
    seed: int,
    final: bool,
    rule: MergeRule,
) -> None:
    """Trimmed, clipped, final-only or not: a backend's fused step (block by block, no
    merged delta of the fragment's size) gives exactly what its own merge into a buffer
    then its own outer step give, and a final-only round leaves the momentum as it was."""
    layout, deltas, c = case
    if c.trim:
        rule = MergeRule.MEDIAN
    c = Contributions(c.learners, c.weights, (final,) * len(deltas), c.scales, c.trim)
    b = BACKENDS[name]
    rng = np.random.default_rng(seed)
    theta, momentum = fragment(rng, layout.total), fragment(rng, layout.total)
    fused = [b.asarray(theta.copy()), b.asarray(momentum.copy())]
    apart = [b.asarray(theta.copy()), b.asarray(momentum.copy())]
    arrays = [b.asarray(d.copy()) for d in deltas]
    b.merge_step(arrays, c, layout, rule, "embed", *fused, 0.7, 0.9)
    merged = b.empty(layout.total)
    b.merge(arrays, c, layout, rule, "embed", merged)
    b.outer_step(*apart, merged, 0.7, 0.9, final_only=final)
    for got, expected in zip(fused, apart, strict=True):
        np.testing.assert_array_equal(b.to_numpy(got), b.to_numpy(expected))
    if final:
        np.testing.assert_array_equal(b.to_numpy(fused[1]), momentum)


def test_median_of_equal_shares_is_numpys_median() -> None:
    rng = np.random.default_rng(7)
    for k in range(1, 8):
        deltas = [rng.standard_normal(500).astype(np.float32) for _ in range(k)]
        c = Contributions(learners=tuple(f"l{i}" for i in range(k)), weights=(1.0,) * k)
        c = Contributions(learners=c.learners, weights=c.weights, trim=(k - 1) // 2)
        out = np.empty(500, np.float32)
        rule = MergeRule.MEDIAN if c.trim else MergeRule.MEAN
        merge(deltas, c, Layout.of([("w", (500,))]), rule, "", out)
        np.testing.assert_allclose(out, np.median(np.stack(deltas), axis=0), rtol=1e-6, atol=1e-7)


def test_one_wild_delta_moves_no_coordinate_out_of_the_honest_range() -> None:
    """The robustness a median buys: a x100 or flipped delta stays inside the others' range."""
    rng = np.random.default_rng(3)
    honest = [rng.standard_normal(1000).astype(np.float32) for _ in range(3)]
    low, high = np.min(np.stack(honest), axis=0), np.max(np.stack(honest), axis=0)
    layout = Layout.of([("w", (1000,))])
    for wild in (100.0 * honest[0], -honest[1]):
        c = Contributions(learners=("a", "b", "c", "d"), weights=(1.0, 1.0, 1.0, 1e6), trim=1)
        out = np.empty(1000, np.float32)
        merge([*honest, wild.astype(np.float32)], c, layout, MergeRule.TRIMMED_MEAN, "", out)
        assert np.all((low <= out) & (out <= high))


@pytest.mark.parametrize("name", sorted(BACKENDS))
@cases
@given(robust_cases(), seeds())
def test_spread_matches_float64(
    name: str, case: tuple[Layout, list[np.ndarray], Contributions], seed: int
) -> None:
    layout, deltas, _ = case
    centre = fragment(np.random.default_rng(seed), layout.total)
    b = BACKENDS[name]
    norms, cosines = b.spread([b.asarray(d.copy()) for d in deltas], b.asarray(centre.copy()))
    wide = [d.astype(np.float64) for d in deltas]
    c64 = centre.astype(np.float64)
    for d, norm, cosine in zip(wide, norms, cosines, strict=True):
        expected_norm = float(np.linalg.norm(d))
        assert abs(norm - expected_norm) <= 1e-5 * expected_norm
        denominator = expected_norm * float(np.linalg.norm(c64))
        expected_cos = float(d @ c64) / denominator if denominator > 0 else 0.0
        assert abs(cosine - expected_cos) <= 1e-4


def test_spread_of_a_zero_centre_is_orthogonal() -> None:
    deltas = [np.ones(10, np.float32), np.zeros(10, np.float32)]
    norms, cosines = spread(deltas, np.zeros(10, np.float32))
    assert norms == [pytest.approx(10**0.5), 0.0]
    assert cosines == [0.0, 0.0]


def test_merge_step_without_trim_is_unchanged_by_unit_scales() -> None:
    """Clip scales of 1 leave the weighted mean's coefficients (and so its bits) alone."""
    rng = np.random.default_rng(5)
    layout = Layout.of([("w", (300,))])
    deltas = [fragment(rng, 300) for _ in range(3)]
    runs = []
    for scales in ((), (1.0, 1.0, 1.0)):
        c = Contributions(learners=("a", "b", "c"), weights=(1.0, 2.0, 3.0), scales=scales)
        theta, momentum = np.ones(300, np.float32), np.zeros(300, np.float32)
        merge_step(deltas, c, layout, MergeRule.MEAN, "", theta, momentum, 0.7, 0.9)
        runs.append(theta)
    np.testing.assert_array_equal(runs[0], runs[1])
