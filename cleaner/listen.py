"""The daemon's listen address: `host:port`, its default, and the URL a client on the same host reaches it at.

Owns what the daemon (`cleaner.daemon`, `cleaner.admin_http`) and its clients (`logcleaner status` and
`admin`, in `cleaner.cli`) both need to know about the address. It imports nothing of ours, so a client
finds the daemon without loading the daemon.
"""

from __future__ import annotations

import ipaddress

__all__ = ["DEFAULT_LISTEN", "client_url", "is_loopback", "parse_listen"]

DEFAULT_LISTEN = "127.0.0.1:9464"  # [server] listen: loopback unless the config says otherwise


def parse_listen(listen: str) -> tuple[str, int]:
    """`host:port` (`[::1]:9464` for IPv6) → (host, port); raises ValueError."""
    host, sep, port = listen.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"listen must be host:port, got {listen!r}")
    return host.strip("[]") or "127.0.0.1", int(port)


def is_loopback(host: str) -> bool:
    """Whether `host` (an address or `localhost`) is a loopback address."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a host name: it may resolve to anything


def client_url(listen: str) -> str:
    """The URL a client on the same host uses for a daemon listening on `listen` (a wildcard → loopback)."""
    host, port = parse_listen(listen)
    if host in ("0.0.0.0", ""):
        host = "127.0.0.1"
    elif host == "::":
        host = "::1"
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"
