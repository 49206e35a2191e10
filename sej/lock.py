"""Exclusive, non-blocking file locks (portalocker) for writers and readers."""

from __future__ import annotations

from typing import IO

import portalocker

from .errors import LockedError


def lock_file(path: str) -> IO[str]:
    """Open and exclusively lock `path` (created if missing, never deleted); LockedError if held."""
    fh = open(path, "a")
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
