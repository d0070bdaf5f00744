"""Where a compiled kernel comes from: the ahead-of-time module built for this installation, or numba's JIT.

Owns the decorators every kernel module uses instead of numba's (`njit`, `intrinsic`, `external`) and the
choice between two sources of the same machine code:
* **ahead of time** (the default once built): `cleaner.kernel_cache` compiles every kernel a round calls into
  one extension module (numba's `pycc`, with the GIL released around each call), stored beside numba's cache
  under a name holding the sources' fingerprint (`fingerprint()`). Loading it takes well under a millisecond
  and a few hundred KiB, where importing numba and loading its cache costs ~0.3 s of held GIL and ~110 MiB;
* **numba's JIT** (its on-disk cache): when no module matches these sources, `LOGCLEANER_KERNELS=jit` is set,
  or a kernel is called with arguments its exported signature does not take (another dtype, a non-contiguous
  or read-only array where the kernel writes). Then numba is imported, every kernel made so far gets its
  numba object, and those objects replace the placeholders in the kernel modules' globals, so that numba
  compiles the kernels that call them as before. Each kernel is the same Python source either way.

The choice is made once per process, at the first kernel module imported. Details and measurements:
docs/design.md, "Compiled kernels ahead of time".
"""

from __future__ import annotations

import functools
import hashlib
import importlib.machinery
import importlib.util
import json
import logging
import os
import platform
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

__all__ = [
    "AOT_PREFIX",
    "MODE_ENV",
    "NUMBA_CACHE_PREFIX",
    "Kernel",
    "aot_files",
    "aot_module",
    "cache_dir",
    "export_name",
    "variant_name",
    "external",
    "fingerprint",
    "fingerprint_of",
    "intrinsic",
    "mode",
    "module_state",
    "njit",
    "numba_cache_dir",
    "numba_loaded",
]

# "auto" (the built module when it matches, else the JIT), "jit", or "aot": the built module or an error, and an
# error where a kernel would fall back to the JIT (what the tests use to show the module serves every call)
MODE_ENV = "LOGCLEANER_KERNELS"
AOT_PREFIX = "logcleaner_kernels_"  # the extension module's name: this prefix and 16 hex digits of the fingerprint
NUMBA_CACHE_PREFIX = "numba-"  # numba's cache for one fingerprint: a folder of this prefix and its 16 hex digits
_PACKAGES = ("segments", "offsetmap", "cleaner")
log = logging.getLogger(__name__)  # the kernels, and every module whose constants they freeze
_lock = threading.RLock()


def _package_root() -> Path:
    return Path(__file__).resolve().parents[2]


def cache_dir() -> Path:
    """Where numba's cache, the kernels' stamp and the built module live: NUMBA_CACHE_DIR if set, else the
    kernels' own `__pycache__`."""
    configured = os.environ.get("NUMBA_CACHE_DIR")
    if configured:
        return Path(configured)
    return Path(__file__).resolve().parent / "__pycache__"


def numba_cache_dir(print_: str | None = None) -> Path:
    """Where numba caches the kernels compiled from sources of fingerprint `print_` (default: these sources): a
    folder of `cache_dir()` per fingerprint. numba stamps a cached kernel with its own file only, so a kernel
    that inlines a helper from another module (the recopy kernels inline the codec's header writer and the map's
    bitmap reader) would keep the helper's old code after an edit of the helper's file alone; with the folder
    named by the fingerprint of all three packages, an edit of any of them starts an empty cache."""
    return cache_dir() / f"{NUMBA_CACHE_PREFIX}{(print_ or fingerprint())[:16]}"


def fingerprint() -> str:
    """What compiled code depends on, for this process's sources (computed once per process)."""
    if not _fingerprints:
        _fingerprints.append(fingerprint_of(_package_root()))
    return _fingerprints[0]


