"""The hub's copy engine on this machine: exactly once, always a prefix, faults, hostile names."""

from __future__ import annotations

import json
import logging
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import sej
from sej.fsutil import syncfs_reports_errors
from sej.hub import CopyError, LocalSource, Source, copy_all, copy_journal, destination_name
from sej.hub.copy_state import CopyState, state_file
from sej.hub.names import check_journal_name, check_segment_name
from sej.layout import segment_name
from sej.offset import read_offset_file
from sej.shard import is_shard_name
from testing.timing import scaled

from .conftest import REPO, popen_python, run_python, run_with_stderr_on_a_terminal, soak_rounds


def produce(root: str, n: int, segment_size: int = 3000, seed: int = 0) -> None:
    rng = random.Random(seed)
    with sej.ShardedWriter(root, "p", shard_bit=2, segment_size=segment_size) as w:
        for i in range(n):
            w.append(b"v%d-" % i + rng.randbytes(rng.randrange(0, 60)), key=b"k%d" % rng.randrange(50))


def journal_files(d: str) -> dict[str, bytes]:
    jdir = os.path.join(d, "jnl")
    return {f: Path(jdir, f).read_bytes() for f in sorted(os.listdir(jdir)) if f.endswith(".jnl")}


def assert_identical(src: str, hub: str, client: str = "c1") -> None:
    journals = sorted(d for d in os.listdir(src) if os.path.isdir(os.path.join(src, d, "jnl")) and is_shard_name(d))
    assert journals
    for j in journals:
        assert journal_files(os.path.join(src, j)) == journal_files(os.path.join(hub, f"{client}.{j}")), j


def assert_prefix(src: str, hub: str, client: str = "c1") -> None:
    """Every hub segment is a byte prefix of the source segment of the same name; no gaps."""
    for d in os.listdir(hub):
        if not d.startswith(client + "."):
            continue
        # A copy killed inside os.makedirs(<journal>/jnl) leaves the journal's directory alone: an empty journal
        # (sej.list_segments and next_offset read it so, and the next copy makes jnl/), a prefix of any.
        mine = journal_files(os.path.join(hub, d)) if os.path.isdir(os.path.join(hub, d, "jnl")) else {}
        theirs = journal_files(os.path.join(src, d[len(client) + 1 :]))
        names = list(mine)
        assert names == list(theirs)[: len(names)], (d, names)
        for i, name in enumerate(names):
            if i < len(names) - 1:
                assert mine[name] == theirs[name], (d, name)
            else:
                assert theirs[name].startswith(mine[name]), (d, name)


def assert_prefix_and_no_commit_ahead(src: str, hub: str, client: str = "c1") -> None:
    """After an interruption: the hub is a prefix of the source, and no hub offset committed on the source leads
    the hub's copy."""
    assert_prefix(src, hub, client)
    for d in os.listdir(hub):
        committed = read_offset_file(os.path.join(src, d[len(client) + 1 :], "ofs", "hub.ofs"))
        if committed is not None:
            assert committed <= sej.next_offset(os.path.join(hub, d))


def test_full_copy_is_byte_identical_and_commits_the_hub_offset(tmp_path) -> None:
    src, hub = str(tmp_path / "src"), str(tmp_path / "hub")
    produce(src, 2000)
    out = copy_all(lambda: LocalSource(src), hub, "c1", "hub")
    assert all(o.error is None for o in out) and len(out) == 4
    assert_identical(src, hub)
    for o in out:
        assert o.result is not None
        assert o.result.messages == sej.next_offset(os.path.join(src, o.journal)) == o.result.next_offset
        assert read_offset_file(os.path.join(src, o.journal, "ofs", "hub.ofs")) == o.result.next_offset
        with sej.Scanner(o.result.destination, 0, timeout=0) as s:
            assert sum(1 for _ in s) == o.result.messages
    again = copy_all(lambda: LocalSource(src), hub, "c1", "hub")
    assert [o.result.messages for o in again if o.result] == [0, 0, 0, 0]


def test_single_journal_source_and_a_retention_trimmed_source(tmp_path) -> None:
    src, hub = str(tmp_path / "src"), str(tmp_path / "hub")
    with sej.Writer(os.path.join(src, "solo"), segment_size=500) as w:
        for i in range(200):
            w.append(b"m%d" % i)
    segs = sej.list_segments(os.path.join(src, "solo"))
    for s in segs[:3]:
        os.remove(s.path)  # retention ran before the hub's first copy
    r = copy_journal(LocalSource(os.path.join(src, "solo")), "solo", hub, "c1", "hub")
    assert r.next_offset == 200 and r.messages == 200 - segs[3].first_offset
    assert journal_files(os.path.join(src, "solo")) == journal_files(os.path.join(hub, "c1.solo"))
    assert sej.first_offset(os.path.join(hub, "c1.solo")) == segs[3].first_offset


def test_a_message_bigger_than_one_read(tmp_path) -> None:
    src, hub = str(tmp_path / "src"), str(tmp_path / "hub")
    with sej.Writer(os.path.join(src, "big")) as w:
        w.append(b"a")
        w.append(os.urandom(50_000))
        w.append(b"b")
    r = copy_journal(LocalSource(src), "big", hub, "c1", "hub", chunk=1000)
    assert r.messages == 3
    assert_identical(src, hub)


PRODUCER = r"""
import os, random, sys, time, sej
root, n, seed = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
pace = sys.argv[4] if len(sys.argv) > 4 else None  # a directory: see PacedProducer
bursts = 8 if pace else 1
parent, deadline = os.getppid(), time.monotonic() + (float(sys.argv[5]) if pace else 0)
rng = random.Random(seed)
started = 0
with sej.ShardedWriter(root, "p", shard_bit=2, segment_size=2000, durability="flush") as w:
    for i in range(n):
        burst = i * bursts // n
        if burst > started:  # burst k starts after k copy passes
            while not os.path.exists(os.path.join(pace, str(burst))):
                if os.getppid() != parent or time.monotonic() > deadline:
                    sys.exit("the test went away")
                time.sleep(0.005)
            started = burst
        w.append(b"v%d-" % i + rng.randbytes(rng.randrange(0, 80)), key=b"k%d" % rng.randrange(40))
        if i % 50 == 0:
            time.sleep(0.005)
"""


class PacedProducer:
    """PRODUCER in a child process, writing `n` messages in 8 bursts: burst k starts once `passed(k)` was called.

    So copy passes overlap the writing however fast or slow the machine is: a test that copies while the
    producer runs and calls passed() after each pass gets at least 7 passes before the producer is done.
    """

    def __init__(self, root: str, n: int, seed: int, pace: str) -> None:
        os.makedirs(pace)
        self.pace = pace
        self.proc = popen_python(PRODUCER, root, str(n), str(seed), pace, str(scaled(600)))

    def passed(self, k: int) -> None:
        open(os.path.join(self.pace, str(k)), "w").close()


def test_incremental_copies_while_the_producer_writes_and_rolls(tmp_path) -> None:
    src, hub = str(tmp_path / "src"), str(tmp_path / "hub")
    os.makedirs(src)
    paced = PacedProducer(src, 4000, 1, str(tmp_path / "pace"))
    producer = paced.proc
    passes = 0
    try:
        deadline = time.monotonic() + scaled(60)
        while producer.poll() is None and time.monotonic() < deadline:
            out = copy_all(lambda: LocalSource(src), hub, "c1", "hub")
            assert all(o.error is None for o in out), [o.error for o in out]
            assert_prefix(src, hub)
            passes += 1
            paced.passed(passes)
        assert producer.wait(scaled(30)) == 0
    finally:
        producer.kill()
    copy_all(lambda: LocalSource(src), hub, "c1", "hub")
    assert passes > 3
    assert_identical(src, hub)
    assert sum(sej.next_offset(os.path.join(hub, d)) for d in os.listdir(hub)) == 4000
    assert max(len(sej.list_segments(os.path.join(hub, d))) for d in os.listdir(hub)) > 10


# A producer that writes until its stdin is closed (at most n messages), so that every kill round of a
# long run happens while it writes; it prints how many messages it wrote.
PRODUCER_UNTIL_EOF = r"""
import random, sys, threading, time, sej
root, n, seed = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
rng = random.Random(seed)
stop = threading.Event()
threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
i = 0
with sej.ShardedWriter(root, "p", shard_bit=2, segment_size=2000, durability="flush") as w:
    print("writing", flush=True)
    while i < n and not stop.is_set():
        w.append(b"v%d-" % i + rng.randbytes(rng.randrange(0, 80)), key=b"k%d" % rng.randrange(40))
        i += 1
        if i % 3 == 0:
            time.sleep(0.005)
print(i, flush=True)
"""


def soak_start(tmp_path: Path, keep_on_failure: Callable[[str], None]) -> tuple[int, random.Random, str, str]:
    """A kill soak's seed (SEJ_HUB_SEED, else random; printed), its rng, and the producer and hub roots, both kept
    if the test fails."""
    seed = int(os.environ.get("SEJ_HUB_SEED", random.randrange(1 << 30)))
    print("seed", seed)
    src, hub = str(tmp_path / "src"), str(tmp_path / "hub")
    os.makedirs(src)
    keep_on_failure(src)
    keep_on_failure(hub)
    return seed, random.Random(seed), src, hub


