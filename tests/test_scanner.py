"""Scanner: seeking (index, time), timeouts, following, incomplete and corrupt data."""

from __future__ import annotations

import datetime as dt
import os
import re
import shutil
import struct
import threading
import time

import pytest

import sej
from sej.layout import index_path
from sej.message import encode
from testing.timing import scaled, wait_until_scanner_waits


def build(jdir: str, n: int, segment_size: int = 1 << 30, **kw) -> None:
    with sej.Writer(jdir, segment_size=segment_size) as w:
        for i in range(n):
            w.append(b"value-%05d" % i, key=b"k%d" % (i % 7), timestamp=10_000 + i, **kw)


def offsets(s: sej.Scanner) -> list[int]:
    return [m.offset for m in s]


def test_seek_to_every_offset_across_segments(jdir: str) -> None:
    build(jdir, 400, segment_size=2000)
    assert len(sej.list_segments(jdir)) >= 8
    for off in range(0, 401, 7):
        with sej.Scanner(jdir, off, timeout=0) as s:
            got = offsets(s)
            assert got == list(range(off, 400))
            assert s.offset == 400


def test_seek_inside_a_big_segment_uses_the_index(jdir: str) -> None:
    build(jdir, 20_000)  # one segment of about 760 KiB
    (seg,) = sej.list_segments(jdir)
    entries = (os.path.getsize(index_path(jdir, 0)) - 16) // 24
    assert entries >= os.path.getsize(seg.path) // 4096 - 1
    with sej.Scanner(jdir, 12_345, timeout=0) as s:
        m = next(s)
        assert (m.offset, m.value) == (12_345, b"value-12345")


def test_missing_or_stale_index_is_rebuilt(jdir: str) -> None:
    build(jdir, 3000, segment_size=40_000)
    segs = sej.list_segments(jdir)
    first = segs[0]
    ipath = index_path(jdir, first.first_offset)
    good = open(ipath, "rb").read()
    os.remove(ipath)
    with sej.Scanner(jdir, 500, timeout=0) as s:
        assert next(s).offset == 500
    assert open(ipath, "rb").read() == good, "a finished segment's index is rebuilt and saved"
    # A stale index (entries pointing at the wrong positions) is not trusted.
    bad = bytearray(good)
    for i in range(16, len(bad) - 24, 24):
        struct.pack_into(">Q", bad, i + 8, struct.unpack_from(">Q", bad, i + 8)[0] + 5)
    open(ipath, "wb").write(bytes(bad))
    with sej.Scanner(jdir, 700, timeout=0) as s:
        assert [m.offset for m in s][:3] == [700, 701, 702]
    shutil.rmtree(os.path.join(jdir, "idx"))
    with sej.Scanner(jdir, 2999, timeout=0) as s:
        assert offsets(s) == [2999]


def test_first_last_and_out_of_range(jdir: str) -> None:
    build(jdir, 100, segment_size=1000)
    segs = sej.list_segments(jdir)
    os.remove(segs[0].path)  # retention removed the oldest segment
    first = segs[1].first_offset
    with pytest.raises(sej.OffsetOutOfRangeError) as e:
        sej.Scanner(jdir, 0)
    assert e.value.first == first and e.value.next == 100 and "offset 0" in str(e.value)
    with sej.Scanner(jdir, "first", timeout=0) as s:
        assert offsets(s) == list(range(first, 100))
    with sej.Scanner(jdir, "last", timeout=0) as s:
        assert offsets(s) == [] and s.offset == 100
    with sej.Scanner(jdir, 100, timeout=0) as s:
        assert offsets(s) == []
    with pytest.raises(sej.OffsetOutOfRangeError, match="offset 101"):
        sej.Scanner(jdir, 101)


@pytest.mark.parametrize(
    "kwargs, needle",
    [
        (dict(offset=-1), "offset must be"),
        (dict(offset="middle"), "offset must be"),
        (dict(offset=1.5), "offset must be"),
        (dict(timeout=-1), "timeout"),
        (dict(timeout="1s"), "timeout"),
        (dict(batch=0), "batch"),
    ],
)
def test_bad_arguments(jdir: str, kwargs: dict, needle: str) -> None:
    build(jdir, 3)
    with pytest.raises(sej.InvalidArgumentError, match=needle):
        sej.Scanner(jdir, **kwargs)


