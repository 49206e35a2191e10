"""A writer left open when its process exits, or inherited by a forked child: real processes.

At exit an unclosed writer is closed by its __del__ while daemon threads can no longer run;
a forked child shares the parent's files and lock, so it must neither write nor unlock.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

import sej
from testing.timing import scaled

from .conftest import run_python


def values(d: Path) -> list[bytes]:
    with sej.Scanner(d, 0, timeout=0) as s:
        return [m.value for m in s]


SLOW_DISK = r"""
import os, threading, time
import sej.commit

started = threading.Event()


def slow(fd):  # a slow disk: the committer is inside its fdatasync when the process exits
    started.set()
    time.sleep(0.5)
    os.fdatasync(fd)


sej.commit._fdatasync = slow
"""

EXIT_DURING_FSYNC = r"""
import sys
sys.path.insert(0, sys.argv[2])
import sej
import slowdisk

w = sej.Writer(sys.argv[1])
w.submit(b"acked later")
assert slowdisk.started.wait(60)
print("exiting", flush=True)
"""


def test_a_process_exits_while_its_committer_thread_fsyncs(tmp_path: Path) -> None:
    """The committer (a daemon thread) stops for good once finalization begins: close() must not wait for it."""
    (tmp_path / "slowdisk.py").write_text(SLOW_DISK)
    d = tmp_path / "j"
    try:
        p = run_python(EXIT_DURING_FSYNC, str(d), str(tmp_path), timeout=scaled(30))
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"the process hung at exit: {e.stdout!r}")
    assert (p.returncode, p.stdout, p.stderr) == (0, "exiting\n", "")
    assert values(d) == [b"acked later"]


FORK = r"""
import os, sys, time
import sej

d, mode = sys.argv[1], sys.argv[2]
w = sej.Writer(d)
w.append(b"parent-1")  # buffered in the parent
if mode == "submit":  # the committer thread busy at the fork
    for _ in range(200):
        w.submit(b"s")
pid = os.fork()
if pid == 0:
    try:
        w.append(b"child")
    except sej.ClosedError as e:
        print("child:", e, flush=True)
    w.close()  # nothing to do here: neither the parent's buffer written again nor its lock released
    sys.exit(0)  # a normal exit: finalization runs, and with it every __del__
_, status = os.waitpid(pid, 0)
print("child exit", os.waitstatus_to_exitcode(status), flush=True)
try:
    sej.Writer(d)
    print("a second writer opened the journal", flush=True)
except sej.LockedError:
    print("still locked", flush=True)
w.append(b"parent-2")
w.close()
"""


@pytest.mark.parametrize("mode", ["buffered", "submit"])
def test_a_forked_child_neither_writes_nor_unlocks_its_parents_writer(tmp_path: Path, mode: str) -> None:
    d = tmp_path / "j"
    try:
        p = run_python(FORK, str(d), mode, timeout=scaled(30))
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"hung: {e.stdout!r}")
    lines = p.stdout.splitlines()
    assert p.returncode == 0, p.stderr
    assert len(lines) == 3, p.stdout
    assert lines[0].startswith(f"child: writer of {d} belongs to process ") and "forked from" in lines[0]
    assert lines[1:] == ["child exit 0", "still locked"]
    expect = [b"parent-1"] + [b"s"] * (200 if mode == "submit" else 0) + [b"parent-2"]
    assert values(d) == expect


def test_a_writer_collected_in_a_reference_cycle_is_fsynced_and_unlocked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its __del__ runs with its weak references dead: close() must still lead its own fsync."""
    import gc
    import warnings

    import sej.commit

    fsyncs: list[int] = []
    real = sej.commit._fdatasync

    def counted(fd: int) -> None:
        real(fd)
        fsyncs.append(fd)

    d = tmp_path / "j"

    class Holder:
        pass

    h = Holder()
    h.w = sej.Writer(d)  # type: ignore[attr-defined]
    h.self = h  # type: ignore[attr-defined]
    h.w.append(b"buffered")  # type: ignore[attr-defined]
    monkeypatch.setattr(sej.commit, "_fdatasync", counted)
    del h
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        gc.collect()
    assert fsyncs, "closed without an fsync"
    assert values(d) == [b"buffered"]
    with sej.Writer(d) as again:  # unlocked
        assert again.next_offset == 1


