"""The hub daemon: copy every configured producer's journals, pass after pass.

`Hub(config).run_once()` makes one pass: for every client at once (a thread
each), connect (SSH, or nothing for a local root), look at the client's root
(so new shards are found on the next pass; a kept SFTP channel lists it again
only when it changed, see SftpSource.journals) and copy what the hub lacks with
`sej.hub.copy.copy_all`. A client that fails is logged and reported; the others
go on. `run_forever(stop)` repeats the pass for each client every
`poll_interval` seconds, keeps its SSH connection open between passes, and after
a failure (no connection, a lost connection, a missing root) retries with
exponential backoff up to `backoff_max`. Setting `stop` (the console script does
it on SIGTERM/SIGINT) ends every copy after its current chunk, which the copy
engine always completes with an fsync.

Every wait is bounded: connecting (CONNECT_TIMEOUT), each SFTP read (IO_TIMEOUT),
every other call to a producer (STALL_TIMEOUT, enforced by a watchdog), the pause
between passes, and stopping (STOP_TIMEOUT). Each pass runs in a thread of its own
that the client only waits for: when a call stalls, the watchdog closes the client's
SSH connection (the call then fails) and the client stops waiting for the pass,
which is reported as failed (StalledError); a local call stuck in the kernel (a
hung network filesystem) cannot be interrupted, so its pass is abandoned and no
new pass of that client starts until it returns. A process that exits with such
a thread still stuck ends with os._exit (sej-hub: sej.apps.hub.exit_process).
"""

from __future__ import annotations

import gc
import itertools
import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import IO, Any

from ..errors import ChecksumError, CorruptionError, SejError
from ..layout import HUB_LOCK
from ..lock import lock_file
from .batch import JournalOutcome, commit_pending, copy_all
from .config import ClientConfig, HubConfig
from .copy import CopyError, Destinations, SumsMark, open_journals
from .copy_state import CopyState
from .location import KeptOf, Sources, open_sources, transport_errors
from .source import CONNECT_TIMEOUT, IO_TIMEOUT, Call, Source, SourceError, SourceSegment
from .status import JournalPass, StatusBook

log = logging.getLogger("sej.hub")

STALL_TIMEOUT = 300.0
"""Seconds a call to a producer (opening an SFTP channel, listing, reading a chunk, committing) may take
before the watchdog closes that client's connection. Opening a channel has no timeout of its own, so a
producer whose sshd hangs would otherwise block its client for good; 32 MiB in 300 s is 112 KB/s."""

WATCH_INTERVAL = 1.0
"""How often the watchdog looks for stalled calls."""

STOP_TIMEOUT = 2.0
"""Seconds a pass may take to finish its current chunk after `stop` was set. Then the client's SSH
connection is closed and, ABANDON_GRACE later, a pass still running is abandoned: SIGTERM ends
sej-hub within seconds whatever it is doing. Abandoning is safe: the hub's offset on a source
moves only after the copied bytes are fsynced, and the next copy cuts a torn tail aside."""

ABANDON_GRACE = 2.0
"""Seconds a pass may take to end after its connection was closed (by the watchdog, or after stop), before
the client stops waiting for it."""

SUMMARY_INTERVAL = 60.0
"""In forever mode each pass logs at DEBUG; what a client copied is summed up at INFO this often."""

SUPERVISE_INTERVAL = 0.1
"""How often `run_forever`'s calling thread looks at `stop` (it never waits on it: see run_forever)."""

IDLE_EVERY = 1.0
"""Over sej serve, seconds between two passes (poll_interval, if longer) while nothing is pushed, the last pass went
well and the pushed state answers every call of the next (serve_source.Connection.settled_for): such a pass would
find nothing new, and over a thousand journals it costs the hub tens of ms of CPU (five a second at poll_interval
0.2), which a push's pass then waited for. A push still starts a pass at once, and a deferred commit due one."""

FULL_EVERY = 2.0
"""Over sej serve, seconds between two passes over every journal at most while journals are pushed. In between, a pass
that a push started looks only at the journals pushed since the last pass began (and those whose deferred commit is
due): the others' pushed state has not changed since a pass found them copied, and planning and probing every one of
a thousand journals cost each push's pass tens of ms of the hub's CPU."""

OWED_AT_MOST = 2.0
"""Seconds a pass over every journal, once due, may wait behind passes over journals pushed since (every journal
appended at once is pushed in bursts over a tenth of a second or so: each burst's pass goes before it)."""

_PER_JOURNAL = ("tails", "committed", "sums", "stalled", "pending", "commit_due", "swept")
"""What a CopyState keeps per journal (a pass over some journals works on a CopyState of theirs: _Client.run_pass)."""

HEAP_SETTLE_EVERY = 600.0
"""Seconds between two full garbage collections in run_forever, after which what lives is frozen (gc.freeze): the
collector then looks only at what came since. The hub's long-lived objects (a thousand journals' states, open
journals, pushed listings) made each automatic full collection a 20-30 ms pause, every few seconds, that a
pushed journal's copy waited behind. Cyclic garbage among frozen objects waits for the next settling."""

LOCK_NAME = HUB_LOCK
"""The lock file in hub_root that one hub process (sej-hub, or a cron run) holds at a time."""


LIVENESS = 30.0
"""Seconds a client's pass supervisor may go without looking at its pass before `Hub.alive()` says no
(sej-hub then stops its systemd watchdog pings): it looks every SUPERVISE_INTERVAL while it lives."""

