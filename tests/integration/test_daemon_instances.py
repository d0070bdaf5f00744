"""One daemon per log dir, one copy of each partition, one address: refused at start, in one line.

Real daemons (`logcleaner run`) as subprocesses: a second daemon on a log dir a first one cleans is refused
naming the first one's pid; a partition in two log dirs is refused as Kafka refuses it; a taken address is
named.
"""

from __future__ import annotations

import socket

from .daemon_helpers import T0, DaemonProcess, append_keyed, free_port, run_cli, write_config


def _partition(log_dir, name="t-0"):
    append_keyed(log_dir / name, [(b"k", b"v")] * 10, timestamp_ms=T0)


def test_a_second_daemon_on_the_same_log_dir_is_refused_naming_the_first(tmp_path):
    log_dir = tmp_path / "logs"
    _partition(log_dir)
    port = free_port()
    first = DaemonProcess(write_config(tmp_path / "a.toml", log_dirs=[log_dir], port=port), port, tmp_path / "a.log")
    first.start()
    try:
        second_port = free_port()
        second = write_config(tmp_path / "b.toml", log_dirs=[log_dir], port=second_port)
        done = run_cli("run", "-c", str(second), timeout_s=60)
        assert done.returncode == 1, done
        assert done.stderr.strip().splitlines()[-1] == (
            f"Error: another logcleaner daemon (pid {first.proc.pid}) cleans {log_dir}: stop it first")
        assert "Traceback" not in done.stderr
        assert first.running()
    finally:
        first.close()
    second_daemon = DaemonProcess(second, second_port, tmp_path / "b.log")
    try:
        second_daemon.start()  # the lock went with the first daemon
    finally:
        second_daemon.close()


def test_a_partition_in_two_log_dirs_is_refused_as_kafka_refuses_it(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    _partition(a)
    _partition(b)
    _partition(b, "other-0")
    config = write_config(tmp_path / "c.toml", log_dirs=[a, b], port=free_port())
    done = run_cli("run", "-c", str(config), timeout_s=60)
    assert done.returncode == 2, done
    assert f"partition t-0 is in two log dirs, {a} and {b}" in done.stderr and "Traceback" not in done.stderr


def test_an_address_in_use_is_named(tmp_path):
    log_dir = tmp_path / "logs"
    _partition(log_dir)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        config = write_config(tmp_path / "c.toml", log_dirs=[log_dir], port=port)
        done = run_cli("run", "-c", str(config), timeout_s=60)
    assert done.returncode == 1, done
    assert done.stderr.strip().splitlines()[-1] == f"Error: cannot listen on 127.0.0.1:{port}: Address already in use"
