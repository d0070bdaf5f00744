"""The kernels compiled in a child process, once per installation and machine: numba's on-disk cache, then one
extension module built ahead of time, so that a cleaning process neither compiles nor imports numba.

numba compiles a kernel at its first call when its on-disk cache has nothing for this machine (~10 s, and
~80-100 MB more peak RSS in the process that compiles), and a process that only loads from that cache still
imports numba and llvmlite (~0.3 s with the GIL held, ~110 MiB). `ensure_compiled()` runs before a process's
first round: when the stamp says this was done for these kernel sources, this numba and this CPU, it returns at
once; otherwise it runs `python -m cleaner.kernel_cache`, which cleans small synthetic logs under numba's JIT
(every codec, legacy v0/v1, transactions, tombstones, the safety check, both CRC-32C variants) so that every
kernel is compiled with the argument types a round uses (in a process of its own, whose memory is gone before
the next step), then, having loaded them from numba's cache, compiles those kernels with those signatures
into one extension module (numba's `pycc`, the GIL released around every call; `segments.codec.compiled`
loads it), byte-compiles this project's packages (as pip does at a regular install: an editable install run
with `PYTHONDONTWRITEBYTECODE=1`, as container images often set, otherwise compiles ~60 modules from source
in every process, ~0.09 s), writes the stamp, and exits. If the child fails, or the cache directory cannot be
written, the round compiles in-process as before (slower to start, bigger, never wrong); if only the module
cannot be built (no C compiler), processes load numba's cache as before.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from segments.codec import compiled

__all__ = ["build_module", "compile_bytecode", "ensure_compiled", "export_flags", "remove_other_numba_caches",
           "stamp_path"]

log = logging.getLogger(__name__)

_CHILD_TIMEOUT_S = 900
_NOW_MS = 1_900_000_000_000
_KERNEL_PACKAGES = ("segments.", "offsetmap.", "cleaner.")
_PACKAGES = ("segments", "offsetmap", "cleaner")  # this project's, byte-compiled by the child


def _package_root() -> Path:
    return Path(__file__).resolve().parents[1]


def stamp_path() -> Path:
    """Where the stamp lives: with numba's cache (`segments.codec.compiled.cache_dir()`)."""
    return compiled.cache_dir() / "logcleaner-kernels.stamp"


_lock = threading.Lock()
_outcome: list[bool] = []  # the first call's answer, once known
_POLL_S = 0.2  # how often a wait for the child (or for another process's child) looks at `check_abort`


def failed_marker(print_: str) -> Path:
    """The file a child leaves, with the reason, when it could not build the module for fingerprint `print_`
    (no C compiler, say): numba's cache serves, and later processes do not try again for these sources."""
    return compiled.aot_files(print_)[1].with_suffix(".failed")


def ensure_compiled(check_abort: Callable[[], None] | None = None) -> bool:
    """Make sure the kernels are compiled for these sources before this process runs one (once per process;
    the daemon's threads wait for the first caller; other processes wait on a lock file while one builds).

    Returns True if they are (the stamp matched, with the module built or known not to build here, or the
    child did it), False if the process will compile in-process (the child failed or was stopped, or the
    cache directory is not writable). `check_abort` is called while waiting; what it raises stops the child
    and is raised here."""
    if _outcome:
        return _outcome[0]
    with _lock:
        if not _outcome:
            done = _fill_cache(check_abort)
            if done is not None:
                _outcome.append(done)
    return _outcome[0] if _outcome else False


def _compiled_already(fingerprint: str) -> bool:
    stamp = stamp_path()
    if not (stamp.exists() and stamp.read_text().strip() == fingerprint):
        return False
    if compiled.mode() == "jit":
        return True  # numba's cache is filled; the module is not wanted
    return compiled.module_state(fingerprint)[0] == "valid" or failed_marker(fingerprint).exists()


