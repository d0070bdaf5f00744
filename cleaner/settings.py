"""Kafka-named settings: their defaults, types and ranges, and the resolved values a round uses.

Owns the table of every setting an operator may type (`log.cleaner.dedupe.buffer.size`,
`delete.retention.ms`, ...), parsing a value given as text (`--set KEY=VALUE`, a TOML file or a Kafka
`server.properties`), rejecting a bad one with a message naming the key, the value and the allowed range,
and resolving a topic's effective settings and where each came from (`Settings.source_of`), in this
order: the user's `[topics.<name>]` table, the user's flat topic-level value (`--set`, the config file),
the cluster's own topic config (KRaft metadata, `with_cluster`), the broker-level synonym (the user's
`--set`/config file, KRaft's dynamic broker and cluster defaults, the broker's `server.properties`), and
last Kafka's default. It does no I/O beyond parsing text it is given and holds no global state.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from segments.partition.log import LogConfig

from .errors import CleanerError

__all__ = [
    "BROKER_SETTINGS",
    "TOPIC_SETTINGS",
    "CleanerSettings",
    "SettingError",
    "SettingSource",
    "Settings",
    "TopicSettings",
    "broker_attribute",
    "parse_size",
]

_LONG_MAX = 2**63 - 1
_INT_MAX = 2**31 - 1
SIZE_EXPECTED = "a whole number of bytes, optionally with a binary unit (64KiB, 128MiB, 1GiB; k, m, g also)"


class SettingError(CleanerError, ValueError):
    """A setting name that does not exist, or a value outside its allowed range."""

    def __init__(self, key: str, value: object, reason: str) -> None:
        self.key = key
        self.value = value
        self.reason = reason
        super().__init__(f"setting {key!r} = {value!r}: {reason}")


@dataclass(frozen=True, slots=True)
class Setting:
    """One Kafka setting: its type ("int", "float", "bool", "list", "str"), default and inclusive range."""

    name: str
    kind: str
    default: Any
    low: float | None = None
    high: float | None = None
    choices: tuple[str, ...] = ()
    doc: str = ""

    def _expected(self) -> str:
        """What a value of this setting must look like, for messages."""
        if self.kind == "int" and ("bytes" in self.name or "size" in self.name):
            return SIZE_EXPECTED
        return _EXPECTED[self.kind]

    def parse(self, value: object) -> Any:
        """The typed value of `value` (text or already typed); raises `SettingError` if out of range."""
        parsed: Any
        try:
            if self.kind == "int":
                parsed = value if isinstance(value, int) and not isinstance(value, bool) else parse_size(str(value))
            elif self.kind == "float":
                parsed = float(value if isinstance(value, (int, float)) else str(value))
                if math.isnan(parsed):
                    raise ValueError("NaN")
            elif self.kind == "bool":
                if isinstance(value, bool):
                    parsed = value
                elif str(value).strip().lower() in ("true", "false"):
                    parsed = str(value).strip().lower() == "true"
                else:
                    raise ValueError("expected true or false")
            elif self.kind == "list":
                items = value if isinstance(value, (list, tuple)) else str(value).split(",")
                parsed = tuple(str(v).strip() for v in items if str(v).strip())
            else:
                parsed = str(value)
        except (TypeError, ValueError):  # Python's own message ("invalid literal for int()") is not shown
            raise SettingError(self.name, value, f"expected {self._expected()}") from None
        if self.kind in ("int", "float"):
            if (self.low is not None and parsed < self.low) or (self.high is not None and parsed > self.high):
                raise SettingError(self.name, value, f"must be in [{_fmt(self.low)}, {_fmt(self.high)}]")
        if self.choices:
            values = parsed if isinstance(parsed, tuple) else (parsed,)
            bad = [v for v in values if v not in self.choices]
            if bad or not values:
                allowed = ", ".join(self.choices)
                if self.kind == "list":  # a list of them too, in any order: cleanup.policy's compact,delete
                    allowed += f" and {','.join(sorted(self.choices))} (a comma-separated list of them)"
                raise SettingError(self.name, value, f"allowed values are {allowed}")
        return parsed


_EXPECTED = {  # what a value of each kind must look like, for messages
    "int": "a whole number",
    "float": "a number (e.g. 0.5, 1e6)",
    "bool": "true or false",
    "list": "a comma-separated list",
    "str": "text",
}


def _fmt(bound: float | None) -> str:
    if bound is None:
        return "unbounded"
    if bound == _LONG_MAX:
        return "Long.MAX_VALUE"
    if bound == _INT_MAX:
        return "Int.MAX_VALUE"
    return str(bound)


def parse_size(text: str) -> int:
    """An integer, optionally with a binary unit suffix (`128MiB`, `64k`, `1g`), or `Long.MAX_VALUE`.

    The one size parser of `--set`, the config files and the CLI's size options. Raises `ValueError` whose
    message says what was expected (`SIZE_EXPECTED`), never Python's own."""
    t = text.strip()
    if t in ("Long.MAX_VALUE", "9223372036854775807"):
        return _LONG_MAX
    t = t.replace("_", "")  # digit separators, as in 134_217_728
    units = {"kib": 1024, "k": 1024, "kb": 1024, "mib": 1024**2, "m": 1024**2, "mb": 1024**2,
             "gib": 1024**3, "g": 1024**3, "gb": 1024**3}
    lower = t.lower()
    for suffix in sorted(units, key=len, reverse=True):
        if lower.endswith(suffix) and _is_integer(lower[: -len(suffix)].strip()):
            return int(lower[: -len(suffix)]) * units[suffix]
    if not _is_integer(t):
        raise ValueError(f"{text!r} is not a size: expected {SIZE_EXPECTED}")
    return int(t)


