"""The duplication report at scale: what compaction would remove, counted by Spark over the `logsegments` source.

Owns the Spark job behind `logcleaner duplication --spark`. Per log partition it gives records, unkeyed records
and distinct keys — exact (`count`/`count(DISTINCT key)` grouped by topic and partition) or estimated: every input
partition (a run of segments) builds a `KeyBloomFilter` of its keys' MurmurHash3 hashes in `mapInArrow`, the
driver ORs the filters of each log partition and estimates its distinct keys from the merged filter (see
`offsetmap.bloom`). The figures are plain dicts; `cleaner.duplication.PartitionDuplication` turns them into
the report.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

__all__ = ["duplication_counts"]

_COUNTS_SCHEMA = "topic string, partition int, records long, unkeyed long, filter binary"


def _bloom_task(filter_bytes: int, hashes: int):
    def build(batches: Iterator) -> Iterator:
        import numpy as np
        import pyarrow as pa
        import pyarrow.compute as pc

        from offsetmap import hash_key_spans
        from offsetmap.bloom import KeyBloomFilter

        from .arrow_records import binary_parts

        filters: dict[tuple[str, int], list] = {}
        for batch in batches:
            if batch.num_rows == 0:
                continue
            pairs = pa.Table.from_batches([batch.select(["topic", "partition"])]).group_by(["topic", "partition"]).aggregate([])
            for t, p in zip(pairs.column("topic").to_pylist(), pairs.column("partition").to_pylist()):
                # A task reads one run of one log partition, so this loop runs once; the mask is for safety.
                if pairs.num_rows == 1:
                    sub = batch.column("key")
                else:
                    mask = pc.and_(pc.equal(batch.column("topic"), t), pc.equal(batch.column("partition"), p))
                    sub = pc.filter(batch.column("key"), mask)
                entry = filters.setdefault((t, p), [KeyBloomFilter.for_memory(filter_bytes, hashes), 0, 0])
                entry[1] += len(sub)
                valid, offsets, buf = binary_parts(sub)
                entry[2] += int(np.count_nonzero(~valid))
                h1, h2 = hash_key_spans(buf, offsets[:-1], np.where(valid, np.diff(offsets), -1))
                entry[0].add_hashes(h1[valid], h2[valid])
        for (t, p), (bloom, records, unkeyed) in filters.items():
            yield pa.RecordBatch.from_pydict(
                {"topic": [t], "partition": [p], "records": [records], "unkeyed": [unkeyed], "filter": [bloom.to_bytes()]},
                schema=pa.schema([("topic", pa.string()), ("partition", pa.int32()), ("records", pa.int64()),
                                  ("unkeyed", pa.int64()), ("filter", pa.binary())]),
            )

    return build


def duplication_counts(spark, paths: list[str], *, method: str = "auto", memory_bytes: int = 256 * 1024 * 1024,
                       hashes: int = 2) -> list[dict]:
    """Per log partition: name, records, unkeyed, distinct_keys, distinct_bound, method, filter_bytes, size_bytes.

    "auto" counts exactly when every partition's offset span fits `memory_bytes` at 16 bytes a record (the
    rule of the single-machine tool), else estimates with bloom filters of `memory_bytes` per input partition.
    """
    from pyspark.sql import functions as F

    from offsetmap.bloom import KeyBloomFilter

    from ..partition.log import PartitionLog
    from .source import plan_input_partitions

    directories = sorted({r.directory for r in plan_input_partitions([str(p) for p in paths])})
    sizes: dict[str, int] = {}
    spans: list[int] = []
    for directory in directories:
        with PartitionLog.open(Path(directory), mode="reader") as plog:
            sizes[directory] = plog.size_bytes
            spans.append(plog.log_end_offset - plog.log_start_offset)
    if method == "auto":
        method = "exact" if all(span * 16 <= memory_bytes for span in spans) else "bloom"
    exact = method == "exact"
    filter_bytes = memory_bytes

    path = ",".join(str(p) for p in paths)
    df = spark.read.format("logsegments").schema("topic string, partition int, key binary").load(path)
    out: dict[tuple[str, int], dict] = {}
    if exact:
        rows = df.groupBy("topic", "partition").agg(
            F.count(F.lit(1)).alias("records"),
            F.count_if(F.col("key").isNull()).alias("unkeyed"),
            F.countDistinct("key").alias("distinct"),
        ).collect()
        for r in rows:
            out[(r["topic"], r["partition"])] = dict(
                records=r["records"], unkeyed=r["unkeyed"], distinct_keys=float(r["distinct"]), distinct_bound=0.0,
                method="exact", filter_bytes=0,
            )
    else:
        merged: dict[tuple[str, int], list] = {}
        for r in df.mapInArrow(_bloom_task(filter_bytes, hashes), _COUNTS_SCHEMA).toLocalIterator():
            key = (r["topic"], r["partition"])
            bloom = KeyBloomFilter.from_bytes(r["filter"], hashes)
            if key in merged:
                merged[key][0].merge(bloom)
                merged[key][1] += r["records"]
                merged[key][2] += r["unkeyed"]
            else:
                merged[key] = [bloom, r["records"], r["unkeyed"]]
        for key, (bloom, records, unkeyed) in merged.items():
            out[key] = dict(
                records=records, unkeyed=unkeyed,
                distinct_keys=min(bloom.estimate_distinct(), float(records - unkeyed)),
                distinct_bound=bloom.error_bound(), method="bloom", filter_bytes=bloom.memory_bytes,
            )
    results = []
    for directory, size in sorted(sizes.items()):
        name = Path(directory).name
        topic, _, p = name.rpartition("-")
        entry = out.get((topic, int(p)), dict(records=0, unkeyed=0, distinct_keys=0.0, distinct_bound=0.0,
                                             method="exact" if exact else "bloom", filter_bytes=0))
        results.append(dict(name=name, size_bytes=size, **entry))
    return results
