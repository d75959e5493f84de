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
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import assert_never

import attrs

from gm_core import (
    adaptive,
    auth,
    cadence,
    fallback,
    follow,
    keys,
    liveness,
    retention,
    schedule,
    slots,
    timing,
    tip,
)
from gm_core.auth import Envelope, RunAuth
from gm_core.commands import (
    Align,
    Capture,
    Command,
    Delete,
    Get,
    Notify,
    Pace,
    PutOnce,
    PutOver,
    WakeAt,
)
from gm_core.events import (
    Aligned,
    Captured,
    CloseRequested,
    Deleted,
    Event,
    GotObject,
    PutDone,
    RequestFailed,
    Started,
    Stepped,
    TimerFired,
    Unusable,
)
from gm_core.records import (
    Alignment,
    FragmentState,
    Lease,
    Manifest,
    Reason,
    Requests,
    RoundRecord,
    Snapshot,
)
from gm_core.requests import Purpose, failure, issue, settle
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
MAX_PUBLISH_ATTEMPTS = 3
"""Snapshot writes in a row before the round is captured afresh (the shell retries each too)."""
MAX_FETCHED = 64
"""Records fetched ahead of alignment; probing pauses beyond this (bounded memory)."""


class Ask(enum.StrEnum):
    """What the learner asked for; the outcome is routed by it (:func:`_outcome`)."""

    HEAD = "head"
    RECORD = "record"
    CAPTURE = "capture"
    SNAPSHOT = "snapshot"
    SNAPSHOT_CHECK = "snapshot_check"
    ALIGN = "align"
    LOAD = "load"
    PRIOR = "prior"
    LEASE = "lease"
    RELEASE = "release"
    FOLLOW = "follow"


class Phase(enum.StrEnum):
    IDLE = "idle"
    BOOTING = "booting"
    LOADING = "loading"
    RUNNING = "running"
    CLOSING = "closing"
    CLOSED = "closed"


@attrs.frozen(kw_only=True)
class LearnerOptions:
    """Node-local settings (not part of the run's agreed config)."""

    poll_s: float = 1.0
    renew_s: float | None = None
    """Lease renewal interval; None: half the run's lease timeout."""
    close_timeout_s: float = 60.0
    flush_on_close: bool = True
    lease_epoch_us: int | None = None
    """The shell's wall clock minus its monotonic clock, in µs: lease sequence numbers are
    then this node's wall clock (:func:`gm_core.liveness.next_seq`). None: a plain count."""


@attrs.frozen(kw_only=True)
class Anchor:
    """Where a fragment was last aligned: its version, and the step/tokens at that point."""

    version: int
    step: int
    tokens: int


@attrs.frozen(kw_only=True)
class Outgoing:
    """A snapshot this learner is publishing or has published and not yet seen committed."""

    round: int
    fragment: int
    base_version: int
    step: int
    tokens: int
    steps: int
    token_count: int
    final: bool
    published: bool = False
    snapshot: Snapshot | None = None
    slot: int = 0
    """The slot of the snapshot key being written (spec/protocol.md §16.4)."""
    attempts: int = 1
    requests: Requests = attrs.field(factory=Requests)
    """The node's requests this snapshot reports (see :func:`_captured`)."""
    failing_since_s: float | None = None
    """When publishing this round first failed (None: it has not); see :func:`_retry_due`."""


@attrs.frozen(kw_only=True)
class Retry:
    """A round whose publishing failed: captured afresh at ``at_s`` while the round is open."""

    final: bool
    since_s: float
    at_s: float


