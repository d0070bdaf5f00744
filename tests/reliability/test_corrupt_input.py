"""Corrupt input: damaged segment files never crash a reader, never half-clean a partition, never hang, and a
declared size never becomes an allocation.

Hypothesis takes a partition — a real one written by Kafka (`tests/fixtures/kafka`: a Kafka 2.4 compacted topic
before and after Kafka's own cleaner, `__consumer_offsets`, an idempotent producer's topic, null keys) or one
generated here (every codec, transactions ending in commits and aborts, idempotent producers, tombstones,
unkeyed records; and legacy v0/v1 messages and gzip/snappy/lz4 wrappers) — and damages one `.log` file: bits
flipped, bytes set, a field of a batch header (baseOffset, length, partitionLeaderEpoch, magic, CRC, attributes,
lastOffsetDelta, timestamps, producer fields, record count) set to a boundary value with or without its CRC
recomputed (so that the checks after the CRC are reached), bytes of the records changed under a recomputed CRC,
the file cut anywhere, pieces of two files spliced, a batch duplicated, dropped or swapped with the next.
`fuzz_segments.py` does the same with atheris' coverage-guided mutations.

Every reader — the scan with CRC checks, `PartitionLog` opened as a reader and then iterated and read, and
`segments.tools.verify` — returns or raises a `SegmentError`, never IndexError, ValueError, struct.error, a numba
error or MemoryError. A file reader's error names the file and a byte position inside it (the pure scan has no
file: its position is inside its buffer). A declared size is never an allocation: a batch length of 2 GiB, a
record count or a varint of 2^31 costs less than 64 MiB at peak (tracemalloc, which sees numpy's memory).

`logcleaner clean` exits 0, or exits 1 with "<file>: byte <position>: <reason>" where <file> is a `.log` of the
partition and the position lies inside it; then every `.log`, snapshot and checkpoint of the log dir is byte for
byte as it was and no `.cleaned`, `.swap`, `.deleted` or `.tmp` file is left (lock files aside: opening a log
creates them, and they hold nothing). The one change a failed clean may leave is a rebuilt index: the cleaner
rebuilds an index file that is missing or fails its sanity check when it opens a log, as Kafka's load does, so an
index file may appear, or change if `verify` reported it broken before; never an index `verify` found sound.

How "a reader finds corruption" and "clean fails" agree — the decision these properties pin:

1. Header-level damage in an inactive segment — anything the header scan with CRC checks rejects (framing, a
   length, the magic, a codec, a CRC), an incomplete batch at its end, or batch offsets out of order,
   overlapping, below the segment's base or reaching the next segment's base — makes clean fail. The survey
   reads every inactive segment's headers before anything is written.
2. Record-level damage under a valid CRC (a bad varint, a count that does not match the records, a stream that
   does not decompress) makes clean fail when it lies in a segment the round recopies (base below the round's
   end offset). A segment the round does not reach is not rewritten, and is checked by the round that does.
   In the dirty section and in legacy wrappers it is found before anything is swapped. In the records of the
   clean section (cleaned by an earlier round, so damage there needs a writer that computed a CRC over bad
   bytes) it is found when the recopy reaches that group: the groups before it stay swapped, each complete and
   sound, as in Kafka; that group, every later one and the checkpoints are left as they were. This is the one
   exception to "every file as it was", kept because finding it earlier costs a second decompression of the
   clean section in every round.
3. Clean only ever blames a segment that `logcleaner verify` reports a problem in: in its `.log` or, when the
   round starts inside that segment and looks its start up in the offset index (as Kafka does), in its index.
4. The active segment belongs to its writer: clean never changes it and a torn tail at its end (a crash
   mid-append, recovery's business) never makes clean fail.
5. A successful clean leaves no problem behind that was not there before: whatever `verify` reports afterwards
   is in a file clean did not change, exactly as reported before.

Undetectable by design: the CRC does not cover `partitionLeaderEpoch` and `baseOffset`. A changed leader epoch
is invisible and harmless (nothing reads it). A changed base offset is caught exactly when it breaks the order
of offsets; otherwise the batch's records simply carry the new offsets, for every reader and for the cleaner
alike. A segment cut at a batch boundary looks like a shorter segment. The properties assert these outcomes
instead of pretending that every mutation is caught.

No hang: each test has a pytest timeout, and each Hypothesis example a 10 s deadline — far above the 0.1 s an
example takes on a loaded 2-core machine, so only a pathological slow-down (a loop driven by a corrupt count)
trips it.
"""

from __future__ import annotations

import contextlib
import json
import re
import shutil
import struct
import subprocess
import sys
import tempfile
import tracemalloc
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, assume, event, example, given, settings
from hypothesis import strategies as st

from cleaner.cli import main as cli_main
from cleaner.oneshot import clean_partition
from cleaner.settings import Settings
from segments.codec import format as fmt
from segments.codec.errors import CorruptIndexError, CorruptRecordError, SegmentError
from segments.codec.legacy import encode_legacy_message, encode_legacy_wrapper
from segments.codec.records import Record, batch_crc, encode_batch
from segments.codec.scan import scan, warm_up
from segments.codec.varint import encode_varint
from segments.files.names import parse_segment_file_name
from segments.partition.checkpoint import (
    CLEANER_OFFSET_CHECKPOINT,
    read_offset_checkpoint,
    update_offset_checkpoint,
)
from segments.partition.log import PartitionLog
from segments.tools.verify import verify_paths

from ..cleaner.builders import random_log
from ..kafka_fixtures import copy_kafka_fixture
from .logfiles import leftovers, snapshot

LOGCLEANER = Path(sys.executable).with_name("logcleaner")
NOW_MS = 1_800_000_000_000  # the cleaner's clock: every tombstone's delete horizon has passed
T0 = 1_700_000_000_000
PEAK_BYTES_MAX = 64 * 1024 * 1024
GROUP_BYTES = 40_000  # segment.bytes for the clean properties: groups of a few segments
SUBPROCESS_TIMEOUT_S = 60

# Real partitions: (fixture dir, partition dir name, whether to append an empty active segment). The public
# fixtures are one segment each; with an empty active segment after it, that segment is an inactive one the
# cleaner reads, as it would be once the broker rolled.
REAL_SOURCES = {
    "kafka-2.4-raw": ("kafka-2.4-c2/raw", "c2-0", False),
    "kafka-2.4-cleaned": ("kafka-2.4-c2/kafka-cleaned", "c2-0", False),
    "consumer-offsets": ("public/__consumer_offsets-39", "__consumer_offsets-39", True),
    "idempotent-producer": ("public/test-0", "test-0", True),
    "null-keys": ("public/first-0", "first-0", True),
}
NO_INDEX_SOURCE = "kafka-2.4-raw-no-index"  # the same partition with every index file gone: open rebuilds them
KRAFT_SOURCE = ("public/__cluster_metadata-0", "__cluster_metadata-0")  # read and verify only: never cleaned
KAFKA_RAW_FIRST_DIRTY = 700  # the cleaner checkpoint given to the Kafka 2.4 partition: inside segment 576
GENERATED_SEEDS = (0, 1, 2)
CLEANED_SOURCES = (*REAL_SOURCES, NO_INDEX_SOURCE, *(f"generated-{s}" for s in GENERATED_SEEDS), "legacy")
READ_SOURCES = (*CLEANED_SOURCES, "kraft")
INDEXED_SOURCES = tuple(s for s in CLEANED_SOURCES if s != NO_INDEX_SOURCE)  # (the KRaft fixture has none either)
# Sources whose active segment holds data (a torn tail can be cut into it).
ACTIVE_DATA_SOURCES = ("kafka-2.4-raw", "kafka-2.4-cleaned", NO_INDEX_SOURCE, *(f"generated-{s}" for s in GENERATED_SEEDS),
                       "legacy")

