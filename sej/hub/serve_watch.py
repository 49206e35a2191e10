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
from ..layout import OFFSET_DIR, RETENTION_LOCK, WRITER_LOCK
from ..watch import Subscription
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


class _Changes(FileSystemEventHandler):
    def __init__(self, pusher: Pusher) -> None:
        super().__init__()
        self.pusher = pusher

    def on_any_event(self, event: FileSystemEvent) -> None:
        self.pusher.note(os.fsdecode(event.src_path))


class Pusher:
    """Watches `path` (recursively) and sends CHANGED frames through `send`, one per burst of events.

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
        self._thread = threading.Thread(target=self._run, name="sej-serve-push", daemon=True)
        self._thread.start()
        self._sub = Subscription(path, _Changes(self), recursive=True, event_filter=list(EVENTS))
        if state is not None:
            self.refresh()  # the whole state, listed after the watch began: nothing falls between them

    def refresh(self) -> None:
        """Send every journal's state (version 2) at the next burst, now if there is none under way."""
        with self._cond:
            self._all = True
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
                if whole and self.state is not None:  # listed in a thread of its own; the bursts go on meanwhile
                    self._all, self._whole_busy = False, True
                    threading.Thread(target=self._whole, name="sej-serve-state", daemon=True).start()
                    continue
                names = [] if whole else sorted(self._changed)
                everything = whole
                self._changed = set()
                if whole:
                    self._all = False
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
        self._sub.close()
        with self._cond:
            self._closed = True
            self._cond.notify()
