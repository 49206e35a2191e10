"""The sparse index of a segment: every few KiB, (offset, position, max timestamp before).

Derived data kept in `<dir>/idx/%016x.idx` beside the segments; it can always be
rebuilt from the segment, and every entry is checked against the segment before
it is trusted. File layout: the 8-byte magic, the segment's first offset (u64),
then 24-byte entries, all big-endian::

    offset u64 | position u64 | max_ts i64

`max_ts` is the largest timestamp of the segment's messages up to and including
the one at `position` (NO_TIMESTAMP counts as the smallest), so it never decreases
and a seek by time is a binary search too.
"""

from __future__ import annotations

import os
import struct
from bisect import bisect_left, bisect_right
from typing import NamedTuple

from .errors import UnsafeFileError
from .frames import INDEX_INTERVAL, NO_TIMESTAMP
from .fsutil import atomic_write, open_regular, read_regular

MAGIC = b"SEJIDX01"
FILE_HEADER = struct.Struct(">8sQ")
ENTRY = struct.Struct(">QQq")
INTERVAL = INDEX_INTERVAL
"""Bytes of segment between two index entries (at least)."""


class Entry(NamedTuple):
    offset: int  # the message at `position`
    position: int  # its byte position in the segment
    max_ts: int  # largest timestamp of the segment's messages up to and including it


class SparseIndex:
    """In-memory sparse index of one segment, stored as packed entries."""

    __slots__ = ("first_offset", "data")

    def __init__(self, first_offset: int, data: bytes | bytearray = b"") -> None:
        self.first_offset = first_offset
        self.data = bytearray(data[: len(data) - len(data) % ENTRY.size])

    def __len__(self) -> int:
        return len(self.data) // ENTRY.size

    def __getitem__(self, i: int) -> Entry:
        n = len(self)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError(i)
        return Entry(*ENTRY.unpack_from(self.data, i * ENTRY.size))

    def add(self, offset: int, position: int, max_ts: int) -> None:
        self.data += ENTRY.pack(offset, position, max_ts)

    def _field(self, i: int, k: int) -> int:
        return ENTRY.unpack_from(self.data, i * ENTRY.size)[k]  # type: ignore[no-any-return]

    def floor_offset(self, offset: int) -> int:
        """Index of the last entry with entry.offset <= offset (-1 if none)."""
        return bisect_right(range(len(self)), offset, key=lambda i: self._field(i, 0)) - 1

    def floor_time(self, ts: int) -> int:
        """Index of the last entry whose max_ts < ts: it and every message before it are older (-1 if none)."""
        return bisect_left(range(len(self)), ts, key=lambda i: self._field(i, 2)) - 1

    def truncate(self, count: int) -> None:
        """Keep only the first `count` entries."""
        del self.data[count * ENTRY.size :]

    def cut_at(self, position: int) -> None:
        """Drop the entries at or beyond a segment position."""
        i = bisect_left(range(len(self)), position, key=lambda i: self._field(i, 1))
        self.truncate(i)

    def tail(self) -> Entry:
        """The last entry, or the implicit start of the segment if there is none."""
        return self[-1] if len(self) else Entry(self.first_offset, 0, NO_TIMESTAMP)


def load(path: str, first_offset: int) -> SparseIndex | None:
    """Read an index file; None when it is missing or its header does not match the segment."""
    try:
        raw = read_regular(path, 1 << 40)
    except (FileNotFoundError, NotADirectoryError, PermissionError, UnsafeFileError):
        return None  # a FIFO or a symlink here is never read: the index is rebuilt instead
    if len(raw) < FILE_HEADER.size:
        return None
    magic, first = FILE_HEADER.unpack_from(raw)
    if magic != MAGIC or first != first_offset:
        return None
    return SparseIndex(first_offset, raw[FILE_HEADER.size :])


def load_last(path: str, first_offset: int, count: int) -> list[Entry]:
    """The last `count` entries of an index file ([] when it is missing or does not match the segment)."""
    try:
        fd = open_regular(path)
    except (FileNotFoundError, NotADirectoryError, PermissionError, UnsafeFileError):
        return []
    try:
        head = os.pread(fd, FILE_HEADER.size, 0)
        if len(head) < FILE_HEADER.size or FILE_HEADER.unpack(head) != (MAGIC, first_offset):
            return []
        n = (os.fstat(fd).st_size - FILE_HEADER.size) // ENTRY.size
        k = min(n, count)
        raw = os.pread(fd, k * ENTRY.size, FILE_HEADER.size + (n - k) * ENTRY.size)
    finally:
        os.close(fd)
    return [Entry(*ENTRY.unpack_from(raw, i)) for i in range(0, len(raw) - ENTRY.size + 1, ENTRY.size)]


def save(path: str, index: SparseIndex) -> None:
    """Write an index file atomically (temp file and rename). No fsync: it is derived data."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    atomic_write(path, FILE_HEADER.pack(MAGIC, index.first_offset) + index.data, durable=False)


BATCH = 256
"""Entries (about 1 MiB of segment) a writer lets wait while it spills a full buffer: opening the file costs
more than the write, so a spill writes them only once this many wait. flush(), sync() and the rest write all."""


class Appender:
    """Appends the entries a writer adds to its segment's index file, at each flush.

    The file is opened per flush, not held open: a process with many shards keeps
    no descriptor per journal for it.
    """

    __slots__ = ("path", "index", "_saved")

    def __init__(self, path: str, index: SparseIndex, on_disk: bool) -> None:
        """`on_disk`: the file at `path` already holds exactly `index`; else it is rewritten."""
        self.path = path
        self.index = index
        if not on_disk:
            save(path, index)
        self._saved = len(index.data)

    def flush(self, at_least: int = 1) -> None:
        """Append the entries added since the last flush, if `at_least` of them wait."""
        data = self.index.data
        if len(data) - self._saved >= at_least * ENTRY.size:
            # Only a regular file: no link is followed, no FIFO blocks the writer. A file removed meanwhile
            # stays removed (the index is derived data: readers rebuild it), rather than recreated headless.
            try:
                fd = open_regular(self.path, os.O_WRONLY | os.O_APPEND)
            except FileNotFoundError:
                self._saved = len(data)
                return
            try:
                with memoryview(data) as view:
                    while self._saved < len(view):  # counted as written, so an error never writes twice
                        self._saved += os.write(fd, view[self._saved :])
            finally:
                os.close(fd)

    def close(self) -> None:
        self.flush()
