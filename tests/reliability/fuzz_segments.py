"""atheris harness: coverage-guided fuzzing of the segment reader and the clean path.

Each input is the bytes of one segment file. It is scanned as a buffer, then written as the inactive segment
of a partition (an empty active segment after it) and there read by a `PartitionLog` reader, verified, and
cleaned with `cleaner.oneshot.clean_partition`. Any outcome but these raises, and atheris reports the input as a
crash (libFuzzer writes it to a `crash-*` file):

* every reader returns or raises a `SegmentError`; a file reader's error names the segment and a byte position
  inside it (the pure scan's position lies inside its buffer);
* clean succeeds, or fails with "<segment>: byte <position>: <reason>" and leaves every file that existed as it
  was, with no `.cleaned`/`.swap`/`.deleted`/`.tmp` file; the only files it may add are the segment's index
  files, which the cleaner rebuilds when it opens a log whose index is missing (see `test_corrupt_input.py`).

Run it from the repository root:

    .venv/bin/python tests/reliability/fuzz_segments.py -atheris_runs=10000 [-max_total_time=S] [CORPUS_DIR ...]

Give a `crash-*` file instead of a directory to re-run that one input. Without a corpus directory a temporary one is seeded with real Kafka segments from `tests/fixtures/kafka` and
batches of every codec, a transaction with its marker, and legacy v0/v1 messages and wrappers; an empty corpus
directory given on the command line is seeded the same way. Only this project's Python code is instrumented for
coverage; the numba kernels are compiled code and are left out (instrumented bytecode cannot be compiled).
"""

from __future__ import annotations

import logging
import re
import shutil
import sys
import tempfile
from pathlib import Path

import atheris

REPOSITORY = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPOSITORY))

_NUMBA_MODULES = [
    "segments.codec._scan_kernels", "segments.codec._header_kernels", "segments.codec._crc_kernels",
    "segments.spark._arrow_kernels", "segments.spark.partitioner", "cleaner._kernels",
]
with atheris.instrument_imports(include=["segments", "cleaner"], exclude=_NUMBA_MODULES):
    from cleaner.oneshot import clean_partition
    from cleaner.settings import Settings
    from segments.codec import format as fmt
    from segments.codec.errors import CorruptIndexError, CorruptRecordError, SegmentError
    from segments.codec.scan import scan, warm_up
    from segments.partition.log import PartitionLog
    from segments.tools.verify import verify_paths
from tests.kafka_fixtures import KAFKA_FIXTURES  # noqa: E402
from tests.reliability.logfiles import leftovers, snapshot  # noqa: E402

ACTIVE_BASE = 1_000_000  # above every offset of the seeds, so their offsets stay inside the fuzzed segment's range
NOW_MS = 1_800_000_000_000
SETTINGS = Settings.from_mappings({"cleanup.policy": "compact"})
SEED_FIXTURE_SEGMENTS = (
    "public/first-0/00000000000000000000.log",
    "public/test-0/00000000000000000000.log",
    "public/__consumer_offsets-36/00000000000000000000.log",
    "kafka-2.4-c2/raw/00000000000000000288.log",
    "kafka-2.4-c2/raw/00000000000000001996.log",
    "kafka-2.4-c2/kafka-cleaned/00000000000000001713.log",
)
_LOCATED = re.compile(r"^(?P<path>/.+?): byte (?P<position>\d+): \S")


class Violation(AssertionError):
    """An outcome the corrupt-input contract does not allow; atheris reports the input that caused it."""


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise Violation(message)


def _located(exc: SegmentError, segment: Path, size: int) -> None:
    _require(isinstance(exc, (CorruptRecordError, CorruptIndexError)), f"untyped: {type(exc).__name__}: {exc}")
    _require(Path(exc.path).parent == segment.parent and 0 <= exc.position <= max(size, Path(exc.path).stat().st_size),
             f"not located in the partition: {exc}")


def check_scan(data: bytes) -> None:
    for headers_only in (False, True):
        try:
            scan(data, headers_only=headers_only)
        except CorruptRecordError as exc:
            _require(exc.path is None and 0 <= exc.position <= len(data), f"scan: {exc}")


