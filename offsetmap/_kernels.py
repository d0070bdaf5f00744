"""Compiled hot loops of the offset map: MurmurHash3 x64 128 over byte spans, and the hash-table kernels.

Owns every per-record loop of `offsetmap`: hashing keys in place in a segment buffer, bulk and single insert
and lookup in the table, and the input checks that must run over whole arrays; and the layout of the bitmap of
replaced offsets a bulk insert marks (`mark_offset`, read with `offset_marked` by the recopy's `decide_window`).
It holds no state: the table, its tags (one byte a slot, eight a bucket in one word: `_tag_of`), its geometry
and the map's counters are passed in and the new counters are returned. It must not allocate anything
proportional to the table or to the number of keys (the span kernels use a fixed 256-byte ring per call), do
I/O, log, or validate arguments (`map.py` and `hashing.py` do that before calling in; these kernels trust their
inputs and numba does not bounds-check).

Every kernel is `@compiled.njit(cache=True, nogil=True)`, without reference counting (`compiled.BARE`) but for
the span kernels, whose ring is an array of their own, and all compiled code of the map stays in this one file:
numba's on-disk cache checks only the source file of the function it caches, and a stale hash function means
silent data loss (the cache is also one folder per fingerprint of the sources: `compiled.numba_cache_dir`).
A table may be probed in parts (`part_of`), which `insert_part` fills one a thread (`map.py`, "Parts").
The table layout and its tags, the two-choice bucket probing (what a caller sees is only put/get semantics,
Kafka's), hashing in place, prefetching, and why numba: see docs/design.md, "The table and its kernels".
"""

from __future__ import annotations

import sys

import numpy as np

from segments.codec import compiled
from segments.codec._intrinsics import element_pointer, prefetch

__all__ = [
    "BUCKET_SLOTS",
    "EMPTY_OFFSET_WORD",
    "PREFETCH_DISTANCE",
    "STATUS_FULL",
    "STATUS_INSERTED",
    "STATUS_UPDATED",
    "WORDS_PER_SLOT",
    "check_offsets",
    "check_spans",
    "get_one",
    "hash_rows",
    "hash_spans",
    "insert_hashes",
    "insert_part",
    "insert_spans",
    "lookup_hashes",
    "lookup_spans",
    "mark_offset",
    "offset_marked",
    "part_of",
    "put_one",
    "rehash",
]

WORDS_PER_SLOT = 3  # h1, h2, offset: 3 x 8 = 24 bytes per slot
BUCKET_SLOTS = 8  # 8 x 24 = 192 bytes = three 64-byte cache lines
EMPTY_OFFSET_WORD = np.uint64(0)  # offset word of an empty slot; an occupied one holds offset + 1
_ONE = np.uint64(1)
PREFETCH_DISTANCE = 16  # entries ahead whose candidate buckets' tag words are prefetched
_SLOT_PREFETCH_DISTANCE = 6  # entries ahead whose likely slot (read from the tags, cached by then) is prefetched

STATUS_UPDATED = 0  # the key was present; its offset was overwritten
STATUS_INSERTED = 1  # a new key took a free slot
STATUS_FULL = 2  # a new key did not fit under the fill limit; nothing was written

_BUCKET_WORDS = BUCKET_SLOTS * WORDS_PER_SLOT
_LINE_WORDS = 8  # 64-byte cache line / 8-byte word
_LITTLE_ENDIAN = sys.byteorder == "little"  # compile-time constant: word loads need no byte swap

# MurmurHash3_x64_128 constants (Austin Appleby, public domain reference implementation).
_C1 = np.uint64(0x87C3_7B91_1142_53D5)
_C2 = np.uint64(0x4CF5_AD43_2745_937F)
_FMIX1 = np.uint64(0xFF51_AFD7_ED55_8CCD)
_FMIX2 = np.uint64(0xC4CE_B9FE_1A85_EC53)
_ADD1 = np.uint64(0x52DC_E729)
_ADD2 = np.uint64(0x3849_5AB5)
_FIVE = np.uint64(5)
_ZERO = np.uint64(0)
# Shift amounts as uint64 so numba keeps every expression in uint64 (mixing int64 in would give float64).
_S8 = np.uint64(8)
_S16 = np.uint64(16)
_S24 = np.uint64(24)
_S27 = np.uint64(27)
_S31 = np.uint64(31)
_S32 = np.uint64(32)
_S33 = np.uint64(33)
_S37 = np.uint64(37)
_S40 = np.uint64(40)
_S48 = np.uint64(48)
_S56 = np.uint64(56)
_LOW32 = np.uint64(0xFFFF_FFFF)
# Tags: one byte a slot, 0 for an empty slot, else the low byte of h1 (1 where that byte is 0), eight a bucket in
# one word; the masks find the bytes of a word equal to a tag, and the zero bytes, without a loop.
_TAG_BYTE = np.uint64(0xFF)
_TAG_ONES = np.uint64(0x0101_0101_0101_0101)
_TAG_LOW7 = np.uint64(0x7F7F_7F7F_7F7F_7F7F)
_S3 = np.uint64(3)


