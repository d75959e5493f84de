"""Exhaustive search over shared-queue and rank consumers: every interleaving, clock and fault.

Theory of operation
-------------------
A :class:`World` is a few nodes consuming one queue (:mod:`gm_core.queue`) over the model
store — or, with ``ranks``, the run's ranks (:mod:`gm_core.ranks`: lowest first, one per
node, watched while trained). Each node has **its own clock**, moved only by its own timer,
and a lease whose ETag changes whenever its clock moves forward or it renews (``renew``,
bounded by ``renewals``): a node that neither waits nor renews looks dead to a peer after
``timeout_s`` on the peer's clock, exactly as a paused or slow process does, so re-issue
over a holder that is still training is part of every search. Clocks stop at
``max_time_s`` (a timer past it never fires), which bounds the search.

From each world the actions are: deliver one request in flight, deliver it but lose the
response (``losses``), fire one node's timer, let one idle node's trainer act (ask for a
unit, or finish the one it trains; with ``pipelined``, the next of the steps
``Session.run``'s consumer takes: the ended unit's marker, a claim ahead, a unit's end, a
start), watch the rank it trains (``watches``, ranks only), renew a lease, or crash a node
and restart it under the same id remembering nothing (``crashes``). Breadth first, with the
world's canonical value as its fingerprint (the store's ETags and write counter left out:
the leases' ETags are the nodes' renewal counts), so the first violation found has a
shortest trace.

Checked in every world (:func:`violations`), restated from spec/coordination.md §2.5 and
§3.4 rather than calling the queue's rules:

- **no_done_without_claim**: every valid done marker ``done/k`` was created by the node the
  newest claim ``k`` created before it named (ghost history);
- **done_only_when_held**: a node writes ``done/k`` only if the last listing of its unit it
  judged showed claim ``k`` as the unit's highest (it never writes after seeing a higher
  attempt or its own claim gone);
- **held_is_highest** (ranks: ``rank_single_holder``): whenever a node is told it holds a
  unit — assigned, or "held" by a watch — its claim is, at that instant, the highest claim
  of the unit in the store and names it: two nodes are never both told so at once.

- **finished_sound** (with ``looks``): ``finished.json`` is created only once every unit
  (rank) has a valid done marker in the store, and it counts exactly the counted
  completions (the lowest valid attempt of each) and their tokens. A node whose data ran
  out — a queue node told ``exhausted``, a ranked node once its rank is done, which then
  trains nothing more, as :meth:`gm_shell.Session.run` — deletes its lease and may *look*
  (:mod:`gm_core.finish`); leases here are the nodes' renewal counts, listed and read like
  objects (a serving node's says ``closer``). **The lease half**, restated from ghost
  clocks (``World.renewed``, ``World.quiet``): at the instant a node decides the run is
  finished, every other learner has left, or its lease went ``timeout_s`` of the deciding
  node's clock without a change at some stretch since the look began
  (:func:`_live_at_finish`).
- **either_gives_back** (with ``elections``): an ``either`` node elected closer gives back
  its unstarted units (:class:`gm_core.queue.GiveBack`, sent only between units, as
  ``Session.run`` does); when that is done, no unit without a done marker has its newest
  claim naming the node. A serving node trains nothing until relieved (an action; a fair
  run relieves it when nothing else is left, as the closer does with no other learner live).

Checked where nothing is left to do (:func:`stuck`): every unit has a counted completion
(not with ranked looks: a ranked node leaves after its one rank, and a rank nobody is left
to take stays open, which is what finished_sound is about).
"""

from __future__ import annotations

import attrs

from gm_core import auth, completion, finish, keys, queue, ranks
from gm_core.check import search
from gm_core.commands import Command, Delete, Get, List, Probe, PutOnce, WakeAt
from gm_core.election import ELECTED
from gm_core.events import (
    Event,
    GotObject,
    Listed,
    Probed,
    RequestFailed,
    Started,
    TimerFired,
)
from gm_core.records import Lease
from gm_core.store_model import ModelStore

NAME = "q"
ENVELOPE = auth.for_run("check", None)


