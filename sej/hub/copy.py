"""Copying a journal exactly once: the destination is always a byte-for-byte prefix of its source.

A copy resumes from the destination's next offset, reads only the source bytes it
lacks (same segment files, same positions), checks every frame (sizes, offset
sequence) before writing it, fsyncs, and only then commits its position on the
source as an ordinary reader offset, so the producer's retention keeps what the
hub has not copied. Whatever interrupts it (SIGKILL, a cut connection), the next
copy's recovery cuts a torn destination tail aside and resumes.
"""

from __future__ import annotations

import bisect
import logging
import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable
from typing import NamedTuple

from .. import index as idx
from ..appender import SegmentAppender
from ..checksum import BLOCK, RECORD, Sum, Verifier, check_header, parse_records
from ..checksum import HEADER as SUM_HEADER
from ..chunks import BigFrame, FrameChunks
from ..errors import SejError
from ..frames import HEADER, I32, NO_TIMESTAMP, Frames, Problem, walk_frames
from ..fsutil import allow_open_files, fsync_dir, open_dir, open_files_limit, sync_file_system, syncfs_reports_errors
from ..layout import index_dir, list_segments, segment_dir, segment_name, segment_path, writer_lock_path
from ..lock import lock_journal
from ..segment import chain_back, next_entry_after
from .names import destination_name
from .source import Source, SourceSegment

log = logging.getLogger("sej.hub")

CHUNK = 32 << 20
"""Bytes asked of the source per read."""

SYNC_EVERY = 64 << 20
"""Bytes written between fsyncs within a copy (a copy always ends with one, before its commit)."""

CHECK_WINDOW = 4096
"""Bytes at the end of the destination compared with the source before every copy."""

NO_END = 1 << 63
"""The end of a source segment's range where no checksums bound it: its reads end where the file ends."""

VERIFY = True
"""Check copied bytes against the producer's checksums. Only the benchmark turns this off, to measure the cost."""


class CopyError(SejError):
    """A journal's copy stopped: the source disagrees with what the hub already has."""


class CopyResult(NamedTuple):
    journal: str  # the source journal's name
    destination: str  # the hub's journal directory
    messages: int  # copied this time
    bytes: int
    next_offset: int  # the destination's next offset now
    segment: str = ""  # the destination's last segment (its file name) now, "" before the first
    size: int = 0  # its size
    more: bool = False  # a SyncBatch's copy stopped before the next segment: copy again after the batch's sync
    sums: SumsMark | None = None  # how far the producer's checksum file of `segment` was read: the next copy reads on


class SumsMark(NamedTuple):
    """How far a copy read the producer's checksum file of a segment, so that the next copy reads only what follows.

    A writer flushing one message at a time adds a 16-byte record per message: read whole on every pass,
    the file of a filling 1 GiB segment made each pass cost time in its number of messages. `offset`: the
    file position after the anchor, the last record read that ends within the hub's copy (`end`, `digest`).
    The next read takes the header and the file from the anchor on, and is used only if the anchor is still
    there, byte for byte, and the hub's copy still reaches `end`; else the whole file is read (as before).
    """

    segment: str  # the segment's file name
    offset: int
    end: int
    digest: int

    def skip(self, segment: str, hub_size: int) -> int:
        """`read_sums`'s skip for `segment` from this mark (0: read whole), the hub's copy of it `hub_size` bytes."""
        return self.offset - RECORD.size if segment == self.segment and self.end <= hub_size else 0


