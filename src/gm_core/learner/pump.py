"""What the learner does after any event: publish, align, poll, renew, pace.

Every transition ends here (:func:`_pump`): what is due is published, the next fetched
record aligned, the next record key probed at the run's pace, the lease renewed, and
the shell told the next step that matters and when to wake the machine (:func:`_pace`).
"""

from __future__ import annotations

import attrs

from gm_core import keys, liveness
from gm_core.commands import Command, Delete, Get, Notify, Pace, WakeAt
from gm_core.learner import align, publish
from gm_core.learner.state import MAX_FETCHED, NEVER, Ask, LearnerState, Phase, schedule_step
from gm_core.requests import Purpose, issue
from gm_core.tape import record_key, slot_of


def _pump(
    state: LearnerState, now_s: float, cmds: list[Command], *, exact_step: bool
) -> LearnerState:
    """After any event: publish what is due, align what arrived, poll, renew, pace.

    Publishing goes first so that a due capture sees the model before a commit of
    its fragment lands in it; it runs again after aligning, since an alignment
    that needs no fetch can lift an ``in_flight`` stall at once, and the round
    that stall held back is due at exactly this (stalled, hence exact) step.
    """
    if state.phase in (Phase.IDLE, Phase.CLOSED):
        return state
    if state.phase is Phase.RUNNING:
        state = publish._publish_due(state, cmds)
    if state.phase in (Phase.RUNNING, Phase.CLOSING):
        state = publish._retry_due(state, now_s, cmds, exact_step=exact_step)
        state = align._align_next(state, cmds)
    if state.phase is Phase.CLOSING:
        state = publish._flush_due(state, cmds)
    if state.phase is Phase.RUNNING and exact_step:
        state = publish._publish_due(publish._followed(state), cmds)
    state = _poll(state, now_s, cmds)
    state = publish._poll_follow(state, now_s, cmds)
    state = _renew(state, now_s, cmds)
    if state.phase is Phase.CLOSING:
        state = _maybe_release(state, now_s, cmds)
    return _pace(state, now_s, cmds)


def _can_poll(state: LearnerState) -> bool:
    """Poll unless a probe is out, we are loading, or too many records await alignment."""
    return not (state.probing or state.phase is Phase.LOADING or len(state.fetched) >= MAX_FETCHED)


def _stalled(state: LearnerState) -> bool:
    """Whether the shell was last told to stop training (see :func:`_pace`)."""
    return state.pace is not None and state.pace.stalled


def _probe_at_s(state: LearnerState) -> float:
    """When the next probe is due: at the run's pace, or every poll when a late commit costs.

    Every poll while the learner cannot move (closing, stalled), while it is not in
    phase with the run (:func:`_behind`), and while ``in_flight >= P`` and a commit it
    contributed to is outstanding: then it may publish the same fragment again
    before aligning that commit, and a late alignment makes zero-step snapshots.
    """
    cfg = state.manifest.config
    awaited = cfg.in_flight >= cfg.fragments and any(
        out.published and r > state.aligned_round for r, out in state.outgoing.items()
    )
    urgent = state.phase is not Phase.RUNNING or _stalled(state) or state.behind or awaited
    return state.probe_at_s if urgent else max(state.probe_at_s, state.idle_until_s)


def _poll(state: LearnerState, now_s: float, cmds: list[Command]) -> LearnerState:
    if not _can_poll(state) or now_s < _probe_at_s(state):
        return state
    round_ = state.walk.round if state.phase is Phase.BOOTING else state.seen_round + 1
    slot = slot_of(state.record_slots, round_)
    state, req = issue(state, Purpose(kind=Ask.RECORD, round=round_, name=str(slot)))
    cmds.append(Get(req=req, key=record_key(state.envelope, round_, slot)))
    return attrs.evolve(state, probing=True)


def _renew(state: LearnerState, now_s: float, cmds: list[Command]) -> LearnerState:
    if now_s < _renew_at_s(state) or state.phase is Phase.CLOSED:
        return state
    renew_s = _renew_s(state)
    state, req = issue(state, Purpose(kind=Ask.LEASE))
    put, seq = liveness.renewal(state, req, ("learner",), now_s)
    cmds.append(put)
    return attrs.evolve(state, lease_seq=seq, lease_at_s=now_s + renew_s)


def _renew_s(state: LearnerState) -> float:
    return liveness.renew_s_of(state)


def _renew_at_s(state: LearnerState) -> float:
    """When the lease must be written: on time, or a little late if a snapshot is due by then.

    Never while silent (:func:`_retry_due`): until the round it could not publish is
    committed, a stale lease is how the closer learns not to wait for it.
    """
    if state.silent_through > state.seen_round:
        return NEVER
    slack_s = liveness.renew_slack_s(_renew_s(state))
    expected_s = publish._next_publish_s(state)
    if expected_s is not None and expected_s <= state.lease_at_s + slack_s:
        return state.lease_at_s + slack_s
    return state.lease_at_s


def _maybe_release(state: LearnerState, now_s: float, cmds: list[Command]) -> LearnerState:
    waiting = any(
        r > state.aligned_round for r in (*state.outgoing, *state.retries, *state.flushes)
    )
    if (waiting and now_s < state.close_by_s) or any(
        p.kind is Ask.RELEASE for p in state.pending.values()
    ):
        return state
    if state.keep_lease:
        cmds.append(Notify(kind="closed", round=state.aligned_round))
        return attrs.evolve(state, phase=Phase.CLOSED, lease_at_s=NEVER)
    state, req = issue(state, Purpose(kind=Ask.RELEASE))
    cmds.append(Delete(req=req, keys=(keys.lease(state.node),)))
    return attrs.evolve(state, lease_at_s=NEVER)


def _pace(state: LearnerState, now_s: float, cmds: list[Command]) -> LearnerState:
    """Tell the shell the next step that matters, whether to stall, and when to wake us."""
    cfg = state.manifest.config
    barrier = schedule_step(state, state.next_round)
    stalled = state.phase is not Phase.RUNNING
    if state.phase is Phase.RUNNING:
        stalled = state.step >= barrier and state.next_round > state.aligned_round + cfg.in_flight
        if cfg.overlap_steps is not None:
            for out in state.outgoing.values():
                if out.round > state.aligned_round:
                    limit = out.step + cfg.overlap_steps
                    barrier = min(barrier, limit)
                    stalled = stalled or state.step >= limit
    if any(now_s >= x.at_s for x in state.retries.values()) or state.follow_round >= 0:
        barrier = state.step + 1  # a retry or a followed round waits for an exact step count
    pace = Pace(
        next_step=max(barrier, state.step + 1) if not stalled else state.step, stalled=stalled
    )
    if pace != state.pace:
        cmds.append(pace)
        state = attrs.evolve(state, pace=pace)
    timeout_s = cfg.lease_timeout_s
    wake = min(
        _probe_at_s(state) if _can_poll(state) else NEVER,
        _renew_at_s(state),
        *(min(x.at_s, x.since_s + timeout_s) for x in state.retries.values()),
        state.close_by_s if state.phase is Phase.CLOSING else NEVER,
        state.follow_at_s
        if publish._following(state) is not None and not state.follow_probing
        else NEVER,
    )
    if state.phase is Phase.CLOSED:
        wake = NEVER
    if wake != state.wake_s:
        if wake < NEVER:
            cmds.append(WakeAt(at_s=max(wake, now_s)))
        state = attrs.evolve(state, wake_s=wake)
    return state
