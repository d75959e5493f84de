"""A bucket with a round trip: gm's real ``Mailbox`` over an in-memory store that waits per request.

Why: the comparison's figures on latency (a closer's round, a join, a takeover) must come from
gm's real runtime talking to a real mailbox, with the same per-request latency the reference
package gets from its metered wrapper (``bench/reference/refkit.py``). Nothing here models gm:
the ``Session``s, their event loops, the obstore calls and the mailbox's meter are the real ones.

How: :class:`SlowStore` stands in for the obstore store under a :class:`gm_shell.mailbox.Mailbox`.
Every call the mailbox makes on it (``put``, ``get``, ``head``, ``list``, ``delete``) sleeps
``latency_s`` per request on the mailbox's worker thread, as a remote round trip would hold that
thread, then runs on a shared obstore ``MemoryStore`` (the bucket every node of a run sees).
Requests are the ones S3 would bill: a LIST per page of 1000 keys, a DELETE per batch of 1000
(the handle says so, so the mailbox's own meter bills them the same way), a HEAD as a GET.
Each request is written to a journal (``reference/journal.py``, shared with the reference
side) with its start and end on the monotonic clock gm's events use, so a figure can cut a
window between two events and count the requests in it, and how many of them ran one after
another (``journal.waves``).

The only difference from the reference's wrapper: gm's mailbox sends at most
``MailboxOptions.max_concurrency`` (32) requests at once, as a real client does, where the
reference's sleeps all run at once on its event loop. gm never has that many in flight in
these figures.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar

from obstore.store import LocalStore, MemoryStore

from gm_shell.mailbox import Mailbox
from gm_shell.stores import Backend, MailboxOptions, StoreHandle

try:  # imported as ``bench.latency``, or with bench/ itself on sys.path (``bench/compare.py``)
    from bench.reference.journal import Journal, Request, category_of
except ModuleNotFoundError:
    from reference.journal import Journal, Request, category_of

S3_LIST_PAGE_KEYS = 1000
S3_DELETE_BATCH_KEYS = 1000
T = TypeVar("T")


class _Listing:
    """What ``store.list(...)`` returns, already collected: whole (``collect``) or chunk by
    chunk (iteration, as the mailbox reads a listing it may stop early)."""

    def __init__(self, items: list[Any], chunk_size: int) -> None:
        self._items = items
        self._chunk_size = chunk_size

    def collect(self) -> list[Any]:
        return self._items

    def __iter__(self) -> Iterator[list[Any]]:
        for start in range(0, len(self._items), self._chunk_size):
            yield self._items[start : start + self._chunk_size]


class SlowStore:
    """An obstore store's sync API over ``bucket``, each request delayed and journaled."""

    def __init__(
        self, bucket: MemoryStore | LocalStore, *, node: str, journal: Journal, latency_s: float
    ):
        self._bucket = bucket
        self._node = node
        self._journal = journal
        self.latency_s = latency_s

    def _request(self, cls: str, key: str, count: int, call: Callable[[], T]) -> T:
        started = time.monotonic()
        try:
            if self.latency_s > 0 and count > 0:
                time.sleep(self.latency_s * count)
            return call()
        finally:
            self._note(started, cls, count, key)

    def _note(self, started: float, cls: str, count: int, key: str) -> None:
        ended = time.monotonic()
        self._journal.add(Request(started, ended, self._node, cls, count, category_of(key), key))

    def put(self, path: str, file: bytes, **options: Any) -> Any:
        return self._request("PUT", path, 1, lambda: self._bucket.put(path, file, **options))

    def get(self, path: str, **options: Any) -> Any:
        return self._request("GET", path, 1, lambda: self._bucket.get(path, **options))

    def head(self, path: str) -> Any:
        return self._request("GET", path, 1, lambda: self._bucket.head(path))

    def list(
        self, prefix: str | None = None, *, offset: str | None = None, chunk_size: int = 50
    ) -> _Listing:
        started = time.monotonic()
        items = list(self._bucket.list(prefix, offset=offset).collect())
        pages = max(1, math.ceil(len(items) / S3_LIST_PAGE_KEYS))
        if self.latency_s > 0:
            time.sleep(self.latency_s * pages)
        self._note(started, "LIST", pages, prefix or "")
        return _Listing(items, chunk_size)

    def delete(self, paths: str | Sequence[str]) -> None:
        keys = [paths] if isinstance(paths, str) else list(paths)
        batches = math.ceil(len(keys) / S3_DELETE_BATCH_KEYS)
        self._request(
            "DELETE", keys[0] if keys else "", batches, lambda: self._bucket.delete(paths)
        )


def slow_mailbox(
    bucket: MemoryStore | LocalStore, *, node: str, journal: Journal, latency_s: float = 0.0
) -> Mailbox:
    """gm's real mailbox over ``bucket``, every request delayed ``latency_s`` and journaled.

    The handle carries S3's batching (1000 keys per LIST page and per DELETE batch), so the
    mailbox's meter bills exactly what the journal records.
    """
    store = SlowStore(bucket, node=node, journal=journal, latency_s=latency_s)
    handle = StoreHandle(
        store=store,  # type: ignore[arg-type]  # the sync API the mailbox calls, nothing more
        backend=Backend.FILE if isinstance(bucket, LocalStore) else Backend.MEMORY,
        url=f"{'file' if isinstance(bucket, LocalStore) else 'memory'}://bench/{node}",
        list_page_keys=S3_LIST_PAGE_KEYS,
        delete_batch_keys=S3_DELETE_BATCH_KEYS,
    )
    return Mailbox(handle, MailboxOptions(seed=0))