@compiled.intrinsic
def _atomic_or_u8(typingctx, array, index, value):
    """`array[index] |= value` as one atomic read-modify-write (a uint8 array that other threads also write)."""
    from numba import types

    if not isinstance(array, types.Array) or array.dtype != types.uint8 or not isinstance(index, types.Integer):
        return None
    signature = types.void(array, index, value)

    def codegen(context, builder, sig, args):
        byte = context.cast(builder, args[2], sig.args[2], types.uint8)
        builder.atomic_rmw("or", element_pointer(context, builder, sig, args), byte, "monotonic")
        return context.get_dummy_value()

    return signature, codegen


@compiled.intrinsic
def _trailing_zeros(typingctx, value):
    """`llvm.cttz` of a uint64 that is not 0: the index of its lowest set bit."""
    from llvmlite import ir  # compile time only: the body runs when numba types a caller
    from numba import types
    from numba.core import cgutils

    if value != types.uint64:
        return None
    signature = types.uint64(value)

    def codegen(context, builder, sig, args):
        i64 = ir.IntType(64)
        function_type = ir.FunctionType(i64, [i64, ir.IntType(1)])
        function = cgutils.get_or_insert_function(builder.module, function_type, "llvm.cttz.i64")
        return builder.call(function, [args[0], ir.IntType(1)(1)])  # 0 is never passed: undefined there

    return signature, codegen


# ------------------------------------------------------------------------------------------------ murmur3


@compiled.intrinsic
def _load_u64_unaligned(typingctx, array, index):
    """The 8 bytes at `array[index:index + 8]` as one native-endian uint64 (one unaligned load)."""
    from llvmlite import ir  # compile time only: the body runs when numba types a caller
    from numba import types

    if not isinstance(array, types.Array) or not isinstance(index, types.Integer):
        return None
    signature = types.uint64(array, index)

    def codegen(context, builder, sig, args):
        word_pointer = builder.bitcast(element_pointer(context, builder, sig, args), ir.IntType(64).as_pointer())
        return builder.load(word_pointer, align=1)

    return signature, codegen


@compiled.njit(inline="always")
def _load64_le(buf, p):
    """Little-endian uint64 from bytes buf[p:p+8]; the caller guarantees p + 8 <= buf.size."""
    if _LITTLE_ENDIAN:
        return _load_u64_unaligned(buf, p)
    return (
        np.uint64(buf[p])
        | (np.uint64(buf[p + 1]) << _S8)
        | (np.uint64(buf[p + 2]) << _S16)
        | (np.uint64(buf[p + 3]) << _S24)
        | (np.uint64(buf[p + 4]) << _S32)
        | (np.uint64(buf[p + 5]) << _S40)
        | (np.uint64(buf[p + 6]) << _S48)
        | (np.uint64(buf[p + 7]) << _S56)
    )


@compiled.njit(inline="always")
def _fmix64(k):
    k ^= k >> _S33
    k *= _FMIX1
    k ^= k >> _S33
    k *= _FMIX2
    k ^= k >> _S33
    return k


