"""Real-process crash tests: a writer process killed with SIGKILL at random moments.

Every round a child process opens a Writer on the same journal and appends
messages whose every byte is derived from their offset, printing each
acknowledged next offset. The parent kills it with SIGKILL after a random
delay, then checks that the journal reopens, holds exactly the messages
0..n-1 with their exact contents, and lost nothing that was acknowledged.
Some rounds also leave a torn or corrupt tail behind (what a torn write or a
power loss leaves), so that startup recovery and its quarantine files are
checked byte for byte.

The seed is printed; rerun a failure with SEJ_CRASH_SEED=<seed>.
"""

from __future__ import annotations

import os
import random
import re
import signal
import subprocess
import threading
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import pytest

import sej
from sej.checksum import check_segment
from sej.layout import sum_path
from testing.timing import scaled

try:
    from tests.conftest import popen_python, soak_rounds
except ImportError:  # tests/ run as the rootdir
    from conftest import popen_python, soak_rounds  # type: ignore[no-redef]

# ---------------------------------------------------------------------------
# Message contents: a pure function of the offset, shared with the child.

CONTENT_SRC = r'''
import hashlib

TS0 = 1_700_000_000_000_000_000
BLOCK = 4  # type and timestamp are constant over aligned blocks of 4 offsets (append_many)
BIG = 5000


def expected(off):
    """(offset, timestamp, type, key, value) of the message at `off`."""
    blk = off // BLOCK
    h = hashlib.blake2b(off.to_bytes(8, "big"), digest_size=16).digest()
    vlen = BIG if off % 97 == 13 else (off * 7919) % 211
    value = (h * (vlen // 16 + 1))[:vlen]
    key = (b"k%x." % off * 20)[: off % 19]
    return (off, TS0 + blk * 1_000_003, blk % 256, key, value)
'''

_ns: dict[str, object] = {}
exec(CONTENT_SRC, _ns)
expected = _ns["expected"]
BLOCK: int = _ns["BLOCK"]  # type: ignore[assignment]
BIG: int = _ns["BIG"]  # type: ignore[assignment]
MAX_FRAME = 26 + 18 + BIG

_cache: list[tuple[int, int, int, bytes, bytes]] = []


def exp(off: int) -> tuple[int, int, int, bytes, bytes]:
    while len(_cache) <= off:
        _cache.append(expected(len(_cache)))  # type: ignore[operator]
    return _cache[off]


# ---------------------------------------------------------------------------
# The child: open a Writer, append forever (bounded), print acknowledgements.

CHILD = (
    CONTENT_SRC
    + r'''
import os, random, sys, time
import sej

dir, mode, seg, seed, bufsize = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
safety = float(sys.argv[6])
rng = random.Random(seed)
durability = mode if mode in ("sync", "flush") else "buffered"
use_many = rng.random() < 0.5
w = sej.Writer(dir, segment_size=seg, durability=durability, buffer_size=bufsize)
rec = w.recovered
print("start", w.next_offset, rec.quarantine if rec is not None else "-", flush=True)


def one():
    off = w.next_offset
    _, ts, typ, key, value = expected(off)
    got = w.append(value, key=key, type=typ, timestamp=ts)
    assert got == off, (got, off)


def block():
    off = w.next_offset
    assert off % BLOCK == 0
    msgs = [expected(o) for o in range(off, off + BLOCK)]
    got = w.append_many([m[4] for m in msgs], keys=[m[3] for m in msgs], type=msgs[0][2], timestamp=msgs[0][1])
    assert got == range(off, off + BLOCK), (got, off)


def step():
    """Append one message, or one aligned block through append_many."""
    if use_many and w.next_offset % BLOCK == 0 and rng.random() < 0.7:
        block()
    else:
        one()


# Appends until the parent kills it; only if the parent is gone, or after a safety deadline far beyond
# anything the parent waits for, does it stop by itself.
parent, deadline = os.getppid(), time.monotonic() + safety
for _ in range(1_000_000):
    if os.getppid() != parent or time.monotonic() > deadline:
        break
    if durability != "buffered":
        step()  # acknowledged when append returns
        print(w.next_offset, flush=True)
    else:
        for _ in range(rng.randint(1, 24)):
            step()
        acked = w.next_offset
        if mode == "buffered-sync":
            w.sync()
        else:
            w.flush()  # in the OS: survives a crash of this process
        print(acked, flush=True)
print("done", flush=True)
w.close()
'''
)