@attrs.frozen(kw_only=True)
class QueueBounds:
    nodes: int
    units: int
    ranks: bool = False
    """The run's ranks (lowest first, no prefetch, watches) instead of a queue of units."""
    prefetch: int = 0
    timeout_s: float = 0.5
    """Under one poll: a lease seen unchanged at two looks, one poll apart, is dead."""
    poll_s: float = 1.0
    max_time_s: float = 1.0
    crashes: int = 0
    losses: int = 0
    renewals: int = 0
    watches: int = 0
    looks: int = 0
    """Looks at whether the run is finished, by nodes whose data ran out (finished_sound)."""
    elections: int = 0
    """Times an idle node may be elected closer and give its units back (either_gives_back)."""
    pipelined: bool = False
    """Trainers as ``Session.run`` drives a queue (:class:`gm_core.queue.Ahead`): a unit
    ended, the next started (at once when it was checked ahead), the ended one finished
    after, then claims ahead. Not with ``elections`` or ``ranks``."""
    max_states: int = 2_000_000

    def __attrs_post_init__(self) -> None:
        if self.pipelined and (self.elections or self.ranks):
            raise ValueError("pipelined trainers are modelled without elections and ranks")


@attrs.frozen(kw_only=True)
class Node:
    state: queue.QueueState
    clock_s: float
    timer_s: float | None
    epoch: int
    """The lease's renewal count: its ETag."""
    seen_top: tuple[tuple[str, int], ...] = ()
    """Per unit, the highest claim attempt the node's last judged listing of it showed (-1:
    its own claim missing)."""
    serving: bool = False
    """Elected closer (``elections``): it trains nothing until relieved."""
    finisher: finish.FinishState | None = None
    """Its look at whether the run is finished (``looks``), once its data ran out."""
    finisher_timer_s: float | None = None
    ending: queue.Finish | None = None
    """Pipelined: the unit its trainer ended, whose done marker is still to be written."""
    ahead: bool = False
    """Pipelined: it has claimed ahead since its unit started."""


@attrs.frozen(kw_only=True)
class World:
    store: ModelStore
    nodes: tuple[Node, ...]
    inflight: tuple[tuple[int, int, Command, str], ...]
    """(node, incarnation, command, machine) in flight; the machine is ``"q"`` (the queue's)
    or ``"f"`` (the finish look's)."""
    incarnations: tuple[int, ...]
    crashes: int
    losses: int
    renewals: int
    watches: int
    looks: int = 0
    elections: int = 0
    bad: tuple[str, ...] = ()
    """What went wrong at the instant it happened (a node told it holds a unit that is not
    its; a done marker sent after judging another claim highest)."""
    renewed: tuple[tuple[float, ...], ...] = ()
    """Ghost, with ``looks`` (finished_sound's lease half): ``renewed[i][j]`` is node ``i``'s
    clock when node ``j``'s lease last changed, or when ``i`` began its look if later."""
    quiet: tuple[tuple[float, ...], ...] = ()
    """Ghost, with ``looks``: ``quiet[i][j]`` is the longest stretch of ``i``'s clock without
    a change of ``j``'s lease since ``i`` began its look."""


Action = tuple[str, int]
"""``("deliver" | "lose", index)`` into in-flight, or ``("fire" | "act" | "watch" |
"renew" | "crash" | "look" | "fire-look" | "elect" | "relieve", node)``."""


def names(bounds: QueueBounds) -> list[str]:
    return [f"n{i}" for i in range(bounds.nodes)]


def units(bounds: QueueBounds) -> tuple[str, ...]:
    if bounds.ranks:
        return tuple(ranks.unit(r) for r in range(bounds.units))
    return tuple(f"u{i}" for i in range(bounds.units))


def _queue_name(bounds: QueueBounds) -> str:
    return ranks.QUEUE if bounds.ranks else NAME


def _spec(bounds: QueueBounds, index: int) -> queue.QueueSpec:
    return queue.QueueSpec(
        queue=_queue_name(bounds),
        node=names(bounds)[index],
        units=units(bounds),
        prefetch=0 if bounds.ranks else bounds.prefetch,
        lease_timeout_s=bounds.timeout_s,
        poll_s=bounds.poll_s,
        envelope=ENVELOPE,
        ordered=bounds.ranks,
    )


