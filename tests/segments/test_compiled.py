"""The kernels' two sources (`segments.codec.compiled`): the module built ahead of time and numba's JIT clean to
the same bytes; the module serves every call of a round (`LOGCLEANER_KERNELS=aot` turns a fallback into an
error); a call it was not built for falls back to numba with the right result, never runs on the wrong types.

The suite's session start builds the module (`tests/conftest.py`), so the in-process tests run it too.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from segments.codec import compiled
from segments.tools.generate import WorkloadSpec, generate_partition

from ..cleaner.builders import random_log

ROOT = Path(__file__).resolve().parents[2]
NOW_MS = 1_900_000_000_000


def _env(mode: str) -> dict[str, str]:
    return dict(os.environ, **{compiled.MODE_ENV: mode}, PYTHONPATH=str(ROOT))


def _clean_all(root: Path, mode: str) -> dict[str, str]:
    """Clean the log dir `root` in one `logcleaner clean` (kernels from `mode`); SHA-256 per file."""
    done = subprocess.run([sys.executable, "-m", "cleaner.cli", "clean", str(root), "--json", "--now-ms", str(NOW_MS),
                           "--set", "cleanup.policy=compact", "--set", "delete.retention.ms=0",
                           "--set", "log.cleaner.dedupe.buffer.size=1048576"],
                          env=_env(mode), capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert done.returncode == 0, (mode, done.stderr)
    return {str(f.relative_to(root)): hashlib.sha256(f.read_bytes()).hexdigest()
            for f in sorted(root.rglob("*")) if f.is_file() and not f.name.endswith(".lock")}


@pytest.mark.slow
def test_the_built_module_and_the_jit_clean_to_the_same_bytes(tmp_path):
    """Every codec, transactions with aborts, tombstones, legacy wrappers via the random builder; the module is
    required (a kernel it does not serve fails the clean) on one side, numba alone on the other."""
    sources = tmp_path / "sources"
    for codec in range(5):
        generate_partition(sources / f"codec{codec}-0", WorkloadSpec(records=3000, keys=90, records_per_batch=20,
                                                                     tombstone_fraction=0.2, compression=codec,
                                                                     segment_bytes=32 * 1024, seed=codec))
    for seed in range(6):
        random_log(sources / f"random{seed}-0", seed, offset_gap=seed % 2)
    results = {}
    for mode in ("jit", "aot"):
        copy = tmp_path / mode
        subprocess.run(["cp", "-a", str(sources), str(copy)], check=True)
        results[mode] = _clean_all(copy, mode)
    assert results["aot"] == results["jit"]
    assert len(results["aot"]) > 30
    before = {str(f.relative_to(sources)): hashlib.sha256(f.read_bytes()).hexdigest()
              for f in sorted(sources.rglob("*")) if f.is_file()}
    changed = {name.split("/")[0] for name, digest in results["aot"].items() if before.get(name) != digest}
    assert len(changed) >= 10  # the partitions were cleaned, not only copied


_FALLBACK_PROBE = """
import json, sys
import numpy as np
from segments.codec import _crc_kernels as crc, compiled
buf = np.frombuffer(b"123456789" * 4, dtype=np.uint8)
out = np.zeros(2, dtype=np.int64)
ends = np.array([9, 0, 18, 0], dtype=np.int64)[::2]  # strided: not what the module was built for
loaded_before = compiled.numba_loaded()
try:
    crc.batch_crcs(buf, np.array([0, 9], dtype=np.int64), ends, out)
    result = [int(x) for x in out]
except RuntimeError as exc:
    result = str(exc)
print(json.dumps({"before": loaded_before, "after": compiled.numba_loaded(), "result": result,
                  "numba": "numba" in sys.modules}))
"""


@pytest.mark.parametrize("mode", ["auto", "aot"])
def test_a_call_the_module_was_not_built_for_goes_to_numba_or_fails_in_aot_mode(mode):
    done = subprocess.run([sys.executable, "-c", _FALLBACK_PROBE], env=_env(mode), capture_output=True, text=True,
                          timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert found["before"] is False  # the module served the process until then
    if mode == "auto":
        assert found["result"] == [0xE3069283, 0xE3069283]  # CRC-32C("123456789"), the check value
        assert found["after"] is True and found["numba"] is True
    else:
        assert "has no built variant" in found["result"] and "strided" in found["result"]
        assert found["numba"] is False


_READ_ONLY_PROBE = """
import numpy as np
from segments.codec import _crc_kernels as crc
buf = np.frombuffer(bytes(61), dtype=np.uint8)  # read-only: the kernel writes the CRC field
try:
    crc.stamp_v2_crcs(buf, np.array([0], dtype=np.int64))
