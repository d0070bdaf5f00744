"""The one home of the real Kafka segment files the tests read: `tests/fixtures/kafka/` in this repository.

Their provenance and counts are in `tests/fixtures/kafka/README.md`. Tests read them in place, or copy a
partition with `copy_kafka_fixture` before opening it in a mode that may write (recovery rebuilds indexes).

One part of a fixture is not stored: the raw Kafka 2.4 partition's active segment (base 1996) had its `.index`
and `.timeindex` preallocated by the broker to 10 MiB of zero bytes. Twenty megabytes of zeros have no place in
the repository, so `copy_kafka_fixture` writes them back (sparse files of the broker's exact lengths) and a
copy is byte for byte the directory the broker left.

This module must not read anything outside the repository.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

KAFKA_FIXTURES = Path(__file__).resolve().parent / "fixtures" / "kafka"

# Files a broker preallocated with zero bytes and left so, by fixture directory: name -> length in bytes.
# 10,485,760 = segment.index.bytes (10 MiB); the time index rounds it down to a multiple of 12 bytes.
PREALLOCATED_ZERO_FILES: dict[str, dict[str, int]] = {
    "kafka-2.4-c2/raw": {
        "00000000000000001996.index": 10_485_760,
        "00000000000000001996.timeindex": 10_485_756,
    },
}


def copy_kafka_fixture(relative: str, destination: Path) -> Path:
    """A writable copy of fixture directory `relative` (e.g. "public/test-0") at `destination`.

    Requires: `destination` does not exist. Ensures: the copy holds every file the broker left, the
    preallocated zero-filled index files included; directories are 0755 and files 0644. Raises
    FileNotFoundError if there is no such fixture, FileExistsError if `destination` exists.
    """
    source = KAFKA_FIXTURES / relative
    if not source.is_dir():
        raise FileNotFoundError(f"no Kafka fixture directory {source}")
    destination = Path(destination)
    shutil.copytree(source, destination)
    for name, length in PREALLOCATED_ZERO_FILES.get(relative, {}).items():
        with open(destination / name, "wb") as file:
            file.truncate(length)
    for root, _dirs, files in os.walk(destination):
        os.chmod(root, 0o755)
        for name in files:
            os.chmod(os.path.join(root, name), 0o644)
    return destination
