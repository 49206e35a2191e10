"""One writer per journal, whatever happens to jnl.lck: real processes.

A writer locks jnl.lck (as the Go writer does) and the jnl/ directory itself, which no
deletion or rename of jnl.lck can unlock (issue 38, section 2).
"""

from __future__ import annotations

import fcntl
import os
import signal
import subprocess
from pathlib import Path

import pytest

import sej
from testing.timing import scaled

from .conftest import popen_python, run_python

# Writer A: appends, flushes, then obeys one command a line: "append <value>", "close", "exit".
HOLD = r"""
import sys
import sej

w = sej.Writer(sys.argv[1])
w.append(b"from A")
w.flush()
print("ready", flush=True)
for line in sys.stdin:
    cmd, _, arg = line.strip().partition(" ")
    try:
        if cmd == "append":
            w.append(arg.encode())
            w.flush()
        elif cmd == "close":
            w.close()
        print("ok", flush=True)
    except sej.SejError as e:
        print(type(e).__name__, flush=True)
"""

# Writer B, in a process of its own: "locked <path>" or "opened <next offset>" (then it appends).
TRY = r"""
import sys
import sej

try:
    w = sej.Writer(sys.argv[1])
except sej.LockedError as e:
    print("locked", e.path)
else:
    print("opened", w.next_offset)
    w.append(b"from B")
    w.close()
"""

# A Go writer, as far as locks go (h12.io/sej lock.go): create jnl.lck, flock it; on close unlock and delete it.
GO_LOCK = r"""
import fcntl, os, sys

path = os.path.join(sys.argv[1], "jnl.lck")
fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
try:
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
except BlockingIOError:
    print("locked", flush=True)
    sys.exit(0)
print("holding", flush=True)
sys.stdin.readline()
fcntl.flock(fd, fcntl.LOCK_UN)
os.remove(path)
os.close(fd)
print("released", flush=True)
"""


def values(d: Path) -> list[tuple[int, bytes]]:
    with sej.Scanner(d, 0, timeout=0) as s:
        return [(m.offset, m.value) for m in s]


def ask(p: subprocess.Popen[str], line: str | None = None) -> str:
    assert p.stdin is not None and p.stdout is not None
    if line is not None:
        p.stdin.write(line + "\n")
        p.stdin.flush()
    return p.stdout.readline().strip()


def try_writer(d: Path) -> str:
    r = run_python(TRY, str(d), timeout=scaled(30))
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


def held(path: Path) -> bool:
    """Whether another open file holds an flock on `path` (a file or a directory); tests without keeping it."""
    fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # releases it if this took it
    return False


def replace_lock_file(d: Path, how: str) -> None:
    lck = d / "jnl.lck"
    if how == "deleted":
        os.remove(lck)
    else:  # an editor's or a deploy tool's rename over it
        (d / "jnl.lck.new").write_bytes(b"")
        os.replace(d / "jnl.lck.new", lck)


