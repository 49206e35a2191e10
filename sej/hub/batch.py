"""One pass over every journal of a source (`copy_all`), in batches: a thousand journals' work, not their round trips.

Per journal, `copy_journal` lists the source's segments, compares the hub's tail with the
source, reads what is new, fsyncs and commits the hub's reader offset: each a few SFTP
round trips, one after the other. A pass here does the same in phases, each phase for every
journal at once (Source.many, whose SFTP requests are in flight together):

1. probe: for each journal whose state the last pass left (`CopyState`), the size of the
   hub's last segment on the source, then, if it did not grow, whether the next segment exists
   (two lstats). Same size and no next segment: nothing to copy, and nothing else is asked (a
   writer names its next segment by the offset after the last message of this one, which the
   hub has). Grown: copy that segment without listing the journal, then look for the segment
   named by the hub's new next offset, and list and copy again if it exists. When some grew,
   the journals found unchanged are probed once more at once (writers are appending);
2. list the segments of the other journals, and read their hub offsets if unknown;
3. read the new bytes (with the CHECK_WINDOW bytes before them that copy_journal compares),
   in rounds of about PREFETCH_PER_ROUND bytes, spread over the workers' channels;
4. copy each journal with copy_journal over what was read (`Prefetched`), several at once:
   the same checks, the same writes and fsyncs, reads it lacks go to the source;
5. commit the hub offsets that changed, all at once (over the workers' channels), after every copy's fsync.

A pass is a `_Pass`, each phase one of its methods; what it remembers for the next is a CopyState (sej.hub.copy_state).
"""

from __future__ import annotations

import hashlib
import logging
import os
import queue
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any, NamedTuple, Protocol

from ..errors import InvalidArgumentError, UnsafeFileError
from ..fsutil import HAVE_SYNCFS
from ..layout import list_segments, parse_segment_name, segment_name
from ..shard.name import parse_shard
from . import copy as hub_copy
from .copy import CHECK_WINDOW, CopyResult, Destinations, SumsMark, SyncBatch, copy_journal, open_journals
from .copy_state import CopyState, Tail
from .names import destination_name
from .source import Call, Source, SourceSegment

log = logging.getLogger("sej.hub")

PREFETCH_PER_JOURNAL = 4 << 20
"""The most bytes of one journal read ahead in a pass; a bigger copy is read by copy_journal itself."""

MAX_FOLLOW_UPS = 2
"""Times a pass looks again at journals whose writer rolled over while it copied (a pass is bounded)."""

COPY_THREADS = 2
"""Threads copying journals whose new bytes were read ahead: that work is local and mostly Python (the
GIL), so more threads only contend (a 1,000-journal copy phase took 0.45 s with 1-2, 0.75 s with 8);
two let one fsync while the other runs."""

SYNCFS_FROM = 16
"""Journals in a round from which their copies are made durable by one syncfs (SyncBatch), not an fsync each:
fewer are fsynced each, so that a small pass does not write back everything else dirty on the hub's disk."""

PROBE_TOGETHER_RTT = 0.005
"""Seconds of a source's round trip (SftpSource.round_trip) from which the probe asks a journal's two lstats at once
instead of in two steps: on loopback the lstats it saves cost more than a round trip, far away less."""

PREFETCH_PER_ROUND = 64 << 20
"""Bytes read ahead for all journals at once: a pass handles its journals in rounds of about this much."""


class KeptSources(Protocol):
    """Sources kept between passes (sej.hub.location.Sources.kept, the daemon's), which keep files open."""

    def __call__(self, k: int) -> Source:
        """Source `k` (0 <= k < workers); each is used by one thread at a time."""

    def forget(self, journals: set[str]) -> None:
        """Let go of the files kept open for `journals`: the next read opens their paths afresh."""

    def tidy(self) -> None:
        """Close the files let go of, and those kept open for long (at the end of each pass)."""


class JournalOutcome(NamedTuple):
    journal: str
    result: CopyResult | None
    error: BaseException | None
    # What the pass found the hub behind by, when it looked (probe or listing), before copying it:
    lag_bytes: int | None = None  # the bytes the source had beyond the hub's end
    lag_messages: int | None = None  # their messages: those copied, and at least one per further segment
    producer_next: int | None = None  # the source's next offset as last seen (exact when all was copied)


def _beyond(segments: list[SourceSegment], name: str, size: int, next_offset: int) -> tuple[int, int]:
    """(bytes, a lower bound of the next offset) of the source's segments beyond a hub tail."""
    nbytes, producer_next = 0, next_offset
    for seg in segments:
        if name and seg.name < name:
            continue  # copied whole before the hub's last segment
        nbytes += max(0, seg.size - size) if seg.name == name else seg.size
        if seg.name != name and seg.size:
            producer_next = max(producer_next, seg.first_offset)
    return nbytes, producer_next


def seen_lag(segments: list[SourceSegment] | None, before: tuple[str, int] | None,
             result: CopyResult | None) -> tuple[int | None, int | None, int | None]:  # fmt: skip
    """(lag_bytes, lag_messages, producer_next) of a journal's copy: the source's segments as listed or probed,
    against the hub's tail before the copy (`before`: name, size) and after it (the hub's segments are byte
    copies of the source's, named alike)."""
    if segments is None or result is None or before is None:
        return None, None, None
    lag_bytes, _ = _beyond(segments, *before, result.next_offset)
    _, producer_next = _beyond(segments, result.segment, result.size, result.next_offset)
    return lag_bytes, result.messages + producer_next - result.next_offset, producer_next


