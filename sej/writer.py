"""The journal writer: one per journal (file-locked), appending frames to the last segment.

Durability (see docs/durability.md):

- ``durability="buffered"`` (default): `append` returns with the message in this
  process's buffer. `flush()` hands it to the OS (it then survives a crash of this
  process); `sync()` also fsyncs it (it then survives a power loss).
- ``durability="flush"``: every `append` returns with the message in the OS.
- ``durability="sync"``: every `append` returns with the message fsynced. Threads
  appending at once share fsyncs (group commit): one thread fsyncs for all the
  messages written so far while the others wait for it.

`close()` flushes and fsyncs. A segment is fsynced before the writer moves on to
the next one, and a new segment's directory entry is fsynced when it is created.
"""

from __future__ import annotations

import asyncio
import atexit
import logging
import os
import struct
import sys
import threading
import time
import warnings
import weakref
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future
from itertools import islice, repeat
from typing import Any, Literal

from . import index as idx
from .acks import Acks, Delivery, LoopAcks, Pending, fail, resolve
from .aio import AioSync
from .appender import SegmentAppender
from .commit import GroupCommit
from .errors import ClosedError, CorruptionError, InvalidArgumentError, LockLostError, SyncError
from .frames import (
    BATCH_STRUCTS,
    FRAME_FORMAT,
    FRAME_STRUCTS,
    HEADER,
    MAX_OFFSET,
    OVERHEAD,
    TS_TYPE,
    frame_struct,
    sized_struct,
)
from .layout import (
    index_dir,
    journal_path,
    segment_dir,
    writer_lock_path,
)
from .lock import DirLock, lock_dir, lock_file, unlock_file
from .message import check_fields

Durability = Literal["buffered", "flush", "sync"]
DURABILITIES = ("buffered", "flush", "sync")

BUFFER_SLACK = 1 << 16
"""Buffer room beyond buffer_size, so that frames up to this size never bypass the buffer."""

LOCK_CHECK_INTERVAL = 0.1
"""Seconds between checks, when writing, that the lock file is still the one this writer locked."""

_time_ns = time.time_ns
_monotonic = time.monotonic
_running_loop = asyncio.get_running_loop
_structs = FRAME_STRUCTS
_NO_INDEX = 1 << 62
"""`_spill`'s index argument when no index entry may be written yet."""


