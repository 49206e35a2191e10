"""The scanner: iterate a journal's messages from an offset, following new data as it comes."""

from __future__ import annotations

import datetime as _dt
import os
import threading
import time
from collections.abc import Iterator
from itertools import chain
from operator import length_hint
from typing import Literal

from watchdog.events import FileModifiedEvent

from .checksum import ReadCheck
from .errors import ClosedError, CorruptionError, InvalidArgumentError, OffsetOutOfRangeError, TruncatedError
from .frames import MAX_OFFSET, Message
from .fsutil import open_file
from .journal import check_journal, next_offset, offset_at_time
from .layout import (
    Segment,
    find_segment,
    index_dir,
    index_path,
    journal_path,
    list_segments,
    segment_dir,
    segment_path,
    sum_path,
)
from .segment import Chunk, read_messages, seek_entry, written_past
from .timestamps import to_ns
from .watch import Subscription, Wakeup

_EMPTY: list[Message] = []

_WAIT_SLICE = 0.5
"""Longest single wait for a file event, in seconds (see Scanner._next_batch)."""


class _Open:
    """The segment file being read."""

    __slots__ = ("first", "path", "index_path", "file", "fd", "ino", "pos", "offset", "seen", "checked", "finished",
                 "journal", "chunk")  # fmt: skip

    def __init__(self, seg: Segment, index_path: str, dir: str | None = None, journal: str | None = None) -> None:
        """With `dir`, the segment's checksums are checked before its bytes are decoded; with `journal`, messages
        come out as ShardMessages of that name."""
        self.journal = journal
        self.chunk = Chunk()  # the bytes read last: small batches decode from them
        self.first = seg.first_offset
        self.path = seg.path
        self.index_path = index_path
        self.file = open_file(seg.path)
        self.fd = self.file.fileno()
        self.ino = os.fstat(self.fd).st_ino
        self.pos = 0  # file position of the next frame
        self.offset = seg.first_offset  # its offset
        self.seen = 0  # largest file size seen: a smaller one means truncation
        self.finished = False  # a later segment exists
        try:
            self.checked = ReadCheck(seg.path, sum_path(dir, seg.first_offset), seg.first_offset) if dir else None
        except BaseException:
            self.file.close()
            raise

    def close(self) -> None:
        try:
            if self.checked is not None:
                self.checked.close()
        finally:
            self.file.close()

    def read(self, limit: int) -> list[Message]:
        """Whole messages available now (possibly none). Raises on shrinking or corrupt data."""
        size = os.fstat(self.fd).st_size
        if size < self.seen:
            raise TruncatedError(f"{self.path} shrank from {self.seen} to {size} bytes under the scanner")
        self.seen = size
        if size <= self.pos:
            return _EMPTY
        upto = size
        if self.checked is not None and self.checked.sums is not None:
            checked = self.checked.check(self.fd, size, self.pos, size)
            # Bytes past the last checksum record wait in the last segment (the writer records them right
            # after writing them) and are read unchecked in a finished segment.
            if not self.finished:
                upto = min(checked, size)
                if upto <= self.pos:
                    return _EMPTY
        msgs, used, problem = read_messages(self.fd, self.pos, self.offset, upto, limit, self.journal, self.chunk)
        if msgs:
            self.pos += used
            self.offset = msgs[-1].offset + 1
            return msgs
        if problem is not None and not problem.incomplete:
            raise CorruptionError(self.path, problem.position, problem.reason, size - problem.position)
        if problem is not None and upto == size:
            # An incomplete frame: a tail still being written, unless the index shows frames past it.
            e = written_past(self.index_path, self.first, self.fd, size, problem.position, self.offset)
            if e is not None:
                raise CorruptionError(self.path, problem.position, f"{problem.reason}, but the index shows a whole "
                                      f"frame for offset {e.offset} at byte {e.position} (a damaged frame, "
                                      "not a torn tail)", size - problem.position)  # fmt: skip
        return _EMPTY  # nothing new, or the rest of a frame is not written or not checked yet

    def check_same_file(self) -> None:
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            raise TruncatedError(f"{self.path} was removed under the scanner") from None
        if st.st_ino != self.ino:
            raise TruncatedError(f"{self.path} was replaced under the scanner")

    def leftover(self) -> int:
        return os.fstat(self.fd).st_size - self.pos


def _wait(event: threading.Event, deadline: float | None) -> None:
    """Wait for `event` until `deadline` (monotonic; None: no end), in slices of _WAIT_SLICE.

    A signal the kernel hands to another thread (watchdog's) does not wake a main thread blocked
    on a lock, so one long wait would leave Ctrl-C unseen until the next file event.
    """
    while True:
        step = _WAIT_SLICE if deadline is None else min(deadline - time.monotonic(), _WAIT_SLICE)
        if step <= 0 or event.wait(step):
            return


