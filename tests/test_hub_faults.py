"""Faults at a distance (issue 39, section 4): a real sej-hub reaches a real sshd through testing/wan.py's WAN
(+50 ms, 200 Mbit/s); the link is blackholed (bytes held, nothing closed) while a producer appends. SSH keepalives
find the partition within 15 s (/health 503 naming the client, sej_hub_connected 0, `sej hub status`), and once
the link heals every message is at the hub within 10 s, byte-identical, none lost or repeated. Both transports.
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
from pathlib import Path

import pytest

import sej
from testing.sshd import Sshd
from testing.timing import scaled
from testing.wan import Wan

from .conftest import popen_python
from .test_hub_copy import assert_identical
from .test_hub_daemon import HubProcess, hub_script, write_config
from .test_hub_observe import eventually, health, metric, metrics_address, scrape, sej_status
from .test_hub_serve import SERVE

PARTITION = 40.0
"""Seconds the link is blackholed (the issue's scenario)."""

PRODUCER = r"""
import sys, threading, time, sej
root = sys.argv[1]
stop = threading.Event()
threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
i = 0
with sej.ShardedWriter(root, "p", shard_bit=2, segment_size=16384, durability="flush") as w:
    print("writing", flush=True)
    while not stop.is_set() and i < 1_000_000:
        w.append(b"event %d " % i + b"x" * (i % 61), key=b"k%d" % (i % 40))
        i += 1
        time.sleep(0.002)
print(i, flush=True)
"""


def through(wan: Wan, server: Sshd, tmp_path: Path) -> str:
    """A known_hosts naming the WAN proxy's port with the sshd's host key."""
    path = tmp_path / "known_hosts_wan"
    path.write_text(f"[127.0.0.1]:{wan.port} {server.host_key}\n")
    return str(path)


def assert_exactly_once(src: Path, hub: Path, written: int) -> None:
    """Every journal byte-identical, and the hub's offsets 0..n-1 with no gap and no duplicate."""
    assert_identical(str(src), str(hub))
    total = 0
    for d in sorted(os.listdir(hub)):
        if not d.startswith("c1."):
            continue
        with sej.Scanner(str(hub / d), 0, timeout=0) as s:
            offsets = [m.offset for m in s]
        assert offsets == list(range(len(offsets))), d
        total += len(offsets)
    assert total == written, (total, written)


@pytest.mark.parametrize("transport", ["sftp", "serve"])
def test_a_silent_partition_is_found_within_15s_and_caught_up_within_10s_of_healing(
    sshd: Sshd, tmp_path: Path, transport: str
) -> None:
    src, hub = tmp_path / "src", tmp_path / "hub"
    src.mkdir()
    with Wan(sshd.port, rtt=0.050, mbit=200) as wan:
        client = {"client_id": "c1", "host": "127.0.0.1", "port": wan.port, "user": sshd.user,
                  "identity_file": str(sshd.identity), "known_hosts": through(wan, sshd, tmp_path),
                  "remote_root": str(src), "transport": transport, "serve_command": SERVE}  # fmt: skip
        config = write_config(tmp_path / "hub.toml", hub, [client], poll_interval=0.2, backoff_max=2.0,
                              metrics_listen="127.0.0.1:0", log_format="json")  # fmt: skip
        producer = popen_python(PRODUCER, str(src), stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        proc = HubProcess([hub_script(), "--config", str(config)])
        try:
            assert producer.stdout is not None and producer.stdout.readline().strip() == "writing"
            address = metrics_address(proc)
            eventually(lambda: len([d for d in os.listdir(hub) if d.startswith("c1.")]) == 4 if hub.is_dir() else 0,
                       30, "the first copies")  # fmt: skip
            eventually(lambda: metric(scrape(address), "sej_hub_connected", client="c1") == 1, 30, "connected")
            assert health(address)[0] == 200

            wan.blackhole()
            cut = time.monotonic()
            code, body = eventually(lambda: (h := health(address))[0] == 503 and h, 30, "/health to turn 503")
            seen = time.monotonic() - cut
            print(f"{transport}: the partition was seen after {seen:.1f}s")
            assert seen <= scaled(15), seen
            assert [d["client"] for d in body["disconnected"]] == ["c1"], body
            assert metric(scrape(address), "sej_hub_connected", client="c1") == 0
            rec = eventually(lambda: json.loads(sej_status(hub, "--json").stdout)["clients"][0], 10, "a record")
            assert rec["connected"] is False and rec["lost"] is not None, rec

            # The rest of the partition: the producer keeps appending (a duration of the scenario, not a sync).
            time.sleep(max(0.0, PARTITION - (time.monotonic() - cut)))
            out, _ = producer.communicate(timeout=scaled(30))  # its stdin closed: it stops
            written = int(out.split()[-1])
            wan.heal()
            healed = time.monotonic()

            def caught_up() -> bool:
                return all(sej.next_offset(str(hub / f"c1.{j}")) == sej.next_offset(str(src / j))
                           for j in os.listdir(src) if (src / j / "jnl").is_dir())  # fmt: skip

            eventually(caught_up, 60, "every message at the hub after the heal")
            behind = time.monotonic() - healed
            print(f"{transport}: {written} messages; all at the hub {behind:.1f}s after the heal")
            assert behind <= scaled(10), behind
            eventually(lambda: health(address)[0] == 200, 30, "/health to be 200 again")
            assert metric(scrape(address), "sej_hub_connected", client="c1") == 1
        finally:
            producer.kill()
            elapsed = proc.stop(scaled(20))
        assert elapsed is not None, proc.stderr
    assert_exactly_once(src, hub, written)
    assert "Traceback" not in proc.stderr, proc.stderr


WAN_COPIER = r"""
import sys
from sej.hub import copy_all
from sej.hub.location import Origin, open_sources
port, user, identity, known, src, hub, transport, serve = sys.argv[1:9]
origin = Origin(src, "127.0.0.1", int(port), user, identity, known, transport=transport, serve_command=serve)
with open_sources(origin) as sources:
    print("connected", flush=True)
    for _ in range(100000):
        copy_all(sources, hub, "c1", "hub", workers=2)
"""


def test_hub_killed_and_link_reset_at_random_moments_over_the_wan(sshd: Sshd, tmp_path: Path, keep_on_failure) -> None:
    """The kill soak of test_hub_ssh over the WAN (+50 ms, 200 Mbit/s), sftp and serve in turn: even rounds SIGKILL
    the copying process, odd rounds reset the link under a copy in this process. Then one copy: byte-identical,
    exactly once. CI: 6 rounds within 60 s (scaled); SEJ_SOAK_ROUNDS=N: N rounds."""

    from sej.hub import copy_all
    from sej.hub.location import Origin, open_sources

    from .conftest import soak_rounds
    from .test_hub_copy import assert_prefix_and_no_commit_ahead, soak_start, start_producer, stop_producer

    seed, rng, src, hub = soak_start(tmp_path, keep_on_failure)
    soak = soak_rounds()
    rounds = soak or 6
    producer = start_producer(src, seed)
    kills = resets = 0
    with Wan(sshd.port, rtt=0.050, mbit=200) as wan:
        known = through(wan, sshd, tmp_path)

        def origin(transport: str) -> Origin:
            return Origin(src, "127.0.0.1", wan.port, sshd.user, str(sshd.identity), known, transport=transport,
                          serve_command=SERVE)  # fmt: skip

        try:
            deadline = float("inf") if soak else time.monotonic() + scaled(60)
            for round_ in range(rounds):
                if time.monotonic() > deadline:
                    break
                transport = ("sftp", "serve")[round_ // 2 % 2]
                if round_ % 2 == 0:  # the hub process dies
                    copier = popen_python(WAN_COPIER, str(wan.port), sshd.user, str(sshd.identity), known, src, hub,
                                          transport, SERVE, stdout=subprocess.PIPE)  # fmt: skip
                    assert copier.stdout is not None
                    assert copier.stdout.readline().strip() == "connected"
                    time.sleep(rng.uniform(0.0, 0.5))  # a random moment of the copy, not a sync
                    copier.kill()
                    assert copier.wait(scaled(10)) == -9
                    kills += 1
                else:  # the link resets under a copy in this process
                    errors: list[object] = []
                    with open_sources(origin(transport)) as sources:

                        def run(sources=sources, errors=errors) -> None:  # type: ignore[no-untyped-def]
                            try:
                                for _ in range(1000):
                                    out = copy_all(sources, hub, "c1", "hub", workers=2)
                                    errors.extend(o.error for o in out if o.error is not None)
                                    if errors:
                                        return
                            except sej.SejError as e:  # the connection died between journals
                                errors.append(e)
                            except OSError as e:  # or under a call: paramiko's own error
                                errors.append(e)

                        t = threading.Thread(target=run)
                        t.start()
                        time.sleep(rng.uniform(0.05, 0.5))  # a random moment of the copy, not a sync
                        wan.reset()
                        t.join(scaled(30))
                        assert not t.is_alive()
                    assert errors, "the reset is noticed"
                    resets += 1
                assert_prefix_and_no_commit_ahead(src, hub)
            written = stop_producer(producer)
        finally:
            producer.kill()
        with open_sources(origin("serve")) as sources:
            out = copy_all(sources, hub, "c1", "hub", workers=4)
    assert all(o.error is None for o in out), [o.error for o in out]
    assert kills >= 2 and resets >= 2, (kills, resets)
    assert_exactly_once(Path(src), Path(hub), written)
    print(f"seed {seed}: {kills} hub kills, {resets} link resets over the WAN, {written} messages")
