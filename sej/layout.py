"""Every file and directory name sej uses, and the paths of a journal (no file contents are read here).

<dir>/jnl.lck                        the writer's lock
<dir>/retention.lck                  held by a retention run
<dir>/jnl/%016x.jnl                  segments, named by the offset of their first message
<dir>/jnl/%016x.jnl.cut-<pos>-<ns>   bytes recovery cut from a segment (quarantine)
<dir>/idx/%016x.idx                  sparse index of each segment (derived data, sej only)
<dir>/idx/%016x.sum                  checksums of each segment's blocks (sej.checksum; authoritative)
<dir>/ofs/<reader>.ofs               a reader's next offset, 8 bytes big-endian
<dir>/ofs/<reader>.lck               that reader's lock
<hub root>/.hub.lck                  held by the hub (daemon or cron run)
<archive>/.archive.lck               held by an archive run

The names (not the paths) serve remote journals too: join them with posixpath.
"""

from __future__ import annotations

import os
import re
import stat
from bisect import bisect_right
from typing import NamedTuple

from .errors import InvalidArgumentError, UnsafeFileError
from .fsutil import kind

SEGMENT_DIR = "jnl"
INDEX_DIR = "idx"
OFFSET_DIR = "ofs"
WRITER_LOCK = "jnl.lck"
RETENTION_LOCK = "retention.lck"
HUB_LOCK = ".hub.lck"
HUB_STATUS_DIR = ".sej-hub"  # in a hub root: the daemon's record of each client (sej.hub.status)
GROUPS_DIR = ".sej-groups"  # in a root: the members of each consumer group (sej.shard.group)
OWN_DIRS = frozenset({HUB_STATUS_DIR, GROUPS_DIR})
"""sej's own directories in a root: never journals, and not worth a warning (the hub skips them quietly)."""
ARCHIVE_LOCK = ".archive.lck"
SEGMENT_SUFFIX = ".jnl"
INDEX_SUFFIX = ".idx"
SUM_SUFFIX = ".sum"
OFFSET_SUFFIX = ".ofs"
LOCK_SUFFIX = ".lck"
QUARANTINE_MARK = ".cut-"

SEGMENT_RE = re.compile(r"\A([0-9a-f]{16})\.jnl\Z")
INDEX_RE = re.compile(r"\A([0-9a-f]{16})\.idx\Z")
SUM_RE = re.compile(r"\A([0-9a-f]{16})\.sum\Z")
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
    return os.path.join(dir, SEGMENT_DIR)


def index_dir(dir: str) -> str:
    return os.path.join(dir, INDEX_DIR)


def offset_dir(dir: str) -> str:
    return os.path.join(dir, OFFSET_DIR)


def writer_lock_path(dir: str) -> str:
    return os.path.join(dir, WRITER_LOCK)


def segment_name(first_offset: int) -> str:
    """The file name of the segment whose first message has this offset."""
    return f"{first_offset:016x}{SEGMENT_SUFFIX}"


def parse_segment_name(name: str) -> int | None:
    """The first offset a segment file name stands for, or None if it is not a segment name."""
    m = SEGMENT_RE.match(name)
    return int(m.group(1), 16) if m else None


def index_name(first_offset: int) -> str:
    return f"{first_offset:016x}{INDEX_SUFFIX}"


def parse_index_name(name: str) -> int | None:
    """The first offset of the segment an index file name belongs to, or None if it is not one."""
    m = INDEX_RE.match(name)
    return int(m.group(1), 16) if m else None


def sum_name(first_offset: int) -> str:
    return f"{first_offset:016x}{SUM_SUFFIX}"


def parse_sum_name(name: str) -> int | None:
    """The first offset of the segment a checksum file name belongs to, or None if it is not one."""
    m = SUM_RE.match(name)
    return int(m.group(1), 16) if m else None


def sum_path(dir: str, first_offset: int) -> str:
    return os.path.join(dir, INDEX_DIR, sum_name(first_offset))


def segment_path(dir: str, first_offset: int) -> str:
    return os.path.join(dir, SEGMENT_DIR, segment_name(first_offset))


def index_path(dir: str, first_offset: int) -> str:
    return os.path.join(dir, INDEX_DIR, index_name(first_offset))


def quarantine_name(segment: str, position: int, time_ns: int) -> str:
    """The name of the file keeping bytes cut from the segment file `segment` at `position`."""
    return f"{segment}{QUARANTINE_MARK}{position}-{time_ns}"


def is_quarantine_name(name: str) -> bool:
    return SEGMENT_SUFFIX + QUARANTINE_MARK in name


def check_reader_name(name: object) -> str:
    """Return `name` if it is a valid reader name ([A-Za-z0-9_-]+), else raise."""
    if not isinstance(name, str) or not READER_RE.match(name) or len(name) > MAX_READER_NAME:
        raise InvalidArgumentError(
            f"reader name must match [A-Za-z0-9_-]+ (at most {MAX_READER_NAME} characters), got {name!r}"
        )
    return name


def offset_file_name(reader: str) -> str:
    """`<reader>.ofs`, after checking the reader name."""
    return check_reader_name(reader) + OFFSET_SUFFIX


def reader_offset_path(dir: str, name: str) -> str:
    return os.path.join(dir, OFFSET_DIR, offset_file_name(name))


def reader_lock_path(dir: str, name: str) -> str:
    return os.path.join(dir, OFFSET_DIR, check_reader_name(name) + LOCK_SUFFIX)


def reader_of(name: str) -> str | None:
    """The reader whose offset file this name is, or None if it is not one."""
    if not name.endswith(OFFSET_SUFFIX):
        return None
    reader = name[: -len(OFFSET_SUFFIX)]
    return reader if READER_RE.match(reader) else None


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
    return sorted(r for r in map(reader_of, names) if r is not None)
