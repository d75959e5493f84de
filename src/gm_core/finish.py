"""Finding a run finished, and writing ``finished.json`` once: a node's last look at the run.

Theory of operation
-------------------
A node whose data ran out (:meth:`gm_shell.Session.run`) has closed its learner, so its
final deltas are committed; its closer still runs. This machine then decides, on the
node's own clock, whether the whole run is finished (:func:`gm_core.completion.finished`):
it lists the leases and reads each (a lease whose roles include ``learner`` is a learner;
it is live while its ETag keeps changing, :mod:`gm_core.liveness`), lists the done
markers of the run's data shape and reads those it has not judged yet. Finished: it
writes ``finished.json`` create-once (of several nodes finding it at once, one write
wins and all agree it is finished). Not finished because slices are missing: another
node still has data and will look when it ends, so this one stops looking. Not
finished only because learners are live: it looks again every ``poll_s`` until they
leave (a clean close deletes the lease; a crashed node's lease stops changing and is
judged dead after ``lease_timeout_s``) or until ``wait_s`` on its own clock has passed.

Nothing written by another machine is compared with this node's clock, and every body
read is opened under the run's envelope and judged; what does not open or decode is
rejected by name and counts for nothing (a garbage lease is no learner, a garbage done
marker finishes no slice).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping

import attrs

from gm_core import codec, completion, keys, liveness, ranks
from gm_core.auth import Envelope, Unauthenticated
from gm_core.commands import Command, Get, List, Notify, PutOnce, WakeAt
from gm_core.completion import DoneMarker, Shape, Summary
from gm_core.events import Event, GotObject, Listed, PutDone, RequestFailed, Started, TimerFired
from gm_core.records import Lease

REJECTIONS_KEPT = 16


class Outcome(enum.StrEnum):
    FINISHED = "finished"
    """The run is finished (this node's write or another's made ``finished.json``)."""
    MISSING = "missing"
    """Slices are not done yet: a node still training will look when it ends."""
    LIVE = "live"
    """Learners were still live when this node stopped looking (``wait_s``)."""


class Phase(enum.StrEnum):
    LEASES = "leases"
    READING_LEASES = "reading_leases"
    MARKERS = "markers"
    READING_MARKERS = "reading_markers"
    WRITING = "writing"
    WAITING = "waiting"
    DONE = "done"


@attrs.frozen(kw_only=True)
class Rejection:
    key: str
    detail: str


@attrs.frozen(kw_only=True)
class FinishSpec:
    """Who looks (``node``, not counted as a learner), at what data, how long, how often."""

    node: str
    shape: Shape
    queue: str = ""
    """The queue's name when ``shape`` is queued."""
    round: int
    """The newest round this node saw committed (what the summary reports)."""
    lease_timeout_s: float
    poll_s: float
    wait_s: float
    envelope: Envelope


@attrs.frozen(kw_only=True)
class FinishState:
    spec: FinishSpec
    phase: Phase = Phase.LEASES
    deadline_s: float = 0.0
    learners: frozenset[str] = frozenset()
    views: Mapping[str, liveness.LeaseView] = attrs.field(factory=dict)
    markers: Mapping[str, DoneMarker | None] = attrs.field(factory=dict)
    """Done key -> its judged marker (None: refused); create-once objects, so cached."""
    listed: tuple[str, ...] = ()
    """Done keys of the last listing."""
    todo: tuple[str, ...] = ()
    command: Get | List | PutOnce | None = None
    in_flight: bool = False
    next_req: int = 1
    verdict: completion.Verdict | None = None
    outcome: Outcome | None = None
    rejected: int = 0
    rejections: tuple[Rejection, ...] = ()


def initial(spec: FinishSpec) -> FinishState:
    return FinishState(spec=spec)


Transition = tuple[FinishState, list[Command]]


