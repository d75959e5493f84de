"""Byte shuffle: a permutation of bytes that its inverse undoes."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from gm_core.numerics import shuffle, unshuffle


@settings(max_examples=100, deadline=None)
@given(st.sampled_from([1, 2, 4, 8]), st.integers(0, 200), st.integers(0, 2**32 - 1))
def test_unshuffle_inverts_shuffle(itemsize: int, n: int, seed: int) -> None:
    src = np.random.default_rng(seed).integers(0, 256, n * itemsize, dtype=np.uint8)
    planes, back = np.empty_like(src), np.empty_like(src)
    shuffle(src, itemsize, planes)
    unshuffle(planes, itemsize, back)
    np.testing.assert_array_equal(back, src)
    assert sorted(planes.tolist()) == sorted(src.tolist())


def test_shuffle_groups_byte_planes() -> None:
    values = np.array([0x04030201, 0x08070605], dtype="<u4").view(np.uint8)
    planes = np.empty_like(values)
    shuffle(values, 4, planes)
    assert planes.tolist() == [1, 5, 2, 6, 3, 7, 4, 8]
