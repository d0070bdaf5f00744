"""A writer process appends while another process keeps swapping merged segments in: nothing is lost.

Both are real processes sharing one partition directory through the lock protocol of `segments.partition.locks`.
The swapper merges pairs of adjacent inactive segments into one `.cleaned` segment (copying every batch)
and swaps it in through the full suffix protocol, while the writer appends and rolls tiny segments.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from segments.partition.log import PartitionLog
from segments.tools.verify import verify_paths

WRITER = textwrap.dedent(
    """
    import sys
    from segments.partition.log import LogConfig, PartitionLog
    from segments.codec.records import Record, encode_batch
    d, n = sys.argv[1], int(sys.argv[2])
    config = LogConfig(segment_bytes=2000, index_interval_bytes=300)
    with PartitionLog.open(d, mode="writer", create=True, config=config) as log:
        for i in range(n):
            recs = [Record(j, 1_700_000_000_000 + i, b"k%d" % ((i * 3 + j) % 50), b"seq-%d-%d" % (i, j)) for j in range(3)]
            log.append_batches(encode_batch(recs, base_offset=0))
            if i % 50 == 0:
                log.flush()
    print("writer done", flush=True)
    """
)

SWAPPER = textwrap.dedent(
    """
    import os, sys, time
    from segments.partition.log import PartitionLog
    d, stop_file = sys.argv[1], sys.argv[2]
    swaps = 0
    while not os.path.exists(d):
        time.sleep(0.01)
    log = PartitionLog.open(d, mode="cleaner")
    try:
        while True:
            done = os.path.exists(stop_file)
            log.refresh(force=True)
            segs = log.segments
            inactive = segs[:-1]
            merged = False
            for a, b in zip(inactive, inactive[1:]):
                if a.size_bytes + b.size_bytes > 6000 or a.size_bytes == 0:
                    continue
                cleaned = log.new_cleaned_segment(a.base_offset)
                for seg in (a, b):
                    for pos, h in seg.iter_headers():
                        cleaned.append(seg.pread(pos, h.size_bytes), largest_offset=h.last_offset,
                                       max_timestamp=h.max_timestamp, shallow_offset=h.last_offset)
                cleaned.finalise()
                cleaned.set_last_modified_ns(b.last_modified_ns())
                log.replace_segments([cleaned], [a, b])
                swaps += 1
                merged = True
                break
            if done and not merged:
                break
            if not merged:
                time.sleep(0.005)
    finally:
        log.close()
    print("swaps", swaps, flush=True)
    """
)


@pytest.mark.slow
def test_writer_and_concurrent_swapper_lose_nothing(tmp_path):
    d = tmp_path / "logs" / "t-0"
    stop = tmp_path / "stop"
    n = 1500
    swapper = subprocess.Popen([sys.executable, "-c", SWAPPER, str(d), str(stop)], stdout=subprocess.PIPE, text=True)
    writer = subprocess.run([sys.executable, "-c", WRITER, str(d), str(n)], capture_output=True, text=True, timeout=300)
    assert writer.returncode == 0, writer.stderr
    stop.touch()
    out, _ = swapper.communicate(timeout=300)
    assert swapper.returncode == 0
    swaps = int(out.split()[-1])
    assert swaps > 5, out
    with PartitionLog.open(d, mode="reader") as log:
        records = [(r.offset, r.value) for _, r in log.iter_records()]
        merged_sizes = [s.size_bytes for s in log.segments]
    assert [o for o, _ in records] == list(range(3 * n))
    assert [v for _, v in records] == [b"seq-%d-%d" % (i, j) for i in range(n) for j in range(3)]
    assert max(merged_sizes) > 2000  # merged segments really replaced the writer's ones
    assert not verify_paths([d]).problems


def test_writer_closes_segments_a_cleaner_swapped_out(tmp_path):
    import os

    from segments.partition.log import LogConfig

    from ..segments.helpers import keyed_batch

    d = tmp_path / "t-0"
    writer = PartitionLog.open(d, mode="writer", create=True, config=LogConfig(segment_bytes=300))
    try:
        for i in range(12):
            writer.append_batches(keyed_batch([(b"k", b"v%d" % i)]))
        with PartitionLog.open(d, mode="cleaner") as cleaner:
            a, b = cleaner.segments[0], cleaner.segments[1]
            merged = cleaner.new_cleaned_segment(a.base_offset)
            for seg in (a, b):
                for pos, h in seg.iter_headers():
                    merged.append(seg.pread(pos, h.size_bytes), largest_offset=h.last_offset,
                                  max_timestamp=h.max_timestamp, shallow_offset=h.last_offset)
            merged.finalise()
            cleaner.replace_segments([merged], [a, b])
        writer.append_batches(keyed_batch([(b"k", b"after")]))
        open_files = []
        for fd in os.listdir("/proc/self/fd"):
            try:
                open_files.append(os.readlink(f"/proc/self/fd/{fd}"))
            except OSError:
                pass  # the descriptor listdir itself used
        assert not any(p.startswith(str(d)) and p.endswith("(deleted)") for p in open_files)
        assert [r.value for _, r in writer.iter_records()][-1] == b"after"
    finally:
        writer.close()
