"""A committed payload that is deleted or overwritten (issue 12 item 6, spec/protocol.md §16.10).

Before: a closer retried the merge every poll forever (``merge_failed``), and
learners re-joined in a loop. Now the closer merges into the fragment's previous
commit, learners keep the commit their model holds, a joiner loads the previous
commit, and where none is left the node halts on it with one ``commit_lost``.
"""

from __future__ import annotations

import random

import attrs
from fast_cluster import FAST_C, FAST_L, C, L
from test_closer_regressions import drive

from gm_core import cluster as cl
from gm_core import learner
from gm_core.records import AlgorithmConfig, RoundRecord

CONFIG = AlgorithmConfig(sync_every=8, fragments=2, quorum=2, in_flight=1)
ROLES = {"n0": frozenset({L, C}), "n1": frozenset({L})}


def running(seed: int, late: str = "") -> tuple[cl.Cluster, random.Random]:
    """Two learners, one of them the closer, driven until a few rounds have committed;
    ``late`` names a learner that is not started yet."""
    roles = {**ROLES, late: frozenset({L})} if late else ROLES
    c = cl.create(CONFIG, roles, learner_options=FAST_L, closer_options=FAST_C)
    for name in sorted(ROLES):
        c = cl.start(c, name)
    rng = random.Random(seed)
    while len([r for r in cl.records(c) if r.participants]) < 4:
        c = drive(c, 1, rng)
    return c, rng


def newest_commit(c: cl.Cluster) -> RoundRecord:
    return [r for r in cl.records(c) if r.participants][-1]


def notes(c: cl.Cluster, kind: str) -> list[tuple[str, str]]:
    return [(name, n.detail) for name, n in c.notes if n.kind == kind]


def test_a_corrupt_commit_is_replaced_by_a_merge_into_the_commit_before_it() -> None:
    c, rng = running(1)
    bad = newest_commit(c)
    c = cl.tamper(c, bad.theta.key, b"not the committed bytes")
    c = drive(c, 200, rng)
    after = [r for r in cl.records(c) if r.fragment == bad.fragment and r.round > bad.round]
    healed = next(r for r in after if r.participants)
    assert healed.version == bad.version + 1
    assert healed.theta != bad.theta
    assert len(cl.records(c)) > healed.round + 4, "the run must go on committing"
    assert notes(c, "commit_unusable"), "the closer and the learners say what they saw"
    assert not notes(c, "commit_lost")
    assert not notes(c, "merge_failed"), "no merge retried against the same object"
    for name in ROLES:
        state = c.nodes[name].learner
        assert state is not None
        assert state.phase is learner.Phase.RUNNING


def test_a_lost_momentum_restarts_the_outer_step_and_keeps_the_theta() -> None:
    c, rng = running(2)
    bad = newest_commit(c)
    assert bad.outer is not None
    c = cl.tamper(c, bad.outer.key)  # deleted
    c = drive(c, 200, rng)
    after = [r for r in cl.records(c) if r.fragment == bad.fragment and r.round > bad.round]
    healed = next(r for r in after if r.participants)
    assert healed.version == bad.version + 1
    assert notes(c, "commit_unusable")
    assert not notes(c, "commit_lost")
    # Only the closer read the momentum; learners aligned to the intact theta.
    assert {name for name, _ in notes(c, "commit_unusable")} == {"n0"}
    assert all(bad.outer.key in detail for _, detail in notes(c, "commit_unusable"))


def test_a_joiner_loads_the_commit_before_an_unusable_one() -> None:
    c, rng = running(3, late="n2")
    bad = newest_commit(c)
    c = cl.tamper(c, bad.theta.key)
    c = cl.start(c, "n2")
    c = drive(c, 200, rng)
    joined = c.nodes["n2"].learner
    assert joined is not None
    assert joined.phase is learner.Phase.RUNNING
    assert any(name == "n2" for name, _ in notes(c, "commit_unusable"))
    assert [n for n, x in c.notes if n == "n2" and x.kind == "joined"] == ["n2"], "joined once"
    assert not notes(c, "commit_lost")


def test_with_no_earlier_commit_left_the_closer_halts_once_and_resumes_after_a_restore() -> None:
    c, rng = running(4)
    bad = newest_commit(c)
    before = next(
        r
        for r in reversed(cl.records(c))
        if r.fragment == bad.fragment and r.participants and r.round < bad.round
    )
    kept = {ref.key: c.store.get(ref.key) for ref in (bad.theta, before.theta)}
    for key in kept:
        c = cl.tamper(c, key)
    c = drive(c, 300, rng)
    lost = notes(c, "commit_lost")
    assert len(lost) == 1, lost
    name, message = lost[0]
    assert name == "n0"
    assert bad.theta.key in message
    assert "restore the object" in message
    stuck = max(r.round for r in cl.records(c))
    assert stuck < bad.round + CONFIG.fragments + 1, "nothing commits past the lost fragment"
    for key, got in kept.items():  # an operator restores the objects from a copy
        assert got is not None
        c = attrs.evolve(c, store=c.store.put_once(key, got.data)[0])
    c = drive(c, 300, rng)
    assert max(r.round for r in cl.records(c)) > stuck + 4