@attrs.frozen(kw_only=True)
class LearnerState:
    node: str
    manifest: Manifest
    schema_digest: str
    options: LearnerOptions
    envelope: Envelope
    phase: Phase = Phase.IDLE
    step: int = 0
    tokens: int = 0
    offset: int = 0
    step_s: float | None = None
    last_report: tuple[float, int] | None = None
    anchors: tuple[Anchor, ...] = ()
    modes: tuple[Alignment, ...] = ()
    """Under ``adaptive`` alignment, each fragment's mode (:mod:`gm_core.adaptive`); empty
    until a commit moves one (every fragment starts by carrying)."""
    next_round: int = 0
    aligned_round: int = -1
    seen_round: int = -1
    record_slots: SlotCursor = attrs.field(factory=SlotCursor)
    """The slot of the next round's record key to read (spec/protocol.md §16.4)."""
    exhausted_round: int = -1
    """A round whose record key was found with every slot invalid: reported once, then
    read again every lease timeout without repeating the report."""
    fetched: Mapping[int, RoundRecord] = attrs.field(factory=dict)
    held: RoundRecord | None = None
    """The newest record adopted: in a chained run, the next one must name it (§16.5)."""
    walk: tip.Walk = attrs.field(factory=lambda: tip.walk(-1))
    """Booting: the search for the tape's tip (galloping from the head hint; the tip is
    adopted once it chains to the round before, §16.5.2)."""
    outgoing: Mapping[int, Outgoing] = attrs.field(factory=dict)
    retries: Mapping[int, Retry] = attrs.field(factory=dict)
    flushes: frozenset[int] = frozenset()
    """Final rounds of a flush waiting for their fragment's previous round (:func:`_close`)."""
    divergences: int = 0
    """Commits in a row that rejected this learner's delta as non-finite (:func:`_diverged`)."""
    reloaded_from: int = 0
    """Rounds below this were captured before the last reload (:func:`_poisoned`)."""
    follow_round: int = -1
    """A round whose ``follow`` marker was found: published at the next exact step count."""
    follow_probing: bool = False
    follow_at_s: float = 0.0
    silent_through: int = -1
    """Renew no lease until a record of this round is seen (see :func:`_retry_due`)."""
    loading: frozenset[int] = frozenset()
    priors: Mapping[int, fallback.Prior] = attrs.field(factory=dict)
    """Fragments whose unusable commit is being replaced while loading: the record read."""
    fallen: Mapping[int, str] = attrs.field(factory=dict)
    """Fragments loaded from the commit before the frontier's (one step back only), each
    with the unusable payload it replaced."""
    lost: str | None = None
    """The ``commit_lost`` message last given, so that a failing join says it once."""
    aligning: int | None = None
    probing: bool = False
    probe_at_s: float = 0.0
    records: cadence.Cadence = attrs.field(factory=cadence.Cadence)
    idle_until_s: float = 0.0
    behind: bool = True
    requests_base: Requests = attrs.field(factory=Requests)
    requests_lost: Requests = attrs.field(factory=Requests)
    lease_seq: int = -1
    """The sequence number of the lease written last."""
    lease_at_s: float = 0.0
    close_by_s: float = NEVER
    keep_lease: bool = False
    """Closing hands the lease to this node's closer (an elected ``either`` node) instead
    of deleting it: a gap would make the closer look gone to its followers."""
    pace: Pace | None = None
    wake_s: float = NEVER
    pending: Mapping[int, Purpose[Ask]] = attrs.field(factory=dict)
    next_req: int = 1


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
    if not keys.valid_id(node):
        raise ValueError(f"invalid node id {node!r}")
    refused = auth.mismatch(manifest.auth, run_auth)
    if refused is not None:
        raise ValueError(refused)
    return LearnerState(
        node=node,
        manifest=manifest,
        schema_digest=schema_digest,
        options=options or LearnerOptions(),
        envelope=auth.for_run(manifest.run_id, run_auth),
    )


def schedule_step(state: LearnerState, round_: int) -> int:
    """The shell's local step at which ``round_`` falls due for this learner."""
    cfg = state.manifest.config
    return schedule.step_of(round_, cfg.sync_every, cfg.fragments) - state.offset


Result = tuple[LearnerState, list[Command]]


def advance(state: LearnerState, event: Event) -> Result:
    """The learner's transition function: one event in, the new state and commands out."""
    cmds: list[Command] = []
    if isinstance(event, Started):
        state = _start(state, event.now_s, cmds)
    elif isinstance(event, Stepped):
        state = _stepped(state, event)
    elif isinstance(event, CloseRequested):
        state = _close(attrs.evolve(state, keep_lease=event.keep_lease), event.now_s, cmds)
    elif isinstance(event, TimerFired):
        state = attrs.evolve(state, wake_s=NEVER)
    else:
        state, purpose = settle(state, event.req)
        if purpose is None:
            return state, cmds  # an outcome we no longer wait for (e.g. after a restart)
        state = _outcome(state, purpose, event, cmds)
    # The step count is exact only when the shell just reported it or is stalled.
    exact = isinstance(event, Stepped) or _stalled(state)
    state = _pump(state, event.now_s, cmds, exact_step=exact)
    return state, cmds


