"""The command line: which benchmarks to run, each measured with the machine's load, then the report written."""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import functools
import os
import shutil
import sys
from collections.abc import Callable
from pathlib import Path

import sej

from .checksums import bench_checksums
from .common import FULL, KEY, QUICK, ROOT, Config, fresh, log, perf_counter, values_for
from .consumer import bench_consumer
from .follow import bench_follow
from .group_commit import bench_group_commit
from .hub import bench_hub_copy, bench_hub_latency, bench_hub_metrics
from .hub_scale import bench_hub_scale
from .hub_sums import bench_hub_sums
from .hub_wan import bench_hub_wan
from .load import CpuShare, LoadTotal, wait_idle
from .open_seek import bench_open_seek
from .report import render, write_report
from .results import Result
from .scan import bench_scan, sej_scan
from .sharded import bench_sharded
from .spark import bench_spark_read, spark_missing, spark_read_all, write_spark_root
from .spark_scale import bench_spark_scale
from .sqlite import bench_sqlite
from .writes import bench_writes, check_same_bytes, sej_append, sej_append_many

DESCRIPTION = "Benchmarks of sej against raw CPython baselines, reported as ratios."

Run = Callable[[Config, Path, set[str]], list[Result]]


def alone(bench: Callable[[Config, Path], list[Result]]) -> Run:
    """A step that measures all its benchmarks whichever --only names were given."""
    return lambda cfg, scratch, _which: bench(cfg, scratch)


# In the order they run and are reported: (the benchmarks it measures, by their --only names; what is logged;
# how to run it, given the names of the benchmarks to run).
STEPS: tuple[tuple[tuple[str, ...], str, Run], ...] = (
    (("append", "append_many"), "benchmarks 1-2: write throughput", bench_writes),
    (("scan",), "benchmark 3: scanning", alone(bench_scan)),
    (("group_commit",), "benchmark 4: durable appends with group commit", alone(bench_group_commit)),
    (("follow",), "benchmark 5: follow latency", alone(bench_follow)),
    (("open_seek",), "benchmark 6: open and seek on a big journal", alone(bench_open_seek)),
    (("sqlite",), "benchmark 7: against SQLite", alone(bench_sqlite)),
    (("sharded",), "benchmark 8: sharded writes", alone(bench_sharded)),
    (("hub_copy",), "benchmark 10: hub copy over SSH", alone(bench_hub_copy)),
    (("hub_latency",), "benchmark 11: append-to-hub latency", alone(bench_hub_latency)),
    (("spark_read",), "benchmark 12: Spark read throughput", alone(bench_spark_read)),
    (("spark_scale",), "benchmark 13: Spark over many small journals", alone(bench_spark_scale)),
    (("hub_scale",), "benchmark 14: the hub at scale, against rsync", alone(bench_hub_scale)),
    (("checksums",), "benchmark 15: what checksums cost", alone(bench_checksums)),
    (("consumer",), "benchmark 16: the consumer over a root", alone(bench_consumer)),
    (("hub_metrics",), "benchmark 17: what the hub's metrics endpoint costs", alone(bench_hub_metrics)),
    (("hub_sums",), "benchmark 18: a hub pass over a journal that flushes every message", alone(bench_hub_sums)),
    (("hub_wan",), "benchmark 19: the hub at a distance, against rsync and scp", alone(bench_hub_wan)),
)
BENCHMARKS = tuple(name for names, _, _ in STEPS for name in names)


def profile(cfg: Config, scratch: Path, which: list[str]) -> None:
    """Print pyinstrument reports of the sej side of benchmarks 1-3, and of benchmark 12's `read_part`."""
    from pyinstrument import Profiler

    values = values_for(cfg.n_write)
    jobs: dict[str, Callable[[], object]] = {
        "append": lambda: sej_append(fresh(scratch / "p-append"), values),
        "append_many": lambda: sej_append_many(fresh(scratch / "p-many"), values, cfg.batch),
    }
    if "scan" in which:
        d = fresh(scratch / "p-scan")
        with sej.Writer(d) as w:
            for _ in range(0, cfg.n_scan, 1000):
                w.append_many(values_for(1000), KEY)
        jobs["scan"] = lambda: sej_scan(d, cfg.n_scan)
    if "spark_read" in which and spark_missing() is not None:
        log(f"{spark_missing()}: skipping spark_read")
        which = [w for w in which if w != "spark_read"]
    if "spark_read" in which:
        root = fresh(scratch / "p-spark")
        write_spark_root(root, cfg.spark_rows)
        spark_read_all(root)  # warm the page cache
        jobs["spark_read"] = lambda: spark_read_all(root)
    for name in which:
        if name not in jobs:
            log(f"--profile covers benchmarks 1-3 and 12 only; skipping {name}")
            continue
        p = Profiler(interval=0.0005)
        p.start()
        jobs[name]()
        p.stop()
        print(f"==== profile of the sej side of {name} ====")
        print(p.output_text(unicode=True, color=False, show_all=False))


