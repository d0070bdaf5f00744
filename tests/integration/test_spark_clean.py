"""`clean --spark` on a real Spark standalone cluster, and its Python API in local mode, judged against what a
single-process `logcleaner clean` makes of a copy of the same logs.

The cluster (`spark_cluster.standalone_cluster`): a master and two workers of one core each, started from the
pyspark installation on 127.0.0.1, every process stopped at the end. Its tests:

* 16 partitions of mixed sizes — every codec, transactions committed and aborted, tombstones — cleaned by
  `clean --spark --master spark://...` are byte for byte the single-process clean's, every file of the log dir
  (segments, indexes, checkpoints), the per-partition JSON is the same, and both workers ran tasks;
* a worker SIGKILLed, with its executor and Python workers, while one of its tasks is writing a `.cleaned`
  segment: the job completes on the other worker, every partition holds the records the single-process clean
  leaves, verifies, and no `.cleaned`, `.swap` or `.deleted` file is left (the retry recovered the swap);
* meanwhile, `log.cleaner.dedupe.buffer.size` larger than an executor's Python memory is refused at submit
  time, in one line naming the setting, nothing changed.

Local mode (a session in this process): `clean_partitions` returns the DataFrame of the same results, and
cleans partitions that an earlier clean left half-finished (killed at a fault point before and after its swap
began), as a retried task meets them; an unknown cleanup policy refuses the whole job before anything changes,
and a dry run reports what `clean --dry-run` reports, changing nothing.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from segments.codec import format as fmt
from segments.codec.records import Record, encode_batch, encode_control_batch
from segments.partition.log import LogConfig, PartitionLog
from segments.spark.session import SparkUnavailableError, find_java
from segments.tools.verify import verify_paths

from ..cleaner.builders import file_digests, full_records
from .spark_cluster import standalone_cluster

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
T0 = 1_700_000_000_000
NOW_MS = T0 + 3_600_000
PARTITIONS = 16
CODECS = (fmt.COMPRESSION_NONE, fmt.COMPRESSION_GZIP, fmt.COMPRESSION_SNAPPY, fmt.COMPRESSION_LZ4,
          fmt.COMPRESSION_ZSTD)
SETTINGS = {"cleanup.policy": "compact", "segment.bytes": "1048576", "delete.retention.ms": "0"}
SET_ARGS = [arg for key, value in SETTINGS.items() for arg in ("--set", f"{key}={value}")]
EXECUTOR_CONF = ["--spark-conf", "spark.executor.memory=512m"]  # a worker has 1g; the driver keeps its default
JOB_TIMEOUT_S = 240
LEFTOVER_SUFFIXES = (".cleaned", ".swap", ".deleted")


def _java_or_skip() -> None:
    try:
        find_java()
    except SparkUnavailableError as exc:
        pytest.skip(f"Spark cannot start here: {exc}")


def write_mixed_partition(directory: Path, index: int, records: int) -> None:
    """Partition `index` of the test topic: about `records` records over records/8 keys, 10% tombstones,
    incompressible values in batches of 10-60 records of codec CODECS[index % 5]; every third partition writes
    half its batches in transactions of one producer, a fifth of them aborted; 256 KiB segments."""
    rnd = random.Random(index)
    noise = rnd.randbytes(1 << 16)
    codec = CODECS[index % len(CODECS)]
    transactional = index % 3 == 0
    keys = max(50, records // 8)
    producer_id, sequence = 4000 + index, 0
    with PartitionLog.open(directory, mode="writer", create=True, config=LogConfig(segment_bytes=256 * 1024),
                           clock_ms=lambda: T0) as log:
        offset = 0
        while offset < records:
            n = rnd.randint(10, 60)
            batch = []
            for j in range(n):
                start = rnd.randrange(len(noise) - 120)
                value = None if rnd.random() < 0.1 else noise[start:start + rnd.randint(40, 120)]
                batch.append(Record(offset=j, timestamp=T0 + offset + j, key=b"key-%06d" % rnd.randrange(keys),
                                    value=value))
            if transactional and rnd.random() < 0.5:
                log.append_batches(encode_batch(batch, base_offset=0, compression=codec, is_transactional=True,
                                                producer_id=producer_id, producer_epoch=0, base_sequence=sequence))
                sequence += n
                control = fmt.CONTROL_TYPE_ABORT if rnd.random() < 0.2 else fmt.CONTROL_TYPE_COMMIT
                log.append_batches(encode_control_batch(offset=0, control_type=control, timestamp=T0 + offset + n,
                                                        producer_id=producer_id, producer_epoch=0))
                offset += 1
            else:
                log.append_batches(encode_batch(batch, base_offset=0, compression=codec))
            offset += n
        log.roll()  # everything written is cleanable


def write_mixed_logs(log_dir: Path, partitions: int = PARTITIONS, records_min: int = 2000) -> None:
    """`partitions` partitions of topic `mix`, the n-th of about records_min * 1.3^n records (0.2 to 11 MB)."""
    for i in range(partitions):
        write_mixed_partition(log_dir / f"mix-{i}", i, int(records_min * 1.3 ** i))


def logcleaner(*args: str, env: dict | None = None, timeout_s: float = JOB_TIMEOUT_S) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cleaner.cli", *args], capture_output=True, text=True, cwd=REPO,
                          env=env, timeout=timeout_s)


def json_lines(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


def leftovers(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.name.endswith(LEFTOVER_SUFFIXES))


STABLE_FIELDS = ("partition", "status", "cleanup_policy", "policy_source", "rounds", "first_dirty", "end_offset",
                 "first_uncleanable", "size_before_bytes", "size_after_bytes", "records_read", "records_written",
                 "batches_read", "batches_written", "bytes_read", "bytes_written", "next_delete_horizon_ms")


def stable(summary: dict) -> dict:
    return {name: summary.get(name) for name in STABLE_FIELDS}


@pytest.fixture(scope="module")
def mixed(tmp_path_factory) -> dict:
    """The test topic as written ("original") and as a single-process `logcleaner clean` leaves a copy of it
    ("reference", with its --json lines by partition)."""
    root = tmp_path_factory.mktemp("mixed")
    write_mixed_logs(root / "original")
    shutil.copytree(root / "original", root / "reference")
    done = logcleaner("clean", str(root / "reference"), *SET_ARGS, "--now-ms", str(NOW_MS), "--json")
    assert done.returncode == 0, done.stderr
    lines = {s["partition"]: s for s in json_lines(done.stdout)}
    assert len(lines) == PARTITIONS and all(s["status"] == "ok" for s in lines.values())
    assert any(s["records_written"] < s["records_read"] for s in lines.values())
    return {"original": root / "original", "reference": root / "reference", "summaries": lines}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, request):
    _java_or_skip()
    with standalone_cluster(tmp_path_factory.mktemp("spark-cluster"), workers=2, cores=1, memory="1g",
                            wait=False) as running:
        request.getfixturevalue("mixed")  # the logs are written while the JVMs start
        running.wait_ready()
        yield running


def test_a_cluster_clean_is_byte_for_byte_the_single_process_clean(cluster, mixed, tmp_path):
    logs = tmp_path / "logs"
    shutil.copytree(mixed["original"], logs)
    done = logcleaner("clean", str(logs), "--spark", "--master", cluster.master_url, *EXECUTOR_CONF, *SET_ARGS,
                      "--now-ms", str(NOW_MS), "--json", "--spark-log", str(tmp_path / "spark.log"),
                      env=cluster.client_env())
    assert done.returncode == 0, done.stderr + cluster.log_tail("master")
    assert "Traceback" not in done.stderr
    *partitions, total = json_lines(done.stdout)
    assert [p["partition"] for p in partitions] == sorted(mixed["summaries"])  # the order of clean --json
    assert [stable(p) for p in partitions] == [stable(mixed["summaries"][p["partition"]]) for p in partitions]
    assert [p["directory"] for p in partitions] == [str(logs / p["partition"]) for p in partitions]
    assert total["total"]["partitions"] == PARTITIONS and total["total"]["ok"] == PARTITIONS
    assert total["total"]["master"] == cluster.master_url and 1 <= total["total"]["tasks"] <= PARTITIONS
    assert file_digests(logs) == file_digests(mixed["reference"])
    # both workers ran tasks: each launched an executor for the job, whose Python workers cleaned partitions
    for name in ("worker-0", "worker-1"):
        assert list((cluster.directory / f"{name}-work").glob("app-*/*/stderr")), f"{name} ran no executor"


def _writing_cleaned(cluster, name: str, logs: Path) -> str | None:
    """A `.cleaned` file of a partition whose `.cleaner.lock` a process of worker `name` holds (its task is in the
    recopy or swap of a group), or None."""
    for path in cluster.open_files_of(name):
        if path.startswith(str(logs)) and path.endswith("/.cleaner.lock"):
            partition = Path(path).parent
            cleaned = [n for n in os.listdir(partition) if n.endswith(".cleaned")]
            if cleaned:
                return str(partition / cleaned[0])
    return None


def _submit_too_big_a_map(cluster, logs: Path) -> subprocess.Popen:
    """A `clean --spark` of `logs` whose offset map (1 GiB a task) an executor of 512 MiB cannot hold."""
    return subprocess.Popen(
        [sys.executable, "-m", "cleaner.cli", "clean", str(logs), "--spark", "--master", cluster.master_url,
         *EXECUTOR_CONF, *SET_ARGS, "--set", "log.cleaner.dedupe.buffer.size=1GiB"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO, env=cluster.client_env(),
        start_new_session=True)


def _assert_refused_at_submit(too_big: subprocess.Popen, logs: Path, original: Path) -> None:
    """Refused at submit time, in one line naming the setting to raise, nothing changed."""
    try:
        out, err = too_big.communicate(timeout=JOB_TIMEOUT_S)
    finally:
        if too_big.poll() is None:
            too_big.kill()
            too_big.wait()
    assert too_big.returncode == 2, err
    assert len(err.strip().splitlines()) == 1, err
    assert err.startswith("Error: log.cleaner.dedupe.buffer.size is per task with --spark: a task needs 1264 MiB")
    assert "spark.executor.memoryOverhead" in err and "384 MiB" in err and out == ""
    assert file_digests(logs) == file_digests(original)


def test_a_worker_killed_mid_round_loses_nothing(cluster, mixed, tmp_path):
    """SIGKILL to every process of the worker whose task is writing a `.cleaned` segment; the other finishes.

    While the job goes on, on one worker and throttled (the CPU mostly idle), a second driver submits a clean
    whose offset map an executor cannot hold: it is refused at submit time."""
    assert cluster.alive_workers() == 2
    logs = tmp_path / "logs"
    shutil.copytree(mixed["original"], logs)
    # a budget of 25 MB/s per task keeps each round long enough to be caught writing
    args = [sys.executable, "-m", "cleaner.cli", "clean", str(logs), "--spark", "--master", cluster.master_url,
            *EXECUTOR_CONF, *SET_ARGS, "--set", "log.cleaner.io.max.bytes.per.second=25000000", "--now-ms",
            str(NOW_MS), "--json", "--spark-log", str(tmp_path / "spark.log")]
    driver = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO,
                              env=cluster.client_env(), start_new_session=True)
    too_big = None
    try:
        victim, writing = None, None
        deadline = time.monotonic() + JOB_TIMEOUT_S
        while victim is None and driver.poll() is None and time.monotonic() < deadline:
            for name in ("worker-0", "worker-1"):
                if (writing := _writing_cleaned(cluster, name, logs)) is not None:
                    victim = name
                    cluster.kill(name)
                    break
            else:
                time.sleep(0.005)
        if victim is None:
            out, err = driver.communicate(timeout=JOB_TIMEOUT_S)
            pytest.fail(f"no worker was caught writing a .cleaned segment before the job ended: {err[-2000:]}")
        refused = tmp_path / "refused"
        shutil.copytree(mixed["original"], refused)
        too_big = _submit_too_big_a_map(cluster, refused)
        out, err = driver.communicate(timeout=JOB_TIMEOUT_S)
        _assert_refused_at_submit(too_big, refused, mixed["original"])
    finally:
        for process in (driver, too_big):
            if process is not None and process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
    assert victim not in [n for n, p in cluster.processes.items() if p.poll() is None]
    assert driver.returncode == 0, err
    *partitions, total = json_lines(out)
    assert [p["status"] for p in partitions] == ["ok"] * PARTITIONS, err
    assert total["total"]["ok"] == PARTITIONS
    assert leftovers(logs) == [], f"the killed task was writing {writing}"
    report = verify_paths([logs])
    assert not report.problems, report.problems[:3]
    for i in range(PARTITIONS):
        name = f"mix-{i}"
        assert full_records(logs / name) == full_records(mixed["reference"] / name), name


# ---- local mode: the Python API ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def spark():
    _java_or_skip()
    from segments.spark import get_session, stop_session

    session = get_session("local[2]", app_name="logcleaner-spark-clean-tests")
    yield session
    stop_session(session)


def _crash_cleans(faults: dict[Path, str]) -> None:
    """Single-process cleans of the partition directories given, each killed (SIGKILL) at its fault point."""
    runs = [subprocess.Popen([sys.executable, "-m", "cleaner.cli", "clean", str(directory), *SET_ARGS, "--now-ms",
                              str(NOW_MS)], env={**os.environ, "LOGCLEANER_FAULT": fault}, cwd=REPO,
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
            for directory, fault in faults.items()]
    for run, fault in zip(runs, faults.values()):
        _, err = run.communicate(timeout=JOB_TIMEOUT_S)
        assert run.returncode == -signal.SIGKILL, (fault, run.returncode, err)


def test_the_python_api_cleans_half_finished_swaps_and_returns_the_clean_json(spark, mixed, tmp_path):
    from cleaner.spark_clean import RESULT_FIELDS, clean_partitions

    logs = tmp_path / "logs"
    names = [f"mix-{i}" for i in range(PARTITIONS - 4, PARTITIONS)]  # the largest four: 5-11 groups each
    for name in names:
        shutil.copytree(mixed["original"] / name, logs / name)
    # killed after a group's `.cleaned` segment was complete (recovery abandons it), and after the swap's first
    # old segment was renamed `.deleted` (recovery rolls forward): what a task retried after its executor died meets
    _crash_cleans({logs / names[1]: "recopy.group_written@2", logs / names[2]: "swap.renamed_to_deleted@1"})
    assert leftovers(logs / names[1]) and leftovers(logs / names[2])

    df = clean_partitions(spark, [logs], settings=SETTINGS, now_ms=NOW_MS)
    assert df.columns == [name for name, _ in RESULT_FIELDS]
    rows = [{k: v for k, v in row.asDict().items() if v is not None} for row in df.collect()]
    assert [r["partition"] for r in rows] == names
    assert [r["status"] for r in rows] == ["ok"] * 4
    for i in (0, 3):  # untouched before: the same round, the same figures, the same bytes as clean --json's
        assert stable(rows[i]) == stable(mixed["summaries"][names[i]])
        assert rows[i]["directory"] == str(logs / names[i])
        assert file_digests(logs / names[i]) == file_digests(mixed["reference"] / names[i])
    assert leftovers(logs) == []
    assert not verify_paths([logs]).problems
    for name in names:
        assert full_records(logs / name) == full_records(mixed["reference"] / name), name
    assert df.count() == 4 and leftovers(logs) == []  # the DataFrame holds results: using it cleans nothing again


def test_an_unknown_policy_refuses_the_whole_job_and_a_dry_run_changes_nothing(spark, mixed, tmp_path):
    from cleaner.oneshot import CleanRefusedError
    from cleaner.spark_clean import SparkCleanUsageError, clean_partitions

    logs = tmp_path / "logs"
    for name in ("mix-0", "mix-1"):
        shutil.copytree(mixed["original"] / name, logs / name)
    before = file_digests(logs)
    with pytest.raises(CleanRefusedError, match=r"the cleanup policy of 1 topic\(s\) is unknown") as refused:
        clean_partitions(spark, [logs], now_ms=NOW_MS)
    assert refused.value.exit_code == 2 and "mix (2 partition(s))" in refused.value.details[0]
    with pytest.raises(SparkCleanUsageError, match="log.cleaner.threads"):
        clean_partitions(spark, [logs], settings={**SETTINGS, "log.cleaner.threads": 2})
    assert file_digests(logs) == before
    # a dry run reads as clean --dry-run reads: one round's figures, nothing written
    rows = clean_partitions(spark, [logs], settings=SETTINGS, now_ms=NOW_MS, dry_run=True).collect()
    done = logcleaner("clean", str(logs), *SET_ARGS, "--now-ms", str(NOW_MS), "--json", "--dry-run")
    assert [stable(r.asDict()) for r in rows] == [stable(s) for s in json_lines(done.stdout)]
    assert all(r.dry_run and r.rounds == 1 for r in rows)
    assert file_digests(logs) == before


def test_the_python_api_takes_a_str_or_a_path_as_one_path(spark, mixed, tmp_path, monkeypatch):
    """A `str` is one path, not its characters: with a log dir `l` in the working directory, the characters of
    "logs" would name it (and its partition would be cleaned)."""
    from cleaner.spark_clean import clean_partitions

    shutil.copytree(mixed["original"] / "mix-0", tmp_path / "logs" / "mix-0")
    shutil.copytree(mixed["original"] / "mix-1", tmp_path / "l" / "mix-1")
    monkeypatch.chdir(tmp_path)
    before = file_digests(tmp_path / "l")
    for given in ("logs", Path("logs")):
        rows = clean_partitions(spark, given, settings=SETTINGS, now_ms=NOW_MS, dry_run=True).collect()
        assert [(r.partition, r.directory, r.status) for r in rows] == [("mix-0", "logs/mix-0", "ok")]
    assert file_digests(tmp_path / "l") == before


# ---- clean --spark interrupted, or its job failed: one line, and no leftovers when it returns -----------------


def _marked_processes(mark: str) -> list[int]:
    """The processes whose environment holds `mark` (the driver's children inherit it: the JVM, Python workers)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/environ", "rb") as f:
                    if mark.encode() in f.read():
                        found.append(int(entry))
            except OSError:
                pass  # gone, or not ours
    return found


def _assert_no_process_left(mark: str) -> None:
    deadline = time.monotonic() + 20
    while (left := _marked_processes(mark)) and time.monotonic() < deadline:
        time.sleep(0.2)
    for pid in left:  # not to leave them to the other tests
        os.kill(pid, signal.SIGKILL)
    assert left == [], "processes of the driver outlived it"


def _start_throttled_clean(original: Path, logs: Path, mark: str) -> subprocess.Popen:
    for name in ("mix-14", "mix-15"):  # 7 and 9 MB: at 5 MB/s a task is caught writing
        shutil.copytree(original / name, logs / name)
    return subprocess.Popen(
        [sys.executable, "-m", "cleaner.cli", "clean", str(logs), "--spark", "--master", "local[2]", *SET_ARGS,
         "--set", "log.cleaner.io.max.bytes.per.second=5000000", "--now-ms", str(NOW_MS)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO, start_new_session=True,
        env={**os.environ, "LOGCLEANER_TEST_MARK": mark})


def _wait_for_cleaned(driver: subprocess.Popen, logs: Path) -> None:
    deadline = time.monotonic() + JOB_TIMEOUT_S
    while not list(logs.glob("*/*.cleaned")):
        assert driver.poll() is None and time.monotonic() < deadline, driver.communicate()[1][-2000:]
        time.sleep(0.01)


@pytest.fixture
def original(mixed) -> Path:
    return mixed["original"]


@pytest.fixture
def mark(request) -> Iterator[str]:
    """The environment mark of a test's driver; whatever carries it is killed at the end, the test failed or not."""
    mark = f"{request.node.name}-{os.getpid()}-{time.monotonic_ns()}"
    yield mark
    for pid in _marked_processes(mark):
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)


@pytest.mark.parametrize(("signum", "to_group", "returncode", "says"), [
    (signal.SIGINT, True, 1, "Aborted!"),  # Ctrl-C in a terminal: the whole foreground group
    (signal.SIGTERM, False, -signal.SIGTERM, ""),  # as clean ends on SIGTERM: by the signal, nothing said
])
def test_an_interrupted_clean_says_one_line_and_leaves_no_leftovers(original, mark, tmp_path, signum, to_group,
                                                                    returncode, says):
    logs = tmp_path / "logs"
    driver = _start_throttled_clean(original, logs, mark)
    try:
        _wait_for_cleaned(driver, logs)
        if to_group:
            os.killpg(driver.pid, signum)
        else:
            os.kill(driver.pid, signum)
        out, err = driver.communicate(timeout=JOB_TIMEOUT_S)
    finally:
        if driver.poll() is None:
            os.killpg(driver.pid, signal.SIGKILL)
            driver.wait()
    assert driver.returncode == returncode, err
    assert err.strip() == says, err
    assert leftovers(logs) == []
    assert not verify_paths([logs]).problems
    _assert_no_process_left(mark)


def test_a_clean_interrupted_at_spark_start_up_leaves_no_jvm(original, mark, tmp_path):
    logs = tmp_path / "logs"
    driver = _start_throttled_clean(original, logs, mark)
    time.sleep(3)  # the JVM is starting
    os.kill(driver.pid, signal.SIGINT)
    out, err = driver.communicate(timeout=JOB_TIMEOUT_S)
    assert driver.returncode == 1 and err.strip() == "Aborted!", err
    _assert_no_process_left(mark)


def test_a_failed_job_is_one_line_saying_what_to_do_and_leaves_no_leftovers(original, mark, tmp_path):
    """The task's Python workers SIGKILLed (local mode: no retry): the job fails, the driver recovers."""
    logs = tmp_path / "logs"
    driver = _start_throttled_clean(original, logs, mark)
    try:
        _wait_for_cleaned(driver, logs)
        for pid in _marked_processes(mark):
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if b"pyspark.worker" in f.read():
                    os.kill(pid, signal.SIGKILL)
        out, err = driver.communicate(timeout=JOB_TIMEOUT_S)
    finally:
        if driver.poll() is None:
            os.killpg(driver.pid, signal.SIGKILL)
            driver.wait()
    assert driver.returncode == 1, err
    assert len(err.strip().splitlines()) == 1, err
    assert err.startswith("Error: the Spark job failed: ") and "faulthandler" not in err, err
    assert err.strip().endswith("run the clean again to finish"), err
    assert leftovers(logs) == []
    _assert_no_process_left(mark)