def _start(state: LearnerState, now_s: float, cmds: list[Command]) -> LearnerState:
    if state.phase is not Phase.IDLE:
        return state
    state, req = issue(state, Purpose(kind=Ask.HEAD))
    cmds.append(Get(req=req, key=keys.head()))
    return attrs.evolve(state, phase=Phase.BOOTING, probing=True, lease_at_s=now_s)


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
        state = _flush_due(state, cmds)
    return state


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
            state = attrs.evolve(state, flushes=state.flushes - {round_})
            state = _publish(state, round_, final=True, cmds=cmds)
    return state


def _outcome(
    state: LearnerState, purpose: Purpose[Ask], event: Event, cmds: list[Command]
) -> LearnerState:
    match purpose.kind:
        case Ask.HEAD | Ask.RECORD:
            return _record_outcome(state, purpose, event, cmds)
        case Ask.CAPTURE:
            return _captured(state, purpose.round, event, cmds)
        case Ask.SNAPSHOT:
            return _snapshot_written(state, purpose.round, event, cmds)
        case Ask.SNAPSHOT_CHECK:
            return _snapshot_checked(state, purpose.round, event, cmds)
        case Ask.ALIGN | Ask.LOAD:
            return _aligned(state, purpose, event, cmds)
        case Ask.PRIOR:
            return _prior_outcome(state, purpose, event, cmds)
        case Ask.FOLLOW:
            return _follow_outcome(state, purpose.round, event, cmds)
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


def _record_outcome(
    state: LearnerState, purpose: Purpose[Ask], event: Event, cmds: list[Command]
) -> LearnerState:
    """A head hint or a round record arrived (or did not): move the tape forward."""
    now_s, poll_s = event.now_s, state.options.poll_s
    poll_later = attrs.evolve(state, probing=False, probe_at_s=now_s + poll_s)
    if not isinstance(event, GotObject):
        return poll_later
    if purpose.kind is Ask.HEAD:
        hint = parse_head(state.envelope, event.data)
        return attrs.evolve(state, probing=False, probe_at_s=now_s, walk=tip.walk(hint))
    booting = state.phase is Phase.BOOTING
    if event.data is None:
        if booting:
            return _walked(state, tip.missing(state.walk), now_s, cmds)
        records = cadence.missed(state.records)
        idle_until_s = cadence.next_look_s(
            records, now_s, poll_s, longest_s=state.manifest.config.lease_timeout_s
        )
        return attrs.evolve(poll_later, records=records, idle_until_s=idle_until_s)
    config, slot = state.manifest.config, int(purpose.name)
    prev = expected_prev(state.manifest, state.held, purpose.round)
    parsed = parse_record(state.envelope, event.data, purpose.round, config, slot, prev)
    if isinstance(parsed, BadRecord):
        return _bad_record(state, parsed, now_s, cmds)
    if booting:  # only the tip matters: keep memory bounded while searching for it
        records = cadence.restart(state.records, now_s)
        state = attrs.evolve(state, records=records, idle_until_s=now_s)
        return _walked(state, tip.found(state.walk, state.manifest, parsed), now_s, cmds)
    fetched = dict(state.fetched)
    fetched[parsed.round] = parsed
    live = state.phase in (Phase.RUNNING, Phase.CLOSING)
    records = (cadence.seen if live else cadence.restart)(state.records, now_s)
    state = attrs.evolve(
        state,
        fetched=fetched,
        held=parsed,
        seen_round=parsed.round,
        probing=False,
        probe_at_s=now_s,
        records=records,
        idle_until_s=now_s,
    )
    if state.phase in (Phase.RUNNING, Phase.CLOSING):
        state = _catch_up(state, parsed)
    return state


