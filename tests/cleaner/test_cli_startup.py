"""The light commands load only what they need (issue 19, start-up): `logcleaner --help`, `status`, and `clean`
and `verify` of a log with nothing in it never import numba (nor llvmlite), pyspark, pyarrow or
prometheus_client; `--help` and `status` not numpy either. The compiled kernels are loaded when a scan or a
round with work runs (the module built ahead of time, not numba), pyspark by the Spark commands,
prometheus_client by the daemon.

Each case runs one command in a fresh interpreter, in-process (`main(args, standalone_mode=False)`), and then
reads `sys.modules`: what a command imports is what its start-up pays for. Nothing here measures a time
(`bench/startup_bench.py` does).
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

NEVER_LIGHT = ("numba", "llvmlite", "pyspark", "pyarrow", "pandas", "prometheus_client")

_PROBE = """
import json, sys
from cleaner.cli import main
try:
    main(sys.argv[1:], standalone_mode=False)
except SystemExit as exc:
    code = exc.code
except Exception as exc:  # click.ClickException: a refused connection, say (the CLI shows it in one line)
    code = type(exc).__name__
else:
    code = 0
print(json.dumps({"code": code, "modules": sorted(sys.modules)}))
"""


def run_in_fresh_interpreter(args: list[str], cwd) -> tuple[object, set[str]]:
    """(exit code or exception name, top-level packages imported) of `logcleaner ARGS` run in a new Python."""
    probe = _PROBE if args else "import json, sys, cleaner.cli; print(json.dumps({'code': 0, 'modules': sorted(sys.modules)}))"
    done = subprocess.run([sys.executable, "-c", probe, *args], capture_output=True, text=True, cwd=cwd, timeout=120)
    last = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else ""
    assert last.startswith("{"), f"the probe did not finish: {done.stdout}{done.stderr}"
    found = json.loads(last)
    return found["code"], {name.split(".")[0] for name in found["modules"]}


@pytest.fixture
def empty_log_dir(tmp_path):
    """A log dir holding one empty partition directory, `t/demo-0/`."""
    (tmp_path / "t" / "demo-0").mkdir(parents=True)
    return tmp_path / "t"


@pytest.mark.parametrize(("args", "also_not"), [
    ([], ("numpy",)),  # `import cleaner.cli` alone
    (["--help"], ("numpy",)),
    (["clean", "--help"], ("numpy",)),
    (["status", "--url", "http://127.0.0.1:1"], ("numpy",)),  # a refused connection: exit 1, one line
    # the partition name is checked by segments.files.pathcheck, whose file-name grammar imports numpy
    (["admin", "pause", "t-0", "--url", "http://127.0.0.1:1"], ()),
])
def test_help_and_the_daemon_clients_import_no_heavy_library(tmp_path, args, also_not):
    code, imported = run_in_fresh_interpreter(args, tmp_path)
    assert code in (0, "ClickException"), code  # the daemon's port is refused
    assert imported.isdisjoint(NEVER_LIGHT + also_not), sorted(imported & set(NEVER_LIGHT + also_not))


@pytest.mark.parametrize("command", [["clean", "--set", "cleanup.policy=compact"], ["verify"]])
def test_clean_and_verify_of_an_empty_log_never_load_numba(empty_log_dir, command):
    code, imported = run_in_fresh_interpreter([*command, str(empty_log_dir)], empty_log_dir.parent)
    assert code == 0
    assert imported.isdisjoint(NEVER_LIGHT), sorted(imported & set(NEVER_LIGHT))


def test_a_round_with_work_still_loads_the_kernels(tmp_path):
    """The other side: what is delayed is loaded when needed (a partition with records is scanned and cleaned):
    the kernels' module built for this installation (the first clean builds it), not numba."""
    from segments.codec import compiled
    from segments.tools.generate import WorkloadSpec, generate_partition

    for name in ("t", "u"):
        generate_partition(tmp_path / name / "demo-0", WorkloadSpec(records=200, keys=20, tombstone_fraction=0.0,
                                                                    seed=1))
    run_in_fresh_interpreter(["clean", "--set", "cleanup.policy=compact", str(tmp_path / "t")], tmp_path)
    code, imported = run_in_fresh_interpreter(["clean", "--set", "cleanup.policy=compact", str(tmp_path / "u")],
                                              tmp_path)
    assert code == 0
    assert any(name.startswith(compiled.AOT_PREFIX) for name in imported)
    assert imported.isdisjoint(NEVER_LIGHT), sorted(imported & set(NEVER_LIGHT))


@pytest.mark.parametrize("package", ["segments", "offsetmap", "cleaner"])
def test_the_package_facades_import_nothing_heavy_and_still_give_every_public_name(tmp_path, package):
    probe = (f"import json, sys, {package}; before = sorted(sys.modules); from {package} import *; "
             f"print(json.dumps([before, [n for n in {package}.__all__ if n not in globals()]]))")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert done.returncode == 0, done.stderr
    before, missing = json.loads(done.stdout.strip().splitlines()[-1])
    assert {name.split(".")[0] for name in before}.isdisjoint(NEVER_LIGHT + ("numpy",))
    assert missing == []


# ---- the end of the process (`cli_support.end_process`) ---------------------------------------------------------

_END_PROBE = """
import atexit, sys, threading
from cleaner.cli import entry

class Teardown:
    def __del__(self):  # runs only in the interpreter's teardown
        sys.stdout.write("teardown ran\\n"); sys.stdout.flush()

_kept = Teardown()
atexit.register(lambda: print("exit handler ran", flush=True))
if sys.argv[1] == "thread":  # a thread that is not a daemon's: Python must wait for it, so the teardown runs
    gate = threading.Event()
    threading.Thread(target=gate.wait, args=(0.5,), daemon=False).start()
sys.argv = ["logcleaner", *sys.argv[2:]]
entry()
"""


@pytest.mark.parametrize("case, args, code, teardown", [
    ("plain", ["--version"], 0, False),
    ("plain", ["clean"], 2, False),  # a usage error: its status, its message
    ("thread", ["--version"], 0, True),
])
def test_the_console_script_ends_after_its_exit_handlers_without_the_teardown_unless_a_thread_needs_it(
        tmp_path, case, args, code, teardown):
    done = subprocess.run([sys.executable, "-c", _END_PROBE, case, *args], capture_output=True, text=True,
                          cwd=tmp_path, timeout=120)
    assert done.returncode == code, done.stderr
    assert "exit handler ran" in done.stdout
    assert ("teardown ran" in done.stdout) == teardown
    assert ("logcleaner, version" in done.stdout) == (args == ["--version"])
    if code == 2:
        assert done.stderr.startswith("Error: ") and "Traceback" not in done.stderr


def test_the_console_script_is_the_entry_that_ends_the_process_early():
    from importlib.metadata import entry_points

    (script,) = [e for e in entry_points(group="console_scripts") if e.name == "logcleaner"]
    assert script.value == "cleaner.cli:entry"
