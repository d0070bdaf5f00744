"""What every `logcleaner` command shares with the others, beside its own options: how it ends when its reader
goes away, how a usage error is shown, and how the library's notes about indexes rebuilt in memory reach the user.

Owns seven things for `cleaner.cli` and prints nothing of its own but those notes and errors:
* **A closed pipe**: the command stops quietly at its next write, as `cat` does, with exit status 141
  (`CommandGroup` catches `BrokenPipeError` around every command); work already done stays done. Output that
  cannot be written otherwise (`> /dev/full`, a full disk) ends the command with one line on stderr, exit 1
  (`output_failed`), as `ls > /dev/full` does.
* **Usage errors in one line**: `Error: <what>` on stderr, exit 2, without click's usage text
  (`OneLineErrorsCommand.parse_args`, `CommandGroup.invoke`).
* **No traceback for the cleaner's own errors**: a `cleaner.errors.CleanerError` no command turned into its own
  message is `Error: <what>` on one line, exit 1 (`CommandGroup.invoke`).
* **Indexes rebuilt in memory**: `index_notes` turns a reader's in-memory index rebuilds into sentences on
  stderr, said once per command run, at its end; the daemon (`run`) keeps its log lines.
* **Sizes in MB**: every size a command prints is in decimal megabytes, 10^6 bytes (`megabytes`, `MB`), the
  one formatter; `cleaner.audit` and `cleaner.duplication`, which write lines for commands, use it too.
* **Standard descriptors started closed** (`logcleaner ... >&-`, `2>&-`): `occupy_closed_standard_fds` points
  each of 0, 1, 2 that is closed at start at /dev/null, with a Python stream on it, before anything else opens
  a file: the command runs as with `> /dev/null`, and no segment, lock or worker pipe is ever given one of
  those numbers (a write meant for stdout would land in it, and a forked worker's stdin and stdout are set to
  /dev/null, which would cut such a pipe).
* **The end of the process** (`end_process`): once a command has ended and its output is flushed, the process
  runs its exit handlers and ends without the interpreter's teardown (freeing numba's and LLVM's objects one
  by one: ~0.1-0.16 s of every command that cleaned or scanned something, for nothing the OS does not free).
It must not change what a command does otherwise: no other exception is caught, no other log record is
touched. The rules as users see them are in docs/cli.md, "Rules every command follows"; how they are kept:
see docs/design.md, "The command line".
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import logging
import os
import sys
import threading
import traceback
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

import click

from segments.codec.errors import display_path

from .errors import CleanerError

if TYPE_CHECKING:
    from segments.partition.log import IndexRebuild

__all__ = [
    "BROKEN_PIPE_EXIT", "MB", "CommandGroup", "OneLineErrorsCommand", "OneLineUsageError", "end_process", "index_notes",
    "megabytes", "notes_on_rebuilt_indexes", "occupy_closed_standard_fds", "one_line", "output_failed",
]

BROKEN_PIPE_EXIT = 128 + 13  # 128 + SIGPIPE: the status a shell reports for `cat` killed by a closed pipe
_NOTE_FILES_SHOWN_MAX = 3  # untrimmed indexes named in the note; the rest are counted
_INDEX_LOGGER = "segments.partition.log"  # where `IndexRebuild` warnings are logged
_UNTRIMMED = "no trimmed end (as Kafka leaves an active segment's)"


MB = 1_000_000  # the megabyte of every size a command prints (decimal, as `du --si`)


def megabytes(n_bytes: float, digits: int = 2) -> str:
    """`n_bytes` as the commands print a size: decimal megabytes with `digits` decimals, `0.28 MB`."""
    return f"{n_bytes / MB:.{digits}f} MB"


def one_line(text: str) -> str:
    """`text` with its line breaks made spaces: an error message is one line."""
    return " ".join(text.splitlines())


class OneLineUsageError(click.UsageError):
    """A usage error shown as one line (`Error: ...`, exit 2), without the usage text."""

    def show(self, file=None) -> None:
        click.echo(f"Error: {one_line(self.format_message())}", err=True)


class OneLineErrorsCommand(click.Command):
    """A command whose usage errors (a bad, missing or unknown option) are one line, like its other errors."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        try:
            return super().parse_args(ctx, args)
        except OneLineUsageError:
            raise
        except click.UsageError as exc:
            raise OneLineUsageError(exc.format_message(), ctx) from None


