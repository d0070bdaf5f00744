"""The recopy's decisions in compiled code (`_kernels.decide_window`, `window_horizons`) equal the numpy rules they
replaced, kept here as the reference: every window of real rounds over random logs (every codec, transactions,
tombstones, unkeyed records, offset gaps, legacy v0/v1 messages and wrappers), in full rounds, rounds that
remove tombstones and markers, partial rounds of a tiny map and recopies of a clean section (records the
superseded bitmap does not cover are looked up in the map)."""

from __future__ import annotations

import random

import numpy as np
import pytest

from cleaner import recopy
from cleaner.recopy import (
    ACTION_DROP,
    ACTION_EMPTY,
    ACTION_REBUILD,
    ACTION_VERBATIM,
    _markers_discardable,
    _producer_last_batches,
)
from offsetmap import hash_key_spans
from segments.codec import format as fmt
from segments.codec.legacy import encode_legacy_message, encode_legacy_wrapper
from segments.codec.records import Record

from .builders import DAY_MS, ROLL, T0, batch, build_log, clean, partition_dir, random_log, write_raw_segment


def _marked(superseded, offsets: np.ndarray) -> np.ndarray:
    """int8 per offset: 1 superseded, 0 not, -1 outside the bitmap (the map must be asked); read with numpy."""
    d = offsets - superseded.start
    inside = (d >= 0) & (d < 8 * len(superseded.bits))
    out = np.full(len(offsets), -1, dtype=np.int8)
    out[inside] = (superseded.bits[d[inside] >> 3] >> (d[inside] & 7)) & 1
    return out


def _reference_decide(result, ctx, retain_tombstones_legacy, group_last):
    """`recopy._decide` as numpy over the window (before the kernel)."""
    n = result.n_batches
    survey = ctx.survey
    bi = result.batch_index
    control = result.is_control
    v2 = result.magic == fmt.MAGIC_V2
    horizon = result.delete_horizon_ms
    has_horizon = horizon >= 0
    aborted = survey.aborted_batches(result.producer_id, result.base_offset, result.is_transactional) & ~control
    retain_empty = v2 & _producer_last_batches(result, ctx)
    if group_last >= 0:
        retain_empty[group_last] |= v2[group_last]
    offsets = result.offset
    beyond = offsets > ctx.latest_offset
    keyed = result.key_len >= 0
    candidates = np.nonzero(keyed & ~beyond & ~control[bi])[0]
    is_latest = np.zeros(result.n_records, dtype=bool)
    if ctx.superseded is not None and len(candidates):
        marked = _marked(ctx.superseded, offsets[candidates])
        is_latest[candidates[marked == 0]] = True
        lookup = candidates[marked < 0]
    else:
        lookup = candidates
    if len(lookup):
        in_arena = result.record_in_arena[lookup] if len(result.arena) else np.zeros(len(lookup), dtype=bool)
        for flag, source in ((False, result.buffer), (True, result.arena)):
            sel = np.nonzero(in_arena == flag)[0]
            if len(sel):
                r = lookup[sel]
                h1, h2 = hash_key_spans(source, result.key_pos[r], result.key_len[r], ctx.offset_map.seed)
                is_latest[r] = offsets[r] >= ctx.offset_map.lookup_hashes(h1, h2)
    tombstone = result.value_len < 0
    retain_tombstone = np.where(v2, ~has_horizon | (ctx.now_ms < horizon), retain_tombstones_legacy) | ctx.partial
    live_data = ~aborted[bi] & ~control[bi]
    keep = live_data & (beyond | (is_latest & (~tombstone | retain_tombstone[bi])))
    invalid = int(np.count_nonzero(live_data & ~beyond & ~keyed))
    kept = np.bincount(bi, weights=keep, minlength=n).astype(np.int64)
    marker_discardable = _markers_discardable(result, ctx, ~control & ((kept > 0) | retain_empty))
    discard_markers = control & marker_discardable & has_horizon & (horizon <= ctx.now_ms)
    if ctx.partial:
        discard_markers[:] = False
    keep |= control[bi] & ~discard_markers[bi]
    kept = np.bincount(bi, weights=keep, minlength=n).astype(np.int64)
    kept_tombstones = np.bincount(bi[keep & tombstone], minlength=n)
    needs_horizon = v2 & (kept > 0) & ~has_horizon & ((kept_tombstones > 0) | (control & marker_discardable))
    action = np.full(n, ACTION_DROP, dtype=np.int8)
    action[(kept > 0) & (kept == result.records_count) & ~needs_horizon] = ACTION_VERBATIM
    action[(kept > 0) & ((kept < result.records_count) | needs_horizon)] = ACTION_REBUILD
    action[(kept == 0) & retain_empty] = ACTION_EMPTY
    if group_last >= 0 and not v2[group_last] and action[group_last] == ACTION_DROP and result.records_count[group_last]:
        action[group_last] = ACTION_VERBATIM
        keep[result.record_start[group_last] : result.record_start[group_last + 1]] = True
    return action, keep, needs_horizon, invalid


