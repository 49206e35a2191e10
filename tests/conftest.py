"""Shared fixtures: temporary journals and helpers for real subprocesses."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from testing.timing import scaled

if TYPE_CHECKING:
    from testing.sshd import Sshd

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture
def jdir(tmp_path: Path) -> str:
    """A path for a journal directory (not created)."""
    return str(tmp_path / "journal")


def soak_rounds() -> int | None:
    """SEJ_SOAK_ROUNDS, when set: the kill-round tests run that many rounds, bounded by count only.

    Unset (CI): each such test runs its own small number of rounds within a time budget.
    See scripts/soak.sh.
    """
    value = os.environ.get("SEJ_SOAK_ROUNDS", "").strip()
    return max(1, int(value)) if value else None


def keep_failed_state(label: str, *paths: str) -> str:
    """Copy `paths` (journals, hub roots) aside after a failed round; return where they went.

    To $SEJ_SOAK_KEEP, or <tmp>/sej-soak-failures: pytest's own tmp_path is deleted after a few runs.
    """
    import re as _re
    import time as _time

    base = os.environ.get("SEJ_SOAK_KEEP") or os.path.join(tempfile.gettempdir(), "sej-soak-failures")
    dest = os.path.join(base, f"{_re.sub(r'[^A-Za-z0-9_.-]+', '_', label)}-{_time.time_ns()}")
    for p in paths:
        if os.path.exists(p):
            shutil.copytree(p, os.path.join(dest, os.path.basename(p.rstrip("/"))), symlinks=True,
                            ignore_dangling_symlinks=True, dirs_exist_ok=True)  # fmt: skip
    return dest


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):  # type: ignore[no-untyped-def]
    """Remember each phase's report on the item, so that fixtures can see whether the test failed."""
    rep = yield
    setattr(item, "rep_" + rep.when, rep)
    return rep


@pytest.fixture
def keep_on_failure(request: pytest.FixtureRequest) -> Iterator[Callable[[str], None]]:
    """Call it with directories (a journal, a hub root): if the test fails they are copied aside."""
    paths: list[str] = []
    yield paths.append
    rep = getattr(request.node, "rep_call", None)
    if rep is not None and rep.failed and paths:
        dest = keep_failed_state(request.node.name, *paths)
        print(f"the failing state is kept in {dest}")
        rep.sections.append(("failing state", f"kept in {dest}"))


def run_python(code: str, *args: str, timeout: float | None = None, **kw: object) -> subprocess.CompletedProcess[str]:
    """Run `code` in a fresh interpreter with the repository importable (`timeout`: default scaled(60) s)."""
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True,
        timeout=scaled(60) if timeout is None else timeout, env=env, **kw,
    )  # fmt: skip


def popen_python(code: str, *args: str, **kw: object) -> subprocess.Popen[str]:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.Popen([sys.executable, "-c", code, *args], text=True, env=env, **kw)


@pytest.fixture(scope="session")
def sshd() -> Iterator[Sshd]:
    """A real OpenSSH sshd on 127.0.0.1 (testing/sshd.py), one per test session (per xdist worker).

    Skipped where /usr/sbin/sshd cannot be used, unless the environment variable CI is set: then it fails,
    so that CI cannot silently skip the SSH tests (.ci/run installs openssh-server).
    """
    from testing.sshd import Sshd, SshdError, sshd_available

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
    args: list[str], timeout: float | None = None
) -> tuple[subprocess.CompletedProcess[bytes], bytes]:
    """Run `python -m sej.apps.cli ARGS` with stderr on a pseudo-terminal; return the process and what it drew there."""
    import pty

    master, slave = pty.openpty()
    env = dict(os.environ, PYTHONPATH=str(REPO))
    try:
        p = subprocess.run([sys.executable, "-m", "sej.apps.cli", *args], stdout=subprocess.PIPE, stderr=slave,
                           env=env, timeout=scaled(60) if timeout is None else timeout)  # fmt: skip
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


@pytest.fixture(autouse=True, scope="session")
def _cache_home(tmp_path_factory: pytest.TempPathFactory) -> None:
    """`sej copy` caches what a run learned in $XDG_CACHE_HOME: the tests' own, not the user's."""
    os.environ["XDG_CACHE_HOME"] = str(tmp_path_factory.mktemp("cache"))


IN_CI = os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


@pytest.fixture(scope="session")
def promtool() -> str:
    """Prometheus's promtool (Debian's `prometheus` package), for the hub's alerting rules.

    Skipped where it is missing, unless CI is set: then it fails (.ci/run installs the package).
    """
    path = shutil.which("promtool")
    if path is None:
        if IN_CI:
            pytest.fail("CI is set but promtool is missing (apt-get install prometheus)", pytrace=False)
        pytest.skip("promtool is not installed (apt-get install prometheus)")
    return path


STREAMING_SOURCE_RUNNER = "pyspark.sql.streaming.python_streaming_source_runner"


def spark_python(directory: Path) -> str:
    """An executable for PYSPARK_PYTHON: this interpreter, with tests/spark_worker.py for streaming sources.

    The streaming source's worker must connect back to Spark within a fixed 10 s (see tests/spark_worker.py);
    every other worker (the daemons, the batch planners, the tasks) is started exactly as by the interpreter.
    """
    import shlex

    python, helper = shlex.quote(sys.executable), shlex.quote(str(REPO / "tests" / "spark_worker.py"))
    path = directory / "python"
    path.write_text(
        "#!/bin/sh\n"
        "# PYSPARK_PYTHON for the tests (tests/conftest.py, tests/spark_worker.py)\n"
        f'if [ "$1" = "-m" ] && [ "$2" = "{STREAMING_SOURCE_RUNNER}" ]; then\n'
        f'    exec {python} {helper} "$@"\n'
        "fi\n"
        f'exec {python} "$@"\n'
    )
    path.chmod(0o755)
    return str(path)


def spark_timeouts() -> dict[str, str]:
    """Spark's own timeouts that a loaded machine can exceed, made generous (scaled like the tests' deadlines).

    Spark's waits are event-driven too, so a long timeout costs nothing when things work. The Python worker's
    connection back to the JVM: spark.python.authenticate.socketTimeout (default 15 s; it is also the worker's
    connect timeout, SPARK_AUTH_SOCKET_TIMEOUT). The streaming source's worker has a fixed 10 s besides, which
    no setting changes: see spark_python(). The driver and its local executor: spark.network.timeout (default
    120 s; the RPC ask and lookup timeouts and the heartbeat expiry follow it) and the broadcast timeout.
    """
    seconds = {
        "spark.python.authenticate.socketTimeout": scaled(15),
        "spark.network.timeout": scaled(120),
        "spark.sql.broadcastTimeout": scaled(300),
    }
    return {k: f"{int(v)}s" for k, v in seconds.items()}


@pytest.fixture(scope="session")
def spark(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
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
    os.environ["PYSPARK_PYTHON"] = spark_python(tmp_path_factory.mktemp("spark-python"))
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    from sej.spark import spark_session

    conf = {"spark.ui.enabled": "false", "spark.sql.shuffle.partitions": "2", **spark_timeouts()}
    session = spark_session("sej-tests", "local[2]", **conf)
    yield session
    session.stop()