def _fill_cache(check_abort: Callable[[], None] | None) -> bool | None:
    """True or False as `ensure_compiled` says; None when the child was stopped by a signal (the process is
    ending; nothing is decided)."""
    if check_abort is not None:
        check_abort()  # a thread that waited for another's stopped build stops too, without starting one
    try:
        fingerprint = compiled.fingerprint()
        if _compiled_already(fingerprint):
            return True
        folder = compiled.cache_dir()
        folder.mkdir(parents=True, exist_ok=True)
        if not os.access(folder, os.W_OK):
            return False
        lock_file = open(folder / "logcleaner-kernels.lock", "a+b")
    except OSError:
        return False
    with lock_file:
        while True:  # one process builds for the cache directory; the others wait for it, then find it done
            try:
                fcntl.flock(lock_file, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if check_abort is not None:
                    check_abort()
                time.sleep(_POLL_S)
            except OSError:  # a file system without locks: build without one (at worst twice, never wrong)
                break
        if _compiled_already(fingerprint):
            return True
        return _run_child(fingerprint, check_abort)


def _run_child(fingerprint: str, check_abort: Callable[[], None] | None) -> bool | None:
    import subprocess  # here and below: only a process that compiles needs these modules (its start-up, issue 19)

    jit_only = compiled.mode() == "jit"
    log.warning("compiling the cleaner's kernels for this machine in a child process (once per installation; "
                "about a minute)")
    env = dict(os.environ)
    env[compiled.MODE_ENV] = "jit"  # the child compiles with numba, then builds the module from what it compiled
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(_package_root()), env.get("PYTHONPATH", "")) if p)
    command = [sys.executable, "-m", "cleaner.kernel_cache", *(["--jit-only"] if jit_only else [])]
    started = time.monotonic()
    try:
        child = subprocess.Popen(command, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                 stderr=subprocess.PIPE, text=True)
    except OSError as exc:
        log.warning("compiling the kernels in a child process failed (%s); compiling in this process", exc)
        return False
    with child:
        errors: list[str] = []  # the child's stderr, read as it comes so that a full pipe never blocks it
        reader = threading.Thread(target=lambda: errors.append(child.stderr.read() if child.stderr else ""),
                                  name="kernel-cache-stderr", daemon=True)
        reader.start()
        try:
            while child.poll() is None:
                if check_abort is not None:
                    check_abort()
                if time.monotonic() - started > _CHILD_TIMEOUT_S:
                    raise TimeoutError(f"no result after {_CHILD_TIMEOUT_S} s")
                time.sleep(_POLL_S)
        except BaseException as exc:
            child.terminate()  # the child removes its scratch directory on SIGTERM
            try:
                child.wait(timeout=10)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()
            if isinstance(exc, TimeoutError):
                log.warning("compiling the kernels in a child process failed (%s); compiling in this process", exc)
                return False
            raise
        reader.join(timeout=5)
    tail = ((errors[0] if errors else "").strip().splitlines() or ["no output"])[-1]
    if -child.returncode in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):  # stopped with this process's group
        log.info("compiling the kernels was stopped by signal %d", -child.returncode)
        return None
    if child.returncode != 0:
        log.warning("compiling the kernels in a child process failed (exit %d: %s); compiling in this process",
                    child.returncode, tail)
        return False
    if not jit_only and failed_marker(fingerprint).exists():
        log.warning("the kernels' module could not be built here (%s); numba's cache serves instead (its import "
                    "costs each process ~0.3 s)", failed_marker(fingerprint).read_text().strip())
    return True


