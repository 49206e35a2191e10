"""The hub's side of the serve transport: a Source over `sej serve` on the producer, through an SSH exec channel.

One exec channel of the client's SSH connection runs `sej serve ROOT` (sej.hub.serve_server); every
ServeSource of that client shares it (a `Connection`). Calls are pipelined: `many` sends all its calls
at once and then waits for their replies, so each phase of a pass (sej.hub.batch) costs one round trip
whatever the number of journals. A thread per connection reads the replies and hands each to its call.

Every reply is hostile until checked (sej.hub.serve_protocol.check_result): names validated, sizes
and counts bounded; the copy engine then checks frames and checksums as for any source.
"""

from __future__ import annotations

import errno
import logging
import posixpath
import shlex
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import xxhash

from ..checksum import HEADER as SUM_HEADER
from ..errors import CorruptionError, InvalidArgumentError, ProtocolError, SejError, UnsafeFileError
from . import serve_protocol as wire
from .copy import CHECK_WINDOW
from .source import IO_TIMEOUT, Call, SourceError, SourceSegment

if TYPE_CHECKING:
    import paramiko

log = logging.getLogger("sej.hub")

HELLO_TIMEOUT = IO_TIMEOUT
"""Seconds for `sej serve` to start and answer the hello: as long as any call may take. A Python start on a busy
producer (its shell's profile, imports on loaded cores) took more than 15 s in the rehearsal, and a hub that gave
up at 15 s killed that server and started another, which was no faster: the client was never served."""

RECV_SIZE = 1 << 20

STATE_TRUST = 30.0
"""Seconds a full STATE (protocol version 2) is trusted to answer a pass's listing and probe without asking, after
which those calls go to the server again until a new one comes (asked for after half that): an event the watch
missed costs at most this. Pushes keep the state current in between."""

PUSHED_KEPT = 64 << 20
"""Bytes pushed (protocol version 3: new bytes and checksum files) kept at most, waiting for the pass that reads them;
the oldest go first (their reads then go to the server)."""

ENTRY_COST = 256
"""Bytes each kept entry counts for besides its bytes (PUSHED_KEPT bounds how many: pushes of nothing are entries)."""

KEEP_AT_MOST = max(2 * wire.PUSH_JOURNAL, 2 * CHECK_WINDOW)
"""Bytes of one segment (and of its checksum file) kept at most: the end, from which the next read starts."""

KEEP_TAIL = 2 * CHECK_WINDOW
"""Bytes kept before the end of what a read took (the next pass's read starts CHECK_WINDOW before the hub's end)."""

SEND_BATCH = 1 << 20
"""Bytes of calls sent in one write: a pass's thousands of calls go out in a few SSH packets' worth each."""


class ServeUnavailable(SourceError):
    """`sej serve` could not be run on the producer, or what ran is not it (sej missing or too old, a forced
    sftp-server, a shell's error): with transport "auto" the hub copies over SFTP instead."""


def serve_command_line(command: str, root: str) -> str:
    """The remote command line: `command` (a program and its first arguments, as a shell reads them) + serve ROOT."""
    return f"{command} serve {shlex.quote(root)}"


_MISS = object()
"""Not answered by what was pushed."""


class _Call:
    """A call under way: its method and arguments, the bytes of its result so far, and how it ended."""

    __slots__ = ("method", "args", "limit", "parts", "size", "done", "value", "error", "cond")

    def __init__(self, method: str, args: list[Any], cond: threading.Condition) -> None:
        self.method, self.args, self.cond = method, args, cond
        self.limit = wire.result_limit(method, args)
        self.parts: list[bytes] = []
        self.size = 0
        self.done = False
        self.value: Any = None
        self.error: BaseException | None = None

    def wait(self, timeout: float) -> bool:
        """Wait until the call is answered (or its connection failed), at most `timeout` seconds; whether it was."""
        with self.cond:
            return self.cond.wait_for(lambda: self.done, timeout)


