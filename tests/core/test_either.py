"""An ``either`` node is elected closer when it leads a round while another learner is live
(:func:`gm_core.election.serves`); it then stops training, its learner handing the lease to
its closer, and closes the rounds of the others without waiting for its own learner."""

from __future__ import annotations

import random

import attrs
from fast_cluster import FAST_C, FAST_L, C, L, drive

from gm_core import closer, election
from gm_core import cluster as cl
from gm_core.records import AlgorithmConfig

EITHER = attrs.evolve(FAST_C, either=True)
CONFIG = AlgorithmConfig(
    sync_every=8, fragments=2, quorum=3, in_flight=2, lease_timeout_s=4.0, takeover_floor_s=6.0
)


def _serving(c: cl.Cluster) -> list[str]:
    return sorted(n for n, node in c.nodes.items() if node.closer and node.closer.serving)


def test_the_elected_either_node_closes_the_others_rounds_without_a_takeover() -> None:
    roles = {"a": frozenset({L, C}), "b": frozenset({L, C}), "c": frozenset({L})}
    c = cl.create(CONFIG, roles, learner_options=FAST_L, closer_options=EITHER)
    for name in sorted(roles):
        c = cl.start(c, name)
    rng = random.Random(2)
    for _ in range(200):
        if _serving(c):
            break
        c = drive(c, 1, rng)
    assert _serving(c) == ["a"]  # a created the run, so it leads, and b and c are live
    c = cl.hand_over(c, "a")
    elected_at = max((r.round for r in cl.records(c)), default=-1)
    c = drive(c, 240, rng)
    later = [r for r in cl.records(c) if r.round > elected_at]
    # quorum 3 but two learners left: rounds close because a no longer waits for itself.
    assert len(later) >= 6, len(later)
    assert all(r.closer == "a" and r.claim == 0 for r in later)  # its lease never lapsed
    assert all({p.learner for p in r.participants} <= {"a", "b", "c"} for r in later)
    assert all("a" not in {p.learner for p in r.participants} for r in later[4:])
    node_a = c.nodes["a"].closer
    assert node_a is not None
    assert node_a.phase is not closer.Phase.STOPPED
    lease = c.store.get("leases/a.json")
    assert lease is not None


def test_an_either_node_alone_is_not_elected_and_a_live_dedicated_closer_blocks_it() -> None:
    alone = {"a": frozenset({L, C})}
    c = cl.create(CONFIG, alone, learner_options=FAST_L, closer_options=EITHER)
    c = drive(cl.start(c, "a"), 120, random.Random(4))
    assert len(cl.records(c)) >= 3
    assert _serving(c) == []  # elected it would leave nobody training
    roles = {"a": frozenset({L, C}), "b": frozenset({L}), "d": frozenset({C})}
    c = cl.create(CONFIG, roles, learner_options=FAST_L, closer_options=EITHER)
    c = cl.start(cl.start(c, "d"), "a")  # d's lease is there before a first lists the leases
    c = drive(cl.start(c, "b"), 160, random.Random(6))
    assert cl.records(c)[-1].closer == "d"
    assert _serving(c) == []


def test_serves_needs_another_live_learner_and_no_live_dedicated_closer() -> None:
    assert election.serves(me="a", others_live=1, dedicated_live=False)
    assert not election.serves(me="a", others_live=0, dedicated_live=False)
    assert not election.serves(me="a", others_live=3, dedicated_live=True)


def _elect(c: cl.Cluster, rng: random.Random, ticks: int = 200) -> cl.Cluster:
    """Drive until some node serves, then hand its learner over, as ``Session.run`` does."""
    for _ in range(ticks):
        if _serving(c):
            break
        c = drive(c, 1, rng)
    (chosen,) = _serving(c)
    return cl.hand_over(c, chosen)


