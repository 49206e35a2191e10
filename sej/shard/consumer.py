"""A consumer over a journal, a sharded root or a hub root: every journal's messages, batched commits.

The root is watched through one inotify instance and one thread, however many journals:
on Linux only the directories that matter (sej.watch.DirWatch: the root, the directories
in it, each journal's jnl/), elsewhere one recursive watch. The watch marks which journals
changed; each journal is read by a Scanner that never waits itself (timeout 0). Positions are kept per journal in
`ofs/<reader>.ofs` under the reader's lock, committed in batches: every `commit_every`
consumed messages, every `commit_interval` seconds, on `commit()` and on `close()`.

At least once, as Kafka's auto-commit: a message counts as consumed once the loop
asks for the next one (or on `commit()`), so a crash replays at most the messages
consumed since the last commit, and never skips one.

A batch commit overwrites each changed offset file in the loop (a few microseconds each:
other processes see it, and it survives this process's death) and leaves the fdatasyncs
to the consumer's syncer thread, so the loop never waits for the disk; `commit()` and
`close()` return once every position is durable. After a power loss, a batch commit the
syncer had not made durable yet may come back as the one before it: more is replayed,
nothing is skipped.
"""

from __future__ import annotations

import asyncio
import datetime as _dt
import logging
import os
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Mapping
from itertools import chain, islice
from typing import Literal, NamedTuple

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

from ..errors import ClosedError, InvalidArgumentError, LockedError
from ..frames import ShardMessage
from ..fsutil import allow_open_files
from ..journal import bytes_from, first_offset, next_offset, offset_at_time
from ..layout import check_reader_name, journal_path, segment_dir
from ..offset import Offset
from ..scanner import Scanner
from ..timestamps import to_ns
from ..watch import DirWatch, Subscription
from .group import GROUPS_DIR, Membership, share
from .root import Journal, find_journals, is_journal

log = logging.getLogger("sej.consumer")

Start = Literal["committed", "first", "last"] | int | Mapping[str, int] | _dt.datetime

SWEEP = 1.0
"""Seconds between looks at every journal, in case a file event was missed (a journal created
faster than its watch was added)."""

SWEEP_CHUNK = 32
"""Journals a sweep queues per turn: the sweep of a big root is spread over many turns, so a journal
with a new message waits behind at most this many others (a fstat each), not behind all of them."""

REDISCOVER = 10.0
"""Seconds between listings of the root while inotify watches it (DirWatch), whose events find new
journals: the listing is only a safety net, and takes milliseconds for a thousand journals. Without
DirWatch, and in a group (members come and go without file events), every SWEEP seconds."""

SYNC_CHUNK = 8
SYNC_PAUSE = 0.0002
"""The syncer pauses SYNC_PAUSE seconds after every SYNC_CHUNK files. Between two fdatasyncs it makes
system calls that take microseconds (lstat, open, fstat, close): at each one another thread may take
the GIL, but the syncer's next call usually takes it back first, so a thread that wants it (the loop
woken by a new message) would wait for Python's switch interval (5 ms). The pauses bound that wait."""

FAIRNESS = 256
"""Messages taken from one journal before the next journal with data gets its turn."""


CHANGES: list[type[FileSystemEvent]] = [
    FileModifiedEvent, FileCreatedEvent, FileMovedEvent, FileDeletedEvent, DirCreatedEvent, DirMovedEvent,
    DirDeletedEvent,
]  # fmt: skip
"""The events the consumer's watch asks for: not opens and closes (its own reads would flood it)."""


class Lag(NamedTuple):
    messages: int  # messages from the consumer's position to the journal's end
    bytes: int  # bytes from the consumer's position to the end of the journal's last segment


