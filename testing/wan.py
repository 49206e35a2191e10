"""A wide-area link on loopback: a TCP proxy on 127.0.0.1 with delay, a bandwidth cap and partitions (helper module).

    with Sshd() as server, Wan(server.port, rtt=0.050, mbit=200) as wan:
        ... connect to 127.0.0.1:wan.port instead of server.port ...
        wan.blackhole()    # a silent partition: bytes are held, nothing is closed
        wan.heal()         # what was held is delivered, in order
        wan.reset()        # every connection through it reset (RST both ways)

This kernel has no netem, so the link is simulated in user space. Each direction ("up", client to server, and
"down") is a delay line shared by every connection: a chunk read at time t is sent once the direction's link is
free (its bytes take len / rate seconds at the cap), and is delivered `delay` seconds after its last byte was
sent. Nothing is ever delivered before that time, so a measured delay can only be larger than configured (a
busy machine adds to it, never takes from it). One asyncio loop in one thread serves every connection and both
directions: no direction waits on another's timers.

A connection also pays the TCP handshake's round trip: the client's first bytes count as sent one round trip
after it connected (when its connect() would have returned), and the proxy connects to the server only then.

What it does not simulate: packet loss, reordering, jitter, and TCP's own congestion control (the sender's
window is the proxy's queue bound, MAX_QUEUE seconds of bytes at the cap, plus the kernel's socket buffers).
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import socket
import struct
import threading
from collections.abc import Callable
from dataclasses import dataclass
from types import TracebackType
from typing import Any

from .timing import scaled

HOST = "127.0.0.1"

CHUNK = 64 << 10
"""Bytes delivered as one unit at most (a larger read is split): at 200 Mbit/s, 2.6 ms on the wire."""

MAX_QUEUE = 0.050
"""Seconds of bytes (at the cap) a direction queues before the link: beyond that the proxy stops reading from
the sender, as a full router buffer and TCP's window would (a sender can never run far ahead of the cap)."""

CALL_TIMEOUT = scaled(10.0)
"""Seconds a call from another thread (blackhole, reset, close) waits for the proxy's loop."""


@dataclass
class Shape:
    """One direction of the link: a one-way `delay` in seconds, and a `rate` cap in bytes per second (None: none)."""

    delay: float = 0.0
    rate: float | None = None


class _Direction:
    """One direction's link: when it is next free to send, shared by every connection (a bandwidth cap is a link's)."""

    def __init__(self, shape: Shape) -> None:
        self.shape = shape
        self.free_at = 0.0  # loop time when the last byte queued so far leaves the sender's end

    def send(self, now: float, size: int) -> tuple[float, float]:
        """(when the chunk's last byte is sent, when it is delivered) for `size` bytes handed to the link at `now`."""
        start = max(now, self.free_at)
        sent = start + (size / self.shape.rate if self.shape.rate else 0.0)
        self.free_at = sent
        return sent, sent + self.shape.delay


_EOF = b""  # in a queue: the sender closed its end (delivered as a half-close)


class _Pipe:
    """Bytes from one socket to the other in one direction: a queue of (due time, chunk), delivered at their time."""

    def __init__(self, wan: Wan, link: _Direction, conn: _Connection) -> None:
        self.wan, self.link, self.conn = wan, link, conn
        self.src: _End | None = None
        self.dst: _End | None = None
        self.queue: collections.deque[tuple[float, bytes]] = collections.deque()
        self.timer: asyncio.TimerHandle | None = None
        self.not_before = 0.0  # the connection's handshake: nothing counts as sent before this loop time
        self.queue_full = False
        self.dst_full = False
        self.drain_timer: asyncio.TimerHandle | None = None

    def feed(self, data: bytes) -> None:
        now = self.wan.loop.time()
        for i in range(0, len(data), CHUNK) if data else [0]:
            chunk = data[i : i + CHUNK]
            _sent, due = self.link.send(max(now, self.not_before), len(chunk))
            self.queue.append((due, chunk))
        self._reading(now)
        self._schedule()

    def _reading(self, now: float) -> None:
        """Stop reading the sender while the link has more than MAX_QUEUE seconds queued; read again when it drains."""
        ahead = self.link.free_at - now
        rate = self.link.shape.rate
        self.queue_full = rate is not None and ahead > MAX_QUEUE
        if self.queue_full and self.drain_timer is None:
            self.drain_timer = self.wan.loop.call_at(self.link.free_at - MAX_QUEUE / 2, self._drained)
        self._flow()

    def _drained(self) -> None:
        self.drain_timer = None
        if self.queue_full:
            self._reading(self.wan.loop.time())

    def dst_paused(self, paused: bool) -> None:
        self.dst_full = paused
        self._flow()

    def _flow(self) -> None:
        if self.src is not None:
            self.src.reading(not (self.queue_full or self.dst_full))

    def _schedule(self) -> None:
        if self.timer is None and self.queue and not self.wan.blackholed:
            self.timer = self.wan.loop.call_at(self.queue[0][0], self.deliver)

    def deliver(self) -> None:
        self.timer = None
        if self.wan.blackholed or self.dst is None:
            return  # held: heal() (or the connection upstream) schedules it again
        now = self.wan.loop.time()
        while self.queue and self.queue[0][0] <= now:
            _due, chunk = self.queue.popleft()
            if not chunk:  # _EOF: a data chunk is never empty
                self.dst.eof()
            else:
                self.dst.write(chunk)
        self._schedule()


