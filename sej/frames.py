"""The SEJ frame layout in pure functions: constants, checks and the frame walkers (bytes in, no I/O).

A frame, all integers big-endian (byte-identical with h12.io/sej)::

    offset u64 | timestamp i64 | type u8 | key_size i8 | key | value_size i32 | value | size i32

`size` is the whole frame, itself included: OVERHEAD (26) + len(key) + len(value).
Every walk over frames (the writer's recovery, scanners, the hub's check, the Spark
decoder) takes its general step with `frame_at`; runs of frames of the same size
take a fast path of one cached struct call each (`sized_struct`), and walk_frames,
which only checks them, checks such runs field by field, all their frames at once.
"""

from __future__ import annotations

import functools
import os
import struct
import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

if TYPE_CHECKING:
    from .index import SparseIndex

NO_TIMESTAMP = -(2**63)
"""The timestamp field value meaning "no timestamp" (decoded as None)."""

HEADER = struct.Struct(">QqBb")  # offset, timestamp, type, key_size
HEADER_SIZE = HEADER.size  # 18
I32 = struct.Struct(">i")
SIZE_FIELD = I32.size  # 4: value_size, and the trailing size
OVERHEAD = HEADER_SIZE + 2 * SIZE_FIELD  # 26: header, value_size, size
MAX_KEY = 127
MAX_VALUE = 2**31 - 1 - OVERHEAD - MAX_KEY
MAX_OFFSET = 2**64 - 1
INDEX_INTERVAL = 4096
"""Bytes of segment between two sparse index entries (at least): see sej.index."""


class Message(NamedTuple):
    """One journal message. `timestamp` is ns since the Unix epoch, or None."""

    offset: int
    timestamp: int | None
    type: int
    key: bytes
    value: bytes


class ShardMessage(NamedTuple):
    """A message and the journal it came from, in one flat record (as Kafka's ConsumerRecord).

    `journal` is the name `find_journals` gives it ("" for a lone journal); the other fields
    are the Message's. Consumers and merged_scan yield these: decoded straight from the frame,
    so naming the journal costs nothing per message.
    """

    journal: str
    offset: int
    timestamp: int | None
    type: int
    key: bytes
    value: bytes

    @property
    def message(self) -> Message:
        """The Message without its journal."""
        return _new_message(Message, self[1:])


_new_message = tuple.__new__


class Problem(NamedTuple):
    """Why decoding stopped before the end of the buffer.

    `incomplete` is True when the bytes so far are a valid prefix of a frame
    (more data may complete it); False when they can never be a valid frame.
    """

    position: int
    reason: str
    incomplete: bool


def check_frame(buf: bytes | bytearray | memoryview, pos: int, end: int, expect: int | None) -> Problem | int:
    """Validate the frame at `pos` without building a Message; return its end or a Problem."""
    avail = end - pos
    if avail < HEADER_SIZE:
        return Problem(pos, f"incomplete frame: {avail} of at least {OVERHEAD} bytes", True)
    off, _ts, _typ, ks = HEADER.unpack_from(buf, pos)
    if expect is not None and off != expect:
        return Problem(pos, f"offset out of sequence: found {off}, expected {expect}", False)
    if ks < 0:
        return Problem(pos, f"negative key size {ks}", False)
    vpos = pos + HEADER_SIZE + ks
    if vpos + 4 > end:
        return Problem(pos, "incomplete frame: cut inside the key", True)
    (vs,) = I32.unpack_from(buf, vpos)
    if vs < 0:
        return Problem(pos, f"negative value size {vs}", False)
    total: int = OVERHEAD + ks + vs
    if total > avail:
        return Problem(pos, f"incomplete frame: {avail} of {total} bytes", True)
    size: int = I32.unpack_from(buf, pos + total - 4)[0]
    if size != total:
        return Problem(pos, f"size field disagrees: says {size}, frame is {total} bytes", False)
    return pos + total


