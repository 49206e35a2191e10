"""Benchmark 19: the hub at a distance (issue 39, section 5). `sej copy` over `sej serve` and over SFTP against rsync
and scp through testing/wan (a delay line and a bandwidth cap in front of the same sshd) at +0, +2, +50 and +150 ms of
round trip; `sej-hub`'s append-to-hub latency over both transports; compression on a JSON journal against `scp -C`."""

from __future__ import annotations

import json
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

import sej
from testing.sshd import Sshd
from testing.wan import Wan

from .common import KEY, ROOT, Config, fresh, installed_env, log, percentile
from .hub import _sshd
from .hub_scale import VALUE, append_round, build_root, ensure_rsync, journal_names
from .results import Result, Row, fmt_list, ms, ratio, verdict

RTTS = (0.0, 0.002, 0.050, 0.150)
QUICK_RTTS = (0.0, 0.050)
MBIT = 200
JOURNALS = 1000
QUICK_JOURNALS = 100
WORKERS = 8  # as the issue measured (the test sshd allows 64 sessions)
BULK = 64 << 20
QUICK_BULK = 16 << 20
JSON_BULK = 32 << 20
QUICK_JSON_BULK = 8 << 20
POLL = 0.2  # sej-hub's poll interval (over serve, a push ends the wait at once)
ALL_ROUNDS, QUICK_ALL_ROUNDS = 6, 2  # latency rounds appending to every journal at once
ONE_ROUNDS, QUICK_ONE_ROUNDS = 30, 8  # latency rounds appending to one journal
TRANSPORTS = ("serve", "sftp")
TARGET_RTT = 0.050
FAR_RTT = 0.150
FAR_SLACK = 0.8  # at +150 ms the same ratios within 20%
PASS_TARGET = {"serve": 1.0, "sftp": 0.8}  # rsync's time / sej's, initial and incremental (issue 39, Done when)
BULK_TARGET = 0.9  # one 64 MiB journal: scp's time / sej's, both transports
COMPRESS_TARGET = 0.9  # the JSON journal with compression on: `scp -C`'s time / sej's
LATENCY_ALL = {"serve": 0.250, "sftp": 1.0}  # p99, every journal appended at once
LATENCY_ONE = {"serve": 0.100}  # p99, one journal's append
PLOT = "hub_wan.png"


def _ms(rtt: float) -> str:
    return f"+{rtt * 1000:g} ms"