def initial(bounds: QueueBounds) -> World:
    world = World(
        store=ModelStore(),
        nodes=(),
        inflight=(),
        incarnations=(0,) * bounds.nodes,
        crashes=bounds.crashes,
        losses=bounds.losses,
        renewals=bounds.renewals,
        watches=bounds.watches if bounds.ranks else 0,
        looks=bounds.looks,
        elections=0 if bounds.ranks else bounds.elections,
        renewed=((0.0,) * bounds.nodes,) * bounds.nodes if bounds.looks else (),
        quiet=((0.0,) * bounds.nodes,) * bounds.nodes if bounds.looks else (),
    )
    for index in range(bounds.nodes):
        world = _start(world, bounds, index, clock_s=0.0, epoch=0)
    return world


def _start(world: World, bounds: QueueBounds, index: int, clock_s: float, epoch: int) -> World:
    fresh = Node(
        state=queue.initial(_spec(bounds, index)), clock_s=clock_s, timer_s=None, epoch=epoch
    )
    nodes = list(world.nodes)
    if index < len(nodes):
        nodes[index] = fresh
    else:
        nodes.append(fresh)
    return _feed(attrs.evolve(world, nodes=tuple(nodes)), bounds, index, Started(now_s=clock_s))


def _feed(world: World, bounds: QueueBounds, index: int, event: queue.QueueEvent) -> World:
    node = world.nodes[index]
    before = node.state
    try:
        state, cmds = queue.advance(before, event)
    except ValueError as error:  # the trainer follows the shell's order: the machine is wrong
        return attrs.evolve(world, bad=(*world.bad, f"{names(bounds)[index]}'s queue: {error}"))
    timer_s = node.timer_s
    inflight = list(world.inflight)
    bad = list(world.bad)
    name = names(bounds)[index]
    seen_top = dict(node.seen_top)
    if before.phase is queue.Phase.CHECKING and isinstance(event, Listed):
        unit = before.todo[0]
        seen_top[unit] = _top_seen(bounds, event.keys, unit, _attempt(before, unit))
    for cmd in cmds:
        if isinstance(cmd, WakeAt):
            timer_s = cmd.at_s
        elif isinstance(cmd, Get | PutOnce | List | Delete | Probe):
            inflight.append((index, world.incarnations[index], cmd, "q"))
            done = _parse(cmd.key) if isinstance(cmd, PutOnce) else None
            if isinstance(done, keys.QueueDoneKey):
                top = seen_top.get(done.unit, -1)
                if top != done.attempt:  # done_only_when_held
                    bad.append(
                        f"{name} sent {done.unit} done/{done.attempt} after judging "
                        f"claim {top} highest"
                    )
    giving = isinstance(before.task, queue.GiveBack) or isinstance(event, queue.GiveBack)
    if giving and state.task is None:
        bad.extend(_kept(world.store, bounds, name))  # either_gives_back
    checked = before.phase is queue.Phase.CHECKING and isinstance(event, Listed)
    told = state.outcome in (queue.Outcome.ASSIGNED, queue.Outcome.HELD)
    if checked and told and state.current is not None:
        unit, attempt = state.current.unit, state.current.attempt
        top, holder = _highest(world.store, bounds, unit)
        if (top, holder) != (attempt, name):  # held_is_highest
            bad.append(
                f"{name} told it holds {unit} under claim {attempt} while claim {top} "
                f"of {holder or 'nobody'} was the highest"
            )
    nodes = list(world.nodes)
    nodes[index] = attrs.evolve(
        node, state=state, timer_s=timer_s, seen_top=tuple(sorted(seen_top.items()))
    )
    return attrs.evolve(world, nodes=tuple(nodes), inflight=tuple(inflight), bad=tuple(bad))


