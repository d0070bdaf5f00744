"""A real Spark standalone cluster for tests and benchmarks, started from the pyspark installation itself.

`standalone_cluster(directory, workers=2)` starts `spark-class org.apache.spark.deploy.master.Master` and
`...deploy.worker.Worker` processes (one core and a memory limit each), all bound to 127.0.0.1 on ports
that were free, waits until every worker has registered with the master (its web UI's `/json/`), and on
leaving stops every process they started: each daemon runs in a session of its own (`setsid`), and the
executors a worker launches and their Python daemon and workers (which make a process group of their own,
but stay in the session) are found by session id, so even an orphaned executor is stopped.

`kill(name)` is the machine loss of the tests: SIGKILL to every process of a worker's session at once, the
worker, its executor JVM and the executor's Python workers. `open_files_of(name)` lists the files the
processes of a session hold open (`/proc/<pid>/fd`), which is how a test sees a task in the middle of a round.

Usage (bench/spark_clean.py reuses it):

    with standalone_cluster(tmp_path / "cluster", workers=2) as cluster:
        run(["logcleaner", "clean", "--spark", "--master", cluster.master_url, ...], env=cluster.client_env())
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

START_TIMEOUT_S = 90.0
STOP_TIMEOUT_S = 10.0
POLL_S = 0.2


def free_port() -> int:
    """A TCP port that was free a moment ago on 127.0.0.1."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spark_home() -> Path:
    """The pyspark package directory: it holds `bin/spark-class` and the jars."""
    import pyspark

    return Path(pyspark.__file__).resolve().parent


def _stat_fields(pid: int) -> list[str] | None:
    """The fields of /proc/<pid>/stat after the command name (state, ppid, pgrp, session, ...); None if gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text[text.rfind(")") + 2:].split()


def session_pids(session: int) -> list[int]:
    """Every live process whose session id is `session`."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (fields := _stat_fields(int(entry))) is not None and fields[0] != "Z" \
                and int(fields[3]) == session:
            found.append(int(entry))
    return found


def kill_session(session: int, sig: int = signal.SIGKILL) -> list[int]:
    """Send `sig` to every process of `session`; the pids it was sent to."""
    pids = session_pids(session)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)
    return pids


@dataclass
class StandaloneCluster:
    """A running master and its workers; `processes` by name: "master", "worker-0", "worker-1", ..."""

    directory: Path
    master_url: str
    web_url: str
    env: dict[str, str]
    processes: dict[str, subprocess.Popen] = field(default_factory=dict)

    def client_env(self) -> dict[str, str]:
        """The environment for a driver (`logcleaner clean --spark`) submitting to this cluster."""
        return dict(self.env)

    def state(self) -> dict:
        """The master's view: its web UI's /json/ (workers, their state, cores, memory, running apps)."""
        with urllib.request.urlopen(self.web_url + "/json/", timeout=5) as response:
            return json.loads(response.read())

    def alive_workers(self) -> int:
        try:
            return sum(1 for w in self.state().get("workers", []) if w.get("state") == "ALIVE")
        except (OSError, ValueError):  # not listening yet, or its web UI not yet serving the JSON
            return 0

    def pids_of(self, name: str) -> list[int]:
        """The processes of daemon `name`'s session: for a worker, its executors and their Python workers too."""
        return session_pids(self.processes[name].pid)

    def open_files_of(self, name: str) -> list[str]:
        """The paths the processes of daemon `name`'s session hold open."""
        paths = []
        for pid in self.pids_of(name):
            with contextlib.suppress(OSError):
                for fd in os.listdir(f"/proc/{pid}/fd"):
                    with contextlib.suppress(OSError):
                        paths.append(os.readlink(f"/proc/{pid}/fd/{fd}"))
        return paths

    def kill(self, name: str) -> list[int]:
        """SIGKILL every process of daemon `name`'s session at once (a lost machine); the pids killed."""
        pids = kill_session(self.processes[name].pid)
        self.processes[name].wait(timeout=STOP_TIMEOUT_S)
        return pids

    def log_tail(self, name: str, lines: int = 30) -> str:
        path = self.directory / f"{name}.log"
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) if path.exists() else ""

    def wait_ready(self, timeout_s: float = START_TIMEOUT_S) -> None:
        """Wait until every worker started has registered with the master; RuntimeError naming a daemon that
        exited, or after `timeout_s`, with the end of its log."""
        workers = sum(1 for name in self.processes if name.startswith("worker-"))
        deadline = time.monotonic() + timeout_s
        while self.alive_workers() < workers:
            dead = [name for name, p in self.processes.items() if p.poll() is not None]
            if dead or time.monotonic() > deadline:
                why = f"{dead[0]} exited" if dead else f"{workers} workers not registered after {timeout_s:.0f} s"
                name = dead[0] if dead else "master"
                raise RuntimeError(f"the Spark cluster did not start: {why}; its log ends:\n{self.log_tail(name)}")
            time.sleep(POLL_S)

    def stop(self) -> None:
        """Stop every process every daemon started: SIGTERM to each session, then SIGKILL to what is left."""
        sessions = [p.pid for p in self.processes.values()]
        for session in sessions:
            kill_session(session, signal.SIGTERM)
        deadline = time.monotonic() + STOP_TIMEOUT_S
        while time.monotonic() < deadline and any(session_pids(s) for s in sessions):
            time.sleep(POLL_S)
        for session in sessions:
            kill_session(session, signal.SIGKILL)
        for process in self.processes.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=STOP_TIMEOUT_S)


