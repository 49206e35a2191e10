"""Many SFTP requests in flight on one channel, so that a pass over a thousand journals is not a thousand round trips.

paramiko's SFTPClient waits for each reply before it sends the next request; only its readv
and prefetch keep several reads of one file in flight. A hub pass over 1,000 journals made
about 23 requests per journal, one after the other: 12 ms per journal, most of it waiting.

Here each operation (stat a file, list a directory, read ranges of a file, replace a small
file) is a generator that yields the requests it needs next, as a list, and gets their
replies back. `Pipeline.run` keeps up to `window` requests of all operations in flight and
resumes each operation when its replies are in, so independent operations overlap while
each one still runs its steps in order (lstat, then open, then read).

The SFTP framing is done here, over paramiko's channel: the requests the window allows go
out in one write (one SSH packet for many; paramiko's SFTPClient sends a packet each), and
every reply that has arrived is parsed at once (paramiko hands them over one by one, through
its transport thread). That made a request 3-4x cheaper in interpreter time. Request numbers
come from the SFTPClient's own counter, under its lock, so paramiko's calls on the same
channel between runs (its readv for big reads) never reuse one.
"""

from __future__ import annotations

import errno
import struct
from collections import deque
from collections.abc import Generator, Iterable
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    import paramiko

T = TypeVar("T")

Request = tuple[Any, ...]
"""(SFTP packet type, *arguments) as paramiko's `_async_request` takes them."""

Reply = tuple[int, "paramiko.Message"]
"""(SFTP packet type, message) of one reply."""

Op = Generator[list[Request], list[Reply], T]
"""An operation: yields the requests it needs next (sent at once), gets their replies in order."""

WINDOW = 2048
"""Requests in flight at most. A request is small (a path, a handle; a few hundred bytes at most), so 2,048 of them
stay well inside the SSH channel windows (2 MiB) and sending never waits on reading; the replies' size is the
server's to hold back (OpenSSH's sftp-server reads no request while its output is full). Far away the window is
the pace: a channel answers at most WINDOW requests a round trip. At +50 ms (testing/wan), a first `sej copy` of
1,000 journals listed them (about 6,000 requests on one channel) in 3.3 s with 128, in 0.5 s with 2,048."""

MAX_OPS = 1024
"""Operations under way at once (each may hold a file open on the server), the others waiting their turn; fewer
when the server says it allows fewer files open (SftpSource: half its limit)."""

MAX_PACKET = 4 << 20
"""The largest SFTP reply taken (OpenSSH's are at most 256 KiB); a bigger length is a broken stream."""

RECEIVE = 1 << 20
"""Bytes taken from the channel at once: every reply that has arrived, parsed together."""


