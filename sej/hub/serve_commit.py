"""`sej serve`'s commits of the hub's offsets in batches: a pass's thousand commits cost a few syncs, not 2,000 fsyncs.

Each commit is still the atomic replacement sej.offset makes (a temp file beside `ofs/<reader>.ofs`, created
exclusively and never through a link, renamed over it), only its syncs are shared by the batch:

1. every commit's temp file is written (8 bytes);
2. one syncfs of the file system makes all of them durable (where syncfs reports write-back errors; elsewhere an
   fsync of each temp file);
3. each temp file is renamed over its offset file;
4. one more syncfs makes the renames durable (elsewhere: an fsync of each `ofs/` directory, once each).

A rename comes only after its temp file's bytes are on disk, so an offset file is always a whole old or a whole new
offset, after a crash too, never a torn one. A commit is answered only after step 4. A process killed between the
steps leaves temp files, which the sweep of stale ones removes (sej.offset.STALE_TEMP_AGE); a crash before step 4
can lose a rename, i.e. bring an offset back to its older value: the producer then keeps more, never less.
"""

from __future__ import annotations

import logging
import os
import stat
from collections.abc import Callable
from concurrent.futures import Executor
from contextlib import AbstractContextManager
from dataclasses import dataclass

from ..errors import UnsafeFileError
from ..fsutil import create_exclusive, kind, open_dir, sync_file_system, syncfs_reports_errors, temp_name
from ..layout import OFFSET_DIR, offset_file_name
from ..offset import encode_offset, remove_stale_temps

log = logging.getLogger("sej.hub.serve")

BATCH_FROM = 16
"""Commits in a run from which they are made durable together (two syncfs); fewer are each sej.offset's own."""

CHUNK = 256
"""Commits prepared at once at most: each holds two descriptors (its temp file and its `ofs/`) until its batch ends."""


@dataclass
class _Commit:
    journal: str
    name: str  # <reader>.ofs
    value: int
    sweep: bool
    ofs: int = -1  # the journal's ofs/ directory, open
    tmp: str = ""
    fd: int = -1  # the temp file, open (written)
    error: BaseException | None = None


def commit_batch(
    commits: list[tuple[str, str, int, bool]],
    open_journal: Callable[[str], AbstractContextManager[int]],
    show: str,
    pool: Executor,
) -> list[BaseException | None]:
    """Commit each (journal, reader, value, sweep) of distinct journals as above; for each, None or what it raised.

    `open_journal(journal)` gives a descriptor of the journal's directory (LocalSource's: validated, no link
    followed); `show` names the root in errors and logs. Steps 1 and 3 run on `pool`'s threads: a rename over an
    existing file waits on the disk (2-3 ms each on ext4 here, one after the other; 8 threads took 1/40 of that).
    """
    out: list[BaseException | None] = []
    for start in range(0, len(commits), CHUNK):
        out += _chunk([_Commit(j, offset_file_name(r), v, s) for j, r, v, s in commits[start : start + CHUNK]],
                      open_journal, show, pool)  # fmt: skip
    return out


def _chunk(batch: list[_Commit], open_journal: Callable[[str], AbstractContextManager[int]], show: str,
           pool: Executor) -> list[BaseException | None]:  # fmt: skip
    try:

        def write(c: _Commit) -> None:
            try:
                _write(c, open_journal, show)
            except Exception as e:  # this commit fails; the others go on
                c.error = e

        list(pool.map(write, batch))
        live = _synced([c for c in batch if c.error is None], files=True)
        list(pool.map(_rename, live))
        _synced([c for c in live if c.error is None], files=False)
        for c in batch:
            if c.error is None and c.sweep:  # of commits that were killed; best effort, as over SFTP
                try:
                    remove_stale_temps(c.ofs)
                except OSError as e:
                    log.debug("%s/%s/%s: cannot remove stale temp files: %s", show, c.journal, OFFSET_DIR, e)
        return [c.error for c in batch]
    finally:
        for c in batch:
            _close(c)


def _rename(c: _Commit) -> None:
    """Step 3 for one commit."""
    try:
        os.replace(c.tmp, c.name, src_dir_fd=c.ofs, dst_dir_fd=c.ofs)
        c.tmp = ""
    except OSError as e:
        c.error = e


def _write(c: _Commit, open_journal: Callable[[str], AbstractContextManager[int]], show: str) -> None:
    """Step 1 for one commit: its ofs/ opened (made if missing), its temp file written, both left open."""
    where = os.path.join(show, c.journal, OFFSET_DIR)
    with open_journal(c.journal) as jfd:
        try:
            c.ofs = open_dir(OFFSET_DIR, dir_fd=jfd, show=where)
        except FileNotFoundError:  # the first commit: made (its entry is made durable by step 4's syncfs, or below)
            try:
                os.mkdir(OFFSET_DIR, 0o755, dir_fd=jfd)
            except FileExistsError:
                pass
            c.ofs = open_dir(OFFSET_DIR, dir_fd=jfd, show=where)
            if not syncfs_reports_errors(c.ofs):
                os.fsync(jfd)
    try:
        st = os.stat(c.name, dir_fd=c.ofs, follow_symlinks=False)
    except FileNotFoundError:
        pass
    else:
        if not stat.S_ISREG(st.st_mode):  # a link or a FIFO where the offset file should be: left alone
            raise UnsafeFileError(os.path.join(where, c.name), kind(st.st_mode))
    c.tmp = temp_name(c.name)
    c.fd = create_exclusive(c.tmp, dir_fd=c.ofs)
    data = encode_offset(c.value)
    if os.write(c.fd, data) != len(data):  # 8 bytes to a new regular file: one write
        raise OSError(f"{where}/{c.tmp}: short write")


def _sync(live: list[_Commit], files: bool) -> None:
    """Steps 2 (`files`: the temp files) and 4 (the directories): one syncfs per file system where syncfs reports
    write-back errors, else an fsync of each temp file (each `ofs/` directory, once)."""
    by_device: dict[int, list[_Commit]] = {}
    for c in live:
        by_device.setdefault(os.fstat(c.ofs).st_dev, []).append(c)
    for commits in by_device.values():
        if syncfs_reports_errors(commits[0].ofs):
            sync_file_system(commits[0].ofs)
            continue
        done: set[int] = set()
        for c in commits:
            fd = c.fd if files else c.ofs
            ino = os.fstat(fd).st_ino
            if ino not in done:
                done.add(ino)
                os.fsync(fd)


def _synced(live: list[_Commit], files: bool) -> list[_Commit]:
    """_sync: the commits made durable, or none (each failed with the error)."""
    try:
        _sync(live, files)
    except OSError as e:
        for c in live:
            c.error = e
        return []
    return live


def _close(c: _Commit) -> None:
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


__all__ = ["BATCH_FROM", "commit_batch"]
