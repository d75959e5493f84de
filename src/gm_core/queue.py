"""A shared queue of work units: which unit a node trains next, and when it may say it is done.

Theory of operation
-------------------
Units are ids every node of the queue knows (only ids cross the bucket). One node's
view of the queue is one machine (``advance(state, event) -> (state, commands)``),
driven by the node's trainer with two requests: :class:`Want` (give me a unit to
train) and :class:`Finish` (I have stepped the unit's last batch). Between them the
machine only answers the store. Layout (spec/coordination.md §2)::

    queue/{q}/units.json                          create-once: count and digest of the ids
    queue/{q}/units/{unit}/claims/{attempt}.json  create-once claim: {node}
    queue/{q}/units/{unit}/done/{attempt}.json    create-once: the holder of attempt finished it

**Holding.** A unit's holder is the node named by its highest claim attempt; a claim
body that does not open or decode holds nobody (``""``), as does a unit without
claims. Claims are numbered create-once writes, so of any number of nodes racing
for attempt ``k`` exactly one wins and the others take their next candidate.

**Choosing** (:func:`choose`), from one listing of the queue's folder and the
bodies it needs: first a unit whose highest claim names this node and that is not
done (a node restarted under the same id resumes its own units), then a unit held
by nobody, then a unit whose holder's lease has not changed for
``lease_timeout_s`` *on this node's clock* (:mod:`gm_core.liveness`): its claim is
re-issued as the next attempt. No time written by another machine is compared with
this node's, and nothing waits for other writes to land. Candidates are taken in a
node-specific order (SHA-256 of node and unit) so nodes start apart.

**Finishing.** Before writing its done marker, the holder lists its unit's folder:
if its own claim is gone (collected after another holder finished) or a higher
attempt exists, it lost the unit and writes nothing. Otherwise it writes
``done/{its attempt}`` create-once and then deletes the unit's claims (the done
marker now says everything). The **counted** completion of a unit is its valid
done marker of the lowest attempt (:func:`gm_core.completion.counted`), so a paused
holder and its successor that both finish count once.

**Starting.** Before a unit starts, its holder lists the unit's folder once more: if its
claim is gone or superseded, or a done marker it has not judged garbage is there (a
listing older than a peer's finish), it drops the unit and chooses again.

**Watching.** A holder that must stop as soon as it has lost its unit (a rank,
:mod:`gm_core.ranks`) sends :class:`Watch` while it trains: the same check of the
unit's folder, answered :attr:`Outcome.HELD` or :attr:`Outcome.LOST`.

**Prefetch.** A node asking for a unit while it holds none unstarted claims up to
``1 + prefetch`` units at once; each is checked as above when it starts.

**Claiming ahead** (a pipelined trainer, :class:`Ahead`). So that no store request sits
between two units on the training thread, a shell may, while the trainer trains, send
:class:`Ahead`: the machine claims up to ``prefetch`` units beyond the one trained and
checks the next as above (never waiting for a peer); a later :class:`Want` starts a
checked unit without a request (:func:`ready`). When the trainer has stepped a unit's
last batch it sends :class:`Ended` (no request: the unit stays held, its done marker not
written) and may then :class:`Want` a ready unit and :class:`Finish` the ended one after,
while it trains the next. The check before a start is then as old as the unit trained
before it: a peer may have re-issued the unit meanwhile (only if this node's lease looked
dead), and the node trains it in vain; its completion is still decided by the check
before its done marker, so each unit is still counted once.

**Giving back.** A node that stops training with units claimed but not started (an
``either`` node elected closer) sends :class:`GiveBack`: it lists the queue (units
claimed under its id before a restart are its too) and for each such unit writes
the next claim attempt naming ``""``, so the unit is held by nobody and any node takes
it at once, with no lease timeout to wait out. A write that finds the attempt taken
means a peer re-issued the unit already: nothing to give.

Every key and body read is judged: keys of other shapes, units outside the agreed
set, claim and done bodies that do not open under the run's envelope or do not
decode are rejected by name (:class:`Verdict`) and never raise. A garbage
``units.json`` is rejected and does not block the queue (the agreement it carries
guards against misuse, not against a writer).
"""

from __future__ import annotations

import enum
import hashlib
import json
from collections.abc import Iterable, Mapping

import attrs

from gm_core import codec, keys, liveness
from gm_core.auth import Envelope, Unauthenticated
from gm_core.commands import Command, Delete, Get, List, Notify, Probe, PutOnce, WakeAt
from gm_core.completion import DoneMarker, decode_done, encode_done
from gm_core.events import (
    Event,
    GotObject,
    Listed,
    Probed,
    PutDone,
    RequestFailed,
    Started,
    TimerFired,
)

FORMAT = 1
"""The ``format`` of every claim and units statement; any other is refused."""
BODY_MAX_BYTES = 4096
"""Claims and units statements are a few bounded fields; longer bodies are refused."""
UNITS_LIMIT = 1_000_000
"""Most units a queue may hold (bounds a listing's work)."""
REJECTIONS_KEPT = 16
"""Rejections a state keeps (the newest); ``rejected`` counts them all."""


class Verdict(enum.StrEnum):
    """Why an object in the queue's folder was not believed."""

    BAD_KEY = "bad_key"
    """A key under the queue's folder that no builder produces."""
    UNKNOWN_UNIT = "unknown_unit"
    """A unit outside the agreed set."""
    BAD_CLAIM = "bad_claim"
    """A claim body that does not decode or contradicts its key: it holds nobody."""
    BAD_DONE = "bad_done"
    """A done marker that does not decode or contradicts its key: it finishes nothing."""
    BAD_UNITS = "bad_units"
    """A units statement that does not decode: the queue goes on unchecked."""
    UNAUTHENTICATED = "unauthenticated"
    """A body that does not open under the run's envelope."""


