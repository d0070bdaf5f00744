"""The compiled kernels (`_kernels.py`), loaded at the first operation that runs one, and the table layout.

Loading the kernels is not free (numba and llvmlite take about 0.35 s to import when the module built ahead of
time does not serve the process: `segments.codec.compiled`). A map is made (its table allocated, its sizing checked) by
commands that may never insert a key — `logcleaner clean` of a log with nothing to clean — so the package
imports without them: `kernels()` imports `_kernels` at the first insert, lookup, span check or span hash,
once per process.

The table's layout (3 words a slot, 8 slots a bucket) is spelled here for the map, which needs it before any
kernel runs, and in `_kernels.py` for the kernels: numba freezes the kernels' module-level ints when it
compiles them and only a change of `_kernels.py` itself invalidates its on-disk cache, so the kernels keep their
own copy. `kernels()` refuses kernels whose layout is not this one.
"""

from __future__ import annotations

import functools
from types import ModuleType

__all__ = ["BUCKET_SLOTS", "WORDS_PER_SLOT", "kernels"]

WORDS_PER_SLOT = 3  # h1, h2, offset: 3 x 8 = 24 bytes per slot
BUCKET_SLOTS = 8  # 8 x 24 = 192 bytes = three 64-byte cache lines


@functools.cache
def kernels() -> ModuleType:
    """The `_kernels` module, imported at the first call. Raises ImportError if its layout is not this one."""
    from . import _kernels  # numba: imported when a kernel first runs, not with the package (start-up)

    if (_kernels.WORDS_PER_SLOT, _kernels.BUCKET_SLOTS) != (WORDS_PER_SLOT, BUCKET_SLOTS):
        raise ImportError(
            f"offsetmap._kernels lays a slot out as {_kernels.WORDS_PER_SLOT} words and a bucket as "
            f"{_kernels.BUCKET_SLOTS} slots, offsetmap._compiled as {WORDS_PER_SLOT} and {BUCKET_SLOTS}"
        )
    return _kernels
