"""Benchmark 7: against SQLite, the log a Python user would otherwise pick."""

from __future__ import annotations

import gc
import os
import sqlite3
import statistics
import time
from pathlib import Path

import sej

from .common import KEY, VALUE_SIZE, Config, fresh, log, perf_counter, tree_bytes, values_for
from .results import Result, Row, fmt_list, rate, ratio
from .scan import sej_scan
from .writes import sej_append, sej_append_many

SQL_CREATE = (
    "CREATE TABLE log (offset INTEGER PRIMARY KEY, ts INTEGER NOT NULL, type INTEGER NOT NULL, "
    "key BLOB NOT NULL, value BLOB NOT NULL)"
)
SQL_INSERT = "INSERT INTO log (offset, ts, type, key, value) VALUES (?, ?, ?, ?, ?)"
SQL_SCAN = "SELECT offset, ts, type, key, value FROM log ORDER BY offset"


def sqlite_db(dir: Path) -> Path:
    """A fresh directory holding one database (with its -wal and -shm files, so all are deleted together)."""
    fresh(dir).mkdir()
    return dir / "log.db"


def sqlite_open(db: Path, synchronous: str) -> sqlite3.Connection:
    """A new log table in WAL mode. Default isolation_level: INSERTs begin a transaction, commit() ends it."""
    conn = sqlite3.connect(db)
    (mode,) = conn.execute("PRAGMA journal_mode=WAL").fetchone()
    assert mode == "wal", mode
    conn.execute(f"PRAGMA synchronous={synchronous}")
    conn.execute(SQL_CREATE)
    conn.commit()
    return conn


def sqlite_count(conn: sqlite3.Connection) -> int:
    (count,) = conn.execute("SELECT count(*) FROM log").fetchone()
    return int(count)


def sqlite_append_many(db: Path, values: list[bytes], batch: int) -> float:
    batches = [values[i : i + batch] for i in range(0, len(values), batch)]
    conn = sqlite_open(db, "NORMAL")
    try:
        executemany = conn.executemany
        commit = conn.commit
        now = time.time_ns
        key = KEY
        sql = SQL_INSERT
        off = 0
        gc.collect()
        t0 = perf_counter()
        for b in batches:
            ts = now()
            executemany(sql, [(off + i, ts, 0, key, v) for i, v in enumerate(b)])
            commit()
            off += len(b)
        t = perf_counter() - t0
        count = sqlite_count(conn)
    finally:
        conn.close()
    assert count == len(values), count
    return t


def sqlite_append(db: Path, values: list[bytes]) -> float:
    conn = sqlite_open(db, "NORMAL")
    try:
        execute = conn.cursor().execute
        now = time.time_ns
        key = KEY
        sql = SQL_INSERT
        gc.collect()
        t0 = perf_counter()
        for off, v in enumerate(values):
            execute(sql, (off, now(), 0, key, v))
        conn.commit()
        t = perf_counter() - t0
        count = sqlite_count(conn)
    finally:
        conn.close()
    assert count == len(values), count
    return t


def sqlite_scan(db: Path, n: int) -> float:
    gc.collect()
    t0 = perf_counter()
    conn = sqlite3.connect(db)
    count = 0
    total = 0
    for row in conn.execute(SQL_SCAN):
        total += len(row[4])
        count += 1
    t = perf_counter() - t0
    conn.close()
    assert count == n and total == n * VALUE_SIZE, (count, total)
    return t


def sqlite_sync_each(db: Path, seconds: float) -> tuple[int, float]:
    """Rows inserted and committed one at a time with synchronous=FULL in `seconds`."""
    value = os.urandom(VALUE_SIZE)
    conn = sqlite_open(db, "FULL")
    try:
        execute = conn.cursor().execute
        commit = conn.commit
        now = time.time_ns
        key = KEY
        sql = SQL_INSERT
        n = 0
        t0 = perf_counter()
        deadline = t0 + seconds
        while perf_counter() < deadline:
            execute(sql, (n, now(), 0, key, value))
            commit()
            n += 1
        t = perf_counter() - t0
        count = sqlite_count(conn)
    finally:
        conn.close()
    assert count == n, (count, n)
    return n, t