def _spawn(cluster: StandaloneCluster, name: str, args: list[str]) -> None:
    log = open(cluster.directory / f"{name}.log", "wb")
    try:
        cluster.processes[name] = subprocess.Popen(
            [str(spark_home() / "bin" / "spark-class"), *args], env=cluster.env, stdout=log,
            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True, cwd=cluster.directory)
    finally:
        log.close()


@contextlib.contextmanager
def standalone_cluster(directory: Path, *, workers: int = 2, cores: int = 1, memory: str = "1g",
                       timeout_s: float = START_TIMEOUT_S, wait: bool = True) -> Iterator[StandaloneCluster]:
    """A master and `workers` workers of `cores` cores and `memory` each on 127.0.0.1, running until the block
    ends; their logs and work directories under `directory`. With `wait` the block starts once every worker
    has registered; without, the caller does other work while the JVMs start and then calls `wait_ready`.
    Every process is stopped on leaving, also when starting failed."""
    directory.mkdir(parents=True, exist_ok=True)
    conf_dir = directory / "conf"  # empty: no spark-defaults.conf or spark-env.sh of anyone's
    conf_dir.mkdir(exist_ok=True)
    port, web_port = free_port(), free_port()
    env = {**os.environ, "SPARK_HOME": str(spark_home()), "SPARK_CONF_DIR": str(conf_dir),
           "SPARK_LOCAL_IP": "127.0.0.1", "SPARK_LOCAL_HOSTNAME": "127.0.0.1", "PYSPARK_PYTHON": sys.executable,
           "PYSPARK_DRIVER_PYTHON": sys.executable, "SPARK_DAEMON_MEMORY": "256m"}
    env.pop("PYSPARK_GATEWAY_PORT", None)
    env.pop("PYSPARK_GATEWAY_SECRET", None)
    cluster = StandaloneCluster(directory, f"spark://127.0.0.1:{port}", f"http://127.0.0.1:{web_port}", env)
    try:
        _spawn(cluster, "master", ["org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port",
                                   str(port), "--webui-port", str(web_port)])
        for k in range(workers):
            work = directory / f"worker-{k}-work"
            work.mkdir(exist_ok=True)
            _spawn(cluster, f"worker-{k}", [
                "org.apache.spark.deploy.worker.Worker", "--cores", str(cores), "--memory", memory, "--host",
                "127.0.0.1", "--port", str(free_port()), "--webui-port", str(free_port()), "--work-dir", str(work),
                cluster.master_url])
        if wait:
            cluster.wait_ready(timeout_s)
        yield cluster
    finally:
        cluster.stop()
