"""Several real processes on one journal: writer and reader locks, a scanner following
a writer in another process, and truncation detected under a following scanner."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time

import pytest

import sej
from testing.timing import scaled, wait_until, wait_until_scanner_waits

try:
    from tests.conftest import popen_python, run_python
except ImportError:  # tests/ run as the rootdir
    from conftest import popen_python, run_python  # type: ignore[no-redef]

CONTENT_SRC = r'''
import hashlib

TS0 = 1_600_000_000_000_000_000


def expected(off):
    """(offset, timestamp, type, key, value) of the message at `off`."""
    h = hashlib.blake2b(off.to_bytes(8, "big"), digest_size=16).digest()
    vlen = 3000 if off % 211 == 17 else (off * 7919) % 181
    value = (h * (vlen // 16 + 1))[:vlen]
    key = (b"key-%d/" % off * 20)[: off % 23]
    return (off, TS0 + off * 1_000_003, off % 256, key, value)
'''

_ns: dict[str, object] = {}
exec(CONTENT_SRC, _ns)
expected = _ns["expected"]


def spawn(code: str, *args: str, stderr: object = None) -> subprocess.Popen[str]:
    return popen_python(code, *args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr or subprocess.PIPE)


def readline(proc: subprocess.Popen[str], timeout: float | None = None) -> str:
    """One line of the child's stdout, within `timeout` (default scaled(20) s; a thread keeps it bounded)."""
    timeout = scaled(20) if timeout is None else timeout
    box: list[str] = []
    t = threading.Thread(target=lambda: box.append(proc.stdout.readline()), daemon=True)  # type: ignore[union-attr]
    t.start()
    t.join(timeout)
    if t.is_alive() or not box or not box[0]:
        proc.kill()
        _, err = proc.communicate(timeout=scaled(10))
        pytest.fail(f"child printed no line in {timeout} s (exit {proc.returncode}); stderr: {err[-3000:]}")
    return box[0].rstrip("\n")


