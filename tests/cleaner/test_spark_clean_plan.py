"""The driver's side of `clean --spark` that needs no Spark: how partitions become tasks, the executor-memory and
speculation checks made at submit time, the columns of the Python API's DataFrame against every field of
`clean --json`, and the command line's refusals before Spark starts (`cleaner/spark_clean.py`, `cleaner/cli.py`).
The jobs themselves run in `tests/integration/test_spark_clean.py`."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cleaner.oneshot import PartitionOutcome, total_summary
from cleaner.policy import TopicPolicy
from cleaner.retention import RetentionResult
from cleaner.round import RoundResult
from cleaner.spark_clean import (
    MIB,
    PACKED_PARTITIONS_MAX,
    PARTITION_COST_BYTES,
    RESULT_FIELDS,
    TASK_BASE_BYTES,
    TASK_SHARE_BYTES_MAX,
    TASKS_PER_SLOT,
    SparkCleanUsageError,
    check_executor_memory,
    check_spark_conf,
    plan_tasks,
    result_row,
    session_conf,
)
from segments.tools.generate import WorkloadSpec, generate_partition

# ---- tasks ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("slots", [1, 2, 8, 100])
@pytest.mark.parametrize("sizes", [
    [],
    [0],
    [5 * MIB] * 16,
    [int(MIB * 1.3 ** i) for i in range(16)],
    [0] * 500,
    [900 * MIB, 3, 0, 70 * MIB, 2 * MIB, 40 * MIB, 1, 1],
])
def test_every_partition_is_in_exactly_one_task_the_largest_first(sizes, slots):
    tasks = plan_tasks(sizes, slots)
    assert sorted(i for task in tasks for i in task) == list(range(len(sizes)))
    costs = [sum(max(sizes[i], PARTITION_COST_BYTES) for i in task) for task in tasks]
    assert costs == sorted(costs, reverse=True)
    for task in tasks:
        assert len(task) <= PACKED_PARTITIONS_MAX
        if len(task) > 1:  # only small partitions share a task, never above the share
            assert all(sizes[i] < TASK_SHARE_BYTES_MAX for i in task)
            assert sum(max(sizes[i], PARTITION_COST_BYTES) for i in task) <= TASK_SHARE_BYTES_MAX


def test_a_large_partition_is_a_task_of_its_own_and_small_ones_are_packed():
    sizes = [900 * MIB, 64 * MIB] + [100 * 1024] * 200
    tasks = plan_tasks(sizes, slots=2)
    assert tasks[:2] == [[0], [1]]
    assert len(tasks) < 20  # the 200 small ones are packed (each counted 1 MiB, up to 32 MiB a task)
    assert all(len(task) > 1 for task in tasks[2:])


def test_even_partitions_give_every_slot_several_tasks():
    assert len(plan_tasks([8 * MIB] * 16, slots=2)) == TASKS_PER_SLOT * 2  # two a task
    assert len(plan_tasks([2 * MIB] * 16, slots=2)) == TASKS_PER_SLOT * 2
    assert len(plan_tasks([2 * MIB] * 16, slots=8)) == 16  # more slots than pairs: each alone
    assert len(plan_tasks([TASK_SHARE_BYTES_MAX] * 16, slots=1)) == 16  # never packed, whatever the share


# ---- memory ---------------------------------------------------------------------------------------------------

MAP_128_MIB = 128 * MIB


def test_a_default_executor_holds_a_default_dedupe_buffer():
    check_executor_memory({}, "spark://m:7077", MAP_128_MIB)  # 128 + 240 MiB in the default 384 MiB overhead
    check_executor_memory({"spark.executor.memory": "8g"}, "yarn", 512 * MIB)  # 10%: 819 MiB overhead


@pytest.mark.parametrize(("conf", "map_bytes", "says"), [
    ({}, 1024 * MIB, "has 384 MiB for Python (spark.executor.memoryOverhead, by default 0.1 of spark.executor."
                     "memory, at least 384 MiB); give it more (--spark-conf spark.executor.memoryOverhead=1264m)"),
    ({"spark.executor.cores": "4"}, MAP_128_MIB, "runs 4 tasks at once (1472 MiB) but has 384 MiB"),
    ({"spark.executor.cores": "4", "spark.task.cpus": "2"}, MAP_128_MIB, "runs 2 tasks at once (736 MiB)"),
    ({"spark.executor.memoryOverhead": "300"}, MAP_128_MIB, "has 300 MiB for Python (spark.executor.memoryOverhead)"),
    ({"spark.executor.pyspark.memory": "256m", "spark.executor.memoryOverhead": "8g"}, MAP_128_MIB,
     "has 256 MiB for Python (spark.executor.pyspark.memory); give it more (--spark-conf "
     "spark.executor.pyspark.memory=368m)"),
])
def test_an_executor_without_the_memory_of_its_tasks_is_refused_in_one_line(conf, map_bytes, says):
    with pytest.raises(SparkCleanUsageError) as refused:
        check_executor_memory(conf, "spark://m:7077", map_bytes)
    message = str(refused.value)
    assert message.startswith(f"log.cleaner.dedupe.buffer.size is per task with --spark: a task needs "
                              f"{(map_bytes + TASK_BASE_BYTES) // MIB} MiB")
    assert says in message and "\n" not in message


def test_enough_memory_of_the_setting_that_holds_python_passes():
    check_executor_memory({"spark.executor.cores": "4", "spark.executor.memoryOverhead": "2g"}, "k8s://x", MAP_128_MIB)
    check_executor_memory({"spark.executor.pyspark.memory": "1g"}, "yarn", 512 * MIB)


def test_local_mode_checks_this_machines_memory_for_its_threads():
    check_executor_memory({}, "local[4]", MAP_128_MIB, machine_memory_bytes=4 * 1024 * MIB)
    with pytest.raises(SparkCleanUsageError, match=r"4 at once in local\[4\] need 1472 MiB, more than this "
                                                   r"machine's 1024 MiB"):
        check_executor_memory({}, "local[4]", MAP_128_MIB, machine_memory_bytes=1024 * MIB)
    with pytest.raises(SparkCleanUsageError, match=r"2 at once in local\[2, 3\]"):
        check_executor_memory({}, "local[2, 3]", MAP_128_MIB, machine_memory_bytes=400 * MIB)
    check_executor_memory({}, "local", MAP_128_MIB, machine_memory_bytes=400 * MIB)  # one thread


def test_a_spark_size_that_is_not_one_is_named():
    with pytest.raises(SparkCleanUsageError, match="spark.executor.memory=lots: not a Spark size"):
        check_executor_memory({"spark.executor.memory": "lots"}, "spark://m:7077", MAP_128_MIB)


def test_speculation_is_refused_and_off_by_default():
    check_spark_conf({})
    check_spark_conf(session_conf({}))
    assert session_conf({})["spark.speculation"] == "false"
    with pytest.raises(SparkCleanUsageError, match="spark.speculation=true: clean --spark refuses speculative"):
        check_spark_conf(session_conf({"spark.speculation": "True"}))


# ---- the DataFrame's columns are clean --json's fields --------------------------------------------------------


def _filled(cls, **values):
    """An instance of dataclass `cls` with every field set (ints 7, floats 0.5, bools True, str "x")."""
    sample = {int: 7, float: 0.5, bool: True, str: "x"}
    kinds = {"int": int, "float": float, "bool": bool, "str": str}
    return cls(**{f.name: values.get(f.name, sample[kinds[f.type if isinstance(f.type, str) else f.type.__name__]])
                  for f in dataclasses.fields(cls)})


def test_the_result_columns_are_exactly_the_fields_a_summary_can_have():
    policy = TopicPolicy("t", ("compact", "delete"), "--set")
    full = PartitionOutcome("/logs/t-0", rounds=[_filled(RoundResult), _filled(RoundResult)],
                            retention=[RetentionResult(2, 100, 9, "retention.ms")], error="boom", policy=policy)
    skipped = PartitionOutcome("/logs/t-1", skipped="policy unknown: nothing decides it")
    keys = set(full.summary()) | set(skipped.summary())
    assert keys == {name for name, _ in RESULT_FIELDS}
    python = {"string": str, "int": int, "bigint": int, "double": float, "boolean": bool, "array<string>": list}
    for summary in (full.summary(), skipped.summary()):
        for value, (name, kind) in zip(result_row(summary), RESULT_FIELDS):
            assert value is None or type(value) is python[kind], (name, value)


def test_the_total_counts_statuses_and_sums_the_figures():
    a = {"status": "ok", "rounds": 2, "records_read": 10, "records_written": 4, "size_before_bytes": 100,
         "size_after_bytes": 40}
    b = {"status": "failed", "rounds": 0}
    c = {"status": "skipped"}
    total = total_summary([a, b, c])
    assert total["partitions"] == 3 and (total["ok"], total["failed"], total["skipped"]) == (1, 1, 1)
    assert (total["rounds"], total["records_read"], total["records_written"]) == (2, 10, 4)
    assert (total["size_before_bytes"], total["size_after_bytes"], total["bytes_deleted"]) == (100, 40, 0)


# ---- the command line refuses before Spark starts ---------------------------------------------------------------


@pytest.fixture
def logs(tmp_path) -> Path:
    generate_partition(tmp_path / "logs" / "t-0", WorkloadSpec(records=300, keys=30, seed=1))
    return tmp_path / "logs"


@pytest.mark.parametrize(("args", "says"), [
    (["--master", "local[2]"], "Error: --master is for clean --spark; give --spark too, or leave it out"),
    (["--spark-conf", "spark.executor.memory=1g"], "Error: --spark-conf is for clean --spark"),
    (["--spark", "--set", "log.cleaner.threads=2"], "Error: --set log.cleaner.threads: clean --spark cleans one "
                                                    "partition at a time in each Spark task"),
    (["--spark", "--spark-conf", "spark.speculation=true"], "Error: spark.speculation=true: clean --spark refuses"),
    (["--spark", "--spark-conf", "oops"], "Error: Invalid value for --spark-conf: expected KEY=VALUE, got 'oops'"),
])
def test_clean_refuses_spark_options_in_one_line_before_spark_starts(logs, args, says):
    done = subprocess.run([sys.executable, "-m", "cleaner.cli", "clean", str(logs), "--set", "cleanup.policy=compact",
                           *args], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines() == [done.stderr.strip()] and done.stderr.startswith(says), done.stderr
    assert done.stdout == ""


# ---- only the Spark path imports pyspark ----------------------------------------------------------------------

ROOT = Path(__file__).resolve().parents[2]


def _imported_modules(path: Path) -> set[str]:
    import ast

    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            found.add(("cleaner." + base if node.level == 1 else base) if base else "cleaner")
            found.update(f"cleaner.{alias.name}" for alias in node.names if node.level == 1 and not base)
    return found


def test_only_the_cli_and_spark_clean_import_pyspark_and_only_the_cli_imports_spark_clean():
    """The daemon and the one-shot clean never import pyspark (nor `segments.spark`): only `cleaner/spark_clean.py`
    and, inside its Spark commands, `cleaner/cli.py` do, wherever the import is written (tests/test_layers.py
    counts imports the same way); and only the CLI imports `cleaner.spark_clean`."""
    spark_users, spark_clean_users = set(), set()
    for path in sorted((ROOT / "cleaner").glob("*.py")):
        modules = _imported_modules(path)
        if any(m.split(".")[0] in ("pyspark", "py4j") or m.startswith("segments.spark") for m in modules):
            spark_users.add(path.name)
        if "cleaner.spark_clean" in modules:
            spark_clean_users.add(path.name)
    assert spark_users == {"cli.py", "spark_clean.py"}
    assert spark_clean_users == {"cli.py"}


def test_a_clean_with_work_and_the_daemons_modules_never_load_pyspark(tmp_path, logs):
    probe = ("import json, sys; from cleaner.cli import main\n"
             "import cleaner.daemon, cleaner.pool, cleaner.manager, cleaner.oneshot\n"
             "try:\n    main(sys.argv[1:], standalone_mode=False)\nexcept SystemExit as exc:\n    code = exc.code\n"
             "else:\n    code = 0\n"
             "print(json.dumps({'code': code, 'modules': sorted(sys.modules)}))")
    done = subprocess.run([sys.executable, "-c", probe, "clean", str(logs), "--set", "cleanup.policy=compact"],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)
    found = __import__("json").loads(done.stdout.strip().splitlines()[-1])
    assert found["code"] == 0, done.stderr
    assert "cleaner._kernels" in found["modules"]  # a round ran
    assert not [m for m in found["modules"] if m.split(".")[0] in ("pyspark", "py4j") or m.startswith(
        ("segments.spark", "cleaner.spark_clean"))]


# ---- a job that did not finish: the driver recovers the partitions -------------------------------------------

LEFTOVER_SUFFIXES = (".cleaned", ".swap")


def _leftovers(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.name.endswith(LEFTOVER_SUFFIXES))


def test_the_driver_recovers_what_a_killed_task_left_but_never_under_a_running_tasks_lock(tmp_path):
    from cleaner.config_file import load_config
    from cleaner.oneshot import plan_clean
    from cleaner.spark_clean import after_failure, recover_planned

    directory = tmp_path / "logs" / "t-0"
    generate_partition(directory, WorkloadSpec(records=3000, keys=30, seed=1, segment_bytes=16 * 1024))
    crashed = subprocess.run([sys.executable, "-m", "cleaner.cli", "clean", str(directory), "--set",
                              "cleanup.policy=compact"], env={**os.environ,
                                                              "LOGCLEANER_FAULT": "recopy.group_written@1"},
                             capture_output=True, text=True, timeout=120)
    assert crashed.returncode < 0, crashed.stderr
    assert _leftovers(directory)
    plan = plan_clean([directory], load_config(None, overrides={"cleanup.policy": "compact"}).settings,
                      named=frozenset([directory]))
    # a task still running holds the partition's cleaner lock: waited for, then reported, nothing touched
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time\nfrom segments.partition.locks import "
                               "PartitionLock, CLEANER_LOCK\nPartitionLock(sys.argv[1], CLEANER_LOCK).acquire()\n"
                               "print('held', flush=True)\ntime.sleep(60)", str(directory)],
                              stdout=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        assert holder.stdout.readline().strip() == "held"
        before = _leftovers(directory)
        left = recover_planned(plan, wait_s=0.3)
        assert left == [f"{directory}: a task still holds its cleaner lock"]
        assert _leftovers(directory) == before
        assert after_failure(left).endswith("run the clean again to finish")
    finally:
        holder.kill()
        holder.wait()
    assert recover_planned(plan, wait_s=5) == []
    assert _leftovers(directory) == []
    assert after_failure([]) == "each partition is as it was or cleaned: run the clean again to finish"


def test_sparks_faulthandler_hint_is_left_out_of_the_one_line():
    from cleaner.spark_clean import _without_spark_hints

    said = ("Python worker exited unexpectedly (crashed). Consider setting "
            "'spark.sql.execution.pyspark.udf.faulthandler.enabled' or'spark.python.worker.faulthandler.enabled' "
            "configuration to 'true' for the better Python traceback.")
    assert _without_spark_hints(said) == "Python worker exited unexpectedly (crashed)"


def test_the_python_api_refuses_a_missing_path_or_a_file_as_clean_does_before_spark(tmp_path):
    from cleaner.config_file import ConfigFileError
    from cleaner.oneshot import CleanRefusedError
    from cleaner.spark_clean import clean_partitions

    (tmp_path / "file").write_bytes(b"")
    for path, says in ((tmp_path / "missing", "no such directory"), (tmp_path / "file", "not a directory")):
        with pytest.raises(CleanRefusedError, match=says) as refused:
            clean_partitions(None, [path], settings={"cleanup.policy": "compact"})  # no Spark is needed to refuse
        assert refused.value.exit_code == 2 and str(path) in str(refused.value)
    with pytest.raises(ConfigFileError):  # documented in docs/spark.md
        clean_partitions(None, [tmp_path], settings={"no.such.setting": "1"})


def test_the_text_total_shows_retentions_deletions_and_says_would_in_a_dry_run():
    from cleaner.cli import _spark_total_line

    total = {"partitions": 2, "tasks": 1, "master": "local[2]", "elapsed_s": 1.25, "spark_startup_s": 6.0, "ok": 2,
             "failed": 0, "skipped": 0, "records_read": 0, "records_written": 0, "size_before_bytes": 0,
             "size_after_bytes": 0, "segments_deleted": 3, "bytes_deleted": 3_000_000}
    assert _spark_total_line(total, dry_run=False) == (
        "total: 2 partition(s) in 1 Spark task(s) on local[2], 1.2 s (after Spark's start-up, 6.0 s): 2 ok, "
        "0 failed, 0 skipped; 0 records read, 0 written; 0.00 MB -> 0.00 MB; deleted 3 segment(s), 3.00 MB")
    dry = _spark_total_line(total, dry_run=True)
    assert "0 records read, 0 would be written;" in dry and dry.endswith("; would delete 3 segment(s), 3.00 MB")


def test_executors_short_of_memory_are_refused_before_spark_starts(logs, tmp_path):
    """No Java here (JAVA_HOME without one): the refusal comes before any start is tried."""
    env = {**os.environ, "JAVA_HOME": str(tmp_path), "SPARK_CONF_DIR": str(tmp_path)}
    env.pop("SPARK_HOME", None)
    done = subprocess.run([sys.executable, "-m", "cleaner.cli", "clean", str(logs), "--set", "cleanup.policy=compact",
                           "--spark", "--master", "spark://127.0.0.1:1", "--spark-conf",
                           "spark.executor.memoryOverhead=300m"], capture_output=True, text=True, timeout=120,
                          env=env)
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith("Error: log.cleaner.dedupe.buffer.size is per task with --spark"), done.stderr
    assert "spark.executor.memoryOverhead" in done.stderr and len(done.stderr.strip().splitlines()) == 1
    # a spark-defaults.conf may give the executors more: then only the session's own settings decide
    (tmp_path / "spark-defaults.conf").write_text("spark.executor.memoryOverhead 4g\n")
    done = subprocess.run(done.args, capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 1 and "JAVA_HOME" in done.stderr, done.stderr
