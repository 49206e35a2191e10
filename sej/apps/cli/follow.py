"""`sej scan -f` and `sej scan --reader`: messages read through a sej.Consumer.

The consumer reads every journal under DIR, also journals created while it follows, in the
order the messages are read (each journal in offset order, the journals in turns; not merged
by timestamp). With a reader, it starts at the reader's committed offsets and commits what has
been printed: every COMMIT_EVERY messages or COMMIT_INTERVAL seconds, and on exit, also on
Ctrl-C (exit 130) and SIGTERM (exit 143). A message counts as consumed once its line is written
out (flushed) or a filter left it out, so a crash replays at most what was printed since the last
commit, Ctrl-C and SIGTERM replay nothing, and nothing is ever skipped.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from types import FrameType
from typing import Literal

from ...errors import LockedError
from ...frames import Message, ShardMessage
from ...shard import Consumer
from ..shell import Failure
from .output import MessageWriter

COMMIT_EVERY = 1000
COMMIT_INTERVAL = 5.0
TERMINATED = 143  # 128 + SIGTERM, as a shell reports a process that SIGTERM ended


def consume(
    dir: str,
    reader: str | None,
    start: Mapping[str, int] | Literal["committed"],
    keeps: Callable[[Message | ShardMessage], bool],
    out: MessageWriter,
    *,
    follow: bool,
    max_messages: int | None,
) -> int:
    """Print the messages of DIR that `keeps` keeps, from `start`, until the end (or Ctrl-C with `follow`)."""
    try:
        consumer = Consumer(dir, reader, start=start, follow=follow, timeout=None, commit_every=COMMIT_EVERY,
                            commit_interval=COMMIT_INTERVAL)  # fmt: skip
    except LockedError as e:
        raise Failure(f"reader {reader} is in use by another process ({e})") from None
    done: dict[str, int] = {}  # per journal: one past the last message printed or left out
    signals = _Signals()
    with signals.handled():
        try:
            if max_messages != 0:
                for m in consumer:
                    signals.held = True
                    journal = m.journal
                    if keeps(m):
                        out.write(m, journal or None)  # a lone journal's name is "" (m has a Message's fields)
                    done[journal] = m.offset + 1
                    signals.release()
                    if max_messages is not None and out.written >= max_messages:
                        break
        finally:
            with _signals_ignored():  # a second Ctrl-C must not cut the last commit short
                if reader is not None:
                    _rewind(consumer, done)
                consumer.close()
    return 1 if out.failed else 0


def _rewind(consumer: Consumer, done: dict[str, int]) -> None:
    """Take back what the consumer yielded but the loop did not print (the one in hand when Ctrl-C came)."""
    committed = consumer.committed()
    for journal, position in consumer.positions().items():
        upto = done.get(journal, committed[journal])
        if position > upto:
            consumer.seek(journal, upto)


def _in_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()  # signal handlers can only be set there


class _Signals:
    """SIGINT (KeyboardInterrupt) and SIGTERM (exit 143) end the loop, but not while `held`: between
    writing a message out and counting it as done, where the loop could not tell whether it was
    printed. A second signal ends it there too: a stuck stdout must not make Ctrl-C useless."""

    def __init__(self) -> None:
        self.held = False
        self.pending: BaseException | None = None

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        stop = KeyboardInterrupt() if signum == signal.SIGINT else SystemExit(TERMINATED)
        if self.held and self.pending is None:
            self.pending = stop
            return
        raise stop

    def release(self) -> None:
        self.held = False
        if self.pending is not None:
            raise self.pending

    @contextmanager
    def handled(self) -> Iterator[None]:
        if not _in_main_thread():
            yield
            return
        # A signal ignored (SIGINT under nohup or `&`) stays so.
        mine = [s for s in (signal.SIGINT, signal.SIGTERM) if signal.getsignal(s) is not signal.SIG_IGN]
        old = {s: signal.signal(s, self._handle) for s in mine}
        try:
            yield
        finally:
            for s, handler in old.items():
                signal.signal(s, handler)


@contextmanager
def _signals_ignored() -> Iterator[None]:
    if not _in_main_thread():
        yield
        return
    old = {s: signal.signal(s, signal.SIG_IGN) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)


__all__ = ["COMMIT_EVERY", "COMMIT_INTERVAL", "TERMINATED", "consume"]
