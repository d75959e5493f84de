"""Collecting and judging one round's snapshots, and learning who is live.

The leader lists ``snapshots/r/``, fetches each new snapshot record by its slot, judges
it (:func:`gm_core.verdicts.judge_snapshot`) and has the shell verify its payload; the
resulting :class:`~gm_core.closer.state.Entry` values are what
:mod:`gm_core.closer.commit` counts. Learners are learned of from snapshots and from
the lease listing (newcomers), and their leases are looked at only while they are
awaited; an ``either`` node decides here whether it is elected to serve.
"""

from __future__ import annotations

import attrs

from gm_core import cadence, codec, election, keys, liveness, verdicts
from gm_core.auth import Unauthenticated
from gm_core.closer import boot, commit, pump
from gm_core.closer.state import (
    Ask,
    CloserState,
    Entry,
    Listing,
    Phase,
    Stage,
    _busy,
    _fragment,
    _frontier,
    _set_entry,
)
from gm_core.commands import Command, Delete, Get, List, Notify, Verify
from gm_core.events import Event, GotObject, Listed, Shared, Verified
from gm_core.records import Lease, Reason, Snapshot
from gm_core.requests import Purpose, issue
from gm_core.slots import SLOTS, Invalid, open_snapshot, snapshot_key, snapshot_slot


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
    state = _reading(state, learner, slot, by_name=by_name)
    state, req = issue(state, Purpose(kind=Ask.SNAPSHOT, round=state.round, name=learner))
    cmds.append(Get(req=req, key=snapshot_key(state.envelope, state.round, learner, slot)))
    if by_name:
        return state  # no sign of life yet: the object may not exist
    return _seen_alive(state, learner, now_s, cmds)


def _reading(state: CloserState, learner: str, slot: int, *, by_name: bool) -> CloserState:
    """``learner``'s snapshot at ``slot`` is being read."""
    old = state.entries.get(learner)  # the invalid slot below: its verdict stands until then
    reason = old.reason if old is not None else None
    entry = Entry(learner=learner, stage=Stage.FETCHING, slot=slot, reason=reason, by_name=by_name)
    return _set_entry(state, entry)


def _seen_alive(state: CloserState, learner: str, now_s: float, cmds: list[Command]) -> CloserState:
    """A snapshot of ``learner`` is in the round's folder: a sign of life (or a lease to read)."""
    if learner in state.leases:
        return _touch(state, learner, now_s)
    return boot._look_at_lease(state, Ask.LEASE, learner, cmds)


MAX_HEARD = 8
"""Snapshots of rounds not yet collected kept from this node's learner (``in_flight`` and a
close's flush ahead at most, in practice); the oldest go first."""


def _heard(state: CloserState, event: Shared, cmds: list[Command]) -> CloserState:
    """This node's learner created ``event.key``: if it is its snapshot of the round being
    collected, judge it now, as a listing and a read of the key would (the same bytes),
    without waiting for either; if of a later round (a learner runs up to ``in_flight``
    rounds ahead of the commits), keep it until that round is collected (:func:`_collect`).

    Anything else is ignored: another key, a round already past, a slot a listing would
    not have this closer read (one being read or judged is not read twice), and all of it
    unless this node's learner is the only one live (:func:`alone`).
    """
    if not alone(state, event.now_s):
        return state
    try:
        parsed = keys.parse(event.key)
    except keys.BadKey:
        return state
    if not isinstance(parsed, keys.SnapshotKey) or parsed.learner != state.node:
        return state
    if parsed.round < state.round:
        return state
    if parsed.round == state.round and state.phase is Phase.COLLECTING:
        return _take_heard(state, event.key, event.data, event.now_s, cmds)
    kept = tuple(h for h in state.heard if h[0] >= state.round and h[1] != event.key)
    heard = (*kept, (parsed.round, event.key, event.data))[-MAX_HEARD:]
    return attrs.evolve(state, heard=heard)


