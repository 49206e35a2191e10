"""read_part and decode_columns (the Spark source's decoder) against sej's reference decoders, without Spark."""

from __future__ import annotations

import os
import random
import warnings

import pytest

pytest.importorskip("pyarrow")
pytest.importorskip("pyspark")

import sej  # noqa: E402
from sej.errors import CorruptionError, CorruptionWarning, DataLossError  # noqa: E402
from sej.message import NO_TIMESTAMP, check_frame, decode_batch  # noqa: E402
from sej import columns as read  # noqa: E402  (the decoder and chunked reader behind read_part)
from sej.spark.plan import JournalSource as Source  # noqa: E402
from sej.spark.plan import SegmentPart, plan_range  # noqa: E402
from sej.columns import decode_columns, micros  # noqa: E402
from sej.spark.read import read_part  # noqa: E402
from sej.spark.schema import ARROW_SCHEMA  # noqa: E402

Row = tuple[int, "int | None", int, bytes, bytes]  # offset, timestamp (us), type, key, value

RUN_LENGTHS = (1, 2, 3, 15, 16, 17, 63, 64, 65, 80, 200, 700)


def random_messages(rng: random.Random, n: int) -> list[tuple[int | None, int, bytes, bytes]]:
    """(timestamp, type, key, value) of n messages in runs of equal key and value sizes (of random lengths)."""
    out: list[tuple[int | None, int, bytes, bytes]] = []
    while len(out) < n:
        ks = rng.choice((0, 0, 1, 8, 8, 127, rng.randrange(128)))
        vs = rng.choice((0, 1, 100, 100, rng.randrange(300), rng.randrange(5000)))
        for _ in range(min(rng.choice(RUN_LENGTHS), n - len(out))):
            ts = rng.choice(
                (None, 0, -1, -1500, -(10**15) - 1, 1_700_000_000_123_456_789, rng.randrange(-(2**62), 2**62))
            )
            out.append((ts, rng.randrange(256), rng.randbytes(ks), rng.randbytes(vs)))
    return out


def frames(msgs: list[tuple[int | None, int, bytes, bytes]], first: int = 0) -> bytes:
    return b"".join(sej.encode(first + i, ts, typ, k, v) for i, (ts, typ, k, v) in enumerate(msgs))


def column_rows(cols: read.Columns | None) -> list[tuple[int, int, int, bytes, bytes]]:
    """Decoded columns as (offset, raw timestamp, type, key, value) tuples."""
    if cols is None:
        return []
    return list(zip(*(c.to_pylist() for c in cols)))


def batch_rows(batches: list) -> list[Row]:  # type: ignore[type-arg]
    """Record batches' (offset, timestamp in us, type, key, value) rows, in order."""
    out: list[Row] = []
    for b in batches:
        assert b.schema.equals(ARROW_SCHEMA)
        ts = b.column("timestamp").cast("int64").to_pylist()
        cols = [b.column(c).to_pylist() for c in ("offset", "type", "key", "value")]
        out += [(o, t, typ, k, v) for o, t, typ, k, v in zip(cols[0], ts, cols[1], cols[2], cols[3])]
    return out