def sej_sync_each(dir: Path, seconds: float) -> tuple[int, float]:
    """Messages appended one at a time by one thread on a Writer(durability="sync") in `seconds`."""
    value = os.urandom(VALUE_SIZE)
    w = sej.Writer(dir, durability="sync")
    try:
        append = w.append
        key = KEY
        n = 0
        t0 = perf_counter()
        deadline = t0 + seconds
        while perf_counter() < deadline:
            append(value, key)
            n += 1
        t = perf_counter() - t0
    finally:
        w.close()
    assert w.next_offset == n, (w.next_offset, n)
    return n, t


def bench_sqlite(cfg: Config, scratch: Path) -> list[Result]:
    n = cfg.n_write
    reps = cfg.sqlite_reps
    values = values_for(n)
    t: dict[str, list[float]] = {k: [] for k in ("sej_many", "sq_many", "sej_one", "sq_one", "sej_scan", "sq_scan")}
    for rep in range(reps):  # interleaved, so drifts of the machine hit every side alike
        t["sej_many"].append(sej_append_many(fresh(scratch / "sq-sej-many"), values, cfg.batch))
        t["sq_many"].append(sqlite_append_many(sqlite_db(scratch / "sq-many"), values, cfg.batch))
        t["sej_one"].append(sej_append(fresh(scratch / "sq-sej-one"), values))
        t["sq_one"].append(sqlite_append(sqlite_db(scratch / "sq-one"), values))
        log(f"  sqlite writes rep {rep + 1}/{reps} done")
    del values
    # Scan what the last batch runs wrote (both closed: the SQLite WAL is checkpointed into the database).
    jdir, db = scratch / "sq-sej-many", scratch / "sq-many" / "log.db"
    sej_size, sq_size = tree_bytes(jdir), tree_bytes(db.parent)
    sej_scan(jdir, n)  # warm the page caches
    sqlite_scan(db, n)
    for rep in range(reps):
        t["sej_scan"].append(sej_scan(jdir, n))
        t["sq_scan"].append(sqlite_scan(db, n))
        log(f"  sqlite scan rep {rep + 1}/{reps} done")
    secs = cfg.fsync_seconds
    sej_sync: list[tuple[int, float]] = []
    sq_sync: list[tuple[int, float]] = []
    for rep in range(cfg.sqlite_sync_reps):
        sej_sync.append(sej_sync_each(fresh(scratch / "sq-sej-sync"), secs))
        sq_sync.append(sqlite_sync_each(sqlite_db(scratch / "sq-sync"), secs))
        log(f"  sqlite durable rep {rep + 1}/{cfg.sqlite_sync_reps} done")
    for p in ("sq-sej-many", "sq-many", "sq-sej-one", "sq-one", "sq-sej-sync", "sq-sync"):
        fresh(scratch / p)
    probe = sqlite3.connect(":memory:")
    page_size = probe.execute("PRAGMA page_size").fetchone()[0]
    cache_size = probe.execute("PRAGMA cache_size").fetchone()[0]
    autocheckpoint = probe.execute("PRAGMA wal_autocheckpoint").fetchone()[0]
    probe.close()

    def best(k: str) -> float:
        return n / min(t[k])

    def med_rate(runs: list[tuple[int, float]]) -> float:
        return statistics.median(c / s for c, s in runs)

    def row(label: str, ours: float, theirs: float) -> Row:
        return Row(label, rate(ours), rate(theirs), ratio(ours / theirs))

    d_sej, d_sq = med_rate(sej_sync), med_rate(sq_sync)
    rows = [
        row(
            f"batch append: `append_many` (batches of {cfg.batch}) vs `executemany` + `commit` per batch",
            best("sej_many"),
            best("sq_many"),
        ),
        row("single appends: `append` vs `execute` per row, one `commit`", best("sej_one"), best("sq_one")),
        row("scan: `Scanner` vs `SELECT … ORDER BY offset`", best("sej_scan"), best("sq_scan")),
        row(
            'durable appends, 1 thread: `Writer(durability="sync")` vs `commit` per row (`synchronous=FULL`)',
            d_sej,
            d_sq,
        ),
    ]

    def runs(label: str, a: str, b: str) -> str:
        mo, mr = n / statistics.median(t[a]), n / statistics.median(t[b])
        return (
            f"{label}: all runs (s) sej {fmt_list(t[a])}, SQLite {fmt_list(t[b])}; "
            f"medians sej {rate(mo)}, SQLite {rate(mr)}, ratio {ratio(mo / mr)}."
        )

    version = sqlite3.sqlite_version
    return [
        Result(
            "sqlite",
            "7. Against SQLite, the log a Python user would otherwise pick",
            [
                f"The same messages kept in SQLite {version} through the standard library's `sqlite3`, as a "
                "message log: one table `log (offset INTEGER PRIMARY KEY, ts INTEGER NOT NULL, type INTEGER NOT "
                "NULL, key BLOB NOT NULL, value BLOB NOT NULL)` in a new database per run, "
                "`PRAGMA journal_mode=WAL`. Each row holds the offset (counted by the caller, as sej counts its "
                "own), a `time.time_ns()` timestamp, type 0, the 8-byte key and the 100-byte value. "
                "Ratios are sej ÷ SQLite.",
                f"Batch append: {n:,} messages in batches of {cfg.batch} (lists prepared before the clock starts). "
                'sej: `w.append_many(batch, key)`, `durability="buffered"`, then `w.flush()`. '
                "SQLite (`synchronous=NORMAL`): per batch `conn.executemany(INSERT, rows)` with the rows built "
                "from the batch inside the clock (one timestamp per batch, like `append_many`), then "
                "`conn.commit()`: one transaction per batch.",
                f"Single appends: the same {n:,} messages one call each. "
                'sej: `w.append(value, key)`, `durability="buffered"`, then `w.flush()`. '
                "SQLite (`synchronous=NORMAL`): `cur.execute(INSERT, (offset, time.time_ns(), 0, key, value))` "
                "on one cursor per row, one `conn.commit()` at the end. The write clocks cover the loop and the "
                "final flush or commit, not opening (connecting, pragmas, `CREATE TABLE`) or closing.",
                f"Scan: the journal and the database written by the last batch runs ({n:,} messages; sej "
                f"{sej_size / 2**20:.1f} MiB on disk, SQLite {sq_size / 2**20:.1f} MiB; page cache warm). "
                "sej: `Scanner(dir, 0, timeout=0)` iterated to the end touching `len(m.value)`. SQLite: "
                f"`sqlite3.connect(path)`, then `{SQL_SCAN}` iterated to the end touching `len(row[4])`. "
                "Both clocks include the opening.",
                f"Durable appends: one thread appending for {secs:g} s. "
                'sej: `Writer(durability="sync")`, `w.append(value, key)` per message (it returns once fsynced). '
                "SQLite (`synchronous=FULL`): `INSERT` then `conn.commit()` per row (each commit fsyncs the WAL).",
            ],
            rows,
            [
                f"SQLite {version} (Python `sqlite3` module, default `isolation_level`: an INSERT begins a "
                "transaction and `commit()` ends it); `journal_mode=WAL`; `synchronous=NORMAL` for batch and single "
                "appends, `synchronous=FULL` for durable appends; other settings at their defaults "
                f"(page_size {page_size}, cache_size {cache_size}, wal_autocheckpoint {autocheckpoint} pages).",
                "Durability is not quite like for like in the first two rows: sej's buffered writes are never "
                "fsynced (`flush()` hands them to the OS), while SQLite with `synchronous=NORMAL` commits to the "
                "OS and fsyncs at each WAL checkpoint. Both sides lose nothing if the process dies after "
                "`flush()`/`commit()`. In the durable row both fsync every message.",
                f"Throughput rows: best of {reps} runs, sej and SQLite runs interleaved.",
                runs("Batch append", "sej_many", "sq_many"),
                runs("Single appends", "sej_one", "sq_one"),
                runs("Scan", "sej_scan", "sq_scan"),
                f"Durable appends: median of {cfg.sqlite_sync_reps} run{'s' if cfg.sqlite_sync_reps > 1 else ''} of "
                f"{secs:g} s, interleaved; runs (msg/s): "
                f"sej {', '.join(f'{c / s:,.0f}' for c, s in sej_sync)}, "
                f"SQLite {', '.join(f'{c / s:,.0f}' for c, s in sq_sync)}.",
            ],
            rows[0],
        )
    ]
