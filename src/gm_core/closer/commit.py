"""Closing a round: quorum and grace, merge, the record (the commit point), and clean-up.

Once enough accepted snapshots are in (or every live learner has reported) and the
grace window has passed, the accepted deltas are merged into the frontier (or into
the commit before an unusable one, §16.10), the record is drafted and written
create-once, and a write that found the key taken is checked: adopted if it is a
rival's, committed if it is ours. After the commit the round folders below the
retention mark are swept, and objects left there late are collected now and then.
"""

from __future__ import annotations

import attrs

from gm_core import (
    election,
    fallback,
    follow,
    keys,
    liveness,
    retention,
    schedule,
    timing,
    verdicts,
)
from gm_core.closer import boot, collect, pump
from gm_core.closer.state import (
    _NO_TIMING,
    Ask,
    CloserState,
    Entry,
    Listing,
    Phase,
    Stage,
    _fragment,
    _frontier,
    _gap,
)
from gm_core.commands import (
    Command,
    Contribution,
    Delete,
    DeletePrefix,
    Get,
    List,
    Merge,
    Notify,
    PutOnce,
    PutOver,
    Share,
)
from gm_core.events import Event, GotObject, Listed, Merged, PutDone, Unusable
from gm_core.fallback import Prior
from gm_core.records import (
    FragmentState,
    Head,
    Participant,
    Reason,
    Rejection,
    Requests,
    RoundRecord,
)
from gm_core.requests import Purpose, failure, issue
from gm_core.tape import BadRecord, expected_prev, record_key, slot_of


def _live(state: CloserState, now_s: float) -> frozenset[str]:
    timeout_s = state.manifest.config.lease_timeout_s
    live = {n for n, v in state.leases.items() if liveness.is_live(v, now_s, timeout_s)}
    return frozenset(live | {state.node} if _own_unknown(state) else live)


def _own_unknown(state: CloserState) -> bool:
    """Whether this node's own learner, training, is live as far as this closer knows, with
    its lease not looked at yet: it counts as live (the round waits for it) until a look.

    Other learners are known from the lease listing; the listing skips this node, whose
    learner was known only from a snapshot landing while its round was open. A learner on
    the leader's node slower than the others then never was: the rounds closed once the
    others were in, and with ``follow`` set it read each marker, published, and found the
    round closed, in none of them (spec/coordination.md §7, the model cluster). Its lease
    is looked at once another learner has reported in a round it has not
    (:func:`gm_core.closer.collect._unreported`): absent, it is counted dead until a
    snapshot of it is seen (its learner has left, the closer serves on).
    """
    learns = state.options.learns_here and not state.serving
    return learns and state.node not in state.leases and state.node not in state.dead


def _lapsed(state: CloserState, now_s: float) -> frozenset[str]:
    """Learners whose lease was live while this round was open and is stale now."""
    timeout_s = state.manifest.config.lease_timeout_s
    return frozenset(
        n
        for n, v in state.leases.items()
        if v.etag is not None
        and v.changed_at_s + timeout_s >= state.opened_at_s
        and not liveness.is_live(v, now_s, timeout_s)
    )


def _reported(state: CloserState) -> frozenset[str]:
    """Learners whose snapshot this round has been judged (a garbage object judges nobody)."""
    return frozenset(
        e.learner
        for e in state.entries.values()
        if e.stage in (Stage.ACCEPTED, Stage.REJECTED) and not e.invalid
    )


def _accepted(state: CloserState) -> list[Entry]:
    return sorted(
        (e for e in state.entries.values() if e.stage is Stage.ACCEPTED), key=lambda e: e.learner
    )


def _listed(state: CloserState) -> bool:
    """Whether the leases listed after a snapshot heard of are read (or none was heard of
    this round: :attr:`CloserState.discovery`): who else is live is known."""
    return state.discovery is Listing.DONE