MODES = ("sync", "flush", "buffered-sync", "buffered-flush")
# SEJ_CRASH_MODES=sync,flush: only those modes (the soak of scripts/soak.sh uses sync: acknowledged = fsynced).
CRASH_MODES = tuple(m for m in os.environ.get("SEJ_CRASH_MODES", "").replace(" ", "").split(",") if m) or MODES
assert set(CRASH_MODES) <= set(MODES), f"SEJ_CRASH_MODES must name modes of {MODES}"
SEG = 4096
QUARANTINE_RE = re.compile(r"\A([0-9a-f]{16}\.jnl)\.cut-(\d+)-(\d+)\Z")


class Lines:
    """Drains a child's stdout in a thread (so the child never blocks on a full pipe)."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.proc = proc
        self.lines: list[str] = []
        self.cond = threading.Condition()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if not line.endswith("\n"):
                break  # cut by the kill: never acknowledged
            with self.cond:
                self.lines.append(line.rstrip("\n"))
                self.cond.notify_all()
        with self.cond:
            self.cond.notify_all()

    def wait_for(self, pred: Callable[[list[str]], bool], timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        with self.cond:
            while not pred(self.lines):
                left = deadline - time.monotonic()
                if left <= 0 or (not self.thread.is_alive()):
                    return pred(self.lines)
                self.cond.wait(min(left, 0.05))
            return True

    def finish(self) -> list[str]:
        self.thread.join(scaled(10))
        assert not self.thread.is_alive(), "child's stdout did not reach EOF after it died"
        return list(self.lines)


def scan(dir: str, offset: int = 0, limit: float | None = None) -> list[sej.Message]:
    """Every message from `offset` (Scanner with timeout=0), failing instead of hanging (after scaled(10) s)."""
    limit = scaled(10) if limit is None else limit
    box: dict[str, object] = {}

    def run() -> None:
        try:
            with sej.Scanner(dir, offset=offset, timeout=0, verify=True) as s:
                box["msgs"] = list(s)
                box["end"] = s.offset
        except BaseException as e:  # reported in the test's thread
            box["error"] = e

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(limit)
    if t.is_alive():
        pytest.fail(f"a full scan of {dir} from offset {offset} with timeout=0 did not finish in {limit} s")
    if "error" in box:
        raise box["error"]  # type: ignore[misc]
    msgs: list[sej.Message] = box["msgs"]  # type: ignore[assignment]
    assert box["end"] == (msgs[-1].offset + 1 if msgs else offset)
    return msgs


def check_exact(msgs: list[sej.Message], start: int, end: int, ctx: str) -> None:
    """msgs must be exactly the expected messages start..end-1."""
    for i, m in enumerate(msgs):
        if i >= end - start:
            pytest.fail(f"{ctx}: extra message at offset {m.offset} beyond the expected end {end}")
        if m != exp(start + i):
            e = exp(start + i)
            pytest.fail(
                f"{ctx}: message #{i} is {m.offset=} ts={m.timestamp} type={m.type} key={m.key[:20]!r} "
                f"len(value)={len(m.value)}; expected offset {e[0]} ts={e[1]} type={e[2]} key={e[3][:20]!r} "
                f"len(value)={len(e[4])} (equal value: {m.value == e[4]})"
            )
    assert len(msgs) == end - start, f"{ctx}: got {len(msgs)} messages, expected {end - start} ({start}..{end - 1})"


def check_sums(dir: str, ctx: str, whole: bool) -> None:
    """Every checksum record of every segment agrees with its bytes; with `whole`, they cover every byte."""
    for seg in sej.list_segments(dir):
        r = check_segment(seg.path, sum_path(dir, seg.first_offset), seg.first_offset)
        assert not r.errors, f"{ctx}: {r.errors}"
        if whole:
            assert r.has_sums and r.checked == r.size, f"{ctx}: {seg.path}: {r}"


def quarantine_files(dir: str) -> set[str]:
    jnl = os.path.join(dir, "jnl")
    return {n for n in os.listdir(jnl) if ".cut-" in n} if os.path.isdir(jnl) else set()


def read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def torn_tail(rng: random.Random, n: int, last: bytes) -> tuple[str, bytes]:
    """Bytes a crash (torn write, power loss) could leave after the last whole message."""
    kinds = ["torn", "torn-big", "garbage", "zeros", "wrong-offset"]
    if last:
        kinds.append("duplicate")
    kind = rng.choice(kinds)
    if kind in ("torn", "torn-big"):
        off, ts, typ, key, value = exp(n)
        if kind == "torn-big":
            value = bytes(range(256)) * (BIG // 256)
        frame = sej.encode(off, ts, typ, key, value)
        return kind, frame[: rng.randint(1, len(frame) - 1)]
    if kind == "garbage":
        return kind, rng.randbytes(rng.randint(1, 300))
    if kind == "zeros":
        return kind, bytes(rng.randint(1, 600))
    if kind == "wrong-offset":
        off, ts, typ, key, value = exp(n)
        return kind, sej.encode(off + 1 + rng.randrange(5), ts, typ, key, value)
    # duplicate: the last whole frame of the segment written again
    size = int.from_bytes(last[-4:], "big", signed=True)
    return kind, last[-size:]


@pytest.mark.slow
@pytest.mark.parametrize("slot", [0, 1])
def test_sigkill_writer_at_random_moments(tmp_path: Path, slot: int, keep_on_failure: Callable[[str], None]) -> None:
    """CI: 20 rounds per slot within 45 s; SEJ_SOAK_ROUNDS=N: N rounds per slot, however long they take."""
    seed = int(os.environ.get("SEJ_CRASH_SEED", random.randrange(2**32))) + slot
    print(f"SEJ_CRASH_SEED={seed - slot} (slot {slot}, seed {seed})")
    rng = random.Random(seed)
    d = str(tmp_path / "journal")
    keep_on_failure(d)
    soak = soak_rounds()
    rounds = soak or 20
    # CI: rounds stop early (still checked) rather than overrun; a soak is bounded by its count only.
    budget = float("inf") if soak else time.monotonic() + scaled(45)
    t_start = time.monotonic()
    n = 0  # messages verified so far
    seen_q: set[str] = set()
    stats = {"acked_rounds": 0, "early": 0, "recovered_parent": 0, "recovered_child": 0, "injected": 0}
    done_rounds = 0
    for r in range(rounds):
        if time.monotonic() > budget:
            break
        done_rounds += 1
        mode = rng.choice(CRASH_MODES)
        ctx = f"seed {seed} round {r} mode {mode}"

        # Some rounds start from a torn or corrupt tail, to be recovered by the child.
        injected: tuple[str, int, bytes] | None = None
        if r % 3 == 2:
            segs = sej.list_segments(d)
            last_path = segs[-1].path
            before = read(last_path)
            kind, junk = torn_tail(rng, n, before)
            with open(last_path, "ab") as f:
                f.write(junk)
            injected = (last_path, len(before), junk)
            stats["injected"] += 1
            ctx += f" injected {kind} ({len(junk)} bytes)"

        errpath = tmp_path / f"child{r}.err"
        with open(errpath, "w") as err:
            proc = popen_python(
                CHILD,
                d,
                mode,
                str(SEG),
                str(rng.randrange(2**32)),
                str(rng.choice([0, 512, 4096, 1 << 16])),
                str(scaled(120)),
                stdout=subprocess.PIPE,
                stderr=err,
            )
        lines = Lines(proc)
        try:
            if rng.random() < 0.25:
                # Anywhere: during interpreter start-up, opening, recovery or appending.
                stats["early"] += 1
                time.sleep(rng.uniform(0, 0.3))
            else:
                # While appending: after a random number of acknowledgements (counted, not timed, so that
                # every round makes progress however slow the machine), then a random moment later.
                acks_first = rng.randint(1, 40)
                limit = scaled(20)
                started = lines.wait_for(lambda ls, k=acks_first: len(ls) > k, limit)
                assert started, (
                    f"{ctx}: child printed {len(lines.lines)} lines, not {acks_first + 1}, in {limit:g} s "
                    f"(exit {proc.poll()}); stderr: {errpath.read_text()[-2000:]}"
                )
                time.sleep(rng.uniform(0, 0.12))
            proc.send_signal(signal.SIGKILL)
            proc.wait(scaled(10))
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(scaled(10))
        out = lines.finish()
        proc.stdout.close()  # type: ignore[union-attr]
        assert proc.returncode == -signal.SIGKILL, (
            f"{ctx}: child exited with {proc.returncode} before the kill; stderr: {errpath.read_text()[-3000:]}"
        )

        # What the child said: its start state and its acknowledgements.
        acks: list[int] = []
        child_q = None
        for i, line in enumerate(out):
            if line.startswith("start "):
                assert i == 0, f"{ctx}: unexpected output {out[:5]}"
                _, start, q = line.split(" ", 2)
                assert int(start) == n, f"{ctx}: the child's writer opened at {start}, the journal holds {n}"
                child_q = None if q == "-" else q
            else:
                acks.append(int(line))
        assert acks == sorted(acks), f"{ctx}: acknowledgements out of order"
        if acks:
            stats["acked_rounds"] += 1
        acked = max(acks, default=n)

        # Quarantine files made by the child: only for the injected tail, holding (a prefix of) its bytes.
        new_q = quarantine_files(d) - seen_q
        if injected is None:
            assert not new_q, f"{ctx}: the child cut a tail from a clean journal: {new_q}"
        else:
            seg_path, pos, junk = injected
            if out:  # the child got past opening: recovery had to cut exactly the junk
                assert child_q is not None, f"{ctx}: the child's writer opened on a corrupt tail and cut nothing"
                assert read(child_q) == junk, f"{ctx}: {child_q} does not hold the cut bytes"
                stats["recovered_child"] += 1
            for name in new_q:
                m = QUARANTINE_RE.match(name)
                assert m, f"{ctx}: badly named quarantine file {name}"
                assert m.group(1) == os.path.basename(seg_path) and int(m.group(2)) == pos, (
                    f"{ctx}: {name} should be the cut of {seg_path} at {pos}"
                )
                got = read(os.path.join(d, "jnl", name))
                # A kill while recovery copies may leave a partial copy (the segment still has the bytes).
                assert junk.startswith(got), f"{ctx}: {name} holds bytes that were not cut"
        seen_q |= new_q

        # Checksums: the killed writer never left one that disagrees with the bytes it covers (what it
        # wrote after its last record is unchecked until the next writer seals it).
        check_sums(d, ctx + ": after the kill", whole=False)

        # Reopen: no error; whatever recovery cuts is exactly the bytes beyond the last whole message.
        segs = sej.list_segments(d)
        if not segs:  # killed before its writer created the journal
            assert n == 0 and not acks, f"{ctx}: no segments"
            last_path, snap = "", b""
        else:
            last_path = segs[-1].path
            snap = read(last_path)
        if os.path.isdir(d):
            readonly_next = sej.next_offset(d)
        else:  # killed before its writer made the directory: no journal, and next_offset says so (not 0)
            with pytest.raises(sej.InvalidArgumentError, match="does not exist"):
                sej.next_offset(d)
            readonly_next = 0
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            w = sej.Writer(d, segment_size=SEG)
            try:
                rec = w.recovered
                n_new = w.next_offset
            finally:
                w.close()
        cw = [c for c in caught if issubclass(c.category, sej.CorruptionWarning)]
        new_q = quarantine_files(d) - seen_q
        if rec is None:
            assert not cw, f"{ctx}: CorruptionWarning without a cut: {cw[0].message}"
            assert not new_q, f"{ctx}: quarantine files without a reported cut: {new_q}"
            if last_path:
                assert read(last_path) == snap, f"{ctx}: reopening changed {last_path} without reporting a cut"
        else:
            stats["recovered_parent"] += 1
            assert rec.path == last_path and rec.quarantine is not None, f"{ctx}: {rec}"
            assert new_q == {os.path.basename(rec.quarantine)}, f"{ctx}: {new_q} vs {rec.quarantine}"
            assert os.path.dirname(rec.quarantine) == os.path.join(d, "jnl")
            cut = read(rec.quarantine)
            assert cut, f"{ctx}: empty quarantine file for {rec}"
            assert cut == snap[rec.position :] and rec.length == len(cut), f"{ctx}: quarantine != cut bytes"
            assert read(last_path) == snap[: rec.position], f"{ctx}: segment after the cut is not the prefix"
            assert len(cw) == 1 and rec.quarantine in str(cw[0].message), f"{ctx}: warnings {cw}"
        seen_q |= new_q
        assert n_new == readonly_next, f"{ctx}: next_offset() said {readonly_next}, the writer opened at {n_new}"
        assert n_new >= acked, f"{ctx}: acknowledged up to {acked} but the journal holds {n_new} messages"
        assert n_new >= n, f"{ctx}: the journal shrank from {n} to {n_new} messages"
        # Junk is never taken for messages: beyond the last acknowledgement there is at most what
        # the child appended since (one batch of up to 24 steps of up to BLOCK messages each).
        assert n_new <= acked + 25 * BLOCK, f"{ctx}: {n_new} messages after acknowledgements {acks[-3:]}"
        n = n_new

        # After recovery every byte of every segment is covered by a checksum that holds.
        check_sums(d, ctx + ": after recovery", whole=True)

        # Full scan: contiguous 0..n-1, no duplicates, exact contents.
        check_exact(scan(d), 0, n, f"{ctx}: full scan")
        for _ in range(2):
            k = rng.randrange(n + 1)
            check_exact(scan(d, k), k, n, f"{ctx}: scan from {k}")
        if n:
            lm = sej.last_messages(d, 3)
            check_exact(lm, max(0, n - 3), n, f"{ctx}: last_messages")

        # Segment files: named by their first offset (the scan checked), all but the last full.
        segs = sej.list_segments(d)
        for s in segs[:-1]:
            size = os.path.getsize(s.path)
            assert SEG <= size < SEG + MAX_FRAME, f"{ctx}: finished segment {s.path} has {size} bytes"
        print(f"{ctx}: {len(acks)} acks up to {acked}, journal {n}, recovered={rec is not None}")

    print(f"seed {seed}: {done_rounds} rounds, {n} messages, {len(sej.list_segments(d))} segments, {stats}, "
          f"modes {CRASH_MODES}, {time.monotonic() - t_start:.1f} s")  # fmt: skip
    if soak:
        assert done_rounds == soak
    assert done_rounds >= 8, f"only {done_rounds} rounds fit in the time budget"
    assert stats["acked_rounds"] >= done_rounds // 3, f"too few rounds got acknowledgements: {stats}"
    assert stats["recovered_parent"] + stats["recovered_child"] >= 1, f"no recovery was exercised: {stats}"
    assert n > 100 and len(sej.list_segments(d)) > 10, f"the journal is too small to mean much: {n} messages"


ROLL_CHILD = (
    CONTENT_SRC
    + r"""