def test_an_elected_node_that_another_takes_over_from_goes_back_to_training() -> None:
    """The double election: the elected ``a`` stalls (nothing of it runs: its lease looks
    dead), ``b`` takes its round over by a claim and, leading while ``c`` is live, is elected
    too. When ``a`` runs again it no longer leads: it must stop serving (``relieved``) and
    train again, or two of three nodes stop training for good."""
    roles = {"a": frozenset({L, C}), "b": frozenset({L, C}), "c": frozenset({L})}
    c = cl.create(CONFIG, roles, learner_options=FAST_L, closer_options=EITHER)
    for name in sorted(roles):
        c = cl.start(c, name)
    rng = random.Random(7)
    c = _elect(c, rng)
    assert _serving(c) == ["a"]
    c = drive(c, 40, rng)
    for _ in range(400):
        if "b" in _serving(c):
            break
        c = drive(c, 1, rng, hung=frozenset({"a"}))
    assert _serving(c) == ["a", "b"]  # b took a's round over, and serves
    c = cl.hand_over(c, "b")
    taken = max(r.round for r in cl.records(c))
    c = drive(c, 120, rng)  # a runs again: it follows b's rounds
    assert _serving(c) == ["b"]
    # a is relieved, and stays so: running again, its views of the others are stale, so it
    # may first be relieved for seeing no other learner live and, finding them again while
    # it still leads in its own view, be elected once more before b's record relieves it.
    turns = [(n, x.kind) for n, x in c.notes if x.kind in ("elected", "relieved")]
    assert {n for n, kind in turns if kind == "relieved"} == {"a"}, turns
    assert [kind for n, kind in turns if n == "a"][-1] == "relieved", turns
    c = cl.rejoin(c, "a")
    c = drive(c, 200, rng)
    later = [r for r in cl.records(c) if r.round > taken]
    assert all(r.closer == "b" for r in later)
    # a trains again: its snapshots are merged in b's rounds.
    assert any("a" in {p.learner for p in r.participants} for r in later[-6:]), later[-6:]
    assert _serving(c) == ["b"]


def test_an_elected_node_is_relieved_once_its_record_names_a_dedicated_closer() -> None:
    """A dedicated closer started after the election: the elected node's next records name it
    (it leads while live), so the elected node no longer leads, is relieved and trains again;
    it is not elected again while the dedicated closer is live."""
    roles = {"a": frozenset({L, C}), "b": frozenset({L}), "d": frozenset({C})}
    c = cl.create(CONFIG, roles, learner_options=FAST_L, closer_options=EITHER)
    c = cl.start(cl.start(c, "a"), "b")
    rng = random.Random(11)
    c = _elect(c, rng)
    assert _serving(c) == ["a"]
    c = drive(cl.start(c, "d"), 80, rng)
    assert [n for n, x in c.notes if x.kind == "relieved"] == ["a"]
    assert _serving(c) == []
    c = drive(cl.rejoin(c, "a"), 200, rng)
    records = cl.records(c)
    assert records[-1].closer == "d"
    assert any("a" in {p.learner for p in r.participants} for r in records[-6:]), records[-6:]
    assert [n for n, x in c.notes if x.kind == "elected"] == ["a"]


def test_an_elected_node_left_alone_is_relieved_and_trains_again() -> None:
    """Every other learner dies while ``a`` serves: with nobody training, units left would
    never be trained and the run never finish, so ``a`` is relieved and trains again."""
    roles = {"a": frozenset({L, C}), "b": frozenset({L})}
    c = cl.create(CONFIG, roles, learner_options=FAST_L, closer_options=EITHER)
    c = cl.start(cl.start(c, "a"), "b")
    rng = random.Random(13)
    c = _elect(c, rng)
    c = drive(c, 40, rng)
    assert _serving(c) == ["a"]
    assert not [n for n, x in c.notes if x.kind == "relieved"]  # b is live: a serves on
    c = drive(cl.crash(c, "b"), 80, rng)
    assert [x.detail for n, x in c.notes if x.kind == "relieved"] == ["no other learner live"]
    assert _serving(c) == []
    crashed = max(r.round for r in cl.records(c))
    c = drive(cl.rejoin(c, "a"), 200, rng)
    later = [r for r in cl.records(c) if r.round > crashed]
    assert len(later) >= 6, len(later)
    assert any("a" in {p.learner for p in r.participants} for r in later[-6:]), later[-6:]
    assert _serving(c) == []  # alone it is not elected again