@attrs.frozen(kw_only=True)
class Rejection:
    key: str
    verdict: Verdict
    detail: str


# --- what the trainer asks, and what it is told -----------------------------------------


@attrs.frozen(kw_only=True)
class Want:
    """The trainer asks for its next unit (it holds none started)."""

    now_s: float


@attrs.frozen(kw_only=True)
class Finish:
    """The trainer stepped the last batch of ``unit``: write its done marker if still held."""

    now_s: float
    unit: str
    steps: int
    tokens: int


@attrs.frozen(kw_only=True)
class Watch:
    """The trainer is still training its unit: is it still this node's?"""

    now_s: float


@attrs.frozen(kw_only=True)
class GiveBack:
    """The trainer stops: hand back every unit claimed here and not started.

    ``leaving``: the node leaves with an error (``Session.run``'s ``step`` raised): the
    unit being trained, cut short, goes back too. Its steps die with the node (a leaving
    node flushes nothing), so a peer trains it again at once rather than after the
    leaver's lease has aged out."""

    now_s: float
    leaving: bool = False


@attrs.frozen(kw_only=True)
class Ahead:
    """The trainer trains (or is about to): claim ``prefetch`` units beyond its unit and
    check the next, without waiting for a peer."""

    now_s: float


@attrs.frozen(kw_only=True)
class Ended:
    """The trainer stepped the last batch of ``unit`` (its :class:`Finish` follows later)."""

    now_s: float
    unit: str


Task = Want | Finish | Watch | GiveBack | Ahead
QueueEvent = Event | Task | Ended


@attrs.frozen(kw_only=True)
class Assignment:
    """Train ``unit`` under claim ``attempt`` (a resumed unit is a claim of this node's)."""

    unit: str
    attempt: int
    resumed: bool


class Outcome(enum.StrEnum):
    """How the trainer's last request ended."""

    ASSIGNED = "assigned"
    """``current`` is the unit to train."""
    EXHAUSTED = "exhausted"
    """Every unit is done: there is nothing left to train."""
    DONE = "done"
    """The finished unit's done marker is written."""
    LOST = "lost"
    """The finished (or watched) unit was taken over (or finished) by another holder: no
    marker written."""
    HELD = "held"
    """The watched unit is still this node's."""
    GIVEN = "given"
    """Every unit claimed here and not started is given back (held by nobody)."""
    MISMATCHED = "mismatched"
    """The queue holds another set of units than this node's (``mismatch`` says how)."""
    AHEAD = "ahead"
    """Units are claimed ahead as far as any was free, and the next one is checked."""


@attrs.frozen(kw_only=True)
class Held:
    unit: str
    attempt: int
    started: bool = False
    resumed: bool = False
    """Found claimed by this node (under the same id, before a restart)."""
    checked: bool = False
    """Checked by :class:`Ahead` since it was claimed: :class:`Want` starts it at once."""


class Phase(enum.StrEnum):
    AGREEING = "agreeing"
    """Writing ``units.json`` (or reading the one there)."""
    IDLE = "idle"
    """Waiting for the trainer."""
    SCANNING = "scanning"
    """Listing the queue's folder (or waiting to list it again)."""
    READING = "reading"
    """Reading the claim and done bodies the choice needs."""
    PROBING = "probing"
    """Looking at the leases of holders whose units might be re-issued."""
    CLAIMING = "claiming"
    """Writing a claim."""
    CHECKING = "checking"
    """Listing one unit's folder before starting or finishing it."""
    MARKING = "marking"
    """Writing a done marker."""
    GIVING = "giving"
    """Writing the claims that give unstarted units back."""
    STOPPED = "stopped"


Request = Get | PutOnce | List | Probe


@attrs.frozen(kw_only=True)
class QueueSpec:
    """One node's view of queue ``queue``: its units, how far it claims ahead, how it judges."""

    queue: str
    node: str
    units: tuple[str, ...]
    """The unit ids, sorted and distinct."""
    prefetch: int
    lease_timeout_s: float
    poll_s: float
    envelope: Envelope
    ordered: bool = False
    """Take units in id order (ranks: the lowest first), not in a node-specific order."""

    def __attrs_post_init__(self) -> None:
        # Caller misuse raises; bucket contents never reach here.
        if not keys.valid_id(self.queue) or not keys.valid_id(self.node):
            raise ValueError(f"queue {self.queue!r} and node {self.node!r} must be ids")
        if not 1 <= len(self.units) <= UNITS_LIMIT:
            raise ValueError(f"a queue holds 1 to {UNITS_LIMIT} units, got {len(self.units)}")
        if list(self.units) != sorted(set(self.units)):
            raise ValueError("units must be sorted and distinct")
        bad = [u for u in self.units if not keys.valid_id(u)]
        if bad:
            raise ValueError(f"unit {bad[0]!r} is not an id ([A-Za-z0-9._-], 1-64 characters)")
        if self.prefetch < 0 or not self.lease_timeout_s >= 0 or not self.poll_s > 0:
            raise ValueError("prefetch and lease_timeout_s must be >= 0, poll_s > 0")


@attrs.frozen(kw_only=True)
class Listing:
    """One unit's folder as listed: claim and done attempts, ascending."""

    claims: tuple[int, ...] = ()
    dones: tuple[int, ...] = ()


