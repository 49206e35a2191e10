"""The one chunked frame reader (`sej.chunks.FrameChunks`) against decoding the whole buffer at once: any frame
sizes (frames bigger than a chunk, chunks smaller than a header), a file cut at every byte, hostile size fields;
it never reads past its range, never loops without progress, and in `grow=False` mode never reads more than a
chunk (or a header) at once."""

from __future__ import annotations

import os
import struct
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sej.chunks import BigFrame, FrameChunks, Stop
from sej.frames import HEADER_SIZE, MAX_KEY, OVERHEAD, Message, Problem, decode_batch, walk_frames

HEAD = struct.Struct(">QqBb")
I32 = struct.Struct(">i")
HEADER_READ = HEADER_SIZE + MAX_KEY + 4


def frame(off: int, key: bytes, value: bytes, ts: int = 7, typ: int = 1) -> bytes:
    return HEAD.pack(off, ts, typ, len(key)) + key + I32.pack(len(value)) + value + I32.pack(26 + len(key) + len(value))


def journal(first: int, shapes: list[tuple[int, int]]) -> bytes:
    return b"".join(frame(first + i, os.urandom(ks), os.urandom(vs)) for i, (ks, vs) in enumerate(shapes))


class File:
    """A file's bytes behind a `read` that checks the reader's requests."""

    def __init__(self, data: bytes, end: int, most: int | None = None) -> None:
        self.data, self.end, self.most, self.reads = data, end, most, 0

    def read(self, pos: int, n: int) -> bytes:
        self.reads += 1
        assert self.reads < 100_000, "the reader loops without progress"
        assert n > 0 and pos >= 0 and pos + n <= self.end, f"a read of {n} bytes at {pos} past the end {self.end}"
        assert self.most is None or n <= self.most, f"a read of {n} bytes, more than {self.most}"
        return self.data[pos : pos + n]


def decoded(buf: bytes, start: int, end: int, first: int, chunk: int, grow: bool) -> tuple[list[Any], Stop, File]:
    """The messages FrameChunks decodes (decode_batch steps; BigFrames decoded from the whole buffer), its Stop."""
    f = File(buf, end, None if grow else max(chunk, 2 * HEADER_READ))
    out: list[Any] = []

    def step(data: bytes, n: int, at: int) -> tuple[list[Message], int, Problem | None]:
        return decode_batch(data, 0, n, first + len(out))

    chunks = FrameChunks(f.read, start, end, step, chunk, grow)
    for item in chunks:
        if isinstance(item, BigFrame):
            assert item.total > len(item.head) >= chunk and item.head == buf[item.position :][: len(item.head)]
            msgs, used, problem = decode_batch(buf, item.position, item.position + item.total, first + len(out), 1)
            assert used == item.position + item.total and problem is None
            out += msgs
        else:
            assert item
            out += item
    assert chunks.stop is not None
    return out, chunks.stop, f


shapes = st.lists(
    st.tuples(st.integers(0, MAX_KEY), st.one_of(st.integers(0, 300), st.integers(300, 5000))), max_size=10
)
chunks = st.one_of(st.integers(1, 64), st.integers(64, 2048), st.just(1 << 20))
small_shapes = st.lists(st.tuples(st.integers(0, 40), st.integers(0, 400)), min_size=1, max_size=6)
"""Frames small enough to cut a journal of them at every byte."""


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(st.integers(0, 2**40), shapes, chunks, st.booleans())
def test_every_frame_whatever_its_size_and_the_chunk_size(first: int, sizes: list, chunk: int, grow: bool) -> None:
    buf = journal(first, sizes)
    want = decode_batch(buf, 0, len(buf), first)[0]
    got, stop, _ = decoded(buf, 0, len(buf), first, chunk, grow)
    assert got == want
    assert stop == Stop(len(buf), len(buf), None)