except RuntimeError as exc:
    print("REFUSED", exc)
"""


def test_a_read_only_buffer_is_never_given_to_a_kernel_that_writes():
    done = subprocess.run([sys.executable, "-c", _READ_ONLY_PROBE], env=_env("aot"), capture_output=True,
                          text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert "REFUSED" in done.stdout and "read-only" in done.stdout


def test_the_module_is_named_by_the_sources_fingerprint(tmp_path, monkeypatch):
    monkeypatch.setenv("NUMBA_CACHE_DIR", str(tmp_path))
    so_path, table_path = compiled.aot_files("ab" * 32)
    assert so_path.parent == tmp_path and table_path.parent == tmp_path
    assert so_path.name.startswith(compiled.AOT_PREFIX + "ab" * 8 + ".")
    assert table_path.name == compiled.AOT_PREFIX + "ab" * 8 + ".json"


@pytest.mark.parametrize("damage", ["truncated", "table-null", "table-list", "table-garbage", "no-table"])
def test_a_damaged_module_is_never_loaded(tmp_path, damage):
    """A module cut short would crash the process that loads it (SIGBUS): its table names its SHA-256, and a
    module or table that does not match is left to numba (and rebuilt by the next round's `ensure_compiled`)."""
    so_path, table_path = compiled.aot_files()
    assert so_path.exists(), "the suite's session start builds the module"
    cache = tmp_path / "cache"
    cache.mkdir()
    so_copy, table_copy = cache / so_path.name, cache / table_path.name
    so_copy.write_bytes(so_path.read_bytes()[: (500_000 if damage == "truncated" else None)])
    table_copy.write_text({"table-null": "null", "table-list": "[]", "table-garbage": "{not json"}.get(
        damage, table_path.read_text()))
    if damage == "no-table":
        table_copy.unlink()
    probe = ("from segments.codec import compiled, _crc_kernels\n"
             "print(compiled.module_state()[0], compiled.aot_module() is None)")
    done = subprocess.run([sys.executable, "-c", probe], env=dict(_env("auto"), NUMBA_CACHE_DIR=str(cache)),
                          capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["invalid", "True"]


def test_the_intact_copy_loads(tmp_path):
    so_path, table_path = compiled.aot_files()
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / so_path.name).write_bytes(so_path.read_bytes())
    (cache / table_path.name).write_text(table_path.read_text())
    probe = "from segments.codec import compiled, _crc_kernels\nprint(compiled.module_state()[0], compiled.aot_module() is None)"
    done = subprocess.run([sys.executable, "-c", probe], env=dict(_env("auto"), NUMBA_CACHE_DIR=str(cache)),
                          capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert done.stdout.split() == ["valid", "False"], done.stderr


@pytest.mark.parametrize(("value", "expected"), [("jit", "jit"), ("JIT", "jit"), (" aot ", "aot"), ("", "auto"),
                                                 ("foo", "auto")])
def test_the_mode_variable_is_read_leniently_and_an_unknown_value_is_said(monkeypatch, caplog, value, expected):
    monkeypatch.setenv(compiled.MODE_ENV, value)
    monkeypatch.setattr(compiled, "_warned", [])
    assert compiled.mode() == expected
    assert ("is not one of" in caplog.text) == (value == "foo")


def test_without_a_writable_cache_numba_compiles_without_one(monkeypatch, caplog):
    """numba raises at decoration when it has nowhere to cache (NUMBA_CACHE_DIR and the sources' __pycache__
    read-only); the kernel is then compiled without a cache, with a warning, instead of failing every round."""
    from numba.core import caching

    monkeypatch.setattr(caching.CacheImpl, "_locator_classes", [])
    monkeypatch.setattr(compiled, "_warned_cache", [])

    def add(a, b):
        return a + b

    kernel = compiled._numba_njit(add, (), {"cache": True, "nogil": True})
    assert kernel(2, 3) == 5
    assert "without a cache" in caplog.text


def test_a_kernel_is_recompiled_when_a_helper_it_inlines_from_another_file_changes(tmp_path):
    """numba stamps a cached kernel with its own file only; a helper inlined from another module (the recopy
    kernels use the codec's header writer and the map's bitmap reader) would otherwise keep its old code in the
    caller until the caller's file changed. numba's cache is keyed by the fingerprint of all three packages."""
    tree = tmp_path / "tree"
    for package in ("segments", "offsetmap", "cleaner"):
        shutil.copytree(ROOT / package, tree / package, ignore=shutil.ignore_patterns("__pycache__"))
    helper = tree / "offsetmap" / "_probe_helper.py"
    caller = tree / "cleaner" / "_probe_caller.py"
    helper_text = ("from segments.codec import compiled\n\n\n"
                   "@compiled.njit(cache=True, nogil=True, inline='always')\n"
                   "def helper(x):\n    return x + {}\n")
    caller.write_text("from offsetmap._probe_helper import helper\nfrom segments.codec import compiled\n\n\n"
                      "@compiled.njit(cache=True, nogil=True)\ndef caller(x):\n    return helper(x) * 10\n")
    env = dict(os.environ, **{compiled.MODE_ENV: "jit"}, PYTHONPATH=str(tree),
               NUMBA_CACHE_DIR=str(tmp_path / "cache"))
    answers = []
    for added in (1, 2):
        helper.write_text(helper_text.format(added))
        done = subprocess.run([sys.executable, "-c", "from cleaner._probe_caller import caller; print(caller(4))"],
                              env=env, capture_output=True, text=True, timeout=300, cwd=tmp_path)
        assert done.returncode == 0, done.stderr
        answers.append(int(done.stdout))
    assert answers == [50, 60]


_PARTS_PROBE = """
import numpy as np
from cleaner.indexing import PartThreads
from offsetmap import OffsetMap
from segments.codec import compiled
m = OffsetMap(64 << 20)
m.reset(1, expected_keys=1_000_000, parts=2)
rng = np.random.default_rng(1)
h1, h2 = (rng.integers(0, 2**64, 300_000, dtype=np.uint64) for _ in range(2))
bits = np.zeros(300_000 // 8, np.uint8)
with PartThreads(1) as run:
    for s in range(0, 300_000, 70_000):
        offsets = np.arange(s, min(s + 70_000, 300_000))
        m.insert_hashes(h1[s:s + 70_000], h2[s:s + 70_000], offsets, superseded=(bits, 0), run=run)
print(m.parts, bool((m.lookup_hashes(h1, h2) == np.arange(300_000)).all()), compiled.numba_loaded())
"""


def test_a_map_filled_in_parts_runs_on_the_built_module():
    """The kernels' build compiles `insert_part` with the arguments a round on four threads gives it (the warm-up
    fills a map in parts): in `aot` mode a fallback to numba would fail."""
    done = subprocess.run([sys.executable, "-c", _PARTS_PROBE], env=_env("aot"), capture_output=True, text=True,
                          timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["2", "True", "False"]


def test_a_kernel_declared_bare_is_compiled_without_reference_counts_in_the_jit_and_the_build():
    """`compiled.BARE` kernels (they allocate nothing) carry no reference counts (NRT_incref/NRT_decref calls): the
    hot kernels are declared so (an allocating one is not), numba's JIT compiles one with its options to IR without
    any NRT call, and the build compiles such an export with reference counting off (`export_flags`)."""
    code = (
        "import re, numba, numpy as np\n"
        "from offsetmap import _kernels as k\n"
        "from segments.codec import _scan_kernels as s, compiled\n"
        "from cleaner import _kernels as c\n"
        "hot = (s._walk_v2, s.finish_window, s.count_batches, k.hash_rows, k.insert_hashes, k.insert_part, k.rehash,\n"
        "       k.lookup_hashes, c.select_keys, c.drop_aborted, c.assemble_batches, c.decide_window,\n"
        "       c.window_horizons)\n"
        "options = {o: v for o, v in k.hash_rows.targetoptions.items() if o not in ('cache', 'nopython')}\n"
        "fresh = numba.njit(**options)(k.hash_rows.py_func)\n"
        "buf = np.frombuffer(b'abcdefgh', dtype=np.uint8)\n"
        "pos, lens = np.array([0, 4], dtype=np.int64), np.array([4, 4], dtype=np.int32)\n"
        "rows, in_b = np.array([0, 1], dtype=np.int64), np.zeros(2, dtype=np.bool_)\n"
        "h1, h2 = np.empty(2, dtype=np.uint64), np.empty(2, dtype=np.uint64)\n"
        "assert fresh(buf, buf, pos, lens, rows, in_b, np.uint64(7), h1, h2) == -1\n"
        "ir = '\\n'.join(fresh.inspect_llvm().values())\n"
        "calls = sorted(set(re.findall(r'NRT_\\w+', ir)))\n"
        "print(all(compiled.bare(f) for f in hot), compiled.bare(k.insert_spans), calls)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=_env("jit"), timeout=600)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["True", "False", "[]"]

    from numba.core.compiler import Flags

    from cleaner.kernel_cache import export_flags

    def kernel():
        return None

    flags = Flags()
    flags.nrt = True  # as pycc compiles every export
    built, counted = export_flags(flags, kernel, {kernel}), export_flags(flags, print, {kernel})
    assert (built.nrt, built.release_gil, counted.nrt, counted.release_gil, flags.release_gil) == (
        False, True, True, True, False)
