"""The `sej` data source on a real Spark standalone cluster: a master and two workers, each its own process.

The cluster (testing/spark_cluster.py) is started with bin/spark-class of the PySpark installation, on
127.0.0.1; each worker has one core and launches its own executor JVM, whose Python workers read the journals.
Against it, one test runs what a hub's Spark jobs run: a batch read of a hub root (compared row for row with
sej's Scanner, and every partition placed on an executor), a streaming availableNow query while a writer
process appends (twice, from its checkpoint), and the archive job (sej-archive --master).

The driver is a process of its own (tests/spark_cluster_driver.py): a process has one SparkContext, and a
test worker may already hold the local one of the `spark` fixture. It is one test, not three, because
pytest-xdist hands tests to workers one by one: three tests could start three clusters at once.
The cluster, the driver and the writer are stopped by pid whatever happens; the cluster fixture then checks
that none of their processes is left.
"""

from __future__ import annotations

import json
import os
import pickle
import queue
import subprocess
import sys
import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import sej
from sej.hub import LocalSource, copy_all
from sej.offset import read_offset_file
from testing.spark_cluster import SparkCluster, cluster_available, stop_processes
from testing.sshd import descendants, pdeathsig_prefix
from testing.timing import scaled, wait_until

from .conftest import IN_CI, REPO, popen_python, spark_python, spark_timeouts
from .test_spark_batch import scanner_rows

DRIVER = REPO / "tests" / "spark_cluster_driver.py"
WORKERS = 2
T0 = 1_700_000_000_000_000_000
LIMIT = 1000  # maxRecordsPerTrigger of the streaming query
QUERY = "cluster"  # its queryName: ofs/spark-cluster.ofs in every journal
LIVE = "live.ev.1.000"  # the journal the writer process appends to, in the hub root


@pytest.fixture
def cluster(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[SparkCluster, dict[str, str]]]:
    """A standalone master and two workers (1 core, 1 GiB each) on 127.0.0.1; and the environment of a driver.

    Skipped without PySpark or Java, unless CI is set: then it fails, as the `spark` fixture does.
    """
    missing = cluster_available()
    if missing is not None:
        if IN_CI:
            pytest.fail(f"CI is set but a Spark cluster cannot be started: {missing}", pytrace=False)
        pytest.skip(f"no Spark cluster: {missing}")
    python = spark_python(tmp_path)  # this interpreter, with tests/spark_worker.py for the streaming source
    # PYTHONPATH: the executors' Python workers (children of the workers' children) import this checkout's sej.
    env = {"PYTHONPATH": str(REPO), "PYSPARK_PYTHON": python, "PYSPARK_DRIVER_PYTHON": sys.executable}
    client_conf = {
        "spark.executor.memory": "512m",
        "spark.ui.enabled": "false",
        "spark.sql.shuffle.partitions": str(WORKERS),
        **spark_timeouts(),
    }
    cluster = SparkCluster(WORKERS, cores=1, memory="1g", env=env, client_conf=client_conf)
    try:
        yield cluster, dict(os.environ) | env | cluster.client_env()
        rep = getattr(request.node, "rep_call", None)
        if rep is not None and rep.failed:
            rep.sections.append(("spark cluster logs", cluster.logs()))
    finally:
        leftover = cluster.stop()
    assert leftover == [], f"processes of the cluster still alive after it was stopped: {leftover}"


