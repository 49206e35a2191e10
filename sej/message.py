"""The SEJ message frame: pure encode/decode functions, bytes in and out, no I/O.

A frame, all integers big-endian (byte-identical with h12.io/sej)::

    offset u64 | timestamp i64 | type u8 | key_size i8 | key | value_size i32 | value | size i32

`size` is the whole frame, itself included: 26 + len(key) + len(value).
"""

from __future__ import annotations

import functools
import struct
from typing import NamedTuple

from .errors import FrameError, InvalidArgumentError

NO_TIMESTAMP = -(2**63)
"""The timestamp field value meaning "no timestamp" (decoded as None)."""

HEADER = struct.Struct(">QqBb")  # offset, timestamp, type, key_size
HEADER_SIZE = HEADER.size  # 18
I32 = struct.Struct(">i")
OVERHEAD = HEADER_SIZE + 4 + 4  # 26: header, value_size, size
MAX_KEY = 127
MAX_VALUE = 2**31 - 1 - OVERHEAD - MAX_KEY
MAX_OFFSET = 2**64 - 1


class Message(NamedTuple):
    """One journal message. `timestamp` is ns since the Unix epoch, or None."""

    offset: int
    timestamp: int | None
    type: int
    key: bytes
    value: bytes


_new_message = tuple.__new__


def frame_size(key_len: int, value_len: int) -> int:
    """The encoded size of a message with these key and value lengths."""
    return OVERHEAD + key_len + value_len


def check_fields(offset: object, timestamp: object, type: object, key: object, value: object) -> None:
    """Raise InvalidArgumentError naming the first field that cannot be encoded."""
    if not isinstance(offset, int) or isinstance(offset, bool) or not 0 <= offset <= MAX_OFFSET:
        raise InvalidArgumentError(f"offset must be an int in 0..2**64-1, got {offset!r}")
    if timestamp is not None and (
        not isinstance(timestamp, int) or isinstance(timestamp, bool) or not -(2**63) <= timestamp < 2**63
    ):
        raise InvalidArgumentError(f"timestamp must be int nanoseconds (int64) or None, got {timestamp!r}")
    if not isinstance(type, int) or isinstance(type, bool) or not 0 <= type <= 255:
        raise InvalidArgumentError(f"type must be an int in 0..255, got {type!r}")
    if not isinstance(key, (bytes, bytearray, memoryview)):
        raise InvalidArgumentError(f"key must be bytes, got {_short(key)}")
    if len(key) > MAX_KEY:
        raise InvalidArgumentError(f"key is {len(key)} bytes, at most {MAX_KEY} are allowed: {_short(key)}")
    if not isinstance(value, (bytes, bytearray, memoryview)):
        raise InvalidArgumentError(f"value must be bytes, got {_short(value)}")
    if len(value) > MAX_VALUE:
        raise InvalidArgumentError(f"value is {len(value)} bytes, at most {MAX_VALUE} are allowed")


def _short(obj: object) -> str:
    text = repr(obj)
    return f"{type(obj).__name__} {text[:60]}{'...' if len(text) > 60 else ''}"


def encode(offset: int, timestamp: int | None, type: int, key: bytes, value: bytes) -> bytes:
    """Encode one frame. Raises InvalidArgumentError naming a field that does not fit."""
    ts = NO_TIMESTAMP if timestamp is None else timestamp
    try:
        klen = len(key)
        vlen = len(value)
        return b"".join(
            (HEADER.pack(offset, ts, type, klen), key, I32.pack(vlen), value, I32.pack(OVERHEAD + klen + vlen))
        )
    except (struct.error, TypeError, OverflowError):
        check_fields(offset, timestamp, type, key, value)
        raise


def encode_message(msg: Message) -> bytes:
    """Encode a Message."""
    return encode(msg.offset, msg.timestamp, msg.type, msg.key, msg.value)


class Problem(NamedTuple):
    """Why decoding stopped before the end of the buffer.

    `incomplete` is True when the bytes so far are a valid prefix of a frame
    (more data may complete it); False when they can never be a valid frame.
    """

    position: int
    reason: str
    incomplete: bool


