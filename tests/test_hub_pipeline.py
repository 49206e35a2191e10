"""sej.hub.pipeline against a scripted SFTP server: replies split anywhere, out of order, and broken streams."""

from __future__ import annotations

import struct
import threading
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("paramiko")

from paramiko.sftp import CMD_ATTRS, CMD_LSTAT, CMD_STATUS, SFTP_NO_SUCH_FILE  # noqa: E402

from sej.hub.pipeline import MAX_PACKET, MAX_SHOWN, STUCK_SHOWN, Op, Pipeline, SFTPStreamError, expect  # noqa: E402


class ScriptedChannel:
    """A channel whose replies are given in advance, delivered in the given pieces; records what is sent."""

    def __init__(self, pieces: list[bytes]) -> None:
        self.pieces = list(pieces)
        self.sent = bytearray()

    def sendall(self, data: bytes) -> None:
        self.sent += data

    def recv(self, n: int) -> bytes:
        if not self.pieces:
            return b""  # the channel closed
        piece = self.pieces.pop(0)
        assert len(piece) <= n
        return piece


class FakeSftp:
    def __init__(self, channel: ScriptedChannel, first: int = 7) -> None:
        self.sock = channel
        self._lock = threading.Lock()
        self.request_number = first


def reply(t: int, num: int, body: bytes) -> bytes:
    payload = struct.pack(">BI", t, num) + body
    return struct.pack(">I", len(payload)) + payload


def attrs_size(size: int) -> bytes:
    return struct.pack(">IQ", 0x1, size)  # SSH_FILEXFER_ATTR_SIZE


def missing() -> bytes:
    text = b"No such file"
    return struct.pack(">II", SFTP_NO_SUCH_FILE, len(text)) + text + struct.pack(">I", 0)


def lstat_size(path: str) -> Op[int | None]:
    from paramiko import SFTPAttributes

    (r,) = yield [(CMD_LSTAT, path.encode())]
    try:
        return SFTPAttributes._from_msg(expect(r, CMD_ATTRS)).st_size
    except FileNotFoundError:
        return None


def sent_requests(data: bytes) -> list[tuple[int, int, bytes]]:
    """(type, request number, path) of each LSTAT sent."""
    out, pos = [], 0
    while pos < len(data):
        (size,) = struct.unpack_from(">I", data, pos)
        t, num, plen = struct.unpack_from(">BII", data, pos + 4)
        out.append((t, num, data[pos + 13 : pos + 13 + plen]))
        pos += 4 + size
    return out


class ScriptedServer(ScriptedChannel):
    """A server that answers only what was sent, in an order `order` picks among the requests it holds,
    in pieces of the sizes `cuts` gives."""

    def __init__(self, answers: dict[int, bytes], order: Any, cuts: list[int]) -> None:
        super().__init__([])
        self.answers, self.order, self.cuts = answers, order, list(cuts)
        self.held: list[int] = []
        self.out = bytearray()
        self.parsed = 0

    def sendall(self, data: bytes) -> None:
        super().sendall(data)
        for _t, num, _path in sent_requests(bytes(self.sent[self.parsed :])):
            self.held.append(num)
        self.parsed = len(self.sent)

    def recv(self, n: int) -> bytes:
        while self.held and (not self.out or self.order.random() < 0.5):
            self.out += self.answers[self.held.pop(self.order.randrange(len(self.held)))]
        if not self.out:
            return b""
        take = min(n, len(self.out), 1 + (self.cuts.pop(0) if self.cuts else len(self.out)))
        piece = bytes(self.out[:take])
        del self.out[:take]
        return piece


@settings(max_examples=200, deadline=None)
@given(
    sizes=st.lists(st.one_of(st.none(), st.integers(0, 2**63)), min_size=1, max_size=40),
    order=st.randoms(use_true_random=False),
    cuts=st.lists(st.integers(0, 200), max_size=60),
    window=st.integers(1, 64),
)
def test_replies_in_any_order_and_any_pieces_reach_their_operation(
    sizes: list[int | None], order: Any, cuts: list[int], window: int
) -> None:
    first = 7
    nums = list(range(first, first + len(sizes)))
    answers = {
        n: reply(CMD_STATUS, n, missing()) if size is None else reply(CMD_ATTRS, n, attrs_size(size))
        for n, size in zip(nums, sizes, strict=True)
    }
    server = ScriptedServer(answers, order, cuts)
    pipe = Pipeline(FakeSftp(server, first), window=window)  # type: ignore[arg-type]
    got = pipe.run([lstat_size(f"/j/{k}") for k in range(len(sizes))])
    assert got == sizes
    assert sent_requests(bytes(server.sent)) == [(CMD_LSTAT, n, f"/j/{n - first}".encode()) for n in nums]