def _is_integer(text: str) -> bool:
    """Whether `text` is a decimal integer with an optional sign (ASCII digits only)."""
    digits = text[1:] if text[:1] in "+-" else text
    return digits.isascii() and digits.isdigit()


def _s(name, kind, default, low=None, high=None, choices=(), doc=""):
    return Setting(name, kind, default, low, high, tuple(choices), doc)


# Broker-level settings of the cleaner itself (Kafka's names and defaults).
BROKER_SETTINGS: dict[str, Setting] = {
    s.name: s
    for s in [
        _s("log.dirs", "list", ("/tmp/kafka-logs",), doc="log directories holding <topic>-<partition>/ dirs"),
        _s("metadata.log.dir", "str", None,
           doc="KRaft: the directory holding __cluster_metadata-0 (Kafka's default: the first of log.dirs)"),
        _s("log.cleaner.enable", "bool", True, doc="run the cleaner at all"),
        _s("log.cleaner.threads", "int", 1, 1, 64, doc="cleaner threads; each has its own offset map"),
        _s("log.cleaner.dedupe.buffer.size", "int", 128 * 1024 * 1024, 48, _LONG_MAX,
           doc="offset-map memory across all threads (24 bytes a key slot)"),
        _s("log.cleaner.io.buffer.load.factor", "float", 0.9, 0.01, 1.0, doc="max fill of the offset map"),
        _s("log.cleaner.io.buffer.size", "int", 512 * 1024, 1024, _INT_MAX, doc="I/O buffer memory across threads"),
        _s("log.cleaner.io.max.bytes.per.second", "float", 1.7976931348623157e308, 1.0, None,
           doc="shared read+write throttle of all cleaner threads"),
        # logcleaner's own (not Kafka's): how cleaned segments are written (segments/files/direct.py)
        _s("log.cleaner.io.direct", "bool", True,
           doc="write cleaned segments around the page cache (O_DIRECT) where the filesystem allows it"),
        _s("log.cleaner.backoff.ms", "int", 15_000, 0, _LONG_MAX, doc="sleep when no log is cleanable"),
        _s("message.max.bytes", "int", 1_048_588, 0, _INT_MAX, doc="largest batch; floor of buffer growth"),
        _s("producer.id.expiration.ms", "int", 86_400_000, 1, _INT_MAX,
           doc="idle producers expire; their last batch no longer needs keeping"),
        _s("log.retention.check.interval.ms", "int", 300_000, 1, _LONG_MAX,
           doc="how often retention (delete policy) runs; log.cleanup.interval.mins is accepted as an alias"),
        _s("log.cleanup.interval.mins", "int", None, 1, _INT_MAX // 60_000,
           doc="Kafka's old name: log.retention.check.interval.ms in minutes (that setting wins if both are set)"),
        # broker-level defaults of topic settings (synonyms)
        _s("log.cleanup.policy", "list", ("delete",), choices=("delete", "compact")),
        _s("log.cleaner.min.cleanable.ratio", "float", 0.5, 0.0, 1.0),
        _s("log.cleaner.min.compaction.lag.ms", "int", 0, 0, _LONG_MAX),
        _s("log.cleaner.max.compaction.lag.ms", "int", _LONG_MAX, 1, _LONG_MAX),
        _s("log.cleaner.delete.retention.ms", "int", 86_400_000, 0, _LONG_MAX),
        _s("log.segment.bytes", "int", 1024**3, 14, _INT_MAX),
        _s("log.index.size.max.bytes", "int", 10 * 1024 * 1024, 24, _INT_MAX),
        _s("log.index.interval.bytes", "int", 4096, 0, _INT_MAX),
        _s("log.segment.delete.delay.ms", "int", 60_000, 0, _LONG_MAX),
        _s("log.roll.ms", "int", 7 * 24 * 3600 * 1000, 1, _LONG_MAX),
        _s("log.retention.ms", "int", 7 * 24 * 3600 * 1000, -1, _LONG_MAX,
           doc="-1: no time limit; when unset, log.retention.minutes, else log.retention.hours gives it"),
        _s("log.retention.minutes", "int", None, -1, _INT_MAX),
        _s("log.retention.hours", "int", 168, -1, _INT_MAX),
        _s("log.retention.bytes", "int", -1, -1, _LONG_MAX),
        _s("log.preallocate", "bool", False),
        # logcleaner's own (not Kafka's): the safety check before each swap (cleaner/safety.py)
        _s("log.cleaner.verify", "bool", False,
           doc="before a group is swapped in, confirm every latest record of its input is in its output"),
        # logcleaner's own (not Kafka's): generational cleaning (cleaner/generations.py)
        _s("log.cleaner.mode", "str", "full", choices=("full", "generational"),
           doc="full: recopy the whole log every round (Kafka); generational: merge only young generations"),
        _s("log.cleaner.generation.ratio", "float", 4.0, 1.0, 1e6,
           doc="a generation joins a merge while its size is at most this times the bytes merged so far"),
        # logcleaner's own: survivorship-aware scheduling (cleaner/survivorship.py)
        _s("log.cleaner.selection.policy", "str", "dirty-ratio", choices=("dirty-ratio", "survivorship"),
           doc="dirty-ratio: Kafka's ranking; survivorship: expected bytes freed per byte of cleaning I/O"),
        _s("log.cleaner.survivorship.alpha", "float", 0.5, 0.01, 1.0,
           doc="weight of the newest round in each partition's smoothed survivorship"),
        _s("log.cleaner.survivorship.backstop.ratio", "float", 0.9, 0.0, 1.0,
           doc="survivorship policy: clean anyway once the plain dirty ratio reaches this"),
    ]
}