class Prefetched:
    """A Source for copy_journal with a journal's listing, new bytes and hub offset already read.

    Anything not read ahead goes to the Source `source()` gives, asked for when first needed (most
    copies need none). `commit_offset` is kept (`commit`) for the pass to send with the others, after
    every copy's fsync.
    """

    defers_commit = True

    def __init__(
        self,
        source: Callable[[], Source],
        segments: list[SourceSegment] | None,
        data: dict[str, tuple[int, bytes, bool]],
        committed: int | None,
        sums: dict[str, tuple[int, bytes | None]] | None = None,
        mark: SumsMark | None = None,
        lister: Source | None = None,
    ) -> None:
        self._source = source
        self._got: Source | None = None
        self._lister = lister  # describes paths without a Source of its own
        self._segments = segments
        self._data = data  # segment name -> (start, bytes, they reach the end of the file as listed)
        self._committed = committed
        self._sums = sums or {}  # segment name -> (skip, its checksum file read so; None: it has none), read ahead
        self._mark = mark
        self.commit: int | None = None

    @property
    def source(self) -> Source:
        if self._got is None:
            self._got = self._source()
        return self._got

    def journals(self) -> list[str]:
        return self.source.journals()

    def skipped(self) -> dict[str, str]:
        return self.source.skipped()

    def segments(self, journal: str) -> list[SourceSegment]:
        return list(self._segments) if self._segments is not None else self.source.segments(journal)

    def size(self, journal: str, name: str) -> int | None:
        return self.source.size(journal, name)

    def read(self, journal: str, name: str, pos: int, size: int) -> bytes:
        got = self._data.get(name)
        if got is not None:
            start, data, to_end = got
            end = start + len(data)
            # Inside what was read; past its end only if that is the end of the file as listed.
            if start <= pos and (pos + size <= end or (to_end and pos <= end)):
                return data[pos - start : pos - start + size]
        return self.source.read(journal, name, pos, size)

    def read_sums(self, journal: str, name: str, skip: int = 0) -> bytes | None:
        got = self._sums.get(name)
        if got is not None and got[0] == skip:
            del self._sums[name]  # once: a second look (a later pass of copy_journal) reads it afresh
            return got[1]
        return self.source.read_sums(journal, name, skip)

    def sums_mark(self, journal: str, name: str) -> SumsMark | None:
        """How far the last pass read the checksum file of segment `name` (see sej.hub.copy.SumsMark)."""
        return self._mark if self._mark is not None and self._mark.segment == name else None

    def read_offset(self, journal: str, reader: str) -> int | None:
        return self._committed

    def commit_offset(self, journal: str, reader: str, value: int, sweep: bool = True) -> None:
        self.commit = value

    def describe(self, journal: str, name: str = "") -> str:
        return (self._lister or self.source).describe(journal, name)

    @property
    def remote(self) -> bool:
        return (self._lister or self.source).remote

    @property
    def reads_seen(self) -> bool:
        return False  # its reads of what was not read ahead come after the copy began: each lstats its segment

    @property
    def round_trip(self) -> float:
        return (self._lister or self.source).round_trip

    @property
    def broken(self) -> bool:
        return self._got is not None and self._got.broken

    def keep_handles(self, most: int) -> None:
        pass  # the pass's own sources keep their files (sej.hub.location.Sources.kept)

    def forget(self, journals: set[str] | None = None) -> None:
        pass  # as keep_handles: the pass's sources are told

    def tidy(self) -> None:
        pass  # as keep_handles

    def close(self) -> None:
        pass  # the pass closes its sources

    def many(self, calls: list[Call]) -> list[Any]:
        return self.source.many(calls)


class _Phases:
    """Seconds spent in each phase of a pass, and (when the debug log is on) the process's CPU seconds meanwhile."""

    def __init__(self) -> None:
        self.seconds: dict[str, list[float]] = {}
        # Only for the debug log: os.times in each phase of each pass cost a busy hub more than the bookkeeping.
        self.cpu = log.isEnabledFor(logging.DEBUG)

    @contextmanager
    def __call__(self, phase: str) -> Iterator[None]:
        t, cpu = time.monotonic(), _cpu() if self.cpu else 0.0
        try:
            yield
        finally:
            took = self.seconds.setdefault(phase, [0.0, 0.0])
            took[0] += time.monotonic() - t
            if self.cpu:
                took[1] += _cpu() - cpu

    def __str__(self) -> str:
        return ", ".join(f"{k} {s:.3f}s (cpu {c:.2f}s)" if self.cpu else f"{k} {s:.3f}s"
                         for k, (s, c) in self.seconds.items())  # fmt: skip


def _cpu() -> float:
    t = os.times()
    return t.user + t.system


class _Plan:
    """One journal's work in a pass."""

    def __init__(self, journal: str, dest_dir: str, tail: Tail | None, committed: int | None,
                 mark: SumsMark | None = None) -> None:  # fmt: skip
        self.journal, self.dest_dir, self.tail = journal, dest_dir, tail
        self.committed = committed
        self.mark = mark  # how far the last pass read the checksum file of the hub's last segment
        self.segments: list[SourceSegment] | None = None  # the source's, as listed (or probed)
        self.reads: list[tuple[str, int, int, bool]] = []  # (segment, start, size, to the end as listed)
        self.data: dict[str, tuple[int, bytes, bool]] = {}
        self.sums: dict[str, tuple[int, bytes | None]] = {}  # the producer's checksum files read ahead (skip, bytes)
        self.grown = False  # probed: only its hub's last segment grew, so it was not listed
        self.big = False  # more to copy than PREFETCH_PER_JOURNAL: copy_journal reads it itself
        self.hub_tail: tuple[str, int] | None = None  # the hub's last segment (name, size) before the copy

    def plan_reads(self) -> None:
        """Plan the reads of what the hub lacks, if that is at most PREFETCH_PER_JOURNAL bytes.

        A bigger copy is not read ahead at all: copy_journal reads it in large requests on its
        worker's own channel, several journals at once, and nothing is read twice.
        """
        assert self.segments is not None
        if self.grown and self.tail is not None:  # the hub's last segment as the state has it, its size just checked
            self.hub_tail = (self.tail.segment, self.tail.size)
        else:
            self.hub_tail = _hub_tail(self.dest_dir)
        have_name, have_size = self.hub_tail
        reads = []
        for seg in self.segments:
            if have_name and seg.name < have_name:
                continue  # before the hub's last segment: copied already
            start = max(0, have_size - CHECK_WINDOW) if seg.name == have_name else 0
            if seg.size > start:
                reads.append((seg.name, start, seg.size - start, True))
        self.big = sum(r[2] for r in reads) > PREFETCH_PER_JOURNAL
        if not self.big:
            self.reads = reads


