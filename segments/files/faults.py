"""Named fault points: the places where a test can make the process die, or an operation fail, on purpose.

Owns the catalogue of fault points (`POINTS`), their arming and their hit counters. Production code calls
`hit(name)` at each point; unarmed, that is one global read. A point is armed by the environment, read at
import (so a test arms a child process it starts: `logcleaner clean`, `logcleaner run`), or in-process
with `arm()`:

    LOGCLEANER_FAULT="<point>[@<n>][:<action>]"    e.g. "swap.renamed_to_swap@2", "fileops.pwrite@3:enospc"

fires at the `n`-th hit (1-based, default 1) of `<point>` in this process. Actions:

| action | effect |
|---|---|
| `kill` (default) | `SIGKILL` to this process: no cleanup, no flush, no `finally` (a crash) |
| `enospc` | the operation raises `OSError(ENOSPC)` (a full disk) |
| `eio` | the operation raises `OSError(EIO)` (a failing disk) |

With `LOGCLEANER_FAULT_TRACE=<file>` every hit is appended to `<file>` as `<point> <n>` before it acts, so
a test can first run a scenario unarmed to list every step, then crash it at each one.
In-process tests (the power-loss model) arm a callable instead of an action.
"""

from __future__ import annotations

import errno
import os
import signal
from collections.abc import Callable
from dataclasses import dataclass, field

__all__ = ["ENV_FAULT", "ENV_TRACE", "POINTS", "FaultSpec", "arm", "disarm", "hit", "parse_spec", "reload", "trace_to"]

ENV_FAULT = "LOGCLEANER_FAULT"
ENV_TRACE = "LOGCLEANER_FAULT_TRACE"

POINTS: dict[str, str] = {
    "round.after_survey": "the survey read the whole log; nothing written yet",
    "round.after_index": "the offset map is built over the dirty section; nothing written yet",
    "recopy.mid_group": "a window of a group was appended to its `.cleaned` segment (unsynced)",
    "recopy.group_written": "a group's `.cleaned` segment is complete and fsynced, not yet swapped",
    "swap.renamed_to_swap": "one new segment's files renamed `.cleaned` → `.swap`",
    "swap.renamed_to_deleted": "one old segment's files renamed → `.deleted`",
    "swap.renamed_live": "one new segment's files renamed `.swap` → live",
    "swap.old_deleted": "one old segment's `.deleted` files removed",
    "checkpoint.before_write": "every group swapped; the cleaner checkpoint not yet written",
    "checkpoint.after_write": "the cleaner checkpoint written and its directory fsynced",
    "retention.renamed_to_deleted": "retention renamed one expired segment's files → `.deleted`",
    "retention.checkpoint_written": "retention recorded the new log start offset; `.deleted` files not yet removed",
    "fileops.pwrite": "before a data or index write (the point for `enospc` / `eio`)",
    "fileops.fsync": "a file was fsynced",
    "fileops.fsync_dir": "a directory was fsynced",
    "fileops.rename": "a file was renamed",
    "fileops.remove": "a file was removed",
}

_ACTIONS = ("kill", "enospc", "eio")


@dataclass
class FaultSpec:
    point: str
    nth: int = 1
    action: str | Callable[[str, int], None] = "kill"


@dataclass
class _State:
    spec: FaultSpec | None
    trace_path: str | None
    counts: dict[str, int] = field(default_factory=dict)


def parse_spec(text: str) -> FaultSpec:
    """`point[@n][:action]` → FaultSpec; raises ValueError naming what is wrong."""
    rest, _, action = text.strip().partition(":")
    point, _, nth = rest.partition("@")
    if point not in POINTS:
        raise ValueError(f"{ENV_FAULT}: unknown fault point {point!r}; known: {', '.join(sorted(POINTS))}")
    action = action or "kill"
    if action not in _ACTIONS:
        raise ValueError(f"{ENV_FAULT}: unknown action {action!r}; known: {', '.join(_ACTIONS)}")
    if nth and not (nth.isdigit() and int(nth) >= 1):
        raise ValueError(f"{ENV_FAULT}: hit number must be a positive integer, got {nth!r}")
    return FaultSpec(point, int(nth) if nth else 1, action)


def _from_environment() -> _State | None:
    text = os.environ.get(ENV_FAULT)
    trace = os.environ.get(ENV_TRACE)
    if not text and not trace:
        return None
    return _State(parse_spec(text) if text else None, trace or None)


_state: _State | None = _from_environment()


def reload() -> None:
    """Re-read the environment, as at import (a forked child that changed its environment calls this)."""
    global _state
    _state = _from_environment()


def arm(point: str, nth: int = 1, action: str | Callable[[str, int], None] = "kill") -> None:
    """Arm `point` in this process (counters restart); `action` may be a callable(point, n)."""
    global _state
    if point not in POINTS:
        raise ValueError(f"unknown fault point {point!r}")
    _state = _State(FaultSpec(point, nth, action), None)


def trace_to(path: str | os.PathLike) -> None:
    """Record every hit in this process to `path` (as `LOGCLEANER_FAULT_TRACE` does), nothing armed."""
    global _state
    _state = _State(None, os.fspath(path))


def disarm() -> None:
    global _state
    _state = None


def hit(point: str) -> None:
    """Mark that execution reached `point`; act if it is the armed one at the armed count."""
    state = _state
    if state is None:
        return
    n = state.counts.get(point, 0) + 1
    state.counts[point] = n
    if state.trace_path is not None:
        with open(state.trace_path, "a", encoding="utf-8") as trace:
            trace.write(f"{point} {n}\n")
    spec = state.spec
    if spec is None or spec.point != point or spec.nth != n:
        return
    if callable(spec.action):
        spec.action(point, n)
    elif spec.action == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    else:
        code = errno.ENOSPC if spec.action == "enospc" else errno.EIO
        raise OSError(code, f"{os.strerror(code)} (injected at fault point {point}@{n})")