class Link:
    """`sej copy`, `sej-hub`, rsync, scp and ssh through one Wan in front of the sshd: their known_hosts names the
    proxy's port."""

    def __init__(self, server: Sshd, wan: Wan, scratch: Path) -> None:
        self.server, self.wan, self.scratch = server, wan, scratch
        self.known = scratch / f"known_hosts_{wan.port}"
        self.known.write_text(f"[127.0.0.1]:{wan.port} {server.host_key}\n")
        self.cache = scratch / "cache"  # sej copy's $XDG_CACHE_HOME
        self.env = installed_env(scratch, XDG_CACHE_HOME=str(self.cache))
        # The producer's sej: this checkout, from the same compiled modules (a wheel install has them compiled).
        self.serve = f"env PYTHONPATH={ROOT} PYTHONPYCACHEPREFIX={scratch / 'pycache'} {sys.executable} -m sej.apps.cli"
        opts = [f"UserKnownHostsFile={self.known}" if o.startswith("UserKnownHostsFile=") else o
                for o in server.ssh_options()]  # fmt: skip
        self.ssh_opts = opts
        self.ssh = " ".join(["ssh", "-p", str(wan.port), *opts])

    def remote(self, path: Path) -> str:
        return f"{self.server.user}@127.0.0.1:{path}"

    def sej_copy(self, src: Path, hub: Path, transport: str, compress: bool = False) -> float:
        cmd = [sys.executable, "-c", "from sej.apps.cli.main import main; main()", "copy",
               f"ssh://{self.server.user}@127.0.0.1:{self.wan.port}{src}", str(hub), "--client-id", "c",
               "--workers", str(WORKERS), "--identity", str(self.server.identity), "--known-hosts", str(self.known),
               "--transport", transport, "--serve-command", self.serve,
               *(["--compress"] if compress else [])]  # fmt: skip
        t = time.perf_counter()
        r = subprocess.run(cmd, env=self.env, capture_output=True, text=True, check=False)
        took = time.perf_counter() - t
        if r.returncode != 0:
            raise RuntimeError(f"sej copy ({transport}) failed ({r.returncode}): {r.stderr[-2000:]}")
        return took

    def timed(self, cmd: list[str]) -> float:
        t = time.perf_counter()
        subprocess.run(cmd, check=True, capture_output=True)
        return time.perf_counter() - t

    def rsync(self, rsync: str, src: Path, dst: Path) -> float:
        return self.timed([rsync, "-a", "--append", "-e", self.ssh, f"{self.remote(src)}/", f"{dst}/"])

    def scp(self, files: list[Path], dst: Path, compress: bool = False) -> float:
        return self.timed(["scp", "-q", *(["-C"] if compress else []), "-P", str(self.wan.port), *self.ssh_opts,
                           *[self.remote(f) for f in files], str(dst)])  # fmt: skip

    def ssh_true(self) -> float:
        """An exec session that runs nothing: what rsync's and scp's remote start costs on this machine's shell."""
        return self.timed(["ssh", "-p", str(self.wan.port), *self.ssh_opts, f"{self.server.user}@127.0.0.1", "true"])

    def latency(self, src: Path, names: list[str], writers: list[sej.Writer], transport: str, all_rounds: int,
                one_rounds: int) -> tuple[list[float], list[float]]:  # fmt: skip
        """`sej-hub` (poll POLL) over the root through the link: the seconds from an append (flushed) until it is in
        the hub's copy (its segment reached the source's size: written, fsynced right after). `all_rounds` rounds
        append one message to every journal at once; then `one_rounds` rounds append one to one journal."""
        hub = fresh(self.scratch / "wan-lathub")
        config = self.scratch / "hub-wan.toml"
        s = self.server
        config.write_text(
            f'hub_root = "{hub}"\nhub_name = "bench"\npoll_interval = {POLL}\nworkers = {WORKERS}\n\n[[client]]\n'
            f'client_id = "c"\nhost = "127.0.0.1"\nport = {self.wan.port}\nuser = "{s.user}"\n'
            f'identity_file = "{s.identity}"\nknown_hosts = "{self.known}"\nremote_root = "{src}"\n'
            f'transport = "{transport}"\nserve_command = "{self.serve}"\n'
        )
        proc = subprocess.Popen([sys.executable, "-c", "from sej.apps.hub import main; main()", "--config",
                                 str(config)], env=self.env, stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE)  # fmt: skip
        every: list[float] = []
        one: list[float] = []
        try:
            os.sync()
            deadline = time.monotonic() + 600
            for name in names:  # the initial copy
                while not os.path.isdir(hub / f"c.{name}" / "jnl") or sej.next_offset(str(hub / f"c.{name}")) < (
                    sej.next_offset(str(src / name))
                ):
                    if proc.poll() is not None or time.monotonic() > deadline:
                        err = proc.stderr.read().decode()[-2000:] if proc.poll() is not None else "(still running)"  # type: ignore[union-attr]
                        raise RuntimeError(f"sej-hub ({transport}) did not copy {name} in time: {err}")
                    time.sleep(0.05)
            time.sleep(1.0)  # the initial copy's last commits and pushes are over
            for _ in range(all_rounds):
                every += append_round(hub, src, names, writers, 0.02)
                time.sleep(4 * POLL)  # each round starts with the hub idle
            rng = random.Random(39)
            for _ in range(one_rounds):
                i = rng.randrange(len(names))
                one += append_round(hub, src, [names[i]], [writers[i]], 0.001)
                time.sleep(2 * POLL)
        finally:
            proc.terminate()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
        return every, one


def _check(src: Path, names: list[str], hubs: list[Path], dst: Path) -> None:
    for name in names:
        for hub in hubs:
            if sej.next_offset(str(hub / f"c.{name}")) != sej.next_offset(str(src / name)):
                raise RuntimeError(f"sej copy of {name} into {hub} is not the source's")
        for seg in sej.list_segments(str(src / name)):
            if os.path.getsize(dst / name / "jnl" / os.path.basename(seg.path)) != os.path.getsize(seg.path):
                raise RuntimeError(f"rsync copy of {name} differs from the source")