class _Member:
    """One journal being consumed: its scanner, its reader offset (and lock), its positions."""

    __slots__ = ("name", "path", "scanner", "offset", "committed", "ready")

    def __init__(self, name: str, path: str, reader: str | None, start: object) -> None:
        self.name, self.path = name, path
        # LockedError if another consumer holds it; no reader: nothing kept, nothing locked
        self.offset = Offset(path, reader) if reader is not None else None
        try:
            committed = self.offset.value if self.offset is not None else first_offset(path)
            self.scanner = Scanner(path, _start_offset(path, committed, start), timeout=0, _journal=name)
        except BaseException:
            if self.offset is not None:
                self.offset.close()
            raise
        self.committed = committed
        self.ready = False  # queued in the consumer's ready deque

    def seek(self, offset: int) -> None:
        scanner = Scanner(self.path, offset, timeout=0, _journal=self.name)
        self.scanner.close()
        self.scanner = scanner

    @property
    def position(self) -> int:
        """The next offset to consume: one past the message yielded last (the consumer yields each message
        right after its scanner does)."""
        return self.scanner.offset

    def commit(self, sync: bool) -> None:
        """Commit the current position (durably when `sync`; else the syncer makes it durable)."""
        position = self.position
        if position == self.committed:
            return
        if self.offset is not None:
            self.offset.commit(position, sync=sync)
        self.committed = position

    def close(self) -> None:
        try:
            self.scanner.close()
        finally:
            if self.offset is not None:
                self.offset.close()


class _Syncer:
    """The thread that fdatasyncs the offset files a consumer's loop wrote, so that the loop never waits for
    the disk (a file written again before its sync is synced once). A failure is kept and raised by the
    next batch commit, `commit()` or `close()`."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._dirty: dict[str, Offset] = {}
        self._busy = False
        self._stopped = False
        self._error: BaseException | None = None
        self._failed: dict[str, Offset] = {}  # synced without success: tried again with the next add
        self._thread: threading.Thread | None = None

    def add(self, offsets: Iterable[Offset]) -> None:
        """fdatasync these offsets' files (and again those whose fdatasync failed)."""
        with self._cond:
            self._dirty.update(self._failed)
            self._failed = {}
            for o in offsets:
                self._dirty[o.path] = o
            if not self._dirty:
                return
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="sej-consumer-syncer", daemon=True)
                self._thread.start()
            self._cond.notify_all()

    def check(self) -> None:
        """Raise the failure of the syncer's work since the last check, if any."""
        with self._cond:
            error, self._error = self._error, None
        if error is not None:
            raise error

    def drain(self) -> None:
        """Wait until every file added so far is synced; raise a failure."""
        with self._cond:
            while (self._dirty or self._busy) and self._thread is not None and self._thread.is_alive():
                self._cond.wait(1.0)
        self.check()

    def stop(self) -> None:
        """Finish what was added, then end the thread."""
        with self._cond:
            self._stopped = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join()

    def _run(self) -> None:
        cond = self._cond
        while True:
            with cond:
                while not self._dirty and not self._stopped:
                    cond.wait()
                if not self._dirty:
                    return
                dirty, self._dirty = list(self._dirty.values()), {}
                self._busy = True
            error = None
            failed = []
            for i, o in enumerate(dirty):
                if i and not i % SYNC_CHUNK:
                    time.sleep(SYNC_PAUSE)  # the GIL free for the loop: see SYNC_CHUNK
                try:
                    o.sync()
                except BaseException as e:  # kept for the loop: a commit it cannot make durable must be seen
                    error = error or e
                    failed.append(o)
            with cond:
                self._busy = False
                for o in failed:
                    self._failed[o.path] = o
                if error is not None and self._error is None:
                    self._error = error
                cond.notify_all()


def _start_offset(path: str, committed: int, start: object) -> int:
    if start == "committed":
        return committed
    if start == "first":
        return first_offset(path)
    if start == "last":
        return next_offset(path)
    if isinstance(start, _dt.datetime):
        return offset_at_time(path, to_ns(start))
    if isinstance(start, int) and not isinstance(start, bool):
        return start
    raise InvalidArgumentError(f"start must be 'committed', 'first', 'last', an offset, a mapping of journal "
                               f"names to offsets or an aware datetime, got {start!r}")  # fmt: skip