def frame_at(
    buf: bytes | bytearray | memoryview,
    pos: int,
    end: int,
    expect: int | None,
    _head: Callable[[Any, int], tuple[Any, ...]] = HEADER.unpack_from,
    _i32: Callable[[Any, int], tuple[Any, ...]] = I32.unpack_from,
) -> tuple[int, int, int, int, int] | None:
    """(offset, timestamp, type, key size, value size) of the whole, valid frame at buf[pos:end].

    None when there is none there (check_frame says why): the frame must carry the
    offset `expect` (any offset when None), sizes that are not negative, fit before
    `end`, and a trailing size field equal to its length. Every frame walk's general step.
    """
    if end - pos < OVERHEAD:
        return None
    off, ts, typ, ks = _head(buf, pos)
    if expect is not None and off != expect or ks < 0:
        return None
    vpos = pos + HEADER_SIZE + ks
    if vpos + 4 > end:
        return None
    (vs,) = _i32(buf, vpos)
    nxt = vpos + 8 + vs
    if vs < 0 or nxt > end or _i32(buf, nxt - 4)[0] != nxt - pos:
        return None
    return off, ts, typ, ks, vs


def frame_total(data: bytes | bytearray | memoryview, p: int, n: int) -> int | None:
    """The full size of the frame starting at data[p], if its header is there."""
    if n - p < HEADER_SIZE:
        return None
    ks = data[p + HEADER_SIZE - 1]
    if ks > MAX_KEY or p + HEADER_SIZE + ks + 4 > n:
        return None
    vs: int = I32.unpack_from(data, p + HEADER_SIZE + ks)[0]
    return OVERHEAD + ks + vs


FRAME_FORMAT = ">QqBb{ks}si{vs}si"
"""A whole frame with known key and value sizes: one pack or unpack call."""

BATCH_FORMAT = ">Q9sb{ks}si{vs}si"
"""FRAME_FORMAT with the timestamp and type as 9 bytes packed once (TS_TYPE) for a batch of one timestamp and one
type (append_many): a big-endian 64-bit field costs struct a generic conversion, 9 bytes a copy."""

TS_TYPE = struct.Struct(">qB")

FRAME_STRUCTS: list[dict[int, tuple[struct.Struct, int]]] = [{} for _ in range(MAX_KEY + 1)]
"""The whole-frame structs of the writers (FRAME_FORMAT) and their frame sizes, `FRAME_STRUCTS[key size][value
size]`, made by frame_struct on first use: appends of any sizes take one list index, one dictionary lookup of a
small int and one struct call each (no arithmetic on the sizes: in CPython 3.11 a shift and an or of two ints cost
as much as the lookup)."""

BATCH_STRUCTS: list[dict[int, tuple[struct.Struct, int]]] = [{} for _ in range(MAX_KEY + 1)]
"""The same for BATCH_FORMAT."""

FRAME_STRUCTS_MAX = 8192
"""Sizes remembered at most in each (about 0.5 KiB each); the next new one clears that one."""

_held = [0, 0]  # entries in FRAME_STRUCTS, in BATCH_STRUCTS
_key_sizes: tuple[set[int], set[int]] = (set(), set())  # the key sizes they hold entries for
# Writers in several threads miss at once: a clear iterating _key_sizes while another thread adds to it raised
# "Set changed size during iteration" out of a valid append. Hits take no lock (one dict lookup is atomic).
_structs_lock = threading.Lock()


def _new_lock_in_child() -> None:
    global _structs_lock  # pylint: disable=global-statement
    _structs_lock = threading.Lock()  # a fork while another thread held it must not leave it held forever


os.register_at_fork(after_in_child=_new_lock_in_child)


def frame_struct(ks: int, vs: int, batch: bool = False) -> tuple[struct.Struct, int]:
    """The whole-frame struct for these sizes (BATCH_FORMAT's if `batch`) and the frame's size, remembered.

    A key longer than MAX_KEY has no place there (its packing fails anyway, the key size field being a signed
    byte): its struct is made and not kept.
    """
    entry = (struct.Struct((BATCH_FORMAT if batch else FRAME_FORMAT).format(ks=ks, vs=vs)), OVERHEAD + ks + vs)
    if 0 <= ks <= MAX_KEY:
        structs = BATCH_STRUCTS if batch else FRAME_STRUCTS
        key_sizes = _key_sizes[batch]
        with _structs_lock:
            if _held[batch] >= FRAME_STRUCTS_MAX:
                for k in key_sizes:  # not all 128: a cache that never hits clears at every new size
                    structs[k].clear()
                key_sizes.clear()
                _held[batch] = 0
            structs[ks][vs] = entry
            _held[batch] += 1
            key_sizes.add(ks)
    return entry


