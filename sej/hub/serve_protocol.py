"""The wire format of `sej serve`, in pure functions: bytes in, messages out, no I/O (as h11 is for HTTP).

The hub runs `sej serve ROOT` on the producer over an SSH exec channel (sej.hub.serve_source) and the
two speak this on the channel's stdin and stdout (sej.hub.serve_server):

    hub -> server:  frame frame ...
    server -> hub:  MAGIC frame frame ...
    frame = length (u32, big-endian) | body (msgpack, `length` bytes), 1 <= length <= MAX_FRAME

Every body is a msgpack array whose first item is its kind:

    [HELLO, {"versions": [1, ...], "root": str}]          hub -> server, first
    [HELLO, {"version": 1, "sej": str, "root": str}]      server -> hub, first (or [ERROR, 0, ...]: refused)
    [CALL, id, method, [args...]]                         hub -> server: a Source call (METHODS), id > 0
    [PART, id, bytes]                                     server -> hub: a piece of a bytes result, more follow
    [REPLY, id, value]                                    server -> hub: the result (bytes: its last piece)
    [ERROR, id, kind, message, detail]                    server -> hub: the call failed (id 0: the stream)
    [WATCH, id]                                           hub -> server: push CHANGED (version 1) or STATE
                                                          (version 2) until the stream ends; again: a full STATE
    [CHANGED, [journal, ...]]                             server -> hub: those journals' files changed
    [STATE, full, [[journal, [[segment, size], ...] | None], ...], [gone journal, ...], {skipped: why}, more]
                                                          server -> hub (version 2): the segments of the journals
                                                          that changed, listed after they changed (None: ask);
                                                          `full`: every journal (the first of `more` frames)
    [STATE, ..., more, [[journal, segment, start, bytes, sums skip, sums | None, check], ...]]
                                                          version 3: the same, and the new bytes themselves
                                                          (read after the listing, as `read(journal, segment,
                                                          start, len(bytes))` would answer) with the checksum
                                                          file (as `read_sums(journal, segment, skip)`), so that
                                                          the hub copies an append without a round trip;
                                                          check = [window, xxh3_64 of the window's bytes before
                                                          start, st_dev, st_ino] (the same read: what the hub
                                                          joins them to must match; absent: joined to nothing)

Calls are pipelined: the hub sends as many as it likes, the server answers each in turn. The hub
speaks first, so that a peer which is not `sej serve` (a shell saying `sej: not found`, an
sftp-server forced by authorized_keys) ends the stream at once rather than waiting for input.
Both ends treat the other's bytes as hostile: every frame, message and value is bounded and checked
here, and anything else raises sej.errors.ProtocolError naming it.
"""

from __future__ import annotations

import struct
from typing import Any

import msgpack

from ..checksum import HEADER as SUM_HEADER
from ..errors import InvalidArgumentError, ProtocolError
from ..layout import check_reader_name
from .names import check_journal_name, check_segment_name

MAGIC = b"SEJSERV\x01"
"""The server's first bytes: whatever else answers (a shell, an sftp-server) is not `sej serve`."""

VERSIONS = (1, 2, 3)
"""Protocol versions this sej speaks; the hello picks the highest both ends know. 2: pushes carry STATE (the changed
journals' segments and sizes), so that the hub answers a pass's listing and probe without a round trip. 3: a STATE
also carries the new bytes of those journals and their checksum files (bounded: PUSH_JOURNAL, PUSH_FRAME), so that
the hub answers the pass's reads too."""

PUSH_JOURNAL = 256 << 10
"""Bytes of one journal's segments (and as many of its checksum files) a STATE carries at most (version 3); a journal
that grew more is read by the hub, as over version 2."""

PUSH_FRAME = 8 << 20
"""Bytes of segments and checksum files in one STATE frame at most (version 3): with its listing, well inside
MAX_FRAME."""

PUSH_WINDOW = 8 << 10
"""Bytes before a push's start whose hash the push carries (version 3; twice sej.hub.copy.CHECK_WINDOW, which the
copy compares before its end): the hub joins the new bytes only to kept bytes that match them, and keeps no more of
what it had than that window (see `check` in Pushed)."""

STATE_ENTRIES = 20_000
"""Journals in one STATE frame at most (a full state of more goes in several, `more` set on all but the last)."""

MAX_SEGMENTS = 1 << 16
"""Segments of one journal in a STATE at most (more: sent as None, "ask")."""

