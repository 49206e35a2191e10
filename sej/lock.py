"""Exclusive, non-blocking file locks (portalocker) for writers and readers."""

from __future__ import annotations

import os
import weakref
from typing import IO

import portalocker

from .errors import LockedError
from .fsutil import open_lock_file

_LOCKED_BY: weakref.WeakKeyDictionary[IO[str], int] = weakref.WeakKeyDictionary()
"""The process that took each lock: a child forked since shares the open file, and with it the lock."""


def lock_file(path: str) -> IO[str]:
    """Open and exclusively lock `path` (created if missing, never deleted); LockedError if held.

    The lock file must be a regular file: a symlink or a FIFO there raises UnsafeFileError
    (it is never followed, and opening never blocks).
    """
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
    try:
        if _LOCKED_BY.get(fh, os.getpid()) == os.getpid():
            portalocker.unlock(fh)
    finally:
        fh.close()
