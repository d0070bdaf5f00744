"""A fork server that runs `logcleaner clean` in child processes armed to SIGKILL themselves at a fault point.

Usage: `python crash_harness.py WARMUP_LOG_DIR CLEAN_ARG...` then one JSON request per stdin line,
`{"log_dir": ..., "fault": "<point>@<n>" | null, "trace": <file> | null}`; one JSON answer per line,
`{"exit_code": int | null, "signal": int | null}`.

The harness imports the CLI and cleans WARMUP_LOG_DIR once itself, so the compiled kernels are loaded
before any fork; each child then sets `LOGCLEANER_FAULT` (and `LOGCLEANER_FAULT_TRACE`) in its environment,
re-reads it exactly as a freshly started process does at import, and runs the real command-line entry
point. A crash case therefore costs a fork, not an interpreter start, and the kill is a real `SIGKILL` of
a real process.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from cleaner.cli import main as cli_main
from segments.files import faults


def _run_cli(argv: list[str]) -> int:
    try:
        cli_main(argv, standalone_mode=True)
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else 1
    return 0


def _child(request: dict, clean_args: list[str]) -> None:
    for name, key in ((faults.ENV_FAULT, "fault"), (faults.ENV_TRACE, "trace")):
        if request.get(key):
            os.environ[name] = request[key]
        else:
            os.environ.pop(name, None)
    faults.reload()
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.dup2(devnull, 2)
    os._exit(_run_cli(["clean", request["log_dir"], *clean_args]))


def main() -> None:
    warmup, clean_args = sys.argv[1], sys.argv[2:]
    with contextlib.redirect_stdout(sys.stderr):
        warmed = _run_cli(["clean", warmup, *clean_args])
    if warmed != 0:
        raise SystemExit("warm-up clean failed")
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        request = json.loads(line)
        pid = os.fork()
        if pid == 0:
            _child(request, clean_args)
        _, status = os.waitpid(pid, 0)
        answer = {
            "exit_code": os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else None,
            "signal": os.WTERMSIG(status) if os.WIFSIGNALED(status) else None,
        }
        print(json.dumps(answer), flush=True)


if __name__ == "__main__":
    main()
