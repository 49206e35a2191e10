"""`sej serve`'s commits of the hub's offsets in batches: a pass's thousand commits cost one sync, not 2,000 fsyncs.

A commit overwrites the 8 bytes of an existing `ofs/<reader>.ofs` in place, as sej.offset does (one pwrite of 8
bytes, in one sector: a crash leaves the old value or the new one, never a torn one). The server keeps each file it
overwrote open for the next batch (`Kept`); a kept file is written again only while its name still points to it
(the same st_dev and st_ino, a regular file with one link, 0 or 8 bytes long), so a journal deleted or made again
gets its new file. A file that is missing (the first commit), of another size, or hard-linked is replaced
atomically instead: a temp file beside it, created exclusively and never through a link, renamed over it.

A batch of BATCH_FROM commits or more:

1. every commit's 8 bytes are written (in place, or to its temp file);
2. one syncfs of the file system makes all of them durable (where syncfs reports write-back errors; elsewhere an
   fdatasync of each file written in place, an fsync of each temp file);
3. each temp file is renamed over its offset file;
4. if any was, one more syncfs makes the renames durable (elsewhere: an fsync of each such `ofs/`, once each).

A rename comes only after its temp file's bytes are on disk, so an offset file is always a whole old or a whole new
offset, after a crash too. A commit is answered only after the last step. A process killed between the steps leaves
temp files, which the sweep of stale ones removes (sej.offset.STALE_TEMP_AGE); a crash before the last step can
lose a write or a rename, i.e. bring an offset back to its older value: the producer then keeps more, never less.
Fewer commits are each synced on their own (fdatasync; a replaced file's fsyncs), on the pool's threads.
"""

from __future__ import annotations

import logging
import os
import stat
from collections.abc import Callable
from concurrent.futures import Executor
from contextlib import AbstractContextManager
from dataclasses import dataclass

from ..fsutil import (
    allow_open_files,
    create_exclusive,
    open_dir,
    open_files_limit,
    open_regular,
    sync_file_system,
    syncfs_reports_errors,
    temp_name,
)
from ..layout import OFFSET_DIR, offset_file_name
from ..offset import encode_offset, remove_stale_temps

log = logging.getLogger("sej.hub.serve")

BATCH_FROM = 16
"""Commits in a run from which they are made durable together (one syncfs); fewer are each synced on their own."""

CHUNK = 256
"""Commits prepared at once at most: each holds up to two descriptors (its file and its `ofs/`) until its batch
ends."""

KEPT_FILES = 4096
"""Offset files kept open between batches at most (and at most a quarter of the open-files limit)."""


