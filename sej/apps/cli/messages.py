"""Commands that print messages of journals: `sej scan`, `sej count`, `sej tail`.

Scan semantics: each journal is read from the first message at or after
--start (found through the sparse index, `sej.offset_at_time`) and/or from
--from, up to, not including, the first message at or after --end. Messages in
between whose own timestamp lies outside [start, end) (out-of-order clocks) are
skipped, as are messages without a timestamp when --start is given (they count
as older than any time). Several journals (a sharded or hub root) are merged by
timestamp, and each line names its journal.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from typing import Any

import click

from ...errors import OffsetOutOfRangeError
from ...frames import NO_TIMESTAMP, Message
from ...journal import first_offset, last_messages, next_offset, offset_at_time
from ...scanner import Scanner
from ...shard import Journal
from ..shell import usage
from .output import FORMATS, MessageWriter
from .progress import progress
from .target import journals_at, label
from .timeparse import TIME

TICK_EVERY = 4096


@dataclass(frozen=True)
class Filters:
    start: int | None = None
    end: int | None = None
    offset: int | None = None
    types: frozenset[int] = frozenset()

    def keeps(self, m: Message) -> bool:
        ts = m.timestamp
        if self.start is not None and (ts is None or ts < self.start):
            return False
        if self.end is not None and ts is not None and ts >= self.end:
            return False
        return not self.types or m.type in self.types


@dataclass(frozen=True)
class Plan:
    """Where to read one journal: from `start` (an offset) to `stop` (its next offset when planned)."""

    journal: Journal
    start: int
    stop: int


def plan(journals: list[Journal], f: Filters) -> list[Plan]:
    """The start offset of each journal; journals with nothing to read are left out.

    With one journal, an --from outside [first, next] is a usage error; with
    several, it is clamped to each journal's range.
    """
    several = len(journals) > 1
    plans = []
    for j in journals:
        first, nxt = first_offset(j.path), next_offset(j.path)
        start = first
        if f.offset is not None:
            if not several and not first <= f.offset <= nxt:
                raise usage(f"--from {f.offset}: {OffsetOutOfRangeError(f.offset, first, nxt)}")
            start = max(first, f.offset)
        if start >= nxt:
            continue
        if f.start is not None:
            start = max(start, offset_at_time(j.path, f.start))
            if start >= nxt:
                continue
        plans.append(Plan(j, start, nxt))
    return plans


def journal_messages(s: Scanner, f: Filters, tick: Callable[[int], None]) -> Iterator[Message]:
    """The messages of one scanner that pass the filters, stopping at the first one at or after --end."""
    end = f.end
    seen = 0
    for m in s:
        seen += 1
        if seen == TICK_EVERY:
            tick(seen)
            seen = 0
        if end is not None and m.timestamp is not None and m.timestamp >= end:
            break
        if f.keeps(m):
            yield m
    tick(seen)


def scan_messages(
    plans: list[Plan], f: Filters, stack: ExitStack, tick: Callable[[int], None]
) -> Iterator[tuple[str | None, Message]]:
    """(journal label, message) of every planned journal, merged by timestamp when there are several."""
    several = len(plans) > 1
    names = [label(p.journal, several) for p in plans]
    streams = []
    for i, p in enumerate(plans):
        s = stack.enter_context(Scanner(p.journal.path, p.start, timeout=0))
        streams.append(_keyed(i, journal_messages(s, f, tick)))
    for _ts, i, _off, m in heapq.merge(*streams):
        yield names[i], m


def _keyed(i: int, msgs: Iterator[Message]) -> Iterator[tuple[int, int, int, Message]]:
    """Merge keys: timestamp (missing ones first), then the journal's place in name order, then offset."""
    for m in msgs:
        yield (NO_TIMESTAMP if m.timestamp is None else m.timestamp, i, m.offset, m)


def count_messages(journals: list[Journal], f: Filters) -> int:
    """How many messages scan would print, read as scan reads them.

    Also without filters, where the count is next - start for each journal: a count must fail
    where scan fails (a corrupt frame is a CorruptionError, exit 1), not print a number.
    """
    plans = plan(journals, f)
    total = 0
    with progress(sum(p.stop - p.start for p in plans), "counting") as tick:
        for p in plans:  # a count needs no order: each journal on its own, no merge
            with Scanner(p.journal.path, p.start, timeout=0) as s:
                for _ in journal_messages(s, f, tick):
                    total += 1
    return total


