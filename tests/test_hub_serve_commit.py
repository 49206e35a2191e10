"""`sej serve` commits a burst of the hub's offsets in batches (sej.hub.serve_commit): the first commits (no offset
file yet) write every temp file, one syncfs, the renames, one syncfs; later ones overwrite each file's 8 bytes in
place, then one syncfs, the files kept open between bursts; crash-safe (an offset file is always a whole old or new offset, whatever moment
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


def calls(root: Path, commits: list[tuple[str, int]], first_id: int = 1, sweep: bool = True) -> bytes:
    """The hub's hello and a commit call for each (journal, value), as one stream."""
    out = [wire.encode(wire.hub_hello(str(root)))]
    out += [
        wire.encode(wire.call(first_id + k, "commit_offset", [j, "hub", v, sweep])) for k, (j, v) in enumerate(commits)
    ]
    return b"".join(out)


def replies(data: bytes, magic: bool = True) -> list[list[object]]:
    """The messages in `data` (after the server's magic, if `magic`)."""
    d = wire.Decoder(magic=magic)
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
                events.append(("open", paths[ret]))
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
def test_a_burst_of_first_commits_replaces_the_files_then_later_bursts_overwrite_them_in_place_with_one_syncfs(
    tmp_path,
) -> None:
    """Three bursts in one session: the first (no offset file yet) writes every temp file, one syncfs, the renames,
    one syncfs; the second (without the sweep of stale temp files) opens each file and overwrites its 8 bytes, then one syncfs; the third overwrites the
    files kept open (not opened again), then one syncfs. No fsync one by one, no temp file left."""
    root = tmp_path / "root"
    journals = journals_root(root, 6)  # 64 journals
    fd = os.open(root, os.O_RDONLY)
    try:
        if not syncfs_reports_errors(fd):
            pytest.skip(f"{root}: no syncfs that reports write-back errors here")
    finally:
        os.close(fd)
    n = len(journals)
    stream = calls(root, [(j, 7) for j in journals])
    hello = len(wire.encode(wire.hub_hello(str(root))))
    stream += calls(root, [(j, 8) for j in journals], n + 1, sweep=False)[hello:]
    stream += calls(root, [(j, 9) for j in journals], 2 * n + 1, sweep=False)[hello:]  # a sweep would open ofs/
    events, got = traced_serve(tmp_path, root, stream)
    assert [m[0] for m in got[1:]] == [wire.REPLY] * 3 * n, got[:3]
    temp_writes = [i for i, (n_, p) in enumerate(events) if n_ == "write" and TEMP_RE.match(os.path.basename(p))]
    syncs = [i for i, (n_, _p) in enumerate(events) if n_ == "syncfs"]
    renames = [i for i, (n_, p) in enumerate(events) if n_ == "rename" and p.endswith("/ofs/hub.ofs")]
    in_place = [i for i, (n_, p) in enumerate(events) if n_ == "pwrite64" and p.endswith("/ofs/hub.ofs")]
    opened = [i for i, (n_, p) in enumerate(events) if n_ == "open" and p.endswith("/ofs/hub.ofs")]
    assert len(temp_writes) == len(renames) == n, (len(temp_writes), len(renames))
    assert len(syncs) == 4, events
    assert max(temp_writes) < syncs[0] < min(renames) and max(renames) < syncs[1], "written, synced, renamed, synced"
    second = [i for i in in_place if syncs[1] < i < syncs[2]]
    third = [i for i in in_place if syncs[2] < i < syncs[3]]
    assert len(second) == len(third) == n and len(in_place) == 2 * n, (len(second), len(third), len(in_place))
    assert len([i for i in opened if syncs[1] < i < syncs[2]]) == n, "the second burst opens each file"
    assert not [i for i in opened if i > syncs[2]], "the third writes the files kept open"
    per_file = [p for n_, p in events if n_ in ("fsync", "fdatasync")]
    assert per_file == [], f"fsynced one by one: {per_file[:3]}"
    for j in journals:
        assert read_offset_file(str(root / j / "ofs" / "hub.ofs")) == 9
        assert os.listdir(root / j / "ofs") == ["hub.ofs"]