STUCK = 420.0
"""Seconds a pass (running, or abandoned and still in a call) may go without progress (a call to the
producer returned, bytes written at the hub) before `Hub.alive()` says no: longer than the stall watchdog
(STALL_TIMEOUT) takes to end a stalled SSH call, so only what nothing can end counts: a hub-side write or
fsync on a hung file system, a local call stuck in the kernel."""


class StalledError(SejError):
    """A call to a producer did not return within STALL_TIMEOUT (or in time after stop): the pass was left."""


def error_text(e: BaseException) -> str:
    """An error as the hub reports it: its message, with its type when it is not one the hub expects."""
    return str(e) if isinstance(e, (SejError, *transport_errors())) else f"{type(e).__name__}: {e}"


def error_kind(e: BaseException) -> str:
    """The kind of an error, for the errors metric: checksum, corrupt, copy, stalled, source, connection, io
    (a file system call failed: the hub's disk full, a permission, a local producer), other."""
    if isinstance(e, ChecksumError) or isinstance(e.__cause__, ChecksumError):
        return "checksum"
    if isinstance(e, CorruptionError) or isinstance(e.__cause__, CorruptionError):
        return "corrupt"
    if isinstance(e, CopyError):
        return "copy"
    if isinstance(e, StalledError):
        return "stalled"
    if isinstance(e, SourceError):
        return "source"
    if isinstance(e, (ConnectionError, TimeoutError, EOFError, socket.gaierror)):
        return "connection"
    if isinstance(e, OSError):  # paramiko's "Unable to connect" has no errno; a file system error has one
        return "connection" if e.errno is None else "io"
    if isinstance(e, transport_errors()):  # paramiko's SSHException
        return "connection"
    return "other"


@dataclass
class ClientReport:
    """What one pass did for one client."""

    client_id: str
    outcomes: list[JournalOutcome] = field(default_factory=list)
    error: BaseException | None = None  # the client failed as a whole (connect, list, missing root)
    connection_lost: bool = False  # the SSH connection was gone after the pass
    seconds: float = 0.0
    complete: bool = False  # the pass saw every journal of the client (it was not stopped, nor failed as a whole)
    skipped: set[str] = field(default_factory=set)  # directories of the root the pass did not take for journals
    named: bool = False  # the pass looked only at the journals pushed since the last one (see FULL_EVERY)

    @property
    def ok(self) -> bool:
        """Nothing failed: neither the client nor any of its journals."""
        return self.error is None and not self.connection_lost and all(o.error is None for o in self.outcomes)

    @property
    def client_failed(self) -> bool:
        """The client as a whole failed (it is retried with backoff in forever mode)."""
        return self.error is not None or self.connection_lost

    @property
    def messages(self) -> int:
        return sum(o.result.messages for o in self.outcomes if o.result is not None)

    @property
    def bytes(self) -> int:
        return sum(o.result.bytes for o in self.outcomes if o.result is not None)

    def journal_passes(self) -> list[JournalPass]:
        """What the pass did for each journal, for the StatusBook."""
        out = []
        for o in self.outcomes:
            r = o.result
            if o.error is not None:  # it may have copied before it failed (a follow-up copy, the commit)
                out.append(JournalPass(o.journal, r.next_offset if r else None, None, None, None,
                                       r.messages if r else 0, r.bytes if r else 0, str(o.error),
                                       error_kind(o.error)))  # fmt: skip
            elif r is not None:
                out.append(JournalPass(o.journal, r.next_offset, o.producer_next, o.lag_messages, o.lag_bytes,
                                       r.messages, r.bytes))  # fmt: skip
        return out

    def client_error(self) -> tuple[str, str] | None:
        """(kind, message) when the client failed as a whole."""
        if self.error is not None:
            return error_kind(self.error), error_text(self.error)
        if self.connection_lost:
            return "connection_lost", "the SSH connection was lost during the pass"
        return None

    @property
    def failed_journals(self) -> list[JournalOutcome]:
        return [o for o in self.outcomes if o.error is not None]

    def failures(self) -> list[str]:
        """One line per failure, each naming the client (and the journal)."""
        out = []
        if self.error is not None:
            out.append(f"client {self.client_id}: {self.error}")
        elif self.connection_lost:
            out.append(f"client {self.client_id}: the SSH connection was lost during the pass")
        for o in self.failed_journals:
            text = str(o.error)
            if not text.startswith(f"client {self.client_id}"):
                text = f"client {self.client_id}, journal {o.journal}: {text}"
            out.append(text)
        return out


def backoff_delay(failures: int, poll_interval: float, backoff_max: float) -> float:
    """Seconds before the next attempt after `failures` failed passes in a row.

    poll_interval * 2**failures, at most backoff_max, and never less than poll_interval.
    """
    if failures <= 0:
        return poll_interval
    return max(poll_interval, min(backoff_max, poll_interval * 2.0 ** min(failures, 60)))


def lock_path(config: HubConfig) -> str:
    return os.path.join(config.hub_root, LOCK_NAME)


def lock_hub(config: HubConfig) -> IO[str]:
    """Create hub_root and lock `<hub_root>/.hub.lck` (exclusive, non-blocking); LockedError if held.

    Release it with sej.lock.unlock_file. The lock is released by the kernel when the process dies.
    """
    os.makedirs(config.hub_root, exist_ok=True)
    return lock_file(lock_path(config))


