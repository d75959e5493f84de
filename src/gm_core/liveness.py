"""Liveness from leases: a node is live while its lease object keeps changing.

Theory of operation
-------------------
Each node overwrites its lease object on every renewal; the store gives every
write a new ETag. An observer never trusts a timestamp written by someone else
(clocks differ between machines): it notes, on its *own* clock, when it last saw
the ETag change, and judges the node live while that was at most ``timeout_s``
ago. A lease that is absent (never written, or deleted when the node left) is not
live. Time enters only as the ``now_s`` argument, so these functions are pure and
the simulator can drive them with virtual time.

A lease seen for the first time counts as just changed: the observer cannot know
how old it is, and granting it one timeout is what lets a node that started
watching late avoid declaring everyone dead at once.
"""

from __future__ import annotations

import attrs


@attrs.frozen
class LeaseView:
    """What an observer knows of one node's lease, on the observer's own clock.

    ``etag`` is the lease's last seen ETag (None: absent); ``changed_at_s`` is when
    the observer first saw that ETag (or absence).
    """

    etag: str | None
    changed_at_s: float


def observe(view: LeaseView | None, etag: str | None, now_s: float) -> LeaseView:
    """Record one look at the lease: a new or changed ETag restarts the clock at ``now_s``.

    The same ETag as before keeps ``changed_at_s``: a lease that is not being
    renewed must age, however often it is looked at. ``etag=None`` means the
    lease is absent, and is itself a change when the lease was present.
    """
    if view is not None and view.etag == etag:
        return view
    return LeaseView(etag=etag, changed_at_s=now_s)


def is_live(view: LeaseView | None, now_s: float, timeout_s: float) -> bool:
    """Whether the node is live: its lease is present and changed at most ``timeout_s`` ago."""
    if timeout_s < 0:
        raise ValueError(f"timeout_s must be >= 0, got {timeout_s}")
    if view is None or view.etag is None:
        return False
    return now_s - view.changed_at_s <= timeout_s
