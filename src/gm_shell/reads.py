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
  that names nobody, no head hint), and says so (``refused = "too_large"``, which the
  runtime passes on in :class:`gm_core.events.GotObject`); the reader reports the
  refusal as a :class:`~gm_shell.events.Refused` event naming the key, size and cap.
- **Listings** are read up to :data:`gm_shell.limits.MAX_LISTED_KEYS` keys (four pages):
  a flooded folder costs a bounded number of requests and keys per poll, and the first
  cut listing of a prefix is reported as a :class:`~gm_shell.events.ListingCut` event.
- **Payloads** are capped by their reference's size, and a reference is believed
  only up to the most bytes its fragment can take in its wire format
  (:meth:`~gm_shell.fragments.FragmentCodec.limit`); decoding is bounded the same
  way (:func:`~gm_shell.payload.unseal`). Every refusal is ``corrupt``. From S3, GCS
  and Azure a payload's body is decoded as it arrives
  (:meth:`~gm_shell.mailbox.Mailbox.receive`,
  :meth:`~gm_shell.fragments.FragmentCodec.load_received`), never held whole beside
  its decode, and judged against its digest once its last byte is in. A delta of a
  fragment from :attr:`~gm_shell.spill.Spill.above` bytes, read for a merge on the host,
  goes to a spill file instead, from every store (:mod:`gm_shell.spill`).
- **Nothing is downloaded twice while it stays the same.** The reader remembers,
  by ETag, the JSON objects it read (bounded by bytes) and the verdict on every
  payload it refused or judged unusable; reading the key again sends the ETag
  (``If-None-Match``), and an unchanged object is answered from memory: a request,
  no body. A bad record at the next round's key, which every learner polls, is so
  downloaded once per node, and a refused object is reported once.

The reader runs on its runtime's event loop (its memories are loop-only); a
payload is decoded on the mailbox's request thread as its body streams in (S3, GCS,
Azure), or read whole and decoded from the buffer on the worker threads the runtime passes
in (a local folder, memory: no body to spare; decoded as a stream there, zstd's reads call
back into Python and queue for the GIL behind the other threads: a closer's round at zero
latency took 8.4-9.3 ms against 7.5-7.9).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator
from typing import Any, Final, TypeVar, overload

import attrs

from gm_core import keys
from gm_core.events import HeadRead
from gm_core.numerics.arrays import F32
from gm_core.records import PayloadRef, Reason
from gm_shell import events
from gm_shell.backends import Backend, NumpyBackend
from gm_shell.cache import EtagMemory
from gm_shell.fragments import FragmentCodec, Role, UnusablePayloadError
from gm_shell.limits import MAX_LISTED_KEYS, json_limit
from gm_shell.mailbox import Listed, Mailbox, MailboxError, TooLargeError, UnchangedError
from gm_shell.spill import Spill

T = TypeVar("T")
A = TypeVar("A")
Compute = Callable[..., Awaitable[Any]]
"""Runs a CPU-bound function with its arguments off the event loop."""

REFUSED: Final = b""
"""What the core is given for a JSON object refused unread: a document that does not decode."""
TOO_LARGE: Final = "too_large"
"""Why a JSON object was refused unread: it is bigger than its kind's cap."""

JSON_MEMORY_BYTES: Final = 16 << 20
"""JSON objects remembered by ETag (enough for a few records of the largest kind)."""
MEMORY_ENTRIES: Final = 1024
"""Objects (and payload verdicts) remembered by ETag, at most."""

PayloadAt = tuple[PayloadRef, int, Role]
"""A payload as one reader judges it: its reference, fragment and role."""
CUT_MEMORY: Final = 1024
"""Prefixes whose cut listing was reported, at most (then the oldest is reported again)."""


@attrs.frozen(kw_only=True)
class JsonRead:
    """A JSON object as a reader got it: ``refused`` names why its bytes were not read."""

    data: bytes
    etag: str
    refused: str | None = None


async def read_json(mailbox: Mailbox, key: str) -> bytes | None:
    """One capped read of the JSON object at ``key``, for readers that read it once (joining,
    :func:`gm_shell.align.align`, ``gm status``): its bytes, None when absent, and
    ``REFUSED`` (which does not decode) when it is over its cap."""
    try:
        got = await mailbox.get(key, max_bytes=json_limit(key))
    except TooLargeError:
        return REFUSED
    return None if got is None else got.data


