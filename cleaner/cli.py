"""The `logcleaner` command line: thin click glue over the library.

Owns argument parsing, printing and exit codes only; every command calls into `segments/`,
`offsetmap/` or `cleaner/`. Library errors become one-line messages here and nowhere else.
Exit codes: 0 success, 1 a problem with the data (verify found problems, a partition failed), 2 usage.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import click

from segments.codec.errors import SegmentError

from .cli_support import (
    MB,
    CommandGroup,
    OneLineUsageError,
    end_process,
    megabytes,
    notes_on_rebuilt_indexes,
    occupy_closed_standard_fds,
    one_line,
    output_failed,
)
from .listen import DEFAULT_LISTEN, client_url

__all__ = ["entry", "main"]

DEFAULT_SPARK_MASTER = "local[*]"  # of clean --spark


@click.group(cls=CommandGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="logcleaner")
def main() -> None:
    """Compaction engine for Kafka-format log segment files."""
    from .allocator import limit_blas_threads, tune_allocator

    limit_blas_threads()
    tune_allocator()


class SizeParam(click.ParamType):
    """A size in bytes, read by the one size parser (`cleaner.settings.parse_size`) that `--set` and the config
    file use: `268435456`, `256MiB`, `64k`, `1g`."""

    name = "size"

    def __init__(self, *, min_bytes: int = 0, max_bytes: int = 2**63 - 1) -> None:
        self.min_bytes = min_bytes
        self.max_bytes = max_bytes

    def convert(self, value, param, ctx) -> int:
        from .settings import parse_size

        if isinstance(value, int):
            size = value
        else:
            try:
                size = parse_size(str(value))
            except ValueError as exc:
                self.fail(str(exc), param, ctx)
        if not self.min_bytes <= size <= self.max_bytes:
            self.fail(f"{value} is not in [{self.min_bytes}, {self.max_bytes}] bytes", param, ctx)
        return size


@main.command()
@click.argument("files", nargs=-1, required=True, type=click.Path(exists=True, readable=False, dir_okay=False, path_type=Path))
@click.option("--deep-iteration", is_flag=True, help="Print every record, not just batch headers.")
@click.option("--print-data-log", is_flag=True, help="Print keys and values (implies --deep-iteration).")
@click.option("--index-sanity-check", is_flag=True, help="For index files: only check them and report.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per line.")
@notes_on_rebuilt_indexes
def dump(files: tuple[Path, ...], deep_iteration: bool, print_data_log: bool, index_sanity_check: bool, as_json: bool) -> None:
    """Print the batches and records of .log files, or the entries of .index/.timeindex/.txnindex files."""
    from segments.tools.dump import dump_file, format_entry

    _warn_if_broker_owns(files)

    failed = False
    for path in files:
        try:
            for entry in dump_file(
                path, deep_iteration=deep_iteration, print_data=print_data_log, index_sanity_check=index_sanity_check
            ):
                click.echo(json.dumps(entry) if as_json else format_entry(entry))
                if entry["type"] == "sanity" and not entry["passed"]:
                    failed = True
        except (SegmentError, ValueError) as exc:
            click.echo(f"Error: {exc}", err=True)
            failed = True
        except BrokenPipeError:
            raise  # our reader went away, not a file problem: the command ends quietly (cli_support)
        except OSError as exc:  # e.g. permission denied
            if output_failed(exc):  # stdout's, not the file's
                sys.exit(1)
            from segments.files.pathcheck import describe_os_error

            click.echo(f"Error: {describe_os_error(exc)}", err=True)
            failed = True
    sys.exit(1 if failed else 0)


@main.command()
@click.argument("paths", nargs=-1, required=True, type=click.Path(exists=True, readable=False, path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print a JSON summary instead of text.")
@notes_on_rebuilt_indexes
def verify(paths: tuple[Path, ...], as_json: bool) -> None:
    """Check CRCs, framing, offsets, indexes and leftover files of log dirs, partition dirs or segment files.

    Exit 1 with one line per problem (file and byte position) if anything is wrong.
    """
    from segments.tools.verify import verify_paths

    _warn_if_broker_owns(paths)
    summary = verify_paths(list(paths))
    if not summary.partitions and not summary.segments and not summary.problems and all(p.is_dir() for p in paths):
        click.echo(_no_partition_line(paths), err=True)  # as every command says it; not an error (exit 0)
    if as_json:
        click.echo(
            json.dumps(
                {
                    "partitions": summary.partitions,
                    "segments": summary.segments,
                    "batches": summary.batches,
                    "records": summary.records,
                    "bytes": summary.bytes,
                    "problems": [str(p) for p in summary.problems],
                }
            )
        )
    else:
        for problem in summary.problems:
            click.echo(str(problem))
        status = "OK" if not summary.problems else f"{len(summary.problems)} problem(s)"
        click.echo(
            f"{status}: {summary.partitions} partition(s), {summary.segments} segment(s), "
            f"{summary.batches} batches, {summary.records} records, {summary.bytes} bytes",
            err=bool(summary.problems),
        )
    sys.exit(1 if summary.problems else 0)


@main.command()
@click.option("-c", "--config", "config_path", required=True,
              type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="The daemon's TOML config file: Kafka setting names, [topics.<name>] overrides, "
                   "[server] settings. Its \"log.dirs\" names the log dirs; without it, those of "
                   "--server-properties, else Kafka's default /tmp/kafka-logs, as for a broker.")
@click.option("--server-properties", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="A Kafka server.properties to take broker-level settings from (the config file wins).")
@click.option("--log-level", default="info", show_default=True,
              type=click.Choice(["debug", "info", "warning", "error"], case_sensitive=False),
              help="Lowest level of the daemon's log lines (any case).")
def run(config_path: Path, server_properties: Path | None, log_level: str) -> None:
    """Run the cleaner daemon: clean the dirtiest logs continuously; serve /metrics, /healthz, /status.

    The config file is required, so that the daemon never cleans a log dir nobody named; see -c for where its
    log dirs come from.
    """
    import logging

    from .config_file import ConfigFileError
    from .daemon import Daemon, DaemonStartError

    logging.basicConfig(
        level=getattr(logging, log_level.upper()),
        format="%(asctime)s %(levelname)s %(threadName)s %(name)s: %(message)s",
    )
    try:
        daemon = Daemon(config_path, server_properties=server_properties)
    except ConfigFileError as exc:
        raise click.UsageError(str(exc)) from None
    except DaemonStartError as exc:
        raise click.ClickException(str(exc)) from None
    except OSError as exc:
        raise click.ClickException(f"cannot start: {exc}") from None
    daemon.install_signal_handlers()
    daemon.start()
    sys.exit(daemon.run())


@main.command()
@click.option("--url", show_default="the [server] listen of -c, else http://127.0.0.1:9464",
              help="The daemon's URL, http://HOST:PORT.")
@click.option("-c", "--config", "config_path", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="The daemon's TOML config: its [server] listen gives the URL.")
@click.option("--json", "as_json", is_flag=True, help="Print the daemon's JSON status as it is.")
def status(url: str | None, config_path: Path | None, as_json: bool) -> None:
    """Print every partition's state, dirty ratio and last round, from a running daemon."""
    url, _ = _daemon_address(url, config_path)
    body = _http(url.rstrip("/") + "/status", "GET")
    if not isinstance(body.get("daemon"), dict) or not isinstance(body.get("partitions"), list):
        raise click.ClickException(f"{url}: not a logcleaner daemon's answer (its /status has no daemon and "
                                   "partitions)")
    if as_json:
        click.echo(json.dumps(body, indent=1))
        return
    d = body["daemon"]
    click.echo(f"threads {d['threads_alive']}/{d['threads']}, log dirs {', '.join(d['log_dirs'])}, "
               f"I/O {megabytes(d['io_bytes_total'], 1)}")
    several = len(d["log_dirs"]) > 1  # then each row names its log dir
    width = max(len("LOG DIR"), *(len(p["log_dir"]) for p in body["partitions"])) if several else 0
    log_dir_header = f"{'LOG DIR':<{width}}  " if several else ""
    click.echo(f"{'PARTITION':<32} {log_dir_header}{'STATE':<12} {'POLICY':<15} {'DIRTY':>7} "
               f"{'CLEANABLE MB':>13} {'ROUNDS':>6}  LAST / PROBLEM")
    for p in body["partitions"]:
        last = p["last_round"]
        note = p["uncleanable_reason"] and f"UNCLEANABLE: {p['uncleanable_reason']}" or (
            last and f"{last['records_read']} -> {last['records_written']} records in {last['elapsed_s']:.2f} s" or "")
        if p.get("retention_segments_deleted"):
            note = "; ".join(filter(None, [note, f"retention deleted {p['retention_segments_deleted']} segment(s), "
                                                 f"log start {p['log_start_offset']}"]))
        if not p.get("policy_known", True):
            note = "; ".join(filter(None, [note, f"left as it is, policy unknown: {p['policy_source']}"]))
        policy = p.get("cleanup_policy") or "unknown"
        where = f"{p['log_dir']:<{width}}  " if several else ""
        click.echo(f"{p['partition']:<32} {where}{p['state']:<12} {policy:<15} {p['dirty_ratio']:>7.3f} "
                   f"{p['cleanable_bytes'] / MB:>13.2f} {p['rounds']:>6}  {note}")
    for log_dir, reason in body.get("offline_log_dirs", {}).items():
        click.echo(f"offline: {log_dir}: {reason}")
    for entry in body.get("ignored", []):
        click.echo(f"ignored: {entry['path']}: {entry['reason']}")