def _bad_record(
    state: LearnerState, bad: BadRecord, now_s: float, cmds: list[Command]
) -> LearnerState:
    """An invalid object at a slot of the next record's key: read the slot above it now.

    A newer format's record, or one side of a fork, stops the probe (skipping it would
    split the tape between readers); a key whose every slot is invalid is reported once
    and read again from slot 0 every lease timeout (only an operator can clear it).
    """
    if bad.round != state.exhausted_round:  # a key already reported exhausted: quietly
        detail = f"slot {bad.slot}: {bad.reason}"
        cmds.append(Notify(kind=rejected(bad), round=bad.round, detail=detail))
    poll_later = attrs.evolve(state, probing=False, probe_at_s=now_s + state.options.poll_s)
    if bad.stops:
        return poll_later
    cursor = skip(state.record_slots, bad)
    if exhausted(cursor, bad.round):
        if bad.round != state.exhausted_round:
            cmds.append(Notify(kind="slots_exhausted", round=bad.round, detail=bad.reason))
        # Only an operator can clear the key: read its slots again once a lease timeout.
        again_s = now_s + state.manifest.config.lease_timeout_s
        return attrs.evolve(
            state,
            probing=False,
            probe_at_s=again_s,
            record_slots=SlotCursor(),
            exhausted_round=bad.round,
        )
    return attrs.evolve(state, probing=False, probe_at_s=now_s, record_slots=cursor)


def _walked(state: LearnerState, walk: tip.Walk, now_s: float, cmds: list[Command]) -> LearnerState:
    """Booting, the search for the tip moved on: probe its next round, or load the tip."""
    state = attrs.evolve(state, walk=walk, held=walk.held, probing=False, probe_at_s=now_s)
    if not walk.done:
        return state
    for round_, why in walk.refused:
        cmds.append(Notify(kind="record_rejected", round=round_, detail=why))
    newest = walk.held
    seen = -1 if newest is None else newest.round
    fetched = {} if newest is None else {seen: newest}
    # The finished walk is forgotten: nodes that joined alike are in the same state.
    state = attrs.evolve(state, seen_round=seen, fetched=fetched, walk=tip.walk(-1))
    return _begin_loading(state, cmds)


def _catch_up(state: LearnerState, record: RoundRecord) -> LearnerState:
    """The run committed ``record``: never head for a round that is already closed."""
    if record.round < state.next_round:
        return state
    lag = schedule_step(state, record.round) - state.step
    return attrs.evolve(state, next_round=record.round + 1, offset=state.offset + max(lag, 0))


def _begin_loading(state: LearnerState, cmds: list[Command]) -> LearnerState:
    """The newest record is known: overwrite every fragment from its frontier."""
    newest = state.fetched.get(state.seen_round)
    frontier = frontier_of(state.manifest, newest)
    cfg = state.manifest.config
    loading = set()
    for fragment, fs in enumerate(frontier):
        state = _load(state, fragment, fs, state.seen_round, cmds)
        loading.add(fragment)
    position = schedule.step_of(state.seen_round, cfg.sync_every, cfg.fragments) if newest else 0
    return attrs.evolve(
        state,
        phase=Phase.LOADING,
        probing=False,
        loading=frozenset(loading),
        fetched={},
        aligned_round=state.seen_round,
        next_round=max(state.next_round, state.seen_round + 1),
        offset=max(state.offset, position - state.step),
        anchors=tuple(
            Anchor(version=fs.version, step=state.step, tokens=state.tokens) for fs in frontier
        ),
    )


def _load(
    state: LearnerState, fragment: int, fs: FragmentState, round_: int, cmds: list[Command]
) -> LearnerState:
    """Overwrite ``fragment`` with the commit ``fs`` (named by record ``round_``)."""
    state, req = issue(state, Purpose(kind=Ask.LOAD, round=fragment))
    cmds.append(
        Align(
            req=req,
            round=round_,
            fragment=fragment,
            version=fs.version,
            theta=fs.theta,
            mode=Alignment.OVERWRITE,
            mixing=1.0,
            from_snapshot=False,
        )
    )
    return state


def _publish(
    state: LearnerState,
    round_: int,
    *,
    final: bool,
    cmds: list[Command],
    since_s: float | None = None,
) -> LearnerState:
    """Capture the delta of round ``round_``'s fragment.

    A due round is published even when its fragment saw no steps since its anchor
    (the closer rejects it as ``zero_steps``): a learner that stayed silent would
    leave the closer waiting for it until its lease expired. Only a final flush
    skips empty fragments, and nobody publishes a round already committed.
    """
    cfg = state.manifest.config
    fragment = schedule.fragment_of(round_, cfg.fragments)
    anchor = state.anchors[fragment]
    steps = state.step - anchor.step
    if (final and steps <= 0) or round_ <= state.seen_round:
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
    outgoing = dict(state.outgoing)
    outgoing[out.round] = out
    state = attrs.evolve(state, outgoing=outgoing)
    state, req = issue(state, Purpose(kind=Ask.SNAPSHOT, round=out.round))
    cmds.append(PutOnce(req=req, key=_snapshot_key(state, out), data=_packed(state, out)))
    return state