def _kept(store: ModelStore, bounds: QueueBounds, name: str) -> list[str]:
    """Units not done whose newest claim still names ``name``, which has given its units
    back and trains none (restated: the claims and done markers in the store now)."""
    out = []
    for unit in units(bounds):
        top, holder = _highest(store, bounds, unit)
        prefix = keys.queue_unit_prefix(_queue_name(bounds), unit)
        done = any(isinstance(_parse(k), keys.QueueDoneKey) for k in store.list(prefix))
        if holder == name and not done:
            out.append(f"{name} serves still holding {unit} under claim {top}, not started")
    return out


def _ended(node: Node, bounds: QueueBounds) -> bool:
    """Whether the node's data ran out (with ``looks``): it trains nothing more, its learner
    closed (lease deleted), and it may look at whether the run is finished."""
    if not bounds.looks:
        return False
    if bounds.ranks:
        return node.state.outcome is queue.Outcome.DONE
    return node.state.outcome is queue.Outcome.EXHAUSTED


def _feed_finisher(world: World, bounds: QueueBounds, index: int, event: Event) -> World:
    node = world.nodes[index]
    assert node.finisher is not None
    state, cmds = finish.advance(node.finisher, event)
    timer_s = node.finisher_timer_s
    inflight = list(world.inflight)
    bad = list(world.bad)
    for cmd in cmds:
        if isinstance(cmd, WakeAt):
            timer_s = cmd.at_s
        elif isinstance(cmd, Get | PutOnce | List):
            inflight.append((index, world.incarnations[index], cmd, "f"))
            if isinstance(cmd, PutOnce) and cmd.key == keys.finished():
                bad.extend(_live_at_finish(world, bounds, index))
    nodes = list(world.nodes)
    nodes[index] = attrs.evolve(node, finisher=state, finisher_timer_s=timer_s)
    return attrs.evolve(world, nodes=tuple(nodes), inflight=tuple(inflight), bad=tuple(bad))


def _live_at_finish(world: World, bounds: QueueBounds, index: int) -> list[str]:
    """finished_sound's lease half, at the instant node ``index`` decides the run is finished
    (sends ``finished.json``): every other learner has left (its data ran out: lease
    deleted), or its lease stopped during the look, i.e. went ``timeout_s`` of the deciding
    node's clock without a change at some stretch since the look began. Restated from ghost
    clocks, not from what the look observed (a look sees a change no earlier than it
    happened, and reads every lease again in its last pass, so a sound look passes; a lease
    that changes after that last read, at the very instant of the decision, is a paused
    node resuming, which no timeout can tell from a dead one)."""
    now_s = world.nodes[index].clock_s
    return [
        f"{names(bounds)[index]} decided the run finished at {now_s} while "
        f"{names(bounds)[j]} was live (its lease changed at {world.renewed[index][j]} on "
        f"{names(bounds)[index]}'s clock, never quiet for {bounds.timeout_s} in the look)"
        for j, other in enumerate(world.nodes)
        if j != index
        and not other.serving
        and not _ended(other, bounds)
        and max(world.quiet[index][j], now_s - world.renewed[index][j]) < bounds.timeout_s
    ]


def _renewed(world: World, index: int) -> World:
    """Node ``index``'s lease changed: every node's stretch without a change of it ends at
    its clock now (with ``looks``)."""
    if not world.renewed:
        return world
    quiet = tuple(
        (*q[:index], max(q[index], node.clock_s - r[index]), *q[index + 1 :])
        for q, r, node in zip(world.quiet, world.renewed, world.nodes, strict=True)
    )
    renewed = tuple(
        (*row[:index], node.clock_s, *row[index + 1 :])
        for row, node in zip(world.renewed, world.nodes, strict=True)
    )
    return attrs.evolve(world, renewed=renewed, quiet=quiet)


