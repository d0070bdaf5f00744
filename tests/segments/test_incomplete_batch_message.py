"""A batch that runs past the end of its file is reported with its declared size, by the cleaner's walk and by
`verify` alike (one message, `TruncatedBatchError.at_end_of_file`): a 2 GiB length in the middle of a segment
reads as a corrupt length, not as a plain torn tail."""

from __future__ import annotations

import struct

import pytest

from segments.codec.errors import TruncatedBatchError
from segments.partition.log import PartitionLog
from segments.tools.verify import verify_paths

from .helpers import write_log


def test_a_length_past_the_end_names_the_declared_size(tmp_path):
    d = tmp_path / "t-0"
    write_log(d, 300, segment_bytes=64 * 1024, value_bytes=100)
    with PartitionLog.open(d, mode="reader") as log:
        seg = log.segments[0]
        positions = [r.batch_position.tolist() for _, r in seg.scan_windows(window_bytes=1 << 20)][0]
        path, size = seg.paths.log, seg.size_bytes
    position = positions[len(positions) // 2]
    with open(path, "r+b") as f:  # the batch length field (after the 8-byte base offset)
        f.seek(position + 8)
        f.write(struct.pack(">i", 0x7FFFFFF0))
    with PartitionLog.open(d, mode="reader") as log:
        with pytest.raises(TruncatedBatchError) as caught:
            for _ in log.segments[0].scan_windows(window_bytes=1 << 20):
                pass
    expected = f"it declares {0x7FFFFFF0 + 12} bytes, the file has {size - position} from here"
    assert caught.value.position == position and expected in str(caught.value)
    summary = verify_paths([d])
    assert any(expected in p.reason for p in summary.problems), summary.problems
