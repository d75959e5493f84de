"""Typed user events: what the protocol told this node, for callbacks and ``logging``.

Theory of operation
-------------------
The core reports what a user may want to know as :class:`gm_core.commands.Notify`
values (a ``kind``, a round and a short detail); the shell adds a few of its own
(the run was created or adopted). :func:`from_notify` turns each into a frozen,
typed event — :class:`Committed`, :class:`Rejected`, :class:`TookOver`… — whose
fields are parsed from the detail, so user code matches on classes and reads
attributes instead of parsing strings. A kind this module does not know yet
becomes :class:`Other`, never an error: a newer core must not break older
callbacks.

Delivery must never slow the event loop: the loop only puts the event into a
bounded queue (:class:`EventHub`); a dispatcher thread of its own calls the
callbacks and logs. A callback that raises is logged and skipped; one that is
slow only delays later callbacks, and once the queue is full further events are
counted in ``dropped`` instead of blocking the loop. A bounded deque of recent
events is kept for inspection (``Session.events``).
"""

from __future__ import annotations

import logging
import queue
import re
import threading
from collections import deque
from collections.abc import Callable, Sequence
from typing import ClassVar, TypeVar

import attrs

from gm_core.commands import Notify
from gm_core.records import Reason

LOG = logging.getLogger("gm")
LOG.addHandler(logging.NullHandler())  # a library logs only where the application says
E = TypeVar("E", bound="Event")

ACTIONABLE = frozenset(
    {
        Reason.SCHEMA,
        Reason.CORRUPT,
        Reason.NONFINITE,
        Reason.UNSIGNED,
        Reason.OUTLIER,
        Reason.UNAUTHENTICATED,
        None,
    }
)
"""Rejection reasons a user can do something about (None: a reason this shell cannot parse)."""


@attrs.frozen(kw_only=True)
class Event:
    """Something that happened at ``node`` about ``round``, at ``at_s`` on its monotonic clock.

    Attributes:
        kind: the event's name as the core reports it (``committed``, ``rejected``...).
        level: the ``logging`` level it is logged at by default (see :meth:`severity`).
        node: the node it happened at (this session's node id).
        round: the round it is about (-1 before any round).
        detail: the core's short detail text, as logged.
        at_s: when, in seconds on the node's monotonic clock.
    """

    kind: ClassVar[str] = "event"
    level: ClassVar[int] = logging.INFO
    node: str
    round: int
    detail: str = ""
    at_s: float = 0.0

    def describe(self) -> str:
        return f"{self.node}: {self.kind} round {self.round}" + (
            f" ({self.detail})" if self.detail else ""
        )

    def severity(self) -> int:
        """The ``logging`` level this event is logged at (``level`` unless it depends on fields)."""
        return self.level


@attrs.frozen(kw_only=True)
class RunCreated(Event):
    """This node wrote the run's manifest and initial parameters."""

    kind: ClassVar[str] = "run_created"


@attrs.frozen(kw_only=True)
class RunAdopted(Event):
    """The run existed; this node's config and schema match it."""

    kind: ClassVar[str] = "run_adopted"


@attrs.frozen(kw_only=True)
class Joined(Event):
    """The learner loaded the committed parameters and starts training."""

    kind: ClassVar[str] = "joined"


@attrs.frozen(kw_only=True)
class Published(Event):
    """This learner's snapshot of ``round`` is in the bucket.

    Attributes:
        steps: local steps the snapshot carries (since its fragment's anchor).
    """

    kind: ClassVar[str] = "published"
    steps: int = 0


@attrs.frozen(kw_only=True)
class PublishFailed(Event):
    """This learner gave the round up: its snapshot could not be written."""

    kind: ClassVar[str] = "publish_failed"
    level: ClassVar[int] = logging.WARNING


@attrs.frozen(kw_only=True)
class Aligned(Event):
    """This learner folded the commit of ``round`` into its model.

    Attributes:
        version: the fragment's version after that commit.
    """

    kind: ClassVar[str] = "aligned"
    version: int = 0


