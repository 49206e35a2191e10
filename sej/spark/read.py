"""Decoding one partition's byte range of a segment into Arrow record batches.

The decoding is the core's (`sej.columns`: the chunked reader `read_columns` and `decode_columns`, which
checks what decode_batch checks: each frame carries the next offset, sizes that are not negative and a
matching trailing size field, and is whole); here the rows of the partition's offsets and types become
record batches of the source's schema.
"""

from __future__ import annotations

import contextlib
import gc
import os
import warnings
from collections.abc import Iterator

import pyarrow as pa
import pyarrow.compute as pc

from ..checksum import ReadCheck
from ..columns import (
    READ_CHUNK,
    Columns,
    decode_columns,
    decode_pieces,
    micros,
    read_columns,
    record_batch,
    record_batch_of_pieces,
)
from ..errors import CorruptionError, CorruptionWarning, DataLossError, SejError
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
    """The readers' `read`: read_part of a SegmentPart or of each part of a PackedPart (small ones read
    together: read_packed); nothing for anything else (Spark reads one InputPartition(None) when a plan has
    no partitions)."""
    _settle_worker()
    if isinstance(partition, PackedPart):
        return read_packed(partition.parts)
    if not isinstance(partition, SegmentPart):
        return iter(())
    return read_part(partition)


_settled = False


def _settle_worker() -> None:
    """In a Spark Python worker that is reused (SPARK_REUSE_WORKER, Spark's default), freeze the objects alive at
    its first read: pyspark's daemon runs a full gc.collect() after every task, and with pyarrow and pyspark.sql
    imported that walked some 50,000 objects, 20-50 ms a task here (issue 40: 14 tasks of a query over 1,000 small
    journals). Frozen objects (modules, classes, the worker's own state) are left out of every later collection;
    nothing a task makes is frozen, since this runs before the first one reads. Only in Spark's workers: a user's
    process keeps its collector as it is. (Spark gives a worker PYTHON_WORKER_FACTORY_SECRET over TCP and
    PYTHON_UNIX_DOMAIN_ENABLED over a Unix socket.)"""
    global _settled
    if not _settled:
        _settled = True
        env = os.environ
        spark_worker = env.get("PYTHON_WORKER_FACTORY_SECRET") or env.get("PYTHON_UNIX_DOMAIN_ENABLED", "") == "true"
        if env.get("SPARK_REUSE_WORKER") == "1" and spark_worker:
            gc.freeze()


GROUP_BYTES = READ_CHUNK
"""Small parts are read together up to about this many bytes, into one buffer decoded in one pass (decode_pieces)."""


def read_packed(parts: tuple[SegmentPart, ...]) -> Iterator[pa.RecordBatch]:
    """The rows of `parts`, in order, as read_part gives them. Parts of at most GROUP_BYTES // 2 bytes that start
    at a wanted row are read one after the other into one buffer, GROUP_BYTES at a time, and decoded at once
    (decode_pieces, _decode_group); a part that cannot be read whole or fails its check, or that does not decode
    as whole, valid frames, is read by read_part, which names what is wrong."""
    buf = bytearray(GROUP_BYTES)  # reused: no column refers to it (decode_pieces copies what it takes)
    group: list[SegmentPart] = []
    starts = [0]  # where each part of the group lies in buf, then where the group ends
    for p in parts:
        n = p.end - p.start
        small = 0 <= n <= GROUP_BYTES // 2 and p.lo <= p.first
        if group and (not small or starts[-1] + n > GROUP_BYTES or p.types != group[0].types
                      or (p.root is None) != (group[0].root is None)):  # fmt: skip
            yield from _decode_group(group, buf, starts, 0, len(group))
            group, starts = [], [0]
        if small and _read_small(p, buf, starts[-1]):
            group.append(p)
            starts.append(starts[-1] + n)
        else:
            yield from _decode_group(group, buf, starts, 0, len(group))
            group, starts = [], [0]
            yield from read_part(p)
    yield from _decode_group(group, buf, starts, 0, len(group))


def _read_small(p: SegmentPart, buf: bytearray, at: int) -> bool:
    """Read the part's bytes into buf[at:], checked against its segment's checksums as read_part checks them;
    False when they cannot be read whole or fail the check (read_part then reads the part and raises or warns as
    it should)."""
    n = p.end - p.start
    try:
        with open_file(p.path) as f, memoryview(buf)[at : at + n] as view:
            if os.preadv(f.fileno(), [view], p.start) != n:
                return False
            if p.sums:
                with ReadCheck(p.path, p.sums, p.segment_first) as check:
                    if check.sums is not None:
                        check.check(f.fileno(), p.end, p.start, p.end, view)
    except (OSError, SejError, ValueError, OverflowError):
        return False
    return True


def _decode_group(
    group: list[SegmentPart], buf: bytearray, starts: list[int], i: int, j: int
) -> Iterator[pa.RecordBatch]:
    """The rows of parts group[i:j], whose bytes lie end to end in buf from starts[i] (of the same types and
    root-ness): one record batch when they all decode whole and reach their `upto`, rows past a part's `hi` left
    out; else each half again, down to read_part of a single part."""
    if i >= j:
        return
    parts = group[i:j]
    decoded = decode_pieces(buf, starts[i + 1 : j + 1], [p.first for p in parts], starts[i])
    if decoded is not None and all(p.first + k >= p.upto for p, k in zip(parts, decoded[1], strict=True)):
        cols, counts = decoded
        batch = record_batch_of_pieces(cols, counts, [(p.client, p.shard, p.root) for p in parts],
                                       root=parts[0].root is not None)  # fmt: skip
        keep = [min(k, p.hi - p.first) for p, k in zip(parts, counts, strict=True)]
        batches = [batch]
        if keep != counts:  # a part's frames go on past its hi, where read_part stops: the rows before, in slices
            batches, at = [], 0
            for k, want in zip(counts, keep, strict=True):
                if want > 0:
                    batches.append(batch.slice(at, want))
                at += k
        for b in batches:
            b = _of_types(b, parts[0].types)
            if b.num_rows:
                yield b
        return
    if j - i == 1:
        yield from read_part(group[i])
        return
    mid = (i + j) // 2
    yield from _decode_group(group, buf, starts, i, mid)
    yield from _decode_group(group, buf, starts, mid, j)


def _batch(p: SegmentPart, cols: Columns, lo: int, hi: int) -> pa.RecordBatch:
    """Rows [lo, hi) of `cols` of the partition's wanted types, as a record batch of ARROW_SCHEMA (with root)."""
    if lo > 0 or hi < len(cols.offset):
        cols = Columns(*(a.slice(lo, hi - lo) for a in cols))
    return _of_types(record_batch(cols, p.client, p.shard, p.root), p.types)


def _of_types(batch: pa.RecordBatch, types: tuple[int, ...] | None) -> pa.RecordBatch:
    """The rows of `batch` whose type is one of `types` (None: every row)."""
    if types is None:
        return batch
    return batch.filter(pc.is_in(batch.column("type"), value_set=pa.array(types, _TYPE)))


__all__ = ["Columns", "decode_columns", "micros", "read_part", "read_partition"]  # decoding: sej.columns