MAX_FRAME = 16 << 20
"""Largest frame either end accepts: a listing of about 500,000 segments; bytes go in PART pieces."""

PART = 1 << 20
"""Bytes of a result per frame: a 32 MiB read is 32 frames, each decoded as it comes."""

MAX_READ = 64 << 20
"""Largest read a call may ask for (the copy asks 32 MiB at most, sej.hub.copy.CHUNK)."""

MAX_SUMS = 1 << 30
"""Largest checksum file sent (as sej.hub.source.MAX_SUMS)."""

MAX_TEXT = 4096
"""Longest string in a message (an error's text, a skipped directory's reason)."""

MAX_NAME = 255
"""Longest name (NAME_MAX): journals, segments, readers."""

MAX_U64 = (1 << 64) - 1

HELLO, CALL, REPLY, PART_, ERROR, WATCH, CHANGED, STATE = range(8)
KINDS = {HELLO: "HELLO", CALL: "CALL", REPLY: "REPLY", PART_: "PART", ERROR: "ERROR", WATCH: "WATCH",
         CHANGED: "CHANGED", STATE: "STATE"}  # fmt: skip

METHODS: dict[str, tuple[type, ...]] = {
    "journals": (),
    "segments": (str,),
    "size": (str, str),
    "read": (str, str, int, int),
    "read_sums": (str, str, int),
    "read_offset": (str, str),
    "commit_offset": (str, str, int, bool),
}
"""The Source calls the server answers, and their arguments' types (sej.hub.source.Source)."""

ERROR_KINDS = ("missing", "unsafe", "invalid", "corrupt", "source", "os", "refused", "protocol", "internal")
"""What an ERROR says went wrong: FileNotFoundError, UnsafeFileError, InvalidArgumentError, CorruptionError,
another SejError, another OSError (detail: its errno), a call the server refuses (--restrict), a bad stream,
a bug in the server."""

_LENGTH = struct.Struct(">I")


def encode(message: list[Any]) -> bytes:
    """One frame of `message`; InvalidArgumentError when it is bigger than MAX_FRAME."""
    body = msgpack.packb(message, use_bin_type=True)
    if len(body) > MAX_FRAME:
        raise InvalidArgumentError(f"a {KINDS.get(message[0], message[0])} message of {len(body)} bytes "
                                   f"(at most {MAX_FRAME} in a frame)")  # fmt: skip
    return _LENGTH.pack(len(body)) + body


class Decoder:
    """The messages in a byte stream: `feed` it what arrives, then take messages with `next()` until None.

    With `magic`, the stream must begin with MAGIC (the server's). A frame longer than `max_frame`, a body
    that is not one msgpack array starting with a known kind, or a wrong magic raises ProtocolError, and the
    decoder is unusable from then on (so is the stream: nothing after a bad frame can be trusted).
    """

    def __init__(self, magic: bool = False, max_frame: int = MAX_FRAME) -> None:
        self._buf = bytearray()
        self._pos = 0
        self._magic = magic
        self._max = max_frame
        self._failed: ProtocolError | None = None

    def feed(self, data: bytes) -> None:
        if self._pos > (1 << 20) and self._pos * 2 > len(self._buf):  # drop what was decoded, now and then
            del self._buf[: self._pos]
            self._pos = 0
        self._buf += data

    @property
    def pending(self) -> int:
        """Bytes fed but not yet decoded (a stream that ends with some ended within a frame)."""
        return len(self._buf) - self._pos

    def next(self) -> list[Any] | None:
        """The next whole message, or None until more bytes are fed."""
        if self._failed is not None:
            raise self._failed
        try:
            return self._next()
        except ProtocolError as e:
            self._failed = e
            raise

    def _next(self) -> list[Any] | None:
        buf, pos = self._buf, self._pos
        if self._magic:
            if len(buf) - pos < len(MAGIC):
                if bytes(buf[pos:]) != MAGIC[: len(buf) - pos]:
                    raise ProtocolError(f"not a sej serve stream: it began {bytes(buf[pos:pos + 64])!r}")
                return None
            if bytes(buf[pos : pos + len(MAGIC)]) != MAGIC:
                raise ProtocolError(f"not a sej serve stream: it began {bytes(buf[pos:pos + 64])!r}")
            pos = self._pos = pos + len(MAGIC)
            self._magic = False
        if len(buf) - pos < _LENGTH.size:
            return None
        (n,) = _LENGTH.unpack_from(buf, pos)
        if not 0 < n <= self._max:
            raise ProtocolError(f"a frame of {n} bytes (from 1 to {self._max})")
        if len(buf) - pos - _LENGTH.size < n:
            return None
        body = bytes(buf[pos + _LENGTH.size : pos + _LENGTH.size + n])
        self._pos = pos + _LENGTH.size + n
        return decode_body(body)