class _RootEvents(FileSystemEventHandler):
    """Which journals changed, from the watches of the root (runs on watchdog's thread).

    With inotify (DirWatch), only the directories that matter are watched: the root and the
    directories in it (journals appearing), each journal's jnl/ (messages and segments), and a
    group's member directory. Elsewhere one recursive watch covers the root, and the events of the
    rest (offset commits, index writes) are dropped here.
    """

    def __init__(self, root: str, lone: bool) -> None:
        super().__init__()
        self.root, self.lone = root, lone
        self.lock = threading.Lock()
        self.event = threading.Event()
        self.changed: set[str] = set()
        self.new_segments: set[str] = set()
        self.rescan = True  # a journal may have appeared under the root
        self.loop: asyncio.AbstractEventLoop | None = None  # an async consumer's loop, woken too
        self.aevent: asyncio.Event | None = None

    def on_any_event(self, event: FileSystemEvent) -> None:
        if event.event_type in ("opened", "closed", "closed_no_write"):
            return
        path = event.src_path if isinstance(event.src_path, str) else os.fsdecode(event.src_path)
        parts = os.path.relpath(path, self.root).split(os.sep)
        if self.lone:
            name, inside = "", parts
        else:
            name, inside = parts[0], parts[1:]
        if inside and inside[0] in ("ofs", "idx"):
            return  # offset commits (ours too) and index writes: no new messages
        created = event.event_type in ("created", "moved", "deleted")
        if GROUPS_DIR in (name, *inside[:1]):
            if created:  # a member joined or left: rebalance now
                self.root_changed(True)
            return
        if not inside or inside == ["jnl"]:
            self.root_changed(created)
        self.journal_changed(name, created)

    def root_changed(self, created: bool) -> None:
        """Something was created, moved or removed in the root, a journal directory or the member
        directory: look for journals again."""
        if created:
            with self.lock:
                self.rescan = True
            self._wake()

    def journal_changed(self, name: str, created: bool) -> None:
        """A segment of journal `name` was written (or `created`, moved, removed)."""
        with self.lock:
            if created:
                self.new_segments.add(name)
            self.changed.add(name)
        self._wake()

    def _wake(self) -> None:
        self.event.set()
        loop, aevent = self.loop, self.aevent
        if loop is not None and aevent is not None:
            try:
                loop.call_soon_threadsafe(aevent.set)
            except RuntimeError:  # the loop is closed
                pass

    def take(self) -> tuple[set[str], set[str], bool]:
        with self.lock:
            changed, self.changed = self.changed, set()
            new, self.new_segments = self.new_segments, set()
            rescan, self.rescan = self.rescan, False
        return changed, new, rescan


