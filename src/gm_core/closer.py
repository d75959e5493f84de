"""The closer state machine: elect, collect, judge, merge and commit one round at a time.

Theory of operation
-------------------
Every closer-capable node runs this machine; at any round one of them *leads*
and the others *follow*. The newest record names ``next_closer``, who leads the
next round. A follower watches two things on its own clock: the named closer's
lease (an etag that must keep changing) and the next record key. When the lease
goes stale, or no record appears within the takeover timeout, it bids for the
round with a numbered create-once claim ``claims/r/k``; the winner of claim ``k``
leads, and the other followers start their timeout over against it.

Leadership is an optimisation, not the safety mechanism: the record itself is
written create-once, so whatever the claims say, at most one record exists per
round. A closer whose record write finds the key taken has been *superseded*: it
reads the winner's record and adopts it, exactly like a follower would.

Leading round ``r``: list ``snapshots/r/`` (and only that folder; each list
reads it whole, since learners' keys land in any order and the folder holds at
most one key per learner), fetch each new snapshot record, judge it
(:func:`verdicts.judge_snapshot`), have the shell verify its payload, and count
verdicts. Once :func:`verdicts.ready_to_close` holds, wait the adaptive grace
window (or close at once when every live learner has reported), ask the shell
to merge the accepted deltas, then write the record — the commit point. Timing
EMAs, the frontier and the closer's name travel in the record, so any node can
take over from the newest record alone. Garbage collection and the head hint
are written after the commit, off the critical path. A leader also watches its
round's record key while it collects: a follower that judged it dead may have
closed the round, and that record ends the round for everyone.

Pace and evidence. Listings and looks follow the run's pace (:mod:`gm_core.cadence`)
until the round's first snapshot is in, then every ``poll_s``. A new snapshot
counts as its learner's lease renewal, and a learner that has reported counts as
live for the round, so only the leases of learners still awaited are probed; the
leases folder is listed once per lease timeout to learn of learners that joined
(spec/protocol.md §9.6).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import assert_never

import attrs

from gm_core import (
    auth,
    cadence,
    codec,
    election,
    fallback,
    follow,
    keys,
    liveness,
    retention,
    schedule,
    timing,
    tip,
    verdicts,
)
from gm_core.auth import Envelope, RunAuth, Unauthenticated
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
    Verify,
    WakeAt,
)
from gm_core.events import (
    CloseRequested,
    Event,
    GotObject,
    Listed,
    Merged,
    Probed,
    PutDone,
    Started,
    TimerFired,
    Unusable,
    Verified,
)
from gm_core.fallback import Prior
from gm_core.records import (
    Claim,
    FragmentState,
    Head,
    Lease,
    Manifest,
    Participant,
    Reason,
    Rejection,
    Requests,
    RoundRecord,
    Snapshot,
    Timing,
)
from gm_core.requests import Purpose, failure, issue, settle
from gm_core.slots import SLOTS, Invalid, open_snapshot, snapshot_key, snapshot_slot
from gm_core.tape import (
    BadRecord,
    SlotCursor,
    exhausted,
    expected_prev,
    frontier_of,
    parse_head,
    parse_record,
    record_key,
    rejected,
    skip,
    slot_of,
)

NEVER = float("inf")
TICK_S = 1e-3
"""How long after a lease's deadline to look again: it is stale only once strictly past it."""


class Phase(enum.StrEnum):
    IDLE = "idle"
    BOOTING = "booting"
    FOLLOWING = "following"
    CLAIMING = "claiming"
    COLLECTING = "collecting"
    MERGING = "merging"
    COMMITTING = "committing"
    BLOCKED = "blocked"
    STOPPED = "stopped"


class Ask(enum.StrEnum):
    """What the closer asked the store for; the outcome is routed by it (:func:`_outcome`)."""

    TAPE = "tape"
    WATCH = "watch"
    CLAIM = "claim"
    CLAIM_READ = "claim_read"
    LEASE = "lease"
    CLOSER_LEASE = "closer_lease"
    LIST = "list"
    DISCOVER = "discover"
    NEWCOMER = "newcomer"
    LATE = "late"
    SNAPSHOT = "snapshot"
    VERIFY = "verify"
    MERGE = "merge"
    PRIOR = "prior"
    COMMIT = "commit"
    CHECK = "check"
    HEAD = "head"
    OWN_LEASE = "own_lease"
    SWEEP = "sweep"
    RELEASE = "release"
    LEASE_GC = "lease_gc"
    FOLLOW = "follow"


class Stage(enum.StrEnum):
    FETCHING = "fetching"
    VERIFYING = "verifying"
    ACCEPTED = "accepted"
    REJECTED = "rejected"


