"""Properties of the barrier machine, run against the model store with every interleaving
hypothesis finds: it never releases a party before ``parties`` distinct arrivals of one
generation were written, every party of a generation agrees on who it held, everyone is
released once all have arrived, names are reusable by generation, a timeout names who
arrived, and nothing a forger puts in the barrier's folder makes ``advance`` raise."""

from __future__ import annotations

from collections.abc import Callable

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gm_core import auth, barrier, keys
from gm_core.auth import Envelope
from gm_core.barrier import BarrierSpec, BarrierState, Released, TimedOut, Verdict
from gm_core.commands import Command, Delete, Get, List, Notify, PutOnce, WakeAt
from gm_core.events import (
    Deleted,
    Event,
    GotObject,
    Listed,
    PutDone,
    RequestFailed,
    Started,
    TimerFired,
)
from gm_core.store_model import ModelStore

NAME = "sync"
POLL_S = 1.0


@attrs.define
class World:
    """Parties waiting at one barrier over a model store; a test picks what happens next."""

    parties: int
    timeout_s: float
    store: ModelStore = attrs.field(factory=ModelStore)
    now_s: float = 0.0
    states: dict[str, BarrierState] = attrs.field(factory=dict)
    inflight: list[tuple[str, Command]] = attrs.field(factory=list)
    timers: dict[str, float] = attrs.field(factory=dict)
    results: list[tuple[str, barrier.Result, frozenset[str]]] = attrs.field(factory=list)
    """Each finished wait, with the keys ever created when it finished."""
    waits_left: dict[str, int] = attrs.field(factory=dict)
    envelope: Envelope | None = None

    def spec(self, party: str, first: int = 0) -> BarrierSpec:
        return BarrierSpec(
            name=NAME,
            party=party,
            parties=self.parties,
            timeout_s=self.timeout_s,
            poll_s=POLL_S,
            first=first,
            envelope=self.envelope,
        )

    def wait(self, party: str, first: int = 0) -> None:
        self.states[party] = barrier.initial(self.spec(party, first))
        self.feed(party, Started(now_s=self.now_s))

    def feed(self, party: str, event: Event) -> None:
        before = self.states[party]
        state, cmds = barrier.advance(before, event)
        self.states[party] = state
        for cmd in cmds:
            if isinstance(cmd, WakeAt):
                self.timers[party] = cmd.at_s
            elif isinstance(cmd, Notify):
                pass
            else:
                self.inflight.append((party, cmd))
        if state.result is not None and before.result is None:
            created = frozenset(k for k, _ in self.store.created)
            self.results.append((party, state.result, created))
            self.timers.pop(party, None)
            self.next_wait(party, state.result)

    def next_wait(self, party: str, result: barrier.Result) -> None:
        left = self.waits_left.get(party, 0)
        if left > 0 and isinstance(result, Released):
            self.waits_left[party] = left - 1
            self.wait(party, first=result.generation + 1)

    def execute(self, index: int, fault: str | None = None) -> None:
        party, cmd = self.inflight.pop(index)
        if fault == "fail":
            self.feed(party, RequestFailed(now_s=self.now_s, req=cmd.req, error="injected"))  # type: ignore[union-attr]
            return
        outcome: Event
        if isinstance(cmd, Get):
            got = self.store.get(cmd.key)
            data, etag = (None, None) if got is None else (got.data, got.etag)
            outcome = GotObject(now_s=self.now_s, req=cmd.req, data=data, etag=etag)
        elif isinstance(cmd, PutOnce):
            self.store, created = self.store.put_once(cmd.key, cmd.data)
            outcome = PutDone(now_s=self.now_s, req=cmd.req, created=created)
        elif isinstance(cmd, List):
            listed = self.store.list(cmd.prefix, cmd.offset)
            outcome = Listed(now_s=self.now_s, req=cmd.req, keys=listed)
        else:
            assert isinstance(cmd, Delete), cmd
            self.store = self.store.delete(cmd.keys)
            outcome = Deleted(now_s=self.now_s, req=cmd.req)
        if fault == "lose":
            outcome = RequestFailed(now_s=self.now_s, req=cmd.req, error="response lost")  # type: ignore[union-attr]
        if party in self.states:
            self.feed(party, outcome)

    def tick(self) -> bool:
        """Fire the earliest timer (time moves to it); False when no timer is set."""
        if not self.timers:
            return False
        party = min(self.timers, key=lambda p: (self.timers[p], p))
        self.now_s = max(self.now_s, self.timers.pop(party))
        self.feed(party, TimerFired(now_s=self.now_s))
        return True

    def crash(self, party: str) -> None:
        self.states.pop(party, None)
        self.timers.pop(party, None)
        self.inflight = [(p, c) for p, c in self.inflight if p != party]

    def forge(self, key: str, data: bytes) -> None:
        self.store, _ = self.store.put_once(key, data)

    def run_fair(self, limit: int = 20_000) -> None:
        """Deliver everything in order, firing timers only when nothing is in flight."""
        for _ in range(limit):
            if self.inflight:
                self.execute(0)
            elif not self.tick():
                return
        raise AssertionError("no quiescence")

    def result_of(self, party: str) -> barrier.Result | None:
        found = [r for p, r, _ in self.results if p == party]
        return found[-1] if found else None