def test_missing_directory(tmp_path) -> None:
    with pytest.raises(sej.InvalidArgumentError, match="does not exist"):
        sej.Scanner(str(tmp_path / "nope"))


def test_a_typo_is_no_empty_journal_and_a_root_is_no_journal(tmp_path) -> None:
    """A missing directory raises naming it (not offset 0, no messages); so does a root of journals, which these
    functions and the Scanner do not read; a journal directory without segments yet is a real empty journal."""
    nope = str(tmp_path / "nope")
    for call in (lambda: sej.next_offset(nope), lambda: sej.first_offset(nope), lambda: sej.last_messages(nope, 5),
                 lambda: sej.Scanner.at_time(nope, 0), lambda: sej.Scanner(nope)):  # fmt: skip
        with pytest.raises(sej.InvalidArgumentError, match=re.escape(f"{nope} does not exist")):
            call()
    root = str(tmp_path / "root")
    with sej.ShardedWriter(root, "ev", shard_bit=1) as sw:
        for i in range(8):
            sw.append(b"v%d" % i, key=b"key%d" % i)
    for call in (lambda: sej.next_offset(root), lambda: sej.first_offset(root), lambda: sej.last_messages(root, 5),
                 lambda: sej.Scanner(root, 0, timeout=0), lambda: sej.Offset(root, "billing")):  # fmt: skip
        with pytest.raises(sej.InvalidArgumentError, match=re.escape(f"{root} is a root of journals") + ".*ev.1.000"):
            call()
    # Refused without leaving anything in the root (an ofs/ there is a directory that is no journal: every pass
    # of a hub over the root warns of it).
    assert sorted(os.listdir(root)) == ["ev.1.000", "ev.1.001"]
    with pytest.raises(sej.InvalidArgumentError, match=re.escape(f"{nope} does not exist")):
        sej.Offset(nope, "billing")
    assert not os.path.exists(nope)
    empty = str(tmp_path / "empty")
    os.mkdir(empty)  # a journal's directory before its writer first opens it
    assert (sej.next_offset(empty), sej.first_offset(empty), sej.last_messages(empty, 5)) == (0, 0, [])
    sej.Writer(empty).close()  # and after: one empty segment
    assert (sej.next_offset(empty), sej.first_offset(empty), sej.last_messages(empty, 5)) == (0, 0, [])
    with sej.Scanner(empty, 0, timeout=0) as s:
        assert list(s) == []


def test_timeout_ends_iteration_and_iterating_again_continues(jdir: str) -> None:
    w = sej.Writer(jdir)
    w.append(b"a")
    w.flush()
    s = sej.Scanner(jdir, 0, timeout=0.3)
    t0 = time.monotonic()
    assert [m.value for m in s] == [b"a"]
    waited = time.monotonic() - t0
    assert 0.25 <= waited < scaled(2.0)
    w.append(b"b")
    w.append(b"c")
    w.flush()
    assert [m.value for m in s] == [b"b", b"c"]
    assert s.offset == 3
    w.close()
    s.close()
    with pytest.raises(sej.ClosedError):
        next(s)


def test_breaking_out_keeps_the_position(jdir: str) -> None:
    build(jdir, 50)
    with sej.Scanner(jdir, 0, timeout=0) as s:
        for m in s:
            if m.offset == 9:
                break
        assert s.offset == 10
        assert next(s).offset == 10
        assert offsets(s) == list(range(11, 50))


