"""Publishing early (``follow``, issue 13 item 6): a learner behind the others publishes a
round once the leader has accepted ``follow`` other learners' snapshots in it.

The pure parts (:mod:`gm_core.follow`: the threshold and the marker's codec) are
property-tested; the machines are driven on the model cluster, where every invariant is
checked: a slow learner under a long fixed grace window holds every round open without
``follow``, and keeps the fast learners' pace with it.
"""

from __future__ import annotations

import random

import attrs
import pytest
from fast_cluster import FAST_C, FAST_L, C, L, paced
from hypothesis import given
from hypothesis import strategies as st

from gm_core import cluster as cl
from gm_core import follow, keys
from gm_core.records import AlgorithmConfig


@given(st.integers(-3, 10), st.integers(0, 10))
def test_the_threshold_is_follow_capped_by_the_other_live_learners(f: int, live: int) -> None:
    got = follow.threshold(f, live)
    if f <= 0 or live < 2:
        assert got is None
    else:
        assert got is not None
        assert 1 <= got <= live - 1
        assert got == min(f, live - 1)


@given(st.integers(0, keys.ROUND_LIMIT - 1), st.integers(1, 2**40))
def test_a_marker_reads_back_at_its_own_round_only(round_: int, accepted: int) -> None:
    body = follow.encode(round_, accepted)
    assert follow.decode(body, round_) == accepted
    assert follow.decode(body, round_ + 1) is None


@given(st.binary(max_size=300) | st.text(max_size=300).map(str.encode))
def test_any_bytes_decode_or_are_refused(body: bytes) -> None:
    got = follow.decode(body, 3)
    assert got is None or (isinstance(got, int) and got >= 1)


@pytest.mark.parametrize(
    "body",
    [
        b'{"accepted":0,"format":1,"round":3}',
        b'{"accepted":2,"format":2,"round":3}',
        b'{"accepted":true,"format":1,"round":3}',
        b'{"accepted":2,"format":1,"round":3,"x":0}',
        b'{"accepted":2,"format":1,"round":"3"}',
        b"[]",
        b" " * 300,
    ],
)
def test_garbage_markers_are_refused(body: bytes) -> None:
    assert follow.decode(body, 3) is None


# --- on the model cluster -------------------------------------------------------------------

ROLES = {"n0": frozenset({L, C}), "n1": frozenset({L}), "n2": frozenset({L})}
CONFIG = AlgorithmConfig(sync_every=8, fragments=2, quorum=1, in_flight=3, grace_seconds=60.0)
"""A fixed grace window far longer than the run: a round closes once every live learner is in."""


def run(
    config: AlgorithmConfig,
    ticks: int = 120,
    garbage: tuple[int, ...] = (),
    *,
    sound: bool = True,
    slow: str = "n2",
) -> cl.Cluster:
    """Two learners train a step every tick, ``slow`` one every fourth; ``garbage`` rounds'
    marker keys hold an outsider's bytes from the start; ``sound``: no invariant broken."""
    rng = random.Random(3)
    c = cl.create(config, ROLES, learner_options=FAST_L, closer_options=FAST_C)
    for round_ in garbage:
        c = cl.inject(c, keys.follow(round_), b'{"accepted":1,"format":1,"round":-1}')
    for name in sorted(ROLES):
        c = cl.start(c, name)
    c = paced(c, ticks, rng, sorted(set(ROLES) - {slow}), slow, every=4)
    if sound:
        assert cl.check(c) == []
    return c


def followed(c: cl.Cluster, name: str) -> list[int]:
    return [x.round for n, x in c.notes if n == name and x.kind == "following"]


