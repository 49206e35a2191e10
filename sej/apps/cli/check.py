"""Verifying a journal: every frame of every segment, the offset sequence, and every byte's checksum.

Checks, for each segment in order: every frame is whole and valid, offsets are
consecutive within the segment, its first offset equals its name, it starts
where the previous segment ended, and its bytes agree with its checksum file
(sej.checksum); bytes no checksum covers are listed as unchecked. The index files (derived data) are not
checked. Repair is the writer's own startup recovery (`sej.recovery.recover_tail`)
applied to the last segment under the writer lock.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field

from ...checksum import check_segment
from ...frames import HEADER, NO_TIMESTAMP
from ...fsutil import open_file
from ...index import Entry
from ...layout import Segment, is_quarantine_name, list_segments, segment_dir, sum_path
from ...segment import walk
from ...shard import Journal


@dataclass(frozen=True)
class Problem:
    """Something wrong at a byte position of a file."""

    path: str
    position: int
    reason: str
    last_segment: bool = False  # in the journal's last segment
    frame: bool = True  # a bad frame (the writer's recovery cuts those); False: a gap, a checksum mismatch
    end: int | None = None  # a checksum mismatch: the end of the byte range
    offsets: tuple[int, int] | None = None  # a checksum mismatch: the messages it covers, when known
    past_end: bool = False  # checksums for bytes past the segment's end (what a cut left; --repair drops them)

    def __str__(self) -> str:
        return f"{self.path}: byte {self.position}: {self.reason}"


@dataclass
class Report:
    """The outcome of verifying one journal."""

    journal: Journal
    segments: int = 0
    messages: int = 0
    bytes: int = 0
    problems: list[Problem] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    unchecked: list[tuple[str, int, int]] = field(default_factory=list)  # (segment, start, end): no checksum
    checked: int = 0  # bytes covered by checksums (all checked)
    last_segment: str | None = None  # the path of the journal's last segment


def verify_journal(j: Journal, tick: Callable[[int], None], writer_running: bool | None) -> Report:
    """Walk every segment of `j`; `tick(bytes)` after each. `writer_running`: an open writer holds the lock."""
    report = Report(j)
    segments = list_segments(j.path)
    report.segments = len(segments)
    report.last_segment = segments[-1].path if segments else None
    expect: int | None = None  # the offset the next segment must start at (None: unknown after a problem)
    for i, seg in enumerate(segments):
        last = i == len(segments) - 1
        if expect is not None and seg.first_offset != expect:
            kind = "gap" if seg.first_offset > expect else "overlap"
            report.problems.append(Problem(
                seg.path, 0, f"{kind}: the segment starts at offset {seg.first_offset}, "
                f"but the previous one ends before offset {expect}", last, frame=False,
            ))  # fmt: skip
        size, problem, nxt, kept = _walk_segment(seg, last, writer_running, report)
        report.bytes += size
        report.messages += nxt - seg.first_offset
        if problem is not None:
            report.problems.append(problem)
        _check_sums(j.path, seg, last and bool(writer_running), report, kept)
        expect = nxt if problem is None else None
        tick(size)
    quarantined = _quarantine_files(j.path)
    for name, size in quarantined:
        report.notes.append(f"{os.path.join(j.path, 'jnl', name)}: {size} bytes cut by an earlier recovery")
    return report


def _walk_segment(
    seg: Segment, last: bool, writer_running: bool | None, report: Report
) -> tuple[int, Problem | None, int, int]:
    """(size, the problem, the next offset, the end of the bytes that are messages: a torn or corrupt tail, or
    a frame being written, is not)."""
    with open_file(seg.path) as f:
        fd = f.fileno()
        size = os.fstat(fd).st_size
        w = walk(fd, Entry(seg.first_offset, 0, NO_TIMESTAMP), size)
        if w.problem is None:
            return size, None, w.next_offset, size
        p = w.problem
        reason = p.reason
        if p.position == 0 and reason.startswith("offset out of sequence"):
            found = int(HEADER.unpack(os.pread(fd, HEADER.size, 0))[0])
            reason = f"the first frame has offset {found}, but the file name says {seg.first_offset}"
    tail = size - p.position
    kept = w.end if w.resume is None and (p.incomplete or last) else size  # as recovery.kept_end
    if p.incomplete and last and writer_running:
        report.notes.append(
            f"{seg.path}: byte {p.position}: {reason}; a writer holds the lock, so it is probably being written"
        )
        return size, None, w.next_offset, kept
    if p.incomplete:
        reason = (f"{reason}, the last {tail} bytes of the file (a torn tail)" if last
                  else f"{reason} at the end of a finished segment")  # fmt: skip
    else:
        reason = f"{reason} ({tail} bytes from here to the end of the file)"
    nxt = w.resume.next_offset if w.resume is not None else w.next_offset
    return size, Problem(seg.path, p.position, reason, last), nxt, kept


def _check_sums(dir: str, seg: Segment, live: bool, report: Report, kept: int) -> None:
    """Check the segment against its checksum file; `live`: its writer runs (its tail is being recorded).

    Bytes past `kept` (a torn or corrupt tail) are no messages: they are reported as that problem, never as
    unchecked bytes to seal."""
    c = check_segment(seg.path, sum_path(dir, seg.first_offset), seg.first_offset)
    report.checked += c.checked
    for e in c.errors:
        report.problems.append(Problem(seg.path, e.start, str(e.detail) + (
            f" (bytes {e.start}..{e.end}, messages {e.offsets[0]}..{e.offsets[1]})" if e.offsets
            else f" (bytes {e.start}..{e.end})"), live, frame=False, end=e.end, offsets=e.offsets,
            past_end=bool(c.past) and e.start == c.size and e.end == c.past))  # fmt: skip
    end = min(c.size, kept)
    if c.checked < end and not (live and c.has_sums):
        report.unchecked.append((seg.path, c.checked, end))


def _quarantine_files(dir: str) -> list[tuple[str, int]]:
    jdir = segment_dir(dir)
    out = []
    try:
        with os.scandir(jdir) as entries:
            for e in entries:
                if is_quarantine_name(e.name) and e.is_file(follow_symlinks=False):
                    out.append((e.name, e.stat().st_size))
    except FileNotFoundError:
        pass
    return sorted(out)


def total_bytes(journals: list[Journal]) -> int:
    total = 0
    for j in journals:
        for seg in list_segments(j.path):
            try:
                total += os.path.getsize(seg.path)
            except OSError:
                pass
    return total
