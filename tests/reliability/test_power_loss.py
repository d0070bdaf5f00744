"""Power loss at every step of a cleaning: only fsynced data and directory entries survive, and that is enough.

The scenario of `scenario.build_scenario` is cleaned in-process through `PowerLossFileOps`; at each step
the unarmed run passes (every fault point, every hit), the durable state is written out as a machine would
find it after losing power there, and the invariants of `scenario.check_after_crash` must hold on it: each
group old or new, no temporary files after reopening, `verify` clean, the latest value of every key.
The model is checked too: a write that was never fsynced must vanish from what it writes out.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from cleaner.oneshot import clean_partition
from segments.files import faults

from .powerloss import PowerLossFileOps, SimulatedPowerLoss
from .scenario import (
    COMPACT_SETTINGS,
    NOW_MS,
    PARTITION_NAMES,
    build_scenario,
    check_after_crash,
    committed_records,
    copy_tree,
    snapshot,
    temp_files,
)

pytestmark = pytest.mark.slow

PARTS = PARTITION_NAMES
SETTINGS = COMPACT_SETTINGS


def clean_all(log_dir: Path, ops: PowerLossFileOps) -> None:
    for p in PARTS:
        outcome = clean_partition(log_dir / p, SETTINGS, now_ms=NOW_MS, file_ops=ops)
        assert outcome.error is None and outcome.rounds, (outcome.error, outcome.skipped)


def tracked(log_dir: Path, scratch: Path) -> PowerLossFileOps:
    return PowerLossFileOps([log_dir, *(log_dir / p for p in PARTS)], scratch / "graveyard")


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("powerloss")
    template = build_scenario(root / "template")
    reference = copy_tree(template, root / "reference" / "logs")
    trace = root / "trace"
    faults.trace_to(trace)
    try:
        clean_all(reference, tracked(reference, root / "reference"))
    finally:
        faults.disarm()
    steps = [tuple(line.split()) for line in trace.read_text().splitlines()]
    return {
        "template": template, "steps": steps,
        "old": {p: snapshot(template / p) for p in PARTS},
        "new": {p: snapshot(reference / p) for p in PARTS},
        "inputs": {p: committed_records(template / p) for p in PARTS},
    }


def test_power_loss_at_every_step_keeps_each_group_old_or_new(world, tmp_path):
    steps = world["steps"]
    assert len(steps) > 200
    for i, (point, n) in enumerate(steps):
        case = tmp_path / f"case-{i}"
        log_dir = copy_tree(world["template"], case / "logs")
        ops = tracked(log_dir, case)
        after = case / "after" / "logs"

        def lose_power(point, n, ops=ops, after=after):
            ops.materialize(after)
            raise SimulatedPowerLoss(f"{point}@{n}")

        faults.arm(point, int(n), lose_power)
        try:
            with pytest.raises(SimulatedPowerLoss):
                clean_all(log_dir, ops)
        finally:
            faults.disarm()
        for p, old in world["old"].items():
            check_after_crash(after / p, old, world["new"][p], world["inputs"][p])
        assert temp_files(after) == [], f"{point}@{n}: temporary files after the power loss and reopen"


def test_the_model_drops_unsynced_data_and_unsynced_directory_entries(tmp_path):
    d = tmp_path / "d"
    d.mkdir()
    (d / "kept").write_bytes(b"old")
    ops = PowerLossFileOps([d], tmp_path / "graveyard")
    fd = os.open(d / "kept", os.O_WRONLY | os.O_APPEND)
    os.write(fd, b"-synced")
    ops.fsync_fd(fd)
    os.write(fd, b"-unsynced")
    os.close(fd)
    (d / "new-synced-dir").write_bytes(b"x")
    ops.fsync_dir(d)
    (d / "new-unsynced-dir").write_bytes(b"y")
    ops.rename(d / "kept", d / "renamed")
    ops.materialize(tmp_path / "after")
    after = tmp_path / "after" / "d" if (tmp_path / "after" / "d").exists() else tmp_path / "after"
    assert sorted(os.listdir(after)) == ["kept", "new-synced-dir"]
    assert (after / "kept").read_bytes() == b"old-synced"
    assert (after / "new-synced-dir").read_bytes() == b""