@attrs.frozen(kw_only=True)
class AlignmentChanged(Event):
    """Under ``adaptive`` alignment, a fragment changed mode at the commit of ``round``: its
    recorded cosine crossed a threshold.

    Attributes:
        fragment: the fragment.
        mode: ``carry`` or ``overwrite``, what its commits do from this one on.
    """

    kind: ClassVar[str] = "alignment_changed"
    fragment: int = 0
    mode: str = ""


@attrs.frozen(kw_only=True)
class Following(Event):
    """With ``follow`` set, the leader had accepted that many other learners' snapshots of
    ``round`` before this learner reached it: this learner publishes it at its next step.

    Attributes:
        accepted: the snapshots the leader had accepted.
    """

    kind: ClassVar[str] = "following"
    accepted: int = 0


@attrs.frozen(kw_only=True)
class AlignFailed(Event):
    """A commit could not be folded in; the learner re-joins from the newest commit."""

    kind: ClassVar[str] = "align_failed"
    level: ClassVar[int] = logging.WARNING


@attrs.frozen(kw_only=True)
class Diverged(Event):
    """A commit rejected this learner's delta as non-finite; the learner reloaded every
    fragment from the newest commit.

    The inner optimizer's state may hold the NaN too: pass ``Session(on_diverged=...)``
    to reset it; ``step()`` raises :class:`gm_shell.DivergedError` once it repeats.

    Attributes:
        times: commits in a row that rejected this learner's delta as non-finite.
    """

    kind: ClassVar[str] = "diverged"
    level: ClassVar[int] = logging.WARNING
    times: int = 0


@attrs.frozen(kw_only=True)
class Committed(Event):
    """This node's closer wrote the round's record (the commit point).

    Attributes:
        version: the fragment's new version.
        participants: accepted snapshots merged into it.
    """

    kind: ClassVar[str] = "committed"
    version: int = 0
    participants: int = 0


@attrs.frozen(kw_only=True)
class Superseded(Event):
    """Another closer's record won this round; this node adopted it (INFO: the protocol's
    answer to a takeover race, nothing to act on).

    Attributes:
        by: the node whose record won.
    """

    kind: ClassVar[str] = "superseded"
    by: str = ""


@attrs.frozen(kw_only=True)
class TookOver(Event):
    """This node claimed a round from a closer that went silent or left (INFO: the run
    goes on; ``gm status`` counts takeovers, and frequent ones are worth a look).

    Attributes:
        claim: the number of the claim it won (1 for the first bid).
    """

    kind: ClassVar[str] = "took_over"
    claim: int = 0


@attrs.frozen(kw_only=True)
class Rejected(Event):
    """A snapshot was not accepted into the round, and why (recorded in the round record).

    Attributes:
        learner: the learner whose snapshot it was.
        reason: why (``None`` if this shell does not know the reason's name).
    """

    kind: ClassVar[str] = "rejected"
    level: ClassVar[int] = logging.WARNING
    learner: str = ""
    reason: Reason | None = None

    def severity(self) -> int:
        """WARNING when someone can act on it (a wrong model, NaNs, garbage, a bad key).

        ``zero_steps``, ``stale`` and ``missing`` follow from timing (a commit that
        lagged, a learner that fell behind, a payload swept or not yet readable); one
        of them is nothing to act on, so it is logged at INFO. A config that makes them
        routine is warned about once, when the run is created (:mod:`gm_core.advice`).
        """
        return logging.WARNING if self.reason in ACTIONABLE else logging.INFO


@attrs.frozen(kw_only=True)
class RecordRejected(Event):
    """An object at a round record's key could not be used (hostile or newer writer)."""

    kind: ClassVar[str] = "record_rejected"
    level: ClassVar[int] = logging.WARNING


