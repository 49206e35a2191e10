"""Read-only questions about a whole journal: first and next offset, last messages, time lookup."""

from __future__ import annotations

import os

from .errors import CorruptionError, InvalidArgumentError, OffsetOutOfRangeError
from .frames import HEADER, I32, NO_TIMESTAMP, OVERHEAD, Message, decode_batch
from .fsutil import open_file
from .index import Entry
from .layout import Segment, find_segment, index_path, journal_path, list_segments, segment_dir
from .segment import Walk, pread_full, read_messages, seek_entry, walk, walk_tail


def check_journal(path: str) -> None:
    """Raise InvalidArgumentError naming `path` unless it can be a journal: a missing directory (a typo) is not
    an empty journal, and a root of journals (a sharded root, a hub root) is not a journal either.

    A directory without jnl/ and without journals under it is a journal its writer has not opened yet.
    Cheap for a journal (one stat); callers that found segments need not call it.
    """
    if not os.path.isdir(path):
        what = "is not a directory" if os.path.lexists(path) else "does not exist"
        raise InvalidArgumentError(f"journal directory {path} {what}")
    if os.path.isdir(segment_dir(path)):
        return
    found = []
    with os.scandir(path) as entries:
        for e in entries:
            if e.is_dir(follow_symlinks=False) and os.path.isdir(segment_dir(e.path)):
                found.append(e.name)
    if found:
        found.sort()
        names = ", ".join(found[:3]) + (", ..." if len(found) > 3 else "")
        raise InvalidArgumentError(
            f"{path} is a root of journals ({names}), not a journal: give one of them, "
            f"e.g. {os.path.join(path, found[0])} (sej.Consumer reads every journal of a root)"
        )


def first_offset(dir: str | os.PathLike[str]) -> int:
    """Offset of the first retained message (the journal's start, 0 when it has no segments).

    InvalidArgumentError for a directory that does not exist or is a root of journals (see check_journal).
    """
    path = journal_path(dir)
    segments = list_segments(path)
    if not segments:
        check_journal(path)
        return 0
    return segments[0].first_offset


def next_offset(dir: str | os.PathLike[str], segments: list[Segment] | None = None) -> int:
    """Offset the next appended message will get: one past the last whole, valid message.

    `segments`: the journal's segments if the caller has just listed them. InvalidArgumentError for a
    directory that does not exist or is a root of journals (see check_journal).
    """
    path = journal_path(dir)
    if segments is None:
        segments = list_segments(path)
    if not segments:
        check_journal(path)
        return 0
    w = last_walk(path, segments[-1])
    # Past a frame damaged in place (whole frames follow it), the writer appends after those frames.
    return w.resume.next_offset if w.resume is not None else w.next_offset


def bytes_from(dir: str | os.PathLike[str], offset: int) -> int:
    """Bytes the journal holds from message `offset` on: a reader's lag in bytes.

    Counted to the end of the last segment file (a torn tail included). `offset` past the
    last segment's start and at or before its end is found through the sparse index.
    """
    path = journal_path(dir)
    segments = list_segments(path)
    i = find_segment(segments, offset)
    if i < 0:
        first = segments[0].first_offset if segments else 0
        raise OffsetOutOfRangeError(offset, first, next_offset(path))
    total = 0
    for k in range(i, len(segments)):
        with open_file(segments[k].path) as f:
            fd = f.fileno()
            size = os.fstat(fd).st_size
            total += size
            if k == i:
                total -= offset_position(path, segments[i], fd, size, offset, i == len(segments) - 1)
    return total


def offset_position(dir: str, seg: Segment, fd: int, size: int, offset: int, is_last: bool) -> int:
    """Where message `offset`'s frame starts in the segment (its end of valid frames when `offset` is next)."""
    e = seek_entry(index_path(dir, seg.first_offset), seg, fd, size, is_last, lambda ix: ix.floor_offset(offset))
    pos, at = e.position, e.offset
    while at < offset:
        msgs, used, problem = read_messages(fd, pos, at, size, limit=offset - at)
        if not msgs:
            if problem is None or (is_last and problem.incomplete):
                break  # the end of the segment
            raise CorruptionError(seg.path, problem.position, problem.reason)
        pos, at = pos + used, at + len(msgs)
    if at != offset:
        raise OffsetOutOfRangeError(offset, seg.first_offset, at)
    return pos


