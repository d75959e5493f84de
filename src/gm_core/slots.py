"""Slots of a learner's snapshot key: garbage at it no longer silences the learner.

Theory of operation
-------------------
A create-once key that anyone with write access can fill first is a key an
attacker (or a confused older node) can occupy before its owner: in format 1 an
object at ``snapshots/{r}/{learner}.json`` made that learner give round ``r``
up. So, like a round's record key (:mod:`gm_core.tape`), a snapshot key is a
family of :data:`SLOTS` create-once slots (spec/protocol.md §16.4): slot 0 at
format 1's key, slot ``s`` at ``snapshots/{r}/{learner}/{name}.json`` with a name
only the run's nodes can compute in an authenticated run
(:meth:`Envelope.slot_name`). A learner's snapshot of a round is the object at
the lowest *valid* slot: authenticated, a snapshot, and naming that learner and
round. The learner writes at the lowest slot it has not read an invalid object
at; the leading closer judges a learner's slots in order and moves past an
invalid one only to the next slot, once a listing shows it.

Validity is the part of judging that is about the object's *place*, so it is
the same for every honest reader and never depends on the round's state: a
forged or garbled object is skipped. Everything else (a stale base, another
schema, no steps) judges the learner's own snapshot and stands as the verdict.
"""

from __future__ import annotations

import attrs

from gm_core import codec, keys
from gm_core.auth import Envelope, Unauthenticated
from gm_core.records import Reason, Snapshot

SLOTS = 16
"""Slots per create-once key: the most invalid objects a reader skips before the owner's
object, and so the most GETs garbage can cost a node per key (protocol §16.4.3)."""

_SNAPSHOT_KIND = "snapshot"


@attrs.frozen(kw_only=True)
class Invalid:
    """Why the object at a snapshot slot is not the learner's (it is skipped)."""

    reason: Reason
    """``UNAUTHENTICATED``, or ``CORRUPT`` for one that is not a snapshot of its key."""
    kind: str
    """The event that reports it: ``snapshot_unauthenticated`` or ``snapshot_malformed``."""
    detail: str


def _subject(round_: int, learner: str) -> str:
    return f"{round_:012d}/{learner}"


def snapshot_key(envelope: Envelope, round_: int, learner: str, slot: int) -> str:
    """The key of slot ``slot`` of ``learner``'s snapshot of round ``round_``."""
    if slot == 0:
        return keys.snapshot(round_, learner)
    name = envelope.slot_name(_SNAPSHOT_KIND, _subject(round_, learner), slot)
    return keys.snapshot(round_, learner, name)


def snapshot_slot(envelope: Envelope, key: keys.SnapshotKey) -> int | None:
    """The slot a listed snapshot key stands for; None for a name no slot has (foreign)."""
    if key.name is None:
        return 0
    subject = _subject(key.round, key.learner)
    for slot in range(1, SLOTS):
        if envelope.slot_name(_SNAPSHOT_KIND, subject, slot) == key.name:
            return slot
    return None


def open_snapshot(
    envelope: Envelope, round_: int, learner: str, slot: int, data: bytes
) -> Snapshot | Invalid:
    """The snapshot at slot ``slot`` of ``learner``'s key for ``round_``, or why it is invalid."""
    key = snapshot_key(envelope, round_, learner, slot)
    body = envelope.open(key, data)
    if isinstance(body, Unauthenticated):
        why = f"{learner} slot {slot}: {body.why}: {body.detail}"
        return Invalid(reason=Reason.UNAUTHENTICATED, kind="snapshot_unauthenticated", detail=why)
    try:
        snapshot = codec.decode(Snapshot, body)
    except codec.CodecError as error:
        detail = f"{learner} slot {slot}: {error}"
        return Invalid(reason=Reason.CORRUPT, kind="snapshot_malformed", detail=detail)
    if snapshot.learner != learner or snapshot.round != round_:
        detail = f"{learner} slot {slot}: names {snapshot.learner} in round {snapshot.round}"
        return Invalid(reason=Reason.CORRUPT, kind="snapshot_malformed", detail=detail)
    return snapshot
