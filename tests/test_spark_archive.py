"""The Parquet archive job (sej/spark/archive.py, sej-archive: sej/apps/archive.py) on a real local Spark."""

from __future__ import annotations

import datetime as dt
import json
import os
import shutil
import signal
import subprocess
import sys
from collections import Counter

import pytest

import sej
from sej.errors import DataLossError, InvalidArgumentError, LockedError
from sej.hub import LocalSource, copy_all
from sej.lock import lock_file, unlock_file
from sej.offset import read_offset_file, write_offset_file
from sej.shard import find_journals
from sej.spark.archive import (
    FILE_RE,
    NULL_PARTITION,
    ArchiveError,
    archive,
    archive_schema,
    lock_path,
    plan_journal,
    stage,
    verify,
)
from sej.spark.plan import find_sources, split_name
from testing.timing import scaled

from .conftest import REPO, run_python

SCRIPT = "sej.apps.archive"  # sej-archive
T0 = 1_700_000_000_000_000_000
EPOCH = dt.datetime(1970, 1, 1)

Row = tuple  # (client, shard, offset, ts_us, type, key, value, date)


def utc_date(ts_us: int | None) -> dt.date | None:
    return None if ts_us is None else (EPOCH + dt.timedelta(microseconds=ts_us)).date()


def write_messages(root: str, start: int, n: int, segment_size: int = 2000) -> None:
    """Append n messages to a 4-shard root: timestamps 30 min apart (16 days per 800), some none, one pre-1970."""
    with sej.ShardedWriter(root, "p", shard_bit=2, segment_size=segment_size) as w:
        for i in range(start, start + n):
            ts = sej.NO_TIMESTAMP if i % 53 == 0 else (-1000 if i == 1 else T0 + i * 1_800_000_000_000)
            w.append(b"value-%d" % i, key=b"k%d" % (i % 29), type=i % 4, timestamp=ts)


def journal_rows(path: str, below: dict[str, int] | None = None) -> list[Row]:
    """What sej's Scanner reads under `path`, sorted; with `below`, only offsets under each journal's bound."""
    rows = []
    for j in find_journals(path):
        client, shard = split_name(j.name)
        shard = shard or os.path.basename(j.path)
        with sej.Scanner(j.path, "first", timeout=0) as s:
            for m in s:
                if below is not None and m.offset >= below[j.name]:
                    break
                ts = None if m.timestamp is None else m.timestamp // 1000
                rows.append((client, shard, m.offset, ts, m.type, m.key, m.value, utc_date(ts)))
    return sorted(rows, key=repr)


def archived_rows(spark, dest: str) -> list[Row]:  # type: ignore[no-untyped-def]
    """The archive read back with spark.read.parquet, sorted (duplicates kept)."""
    from pyspark.sql import functions as F

    df = spark.read.schema(archive_schema()).parquet(dest)
    cols = ["client", "shard", "offset", F.unix_micros("timestamp").alias("ts"), "type", "key", "value", "date"]
    rows = [(r[0], r[1], r[2], r[3], r[4], bytes(r[5]), bytes(r[6]), r[7]) for r in df.select(*cols).collect()]
    return sorted(rows, key=repr)


def sealed_ends(path: str) -> dict[str, int]:
    """Per journal: the first offset of its last segment (what an archive with no other reader reaches)."""
    return {j.name: sej.list_segments(j.path)[-1].first_offset for j in find_journals(path)}


def parquet_files(dest: str) -> dict[str, float]:
    out = {}
    for d, subdirs, files in os.walk(dest):
        subdirs[:] = [s for s in subdirs if not s.startswith(("_", "."))]
        for f in files:
            if f.endswith(".parquet"):
                out[os.path.join(d, f)] = os.stat(os.path.join(d, f)).st_mtime_ns
    return out


def archive_offset(journal: str) -> int | None:
    return read_offset_file(os.path.join(journal, "ofs", "archive.ofs"))


