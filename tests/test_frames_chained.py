"""The decoder's loop over frames of any sizes, which checks each frame's trailing size field in the struct call
that reads the next frame (`frames._CHAINED`): the same messages, position and Problem as the general path
(`frame_at` frame by frame) on frames of mixed sizes, damaged anywhere, from any position and with any limit;
and the Scanner's iteration (messages taken from each batch by itertools.chain)."""

from __future__ import annotations

import os
import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import sej
from sej.errors import ClosedError, CorruptionError
from sej.frames import NO_TIMESTAMP, decode_batch

HEAD = struct.Struct(">QqBb")
I32 = struct.Struct(">i")


def frame(off: int, ts: int, typ: int, key: bytes, value: bytes) -> bytes:
    return HEAD.pack(off, ts, typ, len(key)) + key + I32.pack(len(value)) + value + I32.pack(26 + len(key) + len(value))


mixed = st.lists(  # sizes that change from frame to frame: the chained loop, not a run of one size
    st.tuples(st.one_of(st.just(NO_TIMESTAMP), st.integers(-(2**63), 2**63 - 1)), st.integers(0, 255),
              st.binary(max_size=9), st.binary(max_size=40)),
    min_size=1, max_size=10,
)  # fmt: skip


@settings(max_examples=500, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(
    st.integers(0, 2**64 - 12),
    mixed,
    st.integers(0, 9),  # the frame damaged
    st.sampled_from(["trailer", "value size", "key size", "offset", "none"]),
    st.integers(0, 255),
    st.integers(0, 40),  # bytes cut from the end
    st.integers(0, 12),  # frames skipped: decoding starts inside the bytes
    st.integers(1, 12),
    st.one_of(st.none(), st.just("j")),
)
def test_chained_loop_equals_general_path_on_damaged_frames_of_mixed_sizes(
    first: int, msgs: list, which: int, field: str, byte: int, cut: int, skip: int, limit: int, journal: str | None
) -> None:  # type: ignore[type-arg]
    frames = [frame(first + i, *m) for i, m in enumerate(msgs)]
    starts = [sum(map(len, frames[:i])) for i in range(len(frames) + 1)]
    data = bytearray(b"".join(frames))
    i = which % len(frames)
    at = {"trailer": starts[i + 1] - 1, "value size": starts[i] + 18 + len(msgs[i][2]) + 3,
          "key size": starts[i] + 17, "offset": starts[i] + 7, "none": None}[field]  # fmt: skip
    if at is not None:
        data[at] = byte
    buf = bytes(data[: max(0, len(data) - cut)])
    k = min(skip, len(frames) - 1)
    pos = min(starts[k], len(buf))
    fast = decode_batch(buf, pos, len(buf), first + k, limit, journal)
    general = decode_batch(bytearray(buf), pos, len(buf), first + k, limit, journal)
    assert fast == general
    out, stop, problem = fast
    assert stop == (starts[k + len(out)] if pos == starts[k] else pos)
    if at is None and not cut:
        assert len(out) == min(limit, len(frames) - k) and problem is None


def test_a_damaged_trailing_size_field_drops_its_frame_whatever_the_limit() -> None:
    """The loop reads a frame's trailing size field with the next frame: the last frame taken is checked on the
    way out, so a bad one is never returned, at the limit or at the end of the bytes."""
    frames = [frame(i, 1, 0, b"k" * (i % 3), b"v" * (5 + i)) for i in range(6)]
    data = bytearray(b"".join(frames))
    bad = sum(map(len, frames[:4])) - 1  # the last byte of frame 3's trailing size field
    data[bad] ^= 1
    for limit in range(1, 8):
        out, stop, problem = decode_batch(bytes(data), 0, len(data), 0, limit)
        assert [m.offset for m in out] == list(range(min(limit, 3)))
        if limit >= 4:
            assert stop == sum(map(len, frames[:3])) and problem is not None and not problem.incomplete
            assert "size field disagrees" in problem.reason
    out, stop, problem = decode_batch(bytes(data[: bad + 1]), 0, bad + 1, 0)  # ... also as the last bytes there are
    assert [m.offset for m in out] == [0, 1, 2] and "size field disagrees" in problem.reason  # type: ignore[union-attr]


def test_scanner_iteration_takes_messages_from_each_batch_and_follows_the_offset(tmp_path) -> None:  # type: ignore[no-untyped-def]
    with sej.Writer(tmp_path / "j") as w:
        for i in range(1000):
            w.append(os.urandom(i % 50), b"u%d" % (i % 7 * 999))
    with sej.Scanner(tmp_path / "j", 0, timeout=0, batch=64) as s:
        it = iter(s)
        got = [next(it) for _ in range(100)]
        assert s.offset == 100
        got.append(next(s))  # __next__ between: the same batches
        assert s.offset == 101
        got += list(it)
        assert [m.offset for m in got] == list(range(1000)) and s.offset == 1000
    s = sej.Scanner(tmp_path / "j", 0, timeout=0, batch=64)
    it = iter(s)
    assert next(it).offset == 0
    s.close()  # the batch not taken is dropped: nothing more comes, and a closed scanner says so
    with pytest.raises(ClosedError):
        next(it)
    assert s.offset == 1


def test_scanner_iteration_stops_at_a_damaged_trailing_size_field(tmp_path) -> None:  # type: ignore[no-untyped-def]
    with sej.Writer(tmp_path / "j") as w:
        for i in range(300):
            w.append(b"x" * (i % 13), b"k" * (i % 5))
    seg = sej.list_segments(tmp_path / "j")[0].path
    with open(seg, "rb") as f:
        data = bytearray(f.read())
    pos = 0
    for _ in range(200):  # the trailing size field of the frame of offset 199
        pos += 26 + data[pos + 17] + I32.unpack_from(data, pos + 18 + data[pos + 17])[0]
    data[pos - 1] ^= 0x40
    with open(seg, "wb") as f:
        f.write(data)
    got = []
    with sej.Scanner(tmp_path / "j", 0, timeout=0) as s, pytest.raises(CorruptionError, match="size field"):
        for m in s:
            got.append(m.offset)
    assert got == list(range(199))


@pytest.mark.parametrize("limit", [0, -1, -(2**62)])
@pytest.mark.parametrize("uniform", [True, False])
def test_a_limit_of_nothing_decodes_nothing(limit: int, uniform: bool) -> None:
    """No frame is taken when `limit` asks for none, whether the bytes start with frames of one size or not."""
    buf = b"".join(frame(i, 0, 0, b"k" if uniform else b"k" * (i % 3), b"v" if uniform else b"v" * (i % 5))
                   for i in range(6))  # fmt: skip
    assert decode_batch(buf, 0, len(buf), 0, limit) == ([], 0, None)