def _maybe_close(state: CloserState, now_s: float, cmds: list[Command]) -> CloserState:
    """Start the merge once quorum (or every live learner) is in and grace has run out."""
    if not _listed(state):
        return state  # a snapshot heard of: who else is live is being listed
    cfg = state.manifest.config
    judged = _reported(state)
    # A snapshot this round proves its learner alive: its lease is no longer looked at.
    live = _live(state, now_s) | judged
    lapsed = _lapsed(state, now_s) - judged
    accepted = _accepted(state)
    if state.quorum_at_s is None:
        if not verdicts.ready_to_close(
            accepted=len(accepted), reported=judged, live=live, quorum=cfg.quorum, lapsed=lapsed
        ):
            return state
        previous = state.last.timing if state.last is not None else _NO_TIMING
        grace = timing.window_s(previous, cfg, _gap(state))
        state = attrs.evolve(state, quorum_at_s=now_s, grace_s=grace, close_at_s=now_s + grace)
    in_progress = any(e.stage in (Stage.FETCHING, Stage.VERIFYING) for e in state.entries.values())
    everyone = bool(live or lapsed) and live <= judged and not in_progress
    if now_s < state.close_at_s and not everyone:
        return state
    return _merge(state, now_s, accepted, cmds)


def _maybe_follow(state: CloserState, now_s: float, cmds: list[Command]) -> CloserState:
    """Tell the learners still awaited that ``follow`` others have published this round, once
    (:mod:`gm_core.follow`): they publish it at once instead of on their own schedule."""
    cfg = state.manifest.config
    if cfg.follow == 0 or state.followed >= state.round:
        return state
    judged = _reported(state)
    live = _live(state, now_s) | judged
    need = follow.threshold(cfg.follow, len(live))
    accepted = len(_accepted(state))
    if need is None or accepted < need or live <= judged:
        return state
    key = keys.follow(state.round)
    state, req = issue(state, Purpose(kind=Ask.FOLLOW, round=state.round))
    data = state.envelope.seal(key, follow.encode(state.round, accepted))
    cmds.append(PutOnce(req=req, key=key, data=data))
    return attrs.evolve(state, followed=state.round)


def _merge(
    state: CloserState, now_s: float, accepted: list[Entry], cmds: list[Command]
) -> CloserState:
    state = attrs.evolve(state, merge_at_s=now_s)
    if not accepted:
        return _commit(state, now_s, None, cmds)
    snapshots = [e.snapshot for e in accepted if e.snapshot is not None]
    # Normalized here so that all-zero weights (no tokens reported) merge as equals.
    weights = verdicts.capped_shares(
        verdicts.normalized_weights([verdicts.merge_weight(x.tokens, x.steps) for x in snapshots]),
        state.manifest.config.max_share,
    )
    contributions = tuple(
        Contribution(learner=x.learner, payload=x.payload, weight=w, final=x.final)
        for x, w in zip(snapshots, weights, strict=True)
    )
    state, req = issue(state, Purpose(kind=Ask.MERGE, round=state.round))
    cmds.append(
        Merge(
            req=req,
            round=state.round,
            fragment=_fragment(state),
            base=_base(state),
            contributions=contributions,
            final_only=all(c.final for c in contributions),
        )
    )
    return attrs.evolve(state, phase=Phase.MERGING)


def _merge_outcome(
    state: CloserState, purpose: Purpose[Ask], event: Event, cmds: list[Command]
) -> CloserState:
    if purpose.round != state.round or state.phase is not Phase.MERGING:
        return state
    if isinstance(event, Merged):
        for learner in event.outliers:  # left out of the merge: rejected by name on the tape
            entry = state.entries.get(learner)
            if entry is not None and entry.stage is Stage.ACCEPTED:
                state = collect._reject(state, learner, Reason.OUTLIER, cmds)
        return _commit(state, event.now_s, event, cmds)
    if isinstance(event, Unusable):
        return _unusable(state, event, cmds)
    return _merge_failed(state, event, cmds)


def _merge_failed(state: CloserState, event: Event, cmds: list[Command]) -> CloserState:
    """Try the merge again after a poll interval; a follower takes over if it never succeeds."""
    cmds.append(Notify(kind="merge_failed", round=state.round, detail=failure(event)))
    return attrs.evolve(
        state, phase=Phase.COLLECTING, close_at_s=event.now_s + state.options.poll_s
    )


def _base(state: CloserState) -> FragmentState:
    """The commit this round's merge starts from: the frontier's, or what replaces it."""
    if state.fallback is not None:
        return state.fallback
    return _frontier(state)[_fragment(state)]


