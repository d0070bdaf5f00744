"""The root of the cleaner's exceptions: `CleanerError`.

Owns one class and imports nothing, so every module of `cleaner/` can build on it. Each module defines its
own errors (`SettingError`, `ConfigFileError`, `PolicyError`, `StateError`, `SafetyCheckError`,
`CleaningAbortedError`, ...) as subclasses of `CleanerError`, keeping the builtin base its callers already
catch (`ValueError`, `RuntimeError`): a caller catches one of them, or every error of the cleaner at once
(`except CleanerError`: the CLI's last line of defence, `cleaner.cli_support.CommandGroup`, and the daemon's
config reload). `tests/cleaner/test_errors.py` walks the modules of `cleaner/` and fails on an exception class
outside this root.
"""

from __future__ import annotations

__all__ = ["CleanerError"]


class CleanerError(Exception):
    """An error of the cleaner, its message naming what was wrong (the CLI shows it as one line)."""
