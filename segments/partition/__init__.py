"""Layer 3 of `segments/`: a partition directory as one log, shared safely between processes.

The partition log (`log`: open, append, read, replace segments by the swap protocol), crash recovery of the
swap's leftovers (`recovery`), the locks between a writer, a cleaner and a Kafka broker (`locks`) and the
text checkpoint files (`checkpoint`). Imports only `segments.codec` and `segments.files`.
"""
