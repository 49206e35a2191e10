"""Output formats: messages as JSON lines, msgpack-decoded JSON, raw values or hex; aligned tables.

Message formats (`--format`):

- ``json`` (default): one JSON object per line with `journal` (only when the
  command reads several journals), `offset`, `timestamp` (int ns or null), `time`
  (ISO 8601 UTC or null), `type`, `key` and `value`. Key and value are UTF-8
  text when they decode, else base64 with ``"key_encoding": "base64"`` /
  ``"value_encoding": "base64"``.
- ``msgpack``: the same, with `value` decoded from msgpack into JSON (bytes
  inside it as base64 strings, other map keys as strings, ext types as
  ``{"ext": code, "data": base64}``). A value that is not msgpack is reported on
  stderr, skipped, and makes the command exit 1 at the end.
- ``raw``: the value bytes followed by a newline.
- ``hex``: ``[journal] offset timestamp type key value`` separated by spaces,
  key and value in hex, ``-`` for an empty key or value or a missing timestamp.
"""

from __future__ import annotations

import base64
import datetime as dt
import json
from collections.abc import Sequence
from typing import IO, Any

import click
import msgpack

from ...frames import Message, ShardMessage
from ...timestamps import format_time

FORMATS = ("json", "msgpack", "raw", "hex")


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _text_field(obj: dict[str, Any], name: str, data: bytes) -> None:
    try:
        obj[name] = data.decode("utf-8")
    except UnicodeDecodeError:
        obj[name] = b64(data)
        obj[f"{name}_encoding"] = "base64"


class NotMsgpack(ValueError):
    """A value that does not decode as one msgpack object."""


def from_msgpack(data: bytes) -> Any:
    """Decode one msgpack object into JSON-able values; NotMsgpack if it is not exactly one."""
    try:
        obj = msgpack.unpackb(data, raw=False, strict_map_key=False, timestamp=3)
    except UnicodeDecodeError:  # a str that is not UTF-8: keep its bytes
        obj = _unpack_raw(data)
    except msgpack.ExtraData as e:
        raise NotMsgpack(f"{len(e.extra)} bytes left after the first msgpack object") from None
    except (ValueError, TypeError, msgpack.UnpackException) as e:  # OutOfData, FormatError, StackError...
        raise NotMsgpack(f"{type(e).__name__}: {e}" if str(e) else type(e).__name__) from None
    return _jsonable(obj)


def _unpack_raw(data: bytes) -> Any:
    try:
        return msgpack.unpackb(data, raw=True, strict_map_key=False, timestamp=3)
    except (ValueError, TypeError, msgpack.UnpackException) as e:
        raise NotMsgpack(f"{type(e).__name__}: {e}" if str(e) else type(e).__name__) from None


def _jsonable(obj: Any) -> Any:
    if isinstance(obj, (bytes, bytearray)):
        return b64(bytes(obj))
    if isinstance(obj, dict):
        return {_key(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, dt.datetime):
        return obj.isoformat().replace("+00:00", "Z")
    if isinstance(obj, msgpack.ExtType):
        return {"ext": obj.code, "data": b64(obj.data)}
    return obj


def _key(k: Any) -> str:
    if isinstance(k, str):
        return k
    if isinstance(k, (bytes, bytearray)):
        try:
            return bytes(k).decode("utf-8")
        except UnicodeDecodeError:
            return b64(bytes(k))
    if isinstance(k, (int, float, bool)) or k is None:
        return json.dumps(k)
    return json.dumps(_jsonable(k), separators=(",", ":"))


def message_object(
    m: Message | ShardMessage, journal: str | None = None, position: int | None = None
) -> dict[str, Any]:
    """The JSON object of a message (value as text or base64)."""
    obj: dict[str, Any] = {}
    if journal is not None:
        obj["journal"] = journal
    obj["offset"] = m.offset
    if position is not None:
        obj["position"] = position
    obj["timestamp"] = m.timestamp
    obj["time"] = format_time(m.timestamp)
    obj["type"] = m.type
    _text_field(obj, "key", m.key)
    _text_field(obj, "value", m.value)
    return obj


def dumps(obj: Any) -> str:
    return json.dumps(obj, ensure_ascii=False)


class MessageWriter:
    """Writes messages to a binary stream in one of FORMATS; counts msgpack failures."""

    def __init__(self, fmt: str, stream: IO[bytes], *, label: str = "", flush_each: bool = False) -> None:
        self.fmt = fmt
        self.stream = stream
        self.label = label  # names where messages come from in error lines (journal or file)
        self.flush_each = flush_each
        self.written = 0
        self.failed = 0

    def write(self, m: Message | ShardMessage, journal: str | None = None, position: int | None = None) -> None:
        fmt = self.fmt
        if fmt == "raw":
            line = m.value + b"\n"
        elif fmt == "hex":
            ts = "-" if m.timestamp is None else str(m.timestamp)
            fields = [str(m.offset), ts, str(m.type), m.key.hex() or "-", m.value.hex() or "-"]
            if journal is not None:
                fields.insert(0, journal)
            line = (" ".join(fields) + "\n").encode()
        else:
            obj = message_object(m, journal, position)
            if fmt == "msgpack":
                del obj["value"]
                obj.pop("value_encoding", None)
                try:
                    obj["value"] = from_msgpack(m.value)
                except NotMsgpack as e:
                    self.failed += 1
                    where = journal or self.label
                    where = f"{where}: " if where else ""
                    self.stream.flush()  # keep the error line after the lines before it on a terminal
                    click.echo(f"sej: error: {where}offset {m.offset}: value is not msgpack ({e})", err=True)
                    return
            line = (dumps(obj) + "\n").encode("utf-8")
        self.stream.write(line)
        self.written += 1
        if self.flush_each:
            self.stream.flush()


def table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """Rows aligned in columns under headers; numbers right-aligned, the rest left-aligned."""
    cells = [[str(h) for h in headers]] + [["-" if v is None else str(v) for v in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    numeric = [
        all(isinstance(row[i], int) or row[i] is None for row in rows) and any(isinstance(row[i], int) for row in rows)
        for i in range(len(headers))
    ]
    lines = []
    for r in cells:
        parts = [c.rjust(w) if numeric[i] else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths))]
        lines.append("  ".join(parts).rstrip())
    return "\n".join(lines)


def pairs(items: Sequence[tuple[str, object]]) -> str:
    """`name  value` lines with the values aligned."""
    width = max(len(k) for k, _ in items)
    return "\n".join(f"{k.ljust(width)}  {'-' if v is None else v}" for k, v in items)


def human_bytes(n: int) -> str:
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024 or unit == "TiB":
            return f"{n} B" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    raise AssertionError("unreachable")
