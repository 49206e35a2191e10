"""Benchmark 5: the latency of a follower (`Scanner` with a timeout) behind a writer in another process."""

from __future__ import annotations

import multiprocessing
import shutil
import statistics
import time
from pathlib import Path

import sej

from .common import KEY, TS, VALUE_SIZE, Config, fresh, percentile, perf_counter
from .results import Result, Row, ms, verdict


def _follow_writer(dir: str, count: int, interval: float, ready: object, go: object) -> None:
    """Child process: append `count` messages at a steady pace, the send time in the value."""
    w = sej.Writer(dir, durability="flush")
    ready.set()  # type: ignore[attr-defined]
    go.wait(30)  # type: ignore[attr-defined]
    pad = bytes(VALUE_SIZE - 8)
    pack = TS.pack
    now_ns = time.time_ns
    append = w.append
    next_t = perf_counter()
    for _ in range(count):
        next_t += interval
        d = next_t - perf_counter()
        if d > 0:
            time.sleep(d)
        append(pack(now_ns()) + pad, KEY)
    w.close()


def bench_follow(cfg: Config, scratch: Path) -> list[Result]:
    d = fresh(scratch / "follow")
    sej.Writer(d).close()  # create the journal (an empty segment) so the scanner can open it
    total = cfg.follow_warmup + cfg.follow_n
    ctx = multiprocessing.get_context("spawn")
    ready, go = ctx.Event(), ctx.Event()
    proc = ctx.Process(target=_follow_writer, args=(str(d), total, cfg.follow_interval, ready, go))
    proc.start()
    if not ready.wait(60):
        proc.kill()
        raise SystemExit("bench: the follow writer process did not start")
    sc = sej.Scanner(d, "last", timeout=5)
    lat: list[float] = []
    got = 0
    unpack = TS.unpack_from
    now_ns = time.time_ns
    t0 = perf_counter()
    go.set()
    for m in sc:
        recv = now_ns()
        got += 1
        if got > cfg.follow_warmup:
            lat.append((recv - unpack(m.value)[0]) / 1e9)
        if got >= total:
            break
    elapsed = perf_counter() - t0
    sc.close()
    proc.join(30)
    shutil.rmtree(d)
    if got < total:
        raise SystemExit(f"bench: the follower received {got} of {total} messages")
    lat.sort()
    p50, p90, p99 = (percentile(lat, q) for q in (0.5, 0.9, 0.99))
    mx = lat[-1]
    ok = p99 < 0.010
    rows = [
        Row("p50 latency", ms(p50)),
        Row("p90 latency", ms(p90)),
        Row("p99 latency", ms(p99), "—", "—", "< 10 ms", verdict(ok)),
        Row("max latency", ms(mx)),
        Row("mean latency", ms(statistics.fmean(lat))),
    ]
    return [
        Result(
            "follow",
            "5. Follow latency",
            [
                f"A writer in another process (`multiprocessing`, spawn) appends {total:,} messages at "
                f'~{cfg.follow_interval * 1e3:g} ms intervals with `Writer(durability="flush")` (each `append` '
                f"hands the message to the OS), its `time.time_ns()` at send time in the value. This process "
                f'follows with `Scanner(dir, "last", timeout=5)`; latency = `time.time_ns()` when the message '
                f"is yielded minus its send time.",
            ],
            rows,
            [
                f"One run; the first {cfg.follow_warmup} messages are a warm-up (not counted), then "
                f"{len(lat):,} measured messages in {elapsed:.1f} s. The scanner wakes on inotify events (watchdog).",
            ],
            Row(
                "p99 latency of a follower",
                f"p99 {ms(p99)} (p50 {ms(p50)}, max {ms(mx)})",
                "—",
                "—",
                "p99 < 10 ms",
                verdict(ok),
            ),
        )
    ]
