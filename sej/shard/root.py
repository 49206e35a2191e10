"""Reading a sharded root: its shards, shards that appear later, and a merged scan by time."""

from __future__ import annotations

import heapq
import os
import stat
from collections.abc import Iterable, Iterator, Sequence
from typing import NamedTuple

from ..errors import InvalidArgumentError
from ..frames import NO_TIMESTAMP, Message, ShardMessage
from ..layout import journal_path, segment_dir
from ..scanner import Scanner
from ..watch import Subscription, Wakeup
from .name import ShardName, check_prefix, parse_shard


class Shard(NamedTuple):
    """A shard of a sharded root: its parsed name and its journal directory."""

    name: ShardName
    path: str


class Journal(NamedTuple):
    """A journal found under a root: its name relative to the root ("" for the root itself) and path."""

    name: str
    path: str


def is_journal(path: str) -> bool:
    """Whether `path` is a journal directory: it has a jnl/ directory (a real one, not a link)."""
    try:
        return stat.S_ISDIR(os.lstat(segment_dir(path)).st_mode)
    except OSError:
        return False


def list_shards(root: str | os.PathLike[str], prefix: str | None = None) -> list[Shard]:
    """The shard directories directly under `root` (optionally of one prefix), in name order.

    Entries whose names are not shard names, and files, are ignored.
    """
    path = journal_path(root)
    if prefix is not None:
        check_prefix(prefix)
    if not os.path.isdir(path):
        raise InvalidArgumentError(f"sharded root {path} is not a directory")
    found = []
    with os.scandir(path) as entries:
        for entry in entries:
            if not entry.is_dir():
                continue
            try:
                name = parse_shard(entry.name)
            except InvalidArgumentError:
                continue
            if prefix is None or name.prefix == prefix:
                found.append(Shard(name, entry.path))
    found.sort()
    return found


def find_journals(path: str | os.PathLike[str]) -> list[Journal]:
    """The journals at `path`: the path itself if it is a journal, else every journal directly under it.

    Covers a plain journal, a sharded root and a hub root (`<client-id>.<shard>` directories). Links
    under `path` (to a journal, or a jnl/ that is one) are not journals: they are never followed.
    """
    p = journal_path(path)
    if not os.path.isdir(p):
        raise InvalidArgumentError(f"{p} is not a directory")
    if is_journal(p):
        return [Journal("", p)]
    found = []
    with os.scandir(p) as entries:
        for entry in entries:
            if entry.is_dir(follow_symlinks=False) and is_journal(entry.path):  # links are never followed
                found.append(Journal(entry.name, entry.path))
    found.sort()
    return found


class ShardWatch:
    """Notices shards that appear under a root after it was first listed.

    `new()` returns the shards not returned before. It lists the root again only
    after a directory event (watchdog), so calling it often is cheap.
    """

    def __init__(self, root: str | os.PathLike[str], prefix: str | None = None) -> None:
        self.root = journal_path(root)
        self.prefix = prefix
        self._seen: set[str] = set()
        self._wakeup = Wakeup()
        self._sub: Subscription | None = Subscription(self.root, self._wakeup)

    def new(self) -> list[Shard]:
        """Shards that appeared since the last call (all of them on the first call)."""
        if not self._wakeup.created:
            return []
        self._wakeup.created = False
        fresh = [s for s in list_shards(self.root, self.prefix) if s.path not in self._seen]
        self._seen.update(s.path for s in fresh)
        return fresh

    def wait(self, timeout: float | None) -> bool:
        """Wait for a change under the root; True if one came within `timeout` seconds."""
        got = self._wakeup.event.wait(timeout)
        self._wakeup.event.clear()
        return got

    def close(self) -> None:
        if self._sub is not None:
            self._sub.close()
            self._sub = None

    def __enter__(self) -> ShardWatch:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def merge_by_time(streams: Sequence[Iterable[Message]]) -> Iterator[tuple[int, Message]]:
    """(stream number, message) of every stream, merged by timestamp (no timestamp sorts as the oldest).

    Each stream is taken in its own order; ties keep stream order, then offsets.
    """

    def keyed(i: int, msgs: Iterable[Message]) -> Iterator[tuple[int, int, int, Message]]:
        for m in msgs:
            yield (NO_TIMESTAMP if m.timestamp is None else m.timestamp, i, m.offset, m)

    for _ts, i, _off, m in heapq.merge(*(keyed(i, s) for i, s in enumerate(streams))):
        yield i, m


def merged_scan(
    path: str | os.PathLike[str],
    start: dict[str, int] | None = None,
) -> Iterator[ShardMessage]:
    """Every message of every journal at `path`, merged in timestamp order (for tools).

    Reads what is there now (it does not wait for more). Each journal is read in
    offset order and the journals are merged by timestamp, so the output is in
    timestamp order when each journal's timestamps are (as the writer's own clock
    makes them); messages without a timestamp sort as the oldest. `start` maps a
    journal name to the offset to start it from (default: its first message).
    """
    journals = find_journals(path)
    scanners = []
    try:
        for j in journals:
            off = (start or {}).get(j.name)
            scanners.append(Scanner(j.path, "first" if off is None else off, timeout=0, _journal=j.name))

        for _, m in merge_by_time(scanners):
            yield m  # type: ignore[misc]  # a ShardMessage: its scanner names its journal
    finally:
        for s in scanners:
            s.close()
