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

In an authenticated run an ETag change alone proves nothing: anyone who can write
to the bucket can rewrite a lease with garbage, or with an authentic lease it
copied earlier, and keep a dead node "live" (a dead closer would never be taken
over). There the observer reads the body and :func:`verified` counts a change as a
renewal only when the body authenticates, names its node, and carries a sequence
number above the last one accepted (spec/protocol.md §16.6). Sequence numbers are
the writer's clock in microseconds (:func:`next_seq`), so they keep rising across
a restart and across the hand-over of a node's lease from its learner to its
closer, with no read of the old lease.

Writes other than the lease prove life too: a closer that lists a learner's new
snapshot *touches* that learner's view as if its lease had changed, and nodes
postpone their next renewal after such a write. That keeps the lease traffic to
what silence needs: a node that writes snapshots more often than it renews never
renews at all.
"""

from __future__ import annotations

from typing import Protocol

import attrs

from gm_core import codec, keys
from gm_core.auth import Envelope, Unauthenticated
from gm_core.commands import Get, Probe, PutOver
from gm_core.records import Lease, Manifest


@attrs.frozen
class LeaseView:
    """What an observer knows of one node's lease, on the observer's own clock.

    ``etag`` is the lease's last seen ETag (None: absent); ``changed_at_s`` is when
    the observer first saw that ETag (or absence).
    """

    etag: str | None
    changed_at_s: float
    seq: int = -1
    """The sequence number of the last renewal accepted (-1: none; read in authenticated runs)."""


def observe(view: LeaseView | None, etag: str | None, now_s: float) -> LeaseView:
    """Record one look at the lease: a new or changed ETag restarts the clock at ``now_s``.

    The same ETag as before keeps ``changed_at_s``: a lease that is not being
    renewed must age, however often it is looked at. ``etag=None`` means the
    lease is absent, and is itself a change when the lease was present.
    """
    if view is not None and view.etag == etag:
        return view
    return LeaseView(etag=etag, changed_at_s=now_s)


def verified(view: LeaseView | None, etag: str | None, seq: int | None, now_s: float) -> LeaseView:
    """One look at a lease whose body was read and checked: ``seq`` is its sequence number,
    None when the body is refused (unauthenticated, undecodable, or another node's).

    A new ETag is a renewal only with a sequence number above the last one accepted; a
    replayed or refused body takes the new ETag (so it is judged once) but keeps the
    view's age, so the node ages as if nothing had been written. A refused body seen
    first counts as no lease at all. An absent lease forgets the sequence number: its
    node left (or its lease was collected), and its next lease starts it afresh.
    """
    if view is not None and view.etag == etag:
        return view
    if etag is None or view is None or view.etag is None:
        if seq is None:
            return observe(view, None, now_s)
        return LeaseView(etag=etag, changed_at_s=now_s, seq=seq)
    if seq is not None and seq > view.seq:
        return LeaseView(etag=etag, changed_at_s=now_s, seq=seq)
    return attrs.evolve(view, etag=etag)


def next_seq(last: int, epoch_us: int | None, now_s: float) -> int:
    """The sequence number of a node's next lease, given the one it wrote last (``last``).

    With an epoch (the shell's wall clock minus its monotonic clock, in µs) it is the
    writer's wall clock in µs, never below ``last + 1``: it rises across restarts of
    the node (on another machine too, up to the clocks' skew) and across the learner
    and closer of one node, which share the clock. Without one, a plain count (the
    model checker and open runs, where no one verifies it).
    """
    if epoch_us is None:
        return last + 1
    return max(last + 1, epoch_us + int(now_s * 1_000_000))


class _LeaseOptions(Protocol):
    @property
    def renew_s(self) -> float | None: ...
    @property
    def lease_epoch_us(self) -> int | None: ...


class Renewing(Protocol):
    """What a machine that writes a lease holds: a closer's state and a learner's alike."""

    @property
    def envelope(self) -> Envelope: ...
    @property
    def node(self) -> str: ...
    @property
    def lease_seq(self) -> int: ...
    @property
    def options(self) -> _LeaseOptions: ...
    @property
    def manifest(self) -> Manifest: ...


def renew_s_of(state: Renewing) -> float:
    """The interval ``state``'s node renews its lease within (:func:`renew_interval_s`)."""
    return renew_interval_s(state.options.renew_s, state.manifest.config.lease_timeout_s)


def renewal(state: Renewing, req: int, roles: tuple[str, ...], now_s: float) -> tuple[PutOver, int]:
    """The write that renews the node's lease now, and the sequence number it carries.

    One place for what a closer and a learner write alike: the lease names the node,
    its roles and the interval it promises to renew within, sealed for the run.
    """
    seq = next_seq(state.lease_seq, state.options.lease_epoch_us, now_s)
    key = keys.lease(state.node)
    lease = Lease(node=state.node, roles=roles, seq=seq, renew_s=renew_s_of(state))
    return PutOver(req=req, key=key, data=state.envelope.pack(key, lease)), seq


def touch(view: LeaseView | None, now_s: float) -> LeaseView | None:
    """Other proof of life seen at ``now_s`` (a new snapshot): counts as a renewal.

    Only a lease that is present is touched: a node whose lease is absent has
    left (or never joined), and its last snapshot must not bring it back.
    """
    if view is None or view.etag is None:
        return view
    return LeaseView(etag=view.etag, changed_at_s=now_s)


def renew_interval_s(renew_s: float | None, timeout_s: float) -> float:
    """How long a node may go without writing: ``renew_s``, by default half the timeout.

    The bound that keeps a live node live: it writes something (lease, snapshot or
    record) at most ``1.25 * renew`` apart (:func:`renew_slack_s`), and an observer
    looks at a lease it depends on every ``renew / 2`` (:func:`probe_interval_s`),
    so changes are seen at most ``1.75 * renew`` apart — under the timeout as long
    as ``renew <= timeout / 2``, which is why a larger ``renew_s`` is cut to that.
    """
    if renew_s is not None and renew_s <= 0:
        raise ValueError(f"renew_s must be > 0, got {renew_s}")
    half = timeout_s / 2
    return half if renew_s is None else min(renew_s, half)


def renew_slack_s(renew_s: float) -> float:
    """How long a due renewal may wait for a write that is about to prove life anyway."""
    return renew_s / 4


def probe_interval_s(renew_s: float) -> float:
    """How often an observer looks at a lease it depends on."""
    return renew_s / 2


def is_live(view: LeaseView | None, now_s: float, timeout_s: float) -> bool:
    """Whether the node is live: its lease is present and changed at most ``timeout_s`` ago."""
    if timeout_s < 0:
        raise ValueError(f"timeout_s must be >= 0, got {timeout_s}")
    if view is None or view.etag is None:
        return False
    return now_s - view.changed_at_s <= timeout_s


COLLECT_AFTER_TIMEOUTS = 3
"""A lease unchanged this many timeouts is a crashed node's: it may be deleted."""


def collectable(view: LeaseView | None, now_s: float, timeout_s: float) -> bool:
    """Whether the lease belongs to a node long gone, so deleting it loses nothing.

    Nodes that leave cleanly delete their lease; a crashed one (and every restart
    under a new id) leaves it behind, and each one costs a GET at every listing
    of the leases. Waiting several timeouts past staleness keeps a node that was
    merely paused from losing its lease often; if it does come back, its next
    renewal simply writes the lease again and the next listing finds it.
    """
    if view is None or view.etag is None:
        return False
    return now_s - view.changed_at_s >= COLLECT_AFTER_TIMEOUTS * timeout_s


def read_lease(envelope: Envelope, node: str, data: bytes | None) -> tuple[int | None, str]:
    """The sequence number of the lease body ``data`` found at ``node``'s lease key, for
    :func:`verified`; or None and why it renews nothing (an absent lease: None, "")."""
    if data is None:
        return None, ""
    body = envelope.open(keys.lease(node), data)
    if isinstance(body, Unauthenticated):
        return None, f"unauthenticated ({body.why.value})"
    try:
        lease = codec.decode(Lease, body)
    except codec.CodecError as error:
        return None, f"malformed ({error})"
    if lease.node != node:
        return None, f"names node {lease.node!r}"
    return lease.seq, ""


def look(envelope: Envelope, req: int, node: str) -> Probe | Get:
    """The request that looks at ``node``'s lease: a HEAD (its ETag) in an open run; a GET of
    its body in an authenticated one, where only :func:`verified` bodies renew (§16.6)."""
    key = keys.lease(node)
    return Probe(req=req, key=key) if envelope.auth is None else Get(req=req, key=key)