def fingerprint_of(root: Path) -> str:
    """The fingerprint of the sources under `root`: every module of the three packages by name, size and mtime
    (as numba stamps a kernel's file), numba's version, the Python and the CPU."""
    digest = hashlib.sha256()
    for package in _PACKAGES:
        for name in _modules(root, package):
            st = os.stat(os.path.join(root, name))
            digest.update(f"{name} {st.st_size} {st.st_mtime_ns}\n".encode())
    spec = importlib.util.find_spec("numba")
    if spec is not None and spec.origin:
        st = Path(spec.origin).stat()
        digest.update(f"numba {spec.origin} {st.st_size} {st.st_mtime_ns}\n".encode())
    digest.update(sys.version.encode())
    digest.update(platform.machine().encode())
    digest.update(_cpu_text().encode()[:8192])
    return digest.hexdigest()


def _modules(root: Path, package: str) -> list[str]:
    """The `.py` files under `root/package`, as sorted paths relative to `root` (`os.walk`: a third of
    `Path.rglob`'s time, paid by every process that loads the kernels)."""
    found: list[str] = []
    for folder, _, files in os.walk(os.path.join(root, package)):
        relative = os.path.relpath(folder, root)
        found.extend(os.path.join(relative, f) for f in files if f.endswith(".py"))
    return sorted(found)


_fingerprints: list[str] = []  # this process's, once computed (a source edited later is the next process's)


@functools.cache
def _cpu_text() -> str:
    try:
        cpu = Path("/proc/cpuinfo").read_text(errors="replace")
    except OSError:
        return platform.processor()
    return "".join(line for line in cpu.splitlines(True) if line.startswith(("model name", "flags")))


def cpu_has(flag: str) -> bool:
    """Whether /proc/cpuinfo lists `flag` (e.g. "sse4_2") for this CPU: what the built module was made for."""
    return any(flag in line.split() for line in _cpu_text().splitlines() if line.startswith("flags"))


def aot_files(print_: str | None = None) -> tuple[Path, Path]:
    """The built module's file and its signature table for fingerprint `print_` (default: these sources)."""
    name = AOT_PREFIX + (print_ or fingerprint())[:16]
    suffix = importlib.machinery.EXTENSION_SUFFIXES[0]
    folder = cache_dir()
    return folder / f"{name}{suffix}", folder / f"{name}.json"


def export_name(module: str, name: str) -> str:
    """The name of kernel `name` of module `module` in the built module's signature table."""
    return f"{module.replace('.', '_')}__{name}"


def variant_name(symbol: str, index: int) -> str:
    """The built module's function for signature `index` of the kernel `symbol` names."""
    return f"{symbol}__{index}"


# ---- the choice, once per process ---------------------------------------------------------------------------

_decided: list[tuple[ModuleType | None, dict[str, list[list[list[Any]]]]]] = []
_jit_mode: list[Any] = []  # numba, once the process has switched to it
_lazies: list[_Lazy] = []


_MODES = ("auto", "jit", "aot")


def mode() -> str:
    """`LOGCLEANER_KERNELS`, in lower case ("auto" when unset; an unknown value is warned about once and taken as
    "auto")."""
    value = os.environ.get(MODE_ENV, "auto").strip().lower() or "auto"
    if value not in _MODES:
        if not _warned:
            _warned.append(value)
            log.warning("%s=%r is not one of %s: taken as auto", MODE_ENV, os.environ.get(MODE_ENV),
                        ", ".join(_MODES))
        return "auto"
    return value


_warned: list[str] = []


def module_state(print_: str | None = None) -> tuple[str, dict[str, Any] | None]:
    """("valid", its table) when the built module for fingerprint `print_` (default: these sources) and its
    signature table are there and the module's bytes are the ones the table records (SHA-256: a truncated or
    damaged file is never loaded, it would crash the process); ("missing", None) or ("invalid", None) else."""
    so_path, table_path = aot_files(print_)
    key = str(so_path)
    if key in _valid:  # `ensure_compiled` and the first kernel module both ask: the module is hashed once
        return "valid", _valid[key]
    try:
        if not so_path.exists() and not table_path.exists():
            return "missing", None
        table = json.loads(table_path.read_text())
        data = so_path.read_bytes()
        if not (isinstance(table, dict) and isinstance(table.get("kernels"), dict)
                and table.get("sha256") == hashlib.sha256(data).hexdigest()):
            return "invalid", None
        for variants in table["kernels"].values():  # the shape `Kernel` needs, checked before any is made
            for spec in variants:
                _array_checks(spec)
        _valid[key] = table
        return "valid", table
    except (OSError, ValueError, TypeError, KeyError, IndexError, AttributeError):
        return "invalid", None


