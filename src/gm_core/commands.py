"""Commands: the effects a state machine asks its shell to perform.

Theory of operation
-------------------
A transition never performs an effect; it returns command values. The shell (or
the simulator, or the model checker) interprets each one and feeds its outcome
back as an event carrying the same ``req`` number, success or failure alike, so
the machine always learns what became of what it asked for. Store commands name
keys relative to the run prefix; payload commands name work on tensors that only
the shell holds (the core sees payloads as :class:`~gm_core.records.PayloadRef`).
"""

from __future__ import annotations

import attrs

from gm_core.records import Alignment, FragmentState, PayloadRef


@attrs.frozen(kw_only=True)
class Get:
    """Read one object; a missing object is an ordinary outcome, not a failure."""

    req: int
    key: str


@attrs.frozen(kw_only=True)
class Probe:
    """Ask for an object's etag only (a HEAD request)."""

    req: int
    key: str


@attrs.frozen(kw_only=True)
class PutOnce:
    """Create an object only if the key is free (``If-None-Match: *``)."""

    req: int
    key: str
    data: bytes


@attrs.frozen(kw_only=True)
class PutOver:
    """Write an object, replacing any previous one (leases and hints only)."""

    req: int
    key: str
    data: bytes


@attrs.frozen(kw_only=True)
class List:
    """List keys under ``prefix`` that sort after ``offset``."""

    req: int
    prefix: str
    offset: str | None = None


@attrs.frozen(kw_only=True)
class Delete:
    req: int
    keys: tuple[str, ...]


@attrs.frozen(kw_only=True)
class DeletePrefix:
    """Delete every object under ``prefix`` (garbage collection, off the critical path)."""

    req: int
    prefix: str


@attrs.frozen(kw_only=True)
class Capture:
    """Learner: publish the delta ``anchor - theta`` of ``fragment`` as taken at this step.

    The shell copies the fragment on the training thread at the step the command
    was issued, encodes and hashes it off the loop, and writes it create-once
    under ``keys.payload(round, digest)``.
    """

    req: int
    round: int
    fragment: int


@attrs.frozen(kw_only=True)
class Verify:
    """Closer: fetch a snapshot's payload and check hash, shapes and finiteness."""

    req: int
    round: int
    learner: str
    payload: PayloadRef


@attrs.frozen(kw_only=True)
class Contribution:
    learner: str
    payload: PayloadRef
    weight: float
    final: bool


@attrs.frozen(kw_only=True)
class Merge:
    """Closer: merge the contributions, apply the outer step, write the new payloads."""

    req: int
    round: int
    fragment: int
    base: FragmentState
    contributions: tuple[Contribution, ...]
    final_only: bool


@attrs.frozen(kw_only=True)
class Align:
    """Learner: fold the committed ``theta`` of round ``round`` into the model."""

    req: int
    round: int
    fragment: int
    version: int
    theta: PayloadRef
    mode: Alignment
    """One of :data:`gm_core.records.FOLDS` (under an ``adaptive`` run, the fragment's mode)."""
    mixing: float
    from_snapshot: bool
    """Carry replays only the steps after this learner's snapshot of the round (it is in
    the commit); otherwise every step since the fragment's anchor (it is not)."""


@attrs.frozen(kw_only=True)
class Fetch:
    """Learner, joining: read and decode the committed ``theta`` of ``fragment`` ahead of its
    :class:`Align`, while the walk still checks the record that names it. No outcome: the
    shell only keeps what it read for the load that may follow (never the model's values
    before that load), and a failed read is read again by the load."""

    fragment: int
    theta: PayloadRef


@attrs.frozen(kw_only=True)
class WakeAt:
    """Deliver a :class:`~gm_core.events.TimerFired` no earlier than ``at_s``.

    A machine has one timer: a new ``WakeAt`` replaces the previous one.
    """

    at_s: float


@attrs.frozen(kw_only=True)
class Pace:
    """Learner: the next local step at which the core needs to hear of progress.

    Until ``next_step`` the shell's ``step()`` is an increment and a compare.
    ``stalled`` tells the shell to block training until a later ``Pace`` lifts it.
    """

    next_step: int
    stalled: bool


@attrs.frozen(kw_only=True)
class Share:
    """Tell this node's other machine, if it runs one, that this machine created ``key``
    holding ``data`` (a create-once write that is known to have landed).

    The shell feeds it to that machine as :class:`~gm_core.events.Shared` at once, in the
    same turn of the loop as the write's outcome. A node that learns and closes then
    hears of its own snapshot and its own record without a listing or a probe: between
    two of its machines, the store's poll was the only messenger, and on a node whose
    learner waits at ``in_flight`` for its own closer's record it cost up to two poll
    intervals per round (bench_step). What a machine does with it is its own decision;
    the key alone tells which object it is.
    """

    key: str
    data: bytes


@attrs.frozen(kw_only=True)
class Notify:
    """Something a user may want to know (to callbacks and logging); no effect on the store."""

    kind: str
    round: int
    detail: str = ""


StoreCommand = Get | Probe | PutOnce | PutOver | List | Delete | DeletePrefix
PayloadCommand = Capture | Verify | Merge | Align
Command = StoreCommand | PayloadCommand | Fetch | WakeAt | Pace | Share | Notify
