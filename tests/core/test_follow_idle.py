"""A learner told to follow that stops training while it stays live: what closes its round.

The rare stall of ``tests/runtime/test_follow_session.py`` (the fast learners' StalledError
"waiting for round 28, newest aligned round 25", about 1 run in 20 under load): the slow
learner ``n2`` read round 26's ``follow`` marker just after its last training step, then
waited for the others with its session open. A marker makes a learner publish at its
*next* step (the capture is of an exact step count, spec/protocol.md §7.5), and there was
none: round 26 had its quorum (one fast snapshot) and a live learner unreported, so it
stayed open for the whole fixed grace window, 60 s, longer than the fast learners' stall
timeout, 30 s. The protocol did what it says; the test stopped training without leaving.

Here the same moment on the model cluster (the real machines, every invariant checked at
every tick): the round waits for the idle learner until the grace window runs out, and
closes at once, with the learner's steps, when the learner closes (its flush publishes
the round; its lease is released).
"""

from __future__ import annotations

import random

import pytest
from fast_cluster import FAST_C, FAST_L, C, L

from gm_core import cluster as cl
from gm_core.records import AlgorithmConfig, Alignment

CONFIG = AlgorithmConfig(
    sync_every=8,
    fragments=2,
    quorum=1,
    in_flight=2,
    grace_seconds=60.0,
    follow=1,
    alignment=Alignment.CARRY,
    lease_timeout_s=3.0,
    takeover_floor_s=4.0,
)
"""The runtime test's: quorum 1, in_flight 2, a fixed grace window of 60 s, follow 1, its
lease timeout (the leader lists the leases once per timeout: ``n2`` is known, hence waited
for, within 3 s of joining), and the session's alignment, carry (under overwrite, at
``in_flight = P``, a stalled fast learner's snapshots hold zero steps and are rejected,
§14.2, so no marker is ever written)."""
ROLES = {"n0": frozenset({L, C}), "n1": frozenset({L, C}), "n2": frozenset({L})}
FAST, SLOW = ("n0", "n1"), "n2"
TICK_S = 0.25


def step(c: cl.Cluster, rng: random.Random, trains: tuple[str, ...]) -> cl.Cluster:
    """One tick of a fair schedule: deliver everything in a random order, fire timers, train
    ``trains`` one step each, let a quarter second pass; the invariants hold throughout."""
    while c.inflight:
        c = cl.deliver(c, rng.randrange(len(c.inflight)))
    for name, machine in cl.due_timers(c):
        c = cl.fire(c, name, machine)
    for name in trains:
        c = cl.train(c, name, 1)
    c = cl.tick(c, TICK_S)
    assert not cl.check(c), cl.check(c)
    return c


def idle_after_a_marker(seed: int) -> tuple[cl.Cluster, int, random.Random]:
    """The slow learner trains a step every fourth tick until, well into the run, it has read
    a marker and not yet taken the step that publishes it; then it trains no more."""
    rng = random.Random(seed)
    c = cl.create(CONFIG, ROLES, learner_options=FAST_L, closer_options=FAST_C)
    for name in sorted(ROLES):
        c = cl.start(c, name)
    for tick in range(400):
        state = c.nodes[SLOW].learner
        assert state is not None
        if tick >= 60 and state.follow_round >= 0:
            return c, state.follow_round, rng
        c = step(c, rng, FAST if tick % 4 else (*FAST, SLOW))
    raise AssertionError("the slow learner never read a marker")


def committed(c: cl.Cluster) -> dict[int, frozenset[str]]:
    return {r.round: frozenset(p.learner for p in r.participants) for r in cl.records(c)}


@pytest.mark.parametrize("seed", range(2))
def test_an_idle_learner_holds_its_followed_round_for_the_grace_window(seed: int) -> None:
    c, round_, rng = idle_after_a_marker(seed)
    assert round_ not in committed(c)
    # 40 s: past the runtime's 30 s stall timeout, short of the 60 s window.
    for _ in range(int(40 / TICK_S)):
        c = step(c, rng, FAST)
    assert round_ not in committed(c), "the round waits for the live learner it told to follow"
    assert all(not cl.can_train(c, name) for name in FAST), "the fast learners are stalled"
    for _ in range(int(25 / TICK_S)):
        c = step(c, rng, FAST)
    assert SLOW not in committed(c)[round_], "closed by the grace window, without the idle one"


@pytest.mark.parametrize("seed", range(2))
def test_an_idle_learner_that_leaves_lets_its_followed_round_close_at_once(seed: int) -> None:
    c, round_, rng = idle_after_a_marker(seed)
    c = cl.close(c, SLOW)
    for _ in range(int(5 / TICK_S)):
        c = step(c, rng, FAST)
    assert SLOW in committed(c).get(round_, frozenset()), "its flush published the round"
    assert max(committed(c)) >= round_ + 2, "the fast learners train on, without it"
