"""Retention: delete a journal's oldest segments once every reader has passed them and they are past a limit.

Planning (`plan_retention`) only reads; deleting (`apply_retention`) re-checks the
readers and removes what the plan names. A segment is deleted only when

- it is in the contiguous run of oldest segments and is not the last segment (the
  live writer's),
- every reader has passed it: its end offset (the next segment's first offset) is at
  most the smallest committed offset of every reader in ``ofs/`` and of every
  ``required_readers`` name; a journal without readers, or with a reader that has
  committed nothing, has nothing passed,
- and at least one configured limit wants it gone: its newest message is older than
  ``max_age``, or the journal holds more than ``max_bytes`` segment bytes or more than
  ``max_messages`` messages from this segment on.

A segment's newest timestamp comes from its sparse index and a walk of the frames
after the last trusted entry; when none of its messages has a timestamp, the
segment file's mtime stands in. Each deletion removes the segment, fsyncs ``jnl/``,
then removes its index file; ``idx/`` is fsynced at the end. Index files left below
the first segment (by a crash between the two removals) are removed too. Callers
hold `lock_retention` so that two runs never overlap; the writer's lock is not needed.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import IO, Literal, NamedTuple

from .errors import CorruptionError, InvalidArgumentError, LockedError
from .frames import NO_TIMESTAMP
from .fsutil import fsync_dir
from .layout import (
    RETENTION_LOCK,
    Segment,
    check_reader_name,
    index_dir,
    index_path,
    journal_path,
    list_readers,
    list_segments,
    parse_index_name,
    parse_sum_name,
    reader_offset_path,
    segment_dir,
    sum_path,
)
from .lock import lock_file
from .offset import read_offset_durably, read_offset_file
from .segment import tail

LOCK_NAME = RETENTION_LOCK
"""The lock file a retention run holds in each journal directory (beside jnl.lck)."""

NS = 10**9
MAX_AGE = 1e11
"""Seconds (about 3000 years): a longer max_age is taken as this, beyond any 64-bit nanosecond time."""


class Deletion(NamedTuple):
    """A segment a plan deletes, and why."""

    segment: Segment
    end_offset: int  # one past its last message: the next segment's first offset
    size: int  # bytes
    newest_ns: int | None  # its newest message timestamp, or its file mtime (see newest_from); None: no age limit
    newest_from: str | None  # "timestamp" or "mtime" (no message has a timestamp); None: no age limit
    reasons: tuple[str, ...]  # the limits it is past, one phrase each

    @property
    def messages(self) -> int:
        return self.end_offset - self.segment.first_offset


@dataclass(frozen=True)
class RetentionPlan:
    """What `plan_retention` found in one journal and what `apply_retention` would delete."""

    journal: str
    now_ns: int
    max_age: float | None
    max_bytes: int | None
    max_messages: int | None
    required_readers: tuple[str, ...]
    readers: tuple[tuple[str, int | None], ...]  # every reader (in ofs/ or required) and its committed offset
    floor: int | None  # smallest committed offset of them; None when nothing counts as passed
    first_offset: int  # the journal's first offset before deletion
    segments: int  # segment files before deletion
    bytes: int  # their total size
    messages: int  # messages from the first segment to the journal's end
    deletions: tuple[Deletion, ...]  # a contiguous run of the oldest segments, never the last
    kept: str  # why the first segment not deleted is kept
    orphan_indexes: tuple[str, ...]  # idx/ files below the first segment (their segment is gone)

    @property
    def deleted_bytes(self) -> int:
        return sum(d.size for d in self.deletions)

    @property
    def deleted_messages(self) -> int:
        return sum(d.messages for d in self.deletions)

    @property
    def first_kept(self) -> int:
        """The journal's first offset after the deletions."""
        return self.deletions[-1].end_offset if self.deletions else self.first_offset