def scanner_rows(path: str) -> list[Row]:
    with sej.Scanner(path, "first", timeout=0) as s:
        return [(m.offset, None if m.timestamp is None else m.timestamp // 1000, m.type, m.key, m.value) for m in s]


def part_rows(parts: list[SegmentPart]) -> list[Row]:
    return batch_rows([b for p in parts for b in read_part(p)])


# -- decode_columns against decode_batch --------------------------------------------------


def assert_same_decode(data: bytes, pos: int, end: int, expect: int) -> None:
    msgs, used, problem = decode_batch(data, pos, end, expect)
    want = [(m.offset, NO_TIMESTAMP if m.timestamp is None else m.timestamp, m.type, m.key, m.value) for m in msgs]
    cols, got_used, got_problem = decode_columns(data, pos, end, expect)
    assert column_rows(cols) == want
    assert (got_used, got_problem) == (used, problem)


@pytest.mark.parametrize("seed", range(40))
def test_decode_columns_equals_decode_batch_on_whole_cut_and_corrupted_buffers(seed: int) -> None:
    rng = random.Random(seed)
    first = rng.choice((0, 7, 2**40))
    data = frames(random_messages(rng, rng.randrange(1, 1500)), first)
    assert_same_decode(data, 0, len(data), first)
    for _ in range(6):  # cut anywhere, so the last frame may be partial
        assert_same_decode(data, 0, rng.randrange(len(data) + 1), first)
    for _ in range(12):  # one byte changed anywhere: a field, a key or value byte, a size
        bad = bytearray(data)
        bad[rng.randrange(len(bad))] ^= rng.randrange(1, 256)
        assert_same_decode(bytes(bad), 0, len(bad), first)
    assert_same_decode(data, 0, len(data), first + 1)  # offsets out of sequence from the first frame


def test_decode_columns_of_a_long_uniform_run_with_one_bad_frame_in_each_field(monkeypatch) -> None:
    runs: list[tuple[int, int]] = []  # (frames in the buffer from the run's start, frames valid) of each stride check

    def spy(data, pos, end, expect):  # type: ignore[no-untyped-def]
        got = real_run(data, pos, end, expect)
        if got is not None:
            runs.append(((end - pos) // got[1], got[0]))
        return got

    real_run = read._stride_run
    monkeypatch.setattr(read, "_stride_run", spy)
    rng = random.Random(1)
    msgs = [(1_700_000_000_000_000_000 + i, i % 7, b"key-0001", rng.randbytes(100)) for i in range(5000)]
    data = frames(msgs)
    assert_same_decode(data, 0, len(data), 0)
    # All of them in one stride check.
    assert runs == [(5000, 5000)]
    runs.clear()
    frame = 134
    for at in (0, 1, 15, 16, 63, 64, 65, 577, 4999):
        for field, delta in ((7, 1), (17, 1), (17, 0x80), (21, 1), (18 + 8, 0x80), (frame - 1, 1), (frame - 4, 0x80)):
            bad = bytearray(data)
            bad[at * frame + field] ^= delta
            assert_same_decode(bytes(bad), 0, len(bad), 0)
    assert any(0 < k < m for m, k in runs)  # stride checks that stopped at the bad frame
    assert_same_decode(data, 0, len(data) - 1, 0)  # partial last frame
    assert_same_decode(data, 5 * frame, len(data), 5)  # starting inside the buffer
    assert_same_decode(b"", 0, 0, 0)


def test_micros_rounds_down_and_makes_the_sentinel_null() -> None:
    import pyarrow as pa

    ns = [0, 1, 999, 1000, -1, -999, -1000, -1001, -1500, NO_TIMESTAMP, 2**63 - 1, 1_700_000_000_123_456_789]
    got = micros(pa.array(ns, pa.int64())).cast(pa.int64()).to_pylist()
    assert got == [None if t == NO_TIMESTAMP else t // 1000 for t in ns]
    assert micros(pa.array([5000, 7000], pa.int64())).cast(pa.int64()).to_pylist() == [5, 7]


# -- read_part against the Scanner ---------------------------------------------------------


def write_journal(path: str, msgs: list[tuple[int | None, int, bytes, bytes]], segment_size: int) -> None:
    with sej.Writer(path, segment_size=segment_size) as w:
        for ts, typ, k, v in msgs:
            w.append(v, key=k, type=typ, timestamp=NO_TIMESTAMP if ts is None else ts)


@pytest.fixture(params=[None, 4096, 333], ids=["chunk-default", "chunk-4096", "chunk-333"])
def chunk(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> int:
    """READ_CHUNK as is, or small, so that frames straddle chunks and big frames need a longer read."""
    if request.param is not None:
        monkeypatch.setattr(read, "READ_CHUNK", request.param)
    return int(read.READ_CHUNK)


def test_read_part_equals_the_scanner_for_mixed_sizes_and_cut_partitions(tmp_path, chunk: int) -> None:
    path = str(tmp_path / "j")
    write_journal(path, random_messages(random.Random(5), 3000), segment_size=200_000)
    want = scanner_rows(path)
    assert {r[1] for r in want} >= {None, 0, -1, -2}  # NO_TIMESTAMP, and -1500 ns rounded down
    assert any(r[3] == b"" for r in want) and len(sej.list_segments(path)) > 2
    src = Source("j", path, None, "j")
    whole = plan_range(src, 0, len(want))
    assert part_rows(whole) == want
    cut = plan_range(src, 0, len(want), max_bytes=20_000)  # segments split at index entries: mid-segment starts
    assert len(cut) > 2 * len(whole) and any(p.start > 0 for p in cut)
    assert part_rows(cut) == want
    lo, hi = 777, 2345
    assert part_rows(plan_range(src, lo, hi, max_bytes=20_000)) == want[lo:hi]
    types = (3, 200, 255)
    got = part_rows(plan_range(src, lo, hi, types=types, max_bytes=20_000))
    assert got == [r for r in want[lo:hi] if r[2] in types] and got


def test_read_part_fills_client_and_shard_on_every_row(tmp_path) -> None:
    path = str(tmp_path / "j")
    write_journal(path, [(1000 * i, 0, b"k", b"v%d" % i) for i in range(100)], segment_size=1 << 20)
    for client in (None, "edge-1"):
        (part,) = plan_range(Source("x", path, client, "p.2.001"), 0, 100)
        batches = list(read_part(part))
        assert sum(b.num_rows for b in batches) == 100
        for b in batches:
            assert b.column("client").to_pylist() == [client] * b.num_rows
            assert b.column("shard").to_pylist() == ["p.2.001"] * b.num_rows


def test_read_part_stops_before_a_partial_last_frame(tmp_path, chunk: int) -> None:
    path = str(tmp_path / "j")
    rng = random.Random(2)
    write_journal(path, [(i, 1, b"key", rng.randbytes(100)) for i in range(500)], segment_size=1 << 20)
    want = scanner_rows(path)
    seg = sej.list_segments(path)[-1].path
    whole = sej.encode(500, 1, 1, b"key", b"x" * 100)
    for cut in (1, 17, 30, len(whole) - 1):
        with open(seg, "rb+") as f:
            f.truncate(500 * 129)
            f.seek(0, os.SEEK_END)
            f.write(whole[:cut])
        assert sej.next_offset(path) == 500  # the writer is mid-append: message 500 is not there yet
        (part,) = plan_range(Source("j", path, None, "j"), 0, 500)
        assert part.end == 500 * 129 + cut
        assert part_rows([part]) == want
        (beyond,) = plan_range(Source("j", path, None, "j"), 0, 501)  # a plan that claims message 500
        with pytest.raises(CorruptionError, match="end at offset 500, before offset 501"):
            part_rows([beyond])


def test_a_size_field_grown_past_a_sealed_segment_is_corruption_not_an_unfinished_message(tmp_path) -> None:
    path = str(tmp_path / "j")
    write_journal(path, [(i, 1, b"key", b"v" * 100) for i in range(300)], segment_size=10_000)
    segs = sej.list_segments(path)
    assert len(segs) >= 3
    sealed = segs[0]
    frame = 129  # every frame here: 8 offset + 8 ts + 1 type + 1 key size + 3 key + 4 value size + 100 + 4 size
    n = os.path.getsize(sealed.path) // frame
    with open(sealed.path, "r+b") as f:  # the last frame's value size now runs past the end of the file
        f.seek((n - 1) * frame + 18 + 3)
        f.write((10**6).to_bytes(4, "big"))
    parts = plan_range(Source("j", path, None, "j"), 0, sej.next_offset(path))
    with pytest.raises(CorruptionError, match=f"end at offset {n - 1}, before offset {n}"):
        part_rows(parts)


@pytest.mark.parametrize("where", ["offset", "key_size", "value_size", "size"])
def test_a_corrupt_frame_raises_corruption_error_at_its_position(tmp_path, chunk: int, where: str) -> None:
    path = str(tmp_path / "j")
    rng = random.Random(3)
    write_journal(path, [(i, 1, b"key-0001", rng.randbytes(100)) for i in range(3000)], segment_size=1 << 30)
    seg = sej.list_segments(path)[0].path
    bad_at, frame = 2222, 134
    # Sizes turned negative (a size that grew would read as a frame running past the end: unfinished).
    changes = {"offset": (7, 0x41), "key_size": (17, 0x80), "value_size": (26, 0x80), "size": (frame - 1, 1)}
    field, delta = changes[where]
    with open(seg, "rb+") as f:
        data = bytearray(f.read())
        data[bad_at * frame + field] ^= delta
        f.seek(0)
        f.write(data)
    problem = check_frame(data, bad_at * frame, len(data), bad_at)
    assert not isinstance(problem, int) and not problem.incomplete
    (part,) = plan_range(Source("j", path, None, "j"), 0, 3000)
    rows: list[Row] = []
    with pytest.raises(CorruptionError) as e:
        for b in read_part(part):
            rows += batch_rows([b])
    assert (e.value.path, e.value.position, e.value.reason) == (seg, bad_at * frame, problem.reason)
    assert [r[0] for r in rows] == list(range(len(rows))) and len(rows) <= bad_at
    # A partition that ends before the bad frame reads without error.
    (early,) = plan_range(Source("j", path, None, "j"), 0, 100)
    if chunk < bad_at * frame:
        assert [r[0] for r in part_rows([early])] == list(range(100))


def test_a_deleted_segment_is_skipped_with_missing_ok_and_data_loss_otherwise(tmp_path) -> None:
    path = str(tmp_path / "j")
    write_journal(path, [(i, 0, b"", b"v") for i in range(10)], segment_size=1 << 20)
    (part,) = plan_range(Source("j", path, None, "j"), 0, 10)
    kw = {k: getattr(part, k) for k in ("path", "client", "shard", "first", "start", "end", "lo", "hi", "types")}
    os.unlink(part.path)
    with pytest.raises(DataLossError, match="deleted before it was read"):
        list(read_part(part))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert list(read_part(SegmentPart(**kw, missing_ok=True))) == []
    assert [w.category for w in caught] == [CorruptionWarning]