def test_sharded_root_and_hub_root_archive_equal_the_journal_rows_and_a_rerun_adds_nothing(spark, tmp_path) -> None:
    root, hub = str(tmp_path / "root"), str(tmp_path / "hub")
    write_messages(root, 0, 800)
    copy_all(lambda: LocalSource(root), hub, "edge-1", "hub")
    for path, client_dir in ((root, "client=" + NULL_PARTITION), (hub, "client=edge-1")):
        dest = str(tmp_path / ("archive-" + os.path.basename(path)))
        ends = sealed_ends(path)
        assert all(e > 0 for e in ends.values()), "every shard has sealed segments"
        report = archive(spark, path, dest)
        assert {j.name: (j.start, j.end) for j in report.journals} == {n: (0, e) for n, e in ends.items()}
        want = journal_rows(path, ends)
        got = archived_rows(spark, dest)
        assert got == want  # row for row, each exactly once, with date = the UTC date of the timestamp
        assert any(r[3] is None for r in got) and any(r[3] is not None and r[3] < 0 for r in got)
        assert len({r[7] for r in got}) > 5, "several date partitions"
        for j in find_journals(path):
            assert archive_offset(j.path) == ends[j.name]
        assert sorted(os.listdir(dest)) == [".archive.lck", client_dir]  # staging removed
        files = parquet_files(dest)
        assert files and all(FILE_RE.match(os.path.basename(f)) for f in files)
        assert any(f"{os.sep}date={NULL_PARTITION}{os.sep}" in f for f in files)  # messages without a timestamp
        rerun = archive(spark, path, dest)
        assert rerun.rows == 0 and all(j.start == j.end == ends[j.name] for j in rerun.journals)
        assert parquet_files(dest) == files
        assert archived_rows(spark, dest) == want


def test_new_segments_after_more_writes_are_archived_exactly_once(spark, tmp_path) -> None:
    root, dest = str(tmp_path / "root"), str(tmp_path / "archive")
    write_messages(root, 0, 400)
    first = sealed_ends(root)
    archive(spark, root, dest)
    write_messages(root, 400, 600)
    second = sealed_ends(root)
    assert all(second[n] > first[n] for n in first)
    report = archive(spark, root, dest)
    assert {j.name: (j.start, j.end) for j in report.journals} == {n: (first[n], second[n]) for n in first}
    assert all(len(j.files) > 0 and all(f"{first[j.name]:016x}-" in f for f in j.files) for j in report.journals)
    assert archived_rows(spark, dest) == journal_rows(root, second)


def test_a_slower_reader_holds_segments_back_and_the_last_segment_is_never_archived(spark, tmp_path) -> None:
    j, dest = str(tmp_path / "journal"), str(tmp_path / "archive")
    with sej.Writer(j, segment_size=1000) as w:
        for i in range(300):
            w.append(b"m%d" % i, timestamp=T0 + i)
    firsts = [s.first_offset for s in sej.list_segments(j)]
    assert len(firsts) >= 6 and sej.next_offset(j) > firsts[-1], "the last segment holds messages"
    slow_at = firsts[3] + 2  # inside segment 3: segments 0..2 are passed
    with sej.Offset(j, "slow") as o:
        o.commit(slow_at)
    open(os.path.join(j, "ofs", "fresh.ofs"), "wb").close()  # an empty offset file: nothing committed yet
    held = archive(spark, j, dest)
    assert held.rows == 0 and held.journals[0].readers_end == 0
    os.unlink(os.path.join(j, "ofs", "fresh.ofs"))
    report = archive(spark, j, dest)
    (r,) = report.journals
    assert (r.start, r.end, r.readers_end) == (0, firsts[3], slow_at)
    assert sorted(x[2] for x in archived_rows(spark, dest)) == list(range(firsts[3]))
    with sej.Offset(j, "slow") as o:
        o.commit(sej.next_offset(j))  # the slow reader catches up
    report = archive(spark, j, dest)
    assert (report.journals[0].start, report.journals[0].end) == (firsts[3], firsts[-1])
    got = archived_rows(spark, dest)
    assert got == journal_rows(j, {"": firsts[-1]})  # all but the last segment, once
    assert max(x[2] for x in got) == firsts[-1] - 1 < sej.next_offset(j) - 1
    assert archive(spark, j, dest).rows == 0  # the last segment stays until the writer rolls over


CHILD = r"""
import json, os, signal, sys
import sej.spark.archive as A
dest, reader, staged, where, nth = sys.argv[1:]
real, calls = getattr(A, where), [0]
def die_on_nth_call(*args, **kw):
    calls[0] += 1
    if calls[0] == int(nth):
        os.kill(os.getpid(), signal.SIGKILL)
    return real(*args, **kw)
setattr(A, where, die_on_nth_call)
for s in json.loads(staged):
    A.publish(dest, A.Staged(s[0], s[1], s[2], s[3], tuple(tuple(f) for f in s[4])), reader)
print("not killed")
"""


