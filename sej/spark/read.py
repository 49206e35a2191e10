"""Decoding one partition's byte range of a segment into Arrow record batches.

Frames become columns without a Python object per message where the layout allows it:
a run of frames with the same key and value sizes sits at a fixed stride, so its fields
are cut out and checked for the whole run at once by Arrow kernels and byte-string
comparisons. Other frames are decoded one by one. Both paths check what decode_batch
checks: each frame carries the next offset, sizes that are not negative and a matching
trailing size field, and is whole.
"""

from __future__ import annotations

import array
import contextlib
import os
import warnings
from collections.abc import Iterator
from typing import NamedTuple

import pyarrow as pa
import pyarrow.compute as pc

from ..checksum import ReadCheck
from ..errors import CorruptionError, CorruptionWarning, DataLossError
from ..frames import (
    HEADER_SIZE,
    I32,
    NO_TIMESTAMP,
    OVERHEAD,
    SIZE_FIELD,
    Problem,
    check_frame,
    frame_at,
    frame_total,
)
from ..fsutil import open_file
from ..segment import MAX_READ
from .plan import PackedPart, SegmentPart
from .schema import ARROW_SCHEMA, ARROW_SCHEMA_WITH_ROOT

READ_CHUNK = 8 << 20
"""Bytes read by one pread; each chunk's frames become one record batch."""

MIN_RUN = 16
"""A stride check starts only where this many frames fit and look alike (_looks_like_run)."""

FIRST_PROBE = 64
"""Frames checked by the first stride check of a run; each fully valid one checks 8x more next."""

MAX_PROBE = 1 << 20
"""The most frames one stride check covers."""

KEY_SIZE_AT = HEADER_SIZE - 1  # the key_size byte
VALUE_AT = HEADER_SIZE + SIZE_FIELD  # the value, after a key of size 0
_I64_MAX = 2**63 - 1
_I64 = pa.int64()
# The column types of the batches, from the schema:
_BIN = ARROW_SCHEMA.field("key").type
_STRING = ARROW_SCHEMA.field("shard").type
_TYPE = ARROW_SCHEMA.field("type").type
_TIMESTAMP = ARROW_SCHEMA.field("timestamp").type


class Columns(NamedTuple):
    """Decoded frames as Arrow arrays; `timestamp` is the frame's int64 ns (NO_TIMESTAMP kept)."""

    offset: pa.Array
    timestamp: pa.Array
    type: pa.Array
    key: pa.Array
    value: pa.Array


