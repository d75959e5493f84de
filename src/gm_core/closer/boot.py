"""Finding the tape and taking part in rounds: boot, follow, claim, take over.

Booting walks from the head hint to the tape's tip; then the closer either opens the
round it is named for (or won a claim for), or follows: it watches the next record and
the named closer's lease, and bids with a numbered claim once the takeover deadline
passes (spec/protocol.md §9.2). Adopting a record — its own, a rival's, or one read
while following — ends the round for this node and starts the next one.
"""

from __future__ import annotations

import attrs

from gm_core import cadence, codec, election, liveness, timing, tip
from gm_core.auth import Envelope, Unauthenticated
from gm_core.closer import collect, pump
from gm_core.closer.state import (
    _NO_TIMING,
    NEVER,
    TICK_S,
    Ask,
    CloserState,
    Listing,
    Phase,
    _busy,
    _gap,
    _named,
    _watched,
)
from gm_core.commands import Command, Get, Notify, PutOnce
from gm_core.events import Event, GotObject, Probed, PutDone
from gm_core.records import Claim, RoundRecord
from gm_core.requests import Purpose, issue
from gm_core.tape import (
    BadRecord,
    SlotCursor,
    exhausted,
    expected_prev,
    parse_head,
    parse_record,
    record_key,
    rejected,
    skip,
    slot_of,
)


def _tape_outcome(
    state: CloserState, purpose: Purpose[Ask], event: Event, cmds: list[Command]
) -> CloserState:
    """Booting: read the head hint, then probe forward to the newest record."""
    if not isinstance(event, GotObject):
        # Retry after a poll. A failed read of the head hint must not wedge booting: the
        # hint is only a shortcut, so probe the tape from its start instead.
        return attrs.evolve(
            state,
            walk=state.walk or tip.walk(-1),
            poll_at_s=event.now_s + state.options.poll_s,
        )
    if purpose.name == "head":
        return attrs.evolve(state, walk=tip.walk(parse_head(state.envelope, event.data)))
    walk = state.walk or tip.walk(-1)  # a record is read only once the walk began
    if event.data is None:
        return _walked(state, tip.missing(walk), event.now_s, cmds)
    parsed = _parse(state, purpose, event.data)
    if isinstance(parsed, BadRecord):
        state = _skip(state, parsed, event.now_s, cmds)
        if parsed.stops or state.phase is Phase.BLOCKED:
            poll_at_s = event.now_s + state.options.poll_s
            return attrs.evolve(state, phase=Phase.BOOTING, poll_at_s=poll_at_s)
        return state
    return _walked(state, tip.found(walk, state.manifest, parsed), event.now_s, cmds)


def _walked(state: CloserState, walk: tip.Walk, now_s: float, cmds: list[Command]) -> CloserState:
    """Booting, the search for the tip moved on: probe its next round, or take part after
    the tip (:mod:`gm_core.tip`)."""
    state = attrs.evolve(state, walk=walk, last=walk.held)
    if not walk.done:
        return state
    for round_, why in walk.refused:
        cmds.append(Notify(kind="record_rejected", round=round_, detail=why))
    # The finished walk is forgotten: closers that booted alike are in the same state.
    return _enter(attrs.evolve(state, walk=None), now_s, cmds)


def _parse(state: CloserState, purpose: Purpose[Ask], data: bytes) -> RoundRecord | BadRecord:
    """The record at the slot ``purpose`` read, or why it is invalid."""
    config, round_ = state.manifest.config, purpose.round
    prev = expected_prev(state.manifest, state.last, round_)
    return parse_record(state.envelope, data, round_, config, int(purpose.name), prev)