def _unusable(state: CloserState, event: Unusable, cmds: list[Command]) -> CloserState:
    """A payload the merge needs is unusable: leave its delta out, or fall back (§16.10)."""
    now_s, base, fragment = event.now_s, _base(state), _fragment(state)
    for entry in _accepted(state):
        if entry.snapshot is not None and entry.snapshot.payload.key == event.key:
            state = collect._reject(state, entry.learner, event.reason, cmds)
            return _merge(state, now_s, _accepted(state), cmds)
    if event.key not in _keys(base):
        return _merge_failed(state, event, cmds)  # a payload nobody named: try again
    momentum_lost = base.momentum is not None and event.key == base.momentum.key
    if state.lost is None:
        instead = "with zero momentum" if momentum_lost else "into the commit before it"
        detail = f"fragment {fragment} version {base.version}: {failure(event)}; merging {instead}"
        cmds.append(Notify(kind="commit_unusable", round=state.round, detail=detail))
    if momentum_lost:
        state = attrs.evolve(state, fallback=fallback.without_momentum(base))
        return _merge(state, now_s, _accepted(state), cmds)
    committed = _frontier(state)[fragment]
    if base.theta != committed.theta:
        why = f"the commit before it is unusable too ({event.key})"
        return _lost(state, now_s, committed.theta.key, why, cmds)
    found = fallback.prior(state.manifest, fragment, committed.version, committed.theta.key)
    return _found_prior(state, now_s, found, cmds)


def _keys(state: FragmentState) -> tuple[str, ...]:
    refs = (state.theta, state.momentum)
    return tuple(ref.key for ref in refs if ref is not None)


def _found_prior(
    state: CloserState,
    now_s: float,
    found: Prior | FragmentState | str,
    cmds: list[Command],
) -> CloserState:
    """Merge into the earlier commit, read the next slot of its record, or halt."""
    if isinstance(found, FragmentState):
        state = attrs.evolve(state, fallback=found, prior=None)
        return _merge(state, now_s, _accepted(state), cmds)
    if isinstance(found, str):
        return _lost(state, now_s, _frontier(state)[_fragment(state)].theta.key, found, cmds)
    state, req = issue(state, Purpose(kind=Ask.PRIOR, round=state.round))
    cmds.append(Get(req=req, key=record_key(state.envelope, found.round, found.slot)))
    return attrs.evolve(state, prior=found)


def _prior_outcome(
    state: CloserState, purpose: Purpose[Ask], event: Event, cmds: list[Command]
) -> CloserState:
    at = state.prior
    if purpose.round != state.round or state.phase is not Phase.MERGING or at is None:
        return state
    if not isinstance(event, GotObject):
        return _merge_failed(attrs.evolve(state, prior=None), event, cmds)
    found = fallback.read_prior(state.envelope, state.manifest.config, at, event.data)
    return _found_prior(state, event.now_s, found, cmds)


def _lost(state: CloserState, now_s: float, key: str, why: str, cmds: list[Command]) -> CloserState:
    """No commit of the fragment is left to merge into: halt on it, saying so once.

    The round stays open: the closer looks at its record key as a blocked closer does
    and, while the key stays free, tries the round again after a lease timeout (an
    operator may have restored the object meanwhile).
    """
    message = fallback.lost(_fragment(state), key, why)
    if message != state.lost:
        cmds.append(Notify(kind="commit_lost", round=state.round, detail=message))
    poll_at_s = max(state.poll_at_s, now_s + state.manifest.config.lease_timeout_s)
    return attrs.evolve(state, phase=Phase.BLOCKED, lost=message, prior=None, poll_at_s=poll_at_s)


def _commit(
    state: CloserState, now_s: float, merged: Merged | None, cmds: list[Command]
) -> CloserState:
    """Draft the round record and write it create-once: the commit point."""
    record = _draft(state, now_s, merged)
    own = merged.requests if merged is not None and state.options.account_own else None
    state = attrs.evolve(state, own_draft=own)
    return _write(attrs.evolve(state, phase=Phase.COMMITTING, draft=record), record, cmds)


