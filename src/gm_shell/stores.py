"""From a mailbox URL to an obstore store, with the backend facts the mailbox needs.

Theory of operation
-------------------
A run lives under one URL: ``memory://[name/prefix]``, ``file:///abs/path``
(or ``file://rel/path``, a folder relative to the working directory: the first
segment is a folder, not a host), ``s3://bucket/prefix`` (AWS, R2, MinIO,
SeaweedFS, HF buckets — anything S3-compatible, through an endpoint),
``gs://bucket/prefix`` or ``az://container/prefix``. :func:`open_store` builds
the obstore store rooted at that prefix, so every key the mailbox handles is
relative to the run.

Settings come from :class:`MailboxOptions`, then from the usual environment
(``AWS_*``, ``GOOGLE_*``, ``AZURE_STORAGE_*``), which obstore reads itself.
Hands-on findings this module encodes:

- ``allow_http`` is an HTTP-client option: it must travel in ``client_options``
  (passing it to ``from_url`` as a keyword panics), and it is switched on when
  the endpoint — given here or in ``AWS_ENDPOINT_URL`` — is plain ``http://``.
- Three timeouts: connecting (``connect_timeout_s``), the first byte of an
  answer and any stall after it (``read_timeout_s``, obstore's read timeout,
  which resets after every successful read), and the whole transfer
  (``request_timeout_s``, sized for the largest payload). An endpoint that
  accepts connections and never answers fails within the read timeout instead
  of the transfer timeout.
- obstore's own retry budget defaults to 10 retries within 180 s, far too long
  to notice a dead endpoint. It is switched off (``max_retries=0``): the mailbox
  retries itself, with a seeded jitter it owns and a meter that sees every
  attempt (an attempt obstore retried internally would be billed but uncounted).
- Azure's ``use_emulator`` flag pins the endpoint to ``127.0.0.1:10000`` and
  ignores ``endpoint``; for Azurite we pass its well-known account, key and the
  endpoint explicitly instead.
- ``memory://`` with no name is a fresh private store; ``memory://name/...``
  names one process-wide store, so several mailboxes in one process (a test
  cluster) can share a bucket the way separate machines share S3. It is never
  shared between processes: a second process that opens the same named URL
  gets a warning saying so (locked marker files in the temp folder), rather
  than silently making a second run.

The handle also records how the backend batches requests, which the meter
needs because obstore does not report HTTP requests: list pages (S3 and GCS
return up to 1000 keys per LIST, Azure 5000) and bulk deletes (S3 deletes up
to 1000 keys per request, Azure 256 per batch, the others one per key).
"""

from __future__ import annotations

import atexit
import enum
import fcntl
import hashlib
import os
import tempfile
import threading
import warnings
from collections.abc import Mapping
from datetime import timedelta
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, cast
from urllib.parse import urlsplit

import attrs
from obstore.store import AzureStore, GCSStore, LocalStore, MemoryStore, S3Store

if TYPE_CHECKING:
    from obstore.store import ClientConfig, ObjectStore, RetryConfig

AZURITE_ACCOUNT = "devstoreaccount1"
AZURITE_KEY = (
    "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
)
"""Azurite's published development account key (public, not a secret)."""
AZURITE_DEFAULT_ENDPOINT = f"http://127.0.0.1:10000/{AZURITE_ACCOUNT}"


class Backend(enum.StrEnum):
    MEMORY = "memory"
    FILE = "file"
    S3 = "s3"
    GCS = "gcs"
    AZURE = "azure"


