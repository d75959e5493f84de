"""Which actions commute: footprints recorded as they run, for the search's sleep sets.

Theory of operation
-------------------
Most transitions of an exhaustive search lead to a state it has already seen:
two machines' deliveries that touch different store keys reach the same state in
either order, and the search computed both orders (measured on ``three nodes,
two fragments``: 182,517 transitions for 47,990 states). A *sleep set*
(Godefroid's partial-order method) avoids the second order without losing any
state: after exploring action ``a`` from a state, every later sibling ``b``
independent of ``a`` carries ``a`` in its sleep set, since ``s.b.a`` is
``s.a.b``, which the search reaches from ``s.a``. Sleep sets prune transitions,
never states: the state counts stay exactly those of the full search, which is
how their soundness is checked here (the pinned counts did not move).

Two actions are *independent* when each is a delivery, a timer or training (a
crash, restart, clock move or forgery depends on everything), they touch
different machines, neither ends exploration (an action that creates the
``rounds``-th record leaves its siblings no successor: the search adds that
condition), and their store footprints do not conflict: neither writes a key the
other reads or writes, neither writes under a prefix the other listed, and
neither sweeps a whole prefix. A footprint is what the action actually did,
recorded while it ran (:class:`Recorder` listens to
:class:`~gm_core.store_model.ModelStore`'s methods for the duration of a search,
like the transition cache): the keys read (by the harness for the machine, and by
the moment invariants the harness judges), the prefixes listed, the keys written
(a create-once write that finds its key taken counts: its outcome depends on the
key), and the node's other machine when the action told it of a write
(:class:`~gm_core.commands.Share`, fed within the action: the action then depends
on that machine's state as on its own). Everything else an action changes is its
machines' state, timers and pace, and commands appended to the in-flight
multiset, all of which commute; the fingerprint folds what would not (in-flight
order, etags, the order of creations). A sleeping action's footprint is the one it
had where it ran: an independent action in between changed nothing it touched.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import attrs

from gm_core import cluster
from gm_core.check.actions import Action, Kind
from gm_core.store_model import ModelStore

LOCAL = frozenset({Kind.DELIVER, Kind.FIRE, Kind.TRAIN})
"""Action kinds that change one machine (and the store) only."""


@attrs.frozen
class Footprint:
    """What one action touched: its machines, and the store keys it read, listed or wrote."""

    machines: frozenset[tuple[str, cluster.Machine]]
    """Its own, and the node's other machine when it was told of a write (``Share``)."""
    reads: frozenset[str]
    prefixes: tuple[str, ...]
    writes: frozenset[str]


def independent(a: Footprint | None, b: Footprint | None) -> bool:
    """Whether two actions commute (None: an action that depends on every other)."""
    if a is None or b is None or not a.machines.isdisjoint(b.machines):
        return False
    if a.writes and (not a.writes.isdisjoint(b.writes) or not a.writes.isdisjoint(b.reads)):
        return False
    if b.writes and not b.writes.isdisjoint(a.reads):
        return False
    return not _under(a.writes, b.prefixes) and not _under(b.writes, a.prefixes)


def _under(keys: frozenset[str], prefixes: tuple[str, ...]) -> bool:
    return any(k.startswith(p) for p in prefixes for k in keys)


class Recorder:
    """Records the store keys touched while :meth:`recording` runs its body."""

    def __init__(self) -> None:
        self._on = False
        self._reads: set[str] = set()
        self._writes: set[str] = set()
        self._prefixes: list[str] = []
        self._told: set[tuple[str, cluster.Machine]] = set()
        self._everything = False

    @contextmanager
    def recording(self) -> Iterator[None]:
        self._reads.clear()
        self._writes.clear()
        self._prefixes.clear()
        self._told.clear()
        self._everything = False
        self._on = True
        try:
            yield
        finally:
            self._on = False

    def footprint(self, action: Action) -> Footprint | None:
        """The footprint of ``action``, just recorded (None: it may depend on anything)."""
        if action.kind not in LOCAL or self._everything:
            return None
        machine = cluster.Machine.LEARNER if action.kind is Kind.TRAIN else action.machine
        return Footprint(
            machines=frozenset({(action.node, machine), *self._told}),
            reads=frozenset(self._reads),
            prefixes=tuple(self._prefixes),
            writes=frozenset(self._writes),
        )

    @contextmanager
    def installed(self) -> Iterator[Recorder]:
        """Route the model store's reads and writes past this recorder, then restore."""
        real = {name: getattr(ModelStore, name) for name in _ACCESS}
        for name, (kind, which) in _ACCESS.items():
            setattr(ModelStore, name, self._wrap(real[name], kind, which))
        share = cluster._share
        cluster._share = self._sharing(share)
        try:
            yield self
        finally:
            for name, method in real.items():
                setattr(ModelStore, name, method)
            cluster._share = share

    def _sharing(self, share: Callable[..., cluster.Cluster]) -> Callable[..., cluster.Cluster]:
        """``cluster._share``, noting the machine told: an action that tells a machine of a
        write depends on that machine's state, as if it were that machine's own action."""

        def wrapped(
            c: cluster.Cluster, name: str, machine: cluster.Machine, *rest: Any
        ) -> cluster.Cluster:
            if self._on:
                other = cluster.other_machine(machine)
                self._told.add((name, other))
            return share(c, name, machine, *rest)

        return wrapped

    def _wrap(self, method: Callable[..., Any], kind: str, which: str) -> Callable[..., Any]:
        sink = {"read": self._reads, "write": self._writes}

        def wrapped(store: ModelStore, arg: Any, *rest: Any) -> Any:
            if self._on:
                if kind == "prefix":
                    self._prefixes.append(arg)
                elif kind == "everything":
                    self._everything = True
                elif which == "many":
                    sink[kind].update(arg)
                else:
                    sink[kind].add(arg)
            return method(store, arg, *rest)

        return wrapped


_ACCESS = {
    "get": ("read", "one"),
    "put_once": ("write", "one"),
    "put": ("write", "one"),
    "list": ("prefix", "one"),
    "delete": ("write", "many"),
    "delete_prefix": ("everything", "one"),
}
"""ModelStore's methods: what each does to its first argument (a key, keys or a prefix);
deleting a whole prefix is rare (a sweep) and counted as touching everything."""
