"""Where the hub copies from: a producer's journals, on this machine or over SFTP.

A source root is a sharded root (journal directories under it) or a single
journal. Every name read from it is validated (sej.hub.names) before use.
"""

from __future__ import annotations

import logging
import os
import posixpath
import stat
import struct
from typing import NamedTuple, Protocol

import paramiko

from ..errors import InvalidArgumentError, SejError
from ..layout import check_reader_name, segment_name
from ..offset import read_offset_file, write_offset_file
from .names import check_journal_name, check_segment_name

log = logging.getLogger("sej.hub")

U64 = struct.Struct(">Q")


_TRANSPORT_ERRORS = (OSError, EOFError, paramiko.SSHException)
"""What a read from a producer can fail with (a cut connection raises EOFError or SSHException)."""


READ_RANGE = 255 << 10
"""Bytes per SFTP read request and readv range (OpenSSH's sftp-server serves at most 256 KiB less a header)."""


class SourceSegment(NamedTuple):
    first_offset: int
    name: str
    size: int


class SourceError(SejError):
    """The source could not be read (a missing journal, a transport failure)."""


class Source(Protocol):
    """What the copier needs from a producer's side."""

    def journals(self) -> list[str]: ...

    def segments(self, journal: str) -> list[SourceSegment]: ...

    def read(self, journal: str, name: str, pos: int, size: int) -> bytes: ...

    def read_offset(self, journal: str, reader: str) -> int | None: ...

    def commit_offset(self, journal: str, reader: str, value: int) -> None: ...

    def describe(self, journal: str, name: str = "") -> str: ...

    def close(self) -> None: ...


def _valid_journals(names: list[str], where: str) -> list[str]:
    out = []
    for name in names:
        try:
            out.append(check_journal_name(name))
        except InvalidArgumentError:
            log.debug("%s: skipping %r: not a journal name", where, name)
    return sorted(out)


def _valid_segments(entries: list[tuple[str, int]], where: str) -> list[SourceSegment]:
    out = []
    for name, size in entries:
        try:
            first = check_segment_name(name)
        except InvalidArgumentError:
            continue  # quarantine files, index files, anything else
        out.append(SourceSegment(first, segment_name(first), size))
    return sorted(out)


class LocalSource:
    """Journals on this machine. `root` is a sharded root, or one journal (named by its directory)."""

    def __init__(self, root: str) -> None:
        root = os.path.abspath(root)
        if not os.path.isdir(root):
            raise InvalidArgumentError(f"source {root} is not a directory")
        is_journal = os.path.isdir(os.path.join(root, "jnl"))
        self.root = os.path.dirname(root) if is_journal else root
        self._only: list[str] | None = [check_journal_name(os.path.basename(root))] if is_journal else None

    def journals(self) -> list[str]:
        if self._only is not None:
            return list(self._only)
        names = [e.name for e in os.scandir(self.root) if e.is_dir() and os.path.isdir(os.path.join(e.path, "jnl"))]
        return _valid_journals(names, self.root)

    def segments(self, journal: str) -> list[SourceSegment]:
        jdir = os.path.join(self.root, check_journal_name(journal), "jnl")
        try:
            entries = [(e.name, e.stat().st_size) for e in os.scandir(jdir) if e.is_file()]
        except FileNotFoundError:
            raise SourceError(f"{jdir} does not exist") from None
        return _valid_segments(entries, jdir)

    def read(self, journal: str, name: str, pos: int, size: int) -> bytes:
        path = os.path.join(self.root, check_journal_name(journal), "jnl", segment_name(check_segment_name(name)))
        with open(path, "rb") as f:
            return os.pread(f.fileno(), size, pos)

    def read_offset(self, journal: str, reader: str) -> int | None:
        path = os.path.join(self.root, check_journal_name(journal), "ofs", check_reader_name(reader) + ".ofs")
        try:
            return read_offset_file(path)
        except SejError:
            return None  # a malformed file is replaced by the next commit

    def commit_offset(self, journal: str, reader: str, value: int) -> None:
        ofs = os.path.join(self.root, check_journal_name(journal), "ofs")
        os.makedirs(ofs, exist_ok=True)
        write_offset_file(os.path.join(ofs, check_reader_name(reader) + ".ofs"), value)

    def describe(self, journal: str, name: str = "") -> str:
        return os.path.join(self.root, journal, "jnl", name) if name else os.path.join(self.root, journal)

    def close(self) -> None:
        pass