def start_producer(src: str, seed: int, n: int = 1_000_000) -> subprocess.Popen[str]:
    p = popen_python(PRODUCER_UNTIL_EOF, src, str(n), str(seed), stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert p.stdout is not None and p.stdout.readline().strip() == "writing"
    return p


def stop_producer(p: subprocess.Popen[str]) -> int:
    """Close its stdin; return how many messages it wrote (it must still have been writing)."""
    out, _ = p.communicate(timeout=scaled(60))
    assert p.returncode == 0, p.returncode
    return int(out.split()[-1])


COPIER = r"""
import sys, time
from sej.hub import LocalSource, copy_all
src, hub, chunk = sys.argv[1], sys.argv[2], int(sys.argv[3])
import sej.hub.copy as c
c.CHUNK = chunk
print("start", flush=True)
for _ in range(100000):
    copy_all(lambda: LocalSource(src), hub, "c1", "hub", workers=2)
"""


def test_copier_killed_at_random_moments_never_gaps_or_duplicates(tmp_path, keep_on_failure) -> None:
    """CI: up to 25 rounds within 45 s; SEJ_SOAK_ROUNDS=N: N rounds, however long they take."""
    seed, rng, src, hub = soak_start(tmp_path, keep_on_failure)
    soak = soak_rounds()
    t0 = time.monotonic()
    producer = start_producer(src, seed)  # writes through every round, until stopped
    rounds = 0
    try:
        deadline = float("inf") if soak else time.monotonic() + scaled(45)
        while rounds < (soak or 25) and time.monotonic() < deadline:
            copier = popen_python(COPIER, src, hub, str(rng.choice([97, 1000, 1 << 16])), stdout=subprocess.PIPE)
            assert copier.stdout is not None
            copier.stdout.readline()
            time.sleep(rng.uniform(0.0, 0.25))
            copier.send_signal(signal.SIGKILL)
            assert copier.wait(scaled(10)) == -signal.SIGKILL
            rounds += 1
            assert_prefix(src, hub)
            for d in os.listdir(hub):  # the offset on the source never runs ahead of the hub's durable copy
                committed = read_offset_file(os.path.join(src, d[3:], "ofs", "hub.ofs"))
                if committed is not None:
                    have = sej.next_offset(os.path.join(hub, d))  # read only: a torn tail is not counted
                    assert committed <= have, (d, committed, have)
        written = stop_producer(producer)
    finally:
        producer.kill()
    out = copy_all(lambda: LocalSource(src), hub, "c1", "hub")
    assert all(o.error is None for o in out), [o.error for o in out]
    assert rounds >= 10 and (not soak or rounds == soak)
    assert_identical(src, hub)
    total = 0
    for o in out:
        assert o.result is not None
        with sej.Scanner(o.result.destination, 0, timeout=0) as s:
            offsets = [m.offset for m in s]
        assert offsets == list(range(len(offsets))) and len(offsets) == o.result.next_offset
        total += len(offsets)
    assert total == written, (total, written)
    print(f"seed {seed}: {rounds} kill rounds, {written} messages, {time.monotonic() - t0:.1f} s")


# -- sources that disagree with the hub ------------------------------------------------------------


@pytest.fixture
def copied(tmp_path) -> tuple[str, str]:
    src, hub = str(tmp_path / "src"), str(tmp_path / "hub")
    produce(src, 600)
    copy_all(lambda: LocalSource(src), hub, "c1", "hub")
    return src, hub


def last_segment(journal: str) -> str:
    return sej.list_segments(journal)[-1].path


def append_checksummed(journal: str, seg: str, data: bytes) -> None:
    """Append `data` to a segment and record its checksums, as a writer does (sej.checksum)."""
    from sej.checksum import BLOCK, Hasher
    from sej.layout import sum_path

    size = os.path.getsize(seg)
    start = size // BLOCK * BLOCK
    records = Hasher(size, Path(seg).read_bytes()[start:size]).update(data)
    with open(seg, "ab") as f:
        f.write(data)
    with open(sum_path(journal, int(os.path.basename(seg)[:16], 16)), "ab") as f:
        f.write(records)


def snapshot(hub: str) -> dict[str, dict[str, bytes]]:
    return {d: journal_files(os.path.join(hub, d)) for d in sorted(os.listdir(hub))}


@pytest.mark.parametrize("damage", ["shrank", "rewritten", "deleted", "corrupt-new-frame"])
def test_a_source_that_disagrees_stops_that_journal_only(copied: tuple[str, str], damage: str) -> None:
    src, hub = copied
    victim = os.path.join(src, "p.2.001")
    copied_seg = last_segment(os.path.join(hub, "c1.p.2.001"))  # the hub's last segment, as it has it
    produce(src, 200, seed=5)  # more data for everyone
    seg = last_segment(victim)
    before = snapshot(hub)
    if damage == "shrank":
        os.truncate(sej.list_segments(victim)[-2].path, 10)
        seg = sej.list_segments(victim)[-2].path
    elif damage == "rewritten":  # bytes the hub already holds change under it
        seg = os.path.join(victim, "jnl", os.path.basename(copied_seg))
        data = bytearray(Path(seg).read_bytes())
        data[os.path.getsize(copied_seg) - 10] ^= 0xFF
        Path(seg).write_bytes(bytes(data))
    elif damage == "deleted":
        for s in sej.list_segments(victim):
            os.remove(s.path)
        with sej.Writer(victim, start_offset=10_000) as w:
            w.append(b"new history")
        seg = last_segment(victim)
    else:  # a producer bug: garbage written as a frame, checksummed as written (so the hub copies up to it)
        append_checksummed(victim, seg, b"\x00" * 8 + b"garbage-garbage-garbage-garbage")
    out = {o.journal: o for o in copy_all(lambda: LocalSource(src), hub, "c1", "hub")}
    err = out["p.2.001"].error
    assert isinstance(err, CopyError), err
    assert "client c1" in str(err) and "p.2.001" in str(err)
    if damage != "deleted":
        assert os.path.basename(seg) in str(err)
    assert re.search(r"byte|bytes|offset", str(err))
    assert all(out[j].error is None for j in out if j != "p.2.001"), "the other journals go on"
    after = snapshot(hub)
    mine = "c1.p.2.001"
    if damage == "corrupt-new-frame":
        # Everything before the corrupt frame was copied; nothing after it.
        assert_prefix(src, hub)
        assert after[mine] != before[mine]
    else:
        assert after[mine] == before[mine], "nothing already copied is touched"


# -- hostile names -------------------------------------------------------------------------------


HOSTILE = ["../x", "a/b", ".", "..", "x" * 300, "a\0b", "/etc", "p.2.001/../../x", "", "a b", "ok\n"]


@pytest.mark.parametrize("name", HOSTILE)
def test_hostile_names_are_refused(name: str) -> None:
    with pytest.raises(sej.InvalidArgumentError):
        check_journal_name(name)
    with pytest.raises(sej.InvalidArgumentError):
        destination_name("c1", name)
    with pytest.raises(sej.InvalidArgumentError):
        check_segment_name(name)
    with pytest.raises(sej.InvalidArgumentError):
        destination_name(name, "p.2.001")  # as a client id


class HostileSource(LocalSource):
    """A producer that lies about its names (what a compromised host could send over SFTP)."""

    def journals(self) -> list[str]:
        return HOSTILE + super().journals()


def test_a_hostile_source_cannot_write_outside_the_client_directories(tmp_path) -> None:
    src, hub = str(tmp_path / "src"), str(tmp_path / "hub")
    produce(src, 100)
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*") if "hub" not in p.parts)
    out = copy_all(lambda: HostileSource(src), hub, "c1", "hub")
    bad = [o for o in out if o.error is not None]
    assert len(bad) == len(HOSTILE)
    assert all(isinstance(o.error, sej.InvalidArgumentError) for o in bad)
    assert sorted(os.listdir(hub)) == ["c1.p.2.000", "c1.p.2.001", "c1.p.2.002", "c1.p.2.003"]
    after = sorted(
        p.relative_to(tmp_path) for p in tmp_path.rglob("*") if "hub" not in p.parts and "ofs" not in p.parts
    )
    assert [p for p in after if p not in before] == []


# -- ordering: the offset on the source moves only after the hub's fsync --------------------------


@pytest.mark.skipif(shutil.which("strace") is None and not os.environ.get("CI"), reason="needs strace")
def needs_syncfs(path: Path) -> None:
    """Skip unless the hub's passes over `path` make copies durable with syncfs (Linux 5.8+, a disk file system)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        if not syncfs_reports_errors(fd):
            pytest.skip(f"{path}: no syncfs that reports write-back errors here")
    finally:
        os.close(fd)


def strace_events(log: Path) -> list[tuple[str, str]]:
    """(call, path) of the traced opens, writes, fsyncs, syncfs and renames, in order, from `strace -f -o`."""
    paths: dict[int, str] = {}
    events: list[tuple[str, str]] = []

    def at(dir_fd: str, name: str) -> str:  # a path relative to AT_FDCWD or to a directory descriptor
        return name if dir_fd == "AT_FDCWD" or name.startswith("/") else f"{paths.get(int(dir_fd), '?')}/{name}"

    for line in log.read_text().splitlines():
        m = re.match(r"^\d+\s+(\w+)\((.*)\)\s+=\s+(-?\d+)", line)
        if not m:
            continue
        name, args, ret = m.group(1), m.group(2), int(m.group(3))
        if name == "openat":
            o = re.match(r'(AT_FDCWD|\d+), "([^"]*)"', args)
            if o and ret >= 0:
                paths[ret] = at(o.group(1), o.group(2))
                events.append(("openat", paths[ret]))
        elif name in ("renameat", "renameat2"):
            r = re.match(r'(AT_FDCWD|\d+), "[^"]*", (AT_FDCWD|\d+), "([^"]*)"', args)
            assert r, line
            events.append(("rename", at(r.group(2), r.group(3))))
        elif name == "rename":
            events.append(("rename", args.split('", "')[1].rstrip('"')))
        else:
            events.append((name, paths.get(int(args.split(",")[0]), "?")))
    return events


TRACED = "trace=openat,write,fsync,fdatasync,syncfs,rename,renameat,renameat2"


def traced_copy_all(log: Path, src: str, hub: str, calls: str) -> list[tuple[str, str]]:
    """strace_events of a copy_all from `src` into `hub` (one copy thread: no interleaved strace lines)."""
    code = (
        "import sys; from sej.hub import LocalSource, copy_all\n"
        "out = copy_all(lambda: LocalSource(sys.argv[1]), sys.argv[2], 'c1', 'hub', workers=1)\n"
        "assert all(o.error is None for o in out), out\n"
    )
    subprocess.run(
        ["strace", "-f", "-qq", "-o", str(log), "-e", calls, sys.executable, "-c", code, src, hub],
        check=True, env=dict(os.environ, PYTHONPATH=str(REPO)), capture_output=True, timeout=scaled(60),
    )  # fmt: skip
    return strace_events(log)


def test_the_source_offset_is_committed_only_after_the_fsync_of_the_copy(tmp_path) -> None:
    src, hub = str(tmp_path / "src"), str(tmp_path / "hub")
    produce(src, 300)
    log = tmp_path / "strace.log"
    code = (
        "import sys; from sej.hub import LocalSource, copy_journal\n"
        "import sej.hub.copy as c\n"
        "copy_journal(LocalSource(sys.argv[1]), 'p.2.000', sys.argv[2], 'c1', 'hub', chunk=700)\n"
    )
    env = dict(os.environ, PYTHONPATH=str(REPO))
    subprocess.run(
        ["strace", "-f", "-qq", "-o", str(log), "-e", "trace=openat,write,fsync,fdatasync,rename,renameat,renameat2",
         sys.executable, "-c", code, src, hub],
        check=True, env=env, capture_output=True, timeout=scaled(60),
    )  # fmt: skip
    events = strace_events(log)
    copy_writes = [i for i, (n, p) in enumerate(events) if n == "write" and "/hub/c1.p.2.000/jnl/" in p]
    commits = [i for i, (n, p) in enumerate(events) if n == "rename" and p.endswith("/ofs/hub.ofs")]
    assert copy_writes and commits
    for c in commits:
        written_before = [i for i in copy_writes if i < c]
        last_write = max(written_before)
        assert any(n in ("fsync", "fdatasync") and "/hub/c1.p.2.000/jnl/" in p for n, p in events[last_write:c]), (
            "the copied bytes were fsynced before the source offset moved"
        )
    assert read_offset_file(os.path.join(src, "p.2.000", "ofs", "hub.ofs")) == sej.next_offset(
        os.path.join(hub, "c1.p.2.000")
    )


def test_a_reopened_hub_journal_fsyncs_its_last_segment_before_it_creates_the_next(tmp_path) -> None:
    """A copy killed before its fsync leaves bytes that may be only in the page cache. A later copy that
    starts the next segment without writing into that one must still fsync it first: after a power cut, a
    hole below a later segment would never be repaired (copies resume in the last segment)."""
    src, hub = tmp_path / "src", str(tmp_path / "hub")
    with sej.Writer(src / "p.2.000", segment_size=1000) as w:
        for _ in range(12):
            w.append(b"x" * 100)
    segments = sej.list_segments(str(src / "p.2.000"))
    assert len(segments) == 2 and segments[1].first_offset > 0
    # The hub copies the first segment alone (as when the writer had not rolled yet), as a killed copy would.
    early = tmp_path / "early"
    shutil.copytree(src / "p.2.000", early / "p.2.000")
    for f in (early / "p.2.000" / "jnl").iterdir():
        if f.name != os.path.basename(segments[0].path):
            f.unlink()
    copy_journal(LocalSource(str(early)), "p.2.000", hub, "c1", "hub")
    assert [s.first_offset for s in sej.list_segments(os.path.join(hub, "c1.p.2.000"))] == [0]
    log = tmp_path / "strace.log"
    code = "import sys; from sej.hub import LocalSource, copy_journal\n" \
        "copy_journal(LocalSource(sys.argv[1]), 'p.2.000', sys.argv[2], 'c1', 'hub')\n"  # fmt: skip
    subprocess.run(
        ["strace", "-f", "-qq", "-o", str(log), "-e", "trace=openat,write,fsync,fdatasync,rename,renameat,renameat2",
         sys.executable, "-c", code, str(src), hub],
        check=True, env=dict(os.environ, PYTHONPATH=str(REPO)), capture_output=True, timeout=scaled(60),
    )  # fmt: skip
    first, second = (f"/c1.p.2.000/jnl/{segment_name(s.first_offset)}" for s in segments)
    events = strace_events(log)
    assert not any(n == "write" and p.endswith(first) for n, p in events), "nothing new in the first segment"
    created = next(i for i, (n, p) in enumerate(events) if n == "openat" and p.endswith(second))
    fsynced = [i for i, (n, p) in enumerate(events) if n in ("fsync", "fdatasync") and p.endswith(first)]
    assert fsynced and fsynced[0] < created, "the reopened segment was fsynced before the next one was created"
    assert_identical(str(src), hub)


def test_a_pass_over_many_journals_makes_their_copies_durable_with_one_syncfs_before_any_commit(tmp_path) -> None:
    """1,000 changed journals cost 1,000 fsyncs (0.15-0.3 s); one syncfs of the hub's file system, 0.02 s."""
    needs_syncfs(tmp_path)
    src, hub = str(tmp_path / "src"), str(tmp_path / "hub")
    with sej.ShardedWriter(src, "p", shard_bit=5) as w:  # 32 journals, one segment each
        for i in range(300):
            w.append(b"v%d" % i, key=b"k%d" % i)
    events = traced_copy_all(tmp_path / "strace.log", src, hub, TRACED)
    syncs = [i for i, (n, _p) in enumerate(events) if n == "syncfs"]
    writes = [i for i, (n, p) in enumerate(events) if n == "write" and "/hub/c1.p.5." in p and "/jnl/" in p]
    commits = [i for i, (n, p) in enumerate(events) if n == "rename" and p.endswith("/ofs/hub.ofs")]
    assert len(syncs) == 1 and len(writes) >= 32 and len(commits) == 32, (len(syncs), len(writes), len(commits))
    assert max(writes) < syncs[0] < min(commits), "every copy written, then one syncfs, then the commits"
    per_file = [p for n, p in events if n in ("fsync", "fdatasync") and "/hub/" in p and p.endswith(".jnl")]
    assert per_file == [], f"hub segments fsynced one by one: {per_file[:3]}"
    assert_identical(src, hub)
    for j in os.listdir(src):
        assert read_offset_file(os.path.join(src, j, "ofs", "hub.ofs")) == sej.next_offset(os.path.join(hub, f"c1.{j}"))


def test_a_pass_copies_many_journals_of_several_segments_in_layers_each_segment_durable_before_the_next(
    tmp_path,
) -> None:
    """A hub segment must be durable before the next one exists (recovery looks at the last one only). In a
    pass over many journals that is one syncfs per layer of segments, not an fsync of each: every segment is
    written, a syncfs follows, and only then is the next segment of its journal created."""
    needs_syncfs(tmp_path)
    src, hub = str(tmp_path / "src"), str(tmp_path / "hub")
    layers = layered_root(src)
    events = traced_copy_all(tmp_path / "strace.log", src, hub, TRACED)
    syncs = [i for i, (n, _p) in enumerate(events) if n == "syncfs"]
    assert len(syncs) == layers, (len(syncs), layers)
    per_file = [p for n, p in events if n in ("fsync", "fdatasync") and "/hub/" in p]
    assert per_file == [], f"hub files fsynced one by one: {per_file[:3]}"
    commits = [i for i, (n, p) in enumerate(events) if n == "rename" and p.endswith("/ofs/hub.ofs")]
    assert len(commits) == 32 and min(commits) > syncs[-1]
    for j in os.listdir(src):
        names = [os.path.basename(s.path) for s in sej.list_segments(os.path.join(hub, f"c1.{j}"))]
        for earlier, later in zip(names, names[1:]):
            last_write = max(
                i for i, (n, p) in enumerate(events) if n == "write" and p.endswith(f"c1.{j}/jnl/{earlier}")
            )
            created = min(i for i, (n, p) in enumerate(events) if n == "openat" and p.endswith(f"c1.{j}/jnl/{later}"))
            assert any(last_write < s < created for s in syncs), (j, earlier, later)
    assert_identical(src, hub)
    for j in os.listdir(src):
        assert read_offset_file(os.path.join(src, j, "ofs", "hub.ofs")) == sej.next_offset(os.path.join(hub, f"c1.{j}"))


def test_a_hub_root_on_a_file_system_without_trusted_syncfs_errors_gets_an_fsync_per_journal(tmp_path) -> None:
    """tmpfs (as NFS, FUSE or overlayfs) is not a disk file system whose syncfs is known to report write-back
    errors: there a pass over many journals fsyncs each one's files, and never calls syncfs."""
    if not os.path.isdir("/dev/shm") or not os.access("/dev/shm", os.W_OK):
        pytest.skip("no writable /dev/shm")
    src = str(tmp_path / "src")
    hub = tempfile.mkdtemp(dir="/dev/shm", prefix="sej-hub-")
    try:
        fd = os.open(hub, os.O_RDONLY)
        try:
            if syncfs_reports_errors(fd):
                pytest.skip("/dev/shm is a disk file system here")
        finally:
            os.close(fd)
        layered_root(src)
        events = traced_copy_all(tmp_path / "strace.log", src, hub, "trace=openat,write,fsync,fdatasync,syncfs")
        assert not [e for e in events if e[0] == "syncfs"]
        fsynced = {p for n, p in events if n in ("fsync", "fdatasync") and p.startswith(hub) and p.endswith(".jnl")}
        written = {p for n, p in events if n == "write" and p.startswith(hub) and p.endswith(".jnl")}
        assert written and written <= fsynced, sorted(written - fsynced)[:3]
        assert_identical(src, hub)
    finally:
        shutil.rmtree(hub, ignore_errors=True)


def test_a_failed_syncfs_fails_every_copy_of_its_round_uncommitted_and_the_next_pass_copies_them(
    tmp_path, monkeypatch
) -> None:
    """The write-back error a syncfs reports (EIO) is a failed copy of each journal of the round: nothing of
    theirs is committed on the source, and the next pass (syncfs working) copies them whole."""
    import errno

    import sej.hub.copy as hub_copy

    needs_syncfs(tmp_path)
    src, hub = str(tmp_path / "src"), str(tmp_path / "hub")
    with sej.ShardedWriter(src, "p", shard_bit=5) as w:
        for i in range(300):
            w.append(b"v%d" % i, key=b"k%d" % i)
    real = hub_copy.sync_file_system

    def failing(fd: int) -> None:
        raise OSError(errno.EIO, "syncfs: Input/output error")

    monkeypatch.setattr(hub_copy, "sync_file_system", failing)
    out = copy_all(lambda: LocalSource(src), hub, "c1", "hub")
    assert len(out) == 32 and all(o.result is None and isinstance(o.error, OSError) for o in out), out[:2]
    for j in os.listdir(src):
        assert not os.path.exists(os.path.join(src, j, "ofs", "hub.ofs")), j
    monkeypatch.setattr(hub_copy, "sync_file_system", real)
    again = copy_all(lambda: LocalSource(src), hub, "c1", "hub")
    # What the failed syncfs covered was cut, not trusted from the page cache: the next pass writes it all again.
    assert all(o.error is None for o in again) and sum(o.result.messages for o in again) == 300
    assert_identical(src, hub)
    for j in os.listdir(src):
        assert read_offset_file(os.path.join(src, j, "ofs", "hub.ofs")) == sej.next_offset(os.path.join(hub, f"c1.{j}"))


def layered_root(src: str, journals: int = 32, messages: int = 40) -> int:
    """`journals` journals of as many segments each (returned): every layer of a pass copies into all."""
    for shard in range(journals):
        with sej.Writer(os.path.join(src, f"p.5.{shard:03x}"), segment_size=800) as w:
            for i in range(messages):
                w.append(b"v%04d" % i + b"x" * 60)
    layers = {len(sej.list_segments(os.path.join(src, j))) for j in os.listdir(src)}
    assert len(layers) == 1 and min(layers) >= 3, layers
    return min(layers)


def test_a_syncfs_failing_in_a_later_layer_commits_only_the_layers_before_and_the_next_pass_copies_the_rest(
    tmp_path, monkeypatch
) -> None:
    import errno

    import sej.hub.copy as hub_copy

    needs_syncfs(tmp_path)
    src, hub = str(tmp_path / "src"), str(tmp_path / "hub")
    layered_root(src)
    calls = []

    def second_fails(fd: int) -> None:
        calls.append(fd)
        if len(calls) == 2:
            raise OSError(errno.EIO, "syncfs: Input/output error")
        os.sync()

    monkeypatch.setattr(hub_copy, "sync_file_system", second_fails)
    out = copy_all(lambda: LocalSource(src), hub, "c1", "hub")
    assert len(calls) == 2, "no layer after the failed one"
    assert all(isinstance(o.error, OSError) and o.result is not None for o in out), out[:2]
    for j in os.listdir(src):
        first, second = sej.list_segments(os.path.join(src, j))[:2]
        # The first layer's segment is durable and committed; nothing of the failed layer's is.
        assert read_offset_file(os.path.join(src, j, "ofs", "hub.ofs")) == second.first_offset, j
        mine = sej.list_segments(os.path.join(hub, f"c1.{j}"))
        assert Path(mine[0].path).read_bytes() == Path(first.path).read_bytes()
        assert all(os.path.getsize(m.path) == 0 for m in mine[1:]), "the failed layer's bytes were cut"
    monkeypatch.setattr(hub_copy, "sync_file_system", lambda fd: os.sync())
    again = copy_all(lambda: LocalSource(src), hub, "c1", "hub")
    assert all(o.error is None and not o.result.more for o in again)
    assert_identical(src, hub)
    for j in os.listdir(src):
        assert read_offset_file(os.path.join(src, j, "ofs", "hub.ofs")) == sej.next_offset(os.path.join(hub, f"c1.{j}"))


def test_layers_progress_when_no_hub_journal_can_stay_open_between_them(tmp_path, monkeypatch) -> None:
    """With no hub journal kept open (an open-files limit too low), each layer reopens its journals, whose
    last segment is then not known durable: it is fsynced on its own and the copy goes on, in one pass."""
    monkeypatch.setattr("sej.hub.batch.open_journals", lambda: 0)
    src, hub = str(tmp_path / "src"), str(tmp_path / "hub")
    layered_root(src)
    out = copy_all(lambda: LocalSource(src), hub, "c1", "hub")
    assert all(o.error is None and not o.result.more for o in out), out[:2]
    assert_identical(src, hub)


def test_journals_waiting_for_a_syncfs_stay_within_the_process_limit(tmp_path, monkeypatch) -> None:
    """A batch holding as many hub journals as the process allows (PENDING_LIMIT, 3 files each) syncs them early,
    so a round of thousands of changed journals does not run out of file descriptors; copies stay exact."""
    import threading

    import sej.hub.copy as hub_copy

    monkeypatch.setattr(hub_copy, "_pending_slots", threading.BoundedSemaphore(5))
    syncs = []
    real = hub_copy.sync_file_system
    monkeypatch.setattr(hub_copy, "sync_file_system", lambda fd: (syncs.append(fd), real(fd)))
    needs_syncfs(tmp_path)
    src, hub = str(tmp_path / "src"), str(tmp_path / "hub")
    layers = layered_root(src)
    out = copy_all(lambda: LocalSource(src), hub, "c1", "hub")
    assert all(o.error is None and not o.result.more for o in out), out[:2]
    assert len(syncs) >= layers * 32 // 5, (len(syncs), layers)  # at most 5 journals per syncfs
    assert_identical(src, hub)
    for j in os.listdir(src):
        assert read_offset_file(os.path.join(src, j, "ofs", "hub.ofs")) == sej.next_offset(os.path.join(hub, f"c1.{j}"))


def test_a_batch_finding_every_slot_held_by_another_makes_its_copies_durable_by_itself(tmp_path, monkeypatch) -> None:
    """When other batches hold every slot (a pass stuck behind a hung producer holds its journals until the
    watchdog ends it), a pass holding none waits SLOT_WAIT once, then fsyncs its copies itself: it is not held up."""
    import sej.hub.copy as hub_copy

    slots = threading.BoundedSemaphore(1)
    monkeypatch.setattr(hub_copy, "_pending_slots", slots)
    fsynced = []
    real = hub_copy._Destination.sync_all
    monkeypatch.setattr(hub_copy._Destination, "sync_all", lambda d: (fsynced.append(d.dir), real(d))[1])
    src, hub = str(tmp_path / "src"), str(tmp_path / "hub")
    with sej.ShardedWriter(src, "p", shard_bit=5) as w:  # 32 journals: a batched round (SYNCFS_FROM)
        for i in range(320):
            w.append(b"m%d" % i, key=b"k%d" % i)
    assert slots.acquire(blocking=False)  # the stuck batch's: every slot
    box = []
    t = threading.Thread(target=lambda: box.append(copy_all(lambda: LocalSource(src), hub, "c1", "hub")), daemon=True)
    t.start()
    t.join(scaled(10))
    assert not t.is_alive(), "the pass waited for a slot no batch gave back"
    slots.release()
    (out,) = box
    assert len(out) == 32 and all(o.error is None for o in out)
    assert sorted(fsynced) == sorted(os.path.join(hub, f"c1.{j}") for j in os.listdir(src))  # each by itself
    assert_identical(src, hub)
    for j in os.listdir(src):
        assert read_offset_file(os.path.join(src, j, "ofs", "hub.ofs")) == sej.next_offset(os.path.join(hub, f"c1.{j}"))


# -- the command ---------------------------------------------------------------------------------


def test_sej_copy_command_local(tmp_path) -> None:
    src, hub = str(tmp_path / "src"), str(tmp_path / "hub")
    produce(src, 500)
    r = subprocess.run(
        [sys.executable, "-m", "sej.apps.cli", "copy", src, hub, "--client-id", "h1", "--reader-name", "hub2"],
        capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=str(REPO)), timeout=scaled(60),
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert len(r.stdout.splitlines()) == 4 and "next offset" in r.stdout
    assert_identical(src, hub, client="h1")
    assert read_offset_file(os.path.join(src, "p.2.000", "ofs", "hub2.ofs")) is not None
    bad = run_python("from sej.apps.cli.main import main; main()", "copy", src, hub, "--client-id", "a.b")
    assert bad.returncode == 2 and "Traceback" not in bad.stderr and "client id" in bad.stderr


def test_sej_copy_shows_progress_on_a_terminal_and_is_quiet_when_piped(tmp_path) -> None:
    src, hub = str(tmp_path / "src"), str(tmp_path / "hub")
    produce(src, 3000)
    p, drawn = run_with_stderr_on_a_terminal(["copy", src, hub])
    assert p.returncode == 0 and b"next offset" in p.stdout
    assert b"copying" in drawn
    env = dict(os.environ, PYTHONPATH=str(REPO))
    piped = subprocess.run([sys.executable, "-m", "sej.apps.cli", "copy", src, str(tmp_path / "hub2")],
                           capture_output=True, text=True, env=env, timeout=scaled(60))  # fmt: skip
    assert piped.returncode == 0 and piped.stderr == ""
    assert_identical(src, hub, client="local")


# -- a producer's tree is not trusted: no symlink is followed, no FIFO opened (issue 10, items 5 and 6) -------


def sej_cmd(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.run([sys.executable, "-m", "sej.apps.cli", *args], capture_output=True, text=True, env=env,
                          timeout=timeout)  # fmt: skip


def test_a_symlink_at_the_old_predictable_temp_name_is_not_followed(tmp_path) -> None:
    """The hub's offset temp file was `ofs/hub.ofs.<hub pid>.tmp`: a producer that planted a symlink there
    had the hub truncate the link's target to 8 bytes. The temp name is now random and created exclusively."""
    src, hub = str(tmp_path / "src"), str(tmp_path / "hub")
    produce(src, 300)
    victim = tmp_path / "victim.txt"
    victim.write_bytes(b"the producer host's precious file\n" * 10)
    before = victim.read_bytes()
    for j in os.listdir(src):
        os.makedirs(os.path.join(src, j, "ofs"))
        os.symlink(victim, os.path.join(src, j, "ofs", f"hub.ofs.{os.getpid()}.tmp"))
    out = copy_all(lambda: LocalSource(src), hub, "c1", "hub")
    assert all(o.error is None for o in out), [o.error for o in out]
    assert victim.read_bytes() == before, "the symlink's target was written through"
    for o in out:
        assert o.result is not None
        ofs = os.path.join(src, o.journal, "ofs", "hub.ofs")
        assert not os.path.islink(ofs) and read_offset_file(ofs) == o.result.next_offset
    assert_identical(src, hub)


def test_sej_copy_refuses_an_ofs_directory_symlinked_to_another_journals(tmp_path) -> None:
    """With `ofs/` a symlink to another journal's `ofs/`, `sej copy` set THAT journal's hub offset, though the
    hub had none of its data: retention there could then delete messages nobody copied."""
    src, hub = str(tmp_path / "src"), str(tmp_path / "hub")
    produce(src, 300)
    other = str(tmp_path / "other")
    with sej.Writer(other, segment_size=500) as w:
        w.append_many([b"not copied %d" % i for i in range(100)])
    os.makedirs(os.path.join(other, "ofs"))
    os.symlink(os.path.join(other, "ofs"), os.path.join(src, "p.2.001", "ofs"))
    r = sej_cmd("copy", src, hub, "--client-id", "c1")
    assert r.returncode == 1, r.stderr
    assert "Traceback" not in r.stderr
    assert f"{os.path.join(src, 'p.2.001', 'ofs')} is a symlink, not a directory" in r.stderr
    assert not os.path.lexists(os.path.join(other, "ofs", "hub.ofs")), "the other journal's offset was set"
    assert sej.list_readers(other) == []
    for j in ("p.2.000", "p.2.002", "p.2.003"):  # the other journals are copied and committed as usual
        assert read_offset_file(os.path.join(src, j, "ofs", "hub.ofs")) == sej.next_offset(os.path.join(src, j))


@pytest.mark.parametrize("target", ["other-journal", "/etc/passwd"])
def test_a_symlinked_segment_is_refused_and_its_target_never_read(tmp_path, target: str) -> None:
    """`DirEntry.is_file()` follows symlinks: a segment linked to another journal's segment was copied into
    the hub; one linked to /etc/passwd failed with an error quoting its first 8 bytes as a number."""
    src, hub = tmp_path / "src", str(tmp_path / "hub")
    solo = src / "solo"
    with sej.Writer(str(solo), segment_size=400) as w:
        w.append_many([b"mine %d" % i for i in range(30)])
    if target == "other-journal":
        other = tmp_path / "other"
        with sej.Writer(str(other), segment_size=100_000) as w:
            w.append_many([b"someone else's %d" % i for i in range(30)])
        target = str(other / "jnl" / "0000000000000000.jnl")
    first = solo / "jnl" / "0000000000000000.jnl"
    first.unlink()
    os.symlink(target, first)
    error: Exception | None = None
    try:
        copy_journal(LocalSource(str(src)), "solo", hub, "c1", "hub")
    except Exception as e:
        error = e
    copied = os.path.join(hub, "c1.solo", "jnl")
    assert not os.path.isdir(copied) or all(os.path.getsize(os.path.join(copied, f)) == 0 for f in os.listdir(copied))
    assert read_offset_file(str(solo / "ofs" / "hub.ofs")) is None
    assert str(error) == f"{first} is a symlink, not a regular file: refusing to open it"  # no contents
    assert isinstance(error, sej.UnsafeFileError)


def test_symlinked_journal_directories_and_jnl_directories_are_not_journals(tmp_path) -> None:
    src, hub = tmp_path / "src", str(tmp_path / "hub")
    produce(str(src), 200)
    other = tmp_path / "elsewhere"
    with sej.Writer(str(other), segment_size=500) as w:
        w.append_many([b"x%d" % i for i in range(20)])
    os.symlink(other, src / "q.1.000")  # a journal name, but a symlink to a journal elsewhere
    os.makedirs(src / "r.1.001")
    os.symlink(other / "jnl", src / "r.1.001" / "jnl")  # a real directory whose jnl/ is a symlink
    out = copy_all(lambda: LocalSource(str(src)), hub, "c1", "hub")
    assert sorted(o.journal for o in out) == [f"p.2.00{i}" for i in range(4)]
    assert all(o.error is None for o in out)
    assert sorted(os.listdir(hub)) == [f"c1.p.2.00{i}" for i in range(4)]
    assert not os.path.exists(other / "ofs")
    # A single journal whose jnl/ is a symlink is refused when it is read.
    with pytest.raises(sej.UnsafeFileError, match=r"r\.1\.001/jnl is a symlink, not a directory"):
        copy_journal(LocalSource(str(src / "r.1.001")), "r.1.001", hub, "c1", "hub")


@pytest.mark.parametrize("kind", ["fifo", "symlink"])
def test_sej_copy_refuses_a_fifo_or_symlink_at_the_hub_offset_instead_of_hanging(tmp_path, kind: str) -> None:
    """A FIFO at `ofs/hub.ofs` blocked `sej copy` forever in open() (on a pass with nothing new to copy,
    when the hub reads its offset back). Now nothing but a regular file is opened, and nothing is replaced."""
    src, hub = str(tmp_path / "src"), str(tmp_path / "hub")
    produce(src, 300)
    first = sej_cmd("copy", src, hub)
    assert first.returncode == 0, first.stderr
    bad = os.path.join(src, "p.2.002", "ofs", "hub.ofs")
    os.remove(bad)
    victim = tmp_path / "victim"
    victim.write_bytes(b"\0" * 8)
    os.mkfifo(bad) if kind == "fifo" else os.symlink(victim, bad)
    # Nothing new: the run checks each journal's end with two stats (its cache of the last run) and
    # has nothing to commit, so it does not touch the offset file at all.
    r = sej_cmd("copy", src, hub, timeout=60)  # hung forever before
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    assert os.path.lexists(bad) and (os.path.islink(bad) if kind == "symlink" else not os.path.islink(bad))
    # Without the cache, the run reads the offset back: the FIFO is refused, not opened.
    os.remove(state_file(os.path.realpath(src), hub, "local", "hub"))
    r = sej_cmd("copy", src, hub, timeout=60)
    assert r.returncode == 1, r.stderr
    assert "Traceback" not in r.stderr
    what = "FIFO" if kind == "fifo" else "symlink"
    assert f"p.2.002: error: {bad} is a {what}, not a regular file" in r.stderr
    assert os.path.lexists(bad) and (os.path.islink(bad) if kind == "symlink" else not os.path.islink(bad))
    assert victim.read_bytes() == b"\0" * 8
    produce(src, 100, seed=3)  # new data: the copy goes on, but the hub still does not replace the FIFO
    r = sej_cmd("copy", src, hub, timeout=60)
    assert r.returncode == 1 and f"{bad} is a {what}" in r.stderr, r.stderr
    assert_prefix(src, hub, client="local")


def test_directories_that_are_not_journals_are_reported_and_sej_copy_fails_when_it_finds_none(tmp_path) -> None:
    """A root whose directories are not shard names was skipped silently: `sej copy` exited 0 having copied nothing."""
    src, hub = tmp_path / "src", str(tmp_path / "hub")
    with sej.Writer(str(src / "ev.10.000"), segment_size=500) as w:  # bit 16 written in decimal: not a shard name
        w.append(b"x")
    os.makedirs(src / "tmp")  # a valid name, but no jnl/
    os.makedirs(src / "ev.1.001")  # a shard being made: no jnl/ yet, not worth a word
    (src / "notes.txt").write_text("a file is not a journal")
    cmd = [sys.executable, "-m", "sej.apps.cli", "copy", str(src), hub, "--client-id", "h1"]
    env = dict(os.environ, PYTHONPATH=str(REPO))
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=scaled(60))
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    lines = r.stderr.splitlines()
    assert f"sej: warning: {src}: skipping 'ev.10.000': not a journal name: 'ev.10.000' is not a shard name" in lines[0]
    assert lines[1] == f"sej: warning: {src}: skipping 'tmp': not a journal (no jnl/ directory) and not a shard name"
    assert lines[2].startswith(f"sej: error: {src}: found no journal to copy (skipped 'ev.10.000': not a journal name")
    assert len(lines) == 3 and r.stdout == ""
    produce(str(src), 50)  # now journals too: exit 0, the others still reported
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=scaled(60))
    assert r.returncode == 0, r.stderr
    assert len(r.stdout.splitlines()) == 4 and r.stderr.count("sej: warning:") == 2
    assert sorted(os.listdir(hub)) == [f"h1.p.2.00{i}" for i in range(4)]