def _take_heard(
    state: CloserState, key: str, data: bytes, now_s: float, cmds: list[Command]
) -> CloserState:
    """Judge ``data``, our learner's object at ``key`` in the round being collected, if a
    listing showing the key would have this closer read it now."""
    found = _snapshot_slot(state, key)
    if found is None:
        return state
    learner, slot = found
    if _next_slot(state.entries.get(learner)) != slot:
        return state
    state = _seen_alive(_reading(state, learner, slot, by_name=False), learner, now_s, cmds)
    # List the leases now: the round may not close before a listing issued after this has
    # shown who else is live (:attr:`CloserState.discovery`).
    state = attrs.evolve(
        state, discovery=Listing.DUE, discover_at_s=min(state.discover_at_s, now_s)
    )
    return _paced(_judge_read(state, learner, data, cmds), now_s)


def alone(state: CloserState, now_s: float) -> bool:
    """Whether no learner but this node's own is live as far as this closer knows: only then
    does it hear of its node's writes before the store shows them (spec/protocol.md §6.4).

    With other learners live, the poll paces them all alike; were its own learner told of
    each record at once, it would stall less than they do at ``in_flight``, run ahead, and
    start every grace window early. Measured on the model cluster (three learners, the
    leader's node learning and closing, quorum 1; tests/core/test_batch.py): the rounds
    then closed with the leader's learner alone and the other two were counted not live.
    """
    return not commit._live(state, now_s) - {state.node}


def _take_kept(state: CloserState, now_s: float, cmds: list[Command]) -> CloserState:
    """Judge what our learner told us of the round now collected (while it is alone,
    :func:`alone`); forget rounds past."""
    now = [h for h in state.heard if h[0] == state.round] if alone(state, now_s) else []
    state = attrs.evolve(state, heard=tuple(h for h in state.heard if h[0] > state.round))
    for _, key, data in now:
        state = _take_heard(state, key, data, now_s, cmds)
    return state


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
    if not commit._live(state, now_s) and not (state.options.learns_here and not state.serving):
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
    return _judge_read(state, learner, event.data, cmds)


def _judge_read(state: CloserState, learner: str, data: bytes, cmds: list[Command]) -> CloserState:
    """Judge the object read at the slot of ``learner``'s entry; have a snapshot verified."""
    entry = state.entries[learner]
    snapshot = open_snapshot(state.envelope, state.round, learner, entry.slot, data)
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
    if not invalid:  # a skipped slot is a verdict only if it stands at commit (commit._committed)
        cmds.append(rejected(state.round, learner, reason))
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


def rejected(round_: int, learner: str, reason: Reason) -> Notify:
    """The note that ``learner``'s snapshot is not in round ``round_``'s merge, and why."""
    return Notify(kind="rejected", round=round_, detail=f"{learner}: {reason}")


def _collect(state: CloserState, now_s: float, cmds: list[Command]) -> CloserState:
    if state.heard:
        state = _take_kept(state, now_s, cmds)
    if Ask.LIST not in state.busy and now_s >= state.poll_at_s:
        state, req = _busy(state, Purpose(kind=Ask.LIST, round=state.round))
        cmds.append(List(req=req, prefix=keys.snapshot_prefix(state.round)))
        if Ask.WATCH not in state.busy:
            # Someone who judged us dead may have closed this round: its record ends it.
            state = boot._read_record(state, Ask.WATCH, state.round, cmds)
        state = attrs.evolve(state, poll_at_s=now_s + state.options.poll_s)
    state = _discover(state, now_s, cmds)
    state = commit._collect_late(state, now_s, cmds)
    state = _maybe_serve(state, now_s, cmds)
    unreported = _unreported(state)
    if now_s >= state.leases_at_s and unreported:
        for learner in unreported:
            state = boot._look_at_lease(state, Ask.LEASE, learner, cmds)
        state = attrs.evolve(state, leases_at_s=now_s + pump._probe_s(state))
    state = commit._maybe_follow(state, now_s, cmds)
    return commit._maybe_close(state, now_s, cmds)


