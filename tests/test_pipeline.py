"""The README's main job: producer -> hub -> Spark, in real processes (it starts its own Spark)."""

from __future__ import annotations

import os
import subprocess
import sys

import sej
from testing.timing import scaled

from .conftest import REPO


def run_pipeline(*args: str, timeout: float | None = None) -> subprocess.CompletedProcess[str]:
    """Run `python -m sej.apps.pipeline ARGS` (it starts a Spark of its own); `timeout` defaults to scaled(300) s."""
    env = dict(os.environ, SPARK_LOCAL_IP="127.0.0.1", PYSPARK_PYTHON=sys.executable)
    return subprocess.run(
        [sys.executable, "-m", "sej.apps.pipeline", *args],
        capture_output=True,
        text=True,
        timeout=scaled(300) if timeout is None else timeout,
        cwd=REPO,
        env=env,
    )


def test_main_job_local_transport(spark, tmp_path) -> None:  # the fixture: fail under CI without Spark/Java
    out = run_pipeline("--work", str(tmp_path), "--messages", "3000", "--segment-size", "16384")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "pipeline OK: 3000 messages produced, copied by the hub and read by Spark exactly once" in out.stdout
    assert "hub copied 3000 of 3000 messages" in out.stdout
    lines = [ln.split() for ln in out.stdout.splitlines() if ln.startswith("edge-1 ")]
    assert [ln[1] for ln in lines] == ["events.2.000", "events.2.001", "events.2.002", "events.2.003"]
    assert sum(int(ln[2]) for ln in lines) == 3000
    hub = tmp_path / "hub"
    for ln in lines:  # the summary's per-shard counts are the hub journals' real sizes
        assert sej.next_offset(str(hub / f"edge-1.{ln[1]}")) == int(ln[2])
    types = {ln.split()[1]: int(ln.split()[2]) for ln in out.stdout.splitlines() if ln[:2] in ("0 ", "1 ", "2 ")}
    assert types == {"reading": 2100, "alert": 600, "heartbeat": 300}
    # The hub committed its position on every producer journal.
    for j in sej.find_journals(str(tmp_path / "producer")):
        assert "hub" in sej.list_readers(j.path)


def test_main_job_over_ssh(spark, sshd, tmp_path) -> None:
    out = run_pipeline(
        "--work", str(tmp_path), "--messages", "1500",
        "--ssh", f"ssh://{sshd.user}@127.0.0.1:{sshd.port}",
        "--identity", str(sshd.identity), "--known-hosts", str(sshd.known_hosts),
    )  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"SFTP from {sshd.user}@127.0.0.1:{sshd.port}" in out.stdout
    assert "pipeline OK: 1500 messages" in out.stdout


def test_main_job_bad_input_is_one_error_line(tmp_path) -> None:
    out = run_pipeline("--work", str(tmp_path), "--ssh", "ftp://nope", timeout=scaled(60))
    assert out.returncode == 2
    assert out.stderr.strip().splitlines()[-1].startswith("sej-pipeline: error: --ssh must look like")
    assert "Traceback" not in out.stderr
