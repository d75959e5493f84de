"""Publishing a round: capture the fragment's delta, write the snapshot, retry or give up.

A due round is captured (:class:`Capture`), its snapshot written create-once at the
learner's slot and checked when the slot was taken; failures are retried a bounded
number of times and then the round is captured afresh or given up. A ``follow`` marker
found for the round ahead makes it due at the next exact step count; a close flushes
one final round per fragment.
"""

from __future__ import annotations

import attrs

from gm_core import follow, keys, schedule, slots
from gm_core.commands import Capture, Command, Get, Notify, PutOnce, Share
from gm_core.events import Captured, Event, GotObject, PutDone
from gm_core.learner import pump
from gm_core.learner.state import (
    MAX_PUBLISH_ATTEMPTS,
    Ask,
    LearnerState,
    Outgoing,
    Phase,
    Retry,
    schedule_step,
)
from gm_core.records import Reason, Requests, RoundRecord, Snapshot
from gm_core.requests import Purpose, failure, issue


def _flush_due(state: LearnerState, cmds: list[Command]) -> LearnerState:
    """Publish each final round of the flush whose fragment's previous round is aligned.

    A final snapshot of round ``q`` captured while round ``q − P`` is uncommitted
    would carry a base one version behind once ``q − P`` commits, and be rejected
    ``stale``: it waits (closing, bounded by the close deadline) until that commit is
    aligned. Under carry the anchor then sits at the step of the snapshot ``q − P``
    merged, so the final one holds every step trained since; at ``in_flight = P``
    both fragments' previous rounds are usually in flight when a learner closes,
    and skipping them lost up to a gap of steps per fragment.
    """
    fragments = state.manifest.config.fragments
    for round_ in sorted(state.flushes):
        if round_ - fragments <= state.aligned_round:
            empty = round_ in state.empty_finals
            state = attrs.evolve(
                state, flushes=state.flushes - {round_}, empty_finals=state.empty_finals - {round_}
            )
            state = _publish(state, round_, final=True, cmds=cmds, empty=empty)
    return state


REFLUSHED = frozenset({None, Reason.STALE, Reason.MISSING})
"""How a commit may have left out a closing learner's final snapshot and have it flushed
again: not named (it landed after the round closed), or rejected for a base that a commit
since moved (``stale``) or a payload not found (``missing``). Any other rejection would
recur."""


def _reflush(state: LearnerState, record: RoundRecord) -> LearnerState:
    """A closing learner has aligned ``record``: flush its fragment again if steps trained
    are still in no commit and nothing of the fragment is out.

    The final snapshot of the fragment's flush round landed after the round closed (a
    short fixed grace window, every learner of a queue closing at once), was rejected
    ``stale``, or its round was committed before it could be published: under ``carry``
    the anchor kept the steps, and a running learner would report them in its next
    snapshot of the fragment; a closing one has none, so they were lost to the run's
    final model. It flushes them again at the fragment's next round after those seen, and
    publishes the rounds between too, empty ones included (the closer rejects those
    ``zero_steps``): when every learner is closing, a round this live learner does not
    report would stay open until its lease lapsed. Bounded by the close deadline, as the
    first flush is. Under ``overwrite``/``blend`` the commit replaced the local steps
    (the anchor restarted), so there is nothing to flush.
    """
    cfg = state.manifest.config
    fragment = record.fragment
    if state.step - state.anchors[fragment].step <= 0:
        return state
    mine = [x.reason for x in record.rejections if x.learner == state.node]
    if (mine[0] if mine else None) not in REFLUSHED:
        return state
    out = [*state.flushes, *(r for r in state.outgoing if r > state.aligned_round)]
    if any(schedule.fragment_of(r, cfg.fragments) == fragment for r in out):
        return state
    start = max(state.next_round, state.seen_round + 1)
    again = next(
        r
        for r in range(start, start + cfg.fragments)
        if schedule.fragment_of(r, cfg.fragments) == fragment
    )
    # The rounds up to it that this learner does not report otherwise: its flush rounds it
    # skipped as empty, and those it never reached.
    rounds = frozenset(
        r
        for r in range(state.seen_round + 1, again + 1)
        if r not in state.outgoing and r not in state.flushes
    )
    return attrs.evolve(
        state,
        flushes=state.flushes | rounds,
        empty_finals=state.empty_finals | rounds - {again},
        next_round=again + 1,
    )