def check_reader(directory: Path, segment: Path, size: int) -> None:
    try:
        with PartitionLog.open(directory, mode="reader") as log:
            for _ in log.iter_batches():
                pass
            start, end = log.log_start_offset, log.log_end_offset
            for offset in sorted({start, (start + end) // 2, end}):
                log.read(offset)
    except SegmentError as exc:
        _located(exc, segment, size)


def check_verify(log_dir: Path, directory: Path) -> None:
    for problem in verify_paths([log_dir]).problems:
        _require(Path(problem.path).parent in (directory, log_dir) and problem.position >= 0, f"verify: {problem}")


def check_clean(log_dir: Path, directory: Path, segment: Path, size: int) -> None:
    before = snapshot(log_dir)
    outcome = clean_partition(directory, SETTINGS, now_ms=NOW_MS)
    if outcome.ok:
        return
    match = _LOCATED.match(outcome.error)
    _require(match is not None, f"clean failed without a file and a position: {outcome.error}")
    _require(Path(match["path"]) == segment and int(match["position"]) <= size, f"clean blamed: {outcome.error}")
    after = snapshot(log_dir)
    _require({name: after.get(name) for name in before} == before, f"a failed clean changed files: {outcome.error}")
    added = {Path(name).suffix for name in after.keys() - before.keys()}
    _require(added <= {fmt.INDEX_SUFFIX, fmt.TIME_INDEX_SUFFIX}, f"a failed clean added files: {sorted(added)}")
    _require(not leftovers(log_dir), f"leftovers: {leftovers(log_dir)}")


def check_input(data: bytes, root: Path) -> None:
    check_scan(data)
    log_dir = root / "logs"
    shutil.rmtree(log_dir, ignore_errors=True)
    directory = log_dir / "fuzz-0"
    directory.mkdir(parents=True)
    segment = directory / fmt.offset_file_name(0, fmt.LOG_SUFFIX)
    segment.write_bytes(data)
    (directory / fmt.offset_file_name(ACTIVE_BASE, fmt.LOG_SUFFIX)).write_bytes(b"")
    check_reader(directory, segment, len(data))
    check_verify(log_dir, directory)
    check_clean(log_dir, directory, segment, len(data))


def seed_corpus(directory: Path) -> None:
    """Real Kafka segments, and batches of every codec, a transaction and legacy messages, one file each."""
    from segments.codec.legacy import encode_legacy_message, encode_legacy_wrapper
    from segments.codec.records import Record, encode_batch, encode_control_batch

    directory.mkdir(parents=True, exist_ok=True)
    for name in SEED_FIXTURE_SEGMENTS:
        shutil.copyfile(KAFKA_FIXTURES / name, directory / name.replace("/", "_"))
    records = [Record(offset=i, timestamp=1_700_000_000_000 + i, key=b"k%d" % (i % 2), value=b"v%d" % i)
               for i in range(3)]
    for codec, name in fmt.COMPRESSION_NAMES.items():
        (directory / f"v2-{name}.log").write_bytes(encode_batch(records, base_offset=0, compression=codec))
    txn = encode_batch(records, base_offset=0, is_transactional=True, producer_id=5, producer_epoch=0, base_sequence=0)
    marker = encode_control_batch(offset=3, control_type=fmt.CONTROL_TYPE_ABORT, timestamp=1_700_000_000_010,
                                  producer_id=5, producer_epoch=0)
    (directory / "v2-transaction.log").write_bytes(txn + marker)
    for magic in (fmt.MAGIC_V0, fmt.MAGIC_V1):
        timestamp = 1_700_000_000_000 if magic else fmt.NO_TIMESTAMP
        message = encode_legacy_message(0, b"k", b"v", magic=magic, timestamp=timestamp)
        wrapper = encode_legacy_wrapper([Record(r.offset + 1, r.timestamp, r.key, r.value) for r in records],
                                        magic=magic, codec=fmt.COMPRESSION_GZIP)
        (directory / f"v{magic}-messages.log").write_bytes(message + wrapper)


def main(argv: list[str]) -> None:
    logging.disable(logging.CRITICAL)  # clean_partition logs every failure it reports; the fuzzer needs none
    warm_up()
    inputs = [Path(arg) for arg in argv[1:] if not arg.startswith("-")]
    if not inputs:
        inputs = [Path(tempfile.mkdtemp(prefix="fuzz-segments-corpus-"))]
        argv = [*argv, str(inputs[0])]
    for directory in inputs:  # a file given is an input to re-run (e.g. a crash-* file), not a corpus
        if not directory.is_file() and (not directory.exists() or not any(directory.iterdir())):
            seed_corpus(directory)
    root = Path(tempfile.mkdtemp(prefix="fuzz-segments-"))
    try:
        atheris.Setup(argv, lambda data: check_input(data, root))
        atheris.Fuzz()
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main(sys.argv)
