"""Store targets for the mailbox tests: one run prefix on one store, opened by many writers."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import attrs
import pytest

from gm_shell.mailbox import Mailbox
from gm_shell.stores import MailboxOptions

SERVER_MARKS = (pytest.mark.servers, pytest.mark.xdist_group("servers"))
SERVERS = ("seaweedfs", "moto", "azurite")
LOCAL = ("memory", "file")
REMOTE = ("gcs",)

GCS_CREDENTIALS = (
    "GOOGLE_APPLICATION_CREDENTIALS",
    "GOOGLE_SERVICE_ACCOUNT",
    "GOOGLE_SERVICE_ACCOUNT_PATH",
    "GOOGLE_SERVICE_ACCOUNT_KEY",
)
GCS_SKIP = (
    "GCS: no local emulator serves obstore's writes; set GM_TEST_GCS_URL=gs://bucket/prefix "
    "and GOOGLE_APPLICATION_CREDENTIALS to run this suite on real GCS"
)


def store_params(names: tuple[str, ...] = LOCAL + SERVERS + REMOTE) -> list[object]:
    """``pytest.param`` per store, with the server marks where a server is needed."""
    return [pytest.param(n, id=n, marks=SERVER_MARKS if n in SERVERS else ()) for n in names]


@attrs.define
class Target:
    """One run prefix on one store; every :meth:`open` is a separate writer."""

    name: str
    url: str
    options: MailboxOptions
    opened: list[Mailbox] = attrs.field(factory=list)

    def open(self) -> Mailbox:
        mailbox = Mailbox.open(self.url, options=self.options)
        self.opened.append(mailbox)
        return mailbox

    def close(self) -> None:
        for mailbox in self.opened:
            mailbox.close()


FAST = MailboxOptions(backoff_base_s=0.02, backoff_cap_s=0.5, seed=0)


def local_target(name: str, tmp_path: Path) -> Target:
    """A fresh run on memory (a named store, shared like a bucket) or a local folder."""
    run = f"run-{uuid.uuid4().hex[:12]}"
    if name == "memory":
        return Target(name=name, url=f"memory://{run}/run", options=FAST)
    return Target(name=name, url=f"file://{tmp_path / 'bucket' / run}", options=FAST)


def gcs_target() -> Target:
    """A fresh run prefix under ``GM_TEST_GCS_URL`` on real GCS, or a skip saying why not.

    GCS is covered by contract: obstore's GCS client fetches an OAuth token
    before it writes and, lacking credentials, asks the cloud metadata server,
    which no local emulator here stands in for. Without credentials in the
    environment the test is skipped before any request is made.
    """
    url = os.environ.get("GM_TEST_GCS_URL", "")
    if not url.startswith("gs://") or not any(os.environ.get(v) for v in GCS_CREDENTIALS):
        pytest.skip(GCS_SKIP)
    options = MailboxOptions(backoff_base_s=0.05, backoff_cap_s=1.0, seed=0)
    return server_target("gcs", url.rstrip("/"), options)


def server_target(name: str, url: str, options: MailboxOptions) -> Target:
    """A fresh run prefix in a server's test bucket."""
    return Target(name=name, url=f"{url}/run-{uuid.uuid4().hex[:12]}", options=options)
