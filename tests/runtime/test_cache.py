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
    cache: FragmentCache[str, np.ndarray] = FragmentCache(cap)
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


PUTS = st.lists(
    st.tuples(st.integers(0, 2), st.integers(0, 6), st.integers(1, 64), st.booleans()),
    max_size=40,
)


@given(PUTS, st.integers(1, 2))
def test_newest_keeps_the_latest_rounds_of_each_fragment(
    puts: list[tuple[int, int, int, bool]], newest: int
) -> None:
    """With ``newest``, the cache holds exactly the ``newest`` latest rounds put of each
    fragment (an older one put late is not kept), whatever the order and the sizes, and
    counts their bytes; a discard (a merged delta) forgets its key."""
    cache: FragmentCache[str, np.ndarray] = FragmentCache(1 << 30, newest)
    held: dict[int, set[int]] = {f: set() for f in range(3)}  # the rule, stated directly
    for fragment, round_, size, discard in puts:
        key = f"{fragment}/{round_}"
        cache.put(key, np.zeros(size, dtype=np.uint8), (fragment, round_))
        held[fragment] = set(sorted(held[fragment] | {round_}, reverse=True)[:newest])
        if discard:
            cache.discard(key)
            held[fragment].discard(round_)
        values = {(f, r): cache.get(f"{f}/{r}") for f in range(3) for r in range(7)}
        assert {k for k, v in values.items() if v is not None} == {
            (f, r) for f, rounds in held.items() for r in rounds
        }
        assert cache.nbytes == sum(v.nbytes for v in values.values() if v is not None)
