"""File-system helpers: safe opens in trees sej does not trust, fsync of directories, atomic writes.

Opening files in a tree sej does not trust: never through a symlink, never a FIFO or a device.

A producer's journals (read by the hub), reader offset files (read by retention)
and lock files may have been replaced by anything. Every open here

- lstats the path first and refuses anything but the expected type, so that a
  device or a FIFO is never even opened,
- opens with O_NOFOLLOW (a symlink swapped in meanwhile fails with ELOOP) and,
  for files, O_NONBLOCK (a FIFO swapped in meanwhile cannot block the open),
- fstats the descriptor it got and refuses it unless it is the expected type.

A refusal is an UnsafeFileError naming the path and what it is. A missing path
raises FileNotFoundError as usual. Paths may be relative to a directory
descriptor (`dir_fd`), which is how a tree is walked without following a
symlinked directory: open each directory with `open_dir` relative to its parent.
"""

from __future__ import annotations

import errno
import os
import platform
import secrets
import stat
import sys
from collections.abc import Callable
from typing import IO

from .errors import UnsafeFileError

_KINDS = (
    (stat.S_ISLNK, "symlink"),
    (stat.S_ISFIFO, "FIFO"),
    (stat.S_ISDIR, "directory"),
    (stat.S_ISSOCK, "socket"),
    (stat.S_ISCHR, "character device"),
    (stat.S_ISBLK, "block device"),
    (stat.S_ISREG, "regular file"),
)

_NOFOLLOW = os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NOCTTY


def kind(mode: int) -> str:
    """What a file of this st_mode is, in words: "symlink", "FIFO", "directory", ..."""
    for test, name in _KINDS:
        if test(mode):
            return name
    return f"file of type {stat.S_IFMT(mode):#o}"


def _lkind(path: str, dir_fd: int | None) -> str:
    try:
        return kind(os.stat(path, dir_fd=dir_fd, follow_symlinks=False).st_mode)
    except OSError:
        return "file that changed while it was opened"


def open_regular(path: str, flags: int = os.O_RDONLY, *, dir_fd: int | None = None, show: str | None = None) -> int:
    """A descriptor of the regular file `path` opened with `flags` (without O_CREAT); close it.

    `show` is the path named in errors (default `path`). UnsafeFileError when it is
    anything but a regular file; FileNotFoundError when it does not exist.
    """
    name = show or path
    st = os.stat(path, dir_fd=dir_fd, follow_symlinks=False)
    if not stat.S_ISREG(st.st_mode):
        raise UnsafeFileError(name, kind(st.st_mode))
    try:
        fd = os.open(path, flags | os.O_NONBLOCK | _NOFOLLOW, dir_fd=dir_fd)
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.ENXIO, errno.EISDIR):  # swapped since the lstat
            raise UnsafeFileError(name, _lkind(path, dir_fd)) from None
        raise
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise UnsafeFileError(name, kind(mode))
        if not flags & os.O_NONBLOCK:
            os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


_MODES = {"rb": os.O_RDONLY, "r+b": os.O_RDWR, "a+b": os.O_RDWR | os.O_APPEND}


def open_file(path: str, mode: str = "rb") -> IO[bytes]:
    """The regular file `path` as an unbuffered file object (see open_regular): "rb", "r+b", or "a+b".

    "a+b" creates the file if it is missing (never through a symlink).
    """
    flags = _MODES[mode]
    try:
        fd = open_regular(path, flags)
    except FileNotFoundError:
        if mode != "a+b":
            raise
        fd = os.open(path, flags | os.O_CREAT | _NOFOLLOW, 0o644)
    return os.fdopen(fd, mode, buffering=0)


def read_regular(path: str, limit: int, *, dir_fd: int | None = None, show: str | None = None) -> bytes:
    """At most `limit` bytes from the start of the regular file `path` (see open_regular)."""
    fd = open_regular(path, dir_fd=dir_fd, show=show)
    try:
        chunks = []
        left = limit
        while left > 0:
            data = os.read(fd, min(left, 1 << 20))  # os.read allocates what it is asked for
            if not data:
                break
            chunks.append(data)
            left -= len(data)
        return b"".join(chunks)
    finally:
        os.close(fd)


def create_exclusive(path: str, *, dir_fd: int | None = None, mode: int = 0o644) -> int:
    """A descriptor (write only) of a new regular file: O_CREAT|O_EXCL never follows a symlink nor reuses a file."""
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW, mode, dir_fd=dir_fd)


def open_dir(path: str, *, dir_fd: int | None = None, show: str | None = None, follow: bool = False) -> int:
    """A descriptor of the directory `path`; close it. Not through a symlink unless `follow`.

    UnsafeFileError when it is a symlink (and not `follow`) or no directory; FileNotFoundError when missing.
    """
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC | (0 if follow else os.O_NOFOLLOW)
    try:
        return os.open(path, flags, dir_fd=dir_fd)
    except OSError as e:
        if e.errno in (errno.ENOTDIR, errno.ELOOP):
            raise UnsafeFileError(show or path, _lkind(path, dir_fd), "a directory") from None
        raise


