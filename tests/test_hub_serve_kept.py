"""Version 3's kept bytes (sej.hub.serve_source.Connection): a push is joined to what the hub kept only where the
server vouches for it (the hash of the window before the push's start, the segment's identity), a cut drops what is
kept, the pushed checksum records stop at the listed size, a whole state goes out in one piece, and what is kept is
bounded in entries as in bytes.

The pushes are made by a Session of the producer's root in this thread (the one `sej serve` makes for its watch) and
handed to the hub's connection as its reader thread would: a push is listed exactly when the scenario says."""

from __future__ import annotations

import os
import re
from typing import Any

import pytest

import sej
from sej.checksum import HEADER as SUM_HEADER
from sej.checksum import RECORD as SUM_RECORD
from sej.hub import copy_all, serve_source
from sej.hub import serve_protocol as wire
from sej.hub.serve_server import Session
from sej.hub.serve_source import Connection, ServeSource

from .test_hub_copy import assert_identical
from .test_hub_serve_commit import replies
from .test_hub_serve_protocol import serving


def _session(root: str) -> Session:
    session = Session(root)
    session.version, session._asked = 3, root
    return session


def _push(session: Session, conn: Connection, names: list[str] | None) -> None:
    """The STATE frames `session` makes of `names` (None: the whole state), received by the hub's connection."""
    for msg in _frames(session, names):
        conn._dispatch(msg)


def _frames(session: Session, names: list[str] | None) -> list[list[Any]]:
    """The messages of the STATE frames `session` makes of `names`."""
    return [m for data in session.state_frames(names) for m in replies(data, magic=False)]


def _segment(journal: str) -> tuple[str, str]:
    (seg,) = sej.list_segments(journal)
    return seg.path, os.path.join(journal, "idx", os.path.basename(seg.path)[: -len(".jnl")] + ".sum")


def _copy(conn: Connection, hub: str) -> list[Any]:
    return copy_all(lambda: ServeSource(conn, "t"), hub, "c1", "hub", workers=1)


def _first_copy(session: Session, conn: Connection, hub: str) -> None:
    """The whole state pushed, then a copy of every journal that goes well."""
    _push(session, conn, None)
    out = _copy(conn, hub)
    assert all(o.error is None for o in out), [o.error for o in out]


@pytest.mark.parametrize("with_sums", [False, True])
def test_a_push_after_a_cut_and_a_rewrite_is_not_joined_to_the_bytes_kept_before_the_cut(tmp_path, with_sums) -> None:
    """A writer killed mid-frame leaves a torn frame; the hub reads (and keeps) it with the whole frames before it; the
    next writer's recovery cuts it and appends the same offset with another value, past the torn end; the server then
    pushes from the torn end. Joined to the torn bytes kept, the copy took them (without checksums silently, with them
    as a checksum mismatch); the push's check does not match them, so the hub reads."""
    root, hub = tmp_path / "root", str(tmp_path / "hub")
    j = str(root / "j")
    with sej.Writer(j, durability="flush") as w:
        for k in range(20):
            w.append(b"%03d" % k + b"a" * 97)
    path, sums = _segment(j)
    if not with_sums:
        os.unlink(sums)
    whole = os.path.getsize(path)
    scratch = str(tmp_path / "scratch")
    with sej.Writer(scratch, durability="flush") as w:  # the 21st frame, as the killed writer began it
        for k in range(20):
            w.append(b"%03d" % k + b"a" * 97)
        w.append(b"020" + b"t" * 297)
    with open(path, "ab") as f:  # the killed writer's torn frame: that frame's first 60 bytes
        f.write(open(_segment(scratch)[0], "rb").read()[whole : whole + 60])
    conn = serving(str(root))
    session = _session(str(root))
    try:
        _push(session, conn, None)
        assert conn.state is not None
        out = _copy(conn, hub)
        assert all(o.error is None for o in out), [o.error for o in out]
        assert os.path.getsize(os.path.join(hub, "c1.j", "jnl", os.path.basename(path))) == whole
        assert conn._data, "the read's end kept, torn bytes and all"
        with sej.Writer(j, durability="flush") as w:  # recovery cuts the torn frame; the same offset again
            w.append(b"020" + b"b" * 297)
        if not with_sums and os.path.exists(sums):
            os.unlink(sums)
        assert os.path.getsize(path) > whole + 60
        _push(session, conn, ["j"])
        out = _copy(conn, hub)
        assert all(o.error is None for o in out), [o.error for o in out]
    finally:
        conn.close()
    assert_identical(str(root), hub)