def decode_body(body: bytes) -> list[Any]:
    """The message a frame's body holds: a msgpack array whose first item is a known kind."""
    try:
        msg = msgpack.unpackb(body, raw=False, use_list=True, strict_map_key=True)
    except Exception as e:  # msgpack's errors have no common base (ValueError, TypeError, its own, ...)
        raise ProtocolError(f"a frame of {len(body)} bytes that is not one msgpack value: {e}") from None
    if not isinstance(msg, list) or not msg or type(msg[0]) is not int or msg[0] not in KINDS:
        raise ProtocolError(f"a message that is not [kind, ...]: {_show(msg)}")
    return msg


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 200 else text[:200] + "..."


def _text(value: Any, what: str, limit: int = MAX_TEXT) -> str:
    if not isinstance(value, str) or len(value) > limit:
        raise ProtocolError(f"{what} must be a string of at most {limit} characters, got {_show(value)}")
    return value


def _u64(value: Any, what: str) -> int:
    if type(value) is not int or not 0 <= value <= MAX_U64:
        raise ProtocolError(f"{what} must be an integer from 0 to 2**64-1, got {_show(value)}")
    return value


def _shape(msg: list[Any], n: int, what: str) -> None:
    if len(msg) != n:
        raise ProtocolError(f"a {what} message of {len(msg)} items (not {n}): {_show(msg)}")


# The hello, both ways.


def hub_hello(root: str, versions: tuple[int, ...] = VERSIONS) -> list[Any]:
    return [HELLO, {"versions": list(versions), "root": root}]


def parse_hub_hello(msg: list[Any]) -> tuple[list[int], str]:
    """(versions, root) of the hub's hello."""
    if msg[0] != HELLO:
        raise ProtocolError(f"the first message must be a hello, got {KINDS[msg[0]]}")
    _shape(msg, 2, "hello")
    body = msg[1]
    if not isinstance(body, dict):
        raise ProtocolError(f"a hello must carry a map, got {_show(body)}")
    versions = body.get("versions")
    if not isinstance(versions, list) or not 0 < len(versions) <= 64 or not all(type(v) is int for v in versions):
        raise ProtocolError(f"a hello's versions must be a list of 1 to 64 integers, got {_show(versions)}")
    return versions, _text(body.get("root"), "a hello's root")


def choose_version(theirs: list[int], ours: tuple[int, ...] = VERSIONS) -> int | None:
    """The highest version both ends speak; None when there is none."""
    common = set(theirs) & set(ours)
    return max(common) if common else None


def server_hello(version: int, sej_version: str, root: str) -> list[Any]:
    """`root`: the directory the served journals are in (the parent of a journal served alone)."""
    return [HELLO, {"version": version, "sej": sej_version, "root": root}]


def parse_server_hello(msg: list[Any], asked: tuple[int, ...] = VERSIONS) -> tuple[int, str, str]:
    """(version, sej version, root) of the server's hello; a refusal (ERROR) raises ProtocolError with its text."""
    if msg[0] == ERROR:
        _id, kind, text, _detail = parse_error(msg)
        raise ProtocolError(f"sej serve refused the hello ({kind}): {text}")
    if msg[0] != HELLO:
        raise ProtocolError(f"the first message must be a hello, got {KINDS[msg[0]]}")
    _shape(msg, 2, "hello")
    body = msg[1]
    if not isinstance(body, dict):
        raise ProtocolError(f"a hello must carry a map, got {_show(body)}")
    version = body.get("version")
    if type(version) is not int or version not in asked:
        raise ProtocolError(f"sej serve chose protocol version {_show(version)}, not one of {list(asked)}")
    return version, _text(body.get("sej"), "a hello's sej version", 100), _text(body.get("root"), "a hello's root")


# Calls (hub -> server).


def call(call_id: int, method: str, args: tuple[Any, ...] | list[Any]) -> list[Any]:
    return [CALL, call_id, method, list(args)]


