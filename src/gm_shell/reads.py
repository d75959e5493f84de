"""Bounded reads: what a node downloads from the bucket, capped before the body arrives.

Theory of operation
-------------------
Every byte in the bucket is hostile until judged (DESIGN.md §7), and a reader's
memory must not depend on what others wrote. So every object the machines read
goes through a :class:`Reader`, which asks the mailbox for it with a cap
(:meth:`~gm_shell.mailbox.Mailbox.get` ``max_bytes``): a bigger object is refused
from its reply's headers, its body never read.

- **JSON records** are capped by the kind their key names
  (:func:`gm_shell.limits.json_limit`). A refused one is handed to the core as an
  empty document, which every machine already answers as it answers garbage at
  that key (a record that does not decode, a snapshot rejected ``corrupt``, a claim
  that names nobody, no head hint); the reader reports the refusal as a
  :class:`~gm_shell.events.Refused` event naming the key, size and cap.
- **Payloads** are capped by their reference's size, and a reference is believed
  only up to the most bytes its fragment can take in its wire format
  (:meth:`~gm_shell.fragments.FragmentCodec.limit`); decoding is bounded the same
  way (:func:`~gm_shell.payload.unseal`). Every refusal is ``corrupt``.
- **Nothing is downloaded twice while it stays the same.** The reader remembers,
  by ETag, the JSON objects it read (bounded by bytes) and the verdict on every
  payload it refused or judged unusable; reading the key again sends the ETag
  (``If-None-Match``), and an unchanged object is answered from memory: a request,
  no body. A bad record at the next round's key, which every learner polls, is so
  downloaded once per node, and a refused object is reported once.

The reader runs on its runtime's event loop (its memories are loop-only); decoding
runs on the worker threads the runtime passes in.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Final, TypeVar

from gm_core import keys
from gm_core.numerics.arrays import F32
from gm_core.records import PayloadRef, Reason
from gm_shell import events
from gm_shell.cache import EtagMemory
from gm_shell.fragments import FragmentCodec, Role, UnusablePayloadError
from gm_shell.limits import json_limit
from gm_shell.mailbox import Got, Mailbox, TooLargeError, UnchangedError

T = TypeVar("T")
Compute = Callable[..., Awaitable[Any]]
"""Runs a CPU-bound function with its arguments off the event loop."""

REFUSED: Final = b""
"""What the core is given for a JSON object refused unread: a document that does not decode."""

JSON_MEMORY_BYTES: Final = 16 << 20
"""JSON objects remembered by ETag (enough for a few records of the largest kind)."""
MEMORY_ENTRIES: Final = 1024
"""Objects (and payload verdicts) remembered by ETag, at most."""

PayloadAt = tuple[PayloadRef, int, Role]
"""A payload as one reader judges it: its reference, fragment and role."""


async def read_json(mailbox: Mailbox, key: str) -> bytes | None:
    """One capped read of the JSON object at ``key``, for readers that read it once (joining,
    :func:`gm_shell.align.align`, ``gm status``): its bytes, None when absent, and
    ``REFUSED`` (which does not decode) when it is over its cap."""
    try:
        got = await mailbox.get(key, max_bytes=json_limit(key))
    except TooLargeError:
        return REFUSED
    return None if got is None else got.data


class Reader:
    """Capped, remembered reads of one node's mailbox (loop thread only)."""

    def __init__(
        self,
        *,
        node: str,
        mailbox: Mailbox,
        codec: FragmentCodec,
        compute: Compute,
        emit: Callable[[events.Event], None],
        clock: Callable[[], float],
    ) -> None:
        self._node = node
        self._mailbox = mailbox
        self._codec = codec
        self._compute = compute
        self._emit = emit
        self._clock = clock
        self._json: EtagMemory[str, bytes] = EtagMemory(MEMORY_ENTRIES, JSON_MEMORY_BYTES)
        self._verdicts: EtagMemory[PayloadAt, tuple[Reason, str]] = EtagMemory(
            MEMORY_ENTRIES, MEMORY_ENTRIES
        )

    # -- JSON records ---------------------------------------------------------------------

    async def json(self, key: str) -> Got | None:
        """The object at ``key`` (``REFUSED`` bytes when over its cap), or None if absent."""
        seen = self._json.get(key)
        limit = json_limit(key)
        try:
            got = await self._mailbox.get(
                key, max_bytes=limit, if_none_match=seen.etag if seen else None
            )
        except UnchangedError:
            assert seen is not None
            return Got(data=seen.value, etag=seen.etag)
        except TooLargeError as big:
            self._refused(key, big.size, limit)
            self._json.put(key, big.etag, REFUSED)
            return Got(data=REFUSED, etag=big.etag)
        if got is None:
            self._json.forget(key)
            return None
        self._json.put(key, got.etag, got.data, len(got.data))
        return got

    # -- payloads -------------------------------------------------------------------------

    async def payload(self, fragment: int, role: Role, ref: PayloadRef) -> F32:
        """The payload's fragment, decoded and judged; raises UnusablePayloadError."""
        at = (ref, fragment, role)
        limit = self._codec.limit(fragment, role)
        if ref.size > limit:
            self._refused(ref.key, ref.size, limit)
            raise UnusablePayloadError(
                Reason.CORRUPT,
                f"{ref.key}: the reference declares {ref.size} bytes, more than a payload of"
                f" fragment {fragment} can take ({limit})",
            )
        seen = self._verdicts.get(at)
        try:
            got = await self._mailbox.get(
                ref.key, max_bytes=ref.size, if_none_match=seen.etag if seen else None
            )
        except UnchangedError:
            assert seen is not None
            raise UnusablePayloadError(*seen.value) from None
        except TooLargeError as big:
            self._refused(ref.key, big.size, ref.size)
            reason, message = Reason.CORRUPT, f"{ref.key}: {big.size} bytes, not {ref.size}"
            self._verdicts.put(at, big.etag, (reason, message))
            raise UnusablePayloadError(reason, message) from None
        data = None if got is None else got.data
        try:
            value: F32 = await self._compute(self._codec.load, fragment, role, ref, data)
        except UnusablePayloadError as error:
            if got is not None:
                self._verdicts.put(at, got.etag, (error.reason, error.detail))
            raise
        return value

    # -- reporting ------------------------------------------------------------------------

    def _refused(self, key: str, size: int, limit: int) -> None:
        try:
            round_ = getattr(keys.parse(key), "round", -1)
        except keys.BadKey:
            round_ = -1
        self._emit(
            events.Refused(
                node=self._node,
                round=round_,
                detail=f"{key}: {size:,} bytes, over the {limit:,}-byte limit",
                at_s=self._clock(),
                key=key,
                size=size,
                limit=limit,
            )
        )