class CommandGroup(click.Group):
    """The `logcleaner` group: every command's usage errors are one line, a `CleanerError` no command caught is
    one line too (exit 1), and every command ends quietly with `BROKEN_PIPE_EXIT` when its output pipe closes."""

    command_class = OneLineErrorsCommand

    def invoke(self, ctx: click.Context):
        try:
            try:
                return super().invoke(ctx)
            except (OneLineUsageError, click.exceptions.NoArgsIsHelpError):
                raise
            except click.UsageError as exc:  # an unknown command, or one a command raised itself
                raise OneLineUsageError(exc.format_message(), exc.ctx) from None
            except CleanerError as exc:  # one no command turned into its own message: one line, no traceback
                raise click.ClickException(one_line(str(exc))) from None
            finally:
                # Output still in Python's buffer meets a closed pipe here, where it can be handled, rather
                # than in the interpreter's final flush ("Exception ignored ... BrokenPipeError", status 120).
                flush_output()
        except BrokenPipeError:
            _silence_broken_streams()
            ctx.exit(BROKEN_PIPE_EXIT)


def end_process(code: object) -> None:
    """End the process with `code` (a `SystemExit` code) now, without the interpreter's teardown, when nothing
    needs it: no other thread that is not a daemon's is running (Python would wait for it) and no Spark
    gateway was started (its JVM is stopped by pyspark's own teardown). Exit handlers run first (logging's
    flush among them; `atexit._run_exitfuncs` is what the interpreter's own exit calls), then stdout and stderr
    are flushed; a stream that cannot be flushed any more (a closed pipe) is given up, and a status that was 0
    becomes 141 for stdout (as `CommandGroup` ends a closed pipe) or 120 for stderr (as Python does). Returns,
    doing nothing, when the interpreter must end the process.
    """
    if "pyspark" in sys.modules or any(
        t is not threading.main_thread() and t.is_alive() and not t.daemon for t in threading.enumerate()
    ):
        return
    if code is None:
        status = 0
    elif isinstance(code, int):
        status = code
    else:  # sys.exit("message"): the message on stderr, status 1, as the interpreter does
        print(code, file=sys.stderr)
        status = 1
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            if stream is not None:
                stream.flush()
        except (OSError, ValueError):
            if status == 0:
                status = BROKEN_PIPE_EXIT if stream is sys.stdout else 120
    os._exit(status & 0xFF)


def output_failed(exc: OSError) -> bool:
    """When `exc` was raised writing the command's output to stdout (click's `echo`, or the flush of the output
    at a command's end; not a closed pipe, which ends quietly): say so in one line on stderr, stop writing to
    stdout, and return True; else False (another file's error, for the caller to raise)."""
    if isinstance(exc, BrokenPipeError) or exc.__traceback__ is None:
        return False
    frames = traceback.extract_tb(exc.__traceback__)
    last = frames[-1]
    if not (last.name == "echo" and last.filename.endswith(os.path.join("click", "utils.py"))
            or last.name == "flush_output" and last.filename == __file__):
        return False
    _silence_broken_streams()
    print(f"Error: cannot write the output to standard output: {exc.strerror or exc}", file=sys.stderr)
    return True


def flush_output() -> None:
    """Flush what Python still buffers for stdout (its errors are the output's: `output_failed`)."""
    if sys.stdout is not None:
        sys.stdout.flush()


