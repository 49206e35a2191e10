"""Reader offsets: locking, defaults, atomic commits, validation."""

from __future__ import annotations

import os
import time

import pytest

import sej
from sej.offset import read_offset_file
from testing.timing import scaled


@pytest.fixture
def journal(jdir: str) -> str:
    with sej.Writer(jdir, segment_size=300) as w:
        w.append_many([b"x" * 20] * 40)
    return jdir


def test_defaults_first_and_last(journal: str) -> None:
    os.remove(sej.list_segments(journal)[0].path)
    first = sej.first_offset(journal)
    assert first > 0
    with sej.Offset(journal, "a") as o:
        assert o.value == first
    with sej.Offset(journal, "b", default="last") as o:
        assert o.value == 40
    assert not os.path.exists(os.path.join(journal, "ofs", "a.ofs")), "nothing is written until commit"


def test_commit_is_eight_bytes_big_endian_and_persists(journal: str) -> None:
    with sej.Offset(journal, "reader-1_x") as o:
        o.commit(0x0102030405060708)
        assert o.value == 0x0102030405060708
    path = os.path.join(journal, "ofs", "reader-1_x.ofs")
    assert open(path, "rb").read() == bytes([1, 2, 3, 4, 5, 6, 7, 8])
    with sej.Offset(journal, "reader-1_x") as o:
        assert o.value == 0x0102030405060708
    assert sej.list_readers(journal) == ["reader-1_x"]
    assert not [f for f in os.listdir(os.path.join(journal, "ofs")) if f.endswith(".tmp")]


def test_reader_lock_in_same_process(journal: str) -> None:
    o = sej.Offset(journal, "r")
    with pytest.raises(sej.LockedError, match="r.lck"):
        sej.Offset(journal, "r")
    o.close()
    o.close()
    with pytest.raises(sej.ClosedError):
        o.commit(3)
    sej.Offset(journal, "r").close()
    assert os.path.exists(os.path.join(journal, "ofs", "r.lck"))


@pytest.mark.parametrize("name", ["", "a b", "../x", "a/b", ".", "..", "x.ofs", "r\0", "é", "a" * 201, None, 5])
def test_bad_reader_names(journal: str, name: object) -> None:
    with pytest.raises(sej.InvalidArgumentError, match="reader name"):
        sej.Offset(journal, name)  # type: ignore[arg-type]


def test_names_are_anchored(journal: str) -> None:
    with pytest.raises(sej.InvalidArgumentError):
        sej.Offset(journal, "ok\n")


@pytest.mark.parametrize("value", [-1, 2**64, 1.0, "3", True, None])
def test_bad_commit_values(journal: str, value: object) -> None:
    with sej.Offset(journal, "r") as o, pytest.raises(sej.InvalidArgumentError, match="offset must be"):
        o.commit(value)  # type: ignore[arg-type]


def test_bad_default_and_missing_journal(journal: str, tmp_path) -> None:
    with pytest.raises(sej.InvalidArgumentError, match="default"):
        sej.Offset(journal, "r", default="middle")  # type: ignore[arg-type]
    with pytest.raises(sej.InvalidArgumentError, match="does not exist"):
        sej.Offset(str(tmp_path / "missing"), "r")


@pytest.mark.parametrize("content", [b"\0", b"\0" * 7, b"\0" * 9])
def test_malformed_offset_file_is_a_corruption_error(journal: str, content: bytes) -> None:
    os.makedirs(os.path.join(journal, "ofs"), exist_ok=True)
    with open(os.path.join(journal, "ofs", "r.ofs"), "wb") as f:
        f.write(content)
    with pytest.raises(sej.CorruptionError, match="not 8"):
        sej.Offset(journal, "r")
    # The lock was released on failure.
    os.remove(os.path.join(journal, "ofs", "r.ofs"))
    sej.Offset(journal, "r").close()


# A commit stopped for good between writing its 8 bytes and their fdatasync: os.fdatasync announces itself and
# blocks, and the test SIGKILLs the process there.
KILLED_COMMIT = r"""
import os, sys, threading
import sej
from sej.offset import read_offset_file
with sej.Offset(sys.argv[1], "r") as o:
    o.commit(5)
    os.fdatasync = lambda fd: (print("in fdatasync", flush=True), threading.Event().wait())
    o.commit(7)
"""


def test_a_killed_commit_leaves_the_old_or_the_new_value_and_stale_temp_files_go(journal: str) -> None:
    """`Offset.commit` killed mid-way leaves 8 bytes: the old value or the new one (the write is in place, so
    here the new one, short of its fdatasync). Commit temp files left by older versions or by the hub over
    SFTP are removed on the next open once nobody has touched them for STALE_TEMP_AGE; nothing else is."""
    import signal
    import subprocess

    from .conftest import popen_python

    ofs = os.path.join(journal, "ofs")
    p = popen_python(KILLED_COMMIT, journal, stdout=subprocess.PIPE)
    try:
        assert p.stdout is not None and p.stdout.readline() == "in fdatasync\n"
    finally:
        p.kill()
        assert p.wait(30) == -signal.SIGKILL
    assert os.path.getsize(os.path.join(ofs, "r.ofs")) == 8
    assert not [f for f in os.listdir(ofs) if f.endswith(".tmp")], "an in-place commit makes no temp file"
    left = "r.ofs.0123456789abcdef.tmp"  # a commit's temp file, as older versions made them
    young = "q.ofs.0123456789abcdef.tmp"  # a commit of another reader that may still be under way
    other = "r.ofs.keep.tmp"  # not a name a commit makes
    for name in (left, young, other):
        open(os.path.join(ofs, name), "wb").close()
    old = os.stat(os.path.join(ofs, left)).st_mtime - 86400  # a day: far past sej.offset.STALE_TEMP_AGE
    for name in (left, other):
        os.utime(os.path.join(ofs, name), (old, old))
    with sej.Offset(journal, "r") as o:
        assert o.value == 7  # written in place before the fdatasync that never returned
    assert sorted(f for f in os.listdir(ofs) if f.endswith(".tmp")) == sorted([young, other])
    assert sej.list_readers(journal) == ["r"]


