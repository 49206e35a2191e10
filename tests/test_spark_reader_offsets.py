"""The streaming query's reader offsets (`ofs/spark-<queryName>.ofs`) follow what its sink finished, on a real Spark.

After an `availableNow` run that ends normally they equal the end the checkpoint holds; a run killed
(SIGKILL, driver and JVM) inside its sink write leaves them at the previous run's end.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

import sej
from sej.journal import next_offset
from sej.layout import reader_offset_path
from sej.offset import read_offset_file
from testing.timing import scaled, wait_until

from .conftest import spark_timeouts
from .test_spark_batch import scanner_rows

pytest.importorskip("pyspark")

READER = "spark-q"
JOURNALS = ("ev.1.000", "ev.1.001")


def write(root: str, n: int, start: int = 0) -> None:
    """n more messages in each of the root's two journals."""
    for name in JOURNALS:
        with sej.Writer(os.path.join(root, name), segment_size=2000) as w:
            for i in range(start, start + n):
                w.append(b"%s-%d" % (name.encode(), i), timestamp=1_700_000_000 * 10**9 + i)


def checkpoint(ck: str) -> tuple[int, dict[str, int], bool]:
    """(id, source end offsets, committed) of the checkpoint's latest micro-batch.

    offsets/<id>: a version line, the batch's metadata, then one line per source (its end);
    commits/<id> exists once the sink's write of that batch finished.
    """
    batch = max(int(f) for f in os.listdir(os.path.join(ck, "offsets")) if f.isdigit())
    lines = Path(ck, "offsets", str(batch)).read_text().splitlines()
    return batch, json.loads(lines[2]), os.path.exists(os.path.join(ck, "commits", str(batch)))


def reader_offsets(root: str) -> dict[str, int | None]:
    return {name: read_offset_file(reader_offset_path(os.path.join(root, name), READER)) for name in JOURNALS}


def to_sink(spark, root: str, ck: str, out: str, **options: str) -> None:  # type: ignore[no-untyped-def]
    """One availableNow run; each micro-batch is written to out/batch=<id> (a replay overwrites it)."""

    def write_batch(df, batch_id: int) -> None:  # type: ignore[no-untyped-def]
        df.write.mode("overwrite").parquet(os.path.join(out, f"batch={batch_id}"))

    reader = spark.readStream.format("sej").option("queryName", "q")
    for k, v in options.items():
        reader = reader.option(k, v)
    q = reader.load(root).writeStream.foreachBatch(write_batch).option("checkpointLocation", ck)
    q = q.trigger(availableNow=True).start()
    finished = q.awaitTermination(scaled(180))
    if not finished:
        q.stop()
    assert finished


def test_offsets_equal_the_checkpoint_end_after_a_run_that_ends_normally(spark, tmp_path) -> None:
    root, ck, out = str(tmp_path / "root"), str(tmp_path / "ck"), str(tmp_path / "out")
    write(root, 300)
    to_sink(spark, root, ck, out)
    batch, end, committed = checkpoint(ck)
    assert committed and end == {n: next_offset(os.path.join(root, n)) for n in JOURNALS} == {n: 300 for n in JOURNALS}
    assert reader_offsets(root) == end  # not a run behind: Spark did not commit it, the source did

    write(root, 100, start=300)  # a second run, in capped micro-batches
    to_sink(spark, root, ck, out, maxRecordsPerTrigger="70")
    batch2, end2, committed2 = checkpoint(ck)
    assert committed2 and batch2 > batch + 1 and end2 == {n: 400 for n in JOURNALS}
    assert reader_offsets(root) == end2


DRIVER = r"""
import json, os, sys, time
from sej.spark import spark_session
root, ck, out, control, conf = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], json.loads(sys.argv[5])
spark = spark_session("sej-kill-test", "local[1]", **conf)


def write_batch(df, batch_id):
    open(os.path.join(control, f"in-batch-{batch_id}"), "w").close()
    deadline = time.monotonic() + float(conf["test.hold"])  # held here until the test kills us
    while time.monotonic() < deadline:
        time.sleep(0.05)
    df.write.mode("overwrite").parquet(os.path.join(out, f"batch={batch_id}"))


q = (spark.readStream.format("sej").option("queryName", "q").load(root)
     .writeStream.foreachBatch(write_batch).option("checkpointLocation", ck).trigger(availableNow=True).start())
q.awaitTermination()
"""


def test_a_run_killed_in_its_sink_write_leaves_the_previous_end_then_a_rerun_catches_up(spark, tmp_path) -> None:
    root, ck, out, control = (str(tmp_path / d) for d in ("root", "ck", "out", "control"))
    os.makedirs(control)
    write(root, 200)
    to_sink(spark, root, ck, out)
    first_end = {n: 200 for n in JOURNALS}
    assert checkpoint(ck) == (0, first_end, True) and reader_offsets(root) == first_end

    write(root, 150, start=200)
    conf = {"spark.ui.enabled": "false", **spark_timeouts(), "test.hold": str(scaled(600))}
    driver = subprocess.Popen(
        [sys.executable, "-c", DRIVER, root, ck, out, control, json.dumps(conf)],
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
        start_new_session=True,  # its own process group: the driver, its JVM and the JVM's Python workers
    )
    try:
        wait_until(
            lambda: os.path.exists(os.path.join(control, "in-batch-1")) or driver.poll() is not None,
            scaled(300),
            "the driver to be in its second micro-batch's sink write",
        )
        assert driver.poll() is None, "the driver ended before its sink write"
    finally:
        os.killpg(driver.pid, signal.SIGKILL)
        driver.wait()
    batch, end, committed = checkpoint(ck)
    assert (batch, end, committed) == (1, {n: 350 for n in JOURNALS}, False)  # planned, never finished
    assert reader_offsets(root) == first_end  # not the unfinished batch's end

    to_sink(spark, root, ck, out)  # Spark runs batch 1 again, then ends
    assert checkpoint(ck) == (1, {n: 350 for n in JOURNALS}, True)
    assert reader_offsets(root) == {n: 350 for n in JOURNALS}
    got = [(r.shard, r.offset, bytes(r.value)) for r in spark.read.parquet(out).collect()]  # type: ignore[attr-defined]
    want = {(shard, off, val) for (_c, shard, off, _ts, _t, _k, val) in scanner_rows(root)}
    assert sorted(got) == sorted(want) and len(got) == 2 * 350
