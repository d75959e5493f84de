"""Where a node's run key comes from, and when a run may be open.

A run key (32 random bytes, ``gm keygen`` prints one as 64 hex characters) makes a
run *authenticated*: every object its nodes write is tagged under it, and every
object they read must carry a valid tag (gm_core.auth). The key is never written to
the bucket and never logged; every node of the run needs the same one.

Sources, first match wins: the ``run_key=`` argument (bytes, hex text, or None for
an explicitly open run), then ``GM_RUN_KEY`` (hex), then ``GM_RUN_KEY_FILE`` (a file
holding the hex). A remote bucket (``s3://``, ``gs://``, ``az://``) is shared by
whoever may write to it, so a run there without a key must be asked for with
``run_key=None`` and is warned about; a ``file://`` or ``memory://`` run may stay
open by default so the demo and the examples need no set-up.
"""

from __future__ import annotations

import enum
import os
import secrets
from pathlib import Path
from urllib.parse import urlsplit

from gm_core import auth
from gm_core.auth import RunAuth
from gm_shell.stores import SCHEMES, Backend

ENV_KEY = "GM_RUN_KEY"
ENV_KEY_FILE = "GM_RUN_KEY_FILE"
_KEY_FILE_MAX_BYTES = 4096


class FromEnv(enum.Enum):
    """The default of ``run_key=``: take the key from the environment, if any."""

    FROM_ENV = "from the environment"


FROM_ENV = FromEnv.FROM_ENV

RunKey = bytes | str | None | FromEnv
"""What ``run_key=`` accepts: the key's bytes or hex, None (an open run), or FROM_ENV."""


class OpenRunWarning(UserWarning):
    """A run on a shared bucket without a run key: anyone who can write there can forge."""


class RunKeyError(ValueError):
    """No usable run key where one is needed, or one that is malformed."""


def keygen() -> str:
    """A fresh run key as 64 hex characters (from the OS's secure random source)."""
    return secrets.token_bytes(auth.KEY_BYTES).hex()


def remote(url: str) -> bool:
    """Whether ``url`` names a shared bucket (S3, GCS, Azure) rather than a local store."""
    backend = SCHEMES.get(urlsplit(url).scheme.lower())
    return backend not in (None, Backend.FILE, Backend.MEMORY)


def resolve(run_key: RunKey, url: str, *, writes: bool = True) -> RunAuth | None:
    """The subkeys this node uses at ``url`` (None: an open run); raises RunKeyError.

    ``writes=False`` (``gm status``): a reader without a key may look at an open run on a
    shared bucket; a tagged one then tells it which key it needs.
    """
    if isinstance(run_key, FromEnv):
        run_key = _from_env()
        if run_key is None and writes and remote(url):
            raise RunKeyError(
                f"{url} is a shared bucket: set {ENV_KEY} (`gm keygen` prints a key) or "
                f"{ENV_KEY_FILE} on every node, or pass run_key=None to run it open "
                "(anyone who can write to the bucket can then replace the model)"
            )
    if run_key is None:
        return None
    try:
        key = auth.parse_key(run_key) if isinstance(run_key, str) else run_key
        return auth.derive(key)
    except ValueError as error:
        raise RunKeyError(f"run key: {error}") from error


def open_run_warning(url: str, run_auth: RunAuth | None) -> str | None:
    """What to warn about a run at ``url`` that has no key (None: nothing to say)."""
    if run_auth is not None or not remote(url):
        return None
    return (
        f"{url} is an open run: its objects are not authenticated, so anyone who can write "
        f"to the bucket can replace the model; set {ENV_KEY} on every node to prevent it"
    )


def _from_env() -> str | None:
    text = os.environ.get(ENV_KEY)
    if text:
        return text
    path = os.environ.get(ENV_KEY_FILE)
    if not path:
        return None
    return read_key_file(path, f"{ENV_KEY_FILE}={path}", "a run key", RunKeyError)


def read_key_file(
    path: str,
    what: str,
    kind: str,
    error: type[ValueError],
    max_bytes: int = _KEY_FILE_MAX_BYTES,
) -> str:
    """The text of a small key file at ``path`` (a run or node key, a roster); ``error``
    names what is wrong (unreadable, too big to be ``kind``, not ASCII text)."""
    try:
        with Path(path).open("rb") as file:
            data = file.read(max_bytes + 1)
    except OSError as problem:
        raise error(f"{what}: {problem.strerror or problem}") from problem
    if len(data) > max_bytes:
        raise error(f"{what}: not {kind} (over {max_bytes} bytes)")
    try:
        return data.decode("ascii")
    except UnicodeDecodeError:
        raise error(f"{what}: not {kind} (not ASCII text)") from None
