"""A joining node adopts a tip only once it chains to the round before (spec/protocol.md
§16.5.2, :mod:`gm_core.tip`).

The attack of issue 12: a record far ahead of the tape with a head naming it. A joining
learner used to load its model and a booting closer to commit a fork on top of it (a
record with no predecessor). In a chained run both step back one round, find nothing
there, refuse the stray by name and join the real tape from its start; in a run created
before the chain the same stray is adopted (the contrast that shows the test can fail).
"""

from __future__ import annotations

import functools
import random

import attrs
import pytest
from fast_cluster import FAST_C, FAST_L, C, L, random_step
from hypothesis import given, settings
from hypothesis import strategies as st

from gm_core import auth, codec, keys, learner, schedule, tape, tip
from gm_core import cluster as cl
from gm_core.commands import Align, Command, Fetch, Get
from gm_core.events import GotObject, HeadRead, Started
from gm_core.records import AlgorithmConfig, Head, Manifest, PayloadRef, RoundRecord

ROLES = {"n0": frozenset({L, C}), "n1": frozenset({L, C}), "joiner": frozenset({L})}
CONFIG = AlgorithmConfig(sync_every=4, fragments=2, quorum=1)
OPEN = auth.for_run("run", None)
AHEAD = 40


def running(chained: bool, seed: int) -> cl.Cluster:
    """Two nodes that committed a few records; the joiner not started yet."""
    c = cl.create(CONFIG, ROLES, learner_options=FAST_L, closer_options=FAST_C)
    if not chained:
        c = attrs.evolve(c, manifest=attrs.evolve(c.manifest, chained=False))
    c = cl.start(cl.start(c, "n0"), "n1")
    rng = random.Random(seed)
    while len(cl.records(c)) < 3:
        c = random_step(c, rng, ["n0", "n1"])
    return c


def stray(c: cl.Cluster) -> tuple[cl.Cluster, int]:
    """A plausible record ``AHEAD`` rounds past the tape, and a head naming it."""
    newest = cl.records(c)[-1]
    far = newest.round + AHEAD
    fragment = schedule.fragment_of(far, CONFIG.fragments)
    record = attrs.evolve(
        newest,
        round=far,
        step=schedule.step_of(far, CONFIG.sync_every, CONFIG.fragments),
        fragment=fragment,
        closer="outsider",
    )
    assert tape.implausible(record, CONFIG) is None
    c = cl.inject(c, tape.record_key(OPEN, far, 0), codec.encode(record))
    c = cl.tamper(c, keys.head(), OPEN.pack(keys.head(), Head(round=far)))
    return c, far


def joined_rounds(c: cl.Cluster, name: str) -> list[int]:
    return [n.round for who, n in c.notes if who == name and n.kind == "joined"]


def joining(chained: bool) -> tuple[cl.Cluster, int]:
    """The joiner starts with the stray and its head in the bucket; the other nodes hang
    (so the head still names the stray when the joiner reads it)."""
    c, far = stray(running(chained, seed=3))
    c = cl.start(c, "joiner")
    for _ in range(60):
        while ready := [i for i, f in enumerate(c.inflight) if f.node == "joiner"]:
            c = cl.deliver(c, ready[0])
        for name, machine in cl.due_timers(c):
            if name == "joiner":
                c = cl.fire(c, name, machine)
        c = cl.tick(c, 0.25)
    return c, far


def test_a_joining_learner_refuses_a_stray_record_far_ahead() -> None:
    c, far = joining(chained=True)
    rounds = joined_rounds(c, "joiner")
    assert rounds == [far - AHEAD]
    refused = [n.detail for w, n in c.notes if w == "joiner" and n.kind == "record_rejected"]
    assert any("no record of round" in d for d in refused), refused
    learner = c.nodes["joiner"].learner
    assert learner is not None
    assert learner.held is not None
    assert learner.held.round < far


def restarted_closers(chained: bool) -> tuple[cl.Cluster, int]:
    """Both closers crash and boot again with the stray and its head in the bucket."""
    c, far = stray(running(chained, seed=5))
    for name in ("n0", "n1"):
        c = cl.start(cl.crash(c, name), name)
    rng = random.Random(6)
    for _ in range(600):
        c = random_step(c, rng, ["n0", "n1"])
    return c, far


def test_booting_closers_refuse_it_and_the_tape_stays_whole() -> None:
    c, _ = restarted_closers(chained=True)
    rounds = [r.round for r in cl.records(c) if r.closer != "outsider"]
    assert rounds == list(range(len(rounds)))
    assert len(rounds) > 5
    assert not cl.check(c)


def test_without_the_chain_a_booting_closer_forks_on_top_of_the_stray() -> None:
    c, far = restarted_closers(chained=False)
    rounds = [r.round for r in cl.records(c)]
    assert far + 1 in rounds
    assert any(v.invariant == "contiguous_tape" for v in cl.check(c))


def test_without_the_chain_the_joiner_adopts_the_stray() -> None:
    c, far = joining(chained=False)
    assert joined_rounds(c, "joiner") == [far]


# --- the rule itself, on tapes made of plain values ------------------------------------------