class ReaderFloor(NamedTuple):
    """How far every reader of a journal has read."""

    readers: tuple[tuple[str, int | None], ...]  # every reader (in ofs/ or required) and its committed offset
    offset: int | None  # the smallest of them, a reader with nothing committed counting as the journal's
    # first offset; None when the journal has no readers
    why: str  # why no segment counts as passed ("" when some may): no readers, or one committed nothing


def reader_floor(
    journal_dir: str | os.PathLike[str],
    first: int,
    required: Iterable[str] = (),
    exclude: Iterable[str] = (),
    durable: bool = False,
) -> ReaderFloor:
    """The readers of a journal whose first offset is `first`, and the offset all of them have passed.

    `required` readers count even without an offset file; `exclude`d ones never count.
    A malformed offset file raises CorruptionError. Retention, `sej old` and the archive
    all take their floor from here. With `durable` (before deleting by it), each offset
    read is made durable first: a consumer's last commits may still be in the page cache
    (its syncer fsyncs them a moment later), and segments deleted by a value a power loss
    then takes back would be messages that consumer never gets.
    """
    path = journal_path(journal_dir)
    skip = set(exclude)
    names = sorted((set(list_readers(path)) | set(_check_required(required))) - skip)
    read = read_offset_durably if durable else read_offset_file
    readers = tuple((n, read(reader_offset_path(path, n))) for n in names)
    if not readers:
        return ReaderFloor(readers, None, "the journal has no readers, so no segment counts as read")
    empty = [n for n, o in readers if o is None]
    why = ""
    if len(empty) == 1:
        why = f"reader {empty[0]} has committed nothing, so no segment counts as read"
    elif empty:
        why = f"readers {', '.join(empty)} have committed nothing, so no segment counts as read"
    return ReaderFloor(readers, min(first if o is None else o for _, o in readers), why)


class RetentionResult(NamedTuple):
    """What `apply_retention` did."""

    deleted: tuple[Deletion, ...]
    skipped: tuple[Deletion, ...]  # planned but kept: the journal or a reader changed since planning
    skipped_because: str | None
    orphan_indexes: tuple[str, ...]  # removed


def retention_lock_path(dir: str) -> str:
    return os.path.join(dir, LOCK_NAME)


def lock_retention(dir: str | os.PathLike[str]) -> IO[str]:
    """Lock `<dir>/retention.lck` (exclusive, non-blocking); LockedError if another run holds it.

    Release it with `sej.lock.unlock_file`; the kernel releases it when the process dies.
    """
    path = _existing_journal(dir)
    try:
        return lock_file(retention_lock_path(path))
    except LockedError as e:
        raise LockedError(e.path, "another retention run (sej-retention or sej old --delete)") from None


