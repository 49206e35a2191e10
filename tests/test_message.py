"""The codec's batch decoder against a plain reference decoder, on random frames and damage."""

from __future__ import annotations

import random
import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import sej
from sej.message import NO_TIMESTAMP, OVERHEAD, decode_batch, encode


def reference(buf: bytes, expect: int) -> tuple[list[tuple], int]:
    """Whole valid frames from the start of buf, the obvious way."""
    out, pos = [], 0
    while len(buf) - pos >= OVERHEAD:
        off, ts, typ, ks = struct.unpack_from(">QqBb", buf, pos)
        if off != expect or ks < 0 or pos + 22 + ks > len(buf):
            break
        (vs,) = struct.unpack_from(">i", buf, pos + 18 + ks)
        total = OVERHEAD + ks + vs
        if vs < 0 or pos + total > len(buf) or struct.unpack_from(">i", buf, pos + total - 4)[0] != total:
            break
        key = buf[pos + 18 : pos + 18 + ks]
        value = buf[pos + 22 + ks : pos + total - 4]
        out.append((off, None if ts == NO_TIMESTAMP else ts, typ, key, value))
        pos += total
        expect += 1
    return out, pos


def random_journal(rng: random.Random, n: int) -> bytes:
    frames = []
    sizes = (rng.randrange(0, 20), rng.randrange(0, 300))
    for off in range(n):
        if rng.random() < 0.15:  # mostly runs of equal sizes, sometimes a change
            sizes = (rng.randrange(0, 128), rng.randrange(0, 300))
        ts = NO_TIMESTAMP if rng.random() < 0.05 else rng.randrange(-(2**63) + 1, 2**63)
        frames.append(encode(off, ts, rng.randrange(256), rng.randbytes(sizes[0]), rng.randbytes(sizes[1])))
    return b"".join(frames)


@pytest.mark.parametrize("seed", range(30))
def test_decode_batch_matches_reference_on_damaged_random_journals(seed: int) -> None:
    rng = random.Random(seed)
    buf = bytearray(random_journal(rng, rng.randrange(1, 120)))
    for _ in range(rng.randrange(0, 3)):  # damage: flip, zero or cut
        at = rng.randrange(len(buf))
        kind = rng.choice(["flip", "zero", "cut"])
        if kind == "flip":
            buf[at] ^= 1 << rng.randrange(8)
        elif kind == "zero":
            span = rng.randrange(1, 40)
            buf[at : at + span] = bytes(len(buf[at : at + span]))
        else:
            del buf[at:]
            if not buf:
                buf += b"\0"
    data = bytes(buf)
    want, want_end = reference(data, 0)
    msgs, end, problem = decode_batch(data, 0, len(data), 0)
    assert [tuple(m) for m in msgs] == want
    assert end == want_end
    assert (problem is None) == (end == len(data))
    if problem is not None:
        assert problem.position == end


@pytest.mark.parametrize("seed", range(5))
def test_every_truncation_point_of_a_run_of_equal_frames(seed: int) -> None:
    rng = random.Random(seed)
    frames = [encode(i, 7, 1, b"kk", rng.randbytes(30)) for i in range(6)]
    data = b"".join(frames)
    for cut in range(len(data) + 1):
        msgs, end, problem = decode_batch(data, 0, cut, 0)
        whole = cut // len(frames[0])
        assert len(msgs) == whole and end == whole * len(frames[0])
        assert (problem is None) == (cut == end)
        if problem is not None:
            assert problem.incomplete


def test_limit_and_offset_check_inside_a_run() -> None:
    frames = [encode(i, 1, 0, b"k", b"v" * 10) for i in range(10)]
    data = b"".join(frames[:5]) + encode(99, 1, 0, b"k", b"v" * 10) + b"".join(frames[6:])
    msgs, end, problem = decode_batch(data, 0, len(data), 0, limit=3)
    assert [m.offset for m in msgs] == [0, 1, 2] and problem is None
    msgs, end, problem = decode_batch(data, 0, len(data), 0)
    assert [m.offset for m in msgs] == [0, 1, 2, 3, 4]
    assert problem is not None and not problem.incomplete and "found 99, expected 5" in problem.reason
    assert problem.position == end == 5 * len(frames[0])


