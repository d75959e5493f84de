"""Properties of the shared queue's machine, run against the model store under every
interleaving hypothesis finds (deliveries in any order, failed and lost responses, crashes
and same-id restarts, paused leases, a forger): every unit ends with a counted completion,
a done marker is written only by the node its claim attempt names, a unit whose holder
died is re-issued, and — as long as only dead nodes look dead — each unit is completed
exactly once. Nothing in the bucket makes ``advance`` raise."""

from __future__ import annotations

from collections.abc import Callable

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gm_core import auth, completion, keys, queue
from gm_core.commands import Command, Delete, Get, List, Notify, Probe, PutOnce, WakeAt
from gm_core.events import (
    Deleted,
    Event,
    GotObject,
    Listed,
    Probed,
    PutDone,
    RequestFailed,
    Started,
    TimerFired,
)
from gm_core.queue import Ahead, Ended, Finish, GiveBack, Outcome, QueueSpec, QueueState, Want
from gm_core.records import Lease
from gm_core.store_model import ModelStore

Q = "data"
POLL_S = 1.0
TIMEOUT_S = 3.0
OPEN = auth.for_run("run1", None)
KEYED = auth.for_run("run1", auth.derive(bytes(range(32))))


def tokens_of(unit: str) -> int:
    return 100 + int(unit[1:])


