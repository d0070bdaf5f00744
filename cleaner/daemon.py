"""`logcleaner run`: the long-running cleaner service.

Owns the process: loading and validating the config (`-c` TOML, `--server-properties`), building the
manager, the per-device throttles, the metrics, the thread pool and the HTTP endpoints, and the main loop
that discovers partitions and replaces dead threads. Signals:

* `SIGHUP` reloads the config; an invalid file is reported and the running config kept. Partition states,
  uncleanable marks and metrics survive; the throttle rate, thread count, log dirs and topic settings
  take effect at once (a changed dedupe buffer at each thread's next round).
* `SIGTERM`/`SIGINT` stop it: running rounds abort at their next window, remove their `.cleaned` files
  and leave every group old or new; checkpoints are already on disk (each round writes its own when it
  completes); exit 0. A second signal exits at once with status 1; recovery at the next start finishes or
  rolls back whatever the interrupted swap left.

The clock is the wall clock unless `LOGCLEANER_CLOCK_FILE` names a file holding epoch milliseconds (a test
hook to drive `min.compaction.lag.ms`, `max.compaction.lag.ms` and delete horizons).
"""

from __future__ import annotations

import fcntl
import logging
import os
import signal
import threading
import time
from pathlib import Path

from segments.files.pathcheck import open_no_follow
from segments.partition.log import parse_partition_dir_name

from .admin_http import AdminServer
from .admin_token import (
    ADMIN_TOKEN_ENV,
    AdminTokenError,
    loose_permissions,
    read_token_file,
    resolve_token_file,
    token_from_environment,
)
from .config_file import ConfigFileError, LoadedConfig, load_config
from .errors import CleanerError
from .listen import DEFAULT_LISTEN, is_loopback, parse_listen
from .manager import DISK_FULL_RETRY_MS_DEFAULT, UNCLEANABLE_RETRY_MS_DEFAULT, CleanerManager, StateError
from .metrics import CleanerMetrics
from .pool import CleanerPool
from .throttle import UNLIMITED, DeviceThrottles, device_label

__all__ = ["DAEMON_LOCK", "Daemon", "DaemonStartError", "clock_from_environment"]

log = logging.getLogger(__name__)

SERVER_DEFAULTS = {
    "listen": DEFAULT_LISTEN,
    "discovery_interval_ms": 5_000,
    "uncleanable_retry_ms": UNCLEANABLE_RETRY_MS_DEFAULT,
    "disk_full_retry_ms": DISK_FULL_RETRY_MS_DEFAULT,
    "shutdown_timeout_s": 10.0,
    "admin_token_file": None,  # None: the token comes from LOGCLEANER_ADMIN_TOKEN, or there is none
}


def clock_from_environment():
    """Epoch milliseconds: from the file named by LOGCLEANER_CLOCK_FILE if set, else the wall clock."""
    path = os.environ.get("LOGCLEANER_CLOCK_FILE")
    if not path:
        return lambda: int(time.time() * 1000)

    def file_clock() -> int:
        try:
            return int(Path(path).read_text().strip())
        except (OSError, ValueError):
            return int(time.time() * 1000)

    return file_clock


def _server_settings(loaded: LoadedConfig) -> dict:
    server = dict(SERVER_DEFAULTS)
    for key, value in loaded.server.items():
        if key not in SERVER_DEFAULTS:
            raise ConfigFileError(f"{loaded.path}: unknown [server] setting {key!r} (known: {', '.join(SERVER_DEFAULTS)})")
        server[key] = value
    try:
        parse_listen(str(server["listen"]))
    except ValueError as exc:
        raise ConfigFileError(f"{loaded.path}: [server] listen: {exc}") from None
    for key in ("discovery_interval_ms", "uncleanable_retry_ms", "disk_full_retry_ms"):
        value = server[key]
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigFileError(f"{loaded.path}: [server] {key} = {value!r}: must be an integer ≥ 1")
    timeout = server["shutdown_timeout_s"]
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not 0 < timeout <= 3600:
        raise ConfigFileError(f"{loaded.path}: [server] shutdown_timeout_s = {timeout!r}: must be a number in (0, 3600]")
    if server["admin_token_file"] is not None:
        try:
            server["admin_token_file"] = str(resolve_token_file(server["admin_token_file"], loaded.path))
        except AdminTokenError as exc:
            raise ConfigFileError(f"{loaded.path}: [server] {exc}") from None
    return server


