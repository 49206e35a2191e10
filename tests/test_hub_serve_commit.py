"""`sej serve` commits a burst of the hub's offsets in batches (sej.hub.serve_commit): every temp file written, one
syncfs, the renames, one syncfs; crash-safe (an offset file is always a whole old or new offset, whatever moment
`sej serve` is SIGKILLed at), and one bad journal fails its own commit only."""

from __future__ import annotations

import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

import sej
from sej.fsutil import syncfs_reports_errors
from sej.hub import serve_protocol as wire
from sej.hub.serve_commit import BATCH_FROM
from sej.offset import TEMP_RE, read_offset_file
from testing.timing import scaled

from .test_hub_serve_protocol import serving

REPO = Path(__file__).resolve().parents[1]
SERVE = [sys.executable, "-m", "sej.apps.cli", "serve"]
ENV = dict(os.environ, PYTHONPATH=str(REPO))


def journals_root(root: Path, bit: int) -> list[str]:
    """A sharded root of 2**bit journals, one message each."""
    with sej.ShardedWriter(str(root), "p", shard_bit=bit) as w:
        for i in range(1 << bit):
            w.append(b"v", key=i.to_bytes(8, "big"))
    return sorted(os.listdir(root))


def calls(root: Path, commits: list[tuple[str, int]], first_id: int = 1) -> bytes:
    """The hub's hello and a commit call for each (journal, value), as one stream."""
    out = [wire.encode(wire.hub_hello(str(root)))]
    out += [
        wire.encode(wire.call(first_id + k, "commit_offset", [j, "hub", v, True])) for k, (j, v) in enumerate(commits)
    ]
    return b"".join(out)


def replies(data: bytes) -> list[list[object]]:
    d = wire.Decoder(magic=True)
    d.feed(data)
    out = []
    for _ in range(len(data)):
        m = d.next()
        if m is None:
            break
        out.append(m)
    return out


def strace_merged(prefix: Path) -> list[tuple[str, str]]:
    """(call, path) of the traced calls of every thread (`strace -ff -ttt -o prefix`), merged in time order."""
    lines = []
    for f in prefix.parent.glob(prefix.name + ".*"):
        for line in f.read_text().splitlines():
            m = re.match(r"^(\d+\.\d+)\s+(\w+)\((.*)\)\s+=\s+(-?\d+)", line)
            if m:
                lines.append((float(m.group(1)), m.group(2), m.group(3), int(m.group(4))))
    lines.sort(key=lambda x: x[0])
    paths: dict[int, str] = {}
    events = []

    def at(dir_fd: str, name: str) -> str:
        return name if dir_fd == "AT_FDCWD" or name.startswith("/") else f"{paths.get(int(dir_fd), '?')}/{name}"

    for _t, name, args, ret in lines:
        if name == "openat":
            o = re.match(r'(AT_FDCWD|\d+), "([^"]*)"', args)
            if o and ret >= 0:
                paths[ret] = at(o.group(1), o.group(2))
        elif name in ("renameat", "renameat2"):
            r = re.match(r'(AT_FDCWD|\d+), "([^"]*)", (AT_FDCWD|\d+), "([^"]*)"', args)
            assert r, args
            events.append(("rename", at(r.group(3), r.group(4))))
        else:
            events.append((name, paths.get(int(args.split(",")[0]), "?")))
    return events


def traced_serve(tmp_path: Path, root: Path, stream: bytes) -> tuple[list[tuple[str, str]], list[list[object]]]:
    """`sej serve ROOT` under strace, fed `stream` on stdin: its (call, path) events and its replies."""
    prefix = tmp_path / "trace" / "t"
    prefix.parent.mkdir()
    r = subprocess.run(["strace", "-ff", "-ttt", "-qq", "-o", str(prefix), "-e",
                        "trace=openat,write,pwrite64,fsync,fdatasync,syncfs,renameat,renameat2", *SERVE, str(root)],
                       input=stream, capture_output=True, env=ENV, timeout=scaled(120), check=False)  # fmt: skip
    assert r.returncode == 0, r.stderr[-2000:]
    return strace_merged(prefix), replies(r.stdout)


needs_strace = pytest.mark.skipif(shutil.which("strace") is None and not os.environ.get("CI"), reason="needs strace")