@pytest.mark.parametrize(
    "where, nth",
    [
        ("commit", 1),  # the first journal's files are published, its offset is not committed
        ("commit", 3),  # two journals committed, the third published but not committed
        ("_fsync_file", -1),  # in the middle of the second journal's file moves (nth set below)
    ],
)
def test_a_kill_between_publish_and_commit_then_a_rerun_gives_exactly_one_copy(spark, tmp_path, where, nth) -> None:
    root, dest = str(tmp_path / "root"), str(tmp_path / "archive")
    write_messages(root, 0, 800)
    ends = sealed_ends(root)
    plans = [plan_journal(s, "archive", register=True) for s in find_sources(root)]
    staging = os.path.join(dest, "_staging", "run")
    os.makedirs(os.path.dirname(staging))
    stage(spark, root, plans, staging)
    staged = verify(spark, plans, staging)
    order = [staged[p.path] for p in plans]
    if nth == -1:
        nth = len(order[0].files) + 2  # journal 0 done, one file of journal 1 moved, killed before the second
        assert len(order[1].files) >= 2
    p = run_python(CHILD, dest, "archive", json.dumps(order), where, str(nth))
    assert p.returncode == -signal.SIGKILL, p.stdout + p.stderr
    committed = {p.name: archive_offset(p.path) for p in plans}
    uncommitted = [n for n, v in committed.items() if v == 0]
    assert uncommitted, "the kill left journals uncommitted"
    left = [f for f in parquet_files(dest) if any(f"shard={n}{os.sep}" in f for n in uncommitted)]
    assert left, "the killed run left published files of an uncommitted journal"
    before = parquet_files(dest)
    report = archive(spark, root, dest)
    assert {j.name for j in report.journals if j.rows} == set(uncommitted)
    assert archived_rows(spark, dest) == journal_rows(root, ends)  # exactly one copy
    assert {j.name: archive_offset(j.path) for j in find_journals(root)} == ends
    after = parquet_files(dest)
    kept = {f: t for f, t in before.items() if not any(f"shard={n}{os.sep}" in f for n in uncommitted)}
    assert bool(kept) == (len(uncommitted) < len(plans))
    assert all(after.get(f) == t for f, t in kept.items())  # committed journals were not redone
    assert not os.path.exists(os.path.join(dest, "_staging"))


def test_verification_fails_on_a_duplicated_file_and_commits_nothing(spark, tmp_path) -> None:
    root, dest = str(tmp_path / "root"), str(tmp_path / "archive")
    write_messages(root, 0, 800)
    plans = [plan_journal(s, "archive", register=True) for s in find_sources(root)]
    assert all(p.rows for p in plans)
    staging = os.path.join(dest, "_staging", "run")
    os.makedirs(os.path.dirname(staging))
    stage(spark, root, plans, staging)
    victim = sorted(f for f in parquet_files(staging) if "shard=p.2.001" in f)[0]
    shutil.copy(victim, victim.replace("part-", "part-copy-"))
    with pytest.raises(ArchiveError, match=r"p\.2\.001: expected offsets 0 to") as e:
        verify(spark, plans, staging)
    assert "p.2.000" not in str(e.value)
    assert {archive_offset(p.path) for p in plans} == {0}
    assert not [f for f in parquet_files(dest) if "_staging" not in f]
    assert spark.read.schema(archive_schema()).parquet(dest).count() == 0  # readers do not see _staging
    report = archive(spark, root, dest)  # the next run clears the staging and archives once
    assert archived_rows(spark, dest) == journal_rows(root, {j.name: j.end for j in report.journals})


