"""The producer's side of the serve transport: `sej serve ROOT`, speaking sej.hub.serve_protocol on stdin/stdout.

Every call is answered by a LocalSource of ROOT, so the server is exactly as careful with the tree
as the hub is locally: names validated, no link followed, no FIFO or device opened, nothing read
outside ROOT, sizes bounded. It writes nothing but reader offset files (`ofs/<reader>.ofs`, with
sej.offset's own in-place write and fsync). With `restrict` (for a key pinned to it in
authorized_keys) it serves ROOT whatever the hub asks for, and commits only the reader `reader`.
"""

from __future__ import annotations

import logging
import os
import select
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any

import xxhash

from ..checksum import HEADER as SUM_HEADER
from ..checksum import RECORD as SUM_RECORD
from ..errors import CorruptionError, InvalidArgumentError, ProtocolError, SejError, UnsafeFileError
from ..fsutil import open_dir, open_regular
from ..layout import INDEX_DIR, SEGMENT_DIR, check_reader_name, segment_name, sum_name
from . import serve_protocol as wire
from .local_source import LocalSource
from .names import check_journal_name, check_segment_name
from .serve_commit import Kept, commit_batch
from .source import SourceError

log = logging.getLogger("sej.hub.serve")

READ_SIZE = 1 << 20
"""Bytes read from stdin at a time."""

GATHER = 16 << 20
"""Bytes of calls already waiting on stdin read together at most before they are answered."""

COMMIT_THREADS = 8
"""Threads of a batch of commits (sej.hub.serve_commit): opening files not kept, renames, a small run's fsyncs."""

YIELD_AT_MOST = 1.0
"""Seconds a whole state's listing waits in all for the bursts under way (each burst's journals are listed before the
whole state's next journal is): two threads listing at once each went at half speed, and a burst of a thousand
appends made while the refresh (every 15 s) was listed went out twice as slowly. After that it lists on: a producer
that appends without a pause still gets its whole state."""

PUSH_EVERY = 0.02
"""Seconds of listing (and reading) after which the journals listed so far go out in a STATE of their own: the
hub starts copying a burst of a thousand appends while the server lists the rest."""


class _OneJournal:
    """A LocalSource of a root that shows one journal of it only (the hub asked for a journal under ROOT)."""

    def __init__(self, source: LocalSource, journal: str) -> None:
        self.source, self.journal = source, journal

    def __getattr__(self, name: str) -> Callable[..., Any]:
        method = getattr(self.source, name)

        def only(journal: str, *args: Any) -> Any:
            if journal != self.journal:
                raise InvalidArgumentError(f"this server serves the journal {self.journal} only, not {journal!r}")
            return method(journal, *args)

        return only

    def journals(self) -> list[str]:
        return [j for j in self.source.journals() if j == self.journal]

    def skipped(self) -> dict[str, str]:
        return {}


class _Held(LocalSource):
    """A LocalSource whose calls on the journal being pushed (`journal`) share its directories, each opened once (the
    root once for all): listing a journal and reading its new bytes opened the root, the journal and its jnl/ or idx/
    again for each of its four calls. Every check is LocalSource's own (names, no link followed, regular files);
    the other journals' calls open their directories as LocalSource does."""

    def __init__(self, source: LocalSource) -> None:  # pylint: disable=super-init-not-called
        self.root, self._only, self._skipped = source.root, source._only, source._skipped
        self._top = -1
        self._held: str | None = None
        self._fds: dict[str | None, int] = {}

    @contextmanager
    def holding(self, journal: str) -> Iterator[None]:
        """While inside, `journal`'s directories are opened once, and closed on leaving."""
        self._held = journal
        try:
            yield
        finally:
            self._held = None
            fds, self._fds = self._fds, {}
            for fd in fds.values():
                os.close(fd)

    @contextmanager
    def _dir(self, journal: str, sub: str | None = None) -> Iterator[int]:
        if journal != self._held:
            with super()._dir(journal, sub) as fd:
                yield fd
            return
        held = self._fds.get(sub)
        if held is None:
            held = self._fds[sub] = self._open_held(journal, sub)
        yield held

    def _open_held(self, journal: str, sub: str | None) -> int:
        name = check_journal_name(journal)
        where = os.path.join(self.root, name)
        if sub is not None:
            parent = self._fds.get(None)
            if parent is None:
                parent = self._fds[None] = self._open_held(journal, None)
            return open_dir(sub, dir_fd=parent, show=os.path.join(where, sub))
        if self._only is not None:
            if name != self._only[0]:
                raise SourceError(f"{self.root}: no journal {name} (this source is the journal {self._only[0]})")
            return open_dir(where, follow=True)  # the configured path itself
        if self._top < 0:
            self._top = open_dir(self.root, follow=True)
        return open_dir(name, dir_fd=self._top, show=where)

    def close(self) -> None:
        if self._top >= 0:
            os.close(self._top)
            self._top = -1