@functools.cache
def real_run() -> tuple[Manifest, RoundRecord]:
    c = running(chained=True, seed=1)
    return c.manifest, cl.records(c)[0]


def chain(manifest: Manifest, length: int) -> list[RoundRecord]:
    """``length`` records that chain from the manifest (the walk reads only ``round`` and
    ``prev``; the rest is a real record's)."""
    base = real_run()[1]
    records, prev = [], tape.chain_digest(manifest)
    for r in range(length):
        record = attrs.evolve(base, round=r, prev=prev, closer=f"c{r}")
        records.append(record)
        prev = tape.chain_digest(record)
    return records


def join(manifest: Manifest, written: dict[int, RoundRecord], hint: int) -> tuple[tip.Walk, int]:
    """A one-shot reader's walk over ``written`` (a record that does not chain is skipped,
    the slot above it empty). Returns the walk's end and the GETs it took."""
    w, gets = tip.walk(hint), 0
    while not w.done:
        gets += 1
        record = written.get(w.round)
        expected = tip.prev(w, manifest)
        if record is not None and (expected is None or record.prev == expected):
            w = tip.found(w, manifest, record)
        else:
            gets += record is not None  # the empty slot above a record that does not chain
            w = tip.missing(w)
    return w, gets


@settings(max_examples=200, deadline=None)
@given(
    length=st.integers(0, 30),
    strays=st.dictionaries(st.integers(0, 60), st.booleans(), max_size=6),
    hint=st.integers(-1, 60),
)
def test_a_joiner_adopts_a_tip_that_chains_to_the_tape(
    length: int, strays: dict[int, bool], hint: int
) -> None:
    """Whatever strays lie about (each one names a random predecessor, or the real record
    before it when it lies right after the tape) and whatever the hint names, the tip
    adopted is the real tape's, or a stray that extends it by chaining to its tip."""
    manifest = real_run()[0]
    real = chain(manifest, length)
    written = {r.round: r for r in real}
    shape = chain(manifest, 1)[0]
    for round_, extends in strays.items():
        if round_ >= length:
            named = tape.chain_digest(real[-1] if real else manifest)
            prev = named if extends and round_ == length else "0" * 64
            written[round_] = attrs.evolve(shape, round=round_, prev=prev, closer="stray")
    end, gets = join(manifest, written, hint)
    extended = strays.get(length, False)
    assert (end.held.round if end.held else -1) == length - 1 + extended
    assert gets <= 4 * (len(written) + 3)
    # A stray the walk met that had no record before it is named (never the real tape's).
    assert all(written[r].closer == "stray" for r, _ in end.refused)


@settings(max_examples=50, deadline=None)
@given(length=st.integers(1, 5000), hint=st.integers(-1, 6000))
def test_the_search_costs_a_few_reads_whatever_the_hint(length: int, hint: int) -> None:
    """Galloping from the hint and bisecting the last gap: a current hint costs a read of
    its record, one of the round after it and the tip's check (below); a garbage or
    lagging hint (an outsider rewrote the head) costs ``O(log n)`` (a hint past the tape:
    the log of the round it names), never a walk over the tape."""
    manifest = real_run()[0]
    written = {r.round: r for r in long_chain(manifest, length)}
    end, gets = join(manifest, written, hint)
    assert end.held is not None
    assert end.held.round == length - 1
    assert gets <= 2 * max(length, hint + 1).bit_length() + 8


@pytest.mark.parametrize("length", [1, 2, 3, 40, 1000])
def test_a_current_hint_costs_three_reads(length: int) -> None:
    """The head names the tip: its record, the empty round after it, and the record before
    it (the tip's check; the round after it is known empty and not read again). Round 0
    chains to the manifest and needs no check."""
    manifest = real_run()[0]
    written = {r.round: r for r in long_chain(manifest, length)}
    end, gets = join(manifest, written, length - 1)
    assert end.held is not None
    assert end.held.round == length - 1
    assert gets == (2 if length == 1 else 3)


@functools.cache
def long_chain(manifest: Manifest, length: int) -> list[RoundRecord]:
    return chain(manifest, length)  # cached: a prefix of the longest one would do as well


# --- a resumed node: does the tip descend from the record it adopted before? ----------------


def descend(
    records: dict[int, RoundRecord], tip_record: RoundRecord, since: int, digest: str
) -> tip.Descent:
    """Run a :class:`tip.Descent` over ``records`` (round -> the record a reader takes)."""
    d = tip.descent(tip_record, since, digest)
    reads = 0
    while not d.done:
        d = tip.descended(d, records.get(d.round))
        reads += 1
        assert reads <= tip_record.round - since + 1  # one read per round missed, at most
    return d


@given(length=st.integers(1, 40), data=st.data())
def test_a_tip_descends_from_every_record_of_its_chain(length: int, data: st.DataObject) -> None:
    manifest, _ = real_run()
    records = long_chain(manifest, 40)[:length]
    since = data.draw(st.integers(0, length - 1))
    tip_round = data.draw(st.integers(since, length - 1))
    written = {r.round: r for r in records}
    d = descend(written, records[tip_round], since, tape.chain_digest(records[since]))
    assert d.broken is None


