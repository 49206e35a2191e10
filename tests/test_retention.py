"""Retention (sej/retention.py, sej-retention: sej/apps/retention.py) on real journals, with real processes.

The acceptance test of the issue is the first group: retention never deletes a
segment some reader (or a required reader, such as the archive job) has not fully
passed, and never the last segment. Then: each limit picks exactly the right
prefix, dry runs, the lock against overlapping runs, a writer appending during
retention, SIGKILLed runs, malformed offset files and bad command-line input.
"""

from __future__ import annotations

import importlib
import os
import random
import select
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any, Literal

import pytest

import sej
from sej.layout import index_name, index_path, segment_path, sum_name, sum_path
from sej.lock import unlock_file
from sej.offset import write_offset_file
from sej.retention import LOCK_NAME, apply_retention, lock_retention, plan_retention
from testing.timing import scaled

from .conftest import REPO, popen_python

SCRIPT = "sej.apps.retention"  # sej-retention
NS = 10**9
T0 = 1_712_345_678_000_000_000  # message i of `build` has timestamp T0 + i seconds
FRAME = 100  # 26 bytes of frame + a 74-byte value
PER_SEGMENT = 3
N = 30  # `build` makes segments 0, 3, ..., 27 (3 messages each) and the empty last segment 30


def build(jdir: str, n: int = N, per_segment: int = PER_SEGMENT, ts: Any = None) -> list[int]:
    """A journal of `n` 100-byte messages, `per_segment` to a segment; returns the segments' first offsets."""
    with sej.Writer(jdir, segment_size=FRAME * per_segment) as w:
        for i in range(n):
            w.append(b"%074d" % i, timestamp=T0 + i * NS if ts is None else ts(i))
    return firsts(jdir)


def firsts(jdir: str) -> list[int]:
    return [s.first_offset for s in sej.list_segments(jdir)]


def indexes(jdir: str) -> list[int]:
    return sorted(int(n[:16], 16) for n in os.listdir(os.path.join(jdir, "idx")) if n.endswith(".idx"))


def commit(jdir: str, reader: str, offset: int) -> None:
    with sej.Offset(jdir, reader) as o:
        o.commit(offset)


def planned(jdir: str, **kw: Any) -> list[int]:
    return [d.segment.first_offset for d in plan_retention(jdir, **kw).deletions]


def read_all(jdir: str, start: int | Literal["first"]) -> list[int]:
    """Offsets from `start` to the end, checking each message's value against its offset."""
    out = []
    with sej.Scanner(jdir, start, timeout=0) as s:
        for m in s:
            assert m.value.lstrip(b"0") == (b"%d" % m.offset).lstrip(b"0"), m
            out.append(m.offset)
    return out


def files(root: str) -> dict[str, tuple[int, int]]:
    """Every file under `root` but lock files: size and mtime."""
    out = {}
    for dirpath, _dirs, names in os.walk(root):
        for n in names:
            if n.endswith(".lck"):
                continue
            st = os.stat(os.path.join(dirpath, n))
            out[os.path.join(dirpath, n)] = (st.st_size, st.st_mtime_ns)
    return out


def cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """Run sej-retention (python -m sej.apps.retention) ARGS; fail after scaled(timeout) seconds."""
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.run(
        [sys.executable, "-m", SCRIPT, *args], capture_output=True, text=True, timeout=scaled(timeout), env=env
    )


def read_line(p: subprocess.Popen[str], timeout: float = 30) -> str:
    """A line from the child; fail if none came in scaled(timeout) seconds."""
    assert p.stdout is not None
    timeout = scaled(timeout)
    ready, _, _ = select.select([p.stdout], [], [], timeout)
    assert ready, f"the child printed nothing within {timeout} s"
    return p.stdout.readline()


def script_module() -> ModuleType:
    return importlib.import_module(SCRIPT)


# -- never an unread or unarchived segment (the acceptance test) -----------------------------------


@pytest.mark.parametrize(
    "reader_at, deleted",
    [
        (0, []),
        (2, []),  # inside segment 0: kept
        (3, [0]),  # exactly at the end of segment 0: passed
        (7, [0, 3]),  # inside segment 6: it and everything after are kept
        (9, [0, 3, 6]),
        (30, list(range(0, 30, 3))),
    ],
)
def test_a_segment_is_deleted_only_when_the_reader_has_passed_all_of_it(
    jdir: str, reader_at: int, deleted: list[int]
) -> None:
    before = build(jdir)
    commit(jdir, "hub", reader_at)
    plan = plan_retention(jdir, max_messages=0)  # the limit wants every segment gone
    assert [d.segment.first_offset for d in plan.deletions] == deleted
    assert all(d.end_offset <= reader_at for d in plan.deletions)
    result = apply_retention(plan)
    assert [d.segment.first_offset for d in result.deleted] == deleted and not result.skipped
    assert firsts(jdir) == before[len(deleted) :]
    assert indexes(jdir) == before[len(deleted) :]
    assert read_all(jdir, reader_at) == list(range(reader_at, N))


