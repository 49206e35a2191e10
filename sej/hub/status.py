"""What the hub knows of each client and journal: in memory for sej-hub's /metrics and /health
(`StatusBook`), and on disk for `sej hub status` without the daemon's help (`read_status`).

The daemon keeps one record per client, `<hub_root>/.sej-hub/<client-id>.json`, rewritten
atomically (not fsynced: it is advisory, and a crash leaves the previous one) after a pass that
changed something, at most every WRITE_EVERY seconds, and every REFRESH_EVERY seconds otherwise,
also during a pass that writes bytes at the hub: `sej hub status --max-age` then counts a long
catch-up copy as fresh, as /health does (`ClientStatus.age`). The end of a pass whose record was
written during it is written at once.
It holds, per journal, the producer's next offset and the bytes the hub lacks as the last pass
saw them; the hub's own next offset is read from its journals when status is asked for.

A record is read as hostile input: a regular file (never a link), at most MAX_RECORD bytes,
fields of the expected types; anything else is reported as a bad record, never trusted.
"""

from __future__ import annotations

import json
import logging
import math
import os
import threading
import time
from bisect import bisect_left
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, fields, replace
from typing import Any

from ..errors import SejError
from ..fsutil import atomic_write, read_regular
from ..journal import next_offset
from ..layout import HUB_STATUS_DIR
from ..shard import find_journals
from .names import CLIENT_ID_RE, check_client_id, destination_name

log = logging.getLogger("sej.hub")

RECORD_VERSION = 1
MAX_RECORD = 64 << 20
WRITE_EVERY = 1.0
"""Seconds between two writes of a client's record after passes that changed something."""
REFRESH_EVERY = 5.0
"""Seconds between two writes of an unchanged record (its last successful pass moves on)."""

PASS_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)
"""Upper bounds (seconds) of the pass-duration histogram (and +Inf)."""


@dataclass
class JournalStatus:
    """One journal of a client, as the hub's passes saw it."""

    journal: str  # the producer's journal name (the hub's is <client-id>.<journal>)
    hub_next: int | None = None  # the hub's next offset after the last pass
    producer_next: int | None = None  # the producer's as the last pass saw it (exact when it copied all it saw)
    lag: int | None = None  # messages the hub was behind when the last pass looked, before it copied them
    lag_bytes: int | None = None  # bytes, likewise
    messages: int = 0  # copied since the daemon started
    bytes: int = 0
    error: str | None = None  # the last pass's error for this journal


@dataclass
class ClientStatus:
    """One client: its passes, errors and journals."""

    client_id: str
    location: str
    since: float  # wall-clock time the daemon started watching it
    connected: bool = False
    lost: float | None = None  # wall-clock time its connection was lost (dropped, or found dead), until it is back
    passes: int = 0
    last_pass_end: float | None = None
    last_pass_seconds: float | None = None
    last_success: float | None = None  # wall-clock end of the last pass without any failure
    errors: dict[str, int] = field(default_factory=dict)  # kind -> count since the daemon started
    last_error: str | None = None
    journals: dict[str, JournalStatus] = field(default_factory=dict)
    # The journals are all the producer had at the last complete pass: a hub copy of this client without an entry
    # is of a journal gone from the producer (not one no pass has seen yet).
    listed: bool = False
    pass_buckets: list[int] = field(default_factory=lambda: [0] * len(PASS_BUCKETS))  # not cumulative; +Inf apart
    pass_seconds_sum: float = 0.0
    written: float | None = None  # read from a record: when the daemon wrote it (wall clock)
    in_pass: bool = False
    last_progress: float | None = None  # bytes last written at the hub by the pass under way

    def age(self, now: float) -> float:
        """Seconds since the last successful pass (or since the daemon started watching, before one), or since
        the pass under way last wrote bytes at the hub, if later: a long catch-up copy is not stale."""
        fresh = self.last_success if self.last_success is not None else self.since
        if self.in_pass and self.last_progress is not None:
            fresh = max(fresh, self.last_progress)
        return max(0.0, now - fresh)

    def to_json(self) -> dict[str, Any]:
        # Shallow copies, not asdict: its deep copy of a thousand journals took 5% of a busy daemon's time.
        doc = {f.name: getattr(self, f.name) for f in fields(self)}
        doc.update(errors=dict(self.errors), pass_buckets=list(self.pass_buckets),  # a JournalStatus's __dict__:
                   journals={name: dict(vars(j)) for name, j in sorted(self.journals.items())})  # fmt: skip
        return doc