def _write(state: CloserState, record: RoundRecord, cmds: list[Command]) -> CloserState:
    """Write ``record`` create-once at the lowest slot not known to hold garbage."""
    slot = slot_of(state.record_slots, state.round)
    state, req = issue(state, Purpose(kind=Ask.COMMIT, round=state.round, name=str(slot)))
    key = record_key(state.envelope, state.round, slot)
    data = state.envelope.pack(key, record)
    cmds.append(PutOnce(req=req, key=key, data=data))
    return attrs.evolve(state, sealed=(slot, data))


def _draft(state: CloserState, now_s: float, merged: Merged | None) -> RoundRecord:
    cfg = state.manifest.config
    fragment = _fragment(state)
    frontier = list(_frontier(state))
    base = _base(state)
    accepted = _accepted(state)
    participants = tuple(_participant(e) for e in accepted if e.snapshot is not None)
    if merged is not None and participants:
        momentum = merged.outer if merged.outer is not None else base.momentum
        frontier[fragment] = FragmentState(
            version=frontier[fragment].version + 1, theta=merged.theta, momentum=momentum
        )
    rejections = tuple(
        Rejection(learner=e.learner, reason=e.reason)
        for e in sorted(state.entries.values(), key=lambda e: e.learner)
        if e.stage is Stage.REJECTED and e.reason is not None
    )
    step_sample = timing.step_sample([e.snapshot.step_s for e in accepted if e.snapshot])
    first_s = state.first_seen_s if state.first_seen_s is not None else state.opened_at_s
    quorum_at_s = state.quorum_at_s if state.quorum_at_s is not None else now_s
    quorum_s = quorum_at_s - first_s
    previous = state.last.timing if state.last is not None else _NO_TIMING
    estimates = timing.update_timing(
        previous,
        step_s=step_sample,
        quorum_s=max(quorum_s, 0.0),
        sync_s=max(now_s - state.merge_at_s, 0.0),
    )
    committed = frontier[fragment]
    return RoundRecord(
        round=state.round,
        step=schedule.step_of(state.round, cfg.sync_every, cfg.fragments),
        fragment=fragment,
        version=committed.version,
        participants=participants,
        rejections=rejections,
        cosine=merged.cosine if merged is not None else None,
        timing=estimates,
        quorum_s=max(quorum_s, 0.0),
        grace_s=_grace_waited(state, quorum_at_s),
        theta=committed.theta,
        outer=merged.outer if merged is not None and participants else None,
        update=merged.update if merged is not None and participants else None,
        closer=state.node,
        claim=state.claim,
        next_closer=election.next_closer(
            me=state.node,
            dedicated=state.options.write_lease,
            renewed=state.renewed,
            now_s=now_s,
            timeout_s=cfg.lease_timeout_s,
        ),
        frontier=tuple(frontier),
        swept_below=state.swept_below,
        requests=_requests(state, merged),
        prev=expected_prev(state.manifest, state.last, state.round),
        live=_membership(state, now_s) if cfg.global_batch_size is not None else (),
    )


def _membership(state: CloserState, now_s: float) -> tuple[str, ...]:
    """The learners seen live at commit (:mod:`gm_core.batch`): renewing leases, snapshots
    judged this round (not forged ones: nobody proved to be that learner), and this node's
    own learner, counted even before its lease is listed. Written only in runs that split a
    ``global_batch_size``: elsewhere the record stays what gm before the field writes and
    reads (the codec leaves an added field out while it holds its absent value)."""
    judged = {
        e.learner
        for e in state.entries.values()
        if e.stage in (Stage.ACCEPTED, Stage.REJECTED)
        and not e.invalid
        and e.reason is not Reason.UNAUTHENTICATED
    }
    own = {state.node} if state.options.learns_here and not state.serving else set()
    return tuple(sorted(_live(state, now_s) | judged | own))


def _grace_waited(state: CloserState, quorum_at_s: float) -> float:
    """How long the round was held open for stragglers after quorum: the record's ``grace_s``.

    The window (``state.grace_s``) is only an upper bound: a round closes as soon as
    every live learner has been judged, and a lone learner's rounds at once. Recording
    the window instead made every round look held open for about one gap of steps
    (the window's cap), the whole round period of a run that keeps up. Measured to
    the last merge request, so a failed merge's retry may count, never past the window.
    """
    return min(max(state.merge_at_s - quorum_at_s, 0.0), state.grace_s)