class SftpSource:
    """Journals on a producer, read over SFTP (no remote shell, no agent)."""

    def __init__(self, sftp: paramiko.SFTPClient, root: str, label: str) -> None:
        self.sftp = sftp
        self.label = label  # user@host:port, for messages
        root = posixpath.normpath(root)
        try:
            is_journal = stat.S_ISDIR(sftp.stat(posixpath.join(root, "jnl")).st_mode or 0)
        except FileNotFoundError:
            is_journal = False
        except _TRANSPORT_ERRORS as e:
            raise SourceError(f"{label}:{root}: {e}") from None
        self.root = posixpath.dirname(root) if is_journal else root
        self._only: list[str] | None = [check_journal_name(posixpath.basename(root))] if is_journal else None

    def journals(self) -> list[str]:
        if self._only is not None:
            return list(self._only)
        try:
            entries = self.sftp.listdir_attr(self.root)
        except _TRANSPORT_ERRORS as e:
            raise SourceError(f"{self.label}:{self.root}: {e}") from None
        names = []
        for entry in entries:
            if stat.S_ISDIR(entry.st_mode or 0):
                try:
                    name = check_journal_name(entry.filename)
                except InvalidArgumentError:
                    continue
                try:
                    if stat.S_ISDIR(self.sftp.stat(posixpath.join(self.root, name, "jnl")).st_mode or 0):
                        names.append(name)
                except FileNotFoundError:
                    continue
                except _TRANSPORT_ERRORS as e:
                    raise SourceError(f"{self.label}:{self.root}/{name}: {e}") from None
        return sorted(names)

    def segments(self, journal: str) -> list[SourceSegment]:
        jdir = posixpath.join(self.root, check_journal_name(journal), "jnl")
        try:
            entries = [
                (e.filename, e.st_size or 0) for e in self.sftp.listdir_attr(jdir) if stat.S_ISREG(e.st_mode or 0)
            ]
        except _TRANSPORT_ERRORS as e:
            raise SourceError(f"{self.label}:{jdir}: {e}") from None
        return _valid_segments(entries, jdir)

    def read(self, journal: str, name: str, pos: int, size: int) -> bytes:
        path = posixpath.join(self.root, check_journal_name(journal), "jnl", segment_name(check_segment_name(name)))
        try:
            with self.sftp.open(path, "rb") as f:
                f.MAX_REQUEST_SIZE = READ_RANGE  # OpenSSH serves reads up to 255 KiB; paramiko asks 32 KiB
                # readv pipelines the SFTP requests. It is asked for many 256 KiB ranges, not one
                # big one: paramiko grows one range's buffer by concatenation, quadratic in its size.
                end = min(pos + size, f.stat().st_size or 0)
                if end <= pos:
                    return b""
                ranges = [(p, min(READ_RANGE, end - p)) for p in range(pos, end, READ_RANGE)]
                return b"".join(f.readv(ranges))
        except _TRANSPORT_ERRORS as e:
            raise SourceError(f"{self.label}:{path}: {e}") from None

    def read_offset(self, journal: str, reader: str) -> int | None:
        path = posixpath.join(self.root, check_journal_name(journal), "ofs", check_reader_name(reader) + ".ofs")
        try:
            with self.sftp.open(path, "rb") as f:
                raw = f.read(9)
        except FileNotFoundError:
            return None
        except _TRANSPORT_ERRORS as e:
            raise SourceError(f"{self.label}:{path}: {e}") from None
        return int(U64.unpack(raw)[0]) if len(raw) == 8 else None

    def commit_offset(self, journal: str, reader: str, value: int) -> None:
        ofs = posixpath.join(self.root, check_journal_name(journal), "ofs")
        final = posixpath.join(ofs, check_reader_name(reader) + ".ofs")
        tmp = f"{final}.hub.tmp"
        try:
            try:
                self.sftp.mkdir(ofs)
            except OSError:
                pass  # it exists (or the rename below says why not)
            with self.sftp.open(tmp, "wb") as f:
                f.write(U64.pack(value))
                f.flush()
                _fsync(self.sftp, f)
            self.sftp.posix_rename(tmp, final)
        except _TRANSPORT_ERRORS as e:
            raise SourceError(f"{self.label}:{final}: {e}") from None

    def describe(self, journal: str, name: str = "") -> str:
        path = posixpath.join(self.root, journal, "jnl", name) if name else posixpath.join(self.root, journal)
        return f"{self.label}:{path}"

    def close(self) -> None:
        try:
            self.sftp.close()
        except _TRANSPORT_ERRORS as e:  # the connection is already gone: nothing left to close
            log.debug("%s: closing the SFTP channel: %s", self.label, e)


def _fsync(sftp: paramiko.SFTPClient, f: paramiko.SFTPFile) -> None:
    """fsync a remote file with OpenSSH's fsync@openssh.com extension, when the server has it."""
    try:
        sftp._request(paramiko.sftp.CMD_EXTENDED, "fsync@openssh.com", f.handle)
    except (OSError, paramiko.SSHException) as e:
        log.debug("fsync@openssh.com not available: %s", e)