class Connection:
    """`sej serve` on one exec channel: the hello, then calls pipelined, their replies read by a thread.

    `failed` is set once the stream is unusable (closed, a bad frame, a stall): every call waiting and
    every later one raises a SourceError saying why. `on_changed(journals)` hears the server's pushes.
    """

    def __init__(self, channel: paramiko.Channel, label: str, root: str, io_timeout: float = IO_TIMEOUT,
                 hello_timeout: float = HELLO_TIMEOUT, command: str = "",
                 versions: tuple[int, ...] = wire.VERSIONS) -> None:  # fmt: skip
        self.channel, self.label, self.io_timeout = channel, label, io_timeout
        self.versions = versions
        self.command = command
        self._decoder = wire.Decoder(magic=True)
        self._calls: dict[int, _Call] = {}
        self._next_id = 1
        self._cond = threading.Condition()
        self._send_lock = threading.Lock()
        self.failed: SourceError | None = None
        self.on_changed: Callable[[list[str]], None] | None = None
        self.heard = time.monotonic()  # when the server last sent anything
        self.state: wire.State | None = None  # what the pushes told (version 2), once a whole state came
        self.state_skipped: dict[str, str] = {}
        self.state_at = 0.0  # when the last whole state came
        self._building: wire.State | None = None  # a whole state coming in several frames
        self._skipped_was: dict[str, str] | None = None  # state_skipped before the whole state coming
        # Version 3's pushed bytes, joined to the end of what the last read returned (the server pushes what follows
        # it): (journal, segment) -> (start, bytes), and -> (start, header, the file from start) or None (no checksum
        # file); _kept: their bytes in all (at most PUSHED_KEPT). A journal whose copy failed is forgotten.
        self._data: dict[tuple[str, str], tuple[int, bytes, tuple[int, int] | None]] = {}  # and (st_dev, st_ino)
        self._sums: dict[tuple[str, str], tuple[int, bytes, bytes] | None] = {}
        self._of: dict[str, set[str]] = {}  # journal -> its segments in _data or _sums
        self._kept = 0  # and ENTRY_COST an entry
        self._refresh_asked = 0.0
        started = time.monotonic()
        self.version, self.sej_version, self.root = self._hello(root, hello_timeout)
        self.round_trip = time.monotonic() - started  # the hello's (sej.hub.batch's probe reads it)
        self._thread = threading.Thread(target=self._read_replies, name=f"sej-serve {label}", daemon=True)
        self._thread.start()

    # The hello, in the caller's thread.

    def _hello(self, root: str, timeout: float) -> tuple[int, str, str]:
        try:
            self.channel.settimeout(timeout)
            self.channel.sendall(wire.encode(wire.hub_hello(root, self.versions)))
            deadline = time.monotonic() + timeout
            for _ in range(1 << 20):  # each recv returns at least a byte, or ends the loop
                msg = self._decoder.next()
                if msg is not None:
                    return wire.parse_server_hello(msg, self.versions)
                if time.monotonic() > deadline:
                    break
                data = self.channel.recv(RECV_SIZE)
                if not data:
                    raise ServeUnavailable(f"{self.label}: {self.command or 'sej serve'} ended without a hello"
                                           f"{self._exit_why()}")  # fmt: skip
                self._decoder.feed(data)
            raise ServeUnavailable(f"{self.label}: no hello from {self.command or 'sej serve'} within {timeout:g} s")
        except ProtocolError as e:
            raise ServeUnavailable(f"{self.label}: {e}{self._exit_why()}") from None
        except TimeoutError:
            raise ServeUnavailable(f"{self.label}: no hello from {self.command or 'sej serve'} within {timeout:g} s"
                                   ) from None  # fmt: skip
        except (OSError, EOFError) as e:
            raise ServeUnavailable(f"{self.label}: {str(e) or type(e).__name__}{self._exit_why()}") from None
        finally:
            try:
                # A send that gets no window for this long fails (a stalled server); the reader thread's recv wakes
                # as often to see whether the connection failed meanwhile.
                self.channel.settimeout(self.io_timeout)
            except (OSError, EOFError):
                pass

    def _exit_why(self) -> str:
        """What the remote command said and how it exited, if it did (a shell's `sej: not found`, 127)."""
        parts = []
        try:
            if self.channel.recv_stderr_ready():
                text = self.channel.recv_stderr(4096).decode("utf-8", "replace").strip().splitlines()
                if text:
                    parts.append(repr(text[-1][:300]))
            if self.channel.status_event.wait(1.0):  # bounded: the exit status comes with the EOF, or not at all
                parts.append(f"exit status {self.channel.exit_status}")
        except (OSError, EOFError):
            pass
        return f" ({', '.join(parts)})" if parts else ""

    # The replies, in the connection's thread.

    def _read_replies(self) -> None:
        try:
            for _ in range(1 << 62):  # until the stream ends or fails
                if self.failed is not None:
                    return
                try:
                    data = self.channel.recv(RECV_SIZE)
                except TimeoutError:  # nothing to read: a quiet producer (the waiting calls time out themselves)
                    continue
                if not data:
                    self._fail(SourceError(f"{self.label}: sej serve closed the stream{self._exit_why()}"))
                    return
                self.heard = time.monotonic()
                self._decoder.feed(data)
                for _ in range(len(data)):  # at most one message per byte fed
                    msg = self._decoder.next()
                    if msg is None:
                        break
                    self._dispatch(msg)
        except ProtocolError as e:
            self._fail(SourceError(f"{self.label}: sej serve: {e}"))
        except (OSError, EOFError) as e:
            self._fail(SourceError(f"{self.label}: {str(e) or type(e).__name__}"))
        except BaseException as e:  # a bug here must not leave the calls waiting
            self._fail(SourceError(f"{self.label}: reading sej serve's replies: {type(e).__name__}: {e}"))
            raise

    def _dispatch(self, msg: list[Any]) -> None:
        kind = msg[0]
        if kind == wire.CHANGED:
            journals = wire.parse_changed(msg)
            with self._cond:
                self.state = None  # the server could not list them: the passes ask
            if self.on_changed is not None:
                self.on_changed(journals)
            return
        if kind == wire.STATE and self.version >= 2:
            self._state(*wire.parse_state(msg, self.version))
            return
        if kind == wire.ERROR and len(msg) == 5 and msg[1] == 0:
            _id, _kind, text, _detail = wire.parse_error(msg)
            raise ProtocolError(f"the server ended the stream: {text}")
        if kind == wire.PART_:
            call_id, piece = wire.parse_part(msg)
            c = self._call(call_id)
            c.size += len(piece)
            if c.size > c.limit:
                raise ProtocolError(f"call {call_id} ({c.method}): more than {c.limit} bytes in reply")
            c.parts.append(piece)
            return
        if kind == wire.REPLY:
            call_id, value = wire.parse_reply(msg)
            c = self._call(call_id)
            if c.parts:
                if not isinstance(value, bytes):
                    raise ProtocolError(f"call {call_id} ({c.method}): pieces of bytes, then {type(value).__name__}")
                value = b"".join([*c.parts, value])
            c.value = wire.check_result(c.method, c.args, value)
            self._done(call_id)
            return
        if kind == wire.ERROR:
            call_id, what, text, detail = wire.parse_error(msg)
            self._call(call_id).error = self._error(what, text, detail)
            self._done(call_id)
            return
        raise ProtocolError(f"a {wire.KINDS[kind]} message from the server")

    def _state(self, full: bool, got: wire.State, gone: list[str], skipped: dict[str, str], more: bool,
               pushed: list[wire.Pushed]) -> None:  # fmt: skip
        """A STATE pushed: the journals' segments as the server listed them after they changed (and, version 3, the
        bytes they gained)."""
        news: list[str] | None = None  # the journals to look at ([]: any may have changed; None: none)
        with self._cond:
            for j in gone:
                self._forget(j)
            for j, segs in got.items():
                self._settle(j, segs)
            for journal, name, start, data, skip, sums, check in pushed:
                self._keep(journal, name, start, data, skip, sums, check)
            if full:
                self._skipped_was = self.state_skipped
                self._building, self.state_skipped = dict(got), skipped
            elif self._building is not None:
                self._building.update(got)
                for j in gone:
                    self._building.pop(j, None)
            if not full and self.state is not None:  # also while a whole state comes: the server pushes on meanwhile
                self.state.update(got)
                for j in gone:
                    self.state.pop(j, None)
            if self._building is not None and not more:
                news = _news(self.state, self._building, self._skipped_was != self.state_skipped)
                self.state, self._building = self._building, None
                self.state_at = time.monotonic()
            elif not full and not more:
                news = sorted([*got, *gone])
        if self.on_changed is not None and news is not None:
            self.on_changed(news)

    def _settle(self, journal: str, segs: list[tuple[int, str, int]] | None) -> None:
        """Drop what is kept of `journal`'s segments that its listing `segs` no longer has, or has shorter than what
        is kept (cut: what follows may be written again, otherwise)."""
        names = self._of.get(journal)
        if not names:
            return
        sizes = {} if segs is None else {name: size for _first, name, size in segs}
        for name in list(names):
            size = sizes.get(name)
            had = self._data.get((journal, name))
            if size is None or had is not None and had[0] + len(had[1]) > size:
                self._drop((journal, name))

    def _keep(self, journal: str, name: str, start: int, data: bytes, skip: int, sums: bytes | None,
              check: wire.Check | None) -> None:  # fmt: skip
        """Keep a segment's pushed bytes, after those kept if the push's check vouches for them, and as much of its
        checksum file."""
        key = (journal, name)
        had = self._drop_data(key)
        ident = None if check is None else (check[2], check[3])
        joined = start == 0  # nothing before them
        if had is not None and check is not None and not joined:
            s0, d0, ident0 = had
            lo = start - check[0]
            if (ident0 is None or ident0 == ident) and s0 <= lo and start <= s0 + len(d0) and \
                    xxhash.xxh3_64_intdigest(d0[lo - s0 : start - s0]) == check[1]:  # fmt: skip
                start, data, joined = lo, d0[lo - s0 : start - s0] + data, True  # the window vouched for, no more
        self._put_data(key, start, data, ident)
        if sums is None:
            self._drop_sums(key)
            self._put_entry(self._sums, key, None, 0)
        else:
            if not joined:
                self._drop_sums(key)
            self._put_sums(key, skip, sums, newer=True)
        for _ in range(len(self._data) + len(self._sums)):  # the oldest go first
            if self._kept <= PUSHED_KEPT:
                break
            self._drop(next(iter(self._data or self._sums)))

    def _put_entry(self, kept: dict[tuple[str, str], Any], key: tuple[str, str], value: Any, size: int) -> None:
        kept[key] = value
        self._kept += size + ENTRY_COST
        self._of.setdefault(key[0], set()).add(key[1])

    def _drop_entry(self, kept: dict[tuple[str, str], Any], key: tuple[str, str], size: Callable[[Any], int]) -> Any:
        if key not in kept:
            return None
        had = kept.pop(key)
        self._kept -= ENTRY_COST + (0 if had is None else size(had))
        if key not in self._data and key not in self._sums:
            names = self._of.get(key[0])
            if names is not None:
                names.discard(key[1])
                if not names:
                    del self._of[key[0]]
        return had

    def _drop(self, key: tuple[str, str]) -> None:
        self._drop_data(key)
        self._drop_sums(key)

    def _drop_data(self, key: tuple[str, str]) -> tuple[int, bytes, tuple[int, int] | None] | None:
        return self._drop_entry(self._data, key, lambda had: len(had[1]))  # type: ignore[no-any-return]

    def _drop_sums(self, key: tuple[str, str]) -> tuple[int, bytes, bytes] | None:
        return self._drop_entry(self._sums, key, lambda had: len(had[1]) + len(had[2]))  # type: ignore[no-any-return]

    def _put_data(self, key: tuple[str, str], start: int, data: bytes, ident: tuple[int, int] | None) -> None:
        """Keep a segment's bytes from `start` on (`ident`: the file's, as a push's check says; None: unknown)."""
        if len(data) > KEEP_AT_MOST:  # the end is what the next read starts from
            start, data = start + len(data) - KEEP_AT_MOST, data[-KEEP_AT_MOST:]
        self._put_entry(self._data, key, (start, data, ident), len(data))

    def _put_sums(self, key: tuple[str, str], skip: int, sums: bytes, newer: bool) -> None:
        """Kept bytes of a checksum file (what read_sums(skip) answered): pushed ones (`newer`) after those kept if
        they follow on; read ones instead of those kept, unless those go further (pushed since the read)."""
        head, base, body = (sums[: SUM_HEADER.size], skip, sums[SUM_HEADER.size :]) if skip else (
            sums[: SUM_HEADER.size], 0, sums)  # fmt: skip
        had = self._drop_sums(key)
        if had is not None:
            b0, _h0, d0 = had
            if newer and b0 <= base <= b0 + len(d0):
                base, body = b0, d0[: base - b0] + body
            elif not newer and b0 + len(d0) > base + len(body):
                base, head, body = had
        if len(body) > KEEP_AT_MOST and base + len(body) - KEEP_AT_MOST > SUM_HEADER.size:
            base, body = base + len(body) - KEEP_AT_MOST, body[-KEEP_AT_MOST:]
        self._put_entry(self._sums, key, (base, head, body), len(head) + len(body))

    def _take(self, method: str, args: list[Any]) -> Any:
        """A read's or read_sums' result from what was pushed (and the end of what was read), or _MISS. What it
        covers before its end's last KEEP_TAIL bytes is dropped: the next pass's read starts CHECK_WINDOW before the
        copy's end, and the next push's check (wire.PUSH_WINDOW) looks at that tail. A read again within it (a small
        one, a retry) is answered from it again; a copy that fails forgets its journal's (ServeSource.forget), whose
        next reads go to the server."""
        key = (args[0], args[1])
        if method == "read":
            got = self._data.get(key)
            pos, size = args[2], args[3]
            if got is None or not got[0] <= pos or pos + size > got[0] + len(got[1]):
                return _MISS
            start, data, ident = got
            cut = pos + size - KEEP_TAIL - start  # the next read starts after this one's end, less CHECK_WINDOW
            if cut > 0:
                self._kept -= cut
                self._data[key] = (start + cut, data[cut:], ident)
            return data[pos - start : pos - start + size]
        if key not in self._sums:
            return _MISS
        sums = self._sums[key]
        if sums is None:
            return None
        base, head, body = sums
        skip = args[2] if args[2] > SUM_HEADER.size else 0
        if skip == 0:
            return body if base == 0 else _MISS
        if base > skip:
            return _MISS
        answer = head + body[skip - base :]
        cut = len(body) - KEEP_TAIL  # the next read starts from this one's last whole record, or after it
        if cut > 0 and base + cut > SUM_HEADER.size:
            self._kept -= cut
            self._sums[key] = (base + cut, head, body[cut:])
        return answer

    def learn(self, calls: list[Call], results: list[Any]) -> None:
        """Keep the end of what reads from the server returned, for the next pass's reads (which start a little
        before the end of this one's) and the next push's check; instead of what is kept, unless that goes further
        (pushed since: never joined to a read's bytes, which no check vouched for with it)."""
        with self._cond:
            for (method, *args), got in zip(calls, results, strict=True):
                key = (args[0], args[1]) if method in ("read", "read_sums") else None
                if key is None or not isinstance(got, bytes):
                    continue
                if method == "read_sums":
                    self._put_sums(key, args[2] if args[2] > SUM_HEADER.size else 0, got, newer=False)
                    continue
                had = self._data.get(key)
                if got and (had is None or had[0] + len(had[1]) <= args[2] + len(got)):
                    self._drop_data(key)
                    self._put_data(key, args[2], got, None)
            for _ in range(len(self._data) + len(self._sums)):  # the oldest go first
                if self._kept <= PUSHED_KEPT:
                    break
                self._drop(next(iter(self._data or self._sums)))

    def forget(self, journals: set[str] | None) -> None:
        """Drop what is kept of `journals` (None: all): their copy failed, so the next one reads afresh."""
        with self._cond:
            for j in list(self._of) if journals is None else journals:
                self._forget(j)

    def _forget(self, journal: str) -> None:
        for name in list(self._of.get(journal, ())):
            self._drop((journal, name))

    def known(self, calls: list[Call]) -> dict[int, Any] | None:
        """The results of `calls` the pushes tell, by index: journals, segments and size from the state, reads from
        the bytes pushed (version 3); None without a trusted state. Asks the server for a new whole state when this
        one is getting old."""
        now = time.monotonic()
        with self._cond:
            state = self.state
            if state is None or self.failed is not None:
                return None
            age = now - self.state_at
            refresh = age >= STATE_TRUST / 2 and now - self._refresh_asked >= STATE_TRUST / 2
            if refresh:
                self._refresh_asked = now
            out: dict[int, Any] = {}
            pushed = bool(self._data or self._sums)
            trusted = age < STATE_TRUST
            for i, (method, *args) in enumerate(calls):  # one look at each: a probe asks a thousand sizes
                if method == "size":
                    segs = state.get(args[0]) if trusted else None
                    if segs is not None:
                        name = args[1]
                        out[i] = None
                        for _first, seg, size in segs:
                            if seg == name:
                                out[i] = size
                                break
                elif method in ("read", "read_sums"):
                    if pushed:
                        got = self._take(method, args)
                        if got is not _MISS:
                            out[i] = got
                elif not trusted:
                    continue
                elif method == "journals":
                    out[i] = (sorted(state), dict(self.state_skipped))
                elif method == "segments":
                    segs = state.get(args[0])
                    if segs is not None:  # else a journal the state does not know
                        out[i] = list(segs)
        if refresh and self.on_changed is not None:
            self.watch(self.on_changed)
        return out

    def settled_for(self) -> float:
        """Seconds more the pushed state answers a pass's listing and probe without asking (STATE_TRUST after it came;
        a pass after half of that asks for a new one, and the passes meanwhile look at the pushed journals only, as
        before): 0 without a whole state (version 1, a CHANGED, not come yet) or on a failed stream."""
        with self._cond:
            if self.state is None or self.failed is not None:
                return 0.0
            return max(0.0, self.state_at + STATE_TRUST - time.monotonic())

    def _call(self, call_id: int) -> _Call:
        with self._cond:
            c = self._calls.get(call_id)
        if c is None:
            raise ProtocolError(f"a reply to call {call_id}, which is not under way")
        return c

    def _done(self, call_id: int) -> None:
        with self._cond:
            c = self._calls.pop(call_id)
            c.done = True
            c.parts = []
            self._cond.notify_all()

    def _error(self, kind: str, text: str, detail: Any) -> BaseException:
        """The exception a server's ERROR stands for, as a LocalSource would have raised it, naming the producer."""
        where = f"{self.label}:"
        if kind == "missing":
            return FileNotFoundError(errno.ENOENT, where + text)
        if kind == "unsafe":
            return UnsafeFileError(where + detail[0], detail[1], detail[2])
        if kind == "invalid":
            return InvalidArgumentError(f"{where} {text}")
        if kind == "corrupt":
            return _Corrupt(f"{where} {text}")
        if kind == "os":
            return OSError(detail if detail is not None and detail < 1 << 31 else errno.EIO, where + text)
        return SourceError(f"{where} sej serve: {text}" if kind in ("internal", "protocol") else f"{where} {text}")

    def _fail(self, e: SourceError) -> None:
        with self._cond:
            if self.failed is None:
                self.failed = e
            for c in self._calls.values():
                c.error, c.done = self.failed, True
            self._calls.clear()
            self._cond.notify_all()
        try:
            self.channel.close()  # the server sees its stdin end, and exits
        except (OSError, EOFError):
            pass

    # Calls, from any thread.

    def call_many(self, calls: list[Call]) -> list[Any]:
        """Each call's checked result, or the SejError or OSError the server reported for it; a failed stream
        raises a SourceError for all of them."""
        pending = self.send(calls)
        self._wait(pending)
        return [c.error if c.error is not None else c.value for c in pending]

    def send(self, calls: list[Call]) -> list[_Call]:
        """Send `calls` (pipelined, in order) without waiting: each is `done` once answered, with its checked `value`
        or its `error` (a failed stream: that SourceError)."""
        pending: list[_Call] = []
        frames: list[bytes] = []
        for method, *args in calls:
            if method not in wire.METHODS:
                raise InvalidArgumentError(f"sej serve has no call {method!r}")
            pending.append(_Call(method, args, self._cond))
        with self._send_lock:
            with self._cond:
                if self.failed is not None:
                    raise self.failed
                first = self._next_id
                self._next_id += len(pending)
                for k, c in enumerate(pending):
                    self._calls[first + k] = c
            try:
                size = 0
                for k, c in enumerate(pending):
                    frames.append(wire.encode(wire.call(first + k, c.method, c.args)))
                    size += len(frames[-1])
                    if size >= SEND_BATCH:
                        self._send(b"".join(frames))
                        frames, size = [], 0
                if frames:
                    self._send(b"".join(frames))
            except (OSError, EOFError) as e:
                self._fail(SourceError(f"{self.label}: sending to sej serve: {str(e) or type(e).__name__}"))
        return pending

    def _send(self, data: bytes) -> None:
        self.channel.sendall(data)

    def _wait(self, pending: list[_Call]) -> None:
        with self._cond:
            for c in pending:
                for _ in range(1 << 30):  # woken by each reply, or each second
                    if c.done:
                        break
                    silent = time.monotonic() - self.heard
                    if silent >= self.io_timeout:
                        break
                    self._cond.wait(min(1.0, self.io_timeout - silent))
                if not c.done:  # the server has said nothing for io_timeout while a call waits
                    waited = self.io_timeout
                    self._cond.release()
                    try:
                        self._fail(SourceError(f"{self.label}: no reply within {waited:g} s (the I/O timeout) from "
                                               f"sej serve (waiting on {c.method} {' '.join(map(str, c.args))})"))
                    finally:
                        self._cond.acquire()
        if self.failed is not None and any(c.error is self.failed for c in pending):
            raise self.failed

    def watch(self, on_changed: Callable[[list[str]], None]) -> None:
        """Ask the server to push the journals that change (sej.hub.serve_watch): `on_changed(journals)` is called
        in the connection's thread for each push ([]: anything may have changed)."""
        self.on_changed = on_changed
        with self._send_lock:
            try:
                self._send(wire.encode(wire.watch(0)))
            except (OSError, EOFError) as e:
                self._fail(SourceError(f"{self.label}: sending to sej serve: {str(e) or type(e).__name__}"))

    def close(self) -> None:
        self._fail(SourceError(f"{self.label}: the connection to sej serve was closed"))


