"""Layer 4 of `segments/`: read-only tools over partitions, and the generator of synthetic ones.

`dump` (Kafka's DumpLogSegments), `verify` (every check a reader makes, without changing a file),
`kraft` (a KRaft cluster's topics and configs from its metadata log) and `generate` (deterministic
partitions for the demo, tests and benchmarks). Imports the layers below, never `segments.spark`.
"""
