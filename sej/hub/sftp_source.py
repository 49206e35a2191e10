"""Journals on a producer over SFTP: SftpSource, every call an operation of sej.hub.pipeline.

Without sej on the producer (or with `transport = "sftp"`), the hub reads it with nothing but
SFTP requests: a pass's calls go together (`many`), the root's listing is reused while the root
does not change, and a kept source (the daemon's) keeps files open between passes.
"""

from __future__ import annotations

import errno
import logging
import posixpath
import stat
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NamedTuple, TypeVar

from ..errors import CorruptionError, SejError, UnsafeFileError
from ..fsutil import kind, temp_name
from ..layout import INDEX_DIR, OFFSET_DIR, SEGMENT_DIR, offset_file_name, parse_segment_name, segment_name, sum_name
from ..offset import STALE_TEMP_AGE, TEMP_RE, encode_offset, parse_offset
from ..shard.name import is_shard_name
from .names import check_journal_name, check_segment_name
from .pipeline import Op, SFTPStreamError, expect, expect_ok, together
from .sftp_handles import KEEP_UNSTATED, KeptHandles
from .source import KEEP_HANDLES, MAX_SUMS, Call, SourceError, SourceSegment, sort_out, sums_skip, valid_segments

if TYPE_CHECKING:
    import paramiko  # SftpSource is given a paramiko SFTPClient: paramiko is imported where it is made (sej.hub.ssh)

    from .copy import SumsMark

log = logging.getLogger("sej.hub")

T = TypeVar("T")


def _transport_errors() -> tuple[type[BaseException], ...]:
    """What a call over SFTP can fail with (a cut connection raises EOFError or SSHException)."""
    import paramiko

    return (OSError, EOFError, paramiko.SSHException)


READ_RANGE = 255 << 10
"""Bytes per SFTP read request and readv range (OpenSSH's sftp-server serves at most 256 KiB less a header)."""

READDIRS_AHEAD = 16
"""READDIRs in flight on one directory after the first two found more: 1,600 entries a round trip from OpenSSH."""

MAX_LISTED = 10_000_000
"""The most entries a journal's jnl/ listing may have over SFTP: a reply loop must end."""

BULK_READ = 1 << 20
"""Reads bigger than this go through paramiko's readv; smaller ones are pipelined operations."""

LISTING_SETTLED = 1.1
"""Seconds after a root's mtime was first seen from which a listing shows every change it stamped: SFTP
gives an mtime in whole seconds, so a change later in the same second leaves it as it was."""

LISTING_MAX_AGE = 30.0
"""Seconds a root listing is reused for at most, however its mtime looks (a clock stepped back, a file
system that keeps a directory's mtime)."""


class _Listing(NamedTuple):
    """A root's listing, kept for the next passes (SftpSource.journals)."""

    root: tuple[int, str]  # the root's mtime before the listing, and where it leads (its realpath)
    at: float  # time.monotonic() when it was asked
    names: list[str]
    skipped: dict[str, str]
    jnl: dict[str, int | None]  # the lstat mode of the jnl/ of each shard directory that is not a journal


def _fmt_mode(mode: int | None) -> int | None:
    """A file's type from its mode; None for no file."""
    return None if mode is None else stat.S_IFMT(mode)


def _same_modes(dirs: list[str], got: list[Any], modes: dict[str, int | None]) -> bool:
    """Whether the jnl/ of each of `dirs` (`got`: their lstats, if asked) is the same type of file as in `modes`."""
    if not dirs:
        return True
    (attrs,) = got
    if isinstance(attrs, BaseException):
        return False
    return all(_fmt_mode(None if a is None else a.st_mode or 0) == _fmt_mode(modes[d])
               for d, a in zip(dirs, attrs, strict=True))  # fmt: skip


def _is_ok(reply: Any) -> bool:
    try:
        expect_ok(reply)
        return True
    except (OSError, EOFError):
        return False


