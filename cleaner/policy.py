"""Each topic's cleanup policy and where it came from: no topic is compacted, nor deleted, by guess.

Owns the one rule `clean` and the daemon both apply (`resolve_policy`) and what a log dir says about its
cluster (`ClusterView`: the KRaft metadata log, the node id and mode from `meta.properties`). A topic's
policy comes, in order, from:

1. the user's topic-level value: `[topics.<name>] "cleanup.policy"` (the more specific wins), else a flat
   `cleanup.policy` given with `--set` (which beats the config file's) or in the config file: it applies to every
   topic, Kafka's internal ones too (step 3 is not reached);
2. the cluster's own topic config in the KRaft metadata log (`segments.tools.kraft`);
3. Kafka's internal topics `__consumer_offsets` and `__transaction_state`: compacted, as Kafka creates them;
4. the broker level: a `log.cleanup.policy` the user gave logcleaner (`--set`, the config file) decides
   every remaining topic; otherwise, for a topic the KRaft metadata lists with no override of its own,
   the broker's default — KRaft's dynamic cluster or broker config, else the broker's `server.properties`
   (where no `log.cleanup.policy` line means Kafka's default, `delete`);
5. for a partition directory named on `clean`'s command line: compact (the user asked for it).

Anything else is unknown — a ZooKeeper-mode broker keeps topic overrides in ZooKeeper, which we cannot
see, so its `server.properties` alone decides nothing — and an unknown topic is reported with the line
that would decide it and left exactly as it is: never compacted, never deleted. KRaft's
`__cluster_metadata` and partitions of topics the metadata says were deleted are never touched.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from segments.codec.errors import SegmentError, display_path
from segments.files.pathcheck import describe_os_error
from segments.tools.kraft import METADATA_PARTITION, ClusterMetadata, find_metadata_log, read_cluster_metadata

from .config_file import ConfigFileError, read_server_properties
from .errors import CleanerError
from .settings import SettingError, Settings

__all__ = [
    "INTERNAL_COMPACTED_TOPICS",
    "NEVER_TOUCHED_TOPICS",
    "ClusterView",
    "PolicyError",
    "TopicPolicy",
    "cluster_view",
    "resolve_policy",
    "unknown_policy_hint",
]

INTERNAL_COMPACTED_TOPICS = frozenset({"__consumer_offsets", "__transaction_state"})
NEVER_TOUCHED_TOPICS = frozenset({"__cluster_metadata"})  # KRaft's metadata log: Kafka manages it itself
META_PROPERTIES = "meta.properties"


class PolicyError(CleanerError, ValueError):
    """The cluster's metadata cannot be read, or holds a config value out of range."""


@dataclass(frozen=True)
class ClusterView:
    """What a log dir says about the cluster it belongs to, and the settings that follow from it."""

    log_dir: str
    mode: str  # "kraft", "zookeeper" (meta.properties version 0) or "unknown" (no meta.properties)
    node_id: str | None
    metadata: ClusterMetadata | None
    settings: Settings  # the user's settings with the cluster's configs added (`Settings.with_cluster`)

    def describe(self) -> str:
        if self.metadata is not None:
            topics = len(self.metadata.topics)
            return f"{self.metadata.label} (up to offset {self.metadata.end_offset}, {topics} topic(s))"
        if self.mode == "zookeeper":
            return "a ZooKeeper-mode broker's log dir (topic configs live in ZooKeeper)"
        return "no KRaft metadata log"


@dataclass(frozen=True, slots=True)
class TopicPolicy:
    """A topic's policy (None: unknown or never touched), where it came from, and for an unknown one why."""

    topic: str
    policy: tuple[str, ...] | None
    source: str
    never: bool = False  # a topic logcleaner never touches, whatever the settings say

    @property
    def known(self) -> bool:
        return self.policy is not None

    def describe(self) -> str:
        if self.policy is None:
            return f"{'never touched' if self.never else 'policy unknown'}: {self.source}"
        return f"{','.join(self.policy)} (from {self.source})"


def _meta_properties(log_dir: Path) -> dict[str, str]:
    try:
        return read_server_properties(log_dir / META_PROPERTIES)
    except ConfigFileError:
        return {}