def test_decode_of_memoryview_returns_bytes() -> None:
    frame = encode(3, None, 2, b"key", b"value")
    msg, end = sej.decode(memoryview(frame))
    assert msg == sej.Message(3, None, 2, b"key", b"value") and end == len(frame)
    assert type(msg.key) is bytes and type(msg.value) is bytes


@pytest.mark.parametrize("seed", range(30))
def test_walk_frames_matches_reference_on_damaged_random_journals(seed: int) -> None:
    from sej.index import SparseIndex
    from sej.segment import walk_frames

    rng = random.Random(1000 + seed)
    buf = bytearray(random_journal(rng, rng.randrange(1, 150)))
    if rng.random() < 0.7:
        at = rng.randrange(len(buf))
        buf[at] ^= 1 << rng.randrange(8)
    data = bytes(buf)
    want, want_end = reference(data, 0)
    f = walk_frames(data, 0, len(data), 0, 0, NO_TIMESTAMP, 0, SparseIndex(0))
    assert f.used == want_end and f.next_offset == len(want)
    assert (f.problem is None) == (want_end == len(data))
    stamps = [m[1] for m in want if m[1] is not None]
    assert f.max_ts == max(stamps, default=NO_TIMESTAMP)


def walk_reference(data: bytes, base: int, offset: int, next_entry: int, interval: int) -> tuple:
    """walk_frames the obvious way: frame by frame, an index entry at the first frame at or after next_entry."""
    from sej.frames import frame_at

    p, max_ts, entries = 0, NO_TIMESTAMP, []
    while (f := frame_at(data, p, len(data), offset)) is not None:
        _off, ts, _typ, ks, vs = f
        max_ts = max(max_ts, ts)
        if base + p >= next_entry:
            entries.append((offset, base + p, max_ts))
            next_entry = base + p + interval
        offset += 1
        p += OVERHEAD + ks + vs
    return p, offset, max_ts, next_entry, entries


def one_by_one(b: bytes, total: int, k: int, ks: int, vs: int, offset: int) -> int:
    """How many frames of a run, from the first, carry the next offsets and these sizes: frame by frame."""
    from sej.frames import CHECK_FORMAT, sized_struct

    same = sized_struct(CHECK_FORMAT, ks, vs)
    for j in range(k):
        off, _ts, fks, fvs, size = same.unpack_from(b, j * total)
        if off != offset + j or fks != ks or fvs != vs or size != total:
            return j
    return k


def record_runs(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int, int]]:
    """Make walk_frames record, for each run it checks, (where its column checks end it, where `one_by_one`
    ends it, its length)."""
    import sej.frames

    checked: list[tuple[int, int, int]] = []
    uniform = sej.frames._uniform

    def compared(b: bytes, total: int, k: int, ks: int, vs: int, offset: int) -> int:
        checked.append((uniform(b, total, k, ks, vs, offset), one_by_one(b, total, k, ks, vs, offset), k))
        return checked[-1][0]

    monkeypatch.setattr(sej.frames, "_uniform", compared)
    return checked