def filter_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """The options scan and count share."""
    for opt in reversed([
        click.option("--start", type=TIME, help="Only messages at or after this time."),
        click.option("--end", type=TIME, help="Stop at the first message at or after this time."),
        click.option("--from", "from_offset", type=click.IntRange(min=0), metavar="OFFSET",
                     help="Start at this offset (each journal's own offsets)."),
        click.option("--type", "types", type=click.IntRange(0, 255), multiple=True, metavar="N",
                     help="Only messages of this type (repeat for several types)."),
    ]):  # fmt: skip
        fn = opt(fn)
    return fn


def _filters(start: int | None, end: int | None, from_offset: int | None, types: tuple[int, ...]) -> Filters:
    if start is not None and end is not None and end < start:
        raise usage("--end is before --start")
    return Filters(start, end, from_offset, frozenset(types))


@click.command(short_help="Print messages in a time range and/or from an offset.")
@click.argument("dir", type=click.Path(path_type=str))
@filter_options
@click.option("--format", "fmt", type=click.Choice(FORMATS), default="json", show_default=True,
              help="Output format.")  # fmt: skip
@click.option("--count", "count_only", is_flag=True, help="Print only the number of messages.")
def scan(dir: str, start: int | None, end: int | None, from_offset: int | None, types: tuple[int, ...],
         fmt: str, count_only: bool) -> int:  # fmt: skip
    """Print the messages of DIR in a time range [--start, --end) and/or from an offset.

    DIR is a journal, a sharded root or a hub root; with several journals the
    messages are merged by timestamp and each line names its journal.
    """
    journals = journals_at(dir)
    f = _filters(start, end, from_offset, types)
    if count_only:
        click.echo(count_messages(journals, f))
        return 0
    plans = plan(journals, f)
    out = MessageWriter(fmt, click.get_binary_stream("stdout"))
    length = sum(p.stop - p.start for p in plans)
    with ExitStack() as stack, progress(length, "scanning", needs_stdout_redirected=True) as tick:
        for name, m in scan_messages(plans, f, stack, tick):
            out.write(m, name)
    return 1 if out.failed else 0


@click.command(short_help="Count the messages scan would print.")
@click.argument("dir", type=click.Path(path_type=str))
@filter_options
def count(dir: str, start: int | None, end: int | None, from_offset: int | None, types: tuple[int, ...]) -> None:
    """Print how many messages `sej scan` would print with the same filters."""
    click.echo(count_messages(journals_at(dir), _filters(start, end, from_offset, types)))


@click.command(short_help="Print the last N messages; -f follows new ones.")
@click.argument("dir", type=click.Path(path_type=str))
@click.option("-n", "--lines", "n", type=click.IntRange(min=0), default=10, show_default=True,
              help="How many of the last messages (of each journal).")  # fmt: skip
@click.option("-f", "--follow", is_flag=True, help="Then print new messages as they come, until Ctrl-C.")
@click.option("--format", "fmt", type=click.Choice(FORMATS), default="json", show_default=True,
              help="Output format.")  # fmt: skip
def tail(dir: str, n: int, follow: bool, fmt: str) -> int:
    """Print the last N messages of DIR, read backward; with -f, follow new ones.

    For several journals, each journal's last N messages are merged by
    timestamp; -f follows a single journal only.
    """
    journals = journals_at(dir)
    several = len(journals) > 1
    if follow and several:
        raise usage(
            f"tail -f follows one journal, and {dir} holds {len(journals)}: give one of them, e.g. {journals[0].path}"
        )
    out = MessageWriter(fmt, click.get_binary_stream("stdout"), flush_each=follow)
    if not several:
        j = journals[0]
        resume = next_offset(j.path)
        msgs = last_messages(j.path, n)
        for m in msgs:
            out.write(m)
        if follow:
            return _follow(j, msgs[-1].offset + 1 if msgs else resume, out)
        return 1 if out.failed else 0
    streams = [_keyed(i, iter(last_messages(j.path, n))) for i, j in enumerate(journals)]
    for _ts, i, _off, m in heapq.merge(*streams):
        out.write(m, journals[i].name)
    return 1 if out.failed else 0


def _follow(j: Journal, offset: int, out: MessageWriter) -> int:
    out.stream.flush()
    try:
        with Scanner(j.path, offset, timeout=None) as s:
            for m in s:
                out.write(m)
    except KeyboardInterrupt:
        pass
    return 1 if out.failed else 0


__all__ = ["scan", "count", "tail", "Filters", "plan", "count_messages"]
