"""Reading one segment file's structure: walking frames in large chunks, checking the index.

Everything here reads with os.pread on a file descriptor (never mmap: a file that
shrinks under a mapping kills the process with SIGBUS) and never writes the segment.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import NamedTuple

from . import index as idx
from .index import Entry, SparseIndex
from .layout import Segment
from .message import (
    CHECK_FORMAT,
    HEADER,
    I32,
    NO_TIMESTAMP,
    OVERHEAD,
    Message,
    Problem,
    check_frame,
    decode_batch,
    sized_struct,
)

CHUNK = 1 << 20


class Walk(NamedTuple):
    """Where a forward walk of a segment stopped."""

    end: int  # position after the last whole, valid frame
    next_offset: int  # offset of the next frame
    max_ts: int  # largest timestamp of the frames before `end`
    problem: Problem | None  # why it stopped before `size`; None at a clean end
    size: int  # the file size the walk went to


class Frames(NamedTuple):
    """How far whole, valid frames reach in a buffer (see walk_frames)."""

    used: int  # bytes of whole, valid frames from the start position
    next_offset: int
    max_ts: int
    next_entry: int  # segment position at or after which the next index entry is due
    problem: Problem | None  # what stopped the walk before the end of the buffer


def walk_frames(
    data: bytes | bytearray | memoryview,
    p: int,
    n: int,
    base: int,
    offset: int,
    max_ts: int,
    next_entry: int,
    index: SparseIndex | None,
) -> Frames:
    """Validate the frames of data[p:n], which sit at segment position `base + p` (pure: no I/O).

    Each frame must carry the next offset, sane sizes and a matching trailing size.
    Index entries (position >= next_entry) are added to `index` on the way.
    """
    unpack_head = HEADER.unpack_from
    unpack_i32 = I32.unpack_from
    start = p
    # Frames with the same sizes as the one before are checked by one cached struct call that
    # skips the key and value bytes (`same`); any other frame takes the general path.
    same = None
    same_ks = same_vs = same_total = -1
    last_sizes = -1
    while n - p >= OVERHEAD:
        if same is not None:
            if n - p >= same_total:
                off, ts, ks, vs, size = same(data, p)
                if off == offset and ks == same_ks and vs == same_vs and size == same_total:
                    if ts > max_ts:
                        max_ts = ts
                    if base + p >= next_entry:
                        index.add(offset, base + p, max_ts)  # type: ignore[union-attr]
                        next_entry = base + p + idx.INTERVAL
                    offset += 1
                    p += same_total
                    continue
            same = None
        off, ts, _typ, ks = unpack_head(data, p)
        if off != offset or ks < 0:
            break
        vpos = p + 18 + ks
        if vpos + 4 > n:
            break
        (vs,) = unpack_i32(data, vpos)
        nxt = vpos + 8 + vs
        if vs < 0 or nxt > n or unpack_i32(data, nxt - 4)[0] != nxt - p:
            break
        if ts > max_ts:
            max_ts = ts
        if base + p >= next_entry:
            index.add(offset, base + p, max_ts)  # type: ignore[union-attr]
            next_entry = base + p + idx.INTERVAL
        offset += 1
        p = nxt
        sizes = ks << 32 | vs
        if sizes == last_sizes:
            same = sized_struct(CHECK_FORMAT, ks, vs).unpack_from
            same_ks, same_vs, same_total = ks, vs, OVERHEAD + ks + vs
        last_sizes = sizes
    problem = None if p == n else check_frame(data, p, n, offset)
    assert not isinstance(problem, int), "walk_frames stopped at a valid frame"
    return Frames(p - start, offset, max_ts, next_entry, problem)


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
    """Validate frames from `start` to `size`; add index entries to `index` on the way."""
    pos, offset, max_ts = start.position, start.offset, start.max_ts
    next_entry = next_entry_after(index)
    want = CHUNK
    while pos < size:
        data = os.pread(fd, min(want, size - pos), pos)
        n = len(data)
        if n == 0:  # the file shrank under us
            size = pos
            break
        f = walk_frames(data, 0, n, pos, offset, max_ts, next_entry, index)
        pos += f.used
        offset, max_ts, next_entry = f.next_offset, f.max_ts, f.next_entry
        if f.problem is None:
            want = CHUNK
            continue
        if f.problem.incomplete and pos + (n - f.used) < size:
            # The frame continues past this chunk: read again from its start, big enough for it.
            total = _frame_total(data, f.used, n)
            want = max(CHUNK, total or 0)
            continue
        return Walk(pos, offset, max_ts, f.problem._replace(position=pos), size)
    return Walk(pos, offset, max_ts, None, size)


def read_messages(
    fd: int, pos: int, offset: int, size: int, limit: int = 1 << 62
) -> tuple[list[Message], int, Problem | None]:
    """Decode whole frames of file bytes [pos, size), at least one however big.

    Returns the messages, the bytes they took, and the Problem (absolute position)
    that stopped decoding before `size`, if any.
    """
    want = min(CHUNK, size - pos)
    while True:
        data = os.pread(fd, want, pos)
        msgs, used, problem = decode_batch(data, 0, len(data), offset, limit)
        if problem is not None:
            cut_by_chunk = problem.incomplete and len(data) == want and pos + want < size
            if cut_by_chunk and msgs:
                problem = None
            elif cut_by_chunk:
                total = _frame_total(data, 0, len(data))
                want = min(max(total or 0, want * 2), size - pos)
                continue
            else:
                problem = problem._replace(position=pos + problem.position)
        return msgs, used, problem


def _frame_total(data: bytes, p: int, n: int) -> int | None:
    """The full size of the frame starting at data[p], if its header is there."""
    if n - p < 18:
        return None
    ks = data[p + 17]
    if ks > 127 or p + 18 + ks + 4 > n:
        return None
    vs: int = I32.unpack_from(data, p + 18 + ks)[0]
    return OVERHEAD + ks + vs


def entry_is_valid(fd: int, size: int, entry: Entry) -> bool:
    """Whether a whole, valid frame with the entry's offset starts at the entry's position."""
    if entry.position + OVERHEAD > size:
        return False
    head = os.pread(fd, min(CHUNK, size - entry.position), entry.position)
    r = check_frame(head, 0, len(head), entry.offset)
    if isinstance(r, int):
        return True
    if r.incomplete and len(head) == CHUNK:  # a frame bigger than one chunk: read it whole
        total = _frame_total(head, 0, len(head))
        if total is not None and entry.position + total <= size:
            whole = os.pread(fd, total, entry.position)
            return isinstance(check_frame(whole, 0, len(whole), entry.offset), int)
    return False


def trusted_prefix(fd: int, size: int, index: SparseIndex) -> int:
    """Drop the index entries that do not match the segment; return how many were dropped.

    The last entry is checked first (the usual case: all good). Otherwise a binary
    search finds the last good entry, assuming, as the writer guarantees, that the
    good entries form a prefix.
    """
    n = len(index)
    if n == 0 or entry_is_valid(fd, size, index[n - 1]):
        return 0
    lo, hi = 0, n - 1  # entries [0, lo) known good; entry hi known bad
    while lo < hi:
        mid = (lo + hi) // 2
        if entry_is_valid(fd, size, index[mid]):
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
        if i < 0:
            return Entry(seg.first_offset, 0, NO_TIMESTAMP)
        entry = index[i]
        if entry_is_valid(fd, size, entry):
            return entry
        index = rebuild_index(dir_index_path, seg, fd, size, is_last)
    raise AssertionError(f"{seg.path}: a freshly built index entry does not match the segment")


def tail(dir_index_path: str, seg: Segment) -> tuple[Walk, SparseIndex, bool]:
    """Walk a segment from its last trusted index entry to its end (read only).

    Returns the walk, the index completed on the way, and whether the index
    file on disk already held exactly that index.
    """
    with open(seg.path, "rb") as f:
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
    "seek_index",
    "seek_entry",
    "entry_is_valid",
    "trusted_prefix",
    "open_index",
    "tail",
    "walk_tail",
    "NO_TIMESTAMP",
]