class Kept:
    """The offset files a session wrote in place, kept open for its next batches: (journal, file name) -> (fd, st_dev,
    st_ino). A kept file is written only while `root/journal/ofs/name` still is that file (`take`)."""

    def __init__(self, root: str) -> None:
        self.root = root
        self._files: dict[tuple[str, str], tuple[int, int, int]] = {}
        allow_open_files(KEPT_FILES + 1024)
        soft = open_files_limit(unknown=1024)
        self.most = KEPT_FILES if soft is None else min(KEPT_FILES, soft // 4)

    def take(self, journal: str, name: str) -> tuple[int, int]:
        """(fd, st_dev) of the kept file of `journal`'s `name`, or (-1, 0) (then it is kept no more): the journal's
        directory and its ofs/ must still be directories, not links (lstat), and the path's lstat the same regular
        file, with one link, 0 or 8 bytes long (a fresh commit opens them the same way: sej.fsutil.open_dir)."""
        got = self._files.get((journal, name))
        if got is None:
            return -1, 0
        fd, dev, ino = got
        jdir = os.path.join(self.root, journal)
        odir = os.path.join(jdir, OFFSET_DIR)
        try:
            if stat.S_ISDIR(os.lstat(jdir).st_mode) and stat.S_ISDIR(os.lstat(odir).st_mode):
                st = os.stat(os.path.join(odir, name), follow_symlinks=False)
            else:
                st = None
        except OSError:
            st = None
        if (st is None or st.st_ino != ino or st.st_dev != dev or not stat.S_ISREG(st.st_mode) or st.st_nlink != 1
                or st.st_size not in (0, 8)):  # fmt: skip
            self.drop(journal, name)
            return -1, 0
        return fd, dev

    def keep(self, journal: str, name: str, fd: int) -> bool:
        """Keep `fd` (an offset file just written in place) if there is room; False: the caller closes it."""
        if len(self._files) >= self.most or (journal, name) in self._files:
            return False
        st = os.fstat(fd)
        self._files[journal, name] = (fd, st.st_dev, st.st_ino)
        return True

    def drop(self, journal: str, name: str) -> None:
        got = self._files.pop((journal, name), None)
        if got is not None:
            os.close(got[0])

    def close(self) -> None:
        files, self._files = self._files, {}
        for fd, _dev, _ino in files.values():
            os.close(fd)


@dataclass
class _Commit:
    journal: str
    name: str  # <reader>.ofs
    value: int
    sweep: bool
    ofs: int = -1  # the journal's ofs/ directory, open (not for a kept file)
    tmp: str = ""  # the temp file's name, when the file is replaced
    fd: int = -1  # the file written: the offset file itself (in place) or its temp file
    dev: int = 0  # st_dev of the file written in place
    kept: bool = False  # `fd` is a Kept one
    placed: bool = False  # `fd`, opened by _write, is the offset file, written in place
    error: BaseException | None = None


def commit_batch(
    commits: list[tuple[str, str, int, bool]],
    open_journal: Callable[[str], AbstractContextManager[int]],
    show: str,
    pool: Executor,
    kept: Kept,
) -> list[BaseException | None]:
    """Commit each (journal, reader, value, sweep) of distinct journals as above; for each, None or what it raised.

    `open_journal(journal)` gives a descriptor of the journal's directory (LocalSource's: validated, no link
    followed); `show` names the root in errors and logs; `kept` the files kept open (its root is the journals').
    Files not kept are opened on `pool`'s threads, and renames run there: a rename over an existing file waits on
    the disk (2-3 ms each on ext4 here, one after the other; 8 threads took 1/40 of that).
    """
    shared = len(commits) >= BATCH_FROM
    out: list[BaseException | None] = []
    for start in range(0, len(commits), CHUNK):
        out += _chunk([_Commit(j, offset_file_name(r), v, s) for j, r, v, s in commits[start : start + CHUNK]],
                      open_journal, show, pool, kept, shared)  # fmt: skip
    return out


def _chunk(batch: list[_Commit], open_journal: Callable[[str], AbstractContextManager[int]], show: str,
           pool: Executor, kept: Kept, shared: bool) -> list[BaseException | None]:  # fmt: skip
    root = -1
    try:
        if shared:  # opened before the writes: its syncfs reports the write-back errors that come after them
            try:
                root = open_dir(kept.root, follow=True)
            except OSError as e:  # the root moved, removed, unreadable, out of descriptors: each commit fails
                return [e for _ in batch]
        data = [encode_offset(c.value) for c in batch]
        rest: list[_Commit] = []
        for c, raw in zip(batch, data, strict=True):
            if not c.sweep:  # the sweep lists ofs/, opened as below
                c.fd, c.dev = kept.take(c.journal, c.name)
            if c.fd < 0:
                rest.append(c)
                continue
            c.kept = True
            try:
                _pwrite(c.fd, raw, show, c)
            except OSError as e:
                c.error = e

        def write(c: _Commit) -> None:
            try:
                _write(c, open_journal, show, shared)
            except Exception as e:  # this commit fails; the others go on
                c.error = e

        list(pool.map(write, rest))
        live = [c for c in batch if c.error is None]
        if shared:
            live = _synced(live, root, files=True)
        else:
            list(pool.map(_sync_one, live))
            live = [c for c in live if c.error is None]
        replaced = [c for c in live if c.tmp]
        if replaced:
            list(pool.map(_rename, replaced))
            if shared:
                _synced([c for c in replaced if c.error is None], root, files=False)
            else:
                list(pool.map(_sync_dir, [c for c in replaced if c.error is None]))
        for c in batch:
            if c.error is None and c.sweep:  # of commits that were killed; best effort, as over SFTP
                try:
                    remove_stale_temps(c.ofs)
                except OSError as e:
                    log.debug("%s/%s/%s: cannot remove stale temp files: %s", show, c.journal, OFFSET_DIR, e)
            if c.placed and c.error is None and kept.keep(c.journal, c.name, c.fd):
                c.fd, c.kept = -1, True
        return [c.error for c in batch]
    finally:
        if root >= 0:
            os.close(root)
        for c in batch:
            _close(c, kept)


def _pwrite(fd: int, raw: bytes, show: str, c: _Commit) -> None:
    if os.pwrite(fd, raw, 0) != len(raw):  # 8 bytes at the start of a regular file: one write
        raise OSError(f"{show}/{c.journal}/{OFFSET_DIR}/{c.name}: short write")


def _rename(c: _Commit) -> None:
    """Step 3 for one commit."""
    try:
        os.replace(c.tmp, c.name, src_dir_fd=c.ofs, dst_dir_fd=c.ofs)
        c.tmp = ""
    except OSError as e:
        c.error = e


def _write(c: _Commit, open_journal: Callable[[str], AbstractContextManager[int]], show: str, shared: bool) -> None:
    """Step 1 for a commit whose file is not kept: its ofs/ opened (made if missing), its offset file overwritten in
    place or its temp file written, both left open."""
    where = os.path.join(show, c.journal, OFFSET_DIR)
    with open_journal(c.journal) as jfd:
        try:
            c.ofs = open_dir(OFFSET_DIR, dir_fd=jfd, show=where)
        except FileNotFoundError:  # the first commit: made, and its entry made durable
            try:
                os.mkdir(OFFSET_DIR, 0o755, dir_fd=jfd)
            except FileExistsError:
                pass
            c.ofs = open_dir(OFFSET_DIR, dir_fd=jfd, show=where)
            if not shared or not syncfs_reports_errors(c.ofs):  # else: by step 4's syncfs (its file is new: replaced)
                os.fsync(jfd)
    try:  # UnsafeFileError for a link or a FIFO where the offset file should be: left alone
        fd = open_regular(c.name, os.O_RDWR | os.O_NONBLOCK, dir_fd=c.ofs, show=os.path.join(where, c.name))
    except FileNotFoundError:
        pass
    else:
        st = os.fstat(fd)
        if st.st_nlink == 1 and st.st_size in (0, 8):
            c.fd, c.dev, c.placed = fd, st.st_dev, True
            _pwrite(fd, encode_offset(c.value), show, c)
            return
        os.close(fd)  # another size, or other names (the others are left alone): replaced
    c.tmp = temp_name(c.name)
    c.fd = create_exclusive(c.tmp, dir_fd=c.ofs)
    data = encode_offset(c.value)
    if os.write(c.fd, data) != len(data):  # 8 bytes to a new regular file: one write
        raise OSError(f"{where}/{c.tmp}: short write")


def _sync_one(c: _Commit) -> None:
    """Step 2 for one commit of a small run: its file's own sync."""
    try:
        if c.tmp:
            os.fsync(c.fd)
        else:
            os.fdatasync(c.fd)
    except OSError as e:
        c.error = e


def _sync_dir(c: _Commit) -> None:
    """Step 4 for one commit of a small run."""
    try:
        os.fsync(c.ofs)
    except OSError as e:
        c.error = e


def _sync(live: list[_Commit], root: int, files: bool) -> None:
    """Steps 2 (`files`: what was written) and 4 (the directories): one syncfs per file system where syncfs reports
    write-back errors (through `root`, opened before the writes, or a commit's `ofs/`, opened before its write), else
    an fdatasync of each file written in place, an fsync of each temp file (each `ofs/` directory, once)."""
    by_device: dict[int, list[_Commit]] = {}
    for c in live:
        by_device.setdefault(c.dev if c.kept else os.fstat(c.ofs).st_dev, []).append(c)
    root_dev = os.fstat(root).st_dev
    for dev, commits in by_device.items():
        sync_fd = root if dev == root_dev else next((c.ofs for c in commits if c.ofs >= 0), -1)
        if sync_fd >= 0 and syncfs_reports_errors(sync_fd):
            sync_file_system(sync_fd)
            continue
        done: set[int] = set()
        for c in commits:
            if files and not c.tmp:
                os.fdatasync(c.fd)
                continue
            fd = c.fd if files else c.ofs
            ino = os.fstat(fd).st_ino
            if ino not in done:
                done.add(ino)
                os.fsync(fd)


def _synced(live: list[_Commit], root: int, files: bool) -> list[_Commit]:
    """_sync: the commits made durable, or none (each failed with the error)."""
    try:
        _sync(live, root, files)
    except OSError as e:
        for c in live:
            c.error = e
        return []
    return live


def _close(c: _Commit, kept: Kept) -> None:
    if c.kept:
        if c.error is not None and c.fd >= 0:  # written through a kept file and failed: opened again next time
            kept.drop(c.journal, c.name)
        c.fd = -1
    if c.fd >= 0:
        os.close(c.fd)
        c.fd = -1
    if c.tmp and c.ofs >= 0:  # not renamed: a failed commit leaves no temp file behind
        try:
            os.unlink(c.tmp, dir_fd=c.ofs)
        except OSError:
            pass
    if c.ofs >= 0:
        os.close(c.ofs)
        c.ofs = -1


__all__ = ["BATCH_FROM", "Kept", "commit_batch"]