def _publish(
    state: LearnerState,
    round_: int,
    *,
    final: bool,
    cmds: list[Command],
    since_s: float | None = None,
    empty: bool = False,
) -> LearnerState:
    """Capture the delta of round ``round_``'s fragment.

    A due round is published even when its fragment saw no steps since its anchor
    (the closer rejects it as ``zero_steps``): a learner that stayed silent would
    leave the closer waiting for it until its lease expired. Only a final flush
    skips empty fragments (not one flushed again: ``empty``), and nobody publishes a
    round already committed.
    """
    cfg = state.manifest.config
    fragment = schedule.fragment_of(round_, cfg.fragments)
    anchor = state.anchors[fragment]
    steps = state.step - anchor.step
    if (final and steps <= 0 and not empty) or round_ <= state.seen_round:
        return state
    state, req = issue(state, Purpose(kind=Ask.CAPTURE, round=round_))
    cmds.append(Capture(req=req, round=round_, fragment=fragment))
    outgoing = dict(state.outgoing)
    outgoing[round_] = Outgoing(
        round=round_,
        fragment=fragment,
        base_version=anchor.version,
        step=state.step,
        tokens=state.tokens,
        steps=steps,
        token_count=state.tokens - anchor.tokens,
        final=final,
        failing_since_s=since_s,
    )
    return attrs.evolve(state, outgoing=outgoing)


def _captured(state: LearnerState, round_: int, event: Event, cmds: list[Command]) -> LearnerState:
    out = state.outgoing.get(round_)
    if out is None:
        return state
    if not isinstance(event, Captured):
        cmds.append(Notify(kind="publish_failed", round=round_, detail=failure(event)))
        return _give_up(state, round_, event.now_s, retry=True)
    # Report the node's requests since the previous snapshot, plus those of snapshots
    # that no record counted (lost), so that the tape's total misses nothing.
    requests = (event.requests - state.requests_base) + state.requests_lost
    state = attrs.evolve(state, requests_base=event.requests, requests_lost=Requests())
    out = attrs.evolve(out, requests=requests)
    snapshot = Snapshot(
        learner=state.node,
        round=round_,
        fragment=out.fragment,
        base_version=out.base_version,
        steps=out.steps,
        tokens=out.token_count,
        step_s=state.step_s if state.step_s is not None else 0.0,
        schema_digest=state.schema_digest,
        payload=event.payload,
        final=out.final,
        requests=requests,
    )
    return _write_snapshot(state, attrs.evolve(out, snapshot=snapshot), cmds)


def _write_snapshot(state: LearnerState, out: Outgoing, cmds: list[Command]) -> LearnerState:
    assert out.snapshot is not None
    key = _snapshot_key(state, out)
    data = state.envelope.pack(key, out.snapshot)  # sealed for the key: they differ per slot
    outgoing = dict(state.outgoing)
    outgoing[out.round] = attrs.evolve(out, sealed=data)
    state = attrs.evolve(state, outgoing=outgoing)
    state, req = issue(state, Purpose(kind=Ask.SNAPSHOT, round=out.round))
    cmds.append(PutOnce(req=req, key=key, data=data))
    return state


def _snapshot_key(state: LearnerState, out: Outgoing) -> str:
    return slots.snapshot_key(state.envelope, out.round, state.node, out.slot)


def _packed(state: LearnerState, out: Outgoing) -> bytes:
    """The bytes of ``out``'s snapshot at its slot: those of its last write there
    (:func:`_write_snapshot`), packed once."""
    if out.sealed is not None:
        return out.sealed
    assert out.snapshot is not None
    return state.envelope.pack(_snapshot_key(state, out), out.snapshot)


def _snapshot_written(
    state: LearnerState, round_: int, event: Event, cmds: list[Command]
) -> LearnerState:
    out = state.outgoing.get(round_)
    if out is None:
        return state
    if isinstance(event, PutDone) and event.created:
        # A written snapshot proves this node alive: the lease can wait a full interval.
        lease_at_s = max(state.lease_at_s, event.now_s + pump._renew_s(state))
        return _published(attrs.evolve(state, lease_at_s=lease_at_s), out, cmds)
    # Taken, or unknown after a lost response: our own earlier attempt may have landed.
    state, req = issue(state, Purpose(kind=Ask.SNAPSHOT_CHECK, round=round_))
    cmds.append(Get(req=req, key=_snapshot_key(state, out)))
    return state