class Writer:
    """Appends messages to the journal in `dir`, creating it if needed.

    Opening validates the tail of the last segment: a torn or corrupt tail is cut
    back to the last whole message and the cut bytes are moved to a quarantine file
    beside the segment (see `recovered`); with ``strict=True`` the writer refuses to
    open instead and raises CorruptionError, changing nothing.
    """

    __slots__ = (
        "_acks",
        "_ack_fill",
        "_ack_mark",
        "_lacks",
        "_aio",
        "_no_aio",
        "_buf",
        "_buffer_size",
        "_commit",
        "_dir_lock",
        "_fd",
        "_fill",
        "_forked_from",
        "_index",
        "_index_next",
        "_last_entry",
        "_last_klen",
        "_last_vlen",
        "_lock",
        "_lock_fh",
        "_lock_checked",
        "_lock_id",
        "_lost",
        "_mark",
        "_max_ts",
        "_next",
        "_seg",
        "_size",
        "_sync_each",
        "_written",
        "dir",
        "durability",
        "recovered",
        "segment_size",
        "__weakref__",
    )

    def __init__(
        self,
        dir: str | os.PathLike[str],
        segment_size: int = 1 << 30,
        *,
        durability: Durability = "buffered",
        buffer_size: int = 1 << 16,
        strict: bool = False,
        start_offset: int = 0,
    ) -> None:
        self.dir = journal_path(dir)
        check_options(segment_size=segment_size, durability=durability, buffer_size=buffer_size, strict=strict,
                      start_offset=start_offset)  # fmt: skip
        self.segment_size = segment_size
        self.durability: Durability = durability
        self._buffer_size = buffer_size if durability == "buffered" else 0
        # Acknowledged appends (submit, append_async) are handed to the OS by the round that fsyncs them, in
        # every mode: writing each through, as flush and sync modes do for `append`, halved the rate of
        # append_async in sync mode (a write of the segment and one of its checksums per message).
        self._ack_fill = max(self._buffer_size, BUFFER_SLACK)
        self._sync_each = durability == "sync"
        if os.path.exists(self.dir) and not os.path.isdir(self.dir):
            raise InvalidArgumentError(f"journal directory {self.dir} exists and is not a directory")
        os.makedirs(segment_dir(self.dir), exist_ok=True)
        os.makedirs(index_dir(self.dir), exist_ok=True)
        self._lock_fh = lock_file(writer_lock_path(self.dir))
        try:
            # jnl.lck is the lock a Go writer takes too; a lock on jnl/ itself holds even when jnl.lck is
            # deleted or replaced under this writer, so no second sej writer gets in then.
            self._dir_lock: DirLock | None = lock_dir(segment_dir(self.dir))
        except BaseException:
            unlock_file(self._lock_fh)
            raise
        st = os.fstat(self._lock_fh.fileno())
        self._lock_id = (st.st_dev, st.st_ino)
        self._lock_checked = _monotonic()
        self._lost: str | None = None  # why this writer must not write any more
        self._lock = threading.Lock()
        self._written = 0  # bytes handed to the OS by this writer
        # `_written` is read before `_fd`: bytes counted in it are in this file, or in one
        # the writer fsynced when it rolled over.
        self._commit = GroupCommit(_position_of(weakref.ref(self)))
        # The whole-frame struct of the last append and its frame size, and its key and value sizes: appends of
        # one size take it at once, others look theirs up in FRAME_STRUCTS.
        self._last_entry = frame_struct(0, 0)
        self._last_klen = 0
        self._last_vlen = 0
        # A fixed-capacity buffer filled in place: it is never shrunk and regrown, which
        # costs most when many writers (shards) interleave.
        self._buf: bytearray | None = bytearray(self._buffer_size + BUFFER_SLACK)
        self._fill = 0  # bytes of _buf in use
        self.recovered: CorruptionError | None = None  # what startup recovery cut, if anything
        self._acks: Acks | None = None  # futures of submit(), started by the first one
        self._lacks: LoopAcks | None = None  # append_async's futures on the loop that last asked (native AIO)
        self._aio: AioSync | None = None  # the native AIO context of _lacks, kept across event loops
        self._no_aio = False  # native AIO fsync refused once: append_async goes through _acks
        self._forked_from: int | None = None  # the process that opened it, in a child forked since (see _disown)
        try:
            self._open_last(strict, start_offset)
        except BaseException:
            self._buf = None
            self._unlock()
            raise
        _LIVE.add(self)

    # -- opening and rolling -------------------------------------------------

    def _open_last(self, strict: bool, start_offset: int) -> None:
        seg = self._seg = SegmentAppender(self.dir, strict=strict, start_offset=start_offset)
        self.recovered = seg.recovered
        self._took_segment()

    def _took_segment(self) -> None:
        """Take up the appender's current segment: its end is where the next frame goes."""
        seg = self._seg
        self._fd = seg.fd
        self._next = seg.next_offset
        self._size = seg.size
        self._max_ts = seg.max_ts
        self._index = seg.index
        self._index_next = seg.next_entry()
        self._set_mark()

    def _set_mark(self) -> None:
        """The segment size at which `append` must leave its fast path.

        One threshold stands for three: the next index entry is due, the buffer is
        full, or the segment is full.
        """
        due = self._index_next
        if due > self.segment_size:
            due = self.segment_size
        start = self._size - self._fill  # where the buffer's bytes go
        full = start + self._buffer_size
        self._mark = due if due < full else full
        full = start + self._ack_fill  # the same for acked appends (see _ack_fill)
        self._ack_mark = due if due < full else full

    def _roll(self) -> None:
        """Finish the current segment (flush, fsync) and start the next. Holds self._lock."""
        self._check_lock()
        self._spill()
        seg = self._seg
        commit = self._commit
        if self._lacks is not None:
            self._lacks.complete_locked()  # the loop's fsync in flight ends first
        commit.lead_locked(self._written)  # no other fsync of this file runs while this one does
        try:
            seg.sync()
        except SyncError as e:
            commit.end_lead(0, e)  # sticky
            raise
        except BaseException:
            commit.end_lead(0, None)
            raise
        try:
            previous = seg.start(self._next)
            commit.left_file(self._written, previous)
        finally:
            commit.end_lead(0, None)
        self._took_segment()

    # -- appending -------------------------------------------------------------

    def append(self, value: bytes, key: bytes = b"", type: int = 0, timestamp: int | None = None) -> int:
        """Append one message; return its offset.

        `timestamp` is int ns since the Unix epoch; None means now, and
        `sej.NO_TIMESTAMP` writes the "no timestamp" sentinel.
        """
        if timestamp is None:
            timestamp = _time_ns()
        self._lock.acquire()
        try:
            buf = self._buf
            if buf is None:
                raise self._closed_error()
            off = self._next
            fill = self._fill
            try:
                klen = len(key)
                vlen = len(value)
                if vlen == self._last_vlen and klen == self._last_klen:
                    st, n = self._last_entry
                else:
                    st, n = self._last_entry = _structs[klen].get(vlen) or frame_struct(klen, vlen)
                    self._last_klen = klen
                    self._last_vlen = vlen
                st.pack_into(buf, fill, off, timestamp, type, klen, key, vlen, value, n)
            except (struct.error, TypeError, OverflowError, IndexError) as e:  # IndexError: a key over 127 bytes
                n = self._place_frame(off, timestamp, type, key, value, e)  # full buffer, or bad input
            else:
                self._fill = fill + n
            self._next = off + 1
            pos = self._size
            size = self._size = pos + n
            if timestamp > self._max_ts:
                self._max_ts = timestamp
            if size < self._mark:
                return off
            self._crossed_mark(off, pos)
            if not self._sync_each:
                return off
            ticket = self._written
        finally:
            self._lock.release()
        self._wait_durable(ticket)
        return off

    def _put_one(self, value: bytes, key: bytes, type: int, timestamp: int) -> int:
        """`append` without waiting for durability, for submit() and append_async(); its offset. Holds self._lock.

        The lines repeat append's on purpose: append is the hot path, and calling this from it
        would cost it about a tenth of its speed (one more Python call per message).
        """
        buf = self._buf
        if buf is None:
            raise self._closed_error()
        off = self._next
        fill = self._fill
        try:
            klen = len(key)
            vlen = len(value)
            if vlen == self._last_vlen and klen == self._last_klen:
                st, n = self._last_entry
            else:
                st, n = self._last_entry = _structs[klen].get(vlen) or frame_struct(klen, vlen)
                self._last_klen = klen
                self._last_vlen = vlen
            st.pack_into(buf, fill, off, timestamp, type, klen, key, vlen, value, n)
        except (struct.error, TypeError, OverflowError, IndexError) as e:
            n = self._place_frame(off, timestamp, type, key, value, e)
        else:
            self._fill = fill + n
        self._next = off + 1
        pos = self._size
        size = self._size = pos + n
        if timestamp > self._max_ts:
            self._max_ts = timestamp
        if size >= self._ack_mark:
            self._crossed_mark(off, pos, True)
        return off

    def _crossed_mark(self, off: int, pos: int, acked: bool = False) -> None:
        """The slow part of an append of the frame `off` at `pos`: index, spill, roll.

        An `acked` frame (submit, append_async) stays in the buffer up to `_ack_fill` bytes, whatever the mode."""
        if pos >= self._index_next:
            self._index.index.add(off, pos, self._max_ts)
            self._index_next = pos + idx.INTERVAL
        elif self._size < self.segment_size and self._fill < (self._ack_fill if acked else self._buffer_size):
            return  # the frame ends past the next index entry's place: the next frame takes it (the marks stay)
        if self._fill >= (self._ack_fill if acked else self._buffer_size):
            self._spill(idx.BATCH if acked or self._buffer_size else 1)  # write-through modes write the index too
        if self._size >= self.segment_size:
            self._roll()
        self._set_mark()

    def _place_frame(self, off: int, ts: int, typ: int, key: bytes, value: bytes, exc: Exception) -> int:
        """Encode a frame that did not fit the buffer's free space; return its size.

        Spills the buffer first; a frame bigger than the whole buffer is written
        straight out. A frame that cannot be encoded at all raises InvalidArgumentError.
        """
        try:
            klen, vlen = len(key), len(value)
            st = sized_struct(FRAME_FORMAT, klen, vlen)
        except (struct.error, TypeError, OverflowError):
            raise _bad_input(off, ts, typ, key, value, exc) from None
        n = klen + vlen + OVERHEAD
        buf = self._buf
        assert buf is not None
        if self._fill + n <= len(buf):  # it fitted: the fields themselves are bad
            raise _bad_input(off, ts, typ, key, value, exc) from None
        try:
            frame = st.pack(off, ts, typ, klen, key, vlen, value, n)
        except (struct.error, TypeError, OverflowError) as e:
            raise _bad_input(off, ts, typ, key, value, e) from None
        self._spill(idx.BATCH)
        if n <= len(buf):
            buf[:n] = frame
            self._fill = n
        else:
            self._write(frame)
        self._set_mark()
        return n

    def append_many(
        self,
        values: Iterable[bytes],
        key: bytes = b"",
        type: int = 0,
        timestamp: int | None = None,
        *,
        keys: Iterable[bytes] | None = None,
    ) -> range:
        """Append many messages with one type and timestamp; return their offsets.

        All messages get `key`, or with `keys` one key each (same length as
        `values`). Faster than calling `append` in a loop.
        """
        vals, keyseq, timestamp = _many_args(values, type, timestamp, keys)
        with self._lock:
            offsets = self._put_many(vals, key, keyseq, type, timestamp)
            if not self._sync_each:
                return offsets
            ticket = self._written
        self._wait_durable(ticket)
        return offsets

    def _put_many(
        self, vals: Sequence[bytes], key: bytes, keyseq: Sequence[bytes] | None, type: int, timestamp: int
    ) -> range:
        """Append the messages; their offsets. Holds self._lock."""
        if self._buf is None:
            raise self._closed_error()
        first = self._next
        i = 0
        n = len(vals)
        while i < n:
            i = self._encode_run(vals, key, keyseq, type, timestamp, i)
            if self._size >= self.segment_size:
                self._roll()
        return range(first, self._next)

    # -- acknowledged appends (sej.acks) ------------------------------------------

    def submit(
        self,
        value: bytes,
        key: bytes = b"",
        type: int = 0,
        timestamp: int | None = None,
        *,
        on_delivery: Delivery | None = None,
    ) -> Future[int]:
        """Append one message; return a Future of its offset, resolved once the message is fsynced.

        The append itself is as fast as a buffered one; one fsync then covers every message
        submitted before it started (group commit shared with `sync()` and sync-mode appends).
        `on_delivery(error, offset)` is called once the message is durable (error None) or
        cannot be (offset None), on the writer's acknowledgement thread. A failed fsync fails
        the future with SyncError; `close()` resolves every pending future first.
        """
        if timestamp is None:
            timestamp = _time_ns()
        with self._lock:
            off = self._put_one(value, key, type, timestamp)
            return (self._acks or self._start_acks()).add(off, on_delivery)

    def submit_many(
        self,
        values: Iterable[bytes],
        key: bytes = b"",
        type: int = 0,
        timestamp: int | None = None,
        *,
        keys: Iterable[bytes] | None = None,
        on_delivery: Delivery | None = None,
    ) -> Future[range]:
        """`append_many`, acknowledged as one: a Future of the offsets, resolved once all are fsynced."""
        vals, keyseq, ts = _many_args(values, type, timestamp, keys)
        with self._lock:
            offsets = self._put_many(vals, key, keyseq, type, ts)
            return (self._acks or self._start_acks()).add(offsets, on_delivery)

    def append_async(
        self, value: bytes, key: bytes = b"", type: int = 0, timestamp: int | None = None
    ) -> asyncio.Future[int]:
        """Append one message now; return an asyncio future of its offset, done once it is fsynced.

        `await writer.append_async(value)` waits without blocking the event loop. Call it from
        a running event loop; the futures one fsync covers are resolved in one hand-off to it.
        """
        loop = _running_loop()
        fut: asyncio.Future[int] = loop.create_future()
        if timestamp is None:
            timestamp = _time_ns()
        self._lock.acquire()
        try:
            # _put_one's and _ack_on_loop's lines, repeated: calling them instead cost 7% of this path's
            # Python (64 producers, fsync a no-op: 386k against 417k msg/s).
            buf = self._buf
            if buf is None:
                raise self._closed_error()
            off = self._next
            fill = self._fill
            try:
                klen = len(key)
                vlen = len(value)
                if vlen == self._last_vlen and klen == self._last_klen:
                    st, n = self._last_entry
                else:
                    st, n = self._last_entry = _structs[klen].get(vlen) or frame_struct(klen, vlen)
                    self._last_klen = klen
                    self._last_vlen = vlen
                st.pack_into(buf, fill, off, timestamp, type, klen, key, vlen, value, n)
            except (struct.error, TypeError, OverflowError, IndexError) as e:
                n = self._place_frame(off, timestamp, type, key, value, e)
            else:
                self._fill = fill + n
            self._next = off + 1
            pos = self._size
            size = self._size = pos + n
            if timestamp > self._max_ts:
                self._max_ts = timestamp
            if size >= self._ack_mark:
                self._crossed_mark(off, pos, True)
            la = self._lacks
            if la is None or la.loop is not loop:
                la = self._loop_acks(loop)
                if la is None:
                    (self._acks or self._start_acks()).add_async(off, loop, fut)
                    return fut
            la.pending.append((fut, off))
            if not la.busy:
                la.busy = True
                loop.call_soon(la.kick)
        finally:
            self._lock.release()
        return fut

    async def append_many_async(
        self,
        values: Iterable[bytes],
        key: bytes = b"",
        type: int = 0,
        timestamp: int | None = None,
        *,
        keys: Iterable[bytes] | None = None,
    ) -> range:
        """`append_many`, awaited until every message is fsynced (one fsync for the batch); the offsets."""
        vals, keyseq, ts = _many_args(values, type, timestamp, keys)
        loop = _running_loop()
        fut: asyncio.Future[range] = loop.create_future()
        with self._lock:
            offsets = self._put_many(vals, key, keyseq, type, ts)
            self._ack_on_loop(loop, fut, offsets)
        return await fut

    def _start_acks(self) -> Acks:
        self._acks = Acks(self)
        return self._acks

    def _ack_on_loop(self, loop: asyncio.AbstractEventLoop, fut: asyncio.Future[Any], result: Any) -> None:
        """Resolve `fut` with `result` once the bytes appended so far are fsynced. Holds self._lock."""
        la = self._lacks
        if la is None or la.loop is not loop:
            la = self._loop_acks(loop)
            if la is None:
                (self._acks or self._start_acks()).add_async(result, loop, fut)
                return
        la.pending.append((fut, result))
        if not la.busy:
            la.busy = True
            loop.call_soon(la.kick)

    def _loop_acks(self, loop: asyncio.AbstractEventLoop) -> LoopAcks | None:
        """append_async's acknowledgements on `loop` through native AIO, or None (use _acks). Holds self._lock."""
        old = self._lacks
        if old is not None:
            if old.loop.is_running() or not (old.idle or old.loop.is_closed()):
                return None  # another event loop uses it (or will again): this one goes through _acks
            old.take()  # idle, or its loop is closed and nobody can await its futures any more
            self._lacks = None
            old.close(aio_too=False)
        if self._no_aio:
            return None
        aio = self._aio
        if aio is None:
            aio = self._aio = AioSync.open()
            if aio is None:
                self._no_aio = True
                return None
        try:
            self._lacks = LoopAcks(self, loop, aio)
        except (NotImplementedError, RuntimeError, OSError):  # a loop that cannot watch a descriptor
            self._no_aio = True
            self._aio = None
            aio.close()
            return None
        return self._lacks

    def _drop_loop_acks(self, la: LoopAcks) -> None:
        """Stop using `la` and the writer's AIO context (closing, or the kernel refused an fsync). Holds self._lock."""
        if self._lacks is la:
            self._lacks = None
        self._aio = None
        la.close(aio_too=True)

    def _spill_for_acks(self, acks: Acks) -> tuple[list[Pending], int]:
        """The pending futures and the bytes written once their messages are handed to the OS."""
        with self._lock:
            batch = acks.take()
            error: BaseException | None = None
            if batch and self._buf is not None:
                try:
                    self._spill()
                except BaseException as e:  # lock lost, disk full: these messages are not durable
                    error = e
            if error is None:
                return batch, self._written
        fail(batch, error)  # without the lock: an on_delivery callback may append again
        return [], 0

    def _encode_run(
        self,
        vals: Sequence[bytes],
        key: bytes,
        keys: Sequence[bytes] | None,
        typ: int,
        ts: int,
        i: int,
    ) -> int:
        """Encode vals[i:] until the segment is full, and buffer or write it; return where it stopped."""
        index = self._index.index
        off = self._next
        pos = self._size
        index_next = self._index_next
        limit = self.segment_size
        max_ts = self._max_ts if self._max_ts >= ts else ts  # one timestamp for the whole batch
        parts: list[bytes] = []
        add = parts.append
        structs = BATCH_STRUCTS
        ts_type = TS_TYPE.pack(ts, typ)  # checked by _many_args
        start = off
        ks = vs = -1  # the sizes of `st`
        st = None
        size = 0
        try:
            for k, value in zip(repeat(key) if keys is None else islice(keys, i, None), islice(vals, i, None)):
                klen = len(k)
                vlen = len(value)
                if vlen != vs or klen != ks:
                    st, size = structs[klen].get(vlen) or frame_struct(klen, vlen, True)
                    ks = klen
                    vs = vlen
                add(st.pack(off, ts_type, klen, k, vlen, value, size))  # type: ignore[union-attr]
                if pos >= index_next:
                    index.add(off, pos, max_ts)
                    index_next = pos + idx.INTERVAL
                off += 1
                pos += size
                if pos >= limit:
                    break
        except (struct.error, TypeError, OverflowError, IndexError) as e:
            raise _bad_input(off, ts, typ, k, value, e) from None
        finally:
            # Whatever was encoded is committed, so offsets, sizes and the index stay consistent.
            if parts:
                self._next = off
                self._size = pos
                self._index_next = index_next
                self._max_ts = max_ts
                data = b"".join(parts)
                buf = self._buf
                assert buf is not None
                fill = self._fill
                batch = idx.BATCH if self._buffer_size else 1  # write-through modes write the index too
                if fill == 0 and len(data) >= self._buffer_size:
                    self._write(data)  # a batch that fills the buffer goes straight out
                    self._index.flush(batch)
                elif fill + len(data) <= len(buf):
                    buf[fill : fill + len(data)] = data
                    self._fill = fill + len(data)
                    if self._fill >= self._buffer_size:
                        self._spill(batch)
                else:
                    self._spill(_NO_INDEX)  # the new entries point into `data`: written after it
                    self._write(data)
                    self._index.flush(batch)
                self._set_mark()
        return i + off - start

    # -- flushing and syncing --------------------------------------------------

    def _check_lock(self) -> None:
        """Raise LockLostError unless the lock path still names the file this writer locked.

        A deleted or replaced `jnl.lck` (the Go writer deletes it on close) would let a
        second writer lock a new file and write the same offsets. Holds self._lock.
        """
        self._lock_checked = _monotonic()
        if self._lost is None:
            path = writer_lock_path(self.dir)
            try:
                st = os.lstat(path)
            except FileNotFoundError:
                self._lost = "was deleted"
            else:
                if (st.st_dev, st.st_ino) != self._lock_id:
                    self._lost = "was replaced"
        if self._lost is not None:
            raise LockLostError(writer_lock_path(self.dir), self._lost)

    def _spill(self, index: int = 1) -> None:
        """Write the buffer to the OS, then the index entries if `index` or more wait. Holds self._lock.

        A spill of a full buffer lets up to idx.BATCH entries wait (opening the index file costs more than
        the write); flush(), sync(), rollover and close() write them all."""
        fill = self._fill
        if self._lost is not None:
            self._check_lock()  # raises: not even the index is written any more
        if fill:
            buf = self._buf
            assert buf is not None
            before = self._written
            try:
                self._write(memoryview(buf)[:fill])
            finally:
                done = self._written - before
                if done < fill:  # keep what could not be written, for a retry
                    buf[: fill - done] = buf[done:fill]
                self._fill = fill - done
                self._set_mark()
        self._index.flush(index)  # after the data it points to

    def _write(self, data: bytes | bytearray | memoryview) -> None:
        """Write all of `data` to the segment, counting what was written even on error."""
        if self._lost is not None or _monotonic() - self._lock_checked >= LOCK_CHECK_INTERVAL:
            self._check_lock()
        seg = self._seg
        before = seg.size
        try:
            seg.write(data)
        finally:
            self._written += seg.size - before

    def flush(self) -> None:
        """Hand every appended message to the OS: readers see it, a crash of this process keeps it."""
        with self._lock:
            if self._buf is None:
                raise self._closed_error()
            self._check_lock()
            self._spill()  # the index after the data it points to

    def sync(self) -> None:
        """flush(), then fsync: every appended message survives a power loss."""
        with self._lock:
            if self._buf is None:
                raise self._closed_error()
            self._check_lock()
            self._spill()  # the index after the data it points to
            ticket = self._written
        self._wait_durable(ticket)

    def _wait_durable(self, ticket: int) -> None:
        """Return once the first `ticket` written bytes are fsynced (group commit, sej.commit)."""
        self._commit.wait(ticket)

    # -- state -----------------------------------------------------------------

    @property
    def next_offset(self) -> int:
        """Offset the next appended message will get."""
        return self._next

    @property
    def closed(self) -> bool:
        return self._buf is None

    def close(self) -> None:
        """Flush, fsync and close; release the lock (the lock file stays). Idempotent.

        Pending `submit` futures are resolved once the final fsync is done (or failed with its
        error); appends and submits from other threads fail with ClosedError from the moment
        close starts.
        """
        with self._lock:
            if self._buf is None:
                return
            left = self._acks.take() if self._acks is not None else []
            lacks = self._lacks
            if lacks is not None:  # its pending and in-flight futures: the final fsync covers them
                left += lacks.take()
                self._drop_loop_acks(lacks)
            elif self._aio is not None:
                self._aio.close()
                self._aio = None
            try:
                self._spill()
                self._index.flush()
            except BaseException as e:
                self._release(flush_index=False)
                error: BaseException | None = e
            else:
                error = None
            ticket = self._written
            self._buf = None  # closing: nothing more is appended
        if error is not None:
            fail(left, error)  # without the lock: an on_delivery callback may call the writer
            raise error
        try:
            if sys.is_finalizing():
                # Closed by __del__ at exit: daemon threads stop for good at their next Python step now, and a
                # committer stopped while it led the group commit would be waited for forever. Fsync here.
                with self._lock:
                    self._seg.sync()
            else:
                if self._acks is not None:
                    self._acks.stop()
                    self._acks.join()  # its last fsync done: no thread uses the files any more
                # A strong reference while this waits: in __del__ the weak one is dead already.
                weak = self._commit.use_position(lambda: (self._written, self._fd))
                try:
                    self._wait_durable(ticket)
                finally:
                    self._commit.use_position(weak)  # no reference cycle left behind
        except BaseException as e:
            fail(left, e)
            with self._lock:
                self._release(flush_index=True)
            raise
        with self._lock:
            self._release(flush_index=True)
        resolve(left)

    def _closed_error(self) -> ClosedError:
        if self._forked_from is not None:
            return ClosedError(f"writer of {self.dir} belongs to process {self._forked_from}, which this process "
                               "was forked from: open a Writer in this process instead")  # fmt: skip
        return ClosedError(f"writer of {self.dir} is closed")

    def _disown(self) -> None:
        """In a child forked from the writer's process: closed for this process without writing or unlocking.

        The buffer, the files and the lock are the parent's. Closing as usual here would write the
        parent's buffered messages a second time. The segment's descriptors stay open until collected.
        """
        if self._buf is None:
            return
        self._forked_from = os.getppid()
        self._lock = threading.Lock()  # a thread of the parent may have held it when it forked
        # Kept open, the child's copies would keep the journal locked after the parent dies.
        self._unlock()  # closes only this process's copies (see unlock_file, DirLock.release)
        self._buf = None
        self._acks = None  # its thread was not forked
        self._lacks = None
        self._aio = None  # an AIO context belongs to the process that made it

    def _release(self, flush_index: bool) -> None:
        """Close the files and release the lock. Holds self._lock."""
        self._buf = None
        if self._acks is not None:
            self._acks.stop()
        self._commit.close()
        try:
            if flush_index:
                self._seg.close()
            else:
                self._seg.drop()
        finally:
            self._unlock()

    def _unlock(self) -> None:
        """Release jnl.lck and the lock on jnl/ (in a forked child: close its copies only)."""
        try:
            unlock_file(self._lock_fh)
        finally:
            if self._dir_lock is not None:
                self._dir_lock.release()

    def __enter__(self) -> Writer:
        return self

    def __del__(self) -> None:
        # Like an unclosed file: warn, and do not lose the buffer.
        if getattr(self, "_buf", None) is not None and hasattr(self, "_index"):
            warnings.warn(f"unclosed {self!r}", ResourceWarning, source=self, stacklevel=1)
            try:
                self.close()
            except Exception:
                pass

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"next_offset={self._next}"
        return f"Writer({self.dir!r}, {state}, durability={self.durability!r})"