def parse_call(msg: list[Any]) -> tuple[int, str, list[Any]]:
    """(id, method, args) of a CALL, its arguments checked against METHODS (types and bounds)."""
    _shape(msg, 4, "call")
    call_id, method, args = _u64(msg[1], "a call's id"), msg[2], msg[3]
    if not isinstance(method, str) or method not in METHODS:
        raise ProtocolError(f"call {call_id}: no method {_show(method)}")
    types = METHODS[method]
    if not isinstance(args, list) or len(args) != len(types):
        raise ProtocolError(f"call {call_id}: {method} takes {len(types)} arguments, got {_show(args)}")
    for k, (arg, t) in enumerate(zip(args, types, strict=True)):
        if t is str:
            _text(arg, f"call {call_id}: {method}'s argument {k + 1}", MAX_NAME)
        elif t is int:
            _u64(arg, f"call {call_id}: {method}'s argument {k + 1}")
        elif type(arg) is not bool:
            raise ProtocolError(f"call {call_id}: {method}'s argument {k + 1} must be true or false, got {_show(arg)}")
    if method == "read" and args[3] > MAX_READ:
        raise ProtocolError(f"call {call_id}: a read of {args[3]} bytes (at most {MAX_READ})")
    return call_id, method, args


def watch(call_id: int) -> list[Any]:
    return [WATCH, call_id]


# Replies (server -> hub).


def reply(call_id: int, value: Any) -> list[bytes]:
    """The frames of a call's result: a bytes result longer than PART goes in pieces."""
    if isinstance(value, bytes) and len(value) > PART:
        pieces = [encode([PART_, call_id, value[p : p + PART]]) for p in range(0, len(value) - PART, PART)]
        return [*pieces, encode([REPLY, call_id, value[len(pieces) * PART :]])]
    return [encode([REPLY, call_id, value])]


def error(call_id: int, kind: str, text: str, detail: Any = None) -> list[Any]:
    assert kind in ERROR_KINDS, kind
    return [ERROR, call_id, kind, text[:MAX_TEXT], detail]


def parse_error(msg: list[Any]) -> tuple[int, str, str, Any]:
    """(id, kind, text, detail) of an ERROR; detail is [path, kind, expected] for "unsafe", an errno for "os"."""
    _shape(msg, 5, "error")
    call_id, kind, text, detail = _u64(msg[1], "an error's id"), msg[2], msg[3], msg[4]
    if kind not in ERROR_KINDS:
        raise ProtocolError(f"error {call_id}: no error kind {_show(kind)}")
    _text(text, f"error {call_id}'s text")
    if kind == "unsafe":
        if not isinstance(detail, list) or len(detail) != 3:
            raise ProtocolError(f"error {call_id}: an unsafe file's detail must be [path, kind, expected]")
        detail = [_text(d, f"error {call_id}'s detail") for d in detail]
    elif kind == "os":
        detail = None if detail is None else _u64(detail, f"error {call_id}'s errno")
    elif detail is not None:
        raise ProtocolError(f"error {call_id}: a {kind} error carries no detail, got {_show(detail)}")
    return call_id, kind, text, detail


def parse_part(msg: list[Any]) -> tuple[int, bytes]:
    _shape(msg, 3, "part")
    if not isinstance(msg[2], bytes):
        raise ProtocolError(f"part of reply {_show(msg[1])} is not bytes: {_show(msg[2])}")
    return _u64(msg[1], "a part's id"), msg[2]


def parse_reply(msg: list[Any]) -> tuple[int, Any]:
    _shape(msg, 3, "reply")
    return _u64(msg[1], "a reply's id"), msg[2]


def changed(journals: list[str]) -> list[Any]:
    return [CHANGED, journals]


def parse_changed(msg: list[Any], most: int = 1 << 20) -> list[str]:
    _shape(msg, 2, "changed")
    names = msg[1]
    if not isinstance(names, list) or len(names) > most:
        raise ProtocolError(f"a changed message must list at most {most} journals, got {_show(names)}")
    return [_journal(n) for n in names]


State = dict[str, list[tuple[int, str, int]] | None]
"""What a STATE tells: each journal's segments as (first offset, name, size), sorted; None: ask the server."""


Check = tuple[int, int, int, int]
"""What vouches for the bytes a hub kept before a push's start: (window, xxh3_64 of the segment's `window` bytes before
the start, st_dev, st_ino of the segment), from the same read of the file as the pushed bytes."""

