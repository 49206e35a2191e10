"""Shared fixtures: temporary journals and helpers for real subprocesses."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from .sshd import Sshd

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


@pytest.fixture(scope="session")
def sshd() -> Iterator[Sshd]:
    """A real OpenSSH sshd on 127.0.0.1 (tests/sshd.py), one per test session (per xdist worker).

    Skipped where /usr/sbin/sshd cannot be used, unless the environment variable CI is set: then it fails,
    so that CI cannot silently skip the SSH tests (.ci/run installs openssh-server).
    """
    from .sshd import Sshd, SshdError, sshd_available

    in_ci = os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")
    missing = sshd_available()
    if missing is not None:
        if in_ci:
            pytest.fail(f"CI is set but sshd cannot be used: {missing}", pytrace=False)
        pytest.skip(f"no sshd for the SSH tests: {missing}")
    try:
        server = Sshd()
    except (SshdError, OSError, subprocess.SubprocessError) as e:
        if in_ci:
            pytest.fail(f"CI is set but sshd failed to start: {e}", pytrace=False)
        pytest.skip(f"sshd failed to start (set CI=1 to make this an error): {e}")
    with server:
        yield server


def run_with_stderr_on_a_terminal(
    args: list[str], timeout: float = 60
) -> tuple[subprocess.CompletedProcess[bytes], bytes]:
    """Run `python -m sej.apps.cli ARGS` with stderr on a pseudo-terminal; return the process and what it drew there."""
    import pty

    master, slave = pty.openpty()
    env = dict(os.environ, PYTHONPATH=str(REPO))
    try:
        p = subprocess.run([sys.executable, "-m", "sej.apps.cli", *args], stdout=subprocess.PIPE, stderr=slave,
                           env=env, timeout=timeout)  # fmt: skip
        os.close(slave)
        chunks = []
        for _ in range(100_000):
            try:
                data = os.read(master, 4096)
            except OSError:  # EIO: the other side of the terminal is closed
                break
            if not data:
                break
            chunks.append(data)
    finally:
        os.close(master)
    return p, b"".join(chunks)


IN_CI = os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


@pytest.fixture(scope="session")
def spark() -> Iterator[object]:
    """A real local Spark (local[2]) with the `sej` format, one per test session (per xdist worker).

    Fails rather than skips under CI when PySpark or Java is missing.
    """
    try:
        import pyarrow  # noqa: F401
        import pyspark  # noqa: F401
    except ImportError as e:
        if IN_CI:
            pytest.fail(f"CI is set but PySpark is missing: {e}", pytrace=False)
        pytest.skip(f"PySpark is not installed: {e}")
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        if IN_CI:
            pytest.fail("CI is set but Java is missing", pytrace=False)
        pytest.skip("Java is not installed")
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    from sej.spark import spark_session

    conf = {"spark.ui.enabled": "false", "spark.sql.shuffle.partitions": "2"}
    session = spark_session("sej-tests", "local[2]", **conf)
    yield session
    session.stop()
