"""What reaches the kernel when: the write and fsync system calls behind each durability promise.

A child process runs the writer under strace and marks each step by writing a
line to stderr; the test checks which calls on the segment's descriptor fall
between the marks.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys

import pytest

from testing.timing import scaled

from .conftest import REPO

pytestmark = pytest.mark.skipif(
    shutil.which("strace") is None and not os.environ.get("CI"), reason="needs strace (CI installs it)"
)

CHILD = r"""
import os, sys
import sej
from sej.offset import Offset

def mark(name):
    os.write(2, b"MARK " + name.encode() + b"\n")

d, mode = sys.argv[1], sys.argv[2]
w = sej.Writer(d, durability=mode, segment_size=1000)
mark("open")
w.append(b"a" * 100)
mark("append")
w.flush()
mark("flush")
w.append(b"b" * 100)
mark("append2")
w.sync()
mark("sync")
for _ in range(6):
    w.append(b"c" * 100)  # crosses 1000 bytes: the segment rolls over
mark("roll")
w.append(b"d" * 100)
mark("append3")
w.close()
mark("close")
with Offset(d, "reader") as o:
    mark("offset-open")
    o.commit(3)
    mark("commit")
    o.commit(4)
    mark("commit2")
    o.commit(5, sync=False)
    mark("commit-nosync")
    o.sync()
    mark("offset-sync")
"""

CALL = re.compile(r"^\d+\s+(\w+)\((.*)\)\s+=\s+(-?\d+)")
OPEN = re.compile(r'^AT_FDCWD, "([^"]*)"')

Call = tuple[str, str]  # (system call, path of the file it acts on, or "" )


def trace(tmp_path, mode: str) -> dict[str, list[Call]]:
    """The child's calls, grouped by the mark that ends each group."""
    log = tmp_path / "strace.log"
    env = dict(os.environ, PYTHONPATH=str(REPO))
    subprocess.run(
        [
            "strace", "-f", "-qq", "-s", "200", "-o", str(log),
            "-e", "trace=openat,write,pwrite64,fdatasync,fsync,rename",
            sys.executable, "-c", CHILD, str(tmp_path / "j"), mode,
        ],
        check=True, env=env, capture_output=True, timeout=scaled(120),
    )  # fmt: skip
    paths: dict[int, str] = {}  # what each descriptor refers to at this point of the trace
    groups: dict[str, list[Call]] = {}
    current: list[Call] = []
    for line in log.read_text().splitlines():
        m = CALL.match(line)
        if not m:
            continue
        name, args, ret = m.group(1), m.group(2), int(m.group(3))
        if name == "openat":
            o = OPEN.match(args)
            if o and ret >= 0:
                paths[ret] = o.group(1)
                current.append(("openat", o.group(1)))
        elif name == "write" and args.startswith('2, "MARK '):
            groups[args.split('"MARK ')[1].split("\\n")[0]] = current
            current = []
        elif name == "rename":
            current.append(("rename", args.split('", "')[1].rstrip('"')))
        else:
            current.append((name, paths.get(int(args.split(",")[0]), "?")))
    return groups


def on(calls: list[Call], pattern: str) -> list[str]:
    """Data calls (write, pwrite64, fsync, fdatasync) on files whose path matches `pattern`."""
    return [n for n, p in calls if n in ("write", "pwrite64", "fsync", "fdatasync") and re.search(pattern, p)]


SEG0 = r"/jnl/0000000000000000\.jnl$"


def test_buffered_mode(tmp_path) -> None:
    s = trace(tmp_path, "buffered")
    assert on(s["append"], SEG0) == [], "a buffered append stays in the process"
    assert on(s["flush"], SEG0) == ["write"], "flush hands the data to the OS and does not fsync"
    assert on(s["append2"], SEG0) == []
    assert on(s["sync"], SEG0) == ["write", "fdatasync"], "sync writes, then fsyncs"


@pytest.mark.parametrize("mode, expect", [("flush", ["write"]), ("sync", ["write", "fdatasync"])])
def test_flush_and_sync_modes(tmp_path, mode: str, expect: list[str]) -> None:
    s = trace(tmp_path, mode)
    assert on(s["append"], SEG0) == expect
    assert on(s["append2"], SEG0) == expect


def test_rollover_fsyncs_the_segment_and_the_new_name(tmp_path) -> None:
    roll = trace(tmp_path, "buffered")["roll"]
    events = [(n, p) for n, p in roll if re.search(r"/jnl(/[0-9a-f]{16}\.jnl)?$", p)]
    fsync_old = next(i for i, (n, p) in enumerate(events) if n == "fsync" and re.search(SEG0, p))
    new_seg = next(i for i, (n, p) in enumerate(events) if n == "openat" and p.endswith("/jnl/0000000000000008.jnl"))
    fsync_dir = next(i for i, (n, p) in enumerate(events) if n == "fsync" and p.endswith("/jnl"))
    assert fsync_old < new_seg < fsync_dir, "old segment fsynced, then the new one created and its name fsynced"
    assert not any(n == "write" and p.endswith("0000000000000008.jnl") for n, p in events[: fsync_dir + 1])


def test_close_fsyncs_and_offset_commits_overwrite_in_place(tmp_path) -> None:
    """An offset commit is one write of its 8 bytes in place and an fdatasync (the first one also fsyncs
    ofs/, whose new entry it made); without sync, only the write, and `sync()` is the fdatasync."""
    s = trace(tmp_path, "buffered")
    assert on(s["close"], r"/jnl/0000000000000008\.jnl$") == ["write", "fdatasync"]
    first = [(n, p) for n, p in s["commit"] if n != "openat"]
    assert first == [("pwrite64", first[0][1]), ("fdatasync", first[0][1]), ("fsync", first[2][1])]
    assert first[0][1].endswith("/ofs/reader.ofs") and first[2][1].endswith("/ofs")
    ofs = r"/ofs/reader\.ofs$"
    assert [n for n, _ in s["commit2"] if n != "openat"] == ["pwrite64", "fdatasync"]
    assert on(s["commit2"], ofs) == ["pwrite64", "fdatasync"]
    assert on(s["commit-nosync"], ofs) == ["pwrite64"] and [n for n, _ in s["commit-nosync"]] == ["openat", "pwrite64"]
    assert on(s["offset-sync"], ofs) == ["fdatasync"]
    assert not any(n == "rename" for g in ("commit", "commit2", "commit-nosync") for n, _ in s[g])