def test_copy_all_warns_of_each_directory_that_is_not_a_journal(tmp_path, caplog) -> None:
    src, hub = tmp_path / "src", str(tmp_path / "hub")
    produce(str(src), 20)
    os.makedirs(src / "ev.10.000" / "jnl")
    os.symlink(src / "p.2.000", src / "q.1.000")
    with caplog.at_level(logging.WARNING, logger="sej.hub"):
        out = copy_all(lambda: LocalSource(str(src)), hub, "c1", "hub")
    assert sorted(o.journal for o in out) == [f"p.2.00{i}" for i in range(4)]
    warned = sorted(r.getMessage() for r in caplog.records)
    assert len(warned) == 2
    assert warned[0].startswith(f"{src}/: skipping 'ev.10.000': not a journal name")
    assert warned[1] == f"{src}/: skipping 'q.1.000': a symlink, not a journal directory"


# -- passes in batches (sej.hub.batch): what one pass learns, the next one trusts only while it holds --


Rounds = list[list[tuple[int, int]]]
rounds_of_changes = st.lists(st.lists(st.tuples(st.integers(0, 3), st.integers(0, 40)), max_size=6), min_size=2,
                             max_size=6)  # fmt: skip


@settings(max_examples=30, deadline=None, database=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(rounds_of_changes, st.sampled_from([200, 700, 5000]))
def test_passes_that_remember_copy_every_change_between_them(rounds: Rounds, seg: int) -> None:
    passes_that_remember(rounds, seg, LocalSource)


STATE_DAMAGE = ["none", "none", "missing", "garbage", "truncated", "old version", "bad entries", "stale", "symlink",
                "other hub sizes", "marks moved", "marks past the hub", "bad marks", "bad sweeps"]  # fmt: skip


@settings(max_examples=30, deadline=None, database=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(rounds_of_changes, st.sampled_from([200, 700, 5000]), st.lists(st.sampled_from(STATE_DAMAGE), min_size=6))
def test_passes_that_remember_through_a_state_file_that_may_be_lost_damaged_or_stale(
    rounds: Rounds, seg: int, damage: list[str]
) -> None:
    """`sej copy`'s cache between runs: whatever happened to it, every pass copies every change."""
    passes_that_remember(rounds, seg, LocalSource, damage)


def damage_state(path: str, how: str, older: bytes | None) -> None:
    """Do `how` to the state file at `path` (`older`: its content two passes ago)."""
    if how == "missing":
        os.remove(path)
    elif how == "garbage":
        Path(path).write_bytes(b"\x00{not json")
    elif how == "truncated":
        Path(path).write_bytes(Path(path).read_bytes()[: len(Path(path).read_bytes()) // 2])
    elif how == "old version":
        Path(path).write_text('{"version": 0, "journals": {}}')
    elif how == "bad entries":
        bad = {"p.2.000": ["x.jnl", 1, 2, 3], "p.2.001": [None], "p.2.002": ["0000000000000000.jnl", -1, 0, None],
               "../p.2.003": ["0000000000000000.jnl", 0, 0, 0], "p.2.003": "nope"}  # fmt: skip
        Path(path).write_text(json.dumps({"version": 1, "journals": bad}))
    elif how == "stale" and older is not None:
        Path(path).write_bytes(older)
    elif how == "symlink":
        target = path + ".elsewhere"
        os.replace(path, target)
        os.symlink(target, path)  # never followed: ignored, then replaced by a regular file
    elif how == "other hub sizes":  # entries that disagree with the hub's files: each is checked
        raw = json.loads(Path(path).read_text())
        for entry in raw["journals"].values():
            entry[1] += 1
        Path(path).write_text(json.dumps(raw))
    elif how == "bad sweeps":  # when each ofs/ was last swept of stale commit temp files: malformed times are ignored
        raw = json.loads(Path(path).read_text())
        raw["swept"] = {"p.2.000": int("9" * 400), "p.2.001": True, "../p.2.002": 1.0, "p.2.003": 5, "p.2.002": 1e308,
                        "q.1.001": float("nan"), "p.1.000": "x", "p.1.001": [1], "p.1.002": float("inf")}  # fmt: skip
        Path(path).write_text(json.dumps(raw))
        loaded = CopyState.load(path)
        assert set(loaded.swept) <= {"p.2.002"} and all(loaded.sweep_due(j, time.time()) for j in raw["journals"])
    elif how.startswith("marks") or how == "bad marks":  # where the checksum files were read to (SumsMark)
        raw = json.loads(Path(path).read_text())
        marks = [e[4] for e in raw["journals"].values() if len(e) == 5]  # none when nothing was copied
        for k, m in enumerate(marks):
            if how == "marks moved":  # a record boundary, another record: its anchor does not match
                m[0] += 16 if k % 2 or m[0] < 48 else -16
            elif how == "marks past the hub":
                m[1] += 1 << 20
            else:
                m[:] = [[7, m[1], m[2]], [m[0], -1, m[2]], [m[0], m[1], 1 << 64], "x"][k % 4]
        Path(path).write_text(json.dumps(raw))


def passes_that_remember(
    rounds: Rounds, seg: int, source: Callable[[str], Source], damage: list[str] | None = None
) -> None:
    """Appends, rollovers (small segments: a writer may roll over exactly where the hub's copy ends)
    and new journals between passes of one CopyState: after every pass the hub equals the source,
    the source's hub offsets equal the hub's next offsets, and unchanged journals were only probed.

    With `damage`, the state goes through a file between passes, damaged in turn as `damage` says."""
    from sej.hub import CopyState

    listed: list[str] = []

    class Listing:
        def __init__(self, src: Source) -> None:
            self.src = src

        def segments(self, journal: str) -> list:  # type: ignore[type-arg]
            listed.append(journal)
            return self.src.segments(journal)

        def many(self, calls: list) -> list:  # type: ignore[type-arg]
            listed.extend(c[1] for c in calls if c[0] == "segments")
            return self.src.many(calls)

        def __getattr__(self, name: str) -> object:
            return getattr(self.src, name)

    tmp = tempfile.mkdtemp()
    try:
        src, hub = os.path.join(tmp, "src"), os.path.join(tmp, "hub")
        produce(src, 10, segment_size=seg)
        path = os.path.join(tmp, "state.json")
        state = CopyState(path if damage else None)
        saved: list[bytes] = []
        for r, changes in enumerate(rounds):
            how = "none"
            if damage and os.path.exists(path):
                saved.append(Path(path).read_bytes())
                how = damage[r % len(damage)]
                damage_state(path, how, saved[-3] if len(saved) >= 3 else None)
                state = CopyState.load(path)
            for shard, n in changes:
                with sej.Writer(os.path.join(src, f"p.2.00{shard}"), segment_size=seg) as w:
                    for i in range(n):
                        w.append(b"r%d-%d" % (r, i) * (1 + i % 5))
            if r == 2:  # a new journal between passes
                with sej.Writer(os.path.join(src, "q.1.001"), segment_size=seg) as w:
                    w.append(b"new")
            listed.clear()
            out = copy_all(lambda: Listing(source(src)), hub, "c1", "hub", state=state)  # type: ignore[arg-type,return-value]
            assert all(o.error is None for o in out), [o.error for o in out]
            assert_identical(src, hub)
            for o in out:
                assert o.result is not None
                j = os.path.join(src, o.journal)
                assert o.result.next_offset == sej.next_offset(j)
                assert read_offset_file(os.path.join(j, "ofs", "hub.ofs")) == o.result.next_offset
            changed = {f"p.2.00{s}" for s, n in changes if n} | ({"q.1.001"} if r == 2 else set())
            if r > 0:
                assert {o.journal for o in out if o.result and o.result.messages} == changed
                if how == "none":
                    assert set(listed) <= changed  # an unchanged journal is probed, never listed
            if damage:
                assert os.path.isfile(path) and not os.path.islink(path)  # saved, a regular file again
    finally:
        shutil.rmtree(tmp)


class ProbeWatch:
    """A source that counts the ("size", journal, segment) calls per journal, and runs `after_first_probe` once,
    right after the first batch of them returns (the pass's probe)."""

    def __init__(self, src: Source, asked: dict[str, int], after_first_probe: Callable[[], None] | None,
                 round_trip: float) -> None:  # fmt: skip
        self.src, self.asked, self.after, self.round_trip = src, asked, after_first_probe, round_trip

    def many(self, calls: list) -> list:  # type: ignore[type-arg]
        sizes = [c[1] for c in calls if c[0] == "size"]
        for j in sizes:
            self.asked[j] = self.asked.get(j, 0) + 1
        out = self.src.many(calls)
        if sizes and self.after is not None:
            self.after, after = None, self.after
            after()
        return out

    def __getattr__(self, name: str) -> object:
        return getattr(self.src, name)


@pytest.mark.parametrize("round_trip", [0.0, 1.0])
def test_the_probe_asks_little_of_unchanged_and_grown_journals_and_looks_again_when_writers_are_appending(
    tmp_path, round_trip: float
) -> None:
    """An idle pass costs two lstats per journal (its last segment, and whether the next one exists). In a pass that
    finds a grown journal, that one costs one in the probe and one after its copy (the segment named by the hub's new
    next offset), and the journals found unchanged are looked at once more: a writer that appended just after the
    probe looked at its journal is copied in the same pass, not one pass later. Over a source far away (its round
    trip PROBE_TOGETHER_RTT or more) a journal's two lstats go at once: a grown one costs one more."""
    src, hub = str(tmp_path / "src"), str(tmp_path / "hub")
    produce(src, 40, segment_size=1 << 20)
    state = CopyState()
    journals = [f"p.2.00{k}" for k in range(4)]

    def append(journal: str) -> None:
        with sej.Writer(os.path.join(src, journal), segment_size=1 << 20) as w:
            w.append(b"more")

    def run(after: Callable[[], None] | None = None) -> tuple[dict[str, int], dict[str, int]]:
        asked: dict[str, int] = {}
        out = copy_all(lambda: ProbeWatch(LocalSource(src), asked, after, round_trip), hub, "c1", "hub", state=state)  # type: ignore[arg-type,return-value]
        assert all(o.error is None for o in out), [o.error for o in out]
        assert_identical(src, hub)
        return asked, {o.journal: o.result.messages for o in out if o.result}

    run()
    assert run() == ({j: 2 for j in journals}, {j: 0 for j in journals})  # idle
    append("p.2.001")
    asked, copied = run()
    assert copied == {j: int(j == "p.2.001") for j in journals}
    assert asked == {j: (2 if round_trip < 0.005 else 3) if j == "p.2.001" else 4 for j in journals}
    append("p.2.001")
    asked, copied = run(after=lambda: append("p.2.002"))  # p.2.002: appended once the probe has looked at it
    assert copied == {j: int(j in ("p.2.001", "p.2.002")) for j in journals}


def test_sweep_times_go_through_the_state_file_and_leave_with_their_journal(tmp_path) -> None:
    """When each journal's ofs/ was last swept (CopyState.swept) is saved with `sej copy`'s state and loaded back,
    so the next run does not sweep again; a journal gone from the source is forgotten with the rest of its state."""
    src, hub, path = str(tmp_path / "src"), str(tmp_path / "hub"), str(tmp_path / "state.json")
    produce(src, 40)
    copy_all(lambda: LocalSource(src), hub, "c1", "hub", state=CopyState.load(path))  # first commits: no sweep
    assert CopyState.load(path).swept == {}
    produce(src, 40, seed=1)
    state = CopyState.load(path)
    copy_all(lambda: LocalSource(src), hub, "c1", "hub", state=state)
    assert state.swept and set(state.swept) <= set(os.listdir(src))
    assert CopyState.load(path).swept == state.swept
    shutil.rmtree(os.path.join(src, "p.2.000"))
    state = CopyState.load(path)
    copy_all(lambda: LocalSource(src), hub, "c1", "hub", state=state)
    assert "p.2.000" not in state.swept and "p.2.000" not in CopyState.load(path).swept


def test_destinations_keep_the_hub_journals_open_between_passes_and_reopen_what_changed_under_them(tmp_path) -> None:
    """The daemon's open hub journals: used again while their files are the ones they hold; a journal deleted,
    truncated or replaced under them is opened afresh (recovered), never written through a stale descriptor."""
    from sej.hub.copy import Destinations

    src, hub = str(tmp_path / "src"), str(tmp_path / "hub")
    produce(src, 400, segment_size=100_000)  # one segment per journal: the hub's tails stay open
    dests = Destinations(limit=16)
    try:
        out = copy_all(lambda: LocalSource(src), hub, "c1", "hub", destinations=dests)
        assert all(o.error is None for o in out) and len(dests) == 4
        kept = dict(dests._open)
        produce(src, 40, segment_size=100_000, seed=1)
        copy_all(lambda: LocalSource(src), hub, "c1", "hub", destinations=dests)
        assert dict(dests._open) == kept, "the same open journals, used again"
        assert_identical(src, hub)
        with pytest.raises(sej.LockedError):  # held between passes, as a writer holds its journal
            sej.Writer(os.path.join(hub, "c1.p.2.000"))
        # Under the open journals: one deleted, one truncated, one replaced by a copy (another inode).
        shutil.rmtree(os.path.join(hub, "c1.p.2.000"))
        seg1 = sej.list_segments(os.path.join(hub, "c1.p.2.001"))[-1].path
        os.truncate(seg1, os.path.getsize(seg1) - 7)
        seg2 = sej.list_segments(os.path.join(hub, "c1.p.2.002"))[-1].path
        shutil.copyfile(seg2, seg2 + ".new")
        os.replace(seg2 + ".new", seg2)
        produce(src, 40, segment_size=100_000, seed=2)
        with pytest.warns(sej.CorruptionWarning, match="incomplete frame"):  # the truncated one: its torn tail cut
            out = copy_all(lambda: LocalSource(src), hub, "c1", "hub", destinations=dests)
        assert all(o.error is None for o in out), [o.error for o in out]
        assert_identical(src, hub)
        assert dests._open["%s/c1.p.2.003" % hub] is kept["%s/c1.p.2.003" % hub]
        for j in ("000", "001", "002"):
            assert dests._open[f"{hub}/c1.p.2.{j}"] is not kept[f"{hub}/c1.p.2.{j}"]
    finally:
        dests.close()
    sej.Writer(os.path.join(hub, "c1.p.2.000")).close()  # closed: the locks are free


def test_closing_destinations_releases_every_journal_even_when_one_fails_to_close(tmp_path) -> None:
    """A journal whose close fails (its segment's descriptor gone: the fsync fails) does not keep the journals
    after it open and locked; the error is raised once all are closed."""
    from sej.hub.copy import Destinations

    src, hub = str(tmp_path / "src"), str(tmp_path / "hub")
    produce(src, 400, segment_size=100_000)
    dests = Destinations(limit=16)
    copy_all(lambda: LocalSource(src), hub, "c1", "hub", destinations=dests)
    held = list(dests._open.values())  # referenced elsewhere too (a batch may hold one): not freed by the GC
    first = held[0]
    assert first.seg is not None
    first.unsynced = 1  # it has bytes to fsync on close
    os.close(first.seg.fd)  # the fsync fails (EBADF)
    with pytest.raises(OSError):
        dests.close()
    for j in range(4):  # every journal's writer lock is free again
        sej.Writer(os.path.join(hub, f"c1.p.2.00{j}")).close()


def test_destinations_close_a_journal_whose_copy_failed_and_keep_at_most_their_limit(tmp_path) -> None:
    from sej.hub.copy import Destinations

    src, hub = str(tmp_path / "src"), str(tmp_path / "hub")
    produce(src, 400, segment_size=100_000)
    dests = Destinations(limit=2)
    try:
        out = copy_all(lambda: LocalSource(src), hub, "c1", "hub", destinations=dests)
        assert all(o.error is None for o in out) and len(dests) == 2  # the others were closed
        assert_identical(src, hub)
        victim = os.path.join(src, "p.2.003")
        seg = sej.list_segments(victim)[-1].path
        data = bytearray(Path(seg).read_bytes())
        data[-10] ^= 0xFF  # rewritten under the hub (where it compares): its copy stops with an error
        Path(seg).write_bytes(bytes(data))
        out = copy_all(lambda: LocalSource(src), hub, "c1", "hub", destinations=dests)
        assert [o.journal for o in out if o.error is not None] == ["p.2.003"]
        assert f"{hub}/c1.p.2.003" not in dests._open
        sej.Writer(os.path.join(hub, "c1.p.2.003")).close()  # its lock was released
    finally:
        dests.close()


def test_destinations_stay_at_their_limit_and_are_reused_when_passes_copy_more_journals(tmp_path, monkeypatch) -> None:
    """Passes copy the journals in turn: closing the least recently used to keep the next would keep none of those
    the next pass copies first. `limit` stay open, so each pass opens (and recovers) only the others."""
    from sej.hub import CopyState
    from sej.hub import copy as hub_copy
    from sej.hub.copy import Destinations

    src, hub = str(tmp_path / "src"), str(tmp_path / "hub")
    produce(src, 400, segment_size=100_000)
    journals = sorted(os.listdir(src))
    opened: list[str] = []
    real = hub_copy._Destination.__init__

    def counting(self, dir: str) -> None:  # type: ignore[no-untyped-def]
        opened.append(dir)
        real(self, dir)

    monkeypatch.setattr(hub_copy._Destination, "__init__", counting)
    dests, state = Destinations(limit=2), CopyState()
    try:
        for seed in range(3):
            produce(src, 40, segment_size=100_000, seed=seed)
            opened.clear()
            out = copy_all(lambda: LocalSource(src), hub, "c1", "hub", state=state, destinations=dests)
            assert all(o.error is None for o in out) and all(o.result and o.result.messages for o in out), out
            assert_identical(src, hub)
            assert len(dests) == 2
            assert len(opened) == (len(journals) if seed == 0 else len(journals) - 2), (seed, opened)
        # Which 2 may change from pass to pass: copies run at once, and a journal given back while a kept one is
        # being copied takes its place (the kept one is then closed), so only the count is what stays.
    finally:
        dests.close()


HUB_CHANGES = ["none", "none", "delete", "truncate", "replace", "garbage"]


@settings(max_examples=25, deadline=None, database=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(rounds_of_changes, st.sampled_from([200, 700, 5000]), st.lists(st.tuples(st.sampled_from(HUB_CHANGES),
       st.integers(0, 3), st.integers(1, 50)), min_size=6))  # fmt: skip
def test_passes_with_open_destinations_copy_every_change_whatever_happens_to_the_hub_between_them(
    rounds: Rounds, seg: int, hub_changes: list[tuple[str, int, int]]
) -> None:
    """Between passes that keep the hub's journals open (the daemon's Destinations), the hub's files change
    under them: a journal deleted, its last segment truncated, replaced, or grown by garbage. Every pass
    still leaves the hub equal to the source."""
    from sej.hub import CopyState
    from sej.hub.copy import Destinations

    tmp = tempfile.mkdtemp()
    dests = Destinations(limit=3)
    try:
        src, hub = os.path.join(tmp, "src"), os.path.join(tmp, "hub")
        produce(src, 10, segment_size=seg)
        state = CopyState()
        for r, changes in enumerate(rounds):
            for shard, n in changes:
                with sej.Writer(os.path.join(src, f"p.2.00{shard}"), segment_size=seg) as w:
                    for i in range(n):
                        w.append(b"r%d-%d" % (r, i) * (1 + i % 5))
            how, shard, k = hub_changes[r % len(hub_changes)]
            d = os.path.join(hub, f"c1.p.2.00{shard}")
            tail = sej.list_segments(d)[-1].path if os.path.isdir(d) and sej.list_segments(d) else None
            if how == "delete" and os.path.isdir(d):
                shutil.rmtree(d)
            elif how == "truncate" and tail is not None:
                os.truncate(tail, max(0, os.path.getsize(tail) - k))
            elif how == "replace" and tail is not None:
                shutil.copyfile(tail, tail + ".new")
                os.replace(tail + ".new", tail)
            elif how == "garbage" and tail is not None:
                with open(tail, "ab") as f:
                    f.write(b"\x07" * k)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", sej.CorruptionWarning)  # recovery cuts the garbage (kept aside)
                out = copy_all(lambda: LocalSource(src), hub, "c1", "hub", state=state, destinations=dests)
            assert all(o.error is None for o in out), [o.error for o in out]
            assert_identical(src, hub)
            assert len(dests) <= 3
    finally:
        dests.close()
        shutil.rmtree(tmp)


def test_deferred_commits_wait_for_commit_interval_and_cost_no_listing(tmp_path: Path) -> None:
    """With commit_interval (the daemon's), a journal committed less than that ago keeps its new hub offset pending:
    the copy is complete, the producer's offset lags it. An unchanged journal with a pending commit is settled by
    the probe (no listing), and its offset is committed once commit_interval has passed since its last commit."""
    from sej.hub import CopyState

    src, hub = str(tmp_path / "src"), str(tmp_path / "hub")
    listed: list[str] = []

    class Listing(LocalSource):
        def segments(self, journal: str) -> list:  # type: ignore[type-arg]
            listed.append(journal)
            return super().segments(journal)

    def on_source() -> dict[str, int | None]:
        return {j: read_offset_file(os.path.join(src, j, "ofs", "hub.ofs")) for j in sorted(os.listdir(src))}

    def hub_next() -> dict[str, int]:  # of the journals the hub has (a removed one is no journal: next_offset raises)
        dirs = {j: os.path.join(hub, f"c1.{j}") for j in sorted(os.listdir(src))}
        return {j: sej.next_offset(d) for j, d in dirs.items() if os.path.isdir(d)}

    produce(src, 40)
    state = CopyState()
    state.commit_interval = 3600.0
    out = copy_all(lambda: Listing(src), hub, "c1", "hub", state=state)
    assert all(o.error is None for o in out) and on_source() == hub_next()  # a first commit never waits
    first = on_source()
    produce(src, 40, seed=1)  # 40 more over the same shards
    out = copy_all(lambda: Listing(src), hub, "c1", "hub", state=state)
    assert all(o.error is None for o in out) and sum(o.result.messages for o in out if o.result) == 40
    assert_identical(src, hub)
    assert on_source() == first != hub_next()  # pending
    assert state.pending == {j: n for j, n in hub_next().items() if n != first[j]}
    listed.clear()
    out = copy_all(lambda: Listing(src), hub, "c1", "hub", state=state)
    assert listed == [] and all(o.error is None and o.result is not None and o.result.messages == 0 for o in out)
    assert on_source() == first  # still waiting
    state.commit_interval = 0.0  # commit on every pass: what waits is due at once
    out = copy_all(lambda: Listing(src), hub, "c1", "hub", state=state)
    assert listed == [] and all(o.error is None for o in out)
    assert on_source() == hub_next() and state.pending == {}
    # A short commit_interval: once it has passed, an idle pass commits what waits.
    state.commit_interval = 0.2
    produce(src, 40, seed=3)
    copy_all(lambda: Listing(src), hub, "c1", "hub", state=state)  # commits if due, else keeps it pending
    produce(src, 40, seed=4)
    copy_all(lambda: Listing(src), hub, "c1", "hub", state=state)
    passed = time.monotonic() + 0.2
    while time.monotonic() < passed:  # the interval itself is what is tested
        time.sleep(0.05)
    copy_all(lambda: Listing(src), hub, "c1", "hub", state=state)
    assert on_source() == hub_next() and state.pending == {}
    # A pass that ends with stop set commits every pending offset, however young. A changed commit_interval
    # applies at once to journals already committed (the last ones, 0.1-0.2 s ago, wait again).
    state.commit_interval = 3600.0
    produce(src, 40, seed=2)
    copy_all(lambda: Listing(src), hub, "c1", "hub", state=state)
    assert state.pending and on_source() != hub_next()
    stop = threading.Event()
    stop.set()
    copy_all(lambda: Listing(src), hub, "c1", "hub", state=state, stop=stop)
    assert on_source() == hub_next() and state.pending == {}
    # A pending offset whose hub copy changed since is not committed (not even on stop): the next pass copies
    # that journal again and commits its own next offset.
    produce(src, 40, seed=5)
    copy_all(lambda: Listing(src), hub, "c1", "hub", state=state)
    lost = sorted(state.pending)[0]
    before = on_source()
    shutil.rmtree(os.path.join(hub, f"c1.{lost}"))
    copy_all(lambda: Listing(src), hub, "c1", "hub", state=state, stop=stop)
    assert on_source()[lost] == before[lost] and lost not in state.pending
    assert {j: v for j, v in on_source().items() if j != lost} == {j: v for j, v in hub_next().items() if j != lost}
    copy_all(lambda: Listing(src), hub, "c1", "hub", state=state)
    assert_identical(src, hub)
    assert state.pending == {lost: hub_next()[lost]}  # committed 0.5-1 commit_interval after its last commit
    state.commit_interval = 0.0
    copy_all(lambda: Listing(src), hub, "c1", "hub", state=state)
    assert on_source() == hub_next() and state.pending == {}


class OffsetReads(LocalSource):
    """A LocalSource that records which journals' hub offsets were read on the source."""

    def __init__(self, root: str, reads: list[str]) -> None:
        super().__init__(root)
        self.reads = reads

    def read_offset(self, journal: str, reader: str) -> int | None:
        self.reads.append(journal)
        return super().read_offset(journal, reader)


def test_an_initial_pass_reads_no_offset_on_the_source_and_a_pass_without_its_cache_reads_every_one(tmp_path) -> None:
    """Before the hub has a copy of a journal, its offset on the source cannot change what the copy does: it is not
    read, and the copy commits its own (over a previous hub's). Once the hub has copies, a pass that lost what the
    last one knew reads every offset again, and rewrites none when nothing is new."""
    from sej.offset import write_offset_file

    src, hub = str(tmp_path / "src"), str(tmp_path / "hub")
    produce(src, 300)
    journals = sorted(os.listdir(src))
    os.makedirs(os.path.join(src, journals[0], "ofs"), exist_ok=True)
    stale = os.path.join(src, journals[0], "ofs", "hub.ofs")
    write_offset_file(stale, 3)  # a hub whose copy is gone committed this once
    reads: list[str] = []
    out = copy_all(lambda: OffsetReads(src, reads), hub, "c1", "hub", state=CopyState())
    assert all(o.error is None and o.result is not None for o in out), out
    assert reads == [], "no offset read for journals the hub has no copy of"
    assert_identical(src, hub)
    ofs = {j: os.path.join(src, j, "ofs", "hub.ofs") for j in journals}
    for j in journals:
        assert read_offset_file(ofs[j]) == sej.next_offset(os.path.join(src, j)), j
    times = {j: os.stat(ofs[j]).st_mtime_ns for j in journals}
    out = copy_all(lambda: OffsetReads(src, reads), hub, "c1", "hub", state=CopyState())
    assert all(o.error is None and o.result is not None and o.result.messages == 0 for o in out), out
    assert sorted(reads) == journals, "the hub has copies: every offset is read"
    assert {j: os.stat(ofs[j]).st_mtime_ns for j in journals} == times, "nothing new: no offset file rewritten"


def test_the_hub_journals_kept_open_fit_in_the_open_files_limit_they_are_counted_against(tmp_path) -> None:
    """open_journals() keeps as many hub journals open as the open-files limit leaves room for beyond 1,024:
    the descriptors each kept journal really holds (its two writer locks since the lock on jnl/, its segment,
    its checksum file) must be what it counts, or a daemon at the cap runs out of descriptors."""
    code = f"""
import os, resource, sys
resource.setrlimit(resource.RLIMIT_NOFILE, (1024 + 120, 1024 + 120))
import sej
from sej.hub import LocalSource, copy_journal
from sej.hub.copy import Destinations, open_journals
src, hub = {str(tmp_path / "src")!r}, {str(tmp_path / "hub")!r}
n = open_journals()
for i in range(n):
    with sej.Writer(os.path.join(src, f"j{{i}}")) as w:
        w.append(b"x")
kept = Destinations(n)
before = len(os.listdir("/proc/self/fd"))
for i in range(n):
    copy_journal(LocalSource(src), f"j{{i}}", hub, "c", "hub", destinations=kept)
print(n, len(os.listdir("/proc/self/fd")) - before)
"""
    done = run_python(code)
    assert done.returncode == 0, done.stderr
    n, held = map(int, done.stdout.split())
    assert n > 0 and held <= 120, (n, held)


TORN_PRODUCER = r"""
import os, resource, signal, sys, sej
from sej.frames import HEADER_SIZE
jdir = sys.argv[1]
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG, as on a full disk
w = sej.Writer(jdir)
w.append(b"first")
w.flush()
seg = [f for f in os.listdir(os.path.join(jdir, "jnl")) if f.endswith(".jnl")][0]
at = os.path.getsize(os.path.join(jdir, "jnl", seg))  # where the next frame starts
# A value holding, 5,000 bytes in, what looks like the next message's frame (a producer's bytes are arbitrary).
fake = sej.message.encode(2, 7, 0, b"", b"not a message")
value = os.urandom(5000) + fake + os.urandom(20_000)
cut = at + HEADER_SIZE + 4 + 5000 + len(fake)  # the disk fills right after it
resource.setrlimit(resource.RLIMIT_FSIZE, (cut, resource.RLIM_INFINITY))
w.append(value)
try:
    w.flush()
except OSError as e:
    print("torn", e.errno, os.path.getsize(os.path.join(jdir, "jnl", seg)) == cut, flush=True)
sys.stdin.readline()  # the hub copied the torn journal; room on the disk again
resource.setrlimit(resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
w.append(b"last")
w.close()  # writes the rest of the value's frame, kept for a retry, and the next message
print("done", flush=True)
"""


def test_a_value_that_holds_frames_torn_by_a_full_disk_is_a_tail_not_damage(tmp_path) -> None:
    """A producer's disk fills in the middle of a message whose value holds bytes that look like the next
    message's frame, ending just where the write stopped (the bytes are checksummed: the writer records what it
    wrote). That is a message still being written (the writer keeps the rest and writes it when it can), not a
    damaged frame that whole frames follow: the hub copies what comes before it and waits, then copies the rest."""
    src, hub = str(tmp_path / "src"), str(tmp_path / "hub")
    proc = popen_python(TORN_PRODUCER, os.path.join(src, "j"), stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert proc.stdout is not None and proc.stdin is not None
        line = proc.stdout.readline()
        assert line.split()[0] == "torn" and line.split()[2] == "True", line
        r = copy_journal(LocalSource(src), "j", hub, "c1", "hub")
        assert (r.messages, r.next_offset) == (1, 1)
        proc.stdin.write("go\n")
        proc.stdin.flush()
        assert proc.stdout.readline() == "done\n"
    finally:
        proc.stdin.close()  # type: ignore[union-attr]
        assert proc.wait(timeout=scaled(60)) == 0
    r = copy_journal(LocalSource(src), "j", hub, "c1", "hub")
    assert r.messages == 2
    assert_identical(src, hub)
