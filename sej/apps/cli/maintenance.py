"""Commands that look after journals: `sej stat`, `sej verify`, `sej old`."""

from __future__ import annotations

import json
import os
import time
import warnings
from contextlib import ExitStack
from typing import Any

import click

from ...checksum import drop_past
from ...errors import LockedError, SejError
from ...journal import last_messages, next_offset
from ...layout import list_segments, sum_path
from ...lock import lock_journal, unlock_file
from ...recovery import recover_tail
from ...retention import Deletion, RetentionPlan, apply_retention, lock_retention, plan_retention
from ...scanner import Scanner
from ...sealing import Sealed, seal_journal
from ...shard import Journal
from ...timestamps import NS, format_time
from ..shell import Failure, usage
from .check import Problem, Report, total_bytes, verify_journal
from .output import human_bytes, pairs, table
from .progress import progress
from .target import journals_at, readers, writer_running

# -- stat ----------------------------------------------------------------------


def journal_stat(j: Journal) -> dict[str, Any]:
    """Segments, bytes, messages, offsets, first and last timestamp, readers of one journal."""
    segs = list_segments(j.path)
    size = 0
    for seg in segs:
        size += os.path.getsize(seg.path)
    first = segs[0].first_offset if segs else 0
    nxt = next_offset(j.path)
    first_ts = last_ts = None
    if nxt > first:
        with Scanner(j.path, first, timeout=0, batch=1) as s:
            m = next(iter(s), None)
        first_ts = m.timestamp if m else None
        last = last_messages(j.path, 1)
        last_ts = last[0].timestamp if last else None
    rs = readers(j.path)
    return {
        "journal": j.name,
        "path": j.path,
        "segments": len(segs),
        "bytes": size,
        "messages": nxt - first,
        "first_offset": first,
        "next_offset": nxt,
        "first_timestamp": first_ts,
        "first_time": format_time(first_ts),
        "last_timestamp": last_ts,
        "last_time": format_time(last_ts),
        "readers": [
            {"name": r.name, "committed": r.committed, "lag": None if r.committed is None else nxt - r.committed}
            for r in rs
        ],
    }


def _readers_text(doc: dict[str, Any]) -> str:
    parts = []
    for r in doc["readers"]:
        parts.append(f"{r['name']} (lag {r['lag']})" if r["lag"] is not None else f"{r['name']} (none committed)")
    return ", ".join(parts) if parts else "none"


@click.command(short_help="Segments, bytes, messages, offsets, times and readers.")
@click.argument("dir", type=click.Path(path_type=str))
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of text.")
def stat(dir: str, as_json: bool) -> int:
    """Segments, bytes, messages, offsets, time span and readers of DIR.

    For a root of several journals: one row per journal and a TOTAL row.
    """
    journals = journals_at(dir)
    several = len(journals) > 1
    docs = []
    failed = 0
    for j in journals:
        try:
            docs.append(journal_stat(j))
        except SejError as e:
            click.echo(f"sej: error: {e}", err=True)
            failed += 1
    if not several:
        if docs:
            d = docs[0]
            if as_json:
                click.echo(json.dumps(d))
            else:
                click.echo(pairs([
                    ("journal", d["path"]),
                    ("segments", d["segments"]),
                    ("bytes", f"{d['bytes']} ({human_bytes(d['bytes'])})"),
                    ("messages", d["messages"]),
                    ("first offset", d["first_offset"]),
                    ("next offset", d["next_offset"]),
                    ("first time", d["first_time"]),
                    ("last time", d["last_time"]),
                    ("readers", _readers_text(d)),
                ]))  # fmt: skip
        return 1 if failed else 0
    firsts = [d["first_timestamp"] for d in docs if d["first_timestamp"] is not None]
    lasts = [d["last_timestamp"] for d in docs if d["last_timestamp"] is not None]
    total = {
        "journals": len(docs),
        "segments": sum(d["segments"] for d in docs),
        "bytes": sum(d["bytes"] for d in docs),
        "messages": sum(d["messages"] for d in docs),
        "first_timestamp": min(firsts, default=None),
        "first_time": format_time(min(firsts, default=None)),
        "last_timestamp": max(lasts, default=None),
        "last_time": format_time(max(lasts, default=None)),
    }
    if as_json:
        click.echo(json.dumps({"journals": docs, "total": total}))
        return 1 if failed else 0
    rows: list[list[object]] = [
        [d["journal"], d["segments"], d["bytes"], d["messages"], d["first_offset"], d["next_offset"],
         d["first_time"], d["last_time"], _readers_text(d)]
        for d in docs
    ]  # fmt: skip
    rows.append(["TOTAL", total["segments"], total["bytes"], total["messages"], None, None,
                 total["first_time"], total["last_time"], None])  # fmt: skip
    headers = ["JOURNAL", "SEGMENTS", "BYTES", "MESSAGES", "FIRST", "NEXT", "FIRST-TIME", "LAST-TIME", "READERS"]
    click.echo(table(headers, rows))
    return 1 if failed else 0