@dataclass(slots=True)
class JournalPass:
    """What a pass did for one journal (sej.hub.daemon builds these from its reports; not frozen: a pass over a
    thousand journals builds a thousand, and a frozen dataclass's were 4x slower to make)."""

    journal: str
    hub_next: int | None
    producer_next: int | None
    lag: int | None
    lag_bytes: int | None
    messages: int
    bytes: int
    error: str | None = None
    error_kind: str | None = None


class StatusBook:
    """Every client's status, updated after each pass (from the clients' threads), read by /metrics,
    /health and the records on disk."""

    def __init__(self, hub_root: str | None, clients: Iterable[tuple[str, str]], clock: Callable[[], float] = time.time,
                 ticks: Callable[[], float] = time.monotonic) -> None:  # fmt: skip
        self.hub_root = hub_root  # None: no records on disk
        self.clock = clock  # wall clock: the times in the records
        self.ticks = ticks  # monotonic: how often records are written
        now = clock()
        self._clients = {cid: ClientStatus(cid, where, now) for cid, where in clients}
        self._lock = threading.Lock()
        self._write_lock = threading.Lock()  # one write at a time: an older document never replaces a newer one
        self._written: dict[str, float] = {}  # client -> monotonic time of its last record
        self._written_in_pass: set[str] = set()  # clients whose last record was written during a pass
        self._dirty: set[str] = set()

    def pass_started(self, client_id: str) -> None:
        with self._lock:
            c = self._clients[client_id]
            c.in_pass, c.last_progress = True, None

    def progress(self, client_id: str) -> None:
        """The pass under way wrote bytes at the hub. Its record says so once it is REFRESH_EVERY s old: only
        a long pass rewrites it before its end."""
        now = self.clock()
        with self._lock:
            self._clients[client_id].last_progress = now
        self._maybe_write(client_id)

    def connected(self, client_id: str, connected: bool, lost: bool = False) -> None:
        """The client's connection is open, or not; `lost`: it was lost (not closed on stop), which /health
        reports at once. Its record is written at once when it was lost."""
        with self._lock:
            c = self._clients[client_id]
            changed = c.connected != connected or (lost and c.lost is None)
            c.connected = connected
            if connected:
                c.lost = None
            elif lost and c.lost is None:
                c.lost = self.clock()
            if changed:
                self._dirty.add(client_id)
        if changed and lost:
            self.write(client_id)

    def lost(self) -> list[tuple[str, float]]:
        """The clients whose connection was lost and is not back, with the seconds since."""
        now = self.clock()
        with self._lock:
            return [(c.client_id, max(0.0, now - c.lost)) for c in self._clients.values() if c.lost is not None]

    def record(self, client_id: str, journals: list[JournalPass], seconds: float,
               client_error: tuple[str, str] | None = None, complete: bool = False,
               skipped: Iterable[str] = ()) -> None:  # fmt: skip
        """A pass ended: its journals, how long it took, and (kind, message) if the client failed as a whole.
        A `complete` pass saw every journal the client has (or `skipped` it: a journal whose jnl/ could not be
        read is still there): the others are gone from it, and are forgotten (their metrics too, else a removed
        journal's last lag would stay on the dashboards); the record then says its journals are `listed`."""
        now = self.clock()
        with self._lock:
            c = self._clients[client_id]
            c.in_pass, c.last_progress = False, None
            c.passes += 1
            c.last_pass_end = now
            c.last_pass_seconds = seconds
            c.pass_seconds_sum += seconds
            k = bisect_left(PASS_BUCKETS, seconds)
            if k < len(PASS_BUCKETS):  # longer passes count in +Inf only (passes)
                c.pass_buckets[k] += 1
            ok = client_error is None
            if client_error is not None:
                kind, text = client_error
                c.errors[kind] = c.errors.get(kind, 0) + 1
                c.last_error = text
            changed = not ok
            for jp in journals:
                j = c.journals.get(jp.journal)
                if j is None:
                    j = c.journals[jp.journal] = JournalStatus(jp.journal)
                    changed = True
                j.messages += jp.messages  # also when the pass failed after copying them: they are at the hub
                j.bytes += jp.bytes
                if jp.hub_next is not None:
                    j.hub_next = jp.hub_next
                if jp.error is not None:
                    ok, changed = False, True
                    kind = jp.error_kind or "journal"
                    c.errors[kind] = c.errors.get(kind, 0) + 1
                    c.last_error = j.error = jp.error
                    continue
                changed |= bool(jp.messages) or j.error is not None or (j.lag, j.lag_bytes) != (jp.lag, jp.lag_bytes)
                j.error = None
                if jp.producer_next is not None or jp.lag_bytes is not None:
                    j.producer_next, j.lag, j.lag_bytes = jp.producer_next, jp.lag, jp.lag_bytes
            if complete and client_error is None:
                seen = {jp.journal for jp in journals} | set(skipped)
                for gone in [name for name in c.journals if name not in seen]:
                    del c.journals[gone]
                    changed = True
                changed |= not c.listed
                c.listed = True
            if ok:
                c.last_success = now
                c.last_error = None
            if changed:
                self._dirty.add(client_id)
        if client_id in self._written_in_pass:
            self.write(client_id)  # the record on disk says a pass is under way: it ended
        else:
            self._maybe_write(client_id)

    def snapshot(self) -> list[ClientStatus]:
        """A copy of every client's status, in config order."""
        with self._lock:
            return [_copy(c) for c in self._clients.values()]

    def stale(self, max_age: float) -> list[tuple[str, float]]:
        """The clients whose last successful pass is older than `max_age` seconds, with that age."""
        now = self.clock()
        with self._lock:
            ages = [(c.client_id, c.age(now)) for c in self._clients.values()]
        return [(cid, age) for cid, age in ages if age > max_age]

    def _maybe_write(self, client_id: str) -> None:
        if self.hub_root is None:
            return
        now = self.ticks()
        last = self._written.get(client_id)
        dirty = client_id in self._dirty
        if last is not None and now - last < (WRITE_EVERY if dirty else REFRESH_EVERY):
            return
        self.write(client_id)

    def write(self, client_id: str | None = None) -> None:
        """Write the record of one client (or of every client) now. Errors are logged, never raised."""
        if self.hub_root is None:
            return
        path = os.path.join(self.hub_root, HUB_STATUS_DIR)
        with self._write_lock:
            with self._lock:
                docs = [(c.client_id, c.to_json()) for c in self._clients.values() if client_id in (None, c.client_id)]
                for cid, doc in docs:
                    self._dirty.discard(cid)
                    self._written[cid] = self.ticks()
                    if doc["in_pass"]:
                        self._written_in_pass.add(cid)
                    else:
                        self._written_in_pass.discard(cid)
            for cid, doc in docs:
                doc.update(version=RECORD_VERSION, written=self.clock(), pid=os.getpid())
                try:
                    os.makedirs(path, exist_ok=True)
                    atomic_write(os.path.join(path, f"{cid}.json"), json.dumps(doc).encode(), durable=False)
                except (OSError, SejError) as e:
                    log.warning("client %s: cannot write its status record in %s: %s", cid, path, e,
                                extra={"client": cid})  # fmt: skip

    def forget_others(self) -> None:
        """Remove the records of clients that are not (any more) in the configuration: `sej hub status` would
        report them stale for ever. Only `<client-id>.json` entries of the record directory are removed (a link
        itself, never what it points to)."""
        if self.hub_root is None:
            return
        path = os.path.join(self.hub_root, HUB_STATUS_DIR)
        try:
            names = os.listdir(path)
        except OSError:
            return
        for name in names:
            cid = name.removesuffix(".json")
            if name.endswith(".json") and CLIENT_ID_RE.match(cid) and cid not in self._clients:
                try:
                    os.unlink(os.path.join(path, name))  # a link is removed, never followed
                    log.info("removed the status record of client %s, which hub.toml no longer has", cid)
                except OSError as e:
                    log.warning("cannot remove the status record %s: %s", os.path.join(path, name), e)