PROPERTY = settings(
    max_examples=300,
    deadline=timedelta(seconds=10),
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


# ---- the sources --------------------------------------------------------------------------------------------


class Corpus:
    """Undamaged sources, each a log dir holding one partition (and its checkpoints), plus splice donors.

    A plain class, not a dataclass: Hypothesis prints a failing example's arguments field by field, and a
    megabyte of donor bytes would drown the example.
    """

    def __init__(self, root: Path, sources: dict[str, Path], donors: tuple[bytes, ...]) -> None:
        self.root = root
        self.sources = sources
        self.donors = donors  # every non-empty segment file of every source

    def __repr__(self) -> str:
        return f"Corpus({self.root})"


def _copy_real(fixture: str, name: str, log_dir: Path, *, append_active: bool) -> Path:
    directory = copy_kafka_fixture(fixture, log_dir / name)
    if append_active:
        (segment,) = directory.glob("*.log")
        next_offset = int(scan(segment.read_bytes(), headers_only=True).last_offset[-1]) + 1
        (directory / fmt.offset_file_name(next_offset, fmt.LOG_SUFFIX)).write_bytes(b"")
        # Kafka left no index for it (preallocated files were not kept): build them as a broker's recovery would.
        with PartitionLog.open(directory, mode="writer"):
            pass
    return directory


def _generated(seed: int, log_dir: Path) -> Path:
    """`random_log` (every codec, transactions, idempotent producers, tombstones) plus data in its active segment."""
    directory = log_dir / "t-0"
    random_log(directory, seed)
    with PartitionLog.open(directory, mode="writer", clock_ms=lambda: T0) as log:
        log.append_records([(b"k1", b"tail-%d" % seed), (b"k2", None)], timestamp_ms=T0 + 1000)
        log.append_records([(b"k3", b"txn")], timestamp_ms=T0 + 1001, producer_id=7, producer_epoch=0,
                           base_sequence=0, is_transactional=True)
    return directory


def _legacy(log_dir: Path) -> Path:
    """A v0 segment and a v1 segment of plain messages and gzip/snappy/lz4 wrappers, then v2 data; indexes built."""
    directory = log_dir / "old-0"
    directory.mkdir(parents=True)
    offset = 0
    for magic in (fmt.MAGIC_V0, fmt.MAGIC_V1):
        base, parts = offset, []
        for _ in range(3):
            value = None if offset % 3 == 2 else b"v%d" % offset
            timestamp = T0 + offset if magic == fmt.MAGIC_V1 else fmt.NO_TIMESTAMP
            parts.append(encode_legacy_message(offset, b"k%d" % (offset % 4), value, magic=magic, timestamp=timestamp))
            offset += 1
        for codec in (fmt.COMPRESSION_GZIP, fmt.COMPRESSION_SNAPPY, fmt.COMPRESSION_LZ4):
            inner = [Record(offset=offset + j, timestamp=T0 + offset + j, key=b"k%d" % ((offset + j) % 4),
                            value=b"w%d" % (offset + j)) for j in range(3)]
            parts.append(encode_legacy_wrapper(inner, magic=magic, codec=codec))
            offset += 3
        (directory / fmt.offset_file_name(base, fmt.LOG_SUFFIX)).write_bytes(b"".join(parts))
    v2 = [Record(offset=offset + j, timestamp=T0 + offset + j, key=b"k%d" % j, value=b"n%d" % j) for j in range(4)]
    (directory / fmt.offset_file_name(offset, fmt.LOG_SUFFIX)).write_bytes(
        encode_batch(v2[:2], base_offset=offset, compression=fmt.COMPRESSION_ZSTD))
    (directory / fmt.offset_file_name(offset + 2, fmt.LOG_SUFFIX)).write_bytes(
        encode_batch(v2[2:3], base_offset=offset + 2))
    with PartitionLog.open(directory, mode="writer"):
        pass  # the writer's recovery builds every index
    return directory


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Corpus:
    warm_up()
    root = tmp_path_factory.mktemp("corrupt-input")
    sources: dict[str, Path] = {}
    for source, (fixture, name, append_active) in REAL_SOURCES.items():
        sources[source] = root / source / "logs"
        _copy_real(fixture, name, sources[source], append_active=append_active)
    # A clean section and a dirty one that starts inside segment 576 (as after a round whose map filled: the
    # round looks its start up in Kafka's offset index), and a checkpoint file that must survive a failed clean.
    update_offset_checkpoint(sources["kafka-2.4-raw"] / CLEANER_OFFSET_CHECKPOINT, {("c2", 0): KAFKA_RAW_FIRST_DIRTY})
    sources[NO_INDEX_SOURCE] = root / NO_INDEX_SOURCE / "logs"
    for path in _copy_real("kafka-2.4-c2/raw", "c2-0", sources[NO_INDEX_SOURCE], append_active=False).iterdir():
        if path.suffix in (fmt.INDEX_SUFFIX, fmt.TIME_INDEX_SUFFIX):
            path.unlink()
    sources["kraft"] = root / "kraft" / "logs"
    _copy_real(*KRAFT_SOURCE, sources["kraft"], append_active=False)
    for seed in GENERATED_SEEDS:
        sources[f"generated-{seed}"] = root / f"generated-{seed}" / "logs"
        _generated(seed, sources[f"generated-{seed}"])
    sources["legacy"] = root / "legacy" / "logs"
    _legacy(sources["legacy"])
    donors = tuple(p.read_bytes() for log_dir in sources.values() for p in sorted(log_dir.glob("*/*.log"))
                   if p.stat().st_size)
    return Corpus(root, sources, donors)


# ---- mutations ----------------------------------------------------------------------------------------------

_FIELD_NAMES = (
    "baseOffset", "length", "partitionLeaderEpoch", "magic", "crc", "attributes", "lastOffsetDelta",
    "baseTimestamp", "maxTimestamp", "producerId", "producerEpoch", "baseSequence", "recordsCount",
)


def _field_layout() -> dict[str, tuple[int, struct.Struct]]:
    """Each v2 header field's offset and layout, read off `fmt.BATCH_V2` (no offset is spelled here)."""
    layout, pos = {}, 0
    for name, code in zip(_FIELD_NAMES, fmt.BATCH_V2.format.lstrip(">"), strict=True):
        field = struct.Struct(">" + code)
        layout[name] = (pos, field)
        pos += field.size
    assert pos == fmt.RECORD_BATCH_OVERHEAD
    return layout


FIELDS = _field_layout()
OUTSIDE_CRC = ("baseOffset", "length", "partitionLeaderEpoch", "magic", "crc")


def batch_spans(data: bytes) -> list[tuple[int, int]]:
    """(position, size) of the whole batches a walk of the length prefixes finds, until one does not fit."""
    spans, pos = [], 0
    while pos + fmt.HEADER_SIZE_UP_TO_MAGIC < len(data):
        (length,) = struct.unpack_from(">i", data, pos + fmt.LENGTH_OFFSET)
        size = length + fmt.LOG_OVERHEAD
        if length < fmt.LENGTH_MIN or pos + size > len(data):
            break
        spans.append((pos, size))
        pos += size
    return spans


def fix_crc(data: bytearray, pos: int) -> None:
    """Recompute the stored CRC of the batch (any magic) at `pos` if its declared size fits the data."""
    (length,) = struct.unpack_from(">i", data, pos + fmt.LENGTH_OFFSET)
    size = length + fmt.LOG_OVERHEAD
    if length < fmt.LENGTH_MIN or pos + size > len(data):
        return
    magic = data[pos + fmt.MAGIC_OFFSET]
    if magic == fmt.MAGIC_V2 and size >= fmt.RECORD_BATCH_OVERHEAD:
        struct.pack_into(">I", data, pos + fmt.CRC_OFFSET, batch_crc(bytes(data), pos, size))
    elif magic in (fmt.MAGIC_V0, fmt.MAGIC_V1):
        crc = zlib.crc32(bytes(data[pos + fmt.LEGACY_MAGIC_OFFSET : pos + size]))
        struct.pack_into(">I", data, pos + fmt.LEGACY_CRC_OFFSET, crc)


def _wrap(value: int, field: struct.Struct) -> int:
    """`value` reduced into the range of the (signed or unsigned) integer `field`."""
    bits = 8 * field.size
    if field.format[-1].isupper():
        return value % (1 << bits)
    return (value + (1 << (bits - 1))) % (1 << bits) - (1 << (bits - 1))


@dataclass(frozen=True)
class FlipBits:
    at: int
    mask: int

    def apply(self, data: bytes, donors) -> bytes:
        if not data:
            return data
        out = bytearray(data)
        out[self.at % len(out)] ^= self.mask
        return bytes(out)


@dataclass(frozen=True)
class SetBytes:
    at: int
    value: int
    count: int

    def apply(self, data: bytes, donors) -> bytes:
        if not data:
            return data
        at = self.at % len(data)
        end = min(len(data), at + self.count)
        return data[:at] + bytes([self.value]) * (end - at) + data[end:]


@dataclass(frozen=True)
class SetField:
    """Set one v2 header field of one batch: to `value`, or (`relative`) to its value plus `value`."""

    batch: int
    field: str
    value: int
    relative: bool
    recompute_crc: bool

    def apply(self, data: bytes, donors) -> bytes:
        spans = batch_spans(data)
        if not spans:
            return data
        pos, _ = spans[self.batch % len(spans)]
        offset, field = FIELDS[self.field]
        if pos + offset + field.size > len(data):
            return data
        out = bytearray(data)
        (old,) = field.unpack_from(out, pos + offset)
        field.pack_into(out, pos + offset, _wrap(old + self.value if self.relative else self.value, field))
        if self.recompute_crc:
            fix_crc(out, pos)
        return bytes(out)


@dataclass(frozen=True)
class SetRecordByte:
    """Set one byte of a batch's records (or a legacy message's body) and recompute the CRC over it."""

    batch: int
    at: int
    value: int

    def apply(self, data: bytes, donors) -> bytes:
        spans = batch_spans(data)
        if not spans:
            return data
        pos, size = spans[self.batch % len(spans)]
        header = fmt.RECORD_BATCH_OVERHEAD if data[pos + fmt.MAGIC_OFFSET] == fmt.MAGIC_V2 else fmt.LEGACY_HEADER.size
        if size <= header:
            return data
        out = bytearray(data)
        out[pos + header + self.at % (size - header)] = self.value
        fix_crc(out, pos)
        return bytes(out)


@dataclass(frozen=True)
class Truncate:
    at: int

    def apply(self, data: bytes, donors) -> bytes:
        return data[: self.at % (len(data) + 1)]


@dataclass(frozen=True)
class Splice:
    """Put `length` bytes of another file at `at`, keeping or dropping the rest of this one."""

    at: int
    donor: int
    donor_at: int
    length: int
    keep_tail: bool

    def apply(self, data: bytes, donors) -> bytes:
        donor = donors[self.donor % len(donors)]
        start = self.donor_at % (len(donor) + 1)
        at = self.at % (len(data) + 1)
        return data[:at] + donor[start : start + self.length] + (data[at:] if self.keep_tail else b"")


@dataclass(frozen=True)
class MoveBatches:
    """Duplicate a batch in place, drop it, or swap it with the next one."""

    batch: int
    how: str  # "duplicate" | "drop" | "swap"

    def apply(self, data: bytes, donors) -> bytes:
        spans = batch_spans(data)
        if not spans:
            return data
        i = self.batch % len(spans)
        pos, size = spans[i]
        one = data[pos : pos + size]
        if self.how == "duplicate":
            return data[: pos + size] + one + data[pos + size :]
        if self.how == "drop":
            return data[:pos] + data[pos + size :]
        if i + 1 == len(spans):
            return data
        _, next_size = spans[i + 1]
        other = data[pos + size : pos + size + next_size]
        return data[:pos] + other + one + data[pos + size + next_size :]


_INDEX = st.integers(0, 2**20)
_BYTE = st.integers(0, 255)
_BOUNDARY_VALUES = (0, 1, -1, 2, 0x7F, 0x80, 0xFF, 2**15 - 1, -(2**15), 2**31 - 1, 2**31 - 13, -(2**31),
                    2**31, 2**32 - 1, 2**63 - 1, -(2**63))


def _set_field() -> st.SearchStrategy[SetField]:
    absolute = st.builds(SetField, _INDEX, st.sampled_from(_FIELD_NAMES),
                         st.one_of(st.sampled_from(_BOUNDARY_VALUES), st.integers(-(2**63), 2**63 - 1)),
                         st.just(False), st.booleans())
    relative = st.builds(SetField, _INDEX, st.sampled_from(_FIELD_NAMES),
                         st.one_of(st.integers(-3, 3), st.sampled_from((-(2**31), 2**31, 1000, -1000))),
                         st.just(True), st.booleans())
    return st.one_of(absolute, relative)


MUTATIONS = st.one_of(
    st.builds(FlipBits, _INDEX, st.integers(1, 255)),
    st.builds(SetBytes, _INDEX, st.sampled_from((0x00, 0xFF, 0x7F, 0x80)) | _BYTE, st.integers(1, 16)),
    _set_field(),
    st.builds(SetRecordByte, _INDEX, _INDEX, st.sampled_from((0x00, 0xFF, 0x7F, 0x80, 0x01)) | _BYTE),
    st.builds(Truncate, _INDEX),
    st.builds(Splice, _INDEX, _INDEX, _INDEX, st.integers(1, 4096), st.booleans()),
    st.builds(MoveBatches, _INDEX, st.sampled_from(("duplicate", "drop", "swap"))),
)


@dataclass(frozen=True)
class Damage:
    """Which source, which of its files (`target` modulo the candidates, in offset order), and what to do to it."""

    source: str
    target: int
    mutations: tuple
    index_files: bool = False  # damage an `.index`/`.timeindex` file instead of a `.log`

    def victim(self, directory: Path) -> Path:
        suffixes = (fmt.INDEX_SUFFIX, fmt.TIME_INDEX_SUFFIX) if self.index_files else (fmt.LOG_SUFFIX,)
        candidates = sorted(p for p in directory.iterdir() if p.suffix in suffixes)
        return candidates[self.target % len(candidates)]


def damage(sources, *, index_files: bool = False) -> st.SearchStrategy[Damage]:
    return st.builds(Damage, st.sampled_from(sources), _INDEX, st.lists(MUTATIONS, min_size=1, max_size=3).map(tuple),
                     st.just(index_files))


@dataclass(frozen=True)
class Damaged:
    log_dir: Path
    directory: Path
    victim: Path
    original: bytes
    data: bytes


@contextlib.contextmanager
def fresh_copy(corpus: Corpus, source: str) -> Iterator[tuple[Path, Path]]:
    """(log dir, partition dir) of a fresh copy of `source`, removed afterwards."""
    with tempfile.TemporaryDirectory(dir=corpus.root) as tmp:
        log_dir = Path(tmp) / "logs"
        shutil.copytree(corpus.sources[source], log_dir)
        (directory,) = (p for p in log_dir.iterdir() if p.is_dir())
        yield log_dir, directory


@contextlib.contextmanager
def damaged_copy(corpus: Corpus, case: Damage) -> Iterator[Damaged]:
    """A fresh copy of `case.source` with its damage applied, removed afterwards."""
    with fresh_copy(corpus, case.source) as (log_dir, directory):
        victim = case.victim(directory)
        original = data = victim.read_bytes()
        for mutation in case.mutations:
            data = mutation.apply(data, corpus.donors)
        victim.write_bytes(data)
        yield Damaged(log_dir, directory, victim, original, data)


# ---- observations -------------------------------------------------------------------------------------------

_LOCATED = re.compile(r"^(?P<path>/.+?): byte (?P<position>\d+): \S")


def segment_logs(directory: Path) -> list[tuple[int, Path]]:
    """(base offset, path) of every `.log` segment, in offset order; the last one is the active segment."""
    out = []
    for path in directory.iterdir():
        parsed = parse_segment_file_name(path.name)
        if parsed is not None and parsed.kind == fmt.LOG_SUFFIX and not parsed.state:
            out.append((parsed.offset, path))
    return sorted(out)


def assert_located(exc: SegmentError, directory: Path) -> None:
    """A file reader's error: typed, naming a file of `directory` and a byte position inside it."""
    assert isinstance(exc, (CorruptRecordError, CorruptIndexError)), f"{type(exc).__name__}: {exc}"
    path = Path(exc.path)
    assert path.parent == directory, exc
    assert 0 <= exc.position <= path.stat().st_size, exc
    assert str(exc).startswith(f"{exc.path}: byte {exc.position}: "), exc


def located(message: str) -> tuple[Path, int]:
    """(file, byte position) a "<file>: byte <position>: <reason>" message names."""
    match = _LOCATED.match(message)
    assert match, f"the message does not name a file and a byte position: {message!r}"
    return Path(match["path"]), int(match["position"])


def read_everything(directory: Path) -> list[tuple]:
    """What a consumer sees: every record, then fetches at the log start, middle and end."""
    with PartitionLog.open(directory, mode="reader") as log:
        records = [(r.offset, r.timestamp, r.key, r.value, r.headers) for _, r in log.iter_records()]
        start, end = log.log_start_offset, log.log_end_offset
        for offset in sorted({start, (start + end) // 2, end}):
            log.read(offset)
    return records


def assert_only_broken_indexes_rebuilt(log_dir: Path, before: dict[str, str], after: dict[str, str],
                                      problems_before: dict[Path, set]) -> None:
    """What a failed clean may leave: index files it rebuilt because they were missing or broken, nothing else."""
    changed = {name for name in before.keys() | after.keys() if before.get(name) != after.get(name)}
    for name in changed:
        path = log_dir / name
        assert path.suffix in (fmt.INDEX_SUFFIX, fmt.TIME_INDEX_SUFFIX), f"a failed clean changed {name}"
        assert name not in before or path in problems_before, f"a failed clean rewrote the sound index {name}"
        assert name in after, f"a failed clean removed {name}"


def first_dirty_offset(directory: Path) -> int:
    """The partition's cleaner checkpoint (its clean section ends there), or 0."""
    topic, _, partition = directory.name.rpartition("-")
    return read_offset_checkpoint(directory.parent / CLEANER_OFFSET_CHECKPOINT).get((topic, int(partition)), 0)


def assert_groups_before_swapped_whole(log_dir: Path, before: dict[str, str], after: dict[str, str],
                                       blamed_base: int) -> set[str]:
    """Names of the segment files a failed round swapped in below the blamed segment; asserts that they are sound
    (verify finds nothing in them) and that nothing at or above the blamed segment belongs to them."""
    swapped = set()
    for name in before.keys() | after.keys():
        parsed = parse_segment_file_name(Path(name).name)
        if before.get(name) != after.get(name) and parsed is not None and parsed.offset < blamed_base:
            swapped.add(name)
    unsound = [p for p in verify_paths([log_dir]).problems if str(Path(p.path).relative_to(log_dir)) in swapped]
    assert not unsound, f"a swapped group is not sound: {unsound}"
    return swapped


def problems_by_file(log_dir: Path) -> dict[Path, set[tuple[int, str]]]:
    """`verify`'s problems in the log dir: file → {(byte position, reason)}."""
    out: dict[Path, set[tuple[int, str]]] = {}
    for problem in verify_paths([log_dir]).problems:
        out.setdefault(Path(problem.path), set()).add((problem.position, problem.reason))
    return out


def clean_cli(directory: Path) -> tuple[int, dict]:
    """`logcleaner clean --json` in-process: the exit code and the partition's summary. A small segment.bytes
    makes rounds of several groups (about two Kafka 2.4 segments each), each swapped on its own."""
    args = ["clean", "--now-ms", str(NOW_MS), "--json", "--set", f"segment.bytes={GROUP_BYTES}", str(directory)]
    result = CliRunner().invoke(cli_main, args)
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    lines = [line for line in result.stdout.splitlines() if line.startswith("{")]
    assert len(lines) == 1, result.output
    return result.exit_code, json.loads(lines[0])


@dataclass(frozen=True)
class SegmentHealth:
    """What an oracle independent of the cleaner finds in one segment (byte positions, None when fine)."""

    base: int
    path: Path
    active: bool
    header_damage: int | None  # framing, CRC, torn end, or offsets out of order or out of the segment's range
    record_damage: int | None  # the full scan (records decoded, streams decompressed) fails


def health(directory: Path) -> list[SegmentHealth]:
    """Every segment's health, in offset order, by the rules of the module docstring (rule 1: header level)."""
    logs = segment_logs(directory)
    out = []
    floor = 0
    for i, (base, path) in enumerate(logs):
        data = path.read_bytes()
        active = i == len(logs) - 1
        header_damage = None
        try:
            result = scan(data, headers_only=True)
        except CorruptRecordError as exc:
            header_damage = exc.position
        else:
            if not active:
                ceiling = min(logs[i + 1][0], base + fmt.RELATIVE_OFFSET_MAX + 1)
                wrapper = result.is_legacy & (result.compression != fmt.COMPRESSION_NONE)  # base offset unknown
                starts = np.where(wrapper, result.last_offset, result.base_offset)
                for j in range(result.n_batches):
                    start, last = int(starts[j]), int(result.last_offset[j])
                    if start < max(floor, base) or last < start or last >= ceiling:
                        header_damage = int(result.batch_position[j])
                        break
                    floor = last + 1
            if header_damage is None and result.end_position != len(data):
                header_damage = result.end_position
        try:
            scan(data)
            record_damage = None
        except CorruptRecordError as exc:
            record_damage = exc.position
        out.append(SegmentHealth(base, path, active, header_damage, record_damage))
    return out


# ---- readers ------------------------------------------------------------------------------------------------


@PROPERTY
@given(case=st.one_of(damage(READ_SOURCES), damage(INDEXED_SOURCES, index_files=True)))
# found by CI: the sign bit of the active segment's base offset made the log end -2^63 + 26 and a reader
# answered "out of range" instead of naming the corrupt batch
@example(case=Damage("legacy", 3, (FlipBits(at=0, mask=128),), False))
@pytest.mark.timeout(180)
def test_readers_raise_only_typed_errors_naming_the_file_and_a_position_in_it(corpus, case):
    with damaged_copy(corpus, case) as d:
        if not case.index_files:
            for headers_only in (False, True):
                try:
                    scan(d.data, headers_only=headers_only)
                except CorruptRecordError as exc:  # the pure scan: no file, a position inside the buffer
                    assert exc.path is None and 0 <= exc.position <= len(d.data), exc
        try:
            read_everything(d.directory)
            event("reader: read to the end")
        except SegmentError as exc:
            event(f"reader: {type(exc).__name__}")
            assert_located(exc, d.directory)
        for path in (d.log_dir, d.victim):
            for problem in verify_paths([path]).problems:
                assert Path(problem.path).parent in (d.directory, d.log_dir), problem
                assert 0 <= problem.position <= Path(problem.path).stat().st_size, problem


# ---- clean --------------------------------------------------------------------------------------------------


@PROPERTY
@given(case=damage(CLEANED_SOURCES))
@pytest.mark.timeout(240)
def test_clean_succeeds_or_fails_naming_file_and_position_and_leaves_the_files_as_they_were(corpus, case):
    with damaged_copy(corpus, case) as d:
        oracle = health(d.directory)
        before = snapshot(d.log_dir)
        problems_before = problems_by_file(d.log_dir)
        active_before = oracle[-1].path.read_bytes()
        code, summary = clean_cli(d.directory)
        assert code in (0, 1) and summary["status"] in ("ok", "failed"), summary
        event(f"clean {summary['status']}")
        inactive = [s for s in oracle if not s.active]
        if summary["status"] == "failed":
            assert code == 1
            path, position = located(summary["error"])
            assert path.parent == d.directory and path.suffix == fmt.LOG_SUFFIX, summary["error"]
            assert 0 <= position <= len(Path(path).read_bytes())
            blamable = {path, path.with_suffix(fmt.INDEX_SUFFIX), path.with_suffix(fmt.TIME_INDEX_SUFFIX)}
            assert blamable & problems_before.keys(), f"clean blamed {path.name}; verify finds nothing wrong there"
            after = snapshot(d.log_dir)
            blamed_base = parse_segment_file_name(path.name).offset
            if blamed_base < first_dirty_offset(d.directory) and all(s.header_damage is None for s in inactive):
                # Records of the clean section under a valid CRC: found when the recopy reaches their group.
                swapped = assert_groups_before_swapped_whole(d.log_dir, before, after, blamed_base)
                event(f"groups swapped before the damage: {bool(swapped)}")
                after = {name: digest for name, digest in after.items() if name not in swapped}
                before = {name: digest for name, digest in before.items() if name not in swapped}
            assert_only_broken_indexes_rebuilt(d.log_dir, before, after, problems_before)
            assert leftovers(d.log_dir) == []
            return
        assert code == 0
        assert not [s for s in inactive if s.header_damage is not None], "header-level damage went unnoticed"
        end_offset = summary.get("end_offset", 0)
        assert not [s for s in inactive if s.record_damage is not None and s.base < end_offset], (
            "a segment with damaged records was recopied")
        assert oracle[-1].path.read_bytes() == active_before, "clean changed the active segment"
        after = snapshot(d.log_dir)
        for path, problems in problems_by_file(d.log_dir).items():
            key = str(path.relative_to(d.log_dir))
            assert after.get(key) == before.get(key), f"clean left a problem in a file it wrote: {path.name} {problems}"
            assert problems <= problems_before.get(path, set()), f"new problems in {path.name}: {problems}"
        assert leftovers(d.log_dir) == []


# ---- undetectable by design -----------------------------------------------------------------------------------

V2_SOURCES = ("kafka-2.4-raw", NO_INDEX_SOURCE, "consumer-offsets", "idempotent-producer", "null-keys", "generated-0",
              "generated-1")


def v2_batches(directory: Path, *, inactive_only: bool = False) -> list[tuple[Path, int, int]]:
    """(segment file, position, size) of every magic-2 batch, in offset order."""
    logs = segment_logs(directory)
    if inactive_only:
        logs = logs[:-1]
    out = []
    for _, path in logs:
        data = path.read_bytes()
        out += [(path, pos, size) for pos, size in batch_spans(data) if data[pos + fmt.MAGIC_OFFSET] == fmt.MAGIC_V2]
    return out


def set_header_field(path: Path, position: int, field: str, value: int) -> None:
    data = bytearray(path.read_bytes())
    offset, layout = FIELDS[field]
    layout.pack_into(data, position + offset, _wrap(value, layout))
    path.write_bytes(bytes(data))


@settings(PROPERTY, max_examples=60)
@given(source=st.sampled_from(V2_SOURCES), picks=st.lists(_INDEX, min_size=1, max_size=4),
       epoch=st.integers(-(2**31), 2**31 - 1))
@pytest.mark.timeout(120)
def test_partition_leader_epoch_is_outside_the_crc_and_changes_nothing_anyone_reads(corpus, source, picks, epoch):
    with fresh_copy(corpus, source) as (log_dir, directory):
        expected_records = read_everything(directory)
        expected_problems = verify_paths([log_dir]).problems
        batches = v2_batches(directory)
        for pick in picks:
            path, position, _ = batches[pick % len(batches)]
            set_header_field(path, position, "partitionLeaderEpoch", epoch)
        assert read_everything(directory) == expected_records
        assert verify_paths([log_dir]).problems == expected_problems
        code, summary = clean_cli(directory)
        assert (code, summary["status"]) == (0, "ok"), summary


@settings(PROPERTY, max_examples=60)
@given(source=st.sampled_from(V2_SOURCES), pick=_INDEX,
       shift=st.one_of(st.integers(-3, 3), st.integers(-(2**40), 2**40), st.sampled_from((2**62, 2**63 - 1, -(2**63)))))
@pytest.mark.timeout(120)
def test_base_offset_is_outside_the_crc_so_only_a_broken_order_of_offsets_is_caught(corpus, source, pick, shift):
    with fresh_copy(corpus, source) as (log_dir, directory):
        batches = v2_batches(directory, inactive_only=True)
        assume(batches)
        path, position, _ = batches[pick % len(batches)]
        before = scan(b"".join(p.read_bytes() for _, p in segment_logs(directory)[:-1]), headers_only=True)
        i = int(np.flatnonzero(before.batch_size > 0)[[p == path and q == position for p, q, _ in batches].index(True)])
        old_base, old_last = int(before.base_offset[i]), int(before.last_offset[i])
        new_base, new_last = old_base + shift, old_last + shift
        bases = [b for b, _ in segment_logs(directory)]
        segment_base = max(b for b in bases if b <= old_base)
        next_segment_base = min(b for b in bases if b > old_base)
        floor = max(int(before.last_offset[i - 1]) + 1 if i else 0, segment_base)
        ceiling = min(int(before.base_offset[i + 1]) if i + 1 < before.n_batches else next_segment_base,
                      next_segment_base, segment_base + fmt.RELATIVE_OFFSET_MAX + 1)
        in_order = floor <= new_base and new_last < ceiling and new_last < 2**63
        expected = [(o + shift if old_base <= o <= old_last else o, *rest) for o, *rest in read_everything(directory)]
        set_header_field(path, position, "baseOffset", new_base)
        event(f"offsets still in order: {in_order}")
        code, summary = clean_cli_copy(log_dir, directory)
        log_problems = [p for p in verify_paths([log_dir]).problems if p.path == str(path)]
        if in_order:
            assert read_everything(directory) == expected
            assert log_problems == []
            assert (code, summary["status"]) == (0, "ok"), summary
        else:
            assert log_problems, "verify missed offsets out of order"
            assert code == 1, summary
            blamed, at = located(summary["error"])
            next_position = position + int(before.batch_size[i])
            assert blamed.name == path.name and at in (position, next_position), summary["error"]


def clean_cli_copy(log_dir: Path, directory: Path) -> tuple[int, dict]:
    """`clean_cli` on a copy of the log dir, leaving the original as it is for the checks that follow."""
    with tempfile.TemporaryDirectory(dir=log_dir.parent) as tmp:
        copy = Path(tmp) / "logs"
        shutil.copytree(log_dir, copy)
        return clean_cli(copy / directory.name)


# ---- torn tails ---------------------------------------------------------------------------------------------------


@settings(PROPERTY, max_examples=60)
@given(source=st.sampled_from(ACTIVE_DATA_SOURCES), cut=_INDEX)
@pytest.mark.timeout(120)
def test_a_torn_tail_of_the_active_segment_is_left_to_recovery_and_never_fails_clean(corpus, source, cut):
    with fresh_copy(corpus, source) as (_, directory):
        complete = read_everything(directory)
        _, active = segment_logs(directory)[-1]
        torn = active.read_bytes()[: cut % len(active.read_bytes())]
        active.write_bytes(torn)
        seen = read_everything(directory)  # a consumer stops at the torn batch, as Kafka's reader does
        assert seen == complete[: len(seen)]
        code, summary = clean_cli(directory)
        assert (code, summary["status"]) == (0, "ok"), summary
        assert active.read_bytes() == torn


@settings(PROPERTY, max_examples=60)
@given(source=st.sampled_from(CLEANED_SOURCES), target=_INDEX, cut=_INDEX)
@pytest.mark.timeout(120)
def test_an_inactive_segment_cut_short_fails_clean_at_its_last_whole_batch_unless_cut_at_a_boundary(
    corpus, source, target, cut
):
    with fresh_copy(corpus, source) as (log_dir, directory):
        inactive = [path for _, path in segment_logs(directory)[:-1] if path.stat().st_size]
        assume(inactive)
        victim = inactive[target % len(inactive)]
        data = victim.read_bytes()
        cut %= len(data)
        boundaries = [0] + [pos + size for pos, size in batch_spans(data)]
        victim.write_bytes(data[:cut])
        before, problems_before = snapshot(log_dir), problems_by_file(log_dir)
        code, summary = clean_cli(directory)
        event(f"cut at a batch boundary: {cut in boundaries}")
        if cut in boundaries:  # a segment holding fewer batches: nothing tells it from a compacted one
            assert (code, summary["status"]) == (0, "ok"), summary
        else:
            assert code == 1, summary
            assert located(summary["error"]) == (victim, max(b for b in boundaries if b <= cut))
            assert_only_broken_indexes_rebuilt(log_dir, before, snapshot(log_dir), problems_before)


@pytest.mark.timeout(60)
def test_damage_under_a_valid_crc_in_the_clean_section_stops_the_round_before_it_changes_anything(corpus):
    """Rule 2's exception, pinned: the Kafka partition's clean section ends at 700, inside segment 576; a record
    of its second batch (offsets 612-647) is damaged under a recomputed CRC. Headers and CRCs are right, but
    the survey's pass reads segment 576's records to index its dirty part (from 700: `IndexAhead`), so the
    damage is found before anything is swapped and every file stays as it was. (Where the survey indexes
    nothing, e.g. a transaction in the dirty section, the recopy finds it at its group instead: the groups
    before it stay swapped and sound.)"""
    with fresh_copy(corpus, "kafka-2.4-raw") as (log_dir, directory):
        victim = directory / "00000000000000000576.log"
        data = victim.read_bytes()
        damaged = SetRecordByte(1, 0, 0xFF).apply(data, ())  # the first record's length varint of batch 1
        victim.write_bytes(damaged)
        (position, _), = [(exc.position, exc) for exc in _scan_error(damaged)]
        before = snapshot(log_dir)
        code, summary = clean_cli(directory)
        assert code == 1 and located(summary["error"]) == (victim, position), summary
        assert snapshot(log_dir) == before
        assert leftovers(log_dir) == []


def _scan_error(data: bytes) -> list[CorruptRecordError]:
    try:
        scan(data)
    except CorruptRecordError as exc:
        return [exc]
    return []


# ---- declared sizes are not allocations ----------------------------------------------------------------------------

SIZE_MAX_DECLARED = 2**31 - 1


def _v2_batch(region: bytes, *, base_offset: int, count: int = 1, attributes: int = 0) -> bytes:
    """A v2 batch around a hand-made records region, with its CRC right (so the checks after it are reached)."""
    header = fmt.BATCH_V2.pack(base_offset, fmt.BATCH_LENGTH_MIN_V2 + len(region), -1, fmt.MAGIC_V2, 0, attributes,
                               max(count - 1, 0), T0, T0, -1, -1, -1, count)
    out = bytearray(header + region)
    fix_crc(out, 0)
    return bytes(out)


def _record(*, length: int | None = None, key_length: int | None = None, header_count: int = 0) -> bytes:
    """One record (offset delta 0) whose length, key length or header count may be declared as anything."""
    key, value = b"key", b"value"
    body = (bytes(1) + encode_varint(0) + encode_varint(0) + encode_varint(len(key) if key_length is None else key_length)
            + key + encode_varint(len(value)) + value + encode_varint(header_count))
    return encode_varint(len(body) if length is None else length) + body


def _with_field(batch: bytes, field: str, value: int, *, recompute_crc: bool) -> bytes:
    out = bytearray(batch)
    offset, layout = FIELDS[field]
    layout.pack_into(out, offset, value)
    if recompute_crc:
        fix_crc(out, 0)
    return bytes(out)


def _huge_declaration(kind: str, base_offset: int) -> bytes:
    plain = _v2_batch(_record(), base_offset=base_offset)
    if kind == "v2 batch length 2^31-1":
        return _with_field(plain, "length", SIZE_MAX_DECLARED, recompute_crc=False)
    if kind in ("v1 message size 2^31-1", "v0 message size 2^31-1", "unknown magic, length 2^31-1"):
        magic = {"v1": 1, "v0": 0}.get(kind[:2], 7)
        return _with_field(_with_field(plain, "length", SIZE_MAX_DECLARED, recompute_crc=False), "magic", magic,
                           recompute_crc=False)
    if kind == "record count 2^31-1":
        return _with_field(plain, "recordsCount", SIZE_MAX_DECLARED, recompute_crc=True)
    if kind == "gzip records, count 2^31-1":
        region = zlib.compress(_record(), wbits=31)
        return _with_field(_v2_batch(region, base_offset=base_offset, attributes=fmt.COMPRESSION_GZIP),
                           "recordsCount", SIZE_MAX_DECLARED, recompute_crc=True)
    if kind == "record length varint 2^31-1":
        return _v2_batch(_record(length=SIZE_MAX_DECLARED), base_offset=base_offset)
    if kind == "key length varint 2^31-1":
        return _v2_batch(_record(key_length=SIZE_MAX_DECLARED), base_offset=base_offset)
    if kind == "header count varint 2^31-1":
        return _v2_batch(_record(header_count=SIZE_MAX_DECLARED), base_offset=base_offset)
    raise AssertionError(kind)


HUGE_DECLARATIONS = (
    "v2 batch length 2^31-1", "v1 message size 2^31-1", "v0 message size 2^31-1", "unknown magic, length 2^31-1",
    "record count 2^31-1", "gzip records, count 2^31-1", "record length varint 2^31-1", "key length varint 2^31-1",
    "header count varint 2^31-1",
)


def peak_bytes(action) -> tuple[int, object]:
    """Peak traced allocation while `action()` runs, and what it returned or raised."""
    tracemalloc.start()
    try:
        try:
            outcome = action()
        except SegmentError as exc:
            outcome = exc
        return tracemalloc.get_traced_memory()[1], outcome
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize("kind", HUGE_DECLARATIONS)
@pytest.mark.timeout(60)
def test_a_declared_size_of_2_gib_is_not_an_allocation(tmp_path, kind):
    warm_up()
    directory = tmp_path / "logs" / "huge-0"
    directory.mkdir(parents=True)
    good = [_v2_batch(_record(), base_offset=offset) for offset in range(4)]
    segment = directory / fmt.offset_file_name(0, fmt.LOG_SUFFIX)
    segment.write_bytes(b"".join(good[:2]) + _huge_declaration(kind, 2) + good[3])
    (directory / fmt.offset_file_name(100, fmt.LOG_SUFFIX)).write_bytes(b"")
    bad_position = sum(map(len, good[:2]))
    data = segment.read_bytes()

    peak, outcome = peak_bytes(lambda: scan(data))
    assert peak < PEAK_BYTES_MAX, f"scan: {peak} bytes"
    if isinstance(outcome, SegmentError):
        assert bad_position <= outcome.position < len(data)
    else:  # a declared size past the end of the data is a torn tail to the pure scan (Kafka's rule)
        assert outcome.end_position == bad_position and outcome.torn_tail
    peak, outcome = peak_bytes(lambda: read_everything(directory))
    assert peak < PEAK_BYTES_MAX, f"reader: {peak} bytes"
    if isinstance(outcome, SegmentError):
        assert_located(outcome, directory)
    peak, summary = peak_bytes(lambda: verify_paths([directory]))
    assert peak < PEAK_BYTES_MAX, f"verify: {peak} bytes"
    assert [(p.path, p.position >= bad_position) for p in summary.problems] == [(str(segment), True)]
    settings_ = Settings.from_mappings({"cleanup.policy": "compact"})
    peak, outcome = peak_bytes(lambda: clean_partition(directory, settings_, now_ms=NOW_MS))
    assert peak < PEAK_BYTES_MAX, f"clean: {peak} bytes"
    path, position = located(outcome.error)
    assert path == segment and bad_position <= position < len(data)


# ---- the real command -------------------------------------------------------------------------------------------------


def _cli_case(kind: str, directory: Path) -> tuple[Path, int | None]:
    """Damage the Kafka 2.4 partition at `directory` for a subprocess case; (file, position clean must name)."""
    if kind == "torn active tail":
        _, active = segment_logs(directory)[-1]
        active.write_bytes(active.read_bytes()[:-7])
        return active, None
    path = directory / "00000000000000000288.log"
    data = bytearray(path.read_bytes())
    spans = batch_spans(bytes(data))
    if kind == "bad CRC":
        pos, size = spans[3]
        data[pos + size // 2] ^= 0x20
        path.write_bytes(bytes(data))
        return path, pos + fmt.CRC_OFFSET
    if kind == "2 GiB legacy message size":
        pos, _ = spans[2]
        damaged = _with_field(bytes(data[pos:]), "length", SIZE_MAX_DECLARED, recompute_crc=False)
        path.write_bytes(bytes(data[:pos]) + _with_field(damaged, "magic", fmt.MAGIC_V1, recompute_crc=False))
        return path, pos  # it runs past the end of the file: an incomplete batch, in an inactive segment
    if kind == "offsets out of order":
        (previous_base,) = struct.unpack_from(">q", data, spans[3][0])
        set_header_field(path, spans[4][0], "baseOffset", previous_base)
        return path, spans[4][0]
    raise AssertionError(kind)


@pytest.mark.parametrize("kind", ["bad CRC", "2 GiB legacy message size", "offsets out of order", "torn active tail"])
@pytest.mark.timeout(120)
def test_logcleaner_clean_process_exits_1_naming_file_and_position_and_changes_nothing(tmp_path, kind):
    log_dir = tmp_path / "logs"
    directory = _copy_real("kafka-2.4-c2/raw", "c2-0", log_dir, append_active=False)
    path, position = _cli_case(kind, directory)
    before = snapshot(log_dir)
    done = subprocess.run([str(LOGCLEANER), "clean", "--now-ms", str(NOW_MS), str(directory)],
                          check=False, capture_output=True, text=True, timeout=SUBPROCESS_TIMEOUT_S)
    if position is None:
        assert done.returncode == 0, done.stdout + done.stderr
        assert "c2-0: cleaned [0, 1996)" in done.stdout
        return
    assert done.returncode == 1, done.stdout + done.stderr
    assert f"c2-0: FAILED: {path}: byte {position}: " in done.stderr, done.stdout + done.stderr
    assert snapshot(log_dir) == before and leftovers(log_dir) == []
    verified = subprocess.run([str(LOGCLEANER), "verify", str(directory)], check=False, capture_output=True,
                              text=True, timeout=SUBPROCESS_TIMEOUT_S)
    assert verified.returncode == 1 and f"{path}: byte " in verified.stdout, verified.stdout + verified.stderr


# ---- a missing index -----------------------------------------------------------------------------------------------


@pytest.mark.timeout(60)
def test_a_failing_clean_leaves_only_index_files_it_rebuilt_for_sound_segments(corpus):
    """The cleaner rebuilds a missing or broken index when it opens a log, as Kafka's load does (pinned by
    `test_missing_and_corrupt_indexes_are_rebuilt_on_open`). That repair of a derived file is the one change a
    failed clean may leave (the module docstring): here, the indexes of the sound segments before the one it
    blames; never a `.log`, a checkpoint, or an index of the blamed segment."""
    with fresh_copy(corpus, "generated-0") as (log_dir, directory):
        for path in list(directory.iterdir()):
            if path.suffix in (fmt.INDEX_SUFFIX, fmt.TIME_INDEX_SUFFIX):
                path.unlink()
        _, victim = segment_logs(directory)[-2]
        position = batch_spans(victim.read_bytes())[-1][0]
        set_header_field(victim, position, "baseOffset", 0)  # below its predecessors: outside the CRC
        before = snapshot(log_dir)
        code, summary = clean_cli(directory)
        assert code == 1 and located(summary["error"]) == (victim, position), summary
        after = snapshot(log_dir)
        assert {name: digest for name, digest in after.items() if name in before} == before
        new = {log_dir / name for name in after.keys() - before.keys()}
        assert new and {p.suffix for p in new} == {fmt.INDEX_SUFFIX, fmt.TIME_INDEX_SUFFIX}
        assert victim.stem not in {p.stem for p in new}
        problems = {Path(p.path) for p in verify_paths([log_dir]).problems}
        assert problems == {victim}


# ---- the daemon ------------------------------------------------------------------------------------------------------


@pytest.mark.timeout(120)
def test_daemon_marks_a_real_partition_with_offsets_out_of_order_uncleanable_and_cleans_the_other(tmp_path):
    """A Kafka 2.4 partition whose baseOffset (outside the CRC) went backwards beside an intact copy: the daemon
    cleans the copy, marks the damaged one uncleanable with the file and byte position, and changes nothing in it.
    Before the survey checked the order of offsets this reached the offset map as an untyped error."""
    from ..integration.daemon_helpers import (
        DaemonProcess,
        cleaner_checkpoint,
        free_port,
        wait_until,
        write_config,
    )

    log_dir = tmp_path / "logs"
    _copy_real("kafka-2.4-c2/raw", "c2-1", log_dir, append_active=False)
    damaged = _copy_real("kafka-2.4-c2/raw", "c2-0", log_dir, append_active=False)
    victim = damaged / "00000000000000000862.log"
    spans = batch_spans(victim.read_bytes())
    (previous_base,) = struct.unpack_from(">q", victim.read_bytes(), spans[3][0])
    set_header_field(victim, spans[4][0], "baseOffset", previous_base)
    before = snapshot(damaged)
    port = free_port()
    config = write_config(tmp_path / "logcleaner.toml", log_dirs=[log_dir], port=port)
    daemon = DaemonProcess(config, port, tmp_path / "daemon.log").start()
    try:
        wait_until(lambda: cleaner_checkpoint(log_dir, "c2", 1) == 1996, timeout_s=60, what="c2-1 cleaned")
        status = wait_until(lambda: (p := daemon.partition("c2-0"))["uncleanable"] and p, timeout_s=60,
                            what="c2-0 uncleanable")
        assert f"{victim}: byte {spans[4][0]}: batch offsets " in status["uncleanable_reason"], status
        assert daemon.running()
    finally:
        daemon.close()
    assert snapshot(damaged) == before and leftovers(log_dir) == []


# ---- atheris --------------------------------------------------------------------------------------------------------

HARNESS = Path(__file__).with_name("fuzz_segments.py")
ATHERIS_SECONDS = 20


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_atheris_finds_no_crash_in_the_reader_and_the_clean_path(tmp_path):
    pytest.importorskip("atheris")
    done = subprocess.run(
        [sys.executable, str(HARNESS), "-atheris_runs=1000000", f"-max_total_time={ATHERIS_SECONDS}",
         f"-artifact_prefix={tmp_path}/", "-print_final_stats=1", str(tmp_path / "corpus")],
        check=False, capture_output=True, text=True, timeout=ATHERIS_SECONDS + 120, cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr[-6000:]
    assert not list(tmp_path.glob("crash-*")), done.stderr[-6000:]
    runs = re.search(r"stat::number_of_executed_units:\s*(\d+)", done.stderr)
    assert runs and int(runs[1]) > 500, done.stderr[-2000:]  # it fuzzed, rather than failing to start
