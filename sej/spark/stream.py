"""The `sej` format as a Spark streaming source: `spark.readStream.format("sej").load(path)`.

An offset is a dict of journal name to the next offset to read. Journals that appear
under the path later enter the offsets at their first offset in one micro-batch and
are read from the next, so every micro-batch is fixed by its (start, end) pair and a
replay after a failure reads exactly the same rows.

With the option queryName, each journal's reader offset `ofs/spark-<queryName>.ofs` (which
retention respects) follows the query: `commit()` stores a batch's end when Spark commits it,
and `latestOffset()` stores its `start`, the end of the last micro-batch whose sink write
finished. Spark calls `commit()` only when it plans the next batch, so without the second an
`availableNow` run that ends normally would leave the offsets a whole run behind.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterator, Sequence

import pyarrow as pa
from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    ReadMinRows,
    SupportsTriggerAvailableNow,
)

from ..errors import CorruptionWarning, DataLossError
from ..journal import first_offset, next_offset, offset_at_time
from ..layout import check_reader_name, list_segments, offset_dir, reader_offset_path
from ..offset import read_offset_file, write_offset_file
from .options import (
    Options,
    bool_option,
    int_option,
    millis_by_journal_option,
    millis_option,
    packing_options,
    paths_option,
    position_or_offsets_option,
    time_option,
    types_option,
    verify_option,
)
from .plan import JournalSource, SegmentPart, find_sources, pack, plan_range
from .read import read_partition

Offsets = dict[str, int]


def share_rows(available: dict[str, int], budget: int) -> dict[str, int]:
    """Split `budget` rows fairly over journals with `available` rows each (smallest first).

    Every journal with rows gets at least one while the budget lasts, so a trigger always
    makes progress; the total never exceeds the budget.
    """
    grant = {name: 0 for name in available}
    waiting = sorted((n, name) for name, n in available.items() if n > 0)
    left = budget
    for i, (n, name) in enumerate(waiting):
        fair = max(1, left // (len(waiting) - i))
        grant[name] = min(n, fair, left)
        left -= grant[name]
        if left <= 0:
            break
    return grant


class SejStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Micro-batches of new messages, per journal, under a limit of rows per trigger."""

    def __init__(self, options: Options) -> None:
        self.paths = paths_option(options, "spark.readStream.format('sej').load(path)")
        self.path = ", ".join(self.paths)  # for messages
        self.include_root = bool_option(options, "includeroot", False)
        name = options.get("queryname")
        self.reader_name = None if name is None else check_reader_name(f"spark-{name}")
        self.starting = position_or_offsets_option(options, "startingoffsets", "earliest")
        # Times win over startingOffsets (as in the Kafka source): ours (ISO 8601, relative, ns) or Kafka's (ms).
        start_times = [t for t in (time_option(options, "starttime"), millis_option(options, "startingtimestamp"))
                       if t is not None]  # fmt: skip
        self.start_time = max(start_times) if start_times else None
        self.start_times = millis_by_journal_option(options, "startingoffsetsbytimestamp")
        self.max_rows = int_option(options, "maxrecordspertrigger", 0)
        self.fail_on_data_loss = bool_option(options, "failondataloss", True)
        self.types = types_option(options)
        self.verify = verify_option(options)
        self.max_bytes, self.open_cost, self.min_partitions = packing_options(options)
        self.target: Offsets | None = None  # the end fixed by prepareForTriggerAvailableNow
        self.committed: Offsets = {}  # reader offsets this process stored (or found stored)

    def _sources(self) -> dict[str, JournalSource]:
        return {s.name: s for s in find_sources(self.paths, include_root=self.include_root)}

    def initialOffset(self) -> Offsets:
        out: Offsets = {}
        for name, src in self._sources().items():
            t = self.start_times.get(name, self.start_time)
            if t is not None:
                out[name] = offset_at_time(src.path, t)
                continue
            at = self.starting.get(name, -2) if isinstance(self.starting, dict) else self.starting
            if at in (-1, "latest"):
                out[name] = next_offset(src.path)
            elif at in (-2, "earliest"):
                out[name] = first_offset(src.path)
            else:
                out[name] = int(at)
        return out

    def _available(self, sources: dict[str, JournalSource] | None = None) -> Offsets:
        """Each journal's next offset now."""
        return {name: next_offset(src.path) for name, src in (sources or self._sources()).items()}

    def prepareForTriggerAvailableNow(self) -> None:
        self.target = self._available()

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadMaxRows(self.max_rows) if self.max_rows else ReadAllAvailable()

    def reportLatestOffset(self) -> Offsets:
        return self._available()

    def latestOffset(self, start: Offsets, limit: ReadLimit) -> Offsets:
        sources = self._sources()
        # Spark runs one micro-batch at a time, and asks for the next one's end only after the last
        # one's sink write finished and went into the checkpoint's commit log (a batch that failed is
        # run again from the offset log, without asking), so `start` is done: store it.
        self._store(start, sources)
        now = self.target if self.target is not None else self._available(sources)
        end: Offsets = {}
        want: dict[str, int] = {}
        for name, at in start.items():
            if name not in sources:
                self._lost(f"journal {name} under {self.path} is gone (the query had read up to offset {at})")
                continue
            avail = now.get(name, at)
            if avail < at:
                self._lost(f"journal {name} under {self.path} ends at offset {avail}, before the query's offset {at}")
                avail = at
            end[name] = at
            want[name] = avail - at
        for name in sorted(now.keys() - start.keys()):
            if name in sources:
                end[name] = first_offset(sources[name].path)  # enters now; read from the next batch
        if isinstance(limit, ReadMinRows) and sum(want.values()) < limit.min_rows and self.target is None:
            return dict(start)
        grant = share_rows(want, limit.max_rows) if isinstance(limit, ReadMaxRows) else want
        for name, n in grant.items():
            end[name] += n
        return end

    def partitions(self, start: Offsets, end: Offsets) -> Sequence[InputPartition]:
        sources = self._sources()
        parts: list[SegmentPart] = []
        for name in sorted(end):
            lo, hi = start.get(name, end[name]), end[name]
            if lo >= hi:
                continue
            src = sources.get(name)
            if src is None:
                self._lost(f"journal {name} under {self.path} is gone before offsets {lo} to {hi - 1} were read")
                continue
            segments = list_segments(src.path)
            first = segments[0].first_offset if segments else next_offset(src.path)
            if lo < first:
                self._lost(
                    f"{src.path}: offsets {lo} to {min(first, hi) - 1} were deleted (by retention?)"
                    " before they were read"
                )
                lo = first
            parts.extend(
                plan_range(
                    src,
                    lo,
                    hi,
                    types=self.types,
                    max_bytes=self.max_bytes,
                    segments=segments,
                    missing_ok=not self.fail_on_data_loss,
                    verify=self.verify,
                )  # fmt: skip
            )
        return pack(parts, self.max_bytes, self.open_cost, self.min_partitions)

    def _lost(self, what: str) -> None:
        if self.fail_on_data_loss:
            raise DataLossError(f"{what}; set failOnDataLoss to false to skip it with a warning")
        warnings.warn(f"sej: {what}; skipped (failOnDataLoss is false)", CorruptionWarning, stacklevel=3)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return read_partition(partition)

    def commit(self, end: Offsets) -> None:
        """Store each journal's end as `ofs/spark-<queryName>.ofs` (no-op without a queryName)."""
        self._store(end, self._sources())

    def _store(self, done: Offsets, sources: dict[str, JournalSource]) -> None:
        """Store `done` as the reader offsets, writing only those that changed."""
        if self.reader_name is None:
            return
        for name, offset in done.items():
            src = sources.get(name)
            if src is None or self.committed.get(name) == offset:
                continue
            path = reader_offset_path(src.path, self.reader_name)
            if read_offset_file(path) != offset:
                os.makedirs(offset_dir(src.path), exist_ok=True)
                write_offset_file(path, offset)
            self.committed[name] = offset


__all__ = ["SejStreamReader", "share_rows"]
