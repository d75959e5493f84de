"""How long a command takes in the simulated store, what it costs, and whether it fails.

Theory of operation
-------------------
The model store (:mod:`gm_core.store_model`) decides *what* a request does; this
module decides *when* it completes and *whether* it is allowed to. Each command
maps to the object-store requests a real shell would send (a merge of ``k``
deltas is ``k`` GETs and up to two PUTs); its latency is the slowest of them in
parallel, drawn from the per-class lognormal of the :class:`StoreProfile`, plus
its bytes over the bandwidth. Requests are priced at S3 Standard's list prices,
the figure DESIGN.md measures polling against.

Throttling is a sliding one-second window per request class, shared by all
nodes (one bucket prefix): beyond ``throttle_rps`` a request fails at once, as a
503 SlowDown would. Whether a request fails or loses its response is drawn from
the store's own generator, so adding a learner never changes another's speed.
"""

from __future__ import annotations

import collections
import math

import attrs
import numpy as np

from gm_core.commands import (
    Align,
    Capture,
    Command,
    Delete,
    DeletePrefix,
    Get,
    List,
    Merge,
    Probe,
    PutOnce,
    PutOver,
    Verify,
)
from gm_core.sim.scenario import RequestClass, StoreProfile

PRICE_PER_1000: dict[RequestClass, float] = {
    RequestClass.GET: 0.0004,
    RequestClass.PROBE: 0.0004,
    RequestClass.PUT: 0.005,
    RequestClass.LIST: 0.005,
    RequestClass.DELETE: 0.0,
}
"""S3 Standard request prices in USD (us-east-1); DELETE is free."""


@attrs.frozen(kw_only=True)
class Requests:
    """The store requests one command sends, and the payload bytes it moves."""

    classes: tuple[RequestClass, ...]
    payload_bytes: int = 0
    compute_bytes: int = 0


def requests_of(cmd: Command, fragment_bytes: int) -> Requests:
    """What a real shell would send for ``cmd`` (GC deletes count one request each)."""
    r = RequestClass
    if isinstance(cmd, Get):
        return Requests(classes=(r.GET,))
    if isinstance(cmd, Probe):
        return Requests(classes=(r.PROBE,))
    if isinstance(cmd, PutOnce | PutOver):
        return Requests(classes=(r.PUT,))
    if isinstance(cmd, List):
        return Requests(classes=(r.LIST,))
    if isinstance(cmd, Delete | DeletePrefix):
        return Requests(classes=(r.DELETE,))
    if isinstance(cmd, Capture):
        return Requests(classes=(r.PUT,), payload_bytes=fragment_bytes)
    if isinstance(cmd, Verify | Align):
        return Requests(classes=(r.GET,), payload_bytes=fragment_bytes)
    if isinstance(cmd, Merge):
        k = len(cmd.contributions)
        puts = 1 if cmd.final_only else 2
        return Requests(
            classes=(r.GET,) * k + (r.PUT,) * puts,
            payload_bytes=(k + puts) * fragment_bytes,
            compute_bytes=k * fragment_bytes,
        )
    raise TypeError(f"not a command the store carries out: {cmd!r}")


def is_write(cmd: Command) -> bool:
    """Commands whose response may be lost after the write landed."""
    return isinstance(cmd, PutOnce | PutOver | Delete | DeletePrefix)


def latency_s(profile: StoreProfile, reqs: Requests, rng: np.random.Generator) -> float:
    """The slowest of the parallel requests, plus transfer and merge time."""
    slowest = 0.0
    for cls in reqs.classes:
        lat = profile.latency[cls]
        slowest = max(slowest, lat.median_s * math.exp(lat.sigma * float(rng.standard_normal())))
    return (
        slowest
        + reqs.payload_bytes / profile.bandwidth_bps
        + reqs.compute_bytes / (profile.merge_bps)
    )


class Throttle:
    """Sliding one-second windows of admitted requests, one per request class."""

    def __init__(self, rps: float | None) -> None:
        self._rps = rps
        self._windows: dict[RequestClass, collections.deque[float]] = {}

    def admit(self, classes: tuple[RequestClass, ...], now_s: float) -> bool:
        """Whether every request may go now; admitted ones enter their windows."""
        if self._rps is None:
            return True
        for cls in classes:
            window = self._windows.setdefault(cls, collections.deque())
            while window and window[0] <= now_s - 1.0:
                window.popleft()
            if len(window) >= self._rps:
                return False
        for cls in classes:
            self._windows[cls].append(now_s)
        return True


def cost_usd(counts: dict[RequestClass, int]) -> float:
    return sum(n * PRICE_PER_1000[cls] / 1000.0 for cls, n in counts.items())