def _news(old: wire.State | None, new: wire.State, skipped: bool) -> list[str] | None:
    """What a whole state `new` tells a pass to look at, after `old`: [] (every journal) for the first, or when the
    journals (or the directories `skipped`) are not those of `old`; else the journals whose listing is not the one
    the state had, or that the server could not list; None if none. The whole state every 15 s catches what the
    watch missed: a journal whose listing it did not change answers a pass as before, where a pass over it found
    it copied (a push since named it, and FULL_EVERY's pass looks at every journal), and a pass over every journal
    for each refresh took the hub's CPU from the pushed journals' passes for nothing."""
    if old is None or skipped or old.keys() != new.keys():
        return []
    changed = [j for j, segs in new.items() if segs is None or old[j] != segs]
    return changed or None


class _Corrupt(CorruptionError):
    """A CorruptionError the server reported (its path and position are in the text)."""

    def __init__(self, text: str) -> None:
        SejError.__init__(self, text)
        self.path, self.position, self.reason, self.length, self.quarantine = text, 0, text, 0, None


def open_connection(transport: paramiko.Transport, root: str, label: str, command: str = "sej",
                    io_timeout: float = IO_TIMEOUT, hello_timeout: float = HELLO_TIMEOUT) -> Connection:  # fmt: skip
    """Run `command serve ROOT` on an exec channel of `transport` and say hello; ServeUnavailable why not."""
    import paramiko

    line = serve_command_line(command, root)
    try:
        channel = transport.open_session(timeout=hello_timeout)
        channel.exec_command(line)
    except (paramiko.SSHException, OSError, EOFError) as e:
        raise ServeUnavailable(f"{label}: cannot run {line!r}: {str(e) or type(e).__name__}") from None
    try:
        return Connection(channel, label, root, io_timeout, hello_timeout, line)
    except BaseException:
        channel.close()
        raise


