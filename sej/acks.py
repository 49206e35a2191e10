"""Durable acknowledgements: futures that resolve once appended messages are fsynced.

`Writer.submit` appends a message (buffered, at append speed) and registers a
Future here. One committer thread per writer takes every future registered so
far, hands their bytes to the OS and waits for the writer's group commit
(sej.commit) to fsync them; then it resolves them all. While it waits, new
submissions collect for its next round, so one fsync covers every message
appended before it started, however many producers wait: the number of
messages per fsync grows with concurrency, not with threads.

Callbacks (`on_delivery`) and a Future's done-callbacks run on the committer
thread; `Writer.append_async` hands the result to the caller's event loop.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .writer import Writer

Delivery = Callable[[BaseException | None, Any], object]
"""`on_delivery(error, offsets)`: error None and the offset (or range) once durable, or the error and None."""

Pending = tuple[Any, "Future[Any]"]


class Acks:
    """The pending acknowledgements of one writer and the thread that makes them durable.

    `pending` is appended to under the writer's lock, with the message's bytes already
    in the writer's buffer, so a spill taken under the same lock covers every future
    taken with it.
    """

    __slots__ = ("pending", "_wake", "_ref", "_thread", "fsyncs", "__weakref__")

    def __init__(self, writer: Writer) -> None:
        self.pending: list[Pending] = []
        self._wake = threading.Event()
        self._ref = weakref.ref(writer)  # the thread must not keep an unclosed writer alive
        self.fsyncs = 0  # rounds that made futures durable (for benchmarks: messages per fsync)
        self._thread = threading.Thread(target=self._run, name=f"sej-acks {writer.dir}", daemon=True)
        self._thread.start()

    def add(self, result: Any, on_delivery: Delivery | None) -> Future[Any]:
        """A future for `result` (an offset or a range), durable with the bytes appended so far. Holds the
        writer's lock."""
        f: Future[Any] = Future()
        f.set_running_or_notify_cancel()
        if on_delivery is not None:
            f.add_done_callback(lambda done: _deliver(done, on_delivery))
        self.pending.append((result, f))
        self._wake.set()
        return f

    def take(self) -> list[Pending]:
        """Every pending future (holds the writer's lock)."""
        batch, self.pending = self.pending, []
        return batch

    def stop(self) -> None:
        """Let the thread end (the writer is closed; close() resolved what was left)."""
        self._wake.set()

    def _run(self) -> None:
        while True:
            self._wake.wait()
            self._wake.clear()
            w = self._ref()
            if w is None:
                return  # collected: its __del__ closed it and resolved every future
            batch, ticket = w._spill_for_acks(self)
            commit = w._commit
            closed = w.closed
            del w
            if batch:
                try:
                    commit.wait(ticket)
                except BaseException as e:
                    fail(batch, e)
                else:
                    self.fsyncs += 1
                    resolve(batch)
            if closed:
                return

    def join(self) -> None:
        if threading.current_thread() is not self._thread:  # a done-callback may close the writer
            self._thread.join()


def resolve(batch: list[Pending]) -> None:
    for result, f in batch:
        f.set_result(result)


def fail(batch: list[Pending], error: BaseException) -> None:
    for _, f in batch:
        f.set_exception(error)


def _deliver(done: Future[Any], on_delivery: Delivery) -> None:
    e = done.exception()
    on_delivery(e, None if e is not None else done.result())


__all__ = ["Acks", "Delivery", "Pending", "fail", "resolve"]
