"""Several hub roots as one data set: `load([a, b])`, a glob, the clash error and includeRoot, on a real Spark."""

from __future__ import annotations

import json
import os

import pytest

import sej
from tests.test_spark_batch import scanner_rows, spark_rows

TS = 1_700_000_000 * 10**9


def hub(root: str, clients: list[str], n: int = 40) -> None:
    """A hub root: `<client>.ev.1.00<k>` journals of n messages each, in several small segments."""
    for c in clients:
        for k in range(2):
            with sej.Writer(os.path.join(root, f"{c}.ev.1.00{k}"), segment_size=300) as w:
                for i in range(n):
                    w.append(b"%s-%d-%d" % (c.encode(), k, i), key=b"k", type=i % 3, timestamp=TS + i * 10**6)


def with_root(df) -> set[tuple]:  # type: ignore[no-untyped-def]
    """(root, client, shard, offset, value) of every row."""
    return {(r.root, r.client, r.shard, r.offset, bytes(r.value)) for r in df.collect()}


def test_a_list_of_roots_and_a_glob_read_every_journal_once(spark, tmp_path) -> None:
    a, b = str(tmp_path / "hub-a"), str(tmp_path / "hub-b")
    hub(a, ["c1", "c2"])
    hub(b, ["c3"])
    want = scanner_rows(a) | scanner_rows(b)
    assert len(want) == 3 * 2 * 40
    for df in (
        spark.read.format("sej").load([a, b]),  # type: ignore[attr-defined]
        spark.read.format("sej").load(str(tmp_path / "hub-*")),  # type: ignore[attr-defined]
        spark.read.format("sej").load([str(tmp_path / "hub-?"), a]),  # overlapping: each root once  # type: ignore[attr-defined]
    ):
        rows = df.collect()
        assert len(rows) == len(want)  # no journal twice
        assert spark_rows(df) == want
    # The offset options name journals as under one root.
    df = (
        spark.read.format("sej")  # type: ignore[attr-defined]
        .option("startingOffsets", json.dumps({"c1.ev.1.000": 30, "c3.ev.1.001": 39}))
        .load([a, b])
    )
    got = spark_rows(df)
    assert {r for r in got if r[:2] == ("c1", "ev.1.000")} == {
        r for r in want if r[:2] == ("c1", "ev.1.000") and r[2] >= 30
    }
    assert {r for r in got if r[:2] == ("c3", "ev.1.001")} == {
        r for r in want if r[:2] == ("c3", "ev.1.001") and r[2] >= 39
    }
    assert len(got) == len(want) - 30 - 39


def test_a_glob_that_matches_nothing_and_a_bad_paths_option_are_errors(spark, tmp_path) -> None:
    for load, needle in [
        (lambda r: r.load(str(tmp_path / "nothing-*")), "matches nothing"),
        (lambda r: r.option("paths", '"not a list"').load(), "option paths must be a JSON list"),
    ]:
        with pytest.raises(Exception) as e:
            load(spark.read.format("sej")).count()  # type: ignore[attr-defined]
        assert needle in str(e.value)


def test_a_journal_in_two_roots_is_an_error_naming_both_unless_include_root(spark, tmp_path) -> None:
    a, b = str(tmp_path / "hub-a"), str(tmp_path / "hub-b")
    hub(a, ["c1", "c2"])
    hub(b, ["c2"], n=5)  # client c2 moved from hub a to hub b
    with pytest.raises(Exception) as e:
        spark.read.format("sej").load([a, b]).count()  # type: ignore[attr-defined]
    msg = str(e.value)
    assert "c2.ev.1.000" in msg and os.path.join(a, "c2.ev.1.000") in msg and os.path.join(b, "c2.ev.1.000") in msg
    assert "includeRoot" in msg
    with pytest.raises(Exception) as e:  # also in a streaming query
        q = spark.readStream.format("sej").load(str(tmp_path / "hub-*")).writeStream.format("noop").start()  # type: ignore[attr-defined]
        try:
            q.processAllAvailable()
        finally:
            q.stop()
    assert os.path.join(b, "c2.ev.1.000") in str(e.value)

    df = spark.read.format("sej").option("includeRoot", "true").load([a, b])  # type: ignore[attr-defined]
    assert df.columns[-1] == "root"
    got = with_root(df)
    want = {
        (root, client, shard, off, val)
        for root in (a, b)
        for (client, shard, off, _ts, _t, _k, val) in scanner_rows(root)
    }
    assert got == want and len(got) == 2 * 2 * 40 + 2 * 5
    # With includeRoot, the offset options name journals by path.
    df = (
        spark.read.format("sej")  # type: ignore[attr-defined]
        .option("includeRoot", "true")
        .option("endingOffsets", json.dumps({os.path.join(b, "c2.ev.1.000"): 2}))
        .load([a, b])
    )
    got_b = {r for r in with_root(df) if r[0] == b and r[2] == "ev.1.000"}
    assert {r[3] for r in got_b} == {0, 1}


def test_a_stream_over_a_glob_takes_new_roots_and_journals(spark, tmp_path) -> None:
    a = str(tmp_path / "hub-a")
    hub(a, ["c1"], n=10)
    out, ckpt = str(tmp_path / "out"), str(tmp_path / "ckpt")

    def run() -> None:
        q = (
            spark.readStream.format("sej")  # type: ignore[attr-defined]
            .option("includeRoot", "true")
            .load(str(tmp_path / "hub-*"))
            .selectExpr("root", "client", "shard", "offset", "value")
            .writeStream.format("parquet")
            .option("path", out)
            .option("checkpointLocation", ckpt)
            .trigger(availableNow=True)
            .start()
        )
        q.awaitTermination()

    run()
    b = str(tmp_path / "hub-b")
    hub(b, ["c2"], n=7)  # a new hub root matching the glob
    run()
    run()  # new journals enter the offsets in one batch and are read from the next
    got = {(r.root, r.client, r.shard, r.offset, bytes(r.value)) for r in spark.read.parquet(out).collect()}  # type: ignore[attr-defined]
    rows = spark.read.parquet(out).count()  # type: ignore[attr-defined]
    want = {
        (root, client, shard, off, val)
        for root in (a, b)
        for (client, shard, off, _ts, _t, _k, val) in scanner_rows(root)
    }
    assert got == want and rows == len(want) == 2 * 10 + 2 * 7
