"""The bucket layout: every object key gm reads or writes, built and parsed in one place.

Theory of operation
-------------------
Keys are relative to the run prefix (the mailbox prepends it)::

    manifest.json                              the run's birth certificate
    head.json                                  hint of the newest committed round
    rounds/{round:012d}.json                   the tape: round's record, slot 0
    rounds/{round:012d}.{name}.json            the same round's slots 1..15 (protocol §16.4)
    snapshots/{round:012d}/{learner}.json      a learner's contribution to a round, slot 0
    snapshots/{round:012d}/{learner}/{name}.json   the same contribution's slots 1..15
    payloads/{round:012d}/{digest}.st          tensor bytes, named by their content hash
    leases/{node}.json                         a node's liveness token
    claims/{round:012d}/{attempt:04d}.json     create-once takeover bids for a round
    claims/{round:012d}/{name}.json            the same, in an authenticated run (§16.4.4)
    nodes/{node}/resume.bin                    a node's own training state (opt-in resume)
    barriers/{name}/{gen:012d}/parties/{party}.json  a party's create-once arrival at a barrier
    barriers/{name}/{gen:012d}/released.json   create-once verdict on a barrier's generation
    queue/{q}/units.json                       create-once: which units queue q holds
    queue/{q}/units/{unit}/claims/{attempt:04d}.json  create-once claim of a unit
    queue/{q}/units/{unit}/done/{attempt:04d}.json    create-once: that attempt finished the unit
    done/{node}.json                           create-once: the node's own data ran out
    finished.json                              create-once: the run is finished (its summary)
    follow/{round:012d}.json                   create-once: enough learners published the round
    members/{node}/{name}.json                 create-once slots: the run authority's certificate
                                               or revocation of a node (protocol §16.3.3)

Numbers are zero-padded to a fixed width so that the byte order of keys, which is
what every object store lists in, equals numeric order: the newest round is the last
key of ``rounds/``, and the claims of a round list in attempt order. Round numbers are
therefore bounded by ``ROUND_LIMIT`` and claim attempts by ``ATTEMPT_LIMIT``.

Ids (learners, nodes) become path segments, so they are restricted to a safe
alphabet (:func:`valid_id`): nothing that a store, a file system or a URL would
interpret (no slashes, no ``..``, no leading dot or dash, no unicode look-alikes).

Building is for our own code, so a bad argument is caller misuse and raises
``ValueError`` (or ``TypeError`` for a non-integer). Parsing is for keys that came
from a listing, which peers and operators can fill with anything, so :func:`parse`
accepts exactly the strings the builders produce and raises :class:`BadKey` for
everything else: ``build(parse(k)) == k`` for every key that parses.
"""

from __future__ import annotations

import re
from typing import assert_never

import attrs

ROUND_LIMIT = 10**12
"""Rounds are ``0 <= round < ROUND_LIMIT`` (12 decimal digits in keys)."""

ATTEMPT_LIMIT = 10**4
"""Claim attempts are ``0 <= attempt < ATTEMPT_LIMIT`` (4 decimal digits in keys)."""

ID_MAX_CHARS = 64
"""Longest id that :func:`valid_id` accepts."""

DIGEST_HEX_CHARS = 64
"""Payload digests are this many lowercase hex characters (256 bits)."""

MANIFEST = "manifest.json"
HEAD = "head.json"
ROUNDS_PREFIX = "rounds/"
SNAPSHOTS_PREFIX = "snapshots/"
PAYLOADS_PREFIX = "payloads/"
LEASES_PREFIX = "leases/"
CLAIMS_PREFIX = "claims/"
NODES_PREFIX = "nodes/"
RESUME_NAME = "resume.bin"
BARRIERS_PREFIX = "barriers/"
BARRIER_PARTIES = "parties"
BARRIER_MARKER = "released.json"
_BARRIER_MARKER_DIR = "released"  # a keyed marker: released/{tag}.json
QUEUE_PREFIX = "queue/"
QUEUE_UNITS = "units"
QUEUE_CLAIMS = "claims"
QUEUE_DONE = "done"
DONE_PREFIX = "done/"
FOLLOW_PREFIX = "follow/"
MEMBERS_PREFIX = "members/"
FINISHED = "finished.json"