@attrs.frozen(kw_only=True)
class CloserOptions:
    """Node-local settings (not part of the run's agreed config)."""

    poll_s: float = 1.0
    renew_s: float | None = None
    """Lease renewal and probe interval; None: half the run's lease timeout."""
    write_lease: bool = True
    account_own: bool = False
    """Count this node's own store requests in the records it writes (no learner of it does)."""
    learns_here: bool = False
    """A learner runs on this node too: its leader is then never idle, since its own
    learner's first snapshot is on its way even before any lease says so."""
    either: bool = False
    """An ``either`` node's closer: once it leads while another learner is live and no
    dedicated closer is, it is elected (:func:`gm_core.election.serves`): it says so
    (``elected``), stops counting its own learner, and writes a lease of its own."""
    max_sweep_rounds: int = 4
    lease_epoch_us: int | None = None
    """The shell's wall clock minus its monotonic clock, in µs: lease sequence numbers are
    then this node's wall clock (:func:`gm_core.liveness.next_seq`). None: a plain count."""


@attrs.frozen(kw_only=True)
class Entry:
    """One learner's snapshot in the round being closed, and how far it has been judged."""

    learner: str
    stage: Stage
    snapshot: Snapshot | None = None
    reason: Reason | None = None
    slot: int = 0
    """The slot of the learner's snapshot key judged (spec/protocol.md §16.4)."""
    invalid: bool = False
    """The object at ``slot`` is not the learner's snapshot (:func:`gm_core.slots.open_snapshot`):
    the learner is not judged by it, and the next slot is read once a listing shows it."""
    by_name: bool = False
    """Read without a listing showing it (a cut listing, §16.4.5): absent means "not yet"."""


@attrs.frozen(kw_only=True)
class CloserState:
    node: str
    manifest: Manifest
    schema_digest: str
    options: CloserOptions
    envelope: Envelope
    phase: Phase = Phase.IDLE
    last: RoundRecord | None = None
    round: int = 0
    walk: tip.Walk | None = None
    """Booting: the search for the tape's tip (None until the head hint is read; the tip is
    adopted once it chains to the round before, §16.5.2)."""
    record_slots: SlotCursor = attrs.field(factory=SlotCursor)
    """The slot of a round's record key to read or write next (spec/protocol.md §16.4)."""
    claims: Mapping[int, str] = attrs.field(factory=dict)
    claim: int = 0
    closer_lease: liveness.LeaseView | None = None
    waiting_since_s: float = 0.0
    looked_at_s: float = 0.0
    missed_at_s: float | None = None
    records: cadence.Cadence = attrs.field(factory=cadence.Cadence)
    snapshots: cadence.Cadence = attrs.field(factory=cadence.Cadence)
    opened_at_s: float = 0.0
    first_seen_s: float | None = None
    quorum_at_s: float | None = None
    close_at_s: float = NEVER
    grace_s: float = 0.0
    merge_at_s: float = 0.0
    entries: Mapping[str, Entry] = attrs.field(factory=dict)
    bad_keys: frozenset[str] = frozenset()
    draft: RoundRecord | None = None
    fallback: FragmentState | None = None
    """The commit to merge this round into instead of the frontier's unusable one (§16.10)."""
    prior: Prior | None = None
    """The record being read for the commit before the frontier's unusable one."""
    lost: str | None = None
    """The ``commit_lost`` message last given, so that a halted closer says it once."""
    leases: Mapping[str, liveness.LeaseView] = attrs.field(factory=dict)
    dead: frozenset[str] = frozenset()
    """Learners whose lease a probe found stale: looked at only when the leases are listed."""
    collect_at_s: float = 0.0
    """When the leader next lists the round folders for objects left below the sweep mark."""
    others: Mapping[str, liveness.LeaseView] = attrs.field(factory=dict)
    """Leases of nodes that do not learn, watched at each listing to collect them."""
    dedicated: frozenset[str] = frozenset()
    """Nodes among ``others`` whose lease says they are dedicated closers."""
    serving: bool = False
    """An ``either`` node elected closer: its learner stops, its closer writes the lease."""
    renewed: Mapping[str, float] = attrs.field(factory=dict)
    """Dedicated closers whose lease a listing found changed, and when: the ones preferred
    as the next leader (:func:`gm_core.election.next_closer`)."""
    busy: frozenset[Ask] = frozenset()
    poll_at_s: float = 0.0
    leases_at_s: float = 0.0
    discover_at_s: float = 0.0
    lease_seq: int = -1
    """The sequence number of the lease written last."""
    lease_at_s: float = 0.0
    swept_below: int = 0
    followed: int = -1
    """The newest round whose ``follow`` marker this node wrote (:func:`_maybe_follow`)."""
    own_base: Requests = attrs.field(factory=Requests)
    own_draft: Requests | None = None
    wake_s: float = NEVER
    pending: Mapping[int, Purpose[Ask]] = attrs.field(factory=dict)
    next_req: int = 1


def initial(
    node: str,
    manifest: Manifest,
    schema_digest: str,
    options: CloserOptions | None = None,
    run_auth: RunAuth | None = None,
) -> CloserState:
    """A closer that has not started; feed it :class:`Started` to find the newest record.

    ``run_auth``: the run key's subkeys (None: an open run); it must match the manifest.
    """
    if not keys.valid_id(node):
        raise ValueError(f"invalid node id {node!r}")
    refused = auth.mismatch(manifest.auth, run_auth)
    if refused is not None:
        raise ValueError(refused)
    return CloserState(
        node=node,
        manifest=manifest,
        schema_digest=schema_digest,
        options=options or CloserOptions(),
        envelope=auth.for_run(manifest.run_id, run_auth),
    )


