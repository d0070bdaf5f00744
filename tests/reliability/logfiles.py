"""What a log dir holds, for before/after comparisons: file digests, and temporary files left behind.

Shared by the corrupt-input tests and the atheris harness (which runs as a script with the repository root
on `sys.path`, so it imports this as `tests.reliability.logfiles`).
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from segments.files.names import parse_segment_file_name

__all__ = ["leftovers", "snapshot"]


def snapshot(log_dir: Path) -> dict[str, str]:
    """Digest of every file under the log dir but lock files (opening a log creates them; they hold nothing)."""
    out = {}
    for dirpath, _, names in os.walk(log_dir):
        for name in names:
            if not name.endswith(".lock"):
                path = Path(dirpath) / name
                out[str(path.relative_to(log_dir))] = hashlib.blake2b(path.read_bytes(), digest_size=16).hexdigest()
    return out


def leftovers(log_dir: Path) -> list[str]:
    """Temporary files of an interrupted clean, swap or checkpoint write."""
    return sorted(
        name for _, _, names in os.walk(log_dir) for name in names
        if name.endswith(".tmp") or ((p := parse_segment_file_name(name)) is not None and p.state)
    )
