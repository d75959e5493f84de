"""Exhaustive search over barrier waits: every interleaving, clock and fault, at small bounds.

Theory of operation
-------------------
A :class:`World` is a few parties waiting at one barrier (:mod:`gm_core.barrier`)
over the model store, each with **its own clock**: a party's timer firing moves its
clock alone, so the search covers every relative speed of the parties' clocks as
well as every order of deliveries. From each world the actions are: deliver one
request in flight, deliver it but lose the response (bounded by ``losses``), fire
one party's timer, or crash a party and restart it under the same id remembering
nothing (bounded by ``crashes``). Breadth first, with the world's canonical value as
its fingerprint (ETags and the store's write counter left out: no barrier decision
reads them), so the first violation found has a shortest trace.

Checked in every world (:func:`violations`): **release soundness** — a party
released from generation ``g`` is one of exactly ``parties`` distinct members, each
of whose arrival at ``g`` had been created before; **agreement** — everyone released
from ``g`` names the same members; and no wait ends ``Mismatched``, since every party
here passes the same ``parties`` (a marker of another size was written by a broken
rule, which the machine's own count check refused). Checked where nothing is left to do
(:func:`stuck`): every wait ended. The barrier's rules are restated here, never
called, so a bug in them is not agreed with.
"""

from __future__ import annotations

import attrs

from gm_core import barrier, keys
from gm_core.check import search
from gm_core.commands import Command, Delete, Get, List, PutOnce, WakeAt
from gm_core.events import (
    Event,
    RequestFailed,
    Started,
    TimerFired,
)
from gm_core.store_model import ModelStore

NAME = "b"


@attrs.frozen(kw_only=True)
class BarrierBounds:
    parties: int
    waiters: int
    timeout_s: float
    poll_s: float = 1.0
    crashes: int = 0
    losses: int = 0
    max_states: int = 2_000_000


@attrs.frozen(kw_only=True)
class Party:
    state: barrier.BarrierState
    clock_s: float
    timer_s: float | None
    ended: tuple[barrier.Result, ...] = ()
    """Every outcome this party's waits reached (a restart starts a new wait)."""


@attrs.frozen(kw_only=True)
class World:
    store: ModelStore
    parties: tuple[Party, ...]
    inflight: tuple[tuple[int, int, Command], ...]
    """(party, incarnation, command) in flight."""
    incarnations: tuple[int, ...]
    crashes: int
    losses: int
    released_with: tuple[tuple[int, barrier.Released, frozenset[str]], ...] = ()
    """Each release, with the keys ever created when it happened."""


Action = tuple[str, int]
"""``("deliver" | "lose", index)`` into in-flight, or ``("fire" | "crash", party)``."""


def names(bounds: BarrierBounds) -> list[str]:
    return [f"p{i}" for i in range(bounds.waiters)]


def initial(bounds: BarrierBounds) -> World:
    world = World(
        store=ModelStore(),
        parties=(),
        inflight=(),
        incarnations=(0,) * bounds.waiters,
        crashes=bounds.crashes,
        losses=bounds.losses,
    )
    for index in range(bounds.waiters):
        world = _start(world, bounds, index, clock_s=0.0)
    return world


def _spec(bounds: BarrierBounds, index: int) -> barrier.BarrierSpec:
    return barrier.BarrierSpec(
        name=NAME,
        party=names(bounds)[index],
        parties=bounds.parties,
        timeout_s=bounds.timeout_s,
        poll_s=bounds.poll_s,
    )


def _start(world: World, bounds: BarrierBounds, index: int, clock_s: float) -> World:
    fresh = Party(state=barrier.initial(_spec(bounds, index)), clock_s=clock_s, timer_s=None)
    parties = list(world.parties)
    if index < len(parties):
        fresh = attrs.evolve(fresh, ended=parties[index].ended)
        parties[index] = fresh
    else:
        parties.append(fresh)
    world = attrs.evolve(world, parties=tuple(parties))
    return _feed(world, index, Started(now_s=clock_s))


