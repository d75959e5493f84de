"""Properties of ranks (a shared queue of rank units, :mod:`gm_core.ranks`) against the model
store: the lowest free rank is taken first; a live holder keeps its rank however long a
peer waits; a holder whose lease stopped changing for the lease timeout on a peer's clock
loses its rank to that peer (the newest claim wins) and learns it at its next watch; and
under every schedule hypothesis finds — deliveries in any order, failed and lost responses,
crashes, same-id restarts, paused leases — a watch answers "held" only while the node's
claim is its rank's highest, and every rank is done at the end, counted once."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_queue import KEYED, OPEN, TIMEOUT_S, World, check_ledger, drive, started

from gm_core import auth, completion, keys, queue, ranks
from gm_core.commands import List
from gm_core.queue import Assignment, Outcome, Watch


def rank_world(count: int, envelope: auth.Envelope = OPEN) -> World:
    spec = ranks.spec(node="x", ranks=count, lease_timeout_s=1.0, poll_s=1.0, envelope=envelope)
    return World(units=spec.units, envelope=envelope, name=ranks.QUEUE, ordered=True)


def claim(world: World, node: str) -> Assignment:
    started(world, node)
    world.act(node)
    world.until(world.training(node))
    current = world.states[node].current
    assert current is not None
    return current


def watch(world: World, node: str) -> Outcome | None:
    world.feed(node, Watch(now_s=world.now_s))
    world.until(world.idle(node))
    return world.states[node].outcome


def test_the_lowest_free_rank_is_taken_first() -> None:
    world = rank_world(3)
    assert claim(world, "b").unit == ranks.unit(0)
    assert claim(world, "a").unit == ranks.unit(1)
    assert claim(world, "c").unit == ranks.unit(2)


def test_a_live_holder_keeps_its_rank_while_a_peer_waits() -> None:
    world = rank_world(1)
    claim(world, "a")
    started(world, "b")
    world.act("b")
    world.until(lambda: world.now_s > 10 * TIMEOUT_S)  # a is renewed as time moves
    assert world.states["b"].current is None
    assert watch(world, "a") is Outcome.HELD


def test_a_paused_holder_loses_its_rank_to_the_newest_claim_and_writes_no_marker() -> None:
    world = rank_world(1, KEYED)
    assert claim(world, "a") == Assignment(unit="0000", attempt=0, resumed=False)
    world.paused.add("a")  # a's lease stops changing: b takes the rank over as attempt 1
    assert claim(world, "b") == Assignment(unit="0000", attempt=1, resumed=False)
    assert world.now_s > TIMEOUT_S
    world.paused.clear()  # a comes back, renews its lease: the rank stays b's
    assert watch(world, "a") is Outcome.LOST
    assert world.states["a"].current is None
    assert watch(world, "b") is Outcome.HELD
    world.run_fair()
    assert world.dones() == {
        "0000": {1: completion.DoneMarker(node="b", attempt=1, steps=3, tokens=100)}
    }


def test_a_restarted_holder_resumes_its_own_rank() -> None:
    world = rank_world(2)
    mine = claim(world, "a")
    world.crash("a")
    assert claim(world, "a") == Assignment(unit=mine.unit, attempt=mine.attempt, resumed=True)


def test_every_rank_done_leaves_nothing_to_claim() -> None:
    world = rank_world(2)
    started(world, "a")
    started(world, "b")
    world.run_fair()
    assert world.exhausted == {"a", "b"}
    started(world, "c")
    world.act("c")
    world.until(lambda: world.states["c"].phase is queue.Phase.STOPPED)
    assert world.states["c"].outcome is Outcome.EXHAUSTED


def test_another_number_of_ranks_is_refused_by_name() -> None:
    world = rank_world(2)
    started(world, "a")
    other = rank_world(3)
    other.store = world.store
    other.start("b")
    while other.inflight:
        other.execute(0)
    assert other.states["b"].outcome is Outcome.MISMATCHED
    assert "holds 2 units" in other.states["b"].mismatch


def test_ranks_out_of_range_are_misuse() -> None:
    for bad in (0, ranks.RANKS_LIMIT + 1):
        with pytest.raises(ValueError, match="ranks must be between"):
            ranks.spec(node="a", ranks=bad, lease_timeout_s=1.0, poll_s=1.0, envelope=OPEN)
    assert ranks.rank_of(ranks.unit(7)) == 7
    assert ranks.rank_of("07") is None
    assert ranks.rank_of("٣٣٣٣") is None


class Watched(World):
    """A rank world that checks every watch answer against the store at its instant."""

    def execute(self, index: int, fault: str | None = None) -> None:
        node, cmd = self.inflight[index]
        watching = node in self.states and isinstance(self.states[node].task, Watch)
        super().execute(index, fault)
        state = self.states.get(node)
        if watching and isinstance(cmd, List) and state is not None:
            if state.outcome is Outcome.HELD:
                assert state.current is not None
                self.assert_highest(node, state.current)
            elif state.outcome is Outcome.LOST:
                assert state.current is None

    def assert_highest(self, node: str, current: Assignment) -> None:
        """rank_single_holder: a node told "held" holds its rank's highest claim, naming it."""
        prefix = keys.queue_unit_prefix(ranks.QUEUE, current.unit)
        attempts = [
            p.attempt
            for k in self.store.list(prefix)
            if isinstance(p := keys.parse(k), keys.QueueClaimKey)
        ]
        assert max(attempts) == current.attempt, (node, current, attempts)
        key = keys.queue_claim(ranks.QUEUE, current.unit, current.attempt)
        got = self.store.get(key)
        assert got is not None
        body = self.envelope.open(key, got.data)
        assert isinstance(body, bytes)
        assert queue.decode_claim(body, current.unit, current.attempt) == node