class Pipeline:
    """Runs operations (generators of requests) over one SFTP channel with many requests in flight."""

    def __init__(self, sftp: paramiko.SFTPClient, window: int = WINDOW, max_ops: int = MAX_OPS) -> None:
        self.sftp = sftp
        self.window = window
        self.max_ops = max_ops
        self._unsent: deque[tuple[int, int, Request]] = deque()  # (operation, slot, request)
        self._in_flight: dict[int, tuple[int, int]] = {}  # request number -> (operation, slot)
        self._replies: dict[int, list[Reply | None]] = {}  # operation -> its replies so far
        self._missing: dict[int, int] = {}  # operation -> replies still to come
        self._complete: list[int] = []  # operations whose replies are all in
        self._buffer = bytearray()  # received, not yet parsed
        self._strays = 0  # replies to no request of this run
        self._paths: dict[int, bytes] = {}  # request number -> the path it names, if any (for `stuck`)
        self.stuck: list[str] = []  # after a transport failure: the paths of (some of) the requests in flight

    def run(self, ops: Iterable[Op[Any]]) -> list[Any]:
        """Run every operation to its end; each one's return value, or the exception it raised.

        A transport failure (a cut connection, a timeout) propagates: the channel is unusable then,
        and `stuck` names the paths of the first STUCK_SHOWN requests left in flight.
        """
        self.stuck = []
        try:
            return self._run(list(ops))
        except BaseException:
            firsts = sorted(self._paths.items())[:STUCK_SHOWN]
            self.stuck = [p.decode("utf-8", "backslashreplace") for _, p in firsts]
            raise
        finally:  # after a transport failure nothing in flight will be answered
            self._paths.clear()
            self._unsent.clear()
            self._in_flight.clear()
            self._replies.clear()
            self._missing.clear()
            self._complete.clear()
            self._buffer.clear()
            self._strays = 0

    def _send(self) -> None:
        """Send the requests the window allows, as one write: one SSH packet for many of them
        (paramiko's SFTPClient sends each in a packet of its own)."""
        from paramiko import Message, SFTPAttributes
        from paramiko.sftp import int64

        count = min(len(self._unsent), self.window - len(self._in_flight))
        with self.sftp._lock:  # request numbers shared with paramiko's own calls on this channel
            first = self.sftp.request_number
            self.sftp.request_number += count
        out = []
        for num in range(first, first + count):
            k, slot, (t, *args) = self._unsent.popleft()
            msg = Message()
            msg.add_int(num)
            for item in args:  # as paramiko's _async_request encodes them
                if isinstance(item, int64):
                    msg.add_int64(item)
                elif isinstance(item, int):
                    msg.add_int(item)
                elif isinstance(item, SFTPAttributes):
                    item._pack(msg)
                else:
                    msg.add_string(item)
            body = msg.asbytes()
            out.append(_HEAD.pack(len(body) + 1, t))
            out.append(body)
            self._in_flight[num] = (k, slot)
            if t in _NAMES_A_PATH and isinstance(args[0], bytes):
                self._paths[num] = args[0][:MAX_SHOWN]
        self.sftp.sock.sendall(b"".join(out))

    def _receive(self) -> None:
        """Take what has arrived (waiting for some) and hand each whole reply in it to its operation."""
        from paramiko import Message

        data = self.sftp.sock.recv(RECEIVE)
        if not data:
            raise EOFError("the SFTP channel closed")
        buf = self._buffer
        buf += data
        pos, end = 0, len(buf)
        while end - pos >= 5:
            size, t = _HEAD.unpack_from(buf, pos)
            if not 5 <= size <= MAX_PACKET:
                raise SFTPStreamError(f"an SFTP reply of {size} bytes")
            if end - pos - 4 < size:
                break
            msg = Message(bytes(buf[pos + 5 : pos + 4 + size]))
            pos += 4 + size
            self._async_response(t, msg, msg.get_int())
        del buf[:pos]

    def _run(self, gens: list[Op[Any]]) -> list[Any]:
        results: list[Any] = [None] * len(gens)
        # At most `max_ops` operations under way at once: each may hold a file open on the server (until its
        # CLOSE, which goes out behind every first request already queued), whose open files are limited.
        waiting = deque(range(len(gens)))
        ready: deque[tuple[int, list[Reply]]] = deque()
        started: set[int] = set()
        active = 0
        while waiting or ready or self._unsent or self._in_flight:
            while waiting and active < self.max_ops:
                ready.append((waiting.popleft(), []))
                active += 1
            while ready:
                k, replies = ready.popleft()
                try:
                    requests = gens[k].send(replies) if k in started else next(gens[k])
                    started.add(k)
                except StopIteration as stop:
                    results[k] = stop.value
                    active -= 1
                    continue
                except Exception as e:  # this operation failed; the others go on
                    results[k] = e
                    active -= 1
                    continue
                if not requests:  # nothing asked would mean no progress
                    results[k] = RuntimeError("an SFTP operation asked for no requests")
                    active -= 1
                    continue
                self._replies[k] = [None] * len(requests)
                self._missing[k] = len(requests)
                self._unsent.extend((k, slot, r) for slot, r in enumerate(requests))
            if self._unsent and len(self._in_flight) < self.window:
                self._send()
            if self._in_flight:
                self._receive()
                for k in self._complete:
                    del self._missing[k]
                    ready.append((k, self._replies.pop(k)))  # type: ignore[arg-type]
                self._complete.clear()
        if self._buffer:
            raise SFTPStreamError(f"{len(self._buffer)} bytes after the last reply")
        return results

    def _async_response(self, t: int, msg: paramiko.Message, num: int) -> None:
        """paramiko's callback for a reply to one of our requests."""
        got = self._in_flight.pop(num, None)
        self._paths.pop(num, None)
        if got is None:  # a reply to no request of ours: never more of them than we asked
            self._strays += 1
            if self._strays > self.window:
                raise SFTPStreamError(f"{self._strays} replies to no request")
            return
        k, slot = got
        self._replies[k][slot] = (t, msg)
        self._missing[k] -= 1
        if self._missing[k] == 0:
            self._complete.append(k)

    def one(self, op: Op[T]) -> T:
        """Run one operation; its return value (its exception is raised)."""
        (result,) = self.run([op])
        if isinstance(result, Exception):
            raise result
        return result  # type: ignore[no-any-return]


