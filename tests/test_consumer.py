"""sej.Consumer: every journal under a root, batched commits, following new data and new journals."""

from __future__ import annotations

import asyncio
import os
import queue
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import sej
import sej.watch
from sej.layout import reader_offset_path
from sej.offset import read_offset_file
from testing.timing import scaled, wait_until

from .conftest import REPO, popen_python


def write_root(root: Path, shards: int, per: int, prefix: str = "ev") -> dict[str, list[bytes]]:
    """`shards` journals `<prefix>.<bit>.<i>` with `per` messages each; their values by journal name."""
    bit = max(1, (shards - 1).bit_length())
    out: dict[str, list[bytes]] = {}
    for i in range(shards):
        name = f"{prefix}.{bit:x}.{i:03x}"
        vals = [b"%s-%d" % (name.encode(), k) for k in range(per)]
        with sej.Writer(root / name, segment_size=2000) as w:
            w.append_many(vals)
        out[name] = vals
    return out


def test_consumes_every_journal_and_commits_on_close(tmp_path: Path) -> None:
    root = tmp_path / "root"
    want = write_root(root, 4, 120)
    got: dict[str, list[bytes]] = {}
    with sej.Consumer(root, "app", follow=False) as c:
        assert sorted(c.journals) == sorted(want)
        for m in c:
            got.setdefault(m.journal, []).append(m.message.value)
    assert got == want
    for name in want:
        assert read_offset_file(reader_offset_path(str(root / name), "app")) == 120
    with sej.Consumer(root, "app", follow=False) as again:
        assert list(again) == []  # everything was committed
    with sej.Consumer(root, "app", follow=False, start="first") as replay:
        assert sum(1 for _ in replay) == 480


def test_commits_in_batches_and_a_message_is_consumed_when_the_next_is_asked_for(tmp_path: Path) -> None:
    root = tmp_path / "root"
    write_root(root, 2, 50)
    c = sej.Consumer(root, "app", commit_every=10, commit_interval=3600, follow=False)
    it = iter(c)
    for _ in range(25):
        next(it)
    assert sum(c.positions().values()) == 25  # positions count the message yielded last
    assert sum(c.committed().values()) == 20  # commits after the 10th and 20th consumed (in the loop: few journals)
    c.commit()
    assert sum(c.committed().values()) == 25
    c.close()


def test_batch_commits_write_in_the_loop_and_sync_in_the_background(tmp_path: Path) -> None:
    """A batch commit writes every changed offset file in the loop (so the offsets on disk are never more
    than a batch behind) and leaves their fdatasyncs to the syncer thread; commit() waits for those."""
    root = tmp_path / "root"
    write_root(root, 40, 30)  # read a journal at a time: 30 messages a turn
    every = 500
    synced: list[str] = []
    real_sync = sej.Offset.sync

    def on_disk() -> int:
        return sum(read_offset_file(reader_offset_path(str(root / n), "app")) or 0 for n in c.journals)

    def sync(self: sej.Offset) -> None:
        assert threading.current_thread() is not main, "an fdatasync in the loop"
        real_sync(self)
        synced.append(self.path)

    main = threading.current_thread()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(sej.Offset, "sync", sync)
        with sej.Consumer(root, "app", commit_every=every, commit_interval=3600, follow=False) as c:
            for k, _ in enumerate(c, 1):
                assert k - on_disk() <= every
                if k == every + 1:  # the loop asked past the 500th: written before it got the 501st
                    assert on_disk() == every
            assert k == 1200
            c.commit()
            assert len(set(synced)) == 40  # every journal's file, by the syncer
        assert on_disk() == 1200