def plan_retention(
    journal_dir: str | os.PathLike[str],
    *,
    max_age: float | None = None,
    max_bytes: int | None = None,
    max_messages: int | None = None,
    required_readers: Iterable[str] = (),
    now_ns: int | None = None,
    age_of: Literal["newest message", "mtime"] = "newest message",
) -> RetentionPlan:
    """The segments of `journal_dir` that retention deletes now (reads only; see the module doc).

    `max_age` is in seconds, `now_ns` in nanoseconds since the epoch (default: now).
    A segment's age is that of its newest message (its mtime when none has a timestamp),
    or with `age_of="mtime"` that of its file (`sej old`). With no limit set nothing is
    deleted. A malformed offset file raises CorruptionError.
    """
    path = _existing_journal(journal_dir)
    age = _check_age(max_age)
    size_limit = _check_count("max_bytes", max_bytes)
    count_limit = _check_count("max_messages", max_messages)
    required = _check_required(required_readers)
    if now_ns is None:
        now_ns = time.time_ns()
    elif not isinstance(now_ns, int) or isinstance(now_ns, bool):
        raise InvalidArgumentError(f"now_ns must be int nanoseconds since the epoch, got {now_ns!r}")

    if age_of not in ("newest message", "mtime"):
        raise InvalidArgumentError(f"age_of must be 'newest message' or 'mtime', got {age_of!r}")
    segs = list_segments(path)
    readers, floor, blocked = reader_floor(path, segs[0].first_offset if segs else 0, required)
    sizes = [os.lstat(s.path).st_size for s in segs]  # regular files (list_segments refuses others)
    total = sum(sizes)
    journal_end = _segment_end(path, segs[-1]) if segs else 0
    ends = [s.first_offset for s in segs[1:]] + [journal_end]
    messages = journal_end - segs[0].first_offset if segs else 0

    deletions: list[Deletion] = []
    kept = "the journal has no segments"
    remaining_bytes = total
    cutoff = None if age is None else now_ns - round(min(age, MAX_AGE) * NS)
    for i, seg in enumerate(segs):
        if i == len(segs) - 1:
            kept = f"{_name(seg)} is the last segment (the writer's)"
            break
        end = ends[i]
        if floor is None or blocked:
            kept = blocked
            break
        if end > floor:
            behind = ", ".join(f"{n} at {o}" for n, o in readers if o == floor)
            kept = f"{_name(seg)} ends at offset {end}, past what every reader has read ({behind})"
            break
        reasons: list[str] = []
        newest: int | None = None
        source: str | None = None
        if cutoff is not None and age is not None:
            newest, source = _newest(path, seg, end) if age_of != "mtime" else _mtime(seg)
            if newest < cutoff:
                what = "newest message" if source == "timestamp" else "file mtime (no timestamps)"
                reasons.append(f"{what} {_duration((now_ns - newest) / NS)} old > max age {_duration(age)}")
        if size_limit is not None and remaining_bytes > size_limit:
            reasons.append(f"journal holds {remaining_bytes} bytes > max {size_limit}")
        left = journal_end - seg.first_offset
        if count_limit is not None and left > count_limit:
            reasons.append(f"journal holds {left} messages > max {count_limit}")
        if not reasons:
            limited = age is not None or size_limit is not None or count_limit is not None
            kept = f"{_name(seg)} is within every limit" if limited else "no limit is set"
            break
        deletions.append(Deletion(seg, end, sizes[i], newest, source, tuple(reasons)))
        remaining_bytes -= sizes[i]
    return RetentionPlan(
        journal=path,
        now_ns=now_ns,
        max_age=age,
        max_bytes=size_limit,
        max_messages=count_limit,
        required_readers=required,
        readers=readers,
        floor=None if blocked else floor,
        first_offset=segs[0].first_offset if segs else 0,
        segments=len(segs),
        bytes=total,
        messages=messages,
        deletions=tuple(deletions),
        kept=kept,
        orphan_indexes=tuple(_orphan_indexes(path, segs[0].first_offset if segs else None)),
    )


def apply_retention(plan: RetentionPlan, on_delete: Callable[[Deletion], None] | None = None) -> RetentionResult:
    """Delete what `plan` names, oldest first, after checking the readers and segments again.

    A planned segment that is no longer the oldest, is now the last, or that some
    reader has not passed any more (a reset, a new required reader) is kept, with
    every segment after it. A malformed offset file raises before anything is deleted.
    `on_delete` is called after each deletion (progress).
    """
    path = plan.journal
    segs = list_segments(path)
    _readers, floor, blocked = reader_floor(path, segs[0].first_offset if segs else 0, plan.required_readers,
                                            durable=True)  # fmt: skip
    if blocked:
        floor = None
    deleted: list[Deletion] = []
    why: str | None = None
    for i, d in enumerate(plan.deletions):
        if i + 1 >= len(segs) or segs[i] != d.segment or segs[i + 1].first_offset != d.end_offset:
            why = f"the segments of {path} changed since planning"
            break
        if floor is None or d.end_offset > floor:
            why = blocked if floor is None else f"a reader of {path} is now at offset {floor}, before {d.end_offset}"
            break
        os.remove(d.segment.path)
        fsync_dir(segment_dir(path))  # one at a time: a crash can never leave a gap in the journal
        for derived in (index_path(path, d.segment.first_offset), sum_path(path, d.segment.first_offset)):
            try:
                os.remove(derived)
            except FileNotFoundError:
                pass
        deleted.append(d)
        if on_delete is not None:
            on_delete(d)
    removed: list[str] = []
    if why is None:
        first_kept = segs[len(deleted)].first_offset if len(deleted) < len(segs) else None
        for p in _orphan_indexes(path, first_kept):
            try:
                os.remove(p)
            except FileNotFoundError:
                continue
            removed.append(p)
    if (deleted or removed) and os.path.isdir(index_dir(path)):
        fsync_dir(index_dir(path))
    return RetentionResult(tuple(deleted), plan.deletions[len(deleted) :], why, tuple(removed))