@main.command()
@click.argument("operation", type=click.Choice(["pause", "resume", "trigger"]))
@click.argument("partition")
@click.option("--url", show_default="the [server] listen of -c, else http://127.0.0.1:9464",
              help="The daemon's URL, http://HOST:PORT.")
@click.option("-c", "--config", "config_path", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="The daemon's TOML config: its [server] listen gives the URL, its admin_token_file the token.")
@click.option("--token-file", type=click.Path(dir_okay=False, path_type=Path),
              show_default="$LOGCLEANER_ADMIN_TOKEN, else the admin_token_file of -c",
              help="File holding the daemon's admin token.")
def admin(operation: str, partition: str, url: str | None, config_path: Path | None, token_file: Path | None) -> None:
    """Pause, resume or trigger cleaning of PARTITION (<topic>-<partition>) in a running daemon.

    These requests change the daemon's state, so they carry its admin token (Authorization: Bearer).
    """
    from segments.files.pathcheck import partition_dir_name_problem

    from .admin_token import AdminTokenError, authorization_header, read_token_file, token_from_environment

    if (problem := partition_dir_name_problem(partition)) is not None:  # before anything is sent
        raise click.BadParameter(f"{partition!r} is not a partition (<topic>-<partition>): {problem}",
                                 param_hint="'PARTITION'")
    url, configured_token_file = _daemon_address(url, config_path)
    token: bytes | None
    try:
        if token_file is not None:
            token = read_token_file(token_file)
        else:
            token = token_from_environment()
            if token is None and configured_token_file is not None:
                token = read_token_file(configured_token_file)
    except AdminTokenError as exc:
        raise click.ClickException(str(exc)) from None
    headers = authorization_header(token) if token is not None else {}
    body = _http(f"{url.rstrip('/')}/partitions/{partition}/{operation}", "POST", headers)
    if not {"partition", "operation", "state", "pauses"} <= body.keys():
        raise click.ClickException(f"{url}: not a logcleaner daemon's answer to {operation}")
    click.echo(f"{body['partition']}: {body['operation']} -> {body['state']} (pauses {body['pauses']})")


def _daemon_address(url: str | None, config_path: Path | None) -> tuple[str, Path | None]:
    """The daemon's URL (`--url`, else the config's [server] listen, else the default) and the config's
    admin_token_file (None without -c or without the setting)."""
    if url is not None:
        _check_url(url)
    if config_path is None:
        return url or client_url(DEFAULT_LISTEN), None
    from .admin_token import AdminTokenError, resolve_token_file
    from .config_file import ConfigFileError, load_config

    try:
        server = load_config(config_path).server
        address = url or client_url(str(server.get("listen", DEFAULT_LISTEN)))
        token_file = server.get("admin_token_file")
        return address, None if token_file is None else resolve_token_file(token_file, config_path)
    except (ConfigFileError, AdminTokenError, ValueError) as exc:
        message = str(exc)  # a ConfigFileError names the file already
        raise click.UsageError(message if message.startswith(str(config_path)) else f"{config_path}: {message}") from None


def _check_url(url: str) -> None:
    """Refuse (usage error) a --url that is not http(s)://HOST[:PORT][/PATH] before anything is sent."""
    from urllib.parse import urlsplit

    try:
        parts = urlsplit(url)
        port_ok = parts.port is None or parts.port > 0
    except ValueError:  # a port that is not a number, a bad IPv6 literal
        port_ok, parts = False, None
    if parts is None or parts.scheme not in ("http", "https") or not parts.hostname or not port_ok or any(
            ch.isspace() or not ch.isprintable() for ch in url):
        raise click.BadParameter(f"{url!r} is not a daemon URL: expected http://HOST:PORT, e.g. "
                                 "http://127.0.0.1:9464", param_hint="'--url'")


def _http(url: str, method: str, headers: dict[str, str] | None = None) -> dict:
    """The daemon's JSON answer to `method url`; a one-line `ClickException` (exit 1) when there is none."""
    import http.client
    import urllib.error
    import urllib.request

    try:
        request = urllib.request.Request(url, method=method, data=b"" if method == "POST" else None,
                                         headers=headers or {})
        with urllib.request.urlopen(request, timeout=30) as response:
            body = json.loads(response.read())
        if not isinstance(body, dict):
            raise ValueError("not a JSON object")
        return body
    except (ValueError, http.client.HTTPException) as exc:  # not JSON, not HTTP, an invalid URL
        raise click.ClickException(f"{url}: not a logcleaner daemon's answer ({one_line(str(exc))})") from None
    except urllib.error.HTTPError as exc:
        try:
            detail = json.loads(exc.read().decode(errors="replace"))["error"]
        except (ValueError, TypeError, KeyError):  # not our JSON error object: an HTML page, another server
            detail = "not a logcleaner daemon's answer"
        raise click.ClickException(f"{url}: {exc.code}: {one_line(str(detail))}") from None
    except OSError as exc:  # URLError (connection refused, unknown host), a timeout
        reason = exc.reason if isinstance(exc, urllib.error.URLError) else exc
        text = reason.strerror if isinstance(reason, OSError) and reason.strerror else str(reason)
        raise click.ClickException(f"{url}: cannot reach the daemon: {text}") from None


def _warn_if_broker_owns(paths) -> None:
    """Read-only commands go on while a Kafka broker owns the log dir, and say once that it may change files.

    A path may be a log dir, a partition directory or a file in one: the `.lock` is looked for in the path
    and its two parents."""
    from segments.partition.locks import log_dir_owner

    seen = set()
    for raw in paths:
        path = Path(raw).absolute()
        for candidate in (path, path.parent, path.parent.parent):
            if candidate in seen:
                continue
            seen.add(candidate)
            if (owner := log_dir_owner(candidate)) is not None:
                click.echo(f"warning: {owner.holder} owns {owner.log_dir}: it may be changing the files while "
                           "they are read", err=True)
                return