@attrs.frozen(kw_only=True)
class Fork(Event):
    """An authenticated record that does not name the record this node holds as its
    predecessor: two tapes exist (an overwritten record, or a key holder's misbehaviour).
    Nodes stop there instead of choosing a side; operator action (spec/protocol.md §16.5.3)."""

    kind: ClassVar[str] = "fork"
    level: ClassVar[int] = logging.ERROR


@attrs.frozen(kw_only=True)
class SlotsExhausted(Event):
    """Every slot of a round's record key holds an object this node cannot use: the run
    cannot commit that round until an operator removes them (spec/protocol.md §16.4.3)."""

    kind: ClassVar[str] = "slots_exhausted"
    level: ClassVar[int] = logging.ERROR


@attrs.frozen(kw_only=True)
class SnapshotSlotSkipped(Event):
    """This learner found an object that is not its snapshot at its snapshot key's slot
    (garbage, a forgery, another run's object) and writes the next slot instead
    (spec/protocol.md §16.4); nothing is lost, the detail says what was there."""

    kind: ClassVar[str] = "snapshot_slot_skipped"
    level: ClassVar[int] = logging.WARNING


@attrs.frozen(kw_only=True)
class SnapshotMalformed(Event):
    """A snapshot object is not a snapshot of its key (it does not decode, or names another
    learner or round): skipped, and the learner's next slot read; if none comes before the
    round closes, the learner is rejected ``corrupt``."""

    kind: ClassVar[str] = "snapshot_malformed"
    level: ClassVar[int] = logging.WARNING


@attrs.frozen(kw_only=True)
class SnapshotUnauthenticated(Event):
    """A snapshot object without a valid tag of the run key: skipped, and the learner's next
    slot read; if none comes before the round closes, the learner is rejected
    ``unauthenticated``. The detail says why (untagged, wrong key id, bad tag...)."""

    kind: ClassVar[str] = "snapshot_unauthenticated"
    level: ClassVar[int] = logging.WARNING


@attrs.frozen(kw_only=True)
class ClaimRejected(Event):
    """A takeover claim object could not be read."""

    kind: ClassVar[str] = "claim_rejected"
    level: ClassVar[int] = logging.WARNING


@attrs.frozen(kw_only=True)
class BadKey(Event):
    """A key in a snapshot folder that no learner could have written."""

    kind: ClassVar[str] = "bad_key"
    level: ClassVar[int] = logging.WARNING


@attrs.frozen(kw_only=True)
class LeaseFailed(Event):
    """Renewing this node's lease failed; others may soon judge it dead."""

    kind: ClassVar[str] = "lease_failed"
    level: ClassVar[int] = logging.WARNING


@attrs.frozen(kw_only=True)
class LeaseRefused(Event):
    """In an authenticated run, a node's lease changed to something that is no renewal: not
    tagged with the run key, malformed, another node's, or an older lease replayed. It
    keeps nobody alive (spec/protocol.md §16.6); the detail names the node and why."""

    kind: ClassVar[str] = "lease_refused"
    level: ClassVar[int] = logging.WARNING


@attrs.frozen(kw_only=True)
class MergeFailed(Event):
    """The closer's merge failed; it merges again after a poll interval."""

    kind: ClassVar[str] = "merge_failed"
    level: ClassVar[int] = logging.WARNING


@attrs.frozen(kw_only=True)
class CommitUnusable(Event):
    """A committed payload is missing or fails its digest (spec/protocol.md §16.10): this
    node uses the fragment's commit before it instead (a closer merges into it, a learner
    keeps it, a joiner loads it). The detail names the object and why."""

    kind: ClassVar[str] = "commit_unusable"
    level: ClassVar[int] = logging.WARNING


@attrs.frozen(kw_only=True)
class CommitLost(Event):
    """No usable commit of a fragment is left (the one before the unusable one is unusable
    or gone too): nothing more commits on it until the object is restored. Said once."""

    kind: ClassVar[str] = "commit_lost"
    level: ClassVar[int] = logging.ERROR


@attrs.frozen(kw_only=True)
class Closed(Event):
    """The learner finished closing and released its lease."""

    kind: ClassVar[str] = "closed"