@attrs.define
class World:
    """Nodes consuming one queue over a model store; a test picks what happens next.

    The world renews the lease of every node that is up (and not paused) whenever time
    moves, as a node's event loop does whatever its trainer is doing; a crashed node's
    lease stays as it was, so its peers see it age on their own clocks.
    """

    units: tuple[str, ...]
    envelope: auth.Envelope
    prefetch: int = 0
    name: str = Q
    ordered: bool = False
    """The queue's name and order (ranks: :mod:`gm_core.ranks`' reserved queue, lowest first)."""
    store: ModelStore = attrs.field(factory=ModelStore)
    now_s: float = 0.0
    states: dict[str, QueueState] = attrs.field(factory=dict)
    inflight: list[tuple[str, Command]] = attrs.field(factory=list)
    timers: dict[str, float] = attrs.field(factory=dict)
    paused: set[str] = attrs.field(factory=set)
    exhausted: set[str] = attrs.field(factory=set)
    crashed_at: dict[str, int] = attrs.field(factory=dict)
    """Each node's last crash, counted in writes to the store."""
    claimed_at: dict[tuple[str, int], int] = attrs.field(factory=dict)
    seq: int = 0
    """The last lease sequence number written (one count for every node: it only has to rise)."""
    early: list[tuple[str, int, str]] = attrs.field(factory=list)
    """Re-issues of a unit whose holder had not crashed since its claim: (unit, attempt, holder)."""
    pipelined: bool = False
    """Trainers as ``Session.run`` drives a queue: a unit ended, the next started (at once
    when :class:`Ahead` checked it), the ended one finished after, then claims ahead."""
    ending: dict[str, Finish] = attrs.field(factory=dict)
    """A pipelined node's ended unit whose done marker is still to write."""
    ahead: set[str] = attrs.field(factory=set)
    """Pipelined nodes that have claimed ahead since their unit started."""

    def start(self, node: str) -> None:
        spec = QueueSpec(
            queue=self.name,
            node=node,
            units=self.units,
            prefetch=self.prefetch,
            lease_timeout_s=TIMEOUT_S,
            poll_s=POLL_S,
            envelope=self.envelope,
            ordered=self.ordered,
        )
        self.states[node] = queue.initial(spec)
        self.exhausted.discard(node)
        self.ending.pop(node, None)
        self.ahead.discard(node)
        self.renew(node)
        self.feed(node, Started(now_s=self.now_s))

    def renew(self, node: str) -> None:
        """A renewal as a node writes it: sealed, with a rising sequence number (an
        authenticated run's peers read the body, spec/protocol.md §16.6)."""
        self.seq += 1
        lease = Lease(node=node, roles=("learner",), seq=self.seq, renew_s=TIMEOUT_S / 2)
        self.store = self.store.put(keys.lease(node), self.envelope.pack(keys.lease(node), lease))

    def feed(self, node: str, event: queue.QueueEvent) -> None:
        state, cmds = queue.advance(self.states[node], event)
        self.states[node] = state
        for cmd in cmds:
            if isinstance(cmd, WakeAt):
                self.timers[node] = cmd.at_s
            elif not isinstance(cmd, Notify):
                self.inflight.append((node, cmd))
        if state.outcome is Outcome.EXHAUSTED:
            self.exhausted.add(node)

    def ready(self) -> list[str]:
        """Nodes whose trainer may act now (their queue is idle)."""
        return sorted(
            n for n, s in self.states.items() if s.phase is queue.Phase.IDLE and s.task is None
        )

    def act(self, node: str) -> None:
        """The node's trainer: finish the unit it trains, or ask for the next (pipelined: the
        next of the steps :attr:`pipelined` names)."""
        current = self.states[node].current
        if self.pipelined:
            self.act_pipelined(node, current)
        elif current is None:
            self.feed(node, Want(now_s=self.now_s))
        else:
            steps, tokens = 3, tokens_of(current.unit)
            self.feed(node, Finish(now_s=self.now_s, unit=current.unit, steps=steps, tokens=tokens))

    def act_pipelined(self, node: str, current: queue.Assignment | None) -> None:
        now_s = self.now_s
        if current is not None and node not in self.ahead and node in self.ending:
            self.feed(node, self.ending.pop(node))
        elif current is not None and node not in self.ahead:
            self.ahead.add(node)
            self.feed(node, Ahead(now_s=now_s))
        elif current is not None:
            tokens = tokens_of(current.unit)
            self.ending[node] = Finish(now_s=now_s, unit=current.unit, steps=3, tokens=tokens)
            self.ahead.discard(node)
            self.feed(node, Ended(now_s=now_s, unit=current.unit))
        elif node in self.ending and not queue.ready(self.states[node]):
            self.feed(node, self.ending.pop(node))
        else:
            self.feed(node, Want(now_s=now_s))

    def flush(self, node: str) -> None:
        """A pipelined node about to stop writes its ended unit's done marker first."""
        if node in self.ending:
            self.feed(node, self.ending.pop(node))
            self.run_fair(resting=frozenset({node}), until=self.idle(node))

    def execute(self, index: int, fault: str | None = None) -> None:
        node, cmd = self.inflight.pop(index)
        req = getattr(cmd, "req", 0)
        if fault == "fail":
            self.feed(node, RequestFailed(now_s=self.now_s, req=req, error="injected"))
            return
        outcome: Event
        if isinstance(cmd, Get):
            got = self.store.get(cmd.key)
            data, etag = (None, None) if got is None else (got.data, got.etag)
            outcome = GotObject(now_s=self.now_s, req=req, data=data, etag=etag)
        elif isinstance(cmd, Probe):
            got = self.store.get(cmd.key)
            outcome = Probed(now_s=self.now_s, req=req, etag=None if got is None else got.etag)
        elif isinstance(cmd, PutOnce):
            self.store, created = self.store.put_once(cmd.key, cmd.data)
            if created:
                self.note_claim(cmd.key)
            outcome = PutDone(now_s=self.now_s, req=req, created=created)
        elif isinstance(cmd, List):
            outcome = Listed(now_s=self.now_s, req=req, keys=self.store.list(cmd.prefix))
        else:
            assert isinstance(cmd, Delete), cmd
            self.store = self.store.delete(cmd.keys)
            outcome = Deleted(now_s=self.now_s, req=req)
        if fault == "lose":
            outcome = RequestFailed(now_s=self.now_s, req=req, error="response lost")
        if node in self.states:
            self.feed(node, outcome)

    def tick(self) -> bool:
        """Fire the earliest timer; time moves to it and every node that is up renews."""
        if not self.timers:
            return False
        node = min(self.timers, key=lambda n: (self.timers[n], n))
        at_s = self.timers.pop(node)
        if at_s > self.now_s:
            self.now_s = at_s
            for up in sorted(self.states):
                if up not in self.paused:
                    self.renew(up)
        self.feed(node, TimerFired(now_s=self.now_s))
        return True

    def note_claim(self, key: str) -> None:
        """A claim over a node's attempt is a re-issue: fair only if that node crashed since."""
        parsed = _parse(key)
        if not isinstance(parsed, keys.QueueClaimKey):
            return
        self.claimed_at[parsed.unit, parsed.attempt] = self.store.writes
        claims = self.claims()
        if claims.get((parsed.unit, parsed.attempt)) == "":
            return  # given back by its holder: no re-issue
        below = [a for (u, a) in claims if u == parsed.unit and a < parsed.attempt]
        if below:
            holder = claims[parsed.unit, max(below)]
            since = self.claimed_at.get((parsed.unit, max(below)), 0)
            if holder and self.crashed_at.get(holder, -1) < since:
                self.early.append((parsed.unit, parsed.attempt, holder))

    def crash(self, node: str) -> None:
        self.crashed_at[node] = self.store.writes
        self.states.pop(node, None)
        self.ending.pop(node, None)
        self.timers.pop(node, None)
        self.inflight = [(n, c) for n, c in self.inflight if n != node]

    def until(self, done: Callable[[], bool], limit: int = 10_000) -> None:
        """Deliver in order (timers when nothing is in flight) until ``done()``."""
        for _ in range(limit):
            if done():
                return
            if self.inflight:
                self.execute(0)
            else:
                assert self.tick(), "nothing left to happen"
        raise AssertionError("never came true")

    def idle(self, node: str) -> Callable[[], bool]:
        return lambda: self.states[node].phase is queue.Phase.IDLE

    def training(self, node: str) -> Callable[[], bool]:
        return lambda: self.states[node].current is not None

    def forge(self, key: str, data: bytes) -> None:
        self.store, _ = self.store.put_once(key, data)

    def run_fair(
        self,
        limit: int = 50_000,
        *,
        resting: frozenset[str] = frozenset(),
        until: Callable[[], bool] = lambda: False,
    ) -> None:
        """Deliver in order and let trainers act; timers only when nothing else can happen.

        ``resting`` nodes stay up (renewed) but their trainers never act; stop early once
        ``until()`` holds.
        """
        for _ in range(limit):
            if until():
                return
            if self.inflight:
                self.execute(0)
            elif ready := [n for n in self.ready() if n not in self.exhausted | resting]:
                self.act(ready[0])
            elif not self.tick():
                return
        raise AssertionError("no quiescence")

    # -- what the ghost history says -------------------------------------------------------

    def claims(self) -> dict[tuple[str, int], str]:
        """Every claim ever created (unit, attempt) -> the node it named (decoded)."""
        found = {}
        for key, data in self.store.created:
            parsed = _parse(key)
            if isinstance(parsed, keys.QueueClaimKey):
                body = self.envelope.open(key, data)
                if isinstance(body, bytes):
                    node = queue.decode_claim(body, parsed.unit, parsed.attempt)
                    if node is not None:
                        found[parsed.unit, parsed.attempt] = node
        return found

    def done_writes(self) -> list[tuple[str, int, completion.DoneMarker, str | None]]:
        """Each valid done marker created, with the node its attempt's claim named then.

        A claim key freed by collection may be created again (by a node whose listing was
        older than the unit's finish); the claim that counts is the newest before the marker.
        """
        holders: dict[tuple[str, int], str] = {}
        found = []
        for key, data in self.store.created:
            parsed = _parse(key)
            body = self.envelope.open(key, data)
            if not isinstance(body, bytes):
                continue
            if isinstance(parsed, keys.QueueClaimKey):
                node = queue.decode_claim(body, parsed.unit, parsed.attempt)
                if node is not None:
                    holders[parsed.unit, parsed.attempt] = node
            elif isinstance(parsed, keys.QueueDoneKey):
                marker = completion.decode_done(body, parsed.attempt)
                if isinstance(marker, completion.DoneMarker):
                    holder = holders.get((parsed.unit, parsed.attempt))
                    found.append((parsed.unit, parsed.attempt, marker, holder))
        return found

    def dones(self) -> dict[str, dict[int, completion.DoneMarker | None]]:
        """Every done marker ever created, judged, by unit and attempt."""
        found: dict[str, dict[int, completion.DoneMarker | None]] = {}
        for key, data in self.store.created:
            parsed = _parse(key)
            if isinstance(parsed, keys.QueueDoneKey):
                body = self.envelope.open(key, data)
                marker = (
                    completion.decode_done(body, parsed.attempt)
                    if isinstance(body, bytes)
                    else None
                )
                judged = marker if isinstance(marker, completion.DoneMarker) else None
                found.setdefault(parsed.unit, {})[parsed.attempt] = judged
        return found


