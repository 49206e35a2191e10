"""Many SFTP requests in flight on one channel, so that a pass over a thousand journals is not a thousand round trips.

paramiko's SFTPClient waits for each reply before it sends the next request; only its readv
and prefetch keep several reads of one file in flight. A hub pass over 1,000 journals made
about 23 requests per journal, one after the other: 12 ms per journal, most of it waiting.

Here each operation (stat a file, list a directory, read ranges of a file, replace a small
file) is a generator that yields the requests it needs next, as a list, and gets their
replies back. `Pipeline.run` keeps up to `window` requests of all operations in flight and
resumes each operation when its replies are in, so independent operations overlap while
each one still runs its steps in order (lstat, then open, then read). It uses the same
paramiko internals as paramiko's own readv (`_async_request`, `_read_response`).
"""

from __future__ import annotations

import errno
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

WINDOW = 128
"""Requests in flight at most: well inside the SSH channel windows, so sending never waits on reading."""


class Pipeline:
    """Runs operations (generators of requests) over one SFTP channel with many requests in flight."""

    def __init__(self, sftp: paramiko.SFTPClient, window: int = WINDOW) -> None:
        self.sftp = sftp
        self.window = window
        self._unsent: deque[tuple[int, int, Request]] = deque()  # (operation, slot, request)
        self._in_flight: dict[int, tuple[int, int]] = {}  # request number -> (operation, slot)
        self._replies: dict[int, list[Reply | None]] = {}  # operation -> its replies so far
        self._missing: dict[int, int] = {}  # operation -> replies still to come
        self._complete: list[int] = []  # operations whose replies are all in

    def run(self, ops: Iterable[Op[Any]]) -> list[Any]:
        """Run every operation to its end; each one's return value, or the exception it raised.

        A transport failure (a cut connection, a timeout) propagates: the channel is unusable then.
        """
        try:
            return self._run(list(ops))
        finally:  # after a transport failure nothing in flight will be answered
            self._unsent.clear()
            self._in_flight.clear()
            self._replies.clear()
            self._missing.clear()
            self._complete.clear()

    def _run(self, gens: list[Op[Any]]) -> list[Any]:
        results: list[Any] = [None] * len(gens)
        ready: deque[tuple[int, list[Reply]]] = deque((k, []) for k in range(len(gens)))
        started: set[int] = set()
        while ready or self._unsent or self._in_flight:
            while ready:
                k, replies = ready.popleft()
                try:
                    requests = gens[k].send(replies) if k in started else next(gens[k])
                    started.add(k)
                except StopIteration as stop:
                    results[k] = stop.value
                    continue
                except Exception as e:  # this operation failed; the others go on
                    results[k] = e
                    continue
                if not requests:  # nothing asked would mean no progress
                    results[k] = RuntimeError("an SFTP operation asked for no requests")
                    continue
                self._replies[k] = [None] * len(requests)
                self._missing[k] = len(requests)
                self._unsent.extend((k, slot, r) for slot, r in enumerate(requests))
            while self._unsent and len(self._in_flight) < self.window:
                k, slot, (t, *args) = self._unsent.popleft()
                self._in_flight[self.sftp._async_request(self, t, *args)] = (k, slot)
            if self._in_flight:
                self.sftp._read_response()  # one reply, handed to _async_response
                for k in self._complete:
                    del self._missing[k]
                    ready.append((k, self._replies.pop(k)))  # type: ignore[arg-type]
                self._complete.clear()
        return results

    def _async_response(self, t: int, msg: paramiko.Message, num: int) -> None:
        """paramiko's callback for a reply to one of our requests."""
        got = self._in_flight.pop(num, None)
        if got is None:  # a reply to a run that a transport failure ended: nothing waits for it
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


__all__ = ["WINDOW", "Op", "Pipeline", "Reply", "Request", "expect", "expect_ok", "status_error"]