@compiled.njit(inline="always")
def _murmur3_x64_128(buf, pos, length, seed_word):
    """MurmurHash3_x64_128 of `buf[pos:pos+length]` with a 32-bit seed; returns (h1, h2) as mmh3 does."""
    h1 = seed_word
    h2 = seed_word
    p = pos
    for _ in range(length >> 4):
        k1 = _load64_le(buf, p)
        k2 = _load64_le(buf, p + 8)
        k1 *= _C1
        k1 = (k1 << _S31) | (k1 >> _S33)
        k1 *= _C2
        h1 ^= k1
        h1 = (h1 << _S27) | (h1 >> _S37)
        h1 += h2
        h1 = h1 * _FIVE + _ADD1
        k2 *= _C2
        k2 = (k2 << _S33) | (k2 >> _S31)
        k2 *= _C1
        h2 ^= k2
        h2 = (h2 << _S31) | (h2 >> _S33)
        h2 += h1
        h2 = h2 * _FIVE + _ADD2
        p += 16
    tail = length & 15
    if tail > 0:
        # Tail bytes as whole-word loads that end exactly at the key's last byte (they may re-read bytes of the
        # key before the tail, never bytes outside it), shifted down to the tail bytes. Keys shorter than 8
        # bytes have no such word and are assembled byte by byte.
        if length >= 8:
            if tail > 8:
                k1 = _load64_le(buf, p)
                k2 = _load64_le(buf, p + tail - 8) >> np.uint64(8 * (16 - tail))
                k2 *= _C2
                k2 = (k2 << _S33) | (k2 >> _S31)
                k2 *= _C1
                h2 ^= k2
            else:
                k1 = _load64_le(buf, p + tail - 8) >> np.uint64(8 * (8 - tail))
        else:
            k1 = _ZERO
            for j in range(tail - 1, -1, -1):
                k1 = (k1 << _S8) | np.uint64(buf[p + j])
        k1 *= _C1
        k1 = (k1 << _S31) | (k1 >> _S33)
        k1 *= _C2
        h1 ^= k1
    n = np.uint64(length)
    h1 ^= n
    h2 ^= n
    h1 += h2
    h2 += h1
    h1 = _fmix64(h1)
    h2 = _fmix64(h2)
    h1 += h2
    h2 += h1
    return h1, h2


@compiled.njit(cache=True, nogil=True, **compiled.BARE)
def check_spans(buffer_bytes, key_pos, key_len):
    """Index of the first span not inside a buffer of `buffer_bytes` bytes (length -1 is a null key), or -1."""
    for i in range(key_pos.size):
        length = np.int64(key_len[i])
        if length == -1:
            continue
        position = key_pos[i]
        if length < -1 or position < 0 or position > buffer_bytes - length:
            return i
    return -1


@compiled.njit(cache=True, nogil=True, **compiled.BARE)
def hash_spans(buf, key_pos, key_len, seed_word, out_h1, out_h2):
    """Hash each key span in place in `buf`; a null key (length -1) gets (0, 0). Spans must be checked."""
    for i in range(key_pos.size):
        length = np.int64(key_len[i])
        if length < 0:
            out_h1[i] = _ZERO
            out_h2[i] = _ZERO
        else:
            a, b = _murmur3_x64_128(buf, key_pos[i], length, seed_word)
            out_h1[i] = a
            out_h2[i] = b


@compiled.njit(cache=True, nogil=True, **compiled.BARE)
def hash_rows(buf_a, buf_b, key_pos, key_len, rows, in_b, seed_word, out_h1, out_h2):
    """Hash the key spans `rows[j]` in place, in `buf_b` where `in_b[j]`, else in `buf_a`; a null key (length -1)
    gets (0, 0). Checks as it goes: returns -1, or the first j whose row is not an index of the spans or whose
    span is not inside its buffer (entries before it are hashed)."""
    for j in range(rows.size):
        r = rows[j]
        if r < 0 or r >= key_pos.size:
            return j
        length = np.int64(key_len[r])
        position = key_pos[r]
        if length == -1:
            out_h1[j] = _ZERO
            out_h2[j] = _ZERO
            continue
        if in_b[j]:
            if length < -1 or position < 0 or position > buf_b.size - length:
                return j
            a, b = _murmur3_x64_128(buf_b, position, length, seed_word)
        else:
            if length < -1 or position < 0 or position > buf_a.size - length:
                return j
            a, b = _murmur3_x64_128(buf_a, position, length, seed_word)
        out_h1[j] = a
        out_h2[j] = b
    return -1


@compiled.njit(cache=True, nogil=True, **compiled.BARE)
def check_offsets(offsets, offset_min):
    """Index of the first offset below `offset_min` or below its predecessor, or -1 if they all pass."""
    previous = offset_min
    for i in range(offsets.size):
        offset = offsets[i]
        if offset < previous:
            return i
        previous = offset
    return -1


# ------------------------------------------------------------------------------------------------ table