DAEMON_AT_EXIT = r"""
import sys, threading, time
import sej

w = sej.Writer(sys.argv[1])
for i in range(1000):
    w.append(b"m%d" % i)  # buffered, never flushed

def heartbeat():  # any daemon thread of this module keeps its globals, and so the writer, alive at exit
    while True:
        time.sleep(1)

threading.Thread(target=heartbeat, daemon=True).start()
print("exiting", flush=True)
"""


def test_an_unclosed_writer_is_closed_at_exit_even_with_a_daemon_thread_running(tmp_path: Path) -> None:
    d = tmp_path / "j"
    p = run_python(DAEMON_AT_EXIT, str(d), timeout=scaled(30))
    assert (p.returncode, p.stdout, p.stderr) == (0, "exiting\n", "")
    assert values(d) == [b"m%d" % i for i in range(1000)]


FORK_AND_DIE = r"""
import os, sys, time
import sej

w = sej.Writer(sys.argv[1])
w.append(b"parent")
w.flush()
child = os.fork()
if child == 0:
    os.write(1, b"child forked\n")  # its at-fork hooks have run (one write: lines do not interleave)
    sys.stdin.read()  # lives until the test closes our stdin
    os._exit(0)
os.write(1, b"%d\n" % child)
sys.stdin.read()
"""


def test_a_forked_child_that_outlives_its_parent_does_not_keep_the_journal_locked(tmp_path: Path) -> None:
    """The parent is SIGKILLed; its producer is restarted while the forked child still runs."""
    import os
    import signal

    from .conftest import popen_python

    d = tmp_path / "j"
    parent = popen_python(FORK_AND_DIE, str(d), stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert parent.stdout is not None and parent.stdin is not None
    lines = sorted(parent.stdout.readline().strip() for _ in range(2))  # the two processes, in any order
    assert lines[1] == "child forked", lines
    child = int(lines[0])
    try:
        with pytest.raises(sej.LockedError):
            sej.Writer(d)  # the parent holds it
        parent.send_signal(signal.SIGKILL)
        parent.wait(timeout=scaled(30))
        os.kill(child, 0)  # still alive
        with sej.Writer(d) as restarted:
            assert restarted.next_offset == 1
    finally:
        parent.stdin.close()  # the child's stdin too: it exits
        try:
            os.kill(child, signal.SIGKILL)
        except ProcessLookupError:
            pass


FORK_SHARDED = r"""
import os, sys
import sej
from sej.shard.group import Membership

root, journal = sys.argv[1], sys.argv[2]
sw = sej.ShardedWriter(root, "s", shard_bit=1)
sw.writer(0).append(b"parent")
with sej.Writer(journal) as w:
    w.append(b"m")
reader = sej.Offset(journal, "r1")
member = Membership(root, "g1")
pid = os.fork()
if pid == 0:
    try:
        sw.writer(1)  # a shard the parent has not opened: it would take that shard's lock
    except sej.ClosedError as e:
        print("child:", e, flush=True)
    sw.close()
    reader.close()
    member.close()
    os._exit(0)
os.waitpid(pid, 0)
print("member file kept", os.path.exists(member.path), flush=True)
print("parent opens shard 1", sw.writer(1).next_offset, flush=True)
sys.stdout.flush()
import subprocess
r = subprocess.run([sys.executable, "-c", "import sej, sys; sej.Offset(sys.argv[1], 'r1')", journal],
                   capture_output=True, text=True)
print("reader still locked", "LockedError" in r.stderr, flush=True)
sw.close()
"""


def test_a_forked_child_leaves_its_parents_shards_reader_lock_and_group_membership_alone(tmp_path: Path) -> None:
    p = run_python(FORK_SHARDED, str(tmp_path / "root"), str(tmp_path / "j"), timeout=scaled(60))
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    assert lines[0].startswith("child: sharded writer of ") and "forked from" in lines[0], lines
    assert lines[1:] == ["member file kept True", "parent opens shard 1 0", "reader still locked True"]
