"""Benchmark 14: the hub at scale against rsync over the same sshd: `sej copy` passes (initial, incremental,
idle) at 10, 100 and 1,000 journals, and `sej-hub`'s append-to-hub latency at the same sizes."""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import sej
from testing.sshd import Sshd

from .common import KEY, ROOT, Config, fresh, installed_env, log, percentile
from .hub import _sshd
from .results import Result, Row, fmt_list, ms, ratio, verdict

SERIES = (10, 100, 1000)
QUICK_SERIES = (10, 100)
MESSAGES = 500  # per journal: with SEGMENT, two sealed segments and an open one
SEGMENT = 32 << 10
VALUE = b"v" * 100
WORKERS = 8
POLL = 0.2  # sej-hub's poll interval for the latency rounds
PLOT = "hub_scale.png"
# Issue 13's targets, at 1,000 journals.
INCREMENTAL_TARGET = 1.0  # rsync's time / sej's time
INITIAL_TARGET = 0.8
IDLE_TARGET = 0.5  # seconds
LATENCY_TARGET = 1.0  # seconds, p99


def ensure_rsync() -> str | None:
    """The rsync program; installed with apt-get when missing (as .ci/run does), None if that fails."""
    found = shutil.which("rsync")
    if found is None and shutil.which("apt-get") is not None:
        log("  rsync is missing: installing it with apt-get")
        subprocess.run(["apt-get", "install", "-y", "-qq", "rsync"], capture_output=True, check=False)
        found = shutil.which("rsync")
    return found


def journal_names(n: int) -> list[str]:
    """n shards of one sharded root, as a ShardedWriter of 2^bit shards names them."""
    from sej.shard.name import format_shard

    bit = max(1, (n - 1).bit_length())
    return [format_shard("ev", bit, i) for i in range(n)]


def build_root(src: Path, names: list[str]) -> list[sej.Writer]:
    """The producer root, and its live writers (open, holding their locks) for the incremental rounds."""
    writers = []
    for name in names:
        w = sej.Writer(str(src / name), segment_size=SEGMENT, durability="flush")
        w.append_many([VALUE] * MESSAGES, key=KEY)
        w.flush()
        writers.append(w)
    return writers


class Runner:
    """`sej copy` and rsync processes over the same sshd, each into its own destination."""

    def __init__(self, server: Sshd, rsync: str, src: Path, scratch: Path) -> None:
        self.server, self.rsync_path, self.src = server, rsync, src
        self.cache = scratch / "cache"  # sej copy's $XDG_CACHE_HOME
        self.env = installed_env(scratch, XDG_CACHE_HOME=str(self.cache))
        self.ssh = " ".join(["ssh", "-p", str(server.port), *server.ssh_options()])

    def sej_copy(self, hub: Path) -> float:
        s = self.server
        cmd = [sys.executable, "-c", "from sej.apps.cli.main import main; main()", "copy",
               f"ssh://{s.user}@127.0.0.1:{s.port}{self.src}", str(hub), "--client-id", "c", "--workers", str(WORKERS),
               "--identity", str(s.identity), "--known-hosts", str(s.known_hosts)]  # fmt: skip
        t = time.perf_counter()
        r = subprocess.run(cmd, env=self.env, capture_output=True, text=True, check=False)
        took = time.perf_counter() - t
        if r.returncode != 0:
            raise RuntimeError(f"sej copy failed ({r.returncode}): {r.stderr[-2000:]}")
        return took

    def rsync(self, dst: Path, fsync: bool = False) -> float:
        cmd = [self.rsync_path, "-a", "--append", *(["--fsync"] if fsync else []), "-e", self.ssh,
               f"{self.server.user}@127.0.0.1:{self.src}/", f"{dst}/"]  # fmt: skip
        t = time.perf_counter()
        subprocess.run(cmd, check=True, capture_output=True)
        return time.perf_counter() - t


def check_copies(src: Path, names: list[str], hub: Path, dsts: list[Path]) -> None:
    """Every copy holds what the source holds (sej: the same next offsets; rsync: the same segment bytes)."""
    for name in names:
        want = sej.next_offset(str(src / name))
        got = sej.next_offset(str(hub / f"c.{name}"))
        if got != want:
            raise RuntimeError(f"sej copy of {name}: next offset {got}, the source's {want}")
        for seg in sej.list_segments(str(src / name)):
            size = os.path.getsize(seg.path)
            for d in dsts:
                if os.path.getsize(d / name / "jnl" / os.path.basename(seg.path)) != size:
                    raise RuntimeError(f"rsync copy of {name} differs from the source")


