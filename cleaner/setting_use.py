"""Which settings `logcleaner clean` does not use, and the one line with which `clean --set` refuses them.

Owns the rule that no setting is accepted and then ignored: a value a user types with `--set` either
changes what `clean` does or is refused, naming the setting and why. Two kinds are refused:

* daemon settings (`logcleaner run`): which log to clean next and when — `clean` cleans every partition it
  is given, once (on `log.cleaner.threads` threads, which it does use);
* settings no part of logcleaner uses (Kafka's writer or broker-internal knobs with no equivalent here).

(`log.dirs` is not among them: `clean` looks there for the cluster's KRaft metadata, as it does at
`metadata.log.dir`.) A config file or a `server.properties` may hold any of them: a broker's file holds many settings `clean`
has no use for, so they are read (and checked) but not refused. `tests/cleaner/test_settings_used.py`
walks the whole settings table and shows, for each setting, a command whose outcome it changes or this
refusal. `clean --spark` also refuses what only threads use (`SPARK_CLEAN_REFUSES`). Pure data and lookups;
no I/O.
"""

from __future__ import annotations

from types import MappingProxyType

__all__ = ["CLEAN_REFUSES", "DAEMON_ONLY", "SPARK_CLEAN_REFUSES", "UNUSED", "refusal_for_clean",
           "refusal_for_spark_clean"]

_PICKS = "the daemon uses it to choose which log to clean next; clean cleans every partition it is given"

DAEMON_ONLY = MappingProxyType({
    "log.cleaner.enable": "clean always cleans the partitions it is given",
    "log.cleaner.backoff.ms": "it is how long the daemon's threads wait when no log is cleanable",
    "log.retention.check.interval.ms": "clean applies retention once, every time it runs",
    "log.cleanup.interval.mins": "clean applies retention once, every time it runs",
    "log.cleaner.min.cleanable.ratio": "clean cleans every dirty section it is given, whatever its dirty ratio",
    "min.cleanable.dirty.ratio": "clean cleans every dirty section it is given, whatever its dirty ratio",
    "log.cleaner.max.compaction.lag.ms": _PICKS,
    "max.compaction.lag.ms": _PICKS,
    "log.cleaner.selection.policy": _PICKS,
    "log.cleaner.survivorship.backstop.ratio": _PICKS,
})

UNUSED = MappingProxyType({
    "log.cleaner.io.buffer.size": "logcleaner reads and writes in windows of its own size (16 MiB)",
    "message.max.bytes": "it limits the batches a writer appends; cleaning reads and rewrites batches of any size",
    "max.message.bytes": "it limits the batches a writer appends; cleaning reads and rewrites batches of any size",
    "log.roll.ms": "it rolls a writer's active segment; cleaning never rolls one",
    "segment.ms": "it rolls a writer's active segment; cleaning never rolls one",
    "log.segment.delete.delay.ms": "replaced segment files are deleted as soon as the swap is durable",
    "file.delete.delay.ms": "replaced segment files are deleted as soon as the swap is durable",
    "log.preallocate": "segment and index files are never preallocated",
    "preallocate": "segment and index files are never preallocated",
})

CLEAN_REFUSES = MappingProxyType({
    **{name: f"--set {name}: a daemon setting (logcleaner run) that clean does not use: {why}"
       for name, why in DAEMON_ONLY.items()},
    **{name: f"--set {name}: not used by logcleaner: {why}" for name, why in UNUSED.items()},
})


def refusal_for_clean(name: str) -> str | None:
    """The one-line refusal of `clean --set <name>=...`, or None when `clean` uses the setting."""
    return CLEAN_REFUSES.get(name)


SPARK_CLEAN_REFUSES = MappingProxyType({
    "log.cleaner.threads": "--set log.cleaner.threads: clean --spark cleans one partition at a time in each Spark "
                           "task, with the whole log.cleaner.dedupe.buffer.size; the executors' cores "
                           "(spark.executor.cores) set how many run at once",
})


def refusal_for_spark_clean(name: str) -> str | None:
    """The one-line refusal of `clean --spark --set <name>=...` beyond `refusal_for_clean`'s, or None."""
    return SPARK_CLEAN_REFUSES.get(name)