_valid: dict[str, dict[str, Any]] = {}  # module path -> table, once found valid (missing or invalid may be rebuilt)


def _load_aot() -> tuple[ModuleType | None, dict[str, list[list[list[Any]]]]]:
    chosen = mode()
    if chosen == "jit":
        return None, {}
    state, table = module_state()
    if table is None:
        if chosen == "aot":
            raise RuntimeError(f"{MODE_ENV}=aot: the kernels' module for these sources is {state} "
                               f"({aot_files()[0]})")
        return None, {}
    try:
        so_path = aot_files()[0]
        name = so_path.name.split(".", 1)[0]
        spec = importlib.util.spec_from_file_location(name, so_path)
        if spec is None or spec.loader is None:
            return None, {}
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module, table["kernels"]
    except (OSError, ImportError, ValueError):
        return None, {}


def aot_module() -> ModuleType | None:
    """The built module this process uses (None: numba's JIT); decided at the first call."""
    if not _decided:
        with _lock:
            if not _decided:
                _decided.append(_load_aot())
    return _decided[0][0]


def numba_loaded() -> bool:
    """Whether this process has switched to numba's JIT (every kernel is then numba's)."""
    return bool(_jit_mode)


def _numba() -> Any:
    """Switch the process to numba's JIT: give every placeholder its numba object and put it in the kernel
    modules' globals in the placeholder's place. Returns numba."""
    if _jit_mode:
        return _jit_mode[0]
    with _lock:
        if not _jit_mode:
            if mode() == "aot":
                raise RuntimeError(f"{MODE_ENV}=aot: a kernel needs numba's JIT")
            numba = _import_numba()
            for lazy in list(_lazies):
                lazy.real()
            for name, module in list(sys.modules.items()):
                if module is None or name.split(".", 1)[0] not in _PACKAGES:
                    continue
                namespace = vars(module)
                for key, value in list(namespace.items()):
                    if isinstance(value, _Lazy):
                        namespace[key] = value.real()
            _jit_mode.append(numba)
    return _jit_mode[0]


def _import_numba() -> Any:
    import numba  # the JIT: loaded only when no built module serves a kernel

    return numba


def _numba_njit(fn: Callable[..., Any], signature: tuple[Any, ...], options: dict[str, Any]) -> Any:
    """numba.njit(*signature, **options)(fn); without the on-disk cache when numba has nowhere to write it
    (NUMBA_CACHE_DIR and the sources' `__pycache__` not writable): compiled in this process then, every time."""
    numba = _import_numba()
    if options.get("cache"):  # read when the dispatcher is made, which picks its cache folder then
        numba.config.CACHE_DIR = str(numba_cache_dir())
    try:
        return numba.njit(*signature, **options)(fn)
    except RuntimeError as exc:
        if not options.get("cache") or "cannot cache" not in str(exc):
            raise
        if not _warned_cache:
            _warned_cache.append(str(exc))
            log.warning("numba cannot cache the kernels (%s); compiling them in this process without a cache", exc)
        return numba.njit(*signature, **dict(options, cache=False))(fn)


_warned_cache: list[str] = []


class _Lazy:
    """A placeholder for a numba object, made by `real()` when the process switches to the JIT."""

    __slots__ = ("_made", "_make")

    def __init__(self, make: Callable[[], Any]) -> None:
        self._make = make
        self._made: list[Any] = []
        _lazies.append(self)

    def real(self) -> Any:
        if not self._made:
            self._made.append(self._make())
        return self._made[0]