def _parse(key: str) -> keys.ParsedKey | None:
    try:
        return keys.parse(key)
    except keys.BadKey:
        return None


def check_ledger(world: World, *, exactly_once: bool) -> None:
    """Every unit counted once with one full pass of tokens; done markers only by holders."""
    dones = world.dones()
    for unit, attempt, marker, holder in world.done_writes():
        assert holder == marker.node, (unit, attempt, marker, holder)
    verdict = completion.finished(completion.Queued(frozenset(world.units)), dones, frozenset())
    assert isinstance(verdict, completion.Finished), verdict
    assert verdict.tokens == sum(tokens_of(u) for u in world.units)
    if exactly_once:
        for unit in world.units:
            valid = [m for m in dones[unit].values() if m is not None]
            assert len(valid) == 1, (unit, dones[unit])


units_strategy = st.integers(1, 4).map(lambda n: tuple(f"u{i}" for i in range(n)))
steps_strategy = st.lists(
    st.tuples(st.sampled_from(["exec", "act", "tick", "crash", "restart", "pause"]), st.integers()),
    max_size=80,
)


def drive(world: World, nodes: list[str], steps: list[tuple[str, int]], faults: bool) -> None:
    for kind, pick in steps:
        if kind == "exec" and world.inflight:
            fault = [None, None, "fail", "lose"][pick % 4] if faults else None
            world.execute(pick % len(world.inflight), fault)
        elif kind == "act" and (ready := [n for n in world.ready() if n not in world.exhausted]):
            world.act(ready[pick % len(ready)])
        elif kind == "tick":
            world.tick()
        elif kind == "crash":
            world.crash(nodes[pick % len(nodes)])
        elif kind == "restart":
            node = nodes[pick % len(nodes)]
            world.crash(node)
            world.start(node)
        elif kind == "pause":
            node = nodes[pick % len(nodes)]
            world.paused ^= {node}