@settings(max_examples=200, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    runs=st.lists(st.tuples(st.integers(1, 300), st.integers(0, 5), st.integers(0, 60)), min_size=1, max_size=6),
    stamps=st.randoms(use_true_random=False),
    base=st.integers(0, 1 << 40),
    entry_at=st.integers(-5000, 5000),
    interval=st.sampled_from([-100, 0, 1, 7, 64, 100, 4096]),
    run_frames=st.sampled_from([1, 2, 3, 5, 300, 2048]),
    run_bytes=st.sampled_from([1, 100, 1000, 1 << 20]),
    run_after=st.sampled_from([0, 1, 2, 32]),
    first=st.sampled_from([0, 7, 250, 65_530, 2**32 - 300, 2**56 - 1000, 2**64 - 4000]),
    damage=st.lists(st.tuples(st.floats(0, 1, exclude_max=True), st.sampled_from(["flip", "cut", "offset", "field"]),
                              st.integers(0, 255)), max_size=2),
)  # fmt: skip
def test_walk_frames_in_runs_equals_frame_by_frame(
    runs,
    stamps,
    base,
    entry_at,
    interval,
    run_frames,
    run_bytes,
    run_after,
    first,
    damage,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The runs of equal frames walk_frames checks together (any run length, across index entries) give what a
    frame-by-frame walk gives: the same end, next offset, max timestamp, next entry, index entries and problem.
    The column checks of each run (`_uniform`) find the frame where it ends, as checking its frames one by one does."""
    import sej.frames
    from sej.index import SparseIndex

    monkeypatch.setattr(sej.frames, "RUN_FRAMES", run_frames)
    monkeypatch.setattr(sej.frames, "RUN_BYTES", run_bytes)
    monkeypatch.setattr(sej.frames, "RUN_AFTER", run_after)
    checked = record_runs(monkeypatch)
    frames, starts, off = [], [], first
    for count, ks, vs in runs:  # runs of frames of equal sizes
        for _ in range(count):
            ts = NO_TIMESTAMP if stamps.random() < 0.1 else stamps.randrange(-(2**63) + 1, 2**63)
            starts.append((sum(map(len, frames)), ks, OVERHEAD + ks + vs))
            frames.append(encode(off, ts, 3, bytes(ks), stamps.randbytes(vs)))
            off += 1
    buf = bytearray(b"".join(frames))
    for where, how, bits in damage:
        at = int(where * len(buf))
        if not buf:
            break
        if how == "flip":
            buf[at] ^= 0x41
        elif how == "cut":
            del buf[at:]
        elif how == "offset" and at + 8 <= len(buf):
            buf[at : at + 8] = struct.pack(">Q", first + int(where * (off - first)))  # an offset, or bytes like one
        elif how == "field":  # a bit of a checked field of one frame: its offset, key size, value size or size
            pos, ks, total = starts[int(where * len(starts))]
            fields = [*range(8), 17, *range(18 + ks, 22 + ks), *range(total - 4, total)]
            at = pos + fields[bits % len(fields)]
            if at < len(buf):
                buf[at] ^= 1 << (bits % 8)
    data = bytes(buf)
    next_entry = base + entry_at
    index = SparseIndex(first)
    got = sej.frames.walk_frames(data, 0, len(data), base, first, NO_TIMESTAMP, next_entry, index, interval)
    used, next_offset, max_ts, entry, entries = walk_reference(data, base, first, next_entry, interval)
    assert (got.used, got.next_offset, got.max_ts, got.next_entry) == (used, next_offset, max_ts, entry)
    assert [index._field(i, 0) for i in range(len(index))] == [e[0] for e in entries]
    assert [(index._field(i, 1), index._field(i, 2)) for i in range(len(index))] == [e[1:] for e in entries]
    assert (got.problem is None) == (used == len(data))
    assert all(columns == by_frame for columns, by_frame, _k in checked), checked


@pytest.mark.parametrize("run_frames", [2, 3, 2048])
@pytest.mark.parametrize("first", [250, 2**32 - 3, 2**64 - 9])
def test_every_bit_of_every_checked_field_in_a_run_is_caught(
    first: int, run_frames: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One bit flipped in the offset, key size, value size or size of any frame of a run of equal frames: the
    walk stops where a frame-by-frame walk stops, and the run's column checks (`_uniform`) end it where checking
    its frames one by one does."""
    import sej.frames
    from sej.index import SparseIndex

    checked = record_runs(monkeypatch)
    monkeypatch.setattr(sej.frames, "RUN_FRAMES", run_frames)
    monkeypatch.setattr(sej.frames, "RUN_AFTER", 1)
    ks, vs = 3, 5
    total = OVERHEAD + ks + vs
    clean = b"".join(encode(first + i, i, 1, b"k" * ks, b"v" * vs) for i in range(8))
    fields = [*range(8), 17, *range(18 + ks, 22 + ks), *range(total - 4, total)]
    for frame in range(2, 8):  # the first two start the run
        for field in fields:
            for bit in range(8):
                data = bytearray(clean)
                data[frame * total + field] ^= 1 << bit
                got = sej.frames.walk_frames(bytes(data), 0, len(data), 0, first, NO_TIMESTAMP, 0, SparseIndex(first))
                used, next_offset, _ts, _entry, _entries = walk_reference(bytes(data), 0, first, 0, 4096)
                assert (got.used, got.next_offset) == (used, next_offset) == (frame * total, first + frame)
    assert checked and all(columns == by_frame for columns, by_frame, _k in checked)
    assert any(columns < k for columns, _, k in checked)  # runs held damaged frames
