"""offsetmap: the cleaner's fixed-memory key -> latest-offset map (Kafka's SkimpyOffsetMap, 24 bytes a slot).

Owns the memory of one cleaning round: how many distinct keys a round can deduplicate is the map's capacity.
A map is one numpy table allocated once from a byte budget (`log.cleaner.dedupe.buffer.size` split across
cleaner threads): `floor(memory_bytes / 24)` slots of a 16-byte seeded MurmurHash3 x64 128 hash of the key plus
an 8-byte offset. It never grows, holds no per-key Python objects, and stops admitting new keys at
`floor(slots x log.cleaner.io.buffer.load.factor)`.

This package is numpy + mmh3 + numba. numba compiles the per-record loops (bulk insert and lookup, hashing keys
in place in segment buffers) with `cache=True`, so compilation is cached on disk and not repeated at every
process start; the project allows numba for these hot loops (see `_kernels.py`). The package must not read or
write files, read the clock, start threads or know the record format: callers hand it hashes or byte spans.

Public API: `OffsetMap`, `hash_key`, `hash_key_spans`, `hash_key_rows`, `per_thread_memory_bytes`,
`memory_bytes_for_keys`, the limits and the errors below. Everything else is private.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # for type checkers; at run time each name is imported at its first use (`__getattr__`)
    from .errors import (
        KeySpanError,
        OffsetMapConfigError,
        OffsetMapError,
        OffsetMapFullError,
        OffsetMapInputError,
        OffsetOrderError,
    )
    from .hashing import SEED_MAX, hash_key, hash_key_rows, hash_key_spans
    from .map import (
        BYTES_PER_SLOT,
        LOAD_FACTOR_DEFAULT,
        PER_THREAD_MEMORY_BYTES_MAX,
        SLOTS_MAX,
        OffsetMap,
        memory_bytes_for_keys,
        per_thread_memory_bytes,
    )

# The public names and the modules they live in. The package imports none of them itself (PEP 562): importing
# `offsetmap.errors` must not load numba with the kernels (the start-up of `logcleaner`, issue 19).
_SOURCES = {
    ".errors": (
        "KeySpanError", "OffsetMapConfigError", "OffsetMapError", "OffsetMapFullError", "OffsetMapInputError",
        "OffsetOrderError",
    ),
    ".hashing": ("SEED_MAX", "hash_key", "hash_key_rows", "hash_key_spans"),
    ".map": (
        "BYTES_PER_SLOT", "LOAD_FACTOR_DEFAULT", "PER_THREAD_MEMORY_BYTES_MAX", "SLOTS_MAX", "OffsetMap",
        "memory_bytes_for_keys", "per_thread_memory_bytes",
    ),
}
_MODULE_OF = {name: module for module, names in _SOURCES.items() for name in names}


def __getattr__(name: str) -> object:
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value  # once: later lookups do not come here
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_MODULE_OF})


__all__ = [
    "BYTES_PER_SLOT",
    "KeySpanError",
    "LOAD_FACTOR_DEFAULT",
    "OffsetMap",
    "OffsetMapConfigError",
    "OffsetMapError",
    "OffsetMapFullError",
    "OffsetMapInputError",
    "OffsetOrderError",
    "PER_THREAD_MEMORY_BYTES_MAX",
    "SEED_MAX",
    "SLOTS_MAX",
    "hash_key",
    "hash_key_rows",
    "hash_key_spans",
    "memory_bytes_for_keys",
    "per_thread_memory_bytes",
]
