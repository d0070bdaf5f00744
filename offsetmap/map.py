"""The fixed-memory key -> latest-offset map of one cleaning round (Kafka's SkimpyOffsetMap, 24 bytes a slot).

Owns `OffsetMap` and the sizing rules around it: how a dedupe buffer is split across cleaner threads
(`per_thread_memory_bytes`), how many slots a byte budget buys (`floor(memory_bytes / 24)`), how many keys
a round may index (`capacity = floor(slots x load_factor)`) and the budget needed for a given key count
(`memory_bytes_for_keys`). The compiled loops live in `_kernels.py`; this module validates every argument
before calling them. It must not grow, must not allocate anything proportional to the number of keys (but for a
growing region's passage, below, at most 64 MiB and freed at once), must not read files or the clock, and must
not be shared between threads (one map per cleaner thread, as in Kafka).

Semantics, matched to Kafka's `SkimpyOffsetMap` + `Cleaner.buildOffsetMap`:

* A key is identified by its 128-bit MurmurHash3 x64 hash (`hashing.py`) under the map's 32-bit `seed`; two
  keys with the same hash are the same key (Kafka has the same theoretical silent loss with MD5/SHA-256 digests).
  Setting a new seed each round (`reset(seed)`) keeps such a collision from repeating forever.
* `put` overwrites the offset of a known key (size unchanged) or takes a new slot (size + 1); `get` returns the
  stored offset or -1; there is no delete; `clear()` empties the same memory and resets `latest_offset` to -1;
  `utilization = size / slots`.
* Offsets only go forward: within a bulk call they must be non-decreasing and none may be below
  `latest_offset` (OffsetOrderError otherwise, before anything is written). Entries are applied in input order,
  so when a key repeats inside one call the last (highest-offset) entry wins.
* Fill limit: a new key is admitted only while `size < capacity`. A bulk insert stops at the first entry whose
  key is new and does not fit, and returns how many entries it consumed, so the cleaner cleans up to
  `latest_offset` and continues from there next round (KAFKA-3894). Entries for known keys are always
  consumed. This is a deliberate refinement of Kafka, whose `buildOffsetMapForSegment` checks
  `map.size() < maxDesiredMapSize` before every put and so also stops on a known key once the map is full; here a
  round gets as far as it can without evicting anything, which is never less far than Kafka.
* `latest_offset` is the offset of the last entry consumed by a put or bulk insert (null-key records consumed
  by `insert_key_spans` included), or the value given to `advance_latest_offset` (Kafka's `updateLatestOffset`,
  used by the cleaner for a batch's last offset and to skip offset gaps, KAFKA-8764); -1 when empty.
* Kafka refuses to start a cleaner whose map cannot hold more than one key (`slots x load_factor > 1`); the
  constructor applies the same rule.

Memory: one uint64 table of `3 x slots` words, `nbytes == slots x 24` exactly, and beside it one tag byte a slot
(`tags`; 1/24 more, outside the budget, which buys Kafka's slot count), each reserved once in the
constructor as an anonymous private mapping (page-aligned, so a bucket of 8 slots is exactly three cache lines)
and reused by `clear`/`reset`. An empty slot is all zero bits, so the fresh mapping is an empty table that costs
no memory until a slot is written; the mapping asks for transparent huge pages (`MADV_HUGEPAGE`: 512x fewer page
faults and TLB misses on random probes), and `clear` hands the written pages back to the kernel
(`MADV_DONTNEED`, the tags' too; they read as zeros again) instead of writing zeros over the whole table. So a
daemon's resident memory between rounds holds no map, and a round pays only for the pages it touches. Where `madvise` is
not available the table is filled with zeros instead.

Per round, `reset(seed, expected_keys)` may narrow the probing to the first `active_slots` slots, enough for
`expected_keys` new keys under the load factor (the cleaner passes the dirty section's offset span, an upper
bound on its keys): a round over a small dirty section then touches a small part of the table, its probes stay
in fewer pages, and it admits at least `expected_keys` keys, so it stops no earlier than with the whole table.
Within that part, keys first go to a region of `_REGION_START_SLOTS` slots, which doubles (its keys moved by the
`rehash` kernel) each time it is half full, until it is the whole active part. The offset span overstates the keys of a log that updates its keys (W2: 8 M records of 1 M keys
size an 8.9 M-slot part, 213 MB): the pages a fresh process first touches cost ~1 ms per MB on the bench
machine, 0.2 s of W2's survey, where the keys need 1-2 M slots. A growth's keys pass through the slots past the
active part or, where there are not enough of them (a part that is the whole table), a temporary array of at
most `_PASSAGE_BYTES_MAX`; the region doubles only while its next growth's keys fit one of them, and otherwise
becomes the whole part at once. A growth's memory (the old region and the passage, at most a quarter of the
table) stays under the table's size, so a round never holds more than probing the whole part made it hold. The
fill limit is always the active part's: which keys a round admits, and where it stops, do not depend on the
region, only where the keys sit in the table does.
Parts: with `reset(..., parts=P)`, a region below the active part is split into P parts of whole buckets, and a
key lives in the part its hash's low 32 bits choose (`_kernels.part_of`; the bucket choice uses the high bits), so
that P threads can insert a window at once, each only its own part's keys, in input order, into its own part's
slots (`insert_hashes(run=...)`, the kernel `insert_part`; the superseded offsets' bitmap takes atomic ORs). A
part grows the whole region when it is half full. The parts are filled in any order only while no entry of the
call can be refused (size + entries <= active_capacity): the map then ends the same whatever the order, since
a key's entries all go to one part in input order. Otherwise, and before `put` and `insert_key_spans`, the keys
move into one part of the same region (`_unsplit`) and the call runs in input order, so a round stops exactly
where an unsplit map stops. The whole active part is always one part. Lookups take the parts into account; what
a caller sees does not depend on them.
`slots`, `capacity` and `utilization` describe the whole table whatever the active part (utilization is what
tells an operator whether the dedupe buffer is big enough). Apart from the arrays a caller passes in and the
lookup results it asks for, calls allocate only a fixed 256-byte ring.
"""

