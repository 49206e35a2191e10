"""The short production rehearsal (scripts/rehearsal.py, docs/rehearsal.md): the whole pipeline under faults."""

from __future__ import annotations

import os
import shutil

import pytest

from testing.rehearsal import report
from testing.rehearsal.run import Plan, Rehearsal
from testing.sshd import sshd_available

IN_CI = os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def test_a_short_rehearsal_loses_nothing_sticks_nowhere_and_deletes_nothing_early(tmp_path) -> None:
    missing = sshd_available() or (None if shutil.which("java") else "no java")
    if missing is not None:
        if IN_CI:
            pytest.fail(f"CI is set but the rehearsal cannot run: {missing}", pytrace=False)
        pytest.skip(f"the rehearsal needs sshd and Java: {missing}")
    plan = Plan(seed=37, duration=90.0, producers=2, prefixes=3, rate=20.0, hub_retention_every=15.0,
                hub_max_messages=300, spark_every=5.0, archive_every=30.0, check_every=45.0)  # fmt: skip
    result = Rehearsal(tmp_path, plan).run()
    md = report.write(result, tmp_path)
    assert result["problems"] == [], md.read_text()
    assert all(result["faults"].get(k, 0) >= 1 for k in ("producer_kill", "hub_kill", "sshd_outage", "cut",
                                                         "spark_kill")), result["faults"]  # fmt: skip
    assert result["acknowledged"] > 1000 and result["rows"] >= result["acknowledged"]
    assert result["deleted_segments"]["producer"] > 0 and result["deleted_segments"]["hub"] > 0, md.read_text()
    assert result["archive_runs"] >= 1 and len(result["checkpoints"]) >= 1
    assert result["append_to_hub"]["n"] > 0 and result["append_to_parquet"]["n"] == result["acknowledged"]


def test_an_ack_line_a_kill_tore_is_no_ack_and_does_not_spoil_the_next_incarnation_s(tmp_path) -> None:
    """A SIGKILL can cut a producer's write of its ack lines short (the kernel checks for it between pages): the
    restarted producer appends to the same log. Its first line must not be glued to the torn one (which named
    a message that is no ack, or broke the harness's parsing)."""
    import signal
    import subprocess
    import sys
    import time

    from testing.rehearsal.observe import Acks
    from testing.timing import scaled

    from .conftest import REPO

    acks = tmp_path / "acks"
    acks.mkdir()
    log = acks / "p0"
    log.write_bytes(b"p0-0.1.000 7 p0.0.8 1700000000.123456\np0-0.1.001 3 p0.0.9 17000")  # torn in its time
    env = dict(os.environ, PYTHONPATH=str(REPO))
    p = subprocess.Popen([sys.executable, "-m", "testing.rehearsal.producer", str(tmp_path / "root"), "p0", "1", "1",
                          str(time.time()), str(log), '{"rate": 200, "prefixes": 1}'], env=env)  # fmt: skip
    try:
        deadline = time.monotonic() + scaled(30)
        while log.read_bytes().count(b"\n") < 4 and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        p.send_signal(signal.SIGTERM)
        assert p.wait(scaled(30)) == 0
    a = Acks(str(acks))
    new = a.read()
    assert a.torn == 1 and "p0.0.9" not in a.acked and "p0.0.8" in a.acked
    assert len(new) >= 3 and all(mid.startswith("p0.1.") for _, _, mid, _ in new[1:]), new[:3]


def test_flatness_is_the_level_over_each_half_not_one_sample() -> None:
    """A sample taken in a busy pass is no growth; a level that rises is. (The 2-hour run at stop 45
    sat at 6 open files net of its journals in both halves, with one sample of 10 in the second: flagged by the old
    peak-to-peak comparison.)"""
    from testing.rehearsal.check import flat

    level = [{"t": t, "files_net": 6} for t in range(0, 1400)]
    assert flat(level, "files_net", 0.1) is None
    level[1000]["files_net"] = 10  # one transient sample in the second half
    assert flat(level, "files_net", 0.1) is None
    rising = [{"t": t, "files_net": 6 + (3 if t >= 700 else 0)} for t in range(0, 1400)]  # a leak of 3 descriptors
    grew = flat(rising, "files_net", 0.1)
    assert grew is not None and "6 in the first half, 9 in the second" in grew
    slow = [{"t": t, "rss_kib": 50_000 + 40 * t} for t in range(0, 1400)]  # RSS climbing all along: 37% higher
    assert flat(slow, "rss_kib", 0.25) is not None