def check_safety(world: World) -> None:
    """No release before ``parties`` distinct arrivals of its generation were written, and the
    parties released from one generation agree on who it held."""
    members_of: dict[int, tuple[str, ...]] = {}
    for party, result, created in world.results:
        if not isinstance(result, Released):
            continue
        g = result.generation
        assert party in result.members
        assert len(set(result.members)) == world.parties == len(result.members)
        for member in result.members:
            assert barrier.arrival_key(world.spec(member), g, member) in created, (member, g)
        assert members_of.setdefault(g, result.members) == result.members


def drive(world: World, data: st.DataObject, steps: int, faults: bool, crashes: bool) -> None:
    kinds = ["deliver"] * 6 + ["tick"] + (["fail", "lose"] if faults else [])
    kinds += ["crash"] if crashes else []
    for _ in range(steps):
        kind = data.draw(st.sampled_from(kinds))
        if kind in ("deliver", "fail", "lose") and world.inflight:
            index = data.draw(st.integers(0, len(world.inflight) - 1))
            world.execute(index, None if kind == "deliver" else kind)
        elif kind == "crash" and world.states:
            party = data.draw(st.sampled_from(sorted(world.states)))
            world.crash(party)
            if data.draw(st.booleans()):
                world.wait(party)  # restarted under the same id, remembering nothing
        elif world.inflight and not faults:
            continue  # only the fault runs let time jump past a request's deadline
        elif not world.tick():
            break
        check_safety(world)


PARTIES = st.integers(1, 4)


KEYED = auth.for_run("run", auth.derive(bytes(range(32))))
"""An authenticated run's envelope: arrivals and markers get keyed names."""
OUTSIDER = auth.for_run("run", auth.derive(bytes(range(1, 33))))


@settings(max_examples=150, deadline=None)
@given(PARTIES, st.sampled_from([None, KEYED]), st.data())
def test_everyone_is_released_together_once_all_arrived(
    parties: int, envelope: Envelope | None, data: st.DataObject
) -> None:
    world = World(parties=parties, timeout_s=1e9, envelope=envelope)
    names = [f"p{i}" for i in range(parties)]
    for name in data.draw(st.permutations(names)):
        world.wait(name)
    drive(world, data, steps=60, faults=False, crashes=False)
    world.run_fair()
    check_safety(world)
    results = [world.result_of(n) for n in names]
    assert results == [Released(generation=0, members=tuple(names))] * parties


@settings(max_examples=150, deadline=None)
@given(PARTIES, st.integers(1, 3), st.data())
def test_names_are_reused_by_generation(parties: int, waits: int, data: st.DataObject) -> None:
    world = World(parties=parties, timeout_s=1e9)
    names = [f"p{i}" for i in range(parties)]
    world.waits_left = dict.fromkeys(names, waits - 1)
    for name in names:
        world.wait(name)
    drive(world, data, steps=80, faults=False, crashes=False)
    world.run_fair()
    check_safety(world)
    for name in names:
        gens = [r.generation for p, r, _ in world.results if p == name]
        assert gens == list(range(waits))
    # The marker of every generation is all that is left of it.
    left = world.store.list(keys.barrier_prefix(NAME))
    assert left == tuple(keys.barrier_marker(NAME, g) for g in range(waits))


