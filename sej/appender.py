"""The segment appender: a journal's last segment open for appending, with its sparse index.

One class for every writer of segments (Kafka's LogSegment, in small): the journal
`Writer` and the hub's copies. Opening recovers the last segment (a torn tail is cut
aside, see sej.recovery) or starts the first one; `start` begins the next segment;
`write` appends bytes of whole frames; `sync` makes them durable. What goes in the
bytes (packing, buffering, checking copied frames) is the caller's business.
"""

from __future__ import annotations

import os
from typing import IO

from . import index as idx
from .errors import CorruptionError
from .frames import NO_TIMESTAMP
from .fsutil import fsync_dir, open_file
from .layout import index_dir, index_path, list_segments, segment_dir, segment_path
from .recovery import recover_tail


class SegmentAppender:
    """Appends to the last segment of the journal in `dir` (created if missing).

    After opening, `next_offset` and `max_ts` describe the frames already in the
    segment; callers advance them as they append. `recovered` is what recovery cut.
    """

    __slots__ = ("dir", "file", "fd", "first", "size", "next_offset", "max_ts", "index", "recovered")

    def __init__(self, dir: str, *, strict: bool = False, start_offset: int = 0) -> None:
        self.dir = dir
        os.makedirs(segment_dir(dir), exist_ok=True)
        os.makedirs(index_dir(dir), exist_ok=True)
        self.recovered: CorruptionError | None = None
        self.file: IO[bytes] | None = None
        segments = list_segments(dir)
        if not segments:
            self.start(start_offset)
            return
        seg = segments[-1]
        tail = recover_tail(dir, seg, strict)
        self.recovered = tail.cut
        # Like the Go writer, a last segment already at its full size takes one more message
        # before the roll: the files stay byte-identical with what Go would write.
        self._open(seg.first_offset, idx.Appender(index_path(dir, seg.first_offset), tail.sparse_index,
                                                  tail.index_on_disk))  # fmt: skip
        self.size = tail.walk.end
        self.next_offset = tail.walk.next_offset
        self.max_ts = tail.walk.max_ts

    def _open(self, first: int, index: idx.Appender) -> None:
        self.file = open_file(segment_path(self.dir, first), "a+b")  # readable: the hub checks its tail
        self.fd = self.file.fileno()
        self.first = first
        self.index = index

    def start(self, first: int) -> IO[bytes] | None:
        """Begin the segment whose first message has offset `first`; return the previous file, still open.

        The caller fsyncs the previous segment first, and closes the returned file
        once nothing uses its descriptor any more (a group commit may be fsyncing it).
        """
        previous = self.file
        self._open(first, idx.Appender(index_path(self.dir, first), idx.SparseIndex(first), False))
        fsync_dir(segment_dir(self.dir))
        self.size = os.fstat(self.fd).st_size  # 0 unless an empty segment was left by a crash
        self.next_offset = first
        self.max_ts = NO_TIMESTAMP
        return previous

    def next_entry(self) -> int:
        """The segment position at or after which the index wants its next entry."""
        index = self.index.index
        return index.tail().position + idx.INTERVAL if len(index) else 0

    def write(self, data: bytes | bytearray | memoryview) -> None:
        """Append all of `data`; `size` counts what was written, also when a write fails midway."""
        with memoryview(data) as view:
            done, n = 0, len(view)
            try:
                while done < n:
                    done += os.write(self.fd, view[done:])
            finally:
                self.size += done

    def sync(self) -> None:
        """fsync the segment, then write the index entries added so far (they point at synced bytes)."""
        os.fsync(self.fd)
        self.index.flush()

    def close(self) -> None:
        """Write the index entries and close the segment file (no fsync: call sync first). Idempotent."""
        if self.file is not None:
            try:
                self.index.close()
            finally:
                self.file.close()
                self.file = None


__all__ = ["SegmentAppender"]
