"""The `sej` streaming source on a real local Spark: exactly once across restarts, limits, data loss."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
import warnings

import pytest

import sej
from sej.offset import read_offset_file
from testing.timing import scaled, wait_until

from .conftest import popen_python
from .test_spark_batch import scanner_rows

pytest.importorskip("pyspark")
from sej.spark.stream import share_rows  # noqa: E402

LIMIT = 500
SEED = 1600  # the backlog: the first run alone needs at least three capped batches


def run_available_now(spark, root: str, ck: str, out: str, **options: str) -> list[int]:  # type: ignore[no-untyped-def]
    """One `trigger(availableNow=True)` run into a Parquet sink; the rows of each micro-batch."""
    reader = spark.readStream.format("sej")
    for k, v in options.items():
        reader = reader.option(k, v)
    q = (
        reader.load(root)
        .writeStream.format("parquet")
        .option("checkpointLocation", ck)
        .option("path", out)
        .trigger(availableNow=True)
        .start()
    )
    limit = scaled(180)
    try:
        finished = q.awaitTermination(limit)
    except Exception as e:  # the query failed: awaitTermination raises its exception
        raise RuntimeError(str(e)) from None
    if not finished:
        q.stop()
    assert finished, f"availableNow query did not finish in {limit:g} s"
    return [int(p["numInputRows"]) for p in q.recentProgress]


def sink_rows(spark, out: str) -> list[tuple]:  # type: ignore[no-untyped-def]
    return [(r.shard, r.offset, bytes(r.value)) for r in spark.read.parquet(out).collect()]


def test_share_rows_is_fair_bounded_and_always_progresses() -> None:
    assert share_rows({"a": 10, "b": 10}, 6) == {"a": 3, "b": 3}
    assert share_rows({"a": 1, "b": 100}, 50) == {"a": 1, "b": 49}
    assert share_rows({"a": 0, "b": 5}, 100) == {"a": 0, "b": 5}
    got = share_rows({"a": 5, "b": 5, "c": 5}, 2)
    assert sum(got.values()) == 2 and all(v <= 1 for v in got.values())
    for budget in (1, 7, 100, 10_000):
        got = share_rows({"x": 3, "y": 300, "z": 3000}, budget)
        assert sum(got.values()) == min(budget, 3303)
        assert got["x"] <= 3 and got["y"] <= 300 and got["z"] <= 3000


WRITER = r"""
import os, sys, time
import sej
root, control, per_run, safety = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
parent, deadline = os.getppid(), time.monotonic() + safety  # in case the test goes away without saying "stop"
stop = os.path.join(control, "stop")
i = runs = 0


def wait_for(name):
    while not os.path.exists(os.path.join(control, name)) and not os.path.exists(stop):
        if os.getppid() != parent or time.monotonic() > deadline:
            sys.exit("the test went away without creating the stop file")
        time.sleep(0.01)