@compiled.njit(inline="always")
def _bucket_of(hash_word, buckets_choice):
    # Lemire's range reduction on the high 32 bits: buckets_choice < 2**32, so the product fits 64 bits.
    return np.int64(((hash_word >> _S32) * buckets_choice) >> _S32)


@compiled.njit(inline="always")
def part_of(b, parts):
    """The part (0 <= part < parts) of the table a key of second hash word `b` lives in: Lemire's reduction of
    b's low 32 bits, which no bucket choice uses (those take the high 32 bits of each word). 0 for one part."""
    return np.int64(((b & _LOW32) * np.uint64(parts)) >> _S32)


@compiled.njit(inline="always")
def _tag_of(a):
    """The tag of a key whose first hash word is `a`: its low byte, or 1 where that byte is 0 (0 marks an empty
    slot). The bucket choices use the words' high 32 bits and the parts b's low 32 bits, so the tag is independent
    of where the key sits."""
    tag = a & _TAG_BYTE
    return tag if tag != _ZERO else _ONE


@compiled.njit(inline="always")
def _zero_bytes(word):
    """0x80 in each byte of `word` that is 0, 0 in every other byte (exact: no borrow carries into a byte)."""
    return ~(((word & _TAG_LOW7) + _TAG_LOW7) | word | _TAG_LOW7)


@compiled.njit(inline="always")
def _first_byte(mask):
    """The index of the lowest byte of `mask` (not 0) that has a bit set."""
    return np.int64(_trailing_zeros(mask) >> _S3)


@compiled.njit(inline="always")
def _tag_word(stored):
    """A bucket's tag word as stored, with slot k's tag in byte k (bits 8k to 8k + 7): the word itself on a
    little-endian host, byte-swapped on a big-endian one. Takes the word, not the array: an inlined helper that
    takes arrays costs the loops calling it reference counts."""
    if _LITTLE_ENDIAN:  # a compile-time constant
        return stored
    word = _ZERO
    for k in range(BUCKET_SLOTS):
        word = (word << _S8) | ((stored >> np.uint64(8 * k)) & _TAG_BYTE)
    return word


@compiled.njit(inline="always")
def _tag_matches(word, wanted):
    """0x80 in each byte of a bucket's tag word that holds the tag repeated in every byte of `wanted` (an
    occupied slot whose key may be the one looked for)."""
    return _zero_bytes(word ^ wanted) & ~_zero_bytes(word)


@compiled.njit(inline="always")
def _candidates(a, b, buckets_choice, buckets_all, parts):
    """The two candidate buckets of hash (a, b) (they may be equal)."""
    base = part_of(b, parts) * buckets_all
    return base + _bucket_of(a, buckets_choice), base + _bucket_of(b, buckets_choice)


@compiled.njit(inline="always")
def _likely_slot(word1, word2, bucket1, bucket2, a):
    """The slot an insert or lookup of a key with first hash word `a` most likely reads, from its candidate
    buckets' tag words: the first slot of its first bucket with its tag, else of its second, else the first empty
    slot of its first bucket (its last if full). A hint for a prefetch only (on a big-endian host, where
    `_tag_word` swaps the stored bytes, the same slot)."""
    wanted = _tag_of(a) * _TAG_ONES
    match = _tag_matches(word1, wanted)
    if match != _ZERO:
        return bucket1 * BUCKET_SLOTS + _first_byte(match)
    match = _tag_matches(word2, wanted)
    if match != _ZERO:
        return bucket2 * BUCKET_SLOTS + _first_byte(match)
    return bucket1 * BUCKET_SLOTS + _first_byte(_zero_bytes(word1) | (_ONE << np.uint64(63)))


@compiled.njit(inline="always")
def _prefetch_tags(tags, a, b, buckets_choice, buckets_all, parts):
    """Prefetch step one, `PREFETCH_DISTANCE` entries ahead: the tag words of the candidate buckets of (a, b)."""
    c1, c2 = _candidates(a, b, buckets_choice, buckets_all, parts)
    prefetch(tags, c1)
    prefetch(tags, c2)


@compiled.njit(inline="always")
def _prefetch_likely(table, tags, a, b, buckets_choice, buckets_all, parts):
    """Prefetch step two, `_SLOT_PREFETCH_DISTANCE` entries ahead: the table slot (a, b) most likely reads (the
    address clamped to the table)."""
    c1, c2 = _candidates(a, b, buckets_choice, buckets_all, parts)
    slot = _likely_slot(_tag_word(tags[c1]), _tag_word(tags[c2]), c1, c2, a)
    prefetch(table, min(slot * WORDS_PER_SLOT, table.size - 1))


