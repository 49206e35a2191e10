"""Journals on this machine: LocalSource, opened without following a symlink (sej.fsutil)."""

from __future__ import annotations

import logging
import os
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from ..errors import CorruptionError, InvalidArgumentError, SejError, UnsafeFileError
from ..fsutil import kind, open_dir, open_regular
from ..layout import INDEX_DIR, OFFSET_DIR, SEGMENT_DIR, offset_file_name, parse_segment_name, segment_name, sum_name
from ..offset import read_offset_at, remove_stale_temps, write_offset_at
from .names import check_journal_name, check_segment_name
from .source import MAX_SUMS, Call, SourceError, SourceSegment, sort_out, sums_skip, valid_segments

if TYPE_CHECKING:
    from .copy import SumsMark

log = logging.getLogger("sej.hub")


class LocalSource:
    """Journals on this machine. `root` is a sharded root, or one journal (named by its directory).

    The tree under `root` is the producer's and is not trusted: a journal directory, its
    jnl/ and ofs/ directories and every file in them are opened relative to their parent's
    descriptor without following a symlink (sej.fsutil), a non-regular file is never opened,
    and anything else than what the layout says raises UnsafeFileError naming it. Only `root`
    itself (the hub's configuration) may be reached through a symlink.
    """

    remote = False
    reads_seen = False
    round_trip = 0.0
    defers_commit = False
    broken = False  # nothing to break: a failed call fails alone

    def __init__(self, root: str) -> None:
        root = os.path.abspath(root)
        if not os.path.isdir(root):
            raise InvalidArgumentError(f"source {root} is not a directory")
        is_journal = os.path.lexists(os.path.join(root, SEGMENT_DIR))
        self.root = os.path.dirname(root) if is_journal else root
        self._only: list[str] | None = [check_journal_name(os.path.basename(root))] if is_journal else None
        self._skipped: dict[str, str] = {}

    def journals(self) -> list[str]:
        self._skipped = {}
        if self._only is not None:
            return list(self._only)
        names = []
        with os.scandir(self.root) as entries:
            for e in entries:
                try:
                    mode = e.stat(follow_symlinks=False).st_mode
                except FileNotFoundError:
                    continue
                name, why = sort_out(e.name, mode, lambda n: self._jnl_mode(os.path.join(self.root, n)))
                if name is not None:
                    names.append(name)
                elif why is not None:
                    self._skipped[e.name] = why
        return sorted(names)

    def _jnl_mode(self, path: str) -> int | None:
        try:
            return os.stat(os.path.join(path, SEGMENT_DIR), follow_symlinks=False).st_mode
        except FileNotFoundError:
            return None

    def skipped(self) -> dict[str, str]:
        """Directories the last `journals()` found under the root that are not journals, and why."""
        return dict(self._skipped)

    @contextmanager
    def _dir(self, journal: str, sub: str | None = None) -> Iterator[int]:
        """A descriptor of the journal's directory, or of its `sub` directory (jnl, ofs); no symlinks."""
        name = check_journal_name(journal)
        if self._only is not None:
            if name != self._only[0]:
                raise SourceError(f"{self.root}: no journal {name} (this source is the journal {self._only[0]})")
            fd = open_dir(os.path.join(self.root, name), follow=True)  # the configured path itself
        else:
            top = open_dir(self.root, follow=True)
            try:
                fd = open_dir(name, dir_fd=top, show=os.path.join(self.root, name))
            finally:
                os.close(top)
        try:
            if sub is not None:
                parent, fd = fd, -1
                try:
                    fd = open_dir(sub, dir_fd=parent, show=os.path.join(self.root, name, sub))
                finally:
                    os.close(parent)
            yield fd
        finally:
            if fd >= 0:
                os.close(fd)

    def segments(self, journal: str) -> list[SourceSegment]:
        jdir = os.path.join(self.root, check_journal_name(journal), SEGMENT_DIR)
        entries = []
        try:
            with self._dir(journal, SEGMENT_DIR) as fd, os.scandir(fd) as it:
                for e in it:
                    if parse_segment_name(e.name) is None:
                        continue  # quarantine files, index files, anything else
                    try:
                        st = e.stat(follow_symlinks=False)
                    except FileNotFoundError:
                        continue  # deleted meanwhile (the producer's retention)
                    if stat.S_ISDIR(st.st_mode):
                        continue  # not a segment (as in sej.layout.list_segments)
                    if not stat.S_ISREG(st.st_mode):
                        raise UnsafeFileError(os.path.join(jdir, e.name), kind(st.st_mode))
                    entries.append((e.name, st.st_size))
        except FileNotFoundError:
            raise SourceError(f"{jdir} does not exist") from None
        return valid_segments(entries, jdir)

    def read(self, journal: str, name: str, pos: int, size: int) -> bytes:
        seg = segment_name(check_segment_name(name))
        with self._dir(journal, SEGMENT_DIR) as d:
            fd = open_regular(seg, dir_fd=d, show=os.path.join(self.root, journal, SEGMENT_DIR, seg))
        try:
            return os.pread(fd, size, pos)
        finally:
            os.close(fd)

    def read_sums(self, journal: str, name: str, skip: int = 0) -> bytes | None:
        sums = sum_name(check_segment_name(name))
        try:
            with self._dir(journal, INDEX_DIR) as d:
                fd = open_regular(sums, dir_fd=d, show=os.path.join(self.root, journal, INDEX_DIR, sums))
        except FileNotFoundError:
            return None
        try:
            head, got = sums_skip(skip)
            parts = [os.pread(fd, head, 0)] if head else []
            while got < MAX_SUMS:
                part = os.pread(fd, min(1 << 20, MAX_SUMS - got), got)
                if not part:
                    break
                parts.append(part)
                got += len(part)
            return b"".join(parts)
        finally:
            os.close(fd)

    def size(self, journal: str, name: str) -> int | None:
        seg = segment_name(check_segment_name(name))
        with self._dir(journal, SEGMENT_DIR) as d:
            try:
                st = os.stat(seg, dir_fd=d, follow_symlinks=False)
            except FileNotFoundError:
                return None
        if not stat.S_ISREG(st.st_mode):
            raise UnsafeFileError(os.path.join(self.root, journal, SEGMENT_DIR, seg), kind(st.st_mode))
        return st.st_size

    def many(self, calls: list[Call]) -> list[Any]:
        out: list[Any] = []
        for name, *args in calls:
            try:
                out.append(getattr(self, name)(*args))
            except (SejError, OSError) as e:
                out.append(e)
        return out

    def read_offset(self, journal: str, reader: str) -> int | None:
        name = offset_file_name(reader)
        try:
            with self._dir(journal, OFFSET_DIR) as d:
                return read_offset_at(name, dir_fd=d, show=os.path.join(self.root, journal, OFFSET_DIR, name))
        except FileNotFoundError:
            return None  # no ofs/ yet
        except CorruptionError:
            return None  # a malformed file is replaced by the next commit

    def commit_offset(self, journal: str, reader: str, value: int, sweep: bool = True) -> None:
        name = offset_file_name(reader)
        with self._dir(journal) as jfd:
            try:
                os.mkdir(OFFSET_DIR, 0o755, dir_fd=jfd)
            except FileExistsError:
                pass
            where = os.path.join(self.root, journal, OFFSET_DIR)
            ofs = open_dir(OFFSET_DIR, dir_fd=jfd, show=where)
            try:
                write_offset_at(name, value, dir_fd=ofs, show=os.path.join(where, name))
                if sweep:  # of commits that were killed (see sej.offset.STALE_TEMP_AGE); best effort, as over SFTP
                    try:
                        remove_stale_temps(ofs)
                    except OSError as e:
                        log.debug("%s: cannot remove stale temp files: %s", where, e)
            finally:
                os.close(ofs)

    def describe(self, journal: str, name: str = "") -> str:
        return os.path.join(self.root, journal, SEGMENT_DIR, name) if name else os.path.join(self.root, journal)

    def sums_mark(self, journal: str, name: str) -> SumsMark | None:
        return None

    def keep_handles(self, most: int) -> None:
        pass  # every call opens and closes its files: nothing is kept

    def forget(self, journals: set[str] | None = None) -> None:
        pass

    def tidy(self) -> None:
        pass

    def close(self) -> None:
        pass