Pushed = tuple[str, str, int, bytes, int, bytes | None, Check | None]
"""New bytes a STATE carries (version 3): (journal, segment, start, bytes, sums skip, sums, check): what `read(journal,
segment, start, len(bytes))` and `read_sums(journal, segment, skip)` would have answered, read after the listing, and
the Check of the bytes before them (None: from a server that sends none; the hub then joins them to nothing kept)."""


def state(full: bool, entries: list[tuple[str, list[tuple[str, int]] | None]], gone: list[str],
          skipped: dict[str, str], more: bool = False, pushed: list[Pushed] | None = None) -> list[Any]:  # fmt: skip
    """A STATE; with `pushed` (a list, maybe empty: version 3) the new bytes too."""
    msg = [STATE, full, [[j, None if segs is None else [list(s) for s in segs]] for j, segs in entries], gone,
           skipped, more]  # fmt: skip
    return msg if pushed is None else [*msg, [[*p[:6], *([list(p[6])] if p[6:] and p[6] is not None else [])]
                                              for p in pushed]]  # fmt: skip


def parse_state(msg: list[Any], version: int = 2) -> tuple[bool, State, list[str], dict[str, str], bool, list[Pushed]]:
    """(full, state, gone, skipped, more, pushed) of a STATE of protocol `version`, every name and size checked and
    every count bounded (pushed: version 3's new bytes, [] before)."""
    _shape(msg, 7 if version >= 3 else 6, "state")
    full, entries, gone, skipped, more = msg[1:6]
    if type(full) is not bool or type(more) is not bool:
        raise ProtocolError(f"a state's full and more must be true or false: {_show(msg[:2])}, {_show(more)}")
    if not isinstance(entries, list) or len(entries) > STATE_ENTRIES:
        raise ProtocolError(f"a state must list at most {STATE_ENTRIES} journals, got {_show(entries)}")
    if not isinstance(gone, list) or len(gone) > STATE_ENTRIES:
        raise ProtocolError(f"a state's gone journals must be a list of at most {STATE_ENTRIES}, got {_show(gone)}")
    if not isinstance(skipped, dict) or len(skipped) > 1 << 16:
        raise ProtocolError(f"a state's skipped must be a map of at most 65536 entries, got {_show(skipped)}")
    out: State = {}
    for entry in entries:
        if not isinstance(entry, list) or len(entry) != 2:
            raise ProtocolError(f"a state entry that is not [journal, segments]: {_show(entry)}")
        name = _journal(entry[0])
        if name in out:
            raise ProtocolError(f"a state names {name} twice")
        segs = entry[1]
        if segs is None:
            out[name] = None
            continue
        if not isinstance(segs, list) or len(segs) > MAX_SEGMENTS:
            raise ProtocolError(f"a state's segments of {name}: not a list of at most {MAX_SEGMENTS}: {_show(segs)}")
        out[name] = check_result("segments", [name], segs)
    return (full, out, [_journal(g) for g in gone],
            {_text(k, "a skipped name", MAX_NAME): _text(v, "why it was skipped") for k, v in skipped.items()},
            more, _pushed(msg[6]) if version >= 3 else [])  # fmt: skip


def _pushed(items: Any) -> list[Pushed]:
    """A STATE's new bytes (version 3), checked: names valid, each journal's bytes within PUSH_JOURNAL, all of them
    within PUSH_FRAME, each segment once."""
    if not isinstance(items, list) or len(items) > STATE_ENTRIES:
        raise ProtocolError(f"a state's new bytes must be a list of at most {STATE_ENTRIES}, got {_show(items)}")
    out: list[Pushed] = []
    per: dict[str, int] = {}
    seen: set[tuple[str, str]] = set()
    total = 0
    for item in items:
        if not isinstance(item, list) or len(item) not in (6, 7):
            raise ProtocolError(f"a state's new bytes that are not [journal, segment, start, bytes, sums skip, sums, "
                                f"check]: {_show(item)}")  # fmt: skip
        journal, segment, start, data, skip, sums = item[:6]
        journal = _journal(journal)
        try:
            check_segment_name(_text(segment, "a segment name", MAX_NAME))
        except InvalidArgumentError as e:
            raise ProtocolError(f"a state's new bytes: {e}") from None
        if (journal, segment) in seen:
            raise ProtocolError(f"a state's new bytes name {journal}/{segment} twice")
        seen.add((journal, segment))
        if not isinstance(data, bytes) or (sums is not None and not isinstance(sums, bytes)):
            raise ProtocolError(f"a state's new bytes of {journal}/{segment} are not bytes: {_show(item[3:])}")
        size = len(data) + (len(sums) if sums is not None else 0)
        per[journal] = per.get(journal, 0) + size
        total += size
        if per[journal] > PUSH_JOURNAL or total > PUSH_FRAME:
            raise ProtocolError(f"a state's new bytes: more than {PUSH_JOURNAL} for {journal} or {PUSH_FRAME} in all")
        start = _u64(start, "a pushed start")
        check = _check(item[6], start, f"{journal}/{segment}") if len(item) == 7 else None
        out.append((journal, segment, start, data, _u64(skip, "a pushed sums skip"), sums, check))
    return out


