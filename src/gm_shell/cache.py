"""A least-recently-used map of decoded fragments, bounded by bytes.

Theory of operation
-------------------
A closer decodes each snapshot's delta once, when it verifies it, and needs it
again moments later for the merge; it needs its own last commit (theta and
momentum) as the base of the next round of the same fragment; a learner in the
same process aligns with exactly the theta its closer just wrote. Payload keys
name their content (the digest is in the key), so a cached value can never be
stale: a key maps to one set of bytes forever. Entries are evicted oldest-used
first once their total size passes the bound; an evicted value is fetched and
decoded again if needed. Values are never mutated by their users.
"""

from __future__ import annotations

from collections import OrderedDict

from gm_core.numerics.arrays import F32


class FragmentCache:
    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._items: OrderedDict[str, F32] = OrderedDict()
        self._bytes = 0

    def get(self, key: str) -> F32 | None:
        value = self._items.get(key)
        if value is not None:
            self._items.move_to_end(key)
        return value

    def put(self, key: str, value: F32) -> None:
        old = self._items.pop(key, None)
        if old is not None:
            self._bytes -= old.nbytes
        self._items[key] = value
        self._bytes += value.nbytes
        while self._bytes > self.max_bytes and len(self._items) > 1:
            _, evicted = self._items.popitem(last=False)
            self._bytes -= evicted.nbytes

    def __len__(self) -> int:
        return len(self._items)

    @property
    def nbytes(self) -> int:
        return self._bytes
