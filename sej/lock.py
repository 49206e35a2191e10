"""Exclusive, non-blocking file locks (portalocker) for writers and readers, and directory locks for writers."""

from __future__ import annotations

import os
import weakref
from typing import IO

from .errors import LockedError
from .fsutil import open_dir, open_lock_file

try:
    import fcntl
except ImportError:  # not POSIX: no directory locks
    fcntl = None  # type: ignore[assignment]

_LOCKED_BY: weakref.WeakKeyDictionary[IO[str], int] = weakref.WeakKeyDictionary()
"""The process that took each lock: a child forked since shares the open file, and with it the lock."""


def lock_file(path: str) -> IO[str]:
    """Open and exclusively lock `path` (created if missing, never deleted); LockedError if held.

    The lock file must be a regular file: a symlink or a FIFO there raises UnsafeFileError
    (it is never followed, and opening never blocks).
    """
    import portalocker  # here: its import costs 15-25 ms (importlib.metadata), which `sej serve` never needs

    fh = os.fdopen(open_lock_file(path), "a")
    try:
        portalocker.lock(fh, portalocker.LOCK_EX | portalocker.LOCK_NB)
    except portalocker.LockException:
        fh.close()
        raise LockedError(path) from None
    except BaseException:
        fh.close()
        raise
    _LOCKED_BY[fh] = os.getpid()
    return fh


def unlock_file(fh: IO[str]) -> None:
    """Release the lock and close the file. In a child forked since the lock was taken, only the child's
    copy is closed: unlocking there would release the parent's lock."""
    import portalocker

    try:
        if _LOCKED_BY.get(fh, os.getpid()) == os.getpid():
            portalocker.unlock(fh)
    finally:
        fh.close()


class DirLock:
    """An exclusive flock on a directory: unlike a lock file's, no deletion or rename can take it away."""

    __slots__ = ("path", "fd", "_pid")

    def __init__(self, path: str, fd: int) -> None:
        self.path = path
        self.fd = fd
        self._pid = os.getpid()

    def release(self) -> None:
        """Unlock and close. In a child forked since the lock was taken, only close the child's copy:
        unlocking there would release the parent's lock. Idempotent."""
        fd, self.fd = self.fd, -1
        if fd < 0:
            return
        try:
            if self._pid == os.getpid():
                fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)


def lock_dir(path: str) -> DirLock | None:
    """Exclusively flock the directory `path` (never through a symlink); LockedError if held.

    None where flock is missing (not POSIX). UnsafeFileError if `path` is a symlink or no directory.
    """
    if fcntl is None:
        return None
    fd = open_dir(path)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise LockedError(path) from None
    except BaseException:
        os.close(fd)
        raise
    return DirLock(path, fd)


class JournalLock:
    """A journal's writer locks: `jnl.lck` (the Go writer takes it too) and the flock on `jnl/` (which no deletion
    or rename of `jnl.lck` takes away). What every tool that changes a journal's segments holds, as a writer does."""

    __slots__ = ("file", "dir")

    def __init__(self, file: IO[str], dir: DirLock | None) -> None:
        self.file = file
        self.dir = dir

    def fileno(self) -> int:
        return self.file.fileno()

    def release(self) -> None:
        """Release both (in a forked child: close its copies only)."""
        try:
            unlock_file(self.file)
        finally:
            if self.dir is not None:
                self.dir.release()


def lock_journal(journal: str) -> JournalLock:
    """Take the writer locks of the journal directory `journal`; LockedError naming the one held."""
    from .layout import segment_dir, writer_lock_path  # layout imports nothing of this module's users

    fh = lock_file(writer_lock_path(journal))
    try:
        return JournalLock(fh, lock_dir(segment_dir(journal)))
    except BaseException:
        unlock_file(fh)
        raise