@settings(max_examples=150, deadline=None)
@given(
    units=units_strategy,
    nodes=st.integers(1, 3),
    prefetch=st.integers(0, 2),
    envelope=st.sampled_from([OPEN, KEYED]),
    steps=steps_strategy,
    faults=st.booleans(),
    pipelined=st.booleans(),
)
def test_each_unit_is_completed_exactly_once_across_crashes_and_restarts(
    units: tuple[str, ...],
    nodes: int,
    prefetch: int,
    envelope: auth.Envelope,
    steps: list[tuple[str, int]],
    faults: bool,
    pipelined: bool,
) -> None:
    names = [f"n{i}" for i in range(nodes)]
    world = World(units=units, envelope=envelope, prefetch=prefetch, pipelined=pipelined)
    for name in names:
        world.start(name)
    drive(world, names, [s for s in steps if s[0] != "pause"], faults)
    # Whoever is still up runs to the end; if everyone crashed, one comes back.
    if not world.states:
        world.start(names[0])
    world.run_fair()
    assert set(world.states) <= world.exhausted
    check_ledger(world, exactly_once=True)
    assert world.early == []


@settings(max_examples=150, deadline=None)
@given(
    units=units_strategy,
    nodes=st.integers(2, 3),
    envelope=st.sampled_from([OPEN, KEYED]),
    steps=steps_strategy,
    pipelined=st.booleans(),
)
def test_paused_holders_never_lose_a_unit_nor_count_it_twice(
    units: tuple[str, ...],
    nodes: int,
    envelope: auth.Envelope,
    steps: list[tuple[str, int]],
    pipelined: bool,
) -> None:
    """A paused lease looks dead: its units are re-issued and may be finished twice, but the
    ledger counts each once, and only a claim's own node writes that attempt's marker
    (pipelined too, where a unit checked ahead may be re-issued before it starts)."""
    names = [f"n{i}" for i in range(nodes)]
    world = World(units=units, envelope=envelope, prefetch=1, pipelined=pipelined)
    for name in names:
        world.start(name)
    drive(world, names, steps, faults=True)
    world.paused.clear()
    if not world.states:
        world.start(names[0])
    world.run_fair()
    check_ledger(world, exactly_once=False)


def started(world: World, node: str) -> None:
    world.start(node)
    world.until(world.idle(node))


def test_a_dead_holders_unit_is_reissued_after_the_lease_timeout() -> None:
    world = World(units=("u0",), envelope=OPEN)
    started(world, "a")
    world.act("a")  # a claims u0 and trains it (never finishes: it crashes)
    world.until(world.training("a"))
    assert world.states["a"].current == queue.Assignment(unit="u0", attempt=0, resumed=False)
    world.crash("a")
    started(world, "b")
    world.act("b")
    world.until(world.training("b"))
    # b waited out a's lease on its own clock before claiming attempt 1.
    assert world.states["b"].current == queue.Assignment(unit="u0", attempt=1, resumed=False)
    assert world.now_s > TIMEOUT_S
    world.run_fair()
    assert world.dones() == {
        "u0": {1: completion.DoneMarker(node="b", attempt=1, steps=3, tokens=tokens_of("u0"))}
    }
    # The done marker speaks for the unit: its claims were collected.
    assert world.store.list(keys.queue_unit_prefix(Q, "u0")) == (keys.queue_done(Q, "u0", 1),)


@pytest.mark.parametrize("envelope", [OPEN, KEYED], ids=["open", "keyed"])
def test_a_replayed_lease_keeps_a_dead_holders_unit_only_in_an_open_run(
    envelope: auth.Envelope,
) -> None:
    """spec/protocol.md §16.6 for the queue (and ranks, built on it): an outsider who writes
    the crashed holder's genuine lease back whenever time moves keeps it "live" by ETag, so
    an open run's peer never re-issues its unit; an authenticated run's peer reads the body,
    sees no newer sequence number, and takes the unit after the lease timeout."""
    world = World(units=("u0",), envelope=envelope)
    started(world, "a")
    world.act("a")
    world.until(world.training("a"))
    world.crash("a")
    copied = world.store.get(keys.lease("a"))
    assert copied is not None
    started(world, "b")
    world.act("b")
    while world.states["b"].current is None and world.now_s < 10 * TIMEOUT_S:
        world.store = world.store.put(keys.lease("a"), copied.data)  # a new ETag each time
        if world.inflight:
            world.execute(0)
        else:
            assert world.tick()
    taken = world.states["b"].current
    if envelope is KEYED:
        assert taken == queue.Assignment(unit="u0", attempt=1, resumed=False)
    else:
        assert taken is None