def _requests(state: CloserState, merged: Merged | None) -> Requests:
    """The run's requests through this round: the previous record's total, the snapshots
    this record names (each reports its node's requests since its last one), and this
    node's own when no learner of it reports them."""
    total = state.last.requests if state.last is not None else Requests()
    for entry in state.entries.values():
        if entry.snapshot is not None and entry.stage in (Stage.ACCEPTED, Stage.REJECTED):
            total = total + entry.snapshot.requests
    if state.options.account_own and merged is not None:
        total = total + (merged.requests - state.own_base)
    return total


def _participant(entry: Entry) -> Participant:
    snap = entry.snapshot
    assert snap is not None
    return Participant(
        learner=entry.learner,
        steps=snap.steps,
        tokens=snap.tokens,
        weight=verdicts.merge_weight(snap.tokens, snap.steps),
        base_version=snap.base_version,
        final=snap.final,
    )


def _commit_outcome(
    state: CloserState, purpose: Purpose[Ask], event: Event, cmds: list[Command]
) -> CloserState:
    if purpose.round != state.round or state.phase is not Phase.COMMITTING:
        return state
    if isinstance(event, PutDone) and event.created and state.draft is not None:
        slot = int(purpose.name)
        data = state.sealed[1] if state.sealed and state.sealed[0] == slot else None
        return _committed(state, state.draft, slot, data, event.now_s, cmds)
    # Taken, or unknown after a lost response: read the record to learn which.
    return _check(state, purpose, cmds)


def _check(state: CloserState, purpose: Purpose[Ask], cmds: list[Command]) -> CloserState:
    """Read the slot our record was written to (``purpose``'s)."""
    slot = int(purpose.name)
    state, req = issue(state, Purpose(kind=Ask.CHECK, round=state.round, name=purpose.name))
    cmds.append(Get(req=req, key=record_key(state.envelope, state.round, slot)))
    return state


def _check_outcome(
    state: CloserState, purpose: Purpose[Ask], event: Event, cmds: list[Command]
) -> CloserState:
    draft = state.draft
    if purpose.round != state.round or state.phase is not Phase.COMMITTING or draft is None:
        return state
    if not isinstance(event, GotObject):
        return _check(state, purpose, cmds)
    if event.data is None:
        return _write(state, draft, cmds)  # our write never landed: write it again
    parsed = boot._parse(state, purpose, event.data)
    if isinstance(parsed, BadRecord):
        state = boot._skip(state, parsed, event.now_s, cmds)
        return state if state.phase is Phase.BLOCKED else _write(state, draft, cmds)
    if parsed == draft:
        return _committed(state, parsed, int(purpose.name), event.data, event.now_s, cmds)
    return boot._adopt(state, parsed, event.now_s, cmds)


def _committed(
    state: CloserState,
    record: RoundRecord,
    slot: int,
    data: bytes | None,
    now_s: float,
    cmds: list[Command],
) -> CloserState:
    """The record is in the bucket at ``slot`` (``data``: its bytes there, where known): tell
    this node's learner (if any, and the only one live: :func:`collect.alone`) at once,
    publish the hint, sweep old rounds, open the next round."""
    detail = f"version={record.version} participants={len(record.participants)}"
    cmds.append(Notify(kind="committed", round=record.round, detail=detail))
    if collect.alone(state, now_s):
        key = record_key(state.envelope, record.round, slot)
        cmds.append(Share(key=key, data=data or state.envelope.pack(key, record)))
    for rejection in record.rejections:
        entry = state.entries.get(rejection.learner)
        if entry is not None and entry.invalid:  # the object at its slot was no snapshot of it,
            # and none came at the next slot before the round closed: now it is a verdict
            cmds.append(collect.rejected(record.round, rejection.learner, rejection.reason))
    if state.own_draft is not None:  # our record counted our requests up to its merge
        state = attrs.evolve(state, own_base=state.own_draft, own_draft=None)
    state, req = issue(state, Purpose(kind=Ask.HEAD))
    head = state.envelope.pack(keys.head(), Head(round=record.round))
    cmds.append(PutOver(req=req, key=keys.head(), data=head))
    if state.options.write_lease:
        # A committed record proves this node alive to everyone who follows the tape.
        state = attrs.evolve(state, lease_at_s=max(state.lease_at_s, now_s + pump._renew_s(state)))
    state = _sweep(state, record, cmds)
    return boot._enter(attrs.evolve(state, last=record, lost=None), now_s, cmds)


