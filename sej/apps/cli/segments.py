"""Commands on one segment file: `sej dump FILE` and `sej file FILE`.

Both read the file alone, without its journal: the expected first offset comes
from the file name when it is a segment name (`%016x.jnl`), else from the first
frame. A file whose name is not a segment name and whose first frame does not
decode is not a segment file (usage error, exit 2); a segment with bad bytes is
corrupt (exit 1, after printing what decoded).
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from typing import Any

import click

from ...errors import CorruptionError
from ...frames import HEADER, I32, OVERHEAD, Message, decode_batch
from ...segment import pread_full, read_messages
from ...timestamps import format_time
from ..shell import usage
from .output import FORMATS, MessageWriter, human_bytes, pairs
from .target import segment_file


def expected_first(fd: int, path: str, named: int | None) -> int | None:
    """The offset the file's first frame must have: from its name, else read from the frame (None if empty)."""
    if named is not None:
        return named
    head = os.pread(fd, HEADER.size, 0)
    if not head:
        return None
    if len(head) < HEADER.size:
        raise not_a_segment(path, f"it holds only {len(head)} bytes, less than a frame header")
    return int(HEADER.unpack(head)[0])


def not_a_segment(path: str, why: str) -> Exception:
    return usage(f"{path} is not a segment file: its name is not %016x.jnl and {why}")


def frames(fd: int, path: str, named: int | None, size: int) -> Iterator[tuple[int, Message]]:
    """(position, message) of every frame of the file, in order; CorruptionError at the first bad byte."""
    offset = expected_first(fd, path, named)
    pos = 0
    while offset is not None and pos < size:
        msgs, used, problem = read_messages(fd, pos, offset, size, limit=4096)
        if pos == 0 and not msgs and named is None and problem is not None:
            raise not_a_segment(path, f"its first frame does not decode ({problem.reason})")
        p = pos
        for m in msgs:
            yield p, m
            p += OVERHEAD + len(m.key) + len(m.value)
        pos += used
        if msgs:
            offset = msgs[-1].offset + 1
        if problem is not None:
            raise CorruptionError(path, problem.position, problem.reason, size - problem.position)
        if not msgs:
            break


@click.command(short_help="Print every message of one segment file.")
@click.argument("file", type=click.Path(dir_okay=True, path_type=str))
@click.option("--format", "fmt", type=click.Choice(FORMATS), default="json", show_default=True,
              help="Output format (json lines also carry each frame's byte `position`).")  # fmt: skip
def dump(file: str, fmt: str) -> int:
    """Print every message of one segment FILE, then stop.

    On corrupt bytes it prints what decoded, then one error line naming the
    file and byte position, and exits 1.
    """
    path, named = segment_file(file)
    out = MessageWriter(fmt, sys.stdout.buffer, label=path)
    with open(path, "rb") as f:
        fd = f.fileno()
        size = os.fstat(fd).st_size
        for pos, m in frames(fd, path, named, size):
            out.write(m, position=pos if fmt == "json" else None)
    return 1 if out.failed else 0


def first_and_last(fd: int, path: str, named: int | None, size: int) -> tuple[Message | None, Message | None]:
    """The first frame (decoded forward) and the last (read backward through the trailing size field)."""
    if size == 0:
        return None, None
    offset = expected_first(fd, path, named)
    assert offset is not None
    msgs, _used, problem = read_messages(fd, 0, offset, size, limit=1)
    if not msgs:
        assert problem is not None
        if named is None:
            raise not_a_segment(path, f"its first frame does not decode ({problem.reason})")
        raise CorruptionError(path, problem.position, f"first frame: {problem.reason}", size - problem.position)
    first = msgs[0]
    n = I32.unpack(os.pread(fd, 4, size - 4))[0] if size >= 4 else -1
    if n < OVERHEAD or n > size:
        raise CorruptionError(
            path, max(size - 4, 0), f"the trailing size field says {n}, which does not fit a frame "
            "(a torn or corrupt tail: see sej verify)", min(size, 4),
        )  # fmt: skip
    frame = pread_full(fd, n, size - n)
    got, used, _problem = decode_batch(frame, 0, len(frame), None, 1)
    if not got or used != n or got[0].offset < first.offset:
        raise CorruptionError(
            path, size - n, "the last frame, found through the trailing size field, does not decode "
            "(a torn or corrupt tail: see sej verify)", n,
        )  # fmt: skip
    return first, got[0]


@click.command("file", short_help="First and last offset and timestamp of a segment file.")
@click.argument("file", type=click.Path(dir_okay=True, path_type=str))
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def file_cmd(file: str, as_json: bool) -> None:
    """First and last offset and timestamp of one segment FILE.

    The last message is found through the trailing size field, without
    decoding the whole file.
    """
    path, named = segment_file(file)
    with open(path, "rb") as f:
        fd = f.fileno()
        size = os.fstat(fd).st_size
        first, last = first_and_last(fd, path, named, size)
    info: dict[str, Any] = {"file": path, "bytes": size, "named_offset": named}
    if first is None or last is None:
        info.update(messages=0, first_offset=None, first_timestamp=None, last_offset=None, last_timestamp=None)
    else:
        info.update(
            messages=last.offset - first.offset + 1,
            first_offset=first.offset, first_timestamp=first.timestamp, first_time=format_time(first.timestamp),
            last_offset=last.offset, last_timestamp=last.timestamp, last_time=format_time(last.timestamp),
        )  # fmt: skip
    if as_json:
        click.echo(json.dumps(info))
        return
    items: list[tuple[str, object]] = [("file", path), ("bytes", f"{size} ({human_bytes(size)})")]
    if first is None or last is None:
        items.append(("messages", "0 (empty segment)"))
    else:
        items += [
            ("messages", info["messages"]),
            ("first offset", first.offset),
            ("first timestamp", _ts(first.timestamp)),
            ("last offset", last.offset),
            ("last timestamp", _ts(last.timestamp)),
        ]
    click.echo(pairs(items))


def _ts(ns: int | None) -> str:
    return "none" if ns is None else f"{ns} ({format_time(ns)})"