def stop(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        proc.kill()
    try:
        proc.communicate(timeout=scaled(10))
    except (ValueError, OSError):
        proc.wait(scaled(10))


def kill9(proc: subprocess.Popen[str]) -> None:
    proc.send_signal(signal.SIGKILL)
    proc.wait(scaled(10))
    assert proc.returncode == -signal.SIGKILL


def in_thread(fn, limit: float):  # type: ignore[no-untyped-def]
    """Run fn() in a daemon thread; its result, or fail if it takes longer than `limit` s."""
    box: dict[str, object] = {}

    def run() -> None:
        try:
            box["value"] = fn()
        except BaseException as e:  # re-raised in the test's thread
            box["error"] = e

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(limit)
    if t.is_alive():
        pytest.fail(f"{fn} did not return in {limit} s")
    if "error" in box:
        raise box["error"]  # type: ignore[misc]
    return box["value"]


def scan_all(dir: str, offset: int = 0) -> list[sej.Message]:
    def run() -> list[sej.Message]:
        with sej.Scanner(dir, offset=offset, timeout=0) as s:
            return list(s)

    return in_thread(run, scaled(15))  # type: ignore[no-any-return]


def check_exact(msgs: list[sej.Message], n: int, what: str) -> None:
    offsets = [m.offset for m in msgs]
    assert offsets == list(range(n)), f"{what}: offsets are not 0..{n - 1}: {offsets[:5]}...{offsets[-5:]}"
    for m in msgs:
        assert m == expected(m.offset), f"{what}: message {m.offset} has the wrong contents"  # type: ignore[operator]


# ---------------------------------------------------------------------------
# 2. Two writers on one journal from two processes.

HOLD_WRITER = (
    CONTENT_SRC
    + r"""
import sys
import sej

w = sej.Writer(sys.argv[1], segment_size=4096, durability="flush")
for off in range(int(sys.argv[2])):
    _, ts, typ, key, value = expected(off)
    w.append(value, key=key, type=typ, timestamp=ts)
print("ready", w.next_offset, flush=True)
if sys.stdin.readline().strip() == "close":
    w.close()
    print("closed", flush=True)
    sys.stdin.readline()
"""
)

TRY_WRITER = r"""
import sys, time
import sej

t = time.monotonic()
try:
    w = sej.Writer(sys.argv[1])
except sej.LockedError as e:
    print("locked", time.monotonic() - t, e.path, "|", str(e))
else:
    print("opened", w.next_offset)
    w.close()
"""

APPEND_MORE = (
    CONTENT_SRC
    + r"""
import sys
import sej

w = sej.Writer(sys.argv[1], segment_size=4096)
start = w.next_offset
for off in range(start, start + int(sys.argv[2])):
    _, ts, typ, key, value = expected(off)
    assert w.append(value, key=key, type=typ, timestamp=ts) == off
w.close()
print("appended", start, w.next_offset)
"""
)


@pytest.mark.parametrize("release", ["sigkill", "exit", "close"])
def test_second_writer_is_locked_out_until_the_first_process_is_gone(jdir: str, release: str) -> None:
    lock_path = os.path.join(jdir, "jnl.lck")
    holder = spawn(HOLD_WRITER, jdir, "300")
    try:
        assert readline(holder) == "ready 300"

        # In this process: refused at once, naming the lock file.
        t = time.monotonic()
        with pytest.raises(sej.LockedError) as ei:
            sej.Writer(jdir, segment_size=4096)
        elapsed = time.monotonic() - t
        assert elapsed < scaled(0.5), f"LockedError took {elapsed:.3f} s"
        assert lock_path in str(ei.value)
        assert ei.value.path == lock_path

        # In a third process too.
        r = run_python(TRY_WRITER, jdir, timeout=scaled(30))
        assert r.returncode == 0, r.stderr
        word, secs, path, rest = r.stdout.split(" ", 3)
        assert word == "locked", r.stdout
        assert float(secs) < scaled(0.5), f"LockedError took {secs} s in another process"
        assert path == lock_path and lock_path in rest

        # The failed attempts changed nothing: the holder still writes, the journal is intact.
        check_exact(scan_all(jdir), 300, "while held")

        # The first writer goes away.
        if release == "sigkill":
            kill9(holder)
        elif release == "exit":
            holder.stdin.write("exit\n")  # type: ignore[union-attr]
            holder.stdin.flush()  # type: ignore[union-attr]
            assert holder.wait(scaled(20)) == 0
        else:  # closes its writer and stays alive
            holder.stdin.write("close\n")  # type: ignore[union-attr]
            holder.stdin.flush()  # type: ignore[union-attr]
            assert readline(holder) == "closed"
            assert holder.poll() is None

        # Now a new writer opens, in another process and in this one.
        r = run_python(APPEND_MORE, jdir, "50", timeout=scaled(30))
        assert r.returncode == 0, r.stderr
        assert r.stdout.split() == ["appended", "300", "350"]
        with sej.Writer(jdir, segment_size=4096) as w:
            assert w.next_offset == 350
            _, ts, typ, key, value = expected(350)  # type: ignore[operator]
            assert w.append(value, key=key, type=typ, timestamp=ts) == 350
            # ... and while this process holds it, others are locked out again.
            r = run_python(TRY_WRITER, jdir, timeout=scaled(30))
            assert r.stdout.startswith("locked "), r.stdout + r.stderr
        check_exact(scan_all(jdir), 351, "after the hand-over")
    finally:
        stop(holder)


# ---------------------------------------------------------------------------
# 3. A scanner following a writer in another process.

FOLLOWED_WRITER = (
    CONTENT_SRC
    + r"""
import sys, time
import sej

dir, n, seg, durability = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
print("up", flush=True)
sys.stdin.readline()  # "go": the scanner is running
w = sej.Writer(dir, segment_size=seg, durability=durability, buffer_size=700)
for off in range(n):
    _, ts, typ, key, value = expected(off)
    if off == n - 1:
        before_last = time.time()  # no scanner can have the last message before this
    assert w.append(value, key=key, type=typ, timestamp=ts) == off
    if durability == "buffered" and off % 5 == 4:
        w.flush()
    if off % 40 == 39:
        time.sleep(0.004)  # let the scanner catch up and wait for more
w.close()
print("done", before_last, time.time(), flush=True)
sys.stdin.readline()
"""
)


@pytest.mark.parametrize(
    "durability, n",
    [
        ("flush", 2500),
        ("buffered", 2500),
        ("sync", 2500),
        # Message 2549 is 3000 bytes (2549 % 211 == 17): the writer rolls after it, so the
        # journal ends with an empty segment, which the scanner must wait in as in any other.
        ("flush", 2550),
    ],
)
def test_scanner_follows_writer_process_across_rollovers(jdir: str, durability: str, n: int) -> None:
    # The scanners' own timeout, the behaviour under test: it must outlast any pause of the writer process,
    # so it is scaled like a deadline.
    seg, timeout = 1024, scaled(2.0)
    os.makedirs(jdir)  # an empty journal directory: the scanners wait for the first segment

    class Follower(threading.Thread):
        """One scanner following the journal from offset 0 (two run at once, independently)."""

        def __init__(self) -> None:
            super().__init__(daemon=True)
            self.got: list[sej.Message] = []
            self.error: BaseException | None = None
            self.offset = -1
            self.stopped = 0.0

        def run(self) -> None:
            try:
                with sej.Scanner(jdir, offset=0, timeout=timeout) as s:
                    for m in s:
                        self.got.append(m)
                    self.offset = s.offset
            except BaseException as e:
                self.error = e
            self.stopped = time.time()

    followers = [Follower(), Follower()]
    writer = spawn(FOLLOWED_WRITER, jdir, str(n), str(seg), durability)
    try:
        assert readline(writer) == "up"
        for f in followers:
            f.start()
        for f in followers:
            wait_until_scanner_waits(f)  # for the journal's first segment
        writer.stdin.write("go\n")  # type: ignore[union-attr]
        writer.stdin.flush()  # type: ignore[union-attr]
        word, last_at, done_at = readline(writer, timeout=scaled(60)).split()
        assert word == "done"
        for f in followers:
            f.join(timeout + scaled(20))
            assert not f.is_alive(), f"a scanner did not stop within its {timeout} s timeout ({len(f.got)} messages)"
    finally:
        stop(writer)
    for i, f in enumerate(followers):
        if f.error is not None:
            raise AssertionError(f"scanner {i} failed after {len(f.got)} messages: {f.error!r}") from f.error
        check_exact(f.got, n, f"scanner {i}")
        assert f.offset == n
        # It stopped cleanly, by its timeout, once the writer was done: not before its timeout had passed since
        # the last message was appended, not much later than its timeout after the writer finished.
        since_last, since_done = f.stopped - float(last_at), f.stopped - float(done_at)
        assert since_last >= timeout - 0.05, f"scanner {i} stopped {since_last:.2f} s after the last append"
        assert since_done <= timeout + scaled(3), f"scanner {i} stopped {since_done:.2f} s after the writer finished"
    assert len(sej.list_segments(jdir)) > 100, "expected many segment rollovers"


# ---------------------------------------------------------------------------
# 4. A segment truncated (removed, replaced) under a following scanner.


def write_journal(dir: str, n: int, segment_size: int = 1 << 20) -> None:
    with sej.Writer(dir, segment_size=segment_size) as w:
        for off in range(n):
            _, ts, typ, key, value = expected(off)  # type: ignore[operator]
            w.append(value, key=key, type=typ, timestamp=ts)


def frame_end(dir: str, path: str, count: int) -> int:
    """Byte position after the first `count` frames of a segment."""
    first = int(os.path.basename(path)[:16], 16)
    pos = 0
    for off in range(first, first + count):
        _, ts, typ, key, value = expected(off)  # type: ignore[operator]
        pos += len(sej.encode(off, ts, typ, key, value))
    return pos


@pytest.mark.parametrize("how", ["truncate-half", "truncate-last-bytes", "truncate-zero", "remove", "replace"])
def test_truncation_under_waiting_scanner_fails_fast(jdir: str, how: str) -> None:
    write_journal(jdir, 40, segment_size=2048)  # a few segments; the scanner ends up in the last
    segs = sej.list_segments(jdir)
    assert len(segs) >= 3
    last = segs[-1].path
    size = os.path.getsize(last)
    got: list[sej.Message] = []
    caught_up = threading.Event()
    box: dict[str, object] = {}

    waits = scaled(60)  # the scanner's timeout: far longer than the test waits for the error

    def follow() -> None:
        try:
            with sej.Scanner(jdir, offset=0, timeout=waits) as s:
                for m in s:
                    got.append(m)
                    if m.offset == 39:
                        caught_up.set()
        except BaseException as e:
            box["error"] = e
        box["at"] = time.monotonic()

    t = threading.Thread(target=follow, daemon=True)
    t.start()
    assert caught_up.wait(scaled(15)), f"the scanner read only {len(got)} of 40 messages"
    wait_until_scanner_waits(t)  # for more
    t0 = time.monotonic()
    if how == "truncate-half":
        os.truncate(last, frame_end(jdir, last, 1) + 7)
    elif how == "truncate-last-bytes":
        os.truncate(last, size - 3)
    elif how == "truncate-zero":
        os.truncate(last, 0)
    elif how == "remove":
        os.remove(last)
    else:  # a different file with the same name (same contents, even)
        with open(last, "rb") as src, open(last + ".new", "wb") as dst:
            dst.write(src.read())
        os.replace(last + ".new", last)
    t.join(scaled(10))
    assert not t.is_alive(), f"no error {scaled(10):g} s after '{how}' (the scanner's timeout is {waits:g} s)"
    delay = box["at"] - t0  # type: ignore[operator]
    assert isinstance(box.get("error"), sej.TruncatedError), f"{how}: expected TruncatedError, got {box.get('error')!r}"
    assert delay < scaled(2.0), f"{how}: TruncatedError came {delay:.2f} s after the change"
    check_exact(got, 40, "before the truncation")  # nothing bogus was yielded


def test_truncation_between_reads_fails_at_next_read(jdir: str) -> None:
    """No waiting involved: data was read, the segment shrinks, the next read raises at once."""
    write_journal(jdir, 30)
    (seg,) = sej.list_segments(jdir)
    s = sej.Scanner(jdir, offset=0, timeout=scaled(60), batch=1)
    try:
        first = [next(s) for _ in range(10)]
        check_exact(first, 10, "first reads")
        os.truncate(seg.path, frame_end(jdir, seg.path, 5))
        t = time.monotonic()
        with pytest.raises(sej.TruncatedError):
            in_thread(lambda: next(s), scaled(10))
        assert time.monotonic() - t < scaled(2.0)
    finally:
        s.close()


def test_truncation_of_older_segment_being_read(jdir: str) -> None:
    """The scanner is inside a finished (not the last) segment when that segment is truncated."""
    write_journal(jdir, 60, segment_size=1024)
    segs = sej.list_segments(jdir)
    assert len(segs) >= 4
    s = sej.Scanner(jdir, offset=0, timeout=scaled(60), batch=1)
    try:
        first = [next(s) for _ in range(2)]
        check_exact(first, 2, "first reads")
        assert first[-1].offset < segs[1].first_offset - 1  # still inside segment 0
        os.truncate(segs[0].path, frame_end(jdir, segs[0].path, 1))
        t = time.monotonic()
        with pytest.raises(sej.TruncatedError):
            in_thread(lambda: [next(s) for _ in range(100)], scaled(10))
        assert time.monotonic() - t < scaled(2.0)
    finally:
        s.close()


def test_truncation_while_writer_process_is_live(jdir: str) -> None:
    """A writer process holds the journal; its segment is truncated under a waiting scanner."""
    holder = spawn(HOLD_WRITER, jdir, "25")
    try:
        assert readline(holder) == "ready 25"
        seg = sej.list_segments(jdir)[-1]
        size = os.path.getsize(seg.path)
        assert size > 0
        box: dict[str, object] = {}
        n_read = []

        waits = scaled(60)  # the scanner's timeout: far longer than the test waits for the error

        def follow() -> None:
            try:
                with sej.Scanner(jdir, offset=0, timeout=waits) as s:
                    for m in s:
                        n_read.append(m.offset)
            except BaseException as e:
                box["error"] = e
            box["at"] = time.monotonic()

        t = threading.Thread(target=follow, daemon=True)
        t.start()
        wait_until(lambda: len(n_read) >= 25 or not t.is_alive(), scaled(15), "the scanner to read 25 messages")
        assert n_read == list(range(25))
        wait_until_scanner_waits(t)  # for more
        t0 = time.monotonic()
        os.truncate(seg.path, size // 2)
        t.join(scaled(10))
        assert not t.is_alive(), f"no error {scaled(10):g} s after the truncation (scanner timeout {waits:g} s)"
        assert isinstance(box.get("error"), sej.TruncatedError), repr(box.get("error"))
        assert box["at"] - t0 < scaled(2.0)  # type: ignore[operator]
    finally:
        stop(holder)


# ---------------------------------------------------------------------------
# 5. A reader offset locked by another process.

HOLD_OFFSET = r"""
import sys
import sej

o = sej.Offset(sys.argv[1], sys.argv[2])
before = o.value
o.commit(int(sys.argv[3]))
print("ready", before, flush=True)
sys.stdin.readline()
"""

TRY_OFFSET = r"""
import sys, time
import sej

t = time.monotonic()
try:
    o = sej.Offset(sys.argv[1], sys.argv[2])
except sej.LockedError as e:
    print("locked", time.monotonic() - t, e.path)
else:
    print("opened", o.value)
    o.close()
"""


def test_reader_offset_locked_by_another_process(jdir: str) -> None:
    write_journal(jdir, 20)
    lock1 = os.path.join(jdir, "ofs", "reader1.lck")
    holder = spawn(HOLD_OFFSET, jdir, "reader1", "7")
    try:
        assert readline(holder) == "ready 0"  # no committed value yet: the first offset
        t = time.monotonic()
        with pytest.raises(sej.LockedError) as ei:
            sej.Offset(jdir, "reader1")
        assert time.monotonic() - t < scaled(0.5)
        assert ei.value.path == lock1 and lock1 in str(ei.value)

        # Another process is refused too; another reader name is independent.
        r = run_python(TRY_OFFSET, jdir, "reader1", timeout=scaled(30))
        assert r.returncode == 0, r.stderr
        word, secs, path = r.stdout.split()
        assert word == "locked" and float(secs) < scaled(0.5) and path == lock1, r.stdout
        with sej.Offset(jdir, "reader2") as o2:
            assert o2.value == 0
            o2.commit(3)
            # ... and now reader2 is the one held, by this process.
            r = run_python(TRY_OFFSET, jdir, "reader2", timeout=scaled(30))
            assert r.stdout.split()[0] == "locked", r.stdout + r.stderr
        # The writer lock is a different lock.
        with sej.Writer(jdir) as w:
            assert w.next_offset == 20

        kill9(holder)
        with sej.Offset(jdir, "reader1") as o1:
            assert o1.value == 7  # committed by the killed process
        r = run_python(TRY_OFFSET, jdir, "reader2", timeout=scaled(30))
        assert r.stdout.split() == ["opened", "3"], r.stdout + r.stderr
        assert sej.list_readers(jdir) == ["reader1", "reader2"]
    finally:
        stop(holder)
