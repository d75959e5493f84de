"""Events: past-tense facts fed to a state machine.

Theory of operation
-------------------
Every event carries ``now_s``, the observer's own clock, so time enters the core
only here. Outcomes of commands carry the command's ``req``; a failure is an
event too (:class:`RequestFailed`), never an exception, so a machine can retry,
back off or give up explicitly.
"""

from __future__ import annotations

import attrs

from gm_core.records import PayloadRef, Reason, Requests


@attrs.frozen
class HeadRead:
    """``head.json`` as the shell read it just before the start, unjudged (``data`` None:
    there was none)."""

    data: bytes | None


@attrs.frozen(kw_only=True)
class Started:
    now_s: float
    head: HeadRead | None = None
    """The head hint, read with the manifest (a starting node's first reads go out
    together); None: the machine reads it itself. A hint either way: the walk judges it
    (:func:`gm_core.tape.parse_head`), and one read a moment early can only lag."""


@attrs.frozen(kw_only=True)
class TimerFired:
    now_s: float


@attrs.frozen(kw_only=True)
class Stepped:
    """The learner's training loop reached local step ``step`` having seen ``tokens`` in all."""

    now_s: float
    step: int
    tokens: int


@attrs.frozen(kw_only=True)
class CloseRequested:
    now_s: float
    keep_lease: bool = False
    """A learner leaves its lease to its node's closer (an elected ``either`` node)."""


@attrs.frozen(kw_only=True)
class Shared:
    """This node's other machine created ``key`` holding ``data`` (see
    :class:`~gm_core.commands.Share`): the object is in the store, as a read of the key
    would find it, learned without one."""

    now_s: float
    key: str
    data: bytes


@attrs.frozen(kw_only=True)
class GotObject:
    """Outcome of Get; ``data`` is None when the object is absent.

    ``refused`` names why the shell did not read an object that is there
    (``"too_large"``: over its kind's cap, refused from its size alone); ``data`` is then
    ``b""``, which no reader decodes, so a machine that ignores the field still treats it
    as garbage at that key.
    """

    now_s: float
    req: int
    data: bytes | None
    etag: str | None
    refused: str | None = None


@attrs.frozen(kw_only=True)
class Probed:
    now_s: float
    req: int
    etag: str | None


@attrs.frozen(kw_only=True)
class PutDone:
    """Outcome of PutOnce/PutOver; ``created`` is False when a create-once key was taken."""

    now_s: float
    req: int
    created: bool


@attrs.frozen(kw_only=True)
class Listed:
    now_s: float
    req: int
    keys: tuple[str, ...]
    cut: bool = False
    """The folder held more keys than a node reads of one listing (a flood sorted ahead of
    the rest, spec/protocol.md §16.4.5): keys past ``keys[-1]`` were not read."""


@attrs.frozen(kw_only=True)
class Deleted:
    now_s: float
    req: int


@attrs.frozen(kw_only=True)
class Captured:
    """Outcome of Capture; ``requests`` is the node's store requests so far (its meter)."""

    now_s: float
    req: int
    payload: PayloadRef
    requests: Requests = attrs.field(factory=Requests)


@attrs.frozen(kw_only=True)
class Verified:
    """Outcome of Verify; ``reason`` None means the payload is sound."""

    now_s: float
    req: int
    reason: Reason | None


@attrs.frozen(kw_only=True)
class Merged:
    """Outcome of Merge; ``requests`` is the node's store requests so far (its meter)."""

    now_s: float
    req: int
    theta: PayloadRef
    outer: PayloadRef | None
    update: PayloadRef | None
    cosine: float | None
    requests: Requests = attrs.field(factory=Requests)
    outliers: tuple[str, ...] = ()
    """Learners whose deltas the merge left out as outliers (a robust merge's screen)."""


@attrs.frozen(kw_only=True)
class Aligned:
    """The commit is in the model, applied at the learner's local ``step`` with ``tokens`` seen."""

    now_s: float
    req: int
    step: int
    tokens: int


@attrs.frozen(kw_only=True)
class RequestFailed:
    """Any command that could not be carried out (after the shell's own bounded retries)."""

    now_s: float
    req: int
    error: str


@attrs.frozen(kw_only=True)
class Unusable:
    """A payload that ``Merge`` or ``Align`` needed is missing or fails its checks.

    Unlike a :class:`RequestFailed` (the store did not answer), this is a verdict on
    the object at ``key``: reading it again gives the same answer, so the machine
    decides what to use instead (spec/protocol.md §16.10).
    """

    now_s: float
    req: int
    key: str
    reason: Reason
    detail: str


Outcome = GotObject | Probed | PutDone | Listed | Deleted | Captured | Verified | Merged | Aligned
Event = (
    Started | TimerFired | Stepped | CloseRequested | Shared | Outcome | RequestFailed | Unusable
)
