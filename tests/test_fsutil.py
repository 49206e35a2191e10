"""sej.fsutil: nothing but a regular file is opened, nothing is followed, nothing blocks (real files, FIFOs,
sockets, devices)."""

from __future__ import annotations

import os
import socket

import pytest

import sej
from sej.fsutil import open_dir, open_lock_file, open_regular, read_regular
from sej.lock import lock_file, unlock_file


@pytest.fixture
def tree(tmp_path) -> str:
    d = tmp_path / "t"
    d.mkdir()
    (d / "file").write_bytes(b"12345678")
    (d / "dir").mkdir()
    os.symlink(d / "file", d / "link")
    os.symlink(d / "dir", d / "dirlink")
    os.mkfifo(d / "fifo")
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(d / "sock"))
    s.close()
    return str(d)


@pytest.mark.parametrize("name,what", [("link", "symlink"), ("fifo", "FIFO"), ("dir", "directory"),
                                       ("sock", "socket"), ("dirlink", "symlink")])  # fmt: skip
def test_open_regular_refuses_what_is_not_a_regular_file(tree: str, name: str, what: str) -> None:
    path = os.path.join(tree, name)
    with pytest.raises(sej.UnsafeFileError) as e:
        open_regular(path)
    assert str(e.value) == f"{path} is a {what}, not a regular file: refusing to open it"
    assert (e.value.path, e.value.kind) == (path, what)
    with pytest.raises(sej.UnsafeFileError):
        read_regular(path, 9)


def test_open_regular_refuses_a_device_without_opening_it() -> None:
    with pytest.raises(sej.UnsafeFileError, match="/dev/null is a character device"):
        open_regular("/dev/null")


def test_regular_files_and_directories_open_relative_to_a_directory_descriptor(tree: str) -> None:
    assert read_regular(os.path.join(tree, "file"), 9) == b"12345678"
    d = open_dir(tree)
    try:
        fd = open_regular("file", dir_fd=d, show="shown")
        try:
            assert os.read(fd, 9) == b"12345678" and os.get_blocking(fd)
        finally:
            os.close(fd)
        os.close(open_dir("dir", dir_fd=d))
        with pytest.raises(sej.UnsafeFileError, match="^shown is a symlink, not a directory"):
            open_dir("dirlink", dir_fd=d, show="shown")
        with pytest.raises(sej.UnsafeFileError, match="is a FIFO, not a directory"):
            open_dir("fifo", dir_fd=d)
        with pytest.raises(FileNotFoundError):
            open_regular("missing", dir_fd=d)
    finally:
        os.close(d)
    os.close(open_dir(os.path.join(tree, "dirlink"), follow=True))  # only when asked


def test_lock_files_are_never_followed_nor_a_fifo(tree: str) -> None:
    for name, what in (("link", "symlink"), ("fifo", "FIFO"), ("sock", "socket")):
        with pytest.raises(sej.UnsafeFileError, match=f"is a {what}, not a regular file"):
            lock_file(os.path.join(tree, name))
    assert open(os.path.join(tree, "file"), "rb").read() == b"12345678"
    unlock_file(lock_file(os.path.join(tree, "new.lck")))
    os.close(open_lock_file(os.path.join(tree, "new.lck")))


def test_a_segment_that_is_a_symlink_or_fifo_is_refused_by_every_reader(tmp_path) -> None:
    """list_segments followed symlinks (DirEntry.is_file()): a journal read another file through one."""
    j = str(tmp_path / "j")
    with sej.Writer(j, segment_size=200) as w:
        w.append_many([b"m%d" % i for i in range(40)])
    segs = sej.list_segments(j)
    os.remove(segs[-1].path)
    os.symlink(segs[0].path, segs[-1].path)
    with pytest.raises(sej.UnsafeFileError, match=f"^{segs[-1].path} is a symlink, not a regular file"):
        sej.list_segments(j)
    os.remove(segs[-1].path)
    os.mkfifo(segs[-1].path)
    with pytest.raises(sej.UnsafeFileError, match="is a FIFO"):
        sej.next_offset(j)
