"""Shared fixtures: temporary journals and helpers for real subprocesses."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture
def jdir(tmp_path: Path) -> str:
    """A path for a journal directory (not created)."""
    return str(tmp_path / "journal")


def run_python(code: str, *args: str, timeout: float = 60, **kw: object) -> subprocess.CompletedProcess[str]:
    """Run `code` in a fresh interpreter with the repository importable."""
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=timeout, env=env, **kw
    )


def popen_python(code: str, *args: str, **kw: object) -> subprocess.Popen[str]:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.Popen([sys.executable, "-c", code, *args], text=True, env=env, **kw)
