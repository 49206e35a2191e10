"""Checksums beside the segments: the `.sum` sidecar of each segment (byte layout in docs/format.md).

A segment is cut into a fixed grid of BLOCK-byte blocks. The sidecar holds a
16-byte header (MAGIC, the segment's first offset) and then append-only records
`end u64 | xxh3_64 u64`: the hash of the segment's bytes from the start of the
block holding byte `end - 1` up to `end`. A complete block has a record ending at
its boundary; the writer also records the partial block at the end of each write,
so a later record of the same block extends an earlier one. Every record is
checked, superseded ones included. Bytes past the last record are unchecked.

The grid and the checks are pure (bytes in, mismatches out): `Hasher` makes
records, `Verifier` checks bytes against them. `SumFile` appends to a sidecar,
`SumReader` reads one as it grows, and `ReadCheck` checks a segment ahead of a reader
(the scanner's and the Spark source's).
"""

from __future__ import annotations

import os
import struct
from typing import NamedTuple

import xxhash

from .errors import ChecksumError, TruncatedError, UnsafeFileError
from .fsutil import open_file, open_regular
from .segment import pread_full

MAGIC = b"SEJSUM01"
HEADER = struct.Struct(">8sQ")  # magic, first offset of the segment
RECORD = struct.Struct(">QQ")  # end position, xxh3-64 of [block_start(end), end)
BLOCK = 64 << 10
"""Bytes per checksum block (see docs/benchmarks.md for the measured choice)."""

_new_hash = xxhash.xxh3_64


class Sum(NamedTuple):
    end: int  # the record covers the block's bytes up to here
    digest: int


def block_start(end: int) -> int:
    """The start of the block holding byte `end - 1` (0 for 0)."""
    return (end - 1) // BLOCK * BLOCK if end > 0 else 0


def header(first_offset: int) -> bytes:
    return HEADER.pack(MAGIC, first_offset)


def check_header(data: bytes, first_offset: int) -> str | None:
    """Why `data` (a sidecar's first bytes) is not a valid header for this segment, or None."""
    if len(data) < HEADER.size:
        return f"checksum file header is {len(data)} bytes, not {HEADER.size}"
    magic, first = HEADER.unpack_from(data)
    if magic != MAGIC:
        return f"checksum file has magic {magic!r}, not {MAGIC!r}"
    if first != first_offset:
        return f"checksum file is for the segment starting at offset {first}, not {first_offset}"
    return None


def follows(prev: int, end: int) -> bool:
    """Whether a record ending at `end` may follow one ending at `prev` (0: none yet) on the grid."""
    if end <= prev:
        return False
    s = block_start(end)
    return s == prev or (prev % BLOCK != 0 and s == block_start(prev))


def parse_records(data: bytes | memoryview, prev: int, first: int = 0) -> tuple[list[Sum], str | None]:
    """The whole records in `data` after one ending at `prev`; and why the next one is invalid, if one is.

    A torn last record (fewer than 16 bytes) is not returned and is no problem. `first`: the number of the
    first record of `data` in its file (for the message).
    """
    out: list[Sum] = []
    for i in range(0, len(data) - RECORD.size + 1, RECORD.size):
        end, digest = RECORD.unpack_from(data, i)
        if not follows(prev, end):
            return (
                out,
                f"checksum record {first + i // RECORD.size} ends at byte {end}, which cannot follow byte {prev}",
            )
        out.append(Sum(end, digest))
        prev = end
    return out, None


TAIL_RECORDS = 4096
"""Records read at once by `tail_records`, from the end of a sidecar backwards (64 KiB)."""


