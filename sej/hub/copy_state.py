"""What a client's passes remember between passes (`CopyState`), so that an unchanged journal costs two lstats.

The daemon keeps it in memory; `sej copy` keeps it in the user's cache between runs (`state_file`).
sej.hub.batch reads and updates it in each pass.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import random
from typing import Any, NamedTuple

from ..checksum import HEADER as SUM_HEADER
from ..checksum import RECORD
from ..errors import InvalidArgumentError, UnsafeFileError
from ..fsutil import atomic_write, read_regular
from ..layout import check_reader_name, parse_segment_name, segment_dir
from .copy import CopyResult, SumsMark
from .names import check_client_id, check_journal_name

log = logging.getLogger("sej.hub")


SWEEP_EVERY = 3600.0
"""Seconds between two sweeps of a journal's ofs/ on the source for the temp files that killed commits left
(sej.offset.STALE_TEMP_AGE): a sweep lists ofs/, four more requests to a commit's eight."""


class Tail(NamedTuple):
    """The hub's copy of a journal after a pass: its last segment's name and size, and its next offset."""

    segment: str
    size: int
    next_offset: int


STATE_VERSION = 1
MAX_STATE = 64 << 20
"""The largest state file read (a million journals' entries); a bigger one is ignored."""


def state_file(source: str, dest_root: str, client_id: str, reader: str) -> str:
    """Where `sej copy` keeps the CopyState of one source, hub root, client id and reader between runs:
    the user's cache ($XDG_CACHE_HOME, else ~/.cache) under sej/copy/, never in the hub root."""
    key = "\0".join((source, os.path.realpath(dest_root), check_client_id(client_id), check_reader_name(reader)))
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(cache, "sej", "copy", hashlib.sha256(key.encode()).hexdigest()[:32] + ".json")


