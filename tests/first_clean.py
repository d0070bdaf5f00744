"""The first `logcleaner clean` after an install, observed once per test session.

A fresh installation has no kernels' module: its first clean builds one in a child process (about a minute,
`cleaner.kernel_cache`). The suite needs that module before its first test, and one test checks what that
first clean does. So that the suite pays for one build, not two, the session's own build is such a first
clean when the cache has nothing for these sources (always in CI, on a fresh clone): `observe` runs it and the
session keeps what it saw under `OBSERVED` for `tests/cleaner/test_kernel_cache.py`. Where the cache is already
filled (a second local run), the test observes a first clean of its own into an empty cache directory.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest

from segments.codec import compiled
from segments.tools.generate import WorkloadSpec, generate_partition

ROOT = Path(__file__).resolve().parents[1]
SMALL = WorkloadSpec(records=2000, keys=100, tombstone_fraction=0.1, segment_bytes=16 * 1024)


@dataclass(frozen=True)
class FirstClean:
    """A first clean: its cache directory, its environment and what the process returned."""

    cache: Path
    env: dict[str, str]
    done: subprocess.CompletedProcess


OBSERVED = pytest.StashKey[FirstClean]()


def first_run_env(cache: Path) -> dict[str, str]:
    """The environment of a first clean into `cache`: numba reports every save to and load from its cache."""
    env = dict(os.environ, NUMBA_CACHE_DIR=str(cache), NUMBA_DEBUG_CACHE="1")
    env.pop(compiled.MODE_ENV, None)
    return env


def observe(cache: Path, work: Path) -> FirstClean:
    """Run `logcleaner clean` once, as a user's first, on a small partition under `work`, with `cache` as the
    kernels' cache directory."""
    env = first_run_env(cache)
    partition = work / "first" / "t-0"
    generate_partition(partition, SMALL)
    done = subprocess.run([sys.executable, "-m", "cleaner.cli", "clean", str(partition), "--json"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    return FirstClean(cache, env, done)


def observe_if_first(config: pytest.Config) -> None:
    """At the session's start: when this installation has not built the kernels for these sources, in the
    mode a user gets by default, build them by a first clean and keep what it did under `OBSERVED`."""
    if os.environ.get(compiled.MODE_ENV):
        return  # a chosen mode is not a user's first run
    from cleaner import kernel_cache

    if kernel_cache._compiled_already(compiled.fingerprint()):
        return
    with tempfile.TemporaryDirectory(prefix="logcleaner-first-clean-") as work:
        config.stash[OBSERVED] = observe(compiled.cache_dir(), Path(work))