Result = tuple[CloserState, list[Command]]


def advance(state: CloserState, event: Event) -> Result:
    """The closer's transition function: one event in, the new state and commands out."""
    cmds: list[Command] = []
    now_s = event.now_s
    if state.phase is Phase.STOPPED:
        return state, cmds  # a stopped closer stays stopped, whatever arrives late
    if isinstance(event, Started):
        state = _start(state, now_s, cmds)
    elif isinstance(event, CloseRequested):
        state = _stop(state, cmds)
    elif isinstance(event, TimerFired):
        state = attrs.evolve(state, wake_s=NEVER)
    else:
        state, purpose = settle(state, getattr(event, "req", -1))  # Stepped has no req
        if purpose is None:
            return state, cmds
        state = attrs.evolve(state, busy=state.busy - {purpose.kind})
        state = _outcome(state, purpose, event, cmds)
    state = _pump(state, now_s, cmds)
    return state, cmds


def _busy(state: CloserState, purpose: Purpose[Ask]) -> tuple[CloserState, int]:
    """Issue a request of a kind of which at most one is outstanding."""
    state, req = issue(state, purpose)
    return attrs.evolve(state, busy=state.busy | {purpose.kind}), req


def _start(state: CloserState, now_s: float, cmds: list[Command]) -> CloserState:
    if state.phase is not Phase.IDLE:
        return state
    state, req = _busy(state, Purpose(kind=Ask.TAPE, name="head"))
    cmds.append(Get(req=req, key=keys.head()))
    return attrs.evolve(state, phase=Phase.BOOTING, walk=None, lease_at_s=now_s)


def _stop(state: CloserState, cmds: list[Command]) -> CloserState:
    if _writes_lease(state) and state.phase is not Phase.IDLE:
        state, req = issue(state, Purpose(kind=Ask.RELEASE))
        cmds.append(Delete(req=req, keys=(keys.lease(state.node),)))
    cmds.append(Notify(kind="closer_stopped", round=state.round))
    return attrs.evolve(state, phase=Phase.STOPPED)


def _named(state: CloserState) -> str:
    return state.last.next_closer if state.last is not None else state.manifest.created_by


def _fragment(state: CloserState) -> int:
    return schedule.fragment_of(state.round, state.manifest.config.fragments)


def _gap(state: CloserState) -> int:
    cfg = state.manifest.config
    return schedule.gap_of(state.round, cfg.sync_every, cfg.fragments)


def _outcome(
    state: CloserState, purpose: Purpose[Ask], event: Event, cmds: list[Command]
) -> CloserState:
    match purpose.kind:
        case Ask.TAPE:
            return _tape_outcome(state, purpose, event, cmds)
        case Ask.WATCH:
            return _watch_outcome(state, purpose, event, cmds)
        case Ask.CLAIM:
            return _claim_outcome(state, purpose, event, cmds)
        case Ask.CLAIM_READ:
            return _claim_read(state, purpose, event, cmds)
        case Ask.LEASE | Ask.CLOSER_LEASE:
            return _lease_outcome(state, purpose, event, cmds)
        case Ask.LIST:
            return _list_outcome(state, purpose, event, cmds)
        case Ask.DISCOVER:
            return _discover_outcome(state, purpose, event, cmds)
        case Ask.NEWCOMER:
            return _newcomer_outcome(state, purpose, event, cmds)
        case Ask.LATE:
            return _late_outcome(state, purpose, event, cmds)
        case Ask.SNAPSHOT:
            return _snapshot_outcome(state, purpose, event, cmds)
        case Ask.VERIFY:
            return _verify_outcome(state, purpose, event, cmds)
        case Ask.MERGE:
            return _merge_outcome(state, purpose, event, cmds)
        case Ask.PRIOR:
            return _prior_outcome(state, purpose, event, cmds)
        case Ask.COMMIT:
            return _commit_outcome(state, purpose, event, cmds)
        case Ask.CHECK:
            return _check_outcome(state, purpose, event, cmds)
        case Ask.HEAD | Ask.OWN_LEASE | Ask.SWEEP | Ask.RELEASE | Ask.LEASE_GC | Ask.FOLLOW:
            return state  # best effort: a failure is retried by the next sweep or renewal
        case unknown:
            assert_never(unknown)


# --- finding the tape and taking part in rounds ---------------------------------------------


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
        bad_keys=frozenset(),
        quorum_at_s=None,
        first_seen_s=None,
        close_at_s=NEVER,
        grace_s=0.0,
        draft=None,
        fallback=None,
        prior=None,
        poll_at_s=now_s,
        leases_at_s=now_s,
    )
    if _named(state) == state.node:
        return _open(state, now_s, 0, cmds)
    return state


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
    if not holder:
        detail = f"claim {attempt}: {problem}"
        cmds.append(Notify(kind="claim_rejected", round=state.round, detail=detail))
    claims = dict(state.claims)
    claims[attempt] = holder  # a hostile claim occupies its number but names nobody
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
        # Released or never there: forget it until it publishes or its lease is listed.
        leases = {n: v for n, v in state.leases.items() if n != name}
        return attrs.evolve(state, leases=leases, dead=state.dead - {name})
    return _judged(state, name, view, now_s)