def process_cpu(pids: list[int]) -> float:
    """CPU seconds of the processes `pids`, with their children's that they have reaped (as a parent sshd
    collects its sessions'); a process gone meanwhile counts nothing."""
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
        except OSError:
            continue
        total += sum(int(x) for x in fields[11:15])  # utime, stime, cutime, cstime
    return total / os.sysconf("SC_CLK_TCK")


def append_round(hub: Path, src: Path, names: list[str], writers: list[sej.Writer], look: float) -> list[float]:
    """Append one message to each writer; the seconds until each is in the hub's copy (looked at every `look` s)."""
    sent = []
    for w in writers:
        w.append(VALUE, key=KEY)
        w.flush()
        sent.append(time.monotonic())
    want = []
    for name in names:
        seg = sej.list_segments(str(src / name))[-1].path
        want.append((hub / f"c.{name}" / "jnl" / os.path.basename(seg), os.path.getsize(seg)))
    pending = set(range(len(names)))
    got: list[float] = []
    deadline = time.monotonic() + 120
    while pending:
        for i in list(pending):
            path, size = want[i]
            try:
                if os.stat(path).st_size >= size:
                    got.append(time.monotonic() - sent[i])
                    pending.discard(i)
            except FileNotFoundError:
                pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"{len(pending)} messages did not reach the hub in 120 s")
        if pending:
            time.sleep(look)
    return got


def latency_rounds(server: Sshd, scratch: Path, src: Path, names: list[str], writers: list[sej.Writer],
                   rounds: int) -> tuple[list[float], float, float]:  # fmt: skip
    """sej-hub (poll POLL) over the root; each round appends one message to every journal; the seconds until
    each is in the hub's copy (its segment reached the source's size: written, and fsynced right after). Also
    the CPU seconds per round of sej-hub and of the producer's sshd (its sessions: the sftp-servers)."""
    from testing.sshd import descendants

    hub = fresh(scratch / "lathub")
    config = scratch / "hub-scale.toml"
    config.write_text(
        f'hub_root = "{hub}"\nhub_name = "bench"\npoll_interval = {POLL}\nworkers = {WORKERS}\n\n[[client]]\n'
        f'client_id = "c"\nhost = "127.0.0.1"\nport = {server.port}\nuser = "{server.user}"\n'
        f'identity_file = "{server.identity}"\nknown_hosts = "{server.known_hosts}"\nremote_root = "{src}"\n'
    )
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.Popen(
        [sys.executable, "-c", "from sej.apps.hub import main; main()", "--config", str(config)],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )  # fmt: skip
    latencies: list[float] = []
    try:
        os.sync()
        deadline = time.monotonic() + 300
        for name in names:  # the initial copy
            while not os.path.isdir(hub / f"c.{name}" / "jnl") or sej.next_offset(str(hub / f"c.{name}")) < (
                sej.next_offset(str(src / name))
            ):
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"sej-hub did not copy {name} in time: {proc.stderr.read().decode()[-2000:]}")  # type: ignore[union-attr]
                time.sleep(0.05)
        hub_cpu, sshd_cpu = process_cpu([proc.pid]), process_cpu(descendants(server.pid))
        for _ in range(rounds):
            # 1,000 stats per look: looking more often takes CPU from the hub measured
            latencies += append_round(hub, src, names, writers, 0.02)
            time.sleep(4 * POLL)  # a gap between rounds: each round starts with the hub idle
        hub_cpu = (process_cpu([proc.pid]) - hub_cpu) / rounds
        sshd_cpu = (process_cpu(descendants(server.pid)) - sshd_cpu) / rounds
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
    return latencies, hub_cpu, sshd_cpu


