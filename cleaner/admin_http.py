"""The daemon's HTTP endpoints (loopback by default): metrics, health, status, and partition operations.

| method | path | answer |
|---|---|---|
| GET | /metrics | Prometheus text exposition of the daemon's registry |
| GET | /healthz | 200 when every cleaner thread is alive and the daemon is not stopping, else 503 (JSON body) |
| GET | /status | JSON: the daemon (threads, log dirs, throttle) and every partition's state and last round |
| POST | /partitions/<topic>-<partition>/pause | pause cleaning (aborting a running round); counted |
| POST | /partitions/<topic>-<partition>/resume | undo one pause |
| POST | /partitions/<topic>-<partition>/trigger | clean it next, whatever its dirty ratio |

Owns request parsing and JSON rendering only; every answer comes from the daemon object it is given.
"""

from __future__ import annotations

import json
import logging
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from .manager import StateError

__all__ = ["AdminServer", "parse_listen"]

log = logging.getLogger(__name__)

_BODY_BYTES_MAX = 64 * 1024


def parse_listen(listen: str) -> tuple[str, int]:
    """`host:port` (`[::1]:9464` for IPv6) → (host, port); raises ValueError."""
    host, sep, port = listen.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"listen must be host:port, got {listen!r}")
    return host.strip("[]") or "127.0.0.1", int(port)


class _Handler(BaseHTTPRequestHandler):
    server_version = "logcleaner"
    daemon = None  # set on the subclass made per server

    def log_message(self, fmt: str, *args) -> None:
        log.debug("http %s %s", self.address_string(), fmt % args)

    def _send(self, code: int, body: bytes, content_type: str) -> None:
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _json(self, code: int, obj) -> None:
        self._send(code, (json.dumps(obj, indent=1) + "\n").encode(), "application/json")

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        path = self.path.split("?", 1)[0]
        if path == "/metrics":
            self._send(200, generate_latest(self.daemon.metrics.registry), CONTENT_TYPE_LATEST)
        elif path == "/healthz":
            health = self.daemon.health()
            self._json(200 if health["healthy"] else 503, health)
        elif path == "/status":
            self._json(200, self.daemon.status())
        else:
            self._json(404, {"error": f"no such endpoint {path}"})

    def do_POST(self) -> None:  # noqa: N802
        length = int(self.headers.get("Content-Length") or 0)
        if length > _BODY_BYTES_MAX:
            self._json(413, {"error": "request body too large"})
            return
        self.rfile.read(length)
        parts = self.path.split("?", 1)[0].strip("/").split("/")
        if len(parts) != 3 or parts[0] != "partitions" or parts[2] not in ("pause", "resume", "trigger"):
            self._json(404, {"error": f"no such operation {self.path}"})
            return
        name, operation = parts[1], parts[2]
        try:
            self._json(200, self.daemon.partition_operation(name, operation))
        except StateError as exc:
            self._json(404 if "no such partition" in str(exc) else 409, {"error": str(exc)})


class AdminServer:
    """A threaded HTTP server for one daemon, serving in a background thread."""

    def __init__(self, daemon, listen: str) -> None:
        host, port = parse_listen(listen)
        handler = type("Handler", (_Handler,), {"daemon": daemon})
        self.httpd = ThreadingHTTPServer((host, port), handler)
        self.httpd.daemon_threads = True
        self._thread = threading.Thread(target=self.httpd.serve_forever, name="logcleaner-http", daemon=True)

    @property
    def address(self) -> tuple[str, int]:
        return self.httpd.server_address[:2]

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