# Topic-level settings and their broker-level synonyms.
TOPIC_SETTINGS: dict[str, tuple[Setting, str | None]] = {
    s.name: (s, synonym)
    for s, synonym in [
        (_s("cleanup.policy", "list", ("delete",), choices=("delete", "compact")), "log.cleanup.policy"),
        (_s("min.cleanable.dirty.ratio", "float", 0.5, 0.0, 1.0), "log.cleaner.min.cleanable.ratio"),
        (_s("min.compaction.lag.ms", "int", 0, 0, _LONG_MAX), "log.cleaner.min.compaction.lag.ms"),
        (_s("max.compaction.lag.ms", "int", _LONG_MAX, 1, _LONG_MAX), "log.cleaner.max.compaction.lag.ms"),
        (_s("delete.retention.ms", "int", 86_400_000, 0, _LONG_MAX), "log.cleaner.delete.retention.ms"),
        (_s("segment.bytes", "int", 1024**3, 14, _INT_MAX), "log.segment.bytes"),
        (_s("segment.index.bytes", "int", 10 * 1024 * 1024, 24, _INT_MAX), "log.index.size.max.bytes"),
        (_s("index.interval.bytes", "int", 4096, 0, _INT_MAX), "log.index.interval.bytes"),
        (_s("file.delete.delay.ms", "int", 60_000, 0, _LONG_MAX), "log.segment.delete.delay.ms"),
        (_s("segment.ms", "int", 7 * 24 * 3600 * 1000, 1, _LONG_MAX), "log.roll.ms"),
        (_s("max.message.bytes", "int", 1_048_588, 0, _INT_MAX), "message.max.bytes"),
        (_s("retention.ms", "int", 7 * 24 * 3600 * 1000, -1, _LONG_MAX), "log.retention.ms"),
        (_s("retention.bytes", "int", -1, -1, _LONG_MAX), "log.retention.bytes"),
        (_s("preallocate", "bool", False), "log.preallocate"),
        (_s("cleaner.mode", "str", "full", choices=("full", "generational")), "log.cleaner.mode"),
        (_s("cleaner.generation.ratio", "float", 4.0, 1.0, 1e6), "log.cleaner.generation.ratio"),
    ]
}