def _hub_tail(dest_dir: str) -> tuple[str, int]:
    """The hub's last segment of a journal (name, size); ("", 0) before its first, or when the hub's copy
    cannot be read (copy_journal then reports why)."""
    try:
        segments = list_segments(dest_dir)
        if segments:
            return os.path.basename(segments[-1].path), os.stat(segments[-1].path).st_size
    except (OSError, UnsafeFileError):
        pass
    return "", 0


def copy_all(
    make_source: Callable[[], Source],
    dest_root: str,
    client_id: str,
    reader: str,
    workers: int = 4,
    stop: threading.Event | None = None,
    on_bytes: Callable[[int], None] | None = None,
    on_skip: Callable[[str, str], None] | None = None,
    state: CopyState | None = None,
    destinations: Destinations | None = None,
    kept: KeptSources | None = None,
) -> list[JournalOutcome]:
    """Copy every journal of a source, several at once; one journal's error does not stop the others.

    `make_source` gives the pass its source, and each worker its own (an SFTP channel each,
    over one connection). `on_skip(name, why)` hears of each directory under the source's root
    that is not a journal (default: a warning in the log); nothing is skipped silently.
    `state` carries what the last pass learned (the daemon's, or `sej copy`'s from its cache
    file), so unchanged journals cost two lstats; without it every journal is listed. A state
    with a `path` is saved there at the end. `destinations` keeps the hub's journals open
    between passes (the daemon's); without them, the pass keeps the journals it copies into open (and
    locked) until it ends, up to sej.hub.copy.open_journals(), which raises the process's open-files limit.
    `kept` gives the workers' sources kept between passes (the daemon's): each journal's reads and commits
    then go to the same one every pass, which keeps the journal's last segment and checksum file open.
    """
    return _Pass(make_source, dest_root, client_id, reader, workers, stop, on_bytes, on_skip, state, destinations,
                 kept).run()  # fmt: skip


_Copied = tuple[_Plan, JournalOutcome, Prefetched]
"""A journal's plan, the outcome of its copy, and the Prefetched source it copied from (its commit)."""


