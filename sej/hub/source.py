"""What the hub copies from: the Source protocol, and what its transports share.

A source is a producer's journals: on this machine (sej.hub.local_source), over SFTP
(sej.hub.sftp_source), or through `sej serve` (sej.hub.serve_source). A source root is
a sharded root (journal directories under it) or a single journal. Every name read
from it is validated (sej.hub.names) before use.
"""

from __future__ import annotations

import stat
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

from ..checksum import HEADER as SUM_HEADER
from ..errors import InvalidArgumentError, SejError
from ..fsutil import kind
from ..layout import OWN_DIRS, segment_name
from ..shard.name import parse_shard
from .names import check_journal_name, check_segment_name

if TYPE_CHECKING:
    from .copy import SumsMark


MAX_SUMS = 1 << 30
"""Largest checksum file read (a 1 GiB segment written one message per flush has 16 bytes per message)."""


def sums_skip(skip: int) -> tuple[int, int]:
    """(bytes of header, position of the rest) to read of a checksum file for `read_sums(..., skip)`."""
    return (SUM_HEADER.size, skip) if skip > SUM_HEADER.size else (0, 0)


CONNECT_TIMEOUT = 15.0
"""Seconds for a TCP connection, the SSH banner and authentication."""

IO_TIMEOUT = 60.0
"""Seconds an SFTP request may wait for its reply: a stalled producer fails the pass, never hangs it."""

KEEP_HANDLES = 512
"""Files a kept channel (the daemon's) holds open at most, fewer if the server's limits say so."""


class SourceSegment(NamedTuple):
    first_offset: int
    name: str
    size: int


Call = tuple[Any, ...]
"""A call for `Source.many`: the method's name and its arguments, e.g. ("size", journal, name)."""


class SourceError(SejError):
    """The source could not be read (a missing journal, a transport failure)."""


class Source(Protocol):
    """What the copier needs from a producer's side.

    The capabilities below the calls are declared here, not probed with getattr: a wrapper (the daemon's watched
    source, a pass's Prefetched) must say what it forwards, or a type checker and the tests name what it lacks.
    """

    @property
    def remote(self) -> bool:
        """Over the network (SFTP): its calls can be spread over threads, since a stuck one is ended by
        closing the connection. A local call stuck in the kernel cannot be ended; it stays in a daemon thread."""
        ...

    @property
    def reads_seen(self) -> bool:
        """`many` takes ("read_seen", journal, name, pos, size) calls: a read without an lstat of its own, right after
        the pass's probe or listing lstat'ed the segment (sej.hub.batch)."""
        ...

    @property
    def round_trip(self) -> float:
        """Seconds of one round trip to the producer, as first measured (0.0 on this machine): from
        sej.hub.batch.PROBE_TOGETHER_RTT on, the probe asks a journal's two lstats at once."""
        ...

    @property
    def defers_commit(self) -> bool:
        """`commit_offset` only keeps the offset, for the pass to commit with the others after their copies are
        durable (sej.hub.batch.Prefetched); a copy made durable by a SyncBatch needs such a source."""
        ...

    @property
    def broken(self) -> bool:
        """A transport failure left it unusable (requests may still be in flight): a kept one is replaced."""
        ...

    def sums_mark(self, journal: str, name: str) -> SumsMark | None:
        """How far an earlier pass read the checksum file of segment `name` (sej.hub.copy.SumsMark); None: unknown."""
        ...

    def keep_handles(self, most: int) -> None:
        """Keep up to `most` files open between calls (the daemon's kept sources); nothing to keep: a no-op."""
        ...

    def forget(self, journals: set[str] | None = None) -> None:
        """Let go of what is kept open or cached for `journals` (all, without)."""
        ...

    def tidy(self) -> None:
        """Close what was let go of, or kept open for long (at the end of each pass)."""
        ...

    def journals(self) -> list[str]: ...

    def skipped(self) -> dict[str, str]: ...

    def segments(self, journal: str) -> list[SourceSegment]: ...

    def size(self, journal: str, name: str) -> int | None:
        """The size of a segment file; None when it does not exist."""
        ...

    def read(self, journal: str, name: str, pos: int, size: int) -> bytes: ...

    def read_sums(self, journal: str, name: str, skip: int = 0) -> bytes | None:
        """The checksum file of a segment (sej.checksum); None when it has none (an unchecked segment).

        `skip` past the header: the header, then only the file's bytes from `skip` on (what a later
        copy reads, see sej.hub.copy.SumsMark)."""
        ...

    def read_offset(self, journal: str, reader: str) -> int | None: ...

    def commit_offset(self, journal: str, reader: str, value: int, sweep: bool = True) -> None:
        """Write the reader's offset file of a journal; with `sweep`, also remove the temp files that killed
        commits left in its ofs/ (sej.offset.STALE_TEMP_AGE old)."""
        ...

    def describe(self, journal: str, name: str = "") -> str: ...

    def close(self) -> None: ...

    def many(self, calls: list[Call]) -> list[Any]:
        """Several of the calls above at once (over SFTP, with their requests in flight together):
        each one's result, or the SejError or OSError it raised."""
        ...


def sort_out(name: str, mode: int, jnl: Callable[[str], int | None]) -> tuple[str | None, str | None]:
    """(journal name, None) for a journal directory under a root; (None, why) for a directory that is
    not one and should be said so; (None, None) for what is quietly not a journal.

    `mode` is the entry's lstat mode; `jnl(name)` the lstat mode of its jnl/ (None when missing).
    Files are not journals, quietly, and nor are sej's own directories (OWN_DIRS: consumer groups, the
    hub's status records). A shard-named directory without jnl/ is a shard being made.
    """
    if name in OWN_DIRS:
        return None, None
    if not stat.S_ISDIR(mode):
        return None, "a symlink, not a journal directory" if stat.S_ISLNK(mode) else None
    try:
        check_journal_name(name)
    except InvalidArgumentError as e:
        return None, f"not a journal name: {e}"
    try:
        mode = jnl(name)  # type: ignore[assignment]
    except OSError as e:  # e.g. no permission (SFTP: a transport failure raises SourceError instead)
        return None, f"its jnl cannot be read: {e.strerror or e}"
    if mode is None:
        return None, None if parse_shard(name).bit else "not a journal (no jnl/ directory) and not a shard name"
    if not stat.S_ISDIR(mode):
        return None, f"its jnl is a {kind(mode)}, not a directory"
    return name, None


def valid_segments(entries: list[tuple[str, int]], where: str) -> list[SourceSegment]:
    out = []
    for name, size in entries:
        try:
            first = check_segment_name(name)
        except InvalidArgumentError:
            continue  # quarantine files, index files, anything else
        out.append(SourceSegment(first, segment_name(first), size))
    return sorted(out)