@pytest.mark.parametrize("how", ["deleted", "replaced"])
@pytest.mark.parametrize("end", ["close", "sigkill"])
def test_a_second_writer_is_refused_after_jnl_lck_is_deleted_or_replaced(tmp_path: Path, how: str, end: str) -> None:
    d = tmp_path / "j"
    a = popen_python(HOLD, str(d), stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert ask(a) == "ready"
        replace_lock_file(d, how)

        assert try_writer(d) == f"locked {d / 'jnl'}"  # another process: refused, naming what is held
        with pytest.raises(sej.LockedError) as e:
            sej.Writer(d)  # this process too
        assert e.value.path == str(d / "jnl") and str(d / "jnl") in str(e.value)
        assert not held(d / "jnl.lck"), "a refused writer released the jnl.lck it took"

        # A still owns the journal, but a Go writer could now lock the new jnl.lck: A stops writing.
        assert ask(a, "append more") == "LockLostError"
        if end == "close":
            assert ask(a, "close") == "LockLostError"  # close releases its files, then reports it
            assert a.stdin is not None
            a.stdin.close()
            assert a.wait(timeout=scaled(30)) == 0
        else:
            a.send_signal(signal.SIGKILL)
            a.wait(timeout=scaled(30))
    finally:
        if a.poll() is None:
            a.kill()
            a.wait()

    assert not held(d / "jnl"), "the directory lock went with writer A"
    assert try_writer(d) == "opened 1"  # now B gets in, after A's one message
    assert values(d) == [(0, b"from A"), (1, b"from B")]


def test_a_go_writer_holding_only_jnl_lck_keeps_a_sej_writer_out(tmp_path: Path) -> None:
    """And the refused sej writer does not keep jnl/ locked: a sej writer opens once the Go writer closed."""
    d = tmp_path / "j"
    with sej.Writer(d) as w:
        w.append(b"sej")
    go = popen_python(GO_LOCK, str(d), stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert ask(go) == "holding"
        assert try_writer(d) == f"locked {d / 'jnl.lck'}"
        with pytest.raises(sej.LockedError) as e:
            sej.Writer(d)
        assert e.value.path == str(d / "jnl.lck")
        assert not held(d / "jnl"), "a writer refused by jnl.lck left jnl/ locked"
        assert ask(go, "close") == "released"
        assert go.wait(timeout=scaled(30)) == 0
    finally:
        if go.poll() is None:
            go.kill()
            go.wait()
    assert not (d / "jnl.lck").exists()  # the Go writer deleted it, as h12.io/sej does
    assert try_writer(d) == "opened 1"
    assert values(d) == [(0, b"sej"), (1, b"from B")]


def test_a_go_writer_gets_in_after_jnl_lck_is_deleted_and_the_sej_writer_stops(tmp_path: Path) -> None:
    """What the directory lock cannot do: a Go writer takes only jnl.lck. The sej writer then stops writing
    (LockLostError) rather than interleave frames with it."""
    d = tmp_path / "j"
    a = popen_python(HOLD, str(d), stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    go = None
    try:
        assert ask(a) == "ready"
        os.remove(d / "jnl.lck")
        go = popen_python(GO_LOCK, str(d), stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        assert ask(go) == "holding"
        assert ask(a, "append more") == "LockLostError"
        assert ask(go, "close") == "released"
    finally:
        for p in (a, go):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait()
    assert values(d) == [(0, b"from A")]


FORK = r"""
import os, sys
import sej

d = sys.argv[1]
w = sej.Writer(d)
w.append(b"parent")
pid = os.fork()
if pid == 0:
    w.close()  # disowned here: closes the child's copies of both locks, unlocks nothing
    os._exit(0)
_, status = os.waitpid(pid, 0)
os.remove(os.path.join(d, "jnl.lck"))
print("child exit", os.waitstatus_to_exitcode(status), flush=True)
sys.stdin.readline()
"""


def test_a_forked_child_does_not_release_its_parents_directory_lock(tmp_path: Path) -> None:
    d = tmp_path / "j"
    p = popen_python(FORK, str(d), stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert ask(p) == "child exit 0"
        assert try_writer(d) == f"locked {d / 'jnl'}"  # jnl.lck is gone: only jnl/'s lock keeps B out
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert try_writer(d) == "opened 0"  # the parent died with its buffered message, and its lock


def test_jnl_as_a_symlink_is_refused(tmp_path: Path) -> None:
    """The directory lock is never taken through a symlink (nor is the journal written through one)."""
    d = tmp_path / "j"
    (tmp_path / "elsewhere").mkdir()
    d.mkdir()
    os.symlink(tmp_path / "elsewhere", d / "jnl")
    with pytest.raises(sej.UnsafeFileError) as e:
        sej.Writer(d)
    assert e.value.path == str(d / "jnl") and e.value.kind == "symlink"
    assert not held(d / "jnl.lck"), "the refused writer released jnl.lck"
    assert list((tmp_path / "elsewhere").iterdir()) == []


def test_tools_that_change_a_journal_see_its_writer_after_jnl_lck_is_deleted(tmp_path: Path) -> None:
    """`sej verify --repair` and `--seal` (which cut and seal segments), the hub's copy into a journal, and the CLI's
    check for a running writer hold or look at both locks, as a writer does: a deleted jnl.lck does not let them
    change a journal under its live writer."""
    from sej.apps.cli.target import writer_running
    from sej.hub.copy import _Destination

    d = tmp_path / "j"
    a = popen_python(HOLD, str(d), stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert ask(a) == "ready"
        with (d / "jnl" / "0000000000000000.jnl").open("ab") as f:
            f.write(b"torn")  # a tail --repair would cut if it could
        os.remove(d / "jnl.lck")
        assert writer_running(str(d)) is True
        for flag in ("--repair", "--seal"):
            r = run_python("from sej.apps.cli.main import main; main()", "verify", flag, str(d), timeout=scaled(60))
            assert r.returncode == 1 and "a writer holds its lock" in r.stderr and str(d / "jnl") in r.stderr, r.stderr
        assert (d / "jnl" / "0000000000000000.jnl").read_bytes().endswith(b"torn")  # nothing cut
        with pytest.raises(sej.LockedError):
            _Destination(str(d))
        assert not held(d / "jnl.lck"), "a refused tool released the jnl.lck it took"
    finally:
        a.kill()
        a.wait(timeout=scaled(30))
    assert writer_running(str(d)) is False
