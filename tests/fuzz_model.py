"""Helpers of tests/test_fuzz.py (not a test file).

- A reference reader written from docs/format.md alone (`ref_frame`, `ref_walk`): the oracle the
  library's codec and readers are compared with.
- `Model`: a journal on disk plus what is known about it: the messages written, which original
  frames are still intact after mutations (splices) of segment files, and an `Analysis` of what a
  correct reader may return.
- `bounded`: a guard that turns a hang (a loop that makes no progress, or an operation that takes
  far too long) into a `Hang` exception instead of a stuck test.
- The hypothesis budget: `SEJ_FUZZ=long` (about a million cases over the whole file) or
  `SEJ_FUZZ_EXAMPLES=N` (N per test); the default is a small CI budget.
- `SEJ_FUZZ_COLLECT=FILE`: failures are appended to FILE as JSON lines and fuzzing goes on (no
  shrinking); used for long runs on code with known bugs. `SEJ_FUZZ_LOG=FILE`: progress counts.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import struct
import threading
import time
import traceback
from collections.abc import Iterator
from dataclasses import dataclass, field

import sej
from sej.message import NO_TIMESTAMP, Message

U64 = struct.Struct(">Q")
I64 = struct.Struct(">q")
I32 = struct.Struct(">i")
HEAD = struct.Struct(">QqBb")

OK, INCOMPLETE, CORRUPT = "ok", "incomplete", "corrupt"

# -- budget --------------------------------------------------------------------------------------

MODE = os.environ.get("SEJ_FUZZ", "ci").strip().lower() or "ci"
LONG = MODE == "long"


def budget(ci: int, long: int) -> int:
    """max_examples of one test: SEJ_FUZZ_EXAMPLES if set, else the long or the CI budget."""
    forced = os.environ.get("SEJ_FUZZ_EXAMPLES", "").strip()
    if forced:
        return max(1, int(forced))
    return long if LONG else ci


HANG_SECONDS = float(os.environ.get("SEJ_FUZZ_HANG_SECONDS", "10"))
COLLECT = os.environ.get("SEJ_FUZZ_COLLECT", "").strip()
PROGRESS_LOG = os.environ.get("SEJ_FUZZ_LOG", "").strip()


# -- failures ------------------------------------------------------------------------------------


class FuzzFailure(AssertionError):
    """A property violated by the code under test; `kind` groups failures of one cause."""

    def __init__(self, kind: str, detail: str) -> None:
        super().__init__(f"[{kind}] {detail}")
        self.kind = kind
        self.detail = detail


class Hang(BaseException):  # noqa: N818 - not an Exception: `except Exception` in the code under test must not eat it
    """An operation made no progress (same read over and over) or ran past HANG_SECONDS."""


def fail(kind: str, detail: str) -> FuzzFailure:
    return FuzzFailure(kind, detail)


class Collector:
    """Counts examples per test and, in collect mode, records failures instead of raising them."""

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}
        self.failures: dict[str, int] = {}
        self.last_log = 0.0
        self.lock = threading.Lock()

    def example(self, test: str) -> None:
        with self.lock:
            self.counts[test] = self.counts.get(test, 0) + 1
            now = time.monotonic()
            if PROGRESS_LOG and now - self.last_log > 30:
                self.last_log = now
                self._log()

    def _log(self) -> None:
        with open(PROGRESS_LOG, "a") as f:
            f.write(json.dumps({"t": time.time(), "counts": self.counts, "total": sum(self.counts.values()),
                                "failures": self.failures}) + "\n")  # fmt: skip

    def flush(self) -> None:
        if PROGRESS_LOG:
            with self.lock:
                self._log()

    def record(self, test: str, kind: str, detail: str, example: str) -> None:
        with self.lock:
            key = f"{test}:{kind}"
            self.failures[key] = self.failures.get(key, 0) + 1
            n = self.failures[key]
        if n <= 20 or n % 1000 == 0:  # keep the log small: the first few and then a sample
            with open(COLLECT, "a") as f:
                f.write(json.dumps({"test": test, "kind": kind, "n": n, "detail": detail[:4000],
                                    "example": example[:20000]}) + "\n")  # fmt: skip


COLLECTOR = Collector()


@contextlib.contextmanager
def example_of(test: str, describe: object = None) -> Iterator[None]:
    """Wrap one example's body: count it; in collect mode, record a failure and carry on."""
    COLLECTOR.example(test)
    if not COLLECT:
        yield
        return
    try:
        yield
    except FuzzFailure as e:
        COLLECTOR.record(test, e.kind, e.detail, repr(describe))
    except Hang as e:
        COLLECTOR.record(test, "hang", str(e), repr(describe))
    except Exception as e:  # an error in the harness itself or an unexpected escape
        COLLECTOR.record(test, f"harness:{type(e).__name__}", repr(e), repr(describe))


