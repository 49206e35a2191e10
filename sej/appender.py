"""The segment appender: a journal's last segment open for appending, with its sparse index.

One class for every writer of segments (Kafka's LogSegment, in small): the journal
`Writer` and the hub's copies. Opening recovers the last segment (a torn tail is cut
aside, see sej.recovery) or starts the first one; `start` begins the next segment;
`write` appends bytes of whole frames and records their checksums (sej.checksum);
`sync` makes the bytes durable. What goes in the bytes (packing, buffering, checking
copied frames) is the caller's business.

The checksum file of a segment is fsynced when the segment is finished (`start` of the
next one) and at `close`; after a crash, opening seals the bytes written since its
last durable record from the segment as it is on disk (see docs/durability.md).
"""

from __future__ import annotations

import logging
import os
from typing import IO

from . import index as idx
from .checksum import BLOCK, HEADER, RECORD, Hasher, SumFile, check_header, tail_records
from .errors import CorruptionError, SyncError, UnsafeFileError
from .frames import NO_TIMESTAMP
from .fsutil import fsync_dir, open_file, open_regular
from .layout import Segment, index_dir, index_path, list_segments, segment_dir, segment_path, sum_path
from .recovery import recover_tail
from .segment import pread_full

log = logging.getLogger("sej.checksum")

SEAL_CHUNK = 1 << 20

CHECKSUMS = True
"""Write checksum files. Only the benchmark turns this off, to measure what they cost."""


