"""One answer per question, and no command destroys what it did not create (issue 24), judged from outside.

* `demo --dir X` writes only into a directory it creates, an empty one, or one an earlier demo filled;
* every command has one rule for directories without partitions: an empty but valid directory is not a
  usage error (one line, exit 0), and a partition directory without segments is a partition wherever it is named;
* `duplication`'s total bytes are the sum of its rows;
* `audit` of a partition with crash leftovers shows Kafka's post-recovery view and lists the leftovers;
* `dump` and `verify` give one diagnosis of the same garbage;
* messages say what was expected (no Python internals), a permission problem says what the mode denies;
* `--help` shows defaults with click's `show_default`, one case for `--log-level`, sizes with units.
"""

from __future__ import annotations

import errno
import json
import os
import re
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from cleaner.cli import main
from segments.codec import format as fmt
from segments.codec.records import Record, encode_batch
from segments.files.pathcheck import describe_os_error
from segments.partition.log import PartitionLog
from segments.tools.generate import WorkloadSpec, generate_partition

from ..segments.helpers import Crash, CrashingFileOps
from ..segments.test_swap_recovery import build_cleaned_group

SEGMENT = fmt.offset_file_name(0, fmt.LOG_SUFFIX)
NOTHING_FOUND = "no partition directories (<topic>-<partition>) found in"


def cli(*args) -> click.testing.Result:
    return CliRunner().invoke(main, [str(a) for a in args])


def tree_state(root: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(root)): (p.lstat().st_size, p.lstat().st_mtime_ns) for p in root.rglob("*")}


# ---- demo ------------------------------------------------------------------------------------------------------


def test_demo_refuses_a_directory_holding_a_file_and_the_file_survives(tmp_path):
    target = tmp_path / "mine"
    target.mkdir()
    (target / "important.txt").write_text("keep\n")
    result = cli("demo", "--dir", target, "--records", 10, "--keys", 5)
    assert result.exit_code == 2
    assert result.stderr.count("\n") == 1 and "important.txt" in result.stderr, result.stderr
    assert [p.name for p in target.iterdir()] == ["important.txt"]
    assert (target / "important.txt").read_text() == "keep\n"


def test_demo_dir_dot_in_a_directory_with_files_refuses_and_touches_nothing(tmp_path, monkeypatch):
    (tmp_path / "important.txt").write_text("keep\n")
    monkeypatch.chdir(tmp_path)
    before = tree_state(tmp_path)
    result = cli("demo", "--dir", ".", "--records", 10, "--keys", 5)
    assert result.exit_code == 2 and "demo did not write" in result.stderr, result.output
    assert tree_state(tmp_path) == before


def test_demo_refuses_a_kafka_log_dir_and_leaves_every_file(tmp_path):
    log_dir = tmp_path / "kafka-logs"
    generate_partition(log_dir / "orders-0", WorkloadSpec(records=200, keys=20))
    (log_dir / "meta.properties").write_text("version=1\nnode.id=1\n")
    before = tree_state(log_dir)
    result = cli("demo", "--dir", log_dir, "--records", 10, "--keys", 5)
    assert result.exit_code == 2 and "meta.properties" in result.stderr
    assert tree_state(log_dir) == before


