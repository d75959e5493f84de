"""The learner state machine: when to publish a fragment's delta, and how to follow commits.

Theory of operation
-------------------
A learner trains on its own; the shell reports progress as :class:`Stepped`
events, but only at the steps the core asked for through :class:`Pace` — the
next step at which a round falls due or a stall begins — so the training loop's
fast path is an increment and a compare.

Positions. ``step`` is the shell's own step count. Round ``r`` is due when the
*schedule position* ``step + offset`` reaches ``schedule.step_of(r)``. ``offset``
only grows: on joining, and whenever a commit shows that the run has moved past
the round this learner was heading for (a slow learner skips the rounds it
missed instead of trailing the run forever).

Publishing. At a due round the learner asks the shell to capture the delta of
that round's fragment (:class:`Capture`), then writes the snapshot record
create-once (payload before pointer). It may run at most ``in_flight`` rounds
ahead of the newest commit it has aligned with, and with ``overlap_steps`` at
most that many steps past a published round whose commit it has not aligned; at
either bound it stalls.

Following. The learner polls exactly one key, the next round record, with a GET
(a miss is cheap); records are aligned strictly in order, one at a time. A
record that does not decode is reported and probed again later: it may come
from a newer writer, and the tape cannot be skipped. Probes follow the run's
pace (:mod:`gm_core.cadence`): sparse while the next record cannot be due yet,
every ``poll_s`` once it is, and every ``poll_s`` whenever a late commit would
cost (:func:`_probe_at_s`).

Liveness. The learner overwrites its lease every ``renew_s``; a snapshot it
writes is proof of life too (the closer counts a new snapshot as a renewal), so
each one postpones the next lease write, and a renewal that falls due just
before a snapshot is expected waits a little for it (:mod:`gm_core.liveness`).

Joining reads the head hint, probes forward to the newest record and overwrites
every fragment from its frontier before the first step. Closing optionally
flushes a final snapshot per fragment, waits (bounded) for the rounds it has in
flight, and releases its lease.

Layout
------
This module holds the entry points (:func:`initial`, :func:`advance`), the handling
of start, steps and close, and the dispatch of each outcome by its :class:`Ask`
(:func:`_outcome`); the machine is split by concern: :mod:`~gm_core.learner.state`
(the values), :mod:`~gm_core.learner.boot` (joining: head, tip, load),
:mod:`~gm_core.learner.publish` (capture, snapshot writes, retries, follow markers),
:mod:`~gm_core.learner.align` (commits into the model, anchors, rejoining) and
:mod:`~gm_core.learner.pump` (what to do after any event, polls, lease, pace). The
parts call each other through their modules, looked up at call time: to replace a
function, patch the module that defines it.
"""

from __future__ import annotations

from typing import assert_never

import attrs

from gm_core import auth, keys, timing, tip
from gm_core.auth import RunAuth
from gm_core.commands import Command, Get, Notify
from gm_core.events import (
    CloseRequested,
    Deleted,
    Event,
    RequestFailed,
    Shared,
    Started,
    Stepped,
    TimerFired,
)
from gm_core.learner import align, boot, publish, pump
from gm_core.learner.state import (
    MAX_FETCHED,
    MAX_PUBLISH_ATTEMPTS,
    NEVER,
    Anchor,
    Ask,
    LearnerOptions,
    LearnerState,
    Outgoing,
    Phase,
    Result,
    Retry,
    schedule_step,
)
from gm_core.records import Manifest
from gm_core.requests import Purpose, issue, settle
from gm_core.tape import parse_head

__all__ = [
    "MAX_FETCHED",
    "MAX_PUBLISH_ATTEMPTS",
    "NEVER",
    "Anchor",
    "Ask",
    "LearnerOptions",
    "LearnerState",
    "Outgoing",
    "Phase",
    "Result",
    "Retry",
    "advance",
    "initial",
    "schedule_step",
]


def initial(
    node: str,
    manifest: Manifest,
    schema_digest: str,
    options: LearnerOptions | None = None,
    run_auth: RunAuth | None = None,
) -> LearnerState:
    """A learner that has not started; feed it :class:`Started` to join the run.

    ``run_auth``: the run key's subkeys (None: an open run); it must match the manifest.
    """
    return LearnerState(
        node=node,
        manifest=manifest,
        schema_digest=schema_digest,
        options=options or LearnerOptions(),
        envelope=auth.for_machine(node, manifest, run_auth),
    )


