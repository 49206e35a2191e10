"""Writer: appending, rollover, durability modes, locking, bad input."""

from __future__ import annotations

import os
import threading

import pytest

import sej
from sej.layout import segment_name
from sej.message import OVERHEAD
from testing.timing import scaled

from .conftest import run_python


def read_all(d: str) -> list[sej.Message]:
    with sej.Scanner(d, "first", timeout=0) as s:
        return list(s)


def test_append_returns_consecutive_offsets_and_round_trips(jdir: str) -> None:
    with sej.Writer(jdir) as w:
        assert w.next_offset == 0
        offs = [w.append(b"v%d" % i, key=b"k%d" % i, type=i % 256, timestamp=1000 + i) for i in range(300)]
        assert offs == list(range(300))
        assert w.next_offset == 300
    msgs = read_all(jdir)
    assert [(m.offset, m.timestamp, m.type, m.key, m.value) for m in msgs] == [
        (i, 1000 + i, i % 256, b"k%d" % i, b"v%d" % i) for i in range(300)
    ]


def test_default_timestamp_is_now_and_sentinel_reads_as_none(jdir: str) -> None:
    import time

    before = time.time_ns()
    with sej.Writer(jdir) as w:
        w.append(b"now")
        w.append(b"none", timestamp=sej.NO_TIMESTAMP)
    after = time.time_ns()
    now, none = read_all(jdir)
    assert now.timestamp is not None and before <= now.timestamp <= after
    assert none.timestamp is None


def test_rollover_like_go_a_segment_reaching_the_size_is_closed(jdir: str) -> None:
    frame = OVERHEAD + 1 + 10  # key b"k", 10-byte value: 37 bytes
    with sej.Writer(jdir, segment_size=100) as w:
        for _ in range(10):
            w.append(b"0123456789", key=b"k", timestamp=0)
    segs = sej.list_segments(jdir)
    # 37, 74, 111 >= 100: three messages per segment, the third crosses the limit.
    assert [s.first_offset for s in segs] == [0, 3, 6, 9]
    assert [os.path.basename(s.path) for s in segs] == [segment_name(o) for o in (0, 3, 6, 9)]
    assert [os.path.getsize(s.path) for s in segs] == [3 * frame, 3 * frame, 3 * frame, frame]
    assert [m.offset for m in read_all(jdir)] == list(range(10))


def test_writer_reopens_and_continues_from_next_offset(jdir: str) -> None:
    with sej.Writer(jdir, segment_size=200) as w:
        w.append_many([b"x" * 20] * 25)
    with sej.Writer(jdir, segment_size=200) as w:
        assert w.next_offset == 25
        assert w.recovered is None
        assert w.append(b"y") == 25
    assert [m.offset for m in read_all(jdir)] == list(range(26))


def test_reopen_on_a_full_last_segment_rolls_after_the_next_append_like_go(jdir: str) -> None:
    with sej.Writer(jdir) as w:
        w.append_many([b"x" * 50] * 10)
    with sej.Writer(jdir, segment_size=100) as w:
        w.append(b"after")
        w.append(b"next")
    # "after" brings segment 0 past 100 bytes: it rolls, and "next" goes into segment 11.
    assert [s.first_offset for s in sej.list_segments(jdir)] == [0, 11]


def test_append_many_forms(jdir: str) -> None:
    with sej.Writer(jdir, segment_size=500) as w:
        r1 = w.append_many([b"a", b"bb", b"ccc"], key=b"same", type=7, timestamp=5)
        r2 = w.append_many((v for v in [b"d", b"e"]), keys=[b"k1", b"k2"], timestamp=6)
        r3 = w.append_many([])
        r4 = w.append_many([bytes([i]) * 40 for i in range(40)], timestamp=7)  # crosses several rollovers
    assert (r1, r2, r3) == (range(0, 3), range(3, 5), range(5, 5))
    assert r4 == range(5, 45)
    msgs = read_all(jdir)
    assert [(m.key, m.value, m.type, m.timestamp) for m in msgs[:5]] == [
        (b"same", b"a", 7, 5),
        (b"same", b"bb", 7, 5),
        (b"same", b"ccc", 7, 5),
        (b"k1", b"d", 0, 6),
        (b"k2", b"e", 0, 6),
    ]
    assert [m.value for m in msgs[5:]] == [bytes([i]) * 40 for i in range(40)]
    assert len(sej.list_segments(jdir)) > 3