def _watched(state: CloserState) -> str:
    return election.rightful_closer(_named(state), state.claims)[0]


# --- collecting and judging snapshots --------------------------------------------------------


def _list_outcome(
    state: CloserState, purpose: Purpose[Ask], event: Event, cmds: list[Command]
) -> CloserState:
    if not isinstance(event, Listed) or purpose.round != state.round:
        return state
    if state.phase is not Phase.COLLECTING:
        return state
    listed: dict[str, set[int]] = {}
    for key in event.keys:
        found = _snapshot_slot(state, key)
        if found is None:
            if key not in state.bad_keys:  # every list reads the whole folder: report a key once
                cmds.append(Notify(kind="bad_key", round=state.round, detail=key))
                state = attrs.evolve(state, bad_keys=state.bad_keys | {key})
        else:
            listed.setdefault(found[0], set()).add(found[1])
    for learner, slots_listed in sorted(listed.items()):
        slot = _next_slot(state.entries.get(learner))
        if slot in slots_listed:
            state = _fetch(state, learner, slot, event.now_s, cmds)
    if event.cut:
        state = _fetch_known(state, event.now_s, cmds)
    return _paced(state, event.now_s)


def _fetch_known(state: CloserState, now_s: float, cmds: list[Command]) -> CloserState:
    """Read the snapshots of the learners known live by name: a listing cut short (a flood of
    keys sorted ahead of theirs) must not hide them (spec/protocol.md §16.4.5)."""
    for learner in sorted(state.leases):
        slot = _next_slot(state.entries.get(learner))
        if slot is not None and learner not in state.dead:
            state = _fetch(state, learner, slot, now_s, cmds, by_name=True)
    return state


def _next_slot(entry: Entry | None) -> int | None:
    """The slot of a learner's snapshot key to read next (None: it has been read, or all)."""
    if entry is None:
        return 0
    return entry.slot + 1 if entry.invalid and entry.slot + 1 < SLOTS else None


def _fetch(
    state: CloserState,
    learner: str,
    slot: int,
    now_s: float,
    cmds: list[Command],
    *,
    by_name: bool = False,
) -> CloserState:
    old = state.entries.get(learner)  # the invalid slot below: its verdict stands until then
    reason = old.reason if old is not None else None
    entry = Entry(learner=learner, stage=Stage.FETCHING, slot=slot, reason=reason, by_name=by_name)
    state = _set_entry(state, entry)
    state, req = issue(state, Purpose(kind=Ask.SNAPSHOT, round=state.round, name=learner))
    cmds.append(Get(req=req, key=snapshot_key(state.envelope, state.round, learner, slot)))
    if by_name:
        return state  # no sign of life yet: the object may not exist
    if learner in state.leases:
        return _touch(state, learner, now_s)
    return _look_at_lease(state, Ask.LEASE, learner, cmds)


def _touch(state: CloserState, learner: str, now_s: float) -> CloserState:
    """A new snapshot proves its learner alive, as a renewed lease would."""
    view = liveness.touch(state.leases.get(learner), now_s)
    if view is None:
        return state
    return _judged(state, learner, view, now_s)


def _paced(state: CloserState, now_s: float) -> CloserState:
    """After a listing: note the round's first snapshot, or space the next listing out.

    Until the first snapshot of the round is in, listings follow the run's pace
    (:mod:`gm_core.cadence`); from then on, every poll: the rest arrive close behind.
    """
    if state.first_seen_s is not None:
        return state
    if state.entries:
        # The fastest learner reached the round's step about now.
        return attrs.evolve(
            state, first_seen_s=now_s, snapshots=cadence.seen(state.snapshots, now_s)
        )
    snapshots = cadence.missed(state.snapshots)
    longest_s = state.manifest.config.lease_timeout_s
    look_s = cadence.next_look_s(snapshots, now_s, state.options.poll_s, longest_s=longest_s)
    poll_at_s = max(state.poll_at_s, look_s)
    if not _live(state, now_s) and not (state.options.learns_here and not state.serving):
        # Idle: no learner to wait for. One arriving writes its lease first, and the
        # lease listing, at this same slow pace while idle, wakes us for it
        # (:func:`_discover`, :func:`_newcomer_outcome`). A node that learns itself is
        # never idle: at a run's start its leader would otherwise look for its own
        # learner's first snapshot only after the idle pause, which the learner,
        # stalled at ``in_flight``, waits out, and the snapshot cadence then learns.
        poll_at_s = max(poll_at_s, now_s + _idle_s(state))
    return attrs.evolve(state, snapshots=snapshots, poll_at_s=poll_at_s)


IDLE_POLLS = 20
"""An idle leader looks every this many polls (at most once per lease timeout)."""


def _idle_s(state: CloserState) -> float:
    return min(state.manifest.config.lease_timeout_s, IDLE_POLLS * state.options.poll_s)


