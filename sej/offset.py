"""A reader's committed offset: `ofs/<name>.ofs`, 8 bytes big-endian, the NEXT offset to read.

A commit overwrites the file's 8 bytes in place (one pwrite, then fdatasync). Eight bytes at
the start of a file lie in one disk sector, which a disk writes whole, so a crash leaves the
old value or the new one (PostgreSQL keeps pg_control under 512 bytes for the same reason).
A file that is missing or not 8 bytes long (nothing committed yet: the Go original creates it
empty) is written through a temp file and a rename instead. Readers without the lock read
until two reads agree, since a read racing an overwrite may see part of each value.
"""

from __future__ import annotations

import errno
import os
import re
import stat
import struct
import time
from typing import IO, Literal

from .errors import ClosedError, CorruptionError, InvalidArgumentError
from .frames import MAX_OFFSET
from .fsutil import atomic_write, create_exclusive, fsync_dir, open_dir, open_regular
from .journal import check_journal, first_offset, next_offset
from .layout import check_reader_name, journal_path, offset_dir, reader_lock_path, reader_offset_path, segment_dir
from .lock import lock_file, unlock_file

U64 = struct.Struct(">Q")

TEMP_RE = re.compile(r"\A[A-Za-z0-9_-]+\.ofs\.(?:[0-9a-f]{16}|[0-9]+|hub)\.tmp\Z")
"""Temp files of offset commits: `<reader>.ofs.<16 random hex digits>.tmp`, and the names older
versions used (`<reader>.ofs.<pid>.tmp` locally, `<reader>.ofs.hub.tmp` by the hub over SFTP)."""

STALE_TEMP_AGE = 600.0
"""Seconds after which a commit's temp file counts as left behind by a killed commit.

A commit holds its temp file only while it writes and fsyncs 8 bytes, so a temp file untouched
for 10 minutes has no writer any more. The age, not a pid in the name, decides: the hub writes
temp files into a producer's ofs/ over SFTP, where its pid means nothing, and a pid is reused.
Removing the temp file of a commit still under way cannot corrupt anything either: its rename
then fails and the old value stays.
"""


def read_offset_file(path: str) -> int | None:
    """The offset stored in an .ofs file; None if nothing is committed; CorruptionError if malformed.

    An empty file means nothing committed, as in the Go original (its NewOffset creates one).
    A symlink, FIFO or any other non-regular file there raises UnsafeFileError (never followed or opened).
    """
    return read_offset_at(path)


STABLE_READS = 100
"""Reads of an offset file, at most, until two in a row agree (see read_offset_at)."""


def read_offset_at(name: str, *, dir_fd: int | None = None, show: str | None = None) -> int | None:
    """read_offset_file of `name` relative to the directory descriptor `dir_fd`; `show` names it in errors.

    Read until two reads agree: a commit overwrites the 8 bytes in place, and a read racing it
    may see part of the old value and part of the new one.
    """
    where = show or name
    try:
        fd = open_regular(name, dir_fd=dir_fd, show=show)
    except FileNotFoundError:
        return None
    try:
        raw = os.pread(fd, 9, 0)
        for _ in range(STABLE_READS):
            again = os.pread(fd, 9, 0)
            if again == raw:
                return parse_offset(raw, where)
            raw = again
    finally:
        os.close(fd)
    raise CorruptionError(where, 0, f"offset file changed between each of {STABLE_READS} reads")


def parse_offset(raw: bytes, where: str) -> int | None:
    """The offset in the first bytes of an .ofs file (read at least 9 of them, to see one too many).

    None if empty (nothing committed); CorruptionError naming `where` if not exactly 8 bytes.
    """
    if not raw:
        return None
    if len(raw) != 8:
        what = len(raw) if len(raw) < 9 else "more than 8"
        raise CorruptionError(where, 0, f"offset file holds {what} bytes, not 8")
    return U64.unpack(raw)[0]  # type: ignore[no-any-return]


def encode_offset(value: int) -> bytes:
    """The 8 bytes of an .ofs file holding `value`."""
    return U64.pack(value)


def write_offset_file(path: str, value: int) -> None:
    """Store `value` in the file `path` atomically (see write_offset_at)."""
    write_offset_at(path, value)


def write_offset_at(name: str, value: int, *, dir_fd: int | None = None, show: str | None = None) -> None:
    """Store `value` in `name` (relative to the directory descriptor `dir_fd`, if given) atomically.

    The temp file beside it has an unpredictable name and is created exclusively
    (O_CREAT|O_EXCL|O_NOFOLLOW: it never follows a symlink nor reuses a file), fsynced,
    renamed over `name` (a rename replaces the name and follows nothing), and the
    directory is fsynced. An existing `name` that is not a regular file (a symlink, a
    FIFO) raises UnsafeFileError and is left alone. `show` names the file in errors.
    """
    atomic_write(name, encode_offset(value), dir_fd=dir_fd, show=show)


def write_in_place(path: str, value: int, *, sync: bool = True) -> bool | None:
    """Overwrite the .ofs file `path` (8 bytes, or empty: nothing committed) with `value`, or create it.

    fdatasync'd when `sync`. Returns True when the file was created (its directory entry is
    durable only once the directory is fsynced), False when it was overwritten, None, with
    nothing written, when it holds anything but 0 or 8 bytes or has other names (hard links: the
    caller then replaces the name, leaving the other files alone). UnsafeFileError when it is
    not a regular file. Only the holder of the reader's lock may call this.
    """
    created = False
    flags = os.O_RDWR | os.O_NONBLOCK  # nonblocking: no fcntl calls after the open (a regular file never blocks)
    try:
        fd = open_regular(path, flags)
    except FileNotFoundError:
        try:
            fd = create_exclusive(path)  # a reader sees it empty (nothing committed) until the write
            created = True
        except FileExistsError:  # created meanwhile (not by a reader: those hold the lock)
            fd = open_regular(path, flags)
    try:
        if not created:
            st = os.fstat(fd)
            if st.st_size not in (0, 8) or st.st_nlink != 1:
                return None
        if os.pwrite(fd, U64.pack(value), 0) != 8:
            raise OSError(errno.EIO, f"short write to {path}")
        if sync:
            os.fdatasync(fd)
    finally:
        os.close(fd)
    return created