# -- helpers -------------------------------------------------------------------


def _existing_journal(dir: str | os.PathLike[str]) -> str:
    path = journal_path(dir)
    if not os.path.isdir(path):
        raise InvalidArgumentError(f"journal directory {path} does not exist")
    return path


def _check_age(value: object) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise InvalidArgumentError(f"max_age must be seconds >= 0 (finite) or None, got {value!r}")
    return float(value)


def _check_count(name: str, value: object) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InvalidArgumentError(f"{name} must be an int >= 0 or None, got {value!r}")
    return value


def _check_required(names: object) -> tuple[str, ...]:
    if isinstance(names, (str, bytes)) or not isinstance(names, Iterable):
        raise InvalidArgumentError(f"required_readers must be reader names (a list or tuple), got {names!r}")
    return tuple(dict.fromkeys(check_reader_name(n) for n in names))


def _segment_end(path: str, seg: Segment) -> int:
    """One past the last whole message of `seg` (a torn tail of the live segment is not counted)."""
    return tail(index_path(path, seg.first_offset), seg)[0].next_offset


def _newest(path: str, seg: Segment, end: int) -> tuple[int, str]:
    """The newest timestamp of a finished segment, or its mtime when no message has one."""
    walk = tail(index_path(path, seg.first_offset), seg)[0]
    if walk.problem is not None:
        raise CorruptionError(seg.path, walk.problem.position, walk.problem.reason, walk.size - walk.end)
    if walk.next_offset != end:
        raise CorruptionError(
            seg.path, walk.end, f"segment ends at offset {walk.next_offset}, the next one starts at {end}"
        )
    if walk.max_ts != NO_TIMESTAMP:
        return walk.max_ts, "timestamp"
    return os.stat(seg.path).st_mtime_ns, "mtime"


def _mtime(seg: Segment) -> tuple[int, str]:
    return os.stat(seg.path).st_mtime_ns, "mtime"


def _orphan_indexes(path: str, first_kept: int | None) -> list[str]:
    """idx/ files (indexes, checksums) of segments below `first_kept` (left by a crash between the removals)."""
    if first_kept is None:
        return []
    try:
        names = os.listdir(index_dir(path))
    except (FileNotFoundError, NotADirectoryError):
        return []
    found = []
    for name in names:
        first = parse_index_name(name)
        if first is None:
            first = parse_sum_name(name)
        if first is not None and first < first_kept:
            found.append(os.path.join(index_dir(path), name))
    return sorted(found)


def _name(seg: Segment) -> str:
    return os.path.basename(seg.path)


def _duration(seconds: float) -> str:
    """`7d`, `1h30m`, `45s`, `0.25s`: days, hours, minutes and seconds, zero parts left out."""
    if seconds < 1:
        return f"{seconds:g}s"
    s = int(seconds)
    parts = []
    for unit, n in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        if s >= n:
            parts.append(f"{s // n}{unit}")
            s %= n
    return "".join(parts)


__all__ = [
    "LOCK_NAME",
    "Deletion",
    "RetentionPlan",
    "ReaderFloor",
    "RetentionResult",
    "apply_retention",
    "lock_retention",
    "plan_retention",
    "reader_floor",
    "retention_lock_path",
]