def _look(world: World, bounds: QueueBounds, index: int) -> World:
    shape: completion.Shape = (
        completion.Ranked(bounds.units)
        if bounds.ranks
        else completion.Queued(frozenset(units(bounds)))
    )
    spec = finish.FinishSpec(
        node=names(bounds)[index],
        shape=shape,
        queue=_queue_name(bounds),
        round=0,
        lease_timeout_s=bounds.timeout_s,
        poll_s=bounds.poll_s,
        wait_s=2 * bounds.timeout_s,
        envelope=ENVELOPE,
    )
    node = world.nodes[index]
    nodes = list(world.nodes)
    nodes[index] = attrs.evolve(node, finisher=finish.initial(spec))
    world = attrs.evolve(world, nodes=tuple(nodes), looks=world.looks - 1)
    if world.renewed:  # the look's stretches start now
        renewed = list(world.renewed)
        quiet = list(world.quiet)
        renewed[index] = (node.clock_s,) * len(world.nodes)
        quiet[index] = (0.0,) * len(world.nodes)
        world = attrs.evolve(world, renewed=tuple(renewed), quiet=tuple(quiet))
    return _feed_finisher(world, bounds, index, Started(now_s=node.clock_s))


def _attempt(state: queue.QueueState, unit: str) -> int:
    return next(h.attempt for h in state.held if h.unit == unit)


def _top_seen(bounds: QueueBounds, listed: tuple[str, ...], unit: str, mine: int) -> int:
    claims = [
        p.attempt
        for k in listed
        if isinstance(p := _parse(k), keys.QueueClaimKey)
        and p.queue == _queue_name(bounds)
        and p.unit == unit
    ]
    return max(claims) if mine in claims else -1


def _highest(store: ModelStore, bounds: QueueBounds, unit: str) -> tuple[int, str]:
    """The unit's highest claim in the store now, and the node its body names."""
    top = -1
    for key in store.list(keys.queue_unit_prefix(_queue_name(bounds), unit)):
        parsed = _parse(key)
        if isinstance(parsed, keys.QueueClaimKey):
            top = max(top, parsed.attempt)
    if top < 0:
        return -1, ""
    key = keys.queue_claim(_queue_name(bounds), unit, top)
    got = store.get(key)
    assert got is not None
    return top, _claim_node(key, got.data, unit, top)


def _claim_node(key: str, data: bytes, unit: str, attempt: int) -> str:
    body = ENVELOPE.open(key, data)
    if not isinstance(body, bytes):
        return ""
    return queue.decode_claim(body, unit, attempt) or ""


def _parse(key: str) -> keys.ParsedKey | None:
    try:
        return keys.parse(key)
    except keys.BadKey:
        return None


def _quiet(node: Node) -> bool:
    """Its queue machine waits for the trainer."""
    return node.state.phase is queue.Phase.IDLE and node.state.task is None


def _idle(node: Node, bounds: QueueBounds) -> bool:
    """Its trainer may act: the queue waits for it, it is not serving, its data not done."""
    return _quiet(node) and not node.serving and not _ended(node, bounds)


def actions(world: World, bounds: QueueBounds) -> list[Action]:
    out: list[Action] = []
    for i in range(len(world.inflight)):
        out.append(("deliver", i))
        if world.losses > 0:
            out.append(("lose", i))
    for index, node in enumerate(world.nodes):
        if node.timer_s is not None and node.timer_s <= bounds.max_time_s:
            out.append(("fire", index))
        if node.finisher_timer_s is not None and node.finisher_timer_s <= bounds.max_time_s:
            out.append(("fire-look", index))
        if _idle(node, bounds):
            out.append(("act", index))
            if world.watches > 0 and node.state.current is not None:
                out.append(("watch", index))
            if world.elections > 0 and node.state.current is None:
                out.append(("elect", index))
        if node.serving and _quiet(node):
            out.append(("relieve", index))
        if world.looks > 0 and node.finisher is None and _ended(node, bounds):
            out.append(("look", index))
        if world.renewals > 0:
            out.append(("renew", index))
        if world.crashes > 0:
            out.append(("crash", index))
    return out


