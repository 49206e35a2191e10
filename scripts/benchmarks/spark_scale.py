"""Benchmark 13: Spark over a hub root of many small journals (packed into few tasks) vs Parquet, a file per journal."""

from __future__ import annotations

import os
import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

import sej

from .common import SHAPE_NAMES, SHAPES, Config, fresh, log, perf_counter, shape_messages
from .results import Result, Row, fmt_list, ratio, verdict
from .spark import spark_missing, spark_query

SCALE_JOURNALS = (10, 100, 1000)  # the series of the plot
SCALE_ROWS = 770  # rows per journal: 2 segments of ~50 KB each, ~100 MB at 1,000 journals
SCALE_SEGMENT = 52_000
PLAN_JOURNALS = 5000  # x 2 segments: the planning benchmark's 10,000 segments
PLOT = "spark_scale.png"  # written into docs/, next to benchmarks.md


def write_hub_root(root: Path, journals: int, pq: Path | None, shape: str = "uniform") -> int:
    """`journals` hub journals (`c<k>.ev.a.<k>`) of SCALE_ROWS random 100-byte values (other shapes: the keys
    and value sizes of `shape_messages`, random bytes or JSON events) in 2 segments each (more for bigger
    values); the same rows as Parquet, one file per journal, into `pq`. Returns the number of segments."""
    import pyarrow as pa
    import pyarrow.parquet as papq

    from sej.spark.batch import SejBatchReader
    from sej.spark.read import read_partition
    from sej.spark.schema import ARROW_SCHEMA

    segments = 0
    pool = shape_messages(shape, 4096) if shape != "uniform" else ([], [])
    for k in range(journals):
        path = root / f"c{k:04d}.ev.a.{k % 1024:03x}"
        blob = os.urandom(100 * SCALE_ROWS)
        with sej.Writer(path, segment_size=SCALE_SEGMENT) as w:
            if shape == "uniform":
                for i in range(SCALE_ROWS):
                    w.append(blob[i * 100 : (i + 1) * 100], key=b"key-%04d" % (i % 4096), type=i & 3)
            else:
                at = k * 97  # each journal from its own place in the pool
                for i in range(SCALE_ROWS):
                    j = (at + i) % 4096
                    w.append(pool[1][j], key=pool[0][j], type=i & 3)
        segments += len(sej.list_segments(path))
        if pq is not None:
            batches = [b for p in SejBatchReader({"path": str(path)}).partitions() for b in read_partition(p)]
            table = pa.Table.from_batches(batches, ARROW_SCHEMA)
            client, shard = path.name.split(".", 1)  # as a read of the whole root names them
            table = table.set_column(0, "client", pa.array([client] * len(table), pa.string()))
            table = table.set_column(1, "shard", pa.array([shard] * len(table), pa.string()))
            papq.write_table(table, pq / f"{path.name}.parquet")
    return segments


FIRST_QUERY = r"""
import sys, time
from sej.spark import spark_session
spark = spark_session("sej-bench-first", "local[2]", **{"spark.ui.enabled": "false"})
spark.sparkContext.setLogLevel("ERROR")
spark.range(1000).selectExpr("sum(id)").collect()  # the JVM's own first query
t0 = time.perf_counter()
spark.read.format("sej").load(sys.argv[1]).rdd.getNumPartitions()
print(time.perf_counter() - t0)
spark.stop()
"""


def first_query_fixed_cost(scratch: Path) -> float:
    """Seconds of the first sej query's planning of a one-message journal, in a new session whose JVM has
    already run a query: what Spark's Python data source machinery costs a first query, whatever the root."""
    import subprocess
    import sys

    one = fresh(scratch / "scale-one")
    with sej.Writer(one) as w:
        w.append(b"x")
    out = subprocess.run([sys.executable, "-c", FIRST_QUERY, str(one)], capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])})  # fmt: skip
    fresh(one)
    return float(out.stdout.split()[-1])


