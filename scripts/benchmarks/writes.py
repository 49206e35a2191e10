"""Benchmarks 1 and 2: `Writer.append` and `Writer.append_many` against a raw `f.write` loop."""

from __future__ import annotations

import gc
import shutil
import time
from collections.abc import Callable
from pathlib import Path

import sej

from .common import FRAME_SIZE, KEY, RAW, VALUE_SIZE, Config, fresh, log, perf_counter, values_for
from .results import Result, Row, fmt_list, medians, rate, ratio, verdict


def raw_write(path: Path, values: list[bytes]) -> float:
    """The raw CPython limit: one precompiled pack and one buffered f.write per record."""
    pack = RAW.pack
    now = time.time_ns
    key = KEY
    klen = len(KEY)
    with open(path, "wb") as f:
        write = f.write
        gc.collect()
        t0 = perf_counter()
        for off, v in enumerate(values):
            write(pack(off, now(), 0, klen, key, VALUE_SIZE, v, FRAME_SIZE))
        f.flush()
        t = perf_counter() - t0
    return t


def raw_write_const_ts(path: Path, values: list[bytes]) -> float:
    """As raw_write, with one timestamp for all records (like append_many's one per batch)."""
    pack = RAW.pack
    key = KEY
    klen = len(KEY)
    ts = time.time_ns()
    with open(path, "wb") as f:
        write = f.write
        gc.collect()
        t0 = perf_counter()
        for off, v in enumerate(values):
            write(pack(off, ts, 0, klen, key, VALUE_SIZE, v, FRAME_SIZE))
        f.flush()
        t = perf_counter() - t0
    return t


def timed_writer(dir: Path, n: int, feed: Callable[[sej.Writer], None]) -> float:
    """Seconds `feed(writer)` plus the final flush take on a fresh buffered Writer that ends with n messages."""
    w = sej.Writer(dir, durability="buffered")
    try:
        gc.collect()
        t0 = perf_counter()
        feed(w)
        w.flush()
        t = perf_counter() - t0
    finally:
        w.close()
    assert w.next_offset == n
    return t


def sej_append(dir: Path, values: list[bytes]) -> float:
    def feed(w: sej.Writer) -> None:
        append, key = w.append, KEY
        for v in values:
            append(v, key)

    return timed_writer(dir, len(values), feed)


def sej_append_many(dir: Path, values: list[bytes], batch: int) -> float:
    batches = [values[i : i + batch] for i in range(0, len(values), batch)]

    def feed(w: sej.Writer) -> None:
        append_many, key = w.append_many, KEY
        for b in batches:
            append_many(b, key)

    return timed_writer(dir, len(values), feed)


def check_same_bytes(scratch: Path) -> None:
    """The raw loop must write exactly the frames sej writes, or the comparison is unfair."""
    vals = values_for(100)
    d = fresh(scratch / "check")
    with sej.Writer(d) as w:
        for v in vals:
            w.append(v, KEY, timestamp=12345)
    ours = Path(sej.list_segments(d)[0].path).read_bytes()
    raw = b"".join(RAW.pack(i, 12345, 0, len(KEY), KEY, VALUE_SIZE, v, FRAME_SIZE) for i, v in enumerate(vals))
    if ours != raw:
        raise SystemExit("bench: the raw baseline's frames differ from sej's; the comparison would be meaningless")
    shutil.rmtree(d)


def bench_writes(cfg: Config, scratch: Path, which: set[str]) -> list[Result]:
    n = cfg.n_write
    values = values_for(n)
    raw_t: list[float] = []
    raw_c: list[float] = []
    app_t: list[float] = []
    many_t: list[float] = []
    for rep in range(cfg.reps):  # interleaved, so drifts of the machine hit every side alike
        raw_t.append(raw_write(fresh(scratch / "raw.jnl"), values))
        raw_c.append(raw_write_const_ts(fresh(scratch / "raw.jnl"), values))
        if "append" in which:
            app_t.append(sej_append(fresh(scratch / "append"), values))
        if "append_many" in which:
            many_t.append(sej_append_many(fresh(scratch / "append_many"), values, cfg.batch))
        log(f"  writes rep {rep + 1}/{cfg.reps} done")
    for p in ("raw.jnl", "append", "append_many"):
        if (scratch / p).exists():
            fresh(scratch / p)
    raw = n / min(raw_t)
    raw_const = n / min(raw_c)
    raw_what = (
        "Baseline: `for off, v in enumerate(values): f.write(S.pack(off, time.time_ns(), 0, 8, key, 100, v, 134))` "
        "with `S = struct.Struct('>QqBb8si100si')` precompiled, `f = open(path, 'wb')` (buffered), then `f.flush()`. "
        "It writes byte-identical frames (checked at start-up)."
    )
    out = []
    if "append" in which:
        ours = n / min(app_t)
        r = ours / raw
        row = Row(
            "`Writer.append` (buffered) vs raw loop", rate(ours), rate(raw), ratio(r), "≥ 0.5x", verdict(r >= 0.5)
        )
        out.append(
            Result(
                "append",
                "1. `Writer.append` throughput",
                [
                    f"{n:,} messages, one `w.append(value, key)` call each "
                    f"(timestamp=None: `time.time_ns()` per message), "
                    f'`durability="buffered"`, then `w.flush()`; the clock covers the loop and the flush '
                    f"(not opening or closing the writer).",
                    raw_what,
                ],
                [row],
                [
                    f"Best of {cfg.reps} runs, raw and sej runs interleaved; all runs (s): "
                    f"sej {fmt_list(app_t)}, raw {fmt_list(raw_t)}.",
                    medians(n, app_t, raw_t),
                    f"For reference, the raw loop with one constant timestamp instead of `time.time_ns()` per record: "
                    f"{rate(raw_const)}.",
                ],
                row,
            )
        )
    if "append_many" in which:
        ours = n / min(many_t)
        r = ours / raw
        row = Row(
            f"`Writer.append_many` (batches of {cfg.batch}) vs raw loop",
            rate(ours),
            rate(raw),
            ratio(r),
            "≥ 0.8x",
            verdict(r >= 0.8),
        )
        r2 = ours / raw_const
        out.append(
            Result(
                "append_many",
                "2. `Writer.append_many` throughput",
                [
                    f"{n:,} messages in batches of {cfg.batch} (lists prepared before the clock starts), "
                    f'`w.append_many(batch, key)` (one timestamp per batch), `durability="buffered"`, '
                    f"then `w.flush()`.",
                    raw_what + " Same raw loop and figure as benchmark 1.",
                ],
                [
                    row,
                    Row(
                        "same, vs raw loop with a constant timestamp",
                        rate(ours),
                        rate(raw_const),
                        ratio(r2),
                        "—",
                        "info",
                    ),
                ],
                [
                    f"Best of {cfg.reps} runs, interleaved with the raw runs; all runs (s): sej {fmt_list(many_t)}, "
                    f"raw {fmt_list(raw_t)}, raw with constant timestamp {fmt_list(raw_c)}.",
                    medians(n, many_t, raw_t),
                ],
                row,
            )
        )
    return out