def test_records_are_flat_with_the_journal_and_the_message_fields(tmp_path: Path) -> None:
    """A ShardMessage has the journal and the message's fields side by side (as Kafka's ConsumerRecord);
    `.message` is the Message alone. merged_scan yields the same records."""
    root = tmp_path / "root"
    with sej.Writer(root / "ev.1.000") as w:
        w.append(b"v0", key=b"k", type=7, timestamp=1_000)
    with sej.Writer(root / "ev.1.001") as w:
        w.append(b"v1", timestamp=500)
    with sej.Consumer(root, None, follow=False) as c:
        got = sorted(c)
    first = got[0]
    assert isinstance(first, sej.shard.ShardMessage)
    assert (first.journal, first.offset, first.timestamp, first.type, first.key, first.value) == (
        "ev.1.000", 0, 1_000, 7, b"k", b"v0")  # fmt: skip
    assert first.message == sej.Message(0, 1_000, 7, b"k", b"v0")
    merged = list(sej.shard.merged_scan(root))
    assert [(m.journal, m.value) for m in merged] == [("ev.1.001", b"v1"), ("ev.1.000", b"v0")]  # by time
    assert merged[1] == first


IDLE_CONSUMER = r"""
import sys
import sej
with sej.Consumer(sys.argv[1], "app", commit_every=1000, commit_interval=3600) as c:
    for m in c:
        sys.stdout.write("%s %d\n" % (m.journal, m.offset))
        sys.stdout.flush()
"""


def test_a_following_consumer_writes_its_positions_while_it_waits(tmp_path: Path) -> None:
    """Between batches, a consumer waiting for messages writes the positions of the journals it consumed from
    (no fsync), so a following consumer's offsets on disk are up to date long before a batch is full, and a
    SIGKILL then replays nothing."""
    root = tmp_path / "root"
    write_root(root, 3, 5)
    paths = [reader_offset_path(str(root / n), "app") for n in sorted(os.listdir(root))]
    p = popen_python(IDLE_CONSUMER, str(root), stdout=subprocess.PIPE)
    try:
        assert p.stdout is not None
        lines = [p.stdout.readline() for _ in range(15)]
        assert all(lines)
        wait_until(lambda: [read_offset_file(f) for f in paths] == [5, 5, 5], scaled(30), "positions written")
    finally:
        p.send_signal(signal.SIGKILL)
        p.wait(scaled(30))
    with sej.Consumer(root, "app", follow=False) as again:
        assert list(again) == []  # nothing to replay


def test_a_failed_offset_sync_is_raised_by_the_loop(tmp_path: Path) -> None:
    """The syncer's fdatasync failing (a disk error) is not lost: the next batch commit raises it from the
    loop, before anything more is committed; commit() raises it too."""
    root = tmp_path / "root"
    write_root(root, 2, 40)
    failures = 0

    def broken_sync(self: sej.Offset) -> None:
        nonlocal failures
        failures += 1
        raise OSError(5, "Input/output error (injected)")

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(sej.Offset, "sync", broken_sync)
        c = sej.Consumer(root, "app", commit_every=10, commit_interval=3600, follow=False)
        it = iter(c)
        for _ in range(11):  # asking for the 11th commits the first 10
            next(it)
        wait_until(lambda: failures > 0, scaled(30), "the syncer's first fdatasync")
        on_disk = sum(read_offset_file(reader_offset_path(str(root / n), "app")) or 0 for n in c.journals)
        with pytest.raises(OSError, match="injected"):
            for _ in range(10):
                next(it)
        assert sum(read_offset_file(reader_offset_path(str(root / n), "app")) or 0 for n in c.journals) == on_disk
        with pytest.raises(OSError, match="injected"):
            c.commit()
        mp.undo()
        c.close()


