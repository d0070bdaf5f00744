"""Reading settings from files: the logcleaner TOML config and Kafka's `server.properties`.

Owns the file formats only; names, types and ranges are `cleaner.settings`'. The TOML file holds quoted
Kafka setting names at the top level (`"log.cleaner.threads" = 2`), per-topic overrides in
`[topics.<name>]` tables with Kafka topic setting names, and the daemon's own `[server]` table.
Errors name the file and what is wrong in it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from segments.files.pathcheck import describe_os_error

from .errors import CleanerError
from .settings import SettingError, Settings, SettingSource

__all__ = ["ConfigFileError", "LoadedConfig", "load_config", "read_server_properties"]


class ConfigFileError(CleanerError, ValueError):
    """A config file that cannot be read or parsed, or that holds an invalid setting."""


@dataclass(frozen=True)
class LoadedConfig:
    settings: Settings
    server: Mapping[str, Any] = field(default_factory=dict)
    path: str | None = None


def read_server_properties(path: str | os.PathLike) -> dict[str, str]:
    """`key=value` lines of a Java properties file (comments `#`/`!`, `:` separators, line continuations).

    Raises `ConfigFileError` for a file that cannot be read or is not text, and for one without a single
    `key=value` (or `key: value`) line: whatever it is (`/etc/hostname`, a TOML file given by mistake), it is
    not a broker's `server.properties`, whose settings all have that form."""
    values: dict[str, str] = {}
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigFileError(f"cannot read {describe_os_error(exc)}") from None
    except UnicodeDecodeError as exc:
        raise ConfigFileError(f"{path}: not a server.properties file: byte {exc.start} is not UTF-8 text") from None
    separated = 0  # lines of the form key=value or key:value
    pending = ""
    for raw in text.splitlines():
        line = pending + raw.strip()
        pending = ""
        if not line or line[0] in "#!":
            continue
        if line.endswith("\\"):
            pending = line[:-1]
            continue
        for i, ch in enumerate(line):
            if ch in "=:":
                values[line[:i].strip()] = line[i + 1 :].strip()
                separated += 1
                break
        else:
            values[line] = ""
    if not separated:
        raise ConfigFileError(f"{path}: not a server.properties file: no key=value line in it")
    return values


def load_config(
    path: str | os.PathLike | None = None,
    *,
    server_properties: str | os.PathLike | None = None,
    overrides: Mapping[str, object] | None = None,
) -> LoadedConfig:
    """Settings from `server.properties` (broker keys only), then the TOML file, then `overrides` (`--set`).

    Keys of `server.properties` that are not cleaner or log settings are ignored (a broker file holds many);
    in the TOML file and `overrides` every key must be known. Raises `ConfigFileError`.
    """
    from .settings import BROKER_SETTINGS, TOPIC_SETTINGS

    flat: dict[str, object] = {}
    sources: dict[str, SettingSource] = {}
    topics: dict[str, dict[str, object]] = {}
    topic_sources: dict[str, SettingSource] = {}
    server: dict[str, Any] = {}

    def checked(source: str, key: str, value: object, table: dict) -> object:
        """`value` validated on its own, so a bad one is reported against the file it came from."""
        try:
            table[key].parse(value) if table is BROKER_SETTINGS else table[key][0].parse(value)
        except SettingError as exc:
            raise ConfigFileError(f"{source}: {exc}") from None
        return value

    if server_properties is not None:
        properties_source = SettingSource("server.properties", f"server.properties {os.fspath(server_properties)}")
        for key, value in read_server_properties(server_properties).items():
            if key in BROKER_SETTINGS:
                flat[key] = checked(os.fspath(server_properties), key, value, BROKER_SETTINGS)
                sources[key] = properties_source
    if path is not None:
        import tomllib  # only a process given a config file reads TOML (start-up, issue 19)

        try:
            with open(path, "rb") as f:
                data = tomllib.load(f)
        except OSError as exc:
            raise ConfigFileError(f"cannot read {describe_os_error(exc)}") from None
        except UnicodeDecodeError as exc:
            raise ConfigFileError(f"{path}: not valid TOML: byte {exc.start} is not UTF-8 text") from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigFileError(f"{path}: not valid TOML: {exc}") from None
        for key, value in data.items():
            if key == "topics":
                if not isinstance(value, dict):
                    raise ConfigFileError(f"{path}: [topics] must be a table of [topics.<name>] tables")
                for topic, table in value.items():
                    if not isinstance(table, dict):
                        raise ConfigFileError(f"{path}: [topics.{topic}] must be a table")
                    for k, v in table.items():
                        if k in TOPIC_SETTINGS:  # unknown names are reported by Settings below
                            checked(f"{path}: [topics.{topic}]", k, v, TOPIC_SETTINGS)
                    topics[topic] = dict(table)
                    topic_sources[topic] = SettingSource("file", f"[topics.{topic}] in {os.fspath(path)}")
            elif key == "server":
                if not isinstance(value, dict):
                    raise ConfigFileError(f"{path}: [server] must be a table")
                server = dict(value)
            elif key in BROKER_SETTINGS:
                flat[key] = checked(os.fspath(path), key, value, BROKER_SETTINGS)
                sources[key] = SettingSource("file", os.fspath(path))
            elif key in TOPIC_SETTINGS:
                flat[key] = checked(os.fspath(path), key, value, TOPIC_SETTINGS)
                sources[key] = SettingSource("file", os.fspath(path))
            else:
                raise ConfigFileError(f"{path}: unknown setting {key!r} (use Kafka's setting names, quoted)")
    for key, given in (overrides or {}).items():
        if key in BROKER_SETTINGS:
            checked("--set", key, given, BROKER_SETTINGS)
        elif key in TOPIC_SETTINGS:
            checked("--set", key, given, TOPIC_SETTINGS)
        else:
            raise ConfigFileError(f"--set: unknown setting {key!r} (expected a Kafka broker or topic setting name)")
        flat[key] = given
        sources[key] = SettingSource("set", "--set")
    try:
        settings = Settings.from_mappings(
            flat, topics, sources=sources, topic_sources=topic_sources,
            broker_file=None if server_properties is None else os.fspath(server_properties),
        )
    except SettingError as exc:  # a relation between settings (e.g. min lag above max lag)
        where = f"{path}: " if path is not None else ""
        raise ConfigFileError(f"{where}{exc}") from None
    return LoadedConfig(settings, server, None if path is None else os.fspath(path))
