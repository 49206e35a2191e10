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
