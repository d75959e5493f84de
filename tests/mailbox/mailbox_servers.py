"""Real object-store servers on loopback, for the mailbox tests and benchmark.

Theory of operation
-------------------
Each launcher starts one server process bound to 127.0.0.1 on free ports (the
kernel picks them, so nothing collides with a developer's own servers on the
default ports), with its data, logs and temp files in a directory the caller
owns, waits until the server answers (a real request, not a sleep), creates the
bucket or container the tests use, and returns a :class:`RunningServer` whose
``stop()`` ends that process (by its own pid) and nothing else.

- SeaweedFS: ``weed mini`` (master, volume, filer and S3 gateway in one
  process), telemetry off, WebDAV, Iceberg and Lance endpoints off.
- moto: ``moto_server``, a second S3 dialect written independently.
- Azurite: ``azurite-blob`` in memory, telemetry off.

Azure containers cannot be created through obstore, so :func:`create_azure_container`
signs one request with Azurite's well-known SharedKey (stdlib only).
"""

from __future__ import annotations

import base64
import contextlib
import email.utils
import hashlib
import hmac
import http.client
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import attrs

from gm_shell.stores import AZURITE_ACCOUNT, AZURITE_KEY, MailboxOptions

REPO = Path(__file__).resolve().parents[2]
BUCKET = "gm-test"
READY_TIMEOUT_S = 30.0
STOP_GRACE_S = 3.0
AZURITE_INSTALL = "npm install --no-audit --no-fund --prefix .servers/node azurite@3.37.0"


class ServerMissingError(RuntimeError):
    """A server binary is not installed; the message says how to install it."""


@attrs.define
class RunningServer:
    """A server process we started, and how a mailbox reaches it."""

    name: str
    process: subprocess.Popen[bytes]
    endpoint: str
    url: str
    """Mailbox URL of the test bucket (append a run prefix)."""
    options: MailboxOptions
    log: Path
    leftovers: list[Path] = attrs.field(factory=list)
    """Files the server makes outside its directory, removed after it stops."""

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after a few seconds: the data is scratch, only the port matters."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)
        for path in self.leftovers:
            path.unlink(missing_ok=True)


def free_ports(n: int) -> list[int]:
    """``n`` distinct ports the kernel says are free on loopback right now."""
    with contextlib.ExitStack() as stack:
        socks = [stack.enter_context(socket.socket()) for _ in range(n)]
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]


def _binary(path: Path, hint: str) -> Path:
    if not path.exists():
        raise ServerMissingError(f"{path} is missing; install it with: {hint}")
    return path


def _venv_binary(name: str) -> Path:
    """Beside the running interpreter (the venv), else on PATH."""
    beside = Path(sys.executable).parent / name
    if beside.exists():
        return beside
    found = shutil.which(name)
    if found is None:
        raise ServerMissingError(f"{name} not found beside {sys.executable} or on PATH")
    return Path(found)


