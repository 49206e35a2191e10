"""A PySpark data source for sej journals (batch): `spark.read.format("sej").load(path)`.

`path` is a journal, a sharded root or a hub root (`<client-id>.<shard>` directories).
Columns: client (null outside a hub root), shard, offset, timestamp (null for "no
timestamp"), type, key, value. One partition per segment; a large segment is split
at sparse-index positions so several tasks read it. `read()` yields Arrow batches.

Options: startingOffsets / endingOffsets (JSON `{"<journal>": offset}`, -2 for the
earliest / -1 for the latest, like Spark's Kafka source; ending is exclusive),
startTime / endTime (ISO 8601 or ns), type (an int), maxBytesPerPartition.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
from pyspark.sql.types import (
    BinaryType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from ..errors import InvalidArgumentError
from ..journal import next_offset, offset_at_time
from ..layout import index_path, list_segments
from ..message import decode_batch
from ..segment import _frame_total, seek_index
from ..shard.name import is_shard_name
from ..shard.root import find_journals

SCHEMA = StructType(
    [
        StructField("client", StringType(), True),
        StructField("shard", StringType(), False),
        StructField("offset", LongType(), False),
        StructField("timestamp", TimestampType(), True),
        StructField("type", IntegerType(), False),
        StructField("key", BinaryType(), False),
        StructField("value", BinaryType(), False),
    ]
)

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

MAX_BYTES_PER_PARTITION = 64 << 20
BATCH_ROWS = 8192
READ_CHUNK = 4 << 20


def split_name(name: str) -> tuple[str | None, str]:
    """(client, shard) of a journal found under a root: `<client>.<shard>` in a hub root."""
    if not name:
        return None, ""
    if is_shard_name(name):
        return None, name
    client, _, shard = name.partition(".")
    return (client, shard) if shard else (None, name)


class SegmentPart(InputPartition):
    """Frames of one segment: byte range [start, end) starting at message `first`, kept if in [lo, hi)."""

    def __init__(
        self,
        *,
        path: str,
        client: str | None,
        shard: str,
        first: int,
        start: int,
        end: int,
        lo: int,
        hi: int,
        types: tuple[int, ...] | None,
    ) -> None:
        super().__init__(path)
        self.path, self.client, self.shard = path, client, shard
        self.first, self.start, self.end = first, start, end
        self.lo, self.hi, self.types = lo, hi, types


def _offsets_option(options: dict[str, str], name: str) -> dict[str, int]:
    raw = options.get(name)
    if raw is None:
        return {}
    try:
        parsed = json.loads(raw)
    except json.JSONDecodeError as e:
        raise InvalidArgumentError(f'option {name} must be JSON like {{"<journal>": 42}}, got {raw!r}: {e}') from None
    if not isinstance(parsed, dict) or not all(isinstance(v, int) and v >= -2 for v in parsed.values()):
        raise InvalidArgumentError(f"option {name} must map journal names to offsets (>= 0, -1 or -2), got {raw!r}")
    return {str(k): int(v) for k, v in parsed.items()}


def _time_option(options: dict[str, str], name: str) -> int | None:
    raw = options.get(name)
    if raw is None:
        return None
    from ..cmd.timeparse import parse_time

    try:
        return parse_time(raw)
    except Exception as e:
        raise InvalidArgumentError(f"option {name}: {e}") from None


class SejDataSource(DataSource):
    """The `sej` format."""

    @classmethod
    def name(cls) -> str:
        return "sej"

    def schema(self) -> StructType:
        return SCHEMA

    def reader(self, schema: StructType) -> DataSourceReader:
        # Spark's option names are case-insensitive: look them up in lower case.
        return SejBatchReader({str(k).lower(): str(v) for k, v in dict(self.options).items()})


class SejBatchReader(DataSourceReader):
    def __init__(self, options: dict[str, str]) -> None:
        path = options.get("path")
        if not path:
            raise InvalidArgumentError("spark.read.format('sej').load(path) needs a path")
        self.path = path
        self.starting = _offsets_option(options, "startingoffsets")
        self.ending = _offsets_option(options, "endingoffsets")
        self.start_time = _time_option(options, "starttime")
        self.end_time = _time_option(options, "endtime")
        t = options.get("type")
        self.types = None if t is None else tuple(int(x) for x in str(t).split(","))
        self.max_bytes = int(options.get("maxbytesperpartition", MAX_BYTES_PER_PARTITION))

    def partitions(self) -> list[SegmentPart]:
        parts: list[SegmentPart] = []
        for j in find_journals(self.path):
            client, shard = split_name(j.name)
            shard = shard or os.path.basename(os.path.normpath(j.path))
            segments = list_segments(j.path)
            if not segments:
                continue
            lo = segments[0].first_offset
            hi = next_offset(j.path)
            s = self.starting.get(j.name, -2)
            if s >= 0:
                lo = max(lo, s)
            elif s == -1:
                lo = hi
            e = self.ending.get(j.name, -1)
            if e >= 0:
                hi = min(hi, e)
            if self.start_time is not None:
                lo = max(lo, offset_at_time(j.path, self.start_time))
            if self.end_time is not None:
                hi = min(hi, offset_at_time(j.path, self.end_time))
            if lo >= hi:
                continue
            for i, seg in enumerate(segments):
                seg_end = segments[i + 1].first_offset if i + 1 < len(segments) else hi
                if seg_end <= lo or seg.first_offset >= hi:
                    continue
                parts.extend(self._split(j.path, seg, i == len(segments) - 1, client, shard, lo, hi))
        return parts

    def _split(
        self, jpath: str, seg: Any, is_last: bool, client: str | None, shard: str, lo: int, hi: int
    ) -> list[SegmentPart]:
        """Partitions of one segment, cut at index entries about every maxBytesPerPartition bytes."""
        with open(seg.path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            index = seek_index(index_path(jpath, seg.first_offset), seg, f.fileno(), size, is_last)
        cuts = [(0, seg.first_offset)]
        for k in range(len(index)):
            e = index[k]
            if e.position - cuts[-1][0] >= self.max_bytes:
                cuts.append((e.position, e.offset))
        out = []
        for k, (pos, first) in enumerate(cuts):
            end = cuts[k + 1][0] if k + 1 < len(cuts) else size
            nxt_first = cuts[k + 1][1] if k + 1 < len(cuts) else None
            if nxt_first is not None and nxt_first <= lo:
                continue
            if first >= hi:
                break
            out.append(SegmentPart(path=seg.path, client=client, shard=shard, first=first, start=pos, end=end,
                                   lo=lo, hi=hi, types=self.types))  # fmt: skip
        return out

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, SegmentPart)
        return read_part(partition)


def read_part(p: SegmentPart) -> Iterator[pa.RecordBatch]:
    """Decode the frames of a partition into Arrow batches of the schema's columns."""
    cols: dict[str, list[Any]] = {k: [] for k in ("offset", "timestamp", "type", "key", "value")}
    with open(p.path, "rb") as f:
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
                    raise InvalidArgumentError(f"{p.path}: corrupt frame at byte {base}: {problem.reason}")
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


__all__ = ["SCHEMA", "SejDataSource"]
