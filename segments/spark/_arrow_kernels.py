"""Compiled per-record loops between Arrow columns and v2 records (numba, cached on disk).

Owns `group_rows` (rows in partition order, a stable counting sort), `encode_runs` (Arrow key/value/timestamp/header columns → the uncompressed records regions of v2 batches,
cut by partition, record count and bytes), `encode_batches` (the same rows as whole uncompressed v2 batches,
headers included, CRC left for `stamp_v2_crcs`) and `header_sizes` / `gather_records` (the records a scan found
→ contiguous key, value and header columns with Arrow offsets). Inputs are trusted: Arrow buffers checked by
the caller, or records a scan already validated.
"""

from __future__ import annotations

import numpy as np

from ..codec import compiled
from ..codec import format as fmt
from ..codec._header_kernels import write_v2_header

__all__ = ["encode_batches", "encode_runs", "gather_records", "group_rows", "header_sizes"]

_jit = compiled.njit(cache=True, nogil=True)
_inline = compiled.njit(cache=True, nogil=True, inline="always")


@compiled.intrinsic
def _copy_bytes(typingctx, dst, dst_pos, src, src_pos, count):
    """dst[dst_pos:dst_pos + count] = src[src_pos:src_pos + count] as one memcpy (uint8 arrays; no bounds
    check, no overlap): numba's slice assignment copies byte by byte, ~5x slower on keys and values."""
    from numba import types  # compile time only: the body runs when numba types a caller
    from numba.core import cgutils

    if not all(isinstance(a, types.Array) and a.dtype == types.uint8 for a in (dst, src)):
        return None
    signature = types.void(dst, types.int64, src, types.int64, types.int64)

    def codegen(context, builder, sig, args):
        d, dp, s, sp, n = args
        dst_data = context.make_array(sig.args[0])(context, builder, d).data
        src_data = context.make_array(sig.args[2])(context, builder, s).data
        cgutils.raw_memcpy(builder, builder.gep(dst_data, [dp]), builder.gep(src_data, [sp]), n, 1)
        return context.get_dummy_value()

    return signature, codegen


@_inline
def _zigzag_size(value):
    z = np.uint64((value << 1) ^ (value >> 63))
    size = 1
    while z >= np.uint64(0x80):
        z >>= np.uint64(7)
        size += 1
    return size


@_inline
def _put_varint(out, pos, value):
    z = np.uint64((value << 1) ^ (value >> 63))
    while z >= np.uint64(0x80):
        out[pos] = np.uint8((z & np.uint64(0x7F)) | np.uint64(0x80))
        z >>= np.uint64(7)
        pos += 1
    out[pos] = np.uint8(z)
    return pos + 1


@_inline
def _read_varint(buf, pos):
    z = np.uint64(0)
    shift = np.uint64(0)
    while True:
        b = buf[pos]
        pos += 1
        z |= np.uint64(b & 0x7F) << shift
        if b < 0x80:
            break
        shift += np.uint64(7)
    value = np.int64(z >> np.uint64(1)) ^ -np.int64(z & np.uint64(1))
    return value, pos


@_inline
def _field_size(valid, offsets, row):
    if not valid[row]:
        return 1  # varint(-1)
    n = offsets[row + 1] - offsets[row]
    return _zigzag_size(n) + n


@_inline
def _put_field(out, pos, valid, offsets, data, row):
    if not valid[row]:
        return _put_varint(out, pos, -1)
    start = offsets[row]
    n = offsets[row + 1] - start
    pos = _put_varint(out, pos, n)
    _copy_bytes(out, pos, data, start, n)
    return pos + n


@_inline
def _headers_size(row, h_list, hk_off, hv_valid, hv_off):
    size = _zigzag_size(h_list[row + 1] - h_list[row])
    for h in range(h_list[row], h_list[row + 1]):
        n = hk_off[h + 1] - hk_off[h]
        size += _zigzag_size(n) + n
        if hv_valid[h]:
            n = hv_off[h + 1] - hv_off[h]
            size += _zigzag_size(n) + n
        else:
            size += 1
    return size


@_jit
def group_rows(partitions, groups, order, part):
    """Rows in partition order, input order within a partition (a stable counting sort): order[j] is the row
    at place j and part[j] its partition. `partitions` (int64) lie in [-1, groups - 1]; -1 sorts first."""
    counts = np.zeros(groups + 2, dtype=np.int64)
    for i in range(partitions.size):
        counts[partitions[i] + 2] += 1
    for g in range(1, groups + 2):
        counts[g] += counts[g - 1]
    for i in range(partitions.size):
        g = partitions[i] + 1
        j = counts[g]
        order[j] = i
        part[j] = partitions[i]
        counts[g] = j + 1


