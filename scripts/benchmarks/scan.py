"""Benchmark 3: `Scanner` iteration against a raw decode loop."""

from __future__ import annotations

import gc
import shutil
from pathlib import Path

import sej

from .common import FRAME_SIZE, HEAD, I32, KEY, VALUE_SIZE, Config, fresh, log, perf_counter, values_for
from .results import Result, Row, fmt_list, medians, rate, ratio, verdict


def sej_scan(dir: Path, n: int, verify: bool = False) -> float:
    gc.collect()
    t0 = perf_counter()
    sc = sej.Scanner(dir, 0, timeout=0, verify=verify)
    count = 0
    total = 0
    for m in sc:
        total += len(m.value)
        count += 1
    t = perf_counter() - t0
    sc.close()
    assert count == n and total == n * VALUE_SIZE, (count, total)
    return t


def raw_scan(path: str, n: int) -> float:
    unpack_head = HEAD.unpack_from
    unpack_i32 = I32.unpack_from
    gc.collect()
    t0 = perf_counter()
    with open(path, "rb") as f:
        data = f.read()
    end = len(data)
    pos = 0
    count = 0
    total = 0
    while pos < end:
        off, ts, typ, ks = unpack_head(data, pos)
        kpos = pos + 18
        vpos = kpos + ks
        key = data[kpos:vpos]
        (vs,) = unpack_i32(data, vpos)
        value = data[vpos + 4 : vpos + 4 + vs]
        rec = (off, ts, typ, key, value)
        pos = vpos + 8 + vs
        total += len(rec[4])
        count += 1
    t = perf_counter() - t0
    assert count == n and total == n * VALUE_SIZE, (count, total)
    return t


def write_scan_journal(path: Path, n: int) -> Path:
    """A fresh journal of n 100-byte messages (in batches of 1000): what benchmarks 3 and 15 scan."""
    d = fresh(path)
    values = values_for(n)
    with sej.Writer(d) as w:
        for i in range(0, n, 1000):
            w.append_many(values[i : i + 1000], KEY)
    return d


def bench_scan(cfg: Config, scratch: Path) -> list[Result]:
    n = cfg.n_scan
    d = write_scan_journal(scratch / "scan", n)
    path = sej.list_segments(d)[0].path
    raw_scan(path, n)  # warm the page cache
    ours_t: list[float] = []
    raw_t: list[float] = []
    for rep in range(cfg.reps):
        raw_t.append(raw_scan(path, n))
        ours_t.append(sej_scan(d, n))
        log(f"  scan rep {rep + 1}/{cfg.reps} done")
    shutil.rmtree(d)
    ours = n / min(ours_t)
    raw = n / min(raw_t)
    r = ours / raw
    row = Row("`Scanner` iteration vs raw decode loop", rate(ours), rate(raw), ratio(r), "≥ 0.7x", verdict(r >= 0.7))
    return [
        Result(
            "scan",
            "3. Scanning throughput",
            [
                f"A journal of {n:,} messages ({n * FRAME_SIZE / 2**20:.0f} MiB, one segment, page cache warm). "
                f"sej: `Scanner(dir, 0, timeout=0)` iterated to the end, touching each message (`len(m.value)`); "
                f"the clock includes constructing the scanner.",
                "Baseline: read the whole file with one `f.read()`, then per record `unpack_from` of the 18-byte "
                "header, "
                "slice the key, `unpack_from` the value size, slice the value and build a 5-tuple, touching "
                "`len(rec[4])`. No validation (sej checks offsets, sizes and the trailing size field).",
            ],
            [row],
            [
                f"Best of {cfg.reps} runs, interleaved; all runs (s): sej {fmt_list(ours_t)}, raw {fmt_list(raw_t)}.",
                medians(n, ours_t, raw_t),
            ],
            row,
        )
    ]