def test_a_journal_replaced_by_another_of_the_same_sizes_is_found_rewritten(tmp_path) -> None:
    """The producer's journal renamed away and another with the same message sizes (and more) renamed in: the copy's
    check of the bytes before its end must compare them with the new journal's, as a read's, and find it rewritten
    (not splice the new journal's bytes after the old one's)."""
    root, hub, other = tmp_path / "root", str(tmp_path / "hub"), str(tmp_path / "other")
    j = str(root / "j")
    with sej.Writer(j, durability="flush") as w:
        for k in range(40):
            w.append(b"%03d" % k + b"a" * 97)
    with sej.Writer(other, durability="flush") as w:
        for k in range(45):
            w.append(b"%03d" % k + b"b" * 97)
    conn = serving(str(root))
    session = _session(str(root))
    try:
        _first_copy(session, conn, hub)
        os.rename(j, str(tmp_path / "away"))
        os.rename(other, j)
        _push(session, conn, ["j"])
        (o,) = _copy(conn, hub)
        assert o.error is not None and "was rewritten" in str(o.error), o.error
    finally:
        conn.close()


def test_pushed_checksum_records_stop_at_the_listed_size(tmp_path) -> None:
    """Appends go on between the listing and the read of the checksum file: the records of bytes written since are
    not pushed (the copy, which copies up to the listed size, took them for records past the segment's end)."""
    root, hub = tmp_path / "root", str(tmp_path / "hub")
    j = str(root / "j")
    w = sej.Writer(j, durability="flush")
    try:
        for k in range(20):
            w.append(b"%03d" % k + b"a" * 97)
        conn = serving(str(root))
        session = _session(str(root))
        try:
            _first_copy(session, conn, hub)
            w.append(b"020" + b"c" * 97)
            w.flush()
            source = session._open(str(root))
            listed = [(s.name, s.size) for s in source.segments("j")]
            w.append(b"021" + b"d" * 97)  # after the listing, before the checksum file is read
            w.flush()
            pushed, _size, news = session._new_bytes(source, "j", listed, 0)
            assert news
            (item,) = pushed
            sums = item[5]
            assert sums is not None
            ends = [SUM_RECORD.unpack_from(sums, k)[0] for k in range(SUM_HEADER.size, len(sums), SUM_RECORD.size)]
            assert ends and max(ends) <= listed[0][1], (ends, listed)
            conn._dispatch(wire.decode_body(wire.encode(wire.state(False, [("j", listed)], [], {}, False, pushed))[4:]))
            out = _copy(conn, hub)
            assert all(o.error is None for o in out), [o.error for o in out]
            _push(session, conn, ["j"])
            out = _copy(conn, hub)
            assert all(o.error is None for o in out), [o.error for o in out]
        finally:
            conn.close()
    finally:
        w.close()
    assert_identical(str(root), hub)


def test_a_whole_state_in_several_frames_goes_out_in_one_piece(tmp_path, monkeypatch) -> None:
    """A whole state of more than STATE_ENTRIES journals is several frames; the pusher sends each piece state_frames
    gives whole, and a burst's frames (sent by another thread) between the whole state's would end it early (the hub
    then trusted a half-built state): they are one piece."""
    monkeypatch.setattr(wire, "STATE_ENTRIES", 2)
    root = tmp_path / "root"
    for n in "abcde":
        with sej.Writer(str(root / n)) as w:
            w.append(b"x")
    session = _session(str(root))
    pieces = list(session.state_frames(None))
    d = wire.Decoder()
    d.feed(pieces[0])
    frames = []
    for _ in range(len(pieces[0])):
        msg = d.next()
        if msg is None:
            break
        frames.append(wire.parse_state(msg, 3))
    assert d.pending == 0
    assert [f[0] for f in frames] == [True, False, False] and [f[4] for f in frames] == [True, True, False]
    assert sorted(j for f in frames for j in f[1]) == list("abcde")