def _admin_token(server: dict, loaded: LoadedConfig) -> bytes | None:
    """The admin token: from [server] admin_token_file, else LOGCLEANER_ADMIN_TOKEN, else None (admin refused)."""
    path = server["admin_token_file"]
    try:
        if path is None:
            return token_from_environment()
        token = read_token_file(path)
    except AdminTokenError as exc:
        raise ConfigFileError(f"{loaded.path}: [server] admin_token_file: {exc}" if path else str(exc)) from None
    if ADMIN_TOKEN_ENV in os.environ:
        log.warning("%s is set but not used: [server] admin_token_file names the admin token", ADMIN_TOKEN_ENV)
    mode = loose_permissions(path)
    if mode is not None:
        log.warning("admin token file %s has mode %04o: others on this host may read it; chmod 600 it", path, mode)
    return token


def _check_log_dirs(loaded: LoadedConfig) -> list[Path]:
    """The configured log dirs, each resolved once: a log dir path may be a symbolic link (the operator's
    choice), and resolving it here keeps the daemon on one target; nothing inside a log dir is followed.

    As Kafka does, refuses a log dir given twice and a partition found in two log dirs (which copy is the
    log would be a guess). Each error names the file `log.dirs` came from, as every other config error does."""
    dirs = [Path(d) for d in loaded.settings.cleaner.log_dirs]
    origin = _log_dirs_origin(loaded)
    resolved: list[Path] = []
    seen: dict[str, Path] = {}
    for d in dirs:
        if not d.is_dir():
            raise ConfigFileError(f"{origin}setting 'log.dirs' = {[str(x) for x in dirs]!r}: {d} is not a directory")
        target = d.resolve()
        if target != d.absolute():
            log.info("log dir %s resolves to %s; using that", d, target)
        if target in resolved:
            raise ConfigFileError(f"{origin}setting 'log.dirs': {target} is given twice")
        for name in sorted(os.listdir(target)):
            if parse_partition_dir_name(name) is None or not (target / name).is_dir():
                continue
            if name in seen:
                raise ConfigFileError(f"{origin}setting 'log.dirs': partition {name} is in two log dirs, {seen[name]} "
                                      f"and {target}; Kafka refuses to start so, and so does logcleaner: remove one")
            seen[name] = target
        resolved.append(target)
    return resolved


def _log_dirs_origin(loaded: LoadedConfig) -> str:
    """Where the daemon's `log.dirs` came from, as an error's prefix: the config file, the `server.properties`,
    or (given in neither) Kafka's default, which the config file left in place."""
    source = loaded.settings.sources.get("log.dirs") if "log.dirs" in loaded.settings.explicit else None
    if source is not None and source.kind == "server.properties" and loaded.settings.broker_file is not None:
        return f"{loaded.settings.broker_file}: "
    if loaded.path is None:
        return ""
    if source is None:
        return f"{loaded.path}: no \"log.dirs\" there, so Kafka's default: "
    return f"{loaded.path}: "


DAEMON_LOCK = ".logcleaner-daemon.lock"  # in each log dir: the one daemon that cleans it, and its pid


class DaemonStartError(CleanerError, RuntimeError):
    """The daemon cannot start: another daemon runs on a log dir, or its address is taken."""


