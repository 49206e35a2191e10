"""Durable acknowledgements: futures that resolve once appended messages are fsynced.

`Writer.submit` appends a message (buffered, at append speed) and registers a
Future here. One committer thread per writer takes every future registered so
far, hands their bytes to the OS and waits for the writer's group commit
(sej.commit) to fsync them; then it resolves them all. While it waits, new
submissions collect for its next round, so one fsync covers every message
appended before it started, however many producers wait: the number of
messages per fsync grows with concurrency, not with threads.

Callbacks (`on_delivery`) and a Future's done-callbacks run on the committer
thread.

`Writer.append_async` and `append_many_async` need no thread where Linux native AIO
is available (sej.aio): `LoopAcks` lets the event loop itself hand the bytes to the OS
and start one fdatasync in the kernel, and resolves the futures it covered when the
kernel signals it. Elsewhere they go through the committer thread, which hands the
results to the loop.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import weakref
from collections.abc import Callable
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

from .aio import AioSync
from .errors import SyncError
from .layout import segment_path

if TYPE_CHECKING:
    from .writer import Writer

log = logging.getLogger("sej.acks")

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


class LoopAcks:
    """The asyncio acknowledgements of one writer on one event loop, made durable by the loop.

    `pending` ((future, result) pairs) is appended to under the writer's lock, the
    message's bytes already in the writer's buffer. `busy` is set, also under that lock,
    while a `kick` is scheduled or an fsync is in flight: one fsync at a time, each
    covering every message appended before it started (more in flight measured slower:
    concurrent fsyncs of one file mostly queue behind each other). An fsync in flight
    leads the writer's group commit, so no thread fsyncs the file meanwhile. When it
    finishes, the next one starts before the finished one's futures are resolved, so
    the woken producers run while the disk works. The AIO context is the writer's.
    """

    __slots__ = (
        "loop", "pending", "busy", "fsyncs", "closed", "_aio", "_ref", "_commit", "_dir", "_inflight", "_token",
        "__weakref__",
    )  # fmt: skip

    def __init__(self, writer: Writer, loop: asyncio.AbstractEventLoop, aio: AioSync) -> None:
        self.loop = loop
        self.pending: list[tuple[asyncio.Future[Any], Any]] = []
        self.busy = False
        self.fsyncs = 0  # fsyncs that resolved futures (for benchmarks: messages per fsync)
        self.closed = False
        self._aio = aio
        self._ref = weakref.ref(writer)  # the loop must not keep an unclosed writer alive
        # Held directly: a lead of the group commit is ended also once the writer is collected (its __del__
        # closes it with its weak reference already dead). The commit refers to the writer weakly.
        self._commit = writer._commit
        self._dir = writer.dir
        # token -> (bytes written when it started, the segment's first offset, its futures)
        self._inflight: dict[int, tuple[int, int, list[tuple[asyncio.Future[Any], Any]]]] = {}
        self._token = 0
        loop.add_reader(aio.fileno(), self._finished)

    @property
    def idle(self) -> bool:
        """Nothing pending or in flight (holds the writer's lock)."""
        return not self.pending and not self._inflight

    def kick(self) -> None:
        """On the loop: hand the pending messages to the OS and start their fsync."""
        w = self._ref()
        if w is None:
            return
        fallback: list[tuple[asyncio.Future[Any], Any]] = []
        ready: list[tuple[asyncio.Future[Any], Any]] = []
        error: BaseException | None = None
        with w._lock:
            batch, self.pending = self.pending, []
            if not batch or w._buf is None or self.closed:  # nothing, or closed: close() resolved them
                self.busy = False
                return
            try:
                w._spill()
                ticket = w._written
                commit = w._commit
                if commit.failed is not None:
                    raise commit.failed
                if commit.durable >= ticket:  # another thread's fsync covered them already
                    ready = batch
                    self.busy = bool(self._inflight)
                elif not commit.try_lead(self._complete):  # a thread is fsyncing: these join its group commit
                    fallback = batch
                    self.busy = bool(self._inflight)
                else:
                    self._token += 1
                    try:
                        self._aio.submit(w._fd, self._token)
                    except OSError:  # refused (EINVAL, EAGAIN...): this writer fsyncs in its thread from now on
                        commit.end_lead(0, None)
                        w._no_aio = True
                        w._drop_loop_acks(self)
                        fallback = batch
                    else:
                        self._inflight[self._token] = (ticket, w._seg.first, batch)
            except BaseException as e:  # lock lost, disk full, an earlier fsync failed
                error = e
                self.busy = False
            if fallback:
                try:
                    acks = w._acks or w._start_acks()
                    for fut, result in fallback:
                        acks.add_async(result, self.loop, fut)
                except BaseException as e:  # the thread could not start
                    error, batch = e, fallback
        if error is not None:
            _settle(batch, error)
        elif ready:
            _settle_here(ready)

    def _finished(self) -> None:
        """On the loop, when the eventfd fires: record what the finished fsyncs made durable, start the
        next, then resolve their futures."""
        self._aio.drain()
        w = self._ref()
        if w is None or self.closed:  # collected, or closed: nothing more to watch
            self._close_now()
            return
        with w._lock:  # fsyncs in flight are reaped under it only (see _complete, take)
            settled, start = self._reaped(self._aio.reap())
        if start:
            self.kick()
        _settle_all(settled)

    def _complete(self) -> None:
        """For a thread that needs an fsync while this loop's is in flight: wait for it to end and end it
        (the loop may be that very thread, blocked in the call), then hand its futures to the loop."""
        w = self._ref()
        if w is None:  # collected: no lock to take, and nothing appends any more
            self.complete_locked()
            return
        with w._lock:
            self.complete_locked()

    def complete_locked(self) -> None:
        """_complete, the writer's lock held (also by a rollover, before its own fsync)."""
        if not self._inflight:
            return  # the loop reaped it meanwhile
        settled, start = self._reaped(self._aio.wait(len(self._inflight)))
        try:
            if settled:
                self.loop.call_soon_threadsafe(_settle_all, settled)
            if start:
                self.loop.call_soon_threadsafe(self.kick)
        except RuntimeError:  # the loop is closed: nobody awaits these
            pass

    def _reaped(self, done: list[tuple[int, int]]) -> tuple[list[Settled], bool]:
        """End the fsyncs `done` reports; their batches and errors, and whether to start the next. Holds w._lock."""
        settled: list[Settled] = []
        if not done:  # a wake-up for an fsync another thread ended already (see _complete)
            return settled, False
        for token, err in done:
            item = self._inflight.pop(token, None)
            if item is None:
                continue
            self.fsyncs += 1
            self._end(item, err)
            settled.append((item[2], self._commit.failed))  # also an error a rollover's fsync got meanwhile
        start = bool(settled) and bool(self.pending) and not self._inflight and not self.closed
        self.busy = bool(self._inflight) or start
        return settled, start

    def _end(self, item: tuple[int, int, Any], err: int) -> None:
        """An fsync in flight ended with `err` (0: done): end its lead of the group commit. Holds w._lock."""
        ticket, first, _ = item
        failure: SyncError | None = None
        if err:
            cause = OSError(err, os.strerror(err))
            failure = SyncError(f"fsync of {segment_path(self._dir, first)} failed: {cause}")
            failure.__cause__ = cause
        self._commit.end_lead(ticket, failure)

    def take(self) -> list[Pending]:
        """For close(): wait for the fsync in flight to end, stop, and return every future pending or in
        flight, as resolve() takes them; the caller's own fsync covers them. Holds the writer's lock."""
        self.closed = True
        if self._inflight:
            done = dict(self._aio.wait(len(self._inflight)))
            for token, item in self._inflight.items():
                self._end(item, done.get(token, 0))
        loop = self.loop
        out: list[Pending] = [(result, (loop, fut)) for fut, result in self.pending]
        for _, _, batch in self._inflight.values():
            out.extend((result, (loop, fut)) for fut, result in batch)
        self.pending = []
        self._inflight.clear()
        self.busy = True  # a scheduled kick finds nothing; nothing is started any more
        return out

    def close(self, aio_too: bool) -> None:
        """Stop watching the eventfd (on the loop's thread, or at once when the loop is not running), and
        close the writer's AIO context too if `aio_too`."""
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is self.loop or not self.loop.is_running():
            self._close_now(aio_too)
        else:
            try:
                self.loop.call_soon_threadsafe(self._close_now, aio_too)
            except RuntimeError:  # closed meanwhile
                self._close_now(aio_too)

    def _close_now(self, aio_too: bool = False) -> None:
        fd = self._aio.fileno()
        if fd >= 0 and not self.loop.is_closed():
            self.loop.remove_reader(fd)
        if aio_too:
            self._aio.close()


Settled = tuple[list[tuple[asyncio.Future[Any], Any]], BaseException | None]
"""A batch of (asyncio future, result) whose fsync ended, and its error (None: durable)."""


def _settle_all(settled: list[Settled]) -> None:
    for batch, error in settled:
        if error is None:
            _settle_here(batch)
        else:
            _settle(batch, error)


def resolve(batch: list[Pending]) -> None:
    """Resolve each future with its result; asyncio futures in one hand-off per event loop."""
    loops: dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Future[Any], Any]]] = {}
    for result, target in batch:
        if isinstance(target, Future):
            _set(target, result, None)
        else:
            loops.setdefault(target[0], []).append((target[1], result))
    _hand_over(loops, None)