@settings(max_examples=150, deadline=None)
@given(
    count=st.integers(1, 2),
    nodes=st.integers(2, 3),
    envelope=st.sampled_from([OPEN, KEYED]),
    steps=st.lists(
        st.tuples(
            # Crashes are in "restart" (a same-id restart): a node that stays down never
            # comes back to be told it lost, which is what this property is about.
            st.sampled_from(["exec", "act", "tick", "restart", "pause", "watch", "stall"]),
            st.integers(0, 255),
        ),
        min_size=20,
        max_size=80,
    ),
    faults=st.booleans(),
)
def test_a_watch_says_held_only_to_the_highest_claim_and_every_rank_gets_done(
    count: int,
    nodes: int,
    envelope: auth.Envelope,
    steps: list[tuple[str, int]],
    faults: bool,
) -> None:
    spec = ranks.spec(node="x", ranks=count, lease_timeout_s=1.0, poll_s=1.0, envelope=envelope)
    world = Watched(units=spec.units, envelope=envelope, name=ranks.QUEUE, ordered=True)
    names = [f"n{i}" for i in range(nodes)]
    for name in names:
        world.start(name)
    for kind, pick in steps:
        if kind == "watch":
            holding = [n for n in world.ready() if world.states[n].current is not None]
            if holding:
                world.feed(holding[pick % len(holding)], Watch(now_s=world.now_s))
        elif kind == "stall":  # a holder stops renewing for a lease timeout or more
            holding = sorted(n for n, s in world.states.items() if s.current is not None)
            if holding:
                world.paused.add(holding[pick % len(holding)])
            until_s = world.now_s + TIMEOUT_S + pick % 2
            for _ in range(200):
                if world.now_s > until_s or not (world.inflight or world.tick()):
                    break
                if world.inflight:
                    world.execute(0)
        else:
            drive(world, names, [(kind, pick)], faults)
    world.paused.clear()
    if not world.states:
        world.start(names[0])
    world.run_fair()
    check_ledger(world, exactly_once=False)