# -- hang guard ----------------------------------------------------------------------------------

_real_pread = os.pread


class _PreadWatch:
    """Counts identical consecutive preads: a loop that reads the same bytes again and again is stuck."""

    def __init__(self) -> None:
        self.active = False
        self.last: tuple[int, int, int, int] | None = None
        self.repeats = 0
        self.what = ""

    def pread(self, fd: int, n: int, offset: int) -> bytes:
        data = _real_pread(fd, n, offset)
        if self.active:
            key = (fd, n, offset, len(data))
            if key == self.last:
                self.repeats += 1
                limit = 3 if n > (64 << 20) else 200
                if self.repeats >= limit:
                    self.repeats = 0
                    raise Hang(f"{self.what}: no progress, pread(fd, {n}, {offset}) returned {len(data)} bytes "
                               f"{limit} times in a row")  # fmt: skip
            else:
                self.last = key
                self.repeats = 0
        return data


WATCH = _PreadWatch()
os.pread = WATCH.pread  # the library calls os.pread through the module: this sees every call


@contextlib.contextmanager
def bounded(what: str, seconds: float | None = None) -> Iterator[None]:
    """Run the body with a hang guard: SIGALRM after `seconds` and the pread progress check raise Hang."""
    seconds = HANG_SECONDS if seconds is None else seconds
    main = threading.current_thread() is threading.main_thread()
    old = None
    if main:

        def on_alarm(signum: int, frame: object) -> None:
            raise Hang(f"{what}: still running after {seconds} s")

        old = signal.signal(signal.SIGALRM, on_alarm)
        signal.setitimer(signal.ITIMER_REAL, seconds)
    WATCH.active, WATCH.last, WATCH.repeats, WATCH.what = True, None, 0, what
    try:
        yield
    finally:
        WATCH.active = False
        if main:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, old)


def forget_frames(e: BaseException) -> None:
    """Drop the frames an exception holds: they may hold 2 GiB reads (huge-frame tests), and hypothesis
    keeps failing examples' exceptions."""
    tb = e.__traceback__
    if tb is not None:
        traceback.clear_frames(tb)
    e.__traceback__ = None
    e.__context__ = None


def call(what: str, fn, *args, _seconds: float | None = None, **kw):  # type: ignore[no-untyped-def]
    """fn(*args) under the hang guard: (result, None) or (None, SejError); anything else is a failure."""
    problem = None
    try:
        with bounded(what, _seconds):
            return fn(*args, **kw), None
    except sej.SejError as e:
        forget_frames(e)
        return None, e
    except Hang as e:
        problem = (f"hang:{what.split('(')[0]}", str(e))
        forget_frames(e)
    except FuzzFailure:
        raise
    except Exception as e:
        problem = (f"untyped:{what.split('(')[0]}:{type(e).__name__}", f"{what} raised {type(e).__name__}: {e}\n"
                   + "".join(traceback.format_exception(e)[-6:]))  # fmt: skip
        forget_frames(e)
    raise fail(*problem)  # outside the except blocks: no reference to the original exception


