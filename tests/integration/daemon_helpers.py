"""Helpers for the daemon integration tests: a `logcleaner run` subprocess, its config, its clock, and logs.

`DaemonProcess` runs the real CLI (`python -m cleaner.cli run -c CONFIG`) on a TOML config written by
`write_config`, with its log going to a file the test can read while it runs. The daemon's clock is a
`FileClock` (the `LOGCLEANER_CLOCK_FILE` hook), written atomically so the daemon never reads a half-written
number (it would fall back to the wall clock). Every wait is a poll with a timeout. Logs are built through
the real writer (`PartitionLog`), without fsync: test data need no durability.
"""

from __future__ import annotations

import bisect
import json
import os
import socket
import subprocess
import sys
import textwrap
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from segments.codec.records import Record, encode_batch
from segments.files.fileio import FileOps
from segments.partition.checkpoint import CLEANER_OFFSET_CHECKPOINT, read_offset_checkpoint, update_offset_checkpoint
from segments.partition.log import LogConfig, PartitionLog

T0 = 1_700_000_000_000  # record timestamps of generated logs start here (ms)
HOUR_MS = 3_600_000
READY_TIMEOUT_S = 30.0
HTTP_TIMEOUT_S = 10.0
EXIT_TIMEOUT_S = 20.0
POLL_INTERVAL_S = 0.05
LEFTOVER_SUFFIXES = (".cleaned", ".swap", ".deleted")
ADMIN_TOKEN = "test-admin-token-0123456789abcdef"  # what write_token_file writes; POSTs carry it by default

# Keyed records appended by a separate process (the "broker"), rolling small segments as it goes. When it
# is done it rolls (so everything it wrote is cleanable) and writes, as JSON, the last value and offset it
# wrote for every key: what a compacted log must still hold.
WRITER_SCRIPT = textwrap.dedent(
    """
    import json, os, sys, time
    from segments.partition.log import LogConfig, PartitionLog
    from segments.codec.records import Record, encode_batch
    directory, batches, keys, pause_s, out = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]), sys.argv[5]
    latest = {}
    config = LogConfig(segment_bytes=4096, index_interval_bytes=512)
    seq = 0
    with PartitionLog.open(directory, mode="writer", create=True, config=config) as log:
        for i in range(batches):
            records = []
            for j in range(5):
                key = b"w%03d" % ((seq * 7) % keys)
                records.append(Record(j, 1_700_000_000_000 + seq, key, b"writer-%06d" % seq + b"." * 60))
                seq += 1
            info = log.append_batches(encode_batch(records, base_offset=0))
            for j, r in enumerate(records):
                latest[r.key.decode()] = [info.first_offset + j, r.value.decode()]
            if i % 20 == 0:
                log.flush()
            time.sleep(pause_s)
        log.roll()
        log.flush()
    with open(out + ".tmp", "w") as f:
        json.dump(latest, f)
    os.replace(out + ".tmp", out)
    print("writer done", seq, flush=True)
    """
)


# ---- processes, ports, config -------------------------------------------------------------------------


def free_port() -> int:
    """A TCP port that was free a moment ago on 127.0.0.1."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def logcleaner_command() -> list[str]:
    """How to run `logcleaner`: the CLI module under the interpreter running the tests."""
    return [sys.executable, "-m", "cleaner.cli"]


def _toml_value(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    raise TypeError(f"cannot write {value!r} as TOML")


def write_config(
    path: Path,
    *,
    log_dirs: Sequence[Path],
    port: int,
    settings: dict | None = None,
    topics: dict[str, dict] | None = None,
    server: dict | None = None,
) -> Path:
    """A daemon TOML config: quick backoff and discovery unless `settings`/`server` say otherwise."""
    flat = {
        "log.dirs": [str(d) for d in log_dirs],
        "cleanup.policy": "compact",
        "log.cleaner.backoff.ms": 100,
    }
    flat.update(settings or {})
    srv = {"listen": f"127.0.0.1:{port}", "discovery_interval_ms": 200}
    srv.update(server or {})
    lines = [f"{json.dumps(k)} = {_toml_value(v)}" for k, v in flat.items()]
    lines.append("")
    lines.append("[server]")
    lines += [f"{k} = {_toml_value(v)}" for k, v in srv.items()]
    for topic, table in (topics or {}).items():
        lines.append("")
        lines.append(f"[topics.{json.dumps(topic)}]")
        lines += [f"{json.dumps(k)} = {_toml_value(v)}" for k, v in table.items()]
    path.write_text("\n".join(lines) + "\n")
    return path


def write_token_file(path: Path, token: str = ADMIN_TOKEN) -> Path:
    """An admin token file, readable by its owner only (`[server] admin_token_file`)."""
    path.write_text(token + "\n")
    path.chmod(0o600)
    return path


class FileClock:
    """The daemon's clock (`LOGCLEANER_CLOCK_FILE`): epoch milliseconds in a file, replaced atomically."""

    def __init__(self, path: Path, now_ms: int) -> None:
        self.path = path
        self.set(now_ms)

    def set(self, now_ms: int) -> None:
        self.now_ms = int(now_ms)
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text(str(self.now_ms))
        os.replace(tmp, self.path)