class _Pass:
    """One pass of `copy_all`, its phases in the order `run` calls them: find the journals and plan each one, probe
    those the state knows, list the others, then in rounds read ahead, copy, sync and commit; follow up the journals
    that rolled over meanwhile; commit the deferred offsets now due; close."""

    def __init__(
        self,
        make_source: Callable[[], Source],
        dest_root: str,
        client_id: str,
        reader: str,
        workers: int,
        stop: threading.Event | None,
        on_bytes: Callable[[int], None] | None,
        on_skip: Callable[[str, str], None] | None,
        state: CopyState | None,
        destinations: Destinations | None,
        kept: KeptSources | None,
    ) -> None:
        self.dest_root, self.client_id, self.reader, self.workers = dest_root, client_id, reader, workers
        self.stop, self.on_bytes, self.on_skip, self.kept = stop, on_bytes, on_skip, kept
        os.makedirs(dest_root, exist_ok=True)
        self.state = state if state is not None else CopyState()
        # Without the daemon's, the pass keeps the hub's journals open itself: a copy that goes on in a further
        # layer (see copy) must find its journal as the layer before left it, durable, not reopened.
        self.own_destinations = destinations is None
        self.destinations = destinations if destinations is not None else Destinations(open_journals())
        # The lister (the probe, listings, look-ups in this thread) is kept too: no channel opened per pass.
        self.lister = kept(workers) if kept is not None else make_source()
        self.local = threading.local()
        self.sources: list[Source] = [] if kept is not None else [self.lister]
        self.sources_lock = threading.Lock()
        # Far away, a worker's SFTP channel costs four round trips (open, subsystem, init, the source's first look):
        # opened ahead, in threads of their own, while the pass lists and probes (an idle pass closes them unused).
        # Nearby that saves nothing, and an idle pass would start sftp-servers for nothing.
        self.opening = _Opening(make_source)
        self.far = kept is None and self.lister.remote and self.lister.round_trip >= PROBE_TOGETHER_RTT
        if self.far:
            self.opening.start(workers)
        self.let_go: set[str] = set()  # journals whose files the kept sources are to let go of: gone, failed or stalled
        self.took = _Phases()
        self.outcomes: dict[str, JournalOutcome] = {}
        self.remote = False
        self.reads_seen = False
        self.one_stream = False
        self.idle: queue.SimpleQueue[int] = queue.SimpleQueue()  # the kept sources a copy may borrow
        self.pool: ThreadPoolExecutor | None = None  # the workers' calls and big copies (while `run` copies)
        self.local_pool: ThreadPoolExecutor | None = None  # the copies of what was read ahead

    def run(self) -> list[JournalOutcome]:
        try:
            ahead = self.probe_ahead()
            journals = self.find_journals()
            if ahead is None:
                plans = self.plan(journals)
                work = self.probe(plans)
            else:
                plans, work = ahead.settle(journals)
            # Over SFTP, reads and commits go over the workers' channels; a local source's calls stay in this
            # thread (a daemon thread in sej-hub): one stuck in the kernel must not hold up the process's exit,
            # as a pool thread would.
            self.remote = self.lister.remote
            self.reads_seen = self.lister.reads_seen  # SftpSource.read_seen: a read without an lstat first
            # sej serve (the daemon's sources say so): every call goes over the one pipelined stream, so spreading a
            # phase's calls over the workers' sources only cost a thread each (started anew each pass).
            self.one_stream = bool(getattr(self.lister, "one_stream", False))
            for k in range(self.workers if self.kept is not None else 0):
                self.idle.put(k)
            unchanged = len(plans) - len(work)
            calls_at_most = max(len(work), len(self.state.pending))  # channels: a pass's copies, or its commits due
            ways, copying = max(1, min(self.workers, calls_at_most)), max(1, min(self.workers, COPY_THREADS))
            with ThreadPoolExecutor(max_workers=ways) as self.pool, ThreadPoolExecutor(copying) as self.local_pool:
                for _ in range(MAX_FOLLOW_UPS + 1):
                    self.list_work(work)
                    grown, stalled, last = self.copy_rounds(work)
                    self.let_go |= stalled
                    work = self.commit_and_follow_up(last, grown, stalled)
                    if not work:
                        break
                self.commit_due()
            if self.kept is not None:
                self.kept.forget(self.let_go)
                self.kept.tidy()
            log.debug("%s: %d journals, %d probed unchanged; %s", self.lister.describe(""), len(journals), unchanged,
                      self.took)  # fmt: skip
            return [self.outcomes[j] for j in journals if j in self.outcomes]
        finally:
            self.close()

    def stopped(self) -> bool:
        return self.stop is not None and self.stop.is_set()

    def own_source(self) -> Source:
        """This thread's own source (a worker's channel), opened ahead or now; closed with the pass."""
        src = getattr(self.local, "source", None)
        if src is None:
            src = self.local.source = self.opening.take()
            with self.sources_lock:
                self.sources.append(src)
        return src

    def spread(self, calls: list[Call]) -> list[Any]:
        """`calls` over the workers' sources, each journal's to the same one."""
        assert self.pool is not None
        if self.kept is not None:
            return _spread_kept(self.pool, self.kept, calls, self.workers)
        return _spread(self.pool, self.own_source, calls, self.workers)

    def many(self) -> Callable[[list[Call]], list[Any]]:
        """Where the reads and commits go: the workers' sources over SFTP, the lister's thread locally or over one
        stream."""
        return self.spread if self.remote and not self.one_stream else self.lister.many

    def find_journals(self) -> list[str]:
        """The source's journals; those the state knows no longer are forgotten, and what is not one is reported."""
        with self.took("journals"):
            journals = self.lister.journals()
        self.let_go.update(self.state.tails.keys() - set(journals))
        self.state.keep_only(set(journals))
        for name, why in sorted(self.lister.skipped().items()):
            if self.on_skip is not None:
                self.on_skip(name, why)
            else:
                log.warning("%s: skipping %r: %s", self.lister.describe(""), name, why)
        return journals

    def plan(self, journals: list[str]) -> list[_Plan]:
        """A plan for each journal, with what the state knows of it; a journal whose hub name is invalid fails."""
        plans = []
        for j in journals:
            try:
                d = os.path.join(self.dest_root, destination_name(self.client_id, j))
            except InvalidArgumentError as e:  # a name no journal of ours can have: that journal fails
                log.error("%s", e, extra={"client": self.client_id, "journal": j})
                self.outcomes[j] = JournalOutcome(j, None, e)
                continue
            plans.append(_Plan(j, d, self.state.tail(j, d), self.state.expected(j), self.state.mark(j)))
        return plans

    def probe(self, plans: list[_Plan]) -> list[_Plan]:
        """The plans left to copy after the probe (_probe); when some grew, the unchanged ones are probed again."""
        with self.took("probe"):
            work = _probe(self.lister, plans, self.outcomes)
            if any(p.grown for p in work):
                # Writers are appending: one that appended just after the probe looked at its journal would wait for
                # this pass's copies and the next probe. The journals found unchanged are looked at once more, now.
                listed = {p.journal for p in work}
                work += _probe(self.lister, [p for p in plans if p.journal not in listed], self.outcomes)
        return work

    def probe_ahead(self) -> _ProbeAhead | None:
        """Far away (a fresh `sej copy`), the journals the state knows are probed while the root is listed, over a
        source of their own (a worker's SFTP channel, opened ahead; over sej serve, the same stream): one phase's
        round trips less, and over SFTP the listing's lstat of every jnl/ with it. None when not far, or the state
        knows no journal: the probe follows the listing."""
        if not self.far or not self.state.tails:
            return None
        return _ProbeAhead(self, self.plan(sorted(self.state.tails)))

    def list_work(self, work: list[_Plan]) -> None:
        """List the segments of the journals the probe did not settle (_list)."""
        with self.took("list"):
            _list(self.lister, work, self.reader)

    def copy_rounds(self, work: list[_Plan]) -> tuple[list[_Plan], set[str], list[_Copied]]:
        """Read, copy, sync and commit `work` in rounds (_rounds), but for the last round's commits, returned (see
        commit_and_follow_up); the probed journals that grew, and those of them that copied nothing (stalled, listed
        next: see _rolled_over)."""
        # The probe and the listing have just lstat'ed every segment the first round reads: no lstat again there (a
        # round later, after copies and syncs, each read lstats its segment itself).
        seen = self.reads_seen
        grown: list[_Plan] = []
        stalled: set[str] = set()
        last: list[_Copied] = []
        for batch in _rounds(work):
            if self.stopped():
                break
            self.commit(last)
            self.read(batch, seen)
            seen = False
            last = self.copy(batch)
            self.record(last, grown, stalled)
        return grown, stalled, last

    def commit_and_follow_up(self, done: list[_Copied], grown: list[_Plan], stalled: set[str]) -> list[_Plan]:
        """Commit the last round's hub offsets and look for the grown journals' next segments (follow_up) at once:
        over the network, the follow-up's lstats (on the lister) go while the commits (on the workers' sources)
        wait for their fsyncs on the producer, a round trip less."""
        if not self.remote or self.one_stream or not grown or not done:  # one stream: nothing beside the commits
            self.commit(done)
            return self.follow_up(grown, stalled)
        for _p, o, _src in done:  # the follow-up looks for the segments named by the copies' new tails
            if o.result is not None:
                self.state.remember(o.result)
        got: list[list[_Plan]] = []
        failed: list[BaseException] = []

        def follow() -> None:
            try:
                got.append(self.follow_up(grown, stalled))
            except BaseException as e:  # raised in this thread, after the commits
                failed.append(e)

        beside = threading.Thread(target=follow, name="sej-hub-follow-up", daemon=True)
        beside.start()
        try:
            self.commit(done)
        finally:
            beside.join()
        if failed:
            raise failed[0]
        for p in got[0]:  # as the commits left it (the plans were made while they went)
            p.committed = self.state.expected(p.journal)
        return got[0]

    def read(self, batch: list[_Plan], seen: bool) -> None:
        """Read ahead a round's new bytes (_read)."""
        with self.took("read"):
            _read(self.many(), batch, seen)

    def copy(self, batch: list[_Plan]) -> list[_Copied]:
        """Copy a round's journals, in layers of a segment each.

        Many copies: one syncfs makes them durable together, not an fsync each. Such a copy stops before a next
        segment while the current one is not durable (recovery looks at the last one only); it goes on after the
        syncfs, in a further layer."""
        done = self.layer(batch, self.sync_batch(len(batch)))
        index = {p.journal: k for k, (p, _o, _src) in enumerate(done)}
        again = [p for p, o, _src in done if _more(o)]
        for _ in range(max((len(p.segments or ()) for p in again), default=0)):  # each rolls over once
            if not again or self.stopped():
                break
            for p, o, src in self.layer(again, self.sync_batch(len(again))):
                k = index[p.journal]
                done[k] = (p, _continued(p, done[k][1], o), src if o.result is not None else done[k][2])
            again = [p for p in again if _more(done[index[p.journal]][1])]
        return done

    def sync_batch(self, copies: int) -> SyncBatch | None:
        """One syncfs for this many copies, or None: an fsync each (few copies, or no syncfs here)."""
        return SyncBatch(self.dest_root, self.destinations) if copies >= SYNCFS_FROM and HAVE_SYNCFS else None

    def layer(self, plans: list[_Plan], synced: SyncBatch | None) -> list[_Copied]:
        """Copy `plans` (the big ones reading on the workers' channels); with `synced`, made durable by it."""
        assert self.pool is not None and self.local_pool is not None
        try:
            with self.took("copy"):
                big = [self.pool.submit(self.copy_one, p, synced) for p in plans if p.big]
                small = [p for p in plans if not p.big]
                if synced is not None:  # no fsync to wait for: another thread would only contend for the GIL
                    done = [self.copy_one(p, synced) for p in small]
                else:
                    done = list(self.local_pool.map(lambda p: self.copy_one(p, synced), small))
                done += [f.result() for f in big]
            if synced is not None:
                with self.took("sync"):
                    done = _sync(synced, done, self.client_id)
            return done
        finally:
            if synced is not None:
                synced.close()

    def copy_one(self, p: _Plan, synced: SyncBatch | None) -> _Copied:
        """Copy one journal with copy_journal over what was read ahead; its error is its outcome."""
        borrowed: list[int] = []

        def source() -> Source:
            if self.kept is None:
                return self.own_source()
            # A kept source, idle while the pass copies (the reads and commits, which use them, are not under way):
            # no channel opened per pass. Given back when this copy ends.
            k = self.idle.get()
            borrowed.append(k)
            return self.kept(k)

        src = Prefetched(source, p.segments, p.data, p.committed, p.sums, p.mark, self.lister)
        try:
            result = copy_journal(src, p.journal, self.dest_root, self.client_id, self.reader, self.stop,
                                  self.on_bytes, destinations=self.destinations, batch=synced)  # fmt: skip
            return p, JournalOutcome(p.journal, result, None, *seen_lag(p.segments, p.hub_tail, result)), src
        except Exception as e:  # reported per journal; the others go on
            log.error("%s", e, extra={"client": self.client_id, "journal": p.journal})
            return p, JournalOutcome(p.journal, None, e), src
        finally:
            for k in borrowed:
                self.idle.put(k)

    def record(self, done: list[_Copied], grown: list[_Plan], stalled: set[str]) -> None:
        """Add a round's outcomes to the pass's, and note the probed journals that grew (and those that stalled)."""
        for p, outcome, _src in done:
            p.data, p.sums = {}, {}  # the bytes are written: free them before the next round
            self.outcomes[p.journal] = _added(self.outcomes.get(p.journal), outcome)
            if outcome.error is not None:
                self.let_go.add(p.journal)
            if p.grown and outcome.result is not None:
                grown.append(p)
                if _stalled(p, outcome.result, self.state):
                    stalled.add(p.journal)

    def commit(self, done: list[_Copied]) -> None:
        """Commit a round's hub offsets, all at once, after its copies are durable (_commit)."""
        if not done:
            return
        with self.took("commit"):
            _commit(self.many(), done, self.reader, self.state, self.outcomes, self.client_id)

    def follow_up(self, grown: list[_Plan], stalled: set[str]) -> list[_Plan]:
        """The grown journals whose writer rolled over while the pass copied them (_rolled_over)."""
        with self.took("probe"):
            return _rolled_over(self.lister, grown, self.state, stalled)

    def commit_due(self) -> None:
        """Commit the deferred hub offsets now due; on stop, all of them."""
        with self.took("commit"):
            _commit_pending(self.many(), self.state, self.reader, self.outcomes, self.client_id,
                            everything=self.stopped())  # fmt: skip

    def close(self) -> None:
        """Save the state, close the pass's sources and, unless the daemon's, the hub journals it kept open."""
        try:
            if self.kept is not None and self.let_go:  # a pass that failed: closed by the next pass's tidy
                self.kept.forget(self.let_go)
            self.state.save()
        finally:
            try:
                self.opening.close()
                for s in self.sources:
                    s.close()
            finally:
                if self.own_destinations:
                    self.destinations.close()


