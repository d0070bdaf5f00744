"""Structured dumps of `.log`, `.index`, `.timeindex` and `.txnindex` files, like Kafka's DumpLogSegments.

Owns turning a segment file into a sequence of plain dicts (one per batch, record or index entry) and
into Kafka-style text lines. It reads only; the CLI prints. Records and keys are rendered as UTF-8 text
when they decode, else as hex, so binary keys stay readable and unambiguous.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

from ..codec import format as fmt
from ..codec.batches import decode_any_batch
from ..codec.errors import CorruptIndexError, CorruptRecordError
from ..codec.records import RecordBatch, decode_control_key
from ..files.index import OffsetIndex, TimeIndex
from ..files.names import parse_segment_file_name
from ..files.pathcheck import check_regular_fd, check_regular_file, open_no_follow
from ..files.txnindex import TransactionIndex
from .verify import scan_log_file

__all__ = ["dump_file", "format_entry"]


def _render_bytes(data: bytes | None) -> str | None:
    if data is None:
        return None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return "0x" + data.hex()
    return text if text.isprintable() else "0x" + data.hex()


def _batch_entry(position: int, batch: RecordBatch) -> dict:
    h = batch.header
    entry = {
        "type": "batch",
        "baseOffset": h.base_offset,
        "lastOffset": h.last_offset,
        "count": h.records_count,
        "baseSequence": h.base_sequence,
        "lastSequence": -1 if h.base_sequence < 0 else (h.base_sequence + h.last_offset_delta) % 2**31,
        "producerId": h.producer_id,
        "producerEpoch": h.producer_epoch,
        "partitionLeaderEpoch": h.partition_leader_epoch,
        "isTransactional": h.is_transactional,
        "isControl": h.is_control,
        "deleteHorizonMs": h.delete_horizon_ms,
        "position": position,
        "timestampType": "LogAppendTime" if h.timestamp_type else "CreateTime",
        "maxTimestamp": h.max_timestamp,
        "size": h.size_bytes,
        "magic": h.magic,
        "compresscodec": fmt.COMPRESSION_NAMES.get(h.compression, str(h.compression)),
        "crc": h.crc,
        "isvalid": True,
    }
    return entry


def _record_entries(batch: RecordBatch, print_data: bool) -> Iterator[dict]:
    h = batch.header
    for record in batch.records:
        entry = {
            "type": "record",
            "offset": record.offset,
            "timestamp": record.timestamp,
            "timestampType": "LogAppendTime" if h.timestamp_type else "CreateTime",
            "keySize": -1 if record.key is None else len(record.key),
            "valueSize": -1 if record.value is None else len(record.value),
            "sequence": -1 if h.base_sequence < 0 else (h.base_sequence + record.offset - h.base_offset) % 2**31,
            "headerKeys": [hd.key for hd in record.headers],
        }
        if h.is_control:
            _, control_type = decode_control_key(record.key)
            entry["controlType"] = fmt.CONTROL_TYPE_NAMES.get(control_type, f"UNKNOWN({control_type})")
        if print_data:
            entry["key"] = _render_bytes(record.key)
            entry["payload"] = _render_bytes(record.value)
            entry["headers"] = {hd.key: _render_bytes(hd.value) for hd in record.headers}
        yield entry


def dump_file(
    path: str | os.PathLike, *, deep_iteration: bool = False, print_data: bool = False, index_sanity_check: bool = False
) -> Iterator[dict]:
    """Dicts describing the file's content. `print_data` implies `deep_iteration`.

    Raises `CorruptRecordError`/`CorruptIndexError` (with file and position) at the first bad entry,
    after yielding everything before it; `LinkRefusedError` if `path` is a symbolic link,
    `NotRegularFileError` if it is a FIFO, socket, device or directory (it is not opened: a FIFO would block).
    """
    path = Path(path)
    parsed = parse_segment_file_name(path.name)
    if parsed is None:
        raise ValueError(f"{path}: not a segment file name (<20-digit offset>.log/.index/.timeindex/.txnindex)")
    check_regular_file(path)  # a segment file that is a link is not followed, a FIFO or the like not opened
    if parsed.kind == fmt.LOG_SUFFIX:
        yield from _dump_log(path, parsed.offset, deep_iteration or print_data, print_data)
    elif parsed.kind in (fmt.INDEX_SUFFIX, fmt.TIME_INDEX_SUFFIX):
        yield from _dump_index(path, parsed.offset, parsed.kind, index_sanity_check)
    elif parsed.kind == fmt.TXN_INDEX_SUFFIX:
        index = TransactionIndex(path, parsed.offset, read_only=True)
        try:
            for txn in index.all_aborted():
                yield {
                    "type": "aborted_txn",
                    "producerId": txn.producer_id,
                    "firstOffset": txn.first_offset,
                    "lastOffset": txn.last_offset,
                    "lastStableOffset": txn.last_stable_offset,
                }
        finally:
            index.close()
    else:
        raise ValueError(f"{path}: dumping {parsed.kind} files is not supported")


def _dump_log(path: Path, base: int, deep: bool, print_data: bool) -> Iterator[dict]:
    """The file's batches as `verify` reads them (`segments.tools.verify.scan_log_file`, the one reader of a whole
    `.log`), so both give the same diagnosis of the same bytes; each batch checked there is then decoded for
    printing."""
    fd = open_no_follow(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        check_regular_fd(fd, path)
        yield {"type": "file", "path": str(path), "baseOffset": base, "size": os.fstat(fd).st_size}
        for result in scan_log_file(fd, path):
            for i in range(result.n_batches):
                position = int(result.batch_position[i])
                try:
                    batch = decode_any_batch(result.batch_bytes(i), verify_crc=False)  # the scan checked the CRC
                except CorruptRecordError as exc:
                    raise exc.located(path, position) from None
                yield _batch_entry(position, batch)
                if deep:
                    yield from _record_entries(batch, print_data)
    finally:
        os.close(fd)


def _dump_index(path: Path, base: int, kind: str, sanity: bool) -> Iterator[dict]:
    cls = OffsetIndex if kind == fmt.INDEX_SUFFIX else TimeIndex
    index = cls(path, base, read_only=True)
    try:
        yield {"type": "file", "path": str(path), "baseOffset": base, "entries": index.entries}
        if sanity:
            try:
                index.sanity_check()
            except CorruptIndexError as exc:
                yield {"type": "sanity", "passed": False, "reason": str(exc)}
            else:
                yield {"type": "sanity", "passed": True}
            return
        for i in range(index.entries):
            a, b = index.entry(i)
            if kind == fmt.INDEX_SUFFIX:
                yield {"type": "index_entry", "offset": a, "position": b}
            else:
                yield {"type": "timeindex_entry", "timestamp": a, "offset": b}
    finally:
        index.close()


def format_entry(entry: dict) -> str:
    """One Kafka-style text line for a dump entry."""
    kind = entry["type"]
    if kind == "file":
        return f"Dumping {entry['path']}"
    if kind == "batch":
        fields = [
            f"baseOffset: {entry['baseOffset']}", f"lastOffset: {entry['lastOffset']}", f"count: {entry['count']}",
            f"baseSequence: {entry['baseSequence']}", f"lastSequence: {entry['lastSequence']}",
            f"producerId: {entry['producerId']}", f"producerEpoch: {entry['producerEpoch']}",
            f"partitionLeaderEpoch: {entry['partitionLeaderEpoch']}",
            f"isTransactional: {str(entry['isTransactional']).lower()}", f"isControl: {str(entry['isControl']).lower()}",
            f"deleteHorizonMs: {entry['deleteHorizonMs'] if entry['deleteHorizonMs'] is not None else 'none'}",
            f"position: {entry['position']}", f"{entry['timestampType']}: {entry['maxTimestamp']}",
            f"size: {entry['size']}", f"magic: {entry['magic']}", f"compresscodec: {entry['compresscodec']}",
            f"crc: {entry['crc']}", f"isvalid: {str(entry['isvalid']).lower()}",
        ]
        return " ".join(fields)
    if kind == "record":
        line = (
            f"| offset: {entry['offset']} {entry['timestampType']}: {entry['timestamp']} keySize: {entry['keySize']} "
            f"valueSize: {entry['valueSize']} sequence: {entry['sequence']} headerKeys: [{','.join(entry['headerKeys'])}]"
        )
        if "controlType" in entry:
            line += f" endTxnMarker: {entry['controlType']}"
        if "key" in entry:
            line += f" key: {entry['key']} payload: {entry['payload']}"
        return line
    if kind == "index_entry":
        return f"offset: {entry['offset']} position: {entry['position']}"
    if kind == "timeindex_entry":
        return f"timestamp: {entry['timestamp']} offset: {entry['offset']}"
    if kind == "aborted_txn":
        return (
            f"version: 0 producerId: {entry['producerId']} firstOffset: {entry['firstOffset']} "
            f"lastOffset: {entry['lastOffset']} lastStableOffset: {entry['lastStableOffset']}"
        )
    if kind == "sanity":
        return "passed sanity check." if entry["passed"] else f"failed sanity check: {entry['reason']}"
    raise ValueError(f"unknown dump entry type {kind!r}")
