"""Property tests for gm_core.liveness: leases judged by ETag changes on the observer's clock."""

from __future__ import annotations

import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gm_core.liveness import (
    COLLECT_AFTER_TIMEOUTS,
    LeaseView,
    collectable,
    is_live,
    next_seq,
    observe,
    verified,
)

ETAG = st.none() | st.text(alphabet="abc", min_size=1, max_size=3)
TIME = st.integers(0, 10**6).map(float)  # integral floats: differences are exact
TIMEOUT = st.integers(0, 1000).map(float)
VIEW = st.none() | st.builds(LeaseView, etag=ETAG, changed_at_s=TIME)


@given(VIEW, ETAG, TIME)
def test_observe_resets_only_on_change(
    view: LeaseView | None, etag: str | None, now: float
) -> None:
    seen = observe(view, etag, now)
    assert seen.etag == etag
    if view is not None and view.etag == etag:
        assert seen == view  # same ETag: the lease keeps ageing
    else:
        assert seen.changed_at_s == now


@given(VIEW, TIME, TIMEOUT)
def test_absent_lease_is_not_live(view: LeaseView | None, now: float, timeout: float) -> None:
    assert not is_live(None, now, timeout)
    assert not is_live(LeaseView(etag=None, changed_at_s=now), now, timeout)
    assert not is_live(observe(view, None, now), now, timeout)


@given(st.lists(st.tuples(st.integers(0, 100), ETAG), max_size=30), TIMEOUT)
def test_live_iff_present_and_changed_within_timeout(
    looks: list[tuple[int, str | None]], timeout: float
) -> None:
    # Replay a sequence of looks; compare with the definition computed from the history.
    view: LeaseView | None = None
    now = 0.0
    last_change: float | None = None
    previous: object = object()  # differs from every ETag, so the first look is a change
    for delay, etag in looks:
        now += delay
        view = observe(view, etag, now)
        if etag != previous:
            last_change = now
            previous = etag
        assert last_change is not None
        expected = etag is not None and now - last_change <= timeout
        assert is_live(view, now, timeout) == expected


@given(st.text(min_size=1), TIME, TIMEOUT, st.lists(st.integers(0, 1000), max_size=50))
def test_a_lease_that_keeps_changing_stays_live(
    first: str, start: float, timeout: float, delays: list[int]
) -> None:
    view = observe(None, first, start)
    now = start
    for seq, delay in enumerate(delays):
        now += min(delay, timeout)  # renewed at least once per timeout
        view = observe(view, f"{first}-{seq}", now)
        assert is_live(view, now, timeout)


@given(st.text(min_size=1), TIME, TIMEOUT, st.lists(st.integers(0, 100), max_size=20))
def test_a_lease_that_stops_goes_stale_exactly_after_timeout(
    etag: str, start: float, timeout: float, looks: list[int]
) -> None:
    view = observe(None, etag, start)
    now = start
    for delay in looks:  # looking again at an unchanged lease does not refresh it
        now += delay
        view = observe(view, etag, now)
    assert view.changed_at_s == start
    assert is_live(view, start + timeout, timeout)
    assert not is_live(view, start + timeout + 1.0, timeout)


@given(VIEW, ETAG, TIME, TIMEOUT)
def test_clock_is_never_read(
    view: LeaseView | None, etag: str | None, now: float, timeout: float
) -> None:
    def no_clock() -> float:
        raise AssertionError("liveness read the clock")

    with pytest.MonkeyPatch.context() as patch:
        for name in ("time", "monotonic", "perf_counter", "time_ns", "monotonic_ns"):
            patch.setattr(time, name, no_clock)
        seen = observe(view, etag, now)
        live = is_live(seen, now, timeout)
    # And the answer depends only on the arguments.
    assert observe(view, etag, now) == seen
    assert is_live(seen, now, timeout) == live


@given(VIEW, TIME, st.floats(max_value=-1e-9))
def test_negative_timeout_raises(view: LeaseView | None, now: float, timeout: float) -> None:
    with pytest.raises(ValueError, match="timeout_s"):
        is_live(view, now, timeout)


@given(changed_at_s=TIME, timeout_s=st.integers(1, 1000).map(float), later_s=TIME, more_s=TIME)
def test_a_collectable_lease_is_dead_and_stays_collectable(
    changed_at_s: float, timeout_s: float, later_s: float, more_s: float
) -> None:
    view = LeaseView(etag="e1", changed_at_s=changed_at_s)
    now_s = changed_at_s + later_s
    if collectable(view, now_s, timeout_s):
        assert not is_live(view, now_s, timeout_s)
        assert collectable(view, now_s + more_s, timeout_s)
    # Exactly the stated bound: collectable once unchanged for COLLECT_AFTER_TIMEOUTS.
    bound_s = COLLECT_AFTER_TIMEOUTS * timeout_s
    assert collectable(view, changed_at_s + bound_s, timeout_s)
    assert not collectable(view, changed_at_s + bound_s - 1.0, timeout_s)
    assert not collectable(None, now_s, timeout_s)
    assert not collectable(LeaseView(etag=None, changed_at_s=0.0), now_s, timeout_s)


SEQ = st.none() | st.integers(0, 20)


@given(st.lists(st.tuples(st.integers(0, 100), ETAG, SEQ), max_size=30), TIMEOUT)
def test_verified_renews_only_on_a_newer_authentic_lease(
    looks: list[tuple[int, str | None, int | None]], timeout: float
) -> None:
    """Replay looks at a read lease (ETag, sequence number or None for a refused body) and
    compare with the rule of spec/protocol.md §16.6, stated from the history."""
    view: LeaseView | None = None
    now = 0.0
    held: str | None = None  # the ETag the observer holds (None: no lease)
    accepted: int | None = None  # the last sequence number accepted
    renewed_at = 0.0
    for delay, etag, seq in looks:
        now += delay
        view = verified(view, etag, None if etag is None else seq, now)
        if etag is None:
            held, accepted = None, None
        elif etag != held:
            if accepted is None:  # first sight (or after an absence): any authentic lease
                if seq is not None:
                    held, accepted, renewed_at = etag, seq, now
            else:
                held = etag
                if seq is not None and seq > accepted:
                    accepted, renewed_at = seq, now
        assert view.etag == held
        expected = held is not None and now - renewed_at <= timeout
        assert is_live(view, now, timeout) == expected


@given(st.none() | st.integers(0, 10**12), st.lists(st.integers(0, 10**6), max_size=20))
def test_lease_sequence_numbers_rise_with_every_write(epoch: int | None, delays: list[int]) -> None:
    last, now = -1, 0.0
    for delay in delays:
        now += delay / 1000
        seq = next_seq(last, epoch, now)
        assert seq > last
        if epoch is None:
            assert seq == last + 1
        else:
            assert seq >= epoch + int(now * 1_000_000)
        last = seq


def test_a_restarted_writer_continues_above_its_last_lease() -> None:
    """With the shell's epoch (wall clock minus monotonic clock) the sequence is the wall
    clock: the node restarted on another machine, whose monotonic clock is far behind, with
    a fresh count, writes above what the old process wrote."""
    us = 1_000_000
    wall = 1_700_000_000 * us
    old, old_epoch = -1, wall - 1000 * us  # the old process's monotonic clock read 1,000 s
    for mono in (1000.0, 1001.0, 1002.0):
        old = next_seq(old, old_epoch, mono)
    new_epoch = wall + 10 * us - 5 * us  # 10 s later, on a machine up for 5 s
    assert next_seq(-1, new_epoch, 5.0) > old