class _Destination:
    """The hub's copy of one journal, under its writer lock: appends whole frames to mirrored segments."""

    def __init__(self, dir: str) -> None:
        self.dir = dir
        os.makedirs(segment_dir(dir), exist_ok=True)  # a journal, also before its first segment
        os.makedirs(index_dir(dir), exist_ok=True)
        self.lock = lock_journal(dir)  # as a writer's: jnl.lck and jnl/
        self.seg: SegmentAppender | None = None
        self.next: int | None = None
        self.max_ts = NO_TIMESTAMP
        self.unsynced = 0  # bytes of the segment not known to be durable
        self.written = 0  # of those, the bytes this copy wrote since its last sync (a failed sync cuts them)
        self.sums_unsynced = False  # the checksums' bytes may not be durable (an fsync of the segment leaves them)
        self.names_unsynced = False  # a segment was created without the fsyncs of its directories (SyncBatch)
        self.sums_mark: SumsMark | None = None  # of the last segment, set by the copy that read its checksums
        self._held: tuple[object, tuple[int, int], tuple[int, int]] | None = None  # still_current's: file, inodes
        self.ahead = False  # opened ahead (Destinations.open_ahead) and not taken since: nothing written through it
        try:
            listed = list_segments(dir)
            if listed:
                self.seg = SegmentAppender(dir, listed=listed)  # a torn tail from an interrupted copy is cut aside
                self.next, self.max_ts = self.seg.next_offset, self.seg.max_ts
                # A copy killed before its fsync leaves bytes the page cache holds and the disk may not:
                # they are made durable with the next, before a next segment is created or anything committed.
                self.unsynced = self.seg.size
                self.sums_unsynced = True
        except BaseException:
            self.close()
            raise

    @property
    def name(self) -> str:
        return segment_name(self.seg.first) if self.seg is not None else ""

    @property
    def size(self) -> int:
        return self.seg.size if self.seg is not None else 0

    @property
    def index(self) -> idx.Appender | None:
        return self.seg.index if self.seg is not None else None

    def start_segment(self, first: int, durable: bool = True) -> None:
        """Begin the segment named `first` (the source's next segment).

        Not `durable` (a SyncBatch's copy, which wrote nothing into the current segment since the batch
        made it durable): nothing already durable is fsynced again, and the new segment's name is made
        durable by the batch. The current segment is durable, with its checksums and name, before the
        next one exists either way (recovery looks at the last segment only).
        """
        if durable:
            self.sync()
        elif self.seg is not None:
            assert not self.written, "a SyncBatch's copy syncs what it wrote before the next segment"
            self.sync()  # bytes of a reopened journal, not known durable: fsynced on their own
            if self.sums_unsynced and self.seg.sums is not None:
                self.seg.sums.sync()  # the segment was fsynced on its own (reopened, or SYNC_EVERY)
            if self.names_unsynced:
                fsync_dir(segment_dir(self.dir))
                fsync_dir(index_dir(self.dir))
        if self.seg is None:
            self.seg = SegmentAppender(self.dir, start_offset=first, durable=durable)
        else:
            previous = self.seg.start(first, durable)
            if previous is not None:
                previous.close()
        self.sums_unsynced = self.names_unsynced = not durable
        self.sums_mark = None
        self.next = first
        self.max_ts = NO_TIMESTAMP

    def read_tail(self, size: int) -> bytes:
        """The last `size` bytes of the current segment."""
        start = max(0, self.size - size)
        return os.pread(self.seg.fd, self.size - start, start) if self.seg is not None else b""

    def write(self, data: bytes | memoryview) -> None:
        assert self.seg is not None
        before = self.seg.size
        self.sums_unsynced = True
        try:
            self.seg.write(data)
        finally:
            self.unsynced += self.seg.size - before
            self.written += self.seg.size - before

    def cut(self, size: int) -> None:
        """Drop the bytes of the current segment from `size` on (a frame this copy copied only in part)."""
        assert self.seg is not None
        dropped = self.seg.size - size
        self.seg.cut(size)
        self.unsynced, self.written = max(0, self.unsynced - dropped), max(0, self.written - dropped)
        self.sums_unsynced = True

    def sync(self) -> None:
        """fsync the segment if it has bytes not known durable, then write its index entries."""
        if self.seg is None:
            return
        if self.unsynced:
            self.seg.sync()
            self.unsynced = self.written = 0
        else:
            self.seg.index.flush()

    @property
    def needs_sync(self) -> bool:
        """Whether anything of the journal is not known to be durable: a SyncBatch must sync it."""
        return bool(self.unsynced or self.sums_unsynced or self.names_unsynced)

    def sync_all(self) -> None:
        """Make everything durable with fsyncs of its own (the segment, its checksums, new names)."""
        self.sync()
        if self.seg is not None and self.seg.sums is not None and self.sums_unsynced:
            self.seg.sums.sync()
        if self.names_unsynced:
            fsync_dir(segment_dir(self.dir))
            fsync_dir(index_dir(self.dir))
        self.synced()

    def synced(self) -> None:
        """Everything written is durable now (a SyncBatch's syncfs): write the index entries that wait for it."""
        self.unsynced = self.written = 0
        self.sums_unsynced = self.names_unsynced = False
        if self.seg is not None:
            self.seg.index.flush()

    def discard_unsynced(self) -> None:
        """Cut what this copy wrote since its last sync, which a failed sync may have lost under a page cache
        that still shows it: the next copy writes it again. Best effort (the journal is dropped next)."""
        if self.seg is not None and self.written:
            try:
                self.seg.cut(self.seg.size - self.written)
            except OSError as e:
                log.error("%s: cannot cut the bytes a failed sync may have lost: %s", self.dir, e)

    @property
    def dev(self) -> int:
        """The file system (st_dev) of the segment written."""
        assert self.seg is not None
        return os.fstat(self.seg.fd).st_dev

    def still_current(self) -> bool:
        """Whether the files this holds open are still the journal's (same inodes; the segment at the size
        written): nothing else may have removed, replaced or changed them since. Looked at now, just before the
        copy writes (not from a stat the pass took earlier: the file may have been replaced since)."""
        if self.seg is None:
            return False
        try:
            held = self._held
            if held is None or held[0] is not self.seg.file:  # an open file's inode never changes: fstat'ed once
                seg, lock = os.fstat(self.seg.fd), os.fstat(self.lock.fileno())
                held = self._held = (self.seg.file, (seg.st_dev, seg.st_ino), (lock.st_dev, lock.st_ino))
            there = os.stat(segment_path(self.dir, self.seg.first), follow_symlinks=False)
            if (there.st_dev, there.st_ino) != held[1] or there.st_size != self.seg.size:  # same inode: its size
                return False
            there = os.stat(writer_lock_path(self.dir), follow_symlinks=False)
            return (there.st_dev, there.st_ino) == held[2]
        except OSError:
            return False

    def close(self, synced: bool = False) -> None:
        """Close; `synced`: everything written is durable (a syncfs), so nothing is fsynced again."""
        try:
            if self.seg is not None:
                # Opened ahead and never used: nothing of it is less durable than before (a copy through it would
                # have made it durable before committing), so nothing is fsynced.
                self.seg.close(synced or self.ahead or not self.needs_sync)
        finally:
            self.lock.release()

    def drop(self) -> None:
        """Close without writing anything more (its writes could not be made durable)."""
        try:
            if self.seg is not None:
                self.seg.drop()
        finally:
            self.lock.release()