def _derive_broker_values(broker: dict[str, Any], explicit: frozenset[str]) -> None:
    """Fill in the broker values Kafka derives from other names, in Kafka's order of precedence.

    `log.retention.ms`, else `log.retention.minutes`, else `log.retention.hours` (a negative value of
    whichever decides means no time limit); `log.retention.check.interval.ms`, else its old name
    `log.cleanup.interval.mins`.
    """
    if "log.retention.ms" not in explicit:
        if "log.retention.minutes" in explicit:
            ms = broker["log.retention.minutes"] * 60_000
        else:
            ms = broker["log.retention.hours"] * 3_600_000
        broker["log.retention.ms"] = ms if ms >= 0 else -1
    if "log.retention.check.interval.ms" not in explicit and "log.cleanup.interval.mins" in explicit:
        broker["log.retention.check.interval.ms"] = broker["log.cleanup.interval.mins"] * 60_000


@dataclass(frozen=True, slots=True)
class SettingSource:
    """Where a value came from: `kind` is "set" (`--set`), "file" (the TOML config), "server.properties"
    or "kraft" (the cluster's metadata log); `where` names it for a person."""

    kind: str
    where: str

    def __str__(self) -> str:
        return self.where


_USER_KINDS = ("set", "file")  # values the user gave logcleaner itself; they win over the cluster's


@dataclass(frozen=True, slots=True)
class TopicSettings:
    """The effective settings of one topic for one round (Kafka names in comments)."""

    cleanup_policy: tuple[str, ...]  # cleanup.policy
    min_cleanable_dirty_ratio: float  # min.cleanable.dirty.ratio
    min_compaction_lag_ms: int  # min.compaction.lag.ms
    max_compaction_lag_ms: int  # max.compaction.lag.ms
    delete_retention_ms: int  # delete.retention.ms
    segment_bytes: int  # segment.bytes
    segment_index_bytes: int  # segment.index.bytes
    index_interval_bytes: int  # index.interval.bytes
    file_delete_delay_ms: int  # file.delete.delay.ms
    segment_ms: int  # segment.ms
    max_message_bytes: int  # max.message.bytes
    retention_ms: int  # retention.ms
    retention_bytes: int  # retention.bytes
    preallocate: bool  # preallocate
    cleaner_mode: str = "full"  # cleaner.mode (logcleaner's own): "full" or "generational"
    cleaner_generation_ratio: float = 4.0  # cleaner.generation.ratio (logcleaner's own)

    @property
    def compact(self) -> bool:
        return "compact" in self.cleanup_policy

    def log_config(self) -> LogConfig:
        """The settings the partition log itself uses (rolling, indexing, batch size limit)."""
        return LogConfig(
            segment_bytes=self.segment_bytes,
            segment_ms=self.segment_ms,
            segment_index_bytes=self.segment_index_bytes,
            index_interval_bytes=self.index_interval_bytes,
            max_message_bytes=self.max_message_bytes,
        )