@compiled.njit(inline="always")
def _find(table, tags, slots, buckets_choice, buckets_all, parts, a, b):
    """(slot of key, -1) if present, else (-1, slot where a new key goes), or (-1, -1) if no slot is free.

    The probed slots are `parts` parts of `buckets_all` buckets each (one part: the whole table, as Kafka's); a
    key lives in part `part_of(b, parts)`, in one of two buckets of its part's first `buckets_choice`: a new key
    goes to the less full (the first on a tie), or, both full, overflows into the next buckets of its part after
    the first. One loop scans them all in that order (first, second, then the chain), so that this probe, inlined
    into every insert and lookup loop, holds one bucket scan (three measured ~25% slower inserts, with reference
    counting on)."""
    wanted = _tag_of(a) * _TAG_ONES
    base = part_of(b, parts) * buckets_all
    b1 = base + _bucket_of(a, buckets_choice)
    b2 = base + _bucket_of(b, buckets_choice)  # may equal b1; scanning it twice is harmless
    end = base + buckets_all
    bucket = b1
    empty1 = -1
    for step in range(buckets_all + 1):  # b1, b2, then the buckets after b1 but b1 (a chain of buckets_all - 1)
        word = _tag_word(tags[bucket])
        first = bucket * BUCKET_SLOTS
        match = _tag_matches(word, wanted)
        while match != _ZERO:
            slot = first + _first_byte(match)
            if table[slot * WORDS_PER_SLOT] == a and table[slot * WORDS_PER_SLOT + 1] == b:
                return slot, -1
            match &= match - _ONE
        empty = _zero_bytes(word)
        free = first + _first_byte(empty) if empty != _ZERO else slots
        if free >= slots:  # a full bucket (the short tail bucket's tags past its last slot read as empty)
            free = -1
        if step == 0:
            empty1 = free
            bucket = b2
            continue
        if step == 1:
            if empty1 >= 0 and (free < 0 or empty1 - b1 * BUCKET_SLOTS <= free - b2 * BUCKET_SLOTS):
                return -1, empty1
            if free >= 0:
                return -1, free
            bucket = b1  # both full (they stay full: nothing is deleted): the overflow chain after b1
        elif free >= 0:
            return -1, free
        bucket += 1
        if bucket == end:
            bucket = base
    return -1, -1


@compiled.njit(inline="always")
def _store(table, tag_bytes, slot, a, b, offset_word):
    word = slot * WORDS_PER_SLOT
    table[word] = a
    table[word + 1] = b
    table[word + 2] = offset_word
    tag_bytes[slot] = np.uint8(_tag_of(a))


@compiled.njit(inline="always")
def _lookup_one(table, tags, slots, buckets_choice, buckets_all, parts, a, b):
    found, _ = _find(table, tags, slots, buckets_choice, buckets_all, parts, a, b)
    if found < 0:
        return np.int64(-1)
    return np.int64(table[found * WORDS_PER_SLOT + 2] - _ONE)


# The insert loop (`_insert_entries`) spells out find / overwrite / fill-limit / store inline rather than calling
# a helper that returns a status: that measured ~5-10% faster at 90% fill.


@compiled.njit(cache=True, nogil=True, **compiled.BARE)
def put_one(table, tags, slots, buckets_choice, buckets_all, parts, a, b, offset, size, capacity):
    """Insert or overwrite one hash; returns (status, new size)."""
    tag_bytes = tags.view(np.uint8)
    found, free = _find(table, tags, slots, buckets_choice, buckets_all, parts, a, b)
    if found >= 0:
        table[found * WORDS_PER_SLOT + 2] = np.uint64(offset) + _ONE
        return STATUS_UPDATED, size
    if size >= capacity or free < 0:  # free < 0 only when every slot is taken, i.e. size == slots
        return STATUS_FULL, size
    _store(table, tag_bytes, free, a, b, np.uint64(offset) + _ONE)
    return STATUS_INSERTED, size + 1


@compiled.njit(cache=True, nogil=True, **compiled.BARE)
def get_one(table, tags, slots, buckets_choice, buckets_all, parts, a, b):
    """Offset stored for one hash, or -1."""
    return _lookup_one(table, tags, slots, buckets_choice, buckets_all, parts, a, b)