def cluster_view(log_dir: str | os.PathLike, settings: Settings) -> ClusterView:
    """What `log_dir` says about its cluster: `meta.properties`, and the KRaft metadata log found in the log
    dir itself, else at `metadata.log.dir`, else in the configured `log.dirs` (when given).

    Raises `PolicyError` naming the file when a metadata log exists but cannot be read or decoded, or
    holds a value out of range: its topics' policies must not be guessed around it.
    """
    log_dir = Path(log_dir)
    meta = _meta_properties(log_dir)
    version = meta.get("version")
    mode = "kraft" if version == "1" or "node.id" in meta else "zookeeper" if version == "0" else "unknown"
    node_id = meta.get("node.id") or meta.get("broker.id")
    candidates: list[str | os.PathLike] = [log_dir]
    if settings.cleaner.metadata_log_dir:
        candidates.append(settings.cleaner.metadata_log_dir)
    if "log.dirs" in settings.explicit:
        candidates.extend(settings.cleaner.log_dirs)
    found = find_metadata_log(candidates)
    if found is None:
        return ClusterView(str(log_dir), mode, node_id, None, settings)
    try:
        metadata = read_cluster_metadata(found)
        with_cluster = settings.with_cluster(metadata.label, metadata.topic_configs, metadata.broker_configs, node_id)
    except (SegmentError, SettingError) as exc:
        raise PolicyError(f"cannot read the cluster's topic configs: {exc}") from None
    except OSError as exc:
        raise PolicyError(f"cannot read the cluster's topic configs: {describe_os_error(exc)}") from None
    return ClusterView(str(log_dir), "kraft", node_id, metadata, with_cluster)


def resolve_policy(topic: str, view: ClusterView, *, named: bool = False) -> TopicPolicy:
    """`topic`'s cleanup policy by the rule of the module docstring; `named`: its partition directory was
    named on `clean`'s command line."""
    settings = view.settings
    metadata = view.metadata
    if topic in NEVER_TOUCHED_TOPICS:
        return TopicPolicy(topic, None, "KRaft's metadata log, managed by Kafka itself", never=True)
    if metadata is not None and topic in metadata.removed_topics and topic not in metadata.topics:
        return TopicPolicy(topic, None, f"the topic was deleted ({metadata.label}); Kafka removes its files",
                           never=True)
    policy = settings.topic(topic).cleanup_policy
    topic_level = ("cleanup.policy" in settings.topics.get(topic, {}) or "cleanup.policy" in settings.topic_defaults
                   or "cleanup.policy" in settings.cluster_topics.get(topic, {}))
    if topic_level:  # the user's [topics.<name>] or flat value, else the cluster's topic config
        return TopicPolicy(topic, policy, str(settings.source_of(topic, "cleanup.policy")))
    if topic in INTERNAL_COMPACTED_TOPICS:
        return TopicPolicy(topic, ("compact",), "Kafka's internal topic, compacted as Kafka creates it")
    broker_source = settings.sources.get("log.cleanup.policy") if "log.cleanup.policy" in settings.explicit else None
    if broker_source is not None and broker_source.kind in ("set", "file"):
        return TopicPolicy(topic, policy, f"log.cleanup.policy in {broker_source}")
    if metadata is not None and topic in metadata.topics:
        if broker_source is not None:
            return TopicPolicy(topic, policy, f"log.cleanup.policy in {broker_source}; no topic override in "
                                              f"{metadata.label}")
        if settings.broker_file is not None:
            return TopicPolicy(topic, policy, f"Kafka's default: no log.cleanup.policy in {settings.broker_file} "
                                              f"and no topic override in {metadata.label}")
    if named:
        return TopicPolicy(topic, ("compact",), "its partition directory was named on the command line")
    # A broker's default (its server.properties, KRaft's dynamic config) decides only topics the metadata lists:
    # say so when there is one, lest it look ignored.
    broker_default = ""
    if broker_source is not None:
        broker_default = f"; the log.cleanup.policy of {broker_source} applies only to topics the KRaft metadata lists"
    elif settings.broker_file is not None:
        broker_default = (f"; {settings.broker_file} (no log.cleanup.policy: Kafka's default, delete) applies only "
                          "to topics the KRaft metadata lists")
    if metadata is not None and topic in metadata.topics:
        why = (f"no topic override in {metadata.label}, and the broker's log.cleanup.policy is not known "
               "(give its server.properties with --server-properties)")
    elif metadata is not None:
        why = f"not a topic in {metadata.label}{broker_default}"
    elif view.mode == "zookeeper":
        why = ("a ZooKeeper-mode broker keeps topic configs in ZooKeeper, which logcleaner does not read"
               f"{broker_default}")
    else:
        why = (f"no KRaft metadata log ({METADATA_PARTITION}) in {display_path(view.log_dir)} or at "
               "metadata.log.dir, and no cleanup.policy or log.cleanup.policy of the config file or --set names it"
               f"{broker_default}")
    return TopicPolicy(topic, None, why)


def unknown_policy_hint(topic: str, *, daemon: bool = False) -> str:
    """The config-file line that decides `topic` (the user picks compact or delete), and what decides every topic:
    `--set cleanup.policy=...` for `clean`, the config file's flat value for the daemon (`run` has no `--set`)."""
    every = 'the config file\'s flat "cleanup.policy" = ...' if daemon else "--set cleanup.policy=..."
    return f'[topics.{topic}] "cleanup.policy" = "compact"   (or "delete"; {every} decides every topic)'
