"""One `sej-hub` serving 50 SSH clients: when one client's sshd stops (hangs mid-connection), the other 49
keep their latency."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import sej
from testing.sshd import Sshd, descendants
from testing.timing import scaled

from .test_hub_daemon import env, hub_script, wait_for, write_config

CLIENTS = 50
JOURNALS = 4  # per client
POLL = 0.2


def produce_root(root: Path) -> list[sej.Writer]:
    """A client's root of JOURNALS journals with a few messages, and their writers (kept open)."""
    writers = []
    for j in range(JOURNALS):
        w = sej.Writer(str(root / f"ev.2.{j:03x}"), segment_size=4096, durability="flush")
        w.append_many([b"first %d" % k for k in range(10)])
        w.flush()
        writers.append(w)
    return writers


def arrived(hub: Path, client: str, journal: str, count: int) -> bool:
    d = hub / f"{client}.{journal}"
    return d.is_dir() and (d / "jnl").is_dir() and sej.next_offset(str(d)) >= count


def latency_round(hub: Path, writers: dict[str, list[sej.Writer]], clients: list[str], deadline: float) -> list[float]:
    """Append one message to the first journal of each client at once; each one's seconds until it is at the hub."""
    sent, want = {}, {}
    for c in clients:
        w = writers[c][0]
        w.append(b"tick")
        w.flush()
        sent[c], want[c] = time.monotonic(), w.next_offset
    pending, out = set(clients), []
    limit = time.monotonic() + deadline
    while pending:
        for c in list(pending):
            if arrived(hub, c, "ev.2.000", want[c]):
                out.append(time.monotonic() - sent[c])
                pending.discard(c)
        assert time.monotonic() < limit, f"{len(pending)} clients did not get their message within {deadline:g} s"
        time.sleep(0.01)
    return out


def signal_all(server: Sshd, sig: int) -> None:
    """`sig` to the sshd listener and everything under it (per-connection sshd, sftp-server)."""
    for pid in [server.pid, *descendants(server.pid)]:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


def test_fifty_clients_and_one_stopped_sshd_does_not_delay_the_others(sshd, tmp_path) -> None:
    victim_sshd = Sshd()
    hub = tmp_path / "hub"
    writers: dict[str, list[sej.Writer]] = {}
    proc = None
    stopped = False
    try:
        clients = []
        for i in range(CLIENTS):
            cid = f"c{i:02d}"
            server = victim_sshd if i == CLIENTS - 1 else sshd
            root = tmp_path / "src" / cid
            writers[cid] = produce_root(root)
            clients.append({
                "client_id": cid, "host": "127.0.0.1", "port": server.port, "user": server.user,
                "identity_file": str(server.identity), "known_hosts": str(server.known_hosts), "remote_root": str(root),
            })  # fmt: skip
        victim, others = clients[-1]["client_id"], [c["client_id"] for c in clients[:-1]]
        config = write_config(tmp_path / "hub.toml", hub, clients, poll_interval=POLL, workers=2)
        proc = subprocess.Popen([hub_script(), "--config", str(config)], env=env(), stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE, text=True)  # fmt: skip
        wait_for(lambda: all(arrived(hub, c, f"ev.2.{j:03x}", 10) for c in others + [victim] for j in range(JOURNALS)),
                 120, "the first copy of every client")  # fmt: skip
        before: list[float] = []
        for _ in range(3):
            before += latency_round(hub, writers, others + [victim], scaled(60))
        # The victim's sshd, its connection and its sftp-server stop: its pass hangs mid-transfer, and a new
        # connection to it would hang too. Its next message is appended while it hangs.
        w = writers[victim][0]
        w.append(b"during the hang")
        w.flush()
        signal_all(victim_sshd, signal.SIGSTOP)
        stopped = True
        after: list[float] = []
        for _ in range(5):
            after += latency_round(hub, writers, others, scaled(60))
        assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
        before.sort()
        after.sort()
        p99_before, p99_after = before[int(0.99 * (len(before) - 1))], after[int(0.99 * (len(after) - 1))]
        print(f"49 clients, p50/p99 before {before[len(before) // 2]:.3f}/{p99_before:.3f} s, "
              f"after {after[len(after) // 2]:.3f}/{p99_after:.3f} s")  # fmt: skip
        # Had the hung client held the others up, their messages would wait for its timeouts (60 s and more).
        assert p99_after <= 3 * p99_before + scaled(1.0), (p99_before, p99_after)
        signal_all(victim_sshd, signal.SIGCONT)
        stopped = False
        wait_for(lambda: arrived(hub, victim, "ev.2.000", w.next_offset), 120, "the victim's message after it resumed")
    finally:
        if stopped:
            signal_all(victim_sshd, signal.SIGCONT)
        if proc is not None:
            proc.terminate()
            try:
                proc.wait(scaled(30))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        for ws in writers.values():
            for w in ws:
                w.close()
        victim_sshd.stop()