def broker_attribute(name: str) -> str:
    """The `CleanerSettings` attribute of broker setting `name`: the Kafka name without its `log.cleaner.`
    prefix, dots made underscores (`log.cleaner.threads` → `threads`, `log.dirs` → `log_dirs`)."""
    return name.removeprefix("log.cleaner.").replace(".", "_")


@dataclass(frozen=True, slots=True)
class CleanerSettings:
    """The broker-level settings, typed: one attribute per name of `BROKER_SETTINGS` (`broker_attribute`).

    Built once per `Settings` (its `cleaner`) from the resolved broker values, defaults filled in and derived
    values (`log.retention.ms`, `log.retention.check.interval.ms`) derived; code reads a broker setting here,
    never by its name. `from_broker` takes exactly the table's names, so a setting added to the table without
    an attribute here (or the reverse) fails the first `Settings` built, and `tests/cleaner/test_settings.py`
    compares the two.
    """

    log_dirs: tuple[str, ...]  # log.dirs
    metadata_log_dir: str | None  # metadata.log.dir (None: the first of log.dirs, as Kafka)
    enable: bool  # log.cleaner.enable
    threads: int  # log.cleaner.threads
    dedupe_buffer_size: int  # log.cleaner.dedupe.buffer.size (across all threads)
    io_buffer_load_factor: float  # log.cleaner.io.buffer.load.factor
    io_buffer_size: int  # log.cleaner.io.buffer.size
    io_max_bytes_per_second: float  # log.cleaner.io.max.bytes.per.second
    io_direct: bool  # log.cleaner.io.direct (logcleaner's own)
    backoff_ms: int  # log.cleaner.backoff.ms
    message_max_bytes: int  # message.max.bytes
    producer_id_expiration_ms: int  # producer.id.expiration.ms
    log_retention_check_interval_ms: int  # log.retention.check.interval.ms (derived from the next when unset)
    log_cleanup_interval_mins: int | None  # log.cleanup.interval.mins
    log_cleanup_policy: tuple[str, ...]  # log.cleanup.policy
    min_cleanable_ratio: float  # log.cleaner.min.cleanable.ratio
    min_compaction_lag_ms: int  # log.cleaner.min.compaction.lag.ms
    max_compaction_lag_ms: int  # log.cleaner.max.compaction.lag.ms
    delete_retention_ms: int  # log.cleaner.delete.retention.ms
    log_segment_bytes: int  # log.segment.bytes
    log_index_size_max_bytes: int  # log.index.size.max.bytes
    log_index_interval_bytes: int  # log.index.interval.bytes
    log_segment_delete_delay_ms: int  # log.segment.delete.delay.ms
    log_roll_ms: int  # log.roll.ms
    log_retention_ms: int  # log.retention.ms (derived from the next two when unset)
    log_retention_minutes: int | None  # log.retention.minutes
    log_retention_hours: int  # log.retention.hours
    log_retention_bytes: int  # log.retention.bytes
    log_preallocate: bool  # log.preallocate
    verify: bool  # log.cleaner.verify (logcleaner's own)
    mode: str  # log.cleaner.mode (logcleaner's own)
    generation_ratio: float  # log.cleaner.generation.ratio (logcleaner's own)
    selection_policy: str  # log.cleaner.selection.policy (logcleaner's own)
    survivorship_alpha: float  # log.cleaner.survivorship.alpha (logcleaner's own)
    survivorship_backstop_ratio: float  # log.cleaner.survivorship.backstop.ratio (logcleaner's own)

    @classmethod
    def from_broker(cls, broker: Mapping[str, Any]) -> "CleanerSettings":
        """The typed view of `broker`, which holds a value for every name of `BROKER_SETTINGS` and no other."""
        if set(broker) != set(BROKER_SETTINGS):
            missing, unknown = sorted(set(BROKER_SETTINGS) - set(broker)), sorted(set(broker) - set(BROKER_SETTINGS))
            raise ValueError(f"broker settings: missing {missing}, not settings {unknown}")
        return cls(**{broker_attribute(name): value for name, value in broker.items()})