@attrs.frozen(kw_only=True)
class MailboxOptions:
    """How to reach a bucket and how hard to try; every field has a safe default.

    Credentials left ``None`` are taken from the environment by obstore.
    """

    endpoint: str | None = None
    """S3-compatible endpoint (R2, MinIO, SeaweedFS…), or Azure blob endpoint
    including the account path (Azurite: ``http://127.0.0.1:10000/devstoreaccount1``)."""
    region: str | None = None
    """S3 region; else ``AWS_REGION`` / ``AWS_DEFAULT_REGION``."""
    access_key_id: str | None = None
    """S3 access key id; else ``AWS_ACCESS_KEY_ID`` (or a profile, or instance metadata)."""
    secret_access_key: str | None = None
    """S3 secret key; else ``AWS_SECRET_ACCESS_KEY``."""
    session_token: str | None = None
    """S3 session token of temporary credentials; else ``AWS_SESSION_TOKEN``."""
    account_name: str | None = None
    """Azure storage account; else ``AZURE_STORAGE_ACCOUNT_NAME``."""
    account_key: str | None = None
    """Azure storage account key; else ``AZURE_STORAGE_ACCOUNT_KEY``."""
    azure_emulator: bool = False
    """Use Azurite's well-known account and key (endpoint defaults to its port 10000)."""
    service_account_path: str | None = None
    """GCS service-account JSON; defaults to ``GOOGLE_APPLICATION_CREDENTIALS``."""
    allow_http: bool | None = None
    """``None``: allowed exactly when the endpoint is ``http://``."""
    connect_timeout_s: float = 5.0
    """Time to open a connection to the endpoint."""
    read_timeout_s: float = 10.0
    """Time to the first byte of an answer, and the longest stall while one arrives:
    how soon a silent endpoint is noticed."""
    request_timeout_s: float = 60.0
    """Whole-request timeout; sized for the largest payload on the slowest link."""
    max_attempts: int = 4
    """Attempts per operation, the first included; transient errors only are retried."""
    backoff_base_s: float = 0.05
    """First retry delay (up to half of it jittered); it doubles with every attempt."""
    backoff_cap_s: float = 2.0
    """The longest retry delay."""
    seed: int | None = None
    """Seed of the retry jitter; ``None`` draws one from the OS."""
    max_concurrency: int = 32
    """Requests in flight at once (worker threads); more callers queue."""
    extra_config: Mapping[str, str] = attrs.field(factory=dict)
    """Passed verbatim to obstore's store config (e.g. ``virtual_hosted_style_request``)."""

    def __attrs_post_init__(self) -> None:
        if self.max_attempts < 1 or self.max_concurrency < 1:
            raise ValueError("max_attempts and max_concurrency must be at least 1")
        if not 0 < self.backoff_base_s <= self.backoff_cap_s:
            raise ValueError("need 0 < backoff_base_s <= backoff_cap_s")
        if min(self.connect_timeout_s, self.read_timeout_s, self.request_timeout_s) <= 0:
            raise ValueError("timeouts must be positive")


@attrs.frozen(kw_only=True)
class StoreHandle:
    """An obstore store rooted at the run prefix, and how its backend batches requests."""

    store: ObjectStore
    backend: Backend
    url: str
    """The URL as given (it holds no secrets: those live in options or the environment)."""
    bucket: str = ""
    """The bucket or container (the folder, for ``file://``), as errors name it."""
    endpoint: str = ""
    """Where requests go, as errors name it (a URL, a cloud's name, or a folder)."""
    list_page_keys: int
    """Keys per LIST request; 0 when listing costs no request (memory, file)."""
    delete_batch_keys: int
    """Keys per DELETE request (1: one request per key)."""


_MEMORY_STORES: dict[str, MemoryStore] = {}
_MEMORY_LOCK = threading.Lock()


SCHEMES = {
    "memory": Backend.MEMORY,
    "file": Backend.FILE,
    "s3": Backend.S3,
    "s3a": Backend.S3,
    "gs": Backend.GCS,
    "gcs": Backend.GCS,
    "az": Backend.AZURE,
    "azure": Backend.AZURE,
    "abfs": Backend.AZURE,
    "abfss": Backend.AZURE,
}
"""Every URL scheme a mailbox serves, and its backend."""

SUPPORTED = "memory://, file://, s3:// (AWS, R2, MinIO, any S3-compatible endpoint), gs://, az://"


