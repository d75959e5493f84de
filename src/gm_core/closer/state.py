"""The closer's values: phases, request kinds, options, per-learner entries and the state.

Split out of the closer machine so that every part of it (:mod:`~gm_core.closer.boot`,
:mod:`~gm_core.closer.collect`, :mod:`~gm_core.closer.commit`, :mod:`~gm_core.closer.pump`)
can share them without importing each other. Besides the types it holds only the tiny
accessors every part reads (the named closer, the round's fragment and gap, an entry's
update): they decide nothing, so the other modules import them by name. Everything that
decides is in a sibling module, called through it (``commit._live(...)``) so that a
replaced function (a planted bug, :mod:`gm_core.check.plants`) is the one every caller runs.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping

import attrs

from gm_core import cadence, election, liveness, schedule, tip
from gm_core.auth import Envelope
from gm_core.commands import Command
from gm_core.fallback import Prior
from gm_core.records import FragmentState, Manifest, Reason, Requests, RoundRecord, Snapshot, Timing
from gm_core.requests import Purpose, issue
from gm_core.tape import SlotCursor, frontier_of

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


class Listing(enum.StrEnum):
    """Where the listing of the leases stands against a snapshot this closer heard of from
    its node's learner (:func:`gm_core.closer.collect._take_heard`) instead of listing it."""

    DONE = "done"
    """Nothing heard this round, or the leases listed after it are read."""
    DUE = "due"
    """Heard of: a listing must be issued before the round may close."""
    OUT = "out"
    """A listing issued after it is out."""
    READING = "reading"
    """The leases that listing found are being read."""


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
    claim_nonce: bytes = attrs.field(default=b"", repr=False)
    """Random bytes of the shell's, secret to this node: where it jumps when it bids past a
    flood of invalid claims (:func:`gm_core.election.next_attempt`), which nobody who
    cannot foresee them can pre-occupy. Empty: a fixed draw (the model cluster's)."""


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
    heard: tuple[tuple[int, str, bytes], ...] = ()
    """Snapshots this node's learner wrote (round, key, bytes) that no round being collected
    could take when it told us (:func:`collect._heard`): judged when their round is
    collected, as the listing that opens it would find them; dropped once it is past."""
    discovery: Listing = Listing.DONE
    """A round whose own learner's snapshot was heard of closes only once a listing of the
    leases issued after it has come back and the leases it found are read: a learner that
    joined since the last listing then counts (the round waits for it as for any learner
    live). A node alone closes a round as soon as its learner's snapshot is heard of, so it
    runs ahead of a newcomer, whose snapshots then land only in rounds already closed,
    which no listing of an open round shows; its lease, written before it trained, is in
    the folder (tests/runtime/test_leaving.py, test_session.py's adaptive alignment, in
    the fresh-clone CI of 19e1ffd: the newcomer never took part; spec/protocol.md §6.4)."""
    bad_keys: frozenset[str] = frozenset()
    draft: RoundRecord | None = None
    sealed: tuple[int, bytes] | None = None
    """The slot the draft was last written to and the bytes written there: what this node's
    learner is told once the write lands (``Share``), so the record is not packed twice."""
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


Result = tuple[CloserState, list[Command]]


def _busy(state: CloserState, purpose: Purpose[Ask]) -> tuple[CloserState, int]:
    """Issue a request of a kind of which at most one is outstanding."""
    state, req = issue(state, purpose)
    return attrs.evolve(state, busy=state.busy | {purpose.kind}), req


def _named(state: CloserState) -> str:
    return state.last.next_closer if state.last is not None else state.manifest.created_by


def _fragment(state: CloserState) -> int:
    return schedule.fragment_of(state.round, state.manifest.config.fragments)


def _gap(state: CloserState) -> int:
    cfg = state.manifest.config
    return schedule.gap_of(state.round, cfg.sync_every, cfg.fragments)


def _watched(state: CloserState) -> str:
    return election.rightful_closer(_named(state), state.claims)[0]


def _set_entry(state: CloserState, entry: Entry) -> CloserState:
    entries = dict(state.entries)
    entries[entry.learner] = entry
    return attrs.evolve(state, entries=entries)


def _frontier(state: CloserState) -> tuple[FragmentState, ...]:
    return frontier_of(state.manifest, state.last)


_NO_TIMING = Timing()