def _maybe_serve(state: CloserState, now_s: float, cmds: list[Command]) -> CloserState:
    """An ``either`` node leading a round: whether the run elects it its closer now.

    Elected, it stops judging its own learner (which the shell stops after its unit, its
    lease handed over, not released) and writes the lease itself from now on. Serving, it
    is relieved once no other learner is live on its clock: with nobody else training, units
    left would never be trained, and the run never finish (the reference's syncer trains
    again then too); the last learners leaving at the end of the data relieve it as well,
    and it finds the queue done.
    """
    if not (state.options.either and state.options.learns_here):
        return state  # only a node that trains can stop training to serve
    others_live = len(commit._live(state, now_s) - {state.node})
    if state.serving:
        # A learner that reported this round is live too (its lease is not probed again).
        if others_live or commit._reported(state) - {state.node}:
            return state
        return boot._unserve(state, "no other learner live", cmds)
    timeout_s = state.manifest.config.lease_timeout_s
    dedicated_live = any(
        liveness.is_live(state.others.get(n), now_s, timeout_s) for n in state.dedicated
    )
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
    if state.discovery is Listing.DUE:
        state = attrs.evolve(state, discovery=Listing.OUT)
    every_s = (
        state.manifest.config.lease_timeout_s if commit._live(state, now_s) else _idle_s(state)
    )
    return attrs.evolve(state, discover_at_s=now_s + every_s)


def _discover_outcome(
    state: CloserState, purpose: Purpose[Ask], event: Event, cmds: list[Command]
) -> CloserState:
    if purpose.round == state.round and state.discovery is Listing.OUT:
        if isinstance(event, Listed):
            state = attrs.evolve(state, discovery=Listing.READING)
        else:  # the round waits for a listing: the next goes with the next poll
            soon_s = min(state.discover_at_s, state.poll_at_s)
            state = attrs.evolve(state, discovery=Listing.DUE, discover_at_s=soon_s)
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
    return _leases_read(state)


def _leases_read(state: CloserState) -> CloserState:
    """The leases a listing found are all read: who is live is known (``discovery``)."""
    reading = any(p.kind is Ask.NEWCOMER for p in state.pending.values())
    if state.discovery is not Listing.READING or reading:
        return state
    return attrs.evolve(state, discovery=Listing.DONE)


def _newcomer_outcome(
    state: CloserState, purpose: Purpose[Ask], event: Event, cmds: list[Command]
) -> CloserState:
    """A lease found by listing: a learner's counts from now on (a closer's never does).

    A learner a probe found dead is looked at here too, once per listing, instead
    of at every probe interval.
    """
    state = _leases_read(state)  # this one is judged below, in this same transition
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
        idle = not commit._live(state, now_s)
        view = _renewal(state, state.leases.get(name), event.etag, lease.seq, now_s)
        state = _judged(state, name, view, now_s)
        if idle and commit._live(state, now_s):
            state = attrs.evolve(state, poll_at_s=min(state.poll_at_s, now_s))  # wake up
    else:
        old = state.others.get(name)
        view = _renewal(state, old, event.etag, lease.seq, now_s)
        dedicated = election.is_dedicated(lease.roles)
        known = state.dedicated | {name} if dedicated else state.dedicated - {name}
        state = attrs.evolve(state, others={**state.others, name: view}, dedicated=known)
        if dedicated and old is not None and old.changed_at_s != view.changed_at_s:
            state = attrs.evolve(state, renewed={**state.renewed, name: now_s})
        elif not liveness.is_live(view, now_s, state.manifest.config.lease_timeout_s):
            state = boot._stale_closer(state, name)
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
    known = set(state.leases)
    if commit._own_unknown(state) and judged - {state.node}:
        known.add(state.node)  # the round could close without it: see whether it trains
    return sorted(n for n in known if n not in judged and n not in state.dead)