def sync_offset_file(path: str, *, created: bool = False) -> None:
    """fdatasync the .ofs file `path`: make a commit written without `sync` durable (and, when it `created`
    the file, its directory entry)."""
    fd = open_regular(path, os.O_RDONLY | os.O_NONBLOCK)  # nonblocking: no fcntl calls after the open
    try:
        os.fdatasync(fd)
    finally:
        os.close(fd)
    if created:
        fsync_dir(os.path.dirname(path))


def read_offset_durably(path: str) -> int | None:
    """read_offset_file, the value made durable before it is returned (the file, and its name in ofs/):
    for whoever deletes data by it (retention), since a reader may have written it without fsync."""
    value = read_offset_file(path)
    if value is not None:
        try:
            sync_offset_file(path, created=True)
        except FileNotFoundError:  # removed meanwhile: the value read still holds data back, which is safe
            pass
    return value


def remove_stale_temps(dir_fd: int, now: float | None = None) -> list[str]:
    """Remove the commit temp files (TEMP_RE) older than STALE_TEMP_AGE in the directory `dir_fd`.

    Returns the names removed. Nothing else is touched: other names, directories, young temp files.
    """
    now = time.time() if now is None else now
    removed = []
    with os.scandir(dir_fd) as entries:
        names = [e.name for e in entries if TEMP_RE.match(e.name)]
    for name in names:
        try:
            st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
            if stat.S_ISDIR(st.st_mode) or now - st.st_mtime < STALE_TEMP_AGE:
                continue
            os.unlink(name, dir_fd=dir_fd)  # a symlink itself, never its target
        except FileNotFoundError:
            continue
        removed.append(name)
    return removed


class Offset:
    """A named reader's committed offset in a journal, held under the reader's lock.

    Without a committed value, `value` starts at the journal's first retained
    offset (``default="first"``) or at its next offset (``default="last"``).
    """

    def __init__(
        self,
        dir: str | os.PathLike[str],
        name: str,
        default: Literal["first", "last"] = "first",
    ) -> None:
        self.dir = journal_path(dir)
        self.name = check_reader_name(name)
        if default not in ("first", "last"):
            raise InvalidArgumentError(f"default must be 'first' or 'last', got {default!r}")
        if not os.path.isdir(segment_dir(self.dir)):
            check_journal(self.dir)  # a missing directory, a root of journals: refused before ofs/ is made in it
        os.makedirs(offset_dir(self.dir), exist_ok=True)
        self.path = reader_offset_path(self.dir, name)
        self._lock_fh: IO[str] | None = lock_file(reader_lock_path(self.dir, name))
        try:
            ofs = open_dir(offset_dir(self.dir), follow=True)
            try:
                remove_stale_temps(ofs)  # left by commits that were killed (see STALE_TEMP_AGE)
            finally:
                os.close(ofs)
            stored = read_offset_file(self.path)
            if stored is None:  # InvalidArgumentError for a root of journals: the lock is released
                stored = first_offset(self.dir) if default == "first" else next_offset(self.dir)
        except BaseException:
            self.close()
            raise
        self._value = stored
        self._created = False  # this object created the file and has not fsynced its directory since
        self._unsynced = False  # a commit made without sync, not synced since

    @property
    def value(self) -> int:
        """The committed offset: the next offset this reader will read."""
        return self._value

    def commit(self, offset: int, *, sync: bool = True) -> None:
        """Store `offset` atomically (a crash leaves the old or the new value), durably when `sync`.

        Without `sync` the value is written to the OS at once (other processes see it, and it
        survives this process being killed) and made durable by a later `sync()`: until then,
        a power loss may bring back the value before it.
        """
        if self._lock_fh is None:
            raise ClosedError(f"offset {self.name} of {self.dir} is closed")
        if not isinstance(offset, int) or isinstance(offset, bool) or not 0 <= offset <= MAX_OFFSET:
            raise InvalidArgumentError(f"offset must be an int in 0..2**64-1, got {offset!r}")
        if not sync:
            self._unsynced = True  # before the write: a sync running meanwhile clears it first, then syncs
        created = write_in_place(self.path, offset, sync=sync)
        if created is None:  # neither 0 nor 8 bytes, or hard-linked: replaced whole, durably
            write_offset_file(self.path, offset)
            self._created = False
        else:
            self._created |= created
            if sync and self._created:
                fsync_dir(offset_dir(self.dir))
                self._created = False
        self._value = offset

    def sync(self) -> None:
        """Make the commits made with ``sync=False`` durable (nothing to do without one)."""
        if not self._unsynced:
            return
        self._unsynced = False  # before the fdatasync, which covers every write before it
        try:
            sync_offset_file(self.path, created=self._created)
        except BaseException:
            self._unsynced = True
            raise
        self._created = False

    def close(self) -> None:
        """Release the reader's lock (not in a child forked since: see unlock_file). Idempotent."""
        if self._lock_fh is not None:
            unlock_file(self._lock_fh)
            self._lock_fh = None

    def __enter__(self) -> Offset:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Offset({self.dir!r}, {self.name!r}, value={self._value})"