def _snapshot_key(state: LearnerState, out: Outgoing) -> str:
    return slots.snapshot_key(state.envelope, out.round, state.node, out.slot)


def _packed(state: LearnerState, out: Outgoing) -> bytes:
    """The bytes of ``out``'s snapshot at its slot (sealed for that key: they differ per slot)."""
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
        lease_at_s = max(state.lease_at_s, event.now_s + _renew_s(state))
        return _published(attrs.evolve(state, lease_at_s=lease_at_s), out, cmds)
    # Taken, or unknown after a lost response: our own earlier attempt may have landed.
    state, req = issue(state, Purpose(kind=Ask.SNAPSHOT_CHECK, round=round_))
    cmds.append(Get(req=req, key=_snapshot_key(state, out)))
    return state


def _published(state: LearnerState, out: Outgoing, cmds: list[Command]) -> LearnerState:
    cmds.append(Notify(kind="published", round=out.round, detail=f"steps={out.steps}"))
    outgoing = dict(state.outgoing)
    outgoing[out.round] = attrs.evolve(out, published=True)
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


def _aligned(
    state: LearnerState, purpose: Purpose[Ask], event: Event, cmds: list[Command]
) -> LearnerState:
    if isinstance(event, Unusable):
        return _unusable(state, purpose, event, cmds)
    if not isinstance(event, Aligned):
        # The payload could not be fetched (swept while we lagged, or a store failure):
        # join again from the newest record, which re-reads its frontier.
        cmds.append(Notify(kind="align_failed", round=purpose.round, detail=failure(event)))
        return _rejoin(state)
    if purpose.kind is Ask.LOAD:
        loading = state.loading - {purpose.round}
        if state.phase is not Phase.LOADING:
            return attrs.evolve(state, loading=loading)  # closed meanwhile: it stays so
        phase = Phase.RUNNING if not loading else state.phase
        if not loading:
            cmds.append(Notify(kind="joined", round=state.aligned_round))
            state = attrs.evolve(state, lost=None)
        return attrs.evolve(state, loading=loading, phase=phase)
    return _apply_alignment(state, purpose.round, event, cmds)


def _unusable(
    state: LearnerState, purpose: Purpose[Ask], event: Unusable, cmds: list[Command]
) -> LearnerState:
    """A commit's payload is unusable (spec/protocol.md §16.10): use the commit before it."""
    if purpose.kind is Ask.LOAD:
        return _load_earlier(state, purpose.round, event, cmds)
    record = state.fetched.get(purpose.round)
    if record is None:
        return state
    window = retention.KEEP_CYCLES * state.manifest.config.fragments
    if event.reason is Reason.MISSING and record.round + window <= state.seen_round:
        # Swept while we lagged: the run has newer commits; join again from the newest.
        cmds.append(Notify(kind="align_failed", round=record.round, detail=failure(event)))
        return _rejoin(state)
    # The model keeps the commit before this one, which is what a closer merges the
    # next round of the fragment into (§16.10). The anchor takes the commit's version,
    # so the next snapshot is not stale, and keeps its step: the delta still counts
    # every step since the commit the model holds.
    detail = (
        f"fragment {record.fragment} version {record.version}: {failure(event)}; "
        "this learner keeps the commit it holds"
    )
    cmds.append(Notify(kind="commit_unusable", round=record.round, detail=detail))
    anchors = list(state.anchors)
    anchors[record.fragment] = attrs.evolve(anchors[record.fragment], version=record.version)
    state = attrs.evolve(state, anchors=tuple(anchors))
    return _aligned_through(state, record.round, cmds, applied=False)


def _load_earlier(
    state: LearnerState, fragment: int, event: Unusable, cmds: list[Command]
) -> LearnerState:
    """Joining, ``fragment``'s commit is unusable: load the one before it, or give up."""
    if fragment in state.fallen:
        why = f"the commit before it is unusable too ({event.key})"
        message = fallback.lost(fragment, state.fallen[fragment], why)
        return _lost(state, message, event.now_s, cmds)
    version = state.anchors[fragment].version
    if state.lost is None:
        detail = (
            f"fragment {fragment} version {version}: {failure(event)}; joining from the one before"
        )
        cmds.append(Notify(kind="commit_unusable", round=state.aligned_round, detail=detail))
    found = fallback.prior(state.manifest, fragment, version, event.key)
    return _found_prior(state, fragment, event.key, found, event.now_s, cmds)


