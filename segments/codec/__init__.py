"""Layer 1 of `segments/`: the byte grammar of Kafka's log format, pure functions over buffers, no files.

Format constants and struct layouts (`format`: every offset and width, which all the rest use), varints, v2
record batches (`records`), legacy messages (`legacy`), the five codecs (`compression`), walking concatenated
batches and the one reader of a batch header by position, any magic (`batches`: `peek_header`), the bulk scan
and its compiled kernels (`scan`, `_scan_kernels`), the compiled v2 header writer (`_header_kernels`), KRaft
metadata records (`metadata_records`), and the exceptions of all of `segments/` with the one way paths are
displayed (`errors`, which imports nothing of ours).
Imports nothing from the layers above (`files`, `partition`, `tools`, `spark`).
"""