def test_an_impossible_reply_length_is_a_broken_stream() -> None:
    for size in (0, 4, MAX_PACKET + 1, 0xFFFFFFFF):
        channel = ScriptedChannel([struct.pack(">IBI", size, CMD_ATTRS, 7)])
        with pytest.raises(SFTPStreamError, match=f"{size} bytes"):
            Pipeline(FakeSftp(channel)).run([lstat_size("/a")])  # type: ignore[arg-type]


def test_replies_to_no_request_are_bounded() -> None:
    strays = b"".join(reply(CMD_ATTRS, 1000 + k, attrs_size(1)) for k in range(10))
    channel = ScriptedChannel([strays] * 100)  # a server that never answers, only chatters
    with pytest.raises(SFTPStreamError, match="replies to no request"):
        Pipeline(FakeSftp(channel), window=4).run([lstat_size("/a")])  # type: ignore[arg-type]


def test_bytes_after_the_last_reply_are_a_broken_stream() -> None:
    channel = ScriptedChannel([reply(CMD_ATTRS, 7, attrs_size(5)) + b"\x00\x00"])
    with pytest.raises(SFTPStreamError, match="2 bytes after the last reply"):
        Pipeline(FakeSftp(channel)).run([lstat_size("/a")])  # type: ignore[arg-type]


def test_a_closed_channel_ends_the_run_with_an_error_and_the_next_run_starts_clean() -> None:
    channel = ScriptedChannel([reply(CMD_ATTRS, 7, attrs_size(5))[:6]])
    pipe = Pipeline(FakeSftp(channel))  # type: ignore[arg-type]
    with pytest.raises(EOFError):
        pipe.run([lstat_size("/a")])
    assert pipe.stuck == ["/a"], "a transport failure names what was in flight"
    channel.pieces = [reply(CMD_ATTRS, 8, attrs_size(9))]
    assert pipe.run([lstat_size("/b")]) == [9]
    assert pipe.stuck == []


def test_a_failure_names_at_most_a_few_paths_in_flight_shortened_and_only_those_unanswered() -> None:
    long = "/j/" + "x" * 1000
    answered = reply(CMD_ATTRS, 7, attrs_size(1))  # /0 is answered, then the channel closes
    pipe = Pipeline(FakeSftp(ScriptedChannel([answered])))  # type: ignore[arg-type]
    with pytest.raises(EOFError):
        pipe.run([lstat_size(p) for p in ["/0", long, "/2", "/3", "/4"]])
    assert pipe.stuck == [long[:MAX_SHOWN], "/2", "/3"][:STUCK_SHOWN]


def test_a_read_answered_with_more_bytes_than_asked_fails_that_read() -> None:
    """A hostile server's oversized READ reply would put bytes out of place: the read fails, naming both sizes."""
    import stat as stat_mod

    from paramiko import Message
    from paramiko.sftp import CMD_DATA

    from sej.hub.sftp_source import SftpSource

    src = object.__new__(SftpSource)  # the operation only: bytes in, results out, no connection
    src.label = "test"

    def msg(body: bytes) -> Message:
        m = Message(struct.pack(">I", 7) + body)
        m.get_int()  # the request number, as the pipeline reads it
        return m

    for extra, ok in ((0, True), (1, False), (1000, False)):
        regular = msg(struct.pack(">II", 0x4, stat_mod.S_IFREG | 0o644))  # SSH_FILEXFER_ATTR_PERMISSIONS
        op = src._read_open("/j/seg", b"h", 10, 110)
        requests = next(op)
        assert [r[0] for r in requests] == [8, 5]  # SSH_FXP_FSTAT, SSH_FXP_READ of 100 bytes at 10
        data = b"d" * (100 + extra)
        try:
            op.send([(CMD_ATTRS, regular), (CMD_DATA, msg(struct.pack(">I", len(data)) + data))])
        except StopIteration as stop:
            assert ok and stop.value == data
        except SFTPStreamError as e:
            assert not ok and f"a read of 100 bytes at 10 answered with {100 + extra}" in str(e)
        else:
            raise AssertionError("the operation asked for more")


