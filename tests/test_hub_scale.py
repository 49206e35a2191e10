"""The hub at scale over a real sshd: `sej copy` SIGKILLed at random moments over many journals while a
producer writes to all of them ends byte-identical, exactly once."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time

import sej
from sej.offset import read_offset_file
from testing.timing import scaled

from .conftest import REPO, popen_python, soak_rounds
from .test_hub_copy import assert_identical, assert_prefix

# A producer over 2^bit shards (so 1,024 journals at bit 10), writing until its stdin closes.
WIDE_PRODUCER = r"""
import random, sys, threading, time, sej
from sej.fsutil import allow_open_files
root, bit, seed = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
allow_open_files(4 * (1 << bit) + 64)
rng = random.Random(seed)
stop = threading.Event()
threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
i = 0
with sej.ShardedWriter(root, "p", shard_bit=bit, segment_size=1500, durability="flush") as w:
    for k in range(1 << bit):  # every journal exists from the start
        w.append(b"first %d" % k, key=b"%d" % k)
        i += 1
    print("writing", flush=True)
    while not stop.is_set():
        w.append(b"v%d-" % i + rng.randbytes(rng.randrange(0, 80)), key=b"k%d" % rng.randrange(1 << 20))
        i += 1
        if i % 20 == 0:
            time.sleep(0.002)
print(i, flush=True)
"""


def journals_bit() -> int:
    """SEJ_SOAK_JOURNALS=N: 2^bit >= N journals (bit at most 10, the most shards a root has); CI: 64."""
    n = int(os.environ.get("SEJ_SOAK_JOURNALS", "64"))
    return max(1, min(10, (n - 1).bit_length()))


def sej_copy(sshd, src: str, hub: str) -> subprocess.Popen[str]:  # type: ignore[no-untyped-def]
    url = f"ssh://{sshd.user}@127.0.0.1:{sshd.port}{src}"
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "sej.apps.cli",
            "copy",
            url,
            hub,
            "--client-id",
            "c1",
            "--workers",
            "8",
            "--identity",
            str(sshd.identity),
            "--known-hosts",
            str(sshd.known_hosts),
        ],  # fmt: skip
        env=dict(os.environ, PYTHONPATH=str(REPO)),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )


def check_round(src: str, hub: str) -> None:
    """The hub's copy is a prefix of the source, and no offset on the source runs ahead of it."""
    assert_prefix(src, hub)
    for d in os.listdir(hub):
        committed = read_offset_file(os.path.join(src, d[3:], "ofs", "hub.ofs"))
        if committed is not None:
            assert committed <= sej.next_offset(os.path.join(hub, d)), d


def test_sej_copy_killed_at_random_moments_over_many_journals_while_they_grow(sshd, tmp_path, keep_on_failure) -> None:
    """CI: 64 journals, up to 4 kill rounds in a time budget. SEJ_SOAK_ROUNDS=N, SEJ_SOAK_JOURNALS=1000:
    N rounds over 1,024 journals, however long they take (scripts/soak.sh scale)."""
    seed = int(os.environ.get("SEJ_HUB_SEED", random.randrange(1 << 30)))
    rng = random.Random(seed)
    bit = journals_bit()
    src, hub = str(tmp_path / "src"), str(tmp_path / "hub")
    os.makedirs(src)
    keep_on_failure(src)
    keep_on_failure(hub)
    soak = soak_rounds()
    t0 = time.monotonic()
    producer = popen_python(WIDE_PRODUCER, src, str(bit), str(seed), stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    kills = passes = 0
    try:
        assert producer.stdout is not None and producer.stdout.readline().strip() == "writing"
        # One whole pass first: its duration is the span the kills are spread over, whatever the machine's speed.
        started = time.monotonic()
        first = sej_copy(sshd, src, hub)
        _, err = first.communicate(timeout=scaled(600))
        assert first.returncode == 0, err
        span = time.monotonic() - started
        check_round(src, hub)
        deadline = float("inf") if soak else time.monotonic() + scaled(60)
        want = soak or 4
        for _ in range(3 * want):  # until `want` kills: a pass shorter than its draw ends by itself
            if kills == want or time.monotonic() > deadline:
                break
            passes += 1
            copier = sej_copy(sshd, src, hub)
            started = time.monotonic()
            try:
                copier.wait(rng.uniform(0.0, span))  # a random moment of a pass as long as the last whole one
            except subprocess.TimeoutExpired:
                copier.send_signal(signal.SIGKILL)
                kills += 1
            else:
                span = time.monotonic() - started
            copier.communicate(timeout=scaled(30))
            assert copier.returncode in (0, -signal.SIGKILL), copier.stderr
            check_round(src, hub)
        assert producer.stdin is not None
        producer.stdin.close()
        written = int(producer.stdout.readline())
        assert producer.wait(scaled(60)) == 0
    finally:
        producer.kill()
    last = sej_copy(sshd, src, hub)
    _, err = last.communicate(timeout=scaled(600))
    assert last.returncode == 0, err
    assert_identical(src, hub)
    total = 0
    for d in sorted(os.listdir(hub)):
        with sej.Scanner(os.path.join(hub, d), 0, timeout=0) as s:
            offsets = [m.offset for m in s]
        assert offsets == list(range(len(offsets))), f"{d}: a gap or a duplicate"
        assert read_offset_file(os.path.join(src, d[3:], "ofs", "hub.ofs")) == len(offsets), d
        total += len(offsets)
    assert len(os.listdir(hub)) == 1 << bit
    assert total == written, (total, written)
    assert kills >= 1 if soak is None else kills == soak, kills
    print(f"seed {seed}: {1 << bit} journals, {kills} kills in {passes} passes, {written} messages, last whole pass "
          f"{span:.1f} s, "
          f"{time.monotonic() - t0:.1f} s")  # fmt: skip
