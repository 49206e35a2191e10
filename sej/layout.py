"""Names and paths of a journal directory (no file contents are read here).

<dir>/jnl.lck              the writer's lock
<dir>/jnl/%016x.jnl        segments, named by the offset of their first message
<dir>/idx/%016x.idx        sparse index of each segment (derived data, sej only)
<dir>/ofs/<reader>.ofs     a reader's next offset, 8 bytes big-endian
<dir>/ofs/<reader>.lck     that reader's lock
"""

from __future__ import annotations

import os
import re
import stat
from bisect import bisect_right
from typing import NamedTuple

from .errors import InvalidArgumentError, UnsafeFileError
from .fsutil import kind

SEGMENT_RE = re.compile(r"\A([0-9a-f]{16})\.jnl\Z")
READER_RE = re.compile(r"\A[A-Za-z0-9_-]+\Z")
MAX_READER_NAME = 200


class Segment(NamedTuple):
    """A segment file: the offset of its first message and its path."""

    first_offset: int
    path: str


def journal_path(dir: str | os.PathLike[str]) -> str:
    """Validate a journal directory argument and return it as a str."""
    if isinstance(dir, bytes) or not isinstance(dir, (str, os.PathLike)):
        raise InvalidArgumentError(f"journal directory must be a str or path, got {dir!r}")
    path = os.fspath(dir)
    if not path or "\0" in path:
        raise InvalidArgumentError(f"journal directory must be a non-empty path without NUL, got {path!r}")
    return path


def segment_dir(dir: str) -> str:
    return os.path.join(dir, "jnl")


def index_dir(dir: str) -> str:
    return os.path.join(dir, "idx")


def offset_dir(dir: str) -> str:
    return os.path.join(dir, "ofs")


def writer_lock_path(dir: str) -> str:
    return os.path.join(dir, "jnl.lck")


def segment_name(first_offset: int) -> str:
    """The file name of the segment whose first message has this offset."""
    return f"{first_offset:016x}.jnl"


def parse_segment_name(name: str) -> int | None:
    """The first offset a segment file name stands for, or None if it is not a segment name."""
    m = SEGMENT_RE.match(name)
    return int(m.group(1), 16) if m else None


def segment_path(dir: str, first_offset: int) -> str:
    return os.path.join(dir, "jnl", segment_name(first_offset))


def index_path(dir: str, first_offset: int) -> str:
    return os.path.join(dir, "idx", f"{first_offset:016x}.idx")


def check_reader_name(name: object) -> str:
    """Return `name` if it is a valid reader name ([A-Za-z0-9_-]+), else raise."""
    if not isinstance(name, str) or not READER_RE.match(name) or len(name) > MAX_READER_NAME:
        raise InvalidArgumentError(
            f"reader name must match [A-Za-z0-9_-]+ (at most {MAX_READER_NAME} characters), got {name!r}"
        )
    return name


def reader_offset_path(dir: str, name: str) -> str:
    return os.path.join(dir, "ofs", check_reader_name(name) + ".ofs")


def reader_lock_path(dir: str, name: str) -> str:
    return os.path.join(dir, "ofs", check_reader_name(name) + ".lck")


def list_segments(dir: str | os.PathLike[str]) -> list[Segment]:
    """The segments of a journal, oldest first (empty if there are none yet).

    A directory with a segment's name is not a segment and is ignored; any other
    non-regular file with a segment's name (a symlink, a FIFO, a device) raises
    UnsafeFileError naming it: a segment is never read through a symlink.
    """
    jdir = segment_dir(journal_path(dir))
    found = []
    try:
        with os.scandir(jdir) as entries:
            for entry in entries:
                first = parse_segment_name(entry.name)
                if first is None:
                    continue
                if not entry.is_file(follow_symlinks=False):
                    try:
                        mode = entry.stat(follow_symlinks=False).st_mode
                    except FileNotFoundError:
                        continue  # removed meanwhile (retention)
                    if stat.S_ISDIR(mode):
                        continue
                    raise UnsafeFileError(entry.path, kind(mode))
                found.append(Segment(first, entry.path))
    except FileNotFoundError:
        return []
    except NotADirectoryError:
        raise InvalidArgumentError(f"{jdir} is not a directory, so {dir} is not a journal") from None
    found.sort()
    return found


def find_segment(segments: list[Segment], offset: int) -> int:
    """Index in `segments` of the segment that holds `offset` (binary search; -1 if before the first)."""
    return bisect_right(segments, offset, key=lambda s: s.first_offset) - 1


def list_readers(dir: str | os.PathLike[str]) -> list[str]:
    """Names of the readers with a committed offset file in this journal."""
    odir = offset_dir(journal_path(dir))
    try:
        names = os.listdir(odir)
    except FileNotFoundError:
        return []
    readers = [n[:-4] for n in names if n.endswith(".ofs") and READER_RE.match(n[:-4])]
    return sorted(readers)
