"""Push, not poll: `sej serve` watches its root and tells the hub which journals changed, as they change.

The events are hints only: the hub looks at those journals with its ordinary pass (every read goes
through the server's checks), so a missed or spurious event costs a pass, never a wrong copy. The
watch is the scanner's (sej.watch: inotify through watchdog, links not followed); a quiet producer
sends nothing (SSH's keepalive goes on).
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Iterable, Iterator

from watchdog.events import (
    DirCreatedEvent,
    DirDeletedEvent,
    DirMovedEvent,
    FileCreatedEvent,
    FileDeletedEvent,
    FileModifiedEvent,
    FileMovedEvent,
    FileSystemEvent,
    FileSystemEventHandler,
)

from ..errors import InvalidArgumentError
from ..layout import INDEX_DIR, OFFSET_DIR, RETENTION_LOCK, SEGMENT_DIR, WRITER_LOCK
from ..watch import DirWatch, Subscription
from . import serve_protocol as wire
from .names import check_journal_name

log = logging.getLogger("sej.hub.serve")

MAX_PENDING = 1 << 16
"""Journals named in one push at most; more changed at once are pushed as [] ("anything may have changed")."""


EVENTS = (FileModifiedEvent, FileCreatedEvent, FileDeletedEvent, FileMovedEvent, DirCreatedEvent, DirDeletedEvent,
          DirMovedEvent)  # fmt: skip
"""The kinds of events watched: what writers, sealing and retention do to a journal's files. Not opens and closes
(watchdog's default includes them): the server's own reads for the hub would be events, thousands a pass over many
journals, and the kernel's queue (16,384 by default) overflowed under them, costing a walk of the whole tree."""

IGNORED = (OFFSET_DIR, WRITER_LOCK, RETENTION_LOCK)
"""What changes in a journal's directory without new bytes for the hub: readers' offsets (the hub's own commits
among them: a push for each would be a pass for nothing) and the writer's lock file."""

MAX_WATCHED = 1 << 16
"""Journals watched at most (DirWatch: three directories each); others are seen by the whole state every 15 s."""


class _Changes(FileSystemEventHandler):
    def __init__(self, pusher: Pusher) -> None:
        super().__init__()
        self.pusher = pusher

    def on_any_event(self, event: FileSystemEvent) -> None:
        self.pusher.note(os.fsdecode(event.src_path))


class Pusher:
    """Watches `path` and sends CHANGED frames through `send`, one per burst of events.

    With inotify (sej.watch.DirWatch) only the directories that hold news are watched: the root (journals made,
    moved, removed), each journal's directory (its jnl/ and idx/ made) and its jnl/ and idx/, never its ofs/. A
    recursive watch also had the kernel report every offset commit (the hub's own: a thousand after each pass of
    a thousand journals, five events each for a first commit, and a new ofs/ directory to add a watch for), which
    watchdog's thread turned into events one by one, in the same queue as the appends' and competing for the
    GIL with the listing: an append made while the hub's first commits were made (the initial copy's, 1,000 of
    them) was heard of only once they were all done, 0.25 s later. Elsewhere one recursive watch covers `path`.

    `journal`: the one journal served, when `path` is that journal; else each journal is the first
    component of a changed path below `path` (the root's own changes, a new journal, name none: []).
    With `state` (protocol version 2), each burst is sent as the frames `state(names)` gives instead (the changed
    journals' segments, listed now; None: every journal), starting with every journal once the watch is on; every
    journal's state is listed and sent by a thread of its own, while the bursts go on (`state(None)` then pushes
    again those a burst pushed after the whole state had listed them).
    """

    def __init__(self, path: str, send: Callable[[bytes], None], journal: str | None = None,
                 state: Callable[[list[str] | None], Iterable[bytes]] | None = None) -> None:  # fmt: skip
        self.path, self.send, self.journal, self.state = path, send, journal, state
        self._prefix = path.rstrip(os.sep) + os.sep
        self._cond = threading.Condition()
        self._changed: set[str] = set()
        self._all = False  # something changed that names no journal (or too many did)
        self._closed = False
        # While a whole state is listed (version 2: in a thread of its own, a second or so over thousands of
        # journals), the bursts go on being pushed (`state(None)` pushes again after it those it listed before
        # their push). False: no whole state under way.
        self._whole_busy = False
        self._rescan = False  # the root changed: watch the journals not watched yet, before the whole state
        self._fresh: set[str] = set()  # journals whose directory had an entry made: watch their jnl/ and idx/
        self._inodes: dict[str, int] = {}  # journal -> the inode of the directory watched under its name
        self._thread = threading.Thread(target=self._run, name="sej-serve-push", daemon=True)
        self._thread.start()
        self._dirs: DirWatch | None = None
        self._sub: Subscription | None = None
        if DirWatch.available():
            self._dirs = DirWatch()
            self._watch_root()  # before the whole state is listed: nothing falls between them
        else:
            self._sub = Subscription(path, _Changes(self), recursive=True, event_filter=list(EVENTS))
        if state is not None:
            self.refresh()  # the whole state, listed after the watch began: nothing falls between them

    def refresh(self) -> None:
        """Send every journal's state (version 2) at the next burst, now if there is none under way."""
        with self._cond:
            self._all = True
            self._cond.notify()

    def _watch_root(self) -> None:
        """Watch the root and each journal in it not watched yet (or the one journal served): DirWatch."""
        dirs = self._dirs
        if dirs is None:
            return
        if self.journal is not None:
            self._watch_journal(self.path, self.journal)
            return
        dirs.add(self.path, self._root_changed)
        seen: set[str] = set()
        try:
            with os.scandir(self.path) as entries:
                for _, e in zip(range(MAX_WATCHED), entries):
                    try:
                        name = check_journal_name(e.name)
                        if e.is_dir(follow_symlinks=False):
                            self._watch_journal(e.path, name, e.inode())
                            seen.add(name)
                    except (InvalidArgumentError, OSError):
                        continue  # not a journal (the listing says so), or gone meanwhile
        except OSError as e:  # the whole state lists it and says why
            log.debug("sej serve %s: cannot watch its journals: %s", self.path, e)
            return
        for name in set(self._inodes) - seen:  # gone: removed, or moved aside (its watches follow it: ended here)
            del self._inodes[name]
            self._unwatch(os.path.join(self.path, name))

    def _watch_journal(self, path: str, name: str, inode: int | None = None) -> None:
        """Watch journal `name`'s directory `path`, its jnl/ and its idx/ (those there now; a directory made later is
        watched at its directory's event, before the push it causes lists it). Watches only: the inotify mask never
        follows the last link of a path (IN_DONT_FOLLOW) nor watches a non-directory (IN_ONLYDIR), and what is read
        is read by the listing, which follows none; an event is a hint. `inode`: the directory's, as the root's
        listing found it: a journal moved aside and made again under its name is watched anew (a watch follows the
        directory it was added for, wherever it moves)."""
        dirs = self._dirs
        if dirs is None:
            return
        if inode is not None:
            if self._inodes.get(name, inode) != inode:
                self._unwatch(path)
            self._inodes[name] = inode
        if not dirs.add(path, lambda created: self._journal_changed(name, created), IGNORED):
            return  # gone, or not a directory (a link)
        for sub in (SEGMENT_DIR, INDEX_DIR):
            dirs.add(os.path.join(path, sub), lambda _created: self._journal_changed(name, False))

    def _unwatch(self, path: str) -> None:
        """End the watches of the journal directory `path` and of its jnl/ and idx/ (DirWatch keeps them by path)."""
        if self._dirs is not None:
            for sub in (SEGMENT_DIR, INDEX_DIR, ""):
                self._dirs.remove(os.path.join(path, sub) if sub else path)

    def _root_changed(self, created: bool) -> None:
        """Something changed in the root (a journal made, moved or removed, or a file): the whole state, after the
        journals not watched yet are."""
        with self._cond:
            self._all = self._rescan = True
            self._cond.notify()

    def _journal_changed(self, name: str, created: bool) -> None:
        """Journal `name` changed (`created`: an entry made, moved or removed in its directory: its jnl/ or idx/ may
        be new, and is watched before the push lists it). Not for its ofs/ (made by the hub's first commit) and lock
        files (IGNORED)."""
        with self._cond:
            if created:
                self._fresh.add(name)
            if len(self._changed) >= MAX_PENDING:
                self._all = True
            else:
                self._changed.add(name)
            self._cond.notify()

    def _below(self, changed: str) -> str:
        """`changed` relative to the watched path: the events' paths start with it (os.path.relpath, 20 us an event
        on a loaded machine, three events an append, cost a burst of a thousand appends 60 ms of the server's CPU)."""
        if changed.startswith(self._prefix):
            return changed[len(self._prefix) :]
        return os.path.relpath(changed, self.path)

    def note(self, changed: str) -> None:
        name: str | None = self.journal
        if name is None:
            rel = self._below(changed)
            first, _, inside = rel.partition(os.sep)
            if inside.startswith(IGNORED):
                return
            try:
                name = check_journal_name(first) if inside else None  # a file in a journal's directory
            except InvalidArgumentError:
                return  # not a journal's: nothing the hub copies
        elif self._below(changed).startswith(IGNORED):
            return
        with self._cond:
            if name is None or len(self._changed) >= MAX_PENDING:
                self._all = True
            else:
                self._changed.add(name)
            self._cond.notify()

    def _run(self) -> None:
        for _ in range(1 << 62):  # until closed, or the stream is gone
            with self._cond:
                for _ in range(1 << 62):
                    whole = self._all and not self._whole_busy
                    if self._closed or self._changed or whole:
                        break
                    self._cond.wait()
                if self._closed:
                    return
                fresh, self._fresh = self._fresh, set()
                rescan = whole and self._rescan
                if rescan:
                    self._rescan = False
                start_whole = whole and self.state is not None
                if start_whole:  # listed in a thread of its own; the bursts go on meanwhile
                    self._all, self._whole_busy = False, True
                else:
                    names = [] if whole else sorted(self._changed)
                    everything = whole
                    self._changed = set()
                    if whole:
                        self._all = False
            # The new directories are watched before they are listed: an event after the listing is seen.
            if rescan:
                self._watch_root()
            for name in fresh:
                self._watch_journal(self.path if self.journal is not None else os.path.join(self.path, name), name)
            if start_whole:
                threading.Thread(target=self._whole, name="sej-serve-state", daemon=True).start()
                continue
            try:
                for frame in self._frames(None if everything else names):
                    self.send(frame)  # each as it is made: the hub copies the first while the rest are listed
            except OSError:
                return

    def _whole(self) -> None:
        """Send every journal's state (and what `state(None)` pushes again after it)."""
        try:
            for frame in self._frames(None):
                if self._closed:
                    return
                self.send(frame)
        except OSError:
            with self._cond:
                self._closed = True  # the stream is gone
                self._cond.notify()
            return
        with self._cond:
            self._whole_busy = False
            self._cond.notify()

    def _frames(self, names: list[str] | None) -> Iterator[bytes]:
        if self.state is not None:
            try:
                yield from self.state(names)
                return
            except Exception as e:  # the hub asks instead (a CHANGED drops what it knew)
                log.error("sej serve %s: cannot list what changed: %s", self.path, e)
        yield wire.encode(wire.changed(names or []))

    def close(self) -> None:
        if self._sub is not None:
            self._sub.close()
        if self._dirs is not None:
            self._dirs.close()
        with self._cond:
            self._closed = True
            self._cond.notify()
