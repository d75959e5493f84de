"""Reading the tape: the round records, found by probing one expected key at a time.

Theory of operation
-------------------
Round records are written create-once and strictly in order (a closer writes
round ``r`` only after it holds record ``r - 1``), so the set of records is
always a prefix ``0..n-1`` of the rounds. A reader therefore never lists: it
GETs the one key it expects next, and a miss means "not yet". Joining starts
from ``head.json``, a hint of the newest round that the closer overwrites after
each commit; the hint may lag but never leads, so probing forward from it finds
the newest record in O(1) requests in the common case.

These helpers are shared by the learner and the closer; they only decode and
check, they hold no state.

Slots (spec/protocol.md §16.4). A round's record key is a family of
:data:`SLOTS` create-once slots: slot 0 at ``rounds/{r}.json``, slot ``s`` at a
name only the run's nodes can compute (a keyed hash, :meth:`Envelope.slot_name`).
The record of a round is the object at its lowest *valid* slot. Readers probe
slots in order: a valid object is the record, an absent slot means "not yet",
an invalid one (unauthenticated, undecodable, implausible, another round's) is
skipped. Writers write at the lowest slot they have not read an invalid object
at. Since objects at create-once keys never change, every honest reader judges
every slot alike and all adopt the same record, whatever lies in lower slots;
so garbage at a round's key costs each node a GET, and no longer halts the run.
Only an object a reader must not skip stops the probe: a record of a newer
format (a newer gm's record, which an older node cannot judge) — skipping it
would fork the tape between versions. A node that finds all :data:`SLOTS`
invalid reports the key exhausted (operator action).

Plausibility. A record's round fixes much of what it may say: its fragment and
step follow from the schedule, a fragment's version counts its commits so far,
the sweep mark trails the round, and estimates are durations the timing rules
accept (:data:`gm_core.timing.MAX_ESTIMATE_S`). A record that
breaks one of these was not written by a correct closer of this run's config;
it is refused by name like an undecodable one, so no forged number (a version
at 2^63 - 1, a round at the end of the key space) reaches the arithmetic of the
machines that follow the tape. (Authenticating the writer is a separate check.)

The chain (spec/protocol.md §16.5; runs whose manifest is ``chained``). Every record
names, as ``prev``, the :func:`chain_digest` of the record before it (of the manifest,
for round 0). A node that holds record ``r - 1`` adopts a record of round ``r`` only if
it names that one: a record that does not chain (another run's, an old copy put back,
one written on top of a record that was since overwritten) is invalid at its slot like
any other. A node that holds no predecessor (it is joining) takes the record on its own
merits, and checks the chain from there on.
"""

from __future__ import annotations

import functools
import hashlib

import attrs

from gm_core import codec, keys, schedule, timing
from gm_core.auth import Envelope, Unauthenticated, Why
from gm_core.records import (
    FORMATS,
    AlgorithmConfig,
    FragmentState,
    Head,
    Manifest,
    RoundRecord,
)
from gm_core.slots import SLOTS

LAST_ROUND = keys.ROUND_LIMIT // 2 - 1
"""The last round a record or head hint may name: half the key space (16,000 years at a
round a second), so every round a node derives from a plausible one (the next, a flush
of every fragment) still has a key."""


_ROUND_KIND = "round"


@attrs.frozen(kw_only=True)
class BadRecord:
    """A record object that exists but cannot be used (hostile or newer writer)."""

    round: int
    reason: str
    slot: int = 0
    newer: bool = False
    """A newer format's record: it stops the probe instead of being skipped."""
    fork: bool = False
    """An authenticated record that does not chain to the one the node holds: a key
    holder's misbehaviour or an overwrite (§16.5.3); it stops the probe too."""

    @property
    def stops(self) -> bool:
        """Whether the probe stops here instead of skipping to the slot above: skipping a
        newer writer's record or one side of a fork would split the tape between readers."""
        return self.newer or self.fork


@attrs.frozen
class SlotCursor:
    """The first slot of one round's record key that a node has not judged invalid."""

    round: int = -1
    slot: int = 0


def slot_of(cursor: SlotCursor, round_: int) -> int:
    """The slot of round ``round_`` to read (or write) next."""
    return cursor.slot if cursor.round == round_ else 0


def skip(cursor: SlotCursor, bad: BadRecord) -> SlotCursor:
    """The cursor after ``bad`` was judged invalid: on to the slot above it."""
    return SlotCursor(bad.round, max(slot_of(cursor, bad.round), bad.slot + 1))


def exhausted(cursor: SlotCursor, round_: int) -> bool:
    """Whether every slot of round ``round_``'s key holds an invalid object."""
    return slot_of(cursor, round_) >= SLOTS


def after(cursor: SlotCursor, parsed: RoundRecord | BadRecord) -> SlotCursor | None:
    """Where a probe of ``parsed``'s round reads next; None when ``parsed`` ends it (it is
    the round's record, a newer format's, or the last slot's invalid object)."""
    if isinstance(parsed, RoundRecord) or parsed.stops:
        return None
    cursor = skip(cursor, parsed)
    return None if exhausted(cursor, parsed.round) else cursor