async def fetch_head(mailbox: Mailbox) -> HeadRead | None:
    """``head.json``, read while a starting node reads the manifest, for its machines'
    ``Started`` (one round trip less to join or boot); None when the read failed: each
    machine then reads it itself, and retries as it does."""
    try:
        return HeadRead(await read_json(mailbox, keys.head()))
    except MailboxError as error:
        events.LOG.info("%s: head.json not read at start (%s)", mailbox.url, error)
        return None


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
        spill: Spill | None = None,
    ) -> None:
        """``spill``: where and from what size the deltas read for a merge go to disk
        (:mod:`gm_shell.spill`); None: every payload is read into memory."""
        self._node = node
        self._spill = spill
        self._mailbox = mailbox
        self._codec = codec
        self._compute = compute
        self._emit = emit
        self._clock = clock
        self._json: EtagMemory[str, JsonRead] = EtagMemory(MEMORY_ENTRIES, JSON_MEMORY_BYTES)
        self._cut: dict[str, None] = {}
        self._verdicts: EtagMemory[PayloadAt, tuple[Reason, str]] = EtagMemory(
            MEMORY_ENTRIES, MEMORY_ENTRIES
        )

    # -- JSON records ---------------------------------------------------------------------

    async def json(self, key: str) -> JsonRead | None:
        """The object at ``key`` (``REFUSED`` bytes when over its cap), or None if absent."""
        seen = self._json.get(key)
        limit = json_limit(key)
        try:
            got = await self._mailbox.get(
                key, max_bytes=limit, if_none_match=seen.etag if seen else None
            )
        except UnchangedError:
            assert seen is not None
            return seen.value
        except TooLargeError as big:
            self._refused(key, big.size, limit)
            read = JsonRead(data=REFUSED, etag=big.etag, refused=TOO_LARGE)
            self._json.put(key, big.etag, read)
            return read
        if got is None:
            self._json.forget(key)
            return None
        read = JsonRead(data=got.data, etag=got.etag)
        self._json.put(key, got.etag, read, len(got.data))
        return read

    # -- listings -------------------------------------------------------------------------

    async def list(self, prefix: str, offset: str | None = None) -> tuple[list[Listed], bool]:
        """The first :data:`MAX_LISTED_KEYS` keys under ``prefix`` after ``offset``, and
        whether there were more."""
        found, cut = await self._mailbox.list_capped(
            prefix, offset=offset, max_keys=MAX_LISTED_KEYS
        )
        if cut and prefix not in self._cut:
            self._cut[prefix] = None
            if len(self._cut) > CUT_MEMORY:
                del self._cut[next(iter(self._cut))]
            self._emit(
                events.ListingCut(
                    node=self._node,
                    round=_round_of(prefix),
                    detail=f"{prefix}: more than {MAX_LISTED_KEYS:,} keys; read the first"
                    f" {MAX_LISTED_KEYS:,}",
                    at_s=self._clock(),
                    prefix=prefix,
                    limit=MAX_LISTED_KEYS,
                )
            )
        return found, cut

    # -- payloads -------------------------------------------------------------------------

    @overload
    async def payload(self, fragment: int, role: Role, ref: PayloadRef) -> F32: ...
    @overload
    async def payload(
        self, fragment: int, role: Role, ref: PayloadRef, backend: Backend[A] | None
    ) -> A | F32: ...
    async def payload(
        self, fragment: int, role: Role, ref: PayloadRef, backend: Backend[Any] | None = None
    ) -> Any:
        """The payload's fragment, decoded and judged; raises UnusablePayloadError with its key.

        A host array, or with ``backend`` one of its buffers (decoded on its device).
        """
        try:
            return await self._judged(fragment, role, ref, backend)
        except UnusablePayloadError as error:
            raise UnusablePayloadError(error.reason, error.detail, key=ref.key) from None

    async def _judged(
        self, fragment: int, role: Role, ref: PayloadRef, backend: Backend[Any] | None
    ) -> Any:
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
        host = backend is None or isinstance(backend, NumpyBackend)
        spill = self._spill if host and self._codec.spills(fragment, role, self._spill) else None

        def decoded(body: Iterator[memoryview] | memoryview) -> Any:
            """The body decoded as it streams in, or whole (a buffer zstd reads in place)."""
            try:
                if spill is not None:
                    assert not isinstance(body, memoryview), "a spilled body streams"
                    return self._codec.spilled(fragment, role, ref, body, spill)
                if isinstance(body, memoryview):
                    load: Any = self._codec.load  # either overload: ``backend`` may be None
                    return load(fragment, role, ref, body, backend)
                return self._codec.load_received(fragment, role, ref, body, backend)
            except UnusablePayloadError as error:
                return error  # a verdict, remembered with the object's ETag below

        # Else one chunk, the whole body, decoded by compute; a spilled one always streams.
        streams = self._mailbox.streams or spill is not None
        try:
            got = await self._mailbox.receive(
                ref.key,
                decoded if streams else next,
                max_bytes=ref.size,
                if_none_match=seen.etag if seen else None,
                stream=spill is not None,
            )
        except UnchangedError:
            assert seen is not None
            raise UnusablePayloadError(*seen.value) from None
        except TooLargeError as big:
            self._refused(ref.key, big.size, ref.size)
            reason, message = Reason.CORRUPT, f"{ref.key}: {big.size} bytes, not {ref.size}"
            self._verdicts.put(at, big.etag, (reason, message))
            raise UnusablePayloadError(reason, message) from None
        if got is None:
            raise UnusablePayloadError(Reason.MISSING, f"{ref.key} is absent")
        value = got.value if streams else await self._compute(decoded, got.value)
        if isinstance(value, UnusablePayloadError):
            self._verdicts.put(at, got.etag, (value.reason, value.detail))
            raise value
        return value

    # -- reporting ------------------------------------------------------------------------

    def _refused(self, key: str, size: int, limit: int) -> None:
        self._emit(
            events.Refused(
                node=self._node,
                round=_round_of(key),
                detail=f"{key}: {size:,} bytes, over the {limit:,}-byte limit",
                at_s=self._clock(),
                key=key,
                size=size,
                limit=limit,
            )
        )


def _round_of(key: str) -> int:
    """The round a key (or a round's folder, ``snapshots/{r}/``) names, -1 when none."""
    try:
        round_: int = getattr(keys.parse(key), "round", -1)
    except keys.BadKey:
        segments = key.split("/")
        return int(segments[1]) if len(segments) > 2 and segments[1].isdecimal() else -1
    return round_