def measured(run: Callable[[], list[Result]], wait_idle_seconds: float, load: LoadTotal) -> list[Result]:
    """Run one step with the machine's load measured; each result gets a note saying what the load was.

    With --wait-idle, wait for an idle machine first, and run a step disturbed by other processes (over 10%
    of the CPU time) again, up to twice, keeping the least disturbed attempt.
    """
    attempts: list[tuple[CpuShare, str, list[Result]]] = []
    for _ in range(3 if wait_idle_seconds > 0 else 1):
        waited = wait_idle(wait_idle_seconds)
        with CpuShare() as share:
            got = run()
        load.parts.append(share)
        log(f"  {share.text()}")
        attempts.append((share, waited, got))
        if share.other <= 0.10:
            break
        log("  disturbed by other processes: running it again")
    share, waited, got = min(attempts, key=lambda a: a[0].other)
    note = f"Load: {share.text()}" + (f"; {waited} first" if waited else "")
    if len(attempts) > 1:
        others = ", ".join(f"{a[0].other:.0%}" for a in attempts)
        kept = attempts.index((share, waited, got)) + 1
        note += f"; attempt {kept} of {len(attempts)} kept (other processes' CPU share per attempt: {others})"
    for r in got:
        r.notes.append(note + ".")
    return got


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    ap = argparse.ArgumentParser(description=DESCRIPTION)
    ap.add_argument("--quick", action="store_true", help="smaller sizes for a smoke run")
    ap.add_argument("--only", action="append", metavar="NAME", help=f"run only these ({', '.join(BENCHMARKS)})")
    ap.add_argument("--output", default=str(ROOT / "docs" / "benchmarks.md"), help="report path")
    ap.add_argument("--keep", action="store_true", help="keep the scratch journals")
    ap.add_argument("--scratch", default=str(ROOT / "bench-data"), help="scratch directory (default bench-data/)")
    ap.add_argument(
        "--profile", action="store_true", help="print pyinstrument profiles of benchmarks 1-3 and 12 instead"
    )
    ap.add_argument(
        "--wait-idle",
        type=float,
        default=0,
        metavar="SECONDS",
        help="before each benchmark, wait up to SECONDS for the machine to be idle (other processes < 10%% CPU); "
        "a benchmark disturbed by other processes (> 10%% CPU) is then run again, up to twice, keeping the "
        "least disturbed attempt",
    )
    args = ap.parse_args(argv)
    which = list(BENCHMARKS)
    if args.only:
        names = [n.strip() for o in args.only for n in o.split(",") if n.strip()]
        bad = [n for n in names if n not in BENCHMARKS]
        if bad:
            ap.error(f"unknown benchmark(s) {', '.join(bad)}; choose from {', '.join(BENCHMARKS)}")
        which = [n for n in BENCHMARKS if n in names]
    cfg = dataclasses.replace(QUICK if args.quick else FULL, keep=args.keep)
    scratch = Path(args.scratch).resolve() / f"run-{os.getpid()}"
    scratch.mkdir(parents=True, exist_ok=True)
    started = dt.datetime.now(dt.UTC)
    t_start = perf_counter()
    results: list[Result] = []
    try:
        if args.profile:
            profile(cfg, scratch, which)
            return 0
        check_same_bytes(scratch)
        load = LoadTotal()
        for measures, title, run in STEPS:
            if any(name in which for name in measures):
                log(title)
                results += measured(functools.partial(run, cfg, scratch, set(which)), args.wait_idle, load)
    finally:
        if not args.keep:
            shutil.rmtree(scratch, ignore_errors=True)
            try:
                scratch.parent.rmdir()  # only if empty
            except OSError:
                pass
    seconds = perf_counter() - t_start
    report = render(results, cfg, argv, started, seconds, scratch, load)
    out = Path(args.output)
    write_report(out, report, cfg.quick, which if args.only else None)
    log(f"wrote {out} ({seconds:.0f} s)")
    for r in results:
        for cell, s in r.summaries():
            log(f"  {cell}: {s.measured} / {s.baseline} = {s.ratio} (target {s.target}) {s.result.strip('*')}")
    return 0