@given(length=st.integers(2, 40), data=st.data())
def test_a_replaced_record_or_another_digest_breaks_the_descent(
    length: int, data: st.DataObject
) -> None:
    """A record overwritten between the saved round and the tip (a fork through an
    overwrite), the saved record itself replaced, or a chain that never held it: refused,
    naming the round."""
    manifest, _ = real_run()
    records = long_chain(manifest, 40)[:length]
    since = data.draw(st.integers(0, length - 2))
    tip_round = data.draw(st.integers(since + 1, length - 1))
    written = {r.round: r for r in records}
    digest = tape.chain_digest(records[since])
    replaced = data.draw(st.integers(since, tip_round - 1))
    forked = dict(written)
    forked[replaced] = attrs.evolve(written[replaced], closer="someone-else")
    d = descend(forked, records[tip_round], since, digest)
    assert d.broken is not None
    assert f"round {replaced}" in d.broken
    gone = dict(written)
    del gone[replaced]
    assert (
        descend(gone, records[tip_round], since, digest).broken == f"round {replaced} has no record"
    )
    other = descend(written, records[tip_round], since, "0" * 64)
    assert other.broken == f"round {since}'s record is not the one this node adopted"
    behind = tip.descent(records[since], since + 1, digest)
    assert behind.done
    assert behind.broken is not None


# --- a joiner reads the tip's commits while it checks the tip ------------------------------


def join_machine(c: cl.Cluster, head: bytes) -> tuple[learner.LearnerState, list[Command]]:
    """A fresh learner's join over ``c``'s store with ``head`` read with the manifest, to its
    loads; every command it gave, in order."""
    state = learner.initial("joiner", c.manifest, c.schema_digest)
    state, cmds = learner.advance(state, Started(now_s=c.now_s, head=HeadRead(head)))
    order: list[Command] = list(cmds)
    while state.phase is learner.Phase.BOOTING:
        get = next(x for x in cmds if isinstance(x, Get) and x.key.startswith(keys.ROUNDS_PREFIX))
        stored = c.store.get(get.key)
        data = None if stored is None else stored.data
        got = GotObject(now_s=c.now_s, req=get.req, data=data, etag=None)
        state, cmds = learner.advance(state, got)
        order.extend(cmds)
    return state, order


def test_a_joiner_fetches_the_tips_commits_before_its_check_and_loads_those() -> None:
    """The learner asks for the commits of the record the head names (``Fetch``) as soon as
    it holds it, before the reads that check it; once the check passes, it loads exactly
    those commits (``Align``). Nothing is loaded before the walk adopts the tip."""
    c = running(chained=True, seed=3)
    newest = cl.records(c)[-1]
    assert newest.round > 0  # a tip that needs the check
    state, order = join_machine(c, OPEN.pack(keys.head(), Head(round=newest.round)))
    assert state.phase is learner.Phase.LOADING
    reads = [x.key for x in order if isinstance(x, Get) and x.key.startswith(keys.ROUNDS_PREFIX)]
    assert reads == [
        tape.record_key(OPEN, r, 0) for r in (newest.round, newest.round + 1, newest.round - 1)
    ]
    fetched = [i for i, x in enumerate(order) if isinstance(x, Fetch)]
    check = next(i for i, x in enumerate(order) if isinstance(x, Get) and x.key == reads[-1])
    assert fetched
    assert max(fetched) < check  # fetched before the check was even asked for
    aligns = [x for x in order if isinstance(x, Align)]
    assert min(order.index(x) for x in aligns) > check  # loaded only once the tip is adopted
    assert {(x.fragment, x.theta) for x in aligns} == {
        (x.fragment, x.theta) for x in order if isinstance(x, Fetch)
    }


@pytest.mark.parametrize("hint", ["behind", "garbage"])
def test_a_joiner_fetches_only_the_hinted_records_commits(hint: str) -> None:
    """A head a round behind: the commits of the record it names are fetched (those of
    fragments that did not change since are the tip's), not those of the records the walk
    meets after it; a head that is no hint: nothing is fetched (the walk from round 0 meets
    records whose commits are old)."""
    c, rng = running(chained=True, seed=3), random.Random(3)
    while len(records := cl.records(c)) < 3 or frontiers(c, records[-2]) == frontiers(
        c, records[-1]
    ):  # until the newest record commits something its predecessor did not have
        c = random_step(c, rng, ["n0", "n1"])
    behind = records[-2]
    head = OPEN.pack(keys.head(), Head(round=behind.round)) if hint == "behind" else b"garbage"
    state, order = join_machine(c, head)
    assert state.phase is learner.Phase.LOADING
    fetches = {(x.fragment, x.theta) for x in order if isinstance(x, Fetch)}
    assert fetches == (frontiers(c, behind) if hint == "behind" else set())


def frontiers(c: cl.Cluster, record: RoundRecord) -> set[tuple[int, PayloadRef]]:
    """The commits ``record`` names, by fragment."""
    return {(f, fs.theta) for f, fs in enumerate(tape.frontier_of(c.manifest, record))}
