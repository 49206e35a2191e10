"""Benchmark 3: `Scanner` iteration against a raw decode loop."""

from __future__ import annotations

import gc
import importlib.util
import os
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import sej

from . import go_original
from .common import (
    HEAD,
    I32,
    KEY,
    SHAPE_NAMES,
    SHAPES,
    VALUE_SIZE,
    Config,
    fresh,
    log,
    perf_counter,
    shape_messages,
    values_for,
)
from .results import Result, Row, fmt_list, medians, rate, ratio, verdict


def sej_scan(dir: Path, n: int, verify: bool = False, value_bytes: int | None = None) -> float:
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
    assert count == n and total == (n * VALUE_SIZE if value_bytes is None else value_bytes), (count, total)
    return t


def raw_scan(path: str, n: int, value_bytes: int | None = None) -> float:
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
    assert count == n and total == (n * VALUE_SIZE if value_bytes is None else value_bytes), (count, total)
    return t


def sej_read_batches(dir: Path, n: int, value_bytes: int) -> float:
    """`sej.read_batches(dir, verify=False)` (the Scanner's default: no checksums) iterated to the end, touching
    every value's length (`pyarrow.compute`), as the Scanner streams: no table of the whole journal is kept."""
    import pyarrow.compute as pc

    gc.collect()
    t0 = perf_counter()
    rows = total = 0
    for batch in sej.read_batches(dir, verify=False):
        rows += batch.num_rows
        total += pc.sum(pc.binary_length(batch.column("value"))).as_py()
    t = perf_counter() - t0
    assert rows == n and total == value_bytes, (rows, total)
    return t


ARROW_VS_GO = "`sej.read_batches` (Arrow) vs the Go original's `BenchmarkScanOnly` (uniform only), {shape}"


def ns(seconds: float, n: int) -> str:
    return f"{seconds / n * 1e9:,.0f} ns/msg"


@dataclass
class GoRuns:
    """The Go original's figures of benchmark 3 (scripts/benchmarks/go_original.py), measured in the same reps
    as sej's: its own BenchmarkScanOnly and BenchmarkAppend at b.N = n, and its Scanner on sej's journals."""

    go: go_original.GoOriginal | None
    why: str = ""  # why it is not measured, when go is None
    scan_only: list[float] = field(default_factory=list)  # ns per message, one per rep
    append: list[float] = field(default_factory=list)
    scan: dict[str, list[float]] = field(default_factory=lambda: {shape: [] for shape in SHAPES})  # seconds

    @classmethod
    def build(cls, scratch: Path) -> GoRuns:
        try:
            go = go_original.build(scratch)
        except (go_original.NotMeasured, OSError, subprocess.SubprocessError) as e:
            log(f"  the Go original is not measured: {e}")
            return cls(None, str(e))
        log(f"  the Go original built ({go.version})")
        return cls(go)

    def rep(self, n: int, journals: dict[str, tuple[Path, int]]) -> None:
        """One rep: the Go benchmarks, then the Go Scanner on each shape's journal. A failure ends the Go runs."""
        if self.go is None:
            return
        try:
            found = self.go.bench(n)
            self.scan_only.append(found["ScanOnly"])
            self.append.append(found["Append"])
            for shape, (d, total) in journals.items():
                self.scan[shape].append(self.go.scan(d, n, total))
        except (go_original.NotMeasured, OSError, subprocess.SubprocessError, ValueError) as e:
            log(f"  the Go original failed: {e}")
            self.go, self.why = None, str(e)

    def rows(self, n: int, scanner_t: dict[str, list[float]], table_t: dict[str, list[float]]) -> list[Row]:
        """sej's ns per message (Arrow read, Scanner) next to the Go original's, on each shape; info only."""
        if self.go is None:
            return [Row("The Go original (`BenchmarkScanOnly`, `BenchmarkAppend`, its Scanner on sej's journals)",
                        f"not measured: {self.why}")]  # fmt: skip
        scan_only = min(self.scan_only)
        rows = [
            Row("The Go original's `BenchmarkScanOnly` (its own journal: 13 B keys, uniform 100 B values only; "
                "writing it is outside the clock)", f"{scan_only:,.0f} ns/msg"),
            Row("The Go original's `BenchmarkAppend` (13 B keys, uniform 100 B values only; sej's appends: "
                "benchmark 1)", f"{min(self.append):,.0f} ns/msg"),
        ]  # fmt: skip
        sej_reads = [("`sej.read_batches` (Arrow)", table_t), ("`Scanner`", scanner_t)]
        for what, times in sej_reads:
            for shape in SHAPES:
                if times[shape]:
                    ours = min(times[shape]) / n * 1e9
                    label = ARROW_VS_GO.replace("`sej.read_batches` (Arrow)", what).format(shape=shape)
                    rows.append(Row(label, f"{ours:,.0f} ns/msg", f"{scan_only:,.0f} ns/msg", ratio(scan_only / ours)))
        for what, times in sej_reads:
            for shape in SHAPES:
                if times[shape]:
                    ours, go = min(times[shape]), min(self.scan[shape])
                    rows.append(Row(f"{what} vs the Go original's Scanner on the same journal, {shape}",
                                    ns(ours, n), ns(go, n), ratio(go / ours)))  # fmt: skip
        return rows

    def what(self) -> str:
        return (
            "The Go original (github.com/h12w/sej, commit "
            f"{go_original.GO_COMMIT[:7]}), measured in the same run, each rep after sej's: its own "
            "`BenchmarkScanOnly` and `BenchmarkAppend` at b.N = the messages above (`go test -run XXX -bench "
            "'ScanOnly|Append' -benchtime Nx`; 13-byte keys, values of 100 bytes of 'a' only; ScanOnly scans a "
            "journal it has just written), and its `Scanner` reading sej's journal of each shape "
            "(scripts/benchmarks/go_scan.go: the files are byte-compatible; the clock includes constructing the "
            "scanner, as sej's does). Ratios are Go's ns per message ÷ sej's (above 1: sej is faster); no target. "
            "scripts/benchmarks/go_original.py extracts the source and builds it in GOPATH mode. To measure it, "
            f"install {go_original.HOW}" + (f"; not measured in this run: {self.why}." if self.go is None else ".")
        )

    def notes(self) -> list[str]:
        if self.go is None or not self.scan_only:
            return []
        return [
            f"The Go original ({self.go.version}), all runs: `BenchmarkScanOnly` "
            f"{', '.join(f'{x:.1f}' for x in self.scan_only)} ns/op; `BenchmarkAppend` "
            f"{', '.join(f'{x:.1f}' for x in self.append)} ns/op; its Scanner on sej's journals (s): "
            + "; ".join(f"{s}: {fmt_list(self.scan[s])}" for s in SHAPES)
            + "."
        ]


