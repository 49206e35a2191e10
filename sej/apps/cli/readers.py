"""Commands on readers' committed offsets: `sej offset` and `sej reset`."""

from __future__ import annotations

import json
from contextlib import ExitStack
from typing import Any

import click

from ...errors import InvalidArgumentError, LockedError, SejError
from ...journal import bytes_from, first_offset, next_offset, offset_at_time
from ...layout import check_reader_name, reader_offset_path
from ...offset import Offset, read_offset_file
from ...timestamps import format_time
from ..shell import Failure, usage
from .output import table
from .target import journals_at, label, readers
from .timeparse import TIME


@click.command("offset", short_help="First and next offset, readers' committed offsets and lag.")
@click.argument("dir", type=click.Path(path_type=str))
@click.option("--reader", "only", metavar="NAME", help="Only this reader, with its lag summed up over the journals.")
@click.option("--json", "as_json", is_flag=True,
              help="Print a JSON list of journal rows instead of a table (one row for a journal).")  # fmt: skip
def offset_cmd(dir: str, only: str | None, as_json: bool) -> int:
    """First and next offset of DIR, and each reader's committed offset and lag.

    The lag is next - committed: how many messages the reader has still to
    read; LAG BYTES is how many bytes of segments they take. A reader without
    a committed value shows none. With --reader on a root of several
    journals, a last line gives the reader's lag over them: min, average and
    max, in messages and in bytes (what a Spark query's progress would show as
    offsets behind latest; its reader is spark-<queryName>).

    --json prints the same for a journal and for a root: a list of journal
    rows (journal, path, first_offset, next_offset, readers: name, committed,
    lag, lag_bytes), one row for a journal (its journal name is ""). The
    summary line is the table's only: the rows hold what it sums up.
    """
    if only is not None:
        try:
            check_reader_name(only)
        except InvalidArgumentError as e:
            raise usage(f"--reader: {e}") from None
    journals = journals_at(dir)
    several = len(journals) > 1
    docs: list[dict[str, Any]] = []
    rows: list[list[object]] = []
    lags: list[tuple[int, int]] = []  # --reader: (messages, bytes) of each journal where it committed
    failed = 0
    for j in journals:
        try:
            first, nxt = first_offset(j.path), next_offset(j.path)
        except SejError as e:
            click.echo(f"sej: error: {e}", err=True)
            failed += 1
            continue
        doc: dict[str, Any] = {"journal": j.name, "path": j.path, "first_offset": first, "next_offset": nxt}
        doc["readers"] = []
        lead = [j.name] if several else []
        found = [r for r in readers(j.path) if only is None or r.name == only]
        for r in found:
            error: SejError | None = r.error
            lag = lag_bytes = None
            if r.committed is not None:
                lag = nxt - r.committed
                try:
                    lag_bytes = bytes_from(j.path, r.committed)
                except SejError as e:  # e.g. committed before the first retained offset
                    error = e
            if error is not None:
                click.echo(f"sej: error: {j.path}: reader {r.name}: {error}", err=True)
                failed += 1
            if lag is not None and lag_bytes is not None:
                lags.append((lag, lag_bytes))
            doc["readers"].append({"name": r.name, "committed": r.committed, "lag": lag, "lag_bytes": lag_bytes,
                                   **({"error": str(error)} if error else {})})  # fmt: skip
            committed: object = r.committed if r.committed is not None else ("corrupt" if r.error else "none")
            rows.append([*lead, first, nxt, r.name, committed, lag, lag_bytes])
        if not found:
            rows.append([*lead, first, nxt, only, "none" if only else None, None, None])
        docs.append(doc)
    summary = _lag_summary(only, len(journals), lags) if only is not None and several else None
    if as_json:
        click.echo(json.dumps(docs))
    else:
        headers = ["FIRST", "NEXT", "READER", "COMMITTED", "LAG", "LAG BYTES"]
        click.echo(table(["JOURNAL", *headers] if several else headers, rows))
        if summary is not None:
            m, b = summary["lag"], summary["lag_bytes"]
            click.echo(
                f"reader {only}: committed in {summary['committed_journals']} of {summary['journals']} journals; "
                + (
                    f"lag min/avg/max {m['min']}/{m['avg']:.1f}/{m['max']} messages, "
                    f"{b['min']}/{b['avg']:.0f}/{b['max']} bytes"
                    if m
                    else "no lag to sum up"
                )  # fmt: skip
            )
    return 1 if failed else 0