def test_a_commit_failing_part_way_leaves_nothing_unsynced_behind(tmp_path: Path) -> None:
    """A write failing on one journal (a full disk, once) raises from commit(); the journals written before it
    are synced by the next commit all the same, and an fdatasync that failed is tried again by the next one."""
    root = tmp_path / "root"
    write_root(root, 3, 10)
    synced: list[str] = []
    real_commit, real_sync = sej.Offset.commit, sej.Offset.sync
    broken = {"write": "ev.2.001", "sync": "ev.2.002"}

    def commit(self: sej.Offset, offset: int, *, sync: bool = True) -> None:
        if broken.get("write") and broken["write"] in self.path:
            del broken["write"]
            raise OSError(28, "No space left on device (injected)")
        real_commit(self, offset, sync=sync)

    def sync(self: sej.Offset) -> None:
        if broken.get("sync") and broken["sync"] in self.path:
            del broken["sync"]
            raise OSError(5, "Input/output error (injected)")
        real_sync(self)
        synced.append(os.path.basename(os.path.dirname(os.path.dirname(self.path))))

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(sej.Offset, "commit", commit)
        mp.setattr(sej.Offset, "sync", sync)
        c = sej.Consumer(root, "app", commit_every=1000, commit_interval=3600, follow=False)
        got = 0
        with pytest.raises(OSError, match="No space left"):  # the loop's write of the positions, at its end
            for _ in c:
                got += 1
        assert got == 30
        with pytest.raises(OSError, match="Input/output error"):
            c.commit()  # writes the rest; the sync of ev.2.002 fails
        c.commit()  # tries it again
        c.close()
    assert sorted(set(synced)) == ["ev.2.000", "ev.2.001", "ev.2.002"]
    for name in ("ev.2.000", "ev.2.001", "ev.2.002"):
        assert read_offset_file(reader_offset_path(str(root / name), "app")) == 10


def test_a_journal_given_up_is_synced_before_its_lock_goes(tmp_path: Path) -> None:
    """A group member giving a journal up (a rebalance) makes its position durable before it releases the
    reader lock, also when the position was written while idle (no fsync yet)."""
    root = tmp_path / "root"
    write_root(root, 2, 5)
    sej.Writer(root / "zz.1.000").close()  # nothing to consume: nothing committed, no offset file to sync
    events: list[str] = []
    real_fdatasync, real_close = os.fdatasync, sej.Offset.close

    def fdatasync(fd: int) -> None:
        real_fdatasync(fd)
        events.append("fdatasync " + os.path.relpath(os.readlink(f"/proc/self/fd/{fd}"), os.path.realpath(root)))

    def close(self: sej.Offset) -> None:
        events.append("close " + os.path.basename(self.dir))
        real_close(self)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(os, "fdatasync", fdatasync)
        mp.setattr(sej.Offset, "close", close)
        with sej.Consumer(root, "app", group=True, timeout=0) as c:
            assert sum(1 for _ in c) == 10  # the positions written while idle, at the timeout
            assert read_offset_file(reader_offset_path(str(root / "ev.1.000"), "app")) == 5
            events.clear()
            c._release(["ev.1.000"])  # as a rebalance does when another member takes its share
            assert events == ["fdatasync ev.1.000/ofs/app.ofs", "close ev.1.000"], events
            events.clear()
            c._release(["zz.1.000"])  # nothing committed there: nothing to sync (its offset file does not exist)
            assert events == ["close zz.1.000"], events


def test_a_lone_journal_and_start_positions(tmp_path: Path) -> None:
    d = tmp_path / "j"
    with sej.Writer(d) as w:
        w.append_many([b"%d" % i for i in range(30)], timestamp=1_000)
        w.append_many([b"late-%d" % i for i in range(5)], timestamp=2_000)
    with sej.Consumer(d, "r", follow=False, start=20) as c:
        assert [m.message.offset for m in c] == list(range(20, 35)) and c.journals == [""]
    with sej.Consumer(d, "r2", follow=False, start="last") as c:
        assert list(c) == []
    with sej.Consumer(d, "r3", follow=False, start={"": 33}) as c:
        assert [m.message.offset for m in c] == [33, 34]
    with sej.Consumer(d, "r4", follow=False) as c:
        c.seek_to_time(2_000)
        assert [m.message.value for m in c] == [b"late-%d" % i for i in range(5)]
    with pytest.raises(sej.InvalidArgumentError, match="start must be"):
        sej.Consumer(d, "r5", start="middle")  # type: ignore[arg-type]
    with pytest.raises(sej.InvalidArgumentError, match="commit_every"):
        sej.Consumer(d, "r5", commit_every=0)


