"""A fault-injecting HTTP proxy on 127.0.0.1 in front of an S3 server (moto).

Each request is, with probability ``rate`` (seeded RNG), hit by one fault drawn uniformly
from ``kinds`` (default ``KINDS``); otherwise it is forwarded unchanged. Faults are counted
by kind. ``fail_after(method, suffix)`` sets the rate to 1 once a request whose path (query
included) ends with ``suffix`` has been forwarded, to fail a save at a chosen point.

- ``internal_error``: 500 InternalError, nothing forwarded;
- ``service_unavailable``: 503 ServiceUnavailable, nothing forwarded;
- ``slow_down``: 503 SlowDown (S3 throttling), nothing forwarded;
- ``reset``: the connection is reset (TCP RST) before the request is forwarded;
- ``lost_response``: the request is forwarded (and applied), then the connection is reset;
- ``latency``: the request is forwarded after a delay (it succeeds).
"""

from __future__ import annotations

import http.client
import random
import socket
import struct
import threading
import time
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

KINDS = ("internal_error", "service_unavailable", "slow_down", "reset", "lost_response", "latency")
FAILING_KINDS = KINDS[:-1]  # every kind but latency makes the request fail
_ERRORS = {
    "internal_error": (500, "InternalError", "We encountered an internal error. Please try again."),
    "service_unavailable": (503, "ServiceUnavailable", "Service is unable to handle request."),
    "slow_down": (503, "SlowDown", "Please reduce your request rate."),
}
_HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "content-length"}
UPSTREAM_TIMEOUT = 30.0  # seconds; a request to moto never waits longer
LATENCY = (0.01, 0.1)  # seconds added by a latency fault


class FaultProxy:
    """The proxy server, started on a free loopback port; use as a context manager."""

    def __init__(self, upstream: str, rate: float = 0.0, seed: int = 0,
                 kinds: tuple[str, ...] = KINDS) -> None:
        parts = urlsplit(upstream)
        if parts.hostname != "127.0.0.1":
            raise ValueError(f"the proxy forwards to loopback only, got {upstream}")
        self.upstream = (parts.hostname, parts.port)
        self.rate = rate
        self.kinds = kinds
        self.faults: Counter[str] = Counter()
        self.requests = 0
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self._trip: tuple[str, str] | None = None
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="fault-proxy", daemon=True)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self) -> FaultProxy:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=UPSTREAM_TIMEOUT)

    def fail_after(self, method: str, suffix: str) -> None:
        """Set the rate to 1 once a ``method`` request whose path ends with ``suffix`` is forwarded."""
        with self._lock:
            self._trip = (method, suffix)

    def draw(self) -> tuple[str | None, float]:
        """The fault for the next request (None: forward it) and a latency to add."""
        with self._lock:
            self.requests += 1
            if self._rng.random() >= self.rate:
                return None, 0.0
            kind = self._rng.choice(self.kinds)
            self.faults[kind] += 1
            return kind, self._rng.uniform(*LATENCY)

    def forwarded(self, method: str, path: str) -> None:
        with self._lock:
            if self._trip is not None and method == self._trip[0] and path.endswith(self._trip[1]):
                self.rate, self._trip = 1.0, None


def _handler(proxy: FaultProxy) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, as s3fs's client expects
        disable_nagle_algorithm = True  # headers and body go out in two writes
        timeout = UPSTREAM_TIMEOUT

        def log_message(self, format: str, *args: object) -> None:
            pass

        def _relay(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            kind, delay = proxy.draw()
            if kind in _ERRORS:
                self._error(*_ERRORS[kind])
                return
            if kind == "reset":
                self._reset()
                return
            if kind == "latency":
                time.sleep(delay)
            status, reason, headers, payload = self._forward(body)
            proxy.forwarded(self.command, self.path)
            if kind == "lost_response":
                self._reset()
                return
            self.send_response(status, reason)
            for name, value in headers:
                if name.lower() not in _HOP_BY_HOP:
                    self.send_header(name, value)
            if self.command == "HEAD":  # no body; the length is the object's
                length = next((v for k, v in headers if k.lower() == "content-length"), "0")
            else:
                length = str(len(payload))
            self.send_header("Content-Length", length)
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(payload)

        def _forward(self, body: bytes) -> tuple[int, str, list[tuple[str, str]], bytes]:
            connection = http.client.HTTPConnection(*proxy.upstream, timeout=UPSTREAM_TIMEOUT)
            try:
                headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP_BY_HOP}
                connection.request(self.command, self.path, body=body, headers=headers)
                response = connection.getresponse()
                return response.status, response.reason, response.getheaders(), response.read()
            finally:
                connection.close()

        def _error(self, status: int, code: str, message: str) -> None:
            payload = (f'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>{code}</Code>'
                       f"<Message>{message}</Message></Error>").encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/xml")
            self.send_header("Content-Length", "0" if self.command == "HEAD" else str(len(payload)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(payload)

        def _reset(self) -> None:
            """Abort the connection with a TCP RST (SO_LINGER 0), as a dropped peer does."""
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            self.close_connection = True
            self.connection.close()

        do_GET = do_PUT = do_POST = do_HEAD = do_DELETE = _relay

    return Handler
