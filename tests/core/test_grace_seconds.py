"""A fixed grace window (``grace_seconds``, issue 13 item 6): the reference package's knob.

The adaptive window is 0 until the run has measured its step time (the first rounds close
at quorum); a fixed one holds every round open for its seconds after quorum, from the
first, unless every live learner is in before. Driven on the model cluster, where the
invariants (``grace_bounds`` among them) are checked after every move.
"""

from __future__ import annotations

import random

import attrs
import pytest
from fast_cluster import FAST_C, FAST_L, C, L, paced

from gm_core import cluster as cl
from gm_core.records import AlgorithmConfig, Alignment

ROLES = {"n0": frozenset({L, C}), "n1": frozenset({L}), "n2": frozenset({L})}
CONFIG = AlgorithmConfig(sync_every=4, fragments=2, quorum=1)


def run(config: AlgorithmConfig, ticks: int = 300) -> cl.Cluster:
    """n0 and n1 train a step every tick; n2 one every 16 ticks, so the first round has
    quorum long before every live learner is in: it is held open for its whole window."""
    rng = random.Random(2)
    c = cl.create(config, ROLES, learner_options=FAST_L, closer_options=FAST_C)
    for name in sorted(ROLES):
        c = cl.start(c, name)
    return paced(c, ticks, rng, ("n0", "n1"), "n2", every=16)


@pytest.mark.parametrize("seconds", [0.0, 3.0])
def test_every_round_waits_the_fixed_window_after_quorum(seconds: float) -> None:
    c = run(attrs.evolve(CONFIG, grace_seconds=seconds))
    records = cl.records(c)
    assert len(records) >= 4
    # Round 0 waits the whole window (unmeasured: the adaptive one would be 0); later rounds
    # wait at most that long (less when the closer sees n2 cannot make the round).
    assert records[0].grace_s == seconds
    assert max(r.grace_s for r in records) == seconds
    assert cl.check(c) == []  # grace_bounds: never more than the window


def test_the_adaptive_window_is_zero_until_measured() -> None:
    """The contrast: without ``grace_seconds`` the first round closes at quorum."""
    records = cl.records(run(CONFIG))
    assert records[0].grace_s == 0.0
    assert len({r.grace_s for r in records}) > 1  # then measured, and it follows the run


def test_a_follower_does_not_take_over_a_live_leader_in_its_fixed_window() -> None:
    """n1 closes too and follows n0. A round held open for its fixed window is a leader
    doing what the run asks, not a stuck one: the takeover timeout counts the window. Before
    (2026-12), a follower bid after ``max(floor, 3·(gap·ξ_step + ξ_quorum + ξ_sync))``
    without a record (4 s here, the floor) and took such rounds over; the new leader then
    waited a window of its own (the runtime's ``test_follow_session``: a round held 64 s)."""
    roles = {**ROLES, "n1": frozenset({L, C})}
    config = attrs.evolve(
        CONFIG, grace_seconds=20.0, takeover_floor_s=4.0, alignment=Alignment.CARRY
    )
    rng = random.Random(2)
    c = cl.create(config, roles, learner_options=FAST_L, closer_options=FAST_C)
    for name in sorted(roles):
        c = cl.start(c, name)
    c = paced(c, 400, rng, ("n0", "n1"), "n2", every=16)
    records = cl.records(c)
    # Each round waits for n2 (a step every 4 s) in its window, longer than the floor.
    assert len([r for r in records if r.grace_s > config.takeover_floor_s]) >= 5
    assert not [(n, x.round) for n, x in c.notes if x.kind == "took_over"]
    assert cl.check(c) == []