def test_the_slowest_of_all_readers_decides(jdir: str) -> None:
    build(jdir)
    commit(jdir, "hub", 30)
    commit(jdir, "archive", 27)
    commit(jdir, "spark-daily", 13)
    plan = plan_retention(jdir, max_messages=0)
    assert [d.segment.first_offset for d in plan.deletions] == [0, 3, 6, 9]
    assert plan.floor == 13 and "spark-daily at 13" in plan.kept
    assert dict(plan.readers) == {"archive": 27, "hub": 30, "spark-daily": 13}


def test_a_required_reader_without_a_commit_or_behind_blocks_deletion(jdir: str) -> None:
    build(jdir)
    commit(jdir, "hub", 30)
    # The archive job has never run: nothing counts as archived.
    plan = plan_retention(jdir, max_messages=0, required_readers=["archive"])
    assert plan.deletions == () and "archive has committed nothing" in plan.kept
    assert planned(jdir, max_messages=0) == list(range(0, 30, 3))  # without the requirement: everything
    # An empty offset file (what Go's NewOffset creates) is "nothing committed" too.
    open(os.path.join(jdir, "ofs", "archive.ofs"), "wb").close()
    assert planned(jdir, max_messages=0) == []
    assert planned(jdir, max_messages=0, required_readers=["archive"]) == []
    # Behind: only what it has passed.
    commit(jdir, "archive", 8)
    assert planned(jdir, max_messages=0, required_readers=["archive"]) == [0, 3]
    apply_retention(plan_retention(jdir, max_messages=0, required_readers=["archive"]))
    assert firsts(jdir)[0] == 6 and read_all(jdir, 8) == list(range(8, N))


def test_without_readers_nothing_counts_as_read(jdir: str) -> None:
    before = build(jdir)
    plan = plan_retention(jdir, max_age=0, max_bytes=0, max_messages=0)
    assert plan.deletions == () and "no readers" in plan.kept
    apply_retention(plan)
    assert firsts(jdir) == before


def test_never_the_last_segment(jdir: str, tmp_path: Path) -> None:
    build(jdir)
    commit(jdir, "hub", 10**6)  # even a reader past the end
    plan = plan_retention(jdir, max_age=0, max_bytes=0, max_messages=0)
    assert [d.segment.first_offset for d in plan.deletions] == list(range(0, 30, 3))
    assert "is the last segment" in plan.kept
    apply_retention(plan)
    assert firsts(jdir) == [30]
    again = plan_retention(jdir, max_age=0, max_bytes=0, max_messages=0)
    assert again.deletions == () and again.kept == "000000000000001e.jnl is the last segment (the writer's)"
    # A journal that never rolled: its only segment holds every message and stays.
    single = str(tmp_path / "single")
    assert build(single, n=2) == [0]
    commit(single, "hub", 2)
    assert planned(single, max_age=0, max_bytes=0, max_messages=0) == []
    with sej.Writer(jdir) as w:  # the trimmed journal still takes appends at its end
        assert w.next_offset == 30
        w.append(b"%074d" % 30)
    assert read_all(jdir, "first") == [30]


# -- each limit picks exactly the right prefix -----------------------------------------------------


def test_age_limit_by_the_newest_timestamp(jdir: str) -> None:
    build(jdir)  # segment k*3 holds timestamps T0 + 3k .. T0 + 3k+2 seconds
    commit(jdir, "hub", 30)
    now = T0 + 100 * NS
    # cutoff T0 + 8 s: segment 6's newest message (T0 + 8 s) is exactly max_age old, not older: kept
    assert planned(jdir, max_age=92, now_ns=now) == [0, 3]
    assert planned(jdir, max_age=91.5, now_ns=now) == [0, 3, 6]
    assert planned(jdir, max_age=100, now_ns=now) == []
    plan = plan_retention(jdir, max_age=92, now_ns=now)
    d = plan.deletions[0]
    assert d.newest_ns == T0 + 2 * NS and d.newest_from == "timestamp"
    assert d.reasons == ("newest message 1m38s old > max age 1m32s",)
    assert "is within every limit" in plan.kept