class ClientLog(logging.LoggerAdapter):  # type: ignore[type-arg]
    """A logger whose records carry `client` (and the call's own `extra` fields) for JSON logs."""

    def process(self, msg: Any, kwargs: Any) -> tuple[Any, Any]:
        kwargs["extra"] = {**(self.extra or {}), **kwargs.get("extra", {})}
        return msg, kwargs


class _Watched:
    """A Source whose calls the client's watchdog can see (how long each has been running)."""

    def __init__(self, src: Source, client: _Client, only: set[str] | None = None) -> None:
        self.src = src
        self.client = client
        self.only = only  # the journals the pass looks at (None: all)
        # Every capability of the Source protocol, forwarded (a missing one, round_trip, kept far producers'
        # probes in two round trips).
        self.remote = src.remote
        self.reads_seen = src.reads_seen
        self.round_trip = src.round_trip
        self.defers_commit = src.defers_commit
        # sej serve's (ServeSource.commit_later): every call of the connection's Sources goes over one pipelined
        # stream, so a pass sends a phase's calls from its own thread (sej.hub.batch._Pass.many).
        self.one_stream = getattr(src, "commit_later", None) is not None

    @property
    def broken(self) -> bool:
        return self.src.broken

    def sums_mark(self, journal: str, name: str) -> SumsMark | None:
        return self.src.sums_mark(journal, name)

    def keep_handles(self, most: int) -> None:
        with self.client.call():
            self.src.keep_handles(most)

    def forget(self, journals: set[str] | None = None) -> None:
        self.src.forget(journals)

    def tidy(self) -> None:
        with self.client.call():
            self.src.tidy()

    def journals(self) -> list[str]:
        with self.client.call():
            journals = self.src.journals()
        only = self.only
        return journals if only is None else [j for j in journals if j in only]

    def skipped(self) -> dict[str, str]:
        return self.src.skipped()

    def segments(self, journal: str) -> list[SourceSegment]:
        with self.client.call():
            return self.src.segments(journal)

    def size(self, journal: str, name: str) -> int | None:
        with self.client.call():
            return self.src.size(journal, name)

    def read(self, journal: str, name: str, pos: int, size: int) -> bytes:
        with self.client.call():
            return self.src.read(journal, name, pos, size)

    def read_sums(self, journal: str, name: str, skip: int = 0) -> bytes | None:
        with self.client.call():
            return self.src.read_sums(journal, name, skip)

    def many(self, calls: list[Call]) -> list[Any]:
        later = getattr(self.src, "commit_later", None) if self.client.commit_later else None
        if later is not None and calls and all(c[0] == "commit_offset" for c in calls):
            # sej serve, in run_forever: the pass goes on without waiting for the producer's fsyncs; a commit that
            # fails is seen by the next pass (_Client.check_commits), which commits that journal again.
            with self.client.call():
                sent = later(calls)
            self.client.sent_commits(calls, sent)
            return [None] * len(calls)
        with self.client.call():
            return self.src.many(calls)

    def read_offset(self, journal: str, reader: str) -> int | None:
        with self.client.call():
            return self.src.read_offset(journal, reader)

    def commit_offset(self, journal: str, reader: str, value: int, sweep: bool = True) -> None:
        with self.client.call():
            self.src.commit_offset(journal, reader, value, sweep)

    def describe(self, journal: str, name: str = "") -> str:
        return self.src.describe(journal, name)

    def close(self) -> None:
        with self.client.call():
            self.src.close()


class _Kept(KeptOf):
    """The connection's kept sources (sej.hub.batch.KeptSources), watched."""

    def __init__(self, sources: Sources, client: _Client, only: set[str] | None = None) -> None:
        super().__init__(sources)
        self.client = client
        self.only = only

    def __call__(self, k: int) -> Source:
        with self.client.call():  # opening a channel is a call to the producer
            return _Watched(self.sources.kept(k), self.client, self.only)

    def tidy(self) -> None:
        with self.client.call():
            self.sources.tidy()