class _ProbeAhead:
    """The probe of the journals a state knows (`plans`) over a worker's source (opened ahead, given back after), in
    a thread of its own, while the pass lists the root (_Pass.probe_ahead); `settle` reconciles it with the listing."""

    def __init__(self, run: _Pass, plans: list[_Plan]) -> None:
        self.run, self.plans = run, plans
        self.work: list[_Plan] = []
        self.failed: list[BaseException] = []
        self.thread = threading.Thread(target=self._probe, name="sej-hub-probe", daemon=True)
        self.thread.start()

    def _probe(self) -> None:
        try:
            source = self.run.opening.take()  # here: the listing does not wait for its channel to open
            try:
                with self.run.took("probe"):
                    self.work = _probe(source, self.plans, self.run.outcomes)
            finally:
                if source.broken:
                    with self.run.sources_lock:
                        self.run.sources.append(source)  # closed with the pass
                else:
                    self.run.opening.give_back(source)  # a worker's, once the probe is done with it
        except BaseException as e:  # raised in the pass's thread by settle
            self.failed.append(e)

    def settle(self, journals: list[str]) -> tuple[list[_Plan], list[_Plan]]:
        """(plans, work) for the `journals` listed: those probed that are still there, then a plan for each journal
        the state did not know (never probed: copied as new); the outcomes of journals gone are dropped."""
        self.thread.join()
        if self.failed:
            raise self.failed[0]
        listed = set(journals)
        probed = {p.journal for p in self.plans}
        for j in probed - listed:
            self.run.outcomes.pop(j, None)
        new = self.run.plan([j for j in journals if j not in probed])
        plans = [p for p in self.plans if p.journal in listed] + new
        work = [p for p in self.work if p.journal in listed] + new
        if any(p.grown for p in work):  # as _Pass.probe: the journals found unchanged are looked at once more
            again = {p.journal for p in work}
            with self.run.took("probe"):
                work += _probe(self.run.lister, [p for p in plans if p.journal not in again], self.run.outcomes)
        return plans, work