def decode_columns(
    data: bytes | bytearray, pos: int, end: int, expect: int, probe: int = FIRST_PROBE
) -> tuple[Columns | None, int, Problem | None, int]:
    """Decode the whole frames of data[pos:end], carrying offsets `expect`, `expect + 1`, ..., into columns.

    Returns the columns (None when no frame decoded), the position after the last frame and
    the Problem that stopped decoding (None when it stopped at `end`), as decode_batch does,
    and the `probe` to decode the next buffer with: how many frames the first stride check
    covers (above FIRST_PROBE, after a long run, the buffer's first frame starts one).
    """
    buf = pa.py_buffer(data)
    pieces: list[Columns] = []
    offs: list[int] = []
    tss: list[int] = []
    typs: list[int] = []
    keys: list[bytes | bytearray] = []
    vals: list[bytes | bytearray] = []
    last_sizes = -1
    while True:
        f = frame_at(data, pos, end, expect)
        if f is None:
            break
        off, ts, typ, ks, vs = f
        vpos = pos + HEADER_SIZE + ks
        nxt = vpos + 8 + vs
        sizes = ks << 32 | vs
        if sizes == last_sizes or probe > FIRST_PROBE:
            # The frame at pos is valid, with the sizes of the one before or after a long run: check a stretch
            # at its stride.
            total = nxt - pos
            m = min((end - pos) // total, probe)
            if m >= MIN_RUN and expect + m <= _I64_MAX and _looks_like_run(data, pos, total, ks):
                if offs:
                    pieces.append(_listed(offs, tss, typs, keys, vals))
                k, cols = _run(data, buf, pos, m, ks, vs, expect)
                pieces.append(cols)
                pos += k * total
                expect += k
                probe = min(probe * 8, MAX_PROBE) if k == m else FIRST_PROBE
                continue
            probe = FIRST_PROBE
        offs.append(off)
        tss.append(ts)
        typs.append(typ)
        keys.append(data[pos + HEADER_SIZE : vpos])
        vals.append(data[vpos + 4 : nxt - 4])
        pos = nxt
        expect += 1
        last_sizes = sizes
    if offs:
        pieces.append(_listed(offs, tss, typs, keys, vals))
    problem = None if pos == end else check_frame(data, pos, end, expect)
    assert not isinstance(problem, int), "decode_columns stopped at a valid frame"
    if not pieces:
        return None, pos, problem, probe
    if len(pieces) == 1:
        return pieces[0], pos, problem, probe
    return Columns(*(pa.concat_arrays([c[i] for c in pieces]) for i in range(5))), pos, problem, probe


def _listed(
    offs: list[int], tss: list[int], typs: list[int], keys: list[bytes | bytearray], vals: list[bytes | bytearray]
) -> Columns:
    """Columns of frames decoded one by one (the lists are emptied)."""
    cols = Columns(
        pa.array(offs, _I64),
        pa.array(tss, _I64),
        pa.array(typs, _TYPE),
        pa.array(keys, _BIN),
        pa.array(vals, _BIN),
    )
    for v in (offs, tss, typs, keys, vals):
        v.clear()
    return cols


def _looks_like_run(data: bytes | bytearray, pos: int, total: int, ks: int) -> bool:
    """Whether the MIN_RUN frames at stride `total` from `pos` agree on the key size and on the low bytes of
    the value size and size fields: a cheap filter before _run checks a stretch fully."""
    stop = pos + MIN_RUN * total
    vs_low, size_low = pos + VALUE_AT - 1 + ks, pos + total - 1
    return (
        data[pos + KEY_SIZE_AT : stop : total] == bytes((ks,)) * MIN_RUN
        and data[vs_low:stop:total] == data[vs_low : vs_low + 1] * MIN_RUN
        and data[size_low:stop:total] == data[size_low : size_low + 1] * MIN_RUN
    )


def _run(
    data: bytes | bytearray, buf: pa.Buffer, pos: int, m: int, ks: int, vs: int, expect: int
) -> tuple[int, Columns]:
    """How many of the m frames at stride OVERHEAD + ks + vs from `pos` are valid (the first is), and their columns."""
    total = OVERHEAD + ks + vs
    stop = pos + m * total
    frames = pa.Array.from_buffers(pa.binary(total), m, [None, buf.slice(pos, m * total)])
    k = m
    key_sizes = data[pos + KEY_SIZE_AT : stop : total]
    one = bytes((ks,))
    if key_sizes != one * m:
        k = min(k, m - len(key_sizes.lstrip(one)))
    for start, want in ((HEADER_SIZE + ks, vs), (total - SIZE_FIELD, total)):
        field = _field(frames, start, 4)
        pattern = I32.pack(want) * m
        if field != pattern:
            k = min(k, _common_prefix(field, pattern) // 4)
    offsets = _be64(frames, 0)
    expected = pc.add(_arange(m), pa.scalar(expect, _I64))
    if not offsets.equals(expected):
        k = min(k, pc.index(pc.equal(offsets, expected), False).as_py())
    assert k >= 1, "the first frame of a run was checked already"
    if k < m:
        frames, offsets = frames.slice(0, k), offsets.slice(0, k)
    types = pa.Array.from_buffers(pa.uint8(), k, [None, pa.py_buffer(data[pos + 16 : pos + k * total : total])])
    return k, Columns(
        offsets,
        _be64(frames, 8),
        types.cast(_TYPE),
        pc.binary_slice(frames, HEADER_SIZE, HEADER_SIZE + ks).cast(_BIN),
        pc.binary_slice(frames, VALUE_AT + ks, VALUE_AT + ks + vs).cast(_BIN),
    )


def _field(frames: pa.Array, start: int, width: int) -> bytes:
    """The bytes [start, start + width) of every frame, back to back."""
    cut = pc.binary_slice(frames, start, start + width)
    return cut.buffers()[1].slice(cut.offset * width, len(cut) * width).to_pybytes()  # type: ignore[no-any-return]


def _be64(frames: pa.Array, start: int) -> pa.Array:
    """The big-endian 64-bit integers at `start` of every frame, as an int64 array."""
    a = array.array("q", _field(frames, start, 8))
    a.byteswap()
    return pa.Array.from_buffers(_I64, len(a), [None, pa.py_buffer(a)])


def _common_prefix(a: bytes, b: bytes) -> int:
    """The length of the common prefix of two byte strings of equal length."""
    lo, hi = 0, len(a)  # a[:lo] == b[:lo]; a[:hi + 1] != b[:hi + 1] unless hi == len(a)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[lo:mid] == b[lo:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


_ARANGE: list[pa.Array] = [pa.array([], _I64)]


def _arange(n: int) -> pa.Array:
    """The int64 array 0, 1, ..., n - 1 (a slice of a cached one)."""
    if len(_ARANGE[0]) < n:
        size = max(n, 2 * len(_ARANGE[0]))
        _ARANGE[0] = pc.subtract(pc.cumulative_sum(pa.repeat(pa.scalar(1, _I64), size)), pa.scalar(1, _I64))
    return _ARANGE[0].slice(0, n)


def micros(ns: pa.Array) -> pa.Array:
    """Frame timestamps (int64 ns) as UTC microseconds, rounded down; NO_TIMESTAMP becomes null."""
    sentinel = pc.equal(ns, pa.scalar(NO_TIMESTAMP, _I64))
    us = pc.divide(ns, pa.scalar(1000, _I64))  # truncates toward zero
    low = pc.min(ns).as_py()
    if low is not None and low < 0:  # round down: subtract 1 where a negative value had a remainder
        rest = pc.subtract(ns, pc.multiply(us, pa.scalar(1000, _I64)))
        us = pc.subtract(us, pc.less(rest, pa.scalar(0, _I64)).cast(_I64))
    if pc.any(sentinel).as_py():
        us = pc.if_else(sentinel, pa.scalar(None, _I64), us)
    return us.cast(_TIMESTAMP)


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
        fd = f.fileno()
        if check is not None and check.sums is None:
            check = None  # an old or Go-written segment: read unchecked
        base, expect, want, probe = p.start, p.first, READ_CHUNK, FIRST_PROBE
        data = bytearray(min(READ_CHUNK, p.end - p.start))  # reused: no output array refers to it
        while base < p.end and expect < p.hi:
            size = min(want, p.end - base)
            if len(data) < size:
                data = bytearray(size)
            got = _preadv_full(fd, memoryview(data)[:size], base)
            if not got:
                break
            if check is not None:
                # Bytes past the last checksum record (a writer's crash gap not sealed yet) are read unchecked.
                with memoryview(data)[:got] as view:
                    check.check(fd, p.end, base, base + got, view)
            cols, used, problem, probe = decode_columns(data, 0, got, expect, probe)
            if cols is not None:
                n = len(cols.offset)
                lo, hi = max(0, p.lo - expect), min(n, p.hi - expect)
                if lo < hi:
                    batch = _batch(p, cols, lo, hi)
                    if batch.num_rows:
                        yield batch
                expect += n
            base += used
            want = READ_CHUNK
            if problem is not None:
                if not problem.incomplete:
                    raise CorruptionError(p.path, base, problem.reason)
                if used == 0:
                    if base + got >= p.end:
                        break  # an unfinished last message: not there yet
                    head = bytes(data[: min(got, 256)])  # the frame's header
                    want = max(READ_CHUNK, frame_total(head, 0, len(head)) or 2 * got)
        if expect < p.upto:  # e.g. a size field grown past the range: not an unfinished message here
            raise CorruptionError(p.path, base, f"the frames end at offset {expect}, before offset {p.upto}")


def read_partition(partition: object) -> Iterator[pa.RecordBatch]:
    """The readers' `read`: read_part of a SegmentPart or of each part of a PackedPart; nothing for
    anything else (Spark reads one InputPartition(None) when a plan has no partitions)."""
    if isinstance(partition, PackedPart):
        return (batch for part in partition.parts for batch in read_part(part))
    if not isinstance(partition, SegmentPart):
        return iter(())
    return read_part(partition)


def _preadv_full(fd: int, view: memoryview, pos: int) -> int:
    """Fill `view` from the file at `pos` (one preadv returns at most MAX_READ bytes); bytes read."""
    got = 0
    while got < len(view):
        n = os.preadv(fd, [view[got : got + MAX_READ]], pos + got)
        if not n:
            break
        got += n
    return got


def _batch(p: SegmentPart, cols: Columns, lo: int, hi: int) -> pa.RecordBatch:
    """Rows [lo, hi) of `cols` of the partition's wanted types, as a record batch of ARROW_SCHEMA (with root)."""
    arrays = list(cols)
    if lo > 0 or hi < len(cols.offset):
        arrays = [a.slice(lo, hi - lo) for a in arrays]
    if p.types is not None:
        keep = pc.is_in(arrays[2], value_set=pa.array(p.types, _TYPE))
        arrays = [pc.filter(a, keep) for a in arrays]
    n = len(arrays[0])
    client = pa.nulls(n, _STRING) if p.client is None else pa.repeat(pa.scalar(p.client, _STRING), n)
    shard = pa.repeat(pa.scalar(p.shard, _STRING), n)
    offset, ns, typ, key, value = arrays
    columns = [client, shard, offset, micros(ns), typ, key, value]
    if p.root is None:
        return pa.RecordBatch.from_arrays(columns, schema=ARROW_SCHEMA)
    root = pa.repeat(pa.scalar(p.root, _STRING), n)
    return pa.RecordBatch.from_arrays([*columns, root], schema=ARROW_SCHEMA_WITH_ROOT)


__all__ = ["Columns", "decode_columns", "micros", "read_part", "read_partition"]
