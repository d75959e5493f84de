"""Request accounting: what a mailbox asked of its bucket, and what that costs.

Theory of operation
-------------------
Object stores bill per request, by class, and the protocol's design choices
(probe one key instead of listing, list only the closer's folder) exist to keep
that bill small, so every request a :class:`~gm_shell.mailbox.Mailbox` sends is
counted here: by class (LIST, GET — which includes HEAD, PUT, DELETE), with the
bytes sent and received, and with the retries among them (a retried attempt is
billed like any other request, so it is counted in its class *and* as a retry).

A :class:`Meter` is the mutable counter a mailbox owns; :attr:`Meter.stats`
is an immutable :class:`Stats` snapshot that can be subtracted from a later one
to measure a stretch of work. :func:`cost_usd` prices a snapshot with a
:class:`PriceTable`. The defaults are the public per-request list prices:

- ``PRICES_S3``: S3 Standard, LIST/PUT $0.005 per 1000, GET/HEAD $0.0004 per 1000.
- ``PRICES_R2``: Cloudflare R2, class A (LIST, PUT) $0.0045 per 1000,
  class B (GET, HEAD) $0.00036 per 1000.

DELETE is free on both and priced at zero. Storage, egress and free tiers are
ignored on purpose: the figure answers "what does the protocol's chatter cost",
not "what is the bill". Some counts are modelled rather than observed, because
obstore does not report HTTP requests: a LIST is billed one request per page of
the backend's page size, and a batch DELETE one request per batch (see
:mod:`gm_shell.stores`).
"""

from __future__ import annotations

import enum

import attrs


class RequestClass(enum.StrEnum):
    """The billing classes of object-store requests."""

    LIST = "LIST"
    GET = "GET"
    """GET and HEAD: both are billed as reads."""
    PUT = "PUT"
    DELETE = "DELETE"


@attrs.frozen(kw_only=True)
class Stats:
    """An immutable snapshot of a mailbox's request counters.

    ``*_requests`` include retried attempts; ``retries`` counts those attempts
    alone, so ``requests - retries`` is what the caller asked for.
    """

    list_requests: int = 0
    get_requests: int = 0
    put_requests: int = 0
    delete_requests: int = 0
    bytes_in: int = 0
    bytes_out: int = 0
    retries: int = 0
    failures: int = 0
    """Operations that ended in an error after their retries (absent keys are not failures)."""

    def requests(self, cls: RequestClass) -> int:
        """Requests of one class, retries included."""
        return {
            RequestClass.LIST: self.list_requests,
            RequestClass.GET: self.get_requests,
            RequestClass.PUT: self.put_requests,
            RequestClass.DELETE: self.delete_requests,
        }[cls]

    @property
    def total_requests(self) -> int:
        return self.list_requests + self.get_requests + self.put_requests + self.delete_requests

    def __add__(self, other: Stats) -> Stats:
        return Stats(**{f: getattr(self, f) + getattr(other, f) for f in _FIELDS})

    def __sub__(self, other: Stats) -> Stats:
        """The work done between two snapshots (``later - earlier``)."""
        return Stats(**{f: getattr(self, f) - getattr(other, f) for f in _FIELDS})

    def as_metrics(self) -> dict[str, int]:
        """Flat metric names, for logging or an exporter."""
        return {f"mailbox_{f}": getattr(self, f) for f in _FIELDS}


_FIELDS: tuple[str, ...] = tuple(a.name for a in attrs.fields(Stats))


class Meter:
    """The mutable counters behind :class:`Stats`.

    Updated only from the event loop that drives the mailbox (the worker
    threads never touch it), so it needs no lock.
    """

    __slots__ = ("_counts",)

    def __init__(self) -> None:
        self._counts: dict[str, int] = dict.fromkeys(_FIELDS, 0)

    def request(self, cls: RequestClass, *, n: int = 1, retry: bool = False) -> None:
        self._counts[f"{cls.lower()}_requests"] += n
        if retry:
            self._counts["retries"] += n

    def sent(self, nbytes: int) -> None:
        self._counts["bytes_out"] += nbytes

    def received(self, nbytes: int) -> None:
        self._counts["bytes_in"] += nbytes

    def failed(self) -> None:
        self._counts["failures"] += 1

    @property
    def stats(self) -> Stats:
        return Stats(**self._counts)


@attrs.frozen(kw_only=True)
class PriceTable:
    """US dollars per 1000 requests of each class."""

    name: str
    list_per_1000: float
    get_per_1000: float
    put_per_1000: float
    delete_per_1000: float = 0.0

    def per_request(self, cls: RequestClass) -> float:
        per_1000 = {
            RequestClass.LIST: self.list_per_1000,
            RequestClass.GET: self.get_per_1000,
            RequestClass.PUT: self.put_per_1000,
            RequestClass.DELETE: self.delete_per_1000,
        }[cls]
        return per_1000 / 1000.0


PRICES_S3 = PriceTable(
    name="s3-standard", list_per_1000=0.005, get_per_1000=0.0004, put_per_1000=0.005
)
PRICES_R2 = PriceTable(name="r2", list_per_1000=0.0045, get_per_1000=0.00036, put_per_1000=0.0045)


def cost_usd(stats: Stats, prices: PriceTable = PRICES_S3) -> float:
    """Request cost of ``stats`` under ``prices`` (storage and egress ignored)."""
    return sum(stats.requests(cls) * prices.per_request(cls) for cls in RequestClass)