def _many_args(
    values: Iterable[bytes], type: int, timestamp: int | None, keys: Iterable[bytes] | None
) -> tuple[Sequence[bytes], Sequence[bytes] | None, int]:
    """append_many's arguments checked: (values, keys, timestamp) as sequences and an int."""
    if timestamp is None:
        timestamp = _time_ns()
    vals: Sequence[bytes] = values if isinstance(values, (list, tuple)) else list(values)
    keyseq: Sequence[bytes] | None = None
    if keys is not None:
        keyseq = keys if isinstance(keys, (list, tuple)) else list(keys)
        if len(keyseq) != len(vals):
            raise InvalidArgumentError(f"keys has {len(keyseq)} items but values has {len(vals)}")
    try:
        HEADER.pack(0, timestamp, type, 0)
    except (struct.error, TypeError, OverflowError) as e:
        raise _bad_input(0, timestamp, type, b"", b"", e) from None
    return vals, keyseq, timestamp


_LIVE: weakref.WeakSet[Writer] = weakref.WeakSet()
"""The writers open in this process: disowned in a child forked from it, closed at exit."""


def _after_fork_in_child() -> None:
    for w in list(_LIVE):
        w._disown()


EXIT_WAIT = 10.0
"""Seconds the exit waits for a writer another thread is using before it closes it."""