def test_commit_never_writes_through_a_symlink_at_a_temp_name(journal: str, tmp_path) -> None:
    """The temp file was `ofs/<reader>.ofs.<pid>.tmp`, opened with O_TRUNC through any symlink planted there;
    it is now created exclusively under a random name, and an offset file that is a symlink is refused."""
    victim = tmp_path / "victim"
    victim.write_bytes(b"someone else's file\n")
    ofs = os.path.join(journal, "ofs")
    os.makedirs(ofs)
    os.symlink(victim, os.path.join(ofs, f"r.ofs.{os.getpid()}.tmp"))
    with sej.Offset(journal, "r") as o:
        o.commit(11)
    assert victim.read_bytes() == b"someone else's file\n"
    assert not os.path.islink(os.path.join(ofs, "r.ofs"))
    with sej.Offset(journal, "r") as o:
        assert o.value == 11
    os.remove(os.path.join(ofs, "r.ofs"))
    os.symlink(victim, os.path.join(ofs, "r.ofs"))
    with pytest.raises(sej.UnsafeFileError, match=r"r\.ofs is a symlink, not a regular file"):
        sej.Offset(journal, "r")


def test_commits_overwrite_the_file_in_place_and_sync_false_waits_for_sync(journal: str) -> None:
    """The first commit creates the file; later ones overwrite its 8 bytes (same inode, no temp file). Without
    `sync` the value is written (another open sees it) and `sync()` makes it durable; an empty file (the Go
    original creates one at open) is overwritten in place too."""
    path = os.path.join(journal, "ofs", "r.ofs")
    with sej.Offset(journal, "r") as o:
        assert not os.path.exists(path)
        o.commit(3)
        ino = os.stat(path).st_ino
        o.commit(9, sync=False)
        assert read_offset_file(path) == 9 and os.stat(path).st_ino == ino
        o.sync()
        o.commit(12)
        assert os.stat(path).st_ino == ino and os.path.getsize(path) == 8
    assert not [f for f in os.listdir(os.path.dirname(path)) if f.endswith(".tmp")]
    open(os.path.join(journal, "ofs", "go.ofs"), "wb").close()  # as Go's NewOffset leaves it
    with sej.Offset(journal, "go") as o:
        assert o.value == sej.first_offset(journal)  # empty: nothing committed
        ino = os.stat(os.path.join(journal, "ofs", "go.ofs")).st_ino
        o.commit(5, sync=False)
        o.sync()
    assert read_offset_file(os.path.join(journal, "ofs", "go.ofs")) == 5
    assert os.stat(os.path.join(journal, "ofs", "go.ofs")).st_ino == ino


def test_a_file_grown_under_the_reader_is_replaced_whole(journal: str) -> None:
    """A commit finding anything but 0 or 8 bytes (garbage appended behind the reader's back) does not write
    into it: the file is replaced through a temp file and a rename."""
    path = os.path.join(journal, "ofs", "r.ofs")
    with sej.Offset(journal, "r") as o:
        o.commit(4)
        with open(path, "ab") as f:
            f.write(b"junk")
        o.commit(6)
    assert open(path, "rb").read() == (6).to_bytes(8, "big")


# Commits, as fast as they go, alternate between two values whose 8 bytes all differ: a read that saw part of
# each would be neither.
COMMITTER = r"""
import sys
import sej
from sej.offset import read_offset_file
A, B = 0x0101010101010101, 0xFEFEFEFEFEFEFEFE
with sej.Offset(sys.argv[1], "r") as o:
    o.commit(A)
    print("ready", flush=True)
    while True:
        o.commit(B, sync=False)
        o.commit(A, sync=False)
"""


def test_readers_never_see_a_torn_value_while_another_process_commits(journal: str) -> None:
    """Overwriting in place means a reader racing a commit could read part of the old value and part of the
    new one; read_offset_file reads until two reads agree. A real process commits while this one reads."""
    import subprocess

    from .conftest import popen_python

    path = os.path.join(journal, "ofs", "r.ofs")
    p = popen_python(COMMITTER, journal, stdout=subprocess.PIPE)
    try:
        assert p.stdout is not None and p.stdout.readline() == "ready\n"
        seen: set[int | None] = set()
        reads, deadline = 0, time.monotonic() + scaled(60)
        while (reads < 20_000 or len(seen) < 2) and time.monotonic() < deadline:
            seen.add(read_offset_file(path))
            reads += 1
    finally:
        p.kill()
        p.wait(30)
    assert seen <= {0x0101010101010101, 0xFEFEFEFEFEFEFEFE}, f"torn values read: {seen}"
    assert len(seen) == 2  # the commits did race the reads


def test_a_hard_linked_offset_file_is_replaced_not_written_through(journal: str, tmp_path) -> None:
    """Overwriting in place would write into every file linked to the .ofs file: with more than one link the
    commit replaces the name (temp file and rename) and the other file keeps its bytes."""
    other = tmp_path / "elsewhere"
    other.write_bytes(bytes(8))
    path = os.path.join(journal, "ofs", "r.ofs")
    os.makedirs(os.path.dirname(path))
    os.link(other, path)
    with sej.Offset(journal, "r") as o:
        o.commit(2)
    assert other.read_bytes() == bytes(8)
    assert read_offset_file(path) == 2 and os.stat(path).st_nlink == 1
