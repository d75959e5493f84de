"""Remembered local steps: one machine's action against one store, computed once.

Theory of operation
-------------------
Most of a search's transitions are deliveries, timers and training: actions of
one machine. Such an action reads and changes only its own node (machine state,
timers, pace, ghost), the store, the command it delivers, and the clock it
reads; it appends commands of its own node to those in flight and may record
violations and notifications. So its effect is a function of (the action, the
node's exact state, the command, the store's exact state, the time), and that
tuple recurs all the time: in every state that differs only in the other nodes,
or in what else is in flight (measured: 73,199 such transitions of ``three nodes,
two fragments`` have 4,793 distinct tuples; 22,220 of ``two closers race, one
fault`` have 4,641).

:class:`Steps` remembers each effect the first time it is computed by the real
:func:`gm_core.check.explore.step` (payload work settled included) and applies it
to any other state with the same tuple: the node replaced, the delivered command
removed, the new commands appended in order, the store replaced, the new
violations and notes appended. The key is *exact* (etags and the store's write
counter included: the next write's etag depends on it), so a hit gives exactly
what the call would. A computed step whose effect is not of that shape (another
node changed, the clock moved) is not remembered, nor are the steps of a
one-node cluster: every state differs in that node (measured: 269 of 12,527 of
``one node, one fault`` repeat, which does not pay for the keys). The sleep sets' footprint of
the action is remembered with it: the same reads and writes happen again.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs

from gm_core import cluster
from gm_core.check.actions import Action, Kind, index_of
from gm_core.check.fingerprint import Digests
from gm_core.check.independence import Footprint, Recorder

Take = Callable[[cluster.Cluster, Action], cluster.Cluster]

LOCAL = frozenset({Kind.DELIVER, Kind.FIRE, Kind.TRAIN})


@attrs.frozen
class Effect:
    """What one local step did to the state it was taken in."""

    node: cluster.Node
    added: tuple[cluster.InFlight, ...]
    store: Any
    violations: tuple[Any, ...]
    notes: tuple[Any, ...]
    footprint: Footprint | None


class Steps:
    """A search's steps, each local effect computed once per exact (action, node, store, time)."""

    def __init__(
        self, take: Take, recorder: Recorder | None, exact: Digests, limit: int = 200_000
    ) -> None:
        self._take = take
        self._recorder = recorder
        self.exact = exact
        self._effects: dict[tuple[Any, ...], Effect] = {}
        self._limit = limit
        self.hits = 0
        self.misses = 0

    def take(self, c: cluster.Cluster, action: Action) -> tuple[cluster.Cluster, Footprint | None]:
        """The state after ``action`` and its footprint (None without a recorder, or a
        non-local action: it may depend on anything)."""
        if action.kind not in LOCAL or len(c.nodes) == 1:  # one node's steps hardly repeat
            return self._recorded(c, action)
        part = self.exact.part
        index = index_of(c, action) if action.kind is Kind.DELIVER else None
        command = None if index is None else part(c.inflight[index].command)
        key = (action, part(c.nodes[action.node]), command, part(c.store), c.now_s)
        effect = self._effects.get(key)
        rest = c.inflight if index is None else c.inflight[:index] + c.inflight[index + 1 :]
        if effect is not None:
            self.hits += 1
            return _apply(c, action.node, rest, effect), effect.footprint
        self.misses += 1
        after, footprint = self._recorded(c, action)
        effect = _effect(c, action.node, rest, after, footprint)
        if effect is not None:
            if len(self._effects) >= self._limit:
                self._effects.clear()
            self._effects[key] = effect
        return after, footprint

    def state(self, c: cluster.Cluster, action: Action) -> cluster.Cluster:
        return self.take(c, action)[0]

    def _recorded(
        self, c: cluster.Cluster, action: Action
    ) -> tuple[cluster.Cluster, Footprint | None]:
        if self._recorder is None:
            return self._take(c, action), None
        with self._recorder.recording():
            after = self._take(c, action)
        return after, self._recorder.footprint(action)


def _effect(
    c: cluster.Cluster,
    name: str,
    rest: tuple[cluster.InFlight, ...],
    after: cluster.Cluster,
    footprint: Footprint | None,
) -> Effect | None:
    """The effect of a step from ``c`` to ``after``, if it is local to ``name``."""
    kept = len(rest)
    if (
        after.now_s != c.now_s
        or after.hostile is not c.hostile
        or after.inflight[:kept] != rest
        or after.violations[: len(c.violations)] != c.violations
        or after.notes[: len(c.notes)] != c.notes
        or any(after.nodes[n] is not c.nodes[n] for n in c.nodes if n != name)
    ):
        return None
    return Effect(
        node=after.nodes[name],
        added=after.inflight[kept:],
        store=after.store,
        violations=after.violations[len(c.violations) :],
        notes=after.notes[len(c.notes) :],
        footprint=footprint,
    )


def _apply(
    c: cluster.Cluster, name: str, rest: tuple[cluster.InFlight, ...], effect: Effect
) -> cluster.Cluster:
    nodes = dict(c.nodes)
    nodes[name] = effect.node
    return attrs.evolve(
        c,
        nodes=nodes,
        inflight=rest + effect.added,
        store=effect.store,
        violations=c.violations + effect.violations if effect.violations else c.violations,
        notes=c.notes + effect.notes if effect.notes else c.notes,
    )