def _skip(state: CloserState, bad: BadRecord, now_s: float, cmds: list[Command]) -> CloserState:
    """``bad`` lies at a slot of a record key: go on at the slot above it, now.

    Blocked instead when it is a newer format's record or one side of a fork (skipping
    it would split the tape between readers) or when every slot holds an invalid object.
    """
    if state.phase is not Phase.BLOCKED:
        detail = f"slot {bad.slot}: {bad.reason}"
        cmds.append(Notify(kind=rejected(bad), round=bad.round, detail=detail))
    if bad.stops:
        return _blocked(state, bad, now_s, cmds)
    cursor = skip(state.record_slots, bad)
    if exhausted(cursor, bad.round):
        if state.phase is not Phase.BLOCKED:
            cmds.append(Notify(kind="slots_exhausted", round=bad.round, detail=bad.reason))
        return _blocked(attrs.evolve(state, record_slots=SlotCursor()), bad, now_s, cmds)
    return attrs.evolve(state, record_slots=cursor, poll_at_s=now_s)


def _enter(state: CloserState, now_s: float, cmds: list[Command]) -> CloserState:
    """Begin the round after ``last``: lead it if ``last`` names us, else follow."""
    round_ = state.last.round + 1 if state.last is not None else 0
    swept_below = state.swept_below if state.last is None else state.last.swept_below
    state = attrs.evolve(
        state,
        swept_below=max(state.swept_below, swept_below),
        phase=Phase.FOLLOWING,
        round=round_,
        claims={},
        claim=0,
        closer_lease=None,
        waiting_since_s=now_s,
        missed_at_s=None,
        records=cadence.restart(state.records, now_s),
        entries={},
        discovery=Listing.DONE,
        bad_keys=frozenset(),
        quorum_at_s=None,
        first_seen_s=None,
        close_at_s=NEVER,
        grace_s=0.0,
        draft=None,
        sealed=None,
        fallback=None,
        prior=None,
        poll_at_s=now_s,
        leases_at_s=now_s,
    )
    if _named(state) == state.node:
        return _open(state, now_s, 0, cmds)
    return _relieve(state, cmds)


def _relieve(state: CloserState, cmds: list[Command]) -> CloserState:
    """An elected ``either`` node that enters a round another closer's record hands to
    someone else is no longer its run's closer: it says ``relieved``, counts its own learner
    again and leaves the lease to it (the shell starts a fresh learner, which trains again).
    Were it to go on serving, a takeover from it (it stalled) would leave two nodes out of
    training for good: the double election.

    Only another closer's record relieves it, proof that a closer other than this one is
    alive and leads. Its own record may name a dedicated closer (``next_closer`` names one
    seen renewing up to two lease timeouts ago, which may have died since); it then stays
    elected: that closer, if alive, commits the next
    round and its record relieves this node; if dead, this node takes the round over again.
    Relieving it on its own record made it flap, elected and relieved round after round, in
    the process test on SeaweedFS.
    """
    if not state.serving or state.last is None or state.last.closer == state.node:
        return state
    return _unserve(state, f"by {state.last.closer}", cmds)


def _unserve(state: CloserState, why: str, cmds: list[Command]) -> CloserState:
    """This elected node's closer serves no more: ``relieved`` (the shell trains again)."""
    cmds.append(Notify(kind="relieved", round=state.round, detail=why))
    return attrs.evolve(state, serving=False)


def _open(state: CloserState, now_s: float, claim: int, cmds: list[Command]) -> CloserState:
    if claim > 0:
        cmds.append(Notify(kind="took_over", round=state.round, detail=f"claim={claim}"))
    return attrs.evolve(
        state,
        phase=Phase.COLLECTING,
        claim=claim,
        opened_at_s=now_s,
        poll_at_s=now_s,
        snapshots=cadence.restart(state.snapshots, now_s),
    )


def _adopt(
    state: CloserState, record: RoundRecord, now_s: float, cmds: list[Command]
) -> CloserState:
    """Someone else's record for our round is the truth: move on from it."""
    if state.phase in (Phase.COLLECTING, Phase.MERGING, Phase.COMMITTING):
        cmds.append(Notify(kind="superseded", round=record.round, detail=f"by {record.closer}"))
    return _enter(attrs.evolve(state, last=record), now_s, cmds)