def _copy(c: ClientStatus) -> ClientStatus:
    return replace(c, errors=dict(c.errors), journals={k: replace(j) for k, j in c.journals.items()},
                   pass_buckets=list(c.pass_buckets))  # fmt: skip


# -- reading the records: sej hub status ---------------------------------------------------------


@dataclass(frozen=True)
class StatusRow:
    """One hub journal (or a journal a record names that the hub does not have yet), as `sej hub status` shows it."""

    client_id: str
    journal: str  # the producer's name; the hub's is <client_id>.<journal>
    path: str | None  # the hub's journal, None before its first copy
    hub_next: int | None  # from the hub's journal on disk
    producer_next: int | None  # from the client's record: as the daemon's last pass saw it
    lag: int | None
    lag_bytes: int | None
    last_success: float | None  # the client's last successful pass (wall clock), from its record
    error: str | None  # the journal's, else the client's last error
    gone: bool = False  # the hub's copy of a journal the producer no longer has (its record is `listed` without it)


@dataclass(frozen=True)
class HubStatus:
    rows: list[StatusRow]
    records: dict[str, ClientStatus]  # client -> its record
    problems: list[str]  # records that could not be read, hub journals that could not be


def read_status(hub_root: str) -> HubStatus:
    """The hub's journals on disk joined with the daemon's records of its clients."""
    records: dict[str, ClientStatus] = {}
    problems: list[str] = []
    where = os.path.join(hub_root, HUB_STATUS_DIR)
    try:
        names = sorted(os.listdir(where))
    except FileNotFoundError:
        names = []
    except OSError as e:
        problems.append(f"{where}: {e.strerror or e}")
        names = []
    for name in names:
        cid = name.removesuffix(".json")
        if not name.endswith(".json") or not CLIENT_ID_RE.match(cid):
            continue  # temp files of a write under way, and anything else
        path = os.path.join(where, name)
        try:
            records[cid] = parse_record(read_regular(path, MAX_RECORD + 1, show=path), cid)
        except (OSError, SejError, ValueError) as e:
            problems.append(f"{path}: {e}")
    on_disk = {j.name: j.path for j in find_journals(hub_root)}
    rows: list[StatusRow] = []
    seen: set[str] = set()
    for cid, rec in sorted(records.items()):
        for name, js in sorted(rec.journals.items()):
            try:
                dest = destination_name(cid, name)
            except SejError:
                problems.append(f"record of client {cid}: bad journal name {name!r}")
                continue
            seen.add(dest)
            rows.append(_row(cid, name, on_disk.get(dest), js, rec, problems))
    for dest, path in sorted(on_disk.items()):
        if dest in seen:
            continue
        cid, _, name = dest.partition(".")
        if not name or not CLIENT_ID_RE.match(cid):
            problems.append(f"{path}: a journal, but not a hub's <client-id>.<journal>" if dest else
                            f"{path} is a journal, not a hub root of <client-id>.<journal> journals")  # fmt: skip
            continue
        owner = records.get(cid)
        rows.append(_row(cid, name, path, None, owner, problems, gone=owner is not None and owner.listed))
    return HubStatus(rows, records, problems)


