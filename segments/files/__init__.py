"""Layer 2 of `segments/`: one segment's files on disk, and the filesystem rules for touching them.

The file-name grammar (`names`), what may be opened inside a log dir (`pathcheck`: no links, only regular
files, partition directory names), durable file operations and their fault points (`fileio`, `faults`),
read-ahead over a file (`readahead`), the offset and time indexes (`index`), the transaction index
(`txnindex`) and the segment that ties a `.log` to them (`segment`, which also reads the header of the
batch at a file position: `read_header_at`). Imports only `segments.codec`.
"""
