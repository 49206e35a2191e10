"""The `sej` PySpark data source, batch reads, on a real local Spark (one session per test worker)."""

from __future__ import annotations

import os

import pytest

import sej
from sej.hub import LocalSource, copy_all
from sej.shard import find_journals


def scanner_rows(path: str) -> set[tuple]:
    """What sej's own Scanner reads, as (client, shard, offset, ts_us, type, key, value) rows."""
    from sej.spark.plan import split_name

    rows = set()
    for j in find_journals(path):
        client, shard = split_name(j.name)
        shard = shard or os.path.basename(os.path.normpath(j.path))
        with sej.Scanner(j.path, "first", timeout=0) as s:
            for m in s:
                ts = None if m.timestamp is None else m.timestamp // 1000
                rows.add((client, shard, m.offset, ts, m.type, m.key, m.value))
    return rows


def spark_rows(df) -> set[tuple]:  # type: ignore[no-untyped-def]
    import datetime as dt

    epoch = dt.datetime(1970, 1, 1)
    out = set()
    for r in df.collect():
        ts = None
        if r.timestamp is not None:
            d = r.timestamp - epoch
            ts = (d.days * 86400 + d.seconds) * 1_000_000 + d.microseconds
        out.add((r.client, r.shard, r.offset, ts, r.type, bytes(r.key), bytes(r.value)))
    return out


def write_root(root: str, n: int = 3000, segment_size: int = 20_000) -> None:
    with sej.ShardedWriter(root, "p", shard_bit=2, segment_size=segment_size) as w:
        for i in range(n):
            ts = sej.NO_TIMESTAMP if i % 97 == 0 else 1_700_000_000_000_000_000 + i * 1_000_000
            w.append(b"value-%d" % i, key=b"k%d" % (i % 23), type=i % 4, timestamp=ts)


def test_journal_sharded_root_and_hub_root_match_the_scanner_row_for_row(spark, tmp_path) -> None:
    root = str(tmp_path / "root")
    write_root(root)
    hub = str(tmp_path / "hub")
    copy_all(lambda: LocalSource(root), hub, "edge-1", "hub")
    one = os.path.join(root, "p.2.001")
    for path in (one, root, hub):
        df = spark.read.format("sej").load(path)  # type: ignore[attr-defined]
        want = scanner_rows(path)
        got = spark_rows(df)
        assert got == want, path
        assert df.count() == len(want)
    clients = {r.client for r in spark.read.format("sej").load(hub).select("client").distinct().collect()}  # type: ignore[attr-defined]
    assert clients == {"edge-1"}
    assert spark.read.format("sej").load(one).filter("timestamp is null").count() > 0  # type: ignore[attr-defined]


def test_offset_time_and_type_bounds(spark, tmp_path) -> None:
    root = str(tmp_path / "root")
    write_root(root)
    df = (
        spark.read.format("sej")  # type: ignore[attr-defined]
        .option("startingOffsets", '{"p.2.000": 10, "p.2.001": -1}')
        .option("endingOffsets", '{"p.2.000": 20}')
        .load(root)
    )
    by_shard: dict[str, list[int]] = {}
    for r in df.collect():
        by_shard.setdefault(r.shard, []).append(r.offset)
    assert sorted(by_shard["p.2.000"]) == list(range(10, 20))
    assert "p.2.001" not in by_shard  # -1: from the latest, so nothing yet
    everything_latest = '{"p.2.000": -1, "p.2.001": -1, "p.2.002": -1, "p.2.003": -1}'
    assert spark.read.format("sej").option("startingOffsets", everything_latest).load(root).count() == 0
    assert len(by_shard["p.2.002"]) == sej.next_offset(os.path.join(root, "p.2.002"))
    t0 = 1_700_000_000_000_000_000
    timed = (
        spark.read.format("sej")
        .option("startTime", str(t0 + 1000 * 1_000_000))
        .option(  # type: ignore[attr-defined]
            "endTime", str(t0 + 2000 * 1_000_000)
        )
        .load(root)
    )
    want = {
        r
        for r in scanner_rows(root)
        if r[3] is not None and t0 // 1000 + 1000 * 1000 <= r[3] < t0 // 1000 + 2000 * 1000
    }
    assert {r for r in spark_rows(timed) if r[3] is not None} == want
    typed = spark.read.format("sej").option("type", "2").load(root)  # type: ignore[attr-defined]
    assert {r.type for r in typed.select("type").distinct().collect()} == {2}
    assert typed.count() == sum(1 for r in scanner_rows(root) if r[4] == 2)


def test_a_big_segment_is_read_by_several_partitions(spark, tmp_path) -> None:
    j = str(tmp_path / "big")
    with sej.Writer(j) as w:  # one segment of about 1.3 MiB
        w.append_many([os.urandom(100) for _ in range(10_000)], key=b"k")
    df = spark.read.format("sej").option("maxBytesPerPartition", str(200_000)).load(j)  # type: ignore[attr-defined]
    assert df.rdd.getNumPartitions() >= 6
    assert spark_rows(df) == scanner_rows(j)
    offsets = [r.offset for r in df.select("offset").collect()]
    assert sorted(offsets) == list(range(10_000)) and len(set(offsets)) == 10_000


def test_bad_options_are_clear_errors(spark, tmp_path) -> None:
    root = str(tmp_path / "root")
    write_root(root, n=50)
    for opt, val, needle in [
        ("startingOffsets", "{not json", "startingOffsets must be JSON"),
        ("endingOffsets", '{"p.2.000": -7}', "endingOffsets must map"),
        ("startTime", "yesterday-ish", "starttime"),
        # Spark hands options to the source with lower-case names: the error names them so.
        ("startingOffset", "0", "unknown option 'startingoffset'; the options are"),  # a typo fails, not ignored
        ("maxOffsetsPerTrigger", "5", "unknown option 'maxoffsetspertrigger'"),  # streaming only
        ("endingOffsets", "earliest", "not earliest"),
    ]:
        with pytest.raises(Exception) as e:
            spark.read.format("sej").option(opt, val).load(root).count()  # type: ignore[attr-defined]
        assert needle in str(e.value)
