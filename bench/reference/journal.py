"""The request journal both sides of the comparison keep: who sent what, when, and in what order.

Standard library only, so the reference's harness (``bench/.venv-ref``, Python 3.12) and gm's
(``bench/latency.py``, gm's venv) share one definition of a request, of the counts by class
and by protocol object, and of the rule that counts sequential requests (:func:`waves`).
Times are whatever clock the producer stamps with; a figure only compares them to each other.
"""

from __future__ import annotations

import math
import threading
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

CLASSES = ("LIST", "GET", "PUT", "DELETE")


@dataclass(frozen=True)
class Request:
    """One request: when it started and ended, who sent it, its class, how many it bills."""

    started: float
    ended: float
    node: str
    cls: str
    count: int
    category: str
    key: str
    created: bool | None = None


def category_of(key: str) -> str:
    """The protocol object a key or prefix belongs to: its first segment (two for blobs)."""
    parts = key.split("/")
    if parts[0] == "blobs" and len(parts) > 1:
        return f"blobs/{parts[1]}"
    return parts[0]


class Journal:
    """Every request of every metered store of a run, appended from any thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._requests: list[Request] = []

    def add(self, request: Request) -> None:
        with self._lock:
            self._requests.append(request)

    def snapshot(self) -> list[Request]:
        with self._lock:
            return list(self._requests)

    def requests(
        self, node: str | None = None, since: float = -math.inf, until: float = math.inf
    ) -> list[Request]:
        """Requests of ``node`` (every node: None) that started in ``[since, until)``."""
        return [
            r
            for r in self.snapshot()
            if (node is None or r.node == node) and since <= r.started < until
        ]


def by_class(requests: Iterable[Request]) -> dict[str, int]:
    counts = Counter(dict.fromkeys(CLASSES, 0))
    for r in requests:
        counts[r.cls] += r.count
    return dict(counts)


def by_category(requests: Iterable[Request]) -> dict[str, dict[str, int]]:
    """Requests per protocol object, then per class."""
    table: dict[str, Counter[str]] = {}
    for r in requests:
        table.setdefault(r.category, Counter())[r.cls] += r.count
    return {cat: dict(counts) for cat, counts in sorted(table.items())}


def waves(requests: Iterable[Request]) -> int:
    """How many groups of overlapping requests ran one after another.

    A new group starts at a request that begins after every earlier request has ended;
    requests that overlap ran in parallel and count once.
    """
    count, horizon = 0, -math.inf
    for r in sorted(requests, key=lambda r: r.started):
        if r.started >= horizon:
            count += 1
            horizon = r.ended
        else:
            horizon = max(horizon, r.ended)
    return count