def _read_only_partitions(paths) -> tuple[list[Path], bool]:
    """The partitions a read-only command (audit, duplication) goes through, and whether a refused path already
    fails it: each refused path is one line on stderr (an error when it fails the command, else a warning)."""
    from segments.files.pathcheck import find_partition_dirs

    partitions, refused = find_partition_dirs(list(paths))
    _exit_if_no_partition(paths, partitions, refused)
    for item in refused:
        click.echo(f"{'Error' if item.failed else 'warning'}: ignored {item}", err=True)
    return partitions, any(item.failed for item in refused)


def _exit_if_no_partition(paths, partitions: list[Path], refused: list) -> None:
    """The rule of every command that takes log dirs: finding no partition in valid directories is not a usage
    error. Says so in one line on stderr, naming the paths, why a path named like a partition is not one, and
    what was passed over (`refused`, none of them failed), and exits 0. Does nothing when a partition was found
    or a refused one fails the command; the caller then reports `refused` itself."""
    if partitions or any(item.failed for item in refused):
        return
    click.echo(_no_partition_line(paths, refused), err=True)
    sys.exit(0)


def _no_partition_line(paths, refused: Sequence = ()) -> str:
    """The one line every command says when valid directories hold no partition."""
    from segments.codec.errors import display_path
    from segments.files.pathcheck import partition_dir_name_problem

    hints = [f"; {display_path(p)} is not a partition directory itself: {problem}"
             for p in paths if "-" in Path(p).name and (problem := partition_dir_name_problem(Path(p).name))]
    ignored = f"; ignored: {'; '.join(str(item) for item in refused)}" if refused else ""
    return ("no partition directories (<topic>-<partition>) found in " + ", ".join(display_path(p) for p in paths)
            + "".join(hints) + ignored)


KEY_FILE_BYTES_MAX = 16 * 1024 * 1024  # a key read by audit --key-file (Kafka's own limit is the message size)


def _read_key_file(path: Path) -> bytes:
    """The whole content of `path`, exactly, as one key; a usage error naming the file when it cannot be one."""
    import stat

    from segments.codec.errors import display_path
    from segments.files.pathcheck import describe_file_kind, describe_os_error

    try:
        st = path.stat()
        if not stat.S_ISREG(st.st_mode):  # a FIFO would block, a device never end
            raise click.BadParameter(f"{display_path(path)}: is {describe_file_kind(st.st_mode)}, not a regular file",
                                     param_hint="'--key-file'")
        if st.st_size > KEY_FILE_BYTES_MAX:
            raise click.BadParameter(f"{display_path(path)}: {st.st_size} bytes, more than the {KEY_FILE_BYTES_MAX} "
                                     "a key may have here", param_hint="'--key-file'")
        return path.read_bytes()
    except OSError as exc:
        raise click.BadParameter(describe_os_error(exc), param_hint="'--key-file'") from None


def _parse_set(values: tuple[str, ...], param_hint: str = "--set") -> dict[str, str]:
    out = {}
    for item in values:
        key, eq, value = item.partition("=")
        if not eq or not key.strip():
            raise click.BadParameter(f"expected KEY=VALUE, got {item!r}", param_hint=param_hint)
        out[key.strip()] = value.strip()
    return out


@main.command()
@click.argument("paths", nargs=-1, required=True, type=click.Path(exists=True, readable=False, file_okay=False, path_type=Path))
@click.option("--key", "keys", multiple=True, metavar="KEY", help="A key (UTF-8 text) whose history to print (repeatable).")
@click.option("--key-hex", "hex_keys", multiple=True, metavar="HEX", help="A key given in hex, for binary keys (repeatable).")
@click.option("--key-file", "key_files", multiple=True, type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="A file whose whole content, byte for byte, is one key (a trailing newline is part of it: write "
                   "it with printf '%s'), for keys longer than an argument may be (repeatable).")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per partition.")
@notes_on_rebuilt_indexes
def audit(paths: tuple[Path, ...], keys: tuple[str, ...], hex_keys: tuple[str, ...], key_files: tuple[Path, ...],
          as_json: bool) -> None:
    """The history of given keys in partitions, or without a key a summary of each partition's keys.

    A key's history is every record the log still holds for it: offset, timestamp, value size or tombstone,
    segment file, and how its transaction ended when it is transactional. The summary counts records,
    distinct keys, tombstones, keys whose latest record is a tombstone, and records per key (a histogram).
    A partition holding leftovers of an interrupted clean or swap (.cleaned, .swap, .deleted) is shown as
    Kafka's recovery will leave it, and the leftovers are listed (nothing is changed). Reads only; exit 1 if a
    partition cannot be read (the message names the file and byte).
    """
    from segments.codec.errors import SegmentError
    from segments.files.pathcheck import describe_os_error

    from .audit import audit_partition, describe

    _warn_if_broker_owns(paths)
    wanted = [k.encode("utf-8") for k in keys]
    for text in hex_keys:
        try:
            wanted.append(bytes.fromhex(text.removeprefix("0x")))
        except ValueError:
            raise click.BadParameter(f"not hex: {text!r}", param_hint="--key-hex") from None
    for key_file in key_files:
        wanted.append(_read_key_file(key_file))
    partitions, failed = _read_only_partitions(paths)
    for directory in partitions:
        try:
            result = audit_partition(directory, wanted)
        except (SegmentError, OSError) as exc:
            click.echo(f"{directory.name}: FAILED: {describe_os_error(exc) if isinstance(exc, OSError) else exc}",
                       err=True)
            failed = True
            continue
        click.echo(json.dumps(result.as_dict()) if as_json else describe(result, summary=not wanted))
    sys.exit(1 if failed else 0)


@main.command()
@click.argument("paths", nargs=-1, required=True, type=click.Path(exists=True, readable=False, file_okay=False, path_type=Path))
@click.option("-c", "--config", "config_path", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="TOML config file (Kafka setting names; [topics.<name>] overrides).")
@click.option("--server-properties", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="A Kafka server.properties to take broker-level settings from.")
@click.option("--set", "set_values", multiple=True, metavar="KEY=VALUE",
              help="A Kafka-named setting clean uses, e.g. --set delete.retention.ms=0 (repeatable); "
                   "a daemon-only or unused one is refused.")
@click.option("--now-ms", type=click.IntRange(min=0), show_default="now", help="The clock, in epoch milliseconds.")
@click.option("--from-offset", type=click.IntRange(min=0), help="Force the first dirty offset (single partition only).")
@click.option("--to-offset", type=click.IntRange(min=1),
              help="Force the end of the dirty range, rounded down to a segment base; above --from-offset "
                   "(single partition only).")
@click.option("--dry-run", is_flag=True, help="Report what one round would remove; change nothing.")
@click.option("--once", is_flag=True, help="Run a single round even if the offset map fills before the end.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per partition.")
@click.option("--spark", "use_spark", is_flag=True,
              help="Clean as Spark tasks on --master, a partition (or a few small ones) a task, and print a total; "
                   "the log dirs must be on a filesystem every executor sees at the same path (docs/spark.md).")
@click.option("--master", show_default=DEFAULT_SPARK_MASTER, help="Spark master URL (with --spark).")
@click.option("--spark-conf", multiple=True, metavar="KEY=VALUE",
              help="A Spark setting of the session (with --spark), e.g. --spark-conf spark.executor.memory=4g "
                   "(repeatable).")
