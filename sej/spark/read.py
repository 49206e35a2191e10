"""Decoding one partition's byte range of a segment into Arrow record batches."""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterator
from typing import Any

import pyarrow as pa

from ..errors import CorruptionError, CorruptionWarning, DataLossError
from ..message import decode_batch
from ..segment import _frame_total
from .plan import SegmentPart

ARROW_SCHEMA = pa.schema(
    [
        pa.field("client", pa.string(), True),
        pa.field("shard", pa.string(), False),
        pa.field("offset", pa.int64(), False),
        pa.field("timestamp", pa.timestamp("us", tz="UTC"), True),
        pa.field("type", pa.int32(), False),
        pa.field("key", pa.binary(), False),
        pa.field("value", pa.binary(), False),
    ]
)

BATCH_ROWS = 8192
READ_CHUNK = 4 << 20


def read_part(p: SegmentPart) -> Iterator[pa.RecordBatch]:
    """Decode the frames of a partition into Arrow batches of the schema's columns."""
    cols: dict[str, list[Any]] = {k: [] for k in ("offset", "timestamp", "type", "key", "value")}
    try:
        f = open(p.path, "rb")
    except FileNotFoundError:
        if p.missing_ok:
            warnings.warn(f"sej: {p.path} was deleted before it was read; skipping it", CorruptionWarning, stacklevel=2)
            return
        raise DataLossError(f"{p.path} was deleted before it was read (offsets {p.first} on)") from None
    with f:
        fd = f.fileno()
        base, expect, want = p.start, p.first, READ_CHUNK
        while base < p.end and expect < p.hi:
            data = os.pread(fd, min(want, p.end - base), base)
            if not data:
                break
            msgs, used, problem = decode_batch(data, 0, len(data), expect)
            for m in msgs:
                if m.offset < p.lo or m.offset >= p.hi or (p.types is not None and m.type not in p.types):
                    continue
                cols["offset"].append(m.offset)
                cols["timestamp"].append(None if m.timestamp is None else m.timestamp // 1000)
                cols["type"].append(m.type)
                cols["key"].append(m.key)
                cols["value"].append(m.value)
                if len(cols["offset"]) >= BATCH_ROWS:
                    yield _batch(p, cols)
            if msgs:
                expect = msgs[-1].offset + 1
            base += used
            want = READ_CHUNK
            if problem is not None:
                if not problem.incomplete:
                    raise CorruptionError(p.path, base, problem.reason)
                if used == 0:
                    if base + len(data) >= p.end:
                        break  # an unfinished last message: not there yet
                    want = max(READ_CHUNK, _frame_total(data, 0, len(data)) or 2 * len(data))
    if cols["offset"]:
        yield _batch(p, cols)


def _batch(p: SegmentPart, cols: dict[str, list[Any]]) -> pa.RecordBatch:
    n = len(cols["offset"])
    batch = pa.RecordBatch.from_arrays(
        [
            pa.array([p.client] * n, pa.string()),
            pa.array([p.shard] * n, pa.string()),
            pa.array(cols["offset"], pa.int64()),
            pa.array(cols["timestamp"], pa.timestamp("us", tz="UTC")),
            pa.array(cols["type"], pa.int32()),
            pa.array(cols["key"], pa.binary()),
            pa.array(cols["value"], pa.binary()),
        ],
        schema=ARROW_SCHEMA,
    )
    for v in cols.values():
        v.clear()
    return batch


__all__ = ["ARROW_SCHEMA", "read_part"]