class DirServer(ScriptedChannel):
    """An SFTP server with one directory: answers OPENDIR, READDIR (the next `chunk` entries, then EOF; `endless`:
    the same entries again forever; `chunk` 0: a NAME of no entries) and CLOSE in order, as it gets them."""

    def __init__(self, names: list[str], chunk: int, endless: bool = False, refuse_ahead: bool = False) -> None:
        super().__init__([])
        self.names, self.chunk, self.endless, self.refuse_ahead = names, chunk, endless, refuse_ahead
        self.at = 0
        self.parsed = 0
        self.out = bytearray()
        self.types: list[int] = []

    def sendall(self, data: bytes) -> None:
        from paramiko.sftp import CMD_CLOSE, CMD_HANDLE, CMD_NAME, CMD_OPENDIR, CMD_READDIR, SFTP_EOF, SFTP_OK

        super().sendall(data)
        readdirs = 0  # of this write
        for t, num, _arg in sent_requests(bytes(self.sent[self.parsed :])):
            self.types.append(t)
            readdirs += t == CMD_READDIR
            if t == CMD_READDIR and self.refuse_ahead and readdirs > 1:  # one READDIR in flight at a time
                text = b"read ahead refused"
                self.out += reply(CMD_STATUS, num, struct.pack(">II", 4, len(text)) + text + struct.pack(">I", 0))
                continue
            if t == CMD_OPENDIR:
                self.out += reply(CMD_HANDLE, num, struct.pack(">I", 1) + b"h")
            elif t == CMD_READDIR:
                part = self.names[self.at : self.at + self.chunk]
                self.at = 0 if self.endless and self.at + self.chunk >= len(self.names) else self.at + len(part)
                if not part and self.chunk:
                    self.out += reply(CMD_STATUS, num, struct.pack(">II", SFTP_EOF, 0) + struct.pack(">I", 0))
                    continue
                body = struct.pack(">I", len(part))
                for name in part:
                    b = name.encode()
                    body += struct.pack(">I", len(b)) + b + struct.pack(">I", 0) + struct.pack(">II", 0x4, 0o40755)
                self.out += reply(CMD_NAME, num, body)
            else:
                assert t == CMD_CLOSE, t
                self.out += reply(CMD_STATUS, num, struct.pack(">II", SFTP_OK, 0) + struct.pack(">I", 0))
        self.parsed = len(self.sent)

    def recv(self, n: int) -> bytes:
        piece = bytes(self.out[:n])
        del self.out[:n]
        return piece


def list_dir(server: DirServer) -> Any:
    from sej.hub.sftp_source import SftpSource

    src = object.__new__(SftpSource)  # the operation only: bytes in, results out, no connection
    src.label = "test"
    (got,) = Pipeline(FakeSftp(server)).run([src._list_dir("/root")])  # type: ignore[arg-type]
    return got


@settings(max_examples=40, deadline=None)
@given(count=st.integers(0, 500), chunk=st.integers(1, 150))
def test_a_server_that_refuses_readdirs_read_ahead_is_listed_one_readdir_at_a_time(count: int, chunk: int) -> None:
    from paramiko.sftp import CMD_READDIR

    names = [f"d{k}" for k in range(count)]
    server = DirServer(names, chunk, refuse_ahead=True)
    got = list_dir(server)
    assert [name for name, _attrs in got] == names
    assert server.types.count(CMD_READDIR) <= 2 + -(-count // chunk) + 1  # the refused one, then one at a time


@settings(max_examples=60, deadline=None)
@given(count=st.integers(0, 2500), chunk=st.integers(1, 150))
def test_a_directory_is_listed_whole_with_readdirs_read_ahead_and_closed_once(count: int, chunk: int) -> None:
    from paramiko.sftp import CMD_CLOSE, CMD_OPENDIR, CMD_READDIR

    from sej.hub.sftp_source import READDIRS_AHEAD

    names = [".", ".."] + [f"d{k}" for k in range(count)]
    server = DirServer(names, chunk)
    got = list_dir(server)
    assert [name for name, _attrs in got] == names[2:]
    assert all(attrs.filename == name for name, attrs in got)
    readdirs = server.types.count(CMD_READDIR)
    needed = -(-len(names) // chunk) + 1  # the replies with entries, and one EOF
    # 2 READDIRs at first, then READDIRS_AHEAD at a time: at most a batch's worth past the EOF.
    assert readdirs == 2 if needed <= 2 else needed <= readdirs < needed + READDIRS_AHEAD, (readdirs, needed)
    assert server.types[0] == CMD_OPENDIR and server.types[-1] == CMD_CLOSE and server.types.count(CMD_CLOSE) == 1


def test_a_listing_that_makes_no_progress_or_never_ends_is_refused_and_its_directory_closed(monkeypatch) -> None:
    from paramiko.sftp import CMD_CLOSE

    from sej.hub import sftp_source as hub_source
    from sej.hub.source import SourceError

    server = DirServer(["a", "b"], 0)  # NAME replies without entries: no progress
    got = list_dir(server)
    assert isinstance(got, SourceError) and "a directory listing of 0 more entries after 0; refusing it" in str(got)
    assert server.types[-1] == CMD_CLOSE

    monkeypatch.setattr(hub_source, "MAX_LISTED", 1000)
    server = DirServer([f"d{k}" for k in range(100)], 100, endless=True)  # the same entries forever
    got = list_dir(server)
    assert isinstance(got, SourceError) and "more entries after 1000; refusing it" in str(got), got
    assert server.types[-1] == CMD_CLOSE