class Driver:
    """tests/spark_cluster_driver.py on the cluster, as a process: call() sends a command, returns its answer."""

    def __init__(self, master_url: str, env: dict[str, str], log: Path) -> None:
        self.log = log
        with open(log, "wb") as err:
            self.proc = subprocess.Popen(
                [*pdeathsig_prefix(), sys.executable, str(DRIVER), master_url, str(WORKERS), str(scaled(60)),
                 str(scaled(180))],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err, text=True, env=env, cwd=log.parent,
                start_new_session=True,
            )  # fmt: skip
        self.answers: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        try:
            self.ready = self._answer(scaled(120), "the driver's session and its executors")
        except BaseException:
            self.close()
            raise

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.answers.put(line)
        self.answers.put(None)

    def _answer(self, timeout: float, what: str) -> dict[str, Any]:
        try:
            line = self.answers.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"no answer from the driver in {timeout:g} s ({what})\n{self.log_tail()}") from None
        if line is None:
            raise AssertionError(f"the driver exited ({what}): code {self.proc.wait(scaled(10))}\n{self.log_tail()}")
        answer = json.loads(line)
        if "error" in answer:
            raise AssertionError(f"the driver failed ({what}):\n{answer['error']}\n{self.log_tail()}")
        return dict(answer)

    def call(self, timeout: float, **cmd: Any) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()
        return self._answer(timeout, cmd["cmd"])

    def log_tail(self, lines: int = 80) -> str:
        text = self.log.read_text(errors="replace").splitlines()[-lines:]
        return f"--- the driver's stderr ({self.log}):\n" + "\n".join(text)

    def close(self) -> None:
        """Stop Spark cleanly if the driver still answers, then end the process tree (its JVM) by pid."""
        try:
            if self.proc.poll() is None:
                self.call(scaled(60), cmd="stop")
                self.proc.wait(scaled(30))
        except (AssertionError, OSError, subprocess.TimeoutExpired):
            pass
        finally:
            leftover = stop_processes([self.proc])
            assert leftover == [], f"processes of the driver still alive: {leftover}"


def build_hub(tmp_path: Path) -> str:
    """A hub root: edge-1's 4 shards of several segments each, edge-2's 2 shards of one segment, copied by the hub."""
    hub = str(tmp_path / "hub")
    for client, bit, n, segment_size in (("edge-1", 2, 2000, 6_000), ("edge-2", 1, 400, 1 << 20)):
        src = str(tmp_path / f"producer-{client}")
        with sej.ShardedWriter(src, "ev", shard_bit=bit, segment_size=segment_size) as w:
            for i in range(n):
                ts = sej.NO_TIMESTAMP if i % 50 == 0 else T0 + i * 1_000_000_000
                w.append(b"%s-value-%d" % (client.encode(), i) + b"x" * (i % 40), key=b"k%d" % i, type=i % 4,
                         timestamp=ts)  # fmt: skip
        copy_all(lambda src=src: LocalSource(src), hub, client, "hub")  # type: ignore[misc]
    return hub


WRITER = r"""
import os, sys, time
import sej
journal, stop, safety = sys.argv[1], sys.argv[2], float(sys.argv[3])
parent, deadline = os.getppid(), time.monotonic() + safety  # in case the test goes away without saying "stop"
i = 0
with sej.Writer(journal, segment_size=16_000) as w:
    while not os.path.exists(stop):
        if os.getppid() != parent or time.monotonic() > deadline:
            sys.exit("the test went away without creating the stop file")
        for _ in range(10):  # about 200 messages a second
            w.append(b"live-%06d" % i, key=b"live-%d" % i, type=i % 4)
            i += 1
        w.flush()
        time.sleep(0.05)
print("done", i, flush=True)
"""


def cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def journals_of(hub: str) -> dict[str, str]:
    return {j.name: j.path for j in sej.find_journals(hub)}


def checkpoint_end(ck: Path) -> dict[str, int]:
    """The source's end offsets of the last micro-batch the checkpoint has committed ({journal: next offset})."""
    last = max(int(n) for n in os.listdir(ck / "commits") if n.isdigit())
    lines = (ck / "offsets" / str(last)).read_text().splitlines()  # "v1", the batch's metadata, our offset
    return {k: int(v) for k, v in json.loads(lines[2]).items()}


def sink_keys(rows: list[tuple[Any, ...]]) -> list[tuple[str, int]]:
    return [(f"{client}.{shard}", offset) for client, shard, offset, _ in rows]


