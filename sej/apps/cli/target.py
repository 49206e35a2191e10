"""What a command's path argument stands for: the journals at a directory, or one segment file.

Also small helpers the commands share: whether a writer holds a journal's lock
(read from /proc/locks, without touching the lock), reader offsets, and the
open-file limit for roots with many shards.
"""

from __future__ import annotations

import os
from typing import NamedTuple

from ...errors import CorruptionError, UnsafeFileError
from ...fsutil import allow_open_files
from ...layout import list_readers, parse_segment_name, reader_offset_path, segment_dir, writer_lock_path
from ...offset import read_offset_file
from ...shard import Journal, find_journals
from ..shell import usage


def journals_at(path: str) -> list[Journal]:
    """The journals at `path` (a journal, a sharded root or a hub root); a usage error if there are none."""
    if not os.path.lexists(path):
        raise usage(f"{path} does not exist")
    if not os.path.isdir(path):
        raise usage(f"{path} is not a directory (give a journal directory, one holding jnl/, or a root of journals)")
    journals = find_journals(path)
    if not journals:
        raise usage(f"{path} is not a journal: neither it nor any directory directly under it has a jnl/ directory")
    allow_open_files(len(journals) + 64)  # a scan holds one segment per journal
    return journals


def one_journal(path: str, command: str) -> Journal:
    """The single journal at `path`; a usage error naming `command` when there are several."""
    journals = journals_at(path)
    if len(journals) > 1:
        raise usage(
            f"{command} works on one journal, and {path} holds {len(journals)} "
            f"({', '.join(j.name for j in journals[:3])}{', ...' if len(journals) > 3 else ''}): "
            f"give one of them, e.g. {os.path.join(path, journals[0].name)}"
        )
    return journals[0]


def label(journal: Journal, several: bool) -> str | None:
    """The name that tags a journal's output lines: its name under the root when there are several."""
    return journal.name if several else None


def segment_file(path: str) -> tuple[str, int | None]:
    """A segment file argument and the first offset its name stands for (None if not a segment name)."""
    if not os.path.lexists(path):
        raise usage(f"{path} does not exist")
    if os.path.isdir(path):
        raise usage(f"{path} is a directory, not a segment file (segments are <journal>/jnl/%016x.jnl)")
    if not os.path.isfile(path):
        raise usage(f"{path} is not a regular file, so not a segment file")
    return path, parse_segment_name(os.path.basename(path))


class Reader(NamedTuple):
    """A reader of a journal and its committed offset (None: nothing committed; error: unreadable).

    An offset file that is malformed, or is not a regular file (a symlink, a FIFO: never followed
    or opened), is reported as that reader's error.
    """

    name: str
    committed: int | None
    error: CorruptionError | UnsafeFileError | None


def readers(dir: str) -> list[Reader]:
    """The readers of a journal with their committed offsets, by name."""
    out = []
    for name in list_readers(dir):
        try:
            out.append(Reader(name, read_offset_file(reader_offset_path(dir, name)), None))
        except (CorruptionError, UnsafeFileError) as e:
            out.append(Reader(name, None, e))
    return out


def writer_running(dir: str) -> bool | None:
    """Whether some process holds one of the journal's writer locks (flock on jnl.lck, or on jnl/ itself, which a
    deleted jnl.lck leaves held), from /proc/locks.

    Reads only; taking the lock to test it could make a writer starting at that
    moment fail. None when it cannot tell (no /proc/locks).
    """
    want = set()
    for path in (writer_lock_path(dir), segment_dir(dir)):
        try:
            st = os.stat(path, follow_symlinks=False)
        except FileNotFoundError:
            continue
        want.add(f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}")
    if not want:
        return False
    try:
        with open("/proc/locks") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    for line in lines:
        fields = line.split()
        if "->" in fields:  # a waiter: "1: -> FLOCK ..."
            continue
        if len(fields) >= 6 and fields[1] == "FLOCK" and fields[5] in want:
            return True
    return False