@attrs.frozen(kw_only=True)
class QueueState:
    spec: QueueSpec
    phase: Phase = Phase.AGREEING
    task: Task | None = None
    """The trainer's request being served."""
    outcome: Outcome | None = None
    current: Assignment | None = None
    held: tuple[Held, ...] = ()
    listing: Mapping[str, Listing] = attrs.field(factory=dict)
    holders: Mapping[str, str] = attrs.field(factory=dict)
    """Claim key -> the node it names (``""``: nobody); claims are create-once, so cached."""
    dones: Mapping[str, bool] = attrs.field(factory=dict)
    """Done key -> whether its marker is valid; cached like claims."""
    views: Mapping[str, liveness.LeaseView] = attrs.field(factory=dict)
    todo: tuple[str, ...] = ()
    """Keys still to read (READING) or leases to probe (PROBING)."""
    candidates: tuple[tuple[str, int], ...] = ()
    """(unit, attempt to write) still to try while CLAIMING."""
    command: Request | None = None
    in_flight: bool = False
    next_req: int = 1
    mismatch: str = ""
    rejected: int = 0
    rejections: tuple[Rejection, ...] = ()
    given: tuple[str, ...] = ()
    """Units this machine gave back (its claim naming nobody created), in order."""


def initial(spec: QueueSpec) -> QueueState:
    return QueueState(spec=spec)


Transition = tuple[QueueState, list[Command]]


def advance(state: QueueState, event: QueueEvent) -> Transition:
    """The one transition function; total over every event (unrelated ones change nothing)."""
    if state.phase is Phase.STOPPED:
        return state, []
    if isinstance(event, Started):
        if state.command is not None:
            return state, []
        return _issue(state, PutOnce(req=0, key=_units_key(state), data=units_body(state)))
    if isinstance(event, Ended):
        return _end(state, event)
    if isinstance(event, Want | Finish | Watch | GiveBack | Ahead):
        return _request(state, event)
    if isinstance(event, TimerFired):
        if state.in_flight or state.command is None or state.phase is Phase.IDLE:
            return state, []
        return _issue(state, state.command)
    req = getattr(event, "req", None)
    if not state.in_flight or state.command is None or req != state.command.req:
        return state, []  # a stale outcome (a retried request's): nothing to do
    state = attrs.evolve(state, in_flight=False)
    if isinstance(event, RequestFailed):
        return state, [WakeAt(at_s=event.now_s + state.spec.poll_s)]
    return _answered(state, event)


def ready(state: QueueState) -> bool:
    """Whether a :class:`Want` now starts a unit without a store request (one checked by
    :class:`Ahead` is waiting)."""
    waiting = [h for h in state.held if not h.started]
    return (
        state.phase is Phase.IDLE
        and state.task is None
        and state.current is None
        and bool(waiting)
        and waiting[0].checked
    )


def untouched(state: QueueState) -> int:
    """How many units the last listing showed with neither a claim nor a done marker."""
    touched = sum(1 for seen in state.listing.values() if seen.claims or seen.dones)
    return len(state.spec.units) - touched


def ahead_wait_s(state: QueueState, unit_s: float, ahead_s: float) -> float:
    """How long after a unit starts a pipelined trainer's claim ahead (:class:`Ahead`) waits.

    ``unit_s``: how long this node's last unit took, start to start (0: none yet);
    ``ahead_s``: how long its last claim ahead took (the store's pace).

    A slow node's early claim costs the run only near the end of the data, where a faster
    node would have finished that unit sooner. While the last listing shows more than
    twice as many untouched units as units claimed and not done (what every holder has in
    hand, at least this node's ``1 + prefetch``), the claim goes at once: the holders
    cannot take all the untouched units before this node starts the one it claims, so an
    early claim keeps no unit from a faster peer, and a late one would stall the trainer
    whenever the store or the unit is slower than last time. Below that it waits until
    twice ``ahead_s`` before the unit is expected to end (just in time), so the last units
    go to whoever is free first. Only the listing is read: claim bodies (who holds what)
    are not, as claiming ahead reads none (:func:`_scanned`)."""
    held = sum(1 for seen in state.listing.values() if seen.claims and not seen.dones)
    if untouched(state) > 2 * max(held, 1 + state.spec.prefetch):
        return 0.0
    return max(0.0, unit_s - 2 * ahead_s)


def _end(state: QueueState, event: Ended) -> Transition:
    if state.task is not None or state.phase is not Phase.IDLE:
        raise ValueError(f"the queue is busy ({state.phase}): one request at a time")
    if state.current is None or state.current.unit != event.unit:
        raise ValueError(f"unit {event.unit!r} is not being trained here")
    return attrs.evolve(state, current=None), []


def _request(state: QueueState, event: Task) -> Transition:
    if state.task is not None or state.phase is not Phase.IDLE:
        raise ValueError(f"the queue is busy ({state.phase}): one request at a time")
    training = None if state.current is None else state.current.unit
    ended = [h.unit for h in state.held if h.started and h.unit != training]
    if isinstance(event, Want) and ended and not ready(state):
        # Waiting for peers could wait on this node's own unit, done but not marked.
        raise ValueError(f"unit {ended[0]!r} ended: finish it before waiting for another")
    state = attrs.evolve(state, task=event, outcome=None)
    if isinstance(event, Ahead):
        return _ahead(state)
    if isinstance(event, GiveBack):
        if ended:
            raise ValueError(f"unit {ended[0]!r} is not finished yet")
        if state.current is not None and not event.leaving:
            raise ValueError(f"unit {state.current.unit!r} is not finished yet")
        if state.current is not None:  # leaving: the unit cut short goes back as unstarted
            cut = state.current.unit
            back = tuple(attrs.evolve(h, started=False) if h.unit == cut else h for h in state.held)
            state = attrs.evolve(state, current=None, held=back)
        # Its claims may predate this machine (a restart under the same id): list the queue
        # and give back every unit whose newest claim names this node (:func:`_give_own`).
        return _scan(state)
    if isinstance(event, Watch):
        if state.current is None:
            raise ValueError("no unit is being trained here: nothing to watch")
        return _check(state, state.current.unit)
    if isinstance(event, Finish):
        held = _held(state, event.unit)
        if held is None or not held.started:
            raise ValueError(f"unit {event.unit!r} is not being trained here")
        return _check(state, event.unit)
    if state.current is not None:
        raise ValueError(f"unit {state.current.unit!r} is not finished yet")
    waiting = [h for h in state.held if not h.started]
    if waiting and waiting[0].checked:
        return _start(state, waiting[0])
    if waiting:
        return _check(state, waiting[0].unit)
    return _scan(state)


