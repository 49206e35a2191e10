"""Sealing: recording checksums for a journal's unchecked bytes, from the bytes as they are now.

Segments written by the Go original, or by sej before checksums, have no checksum
file; a crash can leave a finished segment's tail past its last record. Sealing
records checksums for those bytes so that damage from now on is seen. It cannot
vouch for their past: bytes already damaged are sealed damaged. A segment whose
checksums disagree with it, or whose checksum file is invalid, is never sealed
(nothing is rewritten: there is nothing to repair from but another copy). A torn
frame at a segment's end, or a corrupt tail of the last segment (what the writer's
recovery would cut; `recovery.kept_end`), is not messages and is never sealed:
`sej verify --repair` cuts it.
"""

from __future__ import annotations

import os
from typing import NamedTuple

from .checksum import BLOCK, Hasher, check_segment, header
from .fsutil import atomic_write, fsync_dir, open_file, open_regular
from .layout import index_dir, list_segments, sum_path
from .lock import lock_journal
from .recovery import kept_end
from .segment import pread_full

CHUNK = 1 << 20


class Sealed(NamedTuple):
    path: str  # the segment
    start: int  # bytes start..end were sealed
    end: int


def seal_journal(dir: str, *, locked: bool = False) -> tuple[list[Sealed], list[str]]:
    """Seal every unchecked range of the journal in `dir` under its writer lock (LockedError if a writer runs).

    `locked`: the caller holds the writer lock. Returns what was sealed, and why segments or bytes were left
    alone (mismatches, invalid checksum files, a torn or corrupt tail).
    """
    lock = None if locked else lock_journal(dir)
    try:
        os.makedirs(index_dir(dir), exist_ok=True)
        sealed: list[Sealed] = []
        refused: list[str] = []
        segments = list_segments(dir)
        for seg in segments:
            spath = sum_path(dir, seg.first_offset)
            check = check_segment(seg.path, spath, seg.first_offset)
            if check.errors:
                refused += [f"{e}: not sealed" for e in check.errors]
                continue
            if check.checked >= check.size:
                continue
            with open_file(seg.path) as f:
                fd = f.fileno()
                end = min(check.size, kept_end(dir, seg, fd, seg == segments[-1]))
                if end < check.size:
                    repair = " (`sej verify --repair` cuts it)" if seg == segments[-1] else ""
                    refused.append(f"{seg.path}: bytes {max(end, check.checked)}..{check.size}: a torn or "
                                   f"corrupt tail, not messages: not sealed{repair}")  # fmt: skip
                if check.checked >= end:
                    continue
                if not check.has_sums:
                    hasher, records = Hasher(), bytearray(header(seg.first_offset))
                else:
                    start = check.checked // BLOCK * BLOCK
                    hasher, records = Hasher(check.checked, pread_full(fd, check.checked - start, start)), bytearray()
                pos = check.checked
                while pos < end:
                    data = pread_full(fd, min(CHUNK, end - pos), pos)
                    if not data:
                        break
                    records += hasher.update(data)
                    pos += len(data)
            if not check.has_sums:
                atomic_write(spath, bytes(records))  # temp file, fsync, rename, directory fsync
            else:
                sfd = open_regular(spath, os.O_WRONLY | os.O_APPEND)
                try:
                    done = 0
                    while done < len(records):
                        done += os.write(sfd, records[done:])
                    os.fsync(sfd)
                finally:
                    os.close(sfd)
            sealed.append(Sealed(seg.path, check.checked, pos))
        if sealed:
            fsync_dir(index_dir(dir))
        return sealed, refused
    finally:
        if lock is not None:
            lock.release()