class CopyState:
    """What a client's passes remember between passes, so an unchanged journal costs two lstats.

    `tails`: each journal's Tail after the last pass (trusted only while the hub's segment
    file still has that size); `committed`: the hub offset known to be on the source; `sums`:
    how far the producer's checksum file of that segment was read (a SumsMark, checked before use).

    It is a cache, kept in `path` (`state_file`) when given: `load` ignores a missing,
    unreadable or malformed file and any malformed entry, and `save` writes it only after a
    change, atomically but without fsync. Losing it costs one pass a listing of every journal;
    a stale one is caught by the size check of each tail, or at worst leaves an offset on the
    source older than the hub's, until that journal's next change is copied.
    """

    def __init__(self, path: str | None = None) -> None:
        self.path = path
        self.tails: dict[str, Tail] = {}
        self.committed: dict[str, int] = {}
        self.sums: dict[str, SumsMark] = {}
        # Journals probed grown whose copy made no progress, listed at this (hub segment, hub size, source size):
        # not listed again until one of them changes (kept in memory only).
        self.stalled: dict[str, tuple[str, int, int]] = {}
        # Commits deferred (the daemon's commit_interval, 0: none): journal -> the hub offset to commit on the
        # source, and when each journal was last committed (time.monotonic) with the fraction of commit_interval
        # after which its next commit is due, so a changed commit_interval applies at once; in memory only.
        self.commit_interval = 0.0
        self.pending: dict[str, int] = {}
        self.commit_due: dict[str, tuple[float, float]] = {}
        # When each journal's ofs/ was last swept of stale commit temp files (time.time(), saved), and how often.
        self.swept: dict[str, float] = {}
        self.sweep_every = SWEEP_EVERY
        self.changed = False

    @classmethod
    def load(cls, path: str) -> CopyState:
        state = cls(path)
        try:
            raw = json.loads(read_regular(path, MAX_STATE + 1))
        except FileNotFoundError:
            return state
        except (OSError, ValueError, UnsafeFileError) as e:
            log.warning("%s: ignoring the hub's copy state (%s); this pass lists every journal", path, e)
            return state
        entries = raw.get("journals") if isinstance(raw, dict) and raw.get("version") == STATE_VERSION else None
        for journal, entry in (entries if isinstance(entries, dict) else {}).items():
            try:
                check_journal_name(journal)
                seg, size, next_offset, committed, *more = entry
                if (parse_segment_name(seg) is None or not all(type(v) is int and v >= 0 for v in (size, next_offset))
                        or not (committed is None or (type(committed) is int and committed >= 0))):  # fmt: skip
                    continue
            except (InvalidArgumentError, TypeError, ValueError):
                continue  # a malformed entry: that journal is listed
            state.tails[journal] = Tail(seg, size, next_offset)
            if committed is not None:
                state.committed[journal] = committed
            mark = _load_mark(seg, more[0] if len(more) == 1 else None)
            if mark is not None:
                state.sums[journal] = mark
        swept = raw.get("swept") if entries is not None else None
        for journal, at in (swept if isinstance(swept, dict) else {}).items():
            if journal in state.tails and type(at) is float and math.isfinite(at):  # saved from time.time()
                state.swept[journal] = at
        return state

    def save(self) -> None:
        """Write the state to `path` if it changed since loaded or saved; an error is only logged."""
        if self.path is None or not self.changed:
            return
        entries = {j: [t.segment, t.size, t.next_offset, self.committed.get(j), *_saved_mark(t, self.sums.get(j))]
                   for j, t in self.tails.items()}  # fmt: skip
        swept = {j: at for j, at in self.swept.items() if j in self.tails}
        data = json.dumps({"version": STATE_VERSION, "journals": entries, "swept": swept},
                          separators=(",", ":")).encode()  # fmt: skip
        try:
            os.makedirs(os.path.dirname(self.path), exist_ok=True)
            try:
                atomic_write(self.path, data, durable=False)
            except UnsafeFileError:  # not a regular file (load ignored it): our cache's name, so replaced
                os.unlink(self.path)
                atomic_write(self.path, data, durable=False)
            self.changed = False
        except (OSError, UnsafeFileError) as e:
            log.warning("%s: cannot save the hub's copy state: %s", self.path, e)

    def tail(self, journal: str, dest_dir: str) -> Tail | None:
        t = self.tails.get(journal)
        if t is None or not t.segment:
            return None
        try:
            if os.stat(os.path.join(segment_dir(dest_dir), t.segment), follow_symlinks=False).st_size == t.size:
                return t
        except OSError:
            pass
        del self.tails[journal]
        self.changed = True
        return None

    def remember(self, result: CopyResult) -> None:
        t = Tail(result.segment, result.size, result.next_offset)
        if self.tails.get(result.journal) != t:
            self.tails[result.journal] = t
            self.changed = True
        mark = result.sums if result.sums is not None else self.sums.get(result.journal)
        if mark is not None and mark.segment != result.segment:
            mark = None  # of a segment the hub has finished
        if self.sums.get(result.journal) != mark:
            if mark is None:
                del self.sums[result.journal]
            else:
                self.sums[result.journal] = mark
            self.changed = True

    def mark(self, journal: str) -> SumsMark | None:
        return self.sums.get(journal)

    def keep_only(self, journals: set[str]) -> None:
        """Forget the journals a pass no longer found on the source."""
        per_journal: tuple[dict[str, Any], ...] = (self.tails, self.committed, self.sums, self.stalled, self.pending,
                                                    self.commit_due, self.swept)  # fmt: skip
        for gone in set().union(*per_journal) - journals:
            for entries in per_journal:
                entries.pop(gone, None)
            self.changed = True

    def expected(self, journal: str) -> int | None:
        """The hub offset on the source once the pending commit (if any) is made: what the hub has committed."""
        return self.pending.get(journal, self.committed.get(journal))

    def defer(self, journal: str, value: int, now: float) -> bool:
        """Whether the commit of `value` waits, kept pending: the journal's next commit is not due yet (the first
        one always is)."""
        if self.commit_interval <= 0 or self._is_due(journal, now):
            return False
        self.pending[journal] = value
        return True

    def due(self, now: float, everything: bool = False) -> list[tuple[str, int]]:
        """The pending commits that are due (`everything`, or no commit_interval: all of them)."""
        every = everything or self.commit_interval <= 0
        return [(j, v) for j, v in self.pending.items() if every or self._is_due(j, now)]

    def sweep_due(self, journal: str, now: float) -> bool:
        """Whether a commit of `journal` at `now` (time.time()) also sweeps its ofs/ (SWEEP_EVERY, `sweep_every`)."""
        last = self.swept.get(journal)
        return last is None or not last <= now < last + self.sweep_every  # also when the clock went back

    def _is_due(self, journal: str, now: float) -> bool:
        last = self.commit_due.get(journal)
        return last is None or now >= last[0] + self.commit_interval * last[1]

    def remember_committed(self, journal: str, value: int | None, at: float | None = None) -> None:
        """`value` is the hub offset on the source (None: not known); `at`: a commit made then."""
        if value is None or at is not None or self.pending.get(journal) == value:
            self.pending.pop(journal, None)  # a commit made carries the latest offset
        if at is not None:
            # Due again in 1/2 to 1 commit_interval: journals copied together (every one, in a busy pass) spread
            # their commits over the following passes instead of all coming due in one.
            self.commit_due[journal] = (at, 0.5 + 0.5 * random.random())
        if self.committed.get(journal) != value:
            if value is None:
                del self.committed[journal]
            else:
                self.committed[journal] = value
            self.changed = True


def _load_mark(segment: str, raw: Any) -> SumsMark | None:
    """A SumsMark from a state file's entry ([offset, end, digest]); None when malformed."""
    if not (isinstance(raw, list) and len(raw) == 3 and all(type(v) is int and v >= 0 for v in raw)):
        return None
    offset, end, digest = raw
    if offset < SUM_HEADER.size + RECORD.size or (offset - SUM_HEADER.size) % RECORD.size or digest >= 1 << 64:
        return None
    return SumsMark(segment, offset, end, digest)


def _saved_mark(tail: Tail, mark: SumsMark | None) -> list[list[int]]:
    return [[mark.offset, mark.end, mark.digest]] if mark is not None and mark.segment == tail.segment else []
