"""A reader's committed offset: `ofs/<name>.ofs`, 8 bytes big-endian, the NEXT offset to read."""

from __future__ import annotations

import os
import struct
from typing import IO, Literal

from .errors import ClosedError, CorruptionError, InvalidArgumentError
from .frames import MAX_OFFSET
from .journal import first_offset, next_offset
from .layout import check_reader_name, journal_path, offset_dir, reader_lock_path, reader_offset_path
from .lock import lock_file, unlock_file
from .recovery import fsync_dir

U64 = struct.Struct(">Q")


def read_offset_file(path: str) -> int | None:
    """The offset stored in an .ofs file; None if nothing is committed; CorruptionError if malformed.

    An empty file means nothing committed, as in the Go original (its NewOffset creates one).
    """
    try:
        with open(path, "rb") as f:
            raw = f.read(9)
    except FileNotFoundError:
        return None
    if not raw:
        return None
    if len(raw) != 8:
        raise CorruptionError(path, 0, f"offset file holds {len(raw) if len(raw) < 9 else 'more than 8'} bytes, not 8")
    return U64.unpack(raw)[0]  # type: ignore[no-any-return]


def write_offset_file(path: str, value: int) -> None:
    """Store `value` atomically: temp file, fsync, rename, directory fsync."""
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "wb") as f:
        f.write(U64.pack(value))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_dir(os.path.dirname(path))


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
        if not os.path.isdir(self.dir):
            raise InvalidArgumentError(f"journal directory {self.dir} does not exist")
        os.makedirs(offset_dir(self.dir), exist_ok=True)
        self.path = reader_offset_path(self.dir, name)
        self._lock_fh: IO[str] | None = lock_file(reader_lock_path(self.dir, name))
        try:
            stored = read_offset_file(self.path)
        except BaseException:
            self.close()
            raise
        if stored is None:
            stored = first_offset(self.dir) if default == "first" else next_offset(self.dir)
        self._value = stored

    @property
    def value(self) -> int:
        """The committed offset: the next offset this reader will read."""
        return self._value

    def commit(self, offset: int) -> None:
        """Store `offset` durably and atomically (a crash leaves the old or the new value)."""
        if self._lock_fh is None:
            raise ClosedError(f"offset {self.name} of {self.dir} is closed")
        if not isinstance(offset, int) or isinstance(offset, bool) or not 0 <= offset <= MAX_OFFSET:
            raise InvalidArgumentError(f"offset must be an int in 0..2**64-1, got {offset!r}")
        write_offset_file(self.path, offset)
        self._value = offset

    def close(self) -> None:
        """Release the reader's lock. Idempotent."""
        if self._lock_fh is not None:
            unlock_file(self._lock_fh)
            self._lock_fh = None

    def __enter__(self) -> Offset:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Offset({self.dir!r}, {self.name!r}, value={self._value})"
