"""The learner and closer are total: any state and any event give a state and commands.

Bad data from a peer or the store (garbage objects, outcomes for requests that do
not exist, failures anywhere) is survived; only a caller's misuse raises.
"""

from __future__ import annotations

import attrs
import hypothesis.strategies as st
import pytest
from hypothesis import given, settings

from gm_core import auth, closer, codec, keys, learner, tape, timing
from gm_core import cluster as cl
from gm_core.commands import Capture, Get, Pace, PutOnce
from gm_core.events import (
    Aligned,
    Captured,
    CloseRequested,
    Deleted,
    Event,
    GotObject,
    Listed,
    Merged,
    Probed,
    PutDone,
    RequestFailed,
    Shared,
    Started,
    Stepped,
    TimerFired,
    Verified,
)
from gm_core.records import AlgorithmConfig, Head, PayloadRef, Reason

L, C = cl.Machine.LEARNER, cl.Machine.CLOSER
ROLES = {"n0": frozenset({L, C}), "n1": frozenset({L, C}), "n2": frozenset({L})}
CONFIG = AlgorithmConfig(sync_every=8, fragments=2, quorum=2, in_flight=1)
REF = PayloadRef(key=keys.payload(0, "a" * 64), size=3, digest="a" * 64)

OPEN = auth.for_manifest(None)
"""An open run's envelope (it seals and opens bodies bare, whatever the run id)."""


def warmed(ticks: int) -> cl.Cluster:
    c = cl.create(CONFIG, ROLES)
    for name in sorted(ROLES):
        c = cl.start(c, name)
    for _ in range(ticks):
        while c.inflight:
            c = cl.deliver(c, 0)
        for name, machine in cl.due_timers(c):
            c = cl.fire(c, name, machine)
        for name in sorted(ROLES):
            c = cl.train(c, name, 1)
        c = cl.tick(c, 0.25)
    return c


WARM = [warmed(t) for t in (0, 3, 17, 40)]
garbage = st.one_of(
    st.none(),
    st.binary(max_size=64),
    st.just(codec.encode(Head(round=3))),
    st.sampled_from([o.data for o in WARM[-1].store.objects.values()]),
)


def events(now: float, reqs: list[int]) -> st.SearchStrategy[Event]:
    req = st.sampled_from(reqs) if reqs else st.integers(0, 5)
    return st.one_of(
        st.builds(TimerFired, now_s=st.just(now)),
        st.builds(CloseRequested, now_s=st.just(now)),
        st.builds(GotObject, now_s=st.just(now), req=req, data=garbage, etag=st.none()),
        st.builds(Probed, now_s=st.just(now), req=req, etag=st.sampled_from([None, "x", "y"])),
        st.builds(PutDone, now_s=st.just(now), req=req, created=st.booleans()),
        st.builds(
            Listed,
            now_s=st.just(now),
            req=req,
            keys=st.lists(st.sampled_from([keys.snapshot(3, "zz"), "junk", keys.head()])).map(
                tuple
            ),
        ),
        st.builds(Deleted, now_s=st.just(now), req=req),
        st.builds(Captured, now_s=st.just(now), req=req, payload=st.just(REF)),
        st.builds(Verified, now_s=st.just(now), req=req, reason=st.sampled_from([None, *Reason])),
        st.builds(
            Merged,
            now_s=st.just(now),
            req=req,
            theta=st.just(REF),
            outer=st.none(),
            update=st.none(),
            cosine=st.none(),
            outliers=st.lists(st.sampled_from([*sorted(ROLES), "zz"])).map(tuple),
        ),
        st.builds(Aligned, now_s=st.just(now), req=req, step=st.just(10**6), tokens=st.just(10**9)),
        st.builds(RequestFailed, now_s=st.just(now), req=req, error=st.just("boom")),
        st.builds(
            Shared,
            now_s=st.just(now),
            key=st.sampled_from(SHARED_KEYS),
            data=garbage.map(lambda d: d or b""),
        ),
    )


SHARED_KEYS = sorted(
    {k for k in WARM[-1].store.objects if k.startswith((keys.ROUNDS_PREFIX, keys.SNAPSHOTS_PREFIX))}
    | {keys.snapshot(3, "n0"), tape.record_key(OPEN, 5, 0), "junk", keys.head()}
)
"""Keys a machine may be told of: the run's own objects, ones of rounds to come, others."""


@settings(deadline=None)
@given(data=st.data(), which=st.integers(0, len(WARM) - 1), name=st.sampled_from(sorted(ROLES)))
def test_any_event_in_any_state_is_survived(data: st.DataObject, which: int, name: str) -> None:
    node = WARM[which].nodes[name]
    now = WARM[which].now_s + 1.0
    for _ in range(6):
        if node.learner is not None:
            reqs = sorted(node.learner.pending)
            event = data.draw(events(now, reqs))
            state, _ = learner.advance(node.learner, event)
            assert isinstance(state, learner.LearnerState)
            node = attrs.evolve(node, learner=state)
        if node.closer is not None:
            event = data.draw(events(now, sorted(node.closer.pending)))
            cstate, _ = closer.advance(node.closer, event)
            assert isinstance(cstate, closer.CloserState)
            node = attrs.evolve(node, closer=cstate)
        now += data.draw(st.sampled_from([0.0, 0.5, 30.0]))


