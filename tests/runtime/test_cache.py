"""FragmentCache: bounded by bytes, oldest-used out, and a merged delta dropped at once."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from gm_shell.cache import FragmentCache

OPS = st.lists(
    st.tuples(st.sampled_from(["put", "get", "discard"]), st.integers(0, 5), st.integers(1, 64)),
    max_size=60,
)


@given(OPS, st.integers(1, 256))
def test_the_bytes_held_are_counted_and_bounded(ops: list[tuple[str, int, int]], cap: int) -> None:
    """Whatever is put, read and discarded, the cache counts exactly the bytes it holds, and
    holds more than its bound only as a single item (the newest, however big)."""
    cache: FragmentCache[np.ndarray] = FragmentCache(cap)
    for op, key, size in ops:
        if op == "put":
            cache.put(str(key), np.zeros(size, dtype=np.uint8))
        elif op == "get":
            cache.get(str(key))
        else:
            cache.discard(str(key))
            assert cache.get(str(key)) is None
        held = [cache.get(str(k)) for k in range(6)]
        assert cache.nbytes == sum(v.nbytes for v in held if v is not None)
        assert cache.nbytes <= cap or len(cache) == 1