class Kernel(_Lazy):
    """A kernel of the built module: calls the built function of the first exported signature its arguments
    match, else numba's dispatcher of the same function (compiled, or loaded from numba's cache, then)."""

    __slots__ = ("_variants", "py_func")

    def __init__(self, fn: Callable[..., Any], signature: tuple[Any, ...], options: dict[str, Any],
                 variants: list[tuple[Any, tuple[int, tuple[tuple[int, np.dtype, int, bool], ...]]]]) -> None:
        super().__init__(lambda: _numba_njit(fn, signature, options))
        self.py_func = fn
        self._variants = variants

    def __call__(self, *args: Any) -> Any:
        count = len(args)
        for function, (arity, arrays) in self._variants:  # every call passes here: kept to a few µs
            if count != arity:
                continue
            for i, dtype, ndim, writes in arrays:
                arg = args[i]
                if not isinstance(arg, np.ndarray) or arg.ndim != ndim or (arg.dtype is not dtype and arg.dtype != dtype):
                    break
                flags = arg.flags
                if not flags.c_contiguous or (writes and not flags.writeable):
                    break
            else:
                return function(*args)
        if mode() == "aot":
            kinds = ", ".join(f"{a.dtype}[{a.ndim}d{'' if a.flags.c_contiguous else ' strided'}"
                              f"{'' if a.flags.writeable else ' read-only'}]" if isinstance(a, np.ndarray)
                              else type(a).__name__ for a in args)
            raise RuntimeError(f"{MODE_ENV}=aot: {self!r} has no built variant for ({kinds})")
        _numba()
        return self.real()(*args)

    def __repr__(self) -> str:
        return f"<kernel {self.py_func.__module__}.{self.py_func.__qualname__}>"


def _array_checks(spec: list[list[Any]]) -> tuple[int, tuple[tuple[int, np.dtype, int, bool], ...]]:
    """(the number of arguments, and per array argument: its index, dtype, ndim and whether the kernel may write
    to it); a call matches where every array argument is a C-contiguous array of that dtype and ndim, writable
    if written (scalars are converted by the built function)."""
    return len(spec), tuple((i, np.dtype(arg[1]), int(arg[2]), not arg[3]) for i, arg in enumerate(spec)
                            if arg[0] == "array")


# numba options of a kernel that allocates no array: no reference counting at all (numba's `_nrt=False`). numba
# counts references to every array a function hands to an inlined helper or a call; where the helper branches, or is
# called per batch, the counts stay in the per-record loops as calls and atomic operations (NRT_incref/NRT_decref:
# 6-8% of a W2 clean's CPU, bench/RESULTS.md, eighteenth round). A kernel with them off must not allocate (numba
# refuses to compile one that does) nor return an array; the views it makes live only inside it. The AOT build
# compiles such a kernel with them off too (`cleaner.kernel_cache.build_module`).
BARE = {"_nrt": False}


def bare(dispatcher: Any) -> bool:
    """Whether a numba dispatcher was made with `BARE` (no reference counting)."""
    return dispatcher.targetoptions.get("_nrt", True) is False


def njit(*signature: Any, **options: Any) -> Callable[[Callable[..., Any]], Any]:
    """numba.njit(*signature, **options), or, when the built module serves this process, a `Kernel` (the built function
    for an exported kernel; the placeholder of one that only other kernels call)."""

    def decorate(fn: Callable[..., Any]) -> Any:
        if _jit_mode or aot_module() is None:
            _numba()
            return _numba_njit(fn, signature, options)
        symbol = export_name(fn.__module__, fn.__name__)
        module, table = _decided[0]
        variants = [(getattr(module, variant_name(symbol, i)), _array_checks(spec))
                    for i, spec in enumerate(table.get(symbol, ())) if hasattr(module, variant_name(symbol, i))]
        return Kernel(fn, signature, options, variants)

    return decorate


def intrinsic(fn: Callable[..., Any]) -> Any:
    """numba.extending.intrinsic(fn); a placeholder while the built module serves the process."""

    def make() -> Any:
        from numba.extending import intrinsic as numba_intrinsic

        return numba_intrinsic(fn)

    if _jit_mode or aot_module() is None:
        _numba()
        return make()
    return _Lazy(make)


def external(make: Callable[[], Any]) -> Any:
    """`make()` (a numba object such as an ExternalFunction, made with numba imported); a placeholder while
    the built module serves the process."""
    if _jit_mode or aot_module() is None:
        _numba()
        return make()
    return _Lazy(make)