def test_append_many_and_append_write_identical_bytes(tmp_path) -> None:
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    vals = [os.urandom(n) for n in range(0, 300, 7)]
    with sej.Writer(a, segment_size=1000) as w:
        for v in vals:
            w.append(v, key=b"key", type=2, timestamp=123)
    with sej.Writer(b, segment_size=1000) as w:
        w.append_many(vals, key=b"key", type=2, timestamp=123)
    sa, sb = sej.list_segments(a), sej.list_segments(b)
    assert [s.first_offset for s in sa] == [s.first_offset for s in sb]
    for x, y in zip(sa, sb):
        assert open(x.path, "rb").read() == open(y.path, "rb").read()


def test_start_offset_applies_to_a_new_journal_only(jdir: str) -> None:
    with sej.Writer(jdir, start_offset=1000) as w:
        assert w.append(b"x") == 1000
    assert os.path.basename(sej.list_segments(jdir)[0].path) == "00000000000003e8.jnl"
    with sej.Writer(jdir, start_offset=5) as w:
        assert w.next_offset == 1001
    assert sej.first_offset(jdir) == 1000 and sej.next_offset(jdir) == 1001


@pytest.mark.parametrize(
    "kwargs, needle",
    [
        (dict(value="text"), "value must be bytes"),
        (dict(value=b"v", key="k"), "key must be bytes"),
        (dict(value=b"v", key=b"k" * 128), "key is 128 bytes"),
        (dict(value=b"v", type=256), "type must be an int in 0..255, got 256"),
        (dict(value=b"v", type=-1), "got -1"),
        (dict(value=b"v", timestamp=1.5), "timestamp must be int"),
        (dict(value=b"v", timestamp=2**63), "timestamp must be int"),
        (dict(value=None), "value must be bytes"),
        (dict(value=memoryview(b"abcd").cast("I")), "value must be bytes"),
    ],
)
def test_bad_input_is_a_clear_error_and_writes_nothing(jdir: str, kwargs: dict, needle: str) -> None:
    with sej.Writer(jdir) as w:
        w.append(b"ok")
        with pytest.raises(sej.InvalidArgumentError) as e:
            w.append(**kwargs)
        assert needle in str(e.value)
        assert w.next_offset == 1
        w.append(b"still ok")
    assert [m.value for m in read_all(jdir)] == [b"ok", b"still ok"]


def test_bad_input_to_append_many_is_a_clear_error(jdir: str) -> None:
    with sej.Writer(jdir) as w:
        with pytest.raises(sej.InvalidArgumentError, match="value must be bytes"):
            w.append_many([b"a", "b"])
        with pytest.raises(sej.InvalidArgumentError, match="keys has 1 items but values has 2"):
            w.append_many([b"a", b"b"], keys=[b"k"])
        with pytest.raises(sej.InvalidArgumentError, match="type must be"):
            w.append_many([b"a"], type=300)
        # The valid prefix of a failed batch is kept, with consistent offsets.
        w.append(b"next")
    msgs = read_all(jdir)
    assert [m.offset for m in msgs] == list(range(len(msgs)))
    assert msgs[-1].value == b"next"


@pytest.mark.parametrize(
    "kwargs, needle",
    [
        (dict(segment_size=0), "segment_size"),
        (dict(segment_size="big"), "segment_size"),
        (dict(durability="always"), "durability"),
        (dict(buffer_size=-1), "buffer_size"),
        (dict(start_offset=-3), "start_offset"),
    ],
)
def test_bad_writer_options(jdir: str, kwargs: dict, needle: str) -> None:
    with pytest.raises(sej.InvalidArgumentError, match=needle):
        sej.Writer(jdir, **kwargs)


def test_journal_path_that_is_a_file(tmp_path) -> None:
    p = tmp_path / "file"
    p.write_text("x")
    with pytest.raises(sej.InvalidArgumentError, match="not a directory"):
        sej.Writer(str(p))
    with pytest.raises(sej.InvalidArgumentError):
        sej.Writer(b"/tmp/bytes")  # type: ignore[arg-type]