def clear_frame_structs() -> None:
    """Forget every struct in FRAME_STRUCTS and BATCH_STRUCTS."""
    with _structs_lock:
        for structs, key_sizes in ((FRAME_STRUCTS, _key_sizes[0]), (BATCH_STRUCTS, _key_sizes[1])):
            for k in key_sizes:
                structs[k].clear()
            key_sizes.clear()
        _held[:] = [0, 0]


CHECK_FORMAT = ">Qqxb{ks}xi{vs}xi"
"""offset, timestamp, key size, value size and size of such a frame; key and value are skipped."""


@functools.lru_cache(maxsize=2048)
def sized_struct(fmt: str, ks: int, vs: int) -> struct.Struct:
    """The struct of `fmt` for frames with these key and value sizes (cached, shared by all)."""
    return struct.Struct(fmt.format(ks=ks, vs=vs))


def decode_batch(
    buf: bytes | bytearray | memoryview,
    pos: int,
    end: int,
    expect: int | None,
    limit: int = 1 << 62,
    journal: str | None = None,
) -> tuple[list[Message], int, Problem | None]:
    """Decode up to `limit` whole frames from buf[pos:end].

    Each frame must carry the offset `expect`, `expect + 1`, ... (no check when
    `expect` is None). Returns the messages, the position after the last one, and
    the Problem that stopped decoding (None when it stopped at `end` or `limit`).
    With `journal`, the messages are ShardMessages of that journal (same fields, and
    `journal` first).

    Bytes that end at `end` with a next offset to check (every reader's case) take
    `_decode_run`, one loop for frames of any sizes; anything else takes `frame_at` frame by frame.
    """
    if expect is not None and type(buf) is bytes and end == len(buf):
        out, pos, stopped = _decode_run(buf, pos, expect, limit, journal)
        if not stopped:
            return out, pos, None
        expect += len(out)
    else:
        out, pos, stopped = _decode_general(buf, pos, end, expect, limit, journal)
        if not stopped:
            return out, pos, None
        if expect is not None:
            expect += len(out)
    if pos == end:
        return out, pos, None
    problem = check_frame(buf, pos, end, expect)
    assert not isinstance(problem, int), "decode_batch stopped at a valid frame"
    return out, pos, problem


_CHAINED = [struct.Struct(f">iQqBb{ks}sI").unpack_from for ks in range(MAX_KEY + 1)]
"""Per key size, read from 4 bytes before a frame: the trailing size field of the frame before, then the frame's
offset, timestamp, type, key size, key and value size (unsigned: a negative one becomes a size past any buffer),
in one call."""

# The loops below spell the layout's sizes as literals (a module constant costs a lookup per frame): 17 is the
# key size byte (HEADER_SIZE - 1), 22 the key (HEADER_SIZE + SIZE_FIELD after the value size), 26 OVERHEAD.
assert (HEADER_SIZE, SIZE_FIELD, OVERHEAD) == (18, 4, 26)


