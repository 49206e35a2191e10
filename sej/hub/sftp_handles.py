"""The files a kept SFTP channel holds open between calls (SftpSource.keep_handles): which, and until when.

Only the bookkeeping: SftpSource sends the CLOSEs of the handles let go (`take_closing`) with its next requests.
"""

from __future__ import annotations

import time
from typing import NamedTuple

KEEP_UNSTATED = 64
"""Files kept open at most on a server that does not state its handle limit (limits@openssh.com)."""

KEEP_SECONDS = 60.0
"""How long a kept file stays open: what a producer replaced or deleted is let go within this."""

Key = tuple[str, str]
"""What a file is kept for: (journal, "jnl"), (journal, "idx") or (journal, "ofs/<reader>")."""


class Kept(NamedTuple):
    """A file a kept channel holds open between calls."""

    path: str
    handle: bytes
    until: float  # time.monotonic() after which it is let go
    head: bytes = b""  # a checksum file's header, as read through this handle (it never changes in a file)


class KeptHandles:
    """The handles kept open, one per key, and those let go but not closed yet (closed with the next requests)."""

    def __init__(self) -> None:
        self.most = 0  # files kept open at most (SftpSource.keep_handles); 0: none
        self.kept: dict[Key, Kept] = {}
        self.closing: list[bytes] = []  # handles let go, closed with the next requests

    def __contains__(self, key: Key) -> bool:
        return key in self.kept

    def get(self, key: Key, path: str) -> bytes | None:
        """The handle kept for `key` if it is `path`'s and young; one of an earlier path, or old, is let go."""
        kept = self.kept.get(key)
        if kept is None:
            return None
        if kept.path == path and time.monotonic() < kept.until:
            return kept.handle
        if kept.path < path or time.monotonic() >= kept.until:  # the journal has moved on to a later segment
            self.let_go(key, kept.handle)
        return None

    def keep(self, key: Key, path: str, handle: bytes) -> bool:
        """Keep `handle` (of `path`) open for `key`; False when it is not kept (the caller closes it): a later file
        of the key is kept, or there is no room. Nothing kept is pushed out for it: a pass reads its journals in
        turn, so a cache of the least recently read would hold none of the next pass's files once there are more
        than it holds; this way the ones kept are read through their handles, until they are KEEP_SECONDS old."""
        kept = self.kept.get(key)
        if kept is not None:
            if kept.path > path:  # a later segment of the journal is kept
                return False
            self.let_go(key, kept.handle)
        if not self.room():
            return False
        self.kept[key] = Kept(path, handle, time.monotonic() + KEEP_SECONDS)
        return True

    def room(self) -> bool:
        """Whether another file may be kept: those kept and those let go but still open (closed with the next
        call) count, so that with the files the operations of a call open they stay within the server's limit."""
        return len(self.kept) + len(self.closing) < self.most

    def head(self, key: Key) -> bytes:
        """The header remembered with the file kept for `key`."""
        return self.kept[key].head

    def remember_head(self, key: Key, handle: bytes, head: bytes) -> None:
        """Remember a checksum file's header with `handle`, if it is still the one kept for `key`."""
        kept = self.kept.get(key)
        if kept is not None and kept.handle == handle:
            self.kept[key] = kept._replace(head=head)

    def let_go(self, key: Key, handle: bytes) -> None:
        """Stop keeping `handle` for `key`; closed with the next call's requests. Only if it is still the one kept
        there: a handle let go already (by another operation) is queued once, never closed twice (the server
        reuses a closed handle's name for the next file it opens)."""
        kept = self.kept.get(key)
        if kept is not None and kept.handle == handle:
            del self.kept[key]
            self.closing.append(handle)

    def close_later(self, handle: bytes) -> None:
        """Close `handle` (one not kept) with the next call's requests."""
        self.closing.append(handle)

    def forget(self, journals: set[str] | None = None) -> None:
        """Let go of the files kept for `journals` (all, without)."""
        for key in [k for k in self.kept if journals is None or k[0] in journals]:
            self.closing.append(self.kept.pop(key).handle)

    def expire(self) -> None:
        """Let go of the files kept for KEEP_SECONDS."""
        now = time.monotonic()
        for key in [k for k, kept in self.kept.items() if kept.until <= now]:
            self.closing.append(self.kept.pop(key).handle)

    def take_closing(self) -> list[bytes]:
        """The handles let go so far, to close now (the list starts afresh)."""
        handles, self.closing = self.closing, []
        return handles
