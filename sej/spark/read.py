"""Decoding one partition's byte range of a segment into Arrow record batches.

The decoding is the core's (`sej.columns`: the chunked reader `read_columns` and `decode_columns`, which
checks what decode_batch checks: each frame carries the next offset, sizes that are not negative and a
matching trailing size field, and is whole); here the rows of the partition's offsets and types become
record batches of the source's schema.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator

import pyarrow as pa
import pyarrow.compute as pc

from ..checksum import ReadCheck
from ..columns import Columns, decode_columns, micros, read_columns, record_batch
from ..errors import CorruptionError, CorruptionWarning, DataLossError
from ..fsutil import open_file
from .plan import PackedPart, SegmentPart
from .schema import ARROW_SCHEMA

_TYPE = ARROW_SCHEMA.field("type").type


def read_part(p: SegmentPart) -> Iterator[pa.RecordBatch]:
    """Decode the frames of a partition into Arrow batches of the schema's columns (one per chunk read)."""
    try:
        f = open_file(p.path)
    except FileNotFoundError:
        if p.missing_ok:
            warnings.warn(f"sej: {p.path} was deleted before it was read; skipping it", CorruptionWarning, stacklevel=2)
            return
        raise DataLossError(f"{p.path} was deleted before it was read (offsets {p.first} on)") from None
    with f, ReadCheck(p.path, p.sums, p.segment_first) if p.sums else contextlib.nullcontext() as check:
        if check is not None and check.sums is None:
            check = None  # an old or Go-written segment: read unchecked
        expect = p.first
        chunks = read_columns(f.fileno(), p.path, p.start, p.end, p.first, check)
        with contextlib.closing(chunks):
            for cols in chunks:
                n = len(cols.offset)
                lo, hi = max(0, p.lo - expect), min(n, p.hi - expect)
                if lo < hi:
                    batch = _batch(p, cols, lo, hi)
                    if batch.num_rows:
                        yield batch
                expect += n
                if expect >= p.hi:
                    break
        if expect < p.upto:  # e.g. a size field grown past the range: not an unfinished message here
            raise CorruptionError(p.path, p.end, f"the frames end at offset {expect}, before offset {p.upto}")


def read_partition(partition: object) -> Iterator[pa.RecordBatch]:
    """The readers' `read`: read_part of a SegmentPart or of each part of a PackedPart; nothing for
    anything else (Spark reads one InputPartition(None) when a plan has no partitions)."""
    if isinstance(partition, PackedPart):
        return (batch for part in partition.parts for batch in read_part(part))
    if not isinstance(partition, SegmentPart):
        return iter(())
    return read_part(partition)


def _batch(p: SegmentPart, cols: Columns, lo: int, hi: int) -> pa.RecordBatch:
    """Rows [lo, hi) of `cols` of the partition's wanted types, as a record batch of ARROW_SCHEMA (with root)."""
    if lo > 0 or hi < len(cols.offset):
        cols = Columns(*(a.slice(lo, hi - lo) for a in cols))
    if p.types is not None:
        keep = pc.is_in(cols.type, value_set=pa.array(p.types, _TYPE))
        cols = Columns(*(pc.filter(a, keep) for a in cols))
    return record_batch(cols, p.client, p.shard, p.root)


__all__ = ["Columns", "decode_columns", "micros", "read_part", "read_partition"]  # decoding: sej.columns