def _decode_run(buf: bytes, pos: int, expect: int, limit: int, journal: str | None) -> tuple[list[Any], int, bool]:
    """decode_batch's loop over bytes that end at the buffer's end: (messages, position after them, whether
    something other than `limit` stopped it).

    Every check of `frame_at` costs at most an operation here: a key size byte above MAX_KEY (a negative
    i8) has no struct (IndexError), a header cut by the end raises struct.error, a negative value size
    read unsigned ends past the buffer (IndexError or struct.error at the next frame); then the offset and
    the trailing size field are compared. The caller finds the Problem with check_frame.
    """
    out: list[Any] = []
    if limit <= 0:  # nothing asked (the first frame below is taken before any comparison with `limit`)
        return out, pos, False
    append = out.append
    new = _new_message
    no_ts = NO_TIMESTAMP
    total = _same_sizes(buf, pos)
    if total:  # the batch starts with frames of one size: one whole-frame struct call each, while they last
        ks = buf[pos + 17]
        vs = total - 26 - ks
        same = sized_struct(FRAME_FORMAT, ks, vs).unpack_from
        try:  # struct.error: fewer bytes than such a frame left, maybe a smaller frame: the loop below
            for expect in range(expect, expect + limit):  # noqa: B020 (`expect` goes on after the loop)
                off, ts, typ, ks2, key, vs2, value, size = same(buf, pos)
                if off != expect or size != total or ks2 != ks or vs2 != vs:
                    break
                if journal is None:
                    append(new(Message, (off, None if ts == no_ts else ts, typ, key, value)))
                else:
                    append(new(ShardMessage, (journal, off, None if ts == no_ts else ts, typ, key, value)))
                pos += total
            else:
                return out, pos, False
        except struct.error:
            pass
        limit -= len(out)
    f = frame_at(buf, pos, len(buf), expect)
    if f is None:
        return out, pos, True
    # Frames of any sizes. A frame's trailing size field is read by the call that reads the next frame's
    # header (`_CHAINED`): one struct call a frame. So the last frame taken is not checked yet: it is on
    # the way out, and dropped (with `pos` back at its start) if its trailing size field disagrees.
    off, ts, typ, ks, vs = f
    total = 26 + ks + vs
    key, value = buf[pos + 18 : pos + 18 + ks], buf[pos + 22 + ks : pos + total - 4]
    fields = (off, None if ts == no_ts else ts, typ, key, value)
    append(new(Message, fields) if journal is None else new(ShardMessage, (journal, *fields)))
    pos += total
    chained = _CHAINED
    stopped = True
    try:
        for expect in range(expect + 1, expect + limit):  # noqa: B020
            ks = buf[pos + 17]
            size, off, ts, typ, _ks, key, vs = chained[ks](buf, pos - 4)
            if size != total or off != expect:
                break
            vpos = pos + 22 + ks
            total = 26 + ks + vs
            pos += total
            if journal is None:
                append(new(Message, (off, None if ts == no_ts else ts, typ, key, buf[vpos : pos - 4])))
            else:
                append(new(ShardMessage, (journal, off, None if ts == no_ts else ts, typ, key, buf[vpos : pos - 4])))
        else:
            stopped = False
    except (IndexError, struct.error):
        pass
    if not (pos <= len(buf) and I32.unpack_from(buf, pos - 4)[0] == total):
        del out[-1]
        pos -= total
        stopped = True
    return out, pos, stopped


def _same_sizes(buf: bytes, pos: int) -> int:
    """The size of the frame at `pos` when the frame after it has the same key and value sizes (by their
    size fields only: the frames are checked as they are decoded); 0 otherwise (or when cut by the end)."""
    try:
        ks = buf[pos + HEADER_SIZE - 1]
        total = OVERHEAD + ks + I32.unpack_from(buf, pos + HEADER_SIZE + ks)[0]
        nxt = pos + total
        if ks > MAX_KEY or total <= OVERHEAD + ks or buf[nxt + HEADER_SIZE - 1] != ks:
            return 0
        return total if I32.unpack_from(buf, nxt + HEADER_SIZE + ks)[0] == total - OVERHEAD - ks else 0
    except (IndexError, struct.error):
        return 0


def _decode_general(
    buf: bytes | bytearray | memoryview, pos: int, end: int, expect: int | None, limit: int, journal: str | None
) -> tuple[list[Any], int, bool]:
    """decode_batch frame by frame with `frame_at`, for any buffer and `end`, and `expect` None (no check)."""
    out: list[Any] = []
    append = out.append
    new = _new_message
    no_ts = NO_TIMESTAMP
    check = expect is not None
    for _ in range(limit):
        f = frame_at(buf, pos, end, expect)
        if f is None:
            return out, pos, True
        off, ts, typ, ks, vs = f
        kpos = pos + HEADER_SIZE
        vpos = kpos + ks
        nxt = vpos + vs + 2 * SIZE_FIELD
        fields = (off, None if ts == no_ts else ts, typ, buf[kpos:vpos], buf[vpos + SIZE_FIELD : nxt - SIZE_FIELD])
        append(new(Message, fields) if journal is None else new(ShardMessage, (journal, *fields)))
        pos = nxt
        if check:
            expect += 1  # type: ignore[operator]
    return out, pos, False


class Frames(NamedTuple):
    """How far whole, valid frames reach in a buffer (see walk_frames)."""

    used: int  # bytes of whole, valid frames from the start position
    next_offset: int
    max_ts: int
    next_entry: int  # segment position at or after which the next index entry is due
    problem: Problem | None  # what stopped the walk before the end of the buffer


