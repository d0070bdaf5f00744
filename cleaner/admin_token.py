"""The admin endpoint's bearer token: where the daemon and the CLI find it, what a valid one is, the check.

State-changing HTTP requests (`POST /partitions/<name>/pause|resume|trigger`) need
`Authorization: Bearer <token>`; reads (`/metrics`, `/healthz`, `/status`) do not. Where the token comes from:

* the daemon: the file named by `[server] admin_token_file` (a relative path is taken from the config
  file's directory), else the environment variable `LOGCLEANER_ADMIN_TOKEN`; neither means state-changing
  requests are refused (403). SIGHUP reads the file again.
* the CLI (`logcleaner admin`): `--token-file`, else `LOGCLEANER_ADMIN_TOKEN`, else the
  `admin_token_file` of the config given with `-c`.

A token is 16 to 4096 visible ASCII characters (what an HTTP header carries unchanged); whitespace around
it, such as a file's final newline, is dropped. The comparison is constant-time (`hmac.compare_digest`).
Nothing here logs or prints a token, and no error message contains one.
"""

from __future__ import annotations

import hmac
import os
import stat
from collections.abc import Mapping
from pathlib import Path

from .errors import CleanerError

__all__ = [
    "ADMIN_TOKEN_ENV",
    "AdminTokenError",
    "authorization_header",
    "check_authorization",
    "loose_permissions",
    "read_token_file",
    "resolve_token_file",
    "token_from_environment",
]

ADMIN_TOKEN_ENV = "LOGCLEANER_ADMIN_TOKEN"
TOKEN_CHARS_MIN = 16
TOKEN_CHARS_MAX = 4096
_TOKEN_FILE_BYTES_MAX = 64 * 1024


class AdminTokenError(CleanerError, ValueError):
    """A token file that cannot be read, or a token that is not valid (the message never holds the token)."""


def _parse(text: str, source: str) -> bytes:
    token = text.strip()
    if not token:
        raise AdminTokenError(f"{source}: the admin token is empty")
    if not all("\x21" <= ch <= "\x7e" for ch in token):
        raise AdminTokenError(f"{source}: the admin token must be visible ASCII characters without spaces")
    if not TOKEN_CHARS_MIN <= len(token) <= TOKEN_CHARS_MAX:
        raise AdminTokenError(
            f"{source}: the admin token has {len(token)} characters; it needs {TOKEN_CHARS_MIN} to {TOKEN_CHARS_MAX} "
            f"(e.g. `openssl rand -hex 32`)"
        )
    return token.encode("ascii")


def resolve_token_file(value: object, config_path: str | os.PathLike | None) -> Path:
    """The `admin_token_file` setting as a path (relative to the config file's directory); AdminTokenError."""
    if not isinstance(value, str) or not value:
        raise AdminTokenError(f"admin_token_file = {value!r}: must be a non-empty path")
    path = Path(value)
    if not path.is_absolute() and config_path is not None:
        path = Path(config_path).parent / path
    return path


def read_token_file(path: str | os.PathLike) -> bytes:
    """The token held by the file at `path`. Raises `AdminTokenError` naming the file."""
    try:
        with open(path, "rb") as f:
            data = f.read(_TOKEN_FILE_BYTES_MAX + 1)
    except OSError as exc:
        raise AdminTokenError(f"{path}: cannot read the admin token file: {exc.strerror}") from None
    if len(data) > _TOKEN_FILE_BYTES_MAX:
        raise AdminTokenError(f"{path}: more than {_TOKEN_FILE_BYTES_MAX} bytes; not an admin token file")
    try:
        text = data.decode("ascii")
    except UnicodeDecodeError:
        raise AdminTokenError(f"{path}: the admin token must be visible ASCII characters without spaces") from None
    return _parse(text, os.fspath(path))


def token_from_environment(environ: Mapping[str, str] = os.environ) -> bytes | None:
    """The token in `LOGCLEANER_ADMIN_TOKEN`, or None if it is not set. Raises `AdminTokenError`."""
    value = environ.get(ADMIN_TOKEN_ENV)
    if value is None:
        return None
    return _parse(value, ADMIN_TOKEN_ENV)


def loose_permissions(path: str | os.PathLike) -> int | None:
    """The file's mode if group or others may read or write it (worth a warning), else None."""
    try:
        mode = stat.S_IMODE(os.stat(path).st_mode)
    except OSError:
        return None
    return mode if mode & 0o066 else None


def check_authorization(header: str | None, token: bytes) -> str | None:
    """None if `header` (the request's `Authorization`) carries `token`; else why not, for the log.

    The scheme is case-insensitive (RFC 9110); the credential is compared in constant time.
    """
    if header is None:
        return "no Authorization header"
    scheme, _, credential = header.strip().partition(" ")
    if scheme.lower() != "bearer":
        return "not a Bearer credential"
    offered = credential.strip().encode("utf-8", "surrogateescape")
    if not hmac.compare_digest(offered, token):
        return "wrong token"
    return None


def authorization_header(token: bytes) -> dict[str, str]:
    """The request header that carries `token`."""
    return {"Authorization": "Bearer " + token.decode("ascii")}