def _published(state: LearnerState, out: Outgoing, cmds: list[Command]) -> LearnerState:
    """The snapshot is in the store: say so, and tell this node's closer (if any) at once."""
    cmds.append(Notify(kind="published", round=out.round, detail=f"steps={out.steps}"))
    cmds.append(Share(key=_snapshot_key(state, out), data=_packed(state, out)))
    outgoing = dict(state.outgoing)
    outgoing[out.round] = attrs.evolve(out, published=True, sealed=None)
    return attrs.evolve(state, outgoing=outgoing)


def _snapshot_checked(
    state: LearnerState, round_: int, event: Event, cmds: list[Command]
) -> LearnerState:
    """Learn whether the snapshot at our slot is ours; write it again while attempts last."""
    out = state.outgoing.get(round_)
    if out is None or out.snapshot is None:
        return state
    if isinstance(event, GotObject) and event.data is not None:
        return _slot_taken(state, out, event.data, event.now_s, cmds)
    if out.attempts < MAX_PUBLISH_ATTEMPTS:
        return _write_snapshot(state, attrs.evolve(out, attempts=out.attempts + 1), cmds)
    detail = failure(event) if not isinstance(event, GotObject) else "write never landed"
    cmds.append(Notify(kind="publish_failed", round=round_, detail=detail))
    return _give_up(state, round_, event.now_s, retry=True)


def _slot_taken(
    state: LearnerState, out: Outgoing, data: bytes, now_s: float, cmds: list[Command]
) -> LearnerState:
    """Our slot holds ``data``: ours, another incarnation's snapshot, or garbage to step over."""
    if data == _packed(state, out):
        return _published(state, out, cmds)
    found = slots.open_snapshot(state.envelope, out.round, state.node, out.slot, data)
    if isinstance(found, Snapshot):
        # Another incarnation's snapshot is this node's snapshot of the round: the
        # closer judges that one, so this node is not awaited and there is nothing to retry.
        detail = "another incarnation of this node wrote a different snapshot"
    elif out.slot + 1 < slots.SLOTS:
        cmds.append(Notify(kind="snapshot_slot_skipped", round=out.round, detail=found.detail))
        return _write_snapshot(state, attrs.evolve(out, slot=out.slot + 1, attempts=1), cmds)
    else:
        detail = (
            f"all {slots.SLOTS} slots of the snapshot key hold invalid objects (slots_exhausted)"
        )
    cmds.append(Notify(kind="publish_failed", round=out.round, detail=detail))
    return _give_up(state, out.round, now_s, retry=False)


def _give_up(state: LearnerState, round_: int, now_s: float, *, retry: bool) -> LearnerState:
    """Drop a round's snapshot; with ``retry``, capture it afresh after a poll.

    The requests the dropped snapshot would have reported go to the next one.
    """
    outgoing = dict(state.outgoing)
    out = outgoing.pop(round_, None)
    if out is None:
        return state
    state = attrs.evolve(state, outgoing=outgoing, requests_lost=state.requests_lost + out.requests)
    if not retry:
        return state
    since_s = out.failing_since_s if out.failing_since_s is not None else now_s
    again = Retry(final=out.final, since_s=since_s, at_s=now_s + state.options.poll_s)
    return attrs.evolve(state, retries={**state.retries, round_: again})