def test_age_limit_stops_at_the_first_young_segment(jdir: str) -> None:
    # Segment 3 holds a message from the future: 6, 9, ... are old but only 0 is deleted.
    build(jdir, ts=lambda i: T0 + (10**6 * NS if i == 4 else i * NS))
    commit(jdir, "hub", 30)
    assert planned(jdir, max_age=60, now_ns=T0 + 3600 * NS) == [0]


def test_age_counts_the_messages_after_the_last_index_entry(jdir: str) -> None:
    # 20 messages of 1026 bytes per segment: index entries at messages 0, 4, 8, 12, 16; 17..19 after the last.
    def ts(i: int) -> int:
        return T0 + 10**6 * NS if i == 19 else T0  # the newest message of segment 0 is its last one

    with sej.Writer(jdir, segment_size=20_000) as w:
        for i in range(60):
            w.append(b"v" * 1000, timestamp=ts(i))
    assert firsts(jdir) == [0, 20, 40, 60]
    assert os.path.getsize(index_path(jdir, 0)) == 16 + 5 * 24
    commit(jdir, "hub", 60)
    now = T0 + 7200 * NS
    assert planned(jdir, max_age=3600, now_ns=now) == []
    shutil.rmtree(os.path.join(jdir, "idx"))  # without an index the whole segment is walked
    assert planned(jdir, max_age=3600, now_ns=now) == []
    assert planned(jdir, max_age=3600, now_ns=T0 + 2 * 10**6 * NS) == [0, 20, 40]


def test_age_falls_back_to_the_file_mtime_without_timestamps(jdir: str) -> None:
    build(jdir, ts=lambda i: sej.NO_TIMESTAMP)
    commit(jdir, "hub", 30)
    now = time.time_ns()
    for first in firsts(jdir):
        old = first in (0, 3)
        t = (now - (2 * 86400 if old else 60) * NS) / NS
        os.utime(segment_path(jdir, first), (t, t))
    plan = plan_retention(jdir, max_age=86400, now_ns=now)
    assert [d.segment.first_offset for d in plan.deletions] == [0, 3]
    assert all(d.newest_from == "mtime" and "file mtime" in d.reasons[0] for d in plan.deletions)


def test_bytes_limit(jdir: str) -> None:
    build(jdir)  # 10 segments of 300 bytes and the empty last one: 3000 bytes
    commit(jdir, "hub", 30)
    assert planned(jdir, max_bytes=3000) == []
    assert planned(jdir, max_bytes=2999) == [0]
    assert planned(jdir, max_bytes=2400) == [0, 3]
    assert planned(jdir, max_bytes=2399) == [0, 3, 6]
    assert planned(jdir, max_bytes=0) == list(range(0, 30, 3))
    assert plan_retention(jdir, max_bytes=2400).deletions[1].reasons == ("journal holds 2700 bytes > max 2400",)


def test_message_count_limit(jdir: str) -> None:
    build(jdir)
    commit(jdir, "hub", 30)
    assert planned(jdir, max_messages=30) == []
    assert planned(jdir, max_messages=29) == [0]
    assert planned(jdir, max_messages=24) == [0, 3]
    assert planned(jdir, max_messages=23) == [0, 3, 6]
    assert plan_retention(jdir, max_messages=24).messages == 30


def test_limits_combine_and_no_limit_deletes_nothing(jdir: str) -> None:
    build(jdir)
    commit(jdir, "hub", 30)
    plan = plan_retention(jdir, max_age=96, max_messages=23, now_ns=T0 + 100 * NS)
    assert [d.segment.first_offset for d in plan.deletions] == [0, 3, 6]
    assert len(plan.deletions[0].reasons) == 2 and len(plan.deletions[2].reasons) == 1
    none = plan_retention(jdir)
    assert none.deletions == () and none.kept == "no limit is set"


@pytest.mark.parametrize(
    "kwargs, bad",
    [
        ({"max_age": -1}, "-1"),
        ({"max_age": "7d"}, "'7d'"),
        ({"max_age": float("nan")}, "nan"),
        ({"max_bytes": 1.5}, "1.5"),
        ({"max_bytes": True}, "True"),
        ({"max_messages": -1}, "-1"),
        ({"required_readers": "archive"}, "'archive'"),
        ({"required_readers": ["bad name"]}, "'bad name'"),
        ({"now_ns": 1.0}, "1.0"),
    ],
)
def test_bad_arguments_raise_invalid_argument_naming_the_value(jdir: str, kwargs: dict[str, Any], bad: str) -> None:
    build(jdir, n=6)
    with pytest.raises(sej.InvalidArgumentError, match=bad.replace(".", r"\.")):
        plan_retention(jdir, **kwargs)
    with pytest.raises(sej.InvalidArgumentError, match="does not exist"):
        plan_retention(jdir + "-missing", max_bytes=0)


