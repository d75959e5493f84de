"""The finish machine over the model store: a run is said finished (``finished.json``, once)
only when every slice is counted done and no learner's lease is live on the looker's clock;
a crashed learner's lease ages out, a closer's lease holds nothing open, a missing unit
stops the look at once, and garbage counts for nothing."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gm_core import auth, codec, completion, finish, keys
from gm_core.commands import Get, List, PutOnce, WakeAt
from gm_core.completion import DoneMarker, Summary
from gm_core.events import GotObject, Listed, PutDone, Started, TimerFired
from gm_core.records import Lease
from gm_core.store_model import ModelStore

ENVELOPE = auth.for_run("run1", auth.derive(bytes(32)))
UNITS = frozenset({"a", "b"})
TIMEOUT_S = 3.0


def lease(store: ModelStore, node: str, roles: tuple[str, ...] = ("learner",)) -> ModelStore:
    key = keys.lease(node)
    body = codec.encode(Lease(node=node, roles=roles, seq=store.writes, renew_s=1.0))
    return store.put(key, ENVELOPE.seal(key, body))


def done(store: ModelStore, unit: str, attempt: int = 0, node: str = "n1") -> ModelStore:
    key = keys.queue_done("q", unit, attempt)
    marker = DoneMarker(node=node, attempt=attempt, steps=2, tokens=10)
    store, _ = store.put_once(key, ENVELOPE.seal(key, completion.encode_done(marker)))
    return store


def look(
    store: ModelStore, renewing: tuple[str, ...] = (), shape: completion.Shape | None = None
) -> tuple[finish.FinishState, ModelStore, float]:
    """Run the machine to its end; ``renewing`` nodes renew their leases as time moves."""
    spec = finish.FinishSpec(
        node="me",
        shape=shape or completion.Queued(UNITS),
        queue="q",
        round=7,
        lease_timeout_s=TIMEOUT_S,
        poll_s=1.0,
        wait_s=20.0,
        envelope=ENVELOPE,
    )
    now = 0.0
    state, cmds = finish.advance(finish.initial(spec), Started(now_s=now))
    for _ in range(1000):
        if state.phase is finish.Phase.DONE:
            return state, store, now
        (cmd,) = [c for c in cmds if not hasattr(c, "kind")]
        if isinstance(cmd, WakeAt):
            now = cmd.at_s
            for node in renewing:
                store = lease(store, node)
            state, cmds = finish.advance(state, TimerFired(now_s=now))
        elif isinstance(cmd, List):
            state, cmds = finish.advance(
                state, Listed(now_s=now, req=cmd.req, keys=store.list(cmd.prefix))
            )
        elif isinstance(cmd, Get):
            got = store.get(cmd.key)
            data, etag = (None, None) if got is None else (got.data, got.etag)
            state, cmds = finish.advance(
                state, GotObject(now_s=now, req=cmd.req, data=data, etag=etag)
            )
        else:
            assert isinstance(cmd, PutOnce)
            store, created = store.put_once(cmd.key, cmd.data)
            state, cmds = finish.advance(state, PutDone(now_s=now, req=cmd.req, created=created))
    raise AssertionError("the look never ended")


def summary(store: ModelStore) -> Summary | str | None:
    got = store.get(keys.finished())
    if got is None:
        return None
    body = ENVELOPE.open(keys.finished(), got.data)
    assert isinstance(body, bytes)
    return completion.decode_summary(body)


def test_every_unit_done_and_nobody_live_is_finished_once() -> None:
    store = lease(done(done(ModelStore(), "a"), "b", attempt=1), "me")
    state, store, _ = look(store)
    assert state.outcome is finish.Outcome.FINISHED
    assert summary(store) == Summary(by="me", round=7, slices=2, steps=4, tokens=20)
    again, store2, _ = look(store)  # a second looker's write loses; it agrees all the same
    assert again.outcome is finish.Outcome.FINISHED
    assert store2.get(keys.finished()) == store.get(keys.finished())


def test_a_crashed_learners_lease_ages_out_on_the_lookers_clock() -> None:
    store = lease(done(done(ModelStore(), "a"), "b"), "dead")
    state, store, now = look(store)
    assert state.outcome is finish.Outcome.FINISHED
    assert now > TIMEOUT_S  # it waited one lease timeout from first seeing the lease


def test_a_live_learner_keeps_the_run_open_until_the_look_gives_up() -> None:
    store = lease(done(done(ModelStore(), "a"), "b"), "busy")
    state, store, now = look(store, renewing=("busy",))
    assert state.outcome is finish.Outcome.LIVE
    assert summary(store) is None
    assert now >= 20.0


def test_a_closers_lease_holds_nothing_open() -> None:
    store = lease(done(done(ModelStore(), "a"), "b"), "closer-1", roles=("closer",))
    state, _, _ = look(store, renewing=("closer-1",))
    assert state.outcome is finish.Outcome.FINISHED


def test_a_unit_not_done_stops_the_look_at_once() -> None:
    state, store, now = look(done(ModelStore(), "a"))
    assert state.outcome is finish.Outcome.MISSING
    assert isinstance(state.verdict, completion.NotFinished)
    assert state.verdict.missing == ("b",)
    assert summary(store) is None
    assert now == 0.0


def test_plain_data_needs_one_node_done() -> None:
    key = keys.done("n1")
    marker = DoneMarker(node="n1", attempt=0, steps=5, tokens=50)
    store, _ = ModelStore().put_once(key, ENVELOPE.seal(key, completion.encode_done(marker)))
    state, store, _ = look(store, shape=completion.Plain())
    assert state.outcome is finish.Outcome.FINISHED
    assert summary(store) == Summary(by="me", round=7, slices=1, steps=5, tokens=50)


GARBAGE = [b"", b"{}", b"not json", b"gm/2 hmac-sha256 0000000000000000 " + b"0" * 64 + b"\n{}"]


@given(st.sampled_from(GARBAGE), st.sampled_from(GARBAGE))
def test_garbage_done_markers_and_leases_count_for_nothing(
    bad_done: bytes, bad_lease: bytes
) -> None:
    store = done(ModelStore(), "a")
    store, _ = store.put_once(keys.queue_done("q", "b", 0), bad_done)
    store = store.put(keys.lease("ghost"), bad_lease)
    state, store, _ = look(store)
    assert state.outcome is finish.Outcome.MISSING  # b's only marker is garbage
    assert state.rejected >= 2
    store = done(store, "b", attempt=1)  # the unit's next holder finishes it
    state, store, _ = look(store)
    assert state.outcome is finish.Outcome.FINISHED  # the garbage lease is no learner


@pytest.mark.parametrize(
    "bad",
    [
        b"",
        b"[]",
        b'{"format":1}',
        b'{"format":1,"by":"n","round":"x","slices":1,"steps":1,"tokens":1}',
        b'{"format":1,"by":"../n","round":1,"slices":1,"steps":1,"tokens":1}',
        b'{"format":2,"by":"n","round":1,"slices":1,"steps":1,"tokens":1}',
        b'{"format":1,"by":"n","round":-2,"slices":1,"steps":1,"tokens":1}',
        b'{"format":1,"by":"n","round":1,"slices":1,"steps":-1,"tokens":1}',
        b"{" * 10000,
    ],
)
def test_a_garbage_summary_is_refused_by_name(bad: bytes) -> None:
    assert isinstance(completion.decode_summary(bad), str)


@given(
    st.builds(
        Summary,
        by=st.sampled_from(["n1", "node-2"]),
        round=st.integers(-1, keys.ROUND_LIMIT - 1),
        slices=st.integers(0, 2**63 - 1),
        steps=st.integers(0, 2**63 - 1),
        tokens=st.integers(0, 2**63 - 1),
    )
)
def test_a_summary_reads_back_as_written(written: Summary) -> None:
    assert completion.decode_summary(completion.encode_summary(written)) == written