def test_second_writer_in_same_process_is_locked_out(jdir: str) -> None:
    w = sej.Writer(jdir)
    with pytest.raises(sej.LockedError) as e:
        sej.Writer(jdir)
    assert os.path.join(jdir, "jnl.lck") in str(e.value)
    w.close()
    assert os.path.exists(os.path.join(jdir, "jnl.lck")), "the lock file is never deleted"
    sej.Writer(jdir).close()


def test_closed_writer_raises(jdir: str) -> None:
    w = sej.Writer(jdir)
    w.close()
    w.close()  # idempotent
    for call in (lambda: w.append(b"x"), w.flush, w.sync, lambda: w.append_many([b"x"])):
        with pytest.raises(sej.ClosedError):
            call()


# -- durability: what another process sees after append, flush and sync --------------------------

SIZE_OF = "import os,sys; print(sum(os.path.getsize(os.path.join(sys.argv[1], f)) for f in os.listdir(sys.argv[1])))"


def os_visible_bytes(d: str) -> int:
    """Bytes of segments as another process sees them (what the OS has)."""
    return int(run_python(SIZE_OF, os.path.join(d, "jnl")).stdout)


def test_buffered_append_stays_in_process_until_flush(jdir: str) -> None:
    with sej.Writer(jdir, durability="buffered") as w:
        w.append(b"x" * 100)
        assert os_visible_bytes(jdir) == 0, "a buffered append is only in this process"
        w.flush()
        assert os_visible_bytes(jdir) == OVERHEAD + 100
        w.append(b"y" * 100)
        w.sync()
        assert os_visible_bytes(jdir) == 2 * (OVERHEAD + 100)


def test_buffered_mode_spills_when_buffer_fills(jdir: str) -> None:
    with sej.Writer(jdir, buffer_size=1000) as w:
        for _ in range(7):
            w.append(b"x" * 100)
        assert os_visible_bytes(jdir) == 0  # 7 * 126 = 882 bytes buffered
        w.append(b"x" * 100)  # the buffer reaches 1008 >= 1000 bytes
        assert os_visible_bytes(jdir) == 8 * (OVERHEAD + 100)


@pytest.mark.parametrize("mode", ["flush", "sync"])
def test_flush_and_sync_modes_write_through_each_append(jdir: str, mode: str) -> None:
    with sej.Writer(jdir, durability=mode) as w:
        w.append(b"x" * 100)
        assert os_visible_bytes(jdir) == OVERHEAD + 100


def test_sync_mode_group_commit_from_many_threads(jdir: str) -> None:
    n_threads, per_thread = 8, 40
    errors: list[BaseException] = []
    with sej.Writer(jdir, durability="sync", segment_size=3000) as w:

        def work(t: int) -> None:
            try:
                for i in range(per_thread):
                    w.append(b"%d:%d" % (t, i), key=b"t%d" % t)
            except BaseException as e:  # pragma: no cover - reported below
                errors.append(e)

        threads = [threading.Thread(target=work, args=(t,)) for t in range(n_threads)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(scaled(60))
        assert w._commit.durable == w._written, "every acknowledged byte was fsynced"
    assert not errors
    msgs = read_all(jdir)
    assert [m.offset for m in msgs] == list(range(n_threads * per_thread))
    for t in range(n_threads):
        mine = [m.value for m in msgs if m.key == b"t%d" % t]
        assert mine == [b"%d:%d" % (t, i) for i in range(per_thread)], "each thread's order is kept"
    assert len(sej.list_segments(jdir)) > 1


def test_close_syncs_and_flushes(jdir: str) -> None:
    w = sej.Writer(jdir)
    w.append(b"z" * 10)
    w.close()
    assert os_visible_bytes(jdir) == OVERHEAD + 10


def test_an_unclosed_writer_is_flushed_and_unlocked_when_collected(jdir: str) -> None:
    w = sej.Writer(jdir)
    w.append(b"not lost")
    with pytest.warns(ResourceWarning, match="unclosed Writer"):
        del w
    assert [m.value for m in read_all(jdir)] == [b"not lost"]
    sej.Writer(jdir).close()  # the lock was released
