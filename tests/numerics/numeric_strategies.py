"""Hypothesis strategies and tolerance helpers shared by the numerics tests."""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

from gm_core.numerics import Contributions, Layout

NAMES = ("embed.tokens", "blocks.0.attn.w", "blocks.0.mlp.b", "norm.weight", "head.w")


@st.composite
def layouts(draw: st.DrawFn, max_tensors: int = 4, max_size: int = 300) -> Layout:
    """A few tensors with awkward sizes (odd, under and over one F4 block)."""
    count = draw(st.integers(1, max_tensors))
    names = draw(st.permutations(NAMES))[:count]
    sizes = draw(st.lists(st.integers(1, max_size), min_size=count, max_size=count))
    return Layout.of((name, (size,)) for name, size in zip(names, sizes, strict=True))


def seeds() -> st.SearchStrategy[int]:
    return st.integers(0, 2**32 - 1)


def fragment(rng: np.random.Generator, n: int, spread: float = 8.0) -> np.ndarray:
    """Normal values with per-element magnitudes over ``2^±spread``, plus some exact zeros."""
    values = rng.standard_normal(n) * np.exp2(rng.uniform(-spread, spread, n))
    values[rng.random(n) < 0.05] = 0.0
    return values.astype(np.float32)


def contributions(rng: np.random.Generator, k: int) -> Contributions:
    weights = tuple(float(w) for w in rng.uniform(0.1, 10.0, k))
    return Contributions(learners=tuple(f"learner-{i:02d}" for i in range(k)), weights=weights)


def merge_bound(deltas: list[np.ndarray], c: Contributions, rel: float = 1e-5) -> np.ndarray:
    """Elementwise bound for fp32 rounding differences of a weighted sum."""
    coefs = np.array(c.coefficients(), dtype=np.float64)
    magnitude = sum(
        abs(w) * np.abs(d.astype(np.float64)) for w, d in zip(coefs, deltas, strict=True)
    )
    return rel * magnitude + 1e-30