import sys, time
import sej

dir, target = sys.argv[1], int(sys.argv[2])
w = sej.Writer(dir, segment_size=4096, durability="sync")
while w.next_offset < target:
    off = w.next_offset
    _, ts, typ, key, value = expected(off)
    assert w.append(value, key=key, type=typ, timestamp=ts) == off
print(w.next_offset, len(sej.list_segments(dir)), flush=True)
sys.stdin.read()  # killed here, right after the rollover (or the parent is gone: end of input)
"""
)


def test_sigkill_right_after_a_rollover(tmp_path: Path) -> None:
    """Killed just after its last message rolled the segment: the journal ends with an empty segment."""
    d = str(tmp_path / "journal")
    target = 97 * 3 + 13 + 1  # message 301 is BIG (> segment_size), so appending it rolls
    assert len(exp(target - 1)[4]) == BIG
    proc = popen_python(
        ROLL_CHILD, d, str(target), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    try:
        lines = Lines(proc)
        assert lines.wait_for(lambda ls: bool(ls), scaled(20)), "child printed nothing"
        proc.send_signal(signal.SIGKILL)
        proc.wait(scaled(10))
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(scaled(10))
        proc.stdin.close()  # type: ignore[union-attr]
    acked, nsegs = map(int, lines.finish()[0].split())
    proc.stdout.close()  # type: ignore[union-attr]
    proc.stderr.close()  # type: ignore[union-attr]
    assert proc.returncode == -signal.SIGKILL
    assert acked == target
    segs = sej.list_segments(d)
    assert len(segs) == nsegs and segs[-1].first_offset == target
    assert os.path.getsize(segs[-1].path) == 0, "the rollover should have left an empty last segment"
    assert sej.next_offset(d) == target

    check_exact(scan(d), 0, target, "full scan ending in an empty segment")
    check_exact(scan(d, target), target, target, "scan from the end")
    with warnings.catch_warnings():
        warnings.simplefilter("error", sej.CorruptionWarning)
        with sej.Writer(d, segment_size=SEG, durability="sync") as w:
            assert w.recovered is None
            assert w.next_offset == target
            _, ts, typ, key, value = exp(target)
            assert w.append(value, key=key, type=typ, timestamp=ts) == target
    check_exact(scan(d), 0, target + 1, "full scan after appending to the empty segment")
    check_sums(d, "after appending to the empty segment", whole=True)
    assert sej.list_segments(d)[-1].first_offset == target
