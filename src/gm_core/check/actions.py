"""What the checker may do next in a state: every action, named so a trace can be replayed.

Theory of operation
-------------------
An :class:`Action` is a small value naming one step of a driver of
:mod:`gm_core.cluster`: deliver one command in flight (identified by node,
machine, incarnation and request number, never by its position, so a trace stays
valid whatever order the in-flight tuple has), optionally as a failure or with its
response lost; fire a due timer; let a learner train to the step its core is
waiting for; crash or restart a node; or move the clock to the next timer, which
then fires every timer due at that instant (in name order, before any request
completes at that instant: timers are punctual). A timer a machine sets for a
moment already past fires by its own action.

:func:`enabled` lists, in a fixed order, the actions a state allows under the
remaining fault budget; :func:`apply` carries one out. An action prints as a
short token (``d:n0/learner/1/4/lose``) and :func:`parse` reads it back, which is
how ``gm check --replay`` re-runs a counterexample.
"""

from __future__ import annotations

import enum
import functools

import attrs

from gm_core import cluster
from gm_core.check import forger
from gm_core.commands import (
    Align,
    Capture,
    Command,
    Delete,
    DeletePrefix,
    Get,
    List,
    Merge,
    Probe,
    PutOnce,
    PutOver,
    Verify,
)


class Kind(enum.StrEnum):
    DELIVER = "d"
    FIRE = "f"
    TRAIN = "t"
    CRASH = "c"
    RESTART = "r"
    TICK = "w"
    FORGE = "x"
    """The forger writes one object (``node`` names the kind: gm_core.check.forger)."""


@attrs.frozen(kw_only=True, cache_hash=True)
class Action:
    kind: Kind
    node: str = ""
    machine: cluster.Machine = cluster.Machine.LEARNER
    incarnation: int = 0
    req: int = 0
    fault: cluster.Fault = cluster.Fault.NONE

    def token(self) -> str:
        if self.kind is Kind.DELIVER:
            parts = (self.node, self.machine.value, self.incarnation, self.req, self.fault.value)
            return "d:" + "/".join(str(p) for p in parts)
        if self.kind is Kind.FIRE:
            return f"f:{self.node}/{self.machine.value}"
        if self.kind is Kind.TICK:
            return "w"
        return f"{self.kind.value}:{self.node}"


def parse(token: str) -> Action:
    """The action a token names; raises ValueError on anything else."""
    kind_text, _, rest = token.strip().partition(":")
    kind = Kind(kind_text)
    if kind is Kind.TICK:
        return Action(kind=kind)
    if kind is Kind.DELIVER:
        node, machine, incarnation, req, fault = rest.split("/")
        return Action(
            kind=kind,
            node=node,
            machine=cluster.Machine(machine),
            incarnation=int(incarnation),
            req=int(req),
            fault=cluster.Fault(fault),
        )
    if kind is Kind.FIRE:
        node, machine = rest.split("/")
        return Action(kind=kind, node=node, machine=cluster.Machine(machine))
    if not rest:
        raise ValueError(f"action {token!r} names no node")
    return Action(kind=kind, node=rest)


def is_write(cmd: Command) -> bool:
    """Commands whose response can be lost after the write landed."""
    return isinstance(cmd, PutOnce | PutOver | Delete | DeletePrefix)


def _req(cmd: Command) -> int:
    return int(getattr(cmd, "req", -1))


PAYLOAD = (Capture, Verify, Merge, Align)
PAYLOAD_BUT_CAPTURE = (Verify, Merge, Align)


def settle_payloads(c: cluster.Cluster, hold_captures: bool = False) -> cluster.Cluster:
    """Carry out every payload command in flight at once (for ``atomic_payloads``).

    Payload work reads and writes content-addressed keys that no other node can
    name until a record or snapshot written *after* it points at them, so when it
    completes relative to other nodes' actions is unobservable; only garbage
    collection could race it, and it never touches the rounds of a small bound.
    With ``hold_captures`` a :class:`Capture` stays in flight, to be delivered (and
    possibly failed) like a request: how a learner comes to give up a round.
    """
    kinds = PAYLOAD_BUT_CAPTURE if hold_captures else PAYLOAD
    while True:
        index = next((i for i, f in enumerate(c.inflight) if isinstance(f.command, kinds)), None)
        if index is None:
            return c
        c = cluster.deliver(c, index)


def deliveries(
    c: cluster.Cluster,
    faults_left: int,
    store_only: bool,
    fifo: bool = False,
    capture_faults: bool = False,
    store_faults: bool = True,
) -> list[Action]:
    """Each command in flight, as it is, and (budget allowing) failed or response-lost.

    ``store_only`` lets only store requests fail (none without ``store_faults``),
    and a :class:`Capture` too with ``capture_faults``. With ``fifo``, only the
    oldest command of each machine may land next: requests of one machine complete
    in the order it issued them, while machines still interleave arbitrarily.
    """
    out: list[Action] = []
    heads: set[tuple[str, cluster.Machine, int]] = set()
    for item in c.inflight:
        channel = (item.node, item.machine, item.incarnation)
        if fifo and channel in heads:
            continue
        heads.add(channel)
        faultable = (store_faults and _is_store(item.command)) or (
            capture_faults and isinstance(item.command, Capture)
        )
        fates = 1  # as it is; then failed, then (a write) landed with its response lost
        if faults_left > 0 and (faultable or not store_only):
            fates = 3 if is_write(item.command) else 2
        out.extend(_deliveries(*channel, _req(item.command))[:fates])
    return out