@attrs.frozen(kw_only=True)
class Elected(Event):
    """The run elected this ``either`` node its closer: it leads a round while another
    learner is live and no dedicated closer is. It stops training after its unit."""

    kind: ClassVar[str] = "elected"


@attrs.frozen(kw_only=True)
class Relieved(Event):
    """This elected ``either`` node serves no more: another closer's record took the lead
    (it took a round over from this node, or this node named a dedicated closer, which
    committed), or no other learner is live. It trains again (a fresh learner joins from
    the newest commit and claims units), so that only a leader stops training."""

    kind: ClassVar[str] = "relieved"


@attrs.frozen(kw_only=True)
class CloserStopped(Event):
    """This node's closer stopped (the session is closing)."""

    kind: ClassVar[str] = "closer_stopped"


@attrs.frozen(kw_only=True)
class Refused(Event):
    """An object in the bucket was refused unread: bigger than its kind can be.

    A JSON object over its cap (:mod:`gm_shell.limits`) then reads as an object that
    does not decode (``record_rejected``, a snapshot rejected ``corrupt``, a claim that
    names nobody, no head hint); a payload bigger than its fragment can be, or than its
    reference says, is ``corrupt``. Reported once per object (key and ETag): the same
    object is never downloaded again.

    Attributes:
        key: the object's key, relative to the run prefix.
        size: the object's size in bytes, as the store reported it (or the size the
            reference declared, for a payload refused before any request).
        limit: the most bytes its reader accepts.
    """

    kind: ClassVar[str] = "refused"
    level: ClassVar[int] = logging.WARNING
    key: str = ""
    size: int = 0
    limit: int = 0


@attrs.frozen(kw_only=True)
class ListingCut(Event):
    """A listing held more keys than a node reads of one (:data:`gm_shell.limits.MAX_LISTED_KEYS`).

    The node went on with the first ``limit`` keys; the rest of the folder was not looked
    at. Someone flooded it, or the run outgrew the cap. Reported once per prefix.

    Attributes:
        prefix: the listed prefix, relative to the run prefix.
        limit: the most keys the node reads of one listing.
    """

    kind: ClassVar[str] = "listing_cut"
    level: ClassVar[int] = logging.WARNING
    prefix: str = ""
    limit: int = 0


@attrs.frozen(kw_only=True)
class MachineRestarted(Event):
    """A machine of this node raised; it alone starts again from the tape after a backoff.

    The other machine of the node goes on; a restarted learner stalls training until it
    has joined again. The detail names the exception; the log has its traceback.

    Attributes:
        machine: ``closer`` (or ``learner``).
        times: how often this machine of this node has restarted so far.
    """

    kind: ClassVar[str] = "machine_restarted"
    level: ClassVar[int] = logging.WARNING
    machine: str = ""
    times: int = 0


@attrs.frozen(kw_only=True)
class MemberLearned(Event):
    """The run authority's word on a member, learned from ``members/`` (protocol §16.3.3):
    a node admitted by a certificate, or revoked from a round. The detail says which.

    Attributes:
        member: the node it is about.
        revoked: whether it is a revocation (else an admission).
    """

    kind: ClassVar[str] = "member_learned"
    member: str = ""
    revoked: bool = False

    def severity(self) -> int:
        return logging.WARNING if self.revoked else logging.INFO


@attrs.frozen(kw_only=True)
class MemberRefused(Event):
    """An object under ``members/`` that is not the authority's word (no valid tag, not
    its signature, not a certificate or revocation of the node its key names), or a
    certificate that cannot count (one admitting a closer). Reported once per object.

    Attributes:
        key: the object's key, relative to the run prefix.
    """

    kind: ClassVar[str] = "member_refused"
    level: ClassVar[int] = logging.WARNING
    key: str = ""


@attrs.frozen(kw_only=True)
class Other(Event):
    """A notification this version of the shell has no class for.

    Attributes:
        name: its kind, as the core sent it.
    """

    name: str = ""


