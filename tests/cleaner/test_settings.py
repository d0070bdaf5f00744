"""Settings (`cleaner.settings`) and config files (`cleaner.config_file`): validation messages that name the
key, the value and the allowed range; per-topic resolution; the TOML file; Kafka's `server.properties`."""

from __future__ import annotations

import ast
import dataclasses
import math
from pathlib import Path

import pytest

import cleaner
from cleaner.config_file import ConfigFileError, load_config, read_server_properties
from cleaner.settings import (
    BROKER_SETTINGS,
    TOPIC_SETTINGS,
    CleanerSettings,
    SettingError,
    Settings,
    broker_attribute,
    parse_size,
)

LONG_MAX = 2**63 - 1


def settings(values=None, topics=None) -> Settings:
    return Settings.from_mappings(values, topics)


# ---- one value: type and range --------------------------------------------------------------------------


@pytest.mark.parametrize("key, value, message", [
    ("log.cleaner.threads", 0, "setting 'log.cleaner.threads' = 0: must be in [1, 64]"),
    ("log.cleaner.threads", 65, "setting 'log.cleaner.threads' = 65: must be in [1, 64]"),
    ("min.cleanable.dirty.ratio", 1.5, "setting 'min.cleanable.dirty.ratio' = 1.5: must be in [0.0, 1.0]"),
    ("log.cleaner.min.cleanable.ratio", -0.1,
     "setting 'log.cleaner.min.cleanable.ratio' = -0.1: must be in [0.0, 1.0]"),
    ("max.compaction.lag.ms", 0, "setting 'max.compaction.lag.ms' = 0: must be in [1, Long.MAX_VALUE]"),
    ("log.cleaner.io.buffer.size", 10, "setting 'log.cleaner.io.buffer.size' = 10: must be in [1024, Int.MAX_VALUE]"),
    ("log.cleaner.io.max.bytes.per.second", 0,
     "setting 'log.cleaner.io.max.bytes.per.second' = 0: must be in [1.0, unbounded]"),
    ("segment.bytes", "13", "setting 'segment.bytes' = '13': must be in [14, Int.MAX_VALUE]"),
])
def test_an_out_of_range_value_names_the_key_the_value_and_the_range(key, value, message):
    with pytest.raises(SettingError) as info:
        settings({key: value})
    assert str(info.value) == message
    assert (info.value.key, info.value.value) == (key, value)


@pytest.mark.parametrize("key, value, expected", [
    ("log.cleaner.threads", "two", "a whole number"),
    ("log.cleaner.threads", True, "a whole number"),  # TOML `true` is not a thread count
    ("log.cleaner.threads", 1.5, "a whole number"),
    ("log.cleaner.dedupe.buffer.size", "abc", "a whole number of bytes, optionally with a binary unit"),
    ("min.cleanable.dirty.ratio", "half", "a number"),
    ("min.cleanable.dirty.ratio", math.nan, "a number"),
    ("log.cleaner.enable", "yes", "true or false"),
])
def test_a_value_of_the_wrong_type_names_the_key_the_value_and_what_was_expected(key, value, expected):
    with pytest.raises(SettingError, match=rf"setting '{key}' = .*: expected {expected}") as info:
        settings({key: value})
    assert "literal" not in str(info.value) and "could not convert" not in str(info.value)  # no Python internals


def test_values_given_as_text_are_parsed_like_kafka_does():
    s = settings({
        "log.cleaner.threads": "4",
        "log.cleaner.dedupe.buffer.size": "64MiB",
        "log.cleaner.enable": "FALSE",
        "log.cleaner.io.max.bytes.per.second": "1048576.5",
        "log.dirs": "/a, /b,,",
        "log.cleaner.max.compaction.lag.ms": "9223372036854775807",
    })
    assert s.broker["log.cleaner.threads"] == 4
    assert s.broker["log.cleaner.dedupe.buffer.size"] == 64 * 1024 * 1024
    assert s.broker["log.cleaner.enable"] is False
    assert s.broker["log.cleaner.io.max.bytes.per.second"] == 1048576.5
    assert s.broker["log.dirs"] == ("/a", "/b")
    assert s.broker["log.cleaner.max.compaction.lag.ms"] == LONG_MAX


