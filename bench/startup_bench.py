"""Start-up cost of the light `logcleaner` commands (issue 19): wall and CPU time of whole fresh processes.

Each command runs `--repeats` times (default 5) in a fresh process, warm page cache and warm bytecode cache
(one untimed run of each first), and the median wall time is printed next to `python -c pass` measured in the
same run, the floor no command can go below. The children compile their bytecode into a temporary
`PYTHONPYCACHEPREFIX`, written by the untimed run whatever `PYTHONDONTWRITEBYTECODE` says, as an installed
package has its `.pyc` files; they run in a temporary directory, so `PYTHONPATH=<another checkout>` measures
that checkout's code with this venv. The commands:

  python -c pass                                the interpreter alone (baseline)
  python -c "import numpy"                      numpy alone, which clean and verify need
  python -c "import cleaner.cli"                the CLI module and what it imports at load
  logcleaner --help                             the console script (.venv/bin/logcleaner)
  python -m cleaner.cli --help                  the same without the console-script wrapper
  logcleaner status --url http://127.0.0.1:1    a refused connection: parse, connect, one error line
  logcleaner clean --set cleanup.policy=compact LOGDIR   a log dir holding one empty partition (t/demo-0)
  logcleaner verify LOGDIR                      the same log dir

and, per command, which heavy libraries (numpy, numba, llvmlite, pyarrow, pyspark, prometheus_client, ...) the
command imported (the command run once in-process, `standalone_mode=False`, then `sys.modules` read).

Usage: python bench/startup_bench.py [--repeats 5]
A benchmark measures; it never asserts a time.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HEAVY = ["numpy", "numba", "llvmlite", "pyarrow", "pyspark", "pandas", "prometheus_client", "mmh3", "lz4",
         "zstandard", "cramjam", "crc32c"]

_MODULES_PROBE = """
import sys
from cleaner.cli import main
try:
    main(sys.argv[1:], standalone_mode=False)
except BaseException:
    pass
heavy = {heavy!r}
print(" ".join(m for m in heavy if m in sys.modules) or "-")
"""


def _wall(argv: list[str], env: dict[str, str], cwd: Path) -> tuple[float, float]:
    """(wall s, CPU s: user + system) of one run of `argv`."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False, env=env, cwd=cwd)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def _heavy_modules(cli_args: list[str], env: dict[str, str], cwd: Path) -> str:
    done = subprocess.run([sys.executable, "-c", _MODULES_PROBE.format(heavy=HEAVY), *cli_args],
                          capture_output=True, text=True, check=False, env=env, cwd=cwd)
    lines = done.stdout.strip().splitlines()
    return lines[-1] if lines else f"? (exit {done.returncode})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()

    python = sys.executable
    script = str(Path(python).with_name("logcleaner"))
    with tempfile.TemporaryDirectory(prefix="startup-bench-") as tmp:
        env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
        env["PYTHONPYCACHEPREFIX"] = str(Path(tmp) / "pycache")
        cwd = Path(tmp)  # not the checkout: `python -c` and `-m` put their working directory first on sys.path
        log_dir = Path(tmp) / "t"
        (log_dir / "demo-0").mkdir(parents=True)
        rows: list[tuple[str, list[str], list[str] | None]] = [
            ("python -c pass", [python, "-c", "pass"], None),
            ('python -c "import numpy"', [python, "-c", "import numpy"], None),
            ('python -c "import cleaner.cli"', [python, "-c", "import cleaner.cli"], None),
            ("logcleaner --help", [script, "--help"], ["--help"]),
            ("python -m cleaner.cli --help", [python, "-m", "cleaner.cli", "--help"], None),
            ("logcleaner status --url http://127.0.0.1:1", [script, "status", "--url", "http://127.0.0.1:1"],
             ["status", "--url", "http://127.0.0.1:1"]),
            ("logcleaner clean --set cleanup.policy=compact LOGDIR",
             [script, "clean", "--set", "cleanup.policy=compact", str(log_dir)],
             ["clean", "--set", "cleanup.policy=compact", str(log_dir)]),
            ("logcleaner verify LOGDIR", [script, "verify", str(log_dir)], ["verify", str(log_dir)]),
        ]
        for _, argv, _ in rows:  # warm the page cache and the bytecode caches
            _wall(argv, env, cwd)
        walls: dict[str, list[float]] = {label: [] for label, _, _ in rows}
        cpus: dict[str, list[float]] = {label: [] for label, _, _ in rows}
        for _ in range(args.repeats):  # interleaved, so a burst of load elsewhere touches every row alike
            for label, argv, _ in rows:
                wall, cpu = _wall(argv, env, cwd)
                walls[label].append(wall)
                cpus[label].append(cpu)
        heavy = {label: _heavy_modules(cli, env, cwd) if cli is not None else "" for label, _, cli in rows}

        code = subprocess.run([python, "-c", "import cleaner, os; print(os.path.dirname(os.path.dirname(cleaner.__file__)))"],
                              capture_output=True, text=True, check=False, env=env, cwd=cwd).stdout.strip()

    base = statistics.median(walls["python -c pass"])
    print(f"logcleaner start-up: median of {args.repeats} fresh processes per row, warm page cache, "
          f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f}, "
          f"{dt.datetime.now(dt.timezone.utc):%Y-%m-%d %H:%M} UTC")
    print(f"code: {code}; LOGDIR: a temporary log dir holding one empty partition directory, t/demo-0/\n")
    print("| command | median wall s | min s | max s | minus `python -c pass` s | median CPU s | heavy libraries "
          "imported |")
    print("|---|---:|---:|---:|---:|---:|---|")
    for label, _, _ in rows:
        w = walls[label]
        print(f"| `{label}` | {statistics.median(w):.3f} | {min(w):.3f} | {max(w):.3f} | "
              f"{statistics.median(w) - base:.3f} | {statistics.median(cpus[label]):.3f} | {heavy[label]} |")
    print("\nCPU s: user + system time of the process, less sensitive than its wall time to other load on the "
          "machine. Heavy libraries: those of numpy, numba, llvmlite, pyarrow, pyspark, pandas, prometheus_client, "
          "mmh3, lz4, zstandard, cramjam, crc32c the command imported (run once more, in-process).")


if __name__ == "__main__":
    main()
