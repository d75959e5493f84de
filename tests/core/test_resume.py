"""When a node saves its resume state (gm_core.resume): at most once per ``every`` rounds
of commits, and never later than the first commit boundary that completes them."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gm_core import resume

# Rounds a node folds in, boundary by boundary: nondecreasing (a boundary may bring no
# new commit), with jumps (a node that was behind aligns several rounds at once).
jumps = st.lists(st.integers(0, 9), min_size=1, max_size=60)


def saves(start: int, steps: list[int], every: int) -> list[int]:
    """The rounds at which a node that joined at ``start`` saves, driven like the session."""
    saved, aligned, out = start, start, []
    for jump in steps:
        aligned += jump
        if resume.due(aligned, saved, every):
            saved = aligned
            out.append(aligned)
    return out


@given(st.integers(-1, 50), jumps, st.integers(1, 8))
def test_saves_are_at_least_every_rounds_apart(start: int, steps: list[int], every: int) -> None:
    rounds = [start, *saves(start, steps, every)]
    assert all(b - a >= every for a, b in itertools.pairwise(rounds))


@given(st.integers(-1, 50), jumps, st.integers(1, 8))
def test_no_boundary_is_left_behind_by_a_whole_interval(
    start: int, steps: list[int], every: int
) -> None:
    # After every boundary, the newest save is less than ``every`` rounds behind.
    saved, aligned = start, start
    for jump in steps:
        aligned += jump
        if resume.due(aligned, saved, every):
            saved = aligned
        assert aligned - saved < every


def test_one_save_per_sync_cycle_by_default() -> None:
    every = resume.every_rounds(None, fragments=4)
    assert every == 4
    assert saves(-1, [1] * 12, every) == [3, 7, 11]
    assert resume.every_rounds(1, fragments=4) == 1


@pytest.mark.parametrize("bad", [0, -3])
def test_an_interval_below_one_round_is_misuse(bad: int) -> None:
    with pytest.raises(ValueError, match="at least 1"):
        resume.every_rounds(bad, fragments=2)
