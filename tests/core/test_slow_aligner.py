"""A learner that aligns commits more slowly than the run makes them (the runtime applies
one commit per training step, and a slow learner's steps are slow) falls more than the
retention window (two cycles, spec/protocol.md §12.3) behind, and the closer sweeps the
payloads of the commits it would align next.

Before: it found them absent (``align_failed`` / ``commit_unusable``: "... is absent"),
re-joined, fell behind again at the same pace and found the next ones swept too: a
re-join loop (tests/runtime/test_follow_session.py under load). Now a commit whose fragment
a newer fetched record commits again is passed over for that one (spec/protocol.md §7.6),
so the learner never asks for a swept payload and joins once.
"""

from __future__ import annotations

import random

import attrs
import pytest
from fast_cluster import FAST_C, FAST_L, C, L

from gm_core import cluster as cl
from gm_core import learner, retention
from gm_core.commands import Align
from gm_core.events import Event
from gm_core.records import AlgorithmConfig

CONFIG = AlgorithmConfig(sync_every=8, fragments=2, quorum=1, in_flight=2, grace_seconds=0.0)
ROLES = {"n0": frozenset({L, C}), "n1": frozenset({L}), "n2": frozenset({L})}
SLOW = "n2"


def slow_aligner(c: cl.Cluster, ticks: int, rng: random.Random, every: int) -> cl.Cluster:
    """Everyone trains a step a tick and every request is delivered at once, as the runtime
    does; but ``SLOW`` applies what its ``Align`` commands fetched only every ``every``
    ticks (the runtime fetches a commit at once and applies it at the next training step,
    and a slow learner's steps are slow), so its machine hears of each alignment late and
    asks for the next one only then. The invariants are checked at every tick."""
    applied: list[tuple[int, Event]] = []  # (incarnation, outcome) fetched, not yet applied
    for tick in range(ticks):
        while c.inflight:
            index = rng.randrange(len(c.inflight))
            item = c.inflight[index]
            if item.node != SLOW or not isinstance(item.command, Align):
                c = cl.deliver(c, index)
                continue
            c = attrs.evolve(c, inflight=c.inflight[:index] + c.inflight[index + 1 :])
            c, outcome = cl._execute(c, c.nodes[SLOW], item.command)
            applied.append((item.incarnation, outcome))
        if tick % every == 0:
            for incarnation, outcome in applied:
                if c.nodes[SLOW].incarnation == incarnation:
                    c = cl._feed(c, SLOW, L, attrs.evolve(outcome, now_s=c.now_s))
            applied = []
        for name, machine in cl.due_timers(c):
            c = cl.fire(c, name, machine)
        for name in rng.sample(sorted(c.nodes), len(c.nodes)):
            c = cl.train(c, name, 1)
        c = cl.tick(c, 0.25)
        assert not cl.check(c), cl.check(c)
    return c


@pytest.mark.parametrize("seed", range(4))
def test_a_learner_that_falls_a_retention_window_behind_catches_up_without_swept_payloads(
    seed: int,
) -> None:
    c = cl.create(CONFIG, ROLES, learner_options=FAST_L, closer_options=FAST_C)
    for name in sorted(ROLES):
        c = cl.start(c, name)
    c = slow_aligner(c, 400, random.Random(seed), every=8)
    tape = cl.records(c)
    window = retention.KEEP_CYCLES * CONFIG.fragments
    state = c.nodes[SLOW].learner
    assert state is not None
    mine = [(n.kind, n.detail) for name, n in c.notes if name == SLOW]
    kinds = [k for k, _ in mine]
    assert len(tape) > 20 * window, "the run must outpace the slow learner for the test to bite"
    assert kinds.count("aligned") < len(tape) / 2, "the slow learner kept pace: the test is void"
    absent = [(k, d) for k, d in mine if k in ("align_failed", "commit_unusable", "commit_lost")]
    assert absent == [], absent
    assert kinds.count("joined") == 1, "it joined once and never again"
    assert state.phase is learner.Phase.RUNNING
    assert state.aligned_round + window >= tape[-1].round, "it follows the run's newest commits"