def _assigned(held: Held) -> Assignment:
    return Assignment(unit=held.unit, attempt=held.attempt, resumed=held.resumed)


def _ahead(state: QueueState) -> Transition:
    """Claim up to ``prefetch`` unstarted units if fewer are held, then check them."""
    if sum(not h.started for h in state.held) < state.spec.prefetch:
        return _scan(state)
    return _ahead_next(state)


def _ahead_next(state: QueueState) -> Transition:
    """Check the first unstarted unit not yet checked; reply once none is left (no new scan:
    what was free has been claimed)."""
    unchecked = [h for h in state.held if not h.started and not h.checked]
    if unchecked:
        return _check(state, unchecked[0].unit)
    return _reply(state, Outcome.AHEAD)


def _wish(state: QueueState) -> int:
    """How many unstarted units the task wants held: one to start plus ``prefetch``, or
    (claiming ahead, while one is trained) ``prefetch``."""
    return state.spec.prefetch + (0 if isinstance(state.task, Ahead) else 1)


def _answered(state: QueueState, event: Event) -> Transition:
    phase = state.phase
    if phase is Phase.AGREEING:
        return _agreeing(state, event)
    if phase is Phase.SCANNING and isinstance(event, Listed):
        return _scanned(state, event)
    if phase is Phase.READING and isinstance(event, GotObject):
        return _read(state, event)
    if phase is Phase.PROBING and isinstance(event, Probed | GotObject):
        return _probed(state, event)
    if phase is Phase.CLAIMING and isinstance(event, PutDone):
        return _claimed(state, event)
    if phase is Phase.CHECKING and isinstance(event, Listed):
        return _checked(state, event)
    if phase is Phase.MARKING and isinstance(event, PutDone):
        return _marked(state, event)
    if phase is Phase.GIVING and isinstance(event, PutDone):
        return _given(state, event)
    return state, []


# --- agreeing on the units ----------------------------------------------------------------


def units_body(state: QueueState) -> bytes:
    """The units statement this node writes (and expects): count and digest of the ids."""
    return state.spec.envelope.seal(_units_key(state), _units_json(state.spec.units))


def _units_json(units: tuple[str, ...]) -> bytes:
    digest = hashlib.sha256("\n".join(units).encode()).hexdigest()
    doc = {"format": FORMAT, "count": len(units), "sha256": digest}
    return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()


def _units_key(state: QueueState) -> str:
    return keys.queue_units(state.spec.queue)


def _agreeing(state: QueueState, event: Event) -> Transition:
    if isinstance(event, PutDone):
        if event.created:
            return _idle(state)
        return _issue(state, Get(req=0, key=_units_key(state)))
    if not isinstance(event, GotObject) or event.data is None:
        return _idle(state)  # gone again: nothing to compare with (only a deleter gets here)
    key = _units_key(state)
    body = _open(state, key, event.data)
    if isinstance(body, QueueState):
        return _idle(body)
    ours = _units_json(state.spec.units)
    if body == ours:
        return _idle(state)
    problem = _units_problem(body)
    if problem is not None:
        return _idle(_reject(state, key, Verdict.BAD_UNITS, problem))
    theirs = json.loads(body)
    state = attrs.evolve(
        state,
        phase=Phase.STOPPED,
        outcome=Outcome.MISMATCHED,
        mismatch=(
            f"queue {state.spec.queue!r} holds {theirs['count']} units (sha256 "
            f"{theirs['sha256'][:12]}); this node has {len(state.spec.units)} (sha256 "
            f"{json.loads(ours)['sha256'][:12]}): every node must pass the same units"
        ),
    )
    return state, [Notify(kind="queue", round=-1, detail=state.mismatch)]


def _units_problem(body: bytes) -> str | None:
    if len(body) > BODY_MAX_BYTES:
        return f"{len(body)} bytes, over {BODY_MAX_BYTES}"
    try:
        doc = json.loads(body)
    except (ValueError, RecursionError) as error:
        return f"not JSON: {type(error).__name__}"
    if not isinstance(doc, dict) or set(doc) != {"format", "count", "sha256"}:
        return "not an object with exactly format, count and sha256"
    if doc["format"] != FORMAT or type(doc["count"]) is not int or doc["count"] < 1:
        return "format or count out of range"
    if not isinstance(doc["sha256"], str) or not keys.valid_digest(doc["sha256"]):
        return "sha256 is not 64 lowercase hex digits"
    return None


# --- choosing a unit ----------------------------------------------------------------------


def _scan(state: QueueState) -> Transition:
    prefix = keys.queue_units_prefix(state.spec.queue)
    return _issue(attrs.evolve(state, phase=Phase.SCANNING), List(req=0, prefix=prefix))