# -- the reference reader (from docs/format.md) -----------------------------------------------------


def ref_frame(buf: bytes, pos: int, expect: int | None) -> tuple[str, int, Message | None]:
    """The frame at buf[pos:]: (OK, end, message), (INCOMPLETE, pos, None) or (CORRUPT, pos, None).

    INCOMPLETE: the bytes are a strict prefix of some valid frame (with offset `expect` when given);
    CORRUPT: no bytes appended could make them one. An empty tail is INCOMPLETE.
    """
    avail = len(buf) - pos
    if expect is not None and expect > 2**64 - 1:  # after offset 2**64-1: no frame can carry the next one
        return (CORRUPT, pos, None) if avail else (INCOMPLETE, pos, None)
    if expect is not None:
        have = min(avail, 8)
        if buf[pos : pos + have] != U64.pack(expect)[:have]:
            return CORRUPT, pos, None
    if avail < 18:
        return INCOMPLETE, pos, None
    off, ts, typ, ks = HEAD.unpack_from(buf, pos)
    if ks < 0:
        return CORRUPT, pos, None
    if avail < 22 + ks:
        return INCOMPLETE, pos, None
    (vs,) = I32.unpack_from(buf, pos + 18 + ks)
    if vs < 0:
        return CORRUPT, pos, None
    total = 26 + ks + vs
    if avail < total:
        return INCOMPLETE, pos, None
    if I32.unpack_from(buf, pos + total - 4)[0] != total:
        return CORRUPT, pos, None
    key = bytes(buf[pos + 18 : pos + 18 + ks])
    value = bytes(buf[pos + 22 + ks : pos + total - 4])
    return OK, pos + total, Message(off, None if ts == NO_TIMESTAMP else ts, typ, key, value)


@dataclass
class Walk:
    """Frames decoded forward from a start position; how and where it stopped."""

    start: int
    frames: list[tuple[int, int, Message]]  # (position, end, message)
    end: int  # position after the last whole frame
    next: int  # offset expected there
    status: str  # "clean" (end of file), "torn" (a strict prefix of a frame follows), "corrupt"
    evident: bool = False  # torn, but the file ends with a whole later frame: not a writer's torn tail


def backward_evidence(buf: bytes, q: int, z: int) -> bool:
    """Whether the file ends with a whole, valid frame of an offset above `z` that starts after `q`.

    A writer's torn tail is a prefix of ONE frame (offset z), so a later whole frame at the end of the
    file shows that the "incomplete" frame at q is a corrupt one with valid messages after it.
    """
    n = len(buf)
    if n - q < 27:
        return False
    s = I32.unpack_from(buf, n - 4)[0]
    start = n - s
    if s < 26 or start <= q:
        return False
    st, end, m = ref_frame(buf, start, None)
    return st == OK and end == n and m is not None and m.offset > z


def ref_resume(buf: bytes, q: int, z: int) -> int | None:
    """Where the whole frames after a frame damaged in place start (docs/format.md), if they do.

    The frame at q (offset z) is bad; whole frames of offsets z+1, z+2, ... must reach exactly
    to the end of the file, and [q, start of z+1) must be one frame by its header's sizes or by
    its trailing size field.
    """
    n, end, expect = len(buf), len(buf), None
    while end - q > 26:
        s = I32.unpack_from(buf, end - 4)[0]
        p = end - s
        if s < 26 or p <= q:
            return None
        st, e, m = ref_frame(buf, p, expect)
        if st != OK or e != end or m is None or m.offset <= z:
            return None
        if m.offset == z + 1:
            if p - q < 26:
                return None
            if I32.unpack_from(buf, p - 4)[0] == p - q:
                return p
            ks = buf[q + 17]
            if ks <= 127 and q + 22 + ks <= n and 26 + ks + I32.unpack_from(buf, q + 18 + ks)[0] == p - q:
                return p
            return None
        expect, end = m.offset - 1, p
    return None


