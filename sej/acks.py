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

import asyncio
import threading
import weakref
from collections.abc import Callable
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .writer import Writer

Delivery = Callable[[BaseException | None, Any], object]
"""`on_delivery(error, offsets)`: error None and the offset (or range) once durable, or the error and None."""

Pending = tuple[Any, Any]
"""(result, target): target is a concurrent Future, or (event loop, asyncio future) for append_async."""


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
        pending = self.pending
        pending.append((result, f))
        if len(pending) == 1:  # the first since the thread took the last batch: it may be asleep
            self._wake.set()
        return f

    def add_async(self, result: Any, loop: asyncio.AbstractEventLoop, fut: asyncio.Future[Any]) -> None:
        """Resolve the asyncio future `fut` of `loop` with `result` once durable. Holds the writer's lock."""
        pending = self.pending
        pending.append((result, (loop, fut)))
        if len(pending) == 1:
            self._wake.set()

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
    """Resolve each future with its result; asyncio futures in one hand-off per event loop."""
    loops: dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Future[Any], Any]]] = {}
    for result, target in batch:
        if isinstance(target, Future):
            target.set_result(result)
        else:
            loops.setdefault(target[0], []).append((target[1], result))
    _hand_over(loops, None)


def fail(batch: list[Pending], error: BaseException) -> None:
    loops: dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Future[Any], Any]]] = {}
    for _, target in batch:
        if isinstance(target, Future):
            target.set_exception(error)
        else:
            loops.setdefault(target[0], []).append((target[1], None))
    _hand_over(loops, error)


def _hand_over(loops: dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Future[Any], Any]]],
               error: BaseException | None) -> None:  # fmt: skip
    for loop, items in loops.items():
        try:
            loop.call_soon_threadsafe(_settle, items, error)
        except RuntimeError:  # the loop is closed: nobody awaits these any more
            pass


def _settle(items: list[tuple[asyncio.Future[Any], Any]], error: BaseException | None) -> None:
    for fut, result in items:
        if not fut.done():  # a cancelled await: the message is durable all the same
            if error is None:
                fut.set_result(result)
            else:
                fut.set_exception(error)


def _deliver(done: Future[Any], on_delivery: Delivery) -> None:
    e = done.exception()
    on_delivery(e, None if e is not None else done.result())


__all__ = ["Acks", "Delivery", "Pending", "fail", "resolve"]
