"""Journals as Arrow columns: the frame layout decoded a chunk at a time into arrays (pyarrow, the `spark` extra).

The one Python loop per frame (`decode_columns`) only follows the chain of frame sizes (the key size
byte and the value size field of each frame); every field is then cut out of the chunk for all its
frames at once (Arrow `take` over the ranges), and every check `frames.frame_at` makes is made on the
whole columns: offsets that follow on, key sizes that are not negative, a trailing size equal to the
frame's length (a negative value size reads as a size past the chunk, which ends the chain). The first
frame that fails ends the batch there; `frames.check_frame` names the problem, as the message decoder's.

`read_columns` reads one segment's byte range in chunks (checked against the segment's checksums first,
as the Scanner's verify), grows a chunk for a frame bigger than one and turns a problem into a
CorruptionError; the Spark source's partitions and `sej.read_table` read through it.

pyarrow is imported with this module, which nothing else in the core imports: `import sej` and every
other reader stay without it.
"""

from __future__ import annotations

import array
import contextlib
import functools
import os
import re
import struct
from collections.abc import Iterator
from typing import NamedTuple

from .errors import CorruptionError, InvalidArgumentError, MissingExtraError, OffsetOutOfRangeError
from .frames import (
    HEADER_SIZE,
    MAX_OFFSET,
    OVERHEAD,
    SIZE_FIELD,
    Problem,
    check_frame,
    common_prefix,
    frame_at,
)

try:
    import pyarrow as pa
    import pyarrow.compute as pc
except ImportError as e:  # pragma: no cover - the spark extra is installed in CI
    raise MissingExtraError(
        f"{e.name or 'pyarrow'} is missing: reading journals as Arrow tables needs pyarrow, which comes with "
        "sej's 'spark' extra (python3 -m pip install './sej[spark]' from a checkout ./sej, or a wheel's [spark])"
    ) from None

from .checksum import ReadCheck  # noqa: E402
from .chunks import FrameChunks, pread_full  # noqa: E402
from .fsutil import open_file  # noqa: E402
from .journal import check_journal, next_offset, offset_position  # noqa: E402
from .layout import journal_path, list_segments, sum_path  # noqa: E402

READ_CHUNK = 2 << 20
"""Bytes read by one pread; each chunk's frames become one batch of columns. Small enough that the chunk is still
in the CPU's cache when its chain of sizes is followed and its fields cut out, which costs more per frame than the
Arrow calls of one more chunk: with 8 MiB chunks a varied-size journal decoded about 20% slower (issue 40)."""

MAX_READ = 0x7FFFF000
"""The most Linux returns from one read (the positions of a chunk fit in int32)."""

# The columns, once: the Spark source's schema takes its Arrow types from here.
COLUMN_TYPES: tuple[tuple[str, pa.DataType, bool], ...] = (
    ("client", pa.string(), True),
    ("shard", pa.string(), False),
    ("offset", pa.int64(), False),
    ("timestamp", pa.timestamp("us", tz="UTC"), True),
    ("type", pa.int32(), False),
    ("key", pa.binary(), False),
    ("value", pa.binary(), False),
)
"""(name, Arrow type, nullable) of each column: client (null outside a hub root), shard ("" for a lone
journal), offset, timestamp (microseconds, UTC; null for "no timestamp"), type, key, value."""

ROOT_TYPE: tuple[str, pa.DataType, bool] = ("root", pa.string(), False)
"""The extra last column of a read that names the root each journal was found under."""

ARROW_SCHEMA = pa.schema([pa.field(n, t, nullable) for n, t, nullable in COLUMN_TYPES])
"""The schema of the record batches and tables read from journals."""

ARROW_SCHEMA_WITH_ROOT = ARROW_SCHEMA.append(pa.field(*ROOT_TYPE))

_TIMESTAMP = ARROW_SCHEMA.field("timestamp").type

_I64 = pa.int64()
_I32 = pa.int32()
_U64 = pa.uint64()
_U8 = pa.uint8()
_NEGATIVE = re.compile(rb"[\x80-\xff]")
_KEY_SIZE_AT = HEADER_SIZE - 1
_HEADER_SIZE, _KEY_SIZE, _SIZE_FIELD = (pa.scalar(v, _I32) for v in (HEADER_SIZE, _KEY_SIZE_AT, SIZE_FIELD))
_NO_TIMESTAMP = -(2**63)