def occupy_closed_standard_fds() -> None:
    """Open /dev/null on each of descriptors 0, 1 and 2 that is closed, and give Python, which has left
    `sys.stdin`, `stdout` or `stderr` None for it, a stream on it: the command reads nothing there and writes
    into /dev/null, as with `> /dev/null`, and no file this process opens later takes the number."""
    for fd, name in ((0, "stdin"), (1, "stdout"), (2, "stderr")):
        try:
            os.fstat(fd)
            continue
        except OSError:
            null = os.open(os.devnull, os.O_RDWR)
        if null != fd:
            os.dup2(null, fd)
            os.close(null)
        if getattr(sys, name) is None:
            setattr(sys, name, open(fd, "r" if fd == 0 else "w", encoding="utf-8", closefd=False))


def _silence_broken_streams() -> None:
    """Point stdout and stderr at /dev/null where they cannot be written, so nothing more goes to a closed pipe."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        for stream in (sys.stdout, sys.stderr):
            if stream is None or _flushes(stream):
                continue  # this one still works (the closed pipe was the other one)
            try:
                fd = stream.fileno()
            except (OSError, ValueError):
                continue  # no file descriptor (click's CliRunner): nothing outlives the command to write to it
            os.dup2(devnull, fd)
    finally:
        os.close(devnull)


def _flushes(stream) -> bool:
    """Whether `stream` can still be flushed (False: its pipe is closed)."""
    try:
        stream.flush()
    except (OSError, ValueError):
        return False
    return True


class _IndexNotes(logging.Filter):
    """Takes the in-memory `IndexRebuild` warnings off the `segments.partition.log` logger and keeps them, once each."""

    def __init__(self) -> None:
        super().__init__()
        self.untrimmed: list[IndexRebuild] = []
        self.other: list[IndexRebuild] = []
        self._seen: set[tuple[str, str]] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        # numpy (segments.partition.log, loaded by whoever logged this): not imported with the CLI, for its start-up
        from segments.partition.log import IndexRebuild

        event = getattr(record, "index_rebuild", None)
        if not isinstance(event, IndexRebuild) or not event.in_memory:
            return True  # any other record goes on as it would have
        key = (str(event.directory), event.file)
        if key not in self._seen:
            self._seen.add(key)
            (self.untrimmed if event.untrimmed else self.other).append(event)
        return False

    def sentences(self) -> list[str]:
        """The notes to print: one for every untrimmed index together, one per other rebuilt index."""
        out = []
        if len(self.untrimmed) == 1:
            out.append(f"note: {_where(self.untrimmed[0])} has {_UNTRIMMED}; it was rebuilt in memory, "
                       "the file was not changed")
        elif self.untrimmed:
            named = ", ".join(_where(e) for e in self.untrimmed[:_NOTE_FILES_SHOWN_MAX])
            rest = len(self.untrimmed) - _NOTE_FILES_SHOWN_MAX
            named += f" and {rest} more" if rest > 0 else ""
            out.append(f"note: {len(self.untrimmed)} index files have {_UNTRIMMED}: {named}; they were rebuilt "
                       "in memory, the files were not changed")
        for e in self.other:
            out.append(f"note: {_where(e)} does not match its log (byte {e.position}: {e.reason}); it was rebuilt "
                       "in memory, the file was not changed")
        return out


def _where(event: IndexRebuild) -> str:
    return f"{display_path(event.file)} in {display_path(event.directory.name)}"


@contextlib.contextmanager
def index_notes() -> Iterator[None]:
    """While it is open, in-memory index rebuilds are not logged but noted; on leaving, the notes go to stderr."""
    notes = _IndexNotes()
    logger = logging.getLogger(_INDEX_LOGGER)
    logger.addFilter(notes)
    try:
        yield
    finally:
        logger.removeFilter(notes)
        for sentence in notes.sentences():
            click.echo(sentence, err=True)


def notes_on_rebuilt_indexes(command: Callable) -> Callable:
    """Decorator for a read-only command: its in-memory index rebuilds are said in words, once, at its end."""

    @functools.wraps(command)
    def wrapper(*args, **kwargs):
        with index_notes():
            return command(*args, **kwargs)

    return wrapper