def test_a_slow_learner_keeps_the_pace_of_the_others() -> None:
    slow = cl.records(run(CONFIG))
    c = run(attrs.evolve(CONFIG, follow=1))
    fast = cl.records(c)
    # Without follow every round waits for n2's steps; with it, n2 publishes each round as
    # soon as n0 or n1 has, and the rounds go at their pace (the run is far shorter than
    # its grace window, so no round closes by the window).
    assert len(fast) >= 2 * len(slow)
    assert all(len(r.participants) == 3 for r in fast[1:])
    assert len(followed(c, "n2")) >= len(fast) // 2
    assert not followed(c, "n0")  # nobody is ahead of the fast learners to follow
    # Published early, with the steps it had: on schedule a fragment's snapshot holds
    # sync_every steps (a fast learner's do); n2's hold fewer, about a round's gap. (Up to
    # session 12 the model cluster moved a learner's step count back to a barrier it had
    # passed, and n2's held under the gap every time; without that, one holds 5.)
    gap = CONFIG.sync_every // CONFIG.fragments
    n2_steps = [p.steps for r in fast[1:] for p in r.participants if p.learner == "n2"]
    assert max(n2_steps) < CONFIG.sync_every
    assert sum(n2_steps) / len(n2_steps) < gap
    # Markers are swept with their rounds' snapshots.
    markers = [k for k in c.store.objects if k.startswith(keys.FOLLOW_PREFIX)]
    assert len(markers) < len(fast) // 2


def test_a_slow_learner_on_the_leaders_own_node_is_followed_into_rounds() -> None:
    """n0 leads every round and its own learner is the slow one. Its closer once knew its own
    learner only from a snapshot landing while the round was open: with ``follow`` the rounds
    closed once n1 and n2 were in, n0's learner read each marker, published, and found the
    round closed, so it was in none of them (the model cluster: 0 of 29 rounds, every one
    followed). The leader now counts its own learner live until it has looked at its lease,
    and looks once another learner has reported in a round its own has not."""
    c = run(attrs.evolve(CONFIG, follow=1), slow="n0")
    records = cl.records(c)
    assert len(records) >= 10
    assert all("n0" in {p.learner for p in r.participants} for r in records[1:])
    assert len(followed(c, "n0")) >= len(records) // 2
    assert not followed(c, "n1")


def test_follow_2_waits_for_both_fast_learners() -> None:
    c = run(attrs.evolve(CONFIG, follow=2))
    records = {r.round: r for r in cl.records(c)}
    rounds = [r for r in followed(c, "n2") if r in records]
    assert len(rounds) >= 3
    for round_ in rounds:
        assert {"n0", "n1"} <= {p.learner for p in records[round_].participants}


def test_a_garbage_marker_publishes_nothing_early() -> None:
    """An outsider's object at a round's marker key is not the leader's: that round waits
    for n2's own schedule (the leader's write finds the key taken), the others do not."""
    c = run(attrs.evolve(CONFIG, follow=1), garbage=(3, 4))
    rounds = followed(c, "n2")
    assert rounds
    assert not {3, 4} & set(rounds)
    assert {3, 4} < {r.round for r in cl.records(c)}  # closed once n2 came on schedule


# --- follow's invariants (spec/invariants.md 16, 17): planted bugs are found ----------------


def broken(c: cl.Cluster, invariant: str) -> list[str]:
    return [v.message for v in cl.check(c) if v.invariant == invariant]


def test_a_marker_written_below_the_threshold_is_found(monkeypatch: pytest.MonkeyPatch) -> None:
    """Planted: the leader writes the marker once one snapshot is in, whatever ``follow``
    says; with ``follow=2`` and three learners live the invariant wants two accepted."""
    monkeypatch.setattr(follow, "threshold", lambda f, live: 1 if f > 0 and live > 1 else None)
    c = run(attrs.evolve(CONFIG, follow=2), sound=False)
    found = broken(c, "follow_marker_written")
    assert found, cl.check(c)
    assert "n0 wrote its follow marker: 1 accepted with a snapshot of 3 known" in found[0]
    assert {v.invariant for v in cl.check(c)} == {"follow_marker_written"}


def test_a_learner_that_takes_any_object_for_a_marker_is_found(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Planted: any object at the marker key counts; an outsider's bytes at rounds 3 and 4
    then make n2 publish early, which only a marker the run's closer wrote may."""
    monkeypatch.setattr(follow, "decode", lambda body, round_: 1)
    c = run(attrs.evolve(CONFIG, follow=1), garbage=(3, 4), sound=False)
    found = broken(c, "follow_after_marker")
    assert "n2 publishes round 3 early without a valid follow marker" in found, cl.check(c)
    assert {v.invariant for v in cl.check(c)} == {"follow_after_marker"}
