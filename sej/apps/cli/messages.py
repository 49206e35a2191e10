"""Commands that print messages of journals: `sej scan`, `sej count`, `sej tail`.

Scan semantics: each journal is read from the first message at or after
--start (found through the sparse index, `sej.offset_at_time`) and/or from
--from, up to, not including, the first message at or after --end. Messages in
between whose own timestamp lies outside [start, end) (out-of-order clocks) are
skipped, as are messages without a timestamp when --start is given (they count
as older than any time). Several journals (a sharded or hub root) are merged by
timestamp, and each line names its journal. With -f or --reader, scan reads
through a sej.Consumer instead (sej.apps.cli.follow).
"""

from __future__ import annotations

import heapq
import sys
from collections.abc import Callable, Iterator, Mapping
from contextlib import ExitStack
from dataclasses import dataclass
from typing import Any, Literal

import click

from ...errors import InvalidArgumentError, OffsetOutOfRangeError
from ...frames import NO_TIMESTAMP, Message, ShardMessage
from ...journal import first_offset, last_messages, next_offset, offset_at_time
from ...layout import check_reader_name
from ...scanner import Scanner
from ...shard import Journal
from ..shell import usage
from .follow import COMMIT_EVERY, COMMIT_INTERVAL, consume
from .output import FORMATS, MessageWriter
from .progress import progress
from .target import journals_at, label
from .timeparse import TIME

TICK_EVERY = 4096

Position = int | str
"""Where --from starts each journal: an offset (>= 0), -N (its last N messages), "earliest" or "latest"."""


class PositionType(click.ParamType[Position]):
    """--from: OFFSET, -N, earliest or latest (as kcat's -o N, -N, beginning, end)."""

    name = "POSITION"

    def convert(self, value: object, param: click.Parameter | None, ctx: click.Context | None) -> Position:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        text = str(value).strip()
        if text in ("earliest", "latest"):
            return text
        try:
            return int(text)
        except ValueError:
            self.fail(f"{value!r} is not an offset, -N, earliest or latest", param, ctx)


@dataclass(frozen=True)
class Filters:
    start: int | None = None
    end: int | None = None
    offset: Position | None = None
    types: frozenset[int] = frozenset()

    def keeps(self, m: Message | ShardMessage) -> bool:
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


def start_of(j: Journal, f: Filters, several: bool) -> tuple[int, int]:
    """Where to start reading `j` (from --from and --start), and its next offset.

    With one journal, an --from OFFSET outside [first, next] is a usage error; with
    several, it is clamped to each journal's range.
    """
    first, nxt = first_offset(j.path), next_offset(j.path)
    pos = f.offset
    if pos is None or pos == "earliest":
        start = first
    elif pos == "latest":
        start = nxt
    else:
        assert isinstance(pos, int)
        if pos < 0:
            start = max(first, nxt + pos)
        elif not several and not first <= pos <= nxt:
            raise usage(f"--from {pos}: {OffsetOutOfRangeError(pos, first, nxt)}")
        else:
            start = min(max(first, pos), nxt)
    if f.start is not None and start < nxt:
        start = max(start, offset_at_time(j.path, f.start))
    return start, nxt


def plan(journals: list[Journal], f: Filters) -> list[Plan]:
    """The start offset of each journal (start_of); journals with nothing to read are left out."""
    several = len(journals) > 1
    plans = []
    for j in journals:
        start, nxt = start_of(j, f, several)
        if start < nxt:
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


def count_messages(journals: list[Journal], f: Filters, most: int | None = None) -> int:
    """How many messages scan would print (at most `most`), read as scan reads them.

    Also without filters, where the count is next - start for each journal: a count must fail
    where scan fails (a corrupt frame is a CorruptionError, exit 1), not print a number.
    """
    plans = plan(journals, f)
    total = 0
    with progress(sum(p.stop - p.start for p in plans), "counting") as tick:
        for p in plans:  # a count needs no order: each journal on its own, no merge
            with Scanner(p.journal.path, p.start, timeout=0) as s:
                for _ in journal_messages(s, f, tick):
                    if total == most:
                        return total
                    total += 1
    return total


def filter_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """The options scan and count share."""
    for opt in reversed([
        click.option("--start", type=TIME, help="Only messages at or after this time."),
        click.option("--end", type=TIME, help="Stop at the first message at or after this time."),
        click.option("--from", "from_offset", type=PositionType(), metavar="OFFSET|-N|earliest|latest",
                     help="Where each journal starts: at this offset (its own offsets), at its last N messages, "
                          "at its first message (earliest, the default) or after its last one (latest: only "
                          "messages appended from now on, with -f)."),
        click.option("--type", "types", type=click.IntRange(0, 255), multiple=True, metavar="N",
                     help="Only messages of this type (repeat for several types)."),
    ]):  # fmt: skip
        fn = opt(fn)
    return fn


def _filters(start: int | None, end: int | None, from_offset: Position | None, types: tuple[int, ...]) -> Filters:
    if start is not None and end is not None and end < start:
        raise usage("--end is before --start")
    return Filters(start, end, from_offset, frozenset(types))