def _close_at_exit() -> None:
    """Close the writers still open when the interpreter exits, while threads still run (atexit): leaving
    it to __del__ fails where a daemon thread keeps a writer's module, or the writer, alive."""
    log = logging.getLogger("sej.writer")
    for w in list(_LIVE):
        if w.closed:
            continue
        if not w._lock.acquire(timeout=EXIT_WAIT):  # a thread stuck holding it must not hang the exit
            log.error("%r was still busy %g s into the exit: not closed", w, EXIT_WAIT)
            continue
        w._lock.release()
        try:
            w.close()
        except Exception:
            log.exception("closing %r at exit failed", w)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
atexit.register(_close_at_exit)


def _position_of(ref: weakref.ReferenceType[Writer]) -> Callable[[], tuple[int, int]]:
    """The writer's (bytes written, segment descriptor) for its group commit, without a reference cycle
    (an unclosed writer must be collected, and closed, as soon as it is dropped)."""

    def position() -> tuple[int, int]:
        w = ref()
        assert w is not None, "a writer waits for its own fsyncs"
        return w._written, w._fd

    return position


def _bad_input(off: int, ts: object, typ: object, key: object, value: object, exc: Exception) -> Exception:
    """The InvalidArgumentError that names what made encoding fail."""
    try:
        check_fields(off, ts, typ, key, value)
        for name, obj in (("key", key), ("value", value)):
            if not isinstance(obj, (bytes, bytearray)):
                return InvalidArgumentError(f"{name} must be bytes or bytearray, got {type(obj).__name__}")
    except InvalidArgumentError as e:
        return e
    return InvalidArgumentError(f"cannot encode message at offset {off}: {exc}")


def check_options(**options: object) -> None:
    """Raise InvalidArgumentError for an unknown Writer option or a bad value."""
    for name, value in options.items():
        if name == "segment_size":
            _check_int(name, value, 1, 1 << 62)
        elif name == "buffer_size":
            _check_int(name, value, 0, 1 << 40)
        elif name == "start_offset":
            _check_int(name, value, 0, MAX_OFFSET)
        elif name == "durability":
            if value not in DURABILITIES:
                raise InvalidArgumentError(f"durability must be one of {DURABILITIES}, got {value!r}")
        elif name == "strict":
            if not isinstance(value, bool):
                raise InvalidArgumentError(f"strict must be a bool, got {value!r}")
        else:
            raise InvalidArgumentError(f"unknown Writer option {name!r}")


def _check_int(name: str, value: object, lo: int, hi: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or not lo <= value <= hi:
        raise InvalidArgumentError(f"{name} must be an int in {lo}..{hi}, got {value!r}")


__all__ = ["Writer", "Durability", "DURABILITIES", "check_options"]