def advance(state: FinishState, event: Event) -> Transition:
    """The one transition function; total over every event (unrelated ones change nothing)."""
    if state.phase is Phase.DONE:
        return state, []
    if isinstance(event, Started):
        if state.command is not None:
            return state, []
        state = attrs.evolve(state, deadline_s=event.now_s + state.spec.wait_s)
        return _list_leases(state)
    if isinstance(event, TimerFired):
        if state.in_flight or state.command is None:
            return state, []
        return _issue(state, state.command)
    req = getattr(event, "req", None)
    if not state.in_flight or state.command is None or req != state.command.req:
        return state, []
    state = attrs.evolve(state, in_flight=False)
    if isinstance(event, RequestFailed):
        if event.now_s >= state.deadline_s:
            return _finish(state, Outcome.LIVE)  # the store is down: stop looking
        return state, [WakeAt(at_s=event.now_s + state.spec.poll_s)]
    if isinstance(event, Listed) and state.phase is Phase.LEASES:
        leases = [k for k in event.keys if _lease_node(k) not in (None, state.spec.node)]
        state = attrs.evolve(state, phase=Phase.READING_LEASES, todo=tuple(leases))
        return _next_lease(state, event.now_s, gone=_gone(state, leases))
    if isinstance(event, GotObject) and state.phase is Phase.READING_LEASES:
        return _lease_read(state, event)
    if isinstance(event, Listed) and state.phase is Phase.MARKERS:
        return _markers_listed(state, event)
    if isinstance(event, GotObject) and state.phase is Phase.READING_MARKERS:
        return _marker_read(state, event)
    if isinstance(event, PutDone) and state.phase is Phase.WRITING:
        return _finish(state, Outcome.FINISHED)
    return state, []


def _list_leases(state: FinishState) -> Transition:
    state = attrs.evolve(state, phase=Phase.LEASES)
    return _issue(state, List(req=0, prefix=keys.LEASES_PREFIX))


def _gone(state: FinishState, listed: list[str]) -> frozenset[str]:
    """Learners seen before whose lease is no longer listed: they left."""
    present = {_lease_node(k) for k in listed}
    return frozenset(n for n in state.learners if n not in present)


def _next_lease(state: FinishState, now_s: float, gone: frozenset[str] = frozenset()) -> Transition:
    views = {**state.views, **{n: liveness.observe(state.views.get(n), None, now_s) for n in gone}}
    state = attrs.evolve(state, views=views)
    if state.todo:
        return _issue(state, Get(req=0, key=state.todo[0]))
    state = attrs.evolve(state, phase=Phase.MARKERS)
    return _issue(state, List(req=0, prefix=_markers_prefix(state.spec)))


def _lease_read(state: FinishState, event: GotObject) -> Transition:
    key, rest = state.todo[0], state.todo[1:]
    node = _lease_node(key)
    assert node is not None
    state = attrs.evolve(state, todo=rest)
    view = liveness.observe(state.views.get(node), event.etag, event.now_s)
    state = attrs.evolve(state, views={**state.views, node: view})
    if event.data is not None and node not in state.learners:
        lease = _open_lease(state, key, event.data, node)
        if isinstance(lease, FinishState):
            state = lease
        elif "learner" in lease.roles:
            state = attrs.evolve(state, learners=state.learners | {node})
    return _next_lease(state, event.now_s)


def _open_lease(state: FinishState, key: str, data: bytes, node: str) -> Lease | FinishState:
    body = state.spec.envelope.open(key, data)
    if isinstance(body, Unauthenticated):
        return _reject(state, key, body.detail)
    try:
        lease = codec.decode(Lease, body)
    except codec.CodecError as error:
        return _reject(state, key, f"not a lease: {error}")
    if lease.node != node:
        return _reject(state, key, f"a lease naming {lease.node!r}")
    return lease


def _markers_listed(state: FinishState, event: Listed) -> Transition:
    listed = tuple(k for k in event.keys if _slice_of(state.spec, k) is not None)
    todo = tuple(k for k in listed if k not in state.markers)
    state = attrs.evolve(state, phase=Phase.READING_MARKERS, listed=listed, todo=todo)
    return _next_marker(state, event.now_s)


def _next_marker(state: FinishState, now_s: float) -> Transition:
    if state.todo:
        return _issue(state, Get(req=0, key=state.todo[0]))
    return _judge(state, now_s)


def _marker_read(state: FinishState, event: GotObject) -> Transition:
    key, rest = state.todo[0], state.todo[1:]
    state = attrs.evolve(state, todo=rest)
    found = _slice_of(state.spec, key)
    assert found is not None
    marker: DoneMarker | None = None
    if event.data is not None:
        body = state.spec.envelope.open(key, event.data)
        decoded = body.detail if isinstance(body, Unauthenticated) else None
        if isinstance(body, bytes):
            got = completion.decode_done(body, found[1])
            decoded, marker = (got, None) if isinstance(got, str) else (None, got)
        if decoded is not None:
            state = _reject(state, key, decoded)
    return _next_marker(attrs.evolve(state, markers={**state.markers, key: marker}), event.now_s)