class Scanner:
    """Iterates the messages of the journal in `dir` from `offset`, in order.

    `offset` is an int, "first" (the first retained message) or "last" (only
    messages appended from now on). Iteration ends when no new message arrives
    within `timeout` seconds (None: wait forever); iterating again continues
    where it stopped. Waiting is driven by file-system events (watchdog).

    With `verify`, every block of a segment is checked against its checksums
    (sej.checksum) before its messages are yielded; a mismatch or an invalid
    checksum file raises ChecksumError (a CorruptionError). In the last segment,
    bytes are yielded once the writer has recorded their checksums (right after
    writing them); segments without checksums (old or Go-written) are read unchecked.

    `batch` is the most messages decoded at a time (what `poll` returns at most): a
    small batch keeps the messages of one in the CPU's cache while they are used; the
    bytes are read in 1 MiB chunks whatever the batch.
    """

    def __init__(
        self,
        dir: str | os.PathLike[str],
        offset: int | Literal["first", "last"] = 0,
        timeout: float | None = 1.0,
        *,
        batch: int = 256,
        verify: bool = False,
        _journal: str | None = None,
    ) -> None:
        self.dir = journal_path(dir)
        check_journal(self.dir)  # a missing directory, a root of journals
        self.timeout = _check_timeout(timeout)
        if not isinstance(batch, int) or isinstance(batch, bool) or batch < 1:
            raise InvalidArgumentError(f"batch must be a positive int, got {batch!r}")
        self._limit = batch
        if not isinstance(verify, bool):
            raise InvalidArgumentError(f"verify must be a bool, got {verify!r}")
        self._vdir = self.dir if verify else None  # the journal whose checksums _Open checks
        self._journal = _journal  # a consumer's: its messages come out as ShardMessages of this name
        self._wakeup = Wakeup()
        self._sub: Subscription | None = None
        self._sub_path = ""
        self._vsub: Subscription | None = None  # idx/, with verify: checksums come right after the bytes
        self._seg: _Open | None = None
        self._it: Iterator[Message] = iter(_EMPTY)
        self._batch: list[Message] = []  # what _it iterates: emptied at close, so nothing more comes out of it
        self._end = 0  # offset after the last message of the current batch
        self._closed = False
        try:
            self._seek(offset)
        except BaseException:
            self.close()
            raise

    @classmethod
    def at_time(
        cls,
        dir: str | os.PathLike[str],
        ts: int | _dt.datetime,
        timeout: float | None = 1.0,
        *,
        verify: bool = False,
    ) -> Scanner:
        """A scanner starting at the first message whose timestamp is >= ts (ns or aware datetime)."""
        return cls(dir, offset_at_time(dir, to_ns(ts)), timeout, verify=verify)

    # -- positioning ----------------------------------------------------------

    def _seek(self, offset: object) -> None:
        segments = list_segments(self.dir)
        if offset == "first":
            offset = segments[0].first_offset if segments else 0
        elif offset == "last":
            offset = next_offset(self.dir)
        elif not isinstance(offset, int) or isinstance(offset, bool) or not 0 <= offset <= MAX_OFFSET:
            raise InvalidArgumentError(f"offset must be an int >= 0, 'first' or 'last', got {offset!r}")
        self._end = offset
        if not segments:
            self._want = offset  # nothing to read yet: wait for the first segment
            return
        i = find_segment(segments, offset)
        if i < 0:
            raise OffsetOutOfRangeError(offset, segments[0].first_offset, next_offset(self.dir))
        if self._seg is not None:
            self._seg.close()
        seg = self._seg = _Open(segments[i], index_path(self.dir, segments[i].first_offset), self._vdir, self._journal)
        last = i == len(segments) - 1
        size = os.fstat(seg.fd).st_size
        ipath = index_path(self.dir, seg.first)
        start = seek_entry(ipath, segments[i], seg.fd, size, last, lambda index: index.floor_offset(offset))
        seg.pos, seg.offset = start.position, start.offset
        self._want = offset
        self._skip(last)

    def _skip(self, last: bool) -> None:
        """Read forward to self._want inside the current segment."""
        seg = self._seg
        assert seg is not None
        while seg.offset < self._want:
            msgs = seg.read(self._limit)
            if not msgs:
                if last:
                    raise OffsetOutOfRangeError(self._want, list_segments(self.dir)[0].first_offset, seg.offset)
                raise CorruptionError(seg.path, seg.pos, f"segment ends at offset {seg.offset}, before {self._want}")
            if msgs[-1].offset >= self._want:
                keep = msgs[self._want - msgs[0].offset :]
                self._it, self._batch = iter(keep), keep
                self._end = keep[-1].offset + 1
                return

    # -- reading --------------------------------------------------------------

    def _read_available(self) -> list[Message]:
        """Messages available now, moving on to the next segment when the current one is done."""
        seg = self._seg
        if seg is None:
            segments = list_segments(self.dir)
            if not segments:
                return _EMPTY
            self._seek(self._want)
            if length_hint(self._it):
                return list(self._it)
            seg = self._seg
            assert seg is not None
        for _ in range(1 << 20):
            msgs = seg.read(self._limit)
            if msgs:
                return msgs
            # The next segment is named after the offset that follows this one's last message.
            nxt = segment_path(self.dir, seg.offset)
            if seg.offset == seg.first or not os.path.exists(nxt):
                later = self._later_segment(seg)
                if later is None:
                    seg.check_same_file()
                    return _EMPTY
                nxt = later.path
            # A later segment exists, so the writer has finished this one: read what is left.
            seg.finished = True
            msgs = seg.read(self._limit)
            if msgs:
                self._wakeup.created = True  # look at the later segment again after these
                return msgs
            if seg.leftover() > 0:
                raise CorruptionError(seg.path, seg.pos, "incomplete message at the end of a finished segment")
            first = int(os.path.basename(nxt)[:16], 16)
            if first != seg.offset:
                raise CorruptionError(nxt, 0, f"gap: segment starts at offset {first}, expected {seg.offset}")
            seg.close()
            seg = self._seg = _Open(
                Segment(seg.offset, nxt), index_path(self.dir, seg.offset), self._vdir, self._journal
            )
        raise AssertionError("unreachable: more than 2**20 empty segments in a row")

    def _later_segment(self, seg: _Open) -> Segment | None:
        """The first segment after `seg`, looked for only when the directory changed."""
        if not self._wakeup.created:
            return None
        self._wakeup.created = False
        later = [s for s in list_segments(self.dir) if s.first_offset > seg.first]
        return later[0] if later else None

    def _next_batch(self) -> bool:
        """Load the next batch, waiting up to the timeout; False if none came."""
        if self._closed:
            raise ClosedError(f"scanner of {self.dir} is closed")
        timeout = self.timeout
        deadline = None if timeout is None else time.monotonic() + timeout
        event = self._wakeup.event
        while True:
            event.clear()
            msgs = self._read_available()
            if msgs:
                self._it, self._batch = iter(msgs), msgs
                self._end = msgs[-1].offset + 1
                return True
            if deadline is None:
                remaining = None
            else:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
            if self._subscribe():
                continue  # data may have come before the watch was in place
            _wait(event, deadline)

    def _subscribe(self) -> bool:
        """Watch the segment directory (or the journal's, until it exists); True if it changed."""
        changed = False
        if self._vdir is not None and self._vsub is None and os.path.isdir(index_dir(self.dir)):
            # The writer records checksums in idx/ right after writing the bytes they cover: bytes seen
            # before their checksums wait for an event there, not in jnl/, where the writer may write no more.
            self._vsub = Subscription(index_dir(self.dir), self._wakeup, event_filter=[FileModifiedEvent])
            changed = True
        path = segment_dir(self.dir)
        if not os.path.isdir(path):
            path = self.dir
        if self._sub_path == path:
            return changed
        if self._sub is not None:
            self._sub.close()
        self._sub = Subscription(path, self._wakeup)
        self._sub_path = path
        return True

    def __iter__(self) -> Iterator[Message]:
        # chain takes each message from the batch's iterator in C: no Python step a message.
        return chain.from_iterable(self._batches())

    def _batches(self) -> Iterator[Iterator[Message]]:
        """The current batch's iterator, then each next one's (`_it`, so `offset` follows what is taken)."""
        while True:
            yield self._it
            if not self._next_batch():
                return

    def __next__(self) -> Message:
        for m in self._it:
            return m
        if self._next_batch():
            return next(self._it)
        raise StopIteration

    def poll(self) -> Iterator[Message]:
        """The messages available now, without waiting: an iterator over one batch (call again for more,
        empty when there are none). `offset` follows what is taken from it."""
        if self._closed:
            raise ClosedError(f"scanner of {self.dir} is closed")
        if not length_hint(self._it):
            timeout, self.timeout = self.timeout, 0.0
            try:
                if not self._next_batch():
                    return iter(_EMPTY)
            finally:
                self.timeout = timeout
        return self._it

    @property
    def offset(self) -> int:
        """The next offset to read: one past the last message returned."""
        return self._end - length_hint(self._it)

    def close(self) -> None:
        """Stop watching and close the segment file; messages of the batch not taken yet are dropped. Idempotent."""
        self._closed = True
        self._end = self.offset  # still where reading stopped
        self._batch.clear()
        if self._sub is not None:
            self._sub.close()
            self._sub = None
        if self._vsub is not None:
            self._vsub.close()
            self._vsub = None
        if self._seg is not None:
            self._seg.close()
            self._seg = None

    def __enter__(self) -> Scanner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        if not getattr(self, "_closed", True):
            try:
                self.close()
            except Exception:  # interpreter shutdown: modules may be gone
                pass

    def __repr__(self) -> str:
        return f"Scanner({self.dir!r}, offset={self.offset})"


def _check_timeout(timeout: object) -> float | None:
    if timeout is None:
        return None
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout >= 0:
        raise InvalidArgumentError(f"timeout must be seconds >= 0 or None, got {timeout!r}")
    return float(timeout)