def _scanned(state: QueueState, event: Listed) -> Transition:
    found: dict[str, tuple[set[int], set[int]]] = {}
    for key, parsed in _judged(state, event.keys):
        if parsed is None:
            state = _reject(state, key, Verdict.BAD_KEY, "not a key of this queue")
        elif parsed.unit not in _unit_set(state):
            state = _reject(state, key, Verdict.UNKNOWN_UNIT, f"{parsed.unit!r} is not a unit")
        else:
            claims, dones = found.setdefault(parsed.unit, (set(), set()))
            (claims if isinstance(parsed, keys.QueueClaimKey) else dones).add(parsed.attempt)
    listing = {
        unit: Listing(claims=tuple(sorted(c)), dones=tuple(sorted(d)))
        for unit, (c, d) in found.items()
    }
    state = attrs.evolve(state, listing=listing)
    if isinstance(state.task, Ahead):
        # Claiming ahead reads no body while units nobody has touched fill the wish: a unit
        # with no claim and no done marker listed is free whatever the bodies say, and the
        # bodies peers wrote since the last scan would cost a request each (the whole point
        # of claiming ahead is to fit between two starts). Otherwise read as a Want does.
        held = frozenset(h.unit for h in state.held)
        untouched = [u for u in state.spec.units if u not in listing and u not in held]
        if len(untouched) >= _wish(state) - sum(not h.started for h in state.held):
            picks = choose(
                untouched,
                done=frozenset(),
                holders={},
                attempts={},
                used={},
                me=state.spec.node,
                live=frozenset(),
                held=frozenset(),
                ordered=state.spec.ordered,
            )
            return _claim_next(attrs.evolve(state, candidates=picks), event.now_s)
    queue, todo = state.spec.queue, []
    for unit, seen in sorted(listing.items()):
        todo += [keys.queue_done(queue, unit, a) for a in seen.dones]
        if seen.claims:
            todo.append(keys.queue_claim(queue, unit, seen.claims[-1]))
    todo = [k for k in todo if k not in state.holders and k not in state.dones]
    return _read_next(attrs.evolve(state, phase=Phase.READING, todo=tuple(todo)), event.now_s)


def _read_next(state: QueueState, now_s: float) -> Transition:
    if state.todo:
        return _issue(state, Get(req=0, key=state.todo[0]))
    if isinstance(state.task, GiveBack):
        return _give_own(state)
    return _choose_or_probe(state, now_s)


def _read(state: QueueState, event: GotObject) -> Transition:
    key, rest = state.todo[0], state.todo[1:]
    state = attrs.evolve(state, todo=rest)
    parsed = keys.parse(key)
    if event.data is None:
        # Deleted since the listing: claims are collected once their unit is done, so the
        # listing is stale; choosing from it could claim a finished unit again.
        return _scan(state)
    if isinstance(parsed, keys.QueueDoneKey):
        marker = _open_done(state, key, event.data, parsed)
        state = marker if isinstance(marker, QueueState) else state
        valid = isinstance(marker, DoneMarker)
        return _read_next(attrs.evolve(state, dones={**state.dones, key: valid}), event.now_s)
    assert isinstance(parsed, keys.QueueClaimKey)
    holder = _open_claim(state, key, event.data, parsed)
    if isinstance(holder, QueueState):
        state, holder = holder, ""
    return _read_next(attrs.evolve(state, holders={**state.holders, key: holder}), event.now_s)


def _choose_or_probe(state: QueueState, now_s: float, *, probed: bool = False) -> Transition:
    """Claim what may be claimed; first probe the leases of holders the choice depends on.

    Leases are looked at only when the units free for the taking do not fill this
    node's wish (one unit plus ``prefetch``): re-issue needs them, nothing else does.
    """
    spec = state.spec
    holders = _holders(state)
    done = _done_units(state)
    held = frozenset(h.unit for h in state.held)
    everyone = frozenset(holders.values())
    if not probed:
        free = _choose(state, holders, done, held, live=everyone)
        wish = _wish(state) - sum(not h.started for h in state.held)
        others = sorted(
            {
                node
                for unit, node in holders.items()
                if node not in ("", spec.node) and unit not in done and unit not in held
            }
        )
        if others and len(free) < wish:
            todo = tuple(keys.lease(node) for node in others)
            state = attrs.evolve(state, phase=Phase.PROBING, todo=todo)
            return _issue(state, _look(state, todo[0]))
        return _claim_next(attrs.evolve(state, candidates=free), now_s)
    live = frozenset(
        n for n, v in state.views.items() if liveness.is_live(v, now_s, spec.lease_timeout_s)
    )
    picks = _choose(state, holders, done, held, live=live)
    return _claim_next(attrs.evolve(state, candidates=picks), now_s)


def _choose(
    state: QueueState,
    holders: Mapping[str, str],
    done: frozenset[str],
    held: frozenset[str],
    *,
    live: frozenset[str],
) -> tuple[tuple[str, int], ...]:
    return choose(
        state.spec.units,
        done=done,
        holders=holders,
        attempts={u: s.claims[-1] for u, s in state.listing.items() if s.claims},
        used={u: max(s.claims + s.dones) for u, s in state.listing.items()},
        me=state.spec.node,
        live=live,
        held=held,
        ordered=state.spec.ordered,
    )