class _Client:
    """One producer: its connection, kept between passes, and its run of failures."""

    def __init__(self, hub: HubConfig, cfg: ClientConfig, destinations: Destinations | None = None,
                 status: StatusBook | None = None) -> None:  # fmt: skip
        self.hub = hub
        self.status = status  # the Hub's: told of the bytes a pass writes (/health in a long pass)
        self.cfg = cfg
        self.remote: Sources | None = None  # the producer's Sources over SSH: one connection, kept between passes
        self.label = cfg.describe()
        self.log = ClientLog(log, {"client": cfg.client_id})  # JSON logs get a client field
        self.failures = 0  # failed passes in a row
        self.connects = 0  # SSH connections made (for tests and logs)
        self.skips_told: set[str] = set()  # directories under the client's root already reported as not journals
        self.told_empty = False  # "no journal found" was reported
        self.state = CopyState()  # what the last pass learned: unchanged journals cost two lstats
        self.destinations = destinations  # the hub's journals kept open between passes (the Hub's, shared)
        self._calls: dict[int, float] = {}  # calls to the producer under way: token -> when they started
        self._calls_lock = threading.Lock()
        self._tokens = itertools.count()
        self._stalled = threading.Event()  # set by the watchdog: the pass under way is stuck in a call
        self._pass: threading.Thread | None = None  # the last pass started (alive: running, or abandoned)
        self.attempted = threading.Event()  # the first connection attempt was made (or a local client's pass ran)
        self.pushed = threading.Event()  # the producer told of a change since the last pass began (sej serve)
        self.pushes = False  # it tells of them: the wait between passes ends at a push
        self.forever = False  # run_forever's passes: those a push starts may look only at the journals pushed
        self._named: set[str] | None = None  # the journals pushed since the last pass began; None: any may have changed
        self._named_lock = threading.Lock()
        self.full_at = -FULL_EVERY  # when the last pass over every journal began (time.monotonic())
        self.full_owed = False  # a pass over every journal was due, and the pushed journals went first: it follows
        self.owed_since = 0.0  # when it became owed (time.monotonic())
        self.beat: float | None = None  # monotonic time run_pass_bounded last looked at its pass; None outside
        self.commit_later = False  # run_forever's: commits over sej serve are not waited for (_Watched.many)
        self._commits: list[tuple[str, int, Any]] = []  # those under way: (journal, hub offset, the call)
        self._commits_lock = threading.Lock()
        self.progress = time.monotonic()  # the last sign of progress of a pass: started, a call returned, bytes
        self.last_ok = False  # the last pass went well (and was not stopped)

    @contextmanager
    def call(self) -> Iterator[None]:
        """Mark a call to the producer, for the watchdog."""
        token = next(self._tokens)
        with self._calls_lock:
            self._calls[token] = time.monotonic()
        try:
            yield
        finally:
            with self._calls_lock:
                del self._calls[token]
            self.progress = time.monotonic()

    def close_if_stalled(self, limit: float) -> bool:
        """When a call has been under way for more than `limit` seconds: mark the pass stalled and close the
        connection, if any. Every call blocked on the connection then fails, so the pass ends and the next one
        reconnects; a pass stuck in a local call is abandoned (see run_pass_bounded). True if it acted.
        """
        with self._calls_lock:
            oldest = min(self._calls.values(), default=None)
        if oldest is None or self._stalled.is_set() or time.monotonic() - oldest <= limit:
            return False
        remote = self.remote
        self.log.error(
            "client %s: a call to %s has not returned for %.0fs; %s",
            self.cfg.client_id,
            self.label,
            limit,
            "closing the connection" if remote is not None else "abandoning the pass",
        )
        self._stalled.set()
        if remote is not None:
            try:
                remote.close()
            except Exception as e:
                self.log.debug("client %s: closing the stalled connection: %s", self.cfg.client_id, e)
        return True

    def run_pass_bounded(self, stop: threading.Event, level: int = logging.INFO) -> ClientReport:
        """run_pass in a thread of its own, waited for only while it makes progress. Never raises an Exception.

        The wait ends ABANDON_GRACE after the watchdog found a call stalled, or STOP_TIMEOUT + ABANDON_GRACE
        after `stop` was set (the connection is closed after STOP_TIMEOUT); a pass still running then is
        abandoned and reported as failed (StalledError). While it runs on, no other pass of this client
        starts: each attempt is reported as failed instead.
        """
        cid = self.cfg.client_id
        busy = self._pass
        if busy is not None and busy.is_alive():
            err = StalledError(f"a call to {self.label} from an earlier pass has still not returned")
            self.log.error("client %s: %s; not starting another pass", cid, err)
            return ClientReport(cid, error=err)
        return self._bounded(lambda: self.run_pass(stop, level), "pass", stop)

    def _bounded(self, work: Callable[[], ClientReport], what: str, stop: threading.Event) -> ClientReport:
        """`work` (which never raises an Exception) in a thread of its own, supervised (`_supervise`)."""
        cid = self.cfg.client_id
        self._stalled.clear()
        box: list[ClientReport] = []

        def run() -> None:
            try:
                box.append(work())
            except BaseException as e:  # work never raises an Exception: this is a bug, say so
                self.log.exception("client %s: unexpected error in the %s", cid, what)
                box.append(ClientReport(cid, error=e))

        t = self._pass = threading.Thread(target=run, name=f"sej-hub-{what}-{cid}", daemon=True)
        started = self.beat = self.progress = time.monotonic()
        try:
            return self._supervise(t, box, stop, started)
        finally:
            self.beat = None

    def commit_pending(self, stop: threading.Event) -> None:
        """Commit the hub offsets commit_interval deferred (after the last pass, on stop), so that the producer's
        retention knows all that was copied; bounded as a pass is. Not tried over a lost connection (the next
        start lists those journals and commits them), nor while an abandoned pass still runs."""
        busy = self._pass
        if not self.state.pending or (busy is not None and busy.is_alive()):
            return
        if not self.cfg.origin.is_local and (self.remote is None or not self.remote.alive()):
            return
        cid = self.cfg.client_id

        def work() -> ClientReport:
            report = ClientReport(cid)
            try:
                commit_pending(self._sources(), self.state, self.hub.hub_name, cid)
            except Exception as e:
                report.error = e
                self.log.error("client %s: committing the deferred offsets: %s", cid, error_text(e))
            return report

        self._bounded(work, "commit", stop)

    def _supervise(self, t: threading.Thread, box: list[ClientReport], stop: threading.Event,
                   started: float) -> ClientReport:  # fmt: skip
        cid = self.cfg.client_id
        t.start()
        give_up: float | None = None
        stopped_at: float | None = None
        while True:
            t.join(SUPERVISE_INTERVAL)
            if not t.is_alive():
                return box[0] if box else ClientReport(cid, error=RuntimeError("the pass ended without a report"))
            now = self.beat = time.monotonic()
            if give_up is None and self._stalled.is_set():
                give_up = now + ABANDON_GRACE
            if stop.is_set():
                if stopped_at is None:
                    stopped_at = now
                elif now - stopped_at >= STOP_TIMEOUT and (give_up is None or give_up > now + ABANDON_GRACE):
                    give_up = now + ABANDON_GRACE  # the current chunk had its time: unblock calls on the producer
                    if self.remote is not None:
                        self.log.warning(
                            "client %s: still busy %gs after stop; closing the connection", cid, STOP_TIMEOUT
                        )
                        self.disconnect()
            if give_up is not None and now >= give_up:
                if self._stalled.is_set():
                    why = f"a call to {self.label} stalled (more than {STALL_TIMEOUT:g}s)"
                else:
                    why = f"the pass was still in a call to {self.label} {now - (stopped_at or now):.1f}s after stop"
                err = StalledError(f"{why}; the pass was abandoned after {now - started:.1f}s")
                self.log.error("client %s: %s", cid, err)
                return ClientReport(cid, error=err, seconds=now - started)

    def _sources(self, only: Callable[[], set[str] | None] = lambda: None) -> Callable[[], Source]:
        """The client's Sources, each call watched: local ones, or SFTP ones on the kept (or a new) connection."""
        origin = self.cfg.origin
        if origin.is_local:
            self.attempted.set()
            sources = open_sources(origin)
        else:
            if self.remote is not None and not self.remote.alive():
                self.log.warning(
                    "client %s: the connection to %s was lost; reconnecting", self.cfg.client_id, self.label
                )
                self.disconnect(lost=True)
            if self.remote is None:
                # Each SFTP read fails after IO_TIMEOUT on a dead link instead of hanging.
                try:
                    self.remote = open_sources(origin, connect_timeout=CONNECT_TIMEOUT, io_timeout=IO_TIMEOUT,
                                               client_id=self.cfg.client_id)  # fmt: skip
                finally:
                    self.attempted.set()
                self.label = self.remote.label
                with self._named_lock:
                    self._named = None  # a new connection: every journal is looked at
                self.pushes = self.remote.watch(self._on_push)
                self.connects += 1
                if self.status is not None:  # at once, not at the end of a (long, catching up) pass
                    self.status.connected(self.cfg.client_id, True)
                self.log.info("client %s: connected to %s", self.cfg.client_id, self.label)
            sources = self.remote

        def make() -> Source:
            with self.call():  # watched like every call: a hung filesystem or producer stalls it
                return _Watched(sources(), self, only())

        return make

    def _on_push(self, journals: list[str]) -> None:
        """The producer pushed a change of `journals` ([]: any may have changed)."""
        with self._named_lock:
            if not journals:
                self._named = None
            elif self._named is not None:
                self._named.update(journals)
        self.pushed.set()

    def _take_named(self, now: float, last_ok: bool) -> set[str] | None:
        """The journals the pass starting `now` looks at: those pushed since the last pass began, and those whose
        deferred commit is due; None (every journal) unless over sej serve in run_forever with a pushed state that
        answers every call, the last pass went well, and a push named them all. When FULL_EVERY has passed, the
        pushed journals still go first, in a pass of their own, and the pass over every journal follows at once
        (`full_owed`) unless more were pushed meanwhile, for OWED_AT_MOST: a push does not wait for the work on the
        others."""
        with self._named_lock:
            named, self._named = self._named, set()
        settled = getattr(getattr(self.remote, "_make", None), "settled_for", None) if self.pushes else None
        if (named is None or not named or settled is None or not self.forever or not last_ok or settled() <= 0
                or (self.full_owed and now - self.owed_since >= OWED_AT_MOST)):  # fmt: skip
            self.full_at, self.full_owed = now, False
            return None
        if not self.full_owed and now - self.full_at >= FULL_EVERY:
            self.full_owed, self.owed_since = True, now
        return named | {j for j, _value in self.state.due(now)}

    def sent_commits(self, calls: list[Call], sent: list[Any]) -> None:
        """Commits sent without waiting (`sent`: each call's handle, `done` once answered, with its `error`)."""
        with self._commits_lock:
            self._commits += [(c[1], c[3], f) for c, f in zip(calls, sent, strict=True)]

    def check_commits(self, wait: float = 0.0) -> None:
        """Look at the commits sent without waiting (waiting up to `wait` seconds for them): one that failed is
        logged, and its journal is committed again by the next pass (the state forgets that offset, so the pass
        reads the producer's and commits its own, as after a commit that failed in the pass)."""
        deadline = time.monotonic() + wait
        with self._commits_lock:
            commits, self._commits = self._commits, []
        for k, (_j, _v, f) in enumerate(commits):
            if not f.done and not f.wait(max(0.0, deadline - time.monotonic())):
                with self._commits_lock:  # still under way: looked at next time
                    self._commits = commits[k:] + self._commits
                commits = commits[:k]
                break
        failed: dict[int, list[tuple[str, int, BaseException]]] = {}  # by error: a dropped connection fails them all
        for journal, value, f in commits:
            if f.error is not None:
                failed.setdefault(id(f.error), []).append((journal, value, f.error))
                if self.state.committed.get(journal) == value:
                    self.state.remember_committed(journal, None)
        for same in failed.values():
            journal, value, e = same[0]
            if len(same) == 1:
                self.log.error("client %s: committing the hub offset %d of %s: %s", self.cfg.client_id, value, journal,
                               error_text(e), extra={"journal": journal, "committing": value})  # fmt: skip
            else:  # one line, not one per journal (a thousand under way when the connection dropped)
                self.log.error("client %s: committing the hub offsets of %d journals (%s, ...): %s", self.cfg.client_id,
                               len(same), journal, error_text(e))  # fmt: skip

    def _copied(self, nbytes: int) -> None:
        """Bytes written at the hub: progress (for Hub.alive), and for the status book (/health in a long pass)."""
        self.progress = time.monotonic()
        if self.status is not None:
            self.status.progress(self.cfg.client_id)

    def _tell_skip(self, name: str, why: str) -> None:
        """Warn once per directory of the client's root that is not a journal (every pass reports them)."""
        if name not in self.skips_told:
            self.skips_told.add(name)
            self.log.warning("client %s: skipping %r under %s: %s", self.cfg.client_id, name, self.label, why)

    def run_pass(self, stop: threading.Event, level: int = logging.INFO) -> ClientReport:
        """One pass: connect if needed, copy every journal the client has. Never raises an Exception.

        What was copied is logged at `level`; errors always at ERROR.
        """
        cid = self.cfg.client_id
        report = ClientReport(cid)
        started = time.monotonic()
        named: set[str] | None = None
        state = self.state
        try:
            self.check_commits()
            make_source = self._sources(lambda: named)
            named = self._take_named(started, self.last_ok)
            if named is not None:  # its own CopyState, of those journals only: the pass forgets no other
                state = _part(self.state, named)
                report.named = True

            def on_skip(name: str, why: str) -> None:
                report.skipped.add(name)
                self._tell_skip(name, why)

            kept = _Kept(self.remote, self, named) if self.remote is not None else None
            try:
                report.outcomes = copy_all(make_source, self.hub.hub_root, cid, self.hub.hub_name, self.hub.workers,
                                           stop, on_bytes=self._copied, on_skip=on_skip, state=state,
                                           destinations=self.destinations, kept=kept)  # fmt: skip
            finally:
                if named is not None:
                    _merge(self.state, state, named)
            report.complete = not stop.is_set() and named is None
            if not report.outcomes and not self.told_empty and named is None:
                self.told_empty = True
                self.log.warning("client %s: no journal found at %s", cid, self.label)
        except Exception as e:
            report.error = e
            expected = isinstance(e, (SejError, *transport_errors()))
            self.log.error("client %s: %s", cid, error_text(e), exc_info=not expected)
        if self.remote is not None and (report.error is not None or not self.remote.alive()):
            report.connection_lost = report.error is None
            if report.connection_lost:
                self.log.error("client %s: the connection to %s was lost during the pass", cid, self.label)
            # The next pass connects afresh; a connection that died (not one closed after an error of the
            # producer's tree) is reported lost at once.
            self.disconnect(lost=report.connection_lost or not self.remote.alive())
        report.seconds = time.monotonic() - started
        self.last_ok = report.ok and not stop.is_set()
        failed = len(report.failed_journals)
        fields = {"messages": report.messages, "bytes": report.bytes, "journals": len(report.outcomes),
                  "failed": failed, "seconds": round(report.seconds, 6)}  # fmt: skip
        if report.messages or failed:
            self.log.log(
                level,
                "client %s: copied %d messages (%d bytes) from %d journals in %.2fs%s",
                cid,
                report.messages,
                report.bytes,
                len(report.outcomes),
                report.seconds,
                f"; {failed} journals failed" if failed else "",
                extra=fields,
            )
            if self.log.isEnabledFor(logging.DEBUG):
                for o in report.outcomes:
                    if o.result is not None and o.result.messages:
                        self.log.debug("client %s, journal %s: copied %d messages, hub next offset %d", cid,
                                       o.journal, o.result.messages, o.result.next_offset,
                                       extra={"journal": o.journal, "messages": o.result.messages,
                                              "bytes": o.result.bytes, "hub_next": o.result.next_offset,
                                              "producer_next": o.producer_next, "lag": o.lag_messages,
                                              "lag_bytes": o.lag_bytes})  # fmt: skip
        elif report.error is None:
            self.log.debug("client %s: nothing new in %d journals (%.2fs)", cid, len(report.outcomes), report.seconds,
                           extra=fields)  # fmt: skip
        return report

    def quiet_for(self, now: float) -> float:
        """Seconds more the next pass may wait while nothing is pushed (IDLE_EVERY at most): as long as the pushed
        state answers every call (none over SFTP, a local root, or sej serve without a trusted whole state) and no
        deferred commit comes due."""
        settled = getattr(getattr(self.remote, "_make", None), "settled_for", None) if self.pushes else None
        if settled is None:
            return 0.0
        quiet = min(IDLE_EVERY, float(settled()))
        interval = self.state.commit_interval
        for j in self.state.pending:  # when each comes due (CopyState._is_due)
            last = self.state.commit_due.get(j)
            quiet = min(quiet, 0.0 if last is None else last[0] + interval * last[1] - now)
        return max(0.0, quiet)

    def wait(self, stop: threading.Event, delay: float, quiet: bool = False) -> None:
        """Wait `delay` seconds before the next pass, less if `stop` is set, the producer pushes a change, or the
        connection is lost (a keepalive found the producer silent: sej.hub.ssh.KEEPALIVE_DEAD). The loss is
        reported at once and the next pass reconnects. `quiet` (the last pass went well): while nothing is pushed,
        up to `quiet_for` seconds from now if that is longer."""
        now = time.monotonic()
        end = now + delay
        if quiet:  # never later than poll_interval
            end = max(end, now + self.quiet_for(now))
            delay = end - now
        for _ in range(int(delay / SUPERVISE_INTERVAL) + 2):  # stop is polled (a signal handler may set it)
            left = end - time.monotonic()
            if left <= 0 or stop.is_set() or self.pushed.wait(min(left, SUPERVISE_INTERVAL)):
                break
            remote = self.remote
            if remote is not None and not remote.alive():
                self.log.warning("client %s: the connection to %s was lost", self.cfg.client_id, self.label)
                self.disconnect(lost=True)
                break
        self.pushed.clear()  # the next pass sees what was pushed until now

    def disconnect(self, lost: bool = False) -> None:
        """Close the client's connection; `lost`: it failed or was found dead (status and /health say so)."""
        self.pushes = False
        with self._named_lock:
            self._named = None
        remote, self.remote = self.remote, None
        if remote is not None and lost and self.status is not None:
            self.status.connected(self.cfg.client_id, False, lost=True)
        if remote is not None:
            try:
                remote.close()
            except Exception as e:  # closing a broken connection must not hide the reason it broke
                self.log.debug("client %s: closing the connection: %s", self.cfg.client_id, e)