_ROUND_WIDTH = 12
_ATTEMPT_WIDTH = 4
_JSON = ".json"
_PAYLOAD_SUFFIX = ".st"

# Explicit ASCII ranges (never \w or \d, which match unicode letters and digits);
# used with fullmatch only, since ``$`` would also match before a trailing newline.
_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
_DIGEST_RE = re.compile(r"[0-9a-f]{64}")
_SLOT_NAME_RE = re.compile(r"[0-9a-f]{16}")

SLOT_NAME_CHARS = 16
"""A slot above 0 (of a record or snapshot key) is named by this many lowercase hex characters
(a keyed hash)."""


class BadKey(ValueError):  # noqa: N818 (the protocol names it BadKey)
    """A key that is not exactly one the builders produce; ``reason`` says why."""

    def __init__(self, key: str, reason: str) -> None:
        super().__init__(f"bad key {key!r}: {reason}")
        self.key = key
        self.reason = reason

    def __reduce__(self) -> tuple[type[BadKey], tuple[str, str]]:
        # ValueError pickles its args (the message); rebuild from the fields instead,
        # so the error survives crossing a process boundary.
        return (BadKey, (self.key, self.reason))


def valid_id(s: str) -> bool:
    """Whether ``s`` is safe as a learner or node id, and hence as a key segment.

    1 to 64 characters of ``[A-Za-z0-9._-]``, starting with a letter or digit, and no
    ``..`` anywhere: an id never reads as a path step, a hidden file or an option.
    """
    return (
        isinstance(s, str)
        and len(s) <= ID_MAX_CHARS
        and _ID_RE.fullmatch(s) is not None
        and ".." not in s
    )


def valid_digest(s: str) -> bool:
    """Whether ``s`` is a payload digest as keys spell it: 64 lowercase hex characters."""
    return isinstance(s, str) and _DIGEST_RE.fullmatch(s) is not None


# --- parsed keys -------------------------------------------------------------------


@attrs.frozen
class ManifestKey:
    """``manifest.json`` (slot 0), or ``manifest.{slot:02d}.json`` (slots 1 to 15: what a
    creator writes above objects it cannot use, spec/protocol.md §16.4.1)."""

    slot: int = 0


@attrs.frozen
class HeadKey:
    """``head.json``."""


@attrs.frozen
class RoundKey:
    """``rounds/{round}.json`` (slot 0, ``name`` None) or ``rounds/{round}.{name}.json``."""

    round: int
    name: str | None = None


@attrs.frozen
class SnapshotKey:
    """``snapshots/{round}/{learner}.json`` (slot 0, ``name`` None) or
    ``snapshots/{round}/{learner}/{name}.json``."""

    round: int
    learner: str
    name: str | None = None


@attrs.frozen
class PayloadKey:
    """``payloads/{round}/{digest}.st``."""

    round: int
    digest: str


@attrs.frozen
class LeaseKey:
    """``leases/{node}.json``."""

    node: str


@attrs.frozen
class ClaimKey:
    """``claims/{round}/{attempt}.json``, or ``claims/{round}/{name}.json`` in an authenticated
    run (``attempt`` None: which attempt a name stands for only the run's nodes can compute)."""

    round: int
    attempt: int | None
    name: str | None = None


@attrs.frozen
class ResumeKey:
    """``nodes/{node}/resume.bin``."""

    node: str


@attrs.frozen
class BarrierArrivalKey:
    """``barriers/{name}/{generation}/parties/{party}.json``, or ``.../{party}/{tag}.json``
    in an authenticated run (a keyed name only the run's nodes can compute)."""

    name: str
    generation: int
    party: str
    tag: str | None = None


@attrs.frozen
class BarrierMarkerKey:
    """``barriers/{name}/{generation}/released.json``, or ``.../released/{tag}.json`` in an
    authenticated run."""

    name: str
    generation: int
    tag: str | None = None


@attrs.frozen
class QueueUnitsKey:
    """``queue/{queue}/units.json``."""

    queue: str