def _check(value: Any, start: int, what: str) -> Check:
    """A pushed Check: four integers, its window at most PUSH_WINDOW and within the segment before `start`."""
    if not isinstance(value, list) or len(value) != 4:
        raise ProtocolError(f"a state's new bytes of {what}: a check that is not [window, hash, dev, ino]: "
                            f"{_show(value)}")  # fmt: skip
    window, digest, dev, ino = (_u64(v, f"a pushed check of {what}") for v in value)
    if window > min(start, PUSH_WINDOW):
        raise ProtocolError(f"a state's new bytes of {what}: a check of {window} bytes before {start} (at most "
                            f"{PUSH_WINDOW})")  # fmt: skip
    return window, digest, dev, ino


def result_limit(method: str, args: list[Any]) -> int:
    """The most bytes a call's result may have in total (its PART pieces and its REPLY's bytes)."""
    if method == "read":
        return int(args[3])
    if method == "read_sums":
        return MAX_SUMS + SUM_HEADER.size
    return 0


def _journal(name: Any) -> str:
    try:
        return check_journal_name(_text(name, "a journal name", MAX_NAME))
    except InvalidArgumentError as e:
        raise ProtocolError(f"sej serve named a journal that cannot be one: {e}") from None


def check_result(method: str, args: list[Any], value: Any) -> Any:
    """A call's result as the Source method returns it, checked: names valid, sizes and counts bounded.

    journals: (names, skipped); segments: [(name, size)] (the caller makes SourceSegments).
    """
    if method == "journals":
        if not isinstance(value, list) or len(value) != 2 or not isinstance(value[0], list):
            raise ProtocolError(f"journals: not [names, skipped]: {_show(value)}")
        names, skipped = value
        if not isinstance(skipped, dict) or len(skipped) > 1 << 16:
            raise ProtocolError(f"journals: skipped must be a map of at most 65536 entries, got {_show(skipped)}")
        out = [_journal(n) for n in names]
        if len(set(out)) != len(out):
            raise ProtocolError("journals: a journal named twice")
        return out, {_text(k, "a skipped name", MAX_NAME): _text(v, "why it was skipped") for k, v in skipped.items()}
    if method == "segments":
        if not isinstance(value, list):
            raise ProtocolError(f"segments: not a list: {_show(value)}")
        segs = []
        for entry in value:
            if not isinstance(entry, list) or len(entry) != 2:
                raise ProtocolError(f"segments: an entry that is not [name, size]: {_show(entry)}")
            try:
                first = check_segment_name(entry[0])
            except InvalidArgumentError as e:
                raise ProtocolError(f"segments: {e}") from None
            segs.append((first, entry[0], _u64(entry[1], f"the size of segment {entry[0]}")))
        if len({s[0] for s in segs}) != len(segs):
            raise ProtocolError("segments: a segment named twice")
        return sorted(segs)
    if method in ("size", "read_offset"):
        return None if value is None else _u64(value, f"{method}'s result")
    if method in ("read", "read_sums"):
        if value is None and method == "read_sums":
            return None
        if not isinstance(value, bytes) or len(value) > result_limit(method, args):
            raise ProtocolError(f"{method}: {_show(type(value))} of {len(value) if isinstance(value, bytes) else '?'} "
                                f"bytes, not bytes of at most {result_limit(method, args)}")  # fmt: skip
        return value
    if method == "commit_offset":
        if value is not None:
            raise ProtocolError(f"commit_offset: returned {_show(value)}")
        return None
    raise ProtocolError(f"no method {_show(method)}")


def check_reader(reader: str) -> str:
    """A reader name from a call (ProtocolError, not InvalidArgumentError: it came over the wire)."""
    try:
        return check_reader_name(reader)
    except InvalidArgumentError as e:
        raise ProtocolError(str(e)) from None
