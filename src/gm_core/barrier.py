"""A barrier through the bucket: a party waits until ``parties`` have arrived, then all go on.

Theory of operation
-------------------
One wait is one machine (``advance(state, event) -> (state, commands)``), run by
every party on its own clock. Nothing here compares times written by another
machine: the only time-based decision, the timeout, is on the waiter's own clock.

A barrier ``name`` is a sequence of **generations**, each a folder
(:func:`gm_core.keys.barrier_generation_prefix`) holding

- one create-once **arrival** per party (``parties/{party}.json``, written by that
  party only, so no two writers ever race for one arrival key), and
- at most one create-once **marker** (``released.json``), the generation's verdict,
  which the store lets exactly one writer create: either *released* with exactly
  ``parties`` members, or *broken* by a party whose wait timed out.

A party picks a generation from one listing of the barrier's folder (the lowest
one without a marker that it already arrived in, else the lowest without a marker
that has room, else a new one), writes its arrival there and lists the
generation until it holds ``parties`` arrivals or a marker. Seeing ``parties``
arrivals, it writes the marker naming the first ``parties`` of them in byte order;
the write that creates the marker decides, and every other party reads that marker
and adopts it. A party named in it is released; one that arrived too late
(overflow) moves on to the next generation; a party whose deadline passes first
writes a *broken* marker naming who had arrived, so every party of that generation
learns the same thing — released or timed out — whichever write won.

Why a marker at all, when counting arrivals would do: counting alone cannot say
*which* parties a generation holds when more than ``parties`` arrive at once, nor
let a timeout and a release be decided the same way by every party. The marker
also lets arrivals be deleted (its writer deletes the arrivals it listed), so a
generation leaves one small object behind.

Every key and marker read from the bucket is judged, never trusted: a key under the
barrier's folder that is not one the builders produce (in an authenticated run: not
named with the run key, :func:`arrival_key`) is rejected ``BAD_KEY`` and
ignored; a marker that does not decode, contradicts its key, or names the wrong
number of parties is rejected by name (``BAD_MARKER``, ``PARTIES_MISMATCH``). A
garbage marker voids its generation for every party alike (they all move on to the
next), since no honest party can learn its members from it.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Iterable

import attrs

from gm_core import keys
from gm_core.auth import Envelope
from gm_core.commands import Command, Delete, Get, List, Notify, PutOnce, WakeAt
from gm_core.events import (
    Event,
    GotObject,
    Listed,
    PutDone,
    RequestFailed,
    Started,
    TimerFired,
)

MARKER_FORMAT = 1
"""The ``format`` field of every marker this module writes; any other is refused."""
MARKER_MAX_BYTES = 1 << 20
"""A marker longer than this is refused unread (64-character ids, so ~15,000 parties fit)."""
PARTIES_LIMIT = 10_000
"""Most parties a barrier may have (bounds a marker and a listing's work)."""
REJECTIONS_KEPT = 16
"""Rejections a state keeps (the newest); ``rejected`` counts them all."""

ARRIVAL_BODY = b"{}"
"""An arrival's bytes: its key says everything (who, where); nobody reads the body."""


class Verdict(enum.StrEnum):
    """Why an object in a barrier's folder was not believed."""

    BAD_KEY = "bad_key"
    """A key under the barrier's folder that no builder produces."""
    BAD_MARKER = "bad_marker"
    """A marker that does not decode, or contradicts its key or itself."""
    PARTIES_MISMATCH = "parties_mismatch"
    """A released marker with another number of members than this party's ``parties``."""


@attrs.frozen(kw_only=True)
class Rejection:
    key: str
    verdict: Verdict
    detail: str


@attrs.frozen(kw_only=True)
class Released:
    """The wait's outcome: released from ``generation`` with these ``members`` (sorted)."""

    generation: int
    members: tuple[str, ...]


@attrs.frozen(kw_only=True)
class TimedOut:
    """The wait's outcome: no release before the deadline.

    ``generation`` is where the party arrived (None: it never chose one);
    ``arrived`` who had arrived there as the breaking party last saw it; ``by`` the
    party whose deadline broke the generation (this party, or one that broke it first).
    """

    generation: int | None
    arrived: tuple[str, ...]
    by: str


@attrs.frozen(kw_only=True)
class Mismatched:
    """The wait's outcome: the generation was released by a party that counts other ``parties``."""

    generation: int
    members: tuple[str, ...]


Result = Released | TimedOut | Mismatched


@attrs.frozen(kw_only=True)
class ReleasedMarker:
    generation: int
    members: tuple[str, ...]


@attrs.frozen(kw_only=True)
class BrokenMarker:
    generation: int
    arrived: tuple[str, ...]
    by: str


Marker = ReleasedMarker | BrokenMarker


Request = Get | PutOnce | List
"""The store commands a wait sends one at a time (deletions go unanswered)."""


class Phase(enum.StrEnum):
    SCANNING = "scanning"
    """Listing the barrier's folder to choose a generation."""
    ARRIVING = "arriving"
    """Writing this party's arrival."""
    LISTING = "listing"
    """Listing the generation (or waiting to list it again)."""
    MARKING = "marking"
    """Writing the released marker."""
    READING = "reading"
    """Reading the marker someone wrote."""
    BREAKING = "breaking"
    """The deadline passed: writing the broken marker."""
    DONE = "done"


@attrs.frozen(kw_only=True)
class BarrierSpec:
    """One wait: who waits where, for how many, how long (own clock) and how often it looks.

    ``first`` is the lowest generation this wait may use: one past the generation the
    same waiter was last released from (0 for a waiter that remembers none).
    """

    name: str
    party: str
    parties: int
    timeout_s: float
    poll_s: float
    first: int = 0
    envelope: Envelope | None = None
    """The run's envelope: in an authenticated run, arrivals and markers have keyed names
    (:func:`arrival_key`), so nobody without the run key can arrive or release; None, or
    an open run's, names them plainly."""

    def __attrs_post_init__(self) -> None:
        # Caller misuse raises; bucket contents never reach here.
        if not keys.valid_id(self.name) or not keys.valid_id(self.party):
            raise ValueError(f"barrier name {self.name!r} and party {self.party!r} must be ids")
        if not 1 <= self.parties <= PARTIES_LIMIT:
            raise ValueError(f"parties must be in [1, {PARTIES_LIMIT}], got {self.parties}")
        if not self.timeout_s >= 0 or not self.poll_s > 0:
            raise ValueError(f"timeout_s must be >= 0 and poll_s > 0, got {self.timeout_s}")
        if not 0 <= self.first < keys.ROUND_LIMIT - 1:
            raise ValueError(f"first generation {self.first} is out of range")


@attrs.frozen(kw_only=True)
class BarrierState:
    spec: BarrierSpec
    phase: Phase = Phase.SCANNING
    deadline_s: float = 0.0
    generation: int | None = None
    arrived: tuple[str, ...] = ()
    """Arrivals at ``generation`` as last listed (sorted)."""
    command: Request | None = None
    """The store command in flight, or the one to issue when the timer fires."""
    in_flight: bool = False
    next_req: int = 1
    result: Result | None = None
    rejected: int = 0
    rejections: tuple[Rejection, ...] = ()


def initial(spec: BarrierSpec) -> BarrierState:
    return BarrierState(spec=spec)


Transition = tuple[BarrierState, list[Command]]


def advance(state: BarrierState, event: Event) -> Transition:
    """The one transition function; total over every event (unrelated ones change nothing)."""
    if state.phase is Phase.DONE:
        return state, []
    if isinstance(event, Started):
        return _start(state, event.now_s)
    if isinstance(event, TimerFired):
        return _timer(state, event.now_s)
    req = getattr(event, "req", None)
    if not state.in_flight or state.command is None or req != state.command.req:
        return state, []  # a stale outcome (a retried request's, a deletion's): nothing to do
    state = attrs.evolve(state, in_flight=False)
    if isinstance(event, RequestFailed):
        if state.phase is Phase.BREAKING:
            # The deadline has passed: the caller hears of it now, not after the store recovers.
            return _finish(state, _timed_out(state))
        return state, [WakeAt(at_s=_next_look(state, event.now_s))]
    if isinstance(event, Listed):
        if state.phase is Phase.SCANNING:
            return _scanned(state, event)
        return _listed(state, event)
    if isinstance(event, PutDone):
        return _put(state, event)
    if isinstance(event, GotObject):
        return _got(state, event)
    return state, []


# --- transitions -----------------------------------------------------------------------


def _start(state: BarrierState, now_s: float) -> Transition:
    if state.command is not None:
        return state, []  # started already
    spec = state.spec
    offset = None
    if spec.first > 0:
        # Every key of generation ``first`` and later sorts after its folder's name unslashed.
        offset = keys.barrier_generation_prefix(spec.name, spec.first)[:-1]
    state = attrs.evolve(state, deadline_s=now_s + spec.timeout_s)
    return _issue(state, List(req=0, prefix=keys.barrier_prefix(spec.name), offset=offset))


def _timer(state: BarrierState, now_s: float) -> Transition:
    if state.command is None:
        return state, []  # not started: nothing to look at yet
    if now_s >= state.deadline_s and state.phase is not Phase.BREAKING:
        return _break(state)
    if state.in_flight:
        return state, []
    return _issue(state, state.command)


def _scanned(state: BarrierState, event: Listed) -> Transition:
    spec = state.spec
    arrivals: dict[int, set[str]] = {}
    marked: set[int] = set()
    for key, parsed in _judged(state, event.keys):
        if isinstance(parsed, keys.BarrierMarkerKey):
            marked.add(parsed.generation)
        elif isinstance(parsed, keys.BarrierArrivalKey):
            arrivals.setdefault(parsed.generation, set()).add(parsed.party)
        else:
            state = _reject(state, key, Verdict.BAD_KEY, "not a key of this barrier")
    usable = {g: who for g, who in arrivals.items() if g >= spec.first and g not in marked}
    mine = [g for g, who in usable.items() if spec.party in who]
    roomy = [g for g, who in usable.items() if len(who) < spec.parties]
    seen = [g for g in (*arrivals, *marked) if g >= spec.first]
    generation = min(mine or roomy or [max(seen, default=spec.first - 1) + 1])
    return _arrive(state, generation)


def _arrive(state: BarrierState, generation: int) -> Transition:
    if generation >= keys.ROUND_LIMIT:
        # Only a bucket stuffed with generations gets here: give up by timing out now.
        return _finish(state, TimedOut(generation=None, arrived=(), by=state.spec.party))
    key = arrival_key(state.spec, generation, state.spec.party)
    state = attrs.evolve(state, phase=Phase.ARRIVING, generation=generation, arrived=())
    return _issue(state, PutOnce(req=0, key=key, data=ARRIVAL_BODY))


def _listed(state: BarrierState, event: Listed) -> Transition:
    spec, generation = state.spec, state.generation
    assert generation is not None
    arrived: set[str] = set()
    marker = False
    for key, parsed in _judged(state, event.keys):
        if isinstance(parsed, keys.BarrierMarkerKey) and parsed.generation == generation:
            marker = True
        elif isinstance(parsed, keys.BarrierArrivalKey) and parsed.generation == generation:
            arrived.add(parsed.party)
        else:
            state = _reject(state, key, Verdict.BAD_KEY, f"not a key of generation {generation}")
    state = attrs.evolve(state, arrived=tuple(sorted(arrived)))
    key = marker_key(spec, generation)
    if marker:
        return _read_marker(state)
    if is_full(len(arrived), spec.parties):
        data = encode(ReleasedMarker(generation=generation, members=_members(state)))
        state = attrs.evolve(state, phase=Phase.MARKING)
        return _issue(state, PutOnce(req=0, key=key, data=data))
    return _wait(attrs.evolve(state, phase=Phase.LISTING), event.now_s)


def is_full(arrived: int, parties: int) -> bool:
    """The release rule: a generation may be marked released once ``parties`` have arrived."""
    return arrived >= parties


def _members(state: BarrierState) -> tuple[str, ...]:
    """Who a marker this party writes releases: itself and the first others in byte order.

    Any choice every reader can check would do, since the create-once write decides;
    naming the writer spares it from moving on from a generation it saw fill up.
    """
    me = state.spec.party
    others = [p for p in state.arrived if p != me][: state.spec.parties - 1]
    return tuple(sorted([me, *others]))


def _put(state: BarrierState, event: PutDone) -> Transition:
    generation = state.generation
    assert generation is not None
    if state.phase is Phase.ARRIVING:
        # Created or there already (this party's earlier arrival): either way, arrived.
        prefix = keys.barrier_generation_prefix(state.spec.name, generation)
        return _issue(attrs.evolve(state, phase=Phase.LISTING), List(req=0, prefix=prefix))
    if not event.created:
        return _read_marker(state)  # another party's marker won: adopt it
    if state.phase is Phase.MARKING:
        marker = ReleasedMarker(generation=generation, members=_members(state))
        state, cmds = _decide(state, marker, event.now_s)
        # The marker now speaks for the generation: the arrivals it read are no longer needed.
        arrivals = tuple(arrival_key(state.spec, generation, p) for p in state.arrived)
        req = state.next_req
        return attrs.evolve(state, next_req=req + 1), [*cmds, Delete(req=req, keys=arrivals)]
    arrived = state.arrived
    return _finish(state, TimedOut(generation=generation, arrived=arrived, by=state.spec.party))


def _got(state: BarrierState, event: GotObject) -> Transition:
    generation = state.generation
    assert generation is not None
    key = marker_key(state.spec, generation)
    if event.data is None:  # listed but not readable yet (or deleted by a peer): look again
        if state.phase is Phase.BREAKING:
            return _finish(state, _timed_out(state))
        prefix = keys.barrier_generation_prefix(state.spec.name, generation)
        relist = List(req=state.command.req if state.command else 0, prefix=prefix)
        return _wait(attrs.evolve(state, phase=Phase.LISTING, command=relist), event.now_s)
    marker = decode(event.data, generation)
    if isinstance(marker, str):
        state = _reject(state, key, Verdict.BAD_MARKER, marker)
        return _move_on(state, event.now_s)
    return _decide(state, marker, event.now_s)


def _decide(state: BarrierState, marker: Marker, now_s: float) -> Transition:
    spec, generation = state.spec, marker.generation
    if isinstance(marker, BrokenMarker):
        return _finish(state, TimedOut(generation=generation, arrived=marker.arrived, by=marker.by))
    if len(marker.members) != spec.parties:
        detail = f"{len(marker.members)} members, this party waits for {spec.parties}"
        key = marker_key(spec, generation)
        state = _reject(state, key, Verdict.PARTIES_MISMATCH, detail)
        return _finish(state, Mismatched(generation=generation, members=marker.members))
    if spec.party in marker.members:
        return _finish(state, Released(generation=generation, members=marker.members))
    return _move_on(state, now_s)


def _move_on(state: BarrierState, now_s: float) -> Transition:
    """This party is not in the generation's verdict: take its arrival back, try the next one."""
    generation = state.generation
    assert generation is not None
    if state.phase is Phase.BREAKING or now_s >= state.deadline_s:
        return _finish(state, _timed_out(state))
    stray = arrival_key(state.spec, generation, state.spec.party)
    req = state.next_req
    state, cmds = _arrive(attrs.evolve(state, next_req=req + 1), generation + 1)
    return state, [Delete(req=req, keys=(stray,)), *cmds]


def _break(state: BarrierState) -> Transition:
    generation = state.generation
    if generation is None:
        return _finish(state, _timed_out(state))
    spec = state.spec
    arrived = tuple(sorted({*state.arrived, spec.party}))
    data = encode(BrokenMarker(generation=generation, arrived=arrived, by=spec.party))
    state = attrs.evolve(state, phase=Phase.BREAKING, arrived=arrived)
    return _issue(state, PutOnce(req=0, key=marker_key(spec, generation), data=data))


def _read_marker(state: BarrierState) -> Transition:
    generation = state.generation
    assert generation is not None
    key = marker_key(state.spec, generation)
    phase = Phase.BREAKING if state.phase is Phase.BREAKING else Phase.READING
    return _issue(attrs.evolve(state, phase=phase), Get(req=0, key=key))


# --- helpers -----------------------------------------------------------------------------


def _issue(state: BarrierState, command: Request) -> Transition:
    """Send ``command`` (numbered afresh) and keep it for a retry; the timer guards the deadline."""
    numbered = attrs.evolve(command, req=state.next_req)
    state = attrs.evolve(state, command=numbered, in_flight=True, next_req=state.next_req + 1)
    return state, [numbered, WakeAt(at_s=state.deadline_s)]


def _wait(state: BarrierState, now_s: float) -> Transition:
    """Nothing to do until the next look: keep the command, re-issue it when the timer fires."""
    return state, [WakeAt(at_s=_next_look(state, now_s))]


def _next_look(state: BarrierState, now_s: float) -> float:
    """The next poll, or the deadline if that comes first (never a time already past)."""
    look = now_s + state.spec.poll_s
    return look if now_s >= state.deadline_s else min(look, state.deadline_s)


def _finish(state: BarrierState, result: Result) -> Transition:
    state = attrs.evolve(state, phase=Phase.DONE, result=result, in_flight=False)
    return state, [Notify(kind="barrier", round=-1, detail=describe(state.spec, result))]


def _timed_out(state: BarrierState) -> TimedOut:
    return TimedOut(generation=state.generation, arrived=state.arrived, by=state.spec.party)


def _judged(
    state: BarrierState, listed: Iterable[str]
) -> Iterable[tuple[str, keys.BarrierArrivalKey | keys.BarrierMarkerKey | None]]:
    """Each listed key with what it parses as (None: not a key this barrier's parties
    write — another barrier's, garbage, or in an authenticated run not named with the key)."""
    spec = state.spec
    for key in listed:
        try:
            parsed: keys.ParsedKey | None = keys.parse(key)
        except (keys.BadKey, TypeError):
            parsed = None
        if isinstance(parsed, keys.BarrierArrivalKey) and parsed.name == spec.name:
            named = arrival_key(spec, parsed.generation, parsed.party)
        elif isinstance(parsed, keys.BarrierMarkerKey) and parsed.name == spec.name:
            named = marker_key(spec, parsed.generation)
        else:
            yield key, None
            continue
        yield key, (parsed if key == named else None)


def arrival_key(spec: BarrierSpec, generation: int, party: str) -> str:
    """Where ``party`` arrives at ``generation``: a keyed name in an authenticated run."""
    tag = _tag(spec, "barrier-arrival", f"{spec.name}/{generation}/{party}")
    return keys.barrier_arrival(spec.name, generation, party, tag)


def marker_key(spec: BarrierSpec, generation: int) -> str:
    """Where ``generation``'s verdict is written: a keyed name in an authenticated run."""
    tag = _tag(spec, "barrier-marker", f"{spec.name}/{generation}")
    return keys.barrier_marker(spec.name, generation, tag)


def _tag(spec: BarrierSpec, kind: str, subject: str) -> str | None:
    envelope = spec.envelope
    return (
        None if envelope is None or envelope.auth is None else envelope.slot_name(kind, subject, 0)
    )


def _reject(state: BarrierState, key: str, verdict: Verdict, detail: str) -> BarrierState:
    kept = (*state.rejections, Rejection(key=key, verdict=verdict, detail=detail))
    return attrs.evolve(state, rejected=state.rejected + 1, rejections=kept[-REJECTIONS_KEPT:])


def describe(spec: BarrierSpec, result: Result) -> str:
    """One line saying how the wait ended (for logs and error messages)."""
    where = f"barrier {spec.name!r} ({spec.parties} parties)"
    if isinstance(result, Released):
        return f"{where} released generation {result.generation}: {', '.join(result.members)}"
    if isinstance(result, Mismatched):
        return (
            f"{where}: generation {result.generation} was released for {len(result.members)} "
            f"parties ({', '.join(result.members)}); every party must pass the same parties"
        )
    arrived = ", ".join(result.arrived) or "nobody"
    by = "this party" if result.by == spec.party else result.by
    return (
        f"{where} timed out at generation {result.generation} (deadline of {by}): "
        f"{len(result.arrived)} of {spec.parties} arrived: {arrived}"
    )


# --- the marker's wire form --------------------------------------------------------------


def encode(marker: Marker) -> bytes:
    if isinstance(marker, ReleasedMarker):
        body: dict[str, object] = {"members": list(marker.members)}
    else:
        body = {"arrived": list(marker.arrived), "by": marker.by}
    kind = "released" if isinstance(marker, ReleasedMarker) else "broken"
    head = {"format": MARKER_FORMAT, "kind": kind, "generation": marker.generation}
    return json.dumps({**head, **body}, sort_keys=True, separators=(",", ":")).encode()


def decode(data: bytes, generation: int) -> Marker | str:
    """The marker in ``data``, found at ``generation``'s key; a string says why it is refused.

    Total: no input raises. Refused are: more than ``MARKER_MAX_BYTES``, anything but a
    JSON object with exactly the fields of one kind, another format, a generation other
    than the key's, party lists that are not sorted, distinct, valid ids (at most
    ``PARTIES_LIMIT``), an empty released list, and a breaker that is not an id.
    """
    if len(data) > MARKER_MAX_BYTES:
        return f"{len(data)} bytes, over {MARKER_MAX_BYTES}"
    try:
        doc = json.loads(data)
    except (ValueError, RecursionError) as error:  # UnicodeDecodeError is a ValueError
        return f"not JSON: {type(error).__name__}"
    if not isinstance(doc, dict):
        return "not a JSON object"
    kind = doc.get("kind")
    fields = {"released": {"members"}, "broken": {"arrived", "by"}}.get(str(kind))
    if fields is None:
        return f"unknown kind {kind!r:.40}"
    if set(doc) != {"format", "kind", "generation", *fields}:
        return f"fields {sorted(doc)!r:.200} are not those of a {kind} marker"
    if type(doc["format"]) is not int or doc["format"] != MARKER_FORMAT:
        return f"format {doc['format']!r:.40} is not {MARKER_FORMAT}"
    if type(doc["generation"]) is not int or doc["generation"] != generation:
        return f"generation {doc['generation']!r:.40} is not the key's {generation}"
    names = doc["members"] if kind == "released" else doc["arrived"]
    problem = _party_list_problem(names)
    if problem is not None:
        return problem
    if kind == "released":
        if not names:
            return "no members"
        return ReleasedMarker(generation=generation, members=tuple(names))
    by = doc["by"]
    if not isinstance(by, str) or not keys.valid_id(by):
        return f"breaker {by!r:.80} is not an id"
    return BrokenMarker(generation=generation, arrived=tuple(names), by=by)


def _party_list_problem(names: object) -> str | None:
    if not isinstance(names, list) or len(names) > PARTIES_LIMIT:
        return f"parties are not a list of at most {PARTIES_LIMIT}"
    if not all(isinstance(n, str) and keys.valid_id(n) for n in names):
        return "a party is not an id"
    if names != sorted(set(names)):
        return "parties are not sorted and distinct"
    return None
