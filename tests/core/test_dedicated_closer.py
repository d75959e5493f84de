"""A dedicated closer (a node that only closes rounds) is preferred as leader while it is live.

The node committing a round names it ``next_closer`` once it has seen the closer's lease
change on its own clock (:func:`gm_core.election.next_closer`); when it crashes, a follower
takes the round over and, its lease no longer changing, nobody names it again.
"""

from __future__ import annotations

import random

from fast_cluster import FAST_C, FAST_L, C, L, drive

from gm_core import cluster as cl
from gm_core.election import PREFER_WINDOW_TIMEOUTS
from gm_core.records import AlgorithmConfig

CONFIG = AlgorithmConfig(
    sync_every=8, fragments=2, quorum=2, in_flight=2, lease_timeout_s=4.0, takeover_floor_s=6.0
)
ROLES = {"a": frozenset({L, C}), "b": frozenset({L}), "d": frozenset({C})}
"""``a`` creates the run and so leads round 0; ``d`` only closes rounds."""


def _started() -> cl.Cluster:
    c = cl.create(CONFIG, ROLES, learner_options=FAST_L, closer_options=FAST_C)
    for name in sorted(ROLES):
        c = cl.start(c, name)
    return c


def test_the_leader_hands_the_rounds_to_a_live_dedicated_closer() -> None:
    c = drive(_started(), 160, random.Random(5))
    records = cl.records(c)
    assert records[0].closer == "a"
    handed = [r.round for r in records if r.closer == "a" and r.next_closer == "d"]
    assert handed, [(r.closer, r.next_closer) for r in records]
    after = [r for r in records if r.round > handed[0]]
    assert len(after) >= 3, len(after)
    assert all(r.closer == "d" and r.next_closer == "d" for r in after)


def test_a_crashed_dedicated_closer_is_taken_over_and_no_longer_named() -> None:
    rng = random.Random(11)
    c = drive(_started(), 160, rng)
    assert cl.records(c)[-1].next_closer == "d"
    crashed_at_s, crashed_round = c.now_s, cl.records(c)[-1].round
    c = cl.crash(c, "d")
    c = drive(c, 240, rng)
    later = [r for r in cl.records(c) if r.round > crashed_round]
    assert later
    assert later[0].claim > 0  # "a" took the round "d" was named for
    # Named again only while "a" could still have seen d's lease change (bounded), never after.
    window_s = PREFER_WINDOW_TIMEOUTS * CONFIG.lease_timeout_s + CONFIG.lease_timeout_s
    quiet = [r for r in later if r.round > crashed_round + 2]
    assert len(quiet) >= 5, len(quiet)
    assert all(r.closer == "a" and r.next_closer == "a" for r in quiet[-5:])
    assert c.now_s - crashed_at_s > window_s


def test_a_leader_that_first_sees_a_dead_closers_lease_does_not_name_it() -> None:
    # d crashes, then a restarts: its fresh closer meets d's leftover lease for the first
    # time. A lease seen once proves nothing, so a must keep the rounds instead of naming d
    # and leaving every round to a takeover.
    rng = random.Random(11)
    c = drive(_started(), 160, rng)
    assert cl.records(c)[-1].next_closer == "d"
    c = cl.crash(c, "d")
    c = drive(c, 60, rng)  # a takes the rounds over from d
    c = cl.start(cl.crash(c, "a"), "a")
    restarted_round = cl.records(c)[-1].round
    c = drive(c, 120, rng)
    later = [r for r in cl.records(c) if r.round > restarted_round]
    assert len(later) >= 3, len(later)
    assert all(r.next_closer != "d" for r in later), [(r.round, r.next_closer) for r in later]


def test_a_closer_taken_over_for_looking_dead_is_not_named_again() -> None:
    # The round d was named for is taken over once; the taker then knows d's lease stale and
    # must not name d for the next rounds. Naming it while d had been seen renewing within
    # the two-timeout window made the next two rounds each wait out another takeover.
    rng = random.Random(11)
    c = drive(_started(), 160, rng)
    crashed_round = cl.records(c)[-1].round
    c = drive(cl.crash(c, "d"), 240, rng)
    later = [r for r in cl.records(c) if r.round > crashed_round]
    assert len(later) >= 5, len(later)
    assert [r.claim > 0 for r in later[:3]] == [True, False, False], [
        (r.round, r.closer, r.next_closer, r.claim) for r in later[:3]
    ]
    assert all(r.next_closer == "a" for r in later)