def _probed(state: QueueState, event: Probed | GotObject) -> Transition:
    """A holder's lease looked at: by its ETag, or in an authenticated run by its body, where
    a replayed or forged lease keeps no dead holder's unit from being re-issued (§16.6)."""
    key, rest = state.todo[0], state.todo[1:]
    parsed = keys.parse(key)
    assert isinstance(parsed, keys.LeaseKey)
    old = state.views.get(parsed.node)
    if isinstance(event, Probed):
        view = liveness.observe(old, event.etag, event.now_s)
    else:
        seq, _ = liveness.read_lease(state.spec.envelope, parsed.node, event.data)
        view = liveness.verified(old, event.etag, seq, event.now_s)
    state = attrs.evolve(state, todo=rest, views={**state.views, parsed.node: view})
    if rest:
        return _issue(state, _look(state, rest[0]))
    return _choose_or_probe(state, event.now_s, probed=True)


def _look(state: QueueState, key: str) -> Probe | Get:
    parsed = keys.parse(key)
    assert isinstance(parsed, keys.LeaseKey)
    return liveness.look(state.spec.envelope, 0, parsed.node)


def choose(
    units: Iterable[str],
    *,
    done: frozenset[str],
    holders: Mapping[str, str],
    attempts: Mapping[str, int],
    used: Mapping[str, int],
    me: str,
    live: frozenset[str],
    held: frozenset[str],
    ordered: bool = False,
) -> tuple[tuple[str, int], ...]:
    """The units this node may take, best first, each with the claim attempt it would write.

    ``holders`` maps a unit to the node of its highest claim (``""``: nobody);
    ``attempts`` to that claim's attempt; ``used`` to the highest attempt any claim or
    done marker of the unit has (a new claim goes past it, so that its done marker's key
    is free even when garbage sits at a lower one); ``live`` is who is live on this node's clock
    (this node included). Order: this node's own units not done (resumed under the
    attempt it holds), then units held by nobody, then units whose holder is not live
    (re-issued); within each, a node-specific order so nodes start apart (``ordered``:
    the units' own order, so the lowest free rank is taken first). Units done,
    already held here, or past the attempt limit are not offered.
    """
    ranked: list[tuple[int, str, str, int]] = []
    for unit in units:
        if unit in done or unit in held:
            continue
        holder = holders.get(unit, "")
        top = used.get(unit, -1)
        if holder == me:
            kind, attempt = 0, attempts[unit]
        elif holder == "":
            kind, attempt = 1, top + 1
        elif holder not in live:
            kind, attempt = 2, top + 1
        else:
            continue
        if attempt < keys.ATTEMPT_LIMIT:
            ranked.append((kind, unit if ordered else spread(me, unit), unit, attempt))
    return tuple((unit, attempt) for _, _, unit, attempt in sorted(ranked))


def spread(node: str, unit: str) -> str:
    """A node-specific rank of a unit: different nodes try units in different orders."""
    return hashlib.sha256(f"{node}\n{unit}".encode()).hexdigest()


def _claim_next(state: QueueState, now_s: float) -> Transition:
    spec = state.spec
    unstarted = sum(not h.started for h in state.held)
    if state.candidates and unstarted < _wish(state):
        (unit, attempt), rest = state.candidates[0], state.candidates[1:]
        state = attrs.evolve(state, candidates=rest)
        if _holders(state).get(unit) == spec.node:  # resumed: this node's claim already
            return _claim_next(_hold(state, unit, attempt, resumed=True), now_s)
        key = keys.queue_claim(spec.queue, unit, attempt)
        body = spec.envelope.seal(key, encode_claim(unit, attempt, spec.node))
        state = attrs.evolve(state, phase=Phase.CLAIMING)
        return _issue(state, PutOnce(req=0, key=key, data=body))
    state = attrs.evolve(state, candidates=())
    if isinstance(state.task, Ahead):
        return _ahead_next(state)
    waiting = [h for h in state.held if not h.started]
    if waiting:
        return _check(state, waiting[0].unit)
    if _done_units(state) >= _unit_set(state):
        return _reply(state, Outcome.EXHAUSTED)
    # Units remain, held by live peers: look again later, in case one of them dies.
    relist = List(req=state.next_req, prefix=keys.queue_units_prefix(spec.queue))
    state = attrs.evolve(state, phase=Phase.SCANNING, command=relist, next_req=relist.req + 1)
    return state, [WakeAt(at_s=now_s + spec.poll_s)]


def _claimed(state: QueueState, event: PutDone) -> Transition:
    assert isinstance(state.command, PutOnce)
    claim = keys.parse(state.command.key)
    assert isinstance(claim, keys.QueueClaimKey)
    if event.created:
        state = _hold(state, claim.unit, claim.attempt)
    # Lost the race (or the write landed with its answer lost): the next listing says whose.
    return _claim_next(state, event.now_s)


def _hold(state: QueueState, unit: str, attempt: int, *, resumed: bool = False) -> QueueState:
    held = Held(unit=unit, attempt=attempt, resumed=resumed)
    key = keys.queue_claim(state.spec.queue, unit, attempt)
    holders = {**state.holders, key: state.spec.node}
    return attrs.evolve(state, held=(*state.held, held), holders=holders)


def _start(state: QueueState, held: Held) -> Transition:
    started = attrs.evolve(held, started=True)
    state = attrs.evolve(
        state,
        held=tuple(started if h.unit == held.unit else h for h in state.held),
        current=_assigned(held),
        todo=(),
    )
    return _reply(state, Outcome.ASSIGNED)


# --- checking a unit before starting or finishing it ------------------------------------


def _check(state: QueueState, unit: str) -> Transition:
    prefix = keys.queue_unit_prefix(state.spec.queue, unit)
    state = attrs.evolve(state, phase=Phase.CHECKING, todo=(unit,))
    return _issue(state, List(req=0, prefix=prefix))


