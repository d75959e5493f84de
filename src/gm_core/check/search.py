"""Breadth-first search over small worlds of machines sharing the model store.

Theory of operation
-------------------
The barrier's and the shared queue's exhaustive checks (:mod:`gm_core.check.barrier`,
:mod:`gm_core.check.queue`) explore worlds of a few machines and a
:class:`~gm_core.store_model.ModelStore`; each says which actions a world allows, what
each leads to, what identifies a world (its fingerprint) and what is wrong in one. This
module is what they share: the search itself — breadth first, so the first violation found
comes with a shortest trace — the execution of one store request against the model
store, stamped with the asking machine's own clock, and :func:`collector_paused`, which
every search runs under.
"""

from __future__ import annotations

import gc
from collections import deque
from collections.abc import Callable, Hashable, Iterator, Sequence
from contextlib import contextmanager
from typing import Generic, TypeVar

import attrs

from gm_core.commands import Command, Delete, Get, List, PutOnce
from gm_core.events import Deleted, Event, GotObject, Listed, PutDone
from gm_core.store_model import ModelStore

W = TypeVar("W")
A = TypeVar("A")


@attrs.frozen(kw_only=True)
class Outcome(Generic[A]):
    states: int
    violation: tuple[str, ...] = ()
    trace: tuple[A, ...] = ()
    """The shortest sequence of actions from the initial world to the violation."""


@contextmanager
def collector_paused() -> Iterator[None]:
    """Python's cyclic garbage collector off while a search runs, as it was afterwards.

    A search keeps hundreds of thousands of long-lived objects (states, fingerprints,
    memos) and allocates millions of short-lived ones, so the collector's generation-0
    passes keep promoting, and each full collection walks the whole heap again, while
    a search makes next to no cyclic garbage: reference counting frees the rest.
    Measured: 194 cyclic objects left at the end of the 49,249-state closer-crash set,
    the same peak memory, and 1.26-1.45x the states per CPU-second on the three-node and
    liveness sets (``bench/bench_check.py``, spec/protocol.md §15.9).
    """
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def breadth_first(
    start: W,
    *,
    actions: Callable[[W], Sequence[A]],
    step: Callable[[W, A], W],
    fingerprint: Callable[[W], Hashable],
    check: Callable[[W], list[str]],
    max_states: int,
    what: object,
) -> Outcome[A]:
    """Every world reachable from ``start``, breadth first; the first violation stops it.
    More than ``max_states`` worlds raise (``what`` names the bounds in the message)."""
    with collector_paused():
        seen = {fingerprint(start)}
        frontier: deque[tuple[W, tuple[A, ...]]] = deque([(start, ())])
        while frontier:
            world, trace = frontier.popleft()
            bad = check(world)
            if bad:
                return Outcome(states=len(seen), violation=tuple(bad), trace=trace)
            for action in actions(world):
                after = step(world, action)
                key = fingerprint(after)
                if key in seen:
                    continue
                if len(seen) >= max_states:
                    raise RuntimeError(f"more than {max_states} states at {what}")
                seen.add(key)
                frontier.append((after, (*trace, action)))
        return Outcome(states=len(seen))


def execute(store: ModelStore, cmd: Command, now_s: float) -> tuple[ModelStore, Event]:
    """Carry out one store request (GET, create-once PUT, LIST, DELETE); ETags are not
    handed back (no decision these searches check reads them)."""
    if isinstance(cmd, Get):
        got = store.get(cmd.key)
        data = None if got is None else got.data
        return store, GotObject(now_s=now_s, req=cmd.req, data=data, etag=None)
    if isinstance(cmd, PutOnce):
        store, created = store.put_once(cmd.key, cmd.data)
        return store, PutDone(now_s=now_s, req=cmd.req, created=created)
    if isinstance(cmd, List):
        return store, Listed(now_s=now_s, req=cmd.req, keys=store.list(cmd.prefix, cmd.offset))
    assert isinstance(cmd, Delete), cmd
    return store.delete(cmd.keys), Deleted(now_s=now_s, req=cmd.req)
