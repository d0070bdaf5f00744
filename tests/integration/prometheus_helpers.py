"""Prometheus for the tests: found on PATH, or installed from Debian's packages, else a reason to skip.

`ensure_prometheus()` returns the paths of `prometheus` and `promtool`. When they are missing it runs
`apt-get install prometheus` (as root, or through `sudo -n`), once per test session, with `apt-get update` only
if the first attempt fails; a machine where that cannot work gets a `PrometheusUnavailable` with the reason,
which the tests turn into a skip that says so.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess

__all__ = ["PrometheusUnavailable", "ensure_prometheus"]

_INSTALL_TIMEOUT_S = 600


class PrometheusUnavailable(RuntimeError):
    pass


def _found() -> tuple[str, str] | None:
    prometheus, promtool = shutil.which("prometheus"), shutil.which("promtool")
    return (prometheus, promtool) if prometheus and promtool else None


@functools.cache
def ensure_prometheus() -> tuple[str, str]:
    found = _found()
    if found:
        return found
    if shutil.which("apt-get") is None:
        raise PrometheusUnavailable("prometheus is not installed and there is no apt-get to install it")
    prefix: list[str] = []
    if os.geteuid() != 0:
        if shutil.which("sudo") is None:
            raise PrometheusUnavailable("prometheus is not installed; installing it needs root or sudo")
        prefix = ["sudo", "-n"]
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    install = [*prefix, "apt-get", "install", "-y", "-q", "--no-install-recommends", "prometheus"]
    errors = []
    for attempt in ([install], [[*prefix, "apt-get", "update", "-q"], install]):
        for command in attempt:
            done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=_INSTALL_TIMEOUT_S, check=False)
            if done.returncode != 0:
                errors.append(f"{' '.join(command)}: exit {done.returncode}: {done.stderr.strip()[-300:]}")
                break
        found = _found()
        if found:
            return found
    raise PrometheusUnavailable("prometheus could not be installed from Debian's packages: " + " | ".join(errors))
