"""The public codec: encode and decode one message, with typed errors naming a bad field (no I/O).

The frame layout and the walkers over many frames are in sej.frames.
"""

from __future__ import annotations

import struct

from .errors import FrameError, InvalidArgumentError
from .frames import (
    CHECK_FORMAT,
    FRAME_FORMAT,
    HEADER,
    HEADER_SIZE,
    I32,
    MAX_KEY,
    MAX_OFFSET,
    MAX_VALUE,
    NO_TIMESTAMP,
    OVERHEAD,
    Message,
    Problem,
    check_frame,
    decode_batch,
    sized_struct,
)


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
    if isinstance(key, memoryview):  # its len() counts items, not bytes
        key = key.tobytes()
    if isinstance(value, memoryview):
        value = value.tobytes()
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
    if not isinstance(buf, bytes):
        buf = buf.tobytes() if isinstance(buf, memoryview) else bytes(buf)  # the key and value come out as bytes
    msgs, end, problem = decode_batch(buf, pos, len(buf), expect, 1)
    if msgs:
        return msgs[0], end
    if problem is None:
        raise FrameError("incomplete frame: no bytes", pos)
    raise FrameError(problem.reason, problem.position)


__all__ = [
    "CHECK_FORMAT",
    "FRAME_FORMAT",
    "HEADER",
    "HEADER_SIZE",
    "I32",
    "MAX_KEY",
    "MAX_OFFSET",
    "MAX_VALUE",
    "NO_TIMESTAMP",
    "OVERHEAD",
    "Message",
    "Problem",
    "check_fields",
    "check_frame",
    "decode",
    "decode_batch",
    "encode",
    "encode_message",
    "sized_struct",
]