def _retry_due(
    state: LearnerState, now_s: float, cmds: list[Command], *, exact_step: bool
) -> LearnerState:
    """Publish failed rounds again, or fall silent once a round has failed too long.

    The closer waits for every learner it knows live until each has reported the
    round, so a live learner that never publishes would hold a run with one
    closer forever (spec §15.2). A failed round is captured afresh every poll
    while it is open; if it still has not landed a lease timeout after the first
    failure, the learner stops renewing its lease until the round is committed:
    the closer then finds the lease stale within another lease timeout and
    closes without it. A round is never waited on for more than about twice the
    lease timeout after this learner's first failure.

    A capture reports the steps since the anchor, so it is taken only when the
    step count is exact; otherwise :func:`_pace` asks for a report at the next step.
    """
    timeout_s = state.manifest.config.lease_timeout_s
    for round_, retry in sorted(state.retries.items()):
        retries = {r: x for r, x in state.retries.items() if r != round_}
        if round_ <= state.seen_round:
            state = attrs.evolve(state, retries=retries)  # closed without it: nothing to send
        elif now_s >= retry.since_s + timeout_s:
            detail = "lease paused until the round is committed"
            cmds.append(Notify(kind="publish_abandoned", round=round_, detail=detail))
            silent = max(state.silent_through, round_)
            state = attrs.evolve(state, retries=retries, silent_through=silent)
        elif now_s >= retry.at_s and exact_step:
            state = attrs.evolve(state, retries=retries)
            state = _publish(state, round_, final=retry.final, cmds=cmds, since_s=retry.since_s)
    return state


def _publish_due(state: LearnerState, cmds: list[Command]) -> LearnerState:
    cfg = state.manifest.config
    while state.step >= schedule_step(state, state.next_round):
        round_ = state.next_round
        if round_ > state.aligned_round + cfg.in_flight:
            break  # stalled: see _pace
        state = _publish(state, round_, final=False, cmds=cmds)
        state = attrs.evolve(state, next_round=round_ + 1)
    return state


def _following(state: LearnerState) -> int | None:
    """The round whose ``follow`` marker to look for: the one this learner heads for, while
    it is not due yet, not committed, and publishing it would keep within ``in_flight``."""
    cfg = state.manifest.config
    round_ = state.next_round
    if (
        cfg.follow == 0
        or state.phase is not Phase.RUNNING
        or round_ <= state.seen_round
        or round_ > state.aligned_round + cfg.in_flight
        or state.step >= schedule_step(state, round_)
    ):
        return None
    return round_


def _poll_follow(state: LearnerState, now_s: float, cmds: list[Command]) -> LearnerState:
    """GET the ``follow`` marker of the round this learner heads for, once a poll."""
    round_ = _following(state)
    if round_ is None or round_ == state.follow_round or state.follow_probing:
        return state
    if now_s < state.follow_at_s:
        return state
    state, req = issue(state, Purpose(kind=Ask.FOLLOW, round=round_))
    cmds.append(Get(req=req, key=keys.follow(round_)))
    return attrs.evolve(state, follow_probing=True, follow_at_s=now_s + state.options.poll_s)


def _follow_outcome(
    state: LearnerState, round_: int, event: Event, cmds: list[Command]
) -> LearnerState:
    """A valid marker for the round still ahead: publish it at the next exact step count."""
    state = attrs.evolve(state, follow_probing=False)
    if not isinstance(event, GotObject) or event.data is None or _following(state) != round_:
        return state
    body = state.envelope.open(keys.follow(round_), event.data)
    accepted = follow.decode(body, round_) if isinstance(body, bytes) else None
    if accepted is None:
        return state  # not the run's marker: publish on schedule
    cmds.append(Notify(kind="following", round=round_, detail=f"accepted={accepted}"))
    return attrs.evolve(state, follow_round=round_)


def _followed(state: LearnerState) -> LearnerState:
    """At an exact step count: a round whose marker was found becomes due now, its schedule
    position moving up to the round's step (offsets only grow, as in :func:`_catch_up`)."""
    round_ = state.follow_round
    if round_ < 0:
        return state
    state = attrs.evolve(state, follow_round=-1)
    if _following(state) != round_:
        return state  # published on schedule meanwhile, committed, or held by in_flight
    lag = schedule_step(state, round_) - state.step
    return attrs.evolve(state, offset=state.offset + lag)


def _next_publish_s(state: LearnerState) -> float | None:
    """When the next snapshot should be written, from the step time (None: not foreseeable)."""
    if state.phase is not Phase.RUNNING or pump._stalled(state) or state.step_s is None:
        return None
    if state.last_report is None:
        return None
    then_s, then_step = state.last_report
    if any(not out.published for out in state.outgoing.values()):
        return then_s  # one is being captured or written right now
    return then_s + max(schedule_step(state, state.next_round) - then_step, 0) * state.step_s