class _End(asyncio.Protocol):
    """One socket of a connection (the client's accepted one, or ours to the server)."""

    def __init__(self, conn: _Connection, name: str) -> None:
        self.conn, self.name = conn, name
        self.transport: asyncio.Transport | None = None
        self.out: _Pipe | None = None  # what this end reads goes into this pipe
        self.back: _Pipe | None = None  # the pipe that writes to this end
        self._reading = True
        self.closed = False
        self.eof_sent = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        if not self._reading:
            transport.pause_reading()

    def data_received(self, data: bytes) -> None:
        if self.out is not None:
            self.out.feed(data)

    def eof_received(self) -> bool:
        if self.out is not None:
            self.out.feed(_EOF)
        return True  # keep our end open: the other direction may still deliver

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.conn.lost(self, exc)

    def pause_writing(self) -> None:
        if self.back is not None:
            self.back.dst_paused(True)

    def resume_writing(self) -> None:
        if self.back is not None:
            self.back.dst_paused(False)

    def reading(self, on: bool) -> None:
        if on == self._reading:
            return
        self._reading = on
        if self.transport is not None and not self.closed:
            (self.transport.resume_reading if on else self.transport.pause_reading)()

    def write(self, data: bytes) -> None:
        if self.transport is not None and not self.closed and not self.eof_sent:
            self.transport.write(data)

    def eof(self) -> None:
        if self.transport is not None and not self.closed and not self.eof_sent:
            self.eof_sent = True
            try:
                if self.transport.can_write_eof():
                    self.transport.write_eof()
                else:
                    self.transport.close()
            except OSError:  # the peer is gone already (ENOTCONN): the connection ends
                self.conn.close(rst=True)
                return
        self.conn.maybe_done()

    def abort(self, rst: bool) -> None:
        if self.transport is not None and not self.closed:
            if rst:
                sock = self.transport.get_extra_info("socket")
                if sock is not None:  # SO_LINGER 0: close() sends a RST, not a FIN
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            self.transport.abort()


class _Connection:
    """A client's connection through the link, and the proxy's own to the server."""

    def __init__(self, wan: Wan) -> None:
        self.wan = wan
        self.client = _End(self, "client")
        self.server = _End(self, "server")
        self.up = _Pipe(wan, wan.up_link, self)
        self.down = _Pipe(wan, wan.down_link, self)
        self.up.src = self.client  # up.dst is set once the proxy has connected to the server
        self.down.src, self.down.dst = self.server, self.client
        self.client.out, self.client.back = self.up, self.down
        self.server.out, self.server.back = self.down, self.up
        self.done = False

    def start(self) -> None:
        """The client connected just now: its connect() would return one round trip later, and the server would
        accept half a round trip after that (the handshake's last ACK)."""
        loop = self.wan.loop
        now = loop.time()
        up, down = self.wan.up_link.shape.delay, self.wan.down_link.shape.delay
        self.up.not_before = now + up + down
        loop.call_at(now + 2 * up + down, lambda: loop.create_task(self._connect()))

    async def _connect(self) -> None:
        if self.done:
            return
        try:
            await self.wan.loop.create_connection(lambda: self.server, self.wan.target_host, self.wan.target_port)
        except OSError:
            self.close(rst=True)
            return
        if self.done:
            self.server.abort(rst=False)
            return
        self.up.dst = self.server
        self.up._schedule()

    def lost(self, end: _End, exc: Exception | None) -> None:
        """One socket is gone: a reset or error resets the other at once; a clean close closes it after what
        is queued towards it."""
        other = self.server if end is self.client else self.client
        pipe = self.up if end is self.client else self.down
        if exc is not None:
            self.close(rst=True)
        elif not other.closed:
            pipe.feed(_EOF)  # delivered in turn, after the bytes before it
        self.maybe_done()

    def maybe_done(self) -> None:
        """Close both sockets once both directions have ended."""
        if self.done:
            return
        ended = [(e.closed or e.eof_sent) for e in (self.client, self.server)]
        if all(ended) and not self.up.queue and not self.down.queue:
            self.close(rst=False)

    def close(self, rst: bool) -> None:
        if self.done:
            return
        self.done = True
        for pipe in (self.up, self.down):
            pipe.queue.clear()
            for timer in (pipe.timer, pipe.drain_timer):
                if timer is not None:
                    timer.cancel()
            pipe.timer = pipe.drain_timer = None
        for end in (self.client, self.server):
            if rst:
                end.abort(rst=True)
            elif end.transport is not None and not end.closed:
                end.transport.close()
        self.wan.connections.discard(self)


