"""testing/wan.py, the loopback WAN: delay, bandwidth cap, blackhole and reset, measured against a real echo server.

A delay proxy may be slower than configured on a loaded machine, never faster: lower bounds are strict, upper
bounds are scaled (testing/timing.py).
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator

import pytest

from testing.timing import scaled, wait_until
from testing.wan import Shape, Wan

IO = scaled(10.0)  # seconds a socket call may block at most: every loop here ends


class Echo:
    """A TCP echo server on 127.0.0.1: one thread per connection, each echoing until EOF; counts what it got."""

    def __init__(self, sink: bool = False) -> None:
        self.sink = sink  # count the bytes, echo nothing
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.listener.settimeout(IO)
        self.port = self.listener.getsockname()[1]
        self.received = bytearray()
        self.lock = threading.Lock()
        self.ended: list[BaseException | None] = []  # per connection: None for EOF, else the error
        self.closing = False
        self.threads: list[threading.Thread] = []
        self.acceptor = threading.Thread(target=self._accept, daemon=True)
        self.acceptor.start()

    def _accept(self) -> None:
        while not self.closing:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            t = threading.Thread(target=self._serve, args=(conn,), daemon=True)
            self.threads.append(t)
            t.start()

    def _serve(self, conn: socket.socket) -> None:
        conn.settimeout(IO)
        with conn:
            try:
                while True:
                    data = conn.recv(1 << 16)
                    if not data:
                        break
                    with self.lock:
                        self.received += data
                    if not self.sink:
                        conn.sendall(data)
                self.ended.append(None)
            except OSError as e:
                self.ended.append(e)

    def close(self) -> None:
        self.closing = True
        self.listener.close()
        for t in self.threads:
            t.join(IO)


@pytest.fixture
def echo() -> Iterator[Echo]:
    server = Echo()
    yield server
    server.close()


def connect(wan: Wan) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", wan.port), timeout=IO)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return s


def recv_exactly(s: socket.socket, n: int) -> bytes:
    out = bytearray()
    while len(out) < n:
        data = s.recv(min(1 << 20, n - len(out)))
        if not data:
            raise EOFError(f"EOF after {len(out)} of {n} bytes")
        out += data
    return bytes(out)


def ping(s: socket.socket, payload: bytes = b"ping") -> float:
    t = time.monotonic()
    s.sendall(payload)
    assert recv_exactly(s, len(payload)) == payload
    return time.monotonic() - t


def test_round_trip_is_the_configured_delay_never_less(echo: Echo) -> None:
    with Wan(echo.port, rtt=0.080) as wan:
        started = time.monotonic()
        with connect(wan) as s:
            ping(s)
            first = time.monotonic() - started  # the first exchange also pays the TCP handshake's round trip
            rtts = [ping(s) for _ in range(5)]
    assert first >= 2 * 0.080
    assert all(r >= 0.080 for r in rtts), rtts
    assert min(rtts) <= 0.080 + scaled(0.05), rtts


def test_each_direction_has_its_own_delay(echo: Echo) -> None:
    with Wan(echo.port, up=Shape(0.060), down=Shape(0.010)) as wan, connect(wan) as s:
        ping(s)
        rtts = [ping(s) for _ in range(3)]
    assert all(r >= 0.070 for r in rtts), rtts
    assert min(rtts) <= 0.070 + scaled(0.05), rtts


def test_shape_changes_the_delay_of_a_running_link(echo: Echo) -> None:
    with Wan(echo.port, rtt=0.010) as wan, connect(wan) as s:
        ping(s)
        wan.shape(rtt=0.120)
        assert ping(s) >= 0.120


def test_bandwidth_is_capped_per_direction_and_both_run_at_once() -> None:
    """2 MB each way at 16 Mbit/s (2 MB/s per direction): each direction takes >= 1 s, both together not 2 s more."""
    sink = Echo(sink=True)
    size, mbit = 2_000_000, 16
    try:
        with Wan(sink.port, rtt=0.020, mbit=mbit) as wan:
            # Up: to the sink. Down: a server that sends, through a second link of the same proxy class.
            sender = socket.create_server(("127.0.0.1", 0))
            sender.settimeout(IO)

            def send_down() -> None:
                conn, _ = sender.accept()
                with conn:
                    conn.settimeout(IO)
                    conn.sendall(b"d" * size)

            t = threading.Thread(target=send_down, daemon=True)
            t.start()
            with Wan(sender.getsockname()[1], rtt=0.020, mbit=mbit) as down_wan:
                up_sock, down_sock = connect(wan), connect(down_wan)
                got: list[float] = []

                def receive() -> None:
                    recv_exactly(down_sock, size)
                    got.append(time.monotonic())

                r = threading.Thread(target=receive, daemon=True)
                t0 = time.monotonic()
                r.start()
                up_sock.sendall(b"u" * size)
                up_sock.shutdown(socket.SHUT_WR)
                wait_until(lambda: len(sink.received) >= size, scaled(10), "the upload to arrive")
                up_done = time.monotonic()
                r.join(IO)
                up_sock.close()
                down_sock.close()
            t.join(IO)
            sender.close()
    finally:
        sink.close()
    assert got, "the download did not finish"
    floor = size * 8 / (mbit * 1e6)  # 1.0 s at the cap
    assert up_done - t0 >= floor and got[0] - t0 >= floor, (up_done - t0, got[0] - t0)
    assert max(up_done, got[0]) - t0 <= floor + scaled(0.5)


def test_one_link_shares_its_cap_between_connections(echo: Echo) -> None:
    """Two connections uploading 1 MB each at 16 Mbit/s share one link: together they take >= 1 s."""
    sink = Echo(sink=True)
    size = 1_000_000
    try:
        with Wan(sink.port, mbit=16) as wan:
            a, b = connect(wan), connect(wan)
            t0 = time.monotonic()
            ta = threading.Thread(target=a.sendall, args=(b"a" * size,), daemon=True)
            ta.start()
            b.sendall(b"b" * size)
            ta.join(IO)
            wait_until(lambda: len(sink.received) >= 2 * size, scaled(10), "both uploads to arrive")
            took = time.monotonic() - t0
            a.close()
            b.close()
    finally:
        sink.close()
    assert took >= 2 * size * 8 / 16e6


def test_a_delay_holds_under_load(echo: Echo) -> None:
    """Pings through a link that is also carrying a bulk upload on another connection still take >= the delay,
    and are not held behind the upload's queue for long (MAX_QUEUE)."""
    sink = Echo(sink=True)
    try:
        with Wan(sink.port, rtt=0.040, mbit=100) as bulk_wan, Wan(echo.port, rtt=0.040, mbit=100) as wan:
            bulk = connect(bulk_wan)
            stop = threading.Event()

            def upload() -> None:
                try:
                    for _ in range(200):  # at most 200 MB, about 16 s at the cap; stopped long before
                        if stop.is_set():
                            return
                        bulk.sendall(b"x" * 1_000_000)
                except OSError:
                    pass

            t = threading.Thread(target=upload, daemon=True)
            t.start()
            with connect(wan) as s:
                ping(s)
                wait_until(lambda: len(sink.received) > 2_000_000, scaled(10), "the upload to be under way")
                rtts = [ping(s) for _ in range(10)]
            stop.set()
            bulk.close()
            t.join(IO)
    finally:
        sink.close()
    assert all(r >= 0.040 for r in rtts), rtts
    assert sorted(rtts)[len(rtts) // 2] <= 0.040 + scaled(0.05), rtts


def test_blackhole_holds_bytes_closes_nothing_and_heal_delivers_them_in_order(echo: Echo) -> None:
    with Wan(echo.port, rtt=0.020) as wan, connect(wan) as s:
        ping(s)
        wan.blackhole()
        sent = b"".join(b"%05d," % i for i in range(1000))
        s.sendall(sent)
        # Every byte is past its delivery time, and held: the server has none of them, and the connection is open.
        wait_until(lambda: wan.held() == len(sent), scaled(5), "the proxy to hold every byte sent")
        assert bytes(echo.received) == b"ping"
        assert wan.open_connections() == 1 and not echo.ended
        s.settimeout(0.0)
        with pytest.raises(BlockingIOError):
            s.recv(1)  # nothing came back either, and no EOF
        s.settimeout(IO)
        wan.heal()
        assert recv_exactly(s, len(sent)) == sent
        assert bytes(echo.received) == b"ping" + sent
        assert ping(s, b"after") >= 0.020


def test_a_connection_made_during_a_blackhole_works_once_healed(echo: Echo) -> None:
    with Wan(echo.port, rtt=0.010) as wan:
        wan.blackhole()
        with connect(wan) as s:
            s.sendall(b"early")
            wait_until(lambda: wan.held() >= 5, scaled(5), "the proxy to hold the first bytes")
            wan.heal()
            assert recv_exactly(s, 5) == b"early"


def test_reset_resets_every_connection_and_new_ones_work(echo: Echo) -> None:
    with Wan(echo.port, rtt=0.010) as wan:
        a, b = connect(wan), connect(wan)
        ping(a)
        ping(b)
        assert wan.reset() == 2
        for s in (a, b):
            with pytest.raises((ConnectionResetError, EOFError, BrokenPipeError)):
                for _ in range(10):  # a reset shows on the first recv, or on a send after it
                    ping(s)
            s.close()
        wait_until(lambda: len(echo.ended) == 2, scaled(5), "the server to see both connections end")
        assert all(isinstance(e, ConnectionResetError) for e in echo.ended), echo.ended
        assert wan.open_connections() == 0
        with connect(wan) as c:
            assert ping(c, b"again") >= 0.010


def test_a_clean_close_is_passed_on_after_the_bytes_before_it(echo: Echo) -> None:
    with Wan(echo.port, rtt=0.020) as wan, connect(wan) as s:
        s.sendall(b"last words")
        s.shutdown(socket.SHUT_WR)
        assert recv_exactly(s, 10) == b"last words"
        assert s.recv(1) == b""  # the echo server closed after our EOF reached it
        wait_until(lambda: wan.open_connections() == 0, scaled(5), "the proxy to let the connection go")