# -- malformed offset files, readers that move back ------------------------------------------------


def test_a_malformed_offset_file_stops_the_journal_and_deletes_nothing(jdir: str) -> None:
    build(jdir)
    commit(jdir, "hub", 30)
    bad = os.path.join(jdir, "ofs", "spark-q.ofs")
    with open(bad, "wb") as f:
        f.write(b"\x00" * 5)
    data = os.path.join(jdir, "jnl"), os.path.join(jdir, "idx")
    before = {p: v for p, v in files(jdir).items() if p.startswith(data)}
    with pytest.raises(sej.CorruptionError, match="spark-q.ofs.*5 bytes"):
        plan_retention(jdir, max_messages=0)
    # Broken between planning and deleting: apply checks again and deletes nothing.
    os.remove(bad)
    plan = plan_retention(jdir, max_messages=0)
    assert len(plan.deletions) == 10
    with open(bad, "wb") as f:
        f.write(b"\x00" * 9)
    with pytest.raises(sej.CorruptionError, match="more than 8"):
        apply_retention(plan)
    assert {p: v for p, v in files(jdir).items() if p.startswith(data)} == before


def test_apply_keeps_what_a_reader_no_longer_has_passed(jdir: str) -> None:
    build(jdir)
    commit(jdir, "hub", 9)
    plan = plan_retention(jdir, max_messages=0)
    assert [d.segment.first_offset for d in plan.deletions] == [0, 3, 6]
    write_offset_file(os.path.join(jdir, "ofs", "hub.ofs"), 4)  # `sej reset` between plan and apply
    result = apply_retention(plan)
    assert [d.segment.first_offset for d in result.deleted] == [0]
    assert [d.segment.first_offset for d in result.skipped] == [3, 6]
    assert "offset 4" in str(result.skipped_because)
    assert firsts(jdir)[0] == 3 and read_all(jdir, 4) == list(range(4, N))