def _launch(name: str, argv: list[str], workdir: Path) -> tuple[subprocess.Popen[bytes], Path]:
    workdir.mkdir(parents=True, exist_ok=True)
    log = workdir / f"{name}.log"
    env = {**os.environ, "TMPDIR": str(workdir)}  # weed's unix sockets, node's temp files
    with log.open("wb") as out:
        process = subprocess.Popen(
            argv,
            cwd=workdir,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
    return process, log


def _ready(server: RunningServer, ready: Callable[[], bool]) -> RunningServer:
    """Poll ``ready`` until it holds; on any failure stop the server and say why, with its log."""
    try:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline:
            if server.process.poll() is not None:
                raise RuntimeError(
                    f"{server.name} exited with {server.process.returncode}:\n{_tail(server.log)}"
                )
            with contextlib.suppress(OSError, http.client.HTTPException):
                if ready():
                    return server
            time.sleep(0.1)
        raise RuntimeError(
            f"{server.name} not ready after {READY_TIMEOUT_S} s:\n{_tail(server.log)}"
        )
    except BaseException:
        server.stop()
        raise


def _tail(log: Path) -> str:
    return "\n".join(log.read_text(errors="replace").splitlines()[-30:])


def _request(
    port: int, method: str, path: str, headers: dict[str, str] | None = None, body: bytes = b""
) -> int:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        response = conn.getresponse()
        response.read()
        return response.status
    finally:
        conn.close()


def _s3_options(endpoint: str) -> MailboxOptions:
    # Neither server checks signatures here, but obstore signs, so it needs a key pair.
    return MailboxOptions(
        endpoint=endpoint,
        region="us-east-1",
        access_key_id="gm-test",
        secret_access_key="gm-test-secret",
        max_attempts=4,
        backoff_base_s=0.02,
        backoff_cap_s=0.5,
        seed=0,
    )


def start_seaweedfs(workdir: Path) -> RunningServer:
    weed = _venv_binary("weed")
    roles = ("master", "volume", "filer", "s3", "admin")
    flags = [f"-{role}.port{grpc}" for role in roles for grpc in ("", ".grpc")]
    ports = dict(zip(flags, free_ports(len(flags)), strict=True))
    data = workdir / "data"
    data.mkdir(parents=True, exist_ok=True)
    argv = [
        str(weed),
        f"-logdir={workdir}",
        "mini",
        f"-dir={data}",
        "-ip=127.0.0.1",
        "-ip.bind=127.0.0.1",
        "-master.telemetry=false",
        "-webdav=false",
        "-admin.ui=false",
        "-s3.port.iceberg=0",
        "-s3.port.lance=0",
        # Their defaults are fixed paths in /tmp; keep them in our own directory.
        f"-s3.localSocket={workdir / 's3.sock'}",
        f"-filer.localSocket={workdir / 'filer.sock'}",
        *(f"{flag}={port}" for flag, port in ports.items()),
    ]
    process, log = _launch("seaweedfs", argv, workdir)
    s3 = ports["-s3.port"]

    def ready() -> bool:
        # The gateway answers before the volume server has joined: wait for a real write.
        if _request(s3, "PUT", f"/{BUCKET}") not in (200, 409):
            return False
        if _request(s3, "PUT", f"/{BUCKET}/.ready", body=b"1") != 200:
            return False
        return _request(s3, "DELETE", f"/{BUCKET}/.ready") == 204

    # weed also opens a unix socket per gRPC port at a fixed /tmp path, which no flag moves.
    leftovers = [
        Path(f"/tmp/seaweedfs-{role}-grpc-{ports[f'-{role}.port.grpc']}.sock")
        for role in ("master", "volume", "filer", "s3", "admin")
    ]
    endpoint = f"http://127.0.0.1:{s3}"
    server = RunningServer(
        name="seaweedfs",
        process=process,
        endpoint=endpoint,
        url=f"s3://{BUCKET}",
        options=_s3_options(endpoint),
        log=log,
        leftovers=leftovers,
    )
    return _ready(server, ready)


def start_moto(workdir: Path) -> RunningServer:
    moto = _venv_binary("moto_server")
    (port,) = free_ports(1)
    process, log = _launch("moto", [str(moto), "-H", "127.0.0.1", "-p", str(port)], workdir)
    endpoint = f"http://127.0.0.1:{port}"
    server = RunningServer(
        name="moto",
        process=process,
        endpoint=endpoint,
        url=f"s3://{BUCKET}",
        options=_s3_options(endpoint),
        log=log,
    )
    return _ready(server, lambda: _request(port, "PUT", f"/{BUCKET}") == 200)


def start_azurite(workdir: Path) -> RunningServer:
    azurite = _binary(REPO / ".servers/node/node_modules/.bin/azurite-blob", AZURITE_INSTALL)
    (port,) = free_ports(1)
    argv = [
        str(azurite),
        "--blobHost=127.0.0.1",
        f"--blobPort={port}",
        "--inMemoryPersistence",
        "--disableTelemetry",
        "--skipApiVersionCheck",
        "--silent",
    ]
    process, log = _launch("azurite", argv, workdir)
    endpoint = f"http://127.0.0.1:{port}/{AZURITE_ACCOUNT}"
    options = MailboxOptions(
        endpoint=endpoint,
        azure_emulator=True,
        max_attempts=4,
        backoff_base_s=0.02,
        backoff_cap_s=0.5,
        seed=0,
    )
    server = RunningServer(
        name="azurite",
        process=process,
        endpoint=endpoint,
        url=f"az://{BUCKET}",
        options=options,
        log=log,
    )
    return _ready(server, lambda: create_azure_container(port, BUCKET) in (201, 409))


def create_azure_container(port: int, container: str) -> int:
    """Create ``container`` on Azurite; returns the HTTP status (201 made, 409 existed).

    Blob REST "Create Container", signed with SharedKey as the service defines
    it: a newline-joined string of the verb, eleven standard headers (all empty
    here), the canonical ``x-ms-*`` headers and the canonical resource.
    """
    path = f"/{AZURITE_ACCOUNT}/{container}"
    headers = {
        "x-ms-date": email.utils.formatdate(usegmt=True),
        "x-ms-version": "2021-08-06",
        "Content-Length": "0",
    }
    canonical_headers = "".join(
        f"{k}:{v}\n" for k, v in sorted(headers.items()) if k.startswith("x-ms-")
    )
    to_sign = "PUT\n" + "\n" * 11 + canonical_headers
    to_sign += f"/{AZURITE_ACCOUNT}{path}\nrestype:container"
    digest = hmac.new(base64.b64decode(AZURITE_KEY), to_sign.encode(), hashlib.sha256).digest()
    headers["Authorization"] = f"SharedKey {AZURITE_ACCOUNT}:{base64.b64encode(digest).decode()}"
    return _request(port, "PUT", f"{path}?restype=container", headers)


LAUNCHERS: dict[str, Callable[[Path], RunningServer]] = {
    "seaweedfs": start_seaweedfs,
    "moto": start_moto,
    "azurite": start_azurite,
}


@contextlib.contextmanager
def running(names: list[str], workdir: Path) -> Iterator[dict[str, RunningServer]]:
    """Start the named servers (each in ``workdir/name``) and stop them on exit."""
    servers: dict[str, RunningServer] = {}
    try:
        for name in names:
            servers[name] = LAUNCHERS[name](workdir / name)
        yield servers
    finally:
        for server in servers.values():
            server.stop()
