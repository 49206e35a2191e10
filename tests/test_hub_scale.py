"""Exactly once at scale (issue 13): `sej copy` over SSH SIGKILLed at random moments, many journals, live writers.

Writer processes keep appending to every journal of a producer root (small segments, so they roll over
during the run) while `sej copy ssh://...` processes, run against a real sshd on 127.0.0.1, are SIGKILLed at
random moments of their pass. In the end, after the writers stopped and one clean `sej copy`, every hub
journal is byte-identical to its source, holds every message exactly once, recovers cleanly, and the hub's
reader offset on the source is the message count.

CI: 100 journals, 3 kill rounds. SEJ_SOAK_JOURNALS=N and SEJ_SOAK_ROUNDS=N scale it up (scripts/soak.sh scale:
1,000 journals, 20 rounds). SEJ_HUB_SEED=N replays the random choices (printed first).
"""

from __future__ import annotations

import json
import os
import random
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import sej
from sej.layout import is_quarantine_name, parse_segment_name, reader_offset_path
from sej.offset import TEMP_RE, read_offset_file
from sej.shard import format_shard
from testing.timing import scaled

from .conftest import REPO, popen_python, soak_rounds

CLIENT = "127-0-0-1"  # sej copy's client id for ssh://...@127.0.0.1
SEGMENT_SIZE = 1500  # bytes: a journal rolls over every ~25 messages


def write_rate(n_journals: int) -> float:
    """Messages per second that the writers append in all (a few journals get most of them)."""
    return 1000.0 + 2.0 * n_journals


MAX_ATTEMPTS = 8  # copy processes started per round until one is killed mid-pass (the others end first)


def soak_journals() -> int | None:
    """SEJ_SOAK_JOURNALS, when set: how many journals the producer root has (default 100)."""
    value = os.environ.get("SEJ_SOAK_JOURNALS", "").strip()
    return min(max(1, int(value)), 16 * 1024) if value else None


def journal_names(n: int) -> list[str]:
    """`ev0.a.000` .. `ev0.a.3ff`, `ev1.a.000` ..: shard names (bit a: 1,024 shards per prefix)."""
    return [format_shard(f"ev{i >> 10}", 10, i & 1023) for i in range(n)]


# Appends to its journals until its stdin is closed, at `rate` messages per second in all; message k of a
# journal is b"<journal>:<k>:" and random bytes, so that every message says where it belongs. A few journals
# get most messages (the index is drawn as len * u**2): some roll over many times per copy pass, others
# rarely. Prints "writing" once every journal exists, and at the end each journal's message count (JSON).
WRITER = r"""
import json, os, random, sys, threading, time
import sej
root, seed, rate, segment_size = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4])
names = sys.argv[5].split(",")
rng = random.Random(seed)
stop = threading.Event()
threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
writers = [sej.Writer(os.path.join(root, n), segment_size=segment_size, durability="flush") for n in names]
counts = [0] * len(names)
print("writing", flush=True)
t0, n = time.monotonic(), 0
while not stop.is_set() and n < 100_000_000:
    due = int((time.monotonic() - t0) * rate)
    if due - n > rate:  # more than a second behind (a loaded machine): do not catch up in one burst
        t0 = time.monotonic() - n / rate
        due = n + 1
    if n >= due:
        time.sleep(0.005)
        continue
    for _ in range(min(due - n, 100)):
        i = int(len(names) * rng.random() ** 2)
        value = b"%s:%d:" % (names[i].encode(), counts[i]) + rng.randbytes(rng.randrange(0, 48))
        writers[i].append(value, key=b"k%d" % (counts[i] % 7))
        counts[i] += 1
        n += 1
for w in writers:
    w.close()
print(json.dumps(dict(zip(names, counts))), flush=True)
"""


def segments_of(journal: str) -> list[str]:
    """The segment file names of a journal, in order ([] while it has no jnl/ directory)."""
    try:
        return sorted(f for f in os.listdir(os.path.join(journal, "jnl")) if f.endswith(".jnl"))
    except FileNotFoundError:
        return []


def journal_files(journal: str) -> dict[str, bytes]:
    return {f: Path(journal, "jnl", f).read_bytes() for f in segments_of(journal)}