class _Opening:
    """Sources opened ahead for a pass's workers, each in a thread of its own; `take` gives one (or makes one)."""

    def __init__(self, make_source: Callable[[], Source]) -> None:
        self._make = make_source
        self._lock = threading.Lock()
        self._futures: list[Future[Source]] = []
        self._pool: ThreadPoolExecutor | None = None

    def start(self, n: int) -> None:
        """Open `n` sources ahead (once a pass: a second call does nothing)."""
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(max_workers=max(1, n), thread_name_prefix="sej-hub-open")
                self._futures = [self._pool.submit(self._make) for _ in range(n)]

    def take(self) -> Source:
        with self._lock:
            ahead = self._futures.pop(0) if self._futures else None
        return ahead.result() if ahead is not None else self._make()

    def give_back(self, source: Source) -> None:
        """A source taken and no longer used, for the next `take` (closed by `close` if none takes it)."""
        done: Future[Source] = Future()
        done.set_result(source)
        with self._lock:
            self._futures.insert(0, done)

    def close(self) -> None:
        """Close the sources opened ahead and not taken (waiting for those still opening)."""
        with self._lock:
            left, self._futures = self._futures, []
            pool = self._pool
        for f in left:
            try:
                f.result().close()
            except Exception as e:  # one that failed to open: nothing to close, and no pass used it
                log.debug("a source opened ahead: %s", e)
        if pool is not None:
            pool.shutdown(wait=True)


def commit_pending(make_source: Callable[[], Source], state: CopyState, reader: str, client_id: str) -> None:
    """Commit every deferred hub offset of `state` (sej-hub, on stop), without a pass: over one source."""
    if not state.pending:
        return
    src = make_source()
    try:
        _commit_pending(src.many, state, reader, {}, client_id, everything=True)
    finally:
        src.close()


def _probe(lister: Source, plans: list[_Plan], outcomes: dict[str, JournalOutcome]) -> list[_Plan]:
    """Settle the journals whose hub copy is the source's whole last segment (the outcome: nothing
    copied); the plans left, with the source's segments when the probe tells them.

    Two steps: the size of every hub's last segment on the source, then, only for those that did not
    grow, whether the next segment exists. A grown one is copied without that lstat: a writer rolls over
    after its last message, so the next segment can only follow what it appended (_rolled_over looks
    for it after the copy, named by the hub's new next offset). Over a source whose round trip takes
    PROBE_TOGETHER_RTT or more, both lstats of every journal go at once (one round trip)."""
    known = [(p, p.tail) for p in plans if p.tail is not None and p.committed == p.tail.next_offset]
    # Far away, a round trip costs more than the lstats saved: both at once then, as one step.
    together = lister.round_trip >= PROBE_TOGETHER_RTT
    # A hub's last segment that is empty is the next one itself: nothing after it to look for.
    nexts = [(p, t) for p, t in known if segment_name(t.next_offset) != t.segment]
    calls: list[Call] = [("size", p.journal, t.segment) for p, t in known]
    if together:
        calls += [("size", p.journal, segment_name(t.next_offset)) for p, t in nexts]
    got = lister.many(calls) if calls else []
    sizes, ahead = got[: len(known)], got[len(known) :]
    if not together:  # only the segments that did not grow are asked for a successor
        same = {p.journal for (p, t), size in zip(known, sizes, strict=True) if size == t.size}
        nexts = [(p, t) for p, t in nexts if p.journal in same]
        ahead = lister.many([("size", p.journal, segment_name(t.next_offset)) for p, t in nexts]) if nexts else []
    following = {p.journal: g for (p, _t), g in zip(nexts, ahead, strict=True)}
    work = [p for p in plans if p.tail is None or p.committed != p.tail.next_offset]
    for (p, t), size in zip(known, sizes, strict=True):
        if size == t.size and following.get(p.journal) is None:
            outcomes[p.journal] = JournalOutcome(p.journal, CopyResult(p.journal, p.dest_dir, 0, 0, t.next_offset,
                                                                       t.segment, t.size), None, 0, 0,
                                                 t.next_offset)  # fmt: skip
            continue
        outcomes.pop(p.journal, None)  # found unchanged by a first probe, it is not (see copy_all)
        if isinstance(size, int) and size > t.size and following.get(p.journal) is None:
            # It grew. The writer may have rolled over since (to a segment named by the offset after
            # this one's last message): copy this one, then _rolled_over looks for that name.
            p.segments = [SourceSegment(parse_segment_name(t.segment) or 0, t.segment, size)]
            p.grown = True
        # Else rolled over, shrunk, gone, or an error: listed (copy_journal reports errors as its own).
        work.append(p)
    return work