def test_apply_makes_the_reader_offsets_it_deletes_by_durable_first(jdir: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A consumer writes its positions at once and fdatasyncs them a moment later (Offset.commit(sync=False)):
    apply fdatasyncs every reader's offset file and fsyncs ofs/ before it deletes anything by them, so no
    deletion outlives, after a power loss, the position that allowed it. A plan alone syncs nothing."""
    build(jdir)
    with sej.Offset(jdir, "app") as o:
        o.commit(9, sync=False)  # written, not synced: as a consumer's batch commit leaves it
    commit(jdir, "hub", 12)
    events: list[str] = []
    real_fdatasync, real_fsync, real_remove = os.fdatasync, os.fsync, os.remove

    def where(fd: int) -> str:
        return os.readlink(f"/proc/self/fd/{fd}")

    monkeypatch.setattr(os, "fdatasync", lambda fd: (events.append("fdatasync " + where(fd)), real_fdatasync(fd)))
    monkeypatch.setattr(os, "fsync", lambda fd: (events.append("fsync " + where(fd)), real_fsync(fd)))
    monkeypatch.setattr(os, "remove", lambda p: (events.append("remove " + str(p)), real_remove(p)))
    plan = plan_retention(jdir, max_messages=0)
    assert events == [], "planning syncs nothing"
    result = apply_retention(plan)
    assert [d.segment.first_offset for d in result.deleted] == [0, 3, 6]
    first_remove = next(i for i, e in enumerate(events) if e.startswith("remove "))
    before = events[:first_remove]
    ofs = os.path.join(os.path.realpath(jdir), "ofs")
    for reader in ("app", "hub"):
        assert f"fdatasync {os.path.join(ofs, reader + '.ofs')}" in before, (reader, events)
    assert f"fsync {ofs}" in before, events


# -- crashes ---------------------------------------------------------------------------------------


def test_a_crash_between_the_segment_and_its_index_leaves_a_good_journal(jdir: str) -> None:
    build(jdir)
    commit(jdir, "hub", 9)
    # The state a crash right after removing segment 0 (and fsyncing jnl/) leaves: its index and checksum
    # file are still there.
    os.remove(segment_path(jdir, 0))
    assert indexes(jdir)[0] == 0
    assert sej.first_offset(jdir) == 3 and read_all(jdir, "first") == list(range(3, N))
    with sej.Writer(jdir, segment_size=FRAME * PER_SEGMENT) as w:
        assert w.next_offset == 30
        w.append(b"%074d" % 30)
    assert read_all(jdir, 9) == list(range(9, 31))
    check = subprocess.run([sys.executable, "-m", "sej.apps.cli", "verify", jdir], capture_output=True, text=True,
                           timeout=scaled(60), env=dict(os.environ, PYTHONPATH=str(REPO)))  # fmt: skip
    assert check.returncode == 0, check.stdout + check.stderr
    # The next run removes the orphan index with the segments it deletes.
    dry = cli(jdir, "--max-messages", "0", "--dry-run")
    assert f"would remove orphan index {index_path(jdir, 0)}\n" in dry.stdout, dry.stdout + dry.stderr
    assert f"would remove orphan checksum file {sum_path(jdir, 0)}\n" in dry.stdout, dry.stdout + dry.stderr
    plan = plan_retention(jdir, max_messages=0)
    assert plan.orphan_indexes == (index_path(jdir, 0), sum_path(jdir, 0))
    result = apply_retention(plan)
    assert [d.segment.first_offset for d in result.deleted] == [3, 6]
    assert result.orphan_indexes == (index_path(jdir, 0), sum_path(jdir, 0))
    left = sorted(os.listdir(os.path.join(jdir, "idx")))
    assert left[:2] == [index_name(9), sum_name(9)] and len(left) == 2 * len(firsts(jdir))
    assert indexes(jdir)[0] == 9 and read_all(jdir, 9) == list(range(9, 31))


RUN_AND_WAIT = r"""
import sys
from sej.retention import apply_retention, plan_retention
plan = plan_retention(sys.argv[1], max_messages=int(sys.argv[2]))
sys.stdin.readline()
print("go", len(plan.deletions), flush=True)
apply_retention(plan)
print("done", flush=True)
"""


def start_run(jdir: str, keep: int) -> subprocess.Popen[str]:
    """A child that plans, then deletes as soon as it printed "go"."""
    p = popen_python(RUN_AND_WAIT, jdir, str(keep), stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert p.stdin is not None
    p.stdin.write("\n")
    p.stdin.flush()
    assert read_line(p).startswith("go")
    return p


def fresh_copy(template: str, dest: str) -> str:
    shutil.copytree(template, dest)
    os.sync()  # so that the run's own fsyncs do not also write out the copy
    return dest


def test_sigkilled_runs_always_leave_a_readable_journal(tmp_path: Path) -> None:
    """Runs killed with SIGKILL at random moments: after each, the journal reads without a gap and takes appends.

    Rerun a failure with SEJ_RETENTION_SEED=<seed> (the seed is in the message).
    """
    n, keep = 120, 12
    template = str(tmp_path / "template")
    build(template, n=n, per_segment=1)
    commit(template, "hub", n)
    # How long a whole run takes here: the kills fall within that time.
    p = start_run(fresh_copy(template, str(tmp_path / "timing")), keep)
    t = time.monotonic()
    assert read_line(p, 120) == "done\n"
    whole = time.monotonic() - t
    assert p.wait(scaled(30)) == 0
    seed = int(os.environ.get("SEJ_RETENTION_SEED", random.randrange(1 << 30)))
    rng = random.Random(seed)
    partial = 0
    for i in range(10):
        if partial >= 3:
            break
        jdir = fresh_copy(template, str(tmp_path / f"round{i}"))
        p = start_run(jdir, keep)
        time.sleep(rng.uniform(0, whole))
        p.send_signal(signal.SIGKILL)
        p.wait(scaled(30))
        for f in (p.stdin, p.stdout):
            f.close()  # type: ignore[union-attr]
        left = firsts(jdir)
        partial += keep + 1 < len(left) < n + 1
        if len(left) == keep + 1:
            whole /= 2  # the run finished before the kill: this machine is faster now, kill sooner
        # No gap: every remaining message reads, from the first to the end, and the journal takes appends.
        assert left == list(range(left[0], n + 1)), f"seed {seed}"
        assert read_all(jdir, "first") == list(range(left[0], n)), f"seed {seed}"
        with sej.Writer(jdir, segment_size=FRAME) as w:
            assert w.next_offset == n
        # The next run finishes the work and leaves no index below the first segment.
        apply_retention(plan_retention(jdir, max_messages=keep))
        assert firsts(jdir) == list(range(n - keep, n + 1)), f"seed {seed}"
        assert indexes(jdir) == list(range(n - keep, n + 1)), f"seed {seed}"
    assert partial >= 1, f"no run was killed in the middle (seed {seed}, a whole run took {whole:.3f} s)"


# -- a writer appending while retention runs -------------------------------------------------------

WRITER = r"""
import os, sys, time
import sej
dir, n, go_on, safety = sys.argv[1], int(sys.argv[2]), sys.argv[3], float(sys.argv[4])
parent, deadline = os.getppid(), time.monotonic() + safety
with sej.Writer(dir, segment_size=2000, durability="flush") as w:
    for i in range(n):
        if i == n // 2:  # halfway, until retention has deleted segments of this open journal
            while not os.path.exists(go_on):
                if os.getppid() != parent or time.monotonic() > deadline:
                    sys.exit("the test went away")
                time.sleep(0.005)
        w.append(b"%074d" % i)
        if i % 20 == 19:
            time.sleep(0.004)
print("done", w.next_offset, flush=True)
"""


def test_a_writer_appending_during_retention_loses_nothing(jdir: str) -> None:
    n = 3000  # 20 messages of 100 bytes per segment: 150 segments, written over about a second
    reader_stops = n - 137
    # The writer waits halfway until retention has deleted segments while it was running: however fast or
    # slow this machine is, retention works on a journal that is being written.
    go_on = os.path.join(os.path.dirname(jdir), "go-on")
    writer = popen_python(WRITER, jdir, str(n), go_on, str(scaled(120)), stdout=subprocess.PIPE)
    seen: list[int] = []
    deleted_while_writing = 0
    try:
        deadline = time.monotonic() + scaled(60)
        while not os.path.isdir(os.path.join(jdir, "jnl")):
            assert time.monotonic() < deadline and writer.poll() is None, "the writer did not start"
            time.sleep(0.01)
        with sej.Offset(jdir, "hub") as hub, sej.Scanner(jdir, hub.value, timeout=0.02) as scanner:
            for _ in range(100_000):
                assert time.monotonic() < deadline, f"timed out: read {len(seen)}, writer {writer.poll()}"
                if scanner.offset < reader_stops:
                    for m in scanner:
                        seen.append(m.offset)
                        if m.offset % 50 == 0:
                            hub.commit(m.offset)
                        if m.offset + 1 == reader_stops:
                            break
                    hub.commit(scanner.offset)
                running = writer.poll() is None
                lock = lock_retention(jdir)
                try:
                    result = apply_retention(plan_retention(jdir, max_messages=0))
                finally:
                    unlock_file(lock)
                deleted_while_writing += len(result.deleted) if running else 0
                if deleted_while_writing and not os.path.exists(go_on):
                    open(go_on, "w").close()
                if not running and scanner.offset == reader_stops:
                    break
        assert writer.wait(scaled(30)) == 0
        assert writer.stdout is not None and writer.stdout.read() == f"done {n}\n"
    finally:
        if writer.poll() is None:
            writer.kill()
            writer.wait(scaled(30))
    assert seen == list(range(reader_stops)), "the reader saw every message once, in order"
    assert deleted_while_writing > 0, "retention deleted segments while the writer was appending"
    with sej.Offset(jdir, "hub") as hub:
        committed = hub.value
    assert committed == reader_stops and sej.first_offset(jdir) <= committed
    assert read_all(jdir, committed) == list(range(committed, n))
    # A final run by the cron script: everything before the reader goes, nothing after it.
    r = cli(jdir, "--max-messages", "0")
    assert r.returncode == 0, r.stderr
    assert read_all(jdir, committed) == list(range(committed, n))
    assert sej.first_offset(jdir) > committed - 20
    with sej.Writer(jdir) as w:
        assert w.next_offset == n


# -- the cron script -------------------------------------------------------------------------------


def hub_root(tmp_path: Path) -> str:
    """A hub root of two journals: `c1.0` (reader at 7) and `c2.0` (reader at 30)."""
    root = tmp_path / "hub"
    build(str(root / "c1.0"))
    commit(str(root / "c1.0"), "hub", 7)
    build(str(root / "c2.0"))
    commit(str(root / "c2.0"), "hub", 30)
    return str(root)


def test_dry_run_deletes_nothing_and_prints_the_plan_the_run_carries_out(tmp_path: Path) -> None:
    root = hub_root(tmp_path)
    before = files(root)
    dry = cli(root, "--max-messages", "24", "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert files(root) == before and not os.path.exists(os.path.join(root, "c1.0", LOCK_NAME))
    real = cli(root, "--max-messages", "24")
    assert real.returncode == 0, real.stderr
    assert real.stderr == ""
    would = [line for line in dry.stdout.splitlines() if line.startswith("would delete /")]
    did = [line for line in real.stdout.splitlines() if line.startswith("deleted /")]
    assert [w.replace("would delete ", "deleted ", 1) for w in would] == did
    c1, c2 = os.path.join(root, "c1.0"), os.path.join(root, "c2.0")
    assert did[:2] == [
        f"deleted {segment_path(c1, 0)}: offsets 0-2, 3 messages, 300 bytes: journal holds 30 messages > max 24",
        f"deleted {segment_path(c1, 3)}: offsets 3-5, 3 messages, 300 bytes: journal holds 27 messages > max 24",
    ]
    assert len(did) == 4 and did[-1].startswith(f"deleted {segment_path(c2, 3)}")  # 2 of each: 24 messages kept
    reader = "ends at offset 9, past what every reader has read (hub at 7)"
    assert f"would keep {c1} from offset 6: 0000000000000006.jnl {reader}\n" in dry.stdout
    assert f"would keep {c2} from offset 6: 0000000000000006.jnl is within every limit\n" in dry.stdout
    assert real.stdout.splitlines()[-1] == "deleted 4 segments (12 messages, 1200 bytes) in 2 of 2 journals"
    assert firsts(c1)[0] == 6 and firsts(c2)[0] == 6
    again = cli(root, "--max-messages", "24")
    assert again.stdout == (  # a journal nothing was deleted from says why, as --dry-run does
        f"kept {c1} from offset 6: 0000000000000006.jnl {reader}\n"
        f"kept {c2} from offset 6: 0000000000000006.jnl is within every limit\n"
        "deleted 0 segments (0 messages, 0 bytes) in 0 of 2 journals\n"
    )


def test_a_run_that_deletes_nothing_says_why(tmp_path: Path) -> None:
    """Issue 38: the reason appeared only with --dry-run."""
    root = hub_root(tmp_path)
    c1, c2 = os.path.join(root, "c1.0"), os.path.join(root, "c2.0")
    before = files(root)
    r = cli(root, "--max-messages", "0", "--require-reader", "archive")
    assert r.returncode == 0 and r.stderr == "", r.stderr
    why = "reader archive has committed nothing, so no segment counts as read"
    assert r.stdout == (
        f"kept {c1} from offset 0: {why}\n"
        f"kept {c2} from offset 0: {why}\n"
        "deleted 0 segments (0 messages, 0 bytes) in 0 of 2 journals\n"
    ), r.stdout
    assert files(root) == before
    commit(c2, "archive", 30)  # only the journals nothing was deleted from say why
    r = cli(root, "--max-messages", "0", "--require-reader", "archive")
    assert r.returncode == 0 and f"kept {c1} from offset 0: {why}\n" in r.stdout and f"kept {c2}" not in r.stdout
    assert r.stdout.splitlines()[-1] == "deleted 10 segments (30 messages, 3000 bytes) in 1 of 2 journals"


LOCK_HOLDER = r"""
import sys
from sej.retention import lock_retention
lock = lock_retention(sys.argv[1])
print("locked", flush=True)
sys.stdin.readline()
"""


def test_a_second_run_is_refused_while_another_holds_the_lock(tmp_path: Path) -> None:
    root = hub_root(tmp_path)
    before = files(root)
    holder = popen_python(LOCK_HOLDER, os.path.join(root, "c2.0"), stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert read_line(holder) == "locked\n"
        r = cli(root, "--max-messages", "0")
        assert r.returncode == 1
        lock = os.path.join(root, "c2.0", LOCK_NAME)
        assert r.stderr == f"sej-retention: error: another retention run holds the lock {lock}; nothing deleted\n"
        assert r.stdout == "" and files(root) == before
        dry = cli(root, "--max-messages", "0", "--dry-run")  # a dry run needs no lock
        assert dry.returncode == 0 and "would delete" in dry.stdout and files(root) == before
    finally:
        assert holder.stdin is not None
        holder.stdin.close()
        holder.wait(scaled(30))
    r = cli(root, "--max-messages", "0")
    assert r.returncode == 0 and "deleted 12 segments" in r.stdout, r.stdout + r.stderr


def test_cli_reports_a_broken_journal_and_goes_on_with_the_others(tmp_path: Path) -> None:
    root = hub_root(tmp_path)
    c1, c2 = os.path.join(root, "c1.0"), os.path.join(root, "c2.0")
    with open(os.path.join(c1, "ofs", "archive.ofs"), "wb") as f:
        f.write(b"\x01\x02\x03")
    before = files(c1)
    r = cli(root, "--max-messages", "0")
    assert r.returncode == 1
    lines = r.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"sej-retention: error: {c1}: ") and "archive.ofs" in lines[0]
    assert "3 bytes" in lines[0] and "Traceback" not in r.stderr
    assert files(c1) == before
    assert firsts(c2) == [30] and r.stdout.splitlines()[-1].endswith("in 1 of 2 journals; 1 failed")


def test_cli_require_reader_and_units(tmp_path: Path) -> None:
    root = hub_root(tmp_path)
    r = cli(root, "--max-bytes", "2.5K", "--require-reader", "archive", "--dry-run")
    assert r.returncode == 0 and "would delete 0 segments" in r.stdout
    assert r.stdout.count("reader archive has committed nothing") == 2
    r = cli(root, "--max-bytes", "2.5K", "--dry-run")  # 2560 bytes: 3000 -> 2700 -> 2400
    assert r.returncode == 0 and "would delete 4 segments" in r.stdout, r.stdout
    mod = script_module()
    assert [mod.parse_size(s) for s in ("4096", "1K", "1.5k", "10G", "10GiB", "10gb", "2T")] == [
        4096, 1024, 1536, 10 << 30, 10 << 30, 10 << 30, 2 << 40,
    ]  # fmt: skip
    assert [mod.parse_duration(s) for s in ("90", "0.5", "45s", "30m", "1h30m", "7d", "1w")] == [
        90, 0.5, 45, 1800, 5400, 7 * 86400, 7 * 86400,
    ]  # fmt: skip


@pytest.mark.parametrize(
    "args, needle",
    [
        ([], "Missing argument 'PATH'"),
        (["{j}"], "no limit given"),
        (["{j}", "--max-age", "7x"], "'7x' is not a duration"),
        (["{j}", "--max-age=-1d"], "'-1d' is not a duration"),
        (["{j}", "--max-age", "99999999999w"], "too long"),
        (["{j}", "--max-bytes", "10X"], "'10X' is not a size"),
        (["{j}", "--max-bytes", "iB"], "'iB' is not a size"),
        (["{j}", "--max-messages", "-1"], "--max-messages"),
        (["{j}", "--max-messages", "1.5"], "--max-messages"),
        (["{j}", "--max-age", "1d", "--require-reader", "bad name"], "'bad name'"),
        (["{j}-missing", "--max-bytes", "1"], "does not exist"),
        (["{j}/jnl.lck", "--max-bytes", "1"], "is not a directory"),
        (["{j}/ofs", "--max-bytes", "1"], "is not a journal"),
        (["{j}", "--max-bytes", "1", "--bogus"], "--bogus"),
    ],
)
def test_cli_bad_input_gives_one_error_line_and_exit_2(jdir: str, args: list[str], needle: str) -> None:
    build(jdir)
    commit(jdir, "hub", 30)
    before = files(jdir)
    r = cli(*(a.format(j=jdir) for a in args))
    assert r.returncode == 2, r.stdout + r.stderr
    lines = r.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("sej-retention: error: ") and needle in lines[0], r.stderr
    assert "Traceback" not in r.stderr and r.stdout == ""
    assert files(jdir) == before


@pytest.mark.parametrize("kind", ["fifo", "symlink"])
def test_a_fifo_or_symlink_in_ofs_is_refused_instead_of_hanging_the_run(tmp_path: Path, kind: str) -> None:
    """A FIFO in a journal's ofs/ hung sej-retention forever in open(), while it held retention.lck.
    A symlink was followed to whatever 8 bytes it pointed at, and counted as a reader's offset."""
    root = hub_root(tmp_path)
    c1, c2 = os.path.join(root, "c1.0"), os.path.join(root, "c2.0")
    bad = os.path.join(c2, "ofs", "spark.ofs")
    if kind == "fifo":
        os.mkfifo(bad)
    else:
        target = tmp_path / "eight-bytes"
        target.write_bytes(b"\0\0\0\0\0\0\0\x30")  # would let the reader "spark" pass every segment
        os.symlink(target, bad)
    before = files(c2) if kind == "symlink" else None
    r = cli(root, "--max-messages", "0", timeout=60)  # hung forever before (fifo)
    assert r.returncode == 1, r.stdout + r.stderr
    what = "FIFO" if kind == "fifo" else "symlink"
    assert r.stderr == f"sej-retention: error: {c2}: {bad} is a {what}, not a regular file: refusing to open it\n"
    assert firsts(c2) == list(range(0, 31, 3)), "nothing deleted in the journal with the bad reader"
    assert firsts(c1)[0] == 6 and r.stdout.splitlines()[-1].endswith("in 1 of 2 journals; 1 failed")
    if before is not None:
        assert files(c2) == before
    with pytest.raises(sej.UnsafeFileError, match=f"is a {what}"):
        plan_retention(c2, max_messages=0)
    unlock_file(lock_retention(c2))  # the run released its lock