def _lag_summary(reader: str, journals: int, lags: list[tuple[int, int]]) -> dict[str, Any]:
    """A reader's lag over the journals where it committed: min, avg and max, in messages and bytes."""

    def stats(values: list[int]) -> dict[str, float] | None:
        return {"min": min(values), "avg": sum(values) / len(values), "max": max(values)} if values else None

    return {
        "reader": reader,
        "journals": journals,
        "committed_journals": len(lags),
        "lag": stats([m for m, _ in lags]),
        "lag_bytes": stats([b for _, b in lags]),
    }


@click.command(short_help="Set a reader's committed offset (with --yes).")
@click.argument("dir", type=click.Path(path_type=str))
@click.option("--reader", required=True, metavar="NAME", help="The reader whose offset to set.")
@click.option("--offset", "to_offset", type=click.IntRange(min=0), help="The new offset (the next one to read).")
@click.option("--time", "to_time", type=TIME, help="The offset of the first message at or after this time.")
@click.option("--to-earliest", is_flag=True, help="Each journal's first offset: read everything again.")
@click.option("--to-latest", is_flag=True, help="Each journal's next offset: skip everything there now.")
@click.option("--shift-by", type=int, metavar="N",
              help="Move the committed offset by N (negative: back), within each journal's offsets.")  # fmt: skip
@click.option("--yes", is_flag=True, help="Commit it (without --yes nothing changes).")
def reset(dir: str, reader: str, to_offset: int | None, to_time: int | None, to_earliest: bool, to_latest: bool,
          shift_by: int | None, yes: bool) -> None:  # fmt: skip
    """Show, and with --yes commit, a new committed offset for a reader of DIR.

    Give exactly one of --offset, --time, --to-earliest, --to-latest and
    --shift-by. On a root of several journals, each journal's reader gets its
    own offset (--offset needs one journal). --shift-by moves from the
    committed offset (the first one if none), and a result outside the
    journal's offsets is clamped to them (and shown so). The commit goes through
    the reader's lock: a reader in use by a running process is an error
    (exit 1).
    """
    ways = {"--offset": to_offset, "--time": to_time, "--to-earliest": to_earliest or None,
            "--to-latest": to_latest or None, "--shift-by": shift_by}  # fmt: skip
    chosen = [name for name, value in ways.items() if value is not None]
    if len(chosen) != 1:
        given = f" (got {' and '.join(chosen)})" if chosen else ""
        raise usage(f"give exactly one of --offset, --time, --to-earliest, --to-latest and --shift-by{given}")
    try:
        check_reader_name(reader)
    except InvalidArgumentError as e:
        raise usage(f"--reader: {e}") from None
    journals = journals_at(dir)
    several = len(journals) > 1
    if several and to_offset is not None:
        raise usage(f"--offset needs one journal, and {dir} holds {len(journals)}: use --time, or give one journal")
    with ExitStack() as stack:
        offsets: dict[str, Offset] = {}
        if yes:  # take every lock before changing anything
            for j in journals:
                try:
                    offsets[j.path] = stack.enter_context(Offset(j.path, reader))
                except LockedError as e:
                    raise Failure(f"reader {reader} is in use by another process ({e}); nothing changed") from None
        plans = []
        for j in journals:
            first, nxt = first_offset(j.path), next_offset(j.path)
            current = read_offset_file(reader_offset_path(j.path, reader))
            note = None
            if to_offset is not None:
                if not first <= to_offset <= nxt:
                    raise usage(
                        f"--offset {to_offset} is outside {j.path}, which holds offsets {first} to {nxt} (next)"
                    )
                new = to_offset
            elif to_time is not None:
                new = offset_at_time(j.path, to_time)
            elif to_earliest:
                new = first
            elif to_latest:
                new = nxt
            else:
                assert shift_by is not None
                wanted = (first if current is None else current) + shift_by
                new = min(max(wanted, first), nxt)
                if new != wanted:
                    note = f"clamped from {wanted} to the {'first' if new == first else 'next'} offset"
            plans.append((j, current, new, nxt, note))
        lead_headers = ["JOURNAL"] if several else []
        notes = any(note for *_, note in plans)
        rows = [[*([label(j, several)] if several else []), reader, "none" if cur is None else cur, new, nxt - new,
                 *([note] if notes else [])]
                for j, cur, new, nxt, note in plans]  # fmt: skip
        click.echo(table([*lead_headers, "READER", "CURRENT", "NEW", "LAG", *(["NOTE"] if notes else [])], rows))
        if to_time is not None:
            click.echo(f"(--time {format_time(to_time)})")
        if not yes:
            click.echo("dry run: nothing changed; add --yes to commit")
            return
        for j, _cur, new, _nxt, _note in plans:
            offsets[j.path].commit(new)
        click.echo(f"committed {len(plans)} offset{'s' if len(plans) != 1 else ''}")
