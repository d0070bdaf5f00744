"""Cleaning partitions as Spark tasks: `logcleaner clean --spark` and the Python API, `clean_partitions`.

Owns the Spark side of a clean and nothing of cleaning itself. A task runs `cleaner.oneshot.clean_partition`,
the one-shot clean (retention, rounds until the dirty section is done, the delete-horizon passes), through the
partition's own locks and the swap protocol, on each partition it is given, and returns that partition's
`PartitionOutcome.summary()` as JSON: the object `clean --json` prints. The driver:

* plans as `clean` plans (`cleaner.oneshot.plan_clean`: the policies of issue 12, and its refusals), and sizes
  each partition's dirty section from a listing, `lstat`s and its log dir's cleaner checkpoint, reading no
  segment (`cleaner.oneshot.dirty_section_sizes`);
* gives each task its partitions (`plan_tasks`): a large one alone, small ones packed together, the largest
  first, so that the tasks scheduled last are the short ones; a task carries only their paths and policies, the
  log dirs' settings (with their clusters' topic configs) go to each executor once, as a broadcast;
* checks, at submit time, that an executor can give each running task the memory it needs
  (`check_executor_memory`): a task is one cleaner thread, with an offset map of the whole
  `log.cleaner.dedupe.buffer.size` (`log.cleaner.threads` is refused with --spark), plus `TASK_BASE_BYTES` for
  the interpreter, the compiled kernels and the read windows;
* refuses speculative execution (`check_spark_conf`): a copy of a task would clean the same partitions as the
  original, waiting on the partition's cleaner lock the original holds; when the wait outlasts
  `PartitionLog`'s lock timeout the copy reports a failure, and if it ends first Spark keeps that and kills the
  original mid-round. Nothing is lost either way, but the report would be wrong and the work wasted;
* collects the summaries (one small JSON string a partition) and reports them in the plan's order.

Re-execution is safe by construction: a task holds no state of its own. A task killed anywhere (its executor
lost, its Python worker killed, a retry) leaves each segment group of its partition old or new, as a crash of
`logcleaner clean` would (the swap protocol, docs/format.md section 4); the next attempt opens the partition
as every cleaner does, under `.cleaner.lock`, which the kernel released when the killed process died,
recovers the leftovers (`segments.partition.recovery`) and cleans from the checkpoint on. A retried task reports
what its own attempt did.

pyspark is imported inside the functions that need it (Spark's exceptions, turned into `SparkCleanJobError`), so
that the CLI can import this module on its Spark path and still say in one line when pyspark is missing
(`segments.spark.get_session`); the daemon and `clean` without --spark never import this module.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import math
import os
import re
import socket
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from segments.spark.session import kill_child_jvms, quiet_py4j

from . import launch
from .errors import CleanerError
from .oneshot import (
    CleanRefusedError,
    PartitionOutcome,
    PlannedPartition,
    clean_partition,
    dirty_section_sizes,
    largest_first,
    plan_clean,
    refused_summary,
)
from .policy import TopicPolicy
from .settings import CleanerSettings

__all__ = [
    "RECOVERY_WAIT_S", "RESULT_FIELDS", "TASK_BASE_BYTES", "SparkCleanJobError", "SparkCleanResult", "SparkCleanUsageError",
    "check_executor_memory",
    "after_failure", "check_executor_memory_before_start", "check_spark_conf", "clean_partitions", "clean_planned_on_spark", "kill_child_jvms", "plan_tasks",
    "quiet_py4j", "recover_planned", "result_row", "session_conf",
]

MIB = 1024 * 1024
# What a task's Python worker holds beside its offset map: the interpreter with numpy and the compiled kernels
# (~145 MiB) and a round's read windows (two 16 MiB windows with their record arrays, one output window: a whole
# `clean` peaks 17-40 MiB higher than with the 8 MiB windows this was first sized for); docs/performance.md,
# "Peak RSS".
TASK_BASE_BYTES = 240 * MIB
TASK_SHARE_BYTES_MAX = 32 * MIB  # a dirty section this large or larger is always a task of its own
PARTITION_COST_BYTES = 1 * MIB  # a partition packed into a task counts at least this (opening it, its survey)
PACKED_PARTITIONS_MAX = 64  # small partitions in one task, at most
TASKS_PER_SLOT = 4  # small partitions are packed into tasks of about 1/4 of a task slot's share of the whole

# The columns of `clean_partitions`' DataFrame: the fields of `PartitionOutcome.summary()` (`clean --json`), in
# docs/cli.md's order, with their Spark types.
RESULT_FIELDS: tuple[tuple[str, str], ...] = (
    ("partition", "string"), ("directory", "string"), ("status", "string"), ("error", "string"),
    ("reason", "string"), ("cleanup_policy", "string"), ("policy_source", "string"), ("rounds", "int"),
    ("segments_deleted", "bigint"), ("bytes_deleted", "bigint"), ("log_start_offset", "bigint"),
    ("retention_reasons", "array<string>"), ("retention_dry_run", "boolean"), ("first_dirty", "bigint"),
    ("end_offset", "bigint"), ("first_uncleanable", "bigint"), ("dry_run", "boolean"),
    ("size_before_bytes", "bigint"), ("size_after_bytes", "bigint"), ("map_utilization", "double"),
    ("records_indexed", "bigint"), ("bytes_read", "bigint"), ("bytes_written", "bigint"), ("records_read", "bigint"),
    ("records_written", "bigint"), ("batches_read", "bigint"), ("batches_written", "bigint"),
    ("invalid_records", "bigint"), ("survey_bytes_read", "bigint"), ("survey_s", "double"), ("index_s", "double"),
    ("recopy_s", "double"), ("elapsed_s", "double"), ("next_delete_horizon_ms", "bigint"),
)


class SparkCleanUsageError(CleanerError, ValueError):
    """A clean the Spark settings or the executors cannot run as asked: speculation on, a setting only threads
    use, or executors without the memory a task needs. Nothing was changed."""


class SparkCleanJobError(CleanerError, RuntimeError):
    """The Spark job failed (a task failed every attempt, the driver lost its cluster), in one line ending with what
    to do; or it ended without a partition's result. The driver has recovered the planned partitions
    (`recover_planned`): each is as it was or cleaned, but for one the message names (recovered at its next open)."""


@dataclass(frozen=True, slots=True)
class SparkCleanResult:
    """What a clean in Spark did: each partition's summary in the plan's order, the tasks, the job's wall time."""

    summaries: list[dict]
    tasks: int
    elapsed_s: float