def _watch_outcome(
    state: CloserState, purpose: Purpose[Ask], event: Event, cmds: list[Command]
) -> CloserState:
    if not isinstance(event, GotObject) or purpose.round != state.round:
        return state
    now_s = event.now_s
    if event.data is None:
        if state.phase is Phase.BLOCKED:
            # Someone cleared the object that blocked the tape: take part in the round again.
            return _enter(state, now_s, cmds)
        if state.phase is not Phase.FOLLOWING:
            return state  # a leader's look for a usurper: its listing sets the pace
        # Sparse looks, but one at the takeover deadline: a bid needs a miss after it.
        records = cadence.missed(state.records)
        look_s = cadence.next_look_s(
            records, now_s, state.options.poll_s, longest_s=state.manifest.config.lease_timeout_s
        )
        poll_at_s = max(state.poll_at_s, min(look_s, _takeover_due(state)))
        missed_at_s = state.looked_at_s  # the record was absent when this look was sent
        return attrs.evolve(state, records=records, missed_at_s=missed_at_s, poll_at_s=poll_at_s)
    parsed = _parse(state, purpose, event.data)
    if isinstance(parsed, BadRecord):
        return _skip(state, parsed, now_s, cmds)
    state = attrs.evolve(state, records=cadence.seen(state.records, now_s))
    return _adopt(state, parsed, now_s, cmds)


def _blocked(state: CloserState, bad: BadRecord, now_s: float, cmds: list[Command]) -> CloserState:
    """Our round's record key holds a newer format's record, or garbage in every slot:
    nobody of this version can commit this round.

    The tape cannot skip a round, so the closer stops competing for it and only
    re-reads the key every poll (an operator may remove the objects, or a newer
    writer's record may be readable by a newer gm) instead of claiming and merging
    in a loop.
    """
    poll_at_s = max(state.poll_at_s, now_s + state.options.poll_s)
    return attrs.evolve(state, phase=Phase.BLOCKED, poll_at_s=poll_at_s)


def _claim_outcome(
    state: CloserState, purpose: Purpose[Ask], event: Event, cmds: list[Command]
) -> CloserState:
    if purpose.round != state.round or state.phase is not Phase.CLAIMING:
        return state
    if isinstance(event, PutDone) and event.created:
        return _open(state, event.now_s, int(purpose.name), cmds)
    # Taken by another follower, or unknown after a lost response: read who holds it,
    # and stay CLAIMING until we know (bidding again before would race ourselves).
    state, req = issue(state, Purpose(kind=Ask.CLAIM_READ, round=purpose.round, name=purpose.name))
    key = election.claim_key(state.envelope, purpose.round, int(purpose.name))
    cmds.append(Get(req=req, key=key))
    return state


def _claim_read(
    state: CloserState, purpose: Purpose[Ask], event: Event, cmds: list[Command]
) -> CloserState:
    if purpose.round != state.round or state.phase is not Phase.CLAIMING:
        return state
    following = attrs.evolve(state, phase=Phase.FOLLOWING)
    if not isinstance(event, GotObject):
        return attrs.evolve(following, waiting_since_s=event.now_s)  # unknown: wait a timeout
    if event.data is None:
        return following  # our write never landed and nobody else's did: bid again
    attempt = int(purpose.name)
    holder, problem = _claim_holder(state.envelope, event.data, state.round, attempt)
    if holder == state.node:
        return _open(state, event.now_s, attempt, cmds)
    claims = {**state.claims, attempt: holder}
    if not holder:
        # No claim (forged, garbage, another format's): it outranks nothing, so the closer
        # watched and the takeover deadline stay, and the next bid goes out at once at the
        # attempt above it (spec §16.4.4): each such object costs one write and one read.
        detail = f"claim {attempt}: {problem}"
        cmds.append(Notify(kind="claim_rejected", round=state.round, detail=detail))
        return attrs.evolve(following, claims=claims)
    return attrs.evolve(following, claims=claims, closer_lease=None, waiting_since_s=event.now_s)


def _claim_holder(envelope: Envelope, data: bytes, round_: int, attempt: int) -> tuple[str, str]:
    """Who a claim object names, or "" and why not when it is not the run's claim for its key."""
    body = envelope.open(election.claim_key(envelope, round_, attempt), data)
    if isinstance(body, Unauthenticated):
        return "", f"unauthenticated ({body.why})"
    try:
        claim = codec.decode(Claim, body)
    except codec.CodecError as error:
        return "", str(error)
    if (claim.round, claim.attempt) != (round_, attempt):
        return "", "names another round or attempt"
    impostor = envelope.not_signed_by(data, claim.node)
    if impostor is not None:
        return "", f"unauthenticated (not_allowed): {impostor}"
    return claim.node, ""