@attrs.frozen
class QueueClaimKey:
    """``queue/{queue}/units/{unit}/claims/{attempt}.json``."""

    queue: str
    unit: str
    attempt: int


@attrs.frozen
class QueueDoneKey:
    """``queue/{queue}/units/{unit}/done/{attempt}.json``."""

    queue: str
    unit: str
    attempt: int


@attrs.frozen
class DoneKey:
    """``done/{node}.json``."""

    node: str


@attrs.frozen
class FinishedKey:
    """``finished.json``."""


@attrs.frozen
class FollowKey:
    """``follow/{round}.json``."""

    round: int


@attrs.frozen
class MemberKey:
    """``members/{node}/{name}.json``: one slot of the authority's word on ``node``."""

    node: str
    name: str


ParsedKey = (
    ManifestKey
    | HeadKey
    | RoundKey
    | SnapshotKey
    | PayloadKey
    | LeaseKey
    | ClaimKey
    | ResumeKey
    | BarrierArrivalKey
    | BarrierMarkerKey
    | QueueUnitsKey
    | QueueClaimKey
    | QueueDoneKey
    | DoneKey
    | FinishedKey
    | FollowKey
    | MemberKey
)


# --- builders ------------------------------------------------------------------------


def _number(value: int, limit: int, width: int, what: str) -> str:
    # bool is an int subclass, but True as a round number is always a bug.
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"{what} must be an int, got {type(value).__name__}")
    if not 0 <= value < limit:
        raise ValueError(f"{what} {value} is outside [0, {limit})")
    return f"{value:0{width}d}"


def _round(r: int) -> str:
    return _number(r, ROUND_LIMIT, _ROUND_WIDTH, "round")


def _id(s: str, what: str) -> str:
    if not valid_id(s):
        raise ValueError(f"{what} {s!r} is not a valid id")
    return s


MANIFEST_SLOTS = 16
"""Slots of the manifest key (:data:`gm_core.slots.SLOTS`, which imports this module)."""


def manifest(slot: int = 0) -> str:
    """Key of slot ``slot`` of the run's manifest: format 1's key for slot 0, fixed names
    above it (a node must find a run's manifest before it knows whether it has a key)."""
    if slot == 0:
        return MANIFEST
    if not 0 < slot < MANIFEST_SLOTS:
        raise ValueError(f"manifest slot must be in [0, {MANIFEST_SLOTS}), got {slot}")
    return f"manifest.{slot:02d}{_JSON}"


def head() -> str:
    """Key of the head hint."""
    return HEAD


def round_record(r: int, name: str | None = None) -> str:
    """Key of round ``r``'s record (the commit point): slot 0, or the slot named ``name``.

    Which slot a name stands for is a keyed hash only the run's nodes can compute
    (:meth:`gm_core.auth.Envelope.slot_name`); here a name is only checked for shape.
    """
    if name is None:
        return f"{ROUNDS_PREFIX}{_round(r)}{_JSON}"
    return f"{ROUNDS_PREFIX}{_round(r)}.{_slot_name(name)}{_JSON}"


def _slot_name(name: str) -> str:
    if not isinstance(name, str) or _SLOT_NAME_RE.fullmatch(name) is None:
        raise ValueError(f"slot name {name!r} is not {SLOT_NAME_CHARS} lowercase hex digits")
    return name


def round_prefix(r: int) -> str:
    """What every slot key of round ``r``'s record begins with (and no other round's)."""
    return f"{ROUNDS_PREFIX}{_round(r)}."


def snapshot_prefix(r: int) -> str:
    """Folder of round ``r``'s snapshots, ending in ``/`` (what the closer lists)."""
    return f"{SNAPSHOTS_PREFIX}{_round(r)}/"


def snapshot(r: int, learner: str, name: str | None = None) -> str:
    """Key of ``learner``'s snapshot for round ``r``: slot 0, or the slot named ``name``.

    Slots above 0 sit in a folder of the learner's own, so "a learner writes only
    under its own id" stays one prefix rule for bucket permissions (protocol §16.4.1).
    """
    stem = f"{snapshot_prefix(r)}{_id(learner, 'learner')}"
    return f"{stem}{_JSON}" if name is None else f"{stem}/{_slot_name(name)}{_JSON}"