@compiled.njit(inline="always")
def mark_offset(bits, start, offset, shared):
    """Set `offset`'s bit in the bitmap `bits` of the offsets [start, start + 8 * bits.size) (bit `d & 7` of byte
    `d >> 3`, d = offset - start); an offset outside it is ignored; `shared`: with an atomic OR, for a bitmap
    other threads mark at the same time. The one home of that layout: the index phase's bitmap of superseded
    offsets (`cleaner.indexing.SupersededOffsets`) is read with `offset_marked`."""
    d = offset - start
    if 0 <= d < 8 * bits.size:
        if shared:
            _atomic_or_u8(bits, d >> 3, np.uint8(1 << (d & 7)))
        else:
            bits[d >> 3] |= np.uint8(1 << (d & 7))


@compiled.njit(inline="always")
def offset_marked(bits, start, offset):
    """1 if `offset`'s bit is set in `bits` (as `mark_offset` sets it), 0 if not, -1 outside the bitmap."""
    d = offset - start
    if 0 <= d < 8 * bits.size:
        return np.int8((bits[d >> 3] >> (d & 7)) & 1)
    return np.int8(-1)


@compiled.njit(inline="always")
def _insert_entries(table, tags, tag_bytes, slots, buckets_choice, buckets_all, parts, select_parts, part, h1, h2,
                    offsets, start, room, previous, bits, bits_start, shared):
    """The insert loop of `insert_hashes` and `insert_part` (inlined into each: with one part selected, the
    selection folds away): the entries from `start` whose key is in part `part` of `select_parts`, in order,
    until a new key would be the `room + 1`-th added; returns (the entry it stopped at, or h1.size; keys added).
    `shared`: the bitmap is marked with atomic ORs."""
    n = h1.size
    track = previous.size > 0
    marking = bits.size > 0
    ahead = PREFETCH_DISTANCE * select_parts  # about PREFETCH_DISTANCE of this part's entries ahead
    near = _SLOT_PREFETCH_DISTANCE * select_parts
    for j in range(start, min(n, start + ahead)):
        if part_of(h2[j], select_parts) == part:
            _prefetch_tags(tags, h1[j], h2[j], buckets_choice, buckets_all, parts)
    added = 0
    for i in range(start, n):
        j = i + ahead
        if j < n and part_of(h2[j], select_parts) == part:
            _prefetch_tags(tags, h1[j], h2[j], buckets_choice, buckets_all, parts)
        j = i + near
        if j < n and part_of(h2[j], select_parts) == part:
            _prefetch_likely(table, tags, h1[j], h2[j], buckets_choice, buckets_all, parts)
        b = h2[i]
        if part_of(b, select_parts) != part:
            continue
        a = h1[i]
        found, free = _find(table, tags, slots, buckets_choice, buckets_all, parts, a, b)
        if found >= 0:
            word = found * WORDS_PER_SLOT + 2
            replaced = np.int64(table[word] - _ONE)
            if track:
                previous[i] = replaced
            if marking:
                mark_offset(bits, bits_start, replaced, shared)
            table[word] = np.uint64(offsets[i]) + _ONE
            continue
        if added >= room or free < 0:
            return i, added
        if track:
            previous[i] = -1
        _store(table, tag_bytes, free, a, b, np.uint64(offsets[i]) + _ONE)
        added += 1
    return n, added


@compiled.njit(cache=True, nogil=True, **compiled.BARE)
def insert_hashes(table, tags, slots, buckets_choice, buckets_all, parts, h1, h2, offsets, size, capacity, previous,
                  bits, bits_start):
    """Insert entries in order until one new key does not fit; returns (entries consumed, new size).

    When `previous` has an element per entry, previous[i] is set, for each consumed entry, to the offset the
    entry replaced (-1 for a new key); an empty `previous` asks for nothing. Each offset an entry replaces is
    also marked in the bitmap `bits` of the offsets from `bits_start` (`mark_offset`; an empty `bits`: none).
    """
    consumed, added = _insert_entries(table, tags, tags.view(np.uint8), slots, buckets_choice, buckets_all, parts, 1,
                                      0, h1, h2, offsets, 0, capacity - size, previous, bits, bits_start, False)
    return consumed, size + added


