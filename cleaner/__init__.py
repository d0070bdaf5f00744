"""The cleaner: one cleaning round of one log, the manager and thread pool of the daemon, and the CLI.

Modules and what they own: `round` (one round: survey, range, index, recopy, swap, checkpoint) built from
`survey`, `cleanable`, `indexing` and `recopy`; `settings` and `config_file` (Kafka-named settings);
`errors` (`CleanerError`, the root of every exception class of the package); `launch` (one round set up
and run with the broker settings, by `clean` and the daemon alike); `oneshot` (what `logcleaner clean` does);
`manager`, `pool`, `throttle`, `retention`, `idle`, `metrics`, `admin_http`, `admin_token` and `daemon` (what
`logcleaner run` does); `cli` (the click commands). The daemon and the one-shot cleaner never import pyspark.
"""

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # for type checkers; at run time each name is imported at its first use (`__getattr__`)
    from .config_file import ConfigFileError, LoadedConfig, load_config
    from .errors import CleanerError
    from .oneshot import PartitionOutcome, clean_partition, find_partitions
    from .round import CleaningAbortedError, RoundResult, clean_round
    from .settings import SettingError, Settings, TopicSettings

# The public names and the modules they live in. The package imports none of them itself (PEP 562): importing
# one module of the package, `cleaner.cli` say, must not load every other one, the cleaning round's numpy and
# numba included (the start-up of `logcleaner --help`, issue 19).
_SOURCES = {
    ".config_file": ("ConfigFileError", "LoadedConfig", "load_config"),
    ".errors": ("CleanerError",),
    ".oneshot": ("PartitionOutcome", "clean_partition", "find_partitions"),
    ".round": ("CleaningAbortedError", "RoundResult", "clean_round"),
    ".settings": ("SettingError", "Settings", "TopicSettings"),
}
_MODULE_OF = {name: module for module, names in _SOURCES.items() for name in names}


def __getattr__(name: str) -> object:
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value  # once: later lookups do not come here
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_MODULE_OF})


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