class _Unheld:
    """Another source (_OneJournal's), its calls as they are."""

    def __init__(self, source: Any) -> None:
        self.source = source

    def __getattr__(self, name: str) -> Any:
        return getattr(self.source, name)

    @staticmethod
    def holding(journal: str) -> AbstractContextManager[None]:
        return nullcontext()


@contextmanager
def _held(source: Any) -> Iterator[Any]:
    """`source` as a _Held while inside (a LocalSource; any other, _OneJournal's, as it is: _Unheld)."""
    if not isinstance(source, LocalSource):
        yield _Unheld(source)
        return
    held = _Held(source)
    try:
        yield held
    finally:
        held.close()


def _error(call_id: int, e: BaseException) -> list[Any]:
    """An ERROR message for what a call raised."""
    if isinstance(e, FileNotFoundError):
        return wire.error(call_id, "missing", str(e))
    if isinstance(e, UnsafeFileError):
        return wire.error(call_id, "unsafe", str(e), [e.path, e.kind, e.expected])
    if isinstance(e, InvalidArgumentError):
        return wire.error(call_id, "invalid", str(e))
    if isinstance(e, CorruptionError):
        return wire.error(call_id, "corrupt", str(e))
    if isinstance(e, _Refused):
        return wire.error(call_id, "refused", str(e))
    if isinstance(e, SejError):
        return wire.error(call_id, "source", str(e))
    if isinstance(e, OSError):
        return wire.error(call_id, "os", str(e), e.errno if isinstance(e.errno, int) and e.errno >= 0 else None)
    return wire.error(call_id, "internal", f"{type(e).__name__}: {e}")


