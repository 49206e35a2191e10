"""Option verifyChecksums of the Spark source: every flipped byte is caught before its rows are yielded.

The executor's read function (read_part) is driven directly for the 1,000-flip runs, on a journal and
on a hub root; real Spark reads (batch and streaming) check the option end to end.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

pytest.importorskip("pyarrow")
pytest.importorskip("pyspark")

import sej  # noqa: E402
from sej.checksum import RECORD  # noqa: E402
from sej.errors import ChecksumError, CorruptionError  # noqa: E402
from sej.layout import list_segments, sum_path  # noqa: E402
from sej import columns as read  # noqa: E402  (the chunked reader behind read_part)
from sej.spark.options import VERIFY_CHECKSUMS  # noqa: E402
from sej.spark.plan import JournalSource, SegmentPart, plan_range  # noqa: E402
from sej.spark.read import read_part  # noqa: E402
from testing.flips import Flip, copy_to_hub, count_kinds, flip, flips, write_journal  # noqa: E402

from .test_spark_stream import run_available_now, sink_rows  # noqa: E402
from .test_vectors import build_go_journal  # noqa: E402

Rows = list[tuple[int, bytes, bytes]]


def plan(dir: str, max_bytes: int = 40_000, verify: bool = True) -> list[SegmentPart]:
    """Partitions of the whole journal; small `max_bytes` cuts segments at index entries (mid-block starts)."""
    src = JournalSource("ev", dir, None, "ev")
    return plan_range(src, 0, sej.next_offset(dir), max_bytes=max_bytes, verify=verify)


def rows_of(part: SegmentPart, out: Rows) -> None:
    """Read a partition, appending its rows to `out` as they are yielded (so an error keeps what came before)."""
    for b in read_part(part):
        out += zip(b.column("offset").to_pylist(), b.column("key").to_pylist(), b.column("value").to_pylist())


def check_flips(dir: str, msgs: list[tuple[bytes, bytes]], count: int, seed: int) -> dict[str, int]:
    parts = plan(dir)
    assert any(p.start > 0 for p in parts), "some partitions must start mid-segment"
    caught: dict[str, int] = {}
    for f in flips(dir, count, seed):
        errors = []
        for p in parts:
            if p.path != f.segment.path:
                continue
            got: Rows = []
            try:
                rows_of(p, got)
            except CorruptionError as e:
                errors.append((p, e))
            # Nothing damaged was yielded: every row is the message written.
            assert [(k, v) for _, k, v in got] == [msgs[o] for o, _, _ in got], f
            assert [o for o, _, _ in got] == list(range(p.first, p.first + len(got))), f
        assert errors, f"no partition of {f.segment.path} failed for {f}"
        if f.kind != "sums":
            # The partition holding the byte fails, with the byte in the range it names.
            holding = [(p, e) for p, e in errors if p.start <= f.pos < p.end]
            assert holding, (f, errors)
            p, e = holding[0]
            if isinstance(e, ChecksumError):
                assert e.start <= f.pos < e.end and e.offsets is not None, (f, e)
        count_kinds(caught, f)
    return caught


@pytest.fixture(params=[None, 333], ids=["chunk-default", "chunk-333"])
def chunk(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> int:
    """READ_CHUNK as is, or small, so that checks run chunk by chunk, mid-block."""
    if request.param is not None:
        monkeypatch.setattr(read, "READ_CHUNK", request.param)
    return int(read.READ_CHUNK)


@pytest.mark.slow
def test_every_flipped_byte_fails_its_partition_on_a_journal(tmp_path: Path, chunk: int) -> None:
    d = str(tmp_path / "ev")
    msgs = write_journal(d)
    caught = check_flips(d, msgs, 1000, seed=41)
    assert sum(caught.values()) == 1000 and len(caught) == 4, caught
    got: Rows = []
    for p in plan(d):
        rows_of(p, got)
    assert [(k, v) for _, k, v in got] == msgs  # restored: the verified read is the journal


@pytest.mark.slow
def test_every_flipped_byte_fails_its_partition_on_a_hub_root(tmp_path: Path) -> None:
    msgs = write_journal(str(tmp_path / "producer" / "ev"))
    d = copy_to_hub(tmp_path / "producer", tmp_path / "hub")
    caught = check_flips(d, msgs, 1000, seed=42)
    assert sum(caught.values()) == 1000 and len(caught) == 4, caught


def test_without_the_option_a_flipped_value_reads_as_written_on_disk(tmp_path: Path) -> None:
    d = str(tmp_path / "ev")
    msgs = write_journal(d, n=300)
    (seg, *_) = list_segments(d)
    f = Flip(d, seg.path, 1000, "value", 0)
    f.apply()
    got: Rows = []
    for p in plan(d, verify=False):
        rows_of(p, got)
    assert len(got) == len(msgs) and [(k, v) for _, k, v in got] != msgs  # the damage goes unseen
    with pytest.raises(ChecksumError, match="checksum mismatch"):
        for p in plan(d):
            rows_of(p, [])


def test_bytes_past_the_last_record_are_read_unchecked_and_records_past_the_end_fail(tmp_path: Path) -> None:
    d = str(tmp_path / "ev")
    msgs = write_journal(d, n=400, segment_size=1 << 30)
    (seg,) = list_segments(d)
    spath = sum_path(d, seg.first_offset)
    raw = Path(spath).read_bytes()
    Path(spath).write_bytes(raw[: len(raw) - 3 * RECORD.size])  # as after a crash between write and record
    got: Rows = []
    for p in plan(d):
        rows_of(p, got)
    assert [(k, v) for _, k, v in got] == msgs
    Path(spath).write_bytes(raw + RECORD.pack(os.path.getsize(seg.path) + 10, 0))
    with pytest.raises(ChecksumError, match="past the end of the segment"):
        for p in plan(d):
            rows_of(p, [])


# -- on a real Spark ---------------------------------------------------------------------------------------


def spark_rows(spark, path: str, **options: str) -> list[tuple[int, bytes, bytes]]:  # type: ignore[no-untyped-def]
    reader = spark.read.format("sej")
    for k, v in options.items():
        reader = reader.option(k, v)
    return sorted((r.offset, bytes(r.key), bytes(r.value)) for r in reader.load(path).collect())


def test_spark_batch_reads_clean_and_fails_on_flips(spark, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    root = tmp_path / "root"
    d = str(root / "ev")
    msgs = write_journal(d, n=1500)
    want = [(i, k, v) for i, (k, v) in enumerate(msgs)]
    assert VERIFY_CHECKSUMS, "the default is on (docs/spark.md)"
    assert spark_rows(spark, str(root)) == want
    assert spark_rows(spark, str(root), verifyChecksums="true", maxBytesPerPartition="50000") == want
    for f in flips(d, 4, seed=43):
        with pytest.raises(Exception) as e:
            spark_rows(spark, str(root), maxBytesPerPartition="50000")
        assert "ChecksumError" in str(e.value) or "CorruptionError" in str(e.value), (f, str(e.value)[-2000:])
        assert os.path.basename(f.segment.path) in str(e.value), f
        if f.kind in ("key", "value"):
            got = spark_rows(spark, str(root), verifyChecksums="false")  # off: read as it is on disk
            assert len(got) == len(want) and got != want, f
    with pytest.raises(Exception, match="option verifyChecksums must be true or false, got 'yes'"):
        spark_rows(spark, str(root), verifyChecksums="yes")


def test_spark_reads_go_journals_unchecked(spark, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    d = build_go_journal(tmp_path / "j")
    assert not list(Path(d).rglob("*.sum"))
    want = []
    with sej.Scanner(d, 0, timeout=0) as s:
        want = [(m.offset, m.key, m.value) for m in s]
    assert want and spark_rows(spark, d) == want


def test_spark_stream_fails_on_a_flip_and_reads_clean_data(spark, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    root = tmp_path / "root"
    d = str(root / "ev")
    msgs = write_journal(d, n=800)
    run_available_now(spark, str(root), str(tmp_path / "ck"), str(tmp_path / "out"))
    assert sorted((o, v) for _, o, v in sink_rows(spark, str(tmp_path / "out"))) == [
        (i, v) for i, (_, v) in enumerate(msgs)
    ]
    seg = list_segments(d)[1]
    flip(seg.path, 5000, 3)
    with pytest.raises(RuntimeError, match="ChecksumError"):
        run_available_now(spark, str(root), str(tmp_path / "ck2"), str(tmp_path / "out2"))
