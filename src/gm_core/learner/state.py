"""The learner's values: phases, request kinds, options, anchors, outgoing snapshots, the state.

Split out of the learner machine so that its parts (:mod:`~gm_core.learner.boot`,
:mod:`~gm_core.learner.publish`, :mod:`~gm_core.learner.align`,
:mod:`~gm_core.learner.pump`) share them without importing each other. It holds no
decisions (``schedule_step`` only converts a round to the shell's step), so the other
modules import from it by name; everything that decides is called through its module
(``align._rejoin(...)``), so that a replaced function is the one every caller runs.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping

import attrs

from gm_core import cadence, fallback, schedule, tip
from gm_core.auth import Envelope
from gm_core.commands import Command, Pace
from gm_core.records import Alignment, Manifest, Requests, RoundRecord, Snapshot
from gm_core.requests import Purpose
from gm_core.tape import SlotCursor

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
    sealed: bytes | None = None
    """The bytes last written at ``slot`` (until published): told to this node's closer and
    compared with what the slot holds, not packed again."""
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
    empty_finals: frozenset[int] = frozenset()
    """Rounds of ``flushes`` published even when their fragment has no steps: those a closing
    learner flushing again must report so that a closer awaiting it closes them
    (:func:`gm_core.learner.publish._reflush`)."""
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


def schedule_step(state: LearnerState, round_: int) -> int:
    """The shell's local step at which ``round_`` falls due for this learner."""
    cfg = state.manifest.config
    return schedule.step_of(round_, cfg.sync_every, cfg.fragments) - state.offset


Result = tuple[LearnerState, list[Command]]