_PLAIN: dict[str, type[Event]] = {
    cls.kind: cls
    for cls in (
        Joined,
        PublishFailed,
        AlignFailed,
        RecordRejected,
        Fork,
        SlotsExhausted,
        SnapshotSlotSkipped,
        SnapshotMalformed,
        SnapshotUnauthenticated,
        ClaimRejected,
        BadKey,
        LeaseFailed,
        LeaseRefused,
        MergeFailed,
        CommitUnusable,
        CommitLost,
        Closed,
        Elected,
        Relieved,
        CloserStopped,
    )
}
_NUMBER = re.compile(r"(\w+)=(-?\d+)")


def _numbers(detail: str) -> dict[str, int]:
    return {k: int(v) for k, v in _NUMBER.findall(detail)}


def from_notify(note: Notify, node: str, at_s: float) -> Event:
    """The typed event for one of the core's notifications."""
    numbers = _numbers(note.detail)

    def make(cls: type[E], **extra: object) -> E:
        return cls(node=node, round=note.round, detail=note.detail, at_s=at_s, **extra)

    if note.kind in _PLAIN:
        return make(_PLAIN[note.kind])
    if note.kind == "rejected":
        learner, _, reason = note.detail.partition(": ")
        known = reason in {r.value for r in Reason}
        return make(Rejected, learner=learner, reason=Reason(reason) if known else None)
    if note.kind == "committed":
        return make(
            Committed,
            version=numbers.get("version", 0),
            participants=numbers.get("participants", 0),
        )
    if note.kind == "published":
        return make(Published, steps=numbers.get("steps", 0))
    if note.kind == "diverged":
        return make(Diverged, times=numbers.get("times", 0))
    if note.kind == "aligned":
        return make(Aligned, version=numbers.get("version", 0))
    if note.kind == "alignment_changed":
        mode = note.detail.split(" ")[1] if note.detail.count(" ") >= 1 else ""
        return make(AlignmentChanged, fragment=numbers.get("fragment", 0), mode=mode)
    if note.kind == "following":
        return make(Following, accepted=numbers.get("accepted", 0))
    if note.kind == "took_over":
        return make(TookOver, claim=numbers.get("claim", 0))
    if note.kind == "superseded":
        return make(Superseded, by=note.detail.removeprefix("by "))
    return make(Other, name=note.kind)


Callback = Callable[[Event], None]
"""A function called with every event, on the session's event thread."""

_STOP = object()


class EventHub:
    """Hands events from the loop to callbacks and logging on a thread of its own."""

    def __init__(
        self, callbacks: Sequence[Callback] = (), *, capacity: int = 1024, recent: int = 512
    ) -> None:
        self._callbacks = list(callbacks)
        self._queue: queue.Queue[object] = queue.Queue(maxsize=capacity)
        self.recent: deque[Event] = deque(maxlen=recent)
        self.dropped = 0
        self._thread = threading.Thread(target=self._dispatch, name="gm-events", daemon=True)
        self._thread.start()

    def subscribe(self, callback: Callback) -> None:
        self._callbacks.append(callback)

    def emit(self, event: Event) -> None:
        """Never blocks: a full queue drops the event and counts it."""
        self.recent.append(event)
        try:
            self._queue.put_nowait(event)
        except queue.Full:
            self.dropped += 1

    def close(self, timeout_s: float = 5.0) -> None:
        """Deliver what is queued (bounded by ``timeout_s``), then stop the dispatcher."""
        try:
            self._queue.put(_STOP, timeout=timeout_s)
        except queue.Full:
            return
        self._thread.join(timeout_s)

    def _dispatch(self) -> None:
        while True:
            event = self._queue.get()
            if event is _STOP:
                return
            assert isinstance(event, Event)
            LOG.log(event.severity(), "%s", event.describe())
            for callback in list(self._callbacks):
                try:
                    callback(event)
                except Exception:
                    LOG.exception("gm event callback %r failed on %s", callback, event.kind)