@click.option("--spark-log", type=click.Path(dir_okay=False, path_type=Path),
              help="Append Spark's own output (its log, warnings, executor output) to this file (with --spark); by "
                   "default only its progress bar is shown, on a terminal.")
def clean(paths, config_path, server_properties, set_values, now_ms, from_offset, to_offset, dry_run, once, as_json,
          use_spark, master, spark_conf, spark_log) -> None:
    """Clean partition directories, or every partition of log directories, by their cleanup.policy.

    Each topic's policy comes from --set / the config file, else the cluster's KRaft metadata, else Kafka's
    internal topics, else the broker level (see docs/configuration.md, "Cleanup policies"); a partition directory
    named on the command line is compacted when nothing else decides. When a topic's policy is unknown,
    nothing is changed and the command exits 2, naming the line that decides it. compact cleans until the
    dirty range is done; delete removes inactive segments past retention.ms / retention.bytes and advances
    the log start offset; compact,delete does both. Refused, changing nothing, while a running Kafka broker
    owns a log dir. Exit 1 if any partition failed (the others are still cleaned). With --spark the same clean
    runs as Spark tasks (docs/spark.md, "Cleaning with Spark").
    """
    import time

    from segments.files.pathcheck import find_partition_dirs

    from .config_file import ConfigFileError, load_config
    from .oneshot import CleanRefusedError, clean_planned, plan_clean, refused_summary
    from .setting_use import refusal_for_clean, refusal_for_spark_clean
    from .throttle import DeviceThrottles

    if from_offset is not None and to_offset is not None and to_offset <= from_offset:
        raise click.BadParameter(f"{to_offset} is not above --from-offset {from_offset}: the range [from, to) "
                                 "would be empty", param_hint="'--to-offset'")
    try:
        loaded = load_config(config_path, server_properties=server_properties, overrides=_parse_set(set_values))
    except ConfigFileError as exc:
        raise click.UsageError(str(exc)) from None
    if not use_spark and (given := [name for name, value in (("--master", master), ("--spark-conf", spark_conf),
                                                                  ("--spark-log", spark_log)) if value]):
        raise click.UsageError(f"{given[0]} is for clean --spark; give --spark too, or leave it out")
    spark_settings = _parse_set(spark_conf, param_hint="--spark-conf")
    for key in _parse_set(set_values):  # a setting clean would accept and ignore is refused instead
        if (refusal := refusal_for_clean(key) or (refusal_for_spark_clean(key) if use_spark else None)) is not None:
            raise click.UsageError(refusal)
    # One I/O budget per device for every partition cleaned, each read and write charged before it is done.
    throttles = DeviceThrottles(loaded.settings.cleaner.io_max_bytes_per_second)
    partitions, refused = find_partition_dirs(list(paths))
    _exit_if_no_partition(paths, partitions, refused)
    failed = False
    for item in refused:  # a refused partition fails the command; anything else refused is only a warning
        if item.failed:
            summary = refused_summary(item)
            click.echo(json.dumps(summary) if as_json else _describe(summary), err=not as_json)  # a failure
            failed = True
        else:
            click.echo(f"warning: ignored {item}", err=True)
    if (from_offset is not None or to_offset is not None) and len(partitions) != 1:
        raise click.UsageError("--from-offset/--to-offset need exactly one partition directory")
    try:
        plan = plan_clean(partitions, loaded.settings, named=frozenset(paths))
    except CleanRefusedError as exc:  # one error, its first line complete in itself; details follow, indented
        click.echo(f"Error: {exc}", err=True)
        for line in exc.details:
            click.echo(line, err=True)
        sys.exit(exc.exit_code)
    clock = now_ms if now_ms is not None else int(time.time() * 1000)

    bar: _Bar | _NoBar = _NoBar()

    def report(summary: dict) -> None:  # in the order of the partitions' names, each once it and those before are done
        nonlocal failed
        failed |= summary["status"] == "failed"
        bar.clear_line()  # the line goes where the bar was; the bar is drawn again below it at its next update
        if as_json:
            click.echo(json.dumps(summary))
        else:  # a partition that failed is reported on stderr, as audit does
            click.echo(_describe(summary, show_policy=dry_run), err=summary["status"] == "failed")

    if use_spark:
        if plan:  # else only refused paths, reported above: no Spark to start
            _clean_on_spark(plan, loaded.settings.cleaner, master=master or DEFAULT_SPARK_MASTER,
                            spark_conf=spark_settings, spark_log=spark_log, now_ms=clock, forced_from=from_offset,
                            forced_to=to_offset, dry_run=dry_run, once=once, report=report, as_json=as_json)
        sys.exit(1 if failed else 0)
    total = sum(sum(f.lstat().st_size for f in p.glob("*.log")) for p in partitions)  # lstat: links are not followed
    show_bar = sys.stderr.isatty() and not as_json and total > 64 * 1024 * 1024

    # On log.cleaner.threads threads, the largest dirty section first. Ctrl-C, SIGTERM or a terminal's SIGHUP stops
    # taking partitions and aborts the running rounds at their next window; then Ctrl-C ends as before
    # ("Aborted!", exit 1) and SIGTERM or SIGHUP kills the process with that signal (143, 129).
    bar = _Bar(total) if show_bar else _NoBar()
    with bar, _StopSignalsStopCleaning():
        clean_planned(plan, loaded.settings.cleaner, now_ms=clock, report=lambda outcome: report(outcome.summary()),
                      throttle_for=throttles.for_path,
                      forced_from=from_offset, forced_to=to_offset, dry_run=dry_run, once=once,
                      on_bytes=lambda n, direction: bar.update(n))
    sys.exit(1 if failed else 0)