def _stalled(p: _Plan, result: CopyResult, state: CopyState) -> bool:
    """Whether a probed (grown) journal's copy made no progress and was not listed at this state yet (so that a
    segment that stays so, a crashed writer's bytes without their checksums, costs one listing, not one a pass)."""
    if result.bytes or p.tail is None or not p.segments:
        state.stalled.pop(p.journal, None)
        return False
    at = (p.tail.segment, p.tail.size, p.segments[0].size)
    if state.stalled.get(p.journal) == at:
        return False
    state.stalled[p.journal] = at
    return True


def _rolled_over(lister: Source, grown: list[_Plan], state: CopyState, stalled: set[str]) -> list[_Plan]:
    """Plans (to be listed) for the grown journals whose writer has rolled over to a next segment, and for those
    whose copy made no progress (`stalled`): the segment grew but nothing more of it can be copied as the last
    one (bytes no checksum covers, records lost), so only a listing shows whether a later segment ends it."""
    tails = [state.tails[p.journal] for p in grown]
    calls: list[Call] = [("size", p.journal, segment_name(t.next_offset)) for p, t in zip(grown, tails, strict=True)]
    out = []
    for p, t, got in zip(grown, tails, lister.many(calls) if calls else [], strict=True):
        if (got is not None and segment_name(t.next_offset) != t.segment) or p.journal in stalled:
            out.append(_Plan(p.journal, p.dest_dir, t, state.expected(p.journal), state.mark(p.journal)))
    return out


def _added(before: JournalOutcome | None, after: JournalOutcome) -> JournalOutcome:
    """A journal's outcome over two copies in one pass: the messages and bytes of both. When the second
    failed, the result of the first stays with its error: those messages are at the hub."""
    if before is None or before.result is None:
        return after
    if after.result is None:
        return before._replace(error=after.error)
    b, a = before.result, after.result
    return after._replace(result=a._replace(messages=b.messages + a.messages, bytes=b.bytes + a.bytes),
                          lag_bytes=_plus(before.lag_bytes, after.lag_bytes),
                          lag_messages=_plus(before.lag_messages, after.lag_messages))  # fmt: skip


def _continued(p: _Plan, before: JournalOutcome, after: JournalOutcome) -> JournalOutcome:
    """A journal's outcome after a further layer of its copy in the same round (see copy_all): the messages
    and bytes of both, the lag as found before the first. When the layer failed, what the earlier ones copied
    stays with its error: it is durable at the hub, and committed."""
    if after.result is None or before.result is None:
        return before._replace(error=after.error)
    b, a = before.result, after.result
    merged = a._replace(messages=b.messages + a.messages, bytes=b.bytes + a.bytes)
    return JournalOutcome(p.journal, merged, None, *seen_lag(p.segments, p.hub_tail, merged))


def _more(o: JournalOutcome) -> bool:
    """Whether a journal's copy goes on in a next layer: it stopped before a next segment, without error."""
    return o.error is None and o.result is not None and o.result.more


def _plus(a: int | None, b: int | None) -> int | None:
    return None if a is None or b is None else a + b


def _list(lister: Source, work: list[_Plan], reader: str) -> None:
    """List the journals' segments and read the hub offsets not known, all at once; plan the reads."""
    calls: list[Call] = []
    asked: list[tuple[_Plan, str]] = []
    for p in work:
        if p.segments is None:
            calls.append(("segments", p.journal))
            asked.append((p, "segments"))
        # Without a hub copy, the offset on the source matters to nothing before the copy commits its own (an
        # initial pass over 1,000 journals saves 2 to 7 requests each); a copy of nothing then commits anyway.
        if p.committed is None and (p.tail is not None or os.path.lexists(p.dest_dir)):
            calls.append(("read_offset", p.journal, reader))
            asked.append((p, "committed"))
    for (p, what), got in zip(asked, lister.many(calls) if calls else [], strict=True):
        if not isinstance(got, BaseException):  # else copy_journal asks again, and reports the error
            setattr(p, what, got)
    for p in work:
        if p.segments is not None:
            p.plan_reads()


def _rounds(work: list[_Plan]) -> Iterator[list[_Plan]]:
    """The plans in rounds that read ahead about PREFETCH_PER_ROUND bytes each."""
    batch: list[_Plan] = []
    size = 0
    for p in work:
        batch.append(p)
        size += sum(r[2] for r in p.reads)
        if size >= PREFETCH_PER_ROUND:
            yield batch
            batch, size = [], 0
    if batch:
        yield batch


def _read(many: Callable[[list[Call]], list[Any]], batch: list[_Plan], seen: bool = False) -> None:
    """Read ahead what each journal of a round lacks, and the checksum files of the segments it copies into,
    all at once. Over SFTP `many` spreads them over the workers' channels, so several sftp-servers serve
    them (1,000 small reads: 0.16-0.22 s, 0.46 s on one); a checksum file read by each copy instead cost a
    round trip per journal in the copy phase (0.8 s of a 1,000-journal pass). `seen`: the probe or the
    listing has just lstat'ed the segments (read_seen, no lstat again)."""
    reads: list[Call] = []
    wanted: list[tuple[_Plan, str, int, int, bool]] = []
    sums: list[Call] = []
    sums_of: list[tuple[_Plan, str, int]] = []
    for p in batch:
        have_name, have_size = p.hub_tail or ("", 0)
        for name, start, size, to_end in p.reads:
            reads.append(("read_seen" if seen else "read", p.journal, name, start, size))
            wanted.append((p, name, start, size, to_end))
            if hub_copy.VERIFY and start + size > (have_size if name == have_name else 0):  # bytes to copy: checked
                # From the last pass's mark on, as copy_journal will ask (it checks the mark's anchor).
                skip = p.mark.skip(name, have_size) if p.mark is not None else 0
                sums.append(("read_sums", p.journal, name, skip))
                sums_of.append((p, name, skip))
    got_all = many(reads + sums) if reads else []
    for (p, name, start, size, to_end), got in zip(wanted, got_all[: len(reads)], strict=True):
        if isinstance(got, bytes):
            # Fewer bytes than asked: not the end of the file as listed (it shrank, or a short read).
            p.data[name] = (start, got, to_end and len(got) == size)
    for (p, name, skip), got in zip(sums_of, got_all[len(reads) :], strict=True):
        if got is None or isinstance(got, bytes):  # an error: copy_journal asks again, and reports it
            p.sums[name] = (skip, got)