def _warm_up_logs(root: Path) -> list[Path]:
    """Small partitions whose rounds call every kernel: every codec, legacy v0 and v1 wrappers, a
    transactional producer with commits and aborts, tombstones."""
    from segments.codec import format as fmt
    from segments.codec.legacy import encode_legacy_wrapper
    from segments.codec.records import Record, encode_batch, encode_control_batch
    from segments.partition.log import LogConfig, PartitionLog
    from segments.tools.generate import WorkloadSpec, generate_partition

    parts = []
    for codec, name in sorted(fmt.COMPRESSION_NAMES.items()):
        part = root / f"warm{name}-0"
        generate_partition(part, WorkloadSpec(records=600, keys=40, records_per_batch=10, tombstone_fraction=0.2,
                                              compression=codec, segment_bytes=8 * 1024))
        parts.append(part)
    part = root / "warmtxn-0"
    with PartitionLog.open(part, mode="writer", create=True, config=LogConfig(segment_bytes=4 * 1024)) as log_:
        for i in range(60):
            key = b"k%d" % (i % 7)
            value = None if i % 5 == 0 else b"v%d" % i
            records = [Record(offset=0, timestamp=1_700_000_000_000 + i, key=key, value=value)]
            log_.append_batches(encode_batch(records, base_offset=0, is_transactional=True, producer_id=9,
                                             producer_epoch=0, base_sequence=i,
                                             compression=(fmt.COMPRESSION_LZ4 if i % 2 else fmt.COMPRESSION_NONE)))
            if i % 3 == 2:
                kind = fmt.CONTROL_TYPE_ABORT if i % 9 == 8 else fmt.CONTROL_TYPE_COMMIT
                log_.append_batches(encode_control_batch(offset=0, control_type=kind, timestamp=1_700_000_000_000 + i,
                                                         producer_id=9, producer_epoch=0))
        log_.roll()
    parts.append(part)
    for magic in (fmt.MAGIC_V0, fmt.MAGIC_V1):
        part = root / f"warmlegacy{magic}-0"
        part.mkdir()
        wrappers = []
        for i in range(0, 60, 3):
            inner = [Record(offset=i + j, timestamp=(-1 if magic == fmt.MAGIC_V0 else 1_700_000_000_000 + i),
                            key=b"k%d" % ((i + j) % 5), value=b"v%d" % i) for j in range(3)]
            wrappers.append(encode_legacy_wrapper(inner, magic=magic, codec=fmt.COMPRESSION_GZIP))
        # Legacy entries are not appended (a broker writes v2 only): the segment is written whole, as an old
        # broker left it; its indexes are rebuilt when the log is opened.
        (part / fmt.offset_file_name(0, fmt.LOG_SUFFIX)).write_bytes(b"".join(wrappers))
        with PartitionLog.open(part, mode="writer") as log_:
            log_.roll()
        parts.append(part)
    return parts


def _warm_up() -> None:
    """Compile every kernel a round runs (the child's work)."""
    import tempfile

    import numpy as np

    from offsetmap import OffsetMap
    from segments.codec import _crc_kernels
    from segments.files.readahead import WindowRing
    from segments.partition.log import PartitionLog

    from .indexing import PartThreads
    from .round import clean_round
    from .settings import Settings
    from .survey import WINDOW_BYTES

    with tempfile.TemporaryDirectory(prefix="logcleaner-warm-up-") as tmp:
        for part in _warm_up_logs(Path(tmp)):
            topic = Settings.from_mappings({"cleanup.policy": "compact", "delete.retention.ms": 0}).topic(
                part.name.rsplit("-", 1)[0])
            for verify in (True, False):
                with PartitionLog.open(part, mode="cleaner") as log_:
                    clean_round(log_, topic, OffsetMap(1 << 20), now_ms=_NOW_MS, seed=7, verify=verify,
                                force_recopy=True, ring=WindowRing(WINDOW_BYTES))
    grown = OffsetMap(1 << 24)  # a region that doubles (`OffsetMap._grow_if_due`): more keys than its first holds
    grown.reset(7, expected_keys=200_000)
    keys = np.arange(1, 50_001, dtype=np.uint64)
    grown.insert_hashes(keys * np.uint64(0x9E37_79B9_7F4A_7C15), keys, np.arange(50_000, dtype=np.int64))
    split = OffsetMap(1 << 24)  # a map in parts filled on two threads, as a round with a spare core fills it
    split.reset(7, expected_keys=200_000, parts=2)
    with PartThreads(1) as parts:
        split.insert_hashes(keys * np.uint64(0x9E37_79B9_7F4A_7C15), keys, np.arange(50_000, dtype=np.int64),
                            superseded=(np.zeros(8_000, dtype=np.uint8), 0), run=parts)
    chosen = _crc_kernels.variant()
    for name in _crc_kernels.VARIANTS:  # the variant not chosen here is chosen by LOGCLEANER_CRC32C
        try:
            _crc_kernels.use_variant(name)
        except ValueError:
            continue
        _crc_kernels.crc32c(_bytes(b"123456789"))
        _crc_kernels.stamp_v2_crcs(_bytes(bytes(61)), _int64s([]))
    _crc_kernels.use_variant(chosen)


def _bytes(data: bytes) -> Any:
    import numpy as np

    return np.frombuffer(bytearray(data), dtype=np.uint8)


def _int64s(values: list[int]) -> Any:
    import numpy as np

    return np.array(values, dtype=np.int64)


def export_flags(flags: Any, func: Any, bare: set[Any]) -> Any:
    """pycc's compiler flags for one export: a copy of `flags`, with the GIL released, and without reference
    counting where `func` is in `bare` (declared with `compiled.BARE`)."""
    flags = flags.copy()
    flags.release_gil = True
    if func in bare:
        flags.nrt = False
    return flags