def _clean_on_spark(plan, cleaner, *, master: str, spark_conf: dict[str, str], spark_log: Path | None, now_ms: int,
                    forced_from: int | None, forced_to: int | None, dry_run: bool, once: bool, report,
                    as_json: bool) -> None:
    """`clean --spark`: the planned partitions cleaned by `cleaner.spark_clean` on `master`; each partition's
    summary to `report` in the plan's order once the job is done, then the total. Spark's own output goes to
    `spark_log` (its progress bar to a terminal); every error is one line (exit 2: a Spark setting or the
    executors' memory; 1: Spark did not start or the job failed)."""
    import signal
    import time

    from segments.files.pathcheck import describe_os_error
    from segments.spark import JvmConsole, SparkUnavailableError, get_session, stop_session

    from .oneshot import total_summary
    from .spark_clean import (
        SparkCleanJobError,
        SparkCleanUsageError,
        check_executor_memory_before_start,
        check_spark_conf,
        clean_planned_on_spark,
        quiet_py4j,
        session_conf,
    )

    try:
        check_spark_conf(spark_conf)  # before Spark starts: a refused setting costs no JVM
        check_executor_memory_before_start(spark_conf, master, cleaner)  # ... nor executors short of memory
    except SparkCleanUsageError as exc:
        raise OneLineUsageError(str(exc)) from None
    try:
        log_file = open(spark_log, "ab") if spark_log is not None else None
    except OSError as exc:
        raise OneLineUsageError(f"--spark-log: {describe_os_error(exc)}") from None
    console = JvmConsole(progress=sys.stderr if sys.stderr.isatty() else None, log_file=log_file)
    quiet_py4j()  # a Ctrl-C at start-up or a lost JVM is said in one line, not in py4j's tracebacks
    started = time.perf_counter()
    spark = None
    previous_sigint = signal.getsignal(signal.SIGINT)
    try:
        # Ctrl-C or SIGTERM: the job cancelled, Spark stopped (its JVM killed), the planned partitions recovered,
        # then the command ends as `clean` does ("Aborted!" for Ctrl-C, the signal's own status for SIGTERM).
        with _StopSignalsStopCleaning():
            try:
                try:
                    spark = get_session(master, app_name=f"logcleaner clean ({len(plan)} partitions)",
                                        conf=session_conf(spark_conf), console=console)
                except SparkUnavailableError as exc:
                    raise click.ClickException(one_line(str(exc))) from None
                # pyspark's own SIGINT handler talks to the JVM inside the handler; Python's raises KeyboardInterrupt
                # (an ignored SIGINT, as in a background job, stays ignored)
                signal.signal(signal.SIGINT, signal.SIG_IGN if previous_sigint == signal.SIG_IGN
                              else signal.default_int_handler)
                startup_s = time.perf_counter() - started
                try:
                    result = clean_planned_on_spark(spark, plan, cleaner, now_ms=now_ms, forced_from=forced_from,
                                                    forced_to=forced_to, dry_run=dry_run, once=once,
                                                    recover_on_interrupt=False)
                except SparkCleanUsageError as exc:
                    raise OneLineUsageError(str(exc)) from None
                except SparkCleanJobError as exc:  # a task that failed every attempt, a lost cluster
                    raise click.ClickException(one_line(str(exc))) from None
            except (KeyboardInterrupt, _Terminated):
                _abort_spark_clean(spark, plan, console, dry_run=dry_run)
                spark = None  # stopped there, or left to die with the process
                raise
            finally:
                console.end_progress()
                if spark is not None:
                    stop_session(spark)
    finally:
        signal.signal(signal.SIGINT, previous_sigint)
        console.close()
    for summary in result.summaries:
        report(summary)
    total = total_summary(result.summaries)
    total.update(master=master, tasks=result.tasks, spark_startup_s=round(startup_s, 3),
                 elapsed_s=round(result.elapsed_s, 3))
    if as_json:
        click.echo(json.dumps({"total": total}))
    else:
        click.echo(_spark_total_line(total, dry_run=dry_run))


def _spark_total_line(total: dict, *, dry_run: bool) -> str:
    """The text total of `clean --spark`: the job's time (Spark's start-up apart), the statuses, the records and
    bytes of the rounds, and the segments retention deleted; a dry run says "would"."""
    would = "would be " if dry_run else ""
    line = (f"total: {total['partitions']} partition(s) in {total['tasks']} Spark task(s) on {total['master']}, "
            f"{total['elapsed_s']:.1f} s (after Spark's start-up, {total['spark_startup_s']:.1f} s): {total['ok']} ok, "
            f"{total['failed']} failed, {total['skipped']} skipped; {total['records_read']} records read, "
            f"{total['records_written']} {would}written; {megabytes(total['size_before_bytes'])} -> "
            f"{megabytes(total['size_after_bytes'])}")
    if total.get("segments_deleted"):
        line += (f"; {'would delete' if dry_run else 'deleted'} {total['segments_deleted']} segment(s), "
                 f"{megabytes(total['bytes_deleted'])}")
    return line


def _abort_spark_clean(spark, plan, console, *, dry_run: bool) -> None:
    """`clean --spark` interrupted (Ctrl-C, SIGTERM), at start-up or while the job runs: Spark stopped
    (`_stop_spark_now`), then each planned partition recovered on the driver under its lock
    (`cleaner.spark_clean.recover_planned`), so that no `.cleaned` or `.swap` file is left when the command
    returns."""
    from .spark_clean import after_failure, recover_planned

    _stop_spark_now(spark, console)
    if not dry_run and (left := recover_planned(plan)):
        click.echo(f"Error: interrupted; {after_failure(left)}", err=True)


def _stop_spark_now(spark, console) -> None:
    """A Spark command interrupted (Ctrl-C, SIGTERM), at start-up or while its job runs: the jobs cancelled, the
    session stopped and the JVM killed (also one whose start was cut short), so that no task writes after this
    returns. Further signals are ignored from here on (the caller finishes its clean-up and ends): bounded."""
    import contextlib
    import signal
    import threading

    from segments.spark.session import ignore_jvm_gone_warning, kill_child_jvms, quiet_py4j

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    quiet_py4j()
    ignore_jvm_gone_warning()  # a JVM that got the signal too (a process group's SIGTERM) is gone or going
    console.end_progress()
    if spark is not None:
        def stop() -> None:
            with contextlib.suppress(Exception):
                spark.sparkContext.cancelAllJobs()
            with contextlib.suppress(Exception):
                spark.stop()

        stopping = threading.Thread(target=stop, name="logcleaner-spark-stop", daemon=True)
        stopping.start()
        stopping.join(10.0)  # a JVM that does not stop in time is killed below all the same
    kill_child_jvms()


class _Terminated(BaseException):
    """SIGTERM (or a terminal's SIGHUP), raised in the main thread so that `clean` stops its threads as on Ctrl-C
    before dying of it."""

    def __init__(self, signum: int = 15) -> None:
        super().__init__(signum)
        self.signum = signum


class _StopSignalsStopCleaning:
    """While cleaning, SIGTERM, and SIGHUP unless it is ignored (`nohup`), raise `_Terminated` in the main thread
    (only there may a handler be set); once the cleaning has stopped, the process dies of that signal, with the
    status it always had (143 or 129 in a shell). A closed terminal thus stops `clean` as SIGTERM does: the
    running rounds abort at their next window and remove their files. `hangup=False` leaves SIGHUP alone (`ingest`,
    whose commit holds SIGTERM only)."""

    def __init__(self, *, hangup: bool = True) -> None:
        self.hangup = hangup

    def __enter__(self) -> None:
        import signal
        import threading

        self.previous: dict[int, Any] = {}
        if threading.current_thread() is not threading.main_thread():
            return
        for signum in (signal.SIGTERM, signal.SIGHUP) if self.hangup else (signal.SIGTERM,):
            if signum == signal.SIGHUP and signal.getsignal(signum) is signal.SIG_IGN:
                continue  # `nohup logcleaner clean ...`: the hangup stays ignored
            self.previous[signum] = signal.signal(signum, self._terminate)

    @staticmethod
    def _terminate(signum, frame) -> None:
        raise _Terminated(signum)

    def __exit__(self, exc_type, exc, tb) -> None:
        import signal

        for signum, previous in self.previous.items():
            signal.signal(signum, previous)
        if exc_type is _Terminated and exc.signum in self.previous:
            signal.signal(exc.signum, signal.SIG_DFL)
            for stream in (sys.stdout, sys.stderr):
                try:
                    stream.flush()
                except (OSError, ValueError):
                    pass  # a closed pipe: nothing more to say
            os.kill(os.getpid(), exc.signum)
            sys.exit(128 + exc.signum)  # not reached: the signal's default action ends the process