class Columns(NamedTuple):
    """Decoded frames as Arrow arrays; `timestamp` is the frame's int64 ns (NO_TIMESTAMP kept)."""

    offset: pa.Array
    timestamp: pa.Array
    type: pa.Array
    key: pa.Array
    value: pa.Array


def decode_columns(
    data: bytes | bytearray, pos: int, end: int, expect: int
) -> tuple[Columns | None, int, Problem | None]:
    """Decode the whole frames of data[pos:end], carrying offsets `expect`, `expect + 1`, ..., into columns.

    Returns the columns (None when no frame decoded), the position after the last frame and the
    Problem that stopped decoding (None when it stopped at `end`), as frames.decode_batch does.
    """
    if end > MAX_READ:
        raise ValueError(f"a chunk of {end} bytes is more than one read ({MAX_READ})")
    pieces: list[Columns] = []
    run = _stride_run(data, pos, end, expect)
    if run is not None:  # frames of the same sizes at the chunk's start: checked and cut at their stride
        k, total, cols = run
        pieces.append(cols)
        pos += k * total
        expect += k
    links = _chain(data, pos, end)
    n = len(links) - 1
    if n:
        cols, n = _columns(data, end, links, n, expect)
        if cols is not None:
            pieces.append(cols)
    stop = links[n] - _KEY_SIZE_AT
    joined = _joined(pieces)
    if stop == end:
        return joined, stop, None
    problem = check_frame(data, stop, end, expect + n)
    assert not isinstance(problem, int), "decode_columns stopped at a valid frame"
    return joined, stop, problem


def _chain(data: bytes | bytearray, pos: int, end: int) -> list[int]:
    """The frames of data[pos:end] that a chain of sizes reaches, each as the position of its key size byte
    (its start + _KEY_SIZE_AT), then the same for where the last whole one ends.

    The one Python step per frame: the key size byte and the value size field (unsigned: a negative size reads
    as one past the chunk, which ends the chain); the frames are checked afterwards, on whole columns. Chaining
    the key size bytes rather than the starts saves an add a frame.
    """
    q = pos + _KEY_SIZE_AT
    chain = [q]
    append = chain.append
    value_size, overhead = _VALUE_SIZE_AFTER_KEY_SIZE, _OVERHEAD_WITH_KEY
    view = data if len(data) == end else memoryview(data)[:end]
    try:  # an unsigned value size always moves on by at least OVERHEAD bytes; reads past `end` raise
        while True:
            ks = view[q]
            q += overhead[ks] + value_size[ks](view, q)[0]
            append(q)
    except (IndexError, struct.error):
        pass  # a header cut by the buffer's end
    finally:
        if view is not data:
            view.release()
    if chain[-1] - _KEY_SIZE_AT > end:  # the last frame goes past the end (only the last: each before it was read)
        chain.pop()
    return chain


def decode_pieces(
    data: bytes | bytearray, ends: list[int], expects: list[int], start: int = 0
) -> tuple[Columns, list[int]] | None:
    """Decode several pieces laid end to end in `data` from `start` (piece i is data[ends[i - 1]:ends[i]], the first
    from `start`: whole frames of a segment carrying offsets from expects[i]) into one set of columns, with one pass
    of the Arrow kernels.

    Returns the columns and each piece's frame count when every piece is whole frames that pass every check
    decode_columns makes, with offsets that fit a signed long; None otherwise: decode each piece on its own then
    (decode_columns stops where a piece goes wrong and names the problem). For many small segments the fixed cost
    of a chunk's Arrow calls, not the frames, is what reading them costs (issue 40: a hub root of 1,000 journals).
    """
    end = ends[-1] if ends else start
    if end > MAX_READ or len(ends) != len(expects) or not 0 <= start < end:
        return None
    links = [start + _KEY_SIZE_AT]
    counts: list[int] = []
    pos = start
    for stop, expect in zip(ends, expects, strict=True):
        if stop < pos:
            return None
        chain = _chain(data, pos, stop)
        k = len(chain) - 1
        if chain[-1] - _KEY_SIZE_AT != stop or expect < 0 or (k and expect + k - 1 > _I64_MAX):
            return None  # a piece not whole frames, or offsets no long holds
        links += chain[1:]  # its first link is the one the piece before ended on
        counts.append(k)
        pos = stop
    n = len(links) - 1
    if n == 0:
        return None
    cols, k = _columns(data, end, links, n, expects[0], _Runs(counts, expects))
    return None if cols is None else (cols, counts)


