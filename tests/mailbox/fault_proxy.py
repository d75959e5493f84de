"""A real HTTP proxy on loopback that injects store failures on request.

Theory of operation
-------------------
Retries and error typing must be shown against real sockets, not mocks, so
this proxy sits between a mailbox and a real server (moto) and forwards every
request verbatim, except the next ``n`` it was told to spoil: those get a
scripted status with an S3-style error body (503 SlowDown, 429, 403, 400…) or
have their connection dropped without a reply (a reset, as a crashed load
balancer would). It counts what it saw, so a test can check that the mailbox
sent exactly the attempts it reported. Threads serve it; a lock guards the script.
"""

from __future__ import annotations

import collections
import http.client
import http.server
import threading
from collections.abc import Iterator
from contextlib import contextmanager

RESET = 0
"""A scripted "status" that closes the connection without replying."""
CUT = 1
"""A scripted "status" that relays the reply's headers and half its body, then closes the
connection: a body that fails midway."""

_HOP_BY_HOP = frozenset({"connection", "keep-alive", "transfer-encoding", "content-length"})


class FaultProxy:
    """Forward to ``upstream_port`` on loopback, spoiling the requests it is told to."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self._lock = threading.Lock()
        self._script: collections.deque[int] = collections.deque()
        self.seen: list[tuple[str, str, int]] = []
        """(method, path, status answered) per request, RESET included."""
        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        )

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def spoil(self, *statuses: int) -> None:
        """Answer the next requests with these statuses, in order (RESET: drop)."""
        with self._lock:
            self._script.extend(statuses)

    def _next_fault(self) -> int | None:
        with self._lock:
            return self._script.popleft() if self._script else None

    def _record(self, method: str, path: str, status: int) -> None:
        with self._lock:
            self.seen.append((method, path, status))

    def _handler(self) -> type[http.server.BaseHTTPRequestHandler]:
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: object) -> None:
                pass  # the test reads proxy.seen instead

            def _relay(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                fault = proxy._next_fault()
                if fault == RESET:
                    proxy._record(self.command, self.path, RESET)
                    self.close_connection = True
                    self.connection.shutdown(2)
                    return
                if fault is not None and fault != CUT:
                    proxy._record(self.command, self.path, fault)
                    self._answer(fault, {"Content-Type": "application/xml"}, _error_xml(fault))
                    return
                upstream = http.client.HTTPConnection("127.0.0.1", proxy.upstream_port, timeout=30)
                try:
                    headers = {k: v for k, v in self.headers.items() if k.lower() != "host"}
                    upstream.request(self.command, self.path, body=body, headers=headers)
                    reply = upstream.getresponse()
                    data = reply.read()
                    kept = {k: v for k, v in reply.getheaders() if k.lower() not in _HOP_BY_HOP}
                    if fault == CUT:
                        proxy._record(self.command, self.path, CUT)
                        self._answer(reply.status, kept, data, cut=len(data) // 2)
                        self.close_connection = True
                        self.connection.shutdown(2)
                        return
                    proxy._record(self.command, self.path, reply.status)
                    self._answer(reply.status, kept, data)
                finally:
                    upstream.close()

            def _answer(
                self, status: int, headers: dict[str, str], data: bytes, cut: int | None = None
            ) -> None:
                self.send_response(status)
                for key, value in headers.items():
                    self.send_header(key, value)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data[:cut])
                    self.wfile.flush()

        for verb in ("GET", "PUT", "POST", "DELETE", "HEAD"):
            setattr(Handler, f"do_{verb}", Handler._relay)  # http.server dispatches by name
        return Handler

    @contextmanager
    def running(self) -> Iterator[FaultProxy]:
        self._thread.start()
        try:
            yield self
        finally:
            self._server.shutdown()
            self._server.server_close()


def _error_xml(status: int) -> bytes:
    code = {
        400: "InvalidArgument",
        403: "AccessDenied",
        429: "SlowDown",
        500: "InternalError",
        503: "SlowDown",
    }.get(status, "Error")
    return f"<Error><Code>{code}</Code><Message>injected by FaultProxy</Message></Error>".encode()
