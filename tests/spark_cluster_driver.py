"""A Spark driver on a standalone cluster, run as its own process by tests/test_spark_cluster.py (helper).

    python spark_cluster_driver.py MASTER_URL EXECUTORS WAIT_SECONDS QUERY_SECONDS

Why a process of its own: a process has one SparkContext, and the test workers (pytest-xdist) already have
their local[2] session (the `spark` fixture); a driver process is also ended, with its JVM, by pid.

It starts a session on MASTER_URL (sej.spark.spark_session), waits (event by event, at most WAIT_SECONDS) until
EXECUTORS executors have registered, says so, then answers commands, one JSON object a line on stdin, with one
JSON object a line on stdout ({"error": traceback} when a command fails). Everything else this process, Spark
or its JVM writes to stdout goes to stderr instead. Rows are handed over in pickle files the test names.

    {"cmd": "batch", "path": P, "options": {...}, "rows": FILE}
        spark.read.format("sej") of P: the rows (client, shard, offset, timestamp in µs, type, key, value)
        collected, and for each partition the executor that read it (its id and JVM pid, found from the Python
        worker's ancestors in /proc), that Python worker's pid and the (journal, offset) of its rows.
    {"cmd": "stream", "path": P, "checkpoint": C, "sink": S, "options": {...}, "rows": FILE}
        one readStream.format("sej") query into a Parquet sink with trigger(availableNow=True), at most
        QUERY_SECONDS; the rows of each micro-batch, and the sink read back (client, shard, offset, value).
    {"cmd": "stop"}
        spark.stop(), then exit.
"""

from __future__ import annotations

import json
import os
import pickle
import sys
import time
import traceback
from collections.abc import Iterable, Iterator
from typing import Any

EXECUTOR_MAIN = b"org.apache.spark.executor.CoarseGrainedExecutorBackend"


def executor_of_this_process() -> tuple[str, int] | None:
    """(executor id, JVM pid) of the executor this Python worker runs under: its nearest such ancestor."""
    pid = os.getpid()
    for _ in range(64):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
            with open(f"/proc/{pid}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            return None
        if EXECUTOR_MAIN in argv and b"--executor-id" in argv:
            return argv[argv.index(b"--executor-id") + 1].decode(), pid
        pid = int(stat[stat.rfind(b")") + 2 :].split()[1])
        if pid <= 1:
            return None
    return None


def where_read(index: int, rows: Iterable[Any]) -> Iterator[dict[str, Any]]:
    """For mapPartitionsWithIndex: which executor and Python worker read partition `index`, and which rows."""
    keys = [(f"{r.client}.{r.shard}" if r.client is not None else r.shard, r.offset) for r in rows]
    executor = executor_of_this_process()
    yield {
        "partition": index,
        "executor": None if executor is None else executor[0],
        "executor_jvm_pid": None if executor is None else executor[1],
        "python_pid": os.getpid(),
        "rows": keys,
    }


def batch(spark: Any, cmd: dict[str, Any]) -> dict[str, Any]:
    from pyspark.sql import functions as F

    df = spark.read.format("sej").options(**cmd.get("options", {})).load(cmd["path"])
    cols = ["client", "shard", "offset", F.unix_micros("timestamp").alias("ts"), "type", "key", "value"]
    rows = [(r[0], r[1], r[2], r[3], r[4], bytes(r[5]), bytes(r[6])) for r in df.select(*cols).collect()]
    placement = df.rdd.mapPartitionsWithIndex(where_read).collect()
    with open(cmd["rows"], "wb") as f:
        pickle.dump({"rows": rows, "placement": placement}, f)
    return {"rows": len(rows), "partitions": df.rdd.getNumPartitions()}


def stream(spark: Any, cmd: dict[str, Any], limit: float) -> dict[str, Any]:
    q = (
        spark.readStream.format("sej")
        .options(**cmd.get("options", {}))
        .load(cmd["path"])
        .writeStream.format("parquet")
        .option("checkpointLocation", cmd["checkpoint"])
        .option("path", cmd["sink"])
        .trigger(availableNow=True)
        .start()
    )
    finished = q.awaitTermination(limit)  # raises the query's failure
    if not finished:
        q.stop()
        raise TimeoutError(f"the availableNow query did not finish in {limit:g} s")
    batches = [int(p["numInputRows"]) for p in q.recentProgress]
    sink = spark.read.parquet(cmd["sink"]).select("client", "shard", "offset", "value")
    rows = [(r[0], r[1], r[2], bytes(r[3])) for r in sink.collect()]
    with open(cmd["rows"], "wb") as f:
        pickle.dump(rows, f)
    return {"batches": batches, "rows": len(rows)}


def main() -> None:
    master, executors, wait_s, query_s = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4])
    answers = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # stray output (ours, Spark's, the JVM's: it inherits fd 1) goes to stderr, not to the answers

    def answer(obj: dict[str, Any]) -> None:
        answers.write(json.dumps(obj) + "\n")
        answers.flush()

    from sej.spark import spark_session

    spark = spark_session("sej-cluster-test", master)
    status = spark.sparkContext._jsc.sc().getExecutorMemoryStatus  # executors' block managers and the driver's
    deadline = time.monotonic() + wait_s
    while status().size() < executors + 1:
        if time.monotonic() > deadline:
            answer({"error": f"{status().size() - 1} of {executors} executors registered in {wait_s:g} s"})
            sys.exit(1)
        time.sleep(0.1)
    answer({"ready": True, "executors": status().size() - 1, "app_id": spark.sparkContext.applicationId})
    for line in sys.stdin:
        cmd = json.loads(line)
        try:
            if cmd["cmd"] == "stop":
                spark.stop()
                answer({"stopped": True})
                return
            answer(batch(spark, cmd) if cmd["cmd"] == "batch" else stream(spark, cmd, query_s))
        except Exception:  # noqa: BLE001 (the test gets the whole traceback)
            answer({"error": traceback.format_exc()})


if __name__ == "__main__":
    main()