def _reference_horizons(result, ctx, action, keep, needs_horizon):
    """`recopy._horizons` as numpy, with the counters `clean_group` and `_window_output` took per window."""
    n = result.n_batches
    bi = result.batch_index
    kept_tombstones = np.bincount(bi[keep & (result.value_len < 0)], minlength=n)
    written = (action == ACTION_VERBATIM) | (action == ACTION_REBUILD)
    holds = written & ((kept_tombstones > 0) | result.is_control)
    clear = written & ~holds & (result.delete_horizon_ms >= 0) & (result.magic == fmt.MAGIC_V2)
    if clear.any():
        action = np.where(clear & (action == ACTION_VERBATIM), ACTION_REBUILD, action).astype(action.dtype)
    pending = np.where(needs_horizon, ctx.now_ms + ctx.delete_retention_ms, result.delete_horizon_ms)
    pending = np.where(holds, pending, -1)
    if not ctx.partial:
        pending = np.where(~needs_horizon & (pending <= ctx.now_ms), -1, pending)
    dirty = (result.offset >= ctx.first_dirty) & ~result.is_control[bi]
    soonest = pending[pending >= 0]
    counts = [
        int(np.count_nonzero(keep)), int(np.count_nonzero(dirty)), int(np.count_nonzero(dirty & keep)),
        int(np.count_nonzero(action == ACTION_VERBATIM)), int(np.count_nonzero(action == ACTION_REBUILD)),
        int(np.count_nonzero(action == ACTION_EMPTY)),
        int(np.count_nonzero(needs_horizon & (action == ACTION_REBUILD))),
        int(soonest.min()) if len(soonest) else -1,
    ]
    kept_control = [int(result.base_offset[j]) for j in np.nonzero(result.is_control & (action != ACTION_DROP))[0]]
    return action, clear, counts, kept_control


@pytest.fixture
def checked(monkeypatch):
    """Every window a round decides is also decided by the reference; returns the number of windows compared
    and how many of them took each path (map lookups, markers in Python)."""
    seen = {"windows": 0, "lookups": 0, "markers": 0, "kept": 0}
    decide, horizons, markers, map_offsets = (recopy._decide, recopy._horizons, recopy._markers_discardable,
                                              recopy._map_offsets)

    def counting_markers(*args):
        seen["markers"] += 1
        return markers(*args)

    def counting_lookups(*args):
        seen["lookups"] += 1
        return map_offsets(*args)

    def both(result, ctx, legacy, group_last):
        written = None if ctx.txn_data_written is None else dict(ctx.txn_data_written)
        expected = _reference_decide(result, _with_written(ctx, written), legacy, group_last)
        got = decide(result, ctx, legacy, group_last)
        for e, g in zip(expected[:3], got[:3]):
            assert e.dtype == g.dtype and np.array_equal(e, g)
        assert expected[3] == got[3]
        assert written == ctx.txn_data_written
        seen["windows"] += 1
        seen["kept"] += int(np.count_nonzero(got[1]))
        return got

    def both_horizons(result, ctx, action, keep, needs_horizon):
        expected = _reference_horizons(result, ctx, action.copy(), keep, needs_horizon)
        got_action, got_clear, got_counts, got_control = horizons(result, ctx, action, keep, needs_horizon)
        assert np.array_equal(expected[0], got_action) and np.array_equal(expected[1], got_clear)
        from cleaner import _kernels as k

        assert expected[2] == got_counts.tolist()[: k.COUNT_KEPT_CONTROL]
        assert expected[3] == got_control.tolist()
        return got_action, got_clear, got_counts, got_control

    monkeypatch.setattr(recopy, "_decide", both)
    monkeypatch.setattr(recopy, "_horizons", both_horizons)
    monkeypatch.setattr(recopy, "_markers_discardable", counting_markers)
    monkeypatch.setattr(recopy, "_map_offsets", counting_lookups)
    return seen