def step(world: World, bounds: QueueBounds, action: Action) -> World:
    kind, at = action
    if kind in ("fire", "act", "watch", "renew", "fire-look", "elect", "relieve"):
        return _node_action(world, bounds, kind, at)
    if kind == "look":
        return _look(world, bounds, at)
    if kind == "crash":
        incarnations = list(world.incarnations)
        incarnations[at] += 1
        inflight = tuple(item for item in world.inflight if item[0] != at)
        node = world.nodes[at]
        world = attrs.evolve(
            world, incarnations=tuple(incarnations), inflight=inflight, crashes=world.crashes - 1
        )
        return _start(world, bounds, at, node.clock_s, node.epoch)
    index, incarnation, cmd, machine = world.inflight[at]
    world = attrs.evolve(world, inflight=world.inflight[:at] + world.inflight[at + 1 :])
    node = world.nodes[index]
    store, outcome = _execute(world.store, world.nodes, bounds, cmd, node.clock_s)
    world = attrs.evolve(world, store=store)
    if kind == "lose":
        req = getattr(cmd, "req", 0)
        outcome = RequestFailed(now_s=node.clock_s, req=req, error="lost")
        world = attrs.evolve(world, losses=world.losses - 1)
    if incarnation != world.incarnations[index]:
        return world  # the node that asked has crashed since
    if machine == "f":
        return _feed_finisher(world, bounds, index, outcome)
    return _feed(world, bounds, index, outcome)


def _node_action(world: World, bounds: QueueBounds, kind: str, at: int) -> World:
    node = world.nodes[at]
    nodes = list(world.nodes)
    if kind == "renew":
        nodes[at] = attrs.evolve(node, epoch=node.epoch + 1)
        world = attrs.evolve(world, nodes=tuple(nodes), renewals=world.renewals - 1)
        return _renewed(world, at)
    if kind == "fire":
        assert node.timer_s is not None
        clock_s = max(node.clock_s, node.timer_s)
        epoch = node.epoch + (clock_s > node.clock_s)  # time passing here renews the lease
        nodes[at] = attrs.evolve(node, clock_s=clock_s, timer_s=None, epoch=epoch)
        world = attrs.evolve(world, nodes=tuple(nodes))
        if epoch != node.epoch:
            world = _renewed(world, at)
        return _feed(world, bounds, at, TimerFired(now_s=clock_s))
    if kind == "fire-look":
        assert node.finisher_timer_s is not None
        clock_s = max(node.clock_s, node.finisher_timer_s)
        nodes[at] = attrs.evolve(node, clock_s=clock_s, finisher_timer_s=None)
        world = attrs.evolve(world, nodes=tuple(nodes))
        return _feed_finisher(world, bounds, at, TimerFired(now_s=clock_s))
    if kind == "relieve":
        nodes[at] = attrs.evolve(node, serving=False)
        return attrs.evolve(world, nodes=tuple(nodes))
    now_s = node.clock_s
    if kind == "elect":
        nodes[at] = attrs.evolve(node, serving=True)
        world = attrs.evolve(world, nodes=tuple(nodes), elections=world.elections - 1)
        return _feed(world, bounds, at, queue.GiveBack(now_s=now_s))
    if kind == "watch":
        world = attrs.evolve(world, watches=world.watches - 1)
        return _feed(world, bounds, at, queue.Watch(now_s=now_s))
    current = node.state.current
    if bounds.pipelined:
        return _act_pipelined(world, bounds, at)
    if current is None:
        return _feed(world, bounds, at, queue.Want(now_s=now_s))
    tokens = units(bounds).index(current.unit) + 1
    return _feed(
        world, bounds, at, queue.Finish(now_s=now_s, unit=current.unit, steps=1, tokens=tokens)
    )


def _act_pipelined(world: World, bounds: QueueBounds, at: int) -> World:
    """The trainer's next step as ``gm_shell.queue.Consumer`` takes them for ``Session.run``:
    after a start, the ended unit's marker and then the claim ahead; at a unit's end,
    :class:`~gm_core.queue.Ended`, then a start at once if one was checked ahead, else the
    ended unit's marker first and a :class:`~gm_core.queue.Want` that may wait."""
    node = world.nodes[at]
    now_s, current, ending = node.clock_s, node.state.current, node.ending
    event: queue.QueueEvent
    if current is not None and not node.ahead and ending is not None:
        node, event = attrs.evolve(node, ending=None), ending
    elif current is not None and not node.ahead:
        node, event = attrs.evolve(node, ahead=True), queue.Ahead(now_s=now_s)
    elif current is not None:
        tokens = units(bounds).index(current.unit) + 1
        ending = queue.Finish(now_s=now_s, unit=current.unit, steps=1, tokens=tokens)
        node = attrs.evolve(node, ending=ending, ahead=False)
        event = queue.Ended(now_s=now_s, unit=current.unit)
    elif ending is not None and not queue.ready(node.state):
        node, event = attrs.evolve(node, ending=None), ending
    else:
        event = queue.Want(now_s=now_s)
    nodes = list(world.nodes)
    nodes[at] = node
    return _feed(attrs.evolve(world, nodes=tuple(nodes)), bounds, at, event)


