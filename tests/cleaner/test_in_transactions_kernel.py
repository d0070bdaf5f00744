"""Which batches lie in a set of transactions (`cleaner._kernels.in_transactions`), and the survey's pass dropping
the records of those that lie in aborted ones (`cleaner._kernels.drop_aborted`), against a brute-force model:
every transaction of the batch's producer checked in turn. Random producers (ids below 0 included), transactions
that never overlap within a producer, sorted as the callers sort them (by producer id, then first offset),
batches before, inside, between and after them, some not candidates; for the drop, batches in offset order over
a window's selected records (a batch may have none of them, or only some)."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from cleaner import _kernels


def _model(producer_id, base, candidate, txn_pid, txn_first, txn_marker):
    return np.array([c and pid >= 0 and any(p == pid and f <= b <= m for p, f, m in zip(txn_pid, txn_first, txn_marker))
                     for pid, b, c in zip(producer_id.tolist(), base.tolist(), candidate.tolist())], dtype=bool)


@st.composite
def _case(draw):
    producers = draw(st.lists(st.integers(-1, 6), min_size=1, max_size=5, unique=True))
    txns = []
    for pid in producers:
        if pid < 0:
            continue
        offset = draw(st.integers(0, 5))
        for _ in range(draw(st.integers(0, 4))):  # a producer's transactions: disjoint, in offset order
            first = offset + draw(st.integers(0, 4))
            marker = first + draw(st.integers(0, 4))
            txns.append((pid, first, marker))
            offset = marker + 1
    txns.sort()
    batches = draw(st.lists(st.tuples(st.sampled_from(producers + [7]), st.integers(0, 40), st.booleans()),
                            max_size=30))
    columns = [np.array([t[k] for t in txns], dtype=np.int64) for k in range(3)]
    return (np.array([b[0] for b in batches], dtype=np.int64), np.array([b[1] for b in batches], dtype=np.int64),
            np.array([b[2] for b in batches], dtype=np.bool_), *columns)


@settings(max_examples=300, deadline=None)
@given(_case())
def test_in_transactions_matches_the_model(case):
    out = np.ones(len(case[0]), dtype=np.bool_)
    _kernels.in_transactions(*case, out)
    assert out.tolist() == _model(*case).tolist()


def test_a_batch_on_either_edge_of_a_transaction_and_between_two():
    txn_pid, txn_first, txn_marker = (np.array(c, dtype=np.int64) for c in ([3, 3], [10, 20], [14, 25]))
    base = np.array([9, 10, 14, 15, 19, 20, 25, 26, 12], dtype=np.int64)
    producer_id = np.array([3, 3, 3, 3, 3, 3, 3, 3, 4], dtype=np.int64)
    out = np.empty(len(base), dtype=np.bool_)
    _kernels.in_transactions(producer_id, base, np.ones(len(base), dtype=np.bool_), txn_pid, txn_first, txn_marker,
                             out)
    assert out.tolist() == [False, True, True, False, False, True, True, False, False]
    _kernels.in_transactions(producer_id, base, base != 10, txn_pid, txn_first, txn_marker, out)
    assert out.tolist() == [False, False, True, False, False, True, True, False, False]


@st.composite
def _window(draw):
    """(offsets, h1, h2, batches' producer id, base, last, transactions' columns): a window's selected records and
    its data batches in offset order over them."""
    pid, _, _, txn_pid, txn_first, txn_marker = draw(_case())
    batches, offset = [], 0
    for _ in range(draw(st.integers(0, 12))):
        base = offset + draw(st.integers(0, 3))
        last = base + draw(st.integers(0, 4))
        batches.append((draw(st.sampled_from([-1, 0, 1, 2, 3, 4, 5, 6, 7])), base, last))
        offset = last + 1
    offsets = sorted(draw(st.sets(st.integers(0, offset + 3))))  # some records of each batch, or none
    rnd = np.random.default_rng(len(offsets))
    h1, h2 = rnd.integers(0, 2**63, size=(2, len(offsets)), dtype=np.int64).astype(np.uint64)
    columns = [np.array([b[k] for b in batches], dtype=np.int64) for k in range(3)]
    return np.array(offsets, dtype=np.int64), h1, h2, *columns, txn_pid, txn_first, txn_marker


@settings(max_examples=300, deadline=None)
@given(_window())
def test_drop_aborted_keeps_the_records_outside_aborted_batches_in_order(window):
    offsets, h1, h2, producer_id, base, last, *txn = window
    aborted = _model(producer_id, base, np.ones(len(base), dtype=bool), *txn)
    dropped = np.zeros(len(offsets), dtype=bool)
    for b, e in zip(base[aborted].tolist(), last[aborted].tolist()):
        dropped |= (offsets >= b) & (offsets <= e)
    expected = offsets[~dropped], h1[~dropped], h2[~dropped]
    count = _kernels.drop_aborted(offsets, h1, h2, producer_id, base, last, *txn)
    assert count == len(expected[0])
    for got, want in zip((offsets[:count], h1[:count], h2[:count]), expected):
        assert got.tolist() == want.tolist()
