"""Small parts read together (read_packed, decode_pieces) give what reading each on its own (read_part,
decode_columns) gives: the same rows in the same order, the same error or warning, whatever the damage."""

from __future__ import annotations

import os
import random
import tempfile
import warnings

import pytest

pytest.importorskip("pyarrow")
pytest.importorskip("pyspark")

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

import sej  # noqa: E402
from sej.columns import decode_columns, decode_pieces  # noqa: E402
from sej.layout import list_segments, sum_path  # noqa: E402
from sej.spark.plan import JournalSource, PackedPart, SegmentPart, plan_range  # noqa: E402
from sej.spark.read import GROUP_BYTES, read_packed, read_part, read_partition  # noqa: E402


def _messages(rng: random.Random, n: int) -> list[tuple[int, bytes, bytes]]:
    """(type, key, value) of n messages of mixed sizes, now and then a run of one size."""
    out: list[tuple[int, bytes, bytes]] = []
    while len(out) < n:
        ks, vs = rng.choice((0, 3, 8, 40, 127)), rng.choice((0, 1, 20, 100, 300, 2000, rng.randrange(600)))
        for _ in range(min(rng.choice((1, 1, 3, 20)), n - len(out))):
            out.append((rng.randrange(4), rng.randbytes(ks), rng.randbytes(vs)))
    return out


def _frames(rng: random.Random, n: int, first: int) -> bytes:
    return b"".join(sej.encode(first + i, rng.choice((None, 0, 10**18)), t, k, v)
                    for i, (t, k, v) in enumerate(_messages(rng, n)))  # fmt: skip


# -- decode_pieces against decode_columns ----------------------------------------------------------------------


def _damage(rng: random.Random, data: bytes) -> bytes:
    b = bytearray(data)
    what = rng.choice(("flip", "cut", "garbage", "none", "none"))
    if what == "flip" and b:
        b[rng.randrange(len(b))] ^= 1 << rng.randrange(8)
    elif what == "cut" and b:
        del b[rng.randrange(len(b)) :]
    elif what == "garbage":
        b += rng.randbytes(rng.randrange(1, 40))
    return bytes(b)


@settings(max_examples=300, deadline=None)
@given(seed=st.integers(0, 2**32 - 1))
def test_decode_pieces_is_decode_columns_of_each_piece_or_none(seed: int) -> None:
    rng = random.Random(seed)
    pieces, expects = [], []
    for _ in range(rng.randint(1, 6)):
        expect = rng.choice((0, 5, 2**40, 2**63 - 3, 2**63 - 40, 2**64 - 10))
        data = _frames(rng, rng.randint(0, 30), expect) if expect < 2**63 else sej.encode(expect, None, 0, b"", b"x")
        pieces.append(_damage(rng, data) if rng.random() < 0.3 else data)
        expects.append(rng.choice((expect, expect, expect + 1, max(0, expect - 1))))
    buf = bytearray(b"".join(pieces) + rng.randbytes(rng.randrange(3)))  # bytes past the last piece: not read
    ends, at = [], 0
    for p in pieces:
        at += len(p)
        ends.append(at)

    got = decode_pieces(buf, ends, expects)

    alone, whole, at = [], True, 0
    for end, expect in zip(ends, expects):
        try:
            cols, stop, problem = decode_columns(bytes(buf), at, end, expect)
        except sej.CorruptionError:  # an offset past a signed long
            whole = False
            break
        whole = whole and stop == end and problem is None
        alone.append(cols)
        at = end
    if not whole or all(c is None for c in alone):
        assert got is None
        return
    assert got is not None
    cols, counts = got
    assert counts == [0 if c is None else len(c.offset) for c in alone]
    want = [r for c in alone if c is not None for r in zip(*(a.to_pylist() for a in c))]
    assert list(zip(*(a.to_pylist() for a in cols))) == want


# -- read_packed against read_part ----------------------------------------------------------------------------


