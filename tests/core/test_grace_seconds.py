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
from gm_core.records import AlgorithmConfig

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
