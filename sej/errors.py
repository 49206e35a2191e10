"""The exceptions sej raises: one hierarchy under `SejError`."""

from __future__ import annotations


class SejError(Exception):
    """Base class of every error sej raises on purpose."""


class InvalidArgumentError(SejError, ValueError, TypeError):
    """A public call got a bad value or a value of the wrong type.

    It is also a ValueError and a TypeError, so callers that catch those keep working.
    """


class LockedError(SejError):
    """A lock file (a writer's, a reader's, a retention run's) is held by someone else.

    `holder` says who holds such a lock, for the message.
    """

    def __init__(self, path: str, holder: str = "another writer or reader") -> None:
        super().__init__(f"{path} is locked by {holder}")
        self.path = path


class LockLostError(SejError):
    """The writer's lock file was deleted or replaced under it: another writer may now be writing.

    The writer stops writing at once (its unwritten buffer is dropped) rather than
    interleave frames with that writer.
    """

    def __init__(self, path: str, what: str) -> None:
        super().__init__(
            f"{path} {what} under this writer, so another writer may be writing the journal; "
            "this writer stopped and writes nothing more"
        )
        self.path = path


class ClosedError(SejError):
    """The writer, scanner or offset was used after close()."""


class FrameError(SejError):
    """Bytes that are not a valid SEJ message frame (pure codec error, no file involved)."""

    def __init__(self, reason: str, position: int) -> None:
        super().__init__(f"{reason} at byte {position}")
        self.reason = reason
        self.position = position


class CorruptionError(SejError):
    """A segment holds bytes that are not a valid continuation of the journal.

    `path` is the segment, `position` the first bad byte, `reason` what is wrong,
    `length` how many bytes from `position` to the end of the file, and
    `quarantine` where they were moved (None when nothing was moved).
    """

    def __init__(
        self,
        path: str,
        position: int,
        reason: str,
        length: int = 0,
        quarantine: str | None = None,
    ) -> None:
        msg = f"{path}: {reason} at byte {position}"
        if length:
            msg += f" ({length} bytes to the end of the file)"
        if quarantine:
            msg += f"; moved aside to {quarantine}"
        super().__init__(msg)
        self.path = path
        self.position = position
        self.reason = reason
        self.length = length
        self.quarantine = quarantine


class ChecksumError(CorruptionError):
    """A segment's bytes disagree with their checksums, or its checksum file is invalid.

    `start`..`end` is the byte range of the segment, `offsets` the first and last message
    offsets it covers (None when unknown), `sum_path` the checksum file, `detail` what is wrong.
    """

    def __init__(
        self, path: str, start: int, end: int, reason: str, sum_path: str = "", offsets: tuple[int, int] | None = None
    ) -> None:
        where = f"bytes {start}..{end}"
        if offsets is not None:
            where += f", messages {offsets[0]}..{offsets[1]}"
        super().__init__(path, start, f"{reason} ({where})")
        self.start = start
        self.end = end
        self.sum_path = sum_path
        self.offsets = offsets
        self.detail = reason


class TruncatedError(SejError):
    """A segment shrank, vanished or was replaced while a scanner was reading it."""


class OffsetOutOfRangeError(SejError):
    """An offset is below the first retained message or beyond the journal's end."""

    def __init__(self, offset: int, first: int, next: int) -> None:
        super().__init__(
            f"offset {offset} is outside the journal, which holds offsets {first} to {next - 1}"
            if next > first
            else f"offset {offset} is outside the journal, which is empty and starts at {first}"
        )
        self.offset = offset
        self.first = first
        self.next = next


class UnsafeFileError(SejError):
    """A path sej was to open is not what it must be: a symlink, a FIFO, a device, a directory...

    sej never follows a symlink nor opens a non-regular file in a tree it does not
    trust (a producer's journals, reader offsets): it raises this instead. `path` is
    the path, `kind` what it is ("symlink", "FIFO", ...), `expected` what it had to be.
    The message names both, never the file's contents.
    """

    def __init__(self, path: str, kind: str, expected: str = "a regular file") -> None:
        super().__init__(f"{path} is a {kind}, not {expected}: refusing to open it")
        self.path = path
        self.kind = kind
        self.expected = expected


class ProtocolError(SejError):
    """Bytes from a peer that do not follow a wire protocol (`sej serve`'s): a frame too big, a body that does
    not decode, a message of the wrong shape. The message names what was wrong; the stream is not used again."""


class CorruptionWarning(UserWarning):
    """Issued when the writer cut a corrupt tail and moved it aside."""


class DataLossError(SejError):
    """Messages a reader still needed were deleted (by retention) before it read them."""


class SyncError(SejError, OSError):
    """An fsync of a journal failed: what it covered may not be on disk.

    The cause (`__cause__`) is the OSError the kernel gave. The writer then refuses
    every later durable acknowledgement (`sync()`, sync-mode appends, `submit` futures)
    with this error: after a failed fsync the kernel may have dropped the dirty pages,
    and a later fsync that succeeds would not bring them back. Reopen the journal;
    recovery then shows what is on disk.
    """


class MissingExtraError(SejError, ImportError):
    """A feature needs a package of one of sej's extras that is not installed; the message names both."""