def last_walk(dir: str, seg: Segment) -> Walk:
    """The walk of the last segment the writer's recovery bases itself on (read only).

    From the last confirmed index entry; when that walk finds a problem, again from byte 0, as
    recovery does (the index is derived data): otherwise `next_offset` could name an offset past
    damage further back, which the writer, cutting there, would then hand out again.
    """
    with open_file(seg.path) as f:
        fd = f.fileno()
        w, index, _ = walk_tail(index_path(dir, seg.first_offset), seg, fd)
        if w.problem is not None and len(index):
            w = walk(fd, Entry(seg.first_offset, 0, NO_TIMESTAMP), w.size)
    if w.problem is not None and w.resume is None and w.later is not None:
        # Whole later frames, but not from the offset after the damage: a writer open now would
        # cut at the damage, one that is already open goes on after them. Neither answer is safe.
        reason = f"{w.problem.reason}; the offsets in between are lost, so the journal's end is unknown until a writer opens it (and cuts there)"  # noqa: E501
        raise CorruptionError(seg.path, w.end, reason, w.size - w.end)
    return w


def last_messages(dir: str | os.PathLike[str], n: int) -> list[Message]:
    """The last `n` whole messages, oldest first, read backward with the trailing size field.

    InvalidArgumentError for a directory that does not exist or is a root of journals (see check_journal).
    """
    if not isinstance(n, int) or isinstance(n, bool) or n < 0:
        raise InvalidArgumentError(f"n must be a non-negative int, got {n!r}")
    path = journal_path(dir)
    segments = list_segments(path)
    if not segments:
        check_journal(path)
    out: list[Message] = []
    for i in range(len(segments) - 1, -1, -1):
        if len(out) >= n:
            break
        seg = segments[i]
        is_last = i == len(segments) - 1
        floor = 0  # where reading backward must stop: the segment's start, or just past damage in place
        if is_last:
            w = last_walk(path, seg)
            end, last = w.end, w.next_offset - 1  # skips a torn tail
            if w.resume is not None:  # a frame damaged in place: the journal goes on after it
                end, last, floor = w.size, w.resume.next_offset - 1, w.resume.position
        else:
            end, last = os.path.getsize(seg.path), segments[i + 1].first_offset - 1
        if end == 0 and last != seg.first_offset - 1:  # an empty segment must be named like the next one
            raise CorruptionError(seg.path, 0, f"gap: the segment is empty, the next one starts at offset {last + 1}")
        with open_file(seg.path) as f:
            got = _backward(f.fileno(), seg, end, n - len(out), last, floor)
            if floor and len(got) < n - len(out):
                raise CorruptionError(seg.path, w.end, f"{w.problem.reason if w.problem else 'damaged frame'}; "
                                      f"the last {n} messages reach back past it")  # fmt: skip
            if got:
                _check_forward(path, seg, f.fileno(), end, is_last, got, floor)
        out.extend(got)
    out.reverse()
    return out