def _found_prior(
    state: LearnerState,
    fragment: int,
    key: str,
    found: fallback.Prior | FragmentState | str,
    now_s: float,
    cmds: list[Command],
) -> LearnerState:
    """Load the earlier commit, read the next slot of its record, or give up."""
    priors = {f: p for f, p in state.priors.items() if f != fragment}
    if isinstance(found, str):
        return _lost(state, fallback.lost(fragment, key, found), now_s, cmds)
    if isinstance(found, FragmentState):
        # The anchor keeps the unusable commit's version, as for a commit skipped while
        # running (:func:`_unusable`): a closer merges into this same earlier commit.
        state = attrs.evolve(state, priors=priors, fallen={**state.fallen, fragment: key})
        return _load(state, fragment, found, state.aligned_round, cmds)
    state, req = issue(state, Purpose(kind=Ask.PRIOR, round=fragment))
    cmds.append(Get(req=req, key=record_key(state.envelope, found.round, found.slot)))
    return attrs.evolve(state, priors={**priors, fragment: found})


def _prior_outcome(
    state: LearnerState, purpose: Purpose[Ask], event: Event, cmds: list[Command]
) -> LearnerState:
    at = state.priors.get(purpose.round)
    if at is None or state.phase is not Phase.LOADING:
        return state
    if not isinstance(event, GotObject):
        cmds.append(Notify(kind="align_failed", round=at.round, detail=failure(event)))
        return _rejoin(state)
    found = fallback.read_prior(state.envelope, state.manifest.config, at, event.data)
    return _found_prior(state, at.fragment, at.key, found, event.now_s, cmds)


def _lost(state: LearnerState, message: str, now_s: float, cmds: list[Command]) -> LearnerState:
    """No usable commit of a fragment to join from: say so once, try again in a while.

    The learner joins again from the newest record after a lease timeout: a later
    commit of the fragment, or an operator's restore, lets it in.
    """
    if message != state.lost:
        cmds.append(Notify(kind="commit_lost", round=state.aligned_round, detail=message))
    again_s = now_s + state.manifest.config.lease_timeout_s
    return attrs.evolve(_rejoin(state), lost=message, probe_at_s=again_s)


def _rejoin(state: LearnerState) -> LearnerState:
    """Load the whole model again from the newest record, as a joining learner does.

    Not while closing: a closing learner waits only to see its last rounds committed, and
    the shell leaves the model at the newest commit itself; going back to joining would
    end running, with the close forgotten (bench_queue saw ``close()`` stall so). It stops
    waiting instead: what is still out is judged by the closer without it.
    """
    if state.phase in (Phase.CLOSING, Phase.CLOSED):
        return attrs.evolve(
            state,
            aligning=None,
            fetched={},
            outgoing={},
            retries={},
            flushes=frozenset(),
            loading=frozenset(),
            pending={r: p for r, p in state.pending.items() if p.kind not in (Ask.LOAD, Ask.ALIGN)},
        )
    return attrs.evolve(
        state,
        phase=Phase.BOOTING,
        loading=frozenset(),
        priors={},
        fallen={},
        aligning=None,
        fetched={},
        walk=tip.walk(state.seen_round),
        pending={r: p for r, p in state.pending.items() if p.kind not in (Ask.LOAD, Ask.ALIGN)},
    )


def _diverged(state: LearnerState, record: RoundRecord, cmds: list[Command]) -> LearnerState:
    """A commit rejected this learner's delta as non-finite: its model holds NaN or Inf.

    Aligning one fragment would keep the poison in the others (and in the shell's
    inner optimizer), so the learner loads every fragment from the newest commit,
    as on joining, and says so by name (``diverged``, with how many times in a
    row); the shell resets what the user registered (the inner optimizer) and
    raises once divergence repeats.
    """
    times = state.divergences + 1
    detail = f"non-finite delta rejected; reloading every fragment; times={times}"
    cmds.append(Notify(kind="diverged", round=record.round, detail=detail))
    # Snapshots already taken still go out (the closer awaits them) and may be poisoned
    # too: their rejections are this same divergence, not a new one.
    return _rejoin(attrs.evolve(state, divergences=times, reloaded_from=state.next_round))