def test_library_errors_name_the_bad_value(spark, tmp_path) -> None:
    root, dest = str(tmp_path / "root"), str(tmp_path / "archive")
    with pytest.raises(InvalidArgumentError, match="nowhere"):
        archive(spark, str(tmp_path / "nowhere"), dest)
    os.makedirs(str(tmp_path / "empty"))
    with pytest.raises(InvalidArgumentError, match="holds no journal"):
        archive(spark, str(tmp_path / "empty"), dest)
    write_messages(root, 0, 300)
    with pytest.raises(InvalidArgumentError, match="must not be"):
        archive(spark, root, os.path.join(root, "archive"))
    with pytest.raises(InvalidArgumentError, match="'bad name'"):
        archive(spark, root, dest, reader="bad name")
    os.makedirs(dest)
    fh = lock_file(lock_path(dest))
    try:
        with pytest.raises(LockedError):
            archive(spark, root, dest)
    finally:
        unlock_file(fh)
    shard = os.path.join(root, "p.2.000")
    os.makedirs(os.path.join(shard, "ofs"), exist_ok=True)
    write_offset_file(os.path.join(shard, "ofs", "archive.ofs"), 0)
    assert len(sej.list_segments(shard)) >= 2
    os.unlink(sej.list_segments(shard)[0].path)  # deleted before the archive read it
    with pytest.raises(DataLossError, match=r"reader 'archive' is at offset 0"):
        archive(spark, root, dest)


def run_script(*args: str, timeout: float | None = None) -> subprocess.CompletedProcess[str]:
    """Run sej-archive (python -m sej.apps.archive, which starts a Spark); `timeout` defaults to scaled(300) s."""
    env = dict(os.environ, PYTHONPATH=str(REPO), SPARK_LOCAL_IP="127.0.0.1", PYSPARK_PYTHON=sys.executable)
    cmd = [sys.executable, "-m", SCRIPT, *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=scaled(300) if timeout is None else timeout,
                          env=env)  # fmt: skip


def test_the_script_archives_end_to_end_and_a_second_run_has_nothing_to_do(spark, tmp_path) -> None:
    root, dest = str(tmp_path / "root"), str(tmp_path / "archive")
    write_messages(root, 0, 800)
    ends = sealed_ends(root)
    dry = run_script(root, dest, "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert f"p.2.000: would archive offsets 0 to {ends['p.2.000'] - 1}: {ends['p.2.000']} rows" in dry.stdout
    assert not os.path.exists(dest) and archive_offset(os.path.join(root, "p.2.000")) is None
    p = run_script(root, dest, "--master", "local[2]")
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    for name, end in sorted(ends.items()):
        assert any(line.startswith(f"{name}: archived offsets 0 to {end - 1}: {end} rows in ") for line in lines)
    assert lines[-1] == f"archived {sum(ends.values())} rows of 4 journals into {dest}"
    assert archived_rows(spark, dest) == journal_rows(root, ends)
    again = run_script(root, dest)  # nothing to do: Spark is not even started
    assert again.returncode == 0 and again.stderr == ""
    assert f"p.2.000: nothing to archive from offset {ends['p.2.000']}" in again.stdout


def test_the_script_reports_bad_input_in_one_line_and_yields_to_a_running_archive(tmp_path) -> None:
    root, dest = str(tmp_path / "root"), str(tmp_path / "archive")
    write_messages(root, 0, 100)
    os.makedirs(str(tmp_path / "empty"))
    open(str(tmp_path / "file"), "w").close()
    for args, needle in [
        ((str(tmp_path / "nowhere"), dest), "nowhere is not a directory"),
        ((str(tmp_path / "empty"), dest), "holds no journal"),
        ((root, str(tmp_path / "file")), "exists and is not a directory"),
        ((root, os.path.join(root, "x")), "must not be"),
        ((root, dest, "--reader", "no/slash"), "'no/slash'"),
    ]:
        p = run_script(*args)
        assert p.returncode == 2, (args, p.stderr)
        assert p.stderr.count("\n") == 1 and p.stderr.startswith("sej-archive: error: ") and needle in p.stderr
        assert "Traceback" not in p.stderr and p.stdout == ""
    os.makedirs(dest)
    fh = lock_file(lock_path(dest))
    try:
        p = run_script(root, dest)
    finally:
        unlock_file(fh)
    assert p.returncode == 0 and p.stdout == ""
    assert p.stderr == f"sej-archive: another run holds the lock {lock_path(dest)}; nothing to do\n"
    assert Counter(os.listdir(dest)) == Counter([".archive.lck"])
    debug = run_script(str(tmp_path / "nowhere"), dest, "--debug")
    assert debug.returncode != 0 and "Traceback" in debug.stderr
