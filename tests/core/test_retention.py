"""Property tests for gm_core.retention: what the sweeper may delete behind the commit."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gm_core.retention import KEEP_CYCLES, new_swept_below, sweepable_rounds

ROUND = st.integers(0, 500)
P = st.integers(1, 16)
PINS = st.frozensets(st.integers(0, 500), max_size=8)
MAX = st.none() | st.integers(1, 50)


@given(ROUND, P, ROUND, PINS, MAX)
def test_sweep_respects_window_and_pins(
    committed: int, p: int, swept_below: int, pinned: frozenset[int], max_rounds: int | None
) -> None:
    rounds = sweepable_rounds(
        committed_round=committed,
        fragments=p,
        swept_below=swept_below,
        pinned=pinned,
        max_rounds=max_rounds,
    )
    mark = new_swept_below(
        committed_round=committed,
        fragments=p,
        swept_below=swept_below,
        pinned=pinned,
        max_rounds=max_rounds,
    )
    assert all(swept_below <= q <= committed - KEEP_CYCLES * p for q in rounds)
    assert not set(rounds) & pinned
    # Contiguous from the old mark, ending at the new one.
    assert rounds == tuple(range(swept_below, mark))
    assert mark >= swept_below
    assert not any(swept_below <= q < mark for q in pinned)
    if max_rounds is not None:
        assert len(rounds) <= max_rounds


@given(ROUND, P, ROUND, PINS)
def test_sweep_goes_as_far_as_allowed(
    committed: int, p: int, swept_below: int, pinned: frozenset[int]
) -> None:
    # Without a bound the mark stops only at the keep window or the first pin.
    mark = new_swept_below(
        committed_round=committed, fragments=p, swept_below=swept_below, pinned=pinned
    )
    limit = committed - KEEP_CYCLES * p + 1
    blockers = [q for q in pinned if swept_below <= q < limit]
    assert mark == max(swept_below, min([limit, *blockers]))


def test_sweep_example() -> None:
    # P=4: after round 20 commits, rounds up to 12 may go; round 7 is pinned.
    kwargs = {"committed_round": 20, "fragments": 4, "swept_below": 3}
    assert sweepable_rounds(**kwargs, pinned=frozenset()) == tuple(range(3, 13))
    assert sweepable_rounds(**kwargs, pinned=frozenset({7, 15})) == (3, 4, 5, 6)
    assert new_swept_below(**kwargs, pinned=frozenset({7})) == 7


@st.composite
def histories(draw: st.DrawFn) -> tuple[int, list[int], list[tuple[int, int, int]], int | None]:
    """P, commit rounds in order, pins (round, from commit, until commit), a sweep bound."""
    p = draw(P)
    commits = sorted(draw(st.lists(st.integers(0, 300), min_size=1, max_size=40)))
    pins = draw(
        st.lists(
            st.tuples(st.integers(0, 300), st.integers(0, 300), st.integers(0, 300)), max_size=6
        )
    )
    return p, commits, pins, draw(MAX)


@given(histories())
def test_repeated_sweeps_delete_every_unpinned_round_exactly_once(
    history: tuple[int, list[int], list[tuple[int, int, int]], int | None],
) -> None:
    p, commits, pins, max_rounds = history
    mark = 0
    swept: list[int] = []

    def pinned_at(committed: int) -> frozenset[int]:
        return frozenset(q for q, start, end in pins if start <= committed < end)

    def sweep(committed: int) -> None:
        nonlocal mark
        pinned = pinned_at(committed)
        rounds = sweepable_rounds(
            committed_round=committed,
            fragments=p,
            swept_below=mark,
            pinned=pinned,
            max_rounds=max_rounds,
        )
        assert not set(rounds) & pinned
        assert all(q <= committed - KEEP_CYCLES * p for q in rounds)
        swept.extend(rounds)
        mark = new_swept_below(
            committed_round=committed,
            fragments=p,
            swept_below=mark,
            pinned=pinned,
            max_rounds=max_rounds,
        )

    for committed in commits:
        sweep(committed)
    assert len(swept) == len(set(swept))  # never twice
    # Once every pin is released, further commits sweep everything behind the window.
    final = max(300, commits[-1]) + 1
    while mark <= final - KEEP_CYCLES * p:
        sweep(final)
    assert sorted(swept) == list(range(final - KEEP_CYCLES * p + 1))
    assert len(swept) == len(set(swept))


@given(st.integers(max_value=-1), st.integers(max_value=0))
def test_misuse_raises(bad: int, bad_count: int) -> None:
    ok = {"committed_round": 10, "fragments": 2, "swept_below": 0, "pinned": frozenset[int]()}
    for field, value in [
        ("committed_round", bad),
        ("fragments", bad_count),
        ("swept_below", bad),
        ("max_rounds", bad_count),
    ]:
        with pytest.raises(ValueError, match=field):
            sweepable_rounds(**{**ok, field: value})  # type: ignore[arg-type]
        with pytest.raises(ValueError, match=field):
            new_swept_below(**{**ok, field: value})  # type: ignore[arg-type]
