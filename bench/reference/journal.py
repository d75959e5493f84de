"""The request journal both sides of the comparison keep: who sent what, when, and in what order.

Standard library only, so the reference's harness (``bench/.venv-ref``, Python 3.12) and gm's
(``bench/latency.py``, gm's venv) share one definition of a request, of the counts by class
and by protocol object, and of the rule that counts sequential requests (:func:`waves`).
Times are whatever clock the producer stamps with; a figure only compares them to each other.
"""

from __future__ import annotations

import bisect
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
    """How many requests ran one after another: the longest chain of requests each of
    which started once the one before it had ended (what latency multiplies on the
    critical path; 0 for none).

    Counting groups of overlapping requests instead (a new group at a request that starts
    after every earlier one has ended) counted 1 for two requests in a row beside a long
    one in parallel: gm's 4-trip join printed 3 (session 24).
    """
    ends: list[float] = []
    best: list[int] = [0]  # best[i]: the longest chain among the first i requests by end
    for r in sorted(requests, key=lambda r: (r.ended, r.started)):  # [e, e] after [s, e]
        before = bisect.bisect_right(ends, r.started)
        ends.append(r.ended)
        best.append(max(best[-1], best[before] + 1))
    return best[-1]