@dataclass(frozen=True)
class Settings:
    """Broker-level values plus per-topic overrides, validated once at construction.

    `broker` maps broker setting names to typed values (defaults filled in); `cleaner` holds the same values
    as typed attributes (`CleanerSettings`), which is how code reads them; `topics` maps a topic name to its
    overrides by topic setting name (read through `topic()`). Unknown names raise `SettingError`.
    """

    broker: Mapping[str, Any] = field(default_factory=dict)
    topics: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    topic_defaults: Mapping[str, Any] = field(default_factory=dict)
    explicit: frozenset[str] = frozenset()  # the broker names given a value (the rest are defaults or derived)
    sources: Mapping[str, SettingSource] = field(default_factory=dict)  # flat name -> where it was given
    topic_sources: Mapping[str, SettingSource] = field(default_factory=dict)  # topic -> its [topics.<name>] table
    cluster_topics: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)  # KRaft topic configs
    cluster_label: str | None = None  # "KRaft metadata in <dir>" when `with_cluster` added them
    broker_file: str | None = None  # the server.properties read, if any
    cleaner: CleanerSettings = field(init=False, repr=False, compare=False)  # `broker`, typed

    def __post_init__(self) -> None:
        object.__setattr__(self, "cleaner", CleanerSettings.from_broker(self.broker))

    @classmethod
    def from_mappings(
        cls,
        values: Mapping[str, object] | None = None,
        topics: Mapping[str, Mapping[str, object]] | None = None,
        *,
        sources: Mapping[str, SettingSource] | None = None,
        topic_sources: Mapping[str, SettingSource] | None = None,
        cluster_topics: Mapping[str, Mapping[str, object]] | None = None,
        cluster_label: str | None = None,
        broker_file: str | None = None,
    ) -> "Settings":
        """Settings from flat `values` (broker names, or topic names meaning "every topic") and topic tables.

        `sources` says where each flat value came from (default: `--set`); `cluster_topics` are the
        cluster's own per-topic configs (below the user's, above the broker level)."""
        broker: dict[str, Any] = {name: s.default for name, s in BROKER_SETTINGS.items()}
        topic_defaults: dict[str, Any] = {}
        for key, raw in (values or {}).items():
            if key in BROKER_SETTINGS:
                broker[key] = BROKER_SETTINGS[key].parse(raw)
            elif key in TOPIC_SETTINGS:
                topic_defaults[key] = TOPIC_SETTINGS[key][0].parse(raw)
            else:
                raise SettingError(key, raw, "unknown setting (expected a Kafka broker or topic setting name)")
        explicit = frozenset(k for k in (values or {}) if k in BROKER_SETTINGS)
        _derive_broker_values(broker, explicit)
        parsed_topics: dict[str, dict[str, Any]] = {}
        for topic, overrides in (topics or {}).items():
            parsed_topics[topic] = {}
            for key, raw in overrides.items():
                if key not in TOPIC_SETTINGS:
                    raise SettingError(key, raw, f"unknown topic setting in [topics.{topic}]")
                parsed_topics[topic][key] = TOPIC_SETTINGS[key][0].parse(raw)
        parsed_cluster = {topic: {k: TOPIC_SETTINGS[k][0].parse(v) for k, v in configs.items() if k in TOPIC_SETTINGS}
                          for topic, configs in (cluster_topics or {}).items()}
        given = SettingSource("set", "--set")
        settings = cls(
            broker, parsed_topics, topic_defaults, explicit,
            sources={k: (sources or {}).get(k, given) for k in (values or {})},
            topic_sources=dict(topic_sources or {}), cluster_topics=parsed_cluster,
            cluster_label=cluster_label, broker_file=broker_file,
        )
        settings._check_relations()
        return settings

    def _flat(self) -> dict[str, object]:
        flat: dict[str, object] = {k: v for k, v in self.broker.items() if k in self.explicit}
        flat.update(self.topic_defaults)
        return flat

    def with_overrides(self, values: Mapping[str, object]) -> "Settings":
        """A copy with more flat values applied on top (as `--set` does over a config file)."""
        flat = self._flat()
        flat.update(values)
        sources = dict(self.sources)
        sources.update({k: SettingSource("set", "--set") for k in values})
        return Settings.from_mappings(flat, self.topics, sources=sources, topic_sources=self.topic_sources,
                                      cluster_topics=self.cluster_topics, cluster_label=self.cluster_label,
                                      broker_file=self.broker_file)

    def with_cluster(
        self,
        label: str,
        topic_configs: Mapping[str, Mapping[str, str]],
        broker_configs: Mapping[str, Mapping[str, str]],
        node_id: str | None = None,
    ) -> "Settings":
        """A copy that knows the cluster's own configs (KRaft metadata, named by `label`).

        `topic_configs` are per-topic overrides (below the user's topic-level values); `broker_configs`
        maps "" (the cluster default) and node ids to dynamic broker configs, which take the place of
        `server.properties` values and Kafka's defaults but never of a value the user gave logcleaner.
        Names that are not settings of ours (a broker holds many) are left out. Raises `SettingError`
        naming `label` for a value out of range.
        """
        flat = self._flat()
        sources = dict(self.sources)
        layers = [("", "cluster default")] + ([(node_id, f"broker {node_id}")] if node_id is not None else [])
        for name, what in layers:
            for key, raw in broker_configs.get(name, {}).items():
                if key in BROKER_SETTINGS and (key not in sources or sources[key].kind not in _USER_KINDS):
                    flat[key] = raw
                    sources[key] = SettingSource("kraft", f"{label} ({what})")
        cluster: dict[str, dict[str, str]] = {}
        for topic, configs in topic_configs.items():
            for key, raw in configs.items():
                if key in TOPIC_SETTINGS:
                    try:
                        TOPIC_SETTINGS[key][0].parse(raw)
                    except SettingError as exc:
                        raise SettingError(key, raw, f"{exc.reason} (topic {topic} in {label})") from None
                    cluster.setdefault(topic, {})[key] = raw
        try:
            return Settings.from_mappings(flat, self.topics, sources=sources, topic_sources=self.topic_sources,
                                          cluster_topics=cluster, cluster_label=label, broker_file=self.broker_file)
        except SettingError as exc:
            raise SettingError(exc.key, exc.value, f"{exc.reason} (from {sources.get(exc.key, label)})") from None

    def source_of(self, topic: str, name: str) -> SettingSource | None:
        """Where `topic`'s effective value of topic setting `name` comes from; None for Kafka's default."""
        if name in self.topics.get(topic, {}):
            return self.topic_sources.get(topic, SettingSource("file", f"[topics.{topic}]"))
        if name in self.topic_defaults:
            return self.sources.get(name, SettingSource("set", "--set"))
        if name in self.cluster_topics.get(topic, {}):
            return SettingSource("kraft", f"{self.cluster_label} (topic config)")
        synonym = TOPIC_SETTINGS[name][1]
        if synonym is not None and synonym in self.explicit:
            return self.sources.get(synonym, SettingSource("set", "--set"))
        return None

    def _check_relations(self) -> None:
        threads = self.cleaner.threads
        for topic in [None, *self.topics, *self.cluster_topics]:
            t = self.topic(topic or "")
            if t.min_compaction_lag_ms > t.max_compaction_lag_ms:
                raise SettingError(
                    "min.compaction.lag.ms", t.min_compaction_lag_ms,
                    f"must not exceed max.compaction.lag.ms ({t.max_compaction_lag_ms})",
                )
        per_thread = self.cleaner.dedupe_buffer_size // threads
        if per_thread < 48:
            raise SettingError(
                "log.cleaner.dedupe.buffer.size", self.cleaner.dedupe_buffer_size,
                f"must give each of the {threads} cleaner thread(s) at least 48 bytes (two 24-byte map slots)",
            )

    def topic(self, topic: str) -> TopicSettings:
        """The effective settings of `topic`, in the order of the module docstring (see `source_of`)."""
        overrides = self.topics.get(topic, {})
        cluster = self.cluster_topics.get(topic, {})
        values = {}
        for name, (setting, synonym) in TOPIC_SETTINGS.items():
            if name in overrides:
                values[name] = overrides[name]
            elif name in self.topic_defaults:
                values[name] = self.topic_defaults[name]
            elif name in cluster:
                values[name] = cluster[name]
            elif synonym is not None and synonym in self.broker:
                values[name] = self.broker[synonym]
            else:
                values[name] = setting.default
        return TopicSettings(**{name.replace(".", "_"): value for name, value in values.items()})
