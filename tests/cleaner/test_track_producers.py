"""The survey's producer tracking (`cleaner.survey._track_producers`), one compiled walk over all of a window's
producers, against a model that walks them one at a time (the per-producer code it replaced): the same
producer states after every window and the same ended transactions, over random runs of windows in which
idempotent and transactional producers interleave, transactions span windows, and markers commit or abort."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from cleaner.survey import ProducerState, _ProducerRows, _track_producers
from segments.codec import format as fmt


def per_producer(rows: _ProducerRows, producers: dict[int, ProducerState],
                     ended: list[tuple[np.ndarray, ...]]) -> None:
    """The ninth round's `_track_producers`, kept as the model: numpy per producer, one producer at a time."""
    pids, control, transactional = rows.producer_id, rows.is_control, rows.is_transactional
    last_offset, base_offset, ends = rows.last_offset, rows.base_offset, rows.ends
    by_producer = np.argsort(pids, kind="stable")  # grouped by producer id, in offset order within each
    bounds = np.flatnonzero(np.diff(pids[by_producer])) + 1
    starts = np.concatenate(([0], bounds))
    stops = np.concatenate((bounds, [len(by_producer)]))
    first_seen = np.argsort(by_producer[starts], kind="stable")  # new producers enter `producers` in log order
    found: list[tuple[np.ndarray, ...]] = []
    for g in first_seen.tolist():
        idx = by_producer[starts[g] : stops[g]]
        pid = int(pids[idx[0]])
        state = producers.get(pid)
        if state is None:
            state = producers[pid] = ProducerState(pid)
        last = last_offset[idx]
        is_control = control[idx]
        state.last_entry_offset = int(last[-1])
        state.last_entry_is_control = bool(is_control[-1])
        state.last_timestamp = max(state.last_timestamp, int(rows.max_timestamp[idx].max()))
        data = np.flatnonzero(~is_control)
        if len(data):
            state.last_data_offset = int(last[data[-1]])
        txn_data = np.flatnonzero(~is_control & transactional[idx])  # positions in idx
        markers = np.flatnonzero(ends[idx] >= 0)
        if not len(markers):
            if len(txn_data):
                if state.open_txn_first_offset < 0:
                    state.open_txn_first_offset = int(base_offset[idx[txn_data[0]]])
                    state.open_txn_data_batches = 0
                state.open_txn_data_batches += len(txn_data)
            continue
        # Transaction k: its data batches lie between marker k-1 (or the window's start) and marker k.
        before = np.searchsorted(txn_data, markers)  # data batches before each marker
        after_previous = np.concatenate(([0], before[:-1]))
        counts = before - after_previous
        firsts = np.where(
            counts > 0, base_offset[idx[txn_data[np.minimum(after_previous, len(txn_data) - 1)]]] if len(txn_data) else 0,
            last[markers],
        )
        counts[0] += state.open_txn_data_batches
        if state.open_txn_first_offset >= 0:
            firsts[0] = state.open_txn_first_offset
        marker_batches = idx[markers]
        found.append((marker_batches, np.full(len(markers), pid), firsts, last[markers], ends[marker_batches], counts))
        rest = len(txn_data) - int(before[-1])
        state.open_txn_first_offset = int(base_offset[idx[txn_data[before[-1]]]]) if rest else -1
        state.open_txn_data_batches = rest
    if found:
        columns = [np.concatenate(c) for c in zip(*found)]
        in_order = np.argsort(columns[0], kind="stable")
        ended.append(tuple(c[in_order].astype(np.int64) for c in columns[1:]))


@st.composite
def windows(draw):
    """Windows of rows in offset order: each row a producer's data batch (transactional for the transactional
    producers) or, for a transactional producer, a control batch: a COMMIT or ABORT marker, or one that ends
    nothing (-1)."""
    producers = draw(st.lists(st.integers(0, 2**40), min_size=1, max_size=6, unique=True))
    transactional = {p: draw(st.booleans()) for p in producers}
    offset, ts = draw(st.integers(0, 1000)), 0
    result = []
    for _ in range(draw(st.integers(1, 5))):
        columns: list[list[int]] = [[] for _ in _ProducerRows._fields]
        for _ in range(draw(st.integers(1, 30))):
            pid = draw(st.sampled_from(producers))
            is_control = transactional[pid] and draw(st.integers(0, 3)) == 0
            width = 1 if is_control else draw(st.integers(1, 4))
            ends = draw(st.sampled_from([fmt.CONTROL_TYPE_ABORT, fmt.CONTROL_TYPE_COMMIT, -1])) if is_control else -1
            ts += draw(st.integers(-5, 10))
            for column, value in zip(columns, (pid, is_control, transactional[pid] and not is_control or is_control,
                                               offset, offset + width - 1, ts, ends)):
                column.append(value)
            offset += width + draw(st.integers(0, 2))
        result.append(_ProducerRows(*(np.array(c, dtype=bool if name in ("is_control", "is_transactional")
                                               else np.int64) for name, c in zip(_ProducerRows._fields, columns))))
    return result


@settings(max_examples=400, deadline=None)
@given(runs=windows())
def test_one_pass_over_all_producers_is_the_walk_one_producer_at_a_time(runs):
    ours: dict[int, ProducerState] = {}
    model: dict[int, ProducerState] = {}
    ours_ended: list = []
    model_ended: list = []
    for rows in runs:
        _track_producers(rows, ours, ours_ended)
        per_producer(rows, model, model_ended)
        assert list(ours) == list(model)  # new producers enter in log order
        assert ours == model
        assert len(ours_ended) == len(model_ended)
        for got, want in zip(ours_ended, model_ended):
            assert all(np.array_equal(a, b) and a.dtype == b.dtype for a, b in zip(got, want))
