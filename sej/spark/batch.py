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
from collections.abc import Iterator

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceReader, DataSourceStreamReader, InputPartition
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
from ..layout import list_segments
from .plan import MAX_BYTES_PER_PARTITION, SegmentPart, find_sources, plan_range
from .read import read_part

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


def _types_option(options: dict[str, str]) -> tuple[int, ...] | None:
    raw = options.get("type")
    if raw is None:
        return None
    try:
        types = tuple(int(x) for x in str(raw).split(","))
    except ValueError:
        types = ()
    if not types or not all(0 <= t <= 255 for t in types):
        raise InvalidArgumentError(f"option type must be message types 0-255 like 2 or 1,3, got {raw!r}")
    return types


def _int_option(options: dict[str, str], name: str, default: int, minimum: int = 1) -> int:
    raw = options.get(name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        value = minimum - 1
    if value < minimum:
        raise InvalidArgumentError(f"option {name} must be an integer >= {minimum}, got {raw!r}")
    return value


class SejDataSource(DataSource):
    """The `sej` format."""

    @classmethod
    def name(cls) -> str:
        return "sej"

    def schema(self) -> StructType:
        return SCHEMA

    def _options(self) -> dict[str, str]:
        # Spark's option names are case-insensitive: look them up in lower case.
        return {str(k).lower(): str(v) for k, v in dict(self.options).items()}

    def reader(self, schema: StructType) -> DataSourceReader:
        return SejBatchReader(self._options())

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        from .stream import SejStreamReader

        return SejStreamReader(self._options())


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
        self.types = _types_option(options)
        self.max_bytes = _int_option(options, "maxbytesperpartition", MAX_BYTES_PER_PARTITION)

    def partitions(self) -> list[SegmentPart]:
        parts: list[SegmentPart] = []
        for src in find_sources(self.path):
            segments = list_segments(src.path)
            if not segments:
                continue
            lo = segments[0].first_offset
            hi = next_offset(src.path)
            s = self.starting.get(src.name, -2)
            if s >= 0:
                lo = max(lo, s)
            elif s == -1:
                lo = hi
            e = self.ending.get(src.name, -1)
            if e >= 0:
                hi = min(hi, e)
            if self.start_time is not None:
                lo = max(lo, offset_at_time(src.path, self.start_time))
            if self.end_time is not None:
                hi = min(hi, offset_at_time(src.path, self.end_time))
            parts.extend(plan_range(src, lo, hi, types=self.types, max_bytes=self.max_bytes, segments=segments))
        return parts

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, SegmentPart)
        return read_part(partition)


__all__ = ["SCHEMA", "SejDataSource"]
