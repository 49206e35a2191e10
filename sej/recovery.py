"""Startup recovery: cut a segment's corrupt or torn tail back to its last whole message.

The cut bytes are first copied to a quarantine file beside the segment and made
durable, and only then is the segment truncated: nothing is silently destroyed.
The checksums of the cut bytes are dropped from the segment's checksum file with them.
`kept_end` says where the bytes that can be messages end (before a torn frame, or
where recovery would cut), without cutting: sealing never records checksums past it.
"""

from __future__ import annotations

import logging
import os
import time
import warnings
from typing import NamedTuple

from .errors import CorruptionError, CorruptionWarning
from .fsutil import fsync_dir, open_file
from .index import SparseIndex
from .checksum import drop_past
from .layout import Segment, index_path, quarantine_name, sum_path
from .segment import CHUNK, Walk, walk, walk_tail

log = logging.getLogger("sej.recovery")


class Tail(NamedTuple):
    """A segment's state after recovery."""

    walk: Walk  # walk.end is now the file size
    sparse_index: SparseIndex
    index_on_disk: bool
    cut: CorruptionError | None  # what was cut, if anything


def quarantine_path(segment_path: str, position: int) -> str:
    """Where bytes cut from `segment_path` at `position` are kept."""
    return quarantine_name(segment_path, position, time.time_ns())


def recover_tail(dir: str, seg: Segment, strict: bool = False) -> Tail:
    """Validate `seg` from its last trusted index entry; cut a bad tail aside.

    With `strict`, nothing is changed and a bad tail raises CorruptionError.
    """
    with open_file(seg.path, "r+b") as f:
        fd = f.fileno()
        w, index, on_disk = _walk(dir, seg, fd)
        if w.problem is None:
            return Tail(w, index, on_disk, None)
        length = w.size - w.end
        if strict and w.resume is None:  # strict refuses to cut; damage in place is never cut
            raise CorruptionError(seg.path, w.end, w.problem.reason, length)
        if w.resume is not None:
            # A frame damaged in place, with whole frames after it: not a tail. Cutting would throw
            # away acknowledged messages, so keep everything; readers stop at the damage and
            # `sej verify` reports it. The writer appends after the last whole frame.
            damage = CorruptionError(seg.path, w.end, w.problem.reason, w.resume.position - w.end)
            log.warning("%s; left in place", damage)
            warnings.warn(f"{damage}; left in place", CorruptionWarning, stacklevel=3)
            r = w.resume
            kept = w._replace(end=w.size, next_offset=r.next_offset, max_ts=max(w.max_ts, r.max_ts), problem=None)
            return Tail(kept, index, on_disk, None)
        qpath = quarantine_path(seg.path, w.end)
        _copy_range(fd, w.end, w.size, qpath)
        fsync_dir(os.path.dirname(seg.path))
        os.ftruncate(fd, w.end)
        os.fsync(fd)
    drop_past(sum_path(dir, seg.first_offset), seg.first_offset, w.end)  # the cut bytes' checksums go with them
    cut = CorruptionError(seg.path, w.end, w.problem.reason, length, qpath)
    log.warning("%s", cut)
    warnings.warn(str(cut), CorruptionWarning, stacklevel=3)
    return Tail(w._replace(size=w.end, problem=None), index, on_disk, cut)


def _walk(dir: str, seg: Segment, fd: int) -> tuple[Walk, SparseIndex, bool]:
    """Recovery's walk of a segment: from its last trusted index entry, again from the start on a problem."""
    w, index, on_disk = walk_tail(index_path(dir, seg.first_offset), seg, fd)
    if w.problem is not None and len(index):
        # Never cut on the index's word: it is derived data. Walk again from the start.
        index = SparseIndex(seg.first_offset)
        w = walk(fd, index.tail(), w.size, index)
        on_disk = False
    return w, index, on_disk


def kept_end(dir: str, seg: Segment, fd: int, last: bool) -> int:
    """The end of the bytes of `seg` (open on `fd`) that can be messages, reading only: before a torn frame at
    its end (in any segment), and in the journal's `last` segment where recovery would cut a corrupt tail; its
    size otherwise (a frame damaged in place that whole frames follow is never cut, nor is a finished segment)."""
    w = _walk(dir, seg, fd)[0]
    if w.problem is None or w.resume is not None or not (w.problem.incomplete or last):
        return w.size
    return w.end


def _copy_range(fd: int, start: int, end: int, dest: str) -> None:
    with open(dest, "xb") as out:
        pos = start
        while pos < end:
            data = os.pread(fd, min(CHUNK, end - pos), pos)
            if not data:
                break
            out.write(data)
            pos += len(data)
        out.flush()
        os.fsync(out.fileno())