class ServeSource:
    """A Source over a Connection to `sej serve` (shared by every ServeSource of the client)."""

    remote = True
    reads_seen = False  # the server lstats what it opens itself, at no round trip
    defers_commit = False

    def __init__(self, conn: Connection, label: str) -> None:
        self.conn, self.label = conn, label
        self.root = conn.root
        self._skipped: dict[str, str] = {}

    @property
    def round_trip(self) -> float:
        return self.conn.round_trip

    @property
    def broken(self) -> bool:
        return self.conn.failed is not None

    def sums_mark(self, journal: str, name: str) -> None:
        return None  # only a pass's Prefetched knows

    def keep_handles(self, most: int) -> None:
        """Nothing to keep: the server opens what it reads on its own machine, at no round trip."""

    def forget(self, journals: set[str] | None = None) -> None:
        """Drop the pushed bytes kept of `journals` (None: all): gone, failed or stalled, they are read afresh."""
        self.conn.forget(journals)

    def tidy(self) -> None:
        """Nothing kept."""

    def _convert(self, method: str, value: Any) -> Any:
        if isinstance(value, BaseException):
            return value
        if method == "journals":
            names, self._skipped = value
            return names
        if method == "segments":
            return [SourceSegment(*s) for s in value]
        return value

    def many(self, calls: list[Call]) -> list[Any]:
        known = self.conn.known(calls)  # pushed: the listing, the probe and the reads cost no round trip
        asked = calls if not known else [c for i, c in enumerate(calls) if i not in known]
        answers = self.conn.call_many(asked) if asked else []
        if self.conn.version >= 3:
            self.conn.learn(asked, answers)
        got = iter(answers)
        results = [known[i] if known and i in known else next(got) for i in range(len(calls))]
        return [self._convert(c[0], r) for c, r in zip(calls, results, strict=True)]

    def _one(self, *call: Any) -> Any:
        (result,) = self.many([call])
        if isinstance(result, BaseException):
            raise result
        return result

    def journals(self) -> list[str]:
        return self._one("journals")  # type: ignore[no-any-return]

    def skipped(self) -> dict[str, str]:
        return dict(self._skipped)

    def segments(self, journal: str) -> list[SourceSegment]:
        return self._one("segments", journal)  # type: ignore[no-any-return]

    def size(self, journal: str, name: str) -> int | None:
        return self._one("size", journal, name)  # type: ignore[no-any-return]

    def read(self, journal: str, name: str, pos: int, size: int) -> bytes:
        return self._one("read", journal, name, pos, size)  # type: ignore[no-any-return]

    def read_sums(self, journal: str, name: str, skip: int = 0) -> bytes | None:
        return self._one("read_sums", journal, name, skip)  # type: ignore[no-any-return]

    def read_offset(self, journal: str, reader: str) -> int | None:
        return self._one("read_offset", journal, reader)  # type: ignore[no-any-return]

    def commit_offset(self, journal: str, reader: str, value: int, sweep: bool = True) -> None:
        self._one("commit_offset", journal, reader, value, sweep)

    def commit_later(self, calls: list[Call]) -> list[_Call]:
        """Send commit_offset `calls` without waiting for the server's fsyncs (the daemon's: a pass need not wait a
        round trip and the producer's syncs for them); each is `done` once answered, with its `error` if it failed
        (a failed stream fails those still waiting)."""
        if any(c[0] != "commit_offset" for c in calls):
            raise InvalidArgumentError("commit_later sends commit_offset calls only")
        return self.conn.send(calls)

    def describe(self, journal: str, name: str = "") -> str:
        path = posixpath.join(self.root, journal, "jnl", name) if name else posixpath.join(self.root, journal)
        return f"{self.label}:{path}"

    def close(self) -> None:
        pass  # the connection is the client's (serve_sources), closed with its SSH connection