def _snapshot_slot(state: CloserState, key: str) -> tuple[str, int] | None:
    """The learner and slot of a key listed in the round's folder; None for a foreign key."""
    try:
        parsed = keys.parse(key)
    except keys.BadKey:
        return None
    if not isinstance(parsed, keys.SnapshotKey) or parsed.round != state.round:
        return None
    slot = snapshot_slot(state.envelope, parsed)
    return None if slot is None else (parsed.learner, slot)


def _snapshot_outcome(
    state: CloserState, purpose: Purpose[Ask], event: Event, cmds: list[Command]
) -> CloserState:
    if purpose.round != state.round or state.phase is not Phase.COLLECTING:
        return state
    learner = purpose.name
    entry = state.entries.get(learner)
    if entry is None or entry.stage is not Stage.FETCHING:
        return state
    if not isinstance(event, GotObject):
        return _forget(state, learner)  # a store failure is not the learner's fault
    if event.data is None:
        if entry.by_name:
            return _forget(state, learner)  # not written yet
        return _reject(state, learner, Reason.MISSING, cmds)
    snapshot = open_snapshot(state.envelope, state.round, learner, entry.slot, event.data)
    if isinstance(snapshot, Invalid):  # not the learner's: on to its next slot
        cmds.append(Notify(kind=snapshot.kind, round=state.round, detail=snapshot.detail))
        return _reject(state, learner, snapshot.reason, cmds, invalid=True)
    reason = _judge(state, snapshot)
    if reason is not None:
        return _reject(state, learner, reason, cmds)
    state, req = issue(state, Purpose(kind=Ask.VERIFY, round=state.round, name=learner))
    cmds.append(Verify(req=req, round=state.round, learner=learner, payload=snapshot.payload))
    verifying = Entry(learner=learner, stage=Stage.VERIFYING, snapshot=snapshot, slot=entry.slot)
    return _set_entry(state, verifying)


def _judge(state: CloserState, snapshot: Snapshot) -> Reason | None:
    cfg = state.manifest.config
    fragment = _fragment(state)
    return verdicts.judge_snapshot(
        snapshot,
        round=state.round,
        fragment=fragment,
        committed_version=_frontier(state)[fragment].version,
        schema_digest=state.schema_digest,
        require_signatures=cfg.require_signatures,
        max_stale_versions=max_stale_versions(cfg.in_flight, cfg.fragments),
    )