def payload_prefix(r: int) -> str:
    """Folder of payloads written for round ``r``, ending in ``/``."""
    return f"{PAYLOADS_PREFIX}{_round(r)}/"


def payload(r: int, digest: str) -> str:
    """Key of the payload with content digest ``digest``, written for round ``r``."""
    if not valid_digest(digest):
        raise ValueError(f"digest {digest!r} is not {DIGEST_HEX_CHARS} lowercase hex digits")
    return f"{payload_prefix(r)}{digest}{_PAYLOAD_SUFFIX}"


def lease(node: str) -> str:
    """Key of ``node``'s lease."""
    return f"{LEASES_PREFIX}{_id(node, 'node')}{_JSON}"


def claim_prefix(r: int) -> str:
    """Folder of the takeover claims for round ``r``, ending in ``/``."""
    return f"{CLAIMS_PREFIX}{_round(r)}/"


def claim(r: int, attempt: int) -> str:
    """Key of claim number ``attempt`` for round ``r`` (an open run's)."""
    number = _number(attempt, ATTEMPT_LIMIT, _ATTEMPT_WIDTH, "attempt")
    return f"{claim_prefix(r)}{number}{_JSON}"


def named_claim(r: int, name: str) -> str:
    """Key of an authenticated run's claim for round ``r`` named ``name`` (a keyed hash of its
    attempt, :func:`gm_core.election.claim_key`); here a name is only checked for shape."""
    return f"{claim_prefix(r)}{_slot_name(name)}{_JSON}"


def resume(node: str) -> str:
    """Key of ``node``'s resume state: what its own training needs beyond the shared model.

    Under a folder of the node's own (``nodes/{node}/``), which no closer lists or sweeps:
    only that node writes and reads it, and it lives as long as the run.
    """
    return f"{NODES_PREFIX}{_id(node, 'node')}/{RESUME_NAME}"


def barrier_prefix(name: str) -> str:
    """Folder of every generation of the barrier ``name``, ending in ``/``."""
    return f"{BARRIERS_PREFIX}{_id(name, 'barrier name')}/"


def barrier_generation_prefix(name: str, generation: int) -> str:
    """Folder of one generation of the barrier ``name`` (its arrivals and marker), ending in ``/``.

    Generations share the round's width and limit, so they list in numeric order.
    """
    number = _number(generation, ROUND_LIMIT, _ROUND_WIDTH, "generation")
    return f"{barrier_prefix(name)}{number}/"


def barrier_arrival(name: str, generation: int, party: str, tag: str | None = None) -> str:
    """Key of ``party``'s arrival at ``generation`` of the barrier ``name`` (``tag``: its
    keyed name in an authenticated run, :meth:`gm_core.auth.Envelope.slot_name`)."""
    stem = f"{barrier_generation_prefix(name, generation)}{BARRIER_PARTIES}/{_id(party, 'party')}"
    return f"{stem}{_JSON}" if tag is None else f"{stem}/{_slot_name(tag)}{_JSON}"


def barrier_marker(name: str, generation: int, tag: str | None = None) -> str:
    """Key of the create-once verdict (released or broken) on ``generation`` of ``name``."""
    folder = barrier_generation_prefix(name, generation)
    if tag is None:
        return f"{folder}{BARRIER_MARKER}"
    return f"{folder}{_BARRIER_MARKER_DIR}/{_slot_name(tag)}{_JSON}"


def queue_prefix(queue: str) -> str:
    """Folder of the shared queue ``queue``, ending in ``/``."""
    return f"{QUEUE_PREFIX}{_id(queue, 'queue name')}/"


def queue_units(queue: str) -> str:
    """Key of the create-once statement of which units ``queue`` holds."""
    return f"{queue_prefix(queue)}{QUEUE_UNITS}{_JSON}"


def queue_units_prefix(queue: str) -> str:
    """Folder of every unit's claims and done markers (one listing shows the queue)."""
    return f"{queue_prefix(queue)}{QUEUE_UNITS}/"


