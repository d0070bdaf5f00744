"""The native settings of a cleaning process: glibc takes the allocator's; numpy starts no BLAS threads."""

from __future__ import annotations

import os
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


def _threads_after_numpy(call: bool, **env: str) -> tuple[str, int]:
    """(what limit_blas_threads returned or "-", the threads of a child process once numpy is imported)."""
    code = ("import os, sys\n"
            "from cleaner.allocator import limit_blas_threads\n"
            f"took = limit_blas_threads() if {call} else '-'\n"
            "import numpy\n"
            "print(took, len(os.listdir('/proc/self/task')))\n")
    environ = {k: v for k, v in os.environ.items() if k != "OPENBLAS_NUM_THREADS"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**environ, **env}).stdout.split()
    return out[0], int(out[1])


@pytest.mark.skipif(platform.system() != "Linux", reason="threads are counted in /proc")
def test_numpy_starts_no_blas_threads_in_a_cleaning_process():
    took, threads = _threads_after_numpy(True)
    assert (took, threads) == ("True", 1)
    # the user's own count is kept
    took, _ = _threads_after_numpy(True, OPENBLAS_NUM_THREADS="2")
    assert took == "False"
    if (os.cpu_count() or 1) > 1:  # without the call, OpenBLAS starts its threads: what the call prevents
        assert _threads_after_numpy(False)[1] > 1


def test_blas_threads_are_left_alone_once_numpy_is_loaded(monkeypatch):
    import numpy  # noqa: F401  (loaded: the variable would do nothing now)

    from cleaner.allocator import limit_blas_threads

    monkeypatch.delenv("OPENBLAS_NUM_THREADS", raising=False)
    assert limit_blas_threads() is False
    assert "OPENBLAS_NUM_THREADS" not in os.environ