def open_lock_file(path: str) -> int:
    """A descriptor (write, append) of the lock file `path`, created if missing; UnsafeFileError if not regular."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NONBLOCK | _NOFOLLOW, 0o644)
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.ENXIO, errno.EISDIR):
            raise UnsafeFileError(path, _lkind(path, None)) from None
        raise
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise UnsafeFileError(path, kind(mode))
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


__all__ = ["create_exclusive", "kind", "open_dir", "open_lock_file", "open_regular", "read_regular"]


def fsync_dir(path: str) -> None:
    """fsync a directory: make the creation, rename or removal of its entries durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _find_syncfs() -> Callable[[int], int] | None:
    """libc's syncfs(2) where it reports write-back errors (Linux 5.8 and later); None elsewhere."""
    if sys.platform != "linux":
        return None
    try:
        major, minor = (int(x) for x in platform.release().split(".")[:2])
    except ValueError:
        return None
    if (major, minor) < (5, 8):  # older kernels' syncfs says nothing of a failed write-back
        return None
    import ctypes

    try:
        fn = ctypes.CDLL(None, use_errno=True).syncfs
    except (OSError, AttributeError):
        return None
    fn.argtypes, fn.restype = [ctypes.c_int], ctypes.c_int
    return fn


_syncfs = _find_syncfs()
HAVE_SYNCFS = _syncfs is not None
"""Whether `sync_file_system` can be used here (see also `syncfs_reports_errors`)."""

_DISK_FILE_SYSTEMS = {
    0xEF53: "ext2/3/4",
    0x58465342: "xfs",
    0x9123683E: "btrfs",
    0xF2F52010: "f2fs",
}
"""Local disk file systems whose write-back errors syncfs reports (through the VFS's per-super-block error
sequence); on others (network, FUSE, overlay, tmpfs) a hub fsyncs each file instead."""


def syncfs_reports_errors(fd: int) -> bool:
    """Whether one `sync_file_system(fd)` may stand for fsyncs of the files on the file system of `fd`."""
    if _syncfs is None:
        return False
    import ctypes

    buf = ctypes.create_string_buffer(256)  # struct statfs: f_type (a C long) comes first
    if ctypes.CDLL(None, use_errno=True).fstatfs(fd, buf) != 0:
        return False
    return (ctypes.c_long.from_buffer(buf).value & 0xFFFFFFFF) in _DISK_FILE_SYSTEMS


def sync_file_system(fd: int) -> None:
    """syncfs(2): make everything written on the file system of `fd` durable, in one call.

    OSError also for a write-back error on that file system since `fd` was opened (so open it
    before the writes it is to cover). Only where HAVE_SYNCFS.
    """
    if _syncfs is None:
        raise NotImplementedError("syncfs with write-back error reports needs Linux 5.8 or later")
    if _syncfs(fd) != 0:
        import ctypes

        err = ctypes.get_errno()
        raise OSError(err, f"syncfs: {os.strerror(err)}")


def temp_name(name: str) -> str:
    """An unpredictable temp file name beside `name`: `<name>.<16 hex digits>.tmp`."""
    return f"{name}.{secrets.token_hex(8)}.tmp"


def atomic_write(
    name: str, data: bytes, *, dir_fd: int | None = None, show: str | None = None, durable: bool = True
) -> None:
    """Replace the file `name` (relative to `dir_fd`, if given) with `data`, atomically.

    The temp file beside it (temp_name) is created exclusively (O_CREAT|O_EXCL|O_NOFOLLOW:
    it never follows a symlink nor reuses a file), written, fsynced when `durable`, and
    renamed over `name` (a rename replaces the name and follows nothing); then, when
    `durable`, the directory is fsynced. An existing `name` that is not a regular file (a
    symlink, a FIFO) raises UnsafeFileError and is left alone. `show` names it in errors.
    """
    where = show or name
    try:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        pass
    else:
        if not stat.S_ISREG(st.st_mode):
            raise UnsafeFileError(where, kind(st.st_mode))
    tmp = temp_name(name)
    fd = create_exclusive(tmp, dir_fd=dir_fd)
    try:
        try:
            view, done = memoryview(data), 0
            while done < len(view):
                done += os.write(fd, view[done:])
            if durable:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        try:
            os.unlink(tmp, dir_fd=dir_fd)
        except OSError:
            pass
        raise
    if not durable:
        return
    if dir_fd is not None:
        os.fsync(dir_fd)
    else:
        fsync_dir(os.path.dirname(name) or ".")


def open_files_limit(unknown: int) -> int | None:
    """This process's soft limit on open files; None when unlimited, `unknown` when it cannot be read."""
    try:
        import resource

        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    except (ImportError, ValueError, OSError):
        return unknown
    return None if soft == resource.RLIM_INFINITY else soft


def allow_open_files(needed: int) -> None:
    """Raise this process's soft limit on open files toward `needed` (each open journal holds two)."""
    try:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft != resource.RLIM_INFINITY and soft < needed:
            target = needed if hard == resource.RLIM_INFINITY else min(needed, hard)
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    except (ImportError, ValueError, OSError):
        pass  # keep the limit; opening a shard past it fails with EMFILE
