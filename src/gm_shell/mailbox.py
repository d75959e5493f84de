"""The mailbox: the protocol's whole view of the bucket, the same on every backend.

Theory of operation
-------------------
The protocol core emits store commands (create-once put, overwrite, get, probe,
list, delete) over keys relative to the run prefix; a :class:`Mailbox` carries
them out on one obstore store (see :mod:`gm_shell.stores` for URLs) and makes
every backend answer alike:

- **Create-once** is obstore's ``mode="create"`` (``If-None-Match: *`` on S3 and
  GCS, ``If-None-Match`` on Azure, an atomic hard link on a local folder);
  exactly one of any number of concurrent writers gets ``CREATED``.
- **Absent is an answer, not an error**: get and probe return ``None``; delete
  ignores missing keys (local folders and Azure report them as errors).
  A missing *bucket* is an error, though, and S3 and Azure answer a HEAD on a
  missing bucket with a bare 404 like a missing key; so the first time a probe
  finds nothing, one GET of the same key (whose 404 body names the cause)
  confirms the bucket exists — once per mailbox.
- **Lists are sorted** by key (a local folder lists in directory order), and
  ``prefix`` is a plain string prefix like the core's model store (obstore lists
  whole path segments, so the mailbox lists the enclosing folder and filters).
- **ETags are unquoted** everywhere (Azure quotes them in HEAD and PUT replies
  but not in listings).
- **Errors are typed and say what to do.** Transient failures (timeouts,
  connection resets, 5xx, throttling 408/409/425/429) are retried with capped,
  jittered exponential backoff drawn from a seeded :class:`random.Random` the
  mailbox owns, for at most ``max_attempts`` attempts; what is left, and every
  permanent failure (401/403, a folder this user cannot write, missing
  credentials, other 4xx, missing bucket, bad key), is raised at once as a
  :class:`MailboxError` subclass naming the operation, the key, the bucket or
  folder or endpoint, and the fix (:func:`_explain`). A timeout before the
  store has ever answered is not retried: an endpoint that accepts connections
  and stays silent is almost always the wrong endpoint, and retrying would
  multiply the wait (the read timeout) by ``max_attempts``. Missing credentials
  surface in obstore as a failed request to the cloud's instance metadata
  service (169.254.169.254); that is reported as missing credentials.
- **Every request is metered** (:mod:`gm_shell.accounting`), retries included.

Why worker threads and obstore's *synchronous* API, when the mailbox is async:
obstore's async API completes each future from a tokio thread that enters
Python to hand over the result (``call_soon_threadsafe``). If that thread is
still inside Python when the interpreter finalizes, CPython 3.11–3.13 ends it
with ``pthread_exit``, which cannot unwind through Rust frames: the process
aborts (SIGABRT) after the program has finished — about one run in five of a
short script (see :mod:`gm_shell.oneshot`). Through the synchronous API only
threads Python created ever run Python code, and Python joins them before it
finalizes, so that race cannot happen. The cost is a thread hop per request,
which measures the same as the async API's own handoff (``bench/bench_mailbox.py``:
``probe`` against ``raw head``, equal p50 within a few hundredths of a millisecond).
One loop drives a mailbox; its meter and jitter are only touched from it.
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import enum
import functools
import math
import random
import re
import weakref
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, Generic, Self, TypeVar

import attrs
from obstore.exceptions import (
    AlreadyExistsError,
    InvalidPathError,
    NotModifiedError,
    NotSupportedError,
    PermissionDeniedError,
    PreconditionError,
    UnauthenticatedError,
    UnknownConfigurationKeyError,
)
from obstore.exceptions import BaseError as ObstoreError

from gm_shell.accounting import Meter, RequestClass, Stats
from gm_shell.stores import Backend, MailboxOptions, StoreHandle, open_store

if TYPE_CHECKING:
    from obstore import GetOptions

T = TypeVar("T")


class MailboxError(Exception):
    """A store operation failed for good; names the operation, the key, and what to do."""

    def __init__(self, operation: str, key: str | None, detail: str, hint: str = "") -> None:
        self.operation = operation
        self.key = key
        self.detail = detail
        self.hint = hint
        """What the user can do about it (empty when there is nothing to add)."""
        where = f" {key!r}" if key is not None else ""
        message = f"{operation}{where}: {detail}"
        super().__init__(f"{message}. {hint[:1].upper()}{hint[1:]}" if hint else message)


class ConfigError(MailboxError):
    """The URL or options cannot make a store."""


class InvalidKeyError(MailboxError):
    """A key the protocol would never write (empty segment, '..', odd characters)."""


class AccessDeniedError(MailboxError):
    """Credentials missing, wrong, or without the permission (401/403)."""


class BucketMissingError(MailboxError):
    """The bucket or container does not exist."""


class BadRequestError(MailboxError):
    """The store refused the request as malformed or unsupported (other 4xx)."""


class UnavailableError(MailboxError):
    """Transient failures outlasted the retry budget; the store may come back."""


class TooLargeError(MailboxError):
    """An object is bigger than its reader allows: refused before its body is downloaded."""

    def __init__(self, key: str, size: int, limit: int, etag: str = "") -> None:
        super().__init__("get", key, f"the object is {size:,} bytes, over the {limit:,}-byte limit")
        self.size = size
        self.limit = limit
        self.etag = etag
        """The refused object's ETag: a reader may remember its verdict by it."""