@pytest.mark.parametrize("text, value", [
    ("128MiB", 128 * 1024**2), ("64k", 64 * 1024), ("1g", 1024**3), ("2 KB", 2048), ("1_000", 1000),
    ("-1", -1), ("9223372036854775807", LONG_MAX),
    ("Long.MAX_VALUE", LONG_MAX),
])
def test_parse_size_reads_integers_with_binary_units(text, value):
    assert parse_size(text) == value


def test_parse_size_rejects_an_unknown_unit():
    with pytest.raises(ValueError):
        parse_size("12QB")


def test_cleanup_policy_takes_a_list_of_known_policies_only():
    assert settings({"cleanup.policy": "compact, delete"}).topic("t").cleanup_policy == ("compact", "delete")
    assert settings({"cleanup.policy": ["compact"]}).topic("t").compact
    with pytest.raises(SettingError, match=r"'cleanup.policy' = 'compact,bogus': allowed values are delete, compact "
                                           r"and compact,delete \(a comma-separated list of them\)$"):
        settings({"cleanup.policy": "compact,bogus"})
    with pytest.raises(SettingError, match="allowed values"):
        settings({"cleanup.policy": ""})


def test_an_unknown_setting_is_rejected_by_name():
    with pytest.raises(SettingError, match=r"setting 'log.cleaner.thread' = 2: unknown setting"):
        settings({"log.cleaner.thread": 2})
    with pytest.raises(SettingError, match=r"'log.cleaner.threads' = 2: unknown topic setting in \[topics.orders\]"):
        settings(topics={"orders": {"log.cleaner.threads": 2}})


# ---- relations between settings ---------------------------------------------------------------------------------


def test_min_compaction_lag_above_max_compaction_lag_is_rejected_globally_and_per_topic():
    with pytest.raises(SettingError, match=r"'min.compaction.lag.ms' = 5000: must not exceed max.compaction.lag.ms \(1000\)"):
        settings({"min.compaction.lag.ms": 5000, "max.compaction.lag.ms": 1000})
    with pytest.raises(SettingError, match=r"must not exceed max.compaction.lag.ms \(1000\)"):
        settings({"min.compaction.lag.ms": 5000}, {"orders": {"max.compaction.lag.ms": 1000}})
    settings({"min.compaction.lag.ms": 1000, "max.compaction.lag.ms": 1000})  # equal is allowed


def test_the_dedupe_buffer_must_give_each_thread_two_map_slots():
    with pytest.raises(SettingError, match=r"'log.cleaner.dedupe.buffer.size' = 95: must give each of the 2 cleaner"):
        settings({"log.cleaner.dedupe.buffer.size": 95, "log.cleaner.threads": 2})
    settings({"log.cleaner.dedupe.buffer.size": 96, "log.cleaner.threads": 2})


# ---- resolving a topic's settings ---------------------------------------------------------------------------------


def test_a_topic_setting_comes_from_its_override_then_the_flat_default_then_the_broker_synonym_then_kafka():
    s = settings(
        {"log.cleaner.delete.retention.ms": 1000, "min.cleanable.dirty.ratio": 0.2, "log.cleaner.min.cleanable.ratio": 0.3},
        {"orders": {"min.cleanable.dirty.ratio": 0.9, "segment.bytes": "1MiB"}},
    )
    orders, other = s.topic("orders"), s.topic("other")
    assert orders.min_cleanable_dirty_ratio == 0.9  # the topic's own override
    assert other.min_cleanable_dirty_ratio == 0.2  # the flat topic-name default beats the broker synonym
    assert orders.delete_retention_ms == other.delete_retention_ms == 1000  # the broker synonym
    assert orders.segment_bytes == 1024 * 1024 and other.segment_bytes == 1024**3  # Kafka's default
    assert other.max_compaction_lag_ms == LONG_MAX and other.min_compaction_lag_ms == 0
    assert other.cleanup_policy == ("delete",) and not other.compact


def test_with_overrides_applies_values_on_top_and_validates_them_again():
    base = settings({"log.cleaner.threads": 2}, {"orders": {"min.cleanable.dirty.ratio": 0.9}})
    more = base.with_overrides({"delete.retention.ms": "0"})
    assert more.topic("x").delete_retention_ms == 0
    assert more.broker["log.cleaner.threads"] == 2
    assert more.topic("orders").min_cleanable_dirty_ratio == 0.9
    with pytest.raises(SettingError, match="log.cleaner.threads"):
        base.with_overrides({"log.cleaner.threads": "0"})