class _DaemonLocks:
    """An exclusive flock on `<log dir>/.logcleaner-daemon.lock` per log dir, held for the daemon's life,
    with the holder's pid written in the file, so a second daemon is refused with the first one's pid."""

    def __init__(self) -> None:
        self._fds: dict[Path, int] = {}

    def take(self, log_dirs: list[Path]) -> None:
        """Lock every log dir not yet held (release the ones no longer listed); raises DaemonStartError."""
        for log_dir in list(self._fds):
            if log_dir not in log_dirs:
                os.close(self._fds.pop(log_dir))
        for log_dir in log_dirs:
            if log_dir in self._fds:
                continue
            path = log_dir / DAEMON_LOCK
            fd = open_no_follow(path, os.O_RDWR | os.O_CREAT | os.O_NONBLOCK)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = os.pread(fd, 32, 0).decode(errors="replace").strip()
                os.close(fd)
                who = f"(pid {holder}) " if holder.isdigit() else ""
                raise DaemonStartError(f"another logcleaner daemon {who}cleans {log_dir}: stop it first") from None
            try:
                os.ftruncate(fd, 0)
                os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
            except OSError as exc:  # a full disk: the lock holds all the same; only the pid goes unnamed
                log.warning("cannot write the daemon's pid into %s: %s", path, exc.strerror)
            self._fds[log_dir] = fd

    def release(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()


class Daemon:
    """One cleaner service. `start()`, then `run()` until `request_stop()`; or use the CLI's `run`."""

    pool: CleanerPool  # made in start(); the throttle's sleep refers to it before

    def __init__(self, config_path: str | os.PathLike | None, *, server_properties=None, clock_ms=None) -> None:
        self.config_path = config_path
        self.server_properties = server_properties
        self.clock_ms = clock_ms or clock_from_environment()
        self.loaded = load_config(config_path, server_properties=server_properties)
        self.server = _server_settings(self.loaded)
        self.log_dirs = _check_log_dirs(self.loaded)
        self.daemon_locks = _DaemonLocks()
        self.daemon_locks.take(self.log_dirs)
        self.admin_token = _admin_token(self.server, self.loaded)  # read by the HTTP handler for each POST
        cleaner = self.loaded.settings.cleaner
        self.manager = CleanerManager(
            self.log_dirs, self.loaded.settings, clock_ms=self.clock_ms,
            uncleanable_retry_ms=self.server["uncleanable_retry_ms"],
            disk_full_retry_ms=self.server["disk_full_retry_ms"],
            probe_interval_ms=cleaner.backoff_ms,  # files are probed as often as Kafka's idle cleaner looks again
        )
        # One budget per device for every thread; a thread waiting for it wakes at once when the pool stops,
        # so a shutdown never waits out a long sleep.
        self.throttles = DeviceThrottles(
            cleaner.io_max_bytes_per_second, sleep=lambda seconds: self.pool.wait_stopping(seconds)
        )
        self.metrics = CleanerMetrics(self._metric_state)
        self.pool = CleanerPool(
            self.manager, self.throttles, self.metrics, threads=cleaner.threads, clock_ms=self.clock_ms
        )
        try:
            self.http = AdminServer(self, str(self.server["listen"]))
        except OSError as exc:
            self.daemon_locks.release()
            raise DaemonStartError(f"cannot listen on {self.server['listen']}: {exc.strerror or exc}") from None
        self._stop = threading.Event()
        self._reload = threading.Event()
        self._wake = threading.Event()  # set by every signal, so the main loop reacts at once
        self._signals = 0
        self.started_at_ms = self.clock_ms()

    # ---- state for metrics, health and status ---------------------------------------------------------

    def _metric_state(self) -> dict:
        now = self.clock_ms()
        last = self.manager.last_selection_ms
        snapshot = self.manager.snapshot()
        return {
            "max_compaction_delay_ms": self.manager.max_compaction_delay_ms,
            "dead_threads": self.pool.dead_threads,
            "threads_alive": self.pool.threads_alive,
            "max_dirty_percent": self.manager.max_dirty_percent,
            "time_since_last_run_s": 0.0 if last is None else max(0.0, (now - last) / 1000.0),
            "io_budget_bytes_per_second": self.throttles.bytes_per_second,
            "io_throttles": self._throttle_usage(),
            "log_dirs_offline": len(self.manager.offline_log_dirs),
            "uncleanable": {str(d): v for d, v in self.manager.uncleanable_by_log_dir().items()},
            "partitions": [(s.topic, s.partition, str(s.log_dir), s.dirty_ratio, s.cleanable_bytes) for s in snapshot],
            "delete_horizons": [(s.topic, s.partition, str(s.log_dir), s.next_delete_horizon_ms) for s in snapshot],
            "log_dirs": self._log_dir_usage(snapshot),
        }

    def _throttle_usage(self) -> dict[str, tuple[float, float, float]]:
        """device (major:minor) -> (bytes/s let through over the last seconds, that / the budget, seconds
        threads waited for the budget), for each device cleaned so far."""
        return {device_label(device): (t.recent_bytes_per_second(), t.utilization(), t.total_sleep_s)
                for device, t in self.throttles.by_device().items()}

    def _log_dir_usage(self, snapshot) -> dict[str, tuple[int, int, int]]:
        """log dir -> (bytes of its partitions at their last survey, free bytes, size of its filesystem)."""
        usage: dict[str, tuple[int, int, int]] = {}
        for log_dir in self.manager.log_dirs:
            logs = sum(s.total_bytes for s in snapshot if s.log_dir == log_dir)
            try:
                fs = os.statvfs(log_dir)
                free, size = fs.f_bavail * fs.f_frsize, fs.f_blocks * fs.f_frsize
            except OSError:
                free = size = 0
            usage[str(log_dir)] = (logs, free, size)
        return usage

    def health(self) -> dict:
        alive = self.pool.threads_alive
        wanted = self.pool.threads_wanted
        healthy = alive >= wanted and not self._stop.is_set()
        return {"healthy": healthy, "threads_alive": alive, "threads_wanted": wanted,
                "dead_threads": self.pool.dead_threads, "stopping": self._stop.is_set(),
                "log_dirs_offline": {str(k): v for k, v in self.manager.offline_log_dirs.items()}}

    def status(self) -> dict:
        return {
            "daemon": {
                "config": self.config_path and str(self.config_path),
                "log_dirs": [str(d) for d in self.log_dirs],
                "threads": self.pool.threads_wanted,
                "threads_alive": self.pool.threads_alive,
                # null: no budget (Kafka's default, Double.MaxValue)
                "io_budget_bytes_per_second": None if self.throttles.bytes_per_second >= UNLIMITED
                else self.throttles.bytes_per_second,
                "io_bytes_total": self.throttles.total_bytes,
                "io_throttles": {device: {"bytes_per_second": rate, "utilization": used, "wait_s_total": waited}
                                 for device, (rate, used, waited) in self._throttle_usage().items()},
                "started_at_ms": self.started_at_ms,
                "now_ms": self.clock_ms(),
            },
            "partitions": [s.as_dict() for s in sorted(self.manager.snapshot(), key=lambda s: str(s.directory))],
            "ignored": self.manager.ignored_entries(),
            "offline_log_dirs": {str(k): v for k, v in self.manager.offline_log_dirs.items()},
            "clusters": {str(k): v.describe() for k, v in self.manager.views.items()},
        }

    def partition_operation(self, name: str, operation: str) -> dict:
        directory = self.manager.find(name)
        if operation == "pause":
            self.manager.abort_and_pause(directory, timeout_s=30)
        elif operation == "resume":
            self.manager.resume(directory)
        elif operation == "trigger":
            self.manager.trigger(directory)
        else:
            raise StateError(f"unknown operation {operation}")
        status = next(s for s in self.manager.snapshot() if s.directory == directory)
        return {"partition": name, "operation": operation, "state": status.state.value, "pauses": status.pauses}

    # ---- lifecycle -----------------------------------------------------------------------------------

    def start(self) -> None:
        self.manager.discover()
        self.http.start()
        self.pool.start()
        host, port = self.http.address
        log.info("logcleaner started log_dirs=%s threads=%d listen=%s:%d", [str(d) for d in self.log_dirs],
                 self.pool.threads_wanted, host, port)
        if not is_loopback(host):
            log.warning("listening on %s:%d, which is not a loopback address: /metrics, /healthz and /status are open "
                        "to anyone who can reach it (state-changing requests still need the admin token)", host, port)
        if self.admin_token is None:
            log.info("admin operations disabled: no admin token ([server] admin_token_file or %s)", ADMIN_TOKEN_ENV)

    def install_signal_handlers(self) -> None:
        signal.signal(signal.SIGTERM, self._on_stop_signal)
        signal.signal(signal.SIGINT, self._on_stop_signal)
        signal.signal(signal.SIGHUP, self._on_reload_signal)

    def _on_reload_signal(self, signum, frame) -> None:
        self._reload.set()
        self._wake.set()

    def _on_stop_signal(self, signum, frame) -> None:
        self._signals += 1
        if self._signals > 1:
            os.write(2, b"logcleaner: second signal, exiting at once\n")
            os._exit(1)
        self._stop.set()
        self._wake.set()

    def request_stop(self) -> None:
        self._stop.set()
        self._wake.set()

    def run(self) -> int:
        """The main loop, until a stop is requested; returns the exit status."""
        interval_s = self.server["discovery_interval_ms"] / 1000.0
        while not self._stop.is_set():
            if self._reload.is_set():
                self._reload.clear()
                self.reload()
            try:
                self.manager.discover()
            except Exception:  # discovery is retried at the next tick
                log.exception("partition discovery failed")
            self.pool.supervise()
            self._wake.wait(interval_s)
            self._wake.clear()
        return self.shutdown()

    def reload(self) -> None:
        """Re-read the config (SIGHUP); keep running on the old one if the new one is invalid."""
        try:
            loaded = load_config(self.config_path, server_properties=self.server_properties)
            server = _server_settings(loaded)
            log_dirs = _check_log_dirs(loaded)
            admin_token = _admin_token(server, loaded)  # the token file is read again at every reload
            self.daemon_locks.take(log_dirs)
        except (CleanerError, OSError) as exc:  # an invalid file, a log dir another daemon holds, ...
            log.error("config reload rejected; keeping the running config: %s", exc)
            return
        cleaner = loaded.settings.cleaner
        self.loaded = loaded
        self.log_dirs = log_dirs
        self.admin_token = admin_token
        self.manager.reconfigure(loaded.settings, log_dirs)
        self.manager.uncleanable_retry_ms = server["uncleanable_retry_ms"]
        self.manager.disk_full_retry_ms = server["disk_full_retry_ms"]
        self.manager.probe_interval_ms = cleaner.backoff_ms
        self.throttles.set_rate(cleaner.io_max_bytes_per_second)
        self.pool.resize(cleaner.threads)
        if server["listen"] != self.server["listen"]:
            log.warning("[server] listen changed; it takes effect at the next restart")
        self.server.update({k: v for k, v in server.items() if k != "listen"})
        budget = cleaner.io_max_bytes_per_second
        log.info("config reloaded threads=%d io_budget=%s", cleaner.threads,
                 "unlimited" if budget >= UNLIMITED else f"{budget:.0f}B/s")

    def shutdown(self) -> int:
        log.info("logcleaner stopping: aborting running rounds")
        stopped = self.pool.stop(timeout_s=float(self.server["shutdown_timeout_s"]))
        self.http.stop()
        self.daemon_locks.release()
        if not stopped:
            log.error("cleaner threads did not stop in time; leftovers are recovered at the next start")
            return 1
        log.info("logcleaner stopped")
        return 0
