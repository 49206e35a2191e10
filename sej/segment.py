"""Reading one segment file's structure: walking frames in large chunks, checking the index.

Everything here reads with os.pread on a file descriptor (never mmap: a file that
shrinks under a mapping kills the process with SIGBUS) and never writes the segment.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import NamedTuple

from . import index as idx
from .chunks import BigFrame, FrameChunks, pread_full, preader
from .frames import (
    HEADER,
    HEADER_SIZE,
    I32,
    MAX_KEY,
    NO_TIMESTAMP,
    OVERHEAD,
    Frames,
    Message,
    Problem,
    check_frame,
    decode_batch,
    frame_total,
    walk_frames,
)
from .fsutil import open_file
from .index import Entry, SparseIndex
from .layout import Segment

CHUNK = 1 << 20


class Walk(NamedTuple):
    """Where a forward walk of a segment stopped."""

    end: int  # position after the last whole, valid frame
    next_offset: int  # offset of the next frame
    max_ts: int  # largest timestamp of the frames before `end`
    problem: Problem | None  # why it stopped before `size`; None at a clean end
    size: int  # the file size the walk went to
    resume: Resume | None = None  # whole frames after a damaged one, from the next offset to the end of the file
    later: Resume | None = None  # the same, maybe not from the next offset (some lost): damage, not a tail


class Resume(NamedTuple):
    """Whole, valid frames that follow a damaged frame and reach the end of the file (see chain_back)."""

    position: int  # where the first of these frames starts
    next_offset: int  # one past the last frame's offset
    max_ts: int  # largest timestamp of these frames
    first_offset: int  # the first frame's offset: above the damaged frame's, not always the next one


def next_entry_after(index: SparseIndex | None) -> int:
    """The segment position at or after which `index` wants its next entry."""
    if index is None:
        return 1 << 63
    return index.tail().position + idx.INTERVAL if len(index) else 0


def walk(
    fd: int,
    start: Entry,
    size: int,
    index: SparseIndex | None = None,
) -> Walk:
    """Validate frames from `start` to `size`; add index entries to `index` on the way.

    Reads with the one chunked frame reader (sej.chunks), frames bigger than a chunk checked by
    their trailing size field instead of read whole, however big they are.
    """
    offset, max_ts = start.offset, start.max_ts
    next_entry = next_entry_after(index)

    def step(data: bytes, n: int, at: int) -> tuple[Frames, int, Problem | None]:
        f = walk_frames(data, 0, n, at, offset, max_ts, next_entry, index)
        return f, f.used, f.problem

    chunks = FrameChunks(preader(fd), start.position, size, step, CHUNK, grow=False)
    for f in chunks:
        if isinstance(f, BigFrame):
            ts = HEADER.unpack_from(f.head, 0)[1]
            if ts > max_ts:
                max_ts = ts
            if f.position >= next_entry and index is not None:
                index.add(offset, f.position, max_ts)
                next_entry = f.position + idx.INTERVAL
            offset += 1
        else:
            offset, max_ts, next_entry = f.next_offset, f.max_ts, f.next_entry
    stop = chunks.stop
    assert stop is not None
    if stop.problem is None:
        return Walk(stop.position, offset, max_ts, None, stop.end)
    return _stopped(fd, stop.position, offset, max_ts, stop.problem, stop.end)


def _stopped(fd: int, pos: int, offset: int, max_ts: int, problem: Problem, size: int) -> Walk:
    """The walk that stopped at `pos` for `problem`; damage, not a torn tail, when whole frames follow it."""
    later = chain_back(lambda p, n: pread_full(fd, n, p), pos, size, offset)
    resume = later
    if later is not None:
        problem = _as_damage(problem, offset, later)
        if later.first_offset != offset + 1 or not _one_frame(fd, pos, later.position):
            # Later frames, but not right after the damaged one: proof of damage for readers, yet
            # no journal that goes on after it, so recovery cuts (and keeps the bytes) rather than
            # skip offsets or keep frames that a forward walk contradicts.
            resume = None
    return Walk(pos, offset, max_ts, problem, size, resume, later)


def _one_frame(fd: int, lo: int, hi: int) -> bool:
    """Whether bytes [lo, hi) are one frame by its header's sizes or by its trailing size field.

    A frame damaged in one place keeps at least one of the two, so the frames after it start
    exactly where it ends: nothing else lies in between.
    """
    if hi - lo < OVERHEAD:
        return False
    trailer = os.pread(fd, 4, hi - 4)
    if len(trailer) == 4 and I32.unpack(trailer)[0] == hi - lo:
        return True
    head = pread_full(fd, min(HEADER_SIZE + MAX_KEY + 4, hi - lo), lo)
    return frame_total(head, 0, len(head)) == hi - lo


def _as_damage(problem: Problem, offset: int, resume: Resume) -> Problem:
    return Problem(problem.position, f"{problem.reason}, but whole frames for offsets {resume.first_offset}.."
                   f"{resume.next_offset - 1} follow it (a damaged frame, not a torn tail)", False)  # fmt: skip


class Chunk:
    """The last chunk a reader read from one segment (see read_messages): the next batches decode from it.

    A segment only grows (a reader that sees it shrink stops), so bytes read once stay what the file holds.
    """

    __slots__ = ("data", "at")

    def __init__(self) -> None:
        self.data = b""
        self.at = 0  # the file position of data[0]


def read_messages(
    fd: int,
    pos: int,
    offset: int,
    size: int,
    limit: int = 1 << 62,
    journal: str | None = None,
    chunk: Chunk | None = None,
) -> tuple[list[Message], int, Problem | None]:
    """Decode whole frames of file bytes [pos, size), at least one however big.

    Returns the messages (ShardMessages of `journal`, if given), the bytes they took,
    and the Problem (absolute position) that stopped decoding before `size`, if any.
    With `chunk`, whole frames already in the chunk read last are decoded from it, and
    a new read is kept there: a reader decoding small batches reads each byte once.
    """
    if chunk is not None:
        data, at = chunk.data, chunk.at
        stop = min(size - at, len(data))
        if at <= pos < at + stop:
            msgs, nxt, _problem = decode_batch(data, pos - at, stop, offset, limit, journal)
            if msgs:  # what stopped it (the chunk's end, damage) is found again by a fresh read
                return msgs, nxt - (pos - at), None

    def step(data: bytes, n: int, at: int) -> tuple[list[Message], int, Problem | None]:
        if chunk is not None:
            chunk.data, chunk.at = data, at
        return decode_batch(data, 0, n, offset, limit, journal)

    chunks = FrameChunks(preader(fd), pos, size, step, CHUNK)
    for out in chunks:  # the first whole frames, and the Problem that ends the read after them if one does
        assert not isinstance(out, BigFrame)
        return out, chunks.pos - pos, chunks.stop.problem if chunks.stop is not None else None
    problem = chunks.stop.problem if chunks.stop is not None else None
    if problem is not None and problem.incomplete:
        problem = _damaged(fd, problem, offset, size)
    return [], 0, problem


def _damaged(fd: int, problem: Problem, offset: int, size: int) -> Problem:
    """`problem` (an incomplete frame at its position), unless whole frames follow it: then damage."""
    resume = chain_back(lambda p, n: pread_full(fd, n, p), problem.position, size, offset)
    return problem if resume is None else _as_damage(problem, offset, resume)


def chain_back(read: Callable[[int, int], bytes], lo: int, size: int, offset: int) -> Resume | None:
    """Whole, valid frames of offsets above `offset` that end exactly at `size` and start after `lo`.

    Walks backward from `size` by the trailing size fields, through consecutive offsets, as far
    as the frames chain (down to `offset + 1` at most). A frame stuck at `lo` with offset `offset`
    (a size pointing past the end, a bad field) that such frames follow was damaged in place: a
    writer's torn tail is a prefix of one frame, never followed by a later whole frame. Frames
    may be missing between the two (bytes deleted). `read(pos, n)` reads the file.
    """
    end, expect, last, max_ts = size, None, 0, NO_TIMESTAMP
    found: Resume | None = None
    buf, buf_at = b"", size  # bytes [buf_at, buf_at + len(buf)) of the file, read backward in chunks
    while end - lo > OVERHEAD:  # each step moves `end` back by at least OVERHEAD bytes
        if end - 4 < buf_at:
            buf_at = max(lo, end - CHUNK)
            buf = read(buf_at, end - buf_at)
            if len(buf) != end - buf_at:
                return None  # the file shrank under us: nothing is known
        (total,) = I32.unpack_from(buf, end - 4 - buf_at)
        start = end - total
        if total < OVERHEAD or start <= lo:
            break
        if start < buf_at:  # a frame bigger than the buffer: read its header alone
            head = read(start, HEADER_SIZE + MAX_KEY + 4)
            at = 0
        else:
            head, at = buf, start - buf_at
        if len(head) - at < HEADER_SIZE:
            break
        off, ts, _typ, ks = HEADER.unpack_from(head, at)
        if ks < 0 or len(head) - at < HEADER_SIZE + ks + 4 or (expect is not None and off != expect):
            break
        if total - OVERHEAD - ks < 0 or I32.unpack_from(head, at + HEADER_SIZE + ks)[0] != total - OVERHEAD - ks:
            break
        if off <= offset:
            break
        if expect is None:
            last = off
        if ts > max_ts:
            max_ts = ts
        found = Resume(start, last + 1, max_ts, off)
        if off == offset + 1:
            break
        expect, end = off - 1, start
    return found


def frame_end(fd: int, size: int, entry: Entry) -> int | None:
    """The end of the whole, valid frame with the entry's offset at the entry's position (None if there is none)."""
    if entry.position + OVERHEAD > size:
        return None

    def step(data: bytes, n: int, _at: int) -> tuple[int, int, Problem | None]:
        r = check_frame(data, 0, n, entry.offset)
        return (r, r, None) if isinstance(r, int) else (0, 0, r)

    for f in FrameChunks(preader(fd), entry.position, size, step, CHUNK, grow=False):  # a bigger frame: by its trailer
        return entry.position + (f.total if isinstance(f, BigFrame) else f)
    return None


def entry_is_valid(fd: int, size: int, entry: Entry) -> bool:
    """Whether a whole, valid frame with the entry's offset starts at the entry's position."""
    return frame_end(fd, size, entry) is not None


def written_past(dir_index_path: str, first_offset: int, fd: int, size: int, pos: int, offset: int) -> Entry | None:
    """An index entry past `pos` at a whole, valid frame of offset `offset` or later (None if there is none).

    For readers deciding whether a frame stuck at `pos` (offset `offset`) is a tail still being
    written: the writer adds an entry only for a frame it wrote, so such an entry shows that the
    stuck frame is a damaged one. Never used to cut anything. Reads the last 64 entries only.
    """
    for e in reversed(idx.load_last(dir_index_path, first_offset, 64)):
        if e.position <= pos:
            break
        if e.offset >= offset and entry_is_valid(fd, size, e):
            return e
    return None


def entry_confirmed(fd: int, size: int, index: SparseIndex, i: int) -> bool:
    """Whether entry `i` is what the writer wrote: checked against the segment, not just plausible.

    A walk from the entry before it (or from the segment's start) must reach the entry's
    frame exactly, and the entry's max_ts must be the running maximum of that walk. A
    lone frame at the entry's position is not enough: it may be one stored inside a
    value (a relay's journal), and a wrong max_ts would make a time seek skip messages.
    """
    entry = index[i]
    if i == 0:  # the writer's first entry is always the segment's first frame
        anchor = Entry(index.first_offset, 0, NO_TIMESTAMP)
        if entry.position != 0 or entry.offset != index.first_offset:
            return False
    else:  # entries go strictly forward: a walk from the one before must cross at least one frame
        anchor = index[i - 1]
        if anchor.position >= entry.position or anchor.offset >= entry.offset:
            return False
    end = frame_end(fd, size, entry)
    if end is None:
        return False
    w = walk(fd, anchor, end)
    return w.problem is None and w.end == end and w.next_offset == entry.offset + 1 and w.max_ts == entry.max_ts


def trusted_prefix(fd: int, size: int, index: SparseIndex) -> int:
    """Drop the index entries that do not match the segment; return how many were dropped.

    The last entry is confirmed first (the usual case: all good). Otherwise a binary
    search finds the last confirmed entry, assuming, as the writer guarantees, that the
    good entries form a prefix. Seeks confirm the entries they use again (seek_entry).
    """
    n = len(index)
    if n == 0 or entry_confirmed(fd, size, index, n - 1):
        return 0
    lo, hi = 0, n - 1  # entries [0, lo) known good; entry hi known bad
    while lo < hi:
        mid = (lo + hi) // 2
        if entry_confirmed(fd, size, index, mid):
            lo = mid + 1
        else:
            hi = mid
    index.truncate(lo)
    return n - lo


def open_index(dir_index_path: str, seg: Segment, fd: int, size: int) -> tuple[SparseIndex, bool]:
    """Load a segment's index and keep its trusted entries; (index, unchanged_on_disk)."""
    loaded = idx.load(dir_index_path, seg.first_offset)
    if loaded is None:
        return SparseIndex(seg.first_offset), False
    dropped = trusted_prefix(fd, size, loaded)
    return loaded, dropped == 0


def seek_index(dir_index_path: str, seg: Segment, fd: int, size: int, is_last: bool) -> SparseIndex:
    """A trusted index of the segment for seeking, rebuilt when missing or stale.

    A rebuilt index of a finished segment is saved; the last segment's index file
    belongs to its writer, so that one is rebuilt in memory only.
    """
    index, on_disk = open_index(dir_index_path, seg, fd, size)
    if on_disk and len(index):
        return index
    return rebuild_index(dir_index_path, seg, fd, size, is_last, index)


def rebuild_index(
    dir_index_path: str, seg: Segment, fd: int, size: int, is_last: bool, index: SparseIndex | None = None
) -> SparseIndex:
    """Complete `index` (default: a new one) by walking the segment; save it if the segment is finished."""
    if index is None:
        index = SparseIndex(seg.first_offset)
    walk(fd, index.tail(), size, index)
    if not is_last:
        try:
            idx.save(dir_index_path, index)
        except OSError:
            pass  # a read-only journal: the index is derived data, seeking still works
    return index


def seek_entry(
    dir_index_path: str, seg: Segment, fd: int, size: int, is_last: bool, pick: Callable[[SparseIndex], int]
) -> Entry:
    """The index entry `pick` chooses, checked against the segment (the index is rebuilt if it is wrong)."""
    index = seek_index(dir_index_path, seg, fd, size, is_last)
    for _ in range(2):
        i = pick(index)
        # The chosen entry and the one after it (which bounds a time seek) must both hold.
        if all(entry_confirmed(fd, size, index, k) for k in (i, i + 1) if 0 <= k < len(index)):
            return index[i] if i >= 0 else Entry(seg.first_offset, 0, NO_TIMESTAMP)
        index = rebuild_index(dir_index_path, seg, fd, size, is_last)
    raise AssertionError(f"{seg.path}: a freshly built index entry does not match the segment")


def tail(dir_index_path: str, seg: Segment) -> tuple[Walk, SparseIndex, bool]:
    """Walk a segment from its last trusted index entry to its end (read only).

    Returns the walk, the index completed on the way, and whether the index
    file on disk already held exactly that index.
    """
    with open_file(seg.path) as f:
        return walk_tail(dir_index_path, seg, f.fileno())


def walk_tail(dir_index_path: str, seg: Segment, fd: int) -> tuple[Walk, SparseIndex, bool]:
    """`tail` on an open descriptor of the segment (the writer's recovery opens it for writing)."""
    size = os.fstat(fd).st_size
    index, on_disk = open_index(dir_index_path, seg, fd, size)
    before = len(index)
    w = walk(fd, index.tail(), size, index)
    return w, index, on_disk and len(index) == before


__all__ = [
    "Walk",
    "walk",
    "read_messages",
    "Chunk",
    "seek_index",
    "seek_entry",
    "entry_is_valid",
    "entry_confirmed",
    "frame_end",
    "frame_total",
    "pread_full",
    "chain_back",
    "Resume",
    "trusted_prefix",
    "open_index",
    "tail",
    "walk_tail",
    "NO_TIMESTAMP",
]
