"""The admin HTTP endpoint: loopback by default, and no state change without the configured token.

Real daemons (`logcleaner run` subprocesses) answer real HTTP requests. A request is judged by its status,
its headers and body, what it changed (a partition's state and pause count in `/status`) and what the daemon
logged about it (never a token).
"""

from __future__ import annotations

import json
import re
import shutil
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from click.testing import CliRunner

from cleaner.admin_http import parse_listen
from cleaner.cli import main as cli_main
from cleaner.config_file import load_config
from cleaner.daemon import _server_settings
from segments.tools.generate import WorkloadSpec, generate_partition

from ..integration.daemon_helpers import DaemonProcess, free_port, run_cli, wait_until, write_config, write_token_file

TOKEN = "s3cret-token-for-tests-0123456789"
OTHER_TOKEN = "another-token-that-is-not-it-987"
TIMEOUT_S = 30.0
UNIT = Path(__file__).resolve().parents[2] / "deploy" / "systemd" / "logcleaner.service"


class Env:
    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path
        self.log_dir = tmp_path / "logs"
        generate_partition(self.log_dir / "ops-0", WorkloadSpec(records=300, keys=30, segment_bytes=4096))
        self.token_file = write_token_file(tmp_path / "admin-token", TOKEN)
        self.port = free_port()
        self.config = tmp_path / "logcleaner.toml"
        self.daemons: list[DaemonProcess] = []

    def configure(self, **server) -> Path:
        # min.cleanable.dirty.ratio 1.0: nothing is ever eligible, so only admin requests change states
        return write_config(self.config, log_dirs=[self.log_dir], port=self.port,
                            settings={"min.cleanable.dirty.ratio": 1.0}, server=server)

    def start(self, *, token: str | None = None) -> DaemonProcess:
        daemon = DaemonProcess(self.config, self.port, self.tmp_path / f"daemon-{len(self.daemons)}.log",
                               admin_token=token)
        self.daemons.append(daemon)
        daemon.start()
        # the first retention pass holds the partition for a moment; the tests start from a resting state
        wait_until(lambda: daemon.partition("ops-0")["state"] != "in_progress", timeout_s=TIMEOUT_S,
                   what="the first retention pass over")
        return daemon

    def close(self) -> None:
        for daemon in self.daemons:
            daemon.close()
            print(f"--- {daemon.log_path} ---\n{daemon.log_text()[-3000:]}")


@pytest.fixture
def env(tmp_path, monkeypatch):
    monkeypatch.delenv("LOGCLEANER_ADMIN_TOKEN", raising=False)
    e = Env(tmp_path)
    try:
        yield e
    finally:
        e.close()