def bench_hub_scale(cfg: Config, scratch: Path) -> list[Result]:
    server = _sshd()
    if server is None:
        log("  openssh-server is missing: skipped")
        return []
    rsync = ensure_rsync()
    if rsync is None:
        log("  rsync is missing and could not be installed: skipped")
        server.stop()
        return []
    series = QUICK_SERIES if cfg.quick else SERIES
    reps = 1 if cfg.quick else 3
    rounds = 3 if cfg.quick else 8
    from sej.fsutil import allow_open_files

    allow_open_files(4 * max(series) + 256)  # the live writers: a segment and a lock each, and their indexes
    times: dict[tuple[int, str], list[float]] = {}
    lat: dict[int, list[float]] = {}
    cpu: dict[int, tuple[float, float]] = {}
    clients: dict[str, list[tuple[float, float]]] = {}
    try:
        for n in series:
            log(f"  {n} journals")
            src = fresh(scratch / "scale-src")
            names = journal_names(n)
            writers = build_root(src, names)
            try:
                run = Runner(server, rsync, src, scratch)
                for rep in range(reps):
                    hub, dst, dst_sync = (
                        fresh(scratch / "scale-hub"),
                        fresh(scratch / "scale-rsync"),
                        fresh(scratch / "scale-rsync-fsync"),
                    )
                    fresh(run.cache)
                    dst.mkdir()
                    dst_sync.mkdir()
                    for phase in ("initial", "idle", "incremental"):
                        if phase == "incremental":
                            for w in writers:  # live writers: one new message in every journal
                                w.append(VALUE, key=KEY)
                                w.flush()
                        # Alternate who goes first, so neither always meets a warm or a cold page cache.
                        order = ("sej", "rsync", "rsync --fsync") if rep % 2 == 0 else ("rsync --fsync", "rsync", "sej")
                        for who in order:
                            os.sync()  # no tool pays for another's writeback (or the tree's, just written)
                            took = (run.sej_copy(hub) if who == "sej" else run.rsync(dst) if who == "rsync"
                                    else run.rsync(dst_sync, fsync=True))  # fmt: skip
                            times.setdefault((n, f"{phase}:{who}"), []).append(took)
                        check_copies(src, names, hub, [dst, dst_sync])
                times[(n, "idle pass:sej-hub")], times[(n, "incremental pass:sej-hub")] = daemon_passes(
                    server, src, scratch, writers, reps
                )
                if n == max(series):
                    clients = sftp_clients(server, src, names, 2 * reps + 1)
                lat[n], *per_round = latency_rounds(server, scratch, src, names, writers, rounds)
                cpu[n] = (per_round[0], per_round[1])
            finally:
                for w in writers:
                    w.close()
    finally:
        server.stop()
    return [_result(series, reps, rounds, times, lat, clients, cpu)]


def sftp_clients(server: Sshd, src: Path, names: list[str], reps: int) -> dict[str, list[tuple[float, float]]]:
    """(wall, CPU) seconds of a pass's two SFTP workloads, all requests in flight at once, over one channel:
    the probe (an lstat of each journal's last segment and of its next one) and the reads (lstat, open, fstat,
    read the last 4 KiB, close), by the hub's pipeline over paramiko and by asyncssh (issue 13: measure it,
    and switch only if it is faster). Empty if asyncssh is missing."""
    try:
        import asyncio

        import asyncssh
    except ImportError:
        log("  asyncssh is missing (pip install asyncssh, or the bench extra): its rows are left out")
        return {}
    from sej.hub.ssh import connect, resolve, sftp_sources

    lasts = [os.path.basename(sej.list_segments(str(src / n))[-1].path) for n in names]
    paths = [str(src / n / "jnl" / seg) for n, seg in zip(names, lasts, strict=True)]
    sizes = [os.path.getsize(p) for p in paths]
    after = [os.path.join(os.path.dirname(p), "%016x.jnl" % (1 << 40)) for p in paths]  # a later segment: missing
    out: dict[str, list[tuple[float, float]]] = {}

    def timed(key: str, check: Callable[[list[Any]], bool], run: Callable[[], list[Any]]) -> None:
        c, t = cpu_seconds(), time.perf_counter()
        got = run()
        out.setdefault(key, []).append((time.perf_counter() - t, cpu_seconds() - c))
        if not check(got):
            raise RuntimeError(f"{key}: wrong results")

    probed = lambda got: got[0::2] == sizes and got[1::2] == [None] * len(sizes)  # noqa: E731
    read = lambda got: [len(g) for g in got] == [min(4096, s) for s in sizes]  # noqa: E731
    ep = resolve("127.0.0.1", server.port, server.user, str(server.identity), str(server.known_hosts),
                 ssh_config=os.devnull)  # fmt: skip
    client = connect(ep)
    source = sftp_sources(client, str(src), "bench")()
    try:
        missing = "%016x.jnl" % (1 << 40)
        probe = [c for n, seg in zip(names, lasts, strict=True) for c in (("size", n, seg), ("size", n, missing))]
        reads = [("read", n, seg, max(0, s - 4096), 4096) for n, seg, s in zip(names, lasts, sizes, strict=True)]
        for _ in range(reps):
            timed("probe:paramiko", probed, lambda: source.many(probe))
            timed("read:paramiko", read, lambda: source.many(reads))
    finally:
        source.close()
        client.close()

    async def measure() -> None:
        keys, known = [str(server.identity)], str(server.known_hosts)
        async with (
            asyncssh.connect("127.0.0.1", port=server.port, username=server.user, client_keys=keys,
                             known_hosts=known) as conn,
            conn.start_sftp_client() as sftp,
        ):  # fmt: skip

            async def size(p: str) -> int | None:
                try:
                    return (await sftp.lstat(p)).size
                except asyncssh.SFTPNoSuchFile:
                    return None

            async def tail(p: str) -> bytes:
                attrs = await sftp.lstat(p)
                async with sftp.open(p, "rb") as f:
                    await f.stat()
                    return await f.read(4096, max(0, (attrs.size or 0) - 4096))

            both = [q for pair in zip(paths, after, strict=True) for q in pair]
            for _ in range(reps):
                loop = asyncio.get_running_loop()
                for key, ok, make in (("probe:asyncssh", probed, lambda: [size(q) for q in both]),
                                      ("read:asyncssh", read, lambda: [tail(q) for q in paths])):  # fmt: skip
                    c, t = cpu_seconds(), loop.time()
                    got = await asyncio.gather(*make())
                    out.setdefault(key, []).append((loop.time() - t, cpu_seconds() - c))
                    if not ok(list(got)):
                        raise RuntimeError(f"{key}: wrong results")

    asyncio.run(measure())
    return out