def _feed(world: World, index: int, event: Event) -> World:
    party = world.parties[index]
    before = party.state
    state, cmds = barrier.advance(before, event)
    timer_s = party.timer_s
    inflight = list(world.inflight)
    for cmd in cmds:
        if isinstance(cmd, WakeAt):
            timer_s = cmd.at_s
        elif isinstance(cmd, Get | PutOnce | List | Delete):
            inflight.append((index, world.incarnations[index], cmd))
    ended = party.ended
    released_with = world.released_with
    if state.result is not None and before.result is None:
        timer_s = None
        ended = (*ended, state.result)
        if isinstance(state.result, barrier.Released):
            created = frozenset(k for k, _ in world.store.created)
            released_with = (*released_with, (index, state.result, created))
    parties = list(world.parties)
    parties[index] = attrs.evolve(party, state=state, timer_s=timer_s, ended=ended)
    return attrs.evolve(
        world, parties=tuple(parties), inflight=tuple(inflight), released_with=released_with
    )


def actions(world: World) -> list[Action]:
    out: list[Action] = []
    for i in range(len(world.inflight)):
        out.append(("deliver", i))
        if world.losses > 0:
            out.append(("lose", i))
    for index, party in enumerate(world.parties):
        if party.timer_s is not None:
            out.append(("fire", index))
        if world.crashes > 0 and party.state.result is None:
            out.append(("crash", index))
    return out


def step(world: World, bounds: BarrierBounds, action: Action) -> World:
    kind, at = action
    if kind == "fire":
        party = world.parties[at]
        assert party.timer_s is not None
        clock_s = max(party.clock_s, party.timer_s)
        parties = list(world.parties)
        parties[at] = attrs.evolve(party, clock_s=clock_s, timer_s=None)
        return _feed(attrs.evolve(world, parties=tuple(parties)), at, TimerFired(now_s=clock_s))
    if kind == "crash":
        incarnations = list(world.incarnations)
        incarnations[at] += 1
        inflight = tuple(item for item in world.inflight if item[0] != at)
        world = attrs.evolve(
            world,
            incarnations=tuple(incarnations),
            inflight=inflight,
            crashes=world.crashes - 1,
        )
        return _start(world, bounds, at, world.parties[at].clock_s)
    index, incarnation, cmd = world.inflight[at]
    world = attrs.evolve(world, inflight=world.inflight[:at] + world.inflight[at + 1 :])
    store, outcome = search.execute(world.store, cmd, world.parties[index].clock_s)
    world = attrs.evolve(world, store=store)
    if kind == "lose":
        req = getattr(cmd, "req", 0)
        outcome = RequestFailed(now_s=world.parties[index].clock_s, req=req, error="lost")
        world = attrs.evolve(world, losses=world.losses - 1)
    if incarnation != world.incarnations[index]:
        return world  # the party that asked has crashed since
    return _feed(world, index, outcome)


def fingerprint(world: World) -> object:
    objects = tuple(sorted((k, v.data) for k, v in world.store.objects.items()))
    created = frozenset(k for k, _ in world.store.created)
    return (objects, created, world.parties, world.inflight, world.crashes, world.losses)


def violations(world: World, bounds: BarrierBounds) -> list[str]:
    """Release soundness and agreement, restated from spec/coordination.md §4."""
    out = []
    members_of: dict[int, tuple[str, ...]] = {}
    for index, result, created in world.released_with:
        me, g, members = names(bounds)[index], result.generation, result.members
        if (
            me not in members
            or len(set(members)) != bounds.parties
            or len(members) != len(set(members))
        ):
            out.append(f"{me} released from generation {g} with members {members}")
        missing = [m for m in members if keys.barrier_arrival(NAME, g, m) not in created]
        if missing:
            out.append(f"{me} released from generation {g} before {missing} arrived")
        if members_of.setdefault(g, members) != members:
            out.append(f"generation {g} released {members_of[g]} and {members}")
    for index, party in enumerate(world.parties):
        for ended in party.ended:
            if isinstance(ended, barrier.Mismatched):
                # Every party here passes the same ``parties``: no marker may count otherwise.
                out.append(
                    f"p{index} found generation {ended.generation} released for {ended.members}"
                )
    return out


def stuck(world: World) -> list[str]:
    """Where nothing is left to do, every wait must have ended."""
    if world.inflight or any(p.timer_s is not None for p in world.parties):
        return []
    return [f"p{i} never finished" for i, p in enumerate(world.parties) if p.state.result is None]


def explore(bounds: BarrierBounds) -> search.Outcome[Action]:
    """Every world reachable within ``bounds``, breadth first; the first violation stops it."""
    return search.breadth_first(
        initial(bounds),
        actions=actions,
        step=lambda world, action: step(world, bounds, action),
        fingerprint=fingerprint,
        check=lambda world: violations(world, bounds) + stuck(world),
        max_states=bounds.max_states,
        what=bounds,
    )