def max_stale_versions(in_flight: int, fragments: int) -> int:
    """How many versions behind a correct learner's base can be when it publishes.

    A learner publishes round r only once it has aligned every commit up to
    ``r - in_flight``; the previous commit of the same fragment is ``r - P``, so
    with ``in_flight <= P`` its base is current, and each further ``P`` rounds of
    flight can leave it one more version behind.
    """
    return max(0, -(-in_flight // fragments) - 1)


def _verify_outcome(
    state: CloserState, purpose: Purpose[Ask], event: Event, cmds: list[Command]
) -> CloserState:
    if purpose.round != state.round or state.phase is not Phase.COLLECTING:
        return state
    entry = state.entries.get(purpose.name)
    if entry is None or entry.stage is not Stage.VERIFYING:
        return state
    if not isinstance(event, Verified):
        return _forget(state, purpose.name)  # a store failure is not the learner's fault
    if event.reason is None:
        return _set_entry(state, attrs.evolve(entry, stage=Stage.ACCEPTED))
    return _reject(state, purpose.name, event.reason, cmds)


def _forget(state: CloserState, learner: str) -> CloserState:
    """Drop a snapshot we failed to read: the next list finds it again and retries."""
    entries = dict(state.entries)
    old = entries.pop(learner, None)
    if old is not None and old.slot > 0:  # the slots below it stay judged invalid
        entries[learner] = Entry(
            learner=learner,
            stage=Stage.REJECTED,
            reason=old.reason,
            slot=old.slot - 1,
            invalid=True,
        )
    return attrs.evolve(state, entries=entries)


def _reject(
    state: CloserState, learner: str, reason: Reason, cmds: list[Command], *, invalid: bool = False
) -> CloserState:
    cmds.append(Notify(kind="rejected", round=state.round, detail=f"{learner}: {reason}"))
    old = state.entries.get(learner)
    entry = Entry(
        learner=learner,
        stage=Stage.REJECTED,
        snapshot=old.snapshot if old is not None else None,
        reason=reason,
        slot=old.slot if old is not None else 0,
        invalid=invalid,
    )
    return _set_entry(state, entry)


def _set_entry(state: CloserState, entry: Entry) -> CloserState:
    entries = dict(state.entries)
    entries[entry.learner] = entry
    return attrs.evolve(state, entries=entries)


def _frontier(state: CloserState) -> tuple[FragmentState, ...]:
    return frontier_of(state.manifest, state.last)


# --- closing: quorum, grace, merge, commit ---------------------------------------------------


def _live(state: CloserState, now_s: float) -> frozenset[str]:
    timeout_s = state.manifest.config.lease_timeout_s
    return frozenset(n for n, v in state.leases.items() if liveness.is_live(v, now_s, timeout_s))


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


def _maybe_close(state: CloserState, now_s: float, cmds: list[Command]) -> CloserState:
    """Start the merge once quorum (or every live learner) is in and grace has run out."""
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
                state = _reject(state, learner, Reason.OUTLIER, cmds)
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
            state = _reject(state, entry.learner, event.reason, cmds)
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


_NO_TIMING = Timing()


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
    cmds.append(PutOnce(req=req, key=key, data=state.envelope.pack(key, record)))
    return state


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
    own learner, whose lease the closer never lists. Written only in runs that split a
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
        return _committed(state, state.draft, event.now_s, cmds)
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
    parsed = _parse(state, purpose, event.data)
    if isinstance(parsed, BadRecord):
        state = _skip(state, parsed, event.now_s, cmds)
        return state if state.phase is Phase.BLOCKED else _write(state, draft, cmds)
    if parsed == draft:
        return _committed(state, parsed, event.now_s, cmds)
    return _adopt(state, parsed, event.now_s, cmds)


def _committed(
    state: CloserState, record: RoundRecord, now_s: float, cmds: list[Command]
) -> CloserState:
    """The record is in the bucket: publish the hint, sweep old rounds, open the next round."""
    detail = f"version={record.version} participants={len(record.participants)}"
    cmds.append(Notify(kind="committed", round=record.round, detail=detail))
    if state.own_draft is not None:  # our record counted our requests up to its merge
        state = attrs.evolve(state, own_base=state.own_draft, own_draft=None)
    state, req = issue(state, Purpose(kind=Ask.HEAD))
    head = state.envelope.pack(keys.head(), Head(round=record.round))
    cmds.append(PutOver(req=req, key=keys.head(), data=head))
    if state.options.write_lease:
        # A committed record proves this node alive to everyone who follows the tape.
        state = attrs.evolve(state, lease_at_s=max(state.lease_at_s, now_s + _renew_s(state)))
    state = _sweep(state, record, cmds)
    return _enter(attrs.evolve(state, last=record, lost=None), now_s, cmds)


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


# --- the pump: what to do after any event -----------------------------------------------------


def _pump(state: CloserState, now_s: float, cmds: list[Command]) -> CloserState:
    if state.phase in (Phase.IDLE, Phase.STOPPED):
        return state
    if state.phase is Phase.BOOTING:
        state = _boot_probe(state, now_s, cmds)
    elif state.phase is Phase.FOLLOWING:
        state = _follow(state, now_s, cmds)
    elif state.phase is Phase.BLOCKED:
        state = _watch(state, now_s, cmds)
    elif state.phase is Phase.COLLECTING:
        state = _collect(state, now_s, cmds)
    state = _renew(state, now_s, cmds)
    return _wake(state, now_s, cmds)


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
        state = attrs.evolve(state, leases_at_s=now_s + _probe_s(state))
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
    attempt = election.next_attempt(state.claims)
    if attempt >= keys.ATTEMPT_LIMIT:
        # Every claim number is taken (spec §15.8): nobody can take this round over, so
        # stop bidding and keep watching for its record; say so once.
        if state.waiting_since_s < NEVER:
            detail = f"all {keys.ATTEMPT_LIMIT} claim numbers are taken"
            cmds.append(Notify(kind="claims_exhausted", round=state.round, detail=detail))
        return attrs.evolve(state, waiting_since_s=NEVER)
    claim = Claim(round=state.round, attempt=attempt, node=state.node)
    state, req = issue(state, Purpose(kind=Ask.CLAIM, round=state.round, name=str(attempt)))
    key = election.claim_key(state.envelope, state.round, attempt)
    cmds.append(PutOnce(req=req, key=key, data=state.envelope.pack(key, claim)))
    return attrs.evolve(state, phase=Phase.CLAIMING)


def _collect(state: CloserState, now_s: float, cmds: list[Command]) -> CloserState:
    if Ask.LIST not in state.busy and now_s >= state.poll_at_s:
        state, req = _busy(state, Purpose(kind=Ask.LIST, round=state.round))
        cmds.append(List(req=req, prefix=keys.snapshot_prefix(state.round)))
        if Ask.WATCH not in state.busy:
            # Someone who judged us dead may have closed this round: its record ends it.
            state = _read_record(state, Ask.WATCH, state.round, cmds)
        state = attrs.evolve(state, poll_at_s=now_s + state.options.poll_s)
    state = _discover(state, now_s, cmds)
    state = _collect_late(state, now_s, cmds)
    state = _maybe_serve(state, now_s, cmds)
    unreported = _unreported(state)
    if now_s >= state.leases_at_s and unreported:
        for learner in unreported:
            state = _look_at_lease(state, Ask.LEASE, learner, cmds)
        state = attrs.evolve(state, leases_at_s=now_s + _probe_s(state))
    state = _maybe_follow(state, now_s, cmds)
    return _maybe_close(state, now_s, cmds)


def _maybe_serve(state: CloserState, now_s: float, cmds: list[Command]) -> CloserState:
    """An ``either`` node leading a round: whether the run elects it its closer now.

    Elected, it stops judging its own learner (which the shell stops after its unit, its
    lease handed over, not released) and writes the lease itself from now on.
    """
    if not (state.options.either and state.options.learns_here) or state.serving:
        return state  # only a node that trains can stop training to serve
    timeout_s = state.manifest.config.lease_timeout_s
    dedicated_live = any(
        liveness.is_live(state.others.get(n), now_s, timeout_s) for n in state.dedicated
    )
    others_live = len(_live(state, now_s) - {state.node})
    if not election.serves(me=state.node, others_live=others_live, dedicated_live=dedicated_live):
        return state
    cmds.append(Notify(kind="elected", round=state.round, detail=f"learners={others_live}"))
    return attrs.evolve(
        state,
        serving=True,
        leases={n: v for n, v in state.leases.items() if n != state.node},
        dead=state.dead - {state.node},
        lease_at_s=now_s,
    )


def _discover(state: CloserState, now_s: float, cmds: list[Command]) -> CloserState:
    """List the leases once per lease timeout, to learn of learners that joined.

    Snapshots introduce learners too, but only those that land while their round
    is open: a learner that joined out of phase with the run would never be waited
    for, and so never get in.
    """
    if now_s < state.discover_at_s or Ask.DISCOVER in state.busy:
        return state
    state, req = _busy(state, Purpose(kind=Ask.DISCOVER, round=state.round))
    cmds.append(List(req=req, prefix=keys.LEASES_PREFIX))
    every_s = state.manifest.config.lease_timeout_s if _live(state, now_s) else _idle_s(state)
    return attrs.evolve(state, discover_at_s=now_s + every_s)


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


def _discover_outcome(
    state: CloserState, purpose: Purpose[Ask], event: Event, cmds: list[Command]
) -> CloserState:
    if not isinstance(event, Listed):
        return state
    for key in event.keys:
        try:
            parsed = keys.parse(key)
        except keys.BadKey:
            continue  # reported by whoever reads it; a lease folder entry is not ours to judge
        if not isinstance(parsed, keys.LeaseKey) or parsed.node == state.node:
            continue
        if parsed.node not in state.leases or parsed.node in state.dead:
            state, req = issue(
                state, Purpose(kind=Ask.NEWCOMER, round=state.round, name=parsed.node)
            )
            cmds.append(Get(req=req, key=key))
    return state


def _newcomer_outcome(
    state: CloserState, purpose: Purpose[Ask], event: Event, cmds: list[Command]
) -> CloserState:
    """A lease found by listing: a learner's counts from now on (a closer's never does).

    A learner a probe found dead is looked at here too, once per listing, instead
    of at every probe interval.
    """
    if not isinstance(event, GotObject) or event.data is None:
        return state
    body = state.envelope.open(keys.lease(purpose.name), event.data)
    if isinstance(body, Unauthenticated):
        return state  # garbage or a forgery names no node: it counts no learner
    try:
        lease = codec.decode(Lease, body)
    except codec.CodecError:
        return state
    name, now_s = purpose.name, event.now_s
    if lease.node != name:
        return state
    if "learner" in lease.roles:
        idle = not _live(state, now_s)
        view = _renewal(state, state.leases.get(name), event.etag, lease.seq, now_s)
        state = _judged(state, name, view, now_s)
        if idle and _live(state, now_s):
            state = attrs.evolve(state, poll_at_s=min(state.poll_at_s, now_s))  # wake up
    else:
        old = state.others.get(name)
        view = _renewal(state, old, event.etag, lease.seq, now_s)
        dedicated = election.is_dedicated(lease.roles)
        known = state.dedicated | {name} if dedicated else state.dedicated - {name}
        state = attrs.evolve(state, others={**state.others, name: view}, dedicated=known)
        if dedicated and old is not None and old.changed_at_s != view.changed_at_s:
            state = attrs.evolve(state, renewed={**state.renewed, name: now_s})
    return _collect_lease(state, name, view, now_s, cmds)


def _renewal(
    state: CloserState, view: liveness.LeaseView | None, etag: str | None, seq: int, now_s: float
) -> liveness.LeaseView:
    """A look at a lease read whole: by its sequence number in an authenticated run (§16.6)."""
    if state.envelope.auth is None:
        return liveness.observe(view, etag, now_s)
    return liveness.verified(view, etag, seq, now_s)


def _collect_lease(
    state: CloserState, node: str, view: liveness.LeaseView, now_s: float, cmds: list[Command]
) -> CloserState:
    """Delete the lease of a node gone for several timeouts, and forget the node."""
    if not liveness.collectable(view, now_s, state.manifest.config.lease_timeout_s):
        return state
    state, req = issue(state, Purpose(kind=Ask.LEASE_GC, round=state.round, name=node))
    cmds.append(Delete(req=req, keys=(keys.lease(node),)))
    cmds.append(Notify(kind="lease_collected", round=state.round, detail=node))
    return attrs.evolve(
        state,
        leases={n: v for n, v in state.leases.items() if n != node},
        others={n: v for n, v in state.others.items() if n != node},
        renewed={n: t for n, t in state.renewed.items() if n != node},
        dedicated=state.dedicated - {node},
        dead=state.dead - {node},
    )


def _judged(
    state: CloserState, learner: str, view: liveness.LeaseView, now_s: float
) -> CloserState:
    """Record a look at a learner's lease, and whether it showed the learner dead."""
    if state.serving and learner == state.node:
        return state  # its learner has stopped; the lease is the serving closer's now
    timeout_s = state.manifest.config.lease_timeout_s
    alive = liveness.is_live(view, now_s, timeout_s)
    dead = state.dead - {learner} if alive else state.dead | {learner}
    return attrs.evolve(state, leases={**state.leases, learner: view}, dead=dead)


def _unreported(state: CloserState) -> list[str]:
    """Learners without a snapshot in this round: only their leases need probing.

    Those a probe found dead are left to the next lease listing (:func:`_discover`):
    a crashed node's lease stays in the bucket, and probing it forever costs.
    """
    judged = {n for n, e in state.entries.items() if not e.invalid}
    return sorted(n for n in state.leases if n not in judged and n not in state.dead)


def _writes_lease(state: CloserState) -> bool:
    return state.options.write_lease or state.serving


def _renew(state: CloserState, now_s: float, cmds: list[Command]) -> CloserState:
    if not _writes_lease(state) or now_s < state.lease_at_s:
        return state
    renew_s = _renew_s(state)
    roles = election.ELECTED if state.serving else election.DEDICATED
    seq = liveness.next_seq(state.lease_seq, state.options.lease_epoch_us, now_s)
    lease = Lease(node=state.node, roles=roles, seq=seq, renew_s=renew_s)
    state, req = issue(state, Purpose(kind=Ask.OWN_LEASE))
    key = keys.lease(state.node)
    cmds.append(PutOver(req=req, key=key, data=state.envelope.pack(key, lease)))
    return attrs.evolve(state, lease_seq=seq, lease_at_s=now_s + renew_s)


def _renew_s(state: CloserState) -> float:
    return liveness.renew_interval_s(state.options.renew_s, state.manifest.config.lease_timeout_s)


def _probe_s(state: CloserState) -> float:
    return liveness.probe_interval_s(_renew_s(state))


_POLLED_BY = {
    Phase.BOOTING: Ask.TAPE,
    Phase.FOLLOWING: Ask.WATCH,
    Phase.BLOCKED: Ask.WATCH,
    Phase.COLLECTING: Ask.LIST,
}
"""The request kind each phase's polling issues (at most one in flight)."""


def _wake(state: CloserState, now_s: float, cmds: list[Command]) -> CloserState:
    """Ask for one timer at the earliest moment anything could change without an outcome.

    A deadline that has passed but whose work cannot start — the poll while its
    request is in flight, lease probes with nobody to probe — is left out: a timer
    for it would fire at once, find nothing to do and ask again, a busy loop until
    the outcome arrives, which pumps the machine anyway.
    """
    times = [state.lease_at_s if _writes_lease(state) else NEVER]
    polled_by = _POLLED_BY.get(state.phase)
    if polled_by is not None and polled_by not in state.busy:
        times.append(state.poll_at_s)
    if state.phase is Phase.FOLLOWING:
        if _watched(state) not in ("", state.node):
            times.append(state.leases_at_s)
        takeover_at = _takeover_at(state)
        if takeover_at > now_s:  # once due, the look before the bid is in flight
            times.append(takeover_at)
    if state.phase is Phase.COLLECTING:
        probes_at = state.leases_at_s if _unreported(state) else NEVER
        discover_at = state.discover_at_s if Ask.DISCOVER not in state.busy else NEVER
        collect_at = state.collect_at_s if state.swept_below > 0 else NEVER
        times.extend(
            (probes_at, discover_at, collect_at, state.close_at_s, _lease_expiry(state, now_s))
        )
    wake = max(min(times), now_s)
    if wake != state.wake_s:
        if wake < NEVER:
            cmds.append(WakeAt(at_s=wake))
        state = attrs.evolve(state, wake_s=wake)
    return state


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
    return timing.takeover_timeout_s(
        state.last.timing if state.last is not None else _NO_TIMING,
        gap_steps=_gap(state),
        floor_s=state.manifest.config.takeover_floor_s,
    )


def _takeover_due(state: CloserState) -> float:
    """From when a bid is due (the lease is stale only strictly after its expiry)."""
    return min(_takeover_deadlines(state))


def _takeover_at(state: CloserState) -> float:
    """When to wake for a bid: a tick past the lease's expiry, so that it is stale then."""
    no_record_s, expiry_s = _takeover_deadlines(state)
    return min(no_record_s, expiry_s + TICK_S)


def _lease_expiry(state: CloserState, now_s: float) -> float:
    """The next moment a live learner's lease would go stale (quorum may then be met)."""
    timeout_s = state.manifest.config.lease_timeout_s
    expiries = [
        v.changed_at_s + timeout_s + TICK_S
        for v in state.leases.values()
        if v.etag is not None and v.changed_at_s + timeout_s >= now_s
    ]
    return min(expiries, default=NEVER)