def test_follows_a_writer_thread_across_rollovers(jdir: str) -> None:
    n = 3000
    w = sej.Writer(jdir, segment_size=5000, durability="flush")

    def produce() -> None:
        for i in range(n):
            w.append(b"m%d" % i)
            if i % 100 == 0:
                time.sleep(0.001)

    with sej.Scanner(jdir, 0, timeout=scaled(5)) as s:
        t = threading.Thread(target=produce)
        t.start()
        got = []
        for m in s:
            got.append(m)
            if len(got) == n:
                break
        t.join(scaled(30))
    w.close()
    assert [m.offset for m in got] == list(range(n))
    assert [m.value for m in got] == [b"m%d" % i for i in range(n)]
    assert len(sej.list_segments(jdir)) > 10


def test_waits_for_a_journal_that_does_not_exist_yet(tmp_path) -> None:
    d = str(tmp_path / "j")
    os.mkdir(d)
    s = sej.Scanner(d, 0, timeout=scaled(30))
    waiting = threading.current_thread()
    created: list[float] = []

    def later() -> None:
        wait_until_scanner_waits(waiting)  # in next(s) below, for the journal to appear
        created.append(time.monotonic())
        with sej.Writer(d) as w:
            w.append(b"first")

    t = threading.Thread(target=later)
    t.start()
    m = next(s)
    got_at = time.monotonic()
    t.join()
    assert created, "the scanner never waited"
    assert m.value == b"first" and got_at - created[0] < scaled(4), "noticed by the watch, not at the timeout"
    s.close()


def test_incomplete_last_message_is_waited_for_never_returned(jdir: str) -> None:
    build(jdir, 3)
    (seg,) = sej.list_segments(jdir)
    frame = encode(3, 1, 0, b"key", b"a value that arrives in two writes")
    with open(seg.path, "ab") as f:
        f.write(frame[:20])
    s = sej.Scanner(jdir, 0, timeout=0.2)
    assert offsets(s) == [0, 1, 2]
    assert offsets(s) == []
    with open(seg.path, "ab") as f:
        f.write(frame[20:])
    got = list(s)
    assert [(m.offset, m.value) for m in got] == [(3, b"a value that arrives in two writes")]
    s.close()