def plan_tasks(sizes: Sequence[int], slots: int) -> list[list[int]]:
    """The partitions each task cleans (indexes of `sizes`, each partition's dirty-section bytes), the largest
    first. `share` is what each of the `slots` task slots would get of the whole, divided by `TASKS_PER_SLOT`,
    at most `TASK_SHARE_BYTES_MAX`: a partition of at least `share` bytes is a task of its own; smaller ones
    are packed together in that order, each counted at least `PARTITION_COST_BYTES`, up to `share` and
    `PACKED_PARTITIONS_MAX` a task. So every slot has work, a task costs a few MB of cleaning more than its
    scheduling, and the tasks scheduled last are small."""
    costs = [max(size, PARTITION_COST_BYTES) for size in sizes]
    share = max(PARTITION_COST_BYTES, min(TASK_SHARE_BYTES_MAX, sum(costs) // (TASKS_PER_SLOT * max(1, slots))))
    tasks: list[list[int]] = []
    packing: list[int] = []
    packed = 0
    for i in largest_first(list(sizes)):
        if costs[i] >= share:
            tasks.append([i])
            continue
        if packing and (packed + costs[i] > share or len(packing) >= PACKED_PARTITIONS_MAX):
            tasks.append(packing)
            packing, packed = [], 0
        packing.append(i)
        packed += costs[i]
    if packing:
        tasks.append(packing)
    return sorted(tasks, key=lambda task: -sum(costs[i] for i in task))


# Spark's size strings ("512m", "1g", "2048"): a number and a binary unit; a bare number is in MiB for the
# memory settings read here.
_SPARK_SIZE = re.compile(r"^\s*(\d+)\s*(b|k|kb|m|mb|g|gb|t|tb|p|pb)?\s*$", re.IGNORECASE)
_SPARK_UNITS = {"b": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40, "p": 1 << 50}
_LOCAL_MASTER = re.compile(r"^local(?:\[\s*(\d+|\*)\s*(?:,\s*\d+\s*)?\])?$")


def _spark_size_bytes(name: str, text: str) -> int:
    match = _SPARK_SIZE.match(text)
    if match is None:
        raise SparkCleanUsageError(f"{name}={text}: not a Spark size (a number with b, k, m, g, t or p)")
    unit = (match.group(2) or "m").lower()[0]
    return int(match.group(1)) * _SPARK_UNITS[unit]


def _mib(n_bytes: int) -> str:
    return f"{math.ceil(n_bytes / MIB)} MiB"


def _machine_memory_bytes() -> int | None:
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):  # no such sysconf name here
        return None


def check_executor_memory(conf: Mapping[str, str], master: str, map_bytes: int,
                          machine_memory_bytes: int | None = None) -> None:
    """Raise `SparkCleanUsageError`, one line naming the settings, when an executor cannot give each of its
    running tasks `map_bytes` (the offset map) + `TASK_BASE_BYTES`.

    The tasks an executor runs at once are `spark.executor.cores` / `spark.task.cpus` (unset cores: one, the
    default on YARN and Kubernetes; a standalone worker gives an executor all its cores unless
    `spark.executor.cores` says otherwise, which the driver cannot see at submit time). Their Python workers
    live outside the JVM heap, in `spark.executor.pyspark.memory` when set, else in
    `spark.executor.memoryOverhead` (default: `spark.executor.memoryOverheadFactor` 0.10 of
    `spark.executor.memory`, at least `spark.executor.minMemoryOverhead`, 384 MiB), which is what YARN and
    Kubernetes size an executor's container by. In local mode the executor is this machine: its `local[N]`
    tasks share `machine_memory_bytes` (default: this machine's physical memory)."""
    need = map_bytes + TASK_BASE_BYTES
    task_cpus = int(conf.get("spark.task.cpus", "1") or 1)
    what = (f"log.cleaner.dedupe.buffer.size is per task with --spark: a task needs {_mib(need)} (its offset map "
            f"of {_mib(map_bytes)} and {_mib(TASK_BASE_BYTES)} for Python, the kernels and its read windows)")
    local = _LOCAL_MASTER.match(master.strip())
    if local is not None:
        threads = local.group(1) or "1"
        tasks = max(1, ((os.cpu_count() or 1) if threads == "*" else int(threads)) // task_cpus)
        machine = machine_memory_bytes if machine_memory_bytes is not None else _machine_memory_bytes()
        if machine and tasks * need > machine:
            raise SparkCleanUsageError(f"{what}, {tasks} at once in {master} need {_mib(tasks * need)}, more than this "
                                       f"machine's {_mib(machine)}; give fewer threads or a smaller "
                                       "log.cleaner.dedupe.buffer.size")
        return
    cores = conf.get("spark.executor.cores")
    tasks = max(1, int(cores) // task_cpus) if cores else 1
    if conf.get("spark.executor.pyspark.memory"):
        setting = "spark.executor.pyspark.memory"
        python = _spark_size_bytes(setting, conf[setting])
        source = setting
    else:
        setting = "spark.executor.memoryOverhead"
        if conf.get(setting):
            python = _spark_size_bytes(setting, conf[setting])
            source = setting
        else:
            heap = _spark_size_bytes("spark.executor.memory", conf.get("spark.executor.memory", "1g"))
            factor = float(conf.get("spark.executor.memoryOverheadFactor", "0.1"))
            least = _spark_size_bytes("spark.executor.minMemoryOverhead",
                                      conf.get("spark.executor.minMemoryOverhead", "384m"))
            python = max(least, int(heap * factor))
            source = f"{setting}, by default {factor:g} of spark.executor.memory, at least {_mib(least)}"
    if tasks * need > python:
        at_once = f"{tasks} tasks at once ({tasks * need // MIB} MiB)" if tasks > 1 else "one task at once"
        raise SparkCleanUsageError(
            f"{what}; an executor runs {at_once} but has {_mib(python)} for Python ({source}); give it more "
            f"(--spark-conf {setting}={math.ceil(tasks * need / MIB)}m) or a smaller log.cleaner.dedupe.buffer.size")


def check_spark_conf(conf: Mapping[str, str]) -> None:
    """Raise `SparkCleanUsageError` for a Spark setting a clean cannot run under: `spark.speculation` on (see the
    module docstring)."""
    if str(conf.get("spark.speculation", "false")).strip().lower() == "true":
        raise SparkCleanUsageError(
            "spark.speculation=true: clean --spark refuses speculative tasks (a copy of a task would clean the "
            "same partitions, waiting on the cleaner lock the original holds, and could end first with a failure "
            "that Spark keeps); leave spark.speculation false")


def _spark_defaults_files() -> list[Path]:
    """The `spark-defaults.conf` files a session started here would read (which may set the executors' memory)."""
    dirs = [os.environ.get("SPARK_CONF_DIR"), os.path.join(os.environ["SPARK_HOME"], "conf")
            if os.environ.get("SPARK_HOME") else None]
    try:
        import pyspark

        dirs.append(os.path.join(os.path.dirname(pyspark.__file__), "conf"))
    except ImportError:
        pass  # get_session says so in one line
    return [Path(d) / "spark-defaults.conf" for d in dirs if d and (Path(d) / "spark-defaults.conf").is_file()]


def check_executor_memory_before_start(user_conf: Mapping[str, str], master: str, cleaner: CleanerSettings) -> None:
    """`check_executor_memory` before Spark starts, when the settings and `user_conf` (--spark-conf) alone decide
    it: no `spark-defaults.conf` could change the session's settings. A refusal then costs no JVM; the check made
    on the session's own settings (`clean_planned_on_spark`) still runs."""
    if not _spark_defaults_files():
        check_executor_memory(session_conf(user_conf), master, launch.thread_map_bytes(_task_cleaner(cleaner)))


def session_conf(user_conf: Mapping[str, str]) -> dict[str, str]:
    """The Spark settings `clean --spark` starts its session with: speculation off, then the user's."""
    return {"spark.speculation": "false", **user_conf}


def _task_cleaner(cleaner: CleanerSettings) -> CleanerSettings:
    """A task's broker-level settings: one cleaner thread, so its offset map is the whole dedupe buffer."""
    return dataclasses.replace(cleaner, threads=1)


@dataclass(frozen=True, slots=True)
class _TaskItem:
    """One partition of a task: its index in the plan, its absolute path, its log dir as the plan names it (the key
    of its settings in the broadcast: a log dir's settings hold its cluster's topic configs, sent once to each
    executor rather than with every task), its policy."""

    index: int
    directory: str
    log_dir: str
    policy: TopicPolicy


def _clean_task(items: list[_TaskItem], *, settings, cleaner: CleanerSettings, now_ms: int, forced_from: int | None,
                forced_to: int | None, dry_run: bool, once: bool) -> Iterator[tuple[int, str]]:
    """What a task runs, in its executor's Python worker: each partition cleaned in turn by `clean_partition`
    with its log dir's settings (`settings`: a Spark broadcast of them by log dir), one offset map and one
    read budget (`log.cleaner.io.max.bytes.per.second`) for the task; yields (plan index, the summary as JSON)."""
    from segments.files.fileio import BackgroundRemover

    from .throttle import DeviceThrottles

    task_cleaner = _task_cleaner(cleaner)
    throttles = DeviceThrottles(task_cleaner.io_max_bytes_per_second)
    remover = BackgroundRemover()  # the swaps' `.deleted` files, removed while the task goes on; drained at its end
    offset_map = None
    try:
        for item in items:
            directory = Path(item.directory)
            if not directory.is_dir():
                outcome = PartitionOutcome(item.directory, policy=item.policy, error=(
                    f"{item.directory}: no such directory on executor host {socket.gethostname()}: clean --spark "
                    "needs the log dirs on a filesystem every executor sees at the same path"))
            else:
                if offset_map is None and item.policy.policy is not None and "compact" in item.policy.policy:
                    offset_map = launch.thread_offset_map(task_cleaner)
                outcome = clean_partition(
                    directory, settings.value[item.log_dir], now_ms=now_ms, policy=item.policy, offset_map=offset_map,
                    forced_from=forced_from, forced_to=forced_to, dry_run=dry_run, once=once,
                    throttle=throttles.for_path(directory.parent), remover=remover,
                )
            yield item.index, json.dumps(outcome.summary())
    finally:
        remover.drain()


RECOVERY_WAIT_S = 30.0  # how long the driver waits for a still-running task to release a partition's cleaner lock
_LEFTOVER_SUFFIXES = (".cleaned", ".swap")
# Spark's hint after a crashed Python worker, which is not for the operator of a clean
_SPARK_HINT = re.compile(r"\s*Consider setting '?spark\.[\w.]*faulthandler.*$", re.DOTALL)


def _without_spark_hints(line: str) -> str:
    return _SPARK_HINT.sub("", line).rstrip().rstrip(".")


def _has_leftovers(directory: Path) -> bool:
    return any(name.endswith(_LEFTOVER_SUFFIXES) for name in os.listdir(directory))


def recover_planned(plan: Sequence[PlannedPartition], *, wait_s: float = RECOVERY_WAIT_S) -> list[str]:
    """After a job that failed or was interrupted, on the driver (the log dirs are on a filesystem it shares with
    the executors): each planned partition that a task may have left half-cleaned is opened as a cleaner opens
    it, under its `.cleaner.lock`, which recovers its leftovers (`segments.partition.recovery`: a `.cleaned`
    segment abandoned, a swap rolled forward). A partition whose lock a still-running task holds is waited for,
    `wait_s` in all, never touched meanwhile. Returns a line for each partition not recovered (still locked, or
    its open failed), none when every one is as it was or cleaned."""
    from segments.partition.locks import CLEANER_LOCK, PartitionLock
    from segments.partition.log import PartitionLog

    deadline = time.monotonic() + wait_s
    left = []
    for planned in plan:
        directory = planned.directory
        if planned.policy is not None and not planned.policy.known:
            continue  # never given to a task
        try:
            if not _has_leftovers(directory):
                probe = PartitionLock(directory, CLEANER_LOCK, shared=True, create=False)
                try:
                    probe.acquire(timeout_s=max(0.0, deadline - time.monotonic()))  # a running task: wait for it
                except FileNotFoundError:
                    continue  # never opened by a cleaner
                probe.release()
                if not _has_leftovers(directory):
                    continue
            topic = directory.name.rsplit("-", 1)[0]
            PartitionLog.open(directory, mode="cleaner", config=planned.view.settings.topic(topic).log_config(),
                              lock_timeout_s=max(0.0, deadline - time.monotonic())).close()
        except Exception as exc:  # noqa: BLE001 - reported, the others still recovered
            from segments.partition.locks import LockTimeoutError

            why = "a task still holds its cleaner lock" if isinstance(exc, LockTimeoutError) else str(exc)
            left.append(f"{directory}: {why}")
    return left


def after_failure(left: Sequence[str]) -> str:
    """What to do after a job that did not finish, its partitions recovered (`recover_planned`'s `left`)."""
    if not left:
        return "each partition is as it was or cleaned: run the clean again to finish"
    return (f"{len(left)} partition(s) not recovered ({left[0]}{', ...' if len(left) > 1 else ''}): they are "
            "recovered at their next open; run the clean again to finish")


def _conf_of(spark) -> dict[str, str]:
    return dict(spark.sparkContext.getConf().getAll())


def clean_planned_on_spark(spark, plan: list[PlannedPartition], cleaner: CleanerSettings, *, now_ms: int,
                           forced_from: int | None = None, forced_to: int | None = None, dry_run: bool = False,
                           once: bool = False, recover_on_interrupt: bool = True) -> SparkCleanResult:
    """Clean every planned partition (`cleaner.oneshot.plan_clean`) in Spark tasks of the session `spark`, as
    `cleaner.oneshot.clean_planned` does on threads; `cleaner` is the broker-level settings. Checks the session's
    settings (`check_spark_conf`) and the executors' memory (`check_executor_memory`) first, raising
    `SparkCleanUsageError`; a failed job raises `SparkCleanJobError` once the driver has recovered the planned
    partitions (`recover_planned`: no `.cleaned` or `.swap` file left of a killed task). Interrupted (Ctrl-C, an
    exception raised by a signal handler) while the job runs, it cancels the job, recovers the partitions too
    (unless `recover_on_interrupt` is false: the caller stops Spark and recovers them itself), and re-raises.
    Each summary's `directory` is the path as
    planned; the tasks get it made absolute (an executor's working directory is not the driver's)."""
    sc = spark.sparkContext
    conf = _conf_of(spark)
    check_spark_conf(conf)
    check_executor_memory(conf, sc.master, launch.thread_map_bytes(_task_cleaner(cleaner)))
    if not plan:
        return SparkCleanResult([], 0, 0.0)
    started = time.perf_counter()
    groups = plan_tasks(dirty_section_sizes(plan), sc.defaultParallelism)
    settings = sc.broadcast({planned.view.log_dir: planned.view.settings for planned in plan})
    payload = [[_TaskItem(i, str(plan[i].directory.absolute()), plan[i].view.log_dir, plan[i].policy)
                for i in group] for group in groups]
    task = functools.partial(_clean_task, settings=settings, cleaner=cleaner, now_ms=now_ms, forced_from=forced_from,
                             forced_to=forced_to, dry_run=dry_run, once=once)
    from py4j.protocol import Py4JError
    from pyspark.errors import PySparkException

    from segments.spark.session import describe_spark_error

    sc.setJobDescription(f"logcleaner clean: {len(plan)} partition(s) in {len(groups)} task(s)")
    job: dict[str, Any] = {}

    def run_job() -> None:  # on a thread: the main thread waits where a signal can interrupt it, never in py4j's I/O
        try:
            job["results"] = dict(sc.parallelize(payload, len(payload)).flatMap(task).collect())
        except BaseException as exc:  # noqa: BLE001 - handed to the main thread
            job["error"] = exc

    runner = threading.Thread(target=run_job, name="logcleaner-spark-job", daemon=True)
    try:
        runner.start()
        while runner.is_alive():
            runner.join(0.1)
    except BaseException as interrupted:  # Ctrl-C, or the CLI's SIGTERM: the job cancelled, its partitions recovered
        quiet_py4j()
        with contextlib.suppress(Exception):
            sc.cancelAllJobs()
        if recover_on_interrupt and not dry_run:
            if left := recover_planned(plan):
                interrupted.add_note(f"not recovered: {'; '.join(left)}")
        raise
    finally:
        with contextlib.suppress(Exception):  # a session stopped under us
            sc.setJobDescription(None)
            settings.destroy()
    error = job.get("error")
    if isinstance(error, (PySparkException, Py4JError)):
        left = [] if dry_run else recover_planned(plan)
        raise SparkCleanJobError(f"the Spark job failed: {_without_spark_hints(describe_spark_error(error)[0])}; "
                                 + after_failure(left)) from error
    if error is not None:
        raise error
    results = job["results"]
    summaries = []
    for i, planned in enumerate(plan):
        if i not in results:
            raise SparkCleanJobError(f"{planned.directory}: the Spark job ended without this partition's result")
        summary = json.loads(results[i])
        summary["directory"] = str(planned.directory)
        summaries.append(summary)
    return SparkCleanResult(summaries, len(groups), time.perf_counter() - started)


def result_row(summary: Mapping[str, Any]) -> tuple:
    """`summary` as a row of `RESULT_FIELDS` (a field it lacks is null; an int where Spark wants a double, a float)."""
    return tuple(None if summary.get(name) is None else float(summary[name]) if kind == "double" else summary[name]
                 for name, kind in RESULT_FIELDS)


def clean_partitions(spark, paths: str | os.PathLike | Sequence[str | os.PathLike], *, settings: Mapping[str, object] | None = None,
                     config: str | os.PathLike | None = None, server_properties: str | os.PathLike | None = None,
                     now_ms: int | None = None, dry_run: bool = False, once: bool = False):
    """Clean the partitions under `paths` (partition directories, or log dirs of them, on a filesystem every
    executor sees at the same path; a single `str` or `os.PathLike` is one path) in Spark tasks of `spark`, as `logcleaner clean --spark` does, and return a
    DataFrame of one row per partition, in the order of their names: the fields of `clean --json`
    (`RESULT_FIELDS`; a field a partition's outcome lacks is null).

    `settings` are Kafka-named settings as `--set` gives them, over the TOML `config` file and the broker's
    `server_properties`; each topic's policy comes from where `clean`'s comes from. `now_ms` is the clock
    (default: now). The job runs before this returns and the DataFrame holds its results: using it runs
    nothing again. Raises `cleaner.config_file.ConfigFileError` (a setting or file), `SparkCleanUsageError` (a
    setting `clean` refuses, speculation, the executors' memory) and `cleaner.oneshot.CleanRefusedError` (what
    `clean` refuses: a path that is missing or not a directory, an unknown policy, a running broker, a partition
    in two log dirs), all before any partition is touched; a path refused as a partition (a symbolic link) is a row with status `failed`."""
    from segments.files.pathcheck import find_partition_dirs

    from .config_file import load_config
    from .setting_use import refusal_for_clean, refusal_for_spark_clean

    if isinstance(paths, (str, bytes, os.PathLike)):  # one path, not a sequence of its characters
        paths = [paths]
    paths = list(paths)
    for path in paths:  # as the command line refuses them (exit 2)
        if not os.path.exists(path):
            raise CleanRefusedError(f"{os.fspath(path)!s}: no such directory", exit_code=2)
        if not os.path.isdir(path):
            raise CleanRefusedError(f"{os.fspath(path)!s}: not a directory (a partition directory or a log dir of "
                                    "them)", exit_code=2)
    overrides = {key: str(value) for key, value in (settings or {}).items()}
    for key in overrides:
        if (refusal := refusal_for_clean(key) or refusal_for_spark_clean(key)) is not None:
            raise SparkCleanUsageError(refusal)
    loaded = load_config(config, server_properties=server_properties, overrides=overrides)
    partitions, refused = find_partition_dirs(paths)
    plan = plan_clean(partitions, loaded.settings, named=frozenset(Path(p) for p in paths))
    clock = now_ms if now_ms is not None else int(time.time() * 1000)
    result = clean_planned_on_spark(spark, plan, loaded.settings.cleaner, now_ms=clock, dry_run=dry_run, once=once)
    rows = [refused_summary(item) for item in refused if item.failed] + result.summaries
    schema = ", ".join(f"{name} {kind}" for name, kind in RESULT_FIELDS)
    return spark.createDataFrame([result_row(summary) for summary in rows], schema)