class _Runs(NamedTuple):
    """Frame counts of pieces laid end to end, and the offset each piece's first frame carries."""

    counts: list[int]
    expects: list[int]

    def shifts(self, n: int) -> pa.Array:
        """uint64 of length n: for frame j of piece i, expects[i] - (frames before piece i), modulo 2**64, so that
        j plus it is the offset frame j must carry."""
        ends, shifts, at = [], [], 0
        for k, expect in zip(self.counts, self.expects, strict=True):
            if k:
                shifts.append((expect - at) % 2**64)
                at += k
                ends.append(at)
        assert at == n, (at, n)
        return pc.run_end_decode(pa.RunEndEncodedArray.from_arrays(pa.array(ends, _I32), pa.array(shifts, _U64)))


_VALUE_SIZE_AFTER_KEY_SIZE = [struct.Struct(f">{1 + ks}xI").unpack_from for ks in range(256)]
"""For each key size byte, the reader of the (unsigned) value size field of a frame from its key size byte."""
_OVERHEAD_WITH_KEY = [OVERHEAD + ks for ks in range(256)]

_PARTS = 5
"""A frame's five parts, in order: header, key, value size, value, trailing size."""


def _columns(
    data: bytes | bytearray, end: int, links: list[int], n: int, expect: int, runs: _Runs | None = None
) -> tuple[Columns | None, int]:
    """The columns of the first frames of the chain `links` (n frames, by their key size bytes: see _chain) that
    are valid, and how many those are.

    With `runs` (decode_pieces), the frames are several segments' laid end to end, each carrying its own
    offsets; then only all n frames valid will do (otherwise: None, 0), and no offset may pass a signed long.

    Every frame is cut into its five parts at once: one binary array over the chunk whose values are, frame by
    frame, the header, the key, the value size, the value and the trailing size (they follow each other, so
    their bounds are one interleaved array), then each column is one `take` of its part.
    """
    buf = pa.py_buffer(data)
    # int32s in the machine's order, as Arrow's: struct packs a list of ints faster than array.array takes one
    at_key_size = pa.Array.from_buffers(_I32, n + 1, [None, pa.py_buffer(struct.pack(f"{n + 1}i", *links))])
    chain = pc.subtract(at_key_size, _KEY_SIZE)  # the frames' starts, then the end of the last
    first, after = chain.slice(0, n), chain.slice(1, n)
    key_at = pc.add(first, _HEADER_SIZE)
    key_sizes = _take(pa.Array.from_buffers(_U8, end, [None, buf]), at_key_size.slice(0, n))
    size_at = pc.add(key_at, key_sizes)
    bounds = pa.concat_arrays([first, key_at, size_at, pc.add(size_at, _SIZE_FIELD), pc.subtract(after, _SIZE_FIELD),
                               chain.slice(n, 1)])  # fmt: skip
    parts = pa.Array.from_buffers(pa.binary(), _PARTS * n, [None, _take(bounds, _transposed(n)).buffers()[1], buf])
    heads = _fixed(_take(parts, _part(n, 0)), HEADER_SIZE, n)
    # The checks, each one compare of bytes in C (and a binary search for where a failing one fails):
    k = n
    sizes = _bytes(key_sizes, 1)
    if not sizes.isascii():  # a key size byte >= 128: negative
        k = _NEGATIVE.search(sizes).start()  # type: ignore[union-attr]
    lengths = array.array("i", _bytes(pc.subtract(after, first), 4))
    lengths.byteswap()  # the trailing size fields they must hold, big-endian
    trailers = _bytes(_take(parts, _part(n, 4)), 4, data=True)
    if trailers != (want := lengths.tobytes()):
        k = min(k, common_prefix(trailers, want, 4 * n) // 4)
    if runs is not None:
        if k < n:
            return None, 0
        offsets = pc.add(_ramp_u64(_size(n)).slice(0, n), runs.shifts(n))  # what the frames must carry
    else:
        k = min(k, max(0, MAX_OFFSET + 1 - expect))  # no frame carries an offset past MAX_OFFSET
        if k == 0:
            return None, 0
        offsets = pc.add(_ramp_u64(_size(k)).slice(0, k), pa.scalar(expect, _U64))  # what the frames must carry
    stamps = array.array("Q", _bytes(pc.binary_slice(heads, 0, 16), 16))  # each frame's offset, then timestamp
    stamps.byteswap()
    found = stamps[0 : 2 * k : 2].tobytes()
    if found != (want := _bytes(offsets, 8)):
        if runs is not None:
            return None, 0
        k = common_prefix(found, want, 8 * k) // 8
        if k == 0:
            return None, 0
    # Valid frames (offsets are unsigned), but no column of longs can hold them (decode_pieces checked its own).
    if runs is None and expect + k - 1 > _I64_MAX:
        big = max(expect, _I64_MAX + 1)
        raise CorruptionError("", links[big - expect] - _KEY_SIZE_AT, f"offset {big} does not fit a signed "
                              "64-bit integer, the offset column's type (Arrow's int64, Spark's long)")  # fmt: skip
    cols = Columns(
        pa.Array.from_buffers(_I64, k, [None, offsets.buffers()[1]]),  # the same values, all below 2**63
        pa.Array.from_buffers(_I64, n, [None, pa.py_buffer(stamps[1::2])]),  # the same bits, signed
        _byte(heads, HEADER_SIZE - 2),
        _take(parts, _part(n, 1)),
        _take(parts, _part(n, 3)),
    )
    if k < n:
        cols = Columns(cols[0], *(a.slice(0, k) for a in cols[1:]))
    return cols, k


def _take(a: pa.Array, indices: pa.Array) -> pa.Array:
    """pc.take without its bounds check: every index here is one the chain of sizes read at (each frame's key size
    byte is below `end`, its parts lie between its start and the next's) or one of the cached ramps below."""
    return pc.take(a, indices, boundscheck=False)


def _bytes(a: pa.Array, width: int, data: bool = False) -> bytes:
    """The values of a fixed-width array (data: of a binary array of `width`-byte values) as one bytes object."""
    return a.buffers()[2 if data else 1].slice(a.offset * width, len(a) * width).to_pybytes()


def _joined(pieces: list[Columns]) -> Columns | None:
    if len(pieces) < 2:
        return pieces[0] if pieces else None
    return Columns(*(pa.concat_arrays([c[i] for c in pieces]) for i in range(5)))


MIN_RUN = 16
"""A chunk's first frames are checked at their stride (`_stride_run`) when this many fit and look alike."""

_VALUE_AT = HEADER_SIZE + SIZE_FIELD  # the value, after a key of size 0
_I64_MAX = 2**63 - 1


def _stride_run(data: bytes | bytearray, pos: int, end: int, expect: int) -> tuple[int, int, Columns] | None:
    """The frames from `pos` with the sizes of the first, when MIN_RUN of them look alike: (how many are valid,
    their size, their columns); None otherwise. A run sits at a fixed stride, so its fields are cut out and
    checked for all its frames at once (Arrow kernels and byte-string comparisons)."""
    f = frame_at(data, pos, end, expect)
    if f is None:
        return None
    ks, vs = f[3], f[4]
    total = OVERHEAD + ks + vs
    m = (end - pos) // total
    if m < MIN_RUN or expect + m > _I64_MAX or not _looks_like_run(data, pos, total, ks):
        return None
    stop = pos + m * total
    frames = pa.Array.from_buffers(pa.binary(total), m, [None, pa.py_buffer(data).slice(pos, m * total)])
    k = m
    one = bytes((ks,))
    key_sizes = data[pos + _KEY_SIZE_AT : stop : total]
    if key_sizes != one * m:
        k = min(k, m - len(key_sizes.lstrip(one)))
    for start, want in ((HEADER_SIZE + ks, vs), (total - SIZE_FIELD, total)):
        cut = pc.binary_slice(frames, start, start + SIZE_FIELD)
        field = cut.buffers()[1].slice(cut.offset * SIZE_FIELD, m * SIZE_FIELD).to_pybytes()
        pattern = struct.pack(">i", want) * m
        if field != pattern:
            k = min(k, common_prefix(field, pattern, m * SIZE_FIELD) // SIZE_FIELD)
    offsets = _be(frames, 0, 8)
    expected = pc.add(_arange(m), pa.scalar(expect, _I64))
    if not offsets.equals(expected):
        k = min(k, pc.index(pc.equal(offsets, expected), False).as_py())
    assert k >= 1, "the first frame of a run was checked already"
    if k < m:
        frames, offsets = frames.slice(0, k), offsets.slice(0, k)
    return (
        k,
        total,
        Columns(
            offsets,
            _be(frames, 8, 8),
            _byte(frames, HEADER_SIZE - 2),
            pc.binary_slice(frames, HEADER_SIZE, HEADER_SIZE + ks).cast(pa.binary()),
            pc.binary_slice(frames, _VALUE_AT + ks, _VALUE_AT + ks + vs).cast(pa.binary()),
        ),
    )


def _looks_like_run(data: bytes | bytearray, pos: int, total: int, ks: int) -> bool:
    """Whether the MIN_RUN frames at stride `total` from `pos` agree on the key size and on the low bytes of
    the value size and size fields: a cheap filter before _stride_run checks the whole stretch."""
    stop = pos + MIN_RUN * total
    vs_low, size_low = pos + _VALUE_AT - 1 + ks, pos + total - 1
    return (
        data[pos + _KEY_SIZE_AT : stop : total] == bytes((ks,)) * MIN_RUN
        and data[vs_low:stop:total] == data[vs_low : vs_low + 1] * MIN_RUN
        and data[size_low:stop:total] == data[size_low : size_low + 1] * MIN_RUN
    )


def _fixed(a: pa.Array, width: int, n: int) -> pa.Array:
    """A binary array of n values of `width` bytes each (what a take of one fixed-size part cut), as fixed-size
    binary."""
    return pa.Array.from_buffers(pa.binary(width), n, [None, a.buffers()[2].slice(0, n * width)])


def _be(fixed: pa.Array, start: int, width: int, unsigned: bool = False) -> pa.Array:
    """The big-endian integers of `width` (4 or 8) bytes at `start` of every value: int32 or int64 (uint64 when
    `unsigned`)."""
    cut = pc.binary_slice(fixed, start, start + width)
    raw = cut.buffers()[1].slice(cut.offset * width, len(cut) * width)
    a = array.array(("Q" if unsigned else "q") if width == 8 else "i", raw.to_pybytes())
    a.byteswap()
    return pa.Array.from_buffers((_U64 if unsigned else _I64) if width == 8 else _I32, len(a), [None, pa.py_buffer(a)])


def _byte(fixed: pa.Array, at: int) -> pa.Array:
    """The byte at `at` of every value, as int32."""
    cut = pc.binary_slice(fixed, at, at + 1)
    raw = cut.buffers()[1].slice(cut.offset, len(cut))
    return pa.Array.from_buffers(pa.uint8(), len(cut), [None, raw]).cast(_I32)


@functools.lru_cache(maxsize=8)
def _ramp(n: int) -> pa.Array:
    return pc.subtract(pc.cumulative_sum(pa.repeat(pa.scalar(1, _I64), n)), pa.scalar(1, _I64))


_RAMP_SIZE = [1 << 16]


def _size(n: int) -> int:
    """A power of two of at least n (and 1 << 16): the length of the cached arrays sliced for n values."""
    while _RAMP_SIZE[0] < n:
        _RAMP_SIZE[0] *= 2
    return _RAMP_SIZE[0]


def _arange(n: int) -> pa.Array:
    """The int64 array 0, 1, ..., n - 1 (a slice of a cached one)."""
    return _ramp(_size(n)).slice(0, n)


@functools.lru_cache(maxsize=4)
def _ramp_u64(size: int) -> pa.Array:
    return _ramp(size).cast(_U64)


@functools.lru_cache(maxsize=4)
def _steps(size: int) -> tuple[pa.Array, pa.Array, tuple[pa.Array, ...]]:
    """int32 arrays of j // _PARTS and j % _PARTS (j < _PARTS * size), and for each part p, _PARTS * i + p
    (i < size)."""
    j = _ramp(_PARTS * size).cast(_I32)
    five = pa.scalar(_PARTS, _I32)
    fives = pc.multiply(j.slice(0, size), five)
    return (pc.divide(j, five), pc.subtract(j, pc.multiply(pc.divide(j, five), five)),
            tuple(pc.add(fives, pa.scalar(p, _I32)) for p in range(_PARTS)))  # fmt: skip


def _transposed(n: int) -> pa.Array:
    """The order that turns the bounds of the five parts, part by part (n each, then the end of the last frame),
    into frame by frame: (j % 5) * n + j // 5 for j < 5n, then 5n."""
    div, mod, _ = _steps(_size(n))
    m = _PARTS * n
    return pa.concat_arrays([pc.add(pc.multiply(mod.slice(0, m), pa.scalar(n, _I32)), div.slice(0, m)),
                             pa.array([m], _I32)])  # fmt: skip


def _part(n: int, j: int) -> pa.Array:
    """The indices of part j of the n frames in the binary array of their parts: 5i + j."""
    return _steps(_size(n))[2][j].slice(0, n)


def micros(ns: pa.Array) -> pa.Array:
    """Frame timestamps (int64 ns) as UTC microseconds, rounded down; NO_TIMESTAMP becomes null."""
    us = pc.divide(ns, pa.scalar(1000, _I64))  # truncates toward zero
    low = pc.min(ns).as_py()
    if low is not None and low < 0:  # round down: subtract 1 where a negative value had a remainder
        rest = pc.subtract(ns, pc.multiply(us, pa.scalar(1000, _I64)))
        us = pc.subtract(us, pc.less(rest, pa.scalar(0, _I64)).cast(_I64))
        if low == _NO_TIMESTAMP:
            us = pc.if_else(pc.equal(ns, pa.scalar(_NO_TIMESTAMP, _I64)), pa.scalar(None, _I64), us)
    if us.null_count or us.offset:
        return us.cast(_TIMESTAMP)
    return pa.Array.from_buffers(_TIMESTAMP, len(us), [None, us.buffers()[1]])  # the same int64s


def read_columns(
    fd: int, path: str, pos: int, end: int, expect: int, check: ReadCheck | None = None
) -> Iterator[Columns]:
    """The frames of file bytes [pos, end) of a segment, from offset `expect`, as columns (one per chunk read).

    With `check`, each chunk is checked against the segment's checksums before it is decoded (bytes past
    the last checksum record are read unchecked). A frame bigger than a chunk gets a bigger one. An
    incomplete frame at `end` ends the read quietly (a message being written); any other problem raises
    CorruptionError. The caller stops early by closing the iterator. Read with the one chunked frame reader
    (sej.chunks.FrameChunks), as every reader of frames.
    """
    buf = bytearray(min(READ_CHUNK, max(0, end - pos)))  # reused for whole chunks: no column refers to it

    def read(at: int, n: int) -> bytes | bytearray:
        if n != len(buf):
            return pread_full(fd, n, at)
        got = _preadv_full(fd, memoryview(buf), at)
        return buf if got == n else bytes(buf[:got])

    def step(data: bytes | bytearray, n: int, at: int) -> tuple[Columns | None, int, Problem | None]:
        if check is not None:
            with memoryview(data)[:n] as view:
                check.check(fd, end, at, at + n, view)
        try:
            return decode_columns(data, 0, n, expect)
        except CorruptionError as e:  # an offset no column holds: at a position in the chunk
            raise CorruptionError(path, at + e.position, e.reason) from None

    chunks = FrameChunks(read, pos, end, step, READ_CHUNK)  # the one chunked frame reader: bigger frames grow it
    for cols in chunks:
        assert isinstance(cols, Columns)
        yield cols
        expect += len(cols.offset)
    problem = chunks.stop.problem if chunks.stop is not None else None
    if problem is not None and not problem.incomplete:
        raise CorruptionError(path, problem.position, problem.reason)


def record_batch(cols: Columns, client: str | None, shard: str, root: str | None = None) -> pa.RecordBatch:
    """`cols` as a record batch of ARROW_SCHEMA (with `root`: ARROW_SCHEMA_WITH_ROOT), every row of the journal
    `shard` of `client` (None outside a hub root)."""
    return record_batch_of_pieces(cols, [len(cols.offset)], [(client, shard, root)], root=root is not None)


def record_batch_of_pieces(
    cols: Columns, counts: list[int], names: list[tuple[str | None, str, str | None]], root: bool = False
) -> pa.RecordBatch:
    """`cols` of pieces of several journals (counts[i] rows of the journal names[i] = (client, shard, root)) as
    one record batch of ARROW_SCHEMA (with `root`: ARROW_SCHEMA_WITH_ROOT), as record_batch makes for one."""
    ends: list[int] = []
    values: list[tuple[str | None, str, str | None]] = []
    at = 0
    for k, name in zip(counts, names, strict=True):
        if k:
            at += k
            if values and values[-1] == name:
                ends[-1] = at
            else:
                ends.append(at)
                values.append(name)
    assert at == len(cols.offset), (at, len(cols.offset))
    run_ends = pa.array(ends, _I32) if len(values) > 1 else None
    string = pa.string()

    def column(i: int) -> pa.Array:
        if len(values) <= 1:  # one journal (or no rows): a column of one value
            v = values[0][i] if values else None
            return pa.nulls(at, string) if v is None else pa.repeat(pa.scalar(v, string), at)
        return pc.run_end_decode(pa.RunEndEncodedArray.from_arrays(run_ends, pa.array([v[i] for v in values], string)))

    arrays = [column(0), column(1), cols.offset, micros(cols.timestamp), cols.type, cols.key, cols.value]
    if not root:
        return pa.RecordBatch.from_arrays(arrays, schema=ARROW_SCHEMA)
    return pa.RecordBatch.from_arrays([*arrays, column(2)], schema=ARROW_SCHEMA_WITH_ROOT)


def journal_columns(
    dir: str | os.PathLike[str], start: int | None = None, stop: int | None = None, verify: bool = True
) -> Iterator[Columns]:
    """The messages of the journal in `dir` with offsets in [start, stop) (None: from the first retained one,
    to the end), as columns: a batch per chunk read, each segment read through `read_columns`.

    With `verify`, every chunk is checked against its segment's checksums first (ChecksumError), as the
    Scanner's verify and the Spark source do; segments without checksums (old or Go-written) are read
    unchecked. A finished segment that ends before the next one starts is damage (CorruptionError); the
    last one may end with a message being written, which is left out.
    """
    path = journal_path(dir)
    check_journal(path)
    segments = list_segments(path)
    if not segments:
        return
    first, last = segments[0].first_offset, next_offset(path, segments)
    for name, v in (("start", start), ("stop", stop)):
        if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 0):
            raise InvalidArgumentError(f"{name} must be an offset (an int >= 0) or None, got {v!r}")
    lo = first if start is None else start
    hi = MAX_OFFSET + 1 if stop is None else stop
    if not first <= lo <= last:
        raise OffsetOutOfRangeError(lo, first, last)
    for i, seg in enumerate(segments):
        is_last = i == len(segments) - 1
        after = None if is_last else segments[i + 1].first_offset
        if after is not None and after <= lo:
            continue
        if seg.first_offset >= hi:
            return
        with open_file(seg.path) as f:
            fd = f.fileno()
            size = os.fstat(fd).st_size
            expect = max(lo, seg.first_offset)
            pos = 0 if expect == seg.first_offset else offset_position(path, seg, fd, size, expect, is_last)
            with contextlib.ExitStack() as stack:
                check = stack.enter_context(ReadCheck(seg.path, sum_path(path, seg.first_offset), seg.first_offset)) \
                    if verify else None  # fmt: skip
                if check is not None and check.sums is None:
                    check = None
                chunks = stack.enter_context(contextlib.closing(read_columns(fd, seg.path, pos, size, expect, check)))
                for cols in chunks:
                    n = len(cols.offset)
                    if expect + n >= hi:
                        if hi > expect:
                            yield Columns(*(a.slice(0, hi - expect) for a in cols))
                        return
                    yield cols
                    expect += n
            if after is not None and expect != after:
                raise CorruptionError(seg.path, size, f"the segment's frames end at offset {expect}, "
                                      f"but the next segment starts at offset {after}")  # fmt: skip


def _preadv_full(fd: int, view: memoryview, pos: int) -> int:
    """Fill `view` from the file at `pos` (one preadv returns at most MAX_READ bytes); bytes read."""
    got = 0
    while got < len(view):
        n = os.preadv(fd, [view[got : got + MAX_READ]], pos + got)
        if not n:
            break
        got += n
    return got


__all__ = [
    "ARROW_SCHEMA",
    "ARROW_SCHEMA_WITH_ROOT",
    "COLUMN_TYPES",
    "ROOT_TYPE",
    "Columns",
    "MissingExtraError",
    "decode_columns",
    "decode_pieces",
    "journal_columns",
    "micros",
    "read_columns",
    "record_batch",
    "record_batch_of_pieces",
]