def _exports() -> list[tuple[str, Any, list[Any], bool]]:
    """(symbol, Python function, its numba signatures, whether it was declared `compiled.BARE`) of every kernel
    this process has compiled."""
    from numba.core.registry import CPUDispatcher

    found = []
    for name, module in sorted(sys.modules.items()):
        if module is None or not name.startswith(_KERNEL_PACKAGES):
            continue
        for attribute, value in sorted(vars(module).items()):
            if (isinstance(value, CPUDispatcher) and value.py_func.__module__ == name
                    and value.py_func.__name__ == attribute and value.nopython_signatures):
                found.append((compiled.export_name(name, attribute), value.py_func, list(value.nopython_signatures),
                              compiled.bare(value)))
    return found


def _argument_spec(numba_type: Any) -> list[Any]:
    """How `segments.codec.compiled.Kernel` checks an argument: ["array", dtype, ndim, read-only] or
    ["scalar", name]."""
    from numba import types
    from numba.np.numpy_support import as_dtype

    if isinstance(numba_type, types.Array):
        if numba_type.layout != "C":
            raise TypeError(f"{numba_type}: only C-contiguous arrays are exported")
        return ["array", as_dtype(numba_type.dtype).str, numba_type.ndim, not numba_type.mutable]
    return ["scalar", str(numba_type)]


def build_module(folder: Path, print_: str) -> Path:
    """Compile every kernel this process has compiled once (with that one signature) into the extension
    module for fingerprint `print_`, in `folder`, with its signature table beside it; returns its path.
    Needs a C compiler and the Python headers (raises if the build fails)."""
    import shutil
    import tempfile

    from numba.pycc import CC
    from numba.pycc import compiler as pycc_compiler

    from segments.codec import _lz4_kernels

    exports = _exports()
    if not exports:
        raise RuntimeError("no kernel was compiled by numba in this process")
    so_path, table_path = compiled.aot_files(print_)
    so_path, table_path = folder / so_path.name, folder / table_path.name
    module_name = so_path.name.split(".", 1)[0]
    kernels = {symbol: [[_argument_spec(t) for t in signature.args] for signature in signatures]
               for symbol, _, signatures, _ in exports}

    # pycc compiles every export with one Flags object that a compilation may change (numba turns SSA off for
    # some functions), and never releases the GIL: each export gets its own copy, with the GIL released, and
    # without reference counting where the kernel was declared so (`compiled.BARE`).
    original: Any = pycc_compiler.compile_extra
    bare = {func for _, func, _, is_bare in exports if is_bare}

    def compile_one(*args: Any, **kwargs: Any) -> Any:  # compile_extra(typingctx, targetctx, func, args,
        flags = export_flags(args[5], args[2], bare)  # return_type, flags, locals=..., library=...)
        return original(*args[:5], flags, *args[6:], **kwargs)

    with tempfile.TemporaryDirectory(prefix="logcleaner-aot-") as tmp:
        shim = Path(tmp) / "lz4_shim.c"
        shim.write_text(_lz4_kernels.LZ4_SHIM_C)
        cc = CC(module_name)
        cc.output_dir = tmp
        cc.target_cpu = "host"
        cc._mixin_sources = [*cc._mixin_sources, str(shim)]
        for symbol, func, signatures, _ in exports:
            for i, signature in enumerate(signatures):
                cc.export(compiled.variant_name(symbol, i), signature)(func)
        pycc_compiler.compile_extra = compile_one
        try:
            cc.compile()
        finally:
            pycc_compiler.compile_extra = original
        built = Path(tmp) / cc.output_file
        folder.mkdir(parents=True, exist_ok=True)
        for stale in folder.glob(compiled.AOT_PREFIX + "*"):
            if stale.name not in (so_path.name, table_path.name):
                stale.unlink(missing_ok=True)
        # the module first, then its table: a table names the bytes of the module it describes (SHA-256), so a
        # module cut short (a full disk, a crash) is never loaded
        partial = so_path.with_name(so_path.name + f".{os.getpid()}.tmp")
        shutil.copyfile(built, partial)
        os.replace(partial, so_path)
        table = {"sha256": hashlib.sha256(so_path.read_bytes()).hexdigest(), "kernels": kernels}
        partial = table_path.with_name(table_path.name + f".{os.getpid()}.tmp")
        partial.write_text(json.dumps(table, sort_keys=True))
        os.replace(partial, table_path)
    return so_path


