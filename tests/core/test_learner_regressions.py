"""Regressions found by the real runtime (tests/runtime), replayed on the pure machines.

A learner resumed after a long hang found the payload of the next commit already
swept, so its alignment failed and it went back to booting — with a probe for the
next record still in flight. That probe came back empty; booting then restarts
the walk from the tape's start, but left ``probing`` set with no request behind
it, so the learner never probed again and training stalled for good.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TypeVar

import attrs
from fast_cluster import FAST_C, FAST_L, C, L

from gm_core import cluster as cl
from gm_core import codec, keys, learner, schedule, tape
from gm_core.commands import Align, Capture, Delete, Get
from gm_core.events import (
    CloseRequested,
    Deleted,
    GotObject,
    RequestFailed,
    TimerFired,
)
from gm_core.records import AlgorithmConfig

T = TypeVar("T")


def drive_until(
    config: AlgorithmConfig, steps: Mapping[str, int], found: Callable[[cl.Cluster], T | None]
) -> tuple[T, cl.Cluster]:
    """Run n0 (learns and closes) and n1 (learns), each training ``steps[name]`` steps per
    0.25 s, requests completing in order, until ``found`` sees what it looks for."""
    roles = {"n0": frozenset({L, C}), "n1": frozenset({L})}
    c = cl.create(config, roles, learner_options=FAST_L, closer_options=FAST_C)
    for name in sorted(roles):
        c = cl.start(c, name)
    for _ in range(20_000):
        hit = found(c)
        if hit is not None:
            return hit, c
        if c.inflight:
            c = cl.deliver(c, 0)
            continue
        for name, machine in cl.due_timers(c):
            c = cl.fire(c, name, machine)
        for name in sorted(roles):
            c = cl.train(c, name, steps[name]) if cl.can_train(c, name) else c
        c = cl.tick(c, 0.25)
    raise AssertionError("never found what the test looks for")


def n1_requests(c: cl.Cluster) -> tuple[list[int], list[int]]:
    """n1's alignments and record probes in flight (their request numbers)."""
    mine = [f.command for f in c.inflight if f.node == "n1"]
    align = [x.req for x in mine if isinstance(x, Align)]
    probe = [x.req for x in mine if isinstance(x, Get) and x.key.startswith("rounds/")]
    return align, probe


def aligning_while_probing() -> tuple[learner.LearnerState, int, int, float]:
    """A running learner with an alignment and a probe of the next record both in flight."""

    def found(c: cl.Cluster) -> tuple[learner.LearnerState, int, int, float] | None:
        align, probe = n1_requests(c)
        state = c.nodes["n1"].learner
        assert state is not None
        if align and probe and state.phase is learner.Phase.RUNNING and state.seen_round > 0:
            return state, align[0], probe[0], c.now_s
        return None

    config = AlgorithmConfig(sync_every=8, fragments=2, quorum=1, in_flight=2)
    return drive_until(config, {"n0": 1, "n1": 1}, found)[0]


def test_a_failed_alignment_then_an_empty_probe_does_not_stop_probing() -> None:
    state, align_req, probe_req, now_s = aligning_while_probing()
    state, _ = learner.advance(
        state, RequestFailed(now_s=now_s, req=align_req, error="payload swept")
    )
    assert state.phase is learner.Phase.BOOTING
    state, cmds = learner.advance(
        state, GotObject(now_s=now_s, req=probe_req, data=None, etag=None)
    )
    later = now_s + 10 * FAST_L.poll_s
    state, more = learner.advance(state, TimerFired(now_s=later))
    probes = [x for x in cmds + more if isinstance(x, Get) and x.key.startswith("rounds/")]
    assert probes, f"stuck: probing={state.probing} pending={dict(state.pending)}"
    if state.probing:
        assert any(p.kind == learner.Ask.RECORD for p in state.pending.values()), dict(
            state.pending
        )


def stalled_with_a_probe_out() -> tuple[learner.LearnerState, int, float, cl.Cluster]:
    """A learner-only node stalled at its ``in_flight`` bound, its probe of the next record out."""

    def found(c: cl.Cluster) -> tuple[learner.LearnerState, int, float] | None:
        _, probe = n1_requests(c)
        state = c.nodes["n1"].learner
        assert state is not None
        if state.pace is not None and state.pace.stalled and state.aligned_round >= 0 and probe:
            return state, probe[0], c.now_s
        return None

    config = AlgorithmConfig(sync_every=4, fragments=1, quorum=2, in_flight=1)
    (state, probe, now_s), c = drive_until(config, {"n0": 1, "n1": 2}, found)  # n1 outruns n0
    return state, probe, now_s, c


def test_a_commit_that_lifts_a_stall_without_a_fetch_publishes_at_the_held_step() -> None:
    """An empty commit (version unchanged) aligns at once; the round the stall held is due now.

    Before, publishing ran only before aligning, so the learner was told to train one
    more step and captured the round a step after its due step.
    """
    state, probe, now_s, c = stalled_with_a_probe_out()
    (aligned,) = [x for x in cl.records(c) if x.round == state.aligned_round]
    round_ = state.aligned_round + 1
    step = schedule.step_of(round_, state.manifest.config.sync_every, 1)
    empty = attrs.evolve(
        aligned,
        round=round_,
        step=step,
        participants=(),
        rejections=(),
        prev=tape.chain_digest(aligned),  # the record it follows (a chained run, §16.5)
    )
    held, at = state.next_round, state.step
    state, cmds = learner.advance(
        state, GotObject(now_s=now_s, req=probe, data=codec.encode(empty), etag="e")
    )
    assert state.aligned_round == round_
    captures = [x for x in cmds if isinstance(x, Capture)]
    assert [x.round for x in captures] == [held]
    assert state.outgoing[held].step == at == learner.schedule_step(state, held)