def _outcome(batches_of):  # type: ignore[no-untyped-def]
    """(rows, error, warnings) of reading: every row of every batch as a dict, the error raised (type and text)."""
    rows: list[dict[str, object]] = []
    error = None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            for b in batches_of():
                rows += b.to_pylist()
        except Exception as e:  # noqa: BLE001 - any error must be the same both ways
            error = (type(e), str(e))
    return rows, error, [(w.category, str(w.message)) for w in caught]


def _journals(rng: random.Random, root: str, checked: bool) -> list[JournalSource]:
    out = []
    for j in range(rng.randint(1, 5)):
        name = f"c{j}.ev.{j}"
        path = os.path.join(root, name)
        with sej.Writer(path, segment_size=rng.choice((600, 3000, 20000))) as w:
            for t, k, v in _messages(rng, rng.randint(0, 60)):
                w.append(v, key=k, type=t)
        if not checked:  # as an old or Go-written journal: read unchecked
            for seg in list_segments(path):
                os.remove(sum_path(path, seg.first_offset))
        out.append(JournalSource(name, path, f"c{j}", f"ev.{j}", root if rng.random() < 0.3 else None))
    return out


def _spoil(rng: random.Random, parts: list[SegmentPart]) -> None:
    """Damage a few of the parts' segments (and checksum files): a flipped bit, a cut, garbage, a deletion."""
    for p in rng.sample(parts, k=min(len(parts), rng.choice((0, 0, 1, 2)))):
        target = p.sums if p.sums and rng.random() < 0.3 else p.path
        if not os.path.exists(target):
            continue
        size = os.path.getsize(target)
        what = rng.choice(("flip", "cut", "garbage", "delete"))
        if what == "delete":
            os.remove(target)
        elif what == "cut":
            os.truncate(target, rng.randrange(size + 1))
        elif what == "garbage":
            with open(target, "ab") as f:
                f.write(rng.randbytes(rng.randrange(1, 30)))
        elif size:
            with open(target, "r+b") as f:
                at = rng.randrange(size)
                f.seek(at)
                byte = f.read(1)[0]
                f.seek(at)
                f.write(bytes((byte ^ (1 << rng.randrange(8)),)))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1))
def test_packed_parts_read_as_each_part_alone(seed: int) -> None:
    rng = random.Random(seed)
    with tempfile.TemporaryDirectory() as root:
        parts: list[SegmentPart] = []
        types = rng.choice((None, None, (0, 2)))
        for src in _journals(rng, root, checked=rng.random() < 0.8):
            segs = list_segments(src.path)
            if not segs:
                continue
            last = sej.next_offset(src.path)
            lo = rng.choice((segs[0].first_offset, segs[0].first_offset, rng.randint(segs[0].first_offset, last)))
            hi = rng.choice((last, last, rng.randint(lo, last)))
            parts += plan_range(src, lo, hi, types=types, max_bytes=rng.choice((10**6, 2000)),
                                missing_ok=rng.random() < 0.5, verify=True)  # fmt: skip
        rng.shuffle(parts)
        _spoil(rng, parts)
        alone = _outcome(lambda: (b for p in parts for b in read_part(p)))
        packed = _outcome(lambda: read_packed(tuple(parts)))
    assert packed == alone


def test_many_small_segments_of_many_journals_are_read_in_few_batches(tmp_path) -> None:
    """The point of reading together: 40 journals of 4 small segments each come back in a few batches, with
    every row and the client and shard of its journal."""
    parts, want = [], []
    for j in range(40):
        path = str(tmp_path / f"c{j}.ev.{j}")
        with sej.Writer(path, segment_size=500) as w:
            for i in range(50):
                w.append(b"v%d" % i * (i % 7), key=b"k%d" % j)
        want += [(f"c{j}", f"ev.{j}", i) for i in range(50)]
        parts += plan_range(JournalSource(f"c{j}.ev.{j}", path, f"c{j}", f"ev.{j}"), 0, 50, verify=True)
    assert len(parts) >= 160
    batches = list(read_partition(PackedPart(tuple(parts))))
    assert len(batches) <= sum(p.end - p.start for p in parts) // (GROUP_BYTES // 2) + 1
    rows = [(r["client"], r["shard"], r["offset"]) for b in batches for r in b.to_pylist()]
    assert rows == want
