"""Journals as Arrow tables: a journal, a sharded root or a hub root, between offsets or times, without Spark.

Every journal is read through the core's columnar reader (sej.columns: the same decoder as the Spark
source, checksums checked the same way) into record batches of the Spark source's Arrow schema: client
(a hub root's client id, else null), shard (the journal's name under a root, "" for a lone journal),
offset, timestamp (microseconds, UTC; null for "no timestamp"), type, key, value. Needs pyarrow (the
`spark` extra): without it, importing this module raises MissingExtraError, which says so.

    import duckdb, sej
    tbl = sej.read_table("/var/lib/app/events")
    duckdb.sql("select shard, count(*) from tbl group by shard")
"""

from __future__ import annotations

import datetime as dt
import os
from collections.abc import Iterator

from ..columns import ARROW_SCHEMA, journal_columns, pa, record_batch  # pyarrow, or MissingExtraError
from ..errors import InvalidArgumentError
from ..journal import offset_at_time
from ..timestamps import to_ns
from .name import split_name
from .root import find_journals

Time = int | dt.datetime
"""A time bound: int nanoseconds since the Unix epoch, or a timezone-aware datetime."""


def read_batches(
    path: str | os.PathLike[str],
    start: int | None = None,
    stop: int | None = None,
    *,
    since: Time | None = None,
    until: Time | None = None,
    verify: bool = True,
) -> Iterator[pa.RecordBatch]:
    """The messages of every journal at `path` as Arrow record batches of `ARROW_SCHEMA`, journal by journal
    (in name order), each in offset order.

    `path` is a journal, a sharded root or a hub root (`<client>.<shard>` journals). `start` and `stop` bound
    each journal's offsets to [start, stop) (None: from the first retained message, to the end). `since` and
    `until` bound them by time as `Scanner.at_time` does: from the first message at or after `since`, up to
    the first at or after `until` (so the timestamps in between may be out of order, as written). With
    `verify` (the default, as the Spark source), every block is checked against its checksums first
    (ChecksumError). A journal's last message still being written is left out.
    """
    if not isinstance(verify, bool):
        raise InvalidArgumentError(f"verify must be a bool, got {verify!r}")
    since_ns = None if since is None else to_ns(since)
    until_ns = None if until is None else to_ns(until)
    for journal in find_journals(path):
        client, shard = split_name(journal.name)
        lo, hi = start, stop
        if since_ns is not None:
            at = offset_at_time(journal.path, since_ns)
            lo = at if lo is None else max(lo, at)
        if until_ns is not None:
            at = offset_at_time(journal.path, until_ns)
            hi = at if hi is None else min(hi, at)
        if lo is not None and hi is not None and hi <= lo:
            continue
        for cols in journal_columns(journal.path, lo, hi, verify):
            yield record_batch(cols, client, shard)


def read_table(
    path: str | os.PathLike[str],
    start: int | None = None,
    stop: int | None = None,
    *,
    since: Time | None = None,
    until: Time | None = None,
    verify: bool = True,
) -> pa.Table:
    """The messages of every journal at `path` as one `pyarrow.Table` (`read_batches`, collected)."""
    batches = read_batches(path, start, stop, since=since, until=until, verify=verify)
    return pa.Table.from_batches(list(batches), schema=ARROW_SCHEMA)


__all__ = ["ARROW_SCHEMA", "Time", "read_batches", "read_table"]