def _with_written(ctx, written):
    """`ctx` with its own copy of the transactions' written data (the reference advances it too)."""
    import dataclasses

    return dataclasses.replace(ctx, txn_data_written=written)


SETTINGS = {"segment.bytes": 2048, "delete.retention.ms": DAY_MS}


@pytest.mark.parametrize("seed", range(12))
def test_the_decisions_of_random_rounds_equal_the_numpy_rules(tmp_path, checked, seed):
    d = partition_dir(tmp_path)
    random_log(d, seed, batches_max=50, offset_gap=2 if seed % 3 == 0 else 0)
    now = T0 + DAY_MS
    clean(d, now_ms=now, settings=SETTINGS)
    clean(d, now_ms=now + 2 * DAY_MS, settings={**SETTINGS, "delete.retention.ms": 0}, force_recopy=True)
    for _ in range(6):  # partial rounds of a tiny map
        if clean(d, now_ms=now + 3 * DAY_MS, settings=SETTINGS, map_bytes=24 * 4, force_recopy=True).done:
            break
    assert checked["windows"] > 0


def test_every_path_of_the_kernel_is_taken(tmp_path, checked):
    for seed in range(4):
        d = partition_dir(tmp_path / str(seed))
        random_log(d, seed, batches_max=40)
        clean(d, now_ms=T0 + DAY_MS, settings=SETTINGS)
        clean(d, now_ms=T0 + 3 * DAY_MS, settings={**SETTINGS, "delete.retention.ms": 0}, force_recopy=True)
    assert checked["lookups"] > 0 and checked["markers"] > 0 and checked["kept"] > 0


@pytest.mark.parametrize("magic", [fmt.MAGIC_V0, fmt.MAGIC_V1])
def test_legacy_messages_and_wrappers_are_decided_as_before(tmp_path, checked, magic):
    rnd = random.Random(magic)
    ts = (lambda t: t) if magic else (lambda t: fmt.NO_TIMESTAMP)
    data = b""
    offset = 0
    for _ in range(30):
        key = None if rnd.random() < 0.1 else b"k%d" % rnd.randint(0, 4)
        value = None if rnd.random() < 0.2 else b"v%d" % offset
        if rnd.random() < 0.3:
            inner = [Record(offset + j, ts(T0 + offset + j), b"k%d" % rnd.randint(0, 4), b"w") for j in range(3)]
            data += encode_legacy_wrapper(inner, magic=magic, codec=rnd.choice([fmt.COMPRESSION_GZIP,
                                                                              fmt.COMPRESSION_LZ4]))
            offset += 3
        else:
            data += encode_legacy_message(offset, key, value, magic=magic, timestamp=ts(T0 + offset))
            offset += 1
    d = partition_dir(tmp_path)
    d.mkdir(parents=True)
    write_raw_segment(d, 0, data)
    write_raw_segment(d, offset, b"")
    clean(d, now_ms=T0 + DAY_MS)
    build_log(d, [batch([(b"k1", b"new", T0 + 100)]), ROLL, batch([(b"k2", None, T0 + 101)])])
    clean(d, now_ms=T0 + 3 * DAY_MS, settings={"delete.retention.ms": 0}, force_recopy=True)
    assert checked["windows"] > 0
