"""Property tests for gm_core.schedule: the round ↔ step arithmetic every node must agree on."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gm_core.schedule import (
    first_round_after,
    fragment_of,
    gap_of,
    rounds_between,
    rounds_due,
    step_of,
)

H = st.integers(min_value=1, max_value=300)
P = st.integers(min_value=1, max_value=64)
ROUND = st.integers(min_value=0, max_value=10**6)
STEP = st.integers(min_value=0, max_value=10**6)


def reference_step(round: int, sync_every: int, fragments: int) -> int:
    # Independent formulation: the (r+1)-th of P evenly spaced points per H steps.
    return ((round + 1) * sync_every) // fragments


@given(ROUND, P)
def test_fragment_of_takes_turns(r: int, p: int) -> None:
    assert 0 <= fragment_of(r, p) < p
    assert fragment_of(r, p) == r % p
    assert fragment_of(r + p, p) == fragment_of(r, p)


@given(ROUND, H, P)
def test_step_of_matches_reference(r: int, h: int, p: int) -> None:
    assert step_of(r, h, p) == reference_step(r, h, p)


def test_step_of_examples() -> None:
    # H=10, P=4: the four fragments fall at 2, 5, 7, 10, then 12, 15, 17, 20.
    assert [step_of(r, 10, 4) for r in range(8)] == [2, 5, 7, 10, 12, 15, 17, 20]
    # H=1, P=3: rounds 0 and 1 are due at step 0, round 2 at step 1.
    assert [step_of(r, 1, 3) for r in range(6)] == [0, 0, 1, 1, 1, 2]


@given(ROUND, H, P)
def test_each_fragment_once_per_cycle(r: int, h: int, p: int) -> None:
    # Round r+P syncs the same fragment exactly H steps later.
    assert step_of(r + p, h, p) == step_of(r, h, p) + h
    assert fragment_of(r + p, p) == fragment_of(r, p)


@given(ROUND, H, P)
def test_step_of_monotone(r: int, h: int, p: int) -> None:
    assert step_of(r + 1, h, p) >= step_of(r, h, p)
    if h >= p:
        assert step_of(r + 1, h, p) > step_of(r, h, p)


@given(ROUND, H, P)
def test_gaps_over_a_cycle_sum_to_h(r: int, h: int, p: int) -> None:
    assert sum(gap_of(q, h, p) for q in range(r, r + p)) == h


@given(ROUND, H, P)
def test_gap_is_floor_or_ceil_of_h_over_p(r: int, h: int, p: int) -> None:
    gap = gap_of(r, h, p)
    assert gap in {h // p, -(-h // p)}
    previous = 0 if r == 0 else step_of(r - 1, h, p)
    assert gap == step_of(r, h, p) - previous


@given(STEP, H, P)
def test_first_round_after_is_the_next_round(step: int, h: int, p: int) -> None:
    r = first_round_after(step, h, p)
    assert step_of(r, h, p) > step
    assert r == 0 or step_of(r - 1, h, p) <= step


@given(st.integers(0, 60), st.integers(1, 12), st.integers(1, 12))
def test_first_round_after_matches_brute_force(step: int, h: int, p: int) -> None:
    expected = next(r for r in range(10**4) if step_of(r, h, p) > step)
    assert first_round_after(step, h, p) == expected


@given(st.integers(0, 10**18), H, P)
def test_first_round_after_is_constant_time(step: int, h: int, p: int) -> None:
    # A loop over rounds could not finish for steps near 10**18.
    r = first_round_after(step, h, p)
    assert step_of(r, h, p) > step >= (0 if r == 0 else step_of(r - 1, h, p))


@given(st.integers(0, 60), st.integers(1, 12), st.integers(1, 12))
def test_rounds_due_matches_brute_force(step: int, h: int, p: int) -> None:
    expected = tuple(r for r in range(2000) if step_of(r, h, p) == step)
    assert rounds_due(step, h, p) == expected


@given(STEP, H, P)
def test_rounds_due_are_due_at_step(step: int, h: int, p: int) -> None:
    due = rounds_due(step, h, p)
    assert all(step_of(r, h, p) == step for r in due)
    assert list(due) == sorted(due)
    if h >= p:
        assert len(due) <= 1
    # Several rounds share a step only when H < P; never more than a cycle's worth.
    assert len(due) <= -(-p // h)


@given(st.integers(-1, 10**5), st.integers(0, 500), H, P)
def test_rounds_between_is_union_of_rounds_due(a: int, width: int, h: int, p: int) -> None:
    b = a + width
    expected = [r for s in range(a + 1, b + 1) for r in rounds_due(s, h, p)]
    assert list(rounds_between(a, b, h, p)) == expected


@given(st.integers(0, 10**6), H, P)
def test_any_window_of_h_steps_syncs_every_fragment_once(a: int, h: int, p: int) -> None:
    # Windows (a, a+H] of steps a learner actually takes; step 0 is where it starts.
    crossed = rounds_between(a, a + h, h, p)
    assert sorted(fragment_of(r, p) for r in crossed) == list(range(p))


@given(st.integers(-(10**6), 0), st.integers(-(10**3), 0), st.integers(-(10**3), 0))
def test_invalid_arguments_raise(bad: int, bad_h: int, bad_p: int) -> None:
    with pytest.raises(ValueError, match="sync_every"):
        step_of(0, bad_h, 4)
    with pytest.raises(ValueError, match="fragments"):
        step_of(0, 4, bad_p)
    with pytest.raises(ValueError, match="fragments"):
        fragment_of(0, bad_p)
    with pytest.raises(ValueError, match="sync_every"):
        first_round_after(0, bad_h, 4)
    with pytest.raises(ValueError, match="fragments"):
        rounds_due(0, 4, bad_p)
    if bad < 0:
        with pytest.raises(ValueError, match="round"):
            step_of(bad, 4, 4)
        with pytest.raises(ValueError, match="round"):
            gap_of(bad, 4, 4)
        with pytest.raises(ValueError, match="round"):
            fragment_of(bad, 4)
        with pytest.raises(ValueError, match="step"):
            first_round_after(bad, 4, 4)
        with pytest.raises(ValueError, match="step"):
            rounds_due(bad, 4, 4)
    if bad < -1:
        with pytest.raises(ValueError, match="after_step"):
            rounds_between(bad, 0, 4, 4)
    with pytest.raises(ValueError, match="through_step"):
        rounds_between(5, 4, 4, 4)