def test_what_is_kept_is_bounded_in_entries_and_a_segment_no_longer_listed_is_dropped(tmp_path, monkeypatch) -> None:
    """Pushes of no bytes and no checksum file count for ENTRY_COST each (a hostile server sending thousands of them a
    frame keeps at most PUSHED_KEPT's worth), and what is kept of a segment the journal's listing no longer has, or
    has shorter, is dropped."""
    root = tmp_path / "root"
    with sej.Writer(str(root / "j")) as w:
        w.append(b"x")
    conn = serving(str(root))
    try:
        monkeypatch.setattr(serve_source, "PUSHED_KEPT", 100 * 256)  # 100 entries' worth (ENTRY_COST: 256)
        for k in range(10):
            items = [(f"p{k}-{i}", "0" * 16 + ".jnl", 5, b"", 0, None) for i in range(1000)]  # no check (older server)
            conn._dispatch(wire.decode_body(wire.encode(wire.state(False, [], [], {}, False, items))[4:]))
        assert len(conn._data) + len(conn._sums) <= 100
        assert conn._kept <= serve_source.PUSHED_KEPT
        conn.forget(None)
        assert conn._kept == 0 and not conn._data and not conn._sums
        seg_a, seg_b = "0" * 16 + ".jnl", "0" * 15 + "9.jnl"
        pushed = [("q", seg_a, 0, b"y" * 50, 0, None), ("q", seg_b, 0, b"z" * 50, 0, None)]
        conn._dispatch(wire.decode_body(wire.encode(wire.state(False, [("q", [(seg_a, 50), (seg_b, 50)])], [], {},
                                                                False, pushed))[4:]))  # fmt: skip
        assert sorted(k[1] for k in conn._data) == [seg_a, seg_b]
        conn._dispatch(wire.decode_body(wire.encode(wire.state(False, [("q", [(seg_b, 40)])], [], {}, False,
                                                                []))[4:]))  # fmt: skip
        assert not conn._data and not conn._sums and conn._kept == 0
    finally:
        conn.close()


def test_commits_failed_by_a_dropped_connection_are_logged_in_one_line(tmp_path, caplog) -> None:
    """The daemon's commits not waited for, under way when the connection drops, all fail with its error: one ERROR
    line with their count, not one a journal (a thousand of them)."""
    import logging

    from sej.hub.config import loads_config
    from sej.hub.daemon import _Client

    from .test_hub_serve_protocol import hostile

    config = loads_config(f'hub_root = "{tmp_path / "hub"}"\n[[client]]\nclient_id = "c1"\nhost = "h"\n'
                          f'remote_root = "/r"\ntransport = "serve"\n')  # fmt: skip
    client = _Client(config, config.clients[0])
    conn = hostile(lambda m: b"", version=3)  # never answers: the commits stay under way
    journals = [f"p.{k}.000" for k in range(5)]
    sent = ServeSource(conn, "t").commit_later([("commit_offset", j, "hub", 7, True) for j in journals])
    client._commits = [(j, 7, f) for j, f in zip(journals, sent, strict=True)]
    conn.close()  # the connection dropped
    caplog.set_level(logging.ERROR, logger="sej.hub")
    client.check_commits()
    lines = [r for r in caplog.records if "committing the hub offset" in r.getMessage()]
    assert len(lines) == 1 and "5 journals" in lines[0].getMessage(), [r.getMessage() for r in lines]
    assert not client._commits


@pytest.mark.parametrize(
    ("check", "why"),
    [
        ("x", "not \\[window, hash, dev, ino\\]"),
        ([1, 2, 3], "not \\[window, hash, dev, ino\\]"),
        ([-1, 0, 0, 0], "integer from 0"),
        ([0, "h", 0, 0], "integer from 0"),
        ([0, 0, -5, 0], "integer from 0"),
        ([11, 0, 0, 0], "11 bytes before 10"),  # more than the bytes before the start
        ([wire.PUSH_WINDOW + 1, 0, 0, 0], f"at most {wire.PUSH_WINDOW}"),
    ],
)
def test_a_hostile_pushed_check_fails_the_stream(check: Any, why: str) -> None:
    from .test_hub_serve_protocol import hostile

    start = 10 if "before 10" in why else 1 << 20
    state = [wire.STATE, True, [], [], {}, False, [["p.1.000", "0" * 16 + ".jnl", start, b"x", 0, None, check]]]
    conn = hostile(lambda m: wire.encode(state) if m[0] == wire.WATCH else b"", version=3)
    try:
        conn.watch(lambda journals: None)
        from testing.timing import scaled, wait_until

        wait_until(lambda: conn.failed is not None, scaled(5), "the stream failed")
        assert re.search(why, str(conn.failed)), conn.failed
        assert not conn._data and not conn._sums
    finally:
        conn.close()