class Session:
    """One hub's session, as a state machine: `receive(bytes)` returns the bytes to send back.

    `ended` once the stream is over (a refused hello, a bad frame): the caller sends what was returned
    and stops. `on_watch(path, journal)` is called when the hub asks for pushed changes (serve() starts a
    sej.hub.serve_watch.Pusher of `path`; `journal` when that is the one journal served).
    """

    def __init__(self, root: str, restrict: bool = False, reader: str = "hub",
                 on_watch: Callable[[str, str | None], None] | None = None) -> None:  # fmt: skip
        self.root = os.path.abspath(root)
        self.restrict = restrict
        self.reader = reader
        self.on_watch = on_watch
        self.version = 0  # the protocol version the hello chose
        self._asked = ""
        self._watch_source: Any = None
        self._listed: dict[str, dict[str, tuple[int, int]]] = {}  # journal -> segment -> (size, sums size) last pushed
        self._pushed_at: dict[str, float] = {}  # journal -> when a burst last listed it (time.monotonic())
        self._bursts = threading.Condition()
        self._bursting = 0  # bursts under way (_changed_state); a whole state's listing waits for them (YIELD_AT_MOST)
        self.yields = 0  # times a whole state's listing waited for a burst
        self.decoder = wire.Decoder()
        self.source: Any = None  # after the hello: a LocalSource (or _OneJournal)
        self.source_root = self.root  # the directory its journals are in
        self.ended = False
        self.greeted = False  # MAGIC sent
        self._pool: ThreadPoolExecutor | None = None
        self._kept: Kept | None = None  # the offset files committed, kept open (sej.hub.serve_commit)

    def receive(self, data: bytes) -> bytes:
        self.decoder.feed(data)
        out: list[bytes] = []
        commits: list[tuple[int, list[Any]]] = []  # a run of commits, made together (_commit_run)
        journals: set[str] = set()  # theirs (a run is of distinct journals)
        try:
            for _ in range(1 << 30):  # every whole message fed (at most one per 5 bytes)
                if self.ended:
                    break
                msg = self.decoder.next()
                if msg is None:
                    break
                if self.source is not None and msg[0] == wire.CALL:
                    call_id, method, args = wire.parse_call(msg)
                    if method == "commit_offset" and args[0] not in journals:  # parse_call: a str
                        commits.append((call_id, args))
                        journals.add(args[0])
                        continue
                    out += self._commit_run(commits)
                    commits, journals = [], set()
                    if method == "commit_offset":  # a journal's second: the next run
                        commits.append((call_id, args))
                        journals.add(args[0])
                        continue
                    out += self._answer(call_id, method, args)
                    continue
                out += self._commit_run(commits)
                commits, journals = [], set()
                out += self._handle(msg)
            out += self._commit_run(commits)
        except ProtocolError as e:  # nothing after a bad frame can be trusted: say why, then end
            log.error("sej serve %s: %s", self.root, e)
            if not self.greeted:  # the hub learns it is sej serve that refuses it
                out.insert(0, wire.MAGIC)
                self.greeted = True
            out.append(wire.encode(wire.error(0, "protocol", str(e))))
            self.ended = True
        return b"".join(out)

    def _handle(self, msg: list[Any]) -> list[bytes]:
        if self.source is None:
            return self._hello(msg)
        if msg[0] == wire.CALL:
            return self._answer(*wire.parse_call(msg))
        if msg[0] == wire.WATCH and len(msg) == 2 and self.on_watch is not None:
            if isinstance(self.source, _OneJournal):
                self.on_watch(os.path.join(self.root, self.source.journal), self.source.journal)
            elif self.source.root != self.root:  # ROOT is one journal
                self.on_watch(self.root, os.path.basename(self.root))
            else:
                self.on_watch(self.root, None)
            return []
        raise ProtocolError(f"a {wire.KINDS[msg[0]]} message from the hub")

    def _answer(self, call_id: int, method: str, args: list[Any]) -> list[bytes]:
        try:
            return wire.reply(call_id, self._call(method, args))
        except Exception as e:  # per call, as Source.many reports it; the stream goes on
            return [wire.encode(_error(call_id, e))]

    def _commit_run(self, commits: list[tuple[int, list[Any]]]) -> list[bytes]:
        """Answer a run of commits of distinct journals (sej.hub.serve_commit: from BATCH_FROM on, syncs shared)."""
        return self._commit_batch(commits) if commits else []

    def _threads(self) -> ThreadPoolExecutor:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=COMMIT_THREADS, thread_name_prefix="sej-serve-commit")
        return self._pool

    def _commit_batch(self, commits: list[tuple[int, list[Any]]]) -> list[bytes]:
        answers: dict[int, list[bytes]] = {}
        batch: list[tuple[int, list[Any]]] = []
        for call_id, args in commits:
            journal, reader, value, sweep = args
            try:
                check_reader_name(reader)
                if self.restrict and reader != self.reader:
                    raise _Refused(f"this key may commit the reader {self.reader} only, not {reader!r}")
                # Restricted, the sweep of stale temp files (anyone's) is left to the producer's own tools.
                batch.append((call_id, [journal, reader, value, sweep and not self.restrict]))
            except Exception as e:
                answers[call_id] = [wire.encode(_error(call_id, e))]
        if self._kept is None:
            self._kept = Kept(self.source_root)
        got = commit_batch([(j, r, v, s) for _i, (j, r, v, s) in batch], self.source._dir, self.root, self._threads(),
                           self._kept)  # fmt: skip
        for (call_id, _args), err in zip(batch, got, strict=True):
            answers[call_id] = wire.reply(call_id, None) if err is None else [wire.encode(_error(call_id, err))]
        return [f for call_id, _args in commits for f in answers[call_id]]

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown()
        if self._kept is not None:
            self._kept.close()

    def _hello(self, msg: list[Any]) -> list[bytes]:
        versions, asked = wire.parse_hub_hello(msg)
        version = wire.choose_version(versions)
        self.version = version or 0
        out = [wire.MAGIC]
        self.greeted = True
        if version is None:
            self.ended = True
            return [*out, wire.encode(wire.error(0, "refused", f"no common protocol version: the hub speaks "
                                                 f"{versions[:8]}, this sej {list(wire.VERSIONS)}"))]  # fmt: skip
        try:
            self.source = self._open(asked)
            self._asked = asked
        except (SejError, OSError) as e:
            self.ended = True
            return [*out, wire.encode(wire.error(0, "refused", str(e)))]
        from .. import __version__

        return [*out, wire.encode(wire.server_hello(version, __version__, self.source_root))]

    def state_frames(self, names: list[str] | None) -> Iterator[bytes]:
        """STATE frames (protocol version 2) of the journals `names` (None: every journal, in several frames
        if many): their segments as listed now, by a LocalSource of its own (the pusher's thread calls this).
        A STATE that is not full comes in frames of the journals listed within PUSH_EVERY, each sent as it is made
        (the hub copies the first ones while the server lists the others), and from version 3 on it also carries
        the bytes each journal gained since the last push (`_new_bytes`)."""
        source = self._watch_source
        if source is None:
            source = self._watch_source = self._open(self._asked)
        if names is None or len(names) > wire.STATE_ENTRIES:
            return self._full_state(source)
        return self._changed_state(source, names)

    def _full_state(self, source: Any) -> Iterator[bytes]:
        """The whole state; then, once it is sent, the journals a burst pushed while it was listed (their push went
        out before it, and may be newer), listed again."""
        journals, skipped = source.journals(), source.skipped()
        entries: list[tuple[str, list[tuple[str, int]] | None]] = []
        listed_at: dict[str, float] = {}
        budget = time.monotonic() + YIELD_AT_MOST
        with _held(source) as held:
            for j in journals:
                self._yield(budget)
                listed_at[j] = time.monotonic()
                with held.holding(j):
                    entries += self._list(held, [j])[0]
        if self.version >= 3:
            # What the hub is told now is the base of the next push's bytes, for a journal no burst has listed. One
            # a burst listed keeps that listing: the burst's frame may reach the hub after this one (another thread
            # sends it), and a base newer than what the hub holds would make the next burst see no news (a journal
            # without checksum files, as the Go writer's, has nothing else to tell) where an older one costs a push
            # a few bytes more.
            listed = {j: segs for j, segs in entries if segs is not None}
            for j in list(self._listed):  # a copy: the bursts' thread changes it meanwhile
                if j not in listed:
                    self._listed.pop(j, None)
            for j, segs in listed.items():
                self._listed.setdefault(j, {name: (size, 0) for name, size in segs})
        step = wire.STATE_ENTRIES
        chunks = [entries[k : k + step] for k in range(0, len(entries), step)] or [[]]
        empty: list[wire.Pushed] | None = [] if self.version >= 3 else None
        # Its frames in one piece, sent at once: a burst's (sent by another thread) between them would end the
        # whole state the hub is putting together (`more` false), which it would then trust.
        yield b"".join(wire.encode(wire.state(k == 0, chunk, [], skipped if k == 0 else {}, k < len(chunks) - 1,
                                              empty)) for k, chunk in enumerate(chunks))  # fmt: skip
        again = [j for j, at in listed_at.items() if self._pushed_at.get(j, 0.0) > at]
        if again:  # each sent, news or not: the whole state just told the hub an older listing
            yield from self._changed_state(source, again, every=True)

    def _yield(self, budget: float) -> None:
        """Wait while a burst is under way, until time.monotonic() `budget` at most."""
        with self._bursts:
            if self._bursting:
                self.yields += 1
            for _ in range(1 << 30):  # until no burst is under way, or the budget is spent
                left = budget - time.monotonic()
                if not self._bursting or left <= 0:
                    return
                self._bursts.wait(left)

    def _changed_state(self, source: Any, names: list[str], every: bool = False) -> Iterator[bytes]:
        """STATE frames of the journals `names` (a burst: a whole state's listing waits for it, _yield)."""
        with self._bursts:
            self._bursting += 1
        try:
            yield from self._changed_frames(source, names, every)
        finally:
            with self._bursts:
                self._bursting -= 1
                self._bursts.notify_all()

    def _changed_frames(self, source: Any, names: list[str], every: bool) -> Iterator[bytes]:
        """STATE frames of the journals `names`, each listed and its new bytes read at once, its directories opened
        once for both (_Held): a burst of a thousand appends costs the server a third fewer system calls. A journal
        with no news since its last push is left out (not if `every`), and a burst with none sends nothing."""
        entries: list[tuple[str, list[tuple[str, int]] | None]] = []
        gone: list[str] = []
        pushed: list[wire.Pushed] | None = [] if self.version >= 3 else None
        total = 0
        began = time.monotonic()
        with _held(source) as held:
            for k, j in enumerate(names):
                with held.holding(j):
                    listed, missing = self._list(held, [j])
                    self._pushed_at[j] = time.monotonic()  # after its listing: a whole state listed before may be older
                    if missing:
                        self._listed.pop(j, None)
                    elif pushed is not None:
                        got, size, news = self._new_bytes(held, *listed[0], total)
                        pushed += got
                        total += size
                        if not news and not every:
                            listed = []  # the hub has this listing already: no pass of its for nothing
                entries += listed
                gone += missing
                if k + 1 < len(names) and time.monotonic() - began < PUSH_EVERY:
                    continue
                if entries or gone:  # else nothing new: nothing sent
                    yield wire.encode(wire.state(False, entries, gone, {}, False, pushed))
                entries, gone, total, began = [], [], 0, time.monotonic()
                pushed = [] if pushed is not None else None
        if not names:
            yield wire.encode(wire.state(False, [], [], {}, False, [] if self.version >= 3 else None))

    @staticmethod
    def _list(source: Any, journals: list[str]) -> tuple[list[tuple[str, list[tuple[str, int]] | None]], list[str]]:
        """(entries, gone) of a STATE: each journal's segments (None: the hub asks, and hears the error itself)."""
        entries: list[tuple[str, list[tuple[str, int]] | None]] = []
        gone: list[str] = []
        for j in journals:
            try:
                segs = source.segments(j)
            except FileNotFoundError:
                gone.append(j)
                continue
            except (SejError, OSError):
                entries.append((j, None))
                continue
            entries.append((j, None if len(segs) > wire.MAX_SEGMENTS else [(g.name, g.size) for g in segs]))
        return entries, gone

    def _new_bytes(self, source: Any, j: str, segs: list[tuple[str, int]] | None,
                   total: int) -> tuple[list[wire.Pushed], int, bool]:  # fmt: skip
        """The bytes journal `j`'s segments `segs` (as just listed) gained since its last push, and as much of their
        checksum files, read now, after the listing, and their size: at most wire.PUSH_JOURNAL, and wire.PUSH_FRAME
        with the frame's `total` so far (the hub keeps the end of what it was sent or read, and reads from a little
        before its copy's end). A journal that grew more, or whose files cannot be read, is left to the hub's reads
        (whose checks are the same: these are only early). Last, whether the hub is to hear of `j` at all: not when
        its listing and checksum files are those of its last push (an event that came after its listing, such as the
        checksum write after the segment's, listed it again)."""
        had = j in self._listed
        before = self._listed.pop(j, {})
        if segs is None:
            return [], 0, True
        now = self._listed[j] = {name: (end, before.get(name, (0, 0))[1]) for name, end in segs}
        mine: list[wire.Pushed] = []
        size = 0
        try:
            for k, (name, end) in enumerate(segs):
                old, old_sums = before.get(name, (0, -1))
                if end == old and k < len(segs) - 1:
                    continue  # not the last segment: its checksum file is written with it
                sums_size = self._sums_size(source, j, name)
                if end == old and (sums_size or 0) == old_sums:
                    continue
                start = old if end >= old else 0
                skip = old_sums if old_sums > SUM_HEADER.size and end >= old else 0
                if sums_size is not None and sums_size < skip:
                    skip = 0  # the checksum file was cut: whole
                want = end - start
                if sums_size is not None:
                    want += sums_size - skip + (SUM_HEADER.size if skip else 0)
                if size + want > wire.PUSH_JOURNAL or total + size + want > wire.PUSH_FRAME:
                    return [], 0, True  # too much: the hub reads it all
                # One read from the window before `start` on: the hub joins the new bytes to what it kept only if
                # that window matches what the file holds now (the file cut and written again, or another file).
                back = min(start, wire.PUSH_WINDOW)
                raw, dev, ino = self._read(source, j, name, start - back, end - start + back)
                if len(raw) < back:
                    return [], 0, True  # cut since the listing: the hub reads
                data = raw[back:]
                sums = source.read_sums(j, name, skip)
                sums_end = 0
                if sums is not None:  # only the records of bytes listed: those past wait for their listing
                    sums = _sums_upto(sums, end)
                    sums_end = (skip or SUM_HEADER.size) + len(sums) - SUM_HEADER.size
                now[name] = (end, sums_end)
                size += len(data) + (len(sums) if sums is not None else 0)
                if size > wire.PUSH_JOURNAL or total + size > wire.PUSH_FRAME:  # grew since
                    return [], 0, True
                check = (back, xxhash.xxh3_64_intdigest(raw[:back]), dev, ino)
                mine.append((j, name, start, data, skip, sums, check))
        except (SejError, OSError):  # the hub's reads hear the error themselves
            return [], 0, True
        return mine, size, bool(mine) or not had or now != before

    def _read(self, source: Any, journal: str, name: str, pos: int, size: int) -> tuple[bytes, int, int]:
        """`read(journal, name, pos, size)` as LocalSource answers it, and the file's st_dev and st_ino."""
        seg = segment_name(check_segment_name(name))
        with source._dir(journal, SEGMENT_DIR) as d:
            fd = open_regular(seg, dir_fd=d, show=os.path.join(self.source_root, journal, SEGMENT_DIR, seg))
        try:
            st = os.fstat(fd)
            return os.pread(fd, size, pos), st.st_dev, st.st_ino
        finally:
            os.close(fd)

    @staticmethod
    def _sums_size(source: Any, journal: str, name: str) -> int | None:
        """The size of a segment's checksum file, None without one (no link followed: LocalSource's own directory)."""
        with source._dir(journal, INDEX_DIR) as d:
            try:
                return os.stat(sum_name(check_segment_name(name)), dir_fd=d, follow_symlinks=False).st_size
            except FileNotFoundError:
                return None

    def _open(self, asked: str) -> Any:
        """The source of the root the hub asked for: ROOT, or a journal directly under it."""
        path = os.path.abspath(asked)  # a relative root is relative to the login's home, as over SFTP
        if path == self.root:
            source = LocalSource(self.root)
            self.source_root = source.root
            return source
        if self.restrict and os.path.dirname(path) == self.root:  # one journal of ROOT: never followed out
            self.source_root = self.root
            return _OneJournal(LocalSource(self.root), check_journal_name(os.path.basename(path)))
        if self.restrict:
            raise InvalidArgumentError(f"this key may read {self.root} only, not {asked!r}")
        raise InvalidArgumentError(f"this server serves {self.root}, not {asked!r}")

    def _call(self, method: str, args: list[Any]) -> Any:
        if method == "commit_offset":
            journal, reader, value, sweep = args
            if self.restrict and reader != self.reader:
                raise _Refused(f"this key may commit the reader {self.reader} only, not {reader!r}")
            # Restricted, the sweep of stale temp files (anyone's) is left to the producer's own tools.
            self.source.commit_offset(journal, reader, value, sweep and not self.restrict)
            return None
        got = getattr(self.source, method)(*args)
        if method == "journals":
            return [got, self.source.skipped()]
        if method == "segments":
            return [[s.name, s.size] for s in got]
        return got