def bench_spark_scale(cfg: Config, scratch: Path) -> list[Result]:
    """Hub roots of 10, 100 and 1,000 small journals: count() and a full read, sej (packed and one task per
    segment) against Parquet (one file per journal); and the planning time of 10,000 segments."""
    missing = spark_missing()
    if missing is not None:
        log(f"  {missing}: skipped")
        return []
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    from sej.spark import spark_session
    from sej.spark.batch import SejBatchReader

    reps = 2 if cfg.quick else 3
    series = SCALE_JOURNALS[:2] if cfg.quick else SCALE_JOURNALS
    roots: dict[int, tuple[Path, Path, int]] = {}
    for n in series:
        root, pq = fresh(scratch / f"scale-sej-{n}"), fresh(scratch / f"scale-pq-{n}")
        pq.mkdir(parents=True)
        roots[n] = (root, pq, write_hub_root(root, n, pq))
    big = max(series)
    shaped: dict[str, tuple[Path, Path]] = {}
    for shape in SHAPES[1:]:  # the other shapes at the largest size
        root, pq = fresh(scratch / f"scale-sej-{shape}"), fresh(scratch / f"scale-pq-{shape}")
        pq.mkdir(parents=True)
        write_hub_root(root, big, pq, shape)
        shaped[shape] = (root, pq)
    fixed = first_query_fixed_cost(scratch)
    plan_root = fresh(scratch / "scale-plan")
    plan_segments = write_hub_root(plan_root, PLAN_JOURNALS // (10 if cfg.quick else 1), None)

    # Planning in this process: the partitions of 10,000 segments (the first call lists and stats
    # every segment with the page cache warm from writing; the second is the same again).
    t_plan_inproc = []
    for _ in range(3):
        t0 = perf_counter()
        parts = SejBatchReader({"path": str(plan_root)}).partitions()
        t_plan_inproc.append(perf_counter() - t0)

    spark = spark_session("sej-bench-scale", "local[2]", **{"spark.ui.enabled": "false",
                                                           "spark.sql.shuffle.partitions": "2"})  # fmt: skip
    try:
        spark.sparkContext.setLogLevel("ERROR")
        # Planning in Spark: the session's first query (Spark's own first-query costs and the start of the
        # Python worker that plans included), then warm.
        t_plan_spark = []
        for _ in range(4):
            t0 = perf_counter()
            plan_parts = spark.read.format("sej").load(str(plan_root)).rdd.getNumPartitions()
            t_plan_spark.append(perf_counter() - t0)
        unpacked = {"openCostInBytes": str(1 << 30)}  # each piece outweighs a task: every segment its own task
        times: dict[tuple[int, str, str], list[float]] = {}
        tasks: dict[tuple[int, str], int] = {}
        for n, (root, pq, segs) in roots.items():
            sources: dict[str, Callable[..., Any]] = {
                "parquet": lambda pq=pq: spark.read.parquet(str(pq)),
                "sej": lambda root=root: spark.read.format("sej").load(str(root)),
                "sej, one task per segment": lambda root=root: (
                    spark.read.format("sej").options(**unpacked).load(str(root))
                ),
                "sej, Spark's open cost (4 MiB)": lambda root=root: (
                    spark.read.format("sej").option("openCostInBytes", str(4 << 20)).load(str(root))
                ),
            }
            for shape, (sroot, spq) in shaped.items() if n == big else ():
                sources[f"parquet, {shape}"] = lambda spq=spq: spark.read.parquet(str(spq))
                sources[f"sej, {shape}"] = lambda sroot=sroot: spark.read.format("sej").load(str(sroot))
            wants = {name: spark_query(make()) for name, make in sources.items() if "," in name and
                     not name.startswith("sej, ")}  # fmt: skip
            want = spark_query(sources["sej"]())  # warm-up, and the answer every run must give
            assert want[0] == n * SCALE_ROWS, want
            for name, make in sources.items():
                tasks[(n, name)] = make().rdd.getNumPartitions()
            assert tasks[(n, "sej, one task per segment")] == segs, (tasks, segs)
            for rep in range(reps):
                for name, make in sources.items():
                    if name == "sej, one task per segment" and (n < max(series) or rep > 0):
                        continue  # slow (a Python worker round trip per task): once, at the largest size
                    if name.startswith("sej, Spark's") and n < max(series):
                        continue
                    for query in ("count", "read"):
                        t0 = perf_counter()
                        got = make().count() if query == "count" else spark_query(make())
                        times.setdefault((n, name, query), []).append(perf_counter() - t0)
                        answer = wants.get(f"parquet, {name.partition(', ')[2]}", want)
                        assert (got == n * SCALE_ROWS) if query == "count" else (got == answer), (name, got)
            log(f"  {n} journals done")
    finally:
        spark.stop()
    sej_mb = sum(f.stat().st_size for f in roots[max(series)][0].rglob("*.jnl")) / 1e6
    pq_mb = sum(f.stat().st_size for f in roots[max(series)][1].glob("*.parquet")) / 1e6
    for d in [plan_root, *(p for r in roots.values() for p in r[:2]), *(p for r in shaped.values() for p in r)]:
        fresh(d)

    best = {k: min(v) for k, v in times.items()}
    r_read = best[(big, "parquet", "read")] / best[(big, "sej", "read")]
    r_count = best[(big, "parquet", "count")] / best[(big, "sej", "count")]
    plan_first, plan_warm = t_plan_spark[0], statistics.median(t_plan_spark[1:])
    rows = []
    for n in series:
        for query, what in (("count", "`count()`"), ("read", "full read (one aggregate over every column)")):
            ours, theirs = best[(n, "sej", query)], best[(n, "parquet", query)]
            rows.append(Row(f"{n:,} journals, {what}: sej ({tasks[(n, 'sej')]} tasks) vs Parquet "
                            f"({tasks[(n, 'parquet')]} tasks)", f"{ours:.2f} s", f"{theirs:.2f} s",
                            ratio(theirs / ours), "≤ 2x Parquet's time (≥ 0.5x)" if n == big else "—",
                            verdict(theirs / ours >= 0.5) if n == big else "info"))  # fmt: skip
    spark_cost = "sej, Spark's open cost (4 MiB)"
    for query in ("count", "read"):
        t1 = best[(big, spark_cost, query)]
        rows.append(Row(f"{big:,} journals, {'`count()`' if query == 'count' else 'full read'} with Spark's "
                        f"`openCostInBytes` of 4 MiB ({tasks[(big, spark_cost)]:,} tasks)",
                        f"{t1:.2f} s", f"{best[(big, 'parquet', query)]:.2f} s",
                        ratio(best[(big, "parquet", query)] / t1)))  # fmt: skip
    for query in ("count", "read"):
        t1 = best[(big, "sej, one task per segment", query)]
        rows.append(Row(f"{big:,} journals, {'`count()`' if query == 'count' else 'full read'} before packing "
                        f"(one task per segment, {tasks[(big, 'sej, one task per segment')]:,} tasks)",
                        f"{t1:.2f} s", f"{best[(big, 'parquet', query)]:.2f} s",
                        ratio(best[(big, "parquet", query)] / t1)))  # fmt: skip
    shape_rows = []
    for shape in shaped:
        ours, theirs = best[(big, f"sej, {shape}", "read")], best[(big, f"parquet, {shape}", "read")]
        shape_rows.append(Row(f"{big:,} journals, full read, {shape}: sej vs Parquet", f"{ours:.2f} s",
                              f"{theirs:.2f} s", ratio(theirs / ours), "≤ 2x Parquet's time (≥ 0.5x)",
                              verdict(theirs / ours >= 0.5)))  # fmt: skip
    rows += shape_rows
    plan_ok = plan_first < 2 and plan_warm < 2
    rows.append(Row(f"planning {plan_segments:,} segments under one root, first query of a session / warm",
                    f"{plan_first:.2f} s / {plan_warm:.2f} s", "—", "—", "< 2 s both", verdict(plan_ok)))  # fmt: skip
    summary = Row(
        f"{big:,} journals, full read: sej vs Parquet (one file per journal)",
        f"{best[(big, 'sej', 'read')]:.2f} s",
        f"{best[(big, 'parquet', 'read')]:.2f} s",
        ratio(r_read),
        "≤ 2x Parquet's time; planning < 2 s",
        verdict(r_read >= 0.5 and r_count >= 0.5 and plan_ok),
    )
    plot_note = _plot(series, best)
    return [
        Result(
            "spark_scale",
            "13. Spark over many small journals (`local[2]`)",
            [
                f"Hub roots of {', '.join(f'{n:,}' for n in series)} journals (`<client>.ev.a.<index>`), each "
                f"{SCALE_ROWS} messages (random 100-byte values, 8-byte keys, types 0-3) in 2 segments of about "
                f"{SCALE_SEGMENT // 1000} KB: {sej_mb:.0f} MB at {big:,} journals. The same rows in Parquet, one "
                f"file per journal written by pyarrow ({pq_mb:.0f} MB at {big:,}), as a job that converted each "
                "journal would leave them. At the largest size also the other shapes, the same way: "
                + "; ".join(SHAPE_NAMES[s] for s in shaped)
                + ".",
                "One SparkSession (`local[2]`, UI off). Each run is a new DataFrame and one query: `count()`, or "
                "the aggregate over every column of benchmark 12 (sums of key and value lengths, so every byte "
                "is read). Tasks: `df.rdd.getNumPartitions()`. sej packs small segments of any journals into a "
                "task as Spark packs small files (`maxBytesPerPartition` 128 MiB, `openCostInBytes` 256 KiB, "
                '`minPartitions` = cores); "before packing" is the same read with `openCostInBytes` = 1 GiB: every '
                "segment then weighs more than a task holds and gets a task of its own, as every read did before.",
                f"Planning: a root of {plan_segments // 2:,} journals x 2 segments. In Spark, "
                "`spark.read.format('sej').load(root).rdd.getNumPartitions()`: the first is the session's first "
                "query (Spark starts the Python worker that plans), then warm. In this process, "
                "`SejBatchReader(...).partitions()`.",
            ],
            rows,
            [
                f"Best of {reps} runs each (before packing: one run). All runs (s): "
                + "; ".join(f"{n:,} {name} {q}: {fmt_list(v)}" for (n, name, q), v in sorted(times.items()))
                + ".",
                f"What a first query costs whatever the root: in a new session whose JVM has already run a query "
                f"(`spark.range`), planning a journal of one message takes {fixed:.2f} s. Spark starts two "
                "Python daemons for it, `pyspark.daemon pyspark.sql.worker.create_data_source` (the schema) and "
                "`... plan_data_source_read` (the partitions), about 1.2 s each (seen by hand with a logging "
                "PYSPARK_PYTHON; a user-given schema does not spare the first). "
                f"Planning in Spark (s): {fmt_list(t_plan_spark)} ({plan_parts} partitions); in this process: "
                f"{fmt_list(t_plan_inproc)} ({len(parts)} partitions), medians "
                f"{statistics.median(t_plan_spark):.2f} s and {statistics.median(t_plan_inproc):.2f} s.",
                plot_note,
            ],
            summary,
            [(s, r) for s, r in zip(shaped, shape_rows)],
        )
    ]


def _plot(series: tuple[int, ...], best: dict[tuple[int, str, str], float]) -> str:
    """docs/spark_scale.png: full-read time against journals, sej and Parquet; a note saying so."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "No plot: matplotlib is not installed (`pip install '.[bench]'`)."
    docs = Path(__file__).resolve().parents[2] / "docs"
    fig, ax = plt.subplots(figsize=(6, 4), dpi=100)
    for name, style in (("sej", "o-"), ("parquet", "s--")):
        ax.plot(series, [best[(n, name, "read")] for n in series], style, label=name)
    big = max(series)
    if (big, "sej, one task per segment", "read") in best:
        ax.plot([big], [best[(big, "sej, one task per segment", "read")]], "x", label="sej, one task per segment")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("journals (2 segments each)")
    ax.set_ylabel("full read, best run (s)")
    ax.set_title("Spark local[2]: a hub root of small journals")
    ax.legend()
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(docs / PLOT)
    plt.close(fig)
    return f"![full-read time against the number of journals, sej and Parquet]({PLOT})"
