"""The daemon's HTTP endpoints (loopback by default): metrics, health, status, and partition operations.

| method | path | answer |
|---|---|---|
| GET | /metrics | Prometheus text exposition of the daemon's registry |
| GET | /healthz | 200 when every cleaner thread is alive and the daemon is not stopping, else 503 (JSON body) |
| GET | /status | JSON: the daemon (threads, log dirs, throttle) and every partition's state and last round |
| POST | /partitions/<topic>-<partition>/pause | pause cleaning (aborting a running round); counted |
| POST | /partitions/<topic>-<partition>/resume | undo one pause |
| POST | /partitions/<topic>-<partition>/trigger | clean it next, whatever its dirty ratio |

GET requests only read. Every POST changes state and needs `Authorization: Bearer <token>` with the
daemon's admin token (`cleaner.admin_token`), checked before anything else about the request: a missing
or wrong token gets 401 with `WWW-Authenticate: Bearer`, a daemon without a token refuses every POST
with 403 and says how to configure one. A refused request changes nothing and is logged (client, method,
path, why; never the token). Other methods get http.server's 501.

The listen address defaults to loopback (`127.0.0.1:9464`); an empty host (`:9464`) means loopback too.

Owns request parsing and JSON rendering only; every answer comes from the daemon object it is given.
"""

from __future__ import annotations

import json
import logging
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from .admin_token import ADMIN_TOKEN_ENV, check_authorization
from .listen import client_url, is_loopback, parse_listen  # where they live now; kept here for their users
from .manager import StateError

if TYPE_CHECKING:  # the daemon module imports this one
    from .daemon import Daemon

__all__ = ["AdminServer", "client_url", "is_loopback", "parse_listen"]

log = logging.getLogger(__name__)

_BODY_BYTES_MAX = 64 * 1024


_NO_TOKEN_MESSAGE = (
    "state-changing requests are disabled: this daemon has no admin token. Put a token (16 to 4096 visible ASCII "
    "characters, e.g. from `openssl rand -hex 32`) in a file only the daemon can read, set [server] "
    f"admin_token_file to that file and reload (SIGHUP), or start the daemon with {ADMIN_TOKEN_ENV} set; then "
    "send 'Authorization: Bearer <token>' (logcleaner admin --token-file FILE)"
)


class _Handler(BaseHTTPRequestHandler):
    server_version = "logcleaner"
    daemon: Daemon  # set on the subclass made per server

    def log_message(self, fmt: str, *args) -> None:
        log.debug("http %s %s", self.address_string(), fmt % args)

    def _send(self, code: int, body: bytes, content_type: str, headers: dict[str, str] | None = None) -> None:
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(body)

    def _json(self, code: int, obj, headers: dict[str, str] | None = None) -> None:
        self._send(code, (json.dumps(obj, indent=1) + "\n").encode(), "application/json", headers)

    def _refuse(self, code: int, reason: str, message: str, headers: dict[str, str] | None = None) -> None:
        """Answer `code` without reading the body (so the connection closes) and log why; no state changes."""
        log.warning("admin request refused client=%s method=%s path=%s status=%d reason=%s",
                    self.client_address[0], self.command, ascii(self.path[:256]), code, reason)
        self.close_connection = True
        self._json(code, {"error": message}, {**(headers or {}), "Connection": "close"})

    def _authorized(self) -> bool:
        """Whether the request carries the daemon's admin token; if not, the refusal has been sent."""
        token = self.daemon.admin_token
        if token is None:
            self._refuse(403, "no admin token configured", _NO_TOKEN_MESSAGE)
            return False
        why = check_authorization(self.headers.get("Authorization"), token)
        if why is not None:
            self._refuse(401, why, "missing or wrong admin token: send 'Authorization: Bearer <token>'",
                         {"WWW-Authenticate": 'Bearer realm="logcleaner"'})
            return False
        return True

    def do_GET(self) -> None:  # http.server's naming
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

    def do_POST(self) -> None:
        if not self._authorized():  # before anything else: an unauthorized request learns nothing
            return
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            length = -1
        if length < 0:
            self.close_connection = True
            self._json(400, {"error": "invalid Content-Length"})
            return
        if length > _BODY_BYTES_MAX:
            self.close_connection = True
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

    def __init__(self, daemon: Daemon, listen: str) -> None:
        host, port = parse_listen(listen)
        handler = type("Handler", (_Handler,), {"daemon": daemon})
        self.httpd = ThreadingHTTPServer((host, port), handler)
        self.httpd.daemon_threads = True
        self._thread = threading.Thread(target=self.httpd.serve_forever, name="logcleaner-http", daemon=True)

    @property
    def address(self) -> tuple[str, int]:
        host, port = self.httpd.server_address[:2]
        return str(host), int(port)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
