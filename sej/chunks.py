"""The one chunked frame reader: a byte range of a segment read in chunks, each stepped over by a frame decoder.

`FrameChunks` is the loop every reader of frames shares (the Scanner and the consumer through
segment.read_messages, segment.walk and frame_end, the hub's copy, the columnar reader and so the Spark
source): read a chunk, let the caller's `step` (a pure decoder or checker: decode_batch, walk_frames,
decode_columns) take the whole frames at its start, go on after them, and

- read again from a frame the chunk cut, so each chunk's frames are whole;
- for a frame bigger than a chunk, either grow the read to hold it (`grow`: decoders need its bytes),
  or check it by its header and trailing size field alone and hand it over as a `BigFrame` (walkers
  and the hub's copy, whose memory stays bounded whatever size a frame claims);
- stop, with the reason as a value (`Stop`): the end, a frame cut by the end of the bytes there are
  (a message being written, or a torn tail), or damage. What that means is each caller's own outcome
  (a Walk, a CorruptionError, a CopyError).

A size field is never trusted beyond the range: a frame that claims to end past it is not read, and
every turn of the loop either moves on by a frame, grows the read (up to the range's end) or stops.
Reads go through a `read(pos, n)` callable (os.pread on a descriptor, `preader`, or a hub Source).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from typing import Any, Generic, NamedTuple, TypeVar

from .frames import I32, Problem, frame_total

MAX_READ = 0x7FFFF000
"""The most Linux returns from one read or pread; larger reads come back short."""

T = TypeVar("T")

Read = Callable[[int, int], Any]
"""read(pos, n): up to n bytes of the file at pos (bytes or bytearray; fewer only where the file ends)."""

Step = Callable[[Any, int, int], tuple[T, int, "Problem | None"]]
"""step(data, n, at): a decoder over data[0:n], file bytes at position `at`: (its output, the bytes of whole
frames it took from the start, the Problem that stopped it there or None). Its output is yielded when it
took any; a Problem's position is ignored (the reader's is where the step stopped)."""


def pread_full(fd: int, n: int, pos: int) -> bytes:
    """Up to `n` bytes at `pos`: fewer only at the end of the file (one pread may return less)."""
    if n <= MAX_READ:
        data = os.pread(fd, n, pos)
        if len(data) == n or not data:
            return data
        parts = [data]
        got = len(data)
    else:
        parts, got = [], 0
    while got < n:
        part = os.pread(fd, min(n - got, MAX_READ), pos + got)
        if not part:
            break
        parts.append(part)
        got += len(part)
    return b"".join(parts)


def preader(fd: int) -> Read:
    """The `read` of FrameChunks for a file descriptor (pread_full)."""
    return lambda pos, n: pread_full(fd, n, pos)


class BigFrame(NamedTuple):
    """A whole frame bigger than a chunk, checked by its header and trailing size field only (`grow=False`)."""

    position: int
    total: int  # its size in bytes
    head: Any  # the chunk read at `position`: its first bytes (the header, the key, part of the value)


class Stop(NamedTuple):
    """Where and why a FrameChunks read ended."""

    position: int  # after the last whole frame stepped over
    end: int  # the end of the bytes there were: the range's end, or less where the file ended first
    problem: Problem | None  # what stopped it at `position` (absolute); None: the end, or a step that took no more
    big: bool = False  # the problem is that of a frame bigger than a chunk, judged by its header and trailer


class FrameChunks(Generic[T]):
    """File bytes [pos, end) read in chunks of `chunk` bytes and stepped over by `step` (see the module).

    Iterating yields each step's output (when the step took whole frames) and, with `grow=False`, each
    BigFrame; `stop` is set before the last item is yielded (None while more may follow). The caller
    may stop early by leaving the loop. `pos` is the position after the last frame yielded.
    """

    __slots__ = ("read", "pos", "end", "step", "chunk", "grow", "stop")

    def __init__(self, read: Read, pos: int, end: int, step: Step[T], chunk: int, grow: bool = True) -> None:
        if chunk <= 0:
            raise ValueError(f"a chunk of {chunk} bytes")
        self.read = read
        self.pos = pos
        self.end = end
        self.step = step
        self.chunk = chunk
        self.grow = grow
        self.stop: Stop | None = None

    def __iter__(self) -> Iterator[T | BigFrame]:
        read, step, chunk = self.read, self.step, self.chunk
        pos, end = self.pos, self.end
        want = chunk
        while pos < end:
            ask = min(want, end - pos)
            data = read(pos, ask)
            n = len(data)
            if n < ask:  # the file ends here (it shrank under us, or the range reaches past it)
                end = pos + n
                if n == 0:
                    break
            out, used, problem = step(data, n, pos)
            if not 0 <= used <= n:
                raise AssertionError(f"a step took {used} of {n} bytes")
            at, pos = pos, pos + used
            whole_chunk, want = n == want, chunk
            stop = None
            if problem is None:
                if not used:  # the step wants no more (a limit of 0)
                    stop = Stop(pos, end, None)
            elif not problem.incomplete or (used or not whole_chunk) and at + n >= end:
                stop = Stop(pos, end, problem._replace(position=pos))  # damage, or a frame cut by the end
            elif not used:  # the first frame does not fit a whole chunk
                stop, total = self._bigger(data, n, pos, end, problem._replace(position=pos))
                if stop is None:
                    if total is None:  # a chunk smaller than the frame's header: a bigger one
                        want = 2 * n
                    elif self.grow:
                        want = total
                    else:
                        pos += total
                        self.pos = pos
                        yield BigFrame(at, total, data)
                        continue
            # else: read again from the start of the frame the chunk cut
            self.pos, self.stop = pos, stop
            if used:
                yield out
            if stop is not None:
                return
        self.pos, self.stop = pos, Stop(pos, end, None)

    def _bigger(self, data: Any, n: int, pos: int, end: int, problem: Problem) -> tuple[Stop | None, int | None]:
        """For the frame at `pos` that a whole chunk (`data`, n bytes before `end`) does not hold, with the step's
        `problem`: (None, its size) to read on (a chunk that holds it, or, with grow=False, a BigFrame whose
        trailing size field agrees), (None, None) when the chunk does not hold its header, or why the read
        stops there."""
        total = frame_total(data, 0, n)
        if total is None:
            return (None, None) if pos + n < end else (Stop(pos, end, problem), None)
        if total <= n:  # never, for a step that checks as check_frame does: no progress to make
            return Stop(pos, end, problem), total
        if pos + total > end:  # claims more than there is: never read
            return Stop(pos, end, Problem(pos, f"incomplete frame: {end - pos} of {total} bytes", True), True), total
        if self.grow:
            return None, total
        trailer = self.read(pos + total - 4, 4)
        if len(trailer) == 4:
            (size,) = I32.unpack(trailer)
            if size == total:
                return None, total
            reason = f"size field disagrees: says {size}, frame is {total} bytes"
            return Stop(pos, end, Problem(pos, reason, False), True), total
        end = pos + total - 4 + len(trailer)  # the file shrank under us
        return Stop(pos, end, Problem(pos, f"incomplete frame: {end - pos} of {total} bytes", True), True), total


__all__ = ["MAX_READ", "BigFrame", "FrameChunks", "Read", "Step", "Stop", "pread_full", "preader"]
