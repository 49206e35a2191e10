"""The batch reader of the `sej` format: `spark.read.format("sej").load(path)`.

`path` is a journal, a sharded root or a hub root (`<client-id>.<shard>` directories),
several of them (`load([a, b])`) or a glob pattern; the columns are in schema.py. A large
segment is split at sparse-index positions so several tasks read it; small segments and
pieces, of any journals, are packed into one task as Spark packs small files (plan.pack).
`read()` yields Arrow batches. The options are in docs/spark.md and options.py; with
pushFilters=true, SejFilteringReader (below) reads instead of SejBatchReader.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSourceReader,
    EqualTo,
    Filter,
    GreaterThan,
    GreaterThanOrEqual,
    In,
    InputPartition,
    LessThan,
    LessThanOrEqual,
)

from ..errors import InvalidArgumentError
from ..frames import MAX_OFFSET
from ..journal import next_offset, offset_at_time
from ..layout import list_segments
from ..timestamps import to_ns
from .options import (
    Options,
    bool_option,
    millis_by_journal_option,
    millis_option,
    packing_options,
    paths_option,
    position_or_offsets_option,
    time_option,
    types_option,
    verify_option,
)
from .plan import PackedPart, SegmentPart, find_sources, pack, plan_range
from .read import read_partition


class SejBatchReader(DataSourceReader):
    """Every message of the journals under `path` within the options' offset and time ranges."""

    def __init__(self, options: Options) -> None:
        self.paths = paths_option(options, "spark.read.format('sej').load(path)")
        self.include_root = bool_option(options, "includeroot", False)
        starting = position_or_offsets_option(options, "startingoffsets", "earliest")
        self.starting = {} if starting == "earliest" else starting  # a dict, or "latest"
        ending = position_or_offsets_option(options, "endingoffsets", "latest")
        if isinstance(ending, str) and ending != "latest":
            raise InvalidArgumentError("option endingOffsets must be latest or JSON offsets, not earliest")
        self.ending: dict[str, int] = {} if isinstance(ending, str) else ending
        # Times: ours (ISO 8601, relative or ns) and the Kafka source's (ms), for all journals or each one.
        self.start_time = _latest(time_option(options, "starttime"), millis_option(options, "startingtimestamp"))
        self.end_time = _earliest(time_option(options, "endtime"), millis_option(options, "endingtimestamp"))
        self.start_times = millis_by_journal_option(options, "startingoffsetsbytimestamp")
        self.end_times = millis_by_journal_option(options, "endingoffsetsbytimestamp")
        self.types = types_option(options)
        self.verify = verify_option(options)
        self.max_bytes, self.open_cost, self.min_partitions = packing_options(options)
        # Narrowed by pushed-down filters (SejFilteringReader):
        self.min_offset, self.end_offset = 0, MAX_OFFSET + 1
        self.shards: set[str] | None = None
        self.clients: set[str] | None = None

    def partitions(self) -> list[SegmentPart | PackedPart]:
        parts: list[SegmentPart] = []
        if self.types == () or self.shards == set() or self.clients == set():
            return []
        for src in find_sources(self.paths, include_root=self.include_root):
            if self.shards is not None and src.shard not in self.shards:
                continue
            if self.clients is not None and src.client not in self.clients:
                continue
            segments = list_segments(src.path)
            if not segments:
                continue
            lo = segments[0].first_offset
            hi = next_offset(src.path, segments)
            s = -1 if isinstance(self.starting, str) else self.starting.get(src.name, -2)
            if s >= 0:
                lo = max(lo, s)
            elif s == -1:
                lo = hi
            e = self.ending.get(src.name, -1)
            if e >= 0:
                hi = min(hi, e)
            start = _latest(self.start_time, self.start_times.get(src.name))
            if start is not None:
                lo = max(lo, offset_at_time(src.path, start))
            end = _earliest(self.end_time, self.end_times.get(src.name))
            if end is not None:
                hi = min(hi, offset_at_time(src.path, end))
            lo, hi = max(lo, self.min_offset), min(hi, self.end_offset)
            parts.extend(plan_range(src, lo, hi, types=self.types, max_bytes=self.max_bytes, segments=segments,
                                    verify=self.verify))  # fmt: skip
        return pack(parts, self.max_bytes, self.open_cost, self.min_partitions)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return read_partition(partition)


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


def _latest(*times: int | None) -> int | None:
    given = [t for t in times if t is not None]
    return max(given) if given else None


def _earliest(*times: int | None) -> int | None:
    given = [t for t in times if t is not None]
    return min(given) if given else None


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _aware_ns(v: object) -> int | None:
    """Nanoseconds since the epoch of a timezone-aware datetime; None for anything else."""
    if not isinstance(v, dt.datetime) or v.tzinfo is None:
        return None
    return to_ns(v)


__all__ = ["SejBatchReader", "SejFilteringReader"]