class StaleMark(Exception):
    """A SumsMark's anchor is not in the checksum file (it was rewritten, or is shorter): read it whole."""


class _SumCheck:
    """The producer's checksums of one segment, checking the bytes the hub is about to write (end to end).

    `limit`: in the source's last segment, bytes past the last checksum record wait for the next pass
    (the producer records bytes right after writing them); None: copy everything (a finished segment).
    """

    def __init__(
        self,
        raw: bytes,
        seg: SourceSegment,
        dest: _Destination,
        last: bool,
        fail: Callable[[str], CopyError],
        mark: SumsMark | None = None,
    ):
        """`raw`: the checksum file; with `mark`, its header and then the file from the mark's anchor on
        (`source.read_sums(..., skip=mark.offset - RECORD.size)`): a StaleMark when the anchor is not there."""
        self.fail = fail
        problem = check_header(raw, seg.first_offset)
        if problem is not None:
            raise fail(f"invalid checksum file: {problem}")
        body = memoryview(raw)[SUM_HEADER.size :]
        body = body[: len(body) - len(body) % RECORD.size]
        if mark is None:
            self.base, prev, anchor = SUM_HEADER.size, 0, []
        else:
            if body[: RECORD.size] != RECORD.pack(mark.end, mark.digest):
                raise StaleMark
            self.base, prev, anchor = mark.offset - RECORD.size, mark.end, [Sum(mark.end, mark.digest)]
            body = body[RECORD.size :]
        records, problem = parse_records(body, prev, (self.base - SUM_HEADER.size) // RECORD.size + len(anchor))
        if problem is not None:
            raise fail(f"invalid checksum file: {problem}")
        records = anchor + records
        self.segment, self.records = seg.name, records  # records[k] ends the file's bytes at base + 16 (k + 1)
        pos = dest.size
        sums = dest.seg.sums if dest.seg is not None else None
        if sums is not None and sums.hasher.pos == pos:
            self.v = Verifier(hasher=sums.hasher)
        else:  # the hub's segment has no checksums of its own here: hash the block's start from its file
            start = pos // BLOCK * BLOCK
            self.v = Verifier(pos, dest.read_tail(pos - start) if pos > start else b"")
        m = self.v.add(records)
        if m is not None:
            raise fail(f"checksum mismatch in bytes {m.start}..{m.end}")
        if not last and self.v.covered > seg.size:
            raise fail(f"the checksum file covers bytes up to {self.v.covered}, past the segment's end ({seg.size})")
        # In the last segment, copy up to the last record within the size listed (records after it may be for
        # bytes written since the listing; `beyond` says whether there are such records, see at_end).
        self.limit = max((r.end for r in records if r.end <= seg.size), default=0) if last else None
        self.beyond = self.v.covered > seg.size

    def check(self, data: bytes | memoryview, pos: int) -> None:
        """Check the bytes `data` at `pos` that checksums cover and were not checked yet; raise CopyError."""
        v = self.v
        lo, hi = v.pos - pos, min(len(data), v.covered - pos)
        if lo < 0:
            raise self.fail(f"bytes {pos}..{v.pos} were not checked")  # never: reads go in order
        if hi > lo:
            m = v.feed(memoryview(data)[lo:hi])
            if m is not None:
                raise self.fail(f"checksum mismatch in bytes {m.start}..{m.end}")

    def mark(self, size: int) -> SumsMark | None:
        """The mark of the last record read that ends within the hub's `size` bytes (None: none does)."""
        k = bisect.bisect_right(self.records, size, key=lambda r: r.end)
        if k == 0:
            return None
        r = self.records[k - 1]
        return SumsMark(self.segment, self.base + RECORD.size * k, r.end, r.digest)

    def at_end(self, size: int | None) -> None:
        """The source segment now has `size` bytes: checksums past that are corrupt (the producer writes
        bytes before their checksums)."""
        if size is not None and self.v.covered > size:
            raise self.fail(f"the checksum file covers bytes up to {self.v.covered}, past the segment's end ({size})")


OPEN_JOURNALS = 4096
"""The most hub journals kept open (Destinations) by a process, over all clients (FILES_PER_JOURNAL files each)."""

FILES_PER_JOURNAL = 4
"""The descriptors a hub journal kept open holds: its writer locks (jnl.lck and jnl/), its last segment and that
segment's checksum file."""


def open_journals() -> int:
    """How many hub journals to keep open: OPEN_JOURNALS, fewer if the open-files limit cannot be raised."""
    allow_open_files(FILES_PER_JOURNAL * OPEN_JOURNALS + 1024)
    soft = open_files_limit(unknown=1024)  # unknown: none kept
    if soft is None:
        return OPEN_JOURNALS
    return max(0, min(OPEN_JOURNALS, (soft - 1024) // FILES_PER_JOURNAL))


class Destinations:
    """The hub's journals kept open between passes (the daemon's): each one's writer lock, last segment
    and index stay open, so a pass that copies a little into many journals does not reopen and recover
    each one. At most `limit` are open (a journal given back when they are is closed).

    An open journal is used again only while its files are still the ones it holds, the segment at the
    size it wrote (`_Destination.still_current`); otherwise it is closed and the journal opened afresh,
    with recovery. A copy that fails closes its journal.
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._open: OrderedDict[str, _Destination] = OrderedDict()
        self._lock = threading.Lock()

    def take(self, dir: str) -> _Destination:
        """The hub's journal `dir`, kept open if it still is current (_Destination.still_current), else opened now."""
        with self._lock:
            dest = self._open.pop(dir, None)
        if dest is not None:
            if dest.still_current():
                dest.ahead = False
                return dest
            dest.close()
        return _Destination(dir)

    def open_ahead(self, dirs: Iterable[str]) -> int:
        """Open the existing hub journals `dirs` now, as if given back: `sej copy` opens those its state knows while
        it connects (each costs a recovery of its tail, 0.2 ms; at a distance the SSH handshake and the producer's
        start leave the time). One that cannot be opened now is left to its copy, which says why. The number opened.
        """
        opened = 0
        for d in dirs:
            if len(self._open) >= self.limit:
                break
            if d in self._open or not os.path.isdir(segment_dir(d)):
                continue  # not a hub journal yet: its copy makes it
            try:
                dest = _Destination(d)
            except (SejError, OSError):
                continue
            dest.ahead = True
            self.give(dest)
            opened += 1
        return opened

    def give(self, dest: _Destination) -> None:
        """Keep `dest` open if there is room; else close it. None is closed to make room: a pass copies its journals
        in turn, so closing the least recently used would keep none of those the next pass copies first once there
        are more than `limit`; this way `limit` stay open and each pass copies into them without reopening them
        (which ones may change: a journal given back while a kept one is being copied takes its place)."""
        with self._lock:
            if len(self._open) < self.limit or dest.dir in self._open:
                self._open[dest.dir] = dest
                return
            # Closed under the lock: a `take` of this journal must not open it before its lock is released.
            _close_all([dest])

    def close(self) -> None:
        with self._lock:
            dests, self._open = list(self._open.values()), OrderedDict()
        _close_all(dests)

    def __len__(self) -> int:
        return len(self._open)


def _close_all(dests: list[_Destination]) -> None:
    """Close every journal, also after one failed to (its lock is released all the same); then raise the first
    error: a journal left open would keep its writer lock until the process ends."""
    error: BaseException | None = None
    for d in dests:
        try:
            d.close()
        except BaseException as e:  # noqa: BLE001 - raised after the others are closed
            error = error or e
    if error is not None:
        raise error


PENDING_LIMIT = 1024
"""The most hub journals a process's SyncBatches hold open at once, waiting for their syncfs (FILES_PER_JOURNAL
files each): a batch that reaches it syncs what it holds early (or waits for the other batches to)."""

_pending_slots = threading.BoundedSemaphore(PENDING_LIMIT)

SLOT_WAIT = 1.0
"""Seconds a batch holding no journal waits, once, for the other batches to free a slot; then (and for the rest of
the batch) a copy that finds none is made durable by itself, with fsyncs: a batch stuck behind a hung producer
must not hold up the passes of the others."""


class SyncBatch:
    """Copies made durable together by one syncfs of the hub's file system, not an fsync each (a pass's).

    Created before the copies write: syncfs then reports any write-back error on that file system
    since (sej.fsutil.sync_file_system), so none of theirs goes unnoticed. A copy into a journal on
    another file system (a mount below the hub root) is fsynced on its own. Until `sync` returns, no
    copy added is durable, and none may be committed on its source. A batch holding PENDING_LIMIT
    journals (over all batches) syncs them early. 1,000 journals with one new message each: one
    syncfs 0.02 s, their fsyncs 0.15-0.3 s (2 threads), on this project's machine.
    """

    def __init__(self, root: str, destinations: Destinations | None = None) -> None:
        self._fd = open_dir(root, follow=True)  # the hub root itself may be a symlink its operator made
        # A file system whose syncfs may not report write-back errors gets fsyncs (as if another one's).
        self._dev = os.fstat(self._fd).st_dev if syncfs_reports_errors(self._fd) else -1
        self._destinations = destinations
        self._pending: list[_Destination] = []
        self._lock = threading.Lock()
        self.dirs: set[str] = set()
        """The hub's journal directories of the copies added."""
        self.failed: set[str] = set()
        """Those whose copies could not be made durable (by an early sync, or by `sync`)."""
        self._error: OSError | None = None
        self._waited = False

    def add(self, dest: _Destination) -> None:
        """Hold `dest` until the sync (it needs_sync). While the process holds PENDING_LIMIT, the batch syncs what
        it holds early; holding none, it waits for the other batches (SLOT_WAIT), else syncs `dest` by itself."""
        while not _pending_slots.acquire(blocking=False):
            if self._flush():
                continue
            if not self._waited and _pending_slots.acquire(timeout=SLOT_WAIT):
                break
            self._waited = True
            with self._lock:
                self.dirs.add(dest.dir)
            try:
                self._sync([dest], alone=True)
            except OSError as e:
                self._error = self._error or e
                self.failed.add(dest.dir)
            return
        with self._lock:
            self._pending.append(dest)
            self.dirs.add(dest.dir)

    def _flush(self) -> bool:
        """Sync what the batch holds now; a failure is kept for `sync` to raise. False if it held nothing."""
        with self._lock:
            pending, self._pending = self._pending, []
            if not pending:
                return False
            try:
                self._sync(pending)
            except OSError as e:
                self._error = self._error or e
                self.failed.update(d.dir for d in pending)
            return True

    def _sync(self, pending: list[_Destination], alone: bool = False) -> None:
        """Make `pending` durable, then give each back (or close it); each slot is released (`alone`: they hold
        none, and are fsynced each)."""
        try:
            try:
                others = pending if alone else [d for d in pending if d.dev != self._dev]
                if len(others) < len(pending):
                    sync_file_system(self._fd)
                for d in others:
                    d.sync_all()
            except BaseException:
                for d in pending:
                    try:
                        d.discard_unsynced()
                    finally:
                        try:
                            d.drop()
                        except OSError as e:
                            log.error("%s: closing the hub's journal: %s", d.dir, e)
                raise
            for d in pending:
                try:
                    d.synced()
                    if self._destinations is not None:
                        self._destinations.give(d)
                    else:
                        d.close(synced=True)
                except Exception as e:  # durable already: its index entries (derived) are rebuilt when reopened
                    log.warning("%s: closing the hub's journal after its sync: %s", d.dir, e)
                    d.drop()
        finally:
            for _ in () if alone else pending:
                _pending_slots.release()

    def sync(self) -> None:
        """Make every copy added durable, then give each back to `destinations` (or close it).

        OSError when that failed for some (`failed`): none of their copies is durable then, each was cut
        back to what was durable and closed without writing more (the next copy writes it again).
        """
        self._flush()
        if self._error is not None:
            raise self._error

    def close(self) -> None:
        """Close the batch; copies still in it (a pass stopped before `sync`) are fsynced and closed each."""
        with self._lock:
            pending, self._pending = self._pending, []
        try:
            for d in pending:
                try:
                    d.sync_all()
                except OSError as e:
                    log.error("%s: %s", d.dir, e)
                    d.discard_unsynced()
                    d.drop()
                    continue
                d.close(synced=True)
        finally:
            for _ in pending:
                _pending_slots.release()
            os.close(self._fd)


def copy_journal(
    source: Source,
    journal: str,
    dest_root: str,
    client_id: str,
    reader: str,
    stop: threading.Event | None = None,
    on_bytes: Callable[[int], None] | None = None,
    chunk: int = CHUNK,
    destinations: Destinations | None = None,
    batch: SyncBatch | None = None,
) -> CopyResult:
    """Copy what `dest_root/<client_id>.<journal>` lacks of the source journal; then commit `reader`.

    Raises CopyError naming client, journal, file and position when the source
    shrank, was rewritten, has a gap or a corrupt frame; nothing already copied
    is changed then. With `destinations`, the hub's journal is taken from there and left
    open there after a successful copy. With `batch`, the copy's last bytes are made durable
    by `batch.sync()`, so the source must keep the commit for after it (`defers_commit`).
    """
    if batch is not None and not source.defers_commit:
        raise ValueError("a copy made durable by a SyncBatch needs a source that commits after it")
    dest_dir = os.path.join(dest_root, destination_name(client_id, journal))
    dest = destinations.take(dest_dir) if destinations is not None else _Destination(dest_dir)
    kept = False
    try:
        result = _copy_into(dest, source, journal, dest_dir, client_id, reader, stop, on_bytes, chunk,
                            sync=batch is None)  # fmt: skip
        if batch is not None and dest.needs_sync:
            batch.add(dest)  # the batch syncs it, then gives it back or closes it
            kept = True
            return result
        dest.sync()
        if destinations is not None:
            destinations.give(dest)
            kept = True
        return result
    finally:
        if not kept:
            try:
                dest.sync()
            finally:
                dest.close()


def _copy_into(
    dest: _Destination,
    source: Source,
    journal: str,
    dest_dir: str,
    client_id: str,
    reader: str,
    stop: threading.Event | None,
    on_bytes: Callable[[int], None] | None,
    chunk: int,
    sync: bool = True,
) -> CopyResult:
    where = f"client {client_id}, journal {journal}"
    copied = copied_bytes = 0
    src = source.segments(journal)
    if not src:
        return CopyResult(journal, dest_dir, 0, 0, dest.next or 0, dest.name, dest.size, sums=dest.sums_mark)
    i = _resume_point(source, journal, src, dest, where)
    if dest.next is None:
        dest.next = src[0].first_offset  # a new copy starts where the source's retention starts
    more = False
    while i < len(src):
        seg = src[i]
        if dest.name != seg.name:
            if seg.first_offset != dest.next:
                raise CopyError(
                    f"{where}: gap: {source.describe(journal, seg.name)} starts at offset "
                    f"{seg.first_offset}, the hub's copy continues at {dest.next}"
                )
            if not sync and dest.seg is not None and dest.written:
                # A segment is durable before the next exists (recovery looks only at the last one): here that
                # waits for the batch's syncfs, and the copy goes on after it (copy_all's layers), not an fsync.
                more = True
                break
            dest.start_segment(seg.first_offset, durable=sync)
        last_listed = i == len(src) - 1
        n, b, finished = _copy_segment(source, journal, seg, dest, where, stop, on_bytes, chunk, last_listed)
        copied += n
        copied_bytes += b
        if not finished and not last_listed:
            # A later segment exists, so the writer had finished this one: nothing may be left.
            raise CopyError(
                f"{where}: {source.describe(journal, seg.name)} ends with an incomplete message at byte "
                f"{dest.size}, but a later segment exists"
            )
        if stop is not None and stop.is_set():
            break
        i += 1
    if sync:
        dest.sync()
    assert dest.next is not None
    # Commit only a change: a hub polling every second must not rewrite every producer's file.
    if copied or source.read_offset(journal, reader) != dest.next:
        source.commit_offset(journal, reader, dest.next)
    return CopyResult(journal, dest_dir, copied, copied_bytes, dest.next, dest.name, dest.size, more, dest.sums_mark)


def _resume_point(source: Source, journal: str, src: list[SourceSegment], dest: _Destination, where: str) -> int:
    """Index of the source segment the copy continues in, after checking the hub's copy still matches it."""
    if dest.next is None or (dest.size == 0 and dest.name == ""):
        return 0
    names = [s.name for s in src]
    if dest.name not in names:
        # Retention deleted the hub's last segment after the hub had all of it (its reader offset was past
        # it): the copy continues in the source's segment that starts at the hub's next offset. Retention
        # deletes a journal's first segments only, so every segment the source still has must start at or
        # after the hub's next offset: one starting before it, inside the hub's last segment or before it
        # (whose name the hub's last segment would follow), means the source was rewritten. The first
        # starting later is a gap, never skipped.
        start = src[0].first_offset
        if start == dest.next:
            return 0
        if start > dest.next:
            raise CopyError(
                f"{where}: gap: offsets {dest.next}..{start - 1} are gone from the source (retention deleted "
                f"them before the hub copied them); the hub's copy ends at {dest.next} in {dest.name}, the "
                f"source's next segment is {source.describe(journal, src[0].name)}"
            )
        raise CopyError(
            f"{where}: the source no longer has {dest.name} (the hub has {dest.size} bytes of it): "
            f"deleted or rewritten under the hub; first source segment is {names[0]}"
        )
    k = names.index(dest.name)
    seg = src[k]
    if seg.size < dest.size:
        raise CopyError(
            f"{where}: {source.describe(journal, seg.name)} shrank to {seg.size} bytes; "
            f"the hub already has {dest.size} bytes of it"
        )
    mine = dest.read_tail(CHECK_WINDOW)
    theirs = source.read(journal, seg.name, dest.size - len(mine), len(mine))
    if mine != theirs:
        raise CopyError(
            f"{where}: {source.describe(journal, seg.name)} was rewritten: its bytes "
            f"{dest.size - len(mine)}..{dest.size} differ from the hub's copy"
        )
    return k


def _copy_segment(
    source: Source,
    journal: str,
    seg: SourceSegment,
    dest: _Destination,
    where: str,
    stop: threading.Event | None,
    on_bytes: Callable[[int], None] | None,
    chunk: int,
    last: bool = True,
) -> tuple[int, int, bool]:
    """Copy the frames the hub lacks of one segment; (messages, bytes, reached a clean end).

    Bytes the producer's checksums cover are checked against them before they are written (a
    mismatch raises CopyError, and nothing from the bad block on is written); in the source's
    `last` segment only bytes covered by checksums are copied. A segment without a checksum file
    (written by Go, or before checksums) is copied unchecked.
    """
    sums: _SumCheck | None = None
    if VERIFY and seg.size > dest.size:

        def fail(what: str) -> CopyError:
            return CopyError(f"{where}: {source.describe(journal, seg.name)}: {what}; copying stopped before it")

        # Read before the bytes (the producer records them after writing); from the last copy's mark on, if
        # the hub's copy still reaches its anchor (recovery may have cut it back).
        mark = dest.sums_mark or source.sums_mark(journal, seg.name)
        skip = mark.skip(seg.name, dest.size) if mark is not None else 0
        if skip:
            raw = source.read_sums(journal, seg.name, skip)
            try:
                sums = _SumCheck(raw, seg, dest, last, fail, mark) if raw is not None and mark else None
            except StaleMark:
                sums = None
        if sums is None:
            raw = source.read_sums(journal, seg.name)
            sums = _SumCheck(raw, seg, dest, last, fail) if raw is not None else None
    try:
        return _copy_segment_checked(source, journal, seg, dest, where, stop, on_bytes, chunk, sums)
    finally:
        if sums is not None:
            dest.sums_mark = sums.mark(dest.size) or dest.sums_mark


def _copy_segment_checked(
    source: Source,
    journal: str,
    seg: SourceSegment,
    dest: _Destination,
    where: str,
    stop: threading.Event | None,
    on_bytes: Callable[[int], None] | None,
    chunk: int,
    sums: _SumCheck | None,
) -> tuple[int, int, bool]:
    """_copy_segment's loop: the source's bytes from the hub's end read with the one chunked frame reader
    (sej.chunks), walked (and checked against `sums`) a chunk at a time; a frame bigger than a chunk is
    checked by its trailing size field and then streamed (_copy_big_frame), so memory stays bounded
    whatever size a frame claims."""
    assert dest.next is not None and dest.index is not None
    index = dest.index.index
    next_entry = next_entry_after(index)
    messages = copied = 0
    if stop is not None and stop.is_set():
        return messages, copied, True
    limit = None if sums is None else sums.limit  # in the last segment, bytes past it wait for their checksums

    def read(pos: int, n: int) -> bytes:
        return source.read(journal, seg.name, pos, n)

    def step(data: bytes, n: int, at: int) -> tuple[tuple[Frames, bytes], int, Problem | None]:
        if sums is not None:
            sums.check(data, at)
        assert dest.next is not None
        f = walk_frames(data, 0, n, at, dest.next, dest.max_ts, next_entry, index)
        return (f, data), f.used, f.problem

    chunks = FrameChunks(read, dest.size, NO_END if limit is None else limit, step, chunk, grow=False)
    for item in chunks:
        if isinstance(item, BigFrame):
            if not _copy_big_frame(source, journal, seg, dest, where, item, chunk, stop, on_bytes, sums):
                return messages, copied, False
            ts = HEADER.unpack_from(item.head, 0)[1]
            if ts > dest.max_ts:
                dest.max_ts = ts
            if item.position >= next_entry:
                index.add(dest.next, item.position, dest.max_ts)
                next_entry = item.position + idx.INTERVAL
            messages += 1
            copied += item.total
            dest.next += 1
        else:
            f, data = item
            dest.write(memoryview(data)[: f.used])
            if dest.unsynced >= SYNC_EVERY:
                dest.sync()  # the offset on the source moves only after a sync (see copy_journal)
            messages += f.next_offset - dest.next
            copied += f.used
            dest.next, dest.max_ts, next_entry = f.next_offset, f.max_ts, f.next_entry
            if on_bytes is not None:
                on_bytes(f.used)
        if stop is not None and stop.is_set() and chunks.stop is None:  # else what ends the read is reported
            return messages, copied, True
    end = chunks.stop
    assert end is not None
    problem = end.problem
    if problem is None:
        if limit is not None and end.position >= limit and sums is not None and sums.beyond:
            sums.at_end(source.size(journal, seg.name))  # checked once the listed bytes are copied
        return messages, copied, True  # the end, or the rest is not covered by checksums yet
    if not problem.incomplete:
        raise CopyError(
            f"{where}: corrupt frame in {source.describe(journal, seg.name)} at byte "
            f"{problem.position}: {problem.reason}; copying stopped before it"
        )
    if not end.big and (sums is None or sums.v.covered < end.end):
        # The end for now: a message still being written, unless whole frames follow it. Only where no checksums
        # cover the bytes: where they do, the bytes are the writer's own, and a writer writes each frame whole or,
        # its write cut short (a full disk), writes the rest when it can. What looks like frames in a frame's
        # first bytes is then its value (any bytes), never proof of damage: the hub waits for the rest.
        resume = chain_back(read, problem.position, end.end, dest.next)
        if resume is not None:
            raise CopyError(
                f"{where}: corrupt frame in {source.describe(journal, seg.name)} at byte {problem.position}: "
                f"{problem.reason}, but whole frames for offsets {resume.first_offset}..{resume.next_offset - 1} "
                "follow it; copying stopped before it"
            )
    return messages, copied, False  # (a frame bigger than a read: not all there, or covered by checksums, yet)


def _copy_big_frame(
    source: Source,
    journal: str,
    seg: SourceSegment,
    dest: _Destination,
    where: str,
    big: BigFrame,
    chunk: int,
    stop: threading.Event | None,
    on_bytes: Callable[[int], None] | None,
    sums: _SumCheck | None = None,
) -> bool:
    """Copy the frame `big` (bigger than a read, its trailing size field checked by the reader) in reads of
    `chunk` bytes from its first bytes read; False if a stop request came first.

    Whatever stops it midway (a stop request, an error) cuts the destination back to its start.
    """
    start, total = big.position, big.total
    done = 0
    piece = big.head
    try:
        while True:
            dest.write(piece)
            done += len(piece)
            if done >= total:
                break
            if stop is not None and stop.is_set():
                dest.cut(start)
                return False
            piece = source.read(journal, seg.name, start + done, min(chunk, total - done))
            if not piece:
                raise CopyError(
                    f"{where}: {source.describe(journal, seg.name)} shrank under the copy at byte {start + done}"
                )
            if sums is not None:
                sums.check(piece, start + done)
        if dest.read_tail(4) != I32.pack(total):  # what was read, not only what was checked first
            raise CopyError(f"{where}: {source.describe(journal, seg.name)} changed under the copy at byte {start}")
    except BaseException:
        dest.cut(start)
        raise
    if on_bytes is not None:
        on_bytes(total)
    return True