def _execute(
    store: ModelStore, nodes: tuple[Node, ...], bounds: QueueBounds, cmd: Command, now_s: float
) -> tuple[ModelStore, Event]:
    """A request's outcome. Leases are not objects here: a lease's ETag is its node's renewal
    count, and a node whose data ran out has none (its learner deleted it)."""
    leases = [n for n in range(len(nodes)) if not _ended(nodes[n], bounds)]
    if isinstance(cmd, List) and cmd.prefix == keys.LEASES_PREFIX:
        found = tuple(sorted(keys.lease(names(bounds)[n]) for n in leases))
        return store, Listed(now_s=now_s, req=cmd.req, keys=found)
    if not isinstance(cmd, Probe | Get) or not isinstance(lease := _parse(cmd.key), keys.LeaseKey):
        return search.execute(store, cmd, now_s)
    index = int(lease.node[1:])
    etag = f"l{nodes[index].epoch}" if index in leases else None
    if isinstance(cmd, Probe):
        return store, Probed(now_s=now_s, req=cmd.req, etag=etag)
    roles = ELECTED if nodes[index].serving else ("learner",)
    body = Lease(node=lease.node, roles=roles, seq=nodes[index].epoch, renew_s=1.0)
    data = None if etag is None else ENVELOPE.pack(cmd.key, body)
    return store, GotObject(now_s=now_s, req=cmd.req, data=data, etag=etag)


def _freeze(value: object) -> object:
    """A hashable canonical form of a machine's state (its mappings as sorted items; its
    spec, the same in every world, left out)."""
    if attrs.has(type(value)):
        names = [f.name for f in attrs.fields(type(value)) if f.name != "spec"]  # type: ignore[arg-type]
        return tuple(_freeze(getattr(value, name)) for name in names)
    if isinstance(value, dict):
        return tuple(sorted((k, _freeze(v)) for k, v in value.items()))
    if isinstance(value, tuple):
        return tuple(_freeze(v) for v in value)
    return value


def fingerprint(world: World) -> object:
    objects = tuple(sorted((k, v.data) for k, v in world.store.objects.items()))
    created = tuple(k for k, _ in world.store.created)
    return (
        objects,
        created,
        _freeze(world.nodes),
        world.inflight,
        world.incarnations,
        world.crashes,
        world.losses,
        world.renewals,
        world.watches,
        world.looks,
        world.elections,
        world.bad,
        world.renewed,
        world.quiet,
    )


def violations(world: World, bounds: QueueBounds) -> list[str]:
    out = []
    claims: dict[tuple[str, int], str] = {}
    dones: dict[str, dict[int, completion.DoneMarker]] = {}
    for key, data in world.store.created:
        parsed = _parse(key)
        if key == keys.finished():
            out.extend(_finished_unsound(bounds, data, dones))
        elif isinstance(parsed, keys.QueueClaimKey):
            claims[parsed.unit, parsed.attempt] = _claim_node(
                key, data, parsed.unit, parsed.attempt
            )
        elif isinstance(parsed, keys.QueueDoneKey):
            body = ENVELOPE.open(key, data)
            marker = completion.decode_done(body, parsed.attempt) if isinstance(body, bytes) else ""
            writer = claims.get((parsed.unit, parsed.attempt))
            if isinstance(marker, completion.DoneMarker):
                dones.setdefault(parsed.unit, {})[parsed.attempt] = marker
                if marker.node != writer:
                    out.append(
                        f"{marker.node} wrote {parsed.unit} done/{parsed.attempt}, "
                        f"claimed by {writer or 'nobody'}"
                    )
    return [*world.bad, *out]