def tail_records(fd: int, count: int, size: int) -> tuple[int, Sum | None, str | None]:
    """(how many, the last) of a sidecar's first `count` records that end within a segment's `size` bytes, read
    from the file's end backwards: the records past `size` (a tail recovery cut) and the one before them, not the
    whole file (one record per flush: 8 million in a 1 GiB segment). The records read are validated as
    `parse_records` does; the third item is why they are invalid, if they are."""
    hi = count
    for _ in range(count // TAIL_RECORDS + 2):  # bounded: each step moves `hi` back by TAIL_RECORDS
        lo = max(0, hi - TAIL_RECORDS)
        first = lo - 1 if lo else 0  # with the record before, to validate the first one against
        raw = pread_full(fd, (hi - first) * RECORD.size, HEADER.size + first * RECORD.size)
        if len(raw) < (hi - first) * RECORD.size:
            return 0, None, f"checksum file shrank to {HEADER.size + first * RECORD.size + len(raw)} bytes"
        anchor = Sum(*RECORD.unpack_from(raw)) if lo else None
        records, problem = parse_records(memoryview(raw)[RECORD.size if lo else 0 :], anchor.end if anchor else 0, lo)
        if problem is not None:
            return 0, None, problem
        kept = [r for r in records if r.end <= size]
        if kept:
            return lo + len(kept), kept[-1], None
        if anchor is None:
            return 0, None, None
        hi = lo  # the record before is validated as the last of the next step's, against the one before it
    return 0, None, None  # never: the loop reaches the first record


def records_upto(fd: int, count: int, pos: int) -> int:
    """How many of a sidecar's first `count` records end at or before `pos`: a binary search, the records being
    in order (in a damaged file it lands somewhere, and the records read from there on are validated as ever)."""
    lo, hi = 0, count
    while lo < hi:  # bounded: halves every step
        mid = (lo + hi) // 2
        raw = os.pread(fd, RECORD.size, HEADER.size + mid * RECORD.size)
        if len(raw) == RECORD.size and RECORD.unpack(raw)[0] <= pos:
            lo = mid + 1
        else:
            hi = mid
    return lo


def drop_past(path: str, first_offset: int, size: int) -> tuple[int, int] | None:
    """Drop the records of a segment's sidecar at `path` that end past `size` (the segment was cut to `size`
    bytes: those bytes are gone, so are their checksums), and make that durable.

    Returns the byte range whose records were dropped (from the end of the last record kept), None when
    there were none. A missing sidecar, or one that is not a valid sidecar of this segment, is left alone
    (`sej verify` reports it).
    """
    try:
        fd = open_regular(path, os.O_RDWR)
    except (FileNotFoundError, UnsafeFileError):
        return None
    try:
        if check_header(pread_full(fd, HEADER.size, 0), first_offset) is not None:
            return None
        total = (os.fstat(fd).st_size - HEADER.size) // RECORD.size
        count, last, problem = tail_records(fd, total, size)
        if problem is not None or count == total:
            return None
        past = RECORD.unpack(pread_full(fd, RECORD.size, HEADER.size + (total - 1) * RECORD.size))[0]
        os.ftruncate(fd, HEADER.size + count * RECORD.size)
        os.fsync(fd)
        return (last.end if last is not None else 0), past
    finally:
        os.close(fd)


def pack(records: list[Sum]) -> bytes:
    return b"".join(RECORD.pack(*r) for r in records)


class Hasher:
    """Makes the records for bytes appended at `pos` on (the grid's running hash)."""

    __slots__ = ("pos", "h")

    def __init__(self, pos: int = 0, prefix: bytes | memoryview = b"") -> None:
        """`prefix`: the segment's bytes from block_start(pos) to pos."""
        if len(prefix) != pos - (pos // BLOCK * BLOCK):
            raise ValueError(f"prefix of {len(prefix)} bytes for position {pos}")
        self.pos = pos
        self.h = _new_hash(prefix)

    def copy(self) -> Hasher:
        other = Hasher.__new__(Hasher)
        other.pos, other.h = self.pos, self.h.copy()
        return other

    def update(self, data: bytes | bytearray | memoryview) -> bytes:
        """Hash `data` (the bytes at `pos`); the packed records: each block it completes, then its partial end."""
        n = len(data)
        if not n:
            return b""
        pos, h, out = self.pos, self.h, b""
        room = BLOCK - pos % BLOCK
        if n < room:  # the common case: inside one block
            h.update(data)
            self.pos = pos + n
            return RECORD.pack(self.pos, h.intdigest())
        with memoryview(data) as view:
            i = 0
            while i < n:
                take = min(BLOCK - pos % BLOCK, n - i)
                h.update(view[i : i + take])
                i += take
                pos += take
                if pos % BLOCK == 0:
                    out += RECORD.pack(pos, h.intdigest())
                    h.reset()
        self.pos = pos
        if pos % BLOCK:
            out += RECORD.pack(pos, h.intdigest())
        return out


class Mismatch(NamedTuple):
    start: int  # the byte range the failed record covers
    end: int
    reason: str


class Verifier:
    """Checks a segment's bytes, fed in order from `pos`, against its records (pure, no I/O).

    Records ending at or before `pos` are skipped (checked before). `covered` is the
    end of the last record known; bytes may be fed up to it, no further.
    """

    __slots__ = ("pos", "h", "pending", "covered")

    def __init__(self, pos: int = 0, prefix: bytes | memoryview = b"", hasher: Hasher | None = None) -> None:
        base = hasher.copy() if hasher is not None else Hasher(pos, prefix)
        self.pos, self.h = base.pos, base.h
        self.pending: list[Sum] = []
        self.covered = self.pos

    def add(self, records: list[Sum]) -> Mismatch | None:
        """Take records (in file order); a record ending exactly at `pos` is checked at once."""
        for r in records:
            if r.end <= self.pos:
                # Only a partial record ending exactly here can still be checked: the hash holds its bytes.
                if r.end == self.pos and r.end % BLOCK and self.h.intdigest() != r.digest:
                    return Mismatch(block_start(r.end), r.end, "checksum mismatch")
                continue
            self.pending.append(r)
            self.covered = r.end
        return None

    def feed(self, data: bytes | bytearray | memoryview) -> Mismatch | None:
        """Check `data`, the bytes at `pos` (not past `covered`); the first record that fails, if one does."""
        n = len(data)
        if self.pos + n > self.covered:
            raise ValueError(f"fed up to byte {self.pos + n}, past the checked end {self.covered}")
        pending, h, pos = self.pending, self.h, self.pos
        with memoryview(data) as view:
            i = k = 0
            try:
                while k < len(pending):
                    r = pending[k]
                    take = r.end - pos
                    if take > n - i:
                        break
                    h.update(view[i : i + take])
                    i += take
                    pos = r.end
                    k += 1
                    if h.intdigest() != r.digest:
                        return Mismatch(block_start(r.end), r.end, "checksum mismatch")
                    if pos % BLOCK == 0:
                        h.reset()
                if i < n:
                    h.update(view[i:])
                    pos += n - i
            finally:
                del pending[:k]
                self.pos = pos
        return None


def messages_in(fd: int, size: int, first_offset: int, start: int, end: int) -> tuple[int, int] | None:
    """Offsets of the first and last messages overlapping bytes start..end of a segment (None if unknown).

    Walks the frames from the segment's start by their sizes, reading only headers:
    it is for error reports, not for the hot path.
    """
    from .frames import HEADER as FRAME_HEADER
    from .frames import frame_total

    pos, first, last = 0, None, 0
    for _ in range(1 << 32):  # bounded: every step advances by at least a frame's overhead
        if pos >= min(end, size):
            break
        head = os.pread(fd, FRAME_HEADER.size + 127 + 4, pos)
        total = frame_total(head, 0, len(head))
        if total is None or total < 26:
            break  # damaged frames: report what is known
        if pos + total > start:
            last = FRAME_HEADER.unpack_from(head)[0]
            if first is None:
                first = last
        pos += total
    return (first, last) if first is not None else None


def error_for(path: str, sum_path: str, fd: int, size: int, first_offset: int, m: Mismatch) -> ChecksumError:
    """A ChecksumError for a mismatch, with the offsets of the messages it covers."""
    return ChecksumError(path, m.start, m.end, m.reason, sum_path, messages_in(fd, size, first_offset, m.start, m.end))


class SegmentCheck(NamedTuple):
    """What checking one segment against its checksum file found."""

    size: int  # the segment's size when checked
    has_sums: bool  # it has a checksum file
    checked: int  # bytes 0..checked are covered by checksums; checked..size are unchecked
    errors: list[ChecksumError]  # mismatches, and an invalid checksum file
    past: int = 0  # the end of records for bytes past the segment's end (one of `errors`); 0: none


CHECK_CHUNK = 16 * BLOCK


def check_segment(path: str, sum_path: str, first_offset: int) -> SegmentCheck:
    """Check every record of a segment's checksum file against the segment's bytes.

    The checksum file is read before the segment, so a writer appending meanwhile is
    no problem. A block that fails is reported once (with the offsets of its messages);
    checking goes on with the next block.
    """
    try:
        sfd = open_regular(sum_path)
    except FileNotFoundError:
        sfd = -1
    except UnsafeFileError as e:
        with open_file(path) as f:
            return SegmentCheck(os.fstat(f.fileno()).st_size, True, 0,
                                [ChecksumError(path, 0, 0, f"checksum file: {e}", sum_path)])  # fmt: skip
    try:
        raw = _read_all(sfd) if sfd >= 0 else b""
    finally:
        if sfd >= 0:
            os.close(sfd)
    with open_file(path) as f:
        fd = f.fileno()
        size = os.fstat(fd).st_size
        if sfd < 0:
            return SegmentCheck(size, False, 0, [])
        errors: list[ChecksumError] = []
        problem = check_header(raw, first_offset)
        if problem is not None and size == 0 and header(first_offset).startswith(raw):
            return SegmentCheck(0, True, 0, [])  # a writer was stopped while creating it: nothing to check
        if problem is not None:
            return SegmentCheck(size, True, 0, [ChecksumError(path, 0, 0, problem, sum_path)])
        body = memoryview(raw)[HEADER.size :]
        records, problem = parse_records(body[: len(body) - len(body) % RECORD.size], 0)
        if problem is not None:
            at = records[-1].end if records else 0
            errors.append(ChecksumError(path, at, at, f"{sum_path}: {problem}", sum_path))
        past = [r for r in records if r.end > size]
        if past:
            errors.append(ChecksumError(path, size, past[-1].end, f"{sum_path}: checksums for bytes past the "
                                        f"segment's end ({size} bytes)", sum_path))  # fmt: skip
            records = [r for r in records if r.end <= size]
        errors += _check_records(fd, size, first_offset, records, path, sum_path)
        return SegmentCheck(size, True, records[-1].end if records else 0, errors, past[-1].end if past else 0)


def _check_records(fd: int, size: int, first: int, records: list[Sum], path: str, sum_path: str) -> list[ChecksumError]:
    errors: list[ChecksumError] = []
    h = _new_hash()
    pos = cur = 0  # bytes hashed up to `pos`, in the block starting at `cur`
    buf, buf_at = b"", 0
    for r in records:
        bs = block_start(r.end)
        if bs != cur:
            h.reset()
            pos = cur = bs
        elif pos < 0:
            continue  # this block already failed
        if pos < buf_at or r.end > buf_at + len(buf):
            buf_at = pos
            buf = pread_full(fd, max(CHECK_CHUNK, r.end - pos), pos)
        h.update(memoryview(buf)[pos - buf_at : r.end - buf_at])
        pos = r.end
        if h.intdigest() != r.digest:
            errors.append(error_for(path, sum_path, fd, size, first, Mismatch(bs, r.end, "checksum mismatch")))
            pos = -1
        elif pos % BLOCK == 0:
            h.reset()
            cur = pos
    return errors


def _read_all(fd: int) -> bytes:
    parts = []
    for _ in range(1 << 30):
        part = os.read(fd, 1 << 20)
        if not part:
            break
        parts.append(part)
    return b"".join(parts)


class SumReader:
    """Reads a segment's sidecar as it grows; records past `prev` are validated against the grid."""

    __slots__ = ("path", "segment", "first", "fd", "read_to", "prev", "problem")

    def __init__(self, path: str, first_offset: int, segment: str) -> None:
        """`segment`: the segment's path, for errors. FileNotFoundError when there is no sidecar (unchecked)."""
        self.path = path
        self.segment = segment
        self.first = first_offset
        self.fd = open_regular(path)
        self.read_to = 0
        self.prev = 0
        self.problem: str | None = None

    def skip_to(self, pos: int) -> None:
        """Before the first `read`: start at the records ending after `pos` (a block's start), not at the first.
        Those before cover bytes before `pos`, which the reader does not check: a reader starting late in a long
        segment (a consumer at its committed offset, a Spark partition) does not read and validate them all."""
        if self.read_to != 0 or self.problem is not None:
            return
        head = os.pread(self.fd, HEADER.size, 0)
        if len(head) < HEADER.size:
            return  # being created
        self.problem = check_header(head, self.first)
        if self.problem is not None:
            return  # read() raises it
        count = (os.fstat(self.fd).st_size - HEADER.size) // RECORD.size
        k = records_upto(self.fd, count, pos)
        self.read_to = HEADER.size
        if k and pos > 0:
            # In a valid file the record before is the one ending exactly at `pos` (every complete block has a
            # record at its boundary). Anything else (zeroed records a crash left at the end mislead the search;
            # `pos` past the last record) reads them all, as ever, so that damage is seen.
            raw = os.pread(self.fd, RECORD.size, HEADER.size + (k - 1) * RECORD.size)
            if len(raw) == RECORD.size and RECORD.unpack(raw)[0] == pos:
                self.read_to, self.prev = HEADER.size + k * RECORD.size, pos

    def read(self) -> list[Sum]:
        """The whole records added since the last call. Raises ChecksumError once the file is invalid."""
        if self.problem is not None:
            raise ChecksumError(self.segment, self.prev, self.prev, self.problem, self.path)
        if self.read_to == 0:
            head = os.pread(self.fd, HEADER.size, 0)
            if len(head) < HEADER.size:
                return []  # being created
            self.problem = check_header(head, self.first)
            if self.problem is not None:
                return self.read()
            self.read_to = HEADER.size
        out: list[Sum] = []
        for _ in range(1 << 20):
            data = os.pread(self.fd, 1 << 20, self.read_to)
            whole = len(data) - len(data) % RECORD.size
            recs, problem = parse_records(
                memoryview(data)[:whole], self.prev, (self.read_to - HEADER.size) // RECORD.size
            )
            out += recs
            if recs:
                self.prev = recs[-1].end
            self.read_to += len(recs) * RECORD.size
            if problem is not None:
                self.problem = f"{self.path}: {problem}"
                if not out:
                    return self.read()
                return out  # the valid records first; the next call raises
            if len(data) < 1 << 20:
                break
        return out

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


class ReadCheck:
    """A reader's check of one segment against its sidecar: bytes are checked before they are decoded.

    Without a sidecar (an old or Go-written segment) `sums` is None and nothing is checked.
    """

    __slots__ = ("segment", "sum_path", "first", "sums", "v")

    def __init__(self, segment: str, sum_path: str, first_offset: int) -> None:
        """UnsafeFileError if the sidecar is not a regular file (it is never followed)."""
        self.segment, self.sum_path, self.first = segment, sum_path, first_offset
        try:
            self.sums: SumReader | None = SumReader(sum_path, first_offset, segment)
        except FileNotFoundError:
            self.sums = None
        self.v: Verifier | None = None

    def check(self, fd: int, size: int, pos: int, want: int, data: bytes | bytearray | memoryview | None = None) -> int:
        """Check the segment's bytes up to `want` and return the end of the bytes checked so far.

        That is at least `want`, or the end of the last record when the records stop before
        `want` (the bytes past it are unchecked: waiting for their record or never recorded;
        the caller decides). `size` is the segment's size the caller saw; `pos` is where its
        bytes begin (the first call starts checking at its block), and `data`, when given,
        are the bytes from `pos`, checked without reading them again. Raises ChecksumError
        on a mismatch, an invalid sidecar or records past the end of the segment.
        """
        if self.sums is None:
            raise ValueError("no checksums to check")
        v = self.v
        if v is None:
            v = self.v = Verifier(pos - pos % BLOCK)
            self.sums.skip_to(v.pos)
        if v.pos >= want:
            return v.pos
        sums = self.sums
        m = v.add(sums.read())
        if sums.problem is not None:  # an invalid sidecar fails the whole segment, not only the bytes after it
            raise ChecksumError(self.segment, sums.prev, sums.prev, sums.problem, self.sum_path)
        if m is None:
            # The writer records bytes after writing them: a record past the size seen after reading it is bad.
            now = os.fstat(fd).st_size
            if v.covered > now >= size:
                raise ChecksumError(self.segment, now, v.covered, f"{self.sum_path} has checksums for bytes past "
                                    f"the end of the segment ({now} bytes)", self.sum_path)  # fmt: skip
            target = v.covered
            for r in v.pending:  # in order: the first record reaching `want` ends the bytes to check
                if r.end >= want:
                    target = r.end
                    break
            m = self._feed(fd, target, pos, data)
        if m is not None:
            raise error_for(self.segment, self.sum_path, fd, size, self.first, m)
        return v.pos

    def _feed(self, fd: int, target: int, at: int, data: bytes | bytearray | memoryview | None) -> Mismatch | None:
        """Feed the verifier the bytes up to `target`, a record's end: from `data` (the bytes at `at`) where it
        holds them, read from the file elsewhere."""
        v = self.v
        assert v is not None
        data_end = at + len(data) if data is not None else at
        for _ in range(1 << 40):  # bounded: every step feeds at least one byte
            pos = v.pos
            if pos >= target:
                return None
            if data is not None and at <= pos < data_end:
                with memoryview(data)[pos - at : min(target, data_end) - at] as piece:
                    m = v.feed(piece)
            else:
                stop = at if pos < at < target else target
                read = pread_full(fd, min(CHECK_CHUNK, stop - pos), pos)
                if not read:
                    raise TruncatedError(f"{self.segment} shrank to {pos} bytes under the reader")
                m = v.feed(read)
            if m is not None:
                return m
        return None

    def close(self) -> None:
        if self.sums is not None:
            self.sums.close()

    def __enter__(self) -> ReadCheck:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class SumFile:
    """Appends records to a segment's sidecar (the writer's and the hub's, through SegmentAppender)."""

    __slots__ = ("path", "fd", "hasher")

    def __init__(self, path: str, fd: int, hasher: Hasher) -> None:
        self.path, self.fd, self.hasher = path, fd, hasher

    @classmethod
    def create(cls, path: str, first_offset: int) -> SumFile:
        """A new, empty sidecar for an empty segment (any file there is replaced)."""
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW, 0o644)
        try:
            _write_all(fd, header(first_offset))
        except BaseException:
            os.close(fd)
            raise
        return cls(path, fd, Hasher())

    def add(self, data: bytes | bytearray | memoryview) -> None:
        """Record `data`, just appended to the segment."""
        _write_all(self.fd, self.hasher.update(data))

    def sync(self) -> None:
        os.fsync(self.fd)

    def close(self) -> None:
        if self.fd >= 0:
            try:
                os.close(self.fd)
            finally:
                self.fd = -1


def _write_all(fd: int, data: bytes) -> None:
    with memoryview(data) as view:
        done = 0
        while done < len(view):
            done += os.write(fd, view[done:])


__all__ = [
    "BLOCK",
    "CHECK_CHUNK",
    "HEADER",
    "MAGIC",
    "RECORD",
    "ChecksumError",
    "Hasher",
    "Mismatch",
    "ReadCheck",
    "SegmentCheck",
    "Sum",
    "SumFile",
    "SumReader",
    "Verifier",
    "block_start",
    "check_header",
    "check_segment",
    "drop_past",
    "error_for",
    "follows",
    "header",
    "messages_in",
    "pack",
    "parse_records",
    "records_upto",
    "tail_records",
]