def test_every_setting_default_is_within_its_own_range():
    for setting in BROKER_SETTINGS.values():
        if setting.default is not None:  # None: unset unless given (log.retention.minutes, an alias)
            assert setting.parse(setting.default) == setting.default
    for setting, synonym in TOPIC_SETTINGS.values():
        assert setting.parse(setting.default) == setting.default
        if synonym is not None:
            assert BROKER_SETTINGS[synonym].default == setting.default, synonym


# ---- the TOML file -----------------------------------------------------------------------------------------------


def write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    return path


def test_load_config_reads_settings_topic_tables_and_the_server_table(tmp_path):
    path = write(tmp_path, "c.toml", """
"log.dirs" = ["/data/a", "/data/b"]
"log.cleaner.threads" = 3
"cleanup.policy" = "compact"

[server]
listen = "127.0.0.1:9999"
discovery_interval_ms = 200

[topics.orders]
"min.cleanable.dirty.ratio" = 0.1
"max.compaction.lag.ms" = 60000

[topics."with.dots"]
"delete.retention.ms" = 0
""")
    loaded = load_config(path)
    assert loaded.path == str(path)
    assert loaded.settings.broker["log.dirs"] == ("/data/a", "/data/b")
    assert loaded.settings.broker["log.cleaner.threads"] == 3
    assert loaded.server == {"listen": "127.0.0.1:9999", "discovery_interval_ms": 200}
    orders = loaded.settings.topic("orders")
    assert (orders.min_cleanable_dirty_ratio, orders.max_compaction_lag_ms, orders.compact) == (0.1, 60000, True)
    assert loaded.settings.topic("with.dots").delete_retention_ms == 0
    assert loaded.settings.topic("other").min_cleanable_dirty_ratio == 0.5


@pytest.mark.parametrize("text, expected", [
    ('"log.cleaner.threads" = 0\n', "setting 'log.cleaner.threads' = 0: must be in [1, 64]"),
    ('[topics.orders]\n"min.cleanable.dirty.ratio" = 2.0\n', "setting 'min.cleanable.dirty.ratio' = 2.0: must be in [0.0, 1.0]"),
    ('[topics.orders]\n"log.cleaner.threads" = 1\n', "unknown topic setting in [topics.orders]"),
    ('"log.cleaner.thraeds" = 1\n', "unknown setting 'log.cleaner.thraeds'"),
    ('"log.cleaner.threads" = \n', "not valid TOML"),
    ('topics = 3\n', "[topics] must be a table"),
    ('[topics]\norders = 3\n', "[topics.orders] must be a table"),
    ('server = 3\n', "[server] must be a table"),
])
def test_an_invalid_config_file_names_the_file_and_what_is_wrong(tmp_path, text, expected):
    path = write(tmp_path, "bad.toml", text)
    with pytest.raises(ConfigFileError) as info:
        load_config(path)
    assert str(info.value).startswith(f"{path}: ")
    assert expected in str(info.value)


def test_a_missing_config_file_is_a_config_error(tmp_path):
    with pytest.raises(ConfigFileError, match="cannot read"):
        load_config(tmp_path / "absent.toml")


def test_overrides_apply_over_the_file_and_the_file_over_server_properties(tmp_path):
    props = write(tmp_path, "server.properties", "log.cleaner.threads=2\nlog.cleaner.backoff.ms=1000\nlog.cleaner.enable=false\n")
    toml = write(tmp_path, "c.toml", '"log.cleaner.threads" = 3\n"log.cleaner.backoff.ms" = 500\n')
    loaded = load_config(toml, server_properties=props, overrides={"log.cleaner.threads": "4"})
    assert loaded.settings.broker["log.cleaner.threads"] == 4
    assert loaded.settings.broker["log.cleaner.backoff.ms"] == 500
    assert loaded.settings.broker["log.cleaner.enable"] is False


# ---- server.properties ------------------------------------------------------------------------------------------------