def _sums_upto(sums: bytes, end: int) -> bytes:
    """`sums` (a checksum file's header, then its records from a record's start) up to its last whole record that
    covers bytes up to `end` at most: records past a segment's listed size are for bytes written since (the copy
    takes them for corrupt ones, sej.hub.copy._SumCheck.at_end)."""
    head = SUM_HEADER.size
    if len(sums) < head:
        return sums
    n = (len(sums) - head) // SUM_RECORD.size
    for k in range(n - 1, -1, -1):  # from the last: few were written since the listing
        if SUM_RECORD.unpack_from(sums, head + k * SUM_RECORD.size)[0] <= end:
            return sums[: head + (k + 1) * SUM_RECORD.size]
    return sums[:head]


class _Refused(SejError):
    """A call --restrict does not allow."""


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    for _ in range(len(data) + 1):  # each write writes at least one byte
        if not view:
            return
        view = view[os.write(fd, view) :]


def _read_all(fd: int) -> bytes:
    """What the hub has sent: one read, then whatever else is there already (up to GATHER bytes), so that a pass's
    calls sent together are answered together (its commits: one batch of syncs, sej.hub.serve_commit)."""
    data = os.read(fd, READ_SIZE)
    if not data:
        return data
    parts, size = [data], len(data)
    for _ in range(GATHER // READ_SIZE):
        if size >= GATHER or not select.select([fd], [], [], 0)[0]:
            break
        more = os.read(fd, READ_SIZE)
        if not more:  # the end: answered after what came before it, and seen by the next read
            break
        parts.append(more)
        size += len(more)
    return b"".join(parts)


def serve(root: str, restrict: bool = False, reader: str = "hub", stdin: int = 0, stdout: int = 1) -> int:
    """Serve `root` on `stdin`/`stdout` until the hub closes the stream; the exit code (0: a clean end).

    Whatever else writes to stdout (a stray print) would corrupt the stream: fd 1 is pointed at stderr and
    the protocol goes to a private copy of it.
    """
    if not os.path.isdir(root):
        raise InvalidArgumentError(f"{root} is not a directory")
    out = os.dup(stdout)
    if stdout == 1:
        os.dup2(2, 1)
    lock = threading.Lock()  # the session's replies and the watcher's pushes, whole frames each

    def send(data: bytes) -> None:
        with lock:
            _write_all(out, data)

    watcher: list[Any] = []

    def on_watch(path: str, journal: str | None) -> None:
        if watcher:  # once; a second WATCH asks for the whole state again (version 2)
            if watcher[0].state is not None:
                watcher[0].refresh()
            return
        from .serve_watch import Pusher

        watcher.append(Pusher(path, send, journal, session.state_frames if session.version >= 2 else None))

    session = Session(root, restrict, reader, on_watch)
    try:
        for _ in range(1 << 62):  # until the hub closes the stream
            data = _read_all(stdin)
            if not data:
                return 0 if session.decoder.pending == 0 else 1
            reply = session.receive(data)
            if reply:
                send(reply)
            if session.ended:
                return 1
        return 1
    except (BrokenPipeError, ConnectionResetError):
        return 0  # the hub went away
    finally:
        for w in watcher:
            w.close()
        session.close()
        os.close(out)


__all__ = ["Session", "serve"]