def _json_journal(path: Path, size: int) -> None:
    """A journal of JSON access-log events (as a web tier logs them), `size` bytes of values."""
    rng = random.Random(39)
    paths = [f"/api/v1/{rng.choice(['items', 'users', 'orders', 'carts'])}/{rng.randrange(10**6)}" for _ in range(500)]
    agents = ["Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/120.0 Safari/537.36",
              "Mozilla/5.0 (iPhone; CPU iPhone OS 17_1 like Mac OS X) AppleWebKit/605.1.15 Mobile/15E148",
              "curl/8.4.0", "python-requests/2.31.0"]  # fmt: skip
    t = 1_764_000_000_000
    written = 0
    with sej.Writer(str(path), segment_size=16 << 20) as w:
        while written < size:
            t += rng.randrange(1, 50)
            event = {"ts": t, "ip": f"10.{rng.randrange(256)}.{rng.randrange(256)}.{rng.randrange(256)}",
                     "method": rng.choice(("GET", "GET", "GET", "POST", "PUT")), "path": rng.choice(paths),
                     "status": rng.choice((200, 200, 200, 201, 304, 404, 500)), "bytes": rng.randrange(100, 50_000),
                     "ms": round(rng.expovariate(0.05), 2), "ua": rng.choice(agents),
                     "trace": f"{rng.getrandbits(64):016x}"}  # fmt: skip
            value = json.dumps(event, separators=(",", ":")).encode()
            w.append(value, key=KEY)
            written += len(value)


