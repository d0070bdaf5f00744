"""A swap that cannot start (an old segment left the log while the round ran) removes its `.cleaned` files:
`clean` exits 1 naming the segment, and the partition is left exactly as it was."""

from __future__ import annotations

import hashlib
import os

from click.testing import CliRunner

from cleaner.cli import main
from segments.files import faults
from segments.tools.generate import WorkloadSpec, generate_partition


def _files(directory) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(directory.iterdir()) if p.is_file()}


def test_an_old_segment_removed_before_the_swap_leaves_no_cleaned_file(tmp_path):
    part = tmp_path / "t-0"
    generate_partition(part, WorkloadSpec(records=3000, keys=50, segment_bytes=16 * 1024))
    logs = sorted(part.glob("*.log"))
    assert len(logs) >= 3
    gone = logs[1]  # an inactive segment, removed by someone else once the round has written its output
    faults.arm("recopy.group_written", 1, action=lambda point, n: os.remove(gone))
    try:
        done = CliRunner().invoke(main, ["clean", str(part), "--now-ms", "1900000000000"])
    finally:
        faults.disarm()
    assert done.exit_code == 1
    assert "is no longer part of the log" in done.output and gone.name in done.output
    names = os.listdir(part)
    assert not [n for n in names if n.endswith((".cleaned", ".swap", ".deleted"))], names
    assert gone.name not in names and all(p.exists() for p in logs if p != gone)
    before = _files(part)
    assert CliRunner().invoke(main, ["clean", str(part), "--dry-run", "--now-ms", "1900000000000"]).exit_code in (0, 1)
    assert _files(part) == before
