"""The records a window adds to the offset map, selected and hashed in compiled code (`_kernels.select_keys`,
`offsetmap.hash_key_rows`), equal the numpy selection and per-buffer hashing they replaced, kept here as the
reference, on random windows of every codec (keys in the window and in the arena of decompressed records),
legacy messages and wrappers, control batches, aborted batches and dirty ranges cutting windows anywhere."""

from __future__ import annotations

import random

import numpy as np
import pytest

from cleaner.indexing import _window_keys
from offsetmap import hash_key_spans
from segments.codec.scan import ScanBuffers, scan

from ..segments.test_scan_fused import _window


def _reference(result, aborted, first_dirty, first_uncleanable, seed):
    eligible = ~result.is_control if aborted is None else ~result.is_control & ~aborted
    offsets = result.offset
    selected = np.nonzero(
        eligible[result.batch_index] & (offsets >= first_dirty) & (offsets < first_uncleanable) & (result.key_len >= 0)
    )[0]
    h1 = np.empty(len(selected), dtype=np.uint64)
    h2 = np.empty(len(selected), dtype=np.uint64)
    in_arena = result.record_in_arena[selected] if len(result.arena) else np.zeros(len(selected), dtype=bool)
    for flag, source in ((False, result.buffer), (True, result.arena)):
        sel = np.nonzero(in_arena == flag)[0]
        if len(sel):
            r = selected[sel]
            a, b = hash_key_spans(source, result.key_pos[r], result.key_len[r], seed)
            h1[sel] = a
            h2[sel] = b
    return offsets[selected], h1, h2


@pytest.mark.parametrize("seed", range(60))
def test_the_keys_of_a_window_are_those_the_numpy_selection_hashed(seed):
    rng = random.Random(seed)
    result = scan(_window(seed), buffers=ScanBuffers())
    offsets = result.offset
    for _ in range(6):
        if len(offsets) and rng.random() < 0.8:
            first_dirty = int(rng.choice(offsets.tolist())) + rng.choice((-1, 0, 1))
            first_uncleanable = first_dirty + rng.randrange(0, int(offsets.max() - offsets.min()) + 3)
        else:
            first_dirty, first_uncleanable = 0, 2**62
        aborted = None if rng.random() < 0.4 else np.array([rng.random() < 0.3 for _ in range(result.n_batches)], dtype=bool)
        map_seed = rng.randrange(2**32)
        expected = _reference(result, aborted, first_dirty, first_uncleanable, map_seed)
        got = _window_keys(result, aborted, first_dirty, first_uncleanable, map_seed)
        if not len(expected[0]):
            assert len(got[0]) == 0 and got[1] is None
            continue
        for e, g in zip(expected, got):
            assert e.dtype == g.dtype and np.array_equal(e, g)


def test_windows_with_keys_in_the_arena_are_covered():
    arena_keys = 0
    for seed in range(60):
        result = scan(_window(seed))
        arena_keys += int(np.count_nonzero(result.record_in_arena & (result.key_len >= 0)))
    assert arena_keys > 0