@compiled.njit(cache=True, nogil=True, **compiled.BARE)
def insert_part(table, tags, slots, buckets_choice, buckets_all, parts, select_parts, part, h1, h2, offsets, start,
                room, previous, bits, bits_start):
    """Insert in order the entries from `start` whose key is in part `part` of `select_parts` (`part_of`), until a
    new key would be the `room + 1`-th this call adds; returns (the entry it stopped at, or h1.size; keys added).

    As `insert_hashes` for those entries. Other threads may insert the other parts' entries at the same time: with
    the table in `select_parts` parts of whole buckets (so of whole tag words), a call writes only its own part's
    slots and tags, previous[i] of its own entries, and `bits` with atomic ORs."""
    return _insert_entries(table, tags, tags.view(np.uint8), slots, buckets_choice, buckets_all, parts, select_parts,
                           part, h1, h2, offsets, start, room, previous, bits, bits_start, True)


@compiled.njit(cache=True, nogil=True, **compiled.BARE)
def rehash(table, tags, old_slots, new_slots, buckets_choice, buckets_all, parts, scratch):
    """Move the entries of the first `old_slots` slots into the first `new_slots` (more) slots, each placed as an
    insert places it under the new geometry (`parts` parts of `buckets_all` buckets); returns how many moved (-1 if
    one found no slot, which an old part at most half full cannot cause). The entries pass through `scratch` (3
    words an entry, room for every entry of the old part; outside the first `new_slots` slots, whose tags stay 0),
    which is zero again at the end."""
    tag_bytes = tags.view(np.uint8)
    n = 0
    for slot in range(old_slots):
        word = slot * WORDS_PER_SLOT
        if table[word + 2] != EMPTY_OFFSET_WORD:
            out = n * WORDS_PER_SLOT
            scratch[out] = table[word]
            scratch[out + 1] = table[word + 1]
            scratch[out + 2] = table[word + 2]
            n += 1
    table[: old_slots * WORDS_PER_SLOT] = EMPTY_OFFSET_WORD
    tag_bytes[:old_slots] = 0
    active = table[: new_slots * WORDS_PER_SLOT]
    moved = n
    for j in range(min(n, PREFETCH_DISTANCE)):
        _prefetch_tags(tags, scratch[j * WORDS_PER_SLOT], scratch[j * WORDS_PER_SLOT + 1], buckets_choice,
                       buckets_all, parts)
    for i in range(n):
        j = (i + PREFETCH_DISTANCE) * WORDS_PER_SLOT
        if j < n * WORDS_PER_SLOT:
            _prefetch_tags(tags, scratch[j], scratch[j + 1], buckets_choice, buckets_all, parts)
        j = (i + _SLOT_PREFETCH_DISTANCE) * WORDS_PER_SLOT
        if j < n * WORDS_PER_SLOT:
            _prefetch_likely(active, tags, scratch[j], scratch[j + 1], buckets_choice, buckets_all, parts)
        word = i * WORDS_PER_SLOT
        a = scratch[word]
        b = scratch[word + 1]
        _, free = _find(active, tags, new_slots, buckets_choice, buckets_all, parts, a, b)
        if free < 0:
            moved = -1
            break
        _store(active, tag_bytes, free, a, b, scratch[word + 2])
    scratch[: n * WORDS_PER_SLOT] = EMPTY_OFFSET_WORD
    return moved


@compiled.njit(cache=True, nogil=True, **compiled.BARE)
def lookup_hashes(table, tags, slots, buckets_choice, buckets_all, parts, h1, h2, out):
    """out[i] = offset stored for (h1[i], h2[i]) or -1."""
    n = h1.size
    for j in range(min(n, PREFETCH_DISTANCE)):
        _prefetch_tags(tags, h1[j], h2[j], buckets_choice, buckets_all, parts)
    for i in range(n):
        j = i + PREFETCH_DISTANCE
        if j < n:
            _prefetch_tags(tags, h1[j], h2[j], buckets_choice, buckets_all, parts)
        j = i + _SLOT_PREFETCH_DISTANCE
        if j < n:
            _prefetch_likely(table, tags, h1[j], h2[j], buckets_choice, buckets_all, parts)
        out[i] = _lookup_one(table, tags, slots, buckets_choice, buckets_all, parts, h1[i], h2[i])


@compiled.njit(inline="always")
def _hash_span(buf, key_pos, key_len, seed_word, i):
    length = np.int64(key_len[i])
    if length < 0:
        return _ZERO, _ZERO
    return _murmur3_x64_128(buf, key_pos[i], length, seed_word)