class _IngestSignals:
    """Ctrl-C and SIGTERM during `ingest`: before the commit, KeyboardInterrupt and `_Terminated` (the job is
    aborted); during it, held (`held` names the signal) until the commit has finished, which is then the
    outcome. Also remembers any signal, so that a Spark failure caused by it (a signal to the process group
    ends the JVM too) is taken as the signal (`failures_as_the_signal`). An ignored SIGINT (a background job)
    stays ignored. Main thread only (where the command runs); restores the handlers on exit."""

    def __enter__(self) -> _IngestSignals:
        import signal

        self.held: str | None = None
        self._committing = False
        self._signalled: type[BaseException] | None = None
        self._previous = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
        self.install()
        return self

    def install(self) -> None:
        """(Again) make these the handlers: a new SparkContext sets its own SIGINT handler, which talks to the
        JVM inside the handler."""
        import signal

        if self._previous[signal.SIGINT] != signal.SIG_IGN:
            signal.signal(signal.SIGINT, self._on_signal)
        signal.signal(signal.SIGTERM, self._on_signal)

    def _on_signal(self, signum, frame) -> None:
        import signal

        interrupt = signum == signal.SIGINT
        if self._committing:
            self.held = self.held or ("Ctrl-C" if interrupt else "SIGTERM")
            return
        self._signalled = KeyboardInterrupt if interrupt else _Terminated
        raise self._signalled()

    def committing(self, started: bool) -> None:
        self._committing = started

    @contextlib.contextmanager
    def failures_as_the_signal(self) -> Iterator[None]:
        """Any exception after a signal is the signal's: a signal to the whole process group ends the JVM too,
        and py4j then raises whatever the dying connection gave it."""
        try:
            yield
        except Exception:
            if self._signalled is not None:
                raise self._signalled() from None
            raise

    def __exit__(self, exc_type, exc, tb) -> None:
        import signal

        for sig, handler in self._previous.items():
            signal.signal(sig, handler)


class _NoBar:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def update(self, n: int) -> None:
        pass  # no terminal: no progress bar

    def clear_line(self) -> None:
        pass