def _sweep(state: CloserState, record: RoundRecord, cmds: list[Command]) -> CloserState:
    pinned = frozenset(
        keys.round_of_payload_key(ref.key)
        for fs in record.frontier
        for ref in (fs.theta, fs.momentum)
        if ref is not None
    )
    fragments = state.manifest.config.fragments
    limit = state.options.max_sweep_rounds
    rounds = retention.sweepable_rounds(
        committed_round=record.round,
        fragments=fragments,
        swept_below=state.swept_below,
        pinned=pinned,
        max_rounds=limit,
    )
    for round_ in rounds:
        for prefix in (keys.snapshot_prefix(round_), keys.claim_prefix(round_)):
            state, req = issue(state, Purpose(kind=Ask.SWEEP, round=round_))
            cmds.append(DeletePrefix(req=req, prefix=prefix))
        state, req = issue(state, Purpose(kind=Ask.SWEEP, round=round_))
        cmds.append(DeletePrefix(req=req, prefix=keys.payload_prefix(round_)))
        if state.manifest.config.follow:
            state, req = issue(state, Purpose(kind=Ask.SWEEP, round=round_))
            cmds.append(Delete(req=req, keys=(keys.follow(round_),)))
    swept_below = retention.new_swept_below(
        committed_round=record.round,
        fragments=fragments,
        swept_below=state.swept_below,
        pinned=pinned,
        max_rounds=limit,
    )
    return attrs.evolve(state, swept_below=swept_below)


_SWEPT_FOLDERS = {
    keys.SNAPSHOTS_PREFIX: keys.snapshot_prefix,
    keys.CLAIMS_PREFIX: keys.claim_prefix,
    keys.PAYLOADS_PREFIX: keys.payload_prefix,
}
"""The folders a sweep deletes round by round, and each round's prefix in them."""


COLLECT_EVERY_TIMEOUTS = 3
"""Lease timeouts between the leader's listings of the round folders (:func:`_collect_late`)."""


COLLECT_MAX_ROUNDS = 64
"""Rounds of one folder deleted per listing: the rest wait for the next one (bounded work)."""


def _collect_late(state: CloserState, now_s: float, cmds: list[Command]) -> CloserState:
    """List the round folders now and then, to delete what lies below the sweep mark.

    A sweep is one-shot: a ``DeletePrefix`` that failed, a sweep cut short by a
    crash, or an object written into a round after its sweep (a slow learner's
    snapshot, a late claim) would stay for good. Every round below ``swept_below``
    is unpinned and closed for good, so whatever is found there is deleted.

    The mark comes from the newest record, so it is never trusted past what a
    correct closer could have swept: rounds within ``KEEP_CYCLES`` cycles of the
    round being closed are never collected, whatever a record claims.
    """
    if now_s < state.collect_at_s or state.swept_below == 0:
        return state
    for folder in _SWEPT_FOLDERS:
        state, req = issue(state, Purpose(kind=Ask.LATE, round=state.round, name=folder))
        cmds.append(List(req=req, prefix=folder))
    every_s = COLLECT_EVERY_TIMEOUTS * state.manifest.config.lease_timeout_s
    return attrs.evolve(state, collect_at_s=now_s + every_s)


def _late_outcome(
    state: CloserState, purpose: Purpose[Ask], event: Event, cmds: list[Command]
) -> CloserState:
    if not isinstance(event, Listed):
        return state  # the next listing tries again
    kept = state.round - retention.KEEP_CYCLES * state.manifest.config.fragments
    limit = min(state.swept_below, kept)
    below: set[int] = set()
    for key in event.keys:
        try:
            parsed = keys.parse(key)
        except keys.BadKey:
            continue
        match parsed:
            case keys.SnapshotKey() | keys.ClaimKey() | keys.PayloadKey():
                if parsed.round < limit:
                    below.add(parsed.round)
    prefix_of = _SWEPT_FOLDERS[purpose.name]
    for round_ in sorted(below)[:COLLECT_MAX_ROUNDS]:
        state, req = issue(state, Purpose(kind=Ask.SWEEP, round=round_))
        cmds.append(DeletePrefix(req=req, prefix=prefix_of(round_)))
    return state
