"""`sej-retention`, for cron: delete the oldest segments every reader has passed, past an age, size or count limit.

    sej-retention PATH [--max-age 7d] [--max-bytes 10G] [--max-messages N]
                       [--require-reader NAME ...] [--dry-run] [--debug]
    python -m sej.apps.retention ...     (the same)

PATH is a journal, a sharded root or a hub root; every journal at PATH is handled
on its own (the limits are per journal). A segment is deleted only when it is one
of the oldest, not the last, every reader in ofs/ and every --require-reader has
committed an offset at or past its end, and it is past at least one limit. See
docs/retention.md.

A run holds `<journal>/retention.lck` of every journal at PATH (exclusive,
non-blocking); when another run holds one of them, this one deletes nothing and
exits 1. --dry-run takes no lock and deletes nothing: it prints what a run would
delete now, and for each journal why it keeps the rest.

Output: one line per deleted (or, with --dry-run, would-be-deleted) segment with
its reasons, a line saying why the rest is kept for each journal nothing was deleted
from (with --dry-run, for every journal), then a summary. Errors end as ONE line on stderr, `sej-retention: error: ...`.
Exit codes: 0 fine (also when nothing was due), 1 problems (a journal failed, e.g.
a malformed offset file; another run holds a lock; I/O errors), 2 usage errors
(no limit, a bad value, a path that is not a journal), 130 interrupted.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from contextlib import ExitStack
from typing import Any

import click

from .. import __version__
from ..errors import LockedError, SejError
from ..layout import SUM_SUFFIX, check_reader_name
from ..lock import unlock_file
from ..retention import Deletion, RetentionResult, apply_retention, lock_retention, plan_retention
from ..timestamps import NS, TimeError, parse_time
from .cli.target import journals_at
from .shell import (
    OK,
    PROBLEMS,
    Failure,
    Program,
    debug_option,
    debugging,
    error_line,
    quiet_library_logs,
    translate,
    usage,
)

PROG = "sej-retention"

# -- values --------------------------------------------------------------------

_DURATION_UNITS = re.compile(r"(?:\d+[wdhms])+")
_SECONDS = re.compile(r"\d+(?:\.\d+)?")
_SIZE = re.compile(r"(\d+(?:\.\d+)?)\s*([kmgtp]?)(i?b)?", re.IGNORECASE)
_SIZE_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40, "p": 1 << 50}


def parse_duration(text: str) -> float:
    """Seconds for `7d`, `12h`, `1h30m`, `1w`, `90s` (sej's relative-time units) or a plain number of seconds."""
    s = text.strip()
    if _SECONDS.fullmatch(s):
        return float(s)
    if _DURATION_UNITS.fullmatch(s):
        try:  # the relative-time parser of `sej scan --since`: "-7d" is 7 days before now_ns=0
            return -parse_time("-" + s, now_ns=0) / NS
        except TimeError:
            raise ValueError(f"{text!r} is too long a duration") from None
    raise ValueError(f"{text!r} is not a duration: expected e.g. 7d, 12h, 1h30m, 1w, 90s or seconds")


def parse_size(text: str) -> int:
    """Bytes for `10G`, `512M`, `1.5T`, `10GiB`, `4096`: K, M, G, T, P are powers of 1024."""
    m = _SIZE.fullmatch(text.strip())
    if not m or (m.group(3) and m.group(3).lower() == "ib" and not m.group(2)):
        raise ValueError(f"{text!r} is not a size: expected bytes, or a number with K, M, G, T or P (powers of 1024)")
    return int(float(m.group(1)) * _SIZE_UNITS[m.group(2).lower()])


class Parsed(click.ParamType[Any]):
    """A click parameter type from a parse function that raises ValueError naming the bad text."""

    def __init__(self, name: str, parse: Callable[[str], float]) -> None:
        self.name = name
        self._parse = parse

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if not isinstance(value, str):
            return value
        try:
            return self._parse(value)
        except ValueError as e:
            self.fail(str(e), param, ctx)


DURATION = Parsed("DURATION", parse_duration)
SIZE = Parsed("SIZE", parse_size)

# -- output --------------------------------------------------------------------


def deletion_line(verb: str, d: Deletion) -> str:
    last = d.end_offset - 1
    span = f"offsets {d.segment.first_offset}-{last}" if d.messages else f"no messages (offset {d.end_offset})"
    return f"{verb} {d.segment.path}: {span}, {d.messages} messages, {d.size} bytes: {'; '.join(d.reasons)}"


def _n(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


# -- the command ---------------------------------------------------------------


@click.command(cls=Program, name=PROG, context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("path", type=click.Path(path_type=str))
@click.option("--max-age", type=DURATION, default=None, help="Delete segments whose newest message is older (7d, 12h).")
@click.option("--max-bytes", type=SIZE, default=None, help="Keep each journal's segments under this size (10G).")
@click.option("--max-messages", type=click.IntRange(min=0), default=None, metavar="N",
              help="Keep each journal under N messages.")  # fmt: skip
@click.option("--require-reader", "required", multiple=True, metavar="NAME",
              help="A reader that must have passed a segment even before it first commits (repeatable).")  # fmt: skip
@click.option("--dry-run", is_flag=True, help="Delete nothing; print what would be deleted and why the rest is kept.")
@debug_option()
@click.version_option(__version__, prog_name=PROG)
def retention(
    path: str,
    max_age: float | None,
    max_bytes: int | None,
    max_messages: int | None,
    required: tuple[str, ...],
    dry_run: bool,
) -> int:
    """Delete the oldest segments of the journals at PATH that every reader has passed and a limit wants gone.

    PATH is a journal, a sharded root or a hub root; limits are per journal. The
    last segment, and any segment a reader in ofs/ or a --require-reader has not
    passed, is never deleted. DURATION: 7d, 12h, 1h30m, 1w, 90s or seconds.
    SIZE: bytes or K, M, G, T, P (powers of 1024). Exit codes: 0 fine,
    1 problems (also: another run holds the lock), 2 usage errors.
    """
    debug = debugging()
    quiet_library_logs(not debug)
    if max_age is None and max_bytes is None and max_messages is None:
        raise usage("no limit given: give at least one of --max-age, --max-bytes, --max-messages")
    for name in required:
        check_reader_name(name)
    journals = journals_at(path)
    now = time.time_ns()
    verb = "would delete" if dry_run else "deleted"
    failed = touched = segments = messages = size = 0
    with ExitStack() as stack:
        if not dry_run:
            for j in journals:
                try:
                    stack.callback(unlock_file, lock_retention(j.path))
                except LockedError as e:
                    raise Failure(f"another retention run holds the lock {e.path}; nothing deleted") from None
        for j in journals:
            try:
                plan = plan_retention(j.path, max_age=max_age, max_bytes=max_bytes, max_messages=max_messages,
                                      required_readers=required, now_ns=now)  # fmt: skip
                result: RetentionResult | None = None if dry_run else apply_retention(plan)
            except (SejError, OSError) as e:
                if debug:
                    raise
                error_line(PROG, f"{j.path}: {translate(e, PROG).format_message()}")
                failed += 1
                continue
            done = plan.deletions if result is None else result.deleted
            for d in done:
                click.echo(deletion_line(verb, d))
            if result is None:
                for p in plan.orphan_indexes:
                    click.echo(f"would remove orphan {_derived(p)} {p}")
                click.echo(f"would keep {j.path} from offset {plan.first_kept}: {plan.kept}")
            else:
                for p in result.orphan_indexes:
                    click.echo(f"removed orphan {_derived(p)} {p}")
                if result.skipped:
                    skipped = _n(len(result.skipped), "planned segment")
                    click.echo(f"kept {skipped} of {j.path}: {result.skipped_because}")
                elif not result.deleted:  # why nothing went (a reader that committed nothing, the limits, ...)
                    click.echo(f"kept {j.path} from offset {plan.first_kept}: {plan.kept}")
            touched += bool(done)
            segments += len(done)
            messages += sum(d.messages for d in done)
            size += sum(d.size for d in done)
    click.echo(
        f"{verb} {_n(segments, 'segment')} ({_n(messages, 'message')}, {size} bytes) "
        f"in {touched} of {_n(len(journals), 'journal')}" + (f"; {failed} failed" if failed else "")
    )
    return PROBLEMS if failed else OK


def _derived(path: str) -> str:
    """What an idx/ file is, in words."""
    return "checksum file" if path.endswith(SUM_SUFFIX) else "index"


def main() -> None:
    """The console script `sej-retention`."""
    retention.main(prog_name=PROG)


if __name__ == "__main__":
    main()
