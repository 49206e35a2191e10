"""Benchmark 12: `spark.read.format("sej")` against `spark.read.parquet` of the same rows."""

from __future__ import annotations

import functools
import gc
import os
import random
import shutil
import statistics
from pathlib import Path

import sej

from .common import (
    SEED,
    SHAPE_NAMES,
    SHAPES,
    VALUE_SIZE,
    Config,
    fresh,
    log,
    perf_counter,
    shape_messages,
    sharded_keys,
    tree_bytes,
)
from .load import my_tree, processes
from .results import Result, Row, fmt_list, ms, ratio, verdict

SPARK_SEGMENT = 32 << 20  # segment size of benchmark 12's journals
SPARK_TINY = 1000  # rows of benchmark 12's fixed-cost query


def spark_missing() -> str | None:
    """Why benchmark 12 cannot run here (pyspark, pyarrow or Java missing), or None."""
    import importlib.util

    for mod in ("pyspark", "pyarrow"):
        if importlib.util.find_spec(mod) is None:
            return f"{mod} is not installed (pip install 'sej-journal[spark]')"
    if not os.environ.get("JAVA_HOME") and shutil.which("java") is None:
        return "Java is missing (no java on PATH and JAVA_HOME unset)"
    return None


def write_spark_root(root: Path, n: int, shape: str = "uniform") -> int:
    """n messages (types 0-3, timestamps now) in 4 shards; the bytes of their values.

    uniform: unique random 100-byte values, 8-byte keys drawn from 4,096. Other shapes: the keys and value
    sizes of `shape_messages`, each value unique (random bytes of that size, or the JSON event with a
    sequence number first), so that Parquet cannot dictionary-encode repeated values.
    """
    if shape == "uniform":
        keys = sharded_keys(n)
    else:
        keys, values = shape_messages(shape, n)
        rng = random.Random(SEED)
    total = 0
    with sej.ShardedWriter(root, "s", shard_bit=2, segment_size=SPARK_SEGMENT) as w:
        append = w.append
        for start in range(0, n, 10_000):
            blob = os.urandom(VALUE_SIZE * 10_000 if shape == "uniform" else 1 << 20)
            for i in range(min(10_000, n - start)):
                if shape == "uniform":
                    value = blob[i * VALUE_SIZE : (i + 1) * VALUE_SIZE]
                elif shape == "json":
                    value = b'{"seq":%d,' % (start + i) + values[start + i][1:]
                else:
                    size = len(values[start + i])
                    at = rng.randrange(0, len(blob) - size)
                    value = blob[at : at + size]
                append(value, keys[start + i], (start + i) & 3)
                total += len(value)
    return total


def spark_read_all(root: Path) -> int:
    """Benchmark 12's decoding without Spark: `read_part` of every partition, in this process; the row count."""
    from sej.spark.batch import SejBatchReader
    from sej.spark.read import read_partition

    return sum(b.num_rows for p in SejBatchReader({"path": str(root)}).partitions() for b in read_partition(p))


def spark_cpu() -> tuple[float, float]:
    """CPU seconds used so far by this process's descendants: (Java, Python workers and other children)."""
    hz = os.sysconf("SC_CLK_TCK")
    procs = processes()
    java = python = 0
    for pid in my_tree(procs) - {os.getpid()}:
        p = procs[pid]
        if p.comm == "java":
            java += p.own
            python += p.reaped
        else:
            python += p.own + p.reaped
    return java / hz, python / hz


def spark_query(df: object) -> tuple[object, ...]:
    """One aggregate over every column: each value's length, so no row can be skipped."""
    from pyspark.sql import functions as F

    row = df.agg(  # type: ignore[attr-defined]
        F.count(F.lit(1)),
        F.count("client"),
        F.max("shard"),
        F.max("offset"),
        F.max("timestamp"),
        F.sum("type"),
        F.sum(F.length("key")),
        F.sum(F.length("value")),
    ).collect()[0]
    return tuple(row)