def _spread(pool: ThreadPoolExecutor, own_source: Callable[[], Source], calls: list[Call], ways: int) -> list[Any]:
    """`many(calls)` split over the workers' sources (SFTP channels): a producer's sftp-server answers one
    channel's requests one after the other, so its fsyncs of the offset files run `ways` at once."""
    if not calls:
        return []
    n = -(-len(calls) // max(1, ways))
    parts = [calls[i : i + n] for i in range(0, len(calls), n)]
    return [r for got in pool.map(lambda part: own_source().many(part), parts) for r in got]


def _home(journal: str, ways: int) -> int:
    """The kept source of a journal's calls: the same every pass, so the files it keeps open are there. The
    shards of one prefix go round the sources in index order (a hash of their names would not spread 4 shards
    over 2 sources evenly); each prefix starts at a place of its own."""
    try:
        shard = parse_shard(journal)
        start, index = f"{shard.prefix}.{shard.bit}", shard.index
    except InvalidArgumentError:
        start, index = journal, 0
    digest = hashlib.blake2b(start.encode("utf-8", "surrogateescape"), digest_size=8).digest()
    return (int.from_bytes(digest, "big") + index) % max(1, ways)


def _spread_kept(pool: ThreadPoolExecutor, kept: KeptSources, calls: list[Call], ways: int) -> list[Any]:
    """`many(calls)` over the kept sources, each journal's calls to its home (`_home`)."""
    if not calls:
        return []
    ways = max(1, ways)
    parts: list[list[int]] = [[] for _ in range(ways)]
    for i, c in enumerate(calls):
        parts[_home(c[1], ways)].append(i)
    busy = [k for k in range(ways) if parts[k]]
    out: list[Any] = [None] * len(calls)
    for k, got in zip(busy, pool.map(lambda k: kept(k).many([calls[i] for i in parts[k]]), busy), strict=True):
        for i, r in zip(parts[k], got, strict=True):
            out[i] = r
    return out


def _sync(
    synced: SyncBatch, done: list[tuple[_Plan, JournalOutcome, Prefetched]], client_id: str
) -> list[tuple[_Plan, JournalOutcome, Prefetched]]:
    """Make a round's copies durable (`synced.sync()`); if that fails, each of its copies fails, uncommitted."""
    try:
        synced.sync()
        return done
    except OSError as e:
        out = []
        for p, o, src in done:
            if p.dest_dir in synced.failed:
                log.error("%s: the copy could not be made durable: %s", p.dest_dir, e,
                          extra={"client": client_id, "journal": p.journal})  # fmt: skip
                src.commit = None
                o = JournalOutcome(p.journal, None, e)
            out.append((p, o, src))
        return out


def _commit(
    many: Callable[[list[Call]], list[Any]],
    done: list[tuple[_Plan, JournalOutcome, Prefetched]],
    reader: str,
    state: CopyState,
    outcomes: dict[str, JournalOutcome],
    client_id: str,
) -> None:
    """Commit the hub offsets the copies asked for, all at once (each copy has been fsynced); those of journals
    committed less than state.commit_interval ago wait (`_commit_pending`)."""
    asked: list[tuple[str, int]] = []
    first: set[str] = set()
    now = time.monotonic()
    for p, o, src in done:
        if o.result is not None:
            state.remember(o.result)
        if src.commit is not None:
            if not state.defer(p.journal, src.commit, now):
                asked.append((p.journal, src.commit))
                if p.committed is None:  # the hub's first commit there: the next one sweeps (see _commit_now)
                    first.add(p.journal)
        elif o.result is not None and p.committed is not None and p.journal not in state.pending:
            state.remember_committed(p.journal, p.committed)
    _commit_now(many, state, reader, outcomes, client_id, asked, now, first)


def _commit_pending(
    many: Callable[[list[Call]], list[Any]],
    state: CopyState,
    reader: str,
    outcomes: dict[str, JournalOutcome],
    client_id: str,
    everything: bool,
) -> None:
    """Commit the deferred hub offsets that are due (`everything`: all), all at once. One whose hub copy changed
    since (its tail was dropped: cut back, removed) is not committed: the next pass lists it and commits its own."""
    now = time.monotonic()
    for j in [j for j in state.pending if j not in state.tails]:
        del state.pending[j]
    _commit_now(many, state, reader, outcomes, client_id, state.due(now, everything), now)


def _commit_now(many: Callable[[list[Call]], list[Any]], state: CopyState, reader: str,
                outcomes: dict[str, JournalOutcome], client_id: str, asked: list[tuple[str, int]],
                now: float, first: set[str] | frozenset[str] = frozenset()) -> None:  # fmt: skip
    """Commit each (journal, hub offset) of `asked`, all at once, at `now` (time.monotonic()), sweeping the ofs/
    of those whose sweep is due, except the hub's `first` commits there (an initial copy of a thousand journals
    saves a listing each; the next commit sweeps); remember them. A failed one is logged and its journal's
    outcome gets the error (copied and counted, not committed)."""
    if not asked:
        return
    wall = time.time()
    sweeps = [j not in first and state.sweep_due(j, wall) for j, _value in asked]
    results = many([("commit_offset", j, reader, v, sweep) for (j, v), sweep in zip(asked, sweeps, strict=True)])
    for (j, value), sweep, got in zip(asked, sweeps, results, strict=True):
        if isinstance(got, BaseException):
            log.error("%s", got, extra={"client": client_id, "journal": j, "committing": value})
            state.remember_committed(j, None)
            if j in outcomes:
                outcomes[j] = outcomes[j]._replace(error=got)
        else:
            state.remember_committed(j, value, at=now)
            if sweep:
                state.swept[j] = wall
                state.changed = True


__all__ = ["JournalOutcome", "Prefetched", "commit_pending", "copy_all"]