class Bytes:
    """Total segment bytes under a root, re-read cheaply: a segment followed by another is complete, and its
    size is remembered (so a poll costs a listing and one stat per journal)."""

    def __init__(self, root: str) -> None:
        self.root = root
        self.done: dict[tuple[str, str], int] = {}

    def __call__(self) -> int:
        total = 0
        try:
            dirs = os.listdir(self.root)
        except FileNotFoundError:
            return 0
        for d in dirs:
            names = segments_of(os.path.join(self.root, d))
            for k, name in enumerate(names):
                size = self.done.get((d, name))
                if size is None:
                    try:
                        size = os.stat(os.path.join(self.root, d, "jnl", name)).st_size
                    except FileNotFoundError:
                        size = 0
                    if k < len(names) - 1:
                        self.done[(d, name)] = size
                total += size
        return total


def commit_marks(src: str, names: list[str]) -> dict[str, tuple[int, int] | None]:
    """Each source journal's hub offset file (inode, mtime): a commit replaces the file (temp file + rename)."""
    out: dict[str, tuple[int, int] | None] = {}
    for n in names:
        try:
            st = os.stat(reader_offset_path(os.path.join(src, n), "hub"))
            out[n] = (st.st_ino, st.st_mtime_ns)
        except FileNotFoundError:
            out[n] = None
    return out


def check_prefix_and_commits(src: str, hub: str, names: list[str]) -> None:
    """After a kill: every hub journal is a byte prefix of its source (whole segments but its last one, no
    gap), and the offset committed on the source never runs ahead of the hub's durable copy."""
    known = {f"{CLIENT}.{n}" for n in names}
    for d in sorted(os.listdir(hub)):
        assert d in known, f"{d}: not a copy of a source journal"
        mine = journal_files(os.path.join(hub, d))  # the hub first: the source only grows meanwhile
        theirs = journal_files(os.path.join(src, d[len(CLIENT) + 1 :]))
        have = list(mine)
        assert have == list(theirs)[: len(have)], (d, have, list(theirs)[: len(have) + 1])
        for k, name in enumerate(have):
            if k < len(have) - 1:
                assert mine[name] == theirs[name], (d, name, "a complete hub segment differs")
            else:
                assert theirs[name].startswith(mine[name]), (d, name, "the hub's last segment is no prefix")
        committed = read_offset_file(reader_offset_path(os.path.join(src, d[len(CLIENT) + 1 :]), "hub"))
        if committed is not None:
            durable = sej.next_offset(os.path.join(hub, d))  # read only: a torn tail is not counted
            assert committed <= durable, (d, "the source's hub offset runs ahead of the hub", committed, durable)


def sej_copy_command(sshd, src: str, hub: str) -> list[str]:  # type: ignore[no-untyped-def]
    url = f"ssh://{sshd.user}@127.0.0.1:{sshd.port}{src}"
    keys = ["--identity", str(sshd.identity), "--known-hosts", str(sshd.known_hosts)]
    return [sys.executable, "-m", "sej.apps.cli", "copy", url, hub, *keys, "--workers", "8"]


def start_copy(command: list[str], logs: Path, tag: str) -> subprocess.Popen[bytes]:
    """`sej copy` in its own process; its output goes to files (1,000 journals' lines would fill a pipe)."""
    with open(logs / f"{tag}.out", "wb") as out, open(logs / f"{tag}.err", "wb") as err:
        return subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=out, stderr=err,
                                env=dict(os.environ, PYTHONPATH=str(REPO)))  # fmt: skip


def run(command: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout,
                          env=dict(os.environ, PYTHONPATH=str(REPO)))  # fmt: skip


