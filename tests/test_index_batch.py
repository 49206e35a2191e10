"""The writer's index file while a buffered writer spills: entries wait for a batch, never point past the data."""

from __future__ import annotations

import errno
import os
import subprocess
import sys

import pytest

import sej
from sej import index as idx
from sej.layout import index_path, segment_path


def on_disk(jdir: str) -> list[idx.Entry]:
    loaded = idx.load(index_path(jdir, 0), 0)
    assert loaded is not None
    return [loaded[i] for i in range(len(loaded))]


def assert_behind_data(jdir: str) -> None:
    """Every entry in the file names a frame the segment file holds whole, at its position."""
    data = open(segment_path(jdir, 0), "rb").read()
    for e in on_disk(jdir):
        assert e.position < len(data)
        assert int.from_bytes(data[e.position : e.position + 8], "big") == e.offset


@pytest.mark.parametrize("many", [False, True])
def test_spills_let_entries_wait_and_flush_writes_them_all(jdir: str, many: bool) -> None:
    value = b"v" * 200  # 226-byte frames: an entry every 19 frames, a 64 KiB spill every 290
    w = sej.Writer(jdir, buffer_size=1 << 16)
    seg = segment_path(jdir, 0)
    sent = 0

    def put(n: int) -> None:
        nonlocal sent
        if many:
            w.append_many([value] * n)
        else:
            for _ in range(n):
                w.append(value)
        sent += n

    put(2000)  # about 440 KiB: several spills, about 110 entries, fewer than a batch
    assert os.path.getsize(seg) > 4 << 16, "the buffer spilled"
    assert len(on_disk(jdir)) < len(w._index.index) < idx.BATCH, "the spills left the entries waiting"
    assert_behind_data(jdir)
    w.flush()
    assert on_disk(jdir) == [w._index.index[i] for i in range(len(w._index.index))], "flush writes them all"
    put(8000)  # about 1.7 MiB more: spills alone write batches
    written = len(on_disk(jdir))
    assert written >= len(w._index.index) - idx.BATCH - (1 << 16) // idx.INTERVAL
    assert written > idx.BATCH
    assert_behind_data(jdir)
    w.close()
    assert len(on_disk(jdir)) == len(w._index.index)
    with sej.Scanner(jdir, sent - 3, timeout=0) as s:
        assert [m.offset for m in s] == [sent - 3, sent - 2, sent - 1]


@pytest.mark.parametrize("mode", ["flush", "sync"])
def test_write_through_modes_write_the_index_with_each_append(jdir: str, mode: str) -> None:
    with sej.Writer(jdir, durability=mode) as w:  # type: ignore[arg-type]
        for _ in range(100):
            w.append(b"v" * 200)
        assert on_disk(jdir) == [w._index.index[i] for i in range(len(w._index.index))]
        w.append_many([b"v" * 200] * 100)
        assert on_disk(jdir) == [w._index.index[i] for i in range(len(w._index.index))]


CHILD = r"""
import os, resource, signal, sys
import sej
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG, as on a full disk
w = sej.Writer(sys.argv[1], buffer_size=1 << 16)
w.append(b"x" * 1000)
resource.setrlimit(resource.RLIMIT_FSIZE, (300_000, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
try:
    w.append_many([b"v" * 1000] * 2000)  # 2 MiB beside a buffered frame: the buffer, then the batch, then the index
except OSError as e:
    print(e.errno, flush=True)
os._exit(0)  # as if killed: nothing more written
"""


def test_a_batch_that_fails_to_write_leaves_no_index_entry_past_the_data(jdir: str) -> None:
    """append_many of a batch that does not fit beside what is buffered: its index entries are written only
    after the batch, so a write that fails part way (a full disk) leaves none pointing past the data."""
    out = subprocess.run([sys.executable, "-c", CHILD, jdir], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.split() == [str(errno.EFBIG)], out.stderr
    assert 0 < os.path.getsize(segment_path(jdir, 0)) <= 300_000
    assert_behind_data(jdir)
    with pytest.warns(sej.CorruptionWarning), sej.Writer(jdir) as w:  # recovery cuts the torn tail
        assert w.next_offset >= 1
    assert_behind_data(jdir)