def _row(cid: str, name: str, path: str | None, js: JournalStatus | None, rec: ClientStatus | None,
         problems: list[str], gone: bool = False) -> StatusRow:  # fmt: skip
    hub_next = None
    if path is not None:
        try:
            hub_next = next_offset(path)
        except (OSError, SejError) as e:
            problems.append(f"{path}: {e}")
    producer_next = js.producer_next if js is not None else None
    lag, lag_bytes = (js.lag, js.lag_bytes) if js is not None else (None, None)  # as the record's pass found them
    error = (js.error if js is not None else None) or (rec.last_error if rec is not None and not gone else None)
    return StatusRow(cid, name, path, hub_next, producer_next, lag, lag_bytes,
                     rec.last_success if rec is not None else None, error, gone)  # fmt: skip


def parse_record(data: bytes, client_id: str) -> ClientStatus:
    """A client's record, checked field by field; ValueError says what is wrong."""
    if len(data) > MAX_RECORD:
        raise ValueError(f"larger than {MAX_RECORD} bytes")
    try:
        doc = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"not JSON: {e}") from None
    except RecursionError:
        raise ValueError("not a status record: nested too deeply") from None
    if not isinstance(doc, dict) or doc.get("version") != RECORD_VERSION:
        raise ValueError(f"not a version {RECORD_VERSION} status record")
    if doc.get("client_id") != client_id:
        raise ValueError(f"client_id {doc.get('client_id')!r} is not {client_id!r}")
    check_client_id(client_id)
    journals_doc = _field(doc, "journals", dict)
    journals = {}
    for name, j in journals_doc.items():
        if not isinstance(j, dict):
            raise ValueError(f"journal {name!r}: not an object")
        journals[name] = JournalStatus(
            journal=str(name),
            hub_next=_field(j, "hub_next", int, None),
            producer_next=_field(j, "producer_next", int, None),
            lag=_field(j, "lag", int, None),
            lag_bytes=_field(j, "lag_bytes", int, None),
            messages=_field(j, "messages", int),
            bytes=_field(j, "bytes", int),
            error=_field(j, "error", str, None),
        )
    errors = _field(doc, "errors", dict)
    if not all(isinstance(k, str) and _is(v, int) for k, v in errors.items()):
        raise ValueError("errors: not a map of counts")
    return ClientStatus(
        client_id=client_id,
        location=_field(doc, "location", str),
        since=_field(doc, "since", float),
        connected=_field(doc, "connected", bool),
        lost=_field(doc, "lost", float, None),
        passes=_field(doc, "passes", int),
        last_pass_end=_field(doc, "last_pass_end", float, None),
        last_pass_seconds=_field(doc, "last_pass_seconds", float, None),
        last_success=_field(doc, "last_success", float, None),
        errors=dict(errors),
        last_error=_field(doc, "last_error", str, None),
        journals=journals,
        listed=_field(doc, "listed", bool, False),
        written=_field(doc, "written", float, None),
        in_pass=_field(doc, "in_pass", bool, False),
        last_progress=_field(doc, "last_progress", float, None),
    )


def _is(value: object, kind: type) -> bool:
    if kind is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if kind is int:
        return isinstance(value, int) and not isinstance(value, bool) and value >= 0
    return isinstance(value, kind)


_MISSING = object()


def _field(doc: dict[str, Any], key: str, kind: type, default: object = _MISSING) -> Any:
    value = doc.get(key, _MISSING)
    if value is _MISSING or (value is None and default is None):
        if default is _MISSING:
            raise ValueError(f"missing {key}")
        return default
    if not _is(value, kind):
        raise ValueError(f"{key} = {value!r}: not a {'non-negative int' if kind is int else kind.__name__}")
    return float(value) if kind is float else value


__all__ = [
    "ClientStatus",
    "HubStatus",
    "JournalPass",
    "JournalStatus",
    "StatusBook",
    "StatusRow",
    "parse_record",
    "read_status",
]