def cpu_seconds() -> float:
    """This process's CPU time (user and system, all threads: paramiko's transport thread included)."""
    t = os.times()
    return t.user + t.system


def daemon_passes(server: Sshd, src: Path, scratch: Path, writers: list[sej.Writer],
                  reps: int) -> tuple[list[float], list[float]]:  # fmt: skip
    """Idle and incremental passes as sej-hub makes them: one connection and its kept channels open (each keeping its
    journals' files open), the hub's journals kept open, the last pass's state in memory. Every changed journal's
    offset is committed on the producer in the pass, as `sej copy` does (no commit_interval)."""
    from sej.hub import CopyState, copy_all
    from sej.hub.copy import Destinations, open_journals
    from sej.hub.location import KeptOf, Sources
    from sej.hub.ssh import connect, resolve, sftp_sources

    ep = resolve("127.0.0.1", server.port, server.user, str(server.identity), str(server.known_hosts),
                 ssh_config=os.devnull)  # fmt: skip
    client = connect(ep)
    sources = Sources("bench", sftp_sources(client, str(src), "bench"), client)
    destinations = Destinations(open_journals())
    try:
        hub = fresh(scratch / "scale-daemon-hub")
        state = CopyState()

        def one_pass() -> float:
            t = time.perf_counter()
            out = copy_all(sources, str(hub), "c", "bench", workers=WORKERS, state=state, destinations=destinations,
                           kept=KeptOf(sources))  # fmt: skip
            took = time.perf_counter() - t
            if any(o.error is not None for o in out):
                raise RuntimeError(f"a daemon pass failed: {[o.error for o in out if o.error is not None][:3]}")
            return took

        one_pass()
        one_pass()  # the kept channels open their journals' files
        idle, incremental = [], []
        for _ in range(reps):
            os.sync()
            idle.append(one_pass())
            for w in writers:  # live writers: one new message in every journal
                w.append(VALUE, key=KEY)
                w.flush()
            os.sync()
            incremental.append(one_pass())
            for w in writers:
                if sej.next_offset(str(hub / f"c.{os.path.basename(w.dir)}")) != w.next_offset:
                    raise RuntimeError(f"the daemon's pass left {w.dir} behind")
        return idle, incremental
    finally:
        destinations.close()
        sources.close()