def bench_hub_wan(cfg: Config, scratch: Path) -> list[Result]:
    server = _sshd()
    if server is None:
        log("  openssh-server is missing: skipped")
        return []
    rsync = ensure_rsync()
    if rsync is None:
        log("  rsync is missing and could not be installed: skipped")
        server.stop()
        return []
    rtts = QUICK_RTTS if cfg.quick else RTTS
    n = QUICK_JOURNALS if cfg.quick else JOURNALS
    bulk = QUICK_BULK if cfg.quick else BULK
    json_bulk = QUICK_JSON_BULK if cfg.quick else JSON_BULK
    reps = 1 if cfg.quick else 3
    all_rounds, one_rounds = (QUICK_ALL_ROUNDS, QUICK_ONE_ROUNDS) if cfg.quick else (ALL_ROUNDS, ONE_ROUNDS)
    from sej.fsutil import allow_open_files

    allow_open_files(4 * n + 256)
    times: dict[tuple[float, str], list[float]] = {}
    lat: dict[tuple[float, str], list[float]] = {}
    try:
        src = fresh(scratch / "wan-src")
        names = journal_names(n)
        writers = build_root(src, names)
        big = fresh(scratch / "wan-bulk")
        with sej.Writer(str(big / "big"), segment_size=16 << 20) as w:
            value = os.urandom(1000)
            for _ in range(bulk // 1030):
                w.append(value, key=KEY)
        js = fresh(scratch / "wan-json")
        _json_journal(js / "events", json_bulk)
        json_size = sum(os.path.getsize(s.path) for s in sej.list_segments(str(js / "events")))
        try:
            for rtt in rtts:
                log(f"  {_ms(rtt)}")
                with Wan(server.port, rtt=rtt, mbit=MBIT) as wan:
                    link = Link(server, wan, scratch)
                    times.setdefault((rtt, "ssh true"), []).append(link.ssh_true())
                    _passes(link, rsync, src, names, writers, reps, rtt, times)
                    _bulk(link, big / "big", "bulk", reps, rtt, times, (("serve", False), ("sftp", False)))
                    _bulk(link, js / "events", "json", reps, rtt, times,
                          (("serve", True), ("sftp", True), ("serve", False)))  # fmt: skip
                    for transport in TRANSPORTS:
                        log(f"    sej-hub over {transport}")
                        every, one = link.latency(src, names, writers, transport, all_rounds, one_rounds)
                        lat[(rtt, f"{transport}:all")], lat[(rtt, f"{transport}:one")] = every, one
        finally:
            for w in writers:
                w.close()
    finally:
        server.stop()
    return [_result(rtts, n, bulk, json_size, reps, times, lat)]


def _passes(link: Link, rsync: str, src: Path, names: list[str], writers: list[sej.Writer], reps: int, rtt: float,
            times: dict[tuple[float, str], list[float]]) -> None:  # fmt: skip
    """`reps` rounds of initial, idle and incremental passes of sej copy (both transports) and rsync, interleaved."""
    tools = ("serve", "sftp", "rsync")
    for rep in range(reps):
        hubs = {t: fresh(link.scratch / f"wan-hub-{t}") for t in TRANSPORTS}
        dst = fresh(link.scratch / "wan-rsync")
        fresh(link.cache)
        dst.mkdir()
        for phase in ("initial", "idle", "incremental"):
            if phase == "incremental":
                for w in writers:  # live writers: one new message in every journal
                    w.append(VALUE, key=KEY)
                    w.flush()
            order = tools[rep % 3 :] + tools[: rep % 3]  # each tool first in turn
            for who in order:
                os.sync()
                took = link.rsync(rsync, src, dst) if who == "rsync" else link.sej_copy(src, hubs[who], who)
                times.setdefault((rtt, f"{phase}:{who}"), []).append(took)
            _check(src, names, list(hubs.values()), dst)


def _bulk(link: Link, journal: Path, what: str, reps: int, rtt: float, times: dict[tuple[float, str], list[float]],
          sej_runs: tuple[tuple[str, bool], ...]) -> None:  # fmt: skip
    """One journal copied whole by sej copy (`sej_runs`: transport, compression) and scp of its segments, with -C
    when a sej run compresses."""
    segments = [Path(s.path) for s in sej.list_segments(str(journal))]
    want = sej.next_offset(str(journal))
    runs: list[tuple[str, bool]] = [*sej_runs, ("scp", False)]
    if any(c for _t, c in sej_runs):
        runs.append(("scp", True))
    for rep in range(reps):
        order = runs[rep % len(runs) :] + runs[: rep % len(runs)]
        for who, compress in order:
            os.sync()
            key = f"{what}:{who}{' -C' if compress and who == 'scp' else ' --compress' if compress else ''}"
            if who == "scp":
                dst = fresh(link.scratch / "wan-scp")
                dst.mkdir()
                took = link.scp(segments, dst, compress)
            else:
                hub = fresh(link.scratch / "wan-bulk-hub")
                fresh(link.cache)
                took = link.sej_copy(journal, hub, who, compress)
                if sej.next_offset(str(hub / f"c.{journal.name}")) != want:
                    raise RuntimeError(f"{key}: the copy is not the source's")
            times.setdefault((rtt, key), []).append(took)


def _result(rtts: tuple[float, ...], n: int, bulk: int, json_size: int, reps: int,
            times: dict[tuple[float, str], list[float]],
            lat: dict[tuple[float, str], list[float]]) -> Result:  # fmt: skip
    med = {k: statistics.median(v) for k, v in times.items()}
    rows: list[Row] = []
    more: list[tuple[str, Row]] = []
    summary: Row | None = None

    def target_at(rtt: float, target: float) -> float | None:
        return target if rtt == TARGET_RTT else target * FAR_SLACK if rtt == FAR_RTT else None

    def compared(rtt: float, label: str, mine: float, theirs: float, target: float | None) -> Row:
        t = target_at(rtt, target) if target is not None else None
        return Row(f"{_ms(rtt)}: {label}", f"{mine:.2f} s", f"{theirs:.2f} s", ratio(theirs / mine),
                   f"≥ {t:.2g}x" if t is not None else "—",
                   verdict(theirs / mine >= t) if t is not None else "info")  # fmt: skip

    for rtt in rtts:
        for transport in TRANSPORTS:
            for phase in ("initial", "incremental", "idle"):
                row = compared(rtt, f"{n:,} journals, {phase} pass, `sej copy` over {transport} vs `rsync -a --append`",
                               med[(rtt, f"{phase}:{transport}")], med[(rtt, f"{phase}:rsync")],
                               PASS_TARGET[transport] if phase != "idle" else None)  # fmt: skip
                rows.append(row)
                if rtt in (TARGET_RTT, FAR_RTT) and phase != "idle":
                    if rtt == TARGET_RTT and transport == "serve" and phase == "incremental":
                        summary = row
                    else:
                        more.append((f"{phase} pass over {transport} at {_ms(rtt)}", row))
        for transport in TRANSPORTS:
            row = compared(rtt, f"one {bulk >> 20} MiB journal, `sej copy` over {transport} vs `scp` of its segments",
                           med[(rtt, f"bulk:{transport}")], med[(rtt, "bulk:scp")], BULK_TARGET)  # fmt: skip
            rows.append(row)
            if rtt in (TARGET_RTT, FAR_RTT):
                more.append((f"one {bulk >> 20} MiB journal over {transport} at {_ms(rtt)}", row))
        for transport in TRANSPORTS:
            row = compared(rtt, f"JSON journal ({json_size / 2**20:.1f} MiB), `sej copy --compress` over "
                           f"{transport} vs `scp -C`", med[(rtt, f"json:{transport} --compress")],
                           med[(rtt, "json:scp -C")], COMPRESS_TARGET)  # fmt: skip
            rows.append(row)
            if rtt in (TARGET_RTT, FAR_RTT):
                more.append((f"JSON journal, compression on, over {transport} at {_ms(rtt)}", row))
        rows.append(compared(rtt, "JSON journal, compression off: `sej copy` over serve vs `scp`",
                             med[(rtt, "json:serve")], med[(rtt, "json:scp")], None))  # fmt: skip
        for transport in TRANSPORTS:
            for what, label, targets in (("all", f"every one of the {n:,} journals appended at once", LATENCY_ALL),
                                         ("one", "one journal's append", LATENCY_ONE)):  # fmt: skip
                ls = sorted(lat[(rtt, f"{transport}:{what}")])
                p50, p99 = percentile(ls, 0.5), percentile(ls, 0.99)
                target = targets.get(transport) if rtt == TARGET_RTT else None
                row = Row(f"{_ms(rtt)}: append → in the hub's copy, `sej-hub` over {transport} (poll {POLL:g} s), "
                          f"{label} ({len(ls):,} appends)", f"p99 {ms(p99)} (p50 {ms(p50)}, max {ms(ls[-1])})", "—",
                          "—", f"p99 < {ms(target)}" if target is not None else "—",
                          verdict(p99 < target) if target is not None else "info")  # fmt: skip
                rows.append(row)
                if target is not None:
                    more.append((f"append to hub over {transport}, {label.split(' (')[0]}", row))
        rows.append(Row(f"{_ms(rtt)}: an ssh exec session that runs `true` (rsync's, scp's and sej serve's start)",
                        f"{med[(rtt, 'ssh true')]:.2f} s"))  # fmt: skip
    notes = [f"Medians of {reps} runs, interleaved, each tool first in turn. All runs (s):"]
    notes += [f"{_ms(rtt)}, {what}: {fmt_list(ts)}" for (rtt, what), ts in sorted(times.items())]
    notes.append(_plot(rtts, med, lat))
    return Result(
        "hub_wan",
        "19. The hub at a distance, against rsync and scp",
        [
            f"One real OpenSSH sshd on 127.0.0.1 behind testing/wan: a TCP proxy adding half the round trip each way "
            f"({', '.join(_ms(r) for r in rtts)}) and capping each direction at {MBIT} Mbit/s, shared by every "
            "connection through it; the TCP handshake pays its round trip too. The link's delay is a floor: on a "
            "loaded machine it can only be longer. Every tool goes through the same proxy with the same key; the "
            "producer's sej (`sej serve`) is this checkout, run by the login shell as rsync's and scp's remote ends "
            "are.",
            f"{n:,} journals of 500 messages of 100 bytes (live writers, as in benchmark 14) copied with "
            f"`sej copy ssh://… HUB --workers {WORKERS} --transport serve|sftp` (a new process each time, its modules "
            "compiled beforehand) against `rsync -a --append -e ssh …`: initial (empty destinations), idle (nothing "
            "new), incremental (one message appended to every journal). The hub checks every frame, makes what it "
            "wrote durable and commits its offset on the producer; rsync fsyncs nothing. Targets at +50 ms: over "
            f"serve ≥ {PASS_TARGET['serve']:g}x rsync, over SFTP ≥ {PASS_TARGET['sftp']:g}x; at +150 ms the same "
            f"ratios within 20% (≥ {FAR_SLACK:g} × the target).",
            f"Bulk: one journal of {bulk >> 20} MiB (random 1,000-byte values, 16 MiB segments) against `scp` of its "
            f"segment files (≥ {BULK_TARGET:g}x). Compression: one journal of {json_size / 2**20:.1f} MiB of JSON "
            f"access-log events, `sej copy --compress` (SSH's zlib) against `scp -C` (≥ {COMPRESS_TARGET:g}x), and "
            "without compression against `scp`. rsync, scp and `sej serve` start a shell on the producer (an exec "
            "session: the ssh-true row shows what that costs here, where root's ~/.bashrc runs `pyenv init`); SFTP is "
            "a subsystem, without a shell.",
            f"Latency: `sej-hub` (poll {POLL:g} s, {WORKERS} workers, transport serve or sftp) over the same root "
            "through the link, after its initial copy: rounds appending one message to every journal at once (looked "
            "at every 20 ms), then rounds appending one message to one journal (looked at every 1 ms); the time from "
            "each append's flush until its journal's segment at the hub reached the source's size. Targets at +50 ms: "
            f"over serve p99 < {ms(LATENCY_ALL['serve'])} (all at once) and < {ms(LATENCY_ONE['serve'])} (one); over "
            f"SFTP p99 < {ms(LATENCY_ALL['sftp'])}.",
        ],
        rows,
        notes,
        summary,
        more,
    )


def _plot(rtts: tuple[float, ...], med: dict[tuple[float, str], float], lat: dict[tuple[float, str], list[float]]
          ) -> str:  # fmt: skip
    """docs/hub_wan.png: pass times and append-to-hub latency against the round trip."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "No plot: matplotlib is not installed (`pip install '.[bench]'`)."
    docs = Path(__file__).resolve().parents[2] / "docs"
    xs = [r * 1000 for r in rtts]
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2), dpi=100)
    styles = {"serve": "o-", "sftp": "^-", "rsync": "s--"}
    for phase, color in (("initial", "tab:blue"), ("incremental", "tab:orange"), ("idle", "tab:green")):
        for who in ("serve", "sftp", "rsync"):
            label = f"{'sej copy, ' + who if who != 'rsync' else 'rsync'}, {phase}"
            left.plot(xs, [med[(r, f"{phase}:{who}")] for r in rtts], styles[who], color=color, label=label)
    left.set_xlabel("round trip added (ms)")
    left.set_ylabel("pass, median (s)")
    left.set_title("One pass over 1,000 journals (a new process each)")
    left.legend(fontsize=6, ncol=3)
    left.grid(True, alpha=0.3)
    for (transport, what), color in ((("serve", "all"), "tab:blue"), (("serve", "one"), "tab:purple"),
                                      (("sftp", "all"), "tab:red"), (("sftp", "one"), "tab:brown")):  # fmt: skip
        ys = [sorted(lat[(r, f"{transport}:{what}")]) for r in rtts]
        who = f"{transport}, {'all at once' if what == 'all' else 'one journal'}"
        right.plot(xs, [percentile(y, 0.99) * 1000 for y in ys], "o-", color=color, label=f"{who}: p99")
        right.plot(xs, [percentile(y, 0.5) * 1000 for y in ys], "s:", color=color, label=f"{who}: p50")
    far = [x for x in xs if x > 0]  # the floor of a pushed append: one way, then a read's round trip
    right.plot(far, [1.5 * x for x in far], color="grey", linewidth=0.8, linestyle="--", label="1.5 round trips")
    right.set_yscale("log")
    right.set_xlabel("round trip added (ms)")
    right.set_ylabel("append → in the hub's copy (ms)")
    right.set_title(f"sej-hub, poll {POLL:g} s")
    right.legend(fontsize=6, ncol=2)
    right.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(docs / PLOT)
    plt.close(fig)
    return f"![pass times and append-to-hub latency against the round trip]({PLOT})"