def test_a_journal_listed_again_without_news_is_not_pushed_again(tmp_path) -> None:
    """A burst names a journal again whose listing and checksum file are those of its last push (an event that came
    after its listing): nothing is sent for it, so the hub makes no pass for it; a journal that gained bytes, or only
    checksum records, is pushed; a burst with nothing new sends nothing at all."""
    root = tmp_path / "root"
    writers = {n: sej.Writer(str(root / n), durability="flush") for n in ("a", "b")}
    try:
        for w in writers.values():
            w.append(b"x" * 100)
            w.flush()
        session = _session(str(root))
        assert _frames(session, None)  # the whole state: the base of the pushes
        assert _frames(session, ["a", "b"]), "their checksum files (a whole state carries none)"
        assert _frames(session, ["a", "b"]) == [], "nothing changed since"
        writers["a"].append(b"y" * 100)
        writers["a"].flush()
        (msg,) = _frames(session, ["a", "b"])
        full, got, gone, _skipped, _more, pushed = wire.parse_state(msg, 3)
        assert not full and list(got) == ["a"] and not gone and [p[0] for p in pushed] == ["a"], (got, pushed)
        assert _frames(session, ["a"]) == [], "listed again with nothing new"
        # Only the checksum file grew (its records of bytes already listed): pushed, with those records.
        seg, _sums = _segment(str(root / "a"))
        name = os.path.basename(seg)
        size, sums_size = session._listed["a"][name]
        session._listed["a"] = {name: (size, sums_size - SUM_RECORD.size)}  # the last push saw one record fewer
        (msg,) = _frames(session, ["a"])
        _full, got, _gone, _skipped, _more, pushed = wire.parse_state(msg, 3)
        assert list(got) == ["a"] and pushed and pushed[0][5], pushed
    finally:
        for w in writers.values():
            w.close()


def test_a_burst_sent_after_a_whole_state_that_listed_its_journal_later_does_not_hide_the_next_news(tmp_path) -> None:
    """A journal without checksum files (as the Go writer leaves it): a burst lists it, a whole state (another thread)
    lists it again after it grew and is sent first, then the burst's older frame. The hub's state is the burst's
    older size; the journal's next change must still be pushed (it is news against what the burst told)."""
    import glob

    from sej.message import encode

    root = tmp_path / "root"
    with sej.ShardedWriter(str(root), "p", shard_bit=1) as w:
        w.append(b"v", key=b"\0" * 8)
    j = sorted(os.listdir(root))[0]
    for f in glob.glob(str(root / "*" / "idx" / "*.sum")):
        os.remove(f)
    s = Session(str(root))
    s.receive(wire.encode(wire.hub_hello(str(root))))
    hub: dict[str, Any] = {}  # the hub's view: journal -> segment sizes, as STATE frames set it

    def apply(frames: list[bytes]) -> None:
        d = wire.Decoder()
        for frame in frames:
            d.feed(frame)
        for _ in range(1 << 20):
            m = d.next()
            if m is None:
                return
            full, got, _gone, _skipped, _more, _pushed = wire.parse_state(m, 3)
            if full:
                hub.clear()
            hub.update({jj: None if segs is None else [x[2] for x in segs] for jj, segs in got.items()})

    seg = sorted((root / j / "jnl").iterdir())[-1]
    offset = [1]

    def append(n: int) -> None:
        with open(seg, "ab") as f:
            for _ in range(n):
                f.write(encode(offset[0], None, 0, b"", b"x" * 50))
                offset[0] += 1

    try:
        apply(list(s.state_frames(None)))
        append(1)
        burst = s.state_frames([j])
        older = next(burst)  # listed now, sent below
        append(3)
        whole = s.state_frames(None)
        apply([next(whole)])
        apply([older])
        assert hub[j] == [seg.stat().st_size - 3 * (26 + 50)], "the hub holds the burst's older listing"
        list(burst), list(whole)
        apply(list(s.state_frames([j])))  # the burst of the three appends' events
        assert hub[j] == [seg.stat().st_size]
    finally:
        s.close()
