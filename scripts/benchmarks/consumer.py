"""Benchmark 16: `sej.Consumer` over a root: throughput against bare Scanners, and follow latency over 1,000
journals with a writer in another process."""

from __future__ import annotations

import gc
import multiprocessing
import random
import shutil
import time
from pathlib import Path

import sej

from .common import (
    KEY,
    SHAPE_NAMES,
    SHAPES,
    TS,
    VALUE_SIZE,
    Config,
    fresh,
    log,
    percentile,
    perf_counter,
    shape_messages,
)
from .results import Result, Row, fmt_list, ms, rate, ratio, verdict


def write_four_shards(root: Path, n: int, shape: str = "uniform") -> list[Path]:
    """n messages of `shape` spread over 4 journals `ev.2.000`..`ev.2.003`."""
    keys, values = shape_messages(shape, n)
    dirs = [root / f"ev.2.{i:03x}" for i in range(4)]
    for k, d in enumerate(dirs):
        part, part_keys = values[k::4], keys[k::4]
        with sej.Writer(d) as w:
            for i in range(0, len(part), 1000):
                w.append_many(part[i : i + 1000], keys=part_keys[i : i + 1000])
    return dirs


def bare_scanners(dirs: list[Path]) -> tuple[float, int]:
    gc.collect()
    t0 = perf_counter()
    n = 0
    for d in dirs:
        with sej.Scanner(d, 0, timeout=0) as s:
            for _ in s:
                n += 1
    return perf_counter() - t0, n


def consumer_run(root: Path, reader: str) -> tuple[float, int]:
    gc.collect()
    t0 = perf_counter()
    n = 0
    with sej.Consumer(root, reader, start="first", commit_every=10_000, follow=False) as c:
        for _ in c:
            n += 1
    return perf_counter() - t0, n


def _follow_writer(root: str, journals: int, count: int, interval: float, ready: object, go: object) -> None:
    """Child process: append `count` messages to random journals of the root at a steady pace, each flushed,
    the send time in the value."""
    writers: dict[int, sej.Writer] = {}
    rng = random.Random(5)
    pad = bytes(VALUE_SIZE - 8)
    pack = TS.pack
    ready.set()  # type: ignore[attr-defined]
    go.wait(60)  # type: ignore[attr-defined]
    next_t = perf_counter()
    for _ in range(count):
        next_t += interval
        d = next_t - perf_counter()
        if d > 0:
            time.sleep(d)
        i = rng.randrange(journals)
        w = writers.get(i)
        if w is None:
            w = writers[i] = sej.Writer(f"{root}/ev.a.{i:03x}", durability="flush")
        w.append(pack(time.time_ns()) + pad, KEY)
    for w in writers.values():
        w.close()


def follow_latency(cfg: Config, scratch: Path, journals: int, commits: bool = True) -> list[float]:
    root = fresh(scratch / "consumer-follow")
    for i in range(journals):
        sej.Writer(root / f"ev.a.{i:03x}").close()
    count = cfg.follow_warmup + cfg.follow_n
    ctx = multiprocessing.get_context("spawn")
    ready, go = ctx.Event(), ctx.Event()
    proc = ctx.Process(target=_follow_writer, args=(str(root), journals, count, cfg.follow_interval, ready, go))
    proc.start()
    if not ready.wait(60):
        proc.kill()
        raise SystemExit("bench: the consumer's writer process did not start")
    lat: list[float] = []
    got = 0
    unpack = TS.unpack_from
    batches = {} if commits else {"commit_every": 1 << 40, "commit_interval": 1e9}  # not: only at the end
    with sej.Consumer(root, "bench", start="last", timeout=30, **batches) as c:  # type: ignore[arg-type]
        go.set()
        for m in c:
            recv = time.time_ns()
            got += 1
            if got > cfg.follow_warmup:
                lat.append((recv - unpack(m.message.value)[0]) / 1e9)
            if got >= count:
                break
    proc.join(60)
    shutil.rmtree(root)
    if got < count:
        raise SystemExit(f"bench: the consumer got {got} of {count} messages")
    return sorted(lat)