def local_path(url: str) -> Path | None:
    """The folder a ``file:`` URL names, or None for another scheme.

    ``file:///abs/path`` and ``file://localhost/abs/path`` are absolute;
    ``file://rel/path`` (and ``file:rel/path``) name a folder relative to the
    working directory, so the first segment is never read as a host.
    """
    parts = urlsplit(url)
    if parts.scheme.lower() != "file":
        return None
    if parts.netloc in ("", "localhost") and parts.path.startswith("/"):
        return Path(parts.path)
    relative = f"{parts.netloc}{parts.path}" if parts.netloc else parts.path
    return Path.cwd() / relative


def open_store(url: str, options: MailboxOptions) -> StoreHandle:
    """Build the store for ``url``; raises ValueError for a URL it cannot serve.

    No request is sent: obstore connects lazily, on the first operation (a
    ``file://`` folder is made here, and a folder that cannot be made is named).
    """
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    bucket = parts.netloc
    prefix = parts.path.strip("/") or None
    if parts.query or parts.fragment:
        raise ValueError(f"mailbox URL takes no query or fragment: {url!r}")
    backend = SCHEMES.get(scheme)
    if backend is None:
        raise ValueError(f"unsupported mailbox URL scheme {scheme!r} in {url!r}: use {SUPPORTED}")
    if backend is Backend.MEMORY:
        return StoreHandle(
            store=_memory_store(bucket, prefix),
            backend=backend,
            url=url,
            bucket=bucket,
            endpoint="this process's memory",
            list_page_keys=0,
            delete_batch_keys=1,
        )
    if backend is Backend.FILE:
        folder = local_path(url)
        assert folder is not None
        return StoreHandle(
            store=_local_store(folder),
            backend=backend,
            url=url,
            bucket=str(folder),
            endpoint=str(folder),
            list_page_keys=0,
            delete_batch_keys=1,
        )
    if not bucket:
        raise ValueError(f"mailbox URL names no bucket or container: {url!r}")
    store: ObjectStore
    if backend is Backend.S3:
        store, endpoint = _s3_store(bucket, prefix, options)
        page, batch = 1000, 1000
    elif backend is Backend.GCS:
        store, endpoint = _gcs_store(bucket, prefix, options)
        page, batch = 1000, 1
    else:
        store, endpoint = _azure_store(bucket, prefix, options)
        page, batch = 5000, 256
    return StoreHandle(
        store=store,
        backend=backend,
        url=url,
        bucket=bucket,
        endpoint=endpoint,
        list_page_keys=page,
        delete_batch_keys=batch,
    )


def _local_store(folder: Path) -> LocalStore:
    """The store of a local folder, made first (obstore's own mkdir names no path)."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        reason = error.strerror or type(error).__name__
        raise ValueError(
            f"cannot make the mailbox folder {folder}: {reason}; choose a folder you can write"
        ) from None
    return LocalStore(folder)


def _memory_store(name: str, prefix: str | None) -> MemoryStore:
    """A fresh store for ``memory://``; one shared store per ``memory://name/prefix``."""
    if not name:
        return MemoryStore()
    url = f"memory://{name}/{prefix or ''}".rstrip("/")
    _warn_if_shared_across_processes(url)
    with _MEMORY_LOCK:
        return _MEMORY_STORES.setdefault(url, MemoryStore())


MEMORY_MARKERS = Path(tempfile.gettempdir()) / f"gm-memory-{os.getuid()}"
"""Where each process notes the memory:// URLs it opened (one locked file per URL and pid)."""

_HELD: dict[Path, IO[bytes]] = {}
"""This process's markers, open and locked for as long as it lives."""


