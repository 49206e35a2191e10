"""Benchmarks 6 and 9: opening a big journal and seeking to its middle; `sej scan --count` on it."""

from __future__ import annotations

import gc
import os
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

import sej

from .common import FRAME_SIZE, HEAD, I32, KEY, Config, fresh, log, perf_counter, values_for
from .results import Result, Row, fmt_list, ms, rate, ratio, verdict


def raw_count(path: str) -> int:
    """Count the frames of a segment with a raw struct.unpack_from loop over 16 MiB reads."""
    head = HEAD.unpack_from
    i32 = I32.unpack_from
    n = 0
    rest = b""
    with open(path, "rb") as f:
        while True:
            chunk = f.read(16 << 20)
            if not chunk:
                break
            data = rest + chunk
            p, end = 0, len(data)
            while end - p >= 26:
                _off, _ts, _typ, ks = head(data, p)
                vpos = p + 18 + ks
                if vpos + 4 > end:
                    break
                nxt = vpos + 8 + i32(data, vpos)[0]
                if nxt > end:
                    break
                n += 1
                p = nxt
            rest = data[p:]
    return n


def bench_cli_count(cfg: Config, d: Path, seg: str, n: int) -> Result:
    """`sej scan --count` on the big journal, in a real process, against the raw decode loop."""

    def cli(*extra: str) -> float:
        t0 = perf_counter()
        out = subprocess.run(
            [sys.executable, "-m", "sej.apps.cli", "scan", str(d), "--count", *extra],
            capture_output=True, text=True, check=True,
        )  # fmt: skip
        t = perf_counter() - t0
        assert int(out.stdout) == n, out.stdout
        return t

    def raw() -> float:
        t0 = perf_counter()
        assert raw_count(seg) == n
        return perf_counter() - t0

    reps = 2 if cfg.quick else 3
    t_raw, t_count, t_decode = [], [], []
    for _ in range(reps):
        t_raw.append(raw())
        t_count.append(cli())
        t_decode.append(cli("--type", "0"))
    best_raw, best_count, best_decode = min(t_raw), min(t_count), min(t_decode)
    rows = [
        Row("`sej scan DIR --count` (a process: start-up included)", ms(best_count), ms(best_raw),
            ratio(best_raw / best_count), "—", "info"),
        Row("`sej scan DIR --count --type 0` (decodes and filters every message)", rate(n / best_decode),
            rate(n / best_raw), ratio(best_raw / best_decode), "—", "info"),
    ]  # fmt: skip
    return Result(
        "cli_count",
        f"9. `sej scan --count` on the {os.path.getsize(seg) / 2**30:.2f} GiB journal",
        [
            f"The journal of benchmark 6 ({n:,} messages). `sej scan DIR --count` reads every message, as a scan "
            "does (a count fails where a scan fails), also without filters; with a type filter it also filters "
            "them. Each run is a real `python -m sej.apps.cli` process, start-up included.",
            "Baseline: the raw decode loop in this process: 16 MiB reads, `struct.unpack_from` of each header and "
            "value size, counting frames.",
        ],
        rows,
        [
            f"Best of {reps} runs, interleaved; all runs (s): raw {fmt_list(t_raw)}, "
            f"`--count` {fmt_list(t_count)}, `--count --type 0` {fmt_list(t_decode)}."
        ],
        rows[1],
    )


def bench_open_seek(cfg: Config, scratch: Path) -> list[Result]:
    d = fresh(scratch / "big")
    n = (cfg.big_bytes - 1) // FRAME_SIZE  # stays below segment_size: one segment
    batch = values_for(10_000)
    t0 = perf_counter()
    with sej.Writer(d) as w:
        left = n
        while left > 0:
            k = min(left, len(batch))
            w.append_many(batch if k == len(batch) else batch[:k], KEY)
            left -= k
    build = perf_counter() - t0
    segs = sej.list_segments(d)
    size = os.path.getsize(segs[0].path)
    assert len(segs) == 1 and size == n * FRAME_SIZE, (segs, size)
    log(f"  built {size / 2**20:,.0f} MiB journal in {build:.1f} s")
    mid = n // 2

    def open_writer() -> float:
        gc.collect()
        t0 = perf_counter()
        w = sej.Writer(d)
        t = perf_counter() - t0
        assert w.next_offset == n
        w.close()
        return t

    def seek() -> float:
        gc.collect()
        t0 = perf_counter()
        sc = sej.Scanner(d, mid, timeout=0)
        m = next(sc)
        t = perf_counter() - t0
        assert m.offset == mid
        sc.close()
        return t

    open_writer(), seek()  # warm-up (not counted): page cache and index file warm
    opens = [open_writer() for _ in range(cfg.open_reps)]
    seeks = [seek() for _ in range(cfg.open_reps)]
    count_result = bench_cli_count(cfg, d, segs[0].path, n)
    if not cfg.keep:
        shutil.rmtree(d)
    mo, msk = statistics.median(opens), statistics.median(seeks)
    rows = [
        Row(f"open `Writer` on the {size / 2**30:.2f} GiB journal", ms(mo), "—", "—", "< 50 ms", verdict(mo < 0.05)),
        Row(f"`Scanner(dir, {mid:,}, timeout=0)` + `next()`", ms(msk), "—", "—", "< 50 ms", verdict(msk < 0.05)),
    ]
    return [
        count_result,
        Result(
            "open_seek",
            "6. Opening a big journal and seeking to its middle",
            [
                f"One segment of {size:,} bytes ({n:,} messages, default `segment_size` 1 GiB), built once with "
                f"`append_many` in {build:.1f} s ({rate(n / build)}, including the final fsync). Then "
                f"`sej.Writer(dir)` (recovery checks the index against the segment and walks the tail; the clock "
                f"stops when the constructor returns) and a scanner seeking to the middle offset and reading one "
                f"message.",
            ],
            rows,
            [
                f"Median of {cfg.open_reps} runs each after one warm-up run; page cache warm (the journal was just "
                f"written and read). Open runs (ms): {', '.join(f'{t * 1e3:.2f}' for t in opens)}; "
                f"seek runs (ms): {', '.join(f'{t * 1e3:.2f}' for t in seeks)}.",
            ],
            Row(
                "open and seek",
                f"open {ms(mo)}, seek {ms(msk)}",
                "—",
                "—",
                "each < 50 ms",
                verdict(mo < 0.05 and msk < 0.05),
            ),
        ),
    ]