def _judge(state: FinishState, now_s: float) -> Transition:
    spec = state.spec
    by_slice: dict[completion.Slice, dict[int, DoneMarker | None]] = {}
    for key in state.listed:
        found = _slice_of(spec, key)
        assert found is not None
        by_slice.setdefault(found[0], {})[found[1]] = state.markers.get(key)
    live = frozenset(
        n
        for n in state.learners
        if liveness.is_live(state.views.get(n), now_s, spec.lease_timeout_s)
    )
    verdict = completion.finished(spec.shape, by_slice, live)
    state = attrs.evolve(state, verdict=verdict)
    if isinstance(verdict, completion.Finished):
        summary = Summary(
            by=spec.node,
            round=spec.round,
            slices=len(verdict.counted),
            steps=verdict.steps,
            tokens=verdict.tokens,
        )
        key = keys.finished()
        data = spec.envelope.seal(key, completion.encode_summary(summary))
        return _issue(attrs.evolve(state, phase=Phase.WRITING), PutOnce(req=0, key=key, data=data))
    if verdict.missing_count:
        return _finish(state, Outcome.MISSING)
    if now_s >= state.deadline_s:
        return _finish(state, Outcome.LIVE)
    relist = List(req=state.next_req, prefix=keys.LEASES_PREFIX)
    state = attrs.evolve(state, phase=Phase.LEASES, command=relist, next_req=relist.req + 1)
    return state, [WakeAt(at_s=min(now_s + spec.poll_s, state.deadline_s))]


def _markers_prefix(spec: FinishSpec) -> str:
    if isinstance(spec.shape, completion.Queued):
        return keys.queue_units_prefix(spec.queue)
    if isinstance(spec.shape, completion.Ranked):
        return keys.queue_units_prefix(ranks.QUEUE)
    return keys.DONE_PREFIX


def _slice_of(spec: FinishSpec, key: str) -> tuple[completion.Slice, int] | None:
    """The slice and attempt a done key is for (None: not a done marker of this shape)."""
    parsed = _parse(key)
    if isinstance(spec.shape, completion.Queued):
        if isinstance(parsed, keys.QueueDoneKey) and parsed.queue == spec.queue:
            return parsed.unit, parsed.attempt
        return None
    if isinstance(spec.shape, completion.Ranked):
        if isinstance(parsed, keys.QueueDoneKey) and parsed.queue == ranks.QUEUE:
            rank = ranks.rank_of(parsed.unit)
            return None if rank is None else (rank, parsed.attempt)
        return None
    if isinstance(parsed, keys.DoneKey):
        return parsed.node, 0
    return None


def _lease_node(key: str) -> str | None:
    parsed = _parse(key)
    return parsed.node if isinstance(parsed, keys.LeaseKey) else None


def _parse(key: str) -> keys.ParsedKey | None:
    try:
        return keys.parse(key)
    except (keys.BadKey, TypeError):
        return None


def _issue(state: FinishState, command: Get | List | PutOnce) -> Transition:
    numbered = attrs.evolve(command, req=state.next_req)
    state = attrs.evolve(state, command=numbered, in_flight=True, next_req=state.next_req + 1)
    return state, [numbered]


def _finish(state: FinishState, outcome: Outcome) -> Transition:
    state = attrs.evolve(state, phase=Phase.DONE, outcome=outcome, in_flight=False)
    return state, [Notify(kind="finish", round=state.spec.round, detail=describe(state))]


def describe(state: FinishState) -> str:
    """One line saying what the node found."""
    verdict = state.verdict
    if state.outcome is Outcome.FINISHED and isinstance(verdict, completion.Finished):
        return (
            f"the run is finished: {len(verdict.counted)} slices done, "
            f"{verdict.steps} steps, {verdict.tokens} counted"
        )
    if isinstance(verdict, completion.NotFinished):
        if verdict.missing_count:
            shown = ", ".join(map(str, verdict.missing))
            return f"not finished: {verdict.missing_count} slices not done ({shown})"
        return f"not finished: learners still live ({', '.join(verdict.live)})"
    return f"not finished: {state.outcome}"


def _reject(state: FinishState, key: str, detail: str) -> FinishState:
    kept = (*state.rejections, Rejection(key=key, detail=detail))
    return attrs.evolve(state, rejected=state.rejected + 1, rejections=kept[-REJECTIONS_KEPT:])