def ref_walk(buf: bytes, pos: int, expect: int, limit: int | None = None) -> Walk:
    """Decode frames from `pos` with offsets expect, expect+1, ... up to the first bad byte (or `limit` frames)."""
    start = pos
    frames: list[tuple[int, int, Message]] = []
    status = "clean"
    while pos < len(buf):
        if limit is not None and len(frames) >= limit:
            break
        st, end, m = ref_frame(buf, pos, expect)
        if st != OK:
            status = "torn" if st == INCOMPLETE else "corrupt"
            break
        assert m is not None
        frames.append((pos, end, m))
        pos = end
        expect += 1
    if status == "corrupt" and len(buf) - pos < 18:
        # Fewer than 18 bytes: sej cannot tell them from a torn frame and treats them as one (noted).
        status = "torn"
    w = Walk(start, frames, pos, expect, status)
    if status == "torn":
        w.evident = backward_evidence(buf, pos, expect)
    return w


def parse_segment_name(name: str) -> int | None:
    if len(name) == 20 and name.endswith(".jnl") and all(c in "0123456789abcdef" for c in name[:16]):
        return int(name[:16], 16)
    return None


# -- a journal and what is known about it ------------------------------------------------------------


@dataclass
class Genuine:
    """An original frame still intact in a segment file, at its current position."""

    start: int
    end: int
    msg: Message


@dataclass
class SegModel:
    name: str
    first: int
    data: bytearray
    genuine: list[Genuine] = field(default_factory=list)
    # (position, offset) of original frames whose start is intact but whose bytes were changed:
    # a reader may legitimately start there (an index entry the writer made), and read what it holds.
    damaged: list[tuple[int, int]] = field(default_factory=list)


@dataclass
class Analysis:
    """What a correct reader may return from the journal as it is now on disk."""

    segments: list[SegModel]
    walks: dict[str, list[Walk]]  # per segment: the walk from 0 first, then walks from genuine frames
    V: dict[int, set[Message]]  # offset -> every message a correct reader may return for it
    ends_ok: set[int]  # offsets at which a full read may end without an error (in the last segment)
    last_ends: set[tuple[int, int]]  # (position, next offset) where any walk of the last segment stops
    clean: bool  # whole chain from the first segment, a clean or honestly torn end: readers must be exact
    first: int  # the journal's first offset
    P: list[Message]  # the chain of messages from the first one up to the first problem
    chain_problem: str | None  # None when clean
    last_e0: int  # where the walk of the last segment from byte 0 stops

    @property
    def next(self) -> int:
        return self.first + len(self.P)