def test_server_properties_syntax_comments_separators_and_continuations(tmp_path):
    path = write(tmp_path, "server.properties", "\n".join([
        "# a comment",
        "! another comment",
        "",
        "broker.id=1",
        "log.dirs = /data/a,\\",
        "           /data/b",
        "log.cleaner.threads: 2",
        "  log.cleaner.dedupe.buffer.size=256MiB  ",
        "flag.without.value",
        "url=http://x:80/a=b",
    ]) + "\n")
    assert read_server_properties(path) == {
        "broker.id": "1",
        "log.dirs": "/data/a,/data/b",
        "log.cleaner.threads": "2",
        "log.cleaner.dedupe.buffer.size": "256MiB",
        "flag.without.value": "",
        "url": "http://x:80/a=b",
    }


def test_server_properties_keys_that_are_not_cleaner_settings_are_ignored(tmp_path):
    path = write(tmp_path, "server.properties", "\n".join([
        "broker.id=1",
        "listeners=PLAINTEXT://:9092",
        "min.cleanable.dirty.ratio=0.9",  # a topic-level name: not a broker setting, so not read from here
        "log.cleaner.min.cleanable.ratio=0.7",
        "log.cleaner.threads=2",
        "log.dirs=/data/a,/data/b",
    ]) + "\n")
    loaded = load_config(server_properties=path)
    assert loaded.settings.broker["log.cleaner.threads"] == 2
    assert loaded.settings.broker["log.dirs"] == ("/data/a", "/data/b")
    assert loaded.settings.topic("t").min_cleanable_dirty_ratio == 0.7


def test_an_invalid_value_in_server_properties_is_rejected_naming_key_value_and_range(tmp_path):
    path = write(tmp_path, "server.properties", "log.cleaner.threads=0\n")
    with pytest.raises(ConfigFileError, match=r"'log.cleaner.threads' = '0': must be in \[1, 64\]"):
        load_config(server_properties=path)


def test_an_invalid_value_in_server_properties_is_reported_against_server_properties(tmp_path):
    props = write(tmp_path, "server.properties", "log.cleaner.threads=0\n")
    toml = write(tmp_path, "c.toml", '"log.cleaner.backoff.ms" = 100\n')
    with pytest.raises(ConfigFileError) as info:
        load_config(toml, server_properties=props)
    assert str(props) in str(info.value) and str(toml) not in str(info.value)


def test_a_missing_server_properties_file_is_a_config_error(tmp_path):
    with pytest.raises(ConfigFileError, match="cannot read"):
        load_config(server_properties=tmp_path / "absent.properties")


def test_retention_time_follows_kafkas_precedence_ms_then_minutes_then_hours():
    def retention_ms(**values):
        return Settings.from_mappings(values).topic("t").retention_ms

    assert retention_ms() == 168 * 3_600_000  # log.retention.hours' default
    assert retention_ms(**{"log.retention.hours": 2}) == 7_200_000
    assert retention_ms(**{"log.retention.hours": 2, "log.retention.minutes": 3}) == 180_000
    assert retention_ms(**{"log.retention.hours": 2, "log.retention.minutes": 3, "log.retention.ms": 5}) == 5
    assert retention_ms(**{"log.retention.hours": -1}) == -1  # no time limit
    assert retention_ms(**{"log.retention.minutes": -1, "log.retention.hours": 1}) == -1
    assert retention_ms(**{"log.retention.ms": 9, "retention.ms": 11}) == 11  # a topic value beats the broker's
    base = Settings.from_mappings({"log.retention.hours": 2})
    assert base.with_overrides({"log.retention.minutes": 1}).topic("t").retention_ms == 60_000
    with pytest.raises(SettingError, match="log.retention.hours"):
        Settings.from_mappings({"log.retention.hours": -2})


def test_log_cleanup_interval_mins_is_an_alias_of_the_retention_check_interval():
    broker = Settings.from_mappings({"log.cleanup.interval.mins": 3}).broker
    assert broker["log.retention.check.interval.ms"] == 180_000
    both = Settings.from_mappings({"log.cleanup.interval.mins": 3, "log.retention.check.interval.ms": 1000}).broker
    assert both["log.retention.check.interval.ms"] == 1000  # the current name wins
    assert Settings.from_mappings({}).broker["log.retention.check.interval.ms"] == 300_000
    with pytest.raises(SettingError, match="log.cleanup.interval.mins"):
        Settings.from_mappings({"log.cleanup.interval.mins": 0})