def write_shape_journal(path: Path, n: int, shape: str) -> tuple[Path, int]:
    """A fresh journal of n messages of `shape` (in batches of 1000, one segment); (its path, value bytes)."""
    if shape == "uniform":
        return write_scan_journal(path, n), n * VALUE_SIZE
    d = fresh(path)
    keys, values = shape_messages(shape, n)
    with sej.Writer(d) as w:
        for i in range(0, n, 1000):
            w.append_many(values[i : i + 1000], keys=keys[i : i + 1000])
    return d, sum(map(len, values))


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
    journals = {shape: write_shape_journal(scratch / f"scan-{shape}", n, shape) for shape in SHAPES}
    ours_t: dict[str, list[float]] = {shape: [] for shape in SHAPES}
    raw_t: dict[str, list[float]] = {shape: [] for shape in SHAPES}
    table_t: dict[str, list[float]] = {shape: [] for shape in SHAPES}
    arrow = importlib.util.find_spec("pyarrow") is not None
    for d, total in journals.values():
        raw_scan(sej.list_segments(d)[0].path, n, total)  # warm the page cache
    go = GoRuns.build(scratch)
    for rep in range(cfg.reps):
        for shape, (d, total) in journals.items():
            raw_t[shape].append(raw_scan(sej.list_segments(d)[0].path, n, total))
            ours_t[shape].append(sej_scan(d, n, value_bytes=total))
            if arrow:
                table_t[shape].append(sej_read_batches(d, n, total))
        go.rep(n, journals)
        log(f"  scan rep {rep + 1}/{cfg.reps} done")
    sizes = {shape: sum(os.path.getsize(s.path) for s in sej.list_segments(d)) for shape, (d, _) in journals.items()}
    for d, _ in journals.values():
        shutil.rmtree(d)
    if not cfg.keep:
        shutil.rmtree(scratch / "go-original", ignore_errors=True)
    rows = []
    for shape in SHAPES:
        ours = n / min(ours_t[shape])
        raw = n / min(raw_t[shape])
        r = ours / raw
        rows.append(Row(f"`Scanner` iteration vs raw decode loop, {shape}", rate(ours), rate(raw), ratio(r), "≥ 0.7x",
                        verdict(r >= 0.7)))  # fmt: skip
    table_rows = []
    for shape in SHAPES if arrow else ():
        ours, scanner = n / min(table_t[shape]), n / min(ours_t[shape])
        r = ours / scanner
        table_rows.append(Row(f"`sej.read_batches` (Arrow) vs `Scanner`, {shape}", rate(ours), rate(scanner), ratio(r),
                              "≥ 2x", verdict(r >= 2)))  # fmt: skip
    go_rows = go.rows(n, ours_t, table_t)
    go_summary = [r for r in go_rows if r.label == ARROW_VS_GO.format(shape="varied")]
    return [
        Result(
            "scan",
            "3. Scanning throughput",
            [
                f"A journal of {n:,} messages per shape (one segment, page cache warm): "
                + "; ".join(f"{SHAPE_NAMES[s]}, {sizes[s] / 2**20:.0f} MiB" for s in SHAPES)
                + ". sej: `Scanner(dir, 0, timeout=0)` iterated to the end, touching each message (`len(m.value)`); "
                "the clock includes constructing the scanner.",
                "Baseline: read the whole file with one `f.read()`, then per record `unpack_from` of the 18-byte "
                "header, "
                "slice the key, `unpack_from` the value size, slice the value and build a 5-tuple, touching "
                "`len(rec[4])`. No validation (sej checks offsets, sizes and the trailing size field).",
                "The columnar read: `sej.read_batches(dir, verify=False)` (checksums off, as the Scanner's default) "
                "iterated to the end, the sum of each batch's value lengths taken (`pyarrow.compute`), against the "
                "Scanner's rate above (`sej.read_table` collects the same batches into one table)"
                + ("." if arrow else ": not run, pyarrow is missing."),
                go.what(),
            ],
            rows + table_rows + go_rows,
            [
                f"Best of {cfg.reps} runs, interleaved; all runs (s): "
                + "; ".join(f"{s}: sej {fmt_list(ours_t[s])}, raw {fmt_list(raw_t[s])}" for s in SHAPES)
                + ".",
                *(f"{s}: " + medians(n, ours_t[s], raw_t[s]) for s in SHAPES),
                *go.notes(),
            ],
            rows[0],
            [(s, row) for s, row in zip(SHAPES[1:], rows[1:])]
            + [(f"Arrow, {s}", row) for s, row in zip(SHAPES, table_rows)]
            + [("Arrow, varied, vs the Go original's `BenchmarkScanOnly`", row) for row in go_summary],
        )
    ]