def test_a_restarted_node_resumes_its_own_unit_first() -> None:
    world = World(units=("u0", "u1", "u2"), envelope=KEYED)
    started(world, "a")
    world.act("a")
    world.until(world.training("a"))
    mine = world.states["a"].current
    assert mine is not None
    world.crash("a")
    started(world, "a")
    world.act("a")
    world.until(world.training("a"))
    assert world.states["a"].current == attrs.evolve(mine, resumed=True)


def test_a_live_holder_keeps_its_unit_and_a_peer_waits_for_it() -> None:
    world = World(units=("u0",), envelope=OPEN)
    started(world, "a")
    world.act("a")
    world.until(world.training("a"))
    started(world, "b")
    world.act("b")
    world.until(lambda: world.now_s > 10 * TIMEOUT_S)  # a is renewed as time moves
    assert world.states["b"].current is None
    world.act("a")  # a finishes; b then finds everything done
    world.until(world.idle("a"))
    assert world.states["a"].outcome is Outcome.DONE
    world.run_fair()
    assert world.exhausted == {"a", "b"}
    check_ledger(world, exactly_once=True)


def test_a_superseded_holder_writes_no_done_marker() -> None:
    world = World(units=("u0",), envelope=OPEN)
    started(world, "a")
    world.act("a")
    world.until(world.training("a"))
    world.paused.add("a")  # a's lease stops changing: b re-issues u0 as attempt 1
    started(world, "b")
    world.act("b")
    world.until(world.training("b"))
    world.act("a")  # a finishes late: it sees attempt 1 and writes nothing
    world.until(world.idle("a"))
    assert world.states["a"].outcome is Outcome.LOST
    assert world.dones() == {}


def test_units_given_back_are_taken_at_once_by_a_peer() -> None:
    world = World(units=("u0", "u1", "u2", "u3"), envelope=KEYED, prefetch=2)
    started(world, "a")
    world.act("a")  # claims three units (one plus two prefetched) and starts one
    world.until(world.training("a"))
    first = world.states["a"].current
    assert first is not None
    world.act("a")
    world.until(world.idle("a"))
    unstarted = {h.unit: h.attempt for h in world.states["a"].held if not h.started}
    assert len(unstarted) == 2
    world.feed("a", GiveBack(now_s=world.now_s))  # a is elected closer: it stops training
    world.until(world.idle("a"))
    assert world.states["a"].outcome is Outcome.GIVEN
    assert world.states["a"].held == ()
    assert all(world.claims()[u, a + 1] == "" for u, a in unstarted.items())
    started(world, "b")  # a stays live (renewed) and never trains again
    world.run_fair(resting=frozenset({"a"}))
    assert world.now_s < TIMEOUT_S  # no lease timeout waited out
    assert "b" in world.exhausted
    check_ledger(world, exactly_once=True)
    by_b = {u for u, _, m, _ in world.done_writes() if m.node == "b"}
    assert by_b == {"u0", "u1", "u2", "u3"} - {first.unit}


def test_a_node_leaving_with_an_error_gives_back_its_unit_cut_short_too() -> None:
    """``Session.run`` whose ``step`` raises mid-unit: the unit being trained goes back
    with those claimed ahead (``GiveBack(leaving=True)``), so a peer takes every one of
    them at once instead of waiting out the leaver's lease; a plain ``GiveBack`` still
    refuses while a unit is being trained."""
    world = World(units=("u0", "u1", "u2", "u3"), envelope=KEYED, prefetch=1)
    started(world, "a")
    world.act("a")  # claims two units and starts one
    world.until(world.training("a"))
    cut = world.states["a"].current
    assert cut is not None
    with pytest.raises(ValueError, match="not finished yet"):
        queue.advance(world.states["a"], GiveBack(now_s=world.now_s))
    held = {h.unit: h.attempt for h in world.states["a"].held}
    assert cut.unit in held
    assert len(held) == 2
    world.feed("a", GiveBack(now_s=world.now_s, leaving=True))
    world.until(world.idle("a"))
    assert world.states["a"].outcome is Outcome.GIVEN
    assert world.states["a"].held == ()
    assert world.states["a"].current is None
    assert all(world.claims()[u, a + 1] == "" for u, a in held.items())
    started(world, "b")
    world.run_fair(resting=frozenset({"a"}))
    assert world.now_s < TIMEOUT_S  # no lease timeout waited out
    check_ledger(world, exactly_once=True)
    assert {u for u, _, m, _ in world.done_writes() if m.node == "b"} == {"u0", "u1", "u2", "u3"}