def together(*ops: Op[Any]) -> Op[list[Any]]:
    """Operations side by side as one: each round sends the next requests of every one still going, together.
    Each one's result, or the exception it raised (the others go on)."""
    results: list[Any] = [None] * len(ops)
    asked: dict[int, list[Request]] = {}
    for k, op in enumerate(ops):
        try:
            asked[k] = next(op)
        except StopIteration as stop:
            results[k] = stop.value
        except Exception as e:
            results[k] = e
    while asked:
        order = list(asked)
        replies = yield [r for k in order for r in asked[k]]
        pos = 0
        for k in order:
            n = len(asked[k])
            part, pos = replies[pos : pos + n], pos + n
            try:
                asked[k] = ops[k].send(part)
            except StopIteration as stop:
                results[k] = stop.value
                del asked[k]
            except Exception as e:
                results[k] = e
                del asked[k]
    return results


_HEAD = struct.Struct(">IB")

STUCK_SHOWN = 3
"""Paths of requests in flight that a transport failure names (a timeout: what the server was stuck on)."""

MAX_SHOWN = 300
"""Bytes of such a path shown at most."""

_NAMES_A_PATH = frozenset((3, 7, 11, 16, 17))  # SSH_FXP_OPEN, LSTAT, OPENDIR, REALPATH, STAT: a path first


class SFTPStreamError(OSError):
    """The server's SFTP stream is broken (a reply no request asked for, an impossible length)."""


def status_error(msg: paramiko.Message) -> OSError | EOFError | None:
    """The error a STATUS reply stands for (as paramiko's own calls raise it), None for OK."""
    from paramiko.sftp import SFTP_EOF, SFTP_NO_SUCH_FILE, SFTP_OK, SFTP_PERMISSION_DENIED

    code = msg.get_int()
    text = msg.get_text()
    if code == SFTP_OK:
        return None
    if code == SFTP_EOF:
        return EOFError(text)
    if code == SFTP_NO_SUCH_FILE:
        return FileNotFoundError(errno.ENOENT, text)
    if code == SFTP_PERMISSION_DENIED:
        return PermissionError(errno.EACCES, text)
    return OSError(text)


def expect(reply: Reply, t: int) -> paramiko.Message:
    """The message of a reply of type `t`; the error a STATUS reply stands for is raised."""
    from paramiko.sftp import CMD_STATUS

    got, msg = reply
    if got == CMD_STATUS:
        error = status_error(msg)
        if error is not None:
            raise error
    if got != t:
        raise OSError(f"unexpected SFTP reply type {got} (expected {t})")
    return msg


def expect_ok(reply: Reply) -> None:
    """Raise the error of a STATUS reply that is not OK."""
    from paramiko.sftp import CMD_STATUS

    got, msg = reply
    if got != CMD_STATUS:
        raise OSError(f"unexpected SFTP reply type {got} (expected a status)")
    error = status_error(msg)
    if error is not None:
        raise error


__all__ = ["WINDOW", "Op", "Pipeline", "Reply", "Request", "expect", "expect_ok", "status_error", "together"]