def _check_forward(
    dir: str, seg: Segment, fd: int, end: int, is_last: bool, got: list[Message], floor: int = 0
) -> None:
    """Raise CorruptionError unless the frames read backward are the ones a forward read finds.

    Reading backward trusts each frame's trailing size field; bytes appended after the last whole
    frame, or damage in between, can make it find a "frame" a forward read never reaches. So the
    frames from the index entry at or before the oldest one up to `end` are walked forward: they
    must all be valid and end exactly at `end`, with the newest offset read backward.
    """
    size = os.fstat(fd).st_size
    oldest = got[-1].offset
    if floor:  # after damage in place: from the first whole frame after it
        entry = Entry(int(HEADER.unpack(pread_full(fd, HEADER.size, floor))[0]), floor, NO_TIMESTAMP)
    else:
        entry = seek_entry(index_path(dir, seg.first_offset), seg, fd, size, is_last,
                           lambda ix: ix.floor_offset(oldest))  # fmt: skip
    w = walk(fd, entry, end)
    oldest_pos = end - sum(OVERHEAD + len(m.key) + len(m.value) for m in got)
    if w.problem is not None and w.resume is not None and w.resume.position <= oldest_pos:
        # A frame damaged in place before the frames read: check them from the first whole frame after it.
        at = w.resume.position
        w = walk(fd, Entry(int(HEADER.unpack(pread_full(fd, HEADER.size, at))[0]), at, NO_TIMESTAMP), end)
    if w.problem is not None or w.end != end or w.next_offset != got[0].offset + 1:
        reason = w.problem.reason if w.problem is not None else f"a forward read ends at offset {w.next_offset}"
        raise CorruptionError(seg.path, w.end, f"the frames read backward do not read forward: {reason}")


def _backward(fd: int, seg: Segment, end: int, want: int, last: int, floor: int = 0) -> list[Message]:
    """Up to `want` messages of one segment ending at `end` and starting at or after `floor`, newest first.

    `last` is the offset the frame ending at `end` must carry (the one before the next
    segment's first, or before the next offset): a frame read backward is checked like one
    read forward, so a damaged segment raises instead of giving a message of the wrong offset.
    """
    got: list[Message] = []
    while end > floor and len(got) < want:
        size = I32.unpack(os.pread(fd, 4, end - 4))[0] if end >= 4 else -1
        if size < OVERHEAD or size > end - floor:
            raise CorruptionError(seg.path, max(end - 4, 0), "trailing size field does not fit a frame")
        frame = pread_full(fd, size, end - size)
        expect = got[-1].offset - 1 if got else last
        msgs, used, problem = decode_batch(frame, 0, len(frame), expect, 1)
        if not msgs or problem is not None or used != size:
            reason = problem.reason if problem else "frame does not decode"
            raise CorruptionError(seg.path, end - size, f"reading backward: {reason}")
        if msgs[0].offset < seg.first_offset:
            raise CorruptionError(seg.path, end - size, f"offset {msgs[0].offset} below the segment's first")
        got.append(msgs[0])
        end -= size
    return got


def offset_at_time(dir: str | os.PathLike[str], ts: int) -> int:
    """Offset of the first message whose timestamp is >= ts (the next offset if there is none).

    Messages without a timestamp count as older than any time. Exact also when
    timestamps are out of order: every message before the result is older than ts.
    """
    if not isinstance(ts, int) or isinstance(ts, bool):
        raise InvalidArgumentError(f"time must be int nanoseconds since the Unix epoch, got {ts!r}")
    path = journal_path(dir)
    segments = list_segments(path)
    for i, seg in enumerate(segments):
        found = _offset_at_time_in(path, seg, ts, i == len(segments) - 1)
        if found is not None:
            return found
    return next_offset(path)


def _offset_at_time_in(dir: str, seg: Segment, ts: int, is_last: bool) -> int | None:
    with open_file(seg.path) as f:
        fd = f.fileno()
        size = os.fstat(fd).st_size
        ipath = index_path(dir, seg.first_offset)
        start = seek_entry(ipath, seg, fd, size, is_last, lambda index: index.floor_time(ts))
        pos, off = start.position, start.offset
        while pos < size:
            msgs, used, problem = read_messages(fd, pos, off, size)
            if not msgs:
                # A torn last message of the last segment is not there yet; anything else is damage.
                if problem is not None and not (problem.incomplete and is_last):
                    raise CorruptionError(seg.path, problem.position, problem.reason, size - problem.position)
                return None
            for m in msgs:
                if m.timestamp is not None and m.timestamp >= ts:
                    return m.offset
            pos += used
            off = msgs[-1].offset + 1
    return None


__all__ = ["check_journal", "first_offset", "next_offset", "last_messages", "offset_at_time", "offset_position"]