@settings(max_examples=100, deadline=None)
@given(
    units=units_strategy,
    prefetch=st.integers(0, 2),
    envelope=st.sampled_from([OPEN, KEYED]),
    steps=steps_strategy,
    faults=st.booleans(),
    pipelined=st.booleans(),
)
def test_a_node_that_gives_back_leaves_every_unit_to_its_live_peers(
    units: tuple[str, ...],
    prefetch: int,
    envelope: auth.Envelope,
    steps: list[tuple[str, int]],
    faults: bool,
    pipelined: bool,
) -> None:
    """Whenever the giver stops (between units), its peers complete every unit exactly once,
    none by re-issuing a claim of the giver's, which stays live throughout."""
    names = ["n0", "n1", "n2"]
    world = World(units=units, envelope=envelope, prefetch=prefetch, pipelined=pipelined)
    for name in names:
        world.start(name)
    drive(world, names, [s for s in steps if s[0] in ("exec", "act", "tick")], faults)
    giver = frozenset({"n0"})

    def settled() -> bool:
        return world.states["n0"].phase in (queue.Phase.IDLE, queue.Phase.STOPPED)

    world.run_fair(resting=giver, until=settled)  # its request in flight ends
    while world.states["n0"].current is not None:
        world.act("n0")  # it trains its unit to the end before it stops
        world.run_fair(resting=giver, until=settled)
    world.flush("n0")
    if world.states["n0"].phase is not queue.Phase.STOPPED:  # not exhausted yet
        world.feed("n0", GiveBack(now_s=world.now_s))
        world.run_fair(resting=giver, until=world.idle("n0"))
        assert world.states["n0"].outcome is Outcome.GIVEN
        assert [h for h in world.states["n0"].held if not h.started] == []
    world.run_fair(resting=giver)
    assert {"n1", "n2"} <= world.exhausted
    check_ledger(world, exactly_once=True)
    assert world.early == []


def test_a_node_restarted_and_elected_before_its_first_unit_gives_its_old_units_back() -> None:
    """Its claims from before the restart are its own too: an elected node's lease stays live
    (its closer renews it), so a unit it kept would never be re-issued while it served. Found
    by the model checker's either_gives_back (a crash and restart, then an election)."""
    world = World(units=("u0", "u1", "u2"), envelope=KEYED, prefetch=1)
    started(world, "a")
    world.act("a")  # claims two units, starts one
    world.until(world.training("a"))
    before = {h.unit: h.attempt for h in world.states["a"].held}
    assert len(before) == 2
    world.crash("a")
    started(world, "a")
    world.feed("a", GiveBack(now_s=world.now_s))  # elected before it asked for a unit
    world.until(world.idle("a"))
    assert world.states["a"].outcome is Outcome.GIVEN
    assert all(world.claims()[u, a + 1] == "" for u, a in before.items())
    started(world, "b")
    world.run_fair(resting=frozenset({"a"}))
    assert world.now_s < TIMEOUT_S  # taken at once, no lease timeout waited out
    assert "b" in world.exhausted
    check_ledger(world, exactly_once=True)


def test_a_pipelined_node_starts_a_unit_checked_ahead_without_a_request() -> None:
    """Between two units the trainer sends nothing to the store: the next unit was claimed
    and checked while the previous one trained, and the previous one's done marker is
    written while the next one trains."""
    world = World(units=("u0", "u1", "u2"), envelope=KEYED, prefetch=1)
    started(world, "a")
    world.feed("a", Want(now_s=world.now_s))  # the first unit: claims two, starts one
    world.until(world.training("a"))
    first = world.states["a"].current
    assert first is not None
    world.feed("a", Ahead(now_s=world.now_s))  # one is held unstarted already: checks it
    world.until(world.idle("a"))
    assert world.states["a"].outcome is Outcome.AHEAD
    assert queue.ready(world.states["a"]) is False  # it still trains the first
    world.feed("a", Ended(now_s=world.now_s, unit=first.unit))
    assert queue.ready(world.states["a"])
    world.feed("a", Want(now_s=world.now_s))
    assert world.inflight == []  # started at once
    second = world.states["a"].current
    assert second is not None
    assert second.unit != first.unit
    world.feed(
        "a", Finish(now_s=world.now_s, unit=first.unit, steps=3, tokens=tokens_of(first.unit))
    )
    world.until(world.idle("a"))
    assert world.states["a"].outcome is Outcome.DONE
    assert world.states["a"].current == second  # the unit being trained is still its
    world.feed("a", Ahead(now_s=world.now_s))  # claims the third and checks it
    world.until(world.idle("a"))
    assert [h.checked for h in world.states["a"].held if not h.started] == [True]
    world.pipelined = True
    world.ahead.add("a")
    world.run_fair()
    check_ledger(world, exactly_once=True)