@needs_strace
def test_a_burst_of_commits_writes_every_temp_file_then_one_syncfs_then_the_renames_then_one_syncfs(tmp_path) -> None:
    root = tmp_path / "root"
    journals = journals_root(root, 6)  # 64 journals
    fd = os.open(root, os.O_RDONLY)
    try:
        if not syncfs_reports_errors(fd):
            pytest.skip(f"{root}: no syncfs that reports write-back errors here")
    finally:
        os.close(fd)
    events, got = traced_serve(tmp_path, root, calls(root, [(j, 7) for j in journals]))
    assert [m[0] for m in got[1:]] == [wire.REPLY] * len(journals), got[:3]
    temp_writes = [i for i, (n, p) in enumerate(events) if n == "write" and TEMP_RE.match(os.path.basename(p))]
    syncs = [i for i, (n, _p) in enumerate(events) if n == "syncfs"]
    renames = [i for i, (n, p) in enumerate(events) if n == "rename" and p.endswith("/ofs/hub.ofs")]
    assert len(temp_writes) == len(renames) == len(journals), (len(temp_writes), len(renames))
    assert len(syncs) == 2, events
    assert max(temp_writes) < syncs[0] < min(renames) and max(renames) < syncs[1], "written, synced, renamed, synced"
    per_file = [p for n, p in events if n in ("fsync", "fdatasync")]
    assert per_file == [], f"fsynced one by one: {per_file[:3]}"
    for j in journals:
        assert read_offset_file(str(root / j / "ofs" / "hub.ofs")) == 7
        assert os.listdir(root / j / "ofs") == ["hub.ofs"]


@needs_strace
def test_without_a_trusted_syncfs_each_temp_file_is_fsynced_before_its_rename_and_each_ofs_after(tmp_path) -> None:
    """tmpfs (as NFS, FUSE or overlayfs): no syncfs, an fsync of each temp file and of each ofs/ directory."""
    if not os.path.isdir("/dev/shm") or not os.access("/dev/shm", os.W_OK):
        pytest.skip("no writable /dev/shm")
    root = Path(tempfile.mkdtemp(dir="/dev/shm", prefix="sej-serve-"))
    try:
        fd = os.open(root, os.O_RDONLY)
        try:
            if syncfs_reports_errors(fd):
                pytest.skip("/dev/shm is a disk file system here")
        finally:
            os.close(fd)
        journals = journals_root(root / "r", 5)
        events, got = traced_serve(tmp_path, root / "r", calls(root / "r", [(j, 3) for j in journals]))
        assert [m[0] for m in got[1:]] == [wire.REPLY] * len(journals)
        assert not [e for e in events if e[0] == "syncfs"]
        for j in journals:
            ofs = f"{root}/r/{j}/ofs"
            synced = [i for i, (n, p) in enumerate(events) if n == "fsync" and p.startswith(ofs + "/hub.ofs.")]
            renamed = [i for i, (n, p) in enumerate(events) if n == "rename" and p == ofs + "/hub.ofs"]
            dir_synced = [i for i, (n, p) in enumerate(events) if n == "fsync" and p == ofs]
            assert len(synced) == len(renamed) == 1 and dir_synced, (j, synced, renamed, dir_synced)
            assert synced[0] < renamed[0] < max(dir_synced)
            assert read_offset_file(f"{ofs}/hub.ofs") == 3
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_one_bad_journal_fails_its_own_commit_only_and_leaves_no_temp_file(tmp_path) -> None:
    root = tmp_path / "root"
    journals = journals_root(root, 5)  # 32 journals: one batch
    assert len(journals) >= BATCH_FROM
    bad = journals[3]
    (root / bad / "ofs").mkdir(exist_ok=True)
    os.symlink(tmp_path / "elsewhere", root / bad / "ofs" / "hub.ofs")
    missing = "q.5.01f"  # a valid name, no such journal
    conn = serving(str(root))
    try:
        got = conn.call_many([("commit_offset", j, "hub", 11, True) for j in [*journals, missing]])
    finally:
        conn.close()
    assert isinstance(got[3], sej.errors.UnsafeFileError), got[3]
    assert isinstance(got[-1], OSError), got[-1]
    assert [g for k, g in enumerate(got[:-1]) if k != 3] == [None] * (len(journals) - 1)
    assert os.listdir(root / bad / "ofs") == ["hub.ofs"] and os.path.islink(root / bad / "ofs" / "hub.ofs")
    assert not (tmp_path / "elsewhere").exists()
    for j in journals:
        if j != bad:
            assert sej.Offset(str(root / j), "hub").value == 11