def _look_at_lease(state: CloserState, kind: Ask, node: str, cmds: list[Command]) -> CloserState:
    """Look at ``node``'s lease (:func:`gm_core.liveness.look`)."""
    state, req = issue(state, Purpose(kind=kind, round=state.round, name=node))
    cmds.append(liveness.look(state.envelope, req, node))
    return state


def _seen(
    state: CloserState,
    node: str,
    view: liveness.LeaseView | None,
    event: Probed | GotObject,
    cmds: list[Command],
) -> liveness.LeaseView:
    """The view of ``node``'s lease after a look at it (a probe, or a read of its body)."""
    if isinstance(event, Probed):
        return liveness.observe(view, event.etag, event.now_s)
    seq, why = liveness.read_lease(state.envelope, node, event.data)
    # An authentic lease no newer than the last one renews nothing, silently: a replay looks
    # exactly like two renewals of the node that landed out of order.
    if why and (view is None or view.etag != event.etag):
        cmds.append(Notify(kind="lease_refused", round=state.round, detail=f"{node}: {why}"))
    return liveness.verified(view, event.etag, seq, event.now_s)


def _lease_outcome(
    state: CloserState, purpose: Purpose[Ask], event: Event, cmds: list[Command]
) -> CloserState:
    if not isinstance(event, Probed | GotObject):
        return state
    name, now_s = purpose.name, event.now_s
    if purpose.kind is Ask.CLOSER_LEASE:
        current = state.phase is Phase.FOLLOWING and purpose.round == state.round
        if current and name == _watched(state):
            view = _seen(state, name, state.closer_lease, event, cmds)
            return attrs.evolve(state, closer_lease=view)
        return state
    view = _seen(state, name, state.leases.get(name), event, cmds)
    if view.etag is None and name not in state.entries:
        # Released or never there: forget it until it publishes or its lease is listed
        # (this node's own learner until it publishes: the listing skips this node).
        leases = {n: v for n, v in state.leases.items() if n != name}
        dead = state.dead | {name} if name == state.node else state.dead - {name}
        return attrs.evolve(state, leases=leases, dead=dead)
    return collect._judged(state, name, view, now_s)


def _boot_probe(state: CloserState, now_s: float, cmds: list[Command]) -> CloserState:
    if Ask.TAPE in state.busy or state.walk is None or now_s < state.poll_at_s:
        return state
    return _read_record(state, Ask.TAPE, state.walk.round, cmds)


def _read_record(state: CloserState, ask: Ask, round_: int, cmds: list[Command]) -> CloserState:
    """GET the slot of round ``round_``'s record key that is next to judge."""
    slot = slot_of(state.record_slots, round_)
    state, req = _busy(state, Purpose(kind=ask, round=round_, name=str(slot)))
    cmds.append(Get(req=req, key=record_key(state.envelope, round_, slot)))
    return state


def _watch(state: CloserState, now_s: float, cmds: list[Command]) -> CloserState:
    """GET our round's record key when due (a miss is the cheapest request there is)."""
    if Ask.WATCH not in state.busy and now_s >= state.poll_at_s:
        state = _read_record(state, Ask.WATCH, state.round, cmds)
        state = attrs.evolve(state, poll_at_s=now_s + state.options.poll_s, looked_at_s=now_s)
    return state