def _part(state: CopyState, journals: set[str]) -> CopyState:
    """A CopyState of `journals` only (what `state` knows of them), for a pass over them."""
    part = CopyState()
    part.commit_interval, part.sweep_every = state.commit_interval, state.sweep_every
    for name in _PER_JOURNAL:
        whole, mine = getattr(state, name), getattr(part, name)
        for j in journals:
            if j in whole:
                mine[j] = whole[j]
    return part


def _merge(state: CopyState, part: CopyState, journals: set[str]) -> None:
    """What a pass over `journals` learned (`part`, see _part), into `state`."""
    for name in _PER_JOURNAL:
        whole, mine = getattr(state, name), getattr(part, name)
        for j in journals:
            if j in mine:
                whole[j] = mine[j]
            else:
                whole.pop(j, None)
    state.changed |= part.changed


class Hub:
    """Copies every client of a HubConfig into `<hub_root>/<client_id>.<journal>`.

    Use run_once or run_forever from one thread at a time; close() (or `with`) drops the connections.
    """

    def __init__(self, config: HubConfig, records: bool = True) -> None:
        self.config = config
        self.destinations = Destinations(open_journals())
        # What /metrics, /health and `sej hub status` (from the records in the hub root) show.
        self.status = StatusBook(config.hub_root if records else None,
                                 [(c.client_id, c.describe()) for c in config.clients])  # fmt: skip
        self._clients = [_Client(config, c, self.destinations, self.status) for c in config.clients]
        self._settled_at: float | None = None  # when run_forever last settled the heap (_settle_heap)
        self._settle_lock = threading.Lock()

    def _settle_heap(self) -> None:
        """After a complete pass in run_forever: collect everything and freeze what lives, once at first and then
        every HEAP_SETTLE_EVERY seconds (see there)."""
        with self._settle_lock:
            now = time.monotonic()
            if self._settled_at is not None and now - self._settled_at < HEAP_SETTLE_EVERY:
                return
            self._settled_at = now
            gc.unfreeze()
            gc.collect()
            gc.freeze()

    def _pass(self, client: _Client, stop: threading.Event, level: int = logging.INFO) -> ClientReport:
        """One bounded pass of a client, recorded in the StatusBook."""
        self.status.pass_started(client.cfg.client_id)
        report = client.run_pass_bounded(stop, level)
        try:
            local = client.cfg.is_local
            self.status.connected(client.cfg.client_id, local or client.remote is not None)
            self.status.record(client.cfg.client_id, report.journal_passes(), report.seconds, report.client_error(),
                               complete=report.complete, skipped=report.skipped)  # fmt: skip
        except Exception:  # the status is for operators: its failure must not stop the copies
            log.exception("client %s: recording the pass's status", client.cfg.client_id)
        return report

    def alive(self) -> bool:
        """For systemd's watchdog: every client's pass supervisor looks at its pass (or is between passes),
        and no pass, running or abandoned, has gone STUCK seconds without progress."""
        now = time.monotonic()
        for c in self._clients:
            if c.beat is not None and now - c.beat >= LIVENESS:
                return False
            busy = c._pass
            if busy is not None and busy.is_alive() and now - c.progress >= STUCK:
                return False
        return True

    def run_once(self, stop: threading.Event | None = None) -> list[ClientReport]:
        """One pass over every client (all at once); one report per client, in config order.

        Connections stay open for the next call (close() drops them).
        """
        stop = stop if stop is not None else threading.Event()
        if stop.is_set():
            return []
        self.status.forget_others()
        with self._watchdog(), ThreadPoolExecutor(len(self._clients), thread_name_prefix="sej-hub") as pool:
            reports = list(pool.map(lambda c: self._pass(c, stop), self._clients))
        self.status.write()
        return reports

    @contextmanager
    def _watchdog(self) -> Iterator[None]:
        """While inside, a thread closes the connection of a client whose producer stopped answering."""
        done = threading.Event()

        def watch() -> None:
            while not done.wait(WATCH_INTERVAL):
                for c in self._clients:
                    c.close_if_stalled(STALL_TIMEOUT)

        t = threading.Thread(target=watch, name="sej-hub-watchdog", daemon=True)
        t.start()
        try:
            yield
        finally:
            done.set()
            t.join(WATCH_INTERVAL + 1)

    def run_forever(
        self,
        stop: threading.Event,
        on_report: Callable[[ClientReport], None] | None = None,
        on_ready: Callable[[], None] | None = None,
        on_tick: Callable[[], None] | None = None,
    ) -> None:
        """Pass after pass, every client on its own schedule, until `stop` is set; then close().

        `stop` may be set from a signal handler: the calling thread only polls it (it never waits
        on the event, whose lock a handler running in the same thread could otherwise deadlock on).
        `on_report` is called (from the client's thread) after each pass. `on_ready` is called once
        (from the calling thread) when every client has made its first connection attempt (or after
        CONNECT_TIMEOUT + 1 s, whichever comes first), `on_tick` every SUPERVISE_INTERVAL from it after that.
        """
        cfg = self.config
        log.info(
            "hub started: %d clients, hub root %s, reader %s, a pass every %gs",
            len(self._clients),
            cfg.hub_root,
            cfg.hub_name,
            cfg.poll_interval,
        )
        self.status.forget_others()
        for c in self._clients:  # run_once commits every pass's offsets; passes after passes defer them
            c.state.commit_interval = cfg.commit_interval
            c.commit_later = True  # and, over sej serve, do not wait for them (_Watched.many)
            c.forever = True
        threads = [
            threading.Thread(
                target=self._loop, args=(c, stop, on_report), name=f"sej-hub-{c.cfg.client_id}", daemon=True
            )
            for c in self._clients
        ]
        with self._watchdog():
            try:
                for t in threads:
                    t.start()
                ready_by = time.monotonic() + CONNECT_TIMEOUT + 1
                ready = False
                while not stop.is_set():
                    if not ready and (all(c.attempted.is_set() for c in self._clients) or time.monotonic() >= ready_by):
                        ready = True
                        if on_ready is not None:
                            on_ready()
                    if ready and on_tick is not None:  # after on_ready: systemd's watchdog counts from READY=1
                        on_tick()
                    time.sleep(SUPERVISE_INTERVAL)
                log.info("stopping: finishing the current chunks")
            finally:
                stop.set()
                # run_pass_bounded gives up within STOP_TIMEOUT + ABANDON_GRACE, and so does commit_pending after it
                limit = 2 * (STOP_TIMEOUT + ABANDON_GRACE) + 1
                deadline = time.monotonic() + limit
                for t in threads:
                    if t.ident is not None:
                        t.join(max(0.0, deadline - time.monotonic()))
                busy = [t.name for t in threads if t.is_alive()]
                if busy:
                    log.warning("still busy after %gs, leaving anyway: %s", limit, ", ".join(busy))
                self.close()
                gc.unfreeze()  # the process's collector as it was
                self._settled_at = None
                for c in self._clients:
                    c.state.commit_interval = 0.0  # a later run_once commits on every pass again
                    c.commit_later = False
                    c.forever = False
                    self.status.connected(c.cfg.client_id, False)
                self.status.write()
                log.info("hub stopped")

    def _loop(self, client: _Client, stop: threading.Event, on_report: Callable[[ClientReport], None] | None) -> None:
        cfg = self.config
        cid = client.cfg.client_id
        since = time.monotonic()
        messages = nbytes = passes = 0

        def summary() -> None:
            """What the client copied since the last summary (at INFO every SUMMARY_INTERVAL, and on stop)."""
            nonlocal since, messages, nbytes, passes
            now = time.monotonic()
            client.log.info("client %s: copied %d messages (%d bytes) in the last %.0fs (%d passes)", cid, messages,
                            nbytes, now - since, passes, extra={"messages": messages, "bytes": nbytes,
                                                                "seconds": round(now - since, 3), "passes": passes,
                                                                "summary": True})  # fmt: skip
            since, messages, nbytes, passes = now, 0, 0, 0

        while not stop.is_set():
            started = time.monotonic()
            try:
                report = self._pass(client, stop, logging.DEBUG)
                if on_report is not None:
                    on_report(report)
            except Exception:  # a bug: keep the other passes going, but say so loudly
                client.log.exception("client %s: unexpected error in the pass", cid)
                report = ClientReport(cid, error=RuntimeError("unexpected error"))
            messages, nbytes, passes = messages + report.messages, nbytes + report.bytes, passes + 1
            if time.monotonic() - since >= SUMMARY_INTERVAL and messages:
                summary()
            if report.client_failed:
                client.failures += 1
                delay = backoff_delay(client.failures, cfg.poll_interval, cfg.backoff_max)
                client.log.warning("client %s: failed %d times in a row; next attempt in %.1fs", cid, client.failures,
                                   delay, extra={"failures": client.failures})  # fmt: skip
            else:
                if client.failures:
                    client.log.info("client %s: working again after %d failed attempts", cid, client.failures)
                client.failures = 0
                # Passes start every poll_interval: after a long pass (much to copy), the next starts at once.
                delay = max(0.0, cfg.poll_interval - (time.monotonic() - started))
            if report.complete and report.ok:
                self._settle_heap()
            if client.full_owed and not report.client_failed:
                delay = 0.0  # the pass over every journal the pushed ones went before (_take_named)
            client.wait(stop, delay, quiet=report.ok and (report.complete or report.named) and not client.full_owed)
        client.commit_later = False  # from now on every commit is waited for
        client.check_commits(wait=STOP_TIMEOUT)  # those still under way: made before the connection is closed
        client.commit_pending(stop)
        summary()  # also when the stop came during the wait: what was copied since the last one is told

    def close(self) -> None:
        """Close every SSH connection, and the hub's journals kept open."""
        try:
            for c in self._clients:
                c.disconnect()
        finally:
            self.destinations.close()

    def __enter__(self) -> Hub:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
