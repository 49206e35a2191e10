"""Benchmarks 10 and 11: the hub copy over loopback SSH against scp; append-to-hub latency while `sej-hub` runs."""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import sej
from testing.sshd import Sshd, sshd_available

from .common import FRAME_SIZE, KEY, ROOT, TS, Config, fresh, log, percentile, perf_counter, values_for
from .results import Result, Row, fmt_list, ms, ratio, verdict


def _sshd() -> Sshd | None:
    """A real sshd on 127.0.0.1 (testing/sshd.py, the tests' fixture), or None when openssh-server is missing."""
    return None if sshd_available() is not None else Sshd()


BULK_TARGET = 0.81
"""Issue 13: the hub's bulk copy no worse than 0.81x scp (what it measured before the hub-at-scale work)."""


def bulk_tree(cfg: Config, where: Path) -> Path:
    """Benchmark 10's tree: 4 shards of 64 MiB (16 with --quick) in 16 MiB segments."""
    src = fresh(where)
    per_shard = (16 if cfg.quick else 64) << 20
    values = values_for(10_000)
    with sej.ShardedWriter(src, "h", shard_bit=2, hash=lambda k: k[0] & 3, segment_size=16 << 20) as w:
        for shard in range(4):
            key = bytes([shard]) + KEY[1:]
            for _ in range(per_shard // (FRAME_SIZE * len(values))):
                w.writer(shard).append_many(values, key)
    return src


def bench_hub_copy(cfg: Config, scratch: Path) -> list[Result]:
    """`copy_all` over loopback SSH vs scp of the same segment files."""
    from sej.hub import copy_all
    from sej.hub.ssh import connect, resolve, sftp_sources

    server = _sshd()
    if server is None:
        log("  openssh-server is missing: skipped")
        return []
    try:
        src = bulk_tree(cfg, scratch / "hubsrc")
        total = sum(s.stat().st_size for s in Path(src).rglob("*.jnl"))
        ep = resolve("127.0.0.1", server.port, server.user, str(server.identity), str(server.known_hosts),
                     ssh_config=os.devnull)  # fmt: skip

        def ours() -> float:
            hub = fresh(scratch / "hubdst")
            t0 = perf_counter()
            client = connect(ep)
            try:
                out = copy_all(sftp_sources(client, str(src), "bench"), str(hub), "c", "bench")
            finally:
                client.close()
            t = perf_counter() - t0
            assert all(o.error is None for o in out) and sum(o.result.bytes for o in out if o.result) == total
            return t

        def scp() -> float:
            dst = fresh(scratch / "scpdst")
            dst.mkdir()
            shards = [str(p) for p in sorted(Path(src).iterdir())]
            t0 = perf_counter()
            subprocess.run(
                ["scp", "-q", "-r", "-P", str(server.port), *server.ssh_options(),
                 *[f"{server.user}@127.0.0.1:{d}" for d in shards], str(dst)],
                check=True, capture_output=True,
            )  # fmt: skip
            t = perf_counter() - t0
            assert sum(p.stat().st_size for p in Path(dst).rglob("*.jnl")) == total
            return t

        reps = 2 if cfg.quick else 3
        t_ours, t_scp = [], []
        for _ in range(reps):
            t_scp.append(scp())
            t_ours.append(ours())
        for p in ("hubsrc", "hubdst", "scpdst"):
            fresh(scratch / p)
    finally:
        server.stop()
    mine, theirs = total / min(t_ours), total / min(t_scp)
    ok = mine / theirs >= BULK_TARGET
    mib = 2**20
    row = Row(
        f"`copy_all` over SSH (4 shards, {total / mib:,.0f} MiB) vs `scp` of the same segment files",
        f"{mine / mib:,.1f} MiB/s",
        f"{theirs / mib:,.1f} MiB/s",
        ratio(mine / theirs),
        f"≥ {BULK_TARGET:g}x",
        verdict(ok),
    )
    return [
        Result(
            "hub_copy",
            "10. Hub copy throughput over loopback SSH",
            [
                "A real OpenSSH sshd on 127.0.0.1 (the tests' fixture: fresh host and client keys). sej: connect "
                "(host key checked against known_hosts), then `copy_all` with 4 workers, one SFTP channel each over "
                "one connection (AES-GCM preferred), reading 32 MiB at a time as pipelined 255 KiB SFTP reads "
                "(`readv`), checking "
                "every frame, fsyncing every 64 MiB and "
                "committing the hub's reader offset on the source over SFTP. The clock includes the connection.",
                "Baseline: one `scp -r` process fetching the same 4 shard directories (their segment files, plus "
                "small index files the hub does not copy; process start and handshake included; OpenSSH 9's scp "
                "speaks SFTP).",
            ],
            [row],
            [f"Best of {reps} runs, interleaved; all runs (s): sej {fmt_list(t_ours)}, scp {fmt_list(t_scp)}."]
            + (
                []
                if ok
                else [
                    "Why it misses: the SSH transport is paramiko, pure Python apart from the cipher, so every "
                    "packet costs interpreter time (packetizer) on the same 2 cores as sshd; scp is C. "
                    "The ratio sits near the target: runs with AES-GCM have measured 0.82x to 0.88x (0.65x to "
                    "0.87x before, with paramiko's default AES-CTR and HMAC). Profiled with "
                    "py-spy, then tried and measured: asking paramiko for 255 KiB SFTP requests instead of "
                    "32 KiB (the change that brought it over 0.7x) and for many 256 KiB readv ranges instead "
                    "of one big one (paramiko grows one range's buffer by concatenation, quadratic); frames of "
                    "repeated sizes checked with one struct call; fsync every 64 MiB; 1, 2 and 4 worker "
                    "threads (no gain: one interpreter); 4 processes with a connection each (slower)."
                ]
            ),
            row,
        )
    ]


HUB_POLL = 0.2  # seconds: the sej-hub poll interval of benchmark 11


def bench_hub_latency(cfg: Config, scratch: Path) -> list[Result]:
    """Time from a producer's append to the message's arrival in the hub's copy while `sej-hub` runs."""
    server = _sshd()
    if server is None:
        log("  openssh-server is missing: skipped")
        return []
    os.sync()  # write back what earlier benchmarks left in the page cache: their writeback stalls fsyncs here
    hub_proc = None
    try:
        src, hub = fresh(scratch / "latsrc"), fresh(scratch / "lathub")
        src.mkdir()
        config = scratch / "hub.toml"
        config.write_text(
            f'hub_root = "{hub}"\nhub_name = "bench"\npoll_interval = {HUB_POLL}\n\n[[client]]\n'
            f'client_id = "c"\nhost = "127.0.0.1"\nport = {server.port}\nuser = "{server.user}"\n'
            f'identity_file = "{server.identity}"\nknown_hosts = "{server.known_hosts}"\n'
            f'remote_root = "{src}"\n'
        )
        n = 150 if cfg.quick else 500
        interval = 0.01
        with sej.Writer(src / "lat", durability="flush") as w:
            w.append(b"first")  # the hub finds the journal on its first pass
            env = dict(os.environ, PYTHONPATH=str(ROOT))
            hub_proc = subprocess.Popen(
                [sys.executable, "-c", "from sej.apps.hub import main; main()", "--config", str(config)],
                env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
            )  # fmt: skip
            dest = hub / "c.lat"

            def arrived() -> bool:
                return (dest / "jnl").is_dir() and sej.next_offset(dest) >= 1

            deadline = time.monotonic() + 30
            while not arrived() and time.monotonic() < deadline:
                time.sleep(0.05)
            assert arrived(), "sej-hub did not copy the first message within 30 s"
            latencies: list[float] = []
            with sej.Scanner(dest, 1, timeout=10) as s:

                def produce() -> None:
                    for _ in range(n):
                        w.append(TS.pack(time.time_ns()))
                        time.sleep(interval)

                t = threading.Thread(target=produce)
                t.start()
                for m in s:
                    latencies.append((time.time_ns() - TS.unpack(m.value)[0]) / 1e9)
                    if len(latencies) == n:
                        break
                t.join(60)
        assert len(latencies) == n, f"only {len(latencies)} of {n} messages reached the hub"
    finally:
        if hub_proc is not None:
            hub_proc.terminate()
            try:
                hub_proc.wait(15)
            except subprocess.TimeoutExpired:
                hub_proc.kill()
        server.stop()
    latencies.sort()
    p50, p99, mx = percentile(latencies, 0.5), percentile(latencies, 0.99), latencies[-1]
    ok = p99 < 2 * HUB_POLL
    row = Row(
        f"append on the producer → readable in the hub's copy, `sej-hub` poll interval {HUB_POLL:g} s",
        f"p99 {ms(p99)} (p50 {ms(p50)}, max {ms(mx)})",
        "—",
        "—",
        f"p99 < {ms(2 * HUB_POLL)}",
        verdict(ok),
    )
    return [
        Result(
            "hub_latency",
            "11. Append-to-hub latency while `sej-hub` runs",
            [
                "The page cache is written back first (`os.sync()`), so earlier benchmarks' writes do not stall "
                "this one's fsyncs. "
                f"`sej-hub --config hub.toml` runs in its own process with one SSH client (a real sshd on 127.0.0.1) "
                f"and `poll_interval = {HUB_POLL:g}`. A producer appends {n} messages {interval * 1000:g} ms apart "
                '(`durability="flush"`), each holding its append time; a Scanner follows the hub\'s copy and '
                "records when each message becomes readable there (after the hub's fsync).",
            ],
            [row],
            [f"{n} messages; percentiles of one run."],
            row,
        )
    ]


METRICS_TARGET = 0.97
"""Issue 16: the metrics endpoint adds no measurable cost to copy throughput (metrics on >= 0.97x of off)."""
SCRAPE_EVERY = 1.0
"""Seconds between scrapes while the copy runs: 15 times as often as Prometheus's default of 15 s."""


def bench_hub_metrics(cfg: Config, scratch: Path) -> list[Result]:
    """The daemon's bulk copy over SSH with /metrics served and scraped every SCRAPE_EVERY s, against without."""
    import urllib.request

    from sej.hub.config import loads_config
    from sej.hub.daemon import Hub
    from sej.hub.metrics import MetricsServer

    server = _sshd()
    if server is None:
        log("  openssh-server is missing: skipped")
        return []
    scrapes: list[int] = []
    try:
        src = bulk_tree(cfg, scratch / "metricssrc")
        total = sum(s.stat().st_size for s in Path(src).rglob("*.jnl"))

        def run(metrics: bool) -> float:
            hub = fresh(scratch / "metricsdst")
            config = loads_config(
                f'hub_root = "{hub}"\nworkers = 4\n[[client]]\nclient_id = "c"\nhost = "127.0.0.1"\n'
                f'port = {server.port}\nuser = "{server.user}"\nidentity_file = "{server.identity}"\n'
                f'known_hosts = "{server.known_hosts}"\nremote_root = "{src}"\n'
            )
            done = threading.Event()
            count = 0
            with Hub(config) as h:
                endpoint = MetricsServer(h.status, "127.0.0.1", 0, 30.0) if metrics else None

                def scrape() -> None:
                    nonlocal count
                    assert endpoint is not None
                    url = f"http://127.0.0.1:{endpoint.address[1]}/metrics"
                    while not done.wait(SCRAPE_EVERY):
                        urllib.request.urlopen(url, timeout=30).read()
                        count += 1

                t = threading.Thread(target=scrape) if metrics else None
                os.sync()  # the last run's dirty pages written back first: else runs are bimodal (1.7 or 3.6 s)
                try:
                    if t is not None:
                        t.start()
                    t0 = perf_counter()
                    (report,) = h.run_once()
                    took = perf_counter() - t0
                finally:
                    done.set()
                    if t is not None:
                        t.join()
                    if endpoint is not None:
                        endpoint.close()
            assert report.ok and report.bytes == total, report.failures()
            if metrics:
                scrapes.append(count)
            return took

        reps = 3 if cfg.quick else 7
        t_off: list[float] = []
        t_on: list[float] = []
        for k in range(reps):  # interleaved, each first in turn
            for metrics in (False, True) if k % 2 == 0 else (True, False):
                (t_on if metrics else t_off).append(run(metrics))
        for p in ("metricssrc", "metricsdst"):
            fresh(scratch / p)
    finally:
        server.stop()
    scrape_ms = _scrape_cost()
    # Medians, not the best runs: the two configurations cost the same but for the scrapes, and the best of
    # a few runs picks this copy's outliers (one fast run decides it either way).
    on, off = total / statistics.median(t_on), total / statistics.median(t_off)
    ok = on / off >= METRICS_TARGET
    mib = 2**20
    row = Row(
        f"`sej-hub`'s copy (`Hub.run_once`, 4 shards, {total / mib:,.0f} MiB over SSH) with /metrics served and "
        f"scraped every {SCRAPE_EVERY:g} s vs without",
        f"{on / mib:,.1f} MiB/s",
        f"{off / mib:,.1f} MiB/s",
        ratio(on / off),
        f"≥ {METRICS_TARGET:g}x",
        verdict(ok),
    )
    return [
        Result(
            "hub_metrics",
            "17. What the hub's metrics endpoint costs",
            [
                "The daemon's pass (`sej.hub.daemon.Hub.run_once`: the status book, the records in the hub root) "
                "copying benchmark 10's tree from a real sshd on 127.0.0.1, with `sej.hub.metrics.MetricsServer` "
                f"on the same status book and a thread scraping /metrics every {SCRAPE_EVERY:g} s, against the "
                "same pass without an endpoint. The metrics are built from the status book at each scrape; "
                "nothing is counted on the copy path.",
            ],
            [
                row,
                Row(
                    "one scrape of a hub of 1 client x 1,000 journals (9,000 series): the hub's time per request",
                    f"{scrape_ms:.1f} ms",
                    target="info",
                ),
            ],
            [
                f"Medians of {reps} runs each, interleaved, each after an `os.sync()`; all runs (s): metrics on "
                f"{fmt_list(t_on)}, off {fmt_list(t_off)}; scrapes per run with metrics on: "
                f"{', '.join(map(str, scrapes))}.",
                f"Best runs: metrics on {min(t_on):.3f} s, off {min(t_off):.3f} s ({min(t_off) / min(t_on):.3f}x).",
                "Earlier runs scraped every 0.1 s (150 times Prometheus's default): without the `os.sync()` "
                "(bimodal times, 1.7 or 3.6 s, from the previous run's dirty pages) 1.085x, 0.966x, 1.035x and "
                "1.113x (best runs); with it 0.957x (best of 5; medians 1.052x); then every 1 s, best of 7: "
                "0.930x, medians 0.999x; then medians 0.987x (best runs 1.059x). The same copy takes 1.6 to 4.7 s "
                "from run to run here, with the sync too (the disk), and one fast run decides a best-of ratio "
                "either way, so the ratio is of medians. A scrape costs the hub a request thread and the text "
                "of every series under the GIL (the row above), nothing on the copy path: at Prometheus's "
                "default of one scrape per 15 s, a hub of 1,000 journals spends about 0.2% of a core on it.",
            ],
            row,
        )
    ]


def _scrape_cost() -> float:
    """Milliseconds one /metrics request takes, served in this process, for 1,000 journals (best of 20)."""
    import urllib.request

    from sej.hub.metrics import MetricsServer
    from sej.hub.status import JournalPass, StatusBook

    book = StatusBook(None, [("c", "/src")])
    book.record("c", [JournalPass(f"ev.a.{i:03x}", 100, 100, 3, 300, 100, 10_000) for i in range(1000)], 0.5)
    endpoint = MetricsServer(book, "127.0.0.1", 0, 30.0)
    try:
        url = f"http://127.0.0.1:{endpoint.address[1]}/metrics"
        times = []
        for _ in range(20):
            t0 = perf_counter()
            urllib.request.urlopen(url, timeout=30).read()
            times.append(perf_counter() - t0)
    finally:
        endpoint.close()
    return 1000 * min(times)
