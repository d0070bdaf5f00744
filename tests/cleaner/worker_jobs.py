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


class _Unpicklable(Exception):
    def __init__(self, a, b):  # pickle calls cls(*args) with one argument: it cannot rebuild this
        super().__init__(f"{a}/{b}")


def fail_unpicklably(context):
    raise _Unpicklable("x", "y")


def charge(context, *, sizes):
    for n in sizes:
        context.throttle.acquire(n, check_abort=context.check_abort)
        context.on_bytes(n, "read")
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
