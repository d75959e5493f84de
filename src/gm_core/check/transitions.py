"""Caches of pure functions a search calls over and over: transitions, and decoding.

Theory of operation
-------------------
``learner.advance`` and ``closer.advance`` are pure functions, and an exhaustive
search calls them with the same arguments over and over: a machine's state is
shared by every cluster state that differs only elsewhere (in another node, in
the order of other requests), so the same delivery to the same machine state
recurs in many of them. Measured on ``two closers race, one fault``, 98% of the
calls repeat an earlier (state, event) pair.

:class:`Transitions` remembers each result, keyed by the *exact* digest of the
machine state (every field, etags included, unlike the state fingerprint) and the
event itself (a frozen value: its type and every field, compared by equality;
hashing it costs a fraction of its ``repr``), so a hit returns exactly what the
call would have returned. The returned state object is shared, which in turn lets
the fingerprint's memo (by identity) hit. :meth:`Transitions.installed`
routes :mod:`gm_core.cluster`'s calls through the cache for the duration of a
search and restores the real functions afterwards, since the cluster harness is
shared with the simulator and the tests and is not the checker's to change.

Decoding is the other repeated work: the harness judges payload-before-pointer
and the closing rule by decoding each snapshot and record it writes, and the
machines decode what they read, the same few documents thousands of times.
:func:`gm_core.codec.decode` is pure (a value, or a ``CodecError`` for the same
bytes every time), so it is cached alongside, by kind and bytes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

from gm_core import closer, codec, learner
from gm_core.check.fingerprint import Digests
from gm_core.commands import Command
from gm_core.events import Event

S = TypeVar("S")
T = TypeVar("T")
Advance = Callable[[S, Event], tuple[S, list[Command]]]


class Transitions:
    """Remembered results of ``advance``, with hit and miss counts."""

    def __init__(self, limit: int = 300_000) -> None:
        self.exact = Digests(abstract=False)
        """Exact digests (every field, etags included), shared with the search's step cache."""
        self._results: dict[tuple[bytes, Event], tuple[Any, tuple[Command, ...]]] = {}
        self._decoded: dict[tuple[type, bytes], Any] = {}
        self._limit = limit
        self.hits = 0
        self.misses = 0

    def cached(self, real: Advance[S]) -> Advance[S]:
        """``real``, answering repeated (state, event) pairs from the cache."""

        def advance(state: S, event: Event) -> tuple[S, list[Command]]:
            key = (self.exact.part(state), event)
            found = self._results.get(key)
            if found is None:
                self.misses += 1
                new, cmds = real(state, event)
                if len(self._results) >= self._limit:
                    self._results.clear()
                found = self._results[key] = (new, tuple(cmds))
            else:
                self.hits += 1
            return found[0], list(found[1])

        return advance

    def decoding(self, real: Callable[[type[T], Any], T]) -> Callable[[type[T], Any], T]:
        """``real`` (``codec.decode``), answering repeated (kind, bytes) from the cache."""

        def decode(kind: type[T], data: Any) -> T:
            if not isinstance(data, bytes):
                return real(kind, data)
            key = (kind, data)
            found = self._decoded.get(key)
            if found is None:
                try:
                    found = real(kind, data)
                except codec.CodecError as error:
                    found = error
                if len(self._decoded) >= self._limit:
                    self._decoded.clear()
                self._decoded[key] = found
            if isinstance(found, codec.CodecError):
                raise found.with_traceback(None)
            return found

        return decode

    @contextmanager
    def installed(self) -> Iterator[Transitions]:
        """Route the machines' transitions and every decode through the caches, then restore."""
        real = (learner.advance, closer.advance, codec.decode)
        learner.advance = self.cached(real[0])  # type: ignore[assignment]
        closer.advance = self.cached(real[1])  # type: ignore[assignment]
        codec.decode = self.decoding(real[2])  # type: ignore[assignment]
        try:
            yield self
        finally:
            learner.advance, closer.advance, codec.decode = real