def remove_other_numba_caches(print_: str) -> None:
    """Remove the numba cache folders of other fingerprints from the cache directory (`compiled.numba_cache_dir`):
    their sources were edited or replaced, so nothing reads them again. Folders of any other name are left. Also
    removes the numba cache files that versions before the per-fingerprint folders wrote into this project's own
    `__pycache__` folders (`*.nbi`, `*.nbc`: only numba writes those)."""
    import shutil

    keep = compiled.numba_cache_dir(print_)
    for folder in keep.parent.glob(compiled.NUMBA_CACHE_PREFIX + "*"):
        if folder.name != keep.name and folder.is_dir():
            shutil.rmtree(folder, ignore_errors=True)
    for package in _PACKAGES:
        for place, _, files in os.walk(_package_root() / package):
            if os.path.basename(place) == "__pycache__":
                for name in files:
                    if name.endswith((".nbi", ".nbc")):
                        with contextlib.suppress(OSError):
                            os.unlink(os.path.join(place, name))


def compile_bytecode() -> bool:
    """Write the byte code of this project's modules into their `__pycache__` folders (those not already up
    to date); True if every module was written or current. A tree that cannot be written is left as it is:
    Python then compiles in memory, as before."""
    import compileall

    root = _package_root()
    return all(compileall.compile_dir(root / package, quiet=2, workers=1) for package in _PACKAGES)


def _warm_up_apart() -> None:
    """Run the warm-up in a process of its own (`--warm-up-only`), which fills numba's cache and exits: the
    memory of numba's compiles (~320 MiB at its peak) is gone before the module's build, which then loads the
    kernels from that cache (~1 s, ~170 MiB) instead of adding ~90 MiB to it. Raises if that process fails;
    stops it if this one is stopped."""
    import subprocess

    command = [sys.executable, "-m", "cleaner.kernel_cache", "--warm-up-only"]
    with subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL) as warm_up:  # stderr: ours
        try:
            code = warm_up.wait()
        except BaseException:
            warm_up.terminate()  # it removes its scratch directory on SIGTERM
            warm_up.wait()
            raise
    if code != 0:
        raise RuntimeError(f"the warm-up process failed (exit {code})")


def _child(jit_only: bool, warm_up_only: bool = False) -> None:
    """Compile every kernel under numba, build the module (unless `jit_only`, and when this machine can), then
    write the stamp; with `warm_up_only`, only compile (into numba's cache). Everything temporary is made in one
    scratch directory, removed on SIGTERM too."""
    import tempfile

    os.environ[compiled.MODE_ENV] = "jit"  # before any kernel module is imported: the build needs numba's kernels
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))  # unwinds the scratch directory
    fingerprint = compiled.fingerprint()
    with tempfile.TemporaryDirectory(prefix="logcleaner-kernels-") as scratch:
        tempfile.tempdir = scratch  # the warm-up's logs, pycc's build directory and ours
        if not jit_only and not warm_up_only:
            _warm_up_apart()  # compiled in another process: this one then loads numba's cache
        _warm_up()
        if warm_up_only:
            return
        if not jit_only:
            marker = failed_marker(fingerprint)
            try:
                build_module(compiled.cache_dir(), fingerprint)
                marker.unlink(missing_ok=True)
            except Exception as exc:  # noqa: BLE001 - no compiler, no headers, a pycc limit: numba's cache serves
                reason = f"{type(exc).__name__}: {str(exc).strip().splitlines()[-1] if str(exc).strip() else ''}"
                print(f"the kernels' module was not built ({reason}); numba's cache serves", file=sys.stderr)
                marker.write_text(reason + "\n")
    compile_bytecode()
    remove_other_numba_caches(fingerprint)
    stamp = stamp_path()
    stamp.parent.mkdir(parents=True, exist_ok=True)
    tmp_stamp = stamp.with_name(stamp.name + f".{os.getpid()}.tmp")
    tmp_stamp.write_text(fingerprint + "\n")
    os.replace(tmp_stamp, stamp)


if __name__ == "__main__":
    _child(jit_only="--jit-only" in sys.argv[1:], warm_up_only="--warm-up-only" in sys.argv[1:])
