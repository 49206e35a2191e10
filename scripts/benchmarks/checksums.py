"""Benchmark 15: what checksums cost (issue 14): appends, verified scans, `sej verify`, the hub's verified copy;
and the block size."""

from __future__ import annotations

import gc
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import sej
import sej.appender

from .common import KEY, ROOT, Config, fresh, log, perf_counter, values_for
from .results import Result, Row, fmt_list, ratio, verdict
from .scan import sej_scan
from .writes import sej_append, sej_append_many


def _with_checksums(on: bool, run: Callable[[], float]) -> float:
    """`run()` with the writer's checksums on or off (sej.appender.CHECKSUMS, which only this benchmark turns off)."""
    sej.appender.CHECKSUMS = on
    try:
        return run()
    finally:
        sej.appender.CHECKSUMS = True


def _gbps(nbytes: int, seconds: float) -> str:
    return f"{nbytes / seconds / 1e9:.2f} GB/s"


def bench_checksum_writes(cfg: Config, scratch: Path) -> tuple[list[Row], list[str]]:
    n = cfg.n_write
    values = values_for(n)
    times: dict[tuple[str, bool], list[float]] = {}
    for rep in range(cfg.reps):  # interleaved, alternating which side goes first
        for checked in (True, False) if rep % 2 == 0 else (False, True):
            for name, run in (
                ("append", lambda: sej_append(fresh(scratch / "ck-append"), values)),
                ("append_many", lambda: sej_append_many(fresh(scratch / "ck-many"), values, cfg.batch)),
            ):
                times.setdefault((name, checked), []).append(_with_checksums(checked, run))
        log(f"  checksum writes rep {rep + 1}/{cfg.reps} done")
    for p in ("ck-append", "ck-many"):
        fresh(scratch / p)
    rows, notes = [], []
    for name, call in (("append", "`Writer.append`"), ("append_many", f"`Writer.append_many` ({cfg.batch})")):
        on, off = n / min(times[(name, True)]), n / min(times[(name, False)])
        r = on / off
        rows.append(Row(f"{call} with checksums vs without", f"{on:,.0f} msg/s", f"{off:,.0f} msg/s", ratio(r),
                        "≥ 0.95x", verdict(r >= 0.95)))  # fmt: skip
        notes.append(f"{name}: best of {cfg.reps}, interleaved; all runs (s): with {fmt_list(times[(name, True)])}, "
                     f"without {fmt_list(times[(name, False)])}.")  # fmt: skip
    return rows, notes


def bench_checksum_scan(cfg: Config, scratch: Path) -> tuple[list[Row], list[str]]:
    n = cfg.n_scan
    d = fresh(scratch / "ck-scan")
    values = values_for(n)
    with sej.Writer(d) as w:
        for i in range(0, n, 1000):
            w.append_many(values[i : i + 1000], KEY)
    sej_scan(d, n)  # warm the page cache
    on_t: list[float] = []
    off_t: list[float] = []
    for rep in range(cfg.reps):
        off_t.append(sej_scan(d, n))
        on_t.append(sej_scan(d, n, verify=True))
        log(f"  verified scan rep {rep + 1}/{cfg.reps} done")
    shutil.rmtree(d)
    on, off = n / min(on_t), n / min(off_t)
    r = on / off
    row = Row("`Scanner(verify=True)` vs `verify=False`", f"{on:,.0f} msg/s", f"{off:,.0f} msg/s", ratio(r),
              "≥ 0.8x", verdict(r >= 0.8))  # fmt: skip
    return [row], [f"Scan: best of {cfg.reps}, interleaved; all runs (s): verify {fmt_list(on_t)}, "
                   f"no verify {fmt_list(off_t)}."]  # fmt: skip