def walk_frames(
    data: bytes | bytearray | memoryview,
    p: int,
    n: int,
    base: int,
    offset: int,
    max_ts: int,
    next_entry: int,
    index: SparseIndex | None,
    interval: int = INDEX_INTERVAL,
) -> Frames:
    """Validate the frames of data[p:n], which sit at segment position `base + p` (pure: no I/O).

    Each frame must carry the next offset, sane sizes and a matching trailing size.
    Index entries (position >= next_entry, then every `interval` bytes) are added to `index` on the way.
    """
    start = p
    # Frames with the same sizes as the one before are checked by one cached struct call that skips the
    # key and value bytes (`same`). Once RUN_AFTER of them came in a row, the next ones are checked in runs
    # (`_run`) as long as the streak so far (so a run that breaks costs little), up to RUN_FRAMES. Any
    # other frame takes the general path.
    same = None
    same_ks = same_vs = same_total = -1
    last_sizes = -1
    streak = 0
    while n - p >= OVERHEAD:
        if same is not None:
            if streak >= RUN_AFTER:
                k = min((n - p) // same_total, RUN_FRAMES, RUN_BYTES // same_total, streak)
                if k > 1:
                    run = memoryview(data)[p : p + k * same_total]
                    try:
                        good, max_ts, next_entry = _run(run, same, same_ks, same_vs, base + p, offset, max_ts,
                                                        next_entry, index, interval)  # fmt: skip
                    finally:
                        run.release()  # no export of `data` outlives the walk
                    offset += good
                    p += good * same_total
                    streak += good
                    if good < k:  # the run ends here: the frame there takes the general path
                        same = None
                    continue
            if n - p >= same_total:
                off, ts, ks, vs, size = same.unpack_from(data, p)
                if off == offset and ks == same_ks and vs == same_vs and size == same_total:
                    if ts > max_ts:
                        max_ts = ts
                    if base + p >= next_entry:
                        index.add(offset, base + p, max_ts)  # type: ignore[union-attr]
                        next_entry = base + p + interval
                    offset += 1
                    p += same_total
                    streak += 1
                    continue
            same = None
        f = frame_at(data, p, n, offset)
        if f is None:
            break
        _off, ts, _typ, ks, vs = f
        if ts > max_ts:
            max_ts = ts
        if base + p >= next_entry:
            index.add(offset, base + p, max_ts)  # type: ignore[union-attr]
            next_entry = base + p + interval
        offset += 1
        p += OVERHEAD + ks + vs
        sizes = ks << 32 | vs
        if sizes == last_sizes:
            same = sized_struct(CHECK_FORMAT, ks, vs)
            same_ks, same_vs, same_total = ks, vs, OVERHEAD + ks + vs
            streak = 0
        last_sizes = sizes
    problem = None if p == n else check_frame(data, p, n, offset)
    assert not isinstance(problem, int), "walk_frames stopped at a valid frame"
    return Frames(p - start, offset, max_ts, next_entry, problem)


RUN_FRAMES = 2048
"""Frames of the same sizes checked together by walk_frames (`_run`)..."""

RUN_BYTES = 1 << 20
"""... in at most this many bytes ..."""

RUN_AFTER = 256
"""... once this many frames of the same sizes came in a row (checked one by one)."""

_LOW = bytes(range(256)) * (RUN_FRAMES // 256 + 2)
"""The low bytes of RUN_FRAMES offsets in a row, from any first one: _LOW[o & 255 :][:k]."""


def _run(
    run: memoryview,
    same: struct.Struct,
    ks: int,
    vs: int,
    at: int,
    offset: int,
    max_ts: int,
    next_entry: int,
    index: SparseIndex | None,
    interval: int,
) -> tuple[int, int, int]:
    """Check `run`, frames of `same.size` bytes each at segment position `at` that should carry `offset`,
    `offset + 1`, ... and these sizes: (how many in a row do, max_ts, next_entry), index entries added as
    walk_frames adds them.

    The fields sit at the same place in every frame, so each byte of them is a column (a strided slice, in C)
    compared with what it must hold (`_uniform`).
    """
    total = same.size
    k = len(run) // total
    good = _uniform(bytes(run), total, k, ks, vs, offset)
    if not good:
        return 0, max_ts, next_entry
    if good == k:  # every frame's timestamp, in one call (k is one of few lengths: RUN_AFTER doubled)
        stamps: Sequence[int] = _stamps(ks, vs, k).unpack(run)
    else:
        stamps = [ts for (ts,) in sized_struct(_STAMP_FORMAT, ks, vs).iter_unpack(run[: good * total])]
    # Index entries as frame by frame: at the first frame at or after next_entry, then `interval` bytes on.
    done = 0
    for j in range(max(0, -(-(next_entry - at) // total)), good, max(1, -(-interval // total))):
        max_ts = max(max_ts, *stamps[done : j + 1])
        done = j + 1
        index.add(offset + j, at + j * total, max_ts)  # type: ignore[union-attr]
        next_entry = at + j * total + interval
    if done < good:
        max_ts = max(max_ts, *stamps[done:good])
    return good, max_ts, next_entry


@functools.lru_cache(maxsize=16)
def _stamps(ks: int, vs: int, k: int) -> struct.Struct:
    """The timestamps of `k` frames in a row with these key and value sizes (the rest skipped)."""
    return struct.Struct(">" + _STAMP_FORMAT[1:].format(ks=ks, vs=vs) * k)


_STAMP_FORMAT = ">8xqxx{ks}x4x{vs}x4x"
"""The timestamp of a frame with these key and value sizes (the rest skipped)."""


def _uniform(b: bytes, total: int, k: int, ks: int, vs: int, offset: int) -> int:
    """How many of the `k` frames of `b` (`total` bytes each), from the first, carry offsets `offset`,
    `offset + 1`, ..., key size `ks`, value size `vs` and size `total`: a strided slice per byte of those
    fields, compared with the bytes it must hold; where one differs, its first difference ends the run."""
    k = min(k, MAX_OFFSET - offset + 1)  # no frame can carry an offset past MAX_OFFSET
    columns = [(HEADER_SIZE - 1, ks.to_bytes(1, "big")), (HEADER_SIZE + ks, vs.to_bytes(4, "big")),
               (total - SIZE_FIELD, total.to_bytes(4, "big"))]  # fmt: skip
    for pos, field in columns:
        for i, byte in enumerate(field):
            k = common_prefix(b[pos + i :: total], bytes((byte,)) * k, k)
    low = offset & 255
    k = common_prefix(b[7::total], _LOW[low : low + k], k)
    # The 7 high bytes of the offsets change only every 256 frames: one piece of equal bytes per 256.
    lengths = [min(k, 256 - low)]
    left = k - lengths[0]
    lengths += [256] * (left // 256) + ([left % 256] if left % 256 else [])
    high = offset >> 8
    for c in range(7):
        shift = 8 * (6 - c)
        want = b"".join(bytes((((high + i) >> shift) & 255,)) * n for i, n in enumerate(lengths))
        k = common_prefix(b[c::total], want, k)
    return k


def common_prefix(column: bytes, want: bytes, k: int) -> int:
    """How many of the first `k` bytes of `column` equal `want`'s (binary search, each step one C compare):
    where a run of frames checked at its stride ends (walk_frames here, the columnar decoder in sej.columns)."""
    if column[:k] == want[:k]:
        return k
    lo, hi = 0, k  # column[:lo] agrees; column[:hi + 1] does not
    while lo < hi:
        mid = (lo + hi) // 2
        if column[: mid + 1] == want[: mid + 1]:
            lo = mid + 1
        else:
            hi = mid
    return lo


__all__ = [
    "BATCH_FORMAT",
    "BATCH_STRUCTS",
    "CHECK_FORMAT",
    "FRAME_FORMAT",
    "FRAME_STRUCTS",
    "FRAME_STRUCTS_MAX",
    "HEADER",
    "HEADER_SIZE",
    "I32",
    "INDEX_INTERVAL",
    "MAX_KEY",
    "MAX_OFFSET",
    "MAX_VALUE",
    "NO_TIMESTAMP",
    "OVERHEAD",
    "SIZE_FIELD",
    "TS_TYPE",
    "Frames",
    "Message",
    "Problem",
    "ShardMessage",
    "check_frame",
    "clear_frame_structs",
    "common_prefix",
    "decode_batch",
    "frame_at",
    "frame_struct",
    "frame_total",
    "sized_struct",
    "walk_frames",
]