def queue_unit_prefix(queue: str, unit: str) -> str:
    """Folder of one unit's claims and done markers, ending in ``/``."""
    return f"{queue_units_prefix(queue)}{_id(unit, 'unit')}/"


def queue_claim(queue: str, unit: str, attempt: int) -> str:
    """Key of the create-once claim ``attempt`` of ``unit``."""
    number = _number(attempt, ATTEMPT_LIMIT, _ATTEMPT_WIDTH, "attempt")
    return f"{queue_unit_prefix(queue, unit)}{QUEUE_CLAIMS}/{number}{_JSON}"


def queue_done(queue: str, unit: str, attempt: int) -> str:
    """Key of the create-once done marker of ``unit`` by the holder of ``attempt``."""
    number = _number(attempt, ATTEMPT_LIMIT, _ATTEMPT_WIDTH, "attempt")
    return f"{queue_unit_prefix(queue, unit)}{QUEUE_DONE}/{number}{_JSON}"


def done(node: str) -> str:
    """Key of ``node``'s create-once marker that its own data ran out."""
    return f"{DONE_PREFIX}{_id(node, 'node')}{_JSON}"


def finished() -> str:
    """Key of the create-once summary of a finished run."""
    return FINISHED


def follow(r: int) -> str:
    """Key of the create-once marker that ``follow`` learners have published round ``r``
    (:mod:`gm_core.follow`)."""
    return f"{FOLLOW_PREFIX}{_round(r)}{_JSON}"


def members_prefix(node: str | None = None) -> str:
    """Prefix of every member's certificates and revocations (of ``node``'s, when given)."""
    return MEMBERS_PREFIX if node is None else f"{MEMBERS_PREFIX}{_id(node, 'node')}/"


def member(node: str, name: str) -> str:
    """Key of slot ``name`` (a keyed slot name, protocol §16.4.1) of ``node``'s member objects."""
    return f"{members_prefix(node)}{_slot_name(name)}{_JSON}"


def build(parsed: ParsedKey) -> str:
    """The key a parsed value stands for; the inverse of :func:`parse`."""
    match parsed:
        case ManifestKey(slot=slot):
            return manifest(slot)
        case HeadKey():
            return head()
        case RoundKey(round=r, name=name):
            return round_record(r, name)
        case SnapshotKey(round=r, learner=learner, name=name):
            return snapshot(r, learner, name)
        case PayloadKey(round=r, digest=digest):
            return payload(r, digest)
        case LeaseKey(node=node):
            return lease(node)
        case ClaimKey(round=r, attempt=attempt, name=name):
            if name is not None:
                return named_claim(r, name)
            if attempt is None:
                raise ValueError("a claim key needs an attempt or a name")
            return claim(r, attempt)
        case ResumeKey(node=node):
            return resume(node)
        case BarrierArrivalKey(name=name, generation=generation, party=party, tag=tag):
            return barrier_arrival(name, generation, party, tag)
        case BarrierMarkerKey(name=name, generation=generation, tag=tag):
            return barrier_marker(name, generation, tag)
        case QueueUnitsKey(queue=queue):
            return queue_units(queue)
        case QueueClaimKey(queue=queue, unit=unit, attempt=attempt):
            return queue_claim(queue, unit, attempt)
        case QueueDoneKey(queue=queue, unit=unit, attempt=attempt):
            return queue_done(queue, unit, attempt)
        case DoneKey(node=node):
            return done(node)
        case FinishedKey():
            return finished()
        case FollowKey(round=r):
            return follow(r)
        case MemberKey(node=node, name=name):
            return member(node, name)
        case _:
            assert_never(parsed)


# --- parsing -------------------------------------------------------------------------


def _parse_number(key: str, text: str, width: int, what: str) -> int:
    # isdigit() alone accepts unicode digits ("٣", "³"); isascii() pins it to 0-9.
    if len(text) != width or not (text.isascii() and text.isdigit()):
        raise BadKey(key, f"{what} must be exactly {width} ASCII digits, got {text!r}")
    return int(text)


def _strip(key: str, name: str, suffix: str) -> str:
    if not name.endswith(suffix):
        raise BadKey(key, f"{name!r} does not end in {suffix!r}")
    return name[: -len(suffix)]