def test_a_restricted_server_refuses_another_readers_commits_within_a_batch(tmp_path) -> None:
    root = tmp_path / "root"
    journals = journals_root(root, 5)
    conn = serving(str(root), restrict=True)
    try:
        got = conn.call_many(
            [("commit_offset", j, "hub" if k % 2 else "other", 4, True) for k, j in enumerate(journals)]
        )
    finally:
        conn.close()
    for k, (j, g) in enumerate(zip(journals, got, strict=True)):
        if k % 2:
            assert g is None
            assert sej.Offset(str(root / j), "hub").value == 4
        else:
            assert isinstance(g, Exception) and "other" in str(g), g
            assert not (root / j / "ofs" / "other.ofs").exists()


def test_sej_serve_sigkilled_mid_commit_leaves_every_offset_whole_old_or_new(tmp_path) -> None:
    """Rounds of a burst of commits to a real `sej serve`, SIGKILLed at once when its first temp file appears, or
    after a random moment; after each kill every offset file holds a value committed in some round (never torn,
    never anything else), no lower than the last one `sej serve` acknowledged; temp files left are commit temp files.
    A last session commits everything."""
    root = tmp_path / "root"
    journals = journals_root(root, 8)  # 256 journals
    rng = random.Random(int(os.environ.get("SEJ_SEED", "39")))
    acked = dict.fromkeys(journals, -1)
    sent: dict[str, set[int]] = {j: set() for j in journals}
    killed_mid = 0
    rounds = int(os.environ.get("SEJ_SOAK_ROUNDS", "8"))
    for r in range(rounds):
        value = 100 + r
        proc = subprocess.Popen([*SERVE, str(root)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.DEVNULL, env=ENV)  # fmt: skip
        try:
            assert proc.stdin is not None and proc.stdout is not None
            proc.stdin.write(wire.encode(wire.hub_hello(str(root))))
            proc.stdin.flush()
            hello = proc.stdout.read(len(wire.MAGIC) + 4)  # the magic and the hello's length: it is up and serving
            assert hello.startswith(wire.MAGIC), hello
            order = journals[:]
            rng.shuffle(order)
            for j in order:
                sent[j].add(value)
            proc.stdin.write(calls(root, [(j, value) for j in order])[len(wire.encode(wire.hub_hello(str(root)))) :])
            proc.stdin.flush()
            if r % 2 == 0:  # as soon as a temp file exists: within the batch's steps
                deadline = time.monotonic() + scaled(30)
                for _ in range(1 << 30):
                    if any(TEMP_RE.match(n) for j in journals[:32] for n in _names(root / j / "ofs")):
                        break
                    if proc.poll() is not None or time.monotonic() > deadline:
                        break
                killed_mid += proc.poll() is None
            else:
                time.sleep(rng.uniform(0, scaled(0.3)))  # a random moment (not a synchronisation)
            proc.kill()
            proc.wait(scaled(30))
            rest = proc.stdout.read()
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        for m in replies(hello + rest)[1:]:
            if m[0] == wire.REPLY:
                acked[order[int(m[1]) - 1]] = value  # type: ignore[call-overload]
        for j in journals:
            path = root / j / "ofs" / "hub.ofs"
            for name in _names(root / j / "ofs"):
                assert name == "hub.ofs" or TEMP_RE.match(name), (j, name)
            if not path.exists():
                assert acked[j] < 0, j
                continue
            assert path.stat().st_size == 8, (j, path.stat().st_size)
            got = read_offset_file(str(path))
            assert got in sent[j] and got >= acked[j], (j, got, acked[j])
    assert killed_mid >= 1, "no round killed sej serve while it committed"
    conn = serving(str(root))
    try:
        assert conn.call_many([("commit_offset", j, "hub", 999, True) for j in journals]) == [None] * len(journals)
    finally:
        conn.close()
    assert all(sej.Offset(str(root / j), "hub").value == 999 for j in journals)


def _names(path: Path) -> list[str]:
    try:
        return os.listdir(path)
    except FileNotFoundError:
        return []