@compiled.njit(cache=True, nogil=True)
def insert_spans(
    table, tags, slots, buckets_choice, buckets_all, parts, buf, key_pos, key_len, offsets, seed_word, size, capacity
):
    """Hash keys in place and insert them; null keys (length -1) are skipped but consumed.

    Returns (entries consumed, new size). Key i + PREFETCH_DISTANCE is hashed (and its buckets' tags prefetched)
    while key i is inserted, so hashing runs while the cache misses are outstanding; the hashes wait in a ring of
    PREFETCH_DISTANCE entries, from which key i + _SLOT_PREFETCH_DISTANCE's likely slot is prefetched.
    """
    tag_bytes = tags.view(np.uint8)
    n = key_pos.size
    ring_h1 = np.empty(PREFETCH_DISTANCE, np.uint64)
    ring_h2 = np.empty(PREFETCH_DISTANCE, np.uint64)
    for j in range(min(n, PREFETCH_DISTANCE)):
        a, b = _hash_span(buf, key_pos, key_len, seed_word, j)
        ring_h1[j] = a
        ring_h2[j] = b
        if key_len[j] >= 0:
            _prefetch_tags(tags, a, b, buckets_choice, buckets_all, parts)
    for i in range(n):
        r = i % PREFETCH_DISTANCE
        a = ring_h1[r]
        b = ring_h2[r]
        j = i + PREFETCH_DISTANCE
        if j < n:  # key j takes ring slot r, which key i has just vacated
            a_next, b_next = _hash_span(buf, key_pos, key_len, seed_word, j)
            ring_h1[r] = a_next
            ring_h2[r] = b_next
            if key_len[j] >= 0:
                _prefetch_tags(tags, a_next, b_next, buckets_choice, buckets_all, parts)
        j = i + _SLOT_PREFETCH_DISTANCE
        if j < n and key_len[j] >= 0:
            q = j % PREFETCH_DISTANCE
            _prefetch_likely(table, tags, ring_h1[q], ring_h2[q], buckets_choice, buckets_all, parts)
        if key_len[i] < 0:
            continue
        found, free = _find(table, tags, slots, buckets_choice, buckets_all, parts, a, b)
        if found >= 0:
            table[found * WORDS_PER_SLOT + 2] = np.uint64(offsets[i]) + _ONE
            continue
        if size >= capacity or free < 0:
            return i, size
        _store(table, tag_bytes, free, a, b, np.uint64(offsets[i]) + _ONE)
        size += 1
    return n, size


@compiled.njit(cache=True, nogil=True)
def lookup_spans(table, tags, slots, buckets_choice, buckets_all, parts, buf, key_pos, key_len, seed_word, out):
    """out[i] = offset stored for the key at span i, or -1 (always -1 for a null key); pipelined as insert_spans."""
    n = key_pos.size
    ring_h1 = np.empty(PREFETCH_DISTANCE, np.uint64)
    ring_h2 = np.empty(PREFETCH_DISTANCE, np.uint64)
    for j in range(min(n, PREFETCH_DISTANCE)):
        a, b = _hash_span(buf, key_pos, key_len, seed_word, j)
        ring_h1[j] = a
        ring_h2[j] = b
        if key_len[j] >= 0:
            _prefetch_tags(tags, a, b, buckets_choice, buckets_all, parts)
    for i in range(n):
        r = i % PREFETCH_DISTANCE
        a = ring_h1[r]
        b = ring_h2[r]
        j = i + PREFETCH_DISTANCE
        if j < n:
            a_next, b_next = _hash_span(buf, key_pos, key_len, seed_word, j)
            ring_h1[r] = a_next
            ring_h2[r] = b_next
            if key_len[j] >= 0:
                _prefetch_tags(tags, a_next, b_next, buckets_choice, buckets_all, parts)
        j = i + _SLOT_PREFETCH_DISTANCE
        if j < n and key_len[j] >= 0:
            q = j % PREFETCH_DISTANCE
            _prefetch_likely(table, tags, ring_h1[q], ring_h2[q], buckets_choice, buckets_all, parts)
        if key_len[i] < 0:
            out[i] = -1
        else:
            out[i] = _lookup_one(table, tags, slots, buckets_choice, buckets_all, parts, a, b)
