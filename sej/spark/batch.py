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

import datetime as dt
import json
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    EqualTo,
    Filter,
    GreaterThan,
    GreaterThanOrEqual,
    In,
    InputPartition,
    LessThan,
    LessThanOrEqual,
)
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
from ..frames import MAX_OFFSET
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
    from ..timestamps import parse_time

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
        options = self._options()
        if options.get("pushfilters", "false").strip().lower() == "true":
            return SejFilteringReader(options)
        return SejBatchReader(options)

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
        # Narrowed by pushed-down filters (SejFilteringReader):
        self.min_offset, self.end_offset = 0, MAX_OFFSET + 1
        self.shards: set[str] | None = None
        self.clients: set[str] | None = None

    def partitions(self) -> list[SegmentPart]:
        parts: list[SegmentPart] = []
        if self.types == () or self.shards == set() or self.clients == set():
            return parts
        for src in find_sources(self.path):
            if self.shards is not None and src.shard not in self.shards:
                continue
            if self.clients is not None and src.client not in self.clients:
                continue
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
            lo, hi = max(lo, self.min_offset), min(hi, self.end_offset)
            parts.extend(plan_range(src, lo, hi, types=self.types, max_bytes=self.max_bytes, segments=segments))
        return parts

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if not isinstance(partition, SegmentPart):  # Spark reads one InputPartition(None) when there are none
            return iter(())
        return read_part(partition)


class SejFilteringReader(SejBatchReader):
    """The batch reader with filter pushdown, chosen by the option pushFilters=true.

    PySpark 4.1+ refuses every read from a reader that implements pushFilters unless
    `spark.sql.python.filterPushdown.enabled` is true, hence a separate, opt-in class.
    Filters on offset, type, shard and client are applied exactly; a lower bound on
    timestamp skips every message before it and Spark still applies the filter.
    """

    def pushFilters(self, filters: list[Filter]) -> Iterator[Filter]:
        for f in filters:
            if not self._push(f):
                yield f

    def _push(self, f: Filter) -> bool:
        """Narrow the read by `f`; True if the read then holds exactly the rows `f` keeps."""
        attribute: tuple[str, ...] = getattr(f, "attribute", ())
        if len(attribute) != 1:
            return False
        column = attribute[0]
        value: Any = getattr(f, "value", None)
        if column == "offset" and _is_int(value):
            v = int(value)
            if isinstance(f, EqualTo):
                self.min_offset, self.end_offset = max(self.min_offset, v), min(self.end_offset, v + 1)
            elif isinstance(f, GreaterThan | GreaterThanOrEqual):
                self.min_offset = max(self.min_offset, v + isinstance(f, GreaterThan))
            elif isinstance(f, LessThan | LessThanOrEqual):
                self.end_offset = min(self.end_offset, v + isinstance(f, LessThanOrEqual))
            else:
                return False
            return True
        values: set[Any] | None = set(value) if isinstance(f, In) else {value} if isinstance(f, EqualTo) else None
        if values is None:
            if column == "timestamp" and isinstance(f, GreaterThan | GreaterThanOrEqual):
                t = _aware_ns(value)
                if t is not None:
                    self.start_time = t if self.start_time is None else max(self.start_time, t)
            return False
        if column == "type" and all(_is_int(v) for v in values):
            self.types = tuple(sorted(values if self.types is None else values & set(self.types)))
        elif column == "shard" and all(isinstance(v, str) for v in values):
            self.shards = values if self.shards is None else self.shards & values
        elif column == "client" and all(isinstance(v, str) for v in values):
            self.clients = values if self.clients is None else self.clients & values
        else:
            return False
        return True


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _aware_ns(v: object) -> int | None:
    """Nanoseconds since the epoch of a timezone-aware datetime; None for anything else."""
    if not isinstance(v, dt.datetime) or v.tzinfo is None:
        return None
    return (v - EPOCH) // dt.timedelta(microseconds=1) * 1000


EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)

__all__ = ["SCHEMA", "SejDataSource"]
