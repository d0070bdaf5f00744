"""The survey's memo (`cleaner.survey.SurveyMemo`): a replayed segment gives the survey a read one gives.

The rounds of one partition that follow each other replay the inactive segments whose files did not change
instead of reading them. Each case compares against surveys and rounds made without a memo: the same survey
(segments, producers, transactions), the same files and round counters; fewer bytes read; and a file changed
in any way between two surveys is read again, so damage done between rounds is still found.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import asdict

import numpy as np
import pytest

from cleaner.survey import SurveyMemo, survey_log
from segments.codec.errors import CorruptRecordError
from segments.partition.log import PartitionLog

from .builders import DAY_MS, T0, clean, file_digests, partition_dir, random_log

TIMINGS = {"elapsed_s", "survey_s", "index_s", "recopy_s", "verify_s", "bytes_read", "survey_bytes_read"}
SMALL_MAP_BYTES = 24 * 6  # a few slots: rounds are partial


def _survey(directory, memo=None):
    with PartitionLog.open(directory, mode="reader") as log:
        return survey_log(log, memo=memo)


def _same(a, b) -> None:
    assert a.segments == b.segments
    assert a.producers == b.producers
    for x, y in zip(a.transaction_table, b.transaction_table, strict=True):
        np.testing.assert_array_equal(x, y)


@pytest.mark.parametrize("seed", range(12))
def test_a_replayed_survey_equals_a_read_one_and_reads_only_the_active_segment(tmp_path, seed):
    directory = partition_dir(tmp_path)
    random_log(directory, seed, batches_max=60)
    memo = SurveyMemo()
    plain = _survey(directory)
    first = _survey(directory, memo)
    second = _survey(directory, memo)
    _same(plain, first)
    _same(plain, second)
    assert first.bytes_read == plain.bytes_read
    active = os.path.getsize(sorted(directory.glob("*.log"))[-1])
    assert second.bytes_read == active
    assert len(memo) == len(plain.segments) - 1


@pytest.mark.parametrize("seed", range(10))
def test_partial_rounds_with_a_memo_leave_the_files_and_counters_of_rounds_without(tmp_path, seed, monkeypatch):
    a, b = partition_dir(tmp_path / "a"), partition_dir(tmp_path / "b")
    random_log(a, seed, batches_max=60, offset_gap=seed % 3)
    shutil.copytree(a.parent, b.parent)
    memo = SurveyMemo()
    with_memo, without, survey_read = [], [], [0, 0]
    for directory, rounds, kwargs, k in ((a, with_memo, {"survey_memo": memo}, 0), (b, without, {}, 1)):
        for _ in range(40):
            result = clean(directory, now_ms=T0 + 2 * DAY_MS, map_bytes=SMALL_MAP_BYTES, **kwargs)
            rounds.append({key: v for key, v in asdict(result).items() if key not in TIMINGS})
            survey_read[k] += result.survey_bytes_read
            if result.done:
                break
    assert with_memo == without
    assert file_digests(a) == file_digests(b)
    if len(with_memo) > 1:
        assert survey_read[0] < survey_read[1]


def test_a_segment_damaged_between_two_surveys_is_read_again_and_its_damage_found(tmp_path):
    directory = partition_dir(tmp_path)
    random_log(directory, 3, batches_max=60)
    memo = SurveyMemo()
    _survey(directory, memo)
    first = sorted(directory.glob("*.log"))[0]
    data = bytearray(first.read_bytes())
    data[len(data) // 2] ^= 0x40  # same size: only the file's times tell
    first.write_bytes(bytes(data))
    with pytest.raises(CorruptRecordError) as caught:
        _survey(directory, memo)
    assert caught.value.path == str(first)


def test_a_memo_over_its_bound_keeps_nothing_and_changes_nothing(tmp_path):
    directory = partition_dir(tmp_path)
    random_log(directory, 5, batches_max=60)
    memo = SurveyMemo(bytes_max=100)
    plain = _survey(directory)
    _survey(directory, memo)
    again = _survey(directory, memo)
    assert len(memo) == 0
    _same(plain, again)
    assert again.bytes_read == plain.bytes_read


def test_a_survey_of_another_partition_starts_the_memo_afresh(tmp_path):
    a, b = partition_dir(tmp_path / "a"), partition_dir(tmp_path / "b", "t-1")
    random_log(a, 1, batches_max=60)
    random_log(b, 2, batches_max=60)
    memo = SurveyMemo()
    _survey(a, memo)
    held_a = len(memo)
    survey_b = _survey(b, memo)
    assert len(memo) == len(survey_b.segments) - 1
    assert held_a > 0
    again_a = _survey(a, memo)
    assert again_a.bytes_read == _survey(a).bytes_read  # nothing of `a` was left to replay
