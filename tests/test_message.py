"""The codec's batch decoder against a plain reference decoder, on random frames and damage."""

from __future__ import annotations

import random
import struct

import pytest

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