def _parse_id(key: str, text: str, what: str) -> str:
    if not valid_id(text):
        raise BadKey(key, f"{what} {text!r} is not a valid id")
    return text


def _segments(key: str, parts: list[str], count: int) -> list[str]:
    if len(parts) != count:
        raise BadKey(key, f"expected {count} path segments, got {len(parts)}")
    return parts


def _manifest_slot(key: str) -> int | None:
    """The slot of ``manifest.NN.json`` (NN two digits, 01 to 15); None for any other key."""
    stem = key.removeprefix("manifest.").removesuffix(_JSON)
    if len(stem) != 2 or not stem.isdigit() or not stem.isascii() or len(key) != 16:
        return None
    slot = int(stem)
    return slot if 0 < slot < MANIFEST_SLOTS else None


def parse(key: str) -> ParsedKey:
    """Parse a key the builders produce; raise :class:`BadKey` for anything else.

    Strict on purpose: listings may contain objects written by anyone, and a key that
    merely resembles ours (another width, a hostile id, a trailing newline) must not
    be mistaken for a protocol object.
    """
    if not isinstance(key, str):
        raise TypeError(f"key must be a str, got {type(key).__name__}")
    parts = key.split("/")
    folder = parts[0]
    if len(parts) == 1:
        if key == MANIFEST:
            return ManifestKey()
        slot = _manifest_slot(key)
        if slot is not None:
            return ManifestKey(slot=slot)
        if key == HEAD:
            return HeadKey()
        if key == FINISHED:
            return FinishedKey()
        raise BadKey(key, "not a known top-level object")
    if folder == ROUNDS_PREFIX[:-1]:
        _, name = _segments(key, parts, 2)
        return _parse_round(key, _strip(key, name, _JSON))
    if folder == SNAPSHOTS_PREFIX[:-1]:
        return _parse_snapshot(key, parts)
    if folder == PAYLOADS_PREFIX[:-1]:
        _, round_text, name = _segments(key, parts, 3)
        r = _parse_number(key, round_text, _ROUND_WIDTH, "round")
        digest = _strip(key, name, _PAYLOAD_SUFFIX)
        if not valid_digest(digest):
            raise BadKey(key, f"digest {digest!r} is not {DIGEST_HEX_CHARS} lowercase hex digits")
        return PayloadKey(r, digest)
    if folder == LEASES_PREFIX[:-1]:
        _, name = _segments(key, parts, 2)
        return LeaseKey(_parse_id(key, _strip(key, name, _JSON), "node"))
    if folder == CLAIMS_PREFIX[:-1]:
        _, round_text, name = _segments(key, parts, 3)
        r = _parse_number(key, round_text, _ROUND_WIDTH, "round")
        stem = _strip(key, name, _JSON)
        if len(stem) == SLOT_NAME_CHARS:
            return ClaimKey(r, None, _parse_slot(key, stem))
        return ClaimKey(r, _parse_number(key, stem, _ATTEMPT_WIDTH, "attempt"))
    if folder == NODES_PREFIX[:-1]:
        _, node, name = _segments(key, parts, 3)
        if name != RESUME_NAME:
            raise BadKey(key, f"{name!r} is not {RESUME_NAME!r}")
        return ResumeKey(_parse_id(key, node, "node"))
    if folder == BARRIERS_PREFIX[:-1]:
        return _parse_barrier(key, parts)
    if folder == QUEUE_PREFIX[:-1]:
        return _parse_queue(key, parts)
    if folder == DONE_PREFIX[:-1]:
        _, name = _segments(key, parts, 2)
        return DoneKey(_parse_id(key, _strip(key, name, _JSON), "node"))
    if folder == FOLLOW_PREFIX[:-1]:
        _, name = _segments(key, parts, 2)
        return FollowKey(_parse_number(key, _strip(key, name, _JSON), _ROUND_WIDTH, "round"))
    if folder == MEMBERS_PREFIX[:-1]:
        _, node, name = _segments(key, parts, 3)
        return MemberKey(_parse_id(key, node, "node"), _parse_slot(key, _strip(key, name, _JSON)))
    raise BadKey(key, f"unknown folder {folder!r}")


