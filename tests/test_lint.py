"""The code base stays lint-clean and type-checked (ruff and mypy settings: pyproject.toml)."""

from __future__ import annotations

import subprocess
import sys

from tests.paths import REPO_ROOT


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", *args], capture_output=True, text=True, cwd=REPO_ROOT, timeout=600
    )


def test_ruff():
    result = run("ruff", "check", ".")
    assert result.returncode == 0, result.stdout
    result = run("ruff", "format", "--check", ".")
    assert result.returncode == 0, result.stdout


def test_mypy():
    result = run("mypy")
    assert result.returncode == 0, result.stdout
