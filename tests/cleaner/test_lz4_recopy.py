"""lz4 batches rebuilt by the compiled recopy (`assemble_batches` with `segments.codec._lz4_kernels`), not Python.

A cleaned lz4 log is byte for byte what the Python path writes (`_lz4_kernels.ENABLED` off in the process, and
`LOGCLEANER_LZ4_KERNELS=0` in a `logcleaner clean` process), including rebuilds whose frame needs more room
than the window's worst case and rebuilds that re-base timestamps or stamp a delete horizon; with the kernels on,
Python builds no lz4 batch at all.
"""

from __future__ import annotations

import os
import random
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from cleaner import _kernels as kernels
from cleaner import recopy
from segments.codec import _lz4_kernels as lz4k
from segments.codec import format as fmt

from .builders import (
    DAY_MS,
    ROLL,
    T0,
    Rec,
    batch,
    build_log,
    clean,
    file_digests,
    partition_dir,
    random_log,
    records,
    segment_bases,
)

pytestmark = pytest.mark.skipif(not lz4k.AVAILABLE, reason=f"liblz4 not bound: {lz4k.UNAVAILABLE_REASON}")

ROOT = Path(__file__).resolve().parents[2]


def lz4_log(directory: Path, seed: int, *, batches: int = 60, keys: int = 9) -> None:
    """lz4 v2 batches over `keys` keys: values from incompressible to all zeros (a 20 KB value compresses to ~100
    bytes, so its rebuilt frame's bound is far above the window's worst case), tombstones, LogAppendTime
    batches and rolls."""
    rng = random.Random(seed)
    steps: list[bytes | str] = []
    for i in range(batches):
        recs = []
        for j in range(rng.randint(1, 12)):
            key = b"key-%d" % rng.randrange(keys)
            kind = rng.random()
            if kind < 0.15:
                value = None
            elif kind < 0.4:
                value = bytes(rng.choice([100, 20_000]))
            elif kind < 0.7:
                value = rng.randbytes(rng.randint(1, 3000))
            else:
                value = b"value %d of batch %d " % (j, i) * rng.randint(1, 50)
            recs.append(Rec(key, value, T0 + i * 10 + rng.randint(-5, 5)))
        extra = {"timestamp_type": fmt.TIMESTAMP_LOG_APPEND_TIME, "max_timestamp": T0 + i * 10} \
            if rng.random() < 0.1 else {}
        steps.append(batch(recs, compression=fmt.COMPRESSION_LZ4, **extra))
        if rng.random() < 0.1:
            steps.append(ROLL)
    build_log(directory, steps)


def cleaned_both_ways(tmp_path: Path, monkeypatch, make, rounds) -> tuple[dict, dict]:
    """File digests of the log `make(dir)` after `rounds(dir)`, with the kernels on and off."""
    out = []
    for enabled in (True, False):
        monkeypatch.setattr(lz4k, "ENABLED", enabled)
        d = partition_dir(tmp_path / ("kernel" if enabled else "python"))
        make(d)
        rounds(d)
        out.append(file_digests(d))
    return out[0], out[1]


@pytest.mark.parametrize("seed", range(4))
def test_a_cleaned_lz4_log_is_the_python_paths_byte_for_byte(tmp_path, monkeypatch, seed):
    def rounds(d):
        clean(d, now_ms=T0 + 1000)
        clean(d, now_ms=T0 + 2 * DAY_MS, settings={"delete.retention.ms": 0})  # horizons stamped, then passed

    kernel, python = cleaned_both_ways(tmp_path, monkeypatch, lambda d: lz4_log(d, seed), rounds)
    assert kernel == python


@pytest.mark.parametrize("seed", range(6))
def test_a_cleaned_log_of_every_codec_is_the_python_paths_byte_for_byte(tmp_path, monkeypatch, seed):
    kernel, python = cleaned_both_ways(tmp_path, monkeypatch, lambda d: random_log(d, seed, batches_max=60),
                                       lambda d: clean(d, now_ms=T0 + 1000))
    assert kernel == python


def test_with_the_kernels_python_builds_no_lz4_batch(tmp_path, monkeypatch):
    built = []
    rebuild_v2 = recopy._rebuild_v2

    def spy(result, i, *args, **kwargs):
        built.append(int(result.attributes[i]) & fmt.COMPRESSION_MASK)
        return rebuild_v2(result, i, *args, **kwargs)

    monkeypatch.setattr(recopy, "_rebuild_v2", spy)
    d = partition_dir(tmp_path)
    lz4_log(d, 11, keys=200)
    before = records(d)
    result = clean(d, now_ms=T0 + 1000)
    assert result.batches_rebuilt > 10 and built == []
    latest = {key: (offset, value) for offset, key, value in before}
    assert sorted((o, k, v) for k, (o, v) in latest.items() if v is not None) == \
        sorted((o, k, v) for o, k, v in records(d) if v is not None)


def test_logcleaner_clean_writes_the_same_bytes_without_the_kernels(tmp_path):
    """The forced fallback in a whole `logcleaner clean` process (`LOGCLEANER_LZ4_KERNELS=0`)."""
    source = partition_dir(tmp_path / "source")
    lz4_log(source, 5, batches=80)
    digests = []
    for name, switch in (("kernel", "1"), ("python", "0")):
        root = tmp_path / name
        shutil.copytree(source.parent, root)
        done = subprocess.run(
            [sys.executable, "-m", "cleaner.cli", "clean", str(root), "--set", "cleanup.policy=compact",
             "--set", "delete.retention.ms=0"],
            capture_output=True, text=True, cwd=ROOT, timeout=600,
            env={**os.environ, "PYTHONPATH": str(ROOT), "LOGCLEANER_LZ4_KERNELS": switch},
        )
        assert done.returncode == 0, done.stderr
        digests.append(file_digests(root))
    assert digests[0] == digests[1]
    assert digests[0] != file_digests(source.parent)  # it did clean


def test_a_frame_needing_more_room_than_the_window_is_made_room_for(tmp_path, monkeypatch):
    """A segment with an lz4 batch of zeros (~250:1): its rebuilt frame's bound is far above the window's worst
    case (its bytes + 61 per batch + 10 per record), so the kernel asks for room and is called again; the
    batches written before it in the window are kept as the output area grows."""
    rooms = []
    assemble = kernels.assemble_batches

    def assemble_spy(*args):
        returned = assemble(*args)
        rooms.append(returned[3])
        return returned

    monkeypatch.setattr(kernels, "assemble_batches", assemble_spy)

    def make(d):
        zeros = [Rec(b"k%d" % i, bytes(20_000), T0 + i) for i in range(10)]
        before = [batch([Rec(b"a%d" % i, b"x" * 100, T0), Rec(b"k3", b"old", T0)],
                        compression=fmt.COMPRESSION_LZ4 if i % 2 else fmt.COMPRESSION_NONE) for i in range(4)]
        build_log(d, [*before, batch(zeros, compression=fmt.COMPRESSION_LZ4), ROLL,
                      batch([Rec(b"k3", b"new", T0 + 50)], compression=fmt.COMPRESSION_LZ4)])

    def cleaned_as_expected(d):
        before, active = records(d), segment_bases(d)[-1]
        latest = {key: offset for offset, key, _ in before if offset < active}  # the cleanable section's latest
        clean(d, now_ms=T0 + 1000)
        assert records(d) == [r for r in before if r[0] >= active or latest[r[1]] == r[0]]

    kernel, python = cleaned_both_ways(tmp_path, monkeypatch, make, cleaned_as_expected)
    assert kernel == python
    assert any(rooms)