def test_sej_copy_killed_at_random_moments_over_many_journals_ends_byte_identical(
    sshd, tmp_path, keep_on_failure
) -> None:
    """CI: 100 journals, 3 rounds; SEJ_SOAK_JOURNALS / SEJ_SOAK_ROUNDS scale it up, however long it takes."""
    seed = int(os.environ.get("SEJ_HUB_SEED", random.randrange(1 << 30)))
    n_journals = soak_journals() or 100
    rounds = soak_rounds() or 3
    print(f"seed {seed}: {n_journals} journals, {rounds} kill rounds ({sej.__file__})", flush=True)
    rng = random.Random(seed)
    src, hub, logs = tmp_path / "src", tmp_path / "hub", tmp_path / "logs"
    src.mkdir()
    logs.mkdir()
    keep_on_failure(str(src))
    keep_on_failure(str(hub))
    keep_on_failure(str(logs))
    names = journal_names(n_journals)
    command = sej_copy_command(sshd, str(src), str(hub))
    size_factor = max(1.0, n_journals / 100)  # deadlines only: more journals, longer passes
    t0 = time.monotonic()

    n_writers = 2 if n_journals <= 200 else 4
    writers = [
        popen_python(WRITER, str(src), str(seed + k), str(write_rate(n_journals) / n_writers),
                     str(SEGMENT_SIZE), ",".join(names[k::n_writers]), stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        for k in range(n_writers)
    ]  # fmt: skip
    counts: dict[str, int] = {}
    hub_bytes, src_bytes = Bytes(str(hub)), Bytes(str(src))
    kills = passes = attempts = 0
    longest = 0.0  # seconds the longest copy process ran so far (killed or not): a pass takes at least that
    fresh = n_journals * SEGMENT_SIZE // 2  # source bytes written before each round: work for the pass
    try:
        for w in writers:
            assert w.stdout is not None and w.stdout.readline().strip() == "writing", "a writer did not start"
        for round_ in range(rounds):
            s_round = src_bytes()
            deadline = time.monotonic() + scaled(60) * size_factor
            while src_bytes() < s_round + fresh:
                assert time.monotonic() < deadline, f"round {round_}: the writers did not write {fresh} bytes in time"
                time.sleep(0.05)
            for attempt in range(MAX_ATTEMPTS):
                attempts += 1
                # When to kill this pass: once the hub holds a random fraction of what it lacked; once a random
                # number of hub offsets were committed on the source; or after a random fraction of the longest
                # time a copy process ran so far (from its start: connecting, listing, any phase). Drawn before
                # the process starts.
                modes = ["bytes", "commits"] + (["time"] if longest > 0 else [])
                mode = rng.choice(modes) if attempt < 3 else "bytes"  # later attempts: the surest trigger
                h0, s0 = hub_bytes(), src_bytes()
                marks0 = commit_marks(str(src), names)
                fraction = rng.random() * (1.0 if attempt < 3 else 0.5)
                target_bytes = h0 + max(1, int(fraction * (s0 - h0)))
                target_commits = 1 + int(fraction**2 * (n_journals // 2))
                delay = fraction * 1.25 * longest  # sometimes past the end: a whole pass, timed
                what = {"bytes": f"hub bytes >= {target_bytes} (had {h0}, source {s0})",
                        "commits": f"{target_commits} hub offsets committed",
                        "time": f"{delay:.2f} s (of {longest:.2f} s)"}[mode]  # fmt: skip
                tag = f"round{round_:03d}-attempt{attempt}"
                started = time.monotonic()
                copier = start_copy(command, logs, tag)
                deadline = started + scaled(60) * size_factor
                fired = False
                for _ in range(10_000_000):
                    if copier.poll() is not None:
                        break
                    if mode == "bytes":
                        fired = hub_bytes() >= target_bytes
                    elif mode == "commits":
                        marks = commit_marks(str(src), names)
                        fired = sum(marks[n] != marks0[n] for n in names) >= target_commits
                    else:
                        fired = time.monotonic() - started >= delay
                    if fired:
                        copier.send_signal(signal.SIGKILL)
                        break
                    assert time.monotonic() < deadline, f"{tag}: no pass end and no {what} in time"
                    time.sleep(0.01)
                rc = copier.wait(scaled(10))
                took = time.monotonic() - started
                longest = max(longest, took)
                for k, w in enumerate(writers):
                    assert w.poll() is None, f"writer {k} ended during the rounds (exit {w.returncode})"
                if fired and rc == -signal.SIGKILL:
                    kills += 1
                    print(f"round {round_}: {tag} killed after {took:.2f} s at {what}", flush=True)
                    check_prefix_and_commits(str(src), str(hub), names)
                    break
                # The pass ended before its moment came: a whole pass, which must have succeeded.
                err = (logs / f"{tag}.err").read_text(errors="replace")
                assert rc == 0, f"{tag}: sej copy exit {rc}: {err[-3000:]}"
                passes += 1
                print(f"round {round_}: {tag} ended by itself after {took:.2f} s before {what}", flush=True)
                check_prefix_and_commits(str(src), str(hub), names)
            else:
                raise AssertionError(f"round {round_}: {MAX_ATTEMPTS} passes all ended before their kill moment")
        for k, w in enumerate(writers):
            out, _ = w.communicate("", timeout=scaled(60))  # stdin closed: the writer stops
            assert w.returncode == 0, f"writer {k}: exit {w.returncode}"
            counts.update(json.loads(out.strip().splitlines()[-1]))
    finally:
        for w in writers:
            w.kill()
            w.wait(scaled(10))
    written = sum(counts.values())
    assert sorted(counts) == names

    # One clean pass: all of it.
    final = run(command, scaled(120) * size_factor)
    assert final.returncode == 0, final.stderr[-3000:]
    reported = {}
    for line in final.stdout.splitlines():
        m = re.fullmatch(r"(\S+) -> \S+: \d+ messages, \d+ bytes, next offset (\d+)", line)
        assert m, line
        reported[m.group(1)] = int(m.group(2))
    assert reported == counts, "sej copy's last pass reports every journal at its message count"

    assert sorted(os.listdir(hub)) == sorted(f"{CLIENT}.{n}" for n in names)
    total = quarantined = temps = 0
    segments = rolled = 0
    for n in names:
        s, h = os.path.join(src, n), os.path.join(hub, f"{CLIENT}.{n}")
        # The hub's copy recovers cleanly: strict recovery finds nothing to cut, at the same next offset.
        with sej.Writer(h, strict=True) as w:
            assert w.recovered is None, (n, w.recovered)
            assert w.next_offset == counts[n], (n, w.next_offset, counts[n])
        theirs, mine = journal_files(s), journal_files(h)
        assert list(mine) == list(theirs), (n, "segment files", list(mine), list(theirs))
        for name in theirs:
            assert mine[name] == theirs[name], (n, name, "not byte-identical")
        segments += len(theirs)
        rolled += len(theirs) > 1
        # Exactly once: offsets 0..count-1, each message the one the writer wrote at that offset.
        with sej.Scanner(h, 0, timeout=0) as scanner:
            k = 0
            for m in scanner:
                assert m.offset == k, (n, "gap or duplicate", m.offset, k)
                assert m.value.startswith(b"%s:%d:" % (n.encode(), k)), (n, k, m.value[:40])
                k += 1
        assert k == counts[n], (n, k, counts[n])
        total += k
        assert read_offset_file(reader_offset_path(s, "hub")) == counts[n], (n, "hub offset on the source")
        # In the source's ofs/: the hub's offset, and the temp files of commits that a kill interrupted (the SFTP
        # source does not remove them; counted and reported), nothing else.
        for f in os.listdir(os.path.join(s, "ofs")):
            assert f == "hub.ofs" or (TEMP_RE.match(f) and f.startswith("hub.ofs.")), (n, f)
            temps += f != "hub.ofs"
        # What recovery cut from the hub's torn tails (after kills) is source bytes at that very position.
        for q in os.listdir(os.path.join(h, "jnl")):
            if is_quarantine_name(q):
                m = re.fullmatch(r"(.+\.jnl)\.cut-(\d+)-\d+", q)
                assert m and parse_segment_name(m.group(1)) is not None, q
                position, cut = int(m.group(2)), Path(h, "jnl", q).read_bytes()
                assert theirs[m.group(1)][position : position + len(cut)] == cut, (n, q, "not the source's bytes")
                quarantined += 1
    assert total == written, (total, written)
    assert rolled > 0 and segments > n_journals, "segments rolled over during the run"

    verify = run([sys.executable, "-m", "sej.apps.cli", "verify", str(hub)], scaled(120) * size_factor)
    assert verify.returncode == 0, verify.stdout[-3000:] + verify.stderr[-3000:]
    assert "no problems" in verify.stdout and f"{total} message" in verify.stdout.replace(",", ""), verify.stdout

    assert kills == rounds
    print(f"seed {seed}: {kills} kills in {rounds} rounds ({passes} passes ended first, {attempts} copies), "
          f"{n_journals} journals, {written} messages, {segments} segments ({rolled} journals rolled over), "
          f"{quarantined} torn hub tails cut aside, {temps} commit temp files left on the source, "
          f"{time.monotonic() - t0:.1f} s", flush=True)  # fmt: skip