from __future__ import annotations

import functools
import logging
import math
import mmap
import numbers
import operator
from collections.abc import Callable, Sequence

import numpy as np

from . import _inputs
from ._compiled import BUCKET_SLOTS, WORDS_PER_SLOT, kernels
from .errors import OffsetMapConfigError, OffsetMapFullError, OffsetMapInputError, OffsetOrderError
from .hashing import hash_key

# `insert_hashes`' `run`: runs the calls for a map's parts at once and returns their results in order
Runner = Callable[[Sequence[Callable[[], tuple[int, int]]]], list[tuple[int, int]]]

__all__ = [
    "BYTES_PER_SLOT",
    "LOAD_FACTOR_DEFAULT",
    "OffsetMap",
    "PARTS_MAX",
    "PER_THREAD_MEMORY_BYTES_MAX",
    "SLOTS_MAX",
    "memory_bytes_for_keys",
    "per_thread_memory_bytes",
]

_log = logging.getLogger(__name__)

BYTES_PER_SLOT = WORDS_PER_SLOT * 8  # 16-byte hash + 8-byte offset
LOAD_FACTOR_DEFAULT = 0.9  # Kafka's log.cleaner.io.buffer.load.factor default
PER_THREAD_MEMORY_BYTES_MAX = 2**31 - 1  # Kafka caps each thread's share of the dedupe buffer at Int.MaxValue
SLOTS_MAX = 2**32 - 1  # bucket choice reduces 32 hash bits; ~103 GB, far above any per-thread budget
_TABLE_ALIGN_BYTES = 64
_NO_PREVIOUS = np.empty(0, dtype=np.int64)  # insert_hashes' "track nothing"
_NO_BITS = np.empty(0, dtype=np.uint8)  # insert_hashes' "mark nothing"
# A round's probed part starts at this many slots (1.5 MiB) and doubles whenever it is half full (see the module
# docstring): a round touches memory for the keys it finds, not for the records it may find.
_REGION_START_SLOTS = 1 << 16
_GROW_DIVISOR = 2
PARTS_MAX = 64  # a round's regions split into at most this many parts (one thread each)
_PASSAGE_BYTES_MAX = 64 * 2**20  # a growth's keys pass through a temporary array this big at most


def per_thread_memory_bytes(dedupe_buffer_bytes: int, threads: int) -> int:
    """Each cleaner thread's offset-map budget: `min(dedupe_buffer_bytes // threads, 2**31 - 1)`, as Kafka.

    Requires `dedupe_buffer_bytes` (log.cleaner.dedupe.buffer.size) >= 0 and `threads` (log.cleaner.threads)
    >= 1. Logs a warning when the cap discards memory, as Kafka does. Kafka's broker additionally rejects
    configurations where the per-thread share is not above 1 MiB; that is the config validator's job, not this
    function's. Raises OffsetMapConfigError for out-of-range arguments.
    """
    total = _integer("dedupe_buffer_bytes", dedupe_buffer_bytes)
    count = _integer("threads", threads)
    if total < 0:
        raise OffsetMapConfigError("dedupe_buffer_bytes", dedupe_buffer_bytes, "expected >= 0")
    if count < 1:
        raise OffsetMapConfigError("threads", threads, "expected at least one cleaner thread")
    share = total // count
    if share > PER_THREAD_MEMORY_BYTES_MAX:
        _log.warning(
            "offset map memory capped per thread dedupe_buffer_bytes=%d threads=%d share_bytes=%d "
            "used_bytes=%d (Kafka cannot use more than 2 GiB of dedupe buffer per cleaner thread)",
            total,
            count,
            share,
            PER_THREAD_MEMORY_BYTES_MAX,
        )
    return min(share, PER_THREAD_MEMORY_BYTES_MAX)