def test_a_learner_closed_while_booting_with_a_record_fetched_closes() -> None:
    """Found by the long swarm (seed 100285): a learner asked to close while booting, after
    its probe brought a record but before it had loaded the model, tried to align that
    record with anchors it did not have yet, and ``advance`` raised ``IndexError``."""
    roles = {"n0": frozenset({L, C}), "n1": frozenset({L})}
    config = AlgorithmConfig(sync_every=4, fragments=2, quorum=1)
    c = cl.start(cl.create(config, roles, learner_options=FAST_L, closer_options=FAST_C), "n0")
    while not cl.records(c):  # round 0 committed: a booting learner aligns it next
        if c.inflight:
            c = cl.deliver(c, 0)
            continue
        for name, machine in cl.due_timers(c):
            c = cl.fire(c, name, machine)
        c = cl.train(c, "n0", 1) if cl.can_train(c, "n0") else c
        c = cl.tick(c, 0.25)
    c = cl.start(c, "n1")
    for _ in range(1000):
        state = c.nodes["n1"].learner
        assert state is not None
        if state.phase is learner.Phase.BOOTING and state.held is not None:
            break
        mine = [i for i, f in enumerate(c.inflight) if f.node == "n1"]
        c = cl.deliver(c, mine[0])
    else:
        raise AssertionError("n1 never held a record while booting")
    c = cl.close(c, "n1")
    state = c.nodes["n1"].learner
    assert state is not None
    assert state.phase in (learner.Phase.CLOSING, learner.Phase.CLOSED)


def closing_while_aligning() -> tuple[learner.LearnerState, int, float]:
    """A learner asked to close (Session.close: the queue ran out) with an alignment in flight."""

    def found(c: cl.Cluster) -> tuple[learner.LearnerState, int, float] | None:
        align, _ = n1_requests(c)
        state = c.nodes["n1"].learner
        assert state is not None
        if align and state.phase is learner.Phase.RUNNING and state.aligned_round >= 2:
            return state, align[0], c.now_s
        return None

    config = AlgorithmConfig(sync_every=8, fragments=2, quorum=1, in_flight=2)
    state, req, now_s = drive_until(config, {"n0": 1, "n1": 1}, found)[0]
    state, _ = learner.advance(state, CloseRequested(now_s=now_s))
    assert state.phase is learner.Phase.CLOSING
    return state, req, now_s


def test_a_closing_learner_whose_alignment_fails_still_closes() -> None:
    """bench_queue (in_flight=8): a node whose queue ran out asked its learner to close while
    a commit's payload was already swept; the failed alignment sent the learner back to
    joining, which ended RUNNING, and ``close()`` raised StalledError after 90 s. Closing, a
    learner has nothing to align for (the shell leaves the model at the newest commit): it
    stops waiting and releases its lease."""
    state, req, now_s = closing_while_aligning()
    state, cmds = learner.advance(state, RequestFailed(now_s=now_s, req=req, error="swept"))
    assert state.phase is learner.Phase.CLOSING
    (release,) = [x for x in cmds if isinstance(x, Delete)]
    assert release.keys == (keys.lease("n1"),)
    state, _ = learner.advance(state, Deleted(now_s=now_s, req=release.req))
    assert state.phase is learner.Phase.CLOSED


def test_a_join_that_completes_after_close_does_not_train_again() -> None:
    """A learner asked to close while it loads the model again (an alignment failed before):
    the load's outcome must not set it running (it would renew the lease it released, and
    no ``finished.json`` could be written while it looks live)."""

    def found(c: cl.Cluster) -> tuple[int, cl.Cluster] | None:
        align, _ = n1_requests(c)
        state = c.nodes["n1"].learner
        assert state is not None
        if align and state.phase is learner.Phase.RUNNING and state.aligned_round >= 2:
            index = next(
                i
                for i, f in enumerate(c.inflight)
                if f.node == "n1" and isinstance(f.command, Align)
            )
            return index, c
        return None

    config = AlgorithmConfig(sync_every=8, fragments=2, quorum=1, in_flight=2)
    (index, c), _ = drive_until(config, {"n0": 1, "n1": 1}, found)
    c = cl.deliver(c, index, cl.Fault.FAIL)  # back to joining
    for _ in range(5000):
        if c.nodes["n1"].learner.phase is learner.Phase.LOADING:  # type: ignore[union-attr]
            break
        if c.inflight:
            c = cl.deliver(c, 0)
            continue
        c = cl.tick(c, 0.25)
        for name, machine in cl.due_timers(c):
            c = cl.fire(c, name, machine)
    else:
        raise AssertionError("n1 never loaded again")
    c = cl.close(c, "n1")
    phases = []
    while any(f.node == "n1" for f in c.inflight):
        c = cl.deliver(c, next(i for i, f in enumerate(c.inflight) if f.node == "n1"))
        phases.append(c.nodes["n1"].learner.phase)  # type: ignore[union-attr]
    assert learner.Phase.RUNNING not in phases
    assert phases[-1] is learner.Phase.CLOSED