def _checked(state: QueueState, event: Listed) -> Transition:
    unit = state.todo[0]
    held = _held(state, unit)
    assert held is not None
    spec = state.spec
    claims: set[int] = set()
    dones: set[int] = set()
    for _key, parsed in _judged(state, event.keys):
        if parsed is not None and parsed.unit == unit:
            (claims if isinstance(parsed, keys.QueueClaimKey) else dones).add(parsed.attempt)
    lost = superseded(held.attempt, claims)
    task = state.task
    if isinstance(task, Want | Ahead):
        # A done marker not yet judged garbage means a peer may have finished the unit.
        queue = spec.queue
        finished = [a for a in dones if state.dones.get(keys.queue_done(queue, unit, a), True)]
        if lost or finished:
            # Re-issued or finished by a peer while it waited here: drop it, choose again
            # (claiming ahead: check the next, if any).
            state, note = _drop(state, unit, "taken over before it was started")
            if isinstance(task, Ahead):
                state, cmds = _ahead_next(state)
            else:
                state, cmds = _request(attrs.evolve(state, task=None, phase=Phase.IDLE), task)
            return state, [note, *cmds]
        if isinstance(task, Ahead):
            checked = attrs.evolve(held, checked=True)
            state = attrs.evolve(
                state, held=tuple(checked if h.unit == unit else h for h in state.held), todo=()
            )
            return _ahead_next(state)
        return _start(state, held)
    if isinstance(task, Watch):
        if not lost:  # the usual answer, every renewal interval: not worth a notice
            state = attrs.evolve(state, phase=Phase.IDLE, task=None, command=None, todo=())
            return attrs.evolve(state, outcome=Outcome.HELD), []
        state, note = _drop(state, unit, "taken over while it was trained")
        state, cmds = _reply(attrs.evolve(state, current=None), Outcome.LOST)
        return state, [note, *cmds]
    assert isinstance(task, Finish)
    if lost:
        state, note = _drop(state, unit, "taken over before it was finished: no done marker")
        state, cmds = _reply(_unassign(state, unit), Outcome.LOST)
        return state, [note, *cmds]
    key = keys.queue_done(spec.queue, unit, held.attempt)
    marker = DoneMarker(node=spec.node, attempt=held.attempt, steps=task.steps, tokens=task.tokens)
    body = spec.envelope.seal(key, encode_done(marker))
    collect = tuple(keys.queue_claim(spec.queue, unit, a) for a in sorted(claims))
    state = attrs.evolve(state, phase=Phase.MARKING, todo=collect)
    return _issue(state, PutOnce(req=0, key=key, data=body))


def superseded(attempt: int, claims: Iterable[int]) -> bool:
    """Whether the holder of claim ``attempt`` lost its unit, from the claims listed in the
    unit's folder: its own claim is gone (collected after a peer finished the unit) or a
    higher attempt exists (a peer re-issued it)."""
    listed = frozenset(claims)
    return attempt not in listed or max(listed) > attempt


def _marked(state: QueueState, event: PutDone) -> Transition:
    # Created, or there already: this attempt's own marker (its answer lost), or garbage,
    # which finishes nothing; the claims then stay, so this node resumes the unit later.
    task = state.task
    assert isinstance(task, Finish)
    collect = state.todo if event.created else ()
    state = attrs.evolve(
        _unassign(state, task.unit),
        held=tuple(h for h in state.held if h.unit != task.unit),
        todo=(),
    )
    state, cmds = _reply(state, Outcome.DONE)
    # The done marker now speaks for the unit: its claims are no longer needed.
    if not collect:
        return state, cmds
    req = state.next_req
    return attrs.evolve(state, next_req=req + 1), [*cmds, Delete(req=req, keys=collect)]


def _give_next(state: QueueState) -> Transition:
    """Give back the first unit held here and not started; reply once none is left."""
    waiting = [h for h in state.held if not h.started]
    if not waiting:
        return _reply(state, Outcome.GIVEN)
    held, spec = waiting[0], state.spec
    key = keys.queue_claim(spec.queue, held.unit, held.attempt + 1)
    if held.attempt + 1 >= keys.ATTEMPT_LIMIT:
        return _give_next(attrs.evolve(state, held=tuple(h for h in state.held if h != held)))
    body = spec.envelope.seal(key, encode_claim(held.unit, held.attempt + 1, ""))
    return _issue(state, PutOnce(req=0, key=key, data=body))


def _give_own(state: QueueState) -> Transition:
    """Give back the units held here and not started, and every unit not done whose newest
    claim names this node although this machine never claimed it: claimed before a restart
    under the same id. Left held, such a unit of an elected node, whose lease the closer
    keeps renewing, was never re-issued while the node served (the model checker's
    either_gives_back, a restart then an election before the first unit)."""
    done = _done_units(state)
    known = {h.unit for h in state.held}
    found = tuple(
        Held(unit=unit, attempt=state.listing[unit].claims[-1], resumed=True)
        for unit, node in sorted(_holders(state).items())
        if node == state.spec.node and unit not in done and unit not in known
    )
    return _give_next(attrs.evolve(state, phase=Phase.GIVING, held=state.held + found))


def _given(state: QueueState, event: PutDone) -> Transition:
    # Written, or the attempt was taken (a peer re-issued the unit): not ours either way.
    assert isinstance(state.command, PutOnce)
    claim = keys.parse(state.command.key)
    assert isinstance(claim, keys.QueueClaimKey)
    held = tuple(h for h in state.held if h.unit != claim.unit)
    given = (*state.given, claim.unit) if event.created else state.given
    return _give_next(attrs.evolve(state, held=held, command=None, given=given))


