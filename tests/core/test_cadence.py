"""Properties of gm_core.cadence: looks thin out before an object is due, never lag by much."""

from __future__ import annotations

import math

from hypothesis import given
from hypothesis import strategies as st

from gm_core import cadence
from gm_core.cadence import Cadence

times = st.floats(0, 1e5, allow_nan=False)
waits = st.floats(0, 1e4, allow_nan=False)
polls = st.floats(0.01, 10, allow_nan=False)


def looks(since_s: float, wait_s: float, poll_s: float, until_s: float) -> list[float]:
    """The looks a poller makes from ``since_s`` (one at once, then as paced) up to ``until_s``."""
    c = cadence.missed(Cadence(since_s=since_s, wait_s=wait_s))
    out = [since_s]
    while out[-1] < until_s:
        out.append(cadence.next_look_s(c, out[-1], poll_s))
    return out


@given(times, polls)
def test_without_an_estimate_every_poll(now_s: float, poll_s: float) -> None:
    assert cadence.next_look_s(Cadence(), now_s, poll_s) == now_s + poll_s
    assert cadence.next_look_s(Cadence(since_s=now_s), now_s, poll_s) == now_s + poll_s


@given(times, waits, times, polls)
def test_never_nearer_than_a_poll(since_s: float, wait_s: float, now_s: float, p: float) -> None:
    c = Cadence(since_s=since_s, wait_s=wait_s)
    assert cadence.next_look_s(c, now_s, p) >= now_s + p


@given(times, waits, st.floats(0, 2e4, allow_nan=False), polls)
def test_found_at_most_half_its_earliness_late(
    since_s: float, wait_s: float, after_s: float, poll_s: float
) -> None:
    """An object arriving at ``a`` is seen by ``a + max(poll, (expected - a) / 2)``."""
    arrival_s = since_s + after_s
    expected_s = since_s + wait_s
    seen_at = next(t for t in looks(since_s, wait_s, poll_s, arrival_s) if t >= arrival_s)
    bound = max(poll_s, (expected_s - arrival_s) / 2)
    assert seen_at - arrival_s <= bound * (1 + 1e-9) + 1e-9


@given(waits, polls)
def test_looks_before_the_expected_moment_are_logarithmic(wait_s: float, poll_s: float) -> None:
    before = [t for t in looks(0.0, wait_s, poll_s, wait_s) if t < wait_s]
    assert len(before) <= 2 + max(math.log2(max(wait_s / poll_s, 1.0)), 0.0)


@given(st.lists(st.floats(0.1, 1e3), min_size=1, max_size=20), times)
def test_the_estimate_stays_within_the_observed_waits(observed: list[float], t0: float) -> None:
    c = cadence.restart(Cadence(), t0)
    now = t0
    for wait in observed:
        now += wait
        c = cadence.seen(cadence.missed(c), now)
    assert c.wait_s is not None
    assert min(observed) * (1 - 1e-9) <= c.wait_s <= max(observed) * (1 + 1e-9)
    assert c.since_s == now
    assert not c.missed


@given(waits, times, st.floats(0, 1e3))
def test_catch_up_sightings_teach_nothing(wait_s: float, t0: float, dt: float) -> None:
    """Found without a miss (a read of what was already there): only the wait restarts."""
    c = Cadence(since_s=t0, wait_s=wait_s)
    assert cadence.seen(c, t0 + dt) == Cadence(since_s=t0 + dt, wait_s=wait_s)
    assert cadence.restart(cadence.missed(c), t0 + dt) == Cadence(since_s=t0 + dt, wait_s=wait_s)


@given(st.floats(1, 1e3), polls)
def test_an_estimate_too_long_shrinks_when_objects_come_early(wait_s: float, p: float) -> None:
    """Objects that are always there at the first paced look pull the estimate down to it."""
    c = cadence.restart(Cadence(wait_s=wait_s), 0.0)
    for _ in range(60):
        c = cadence.missed(c)  # the look at once, right after the previous sighting
        assert c.since_s is not None
        first = cadence.next_look_s(c, c.since_s, p)
        c = cadence.seen(c, first)
    assert c.wait_s is not None
    assert c.wait_s <= 2 * p + 1e-6


@given(times, waits, times, polls, st.floats(0.01, 1e3, allow_nan=False))
def test_never_further_than_the_longest_look(
    since_s: float, wait_s: float, now_s: float, p: float, longest_s: float
) -> None:
    """One outlier wait must not space looks out for as long as it lasted."""
    c = Cadence(since_s=since_s, wait_s=wait_s)
    assert cadence.next_look_s(c, now_s, p, longest_s=longest_s) <= now_s + max(p, longest_s)
    assert cadence.next_look_s(c, now_s, p, longest_s=longest_s) <= cadence.next_look_s(c, now_s, p)