class SegmentAppender:
    """Appends to the last segment of the journal in `dir` (created if missing).

    After opening, `next_offset` and `max_ts` describe the frames already in the
    segment; callers advance them as they append. `recovered` is what recovery cut.
    """

    __slots__ = ("dir", "file", "fd", "first", "size", "next_offset", "max_ts", "index", "recovered", "sums")

    def __init__(self, dir: str, *, strict: bool = False, start_offset: int = 0, durable: bool = True,
                 listed: list[Segment] | None = None) -> None:  # fmt: skip
        """`listed`: the journal's segments, listed by the caller under the writer lock (its jnl/ and idx/ exist)."""
        self.dir = dir
        if listed is None:
            os.makedirs(segment_dir(dir), exist_ok=True)
            os.makedirs(index_dir(dir), exist_ok=True)
        self.recovered: CorruptionError | None = None
        self.file: IO[bytes] | None = None
        self.sums: SumFile | None = None  # None: this segment stays unchecked (see _resume_sums)
        segments = list_segments(dir) if listed is None else listed
        if not segments:
            self.start(start_offset, durable)
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
        self.sums = self._resume_sums()

    def _open(self, first: int, index: idx.Appender) -> None:
        self.file = open_file(segment_path(self.dir, first), "a+b")  # readable: the hub checks its tail
        self.fd = self.file.fileno()
        self.first = first
        self.index = index

    def start(self, first: int, durable: bool = True) -> IO[bytes] | None:
        """Begin the segment whose first message has offset `first`; return the previous file, still open.

        The caller fsyncs the previous segment first, and closes the returned file
        once nothing uses its descriptor any more (a group commit may be fsyncing it).
        Not `durable`: the caller made the previous segment and its checksums durable (a syncfs)
        and makes the new files' names durable before relying on them; nothing is fsynced here.
        """
        previous = self.file
        self._close_sums(durable=durable)  # the finished segment's checksums are durable with it
        self._open(first, idx.Appender(index_path(self.dir, first), idx.SparseIndex(first), False))
        self.size = os.fstat(self.fd).st_size  # 0 unless an empty segment was left by a crash
        self.sums = self._resume_sums()
        if durable:
            fsync_dir(segment_dir(self.dir))
            fsync_dir(index_dir(self.dir))
        self.next_offset = first
        self.max_ts = NO_TIMESTAMP
        return previous

    def _resume_sums(self) -> SumFile | None:
        """The checksum file of the open segment, made to agree with its `size` bytes; None: unchecked.

        Missing (an old or Go journal) or not a sej checksum file: the segment stays unchecked
        (`sej verify` reports it and can seal it) unless it is empty. Records past `size` (a tail
        recovery cut) and a torn last record are dropped. Bytes past the last record were written
        before a crash: they are sealed from the disk (docs/durability.md). If the open block
        disagrees with its record, the file is left for `sej verify` and the segment stays unchecked.
        """
        path, size = sum_path(self.dir, self.first), self.size
        if not CHECKSUMS:
            return None
        try:
            fd = open_regular(path, os.O_RDWR | os.O_APPEND)
        except FileNotFoundError:
            return SumFile.create(path, self.first) if size == 0 else None
        except UnsafeFileError as e:
            log.warning("%s; the segment stays unchecked", e)
            return None
        try:
            file_size = os.fstat(fd).st_size
            problem = check_header(pread_full(fd, HEADER.size, 0), self.first)
            if problem is None:  # only the file's end is read: a record per flush makes it long
                count, last, problem = tail_records(fd, (file_size - HEADER.size) // RECORD.size, size)
            if problem is not None:
                os.close(fd)
                fd = -1
                if size == 0:
                    return SumFile.create(path, self.first)
                log.warning("%s: %s; the segment stays unchecked (see sej verify)", path, problem)
                return None
            end = last.end if last is not None else 0
            start = end // BLOCK * BLOCK
            prefix = pread_full(self.fd, end - start, start)
            hasher = Hasher(end, prefix)
            if last is not None and end % BLOCK and hasher.h.intdigest() != last.digest:
                os.close(fd)
                fd = -1
                log.warning("%s: bytes %d..%d disagree with their checksum; the segment stays unchecked "
                            "(see sej verify)", path, start, end)  # fmt: skip
                return None
            kept_size = HEADER.size + count * RECORD.size
            if file_size != kept_size:
                os.ftruncate(fd, kept_size)  # what recovery cut, and a torn record
            sums, fd = SumFile(path, fd, hasher), -1
        finally:
            if fd >= 0:
                os.close(fd)
        if end < size:
            log.info("%s: sealing bytes %d..%d written before a crash, from the disk", path, end, size)
            pos = end
            while pos < size:
                data = pread_full(self.fd, min(SEAL_CHUNK, size - pos), pos)
                if not data:
                    break
                sums.add(data)
                pos += len(data)
        if file_size != kept_size or end < size:
            sums.sync()
        return sums

    def _close_sums(self, durable: bool) -> None:
        sums, self.sums = self.sums, None
        if sums is not None:
            try:
                if durable:
                    sums.sync()
            finally:
                sums.close()

    def cut(self, size: int) -> None:
        """Drop the segment's bytes from `size` on (and their checksums)."""
        os.ftruncate(self.fd, size)
        self.size = size
        if self.sums is not None:
            self._close_sums(durable=False)
            self.sums = self._resume_sums()

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
                if self.sums is not None and done:
                    try:
                        self.sums.add(view[:done])
                    except BaseException:
                        log.warning("%s: checksums could not be written; the rest of the segment is unchecked",
                                    self.sums.path)  # fmt: skip
                        self._close_sums(durable=False)
                        raise

    def sync(self) -> None:
        """fsync the segment, then write the index entries added so far (they point at synced bytes)."""
        try:
            os.fsync(self.fd)
        except OSError as e:
            raise SyncError(f"fsync of {segment_path(self.dir, self.first)} failed: {e}") from e
        self.index.flush()

    def close(self, synced: bool = False) -> None:
        """Write the index entries, fsync the checksums and close (the segment is not fsynced: call sync
        first). `synced`: everything written is durable already (a syncfs since), so the checksums are
        not fsynced again. Idempotent."""
        if self.file is not None:
            try:
                self.index.close()
                self._close_sums(durable=not synced)
            finally:
                self.drop()

    def drop(self) -> None:
        """Close the files without writing anything more. Idempotent."""
        self._close_sums(durable=False)
        if self.file is not None:
            self.file.close()
            self.file = None


__all__ = ["SegmentAppender"]