class Consumer:
    """Consumes every journal at `path` (a journal, a sharded root or a hub root) as reader `reader`.

    `reader` None reads without a reader: no offset file is locked or written (a read-only tree
    will do), and `commit()` only marks positions as committed in this process.

    Iterating yields `ShardMessage(journal, offset, timestamp, type, key, value)`: the journal's name
    under the root ("" for a lone journal) and the message's fields (`.message`: the Message alone).
    With `follow`, iteration waits for new messages and new journals, and ends after `timeout`
    seconds without any (None: never); without it, it ends once every journal is read to its end.

    `start`: where each journal starts: "committed" (the reader's committed offset, or the journal's
    first message if none, or without a reader), "first", "last", an offset, a mapping of journal names to offsets
    (others: committed), or an aware datetime. Journals that appear later start at "committed".

    `group`: share the journals with the other consumers of the same reader on the same root, in
    this process or others, on this machine or others sharing the file system (sej.shard.group):
    each journal is consumed by one member at a time, from its committed offset, and the journals
    are spread evenly over the live members, checked every SWEEP seconds. A member that dies (or
    closes) loses its journals to the others; one that joins takes its share. `on_assign(names)` and
    `on_revoke(names)` are called with the journals taken and given up (before their positions are
    committed and their locks released), as Kafka's rebalance listener.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        reader: str | None,
        *,
        start: Start = "committed",
        commit_every: int = 1000,
        commit_interval: float = 5.0,
        follow: bool = True,
        timeout: float | None = None,
        group: bool = False,
        on_assign: Callable[[list[str]], object] | None = None,
        on_revoke: Callable[[list[str]], object] | None = None,
    ) -> None:
        self.root = journal_path(path)
        self.reader = check_reader_name(reader) if reader is not None else None
        if not isinstance(commit_every, int) or isinstance(commit_every, bool) or commit_every < 1:
            raise InvalidArgumentError(f"commit_every must be an int >= 1, got {commit_every!r}")
        if isinstance(commit_interval, bool) or not isinstance(commit_interval, (int, float)) or commit_interval <= 0:
            raise InvalidArgumentError(f"commit_interval must be seconds > 0, got {commit_interval!r}")
        if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout < 0):
            raise InvalidArgumentError(f"timeout must be seconds >= 0 or None, got {timeout!r}")
        if group and self.reader is None:
            raise InvalidArgumentError("a group needs a reader name: its members share the reader's offsets")
        if group and start != "committed":
            raise InvalidArgumentError(f"a group member starts at the committed offsets, got start={start!r}")
        self.commit_every, self.commit_interval = commit_every, float(commit_interval)
        self.follow, self.timeout = follow, timeout
        self._start = start
        self._members: dict[str, _Member] = {}
        self._order: list[str] = []  # the members, in the order they were found
        self._ready: deque[_Member] = deque()  # members that may have data, in turn
        self._it: Iterator[ShardMessage] | None = None  # what __next__ iterates
        self._agen: Iterator[Iterator[ShardMessage] | None] | None = None  # the turns __anext__ takes
        self._aturn: Iterator[ShardMessage] = iter(())  # the turn __anext__ takes messages from
        self._turn: tuple[_Member, int | None] | None = None  # the journal of the turn under way, where it began
        self._uncommitted = 0
        self._committed_at = time.monotonic()
        self._swept_at = 0.0
        self._sweeping: deque[str] = deque()  # the journals the sweep under way has yet to queue
        self._listed_at = 0.0  # when the root was last listed
        self._closed = False
        self._syncer = _Syncer()
        self._touched: dict[str, _Member] = {}  # journals consumed from since the last write of positions
        self._unsynced: dict[str, Offset] = {}  # offsets written while idle, synced by the next batch commit
        self._events = _RootEvents(self.root, is_journal(self.root))
        self._sub: Subscription | None = None
        self._dirs: DirWatch | None = None
        self._on_assign, self._on_revoke = on_assign, on_revoke
        self._group: Membership | None = None
        try:
            if group:
                self._group = Membership(self.root, self.reader)  # type: ignore[arg-type]
            self._discover(initial=True)
            # Watched only now: opening the journals (reader locks, offset directories) makes thousands of
            # events the watch would have to wade through before the first new message. Every journal is
            # queued, so what was written meanwhile is read all the same.
            if DirWatch.available():
                self._dirs = DirWatch()
                self._watch()
            else:
                self._sub = Subscription(self.root, self._events, recursive=True, event_filter=CHANGES)
        except BaseException:
            self.close()
            raise

    # -- journals ---------------------------------------------------------------------------------

    def _discover(self, initial: bool = False) -> None:
        """Start consuming journals not consumed yet (in a group: as many as this member's share)."""
        journals = find_journals(self.root)
        if self._group is not None:
            self._rebalance(journals)
            return
        new = [j for j in journals if j.name not in self._members]
        allow_open_files(2 * (len(self._members) + len(new)) + 64)
        took = []
        for j in new:
            start = self._start if initial else "committed"
            if isinstance(start, Mapping):
                start = start.get(j.name, "committed")
            try:
                m = _Member(j.name, j.path, self.reader, start)
            except LockedError:
                if initial:
                    raise
                log.warning("%s: reader %s is locked by another process; not consuming it", j.path, self.reader)
                continue
            self._add(m)
            took.append(j.name)
        if initial and isinstance(self._start, Mapping):
            unknown = set(self._start) - set(self._members)
            if unknown:
                raise InvalidArgumentError(f"start names journals not under {self.root}: {sorted(unknown)}")
        if took and self._on_assign is not None:
            self._on_assign(took)

    def _add(self, m: _Member) -> None:
        self._members[m.name] = m
        self._order.append(m.name)
        m.ready = False
        self._queue(m)
        if self._dirs is not None:
            self._watch_journal(m.name, m.path)

    def _watch(self) -> None:
        """Watch the root, the directories in it and the journals' jnl/ (DirWatch only)."""
        assert self._dirs is not None
        ev = self._events
        self._dirs.add(self.root, ev.root_changed)
        if self._group is not None:
            self._dirs.add(self._group.dir, ev.root_changed)
        if not ev.lone:
            with os.scandir(self.root) as entries:  # a journal still being created: its jnl/ appearing
                for e in entries:
                    if e.is_dir(follow_symlinks=False) and e.name not in self._members:
                        new = e.path not in self._dirs
                        self._dirs.add(e.path, ev.root_changed)
                        if new and is_journal(e.path):  # its jnl/ came before the watch: list the root again
                            ev.root_changed(True)
        for m in self._members.values():
            self._watch_journal(m.name, m.path)

    def _watch_journal(self, name: str, path: str) -> None:
        assert self._dirs is not None
        events = self._events
        self._dirs.add(segment_dir(path), lambda created: events.journal_changed(name, created))

    def _rebalance(self, journals: list[Journal]) -> None:
        """Hold this member's share of the journals: give up the ones over it, take free ones under it."""
        assert self._group is not None
        cap = share(len(journals), self._group.members(), self._group.id)
        over = len(self._members) - cap
        if over > 0:
            self._release(self._order[-over:])
            return
        if over == 0:
            return
        free = [j for j in journals if j.name not in self._members]
        allow_open_files(2 * cap + 64)
        # Each member tries the free journals from a place of its own: members joining at once then
        # mostly find different journals unlocked.
        k = int(self._group.id.rsplit("-", 1)[1], 16) % len(free) if free else 0
        took = []
        for j in free[k:] + free[:k]:
            if len(self._members) >= cap:
                break
            try:
                m = _Member(j.name, j.path, self.reader, "committed")
            except LockedError:
                continue  # another member's
            self._add(m)
            took.append(j.name)
        if took:
            log.info("%s: reader %s took %d journals (share %d)", self.root, self.reader, len(took), cap)
            if self._on_assign is not None:
                self._on_assign(took)

    def _release(self, names: list[str]) -> None:
        """Stop consuming `names`: commit their positions and release their reader locks."""
        if self._on_revoke is not None:
            self._on_revoke(list(names))
        gone = set(names)
        keep = [m for m in self._ready if m.name not in gone]
        self._ready.clear()
        self._ready.extend(keep)
        self._order = [n for n in self._order if n not in gone]
        for name in names:
            m = self._members.pop(name)
            self._touched.pop(name, None)
            try:
                m.commit(sync=False)
                if m.offset is not None:
                    self._unsynced.pop(m.offset.path, None)
                    m.offset.sync()  # durable before its lock goes: also what was written while idle
            finally:
                m.close()
        log.info("%s: reader %s gave up %d journals", self.root, self.reader, len(names))

    @property
    def journals(self) -> list[str]:
        """The names of the journals being consumed."""
        return list(self._order)

    # -- reading -------------------------------------------------------------------------------------

    def _queue(self, m: _Member) -> None:
        if not m.ready:
            m.ready = True
            self._ready.append(m)

    def _refresh(self, sweep: bool = False) -> None:
        """Queue the journals with file events (all of them every SWEEP seconds); find new journals."""
        self._events.event.clear()  # before taking the events: a later one sets it again
        changed, new_segments, rescan = self._events.take()
        now = time.monotonic()
        if sweep or now - self._swept_at >= SWEEP:
            self._swept_at = now
            if not self._sweeping:  # one still under way (long turns) goes on: its last journals come next
                self._sweeping = deque(self._members)  # a fstat each: a missed event costs about SWEEP seconds
            if self._dirs is None or self._group is not None or now - self._listed_at >= REDISCOVER:
                rescan = True
        sweeping = self._sweeping
        for _ in range(min(SWEEP_CHUNK, len(sweeping))):
            changed.add(sweeping.popleft())
        if rescan:
            self._listed_at = now
            self._discover()
            if self._dirs is not None:
                self._watch()
        for name in changed:
            m = self._members.get(name)
            if m is not None:
                self._queue(m)
                if name in new_segments:
                    m.scanner._wakeup.created = True  # look for a later segment (the scanner does not watch)

    def _maybe_commit(self) -> None:
        if self._uncommitted and time.monotonic() - self._committed_at >= self.commit_interval:
            self._batch_commit()

    def _turns(self, block: bool) -> Iterator[Iterator[ShardMessage] | None]:
        """Turns of up to FAIRNESS messages of one journal with data each, as iterators that run in C (the
        loop's `for` pulls messages from them without running Python code per message). Not `block`: None
        when no message is available now (the async form waits then).

        A turn's messages count as consumed once the loop asks for the one after them: then this
        generator is resumed, and the journal's position (its scanner's offset) tells how many it took.
        """
        ready = self._ready
        events = self._events.event
        deadline = None if self.timeout is None else time.monotonic() + self.timeout
        while True:
            turn, self._turn = self._turn, None
            if turn is not None:  # the loop asked past the last message of the turn
                m, began = turn
                taken = m.position - began if began is not None else 1  # None: sought meanwhile
                if taken:
                    self._touched[m.name] = m
                    ready.append(m)  # more may be there: it stays queued
                    self._uncommitted += taken if began is not None else 0
                    deadline = None if self.timeout is None else time.monotonic() + self.timeout
                    if self._uncommitted >= self.commit_every:
                        self._batch_commit()
                    else:
                        self._maybe_commit()
                else:
                    m.ready = False  # queued again by its next file event
            if self._closed:
                raise ClosedError(f"consumer of {self.root} is closed")
            if not ready or events.is_set() or self._sweeping or time.monotonic() - self._swept_at >= SWEEP:
                self._refresh()  # also between turns: a journal that always has data must not starve the others
            if not ready:
                self._maybe_commit()
                if self._touched:
                    self._write_touched()
                if not self.follow and self._caught_up():
                    return
                if not block:
                    yield None
                    continue
                wait = SWEEP
                if deadline is not None:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        return
                    wait = min(wait, left)
                if self._uncommitted:
                    wait = min(wait, max(0.0, self._committed_at + self.commit_interval - time.monotonic()))
                events.wait(wait)
                continue
            m = ready.popleft()
            try:
                batch = m.scanner.poll()
            except BaseException:
                ready.appendleft(m)  # still queued: iterating again meets the same error
                raise
            self._turn = (m, m.position)
            # a batch commit falls between two turns
            size = min(FAIRNESS, max(1, self.commit_every - self._uncommitted))
            yield islice(batch, size)  # type: ignore[arg-type]  # ShardMessages: the member's scanner names its journal

    def _caught_up(self) -> bool:
        return all(m.position >= next_offset(m.path) for m in self._members.values())

    def __iter__(self) -> Iterator[ShardMessage]:
        return chain.from_iterable(self._turns(block=True))  # type: ignore[arg-type]

    def __next__(self) -> ShardMessage:
        it = self._it
        if it is None:
            it = self._it = iter(self)
        try:
            return next(it)
        except StopIteration:
            self._it = None  # iterating again goes on where it stopped
            raise

    def __aiter__(self) -> AsyncIterator[ShardMessage]:
        return self

    async def __anext__(self) -> ShardMessage:
        """As `__next__`, waiting on the running event loop instead of blocking it."""
        ev = self._events
        if ev.aevent is None:
            ev.aevent, ev.loop = asyncio.Event(), asyncio.get_running_loop()
        gen = self._agen
        if gen is None:
            gen = self._agen = self._turns(block=False)
        deadline = None if self.timeout is None else time.monotonic() + self.timeout
        while True:
            for msg in self._aturn:
                return msg
            ev.aevent.clear()
            try:
                turn = next(gen)
            except StopIteration:
                self._agen = None
                raise StopAsyncIteration from None
            if turn is not None:
                self._aturn = turn
                continue
            wait = SWEEP
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise StopAsyncIteration
                wait = min(wait, left)
            try:
                await asyncio.wait_for(ev.aevent.wait(), wait)
            except TimeoutError:
                pass

    # -- positions --------------------------------------------------------------------------------

    def commit(self) -> None:
        """Commit every journal's position and wait until it is durable; the message yielded last counts as
        consumed. Raises the error of a batch commit's fdatasync that failed since the last call."""
        self._batch_commit()
        self._syncer.drain()

    def _batch_commit(self) -> None:
        """Write every changed position to its offset file now, and have the syncer make them durable."""
        syncer = self._syncer
        syncer.check()  # a failed fdatasync stops the loop here, before more is committed over it
        due = [m for m in self._members.values() if m.position != m.committed]
        self._uncommitted = 0
        self._committed_at = time.monotonic()
        self._touched = {}
        if self._turn is not None and self._turn[1] is not None:  # what the turn took so far is in this commit
            self._turn = (self._turn[0], self._turn[0].position)
        self._write(due)
        unsynced, self._unsynced = self._unsynced, {}
        syncer.add(unsynced.values())

    def _write_touched(self) -> None:
        """While idle (nothing to read): write the positions of the journals consumed from since the last
        write, without fsync (made durable by the next batch commit). A few files at a time, each a
        pwrite into the page cache: a batch commit then finds little left to write, and a crash of the
        process replays even less than a batch."""
        touched, self._touched = self._touched, {}
        due = [m for m in touched.values() if m.position != m.committed]
        if not due:
            return
        self._syncer.check()
        self._write(due)

    def _write(self, due: list[_Member]) -> None:
        """Write the positions of `due` (no fsync), each one kept for the syncer as soon as it is written: a
        failure part way leaves those before it to be synced by the next commit."""
        unsynced = self._unsynced
        for m in due:
            m.commit(sync=False)
            if m.offset is not None:
                unsynced[m.offset.path] = m.offset

    def positions(self) -> dict[str, int]:
        """Each journal's next offset to consume (the message yielded last counts as consumed)."""
        return {name: m.position for name, m in self._members.items()}

    def committed(self) -> dict[str, int]:
        """Each journal's committed offset (where a restart begins)."""
        return {name: m.committed for name, m in self._members.items()}

    def lag(self) -> dict[str, Lag]:
        """Per journal, messages and bytes from the consumer's position to the journal's end."""
        out = {}
        for name, pos in self.positions().items():
            m = self._members[name]
            end = next_offset(m.path)
            out[name] = Lag(max(0, end - pos), bytes_from(m.path, pos) if pos < end else 0)
        return out

    def seek(self, journal: str, offset: int) -> None:
        """Consume `journal` from `offset` on (committed at the next commit)."""
        m = self._members.get(journal)
        if m is None:
            raise InvalidArgumentError(f"no journal {journal!r} under {self.root}; the journals are {self._order}")
        m.seek(offset)  # closes its scanner: a turn of it under way ends
        if self._turn is not None and self._turn[0] is m:
            self._turn = (m, None)
        else:
            self._queue(m)
        self._uncommitted += 1
        self._touched[m.name] = m

    def seek_to_time(self, t: int | _dt.datetime) -> None:
        """Consume every journal from its first message at or after `t` (ns since the epoch, or aware datetime)."""
        ns = to_ns(t)
        for name, m in self._members.items():
            self.seek(name, offset_at_time(m.path, ns))

    # -- closing ----------------------------------------------------------------------------------------

    def close(self) -> None:
        """Commit (the message yielded last counts as consumed), stop watching, release the locks. Idempotent."""
        if self._closed:
            return
        try:
            if self._members:
                self.commit()
        finally:
            self._closed = True
            if self._sub is not None:
                self._sub.close()
                self._sub = None
            if self._dirs is not None:
                self._dirs.close()
                self._dirs = None
            self._syncer.stop()  # before the locks go: it syncs what is left
            for m in self._members.values():
                m.close()
            if self._group is not None:
                self._group.close()

    def __enter__(self) -> Consumer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Consumer({self.root!r}, {self.reader!r}, journals={len(self._members)})"


__all__ = ["Consumer", "Lag"]