def test_demo_fills_a_new_or_empty_directory_and_replaces_only_its_own_output(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    assert cli("demo", "--dir", empty, "--records", 100, "--keys", 10, "--partitions", 1).exit_code == 0
    fresh = tmp_path / "a" / "b"
    assert cli("demo", "--dir", fresh, "--records", 100, "--keys", 10, "--partitions", 3).exit_code == 0
    again = cli("demo", "--dir", fresh, "--records", 100, "--keys", 10, "--partitions", 1)  # its own output
    assert again.exit_code == 0, again.output
    assert sorted(p.name for p in fresh.iterdir() if p.is_dir()) == ["demo-0"]
    (fresh / "demo-0" / "notes.txt").write_text("mine\n")  # something the demo did not write
    assert cli("demo", "--dir", fresh, "--records", 100, "--keys", 10).exit_code == 2
    assert (fresh / "demo-0" / "notes.txt").read_text() == "mine\n"


@pytest.mark.parametrize("option, value", [("--keys", 0), ("--partitions", 0), ("--partitions", -1),
                                           ("--records", 0), ("--records", -1)])
def test_demo_refuses_counts_below_one_before_touching_anything(tmp_path, option, value):
    result = cli("demo", "--dir", tmp_path / "d", option, value)
    assert result.exit_code == 2 and f"Invalid value for '{option}'" in result.stderr
    assert not (tmp_path / "d").exists()


# ---- one discovery rule ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("command", [["verify"], ["audit"], ["duplication"], ["clean", "--set", "cleanup.policy=compact"]])
def test_an_empty_log_dir_is_not_a_usage_error_for_any_command(tmp_path, command):
    (tmp_path / "logs").mkdir()
    result = cli(*command, tmp_path / "logs")
    assert result.exit_code == 0, result.output
    assert result.stderr == f"{NOTHING_FOUND} {tmp_path / 'logs'}\n"
    assert list((tmp_path / "logs").iterdir()) == []


@pytest.mark.parametrize("leftover", [[], [".cleaner.lock", ".swap.lock"]])  # as a clean of an empty one leaves it
def test_a_partition_without_segments_is_one_whether_its_log_dir_or_itself_is_named(tmp_path, leftover):
    partition = tmp_path / "logs" / "t-0"
    partition.mkdir(parents=True)
    for name in leftover:
        (partition / name).touch()
    for path in (tmp_path / "logs", partition):
        audit = cli("audit", "--json", path)
        assert audit.exit_code == 0 and json.loads(audit.stdout)["partition"] == "t-0", audit.output
        verify = cli("verify", "--json", path)
        assert verify.exit_code == 0 and json.loads(verify.stdout)["partitions"] == 1, verify.output
        dup = cli("duplication", "--json", path)
        assert dup.exit_code == 0 and [json.loads(x)["name"] for x in dup.stdout.splitlines()] == ["t-0", "total"]


def test_odd_entries_of_a_log_dir_without_partitions_are_named_in_the_one_line(tmp_path):
    (tmp_path / "logs" / "t-01").mkdir(parents=True)
    result = cli("audit", tmp_path / "logs")
    assert result.exit_code == 0 and result.stderr.count("\n") == 1
    assert result.stderr.startswith(NOTHING_FOUND) and "ignored: " in result.stderr and "t-01" in result.stderr


# ---- duplication ------------------------------------------------------------------------------------------------


def test_duplication_total_bytes_freed_is_the_sum_of_its_rows(tmp_path):
    # Partitions of very different record sizes and duplication: the total fraction of the total bytes is not
    # the sum (642,891 B against 1,460 B were seen), the sum is what compaction would free.
    generate_partition(tmp_path / "t-0", WorkloadSpec(records=3000, keys=30, value_bytes=400, seed=1))
    generate_partition(tmp_path / "t-1", WorkloadSpec(records=3000, keys=2900, value_bytes=10, seed=2))
    generate_partition(tmp_path / "t-2", WorkloadSpec(records=500, keys=500, value_bytes=2000, seed=3))
    result = cli("duplication", "--json", tmp_path)
    assert result.exit_code == 0, result.output
    *rows, total = [json.loads(line) for line in result.stdout.splitlines()]
    assert total["name"] == "total" and len(rows) == 3
    assert total["bytes_freed"] == pytest.approx(sum(r["bytes_freed"] for r in rows))
    assert total["bytes_freed"] != pytest.approx(total["fraction"] * total["size_bytes"])  # the old, wrong total
    text = cli("duplication", tmp_path).stdout.splitlines()
    shown = [float(re.search(r"~([\d.]+) MB of", line).group(1)) for line in text]
    assert shown[-1] == pytest.approx(sum(shown[:-1]), abs=0.02)


def test_duplication_memory_takes_a_size_with_a_unit_as_set_does(tmp_path):
    generate_partition(tmp_path / "t-0", WorkloadSpec(records=500, keys=50))
    result = cli("duplication", "--json", "--method", "bloom", "--memory", "64KiB", tmp_path / "t-0")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout.splitlines()[0])["filter_bytes"] == 64 * 1024


@pytest.mark.parametrize("method", ["auto", "exact", "bloom"])
def test_duplication_memory_above_the_machines_is_a_usage_error_for_every_method(tmp_path, method):
    generate_partition(tmp_path / "t-0", WorkloadSpec(records=50, keys=5))
    result = cli("duplication", "--method", method, "--memory", "1000000GiB", tmp_path / "t-0")
    assert result.exit_code == 2, result.output
    assert result.stderr.startswith("Error: Invalid value for '--memory': ") and "more than this machine's memory" in \
        result.stderr and len(result.stderr.splitlines()) == 1, result.stderr


def test_every_command_prints_one_partitions_size_the_same_in_decimal_mb(tmp_path):
    # 281,364 bytes was 0.27 MB (MiB) in clean and 0.28 MB in audit and duplication: one formatter now, 10^6 bytes
    generate_partition(tmp_path / "t-0", WorkloadSpec(records=3000, keys=3000, value_bytes=60))
    size = sum(f.stat().st_size for f in (tmp_path / "t-0").glob("*.log"))
    shown = f"{size / 1e6:.2f} MB"
    assert shown != f"{size / 2**20:.2f} MB", "a size whose MB and MiB differ at two decimals"
    cleaned = cli("clean", "--dry-run", "--set", "cleanup.policy=compact", tmp_path / "t-0")
    assert cleaned.exit_code == 0 and f"records, {shown} -> " in cleaned.stdout, cleaned.output
    audited = cli("audit", tmp_path / "t-0")
    assert f"), {shown}: " in audited.stdout, audited.output
    estimated = cli("duplication", tmp_path / "t-0")
    assert f" of {shown})" in estimated.stdout, estimated.output