class UnchangedError(Exception):
    """The object still has the ETag the reader named (``if_none_match``): nothing was read."""

    def __init__(self, key: str, etag: str) -> None:
        super().__init__(f"get {key!r}: unchanged since ETag {etag}")
        self.key = key
        self.etag = etag


class PutOutcome(enum.Enum):
    CREATED = "created"
    EXISTS = "exists"


@attrs.frozen(kw_only=True)
class Got:
    data: bytes
    etag: str


@attrs.frozen(kw_only=True)
class Consumed(Generic[T]):
    """What a consumer made of an object's body as it arrived (:meth:`Mailbox.receive`)."""

    value: T
    etag: str


STREAM_CHUNK = 1 << 20
"""The least a chunk of a received body holds (obstore's streams default to 10 MiB)."""

WHOLE_BODIES = frozenset({Backend.MEMORY, Backend.FILE})
"""Stores whose bodies :meth:`Mailbox.receive` reads whole, as one chunk: a memory store
holds them whole already, and obstore streams a local file in small reads (a 55 MiB body:
180-300 ms against 35 ms read whole, here), where over HTTP (SeaweedFS, moto, Azurite)
streaming took 52-62 ms against 83-107 ms for a whole read copied out."""


class _StreamError(Exception):
    """A body failed while its consumer read it: the request's failure, not the consumer's."""

    def __init__(self, error: Exception) -> None:
        super().__init__(str(error))
        self.error = error


@attrs.frozen
class _Raised:
    """An exception the consumer raised, carried past the request's retries and typing."""

    error: Exception


def _chunks(stream: Iterable[Any]) -> Iterator[memoryview]:
    """A body's chunks as read-only views of obstore's buffers; a failure while reading
    them is the request's (:class:`_StreamError`)."""
    try:
        for chunk in stream:
            yield memoryview(chunk)
    except Exception as error:
        raise _StreamError(error) from error


RANGE_CHUNK = 8 << 20
"""What a streamed read of a local or memory store asks for at a time (:func:`_ranges`)."""


def _ranges(store: Any, key: str, meta: Any) -> Iterator[memoryview]:
    """The object ``meta`` describes, as ranges of :data:`RANGE_CHUNK` bytes, each read while
    the object is still that version (``if_match``): a local file's stream reads it a few
    KiB at a time (16 MiB in 45-65 ms against 3-15 read whole, here); a failure or a newer
    version midway is the request's failure (:class:`_StreamError`), retried whole."""
    size = int(meta["size"])
    try:
        for start in range(0, size, RANGE_CHUNK):
            end = min(size, start + RANGE_CHUNK)
            options: GetOptions = {"range": (start, end), "if_match": meta["e_tag"]}
            yield memoryview(store.get(key, options=options).bytes())
    except PreconditionError as changed:
        raise _StreamError(_ChangedMidwayError(f"{key} changed while read: {changed}")) from None
    except Exception as error:
        raise _StreamError(error) from error