@click.command(short_help="Print messages from a time or an offset; -f follows new ones.")
@click.argument("dir", type=click.Path(path_type=str))
@filter_options
@click.option("--format", "fmt", type=click.Choice(FORMATS), default="json", show_default=True,
              help="Output format.")  # fmt: skip
@click.option("--count", "count_only", is_flag=True, help="Print only the number of messages (at most -c).")
@click.option("-c", "--max-messages", type=click.IntRange(min=0), metavar="N", help="Stop after printing N messages.")
@click.option("-f", "--follow", is_flag=True,
              help="Then print new messages, of new journals too, as they come, until Ctrl-C (exit 130).")  # fmt: skip
@click.option("--reader", metavar="NAME",
              help=f"Start at this reader's committed offsets and commit what is printed: every {COMMIT_EVERY} "
                   f"messages or {COMMIT_INTERVAL:g} s, and on exit, Ctrl-C and SIGTERM too (as kcat -G).")  # fmt: skip
def scan(dir: str, start: int | None, end: int | None, from_offset: Position | None, types: tuple[int, ...],
         fmt: str, count_only: bool, max_messages: int | None, follow: bool, reader: str | None) -> int:  # fmt: skip
    """Print the messages of DIR in a time range [--start, --end) and/or from a position.

    DIR is a journal, a sharded root or a hub root; with several journals the
    messages are merged by timestamp and each line names its journal.

    With -f (--follow) or --reader, the messages come in the order they are read
    (each journal in offset order, the journals in turns), not merged by
    timestamp, and each line of a root names its journal. -f follows journals
    created meanwhile too, from their first message. --reader starts each
    journal at the reader's committed offset and commits one past the last
    message printed (or left out by --type): a restart replays at most what was
    printed since the last commit, and skips nothing. A reader in use by another
    process is an error (exit 1). Ctrl-C exits 130, SIGTERM 143.
    """
    if reader is not None:
        try:
            check_reader_name(reader)
        except InvalidArgumentError as e:
            raise usage(f"--reader: {e}") from None
    _check_combinations(follow, reader, count_only, start=start, end=end, from_offset=from_offset)
    journals = journals_at(dir)
    f = _filters(start, end, from_offset, types)
    if follow or reader is not None:
        several = len(journals) > 1
        starts: Mapping[str, int] | Literal["committed"] = "committed"
        if reader is None:
            starts = {j.name: start_of(j, f, several)[0] for j in journals}
        out = MessageWriter(fmt, sys.stdout.buffer, flush_each=True)  # printed = consumed
        return consume(dir, reader, starts, f.keeps, out, follow=follow, max_messages=max_messages)
    if count_only:
        click.echo(count_messages(journals, f, max_messages))
        return 0
    plans = plan(journals, f)
    out = MessageWriter(fmt, sys.stdout.buffer)
    length = sum(p.stop - p.start for p in plans)
    with ExitStack() as stack, progress(length, "scanning", needs_stdout_redirected=True) as tick:
        if max_messages != 0:
            for name, m in scan_messages(plans, f, stack, tick):
                out.write(m, name)
                if out.written == max_messages:
                    break
    return 1 if out.failed else 0


def _check_combinations(follow: bool, reader: str | None, count_only: bool, **given: object) -> None:
    """Usage errors for options that cannot go together in scan."""
    if count_only and (follow or reader is not None):
        with_ = "-f/--follow" if follow else "--reader"
        raise usage(f"--count cannot go with {with_}: it counts what is there and commits nothing")
    if follow and given["end"] is not None:
        raise usage("--end cannot go with -f/--follow: following has no end (-c N stops after N messages)")
    if reader is not None:
        names = [f"--{'from' if k == 'from_offset' else k}" for k, v in given.items() if v is not None]
        if names:
            raise usage(f"--reader cannot go with {' and '.join(names)}: it reads from the reader's committed "
                        "offsets to the end (`sej reset` moves them)")  # fmt: skip


@click.command(short_help="Count the messages scan would print.")
@click.argument("dir", type=click.Path(path_type=str))
@filter_options
def count(dir: str, start: int | None, end: int | None, from_offset: Position | None, types: tuple[int, ...]) -> None:
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
    timestamp; -f follows a single journal only (`sej scan -f --from -N DIR`
    follows them all). Ctrl-C exits 130.
    """
    journals = journals_at(dir)
    several = len(journals) > 1
    if follow and several:
        raise usage(
            f"tail -f follows one journal, and {dir} holds {len(journals)}: give one of them, e.g. {journals[0].path}, "
            f"or follow them all with `sej scan -f --from {f'-{n}' if n else 'latest'} {dir}`"
        )
    out = MessageWriter(fmt, sys.stdout.buffer, flush_each=follow)
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
    """Print new messages until Ctrl-C, which the error shell turns into exit 130 (as every command)."""
    out.stream.flush()
    with Scanner(j.path, offset, timeout=None) as s:
        for m in s:
            out.write(m)
    return 1 if out.failed else 0


__all__ = ["scan", "count", "tail", "Filters", "plan", "count_messages"]