# ---- audit of crash leftovers ------------------------------------------------------------------------------------


def test_audit_after_a_crash_mid_swap_shows_the_recovered_view_lists_the_leftovers_and_changes_nothing(tmp_path):
    d = tmp_path / "logs" / "t-0"
    generate_partition(d, WorkloadSpec(records=600, keys=20, segment_bytes=4096))
    log = PartitionLog.open(d, mode="cleaner", file_ops=CrashingFileOps(crash_at=5))  # .swap in, olds half .deleted
    group = log.segments[0:3]
    with pytest.raises(Crash):
        log.replace_segments([build_cleaned_group(log, group)], group)
    log.close()
    before = tree_state(tmp_path)
    leftovers = sorted(p.name for p in d.iterdir() if p.name.endswith((".swap", ".deleted")))
    assert leftovers
    audit = cli("audit", "--json", d)
    assert audit.exit_code == 0, audit.output
    seen = json.loads(audit.stdout)
    assert seen["leftovers"] == leftovers
    assert "leftover file(s) of an interrupted clean or swap" in cli("audit", d).stdout
    assert tree_state(tmp_path) == before  # audit is read-only
    with PartitionLog.open(d, mode="writer"):  # Kafka's recovery, as the next writer does it
        pass
    after = json.loads(cli("audit", "--json", d).stdout)
    assert after["leftovers"] == []
    assert {k: v for k, v in seen.items() if k != "leftovers"} == {k: v for k, v in after.items() if k != "leftovers"}


# ---- dump and verify ---------------------------------------------------------------------------------------------


GARBAGE = {
    "random": bytes((i * 73 + 19) % 256 for i in range(200)),
    "text": b"hello world garbage data here!!" * 3,
    "short": b"\0" * 5,
    "zero-length-field": b"\0" * 8 + b"\0\0\0\x40" + b"\0" * 80,  # a batch of zeros: its CRC does not match
    "negative-length": b"\0" * 8 + b"\xff\xff\xff\xf0" + b"\0" * 40,
}


@pytest.mark.parametrize("name", GARBAGE)
def test_dump_and_verify_diagnose_the_same_garbage_the_same_way(tmp_path, name):
    path = tmp_path / "g-0" / SEGMENT
    path.parent.mkdir()
    path.write_bytes(GARBAGE[name])
    dump = cli("dump", path)
    verify = cli("verify", path)
    assert dump.exit_code == verify.exit_code == 1
    problem = verify.stdout.strip()
    assert problem.startswith(f"{path}: byte ")
    assert dump.stderr.strip() == f"Error: {problem}"


# ---- messages ------------------------------------------------------------------------------------------------------


def test_a_bad_set_value_says_what_was_expected_not_what_python_said(tmp_path):
    generate_partition(tmp_path / "t-0", WorkloadSpec(records=50, keys=5))
    result = cli("clean", "--set", "delete.retention.ms=abc", tmp_path / "t-0")
    assert result.exit_code == 2
    assert result.stderr == "Error: --set: setting 'delete.retention.ms' = 'abc': expected a whole number\n"


def test_a_bad_cleanup_policy_lists_every_allowed_value_compact_delete_too(tmp_path):
    generate_partition(tmp_path / "t-0", WorkloadSpec(records=50, keys=5))
    result = cli("clean", "--set", "cleanup.policy=bogus", tmp_path / "t-0")
    assert result.exit_code == 2
    assert result.stderr == ("Error: --set: setting 'cleanup.policy' = 'bogus': allowed values are delete, compact and "
                             "compact,delete (a comma-separated list of them)\n")


def test_a_directory_named_twice_is_cleaned_once(tmp_path):
    generate_partition(tmp_path / "logs" / "t-0", WorkloadSpec(records=200, keys=20))
    named = tmp_path / "logs" / "t-0"
    result = cli("clean", "--set", "cleanup.policy=compact", named, f"{named}/", tmp_path / "logs")
    assert result.exit_code == 0, result.output
    assert [line.split(":")[0] for line in result.stdout.splitlines()] == ["t-0"]