class _ChangedMidwayError(Exception):
    """An object replaced between two ranges of one read: transient (the read is made
    again, whole, from the version there then)."""


def _copied(result: Any) -> bytes:
    """The body, copied out of obstore's buffer (what :meth:`Mailbox.get` gives)."""
    copied: bytes = result.bytes().to_bytes()
    return copied


@attrs.frozen(kw_only=True)
class Listed:
    key: str
    size: int
    etag: str


_KEY = re.compile(r"[A-Za-z0-9._\-=+,@~]+(/[A-Za-z0-9._\-=+,@~]+)*")
"""Keys are ASCII path segments: every backend stores them verbatim and sorts them
the same way (by byte), and none needs percent-encoding."""

_BUCKET_MISSING = re.compile(
    r"<Code>(NoSuchBucket|ContainerNotFound)</Code>|specified (bucket|container) does not exist"
)
"""The error codes in S3/GCS and Azure reply bodies, and Azure's batch-delete wording; none
can occur inside a valid key (no '<', '>' or spaces), so a key cannot fake them."""
_STATUS = re.compile(r"status code: (\d{3})")
_LOCAL_DENIED = re.compile(r"\(os error (1|13|30)\)")
"""EPERM, EACCES, EROFS from a local folder: permanent, unlike the transient I/O errors."""
_METADATA_SERVICE = re.compile(
    r"169\.254\.169\.254|/latest/api/token|/latest/meta-data/|computeMetadata/"
)
"""Where obstore looks for credentials last: the EC2/GCE instance metadata service (by its
address, or by its paths when ``metadata_endpoint`` moves it)."""
_TIMED_OUT = "kind: Timeout"
"""How obstore's debug dump marks a request that hit a timeout."""
_RETRYABLE_4XX = frozenset({408, 409, 425, 429})
"""Timeout, conflicting concurrent write (S3 asks for a retry), too early, throttled."""

LIST_CHUNK_KEYS = 1000
"""Keys read per step of a listing on stores that do not page (a local folder, memory)."""

_PASS = None
"""Classification of an exception the caller interprets itself (absent, exists)."""


def _classify(exc: BaseException) -> type[MailboxError] | None:
    """The typed error for ``exc``; UnavailableError means retryable; None passes through."""
    text = str(exc)
    if isinstance(exc, FileNotFoundError):
        return BucketMissingError if _BUCKET_MISSING.search(text) else _PASS
    if isinstance(exc, AlreadyExistsError | NotModifiedError):
        return _PASS
    if isinstance(exc, PermissionDeniedError | UnauthenticatedError):
        return AccessDeniedError
    if _METADATA_SERVICE.search(text) or _LOCAL_DENIED.search(text):
        return AccessDeniedError
    if isinstance(
        exc,
        InvalidPathError
        | NotSupportedError
        | UnknownConfigurationKeyError
        | PreconditionError
        | ValueError
        | TypeError,
    ):
        return BadRequestError
    if _BUCKET_MISSING.search(text):
        return BucketMissingError
    status = _STATUS.search(text)
    if status is not None:
        code = int(status.group(1))
        if code in (401, 403):
            return AccessDeniedError
        if 400 <= code < 500 and code not in _RETRYABLE_4XX:
            return BadRequestError
    # 5xx, throttling, timeouts, resets, refused connections, join errors.
    return UnavailableError


def _etag(raw: str | None, meta: Any = None) -> str:
    """One spelling of an ETag: weak marker and quotes removed.

    A backend that reports none gets a stand-in that still changes on every
    write: size and modification time.
    """
    if raw is None:
        if meta is None:
            return ""
        return f"{meta['size']}-{meta['last_modified'].timestamp():.6f}"
    if raw.startswith("W/"):
        raw = raw[2:]
    if len(raw) >= 2 and raw[0] == raw[-1] == '"':
        raw = raw[1:-1]
    return raw


def check_key(key: str, operation: str) -> str:
    """Return ``key`` if the protocol could have written it, else raise InvalidKeyError."""
    if not _KEY.fullmatch(key) or any(s in (".", "..") for s in key.split("/")):
        raise InvalidKeyError(operation, key, "not a relative key of ASCII path segments")
    return key