def rejected(bad: BadRecord) -> str:
    """The notice a node gives for ``bad``: ``fork`` (an authenticated record that does not
    chain: operator action) or ``record_rejected``."""
    return "fork" if bad.fork else "record_rejected"


def record_key(envelope: Envelope, round_: int, slot: int) -> str:
    """The key of slot ``slot`` of round ``round_``'s record."""
    if slot == 0:
        return keys.round_record(round_)
    return keys.round_record(round_, envelope.slot_name(_ROUND_KIND, f"{round_:012d}", slot))


def chain_digest(value: RoundRecord | Manifest) -> str:
    """The digest a chained run's next record names as ``prev``: SHA-256 of the canonical
    encoding, so every reader of one record computes it alike, whatever bytes carried it."""
    return hashlib.sha256(codec.encode(value)).hexdigest()


def expected_prev(manifest: Manifest, held: RoundRecord | None, round_: int) -> str | None:
    """What a record of ``round_`` must name as ``prev`` for a node holding ``held`` (its
    newest record); None when nothing is checked: the run is not chained, or the node
    holds no record of the round before (it is joining)."""
    if not manifest.chained:
        return None
    if round_ == 0:
        return chain_digest(manifest)
    if held is not None and held.round == round_ - 1:
        return chain_digest(held)
    return None


def parse_record(
    envelope: Envelope,
    data: bytes,
    expected_round: int,
    config: AlgorithmConfig,
    slot: int = 0,
    prev: str | None = None,
) -> RoundRecord | BadRecord:
    """Open and decode the object at slot ``slot`` of round ``expected_round``, or say why
    it is unusable; with ``prev`` (:func:`expected_prev`), also when it does not chain."""
    bad = functools.partial(BadRecord, round=expected_round, slot=slot)
    body = envelope.open(record_key(envelope, expected_round, slot), data)
    if isinstance(body, Unauthenticated):
        newer = body.why is Why.NEWER_FORMAT  # authentic: skipping it would fork versions
        return bad(reason=f"unauthenticated ({body.why}): {body.detail}", newer=newer)
    try:
        record = codec.decode(RoundRecord, body)
    except codec.CodecError as error:
        declared = codec.declared_format(body)
        return bad(reason=str(error), newer=declared is not None and declared > max(FORMATS))
    if record.round != expected_round:
        return bad(reason=f"record names round {record.round}, not its key's round")
    impostor = envelope.not_signed_by(data, record.closer)
    if impostor is not None:
        return bad(reason=f"unauthenticated ({Why.NOT_ALLOWED}): {impostor}")
    reason = implausible(record, config)
    if reason is None and prev is not None and record.prev != prev:
        named = "nothing" if record.prev is None else record.prev[:16]
        if envelope.auth is not None:  # only a key holder could write it
            return bad(
                reason=f"fork: it names {named} as its predecessor, not {prev[:16]}", fork=True
            )
        reason = f"does not chain: it names {named} as its predecessor, not {prev[:16]}"
    return record if reason is None else bad(reason=reason)


def implausible(record: RoundRecord, config: AlgorithmConfig) -> str | None:
    """Why no correct closer of a run with ``config`` wrote ``record`` (None: one could have)."""
    r, fragments = record.round, config.fragments
    if r > LAST_ROUND:
        return f"round {r} is past the last round {LAST_ROUND}"
    if record.fragment != schedule.fragment_of(r, fragments):
        return f"fragment {record.fragment} is not round {r}'s"
    if record.step != schedule.step_of(r, config.sync_every, fragments):
        return f"step {record.step} is not round {r}'s"
    if len(record.frontier) != fragments:
        return f"frontier has {len(record.frontier)} fragments, the run {fragments}"
    for f, fs in enumerate(record.frontier):
        commits = (r - f) // fragments + 1 if r >= f else 0
        if fs.version > commits:
            return f"fragment {f} is at version {fs.version} after {commits} rounds of it"
    refs = [ref for fs in record.frontier for ref in (fs.theta, fs.momentum) if ref is not None]
    if any(keys.round_of_payload_key(ref.key) > r for ref in refs):
        return f"the frontier names a payload written after round {r}"
    if record.swept_below > r:
        return f"swept_below {record.swept_below} is past round {r}"
    estimates = (record.quorum_s, record.grace_s, *attrs.astuple(record.timing))
    if any(not (x is None or 0.0 <= x <= timing.MAX_ESTIMATE_S) for x in estimates):
        return f"a timing is not in [0, {timing.MAX_ESTIMATE_S:g}] s"
    return None


def parse_head(envelope: Envelope, data: bytes | None) -> int:
    """The round a head hint names, or -1 when there is no usable hint (start at round 0).

    An unauthenticated head is no hint: the tape itself is probed from its start.
    """
    body = None if data is None else envelope.open(keys.head(), data)
    if body is None or isinstance(body, Unauthenticated):
        return -1
    try:
        hint = codec.decode(Head, body).round
    except codec.CodecError:
        return -1
    return hint if hint <= LAST_ROUND else -1


def frontier_of(manifest: Manifest, record: RoundRecord | None) -> tuple[FragmentState, ...]:
    """The committed state of every fragment after ``record`` (the manifest's before round 0)."""
    return manifest.init if record is None else record.frontier