def _finished_unsound(
    bounds: QueueBounds, data: bytes, dones: dict[str, dict[int, completion.DoneMarker]]
) -> list[str]:
    """finished_sound, at the instant ``finished.json`` was created: ``dones`` holds the valid
    done markers created before it, by unit and attempt (restated: the lowest counts)."""
    missing = [u for u in units(bounds) if not dones.get(u)]
    if missing:
        return [f"finished.json written with {', '.join(missing)} not done"]
    body = ENVELOPE.open(keys.finished(), data)
    summary = completion.decode_summary(body) if isinstance(body, bytes) else "unopened"
    if not isinstance(summary, completion.Summary):
        return [f"finished.json unreadable: {summary}"]
    counted = [dones[u][min(dones[u])] for u in units(bounds)]
    tokens, steps = sum(m.tokens for m in counted), sum(m.steps for m in counted)
    if (summary.slices, summary.steps, summary.tokens) != (len(counted), steps, tokens):
        return [
            f"finished.json counts {summary.slices} slices, {summary.steps} steps, "
            f"{summary.tokens} tokens; the counted completions are {len(counted)}, {steps}, "
            f"{tokens}"
        ]
    return []


def stuck(world: World, bounds: QueueBounds) -> list[str]:
    """Where nothing is left to do within the horizon — nothing in flight, no trainer free
    to act, no timer due before it — a fair run from here (deliveries in order, trainers
    acting, timers firing past the horizon, no more faults) gives every unit a counted
    completion."""
    if world.inflight or any(_idle(n, bounds) for n in world.nodes):
        return []
    if any(n.timer_s is not None and n.timer_s <= bounds.max_time_s for n in world.nodes):
        return []
    world, quiet = _fair_run(world, bounds)
    out = list(world.bad)
    if not quiet:
        out.append(f"a fair run does not come to rest in {FAIR_RUN_STEPS} steps")
    if bounds.ranks and bounds.looks:
        return out
    markers: dict[completion.Slice, dict[int, completion.DoneMarker | None]] = {}
    for key in world.store.list(keys.queue_units_prefix(_queue_name(bounds))):
        parsed = _parse(key)
        if isinstance(parsed, keys.QueueDoneKey):
            got = world.store.get(key)
            assert got is not None
            body = ENVELOPE.open(key, got.data)
            marker = completion.decode_done(body, parsed.attempt) if isinstance(body, bytes) else ""
            judged = marker if isinstance(marker, completion.DoneMarker) else None
            markers.setdefault(parsed.unit, {})[parsed.attempt] = judged
    verdict = completion.finished(completion.Queued(frozenset(units(bounds))), markers, frozenset())
    if isinstance(verdict, completion.NotFinished):
        out.append(f"units never done: {verdict.missing}")
    return out


FAIR_RUN_STEPS = 5_000


def _fair_run(world: World, bounds: QueueBounds) -> tuple[World, bool]:
    """The world a fair run leads to, and whether it came to rest."""
    for _ in range(FAIR_RUN_STEPS):
        if world.inflight:
            world = step(world, bounds, ("deliver", 0))
        elif acting := [i for i, n in enumerate(world.nodes) if _idle(n, bounds)]:
            world = _node_action(world, bounds, "act", acting[0])
        elif serving := [i for i, n in enumerate(world.nodes) if n.serving and _quiet(n)]:
            world = _node_action(world, bounds, "relieve", serving[0])
        elif timers := [(n.timer_s, i) for i, n in enumerate(world.nodes) if n.timer_s is not None]:
            world = _node_action(world, bounds, "fire", min(timers)[1])
        else:
            return world, True
    return world, False


def explore(bounds: QueueBounds) -> search.Outcome[Action]:
    """Every world reachable within ``bounds``, breadth first; the first violation stops it."""
    return search.breadth_first(
        initial(bounds),
        actions=lambda world: actions(world, bounds),
        step=lambda world, action: step(world, bounds, action),
        fingerprint=fingerprint,
        check=lambda world: list(dict.fromkeys(violations(world, bounds) + stuck(world, bounds))),
        max_states=bounds.max_states,
        what=bounds,
    )
