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


def _damage(rng: random.Random, data: bytearray, what: str, garbage: int = 40) -> None:
    """Damage `data` in place: a flipped bit, a cut, or up to `garbage` random bytes added (else nothing)."""
    if what == "flip" and data:
        data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
    elif what == "cut" and data:
        del data[rng.randrange(len(data)) :]
    elif what == "garbage":
        data += rng.randbytes(rng.randrange(1, garbage))


def _damaged(rng: random.Random, data: bytes) -> bytes:
    b = bytearray(data)
    _damage(rng, b, rng.choice(("flip", "cut", "garbage", "none", "none")))
    return bytes(b)


@settings(max_examples=300, deadline=None)
@given(seed=st.integers(0, 2**32 - 1))
def test_decode_pieces_is_decode_columns_of_each_piece_or_none(seed: int) -> None:
    rng = random.Random(seed)
    pieces, expects = [], []
    for _ in range(rng.randint(1, 6)):
        expect = rng.choice((0, 5, 2**40, 2**63 - 3, 2**63 - 40, 2**64 - 10))
        data = _frames(rng, rng.randint(0, 30), expect) if expect < 2**63 else sej.encode(expect, None, 0, b"", b"x")
        pieces.append(_damaged(rng, data) if rng.random() < 0.3 else data)
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


# -- hand-made parts of hostile segments and sidecars -------------------------------------------------------------


def _hostile_segment(rng: random.Random, d: str, idx: int) -> tuple[str, str | None, int, list[int], int]:
    """A segment file of up to 25 frames (offsets near 2**63 and 2**64 too), damaged in any field or not, and maybe
    a checksum file of its bytes (or of the undamaged ones, or damaged itself). Returns (path, sums, first offset,
    the frames' bounds, size)."""
    from sej.checksum import Hasher, header

    first = rng.choice((0, 7, 2**40, 2**63 - 5, 2**63 - 1, 2**63, 2**64 - 3))
    frames, bounds = [], [0]
    for i in range(rng.randint(0, 25)):
        key, value = rng.randbytes(rng.choice((0, 1, 3, 127))), rng.randbytes(rng.choice((0, 1, 10, 200, 2999)))
        f = sej.encode((first + i) % 2**64, rng.choice((None, 0, 10**18)), rng.randrange(256), key, value)
        frames.append(f)
        bounds.append(bounds[-1] + len(f))
    n, data = len(frames), bytearray(b"".join(frames))
    what = rng.choice(["none"] * 5 + ["flip", "cut", "garbage", "key size", "value size", "offset"])
    _damage(rng, data, what, garbage=60)
    if what == "key size" and n:
        data[bounds[rng.randrange(n)] + 17] = rng.randrange(128, 256)  # negative
    elif what == "value size" and n:
        b = bounds[rng.randrange(n)]
        at = b + 18 + data[b + 17]
        data[at : at + 4] = rng.choice((rng.randrange(2**31, 2**32), rng.randrange(2**20))).to_bytes(4, "big")
    elif what == "offset" and n:
        b = bounds[rng.randrange(n)]
        data[b : b + 8] = rng.randrange(2**64).to_bytes(8, "big")
    path = os.path.join(d, f"seg{idx}.jnl")
    with open(path, "wb") as f:
        f.write(data)
    sums = None
    if rng.random() < 0.6:
        sums = os.path.join(d, f"seg{idx}.sum")
        h, records, pos = Hasher(), b"", 0
        src = bytes(data) if rng.random() < 0.7 else b"".join(frames)
        while pos < len(src):
            step = rng.choice((1, 50, 1000, 70000, len(src)))
            records += h.update(src[pos : pos + step])
            pos += step
        body = bytearray(header(first if rng.random() < 0.9 else first + 1) + records)
        spoil = rng.choice(["ok"] * 6 + ["cut", "flip", "past the end", "none", "torn"])
        if spoil == "cut" and len(body) > 16:
            del body[16 + 16 * rng.randrange((len(body) - 16) // 16 + 1) :]
        elif spoil == "flip" and len(body) > 16:
            body[rng.randrange(16, len(body))] ^= 1
        elif spoil == "past the end":
            body += (len(src) + 100).to_bytes(8, "big") + b"\0" * 8
        elif spoil == "torn":
            body += b"\1\2\3"
        if spoil != "none":
            with open(sums, "wb") as f:
                f.write(body)
    return path, sums, first, bounds, len(data)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1))
