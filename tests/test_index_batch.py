"""The writer's index file while a buffered writer spills: entries wait for a batch, never point past the data."""

from __future__ import annotations

import os

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


def test_a_batch_bigger_than_the_free_buffer_writes_its_entries_after_its_frames(jdir: str) -> None:
    """append_many of a batch that does not fit beside what is buffered: the buffer, the batch, then the index."""
    w = sej.Writer(jdir, buffer_size=1 << 16)
    w.append(b"x" * 1000)
    w.append_many([b"v" * 1000] * 2000)  # 2 MiB: straight out after the buffer
    assert len(on_disk(jdir)) > idx.BATCH
    assert_behind_data(jdir)
    w.close()