def test_the_daemons_bad_log_dirs_names_the_file_they_came_from(tmp_path):
    config = tmp_path / "nodir.toml"
    config.write_text(f'"log.dirs" = ["{tmp_path / "nodir"}"]\n')
    result = cli("run", "-c", config)
    assert result.exit_code == 2
    assert result.stderr == (f"Error: {config}: setting 'log.dirs' = ['{tmp_path / 'nodir'}']: {tmp_path / 'nodir'} "
                             "is not a directory\n")
    properties = tmp_path / "server.properties"
    properties.write_text(f"log.dirs={tmp_path / 'nodir'}\n")
    config.write_text("\"log.cleanup.policy\" = \"compact\"\n")
    result = cli("run", "-c", config, "--server-properties", properties)
    assert result.exit_code == 2 and result.stderr.startswith(f"Error: {properties}: setting 'log.dirs'"), result.stderr


def test_a_server_properties_without_a_key_value_line_is_refused(tmp_path):
    generate_partition(tmp_path / "t-0", WorkloadSpec(records=50, keys=5))
    hostname = tmp_path / "hostname"
    hostname.write_text("db-7\n")
    result = cli("clean", "--server-properties", hostname, "--set", "cleanup.policy=compact", tmp_path / "t-0")
    assert result.exit_code == 2
    assert result.stderr == f"Error: {hostname}: not a server.properties file: no key=value line in it\n"


def test_an_empty_or_negative_forced_range_is_refused(tmp_path):
    generate_partition(tmp_path / "t-0", WorkloadSpec(records=50, keys=5))
    backwards = cli("clean", "--from-offset", 25, "--to-offset", 5, tmp_path / "t-0")
    assert backwards.exit_code == 2 and "5 is not above --from-offset 25" in backwards.stderr
    assert cli("clean", "--from-offset", -3, tmp_path / "t-0").exit_code == 2


def test_permission_denied_by_the_owners_own_bits_says_what_the_mode_denies(tmp_path):
    path = tmp_path / SEGMENT
    path.write_bytes(b"")
    path.chmod(0)
    exc = PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(path))
    message = describe_os_error(exc)
    assert message.startswith(f"{path}: permission denied: mode 0000 does not let its owner (uid {os.geteuid()}, "
                              "the user logcleaner runs as) read or write it")
    assert "runs as uid" not in message  # not "owner uid 0 ... runs as uid 0", which says nothing
    (tmp_path / "d-0").mkdir(mode=0o300)
    listing = describe_os_error(PermissionError(errno.EACCES, "Permission denied", str(tmp_path / "d-0")))
    assert "mode 0300 does not let its owner" in listing and "list it" in listing


def test_audit_key_file_is_one_key_its_whole_content(tmp_path):
    d = tmp_path / "t-0"
    long_key = b"k" * 200_000 + b"\n"  # longer than an argument may be; the newline is part of it
    with PartitionLog.open(d, mode="writer", create=True) as log:
        log.append_batches(encode_batch([Record(offset=0, timestamp=1, key=long_key, value=b"v"),
                                         Record(offset=1, timestamp=2, key=long_key[:-1], value=b"w")], base_offset=0))
    key_file = tmp_path / "key"
    key_file.write_bytes(long_key)
    result = cli("audit", "--json", d, "--key-file", key_file)
    assert result.exit_code == 0, result.output
    history = json.loads(result.stdout)["history"]
    assert [(h["key_hex"] == long_key.hex(), [r["offset"] for r in h["records"]]) for h in history] == [(True, [0])]


# ---- --help ---------------------------------------------------------------------------------------------------------


def _options():
    for name, command in main.commands.items():
        for param in command.params:
            if isinstance(param, click.Option):
                yield name, param


def test_no_option_writes_its_default_in_prose():
    for name, option in _options():
        assert not re.search(r"\(default|Default:", option.help or ""), f"{name} {option.opts}: use show_default"


def test_run_requires_its_config_and_log_level_shows_one_case():
    run = main.commands["run"]
    config = next(p for p in run.params if p.name == "config_path")
    assert config.required
    level = next(p for p in run.params if p.name == "log_level")
    assert level.default in level.type.choices
    assert CliRunner().invoke(main, ["run"]).stderr == "Error: Missing option '-c' / '--config'.\n"


def test_to_offset_says_single_partition_only():
    clean = main.commands["clean"]
    for name in ("from_offset", "to_offset"):
        assert "(single partition only)" in next(p for p in clean.params if p.name == name).help


def test_admin_and_status_against_a_server_that_is_not_logcleaner_say_so_in_one_line():
    import http.server
    import threading

    class Quiet(http.server.SimpleHTTPRequestHandler):  # an ordinary web server, minus its request log
        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Quiet)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        for args in (["admin", "--url", url, "trigger", "t-0"], ["status", "--url", url]):
            result = CliRunner().invoke(main, args)
            assert result.exit_code == 1, result.output
            assert len(result.output.strip().splitlines()) == 1, result.output
            assert "not a logcleaner daemon's answer" in result.output and "<html" not in result.output.lower()
    finally:
        server.shutdown()
        server.server_close()
