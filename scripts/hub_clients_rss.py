"""The memory of one `sej-hub` serving many SSH clients: its RSS with C clients x J journals each.

Usage: python3 scripts/hub_clients_rss.py [--clients 1,10,50] [--journals 200]

One real OpenSSH sshd on 127.0.0.1 (testing/sshd.py) serves every client (each its own root). For each
client count, sej-hub (poll 0.2 s, 4 workers) copies everything, then runs idle for a few seconds, then
copies one new message in every journal; printed: VmRSS after each step, VmHWM (the peak) and threads.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import sej  # noqa: E402
from testing.sshd import Sshd  # noqa: E402


def status(pid: int) -> dict[str, str]:
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        out[key] = value.strip()
    return out


def wait(cond, limit: float, what: str) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + limit
    while not cond():
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {what}")
        time.sleep(0.2)


def measure(server: Sshd, base: Path, clients: int, journals: int) -> str:
    src, hub = base / f"src-{clients}", base / f"hub-{clients}"
    names = [f"ev.a.{j:03x}" for j in range(journals)]
    lines = [f'hub_root = "{hub}"', 'hub_name = "hub"', "poll_interval = 0.2", "workers = 4"]
    for c in range(clients):
        root = src / f"c{c:02d}"
        for n in names:
            with sej.Writer(str(root / n), segment_size=1 << 20) as w:
                w.append_many([b"x" * 100] * 10)
        lines += ["", "[[client]]", f'client_id = "c{c:02d}"', 'host = "127.0.0.1"', f"port = {server.port}",
                  f'user = "{server.user}"', f'identity_file = "{server.identity}"',
                  f'known_hosts = "{server.known_hosts}"', f'remote_root = "{root}"']  # fmt: skip
    config = base / f"hub-{clients}.toml"
    config.write_text("\n".join(lines) + "\n")
    proc = subprocess.Popen([sys.executable, "-c", "from sej.apps.hub import main; main()", "--config", str(config)],
                            env=dict(os.environ, PYTHONPATH=str(ROOT)), stderr=subprocess.DEVNULL)  # fmt: skip
    try:

        def copied(count: int) -> bool:
            return all(sej.next_offset(str(hub / f"c{c:02d}.{n}")) >= count if (hub / f"c{c:02d}.{n}" / "jnl").is_dir()
                       else False for c in range(clients) for n in names)  # fmt: skip

        t = time.monotonic()
        wait(lambda: copied(10), 600, "the first copy")
        first = time.monotonic() - t
        rss_copied = status(proc.pid)["VmRSS"]
        time.sleep(5)
        rss_idle = status(proc.pid)["VmRSS"]
        for c in range(clients):
            for n in names:
                with sej.Writer(str(src / f"c{c:02d}" / n), segment_size=1 << 20) as w:
                    w.append(b"y" * 100)
        wait(lambda: copied(11), 600, "the second copy")
        s = status(proc.pid)
        return (f"{clients} clients x {journals} journals: first copy {first:.1f} s; VmRSS after it {rss_copied}, "
                f"idle {rss_idle}, after one message in every journal {s['VmRSS']}; VmHWM {s['VmHWM']}; "
                f"threads {s['Threads']}")  # fmt: skip
    finally:
        proc.terminate()
        proc.wait(60)
        shutil.rmtree(src, ignore_errors=True)
        shutil.rmtree(hub, ignore_errors=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--clients", default="1,10,50", help="client counts, comma-separated")
    p.add_argument("--journals", type=int, default=200, help="journals per client (at most 1024)")
    a = p.parse_args()
    base = Path(tempfile.mkdtemp(prefix="sej-rss-"))
    try:
        with Sshd() as server:
            for clients in (int(c) for c in a.clients.split(",")):
                print(measure(server, base, clients, a.journals), flush=True)
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