@functools.lru_cache(maxsize=65_536)
def _deliveries(
    node: str, machine: cluster.Machine, incarnation: int, req: int
) -> tuple[Action, Action, Action]:
    """The three fates of one command in flight (as it is, failed, response lost), made
    once: a search lists the same commands in thousands of states."""
    base = Action(kind=Kind.DELIVER, node=node, machine=machine, incarnation=incarnation, req=req)
    fail = attrs.evolve(base, fault=cluster.Fault.FAIL)
    return base, fail, attrs.evolve(base, fault=cluster.Fault.LOSE_RESPONSE)


def _is_store(cmd: Command) -> bool:
    return isinstance(cmd, Get | Probe | PutOnce | PutOver | List | Delete | DeletePrefix)


def enabled(
    c: cluster.Cluster,
    *,
    faults_left: int,
    crashes_left: int,
    store_faults_only: bool,
    max_time_s: float,
    fifo: bool = False,
    crashable: frozenset[str] | None = None,
    capture_faults: bool = False,
    store_faults: bool = True,
    forge: tuple[forger.Forgery, ...] = (),
) -> list[Action]:
    """Every action the state allows, in order: deliver, fire, train, crash, restart,
    forge, tick.

    ``crashable`` names the nodes that may crash (None: every node); ``forge`` the
    kinds of object the forger may write (each once per path).
    """
    out = deliveries(c, faults_left, store_faults_only, fifo, capture_faults, store_faults)
    out.extend(_local(Kind.FIRE, name, machine) for name, machine in cluster.due_timers(c))
    names = sorted(c.nodes)
    out.extend(_local(Kind.TRAIN, n) for n in names if cluster.can_train(c, n))
    if crashes_left > 0:
        out.extend(
            Action(kind=Kind.CRASH, node=n)
            for n in names
            if c.nodes[n].alive and (crashable is None or n in crashable)
        )
    out.extend(Action(kind=Kind.RESTART, node=n) for n in names if not c.nodes[n].alive)
    out.extend(Action(kind=Kind.FORGE, node=k.value) for k in forge if forger.possible(c, k))
    upcoming = next_deadline(c)
    if upcoming is not None and upcoming <= max_time_s:
        out.append(Action(kind=Kind.TICK))
    return out


@functools.lru_cache(maxsize=1024)
def _local(kind: Kind, node: str, machine: cluster.Machine = cluster.Machine.LEARNER) -> Action:
    """A timer or training action, made once per node (see :func:`_deliveries`)."""
    return Action(kind=kind, node=node, machine=machine)


def next_deadline(c: cluster.Cluster) -> float | None:
    """The earliest timer of a live machine that lies in the future."""
    times = [at for n in c.nodes.values() if n.alive for at in n.timers.values() if at > c.now_s]
    return min(times, default=None)


def apply(c: cluster.Cluster, action: Action) -> cluster.Cluster:
    """Carry out ``action``; raises ValueError if the state does not allow it."""
    if action.kind is Kind.DELIVER:
        return cluster.deliver(c, index_of(c, action), action.fault)
    if action.kind is Kind.FIRE:
        if (action.node, action.machine) not in cluster.due_timers(c):
            raise ValueError(f"no due timer {action.token()}")
        return cluster.fire(c, action.node, action.machine)
    if action.kind is Kind.TRAIN:
        node = c.nodes[action.node]
        if not cluster.can_train(c, action.node) or node.pace is None:
            raise ValueError(f"{action.node} cannot train")
        return cluster.train(c, action.node, node.pace.next_step - node.step)
    if action.kind is Kind.CRASH:
        return cluster.crash(c, action.node)
    if action.kind is Kind.RESTART:
        return cluster.start(c, action.node)
    if action.kind is Kind.FORGE:
        kind = forger.Forgery(action.node)
        if not forger.possible(c, kind):
            raise ValueError(f"cannot forge a {kind} now")
        return forger.forge(c, kind)
    upcoming = next_deadline(c)
    if upcoming is None:
        raise ValueError("no timer to wait for")
    c = cluster.tick(c, upcoming - c.now_s)
    for name, machine in cluster.due_timers(c):
        c = cluster.fire(c, name, machine)
    return c


def index_of(c: cluster.Cluster, action: Action) -> int:
    for i, item in enumerate(c.inflight):
        if (item.node, item.machine, item.incarnation, _req(item.command)) == (
            action.node,
            action.machine,
            action.incarnation,
            action.req,
        ):
            return i
    raise ValueError(f"nothing in flight matches {action.token()}")


def describe(c: cluster.Cluster, action: Action) -> str:
    """A readable line for a trace, given the state the action is taken in."""
    if action.kind is Kind.DELIVER:
        cmd = c.inflight[index_of(c, action)].command
        what = type(cmd).__name__
        key = getattr(cmd, "key", None) or getattr(cmd, "prefix", None)
        target = key if key is not None else f"round {getattr(cmd, 'round', '?')}"
        fate = {
            cluster.Fault.NONE: "",
            cluster.Fault.FAIL: "  [fails]",
            cluster.Fault.LOSE_RESPONSE: "  [lands, response lost]",
        }[action.fault]
        return f"{action.node}/{action.machine.value}: {what} {target}{fate}"
    if action.kind is Kind.FIRE:
        return f"{action.node}/{action.machine.value}: timer fires"
    if action.kind is Kind.TRAIN:
        node = c.nodes[action.node]
        target = node.pace.next_step if node.pace is not None else node.step
        return f"{action.node}: trains steps {node.step}..{target}"
    if action.kind is Kind.CRASH:
        return f"{action.node}: crashes"
    if action.kind is Kind.RESTART:
        return f"{action.node}: restarts"
    if action.kind is Kind.FORGE:
        return f"the forger writes a {action.node} as {forger.EVIL}"
    return f"clock moves to {next_deadline(c):g}s; due timers fire"