def write_big(d: Path, nbytes: int) -> int:
    """A journal of about `nbytes` in 4 KiB messages (the kind of journal `sej verify` is run over)."""
    value = os.urandom(4096)
    per = 256
    batch = [value] * per
    with sej.Writer(d, segment_size=256 << 20) as w:
        for _ in range(nbytes // (per * (4096 + 26 + len(KEY)))):
            w.append_many(batch, KEY)
    return sum(os.path.getsize(s.path) for s in sej.list_segments(d))


def bench_sej_verify(cfg: Config, scratch: Path) -> tuple[list[Row], list[str]]:
    d = fresh(scratch / "ck-verify")
    size = write_big(d, (128 << 20) if cfg.quick else (1 << 30))
    cmd = [sys.executable, "-m", "sej.apps.cli", "verify", str(d)]
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    subprocess.run(cmd, check=True, capture_output=True, env=env)  # warm the page cache
    ts: list[float] = []
    for _ in range(3):
        t0 = perf_counter()
        p = subprocess.run(cmd, capture_output=True, env=env, text=True)
        ts.append(perf_counter() - t0)
        if p.returncode != 0:
            raise SystemExit(f"bench: sej verify failed: {p.stdout}{p.stderr}")
    shutil.rmtree(d)
    best = min(ts)
    row = Row(f"`sej verify` of a {size / 2**30:.2f} GiB journal (4 KiB messages)", _gbps(size, best), "—", "—",
              "≥ 1 GB/s", verdict(size / best >= 1e9))  # fmt: skip
    return [row], [f"`sej verify DIR` as a subprocess (the clock includes starting Python), page cache warm; "
                   f"best of 3 runs (s): {fmt_list(ts)}."]  # fmt: skip


def bench_hub_verify(cfg: Config, scratch: Path) -> tuple[list[Row], list[str]]:
    """`copy_all` over loopback SSH with end-to-end verification and without it."""
    import sej.hub.copy as hubcopy
    from sej.hub import copy_all
    from sej.hub.ssh import connect, resolve, sftp_sources
    from testing.sshd import Sshd, sshd_available

    if sshd_available() is not None:
        log("  openssh-server is missing: hub copy skipped")
        return [], []
    server = Sshd()
    try:
        src = fresh(scratch / "ck-hubsrc")
        values = values_for(10_000)
        per_shard = (16 if cfg.quick else 64) << 20
        with sej.ShardedWriter(src, "h", shard_bit=2, hash=lambda k: k[0] & 3, segment_size=16 << 20) as w:
            for shard in range(4):
                key = bytes([shard]) + KEY[1:]
                for _ in range(per_shard // (134 * len(values))):
                    w.writer(shard).append_many(values, key)
        total = sum(s.stat().st_size for s in Path(src).rglob("*.jnl"))
        ep = resolve("127.0.0.1", server.port, server.user, str(server.identity), str(server.known_hosts),
                     ssh_config=os.devnull)  # fmt: skip

        def copy(verify: bool) -> float:
            hub = fresh(scratch / "ck-hubdst")
            hubcopy.VERIFY = verify
            try:
                gc.collect()
                t0 = perf_counter()
                client = connect(ep)
                try:
                    out = copy_all(sftp_sources(client, str(src), "bench"), str(hub), "c", "bench")
                finally:
                    client.close()
                t = perf_counter() - t0
            finally:
                hubcopy.VERIFY = True
            assert all(o.error is None for o in out) and sum(o.result.bytes for o in out if o.result) == total
            return t

        on_t: list[float] = []
        off_t: list[float] = []
        reps = 2 if cfg.quick else 5
        for rep in range(reps):
            for verify in (True, False) if rep % 2 == 0 else (False, True):
                (on_t if verify else off_t).append(copy(verify))
            log(f"  hub copy rep {rep + 1}/{reps} done")
    finally:
        server.stop()
        for p in ("ck-hubsrc", "ck-hubdst"):
            if (scratch / p).exists():
                shutil.rmtree(scratch / p)
    on, off = total / min(on_t), total / min(off_t)
    r = on / off
    row = Row("hub copy over SSH, verified end to end vs not", f"{on / 2**20:,.0f} MiB/s", f"{off / 2**20:,.0f} MiB/s",
              ratio(r), "≥ 0.9x", verdict(r >= 0.9))  # fmt: skip
    return [row], [f"Hub: `copy_all` of 4 journals ({total / 2**20:.0f} MiB) into a fresh hub root over loopback "
                   f"SSH (real sshd), with the producer's checksums read and checked (`sej.hub.copy.VERIFY`, on by "
                   f"default) and without; the hub root gets its own checksums either way. Best of {reps}, "
                   f"interleaved; all runs (s): verified {fmt_list(on_t)}, not {fmt_list(off_t)}."]  # fmt: skip


def block_sizes() -> tuple[list[Row], list[str]]:
    """xxh3-64 over blocks of 4, 16 and 64 KiB, and the checksum file's size per GiB of segment for each."""
    import xxhash

    rows = []
    for kib in (4, 16, 64):
        buf = os.urandom(kib << 10)
        n = (256 << 20) // len(buf)
        best = float("inf")
        for _ in range(3):
            t0 = time.perf_counter()
            for _ in range(n):
                xxhash.xxh3_64_intdigest(buf)
            best = min(best, time.perf_counter() - t0)
        per_gib = (1 << 30) // len(buf) * 16
        rows.append(Row(f"xxh3-64 of {kib} KiB blocks; checksum file per GiB of segment: {per_gib / 2**10:,.0f} KiB",
                        _gbps(256 << 20, best), "—", "—", "—", "info"))  # fmt: skip
    return rows, [
        "The block is 64 KiB: its hash runs as fast as larger ones, its checksum file is 0.02% of the segment "
        "(16 bytes per block, plus one partial record per write that ends inside a block: one per `flush()` or "
        "buffer spill), and a reader that verifies rereads at most one block to start mid-segment. Smaller "
        "blocks would only locate damage more finely; `sej verify` names the messages a bad block holds anyway."
    ]


def bench_checksums(cfg: Config, scratch: Path) -> list[Result]:
    rows: list[Row] = []
    notes: list[str] = []
    parts: list[Callable[[], tuple[list[Row], list[str]]]] = [
        lambda: bench_checksum_writes(cfg, scratch),
        lambda: bench_checksum_scan(cfg, scratch),
        lambda: bench_sej_verify(cfg, scratch),
        lambda: bench_hub_verify(cfg, scratch),
        block_sizes,
    ]
    for part in parts:
        r, n = part()
        rows += r
        notes += n
    misses = [r for r in rows if r.result == "**MISS**"]
    summary = misses[0] if misses else rows[0]
    return [
        Result(
            "checksums",
            "15. What checksums cost",
            [
                f"Each pair runs the same code with and without checksums. Writes: {cfg.n_write:,} messages of "
                "100 bytes as in benchmarks 1 and 2, with the writer's checksum files on (the default) and off "
                "(`sej.appender.CHECKSUMS = False`, only for this measurement). Scan: as benchmark 3 "
                f"({cfg.n_scan:,} messages), `Scanner(dir, 0, timeout=0, verify=True)` against `verify=False`.",
            ],
            rows,
            notes,
            summary,
        )
    ]