class ServeSources:
    """A factory of ServeSources over one `sej serve` on the producer, started when this is made (ServeUnavailable if
    it cannot be). A connection that failed (the server killed, a stall) is replaced by the next Source asked for."""

    def __init__(self, client: paramiko.SSHClient, root: str, label: str, io_timeout: float = IO_TIMEOUT,
                 command: str = "sej", hello_timeout: float = HELLO_TIMEOUT) -> None:  # fmt: skip
        from .ssh import SshError

        transport = client.get_transport()
        if transport is None or not transport.is_active():
            raise SshError(f"{label}: the SSH connection is closed")
        self._open = lambda: open_connection(transport, root, label, command, io_timeout, hello_timeout)
        self._lock = threading.Lock()
        self._on_changed: Callable[[list[str]], None] | None = None
        self.conn = self._open()
        self.label = label
        log.debug("%s: sej serve %s, protocol %d, serving %s", label, self.conn.sej_version, self.conn.version,
                  self.conn.root)  # fmt: skip

    def __call__(self) -> ServeSource:
        with self._lock:
            if self.conn.failed is not None:
                self.conn = self._open()
                if self._on_changed is not None:
                    self.conn.watch(self._on_changed)
            return ServeSource(self.conn, self.label)

    def settled_for(self) -> float:
        """Connection.settled_for of the current connection (0 once it failed)."""
        return self.conn.settled_for()

    def watch(self, on_changed: Callable[[list[str]], None]) -> None:
        """Push, not poll: `on_changed(journals)` hears of changes on the producer as they happen, over this
        connection and the ones that replace it."""
        with self._lock:
            self._on_changed = on_changed
            self.conn.watch(on_changed)


def serve_sources(client: paramiko.SSHClient, root: str, label: str, io_timeout: float = IO_TIMEOUT,
                  command: str = "sej", hello_timeout: float = HELLO_TIMEOUT) -> ServeSources:  # fmt: skip
    """The ServeSources of `root` on the producer `client` is connected to (see ServeSources)."""
    return ServeSources(client, root, label, io_timeout, command, hello_timeout)


__all__ = ["Connection", "ServeSource", "ServeSources", "ServeUnavailable", "open_connection", "serve_sources"]