with sej.ShardedWriter(root, "p", shard_bit=2, segment_size=16_000) as w:
    while True:
        wait_for("run-%d" % (runs + 1))
        if os.path.exists(stop):
            break
        runs += 1
        for _ in range(per_run // 10):  # about 100 messages a second
            for _ in range(10):
                w.append(b"value-%06d" % i, key=b"k%d" % i, type=i % 3)
                i += 1
            w.flush()
            time.sleep(0.1)
print("done", i, flush=True)
"""


def test_available_now_with_a_limit_reads_everything_exactly_once_across_restarts_while_a_writer_appends(
    spark, tmp_path
) -> None:
    root, ck, out = str(tmp_path / "root"), str(tmp_path / "ck"), str(tmp_path / "out")
    with sej.ShardedWriter(root, "p", shard_bit=2, segment_size=16_000) as w:  # a backlog over all four shards
        for i in range(SEED):
            w.append(b"seed-%d" % i, key=b"seed-%d" % i)
    # The writer appends 300 messages as each run starts (run-1, run-2, ...), at about 100 a second, so how much
    # a run finds new does not grow with how slow this machine is; it stays until told to stop (or the test
    # process is gone, or a safety deadline far beyond the test's own has passed).
    control = tmp_path / "control"
    control.mkdir()
    writer = popen_python(WRITER, root, str(control), "300", str(scaled(900)), stdout=subprocess.PIPE)
    try:
        batches: list[int] = []
        for run in range(1, 4):  # restarts from the checkpoint while the writer appends
            (control / f"run-{run}").touch()
            batches += run_available_now(spark, root, ck, out, maxRecordsPerTrigger=str(LIMIT), queryName="q")
            assert writer.poll() is None, "the writer must still be appending while the query runs"
        (control / "stop").touch()
        out_text, _ = writer.communicate(timeout=scaled(60))
        assert writer.returncode == 0 and out_text.startswith("done")
        written = int(out_text.split()[1])
    finally:
        if writer.poll() is None:
            writer.kill()
            writer.wait()
    batches += run_available_now(spark, root, ck, out, maxRecordsPerTrigger=str(LIMIT), queryName="q")
    assert max(batches) <= LIMIT, batches
    assert sum(1 for b in batches if b == LIMIT) >= 3, f"the limit should have capped several batches: {batches}"
    got = sink_rows(spark, out)
    want = {(r[1], r[2], r[6]) for r in scanner_rows(root)}
    assert len(got) == len(set(got)), "a row was written twice"
    assert set(got) == want and len(want) == written + SEED
    assert len(got) > sum(batches[:1]), "later runs must have read what the writer appended meanwhile"
    # The query's progress is a reader offset in every journal; it lags Spark's own by at most one batch.
    for j in sej.find_journals(root):
        committed = read_offset_file(os.path.join(j.path, "ofs", "spark-q.ofs"))
        assert committed is not None and committed <= sej.next_offset(j.path)
        assert "spark-q" in sej.list_readers(j.path)


def test_a_replayed_micro_batch_reads_exactly_the_same_rows(spark, tmp_path) -> None:
    j = str(tmp_path / "root" / "j")
    with sej.Writer(j, segment_size=8_000) as w:
        w.append_many([b"a-%d" % i for i in range(1000)])
    seen: dict[int, list[list[tuple]]] = {}
    failed: list[int] = []

    def sink(df, batch_id: int) -> None:  # type: ignore[no-untyped-def]
        rows = sorted((r.shard, r.offset, bytes(r.value)) for r in df.collect())
        seen.setdefault(batch_id, []).append(rows)
        if batch_id == 1 and not failed:
            failed.append(batch_id)
            raise RuntimeError("sink failure injected by the test")

    def run() -> object:
        q = (
            spark.readStream.format("sej")  # type: ignore[attr-defined]
            .option("maxRecordsPerTrigger", "300")
            .load(str(tmp_path / "root"))
            .writeStream.foreachBatch(sink)
            .option("checkpointLocation", str(tmp_path / "ck"))
            .trigger(availableNow=True)
            .start()
        )
        try:
            finished = q.awaitTermination(scaled(180))
        except Exception as e:  # awaitTermination raises the query's failure
            return e
        if not finished:
            q.stop()
            raise AssertionError(f"availableNow query did not finish in {scaled(180):g} s")
        return q.exception()

    assert run() is not None and failed == [1]
    with sej.Writer(j, segment_size=8_000) as w:  # more data before the replay must not change batch 1
        w.append_many([b"b-%d" % i for i in range(500)])
    assert run() is None
    first, replay = seen[1]
    assert first == replay and len(first) == 300
    offsets = sorted(o for b, attempts in seen.items() for o in (r[1] for r in attempts[-1]))
    assert offsets == list(range(1500))


def _delete_oldest_segments(j: str, keep: int) -> int:
    """Delete all but the last `keep` segments, as retention would; the first offset kept."""
    segs = sej.list_segments(j)
    for s in segs[:-keep]:
        os.remove(s.path)
    return sej.first_offset(j)


@pytest.mark.parametrize("fail", [True, False])
def test_fail_on_data_loss(spark, tmp_path, fail: bool) -> None:
    root = tmp_path / "root"
    j = str(root / "j")
    with sej.Writer(j, segment_size=4_000) as w:
        w.append_many([b"x-%d" % i for i in range(600)])
    ck, out = str(tmp_path / "ck"), str(tmp_path / "out")
    run_available_now(spark, str(root), ck, out)
    assert len(sink_rows(spark, out)) == 600
    with sej.Writer(j, segment_size=4_000) as w:
        w.append_many([b"y-%d" % i for i in range(600)])
    kept_from = _delete_oldest_segments(j, keep=3)
    assert kept_from > 600, "the test must delete unread messages"
    options = {"failOnDataLoss": str(fail).lower()}
    if fail:
        with pytest.raises(RuntimeError) as e:
            run_available_now(spark, str(root), ck, out, **options)
        assert "DataLossError" in str(e.value) and f"offsets 600 to {kept_from - 1} were deleted" in str(e.value)
        assert len(sink_rows(spark, out)) == 600
    else:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            run_available_now(spark, str(root), ck, out, **options)
        offsets = sorted(r[1] for r in sink_rows(spark, out))
        assert offsets == list(range(600)) + list(range(kept_from, 1200))


def test_new_journals_are_picked_up_and_starting_offsets(spark, tmp_path) -> None:
    root = tmp_path / "hub"
    with sej.Writer(str(root / "edge-1.p.1.000")) as w:
        w.append_many([b"one-%d" % i for i in range(100)])
    ck, out = str(tmp_path / "ck"), str(tmp_path / "out")
    run_available_now(spark, str(root), ck, out)
    with sej.Writer(str(root / "edge-2.p.1.000")) as w:
        w.append_many([b"two-%d" % i for i in range(50)])
    with sej.Writer(str(root / "edge-1.p.1.000")) as w:
        w.append_many([b"one-more-%d" % i for i in range(10)])
    run_available_now(spark, str(root), ck, out)
    df = spark.read.parquet(out)
    counts = {(r.client, r.shard): r["count"] for r in df.groupBy("client", "shard").count().collect()}
    assert counts == {("edge-1", "p.1.000"): 110, ("edge-2", "p.1.000"): 50}
    assert df.count() == df.select("client", "offset").distinct().count()
    # startingOffsets: "latest" reads nothing that is already there; a JSON map starts each journal where it says.
    out2 = str(tmp_path / "out2")
    assert sum(run_available_now(spark, str(root), str(tmp_path / "ck2"), out2, startingOffsets="latest")) == 0
    out3 = str(tmp_path / "out3")
    run_available_now(spark, str(root), str(tmp_path / "ck3"), out3, startingOffsets='{"edge-1.p.1.000": 105}')
    got = sorted((r[0], r[1]) for r in sink_rows(spark, out3))
    assert got == [("p.1.000", o) for o in range(50)] + [("p.1.000", o) for o in range(105, 110)]


def test_bad_stream_options_are_clear_errors(spark, tmp_path) -> None:
    root = tmp_path / "root"
    with sej.Writer(str(root / "j")) as w:
        w.append(b"x")
    for opt, val, needle in [
        ("maxRecordsPerTrigger", "-3", "maxRecordsPerTrigger must be an integer >= 1"),
        ("failOnDataLoss", "maybe", "failOnDataLoss must be true or false"),
        ("queryName", "a/b", "a/b"),
    ]:
        with pytest.raises(Exception) as e:
            run_available_now(spark, str(root), str(tmp_path / f"ck-{opt}"), str(tmp_path / "o"), **{opt: val})
        assert needle in str(e.value)
    shutil.rmtree(tmp_path / "o", ignore_errors=True)


def test_pushed_down_filters_skip_segments_and_keep_results(spark, tmp_path) -> None:
    root = str(tmp_path / "root")
    t0 = 1_700_000_000_000_000_000
    with sej.ShardedWriter(root, "p", shard_bit=1, segment_size=10_000) as w:
        for i in range(4000):
            w.append(b"v-%d" % i, key=b"k%d" % i, type=i % 5, timestamp=t0 + i * 1_000_000_000)
    queries = [
        "offset >= 1500 and offset < 1600",
        "offset = 7",
        "type in (1, 3) and shard = 'p.1.001'",
        "timestamp >= timestamp'2023-11-14 23:00:00' and type = 2",
        "client is null and value like 'v-1%'",
    ]
    key = "spark.sql.python.filterPushdown.enabled"
    before = spark.conf.get(key, "false")
    try:
        for where in queries:
            spark.conf.set(key, "false")
            plain = spark.read.format("sej").load(root).where(where)
            want = sorted((r.shard, r.offset) for r in plain.collect())
            spark.conf.set(key, "true")
            pushed = spark.read.format("sej").option("pushFilters", "true").load(root).where(where)
            got = sorted((r.shard, r.offset) for r in pushed.collect())
            assert got == want and want, where
            if where.startswith("offset"):
                assert pushed.rdd.getNumPartitions() < plain.rdd.getNumPartitions(), where
    finally:
        spark.conf.set(key, before)


def test_stream_keeps_up_with_a_short_writer_then_stops(spark, tmp_path) -> None:
    """A plain (processingTime) trigger follows a journal as it grows, bounded in time."""
    root = tmp_path / "root"
    j = str(root / "j")
    with sej.Writer(j) as w:
        w.append(b"first")
    q = (
        spark.readStream.format("sej")  # type: ignore[attr-defined]
        .option("queryName", "live")
        .load(str(root))
        .writeStream.format("memory")
        .queryName("live_rows")
        .trigger(processingTime="200 milliseconds")
        .start()
    )
    try:
        with sej.Writer(j) as w:
            for i in range(5):
                w.append(b"more-%d" % i)
                w.flush()
                time.sleep(0.1)

        def rows() -> int:
            assert q.isActive, f"the query stopped: {q.exception()}"
            return spark.table("live_rows").count()  # type: ignore[attr-defined,no-any-return]

        wait_until(lambda: rows() >= 6, scaled(60), "the query to read all 6 messages", interval=0.2)
        assert sorted(r.offset for r in spark.table("live_rows").collect()) == list(range(6))  # type: ignore[attr-defined]

        def committed_all() -> bool:
            if (read_offset_file(os.path.join(j, "ofs", "spark-live.ofs")) or 0) >= 6:
                return True
            with sej.Writer(j) as w:  # the next batch commits the previous one's end: give it one
                w.append(b"tick")
            return False

        wait_until(committed_all, scaled(30), "the query's reader offset to pass the 6 messages", interval=0.5)
    finally:
        q.stop()