def test_hand_made_parts_of_hostile_segments_read_as_each_part_alone(seed: int) -> None:
    """Any byte ranges (cut at frames or not, past the file's end), first offsets right or wrong, lo, hi and upto
    around the frames, types, missing files: read together or alone, the same rows, error and warnings."""
    rng = random.Random(seed)
    with tempfile.TemporaryDirectory() as d:
        parts = []
        types = rng.choice((None, None, (*range(11), *range(100, 200)), ()))
        root = rng.choice((None, None, d))
        for s in range(rng.randint(1, 8)):
            path, sums, first, bounds, size = _hostile_segment(rng, d, s)
            cuts = sorted({0, bounds[-1], *rng.sample(bounds, k=min(len(bounds), rng.randint(0, 3)))})
            if rng.random() < 0.2:
                cuts = sorted({*cuts, rng.randrange(size + 1)})
            for a, b in zip(cuts, cuts[1:] + ([] if rng.random() < 0.9 else [cuts[-1]])):
                pfirst = first + (bounds.index(a) if a in bounds else 0)
                if rng.random() < 0.1:
                    pfirst = max(0, pfirst + rng.choice((-1, 1)))
                nxt = first + (bounds.index(b) if b in bounds else len(bounds) - 1)
                lo = rng.choice((pfirst, pfirst, 0, pfirst + rng.randrange(3)))
                hi = max(pfirst + 1, rng.choice((nxt, nxt, 2**64, nxt + rng.randrange(-2, 3), pfirst + 1)))
                upto = rng.choice((None, nxt, nxt + 1, pfirst, nxt - 1) if rng.random() < 0.3 else (None, nxt))
                if rng.random() < 0.1:
                    b = max(a, min(size + rng.randrange(40), b + rng.randrange(-5, 40)))
                parts.append(SegmentPart(path=path, client=rng.choice((None, f"c{s}")), shard=f"s{s}", root=root,
                                         first=pfirst, start=a, end=b, lo=lo, hi=hi, types=types, upto=upto,
                                         missing_ok=rng.random() < 0.5, sums=sums, segment_first=first))  # fmt: skip
        if rng.random() < 0.5:
            rng.shuffle(parts)
        if parts and rng.random() < 0.2:
            gone = rng.choice(parts).path
            if os.path.exists(gone):
                os.remove(gone)
        alone = _outcome(lambda: (b for p in parts for b in read_part(p)))
        packed = _outcome(lambda: read_packed(tuple(parts)))
    assert packed == alone


# -- the reused Spark worker's collector ------------------------------------------------------------------------


def test_read_partition_freezes_the_collector_only_in_a_reused_spark_worker(tmp_path, monkeypatch) -> None:
    """pyspark's daemon runs gc.collect() after every task of a reused worker; read_partition freezes what is alive
    at its first read there, and nowhere else."""
    import gc

    from sej.spark import read as spark_read

    path = str(tmp_path / "j")
    with sej.Writer(path) as w:
        w.append(b"x")
    parts = plan_range(JournalSource("", path, None, ""), 0, 1)
    assert gc.get_freeze_count() == 0
    monkeypatch.setattr(spark_read, "_settled", False)
    monkeypatch.delenv("SPARK_REUSE_WORKER", raising=False)
    assert [b.num_rows for b in read_partition(parts[0])] == [1]
    assert gc.get_freeze_count() == 0  # a user's process: untouched
    monkeypatch.setattr(spark_read, "_settled", False)
    monkeypatch.setenv("SPARK_REUSE_WORKER", "1")
    monkeypatch.setenv("PYTHON_WORKER_FACTORY_SECRET", "x")
    try:
        assert [b.num_rows for b in read_partition(parts[0])] == [1]
        frozen = gc.get_freeze_count()
        assert frozen > 0
        assert [b.num_rows for b in read_partition(parts[0])] == [1]
        assert gc.get_freeze_count() == frozen  # once per process
        gc.unfreeze()
        monkeypatch.setattr(spark_read, "_settled", False)
        monkeypatch.delenv("PYTHON_WORKER_FACTORY_SECRET")
        monkeypatch.setenv("PYTHON_UNIX_DOMAIN_ENABLED", "true")  # a worker over a Unix socket has no secret
        assert [b.num_rows for b in read_partition(parts[0])] == [1]
        assert gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()


def test_a_spark_worker_that_reads_a_journal_freezes_its_objects(spark, tmp_path) -> None:
    """In a real local Spark: a data source's read() in Spark's Python worker (as the sej source's) finds the
    worker's objects frozen after read_partition (Spark sets SPARK_REUSE_WORKER and PYTHON_WORKER_FACTORY_SECRET
    there, as _settle_worker expects)."""
    from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

    path = str(tmp_path / "j")
    with sej.Writer(path) as w:
        for i in range(100):
            w.append(b"v%d" % i)

    class Reader(DataSourceReader):
        def partitions(self) -> list[InputPartition]:
            return [InputPartition(path)]

        def read(self, partition):  # type: ignore[no-untyped-def]
            import gc

            from sej.spark.plan import JournalSource, plan_range
            from sej.spark.read import read_partition

            rows = sum(b.num_rows for p in plan_range(JournalSource("", partition.value, None, ""), 0, 100)
                       for b in read_partition(p))  # fmt: skip
            yield (rows, gc.get_freeze_count())

    class Frozen(DataSource):
        @classmethod
        def name(cls) -> str:
            return "sej_test_frozen"

        def schema(self) -> str:
            return "rows int, frozen long"

        def reader(self, schema):  # type: ignore[no-untyped-def]
            return Reader()

    spark.dataSource.register(Frozen)  # type: ignore[attr-defined]
    [(rows, frozen)] = spark.read.format("sej_test_frozen").load().collect()  # type: ignore[attr-defined]
    assert rows == 100 and frozen > 0
