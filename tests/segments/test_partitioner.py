"""Kafka's default partitioner: Java's murmur2 golden values, kafka-python as an independent implementation."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kafka.partitioner.default import murmur2 as kafka_python_murmur2

from segments.spark.partitioner import murmur2, partition_for_key, partitions_for_spans

# org.apache.kafka.common.utils.UtilsTest#testMurmur2
JAVA_GOLDEN = {
    b"21": -973932308,
    b"foobar": -790332482,
    b"a-little-bit-long-string": -985981536,
    b"a-little-bit-longer-string": -1486304829,
    b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8": -58897971,
    b"abc": 479470107,
}


@pytest.mark.parametrize("key,expected", JAVA_GOLDEN.items())
def test_murmur2_matches_java(key, expected):
    assert murmur2(key) == expected


@settings(max_examples=300, deadline=None)
@given(key=st.binary(max_size=64), partitions=st.integers(1, 1000))
def test_partition_matches_kafka_python_default_partitioner(key, partitions):
    # kafka-python's DefaultPartitioner: murmur2(key) & 0x7fffffff % len(partitions)
    assert murmur2(key) & 0xFFFFFFFF == kafka_python_murmur2(key)
    assert partition_for_key(key, partitions) == (kafka_python_murmur2(key) & 0x7FFFFFFF) % partitions


@settings(max_examples=50, deadline=None)
@given(keys=st.lists(st.one_of(st.none(), st.binary(max_size=40)), max_size=50), partitions=st.integers(1, 64))
def test_column_of_keys_matches_one_at_a_time(keys, partitions):
    data = b"".join(k or b"" for k in keys)
    pos, lens, p = [], [], 0
    for k in keys:
        pos.append(p)
        lens.append(-1 if k is None else len(k))
        p += len(k or b"")
    out = partitions_for_spans(np.frombuffer(data, dtype=np.uint8), np.array(pos, dtype=np.int64),
                               np.array(lens, dtype=np.int64), partitions)
    assert out.tolist() == [-1 if k is None else partition_for_key(k, partitions) for k in keys]


def test_invalid_arguments_are_refused():
    with pytest.raises(ValueError, match="at least 1"):
        partition_for_key(b"k", 0)
    with pytest.raises(ValueError, match="outside the buffer"):
        partitions_for_spans(np.zeros(4, dtype=np.uint8), np.array([2]), np.array([5]), 3)