def test_a_pipelined_want_that_could_wait_on_its_own_ended_unit_is_refused() -> None:
    """Nothing checked ahead and a unit ended but not marked: waiting for peers' units could
    wait for this one, so the trainer must finish it first."""
    world = World(units=("u0", "u1"), envelope=OPEN)
    started(world, "a")
    world.act("a")
    world.until(world.training("a"))
    current = world.states["a"].current
    assert current is not None
    world.feed("a", Ended(now_s=world.now_s, unit=current.unit))
    with pytest.raises(ValueError, match="finish it before"):
        world.feed("a", Want(now_s=world.now_s))
    with pytest.raises(ValueError, match="not finished"):
        world.feed("a", GiveBack(now_s=world.now_s))


def test_a_unit_checked_ahead_then_reissued_is_trained_in_vain_and_counted_once() -> None:
    """The check before a start is as old as the unit trained before it: a peer that saw
    this node's lease stop re-issues the unit meanwhile; the node's late done marker is not
    written, and the unit counts once."""
    world = World(units=("u0", "u1"), envelope=OPEN, prefetch=1)
    started(world, "a")
    world.feed("a", Want(now_s=world.now_s))
    world.until(world.training("a"))
    first = world.states["a"].current
    assert first is not None
    world.feed("a", Ahead(now_s=world.now_s))
    world.until(world.idle("a"))
    (ahead,) = [h for h in world.states["a"].held if not h.started]
    world.paused.add("a")
    started(world, "b")
    world.feed("b", Want(now_s=world.now_s))  # a looks dead: b re-issues both units
    world.until(world.training("b"))
    world.run_fair(resting=frozenset({"a"}))
    assert world.exhausted == {"b"}
    world.paused.clear()
    world.feed("a", Ended(now_s=world.now_s, unit=first.unit))
    world.feed("a", Want(now_s=world.now_s))  # starts the unit checked ahead, in vain
    assert world.states["a"].current is not None
    assert world.states["a"].current.unit == ahead.unit
    world.feed("a", Finish(now_s=world.now_s, unit=first.unit, steps=3, tokens=1))
    world.until(world.idle("a"))
    assert world.states["a"].outcome is Outcome.LOST
    unit = ahead.unit
    world.feed("a", Ended(now_s=world.now_s, unit=unit))
    world.feed("a", Finish(now_s=world.now_s, unit=unit, steps=3, tokens=tokens_of(unit)))
    world.until(world.idle("a"))
    assert world.states["a"].outcome is Outcome.LOST
    check_ledger(world, exactly_once=True)


def test_giving_back_while_training_a_unit_is_refused() -> None:
    world = World(units=("u0",), envelope=OPEN)
    started(world, "a")
    world.act("a")
    world.until(world.training("a"))
    with pytest.raises(ValueError, match="not finished"):
        world.feed("a", GiveBack(now_s=world.now_s))


def test_different_units_are_refused_by_name() -> None:
    world = World(units=("u0", "u1"), envelope=OPEN)
    world.start("a")
    world.run_fair()
    other = World(units=("u0",), envelope=OPEN, store=world.store)
    other.start("b")
    while other.inflight:
        other.execute(0)
    state = other.states["b"]
    assert state.outcome is Outcome.MISMATCHED
    assert "holds 2 units" in state.mismatch
    assert "this node has 1" in state.mismatch


GARBAGE = [b"", b"{", b"[]", b'{"format":1}', b"\xff" * 10, b'{"a":' * 5000]


@settings(max_examples=100, deadline=None)
@given(
    units=units_strategy,
    envelope=st.sampled_from([OPEN, KEYED]),
    forged=st.lists(
        st.tuples(
            st.sampled_from(["claim", "done", "junk", "units", "claim_body"]),
            st.integers(0, 3),
            st.integers(0, 5),
            st.sampled_from(GARBAGE),
        ),
        max_size=8,
    ),
    steps=steps_strategy,
)
def test_garbage_in_the_queue_is_refused_by_name_and_every_unit_still_gets_done(
    units: tuple[str, ...],
    envelope: auth.Envelope,
    forged: list[tuple[str, int, int, bytes]],
    steps: list[tuple[str, int]],
) -> None:
    world = World(units=units, envelope=envelope)
    for kind, unit_pick, attempt, data in forged:
        unit = units[unit_pick % len(units)]
        if kind == "claim":
            world.forge(keys.queue_claim(Q, unit, attempt), data)
        elif kind == "claim_body":  # a well-formed but unsealed claim naming a stranger
            world.forge(keys.queue_claim(Q, unit, attempt), queue.encode_claim(unit, attempt, "x"))
        elif kind == "done":
            world.forge(keys.queue_done(Q, unit, attempt), data)
        elif kind == "units":
            world.forge(keys.queue_units(Q), data)
        else:
            world.forge(f"queue/{Q}/units/{unit}/junk/{attempt}", data)
    names = ["n0", "n1"]
    for name in names:
        world.start(name)
    drive(world, names, [s for s in steps if s[0] not in ("crash", "pause")], faults=True)
    world.run_fair()
    assert set(world.states) <= world.exhausted
    honest = [w for w in world.done_writes() if w[2].node in names]
    assert {unit for unit, *_ in honest} == set(units)
    for unit, attempt, marker, holder in honest:
        assert holder == marker.node, (unit, attempt, marker, holder)
    # Junk keys, done markers and units statements are always read: garbage there is named.
    rejected = sum(s.rejected for s in world.states.values())
    assert rejected > 0 or not any(kind in ("junk", "done", "units") for kind, *_ in forged)