# ---- the broker settings, typed (Settings.cleaner) ---------------------------------------------------------

_ANNOTATIONS = {"int": "int", "float": "float", "bool": "bool", "list": "tuple[str, ...]", "str": "str"}


def test_every_broker_setting_of_the_table_has_one_typed_attribute_and_no_attribute_is_extra():
    attributes = {f.name for f in dataclasses.fields(CleanerSettings)}
    by_attribute = {broker_attribute(name): name for name in BROKER_SETTINGS}
    assert len(by_attribute) == len(BROKER_SETTINGS), "two settings share an attribute name"
    assert set(by_attribute) == attributes, (f"settings without an attribute: "
                                             f"{sorted(n for a, n in by_attribute.items() if a not in attributes)}; "
                                             f"attributes without a setting: {sorted(attributes - set(by_attribute))}")


@pytest.mark.parametrize("name", sorted(BROKER_SETTINGS))
def test_each_typed_attribute_has_the_type_of_its_setting(name):
    setting = BROKER_SETTINGS[name]
    annotation = {f.name: f.type for f in dataclasses.fields(CleanerSettings)}[broker_attribute(name)]
    expected = _ANNOTATIONS[setting.kind] + (" | None" if setting.default is None else "")
    assert annotation == expected


def test_the_typed_attributes_hold_the_resolved_values_derived_ones_included():
    s = settings({"log.cleaner.threads": "4", "log.dirs": "/a,/b", "metadata.log.dir": "/meta",
                  "log.cleaner.verify": "true", "log.cleaner.selection.policy": "survivorship",
                  "log.retention.hours": 2, "log.cleanup.interval.mins": 3})
    for name in BROKER_SETTINGS:
        assert getattr(s.cleaner, broker_attribute(name)) == s.broker[name], name
    assert (s.cleaner.threads, s.cleaner.log_dirs, s.cleaner.metadata_log_dir) == (4, ("/a", "/b"), "/meta")
    assert s.cleaner.verify is True and s.cleaner.selection_policy == "survivorship"
    assert (s.cleaner.log_retention_ms, s.cleaner.log_retention_check_interval_ms) == (7_200_000, 180_000)
    assert settings().cleaner.metadata_log_dir is None
    assert s.with_overrides({"log.cleaner.threads": 2}).cleaner.threads == 2  # every copy is typed afresh
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.cleaner.threads = 8  # type: ignore[misc]


def test_the_typed_settings_take_exactly_the_names_of_the_table():
    broker = dict(settings().broker)
    with pytest.raises(ValueError, match="missing"):
        CleanerSettings.from_broker({k: v for k, v in broker.items() if k != "log.cleaner.threads"})
    with pytest.raises(ValueError, match="not settings"):
        CleanerSettings.from_broker({**broker, "log.cleaner.new.knob": 1})


# Where a broker setting may be read by its name: the table and what parses files into it.
_NAME_READERS = {"settings.py", "setting_use.py", "config_file.py"}


def _reads_by_name(path: Path) -> list[str]:
    """`<...>broker["name"]` and `<...>broker.get("name")` in `path`."""
    def is_broker(node: ast.expr) -> bool:
        return (isinstance(node, ast.Name) and node.id == "broker") or (
            isinstance(node, ast.Attribute) and node.attr == "broker")

    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Subscript) and is_broker(node.value) and isinstance(node.slice, ast.Constant):
            found.append(f"{path.name}:{node.lineno}")
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get"
              and is_broker(node.func.value)):
            found.append(f"{path.name}:{node.lineno}")
    return found


def test_no_code_reads_a_broker_setting_by_its_name():
    package = Path(cleaner.__file__).parent
    reads = [r for path in sorted(package.glob("*.py")) if path.name not in _NAME_READERS for r in _reads_by_name(path)]
    assert reads == [], f"read the typed attribute (settings.cleaner.<name>) instead: {reads}"


def test_the_check_for_reads_by_name_sees_one(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text('def f(settings, broker):\n    return settings.broker["log.cleaner.threads"], broker.get("log.dirs")\n')
    assert _reads_by_name(probe) == ["probe.py:2", "probe.py:2"]
