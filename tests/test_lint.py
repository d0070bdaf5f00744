"""The tree passes its linter (ruff) and its type checker (mypy), both configured in pyproject.toml, so the README's
one test command checks them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_ruff_finds_nothing():
    done = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "segments", "offsetmap", "cleaner",
                           "tests", "bench"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr


def test_mypy_finds_nothing():
    """mypy over the product packages (`[tool.mypy]` in pyproject.toml: segments, offsetmap, cleaner)."""
    done = subprocess.run([sys.executable, "-m", "mypy", "--no-incremental"], cwd=ROOT, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
