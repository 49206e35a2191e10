"""Exclusive, non-blocking file locks (portalocker) for writers and readers."""

from __future__ import annotations

import os
from typing import IO

import portalocker

from .errors import LockedError
from .fsutil import open_lock_file


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
    return fh


def unlock_file(fh: IO[str]) -> None:
    try:
        portalocker.unlock(fh)
    finally:
        fh.close()
