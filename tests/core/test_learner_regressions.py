"""Regressions found by the real runtime (tests/runtime), replayed on the pure machines.

A learner resumed after a long hang found the payload of the next commit already
swept, so its alignment failed and it went back to booting — with a probe for the
next record still in flight. That probe came back empty; booting then restarts
the walk from the tape's start, but left ``probing`` set with no request behind
it, so the learner never probed again and training stalled for good.
"""

from __future__ import annotations

import attrs

from gm_core import closer, codec, learner, schedule
from gm_core import cluster as cl
from gm_core.commands import Align, Capture, Get
from gm_core.events import GotObject, RequestFailed, TimerFired
from gm_core.records import AlgorithmConfig

L, C = cl.Machine.LEARNER, cl.Machine.CLOSER
FAST_L = learner.LearnerOptions(poll_s=0.5, renew_s=1.0, close_timeout_s=5.0)
FAST_C = closer.CloserOptions(poll_s=0.5, renew_s=1.0)


def aligning_while_probing() -> tuple[learner.LearnerState, int, int, float]:
    """A running learner with an alignment and a probe of the next record both in flight."""
    roles = {"n0": frozenset({L, C}), "n1": frozenset({L})}
    config = AlgorithmConfig(sync_every=8, fragments=2, quorum=1, in_flight=2)
    c = cl.create(config, roles, learner_options=FAST_L, closer_options=FAST_C)
    for name in sorted(roles):
        c = cl.start(c, name)
    for _ in range(400):
        while c.inflight:
            mine = [f.command for f in c.inflight if f.node == "n1"]
            align = [x.req for x in mine if isinstance(x, Align)]
            probe = [x.req for x in mine if isinstance(x, Get) and x.key.startswith("rounds/")]
            state = c.nodes["n1"].learner
            assert state is not None
            if align and probe and state.phase is learner.Phase.RUNNING and state.seen_round > 0:
                return state, align[0], probe[0], c.now_s
            c = cl.deliver(c, 0)
        for name, machine in cl.due_timers(c):
            c = cl.fire(c, name, machine)
        for name in sorted(roles):
            c = cl.train(c, name, 1)
        c = cl.tick(c, 0.25)
    raise AssertionError("never found an alignment and a probe in flight together")


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
    roles = {"n0": frozenset({L, C}), "n1": frozenset({L})}
    config = AlgorithmConfig(sync_every=4, fragments=1, quorum=2, in_flight=1)
    c = cl.create(config, roles, learner_options=FAST_L, closer_options=FAST_C)
    for name in sorted(roles):
        c = cl.start(c, name)
    for _ in range(400):
        state = c.nodes["n1"].learner
        assert state is not None
        probes = [
            f.command.req
            for f in c.inflight
            if f.node == "n1" and isinstance(f.command, Get) and f.command.key.startswith("rounds/")
        ]
        if state.pace is not None and state.pace.stalled and state.aligned_round >= 0 and probes:
            return state, probes[0], c.now_s, c
        if c.inflight:
            c = cl.deliver(c, 0)
            continue
        for name, machine in cl.due_timers(c):
            c = cl.fire(c, name, machine)
        for name, steps in (("n0", 1), ("n1", 2)):  # n1 outruns the run and stalls
            c = cl.train(c, name, steps) if cl.can_train(c, name) else c
        c = cl.tick(c, 0.25)
    raise AssertionError("n1 never stalled with a probe out")


def test_a_commit_that_lifts_a_stall_without_a_fetch_publishes_at_the_held_step() -> None:
    """An empty commit (version unchanged) aligns at once; the round the stall held is due now.

    Before, publishing ran only before aligning, so the learner was told to train one
    more step and captured the round a step after its due step.
    """
    state, probe, now_s, c = stalled_with_a_probe_out()
    (aligned,) = [x for x in cl.records(c) if x.round == state.aligned_round]
    round_ = state.aligned_round + 1
    step = schedule.step_of(round_, state.manifest.config.sync_every, 1)
    empty = attrs.evolve(aligned, round=round_, step=step, participants=(), rejections=())
    held, at = state.next_round, state.step
    state, cmds = learner.advance(
        state, GotObject(now_s=now_s, req=probe, data=codec.encode(empty), etag="e")
    )
    assert state.aligned_round == round_
    captures = [x for x in cmds if isinstance(x, Capture)]
    assert [x.round for x in captures] == [held]
    assert state.outgoing[held].step == at == learner.schedule_step(state, held)
