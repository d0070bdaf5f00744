"""The kernels are compiled in a child process, once per installation and machine (`cleaner.kernel_cache`):
numba's cache, then the module built ahead of time that later processes load instead of numba."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cleaner import kernel_cache
from segments.codec import compiled
from segments.tools.generate import generate_partition
from tests import first_clean

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def fresh(monkeypatch, tmp_path):
    """An empty numba cache directory and a process that has not checked the stamp yet."""
    monkeypatch.setenv("NUMBA_CACHE_DIR", str(tmp_path / "numba-cache"))
    monkeypatch.delenv(compiled.MODE_ENV, raising=False)
    monkeypatch.setattr(kernel_cache, "_outcome", [])
    return tmp_path


class FakeChild:
    """`subprocess.Popen` of the child, ending at once with `code` and `stderr`; the commands are recorded."""

    calls: list[list[str]] = []

    def __init__(self, code: int, stderr: str = ""):
        self.code, self.text = code, stderr

    def __call__(self, cmd, **kwargs):
        FakeChild.calls.append(cmd)
        self.returncode = self.code
        self.stderr = io.StringIO(self.text)
        return self

    def poll(self):
        return self.code

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def _stamp(text: str) -> Path:
    stamp = kernel_cache.stamp_path()
    stamp.parent.mkdir(parents=True, exist_ok=True)
    stamp.write_text(text)
    return stamp


def test_a_matching_stamp_runs_no_child_when_the_module_is_known_not_to_build(fresh, monkeypatch):
    _stamp(compiled.fingerprint() + "\n")
    kernel_cache.failed_marker(compiled.fingerprint()).write_text("CompileError: no compiler\n")

    def no_child(*args, **kwargs):
        raise AssertionError("a child was started although the stamp matches")

    monkeypatch.setattr(subprocess, "Popen", no_child)
    assert kernel_cache.ensure_compiled() is True


def test_a_matching_stamp_with_a_damaged_module_runs_the_child(fresh, monkeypatch):
    """A module cut short is never loaded (it would crash the process) and is built again."""
    _stamp(compiled.fingerprint() + "\n")
    so_path, table_path = compiled.aot_files()
    so_path.write_bytes(b"\x7fELF" + bytes(100))
    table_path.write_text(json.dumps({"sha256": "0" * 64, "kernels": {}}))
    assert compiled.module_state()[0] == "invalid"
    FakeChild.calls = []
    monkeypatch.setattr(subprocess, "Popen", FakeChild(0))
    assert kernel_cache.ensure_compiled() is True
    assert FakeChild.calls == [[sys.executable, "-m", "cleaner.kernel_cache"]]


def test_a_stale_stamp_runs_the_child_once_per_process(fresh, monkeypatch):
    _stamp("made by other sources\n")
    FakeChild.calls = []
    monkeypatch.setattr(subprocess, "Popen", FakeChild(0))
    assert kernel_cache.ensure_compiled() is True
    assert kernel_cache.ensure_compiled() is True
    assert FakeChild.calls == [[sys.executable, "-m", "cleaner.kernel_cache"]]


def test_in_jit_mode_the_child_builds_no_module(fresh, monkeypatch):
    monkeypatch.setenv(compiled.MODE_ENV, "jit")
    FakeChild.calls = []
    monkeypatch.setattr(subprocess, "Popen", FakeChild(0))
    assert kernel_cache.ensure_compiled() is True
    assert FakeChild.calls == [[sys.executable, "-m", "cleaner.kernel_cache", "--jit-only"]]


def test_a_failed_child_leaves_compiling_to_the_process_with_a_warning(fresh, monkeypatch, caplog):
    monkeypatch.setattr(subprocess, "Popen", FakeChild(1, "boom\nlast line"))
    assert kernel_cache.ensure_compiled() is False
    assert "exit 1: last line" in caplog.text
    assert not kernel_cache.stamp_path().exists()


def test_a_child_stopped_by_a_signal_decides_nothing_and_says_no_more(fresh, monkeypatch, caplog):
    monkeypatch.setattr(subprocess, "Popen", FakeChild(-15))
    assert kernel_cache.ensure_compiled() is False
    assert kernel_cache._outcome == []  # the next call tries again
    assert "compiling in this process" not in caplog.text


def test_a_module_not_built_is_said_once(fresh, monkeypatch, caplog):
    def child_without_compiler(cmd, **kwargs):
        kernel_cache.failed_marker(compiled.fingerprint()).parent.mkdir(parents=True, exist_ok=True)
        kernel_cache.failed_marker(compiled.fingerprint()).write_text("CompileError: command 'gcc' failed\n")
        return FakeChild(0)(cmd)

    monkeypatch.setattr(subprocess, "Popen", child_without_compiler)
    assert kernel_cache.ensure_compiled() is True
    assert "could not be built here (CompileError: command 'gcc' failed)" in caplog.text


def test_a_stop_while_waiting_stops_the_child(fresh, monkeypatch):
    class Running(FakeChild):
        def poll(self):
            return None

        def terminate(self):
            self.terminated = True

        def wait(self, timeout=None):
            return -15

    child = Running(0)
    monkeypatch.setattr(subprocess, "Popen", child)

    class Stop(Exception):
        pass

    calls = []

    def check_abort():  # not stopped when the wait begins, stopped at its first look
        calls.append(1)
        if len(calls) > 1:
            raise Stop

    with pytest.raises(Stop):
        kernel_cache.ensure_compiled(check_abort)
    assert child.terminated and kernel_cache._outcome == []


def test_a_source_change_changes_the_fingerprint(tmp_path):
    before = compiled.fingerprint()
    fake_root = tmp_path / "tree"
    for package in ("segments", "offsetmap", "cleaner"):
        (fake_root / package).mkdir(parents=True)
        (fake_root / package / "m.py").write_text("x = 1\n")
    one = compiled.fingerprint_of(fake_root)
    (fake_root / "segments" / "m.py").write_text("x = 22\n")
    assert compiled.fingerprint_of(fake_root) not in (one, before)
    assert compiled.fingerprint_of(compiled._package_root()) == before


def test_a_build_removes_numba_caches_of_other_fingerprints_only(fresh, monkeypatch):
    fake_root = fresh / "tree"
    for package in ("segments", "offsetmap", "cleaner"):
        (fake_root / package / "sub" / "__pycache__").mkdir(parents=True)
        for name in ("m.py", "__pycache__/m.cpython-311.pyc", "sub/__pycache__/m.f-10.py311.nbi",
                     "sub/__pycache__/m.f-10.py311.1.nbc"):
            (fake_root / package / name).parent.mkdir(parents=True, exist_ok=True)
            (fake_root / package / name).write_bytes(b"x")
    monkeypatch.setattr(kernel_cache, "_package_root", lambda: fake_root)
    current = compiled.numba_cache_dir()
    other = compiled.numba_cache_dir("0" * 64)
    unrelated = compiled.cache_dir() / "segments_3f2a"  # not ours to remove (numba's layout for another user)
    for folder in (current, other, unrelated):
        (folder / "sub").mkdir(parents=True)
        (folder / "sub" / "k.nbi").write_bytes(b"x")
    kernel_cache.remove_other_numba_caches(compiled.fingerprint())
    assert current.exists() and unrelated.exists() and not other.exists()
    left = sorted(p.relative_to(fake_root).as_posix() for p in fake_root.rglob("*") if p.is_file())
    assert left == [f"{package}/{name}" for package in ("cleaner", "offsetmap", "segments")
                    for name in ("__pycache__/m.cpython-311.pyc", "m.py")]


def test_the_build_byte_compiles_the_packages_for_processes_that_may_not(tmp_path, monkeypatch):
    """`compile_bytecode` writes every module's byte code, so that an editable install run with
    PYTHONDONTWRITEBYTECODE=1 does not compile the sources in every process; a current one is kept."""
    fake_root = tmp_path / "tree"
    for package in ("segments", "offsetmap", "cleaner"):
        (fake_root / package / "sub").mkdir(parents=True)
        (fake_root / package / "m.py").write_text("x = 1\n")
        (fake_root / package / "sub" / "n.py").write_text("y = 2\n")
    monkeypatch.setattr(kernel_cache, "_package_root", lambda: fake_root)
    assert kernel_cache.compile_bytecode()
    written = sorted(p.relative_to(fake_root).as_posix() for p in fake_root.rglob("*.pyc"))
    assert [w.split("/__pycache__/")[0] + "/" + w.rsplit("/", 1)[1].split(".")[0] for w in written] == [
        f"{package}/{module}" for package in ("cleaner", "offsetmap", "segments") for module in ("m", "sub/n")]
    first = fake_root / written[0]
    mtime = first.stat().st_mtime_ns
    assert kernel_cache.compile_bytecode() and first.stat().st_mtime_ns == mtime


@pytest.mark.slow
def test_the_first_clean_after_an_install_compiles_nothing_itself_and_the_next_loads_no_numba(request, tmp_path):
    """With an empty cache directory, `logcleaner clean` compiles in its child (numba's cache, then the module):
    the process itself saves nothing to numba's cache (NUMBA_DEBUG_CACHE reports every save and load), the
    stamp and the module are written, and the next clean runs on the module without importing numba. On a
    fresh installation the session's own build was such a first clean (`tests/first_clean.py`); otherwise
    this test makes one into an empty cache directory."""
    first = request.config.stash.get(first_clean.OBSERVED, None)
    if first is None:
        first = first_clean.observe(tmp_path / "numba-cache", tmp_path)
    cache, env, done = first.cache, first.env, first.done
    generate_partition(tmp_path / "second" / "t-0", first_clean.SMALL)
    assert done.returncode == 0, done.stderr
    assert "data saved to" not in done.stdout  # numba's cache debug lines go to the process's stdout
    fingerprint = _fingerprint_in(env)
    assert (cache / "logcleaner-kernels.stamp").read_text().strip() == fingerprint
    so_path = cache / compiled.aot_files(fingerprint)[0].name
    assert so_path.exists()
    numba_dir = cache / (compiled.NUMBA_CACHE_PREFIX + fingerprint[:16])  # numba's cache: one folder per fingerprint
    assert list(numba_dir.rglob("*.nbi"))

    probe = ("import sys; from cleaner.cli import main\ntry:\n    main(sys.argv[1:], standalone_mode=False)\n"
             "finally:\n    print('MODULES', ' '.join(sorted(sys.modules)))")
    done = subprocess.run([sys.executable, "-c", probe, "clean", str(tmp_path / "second" / "t-0"), "--json"],
                          cwd=ROOT, env=dict(env, **{compiled.MODE_ENV: "aot"}), capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr
    modules = set(done.stdout.split("MODULES", 1)[1].split())
    assert so_path.name.split(".", 1)[0] in modules
    assert not {m.split(".")[0] for m in modules} & {"numba", "llvmlite"}


def _fingerprint_in(env: dict) -> str:
    code = "from segments.codec import compiled; print(compiled.fingerprint())"
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                          check=True).stdout.strip()


def test_a_caller_already_stopped_starts_no_child(fresh, monkeypatch):
    """A daemon thread that waited while another thread's build was stopped stops too, without a child."""
    def no_child(*args, **kwargs):
        raise AssertionError("a child was started by a caller that is stopping")

    monkeypatch.setattr(subprocess, "Popen", no_child)

    class Stop(Exception):
        pass

    def check_abort():
        raise Stop

    with pytest.raises(Stop):
        kernel_cache.ensure_compiled(check_abort)
    assert kernel_cache._outcome == []


def test_a_child_killed_otherwise_is_a_failure_said_once(fresh, monkeypatch, caplog):
    """SIGKILL (the OOM killer, say) is not a stop of this process: compiling is left to it, once."""
    monkeypatch.setattr(subprocess, "Popen", FakeChild(-9))
    assert kernel_cache.ensure_compiled() is False
    assert kernel_cache._outcome == [False]
    assert "exit -9" in caplog.text


def _children_of(pid: int) -> list[tuple[int, str]]:
    """(pid, command line) of the live processes whose parent is `pid`."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            if ppid == pid:
                found.append((int(entry.name), (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()))
        except (OSError, ValueError, IndexError):
            continue
    return found


@pytest.mark.slow
def test_a_build_stopped_during_its_warm_up_stops_the_warm_up_process_and_leaves_nothing(tmp_path):
    """The child compiles in a process of its own (`--warm-up-only`) so that the module's build does not carry
    numba's compile memory; SIGTERM to the child during that warm-up ends both, with their scratch directories
    removed and no stamp written."""
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path / "numba-cache"), TMPDIR=str(scratch),
               PYTHONPATH=str(ROOT))
    env.pop(compiled.MODE_ENV, None)
    child = subprocess.Popen([sys.executable, "-m", "cleaner.kernel_cache"], cwd=ROOT, env=env,
                             stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        warm_up = []
        while not warm_up and time.monotonic() < deadline and child.poll() is None:
            warm_up = [pid for pid, cmd in _children_of(child.pid) if "--warm-up-only" in cmd]
            time.sleep(0.05)
        assert warm_up, "no warm-up process was started"
        time.sleep(1.0)  # compiling by now
        child.send_signal(signal.SIGTERM)
        try:  # at once: the warm-up is stopped, not waited for (it compiles for ~25 s here)
            _, stderr = child.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            pytest.fail("the stopped child waited for its warm-up process instead of stopping it")
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert child.returncode == 128 + signal.SIGTERM, stderr
    assert not Path(f"/proc/{warm_up[0]}").exists() or "zombie" in Path(f"/proc/{warm_up[0]}/status").read_text()
    assert list(scratch.iterdir()) == []
    assert not (tmp_path / "numba-cache" / "logcleaner-kernels.stamp").exists()