class _Bar:
    """`clean`'s progress bar on a terminal's stderr: the bytes read and written against twice the logs' size (a
    round reads its log twice, survey and recopy, and writes a fraction), never past 99% until the clean is done,
    then 100%; no time estimate (a first run compiles the kernels first). `clear_line` blanks it before a
    partition's line is printed, and before a logged warning (the first run's "compiling the cleaner's kernels"),
    so that no line is written over the bar."""

    def __init__(self, total_bytes: int) -> None:
        self.length = max(2 * total_bytes, 1)
        self.done = 0
        self.bar = click.progressbar(length=self.length, label="cleaning", file=sys.stderr, show_eta=False)
        self._last_resort: logging.Handler | None = None

    def __enter__(self):
        self.bar.__enter__()
        # `clean` configures no logging handler: warnings go to logging's last resort, which writes to stderr
        self._last_resort = logging.lastResort
        if self._last_resort is not None:
            logging.lastResort = _BelowTheBar(self, self._last_resort)
        return self

    def __exit__(self, exc_type, exc, tb):
        logging.lastResort = self._last_resort
        if exc_type is None:
            self.bar.update(self.length - self.done)
        return self.bar.__exit__(exc_type, exc, tb)

    def update(self, n: int) -> None:
        step = min(n, self.length * 99 // 100 - self.done)
        if step > 0:
            self.done += step
            self.bar.update(step)

    def clear_line(self) -> None:
        sys.stderr.write("\r\x1b[K")
        sys.stderr.flush()


class _BelowTheBar(logging.Handler):
    """A logging handler that blanks the bar's line, then lets `inner` write the record there."""

    def __init__(self, bar: _Bar, inner: logging.Handler) -> None:
        super().__init__(inner.level)
        self._bar, self._inner = bar, inner

    def emit(self, record: logging.LogRecord) -> None:
        self._bar.clear_line()
        self._inner.handle(record)


def _describe(s: dict, show_policy: bool = False) -> str:
    name = s["partition"]
    if s["status"] == "skipped":
        return f"{name}: skipped ({s['reason']})"
    if show_policy and "policy_source" in s:
        name += f" [{s['cleanup_policy']}: {s['policy_source']}]"
    if s["status"] == "failed" and not s.get("rounds"):
        return f"{name}: FAILED: {s['error']}"
    parts = []
    if s.get("segments_deleted"):
        verb = "would delete" if s["retention_dry_run"] else "deleted"
        parts.append(f"{verb} {s['segments_deleted']} segment(s), {megabytes(s['bytes_deleted'])} "
                     f"({', '.join(s['retention_reasons'])}), log start {s['log_start_offset']}")
    if s["rounds"]:
        verb = "would clean" if s.get("dry_run") else "cleaned"
        parts.append(
            f"{verb} [{s.get('first_dirty')}, {s.get('end_offset')}) in {s['rounds']} round(s): "
            + (f"{s.get('records_read', 0)} -> {s.get('records_written', 0)} records, " if s["rounds"] == 1 else
               # each round reads the log as the last one left it: the sums are I/O, not before and after
               f"{s.get('records_read', 0)} records read and {s.get('records_written', 0)} written by the rounds, ")
            + f"{megabytes(s.get('size_before_bytes', 0))} -> {megabytes(s.get('size_after_bytes', 0))}, "
            f"{s.get('invalid_records', 0)} unkeyed dropped, {s.get('elapsed_s', 0):.2f} s"
        )
        horizon = s.get("next_delete_horizon_ms", -1)
        if horizon is not None and horizon >= 0:
            import datetime

            when = datetime.datetime.fromtimestamp(horizon / 1000, datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
            parts.append(f"tombstones or transaction markers kept until their delete horizon, {when}")
    line = f"{name}: " + ("; ".join(parts) or "nothing to do")
    if s["status"] == "failed":
        line += f"; FAILED: {s['error']}"
    return line


@main.command()
@click.argument("source")
@click.option("--topic", required=True, help="Topic to write (partition directories <topic>-<p>).")
@click.option("--partitions", required=True, type=click.IntRange(min=1), help="Partition count of the topic.")
@click.option("--key-column", required=True, help="Input column whose bytes are each record's key.")
@click.option("--value-column", help="Input column whose bytes are each record's value.")
@click.option("--value-format", type=click.Choice(["json"]), help="json: the whole input row, as JSON, is the value.")
@click.option("--output", required=True, type=click.Path(file_okay=False, path_type=Path), help="Log directory to write.")
@click.option("--null-keys", type=click.Choice(["error", "drop"]), default="error", show_default=True,
              help="Rows whose key is null: error refuses the input (nothing is written); drop writes the other rows.")
@click.option("--format", "input_format", show_default="from the file extension", help="Spark input format.")
@click.option("--timestamp-column", show_default="the write time", help="Input column for record timestamps.")
@click.option("--compression", type=click.Choice(["none", "gzip", "snappy", "lz4", "zstd"]), default="none",
              show_default=True)
@click.option("--records-per-batch", default=1000, show_default=True, type=click.IntRange(min=1))
@click.option("--segment-bytes", type=SizeParam(min_bytes=1024, max_bytes=2**31 - 1), show_default="1GiB",
              help="segment.bytes of the written logs: bytes, or with a unit (64MiB, 1GiB).")
@click.option("--overwrite", is_flag=True, help="Replace the topic's partitions instead of appending to them.")
@click.option("--compact", is_flag=True, help="Clean the written partitions afterwards (latest record per key).")
@click.option("--master", default="local[*]", show_default=True, help="Spark master URL.")
@click.option("--option", "read_options", multiple=True, metavar="KEY=VALUE", help="A Spark reader option (repeatable).")
@click.option("--spark-log", type=click.Path(dir_okay=False, path_type=Path),
              help="Append Spark's own output (its log, warnings, worker output) to this file; by default only its "
                   "progress bar is shown, on a terminal.")
def ingest(source, topic, partitions, key_column, value_column, value_format, output, null_keys, input_format,
           timestamp_column, compression, records_per_batch, segment_bytes, overwrite, compact, master, read_options,
           spark_log) -> None:
    """Write the rows of SOURCE (Parquet, JSON lines, CSV, ...) into topic partitions with Spark.

    Each row goes to the partition Kafka's default partitioner picks for its key; order within a partition is
    the input's. Prints records, partitions, bytes and, with --compact, the duplicates compaction removed.
    Every error is one line on stderr: exit 2 when the command line names something that is not there or
    cannot be (source, column, format, option, partition count), 1 when the data or Spark fails (null keys,
    an unreadable input, a failed task, no Java); a failed ingest leaves the output as it was.
    """
    import time

    from segments.files.pathcheck import describe_os_error
    from segments.spark import JvmConsole, SparkUnavailableError, get_session, stop_session
    from segments.spark.bulk_write import abort_job, missing_dirs, new_job_id
    from segments.spark.ingest import IngestUsageError, check_ingest
    from segments.spark.ingest import ingest as run_ingest
    from segments.spark.session import quiet_py4j

    if (value_column is None) == (value_format is None):
        raise OneLineUsageError("give exactly one of --value-column or --value-format json")
    options = {}
    for item in read_options:
        key, eq, value = item.partition("=")
        if not eq or not key.strip():
            raise OneLineUsageError(f"Invalid value for '--option': expected KEY=VALUE, got {item!r}")
        options[key.strip()] = value.strip()
    request = dict(topic=topic, partitions=partitions, output=str(output), value_column=value_column,
                   value_format=value_format, input_format=input_format, null_keys=null_keys, overwrite=overwrite)
    from segments.partition.locks import log_dir_owner

    if (owner := log_dir_owner(output)) is not None:  # before Spark starts; the commit takes the lock itself
        raise click.ClickException(str(owner))
    try:
        check_ingest(source, **request)  # before Spark starts: a usage error costs no JVM
    except IngestUsageError as exc:
        raise OneLineUsageError(str(exc)) from None
    except SegmentError as exc:
        raise click.ClickException(one_line(str(exc))) from None
    try:
        log_file = open(spark_log, "ab") if spark_log is not None else None
    except OSError as exc:
        raise OneLineUsageError(f"--spark-log: {describe_os_error(exc)}") from None
    console = JvmConsole(progress=sys.stderr if sys.stderr.isatty() else None, log_file=log_file)
    quiet_py4j()  # a Ctrl-C or a lost JVM is said in one line, not in py4j's tracebacks
    job_id, created = new_job_id(), missing_dirs(output)
    started = time.perf_counter()
    spark = None
    try:
        # Ctrl-C or SIGTERM: the job cancelled, Spark stopped (its JVM killed), the staging removed, then the
        # command ends as `clean` does ("Aborted!" for Ctrl-C, the signal's own status for SIGTERM); during the
        # commit, held until it has finished (the rows are then written: said, exit 0).
        with _StopSignalsStopCleaning(hangup=False), _IngestSignals() as signals:
            try:
                try:
                    with signals.failures_as_the_signal():
                        spark = get_session(master, app_name=f"logcleaner ingest {topic}", console=console)
                except SparkUnavailableError as exc:
                    raise click.ClickException(one_line(str(exc))) from None
                signals.install()
                startup_s = time.perf_counter() - started
                try:
                    with signals.failures_as_the_signal():
                        result = run_ingest(
                            spark, source, key_column=key_column, timestamp_column=timestamp_column,
                            compression=compression, records_per_batch=records_per_batch,
                            segment_bytes=segment_bytes, read_options=options, job_id=job_id,
                            on_commit=signals.committing, **request,
                        )
                except IngestUsageError as exc:
                    raise OneLineUsageError(str(exc)) from None
                except SegmentError as exc:  # IngestError, NullKeyError, a partition that cannot be read
                    raise click.ClickException(one_line(str(exc))) from None
                except OSError as exc:
                    raise click.ClickException(describe_os_error(exc)) from None
            except (KeyboardInterrupt, _Terminated):
                _stop_spark_now(spark, console)
                spark = None
                abort_job(output, job_id, created_dirs=created)  # what a task wrote before Spark stopped
                raise
            finally:
                console.end_progress()
                if spark is not None:
                    stop_session(spark)
    finally:
        console.close()
    mb = result.total_bytes / MB
    dropped = (f" ({result.null_key_rows_dropped} of {result.rows_read} rows dropped: null key column {key_column!r})"
               if result.null_key_rows_dropped else "")
    click.echo(
        f"ingested {result.total_records} records into {partitions} partition(s) of {topic!r} in {output}{dropped}: "
        f"{megabytes(result.total_bytes)} in {result.write_s:.1f} s ({result.total_records / max(result.write_s, 1e-9):,.0f} records/s, "
        f"{mb / max(result.write_s, 1e-9):.1f} MB/s; Spark start-up {startup_s:.1f} s)"
    )
    for p in range(partitions):
        click.echo(f"  {topic}-{p}: {result.records[p]} records, {megabytes(result.bytes[p])}")
    if signals.held is not None:  # the commit had started: it was finished, and the command ends here
        click.echo(f"{signals.held} during the commit: the commit was finished first, the rows above are written",
                   err=True)
        return
    if compact:
        from .oneshot import clean_partition
        from .settings import Settings

        settings = Settings.from_mappings({"cleanup.policy": "compact"})
        now_ms = int(time.time() * 1000)
        removed = 0
        failed = False
        for p in range(partitions):
            outcome = clean_partition(output / f"{topic}-{p}", settings, now_ms=now_ms)
            failed |= not outcome.ok
            summary = outcome.summary()
            removed += summary.get("records_read", 0) - summary.get("records_written", 0)
            click.echo("  " + _describe(summary))
        click.echo(f"compacted: {removed} duplicate records removed")
        if failed:
            sys.exit(1)


@main.command()
@click.argument("paths", nargs=-1, required=True, type=click.Path(exists=True, readable=False, file_okay=False, path_type=Path))
@click.option("--method", type=click.Choice(["auto", "exact", "bloom"]), default="auto", show_default=True,
              help="exact: count distinct keys (16 bytes a record, whatever --memory says); bloom: estimate them with "
                   "a bloom filter of --memory bytes; auto: exact if it fits --memory, else bloom.")
@click.option("--memory", "memory_bytes", default="256MiB", show_default=True, type=SizeParam(min_bytes=1024),
              help="The bloom filter's size, and auto's limit for an exact count, per partition (exact alone does "
                   "not keep to it): bytes, or with a unit (64KiB, 256MiB, 1GiB); at most this machine's memory.")
@click.option("--spark", "use_spark", is_flag=True, help="Count with Spark over the logsegments data source.")
@click.option("--master", default="local[*]", show_default=True, help="Spark master URL (with --spark).")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per partition, then the total.")
@notes_on_rebuilt_indexes
def duplication(paths, method, memory_bytes, use_spark, master, as_json) -> None:
    """Estimate, per partition and in total, the fraction of records compaction would remove (nothing is changed).

    The total's bytes are the sum of the partitions'. Exit 1 if a partition cannot be read (the message names
    the file and what is wrong; the others are still estimated).
    """
    from segments.files.pathcheck import describe_os_error

    from .duplication import PartitionDuplication, estimate_partition, total

    _check_memory_fits(memory_bytes)  # for every method, before anything is read
    _warn_if_broker_owns(paths)
    found, failed = _read_only_partitions(paths)
    if use_spark:
        from segments.spark import SparkUnavailableError, get_session
        from segments.spark.duplication import duplication_counts

        try:
            spark = get_session(master, app_name="logcleaner duplication")
        except SparkUnavailableError as exc:
            raise click.ClickException(str(exc)) from None
        try:
            counts = duplication_counts(spark, [str(p) for p in paths], method=method, memory_bytes=memory_bytes)
        finally:
            spark.stop()
        parts = [PartitionDuplication(**c) for c in counts]
    else:
        parts = []
        for directory in found:
            try:
                parts.append(estimate_partition(directory, memory_bytes=memory_bytes, method=method))
            except MemoryError:  # numpy's allocation error is one: a --memory this machine cannot give
                raise OneLineUsageError(f"--memory {memory_bytes}: more than this machine can allocate; "
                                         "give less (the bloom estimate's error grows as memory shrinks)") from None
            except (SegmentError, OSError) as exc:
                reason = describe_os_error(exc) if isinstance(exc, OSError) else one_line(str(exc))
                click.echo(f"{directory.name}: FAILED: {reason}", err=True)
                failed = True
    for part in [*parts, total(parts)] if parts else []:  # no total of nothing estimated
        click.echo(json.dumps(part.as_dict()) if as_json else part.describe())
    sys.exit(1 if failed else 0)


def _machine_memory_bytes() -> int | None:
    """This machine's physical memory (None where the system does not say)."""
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):  # no such sysconf name here
        return None


def _check_memory_fits(memory_bytes: int) -> None:
    """A `duplication --memory` above this machine's memory is a usage error, whatever the method."""
    machine = _machine_memory_bytes()
    if machine is not None and machine > 0 and memory_bytes > machine:
        raise click.BadParameter(f"{memory_bytes} bytes is more than this machine's memory ({megabytes(machine)}); "
                                 "give less", param_hint="'--memory'")


DEMO_MARKER = ".logcleaner-demo"  # written by demo into the directory it fills: only such a one is replaced
DEMO_RECORDS_MAX = 10_000_000  # per partition
DEMO_PARTITIONS_MAX = 64
_DEMO_FOREIGN_SHOWN_MAX = 3  # entries named when a directory is refused


def _demo_foreign_entries(directory: Path) -> list[str]:
    """What in an existing `directory` a previous `demo` did not write: everything, unless it holds the demo's
    marker; with the marker, anything but the marker, lock files, checkpoints and `demo-<n>` partition
    directories that hold only partition files. Empty: the directory may be (re)filled."""
    from segments.files.pathcheck import is_partition_file_name, parse_partition_dir_name

    names = sorted(os.listdir(directory))
    if DEMO_MARKER not in names:
        return names
    foreign = []
    for name in names:
        path = directory / name
        if path.is_symlink():
            foreign.append(name)
        elif path.is_dir():
            parsed = parse_partition_dir_name(name)
            if parsed is None or parsed[0] != "demo" or not all(is_partition_file_name(n) for n in os.listdir(path)):
                foreign.append(name)
        elif not (name == DEMO_MARKER or (name.startswith(".") and name.endswith(".lock"))
                  or name.removesuffix(".tmp").endswith("-checkpoint")):
            foreign.append(name)
    return foreign


def _prepare_demo_directory(directory: Path) -> None:
    """Create `directory`, or take it when it is empty or holds only a previous demo's files (which are removed).

    Anything else — a file, a Kafka log dir, `--dir .` in a directory with files — is refused in one line
    (exit 2) before anything is touched: demo never deletes what it did not write."""
    from segments.codec.errors import display_path
    from segments.files.pathcheck import describe_os_error

    try:
        if directory.exists():
            foreign = _demo_foreign_entries(directory)
            if foreign:
                shown = ", ".join(display_path(n) for n in foreign[:_DEMO_FOREIGN_SHOWN_MAX])
                more = f" and {len(foreign) - _DEMO_FOREIGN_SHOWN_MAX} more" if len(foreign) > _DEMO_FOREIGN_SHOWN_MAX else ""
                raise click.BadParameter(
                    f"{display_path(directory)} holds files demo did not write ({shown}{more}); demo writes only "
                    "into a directory it creates, an empty one, or one an earlier demo filled",
                    param_hint="'--dir'")
            for entry in sorted(os.listdir(directory)):  # only a previous demo's files (checked above)
                path = directory / entry
                if path.is_dir() and not path.is_symlink():
                    shutil.rmtree(path)
                else:
                    path.unlink()
        else:
            directory.mkdir(parents=True)
        (directory / DEMO_MARKER).write_text("written by `logcleaner demo`, which may replace this directory\n")
    except OSError as exc:
        raise click.BadParameter(describe_os_error(exc), param_hint="'--dir'") from None


@main.command()
@click.option("--dir", "directory", type=click.Path(file_okay=False, path_type=Path), default=Path("demo-logs"),
              show_default=True,
              help="Log directory to write: created if missing; else it must be empty or hold an earlier demo's "
                   "output, which is replaced (anything else is refused, nothing touched).")
@click.option("--records", default=50_000, show_default=True, type=click.IntRange(1, DEMO_RECORDS_MAX),
              help="Records per partition.")
@click.option("--keys", default=2_000, show_default=True, type=click.IntRange(1, DEMO_RECORDS_MAX),
              help="Distinct keys per partition.")
@click.option("--partitions", default=2, show_default=True, type=click.IntRange(1, DEMO_PARTITIONS_MAX),
              help="Partitions of topic 'demo'.")
def demo(directory: Path, records: int, keys: int, partitions: int) -> None:
    """Generate a demo log directory of keyed records, clean it, and show it before and after.

    It writes only into a directory it creates, an empty one, or one an earlier demo filled (marked by its
    .logcleaner-demo file); any other directory is refused in one line (exit 2) and left untouched.
    """
    import time

    from segments.tools.generate import WorkloadSpec, generate_partition
    from segments.tools.verify import verify_paths

    from .oneshot import clean_partition, find_partitions
    from .settings import Settings

    _prepare_demo_directory(directory)
    for p in range(partitions):
        spec = WorkloadSpec(records=records, keys=keys, tombstone_fraction=0.05, seed=p)
        counts = generate_partition(directory / f"demo-{p}", spec)
        click.echo(
            f"wrote demo-{p}: {counts['records']} records over {counts['keys']} keys "
            f"({counts['tombstones']} tombstones) in {counts['batches']} batches"
        )
    before = verify_paths([directory])
    click.echo(f"before: {before.segments} segments, {before.records} records, {megabytes(before.bytes)}")
    settings = Settings.from_mappings({"cleanup.policy": "compact"})
    now_ms = int(time.time() * 1000)
    failed = False
    for partition in find_partitions([directory]):
        outcome = clean_partition(partition, settings, now_ms=now_ms)
        failed |= not outcome.ok
        click.echo(_describe(outcome.summary()))
    after = verify_paths([directory])
    for problem in after.problems:
        click.echo(str(problem))
    click.echo(
        f"after:  {after.segments} segments, {after.records} records, {megabytes(after.bytes)}; "
        f"verify: {'OK' if not after.problems else 'FAILED'}"
    )
    click.echo(f"inspect it with: logcleaner dump --deep-iteration {directory}/demo-0/00000000000000000000.log")
    sys.exit(1 if failed or after.problems else 0)


def entry() -> None:
    """The `logcleaner` console script and `python -m cleaner.cli`: the command group, then the process ends
    without the interpreter's teardown (`cli_support.end_process`). Tests call `main` (click's runner)."""
    occupy_closed_standard_fds()
    try:
        try:
            main()  # click's standalone mode: always ends in SystemExit
        except OSError as exc:  # stdout cannot be written (`> /dev/full`): one line, exit 1
            if not output_failed(exc):
                raise
            sys.exit(1)
    except SystemExit as exc:
        end_process(exc.code)
        raise


if __name__ == "__main__":
    entry()