def advance(state: LearnerState, event: Event) -> Result:
    """The learner's transition function: one event in, the new state and commands out."""
    cmds: list[Command] = []
    if isinstance(event, Started):
        state = _start(state, event, cmds)
    elif isinstance(event, Stepped):
        state = _stepped(state, event)
    elif isinstance(event, CloseRequested):
        state = _close(attrs.evolve(state, keep_lease=event.keep_lease), event.now_s, cmds)
    elif isinstance(event, TimerFired):
        state = attrs.evolve(state, wake_s=NEVER)
    elif isinstance(event, Shared):
        heard = boot._heard(state, event)
        if heard is state:
            return state, cmds  # nothing it takes: as if never told (no pump either)
        state = heard
    else:
        state, purpose = settle(state, event.req)
        if purpose is None:
            return state, cmds  # an outcome we no longer wait for (e.g. after a restart)
        state = _outcome(state, purpose, event, cmds)
    # The step count is exact only when the shell just reported it or is stalled.
    exact = isinstance(event, Stepped) or pump._stalled(state)
    state = pump._pump(state, event.now_s, cmds, exact_step=exact)
    return state, cmds


def _start(state: LearnerState, event: Started, cmds: list[Command]) -> LearnerState:
    if state.phase is not Phase.IDLE:
        return state
    state = attrs.evolve(state, phase=Phase.BOOTING, lease_at_s=event.now_s)
    if event.head is not None:  # read with the manifest: the walk starts at once
        hint = parse_head(state.envelope, event.head.data)
        return attrs.evolve(state, probe_at_s=event.now_s, walk=tip.walk(hint))
    state, req = issue(state, Purpose(kind=Ask.HEAD))
    cmds.append(Get(req=req, key=keys.head()))
    return attrs.evolve(state, probing=True)


def _stepped(state: LearnerState, event: Stepped) -> LearnerState:
    if event.step < state.step or event.tokens < state.tokens:
        raise ValueError("steps and tokens only grow")  # caller misuse
    step_s = state.step_s
    if state.last_report is not None and event.step > state.last_report[1]:
        then_s, then_step = state.last_report
        sample = (event.now_s - then_s) / (event.step - then_step)
        step_s = timing.ema(step_s, max(sample, 0.0))
    return attrs.evolve(
        state,
        step=event.step,
        tokens=event.tokens,
        step_s=step_s,
        last_report=(event.now_s, event.step),
    )


def _close(state: LearnerState, now_s: float, cmds: list[Command]) -> LearnerState:
    if state.phase is Phase.IDLE:
        return attrs.evolve(state, phase=Phase.CLOSED)
    if state.phase in (Phase.CLOSING, Phase.CLOSED):
        return state
    if state.phase is not Phase.RUNNING:
        # It never held the model: nothing to align (no anchors yet) and nothing to flush.
        return attrs.evolve(state, phase=Phase.CLOSING, close_by_s=now_s, fetched={})
    state = attrs.evolve(
        state, phase=Phase.CLOSING, close_by_s=now_s + state.options.close_timeout_s
    )
    if state.options.flush_on_close:
        cfg = state.manifest.config
        rounds = range(state.next_round, state.next_round + cfg.fragments)
        state = attrs.evolve(
            state, flushes=frozenset(rounds), next_round=state.next_round + cfg.fragments
        )
        state = publish._flush_due(state, cmds)
    return state


def _outcome(
    state: LearnerState, purpose: Purpose[Ask], event: Event, cmds: list[Command]
) -> LearnerState:
    match purpose.kind:
        case Ask.HEAD | Ask.RECORD:
            return boot._record_outcome(state, purpose, event, cmds)
        case Ask.CAPTURE:
            return publish._captured(state, purpose.round, event, cmds)
        case Ask.SNAPSHOT:
            return publish._snapshot_written(state, purpose.round, event, cmds)
        case Ask.SNAPSHOT_CHECK:
            return publish._snapshot_checked(state, purpose.round, event, cmds)
        case Ask.ALIGN | Ask.LOAD:
            return align._aligned(state, purpose, event, cmds)
        case Ask.PRIOR:
            return boot._prior_outcome(state, purpose, event, cmds)
        case Ask.FOLLOW:
            return publish._follow_outcome(state, purpose.round, event, cmds)
        case Ask.LEASE:
            if isinstance(event, RequestFailed):
                cmds.append(Notify(kind="lease_failed", round=state.seen_round, detail=event.error))
            return state
        case Ask.RELEASE:
            if not isinstance(event, Deleted | RequestFailed):
                return state
            cmds.append(Notify(kind="closed", round=state.aligned_round))
            return attrs.evolve(state, phase=Phase.CLOSED)
        case unknown:
            assert_never(unknown)
