"""Job functions for tests/cleaner/test_workers.py, imported by the worker process by name (`module:function`)."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from segments.codec.errors import LogStateError


def echo(context, *, value):
    return {"value": value, "pid": os.getpid()}


def fail_with_log_state(context, *, message):
    raise LogStateError(message)


class KeywordOnly(Exception):
    def __init__(self, a, *, b):  # pickle calls cls(*args), without `b`: rebuilt without the constructor
        super().__init__(f"{a}/{b}")
        self.b = b


def fail_keyword_only(context):
    raise KeywordOnly("x", b="y")


def fail_unpicklably(context):
    class Local(Exception):  # a class pickle cannot name: sent as a CleanerError naming it
        pass

    raise Local("made here")


def charge(context, *, sizes, pause_s=0.0):
    for n in sizes:
        context.throttle.acquire(n, check_abort=context.check_abort)
        context.on_bytes(n, "read")
        time.sleep(pause_s)
    return sum(sizes)


def spin_until_aborted(context, *, limit_s):
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        context.check_abort()
        time.sleep(0.01)
    return "not aborted"


def die(context):
    os.kill(os.getpid(), signal.SIGKILL)


def remove_later(context, *, path):
    context.remover.remove([Path(path)])
    return True


def fail_with(context, *, kind):
    """Raise one of the errors the daemon's pool tells apart by type."""
    import errno

    from segments.codec.errors import CorruptRecordError, LockTimeoutError, LogDirOwnedError

    if kind == "corrupt":
        raise CorruptRecordError("CRC mismatch", position=4096, path="/logs/t-0/00000000000000000000.log")
    if kind == "owned":
        raise LogDirOwnedError("/logs", "a Kafka broker", 4242)
    if kind == "lock":
        raise LockTimeoutError("/logs/t-0/.cleaner.lock: held by another process")
    raise OSError(errno.ENOSPC, "No space left on device", "/logs/t-0/00000000000000000000.log.cleaned")


def log_something(context, *, message):
    import logging

    logging.getLogger("cleaner.round").info("round says %s", message)
    logging.getLogger("cleaner.round").debug("not sent below the parent's level")
    try:
        raise ValueError("inner")
    except ValueError:
        logging.getLogger("cleaner.round").exception("with its traceback")
    return True