class Wan:
    """A TCP proxy on 127.0.0.1:`port` to `target_host`:`target_port`, shaped as a wide-area link.

    `rtt`: the round trip added (split evenly: rtt / 2 each way); `mbit`: the cap of each direction in Mbit/s
    (None: none). `up` and `down` (Shape) set each direction on its own instead. `shape(...)` changes them
    while it runs (chunks already queued keep their times). Runs its loop in a thread of its own until close().
    """

    def __init__(self, target_port: int, *, rtt: float = 0.0, mbit: float | None = None,
                 up: Shape | None = None, down: Shape | None = None, target_host: str = HOST) -> None:  # fmt: skip
        self.target_host, self.target_port = target_host, target_port
        rate = None if mbit is None else mbit * 1e6 / 8
        self.up_link = _Direction(up or Shape(rtt / 2, rate))
        self.down_link = _Direction(down or Shape(rtt / 2, rate))
        self.blackholed = False
        self.connections: set[_Connection] = set()
        self.accepted = 0  # connections accepted so far
        self.loop = asyncio.new_event_loop()
        self._server: asyncio.AbstractServer | None = None
        self._thread = threading.Thread(target=self._run, name=f"wan->{target_port}", daemon=True)
        self._thread.start()
        try:
            self._server = self._call(self._listen)
        except BaseException:
            self.close()
            raise
        self.port: int = self._server.sockets[0].getsockname()[1]

    # -- the loop's thread -------------------------------------------------------------------------------

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    async def _listen(self) -> asyncio.AbstractServer:
        return await self.loop.create_server(self._accept, HOST, 0, backlog=128)

    def _accept(self) -> _End:
        conn = _Connection(self)
        self.connections.add(conn)
        self.accepted += 1
        conn.start()
        return conn.client

    def _call(self, fn: Callable[[], Any]) -> Any:
        """Run `fn` (a function, or a coroutine function) in the loop's thread and return its result."""

        async def run() -> Any:
            out = fn()
            return await out if asyncio.iscoroutine(out) else out

        fut: concurrent.futures.Future[Any] = asyncio.run_coroutine_threadsafe(run(), self.loop)
        return fut.result(CALL_TIMEOUT)

    # -- control -----------------------------------------------------------------------------------------

    def shape(self, *, rtt: float | None = None, mbit: float | None = None, up: Shape | None = None,
              down: Shape | None = None) -> None:  # fmt: skip
        """Change the link: `rtt` and `mbit` for both directions (each only if given), or each `up` and `down`."""

        def change() -> None:
            for link, new in ((self.up_link, up), (self.down_link, down)):
                if new is not None:
                    link.shape = Shape(new.delay, new.rate)
                    continue
                if rtt is not None:
                    link.shape = Shape(rtt / 2, link.shape.rate)
                if mbit is not None:
                    link.shape = Shape(link.shape.delay, mbit * 1e6 / 8)

        self._call(change)

    def blackhole(self) -> None:
        """A silent partition: from now on nothing is delivered either way, and nothing is closed; bytes sent meanwhile
        are held (up to the queue bound, then the senders' socket buffers fill up, as over a real dead link)."""

        def hold() -> None:
            self.blackholed = True
            for conn in self.connections:
                for pipe in (conn.up, conn.down):
                    if pipe.timer is not None:
                        pipe.timer.cancel()
                        pipe.timer = None

        self._call(hold)

    def heal(self) -> None:
        """End the partition: what was held is delivered now, in order, and what follows at its times."""

        def release() -> None:
            self.blackholed = False
            for conn in list(self.connections):
                for pipe in (conn.up, conn.down):
                    pipe.deliver()

        self._call(release)

    def reset(self) -> int:
        """Reset every connection through the link (RST to both ends, queued bytes dropped); how many there were.
        The proxy keeps listening: new connections work."""

        def reset_all() -> int:
            conns = list(self.connections)
            for conn in conns:
                conn.close(rst=True)
            return len(conns)

        return int(self._call(reset_all))

    def held(self) -> int:
        """Bytes past their delivery time but not delivered (held by a blackhole), both ways, all connections."""

        def count() -> int:
            now = self.loop.time()
            return sum(len(c) for conn in self.connections for pipe in (conn.up, conn.down)
                       for due, c in pipe.queue if due <= now)  # fmt: skip

        return int(self._call(count))

    def open_connections(self) -> int:
        """Connections through the link now."""
        return int(self._call(lambda: len(self.connections)))

    def close(self) -> None:
        """Reset every connection, stop listening and end the loop's thread."""
        if not self._thread.is_alive():
            return
        try:
            if self._server is not None:
                self.reset()

                async def stop() -> None:
                    assert self._server is not None
                    self._server.close()
                    await self._server.wait_closed()

                self._call(stop)
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(CALL_TIMEOUT)
            if not self._thread.is_alive():
                self.loop.close()

    def __enter__(self) -> Wan:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:  # fmt: skip
        self.close()

    def __repr__(self) -> str:
        up, down = self.up_link.shape, self.down_link.shape
        return f"Wan(127.0.0.1:{self.port} -> {self.target_host}:{self.target_port}, up={up}, down={down})"