@pytest.mark.parametrize("bad", GARBAGE)
def test_decode_claim_refuses_garbage(bad: bytes) -> None:
    assert queue.decode_claim(bad, "u0", 0) is None


def test_decode_claim_reads_its_own_encoding_only_at_its_own_place() -> None:
    body = queue.encode_claim("u0", 2, "n1")
    assert queue.decode_claim(body, "u0", 2) == "n1"
    assert queue.decode_claim(body, "u1", 2) is None
    assert queue.decode_claim(body, "u0", 3) is None
    assert queue.decode_claim(queue.encode_claim("u0", 2, ""), "u0", 2) == ""


@given(st.sets(st.sampled_from([f"u{i}" for i in range(8)]), min_size=1))
def test_choose_offers_own_units_then_free_then_dead_holders(free: set[str]) -> None:
    units = tuple(f"u{i}" for i in range(8))
    holders = {u: ("me" if u in ("u0", "u7") else "dead" if u == "u1" else "live") for u in units}
    for u in free:
        holders[u] = ""
    picks = queue.choose(
        units,
        done=frozenset({"u7"}),
        holders=holders,
        attempts=dict.fromkeys(units, 2),
        used=dict.fromkeys(units, 4),
        me="me",
        live=frozenset({"me", "live"}),
        held=frozenset(),
    )
    kinds = [holders[u] for u, _ in picks]
    order = {"me": 0, "": 1, "dead": 2}
    assert kinds == sorted(kinds, key=order.__getitem__)
    assert all(holders[u] != "live" and u != "u7" for u, _ in picks)
    assert all(a == (2 if holders[u] == "me" else 5) for u, a in picks)


def _listed(units: int, claimed: int, done: int, prefetch: int) -> QueueState:
    """A node's state whose last listing showed ``claimed`` units claimed and not done and
    ``done`` units done, of ``units``."""
    names = tuple(f"u{i:03d}" for i in range(units))
    spec = QueueSpec(
        queue=Q,
        node="a",
        units=names,
        prefetch=prefetch,
        lease_timeout_s=TIMEOUT_S,
        poll_s=POLL_S,
        envelope=OPEN,
    )
    listing = {u: queue.Listing(claims=(0,)) for u in names[:claimed]}
    listing |= {u: queue.Listing(claims=(0,), dones=(0,)) for u in names[claimed:][:done]}
    return attrs.evolve(queue.initial(spec), listing=listing)


@given(
    units=st.integers(1, 60),
    claimed=st.integers(0, 60),
    done=st.integers(0, 60),
    more=st.integers(1, 60),
    prefetch=st.integers(0, 3),
    unit_s=st.floats(0, 10),
    ahead_s=st.floats(0, 10),
)
def test_claims_ahead_go_at_once_while_untouched_units_abound_and_just_in_time_near_the_end(
    units: int, claimed: int, done: int, more: int, prefetch: int, unit_s: float, ahead_s: float
) -> None:
    """The claim ahead waits either not at all or until twice the last claim's time before
    the unit is expected to end; at once while untouched units outnumber twice what the
    holders have in hand, just in time once no unit is untouched; and a later listing with
    more units claimed never makes the claim earlier."""
    claimed, done = min(claimed, units), min(done, units - min(claimed, units))
    just_in_time = max(0.0, unit_s - 2 * ahead_s)
    state = _listed(units, claimed, done, prefetch)
    wait = queue.ahead_wait_s(state, unit_s, ahead_s)
    assert wait in (0.0, just_in_time)
    assert queue.untouched(state) == units - claimed - done
    if units - claimed - done > 2 * max(claimed, 1 + prefetch):
        assert wait == 0.0
    if claimed + done == units:
        assert wait == just_in_time
    later = _listed(units, min(units - done, claimed + more), done, prefetch)
    assert queue.ahead_wait_s(later, unit_s, ahead_s) >= wait