def fail(batch: list[Pending], error: BaseException) -> None:
    loops: dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Future[Any], Any]]] = {}
    for _, target in batch:
        if isinstance(target, Future):
            _set(target, None, error)
        else:
            loops.setdefault(target[0], []).append((target[1], None))
    _hand_over(loops, error)


def _set(f: Future[Any], result: Any, error: BaseException | None) -> None:
    """Resolve `f`. Its done-callbacks run here: one that raises what concurrent.futures lets through
    (SystemExit, KeyboardInterrupt) is logged, so the rest of the batch is resolved and the thread lives on."""
    try:
        if error is None:
            f.set_result(result)
        else:
            f.set_exception(error)
    except BaseException:
        log.exception("a done-callback of an acknowledgement future raised")


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


def _settle_here(items: list[tuple[asyncio.Future[Any], Any]]) -> None:
    """_settle without an error, on the loop itself (the hot path of append_async)."""
    for fut, result in items:
        try:
            fut.set_result(result)
        except asyncio.InvalidStateError:  # a cancelled await: the message is durable all the same
            pass


def _deliver(done: Future[Any], on_delivery: Delivery) -> None:
    e = done.exception()
    try:
        on_delivery(e, None if e is not None else done.result())
    except BaseException:  # concurrent.futures would skip the future's later callbacks for a SystemExit
        log.exception("on_delivery callback %r raised", on_delivery)


__all__ = ["Acks", "Delivery", "LoopAcks", "Pending", "fail", "resolve"]