def wait_until(predicate: Callable[[], object], *, timeout_s: float, what: str, interval_s: float = POLL_INTERVAL_S):
    """Poll `predicate` until it returns something truthy (returned); AssertionError after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    last = None
    while True:
        last = predicate()
        if last:
            return last
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what} (last: {last!r})")
        time.sleep(interval_s)


class DaemonProcess:
    """One `logcleaner run -c CONFIG` subprocess, with its log in `log_path` and its HTTP API on `port`."""

    def __init__(self, config_path: Path, port: int, log_path: Path, *, clock: FileClock | None = None,
                 admin_token: str | None = None, extra_args: Sequence[str] = ()) -> None:
        self.config_path = config_path
        self.extra_args = list(extra_args)  # more `run` options, e.g. --server-properties FILE
        self.port = port
        self.log_path = log_path
        self.clock = clock
        self.admin_token = admin_token  # sent with every POST unless a request says otherwise
        self.proc: subprocess.Popen | None = None
        self._log_file = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, *, wait: bool = True) -> "DaemonProcess":
        env = dict(os.environ)
        env.pop("LOGCLEANER_CLOCK_FILE", None)
        if self.clock is not None:
            env["LOGCLEANER_CLOCK_FILE"] = str(self.clock.path)
        self._log_file = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            [*logcleaner_command(), "run", "-c", str(self.config_path), *self.extra_args],
            stdout=self._log_file, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
        )
        if wait:
            self.wait_ready()
        return self

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def _fail(self, message: str) -> AssertionError:
        return AssertionError(f"{message}\n--- daemon log (tail) ---\n{self.log_text()[-4000:]}")

    def wait_ready(self, timeout_s: float = READY_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise self._fail(f"daemon exited with {self.proc.returncode} before it was ready")
            try:
                code, _ = self.request("GET", "/healthz", timeout_s=1.0)
                if code == 200:
                    return
            except OSError:
                pass
            time.sleep(POLL_INTERVAL_S)
        raise self._fail(f"daemon not healthy within {timeout_s} s")

    def request(self, method: str, path: str, *, timeout_s: float = HTTP_TIMEOUT_S, headers: dict | None = None,
                authorize: bool = True) -> tuple[int, bytes]:
        """(status, body) of one request; a POST carries `admin_token` unless `authorize` is false."""
        all_headers = dict(headers or {})
        if method == "POST" and authorize and self.admin_token is not None:
            all_headers.setdefault("Authorization", f"Bearer {self.admin_token}")
        req = urllib.request.Request(self.url + path, method=method, data=b"" if method == "POST" else None,
                                     headers=all_headers)
        try:
            with urllib.request.urlopen(req, timeout=timeout_s) as response:
                return response.status, response.read()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read()

    def get_json(self, path: str) -> dict:
        code, body = self.request("GET", path)
        assert code == 200, f"GET {path}: {code} {body[:500]!r}"
        return json.loads(body)

    def status(self) -> dict:
        return self.get_json("/status")

    def partition(self, name: str) -> dict:
        for p in self.status()["partitions"]:
            if p["partition"] == name:
                return p
        raise self._fail(f"no partition {name} in /status")

    def partitions(self) -> dict[str, dict]:
        return {p["partition"]: p for p in self.status()["partitions"]}

    def operate(self, name: str, operation: str) -> tuple[int, dict]:
        code, body = self.request("POST", f"/partitions/{name}/{operation}")
        return code, json.loads(body)

    def metrics_text(self) -> str:
        code, body = self.request("GET", "/metrics")
        assert code == 200, f"GET /metrics: {code}"
        return body.decode()

    def metrics(self) -> dict[tuple[str, frozenset], float]:
        """Every sample of /metrics: (sample name, frozenset of label items) → value."""
        out = {}
        for family in text_string_to_metric_families(self.metrics_text()):
            for sample in family.samples:
                out[(sample.name, frozenset(sample.labels.items()))] = sample.value
        return out

    def metric(self, name: str, **labels) -> float:
        return self.metrics()[(name, frozenset(labels.items()))]

    def io_bytes_total(self) -> float:
        """Σ of `logcleaner_io_bytes_total` over both directions."""
        m = self.metrics()
        return sum(m[("logcleaner_io_bytes_total", frozenset({("direction", d)}))] for d in ("read", "write"))

    def send(self, sig: int) -> None:
        self.proc.send_signal(sig)

    def wait_exit(self, timeout_s: float = EXIT_TIMEOUT_S) -> int:
        try:
            return self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            raise self._fail(f"daemon still running {timeout_s} s after it was asked to stop") from None

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def close(self) -> None:
        """Kill the daemon if it still runs (tests that care how it stops stop it themselves); always safe."""
        if self.running():
            self.proc.kill()
            self.proc.wait(EXIT_TIMEOUT_S)
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None


def run_cli(*args: str, timeout_s: float = 60.0, env: dict | None = None) -> subprocess.CompletedProcess:
    """`logcleaner ARGS...` to completion, text output captured."""
    return subprocess.run(
        [*logcleaner_command(), *args], capture_output=True, text=True, timeout=timeout_s, env=env,
    )


def start_writer(directory: Path, out_json: Path, *, batches: int, keys: int, pause_s: float) -> subprocess.Popen:
    """The writer process of `WRITER_SCRIPT` appending to `directory`."""
    return subprocess.Popen(
        [sys.executable, "-c", WRITER_SCRIPT, str(directory), str(batches), str(keys), str(pause_s), str(out_json)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
    )


class _NoSyncFileOps(FileOps):
    """Test data need no durability: skipping fsync makes building a thousand-segment log ten times faster."""

    def fsync_file(self, path) -> None:
        pass

    def fsync_fd(self, fd: int) -> None:
        pass

    def fsync_dir(self, path) -> None:
        pass


NO_SYNC = _NoSyncFileOps()


# ---- logs ---------------------------------------------------------------------------------------------------


def append_keyed(
    directory: Path,
    pairs: Iterable[tuple[bytes, bytes | None]],
    *,
    timestamp_ms: int,
    records_per_batch: int = 10,
    segment_bytes: int = 16 * 1024,
    timestamp_step_ms: int = 0,
    roll: bool = True,
) -> int:
    """Append (key, value) records as the partition's writer (created if needed); returns the log end offset.

    With `roll`, the active segment is rolled at the end so everything appended is cleanable.
    """
    config = LogConfig(segment_bytes=segment_bytes, index_interval_bytes=1024)
    pairs = list(pairs)
    with PartitionLog.open(directory, mode="writer", create=True, config=config, file_ops=NO_SYNC) as log:
        for start in range(0, len(pairs), records_per_batch):
            chunk = pairs[start : start + records_per_batch]
            records = [
                Record(offset=i, timestamp=timestamp_ms + (start + i) * timestamp_step_ms, key=k, value=v)
                for i, (k, v) in enumerate(chunk)
            ]
            log.append_batches(encode_batch(records, base_offset=0))
        if roll:
            log.roll()
        log.flush()
        return log.log_end_offset


def records_of(directory: Path, start: int | None = None) -> list[tuple[int, bytes | None, bytes | None, int]]:
    """(offset, key, value, timestamp) of every record at or after `start` (default: the log start)."""
    with PartitionLog.open(directory, mode="reader") as log:
        return [(r.offset, r.key, r.value, r.timestamp) for _, r in log.iter_records(start)
                if start is None or r.offset >= start]


def latest_by_key(records: Iterable[tuple]) -> dict[bytes, tuple[int, bytes | None]]:
    """key → (offset, value) of the last record of each key."""
    out = {}
    for offset, key, value, *_ in records:
        out[key] = (offset, value)
    return out


def log_end_offset(directory: Path) -> int:
    with PartitionLog.open(directory, mode="reader") as log:
        return log.log_end_offset


def segment_bases(directory: Path) -> list[int]:
    with PartitionLog.open(directory, mode="reader") as log:
        return [s.base_offset for s in log.segments]


def segment_max_timestamps(directory: Path) -> list[tuple[int, int]]:
    """(base offset, largest record timestamp) of every non-empty segment."""
    largest: dict[int, int] = {}
    with PartitionLog.open(directory, mode="reader") as log:
        bases = [s.base_offset for s in log.segments]
        for _, r in log.iter_records():
            base = bases[bisect.bisect_right(bases, r.offset) - 1]
            largest[base] = max(largest.get(base, r.timestamp), r.timestamp)
    return sorted(largest.items())


def log_segment_sizes(directory: Path) -> list[tuple[int, int]]:
    """(base offset, size in bytes) of every `.log` segment, in offset order. A segment that a swap renames
    between the listing and its `stat` (this is polled while a daemon runs) is left out."""
    out = []
    for name in os.listdir(directory):
        if name.endswith(".log") and name[:-4].isdigit():
            try:
                out.append((int(name[:-4]), (directory / name).stat().st_size))
            except FileNotFoundError:
                continue
    return sorted(out)


def dirty_ratio_from(directory: Path, first_dirty: int) -> float:
    """Kafka's cleanable / (clean + cleanable) bytes when the checkpoint is `first_dirty` (a segment base)
    and everything below the active segment is cleanable."""
    sizes = log_segment_sizes(directory)[:-1]  # the active segment is never cleanable
    clean = sum(size for base, size in sizes if base < first_dirty)
    cleanable = sum(size for base, size in sizes if base >= first_dirty)
    return cleanable / (clean + cleanable)


def write_cleaner_checkpoint(log_dir: Path, topic: str, partition: int, offset: int) -> None:
    """Pretend the log below `offset` was cleaned already (the clean section of Kafka's dirty ratio)."""
    update_offset_checkpoint(log_dir / CLEANER_OFFSET_CHECKPOINT, {(topic, partition): offset})


def cleaner_checkpoint(log_dir: Path, topic: str, partition: int) -> int | None:
    return read_offset_checkpoint(log_dir / CLEANER_OFFSET_CHECKPOINT).get((topic, partition))


def leftovers(directory: Path) -> list[str]:
    """Names of `.cleaned`/`.swap`/`.deleted` files in a partition directory."""
    return sorted(n for n in os.listdir(directory) if n.endswith(LEFTOVER_SUFFIXES))


class RepeatedLog:
    """A large log made fast: one template of keyed batches (about a segment's worth) appended over and over.

    Record `j` of the template has key `key(j)` and value `value(j)`; the log gives copy `c` of it offsets
    `c * template_records + j`. So the original record at any offset, and the last record of every key,
    are known without reading the log back.
    """

    def __init__(self, *, keys: int = 2000, value_bytes: int = 100, records_per_batch: int = 20,
                 template_bytes: int = 6000, compression: int = 0) -> None:
        self.keys = keys
        self.value_bytes = value_bytes
        batches, records, size = [], 0, 0
        while size < template_bytes or not batches:
            recs = [Record(i, T0 + records + i, self.key(records + i), self.value(records + i))
                    for i in range(records_per_batch)]
            records += records_per_batch
            batch = encode_batch(recs, base_offset=0, compression=compression)
            batches.append(batch)
            size += len(batch)
        self.template = b"".join(batches)
        self.template_records = records
        self.copies = 0

    def key(self, j: int) -> bytes:
        return b"key-%06d" % (j % self.keys)

    def value(self, j: int) -> bytes:
        return b"%08d" % j + b"v" * self.value_bytes

    def write(self, directory: Path, *, log_bytes: int, segment_bytes: int) -> int:
        """Append copies of the template until about `log_bytes`, then roll; returns the log end offset."""
        self.copies = max(1, log_bytes // len(self.template))
        config = LogConfig(segment_bytes=segment_bytes, index_interval_bytes=4096)
        with PartitionLog.open(directory, mode="writer", create=True, config=config, file_ops=NO_SYNC) as log:
            for _ in range(self.copies):
                log.append_batches(self.template)
            log.roll()
            log.flush()
            return log.log_end_offset

    def original(self, offset: int) -> tuple[bytes, bytes]:
        j = offset % self.template_records
        return self.key(j), self.value(j)

    @property
    def last_copy_start(self) -> int:
        """The first offset of the last copy, which holds the latest record of every key."""
        return (self.copies - 1) * self.template_records

    def latest(self) -> dict[bytes, tuple[int, bytes]]:
        end = self.copies * self.template_records
        out = {}
        for offset in range(max(0, end - self.template_records), end):
            key, value = self.original(offset)
            out[key] = (offset, value)
        return out