@_jit
def encode_runs(
    order, part, k_valid, k_off, k_data, v_valid, v_off, v_data, ts, h_list, hk_off, hk_data, hv_valid, hv_off,
    hv_data, max_records, max_bytes, out, b_part, b_start, b_end, b_count, b_base_ts, b_max_ts,
):
    """Encode rows `order` (grouped by `part`, the partition of each position) as v2 records into `out`.

    A batch ends where the partition changes, at `max_records` records, or before a record that would take its
    records region past `max_bytes` (a batch always holds at least one record). Per batch b: its partition, its
    records region out[b_start[b]:b_end[b]], count, base (first) and max timestamp. Offset deltas count from 0
    in each batch; timestamp deltas from its first record. Returns the number of batches. `out` must hold
    every record: Σ(record sizes) ≤ 21 per record + key, value and header bytes + 10 per header.
    """
    pos = 0
    nb = -1
    count = 0
    region = 0
    base_ts = np.int64(0)
    for i in range(order.size):
        row = order[i]
        body_fixed = 1 + _field_size(k_valid, k_off, row) + _field_size(v_valid, v_off, row)
        body_fixed += _headers_size(row, h_list, hk_off, hv_valid, hv_off)
        approx = body_fixed + 10 + 5 + 5
        new_batch = nb < 0 or part[i] != b_part[nb] or count >= max_records or (count > 0 and region + approx > max_bytes)
        if new_batch:
            if nb >= 0:
                b_end[nb] = pos
                b_count[nb] = count
            nb += 1
            b_part[nb] = part[i]
            b_start[nb] = pos
            b_base_ts[nb] = ts[row]
            b_max_ts[nb] = ts[row]
            base_ts = ts[row]
            count = 0
            region = 0
        t = ts[row]
        b_max_ts[nb] = max(b_max_ts[nb], t)
        body = body_fixed + _zigzag_size(t - base_ts) + _zigzag_size(count)
        start = pos
        pos = _put_varint(out, pos, body)
        out[pos] = 0
        pos += 1
        pos = _put_varint(out, pos, t - base_ts)
        pos = _put_varint(out, pos, count)
        pos = _put_field(out, pos, k_valid, k_off, k_data, row)
        pos = _put_field(out, pos, v_valid, v_off, v_data, row)
        pos = _put_varint(out, pos, h_list[row + 1] - h_list[row])
        for h in range(h_list[row], h_list[row + 1]):
            n = hk_off[h + 1] - hk_off[h]
            pos = _put_varint(out, pos, n)
            _copy_bytes(out, pos, hk_data, hk_off[h], n)
            pos += n
            pos = _put_field(out, pos, hv_valid, hv_off, hv_data, h)
        region += pos - start
        count += 1
    if nb >= 0:
        b_end[nb] = pos
        b_count[nb] = count
    return nb + 1


