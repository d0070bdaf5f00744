"""The allocator settings of a cleaning process are accepted by this machine's C library."""

from __future__ import annotations

import platform
import subprocess
import sys

import pytest


@pytest.mark.skipif(platform.system() != "Linux" or platform.libc_ver()[0] != "glibc", reason="mallopt is glibc's")
def test_glibc_takes_every_setting():
    # In a child process: the settings are process-wide and must not leak into the test session.
    code = "from cleaner.allocator import tune_allocator; print(tune_allocator())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "True"