def test_positions_lag_and_seek(tmp_path: Path) -> None:
    root = tmp_path / "root"
    write_root(root, 2, 40)
    with sej.Consumer(root, "app", follow=False) as c:
        it = iter(c)
        first = next(it)
        lag = c.lag()
        assert lag[first.journal].messages == 39 and lag[first.journal].bytes > 0
        other = next(n for n in c.journals if n != first.journal)
        assert lag[other].messages == 40
        c.seek(other, 35)
        rest = list(it)
        assert sum(1 for m in rest if m.journal == other) == 5
        assert all(v.messages == 0 and v.bytes == 0 for v in c.lag().values())


@pytest.fixture(params=["dirs", "recursive"])
def watch_mode(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """The consumer's two ways of watching a root: the directories that matter through inotify (on
    Linux), or one recursive watchdog watch (elsewhere; chosen here by hiding inotify)."""
    if request.param == "recursive":
        monkeypatch.setattr(sej.watch.DirWatch, "available", staticmethod(lambda: False))
    else:
        assert sej.watch.DirWatch.available(), "inotify through watchdog is not available on this Linux"
    return str(request.param)


def test_follows_new_data_and_new_journals(tmp_path: Path, watch_mode: str) -> None:
    root = tmp_path / "root"
    write_root(root, 2, 10)
    got: list[sej.ShardMessage] = []
    done = threading.Event()
    total = 2 * 10 + 2 * 30 + 25

    def consume() -> None:
        with sej.Consumer(root, "app", timeout=scaled(60)) as c:
            for m in c:
                got.append(m)
                if len(got) == total:
                    break
        done.set()

    t = threading.Thread(target=consume)
    t.start()
    wait_until(lambda: len(got) >= 20, scaled(30), "the first 20 messages")
    for name in ("ev.1.000", "ev.1.001"):
        with sej.Writer(root / name, segment_size=2000) as w:  # rolls to new segments
            for i in range(30):
                w.append(b"more-%d" % i)
                w.flush()
    with sej.Writer(root / "ev.2.002") as w:  # a shard that appears mid-run
        w.append_many([b"new-%d" % i for i in range(25)])
    assert done.wait(scaled(60)), f"got {len(got)} of {total}"
    t.join(scaled(10))
    by = {}
    for m in got:
        by.setdefault(m.journal, []).append(m.message.offset)
    assert by["ev.2.002"] == list(range(25))
    assert by["ev.1.000"] == list(range(40)) and by["ev.1.001"] == list(range(40))


def test_async_iteration(tmp_path: Path) -> None:
    root = tmp_path / "root"
    want = write_root(root, 3, 20)

    async def main() -> list[sej.ShardMessage]:
        out = []
        async with asyncio.timeout(scaled(60)):
            c = sej.Consumer(root, "app", follow=False)
            try:
                async for m in c:
                    out.append(m)
            finally:
                c.close()
        return out

    got = asyncio.run(main())
    assert sorted(m.message.value for m in got) == sorted(v for vals in want.values() for v in vals)


def test_one_process_follows_a_thousand_journals(tmp_path: Path) -> None:
    """One inotify instance for the whole root, and two descriptors per journal."""
    root = tmp_path / "root"
    for i in range(1000):
        with sej.Writer(root / f"ev.a.{i:03x}") as w:
            w.append(b"%d" % i)

    def inotify_instances() -> int:
        fds = os.listdir("/proc/self/fd")
        n = 0
        for fd in fds:
            try:
                n += os.readlink(f"/proc/self/fd/{fd}") == "anon_inode:inotify"
            except OSError:
                pass
        return n

    before_fds, before_inotify = len(os.listdir("/proc/self/fd")), inotify_instances()
    before_threads = threading.active_count()
    with sej.Consumer(root, "app", timeout=0) as c:
        seen = sum(1 for _ in c)
        fds = len(os.listdir("/proc/self/fd")) - before_fds
        inotify = inotify_instances() - before_inotify
        threads = threading.active_count() - before_threads
        with sej.Writer(root / "ev.a.07b") as w:
            w.append(b"followed")
        c.timeout = scaled(30)
        m = next(iter(c))
        assert (m.journal, m.message.value) == ("ev.a.07b", b"followed")
    assert seen == 1000
    assert inotify <= 1, f"{inotify} inotify instances for one root"
    assert fds <= 2 * 1000 + 16, f"{fds} descriptors for 1,000 journals"
    assert threads <= 8, f"{threads} threads to watch 1,000 journals"


CONSUMER = r"""
import sys, time
import sej
root, every = sys.argv[1], int(sys.argv[2])
work = float(sys.argv[3]) if len(sys.argv) > 3 else 0.0  # seconds of "processing" per message
with sej.Consumer(root, "app", commit_every=every, commit_interval=3600) as c:
    for m in c:
        sys.stdout.write("%s %d\n" % (m.journal, m.offset))
        sys.stdout.flush()
        if work:
            time.sleep(work)
"""


@pytest.mark.slow
def test_sigkilled_consumer_replays_at_most_its_uncommitted_batch_and_skips_nothing(tmp_path: Path) -> None:
    root = tmp_path / "root"
    write_root(root, 8, 400)
    every = 50
    rng = random.Random(int(os.environ.get("SEJ_CONSUMER_SEED", random.randrange(1 << 30))))
    seen: dict[tuple[str, int], int] = {}
    env = dict(os.environ, PYTHONPATH=str(REPO))
    kills = 0
    total = 8 * 400
    printed = bound = 0  # lines printed by the killed consumers; what their deaths may make the next replay
    for round in range(12):
        left = total - len(seen)  # the child prints at least these (it replays, never skips)
        if left == 0:
            break
        # 0.5 ms of work per message, as real work would take: a kill lands a few messages after the one waited
        # for, so that every round leaves something for the next (a bare consumer reads thousands meanwhile).
        p = subprocess.Popen([sys.executable, "-c", CONSUMER, str(root), str(every), "0.0005"], stdout=subprocess.PIPE,
                             env=env, text=True)  # fmt: skip
        assert p.stdout is not None
        lines: list[str] = []
        want = min(rng.randrange(1, 300), left)
        for line in p.stdout:
            lines.append(line)
            if len(lines) >= want:
                break
        p.send_signal(signal.SIGKILL)
        p.wait(scaled(30))
        kills += 1
        lines += p.stdout.read().splitlines(keepends=True)
        # What this round consumed past the offsets committed when it died: replayed by the next one.
        committed = {f"ev.3.{i:03x}": read_offset_file(reader_offset_path(str(root / f"ev.3.{i:03x}"), "app")) or 0
                     for i in range(8)}  # fmt: skip
        uncommitted = 0
        for line in lines:
            name, off = line.split()
            key = (name, int(off))
            seen[key] = seen.get(key, 0) + 1
            printed += 1
            uncommitted += int(off) >= committed[name]
        assert uncommitted <= every + 1, f"round {round}: {uncommitted} consumed past the commits, {every=}"
        bound += uncommitted
    # The rest, to the end, by a consumer that exits normally.
    final = CONSUMER.replace("for m in c:", "c.timeout = 0\n    for m in c:")
    out = subprocess.run([sys.executable, "-c", final, str(root), str(every)], capture_output=True, text=True,
                         env=env, timeout=scaled(120))  # fmt: skip
    for line in out.stdout.splitlines():
        name, off = line.split()
        seen[(name, int(off))] = seen.get((name, int(off)), 0) + 1
        printed += 1
    duplicates = printed - len(seen)
    assert duplicates <= bound, f"{duplicates} duplicates, more than the {bound} uncommitted at the kills"
    assert kills >= 5
    missing = [(f"ev.3.{i:03x}", k) for i in range(8) for k in range(400) if (f"ev.3.{i:03x}", k) not in seen]
    assert not missing, f"{len(missing)} messages never consumed, e.g. {missing[:5]}"


WRITER = r"""
import sys, time, sej
root, shards, first, count = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
writers = [sej.Writer(f"{root}/ev.4.{first + i:03x}", segment_size=4000, durability="flush") for i in range(shards)]
for k in range(count):
    for i, w in enumerate(writers):
        w.append(b"%d-%d" % (first + i, k))
    if k % 50 == 49:
        sys.stdout.write("%d\n" % (k + 1))
        sys.stdout.flush()
    time.sleep(0.004)  # a steady producer, so that appends go on across the consumer's kills
for w in writers:
    w.close()
"""


def lines_of(p: subprocess.Popen[str]) -> queue.Queue[str | None]:
    """A child's stdout lines, read by a thread (None at the end), so that waits on them are bounded."""
    q: queue.Queue[str | None] = queue.Queue()

    def pump() -> None:
        assert p.stdout is not None
        for line in p.stdout:
            q.put(line)
        q.put(None)

    threading.Thread(target=pump, daemon=True).start()
    return q


@pytest.mark.slow
def test_consumer_killed_30_times_while_writer_processes_append_to_16_shards(tmp_path: Path) -> None:
    """Live writer processes append to 12 shards, then 4 more appear; a consumer process is SIGKILLed at
    random moments 30 times. Every message is consumed, none is skipped, and each restart replays at most
    what was consumed past the commits before the kill."""
    root = tmp_path / "root"
    root.mkdir()
    every, per = 40, 700
    rng = random.Random(int(os.environ.get("SEJ_CONSUMER_SEED", random.randrange(1 << 30))))
    writers = [popen_python(WRITER, str(root), "6", str(6 * i), str(per), stdout=subprocess.PIPE) for i in range(2)]
    late: subprocess.Popen[str] | None = None
    names = [f"ev.4.{i:03x}" for i in range(16)]
    seen: dict[tuple[str, int], int] = {}
    printed = bound = kills = 0
    total = 12 * per + 4 * (per // 2)
    try:
        wq = [lines_of(w) for w in writers]
        for q in wq:  # both writers are appending before the first consumer starts
            assert q.get(timeout=scaled(60)) is not None
        for round in range(30):
            if round == 10:  # four new shards, picked up by the running consumers
                late = popen_python(WRITER, str(root), "4", "12", str(per // 2), stdout=subprocess.PIPE)
            left = total - len(seen)  # not consumed yet: the consumer prints these (it never skips)
            if left == 0:
                break
            # Each message takes the consumer 0.5 ms, as real work would: a round then consumes a few hundred
            # messages before its kill lands, and 30 kills fall while the writers are still appending.
            p = popen_python(CONSUMER, str(root), str(every), "0.0005", stdout=subprocess.PIPE)
            q = lines_of(p)
            got: list[str] = []
            want = min(rng.randrange(1, 250), left)
            kills += 1
            while len(got) < want:
                line = q.get(timeout=scaled(60))
                assert line is not None, "the consumer ended"
                got.append(line)
            p.send_signal(signal.SIGKILL)
            p.wait(scaled(30))
            while (line := q.get(timeout=scaled(30))) is not None:
                got.append(line)
            committed = {n: read_offset_file(reader_offset_path(str(root / n), "app")) or 0
                         for n in names if (root / n / "ofs").is_dir()}  # fmt: skip
            uncommitted = 0
            for line in got:
                name, off = line.split()
                key = (name, int(off))
                seen[key] = seen.get(key, 0) + 1
                printed += 1
                uncommitted += int(off) >= committed.get(name, 0)
            assert uncommitted <= every + 1, f"round {round}: {uncommitted} consumed past the commits, {every=}"
            bound += uncommitted
        for w in [*writers, *([late] if late else [])]:
            assert w.wait(scaled(120)) == 0
    finally:
        for w in [*writers, *([late] if late else [])]:
            if w.poll() is None:
                w.kill()
                w.wait()
    final = CONSUMER.replace("for m in c:", "c.timeout = 0\n    for m in c:")
    out = subprocess.run([sys.executable, "-c", final, str(root), str(every)], capture_output=True, text=True,
                         env=dict(os.environ, PYTHONPATH=str(REPO)), timeout=scaled(120))  # fmt: skip
    assert out.returncode == 0, out.stderr
    for line in out.stdout.splitlines():
        name, off = line.split()
        seen[(name, int(off))] = seen.get((name, int(off)), 0) + 1
        printed += 1
    expected = {(n, k) for n in names[:12] for k in range(per)} | {(n, k) for n in names[12:] for k in range(per // 2)}
    assert set(seen) == expected, f"missing {len(expected - set(seen))}, unexpected {len(set(seen) - expected)}"
    assert any(n in names[12:] for n, _ in seen)
    assert kills >= 30, f"only {kills} kills"
    assert printed - len(seen) <= bound, f"{printed - len(seen)} duplicates, more than the {bound} at the kills"


MEMBER = r"""
import sys, time, sej
root = sys.argv[1]


def say(*words):
    sys.stdout.write(" ".join(map(str, words)) + "\n")
    sys.stdout.flush()


with sej.Consumer(root, "grp", group=True, commit_every=20, commit_interval=3600,
                  on_assign=lambda names: say("take", time.monotonic(), ",".join(names)),
                  on_revoke=lambda names: say("revoke", time.monotonic(), ",".join(names))) as c:
    for m in c:
        say("msg", time.monotonic(), m.journal, m.message.offset)
"""

GROUP_WRITER = r"""
import os, sys, time, sej
root, first, stop = sys.argv[1], int(sys.argv[2]), sys.argv[3]
writers = [sej.Writer(f"{root}/ev.4.{first + i:03x}", segment_size=8000, durability="flush") for i in range(8)]
k = 0
while not (k % 50 == 0 and os.path.exists(stop)):
    for w in writers:
        w.append(b"%d" % k)
    k += 1
    if k % 50 == 0:
        sys.stdout.write("%d\n" % k)
        sys.stdout.flush()
    time.sleep(0.004)
for w in writers:
    w.close()
sys.stdout.write("done %d\n" % k)
"""


class Member:
    """A consumer-group member process and what it said: its journals over time, and its messages."""

    def __init__(self, name: str, root: Path) -> None:
        self.name = name
        self.proc = popen_python(MEMBER, str(root), stdout=subprocess.PIPE)
        self.lines = lines_of(self.proc)
        self.held: set[str] = set()
        self.spans: list[tuple[str, float, float]] = []  # (journal, taken, given up or died)
        self.since: dict[str, float] = {}
        self.msgs: list[tuple[float, str, int]] = []
        self.died: float | None = None

    def drain(self) -> None:
        while True:
            try:
                line = self.lines.get_nowait()
            except queue.Empty:
                return
            if line is None:
                return
            kind, t, *rest = line.split()
            if kind == "msg":
                self.msgs.append((float(t), rest[0], int(rest[1])))
                continue
            for j in rest[0].split(","):
                if kind == "take":
                    assert j not in self.held, f"{self.name} took {j} twice"
                    self.held.add(j)
                    self.since[j] = float(t)
                else:
                    self.held.remove(j)
                    self.spans.append((j, self.since.pop(j), float(t)))

    def kill(self) -> float:
        """SIGKILL it; the time before the signal (its locks are released after)."""
        t = time.monotonic()
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(scaled(30))
        wait_until(lambda: self.lines.queue and self.lines.queue[-1] is None, scaled(30), f"{self.name}'s output")
        self.drain()
        self.died = t
        # It died after the signal was sent and after everything it printed (it may print between the clock
        # read above and the signal, when this process is descheduled): its locks were released after both.
        last = max((when for when, _, _ in self.msgs), default=t)
        for j in self.held:
            self.spans.append((j, self.since.pop(j), max(t, last)))
        return t


@pytest.mark.slow
def test_group_members_share_the_journals_take_over_from_a_dead_one_and_give_a_share_to_a_new_one(
    tmp_path: Path,
) -> None:
    """Three consumer processes share reader "grp" over a 16-shard root while two writer processes append;
    one is SIGKILLed, later a fourth joins. Every message is consumed; no journal is ever read by two live
    members at once; the dead member's journals are taken over within 10 s; the shares stay even."""
    root = tmp_path / "root"
    root.mkdir()
    stop = tmp_path / "stop"
    writers = [popen_python(GROUP_WRITER, str(root), str(8 * i), str(stop), stdout=subprocess.PIPE) for i in range(2)]
    members: list[Member] = []

    def live() -> list[Member]:
        for m in members:
            m.drain()
        return [m for m in members if m.died is None]

    def even() -> bool:
        held = [len(m.held) for m in live()]
        return sum(held) == 16 and max(held) - min(held) <= 1

    try:
        wq = [lines_of(w) for w in writers]
        for q in wq:
            assert q.get(timeout=scaled(60)) is not None
        members += [Member(n, root) for n in "ABC"]
        wait_until(even, scaled(60), "three members holding 6, 5 and 5 journals")
        wait_until(lambda: all(len(m.msgs) >= 50 for m in live()), scaled(60), "every member consuming")
        victim = members[1]
        orphans = set(victim.held)
        killed = victim.kill()
        wait_until(lambda: orphans <= {j for m in live() for j in m.held}, scaled(60), "the orphans taken over")
        taken = {j: min(t for m in live() for j2, t in [*[(s[0], s[1]) for s in m.spans], *m.since.items()]
                        if j2 == j and t > killed) for j in orphans}  # fmt: skip
        slowest = max(taken.values()) - killed
        assert slowest < 10, f"the dead member's journals were taken over after {slowest:.1f} s"
        wait_until(even, scaled(60), "two members holding 8 journals each")
        members.append(Member("D", root))
        wait_until(lambda: even() and len(members[3].held) >= 5, scaled(60), "the new member holding its share")
        wait_until(lambda: len(live()[-1].msgs) >= 20, scaled(60), "the new member consuming")
        stop.touch()
        written: dict[str, int] = {}
        for i, (w, q) in enumerate(zip(writers, wq)):
            assert w.wait(scaled(120)) == 0
            last = ""
            while (line := q.get(timeout=scaled(30))) is not None:
                last = line
            for k in range(8):
                written[f"ev.4.{8 * i + k:03x}"] = int(last.split()[1])
        expected = {(j, k) for j, n in written.items() for k in range(n)}

        def consumed() -> set[tuple[str, int]]:
            live()
            return {(j, off) for m in members for _, j, off in m.msgs}

        wait_until(lambda: consumed() >= expected, scaled(120), "every message consumed")
        assert consumed() == expected
        for m in live():
            m.kill()
    finally:
        stop.touch()
        for p in [*writers, *(m.proc for m in members)]:
            if p.poll() is None:
                p.kill()
                p.wait()
    # No journal read by two live members at once: a member reads a journal only between taking and giving
    # it up (or dying), and those spans of one journal never overlap.
    for m in members:
        for t, j, off in m.msgs:
            assert any(j2 == j and a <= t <= b for j2, a, b in m.spans), f"{m.name} read {j}:{off} without holding it"
    for j in written:
        spans = sorted((a, b, m.name) for m in members for j2, a, b in m.spans if j2 == j)
        for (_, b1, n1), (a2, _, n2) in zip(spans, spans[1:]):
            assert b1 <= a2, f"{j} held by {n1} until {b1} and by {n2} from {a2}"
    # At least once, and the replays are what the dead member consumed past its last commit.
    printed = sum(len(m.msgs) for m in members)
    assert printed - len(expected) <= 21, f"{printed - len(expected)} messages consumed twice"