def _poisoned(state: LearnerState, record: RoundRecord) -> bool:
    """Whether ``record`` rejects as non-finite a snapshot taken since the last reload."""
    return record.round >= state.reloaded_from and any(
        x.learner == state.node and x.reason is Reason.NONFINITE for x in record.rejections
    )


def _apply_alignment(
    state: LearnerState, round_: int, event: Aligned, cmds: list[Command]
) -> LearnerState:
    """Commit ``round_`` is now in the model: move the fragment's anchor."""
    record = state.fetched[round_]
    anchors = list(state.anchors)
    anchors[record.fragment] = _new_anchor(state, record, event.step, event.tokens)
    return _aligned_through(attrs.evolve(state, anchors=tuple(anchors)), round_, cmds)


def _aligned_through(
    state: LearnerState, round_: int, cmds: list[Command], *, applied: bool = True
) -> LearnerState:
    """Every record up to ``round_`` is now reflected in the model (``applied``), or
    passed over with the model kept as it was (an unusable commit)."""
    fetched = dict(state.fetched)
    record = fetched.pop(round_)
    outgoing = {r: o for r, o in state.outgoing.items() if r > round_}
    if applied:
        cmds.append(Notify(kind="aligned", round=round_, detail=f"version={record.version}"))
    behind = _behind(state, record)
    out = state.outgoing.get(round_)
    if behind and out is not None and out.published:
        state = attrs.evolve(state, requests_lost=state.requests_lost + out.requests)
    return attrs.evolve(
        state,
        fetched=fetched,
        outgoing=outgoing,
        aligned_round=round_,
        aligning=None,
        behind=behind,
    )


def _behind(state: LearnerState, record: RoundRecord) -> bool:
    """Whether we are not yet in phase with the run: true from joining until a record
    names a snapshot of ours, and again whenever a record closes without one we
    published (it landed after the round closed).

    Such a learner probes every poll: seeing a record before its own snapshot for
    that round is what lets it skip ahead (:func:`_catch_up`) and get in phase;
    a learner whose snapshots count follows the run's pace instead.
    """
    out = state.outgoing.get(record.round)
    if out is None or not out.published:
        return state.behind
    named = {p.learner for p in record.participants} | {x.learner for x in record.rejections}
    return state.node not in named


def _included(state: LearnerState, record: RoundRecord) -> bool:
    """Whether ``record`` merged this learner's snapshot of its round."""
    out = state.outgoing.get(record.round)
    if out is None or not out.published:
        return False
    return state.node in {p.learner for p in record.participants}


def _new_anchor(state: LearnerState, record: RoundRecord, step: int, tokens: int) -> Anchor:
    """Where the fragment's step and token counts restart after aligning ``record``.

    Carry keeps local progress, so each trained step is contributed exactly once:
    the steps up to this learner's snapshot are in the commit only if the record
    merged that snapshot; if it did not (it landed after the round closed, or was
    rejected), the anchor keeps its counts and the next snapshot of the fragment
    reports them again, with the parameters' delta to match (``Align.from_snapshot``).
    """
    old = state.anchors[record.fragment]
    if _mode(state, record.fragment) is Alignment.CARRY:
        out = state.outgoing.get(record.round)
        if out is not None and _included(state, record):
            return Anchor(version=record.version, step=out.step, tokens=out.tokens)
        return attrs.evolve(old, version=record.version)
    return Anchor(version=record.version, step=step, tokens=tokens)


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
        state = _publish_due(state, cmds)
    if state.phase in (Phase.RUNNING, Phase.CLOSING):
        state = _retry_due(state, now_s, cmds, exact_step=exact_step)
        state = _align_next(state, cmds)
    if state.phase is Phase.CLOSING:
        state = _flush_due(state, cmds)
    if state.phase is Phase.RUNNING and exact_step:
        state = _publish_due(_followed(state), cmds)
    state = _poll(state, now_s, cmds)
    state = _poll_follow(state, now_s, cmds)
    state = _renew(state, now_s, cmds)
    if state.phase is Phase.CLOSING:
        state = _maybe_release(state, now_s, cmds)
    return _pace(state, now_s, cmds)


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