def _result(series: tuple[int, ...], reps: int, rounds: int, times: dict[tuple[int, str], list[float]],
            lat: dict[int, list[float]], clients: dict[str, list[tuple[float, float]]],
            cpu: dict[int, tuple[float, float]]) -> Result:  # fmt: skip
    med = {k: statistics.median(v) for k, v in times.items()}
    big = max(series)
    rows = []
    summary = None
    for n in series:
        for phase, target in (("initial", INITIAL_TARGET), ("incremental", INCREMENTAL_TARGET)):
            mine, theirs = med[(n, f"{phase}:sej")], med[(n, f"{phase}:rsync")]
            durable = med[(n, f"{phase}:rsync --fsync")]
            ok = theirs / mine >= target
            row = Row(
                f"{n:,} journals: {phase} pass, `sej copy` vs `rsync -a --append` (`--fsync`: {durable:.2f} s)",
                f"{mine:.2f} s",
                f"{theirs:.2f} s",
                ratio(theirs / mine),
                f"≥ {target:g}x" if n == big else "—",
                verdict(ok) if n == big else "info",
            )
            rows.append(row)
            if n == big and phase == "incremental":
                summary = row
        idle, idle_rsync, daemon = med[(n, "idle:sej")], med[(n, "idle:rsync")], med[(n, "idle pass:sej-hub")]
        rows.append(Row(
            f"{n:,} journals: idle pass, as `sej-hub` makes it (`sej copy` process: {idle:.2f} s)",
            f"{daemon:.3f} s",
            f"{idle_rsync:.2f} s",
            ratio(idle_rsync / daemon),
            f"< {IDLE_TARGET:g} s" if n == big else "—",
            verdict(daemon < IDLE_TARGET) if n == big else "info",
        ))  # fmt: skip
        daemon_inc, rsync_inc = med[(n, "incremental pass:sej-hub")], med[(n, "incremental:rsync")]
        rows.append(Row(
            f"{n:,} journals: incremental pass, as `sej-hub` makes it, every offset committed, vs `rsync -a --append` "
            f"(`--fsync`: {med[(n, 'incremental:rsync --fsync')]:.2f} s)",
            f"{daemon_inc:.3f} s",
            f"{rsync_inc:.2f} s",
            ratio(rsync_inc / daemon_inc),
            "—",
            "info",
        ))  # fmt: skip
        ls = sorted(lat[n])
        p50, p99 = percentile(ls, 0.5), percentile(ls, 0.99)
        rows.append(Row(
            f"{n:,} journals: append → in the hub's copy, `sej-hub` poll {POLL:g} s, every journal appended at once",
            f"p99 {ms(p99)} (p50 {ms(p50)}, max {ms(ls[-1])})",
            "—",
            "—",
            f"p99 < {ms(LATENCY_TARGET)}" if n == big else "—",
            verdict(p99 < LATENCY_TARGET) if n == big else "info",
        ))  # fmt: skip
        hub_cpu, sshd_cpu = cpu[n]
        rows.append(Row(
            f"{n:,} journals: CPU per latency round, `sej-hub` vs the producer's sshd (its sftp-servers)",
            f"{hub_cpu:.2f} s", f"{sshd_cpu:.2f} s", "—", "—", "info",
        ))  # fmt: skip
    big_n = f"{big:,}"
    workloads = (("probe", f"{2 * big:,} lstats (the probe)"),
                 ("read", f"{big:,} reads of a file's last 4 KiB: lstat, open, fstat, read, close"))  # fmt: skip
    for what, label in workloads:
        if f"{what}:asyncssh" not in clients:
            continue
        mine = statistics.median(w for w, _c in clients[f"{what}:paramiko"])
        theirs = statistics.median(w for w, _c in clients[f"{what}:asyncssh"])
        cpu_mine = statistics.median(c for _w, c in clients[f"{what}:paramiko"])
        cpu_theirs = statistics.median(c for _w, c in clients[f"{what}:asyncssh"])
        rows.append(Row(
            f"SFTP client, {label} of the {big_n} journals in flight on one channel: the hub's pipeline over "
            f"paramiko vs asyncssh (CPU: {cpu_mine * 1000:.0f} vs {cpu_theirs * 1000:.0f} ms)",
            ms(mine), ms(theirs), ratio(theirs / mine), "—", "info",
        ))  # fmt: skip
    notes = [f"Medians of {reps} runs per pass, interleaved, each tool first in turn. All runs (s):"]
    for (n, what), ts in sorted(times.items()):
        notes.append(f"{n:,} journals, {what}: {fmt_list(ts)}")
    for key, runs in sorted(clients.items()):
        walls, cpus = fmt_list([w for w, _c in runs]), fmt_list([c for _w, c in runs])
        notes.append(f"SFTP client {key}: wall {walls}, CPU {cpus}")
    notes.append(_plot(series, med, lat))
    return Result(
        "hub_scale",
        "14. The hub at scale, against rsync",
        [
            f"A producer root of N shard journals (N = {', '.join(f'{n:,}' for n in series)}), each written with "
            f"{MESSAGES} messages of {len(VALUE)} bytes in {SEGMENT >> 10} KiB segments (two sealed segments and an "
            "open one, with their index files) by live writers that stay open. One real OpenSSH sshd on 127.0.0.1. "
            f"`sej copy ssh://… HUB --workers {WORKERS}` (a new process each time: start-up, connection and its "
            "cache of the last run included; its modules compiled beforehand, as a wheel install has them) "
            "against `rsync -a --append -e ssh …` into its own directory, over the "
            "same sshd and key, also with `--fsync` (durable, as the hub is); the page cache is written back "
            "(`os.sync()`) before each run. The hub checks every frame, makes what it wrote durable (over 16 "
            "journals or more, one `syncfs` per layer of segments, which also writes back whatever else is dirty on "
            "the disk, here the producer's files; else an fsync each) and then commits its offset on the producer "
            "(written, fsynced and renamed over SFTP); rsync copies bytes and, without `--fsync`, fsyncs nothing.",
            "Passes: initial (empty destinations), idle (nothing new), incremental (the live writers appended one "
            "message to every journal). After each pass every copy is checked against the source. The idle row, "
            "and a row of its own for the incremental pass, also time the pass as `sej-hub` makes it: its "
            "connection and kept channels open (each keeping its journals' files open), the hub's journals open, the "
            "last pass's state in memory; with every changed journal's offset committed in the pass, as `sej copy` "
            "does (the daemon's commit_interval would defer them). Those passes run after the `sej copy` and rsync "
            "runs, into a hub copy of their own, with one message appended to every journal before each incremental "
            "one, as before theirs.",
            "SFTP clients: the two workloads of a pass over the largest root, every request in flight at once on one "
            "channel, over one connection each: the hub's pipeline (`sej.hub.pipeline` over paramiko's channel, "
            "with the same type checks the hub makes) and asyncssh (`asyncio.gather` of its SFTP client's calls). "
            "CPU is the benchmark process's (both run in it; the sftp-server is not counted). Issue 13 asked to "
            "measure asyncssh if paramiko is the limit, and to switch only if the numbers say so.",
            f"Latency: `sej-hub` (poll {POLL:g} s, {WORKERS} workers) over the same root; {rounds} rounds, each "
            "appending one message to every journal at once, then waiting until every one is in the hub's copy "
            "(its segment file reached the source's size; looked at every 20 ms).",
        ],
        rows,
        notes,
        summary,
    )