def _warn_if_shared_across_processes(url: str) -> None:
    """Warn when another live process has opened the same memory:// URL.

    A memory store lives inside one process: two processes given one memory://
    URL make two runs that never see each other, which looks like a working
    run with too few learners. Each process holds an exclusive ``flock`` on a
    marker file per URL for as long as it lives; the kernel drops the lock when
    the process ends, however it ends, so a marker whose lock can be taken is a
    leftover (removed), and one whose lock cannot is a live process.
    """
    digest = hashlib.sha256(url.encode()).hexdigest()[:16]
    mine = MEMORY_MARKERS / f"{digest}.{os.getpid()}"
    try:
        MEMORY_MARKERS.mkdir(exist_ok=True)
        if mine not in _HELD:
            held = mine.open("wb")
            fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
            _HELD[mine] = held
            atexit.register(held.close)  # the lock would go with the process anyway
        live = [int(p.suffix[1:]) for p in MEMORY_MARKERS.glob(f"{digest}.*") if _held(p, mine)]
    except OSError:
        return  # no temp folder to compare notes in: nothing to warn with
    if live:
        warnings.warn(
            f"{url} is also open in process {min(live)}: a memory:// mailbox lives inside"
            " one process, so these processes make separate runs that never meet; give"
            " every process the same file:// folder or bucket URL instead",
            RuntimeWarning,
            stacklevel=4,
        )


def _held(marker: Path, mine: Path) -> bool:
    """Whether another live process holds ``marker``; a leftover marker is removed."""
    if marker == mine:
        return False
    try:
        with marker.open("rb") as probe:
            fcntl.flock(probe, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except FileNotFoundError:
        return False
    marker.unlink(missing_ok=True)
    return False


def _client_options(options: MailboxOptions, endpoint: str | None) -> ClientConfig:
    client: ClientConfig = {
        "connect_timeout": timedelta(seconds=options.connect_timeout_s),
        "read_timeout": timedelta(seconds=options.read_timeout_s),
        "timeout": timedelta(seconds=options.request_timeout_s),
    }
    allow_http = options.allow_http
    if allow_http is None:
        allow_http = endpoint is not None and endpoint.lower().startswith("http://")
    if allow_http:
        client["allow_http"] = True
    return client


_NO_RETRIES: RetryConfig = {"max_retries": 0, "retry_timeout": timedelta(seconds=1)}


def _config(pairs: Mapping[str, str | None], options: MailboxOptions) -> dict[str, Any]:
    """Options that are set, then ``extra_config`` (which wins)."""
    config: dict[str, Any] = {k: v for k, v in pairs.items() if v is not None}
    config.update(options.extra_config)
    return config


def _s3_store(bucket: str, prefix: str | None, options: MailboxOptions) -> tuple[S3Store, str]:
    env_endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
    region = options.region or os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
    endpoint = options.endpoint or env_endpoint or f"AWS S3 ({region or 'us-east-1'})"
    config = _config(
        {
            "endpoint": options.endpoint,
            "region": options.region,
            "access_key_id": options.access_key_id,
            "secret_access_key": options.secret_access_key,
            "session_token": options.session_token,
        },
        options,
    )
    store = S3Store(
        bucket,
        prefix=prefix,
        config=cast("Any", config),
        client_options=_client_options(options, options.endpoint or env_endpoint),
        retry_config=_NO_RETRIES,
    )
    return store, endpoint


def _gcs_store(bucket: str, prefix: str | None, options: MailboxOptions) -> tuple[GCSStore, str]:
    config = _config({"service_account": options.service_account_path}, options)
    store = GCSStore(
        bucket,
        prefix=prefix,
        config=cast("Any", config),
        client_options=_client_options(options, None),
        retry_config=_NO_RETRIES,
    )
    return store, "Google Cloud Storage"


def _azure_store(
    container: str, prefix: str | None, options: MailboxOptions
) -> tuple[AzureStore, str]:
    endpoint = options.endpoint
    account, key = options.account_name, options.account_key
    if options.azure_emulator:
        endpoint = endpoint or AZURITE_DEFAULT_ENDPOINT
        account = account or AZURITE_ACCOUNT
        key = key or AZURITE_KEY
    config = _config({"endpoint": endpoint, "account_name": account, "account_key": key}, options)
    store = AzureStore(
        container,
        prefix=prefix,
        config=cast("Any", config),
        client_options=_client_options(options, endpoint),
        retry_config=_NO_RETRIES,
    )
    account = account or os.environ.get("AZURE_STORAGE_ACCOUNT_NAME")
    return store, endpoint or f"https://{account}.blob.core.windows.net"