def memory_bytes_for_keys(keys: int, load_factor: float = LOAD_FACTOR_DEFAULT) -> int:
    """The smallest memory budget whose map can index `keys` distinct keys in one round.

    Requires keys >= 1 and 0 < load_factor <= 1. Ensures
    `OffsetMap(memory_bytes_for_keys(k, f), f).capacity >= k` and that one slot less would not do (for k = 1
    the result also satisfies Kafka's `slots x load_factor > 1`). Raises OffsetMapConfigError.
    """
    count = _integer("keys", keys)
    factor = _load_factor(load_factor)
    if count < 1:
        raise OffsetMapConfigError("keys", keys, "expected at least one key")
    slots = max(1, math.ceil(count / factor))
    # capacity is computed in floating point exactly as Kafka does; step to the exact boundary.
    while _capacity(slots, factor) < count or not slots * factor > 1:
        slots += 1
    while slots > 1 and _capacity(slots - 1, factor) >= count and (slots - 1) * factor > 1:
        slots -= 1
    if slots > SLOTS_MAX:
        raise OffsetMapConfigError("keys", keys, f"needs {slots} slots, above the limit of {SLOTS_MAX}")
    return slots * BYTES_PER_SLOT


class OffsetMap:
    """Key hash -> latest offset, in a fixed table of `floor(memory_bytes / 24)` slots of 24 bytes.

    Not thread-safe: one map per cleaner thread. Bulk calls release the GIL while they run.
    """

    __slots__ = (
        "_active",
        "_active_capacity",
        "_active_slots",
        "_buckets_all",
        "_buckets_choice",
        "_capacity",
        "_latest_offset",
        "_limit",
        "_load_factor",
        "_mapping",
        "_memory_bytes",
        "_part_sizes",
        "_parts",
        "_region_slots",
        "_seed",
        "_size",
        "_slots",
        "_split",
        "_table",
        "_tags",
        "_tags_mapping",
    )

    def __init__(self, memory_bytes: int, load_factor: float = LOAD_FACTOR_DEFAULT, seed: int = 0) -> None:
        """Allocate the table once.

        Requires memory_bytes >= 24 (one slot) with `floor(memory_bytes / 24) <= SLOTS_MAX`,
        0 < load_factor <= 1, `slots x load_factor > 1` (Kafka's startup rule) and 0 <= seed <= SEED_MAX.
        Ensures an empty map: size 0, latest_offset -1. Raises OffsetMapConfigError naming the argument.
        """
        budget = _integer("memory_bytes", memory_bytes)
        factor = _load_factor(load_factor)
        self._seed = _inputs.seed_value(seed)
        slots = budget // BYTES_PER_SLOT if budget >= 0 else 0
        if slots < 1:
            raise OffsetMapConfigError(
                "memory_bytes", memory_bytes, f"expected at least {BYTES_PER_SLOT} bytes (one slot)"
            )
        if slots > SLOTS_MAX:
            raise OffsetMapConfigError(
                "memory_bytes", memory_bytes, f"expected at most {SLOTS_MAX * BYTES_PER_SLOT} bytes ({SLOTS_MAX} slots)"
            )
        if not slots * factor > 1:
            raise OffsetMapConfigError(
                "memory_bytes",
                memory_bytes,
                f"{slots} slots x load factor {factor} must exceed 1 or no round could make progress "
                "(increase log.cleaner.dedupe.buffer.size or decrease log.cleaner.threads)",
            )
        self._memory_bytes = budget
        self._load_factor = factor
        self._slots = slots
        self._capacity = _capacity(slots, factor)
        self._mapping, self._table = _allocate_table(slots)
        self._tags_mapping, self._tags = _allocate_tags(slots)
        self._size = 0
        self._latest_offset = -1
        self._split = 1
        self._part_sizes = [0]
        self._use_slots(slots)

    # -------------------------------------------------------------------------------------------- read-only

    @property
    def memory_bytes(self) -> int:
        """The budget given to the constructor (at most 23 bytes of it are unused)."""
        return self._memory_bytes

    @property
    def load_factor(self) -> float:
        return self._load_factor

    @property
    def slots(self) -> int:
        """`floor(memory_bytes / 24)`."""
        return self._slots

    @property
    def capacity(self) -> int:
        """Distinct keys one round may index: `floor(slots x load_factor)`."""
        return self._capacity

    @property
    def active_slots(self) -> int:
        """Slots this round may probe: all of them unless `reset` was given fewer expected keys (it probes a region
        of them that doubles as keys arrive: see the module docstring)."""
        return self._active_slots

    @property
    def parts(self) -> int:
        """Parts the probed slots are split into now: those `reset` asked for while the round's keys sit in a
        region smaller than the active part, else 1 (see "Parts" in the module docstring)."""
        return self._parts

    @property
    def active_capacity(self) -> int:
        """Distinct keys this round may index: `floor(active_slots x load_factor)` (== capacity by default)."""
        return self._active_capacity

    @property
    def size(self) -> int:
        """Distinct keys held."""
        return self._size

    def __len__(self) -> int:
        return self._size

    @property
    def utilization(self) -> float:
        """`size / slots`, as Kafka reports it (max-buffer-utilization-percent is this x 100)."""
        return self._size / self._slots

    @property
    def latest_offset(self) -> int:
        """Last offset consumed by put/insert or set by advance_latest_offset; -1 when empty."""
        return self._latest_offset

    @property
    def seed(self) -> int:
        """The MurmurHash3 seed keys are hashed with; change it with `reset(seed)`."""
        return self._seed

    @property
    def nbytes(self) -> int:
        """Bytes held by the table: exactly `slots x 24`."""
        return self._table.nbytes

    @property
    def table(self) -> np.ndarray:
        """Read-only (slots, 3) uint64 view of the table: columns h1, h2, offset + 1 (0 = empty slot)."""
        view = self._table.reshape(self._slots, WORDS_PER_SLOT).view()
        view.flags.writeable = False
        return view

    @property
    def tags(self) -> np.ndarray:
        """Read-only uint8 view of the slots' tags, one a slot: 0 for an empty slot, else the low byte of its h1 (1
        where that byte is 0). The kernels read a bucket's 8 tags as one word and compare the table's words only
        where a tag matches (docs/design.md, "The table and its kernels")."""
        view = self._tags.view(np.uint8)[: self._slots]
        view.flags.writeable = False
        return view

    def __repr__(self) -> str:
        return (
            f"OffsetMap(slots={self._slots}, capacity={self._capacity}, active_slots={self._active_slots}, size={self._size}, "
            f"latest_offset={self._latest_offset}, seed={self._seed})"
        )

    # -------------------------------------------------------------------------------------------- single key

    def put(self, key: bytes | bytearray | memoryview, offset: int) -> None:
        """Map `key` to `offset` (overwriting a known key) and make `offset` the latest offset.

        Requires `offset >= max(latest_offset, 0)`. Raises OffsetOrderError if not, OffsetMapFullError if the
        key is new and the map already holds `capacity` keys (then nothing changes), OffsetMapInputError for a
        key that is not bytes-like.
        """
        value = _inputs.offset_value(offset)
        floor = max(self._latest_offset, 0)
        if value < floor:
            raise OffsetOrderError(0, value, floor)
        h1, h2 = hash_key(key, self._seed)
        k = kernels()
        self._unsplit()
        while True:
            status, size = k.put_one(
                self._active,
                self._tags,
                self._region_slots,
                self._buckets_choice,
                self._buckets_all,
                self._parts,
                np.uint64(h1),
                np.uint64(h2),
                value,
                self._size,
                self._limit,
            )
            if status != k.STATUS_FULL or not self._grow_if_due():
                break
        if status == k.STATUS_FULL:
            raise OffsetMapFullError(self._size, self._active_capacity)
        self._size = int(size)
        self._latest_offset = value

    def get(self, key: bytes | bytearray | memoryview) -> int:
        """The offset last put for `key`, or -1 if the map does not hold it."""
        h1, h2 = hash_key(key, self._seed)
        return int(
            kernels().get_one(
                self._active, self._tags, self._region_slots, self._buckets_choice, self._buckets_all, self._parts,
                np.uint64(h1), np.uint64(h2),
            )
        )

    def advance_latest_offset(self, offset: int) -> None:
        """Set `latest_offset` without inserting (Kafka's updateLatestOffset: a batch's last offset, a gap).

        Requires `offset >= latest_offset` and offset >= 0; raises OffsetOrderError otherwise.
        """
        value = _inputs.offset_value(offset)
        floor = max(self._latest_offset, 0)
        if value < floor:
            raise OffsetOrderError(0, value, floor)
        self._latest_offset = value

    # -------------------------------------------------------------------------------------------- bulk

    def insert_hashes(
        self, h1: np.ndarray, h2: np.ndarray, offsets: np.ndarray, previous: np.ndarray | None = None,
        superseded: tuple[np.ndarray, int] | None = None, run: Runner | None = None,
    ) -> int:
        """Insert `(h1[i], h2[i]) -> offsets[i]` in input order; return the number of entries consumed.

        Requires equal-length 1-D arrays: h1/h2 uint64 (int64 is reinterpreted) hashed with this map's `seed`,
        offsets integer, non-decreasing, none below `max(latest_offset, 0)`; `previous`, if given, a writable
        contiguous int64 array of the same length.
        Ensures: entries [0, consumed) are applied, a repeated key keeping its last offset; consumed == len unless
        entry `consumed` holds a new key while size == active_capacity, in which case that entry and all after it
        are untouched; latest_offset = offsets[consumed - 1] when consumed > 0; previous[i] (i < consumed) is the
        offset entry i replaced, -1 for a new key (the offsets a round's later records supersede). With
        `superseded` = (bits, start), a writable contiguous uint8 array and an int, every offset a consumed entry
        replaced that lies in [start, start + 8 * len(bits)) also has its bit set in `bits` (`_kernels.mark_offset`:
        the bitmap the cleaner keeps, made in the same pass instead of from `previous` afterwards).
        While the map is split into parts (`reset(..., parts=P)`), `run`, given one call per part, runs them at
        once (on threads of the caller's) and returns their results in order; without it they run one after
        another. The result is the same either way (see "Parts" in the module docstring).
        Raises OffsetOrderError / OffsetMapInputError before writing anything.
        """
        words1 = _inputs.hash_words("h1", h1)
        words2 = _inputs.hash_words("h2", h2)
        offs = _inputs.int64_vector("offsets", offsets)
        count = _inputs.same_length(h1=words1, h2=words2, offsets=offs)
        replaced = _NO_PREVIOUS if previous is None else _output(previous, count)
        bits, bits_start = (_NO_BITS, 0) if superseded is None else _inputs.bitmap(*superseded)
        if count == 0:
            return 0
        _inputs.check_offsets(offs, max(self._latest_offset, 0))
        if self._parts > 1:
            if self._size + count <= self._active_capacity:  # no entry can be refused: parts in any order
                return self._insert_parts(words1, words2, offs, replaced, bits, bits_start, run)
            self._unsplit()  # an entry may be refused: in input order, in one part
        return self._insert_growing(count, offs, lambda done: kernels().insert_hashes(
            self._active, self._tags, self._region_slots, self._buckets_choice, self._buckets_all, self._parts,
            words1[done:], words2[done:], offs[done:], self._size, self._limit, replaced[done:], bits, bits_start,
        ))

    def lookup_hashes(self, h1: np.ndarray, h2: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """Offsets stored for `(h1[i], h2[i])`, -1 where absent, as an int64 array (`out` if given).

        Requires equal-length 1-D uint64 (or int64) arrays hashed with this map's `seed`; `out`, if given, a
        writable contiguous int64 array of the same length. Raises OffsetMapInputError.
        """
        words1 = _inputs.hash_words("h1", h1)
        words2 = _inputs.hash_words("h2", h2)
        count = _inputs.same_length(h1=words1, h2=words2)
        result = _output(out, count)
        kernels().lookup_hashes(
            self._active, self._tags, self._region_slots, self._buckets_choice, self._buckets_all, self._parts, words1,
            words2, result,
        )
        return result

    def insert_key_spans(
        self,
        buf: np.ndarray | bytes | bytearray | memoryview,
        key_pos: np.ndarray,
        key_len: np.ndarray,
        offsets: np.ndarray,
    ) -> int:
        """Hash the keys at byte spans of `buf` (no copies) and insert them; return the entries consumed.

        Requires `buf` a 1-D uint8 array or bytes-like object; key_pos/key_len/offsets of equal length; each
        key_len -1 (null key) or a span inside `buf`; offsets as for `insert_hashes` (null-key records included).
        Ensures the same as `insert_hashes` with the keys hashed under `seed`, except that null-key records are
        consumed without being inserted (and can set latest_offset when they are the last consumed entry).
        Raises KeySpanError / OffsetOrderError / OffsetMapInputError before writing anything.
        """
        buffer = _inputs.byte_buffer(buf)
        positions = _inputs.int64_vector("key_pos", key_pos)
        lengths = _inputs.length_vector("key_len", key_len)
        offs = _inputs.int64_vector("offsets", offsets)
        count = _inputs.same_length(key_pos=positions, key_len=lengths, offsets=offs)
        if count == 0:
            return 0
        _inputs.check_spans(buffer, positions, lengths)
        _inputs.check_offsets(offs, max(self._latest_offset, 0))
        self._unsplit()
        return self._insert_growing(count, offs, lambda done: kernels().insert_spans(
            self._active, self._tags, self._region_slots, self._buckets_choice, self._buckets_all, self._parts,
            buffer, positions[done:],
            lengths[done:], offs[done:], np.uint64(self._seed), self._size, self._limit,
        ))

    def lookup_key_spans(
        self,
        buf: np.ndarray | bytes | bytearray | memoryview,
        key_pos: np.ndarray,
        key_len: np.ndarray,
        out: np.ndarray | None = None,
    ) -> np.ndarray:
        """Offsets stored for the keys at byte spans of `buf`, -1 where absent and for every null key.

        Requires the same spans as `insert_key_spans`; `out` as for `lookup_hashes`.
        Raises KeySpanError / OffsetMapInputError.
        """
        buffer = _inputs.byte_buffer(buf)
        positions = _inputs.int64_vector("key_pos", key_pos)
        lengths = _inputs.length_vector("key_len", key_len)
        count = _inputs.same_length(key_pos=positions, key_len=lengths)
        _inputs.check_spans(buffer, positions, lengths)
        result = _output(out, count)
        kernels().lookup_spans(
            self._active,
            self._tags,
            self._region_slots,
            self._buckets_choice,
            self._buckets_all,
            self._parts,
            buffer,
            positions,
            lengths,
            np.uint64(self._seed),
            result,
        )
        return result

    # -------------------------------------------------------------------------------------------- rounds

    def clear(self) -> None:
        """Empty the map in place (same memory): size 0, latest_offset -1, seed and active slots unchanged.

        The written pages go back to the kernel (they read as zeros again; see the module docstring).
        """
        if self._mapping is not None and _MADV_DONTNEED is not None:
            self._mapping.madvise(_MADV_DONTNEED)
        else:
            self._table.fill(kernels().EMPTY_OFFSET_WORD)
        if self._tags_mapping is not None and _MADV_DONTNEED is not None:
            self._tags_mapping.madvise(_MADV_DONTNEED)
        else:
            self._tags.fill(0)
        self._size = 0
        self._part_sizes = [0] * self._split
        self._latest_offset = -1

    def reset(self, seed: int, expected_keys: int | None = None, parts: int = 1) -> None:
        """Clear the map and hash keys with `seed` from now on (a new seed per round).

        With `expected_keys`, probe only the first `active_slots` slots, the fewest (whole buckets) that admit
        at least `min(expected_keys, capacity)` keys under the load factor; with None, the whole table. With
        `parts` > 1, the round's regions below the active part are split into that many parts, which
        `insert_hashes` fills on as many threads (its `run`).
        Requires 0 <= seed <= SEED_MAX, expected_keys >= 0 and 1 <= parts <= PARTS_MAX; raises
        OffsetMapConfigError (and leaves the map untouched) otherwise.
        """
        value = _inputs.seed_value(seed)
        split = _integer("parts", parts)
        if not 1 <= split <= PARTS_MAX:
            raise OffsetMapConfigError("parts", parts, f"expected 1 to {PARTS_MAX}")
        slots = self._slots
        if expected_keys is not None:
            wanted = _integer("expected_keys", expected_keys)
            if wanted < 0:
                raise OffsetMapConfigError("expected_keys", expected_keys, "expected a count >= 0")
            if wanted < self._capacity:
                slots = _slots_for_keys(max(wanted, 2), self._load_factor, self._slots)
        self._split = split
        self.clear()
        self._seed = value
        self._use_slots(slots)

    # -------------------------------------------------------------------------------------------- private

    def _use_slots(self, slots: int) -> None:
        """Let this round probe up to the first `slots` slots (the table was just cleared), from its first region."""
        self._active_slots = slots
        self._active_capacity = min(_capacity(slots, self._load_factor), self._capacity)
        split = self._split
        start = split * -(-_REGION_START_SLOTS // (split * BUCKET_SLOTS)) * BUCKET_SLOTS  # whole buckets a part
        if 2 * start <= slots and _grow_limit(start) <= self._passage_slots():
            self._use_region(start, split)
        else:
            self._use_region(slots, 1)

    def _use_region(self, slots: int, parts: int) -> None:
        """Probe the first `slots` slots: the whole active part (in one part), or a smaller region that
        `_grow_if_due` doubles, in `parts` parts of whole buckets."""
        self._region_slots = slots
        self._parts = parts
        self._active = self._table[: slots * WORDS_PER_SLOT]
        if parts > 1:
            self._buckets_choice = np.uint64(slots // (parts * BUCKET_SLOTS))
            self._buckets_all = slots // (parts * BUCKET_SLOTS)
        else:
            self._buckets_choice = np.uint64(max(1, slots // BUCKET_SLOTS))
            self._buckets_all = -(-slots // BUCKET_SLOTS)
        whole = slots == self._active_slots
        self._limit = self._active_capacity if whole else min(_grow_limit(slots), self._active_capacity)

    def _insert_parts(self, words1: np.ndarray, words2: np.ndarray, offs: np.ndarray, replaced: np.ndarray,
                      bits: np.ndarray, bits_start: int, run: Runner | None) -> int:
        """`insert_hashes` of entries none of which can be refused, into a map split into parts: each part's
        entries in input order, the parts at once (`run`) while the map is split, growing the region between
        calls; after a growth to the whole active part (one part), each part's remaining entries in turn."""
        k = kernels()
        count = len(offs)
        split = self._parts
        starts = [0] * split
        sizes = self._part_sizes  # the keys in each part (a key's part depends on the number of parts only)
        todo = list(range(split))
        while todo:
            if self._parts == split:  # each call writes only its own part's slots
                calls = [functools.partial(
                    k.insert_part, self._active, self._tags, self._region_slots, self._buckets_choice,
                    self._buckets_all, split, split, p, words1, words2, offs, starts[p],
                    self._part_limit() - sizes[p], replaced, bits, bits_start) for p in todo]
                results = run(calls) if run is not None and len(calls) > 1 else [call() for call in calls]
                for p, (stop, added) in zip(todo, results, strict=True):
                    starts[p], sizes[p] = int(stop), sizes[p] + int(added)
                    self._size += int(added)
            else:  # one part now: the rest of each part's entries in turn, on this thread
                for p in todo:
                    stop, added = k.insert_part(
                        self._active, self._tags, self._region_slots, self._buckets_choice, self._buckets_all,
                        self._parts, split, p, words1, words2, offs, starts[p], self._limit - self._size, replaced,
                        bits, bits_start)
                    starts[p] = int(stop)
                    self._size += int(added)
            todo = [p for p in todo if starts[p] < count]
            if todo and not self._grow_if_due():
                raise AssertionError(f"offset map split insert stopped at {self._size} keys of "
                                     f"{self._active_capacity} with entries left")
        return self._consumed(count, self._size, offs)

    def _unsplit(self) -> None:
        """Put the keys of a map split into parts into one part of the same region (the layout every kernel but
        `insert_part` expects of a map it may fill)."""
        if self._parts > 1:
            self._move(self._region_slots, 1)

    def _insert_growing(self, count: int, offsets: np.ndarray, insert: Callable[[int], tuple[int, int]]) -> int:
        """Run `insert(done)`, a kernel inserting entries `done`.. into the region under `_limit` and returning
        (consumed, size), until all `count` entries are consumed or the map is full, growing the region between
        calls; returns the entries consumed."""
        done = 0
        while True:
            consumed, size = insert(done)
            done, self._size = done + int(consumed), int(size)
            if done == count or not self._grow_if_due():
                return self._consumed(done, self._size, offsets)

    def _grow_if_due(self) -> bool:
        """Grow the region when its keys (or a part's) reached its limit below the active part's; False if not
        (a full map)."""
        old = self._region_slots
        if old == self._active_slots:
            return False
        if self._size < self._limit and (self._parts == 1 or max(self._part_sizes) < self._part_limit()):
            return False
        new = 2 * old
        if new >= self._active_slots or _grow_limit(new) > self._passage_slots():
            self._move(self._active_slots, 1)  # the next growth's keys would have no passage: the whole part now
        else:
            self._move(new, self._parts)
        return True

    def _part_limit(self) -> int:
        """Keys a part of the region holds before the region doubles."""
        return _grow_limit(self._region_slots // self._parts)

    def _move(self, new: int, parts: int) -> None:
        """Rehash the keys into a region of the first `new` slots in `parts` parts (the part sizes stay: a key's
        part depends on the number of parts only, and a round's regions have its number or one)."""
        words = self._size * WORDS_PER_SLOT
        spare = self._table[self._active_slots * WORDS_PER_SLOT:]
        passage = spare[:words] if len(spare) >= words else np.zeros(words, dtype=np.uint64)
        old = self._region_slots
        self._use_region(new, parts)
        moved = int(kernels().rehash(self._table, self._tags, old, new, self._buckets_choice, self._buckets_all, parts,
                                     passage))
        if moved != self._size:
            raise AssertionError(f"offset map growth moved {moved} of {self._size} keys")

    def _passage_slots(self) -> int:
        """How many keys a growth can move: the slots past the active part, or a temporary array of at most
        `_PASSAGE_BYTES_MAX` where there are fewer of them (a map probing the whole table has none)."""
        return max(self._slots - self._active_slots, _PASSAGE_BYTES_MAX // BYTES_PER_SLOT)

    def _consumed(self, consumed: int, size: int, offsets: np.ndarray) -> int:
        assert 0 <= consumed <= offsets.size, "kernel consumed more entries than it was given"
        assert size <= self._active_capacity, "kernel broke the fill limit"
        self._size = size
        if consumed > 0:
            self._latest_offset = int(offsets[consumed - 1])
        return consumed


def _integer(name: str, value: object) -> int:
    if isinstance(value, bool):
        raise OffsetMapConfigError(name, value, "expected an integer, found bool")
    try:
        return operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        raise OffsetMapConfigError(name, value, "expected an integer") from None


def _load_factor(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise OffsetMapConfigError("load_factor", value, "expected a number")
    factor = float(value)
    if not (math.isfinite(factor) and 0.0 < factor <= 1.0):
        raise OffsetMapConfigError("load_factor", value, "expected 0 < load_factor <= 1")
    return factor


def _capacity(slots: int, factor: float) -> int:
    # Kafka: (map.slots * dupBufferLoadFactor).toInt -- a double product truncated.
    return int(slots * factor)


def _grow_limit(region_slots: int) -> int:
    """Keys a region below the active part holds before it doubles."""
    return region_slots // _GROW_DIVISOR


def _slots_for_keys(keys: int, factor: float, slots_max: int) -> int:
    """The fewest whole buckets of slots whose capacity under `factor` is at least `keys` (at most slots_max)."""
    bucket = BUCKET_SLOTS
    slots = -(-math.ceil(keys / factor) // bucket) * bucket
    while _capacity(slots, factor) < keys:
        slots += bucket
    return min(slots, slots_max)


def _allocate_table(slots: int) -> tuple[mmap.mmap | None, np.ndarray]:
    """(mapping, 64-byte aligned zeroed uint64 array of 3 x slots words, nbytes == slots x 24).

    An anonymous private mapping, asking for transparent huge pages; a plain zeroed numpy array (mapping None)
    where anonymous mappings are not available.
    """
    table_bytes = slots * BYTES_PER_SLOT
    try:
        mapping = mmap.mmap(-1, table_bytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    except (AttributeError, OSError, ValueError):  # pragma: no cover - platforms without anonymous mmap
        mapping = None
    if mapping is None:  # pragma: no cover
        table = np.zeros(table_bytes // 8, dtype=np.uint64)
    else:
        if _MADV_HUGEPAGE is not None:
            try:
                mapping.madvise(_MADV_HUGEPAGE)
            except OSError:  # pragma: no cover - kernels without THP
                pass
        table = np.frombuffer(mapping, dtype=np.uint64)
    assert table.ctypes.data % _TABLE_ALIGN_BYTES == 0 and table.nbytes == table_bytes
    return mapping, table


def _allocate_tags(slots: int) -> tuple[mmap.mmap | None, np.ndarray]:
    """(mapping, zeroed uint64 array of one word a bucket: the tag bytes of `slots` slots, the short tail bucket's
    word whole). An anonymous private mapping (4 KiB pages: a 256 MiB table's tags are 11 MiB, probed a byte at a
    time), a plain zeroed numpy array (mapping None) where anonymous mappings are not available."""
    words = -(-slots // BUCKET_SLOTS)
    try:
        mapping = mmap.mmap(-1, words * 8, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    except (AttributeError, OSError, ValueError):  # pragma: no cover - platforms without anonymous mmap
        return None, np.zeros(words, dtype=np.uint64)
    return mapping, np.frombuffer(mapping, dtype=np.uint64)


_MADV_HUGEPAGE = getattr(mmap, "MADV_HUGEPAGE", None)
_MADV_DONTNEED = getattr(mmap, "MADV_DONTNEED", None)


def _output(out: np.ndarray | None, count: int) -> np.ndarray:
    if out is None:
        return np.empty(count, dtype=np.int64)
    if not isinstance(out, np.ndarray) or out.dtype != np.int64 or out.ndim != 1:
        raise OffsetMapInputError("out", "expected a 1-D int64 array")
    if out.size != count:
        raise OffsetMapInputError("out", f"expected {count} elements, found {out.size}")
    if not (out.flags.c_contiguous and out.flags.writeable):
        raise OffsetMapInputError("out", "expected a writable contiguous array")
    return out