def test_truncation_under_the_scanner_fails_fast(jdir: str) -> None:
    build(jdir, 100)
    (seg,) = sej.list_segments(jdir)
    s = sej.Scanner(jdir, 0, timeout=scaled(30))
    for m in s:
        if m.offset == 99:
            break
    result: list[BaseException] = []

    def wait() -> None:
        try:
            next(s)
        except BaseException as e:
            result.append(e)

    t = threading.Thread(target=wait)
    t.start()
    wait_until_scanner_waits(t)  # for more data
    t0 = time.monotonic()
    os.truncate(seg.path, os.path.getsize(seg.path) // 2)
    t.join(scaled(10))
    assert time.monotonic() - t0 < scaled(2.0)
    assert len(result) == 1 and isinstance(result[0], sej.TruncatedError)
    assert seg.path in str(result[0])
    s.close()


def test_removed_segment_under_the_scanner(jdir: str) -> None:
    build(jdir, 10)
    (seg,) = sej.list_segments(jdir)
    with sej.Scanner(jdir, 0, timeout=0) as s:
        assert len(offsets(s)) == 10
        os.remove(seg.path)
        with pytest.raises(sej.TruncatedError, match="removed"):
            next(s)


def test_corrupt_frame_in_the_middle_is_a_corruption_error(jdir: str) -> None:
    build(jdir, 100)
    (seg,) = sej.list_segments(jdir)
    with open(seg.path, "r+b") as f:
        f.seek(30 * 40 + 3)
        f.write(b"\xff\xff\xff\xff")
    with sej.Scanner(jdir, 0, timeout=0) as s:
        got = []
        with pytest.raises(sej.CorruptionError) as e:
            for m in s:
                got.append(m.offset)
    assert e.value.path == seg.path and got == list(range(len(got)))


def test_gap_between_segments_is_reported(jdir: str) -> None:
    build(jdir, 100, segment_size=400)
    segs = sej.list_segments(jdir)
    assert len(segs) > 4
    os.remove(segs[2].path)
    with sej.Scanner(jdir, 0, timeout=0) as s, pytest.raises(sej.CorruptionError, match="gap|segment ends"):
        list(s)


def test_at_time_with_out_of_order_timestamps(jdir: str) -> None:
    stamps = [100, 300, 200, 250, 400, 350, 500]
    with sej.Writer(jdir) as w:
        w.append(b"none", timestamp=sej.NO_TIMESTAMP)
        for t in stamps:
            w.append(b"%d" % t, timestamp=t)
    assert sej.offset_at_time(jdir, 0) == 1
    for ts in (1, 100, 101, 250, 260, 301, 400, 450, 500):
        expect = next((i + 1 for i, t in enumerate(stamps) if t >= ts), 8)
        assert sej.offset_at_time(jdir, ts) == expect, ts
    assert sej.offset_at_time(jdir, 501) == 8
    with sej.Scanner.at_time(jdir, 260, timeout=0) as s:
        assert [m.value for m in s] == [b"300", b"200", b"250", b"400", b"350", b"500"]


def test_at_time_across_big_segments_and_datetime(jdir: str) -> None:
    base = 1_700_000_000 * 10**9
    with sej.Writer(jdir, segment_size=50_000) as w:
        for i in range(5000):
            w.append(b"x" * 30, timestamp=base + i * 10**6)  # one per millisecond
    for i in (0, 1, 1234, 4999):
        assert sej.offset_at_time(jdir, base + i * 10**6) == i
        assert sej.offset_at_time(jdir, base + i * 10**6 - 1) == i
    when = dt.datetime.fromtimestamp(1_700_000_002, tz=dt.UTC)
    with sej.Scanner.at_time(jdir, when, timeout=0) as s:
        assert next(s).offset == 2000
    with pytest.raises(sej.InvalidArgumentError, match="timezone-aware"):
        sej.Scanner.at_time(jdir, dt.datetime(2020, 1, 1))


def test_last_messages_reads_backward_across_segments(jdir: str) -> None:
    build(jdir, 100, segment_size=300)
    last = sej.last_messages(jdir, 25)
    assert [m.offset for m in last] == list(range(75, 100))
    assert [m.value for m in last] == [b"value-%05d" % i for i in range(75, 100)]
    assert len(sej.last_messages(jdir, 1000)) == 100
    assert sej.last_messages(jdir, 0) == []
    with pytest.raises(sej.InvalidArgumentError):
        sej.last_messages(jdir, -1)


def test_last_messages_checks_the_offsets_it_reads_backward(jdir: str) -> None:
    """The last frame of a finished segment read backward must carry the offset before the next segment's.

    Found by tests/test_fuzz.py: a flipped byte in that frame's offset field was returned as a message
    of offset 2751463425 (the journal holds offsets 0 and 1).
    """
    with sej.Writer(jdir, segment_size=50) as w:
        w.append(b"", timestamp=1)
        w.append(b"\x07", timestamp=2)  # 26 + 27 bytes: the segment is full, the writer rolls to an empty one
    assert [os.path.getsize(s.path) for s in sej.list_segments(jdir)] == [53, 0]
    seg = sej.list_segments(jdir)[0].path
    with open(seg, "r+b") as f:
        f.seek(26 + 4)  # inside the offset field of frame 1
        f.write(b"\xa4")
    with pytest.raises(sej.CorruptionError, match="reading backward"):
        sej.last_messages(jdir, 1)
    with open(seg, "r+b") as f:  # and a wrong offset in the live segment's last frame
        f.seek(30)
        f.write(b"\x00")
    with sej.Writer(jdir, segment_size=1 << 20) as w:
        w.append(b"x", timestamp=3)
        w.append(b"y", timestamp=4)
    last = sej.list_segments(jdir)[-1].path
    with open(last, "r+b") as f:
        f.seek(27 + 7)  # the low byte of the last frame's offset (frame 0 is 27 bytes)
        f.write(b"\x09")
    assert [m.offset for m in sej.last_messages(jdir, 5)] == [0, 1, 2]  # the tail walk stops before it
    assert sej.next_offset(jdir) == 3


def test_last_messages_reads_backward_only_what_reads_forward(jdir: str) -> None:
    """Found by tests/test_fuzz.py: a frame appended after the end of a finished segment, carrying the
    offset of that segment's last message, was returned by last_messages(1); an emptied segment
    between two others (a gap of one offset) went unnoticed."""
    with sej.Writer(jdir, segment_size=50) as w:
        for v in (b"a", b"b", b"c", b"d"):
            w.append(v, timestamp=1)
    segs = sej.list_segments(jdir)  # [0, 1] [2, 3] [] (27-byte frames, rolled at 54 bytes)
    assert [s.first_offset for s in segs] == [0, 2, 4]
    with open(segs[1].path, "ab") as f:
        f.write(encode(3, 1, 0, b"", b"forged"))  # after the whole frames of a finished segment
    with pytest.raises(sej.CorruptionError, match="do not read forward"):
        sej.last_messages(jdir, 1)
    os.truncate(segs[1].path, 0)  # now offsets 2 and 3 are gone: a gap between 1 and 4
    with pytest.raises(sej.CorruptionError, match="gap"):
        sej.last_messages(jdir, 3)


def test_big_messages_larger_than_the_read_chunk(jdir: str) -> None:
    big = os.urandom(3 << 20)
    with sej.Writer(jdir) as w:
        w.append(b"small")
        w.append(big, key=b"big")
        w.append(b"small2")
    with sej.Scanner(jdir, 0, timeout=0) as s:
        assert [m.value for m in s] == [b"small", big, b"small2"]
    with sej.Scanner(jdir, 2, timeout=0) as s:
        assert next(s).value == b"small2"
    assert [m.value for m in sej.last_messages(jdir, 2)] == [big, b"small2"]
    with sej.Writer(jdir) as w:
        assert w.next_offset == 3


def test_rollover_between_read_and_directory_check_is_not_a_gap(jdir: str, monkeypatch) -> None:
    """The writer fills and rolls the segment just after the scanner found it drained.

    The interleaving is pinned by running the writer's append inside the scanner's
    existence check for the next segment.
    """
    w = sej.Writer(jdir, segment_size=200, durability="flush")
    w.append(b"a" * 10)
    s = sej.Scanner(jdir, timeout=0)
    assert offsets(s) == [0]
    s._wakeup.created = True  # as after a directory event
    real_exists = os.path.exists

    def exists_after_a_rollover(path: str) -> bool:
        monkeypatch.setattr(os.path, "exists", real_exists)
        w.append(b"b" * 200)  # completes segment 0 and creates segment 2
        return real_exists(path)

    monkeypatch.setattr(os.path, "exists", exists_after_a_rollover)
    assert offsets(s) == [1]
    w.append(b"c")
    w.flush()
    assert offsets(s) == [2]
    s.close()
    w.close()


def test_names_that_only_look_like_segments_are_ignored(jdir: str) -> None:
    build(jdir, 5)
    os.mkdir(os.path.join(jdir, "jnl", "00000000000000ff.jnl"))  # a directory, not a segment
    for stray in ("00000000000000FF.jnl", "0000000000000100.jnl.bak", "x.jnl", "000000000000001.jnl"):
        open(os.path.join(jdir, "jnl", stray), "wb").close()
    assert [s.first_offset for s in sej.list_segments(jdir)] == [0]
    with sej.Scanner(jdir, 0, timeout=0) as s:
        assert offsets(s) == [0, 1, 2, 3, 4]
    with sej.Writer(jdir) as w:
        assert w.append(b"more") == 5


def test_time_lookup_reports_corruption_instead_of_skipping_it(jdir: str) -> None:
    with sej.Writer(jdir, segment_size=200) as w:
        for i in range(12):
            w.append(b"value %02d" % i, timestamp=1000 + i)
    seg = sej.list_segments(jdir)[0].path
    data = bytearray(open(seg, "rb").read())
    data[34 + 17] = 0x80  # the second frame's key size: negative
    open(seg, "wb").write(bytes(data))
    shutil.rmtree(os.path.join(jdir, "idx"))
    with pytest.raises(sej.CorruptionError) as e:
        sej.offset_at_time(jdir, 1003)
    assert e.value.path == seg