def _follow(state: CloserState, now_s: float, cmds: list[Command]) -> CloserState:
    """Watch the next record and the rightful closer's lease; bid for the round when due."""
    state = _watch(state, now_s, cmds)
    closer = _watched(state)
    if closer == state.node:
        return state
    if now_s >= state.leases_at_s and closer:
        state = _look_at_lease(state, Ask.CLOSER_LEASE, closer, cmds)
        state = attrs.evolve(state, leases_at_s=now_s + pump._probe_s(state))
    if state.closer_lease is None and closer:
        return state  # judge a closer only after seeing its lease at least once
    timeout_s = state.manifest.config.lease_timeout_s
    live = bool(closer) and liveness.is_live(state.closer_lease, now_s, timeout_s)
    if not election.should_take_over(
        me=state.node,
        closer=closer,
        closer_lease_live=live,
        now_s=now_s,
        waiting_since_s=state.waiting_since_s,
        timeout_s=_takeover_timeout_s(state),
    ):
        return state
    if state.missed_at_s is None or state.missed_at_s < _takeover_due(state):
        # Looks are sparse: bid only once a look sent since the deadline has missed.
        poll_at_s = min(state.poll_at_s, state.looked_at_s + state.options.poll_s)
        return _watch(attrs.evolve(state, poll_at_s=poll_at_s), now_s, cmds)
    limit = election.attempt_limit(state.envelope)
    attempt = election.next_attempt(
        state.claims, nonce=state.options.claim_nonce, round_=state.round, limit=limit
    )
    if attempt is None:
        # No claim number left (spec §15.8; a format-1 run's 10^4 can be filled): nobody
        # can take this round over, so stop bidding and keep watching for its record; say
        # so once.
        if state.waiting_since_s < NEVER:
            detail = f"no claim number below {limit} is left"
            cmds.append(Notify(kind="claims_exhausted", round=state.round, detail=detail))
        return attrs.evolve(state, waiting_since_s=NEVER)
    claim = Claim(round=state.round, attempt=attempt, node=state.node)
    state = _stale_closer(state, closer)
    state, req = issue(state, Purpose(kind=Ask.CLAIM, round=state.round, name=str(attempt)))
    key = election.claim_key(state.envelope, state.round, attempt)
    cmds.append(PutOnce(req=req, key=key, data=state.envelope.pack(key, claim)))
    return attrs.evolve(state, phase=Phase.CLAIMING)


def _stale_closer(state: CloserState, closer: str) -> CloserState:
    """``closer`` looked dead (or stuck) here: no record of this node names it again until its
    lease is seen to change anew (:func:`gm_core.election.next_closer`).

    Its last renewal may be less than the preference window old when a follower takes its
    round over, or a look finds its lease stale; naming it then made each of the next rounds
    wait out another takeover (spec/protocol.md §9.1). A follower's looks at the closer's
    lease become the view the next listing compares with: the listing's own view may be
    rounds old, and the lease changed since then (before the closer died) is no renewal.
    """
    renewed = {n: t for n, t in state.renewed.items() if n != closer}
    others = state.others
    if closer in others and state.closer_lease is not None and state.phase is Phase.FOLLOWING:
        others = {**others, closer: state.closer_lease}
    return attrs.evolve(state, renewed=renewed, others=others)


def _takeover_deadlines(state: CloserState) -> tuple[float, float]:
    """When no record for too long, and when the closer's lease expires (NEVER: unseen)."""
    lease = state.closer_lease
    if not _watched(state):
        expiry = state.waiting_since_s  # nobody to wait for
    elif lease is None:
        expiry = NEVER  # not judged before its lease has been looked at
    elif lease.etag is None:
        expiry = lease.changed_at_s  # absent: stale from when it was seen absent
    else:
        expiry = lease.changed_at_s + state.manifest.config.lease_timeout_s
    return state.waiting_since_s + _takeover_timeout_s(state), expiry


def _takeover_timeout_s(state: CloserState) -> float:
    """How long a follower waits for a record before judging the closer stuck."""
    return timing.takeover_after_s(
        state.last.timing if state.last is not None else _NO_TIMING,
        state.manifest.config,
        _gap(state),
    )


def _takeover_due(state: CloserState) -> float:
    """From when a bid is due (the lease is stale only strictly after its expiry)."""
    return min(_takeover_deadlines(state))


def _takeover_at(state: CloserState) -> float:
    """When to wake for a bid: a tick past the lease's expiry, so that it is stale then."""
    no_record_s, expiry_s = _takeover_deadlines(state)
    return min(no_record_s, expiry_s + TICK_S)