def post(daemon: DaemonProcess, path: str, headers: dict | None = None, method: str = "POST"):
    """(status, headers, JSON body or text) of a request that carries exactly `headers`."""
    request = urllib.request.Request(daemon.url + path, method=method, data=b"", headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.headers, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        body = exc.read()
        try:
            return exc.code, exc.headers, json.loads(body)
        except ValueError:
            return exc.code, exc.headers, body.decode(errors="replace")


def state(daemon: DaemonProcess) -> tuple[str, int]:
    p = daemon.partition("ops-0")
    return p["state"], p["pauses"]


def test_listen_defaults_to_loopback_and_a_wildcard_address_is_warned_about(env):
    assert _server_settings(load_config(None))["listen"] == "127.0.0.1:9464"
    assert parse_listen(":9464") == ("127.0.0.1", 9464)  # an empty host is loopback too
    env.configure(listen=f":{env.port}", admin_token_file=str(env.token_file))
    daemon = env.start(token=TOKEN)
    listening = [line.split() for line in Path("/proc/net/tcp").read_text().splitlines()[1:]]
    local = {fields[1] for fields in listening if fields[3] == "0A"}  # state 0A: LISTEN
    assert f"0100007F:{env.port:04X}" in local  # 127.0.0.1, as the kernel sees it
    assert f"00000000:{env.port:04X}" not in local
    assert "not a loopback address" not in daemon.log_text()
    daemon.close()

    env.port = free_port()
    env.configure(listen=f"0.0.0.0:{env.port}", admin_token_file=str(env.token_file))
    daemon = env.start(token=TOKEN)
    line = next(ln for ln in daemon.log_text().splitlines() if "not a loopback address" in ln)
    assert "WARNING" in line and f"0.0.0.0:{env.port}" in line


def test_state_changing_requests_need_the_token_and_reads_do_not(env):
    env.configure(admin_token_file=str(env.token_file))
    daemon = env.start(token=TOKEN)
    assert state(daemon) == ("idle", 0)

    refused = {
        "no header": {},
        "wrong token": {"Authorization": f"Bearer {OTHER_TOKEN}"},
        "token with a suffix": {"Authorization": f"Bearer {TOKEN}x"},
        "token prefix": {"Authorization": f"Bearer {TOKEN[:-1]}"},
        "basic scheme": {"Authorization": f"Basic {TOKEN}"},
        "bare token": {"Authorization": TOKEN},
        "empty bearer": {"Authorization": "Bearer "},
    }
    for what, headers in refused.items():
        for operation in ("pause", "trigger", "resume"):
            code, response_headers, body = post(daemon, f"/partitions/ops-0/{operation}", headers)
            assert code == 401, (what, operation, code, body)
            assert response_headers["WWW-Authenticate"].startswith("Bearer"), what
            assert "admin token" in body["error"]
    code, _, _ = post(daemon, "/partitions/nope-0/pause")  # checked before the path: no existence oracle
    assert code == 401
    for method in ("PUT", "DELETE", "PATCH"):
        assert post(daemon, "/partitions/ops-0/pause", {"Authorization": f"Bearer {TOKEN}"}, method)[0] == 501
    assert state(daemon) == ("idle", 0) and not daemon.partition("ops-0")["uncleanable"]
    assert daemon.partition("ops-0")["rounds"] == 0  # the refused triggers triggered nothing

    for path in ("/status", "/metrics", "/healthz"):  # reads stay open
        assert daemon.request("GET", path)[0] == 200, path

    code, _, body = post(daemon, "/partitions/ops-0/pause", {"Authorization": f"Bearer {TOKEN}"})
    assert (code, body["state"], body["pauses"]) == (200, "paused", 1)
    code, _, body = post(daemon, "/partitions/ops-0/resume", {"Authorization": f"bearer   {TOKEN} "})  # RFC 9110
    assert (code, body["state"]) == (200, "idle")

    log_text = daemon.log_text()
    refusals = [ln for ln in log_text.splitlines() if "admin request refused" in ln]
    assert len(refusals) == 3 * len(refused) + 1
    assert any("reason=wrong token" in ln and "path='/partitions/ops-0/pause'" in ln for ln in refusals)
    assert any("reason=no Authorization header" in ln for ln in refusals)
    assert TOKEN not in log_text and OTHER_TOKEN not in log_text and TOKEN[:-1] not in log_text


def test_without_any_token_state_changing_requests_get_403_saying_how_to_configure_one(env):
    env.configure()
    daemon = env.start()
    for headers in ({}, {"Authorization": f"Bearer {TOKEN}"}):
        code, _, body = post(daemon, "/partitions/ops-0/pause", headers)
        assert code == 403
        assert "admin_token_file" in body["error"] and "LOGCLEANER_ADMIN_TOKEN" in body["error"]
    assert state(daemon) == ("idle", 0)
    assert "admin operations disabled" in daemon.log_text()
    assert daemon.request("GET", "/status")[0] == 200


def test_admin_cli_takes_the_token_from_a_file_the_environment_or_the_daemons_config(env, monkeypatch):
    env.configure(admin_token_file=str(env.token_file))
    daemon = env.start(token=TOKEN)
    url = ["--url", daemon.url]

    def cli(*args: str, env_token: str | None = None):
        environ = {"LOGCLEANER_ADMIN_TOKEN": env_token} if env_token else {}
        return CliRunner(env=environ).invoke(cli_main, ["admin", *args])

    without = cli("pause", "ops-0", *url)
    assert without.exit_code == 1 and "401" in without.stderr and "admin token" in without.stderr
    wrong_file = write_token_file(env.tmp_path / "wrong-token", OTHER_TOKEN)
    assert cli("pause", "ops-0", *url, "--token-file", str(wrong_file)).exit_code == 1
    assert state(daemon) == ("idle", 0)

    done = cli("pause", "ops-0", *url, "--token-file", str(env.token_file))
    assert done.exit_code == 0 and done.stdout.strip() == "ops-0: pause -> paused (pauses 1)", done.output
    done = cli("pause", "ops-0", *url, env_token=TOKEN)
    assert done.exit_code == 0 and "(pauses 2)" in done.stdout, done.output
    done = cli("resume", "ops-0", "-c", str(env.config))  # the URL from [server] listen, the token from its file
    assert done.exit_code == 0 and "(pauses 1)" in done.stdout, done.output
    status = CliRunner().invoke(cli_main, ["status", "-c", str(env.config)])
    assert status.exit_code == 0 and re.search(r"^ops-0\s+paused\s", status.stdout, re.M), status.output

    short = write_token_file(env.tmp_path / "short-token", "short")
    bad = cli("resume", "ops-0", *url, "--token-file", str(short))
    assert bad.exit_code == 1 and str(short) in bad.stderr and "16 to 4096" in bad.stderr
    assert state(daemon) == ("paused", 1)


def test_token_from_the_environment_when_no_file_is_configured(env, monkeypatch):
    env.configure()
    monkeypatch.setenv("LOGCLEANER_ADMIN_TOKEN", TOKEN)  # the daemon's environment (DaemonProcess copies it)
    daemon = env.start(token=TOKEN)
    assert daemon.operate("ops-0", "pause")[0] == 200
    assert post(daemon, "/partitions/ops-0/resume", {"Authorization": f"Bearer {OTHER_TOKEN}"})[0] == 401
    assert state(daemon) == ("paused", 1)


def test_sighup_reads_the_token_file_again(env):
    env.configure(admin_token_file=str(env.token_file))
    daemon = env.start(token=TOKEN)
    assert daemon.operate("ops-0", "pause")[0] == 200
    write_token_file(env.token_file, OTHER_TOKEN)
    daemon.send(signal.SIGHUP)
    wait_until(lambda: "config reloaded" in daemon.log_text(), timeout_s=TIMEOUT_S, what="the reload")
    assert post(daemon, "/partitions/ops-0/resume", {"Authorization": f"Bearer {TOKEN}"})[0] == 401
    assert post(daemon, "/partitions/ops-0/resume", {"Authorization": f"Bearer {OTHER_TOKEN}"})[0] == 200
    assert state(daemon) == ("idle", 0)

    write_token_file(env.token_file, "too-short")  # an invalid file is rejected; the running token stays
    daemon.send(signal.SIGHUP)
    line = wait_until(lambda: next((ln for ln in daemon.log_text().splitlines() if "config reload rejected" in ln),
                                   None), timeout_s=TIMEOUT_S, what="the rejected reload")
    assert str(env.token_file) in line and "too-short" not in line
    assert post(daemon, "/partitions/ops-0/pause", {"Authorization": f"Bearer {OTHER_TOKEN}"})[0] == 200


@pytest.mark.parametrize("content, expected", [
    (None, "cannot read the admin token file"),
    ("", "the admin token is empty"),
    ("tiny", "has 4 characters; it needs 16 to 4096"),
    ("with a space inside it 0123456789", "visible ASCII characters without spaces"),
], ids=["missing", "empty", "short", "spaces"])
def test_an_unusable_token_file_stops_the_start_naming_the_file_and_never_the_token(env, content, expected):
    token_file = env.tmp_path / "bad-token"
    if content is not None:
        token_file.write_text(content + "\n")
    env.configure(admin_token_file=str(token_file))
    done = run_cli("run", "-c", str(env.config), timeout_s=30)
    assert done.returncode == 2, done.stderr
    assert str(token_file) in done.stderr and expected in done.stderr, done.stderr
    if content:
        assert content not in done.stderr


def test_a_loosely_readable_token_file_is_warned_about(env):
    env.token_file.chmod(0o644)
    env.configure(admin_token_file="admin-token")  # relative: next to the config file
    daemon = env.start(token=TOKEN)
    assert daemon.operate("ops-0", "pause")[0] == 200
    assert any("WARNING" in ln and "mode 0644" in ln and str(env.token_file) in ln
               for ln in daemon.log_text().splitlines())


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed")
def test_the_unit_with_its_credential_line_enabled_passes_systemd_analyze(tmp_path):
    text = UNIT.read_text()
    assert "#LoadCredential=admin-token:/etc/logcleaner/admin-token" in text
    binary = Path(sys.executable).with_name("logcleaner")
    unit = tmp_path / "logcleaner.service"
    unit.write_text(text.replace("#LoadCredential=", "LoadCredential=")
                    .replace("/opt/logcleaner/venv/bin/logcleaner", str(binary)))
    done = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True, text=True, timeout=120,
                          check=False)
    output = done.stdout + done.stderr
    assert done.returncode == 0 and "ignoring" not in output and "Unknown" not in output, output