def _align_next(state: LearnerState, cmds: list[Command]) -> LearnerState:
    """Align the next record in tape order; a record that changed nothing needs no fetch."""
    while state.aligning is None:
        round_ = state.aligned_round + 1
        record = state.fetched.get(round_)
        if record is None:
            return state
        if _poisoned(state, record):
            return _diverged(state, record, cmds)
        if _included(state, record):
            state = attrs.evolve(state, divergences=0)
        state = _adapt(state, record, cmds)
        if record.version == state.anchors[record.fragment].version:
            # Nothing was committed: the parameters and the anchor's counters stay, so
            # the steps still in the fragment's delta keep counting toward its weight.
            state = _aligned_through(state, round_, cmds)
            continue
        mode = _mode(state, record.fragment)
        state, req = issue(state, Purpose(kind=Ask.ALIGN, round=round_))
        cmds.append(
            Align(
                req=req,
                round=round_,
                fragment=record.fragment,
                version=record.version,
                theta=record.theta,
                mode=mode,
                mixing=state.manifest.config.mixing if mode is Alignment.BLEND else 1.0,
                from_snapshot=_included(state, record),
            )
        )
        state = attrs.evolve(state, aligning=round_)
    return state


def _mode(state: LearnerState, fragment: int) -> Alignment:
    """How the next commit of ``fragment`` is folded in: the run's rule, or under
    ``adaptive`` the fragment's current mode."""
    rule = state.manifest.config.alignment
    if rule is not Alignment.ADAPTIVE:
        return rule
    return state.modes[fragment] if state.modes else adaptive.INITIAL


def _adapt(state: LearnerState, record: RoundRecord, cmds: list[Command]) -> LearnerState:
    """Under ``adaptive`` alignment, move ``record``'s fragment's mode by its cosine."""
    cfg = state.manifest.config
    if cfg.alignment is not Alignment.ADAPTIVE or record.cosine is None:
        return state
    was = _mode(state, record.fragment)
    mode = adaptive.next_mode(was, record.cosine, cfg.carry_above, cfg.overwrite_below)
    if mode is was:
        return state
    modes = list(state.modes or (adaptive.INITIAL,) * cfg.fragments)
    modes[record.fragment] = mode
    detail = f"fragment={record.fragment} {mode.value} cosine {record.cosine:.3f}"
    cmds.append(Notify(kind="alignment_changed", round=record.round, detail=detail))
    return attrs.evolve(state, modes=tuple(modes))


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
    seq = liveness.next_seq(state.lease_seq, state.options.lease_epoch_us, now_s)
    lease = Lease(node=state.node, roles=("learner",), seq=seq, renew_s=renew_s)
    state, req = issue(state, Purpose(kind=Ask.LEASE))
    key = keys.lease(state.node)
    cmds.append(PutOver(req=req, key=key, data=state.envelope.pack(key, lease)))
    return attrs.evolve(state, lease_seq=seq, lease_at_s=now_s + renew_s)


def _renew_s(state: LearnerState) -> float:
    return liveness.renew_interval_s(state.options.renew_s, state.manifest.config.lease_timeout_s)


def _renew_at_s(state: LearnerState) -> float:
    """When the lease must be written: on time, or a little late if a snapshot is due by then.

    Never while silent (:func:`_retry_due`): until the round it could not publish is
    committed, a stale lease is how the closer learns not to wait for it.
    """
    if state.silent_through > state.seen_round:
        return NEVER
    slack_s = liveness.renew_slack_s(_renew_s(state))
    expected_s = _next_publish_s(state)
    if expected_s is not None and expected_s <= state.lease_at_s + slack_s:
        return state.lease_at_s + slack_s
    return state.lease_at_s


def _next_publish_s(state: LearnerState) -> float | None:
    """When the next snapshot should be written, from the step time (None: not foreseeable)."""
    if state.phase is not Phase.RUNNING or _stalled(state) or state.step_s is None:
        return None
    if state.last_report is None:
        return None
    then_s, then_step = state.last_report
    if any(not out.published for out in state.outgoing.values()):
        return then_s  # one is being captured or written right now
    return then_s + max(schedule_step(state, state.next_round) - then_step, 0) * state.step_s


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
        state.follow_at_s if _following(state) is not None and not state.follow_probing else NEVER,
    )
    if state.phase is Phase.CLOSED:
        wake = NEVER
    if wake != state.wake_s:
        if wake < NEVER:
            cmds.append(WakeAt(at_s=max(wake, now_s)))
        state = attrs.evolve(state, wake_s=wake)
    return state