def _plot(series: tuple[int, ...], med: dict[tuple[int, str], float], lat: dict[int, list[float]]) -> str:
    """docs/hub_scale.png: pass times and latency against the number of journals."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "No plot: matplotlib is not installed (`pip install '.[bench]'`)."
    docs = Path(__file__).resolve().parents[2] / "docs"
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4), dpi=100)
    for phase, color in (("initial", "tab:blue"), ("incremental", "tab:orange")):
        left.plot(series, [med[(n, f"{phase}:sej")] for n in series], "o-", color=color, label=f"sej copy, {phase}")
        left.plot(series, [med[(n, f"{phase}:rsync")] for n in series], "s--", color=color, label=f"rsync, {phase}")
        left.plot(series, [med[(n, f"{phase}:rsync --fsync")] for n in series], "^:", color=color,
                  label=f"rsync --fsync, {phase}")  # fmt: skip
    left.set_xscale("log")
    left.set_xlabel("journals")
    left.set_ylabel("pass, median (s)")
    left.set_title("One pass over SSH (a new process each)")
    left.legend(fontsize=7)
    left.grid(True, which="both", alpha=0.3)
    right.plot(series, [percentile(sorted(lat[n]), 0.99) for n in series], "o-", label="p99")
    right.plot(series, [percentile(sorted(lat[n]), 0.5) for n in series], "s--", label="p50")
    right.axhline(LATENCY_TARGET, color="grey", linewidth=0.8, linestyle=":", label="target (p99)")
    right.set_xscale("log")
    right.set_xlabel("journals (one message appended to each at once)")
    right.set_ylabel("append → in the hub's copy (s)")
    right.set_title(f"sej-hub, poll {POLL:g} s")
    right.legend(fontsize=7)
    right.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(docs / PLOT)
    plt.close(fig)
    return f"![pass times and append-to-hub latency against the number of journals]({PLOT})"
