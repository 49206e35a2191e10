"""Group commit: threads waiting for their bytes to be durable share fsyncs.

The first thread to need an fsync leads: it fsyncs everything written so far and
wakes exactly the waiting threads that fsync covered. While threads wait for bytes
written during that fsync, it fsyncs again for them at once (up to LEAD_ROUNDS
times) rather than handing over to a thread that must wake first.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import IO

from .errors import SyncError

LEAD_ROUNDS = 8
"""At most this many fsyncs in a row by one leading thread (bounds its own wait)."""

_fdatasync = getattr(os, "fdatasync", os.fsync)


class GroupCommit:
    """Tracks how many bytes a writer has made durable, and fsyncs for waiting threads.

    `position()` (given by the writer) returns (bytes written so far, descriptor of
    the file they end in); it is called without the writer's lock, so the writer must
    count bytes before it switches files, and fsync a file before it leaves it.
    """

    __slots__ = ("lock", "durable", "failed", "_position", "_syncing", "_external", "_waiting", "_events", "_retired")

    def __init__(self, position: Callable[[], tuple[int, int]]) -> None:
        self.lock = threading.Lock()  # guards the state below
        self.durable = 0  # bytes known to be fsynced
        self.failed: SyncError | None = None  # an fsync failed: every later wait fails (see SyncError)
        self._position = position
        self._syncing = False  # a thread is leading fsyncs, or an fsync made elsewhere is running
        self._external: Callable[[], None] | None = None  # waits for that fsync made elsewhere, and ends it
        self._waiting: list[tuple[int, threading.Event]] = []  # (ticket, wake-up) of waiting threads
        self._events = threading.local()  # each thread's reusable wake-up Event
        self._retired: list[IO[bytes]] = []  # finished files a running fsync may still use

    def wait(self, ticket: int) -> None:
        """Return once the first `ticket` written bytes are fsynced; SyncError once an fsync failed."""
        while True:
            with self.lock:
                if self.failed is not None:  # first: a later fsync's success does not undo it (see SyncError)
                    raise self.failed
                if self.durable >= ticket:
                    return
                if not self._syncing:
                    self._syncing = True
                    break
                external = self._external
                if external is None:
                    event = self._enqueue(ticket)
            if external is not None:
                # Not a wait for the event loop that started it: this may be its thread (a sync() in a coroutine).
                external()
                continue
            event.wait()  # covered, or asked to lead
        try:
            for _ in range(LEAD_ROUNDS):
                target, fd = self._position()
                try:
                    _fdatasync(fd)
                except OSError as e:
                    err = SyncError(f"fsync of {describe(fd)} failed: {e}")
                    err.__cause__ = e
                    self.fail(err)
                    raise err from e
                with self.lock:
                    if target > self.durable:
                        self.durable = target
                    if not self._wake_covered():
                        break
        finally:
            with self.lock:
                self._syncing = False
                if self._waiting:  # hand over to a thread still waiting
                    self._waiting.pop(0)[1].set()
        if self._retired:
            with self.lock:
                if not self._syncing:
                    self._close_retired()

    def lead_locked(self, ticket: int) -> None:
        """Lead for an fsync the writer makes under its own lock (a rollover): wait for a thread's lead
        to end (a leading thread never takes the writer's lock). The caller ended an external lead first."""
        while True:
            with self.lock:
                if self.failed is not None:
                    raise self.failed
                if not self._syncing:
                    self._syncing = True
                    return
                assert self._external is None, "end the loop's fsync first"
                event = self._enqueue(ticket)  # woken once covered, or by a hand-over
            event.wait()

    def try_lead(self, wait: Callable[[], None]) -> bool:
        """Lead for an fsync made elsewhere (sej.acks.LoopAcks): False if a thread is fsyncing now.

        Two fsyncs of one file at once must not happen: the kernel reports a write-back error
        to one of them only, and the other one's success would acknowledge lost bytes. A thread
        that needs an fsync meanwhile calls `wait()`, which must return once end_lead() was called.
        """
        with self.lock:
            if self._syncing or self.failed is not None:
                return False
            self._syncing = True
            self._external = wait
            return True

    def end_lead(self, durable: int, err: SyncError | None) -> None:
        """The fsync begun after try_lead() ended: the first `durable` bytes are durable, or it failed with
        `err`. Wakes the threads it covered (all of them with the error), and hands over to one still waiting."""
        with self.lock:
            if err is not None:
                self._fail(err)
            elif durable > self.durable:
                self.durable = durable
                self._wake_covered()
            self._syncing = False
            self._external = None
            if self._waiting:
                self._waiting.pop(0)[1].set()
            self._close_retired()

    def use_position(self, position: Callable[[], tuple[int, int]]) -> Callable[[], tuple[int, int]]:
        """Use `position` from now on; the one it replaces. (A writer closed by its __del__ can no longer be
        reached through the weak reference its usual position() holds.)"""
        old, self._position = self._position, position
        return old

    def fail(self, err: SyncError) -> None:
        """An fsync failed: this and every later wait raise `err` (the first such error is kept)."""
        with self.lock:
            self._fail(err)

    def _fail(self, err: SyncError) -> None:
        if self.failed is None:
            self.failed = err
        for _, event in self._waiting:  # each one wakes and raises it
            event.set()
        self._waiting = []

    def left_file(self, written: int, file: IO[bytes] | None) -> None:
        """The writer fsynced `file`, holding all `written` bytes, and moved on: close it when unused."""
        with self.lock:
            self.durable = written
            if file is not None:
                self._retired.append(file)
            if not self._syncing:
                self._close_retired()
            self._wake_covered()

    def close(self) -> None:
        with self.lock:
            self._close_retired()

    def _close_retired(self) -> None:
        for f in self._retired:
            f.close()
        self._retired.clear()

    def _enqueue(self, ticket: int) -> threading.Event:
        """This thread's wake-up, cleared and queued for `ticket`. Holds self.lock."""
        event: threading.Event | None = getattr(self._events, "event", None)
        if event is None:
            event = self._events.event = threading.Event()
        event.clear()
        self._waiting.append((ticket, event))
        return event

    def _wake_covered(self) -> bool:
        """Wake the waiters whose bytes are durable; True if some still wait. Holds self.lock."""
        durable = self.durable
        still = []
        for ticket, event in self._waiting:
            if ticket <= durable:
                event.set()
            else:
                still.append((ticket, event))
        self._waiting = still
        return bool(still)


def describe(fd: int) -> str:
    """The file behind a descriptor, for errors."""
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return f"descriptor {fd}"


__all__ = ["GroupCommit", "LEAD_ROUNDS"]
