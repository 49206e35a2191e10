"""The serve protocol without sshd: its pure decoder fuzzed from both ends, the server's refusals (links, FIFOs,
names, other readers), and a hostile server against the hub's Connection, over a socketpair in this process."""

from __future__ import annotations

import os
import re
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import sej
from sej.checksum import HEADER as SUM_HEADER
from sej.errors import ProtocolError
from sej.hub import copy_all
from sej.hub import serve_protocol as wire
from sej.hub.copy import CHECK_WINDOW
from sej.hub.serve_server import Session, serve
from sej.hub.serve_source import Connection, ServeSource
from sej.hub.source import SourceError
from testing.timing import scaled, wait_until

from .test_hub_copy import assert_identical, produce

FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


class SocketChannel:
    """The part of a paramiko Channel the Connection uses, over a socket."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.status_event = threading.Event()
        self.exit_status = -1

    def settimeout(self, t: float | None) -> None:
        self.sock.settimeout(t)

    def sendall(self, data: bytes) -> None:
        self.sock.sendall(data)

    def recv(self, n: int) -> bytes:
        return self.sock.recv(n)

    def recv_stderr_ready(self) -> bool:
        return False

    def close(self) -> None:
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()


def serving(root: str, restrict: bool = False, asked: str | None = None, io_timeout: float = 10.0,
            versions: tuple[int, ...] = wire.VERSIONS) -> Connection:  # fmt: skip
    """A Connection to `serve(root)` running in a thread of this process, over a socketpair."""
    hub, server = socket.socketpair()
    fd = server.detach()
    t = threading.Thread(target=lambda: (serve(root, restrict=restrict, stdin=fd, stdout=fd), os.close(fd)),
                         daemon=True)  # fmt: skip
    t.start()
    return Connection(SocketChannel(hub), "t", asked or root, io_timeout=scaled(io_timeout), versions=versions)


def test_a_copy_through_serve_in_process_is_byte_identical(tmp_path) -> None:
    src, hub = str(tmp_path / "src"), str(tmp_path / "hub")
    produce(src, 2000, segment_size=4000)
    conn = serving(src)
    try:
        out = copy_all(lambda: ServeSource(conn, "t"), hub, "c1", "hub")
    finally:
        conn.close()
    assert all(o.error is None for o in out), [o.error for o in out]
    assert_identical(src, hub)


def test_the_server_refuses_links_fifos_bad_names_and_reads_too_big(tmp_path) -> None:
    root = tmp_path / "root"
    produce(str(root), 200)
    journal = sorted(os.listdir(root))[0]
    outside = tmp_path / "outside"
    produce(str(outside), 50)
    os.symlink(outside / sorted(os.listdir(outside))[0], root / "linked")  # a journal that is a link
    os.mkfifo(root / journal / "jnl" / ("e" * 16 + ".jnl"))
    conn = serving(str(root))
    try:
        names, skipped = conn.call_many([("journals",)])[0]
        assert "linked" not in names and "symlink" in skipped["linked"]
        got = conn.call_many([("segments", "linked"), ("segments", journal), ("read", journal, "e" * 16 + ".jnl", 0, 1),
                              ("read", "../outside", "0" * 16 + ".jnl", 0, 10), ("read_offset", journal, "../x"),
                              ("commit_offset", journal, "a/b", 1, True)])  # fmt: skip
        assert isinstance(got[0], sej.UnsafeFileError) and "symlink" in str(got[0])
        assert isinstance(got[1], sej.UnsafeFileError) and "FIFO" in str(got[1])  # the listing names it
        assert isinstance(got[2], sej.UnsafeFileError) and "FIFO" in str(got[2])
        assert all(isinstance(g, sej.InvalidArgumentError) for g in got[3:]), got[3:]
        assert not os.path.exists(root / journal / "ofs" / "a")
        # A read bigger than the protocol allows ends the stream, naming it.
        with pytest.raises(SourceError, match="a read of"):
            conn.call_many([("read", journal, "0" * 16 + ".jnl", 0, wire.MAX_READ + 1)])
    finally:
        conn.close()


def test_restricted_the_server_commits_only_its_reader_and_serves_only_its_root(tmp_path) -> None:
    root = tmp_path / "root"
    produce(str(root), 200)
    journal = sorted(os.listdir(root))[0]
    with pytest.raises(SourceError, match="may read .* only"):
        serving(str(root), restrict=True, asked=str(tmp_path))
    conn = serving(str(root), restrict=True, asked=str(root / journal))  # one journal of the root: served alone
    try:
        assert ServeSource(conn, "t").journals() == [journal]
        other = sorted(os.listdir(root))[1]
        assert isinstance(conn.call_many([("segments", other)])[0], sej.InvalidArgumentError)
        assert conn.call_many([("commit_offset", journal, "hub", 7, True)]) == [None]
        (refused,) = conn.call_many([("commit_offset", journal, "billing", 7, True)])
        assert isinstance(refused, SourceError) and "reader hub only" in str(refused)
        assert sorted(os.listdir(root / journal / "ofs")) == ["hub.ofs"]
        assert sej.Offset(str(root / journal), "hub").value == 7
    finally:
        conn.close()


# The decoder, from both ends.


@FUZZ
@given(st.binary(max_size=2000), st.booleans())
def test_random_bytes_decode_to_messages_or_a_protocol_error(data: bytes, magic: bool) -> None:
    d = wire.Decoder(magic=magic)
    d.feed(data)
    try:
        for _ in range(len(data) + 1):
            if d.next() is None:
                break
    except ProtocolError:
        with pytest.raises(ProtocolError):  # and stays failed
            d.next()


MESSAGES = st.one_of(
    st.builds(wire.call, st.integers(1, 1 << 40), st.sampled_from(sorted(wire.METHODS)),
              st.lists(st.one_of(st.text(max_size=20), st.integers(0, (1 << 64) - 1), st.booleans()), max_size=5)),
    st.builds(lambda i, b: [wire.PART_, i, b], st.integers(0, 1 << 40), st.binary(max_size=100)),
    st.builds(lambda i, v: [wire.REPLY, i, v], st.integers(0, 1 << 40),
              st.recursive(st.none() | st.integers(-5, (1 << 64) - 1) | st.text(max_size=10) | st.binary(max_size=10),
                           lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=5), c, max_size=3),
                           max_leaves=10)),
    st.builds(wire.changed, st.lists(st.text(max_size=12), max_size=4)),
)  # fmt: skip


@FUZZ
@given(st.lists(MESSAGES, min_size=1, max_size=6), st.integers(0, 10_000))
def test_a_stream_cut_anywhere_waits_for_more_and_never_raises(messages: list[list[Any]], cut: int) -> None:
    stream = wire.MAGIC + b"".join(wire.encode(m) for m in messages)
    cut = min(cut, len(stream))
    d = wire.Decoder(magic=True)
    got = []
    for k in range(0, cut, 7):  # in small pieces, as a socket gives them
        d.feed(stream[k : min(cut, k + 7)])
        for _ in range(len(messages) + 1):
            m = d.next()
            if m is None:
                break
            got.append(m)
    assert got == [msgpack.unpackb(msgpack.packb(m, use_bin_type=True), strict_map_key=False) for m in
                   messages[: len(got)]]  # fmt: skip
    assert (len(got) == len(messages)) == (cut == len(stream))


def test_an_oversized_or_empty_frame_is_refused_before_its_body_arrives() -> None:
    d = wire.Decoder()
    d.feed((wire.MAX_FRAME + 1).to_bytes(4, "big"))
    with pytest.raises(ProtocolError, match=f"a frame of {wire.MAX_FRAME + 1} bytes"):
        d.next()
    d = wire.Decoder()
    d.feed(b"\0\0\0\0")
    with pytest.raises(ProtocolError, match="a frame of 0 bytes"):
        d.next()
    with pytest.raises(sej.InvalidArgumentError):
        wire.encode([wire.REPLY, 1, [b"x" * (1 << 20)] * 17])


@FUZZ
@given(st.lists(st.one_of(MESSAGES.map(wire.encode), st.binary(max_size=40)), max_size=8))
def test_the_server_answers_any_input_with_frames_or_ends_the_stream(tmp_path, pieces: list[bytes]) -> None:
    root = tmp_path / "fuzz-root"
    root.mkdir(exist_ok=True)
    session = Session(str(root))
    out = session.receive(wire.encode(wire.hub_hello(str(root))))
    for piece in pieces:
        if session.ended:
            break
        out += session.receive(piece)
    d = wire.Decoder(magic=True)
    d.feed(out)
    replies = []
    for _ in range(len(out) + 1):
        m = d.next()
        if m is None:
            break
        replies.append(m)
    assert d.pending == 0 and replies[0][0] == wire.HELLO
    assert all(m[0] in (wire.REPLY, wire.PART_, wire.ERROR) for m in replies[1:])
    assert not session.ended or replies[-1][:3] == [wire.ERROR, 0, "protocol"]


# A hostile server against the hub.


def hostile(script: Any, version: int = 1) -> Connection:
    """A Connection to a fake server: after a good hello, `script(calls) -> bytes` answers what the hub sent."""
    hub, server = socket.socketpair()

    def run() -> None:
        d = wire.Decoder()
        with server:
            for _ in range(1000):
                try:
                    data = server.recv(1 << 16)
                except OSError:  # the hub closed the stream (it found the reply hostile)
                    return
                if not data:
                    return
                d.feed(data)
                msgs = []
                for _ in range(len(data) + 1):
                    m = d.next()
                    if m is None:
                        break
                    msgs.append(m)
                for m in msgs:
                    try:
                        server.sendall(wire.MAGIC + wire.encode(wire.server_hello(version, "x", "/r"))
                                       if m[0] == wire.HELLO
                                       else script(m))  # fmt: skip
                    except OSError:
                        return

    threading.Thread(target=run, daemon=True).start()
    return Connection(SocketChannel(hub), "evil", "/r", io_timeout=scaled(5))


def frame(*items: Any) -> bytes:
    return wire.encode(list(items))


@pytest.mark.parametrize(
    ("answer", "why"),
    [
        (lambda m: frame(wire.REPLY, m[1], [["../../etc"], {}]), "cannot be one"),
        (lambda m: frame(wire.REPLY, m[1], [["p.1.000", "p.1.000"], {}]), "named twice"),
        (lambda m: frame(wire.REPLY, m[1], [["p"], {"x": "y" * 5000}]), "at most 4096"),
        (lambda m: frame(wire.REPLY, m[1] + 1, [[], {}]), "not under way"),
        (lambda m: frame(wire.PART_, m[1], b"x"), "more than 0 bytes"),
        (lambda m: frame(wire.REPLY, m[1], "no"), "not \\[names, skipped\\]"),
        (lambda m: frame(wire.CALL, 1, "journals", []), "a CALL message from the server"),
        (lambda m: frame(wire.ERROR, m[1], "nope", "x", None), "no error kind"),
        (lambda m: frame(wire.ERROR, 0, "internal", "bye", None), "ended the stream: bye"),
        (lambda m: b"\xff\xff\xff\xff", "a frame of 4294967295 bytes"),
    ],
)
def test_a_hostile_reply_fails_the_stream_with_a_source_error_naming_it(answer: Any, why: str) -> None:
    conn = hostile(answer)
    t = time.monotonic()
    with pytest.raises(SourceError, match=why):
        ServeSource(conn, "evil").journals()
    assert time.monotonic() - t < scaled(5)
    assert conn.failed is not None  # and the stream is not used again
    with pytest.raises(SourceError):
        conn.call_many([("journals",)])


def test_a_reply_bigger_than_the_read_asked_for_is_refused() -> None:
    conn = hostile(lambda m: frame(wire.PART_, m[1], b"x" * 100) + frame(wire.REPLY, m[1], b"x"))
    with pytest.raises(SourceError, match="more than 50 bytes"):
        conn.call_many([("read", "p", "0" * 16 + ".jnl", 0, 50)])
    conn = hostile(lambda m: frame(wire.REPLY, m[1], [["zz", -1]]))
    with pytest.raises(SourceError, match="segments"):
        conn.call_many([("segments", "p")])


def test_a_silent_server_fails_the_call_at_the_io_timeout() -> None:
    conn = hostile(lambda m: b"")
    conn.io_timeout = scaled(0.5)
    t = time.monotonic()
    with pytest.raises(SourceError, match="no reply within"):
        conn.call_many([("journals",)])
    assert time.monotonic() - t < scaled(5)


@FUZZ
@given(st.binary(max_size=300))
def test_any_server_bytes_give_a_result_or_a_typed_error_never_a_hang(data: bytes) -> None:
    conn = hostile(lambda m: data)
    conn.io_timeout = 0.3
    try:
        got = conn.call_many([("journals",), ("read", "p", "0" * 16 + ".jnl", 0, 10)])
        assert all(isinstance(g, (tuple, bytes, sej.SejError, OSError)) for g in got), got
    except SourceError:
        pass
    finally:
        conn.close()


def test_the_server_pushes_the_journals_that_change_and_not_the_hubs_own_commits(tmp_path) -> None:
    root = tmp_path / "root"
    produce(str(root), 100)
    first, second = sorted(os.listdir(root))[:2]
    conn = serving(str(root), versions=(1,))  # names only (version 2 pushes their state: see below)
    pushes: list[list[str]] = []
    got = threading.Event()

    def on_changed(journals: list[str]) -> None:
        pushes.append(journals)
        got.set()

    try:
        conn.watch(on_changed)
        assert conn.call_many([("commit_offset", first, "hub", 3, True)]) == [None]  # also: the watch is on now
        with sej.Writer(str(root / second), durability="flush") as w:
            w.append(b"new")
        assert got.wait(scaled(10))
        # [] is "anything may have changed" (an event on a journal's directory itself, which may be a new journal):
        # under load the append's events can come in one burst with such an event, and that push covers `second`.
        wait_until(lambda: any(second in p or p == [] for p in pushes), scaled(10),
                   "a push naming the journal appended to, or all")  # fmt: skip
        assert all(first not in p for p in pushes), pushes  # the hub's own commit (ofs/) is no news
    finally:
        conn.close()


def test_a_run_of_commits_is_made_together_and_in_order_per_journal(tmp_path) -> None:
    root = tmp_path / "root"
    produce(str(root), 200)
    journals = sorted(os.listdir(root))
    conn = serving(str(root))
    try:
        calls = [("commit_offset", j, "hub", 5, False) for j in journals] + [("commit_offset", journals[0], "hub", 9,
                                                                               False)]  # fmt: skip
        assert conn.call_many(calls) == [None] * len(calls)
    finally:
        conn.close()
    assert [sej.Offset(str(root / j), "hub").value for j in journals] == [9] + [5] * (len(journals) - 1)


def test_over_version_2_the_pushed_state_answers_the_listing_and_the_probe_without_a_call(tmp_path, monkeypatch
                                                                                         ) -> None:  # fmt: skip
    """The server pushes every journal's segments once the watch is on, then those of each journal that changes, as
    listed after it changed: the hub answers journals, segments and size from them (no call, no round trip); reads
    still go to the server. A state older than STATE_TRUST answers nothing until the new one it asks for comes."""
    root = tmp_path / "root"
    produce(str(root), 100)
    journals = sorted(os.listdir(root))
    j = journals[1]
    conn = serving(str(root), versions=(1, 2))  # a hub of version 2 (version 3 pushes the bytes too: below)
    pushes: list[list[str]] = []
    try:
        assert conn.version == 2
        conn.watch(pushes.append)
        wait_until(lambda: conn.state is not None, scaled(10), "the whole state")
        src = ServeSource(conn, "t")
        sent = conn._next_id
        assert src.journals() == journals
        listed = [(os.path.basename(s.path), os.path.getsize(s.path)) for s in sej.list_segments(str(root / j))]
        assert [(s.name, s.size) for s in src.segments(j)] == listed
        assert src.size(j, listed[-1][0]) == listed[-1][1] and src.size(j, "f" * 16 + ".jnl") is None
        assert conn._next_id == sent, "answered from the pushed state, without a call"
        with sej.Writer(str(root / j), durability="flush") as w:
            w.append(b"new")
        last = sej.list_segments(str(root / j))[-1].path
        wait_until(lambda: src.size(j, os.path.basename(last)) == os.path.getsize(last), scaled(10),
                   "the append's size pushed")  # fmt: skip
        # [] (every journal's state) when the burst also had an event naming no journal (under load, as above)
        assert any(p in ([j], []) for p in pushes[1:]), pushes
        assert conn._next_id == sent
        assert src.read(j, os.path.basename(last), 0, 8) == open(last, "rb").read(8)
        assert conn._next_id == sent + 1, "a read is a call"
        monkeypatch.setattr("sej.hub.serve_source.STATE_TRUST", 0.0)  # every state too old: asked for again
        at = conn.state_at
        assert src.journals() == journals
        assert conn._next_id == sent + 2, "an old state answers nothing"
        wait_until(lambda: conn.state_at > at, scaled(10), "a new whole state, asked for")
    finally:
        conn.close()


def test_over_version_3_the_pushed_bytes_answer_the_reads_and_a_copy_is_byte_identical(tmp_path) -> None:
    """Version 3: a push carries the bytes an append added and as much of the segment's checksum file; the hub joins
    them to the end of what its last reads returned, and answers the next pass's read (from CHECK_WINDOW before its
    copy's end) and read_sums from them, without a call. A journal forgotten (its copy failed) is read afresh.
    copy_all over them is byte-identical to the producer."""
    root, hub = tmp_path / "root", str(tmp_path / "hub")
    produce(str(root), 100)
    journals = sorted(os.listdir(root))
    j = journals[2]
    conn = serving(str(root))
    try:
        assert conn.version == 3
        conn.watch(lambda journals: None)
        wait_until(lambda: conn.state is not None, scaled(10), "the whole state")
        out = copy_all(lambda: ServeSource(conn, "t"), hub, "c1", "hub")
        assert all(o.error is None for o in out), [o.error for o in out]
        last = sej.list_segments(str(root / j))[-1].path
        name, before = os.path.basename(last), os.path.getsize(last)
        sums_path = os.path.join(str(root / j), "idx", name[: -len(".jnl")] + ".sum")
        sums_before = os.path.getsize(sums_path)
        with sej.Writer(str(root / j), durability="flush") as w:
            w.append(b"new" * 50)
        after = os.path.getsize(last)
        src = ServeSource(conn, "t")
        wait_until(lambda: src.size(j, name) == after, scaled(10), "the append's size pushed")
        start = max(0, before - CHECK_WINDOW)
        skip = sums_before - 16  # the last record the copy read, as its mark asks
        sent = conn._next_id
        got = src.many([("read", j, name, start, after - start), ("read_sums", j, name, skip)])
        assert conn._next_id == sent, "answered from the pushed bytes, without a call"
        data, sums = open(last, "rb").read(), open(sums_path, "rb").read()
        assert got[0] == data[start:after]
        assert got[1] == sums[:SUM_HEADER.size] + sums[skip:]
        src.forget({j})
        assert src.read(j, name, start, after - start) == data[start:after]
        assert conn._next_id == sent + 1, "forgotten: a read is a call"
        with sej.Writer(str(root / j), durability="flush") as w:
            w.append(b"more")
        wait_until(lambda: src.size(j, name) == os.path.getsize(last), scaled(10), "the second append's size pushed")
        out = copy_all(lambda: ServeSource(conn, "t"), hub, "c1", "hub")
        assert all(o.error is None for o in out), [o.error for o in out]
    finally:
        conn.close()
    assert_identical(str(root), hub)


def test_a_hub_of_version_2_gets_no_bytes_from_a_server_of_version_3(tmp_path) -> None:
    root = tmp_path / "root"
    produce(str(root), 20)
    j = sorted(os.listdir(root))[0]
    conn = serving(str(root), versions=(2,))
    try:
        assert conn.version == 2
        conn.watch(lambda journals: None)
        wait_until(lambda: conn.state is not None, scaled(10), "the whole state")
        with sej.Writer(str(root / j), durability="flush") as w:
            w.append(b"new")
        last = sej.list_segments(str(root / j))[-1].path
        src = ServeSource(conn, "t")
        wait_until(lambda: src.size(j, os.path.basename(last)) == os.path.getsize(last), scaled(10), "the push")
        assert conn.failed is None and not conn._data and not conn._sums
    finally:
        conn.close()


def test_a_hub_of_version_1_gets_names_only_and_asks(tmp_path) -> None:
    root = tmp_path / "root"
    produce(str(root), 50)
    conn = serving(str(root), versions=(1,))
    pushes: list[list[str]] = []
    try:
        assert conn.version == 1
        conn.watch(pushes.append)
        assert conn.call_many([("journals",)])[0][0]  # the watch is on now (answered after it)
        j = sorted(os.listdir(root))[0]
        with sej.Writer(str(root / j), durability="flush") as w:
            w.append(b"new")
        wait_until(lambda: any(j in p or p == [] for p in pushes), scaled(10), "a push naming the journal")
        sent = conn._next_id
        assert ServeSource(conn, "t").journals() == sorted(os.listdir(root))
        assert conn.state is None and conn._next_id == sent + 1
    finally:
        conn.close()


@pytest.mark.parametrize(
    ("state", "why"),
    [
        ([wire.STATE, True, [["../x", []]], [], {}, False], "cannot be one"),
        ([wire.STATE, True, [["p.1.000", []], ["p.1.000", []]], [], {}, False], "twice"),
        ([wire.STATE, True, [["p.1.000", [["0" * 16 + ".jnl", -1]]]], [], {}, False], "integer from 0"),
        ([wire.STATE, True, [["p.1.000", [["x.jnl", 1]]]], [], {}, False], "segments"),
        ([wire.STATE, "yes", [], [], {}, False], "true or false"),
        ([wire.STATE, True, [], ["../y"], {}, False], "cannot be one"),
        ([wire.STATE, True, [], [], {}], "items"),
        ([wire.STATE, True, [["p.1.000", list(range(wire.MAX_SEGMENTS + 1))]], [], {}, False], "at most"),
    ],
)
def test_a_hostile_state_fails_the_stream_and_answers_nothing(state: list[Any], why: str) -> None:
    conn = hostile(lambda m: wire.encode(state) if m[0] == wire.WATCH else b"", version=2)
    try:
        conn.watch(lambda journals: None)
        wait_until(lambda: conn.failed is not None, scaled(5), "the stream failed")
        assert re.search(why, str(conn.failed)), conn.failed
        assert conn.state is None and conn.known([("journals",)]) is None
    finally:
        conn.close()


_SEG = "0" * 16 + ".jnl"


@pytest.mark.parametrize(
    ("pushed", "why"),
    [
        ("x", "list of at most"),
        ([["p.1.000", _SEG, 0, b"x"]], "not \\[journal, segment"),
        ([["../p", _SEG, 0, b"x", 0, None]], "cannot be one"),
        ([["p.1.000", "x.jnl", 0, b"x", 0, None]], "segment"),
        ([["p.1.000", _SEG, -1, b"x", 0, None]], "integer from 0"),
        ([["p.1.000", _SEG, 0, "text", 0, None]], "not bytes"),
        ([["p.1.000", _SEG, 0, b"x", 0, 7]], "not bytes"),
        ([["p.1.000", _SEG, 0, b"x", 0, None], ["p.1.000", _SEG, 5, b"y", 0, None]], "twice"),
        ([["p.1.000", _SEG, 0, b"x" * (wire.PUSH_JOURNAL + 1), 0, None]], "more than"),
        ([[f"j{k}", _SEG, 0, b"x" * wire.PUSH_JOURNAL, 0, None] for k in range(wire.PUSH_FRAME
                                                                                      // wire.PUSH_JOURNAL + 1)],
         "more than"),  # fmt: skip
    ],
)
def test_hostile_pushed_bytes_fail_the_stream_and_answer_nothing(pushed: Any, why: str) -> None:
    state = [wire.STATE, True, [], [], {}, False, pushed]
    conn = hostile(lambda m: wire.encode(state) if m[0] == wire.WATCH else b"", version=3)
    try:
        conn.watch(lambda journals: None)
        wait_until(lambda: conn.failed is not None, scaled(5), "the stream failed")
        assert re.search(why, str(conn.failed)), conn.failed
        assert conn.state is None and conn.known([("read", "p.1.000", _SEG, 0, 1)]) is None
        assert not conn._data and not conn._sums
    finally:
        conn.close()


def test_a_version_2_state_from_a_server_of_version_3_fails_the_stream() -> None:
    conn = hostile(lambda m: wire.encode([wire.STATE, True, [], [], {}, False]) if m[0] == wire.WATCH else b"",
                   version=3)  # fmt: skip
    try:
        conn.watch(lambda journals: None)
        wait_until(lambda: conn.failed is not None, scaled(5), "the stream failed")
        assert "items" in str(conn.failed)
    finally:
        conn.close()


def test_a_state_from_a_server_of_version_1_fails_the_stream() -> None:
    conn = hostile(lambda m: wire.encode([wire.STATE, True, [], [], {}, False]) if m[0] == wire.WATCH else b"")
    try:
        conn.watch(lambda journals: None)
        wait_until(lambda: conn.failed is not None, scaled(5), "the stream failed")
        assert "a STATE message from the server" in str(conn.failed)
    finally:
        conn.close()


def test_the_servers_own_reads_for_the_hub_are_no_news(tmp_path) -> None:
    """Reading a journal opens and closes its files: not events the server watches (watchdog's default has them),
    else a pass over many journals was thousands of events, and the kernel's queue overflowed."""
    root = tmp_path / "root"
    produce(str(root), 100)
    read, appended = sorted(os.listdir(root))[:2]
    conn = serving(str(root), versions=(1,))  # names only: each push says which journals
    pushes: list[list[str]] = []
    try:
        conn.watch(pushes.append)
        assert conn.call_many([("journals",)])[0][0]  # the watch is on now (answered after it)
        segs = ServeSource(conn, "t").segments(read)
        for _ in range(3):
            got = conn.call_many([("read", read, s.name, 0, s.size) for s in segs] +
                                 [("read_sums", read, s.name, 0) for s in segs])  # fmt: skip
            assert all(not isinstance(g, BaseException) for g in got), got
        with sej.Writer(str(root / appended), durability="flush") as w:
            w.append(b"new")
        wait_until(lambda: any(appended in p or p == [] for p in pushes), scaled(10), "the append's push")
        assert not any(read in p for p in pushes), pushes
    finally:
        conn.close()


def test_bursts_are_pushed_while_the_whole_state_is_listed_and_again_after_it(tmp_path) -> None:
    """Listing every journal takes a while over thousands of them: a burst meanwhile is pushed at once, not after the
    whole state, and a journal it names that the whole state had listed before (so the whole state, sent after the
    burst, says less) is pushed again once the whole state is sent."""
    from sej.hub.serve_watch import Pusher

    root = tmp_path / "root"
    produce(str(root), 20)
    j = sorted(os.listdir(root))[0]
    session = Session(str(root))
    session.version, session._asked = 3, str(root)
    listed = threading.Event()  # the whole state is listed, not sent yet
    release = threading.Event()
    sent: list[tuple[bool, list[str]]] = []  # (full, journals) of each STATE sent
    cond = threading.Condition()

    def state(names: list[str] | None) -> Iterator[bytes]:
        frames = session.state_frames(names)
        if names is None:
            first = next(frames)  # listed now, before the append
            listed.set()
            assert release.wait(scaled(20))
            yield first
        yield from frames

    def send(data: bytes) -> None:
        d = wire.Decoder()
        d.feed(data)
        full, got, _gone, _skipped, _more, _pushed = wire.parse_state(d.next(), 3)
        with cond:
            sent.append((full, sorted(got)))
            cond.notify_all()

    pusher = Pusher(str(root), send, None, state)
    try:
        assert listed.wait(scaled(10))
        with sej.Writer(str(root / j), durability="flush") as w:
            w.append(b"while listing")
        with cond:
            assert cond.wait_for(lambda: any(j in names for _full, names in sent), scaled(10)), sent
        assert not any(full for full, _names in sent), "pushed before the whole state"
        release.set()
        with cond:
            assert cond.wait_for(lambda: any(full for full, _names in sent) and any(
                j in names for _full, names in sent[[f for f, _n in sent].index(True) + 1 :]), scaled(10)), sent
    finally:
        release.set()
        pusher.close()
