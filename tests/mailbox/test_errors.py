"""Errors that say what to do: failures a new user meets, on real sockets and real folders.

A silent endpoint is a real loopback socket that accepts connections and never
answers (or answers the first request and then falls silent); a read-only folder
is a real folder this process cannot write (mode 555, and immutable when the
tests run as root, whom modes do not stop); missing credentials are obstore's
real credential chain ending at a metadata endpoint that refuses, as the cloud's
does off the cloud.
"""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import threading
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from gm_shell.mailbox import (
    AccessDeniedError,
    ConfigError,
    Mailbox,
    PutOutcome,
    UnavailableError,
)
from gm_shell.stores import MailboxOptions, local_path

RECORD = "rounds/000000000001.json"


class SilentServer:
    """Accepts every connection; answers the first ``answered`` requests (404), then nothing."""

    def __init__(self, answered: int = 0) -> None:
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.endpoint = f"http://127.0.0.1:{self._listener.getsockname()[1]}"
        self._left = answered
        self._lock = threading.Lock()
        self.requests = 0
        self._open: list[socket.socket] = []

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            while chunk := conn.recv(65536):
                if not chunk[:1].isalpha():
                    continue  # a request body, not a request line
                with self._lock:
                    self.requests += 1
                    reply, self._left = self._left > 0, self._left - 1
                if reply:
                    conn.sendall(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n")

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return
            self._open.append(conn)
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    @contextmanager
    def running(self) -> Iterator[SilentServer]:
        threading.Thread(target=self._accept, daemon=True).start()
        try:
            yield self
        finally:
            self._listener.close()
            for conn in self._open:
                conn.close()


def s3_options(endpoint: str, **changes: object) -> MailboxOptions:
    values: dict[str, object] = {
        "endpoint": endpoint,
        "region": "us-east-1",
        "access_key_id": "k",
        "secret_access_key": "s",
        "read_timeout_s": 0.5,
        "max_attempts": 3,
        "backoff_base_s": 0.01,
        "backoff_cap_s": 0.02,
        "seed": 0,
        **changes,
    }
    return MailboxOptions(**values)  # type: ignore[arg-type]


def test_a_silent_endpoint_fails_after_one_read_timeout_naming_the_endpoint() -> None:
    with SilentServer().running() as server:
        box = Mailbox.open("s3://bucket/run", options=s3_options(server.endpoint))
        with box, pytest.raises(UnavailableError) as raised:
            asyncio.run(box.probe(RECORD))
    message = str(raised.value)
    assert message == (
        f"probe {RECORD!r}: no answer from {server.endpoint} within the timeout (connect 5 s,"
        " first byte 0.5 s, transfer 60 s). Check the endpoint URL and that the store is"
        " reachable from here; a slow link may need longer MailboxOptions timeouts"
    )
    # Never answered: one attempt, not max_attempts read timeouts in a row.
    assert (box.stats.get_requests, box.stats.retries, box.stats.failures) == (1, 0, 1)
    assert server.requests == 1


def test_a_store_that_answered_once_is_retried_when_it_falls_silent() -> None:
    with SilentServer(answered=1).running() as server:
        box = Mailbox.open("s3://bucket/run", options=s3_options(server.endpoint))
        # The HEAD's 404 is an answer; the GET that confirms the bucket then times out.
        with box, pytest.raises(UnavailableError) as raised:
            asyncio.run(box.probe(RECORD))
    assert "gave up after 3 attempts: no answer from" in str(raised.value)
    assert (box.stats.get_requests, box.stats.retries) == (4, 2)
    assert server.requests == 4


@contextmanager
def read_only(folder: Path) -> Iterator[Path]:
    """``folder`` made unwritable for this process: mode 555, and immutable for root."""
    folder.mkdir(parents=True, exist_ok=True)
    folder.chmod(0o555)
    root = os.geteuid() == 0
    if root:
        subprocess.run(["chattr", "+i", str(folder)], check=True)
    try:
        yield folder
    finally:
        if root:
            subprocess.run(["chattr", "-i", str(folder)], check=True)
        folder.chmod(0o755)


def test_a_read_only_folder_fails_at_once_naming_the_path_and_the_fix(tmp_path: Path) -> None:
    with read_only(tmp_path / "run") as folder:
        box = Mailbox.open(f"file://{folder}")
        with box, pytest.raises(AccessDeniedError) as raised:
            asyncio.run(box.put_once(RECORD, b"r"))
    message = str(raised.value)
    assert str(folder / "rounds") in message
    assert message.endswith(f"Make {folder} writable by this user, or choose another folder")
    assert (box.stats.put_requests, box.stats.retries) == (1, 0)


def test_a_folder_that_cannot_be_made_is_named(tmp_path: Path) -> None:
    (tmp_path / "plain-file").write_text("not a folder")
    target = tmp_path / "plain-file" / "run"
    with pytest.raises(ConfigError) as raised:
        Mailbox.open(f"file://{target}")
    assert str(raised.value) == (
        f"open: cannot make the mailbox folder {target}: Not a directory;"
        " choose a folder you can write"
    )


def test_missing_credentials_say_which_variables_to_set(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("AWS_"):
            monkeypatch.delenv(name)
    with SilentServer().running() as store, _refusing_metadata() as metadata:
        options = s3_options(
            store.endpoint,
            access_key_id=None,
            secret_access_key=None,
            extra_config={"metadata_endpoint": metadata},
        )
        box = Mailbox.open("s3://bucket/run", options=options)
        with box, pytest.raises(AccessDeniedError) as raised:
            asyncio.run(box.get(RECORD))
    assert str(raised.value) == (
        f"get {RECORD!r}: no credentials for s3://bucket/run (none in options or the"
        " environment). Set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or AWS_PROFILE), or"
        " pass MailboxOptions(access_key_id=..., secret_access_key=...)"
    )
    assert box.stats.retries == 0
    assert store.requests == 0  # nothing reached the store without credentials


@contextmanager
def _refusing_metadata() -> Iterator[str]:
    """An instance-metadata endpoint that refuses every request, as the cloud's does off it."""
    import http.server

    class Refuse(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(403)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def do_PUT(self) -> None:
            self.do_GET()

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Refuse)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_an_unknown_scheme_lists_the_supported_ones() -> None:
    with pytest.raises(ConfigError) as raised:
        Mailbox.open("foo://x/run")
    assert str(raised.value) == (
        "open: unsupported mailbox URL scheme 'foo' in 'foo://x/run': use memory://, file://,"
        " s3:// (AWS, R2, MinIO, any S3-compatible endpoint), gs://, az://"
    )


@pytest.mark.parametrize("url", ["file://runs/demo/mailbox", "file:runs/demo/mailbox"])
def test_a_relative_file_url_is_a_folder_under_the_working_directory(
    url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    assert local_path(url) == tmp_path / "runs" / "demo" / "mailbox"
    assert local_path(f"file://{tmp_path}/x") == tmp_path / "x"
    assert local_path(f"file://localhost{tmp_path}/x") == tmp_path / "x"
    with Mailbox.open(url) as box:
        assert asyncio.run(box.put_once(RECORD, b"r")) is PutOutcome.CREATED
    assert (tmp_path / "runs" / "demo" / "mailbox" / RECORD).read_bytes() == b"r"
    assert not (tmp_path / "demo").exists()


def test_a_named_memory_url_open_in_another_process_is_a_warning() -> None:
    url = f"memory://two-processes-{os.getpid()}/run"
    other = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys; from gm_shell.mailbox import Mailbox; box = Mailbox.open(sys.argv[1]);"
            " print('open', flush=True); sys.stdin.read()",
            url,
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert other.stdout is not None
        assert other.stdout.readline() == "open\n"
        with pytest.warns(RuntimeWarning) as caught, Mailbox.open(url):
            pass
        assert str(caught[0].message) == (
            f"{url} is also open in process {other.pid}: a memory:// mailbox lives inside one"
            " process, so these processes make separate runs that never meet; give every"
            " process the same file:// folder or bucket URL instead"
        )
    finally:
        other.communicate("", timeout=60)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the other process has exited: nothing to warn of
        Mailbox.open(url).close()
        Mailbox.open("memory://").close()  # unnamed: private to its mailbox, never shared