@_jit
def encode_batches(
    order, part, k_valid, k_off, k_data, v_valid, v_off, v_data, ts, h_list, hk_off, hk_data, hv_valid, hv_off,
    hv_data, max_records, max_bytes, attributes, next_offset, out, b_part, b_start, b_end,
):
    """Encode rows `order` (grouped by `part`) as whole uncompressed v2 batches, one after another in `out`.

    Batches are cut as `encode_runs` cuts them; each gets its 61-byte header (base offset `next_offset[p]` of its
    partition p, which then moves past it; `attributes`; producer fields "none"; CRC 0: the caller stamps it
    with `stamp_v2_crcs`). Per batch b: its partition and its bytes out[b_start[b]:b_end[b]]; the batches of
    one partition are contiguous when `part` is sorted. Returns the number of batches, or -1 if `out` or the
    batch arrays are too small (nothing useful is left in them then).
    """
    pos = 0
    nb = -1
    count = 0
    region = 0
    hp = 0
    base_ts = np.int64(0)
    max_ts = np.int64(0)
    for i in range(order.size + 1):
        row = order[min(i, order.size - 1)]
        body_fixed = 0
        new_batch = i == order.size
        if not new_batch:
            body_fixed = 1 + _field_size(k_valid, k_off, row) + _field_size(v_valid, v_off, row)
            body_fixed += _headers_size(row, h_list, hk_off, hv_valid, hv_off)
            approx = body_fixed + 10 + 5 + 5
            new_batch = (nb < 0 or part[i] != b_part[nb] or count >= max_records
                         or (count > 0 and region + approx > max_bytes))
        if new_batch:
            if nb >= 0:
                p = b_part[nb]
                write_v2_header(out, hp, next_offset[p], pos - hp - fmt.LOG_OVERHEAD, fmt.NO_PARTITION_LEADER_EPOCH,
                                attributes, count - 1, base_ts, max_ts, fmt.NO_PRODUCER_ID, fmt.NO_PRODUCER_EPOCH,
                                fmt.NO_SEQUENCE, count)
                next_offset[p] += count
                b_end[nb] = pos
            if i == order.size:
                break
            nb += 1
            if nb >= b_part.size or pos + fmt.RECORD_BATCH_OVERHEAD > out.size:
                return -1
            b_part[nb] = part[i]
            b_start[nb] = pos
            hp = pos
            pos += fmt.RECORD_BATCH_OVERHEAD
            base_ts = ts[row]
            max_ts = ts[row]
            count = 0
            region = 0
        t = ts[row]
        max_ts = max(max_ts, t)
        body = body_fixed + _zigzag_size(t - base_ts) + _zigzag_size(count)
        if pos + body + 5 > out.size:
            return -1
        start = pos
        pos = _put_varint(out, pos, body)
        out[pos] = 0
        pos += 1
        pos = _put_varint(out, pos, t - base_ts)
        pos = _put_varint(out, pos, count)
        pos = _put_field(out, pos, k_valid, k_off, k_data, row)
        pos = _put_field(out, pos, v_valid, v_off, v_data, row)
        pos = _put_varint(out, pos, h_list[row + 1] - h_list[row])
        for h in range(h_list[row], h_list[row + 1]):
            n = hk_off[h + 1] - hk_off[h]
            pos = _put_varint(out, pos, n)
            _copy_bytes(out, pos, hk_data, hk_off[h], n)
            pos += n
            pos = _put_field(out, pos, hv_valid, hv_off, hv_data, h)
        region += pos - start
        count += 1
    return nb + 1


@_inline
def _headers_start(src, key_pos, key_len, value_len):
    p = key_pos + max(key_len, 0)
    _, p = _read_varint(src, p)
    return p + max(value_len, 0)


@_jit
def header_sizes(buf, arena, in_arena, is_v2, key_pos, key_len, value_len, out):
    """Per record: out[r] = (header count, header key bytes, header value bytes); legacy records have none."""
    for r in range(key_pos.size):
        if not is_v2[r]:
            out[r, 0] = 0
            out[r, 1] = 0
            out[r, 2] = 0
            continue
        src = arena if in_arena[r] else buf
        p = _headers_start(src, key_pos[r], key_len[r], value_len[r])
        count, p = _read_varint(src, p)
        kb = 0
        vb = 0
        for _ in range(count):
            n, p = _read_varint(src, p)
            kb += n
            p += n
            n, p = _read_varint(src, p)
            if n > 0:
                vb += n
                p += n
        out[r, 0] = count
        out[r, 1] = kb
        out[r, 2] = vb


@_jit
def gather_records(
    buf, arena, in_arena, is_v2, key_pos, key_len, value_len,
    k_off, k_data, v_off, v_data, h_list, hk_off, hk_data, hv_valid, hv_off, hv_data,
):
    """Copy every record's key, value and headers into Arrow-style offsets + data arrays (sized by the caller
    from key_len, value_len and `header_sizes`). Null keys and values get zero-length spans."""
    kp = 0
    vp = 0
    hk = 0
    hv = 0
    h = 0
    k_off[0] = 0
    v_off[0] = 0
    h_list[0] = 0
    hk_off[0] = 0
    hv_off[0] = 0
    for r in range(key_pos.size):
        src = arena if in_arena[r] else buf
        n = key_len[r]
        if n > 0:
            k_data[kp : kp + n] = src[key_pos[r] : key_pos[r] + n]
            kp += n
        k_off[r + 1] = kp
        p = key_pos[r] + max(n, 0)
        if is_v2[r]:
            _, p = _read_varint(src, p)
        else:
            p += 4
        n = value_len[r]
        if n > 0:
            v_data[vp : vp + n] = src[p : p + n]
            vp += n
            p += n
        v_off[r + 1] = vp
        if is_v2[r]:
            count, p = _read_varint(src, p)
            for _ in range(count):
                n, p = _read_varint(src, p)
                hk_data[hk : hk + n] = src[p : p + n]
                hk += n
                p += n
                hk_off[h + 1] = hk
                n, p = _read_varint(src, p)
                if n >= 0:
                    hv_data[hv : hv + n] = src[p : p + n]
                    hv += n
                    p += n
                    hv_valid[h] = True
                else:
                    hv_valid[h] = False
                hv_off[h + 1] = hv
                h += 1
        h_list[r + 1] = h
