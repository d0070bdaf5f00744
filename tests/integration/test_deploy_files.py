"""deploy/ checked by the tools operators use: systemd-analyze, promtool (config, rules, rule unit tests), and
the Grafana dashboard against the metrics the daemon really exports; the example config loads."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from prometheus_client import generate_latest

from cleaner.config_file import load_config
from cleaner.daemon import _server_settings
from cleaner.metrics import CleanerMetrics
from cleaner.settings import BROKER_SETTINGS, TOPIC_SETTINGS

from .prometheus_helpers import PrometheusUnavailable, ensure_prometheus

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
UNIT = DEPLOY / "systemd" / "logcleaner.service"
DASHBOARD = DEPLOY / "grafana" / "logcleaner-dashboard.json"


def _promtool() -> str:
    try:
        return ensure_prometheus()[1]
    except PrometheusUnavailable as exc:
        pytest.skip(str(exc))


def _exported_samples() -> set[str]:
    """Every sample name a daemon's registry exports, with a state that fills every labelled gauge."""
    state = {
        "max_compaction_delay_ms": 0, "dead_threads": 0, "threads_alive": 1, "max_dirty_percent": 0.0,
        "time_since_last_run_s": 0.0, "io_budget_bytes_per_second": 1e6, "log_dirs_offline": 0,
        "uncleanable": {"/data": (0, 0)}, "partitions": [("t", 0, "/data", 0.1, 10)],
        "log_dirs": {"/data": (1, 2, 3)}, "io_throttles": {"8:1": (1e6, 0.5, 2.0)},
    }
    text = generate_latest(CleanerMetrics(lambda: state).registry).decode()
    return {line.split("{")[0].split(" ")[0] for line in text.splitlines() if line and not line.startswith("#")}


def _families(samples: set[str]) -> set[str]:
    return {re.sub(r"_(total|bucket|sum|count|created)$", "", s) for s in samples}


def test_unit_has_the_required_settings():
    text = UNIT.read_text()
    for needed in ("ExecStart=/opt/logcleaner/venv/bin/logcleaner run -c /etc/logcleaner/logcleaner.toml",
                   "User=logcleaner", "Restart=on-failure", "NoNewPrivileges=yes", "ProtectSystem=strict",
                   "ReadWritePaths=", "PrivateTmp=yes", "StandardOutput=journal", "ExecReload=/bin/kill -HUP $MAINPID"):
        assert needed in text, needed
    stop = int(re.search(r"^TimeoutStopSec=(\d+)$", text, re.M).group(1))
    assert stop > _server_settings(load_config(DEPLOY / "config" / "logcleaner.toml"))["shutdown_timeout_s"]
    assert "MemoryDenyWriteExecute=yes" not in text  # numba needs executable memory


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed")
def test_systemd_analyze_verifies_the_unit(tmp_path):
    # Verify a copy whose ExecStart names this checkout's installed binary (verify checks that it exists).
    binary = Path(sys.executable).with_name("logcleaner")
    unit = tmp_path / "logcleaner.service"
    unit.write_text(UNIT.read_text().replace("/opt/logcleaner/venv/bin/logcleaner", str(binary)))
    done = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True, text=True, timeout=120,
                          check=False)
    output = done.stdout + done.stderr
    assert done.returncode == 0 and "ignoring" not in output and "Unknown" not in output, output


def test_example_config_loads_and_shows_every_setting():
    text = (DEPLOY / "config" / "logcleaner.toml").read_text()
    loaded = load_config(DEPLOY / "config" / "logcleaner.toml")
    server = _server_settings(loaded)
    assert server["listen"] == "127.0.0.1:9464"
    for name in BROKER_SETTINGS:
        assert f'"{name}" =' in text, f"{name} is missing from the example config"
    for name in TOPIC_SETTINGS:
        assert f'"{name}"' in text, f"topic setting {name} is not mentioned"
    for name in server:
        assert f"{name} =" in text
    # every shown default is the real default
    for name, setting in BROKER_SETTINGS.items():
        value = loaded.settings.broker[name]
        if name != "log.dirs" and setting.default is not None:  # None: an alias or a name that is unset by default
            assert value == setting.default or (isinstance(value, tuple) and value == setting.default), name


def test_promtool_checks_the_scrape_config_and_the_rules():
    promtool = _promtool()
    for args in (["check", "config", str(DEPLOY / "prometheus" / "prometheus.yml")],
                 ["check", "rules", str(DEPLOY / "prometheus" / "logcleaner-alerts.yml")]):
        done = subprocess.run([promtool, *args], capture_output=True, text=True, timeout=120, check=False)
        assert done.returncode == 0, done.stdout + done.stderr


def test_alerts_fire_on_each_failure_and_stay_silent_when_healthy():
    promtool = _promtool()
    done = subprocess.run([promtool, "test", "rules", "logcleaner-alerts.test.yml"], cwd=DEPLOY / "prometheus",
                          capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0 and "SUCCESS" in done.stdout, done.stdout + done.stderr
    tests = (DEPLOY / "prometheus" / "logcleaner-alerts.test.yml").read_text()
    rules = (DEPLOY / "prometheus" / "logcleaner-alerts.yml").read_text()
    for alert in re.findall(r"- alert: (\w+)", rules):
        assert f"alertname: {alert}\n        exp_alerts:\n          - exp_labels" in tests, f"{alert} is never shown firing"
        assert f"alertname: {alert}\n        exp_alerts: []" in tests, f"{alert} is never shown silent"


def test_alert_rules_name_only_exported_metrics():
    exported = _exported_samples() | {"up"}
    rules = (DEPLOY / "prometheus" / "logcleaner-alerts.yml").read_text()
    for name in set(re.findall(r"\b(logcleaner_\w+|up)\b(?=[{\[ )]|$)", rules)):
        assert name in exported, name


def test_dashboard_queries_name_exported_metrics_and_show_every_metric():
    dashboard = json.loads(DASHBOARD.read_text())
    exported = _exported_samples()
    used = set()
    for panel in dashboard["panels"]:
        if panel["type"] == "row":
            continue
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            names = set(re.findall(r"\blogcleaner_\w+", target["expr"]))
            assert names, f"{panel['title']}: {target['expr']}"
            unknown = names - exported
            assert not unknown, f"{panel['title']} queries metrics the daemon does not export: {unknown}"
            used |= names
    assert _families(exported) <= _families(used), f"metrics without a panel: {_families(exported) - _families(used)}"
    assert {v["name"] for v in dashboard["templating"]["list"]} == {"datasource", "instance"}
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