def bench_consumer(cfg: Config, scratch: Path) -> list[Result]:
    n = cfg.n_scan
    roots = {shape: fresh(scratch / f"consumer-{shape}") for shape in SHAPES}
    dirs = {shape: write_four_shards(root, n, shape) for shape, root in roots.items()}
    for shape in SHAPES:
        bare_scanners(dirs[shape])  # warm the page cache
    ours_ts: dict[str, list[float]] = {shape: [] for shape in SHAPES}
    bare_ts: dict[str, list[float]] = {shape: [] for shape in SHAPES}
    for rep in range(cfg.reps):  # interleaved
        for shape in SHAPES:
            t, got = bare_scanners(dirs[shape])
            assert got == n
            bare_ts[shape].append(t)
            t, got = consumer_run(roots[shape], f"bench{rep}")
            assert got == n
            ours_ts[shape].append(t)
    for root in roots.values():
        shutil.rmtree(root)
    log("  consumer throughput done")
    ours_t, bare_t = ours_ts["uniform"], bare_ts["uniform"]
    journals = 100 if cfg.quick else 1000
    lat = follow_latency(cfg, scratch, journals)
    quiet = follow_latency(cfg, scratch, journals, commits=False)
    ours, bare = n / min(ours_t), n / min(bare_t)
    r = ours / bare
    p50, p99 = percentile(lat, 0.5), percentile(lat, 0.99)
    rows = [
        Row(
            "`Consumer(root, commit_every=10000)` vs a bare `Scanner` per journal, 4-shard root",
            rate(ours),
            rate(bare),
            ratio(r),
            "≥ 0.8x",
            verdict(r >= 0.8),
        ),  # fmt: skip
        *(
            Row(
                f"the same, {shape}",
                rate(n / min(ours_ts[shape])),
                rate(n / min(bare_ts[shape])),
                ratio(min(bare_ts[shape]) / min(ours_ts[shape])),
                "≥ 0.8x",
                verdict(min(bare_ts[shape]) / min(ours_ts[shape]) >= 0.8),
            )
            for shape in SHAPES[1:]
        ),
        Row(
            f"follow latency over {journals:,} journals, append (flushed, another process) to the consumer's "
            "loop: p50 / p99",
            f"{ms(p50)} / {ms(p99)}",
            "—",
            "—",
            "p99 < 10 ms",
            verdict(p99 < 0.010),
        ),  # fmt: skip
        Row(
            "the same without commits while following (one at the end): p50 / p99",
            f"{ms(percentile(quiet, 0.5))} / {ms(percentile(quiet, 0.99))}",
            "—",
            "—",
            "info",
            "—",
        ),  # fmt: skip
    ]
    return [
        Result(
            "consumer",
            "16. The consumer over a root",
            [
                f"Throughput: {n:,} messages of each shape in 4 journals (page cache warm; "
                + "; ".join(SHAPE_NAMES[s] for s in SHAPES)
                + "), read to the end by one "
                "`sej.Consumer` (start first, commits every 10,000 and at the end) and by one `Scanner(timeout=0)` "
                "per journal, one after the other. Latency: a writer process appends to random journals of a "
                f'root of {journals:,} (`durability="flush"`, one message every {cfg.follow_interval * 1e3:g} ms, '
                "the send time in the value); one consumer follows the whole root.",
            ],
            rows,
            [
                f"Throughput: best of {cfg.reps}, interleaved; all runs (s): "
                + "; ".join(f"{s}: consumer {fmt_list(ours_ts[s])}, scanners {fmt_list(bare_ts[s])}" for s in SHAPES)
                + ". Each message is decoded straight into a `ShardMessage` (its journal "
                "named), the one allocation a bare scanner makes for a `Message`; a batch commit overwrites the "
                "changed offset files in the loop (8 bytes each, in place) and leaves their fdatasyncs to the "
                "consumer's syncer thread. Each run is a new reader, so its first commit also creates the files.",
                f"Latency: {len(lat)} messages after {cfg.follow_warmup} of warm-up, with the default commits "
                "(every 1,000 messages: over 1,000 journals a batch covers hundreds of offset files) and without "
                "any while following. While it waits for messages the consumer writes the positions of the "
                "journals it read since (no fsync), so a batch commit finds little left to write; the syncer "
                "thread fdatasyncs the files. The sweep that looks at every journal once a second (in case a "
                "file event was missed) queues 32 journals per turn, and with inotify the root is listed again "
                "every 10 s instead of every second. Before these, p99 was 27 ms with commits (committer threads "
                "writing each file through a temp file, a rename and two fsyncs) and 5 ms without: a sweep "
                "queued all 1,000 journals at once and listed the root, ~15 ms of work while a new message "
                "waited.",
            ],
            rows[0],
            [(s, row) for s, row in zip(SHAPES[1:], rows[1:3])],
        )
    ]


__all__ = ["bench_consumer"]