class Model:
    """A journal directory and its known contents. Mutations go through `splice` / `remove`."""

    def __init__(self, dir: str) -> None:
        self.dir = dir
        self.jdir = os.path.join(dir, "jnl")
        self.segs: dict[str, SegModel] = {}
        self.reload()

    def reload(self) -> None:
        """Read the segment files afresh; every frame of a file read this way is genuine (a clean journal)."""
        self.segs = {}
        for name in sorted(os.listdir(self.jdir)):
            first = parse_segment_name(name)
            if first is None:
                continue
            with open(os.path.join(self.jdir, name), "rb") as f:
                data = bytearray(f.read())
            w = ref_walk(bytes(data), 0, first)
            assert w.status == "clean", f"the writer left {name} with a {w.status} frame at byte {w.end}"
            self.segs[name] = SegModel(name, first, data, [Genuine(p, e, m) for p, e, m in w.frames])

    def extend_from_disk(self, name: str, expect: int) -> None:
        """Frames a live writer appended after the known bytes of `name` (or a new segment) are genuine too."""
        path = os.path.join(self.jdir, name)
        with open(path, "rb") as f:
            data = f.read()
        seg = self.segs.get(name)
        if seg is None:
            first = parse_segment_name(name)
            assert first is not None
            seg = self.segs[name] = SegModel(name, first, bytearray(), [])
            expect = first
        old = len(seg.data)
        assert data[:old] == bytes(seg.data), f"{name} changed under the model"
        w = ref_walk(data, old, expect)
        assert w.status == "clean", f"the live writer appended a bad frame to {name}: {w.status} at {w.end}"
        seg.data = bytearray(data)
        seg.genuine += [Genuine(p, e, m) for p, e, m in w.frames]

    def names(self) -> list[str]:
        return sorted(self.segs)

    def path(self, name: str) -> str:
        return os.path.join(self.jdir, name)

    def splice(self, name: str, a: int, b: int, new: bytes) -> None:
        """Replace bytes [a, b) of segment `name` with `new`, on disk and in the model."""
        seg = self.segs[name]
        a = max(0, min(a, len(seg.data)))
        b = max(a, min(b, len(seg.data)))
        seg.data[a:b] = new
        delta = len(new) - (b - a)
        kept = []
        damaged = []
        in_place = len(new) == b - a

        def still_a_boundary(start: int) -> bool:
            """A frame starting here before the change still starts a position the writer put a frame at
            (bytes changed inside it or at its start, or overwritten in place)."""
            return start < a or start == a or (in_place and start < b)

        for s, o in seg.damaged:
            if s >= b:
                damaged.append((s + delta, o))
            elif still_a_boundary(s):
                damaged.append((s, o))
        for g in seg.genuine:
            if g.end <= a:
                kept.append(g)
            elif g.start >= b:  # after the change (also: bytes inserted right before it)
                kept.append(Genuine(g.start + delta, g.end + delta, g.msg))
            elif still_a_boundary(g.start):
                damaged.append((g.start, g.msg.offset))
            # else: the frame's first bytes were replaced by bytes of another length
        seg.genuine = kept
        seg.damaged = damaged
        with open(self.path(name), "wb") as f:
            f.write(seg.data)

    def remove(self, name: str) -> None:
        del self.segs[name]
        os.remove(self.path(name))

    def check_disk(self) -> None:
        """The files on disk are what the model holds (nothing else changed them)."""
        names = sorted(n for n in os.listdir(self.jdir) if parse_segment_name(n) is not None)
        assert names == self.names(), (names, self.names())
        for n in names:
            with open(self.path(n), "rb") as f:
                assert f.read() == bytes(self.segs[n].data), n

    def snapshot(self) -> dict[str, bytes]:
        return {n: bytes(s.data) for n, s in self.segs.items()}

    def index_entries(self, seg: SegModel) -> list[tuple[int, int]]:
        """(offset, position) of the entries of the segment's index file as it is on disk."""
        try:
            with open(os.path.join(self.dir, "idx", f"{seg.first:016x}.idx"), "rb") as f:
                raw = f.read()
        except OSError:
            return []
        if len(raw) < 16 or raw[:8] != b"SEJIDX01" or U64.unpack_from(raw, 8)[0] != seg.first:
            return []
        return [(U64.unpack_from(raw, i)[0], U64.unpack_from(raw, i + 8)[0]) for i in range(16, len(raw) - 23, 24)]

    def analyse(self) -> Analysis:
        segs = [self.segs[n] for n in self.names()]
        V: dict[int, set[Message]] = {}
        walks: dict[str, list[Walk]] = {}
        for seg in segs:
            buf = bytes(seg.data)
            ws = [ref_walk(buf, 0, seg.first)]
            covered = {(p, m.offset) for p, _e, m in ws[0].frames}
            starts = sorted({(g.start, g.msg.offset) for g in seg.genuine} | set(seg.damaged))
            for p, o in starts:
                if (p, o) in covered:
                    continue
                w = ref_walk(buf, p, o)
                covered.update((q, m.offset) for q, _e, m in w.frames)
                ws.append(w)
            if seg is segs[-1]:  # damage in place: the writer goes on after the frames that follow it
                for w in list(ws):
                    p = ref_resume(buf, w.end, w.next) if w.status != "clean" else None
                    if p is not None and (p, w.next + 1) not in covered:
                        ws.append(ref_walk(buf, p, w.next + 1))
            walks[seg.name] = ws
            for w in ws:
                for _p, _e, m in w.frames:
                    V.setdefault(m.offset, set()).add(m)
            # A torn frame is not a writer's torn tail when a valid index entry points past it: the
            # index shows a later whole frame, so the "incomplete" one is a corrupt one.
            entries = self.index_entries(seg)
            for w in ws:
                if w.status == "torn" and not w.evident:
                    w.evident = any(p > w.end and o >= w.next and ref_frame(buf, p, o)[0] == OK for o, p in entries)
        ends_ok: set[int] = set()
        last_ends: set[tuple[int, int]] = set()
        last_e0 = 0
        if segs:
            last = segs[-1]
            last_e0 = walks[last.name][0].end
            for w in walks[last.name]:
                last_ends.add((w.end, w.next))
                if w.status == "clean" or (w.status == "torn" and not w.evident):
                    ends_ok.add(w.next)
        # The chain from the first segment.
        P: list[Message] = []
        problem: str | None = None
        first = segs[0].first if segs else 0
        for i, seg in enumerate(segs):
            w = walks[seg.name][0]
            if i > 0 and seg.first != first + len(P):
                problem = f"gap: {seg.name} starts at {seg.first}, expected {first + len(P)}"
                break
            P += [m for _p, _e, m in w.frames]
            lastseg = i == len(segs) - 1
            if w.status == "corrupt" or (w.status == "torn" and (not lastseg or w.evident)):
                problem = f"{seg.name}: {w.status}{' (evident)' if w.evident else ''} frame at byte {w.end}"
                break
        return Analysis(segs, walks, V, ends_ok, last_ends, problem is None, first, P, problem, last_e0)