@needs_strace
def test_without_a_trusted_syncfs_each_temp_file_is_fsynced_before_its_rename_and_each_ofs_after(tmp_path) -> None:
    """tmpfs (as NFS, FUSE or overlayfs): no syncfs, an fsync of each temp file and of each ofs/ directory; a file
    overwritten in place is fdatasynced."""
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
        stream = calls(root / "r", [(j, 3) for j in journals])
        head = len(wire.encode(wire.hub_hello(str(root / "r"))))
        stream += calls(root / "r", [(j, 4) for j in journals], len(journals) + 1, sweep=False)[head:]
        events, got = traced_serve(tmp_path, root / "r", stream)
        assert [m[0] for m in got[1:]] == [wire.REPLY] * 2 * len(journals)
        assert not [e for e in events if e[0] == "syncfs"]
        for j in journals:
            ofs = f"{root}/r/{j}/ofs"
            synced = [i for i, (n, p) in enumerate(events) if n == "fsync" and p.startswith(ofs + "/hub.ofs.")]
            renamed = [i for i, (n, p) in enumerate(events) if n == "rename" and p == ofs + "/hub.ofs"]
            dir_synced = [i for i, (n, p) in enumerate(events) if n == "fsync" and p == ofs]
            assert len(synced) == len(renamed) == 1 and dir_synced, (j, synced, renamed, dir_synced)
            assert synced[0] < renamed[0] < max(dir_synced)
            # The second burst: overwritten in place, then that file's own fdatasync.
            written = [i for i, (n, p) in enumerate(events) if n == "pwrite64" and p == ofs + "/hub.ofs"]
            data_synced = [i for i, (n, p) in enumerate(events) if n == "fdatasync" and p == ofs + "/hub.ofs"]
            assert len(written) == len(data_synced) == 1 and max(dir_synced) < written[0] < data_synced[0]
            assert read_offset_file(f"{ofs}/hub.ofs") == 4
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
    """Rounds of two bursts of commits to a real `sej serve` (the first creates the files, or opens and overwrites
    them; the second overwrites the files kept open), SIGKILLed at once when a batch is seen under way (its first temp
    file, or the first file holding its value), or after a random moment; after each kill every offset file holds a
    value committed in some round (never torn, never anything else), no lower than the last one `sej serve`
    acknowledged; temp files left are commit temp files. A last session commits everything."""
    root = tmp_path / "root"
    journals = journals_root(root, 8)  # 256 journals
    rng = random.Random(int(os.environ.get("SEJ_SEED", "39")))
    acked = dict.fromkeys(journals, -1)
    sent: dict[str, set[int]] = {j: set() for j in journals}
    killed_mid = 0
    rounds = int(os.environ.get("SEJ_SOAK_ROUNDS", "8"))
    head = len(wire.encode(wire.hub_hello(str(root))))
    for r in range(rounds):
        values = (100 + 2 * r, 101 + 2 * r)
        proc = subprocess.Popen([*SERVE, str(root)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.DEVNULL, env=ENV)  # fmt: skip
        try:
            assert proc.stdin is not None and proc.stdout is not None
            proc.stdin.write(wire.encode(wire.hub_hello(str(root))))
            proc.stdin.flush()
            hello = proc.stdout.read(len(wire.MAGIC) + 4)  # the magic and the hello's length: it is up and serving
            assert hello.startswith(wire.MAGIC), hello
            orders = [journals[:], journals[:]]
            for order, value in zip(orders, values, strict=True):
                rng.shuffle(order)
                for j in order:
                    sent[j].add(value)
            stream = calls(root, [(j, values[0]) for j in orders[0]])[head:]
            stream += calls(root, [(j, values[1]) for j in orders[1]], len(journals) + 1, sweep=False)[head:]
            proc.stdin.write(stream)
            proc.stdin.flush()
            if r % 2 == 0:  # as soon as a batch is under way: the first (r % 4 == 0) or the second
                value = values[r % 4 // 2]
                deadline = time.monotonic() + scaled(30)
                for _ in range(1 << 30):
                    if _under_way(root, journals, value):
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
                k = int(m[1]) - 1  # type: ignore[call-overload]
                acked[orders[k // len(journals)][k % len(journals)]] = values[k // len(journals)]
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


def _under_way(root: Path, journals: list[str], value: int) -> bool:
    """Whether a commit of `value` has begun: a temp file, or an offset file that holds it."""
    for j in journals:
        names = _names(root / j / "ofs")
        if any(TEMP_RE.match(n) for n in names):
            return True
        if "hub.ofs" in names:
            try:
                if read_offset_file(str(root / j / "ofs" / "hub.ofs")) == value:
                    return True
            except sej.errors.CorruptionError:  # an empty or cut file is no sign
                pass
    return False


def _names(path: Path) -> list[str]:
    try:
        return os.listdir(path)
    except FileNotFoundError:
        return []
