"""Bounded least-recently-used memories: decoded fragments, and what was read by ETag.

Theory of operation
-------------------
A closer decodes each snapshot's delta once, when it verifies it, and needs it
again moments later for the merge; it needs its own last commit (theta and
momentum) as the base of the next round of the same fragment; a learner in the
same process aligns with exactly the theta its closer just wrote. Payload keys
name their content (the digest is in the key), so a cached value can never be
stale: a key maps to one set of bytes forever. The cache is keyed by the whole
reference, not the key alone: a reference also declares the payload's size and
digest, and a value read and judged under one reference says nothing of another
that names the same key with a size or digest of its own (a forger's reference
declaring 10 GiB at an honest payload's key is judged, and refused, as itself
whatever was read before it). Entries are evicted oldest-used
first once their total size passes the bound; an evicted value is fetched and
decoded again if needed. Values are never mutated by their users.

:class:`EtagMemory` remembers what a reader made of an object (its bytes, or the
verdict that refused it) by the object's ETag, so that reading the same object
again costs a conditional request and no download.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable
from typing import Generic, Protocol, TypeVar

import attrs

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class Buffer(Protocol):
    """A decoded fragment: a host numpy array, or a compute backend's (a torch tensor)."""

    @property
    def nbytes(self) -> int: ...


B = TypeVar("B", bound=Buffer)


class FragmentCache(Generic[K, B]):
    """Decoded fragments by payload reference (see the module's docstring), bounded by
    their bytes (wherever they live: a closer's deltas and momentum may be on its compute
    device, see :attr:`gm_shell.fragments.FragmentCodec.device`).

    With ``newest`` (a count), a value put with its fragment and round is kept only while it
    is among the ``newest`` latest rounds of its fragment put so far: with 1, the cache holds
    each fragment's newest commit (or momentum), at most the model's bytes, whatever the
    fragments' sizes, and an older value read again is handed out but not kept."""

    def __init__(self, max_bytes: int, newest: int | None = None) -> None:
        self.max_bytes = max_bytes
        self.newest = newest
        self._items: OrderedDict[K, B] = OrderedDict()
        self._bytes = 0
        self._rounds: dict[int, list[tuple[int, K]]] = {}
        """Per fragment, the (round, reference) of the values put with one (``newest`` only)."""

    def get(self, key: K) -> B | None:
        value = self._items.get(key)
        if value is not None:
            self._items.move_to_end(key)
        return value

    def put(self, key: K, value: B, at: tuple[int, int] | None = None) -> None:
        """Keep ``value`` under ``key``; ``at``: its fragment and round (see ``newest``)."""
        self.discard(key)
        if self.newest is not None and at is not None:
            fragment, round_ = at
            kept = self._rounds.setdefault(fragment, [])
            kept.insert(0, (round_, key))  # of a round put twice, the later is kept
            kept.sort(key=lambda item: item[0], reverse=True)  # stable: references are unordered
            for _, older in kept[self.newest :]:
                self.discard(older)
            if (round_, key) not in kept[: self.newest]:
                return  # older than those kept: handed out, not kept
        self._items[key] = value
        self._bytes += value.nbytes
        while self._bytes > self.max_bytes and len(self._items) > 1:
            evicted_key, evicted = self._items.popitem(last=False)
            self._bytes -= evicted.nbytes
            self._unlist(evicted_key)

    def discard(self, key: K) -> None:
        """Forget ``key``'s value, if held (its memory is freed with the last reference)."""
        old = self._items.pop(key, None)
        if old is not None:
            self._bytes -= old.nbytes
        self._unlist(key)

    def _unlist(self, key: K) -> None:
        for kept in self._rounds.values():
            kept[:] = [item for item in kept if item[1] != key]

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, key: K) -> bool:
        return key in self._items

    @property
    def nbytes(self) -> int:
        return self._bytes


@attrs.frozen
class Seen(Generic[V]):
    """What a reader made of the object that had ``etag`` at a key."""

    etag: str
    value: V


class EtagMemory(Generic[K, V]):
    """What a reader made of objects it read, by the ETag each had: bounded, oldest-used out.

    Asking the store "is it still the object with this ETag?" (a conditional GET) costs
    a request but no body, so an object read before — a bad record at the key every
    learner polls, a payload that failed its checks — is never downloaded twice while
    it stays the same; a changed object is read and judged afresh. Bounded by entries
    and by the bytes the values hold (``size`` of each, as the caller counts it).
    """

    def __init__(self, max_entries: int, max_bytes: int) -> None:
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self._items: OrderedDict[K, tuple[Seen[V], int]] = OrderedDict()
        self._bytes = 0

    def get(self, key: K) -> Seen[V] | None:
        item = self._items.get(key)
        if item is None:
            return None
        self._items.move_to_end(key)
        return item[0]

    def put(self, key: K, etag: str, value: V, size: int = 0) -> None:
        self.forget(key)
        if not etag or size > self.max_bytes:
            return  # nothing to ask the store about, or too big to keep
        self._items[key] = (Seen(etag=etag, value=value), size)
        self._bytes += size
        while len(self._items) > self.max_entries or self._bytes > self.max_bytes:
            _, (_, evicted) = self._items.popitem(last=False)
            self._bytes -= evicted

    def forget(self, key: K) -> None:
        item = self._items.pop(key, None)
        if item is not None:
            self._bytes -= item[1]

    def __len__(self) -> int:
        return len(self._items)

    @property
    def nbytes(self) -> int:
        return self._bytes