class SftpSource:
    """Journals on a producer, read over SFTP (no remote shell, no agent).

    As with LocalSource, nothing in the producer's tree is followed or opened unless it
    is what the layout says: every directory and file is lstat'ed first (SFTP's readdir
    attributes are lstat's too) and a symlink, FIFO or device raises UnsafeFileError; an
    opened file is fstat'ed again. SFTP has no O_NOFOLLOW, so this narrows, but cannot
    close, the window in which a producer could swap a checked name for a symlink. The
    hub's offset is written to a temp file with an unpredictable name, created exclusively
    (SSH_FXF_EXCL, which never follows a symlink), then renamed over the old one.

    Every call is an operation of sej.hub.pipeline: a single call waits for its own replies,
    and `many` runs many calls with their requests in flight together.
    """

    remote = True
    reads_seen = True  # `many` takes ("read_seen", ...) calls (sej.hub.batch, right after its probe or listing)
    defers_commit = False

    def __init__(self, sftp: paramiko.SFTPClient, root: str, label: str) -> None:
        from .pipeline import Pipeline

        self.sftp = sftp
        self.label = label  # user@host:port, for messages
        self._errors = _transport_errors()
        self._pipe = Pipeline(sftp)
        root = posixpath.normpath(root)
        try:  # in one round trip: whether the root is a journal, and how many files the server may open
            started = time.monotonic()
            jnl, limit = self._pipe.run([self._lstats(posixpath.join(root, SEGMENT_DIR)), self._handle_limit()])
            self.round_trip = time.monotonic() - started  # seconds, as first measured (sej.hub.batch's probe)
        except self._errors as e:
            raise SourceError(f"{label}:{root}: {self._why(e)}") from None
        if isinstance(jnl, BaseException):  # the server's answer (no permission)
            raise SourceError(f"{label}:{root}: {jnl}")
        is_journal = jnl[0] is not None
        self._limit: int | None = None if isinstance(limit, BaseException) else limit
        if self._limit is not None:  # the files the operations of a call open at once (one each at most)
            self._pipe.max_ops = max(1, min(self._pipe.max_ops, self._limit // 2))
        self.root = posixpath.dirname(root) if is_journal else root
        self._only: list[str] | None = [check_journal_name(posixpath.basename(root))] if is_journal else None
        self._skipped: dict[str, str] = {}
        self._listing: _Listing | None = None  # the root's last listing (journals())
        self._root_seen: tuple[tuple[int, str] | None, float] = (None, 0.0)  # (mtime, realpath), and when first seen
        self.broken = False  # a transport failure: requests may still be in flight, the channel is unusable
        self._handles = KeptHandles()  # files kept open between calls (keep_handles), and those let go

    def keep_handles(self, most: int = KEEP_HANDLES) -> None:
        """Keep the last segment and checksum file read of each journal open between calls (at most `most`
        files, and at most half of what the server allows; KEEP_UNSTATED if it does not say), so that the
        next read of them is a READ alone, and the offset file each commit writes, so that the next commit is a WRITE
        and an fsync. The files a call opens at once are bounded by the rest."""
        from .pipeline import MAX_OPS

        limit = self._limit
        self._handles.most = min(most, KEEP_UNSTATED if limit is None else limit // 2)
        if limit is not None:  # what is left for the files the operations of a call open (one each at most)
            self._pipe.max_ops = max(1, min(MAX_OPS, (limit - self._handles.most) // 2))

    def forget(self, journals: set[str] | None = None) -> None:
        """Let go of the files kept open for `journals` (all, without): closed with the next requests. The root
        is listed afresh by the next `journals()` (a journal gone or failed may no longer be one: its jnl/ removed
        or replaced, which leaves the root's mtime as it was)."""
        if journals is None or journals:
            self._listing = None
        self._handles.forget(journals)

    def tidy(self) -> None:
        """Close the files let go, and those kept for KEEP_SECONDS (a request round, only if there are any):
        no file stays open on the producer for long, deleted or not, while its journal is idle."""
        self._handles.expire()
        if self._handles.closing and not self.broken:
            self._call(self._close_let_go(), self.root)

    def journals(self) -> list[str]:
        """The journals under the root. The last listing is reused while the root's mtime (and where it leads) has
        not changed since it settled (LISTING_SETTLED, at most LISTING_MAX_AGE), the jnl/ of no shard directory
        that was not a journal has changed, and no journal was forgotten since (a failed one may have lost its
        jnl/): a pass over 1,000 unchanged journals then costs no listing and no 1,000 lstats."""
        self._skipped = {}
        if self._only is not None:
            return list(self._only)
        last = self._listing
        asked = time.monotonic()
        waiting = sorted(last.jnl) if last is not None else []  # shard directories without a jnl/ directory
        paths = [posixpath.join(self.root, d, SEGMENT_DIR) for d in waiting]
        # Without a listing to reuse, the root is listed in the same round trips as its stat (asked first: the
        # listing is at least as new as the mtime it is kept with).
        fresh = last is None
        try:
            # The root may be a symlink: where it leads is asked too (a symlink pointed elsewhere, at a directory of
            # the same mtime, is a change its target's mtime does not show).
            also = [self._list_dir(self.root, defer_close=True)] if fresh else [self._lstats(*paths)] if paths else []
            root, real, *more = self._pipe.run([self._stat(self.root), self._realpath(self.root), *also])
        except self._errors as e:  # the channel failed
            self.broken = True
            raise SourceError(f"{self.label}:{self.root}: {self._why(e)}") from None
        if isinstance(root, BaseException):  # the server's answer (no such directory, no permission)
            raise SourceError(f"{self.label}:{self.root}: {root}")
        seen = (root.st_mtime, real) if root.st_mtime is not None and isinstance(real, str) else None
        if seen != self._root_seen[0]:
            self._root_seen = (seen, time.monotonic())  # the server's clock has reached that mtime by now
        settled = self._root_seen[1] + LISTING_SETTLED  # a listing asked from then on shows every change then
        if (last is not None and seen is not None and last.root == seen and settled <= last.at
                and asked - last.at < LISTING_MAX_AGE and _same_modes(waiting, more, last.jnl)):  # fmt: skip
            self._skipped = dict(last.skipped)
            return list(last.names)
        self._listing = None
        at = asked if fresh else time.monotonic()
        try:
            (listed,) = more if fresh else self._pipe.run([self._list_dir(self.root, defer_close=True)])
            if isinstance(listed, SejError):  # a listing that never ends
                raise listed
            if isinstance(listed, BaseException):  # the server's answer (no such directory, no permission)
                raise SourceError(f"{self.label}:{self.root}: {listed}")
            entries = [attrs for _name, attrs in listed]
            # The jnl/ of every directory, at once (see sej.hub.pipeline), with the close of the root's handle.
            dirs = [e.filename for e in entries if stat.S_ISDIR(e.st_mode or 0) and is_shard_name(e.filename)]
            lstats = [self._lstats(posixpath.join(self.root, d, SEGMENT_DIR)) for d in dirs]
            got = self._pipe.run([self._close_let_go(), *lstats])[1:]
        except self._errors as e:  # the channel failed
            self.broken = True
            raise SourceError(f"{self.label}:{self.root}: {self._why(e)}") from None
        jnl: dict[str, int | None] = {}
        for d, r in zip(dirs, got, strict=True):
            if isinstance(r, BaseException):
                raise SourceError(f"{self.label}:{self.root}/{d}: {r}")
            jnl[d] = None if r[0] is None else r[0].st_mode or 0
        names = []
        for entry in entries:
            name, why = sort_out(entry.filename, entry.st_mode or 0, jnl.get)
            if name is not None:
                names.append(name)
            elif why is not None:
                self._skipped[entry.filename] = why
        if seen is not None:
            journals = set(names)
            self._listing = _Listing(seen, at, sorted(names), dict(self._skipped),
                                     {d: m for d, m in jnl.items() if d not in journals})  # fmt: skip
            return list(self._listing.names)
        return sorted(names)

    def skipped(self) -> dict[str, str]:
        """Directories the last `journals()` found under the root that are not journals, and why."""
        return dict(self._skipped)

    def _path(self, journal: str, *parts: str) -> str:
        return posixpath.join(self.root, check_journal_name(journal), *parts)

    def _segment_path(self, journal: str, name: str) -> str:
        return self._path(journal, SEGMENT_DIR, segment_name(check_segment_name(name)))

    def _why(self, e: BaseException) -> str:
        """A transport failure in words: a timeout's own message is empty."""
        if isinstance(e, TimeoutError) and not str(e):  # the channel's timeout (not a TCP ETIMEDOUT)
            try:
                limit = self.sftp.get_channel().gettimeout()
            except Exception:  # a closed channel: say what is known
                limit = None
            return f"no reply within {limit:g} s (the I/O timeout)" if limit else "timed out"
        return str(e) or type(e).__name__

    def _call(self, op: Op[T], path: str) -> T:
        """Run one operation; a transport failure becomes a SourceError naming `path`."""
        try:
            if not self._handles.closing:
                return self._pipe.one(op)
            # The files let go before this call are closed first, before this call's operations open more.
            result = self._pipe.run([self._close_let_go(), op])[1]
        except self._errors as e:
            self.broken = True
            raise SourceError(f"{self.label}:{path}: {self._why(e)}") from None
        if isinstance(result, Exception):
            raise result
        return result  # type: ignore[no-any-return]

    def many(self, calls: list[Call]) -> list[Any]:
        ops = [getattr(self, f"_{c[0]}")(*c[1:]) for c in calls]
        # The files let go before this call are closed first: the operations start in order, at most max_ops at
        # once, and the files they open and those still to close must fit in what the server allows together.
        first = [self._close_let_go()] if self._handles.closing else []
        try:
            results = self._pipe.run(first + ops)[len(first) :]
        except self._errors as e:
            self.broken = True
            waiting = self._pipe.stuck
            on = f" (waiting on {', '.join(waiting)})" if waiting else ""
            raise SourceError(f"{self.label}:{self.root}: {self._why(e)}{on}") from None
        return [_as_source_error(r, self.label, self.root) for r in results]

    def segments(self, journal: str) -> list[SourceSegment]:
        return self._call(self._segments(journal), self._path(journal, SEGMENT_DIR))

    def size(self, journal: str, name: str) -> int | None:
        return self._call(self._size(journal, name), self._path(journal, SEGMENT_DIR, name))

    def read(self, journal: str, name: str, pos: int, size: int) -> bytes:
        path = self._segment_path(journal, name)
        if size <= BULK_READ:
            return self._call(self._read_file(path, pos, size), path)
        # A big read: paramiko's readv sends the requests from a thread of its own while this one
        # takes the replies, 10-15% faster (measured) than one thread doing both (sej.hub.pipeline).
        try:
            (attrs,) = self._pipe.one(self._lstats(path))
            self._is(path, attrs, stat.S_ISREG, "a regular file")  # never open a FIFO: it would hang the server
            with self.sftp.open(path, "rb") as f:
                f.MAX_REQUEST_SIZE = READ_RANGE  # OpenSSH serves reads up to 255 KiB; paramiko asks 32 KiB
                opened = f.stat()
                if not stat.S_ISREG(opened.st_mode or 0):
                    raise UnsafeFileError(f"{self.label}:{path}", kind(opened.st_mode or 0))
                end = min(pos + size, opened.st_size or 0)
                # Many 256 KiB ranges, not one big one: paramiko grows one range's buffer by
                # concatenation, quadratic in its size.
                ranges = [(p, min(READ_RANGE, end - p)) for p in range(pos, end, READ_RANGE)]
                return b"".join(f.readv(ranges)) if ranges else b""
        except self._errors as e:
            self.broken = True  # replies may still come: the channel is not used again
            raise SourceError(f"{self.label}:{path}: {self._why(e)}") from None

    def read_sums(self, journal: str, name: str, skip: int = 0) -> bytes | None:
        path = self._sums_path(journal, name)
        return self._call(self._read_sums(journal, name, skip), path)

    def _sums_path(self, journal: str, name: str) -> str:
        first = check_segment_name(name)
        return self._path(journal, INDEX_DIR, sum_name(first))

    def _read_sums(self, journal: str, name: str, skip: int = 0) -> Op[bytes | None]:
        from paramiko.sftp import SFTP_FLAG_READ

        path = self._sums_path(journal, name)
        head, pos = sums_skip(skip)
        key = (journal, INDEX_DIR)
        kept = self._handles.get(key, path) if self._handles.most > 0 else None
        if kept is not None:  # checked a regular file when it was opened: READs alone
            # Its header, once read through this handle, is not read again: a header is written once, when the file
            # is made, and another file at the path (a new header) is not what this handle reads.
            known = self._handles.head(key) if head else b""
            try:
                if known:
                    return known + (yield from self._read_rest(path, kept, pos, 0))
                return (yield from self._read_rest(path, kept, pos, head, key))
            except OSError:  # the server no longer has it: open the path again
                self._handles.let_go(key, kept)
        (attrs,) = yield from self._lstats(path)
        if attrs is None:
            return None
        self._is(path, attrs, stat.S_ISREG, "a regular file")  # never open a FIFO: it would hang the server
        end = min(attrs.st_size or 0, MAX_SUMS)
        handle = yield from self._open(path, SFTP_FLAG_READ)
        if self._handles.most <= 0:  # closed with its reads: a round trip less
            return (yield from self._read_open(path, handle, pos, max(pos, end), head, close=True))
        read = self._read_open(path, handle, pos, max(pos, end), head)
        return (yield from self._keeping(key, path, handle, read))

    def _read_rest(self, path: str, handle: bytes, pos: int, head: int, key: tuple[str, str] | None = None
                   ) -> Op[bytes]:  # fmt: skip
        """A kept file's first `head` bytes, then its bytes from `pos` to its end (at most MAX_SUMS). With `key`, the
        first `head` bytes, when all there, are remembered with the handle kept for `key` (if it still is)."""
        from paramiko.sftp import CMD_DATA, CMD_READ, int64

        chunks = []
        first = [(CMD_READ, handle, int64(0), head)] if head else []
        while pos < MAX_SUMS:
            n = min(READ_RANGE, MAX_SUMS - pos)
            replies = yield [*first, (CMD_READ, handle, int64(pos), n)]
            if first:
                try:
                    chunks.append(expect(replies[0], CMD_DATA).get_string()[:head])
                except EOFError:  # an empty file
                    pass
                else:
                    if key is not None and len(chunks[0]) == head:
                        self._handles.remember_head(key, handle, chunks[0])
                first = []
            try:
                data = expect(replies[-1], CMD_DATA).get_string()
            except EOFError:
                break
            if len(data) > n:  # never more than asked: bytes out of place
                raise SFTPStreamError(f"{self.label}:{path}: a read of {n} bytes at {pos} answered with {len(data)}")
            chunks.append(data)
            pos += len(data)
            if len(data) < n:
                break
        return b"".join(chunks)

    def read_offset(self, journal: str, reader: str) -> int | None:
        path = self._path(journal, OFFSET_DIR, offset_file_name(reader))
        return self._call(self._read_offset(journal, reader), path)

    def commit_offset(self, journal: str, reader: str, value: int, sweep: bool = True) -> None:
        self._call(self._commit_offset(journal, reader, value, sweep),
                   self._path(journal, OFFSET_DIR, offset_file_name(reader)))  # fmt: skip

    # The operations (sej.hub.pipeline): each yields the requests it needs next.

    def _stat(self, path: str) -> Op[paramiko.SFTPAttributes]:
        """stat of `path`, following a symlink (the configured root may be one)."""
        from paramiko import SFTPAttributes
        from paramiko.sftp import CMD_ATTRS, CMD_STAT

        (reply,) = yield [(CMD_STAT, path.encode())]
        return SFTPAttributes._from_msg(expect(reply, CMD_ATTRS))

    def _realpath(self, path: str) -> Op[str]:
        """The server's canonical form of `path` (SSH_FXP_REALPATH: symlinks resolved)."""
        from paramiko.sftp import CMD_NAME, CMD_REALPATH

        (reply,) = yield [(CMD_REALPATH, path.encode())]
        msg = expect(reply, CMD_NAME)
        if msg.get_int() != 1:
            raise OSError(f"a REALPATH of {path} named no single path")
        return str(msg.get_text())

    def _lstats(self, *paths: str, before: tuple[Any, ...] = ()) -> Op[list[paramiko.SFTPAttributes | None]]:
        """lstat of each path at once; None for a missing one. `before`: requests sent first in the same round,
        their replies ignored (the server answers in turn: the lstats see what they did)."""
        from paramiko import SFTPAttributes
        from paramiko.sftp import CMD_ATTRS, CMD_LSTAT

        replies = yield [*before, *((CMD_LSTAT, p.encode()) for p in paths)]
        replies = replies[len(before) :]
        out: list[paramiko.SFTPAttributes | None] = []
        for reply in replies:
            try:
                out.append(SFTPAttributes._from_msg(expect(reply, CMD_ATTRS)))
            except FileNotFoundError:
                out.append(None)
        return out

    def _is(self, path: str, attrs: paramiko.SFTPAttributes | None, test: Callable[[int], bool], expected: str) -> None:
        """FileNotFoundError when missing, UnsafeFileError when not what `test` wants."""
        if attrs is None:
            raise FileNotFoundError(errno.ENOENT, f"{self.label}:{path} does not exist")
        if not test(attrs.st_mode or 0):
            raise UnsafeFileError(f"{self.label}:{path}", kind(attrs.st_mode or 0), expected)

    def _dirs(self, journal: str, sub: str | None, *more: str, before: tuple[Any, ...] = ()
              ) -> Op[list[paramiko.SFTPAttributes | None]]:  # fmt: skip
        """Check the journal's directory (and its `sub` directory) are directories, no symlinks; lstat
        `more` paths in the same round trip (returned). `before`: requests sent first (see _lstats)."""
        jdir = self._path(journal)
        paths = [] if self._only is not None else [jdir]  # a configured single journal is the configured path
        if sub is not None:
            paths.append(posixpath.join(jdir, sub))
        attrs = yield from self._lstats(*paths, *more, before=before)
        for p, a in zip(paths, attrs, strict=False):
            self._is(p, a, stat.S_ISDIR, "a directory")
        return attrs[len(paths) :]

    def _segments(self, journal: str) -> Op[list[SourceSegment]]:
        jdir = self._path(journal, SEGMENT_DIR)
        try:
            yield from self._dirs(journal, SEGMENT_DIR)
        except FileNotFoundError:
            raise SourceError(f"{self.label}:{jdir} does not exist") from None
        entries = yield from self._list_dir(jdir)
        return valid_segments(self._segment_files(entries, jdir), jdir)

    def _list_dir(self, path: str, defer_close: bool = False) -> Op[list[tuple[str, paramiko.SFTPAttributes]]]:
        """(name, lstat attributes) of every entry of the directory `path` but . and .. (paramiko's listdir_attr).
        With `defer_close`, its handle is closed with the next call's requests, not in a round trip of its own."""
        from paramiko.sftp import CMD_HANDLE, CMD_OPENDIR

        (reply,) = yield [(CMD_OPENDIR, path.encode())]
        handle = expect(reply, CMD_HANDLE).get_binary()
        if not defer_close:
            entries = yield from self._closing(handle, self._read_entries(handle, path))
        else:
            try:
                entries = yield from self._read_entries(handle, path)
            finally:
                self._handles.close_later(handle)
        return [(name, attrs) for name, attrs in entries if name not in (".", "..")]

    def _read_entries(self, handle: bytes, path: str) -> Op[list[tuple[str, paramiko.SFTPAttributes]]]:
        """(name, attributes) of every entry of an open directory; a listing must make progress and end."""
        from paramiko import SFTPAttributes
        from paramiko.sftp import CMD_NAME, CMD_READDIR

        entries: list[tuple[str, paramiko.SFTPAttributes]] = []
        # Several READDIRs at once: the server answers them in turn, each with the entries after the last one's
        # (OpenSSH: up to 100 each), then EOF. A small directory (a jnl/) takes one round trip instead of two, and a
        # root of 1,000 journals two instead of eleven.
        # This relies on the server answering one handle's requests in turn, as OpenSSH's sftp-server does. One that
        # refuses READDIRs read ahead (an error after the first of a batch) is read one READDIR at a time from then.
        ahead = 2
        while True:
            replies = yield [(CMD_READDIR, handle)] * ahead
            for k, reply in enumerate(replies):
                try:
                    msg = expect(reply, CMD_NAME)
                except EOFError:
                    return entries
                except OSError:
                    if k == 0:
                        raise
                    ahead = 1
                    continue
                count = msg.get_int()
                if count == 0 or len(entries) + count > MAX_LISTED:  # no progress, or no end: refuse this server's
                    raise SourceError(f"{self.label}:{path}: a directory listing of {count} more entries after "
                                      f"{len(entries)}; refusing it")  # fmt: skip
                for _ in range(count):
                    filename, _long = msg.get_text(), msg.get_text()
                    entries.append((filename, SFTPAttributes._from_msg(msg, filename)))
            if ahead > 1:
                ahead = READDIRS_AHEAD

    def _segment_files(self, entries: list[tuple[str, paramiko.SFTPAttributes]], jdir: str) -> list[tuple[str, int]]:
        """(name, size) of the segment files among the entries of the jnl/ directory `jdir`."""
        out: list[tuple[str, int]] = []
        for filename, attrs in entries:
            if parse_segment_name(filename) is None:
                continue  # quarantine files, index files, anything else
            mode = attrs.st_mode or 0
            if stat.S_ISDIR(mode):
                continue  # not a segment (as in sej.layout.list_segments)
            if not stat.S_ISREG(mode):
                raise UnsafeFileError(f"{self.label}:{posixpath.join(jdir, filename)}", kind(mode))
            out.append((filename, attrs.st_size or 0))
        return out

    def _remove_stale_temps(self, ofs: str, final: str) -> Op[list[str]]:
        """Remove the commit temp files (TEMP_RE) in `ofs` that are STALE_TEMP_AGE older than `final`, the
        offset file just written: killed commits leave them, and the server's clock is the one to compare
        with. Nothing else is touched; the names removed are returned."""
        from paramiko.sftp import CMD_REMOVE

        entries = yield from self._list_dir(ofs)
        now = next((a.st_mtime for n, a in entries if n == posixpath.basename(final)), None)
        if now is None:
            return []
        stale = [n for n, a in entries if TEMP_RE.match(n) and not stat.S_ISDIR(a.st_mode or 0)
                 and (a.st_mtime or 0) <= now - STALE_TEMP_AGE]  # fmt: skip
        if not stale:
            return []
        replies = yield [(CMD_REMOVE, posixpath.join(ofs, n).encode()) for n in stale]  # a symlink itself, if one
        return [n for n, r in zip(stale, replies, strict=True) if _is_ok(r)]

    def _closing(self, handle: bytes, op: Op[T]) -> Op[T]:
        """Run `op`, then close `handle`, also when `op` fails."""
        from paramiko.sftp import CMD_CLOSE

        try:
            result = yield from op
        except GeneratorExit:
            raise
        except BaseException:
            yield [(CMD_CLOSE, handle)]
            raise
        yield [(CMD_CLOSE, handle)]
        return result

    def _size(self, journal: str, name: str) -> Op[int | None]:
        path = self._segment_path(journal, name)
        (attrs,) = yield from self._lstats(path)
        if attrs is None:
            return None
        self._is(path, attrs, stat.S_ISREG, "a regular file")
        return attrs.st_size or 0

    def _open(self, path: str, flags: int) -> Op[bytes]:
        from paramiko import SFTPAttributes
        from paramiko.sftp import CMD_HANDLE, CMD_OPEN

        (reply,) = yield [(CMD_OPEN, path.encode(), flags, SFTPAttributes())]
        return expect(reply, CMD_HANDLE).get_binary()  # type: ignore[no-any-return]

    def _read_file(self, path: str, pos: int, size: int, lstat: bool = True, keep: tuple[str, str] | None = None
                   ) -> Op[bytes]:  # fmt: skip
        """Bytes [pos, pos + size) of a regular file (fewer at its end); never opens anything else. Without
        `lstat`, the caller has just lstat'ed it (and the fstat after the open still checks what opened).
        With `keep`, the file is kept open for that key (keep_handles), or read through the handle kept."""
        from paramiko.sftp import SFTP_FLAG_READ

        end = pos + size
        if lstat:
            (attrs,) = yield from self._lstats(path)
            self._is(path, attrs, stat.S_ISREG, "a regular file")  # never open a FIFO: it would hang the server
            assert attrs is not None
            end = min(end, attrs.st_size or 0)
        kept = self._handles.get(keep, path) if keep is not None else None
        if kept is not None and end <= pos:
            return b""  # nothing to read (as the open path would say, after its fstat)
        if kept is not None:  # checked a regular file when it was opened: a READ alone
            try:
                data = yield from self._read_open(path, kept, pos, end, fstat=False)
            except OSError:  # the server no longer has it
                data = None
            if data is not None and len(data) == max(0, end - pos):
                return data
            # Shorter than the path's lstat (the probe's, or ours): not the file there now. Open the path.
            assert keep is not None
            self._handles.let_go(keep, kept)
        handle = yield from self._open(path, SFTP_FLAG_READ)
        if keep is None or self._handles.most <= 0:  # closed with its reads: a round trip less
            return (yield from self._read_open(path, handle, pos, end, close=True))
        read = self._read_open(path, handle, pos, end)
        return (yield from self._keeping(keep, path, handle, read))

    def _keeping(self, key: tuple[str, str] | None, path: str, handle: bytes, op: Op[T]) -> Op[T]:
        """Run `op` on the just opened `handle` of `path`, then keep it for `key` (None: close it, as when it is
        not kept or `op` fails)."""
        if key is None:
            return (yield from self._closing(handle, op))
        try:
            result = yield from op
        except BaseException:
            self._handles.close_later(handle)
            raise
        if not self._handles.keep(key, path, handle):
            from paramiko.sftp import CMD_CLOSE

            # This operation's own handle, used by no other: closed now, not with the next call (a call of many
            # operations would hold all of them open until then).
            yield [(CMD_CLOSE, handle)]  # an error here changes nothing
        return result

    def _close_let_go(self) -> Op[None]:
        """Close the handles let go before this call (taken now, when the call is made: one let go by an operation
        of this call may still be read by another of its operations, and is closed with the next call)."""
        return self._close_handles(self._handles.take_closing())

    def _close_handles(self, handles: list[bytes]) -> Op[None]:
        """Close `handles` (their errors ignored: what the server no longer has is closed)."""
        from paramiko.sftp import CMD_CLOSE

        if handles:
            yield [(CMD_CLOSE, h) for h in handles]

    def _handle_limit(self) -> Op[int | None]:
        """The most handles the server allows open (OpenSSH's limits@openssh.com), None if it does not say."""
        from paramiko.sftp import CMD_EXTENDED, CMD_EXTENDED_REPLY

        (reply,) = yield [(CMD_EXTENDED, b"limits@openssh.com")]
        try:
            msg = expect(reply, CMD_EXTENDED_REPLY)
            for _ in range(3):  # packet, read and write lengths
                msg.get_int64()
            limit = msg.get_int64()
        except (OSError, EOFError):  # not an OpenSSH server, or an old one
            return None
        return limit if limit > 0 else None

    def _read_open(self, path: str, handle: bytes, pos: int, end: int, head: int = 0, fstat: bool = True,
                   close: bool = False) -> Op[bytes]:  # fmt: skip
        """Bytes [pos, end) of an open file, checked to be a regular file (fstat) with the same reads
        (unless `fstat` is False: a kept handle); with `head`, after the file's first `head` bytes (read in
        the same round). With `close`, the handle is closed in the same round, after the reads (the server
        answers one handle's requests in turn), whatever they answer: the caller must not close it again."""
        from paramiko import SFTPAttributes
        from paramiko.sftp import CMD_ATTRS, CMD_CLOSE, CMD_DATA, CMD_FSTAT, CMD_READ, int64

        # fstat and the reads go together; OpenSSH serves a read of up to 256 KiB less a header.
        ranges = [(p, min(READ_RANGE, end - p)) for p in range(pos, end, READ_RANGE)]
        first = [(CMD_READ, handle, int64(0), head)] if head else []
        check = [(CMD_FSTAT, handle)] if fstat else []
        last = [(CMD_CLOSE, handle)] if close else []
        replies = yield [*check, *first, *((CMD_READ, handle, int64(p), n) for p, n in ranges), *last]
        if close:
            replies = replies[:-1]  # an error closing changes nothing: what was read was read
        if fstat:
            opened = SFTPAttributes._from_msg(expect(replies[0], CMD_ATTRS))
            if not stat.S_ISREG(opened.st_mode or 0):
                raise UnsafeFileError(f"{self.label}:{path}", kind(opened.st_mode or 0))
            replies = replies[1:]
        chunks = []
        if head:
            try:
                chunks.append(expect(replies[0], CMD_DATA).get_string()[:head])
            except EOFError:  # an empty file
                pass
            replies = replies[1:]
        for (p, n), reply in zip(ranges, replies, strict=True):
            try:
                data = expect(reply, CMD_DATA).get_string()
            except EOFError:  # the file shrank under us
                break
            if len(data) > n:  # never more than asked: bytes out of place
                raise SFTPStreamError(f"{self.label}:{path}: a read of {n} bytes at {p} answered with {len(data)}")
            chunks.append(data)
            if len(data) < n:
                break  # a short read: what follows is not contiguous
        return b"".join(chunks)

    def _read(self, journal: str, name: str, pos: int, size: int) -> Op[bytes]:
        return self._read_file(self._segment_path(journal, name), pos, size, keep=(journal, SEGMENT_DIR))

    def _read_seen(self, journal: str, name: str, pos: int, size: int) -> Op[bytes]:
        # The lstat that found it a regular file was the pass's probe or listing (a FIFO put there since
        # blocks the open, as it would after an lstat of our own, until the I/O timeout).
        return self._read_file(self._segment_path(journal, name), pos, size, lstat=False, keep=(journal, SEGMENT_DIR))

    def _read_offset(self, journal: str, reader: str) -> Op[int | None]:
        path = self._path(journal, OFFSET_DIR, offset_file_name(reader))
        try:
            yield from self._dirs(journal, OFFSET_DIR)
            raw = yield from self._read_file(path, 0, 9)
        except FileNotFoundError:
            return None
        try:
            return parse_offset(raw, f"{self.label}:{path}")
        except CorruptionError:
            return None  # a malformed file is replaced by the next commit (as in LocalSource)

    def _commit_offset(self, journal: str, reader: str, value: int, sweep: bool = True) -> Op[None]:
        if not sweep:
            return (yield from self._write_offset(journal, reader, value))
        # The sweep goes side by side with the commit, not after it: three round trips less. It compares the temp
        # files with the offset file as its listing finds it (this commit's or the one before): no newer than now.
        ofs = self._path(journal, OFFSET_DIR)
        final = posixpath.join(ofs, offset_file_name(reader))
        wrote, _ = yield from together(self._write_offset(journal, reader, value), self._sweep(journal, ofs, final))
        if isinstance(wrote, BaseException):
            raise wrote
        return None

    def _write_offset(self, journal: str, reader: str, value: int) -> Op[None]:
        """Write the reader's offset file: in place through the handle kept from the last commit, else a temp file
        renamed over it."""
        from paramiko import SFTPAttributes
        from paramiko.sftp import (
            CMD_CLOSE,
            CMD_EXTENDED,
            CMD_MKDIR,
            CMD_REMOVE,
            CMD_WRITE,
            SFTP_FLAG_CREATE,
            SFTP_FLAG_EXCL,
            SFTP_FLAG_WRITE,
            int64,
        )

        ofs = self._path(journal, OFFSET_DIR)
        final = posixpath.join(ofs, offset_file_name(reader))
        key = (journal, f"{OFFSET_DIR}/{reader}")
        kept = self._handles.get(key, final) if self._handles.most > 0 else None
        if kept is not None:
            # The file this channel created (exclusively, below) and renamed into place: its 8 bytes overwritten in
            # place, as a local commit does (sej.offset). One round trip, 2 requests instead of 8 and 4.
            write, _fsync = yield [
                (CMD_WRITE, kept, int64(0), encode_offset(value)),
                (CMD_EXTENDED, "fsync@openssh.com", kept),  # an error: the server lacks it
            ]
            try:
                expect_ok(write)
            except (OSError, EOFError):  # the server no longer has it: replaced below
                self._handles.let_go(key, kept)
            else:
                return
        tmp = temp_name(final)
        try:
            (there,) = yield from self._dirs(journal, OFFSET_DIR, final)
        except FileNotFoundError:  # no ofs/ yet (or no journal: the check after the MKDIR says so)
            # The journal's directory has just been lstat'ed a directory (a symlink raised UnsafeFileError): the MKDIR
            # goes with the lstats that check what it made, in one round trip. An error: it exists now, or no journal.
            mkdir = ((CMD_MKDIR, ofs.encode(), SFTPAttributes()),)
            (there,) = yield from self._dirs(journal, OFFSET_DIR, final, before=mkdir)
        if there is not None:
            self._is(final, there, stat.S_ISREG, "a regular file")  # a symlink or FIFO there is not replaced
        # O_CREAT|O_EXCL: never through a symlink.
        handle = yield from self._open(tmp, SFTP_FLAG_WRITE | SFTP_FLAG_CREATE | SFTP_FLAG_EXCL)
        keep = key in self._handles or self._handles.room()  # kept for the next commits (above) if there is room
        try:
            write, _fsync, *closed = yield [
                (CMD_WRITE, handle, int64(0), encode_offset(value)),
                (CMD_EXTENDED, "fsync@openssh.com", handle),  # an error: the server lacks it
                *([] if keep else [(CMD_CLOSE, handle)]),
            ]
            expect_ok(write)
            for close in closed:
                expect_ok(close)
            (renamed,) = yield [(CMD_EXTENDED, "posix-rename@openssh.com", tmp.encode(), final.encode())]
            expect_ok(renamed)
        except GeneratorExit:
            raise
        except BaseException:
            if keep:
                self._handles.close_later(handle)  # closed with the next requests
            yield [(CMD_REMOVE, tmp.encode())]  # our own temp file; an error here changes nothing
            raise
        if keep and not self._handles.keep(key, final, handle):
            yield [(CMD_CLOSE, handle)]  # no room left meanwhile; an error here changes nothing

    def _sweep(self, journal: str, ofs: str, final: str) -> Op[None]:
        """Remove the temp files killed commits left in `ofs` (best effort: the commit is done)."""
        try:
            removed = yield from self._remove_stale_temps(ofs, final)
            if removed:
                log.info("%s: removed %d stale commit temp files", self.describe(journal), len(removed))
        except GeneratorExit:
            raise
        except (SejError, OSError, EOFError) as e:  # the commit is done; cleaning up is best effort
            log.debug("%s: cannot remove stale temp files: %s", self.describe(journal), e)

    def describe(self, journal: str, name: str = "") -> str:
        path = posixpath.join(self.root, journal, SEGMENT_DIR, name) if name else posixpath.join(self.root, journal)
        return f"{self.label}:{path}"

    def sums_mark(self, journal: str, name: str) -> SumsMark | None:
        return None  # what a pass remembers of checksum files is in its CopyState (Prefetched says it)

    def close(self) -> None:
        try:
            self.sftp.close()
        except self._errors as e:  # the connection is already gone: nothing left to close
            log.debug("%s: closing the SFTP channel: %s", self.label, e)


def _as_source_error(result: Any, label: str, root: str) -> Any:
    """A result of `many` as the single call returns it: a transport or server error becomes a SourceError."""
    if isinstance(result, OSError | EOFError):
        return SourceError(f"{label}:{root}: {result}")
    return result