@settings(max_examples=60, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(st.integers(0, 2**40), small_shapes, st.one_of(st.integers(1, 64), st.integers(64, 600)), st.booleans())
def test_a_file_cut_at_every_byte(first: int, sizes: list, chunk: int, grow: bool) -> None:
    """Cut anywhere: the whole frames before the cut, then the incomplete frame at the last boundary, with the
    Problem decoding the cut bytes at once names; the same when the range claims more than the file holds."""
    full = journal(first, sizes)
    for cut in range(len(full) + 1):
        buf = full[:cut]
        want, used, problem = decode_batch(buf, 0, cut, first)
        for end in (cut, len(full)):
            got, stop, _ = decoded(buf, 0, end, first, chunk, grow)
            assert got == want and stop.position == used
            if end == cut or not stop.big:
                assert stop.problem == problem
            else:  # a frame bigger than a chunk, whose trailer the shrunk file lacks: judged by its header
                assert stop.problem is not None and stop.problem.incomplete


@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(
    st.integers(0, 2**40),
    shapes,
    st.lists(st.tuples(st.integers(0, 1 << 14), st.sampled_from([0, 1, 0x7F, 0x80, 0xFF])), max_size=4),
    st.lists(st.tuples(st.integers(0, 1 << 14), st.integers(-(2**31), 2**31 - 1)), max_size=3),
    chunks,
    st.booleans(),
    st.integers(0, 40),
)
def test_hostile_bytes_and_size_fields(
    first: int, sizes: list, flips: list, fields: list, chunk: int, grow: bool, start: int
) -> None:
    """Damaged bytes, size fields claiming anything (negative, 2 GiB, past the file): the reader stops where
    decoding the whole buffer at once stops, with the same Problem, without reading past its range or looping."""
    buf = bytearray(journal(first, sizes) + os.urandom(start % 7))
    for at, byte in flips:
        if buf:
            buf[at % len(buf)] = byte
    for at, value in fields:
        if len(buf) >= 4:
            I32.pack_into(buf, at % (len(buf) - 3), value)
    data = bytes(buf)
    start = min(start, len(data))
    want, used, problem = decode_batch(data, start, len(data), first)
    got, stop, f = decoded(data, start, len(data), first, chunk, grow)
    assert got == want and stop.position == used and stop.problem == problem
    assert f.reads <= (len(got) + 2) * (2 * len(data).bit_length() + 4)


@settings(max_examples=200, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(st.integers(0, 2**40), shapes, chunks, st.integers(0, 2))
def test_walk_steps_and_big_frames_by_their_trailer(first: int, sizes: list, chunk: int, damage: int) -> None:
    """walk_frames steps with grow=False (as segment.walk and the hub's copy): every frame is walked once, a big
    one as a BigFrame, and a wrong trailing size of a big frame is damage named as check_frame names it."""
    buf = bytearray(journal(first, sizes))
    if damage and sizes:
        k = len(sizes) - 1 if damage == 1 else 0
        at = sum(OVERHEAD + ks + vs for ks, vs in sizes[: k + 1])
        I32.pack_into(buf, at - 4, I32.unpack_from(buf, at - 4)[0] + 1)
    data = bytes(buf)
    f = File(data, len(data), max(chunk, 2 * HEADER_READ))
    offset = [first]

    def step(d: bytes, n: int, at: int) -> tuple[Any, int, Problem | None]:
        w = walk_frames(d, 0, n, at, offset[0], -1, 1 << 62, None)
        return w, w.used, w.problem

    walked = FrameChunks(f.read, 0, len(data), step, chunk, grow=False)
    for item in walked:
        offset[0] = offset[0] + 1 if isinstance(item, BigFrame) else item.next_offset
    want, used, problem = decode_batch(data, 0, len(data), first)
    assert walked.stop is not None
    assert offset[0] == first + len(want) and walked.stop.position == used and walked.stop.problem == problem


def test_a_step_that_wants_no_more_ends_the_read() -> None:
    buf = journal(0, [(1, 10)] * 3)
    chunks = FrameChunks(File(buf, len(buf)).read, 0, len(buf), lambda d, n, at: ([], 0, None), 1024)
    assert list(chunks) == [] and chunks.stop == Stop(0, len(buf), None)
