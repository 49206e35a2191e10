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