def decode(buf: bytes | bytearray | memoryview, pos: int = 0, expect: int | None = None) -> tuple[Message, int]:
    """Decode the frame at `pos`; return it and the position after it.

    Raises FrameError when the bytes are incomplete or invalid, or when `expect`
    is given and the frame's offset differs.
    """
    if not isinstance(buf, (bytes, bytearray, memoryview)):
        raise InvalidArgumentError(f"buf must be bytes, got {_short(buf)}")
    if not isinstance(pos, int) or isinstance(pos, bool) or not 0 <= pos <= len(buf):
        raise InvalidArgumentError(f"pos must be an int in 0..{len(buf)}, got {pos!r}")
    if expect is not None and (not isinstance(expect, int) or isinstance(expect, bool)):
        raise InvalidArgumentError(f"expect must be an int offset or None, got {expect!r}")
    if isinstance(buf, memoryview):
        buf = buf.cast("B") if buf.format != "B" else buf
        buf = bytes(buf)  # so the key and value come out as bytes
    msgs, end, problem = decode_batch(buf, pos, len(buf), expect, 1)
    if msgs:
        return msgs[0], end
    if problem is None:
        raise FrameError("incomplete frame: no bytes", pos)
    raise FrameError(problem.reason, problem.position)


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


FRAME_FORMAT = ">QqBb{ks}si{vs}si"
"""A whole frame with known key and value sizes: one pack or unpack call."""

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
) -> tuple[list[Message], int, Problem | None]:
    """Decode up to `limit` whole frames from buf[pos:end].

    Each frame must carry the offset `expect`, `expect + 1`, ... (no check when
    `expect` is None). Returns the messages, the position after the last one, and
    the Problem that stopped decoding (None when it stopped at `end` or `limit`).
    """
    out: list[Message] = []
    append = out.append
    unpack_head = HEADER.unpack_from
    unpack_i32 = I32.unpack_from
    new = _new_message
    no_ts = NO_TIMESTAMP
    check = expect is not None
    n = 0
    # Frames with the same key and value sizes as the two before them are decoded by one
    # cached struct call (`same`), checked field by field; any other frame takes the general path.
    same = None
    same_ks = same_vs = same_total = -1
    last_sizes = -1
    while n < limit:
        if same is not None:
            if end - pos >= same_total:
                off, ts, typ, ks, key, vs, value, size = same(buf, pos)
                if ks == same_ks and vs == same_vs and size == same_total and (off == expect or not check):
                    append(new(Message, (off, None if ts == no_ts else ts, typ, key, value)))
                    pos += same_total
                    n += 1
                    if check:
                        expect += 1  # type: ignore[operator]
                    continue
            same = None
        if end - pos < OVERHEAD:
            if pos == end:
                return out, pos, None
            break
        off, ts, typ, ks = unpack_head(buf, pos)
        if check and off != expect or ks < 0:
            break
        kpos = pos + 18
        vpos = kpos + ks
        if vpos + 4 > end:
            break
        (vs,) = unpack_i32(buf, vpos)
        nxt = vpos + 8 + vs
        if vs < 0 or nxt > end or unpack_i32(buf, nxt - 4)[0] != nxt - pos:
            break
        append(new(Message, (off, None if ts == no_ts else ts, typ, buf[kpos:vpos], buf[vpos + 4 : nxt - 4])))
        pos = nxt
        if check:
            expect += 1  # type: ignore[operator]
        n += 1
        sizes = ks << 32 | vs
        if sizes == last_sizes:
            same = sized_struct(FRAME_FORMAT, ks, vs).unpack_from
            same_ks, same_vs, same_total = ks, vs, OVERHEAD + ks + vs
        last_sizes = sizes
    else:
        return out, pos, None
    problem = check_frame(buf, pos, end, expect)
    assert not isinstance(problem, int), "decode_batch stopped at a valid frame"
    return out, pos, problem