# -- verify --------------------------------------------------------------------


@click.command(short_help="Check every frame, the offset sequence and every checksum; --repair cuts a bad tail.")
@click.argument("dir", type=click.Path(path_type=str))
@click.option("--repair", is_flag=True,
              help="Take the writer lock and cut a corrupt tail of the last segment, as the writer does.")  # fmt: skip
@click.option(
    "--seal",
    is_flag=True,
    help="Take the writer lock and record checksums for unchecked bytes, from the bytes as they are now.",
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON report instead of text.")
def verify(dir: str, repair: bool, seal: bool, as_json: bool) -> int:
    """Check every segment of DIR: each frame, offsets consecutive within and across segments, and every
    byte against its checksum (idx/*.sum).

    Each problem is printed with its file and byte position (a checksum mismatch with its byte range and
    the offsets of the messages it covers); exit 1 if there is any. Bytes no checksum covers (segments
    written by the Go original or by sej before checksums) are listed as unchecked. --seal records
    checksums for them from the bytes as they are now: that protects them from then on but does not
    vouch for their past. A mismatch is never sealed nor repaired: there is nothing to repair from but
    another copy (the hub's, or the producer's). A torn or corrupt tail is not messages: it is never
    listed as unchecked nor sealed. With --repair, a corrupt or torn tail of a journal's last segment
    is cut exactly as the writer does on startup (the cut bytes are kept in a quarantine file beside
    the segment, and their checksums are dropped), and so are checksums for bytes past its end;
    problems elsewhere are only reported. A running writer makes --repair and --seal fail (exit 1)
    before they change anything.
    """
    if repair and seal:
        raise usage("--repair and --seal go in separate runs")
    journals = journals_at(dir)
    sealed: list[Sealed] = []
    with ExitStack() as stack:
        if repair or seal:  # every journal's writer lock first: with a writer running, nothing is changed
            for j in journals:
                try:
                    stack.callback(lock_journal(j.path).release)
                except LockedError as e:
                    raise Failure(
                        f"cannot {'repair' if repair else 'seal'} {j.path}: a writer holds its lock "
                        f"{e.path}; stop it first"
                    ) from None
        if seal:
            for j in journals:
                done, refused = seal_journal(j.path, locked=True)
                sealed += done
                for why in refused:
                    click.echo(f"not sealed: {why}", err=True)
            if not as_json:
                for x in sealed:
                    click.echo(f"sealed: {x.path}: bytes {x.start}..{x.end}, from the bytes as they are now "
                               "(this does not vouch for their past)")  # fmt: skip
        reports: list[Report] = []
        with progress(total_bytes(journals), "verifying") as tick:
            for j in journals:
                running = False if repair or seal else writer_running(j.path)
                reports.append(verify_journal(j, tick, running))
        unrepaired = 0
        if not as_json:
            for r in reports:
                for p in r.problems:
                    click.echo(str(p))
                for path, start, end in r.unchecked:
                    click.echo(f"unchecked: {path}: bytes {start}..{end} have no checksums")
                for note in r.notes:
                    click.echo(f"note: {note}")
        for r in reports:
            left = _repair(r) if repair and r.problems else r.problems
            unrepaired += len(left)
    segments = sum(r.segments for r in reports)
    messages = sum(r.messages for r in reports)
    size = sum(r.bytes for r in reports)
    found = sum(len(r.problems) for r in reports)
    unchecked = sum(end - start for r in reports for _, start, end in r.unchecked)
    if as_json:
        click.echo(json.dumps(_verify_json(reports, sealed, found, unchecked)))
    else:
        summary = (
            f"verified {_n(len(reports), 'journal')}, {_n(segments, 'segment')}, {_n(messages, 'message')}, "
            f"{size} bytes: {_n(found, 'problem') if found else 'no problems'}"
        )
        if repair and found:
            summary += f", {found - unrepaired} repaired"
        click.echo(summary)
        if unchecked:
            click.echo(f"{unchecked} bytes are unchecked (no checksums). `sej verify --seal {dir}` records checksums "
                       "for them from the bytes as they are now: damage from then on is seen, but sealing does not "
                       "vouch for their past.")  # fmt: skip
        if not repair and any(_repairable(r, p) for r in reports for p in r.problems):
            click.echo(f"`sej verify --repair {dir}` cuts a torn or corrupt tail of a journal's last segment as the "
                       "writer does on startup (keeping the bytes in a quarantine file beside it), and drops "
                       "checksums for bytes past its end.")  # fmt: skip
    if unrepaired:
        click.echo(f"sej: error: {_n(unrepaired, 'problem')} in {dir}" + (" not repaired" if repair else ""), err=True)
        return 1
    return 0


def _verify_json(reports: list[Report], sealed: list[Sealed], found: int, unchecked: int) -> dict[str, Any]:
    return {
        "problems": found,
        "unchecked_bytes": unchecked,
        "sealed": [{"segment": x.path, "start": x.start, "end": x.end} for x in sealed],
        "journals": [
            {
                "journal": r.journal.path,
                "segments": r.segments,
                "messages": r.messages,
                "bytes": r.bytes,
                "checked_bytes": r.checked,
                "problems": [
                    {
                        "segment": p.path,
                        "position": p.position,
                        "reason": p.reason,
                        "checksum": p.end is not None,
                        "end": p.end,
                        "offsets": list(p.offsets) if p.offsets else None,
                    }  # fmt: skip
                    for p in r.problems
                ],
                "unchecked": [{"segment": path, "start": start, "end": end} for path, start, end in r.unchecked],
                "notes": r.notes,
            }
            for r in reports
        ],
    }


def _n(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def _repairable(r: Report, p: Problem) -> bool:
    """Whether --repair may mend `p`: a bad frame of the last segment (recovery cuts its tail), or checksums for
    bytes past the last segment's end (a cut, by recovery or by hand, that left them: the writer drops them)."""
    return (p.last_segment and p.frame) or (p.past_end and p.path == r.last_segment)


def _repair(r: Report) -> list[Problem]:
    """Cut the last segment's bad tail as the writer does, and drop checksums past its end; the problems left."""
    tail_problems = [p for p in r.problems if p.last_segment and p.frame]
    past = [p for p in r.problems if p.past_end and p.path == r.last_segment]
    if not tail_problems and not past:
        return r.problems
    seg = list_segments(r.journal.path)[-1]
    left = r.problems
    if past:  # first: a tail cut below drops these records too, and they would then be left as "not repaired"
        dropped = drop_past(sum_path(r.journal.path, seg.first_offset), seg.first_offset, os.path.getsize(seg.path))
        if dropped is not None:
            click.echo(f"repaired: {seg.path}: dropped the checksums of bytes {dropped[0]}..{dropped[1]}, past the "
                       "segment's end")  # fmt: skip
            left = [p for p in left if p not in past]
    if tail_problems:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            tail = recover_tail(r.journal.path, seg)  # drops the cut bytes' checksums too
        cut = tail.cut
        if cut is None:
            click.echo(
                f"not repaired: {seg.path}: the writer's recovery checks from the segment's last index entry "
                "and finds nothing to cut there; the problem lies before it"
            )
        else:
            click.echo(
                f"repaired: {seg.path}: cut {cut.length} bytes from byte {cut.position}, kept in {cut.quarantine}"
            )
            left = [p for p in left if p not in tail_problems or p.position < cut.position]
    return left


# -- old -----------------------------------------------------------------------


@click.command(short_help="List (--delete: delete) segments every reader has passed.")
@click.argument("dir", type=click.Path(path_type=str))
@click.option("--days", type=click.FloatRange(min=0), required=True, metavar="N",
              help="Only segments last modified more than N days ago.")  # fmt: skip
@click.option("--delete", is_flag=True, help="Delete them (each segment and its idx/ file).")
def old(dir: str, days: float, delete: bool) -> int:
    """List segments of DIR that every reader has passed and that are older than N days.

    A segment counts as passed when its last offset is below the smallest
    committed offset of all the journal's readers (a reader with nothing
    committed starts at the first offset, so it has passed nothing). Without
    readers, nothing counts as passed. The last segment of a journal is never
    listed, and segments are taken oldest first up to the first one that does
    not qualify, so deleting them never leaves a gap in the journal. --delete
    holds each journal's retention lock (as sej-retention does) and
    fsyncs jnl/ after each segment, so even a power loss leaves no gap.
    """
    journals = journals_at(dir)
    several = len(journals) > 1
    now_ns = time.time_ns()
    plans: list[tuple[Journal, RetentionPlan]] = []
    failed = 0
    for j in journals:
        rs = readers(j.path)
        where = f"{j.name}: " if several else ""
        if not rs:
            click.echo(f"{where}no readers, so no segment counts as passed")
            continue
        broken = [r for r in rs if r.error is not None]
        if broken:
            for r in broken:
                click.echo(f"sej: error: reader {r.name}: {r.error}", err=True)
            failed += 1
            continue
        plan = plan_retention(j.path, max_age=days * 86400, now_ns=now_ns, age_of="mtime")
        if plan.deletions:
            plans.append((j, plan))
    found = [(j, d) for j, plan in plans for d in plan.deletions]
    if found:
        rows = [[*([j.name] if several else []), os.path.basename(d.segment.path), d.segment.first_offset,
                 d.end_offset - 1, f"{(now_ns - (d.newest_ns or 0)) / NS / 86400:.1f}d", d.size]
                for j, d in found]  # fmt: skip
        headers = ["SEGMENT", "FIRST", "LAST", "AGE", "BYTES"]
        click.echo(table(["JOURNAL", *headers] if several else headers, rows))
    size = sum(d.size for _, d in found)
    if not found:
        click.echo(f"no segment is both passed by every reader and older than {days:g} days")
    elif not delete:
        click.echo(f"{_n(len(found), 'segment')}, {size} bytes; add --delete to delete them")
    else:
        deleted: list[Deletion] = []
        with ExitStack() as locks:
            for j, _plan in plans:  # never at the same time as a retention run (sej-retention)
                locks.callback(unlock_file, lock_retention(j.path))
            with progress(len(found), "deleting") as tick:
                for _j, plan in plans:
                    deleted += apply_retention(plan, on_delete=lambda _d: tick(1)).deleted
        click.echo(f"deleted {_n(len(deleted), 'segment')}, {sum(d.size for d in deleted)} bytes")
    return 1 if failed else 0