def archived_rows(dest: str) -> list[tuple[Any, ...]]:
    """Every row of the archive's Parquet files (read with pyarrow), as scanner_rows() gives them."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = []
    for d, _, files in os.walk(dest):
        parts = dict(p.split("=", 1) for p in os.path.relpath(d, dest).split(os.sep) if "=" in p)
        for f in files:
            if not f.endswith(".parquet"):
                continue
            t = pq.read_table(os.path.join(d, f))
            ts = t.column("timestamp").cast(pa.int64()).to_pylist()
            for o, us, ty, k, v in zip(t.column("offset").to_pylist(), ts, t.column("type").to_pylist(),
                                       t.column("key").to_pylist(), t.column("value").to_pylist()):  # fmt: skip
                rows.append((parts["client"], parts["shard"], o, us, ty, k, v))
    return rows


def test_batch_stream_and_archive_on_a_standalone_cluster_of_two_workers(
    cluster: tuple[SparkCluster, dict[str, str]], tmp_path: Path
) -> None:
    spark_cluster, env = cluster
    hub = build_hub(tmp_path)
    state = spark_cluster.state()
    assert state["aliveworkers"] == WORKERS and state["url"] == spark_cluster.master_url
    worker_pids = [w.pid for w in spark_cluster.workers]

    driver = Driver(spark_cluster.master_url, env, tmp_path / "driver.log")
    try:
        assert driver.ready["executors"] == WORKERS
        app_id = driver.ready["app_id"]
        assert app_id.startswith("app-"), app_id  # a standalone application, not local
        # Each worker launched one executor JVM for the driver: a child process of that worker's JVM.
        executor_jvms = {}
        for i, pid in enumerate(worker_pids):
            jvms = [p for p in descendants(pid) if b"CoarseGrainedExecutorBackend" in cmdline(p)]
            assert len(jvms) == 1, f"worker {i + 1} should run one executor, found {jvms}"
            executor_jvms[jvms[0]] = i

        # 1. A batch read of the hub root: the Scanner's rows, each once, read by both executors.
        out = tmp_path / "batch.pickle"
        got = driver.call(scaled(180), cmd="batch", path=hub, options={"minPartitions": "4"}, rows=str(out))
        with open(out, "rb") as f:
            batch = pickle.load(f)
        want = scanner_rows(hub)
        assert len(want) == 2400 and len(batch["rows"]) == len(want) == got["rows"]
        assert set(batch["rows"]) == want  # row for row: client, shard, offset, timestamp (µs), type, key, value
        placement = batch["placement"]
        assert got["partitions"] == len(placement) >= 4
        read = Counter(k for p in placement for k in p["rows"])
        assert set(read) == {(f"{c}.{s}", o) for c, s, o, *_ in want} and set(read.values()) == {1}
        by_executor: dict[str, set[int]] = {}
        for p in placement:
            assert p["executor_jvm_pid"] in executor_jvms, f"partition {p['partition']} ran outside the workers: {p}"
            by_executor.setdefault(p["executor"], set()).add(p["python_pid"])
        assert len(by_executor) == WORKERS, f"every executor should have read partitions: {placement}"
        assert {p["executor_jvm_pid"] for p in placement} == set(executor_jvms)
        a, b = by_executor.values()
        assert not a & b, "each executor has its own Python workers"

        # 2. A streaming availableNow query while a writer process appends, then once more after it has stopped.
        live = os.path.join(hub, LIVE)
        stop_file = tmp_path / "stop-writer"
        writer = popen_python(WRITER, live, str(stop_file), str(scaled(900)), stdout=subprocess.PIPE)
        try:
            wait_until(lambda: os.path.isdir(live) and sej.next_offset(live) >= 100, scaled(30), "the writer to start")
            ck, sink = tmp_path / "ck", tmp_path / "sink"
            stream_cmd = dict(cmd="stream", path=hub, checkpoint=str(ck), sink=str(sink),
                              options={"queryName": QUERY, "maxRecordsPerTrigger": str(LIMIT)})  # fmt: skip
            first = driver.call(scaled(240), rows=str(tmp_path / "sink-1.pickle"), **stream_cmd)
            assert writer.poll() is None, "the writer must still be appending when the first run ends"
            end1 = checkpoint_end(ck)
            assert set(end1) == set(journals_of(hub)) and end1[LIVE] >= 100
            # The writer goes on past what the first run read: the second run has something left to read.
            wait_until(lambda: sej.next_offset(live) > end1[LIVE], scaled(30), "the writer to append past run 1")
            with open(tmp_path / "sink-1.pickle", "rb") as f:
                keys = sink_keys(pickle.load(f))
            assert len(keys) == len(set(keys)), "a row was written twice"
            assert set(keys) == {(j, o) for j, end in end1.items() for o in range(end)}  # up to the checkpoint
            batches = first["batches"]
            assert sum(batches) == len(keys) and max(batches) <= LIMIT and len(batches) >= 3, batches
            stop_file.touch()
            out_text, _ = writer.communicate(timeout=scaled(60))
            assert writer.returncode == 0 and out_text.startswith("done"), out_text
            written = int(out_text.split()[1])
        finally:
            if writer.poll() is None:
                writer.kill()
                writer.wait()
        assert sej.next_offset(live) == written > end1[LIVE]
        second = driver.call(scaled(240), rows=str(tmp_path / "sink-2.pickle"), **stream_cmd)
        with open(tmp_path / "sink-2.pickle", "rb") as f:
            rows = pickle.load(f)
        everything = scanner_rows(hub)
        assert len(rows) == len(everything) == 2400 + written
        assert set(rows) == {(c, s, o, v) for c, s, o, _, _, _, v in everything}  # every message, once
        assert sum(second["batches"]) == len(everything) - len(keys)
        assert checkpoint_end(ck) == {name: sej.next_offset(p) for name, p in journals_of(hub).items()}
        stream_at: dict[str, int] = {}
        for name, path in journals_of(hub).items():  # the query's progress as a reader offset
            at = read_offset_file(os.path.join(path, "ofs", f"spark-{QUERY}.ofs"))
            assert at is not None and 0 < at <= sej.next_offset(path)
            stream_at[name] = at
    finally:
        driver.close()

    # 3. The archive job, sej-archive --master spark://..., as cron runs it.
    dest = str(tmp_path / "archive")
    p = subprocess.run([sys.executable, "-m", "sej.apps.archive", hub, dest, "--master", spark_cluster.master_url],
                       capture_output=True, text=True, env=env, timeout=scaled(300))  # fmt: skip
    assert p.returncode == 0, p.stdout + p.stderr
    archived_to = {}
    for name, path in journals_of(hub).items():
        archived_to[name] = read_offset_file(os.path.join(path, "ofs", "archive.ofs")) or 0
        # Sealed segments only, and only what the stream has read (the stream is a reader of the journal).
        assert archived_to[name] <= min(sej.list_segments(path)[-1].first_offset, stream_at[name])
    assert all(archived_to[f"edge-1.ev.2.00{i}"] > 0 for i in range(4)), archived_to
    expected = {r for r in everything if r[2] < archived_to[f"{r[0]}.{r[1]}"]}
    got_rows = archived_rows(dest)
    assert len(got_rows) == len(set(got_rows)) and set(got_rows) == expected
    assert p.stdout.splitlines()[-1] == f"archived {len(expected)} rows of {len(archived_to)} journals into {dest}"
    # Both applications ran on this cluster: the master lists them, and each worker ran an executor of each.
    state = spark_cluster.state()
    apps = {a["name"]: a for a in state["completedapps"]}
    assert {"sej-cluster-test", "sej-archive"} <= set(apps), state["completedapps"]
    for w in spark_cluster.worker_states():
        assert {app_id, apps["sej-archive"]["id"]} <= {e["appid"] for e in w["finishedexecutors"]}, w