def _unassign(state: QueueState, unit: str) -> QueueState:
    """No longer training ``unit`` (a pipelined trainer may already train the next)."""
    if state.current is not None and state.current.unit == unit:
        return attrs.evolve(state, current=None)
    return state


def _drop(state: QueueState, unit: str, why: str) -> tuple[QueueState, Notify]:
    held = tuple(h for h in state.held if h.unit != unit)
    detail = f"queue {state.spec.queue!r}: unit {unit!r} {why}"
    return attrs.evolve(state, held=held, todo=()), Notify(kind="queue", round=-1, detail=detail)


# --- helpers -----------------------------------------------------------------------------


def _reply(state: QueueState, outcome: Outcome) -> Transition:
    phase = Phase.STOPPED if outcome is Outcome.EXHAUSTED else Phase.IDLE
    state = attrs.evolve(state, phase=phase, task=None, outcome=outcome, command=None)
    detail = f"queue {state.spec.queue!r}: {outcome.value}"
    if state.current is not None and outcome is Outcome.ASSIGNED:
        detail += f" unit {state.current.unit!r} (attempt {state.current.attempt})"
    return state, [Notify(kind="queue", round=-1, detail=detail)]


def _idle(state: QueueState) -> Transition:
    return attrs.evolve(state, phase=Phase.IDLE, command=None), []


def _issue(state: QueueState, command: Request) -> Transition:
    """Send ``command`` (numbered afresh) and keep it for a retry after a failure."""
    numbered = attrs.evolve(command, req=state.next_req)
    state = attrs.evolve(state, command=numbered, in_flight=True, next_req=state.next_req + 1)
    return state, [numbered]


def _held(state: QueueState, unit: str) -> Held | None:
    return next((h for h in state.held if h.unit == unit), None)


def _unit_set(state: QueueState) -> frozenset[str]:
    return frozenset(state.spec.units)


def _holders(state: QueueState) -> dict[str, str]:
    """Each listed unit's holder, by its highest claim (units whose claim is unread: nobody)."""
    queue = state.spec.queue
    return {
        unit: state.holders.get(keys.queue_claim(queue, unit, seen.claims[-1]), "")
        for unit, seen in state.listing.items()
        if seen.claims
    }


def _done_units(state: QueueState) -> frozenset[str]:
    queue = state.spec.queue
    return frozenset(
        unit
        for unit, seen in state.listing.items()
        if any(state.dones.get(keys.queue_done(queue, unit, a)) for a in seen.dones)
    )


QueueKey = keys.QueueClaimKey | keys.QueueDoneKey


def _judged(state: QueueState, listed: Iterable[str]) -> Iterable[tuple[str, QueueKey | None]]:
    """Each listed key with the claim or done key it parses as (None: anything else)."""
    for key in listed:
        try:
            parsed: keys.ParsedKey | None = keys.parse(key)
        except (keys.BadKey, TypeError):
            parsed = None
        if (
            isinstance(parsed, keys.QueueClaimKey | keys.QueueDoneKey)
            and parsed.queue == state.spec.queue
        ):
            yield key, parsed
        else:
            yield key, None


def _open(state: QueueState, key: str, data: bytes) -> bytes | QueueState:
    body = state.spec.envelope.open(key, data)
    if isinstance(body, Unauthenticated):
        return _reject(state, key, Verdict.UNAUTHENTICATED, body.detail)
    return body


def _open_done(
    state: QueueState, key: str, data: bytes, parsed: keys.QueueDoneKey
) -> DoneMarker | QueueState:
    body = _open(state, key, data)
    if isinstance(body, QueueState):
        return body
    marker = decode_done(body, parsed.attempt)
    if isinstance(marker, str):
        return _reject(state, key, Verdict.BAD_DONE, marker)
    return marker


def _open_claim(
    state: QueueState, key: str, data: bytes, parsed: keys.QueueClaimKey
) -> str | QueueState:
    body = _open(state, key, data)
    if isinstance(body, QueueState):
        return body
    node = decode_claim(body, parsed.unit, parsed.attempt)
    if node is None:
        return _reject(state, key, Verdict.BAD_CLAIM, "not a claim of this unit and attempt")
    return node


def encode_claim(unit: str, attempt: int, node: str) -> bytes:
    doc = {"format": FORMAT, "unit": unit, "attempt": attempt, "node": node}
    return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()


def decode_claim(body: bytes, unit: str, attempt: int) -> str | None:
    """The node a claim found at ``unit``'s ``attempt`` names, or None when it is not one.

    Total: no input raises. Refused: over ``BODY_MAX_BYTES``, not JSON, fields other than
    exactly format/unit/attempt/node, another format, a unit or attempt other than the
    key's, a node that is neither an id nor ``""`` (given back).
    """
    doc = codec.small_object(body, BODY_MAX_BYTES, frozenset({"format", "unit", "attempt", "node"}))
    if doc is None:
        return None
    node = doc["node"]
    if (
        type(doc["format"]) is not int
        or doc["format"] != FORMAT
        or doc["unit"] != unit
        or type(doc["attempt"]) is not int
        or doc["attempt"] != attempt
        or not isinstance(node, str)
        or not (node == "" or keys.valid_id(node))
    ):
        return None
    return node


def _reject(state: QueueState, key: str, verdict: Verdict, detail: str) -> QueueState:
    kept = (*state.rejections, Rejection(key=key, verdict=verdict, detail=detail))
    return attrs.evolve(state, rejected=state.rejected + 1, rejections=kept[-REJECTIONS_KEPT:])
