"""The cleaner: one cleaning round of one log, the manager and thread pool of the daemon, and the CLI.

Modules and what they own: `round` (one round: survey, range, index, recopy, swap, checkpoint) built from
`survey`, `cleanable`, `indexing` and `recopy`; `settings` and `config_file` (Kafka-named settings);
`errors` (`CleanerError`, the root of every exception class of the package); `launch` (one round set up
and run with the broker settings, by `clean` and the daemon alike); `oneshot` (what `logcleaner clean` does);
`manager`, `pool`, `throttle`, `retention`, `idle`, `metrics`, `admin_http`, `admin_token` and `daemon` (what
`logcleaner run` does); `cli` (the click commands). The daemon and the one-shot cleaner never import pyspark.
"""

from .config_file import ConfigFileError, LoadedConfig, load_config
from .errors import CleanerError
from .oneshot import PartitionOutcome, clean_partition, find_partitions
from .round import CleaningAbortedError, RoundResult, clean_round
from .settings import SettingError, Settings, TopicSettings

__all__ = [
    "CleanerError",
    "CleaningAbortedError",
    "ConfigFileError",
    "LoadedConfig",
    "PartitionOutcome",
    "RoundResult",
    "SettingError",
    "Settings",
    "TopicSettings",
    "clean_partition",
    "clean_round",
    "find_partitions",
    "load_config",
]