def test_steps_going_backwards_is_the_callers_misuse() -> None:
    node = WARM[-1].nodes["n2"]
    assert node.learner is not None
    late = Stepped(now_s=99.0, step=node.learner.step + 5, tokens=node.learner.tokens + 5)
    state, _ = learner.advance(node.learner, late)
    with pytest.raises(ValueError, match="only grow"):
        learner.advance(state, Stepped(now_s=99.5, step=1, tokens=1))


def test_a_fresh_learner_asks_for_the_head_hint_and_stalls_training() -> None:
    c = cl.create(CONFIG, ROLES)
    state = learner.initial("n2", c.manifest, c.schema_digest)
    state, cmds = learner.advance(state, Started(now_s=0.0))
    assert Get(req=1, key=keys.head()) in cmds
    paces = [x for x in cmds if isinstance(x, Pace)]
    assert paces == [Pace(next_step=0, stalled=True)]


def test_a_due_round_captures_then_writes_its_snapshot_create_once() -> None:
    def free(c: cl.Cluster) -> bool:
        state = c.nodes["n2"].learner
        assert state is not None
        running = state.phase is learner.Phase.RUNNING
        return running and state.next_round <= state.aligned_round + CONFIG.in_flight

    ticks = next(t for t in range(1, 40) if free(warmed(t)))
    node = warmed(ticks).nodes["n2"]
    assert node.learner is not None
    state = node.learner
    due = learner.schedule_step(state, state.next_round)
    state, cmds = learner.advance(state, Stepped(now_s=50.0, step=due, tokens=due * 8))
    captures = [x for x in cmds if isinstance(x, Capture)]
    assert [x.round for x in captures] == [node.learner.next_round]
    state, cmds = learner.advance(state, Captured(now_s=50.1, req=captures[0].req, payload=REF))
    puts = [x for x in cmds if isinstance(x, PutOnce)]
    assert [p.key for p in puts] == [keys.snapshot(captures[0].round, "n2")]


@given(in_flight=st.integers(1, 20), fragments=st.integers(1, 8))
def test_max_stale_versions_matches_the_publishing_rule(in_flight: int, fragments: int) -> None:
    """Brute force: the oldest base a learner can hold when it publishes round r."""
    r = 3 * fragments + in_flight + 5
    aligned_through = r - in_flight  # it has aligned every commit up to here
    last_commit_of_fragment = r - fragments
    missing = sum(
        1
        for q in range(aligned_through + 1, last_commit_of_fragment + 1)
        if q % fragments == r % fragments
    )
    assert closer.max_stale_versions(in_flight, fragments) == missing


@given(data=st.binary(max_size=200), round_=st.integers(0, 10))
def test_parse_record_never_raises(data: bytes, round_: int) -> None:
    parsed = tape.parse_record(OPEN, data, round_, WARM[-1].manifest.config)
    assert isinstance(parsed, tape.BadRecord) or parsed.round == round_


def test_parse_record_names_a_record_at_the_wrong_key() -> None:
    records = cl.records(WARM[-1])
    bad = tape.parse_record(OPEN, codec.encode(records[1]), 0, WARM[-1].manifest.config)
    assert isinstance(bad, tape.BadRecord)
    assert "round 1" in bad.reason


def test_every_record_a_correct_run_writes_is_plausible() -> None:
    config = WARM[-1].manifest.config
    tape_ = cl.records(WARM[-1])
    assert len(tape_) > 2 * config.fragments
    assert [tape.implausible(r, config) for r in tape_] == [None] * len(tape_)


IMPLAUSIBLE = {
    "fragment": lambda r: {
        "fragment": (r.fragment + 1) % 2,
        "version": r.frontier[(r.fragment + 1) % 2].version,
    },
    "step": lambda r: {"step": r.step + 1},
    "version": lambda r: {
        "version": r.round + 2,
        "frontier": tuple(
            attrs.evolve(fs, version=r.round + 2) if f == r.fragment else fs
            for f, fs in enumerate(r.frontier)
        ),
    },
    "swept_below": lambda r: {"swept_below": r.round + 1},
    "timing": lambda r: {"grace_s": timing.MAX_ESTIMATE_S * 2},
}


@given(which=st.sampled_from(sorted(IMPLAUSIBLE)), index=st.integers(0, 10**6))
def test_a_record_that_breaks_one_rule_of_its_round_is_refused(which: str, index: int) -> None:
    config = WARM[-1].manifest.config
    tape_ = cl.records(WARM[-1])
    genuine = tape_[index % len(tape_)]
    forged = attrs.evolve(genuine, **IMPLAUSIBLE[which](genuine))
    assert tape.implausible(forged, config) is not None
    parsed = tape.parse_record(OPEN, codec.encode(forged), forged.round, config)
    assert isinstance(parsed, tape.BadRecord)


@given(data=st.one_of(st.none(), st.binary(max_size=40)), hint=st.integers(0, 10**6))
def test_parse_head_falls_back_to_the_tape_start(data: bytes | None, hint: int) -> None:
    assert tape.parse_head(OPEN, data) == -1 or data is not None
    assert tape.parse_head(OPEN, codec.encode(Head(round=hint))) == hint
    assert tape.parse_head(OPEN, codec.encode(Head(round=tape.LAST_ROUND + 1))) == -1