def bench_spark_read(cfg: Config, scratch: Path) -> list[Result]:
    """`spark.read.format("sej")` vs `spark.read.parquet` of the same rows, one aggregate over every column."""
    missing = spark_missing()
    if missing is not None:
        log(f"  {missing}: skipped")
        return []
    n, reps = cfg.spark_rows, cfg.spark_reps
    root, pq = fresh(scratch / "spark-sej"), fresh(scratch / "spark-parquet")
    tiny, tiny_pq = fresh(scratch / "spark-sej-tiny"), fresh(scratch / "spark-parquet-tiny")
    write_spark_root(root, n)
    write_spark_root(tiny, SPARK_TINY)
    shaped = {shape: (fresh(scratch / f"spark-sej-{shape}"), fresh(scratch / f"spark-parquet-{shape}")) for shape in
              SHAPES[1:]}  # fmt: skip
    shaped_bytes = {shape: write_spark_root(r, n, shape) for shape, (r, _) in shaped.items()}
    t_inproc = []
    for _ in range(3):  # read_part alone, in this process: no Spark
        t0 = perf_counter()
        assert spark_read_all(root) == n
        t_inproc.append(perf_counter() - t0)
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    from sej.spark import spark_session
    from sej.spark.batch import SejBatchReader

    parts = len(SejBatchReader({"path": str(root)}).partitions())
    segments = sum(len(sej.list_segments(j)) for j in sorted(root.iterdir()))
    spark = spark_session("sej-bench", "local[2]", **{"spark.ui.enabled": "false", "spark.sql.shuffle.partitions": "2"})
    try:
        spark.sparkContext.setLogLevel("ERROR")
        spark.read.format("sej").load(str(root)).write.parquet(str(pq))
        spark.read.format("sej").load(str(tiny)).write.parquet(str(tiny_pq))
        for r, p in shaped.values():
            spark.read.format("sej").load(str(r)).write.parquet(str(p))
        pq_files = sorted(pq.glob("*.parquet"))
        sources = {
            "parquet": lambda: spark.read.parquet(str(pq)),
            "sej": lambda: spark.read.format("sej").load(str(root)),
        }
        want = spark_query(sources["sej"]())  # warm-up: JIT, Python workers
        assert want[0] == n and want[7] == n * VALUE_SIZE, want
        assert spark_query(sources["parquet"]()) == want
        wanted = {"uniform": want}
        for shape, (r, p) in shaped.items():
            sources[f"parquet-{shape}"] = functools.partial(spark.read.parquet, str(p))
            sources[f"sej-{shape}"] = functools.partial(spark.read.format("sej").load, str(r))
            got = spark_query(sources[f"sej-{shape}"]())
            assert got[0] == n and got[7] == shaped_bytes[shape], (shape, got)
            assert spark_query(sources[f"parquet-{shape}"]()) == got
            wanted[shape] = got
        t: dict[str, list[float]] = {name: [] for name in sources}
        cpu: dict[str, list[tuple[float, float]]] = {name: [] for name in sources}
        for rep in range(reps):  # interleaved, so drifts of the machine hit both sides alike
            for name in sources:
                j0, p0 = spark_cpu()
                gc.collect()
                t0 = perf_counter()
                got = spark_query(sources[name]())
                t[name].append(perf_counter() - t0)
                j1, p1 = spark_cpu()
                cpu[name].append((j1 - j0, p1 - p0))
                assert got == wanted[name.partition("-")[2] or "uniform"], (name, got)
            log(f"  spark rep {rep + 1}/{reps} done")
        pq_parts = sources["parquet"]().rdd.getNumPartitions()
        t_tiny: dict[str, list[float]] = {"sej": [], "parquet": []}
        tiny_sources = {
            "parquet": lambda: spark.read.parquet(str(tiny_pq)),
            "sej": lambda: spark.read.format("sej").load(str(tiny)),
        }
        for _ in range(3):
            for name in ("parquet", "sej"):
                t0 = perf_counter()
                assert spark_query(tiny_sources[name]())[0] == SPARK_TINY
                t_tiny[name].append(perf_counter() - t0)
    finally:
        spark.stop()
    sej_bytes, pq_bytes = tree_bytes(root), sum(f.stat().st_size for f in pq_files)
    for d in (root, pq, tiny, tiny_pq, *(d for pair in shaped.values() for d in pair)):
        fresh(d)
    ours, theirs = n / min(t["sej"]), n / min(t["parquet"])
    r = ours / theirs
    ok = ours >= 1_000_000 and r >= 0.2
    row = Row(
        '`spark.read.format("sej")` vs `spark.read.parquet`, `local[2]`, one aggregate over every column',
        f"{ours:,.0f} rows/s",
        f"{theirs:,.0f} rows/s",
        ratio(r),
        "≥ 1,000,000 rows/s and ≥ 0.2x (Parquet at most 5x faster)",
        verdict(ok),
    )
    shape_rows = []
    for shape in shaped:
        o, p = n / min(t[f"sej-{shape}"]), n / min(t[f"parquet-{shape}"])
        shape_rows.append(Row(f"the same, {shape}", f"{o:,.0f} rows/s", f"{p:,.0f} rows/s", ratio(o / p), "≥ 0.6x",
                              verdict(o / p >= 0.6)))  # fmt: skip
    med_ours, med_theirs = n / statistics.median(t["sej"]), n / statistics.median(t["parquet"])

    def cpu_text(name: str) -> str:
        java = statistics.median(c[0] for c in cpu[name])
        python = statistics.median(c[1] for c in cpu[name])
        return f"Java {java:.2f} s + Python {python:.2f} s"

    return [
        Result(
            "spark_read",
            "12. Spark read throughput (`local[2]`)",
            [
                f"{n:,} messages (unique random 100-byte values, 8-byte keys drawn from 4,096, types 0-3, "
                f"`time.time_ns()` timestamps) in a sharded root of 4 journals ({segments} segments of up to "
                f"{SPARK_SEGMENT >> 20} MiB, {sej_bytes / 2**20:.0f} MiB; {parts} partitions), page cache warm. "
                f"The same rows are written to Parquet by Spark in the same session "
                f'(`spark.read.format("sej").load(root).write.parquet(path)`: {len(pq_files)} files, '
                f"{pq_bytes / 2**20:.0f} MiB, Spark's default snappy compression; {pq_parts} input partitions).",
                'One SparkSession from `sej.spark.spark_session("sej-bench", "local[2]")` '
                "(`SPARK_LOCAL_IP=127.0.0.1`, UI off, 2 shuffle partitions). Each run is one query, "
                "`df.agg(count(1), count(client), max(shard), max(offset), max(timestamp), sum(type), "
                "sum(length(key)), sum(length(value))).collect()`, on a new DataFrame of each source; the clock "
                "covers planning, the scan and the aggregate. The sums of key and value lengths and of types need "
                "every row's bytes: Parquet's footer holds only per-column min/max/null counts, and Spark's "
                "default Parquet scan (V1 `FileScan`, vectorized) pushes no aggregate down, so it reads and "
                "decodes every value of the 7 columns too. Both sides return the same row (checked on every run). "
                "The values are unique, as payloads usually are: repeated values (like the 1,024 cycled ones of "
                "the other benchmarks) would let Parquet dictionary-encode the column and scan faster.",
                f"The other shapes, the same way ({n:,} rows each, unique values): "
                + "; ".join(f"{SHAPE_NAMES[s]}, {shaped_bytes[s] / n:.0f} B per value on average" for s in shaped)
                + ". Their target is issue 40's: at least 0.6x Parquet.",
            ],
            [row, *shape_rows],
            [
                f"Best of {reps} runs, interleaved (Parquet, then sej); all runs (s): sej {fmt_list(t['sej'])}, "
                f"Parquet {fmt_list(t['parquet'])}; medians sej {med_ours:,.0f} rows/s, Parquet "
                f"{med_theirs:,.0f} rows/s, ratio {ratio(med_ours / med_theirs)}. Parquet/sej of the best runs: "
                f"{theirs / ours:.2f}x. Other shapes, all runs (s): "
                + "; ".join(
                    f"{s}: sej {fmt_list(t['sej-' + s])}, Parquet {fmt_list(t['parquet-' + s])}" for s in shaped
                )
                + ".",
                f"Fixed cost of one query: the same query on {SPARK_TINY:,} rows takes {ms(min(t_tiny['sej']))} "
                f"(sej) and {ms(min(t_tiny['parquet']))} (Parquet), best of 3.",
                f"CPU per run (median): sej {cpu_text('sej')}, Parquet {cpu_text('parquet')} (Java: Spark's JVM; "
                "Python: every Python process Spark started, the read workers and each query's planning "
                f"workers). The decoding alone, `read_part` of every partition in this process without Spark, "
                f"runs at {n / min(t_inproc):,.0f} rows/s on one core (best of 3). A Java Flight Recorder profile "
                "of the sej query (taken by hand) puts most of the JVM's time in turning the Arrow batches into "
                "rows: null checks, and copying keys, values and shard names into UnsafeRows.",
            ],
            row,
            [(s, r) for s, r in zip(shaped, shape_rows)],
        )
    ]