def _parse_snapshot(key: str, parts: list[str]) -> SnapshotKey:
    """``{round}/{learner}.json`` (slot 0) or ``{round}/{learner}/{name}.json``."""
    if len(parts) not in (3, 4):
        raise BadKey(key, f"expected 3 or 4 path segments, got {len(parts)}")
    r = _parse_number(key, parts[1], _ROUND_WIDTH, "round")
    if len(parts) == 3:
        return SnapshotKey(r, _parse_id(key, _strip(key, parts[2], _JSON), "learner"))
    name = _parse_slot(key, _strip(key, parts[3], _JSON))
    return SnapshotKey(r, _parse_id(key, parts[2], "learner"), name)


def _parse_slot(key: str, name: str) -> str:
    if _SLOT_NAME_RE.fullmatch(name) is None:
        raise BadKey(key, f"slot name {name!r} is not {SLOT_NAME_CHARS} lowercase hex digits")
    return name


def _parse_round(key: str, stem: str) -> RoundKey:
    """``{round}`` (slot 0) or ``{round}.{name}`` (a named slot)."""
    round_text, dot, name = stem.partition(".")
    r = _parse_number(key, round_text, _ROUND_WIDTH, "round")
    if not dot:
        return RoundKey(r)
    return RoundKey(r, _parse_slot(key, name))


def _parse_barrier(key: str, parts: list[str]) -> BarrierArrivalKey | BarrierMarkerKey:
    if len(parts) not in (4, 5, 6):
        raise BadKey(key, f"expected 4 to 6 path segments, got {len(parts)}")
    name = _parse_id(key, parts[1], "barrier name")
    generation = _parse_number(key, parts[2], _ROUND_WIDTH, "generation")
    if len(parts) == 4 and parts[3] == BARRIER_MARKER:
        return BarrierMarkerKey(name, generation)
    if len(parts) == 5 and parts[3] == _BARRIER_MARKER_DIR:
        return BarrierMarkerKey(name, generation, _parse_slot(key, _strip(key, parts[4], _JSON)))
    if len(parts) == 4 or parts[3] != BARRIER_PARTIES:
        raise BadKey(key, f"{parts[3]!r} is not {BARRIER_PARTIES!r} or a marker")
    if len(parts) == 5:
        return BarrierArrivalKey(
            name, generation, _parse_id(key, _strip(key, parts[4], _JSON), "party")
        )
    tag = _parse_slot(key, _strip(key, parts[5], _JSON))
    return BarrierArrivalKey(name, generation, _parse_id(key, parts[4], "party"), tag)


def _parse_queue(key: str, parts: list[str]) -> QueueUnitsKey | QueueClaimKey | QueueDoneKey:
    if len(parts) not in (3, 6):
        raise BadKey(key, f"expected 3 or 6 path segments, got {len(parts)}")
    queue = _parse_id(key, parts[1], "queue name")
    if len(parts) == 3:
        if parts[2] != QUEUE_UNITS + _JSON:
            raise BadKey(key, f"{parts[2]!r} is not {QUEUE_UNITS + _JSON!r}")
        return QueueUnitsKey(queue)
    if parts[2] != QUEUE_UNITS:
        raise BadKey(key, f"{parts[2]!r} is not {QUEUE_UNITS!r}")
    unit = _parse_id(key, parts[3], "unit")
    attempt = _parse_number(key, _strip(key, parts[5], _JSON), _ATTEMPT_WIDTH, "attempt")
    if parts[4] == QUEUE_CLAIMS:
        return QueueClaimKey(queue, unit, attempt)
    if parts[4] == QUEUE_DONE:
        return QueueDoneKey(queue, unit, attempt)
    raise BadKey(key, f"{parts[4]!r} is neither {QUEUE_CLAIMS!r} nor {QUEUE_DONE!r}")


def round_of_payload_key(key: str) -> int:
    """The round a payload key was written for (garbage collection sorts by it)."""
    parsed = parse(key)
    if not isinstance(parsed, PayloadKey):
        raise BadKey(key, "not a payload key")
    return parsed.round