@settings(max_examples=150, deadline=None)
@given(st.integers(1, 3), st.integers(1, 4), st.data())
def test_extra_parties_overflow_into_the_next_generation(
    parties: int, extra: int, data: st.DataObject
) -> None:
    world = World(parties=parties, timeout_s=100.0)
    names = [f"p{i}" for i in range(parties + extra)]
    for name in names:
        world.wait(name)
    drive(world, data, steps=80, faults=False, crashes=False)
    world.run_fair()
    check_safety(world)
    released = [r for _, r, _ in world.results if isinstance(r, Released)]
    timed_out = [(p, r) for p, r, _ in world.results if isinstance(r, TimedOut)]
    assert len(released) == (len(names) // parties) * parties
    assert len(world.results) == len(names)  # every wait ended one way or the other
    for party, result in timed_out:  # the leftovers met nobody to go with
        assert party in result.arrived
        assert len(result.arrived) < parties


@settings(max_examples=150, deadline=None)
@given(st.integers(2, 4), st.data())
def test_a_missing_party_times_everyone_out_naming_who_arrived(
    parties: int, data: st.DataObject
) -> None:
    world = World(parties=parties, timeout_s=10.5)
    present = [f"p{i}" for i in range(parties - 1)]
    for name in present:
        world.wait(name)
    world.run_fair()  # polls every second up to the deadline, then the first deadline breaks it
    outcomes = [world.result_of(n) for n in present]
    breakers = {r.by for r in outcomes if isinstance(r, TimedOut)}
    assert len(breakers) == 1  # one broken marker won, everyone read the same one
    for result in outcomes:
        assert isinstance(result, TimedOut)
        assert result.generation == 0
        assert result.arrived == tuple(present)
    assert "timed out" in barrier.describe(world.states[present[0]].spec, outcomes[0])


@settings(max_examples=200, deadline=None)
@given(PARTIES, st.data())
def test_faults_crashes_and_restarts_never_release_early(parties: int, data: st.DataObject) -> None:
    world = World(parties=parties, timeout_s=data.draw(st.sampled_from([3.5, 30.0, 1e9])))
    names = [f"p{i}" for i in range(parties + data.draw(st.integers(0, 1)))]
    for name in names:
        world.wait(name)
    drive(world, data, steps=120, faults=True, crashes=True)
    check_safety(world)


GARBAGE = st.one_of(
    st.binary(max_size=64),
    st.sampled_from(
        [
            b"[]",
            b'{"format":1}',
            b'{"format":1,"kind":"released","generation":0,"members":[]}',
            b'{"format":1,"kind":"released","generation":0,"members":["b","a"]}',
            b'{"format":1,"kind":"released","generation":0,"members":["a","a"]}',
            b'{"format":1,"kind":"released","generation":9,"members":["p0"]}',
            b'{"format":true,"kind":"released","generation":0,"members":["p0"]}',
            b'{"format":1.0,"kind":"released","generation":0,"members":["p0"]}',
            b'{"format":1,"kind":"broken","generation":0,"arrived":[],"by":"../x"}',
            b'{"format":1,"kind":"released","generation":0,"members":["p0"],"x":1}',
            b"[" * 100_000,
        ]
    ),
)
JUNK_KEYS = st.sampled_from(
    [
        f"barriers/{NAME}/x",
        f"barriers/{NAME}/000000000000/parties/..json",
        f"barriers/{NAME}/000000000000/parties/p0.bin",
        f"barriers/{NAME}/000000000000/other.json",
        f"barriers/{NAME}/0/released.json",
        f"barriers/{NAME}/000000000000/parties/a/b.json",
    ]
)


@settings(max_examples=200, deadline=None)
@given(PARTIES, st.lists(st.tuples(JUNK_KEYS, GARBAGE), max_size=3), GARBAGE, st.data())
def test_garbage_in_the_folder_is_rejected_by_name_and_survived(
    parties: int,
    junk: list[tuple[str, bytes]],
    marker: bytes,
    data: st.DataObject,
) -> None:
    world = World(parties=parties, timeout_s=1e9)
    names = [f"p{i}" for i in range(parties)]
    for key, body in junk:
        world.forge(key, body)
    for name in names:
        world.wait(name)
    drive(world, data, steps=30, faults=False, crashes=False)
    # A forger takes the current generation's marker key before any party writes it.
    generation = max((s.generation or 0) for s in world.states.values())
    forged = keys.barrier_marker(NAME, generation)
    if isinstance(barrier.decode(marker, generation), str):
        world.forge(forged, marker)
    world.run_fair()
    check_safety(world)
    results = [world.result_of(n) for n in names]
    assert all(isinstance(r, Released) for r in results)
    assert len({r.generation for r in results if isinstance(r, Released)}) == 1
    rejected = {r.verdict for s in world.states.values() for r in s.rejections}
    if junk:
        assert Verdict.BAD_KEY in rejected


@pytest.mark.parametrize("envelope", [None, KEYED], ids=["open", "keyed"])
def test_an_outsider_arrives_only_in_an_open_run(envelope: Envelope | None) -> None:
    """Arrivals are judged by their keys alone (nobody reads them). In an open run anyone
    can write one and count as a party; in an authenticated run an arrival, or a verdict,
    counts only under the name the run key gives it, so the outsider's plain arrival and
    one named with another key are rejected by name and the barrier waits for a real party."""
    world = World(parties=3, timeout_s=30.0, envelope=envelope)
    plain = keys.barrier_arrival(NAME, 0, "evil")
    other_key = barrier.arrival_key(
        attrs.evolve(world.spec("evil2"), envelope=OUTSIDER), 0, "evil2"
    )
    for key in (plain, other_key):
        world.forge(key, barrier.ARRIVAL_BODY)
    world.wait("p0")
    world.wait("p1")
    world.run_fair()
    results = [world.result_of(p) for p in ("p0", "p1")]
    if envelope is None:
        assert results == [Released(generation=0, members=("evil", "p0", "p1"))] * 2
        return
    assert all(isinstance(r, TimedOut) and r.arrived == ("p0", "p1") for r in results), results
    rejected = {r.key for s in world.states.values() for r in s.rejections}
    assert {plain, other_key} <= rejected


@given(st.binary(max_size=200), st.integers(0, 5))
def test_decode_is_total(data: bytes, generation: int) -> None:
    decoded = barrier.decode(data, generation)
    assert isinstance(decoded, str | barrier.ReleasedMarker | barrier.BrokenMarker)


NAMES = st.lists(st.from_regex(r"[a-z][a-z0-9-]{0,8}", fullmatch=True), min_size=1, max_size=5)


@given(NAMES, st.integers(0, 10**6), st.booleans())
def test_markers_round_trip(names: list[str], generation: int, broken: bool) -> None:
    parties = tuple(sorted(set(names)))
    marker: barrier.Marker = (
        barrier.BrokenMarker(generation=generation, arrived=parties, by=parties[0])
        if broken
        else barrier.ReleasedMarker(generation=generation, members=parties)
    )
    assert barrier.decode(barrier.encode(marker), generation) == marker
    assert isinstance(barrier.decode(barrier.encode(marker), generation + 1), str)


def _spec(**changes: object) -> Callable[[], BarrierSpec]:
    base: dict[str, object] = {"name": NAME, "party": "a", "parties": 2}
    base |= {"timeout_s": 1.0, "poll_s": 1.0}
    return lambda: BarrierSpec(**{**base, **changes})  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "changes",
    [{"name": "a/b"}, {"party": ".."}, {"parties": 0}, {"timeout_s": -1.0}, {"poll_s": 0.0}],
)
def test_caller_misuse_raises(changes: dict[str, object]) -> None:
    with pytest.raises(ValueError, match=r"must be|out of range"):
        _spec(**changes)()
