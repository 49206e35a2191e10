#!/usr/bin/env python3
"""The production rehearsal: the whole pipeline on this machine for a chosen time, with a seed (docs/rehearsal.md).

    python3 scripts/rehearsal.py --minutes 120 --seed 7 --dir /tmp/rehearsal

Producers, sej-hub over a real sshd, retention on both sides, a streaming query into Parquet and sej-archive run
together under faults; then the faults stop and every invariant is checked. Writes report.md, report.json and
resources.png into --dir; exits 1 when a check fails.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from testing.rehearsal import report  # noqa: E402
from testing.rehearsal.run import Plan, Rehearsal  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--minutes", type=float, default=5.0, help="time of traffic and faults (default 5)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--dir", help="where the run's files and report go (default: a new temporary directory)")
    p.add_argument("--producers", type=int, default=Plan.producers)
    p.add_argument("--prefixes", type=int, default=Plan.prefixes, help="per producer")
    p.add_argument("--shard-bit", type=int, default=Plan.shard_bit, help="2**shard_bit journals per prefix")
    p.add_argument("--rate", type=float, default=Plan.rate, help="messages per second per busy prefix")
    p.add_argument("--transport", choices=("sftp", "serve"), default=Plan.transport, help="the hub's (default sftp)")
    p.add_argument("--spark-every", type=float, default=Plan.spark_every)
    p.add_argument("--archive-every", type=float, default=Plan.archive_every)
    a = p.parse_args()
    workdir = a.dir or tempfile.mkdtemp(prefix="sej-rehearsal-")
    plan = Plan(seed=a.seed, duration=a.minutes * 60, producers=a.producers, prefixes=a.prefixes, rate=a.rate,
                shard_bit=a.shard_bit, transport=a.transport,
                spark_every=a.spark_every, archive_every=a.archive_every)  # fmt: skip
    result = Rehearsal(workdir, plan).run()
    md = report.write(result, workdir)
    print(md.read_text())
    print(f"files: {workdir}")
    return 1 if result["problems"] else 0


if __name__ == "__main__":
    sys.exit(main())