def _check_prefix(prefix: str, operation: str) -> str:
    """Prefixes may be empty or end in '/'; what comes before must be a valid key."""
    body = prefix[:-1] if prefix.endswith("/") else prefix
    if body:
        check_key(body, operation)
    return prefix


def _list_plan(prefix: str, offset: str | None) -> tuple[str | None, str | None]:
    """The folder obstore must list and the offset to list it from.

    obstore matches prefixes by whole segments; for a partial last segment we
    list its folder and filter. The listing may start after ``prefix[:-1]``:
    every key that starts with ``prefix`` sorts after it.
    """
    if not prefix or prefix.endswith("/"):
        return (prefix.rstrip("/") or None), offset
    folder, _, _ = prefix.rpartition("/")
    below = prefix[:-1]
    start = below if offset is None else max(offset, below)
    return (folder or None), (start or None)


_OPEN: weakref.WeakSet[Mailbox] = weakref.WeakSet()


def close_all() -> None:
    """Close every mailbox still open in this process (see :mod:`gm_shell.oneshot`)."""
    for mailbox in builtins.list(_OPEN):
        mailbox.close()


class Mailbox:
    """Async object-store operations over keys relative to one run prefix."""

    def __init__(self, handle: StoreHandle, options: MailboxOptions) -> None:
        self._handle = handle
        self._store = handle.store
        self._options = options
        self._meter = Meter()
        self._rng = random.Random(options.seed)
        self._pool = ThreadPoolExecutor(
            max_workers=options.max_concurrency, thread_name_prefix="gm-mailbox"
        )
        # Local stores cannot lose their bucket: the folder is made at open.
        self._bucket_confirmed = handle.backend in (Backend.MEMORY, Backend.FILE)
        self._answered = False
        """Whether the store has answered anything yet (see the theory: silent endpoints)."""
        self._closed = False
        _OPEN.add(self)

    @classmethod
    def open(cls, url: str, *, options: MailboxOptions | None = None) -> Mailbox:
        """A mailbox for ``url``; sends nothing until the first operation."""
        options = options or MailboxOptions()
        try:
            handle = open_store(url, options)
        except ValueError as exc:  # ours: the message says what to write instead
            raise ConfigError("open", None, str(exc)) from exc
        except ObstoreError as exc:
            raise ConfigError("open", None, _first_line(exc)) from exc
        if handle.backend is not Backend.FILE:
            # The run prefix joins every key, so it obeys the same rules.
            _, _, prefix = url.split("://", 1)[-1].partition("/")
            if prefix.strip("/") and not _KEY.fullmatch(prefix.strip("/")):
                raise ConfigError("open", None, f"run prefix {prefix!r} is not a valid key")
        return cls(handle, options)

    @property
    def url(self) -> str:
        return self._handle.url

    @property
    def backend(self) -> Backend:
        return self._handle.backend

    @property
    def handle(self) -> StoreHandle:
        """The store and its batching facts (for accounting and tests)."""
        return self._handle

    @property
    def streams(self) -> bool:
        """Whether :meth:`receive` streams bodies (else one chunk: :data:`WHOLE_BODIES`)."""
        return self._handle.backend not in WHOLE_BODIES

    @property
    def stats(self) -> Stats:
        """Requests and bytes so far (an immutable snapshot)."""
        return self._meter.stats

    # -- lifecycle ---------------------------------------------------------

    def close(self) -> None:
        """Wait for requests in flight (each bounded by the request timeout), then stop.

        Idempotent. After it, no thread of this mailbox runs obstore code.
        """
        if not self._closed:
            self._closed = True
            self._pool.shutdown(wait=True, cancel_futures=True)
            _OPEN.discard(self)

    async def aclose(self) -> None:
        """:meth:`close` without blocking the event loop."""
        await asyncio.get_running_loop().run_in_executor(None, self.close)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # -- operations --------------------------------------------------------

    async def put_once(self, key: str, data: bytes | memoryview) -> PutOutcome:
        """Create ``key`` holding ``data`` unless it exists.

        ``EXISTS`` after a retried attempt may mean our own earlier attempt
        landed before its reply was lost; callers that care compare contents
        (the protocol does: a closer adopts whatever record won).
        """
        check_key(key, "put_once")
        try:
            await self._run(
                "put_once",
                key,
                RequestClass.PUT,
                functools.partial(self._store.put, key, data, mode="create", use_multipart=False),
                sent=len(data),
            )
        except AlreadyExistsError:
            return PutOutcome.EXISTS
        return PutOutcome.CREATED

    async def put(self, key: str, data: bytes) -> str:
        """Write ``key``, replacing any previous object; returns the new ETag."""
        check_key(key, "put")
        result = await self._run(
            "put",
            key,
            RequestClass.PUT,
            functools.partial(self._store.put, key, data, use_multipart=False),
            sent=len(data),
        )
        if result["e_tag"] is not None:
            return _etag(result["e_tag"])
        etag = await self.probe(key)
        if etag is None:
            raise UnavailableError("put", key, "object vanished right after it was written")
        return etag

    async def get(
        self, key: str, *, max_bytes: int | None = None, if_none_match: str | None = None
    ) -> Got | None:
        """The object's bytes and ETag, or None when it does not exist.

        With ``max_bytes``, an object whose reply declares more is refused with
        :class:`TooLargeError` once its headers are in, before its body is read:
        a reader never holds more than it allows, whatever sits at the key. With
        ``if_none_match`` (an ETag as this mailbox spells them), an object that
        still has that ETag is answered :class:`UnchangedError`, without its body
        (a conditional GET: every backend here answers 304).
        """
        got = await self._get(key, max_bytes, if_none_match, _copied)
        return None if got is None else Got(data=got[0], etag=got[1])

    async def receive(
        self,
        key: str,
        consume: Callable[[Iterator[memoryview]], T],
        *,
        max_bytes: int | None = None,
        if_none_match: str | None = None,
        stream: bool = False,
    ) -> Consumed[T] | None:
        """:meth:`get`, the body handed to ``consume`` as it arrives, chunk by chunk (at
        least :data:`STREAM_CHUNK` bytes each, on the request's thread), never held whole
        here but on the stores of :data:`WHOLE_BODIES` (one chunk, a view of the body as
        received) unless ``stream`` asks for chunks there too (a consumer that keeps none
        of the body in memory: ranges of :data:`RANGE_CHUNK` bytes there, each a request
        counted): what ``consume`` returns, and the ETag. A body that fails midway is the
        request's failure (retried from its first byte, with a new ``consume`` call); what
        ``consume`` raises reaches the caller as it is."""

        whole = not self.streams
        ranged: list[int] = []  # the size read in ranges (each range a GET)

        def streamed(result: Any) -> T | _Raised:
            try:
                if whole and stream:
                    ranged.append(int(result.meta["size"]))
                    return consume(_ranges(self._store, key, result.meta))
                if whole:
                    return consume(iter((memoryview(result.bytes()),)))
                return consume(_chunks(result.stream(min_chunk_size=STREAM_CHUNK)))
            except _StreamError as failed:
                raise failed.error from None  # the request's: typed and retried by _run
            except Exception as error:
                return _Raised(error)

        got = await self._get(key, max_bytes, if_none_match, streamed)
        if got is None:
            return None
        value, etag = got
        if ranged:
            self._meter.request(RequestClass.GET, n=-(-ranged[-1] // RANGE_CHUNK))
        if isinstance(value, _Raised):
            raise value.error
        return Consumed(value=value, etag=etag)

    async def _get(
        self,
        key: str,
        max_bytes: int | None,
        if_none_match: str | None,
        body: Callable[[Any], T],
    ) -> tuple[T, str] | None:
        """:meth:`get`'s request: ``body`` of obstore's answer (its bytes read, or
        streamed) and the ETag, on the request's thread."""
        check_key(key, "get")
        options: GetOptions = {}
        if if_none_match:
            options["if_none_match"] = f'"{if_none_match}"'  # quoted, as HTTP spells them

        def fetch() -> tuple[T | None, Any]:
            result = self._store.get(key, options=options)
            if max_bytes is not None and result.meta["size"] > max_bytes:
                return None, result.meta  # the body is never read
            return body(result), result.meta

        try:
            data, meta = await self._run("get", key, RequestClass.GET, fetch)
        except FileNotFoundError:
            # A GET's 404 body names a missing bucket, so this absence is real.
            self._bucket_confirmed = True
            return None
        except NotModifiedError:
            assert if_none_match is not None
            raise UnchangedError(key, if_none_match) from None
        etag = _etag(meta["e_tag"], meta)
        if data is None:
            raise TooLargeError(key, meta["size"], max_bytes or 0, etag)
        self._meter.received(meta["size"])
        return data, etag

    async def probe(self, key: str) -> str | None:
        """The object's ETag (a HEAD request), or None when it does not exist."""
        check_key(key, "probe")
        try:
            meta = await self._run(
                "probe", key, RequestClass.GET, functools.partial(self._store.head, key)
            )
        except FileNotFoundError:
            if not self._bucket_confirmed:
                got = await self.get(key)  # raises BucketMissingError if that is the cause
                return None if got is None else got.etag
            return None
        return _etag(meta["e_tag"], meta)

    async def list(self, prefix: str, *, offset: str | None = None) -> builtins.list[Listed]:
        """Objects whose key starts with ``prefix`` and sorts after ``offset``, sorted by key."""
        found, _ = await self.list_capped(prefix, offset=offset)
        return found

    async def list_capped(
        self, prefix: str, *, offset: str | None = None, max_keys: int | None = None
    ) -> tuple[builtins.list[Listed], bool]:
        """:meth:`list`, reading at most ``max_keys`` keys; and whether it reached that cap.

        The listing is read page by page and stops once ``max_keys`` keys are in, so a
        folder that someone flooded costs a bounded number of requests and bytes. A cut
        listing holds the first ``max_keys`` keys in the store's order (by key on object
        stores, directory order in a local folder), before the ``prefix`` filter of a
        partial last segment: it may hold fewer matches.
        """
        _check_prefix(prefix, "list")
        folder, start = _list_plan(prefix, offset)
        page = self._handle.list_page_keys or LIST_CHUNK_KEYS

        def collect() -> tuple[builtins.list[Any], bool]:
            metas: builtins.list[Any] = []
            for chunk in self._store.list(folder, offset=start, chunk_size=page):
                metas.extend(chunk)
                if max_keys is not None and len(metas) >= max_keys:
                    return metas[:max_keys], True
            return metas, False

        metas, cut = await self._run("list", prefix, RequestClass.LIST, collect)
        if self._handle.list_page_keys:
            extra_pages = max(0, math.ceil(len(metas) / page) - 1)
            if extra_pages:
                self._meter.request(RequestClass.LIST, n=extra_pages)
        found = [
            Listed(key=m["path"], size=m["size"], etag=_etag(m["e_tag"], m))
            for m in metas
            if m["path"].startswith(prefix) and (offset is None or m["path"] > offset)
        ]
        found.sort(key=lambda item: item.key)
        return found, cut

    async def delete(self, keys: Iterable[str]) -> None:
        """Delete ``keys`` in as few requests as the backend allows; absent keys are fine."""
        await self._delete(sorted({check_key(k, "delete") for k in keys}))

    async def delete_prefix(self, prefix: str) -> int:
        """Delete every object the listing of ``prefix`` shows; returns how many.

        Listed keys are deleted as they are, even ones our own code would never
        write (a hostile or foreign object must not make garbage collection fail).
        """
        keys = [item.key for item in await self.list(prefix)]
        await self._delete(keys)
        return len(keys)

    # -- machinery ---------------------------------------------------------

    async def _delete(self, todo: builtins.list[str]) -> None:
        if not todo:
            return
        batch = self._handle.delete_batch_keys
        label = todo[0] if len(todo) == 1 else f"{todo[0]} (+{len(todo) - 1} more)"
        try:
            await self._run(
                "delete",
                label,
                RequestClass.DELETE,
                functools.partial(self._store.delete, todo),
                requests=math.ceil(len(todo) / batch),
            )
        except FileNotFoundError:
            # Local folders and Azure fail a batch on its first absent key; finish key by key.
            await asyncio.gather(*(self._delete_one(k) for k in todo))

    async def _delete_one(self, key: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            await self._run(
                "delete", key, RequestClass.DELETE, functools.partial(self._store.delete, key)
            )

    def backoff_s(self, attempt: int) -> float:
        """Delay before attempt ``attempt + 1``: exponential, capped, half of it jittered."""
        ceiling = min(
            self._options.backoff_cap_s, self._options.backoff_base_s * 2.0 ** (attempt - 1)
        )
        return ceiling / 2 + self._rng.random() * ceiling / 2

    async def _run(
        self,
        operation: str,
        key: str,
        cls: RequestClass,
        call: Callable[[], T],
        *,
        sent: int = 0,
        requests: int = 1,
    ) -> T:
        """Run ``call`` on a worker thread with metering, retries and typed errors.

        FileNotFoundError (absent key) and AlreadyExistsError reach the caller
        as they are: they are answers, not failures.
        """
        if self._closed:
            raise RuntimeError(f"{operation} {key!r} on a closed mailbox")
        loop = asyncio.get_running_loop()
        attempt = 0
        while True:
            attempt += 1
            self._meter.request(cls, n=requests, retry=attempt > 1)
            self._meter.sent(sent)
            try:
                result = await loop.run_in_executor(self._pool, call)
            except Exception as exc:
                kind = _classify(exc)
                silent = _TIMED_OUT in str(exc)
                self._answered = self._answered or kind is not UnavailableError
                if kind is None:
                    raise
                if (
                    kind is UnavailableError
                    and attempt < self._options.max_attempts
                    and (self._answered or not silent)
                ):
                    await asyncio.sleep(self.backoff_s(attempt))
                    continue
                self._meter.failed()
                detail, hint = _explain(kind, exc, self._handle, self._options, operation)
                if kind is UnavailableError and attempt > 1:
                    detail = f"gave up after {attempt} attempts: {detail}"
                raise kind(operation, key, detail, hint) from exc
            self._bucket_confirmed = True
            self._answered = True
            return result


_CREDENTIALS = {
    Backend.S3: "set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or AWS_PROFILE), or pass"
    " MailboxOptions(access_key_id=..., secret_access_key=...)",
    Backend.GCS: "set GOOGLE_APPLICATION_CREDENTIALS to a service-account JSON file, or pass"
    " MailboxOptions(service_account_path=...)",
    Backend.AZURE: "set AZURE_STORAGE_ACCOUNT_NAME and AZURE_STORAGE_ACCOUNT_KEY, or pass"
    " MailboxOptions(account_name=..., account_key=...)",
}


def _explain(
    kind: type[MailboxError],
    exc: BaseException,
    handle: StoreHandle,
    options: MailboxOptions,
    operation: str,
) -> tuple[str, str]:
    """What went wrong in the user's terms, and what to do about it."""
    text = str(exc)
    where = handle.endpoint or handle.url
    if kind is AccessDeniedError and _METADATA_SERVICE.search(text):
        fix = _CREDENTIALS.get(handle.backend, "configure credentials for the store")
        return f"no credentials for {handle.url} (none in options or the environment)", fix
    if kind is AccessDeniedError and handle.backend is Backend.FILE:
        return (
            _first_line(exc),
            f"make {handle.bucket} writable by this user, or choose another folder",
        )
    if kind is AccessDeniedError:
        return (
            _first_line(exc),
            f"check that the credentials are right and may {operation} in {handle.bucket!r}"
            f" at {where}",
        )
    if kind is BucketMissingError:
        return (
            f"bucket {handle.bucket!r} does not exist at {where}",
            "create it, or fix the bucket name (or the endpoint) in the mailbox URL",
        )
    if kind is UnavailableError and _TIMED_OUT in text:
        return (
            f"no answer from {where} within the timeout (connect {options.connect_timeout_s:g} s,"
            f" first byte {options.read_timeout_s:g} s, transfer {options.request_timeout_s:g} s)",
            "check the endpoint URL and that the store is reachable from here; a slow link"
            " may need longer MailboxOptions timeouts",
        )
    if kind is UnavailableError and "kind: Connect" in text:
        return (
            f"cannot connect to {where}",
            "check the endpoint URL and that the store is running and reachable",
        )
    return _first_line(exc), ""


def _first_line(exc: BaseException) -> str:
    """obstore messages carry a multi-line debug dump; the first line says what happened."""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"