def true_offset_at_time(msgs: list[Message], next_offset: int, t: int) -> int:
    for m in msgs:
        if m.timestamp is not None and m.timestamp >= t:
            return m.offset
    return next_offset


def short(m: Message | None) -> str:
    if m is None:
        return "None"
    return f"<{m.offset} ts={m.timestamp} type={m.type} key={m.key[:12]!r} value[{len(m.value)}]={m.value[:12]!r}>"


def check_sequence(an: Analysis, msgs: list[Message], start: int, what: str) -> None:
    """`msgs` are consecutive from `start` and each is a message the journal really holds at its offset."""
    for i, m in enumerate(msgs):
        if m.offset != start + i:
            raise fail(f"order:{what.split('(')[0]}",
                       f"{what}: message #{i} has offset {m.offset}, expected {start + i}")  # fmt: skip
        ok = an.V.get(m.offset)
        if not ok or m not in ok:
            alts = ", ".join(short(x) for x in list(ok or ())[:2]) or "nothing (no valid frame has this offset)"
            raise fail(f"wrong-data:{what.split('(')[0]}",
                       f"{what}: returned {short(m)}, but the journal holds {alts}")  # fmt: skip


def describe_journal(dir: str) -> str:
    """The files of a journal, for failure messages: names, sizes, and the index entries."""
    out = []
    for sub in ("jnl", "idx"):
        p = os.path.join(dir, sub)
        if not os.path.isdir(p):
            continue
        for n in sorted(os.listdir(p)):
            with open(os.path.join(p, n), "rb") as f:
                data = f.read()
            line = f"{sub}/{n}: {len(data)} bytes"
            if sub == "idx" and len(data) >= 16:
                ents = [struct.unpack_from(">QQq", data, 16 + 24 * i) for i in range((len(data) - 16) // 24)]
                line += f" first={U64.unpack_from(data, 8)[0]} entries={ents[:12]}"
            out.append(line)
    return "; ".join(out)
